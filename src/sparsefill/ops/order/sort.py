"""Order statistics of a SparseTensor: ``sort``, ``argsort``, ``msort``, ``topk``, ``kthvalue``,
``mode``, ``aminmax`` (and, through ``sort``, the composite ``quantile``/``nanquantile``), without
its dense form::

    op(A, ...) == op(A.to_dense(), ...)          values and indices, ties in stable order

Along a sparse dim each 1-D slice (a *row*) is its stored values merged with one run of the fill,
so the rank of every element follows from a sort of the stored values alone (``rows.py``: the
compiled row kernels on CPU, :class:`~sparsefill.ops.order.rows.Rows` elsewhere).  Along a dense
dim: the op on the stored values and on the fill, the pattern kept (a SparseTensor result).

A sort's output (and ``topk``'s, ``kthvalue``'s... over a sparse dim) holds every slice: it is
*dense by nature*; it is built in one pass, under the densify policy's ``dense_by_nature`` gate.
Ties are ordered as torch's stable sort orders them (``stable=True``: indices equal to dense's);
where torch's unstable kernels (``stable=False`` past 16 elements, ``topk``, ``kthvalue``, ``mode``)
leave the order of equal elements unspecified, the stable order is given (``mode``: the last
occurrence, as dense torch on short slices).

An indefinite fill (masked semantics): each slice is its stored elements only
(``masked_order.py``).

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor([[0, 0, 1], [1, 3, 2]], [5., -1., 2.], (2, 4), fill_value=0.)
>>> torch.sort(A, 1).values
tensor([[-1.,  0.,  0.,  5.],
        [ 0.,  0.,  0.,  2.]])
>>> torch.topk(A, 2, 1).indices
tensor([[1, 0],
        [2, 0]])
"""

from __future__ import annotations

import torch

from sparsefill._kernels import index as _index
from sparsefill._kernels.trace import traced
from sparsefill._tensor.parts import coalesced_parts, dense_of, parts_to_sparse
from sparsefill._tensor.policy import check_densify
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops._schema import meta_call
from sparsefill.ops.registry import register, register_shortcut
from sparsefill.ops.order.rows import (
    Rows,
    bind,
    full_rank,
    mode_rows,
    ranked,
    rows_of,
    sorted_head,
)
from sparsefill.ops.order.masked_order import kth_pick, masked_reduced, masked_sort, mode_pick

aten = torch.ops.aten


def _gate(what: str, A: SparseTensor, n: int) -> None:
    """The densify policy's dense-by-nature gate for an ``n``-element result (values and
    indices)."""
    check_densify(what, n * (A.element_size() + 8), by_nature=True)


def _along_dense(func, A: SparseTensor, dim: int, rest: dict, meta):
    """The op along a dense dim: on the stored values and on the fill, the pattern kept."""
    idx, vals = coalesced_parts(A)
    d = dim - A._sparse_ndim()
    vr = func(vals, **{**rest, "dim": d + 1})
    if A._indefinite:
        return tuple(
            parts_to_sparse(idx, v, m.shape, v.new_empty(0), indefinite=True, coalesced=True)
            for v, m in zip(vr, meta)
        )
    fr = func(A._fill.to(A.dtype).expand(A._dense_shape).contiguous(), **{**rest, "dim": d})
    return tuple(
        parts_to_sparse(idx, v, m.shape, f, layout=A._sf_layout, coalesced=True)
        for v, f, m in zip(vr, fr, meta)
    )


def _stable_topk(x, k, dim, largest):
    v, i = torch.sort(x, dim=dim, descending=largest, stable=True)
    return v.narrow(dim, 0, k), i.narrow(dim, 0, k)


def _stable_kth(x, k, dim, keepdim):
    v, i = torch.sort(x, dim=dim, stable=True)
    v, i = v.narrow(dim, k - 1, 1), i.narrow(dim, k - 1, 1)
    return (v, i) if keepdim else (v.squeeze(dim), i.squeeze(dim))


def _plain(func, A, args, kwargs):
    """A 0-d or empty ``A``: the op on its dense form, of one element or none (a 0-d ``A`` with
    an indefinite fill: the fallback's error)."""
    if A._indefinite and A.numel():
        return NotImplemented
    return func(dense_of(A, A._vals.new_zeros(()) if A._indefinite else None), *args[1:], **kwargs)


def _check_dim(A, dim) -> None:
    """torch's error for a dim out of range (meta kernels of sort/topk skip it)."""
    n = max(A.dim(), 1)
    if not -n <= dim < n:
        raise IndexError(
            f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})"
        )


def _sparse_dim(func, A, dim):
    """``dim`` normalised; None when ``func`` along it is the op on the values and on the fill (a
    dense dim)."""
    dim %= A.dim()
    return None if dim >= A._sparse_ndim() else dim


@register(aten.sort.default, aten.sort.stable)
def _sort(func, args, kwargs):
    """``sort(A, dim, descending, stable)``: values and indices, ties in stable order (dense by
    nature over a sparse dim: every slice of the result is built, in one pass)."""
    b = bind(func, args, kwargs)
    A, dim, desc = b["self"], b["dim"], b["descending"]
    _check_dim(A, b["dim"])
    meta = meta_call(func, A, *args[1:], **kwargs)  # (torch's errors: dim, dtype)
    if A.dim() == 0 or A.numel() == 0:
        return _plain(func, A, args, kwargs)
    d = _sparse_dim(func, A, dim)
    if A._indefinite and d is not None:
        return masked_sort(A, d, desc)
    if d is None:
        rest = {"stable": True, "descending": desc}
        return _along_dense(aten.sort.stable, A, dim % A.dim(), rest, meta)
    _gate(f"sort of a SparseTensor along sparse dim {d}", A, A.numel())
    return sorted_head(A, d, A.shape[d], desc, A.shape)


_sort.dense_by_nature = (
    "along a sparse dim every slice of the sorted result is built (in one pass, under the densify "
    "policy's dense_by_nature); along a dense dim the pattern is kept"
)


@register(aten.topk.default)
def _topk(func, args, kwargs):
    """``topk(A, k, dim, largest, sorted)``: the first ``k`` of each slice's stable sort (dense
    by nature over a sparse dim: ``k`` per slice, built in one pass); ``sorted=False`` gives them
    sorted too (torch leaves that order unspecified)."""
    b = bind(func, args, kwargs)
    A, k, dim, largest = b["self"], b["k"], b["dim"], b["largest"]
    _check_dim(A, b["dim"])
    meta = meta_call(func, A, *args[1:], **kwargs)  # (torch's errors: k out of range, dim)
    if A.dim() == 0 or A.numel() == 0:
        return _plain(func, A, args, kwargs)
    d = _sparse_dim(func, A, dim)
    if A._indefinite and d is not None:
        return masked_sort(A, d, largest, k)
    if d is None:
        return _along_dense(_stable_topk, A, dim % A.dim(), {"k": k, "largest": largest}, meta)
    _gate(f"topk of a SparseTensor along sparse dim {d}", A, A.numel() // A.shape[d] * k)
    return sorted_head(A, d, k, largest, meta[0].shape)


# dtypes whose sort/topk torch runs on CPU and CUDA alike (the shortcuts' plain operands)
_SHORT_DTYPES = {
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
}


def _short_dim(A, dim) -> int | None:
    """The sparse dim ``dim`` of ``A`` (normalised) where the order shortcuts take the call: ``A``
    a coalesced COO SparseTensor or a CSR matrix with a definite fill and elements, no view
    (``views.around`` has nothing to do), not traced, of a dtype of ``_SHORT_DTYPES``; ``dim`` an
    int in range.  Else None (the full path: its checks, errors and other cases)."""
    if (
        A.__class__ is not SparseTensor
        or A._view is not None
        or A._indefinite
        or type(A._vals) is not torch.Tensor
        or A._vals.dtype not in _SHORT_DTYPES
        or type(dim) is not int
        or traced()
    ):
        return None
    size = A._size
    n = len(size)
    if not -n <= dim < n or not _index.numel(size):
        return None
    dim %= n
    if A._sf_layout is torch.sparse_coo:
        return dim if A._coalesced and dim < A._idx.shape[0] else None
    return dim if A._sf_layout is torch.sparse_csr and A._crow.dim() == 1 and dim < 2 else None


def _flags(*flags) -> bool:
    return all(type(b) is bool for b in flags)


@register_shortcut(aten.topk.default)
def _topk_shortcut(func, args, kwargs):
    """``topk(A, k, dim, largest, sorted)`` along a sparse dim of a plain operand
    (:func:`_short_dim`), ``0 <= k <= A.shape[dim]``: what :func:`_topk` computes, straight from
    ``__torch_dispatch__`` (no schema binding, no meta call: the arguments are checked here).
    None: the full path."""
    if kwargs or not 2 <= len(args) <= 5:
        return None
    A, k, dim, largest, srt = (*args, *(-1, True, True)[len(args) - 2 :])  # (the defaults)
    d = _short_dim(A, dim)
    if d is None or type(k) is not int or not _flags(largest, srt) or not 0 <= k <= A._size[d]:
        return None
    size = A._size
    shape = size[:d] + (k,) + size[d + 1 :]
    n = _index.numel(shape)
    check_densify(
        f"topk of a SparseTensor along sparse dim {d}",
        n * (A._vals.element_size() + 8),
        by_nature=True,
    )
    return sorted_head(A, d, k, largest, shape)


@register_shortcut(aten.sort.default)
def _sort_shortcut(func, args, kwargs):
    """``sort(A, dim, descending)`` along a sparse dim of a plain operand (:func:`_short_dim`):
    what :func:`_sort` computes, straight from ``__torch_dispatch__``.  None: the full path."""
    if kwargs or not 1 <= len(args) <= 3:
        return None
    A, dim, desc = (*args, *(-1, False)[len(args) - 1 :])  # (the defaults)
    d = _short_dim(A, dim)
    if d is None or not _flags(desc):
        return None
    size = A._size
    check_densify(
        f"sort of a SparseTensor along sparse dim {d}",
        _index.numel(size) * (A._vals.element_size() + 8),
        by_nature=True,
    )
    return sorted_head(A, d, size[d], desc, size)


@register_shortcut(aten.sort.stable)
def _sort_stable_shortcut(func, args, kwargs):
    """``sort(A, *, stable, dim, descending)`` (``torch.sort(A, dim=..., stable=True)``): the
    shortcut of :func:`_sort_shortcut` (the order given is the stable one either way)."""
    if len(args) != 1 or not kwargs.keys() <= {"stable", "dim", "descending"}:
        return None
    if kwargs.get("stable", False) not in (None, True, False):
        return None
    rest = (kwargs.get("dim", -1), kwargs.get("descending", False))
    return _sort_shortcut(aten.sort.default, (args[0], *rest), {})


@register(aten.sort.values, aten.sort.values_stable)
def _sort_out(func, args, kwargs):
    """``sort(A, dim, descending, out=(values, indices))`` along a sparse dim of a plain operand
    (:func:`_short_dim`) into contiguous outputs of the result's shape and dtypes: the kernel
    writes them (no second buffer).  NotImplemented otherwise: the registry's ``out=`` rule
    (the result written into the outputs)."""
    b = bind(func, args, kwargs)
    A, v, i, desc = b["self"], b["values"], b["indices"], b["descending"]
    d = _short_dim(A, b["dim"])
    if d is None or not _flags(desc) or not _fits(v, A, A.dtype) or not _fits(i, A, torch.int64):
        return NotImplemented
    if v.untyped_storage().data_ptr() == i.untyped_storage().data_ptr():
        return NotImplemented  # (torch's overlap error)
    size = A._size
    _gate(f"sort of a SparseTensor along sparse dim {d}", A, _index.numel(size))
    return sorted_head(A, d, size[d], desc, size, out=(v, i))


def _fits(t, A: SparseTensor, dtype) -> bool:
    """``t`` is a plain contiguous tensor of ``A``'s shape and device and of ``dtype``."""
    return (
        type(t) is torch.Tensor
        and t.dtype == dtype
        and t.shape == A._size
        and t.device == A._vals.device
        and t.is_contiguous()
    )


_topk.dense_by_nature = (
    "along a sparse dim k elements of every slice (sparsefill.topk(..., sparse=True): only the "
    "stored ones)"
)


def _reduced(t, moved, dim, keepdim):
    t = t.reshape(moved[:-1])
    return t.unsqueeze(dim) if keepdim else t


@register(aten.kthvalue.default)
def _kthvalue(func, args, kwargs):
    """``kthvalue(A, k, dim, keepdim)``: rank ``k - 1`` of each slice's stable ascending sort,
    found by rank arithmetic over the sorted stored values (no slice is built)."""
    b = bind(func, args, kwargs)
    A, k, dim, keep = b["self"], b["k"], b["dim"], b["keepdim"]
    _check_dim(A, b["dim"])
    meta = meta_call(func, A, *args[1:], **kwargs)
    if A.dim() == 0 or A.numel() == 0:
        return _plain(func, A, args, kwargs)
    d = _sparse_dim(func, A, dim)
    if A._indefinite and d is not None:
        return masked_reduced(A, d, keep, kth_pick(k))
    if d is None:
        return _along_dense(_stable_kth, A, dim % A.dim(), {"k": k, "keepdim": keep}, meta)
    _gate(f"kthvalue of a SparseTensor along sparse dim {d}", A, A.numel() // A.shape[d])
    v, p, moved = ranked(A, d, lambda rows: full_rank(rows, k - 1))
    return _reduced(v[0], moved, d, keep), _reduced(p[0], moved, d, keep)


@register(aten.mode.default)
def _mode(func, args, kwargs):
    """``mode(A, dim, keepdim)``: per slice the most frequent value (the fill counted ``n`` times,
    with the stored values equal to it), ties to the smallest; its index the last occurrence (a
    NaN mode: the first), as dense torch on slices of up to 16 elements."""
    b = bind(func, args, kwargs)
    A, dim, keep = b["self"], b["dim"], b["keepdim"]
    _check_dim(A, b["dim"])
    meta = meta_call(func, A, *args[1:], **kwargs)
    if A.dim() == 0 or A.numel() == 0:
        return _plain(func, A, args, kwargs)
    d = _sparse_dim(func, A, dim)
    if A._indefinite and d is not None:
        return masked_reduced(A, d, keep, mode_pick)
    if d is None:
        return _along_dense(_dense_mode, A, dim % A.dim(), {"keepdim": keep}, meta)
    _gate(f"mode of a SparseTensor along sparse dim {d}", A, A.numel() // A.shape[d])
    rows, moved = rows_of(A, d, False)
    v, p = mode_rows(rows)
    return _reduced(v, moved, d, keep), _reduced(p, moved, d, keep)


def _dense_mode(x, dim, keepdim):
    """torch.mode of a dense tensor, with the tie rule above at any slice length."""
    xm = x.movedim(dim, -1)
    shape = xm.shape
    flat = xm.reshape(-1, shape[-1])
    R, size = flat.shape
    r = torch.arange(R, device=x.device).repeat_interleave(size)
    p = torch.arange(size, device=x.device).repeat(R)
    rows = Rows(
        r, p, flat.reshape(-1), flat[:, 0].clone() if size else flat.new_empty(R), R, size, False
    )
    v, i = mode_rows(rows)
    v, i = v.reshape(shape[:-1]), i.reshape(shape[:-1])
    return (v.unsqueeze(dim), i.unsqueeze(dim)) if keepdim else (v, i)


@register(aten.aminmax.default)
def _aminmax(func, args, kwargs):
    """``aminmax(A, dim, keepdim) == (amin(A, dim, keepdim), amax(A, dim, keepdim))``: the two
    native reductions."""
    b = bind(func, args, kwargs)
    A, dim, keep = b["self"], b["dim"], b["keepdim"]
    meta_call(func, A, *args[1:], **kwargs)
    dims = [] if dim is None else [dim]
    return aten.amin.default(A, dims, keep), aten.amax.default(A, dims, keep)


def topk(
    A: SparseTensor,
    k: int,
    dim: int = -1,
    largest: bool = True,
    sorted: bool = True,
    *,
    sparse: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(A, k, dim, largest, sorted)``; ``sparse=True``: the result as SparseTensors of
    its shape (hybrid where ``A`` is), storing only the slots that hold a stored element of ``A``
    (pytorch#34951): ``values.to_dense()`` is the dense ``topk``'s values (the other slots hold the
    fill: ``values``' fill is ``A``'s), ``indices`` has an indefinite fill (a slot of the fill's
    run may point at any of its elements).  With an indefinite fill, the masked top-k: each slice's
    ``k`` largest stored elements (fewer where fewer are stored).  Along a dense dim of a hybrid
    tensor the result keeps ``A``'s pattern either way.

    >>> import torch, sparsefill
    >>> A = sparsefill.sparse_coo_tensor([[0, 0, 2], [1, 5, 3]], [5., 7., 4.], (3, 1000))
    >>> v, i = sparsefill.topk(A, 2, 1, sparse=True)
    >>> v.indices().tolist(), v.values().tolist(), i.values().tolist()
    ([[0, 0, 2], [0, 1, 0]], [7.0, 5.0, 4.0], [5, 1, 3])
    >>> torch.equal(v.to_dense(), torch.topk(A.to_dense(), 2, 1).values)
    True
    """
    if not sparse or not isinstance(A, SparseTensor):
        return torch.topk(A, k, dim, largest, sorted)
    _check_dim(A, dim)
    meta = meta_call(aten.topk.default, A, k, dim, largest, sorted)
    d = None if A.dim() == 0 else _sparse_dim(None, A, dim)
    if d is None or A._indefinite or A.numel() == 0:  # (already sparse, or nothing stored)
        return torch.topk(A, k, dim, largest, sorted)
    rows, moved = rows_of(A, d, largest)
    Dn, kshape = _index.numel(A._dense_shape), moved[: -1 - A.dense_dim()]
    slot = rows._slots()
    keep = slot < k
    pat = torch.unique((rows.r[keep] // Dn) * k + slot[keep])
    kk, ss = pat // k, pat % k
    R_all = (kk[:, None] * Dn + torch.arange(Dn, device=pat.device)).reshape(-1)
    v, p = rows.at(ss.repeat_interleave(Dn), R_all)
    kept = _index.unravel(kk, kshape)
    idx = torch.cat([kept[:d], ss[None], kept[d:]])
    shape, D = meta[0].shape, tuple(A._dense_shape)
    order = torch.argsort(_index.linearize(idx, shape[: A._sparse_ndim()]))
    idx, v, p = idx[:, order], v.reshape((-1,) + D)[order], p.reshape((-1,) + D)[order]
    values = parts_to_sparse(idx, v, shape, A._fill.to(A.dtype), coalesced=True)
    indices = parts_to_sparse(idx, p, shape, p.new_empty(0), indefinite=True, coalesced=True)
    return torch.return_types.topk((values, indices))
