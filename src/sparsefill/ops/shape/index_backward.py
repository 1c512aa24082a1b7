"""The backward of row and column selection (``A[idx]``, ``A[:, idx]``, ``A.index_select(dim, idx)``
along a sparse dim), as sparse as its forward.  torch's formulas scatter the upstream gradient into
``grad.new_zeros(A.shape)``, a dense tensor of ``A``'s full size (40 GB for a 100k-node graph); here
the gradient's elements go back to the coordinates they were selected from::

    grad_A = zeros(A.shape).index_add_(dim, idx, G)         (duplicates in idx: their gradients add)

Where ``A``'s gradient is read only at its pattern and in sum (``pattern_grad_is_exact``: ``A`` from
a constructor, element-wise ops between), that gradient on ``A``'s pattern, the fill the mean of the
rest (:func:`pattern_grad`, O(nse + stored elements of ``G`` * log nse)); else (a leaf) exactly, a
SparseTensor with fill 0 storing ``G``'s elements (every element of ``G`` where its fill is not 0:
dense by nature there, through the densify policy) (:func:`index_select_grad`).

>>> import torch, sparsefill
>>> v = torch.tensor([1., 2., 3.], requires_grad=True)
>>> A = sparsefill.sparse_coo_tensor([[0, 1, 2], [1, 0, 2]], v, (3, 3), fill_value=0.)
>>> A[torch.tensor([2, 0, 2])].values().sum().backward()
>>> v.grad.tolist()
[1.0, 0.0, 2.0]
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from sparsefill._kernels import index as _index
from sparsefill._autograd.functions import _pattern, refuse_vmap, sparse_inside
from sparsefill._tensor.parts import (
    coalesced_parts,
    dense_to_sparse,
    every_element,
    linear_parts,
    parts_to_sparse,
)
from sparsefill._tensor.policy import check_specify
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops.autograd_routes import register_route
from sparsefill.ops.shape.indexing import out_of_bounds
from sparsefill.ops.linalg.backward import pattern_grad_is_exact
from sparsefill.ops.reductions.backward import _FLOATS, _bind, _on_pattern, _upstream

T = torch.Tensor


def index_select_grad(shape, sd: int, dim: int, index: torch.Tensor, G) -> SparseTensor:
    """``zeros(shape).index_add_(dim, index, G)`` for a sparse ``dim`` of a tensor with ``sd``
    sparse dims: ``G``'s stored elements with coordinate ``index[c]`` in place of ``c`` along
    ``dim``, repeats summed, fill 0 (a dense ``G``: its nonzero elements; a nonzero fill: every
    element of ``G``)."""
    G = _as_upstream(G, sd)
    if G._fill_is_zero():
        idx, vals = coalesced_parts(G)
    else:
        check_specify(
            "the gradient of an index_select whose upstream gradient has a nonzero fill",
            _index.numel(G._sparse_shape),
            G.element_size() * _index.numel(G._dense_shape),
        )
        idx, vals = every_element(G)
    new = idx.clone()
    new[dim] = index.index_select(0, idx[dim])
    new, vals = _index.coalesce(new, vals, shape[:sd])
    return parts_to_sparse(
        new, vals, torch.Size(shape), vals.new_zeros(()), known_zero=True, coalesced=True
    )


def _as_upstream(G, sd: int) -> SparseTensor:
    """The upstream gradient as a SparseTensor split as the input (``sd`` sparse dims), an
    indefinite fill read as 0; a dense one: its nonzero elements stored."""
    if isinstance(G, SparseTensor):
        G = _upstream(G, sd)
    if not isinstance(G, SparseTensor):
        G = dense_to_sparse(G, G.new_zeros(()), False, True, torch.sparse_coo, G.dim() - sd)
    return G


def pattern_grad(P: SparseTensor, dim: int, index: torch.Tensor, G) -> SparseTensor:
    """The gradient of ``P`` through ``P.index_select(dim, index)`` at ``P``'s pattern, its fill the
    mean over the unspecified elements (exact for the constructor, which reads the pattern and the
    sum).  With ``G = G0 + f`` (``G0``: ``G``'s stored values less its fill ``f``), the element of
    ``P`` at coordinate ``c`` gets ``f * count[c]`` (``c``'s occurrences in ``index``) plus the
    ``G0`` mapped onto it; the unspecified elements share ``f * sum_c count[c] * (unspecified at
    c)`` plus the ``G0`` mapped onto none."""
    sd, S = P._sparse_ndim(), P._sparse_shape
    pidx, _ = coalesced_parts(P)
    G = _as_upstream(G, sd)
    (gidx, gvals), f = coalesced_parts(G), G._fill.expand(tuple(G._dense_shape))
    n = P.shape[dim]
    count = torch.bincount(index, minlength=n)
    mapped = gidx.clone()
    mapped[dim] = index.index_select(0, gidx[dim])
    # (P's keys: cached)
    pos, found = _index.lookup(linear_parts(P)[0], _index.linearize(mapped, S))
    g0 = (gvals - f).to(P.dtype)
    bc = (-1,) + (1,) * len(f.shape)
    gv = (count.index_select(0, pidx[dim]).view(bc) * f).to(P.dtype)
    gv.index_add_(0, pos[found], g0[found])
    n_unspec = _index.numel(S) - pidx.shape[1]
    if P._indefinite or not n_unspec:
        return _on_pattern(P, pidx, gv, gv.new_zeros(f.shape), True)
    # (unspecified at each c)
    per = _index.numel(S) // max(n, 1) - torch.bincount(pidx[dim], minlength=n)
    rest = g0[~found].sum(0) + f * (count * per).sum().to(f.dtype)
    return _on_pattern(P, pidx, gv, (rest / n_unspec).to(P.dtype), False)


class SparseIndexSelect(torch.autograd.Function):
    """``A.index_select(dim, index)`` along a sparse dim; the backward is :func:`pattern_grad` where
    ``exact`` (``pattern_grad_is_exact(A)``), else :func:`index_select_grad`."""

    @staticmethod
    def forward(A, dim, index, exact):
        return _pattern(A).index_select(dim, index)

    @staticmethod
    def setup_context(ctx, inputs, output):
        A, ctx.dim, index, exact = inputs
        ctx.shape, ctx.sd = tuple(A.shape), A._sparse_ndim()
        ctx.pattern = _pattern(A) if exact else None  # (graph-free)
        ctx.input_grad_exact = (
            exact  # (read by pattern_grad_is_exact for a selection of this output)
        )
        ctx.save_for_backward(index)

    vmap = staticmethod(lambda info, in_dims, *args: refuse_vmap("a SparseTensor index_select"))

    @staticmethod
    @once_differentiable
    def backward(ctx, G):
        (index,) = ctx.saved_tensors
        G = sparse_inside(G)
        if ctx.pattern is not None:
            return pattern_grad(ctx.pattern, ctx.dim, index.long(), G), None, None, None
        return index_select_grad(ctx.shape, ctx.sd, ctx.dim, index, G), None, None, None


def _selectable(A, dim, index) -> bool:
    """A SparseTensor needing a gradient, selected along a sparse dim by a 1-D integer tensor."""
    return (
        isinstance(A, SparseTensor)
        and A.requires_grad
        and A.dtype in _FLOATS
        and isinstance(dim, int)
        and not isinstance(dim, bool)
        and -A.dim() <= dim < A.dim()
        and dim % A.dim() < A._sparse_ndim()
        and isinstance(index, torch.Tensor)
        and not isinstance(index, SparseTensor)
        and index.dim() == 1
        and index.dtype in (torch.int64, torch.int32)
        and not index.requires_grad
    )


def _sig_index_select(input, dim, index, *, out=None):
    return input, dim, index, out


# (torch's own function too: torch_geometric replaces torch.index_select by a wrapper calling it
# with out=None)
@register_route(torch._C._VariableFunctions.index_select, torch.index_select, T.index_select)
def _route_index_select(func, args, kwargs):
    b = _bind(_sig_index_select, args, kwargs)
    if not b or b[3] is not None or not _selectable(*b[:3]):
        return NotImplemented
    A, dim, index, _ = b
    if out_of_bounds(index, A.shape[dim], negative=False) is not None:
        return NotImplemented  # (torch's error from the forward)
    return SparseIndexSelect.apply(A, dim % A.dim(), index, pattern_grad_is_exact(A))


@register_route(T.__getitem__)
def _route_getitem(func, args, kwargs):
    """``A[t]``, ``A[:, t]``, ...: one 1-D integer tensor after full slices ``:`` (negative indices
    wrap)."""
    if len(args) != 2 or kwargs:
        return NotImplemented
    A, key = args
    key = key if isinstance(key, tuple) else (key,)
    dim = next(
        (d for d, k in enumerate(key) if not (isinstance(k, slice) and k == slice(None))), None
    )
    if (
        dim is None
        or any(not (isinstance(k, slice) and k == slice(None)) for k in key[dim + 1 :])
        or not _selectable(A, dim, key[dim])
    ):
        return NotImplemented
    index, n = key[dim], A.shape[dim]
    if out_of_bounds(index, n) is not None:
        return NotImplemented  # (torch's IndexError from the forward)
    return SparseIndexSelect.apply(A, dim, index.long() % max(n, 1), pattern_grad_is_exact(A))
