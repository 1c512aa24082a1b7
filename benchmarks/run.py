"""Run the sparsefill benchmarks: ``python benchmarks/run.py [--quick] [--filter SUBSTR] [--threads 1,2] [--out DIR]``.

Also ``python -m benchmarks.run`` from the repository root.  See ``benchmarks/README.md``.
"""

from __future__ import annotations

import os
import sys
import warnings

if __package__ in (None, ""):  # python benchmarks/run.py: make ``benchmarks`` importable as a package
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import cases_convert, cases_elementwise  # noqa: E402,F401  (registers the cases)
from benchmarks.runner import REGISTRY, main  # noqa: E402

if __name__ == "__main__":
    warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
    sys.exit(main(cases=REGISTRY.cases, prog="benchmarks/run.py"))
