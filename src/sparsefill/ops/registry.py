"""One registry: aten ``OpOverload`` -> handler ``(func, args, kwargs) -> result``.

A handler may return ``NotImplemented`` to hand the call to the next stage.  Order:
registered handler; an ``out=`` overload as its functional overload written into its outputs
(``out_variants.py``); the generic rule of ops tagged ``torch.Tag.pointwise``
(``pointwise/rule.py``); the op's CompositeImplicitAutograd decomposition (so the pieces can meet
their handlers); the densify fallback (``fallback.py``).  Around every call runs
``views.around``, which keeps SparseTensor views and their bases consistent.

The boundary rule, enforced here for every call: an operand or op sparsefill does not understand
is converted exactly or refused, never ignored::

    op(A, nat) == op(A, sparsefill.from_torch(nat))
        a torch native sparse operand (any layout: fill 0)

* a native sparse tensor (COO, CSR, CSC, BSR, BSC; hybrid, batched) becomes a SparseTensor with fill
  0 before any handler runs; one the op writes to (``nat.add_(A)``, ``out=nat``) is refused
  (``TypeError``): the write would land in a copy.  Except in the torch.sparse kernels of
  :data:`KEEPS_NATIVE`, where a native operand's unspecified elements have the op's own meaning (the
  mask of ``sampled_addmm``, the skipped elements of ``torch.sparse.mm(..., reduce)``): there it
  goes to torch's kernel as it is, and the SparseTensor operands, in dense roles, are densified;
* a tensor subclass with its own ``__torch_dispatch__`` that is neither a SparseTensor nor one of
  torch's tracing tensors (FakeTensor, FunctionalTensor: ``torch.compile``) is refused
  (``TypeError`` naming its type); ``nn.Parameter`` and plain Python subclasses are dense tensors
  here;
* an op whose schema may not say what it writes (:func:`unannotated_mutation`: the ``c10d``
  collectives, in-place-named ops of other namespaces) is refused (``NotImplementedError``) unless
  a handler is registered for it: the densify fallback would write into a dense copy.

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor([[0, 1], [2, 0]], [1., 2.], (2, 3), fill_value=0.5)
>>> nat = torch.sparse_coo_tensor([[0, 1], [1, 2]], [10., 20.], (2, 3))
>>> (A + nat).to_dense()
tensor([[ 0.5000, 10.5000,  1.0000],
        [ 2.0000,  0.5000, 20.5000]])
"""

from __future__ import annotations

import functools

import torch

from sparsefill._autograd.transforms import (
    check as _func_guard,
    no_reverse_transform as _no_reverse_transform,
)
from sparsefill._tensor.tensor import _FAST, SparseTensor
from sparsefill.ops.pointwise import fast_path as pointwise_fast, rule as pointwise
from sparsefill.ops import out_variants, views
from sparsefill.ops._schema import flat_args, written_positions

HANDLERS: dict = {}
# op -> shortcut(func, args, kwargs) tried before dispatch: a result, or None for the full path
SHORTCUTS: dict = {}


def register_shortcut(op):
    """Decorator: ``fn(func, args, kwargs)`` runs first for ``op`` in ``__torch_dispatch__``
    (before the boundary rule and the view bookkeeping: for an op whose common case is a few
    kernel calls on plain operands, which ``fn`` checks); None passes the call on."""

    def deco(fn):
        _FAST.clear()
        SHORTCUTS[op] = fn
        return fn

    return deco


def register(*ops):
    """Decorator: handle every given ``OpOverload`` (a packet registers all its overloads)."""

    def deco(fn):
        _PLANS.clear()  # (decisions taken with the handlers registered so far)
        _FAST.clear()
        for op in ops:
            if isinstance(op, torch._ops.OpOverloadPacket):
                for name in op.overloads():
                    HANDLERS[getattr(op, name)] = fn
            else:
                HANDLERS[op] = fn
        return fn

    return deco


def _is_composite(func) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(
        func.name(), torch._C.DispatchKey.CompositeImplicitAutograd
    )


def dispatch(func, types, args, kwargs):
    """``SparseTensor.__torch_dispatch__``: the boundary rule, then :func:`compute` inside the view
    bookkeeping (``views.around``)."""
    if len(types) != 1 or types[0] is not SparseTensor:
        _check_types(func, types)
    for a in (
        ()
        if len(args) == 1 and args[0].__class__ is SparseTensor and not kwargs
        else flat_args(args, kwargs)
    ):
        if (
            a.__class__ is not SparseTensor
            and isinstance(a, torch.Tensor)
            and not isinstance(a, SparseTensor)
            and (a.layout is not torch.strided or a.is_nested)
        ):
            if func not in KEEPS_NATIVE:
                args, kwargs = _convert_foreign(func, args, kwargs)
            break
    # (torch.func.grad/vjp/jacrev run: an indefinite fill through their wrapper)
    if not _no_reverse_transform():
        _func_guard(func, args, kwargs)
    return views.around(func, args, kwargs, compute)


def fast_path(func):
    """The shortcut ``SparseTensor.__torch_dispatch__`` takes for ``func`` before :func:`dispatch`
    (called once per op, cached there): for a pointwise op with no handler
    ``pointwise_fast.unary_fast`` (out of place) or ``pointwise_fast.inplace_fast`` (``A.mul_(c)``),
    a registered shortcut (:func:`register_shortcut`), else False."""
    if func in SHORTCUTS:
        return SHORTCUTS[func]
    if func in HANDLERS:
        return False
    return (
        pointwise_fast.unary_fast
        if pointwise_fast.unary_fast_ok(func)
        else pointwise_fast.inplace_fast
        if pointwise_fast.inplace_fast_ok(func)
        else False
    )


# ---------------------------------------------------------------------- the boundary rule
_NATIVE = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)
_aten = torch.ops.aten
KEEPS_NATIVE = {
    _aten._sparse_mm_reduce_impl.default,
    _aten._sparse_mm_reduce_impl_backward.default,
    _aten.sparse_sampled_addmm.default,
    _aten.sparse_sampled_addmm.out,
    _aten.sspaddmm.out,
    _aten.hspmm.default,
    _aten.hspmm.out,
}
_KNOWN_TYPES: dict = {}  # type -> whether dispatch accepts operands of it


def _known_type(t: type) -> bool:
    if t is torch.Tensor or issubclass(t, SparseTensor):
        return True
    from torch._subclasses.fake_tensor import (
        FakeTensor,
    )  # torch.compile's tracing tensors hold dense data
    from torch._subclasses.functional_tensor import FunctionalTensor

    return issubclass(t, (FakeTensor, FunctionalTensor))


def _check_types(func, types) -> None:
    """Refuse an operand of a tensor subclass with its own ``__torch_dispatch__`` that sparsefill
    does not know: its data is not the dense tensor it stands for, so no stage here can compute with
    it exactly."""
    for t in types:
        ok = _KNOWN_TYPES.get(t)
        if ok is None:
            ok = _KNOWN_TYPES[t] = _known_type(t)
        if not ok:
            raise TypeError(
                f"sparsefill: {func} got an operand of type {t.__module__}.{t.__qualname__}, a "
                "tensor subclass sparsefill does not know how to compute with; convert it to a "
                "dense tensor or a sparsefill.SparseTensor first"
            )


def _convert_foreign(func, args, kwargs):
    """``(args, kwargs)`` with every torch native sparse tensor replaced by its SparseTensor (fill
    0, the same index and value tensors); other layouts, nested tensors and native tensors the op
    writes to raise."""
    from sparsefill._tensor.parts import from_native

    written = {name for _, name, _ in written_positions(func)}
    names = [a.name for a in func._schema.arguments]

    def convert(a, name):
        if (
            not isinstance(a, torch.Tensor)
            or isinstance(a, SparseTensor)
            or (a.layout is torch.strided and not a.is_nested)
        ):
            return a
        what = "a nested tensor" if a.is_nested else f"a tensor of layout {a.layout}"
        if name in written:
            raise TypeError(
                f"sparsefill: {func} writes to its argument '{name}', {what}, which cannot hold a "
                "sparsefill result; compute out of place, or convert it with sparsefill.from_torch"
            )
        if a.is_nested or a.layout not in _NATIVE:
            raise TypeError(
                f"sparsefill: {func}: argument '{name}' is {what}, which sparsefill cannot convert "
                "exactly; convert it to a dense tensor or a sparsefill.SparseTensor first"
            )
        return from_native(a, checked=True)

    def each(a, name):
        return (
            type(a)(convert(x, name) for x in a)
            if isinstance(a, (list, tuple))
            else convert(a, name)
        )

    args = tuple(each(a, names[i] if i < len(names) else "") for i, a in enumerate(args))
    return args, {k: each(v, k) for k, v in kwargs.items()}


@functools.cache
def unannotated_mutation(func) -> str | None:
    """Why ``func``'s schema may not say which arguments it writes (None: it does).

    aten and prims schemas mark every write (``Tensor(a!)``: functionalization relies on it), and so
    do ops tagged ``pt2_compliant_tag`` (checked for torch.compile).  The ``c10d`` collectives take
    ``Tensor[] tensors`` with no ``(a!)`` and write them through a process group; an op of another
    namespace named in place (``..._``) with no write marked is suspect alike.  The densify fallback
    would run such an op on dense copies and write nothing back."""
    ns, name = func.namespace, func._schema.name.split("::")[-1]
    if (
        ns in ("aten", "prims")
        or torch.Tag.pt2_compliant_tag in func.tags
        or written_positions(func)
    ):
        return None
    if ns == "c10d":
        return (
            "a c10d collective writes its tensor arguments through a process group, and its "
            "schema does not mark them (no '(a!)')"
        )
    if name.endswith("_") and not name.endswith("__"):
        return "the op is named as in-place but its schema marks no argument as written"
    return None


# op namespace -> the module whose import registers its handlers
LAZY = {"c10d": "sparsefill.distributed"}


def _load_handlers(func) -> bool:
    """Import the module that registers the handlers of ``func``'s namespace (once); True when
    ``func`` got one."""
    mod = LAZY.pop(func.namespace, None)
    if mod is None:
        return False
    import importlib

    importlib.import_module(mod)
    return func in HANDLERS


def _refuse(func, reason: str):
    raise NotImplementedError(
        f"sparsefill: {func} is not supported on SparseTensor operands: {reason}, so a "
        "computation on dense copies would silently write nothing back. Convert the "
        "operands (A.to_dense(), or A.values()) and call it on those."
    )


def compute(func, args, kwargs):
    """The stages for one call (no middleware): handler, pointwise rule, decomposition, densify
    fallback."""
    plan = _PLANS.get(func._op)
    if plan is None:
        plan = _plan(func)
    handler, reason, is_pointwise, composite, writes_out = plan
    if handler is not None:
        out = handler(func, args, kwargs)
        if out is not NotImplemented:
            return out
    # (handlers for such ops, e.g. the collectives, are registered above this line)
    if reason is not None:
        _PLANS.pop(func._op, None)
        if _load_handlers(func):
            return compute(func, args, kwargs)
        _refuse(func, reason)
    if writes_out:
        out = out_variants.out_call(func, args, kwargs, compute)
        if out is not NotImplemented:
            return out
    if is_pointwise:
        out = pointwise.pointwise_rule(func, args, kwargs)
        if out is not NotImplemented:
            return out
    if composite:
        out = func.decompose(*args, **kwargs)
        if out is not NotImplemented:
            return out
    from sparsefill.ops.fallback import densify_call

    return densify_call(func, args, kwargs)


# OpOverload._op -> _plan(func) (an OpOverload's own __hash__ is Python code); cleared by every
# registration
_PLANS: dict = {}


def _plan(func) -> tuple:
    """``(handler, why the op is refused, pointwise, composite, an out= overload)``: what
    :func:`compute` tries for ``func``, decided once per op (until the next :func:`register`)."""
    plan = _PLANS[func._op] = (
        HANDLERS.get(func),
        unannotated_mutation(func),
        pointwise.is_pointwise(func),
        _is_composite(func),
        out_variants.functional_of(func) is not None,
    )
    return plan
