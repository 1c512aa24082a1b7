"""``quantile`` and ``nanquantile`` of a SparseTensor in closed form, every interpolation::

    torch.quantile(A, q, dim, keepdim, interpolation=...) == torch.quantile(A.to_dense(), ...)

torch's definition, per slice of ``N`` elements (``nanquantile``: its non-NaN ones; ``quantile``:
a slice holding a NaN gives NaN): the rank ``q * (N - 1)``, rounded by the interpolation
(``lower`` floor, ``higher`` ceil, ``nearest`` half to even), and for ``linear``/``midpoint`` the
``lerp`` of the elements at ``floor`` and ``ceil`` of it (weight ``rank - floor`` or 0.5).  Over a
sparse dim (and ``dim=None``: the flattened tensor) the elements of a given rank come from the
sorted stored values and the fill's run by rank arithmetic (``sorting.Rows.at``): ``O(nse log
nse)`` plus the output, no slice built.  Over a dense dim: ``quantile`` of the stored values and
of the fill, the pattern kept.  The gradient goes to the two selected elements of each slice
(``select_autograd.select_grad``), the fill's share as its mean (routed where
``pattern_grad_is_exact``, as ``max(dim)``; elsewhere the same forward, no gradient path).

An indefinite fill (masked semantics, as the masked reductions): each slice's quantile over its
stored elements; a slice with none stored is unspecified (a SparseTensor with an indefinite fill).

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor([[0, 3]], [4., -2.], (5,), fill_value=1.)   # [4, 1, 1, -2, 1]
>>> torch.quantile(A, 0.75), torch.quantile(A.to_dense(), 0.75)
(tensor(1.), tensor(1.))
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from sparsefill._kernels import index as _index
from sparsefill._autograd.functions import _pattern, refuse_vmap, sparse_inside
from sparsefill._tensor.parts import coalesced_parts
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops._schema import probe_of
from sparsefill.ops.autograd_routes import register_route
from sparsefill.ops.linalg.backward import pattern_grad_is_exact
from sparsefill.ops.reductions.backward import _on_pattern
from sparsefill.ops.reductions.select_backward import select_grad
from sparsefill.ops.order.masked_order import Masked, masked_take
from sparsefill.ops.order.rows import _nan, ranked

T = torch.Tensor
_MODES = ("linear", "lower", "higher", "midpoint", "nearest")


def _ranks(rows, q: torch.Tensor, ignore_nan: bool, interpolation: str):
    """``(below, above, weight)``, each ``(Q, R)``: the ranks of each row's quantiles, as torch's
    ``quantile_compute`` gives them."""
    size, R = rows.size, rows.R
    nan = torch.bincount(rows.r[_nan(rows.v)], minlength=R)
    nan = nan + torch.where(_nan(rows.f_rows), size - torch.bincount(rows.r, minlength=R), 0)
    return rank_math(q, torch.full_like(nan, size), nan, ignore_nan, interpolation)


def rank_math(q, n, nan, ignore_nan: bool, interpolation: str):
    """torch's ranks for slices of ``n`` elements, ``nan`` of them NaN (``(R,)`` each):
    ``nanquantile`` ``q * (n - nan - 1)`` (at least 0), ``quantile`` ``q * (n - 1)`` (the last
    element where a NaN is); rounded per ``interpolation``; ``(below, above, weight)``."""
    q = q.reshape(-1, 1)
    if ignore_nan:
        ranks = (q * (n - nan - 1).to(q.dtype)).clamp_min(0)
    else:
        last = (n - 1).to(q.dtype)
        ranks = torch.where(nan > 0, last, q * last)
    if interpolation == "lower":
        ranks = ranks.floor()
    elif interpolation == "higher":
        ranks = ranks.ceil()
    elif interpolation == "nearest":
        ranks = ranks.round()
    below = ranks.to(torch.int64)
    if interpolation in ("linear", "midpoint"):
        weight = torch.full_like(ranks, 0.5) if interpolation == "midpoint" else ranks - below
        return below, ranks.ceil().to(torch.int64), weight
    return below, None, None


def _masked_quantile(A, q, dim, keepdim, ignore_nan, interpolation, fn):
    """Over the stored elements of each slice only (an indefinite fill); a slice with none is
    unspecified."""
    from sparsefill._creation.constructors import sparse_coo_tensor
    from sparsefill._tensor.fill import indefinite

    grad = A.requires_grad and torch.is_grad_enabled()
    sd = A._sparse_ndim()
    shape = list(A.shape)
    if keepdim:
        shape[dim] = 1
    else:
        del shape[dim]
    if dim >= sd:  # a dense dim: each stored slice, the pattern kept
        idx, V = coalesced_parts(A)
        vals = masked_take(A, torch.arange(V.numel()), grad).reshape(V.shape)
        qv = fn(vals, q, dim - sd + 1, keepdim, interpolation=interpolation)
        outs = [qv] if q.dim() == 0 else list(qv)
        res = [sparse_coo_tensor(idx, o, shape, fill_value=indefinite) for o in outs]
        return res[0] if q.dim() == 0 else torch.stack(res)
    M = Masked(A, dim, False)
    G, Dn = M.keys.numel(), M.Dn
    cnt = torch.diff(torch.cat([M.rstart, M.rstart.new_tensor([M.order.numel()])]))
    r = (M.kinv[:, None] * Dn + torch.arange(Dn, device=cnt.device)).reshape(-1)
    nan = torch.bincount(r[_nan(M.vals.reshape(-1))], minlength=G * Dn)
    below, above, weight = rank_math(q, cnt, nan, ignore_nan, interpolation)
    g = torch.arange(G, device=cnt.device)
    out_idx = M.out_indices(g, keepdim)
    res = []
    for j in range(below.shape[0]):

        def take(t, j=j):
            return masked_take(A, M.sel(g, t[j].reshape(G, Dn)).reshape(-1), grad)

        v = take(below)
        if above is not None:
            v = torch.lerp(v, take(above), weight[j].to(v.dtype))
        res.append(sparse_coo_tensor(out_idx, v.reshape((G,) + M.D), shape, fill_value=indefinite))
    return res[0] if q.dim() == 0 else torch.stack(res)


class RankSelect(torch.autograd.Function):
    """``(below, above, weight)`` values of the quantile ranks of every slice of ``A`` along its
    sparse dim ``dim``; the backward is ``select_grad`` for each selection."""

    @staticmethod
    def forward(A, dim, q, ignore_nan, interpolation):
        got = {}

        def t_of(rows):
            below, above, got["weight"] = _ranks(rows, q, ignore_nan, interpolation)
            return below if above is None else torch.cat([below, above])

        v, i, moved = ranked(_pattern(A), dim, t_of)
        weight, out = got["weight"], moved[:-1]
        Q = v.shape[0] if weight is None else v.shape[0] // 2
        vb, ib = v[:Q], i[:Q]
        if weight is None:
            return vb.reshape([Q] + out), None, ib.reshape([Q] + out), None, None
        va, ia = v[Q:], i[Q:]
        shape = [Q] + out
        return (
            vb.reshape(shape),
            va.reshape(shape),
            ib.reshape(shape),
            ia.reshape(shape),
            (weight.to(vb.dtype).reshape(shape)),
        )

    @staticmethod
    def setup_context(ctx, inputs, output):
        A, ctx.dim = inputs[0], inputs[1]
        ctx.pattern = _pattern(A)
        ctx.save_for_backward(output[2], output[3])
        ctx.mark_non_differentiable(*[t for t in output[2:] if t is not None])

    vmap = staticmethod(lambda info, in_dims, *args: refuse_vmap("a SparseTensor quantile"))

    @staticmethod
    @once_differentiable
    def backward(ctx, Gb, Ga, *_):
        ib, ia = ctx.saved_tensors
        P, grad = ctx.pattern, None
        for G, I in ((Gb, ib), (Ga, ia)):
            if G is None or I is None:
                continue
            G = sparse_inside(G)
            for j in range(I.shape[0]):
                g = select_grad(P, ctx.dim, False, I[j], G[j])
                grad = g if grad is None else grad + g
        return grad, None, None, None, None


class Parts(torch.autograd.Function):
    """``(values, fill)`` of ``A`` (coalesced values; the fill over the dense dims), differentiable:
    the gradient has ``A``'s pattern, the fill's gradient shared evenly among the unspecified
    elements (exact in sum: routed where ``pattern_grad_is_exact``)."""

    @staticmethod
    def forward(A):
        P = _pattern(A)
        return coalesced_parts(P)[1], P._fill.to(P.dtype).expand(P._dense_shape).clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.pattern = _pattern(inputs[0])

    vmap = staticmethod(lambda info, in_dims, *args: refuse_vmap("a SparseTensor's parts"))

    @staticmethod
    @once_differentiable
    def backward(ctx, gv, gf):
        P = ctx.pattern
        idx, V = coalesced_parts(P)
        gv = torch.zeros_like(V) if gv is None else gv
        n = _index.numel(P._sparse_shape) - idx.shape[1]
        if gf is None or not n or P._indefinite:
            return _on_pattern(P, idx, gv, gv.new_zeros(P._dense_shape), True)
        return _on_pattern(P, idx, gv, gf / n, False)


def _sig(input, q, dim=None, keepdim=False, *, interpolation="linear", out=None):
    return dict(q=q, dim=dim, keepdim=keepdim, interpolation=interpolation, out=out)


def _along_sparse(B: SparseTensor, q, dim: int, ignore_nan: bool, interpolation: str):
    """The quantiles over the sparse dim ``dim`` of ``B`` (a definite fill): ``(Q, *reduced)``."""
    vb, va, *_, w = RankSelect.apply(B, dim, q, ignore_nan, interpolation)
    return vb if va is None else torch.lerp(vb, va, w)


def _along_dense(A: SparseTensor, q, dim: int, fn, interpolation: str, keepdim: bool):
    """Over a dense dim: the quantile of every stored slice and of the fill, the pattern kept (one
    SparseTensor per ``q``)."""
    idx = coalesced_parts(A)[0]
    sd = A._sparse_ndim()
    if A.requires_grad and torch.is_grad_enabled():
        vals, fill = Parts.apply(A)
    else:
        vals, fill = coalesced_parts(A)[1], A._fill.expand(A._dense_shape)
    kw = dict(keepdim=keepdim, interpolation=interpolation)
    qv, qf = fn(vals, q, dim - sd + 1, **kw), fn(fill, q, dim - sd, **kw)
    shape = list(A.shape)
    if keepdim:
        shape[dim] = 1
    else:
        del shape[dim]

    def build(v, f):
        from sparsefill._creation.constructors import sparse_coo_tensor

        out = sparse_coo_tensor(idx, v, shape, fill_value=f)
        return out.to_sparse_csr() if A._sf_layout is torch.sparse_csr else out

    if q.dim() == 0:
        return build(qv, qf)
    return torch.stack([build(qv[j], qf[j]) for j in range(q.shape[0])])


@register_route(torch.quantile, T.quantile, torch.nanquantile, T.nanquantile, always=True)
def _route_quantile(func, args, kwargs):
    """``quantile``/``nanquantile`` of a SparseTensor (a dense or float ``q``), without its dense
    form; ``out=``: torch's path."""
    b = _bind(args, kwargs)
    A = args[0] if args else kwargs.get("input")
    if not b or b["out"] is not None or not isinstance(A, SparseTensor):
        return NotImplemented
    q, dim, keep, interp = b["q"], b["dim"], b["keepdim"], b["interpolation"]
    if isinstance(q, SparseTensor) or (
        isinstance(q, torch.Tensor) and q.requires_grad and torch.is_grad_enabled()
    ):  # (a gradient for q: torch's composite, through the native sort)
        return NotImplemented
    fn = torch.nanquantile if func in (torch.nanquantile, T.nanquantile) else torch.quantile
    with torch.no_grad():  # torch's errors (dtype, dim, q's range and shape, interpolation)
        fn(probe_of(A), q, dim, keep, interpolation=interp)
    if A.requires_grad and torch.is_grad_enabled() and not pattern_grad_is_exact(A):
        return NotImplemented  # (torch's composite: a dense gradient through the native sort)
    qt = torch.as_tensor(q, dtype=A.dtype, device=A.device)
    if A.numel() == 0 or A.dim() == 0:
        return (
            NotImplemented
            if A._indefinite
            else fn(A.to_dense(), q, dim, keep, interpolation=interp)
        )
    if A._indefinite:
        B, d = (A.reshape(-1), 0) if dim is None else (A, dim % A.dim())
        out = _masked_quantile(
            B, qt, d, keep and dim is not None, fn is torch.nanquantile, interp, fn
        )
        return out.reshape((-1,) * qt.dim() + (1,) * A.dim()) if keep and dim is None else out
    B, d = (A.reshape(-1), 0) if dim is None else (A, dim % A.dim())
    if d >= B._sparse_ndim():
        return _along_dense(B, qt, d, fn, interp, keep)
    out = _along_sparse(B, qt, d, fn is torch.nanquantile, interp)
    if keep:
        out = out.unsqueeze(d + 1) if dim is not None else out.reshape((-1,) + (1,) * A.dim())
    return out if qt.dim() else out[0]


def _bind(args, kwargs):
    try:
        return _sig(*args, **kwargs)
    except TypeError:
        return False
