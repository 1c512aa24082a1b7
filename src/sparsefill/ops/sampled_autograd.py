"""``x.sparse_mask(A)`` of a dense ``x`` that requires grad, ``A`` a SparseTensor: x's gradient is the upstream
gradient at A's pattern, 0 elsewhere, dense as ``x`` is::

    d/dx  x.sparse_mask(A) . G  ==  G.sparse_mask(A).to_dense()

(torch's formula, ``sparse_mask_backward``, asks ``mask.is_coalesced()`` and projects with the aten ops of its own
sparse layouts: on a SparseTensor mask it raised).  The forward is ``ops/sampled.py``'s handler.

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor([[0, 1], [1, 0]], [1., 1.], (2, 2))
>>> x = torch.ones(2, 2, requires_grad=True)
>>> x.sparse_mask(A).sum().backward()
>>> x.grad
tensor([[0., 1.],
        [1., 0.]])
"""

from __future__ import annotations

import torch

from .._autograd import dense_grad, sparse_inside
from .._tensor import SparseTensor
from .autograd_routes import register_route


class SparseMask(torch.autograd.Function):
    """``x.sparse_mask(A)``, differentiable in ``x`` (``A``: the pattern, not differentiated, as torch's mask)."""

    @staticmethod
    def forward(x, A):
        return torch.Tensor.sparse_mask(x, A)  # (grad mode off in here: the route declines, the handler runs)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.A = inputs[1].detach()

    @staticmethod
    def backward(ctx, G):
        G = sparse_inside(G)
        G = dense_grad(G) if isinstance(G, SparseTensor) else G
        return torch.Tensor.sparse_mask(G, ctx.A).to_dense(), None


@register_route(torch.Tensor.sparse_mask)
def _sparse_mask(func, args, kwargs):
    x, A = args[0], args[1] if len(args) > 1 else kwargs.get("mask")
    if isinstance(x, SparseTensor) or not isinstance(A, SparseTensor) or not x.requires_grad or \
            len(args) + len(kwargs) != 2:
        return NotImplemented
    return SparseMask.apply(x, A)
