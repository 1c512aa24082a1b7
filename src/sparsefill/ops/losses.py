"""Element-wise losses between a SparseTensor and a dense or SparseTensor target, in closed form.

Each loss is an element-wise map ``l(x, y)`` followed by the reduction (``none``, ``sum``,
``mean``)::

    mse_loss           (x - y) ** 2
    smooth_l1_loss     |x - y| < beta  ?  0.5 (x - y) ** 2 / beta  :  |x - y| - 0.5 beta
    huber_loss         |x - y| < delta ?  0.5 (x - y) ** 2         :  delta (|x - y| - 0.5 delta)
    soft_margin_loss   log(1 + exp(-y x))
    binary_cross_entropy               -w (y log x + (1 - y) log(1 - x))     (logs clamped at -100)
    binary_cross_entropy_with_logits   -w (p y log sigmoid(x) + (1 - y) log(1 - sigmoid(x)))

For two SparseTensors ``l`` maps the union of their patterns and the fills (``l(fA, fB)``), and
``sum`` is ``sum over stored + n * l(fA, fB)``: O(nse).  A dense target makes the element-wise
loss dense by nature (each unspecified element meets its own target): it is computed once, and a
reduction of it is a dense reduction.  An indefinite fill is a mask: the reductions skip the
masked-out elements (``mean`` divides by the number of stored elements), as ``torch.masked`` does.
The gradients (``mse_loss_backward``, ...) are the element-wise derivative times the upstream
gradient, on the same pattern.

>>> import torch, sparsefill, torch.nn.functional as F
>>> A = sparsefill.sparse_coo_tensor([[0, 2]], [1., 3.], (4,), fill_value=0.)
>>> B = sparsefill.sparse_coo_tensor([[2, 3]], [1., 1.], (4,), fill_value=0.)
>>> F.smooth_l1_loss(A, B, reduction="sum")
tensor(3.)
"""

from __future__ import annotations

import torch

from ._closed_form import decomposed, sparse_operands, stored_and_fill
from .registry import register

aten = torch.ops.aten


@register(
    aten.mse_loss.default,
    aten.mse_loss_backward.default,
    aten.smooth_l1_loss.default,
    aten.huber_loss.default,
    aten.huber_loss_backward.default,
    aten.soft_margin_loss.default,
    aten.soft_margin_loss_backward.default,
    aten.binary_cross_entropy_with_logits.default,
)
def _elementwise_loss(func, args, kwargs):
    """The loss (or its gradient) as the element-wise map and reduction of the module docstring,
    on the stored elements and the fills."""
    return decomposed(func, args, kwargs)


@register(aten.binary_cross_entropy.default, aten.binary_cross_entropy_backward.default)
def _binary_cross_entropy(func, args, kwargs):
    """``binary_cross_entropy`` (and its gradient) in closed form; torch's check that every
    input is in ``[0, 1]`` runs on the stored values and the fill (NaN fails it, as in torch)."""
    if func is aten.binary_cross_entropy.default:
        x = args[0] if args else kwargs["self"]
        for A in sparse_operands((x,), {}):
            for v in stored_and_fill(A):
                if not bool(((v >= 0) & (v <= 1)).all()):
                    raise RuntimeError("all elements of input should be between 0 and 1")
    return decomposed(func, args, kwargs)


@register(aten.smooth_l1_loss_backward.default)
def _smooth_l1_loss_backward(func, args, kwargs):
    """The gradient of ``smooth_l1_loss``, as torch's kernel branches (a NaN difference gives a NaN
    gradient, where ``sign`` would give 0)::

        x < -beta: -g        x > beta: g        else: g x / beta        (g: grad / numel for mean)
    """
    grad, x, y, reduction, beta = _bound(func, args, kwargs)
    g = grad / x.numel() if reduction == 1 else grad
    d = x - y
    return torch.where(d < -beta, -g, torch.where(d > beta, g, g * d / beta))


def _bound(func, args, kwargs) -> list:
    """The arguments of ``func``'s schema in order, keywords and defaults filled in."""
    names = [a.name for a in func._schema.arguments]
    defaults = {a.name: a.default_value for a in func._schema.arguments if a.has_default_value()}
    given = dict(zip(names, args), **kwargs)
    return [given[n] if n in given else defaults[n] for n in names]
