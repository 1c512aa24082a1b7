"""Indexing by a mask: ``nonzero`` (``argwhere``), ``masked_select`` and ``masked_scatter``::

    op(A, mask).to_dense() == op(A.to_dense(), mask)

``nonzero`` of a zero fill reads the stored elements; ``masked_select`` is ``A[mask]``
(``indexing.py``); ``masked_scatter`` writes at the mask's coordinates (``coords.write``) and is
the backward of ``masked_select``; ``masked_fill_`` with a dense mask along the sparse dims writes
the mask's True elements the same way.  A nonzero fill makes ``nonzero`` dense by nature.
"""

from __future__ import annotations

import torch

from sparsefill._kernels import index as _index
from sparsefill._tensor.parts import coalesced_parts, dense_of
from sparsefill._tensor.policy import check_densify
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops._schema import meta_of
from sparsefill.ops.registry import register
from sparsefill.ops.shape.coords import _result, write

aten = torch.ops.aten


@register(aten.nonzero.default, aten.argwhere.default)
def _nonzero(func, args, kwargs):
    """``nonzero(A)``: the coordinates of the nonzero elements in row-major order, as torch lists
    them.  With a zero fill they are stored ones, O(nse).  A nonzero (or NaN) fill makes every
    unspecified element nonzero: the result is dense by nature (as long as ``A`` has elements), so
    it is built in one pass from a mask of ``A``'s elements, the fill's where unspecified, under the
    densify policy's ``dense_by_nature``.  An indefinite fill: the next stage."""
    A = args[0]
    if A._indefinite:
        return NotImplemented
    idx, vals = coalesced_parts(A)
    if not A._fill_is_zero():
        return aten.nonzero.default(_nonzero_mask(A, idx, vals))
    if A.dense_dim():
        nz = (vals != 0).nonzero()
        idx = torch.cat([idx[:, nz[:, 0]], nz[:, 1:].T])
    else:
        idx = idx[:, vals != 0]
    return idx.T.contiguous()


_nonzero.dense_by_nature = "a nonzero fill: every unspecified element is listed"


def _nonzero_mask(A: SparseTensor, idx: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
    """``A != 0`` as a dense bool tensor: the fill's test where unspecified, the stored values'
    where stored (the mask of a result that lists every element, dense by nature)."""
    check_densify(
        "nonzero of a SparseTensor with a nonzero fill (every unspecified element listed)",
        A.numel() * (1 + 8 * max(A.dim(), 1)),
        by_nature=True,
    )
    S, Dn = A._sparse_shape, _index.numel(A._dense_shape)
    mask = (A._fill != 0).expand(A._dense_shape).reshape(1, Dn).repeat(_index.numel(S), 1)
    mask[_index.linearize(idx, S)] = (vals != 0).reshape(-1, Dn)
    return mask.reshape(A.shape)


@register(aten.nonzero_static.default)
def _nonzero_static(func, args, kwargs):
    """``nonzero_static(A, size=, fill_value=)``: :func:`_nonzero`'s rows, the first ``size`` of
    them, padded with rows of ``fill_value`` to ``size``."""
    A = args[0]
    size, fill_value = kwargs["size"], kwargs.get("fill_value", -1)
    if A._indefinite:
        return NotImplemented
    func(meta_of(A), size=size, fill_value=fill_value)  # torch's errors (a negative size)
    rows = _nonzero(aten.nonzero.default, (A,), {})[:size]
    pad = rows.new_full((size - rows.shape[0], rows.shape[1]), fill_value)
    return torch.cat([rows, pad])


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


@register(aten.masked_fill_.Scalar, aten.masked_fill_.Tensor)
def _masked_fill_(func, args, kwargs):
    """``A.masked_fill_(mask, value)`` with a dense ``mask`` that varies along ``A``'s sparse dims
    (``loss.masked_fill_(target == ignore_index, 0)`` in torch's cross_entropy): the elements where
    ``mask`` is True take ``value`` and join the pattern (``coords.write``), O(nse + mask's
    elements); the others keep their values and the fill.  Other masks (0-d, over the dense dims,
    a SparseTensor), a masked ``A``: the element-wise rule.  (Out of place, the rule gives the dense
    result: the mask is dense, and where it is mostly True the dense form is the cheaper one.)"""
    from sparsefill.ops.pointwise.dense_operands import _over_dense_dims

    A, mask, value = args[0], args[1], args[2]
    if (
        not isinstance(A, SparseTensor)
        or A._indefinite
        or isinstance(mask, SparseTensor)
        or isinstance(value, SparseTensor)
        or not mask.dim()
        or _over_dense_dims(mask, A) is not None
        or torch.broadcast_shapes(A.shape, mask.shape) != A.shape
    ):
        return NotImplemented
    if mask.dtype != torch.bool:  # (torch's error; its meta kernel does not check)
        raise RuntimeError(
            f"masked_fill_ only supports boolean masks, but got mask with dtype {mask.dtype}"
        )
    func(meta_of(A), mask.to("meta"), value.to("meta") if torch.is_tensor(value) else value)
    coords = aten.nonzero.default(mask.expand(A.shape)).T
    v = torch.as_tensor(value, dtype=A.dtype, device=A.device).expand(coords.shape[1])
    return _result(func, A, write(A, coords, v))
