"""``python -m sparsefill bench ...``: the benchmarks of a source checkout (``benchmarks/`` beside ``src/``).

The cases are not part of the installed package: they live in the repository's ``benchmarks/``
folder, found next to ``src/`` of an editable install (``pip install -e .``) or in the current
directory.  Options: ``python -m sparsefill bench --help`` (``benchmarks/README.md``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["find_benchmarks", "main"]


def find_benchmarks() -> Path:
    """The repository root holding ``benchmarks/runner.py``; ``FileNotFoundError`` saying where it looked."""
    here = Path(__file__).resolve().parent          # .../src/sparsefill
    candidates = [here.parent.parent, Path.cwd()]
    for root in candidates:
        if (root / "benchmarks" / "runner.py").is_file():
            return root
    looked = ", ".join(str(r / "benchmarks") for r in candidates)
    raise FileNotFoundError(
        f"sparsefill bench needs the benchmarks/ folder of a source checkout; none at {looked}. "
        "Clone the repository and install it editable (pip install -e '.[bench]'), or run from its root.")


def main(argv=None) -> int:
    try:
        root = find_benchmarks()
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    import benchmarks
    if Path(benchmarks.__file__).resolve().parent != root / "benchmarks":
        print(f"error: 'benchmarks' imports from {os.path.dirname(benchmarks.__file__)}, not {root / 'benchmarks'} "
              "(another package of that name shadows it)", file=sys.stderr)
        return 2
    from benchmarks.run import main as run_main
    return run_main(list(sys.argv[1:] if argv is None else argv), prog="python -m sparsefill bench")
