"""The backward of ``sort``, ``topk``, ``kthvalue``, ``mode`` and ``median``/``nanmedian`` along a
dim of a SparseTensor, as sparse as their forward: the gradient goes to the element each output
position selected (torch's ``value_selecting_reduction_backward``)::

    (Y, I) = op(A, dim)        grad_A[..., i, ...] = sum of G over the output positions with I == i

``kthvalue``/``mode``/``median`` select one element per slice: ``select_autograd``'s gradients (a
sparse dim: ``select_grad``, a dense dim: ``select_dense_grad``).  ``sort``/``topk`` over a dense
dim: the same scatter on each stored slice and on the fill's (``select_dense_grad``); over a sparse
dim (:func:`order_grad`): every output position looks its selected element up among the stored ones
(``O(out log nse)``, the output's size: no dense temporary of the input's); the positions that
selected an unspecified element give the fill their sum, divided among the unspecified elements
(the mean as the fill, exact for what reads the gradient at the pattern and in sum, so routed only
where ``linalg_autograd.pattern_grad_is_exact``).

>>> import torch, sparsefill
>>> v = torch.tensor([3., -1.], requires_grad=True)
>>> A = sparsefill.sparse_coo_tensor([[0, 2]], v, (4,), fill_value=0.)     # dense [3, 0, -1, 0]
>>> torch.topk(A, 2).values.sum().backward()      # selects 3 (stored) and the fill at 1
>>> v.grad.tolist()
[1.0, 0.0]
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from sparsefill._kernels import index as _index
from sparsefill._autograd.functions import _pattern, dense_grad, refuse_vmap, sparse_inside
from sparsefill._tensor.parts import coalesced_parts
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops.autograd_routes import register_route
from sparsefill.ops.linalg.backward import pattern_grad_is_exact
from sparsefill.ops.reductions.backward import _FLOATS, _bind, _on_pattern
from sparsefill.ops.reductions.select_backward import select_dense_grad, select_grad
from sparsefill.ops.order.masked_order import kth_pick, masked_reduced, masked_sort, mode_pick

T = torch.Tensor


def order_grad(P: SparseTensor, dim: int, I: torch.Tensor, G: torch.Tensor) -> SparseTensor:
    """The gradient of ``P`` through ``(Y, I) = sort(P, dim)`` or ``topk`` over the sparse dim
    ``dim`` (``I``, ``G`` dense, ``k`` along ``dim``): ``G`` summed at each selected stored
    element; the rest of ``G`` (unspecified elements selected) averaged over the unspecified
    elements as the fill (an indefinite fill: 0)."""
    sd, D = P._sparse_ndim(), tuple(P._dense_shape)
    idx, V = coalesced_parts(P)
    keys = _index.linearize(idx, P._sparse_shape)
    Dn = _index.numel(D)
    # every output position's selected sparse index: its own coordinates, I along dim
    out_sparse = tuple(I.shape[:sd])
    grid = _index.unravel(torch.arange(_index.numel(out_sparse), device=I.device), out_sparse)
    Ir = I.reshape(-1, Dn)  # (output sparse positions, dense coordinates)
    Gr = G.reshape(-1, Dn).to(V.dtype)
    sel = grid[:, :, None].expand(sd, grid.shape[1], Dn).clone()
    sel[dim] = Ir
    skey = _index.linearize(sel.reshape(sd, -1), P._sparse_shape)
    at = torch.searchsorted(keys, skey).clamp(max=max(keys.numel() - 1, 0))
    hit = keys[at] == skey if keys.numel() else torch.zeros_like(skey, dtype=torch.bool)
    c = torch.arange(Dn, device=I.device).repeat(grid.shape[1])
    g = Gr.reshape(-1)
    gv = torch.zeros(V.shape[0] * Dn, dtype=V.dtype, device=V.device)
    gv.index_add_(0, (at * Dn + c)[hit], g[hit])
    n = _index.numel(P._sparse_shape) - idx.shape[1]
    if P._indefinite or not n:
        return _on_pattern(P, idx, gv.reshape(V.shape), gv.new_zeros(D), True)
    rest = torch.zeros(Dn, dtype=V.dtype, device=V.device).index_add_(0, c[~hit], g[~hit])
    return _on_pattern(P, idx, gv.reshape(V.shape), (rest / n).reshape(D), False)


class Take(torch.autograd.Function):
    """``values.reshape(-1)[sel]`` of ``A``'s coalesced stored values (an indefinite fill: the
    masked order statistics select stored elements only); the gradient is ``G`` summed at the
    selected stored scalars, the fill's 0."""

    @staticmethod
    def forward(A, sel):
        return coalesced_parts(_pattern(A))[1].reshape(-1)[sel]

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.pattern = _pattern(inputs[0])
        ctx.save_for_backward(inputs[1])

    vmap = staticmethod(lambda info, in_dims, *args: refuse_vmap("a SparseTensor masked sort"))

    @staticmethod
    @once_differentiable
    def backward(ctx, G):
        (sel,) = ctx.saved_tensors
        P = ctx.pattern
        idx, V = coalesced_parts(P)
        gv = torch.zeros(V.numel(), dtype=V.dtype, device=V.device)
        gv.index_add_(0, sel, G.reshape(-1).to(V.dtype))
        return _on_pattern(P, idx, gv.reshape(V.shape), gv.new_zeros(P._dense_shape), True), None


class SparseOrder(torch.autograd.Function):
    """``(Y, I) = call(A)``: sort, topk, kthvalue or mode over ``dim``; the backward is
    :func:`order_grad` (sort/topk over a sparse dim), ``select_grad`` (kthvalue/mode over a sparse
    dim) or ``select_dense_grad`` (a dense dim)."""

    @staticmethod
    def forward(A, call, dim, keepdim, many):
        return tuple(call(_pattern(A)))

    @staticmethod
    def setup_context(ctx, inputs, output):
        A, _, ctx.dim, ctx.keepdim, ctx.many = inputs
        ctx.pattern = _pattern(A)
        ctx.save_for_backward(output[1])
        ctx.mark_non_differentiable(output[1])

    vmap = staticmethod(lambda info, in_dims, *args: refuse_vmap("a SparseTensor sort/topk"))

    @staticmethod
    @once_differentiable
    def backward(ctx, G, _):
        G = sparse_inside(G)
        (I,) = ctx.saved_tensors
        P, dim = ctx.pattern, ctx.dim
        if dim >= P._sparse_ndim():
            grad = select_dense_grad(P, dim, ctx.keepdim, I, G)
        elif ctx.many:
            G = dense_grad(G) if isinstance(G, SparseTensor) else G
            I = dense_grad(I) if isinstance(I, SparseTensor) else I
            grad = order_grad(P, dim, I, G)
        else:
            grad = select_grad(P, dim, ctx.keepdim, I, G)
        return grad, None, None, None, None


def _masked(name, A, b):
    """The masked forms (an indefinite fill, a sparse dim), their values differentiable through
    :class:`Take`."""
    dim = b["dim"]
    if name == "sort":
        out = masked_sort(A, dim, b["descending"], grad=True)
    elif name == "topk":
        out = masked_sort(A, dim, b["largest"], b["k"], grad=True)
    else:
        pick = kth_pick(b["k"]) if name == "kthvalue" else mode_pick
        out = masked_reduced(A, dim, b["keepdim"], pick, grad=True)
    return getattr(torch.return_types, name)(out)


def _sig_sort(input, dim=-1, descending=False, *, stable=False):
    return dict(dim=dim, descending=descending, stable=stable)


def _sig_topk(input, k, dim=-1, largest=True, sorted=True):
    return dict(k=k, dim=dim, largest=largest, sorted=sorted)


def _sig_kthvalue(input, k, dim=-1, keepdim=False):
    return dict(k=k, dim=dim, keepdim=keepdim)


def _sig_mode(input, dim=-1, keepdim=False):
    return dict(dim=dim, keepdim=keepdim)


def _sig_median(input, dim, keepdim=False):
    return dict(dim=dim, keepdim=keepdim)


_SIGS = {
    "sort": _sig_sort,
    "topk": _sig_topk,
    "kthvalue": _sig_kthvalue,
    "mode": _sig_mode,
    "median": _sig_median,
    "nanmedian": _sig_median,
}


@register_route(torch.sort, T.sort, torch.topk, T.topk, torch.kthvalue, T.kthvalue)
@register_route(torch.mode, T.mode, torch.median, T.median, torch.nanmedian, T.nanmedian)
def _route_order(func, args, kwargs):
    """``sort``/``topk``/``kthvalue``/``mode``/``median(dim)`` of a SparseTensor that needs a
    gradient, through :class:`SparseOrder` (other calls, ``out=``, a median over all elements or
    of a masked tensor: torch's path)."""
    name = func.__name__
    b = _bind(_SIGS[name], args, kwargs)
    A = args[0] if args else kwargs.get("input")
    if (
        not b
        or not isinstance(b["dim"], int)
        or not (isinstance(A, SparseTensor) and A.requires_grad and A.dtype in _FLOATS and A.dim())
    ):
        return NotImplemented
    if not -A.dim() <= b["dim"] < A.dim() or not pattern_grad_is_exact(A):
        return NotImplemented
    dim = b["dim"] % A.dim()
    b["dim"] = dim
    if A._indefinite and dim < A._sparse_ndim() and A.numel():
        return NotImplemented if name.endswith("median") else _masked(name, A, b)
    op = getattr(torch, name)
    many = name in ("sort", "topk")
    keep = b.get("keepdim", True)
    Y, I = SparseOrder.apply(A, lambda P: tuple(op(P, **b)), dim, keep, many)
    return getattr(torch.return_types, name)((Y, I))
