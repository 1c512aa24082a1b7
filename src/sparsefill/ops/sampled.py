"""Sampling at a 2-D SparseTensor's pattern: ``x.sparse_mask(A)`` and the sampled product (SDDMM)
``torch.sparse.sampled_addmm(A, m1, m2, beta=, alpha=)``::

    out = A with values beta * A[i, j] + alpha * (m1 @ m2)[i, j] at A's stored (i, j), and fill beta * fill

    x.sparse_mask(A) = A's pattern with the values x[i, j] and fill 0

as torch's on a native CSR tensor (fill 0: the unspecified elements stay 0); an indefinite fill stays
indefinite (the scores of a sparse attention on the mask's pattern, no dense ``m1 @ m2``).  O(nse x k).

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor([[0, 1], [1, 0]], [1., 2.], (2, 2), fill_value=sparsefill.indefinite)
>>> torch.sparse.sampled_addmm(A.to_sparse_csr(), torch.ones(2, 3), torch.ones(3, 2)).values()
tensor([4., 5.])
"""

from __future__ import annotations

import torch

from .._tensor import SparseTensor
from .registry import register

aten = torch.ops.aten


@register(aten.sparse_sampled_addmm.default)
def _sampled_addmm(func, args, kwargs):
    A, m1, m2 = args[:3]
    beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
    if not isinstance(A, SparseTensor) or isinstance(m1, SparseTensor) or isinstance(m2, SparseTensor) \
            or A.dim() != 2 or A.dense_dim() or m1.dim() != 2 or m2.dim() != 2:
        return NotImplemented
    if m1.shape[1] != m2.shape[0] or (m1.shape[0], m2.shape[1]) != tuple(A.shape):
        raise RuntimeError(f"sampled_addmm: self {tuple(A.shape)}, mat1 {tuple(m1.shape)} and mat2 "
                           f"{tuple(m2.shape)} do not fit: need mat1 (m, k), mat2 (k, n), self (m, n)")
    for name, m in (("mat1", m1), ("mat2", m2)):  # (as torch's: the product is not cast to self's dtype)
        if m.dtype != A.dtype:
            raise RuntimeError(f"sampled_addmm: Expected {name} and self to have the same dtype, but got {m.dtype} "
                               f"and {A.dtype}")
    A, rows, cols = _pattern(A)
    sampled = (m1.index_select(0, rows) * m2.t().index_select(0, cols)).sum(1)
    vals = (A._vals * beta if beta != 1 else A._vals) + (sampled * alpha if alpha != 1 else sampled)
    return _like(A, vals.to(A.dtype), A._fill if A._indefinite or beta == 1 else A._fill * beta)


def _like(A: SparseTensor, vals, fill, indefinite=None) -> SparseTensor:
    """A SparseTensor of (coalesced) ``A``'s pattern holding ``vals`` and ``fill`` (indefinite as ``A`` unless told)."""
    indefinite = A._indefinite if indefinite is None else indefinite
    return SparseTensor(A.sparse_layout, A.shape, vals, fill, indices=A._idx, crow=A._crow, col=A._col,
                        indefinite=indefinite, coalesced=True)


def _pattern(A: SparseTensor):
    """``(A coalesced, rows, cols)`` of a 2-D SparseTensor (CSR: rows expanded from ``crow_indices``)."""
    if A.sparse_layout is torch.sparse_coo and not A.is_coalesced():
        A = A.coalesce()  # (one value per stored position, as torch's CSR)
    if A.sparse_layout is torch.sparse_csr:
        rows = torch.repeat_interleave(torch.arange(A.shape[0], device=A._col.device), A._crow.diff(),
                                       output_size=A._col.numel())
        return A, rows, A._col
    return A, A._idx[0], A._idx[1]


@register(aten.sparse_mask.default)
def _sparse_mask(func, args, kwargs):
    x, A = args[0], args[1]
    if not isinstance(A, SparseTensor) or A.dim() != 2 or A.dense_dim() or x.shape != A.shape:
        return NotImplemented
    A, rows, cols = _pattern(A)
    vals = x[rows, cols]
    vals = vals.to_dense() if isinstance(vals, SparseTensor) else vals
    return _like(A, vals.to(x.dtype), torch.zeros((), dtype=x.dtype, device=x.device), indefinite=False)
