"""The backward of ``max``/``min`` with a dim (values and indices), as sparse as their forward: the
gradient goes to the element each output position selected (torch's
``value_selecting_reduction_backward``)::

    (Y, I) = max(A, dim)        grad_A[..., i, ...] = G[..., ...] where I[..., ...] == i, else 0

With ``dim`` a sparse dim (:func:`select_grad`) a stored element gets ``G`` where it was selected;
over a dense dim (:func:`select_dense_grad`) ``G`` is scattered to the selected position of each
stored slice.  The unspecified elements get what the selections among them got, summed (an inf stays
inf) and divided among them: the mean as the fill, exact for what reads the gradient at the pattern
and in sum (the constructor), so it is routed only where
``linalg_autograd.pattern_grad_is_exact(A)``; an indefinite fill: 0.  ``max()`` and ``min()`` over
every dim are the reductions of ``reduction_autograd.py`` (evenly among the maxima).

>>> import torch, sparsefill
>>> v = torch.tensor([1., 4.], requires_grad=True)
>>> A = sparsefill.sparse_coo_tensor(
...     [[0, 1], [0, 1]], v, (2, 2), fill_value=2.0
... )  # dense [[1, 2], [2, 4]]
>>> A.max(1).values.sum().backward()       # row 0 selects an unspecified 2, row 1 the stored 4
>>> v.grad.tolist()
[0.0, 1.0]
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from sparsefill._kernels import index as _index
from sparsefill._autograd.functions import _pattern, refuse_vmap, sparse_inside, sum_outside
from sparsefill._tensor.parts import coalesced_parts, values_at
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops.autograd_routes import register_route
from sparsefill.ops.linalg.backward import pattern_grad_is_exact
from sparsefill.ops.reductions.backward import _FLOATS, _apply, _bind, _sig_all
from sparsefill.ops.reductions.gradients import _on_pattern, _upstream, _zero_fill

T = torch.Tensor


def select_grad(P: SparseTensor, dim: int, keepdim: bool, I, G) -> SparseTensor:
    """The gradient of ``P`` through ``(Y, I) = max(P, dim)`` (or ``min``): ``G`` at the element
    each output position selected (``I``, torch's ``value_selecting_reduction_backward``).  Exact at
    the pattern; the fill is the mean over the unspecified elements of what the selections there got
    (``G`` at the output positions that selected no stored element, summed directly: an inf stays
    inf), so it is routed only where ``pattern_grad_is_exact``; an indefinite fill: 0."""
    sd, D = P._sparse_ndim(), tuple(P._dense_shape)
    idx, V = coalesced_parts(P)
    oidx = idx.clone() if keepdim else torch.cat([idx[:dim], idx[dim + 1 :]])
    if keepdim:
        oidx[dim] = 0
    osd = sd if keepdim else sd - 1
    keys = _index.linearize(oidx, I.shape[:osd])
    G, I = _upstream(G, osd), _zero_fill(I)
    Gs, Is = values_at(G, keys, osd), values_at(I, keys, osd)
    hit = Is == idx[dim].view((-1,) + (1,) * len(D))
    zero_t = torch.zeros((), dtype=Gs.dtype)
    gv = torch.where(hit, Gs, zero_t).to(P.dtype)
    n = _index.numel(P._sparse_shape) - idx.shape[1]
    if P._indefinite or not n:
        gf, zero = gv.new_zeros(D), True
    # G where an unspecified element was selected: touched slices whose stored elements all missed,
    # the rest
    else:
        ukeys, inv = torch.unique(keys, return_inverse=True)
        taken = torch.zeros((ukeys.numel(),) + D, dtype=torch.bool, device=hit.device).index_put_(
            (inv,), hit, accumulate=True
        )
        missed = torch.where(taken, zero_t, values_at(G, ukeys, osd)).sum(0)
        if osd:
            rest = sum_outside(G, _index.unravel(ukeys, I.shape[:osd]), I.shape, D)
        else:  # one output: it selected an unspecified element iff no stored one was touched
            rest = zero_t.expand(D) if ukeys.numel() else values_at(G, keys.new_zeros(1), 0)[0]
        gf, zero = ((missed + rest).to(gv.dtype) / n).reshape(D), False
    return _on_pattern(P, idx, gv, gf, zero)


def select_dense_grad(P: SparseTensor, dim: int, keepdim: bool, I, G) -> SparseTensor:
    """The gradient of ``P`` through ``(Y, I) = max(P, dim)`` (or ``min``) over the dense dim
    ``dim``: ``G`` scattered to the selected position of each stored slice (torch's
    ``value_selecting_reduction_backward``), and for the unspecified slices, all alike (the fill's
    selection), ``G`` summed over them there: the mean as the fill (routed where
    ``pattern_grad_is_exact``); an indefinite fill: 0."""
    sd, D = P._sparse_ndim(), tuple(P._dense_shape)
    d = dim - sd
    idx, V = coalesced_parts(P)
    keys = _index.linearize(idx, P._sparse_shape)
    G, I = _upstream(G, sd), _zero_fill(I)
    Gv, Iv = values_at(G, keys, sd), values_at(I, keys, sd)
    if not keepdim:
        Gv, Iv = Gv.unsqueeze(d + 1), Iv.unsqueeze(d + 1)
    gv = torch.zeros_like(V).scatter(d + 1, Iv, Gv.to(V.dtype))
    n = _index.numel(P._sparse_shape) - idx.shape[1]
    if P._indefinite or not n:
        gf, zero = gv.new_zeros(D), True
    else:
        rest = sum_outside(G, idx, G.shape, G.shape[sd:])  # (an inf stays inf)
        If = I._fill.expand(tuple(I.shape[sd:]))
        if not keepdim:
            rest, If = rest.unsqueeze(d), If.unsqueeze(d)
        gf, zero = (
            torch.zeros(D, dtype=V.dtype, device=V.device).scatter(d, If, rest.to(V.dtype)) / n,
            False,
        )
    return _on_pattern(P, idx, gv, gf, zero)


class SparseSelect(torch.autograd.Function):
    """``(Y, I) = call(A)``: ``max``/``min`` over ``dim``; the backward is :func:`select_grad` (a
    sparse dim) or :func:`select_dense_grad` (a dense dim)."""

    @staticmethod
    def forward(A, call, dim, keepdim):
        return tuple(call(_pattern(A)))

    @staticmethod
    def setup_context(ctx, inputs, output):
        A, _, ctx.dim, ctx.keepdim = inputs
        ctx.pattern = _pattern(A)
        ctx.save_for_backward(output[1])
        ctx.mark_non_differentiable(output[1])

    vmap = staticmethod(
        lambda info, in_dims, *args: refuse_vmap("a SparseTensor max/min over a dim")
    )

    @staticmethod
    @once_differentiable
    def backward(ctx, G, _):
        G = sparse_inside(G)
        (I,) = ctx.saved_tensors
        grad = select_grad if ctx.dim < ctx.pattern._sparse_ndim() else select_dense_grad
        return grad(ctx.pattern, ctx.dim, ctx.keepdim, I, G), None, None, None


def _sig_max_dim(input, dim, keepdim=False):
    return dim, keepdim


@register_route(torch.max, T.max, torch.min, T.min)
def _route_max_min(func, args, kwargs):
    """``max()``/``min()`` as the other reductions; ``max(A, dim, keepdim)`` through
    :class:`SparseSelect` (``max(A, B)``: torch's path)."""
    if _bind(_sig_all, args, kwargs) is not False:
        return _apply(func, args, kwargs, func.__name__, None)
    b = _bind(_sig_max_dim, args, kwargs)
    A = args[0] if args else kwargs.get("input")
    if (
        not b
        or not isinstance(b[0], int)
        or isinstance(b[0], bool)
        or not isinstance(b[1], bool)
        or not (isinstance(A, SparseTensor) and A.requires_grad and A.dtype in _FLOATS and A.dim())
    ):
        return NotImplemented
    dim, keepdim = b
    if not -A.dim() <= dim < A.dim() or not pattern_grad_is_exact(A):
        return NotImplemented
    dim %= A.dim()
    Y, I = SparseSelect.apply(A, lambda P: tuple(func(P, dim, keepdim)), dim, keepdim)
    return getattr(torch.return_types, func.__name__)((Y, I))
