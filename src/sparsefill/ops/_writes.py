"""Storage writes: an in-place result stored into an existing SparseTensor, which keeps its identity.

    assign_(A, new).to_dense() == new.to_dense()        and ``A`` is still the same Python object

Lower than every op handler and the densify fallback (which write their in-place results through here).
"""

from __future__ import annotations

import torch

from .._convert import dense_to_sparse
from .._tensor import _STATE, SparseTensor


def assign_(A: SparseTensor, new: SparseTensor) -> SparseTensor:
    """Make ``A`` hold ``new``'s storage and fill (same shape, dtype and device)."""
    if new.shape != A.shape or new.dtype != A.dtype:
        raise ValueError(f"cannot store a result of shape {tuple(new.shape)} and dtype {new.dtype} in a SparseTensor "
                         f"of shape {tuple(A.shape)} and dtype {A.dtype}: a SparseTensor's shape and dtype are fixed, "
                         "so in-place ops that change them (resize_, t_, unsqueeze_...) are not supported")
    if A._write_shared_(new):  # shared memory (share_memory_, another process) is written in place
        return A
    for name in _STATE[:-1]:  # everything but the view relation
        setattr(A, name, getattr(new, name))
    return A


def respecify_(A: SparseTensor, x: torch.Tensor) -> SparseTensor:
    """Store dense ``x`` in ``A``, keeping ``A``'s fill, layout and dense dims."""
    return assign_(A, dense_to_sparse(x, A._fill, A._indefinite, A._fill_is_zero(), A._sf_layout, A.dense_dim()))
