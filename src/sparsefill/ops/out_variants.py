"""``out=`` overloads: the op's functional overload, then torch's out semantics::

    torch.op(A, ..., out=o)  is  o  and  o == torch.op(A.to_dense(), ...)

(``aten.sum.IntList_out`` is ``aten.sum.dim_IntList`` written into ``out``.)  The functional
overload runs through every stage of the registry (its handler, the pointwise rule...), so an op
that is native without ``out=`` stays native with it; each output is then checked, resized and
written as torch's own out kernels do: torch's dtype errors (``result type Float can't be cast to
the desired output type Long``), its resize warning for a non-empty output of another shape.  An
op whose kernel can write the outputs itself registers a handler for its ``out=`` overload (``sort``
does: no second buffer), which returns NotImplemented to leave the other cases to this rule.

A SparseTensor output takes the result as ``copy_`` gives it (its shape is fixed: another shape is
a ValueError).  An op whose functional overload decomposes into the ``out=`` overload again is left
to the densify fallback.
"""

from __future__ import annotations

import threading
import warnings

import torch
from torch._library.utils import is_out
from torch.utils._pytree import tree_flatten, tree_map_only

from sparsefill._tensor.policy import check_densify
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops._schema import meta_like

# OpOverload._op -> (functional overload, out argument names), or None: not an out= overload
_FUNCTIONAL: dict = {}


def functional_of(func):
    """``(functional overload, names of the out arguments)`` of the ``out=`` overload ``func``
    (the overload of the same op with the same other arguments and no outputs), or None."""
    if func._op in _FUNCTIONAL:
        return _FUNCTIONAL[func._op]
    found = None
    if is_out(func):
        args = func._schema.arguments
        outs = tuple(a.name for a in args if a.is_out)
        want = [(a.name, str(a.type)) for a in args if not a.is_out]
        packet = getattr(getattr(torch.ops, func.namespace), func._schema.name.split("::")[-1])
        for name in packet.overloads():
            f = getattr(packet, name)
            if not is_out(f) and [(a.name, str(a.type)) for a in f._schema.arguments] == want:
                found = (f, outs)
                break
    _FUNCTIONAL[func._op] = found
    return found


def out_call(func, args, kwargs, compute):
    """``func`` (an ``out=`` overload) as its functional overload computed by ``compute`` and
    written into the outputs; NotImplemented where it is not one, or an output is a torch sparse
    tensor."""
    plan = functional_of(func)
    if plan is None:
        return NotImplemented
    functional, names = plan
    if len(args) > len(functional._schema.arguments) or any(n not in kwargs for n in names):
        return NotImplemented  # (outputs given by position)
    outs = [kwargs[n] for n in names]
    active = _active()
    if func._op in active or not all(map(_writable, tree_flatten(outs)[0])):
        return NotImplemented
    rest = {k: v for k, v in kwargs.items() if k not in names}
    _check(func, args, rest, names, outs)
    active.add(func._op)  # (a functional overload whose decomposition calls this one: fallback)
    try:
        result = compute(functional, args, rest)
    finally:
        active.discard(func._op)
    if len(outs) == 1 and isinstance(outs[0], (list, tuple)):  # (a list output: Tensor(a!)[])
        outs = list(outs[0])
    results = (result,) if isinstance(result, torch.Tensor) else tuple(result)
    for o, r in zip(outs, results, strict=True):
        write_out(o, r)
    if not func._schema.returns:
        return None
    return outs[0] if len(outs) == 1 else tuple(outs)


def _writable(o) -> bool:
    """A dense tensor or a SparseTensor (a torch sparse tensor: the densify fallback refuses it)."""
    return isinstance(o, SparseTensor) or isinstance(o, torch.Tensor) and o.layout is _STRIDED


_STRIDED = torch.strided
_LOCAL = threading.local()


def _active() -> set:
    """The ``out=`` overloads this thread is computing as their functional overloads."""
    if not hasattr(_LOCAL, "ops"):
        _LOCAL.ops = set()
    return _LOCAL.ops


def _check(func, args, rest, names, outs) -> None:
    """torch's errors for the outputs (dtype, device): the out overload on meta tensors."""

    def meta_out(t):  # (written: strides of its own, not a broadcast one)
        if isinstance(t, SparseTensor):
            return torch.empty(t.shape, dtype=t.dtype, device="meta")
        return torch.empty_like(t, device="meta")

    margs, mrest = tree_map_only(torch.Tensor, meta_like, (args, rest))
    mouts = tree_map_only(torch.Tensor, meta_out, dict(zip(names, outs)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the resize warning comes from the real output)
        try:
            func(*margs, **mrest, **mouts)
        except NotImplementedError:  # (no meta kernel: the copy's own checks remain)
            pass


def write_out(o: torch.Tensor, r: torch.Tensor) -> None:
    """``r`` into the output ``o``, resized as torch resizes an output (a SparseTensor output,
    whose shape is fixed, takes ``r``'s pattern and fill through ``copy_``)."""
    if isinstance(o, SparseTensor):
        if o.shape != r.shape:
            raise ValueError(
                f"out=: a SparseTensor output keeps its shape {tuple(o.shape)}, but the result "
                f"has shape {tuple(r.shape)}: pass an output of that shape, or a dense one"
            )
        o.copy_(r)
        return
    if isinstance(r, SparseTensor):  # (a sparse result into a dense output: dense by nature)
        nbytes = r.numel() * o.element_size()
        check_densify("out=: a SparseTensor result into a dense output", nbytes, by_nature=True)
    if o.device != r.device:
        raise RuntimeError(
            f"Expected out tensor to be on device {r.device}, but it is on device {o.device}"
        )
    if o.shape != r.shape:
        if o.numel():
            warnings.warn(
                f"An output with one or more elements was resized since it had shape "
                f"{list(o.shape)}, which does not match the required output shape "
                f"{list(r.shape)}. This behavior is deprecated, and in a future PyTorch release "
                "outputs will not be resized unless they have zero elements. You can explicitly "
                "reuse an out tensor t by resizing it, inplace, to zero elements with "
                "t.resize_(0).",
                UserWarning,
                stacklevel=2,
            )
        o.resize_(r.shape)
    o.copy_(r)
