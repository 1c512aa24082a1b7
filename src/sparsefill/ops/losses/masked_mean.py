"""Autograd routes for the losses whose ``mean`` torch differentiates above ``__torch_dispatch__``
(``l1_loss``: a composite, ``binary_cross_entropy_with_logits``: a derivative formula), where the
gradient divides by ``numel``: on an indefinite operand the forward is the masked mean (over the
specified elements), so the route computes ``sum / count`` and autograd differentiates that.
``poisson_nll_loss`` is routed too: its composite adds a term in place (below).

>>> import torch, sparsefill, torch.nn.functional as F
>>> v = torch.tensor([1., 3.], requires_grad=True)
>>> A = sparsefill.sparse_coo_tensor([[0, 2]], v, (4,), fill_value=sparsefill.indefinite)
>>> F.l1_loss(A, torch.zeros(4)).backward()
>>> v.grad
tensor([0.5000, 0.5000])
"""

from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F
from torch.nn import _reduction

from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops.autograd_routes import register_route
from sparsefill.ops.losses.losses import averaged_count


@register_route(F.l1_loss, F.binary_cross_entropy_with_logits)
def _masked_mean_loss(func, args, kwargs):
    """``loss(x, y, reduction="mean")`` with an indefinite operand: ``loss(..., "sum") / count``;
    every other call is declined."""
    x = args[0] if args else kwargs.get("input")
    y = args[1] if len(args) > 1 else kwargs.get("target")
    if not any(isinstance(t, SparseTensor) and t._indefinite for t in (x, y)):
        return NotImplemented
    bound = inspect.signature(func).bind(*args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    x, y = a["input"], a["target"]
    if not any(isinstance(t, SparseTensor) and t._indefinite for t in (x, y)):
        return NotImplemented
    reduction = a["reduction"]
    if a["size_average"] is not None or a["reduce"] is not None:
        reduction = _reduction.legacy_get_string(a["size_average"], a["reduce"])
    if reduction != "mean":
        return NotImplemented
    a["reduction"], a["size_average"], a["reduce"] = "sum", None, None
    with torch._C.DisableTorchFunctionSubclass():
        total = func(*bound.args, **bound.kwargs)
    return total / averaged_count(x, y)


@register_route(F.poisson_nll_loss, torch.poisson_nll_loss, always=True)
def _poisson_nll_loss(func, args, kwargs):
    """``poisson_nll_loss`` as torch's composite computes it::

        loss = exp(x) - y x                     (log_input)
             = x - y log(x + eps)               (else)
        full: loss + (y log y - y + 0.5 log(2 pi y)) where y > 1

    but with the Stirling term added out of place: the composite adds it in place, which a
    SparseTensor loss (a NaN fill absorbs the dense term: ``NaN + s == NaN``) cannot take without
    densifying.  Every piece is native; ``mean`` is ``sum / count``, the masked mean for an
    indefinite operand (the specified elements counted)."""
    if func is torch.poisson_nll_loss:  # (a builtin: no signature to bind)
        names = ("input", "target", "log_input", "full", "eps", "reduction")
        a = dict(zip(names, args), **kwargs)
        a["reduction"] = ("none", "mean", "sum")[a["reduction"]]
        a["size_average"] = a["reduce"] = None
    else:
        bound = inspect.signature(func).bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
    x, y = a["input"], a["target"]
    if not any(isinstance(t, SparseTensor) for t in (x, y)):
        return NotImplemented
    reduction = a["reduction"]
    if a["size_average"] is not None or a["reduce"] is not None:
        reduction = _reduction.legacy_get_string(a["size_average"], a["reduce"])
    _reduction.get_enum(reduction)  # (torch's error for an unknown one)
    loss = torch.exp(x) - y * x if a["log_input"] else x - y * torch.log(x + a["eps"])
    if a["full"]:
        stirling = y * torch.log(y) - y + 0.5 * torch.log(2 * math.pi * y)
        loss = loss + stirling.masked_fill(y <= 1, 0)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    # (an indefinite operand: the masked mean, whose gradient divides by the count as well)
    return loss.sum() / averaged_count(x, y)
