"""Views of a SparseTensor: results of view ops (``A[0]``, ``A.t()``, ``A.detach()``) remember their base.

A torch view shares memory with its base; a SparseTensor view is its own
SparseTensor, kept consistent both ways:

* a write to the view (any in-place or ``out=`` op on it) is written through to
  the base: ``view_op(dense(base)).copy_(dense(view))``, then the base is re-specified;
* a view whose base changed since it was taken is refreshed before it is read.

so that ``A[0] = 3.``, ``A[:, 1].fill_(0)`` and ``nn.Parameter(A)`` updates behave
as on ``A.to_dense()``.  Aliases (``detach``, ``alias``) just share storage.
"""

from __future__ import annotations

import torch

from .._convert import dense_of, map_inner, rewrap
from .._tensor import SparseTensor, _version
from .fallback import assign_, respecify_

aten = torch.ops.aten
ALIASES = (aten.detach.default, aten.alias.default)
INVOLUTIONS = {aten._conj.default: torch.conj_physical, aten._neg_view.default: torch.neg}  # their own inverse


def _state(A: SparseTensor):
    """What a view compares to see whether its base changed; inference tensors have no version
    counters, so their state never compares equal (the view is always refreshed)."""
    st = (_version(A), id(A._vals), _version(A._vals), id(A._fill), _version(A._fill), A._sf_layout)
    return object() if None in st else st


def track(out, func, args, kwargs) -> None:
    """Record ``base`` and the view op on each SparseTensor output of a view op."""
    base = args[0]
    outs = out if isinstance(out, (list, tuple)) else [out]
    for i, V in enumerate(outs):
        if isinstance(V, SparseTensor) and V is not base:
            V._view = (base, func, args[1:], kwargs, i if outs is out else None, _state(base))


def _replay(V: SparseTensor, base_dense: torch.Tensor) -> torch.Tensor:
    _, func, rest, kwargs, i, _ = V._view
    out = func(base_dense, *rest, **kwargs)
    return out if i is None else out[i]


def sync(V: SparseTensor) -> None:
    """Refresh ``V`` (a view) from its base if the base changed since."""
    base, func, rest, kwargs, i, state = V._view
    if base._view is not None:
        sync(base)
    now = _state(base)
    if now == state:
        return
    if func in ALIASES:
        assign_(V, rewrap(base))
    elif func in INVOLUTIONS:
        assign_(V, map_inner(base, INVOLUTIONS[func]))
    else:
        respecify_(V, _replay(V, dense_of(base)))
    V._view = (base, func, rest, kwargs, i, now)


def _copy_into(target: torch.Tensor, src: torch.Tensor, bd: torch.Tensor) -> None:
    """``target.copy_(src)``; for a self-overlapping view of ``bd`` (``expand``) write each location once."""
    if torch._debug_has_internal_overlap(target) != 1:
        target.copy_(src)
        return
    offsets = torch.arange(bd.numel(), device=bd.device).as_strided(
        target.shape, target.stride(), target.storage_offset() - bd.storage_offset())
    bd.view(-1)[offsets.reshape(-1)] = src.reshape(-1)


def write_through(V: SparseTensor) -> None:
    """Propagate a write to view ``V`` into its base (and on up the chain of bases)."""
    base, func, rest, kwargs, i, _ = V._view
    if func in ALIASES:
        assign_(base, rewrap(V))
    elif func in INVOLUTIONS:
        assign_(base, map_inner(V, INVOLUTIONS[func]))
    else:
        bd = dense_of(base)
        _copy_into(_replay(V, bd), dense_of(V), bd)
        respecify_(base, bd)
    if not base.is_inference():
        torch.autograd.graph.increment_version(base)
    V._view = (base, func, rest, kwargs, i, _state(base))
    if base._view is not None:
        write_through(base)
