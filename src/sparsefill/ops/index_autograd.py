"""The backward of row and column selection (``A[idx]``, ``A[:, idx]``, ``A.index_select(dim, idx)`` along a
sparse dim), as sparse as its forward.  torch's formulas scatter the upstream gradient into
``grad.new_zeros(A.shape)``, a dense tensor of ``A``'s full size (40 GB for a 100k-node graph); here the
gradient's elements go back to the coordinates they were selected from::

    grad_A = zeros(A.shape).index_add_(dim, idx, G)         (duplicates in idx: their gradients add)

a SparseTensor with fill 0 storing ``G``'s elements (every element of ``G`` where its fill is not 0: dense
by nature there, through the densify policy), O(elements of ``G``); the constructor's backward reads it at
``A``'s pattern and sums the rest into the fill's gradient.

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

from .. import _index
from .._autograd import _pattern, refuse_vmap, sparse_inside
from .._convert import coalesced_parts, dense_to_sparse, every_element, parts_to_sparse
from .._policy import check_specify
from .._tensor import SparseTensor
from .autograd_routes import register_route
from .indexing import out_of_bounds
from .reduction_autograd import _FLOATS, _bind, _upstream

T = torch.Tensor


def index_select_grad(shape, dim: int, index: torch.Tensor, G) -> SparseTensor:
    """``zeros(shape).index_add_(dim, index, G)`` for a sparse ``dim`` of a tensor with ``sd`` sparse dims:
    ``G``'s stored elements with coordinate ``index[c]`` in place of ``c`` along ``dim``, repeats summed,
    fill 0 (a dense ``G``: its nonzero elements; a nonzero fill: every element of ``G``)."""
    sd = len(shape) - (G.dense_dim() if isinstance(G, SparseTensor) else 0)
    if not isinstance(G, SparseTensor):
        zero = G.new_zeros(())
        G = dense_to_sparse(G, zero, False, True, torch.sparse_coo, 0)
    G = _upstream(G, sd)  # (an indefinite fill read as 0)
    if isinstance(G, SparseTensor) and G._fill_is_zero():
        idx, vals = coalesced_parts(G)
    else:
        if isinstance(G, SparseTensor):
            check_specify("the gradient of an index_select whose upstream gradient has a nonzero fill",
                          G.numel() // max(_index.numel(G._dense_shape), 1), G.element_size())
            idx, vals = every_element(G)
        else:  # (_upstream made it dense: it split its dims otherwise)
            G = dense_to_sparse(G, G.new_zeros(()), False, True, torch.sparse_coo, 0)
            idx, vals = coalesced_parts(G)
    sd = idx.shape[0]
    new = idx.clone()
    new[dim] = index.index_select(0, idx[dim])
    new, vals = _index.coalesce(new, vals, shape[:sd])
    return parts_to_sparse(new, vals, torch.Size(shape), vals.new_zeros(()), known_zero=True, coalesced=True)


class SparseIndexSelect(torch.autograd.Function):
    """``A.index_select(dim, index)`` along a sparse dim; the backward is :func:`index_select_grad`."""

    @staticmethod
    def forward(A, dim, index):
        return _pattern(A).index_select(dim, index)

    @staticmethod
    def setup_context(ctx, inputs, output):
        A, ctx.dim, index = inputs
        ctx.shape = tuple(A.shape)
        ctx.save_for_backward(index)

    vmap = staticmethod(lambda info, in_dims, *args: refuse_vmap("a SparseTensor index_select"))

    @staticmethod
    @once_differentiable
    def backward(ctx, G):
        (index,) = ctx.saved_tensors
        return index_select_grad(ctx.shape, ctx.dim, index, sparse_inside(G)), None, None


def _selectable(A, dim, index) -> bool:
    """A SparseTensor needing a gradient, selected along a sparse dim by a 1-D integer tensor."""
    return isinstance(A, SparseTensor) and A.requires_grad and A.dtype in _FLOATS and isinstance(dim, int) \
        and not isinstance(dim, bool) and -A.dim() <= dim < A.dim() and dim % A.dim() < A._sparse_ndim() \
        and isinstance(index, torch.Tensor) and not isinstance(index, SparseTensor) and index.dim() == 1 \
        and index.dtype in (torch.int64, torch.int32) and not index.requires_grad


def _sig_index_select(input, dim, index):
    return input, dim, index


@register_route(torch.index_select, T.index_select)
def _route_index_select(func, args, kwargs):
    b = _bind(_sig_index_select, args, kwargs)
    if not b or not _selectable(*b):
        return NotImplemented
    A, dim, index = b
    if out_of_bounds(index, A.shape[dim], negative=False) is not None:
        return NotImplemented  # (torch's error from the forward)
    return SparseIndexSelect.apply(A, dim % A.dim(), index)


@register_route(T.__getitem__)
def _route_getitem(func, args, kwargs):
    """``A[t]``, ``A[:, t]``, ...: one 1-D integer tensor after full slices ``:`` (negative indices wrap)."""
    if len(args) != 2 or kwargs:
        return NotImplemented
    A, key = args
    key = key if isinstance(key, tuple) else (key,)
    dim = next((d for d, k in enumerate(key) if not (isinstance(k, slice) and k == slice(None))), None)
    if dim is None or any(not (isinstance(k, slice) and k == slice(None)) for k in key[dim + 1:]) or \
            not _selectable(A, dim, key[dim]):
        return NotImplemented
    index, n = key[dim], A.shape[dim]
    if out_of_bounds(index, n) is not None:
        return NotImplemented  # (torch's IndexError from the forward)
    return SparseIndexSelect.apply(A, dim, index.long() % max(n, 1))
