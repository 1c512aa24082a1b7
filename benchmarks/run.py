"""Run the sparsefill benchmarks: ``python benchmarks/run.py [--quick] [--filter SUBSTR] [--threads 1,2] [--out DIR]``.

The same as ``python -m sparsefill bench ...`` (and ``python -m benchmarks.run`` from the repository
root).  Every ``benchmarks/cases_*.py`` module is imported (``runner.discover``): a new case file needs
no registration here.  See ``benchmarks/README.md``.
"""

from __future__ import annotations

import os
import sys
import warnings

if __package__ in (None, ""):  # python benchmarks/run.py: make ``benchmarks`` importable as a package
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.runner import main as _main  # noqa: E402


def main(argv=None, prog: str = "python benchmarks/run.py") -> int:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return _main(argv, prog=prog)


if __name__ == "__main__":
    sys.exit(main())
