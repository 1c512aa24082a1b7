"""``F.pad`` of a SparseTensor: constant, reflect and replicate (circular is native through its
composite pieces: slices and a copy).

* **constant** (``constant_pad_nd``): the stored elements shift by the left pads (negative pads
  crop: elements cut off are dropped), the dense dims of every stored row and of the fill are
  padded with the value.  Where the value equals the fill over the padded sparse dims, the border
  is unspecified: the pattern is kept, shifted, O(nse).  Otherwise the border is dense by nature
  (each of its elements holds the value, the fill holds elsewhere): it is stored exactly, O(nse +
  border), under the densify policy (``dense_by_nature``).
* **reflect**, **replicate** (``reflection_padNd``, ``replication_padNd``): output position ``i``
  along a padded dim reads input position ``src(i)`` (``|i - l|`` mirrored at the far end, or
  ``i - l`` clamped): an ``index_select`` per padded dim, which copies each stored element to
  every position reading it and keeps the fill.  The gradient adds each output gradient back to
  its source (``index_add``), as sparse as the upstream gradient.

>>> import torch, sparsefill, torch.nn.functional as F
>>> A = sparsefill.sparse_coo_tensor([[0, 0], [0, 2]], [1., 3.], (1, 3), fill_value=0.)
>>> F.pad(A, (1, 1)).indices().tolist(), F.pad(A, (2, 0), mode="reflect").to_dense().tolist()
([[0, 0], [1, 3]], [[3.0, 0.0, 1.0, 0.0, 3.0]])
"""

from __future__ import annotations

import torch

from .._convert import coalesced_parts, parts_to_sparse
from .._index import linearize
from .._policy import check_densify
from .._tensor import SparseTensor
from .registry import register

aten = torch.ops.aten


def _dims_pads(ndim: int, pad) -> list[tuple[int, int, int]]:
    """``(dim, left, right)`` for each dim ``pad`` names (its pairs start at the last dim)."""
    return [(ndim - 1 - i, int(pad[2 * i]), int(pad[2 * i + 1])) for i in range(len(pad) // 2)]


@register(aten.constant_pad_nd.default)
def _constant_pad(func, args, kwargs):
    """``constant_pad_nd`` as the module docstring says: the pattern shifted, the border stored
    only where the value differs from the fill."""
    A = args[0]
    pad = args[1] if len(args) > 1 else kwargs["pad"]
    value = args[2] if len(args) > 2 else kwargs.get("value", 0)
    if not isinstance(A, SparseTensor):
        return NotImplemented
    shape = func(torch.empty(A.shape, dtype=A.dtype, device="meta"), pad, value).shape  # errors
    sd = A.dim() - A.dense_dim()
    dims = _dims_pads(A.dim(), pad)
    dense_pad = [p for d, l, r in dims if d >= sd for p in (l, r)]
    idx, vals = coalesced_parts(A)
    D = tuple(A._dense_shape)
    if dense_pad:
        vals = func(vals, dense_pad, value)
    fill = A._fill if A._indefinite or not dense_pad else func(A._fill.expand(D), dense_pad, value)
    keep, shift = None, torch.zeros((sd, 1), dtype=idx.dtype, device=idx.device)
    for d, left, _ in dims:
        if d < sd:
            shift[d] = left
            inside = (idx[d] + left >= 0) & (idx[d] + left < shape[d])
            keep = inside if keep is None else keep & inside
    if keep is not None:
        idx, vals = (idx + shift)[:, keep], vals[keep]
    border = _border(A, shape, dims, sd, fill, value)
    if border is not None:  # (disjoint from the stored elements: a sort makes them coalesced)
        idx = torch.cat([idx, border], 1)
        vals = torch.cat([vals, vals.new_full((border.shape[1],) + tuple(vals.shape[1:]), value)])
        order = torch.argsort(linearize(idx, shape[:sd]))
        idx, vals = idx[:, order], vals[order]
    return parts_to_sparse(
        idx,
        vals,
        shape,
        fill,
        indefinite=A._indefinite,
        layout=A._sf_layout,
        coalesced=True,
    )


_constant_pad.dense_by_nature = (
    "the pad value differs from the fill over padded sparse dims: the border is stored element by"
    " element"
)


def _border(A, shape, dims, sd, fill, value):
    """The coordinates ``(sd, B)`` of the padded border over the sparse dims, or None when it is
    unspecified (no sparse dim grows, or the value equals the padded fill)."""
    grows = [(d, left) for d, left, right in dims if d < sd and (left > 0 or right > 0)]
    if not grows:
        return None
    if not A._indefinite:
        v = torch.full_like(fill, value)
        if bool(((v == fill) | (v.isnan() & fill.isnan())).all()):
            return None
    lo = [0] * sd
    hi = list(shape[:sd])
    for d, left, _ in dims:
        if d < sd:
            lo[d], hi[d] = max(left, 0), min(left + A.shape[d], shape[d])
    slabs = []
    for d, _ in sorted(grows):
        outside = torch.cat([torch.arange(0, lo[d]), torch.arange(hi[d], shape[d])])
        ranges = [torch.arange(lo[e], hi[e]) for e in range(d)]
        ranges += [outside] + [torch.arange(shape[e]) for e in range(d + 1, sd)]
        n = 1
        for r in ranges:
            n *= r.numel()
        check_densify(
            "constant_pad_nd's border (a pad value other than the fill)",
            n * max(A.element_size(), 1) * max(fill.numel(), 1),
            by_nature=True,
        )
        if n:
            grid = torch.meshgrid(*ranges, indexing="ij")
            slabs.append(torch.stack([g.reshape(-1) for g in grid]))
    return torch.cat(slabs, 1).to(A.device) if slabs else None


# ---------------------------------------------------------------------- reflect and replicate
_REFLECT = {
    aten.reflection_pad1d.default: 1,
    aten.reflection_pad2d.default: 2,
    aten.reflection_pad3d.default: 3,
}
_REPLICATE = {
    aten.replication_pad1d.default: 1,
    aten.replication_pad2d.default: 2,
    aten.replication_pad3d.default: 3,
}


def _source(n: int, left: int, right: int, reflect: bool) -> torch.Tensor:
    """The input position each output position reads along one dim of size ``n``."""
    j = torch.arange(-left, n + right)
    if reflect:
        j = j.abs()
        return torch.where(j >= n, 2 * (n - 1) - j, j)
    return j.clamp(0, n - 1)


@register(*_REFLECT, *_REPLICATE)
def _index_pad(func, args, kwargs):
    """``reflection_padNd`` / ``replication_padNd``: one ``index_select`` per padded dim."""
    A, pad = args[0], (args[1] if len(args) > 1 else kwargs["padding"])
    if not isinstance(A, SparseTensor):
        return NotImplemented
    func(torch.empty(A.shape, dtype=A.dtype, device="meta"), pad)  # torch's errors
    reflect = func in _REFLECT
    out = A
    for d, left, right in _dims_pads(A.dim(), pad):
        src = _source(A.shape[d], left, right, reflect).to(A.device)
        out = out.index_select(d, src)
    return out


_BACKWARD = {
    aten.reflection_pad1d_backward.default: True,
    aten.reflection_pad2d_backward.default: True,
    aten.reflection_pad3d_backward.default: True,
    aten.replication_pad1d_backward.default: False,
    aten.replication_pad2d_backward.default: False,
    aten.replication_pad3d_backward.default: False,
}


@register(*_BACKWARD)
def _index_pad_backward(func, args, kwargs):
    """The gradient of :func:`_index_pad`: each padded dim in turn (last first), the output
    gradient added back to its sources (``index_add``); a SparseTensor gradient stays one."""
    g, A, pad = args[:3]
    if not isinstance(g, SparseTensor) and not isinstance(A, SparseTensor):
        return NotImplemented
    reflect = _BACKWARD[func]
    shape = list(g.shape)
    for d, left, right in _dims_pads(A.dim(), pad):
        n = A.shape[d]
        src = _source(n, left, right, reflect).to(g.device)
        shape[d] = n
        base = torch.zeros(shape, dtype=g.dtype, device=g.device)
        if isinstance(g, SparseTensor):
            base = parts_to_sparse(
                torch.zeros((g.dim() - g.dense_dim(), 0), dtype=torch.int64, device=g.device),
                g._vals.new_zeros((0,) + tuple(shape[g.dim() - g.dense_dim() :])),
                tuple(shape),
                g._vals.new_zeros(()),
                known_zero=True,
                coalesced=True,
            )
        g = base.index_add(d, src, g)
    return g
