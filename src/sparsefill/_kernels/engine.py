"""The engine boundary: which kernel combines the segments of a plan, chosen in one function and run
in one.

Every reduction of sparsefill (sparse, masked, segment) is the reducer protocol of
:mod:`sparsefill._kernels.reducer` over one segment plan; its ``combine`` step::

    out[s] = combine(init, x_i for every element i of segment s)     (init: the identity by default)

runs on one of these engines, all computing the same values (they differ in speed and in what
they need of the plan, the dtype and the device):

``"csr_mv"``
    row sums of a 2-D CSR matrix: ``torch.mv`` with ones (the sparse BLAS kernel)
``"numba_scatter"``
    the compiled scatter kernels of ``segment/_numba_kernels`` over unsorted ids, in place
``"numba_sorted"``
    the compiled kernels over sorted segments (CPU float32/float64, numba loaded)
``"embedding_bag"``
    ``embedding_bag`` with offsets: sorted floating sums, a gather and weights fused
``"segment_reduce"``
    ``torch.segment_reduce`` over sorted contiguous runs (float32/float64)
``"scatter_add"``
    ``scatter_add_`` (sums of 1-D values on CPU: faster there than ``index_add_`` and
    ``segment_reduce``)
``"index_add"``
    ``index_add_`` (sums of any dtype, any device, traced)
``"scatter_reduce"``
    ``scatter_reduce_`` (prod, amax, amin of any dtype, any device, traced)

:func:`choose` picks one; :func:`run` runs it for the protocol's ``combine``
(:func:`sparsefill._kernels.reducer.segment_combine`).  The compiled engines are reached through the
public functions of ``segment/_kernels`` (``segment_sum``, ``segment_extreme``: their custom ops
under torch.compile), told the engine :func:`run` chose (``engine=``: no second choice);
``segment.reduce``'s own plans (gathers, weights, unsorted ids) choose here too, in those functions.
The engines know tensors only (no SparseTensor).

>>> choose("sum", torch.float32, runs=True)
'segment_reduce'
>>> choose("amax", torch.int64, runs=True)
'scatter_reduce'
>>> v = torch.tensor([1., 2., 4.])
>>> rows = CsrRows(torch.tensor([0, 2, 2, 3]), torch.tensor([0, 3, 1]), 4)
>>> engine = choose("sum", v.dtype, runs=True, csr_rows=True)
>>> run(
...     engine, "sum", v, None, 3, 0, lengths=torch.tensor([2, 0, 1]), csr=rows,
... )
tensor([3., 0., 4.])
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import torch

from sparsefill._kernels.index import runs_to_ids

__all__ = ["choose", "run", "CsrRows", "ENGINES", "spmv_index"]

ENGINES = (
    "csr_mv",
    "numba_scatter",
    "numba_sorted",
    "embedding_bag",
    "segment_reduce",
    "scatter_add",
    "index_add",
    "scatter_reduce",
)
_FLOATS = (torch.float32, torch.float64)


def choose(
    mode: str,
    dtype: torch.dtype,
    *,
    runs: bool = False,
    csr_rows: bool = False,
    unsorted: bool = False,
    compiled: bool = False,
    bag: bool = False,
    one_column: bool = False,
    gather: bool = False,
    one_dim: bool = False,
    traced: bool = False,
) -> str:
    """The engine for a ``mode`` combine (``sum prod amax amin``) of ``dtype`` values, by what the
    plan and the device allow:

    ``runs``: the segments are sorted contiguous runs; ``csr_rows``: they are the rows of a 2-D CSR
    matrix of 1-D values (a plain row sum may take its SpMV); ``unsorted``: unsorted segment ids of
    a segment plan; ``compiled``: the compiled CPU kernels are loaded and the device is the CPU;
    ``bag``: offsets of a segment plan (embedding_bag may fuse its gather); ``one_column``: the
    values have one column; ``gather``: the rows are read through indices; ``one_dim``: the values
    are 1-D (one scalar per element); ``traced``: under torch.compile (sizes are symbols: only the
    scatter forms trace).
    """
    floating = dtype in _FLOATS
    if traced:
        # (runs: the extremes read each run once, where a traced scatter_reduce_ stays aten's
        # unsorted kernel; sums stay index_add_, which inductor fuses with what feeds it)
        if runs and floating and mode in ("amax", "amin"):
            return "segment_reduce"
        return "index_add" if mode == "sum" else "scatter_reduce"
    if csr_rows and mode == "sum" and floating:
        return "csr_mv"
    if compiled and floating and mode != "prod":
        if unsorted:
            return "numba_scatter"
        # (one column read in order: 1.6x embedding_bag)
        if mode != "sum" or (one_column and not gather):
            return "numba_sorted"
    if bag and mode == "sum" and (dtype.is_floating_point and not dtype.is_complex):
        return "embedding_bag"
    if runs and floating:
        return "segment_reduce"
    if mode == "sum":
        return "scatter_add" if one_dim else "index_add"
    return "scatter_reduce"


class CsrRows(NamedTuple):
    """The segments are rows of a 2-D CSR matrix (``crow``, ``col``: its index tensors, ``ncols``
    columns; the values are its stored values, in its order): ``rows`` are the rows that make the
    segments, in order, every row that holds a stored value among them (None: every row; else, say,
    the non-empty rows); ``compiled``: the compiled kernels may run (the segment backend's decision,
    ``segment.compiled_for``); ``index32``: ``(crow, col)`` as ``csr_mv`` reads them best
    (:func:`spmv_index`, cached with the pattern by the caller), or None."""

    crow: torch.Tensor
    col: torch.Tensor
    ncols: int
    rows: torch.Tensor | None = None
    compiled: bool = False
    index32: tuple | None = None


def spmv_index(crow: torch.Tensor, col: torch.Tensor, ncols: int):
    """``(crow, col)`` as int32 copies where the ``csr_mv`` engine reads those best, else None: on
    the CPU torch's SpMV (MKL) converts int64 indices to int32 on every call (a conversion that is a
    large part of a sparse matrix-vector product's cost); None on other devices, for other index
    dtypes, or where int32 cannot hold the sizes.

    >>> [t.dtype for t in spmv_index(torch.tensor([0, 1]), torch.tensor([3]), 4)]
    [torch.int32, torch.int32]
    """
    if (
        crow.device.type != "cpu"
        or crow.dtype != torch.int64
        or max(col.numel(), crow.numel(), ncols) >= 2**31
    ):
        return None
    return crow.to(torch.int32), col.to(torch.int32)


_SEGMENT_REDUCE = {"sum": "sum", "prod": "prod", "amax": "max", "amin": "min"}
_IDENTITY = {"sum": 0, "prod": 1, "amax": -math.inf, "amin": math.inf}  # (of floating values)
_ONES: dict = {}
_CSR_WARNED = [False]


def run(
    engine: str,
    mode: str,
    values: torch.Tensor,
    seg,
    num_segments,
    init,
    *,
    lengths=None,
    csr: CsrRows | None = None,
    traced: bool = False,
) -> torch.Tensor:
    """``out[s] = combine(init, values[i] for i with seg[i] == s)`` along dim 0 on ``engine`` (from
    :func:`choose`; ``init`` the identity where the engine has no start value of its own:
    ``csr_mv``, the compiled kernels).  ``seg`` may be None with ``lengths`` (contiguous runs, in
    order); ``csr`` the CSR rows for ``csr_mv`` and ``numba_sorted``; ``traced``: the sizes are
    symbols."""
    if engine == "csr_mv":
        out = _csr_mv(values, csr)
        return out if csr.rows is None else out.index_select(0, csr.rows)
    # (its default start is the identity: an explicit one costs ~10%)
    if engine == "segment_reduce":
        start = (
            {} if isinstance(init, (int, float)) and init == _IDENTITY[mode] else {"initial": init}
        )
        return torch.segment_reduce(
            values, _SEGMENT_REDUCE[mode], lengths=lengths, unsafe=True, **start
        )
    if engine == "numba_sorted":
        return _compiled_rows(mode, values, csr, init)
    seg = seg if seg is not None else runs_to_ids(lengths, values.shape[0])
    out = values.new_full((num_segments, *values.shape[1:]), init)
    if not traced and values.numel() == 0:
        return out
    if traced and mode == "sum" and type(num_segments) is int and num_segments == 1:
        return out + values.sum(0, keepdim=True)  # (inductor fails on a scatter-add into one row)
    if engine == "index_add":
        return out.index_add_(0, seg, values)
    if engine == "scatter_add":
        return out.scatter_add_(0, seg, values)
    seg = seg.view(-1, *([1] * (values.dim() - 1))).expand_as(values)
    return out.scatter_reduce_(0, seg, values, mode, include_self=True)


def _csr_mv(values: torch.Tensor, csr: CsrRows) -> torch.Tensor:
    """Row sums of the CSR matrix ``(crow, col, values)`` by torch's native CSR ``mv`` with ones
    (the sparse BLAS kernel: ~1.7x faster than ``segment_reduce`` on CPU); differentiable in
    ``values``."""
    nrows = csr.crow.shape[0] - 1
    crow, col = (csr.crow, csr.col) if csr.index32 is None else csr.index32
    key = (values.dtype, values.device, csr.ncols)
    ones = _ONES.get(key)
    if ones is None:  # (read only: one vector of ones per dtype, device and width, the last 8 kept)
        if len(_ONES) >= 8:
            _ONES.pop(next(iter(_ONES)))
        ones = _ONES[key] = torch.ones(csr.ncols, dtype=values.dtype, device=values.device)
    # (torch warns once per process: silenced on the first call, never paid again)
    if _CSR_WARNED[0]:
        M = torch.sparse_csr_tensor(crow, col, values, (nrows, csr.ncols), check_invariants=False)
    else:
        with warnings.catch_warnings():
            # torch: "Sparse CSR tensor support is in beta state"
            warnings.simplefilter("ignore", UserWarning)
            M = torch.sparse_csr_tensor(
                crow, col, values, (nrows, csr.ncols), check_invariants=False
            )
        _CSR_WARNED[0] = True
    return torch.mv(M, ones)


def _compiled_rows(mode: str, values: torch.Tensor, csr: CsrRows, init) -> torch.Tensor:
    """``combine`` of the rows of ``csr`` on the compiled sorted kernels (through
    ``segment/_kernels``' public ``segment_sum``/``segment_extreme``, told the engine chosen here:
    no second choice; an empty row gets ``init``)."""
    from sparsefill._kernels import segment as _kernels
    from sparsefill._kernels.segment_plan import Plan

    nrows, k = csr.crow.shape[0] - 1, values.shape[0]
    x2 = values.reshape(k, math.prod(values.shape[1:]))
    plan = Plan(nrows, k, offsets=csr.crow, compiled=True)
    if mode == "sum":
        out = _kernels.segment_sum(x2, plan, engine="numba_sorted")
    else:
        out, _ = _kernels.segment_extreme(
            x2, plan, largest=mode == "amax", want_arg=False, empty=init, engine="numba_sorted"
        )
    out = out.reshape(nrows, *values.shape[1:])
    return out if csr.rows is None else out.index_select(0, csr.rows)
