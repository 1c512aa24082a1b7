"""The engine boundary: which kernel combines the segments of a plan, chosen in one function.

Every reduction of sparsefill (sparse, masked, segment) is the reducer protocol of
:mod:`sparsefill._reduce` over one segment plan; its ``combine`` step::

    out[s] = combine(identity, x_i for every element i of segment s)

runs on one of these engines, all computing the same values (they differ in speed and in what
they need of the plan, the dtype and the device):

==================  ==============================================================================
``"csr_mv"``        row sums of a 2-D CSR matrix: ``torch.mv`` with ones (the sparse BLAS kernel)
``"numba_scatter"`` the compiled scatter kernels of ``segment/_numba_kernels`` over unsorted ids, in place
``"numba_sorted"``  the compiled kernels over sorted segments (CPU float32/float64, numba loaded)
``"embedding_bag"`` ``embedding_bag`` with offsets: sorted floating sums, a gather and weights fused
``"segment_reduce"`` ``torch.segment_reduce`` over sorted contiguous runs (float32/float64)
``"scatter_add"``   ``scatter_add_`` (sums of 1-D values: 1.7x ``index_add_`` and ``segment_reduce`` on CPU,
                    200k values in 20k segments)
``"index_add"``     ``index_add_`` (sums of any dtype, any device, traced)
``"scatter_reduce"`` ``scatter_reduce_`` (prod, amax, amin of any dtype, any device, traced)
==================  ==============================================================================

The engines know tensors only (no SparseTensor): this is where the compile issue's custom ops go.

>>> choose("sum", torch.float32, runs=True)
'segment_reduce'
>>> choose("amax", torch.int64, runs=True)
'scatter_reduce'
"""

from __future__ import annotations

import torch

__all__ = ["choose", "ENGINES"]

ENGINES = ("csr_mv", "numba_scatter", "numba_sorted", "embedding_bag", "segment_reduce", "scatter_add",
           "index_add", "scatter_reduce")
_FLOATS = (torch.float32, torch.float64)


def choose(mode: str, dtype: torch.dtype, *, runs: bool = False, csr_rows: bool = False, unsorted: bool = False,
           compiled: bool = False, bag: bool = False, one_column: bool = False, gather: bool = False,
           one_dim: bool = False, traced: bool = False) -> str:
    """The engine for a ``mode`` combine (``sum prod amax amin``) of ``dtype`` values, by what the plan and
    the device allow:

    ``runs``: the segments are sorted contiguous runs; ``csr_rows``: they are the rows of a 2-D CSR
    matrix of 1-D values (a plain row sum may take its SpMV); ``unsorted``: unsorted segment ids of a
    segment plan; ``compiled``: the compiled CPU kernels are loaded and the device is the CPU;
    ``bag``: offsets of a segment plan (embedding_bag may fuse its gather); ``one_column``: the values
    have one column; ``gather``: the rows are read through indices; ``one_dim``: the values are 1-D
    (one scalar per element); ``traced``: under torch.compile
    (sizes are symbols: only the scatter forms trace).
    """
    floating = dtype in _FLOATS
    if traced:
        return "index_add" if mode == "sum" else "scatter_reduce"
    if csr_rows and mode == "sum" and floating:
        return "csr_mv"
    if compiled and floating and mode != "prod":
        if unsorted:
            return "numba_scatter"
        if mode != "sum" or (one_column and not gather):  # (one column read in order: 1.6x embedding_bag)
            return "numba_sorted"
    if bag and mode == "sum" and (dtype.is_floating_point and not dtype.is_complex):
        return "embedding_bag"
    if runs and floating:
        return "segment_reduce"
    if mode == "sum":
        return "scatter_add" if one_dim else "index_add"
    return "scatter_reduce"
