"""Writes and reads at coordinates: one writer (:func:`write`) for ``index_put`` in every index
form, ``scatter``/``scatter_add``/``scatter_reduce`` and ``index_add/copy/fill/reduce``; one reader
(:func:`read`) for ``gather``/``take_along_dim``::

    op(A).to_dense() == op(A.to_dense())

The written positions join the pattern (a union of linear keys); a read finds stored values by a
binary search of the keys, the fill elsewhere.  torch's own errors are raised, and a failed call
changes nothing.

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor([[0, 2], [1, 0]], [1., 2.], (3, 2), fill_value=5.)
>>> A[torch.tensor([1])] = 0.
>>> A.to_dense()
tensor([[5., 1.],
        [0., 0.],
        [2., 5.]])
"""

from __future__ import annotations

import torch

from sparsefill._kernels import index as _index, merge as _merge
from sparsefill._kernels.trace import traced
from sparsefill._tensor.parts import coalesced_parts, dense_of, dense_to_sparse, parts_to_sparse
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops._schema import check_dtype, meta_like, meta_of
from sparsefill.ops._writes import assign_
from sparsefill.ops.shape.indexing import _dense_fill, out_of_bounds
from sparsefill.ops.registry import register

aten = torch.ops.aten


def _coords(A, indices):
    """The coordinates (one row per dim, one column per element of ``A[indices]``) of the elements
    an index expression reaches, by torch's own indexing of ``arange``s (its broadcasting, bool
    masks, ``None`` slices, negative indices and range errors): ``(coords (ndim, M), shape of
    A[indices])``."""
    nd = A.dim()
    rows = []
    for d, n in enumerate(A.shape):
        ar = (
            torch.arange(n, device=A.device)
            .view([-1 if e == d else 1 for e in range(nd)])
            .expand(A.shape)
        )
        rows.append(aten.index.Tensor(ar, indices))
    shape = rows[0].shape if rows else torch.Size([])
    return (
        torch.stack([r.reshape(-1) for r in rows])
        if rows
        else torch.zeros(0, 1, dtype=torch.int64, device=A.device)
    ), shape


_REDUCE = {
    "sum": "sum",
    "add": "sum",
    "prod": "prod",
    "multiply": "prod",
    "mean": "mean",
    "amax": "amax",
    "amin": "amin",
    "max": "amax",
    "min": "amin",
}


def write(
    A: SparseTensor, coords: torch.Tensor, values: torch.Tensor, reduce=None, include_self=True
):
    """``A`` with the elements at ``coords`` (``(ndim, M)``) set to ``values`` (``M`` of them), or
    combined with them by ``reduce`` (``sum prod mean amax amin``, torch's ``index_reduce_`` rule,
    ``include_self``).  The written positions join the pattern (a union of linear keys over the
    sparse dims); a newly specified dense slice starts as the fill.  O(nse + M)."""
    sd = A.dim() - A.dense_dim()
    D = tuple(A._dense_shape)
    idx, vals = coalesced_parts(A)
    k_old, k_new = (
        _index.linearize(idx, A._sparse_shape),
        _index.linearize(coords[:sd], A._sparse_shape),
    )
    union, p_old, p_new = _join(k_old, k_new)
    base = vals.new_zeros(()) if A._indefinite else A._fill
    out = base.expand((union.numel(),) + D).clone()
    out.index_copy_(0, p_old, vals)
    flat = p_new * _index.numel(D) + _index.linearize(coords[sd:], D)
    out_flat, v = out.reshape(-1), values.reshape(-1).to(A.dtype)
    if reduce is None:
        out_flat.index_put_((flat,), v)
    elif _REDUCE[reduce] == "sum":
        if not include_self:
            out_flat.index_fill_(0, flat, 0)
        out_flat.index_add_(0, flat, v)
    else:
        out_flat.index_reduce_(0, flat, v, _REDUCE[reduce], include_self=include_self)
    return parts_to_sparse(
        _index.unravel(union, A._sparse_shape),
        out,
        A.shape,
        A._fill,
        indefinite=A._indefinite,
        layout=A._sf_layout if sd >= 2 else torch.sparse_coo,
        coalesced=True,
    )


def _join(k_old: torch.Tensor, k_new: torch.Tensor):
    """``(union, p_old, p_new)``: the sorted union of a pattern's keys ``k_old`` (sorted unique) and
    written keys ``k_new`` (any order, repeats allowed), ``union[p_old] == k_old``, ``union[p_new]
    == k_new``.  The written keys are sorted alone (already sorted unique: not at all), then merged
    with the pattern in one linear pass (:func:`_kernels.merge.union_inverse`): O(nse + M log M),
    not a sort of the nse + M keys."""
    if traced(k_new):
        union, inv = _index.unique_inverse(torch.cat([k_old, k_new]))
        return union, inv[: k_old.numel()], inv[k_old.numel() :]
    if _index.is_sorted_unique(k_new):
        u, inv = k_new, None
    else:
        u, inv = _index.unique_inverse(k_new)
    union, (p_old, p_u) = _merge.union_inverse([k_old, u])
    return union, p_old, (p_u if inv is None else p_u[inv])


def read(A: SparseTensor, coords: torch.Tensor) -> torch.Tensor:
    """The elements of ``A`` at ``coords`` (``(ndim, M)``): stored values where specified, the fill
    elsewhere (a binary search of the linear keys over the sparse dims).  O(M log nse + nse)."""
    sd = A.dim() - A.dense_dim()
    idx, vals = coalesced_parts(A)
    pos, found = _index.lookup(
        _index.linearize(idx, A._sparse_shape), _index.linearize(coords[:sd], A._sparse_shape)
    )
    q = _index.linearize(coords[sd:], A._dense_shape)
    stored = vals.reshape(vals.shape[0], -1)[pos, q] if vals.shape[0] else vals.new_zeros(q.shape)
    return torch.where(found, stored, _dense_fill(A).reshape(-1)[q])


def _dense_values(v, shape, dtype, device):
    """Written values as a strided tensor broadcast to ``shape`` (a SparseTensor source is read
    densely: it is as large as the written set)."""
    v = (
        dense_of(v)
        if isinstance(v, SparseTensor)
        else torch.as_tensor(v, dtype=dtype, device=device)
    )
    return v.expand(shape)


def _check_dim_index_src(func, A, dim, index, src, args, kwargs) -> int:
    """torch's errors for ``func(A, dim, index, src, ...)`` (the meta kernel's, plus the dtype rule
    for a tensor source, which meta kernels skip); the normalised ``dim``."""
    func(meta_of(A), dim, index.to("meta"), meta_like(src), *args[4:], **kwargs)
    if isinstance(src, torch.Tensor) and src.dim() and src.dtype != A.dtype:
        raise RuntimeError(
            f"{func._schema.name.split('::')[1]}(): self and source expected to have the same "
            f"dtype, but got (self) {A.dtype} and (source) {src.dtype}"
        )
    return dim % max(A.dim(), 1)


def _check_range(index, dim, A) -> None:
    """scatter's and gather's error for an index outside ``[0, size)`` along ``dim``."""
    n = A.shape[dim] if A.dim() else 1  # (a 0-d tensor is one element along its dim 0)
    bad = out_of_bounds(index, n, negative=False)
    if bad is not None:
        raise RuntimeError(f"index {bad} is out of bounds for dimension {dim} with size {n}")


def _result(func, A, res):
    """In-place overloads (name ending ``_``) write ``res`` into ``A``; the others return it."""
    return assign_(A, res) if func._schema.name.endswith("_") else res


@register(aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default)
def _index_put(func, args, kwargs):
    """``A[indices] = v`` (``accumulate``: ``+=``) for every index form torch accepts (index
    tensors, bool masks, ``None`` for ``:``)."""
    A, indices, values = args[0], list(args[1]), args[2]
    accumulate = bool(args[3] if len(args) > 3 else kwargs.get("accumulate", False))
    if (
        not isinstance(A, SparseTensor)
        or any(isinstance(t, SparseTensor) for t in indices)
        or (A._indefinite and (accumulate or A.dense_dim()))
    ):
        return NotImplemented  # (a strided target, or a sparse index: the next stage)
    if values.dtype != A.dtype:  # (the meta kernel does not check it)
        raise RuntimeError(
            f"Index put requires the source and destination dtypes match, got {A.dtype} for the "
            f"destination and {values.dtype} for the source."
        )
    aten.index_put.default(
        meta_of(A),
        [None if t is None else t.to("meta") for t in indices],
        meta_like(values),
        accumulate,
    )  # torch's dtype and shape errors
    # (the meta kernel takes a 0-d mask on a 0-d tensor, torch's kernel raises: one element)
    if A.dim() == 0:
        v = dense_of(values) if isinstance(values, SparseTensor) else values
        check_dtype(aten.index_put.default, A, indices, v, accumulate)
    coords, shape = _coords(A, indices)
    v = _dense_values(values, shape, A.dtype, A.device)
    return _result(func, A, write(A, coords, v, "sum" if accumulate else None))


def _grid(index: torch.Tensor, dim: int, n_dims: int):
    """``scatter``'s coordinates: ``index[i]`` along ``dim``, ``i`` along the others (a 0-d tensor:
    no coordinate rows, one column per element of ``index``)."""
    if not n_dims:
        return index.new_zeros((0, index.numel()))
    grid = (
        list(
            torch.meshgrid(
                *[torch.arange(n, device=index.device) for n in index.shape], indexing="ij"
            )
        )
        if index.dim()
        else [index.new_zeros(())] * n_dims
    )
    grid[dim] = index
    return torch.stack([g.reshape(-1) for g in grid]) if grid else index.reshape(1, -1)


@register(
    aten.scatter.src,
    aten.scatter.value,
    aten.scatter_.src,
    aten.scatter_.value,
    aten.scatter.reduce,
    aten.scatter.value_reduce,
    aten.scatter_.reduce,
    aten.scatter_.value_reduce,
    aten.scatter_add.default,
    aten.scatter_add_.default,
    aten.scatter_reduce.two,
    aten.scatter_reduce_.two,
)
def _scatter(func, args, kwargs):
    """``A[..., index[i], ...] (op)= src[i]`` along ``dim`` at ``index``'s positions: :func:`write`
    at the coordinates ``_grid(index)`` (scatter_add: sum; ``reduce=``; scatter_reduce with
    ``include_self``)."""
    A, dim, index, src = args[0], args[1], args[2], args[3]
    if (
        not isinstance(A, SparseTensor)
        or isinstance(index, SparseTensor)
        or (A._indefinite and A.dense_dim())
    ):
        return NotImplemented
    name = func._schema.name.split("::")[1].rstrip("_")
    reduce = (
        "sum" if name == "scatter_add" else (args[4] if len(args) > 4 else kwargs.get("reduce"))
    )
    include_self = args[5] if len(args) > 5 else kwargs.get("include_self", True)
    if A._indefinite and reduce is not None:
        return NotImplemented
    if name == "scatter_reduce" and reduce in (
        "max",
        "min",
    ):  # (torch's kernel takes them; its meta kernel not)
        args = (*args[:4], "a" + reduce, *args[5:])
    dim = _check_dim_index_src(func, A, dim, index, src, args, kwargs)
    _check_range(index, dim, A)
    coords = _grid(index, dim, A.dim())
    if isinstance(src, torch.Tensor):
        src = src[tuple(slice(0, n) for n in index.shape)] if src.dim() else src
    v = _dense_values(src, index.shape, A.dtype, A.device)
    return _result(func, A, write(A, coords, v, reduce, include_self))


@register(
    aten.index_add.default,
    aten.index_add_.default,
    aten.index_copy.default,
    aten.index_copy_.default,
    aten.index_fill.int_Scalar,
    aten.index_fill_.int_Scalar,
    aten.index_fill.int_Tensor,
    aten.index_fill_.int_Tensor,
    aten.index_reduce.default,
    aten.index_reduce_.default,
)
def _index_along(func, args, kwargs):
    """``index_add/copy/fill/reduce(A, dim, index, src)``: whole slices along ``dim`` at ``index``,
    i.e. :func:`write` at the coordinates of ``A[(:,) * dim + (index,)]``."""
    A, dim, index, src = args[0], args[1], args[2], args[3]
    name = func._schema.name.split("::")[1].rstrip("_")
    if (
        not isinstance(A, SparseTensor)
        or isinstance(index, SparseTensor)
        or (A._indefinite and (name in ("index_add", "index_reduce") or A.dim() == 0))
    ):
        return NotImplemented
    # one element: torch's kernel on it (its rules and errors for the indices of a 0-d tensor)
    if A.dim() == 0:
        rest = [dense_of(a) if isinstance(a, SparseTensor) else a for a in args[1:]]
        out = func(dense_of(A), *rest, **kwargs)
        return _result(
            func, A, dense_to_sparse(out, A._fill, False, A._fill_is_zero(), torch.sparse_coo, 0)
        )
    dim = _check_dim_index_src(func, A, dim, index, src, args, kwargs)
    neg = index[index < 0] if name != "index_fill" else index.reshape(-1)[:0]
    if neg.numel():  # torch's errors for a negative index (too large ones come from _coords)
        msg = (
            f"index {int(neg.reshape(-1)[0])} is out of bounds for dimension {dim} with size "
            f"{A.shape[dim]}"
        )
        raise (
            RuntimeError(msg)
            if name == "index_add"
            else IndexError(
                f"index_copy_(): {msg}" if name == "index_copy" else "index out of range in self"
            )
        )
    coords, shape = _coords(A, [None] * dim + [index.reshape(-1)])
    if name == "index_add":
        alpha = args[4] if len(args) > 4 else kwargs.get("alpha", 1)
        v = _dense_values(src, shape, A.dtype, A.device)
        return _result(func, A, write(A, coords, v * alpha if alpha != 1 else v, "sum"))
    if name == "index_reduce":
        reduce = args[4]
        include_self = args[5] if len(args) > 5 else kwargs.get("include_self", True)
        return _result(
            func,
            A,
            write(A, coords, _dense_values(src, shape, A.dtype, A.device), reduce, include_self),
        )
    return _result(func, A, write(A, coords, _dense_values(src, shape, A.dtype, A.device)))


@register(aten.gather.default)
def _gather(func, args, kwargs):
    """``out[i] = A[..., index[i], ...]`` along ``dim`` (a strided result shaped like ``index``):
    :func:`read` at the coordinates of ``scatter``."""
    A, dim, index = args[0], args[1], args[2]
    if (
        isinstance(index, SparseTensor)
        or A._indefinite
        or kwargs.get("sparse_grad", False)
        or (len(args) > 3 and args[3])
    ):
        return NotImplemented
    func(meta_of(A), dim, index.to("meta"))  # torch's errors
    dim %= max(A.dim(), 1)
    _check_range(index, dim, A)
    return read(A, _grid(index, dim, A.dim())).reshape(index.shape)
