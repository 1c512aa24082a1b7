"""Indexing by a mask: ``nonzero`` (``argwhere``), ``masked_select`` and ``masked_scatter``::

    op(A, mask).to_dense() == op(A.to_dense(), mask)

``nonzero`` of a zero fill reads the stored elements; ``masked_select`` is ``A[mask]``
(``indexing.py``); ``masked_scatter`` writes at the mask's coordinates (``coords.write``) and is
the backward of ``masked_select``.
"""

from __future__ import annotations

import torch

from sparsefill._tensor.parts import coalesced_parts, dense_of
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops.registry import register
from sparsefill.ops.shape.coords import _result, write

aten = torch.ops.aten


@register(aten.nonzero.default, aten.argwhere.default)
def _nonzero(func, args, kwargs):
    """With a zero fill the nonzero elements are stored ones: their indices (row-major order, as
    torch). A nonzero fill makes the result dense by nature (next stage)."""
    A = args[0]
    if A._indefinite or not A._fill_is_zero():
        return NotImplemented
    idx, vals = coalesced_parts(A)
    if A.dense_dim():
        nz = (vals != 0).nonzero()
        idx = torch.cat([idx[:, nz[:, 0]], nz[:, 1:].T])
    else:
        idx = idx[:, vals != 0]
    return idx.T.contiguous()


@register(aten.masked_select.default)
def _masked_select(func, args, kwargs):
    """``A[mask]`` with ``A`` and ``mask`` broadcast (a 1-D SparseTensor of the selected
    elements)."""
    A, mask = args[0], args[1]
    if isinstance(mask, SparseTensor):
        return NotImplemented
    if mask.dtype != torch.bool:
        raise RuntimeError(f"masked_select: expected BoolTensor for mask, got {mask.dtype}")
    shape = torch.broadcast_shapes(A.shape, mask.shape)  # torch's shape error
    if A.shape != shape:
        A = A.expand(shape)
    return aten.index.Tensor(A, [mask.expand(shape)])


@register(aten.masked_scatter.default, aten.masked_scatter_.default)
def _masked_scatter(func, args, kwargs):
    """``A.masked_scatter(mask, source)``: the elements where ``mask`` (broadcast) is True take
    ``source``'s first elements in row-major order and join the pattern (``coords.write``), O(nse +
    mask's elements)::

        A.masked_scatter(mask, s).to_dense() == A.to_dense().masked_scatter(mask, s)

    It is the backward of ``masked_select`` (the upstream gradient scattered into
    ``zeros_like(A)``): a SparseTensor on the selected elements.  A SparseTensor mask with a False
    fill gives its stored True elements; a SparseTensor source is read densely at its first
    elements; other masks, an indefinite source, a hybrid indefinite ``A``: the next stage."""
    A, mask, source = args[0], args[1], args[2]
    sparse_mask = isinstance(mask, SparseTensor)
    if (
        not isinstance(A, SparseTensor)
        or isinstance(source, SparseTensor)
        and source._indefinite
        or A._indefinite
        and A.dense_dim()
        or sparse_mask
        and (mask._indefinite or not mask._fill_is_zero())
    ):
        return NotImplemented
    # torch's dtype errors, from the real kernel
    probe = torch.empty(0, dtype=A.dtype, device=A.device)
    probe.masked_scatter_(torch.empty(0, dtype=mask.dtype, device=A.device), source.new_empty(0))
    shape = torch.broadcast_shapes(A.shape, mask.shape)  # torch's shape error
    if shape != A.shape:
        if func is aten.masked_scatter_.default:
            raise RuntimeError(
                f"masked_scatter_: mask of shape {list(mask.shape)} does not broadcast to self "
                f"of shape {list(A.shape)}"
            )
        A = A.expand(shape)
    coords = aten.nonzero.default(mask.expand(shape)).T  # row-major, as torch fills them
    if source.numel() < coords.shape[1]:
        raise RuntimeError("Number of elements of source < number of ones in mask")
    src = source.reshape(-1)[: coords.shape[1]]
    return _result(
        func, args[0], write(A, coords, dense_of(src) if isinstance(src, SparseTensor) else src)
    )
