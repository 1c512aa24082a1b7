"""Reductions that select an element of each slice, over stored values and fills alike: argmax and
argmin (torch's tie rule: the first position), max and min along a dim with their indices, and the
lower median (``median``, ``nanmedian``; of all elements or along a dim), by the one rank rule of
:func:`_kernels.reducer.segment_median`::

    (Y, I) = max(A, dim)    Y.to_dense() == max(A.to_dense(), dim).values,  A.to_dense() at I == Y

Along a dense dim the op runs on the values and on the fill (the pattern kept); over sparse dims the
result is dense (one element per slice).  The backward: ``select_backward.py``.

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor([[0, 1], [0, 1]], [1., 4.], (2, 2), fill_value=2.)
>>> A.max(1).indices.tolist(), torch.median(A).item()
([1, 1], 2.0)
"""

from __future__ import annotations

import torch

from sparsefill._kernels import index as _index
from sparsefill._tensor.parts import coalesced_parts, parts_to_sparse
from sparsefill._kernels.grouping import group_slices
from sparsefill._kernels.reducer import (
    REDUCERS,
    first_gap,
    segment_arg,
    segment_combine,
    segment_median,
)
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops._schema import check_dtype, meta_call, meta_of
from sparsefill.ops.shape.reshape import all_sparse
from sparsefill.ops.registry import register
from sparsefill.ops.reductions.reduce import _keepdim_arg, _scalar

aten = torch.ops.aten


# ------------------------------------------------------------------ arg reductions
def _along_dense_dim(func, A, d, keep, meta):
    """``func(A, dim, keepdim)`` along dense dim ``d`` (counted from the first dense dim): the op on
    the values and on the fill, the pattern kept; one SparseTensor per output of ``func``."""
    idx, vals = coalesced_parts(A)
    # (contiguous: torch 2.13's median.dim reads a stride-0 input wrongly, median(t.expand(3), 0) ==
    # 0)
    out = [
        func(vals.contiguous(), d + 1, keep),
        func(A._fill.expand(A._dense_shape).contiguous(), d, keep),
    ]
    shapes = [m.shape for m in meta] if isinstance(meta, tuple) else [meta.shape]
    pairs = list(zip(out[0], out[1])) if isinstance(out[0], tuple) else [(out[0], out[1])]
    res = tuple(
        parts_to_sparse(idx, v, shp, f, layout=A._sf_layout, coalesced=True)
        for (v, f), shp in zip(pairs, shapes)
    )
    return res if isinstance(out[0], tuple) else res[0]


@register(aten.argmax.default, aten.argmin.default, aten.max.dim, aten.min.dim)
def _arg(func, args, kwargs):
    """argmax/argmin (torch's tie rule: the first position) and max/min along a dim with their
    indices."""
    A = args[0]
    if A.dim() == 0:
        return _scalar(func, args, kwargs)
    check_dtype(func, A, *args[1:], **kwargs)  # (argmax of bool raises)
    meta = meta_call(func, A, *args[1:], **kwargs)
    which = "amax" if func in (aten.argmax.default, aten.max.dim) else "amin"
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    keep = _keepdim_arg(args, kwargs, 2)
    if A._indefinite:
        return _arg_indefinite(
            A, dim, keep, which, meta, values=func in (aten.max.dim, aten.min.dim)
        )
    if A.dense_dim():
        sd = A.dim() - A.dense_dim()
        # along a dense dim: on the values and on the fill
        if dim is not None and dim % A.dim() >= sd:
            return _along_dense_dim(func, A, dim % A.dim() - sd, keep, meta)
        # dense dims become sparse (dense dims trail sparse ones; an array fill: its most common
        # value)
        A = all_sparse(A)
    if dim is None:  # over the flattened tensor
        idx, vals = coalesced_parts(A)
        B = SparseTensor(
            torch.sparse_coo,
            (A.numel(),),
            vals,
            A._fill,
            indices=_index.linearize(idx, A.shape)[None],
            coalesced=True,
        )
        return _arg_dim(B, 0, False, which, meta, values=False)
    return _arg_dim(
        A, dim % max(A.dim(), 1), keep, which, meta, values=func in (aten.max.dim, aten.min.dim)
    )


def _arg_indefinite(A, dim, keep, which, meta, values):
    """An indefinite fill (masked semantics, as ``torch.masked.amax``/``argmax``): the extreme over
    the stored elements of each slice and the position of its first occurrence; a slice with none
    stored is masked out (unspecified in the results, whose fill is indefinite).  ``dim=None``: the
    flat position (0-d)."""
    idx, vals = coalesced_parts(A)
    sd, D = A._sparse_ndim(), tuple(A._dense_shape)
    if dim is None:
        if vals.numel() == 0:
            raise IndexError(
                f"{which.replace('am', 'argm')}(): no specified element to select (indefinite "
                f"fill, nse 0, shape {tuple(A.shape)})"
            )
        flat = (
            _index.linearize(
                torch.cat(
                    [
                        idx.repeat_interleave(_index.numel(D), 1),
                        _index.unravel(torch.arange(_index.numel(D), device=idx.device), D).repeat(
                            1, idx.shape[1]
                        ),
                    ]
                ),
                A.shape,
            )
            if D
            else _index.linearize(idx, A.shape)
        )
        v = vals.reshape(-1)
        best = REDUCERS[which](v, torch.zeros_like(flat), 1)
        return segment_arg(v, torch.zeros_like(flat), 1, flat, best).reshape(())
    dim %= A.dim()
    out_meta = meta if not values else meta[0]
    if dim >= sd:  # along a dense dim: on each stored slice; the pattern kept
        d = dim - sd + 1
        res = (
            (torch.amax if which == "amax" else torch.amin)(vals, d, keep),
            (torch.argmax if which == "amax" else torch.argmin)(vals, d, keep),
        )
        out_idx = idx
    else:
        seg, out_idx, _ = group_slices(idx, A._sparse_shape, [dim])
        S = out_idx.shape[1]
        best = REDUCERS[which](vals, seg, S)
        res = best.to(A.dtype), segment_arg(vals, seg, S, idx[dim], best)
        if keep:
            full = out_idx.new_zeros((sd, S))
            full[[i for i in range(sd) if i != dim]] = out_idx
            out_idx = full
    # (the pattern, or a 2-d one)
    layout = A._sf_layout if dim >= sd or keep and sd == 2 else torch.sparse_coo
    empty = vals.new_empty(0)
    out = tuple(
        parts_to_sparse(
            out_idx,
            r,
            out_meta.shape,
            empty.to(r.dtype),
            indefinite=True,
            layout=layout,
            coalesced=True,
        )
        for r in res
    )
    return out if values else out[1]


def _arg_dim(A, dim, keep, which, meta, values):
    idx, vals = coalesced_parts(A)
    seg, out_idx, n_fill = group_slices(idx, A._sparse_shape, [dim])
    S, size = out_idx.shape[1], A.shape[dim] if A.dim() else 1
    r = REDUCERS[which]
    best = r(vals, seg, S, fill=A._fill, n_fill=n_fill)
    pos = idx[dim] if A.dim() else torch.zeros_like(seg)
    gap = first_gap(seg, pos, S)
    arg = segment_arg(
        vals, seg, S, pos, best, fill=A._fill, fill_position=torch.where(gap < size, gap, -1)
    )
    out_shape = meta[0].shape if values else meta.shape
    # slices with no stored element: the fill at position 0
    kept = [d for d in range(A.dim()) if d != dim]
    dense_arg = torch.zeros(tuple(A.shape[d] for d in kept), dtype=torch.int64, device=vals.device)
    dense_val = A._fill.expand(dense_arg.shape).clone().to(A.dtype)
    if S:
        where = tuple(out_idx)
        dense_arg[where] = arg
        dense_val[where] = best.to(A.dtype)
    if keep:
        dense_arg, dense_val = dense_arg.unsqueeze(dim), dense_val.unsqueeze(dim)
    dense_arg, dense_val = dense_arg.reshape(out_shape), dense_val.reshape(out_shape)
    return (dense_val, dense_arg) if values else dense_arg


# ------------------------------------------------------------------ medians
@register(aten.median.default, aten.nanmedian.default)
def _median(func, args, kwargs):
    """The lower median of all elements: the stored values sorted, the ``n`` fills inserted at their
    rank::

    median = s[m] if m < c  else  f if m < c + n  else  s[m - n],   m = (N - 1) // 2, c = #(s < f)
    """
    A = args[0]
    if A.dim() == 0 or A._indefinite:
        return _scalar(func, args, kwargs) if A.dim() == 0 else NotImplemented
    check_dtype(func, A)  # torch's errors (bool, complex)
    func(meta_of(A))  # (an empty input)
    if A.dense_dim():
        return _weighted_median(func, A)
    v, f = coalesced_parts(A)[1], A._fill.reshape(())
    n = A.numel() - v.numel()
    if func is aten.nanmedian.default:
        v = v[~torch.isnan(v)]
        n = 0 if bool(torch.isnan(f)) else n
    elif bool(torch.isnan(v).any()) or (n and bool(torch.isnan(f))):
        return torch.full((), float("nan"), dtype=A.dtype, device=A.device)
    N = v.numel() + n
    # torch's value for no element: NaN, or an integer dtype's own (a NaN of that dtype raises)
    if N == 0:
        return func(v.new_empty(0))
    seg = torch.zeros(v.shape[0], dtype=torch.int64, device=v.device)
    return segment_median(v, seg, 1, fill=f, n_fill=torch.tensor([n], device=v.device))[0]


def _weighted_median(func, A):
    """The lower median of all elements of a hybrid ``A``: the stored scalars, each once, and the
    fill's entries, each ``n`` times (``n`` unspecified sparse positions), sorted; the element of
    rank ``(N - 1) // 2`` by the cumulative multiplicities.  O(nse * D log(nse * D))."""
    idx, vals = coalesced_parts(A)
    n = _index.numel(A._sparse_shape) - idx.shape[1]
    v = vals.reshape(-1)
    f = A._fill.to(A.dtype).expand(A._dense_shape).reshape(-1)[: A._dense_shape.numel() * (n > 0)]
    x = torch.cat([v, f])
    w = torch.cat([torch.ones_like(v, dtype=torch.int64), torch.full_like(f, n, dtype=torch.int64)])
    nan = torch.isnan(x)
    if func is aten.nanmedian.default:
        x, w = x[~nan], w[~nan]
    elif bool(nan.any()):
        return torch.full((), float("nan"), dtype=A.dtype, device=A.device)
    N = int(w.sum())
    if N == 0:
        return func(v.new_empty(0))
    order = torch.argsort(x, stable=True)
    rank = torch.tensor((N - 1) // 2, device=x.device)
    at = torch.searchsorted(torch.cumsum(w[order], 0), rank, right=True)
    return x[order][at]


@register(aten.median.dim, aten.nanmedian.dim)
def _median_dim(func, args, kwargs):
    """Lower median along ``dim`` per slice, by the one rank rule
    (:func:`_kernels.reducer.segment_median`, the fills ahead of equal stored values), for all
    slices at once.  ``indices`` point at an element equal to the median: the stored one, or the
    first unspecified position when the fill is the median (torch leaves which of several equal
    elements unspecified); a slice with a NaN (median) gives its first NaN."""
    A, dim = args[0], args[1]
    keep = _keepdim_arg(args, kwargs, 2)
    if A.dim() == 0:
        return _scalar(func, args, kwargs)
    check_dtype(func, A, *args[1:], **kwargs)
    meta = meta_call(func, A, *args[1:], **kwargs)
    dim %= A.dim()
    if A._indefinite:
        return NotImplemented
    if A.dense_dim():
        if dim >= A.dim() - A.dense_dim():
            return _along_dense_dim(func, A, dim - (A.dim() - A.dense_dim()), keep, meta)
        # dense dims become sparse (dense dims trail sparse ones; an array fill: its most common
        # value)
        A = all_sparse(A)
    idx, v = coalesced_parts(A)
    f, size = A._fill.reshape(()), A.shape[dim]
    seg, out_idx, n = group_slices(idx, A._sparse_shape, [dim])
    S, k, spos = out_idx.shape[1], v.shape[0], idx[dim]
    fnan = bool(torch.isnan(f))
    # (NaNs skipped: nanmedian)
    val, which = segment_median(v, seg, S, fill=f, n_fill=n, return_index=True)
    gap = first_gap(seg, spos, S)
    pos = torch.where(which >= k, gap, spos[which.clamp(0, max(k - 1, 0))] if k else gap)
    pos = torch.where(which < 0, torch.zeros_like(pos), pos)  # (nanmedian of NaNs only)
    # a NaN anywhere in the slice: NaN at the first NaN
    if func is aten.median.dim and v.is_floating_point():
        first_nan = (
            segment_combine(torch.where(torch.isnan(v), spos, size), seg, S, "amin", init=size)
            if k
            else torch.full((S,), size, device=v.device)
        )
        if fnan:
            first_nan = torch.where(n > 0, torch.minimum(first_nan, gap), first_nan)
        has = first_nan < size
        val = torch.where(has, torch.full_like(val, float("nan")), val)
        pos = torch.where(has, first_nan, pos)
    kept = [d for d in range(A.dim()) if d != dim]
    dense_val = f.expand(tuple(A.shape[d] for d in kept)).clone()
    dense_pos = torch.zeros(dense_val.shape, dtype=torch.int64, device=v.device)
    if func is aten.nanmedian.dim and fnan:  # slices of NaN fills only
        dense_pos.zero_()
    if S:
        dense_val[tuple(out_idx)] = val.to(dense_val.dtype)
        dense_pos[tuple(out_idx)] = pos
    if keep:
        dense_val, dense_pos = dense_val.unsqueeze(dim), dense_pos.unsqueeze(dim)
    return dense_val.reshape(meta[0].shape), dense_pos.reshape(meta[1].shape)
