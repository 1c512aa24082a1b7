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

The constructor's gradient parts are computed in ``constructor_grad.py``; the SparseTensor inside
torch.func's wrappers and the transforms refused, in ``torch_func.py``; this module holds the
Functions and the leaf gradient hook.
"""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as _fwad

from sparsefill._tensor import parts as _convert
from sparsefill._kernels import index as _index
from sparsefill._kernels.trace import traced
from sparsefill._tensor.dense_dims import to_dense_dim
from sparsefill._tensor.tensor import SparseTensor, install_hooks
from sparsefill._autograd.torch_func import (
    _pattern,
    inner_unwrapped,
    refuse_dual as refuse_dual,
    refuse_forward_ad,
    refuse_masked_in_transform,
    refuse_vmap,
    sparse_inside,
    unwrapped,
)
from sparsefill._autograd.constructor_grad import (
    _values_on_pattern as _values_on_pattern,
    grad_parts,
    sum_outside as sum_outside,
)


def dense_grad(G: SparseTensor, what: str = "a gradient read as a dense tensor") -> torch.Tensor:
    """``G``'s dense form, an indefinite fill read as 0 (a gradient's masked-out elements carry
    none), through the densify gate: a gradient whose consumer is dense is dense by nature (quiet
    under the default policy)."""
    if G.numel() > 1:  # (one element: a number, as the 0-d conversions elsewhere)
        _convert.check_densify_quiet(G, what)
    # (differentiable where a graph is recorded: create_graph)
    return to_dense(G, 0 if G._indefinite else None)


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
