"""Driver shared by every masked op on a sparse input: canonical mask, autograd, result building.

A *compute* function maps a :class:`~._canon.Masked` ``X`` to a :class:`Result` whose tensors
are differentiable functions of ``X.u`` and ``X.fill`` only.  :func:`run` calls it directly
when no gradient is needed, and otherwise inside :class:`MaskedFn`, whose backward is::

    grad_input = SparseTensor(pattern of X, d out / d u, fill 0)       when X.mfill is False
    grad_input = d dense_ref(input.to_dense()) / d input                otherwise (dense by nature)

The first line is exact: positions outside the pattern are masked out, so nothing depends on them.
"""

from __future__ import annotations

import dataclasses

import torch

from .. import _convert
from .._autograd import grad_parts
from .._tensor import SparseTensor
from ._canon import as_sparse, combine, is_sparse, mask_to_dense

__all__ = ["Result", "run", "dense_mask", "dense_fallback"]


@dataclasses.dataclass
class Result:
    """A dense result (``dense``) or the parts of a sparse one (COO indices over its sparse dims)."""

    dense: torch.Tensor | None = None
    idx: torch.Tensor | None = None
    vals: torch.Tensor | None = None
    fill: torch.Tensor | None = None
    shape: tuple = ()
    layout: torch.layout = torch.sparse_coo
    indefinite: bool = False
    like: SparseTensor | None = None   # a coalesced tensor whose pattern, shape and layout the result shares

    def tensors(self):
        return [self.dense] if self.dense is not None else [self.vals, self.fill]

    def build(self):
        if self.dense is not None:
            return self.dense
        fill = self.fill if not self.indefinite else self.vals.new_empty(0)
        if self.like is not None:  # the input's own index tensors (no CSR rebuild)
            L = self.like
            return _convert.rewrap(L, values=self.vals.reshape(L._vals.shape), fill=fill, indefinite=self.indefinite,
                                   known_zero=False)
        layout = self.layout if self.idx.shape[0] >= 2 else torch.sparse_coo
        return _convert.parts_to_sparse(self.idx, self.vals, self.shape, fill, indefinite=self.indefinite,
                                        layout=layout, coalesced=True)


def dense_mask(mask, input):
    """A strided bool mask for a strided ``input`` (None stays None)."""
    if mask is None:
        return None
    return mask_to_dense(mask, input.shape).clone() if is_sparse(mask) else mask


class MaskedFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, A, X, compute, dense_ref):
        with torch.enable_grad():
            u = X.u.detach().requires_grad_()
            f = X.fill.detach().requires_grad_()
            res = compute(dataclasses.replace(X, u=u, fill=f))
        ctx.X, ctx.u, ctx.res, ctx.dense_ref = X, u, res, dense_ref
        built = Result(**{**res.__dict__, "dense": None if res.dense is None else res.dense.detach(),
                          "vals": None if res.vals is None else res.vals.detach(),
                          "fill": None if res.fill is None else res.fill.detach()}).build()
        ctx.out_pattern = None
        if isinstance(built, SparseTensor):  # the pattern of res.vals (a CSR build may pad batches)
            ctx.out_pattern = built if res.like is not None else _convert.parts_to_sparse(
                res.idx, res.vals.detach(), res.shape, built._fill, indefinite=res.indefinite, layout=torch.sparse_coo,
                coalesced=True)
        return built

    @staticmethod
    def backward(ctx, G):
        X = ctx.X
        if X.mfill:  # masked-in unspecified elements: their gradients differ per slice
            _convert.check_densify_quiet(X.A, "the backward of a masked op with masked-in unspecified elements")
            with torch.enable_grad():
                x = _convert.dense_of(_convert.rewrap(X.A)).requires_grad_()
                out = ctx.dense_ref(x)
            g = G.to_dense() if isinstance(G, SparseTensor) else G
            (gx,) = torch.autograd.grad(out, x, g, allow_unused=True)  # a fresh graph each call
            return (torch.zeros_like(x) if gx is None else gx), None, None, None
        res = ctx.res
        if res.dense is not None:
            outs, grads = [res.dense], [G.to_dense() if isinstance(G, SparseTensor) else G]
        else:
            gv, gf = grad_parts(G, ctx.out_pattern)
            outs, grads = [res.vals], [gv.reshape(res.vals.shape)]
            if gf is not None and res.fill.requires_grad:
                outs.append(res.fill)
                grads.append(gf.expand(res.fill.shape) if gf.shape != res.fill.shape else gf)
        pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad]
        gu = None
        if pairs:
            (gu,) = torch.autograd.grad([o for o, _ in pairs], [ctx.u], [g for _, g in pairs], allow_unused=True,
                                        retain_graph=True)
        if gu is None:
            gu = torch.zeros_like(ctx.u)
        if X.same_pattern and X.A._coalesced:  # the input's layout and index tensors (no merge downstream)
            gA = _convert.rewrap(X.A, values=gu.reshape(X.A._vals.shape), fill=gu.new_zeros(()), indefinite=False,
                                 known_zero=True)
        else:
            gA = _convert.parts_to_sparse(X.indices(), gu, X.A.shape, gu.new_zeros(()), known_zero=True,
                                          layout=torch.sparse_coo, coalesced=True)
        return gA, None, None, None


def run(input, mask, compute, dense_ref, zero_absorbs=False, counts=False):
    """``compute(combine(input, mask))`` built into a result, with autograd when ``input`` needs it.
    ``counts``: see :func:`._canon.combine` (without autograd: counted fills would need gradients too)."""
    A = as_sparse(input)
    grad = torch.is_grad_enabled() and A.requires_grad
    X = combine(A, mask, zero_absorbs and not grad, counts and not grad)  # dropped zeros still have gradients
    if grad:
        return MaskedFn.apply(A, X, compute, dense_ref)
    with torch.no_grad():
        return compute(X).build()


def dense_fallback(input, mask, dense_op):
    """A result that is dense by nature (e.g. softmax along a sparse dim with every element masked in):
    computed on the dense equivalent (no DensifyWarning; the densify policy's byte limit applies) and
    returned in the input's layout."""
    A = as_sparse(input)
    _convert.check_densify_quiet(A, "a masked normalization with masked-in unspecified elements")
    x = A.to_dense()
    m = None if mask is None else mask_to_dense(mask, A.shape)
    out = dense_op(x, m)
    from .._compile import every_element, traced
    if traced(out):  # torch.compile: every element stored (to_sparse's nse would be read from the data)
        return every_element(out, A._sf_layout, A.dense_dim())
    from .._creation import to_sparse
    return to_sparse(out, layout=A._sf_layout, dense_dim=A.dense_dim())
