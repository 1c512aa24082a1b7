"""torch.compile support: what AOTAutograd asks of a traceable wrapper subclass beyond flatten/unflatten.

A SparseTensor output of a compiled function that requires grad gets its gradient (the *tangent*) from
whatever runs after it; the backward graph was traced for a tangent with the output's flatten metadata
``(layout, indefinite, coalesced)``.  :func:`coerce_tangent` brings a runtime tangent to that form
without changing the dense tensor it stands for::

    dense_of(coerce_tangent(G, meta)) == dense_of(G)

(an uncoalesced tangent is coalesced, a COO one becomes CSR or back; a coalesced tangent may stand where
an uncoalesced one was traced).  A definite gradient of an indefinite output keeps only the positions
the output specifies: the others have no value, so no gradient.

>>> import torch, sparsefill
>>> G = sparsefill.sparse_coo_tensor([[2, 0, 2]], [1., 2., 3.], (4,), fill_value=0.5)
>>> coerce_tangent(G, (torch.sparse_coo, False, True), None).to_dense()
tensor([2.0000, 0.5000, 4.0000, 0.5000])
"""

from __future__ import annotations

import torch



def traced(t) -> bool:
    """``t`` is a tracing tensor (FakeTensor, or a FunctionalTensor over one: torch.compile, torch.export)
    whose data cannot be read on the host."""
    if type(t) is torch.Tensor or not isinstance(t, torch.Tensor):
        return False
    from torch._subclasses.fake_tensor import is_fake
    return is_fake(t)


def known_true(cond: torch.Tensor) -> bool:
    """``bool(cond)`` on real data; False while tracing, so that a caller's fast path taken only when
    ``cond`` is known true gives way to its general path (correct either way) and reads no data."""
    return False if traced(cond) else bool(cond)


_FAKE = torch._C._TorchDispatchModeKey.FAKE
_FUNCTIONAL = torch._C._TorchDispatchModeKey.FUNCTIONAL


def tracing_mode():
    """The active FakeTensorMode (torch.compile is tracing: dynamo's fake propagation, or AOTAutograd's
    trace when a functionalization mode is active too), else None."""
    return torch._C._get_dispatch_mode(_FAKE)


def traced_dispatch(dispatch, mode, func, types, args, kwargs):
    """``dispatch(func, types, args, kwargs)`` on tracing tensors.

    * Sizes that depend on data (``unique``, ``nonzero``) inside a handler are unbacked symbols; those
      that do not reach the result (the slices of a reduction, say) may stay unbound.
    * During dynamo's fake propagation (no functionalization yet) a handler that cannot run on fake
      tensors is a graph break, never an error: dynamo then runs the op eagerly, where it gives the eager
      result (or raises the eager error).  In AOTAutograd's trace, after dynamo, errors are raised.
    """
    env = mode.shape_env
    n0 = len(env.pending_fresh_unbacked_symbols) if env is not None else 0
    try:
        out = dispatch(func, types, args, kwargs)
    except Exception as e:
        from torch._dynamo.exc import Unsupported, unimplemented
        if isinstance(e, Unsupported) or torch._C._get_dispatch_mode(_FUNCTIONAL) is not None:
            raise
        unimplemented(gb_type="sparsefill: SparseTensor op not traceable", context=str(func),
                      explanation=f"sparsefill's handler of {func} on a SparseTensor does not trace ("
                                  f"{type(e).__name__}: {e}); the op runs eagerly",
                      hints=["Report it to sparsefill with the op and its arguments."], from_exc=e)
    if env is not None:
        env.ignorable_fresh_unbacked_symbols.extend(env.pending_fresh_unbacked_symbols[n0:])
    return out


def bincount(ids: torch.Tensor, minlength: int) -> torch.Tensor:
    """``torch.bincount(ids, minlength=minlength)`` for ``ids`` in ``[0, minlength)``; while tracing a
    scatter-add, whose size is known (bincount's depends on ``ids.max()``: an unbacked size).

    >>> bincount(torch.tensor([2, 0, 2]), 4).tolist()
    [1, 0, 2, 0]
    """
    if not traced(ids):
        return torch.bincount(ids, minlength=minlength)
    return ids.new_zeros(minlength, dtype=torch.int64).index_add_(0, ids, torch.ones_like(ids, dtype=torch.int64))


def coerce_tangent(G, meta, expected_type=None):
    """``G`` with the flatten metadata ``meta`` (see the module docstring); None where no exact form exists."""
    from ._convert import rewrap, to_layout
    from ._tensor import SparseTensor
    if expected_type is not None and expected_type is not SparseTensor:
        return None  # a SparseTensor gradient of a dense output: AOTAutograd raises its own clear error
    layout, indefinite, coalesced = meta[:3]
    G = G._sync()
    if G._indefinite and not indefinite:
        return None  # no value at the unspecified positions: not a gradient of a definite output
    if G._sf_layout is not layout:
        G = to_layout(G, layout)
    elif coalesced and not G._coalesced:
        G = G.coalesce()
    if not coalesced and G._coalesced and layout is torch.sparse_coo:
        G = rewrap(G, coalesced=False)
    if indefinite and not G._indefinite:
        G = rewrap(G, fill=G._vals.new_empty(0), indefinite=True, known_zero=False)
    return G
