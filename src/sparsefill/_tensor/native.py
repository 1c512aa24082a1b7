"""torch's native sparse tensors (zero fill) and SparseTensors: :func:`to_torch` and
:func:`from_native`, sharing storage where the fill allows::

    to_torch(A).to_dense() == A.to_dense()     (A's fill zero, or materialize=True)
    from_native(t).to_dense() == t.to_dense()

>>> import torch
>>> t = torch.tensor([[0., 2.], [3., 0.]]).to_sparse()
>>> torch.equal(to_torch(from_native(t)).to_dense(), t.to_dense())
True
"""

from __future__ import annotations

import torch

from sparsefill._tensor.dense import check_densify_quiet, dense_of
from sparsefill._tensor.tensor import SparseTensor


def to_torch(A: SparseTensor, *, materialize: bool = False) -> torch.Tensor:
    """Torch native sparse tensor (zero fill) of ``A``'s layout.

    Native sparse tensors have zero fill: a nonzero fill raises ``ValueError`` unless
    ``materialize=True``, which specifies every element equal to the fill (O(numel)).
    """
    if A._indefinite:
        raise ValueError(
            "to_torch(): the fill is indefinite and torch native sparse tensors have zero fill; "
            "define the unspecified elements first, e.g. "
            "A.to_sparse(fill_value=0).to_torch(materialize=True)"
        )
    if not bool(A._fill.any()):  # exact here: a cache can't see writes through .data
        if A._sf_layout is torch.sparse_coo:
            return torch.sparse_coo_tensor(A._idx, A._vals, A.shape, is_coalesced=A._coalesced)
        return torch.sparse_csr_tensor(A._crow, A._col, A._vals, A.shape)
    if not materialize:
        fill = (
            A._fill.tolist() if A._fill.numel() <= 8 else f"tensor of shape {tuple(A._fill.shape)}"
        )
        raise ValueError(
            f"to_torch(): fill value {fill} is not zero and torch native sparse tensors have zero "
            "fill; pass materialize=True to specify every element (O(numel) memory)"
        )
    check_densify_quiet(A, "to_torch(materialize=True)")
    return dense_of(A).to_sparse(layout=A._sf_layout, dense_dim=A.dense_dim())


def from_native(t: torch.Tensor, checked: bool = False) -> SparseTensor:
    """SparseTensor (zero fill) sharing the storage of a torch native sparse tensor.  ``checked``:
    ``t`` comes from a user (torch does not check the sparse tensors it loads unless told to), so
    its parts are checked (``_creation.check_parts``, O(nse)) before any kernel indexes memory with
    them."""
    zero = torch.zeros((), dtype=t.dtype, device=t.device)
    if t.layout not in (torch.sparse_coo, torch.sparse_csr):
        t = t.to_sparse_coo()
    if t.layout is torch.sparse_coo:
        out = SparseTensor(
            torch.sparse_coo,
            t.shape,
            t._values(),
            zero,
            indices=t._indices(),
            coalesced=t.is_coalesced(),
            known_zero=True,
        )
    else:
        out = SparseTensor(
            torch.sparse_csr,
            t.shape,
            t.values(),
            zero,
            crow=t.crow_indices().to(torch.int64),
            col=t.col_indices().to(torch.int64),
            known_zero=True,
        )
    if checked:
        from sparsefill._tensor.validate import check_parts

        try:
            check_parts(
                out._sf_layout,
                out.shape,
                out._vals,
                out._fill,
                out._idx,
                out._crow,
                out._col,
                coalesced=out._coalesced,
            )
        except (ValueError, TypeError, IndexError) as e:
            raise ValueError(
                f"a torch {t.layout} tensor with invalid parts (size {tuple(t.shape)}): {e}"
            ) from None
    return out
