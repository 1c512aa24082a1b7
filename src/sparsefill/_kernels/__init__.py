"""Kernels on plain tensors: index math, sorted-key merges, grouping, the reducer protocol and its
engines, segment and window kernels, trace predicates.

The lowest layer: nothing here knows a SparseTensor or imports any other part of sparsefill
(``docs/architecture.md``).
"""
