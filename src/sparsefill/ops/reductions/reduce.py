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

var and std: ``variance.py``; the reductions that select an element (argmax/argmin, max/min along a
dim, medians): ``select.py``.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_map_only

from sparsefill._kernels import engine as _engine, index as _index
from sparsefill._kernels.trace import traced
from sparsefill._tensor.parts import coalesced_parts, dense_of, parts_to_sparse
from sparsefill._kernels.grouping import csr_row_slices, group_slices, pattern_cached
from sparsefill._kernels.reducer import Norm, REDUCERS, Var, accumulator_dtype
from sparsefill._tensor.policy import check_densify
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops._schema import check_dtype, reduction_meta
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


@register(aten.count_nonzero.dim_IntList, aten.count_nonzero.default)
def _count_nonzero(func, args, kwargs):
    A = args[0]
    if A.dim() == 0:
        return _scalar(func, args, kwargs)
    dims = _dims_arg(args, kwargs, 1)
    return reduce_dims(
        A != 0, "sum", dims, False, reduction_meta(func, A, dims, False, *args[1:], **kwargs)
    )


# ------------------------------------------------------------------ scans
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
