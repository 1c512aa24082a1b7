"""``sparsefill.explain``: which stage computes an op on SparseTensor operands, and where its code
is.

A torch function reaches sparsefill in two places (docs/architecture.md, ``ops/registry.py``)::

    __torch_function__   an autograd route (ops/autograd_routes.py ROUTES), when one applies
    __torch_dispatch__   per aten OpOverload, the first stage that takes it:
                         handler (registry.HANDLERS) -> pointwise rule (Tag.pointwise)
                         -> CompositeImplicitAutograd decomposition -> densify fallback

``explain(op, *args, **kwargs)`` answers for ``op(*args, **kwargs)`` without running ``op`` on the
caller's tensors: the aten ops a torch function reaches are found by running it on ``meta``
stand-ins (same shapes and dtypes, no data), and an input-dependent route's predicate (its own code:
it returns ``NotImplemented`` to decline) is evaluated on detached copies.  Without arguments it
lists every stage that could apply.

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor([[0, 1], [1, 0]], [1., 2.], (2, 2), fill_value=3.)
>>> e = sparsefill.explain(torch.exp, A)
>>> e.stage, e.steps[0].op
('pointwise', 'aten.exp.default')
>>> sparsefill.explain(torch.Tensor.sum, A, dim=0).stage
'handler'
>>> print(sparsefill.explain(torch.ops.aten.sum.dim_IntList))  # doctest: +ELLIPSIS
aten.sum.dim_IntList: handler
  aten.sum.dim_IntList  handler  sparsefill/ops/reductions/reduce.py:... (...)
  aten.sum.dim_IntList  densify  sparsefill/ops/fallback.py:... (under sparsefill.densify_policy)
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from sparsefill._tensor.tensor import SparseTensor

STAGES = ("route", "handler", "refused", "pointwise", "decomposition", "densify")


@dataclasses.dataclass(frozen=True)
class Step:
    """One stage for one op: ``op`` (its name), ``stage`` (one of :data:`STAGES`), ``where``
    (``file:line`` of the code, relative to the site-packages root) and ``note``."""

    op: str
    stage: str
    where: str
    note: str = ""

    def __str__(self) -> str:
        return f"  {self.op}  {self.stage}  {self.where}" + (f" ({self.note})" if self.note else "")


@dataclasses.dataclass(frozen=True)
class Explanation:
    """What handles ``op``: ``stage`` the first stage the call takes (with arguments) or, without,
    the first that could apply (``"unknown"``: no argument given and no aten op of ``op``'s name);
    ``steps`` every stage found, in the order the registry tries them (with arguments: the route if
    it takes the call, else one step per aten op reached); ``notes`` caveats."""

    op: str
    stage: str
    steps: tuple
    notes: tuple = ()

    def __str__(self) -> str:
        return "\n".join(
            [f"{self.op}: {self.stage}"]
            + [str(s) for s in self.steps]
            + [f"  note: {n}" for n in self.notes]
        )


def _where(fn) -> str:
    fn = inspect.unwrap(fn)
    try:
        path = inspect.getsourcefile(fn)
        line = inspect.getsourcelines(fn)[1]
    except (TypeError, OSError):
        path = None
    if path is None:  # (no Python source: a builtin)
        return getattr(fn, "__qualname__", repr(fn))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rel = os.path.relpath(path, root) if path.startswith(root) else path
    return f"{rel.replace(os.sep, '/')}:{line}"


def _name(op) -> str:
    if isinstance(op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(op)
    mod = str(
        getattr(op, "__module__", None)
        or getattr(getattr(op, "__objclass__", None), "__module__", "")
    )
    qual = str(getattr(op, "__qualname__", None) or getattr(op, "__name__", repr(op)))
    if getattr(op, "__objclass__", None) is torch._C.TensorBase or qual.startswith("Tensor."):
        return f"torch.Tensor.{op.__name__}"
    if qual.startswith("_VariableFunctionsClass."):
        return f"torch.{op.__name__}"
    # torch._C._linalg.linalg_det: torch.linalg.det
    if mod.startswith("torch._C._") and mod.count(".") == 2:
        sub = mod.split(".")[-1][1:]
        return f"torch.{sub}.{qual.removeprefix(sub + '_')}"
    return f"{mod}.{qual}" if mod and mod != "builtins" else f"torch.{qual}"


def aten_steps(func) -> list:
    """The stages the registry would try for the aten ``OpOverload`` ``func``, in order, up to the
    first that always takes the call (a handler or the pointwise rule may decline:
    ``NotImplemented``)."""
    from sparsefill.ops import fallback
    from sparsefill.ops.pointwise import rule as pointwise
    from sparsefill.ops import registry

    name, steps = str(func), []
    h = registry.HANDLERS.get(func)
    if h is not None:
        nature = getattr(h, "dense_by_nature", None)  # set by handlers of such ops
        note = h.__qualname__ + (f"; dense by nature where {nature}" if nature else "")
        steps.append(Step(name, "handler", _where(h), note))
    reason = registry.unannotated_mutation(func)
    if reason is not None:
        return steps + [Step(name, "refused", _where(registry._refuse), reason)]
    if pointwise.is_pointwise(func):
        fast = registry.fast_path(func)
        steps.append(
            Step(
                name,
                "pointwise",
                _where(pointwise.pointwise_rule),
                "Tag.pointwise" + ("; fast path fast_path.unary_fast" if fast else ""),
            )
        )
    if registry._is_composite(func):
        steps.append(
            Step(
                name, "decomposition", "CompositeImplicitAutograd", "its pieces meet their handlers"
            )
        )
    steps.append(
        Step(name, "densify", _where(fallback.densify_call), "under sparsefill.densify_policy")
    )
    return steps


class _Record(TorchDispatchMode):
    """The aten ops a call reaches at the Python dispatch key (what ``__torch_dispatch__`` would
    see)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func not in self.ops:
            self.ops.append(func)
        return func(*args, **(kwargs or {}))


class _Routed(TorchFunctionMode):
    """The first routed torch function a call makes inside another (``torch.sparse.sum`` calls
    ``torch._sparse_sum``), with its arguments."""

    def __init__(self):
        super().__init__()
        self.first = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        from sparsefill.ops.autograd_routes import ROUTES

        if self.first is None and func in ROUTES:
            self.first = (func, args, kwargs or {})
        return func(*args, **(kwargs or {}))


def _meta(a):
    if isinstance(a, torch.Tensor):
        m = torch.empty(a.shape, dtype=a.dtype, device="meta")
        return (
            m.requires_grad_()
            if a.requires_grad and (a.is_floating_point() or a.is_complex())
            else m
        )
    return a


def _copy(a):
    if isinstance(a, torch.Tensor):
        c = a.detach().clone()
        return c.requires_grad_() if a.requires_grad else c
    return a


def _reached(op, args, kwargs):
    """The aten ops ``op(*args, **kwargs)`` reaches, found on meta stand-ins; or an error
    message."""
    originals = {}

    def meta(a):
        m = _meta(a)
        originals[id(m)] = a
        return m

    rec, fn, margs, mkwargs = _Record(), _Routed(), tree_map(meta, args), tree_map(meta, kwargs)
    err = None
    try:
        with fn, rec:
            op(*margs, **mkwargs)
    # (a data-dependent op has no meta result: said, not raised)
    except Exception as e:  # noqa: BLE001
        err = f"traced on meta up to {type(e).__name__}: {e}"
    inner = None
    if fn.first is not None:  # the routed function nested in op, on the caller's operands
        f, a, k = fn.first
        back = lambda x: originals.get(id(x), x)  # noqa: E731
        inner = (f, tree_map(back, a), tree_map(back, k))
    return rec.ops, err, inner


def _route_takes(op, args, kwargs):
    """The route for torch function ``op`` and whether it takes this call (its predicate, run on
    copies)."""
    from sparsefill.ops import autograd_routes as ar

    r = ar.ROUTES.get(op)
    if r is None:
        return None, False
    if not args and not kwargs:
        return r, None
    if not (torch.is_grad_enabled() or op in ar.ALWAYS):
        return r, False
    with torch._C.DisableTorchFunctionSubclass():
        cargs, ckwargs = tree_map(_copy, args), tree_map(_copy, kwargs)
        try:
            return r, r(op, cargs, ckwargs) is not NotImplemented
        except Exception:  # noqa: BLE001 (the route raised: torch's path reports the error)
            return r, False


def _overload_steps(packet) -> list:
    steps = []
    for o in packet.overloads():
        try:
            steps += aten_steps(getattr(packet, o))
        except RuntimeError:  # an overload name with no operator registered in this build
            continue
    return steps


def _packet_of(op):
    """The aten packet named as torch function ``op`` (``__radd__``: ``add``, ``__iadd__``:
    ``add_``)."""
    name = getattr(op, "__name__", "")
    if name.startswith("__") and name.endswith("__"):
        name = name[2:-2]
        for p, suffix in (("i", "_"), ("r", "")):
            if name.startswith(p) and hasattr(torch.ops.aten, name[1:]):
                name = name[1:] + suffix
                break
    return (
        getattr(torch.ops.aten, name, None)
        if name.isidentifier() and hasattr(torch.ops.aten, name)
        else None
    )


def explain(op: Any, *args: Any, **kwargs: Any) -> Explanation:
    """Which stage computes ``op(*args, **kwargs)`` on SparseTensor operands, with the file:line of
    its code.

    ``op``: an aten ``OpOverload`` or ``OpOverloadPacket``, or a torch function (``torch.exp``,
    ``torch.Tensor.sum``, ``torch.nn.functional.softmax``, ...).  The registry's order, as
    ``ops/registry.py`` runs it::

        stage(op, args) = route        if a torch function's autograd route takes the call
                          handler     if registry.HANDLERS has the aten op (and it does not decline)
                          refused      if its schema may not say what it writes
                          pointwise    if the aten op is tagged pointwise
                          decomposition if it is CompositeImplicitAutograd
                          densify      otherwise: op(A.to_dense(), ...) under the densify policy

    Nothing runs on the caller's tensors: aten ops are found on meta stand-ins, a route's predicate
    on copies. Without ``args``, every stage that could apply is listed (a packet: each overload; a
    torch function: its route and the aten packet of its name).

    >>> import torch, sparsefill
    >>> A = sparsefill.sparse_coo_tensor([[0, 1], [1, 0]], [1., 2.], (2, 2), fill_value=0.)
    >>> sparsefill.explain(torch.nn.functional.softmax, A, dim=1).steps[0].op
    'aten._softmax.default'
    >>> sparsefill.explain(torch.ops.aten.cumsum.default, A, 0).stage in sparsefill._explain.STAGES
    True
    """
    name = _name(op)
    if isinstance(op, torch._ops.OpOverload):
        steps = aten_steps(op)
        return Explanation(name, steps[0].stage, tuple(steps))
    if isinstance(op, torch._ops.OpOverloadPacket) and not args and not kwargs:
        steps = _overload_steps(op)
        return Explanation(name, steps[0].stage if steps else "densify", tuple(steps))
    if not callable(op):
        raise TypeError(
            "sparsefill.explain: op must be an aten OpOverload/OpOverloadPacket or a torch "
            f"function, got {type(op).__name__}"
        )
    route, takes = (
        (None, False)
        if isinstance(op, torch._ops.OpOverloadPacket)
        else _route_takes(op, args, kwargs)
    )
    rstep = Step(name, "route", _where(route), route.__qualname__) if route is not None else None
    notes = []
    if not args and not kwargs:
        packet = _packet_of(op)
        steps = _overload_steps(packet) if packet else []
        if rstep is not None:
            from sparsefill.ops.autograd_routes import ALWAYS

            rstep = dataclasses.replace(
                rstep,
                note=rstep.note
                + ("; every grad mode" if op in ALWAYS else "; grad mode on")
                + "; may decline",
            )
        steps = ([rstep] if rstep else []) + steps
        notes.append(
            f"aten ops found by name ({packet}); pass arguments for the ops the call reaches"
            if packet
            else "no aten op of this name: pass arguments for the ops the call reaches"
        )
        return Explanation(name, steps[0].stage if steps else "unknown", tuple(steps), tuple(notes))
    if takes:
        return Explanation(name, "route", (rstep,))
    if route is not None:
        notes.append(f"route {route.__qualname__} declines these inputs")
    ops, err, inner = _reached(op, args, kwargs)
    if inner is not None and inner[0] is not op:
        r, takes = _route_takes(*inner)
        if takes:
            return Explanation(
                name,
                "route",
                (Step(_name(inner[0]), "route", _where(r), r.__qualname__),),
                (f"{name} calls {_name(inner[0])}",),
            )
    if err:
        notes.append(err)
    steps = [aten_steps(o)[0] for o in ops]
    if not any(
        isinstance(a, SparseTensor) for a in torch.utils._pytree.tree_leaves((args, kwargs))
    ):
        notes.append("no SparseTensor operand: torch computes it without sparsefill")
    return Explanation(name, steps[0].stage if steps else "densify", tuple(steps), tuple(notes))
