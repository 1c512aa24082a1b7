"""One registry: aten ``OpOverload`` -> handler ``(func, args, kwargs) -> result``.

A handler may return ``NotImplemented`` to hand the call to the next stage.  Order:
registered handler; the generic rule of ops tagged ``torch.Tag.pointwise`` (``pointwise.py``);
the op's CompositeImplicitAutograd decomposition (so the pieces
can meet their handlers); the densify fallback (``fallback.py``).  Around every call,
``views.py`` keeps SparseTensor views and their bases consistent.
"""

from __future__ import annotations

import torch

from .._tensor import _STATE, SparseTensor
from . import pointwise, views
from .fallback import flat_args, written_args

HANDLERS: dict = {}


def register(*ops):
    """Decorator: handle every given ``OpOverload`` (a packet registers all its overloads)."""
    def deco(fn):
        for op in ops:
            if isinstance(op, torch._ops.OpOverloadPacket):
                for name in op.overloads():
                    HANDLERS[getattr(op, name)] = fn
            else:
                HANDLERS[op] = fn
        return fn
    return deco


def _is_composite(func) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), torch._C.DispatchKey.CompositeImplicitAutograd)


def dispatch(func, types, args, kwargs):
    for A in _sparse_views(args, kwargs):
        views.sync(A)
    written = [A for A in written_args(func, args, kwargs) if A._view is not None]
    before = [{k: getattr(A, k) for k in _STATE[:-1]} for A in written]  # (in-place ops replace, never mutate)
    out = _compute(func, args, kwargs)
    if func.is_view and isinstance(args[0], SparseTensor):
        views.track(out, func, args, kwargs)
    for A, state in zip(written, before):
        try:
            views.write_through(A)
        except Exception:  # a failed call changes nothing: the view gets its old contents back
            for k, v in state.items():
                setattr(A, k, v)
            raise
    return out


def _sparse_views(args, kwargs):
    return [a for a in flat_args(args, kwargs) if isinstance(a, SparseTensor) and a._view is not None]


def _compute(func, args, kwargs):
    handler = HANDLERS.get(func)
    if handler is not None:
        out = handler(func, args, kwargs)
        if out is not NotImplemented:
            return out
    if pointwise.is_pointwise(func):
        out = pointwise.pointwise_rule(func, args, kwargs)
        if out is not NotImplemented:
            return out
    if _is_composite(func):
        out = func.decompose(*args, **kwargs)
        if out is not NotImplemented:
            return out
    from .fallback import densify_call
    return densify_call(func, args, kwargs)
