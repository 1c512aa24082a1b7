"""Order statistics of a SparseTensor with an indefinite fill (masked semantics, as the masked
reductions): each slice along a sparse dim is its stored elements only (:class:`Masked`).
``sort`` gives them compacted at the front of the slice, the rest unspecified; ``topk`` /
``kthvalue`` take the ``k`` among them; ``mode`` reduces over them (:func:`masked_reduced`: a
slice with none stored is unspecified).
"""

from __future__ import annotations

import torch

from sparsefill._kernels import index as _index
from sparsefill._tensor.parts import coalesced_parts, parts_to_sparse
from sparsefill._tensor.fill import indefinite
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops.order.rows import Rows, mode_rows


class Masked:
    """The stored elements of every slice of an indefinite-fill ``A`` along its sparse dim
    ``dim`` (masked semantics: the unspecified elements are not there).  Groups ``g`` are the
    occupied slices (kept coordinates ``keys``), rows ``g * Dn + c`` their dense coordinates; each
    row's stored values sorted (stable).  ``sel(g, j)``: the flat position, among the coalesced
    stored scalars, of rank ``j`` of every row of the groups ``g``."""

    def __init__(self, A: SparseTensor, dim: int, descending: bool):
        idx, vals = coalesced_parts(A)
        sd, D = A._sparse_ndim(), tuple(A._dense_shape)
        self.Dn = Dn = _index.numel(D)
        kept = [i for i in range(sd) if i != dim]
        self.kshape = [A.shape[i] for i in kept]
        key = _index.linearize(idx[kept], self.kshape)
        self.keys, kinv, self.kcnt = torch.unique(key, return_inverse=True, return_counts=True)
        G, k, dev = self.keys.numel(), key.numel(), key.device
        gstart = torch.cumsum(self.kcnt, 0) - self.kcnt
        ok = torch.sort(kinv, stable=True).indices
        self.rank = torch.empty(k, dtype=torch.int64, device=dev)
        self.rank[ok] = torch.arange(k, device=dev) - gstart[kinv[ok]]
        self.kinv, self.idx, self.D, self.dim = kinv, idx, D, dim
        self.vals, self.size = vals, A.shape[dim]
        r = (kinv[:, None] * Dn + torch.arange(Dn, device=dev)).reshape(-1)
        v = vals.reshape(-1)
        order = torch.sort(v, stable=True, descending=descending).indices
        self.order = order[torch.sort(r[order], stable=True).indices]
        rc = torch.bincount(r, minlength=G * Dn)
        self.rstart = torch.cumsum(rc, 0) - rc
        self.p = idx[dim].repeat_interleave(Dn) if D else idx[dim]

    def sel(self, g: torch.Tensor, j) -> torch.Tensor:
        """``(len(g), Dn)`` flat positions of rank ``j`` (per group or one) of the rows of ``g``."""
        rows = g[:, None] * self.Dn + torch.arange(self.Dn, device=g.device)
        j = j[:, None] if isinstance(j, torch.Tensor) and j.dim() == 1 else j
        return self.order[self.rstart[rows] + j]

    def rows(self) -> Rows:
        """The masked rows as :class:`Rows` (a placeholder fill, never counted)."""
        G, Dn = self.keys.numel(), self.Dn
        r = (self.kinv[:, None] * Dn + torch.arange(Dn, device=self.kinv.device)).reshape(-1)
        v = coalesced_parts_values(self)
        return Rows(r, self.p, v, v.new_zeros(G * Dn), G * Dn, self.size, False)

    def out_indices(self, g: torch.Tensor, keepdim: bool) -> torch.Tensor:
        """The sparse indices of the reduced slices ``g`` (``keepdim``: 0 along ``dim``)."""
        kept = _index.unravel(self.keys[g], self.kshape)
        if not keepdim:
            return kept
        return torch.cat([kept[: self.dim], kept.new_zeros((1, g.numel())), kept[self.dim :]])


def masked_take(A: SparseTensor, sel: torch.Tensor, grad: bool) -> torch.Tensor:
    """The coalesced stored scalars of ``A`` at ``sel``; ``grad``: differentiable (the gradient
    goes to the selected stored values; an indefinite fill has none)."""
    if grad:
        from sparsefill.ops.order.sort_backward import Take

        return Take.apply(A, sel)
    return coalesced_parts(A)[1].reshape(-1)[sel]


def masked_sort(A: SparseTensor, dim: int, descending: bool, k=None, grad=False):
    """sort (``k``: topk) of an indefinite ``A`` along its sparse dim ``dim``: each slice's stored
    elements sorted and compacted to its front, the rest unspecified (indefinite fill)."""
    M = Masked(A, dim, descending)
    keep = torch.ones_like(M.rank, dtype=torch.bool) if k is None else M.rank < k
    g, j = M.kinv[keep], M.rank[keep]
    sel = M.sel(g, j)
    out_idx = M.idx[:, keep].clone()
    out_idx[dim] = j
    shape = list(A.shape)
    if k is not None:
        shape[dim] = k
    vshape = (-1,) + M.D
    vals = masked_take(A, sel.reshape(-1), grad).reshape(vshape)
    pos = M.p[sel].reshape(vshape)
    return tuple(_indefinite_result(out_idx, t, shape, grad) for t in (vals, pos))


def _indefinite_result(idx, vals, shape, grad):
    if grad and vals.requires_grad:
        from sparsefill._creation.constructors import sparse_coo_tensor

        return sparse_coo_tensor(idx, vals, shape, fill_value=indefinite)
    return parts_to_sparse(idx, vals, shape, vals.new_empty(0), indefinite=True)


def masked_reduced(A: SparseTensor, dim: int, keepdim: bool, pick, grad=False):
    """A selecting reduction of an indefinite ``A`` along its sparse dim ``dim``: ``pick(M)``
    gives ``(groups, rank per group)`` of each selected element (the slices with none to select
    are unspecified in the results)."""
    M = Masked(A, dim, False)
    g, sel = pick(M)
    shape = list(A.shape)
    if keepdim:
        shape[dim] = 1
    else:
        del shape[dim]
    vshape = (-1,) + M.D
    out_idx = M.out_indices(g, keepdim)
    vals = masked_take(A, sel.reshape(-1), grad).reshape(vshape)
    pos = M.p[sel].reshape(vshape)
    return tuple(_indefinite_result(out_idx, t, shape, grad) for t in (vals, pos))


def kth_pick(k: int):
    """The ``k``-th smallest of the groups with at least ``k`` stored elements."""

    def pick(M):
        g = torch.nonzero(M.kcnt >= k).squeeze(1)
        return g, M.sel(g, k - 1)

    return pick


def mode_pick(M):
    """The mode of each group's stored elements (:func:`_mode_rows` on them alone, per dense
    coordinate), as the flat position of its chosen element."""
    rows = M.rows()
    _, pos = mode_rows(rows, masked=True)
    G, Dn, size = M.keys.numel(), M.Dn, max(M.size, 1)
    r = (M.kinv[:, None] * Dn + torch.arange(Dn, device=pos.device)).reshape(-1)
    skey, sorder = torch.sort(r * size + M.p)
    want = torch.arange(G * Dn, device=pos.device) * size + pos
    return torch.arange(G, device=pos.device), sorder[torch.searchsorted(skey, want)].reshape(G, Dn)


def coalesced_parts_values(M) -> torch.Tensor:
    return M.vals.reshape(-1)
