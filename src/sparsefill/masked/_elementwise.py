"""Masked ``logaddexp``: the element-wise op of two masked operands.

    logaddexp(input, other, input_mask=a, other_mask=b) == torch.logaddexp(where(a, input, -inf),
    where(b, other, -inf))

A sparse operand becomes ``where(mask, operand, -inf)`` as a SparseTensor (its pattern joined with
the mask's masked-in pattern) and the two go through sparsefill's element-wise rule (union merge,
autograd included).  The result has the input's layout; a strided operand beside a sparse one makes
the result dense by nature (returned in the input's layout).

>>> import torch, sparsefill
>>> a = torch.tensor([-100.0, -200, -300]).to_sparse(); b = torch.tensor([-1.0, -2, -3])
>>> sparsefill.masked.logaddexp(a, b, input_mask=torch.tensor([True, False, True])).to_dense()
tensor([-1., -2., -3.])
"""

from __future__ import annotations

import math
from typing import cast

import torch

from sparsefill._tensor import parts as _convert
from sparsefill._creation.constructors import sparse_coo_tensor, to_sparse
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.masked._apply import dense_mask
from sparsefill.masked._canon import as_sparse, is_sparse, mask_rows

__all__ = ["logaddexp"]


def _effective(t, mask):
    """``where(mask, t, -inf)`` keeping a sparse ``t`` sparse (an indefinite fill reads -inf)."""
    if not is_sparse(t):
        return (
            t
            if mask is None
            else torch.where(
                dense_mask(mask, t), t, torch.tensor(-math.inf, dtype=t.dtype, device=t.device)
            )
        )
    A = as_sparse(t)
    ninf = torch.full((), -math.inf, dtype=A.dtype, device=A.device)
    if A._indefinite:
        C = A.coalesce()
        idx, _ = C._coo_parts()
        A = sparse_coo_tensor(
            idx,
            C._values().reshape((idx.shape[1],) + tuple(A._dense_shape)),
            A.shape,
            fill_value=ninf,
        )
    if mask is None:
        return A
    idx, m = mask_rows(mask, A)
    M = _convert.parts_to_sparse(
        idx,
        m,
        A.shape,
        torch.zeros((), dtype=torch.bool, device=A.device),
        known_zero=True,
        layout=torch.sparse_coo,
        coalesced=True,
    )
    return torch.where(M, A, ninf)


def logaddexp(
    input: torch.Tensor,
    other: torch.Tensor,
    *,
    dtype: torch.dtype | None = None,
    input_mask: torch.Tensor | None = None,
    other_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Masked logaddexp (see the module docstring); a position masked out in both operands gives
    -inf."""
    if not is_sparse(input) and not is_sparse(other):
        return torch.masked.logaddexp(
            input,
            other,
            dtype=dtype,
            input_mask=dense_mask(input_mask, input),
            other_mask=dense_mask(other_mask, other),
        )
    out = torch.logaddexp(_effective(input, input_mask), _effective(other, other_mask))
    out = out.to(dtype or input.dtype)
    if is_sparse(input):
        A = as_sparse(input)
        if not is_sparse(out):
            return to_sparse(out, layout=A._sf_layout, dense_dim=A.dense_dim())
        S = cast(SparseTensor, out)  # (an op on a SparseTensor)
        return S.to_sparse(A._sf_layout) if S.sparse_layout is not A._sf_layout else S
    return out.to_dense() if is_sparse(out) else out
