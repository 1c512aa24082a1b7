"""sparsefill's benchmarks against its peers: ``python -m sparsefill bench --help`` (see README.md
here).

Shipped with the package so that the command works from any install; ``import sparsefill``
does not import it.
"""
