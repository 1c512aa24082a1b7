"""softmax and log_softmax (softmin is softmax of -A) along any dim::

    softmax(A, d).to_dense() == softmax(A.to_dense(), d)

* along a dense dim: the op on the values and on the fill (pattern kept);
* along a sparse dim ``d``: per slice (the elements sharing the other coordinates), with ``m`` the
  slice max and ``n`` its unspecified count, ``Z = sum exp(x - m) + n exp(f - m)``; stored values
  become ``exp(x - m) / Z`` and unspecified ones ``exp(f - m) / Z``.  With ``d`` the only sparse dim
  there is one slice: the pattern is kept and the fill becomes an array over the dense dims (the
  array fill of the worked example below).  With other sparse dims the unspecified value varies by
  slice: the result is dense by nature and returned dense.  An indefinite fill is a mask:
  unspecified elements are skipped and stay unspecified (masked softmax).

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor([[0, 3]], [[.11, .12], [.31, .32]], (4, 2), fill_value=0.)
>>> A.softmax(0).fill_value()
tensor([0.2232, 0.2220])
"""

from __future__ import annotations

import math

import torch

from sparsefill._tensor.parts import (
    check_densify_quiet,
    coalesce_of,
    coalesced_parts,
    dense_of,
    parts_to_sparse,
    rewrap,
    union_parts,
    values_at,
)
from sparsefill._autograd import functions as _autograd
from sparsefill.ops.reductions import edge_softmax as _segsoftmax
from sparsefill._autograd.functions import _values_on_pattern
from sparsefill._kernels.grouping import group_slices
from sparsefill._kernels.index import linearize
from sparsefill._kernels.reducer import REDUCERS, segment_combine, shifted_exp_sums, times
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops.registry import register

aten = torch.ops.aten


@register(aten._softmax.default, aten._log_softmax.default)
def _softmax(func, args, kwargs):
    A, dim, half_to_float = args[0], args[1], args[2]
    if A.dim() == 0:
        return func(dense_of(A), dim, half_to_float)
    # torch's errors, on one element per dim (a meta tensor runs log_softmax's Python meta kernel,
    # whose first call imports torch._dynamo: 0.5-1 s)
    try:
        func(torch.zeros((1,) * A.dim(), dtype=A.dtype, device=A.device), dim, half_to_float)
    except Exception:
        if A.numel():
            raise
        # no element: dense's result (torch reads no dtype there: an integer softmax of nothing is
        # empty)
        return func(torch.empty(A.shape, dtype=A.dtype, device=A.device), dim, half_to_float)
    dim, sd, log = dim % A.dim(), A.dim() - A.dense_dim(), func is aten._log_softmax.default
    # a masked tensor along a sparse dim: the edge softmax (pattern kept)
    if _segsoftmax.applies(A, dim):
        return rewrap(A, values=_segsoftmax.softmax_values(A, dim, log), known_zero=False)
    B = A if A._coalesced else coalesce_of(A)
    idx, vals = coalesced_parts(B)
    if dim >= sd:  # along a dense dim
        fill = (
            B._fill
            if B._indefinite
            else func(B._fill.expand(B._dense_shape), dim - sd, half_to_float)
        )
        return parts_to_sparse(
            idx,
            func(vals, dim - sd + 1, half_to_float),
            A.shape,
            fill,
            indefinite=B._indefinite,
            layout=B._sf_layout,
            coalesced=True,
        )
    seg, out_idx, n = group_slices(idx, B._sparse_shape, [dim])
    S = out_idx.shape[1]
    f = None if B._indefinite else B._fill.expand(B._dense_shape)
    kw = {} if f is None else dict(fill=f, n_fill=n)
    m = REDUCERS["amax"](vals, seg, S, **kw)
    shifted, e, Z = shifted_exp_sums(vals, seg, S, m, **kw)
    out = shifted - torch.log(Z)[seg] if log else e / Z[seg]
    if f is None:
        return parts_to_sparse(
            idx,
            out,
            A.shape,
            out.new_empty(0),
            indefinite=True,
            layout=B._sf_layout,
            coalesced=True,
        )
    slice_fill = (f - m - torch.log(Z)) if log else torch.exp(f - m) / Z  # (S, *D)
    N = A.shape[dim]
    one = func(f[None], 0, half_to_float)[0]  # a slice of N fills only: 1 / N (log: -log N), or NaN
    empty = one if not N else one - math.log(N) if log else one / N
    if sd == 1:  # one slice: the fill is an array over the dense dims
        one_slice = (
            slice_fill[0]
            if S
            else empty
            if isinstance(S, int)
            else torch.cat([slice_fill, empty[None]])[0]
        )
        return parts_to_sparse(idx, out, A.shape, one_slice, layout=B._sf_layout, coalesced=True)
    # the unspecified value varies by slice: dense by nature
    kept = [d for d in range(A.dim()) if d != dim]
    P = empty.expand(tuple(A.shape[d] for d in kept)).clone()
    P[tuple(out_idx)] = slice_fill.to(P.dtype)  # (no slice specified: nothing written)
    dense = P.unsqueeze(dim).expand(A.shape).clone()
    dense[tuple(idx)] = out.to(dense.dtype)
    return dense


@register(aten._safe_softmax.default)
def _safe_softmax(func, args, kwargs):
    """``_safe_softmax(A, dim, dtype)`` (the softmax of torch's attention math path): the softmax,
    0 on the slices whose elements are all ``-inf`` (where the softmax is NaN), from native ops."""
    A, dim = args[0], args[1]
    dtype = args[2] if len(args) > 2 else kwargs.get("dtype")
    out = torch.softmax(A, dim, dtype=dtype)
    masked = torch.all(A.eq(float("-inf")), dim, keepdim=True)
    return torch.where(masked, torch.zeros((), dtype=out.dtype, device=out.device), out)


@register(aten._sparse_softmax.default, aten._sparse_log_softmax.default)
def _sparse_softmax(func, args, kwargs):
    """``torch.sparse.softmax(A, d) == torch.softmax(A.to_dense(), d)`` (log_softmax alike).
    torch's rule for a native tensor, unspecified elements weigh nothing, is a fill of ``-inf``; an
    indefinite fill skips them and keeps them unspecified (masked softmax)."""
    log = func is aten._sparse_log_softmax.default
    return _softmax(aten._log_softmax.default if log else aten._softmax.default, args[:3], {})


@register(
    aten._sparse_softmax_backward_data.default, aten._sparse_log_softmax_backward_data.default
)
def _sparse_softmax_backward(func, args, kwargs):
    """The gradient of :func:`_sparse_softmax`: the dense softmax's (``_softmax_backward_data``)."""
    grad, out, dim, A = args[:4]
    log = func is aten._sparse_log_softmax_backward_data.default
    return (aten._log_softmax_backward_data if log else aten._softmax_backward_data).default(
        grad, out, dim, A.dtype
    )


# ---------------------------------------------------------------------- backward: native on the
# pattern
@register(aten._softmax_backward_data.default, aten._log_softmax_backward_data.default)
def _softmax_backward(func, args, kwargs):
    """The gradient of softmax (``y``: its output, ``g``: the upstream gradient), per slice along
    ``dim``::

        softmax:      grad = y * (g - sum_dim(g * y))   log_softmax:  grad = g - exp(y) * sum_dim(g)

    on ``y``'s pattern (united with ``g``'s); along a sparse dim each slice's sum adds its ``n``
    unspecified elements in closed form (``n * g_fill * y_fill``), and the unspecified elements get
    ``y_fill * (g_fill - sum)``: one slice (``d`` the only sparse dim) keeps the pattern with that
    fill. An indefinite ``y`` is masked (its slices hold only its stored elements) and so is its
    gradient; an indefinite ``g`` is 0 at its masked-out elements (nothing read them).  Dense by
    nature otherwise (a dense ``y``, or a dense ``g`` beside a defined fill): computed densely,
    quietly.

    >>> import torch, sparsefill
    >>> v = torch.tensor([1., 2., 3.], requires_grad=True)
    >>> A = sparsefill.sparse_coo_tensor(
    ...     [[0, 0, 1], [0, 2, 1]], v, (2, 3), fill_value=sparsefill.indefinite
    ... )
    >>> torch.softmax(A, 1).values()[0].backward()  # row 0 holds two elements: y0 (1 - y0), -y0 y1
    >>> v.grad
    tensor([ 0.1966, -0.1966,  0.0000])
    """
    g, y, dim, dtype = args[:4]
    log = func is aten._log_softmax_backward_data.default
    edge = _edge_softmax_grad(g, y, dim, log)
    if edge is not None:
        return edge if edge.dtype == dtype else edge.to(dtype)
    parts = _backward_parts(g, y, dim)
    if parts is None:  # dense by nature
        return func(*[_dense_grad_operand(t) for t in (g, y)], dim, dtype)
    idx, gv, yv, gf, yf, own = parts
    d, sd = dim % y.dim(), y.dim() - y.dense_dim()
    if d >= sd:  # along a dense dim: every stored slice and the fill on their own
        vals = func(gv, yv, d - sd + 1, dtype)
        fill = None if yf is None else func(gf[None], yf[None], d - sd + 1, dtype)[0]
    else:
        seg, _, n = group_slices(idx, y._sparse_shape, [d])
        t, tf = (gv, gf) if log else (gv * yv, None if yf is None else gf * yf)
        s = segment_combine(t, seg, n.numel(), "sum")
        # one slice (sd == 1, else dense by nature): its n unspecified elements in closed form
        if yf is not None:
            s = s[0] + times(tf, n[0], tf) if n.numel() else times(tf, y.shape[d], tf)
        at = s[seg] if yf is None else s  # each stored element's slice sum
        vals = gv - torch.exp(yv) * at if log else yv * (gv - at)
        fill = None if yf is None else gf - torch.exp(yf) * s if log else yf * (gf - s)
    fill, vals = vals.new_empty(0) if fill is None else fill.to(dtype), vals.to(dtype)
    if own:  # on y's own (coalesced) storage: its index tensors serve
        return rewrap(
            y,
            values=vals.reshape(y._vals.shape),
            fill=fill,
            indefinite=yf is None,
            known_zero=False,
        )
    return parts_to_sparse(
        idx, vals, y.shape, fill, indefinite=yf is None, layout=y._sf_layout, coalesced=True
    )


def _edge_softmax_grad(g, y, dim, log):
    """The gradient for an indefinite ``y`` along a sparse dim
    (:mod:`sparsefill.ops.reductions.edge_softmax`) on ``y``'s own pattern and index tensors, or
    None where that does not apply."""
    if not isinstance(y, SparseTensor) or y.dim() == 0 or not _segsoftmax.applies(y, dim % y.dim()):
        return None
    if isinstance(g, SparseTensor) and g.dense_dim() != y.dense_dim() or g.shape != y.shape:
        return None
    gv = _autograd.grad_parts(g, y)[0]  # g's values on y's pattern (its masked-out elements read 0)
    vals = _segsoftmax.softmax_grad_values(gv, y._vals, y, dim % y.dim(), log)
    return rewrap(y, values=vals, known_zero=False)


def _backward_parts(g, y, dim):
    """``(indices, g values, y values, g fill, y fill, own)`` on ``y``'s pattern united with ``g``'s
    (fills None for an indefinite ``y``; ``own``: the indices are ``y``'s stored elements in its
    storage order), or None when the gradient is dense by nature."""
    if not isinstance(y, SparseTensor) or y.dim() == 0:
        return None
    d, sd = dim % y.dim(), y.dim() - y.dense_dim()
    if not y._indefinite and (not isinstance(g, SparseTensor) or d < sd and sd > 1):
        return None  # the unspecified elements' gradient varies by slice (or by g's dense values)
    if isinstance(g, SparseTensor):
        if g.dense_dim() != y.dense_dim():
            return None
        g0 = (
            rewrap(g, fill=g._vals.new_zeros(()), indefinite=False, known_zero=True)
            if g._indefinite
            else g
        )
        same = _values_on_pattern(g0, y)  # g stores exactly y's elements (the usual case): no merge
        if same is not None:
            idx, yv = y._coo_parts()
            gv = same.reshape(yv.shape)
        else:
            idx, (yv, gv) = union_parts([y, g0])
        fills = (
            (None, None)
            if y._indefinite
            else (g0._fill.expand(y._dense_shape), y._fill.expand(y._dense_shape))
        )
        return (idx, gv, yv) + fills + (same is not None,)
    idx, yv = coalesced_parts(y)
    return idx, values_at(g, linearize(idx, y._sparse_shape), sd), yv, None, None, y._coalesced


def _dense_grad_operand(t):
    if not isinstance(t, SparseTensor):
        return t
    check_densify_quiet(t, "the softmax gradient (dense by nature)")
    return dense_of(t, t._vals.new_zeros(()) if t._indefinite else None)
