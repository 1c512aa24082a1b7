"""Constructors, factories and conversions from and to other libraries (``interop``).

``sparsefill._creation.indefinite`` is the name pickles of the indefinite fill refer to.
"""

from sparsefill._creation.constructors import (
    empty,
    empty_like,
    eye,
    from_torch,
    full,
    full_like,
    indefinite,
    ones,
    ones_like,
    sparse_coo_tensor,
    sparse_csr_tensor,
    to_sparse,
    to_torch,
    zeros,
    zeros_like,
)

__all__ = [
    "empty",
    "empty_like",
    "eye",
    "from_torch",
    "full",
    "full_like",
    "indefinite",
    "ones",
    "ones_like",
    "sparse_coo_tensor",
    "sparse_csr_tensor",
    "to_sparse",
    "to_torch",
    "zeros",
    "zeros_like",
]
