"""sparsefill's autograd Functions under torch.func: the SparseTensor inside functorch's wrappers
(:func:`unwrapped`, :func:`sparse_inside`, :func:`inner_unwrapped`), and the transforms they refuse
rather than compute wrongly (``vmap`` batching a SparseTensor, forward-mode AD, nested
differentiation, a masked fill inside ``grad``/``vjp``/``jacrev``)::

    unwrapped(t) is t                for a SparseTensor or a tensor no transform wrapped
    refuse_*(...)                    returns, or raises NotImplementedError naming the way out

>>> import torch
>>> t = torch.ones(2)
>>> unwrapped(t) is t, sparse_inside(t) is t
(True, True)
"""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as _fwad

from sparsefill._tensor import parts as _convert
from sparsefill._tensor.tensor import SparseTensor


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
