"""Handlers every tensor needs: detach/alias, clone, ``to`` (dtype/device), copy_, equality,
``*_like``."""

from __future__ import annotations

import torch

from sparsefill._creation import constructors as _creation
from sparsefill._kernels import index as _index
from sparsefill._kernels.trace import traced
from sparsefill._tensor.parts import (
    coalesce_of,
    coalesced_parts,
    dense_of,
    dense_to_sparse,
    map_inner,
    rewrap,
    to_layout,
    union_parts,
)
from sparsefill._tensor.policy import check_densify, check_specify
from sparsefill._tensor.dense_dims import one_split, to_dense_dim
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops._schema import probe_of
from sparsefill.ops._writes import assign_
from sparsefill.ops.registry import register

aten = torch.ops.aten


@register(aten.detach.default, aten.alias.default)
def _alias(func, args, kwargs):
    """``A.detach()``, ``alias``: ``A``'s inner tensors in a new wrapper (``SparseTensor._make``:
    the parts are ``A``'s, already checked, so ``rewrap``'s checked constructor is skipped; the
    known-zero record of the same fill tensor carried over)."""
    A = args[0]
    out = SparseTensor._make(
        A._sf_layout,
        A._size,
        A._vals,
        A._fill,
        A._idx,
        A._crow,
        A._col,
        A._indefinite,
        A._coalesced,
        False,
    )
    out._zero = A._zero
    return out


@register(aten.clone.default)
def _clone(func, args, kwargs):
    """A copy of the inner tensors.  Values broadcast along a dim (``expand`` keeps them a stride-0
    view) are stored element by element in the copy, so their count asks the densify policy first
    (``expand_copy``)."""
    A = args[0]
    vals = A._vals
    if any(st == 0 and n > 1 for st, n in zip(vals.stride(), vals.shape)) and not traced(vals):
        check_specify(
            f"{func}: a copy of values broadcast along a dim (expand) stores each element",
            vals.numel(),
            vals.element_size(),
        )
    return map_inner(A, torch.clone, torch.clone)


@register(aten._to_copy.default)
def _to_copy(func, args, kwargs):
    if kwargs.get("layout") not in (None, torch.strided):
        return NotImplemented
    dtype, device, nb = kwargs.get("dtype"), kwargs.get("device"), kwargs.get("non_blocking", False)
    return map_inner(
        _coalesced_for_cast(args[0], dtype),
        lambda t: t.to(dtype=dtype, device=device, non_blocking=nb, copy=True),
        lambda t: t.to(device=device, non_blocking=nb),
    )


def _coalesced_for_cast(A: SparseTensor, dtype) -> SparseTensor:
    """A cast does not commute with summing duplicates (0.5 + 0.5 -> int): coalesce first."""
    return A if A._coalesced or dtype is None or dtype == A.dtype else coalesce_of(A)


@register(aten._conj.default)
def _conj(func, args, kwargs):  # physical: the conjugate bit would be lost inside dispatch
    return map_inner(args[0], torch.conj_physical)


@register(aten.view_as_real.default)
def _view_as_real(func, args, kwargs):
    """``view_as_real(A)``: a trailing dense dim of 2 (real, imaginary) on values and fill; an
    indefinite fill stays so.  (The backward of a complex result of a real input reads
    ``real(grad)`` through it.)"""
    A = args[0]
    fill = A._vals.real.new_empty(0) if A._indefinite else func(A._fill)
    return rewrap(A, size=A.shape + (2,), values=func(A._vals), fill=fill, known_zero=False)


@register(aten._neg_view.default)
def _neg_view(func, args, kwargs):
    return map_inner(args[0], torch.neg)


@register(aten.copy_.default)
def _copy_(func, args, kwargs):
    dst, src = args[0], args[1]
    if not isinstance(dst, SparseTensor):  # a dense target is dense by nature
        return dst.copy_(dense_of(src))
    if isinstance(src, SparseTensor):
        # src at dst's split, exactly
        if src.dense_dim() != dst.dense_dim() and src.shape == dst.shape:
            # (None: an indefinite src with a partly masked slice)
            conv = to_dense_dim(src, dst.dense_dim())
            src = src if conv is None else conv
        if src.shape != dst.shape or src.dense_dim() != dst.dense_dim():
            return NotImplemented
        # (dst's own: no copy, no write)
        held = {id(t) for t in (dst._idx, dst._crow, dst._col) if t is not None}
        new = map_inner(
            _coalesced_for_cast(src, dst.dtype),
            lambda t: t.to(dtype=dst.dtype, device=dst.device, copy=True),
            lambda t: t if id(t) in held else t.to(device=dst.device, copy=True),
        )
        return assign_(dst, to_layout(new, dst._sf_layout))
    x = torch.as_tensor(src).to(dtype=dst.dtype, device=dst.device).expand(dst.shape)
    return assign_(
        dst,
        dense_to_sparse(
            x, dst._fill, dst._indefinite, dst._fill_is_zero(), dst._sf_layout, dst.dense_dim()
        ),
    )


@register(aten.equal.default)
def _equal(func, args, kwargs):
    a, b = args
    if a.shape != b.shape:
        return False
    # the dense side is dense by nature
    if not (isinstance(a, SparseTensor) and isinstance(b, SparseTensor)):
        return torch.equal(*(dense_of(t) if isinstance(t, SparseTensor) else t for t in (a, b)))
    if b._sparse_shape != a._sparse_shape:  # split differently: compared at one split, exactly
        a, b = one_split([a, b], a._sf_layout)[0]
    if a._indefinite or b._indefinite:  # equal masked tensors: same pattern, same values
        (ia, va), (ib, vb) = coalesced_parts(a), coalesced_parts(b)
        return a._indefinite and b._indefinite and torch.equal(ia, ib) and torch.equal(va, vb)
    idx, (va, vb) = union_parts([a, b])
    if not torch.equal(va, vb):
        return False
    return idx.shape[1] == _index.numel(a._sparse_shape) or torch.equal(
        a.fill_value(), b.fill_value()
    )


@register(aten._local_scalar_dense.default)
def _item(func, args, kwargs):
    """``A.item()`` (``float(A)``, ``bool(A)``, formatting) of a one-element SparseTensor: its
    stored value (duplicates summed), else its fill, ``== A.to_dense().item()``, no dense temporary;
    an unspecified element of an indefinite fill has no value (ValueError, as ``to_dense``).  Other
    sizes: the fallback's (torch's) error."""
    A = args[0]
    if A.numel() != 1:
        return NotImplemented
    vals = coalesced_parts(A)[1]
    if A._indefinite and not traced(vals) and not vals.shape[0]:
        raise ValueError(
            "item(): the element of this SparseTensor is unspecified and its fill is indefinite "
            "(masked out: no value); give it a fill: A.to_dense(fill_value=...).item()"
        )
    # the stored value first
    return func(torch.cat([vals.reshape(-1), A._fill.reshape(-1).to(vals.dtype)])[0])


@register(aten.allclose.default)
def _allclose(func, args, kwargs):
    """``allclose(a, b, ...) == isclose(a, b, ...).all()``: the pointwise rule (operands split
    differently merge at one split, :mod:`.._splits`) and a reduction, no dense temporary.  A masked
    operand (an indefinite fill) is close to one masked at the same elements (after broadcasting)
    with close values there, as ``equal``."""
    a, b = args[:2]
    if not (
        isinstance(a, SparseTensor)
        and a._indefinite
        or isinstance(b, SparseTensor)
        and b._indefinite
    ):
        return bool(torch.isclose(a, b, *args[2:], **kwargs).all())
    func(probe_of(a), probe_of(b), *args[2:], **kwargs)  # torch's dtype and device errors
    if a.shape != b.shape:
        a, b = torch.broadcast_tensors(a, b)
    if not (
        isinstance(a, SparseTensor)
        and isinstance(b, SparseTensor)
        and a._indefinite
        and b._indefinite
    ):
        return False
    if b.dense_dim() != a.dense_dim():
        a, b = one_split([a, b], a._sf_layout)[0]
    (ia, va), (ib, vb) = coalesced_parts(a), coalesced_parts(b)
    return torch.equal(ia, ib) and bool(torch.isclose(va, vb, *args[2:], **kwargs).all())


@register(aten.dist.default)
def _dist(func, args, kwargs):
    """``dist(a, b, p) == linalg.vector_norm(a - b, p)``: the difference by the pointwise rule (at
    one split where the operands split differently), its norm over the stored elements and the fill
    (a masked norm over the specified elements where a fill is indefinite); no dense temporary."""
    a, b = args[:2]
    p = args[2] if len(args) > 2 else kwargs.get("p", 2)
    func(probe_of(a), probe_of(b), p)  # torch's dtype and device errors
    return torch.linalg.vector_norm(torch.sub(a, b), p)


@register(aten.is_same_size.default)
def _is_same_size(func, args, kwargs):
    return args[0].shape == args[1].shape


@register(
    aten.new_zeros.default,
    aten.new_ones.default,
    aten.new_empty.default,
    aten.new_full.default,
    aten.new_empty_strided.default,
)
# torch semantics: a new strided tensor with self's dtype and device
def _new_dense(func, args, kwargs):
    A = args[0]
    same = {"dtype": A.dtype, "device": A.device, "layout": torch.strided}
    if (
        func is aten.new_empty_strided.default
        and tuple(args[1]) == tuple(A.shape)
        and all(v is None or v == same.get(k, False) for k, v in kwargs.items())
    ):
        # autograd accumulates a leaf's gradient as A.new_empty_strided(A.shape,
        # A.stride()).copy_(grad): an empty SparseTensor here lets a sparse gradient stay sparse
        # (copy_ takes its pattern and fill)
        return _creation.empty_like(A)
    # a dense tensor asked of a SparseTensor (torch's formulas do: IndexBackward0's
    # grad.new_zeros(self.sizes())): dense by nature, so under the densify gate (its byte limit)
    # before it is allocated
    dtype = kwargs.get("dtype") or A.dtype
    check_densify(
        f"{func.__name__} of a SparseTensor of shape {list(A.shape)} (a dense tensor of shape "
        f"{list(args[1])})",
        _index.numel(args[1]) * dtype.itemsize,
        by_nature=True,
    )
    return func(A._vals, *args[1:], **kwargs)


def _like_handler(make):
    def handler(func, args, kwargs):
        A = args[0]
        if (
            A._indefinite
            and kwargs.get("layout") in (None, torch.strided)
            and kwargs.get("device") in (None, A.device)
        ):
            # a masked tensor's *_like keeps its mask: the op on the values, the fill stays
            # indefinite
            B = A if A._coalesced else coalesce_of(A)
            vals = func(
                B._vals,
                *args[1:],
                **{k: v for k, v in kwargs.items() if k not in ("layout", "memory_format")},
            )
            return rewrap(B, values=vals, fill=vals.new_empty(0), known_zero=False)
        kw = {k: kwargs[k] for k in ("dtype", "device") if kwargs.get(k) is not None}
        if kwargs.get("layout") not in (None, torch.strided):
            kw["layout"] = kwargs["layout"]
        return make(*args, **kw)

    return handler


register(aten.zeros_like.default)(_like_handler(_creation.zeros_like))
register(aten.ones_like.default)(_like_handler(_creation.ones_like))
register(aten.empty_like.default)(_like_handler(_creation.empty_like))
register(aten.full_like.default)(_like_handler(_creation.full_like))


def _copy_variant(func, args, kwargs):
    """``X_copy(A, ...) = X(A, ...).clone()``: the view op, then a copy of every output (own
    storage)."""
    view = getattr(
        getattr(aten, func._schema.name.split("::")[1][: -len("_copy")]), func._overloadname
    )
    res = view(*args, **kwargs)
    return [r.clone() for r in res] if isinstance(res, (list, tuple)) else res.clone()


for _name in (
    "alias",
    "expand",
    "narrow",
    "permute",
    "split_with_sizes",
    "squeeze",
    "t",
    "transpose",
    "unbind",
    "unsqueeze",
    "view",
):
    _copy = getattr(aten, f"{_name}_copy")
    for _ov in _copy.overloads():
        if not _ov.endswith("out") and _ov in getattr(aten, _name).overloads():
            register(getattr(_copy, _ov))(_copy_variant)
