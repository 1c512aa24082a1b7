"""Autograd routes for the losses whose ``mean`` torch differentiates above ``__torch_dispatch__``
(``l1_loss``: a composite, ``binary_cross_entropy_with_logits``: a derivative formula), where the
gradient divides by ``numel``: on an indefinite operand the forward is the masked mean (over the
specified elements), so the route computes ``sum / count`` and autograd differentiates that.

>>> import torch, sparsefill, torch.nn.functional as F
>>> v = torch.tensor([1., 3.], requires_grad=True)
>>> A = sparsefill.sparse_coo_tensor([[0, 2]], v, (4,), fill_value=sparsefill.indefinite)
>>> F.l1_loss(A, torch.zeros(4)).backward()
>>> v.grad
tensor([0.5000, 0.5000])
"""

from __future__ import annotations

import inspect

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
