"""``F.local_response_norm`` of a SparseTensor, natively::

    out = x / (k + alpha / size * sum_{c' in window(c)} x[:, c'] ** 2) ** beta

with the window ``c - size // 2 .. c + (size - 1) // 2`` over the channel dim (dim 1), zero outside.
torch computes the window sum with an ``avg_pool2d`` / ``avg_pool3d`` across channels; here it is
the sum of ``size`` shifted copies of ``x ** 2`` (``F.pad`` then ``narrow``), each native: O(nse *
size).  Over dense dims (a hybrid tensor whose channels are dense) the pattern is kept; over sparse
dims the pattern is the union of the shifted ones, and the channels within ``size // 2`` of either
end, where the zero padding meets unspecified elements, are dense by nature (stored by ``F.pad``
under the densify policy).  A masked input (indefinite fill): the window sums run over its
masked-in elements (a masked-out one adds nothing), the result has its pattern.  Routed at the
torch function (torch's composite would call the pooling op across a sparse dim), in every grad
mode; autograd differentiates the pieces.

>>> import torch, sparsefill, torch.nn.functional as F
>>> A = sparsefill.to_sparse(torch.tensor([[[0.], [2.], [0.], [1.]]]), fill_value=0.)
>>> F.local_response_norm(A, 2).to_dense().flatten()
tensor([0.0000, 1.9997, 0.0000, 1.0000])
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops.autograd_routes import register_route


@register_route(F.local_response_norm, always=True)
def _local_response_norm(func, args, kwargs):
    bound = inspect.signature(func).bind(*args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    x, size = a["input"], int(a["size"])
    if not isinstance(x, SparseTensor) or x.dim() < 3 or x.numel() == 0:
        return NotImplemented  # (torch's errors and its empty result)
    lo, hi, C = size // 2, (size - 1) // 2, x.shape[1]
    sq = x * x
    if x._indefinite:  # (masked: a masked-out element adds nothing to a window's sum)
        sq = _zero_filled(sq)
    padded = F.pad(sq, [0, 0] * (x.dim() - 2) + [lo, hi], value=0.0)
    acc = padded.narrow(1, 0, C)
    for s in range(1, size):
        acc = acc + padded.narrow(1, s, C)
    div = (acc * (a["alpha"] / size) + a["k"]) ** a["beta"]
    return x / div


def _zero_filled(A: SparseTensor) -> SparseTensor:
    """``A`` (indefinite fill) with fill 0: its stored elements, differentiably."""
    from sparsefill._creation.constructors import sparse_coo_tensor

    B = A.to_sparse_coo().coalesce()
    return sparse_coo_tensor(B.indices(), B.values(), tuple(A.shape), fill_value=0.0)


# ---------------------------------------------------------------------- masked (indefinite) inputs
# A SparseTensor with an indefinite fill is a masked tensor: a layer's statistics run over its
# specified elements only.  The forward handlers get that right (their reductions are masked), but
# torch's backward formulas divide by the slice's full size; so with grad mode on the layer is
# composed of masked reductions and element-wise ops, whose gradients are masked alike.
def _composed(fn):
    """A route whose body calls torch functions on SparseTensors that must meet their own routes
    (the masked reductions' gradients): ``route`` runs routes with torch function disabled."""

    def wrapper(func, args, kwargs):
        if not _masked(args[0] if args else kwargs.get("input")):
            return NotImplemented  # (first: binding the signature costs more than the layer)
        with torch._C._EnableTorchFunction():
            return fn(func, args, kwargs)

    wrapper.__name__ = wrapper.__qualname__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


def _bind(func, args, kwargs):
    bound = inspect.signature(func).bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


def _masked(x) -> bool:
    return isinstance(x, SparseTensor) and x._indefinite


def _normalized(x, dims, eps):
    """``(x - mean) / sqrt(var + eps)`` over ``dims`` (masked statistics), with the mean and the
    biased variance."""
    mean = x.mean(dims, keepdim=True)
    c = x - mean
    var = (c * c).mean(dims, keepdim=True)
    return c * torch.rsqrt(var + eps), mean, var


def _affine(y, weight, bias, shape):
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


@register_route(F.layer_norm)
@_composed
def _masked_layer_norm(func, args, kwargs):
    a = _bind(func, args, kwargs)
    x = a["input"]
    if not _masked(x):
        return NotImplemented
    k = len(tuple(a["normalized_shape"]))
    y = _normalized(x, tuple(range(x.dim() - k, x.dim())), a["eps"])[0]
    return _affine(y, a["weight"], a["bias"], x.shape[x.dim() - k :])


@register_route(F.group_norm)
@_composed
def _masked_group_norm(func, args, kwargs):
    a = _bind(func, args, kwargs)
    x, G = a["input"], a["num_groups"]
    if not _masked(x) or x.dim() < 2 or x.shape[1] % G:
        return NotImplemented  # (torch's errors)
    N, C = x.shape[:2]
    y = _normalized(x.reshape(N, G, -1), (2,), a["eps"])[0].reshape(x.shape)
    return _affine(y, a["weight"], a["bias"], (C,) + (1,) * (x.dim() - 2))


def _update(running, stat, momentum):
    if running is not None:
        with torch.no_grad():
            running.mul_(1 - momentum).add_(momentum * stat.to(running.dtype))


def _unbiased(var, count):
    return var * count / (count - 1)


@register_route(F.batch_norm)
@_composed
def _masked_batch_norm(func, args, kwargs):
    a = _bind(func, args, kwargs)
    x = a["input"]
    if not _masked(x) or not a["training"] or x.dim() < 2:
        return NotImplemented  # (eval: an element-wise map, whose torch gradient is exact)
    dims = (0,) + tuple(range(2, x.dim()))
    y, mean, var = _normalized(x, dims, a["eps"])
    count = (x * 0 + 1).sum(dims)  # the specified elements of each channel
    m = 0.1 if a["momentum"] is None else a["momentum"]
    _update(a["running_mean"], _dense(mean).reshape(-1).detach(), m)
    _update(a["running_var"], _unbiased(_dense(var).reshape(-1), _dense(count)).detach(), m)
    return _affine(y, a["weight"], a["bias"], (x.shape[1],) + (1,) * (x.dim() - 2))


@register_route(F.instance_norm)
@_composed
def _masked_instance_norm(func, args, kwargs):
    a = _bind(func, args, kwargs)
    x = a["input"]
    if not _masked(x) or not a["use_input_stats"] or x.dim() < 3:
        return NotImplemented
    dims = tuple(range(2, x.dim()))
    y, mean, var = _normalized(x, dims, a["eps"])
    count = (x * 0 + 1).sum(dims)
    m = a["momentum"]
    _update(a["running_mean"], _dense(mean).reshape(x.shape[:2]).mean(0).detach(), m)
    uv = _unbiased(_dense(var).reshape(x.shape[:2]), _dense(count))
    _update(a["running_var"], uv.mean(0).detach(), m)
    return _affine(y, a["weight"], a["bias"], (x.shape[1],) + (1,) * (x.dim() - 2))


def _dense(t):
    """A statistic per channel (C numbers) as a strided tensor (NaN where nothing is specified)."""
    if not isinstance(t, SparseTensor):
        return t
    return t.to_dense(fill_value=float("nan")) if t._indefinite else t.to_dense()
