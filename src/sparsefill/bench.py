"""``python -m sparsefill bench ...``: the benchmarks against the peers (``sparsefill.benchmarks``).

The cases ship with the package (``sparsefill/benchmarks/cases_*.py``), so the command works from
any install, editable or wheel, in any directory.  ``import sparsefill`` does not import them: this
module imports ``sparsefill.benchmarks`` only when :func:`main` runs.  The optional peers and tools
(pydata ``sparse``, ``tqdm``, ``matplotlib``: ``pip install 'sparsefill[bench]'``) are skipped with
a note when missing.  Options: ``python -m sparsefill bench --help``; the protocol is in
``sparsefill/benchmarks/README.md`` of the repository.
"""

from __future__ import annotations

import sys
import warnings

__all__ = ["main"]


def main(argv=None) -> int:
    """Run the benchmark command line on ``argv`` (default ``sys.argv[1:]``); the exit status."""
    from sparsefill.benchmarks.runner import main as run_main

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return run_main(
            list(sys.argv[1:] if argv is None else argv), prog="python -m sparsefill bench"
        )
