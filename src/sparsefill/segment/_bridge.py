"""A values+lengths batch is a CSR tensor whose rows are the segments.

Two readings of a batch ``(data, lengths)`` as a :class:`sparsefill.SparseTensor` (CSR layout):

* ``to_sparse_csr(data, lengths)``: row ``s`` holds the rows of segment ``s`` at columns ``0 ..
  lengths[s]-1`` (``crow_indices = offsets``); every other element is the fill, so
  ``to_sparse_csr(data, lengths, fill_value=p).to_dense() == pack_segments(data, lengths,
  pad_value=p)``; ``from_sparse_csr`` inverts it.
* ``ids_to_sparse(ids, lengths, num_ids)``: the spec's "sparse tensor" of an id list -- row ``s``
  has ``weights`` (default 1) at the columns ``ids`` of segment ``s`` (duplicates add), shape ``(S,
  num_ids)``.

>>> import torch, sparsefill
>>> ids_to_sparse(torch.tensor([1, 2, 3, 2, 4, 6, 7, 3, 6]), torch.tensor([3, 4, 2]), 8).to_dense()
tensor([[0., 1., 1., 1., 0., 0., 0., 0.],
        [0., 0., 1., 0., 1., 0., 1., 1.],
        [0., 0., 0., 1., 0., 0., 1., 0.]])
"""

from __future__ import annotations

import torch

from sparsefill._kernels import engine as _engine, reducer as _reduce
from sparsefill._creation.constructors import FillValue, sparse_csr_tensor
from sparsefill._tensor.tensor import SparseTensor
from sparsefill._kernels.segment_check import IndexLike, as_index, check_indices, check_lengths
from sparsefill.segment._repr import lengths_range_fill, lengths_to_offsets

__all__ = ["to_sparse_csr", "from_sparse_csr", "ids_to_sparse", "csr_row_reduce"]

_ROW_REDUCERS = {
    "sum": "sum",
    "mean": "mean",
    "max": "amax",
    "min": "amin",
    "prod": "prod",
    "logsumexp": "logsumexp",
    "amax": "amax",
    "amin": "amin",
}


def to_sparse_csr(
    data: torch.Tensor,
    lengths: IndexLike,
    *,
    num_columns: int | None = None,
    fill_value: FillValue = 0,
    validate: bool = True,
) -> SparseTensor:
    """The batch as a CSR SparseTensor of shape ``(S, L, *data.shape[1:])`` (``L = num_columns`` or
    the longest segment); differentiable in ``data`` (through the constructor)."""
    lengths = as_index(lengths, "lengths", data.device)
    if data.dim() == 0:
        raise ValueError("data must have at least one dimension (the rows of the batch)")
    check_lengths(lengths, data.shape[0], validate=validate)
    longest = int(lengths.max()) if lengths.numel() else 0
    L = longest if num_columns is None else num_columns
    if L < longest:
        raise ValueError(f"num_columns = {L} is shorter than the longest segment ({longest})")
    crow = lengths_to_offsets(lengths, validate=False).long()
    col = lengths_range_fill(lengths, validate=False).long()
    return sparse_csr_tensor(
        crow,
        col,
        data,
        (lengths.numel(), L, *data.shape[1:]),
        fill_value=fill_value,
        check_invariants=False,
    )


def from_sparse_csr(A: SparseTensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(values, lengths, columns)`` of a 2-D CSR SparseTensor (``lengths`` = stored elements per
    row).

    For a tensor made by ``to_sparse_csr``, ``columns`` is ``lengths_range_fill(lengths)``.
    """
    if getattr(A, "sparse_layout", None) != torch.sparse_csr:
        raise TypeError("from_sparse_csr needs a sparsefill SparseTensor in the CSR layout")
    crow = A.crow_indices()
    if crow.dim() != 1:
        raise ValueError(
            "from_sparse_csr needs a CSR tensor without batch dims, got crow of shape "
            f"{tuple(crow.shape)}"
        )
    return A.values(), crow.diff(), A.col_indices()


def ids_to_sparse(
    ids: IndexLike,
    lengths: IndexLike,
    num_ids: int | None = None,
    *,
    weights: torch.Tensor | None = None,
    validate: bool = True,
) -> SparseTensor:
    """The id lists as a CSR SparseTensor ``(S, num_ids)``: ``A[s, j] = sum of weights[i]`` over the
    positions ``i`` of segment ``s`` with ``ids[i] == j`` (fill 0).  ``num_ids`` defaults to
    ``max(ids) + 1``."""
    ids = as_index(ids, "ids")
    lengths = as_index(lengths, "lengths", ids.device)
    check_lengths(lengths, ids.numel(), validate=validate)
    if num_ids is None:
        num_ids = int(ids.max()) + 1 if ids.numel() else 0
    check_indices(ids, num_ids, "ids", what="columns (num_ids)")
    if weights is None:
        weights = torch.ones(ids.numel(), dtype=torch.get_default_dtype(), device=ids.device)
    elif weights.shape[:1] != ids.shape:
        raise ValueError(
            f"weights must have one entry per id ({ids.numel()}), got shape {tuple(weights.shape)}"
        )
    S = lengths.numel()
    seg = torch.repeat_interleave(
        torch.arange(S, device=ids.device), lengths.long(), output_size=ids.numel()
    )
    keys, inv = torch.unique(seg * num_ids + ids.long(), sorted=True, return_inverse=True)
    vals = weights.new_zeros((keys.numel(), *weights.shape[1:])).index_add(0, inv, weights)
    rows, cols = keys // max(num_ids, 1), keys % max(num_ids, 1)
    crow = torch.zeros(S + 1, dtype=torch.int64, device=ids.device)
    torch.cumsum(torch.bincount(rows, minlength=S), 0, out=crow[1:])
    return sparse_csr_tensor(
        crow, cols, vals, (S, num_ids, *weights.shape[1:]), check_invariants=False
    )


def csr_row_reduce(A: SparseTensor, reducer: str = "sum") -> torch.Tensor:
    """Reduce every row of a 2-D CSR SparseTensor, its unspecified elements included (dense result).

    The rows are segments of the stored values; the ``n_s = ncols - nse_s`` fills of row ``s`` join
    in
    closed form through the reducer protocol (``sparsefill._kernels.reducer``)::

        csr_row_reduce(A, r)[s] == r(A.to_dense()[s])    (an indefinite fill: the fills are skipped)

    ``reducer``: ``sum mean max min prod logsumexp``.  The engine is ``_kernels.engine.choose``'s
    for CSR rows (the SpMV for sums, the compiled sorted kernels for max and min on the compiled
    segment backend); the protocol folds the fills and finalizes with the count; differentiable in
    the values and the fill.

    >>> import sparsefill
    >>> A = sparsefill.sparse_csr_tensor([0, 2, 2], [0, 3], [5., -1.], (2, 4), fill_value=2.)
    >>> csr_row_reduce(A, "sum"), csr_row_reduce(A, "min")
    (tensor([8., 8.]), tensor([-1.,  2.]))
    """
    from sparsefill._kernels.segment import compiled_for

    if getattr(A, "sparse_layout", None) != torch.sparse_csr or A.crow_indices().dim() != 1:
        raise TypeError(
            "csr_row_reduce needs a 2-D sparsefill SparseTensor in the CSR layout (no batch dims)"
        )
    if reducer not in _ROW_REDUCERS:
        raise ValueError(
            f"unknown reducer {reducer!r}; expected one of sum, mean, max, min, prod, logsumexp"
        )
    red = _reduce.REDUCERS[_ROW_REDUCERS[reducer]]
    crow, vals = A.crow_indices(), A.values()
    S, ncols = A.shape[0], A.shape[1]
    nse = crow.diff()
    kw = {} if A.is_fill_indefinite() else dict(fill=A.fill_value(), n_fill=ncols - nse)
    rows = _engine.CsrRows(
        crow, A.col_indices(), ncols, compiled=compiled_for(vals.device, vals.numel())
    )
    return red(vals, None, S, lengths=nse, csr=rows, **kw)
