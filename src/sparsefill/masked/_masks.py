"""Masks: the canonical input and output masks of a masked op, and masks matching a sparse pattern.

``input_mask(input, mask=)`` is the mask the ops use, in the input's layout and shape (for a sparse
input: pattern ``P`` of ``_canon``, fill = whether unspecified elements are masked in);
``output_mask(input, dim, keepdim, mask=)`` is ``torch.any(input_mask, dim, keepdim)`` for every
layout: True where the reduction's output has at least one masked-in element.  ``pattern_mask(A)``
is True exactly at the specified elements of ``A``; ``coo_mask``/``csr_mask`` build one from
indices.

>>> import torch, sparsefill
>>> A = torch.tensor([[0., 2., 0.], [0., 0., 0.]]).to_sparse()
>>> sparsefill.masked.output_mask(A, 1, mask=sparsefill.masked.pattern_mask(A)).to_dense()
tensor([ True, False])
"""

from __future__ import annotations

import torch
from torch.types import Device

from sparsefill._tensor import parts as _convert
from sparsefill._kernels.reducer import segment_counts
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.masked import _slices
from sparsefill.masked._apply import dense_mask
from sparsefill.masked._canon import combine, is_sparse
from sparsefill.masked._masked_reductions import _reduction

__all__ = ["input_mask", "output_mask", "pattern_mask", "coo_mask", "csr_mask"]


def input_mask(
    input: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The canonical mask: bool, the input's shape and layout (``mask=None``: all True; an
    indefinite fill: its pattern)."""
    if not is_sparse(input):
        return (
            torch.ones(input.shape, dtype=torch.bool, device=input.device)
            if mask is None
            else dense_mask(mask, input).to(torch.bool).clone()
        )
    X = combine(input, mask)
    A = X.A
    fill = torch.tensor(X.mfill, device=A.device)
    return _convert.parts_to_sparse(
        X.indices(), X.m, A.shape, fill, known_zero=not X.mfill, layout=A._sf_layout, coalesced=True
    )


def output_mask(
    input: torch.Tensor,
    dim: int | list[int] | tuple[int, ...] | None = None,
    keepdim: bool = False,
    *,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """``torch.any(input_mask(input, mask=mask), dim, keepdim)`` in the input's layout."""
    if not is_sparse(input):
        m = input_mask(input, mask=mask)
        dims = _slices.canonical_dims(dim, m.dim())
        return torch.any(m, dims, keepdim=bool(keepdim)) if dims else m.clone()
    with torch.no_grad():

        def any_in(v, seg, nseg, *, fill, n_fill, lengths=None):
            return segment_counts(seg, nseg, lengths) + n_fill.sum(1) > 0

        return _reduction(input, mask, dim, keepdim, any_in, None)


def pattern_mask(input: torch.Tensor) -> torch.Tensor:
    """True at the specified elements of a sparse ``input``, False elsewhere, in its layout (a torch
    native input gives a torch native mask sharing its indices; a SparseTensor a SparseTensor)."""
    if isinstance(input, SparseTensor):
        return _convert.pattern_mask(input)
    if input.layout is torch.sparse_coo:
        return torch.sparse_coo_tensor(
            input._indices(),
            torch.ones(input._values().shape, dtype=torch.bool, device=input.device),
            input.shape,
            is_coalesced=input.is_coalesced(),
            check_invariants=False,
        )
    if input.layout is torch.sparse_csr:
        return torch.sparse_csr_tensor(
            input.crow_indices(),
            input.col_indices(),
            torch.ones(input.values().shape, dtype=torch.bool, device=input.device),
            input.shape,
            check_invariants=False,
        )
    raise TypeError(f"pattern_mask expects a sparse COO or CSR tensor, got layout {input.layout}")


def coo_mask(
    indices: torch.Tensor,
    size: torch.Size | list[int] | tuple[int, ...],
    *,
    device: Device = None,
) -> torch.Tensor:
    """A torch native COO bool mask, True at ``indices`` (shape ``(sparse_dim, nse)``)."""
    indices = torch.as_tensor(indices, device=device)
    return torch.sparse_coo_tensor(
        indices,
        torch.ones(indices.shape[1], dtype=torch.bool, device=indices.device),
        size,
        check_invariants=True,
    ).coalesce()


def csr_mask(
    crow_indices: torch.Tensor,
    col_indices: torch.Tensor,
    size: torch.Size | list[int] | tuple[int, ...],
    *,
    device: Device = None,
) -> torch.Tensor:
    """A torch native CSR bool mask, True at the elements given by
    ``crow_indices``/``col_indices``."""
    crow = torch.as_tensor(crow_indices, device=device)
    col = torch.as_tensor(col_indices, device=crow.device)
    return torch.sparse_csr_tensor(
        crow,
        col,
        torch.ones(col.shape, dtype=torch.bool, device=crow.device),
        size,
        check_invariants=True,
    )
