"""Trace predicates and traceable forms of data-dependent kernels, on plain tensors.

``traced(t)`` says whether ``t`` is a tracing tensor (fake, functional or symbolic sizes) of
torch.compile; the kernels below branch on it to a form whose sizes depend on the shape only, or
that marks a data-dependent size as an unbacked symbol, so that the same code runs eagerly and
under ``torch.compile``::

    bincount(ids, n) == torch.bincount(ids, minlength=n)      (a scatter-add while traced)
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch


_FAKE = torch._C._TorchDispatchModeKey.FAKE


_FUNCTIONAL = torch._C._TorchDispatchModeKey.FUNCTIONAL


_dynamo_compiling, _compiler, _dispatch_mode = (
    torch.compiler.is_dynamo_compiling,
    torch.compiler,
    torch._C._get_dispatch_mode,
)


def traced(t=None) -> bool:
    """``t``'s data cannot be read on the host: torch.compile is compiling (dynamo tracing this
    code's bytecode, its fake propagation, AOTAutograd's trace) or a FakeTensorMode is active
    (torch.export, make_fx). Code that branches on data takes its general path then (correct either
    way).

    ``torch.compiler.is_compiling()``, read in two steps (cheaper per call than one call of
    it on a per-call path such as ``to_dense``): dynamo traces ``is_dynamo_compiling()`` as
    True, and eagerly it returns False at once; the compile session (AOTAutograd's trace, a backend)
    and torch.export set the flag ``is_compiling()`` returns, read here only when dynamo is not
    tracing (so no guard on it)."""
    return _dynamo_compiling() or _compiler._is_compiling_flag or _dispatch_mode(_FAKE) is not None


def known_true(cond: torch.Tensor) -> bool:
    """``bool(cond)`` on real data; False while tracing, so that a caller's fast path taken only
    when ``cond`` is known true gives way to its general path (correct either way) and reads no
    data."""
    return False if traced(cond) else bool(cond)


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a is b``; or, in AOTAutograd's trace, two functional wrappers of one tensor, neither
    written since: an inner tensor that two SparseTensor inputs share (a parameter's index tensor,
    held by its gradient or momentum buffer too) is one tensor in dynamo's fake propagation and one
    wrapper per input in AOTAutograd's trace, where a pattern test by identity alone found two
    patterns (a union of unbacked size written into the input: an error after dynamo had passed the
    op).  A write replaces a wrapper's tensor, so a written one is never taken for the other.

    >>> t = torch.arange(3)
    >>> same_tensor(t, t), same_tensor(t, t.clone())
    (True, False)
    """
    if a is b:
        return True
    ea, eb = (
        getattr(a, "elem", None),
        getattr(b, "elem", None),
    )  # (torch's FunctionalTensor wraps elem)
    if (
        ea is None
        or eb is None
        or not (torch._is_functional_tensor(ea) and torch._is_functional_tensor(eb))
    ):
        return False
    torch._sync(a)
    torch._sync(b)
    return torch._from_functional_tensor(ea) is torch._from_functional_tensor(eb)


def tracing_mode():
    """The active FakeTensorMode (torch.compile is tracing: dynamo's fake propagation, or
    AOTAutograd's trace when a functionalization mode is active too), else None."""
    return torch._C._get_dispatch_mode(_FAKE)


@contextlib.contextmanager
def data_dependent_sizes(env):
    """Inside sparsefill's code, ops whose output size depends on data (``nonzero``, ``unique``) and
    sizes read from data (``int(counts.sum())``) give unbacked sizes, also where dynamo compiles
    without ``fullgraph`` (it then refuses them, a graph break at every such handler: five per GAT
    layer step).  Where they made an unbacked size the setting stays on for the rest of the
    compilation (as ``fullgraph=True`` sets it): inductor propagates the graph's ``nonzero`` again
    when it lowers it (DynamicOutputShapeException otherwise)."""
    if env is None or env.allow_dynamic_output_shape_ops and env.allow_scalar_outputs:
        yield
        return
    settings, n0 = env.settings, env.unbacked_symint_counter
    env.settings = dataclasses.replace(
        settings, allow_dynamic_output_shape_ops=True, allow_scalar_outputs=True
    )
    try:
        yield
    finally:
        if env.unbacked_symint_counter == n0:
            env.settings = settings


def dynamic_sizes():
    """:func:`data_dependent_sizes` for the active FakeTensorMode (nothing in eager): for sparsefill
    code that torch.compile traces outside a handler's dispatch, e.g. an autograd.Function's
    backward in AOTAutograd's trace."""
    mode = tracing_mode()
    return data_dependent_sizes(mode.shape_env if mode is not None else None)


def new_dynamic_size() -> torch.SymInt:
    """``torch.library.get_ctx().new_dynamic_size()`` in a custom op's fake implementation (an
    unbacked size: a count the data decide), also where dynamo compiles without ``fullgraph`` (its
    fake run of the op is then refused: a graph break at every such op, "Dynamic shape operator"),
    as in a handler (:func:`data_dependent_sizes`)."""
    ctx = torch.library.get_ctx()
    with data_dependent_sizes(ctx._shape_env):
        return ctx.new_dynamic_size()


def traced_dispatch(dispatch, mode, func, types, args, kwargs):
    """``dispatch(func, types, args, kwargs)`` on tracing tensors.

    * Sizes that depend on data (``unique``, ``nonzero``) inside a handler are unbacked symbols;
      those that do not reach the result (the slices of a reduction, say) may stay unbound.
    * During dynamo's fake propagation (no functionalization yet) a handler that cannot run on fake
      tensors is a graph break, never an error: dynamo then runs the op eagerly, where it gives the
      eager result (or raises the eager error).  In AOTAutograd's trace, after dynamo, errors are
      raised.
    """
    env = mode.shape_env
    n0 = len(env.pending_fresh_unbacked_symbols) if env is not None else 0
    try:
        with data_dependent_sizes(env):
            out = dispatch(func, types, args, kwargs)
    except Exception as e:
        from torch._dynamo.exc import Unsupported, unimplemented

        if isinstance(e, Unsupported) or torch._C._get_dispatch_mode(_FUNCTIONAL) is not None:
            raise
        unimplemented(
            gb_type="sparsefill: SparseTensor op not traceable",
            context=str(func),
            explanation=f"sparsefill's handler of {func} on a SparseTensor does not trace ("
            f"{type(e).__name__}: {e}); the op runs eagerly",
            hints=["Report it to sparsefill with the op and its arguments."],
            from_exc=e,
        )
    if env is not None:
        env.ignorable_fresh_unbacked_symbols.extend(env.pending_fresh_unbacked_symbols[n0:])
    return out


def bincount(ids: torch.Tensor, minlength: int) -> torch.Tensor:
    """``torch.bincount(ids, minlength=minlength)`` for ``ids`` in ``[0, minlength)``; while tracing
    a scatter-add, whose size is known (bincount's depends on ``ids.max()``: an unbacked size).

    >>> bincount(torch.tensor([2, 0, 2]), 4).tolist()
    [1, 0, 2, 0]
    """
    if not traced(ids):
        return torch.bincount(ids, minlength=minlength)
    return ids.new_zeros(minlength, dtype=torch.int64).index_add_(
        0, ids, torch.ones_like(ids, dtype=torch.int64)
    )


def unique_consecutive(keys: torch.Tensor, return_counts: bool = False):
    """``torch.unique_consecutive(keys, return_inverse=True[, return_counts=True])`` of 1-D ``keys``
    by a comparison of neighbours, a cumsum and a ``nonzero`` (an unbacked size): traceable by
    inductor, which lowers
    no ``unique_consecutive`` (DynamicOutputShapeException)::

        new[i] = i == 0 or keys[i] != keys[i - 1]      inverse = cumsum(new) - 1     out = keys[new]

    >>> [
    ...     t.tolist()
    ...     for t in unique_consecutive(torch.tensor([3, 3, 5, 7, 7, 7]), return_counts=True)
    ... ]
    [[3, 5, 7], [0, 0, 1, 2, 2, 2], [2, 1, 3]]
    """
    new = torch.ones_like(keys, dtype=torch.bool)
    new[1:] = keys[1:] != keys[:-1]
    starts = new.nonzero().squeeze(1)
    out = (keys[starts], new.cumsum(0) - 1)
    if not return_counts:
        return out
    return out + (torch.diff(starts, append=starts.new_full((1,), keys.numel())),)


@contextlib.contextmanager
def inner_sizes():
    """While traced (nothing in eager), for sparsefill code that torch.compile runs as one node of
    its graph (a function recorded whole, a SparseTensor method such as ``to_sparse_csr`` that
    dynamo calls on fake tensors): sizes that depend on data are unbacked
    (:func:`data_dependent_sizes`), and those that do not reach the result (a coalesce's count
    before a conversion) may stay unbound, as inside a handler (:func:`traced_dispatch`; dynamo's
    unnamed PendingUnbackedSymbolNotFound otherwise)."""
    mode = tracing_mode()
    env = mode.shape_env if mode is not None else None
    n0 = len(env.pending_fresh_unbacked_symbols) if env is not None else 0
    with data_dependent_sizes(env):
        yield
    if env is not None:
        env.ignorable_fresh_unbacked_symbols.extend(env.pending_fresh_unbacked_symbols[n0:])
