"""Reductions over any dims, in closed form over the count of unspecified elements
(``_kernels/reducer.py``)::

    r(A, dims).to_dense() == r(A.to_dense(), dims)

* dense dims only: the op on the values and on the fill; the pattern is kept;
* sparse dims ``R``: stored elements grouped by output slice
  (:func:`_kernels.grouping.group_slices`), each slice folds ``n = prod(size[R]) - count`` copies of
  the fill; the result is sparse over the kept sparse dims, its fill the reduction of
  ``prod(size[R])`` fills; reducing every sparse dim gives a dense result (dense by nature);
* both: dense dims first, then sparse dims (every reducer here composes so; var/std use shifted
  sums).

An indefinite fill skips the unspecified elements (masked semantics) and stays indefinite. Output
dtype and torch's own errors (bad dims, mean of integers) come from running the op on a one-element
tensor of A's dtype, the output shape from the dims (``_schema.reduction_meta``: no Python meta
kernel, whose first call in a process imports ``torch._dynamo``).
"""

from __future__ import annotations

import warnings

import torch
from torch.utils._pytree import tree_map_only

from sparsefill._kernels import engine as _engine, index as _index
from sparsefill._kernels.trace import traced
from sparsefill._tensor.parts import coalesced_parts, dense_of, parts_to_sparse
from sparsefill._kernels.grouping import csr_row_slices, group_slices, pattern_cached
from sparsefill._kernels.reducer import (
    Norm,
    REDUCERS,
    Var,
    accumulator_dtype,
    first_gap,
    segment_arg,
    segment_combine,
    segment_median,
)
from sparsefill._tensor.policy import check_densify
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops._schema import check_dtype, meta_call, meta_of, reduction_meta
from sparsefill.ops.shape.reshape import all_sparse
from sparsefill.ops.registry import register

aten = torch.ops.aten

# name -> the same reduction of a dense tensor over a list of dims (keepdim as given)
_DENSE = {
    "sum": lambda x, d, k, o: torch.sum(x, d, k),
    "mean": lambda x, d, k, o: torch.mean(x, d, k),
    "prod": lambda x, d, k, o: _prod_dims(x, d, k),
    "amax": lambda x, d, k, o: torch.amax(x, d, k),
    "amin": lambda x, d, k, o: torch.amin(x, d, k),
    "logsumexp": lambda x, d, k, o: torch.logsumexp(x, d, k),
    "all": lambda x, d, k, o: torch.all(x, d, k),
    "any": lambda x, d, k, o: torch.any(x, d, k),
    "norm": lambda x, d, k, o: torch.linalg.vector_norm(x, o, d, k),
    "hash_tensor": lambda x, d, k, o: torch.hash_tensor(x, d, keepdim=k),
    "var": lambda x, d, k, o: torch.var(x, d, correction=o, keepdim=k),
}


def _prod_dims(x, dims, keepdim):
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, d, keepdim)
    return x


def _reducer(name, opt):
    if name == "norm":
        return Norm(opt)
    if name == "var":
        return Var(opt)
    if name in ("all", "any"):
        return REDUCERS["amin" if name == "all" else "amax"]
    return REDUCERS[name]


@register(aten.nansum.default)
def _nansum(func, args, kwargs):
    """``nansum(A) = sum(where(isnan(A), 0, A))``: element-wise, then the sum."""
    A = args[0]
    check_dtype(func, A, *args[1:], **kwargs)  # (nansum of complex raises)
    if A.is_floating_point() or A.is_complex():
        A = torch.where(torch.isnan(A), torch.zeros((), dtype=A.dtype, device=A.device), A)
    return (
        aten.sum.dim_IntList(A, *args[1:], **kwargs)
        if len(args) > 1 or kwargs.get("dim") is not None
        else aten.sum.default(A, **{k: v for k, v in kwargs.items() if k == "dtype"})
    )


def reduce_dims(A: SparseTensor, name: str, dims, keepdim: bool, out_meta: torch.Tensor, opt=None):
    """``name`` over ``dims`` (None or empty: all) of ``A``; the result has ``out_meta``'s shape and
    dtype."""
    nd = A.dim()
    sd = nd - A.dense_dim()
    dims = sorted({d % nd for d in dims}) if dims and nd else list(range(nd))
    sp, dn = [d for d in dims if d < sd], [d - sd for d in dims if d >= sd]
    # (a floating row sum of scalars: the SpMV engine)
    spmv = name == "sum" and A.dtype in _FLOATS and sd == nd
    rows = _csr_rows(A, A.dtype if spmv else None) if sp == [1] and sd == 2 else None
    idx, vals = (None, A._vals) if rows is not None else coalesced_parts(A)
    if name in ("all", "any"):
        vals = vals.bool()
    fill = None if A._indefinite else _fill_of(A, vals.dtype)
    wide = _wide_dtype(name, vals.dtype, bool(sp and dn))
    if wide is not None:
        vals, fill = vals.to(wide), None if fill is None else fill.to(wide)
    if dn:  # dense dims: the op on values (dims shifted past nse) and on the fill
        vals = _DENSE[name](vals, [d + 1 for d in dn], keepdim, opt)
        fill = None if fill is None else _DENSE[name](fill, dn, keepdim, opt)
    if not sp:
        return _finish(A, idx, vals, fill, out_meta, A._sf_layout)
    r = _reducer(name, opt)
    N = width = _index.numel([A.shape[d] for d in sp])
    kept = [d for d in range(sd) if d not in sp]
    if not kept:  # every sparse dim: one slice, no grouping; dense by nature
        k = vals.shape[0]
        # (k: a dynamic size when traced, not a constant)
        n_all = torch.tensor([N], device=vals.device) - k
        kw = {} if fill is None else dict(fill=fill, n_fill=n_all)
        # the k stored elements as one run: no segment ids to scatter or count
        if not traced(vals) and k:
            res = r(vals, None, 1, lengths=torch.tensor([k], device=vals.device), **kw)[0]
        else:
            res = r(vals, torch.zeros(k, dtype=torch.int64, device=vals.device), 1, **kw)[0]
        return res.reshape(out_meta.shape).to(out_meta.dtype)
    if rows is not None:  # the slices are the (non-empty) rows of a 2-D CSR matrix
        out_idx, n_fill, lengths, csr, width = rows
        seg, kw = None, dict(lengths=lengths, csr=csr)
    else:
        seg, out_idx, n_fill = group_slices(idx, A._sparse_shape, sp)
        # the slices are contiguous runs of the (coalesced) stored elements when the reduced dims
        # trail
        kw = (
            dict(lengths=pattern_cached(("run_lengths", N), (n_fill,), lambda: N - n_fill))
            if max(kept) < min(sp)
            else {}
        )  # (cached: the sums' block plans are keyed by these lengths)
    S = out_idx.shape[1]
    if fill is not None:
        kw.update(fill=fill, n_fill=n_fill)
    out_vals = r(vals, seg, S, **kw)
    if (
        fill is not None
        and name == "sum"
        and N > 0
        and (fill.is_floating_point() or fill.is_complex())
    ):
        out_fill = fill * width  # r.of_fills(fill, N, dtype) in one op (exact, gradient included)
    else:
        out_fill = None if fill is None else r.of_fills(fill, N, vals.dtype)
    if keepdim:  # reduced sparse dims stay, of size 1, index 0
        full = out_idx.new_zeros((sd, S))
        full[kept] = out_idx
        out_idx, kept = full, list(range(sd))
    return _finish(
        A,
        out_idx,
        out_vals,
        out_fill,
        out_meta,
        A._sf_layout if len(kept) >= 2 else torch.sparse_coo,
    )


_HALVES = (torch.float16, torch.bfloat16)


def _wide_dtype(name: str, dtype: torch.dtype, both: bool):
    """The dtype a reduction computes in where it is wider than the values' (None: the values' own):
    the half types in float32 (torch's accumulation for them: their squares and sums overflow
    float16), and a sum or mean over both sparse and dense dims in :func:`accumulator_dtype` (its
    partial sums kept wide)."""
    if dtype in _HALVES and name in ("sum", "mean", "norm", "logsumexp", "prod", "var"):
        return torch.float32
    if both and name in ("sum", "mean") and accumulator_dtype(dtype) != dtype:
        return accumulator_dtype(dtype)
    return None


def _csr_rows(A: SparseTensor, acc_dtype=None):
    """``group_slices`` of a 2-D CSR pattern over its columns, read off the row pointers (cached per
    pattern, as ``group_slices``): ``(out_idx, n_fill, lengths, csr, width)`` of the slices, the
    non-empty rows or every row, whose stored elements are contiguous runs of ``lengths``; ``csr``
    the rows for the engines (:class:`_kernels.engine.CsrRows`); ``width`` the number of columns.
    ``acc_dtype`` (float32/float64, a floating sum, whose engine is the SpMV): ``n_fill`` and
    ``width`` (0-d) are tensors of that dtype and the index tensors the SpMV reads best come along
    (``_kernels.engine.spmv_index``), all cached (per ``crow`` and ``col`` then): the sum folds
    ``fill * n_fill`` and makes its fill ``fill * width`` with no conversion or scalar wrapping per
    call."""
    if A._sf_layout is not torch.sparse_csr or A._crow.dim() != 1:
        return None
    crow, col, ncols, masked = A._crow, A._col, A.shape[1], A._indefinite
    out_idx, n_fill, lengths, rows, width, index32 = pattern_cached(
        ("csr_rows", ncols, masked, acc_dtype),
        (crow,) if acc_dtype is None else (crow, col),
        lambda: _rows_of(crow, col, ncols, masked, acc_dtype),
    )
    return out_idx, n_fill, lengths, _engine.CsrRows(crow, col, ncols, rows, False, index32), width


def _rows_of(crow, col, ncols, masked: bool, acc_dtype):
    """:func:`_csr_rows`' cached part: ``(out_idx, n_fill, lengths, rows, width, index32)``,
    ``rows`` None for every row."""
    counts = crow.diff()
    # mostly non-empty (traced: sizes known): all rows
    every = not masked and (traced(crow) or 2 * int(torch.count_nonzero(counts)) > counts.numel())
    out_idx, n_fill, lengths = csr_row_slices(counts, ncols, every)
    rows = None if every else out_idx[0]
    if acc_dtype is None:
        return out_idx, n_fill, lengths, rows, ncols, None
    return (
        out_idx,
        n_fill.to(acc_dtype),
        lengths,
        rows,
        torch.tensor(ncols, dtype=acc_dtype, device=crow.device),
        None if traced(crow) else _engine.spmv_index(crow, col, ncols),
    )


_FLOATS = (
    torch.float32,
    torch.float64,
)  # (a sum of these folds its fill with n_fill in the values' dtype)


def _fill_of(A: SparseTensor, dtype: torch.dtype) -> torch.Tensor:
    """``A``'s fill expanded to its dense dims, in ``dtype`` (no copy, no op for a scalar fill of
    that dtype)."""
    f = A._fill
    if f.dim() or A._vals.dim() > (1 if A._sf_layout is torch.sparse_coo else A._col.dim()):
        f = f.expand(A._dense_shape)
    return f if f.dtype == dtype else f.to(dtype)


def _finish(A, idx, vals, fill, out_meta, layout):
    """The SparseTensor result (coalesced parts) with ``out_meta``'s shape and dtype."""
    dtype = out_meta.dtype
    vals = vals if vals.dtype == dtype else vals.to(dtype)
    fill = vals.new_empty(0) if fill is None else fill if fill.dtype == dtype else fill.to(dtype)
    if layout is torch.sparse_coo:  # (parts computed here: the wrapper alone)
        return SparseTensor._make(
            layout, out_meta.shape, vals, fill, idx, None, None, A._indefinite, True, False
        )
    return parts_to_sparse(
        idx, vals, out_meta.shape, fill, indefinite=A._indefinite, layout=layout, coalesced=True
    )


# ------------------------------------------------------------------ handlers
def _dims_arg(args, kwargs, pos, name="dim"):
    d = args[pos] if len(args) > pos else kwargs.get(name)
    return [d] if isinstance(d, int) else (list(d) if d is not None else None)


def _keepdim_arg(args, kwargs, pos):
    return bool(args[pos] if len(args) > pos else kwargs.get("keepdim", False))


def _scalar(func, args, kwargs):
    """A 0-d SparseTensor is one value: the op on it directly.  With an indefinite fill that value
    may be masked out: the op on its one-element reshape (the masked reduction of it), as a 0-d
    result."""
    A = args[0]
    if not A._indefinite:
        return func(dense_of(A), *args[1:], **kwargs)
    out = func(A.reshape(1), *args[1:], **kwargs)
    return tree_map_only(torch.Tensor, lambda t: t.reshape(()) if t.dim() == 1 else t, out)


_METAS: dict = {}


def _meta(func, A, dims, keep, args, kwargs, plain: bool):
    """``reduction_meta`` of the call, memoised here on its plain form (``(A, dims, keepdim)``
    positional, no keyword: the arguments are the normalised ``dims`` and ``keep``) without hashing
    the arguments."""
    if kwargs or not plain:
        return reduction_meta(func, A, dims, keep, *args[1:], **kwargs)
    key = (
        func,
        A.shape,
        A.dtype,
        A.device,
        torch.get_default_dtype(),
        None if dims is None else tuple(dims),
        keep,
        len(args),
    )
    out = _METAS.get(key)
    if out is None:
        out = reduction_meta(func, A, dims, keep, *args[1:], **kwargs)
        if len(_METAS) > 1024:
            _METAS.clear()
        _METAS[key] = out
    return out


def _handler(name, dim_pos=None, keep_pos=None, opt=None):
    def handler(func, args, kwargs):
        A = args[0]
        if A.dim() == 0:
            return _scalar(func, args, kwargs)
        dims = _dims_arg(args, kwargs, dim_pos) if dim_pos is not None else None
        keep = _keepdim_arg(args, kwargs, keep_pos) if keep_pos is not None else False
        meta = _meta(func, A, dims, keep, args, kwargs, opt is None and len(args) <= 3)
        dtype = kwargs.get("dtype")
        if dtype is not None:
            A = A.to(dtype)
        # integers and bool promote to float, as torch does; complex: next stage
        if name == "logsumexp":
            if A.is_complex():
                return NotImplemented
            A = A if A.is_floating_point() else A.to(meta.dtype)
        return reduce_dims(A, name, dims, keep, meta, opt(args, kwargs) if opt else None)

    return handler


register(aten.sum.default)(_handler("sum"))
register(aten.sum.dim_IntList)(_handler("sum", 1, 2))
register(aten.mean.default)(_handler("mean"))
register(aten.mean.dim)(_handler("mean", 1, 2))
register(aten.prod.default)(_handler("prod"))
register(aten.prod.dim_int)(_handler("prod", 1, 2))
register(aten.amax.default)(_handler("amax", 1, 2))
register(aten.amin.default)(_handler("amin", 1, 2))
register(aten.max.default)(_handler("amax"))
register(aten.min.default)(_handler("amin"))
register(aten.all.default)(_handler("all"))
register(aten.all.dim, aten.all.dims)(_handler("all", 1, 2))
register(aten.any.default)(_handler("any"))
register(aten.any.dim, aten.any.dims)(_handler("any", 1, 2))
register(aten.logsumexp.default)(_handler("logsumexp", 1, 2))
# (keepdim: keyword only, not at 2)
register(aten.hash_tensor.default)(_handler("hash_tensor", 1, 2))
_norm = _handler("norm", 2, 3, opt=lambda a, k: float(a[1] if len(a) > 1 else k.get("ord", 2)))


@register(aten.linalg_vector_norm.default)
def _vector_norm(func, args, kwargs):
    if float(args[1] if len(args) > 1 else kwargs.get("ord", 2)) != 0:
        return _norm(func, args, kwargs)
    # the 0-"norm" counts nonzeros: it composes over dims as a sum of counts, not as a norm of norms
    A = args[0]
    if A.dim() == 0:
        return _scalar(func, args, kwargs)
    dims, keep = _dims_arg(args, kwargs, 2), _keepdim_arg(args, kwargs, 3)
    meta = reduction_meta(func, A, dims, keep, *args[1:], **kwargs)
    return reduce_dims((A != 0).to(meta.dtype), "sum", dims, keep, meta)


@register(
    aten.norm.Scalar,
    aten.norm.ScalarOpt_dim,
    aten.norm.ScalarOpt_dim_dtype,
    aten.norm.ScalarOpt_dtype,
)
def _legacy_norm(func, args, kwargs):
    """``aten.norm`` (``torch.norm``, ``_foreach_norm``'s per-tensor form:
    ``clip_grad_norm_(foreach=True)``) as ``linalg_vector_norm(A, p or 2, dim, keepdim, dtype=)``:
    the same value."""
    a = list(args) + [None] * (4 - len(args))
    p = a[1] if len(args) > 1 else kwargs.get("p", 2)
    dim, keep = (
        (a[2], bool(a[3]))
        if func in _NORM_DIM
        else (kwargs.get("dim"), kwargs.get("keepdim", False))
    )
    kw = {"dtype": kwargs["dtype"]} if kwargs.get("dtype") is not None else {}
    return _vector_norm(
        aten.linalg_vector_norm.default, (args[0], 2 if p is None else p, dim, keep), kw
    )


_NORM_DIM = (aten.norm.ScalarOpt_dim, aten.norm.ScalarOpt_dim_dtype)


def _correction(args, kwargs):
    c = kwargs.get("correction")
    return 1 if c is None else c


@register(
    aten.var.correction, aten.std.correction, aten.var_mean.correction, aten.std_mean.correction
)
def _var_std(func, args, kwargs):
    """var/std (and their means) as torch's: over sparse dims only, or dense dims only, centred on
    each slice's mean (the reducer protocol's :class:`_kernels.reducer.Var`, moments of float32 in
    float64,
    as torch)::

        var[s] = (sum_i (x_i - mean[s])^2 + n_fill[s] * (f - mean[s])^2) / max(N - correction, 0)

    with ``N`` the elements per output slice (the stored ones, for an indefinite fill); over both
    kinds of dims at once, shifted sums (:func:`_shifted_var`)."""
    A = args[0]
    if A.dim() == 0:
        return _scalar(func, args, kwargs)
    probe = {
        **kwargs,
        "correction": 0,
    }  # (torch's errors; on one element a correction would warn, see below)
    check_dtype(func, A, *args[1:], **probe)  # (var of integers raises)
    dims, keep = _dims_arg(args, kwargs, 1), bool(kwargs.get("keepdim", False))
    reduction_meta(
        func, A, dims, keep, *args[1:], **{k: v for k, v in probe.items() if k != "keepdim"}
    )  # errors
    dims = sorted({d % A.dim() for d in dims}) if dims else list(range(A.dim()))
    shape = [1 if d in dims else A.shape[d] for d in range(A.dim()) if keep or d not in dims]
    meta = torch.empty((), dtype=A.dtype.to_real(), device="meta").expand(shape)
    c = _correction(args, kwargs)
    n = _index.numel([A.shape[d] for d in dims])
    if not A._indefinite and n - c <= 0 and A.numel():
        warnings.warn(
            f"{func._schema.name.split('::')[1]}(): degrees of freedom is <= 0. Correction "
            "should be strictly less than the reduction factor (input numel divided by output "
            "numel)."
        )
    sd = A.dim() - A.dense_dim()
    # centred on each slice's mean (two passes)
    if all(d < sd for d in dims) or all(d >= sd for d in dims):
        var = reduce_dims(A, "var", dims, keep, meta, c)
    else:
        var = _shifted_var(A, dims, keep, c)
    out = var if func in (aten.var.correction, aten.var_mean.correction) else torch.sqrt(var)
    if func in (aten.var_mean.correction, aten.std_mean.correction):
        return out, welford_mean(A, A.mean(dims, keepdim=keep), dims, keep)
    return out


def welford_mean(A, mean, dims, keepdim):
    """The mean of ``var_mean``/``std_mean`` as dense torch gives it.  Its Welford pass runs over
    each slice in index order and its update ``m += (x - m) / n`` gives NaN (``inf - inf``) once a
    non-finite element has been met, but at the last element: the mean is ``mean``'s +-inf where the
    slice's one non-finite element is its last, NaN where the slice holds any other non-finite
    element (``mean`` gives +-inf there).

    >>> import sparsefill
    >>> A = sparsefill.sparse_coo_tensor([[0]], [1.], (3,), fill_value=float("inf"))
    >>> torch.var_mean(A)[1], torch.var_mean(A.to_dense())[1]
    (tensor(nan), tensor(nan))
    """
    if not A.is_floating_point() or A.numel() == 0:
        return mean
    bad = torch.isinf(A)  # (a NaN makes both means NaN: only infinities tell them apart)
    # (the common case: mean's own result and gradient)
    if not traced(A._vals) and not bool(bad.any()):
        return mean
    count, last = bad.sum(dims, keepdim=keepdim), bad
    for d in dims:
        last = last.narrow(d, A.shape[d] - 1, 1)
    last = last.sum(dims, keepdim=keepdim) > 0
    nan_at = (count >= 2) | ((count == 1) & ~last)
    return torch.where(
        nan_at, torch.full((), float("nan"), dtype=mean.dtype, device=mean.device), mean
    )


def _shifted_var(A: SparseTensor, dims, keep: bool, c):
    """var over sparse and dense dims at once: shifted sums in the accumulator dtype, shifted by the
    fill so
    that unspecified elements add nothing::

        var = (sum (x - f)^2 - |sum (x - f)|^2 / N) / max(N - correction, 0)"""
    dtype = A.dtype
    # (the half types too: no cancellation in float32)
    wide = accumulator_dtype(accumulator_dtype(dtype))
    A = A if wide == dtype else A.to(wide)
    B = A if A._indefinite else A - _shift(A, dims)
    sq = (B * B.conj()).real if B.is_complex() else B * B
    s1, s2 = B.sum(dims, keepdim=keep), sq.sum(dims, keepdim=keep)
    n = (
        torch.ones_like(sq).sum(dims, keepdim=keep)
        if A._indefinite
        else _index.numel([A.shape[d] for d in dims])
    )
    ss = s2 - ((s1 * s1.conj()).real if s1.is_complex() else s1 * s1) / n
    var = ss / ((n - c).clamp_min(0) if isinstance(n, torch.Tensor) else max(n - c, 0))
    return var if wide == dtype else var.to(dtype)


def _shift(A: SparseTensor, dims):
    """The fill, averaged over the reduced dense dims (a shift must be constant along them), 0 where
    not finite."""
    # (var is shift-invariant: no gradient flows through the shift)
    f = A._fill.expand(A._dense_shape)
    f = torch.where(torch.isfinite(f), f, torch.zeros((), dtype=f.dtype, device=f.device))
    sd = A.dim() - A.dense_dim()
    dn = [d - sd for d in dims if d >= sd]
    return f.mean(dn, keepdim=True) if dn and f.dim() else f


@register(aten.count_nonzero.dim_IntList, aten.count_nonzero.default)
def _count_nonzero(func, args, kwargs):
    A = args[0]
    if A.dim() == 0:
        return _scalar(func, args, kwargs)
    dims = _dims_arg(args, kwargs, 1)
    return reduce_dims(
        A != 0, "sum", dims, False, reduction_meta(func, A, dims, False, *args[1:], **kwargs)
    )


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


# ------------------------------------------------------------------ scans and medians
@register(
    aten.cumsum.default,
    aten.cumprod.default,
    aten.cummax.default,
    aten.cummin.default,
    aten.logcumsumexp.default,
    aten._logcumsumexp.default,
)
def _scan(func, args, kwargs):
    """Along a dense dim: the op on the values and on the fill (pattern kept).  Along a sparse dim
    the running value changes at every element: dense by nature, computed on the dense tensor."""
    A, dim = args[0], args[1]
    if A.dim() == 0:
        return _scalar(func, args, kwargs)
    # torch's errors, on one element per dim (a meta tensor runs torch's Python meta kernel, whose
    # first call imports torch._dynamo: 0.5-1 s of a process's first scan)
    func(torch.zeros((1,) * A.dim(), dtype=A.dtype, device=A.device), *args[1:], **kwargs)
    dim %= A.dim()
    sd = A.dim() - A.dense_dim()
    if dim < sd:
        if A._indefinite:
            return NotImplemented
        check_densify(f"{func} along a sparse dim", A.numel() * A.element_size(), by_nature=True)
        return func(dense_of(A), dim, **kwargs)
    idx, vals = coalesced_parts(A)
    vals = func(vals, dim - sd + 1, **kwargs)
    fill = None if A._indefinite else func(A._fill.expand(A._dense_shape), dim - sd, **kwargs)
    outs, fills = (vals, fill) if isinstance(vals, tuple) else ((vals,), (fill,))
    res = tuple(
        parts_to_sparse(
            idx,
            v,
            A.shape,
            v.new_empty(0) if f is None else f,
            indefinite=A._indefinite,
            layout=A._sf_layout,
            coalesced=True,
        )
        for v, f in zip(outs, fills or (None,) * len(outs))
    )
    return res if isinstance(vals, tuple) else res[0]


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


# ---------------------------------------------------------------------- torch.sparse.sum
@register(aten._sparse_sum.dim)
def _sparse_sum(func, args, kwargs):
    """``torch.sparse.sum(A, dims) == A.to_dense().sum(dims)``; an indefinite fill skips the
    unspecified elements (masked, as torch.sparse.sum skips a native tensor's).
    (``torch.sparse.sum(A)`` with no dims decomposes above ``__torch_dispatch__`` into
    ``A.coalesce()``: ``A.sum()`` is that sum.)"""
    return aten.sum.dim_IntList(args[0], list(args[1]))


@register(aten._sparse_sum_backward.default)
def _sparse_sum_backward(func, args, kwargs):
    """The gradient of ``torch.sparse.sum(A, dims)``: ``grad`` broadcast back over the summed dims,
    as for ``sum``."""
    grad, A, dims = args[0], args[1], args[2]
    for d in sorted(d % A.dim() for d in dims):
        grad = grad.unsqueeze(d)
    return grad.expand(A.shape)
