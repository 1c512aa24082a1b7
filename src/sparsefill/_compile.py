"""torch.compile support: tracing helpers for the handlers, and what AOTAutograd asks of a traceable
wrapper subclass beyond flatten/unflatten.

A SparseTensor output of a compiled function that requires grad gets its gradient (the *tangent*)
from whatever runs after it, of any pattern.  AOTAutograd traces the backward once, for a tangent
whose inner sizes it takes from the traced one, so the tangent is traced, and every runtime gradient
converted, in the all-stored form (:func:`all_stored`, nse = the numel of the sparse dims: O(numel)
per backward)::

    dense_of(coerce_tangent(G, meta)) == dense_of(G)

A gradient that arrives as a dense tensor (``out.backward(G)``, a dense loss of ``out`` computed
eagerly) is converted as well: torch.Tensor gets ``__coerce_same_metadata_as_tangent__``
(:func:`_coerce_plain_tangent`, for a SparseTensor tangent only) when torch._dynamo loads.

>>> import torch, sparsefill
>>> G = sparsefill.sparse_coo_tensor([[2, 0, 2]], [1., 2., 3.], (4,), fill_value=0.5)
>>> T = coerce_tangent(G, (torch.sparse_coo, False, True, ALL_STORED))
>>> T._nse(), T.to_dense()
(4, tensor([2.0000, 0.5000, 4.0000, 0.5000]))
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.machinery
import sys

import torch

_FAKE = torch._C._TorchDispatchModeKey.FAKE
_FUNCTIONAL = torch._C._TorchDispatchModeKey.FUNCTIONAL


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


_dynamo_compiling, _compiler, _dispatch_mode = (
    torch.compiler.is_dynamo_compiling,
    torch.compiler,
    torch._C._get_dispatch_mode,
)


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


def every_element(x: torch.Tensor, layout, dense_dim: int):
    """The dense ``x`` as a SparseTensor of ``layout`` with every element stored (fill 0,
    coalesced), differentiable: while traced, a result that is dense by nature is kept in this form,
    whose sizes depend on the shape only (``to_sparse`` would store the elements that differ from
    the fill: a count read from
    the data, an unbacked size)::

        every_element(x, layout, dense_dim).to_dense() == x

    >>> every_element(torch.tensor([[0., 2.], [3., 0.]]), torch.sparse_csr, 0)._nse()
    4
    """
    from . import _index
    from ._creation import sparse_coo_tensor, sparse_csr_tensor

    sd = x.dim() - dense_dim
    S, D = tuple(x.shape[:sd]), tuple(x.shape[sd:])
    N = _index.numel(S)
    zero = x.new_zeros(())
    if layout is torch.sparse_coo or sd < 2:
        idx = _index.unravel(torch.arange(N, device=x.device), S)
        return sparse_coo_tensor(
            idx, x.reshape((N,) + D), x.shape, fill_value=zero, is_coalesced=True
        )
    batch, (m, n) = S[:-2], S[-2:]
    crow = (torch.arange(m + 1, device=x.device) * n).expand(batch + (m + 1,))
    col = torch.arange(n, device=x.device).repeat(m).expand(batch + (m * n,))
    return sparse_csr_tensor(crow, col, x.reshape(batch + (m * n,) + D), x.shape, fill_value=zero)


# the 4th entry of the flatten metadata of a tangent in the all-stored form (5th: dense dims)
ALL_STORED = "all-stored"


def all_stored(G, layout=None):
    """``G`` with every element of its sparse dims stored (row-major, coalesced), in ``layout``
    (default G's), flagged as a tangent: ``dense_of(all_stored(G)) == dense_of(G)``; an indefinite
    ``G``'s masked-out elements (no gradient) become 0.  Its sizes depend on the shape only (nse =
    the sparse dims' numel; the fill, which no element reads, a 0-d zero: a gradient's fill may be
    an array over the dense dims)."""
    from ._convert import dense_of

    layout = G._sf_layout if layout is None else layout
    X = dense_of(G, G._vals.new_zeros(tuple(G._dense_shape)) if G._indefinite else None)
    # (read by no element: a 0-d zero)
    fill = G._vals.new_empty(0) if G._indefinite else G._vals.new_zeros(())
    return _all_stored_of(X, len(G._dense_shape), layout, fill, G._indefinite)


def _all_stored_of(X: torch.Tensor, dense_dims: int, layout, fill: torch.Tensor, indefinite: bool):
    """The dense ``X`` as a tangent in the all-stored form of ``layout`` (see
    :func:`all_stored`)."""
    from . import _index
    from ._tensor import SparseTensor

    S, D = tuple(X.shape[: X.dim() - dense_dims]), tuple(X.shape[X.dim() - dense_dims :])
    N = _index.numel(S)
    vals = X.reshape((N,) + D)
    if layout is torch.sparse_coo:
        idx = _index.unravel(torch.arange(N, device=X.device), S)
        out = SparseTensor(
            layout, X.shape, vals, fill, indices=idx, indefinite=indefinite, coalesced=True
        )
    else:
        batch, (m, n) = S[:-2], S[-2:]
        crow = (torch.arange(m + 1, device=X.device) * n).expand(batch + (m + 1,))
        col = torch.arange(n, device=X.device).repeat(m).expand(batch + (m * n,))
        out = SparseTensor(
            layout,
            X.shape,
            vals.reshape(batch + (m * n,) + D),
            fill,
            crow=crow,
            col=col,
            indefinite=indefinite,
        )
    out._tangent = True
    return out


def coerce_tangent(G, meta, expected_type=None):
    """``G`` in the form of the tangent AOTAutograd traced, flatten metadata ``meta``: the
    all-stored form (:func:`all_stored`) of the expected layout.  The backward graph was traced for
    a tangent of sizes known from the output's shape, whatever pattern the runtime gradient has.
    ``G`` may be a SparseTensor of any pattern or a dense tensor (a dense loss computed outside the
    compiled function: its values are the all-stored form's, fill 0).  None where no exact form
    exists (a SparseTensor gradient of a dense output: AOTAutograd's own error)."""
    from ._tensor import SparseTensor

    if (
        expected_type is not None
        and expected_type is not SparseTensor
        or len(meta) < 4
        or meta[3] != ALL_STORED
    ):
        return None
    layout, indefinite = meta[:2]
    if not isinstance(G, SparseTensor):  # a dense gradient (shape and dtype checked by autograd)
        zero = G.new_zeros(())
        return _all_stored_of(
            G,
            meta[4] if len(meta) > 4 else 0,
            layout,
            G.new_empty(0) if indefinite else zero,
            indefinite,
        )
    G = all_stored(G._sync(), layout)
    # (a definite gradient of a masked output: the masked-out values are unused)
    if indefinite != G._indefinite:
        G._indefinite, G._fill = (
            indefinite,
            G._vals.new_empty(0) if indefinite else G._vals.new_zeros(()),
        )
    return G


def _coerce_plain_tangent(self, expected_metadata, expected_type=None):
    """``torch.Tensor.__coerce_same_metadata_as_tangent__`` (installed when torch._dynamo loads,
    where torch.Tensor has none): a dense gradient of a compiled function's SparseTensor output
    (``out.backward(G)``, a dense loss of ``out`` computed eagerly) in the all-stored form its
    compiled backward was traced for; None (AOTAutograd's own error, as without this method) for any
    other expected type."""
    from ._tensor import SparseTensor

    if expected_type is not SparseTensor or isinstance(self, SparseTensor):
        return None
    return coerce_tangent(self, expected_metadata, expected_type)


# ---------------------------------------------------------------------- entry points dynamo records
# whole Python functions of sparsefill that dynamo cannot trace line by line (they call SparseTensor
# methods that return metadata, which dynamo puts in its graph as ops, or hold locks): each is
# replaced in dynamo's view (``substitute_in_graph``) by a wrapper that ``allow_in_graph`` makes one
# node of dynamo's graph, run on fake tensors to propagate shapes (:func:`_recorded_whole`);
# AOTAutograd then traces into it (its autograd.Functions included).  Registered when torch._dynamo
# is first imported, never importing it (3 s of a cold start).
_IN_GRAPH = {
    "sparsefill": ("sparse_coo_tensor", "sparse_csr_tensor"),
    "sparsefill.masked": (
        "sum",
        "prod",
        "cumsum",
        "cumprod",
        "amax",
        "amin",
        "argmax",
        "argmin",
        "mean",
        "median",
        "norm",
        "var",
        "std",
        "logsumexp",
        "logaddexp",
        "softmax",
        "log_softmax",
        "softmin",
        "normalize",
    ),
}


_INDEFINITE = (
    "sparsefill.indefinite"  # the indefinite fill as it enters dynamo's graph (see _as_constant)
)


def _as_constant(x):
    """``x``, the ``sparsefill.indefinite`` sentinel as the string :data:`_INDEFINITE`: dynamo
    passes a string to an ``allow_in_graph`` function as a constant, an object of sparsefill's own
    class not at all ('Failed to convert args/kwargs to proxy', a graph break; with
    ``fullgraph=True`` that unnamed error).  Traced by dynamo."""
    return _INDEFINITE if type(x) is _Indefinite else x


def _from_constant(x):
    """``x``, :data:`_INDEFINITE` as the sentinel again (the inverse of :func:`_as_constant`)."""
    return _indefinite if isinstance(x, str) and x == _INDEFINITE else x


_Indefinite = _indefinite = (
    None  # (sparsefill._creation's sentinel and its class, set on registration)
)


def _recorded_whole(fn):
    """``fn`` as dynamo's graph records it (one node; dynamo calls it in place of ``fn``): while
    traced, the sizes that depend on data inside it and do not reach its result (the slices of a
    softmax, a coalesce's count) may stay unbound, as inside a handler (:func:`traced_dispatch`).
    Its arguments arrive with the indefinite fill as a constant (:func:`_as_constant`)."""
    import functools

    @functools.wraps(fn)
    def run(*args, **kwargs):
        args = tuple(_from_constant(a) for a in args)
        kwargs = {k: _from_constant(v) for k, v in kwargs.items()}
        with inner_sizes():
            return fn(*args, **kwargs)

    return run


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


def _register_with_dynamo() -> None:
    """The :data:`_IN_GRAPH` functions recorded whole; sparsefill's other code inlined when traced
    code calls it (as torch's own modules) but never compiled as a frame of its own: after a graph
    break sparsefill runs eagerly, where dynamo would otherwise try (and fail, slowly) to compile
    each of its functions."""
    import importlib
    import os

    global _Indefinite, _indefinite
    from ._creation import _Indefinite, indefinite as _indefinite

    dynamo = sys.modules["torch._dynamo"]
    for module, names in _IN_GRAPH.items():
        mod = importlib.import_module(module)
        for name in names:
            fn = getattr(mod, name)
            run = dynamo.allow_in_graph(_recorded_whole(fn))
            dynamo.substitute_in_graph(fn, skip_signature_check=True)(
                lambda *a, _run=run, **k: _run(
                    *(_as_constant(x) for x in a), **{n: _as_constant(x) for n, x in k.items()}
                )
            )
    # (AOTAutograd asks a plain tangent)
    if not hasattr(torch.Tensor, "__coerce_same_metadata_as_tangent__"):
        torch.Tensor.__coerce_same_metadata_as_tangent__ = _coerce_plain_tangent
    rules = dynamo.trace_rules
    rules.BUILTIN_INLINE_WHEN_CALLED.add(os.path.dirname(os.path.abspath(__file__)) + os.sep)
    rules.add("sparsefill")
    # sparsefill's kernels are compiled lazily, also while a compiled frame's backward runs eagerly:
    # dynamo failed on numba's dispatcher frames ("exception table entry start instruction")
    rules.add("numba")
    _bind_shared_symbols_in_order(sys.modules["torch._dynamo.output_graph"].SubgraphTracer)
    _REGISTERED.append(True)
    while _ON_DYNAMO:
        _ON_DYNAMO.pop(0)()


def _bind_shared_symbols_in_order(tracer_cls) -> None:
    """Dynamo binds a dynamic size of a SparseTensor it puts in its graph as an attribute (an
    optimizer's parameter: a static address) lazily, by a ``getattr(p, "_idx")`` node made when
    first needed.  When another input shares that inner tensor (``p.grad`` or ``p``'s momentum
    buffer holds ``p``'s index tensor: sparsefill shares the pattern of same-pattern results) it is
    needed while dynamo creates the other input's placeholder, and made there: before ``p``'s own
    node, an invalid graph (InternalTorchDynamoError "Argument 'p' of Node 'getattr_1' was used
    before it has been defined" after a graph break in ``optimizer.step``).  The binding nodes are
    made at the graph's end instead, after ``p`` (they read only ``p``'s sizes; the placeholder
    itself uses none of them)."""
    lookup = getattr(tracer_cls, "lookup_unbound_symbols", None)
    if lookup is None or getattr(lookup, "_sparsefill", False):
        return

    def lookup_unbound_symbols(self, s):
        with self.graph.inserting_after(None):  # (None: the end of the graph)
            return lookup(self, s)

    lookup_unbound_symbols._sparsefill = True
    tracer_cls.lookup_unbound_symbols = lookup_unbound_symbols


class _DynamoImportHook:
    """A ``sys.meta_path`` finder that runs :func:`_register_with_dynamo` right after
    ``torch._dynamo`` is imported (it finds nothing itself, and removes itself)."""

    def find_spec(self, name, path, target=None):
        if name != "torch._dynamo":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _register_with_dynamo()

        spec.loader.exec_module = exec_module
        return spec


_ON_DYNAMO: list = []  # callbacks run once torch._dynamo is loaded (see when_dynamo_loads)


def when_dynamo_loads(callback) -> None:
    """Run ``callback()`` once ``torch._dynamo`` is imported (now, if it is): code that needs
    dynamo's decorators (``torch.compiler.disable`` imports it, 3 s of a cold start) without
    importing it itself."""
    if "torch._dynamo" in sys.modules and _REGISTERED:
        callback()
    else:
        _ON_DYNAMO.append(callback)


_REGISTERED: list = []


def _install() -> None:
    if "torch._dynamo" in sys.modules:
        _register_with_dynamo()
    else:
        sys.meta_path.insert(0, _DynamoImportHook())
