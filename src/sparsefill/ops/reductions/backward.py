"""The backward of the reductions, as sparse as their forward.

``sum mean prod amax amin max min logsumexp var std var_mean std_mean norm linalg.vector_norm nansum
nanmean`` of a SparseTensor ``A`` that needs a gradient, over every sparse dim (and any of its dense
dims), run through :class:`SparseReduce`.  Every unspecified element of ``A`` in one dense slice has
the same value (the fill), so torch's derivative formula gives them all the same gradient: the
gradient of ``A`` is a SparseTensor with ``A``'s pattern, exact everywhere::

    grad_A at a stored element x = d(x)        grad_A's fill = d(fill)
    d(x) = torch's formula at x, with y = result, G = upstream gradient, broadcast back over the
           reduced dims, and the slice statistics it needs (a count of maxima, the mean) in closed
           form over the count m of unspecified elements:  stat = stat(stored) + m * stat(fill)

e.g. ``sum``: ``d(x) = G``; ``mean``: ``G / count``; ``amax``: ``G / (number of maxima)`` at the
maxima (torch's rule: evenly among the maxima; a fill that is the maximum counts ``m`` times);
``prod``: ``G`` times the product of the others (exclusive products of the stored values times
``fill ** m``).  torch's formula would instead expand the dense ``G`` to ``A``'s full shape before
any handler sees it (hence an autograd route: docs/architecture.md).  An indefinite fill skips the
unspecified elements (masked semantics, as the forward): ``m = 0`` and the gradient's fill is 0.

A reduction over some sparse dims only (the rest kept) gives the unspecified elements gradients that
vary slice by slice: the gradient is then exact at the pattern with the *mean* over the unspecified
elements as its fill (:func:`partial_grad`), which is exact for what reads it only there and in sum,
the constructor; so it is routed only where ``linalg_autograd.pattern_grad_is_exact(A)`` (``A``
built by a constructor, through coalesce/layout changes/transposes or element-wise ops with the same
derivative at every unspecified element, or an indefinite fill).

``max``/``min`` with a dim (values and indices, the gradient to the selected element) are in
``select_autograd.py``.  A reduction over dense dims only (``A.amax(-1)`` of a hybrid):
:func:`dense_dims_grad`, routed as the partial ones (which may reduce dense dims too).  Not routed
(torch's formulas, as before): those partial reductions of another ``A``, ``prod`` over a dense dim,
named dims, complex dtypes, ``out=``.

This module holds the autograd Function (:class:`SparseReduce`) and the routes; the gradients it
returns are computed in ``gradients.py``.

>>> import torch, sparsefill
>>> v, f = torch.tensor([1., 4.], requires_grad=True), torch.tensor(4., requires_grad=True)
>>> A = sparsefill.sparse_coo_tensor([[0, 2]], v, (5,), fill_value=f)
>>> A.amax().backward()                 # dense [1, 4, 4, 4, 4]: four maxima, 1/4 each
>>> v.grad.tolist(), f.grad.item()      # the fill's gradient: its 3 elements' sum
([0.0, 0.25], 0.75)
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from sparsefill._autograd.functions import _pattern, dense_grad, refuse_vmap, sparse_inside
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops.autograd_routes import register_route
from sparsefill.ops.linalg.backward import pattern_grad_is_exact
from sparsefill.ops.reductions.variance import welford_mean
from sparsefill.ops.reductions.gradients import (
    _on_pattern as _on_pattern,
    _upstream as _upstream,
    dense_dims_grad,
    partial_grad,
    reduction_grad,
)

T = torch.Tensor
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class SparseReduce(torch.autograd.Function):
    """``Y = call(A)``: the reduction ``name`` over ``dims`` (``opt``: its parameter); the backward
    is :func:`reduction_grad`."""

    @staticmethod
    def forward(A, call, name, dims, opt):
        return call(_pattern(A))

    @staticmethod
    def setup_context(ctx, inputs, output):
        A, _, ctx.name, ctx.dims, ctx.opt = inputs
        ctx.pattern = _pattern(A)
        ctx.save_for_backward(output)

    vmap = staticmethod(lambda info, in_dims, *args: refuse_vmap("a SparseTensor reduction"))

    @staticmethod
    @once_differentiable
    def backward(ctx, G):
        (Y,), G = ctx.saved_tensors, sparse_inside(G)
        P = ctx.pattern
        if ctx.dims and ctx.dims[0] >= P._sparse_ndim():  # dense dims only
            return dense_dims_grad(P, ctx.name, ctx.dims, ctx.opt, Y, G), None, None, None, None
        if not set(range(P._sparse_ndim())) <= set(ctx.dims):
            return partial_grad(P, ctx.name, ctx.dims, ctx.opt, Y, G), None, None, None, None
        if isinstance(G, SparseTensor):
            G = dense_grad(G)
        return (
            reduction_grad(ctx.pattern, ctx.name, ctx.dims, ctx.opt, Y, G),
            None,
            None,
            None,
            None,
        )


# ---------------------------------------------------------------------- routes
def _dims(A, dim):
    """``dim`` (None, an int or a sequence of ints) as a sorted list of A's dims; None for named
    dims."""
    nd = A.dim()
    if dim is None:
        return list(range(nd))
    ds = [dim] if isinstance(dim, int) else list(dim)
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in ds) or not ds:
        return None
    if nd == 0:
        return [] if all(d in (0, -1) for d in ds) else None
    if not all(-nd <= d < nd for d in ds):
        return None  # torch's IndexError from the forward
    return sorted({d % nd for d in ds})


def _apply(func, args, kwargs, name, dim, opt=None):
    """``func(*args, **kwargs)`` through :class:`SparseReduce` when ``args[0]`` is a SparseTensor
    needing a gradient and ``dim`` covers every sparse dim; else ``NotImplemented``."""
    A = args[0] if args else kwargs.get("input")
    if not (isinstance(A, SparseTensor) and A.requires_grad and A.dtype in _FLOATS):
        return NotImplemented
    dims, sd = _dims(A, dim), A._sparse_ndim()
    if dims is None or name == "prod" and A.dense_dim() and any(d >= sd for d in dims):
        return NotImplemented
    # dense dims only (the gradient's fill: a mean, read as the constructor does)
    if dims and dims[0] >= sd and sd:
        if name in ("prod", "max", "min") or not pattern_grad_is_exact(A):
            return NotImplemented
    # some sparse dims kept (dense dims too): as the constructor reads
    elif not set(range(sd)) <= set(dims):
        if not dims or name in ("max", "min") or not pattern_grad_is_exact(A):
            return NotImplemented

    def call(P):
        return func(
            *(P if a is A else a for a in args),
            **{k: P if v is A else v for k, v in kwargs.items()},
        )

    return SparseReduce.apply(A, call, name, tuple(dims), opt)


def _bind(sig, args, kwargs):
    """``sig``'s reading of the call, or False (another overload, or torch's own error from the
    forward)."""
    try:
        return sig(*args, **kwargs)
    except TypeError:
        return False


def _sig_dim(input, dim=None, keepdim=False, *, dtype=None):
    return dim


def _sig_all(input):
    return None


def _sig_amax(input, dim=(), keepdim=False):
    return None if isinstance(dim, (tuple, list)) and not dim else dim


def _sig_logsumexp(input, dim, keepdim=False):
    return dim


def _sig_prod(input, dim=None, keepdim=False, *, dtype=None):
    return dim if dim is None or isinstance(dim, int) else False


def _route_simple(name, sig):
    def route(func, args, kwargs):
        dim = _bind(sig, args, kwargs)
        return NotImplemented if dim is False else _apply(func, args, kwargs, name, dim)

    return route


for _name, _sig, _funcs in (
    ("sum", _sig_dim, (torch.sum, T.sum)),
    ("mean", _sig_dim, (torch.mean, T.mean)),
    ("nansum", _sig_dim, (torch.nansum, T.nansum)),
    ("nanmean", _sig_dim, (torch.nanmean, T.nanmean)),
    ("amax", _sig_amax, (torch.amax, T.amax)),
    ("amin", _sig_amax, (torch.amin, T.amin)),
    ("logsumexp", _sig_logsumexp, (torch.logsumexp, T.logsumexp)),
    ("prod", _sig_prod, (torch.prod, T.prod)),
):
    register_route(*_funcs)(_route_simple(_name, _sig))


def _sig_var(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(dim, bool):  # var(input, unbiased)
        dim, unbiased = None, dim
    if unbiased is not None and correction is not None:
        return False
    return dim, (1 if unbiased is None else int(unbiased)) if correction is None else correction


@register_route(torch.var, T.var, torch.std, T.std)
def _route_var(func, args, kwargs):
    """``var``/``std`` with ``unbiased`` or ``correction`` (default 1)."""
    b = _bind(_sig_var, args, kwargs)
    if not b or not isinstance(b[1], (int, float)):
        return NotImplemented
    dim, correction = b
    return _apply(func, args, kwargs, func.__name__, dim, (correction, dim is None))


def _sig_keepdim(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    return keepdim


@register_route(torch.var_mean, torch.std_mean)
def _route_var_mean(func, args, kwargs):
    """``var_mean``/``std_mean`` as the routed ``(var or std, mean)`` of the same arguments: their
    backwards are as sparse as theirs (torch's formula forms ``A - A.mean(dim, True)``, which stores
    every element of each slice holding a stored one: O(nse * slice length))."""
    b, keepdim = _bind(_sig_var, args, kwargs), _bind(_sig_keepdim, args, kwargs)
    if not b or not isinstance(b[1], (int, float)) or not isinstance(keepdim, bool):
        return NotImplemented
    (dim, correction), A = b, args[0] if args else kwargs.get("input")
    first = torch.var if func is torch.var_mean else torch.std
    s = _apply(
        first,
        (A,),
        {"dim": dim, "correction": correction, "keepdim": keepdim},
        first.__name__,
        dim,
        (correction, dim is None),
    )
    m = _apply(torch.mean, (A,), {"dim": dim, "keepdim": keepdim}, "mean", dim)
    if s is NotImplemented or m is NotImplemented:
        return NotImplemented
    dims = list(range(A.dim())) if dim is None else [dim] if isinstance(dim, int) else list(dim)
    return s, welford_mean(A, m, dims, keepdim)


def _sig_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    return ord, dim


def _sig_norm(input, p="fro", dim=None, keepdim=False, out=None, dtype=None):
    if out is not None or p == "fro" and not (dim is None or isinstance(dim, int) or len(dim) <= 2):
        return False
    return (2 if p == "fro" else p), dim


@register_route(torch.linalg.vector_norm, torch.norm, T.norm)
def _route_norm(func, args, kwargs):
    """``vector_norm(A, ord, dim)``; ``torch.norm`` with ``p`` a number or ``'fro'`` (a vector
    2-norm)."""
    b = _bind(_sig_vector_norm if func is torch.linalg.vector_norm else _sig_norm, args, kwargs)
    if not b or isinstance(b[0], (str, bool)) or not isinstance(b[0], (int, float)):
        return NotImplemented
    return _apply(func, args, kwargs, "norm", b[1], float(b[0]))


# (max/min with a dim: registers its route with the helpers above)
from sparsefill.ops.reductions import select_backward as select_autograd  # noqa: E402,F401
