"""Masked normalizations along one dim: ``softmax log_softmax softmin normalize cumsum cumprod``.

Same signatures and, on strided inputs, the same results as ``torch.masked.<op>``.  On a sparse
input the statistics of each slice along ``dim`` (max and sum of exponentials, norm, prefix
sums) come from the segment kernels of ``_engine`` over the union pattern ``P`` of input and mask
(``_canon``), and every masked-in element of ``P`` gets its value, e.g. for softmax::

    out[p] = exp(x[p] - max_slice) / sum_{q in slice, mask[q]} exp(x[q] - max_slice)

The result has the input's pattern ``P`` and layout.  Masked-out elements (RFC: "no guaranteed
value") read as the op's value for a masked-out element of a partly masked-in slice: 0 for
softmax, softmin and normalize, -inf for log_softmax, 0 for cumsum and 1 for cumprod; a fully
masked-out slice reads the same (torch.masked gives NaN for softmax/log_softmax/softmin there).
An input with indefinite fill gives a result with the same pattern and indefinite fill.

When unspecified elements are masked in along a sparse ``dim`` (``mask=None`` on a defined fill)
and the op does not map them to the masked-out value (softmax of a finite fill, any cumsum), the
result is dense by nature: it is computed on the dense equivalent (no DensifyWarning; the densify
policy's byte limit applies) and returned in the input's layout.
"""

from __future__ import annotations

import math

import torch

from . import _engine as E
from ._apply import Result, dense_fallback, dense_mask, run
from ._canon import as_sparse, is_sparse

__all__ = ["softmax", "log_softmax", "softmin", "normalize", "cumsum", "cumprod"]


class _DenseByNature(Exception):
    pass


def _same(a, b):
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


def _normalization(input, mask, dim, per_element, c_out, cast, dense_op, zero_absorbs=False):
    """``per_element(sl, v, seg, F, n, F0, n0) -> (out values (nv,), fill outputs (nseg, Pr), (Pk, Pr))``."""
    A = as_sparse(input)
    dims = E.canonical_dims(dim, A.dim())[:1] if A.dim() else ()

    def compute(X):
        sl = E.Slices(X, dims)
        u, f = (X.u, X.fill) if cast is None else (X.u.to(cast), X.fill.to(cast))
        ms = sl.scalars(X.m)
        v, seg, lengths = sl.masked_in(u)
        every = v.numel() == ms.numel()  # the usual case (mask = the input's pattern): no gathers
        (F, n), (F0, n0) = sl.fill_classes(f)
        out_v, g, g0 = per_element(sl, v, seg, F, n, F0, n0, lengths)
        c = torch.full((), c_out, dtype=out_v.dtype, device=out_v.device)
        if every:
            vals = sl.unscalars(out_v.reshape(ms.shape))
        else:
            vals = sl.unscalars(c.expand(ms.shape).index_put(ms.nonzero(as_tuple=True), out_v))
        if X.A._indefinite:
            fill = vals.new_empty(0)
        elif sl.red_s and X.mfill:  # fill elements along a sparse dim: one value per slice
            if not (_same(g[n > 0], c) and _same(g0[n0 > 0], c)):
                raise _DenseByNature
            fill = c
        elif X.mfill:  # a dense dim: every unspecified row is the same slice
            fill = sl.unscalars(g0[None])[0]
        else:
            fill = c
        like = X.A if X.same_pattern and X.A._coalesced else None
        return Result(idx=X.indices() if like is None else None, vals=vals, fill=fill, shape=tuple(X.A.shape),
                      layout=X.A._sf_layout, indefinite=X.A._indefinite, like=like)

    ref = _dense_ref(dense_op, mask)
    try:
        return run(A, mask, compute, ref, zero_absorbs)
    except _DenseByNature:
        return dense_fallback(A, mask, dense_op)


def _dense_ref(dense_op, mask):
    def f(x):
        return dense_op(x, None if mask is None else dense_mask(mask, x))
    return f


def _softmax_parts(sign, log):
    def stats(v, seg, nseg, F, n, lengths=None):
        M = E.seg_extreme(v, seg, nseg, F, n, "amax")
        xf = F - M[:, None]
        ef = torch.where(n > 0, torch.exp(xf) * n.to(F.dtype), torch.zeros((), dtype=F.dtype, device=F.device)).sum(1)
        if v.requires_grad:
            x = v - E.seg_bcast(M, seg, lengths)
            e = torch.exp(x)
        else:  # in place: two element-sized temporaries instead of four
            x = e = E.seg_bcast(M, seg, lengths)
            torch.sub(v, e, out=e)
            if not log:
                e.exp_()
        Z = E.seg_add(torch.exp(x) if log else e, seg, nseg, lengths) + ef
        if log:
            lz = E.seg_bcast(torch.log(Z), seg, lengths)
            return (x - lz if v.requires_grad else x.sub_(lz)), xf - torch.log(Z)[:, None]
        z = E.seg_bcast(Z, seg, lengths)
        return (e / z if v.requires_grad else e.div_(z)), torch.exp(xf) / Z[:, None]

    def per_element(sl, v, seg, F, n, F0, n0, lengths=None):
        if sign < 0:
            v, F, F0 = -v, -F, -F0
        ov, g = stats(v, seg, sl.nseg, F, n, lengths)
        _, g0 = stats(v[:0], seg[:0], sl.Pk, F0, n0)
        return ov, g, g0
    return per_element


def _softmax_like(name, sign, log, c_out):
    def op(input, dim, *, dtype=None, mask=None):
        if not is_sparse(input):
            return getattr(torch.masked, name)(input, dim, dtype=dtype, mask=dense_mask(mask, input))
        cast = dtype or (input.dtype if input.dtype.is_floating_point else torch.get_default_dtype())

        def dense_op(x, m):
            return getattr(torch.masked, name)(x, dim, dtype=dtype, mask=m)
        return _normalization(input, mask, dim, _softmax_parts(sign, log), c_out, cast, dense_op)
    op.__name__ = op.__qualname__ = name
    return op


softmax = _softmax_like("softmax", 1.0, False, 0.0)
softmax.__doc__ = ("Masked softmax along ``dim``: ``softmax(input.masked_fill(~mask, -inf), dim)``; masked-out "
                   "elements of a sparse result read 0.")
log_softmax = _softmax_like("log_softmax", 1.0, True, -math.inf)
log_softmax.__doc__ = ("Masked log_softmax along ``dim``: ``log_softmax(input.masked_fill(~mask, -inf), dim)``; "
                       "masked-out elements of a sparse result read -inf.")
softmin = _softmax_like("softmin", -1.0, False, 0.0)
softmin.__doc__ = ("Masked softmin along ``dim``: ``softmin(input.masked_fill(~mask, +inf), dim)``; masked-out "
                   "elements of a sparse result read 0.")


def normalize(input, ord, dim, *, eps=1e-12, dtype=None, mask=None):
    """Masked normalize: ``where(mask, input, 0) / max(masked.norm(input, ord, dim, keepdim=True), eps)``;
    masked-out elements read 0."""
    if not is_sparse(input):
        return torch.masked.normalize(input, ord, dim, eps=eps, dtype=dtype, mask=dense_mask(mask, input))
    p = float(ord)
    if p < 0 and not math.isinf(p):
        raise ValueError(f"masked normalize of a sparse input: ord={ord} (negative, finite) is not supported")
    cast = dtype or input.dtype

    def per_element(sl, v, seg, F, n, F0, n0, lengths=None):
        d = E.seg_norm(v, seg, sl.nseg, F, n, p, lengths).clamp_min(eps)
        d0 = E.seg_norm(v[:0], seg[:0], sl.Pk, F0, n0, p).clamp_min(eps)
        return v / E.seg_bcast(d, seg, lengths), F / d[:, None], F0 / d0[:, None]

    def dense_op(x, m):
        return torch.masked.normalize(x, ord, dim, eps=eps, dtype=dtype, mask=m)
    return _normalization(input, mask, dim, per_element, 0.0, cast, dense_op, zero_absorbs=True)


def _cum(name, mode):
    ident = 0.0 if mode == "sum" else 1.0

    def op(input, dim, *, dtype=None, mask=None):
        if not is_sparse(input):
            return getattr(torch.masked, name)(input, dim, dtype=dtype, mask=dense_mask(mask, input))
        cast = dtype or input.dtype

        def per_element(sl, v, seg, F, n, F0, n0, lengths=None):
            if sl.red_s and (n > 0).any():
                raise _DenseByNature
            out = _segmented_scan(v, seg, sl.nseg, mode)
            z = torch.full((), ident, dtype=F.dtype, device=F.device)
            g0 = torch.where(n0 > 0, F0, z)
            g0 = torch.cumsum(g0, 1) if mode == "sum" else torch.cumprod(g0, 1)
            return out, torch.where(n > 0, F, z), g0

        def dense_op(x, m):
            return getattr(torch.masked, name)(x, dim, dtype=dtype, mask=m)
        A = as_sparse(input)
        if A.dim() and E.canonical_dims(dim, A.dim())[0] < len(A._sparse_shape) and mask is None and \
                not A._indefinite:
            return dense_fallback(A, mask, dense_op)
        return _normalization(input, mask, dim, per_element, ident, cast, dense_op)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = (f"Masked {name} along ``dim``: ``torch.{name}(torch.where(mask, input, {int(ident)}), dim)``; "
                  f"masked-out elements of a sparse result read {int(ident)} (torch.masked: the running value).")
    return op


def _segmented_scan(v, seg, nseg, mode):
    """Inclusive cumulative sum/product of ``v`` within each segment, in the order of ``v``."""
    if v.numel() == 0:
        return v
    order = torch.argsort(seg, stable=True)
    s = seg[order]
    counts = torch.bincount(s, minlength=nseg)
    start = torch.cumsum(counts, 0) - counts
    rank = torch.arange(s.numel(), device=s.device) - start[s]
    width = int(counts.max())
    ident = 0 if mode == "sum" else 1
    pad = v.new_full((nseg, width), ident).index_put((s, rank), v[order])
    pad = torch.cumsum(pad, 1) if mode == "sum" else torch.cumprod(pad, 1)
    out = torch.empty_like(v)
    return out.index_put((order,), pad[s, rank])


cumsum = _cum("cumsum", "sum")
cumprod = _cum("cumprod", "prod")
