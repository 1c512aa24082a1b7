"""sparsefill benchmarks: ``python benchmarks/run.py --help`` (see README.md here)."""
