"""Views of a SparseTensor: results of view ops (``A[0]``, ``A.t()``, ``A.detach()``) remember their
base.

A torch view shares memory with its base; a SparseTensor view is its own
SparseTensor, kept consistent both ways:

* a write to the view (any in-place or ``out=`` op on it) is written through to the base,
  on the stored elements (:func:`write_native`): the view op replayed on a contiguous meta
  tensor of the base's shape gives the strided map from view positions to base positions::

      base_key(v) = offset + sum_d v[d] * stride[d]        (row-major keys over base.shape)

  the view's stored elements are written at their base keys (the base's pattern grows by their
  slices), the base's stored elements inside the view's region take the view's fill, and where
  the view's fill differs from the base's, the region's positions are specified (a DensifyWarning
  when they are many).  Overlapping views (``expand``), dtype views and indefinite fills over
  dense dims go the dense way: ``view_op(dense(base)).copy_(dense(view))`` (a DensifyWarning);
* a view whose base changed since it was taken is refreshed before it is read, by running the
  view op again on the base (natively, through the op registry).

so that ``A[0] = 3.``, ``A[:, 1].fill_(0)``, ``A.t().mul_(2)`` and ``nn.Parameter(A)`` updates
behave as on ``A.to_dense()``.  Aliases (``detach``, ``alias``) just share storage.

The op registry runs :func:`around` around every dispatched call and
gives ``SparseTensor`` its view hooks (``sync``, ``write_through``, ``track``: installed by
``ops/__init__.py``); a view's relation to its base is a :class:`View` record in ``V._view``.

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor([[0, 1], [2, 0]], [1., 2.], (2, 3), fill_value=5.)
>>> _ = A.t()[2].add_(10.)
>>> A.to_dense()
tensor([[ 5.,  5., 11.],
        [ 2.,  5., 15.]])
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from sparsefill._kernels import index as _index
from sparsefill._tensor.parts import (
    coalesced_parts,
    dense_of,
    differs,
    map_inner,
    parts_to_sparse,
    rewrap,
    scalar_parts,
)
from sparsefill._tensor.policy import check_densify, check_specify
from sparsefill._tensor.tensor import _STATE, SparseTensor
from sparsefill.ops._schema import flat_args, written_args
from sparsefill.ops._writes import assign_, mark_viewed, respecify_
from sparsefill.ops import registry

aten = torch.ops.aten
ALIASES = (aten.detach.default, aten.alias.default)
INVOLUTIONS = {
    aten._conj.default: torch.conj_physical,
    aten._neg_view.default: torch.neg,
}  # their own inverse


class View(NamedTuple):
    """What a view ``V`` is of its base, as ``V._view`` holds it::

        V == func(base, *args, **kwargs)
            ([index] of that for a multi-output view op: unbind, split)

    as of ``state``, the base's :func:`_state` when ``V`` last agreed with it."""

    base: SparseTensor
    func: Any  # the view op, an OpOverload
    args: tuple  # its arguments after the base
    kwargs: dict
    index: int | None
    state: Any


# a view whose schema does not say so (torch's composites write through it: kron's out=)
_UNSAFE_VIEW = torch.ops.aten._unsafe_view.default


def around(func, args, kwargs, call):
    """Around every dispatched call: views among the operands catch up with their bases, the
    SparseTensor outputs of a view op remember their base (:func:`track`), and a write to a view
    goes through to its base (:func:`write_through`; when that fails the view gets its old contents
    back)."""
    for a in (
        args
        if len(args) == 1 and args[0].__class__ is SparseTensor and not kwargs
        else flat_args(args, kwargs)
    ):
        if isinstance(a, SparseTensor) and a._view is not None:
            sync(a)
    written = [A for A in written_args(func, args, kwargs) if A._view is not None]
    # (in-place ops replace, never mutate)
    before = [{k: getattr(A, k) for k in _STATE[:-1]} for A in written]
    out = call(func, args, kwargs)
    if (func.is_view or func is _UNSAFE_VIEW) and isinstance(args[0], SparseTensor):
        track(out, func, args, kwargs)
    for A, state in zip(written, before):
        try:
            write_through(A)
        except Exception:
            for k, v in state.items():
                setattr(A, k, v)
            raise
    return out


def _state(A: SparseTensor):
    """What a view compares to see whether its base changed; inference tensors have no version
    counters, so their state never compares equal (the view is always refreshed)."""
    try:
        return (
            A._version,
            id(A._vals),
            A._vals._version,
            id(A._fill),
            A._fill._version,
            A._sf_layout,
        )
    except RuntimeError:  # (an inference tensor)
        return object()


def track(out, func, args, kwargs) -> None:
    """Record ``base`` and the view op on each SparseTensor output of a view op.

    An alias of an alias is recorded as an alias of the first one's base (they hold the same
    storage): ``torch.utils.swap_tensors(P, P.detach())`` -- what ``nn.Module._apply`` does when
    ``P.cpu()`` returns ``P`` -- then leaves no tensor a view of itself.
    """
    base = args[0]
    if func in ALIASES and base._view is not None and base._view.func in ALIASES:
        base = base._view.base
    outs = out if isinstance(out, (list, tuple)) else [out]
    for i, V in enumerate(outs):
        if isinstance(V, SparseTensor) and V is not base:
            V._view = View(base, func, args[1:], kwargs, i if outs is out else None, _state(base))
            mark_viewed(base)  # (its shape is then fixed: _writes.reshape_)


def _replay(V: SparseTensor, base_dense: torch.Tensor) -> torch.Tensor:
    v = V._view
    out = v.func(base_dense, *v.args, **v.kwargs)
    return out if v.index is None else out[v.index]


def sync(V: SparseTensor) -> None:
    """Refresh ``V`` (a view) from its base if the base changed since."""
    if _in_cycle(V):
        return
    v = V._view
    base = v.base
    if base._view is not None:
        sync(base)
    now = _state(base)
    if now == v.state:
        return
    if v.func in ALIASES:
        assign_(V, rewrap(base))
    elif v.func in INVOLUTIONS:
        assign_(V, map_inner(base, INVOLUTIONS[v.func]))
    else:
        _refresh(V)
    V._view = v._replace(state=now)


def _in_cycle(V: SparseTensor) -> bool:
    """Whether ``V``'s chain of bases leads back to ``V``; ``V`` is then made a tensor of its own.

    Only ``torch.utils.swap_tensors(X, Y)`` with ``Y`` a view of ``X`` builds such a chain (the swap
    moves ``Y``'s state, "a view of X", into ``X``): ``nn.Module._apply`` swaps a parameter ``p``
    with ``Parameter(p.cpu())``, which is ``p.detach()`` when ``p`` is there already, and
    ``load_state_dict`` under ``torch.__future__.set_swap_module_params_on_conversion(True)`` swaps
    a parameter or buffer with ``p.copy_(other).detach()``.  ``V`` holds the view's storage, which
    is ``X``'s own, so it keeps its contents.
    """
    seen, B = set(), V._view.base
    while B is not V and B._view is not None and id(B) not in seen:
        seen.add(id(B))
        B = B._view.base
    if B is V:
        V._view = None
    return B is V


def _refresh(V: SparseTensor) -> None:
    """``V = view_op(base)`` again, through the op registry (natively where the view op has a
    handler)."""
    v = V._view
    new = registry.compute(v.func, (v.base, *v.args), v.kwargs)
    new = new if v.index is None else new[v.index]
    if isinstance(new, SparseTensor) and new.shape == V.shape and new.dtype == V.dtype:
        assign_(V, new)
    else:
        check_densify(
            f"refreshing a view ({v.func}) of a changed base",
            v.base.numel() * v.base.element_size(),
        )
        respecify_(V, _replay(V, dense_of(v.base)))


def _copy_into(target: torch.Tensor, src: torch.Tensor, bd: torch.Tensor) -> None:
    """``target.copy_(src)``; for a self-overlapping view of ``bd`` (``expand``) write each location
    once."""
    if torch._debug_has_internal_overlap(target) != 1:
        target.copy_(src)
        return
    offsets = torch.arange(bd.numel(), device=bd.device).as_strided(
        target.shape, target.stride(), target.storage_offset() - bd.storage_offset()
    )
    bd.view(-1)[offsets.reshape(-1)] = src.reshape(-1)


def write_through(V: SparseTensor) -> None:
    """Propagate a write to view ``V`` into its base (and on up the chain of bases)."""
    v = V._view
    base = v.base
    if v.func in ALIASES:
        assign_(base, rewrap(V))
    elif v.func in INVOLUTIONS:
        assign_(base, map_inner(V, INVOLUTIONS[v.func]))
    elif not write_native(V):
        check_densify(f"writing through a view ({v.func})", base.numel() * base.element_size())
        bd = dense_of(base)
        _copy_into(_replay(V, bd), dense_of(V), bd)
        respecify_(base, bd)
    if not base.is_inference():
        torch.autograd.graph.increment_version(base)
    V._view = v._replace(state=_state(base))
    if base._view is not None:
        write_through(base)


# ---------------------------------------------------------------------- native write-back
def strided_map(V: SparseTensor):
    """``(sizes, strides, offset)`` of ``V``'s view op replayed on a contiguous meta tensor of its
    base's shape (keys: row-major over ``base.shape``); None when the view is not an injective
    strided view of the same dtype (``expand``, ``view(dtype)``, an op the meta replay rejects)."""
    base = V._view.base
    try:
        out = _replay(V, torch.empty(base.shape, dtype=base.dtype, device="meta"))
    except Exception:  # (a replay the meta kernels cannot run: the dense way)
        return None
    if (
        not isinstance(out, torch.Tensor)
        or out.dtype != base.dtype
        or tuple(out.shape) != tuple(V.shape)
    ):
        return None
    sizes, strides = tuple(out.shape), tuple(out.stride())
    # non-overlapping: each stride exceeds the span of the smaller ones (greedy decoding is exact)
    reach = 0
    for d in sorted((d for d in range(len(sizes)) if sizes[d] > 1), key=lambda d: strides[d]):
        if strides[d] <= reach:
            return None
        reach += (sizes[d] - 1) * strides[d]
    return sizes, strides, out.storage_offset()


def _encode(v: torch.Tensor, smap) -> torch.Tensor:
    """Base keys of view positions ``v`` (``(V.dim(), n)``)."""
    sizes, strides, offset = smap
    st = torch.tensor(strides, dtype=torch.int64, device=v.device)
    return (v * st[:, None]).sum(0) + offset if len(sizes) else v.new_full((v.shape[1],), offset)


def _decode(keys: torch.Tensor, smap):
    """``(in_view, v)``: which base keys the view reaches, and their view positions (valid where
    in_view)."""
    sizes, strides, offset = smap
    r = keys - offset
    ok = r >= 0
    v = keys.new_zeros((len(sizes), keys.numel()))
    for d in sorted((d for d in range(len(sizes)) if sizes[d] > 1), key=lambda d: -strides[d]):
        q = torch.div(r, strides[d], rounding_mode="floor")
        ok &= q < sizes[d]
        v[d] = q
        r = r - q * strides[d]
    return ok & (r == 0), v


def _element_parts(V: SparseTensor):
    """V's stored elements one scalar each: ``(indices over all of V's dims, values (n,))``."""
    return scalar_parts(*coalesced_parts(V), V._dense_shape)


def _aligned(V: SparseTensor, base: SparseTensor, smap) -> bool:
    """The view keeps the base's dense dims as its own and moves whole dense slices."""
    D, nd = tuple(base._dense_shape), base.dense_dim()
    sizes, strides, offset = smap
    Q = max(_index.numel(D), 1)
    return (
        tuple(V._dense_shape) == D
        and tuple(strides[len(sizes) - nd :]) == tuple(_index.strides(D))[:nd]
        and offset % Q == 0
        and all(s % Q == 0 for s in strides[: len(sizes) - nd])
    )


def _fills_agree(V: SparseTensor, base: SparseTensor, smap) -> bool:
    """Cheap sufficient test that every position of V's region has V's fill equal to the base's
    there."""
    fV, fB = V._fill.reshape(-1), base._fill.reshape(-1)
    if not differs(fV, fV[:1]).any() and not differs(fB, fV[:1]).any():
        return True  # one value on both sides
    D = tuple(base._dense_shape)
    return _aligned(V, base, smap) and not differs(V._fill.expand(D), base._fill.expand(D)).any()


def _write_masked(V, base, smap, bs, bv, wkeys, wvals) -> None:
    """Indefinite fill: the region's elements are V's stored ones, nothing else.  Every dense slice
    must stay wholly specified or wholly unspecified (ValueError otherwise)."""
    D = tuple(base._dense_shape)
    Q = _index.numel(D)
    E = (bs[:, None] * Q + torch.arange(Q, device=bs.device)).reshape(-1)
    # specified after the write
    spec = (~_decode(E, smap)[0] | _index.lookup(wkeys, E)[1]).view(-1, Q)
    keep = spec.all(1)  # (the others: wholly in the region and not written, so dropped)
    ws, counts = torch.unique_consecutive(wkeys // Q, return_counts=True)
    fresh = ~_index.lookup(bs, ws)[1]
    if bool((spec.any(1) & ~keep).any()) or bool((counts[fresh] != Q).any()):
        raise ValueError(
            f"writing through a view ({V._view.func}) of a SparseTensor with indefinite fill and "
            f"dense dims {D}: a dense slice of the base would be left partly specified"
        )
    bs, bv = bs[keep], bv[keep]
    U, inv = _index.unique_inverse(torch.cat([bs, ws]))
    out = bv.new_zeros((U.numel(),) + D)
    out.index_copy_(0, inv[: bs.numel()], bv)
    out.view(-1)[inv[bs.numel() :].repeat_interleave(counts) * Q + wkeys % Q] = wvals
    assign_(
        base,
        parts_to_sparse(
            _index.unravel(U, base._sparse_shape),
            out,
            base.shape,
            base._fill,
            indefinite=True,
            layout=base._sf_layout,
            coalesced=True,
        ),
    )


def write_native(V: SparseTensor) -> bool:
    """Write view ``V`` back into its base on the stored elements; False when it cannot (the dense
    way then).

    With ``m`` the strided map and ``R`` the view's region, the new base is::

        base'[m(v)] = V[v]  for v in V         base'[k] = base[k]  for k not in R
    """
    base = V._view.base
    smap = strided_map(V)
    if smap is None or V._indefinite != base._indefinite:
        return False
    D = tuple(base._dense_shape)
    Q = _index.numel(D)
    if _index.numel(base.shape) > _index._INT64_MAX:
        return False
    if not V.numel():
        return True  # nothing written (below: Q >= 1)
    vi, wvals = _element_parts(V)
    wkeys = _encode(vi, smap)
    if not _index.is_sorted_unique(wkeys):  # (sorted runs merge in linear time in unique_inverse)
        wkeys, order = torch.sort(wkeys)
        wvals = wvals[order]
    bi, bv = coalesced_parts(base)
    bs = _index.linearize(bi, base._sparse_shape)
    if base._indefinite:
        _write_masked(V, base, smap, bs, bv, wkeys, wvals)
        return True
    fV = V._fill.expand(V._dense_shape).reshape(-1)
    ndv = V.dense_dim()
    extra = bs.new_zeros(0)
    # the region takes V's fill: specify where it differs from the base's
    if not _fills_agree(V, base, smap):
        n = V.numel()
        check_specify(
            f"a write through a view whose fill differs from its base's ({n} positions)",
            n,
            8 + V.element_size(),
        )
        allv = _index.unravel(torch.arange(n, device=bs.device), V.shape)
        keys = _encode(allv, smap)
        fv = fV[_index.linearize(allv[V.dim() - ndv :], V._dense_shape)]
        fb = base._fill.expand(D).reshape(-1)[keys % Q]
        extra = torch.unique(keys[differs(fv, fb)] // Q)

    # the region's elements of the stored slices `slots` take V's fill
    def region_takes_fill(flat, slots):
        inR, ev = _decode(
            (slots[:, None] * Q + torch.arange(Q, device=slots.device)).reshape(-1), smap
        )
        flat[inR] = fV[_index.linearize(ev[V.dim() - ndv :, inR], V._dense_shape)]

    if not extra.numel() and base._coalesced:
        pos, found = _index.lookup(bs, wkeys // Q)
        if bool(found.all()):  # the pattern stays: new values only
            out = bv.clone(memory_format=torch.contiguous_format)
            region_takes_fill(out.view(-1), bs)
            out.view(-1)[pos * Q + wkeys % Q] = wvals
            assign_(base, rewrap(base, values=out.reshape(base._vals.shape)))
            return True
    U, inv = _index.unique_inverse(torch.cat([bs, wkeys // Q, extra]))
    out = base._fill.expand((U.numel(),) + D).clone()
    out.index_copy_(0, inv[: bs.numel()], bv)
    region_takes_fill(out.view(-1), U)
    out.view(-1)[inv[bs.numel() : bs.numel() + wkeys.numel()] * Q + wkeys % Q] = wvals
    # the base's indices moved, the new ones unravelled
    idx = bi.new_empty((bi.shape[0], U.numel()))
    idx[:, inv[: bs.numel()]] = bi
    added = inv[bs.numel() :]
    idx[:, added] = _index.unravel(U[added], base._sparse_shape)
    new = parts_to_sparse(
        idx,
        out,
        base.shape,
        base._fill,
        known_zero=base._fill_is_zero(),
        layout=base._sf_layout,
        coalesced=True,
    )
    assign_(base, new)
    return True
