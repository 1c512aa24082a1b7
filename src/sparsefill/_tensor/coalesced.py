"""A SparseTensor's stored parts in canonical order: COO ``(indices, values)`` sorted with no
duplicates (:func:`coalesced_parts`) and the row-major linear keys of those indices
(:func:`linear_parts`), cached per pattern where they are computed rather than stored (a CSR's COO
indices, a multi-dim pattern's keys)::

    linear_parts(A)[0] == linearize(coalesced_parts(A)[0], sparse shape)

>>> import sparsefill
>>> A = sparsefill.sparse_coo_tensor([[1, 0], [2, 0]], [1., 2.], (2, 3))
>>> coalesced_parts(A)[0].tolist(), linear_parts(A)[0].tolist()
([[0, 1], [0, 2]], [0, 5])
"""

from __future__ import annotations

import torch

from sparsefill._kernels import index as _index
from sparsefill._kernels.trace import traced
from sparsefill._kernels.grouping import pattern_cached
from sparsefill._tensor.tensor import SparseTensor


def linear_parts(A: SparseTensor, S=None):
    """``(linear keys, values)`` of ``A`` coalesced: ``keys == linearize(coalesced_parts(A)[0])``.

    The keys of a coalesced COO pattern with several sparse dims, or of a CSR pattern, are cached
    per pattern (:func:`pattern_cached`: an in-place change of the index tensors is a miss), not
    while traced.

    >>> import sparsefill
    >>> A = sparsefill.sparse_coo_tensor([[1, 0], [2, 0]], [1., 2.], (2, 3))
    >>> linear_parts(A)[0].tolist()
    [0, 5]
    """
    S = A._sparse_shape if S is None else S
    cache = len(S) > 1 and (A._sf_layout is torch.sparse_csr or A._coalesced)
    if (
        cache
        and (A._crow is None or A._crow.dim() == 1)
        and not traced(A._vals)
        and A._vals.shape[0] <= _CSR_INDEX_CACHE_MAX
    ):
        index = (A._idx,) if A._sf_layout is torch.sparse_coo else (A._crow, A._col)
        keys = pattern_cached(
            ("linear_keys", tuple(S)), index, lambda: _index.linearize(A._coo_parts()[0], S)
        )
        return keys, A._vals
    idx, vals = coalesced_parts(A)
    return _index.linearize(idx, S), vals


_CSR_INDEX_CACHE_MAX = 1 << 22  # stored elements of a CSR whose COO indices are cached (64 MB)


def coalesced_parts(A: SparseTensor):
    """``(indices, values)`` over all non-dense dims, sorted with no duplicates."""
    if (
        A._sf_layout is torch.sparse_csr
        and A._crow.dim() == 1
        and not traced(A._col)
        and A._col.numel() <= _CSR_INDEX_CACHE_MAX
    ):
        # the same index tensors for the same pattern (kept while its crow/col live: 16 bytes per
        # element)
        idx = pattern_cached("csr_indices", (A._crow, A._col), lambda: A._coo_parts()[0])
        return idx, A._vals
    idx, vals = A._coo_parts()
    return (idx, vals) if A._coalesced else _index.coalesce(idx, vals, A._sparse_shape)
