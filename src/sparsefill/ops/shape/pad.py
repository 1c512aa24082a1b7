"""``F.pad`` of a SparseTensor: constant, reflect, replicate and circular.

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
* **circular**: the same, with ``src(i) = o + (i - max(l, 0)) mod c`` over the cropped input
  (``o = max(-l, 0)`` elements cut on the left, ``c`` kept: torch wraps around what negative pads
  leave).  torch composes it of slices copied into ``new_empty`` (a dense tensor of the output's
  size), so it is routed at ``F.pad`` in every grad mode: :class:`CircularPad`, O(nse * copies).

>>> import torch, sparsefill, torch.nn.functional as F
>>> A = sparsefill.sparse_coo_tensor([[0, 0], [0, 2]], [1., 3.], (1, 3), fill_value=0.)
>>> F.pad(A, (1, 1)).indices().tolist(), F.pad(A, (2, 0), mode="reflect").to_dense().tolist()
([[0, 0], [1, 3]], [[3.0, 0.0, 1.0, 0.0, 3.0]])
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from sparsefill._tensor.parts import coalesced_parts, parts_to_sparse
from sparsefill._kernels.index import linearize, unravel
from sparsefill._tensor.policy import check_densify
from sparsefill._tensor.tensor import SparseTensor
from sparsefill._autograd.functions import _pattern, refuse_vmap, sparse_inside
from sparsefill.ops.autograd_routes import register_route
from sparsefill.ops.registry import register

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
    """The gradient of :func:`_index_pad`: per padded dim, each input position ``j`` sums the
    output gradient over the positions reading it (``mult(j)`` of them)::

        grad_in[j] = sum_{i: src(i) = j} g[i] = sum_{stored i} g[i] + (mult(j) - stored(j)) f

    for a SparseTensor ``g`` of fill ``f``: along a dense dim on every stored row and the fill
    (pattern kept); along a sparse dim the stored elements move to their sources, and where
    ``mult(j) != 1`` with ``f != 0`` (the reflected or replicated band) the unspecified elements
    take ``mult(j) f``: that band is stored, dense by nature (as large as the padded border)."""
    g, A, pad = args[:3]
    if not isinstance(g, SparseTensor):
        if not isinstance(A, SparseTensor):
            return NotImplemented
        # (a dense upstream gradient: the input's gradient is dense by nature, and torch's kernel
        # reads the input's shape from a tensor of it)
        check_densify(
            f"{func} with a dense upstream gradient (the input's gradient is dense)",
            2 * A.numel() * A.element_size(),
            by_nature=True,
        )
        return func(g, torch.empty(A.shape, dtype=A.dtype, device=g.device), pad)
    reflect = _BACKWARD[func]
    for d, left, right in _dims_pads(A.dim(), pad):
        src = _source(A.shape[d], left, right, reflect).to(g.device)
        g = _gather_back(g, d, src, A.shape[d])
    return g


def _gather_back(g: SparseTensor, d: int, src: torch.Tensor, n: int) -> SparseTensor:
    """The adjoint of ``index_select(d, src)`` on a SparseTensor ``g``: size ``n`` along ``d``."""
    sd = g.dim() - g.dense_dim()
    shape = tuple(g.shape[:d]) + (n,) + tuple(g.shape[d + 1 :])
    idx, vals = coalesced_parts(g)
    D = tuple(g._dense_shape)
    if d >= sd:  # a dense dim: every stored row and the fill row
        k = d - sd
        vals = vals.new_zeros(vals.shape[: k + 1] + (n,) + vals.shape[k + 2 :]).index_add(
            k + 1, src, vals
        )
        fill = g._fill
        if not g._indefinite:
            f = g._fill.expand(D)
            fill = f.new_zeros(f.shape[:k] + (n,) + f.shape[k + 1 :]).index_add(k, src, f)
        return parts_to_sparse(idx, vals, shape, fill, indefinite=g._indefinite, coalesced=True)
    f = vals.new_zeros(D) if g._indefinite else g._fill.expand(D)
    moved = idx.clone()
    moved[d] = src[idx[d]]
    mult = torch.bincount(src, minlength=n)
    band = _band(g, d, mult, shape, sd)
    mkeys = linearize(moved, shape[:sd])
    ukeys = torch.unique(torch.cat([linearize(band, shape[:sd]), mkeys]))
    if band.shape[1]:  # the band and the moved elements: stored, dense by nature
        check_densify(
            "the gradient of a reflect/replicate pad at the band of a nonzero fill",
            ukeys.numel() * g.element_size() * max(f.numel(), 1),
            by_nature=True,
        )
    bidx = unravel(ukeys, shape[:sd])
    pos = torch.searchsorted(ukeys, mkeys)
    # the unspecified elements reading j: mult(j) less the stored ones (a NaN or inf fill counts
    # only where some are: 0 * f is not 0 then)
    unspec = mult[bidx[d]] - torch.bincount(pos, minlength=ukeys.numel())
    per = torch.where(unspec > 0, unspec, 0).to(vals.dtype).view((-1,) + (1,) * len(D)) * f
    out_vals = torch.where((unspec > 0).view(per.shape[:1] + (1,) * len(D)), per, 0).expand(
        (ukeys.numel(),) + D
    )
    out_vals = out_vals.clone().index_add_(0, pos, vals)
    fill = vals.new_zeros(()) if g._indefinite else g._fill
    return parts_to_sparse(bidx, out_vals, shape, fill, coalesced=True)


def _band(g: SparseTensor, d: int, mult: torch.Tensor, shape, sd: int) -> torch.Tensor:
    """The sparse coordinates whose position ``j`` along ``d`` has ``mult(j) != 1`` (every
    combination of the other sparse dims), where ``g``'s fill is not known to be 0."""
    j = (mult != 1).nonzero()[:, 0]
    if g._indefinite or g._fill_is_zero() or not j.numel():
        return torch.zeros((sd, 0), dtype=torch.int64, device=mult.device)
    ranges = [torch.arange(shape[e], device=mult.device) for e in range(sd)]
    ranges[d] = j
    n = 1
    for r in ranges:
        n *= r.numel()
    check_densify(
        "the gradient of a reflect/replicate pad at the band of a nonzero fill",
        n * g.element_size() * max(g._fill.numel(), 1),
        by_nature=True,
    )
    grid = torch.meshgrid(*ranges, indexing="ij")
    return torch.stack([t.reshape(-1) for t in grid])


# ---------------------------------------------------------------------------------- circular
def _circular_source(n: int, left: int, right: int) -> torch.Tensor:
    """The input position each output position of a circular pad reads along a dim of size
    ``n``: the cropped input (``o`` cut on the left, ``c`` kept) wrapped around."""
    o, c = max(-left, 0), n - max(-left, 0) - max(-right, 0)
    i = torch.arange(n + left + right)
    if c <= 0:  # (torch reads uninitialized memory there)
        if not i.numel():
            return i
        raise ValueError(
            f"F.pad(mode='circular'): pads {(left, right)} crop all {n} elements of a dim and"
            " pad it again: nothing to wrap around"
        )
    return o + (i - max(left, 0)) % c


def _circular_forward(A: SparseTensor, dims) -> SparseTensor:
    for d, left, right in dims:
        A = A.index_select(d, _circular_source(A.shape[d], left, right).to(A.device))
    return A


class CircularPad(torch.autograd.Function):
    """``F.pad(A, pad, mode="circular")``: an ``index_select`` per padded dim; the gradient adds
    each output gradient back to its source (:func:`_gather_back` for a SparseTensor gradient,
    ``index_add`` for a dense one)."""

    @staticmethod
    def forward(A, dims):
        return _circular_forward(_pattern(A), dims)

    @staticmethod
    def setup_context(ctx, inputs, output):
        A, ctx.dims = inputs
        ctx.shape = tuple(A.shape)

    vmap = staticmethod(lambda info, in_dims, *args: refuse_vmap("a SparseTensor circular pad"))

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        g = sparse_inside(g)
        for d, left, right in reversed(ctx.dims):
            n = ctx.shape[d]
            src = _circular_source(n, left, right).to(g.device)
            if isinstance(g, SparseTensor):
                g = _gather_back(g, d, src, n)
            else:
                shape = g.shape[:d] + (n,) + g.shape[d + 1 :]
                g = g.new_zeros(shape).index_add_(d, src, g)
        return g, None


def _sig_pad(input, pad, mode="constant", value=None):
    return input, pad, mode, value


@register_route(torch.nn.functional.pad, always=True)
def _route_pad(func, args, kwargs):
    """``F.pad(A, pad, mode="circular")`` of a SparseTensor (other modes: their handlers)."""
    try:
        A, pad, mode, value = _sig_pad(*args, **kwargs)
    except TypeError:
        return NotImplemented  # (torch's error)
    if mode != "circular" or not isinstance(A, SparseTensor):
        return NotImplemented
    meta = torch.empty(A.shape, dtype=A.dtype, device="meta")
    func(meta, pad, mode, value)  # torch's errors (pad sizes, dims, wrapping more than once)
    dims = _dims_pads(A.dim(), pad)
    if A.requires_grad and torch.is_grad_enabled():
        return CircularPad.apply(A, dims)
    return _circular_forward(A, dims)
