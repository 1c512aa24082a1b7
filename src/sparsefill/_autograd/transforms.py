"""torch.func's differentiation transforms meet an indefinite fill: refused, never a wrong gradient.

Inside ``torch.func.grad``/``vjp``/``jacrev``/``jvp``/``jacfwd`` a SparseTensor argument
(``grad(f)(A)``, ``nn.Parameter(A)`` under ``functional_call``), or one an op made there, is seen
through functorch's C++ wrapper, which has no ``__torch_function__``: its ops reach
``__torch_dispatch__`` directly, after torch's derivative formula was recorded at the transform's
level.  Those formulas have dense semantics; for an indefinite (masked) fill they are wrong wherever
the masked-out elements count (``mean``'s gradient divides by every element, products and reductions
give the masked-out positions a gradient, a dense operand's gradient becomes masked).  :func:`check`
(called by the registry's ``dispatch`` while such a transform may
run) therefore refuses every such call that carries a gradient::

    func(A, ...) under a transform, A indefinite, reached through the wrapper
        ->  NotImplementedError
        unless func carries no gradient  (detach, zeros_like, comparisons, item; a bool A)

Element-wise ops are refused too: their gradient is exact on the stored elements, but the masked-out
positions keep what the formula left there (``vjp(lambda a: a * 2, A)``'s pullback gives ``2 * ct``
there, where ``torch.autograd.grad`` gives 0: no output read them).

The registry calls :func:`check` only where :data:`no_reverse_transform` is False:
``grad``/``vjp``/``jacrev`` (and ``hessian``'s ``jacrev``) disable autograd's saved-tensor hooks
while they run, a C flag that is cheap to read; elsewhere no call is made.  (Forward mode alone,
``jvp``/``jacfwd``, leaves it set: there a SparseTensor primal fails torch's own storage check
first, and the constructors and routes refuse.)

"Reached through the wrapper" is read from the Python frames above the call (the wrapper leaves no
other trace there: the transform's level is popped while ``__torch_dispatch__`` runs): a transform's
frame (``grad_and_value_impl``, ``_vjp_with_argnums``, ``_jvp_with_argnums``) reached before any
frame of sparsefill's own entry points (``SparseTensor.__torch_function__``: a SparseTensor met at
the Python level, whose routes refuse a masked operand meeting a transformed one;
``__torch_dispatch__``: a nested call; autograd's ``_engine_run_backward``: a formula of an op let
through).  ``vmap`` alone records no formula: never refused here.

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor([[0, 2]], [1., 2.], (3,), fill_value=sparsefill.indefinite)
>>> torch.func.grad(lambda a: a.mean())(A)  # doctest: +ELLIPSIS
Traceback (most recent call last):
NotImplementedError: sparsefill: aten.mean.default of a SparseTensor with an indefinite fill ...
>>> L = A.detach().requires_grad_()  # torch.autograd: the masked mean's exact gradient
>>> torch.autograd.grad(L.mean(), L)[0].to_dense(fill_value=0.).tolist()
[0.5, 0.0, 0.5]
"""

from __future__ import annotations

import sys

import torch

from sparsefill._tensor.tensor import SparseTensor

_aten = torch.ops.aten
# () -> False while grad/vjp/jacrev run
no_reverse_transform = torch._C._autograd._saved_tensors_hooks_is_enabled
NO_GRADIENT = {
    _aten.detach,
    _aten.alias,
    _aten.zeros_like,
    _aten.ones_like,
    _aten.empty_like,
    _aten.full_like,
    _aten.rand_like,
    _aten.randn_like,
    _aten.randint_like,
    _aten._local_scalar_dense,
    _aten.is_same_size,
    _aten.eq,
    _aten.ne,
    _aten.lt,
    _aten.le,
    _aten.gt,
    _aten.ge,
    _aten.isnan,
    _aten.isinf,
    _aten.isfinite,
}


def check(func, args, kwargs) -> None:
    """Raise where ``func``, which carries a gradient, meets a floating indefinite SparseTensor
    through a differentiation transform's wrapper (module docstring).  One pass over the arguments
    when none is an indefinite SparseTensor."""
    for a in args:
        if a.__class__ is SparseTensor:
            if a._indefinite:
                break
        elif a.__class__ is list and any(x.__class__ is SparseTensor and x._indefinite for x in a):
            break
    else:
        return
    if (
        _differentiable(args)
        and func.overloadpacket not in NO_GRADIENT
        and _through_transform_wrapper()
    ):
        raise NotImplementedError(
            f"sparsefill: {func} of a SparseTensor with an indefinite fill inside "
            "torch.func.grad/vjp/jacrev/jvp is not supported: torch's derivative formulas run "
            "there with dense semantics and ignore the masked-out elements (e.g. mean's "
            "gradient would divide by every element); use torch.autograd.grad "
            "(A.detach().requires_grad_(), then torch.autograd.grad(f(A), A)), or a defined fill"
        )


def _differentiable(args) -> bool:
    """An indefinite SparseTensor operand of a floating or complex dtype (a bool or integer one has
    no gradient: ``(A > 0).sum()``)."""
    for a in args:
        for x in a if a.__class__ is list else (a,):
            if (
                x.__class__ is SparseTensor
                and x._indefinite
                and (x.dtype.is_floating_point or x.dtype.is_complex)
            ):
                return True
    return False


def _through_transform_wrapper() -> bool:
    """The dispatched call came from a function a differentiation transform runs, on its wrapper (no
    sparsefill entry point between them): read from the frames above this call's
    ``__torch_dispatch__``."""
    dispatch, trusted, transforms = _codes()
    f = sys._getframe(2)
    while f is not None and f.f_code is not dispatch:  # this call's own __torch_dispatch__
        f = f.f_back
    f = f.f_back if f is not None else None
    while f is not None:
        code = f.f_code
        if code in trusted:
            return False
        if code in transforms:
            return True
        f = f.f_back
    return False


_CODES: tuple = ()


def _codes() -> tuple:
    """``(SparseTensor.__torch_dispatch__'s code, the trusted entry points' codes, the transforms'
    codes)``."""
    global _CODES
    if not _CODES:
        from torch._functorch import eager_transforms as et
        from torch.autograd import graph

        dispatch = SparseTensor.__torch_dispatch__.__func__.__code__
        trusted = {
            dispatch,
            SparseTensor.__torch_function__.__func__.__code__,
            graph._engine_run_backward.__code__,
        }
        _CODES = (dispatch, frozenset(trusted), transform_codes(et))
    return _CODES


TRANSFORMS = ("grad_and_value_impl", "_vjp_with_argnums", "_jvp_with_argnums")


def transform_codes(et) -> frozenset:
    """The code objects of torch.func's differentiation transforms (``grad``, ``vjp``/``jacrev``,
    ``jvp``/``jacfwd``) found in ``torch._functorch.eager_transforms`` (tests check that all are
    found)."""
    import inspect  # (unwrap: grad_and_value_impl and _vjp_with_argnums are decorated)

    return frozenset(
        inspect.unwrap(getattr(et, name)).__code__ for name in TRANSFORMS if hasattr(et, name)
    )
