"""Autograd for constructors and conversions.

Gradients have dense semantics (the gradient of ``A`` is the gradient of ``A.to_dense()``).  For
``A`` built from ``values`` and ``fill`` with pattern ``P`` and upstream gradient ``G``::

    grad_values[n] = G[indices[:, n]]                     (each stored element, duplicates included)
    grad_fill      = sum(G[i] for i not in P), summed to fill's shape

Conversions that keep the dense tensor (coalesce, layout or fill change,
to_sparse) pass ``G`` through, converted to the input's kind.

Gradient types (torch's contract): a dense input's gradient is dense (``DenseGrad`` in
``ops/autograd_routes.py``); a SparseTensor leaf's ``.grad`` is a SparseTensor of its layout and
dense dims, the gradient represented exactly (:func:`leaf_grad`, run before accumulation by
:class:`LeafGradHook`, registered when the leaf starts requiring grad); a SparseTensor ``G`` with an
indefinite fill is 0 at its masked-out elements (no output read them).  The matrix products give
``A`` a SparseTensor gradient with ``A``'s pattern whose fill is the mean of the dense gradient over
the unspecified elements (``ops/linalg/backward.py``): ``grad_parts`` reads it in O(nse) when it
stores exactly ``A``'s elements.
"""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as _fwad

from sparsefill._tensor import parts as _convert
from sparsefill._kernels import index as _index
from sparsefill._kernels.trace import dynamic_sizes, traced
from sparsefill._tensor.dense_dims import coarser, to_dense_dim
from sparsefill._tensor.tensor import SparseTensor, install_hooks


def _pattern(A: SparseTensor) -> SparseTensor:
    """A graph-free SparseTensor sharing ``A``'s storage (safe to keep in ``ctx``)."""
    return _convert.rewrap(unwrapped(A))


def unwrapped(t):
    """``t`` without torch.func's wrappers (``setup_context`` under ``torch.func.grad``/``vjp``
    receives its inputs and output wrapped at the transform's level): the SparseTensor inside."""
    is_wrapped, get = (
        torch._C._functorch.is_functorch_wrapped_tensor,
        torch._C._functorch.get_unwrapped,
    )
    while isinstance(t, torch.Tensor) and not isinstance(t, SparseTensor) and is_wrapped(t):
        t = get(t)
    return t


def inner_unwrapped(out):
    """``out`` (an autograd.Function's forward result) with plain inner tensors: under
    torch.func.grad the tensors made inside the transform (index tensors, a fill) are wrapped at its
    level, which is not active where the SparseTensor's ops run; the forward's are constants of the
    transform (no gradient)."""
    if not isinstance(out, SparseTensor):
        return out
    inner = (out._idx, out._crow, out._col, out._vals, out._fill)
    if not any(t is not None and torch._C._functorch.is_functorch_wrapped_tensor(t) for t in inner):
        return out
    return _convert.rewrap(
        out,
        indices=unwrapped(out._idx),
        crow=unwrapped(out._crow),
        col=unwrapped(out._col),
        values=unwrapped(out._vals),
        fill=unwrapped(out._fill),
    )


def sparse_inside(G):
    """A backward's gradient ``G``, or the SparseTensor inside it when torch.func wrapped one (then
    read as the SparseTensor it is: its pattern and fill, never indexed through the wrapper as if
    dense)."""
    if (
        isinstance(G, SparseTensor)
        or not isinstance(G, torch.Tensor)
        or not torch._C._functorch.is_functorch_wrapped_tensor(G)
    ):
        return G
    U = unwrapped(G)
    return U if isinstance(U, SparseTensor) else G


def grad_parts(G, P: SparseTensor):
    """``(grad_values, grad_fill)`` of the constructor of ``P`` for upstream gradient ``G``."""
    S, D = P._sparse_shape, tuple(P._dense_shape)
    # masked out: no output read them, their gradient is 0
    if isinstance(G, SparseTensor) and G._indefinite:
        G = _convert.rewrap(G, fill=G._vals.new_zeros(()), indefinite=False, known_zero=True)
    # e.g. select_backward on a dense dim
    if isinstance(G, SparseTensor) and G._sparse_ndim() > len(S):
        G = coarser(G, len(D))  # (its trailing sparse dims made dense, exactly: O(nse * slice))
    elif isinstance(G, SparseTensor) and G._sparse_ndim() < len(S):  # or on the last sparse dim
        return _grad_parts_of_hybrid(G, P)
    gv = _values_on_pattern(G, P) if isinstance(G, SparseTensor) else None
    if gv is not None:  # e.g. from ops/linalg/backward.py: no lookup
        gv = gv.reshape(P._vals.shape)
        if P._indefinite:
            return gv, None
        # (every batch of a batched CSR)
        stored = _index.numel(P._vals.shape[: P._vals.dim() - len(D)])
        return gv, _times_count(G._fill.expand(D), _index.numel(S) - stored).sum_to_size(
            P._fill.shape
        )
    idx, _ = P._coo_parts()
    keys = _index.linearize(idx, S)
    gv = _convert.values_at(G, keys, len(S)).reshape(P._vals.shape)
    if P._indefinite:
        return gv, None
    # (traced: an unbacked size, also in AOTAutograd's trace of this backward)
    with dynamic_sizes():
        ukeys = torch.unique(keys)
    if isinstance(G, SparseTensor):
        gidx, gvals = _convert.coalesced_parts(G)
        gkeys = _index.linearize(gidx, S)
        if traced():  # (the count as a tensor: no value read while torch.compile traces)
            outside = ~_index.lookup(ukeys, gkeys)[1]
            n = _index.numel(S) - ukeys.numel() - outside.sum()
            f = G._fill.expand(D)
            gf = torch.where(outside.view((-1,) + (1,) * len(D)), gvals, 0).sum(0) + torch.where(
                n > 0, f * n, 0
            ).to(f.dtype)
            return gv, gf.sum_to_size(P._fill.shape)
        # (P's distinct positions among G's: O(nse(P) log nse(G)))
        pos, found = _index.lookup(gkeys, ukeys)
        inside = torch.zeros_like(gkeys, dtype=torch.bool).index_fill_(0, pos[found], True)
        n_both_unspecified = _index.numel(S) - ukeys.numel() - (gkeys.numel() - int(found.sum()))
        gf = gvals.masked_fill(inside.view((-1,) + (1,) * len(D)), 0).sum(0) + _times_count(
            G._fill.expand(D), n_both_unspecified
        )
    else:
        at = torch.zeros((_index.numel(S),) + (1,) * len(D), dtype=torch.bool, device=G.device)
        at[ukeys] = (
            True  # (one masked pass: boolean indexing ran nonzero and a gather over the whole G)
        )
        gf = G.reshape((_index.numel(S),) + D).masked_fill(at, 0).sum(0)
    return gv, gf.sum_to_size(P._fill.shape)


def sum_outside(G, idx: torch.Tensor, shape, dense_shape) -> torch.Tensor:
    """``G`` (dense or a SparseTensor of ``shape``) summed over the positions of its leading
    ``idx.shape[0]`` dims that are not among ``idx``'s columns: shape ``dense_shape``.  Each term is
    summed as it is (an inf there gives inf, as the dense sum), never as the total less the part at
    ``idx`` (``inf - inf``: NaN).

    >>> sum_outside(
    ...     torch.tensor([1.0, float("inf"), 2.0, 4.0]), torch.tensor([[1, 2]]), (4,), ()
    ... ).item()
    5.0
    """
    D = tuple(dense_shape)
    z = torch.zeros((), dtype=G.dtype, device=G.device)
    P = _convert.parts_to_sparse(
        idx, z.expand((idx.shape[1],) + D), tuple(shape), z.expand(D).clone()
    )
    return grad_parts(G, P)[1]


def _grad_parts_of_hybrid(G: SparseTensor, P: SparseTensor):
    """:func:`grad_parts` for ``G`` (defined fill) with fewer sparse dims ``g`` than ``P``: ``P``'s
    dims ``g..`` are dense in ``G``.  Exact with no conversion: a stored position of ``P`` reads
    ``G``'s slice or fill; the unspecified elements sum ``G``'s stored slices less ``P``'s positions
    in them (a masked sum) and, per slot ``j`` of those dims, the fill times the count of ``G``'s
    unspecified slices without ``P`` at ``j``.  O(G's stored slices + P's stored elements)."""
    S, D = P._sparse_shape, tuple(P._dense_shape)
    g = G._sparse_ndim()
    idx, _ = P._coo_parts()
    outer, inner = _index.linearize(idx[:g], S[:g]), _index.linearize(idx[g:], S[g:])
    gidx, gvals = _convert.coalesced_parts(G)
    M = _index.numel(S[g:])
    gvals, fill = gvals.reshape((-1, M) + D), G._fill.expand(G._dense_shape).reshape((M,) + D)
    pos, found = _index.lookup(_index.linearize(gidx, S[:g]), outer)
    gv = torch.where(
        found.view((-1,) + (1,) * len(D)),
        gvals[pos.clamp(max=max(gvals.shape[0] - 1, 0)), inner] if gvals.shape[0] else fill[inner],
        fill[inner],
    ).reshape(P._vals.shape)
    if P._indefinite:
        return gv, None
    ukeys = torch.unique(outer * M + inner)  # (P's distinct positions)
    uo, ui = ukeys // M, ukeys % M
    upos, ufound = _index.lookup(_index.linearize(gidx, S[:g]), uo)
    at = torch.zeros(gvals.shape[:2], dtype=torch.bool, device=gvals.device)
    at[upos[ufound], ui[ufound]] = True
    gf = gvals.masked_fill(at.view(at.shape + (1,) * len(D)), 0).sum((0, 1))
    # G's unspecified slices, less those where P has j
    n_rows = _index.numel(S[:g]) - gvals.shape[0]
    count = n_rows - torch.bincount(ui[~ufound], minlength=M)
    gf = gf + torch.where(
        count.view((-1,) + (1,) * len(D)) > 0,
        count.view((-1,) + (1,) * len(D)) * fill,
        torch.zeros((), dtype=fill.dtype),
    ).sum(0)
    return gv, gf.sum_to_size(P._fill.shape)


def dense_grad(G: SparseTensor, what: str = "a gradient read as a dense tensor") -> torch.Tensor:
    """``G``'s dense form, an indefinite fill read as 0 (a gradient's masked-out elements carry
    none), through the densify gate: a gradient whose consumer is dense is dense by nature (quiet
    under the default policy)."""
    if G.numel() > 1:  # (one element: a number, as the 0-d conversions elsewhere)
        _convert.check_densify_quiet(G, what)
    # (differentiable where a graph is recorded: create_graph)
    return to_dense(G, 0 if G._indefinite else None)


def _times_count(f: torch.Tensor, n: int) -> torch.Tensor:
    """``f`` summed over ``n`` elements: ``f * n``, and 0 for ``n == 0`` whatever ``f`` (NaN * 0
    would be NaN where no element contributes: a fully stored input's fill has gradient 0)."""
    return f * n if n else torch.zeros_like(f)


def _values_on_pattern(G: SparseTensor, P: SparseTensor):
    """``G``'s values when ``G`` stores exactly ``P``'s (coalesced) elements, in ``P``'s order; else
    None."""
    if not (G._coalesced and P._coalesced) or G.shape != P.shape or G.dense_dim() != P.dense_dim():
        return None
    if G._sf_layout is P._sf_layout and (
        G._idx is P._idx
        if P._sf_layout is torch.sparse_coo
        else G._crow is P._crow and G._col is P._col
    ):
        return G._vals
    # (torch.compile: equal patterns are not known without reading them; the general path)
    if traced():
        return None
    (gi, gv), (pi, _) = G._coo_parts(), P._coo_parts()
    return gv if gi.shape == pi.shape and torch.equal(gi, pi) else None


def refuse_vmap(what: str):
    """The ``vmap`` rule of sparsefill's autograd.Functions: ``torch.func.vmap`` batching a
    SparseTensor (or the values a SparseTensor is built from) is refused, never computed with the
    batch dim read as a tensor dim.

    >>> import sparsefill
    >>> torch.func.vmap(lambda v: sparsefill.sparse_coo_tensor([[0, 2]], v, (3,)))(torch.ones(4, 2))
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    NotImplementedError: sparsefill: torch.func.vmap through a sparsefill constructor is not ...
    """
    raise NotImplementedError(
        f"sparsefill: torch.func.vmap through {what} is not supported (a batched SparseTensor "
        "has no batching rule); loop over the batch instead (torch.stack([f(x) for x in xs])), "
        "or build one SparseTensor with the batch as its leading sparse dim and call f on it"
    )


def refuse_dual(what: str, *tensors) -> None:
    """Raise where a dual tensor of ``torch.autograd.forward_ad`` (forward-mode AD inside
    ``dual_level()``) enters a sparsefill constructor or conversion: a SparseTensor has no tangent
    form, and its values' tangent would be dropped (``unpack_dual(A.to_dense()).tangent`` None).
    One read of the dual level when none is open; torch.func's jvp (its duals inside a transform) is
    :func:`refuse_forward_ad`'s."""
    if (
        _fwad._current_level >= 0
        and not torch._C._are_functorch_transforms_active()
        and any(_fwad.unpack_dual(t).tangent is not None for t in tensors)
    ):
        raise NotImplementedError(
            f"sparsefill: forward-mode AD (torch.autograd.forward_ad) through {what} is not "
            "supported (a SparseTensor has no tangent form, so the tangent would be lost); use "
            "reverse mode (backward, torch.autograd.grad)"
        )


def refuse_forward_ad(what: str) -> None:
    """Raise under ``torch.func.jvp``/``jacfwd``/``hessian`` (forward-mode AD: a SparseTensor has no
    dual (tangent) form) and under nested differentiation (``grad`` of ``grad``, ``jacrev`` of
    ``grad``: the inner backward reads the SparseTensor gradient inside torch.func's wrappers, which
    an outer level would not see through)."""
    stack = (
        torch._C._functorch.get_interpreter_stack()
        if torch._C._are_functorch_transforms_active()
        else None
    )
    if not stack:
        return
    kinds = [i.key() for i in stack]
    T = torch._C._functorch.TransformType
    if T.Jvp in kinds:
        raise NotImplementedError(
            f"sparsefill: torch.func.jvp/jacfwd/hessian (forward-mode AD) through {what} is not "
            "supported (a SparseTensor has no tangent form); use reverse mode: torch.func.vjp, "
            "torch.func.jacrev or torch.func.grad"
        )
    if kinds.count(T.Grad) > 1:
        raise NotImplementedError(
            "sparsefill: nested torch.func differentiation (grad of grad, jacrev of grad) "
            f"through {what} is not supported; use torch.autograd.grad(..., create_graph=True) "
            "for higher derivatives"
        )


def refuse_masked_in_transform(out) -> None:
    """Raise where a SparseTensor with an indefinite fill enters a torch.func differentiation
    transform (as ``out``, wrapped): inside it torch's dense derivative formulas and
    ``sparsefill.masked`` see a dense tensor, so a masked reduction's count (``mean``, ``var``)
    would be silently wrong."""
    if torch._C._functorch.is_functorch_wrapped_tensor(out):
        U = unwrapped(out)
        if isinstance(U, SparseTensor) and U._indefinite:
            raise NotImplementedError(
                "sparsefill: a SparseTensor with an indefinite fill inside "
                "torch.func.grad/vjp/jacrev is not supported (its masked semantics would be "
                "read as dense there); use torch.autograd.grad, or a defined fill"
            )


class Construct(torch.autograd.Function):
    """``(values, fill) -> SparseTensor`` for a fixed pattern built by ``make``."""

    @staticmethod
    def forward(values, fill, make):
        return inner_unwrapped(make(values.detach(), fill.detach()))

    @staticmethod
    def setup_context(ctx, inputs, output):
        refuse_masked_in_transform(output)
        ctx.pattern = _pattern(output)

    @classmethod
    def apply(cls, *args):
        refuse_forward_ad("a sparsefill constructor")
        return super().apply(*args)

    vmap = staticmethod(lambda info, in_dims, *args: refuse_vmap("a sparsefill constructor"))

    @staticmethod
    def backward(ctx, G):
        G = sparse_inside(G)
        if isinstance(G, SparseTensor) and G.requires_grad and torch.is_grad_enabled():
            # create_graph: G's stored tensors hold no graph (the ops that made G ran below
            # autograd), its dense form does (ToDense): read through it, so a second backward is
            # exact or raises, never silently 0
            G = dense_grad(G, "a SparseTensor gradient differentiated again (create_graph)")
        gv, gf = grad_parts(G, ctx.pattern)
        return gv, gf, None


def to_dense(A: SparseTensor, fill_value=None) -> torch.Tensor:
    """``A.to_dense(fill_value=...)``: through :class:`ToDense` where autograd records a graph, else
    the kernel alone (no graph to record: ``Function.apply``'s cost saved)."""
    # (_any_requires_grad reads A's flag without the op layer's route, cheaper than
    # DisableTorchFunctionSubclass; this is a per-call path, so no extra Python call is made where
    # no fill_value is given)
    if not (
        traced()
        or _functorch_active()
        or _grad_enabled()
        and (_any_requires_grad(A) if fill_value is None else _any_requires_grad(A, fill_value))
        or _fwad._current_level >= 0
    ):  # (a forward-AD level open: the Function, which has no jvp, raises for a dual)
        return _convert.dense_of(
            A, None if fill_value is None else _replacement_fill(A, fill_value), eager=True
        )
    return ToDense.apply(A, fill_value)


# (torch's functions bound here: ``torch._C.f`` looks f up in two module dicts on every call)
_functorch_active, _grad_enabled = torch._C._are_functorch_transforms_active, torch.is_grad_enabled
_any_requires_grad = torch._C._any_requires_grad


def _replacement_fill(A: SparseTensor, fill_value):
    if fill_value is None:
        return None
    from sparsefill._tensor.fill import normalize_fill

    fill, indefinite, _ = normalize_fill(fill_value, A.dtype, A.device, A._dense_shape)
    if indefinite:
        raise ValueError("to_dense(fill_value=[]): the replacement fill must be defined")
    return fill


class ToDense(torch.autograd.Function):
    @staticmethod
    def forward(A, fill_value):
        return _convert.dense_of(A, _replacement_fill(A, fill_value))

    @staticmethod
    def setup_context(ctx, inputs, output):
        A, fill_value = unwrapped(inputs[0]), inputs[1]
        fill = _replacement_fill(A, fill_value)
        ctx.pattern = (
            _convert.rewrap(A, fill=fill, indefinite=False) if fill is not None else _pattern(A)
        )
        ctx.fill_is_input = isinstance(fill_value, torch.Tensor)
        ctx.replaced = fill is not None

    vmap = staticmethod(lambda info, in_dims, *args: refuse_vmap("SparseTensor.to_dense"))

    @staticmethod
    def jvp(ctx, *tangents):  # (a dual SparseTensor or fill_value under torch.autograd.forward_ad)
        raise NotImplementedError(
            "sparsefill: forward-mode AD (torch.autograd.forward_ad) through "
            "SparseTensor.to_dense is not supported (a SparseTensor has no tangent form); use "
            "reverse mode (backward, torch.autograd.grad)"
        )

    @staticmethod
    def backward(ctx, G):
        P, G = ctx.pattern, sparse_inside(G)
        gf = grad_parts(G, P)[1] if ctx.fill_is_input and ctx.needs_input_grad[1] else None
        return (G if not ctx.replaced else _at_pattern(G, P)), gf


def _at_pattern(G, P: SparseTensor) -> SparseTensor:
    """``G`` at ``P``'s (coalesced) pattern, 0 elsewhere: the gradient of ``A`` through
    ``A.to_dense(fill_value=f)``, whose unspecified elements come from ``f``, not from ``A``."""
    idx, _ = _convert.coalesced_parts(P)
    gv = _convert.values_at(G, _index.linearize(idx, P._sparse_shape), len(P._sparse_shape))
    zero = torch.zeros((), dtype=gv.dtype, device=gv.device)
    return graph_kept(
        gv,
        lambda v: _convert.parts_to_sparse(
            idx, v, P.shape, zero, known_zero=True, layout=P._sf_layout, coalesced=True
        ),
    )


def graph_kept(gv: torch.Tensor, make) -> SparseTensor:
    """``make(gv)``: a SparseTensor gradient built from the values ``gv`` in a backward; under
    ``create_graph`` (``gv`` with a graph) through :class:`Construct`, so the next backward sees a
    gradient that requires grad (its second backward is exact, or raises for a
    ``once_differentiable`` one, never silently constant)."""
    if not (torch.is_grad_enabled() and gv.requires_grad):
        return make(gv)
    return Construct.apply(
        gv, torch.zeros((), dtype=gv.dtype, device=gv.device), lambda v, f: make(v)
    )


class Values(torch.autograd.Function):
    @staticmethod
    def forward(A):
        return A._vals.detach()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.pattern = _pattern(inputs[0])

    vmap = staticmethod(lambda info, in_dims, *args: refuse_vmap("SparseTensor.values"))

    @staticmethod
    def backward(ctx, gv):
        P = ctx.pattern
        return graph_kept(
            gv,
            lambda v: _convert.rewrap(
                P, values=v, fill=v.new_zeros(()), indefinite=False, known_zero=True
            ),
        )


class SameDense(torch.autograd.Function):
    """``x -> fn(x)`` where ``fn`` keeps the dense tensor (coalesce, relayout, to_sparse,
    from_torch)."""

    @classmethod
    def apply(cls, *args):
        refuse_forward_ad("a sparsefill conversion")
        return super().apply(*args)

    @staticmethod
    def forward(x, fn):
        return inner_unwrapped(fn(x))

    @staticmethod
    def setup_context(ctx, inputs, output):
        refuse_masked_in_transform(output)
        x = unwrapped(inputs[0])
        ctx.x_layout = x.layout if not isinstance(x, SparseTensor) else None

    vmap = staticmethod(lambda info, in_dims, *args: refuse_vmap("a sparsefill conversion"))

    @staticmethod
    def backward(ctx, G):
        G = sparse_inside(G)
        if ctx.x_layout is None:  # a SparseTensor input: dense or SparseTensor gradients both fit
            return (_convert.from_native(G) if G.layout is not torch.strided else G), None
        g = dense_grad(G) if isinstance(G, SparseTensor) else G
        return (g if ctx.x_layout is torch.strided else g.to_sparse(layout=ctx.x_layout)), None


# ---------------------------------------------------------------------- a torch native sparse
# input's gradient
def native_grad(G: SparseTensor, layout, dense_dim: int) -> torch.Tensor:
    """``G`` as a torch native sparse tensor of ``layout`` and ``dense_dim`` (the gradient of a
    native sparse input: torch's contract), exactly: ``native_grad(G, ...).to_dense() ==
    G.to_dense()`` (an indefinite fill read as 0).  A nonzero fill specifies every element (dense by
    nature: the densify gate).

    >>> import sparsefill
    >>> G = sparsefill.sparse_coo_tensor([[0, 2]], [5., 6.], (4,))
    >>> g = native_grad(G, torch.sparse_coo, 0)
    >>> g.layout, g.to_dense().tolist()
    (torch.sparse_coo, [5.0, 0.0, 6.0, 0.0])
    """
    if G._indefinite:
        G = _convert.rewrap(G, fill=G._vals.new_zeros(()), indefinite=False, known_zero=True)
    if G.dense_dim() == dense_dim and not bool(G._fill.any()):
        return _convert.to_torch(_convert.to_layout(G, layout))
    return dense_grad(G, "the gradient of a torch native sparse tensor").to_sparse(
        layout=layout, dense_dim=dense_dim
    )


class NativeGrad(torch.autograd.Function):
    """``x -> x`` for a torch native sparse ``x``; a SparseTensor or dense gradient reaching it
    becomes a native sparse tensor of ``x``'s layout and dense dims, exactly (:func:`native_grad`; a
    dense one: ``to_sparse``)."""

    @staticmethod
    def forward(x):
        return x.detach()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.layout, ctx.dense_dim = inputs[0].layout, inputs[0].dense_dim()

    vmap = staticmethod(
        lambda info, in_dims, *args: refuse_vmap("a torch native sparse operand's gradient")
    )

    @staticmethod
    def backward(ctx, g):
        g = sparse_inside(g)
        if isinstance(g, SparseTensor):
            return native_grad(g, ctx.layout, ctx.dense_dim)
        return (
            g.to_sparse(layout=ctx.layout, dense_dim=ctx.dense_dim)
            if g.layout is torch.strided
            else g
        )


# ---------------------------------------------------------------------- a SparseTensor leaf's .grad
def leaf_grad(G, P: SparseTensor) -> SparseTensor:
    """The gradient ``G`` (dense, torch native sparse or SparseTensor) of the leaf ``P``, as a
    SparseTensor of
    ``P``'s shape, layout and dense dims, exactly::

        leaf_grad(G, P).to_dense() == G                  (G read as a dense tensor)

    A dense ``G`` stores ``P``'s pattern; the fill is ``G``'s value over the unspecified elements
    when it is uniform there (then nothing else is stored), else 0 and the nonzero elements outside
    the pattern are stored too (torch's ``to_sparse``).  An indefinite ``P``: ``G`` at its pattern,
    fill 0 (its masked-out elements are read by no output).  A SparseTensor ``G`` keeps its pattern
    and fill (an indefinite one for a defined ``P``: 0 at its masked-out elements); its layout
    changes, and its split where it has other dense dims than ``P``
    (:func:`._splits.finer`/:func:`~._splits.coarser`: exact, no dense temporary; a fill varying
    along dims that become sparse is stored where it differs).

    >>> import torch, sparsefill
    >>> P = sparsefill.sparse_coo_tensor([[0, 2]], [1., 2.], (4,), fill_value=3.)
    >>> g = leaf_grad(torch.tensor([5., 7., 6., 7.]), P)
    >>> g.indices().tolist(), g.values().tolist(), g.fill_value().item()
    ([[0, 2]], [5.0, 6.0], 7.0)
    >>> leaf_grad(torch.tensor([5., 7., 0., 6.]), P).to_dense().tolist()
    [5.0, 7.0, 0.0, 6.0]
    """
    if (
        isinstance(G, torch.Tensor)
        and not isinstance(G, SparseTensor)
        and G.layout is not torch.strided
    ):
        G = _convert.from_native(G)
    if isinstance(G, SparseTensor):
        if G._indefinite and (not P._indefinite or G._sparse_ndim() > P._sparse_ndim()):
            # masked out: no output read them, their gradient is 0 (and coarser needs it where a
            # slice is partly so)
            G = _convert.rewrap(G, fill=G._vals.new_zeros(()), indefinite=False, known_zero=True)
        # (_splits.finer/coarser: exact)
        return _convert.to_layout(to_dense_dim(G, P.dense_dim()), P._sf_layout)
    S, D = P._sparse_shape, tuple(P._dense_shape)
    flat = G.reshape((_index.numel(S),) + D)
    idx, _ = P._coo_parts()
    keys = _index.linearize(idx, S)
    zero = flat.new_zeros(())
    if P._indefinite:
        return _pattern_grad(P, keys, flat, zero, True)
    at = torch.zeros(_index.numel(S), dtype=torch.bool, device=G.device)
    at[keys] = True
    free = (~at).nonzero()
    if not free.numel():  # every element stored
        return _pattern_grad(P, keys, flat, zero, True)
    rest = flat[free[:, 0]]
    c = rest[0]
    # uniform over the unspecified elements: it is the fill
    if not bool(_convert.differs(rest, c).any()):
        return _pattern_grad(P, keys, flat, c, not bool(c.any()))
    differ = flat != 0
    keep = at | (differ.flatten(1).any(1) if D else differ)
    skeys = keep.nonzero()[:, 0]
    return _convert.parts_to_sparse(
        _index.unravel(skeys, S),
        flat[skeys],
        P.shape,
        zero,
        known_zero=True,
        layout=P._sf_layout,
        coalesced=True,
    )


def _pattern_grad(P, keys, flat, fill, known_zero) -> SparseTensor:
    """``flat`` at ``P``'s stored elements, ``fill`` elsewhere: on ``P``'s own index tensors when
    coalesced."""
    if P._coalesced:
        return _convert.rewrap(
            P,
            values=flat[keys].reshape(P._vals.shape),
            fill=fill,
            indefinite=False,
            known_zero=known_zero,
        )
    ukeys = torch.unique(keys)  # an uncoalesced P: each element once
    return _convert.parts_to_sparse(
        _index.unravel(ukeys, P._sparse_shape),
        flat[ukeys],
        P.shape,
        fill,
        known_zero=known_zero,
        layout=P._sf_layout,
        coalesced=True,
    )


class LeafGradHook:
    """``A.register_hook(LeafGradHook(A))``: the gradient reaching the SparseTensor leaf ``A`` is
    :func:`leaf_grad` of it before autograd accumulates it into ``A.grad`` (so ``A.grad`` is a
    SparseTensor of ``A``'s layout; ``grad + grad`` of SparseTensors over several backward calls;
    differentiable under ``create_graph``).  It holds ``A``'s attribute dict, where ``A`` keeps its
    storage and which in-place ops update, not ``A``: no reference cycle, and no weak reference
    (``torch.utils.swap_tensors``, which ``nn.Module.to`` uses for wrapper subclasses, refuses a
    tensor with one)."""

    __slots__ = ("state",)

    def __init__(self, A: SparseTensor):
        self.state = A.__dict__

    def leaf(self, shape) -> SparseTensor:
        """A graph-free SparseTensor of the leaf's current storage (a view of another tensor caught
        up)."""
        s = self.state
        P = SparseTensor(
            s["_sf_layout"],
            shape,
            s["_vals"],
            s["_fill"],
            indices=s["_idx"],
            crow=s["_crow"],
            col=s["_col"],
            indefinite=s["_indefinite"],
            coalesced=s["_coalesced"],
        )
        P._view = s.get("_view")
        return P._sync()

    def __call__(self, G):
        P = self.leaf(G.shape)
        if torch.is_grad_enabled() and G.requires_grad:
            return SameDense.apply(G, lambda g: leaf_grad(g, P))
        return leaf_grad(G, P)


def track_leaf(A: SparseTensor) -> None:
    """Register :class:`LeafGradHook` on ``A`` once, when it is a leaf that requires grad."""
    if (
        A.requires_grad
        and A.is_leaf
        and not any(type(h) is LeafGradHook for h in (A._backward_hooks or {}).values())
    ):
        A.register_hook(LeafGradHook(A))


install_hooks(to_dense=to_dense, values=Values.apply)
