"""``F.local_response_norm`` of a SparseTensor, natively::

    out = x / (k + alpha / size * sum_{c' in window(c)} x[:, c'] ** 2) ** beta

with the window ``c - size // 2 .. c + (size - 1) // 2`` over the channel dim (dim 1), zero outside.
torch computes the window sum with an ``avg_pool2d`` / ``avg_pool3d`` across channels; here it is
the sum of ``size`` shifted copies of ``x ** 2`` (``F.pad`` then ``narrow``), each native: O(nse *
size).  Over dense dims (a hybrid tensor whose channels are dense) the pattern is kept; over sparse
dims the pattern is the union of the shifted ones, and the channels within ``size // 2`` of either
end, where the zero padding meets unspecified elements, are dense by nature (stored by ``F.pad``
under the densify policy).  Routed at the torch function (torch's composite would call the pooling
op across a sparse dim), in every grad mode; autograd differentiates the pieces.

>>> import torch, sparsefill, torch.nn.functional as F
>>> A = sparsefill.to_sparse(torch.tensor([[[0.], [2.], [0.], [1.]]]), fill_value=0.)
>>> F.local_response_norm(A, 2).to_dense().flatten()
tensor([0.0000, 1.9997, 0.0000, 1.0000])
"""

from __future__ import annotations

import inspect

import torch.nn.functional as F

from .._tensor import SparseTensor
from .autograd_routes import register_route


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
    padded = F.pad(sq, [0, 0] * (x.dim() - 2) + [lo, hi], value=0.0)
    acc = padded.narrow(1, 0, C)
    for s in range(1, size):
        acc = acc + padded.narrow(1, s, C)
    div = (acc * (a["alpha"] / size) + a["k"]) ** a["beta"]
    return x / div
