"""``x.sparse_mask(A)`` of a dense ``x`` that requires grad, ``A`` a SparseTensor: x's gradient is
the upstream gradient at A's pattern, 0 elsewhere, dense as ``x`` is::

    d/dx  x.sparse_mask(A) . G  ==  G.sparse_mask(A).to_dense()

(torch's formula, ``sparse_mask_backward``, asks ``mask.is_coalesced()`` and projects with the aten
ops of its own sparse layouts: on a SparseTensor mask it raised).  The forward is
``ops/linalg/sampled.py``'s handler.

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

from sparsefill._autograd.functions import dense_grad, sparse_inside
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops.autograd_routes import register_route
from sparsefill.ops.linalg.sampled import pattern_product


class SparseMask(torch.autograd.Function):
    """``x.sparse_mask(A)``, differentiable in ``x`` (``A``: the pattern, not differentiated, as
    torch's mask)."""

    @staticmethod
    def forward(x, A):
        # (grad mode off in here: the route declines, the handler runs)
        return torch.Tensor.sparse_mask(x, A)

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
    if (
        isinstance(x, SparseTensor)
        or not isinstance(A, SparseTensor)
        or not x.requires_grad
        or len(args) + len(kwargs) != 2
    ):
        return NotImplemented
    return SparseMask.apply(x, A)


class SampledAddmm(torch.autograd.Function):
    """``torch.sparse.sampled_addmm(A, m1, m2, beta=, alpha=)`` for a SparseTensor pattern ``A``
    (2-D or a batch ``(b, m, n)``), differentiable in ``A``, ``m1`` and ``m2`` with torch's kernels
    on the CSR view of the
    pattern (``G`` the upstream gradient, ``P(G)`` its values at the pattern, a CSR matrix)::

        dA = beta * G        dm1 = alpha * P(G) @ m2^T        dm2 = alpha * m1^T @ P(G)

    no ``(nse, k)`` temporary and no dense ``m x n`` one (torch's own formula is 2-D only)."""

    @staticmethod
    def forward(A, m1, m2, beta, alpha):
        return torch.sparse.sampled_addmm(A, m1, m2, beta=beta, alpha=alpha)

    @staticmethod
    def setup_context(ctx, inputs, output):
        A, m1, m2, ctx.beta, ctx.alpha = inputs
        ctx.A = A.detach()
        ctx.save_for_backward(m1, m2)

    @staticmethod
    def backward(ctx, G):
        m1, m2 = ctx.saved_tensors
        G = sparse_inside(G)
        gA = G * ctx.beta if ctx.needs_input_grad[0] else None
        if not (ctx.needs_input_grad[1] or ctx.needs_input_grad[2]):
            return gA, None, None, None, None
        g1, g2 = pattern_product(ctx.A, _values_at(G, ctx.A), m1, m2, ctx.needs_input_grad[1:3])
        scale = (
            (lambda t: t) if ctx.alpha == 1 else (lambda t: None if t is None else t * ctx.alpha)
        )
        return gA, scale(g1), scale(g2), None, None


def _values_at(G, A: SparseTensor) -> torch.Tensor:
    """``G``'s values at ``A``'s (coalesced) stored elements, in their order."""
    if (
        isinstance(G, SparseTensor)
        and G._sf_layout is A._sf_layout
        and not G._indefinite
        and ((G._crow is A._crow and G._col is A._col) or (G._idx is not None and G._idx is A._idx))
    ):
        return G._vals.reshape(-1)
    if isinstance(G, SparseTensor):
        G = dense_grad(G)
    return torch.Tensor.sparse_mask(G, A)._vals.reshape(-1)


@register_route(torch.sparse.sampled_addmm)
def _sampled_addmm(func, args, kwargs):
    A, m1, m2 = (list(args) + [kwargs.get(n) for n in ("input", "mat1", "mat2")[len(args) :]])[:3]
    if (
        not isinstance(A, SparseTensor)
        or isinstance(m1, SparseTensor)
        or isinstance(m2, SparseTensor)
        or not any(isinstance(t, torch.Tensor) and t.requires_grad for t in (A, m1, m2))
        or set(kwargs) - {"input", "mat1", "mat2", "beta", "alpha"}
    ):
        return NotImplemented
    return SampledAddmm.apply(A, m1, m2, kwargs.get("beta", 1), kwargs.get("alpha", 1))
