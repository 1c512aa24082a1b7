"""Products of generated SparseTensors equal dense torch: ``A @ X``, ``X @ A``, ``mv``, ``mm``, ``bmm``,
``A @ B`` of two SparseTensors, ``einsum``; float32/float64 (int64 and bool where dense takes or refuses them);
both raising is agreement."""

from __future__ import annotations

import torch
from hypothesis import given, strategies as st

from tests.property.sparse_strategies import FLOATS, SETTINGS, agree, sparse_tensors

MATRICES = sparse_tensors(dtypes=FLOATS + [torch.int64, torch.bool], min_dim=2, max_dim=2)
BATCHES = sparse_tensors(dtypes=FLOATS, min_dim=3, max_dim=3)


def _dense(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-3, 4, shape, generator=g).to(dtype)


@SETTINGS
@given(
    MATRICES,
    st.integers(0, 3),
    st.sampled_from(["A@X", "X@A", "mv", "x@A", "mm", "A@A.T", "einsum", "addmm", "linear"]),
    st.integers(0, 99),
)
def test_matrix_products(A, k, name, seed):
    m, n = A.shape
    x = A.to_dense()
    X, Y = _dense((n, k), A.dtype, seed), _dense((k, m), A.dtype, seed + 1)
    v, w = _dense((n,), A.dtype, seed + 2), _dense((m,), A.dtype, seed + 3)
    f = {
        "A@X": lambda a: a @ X,
        "X@A": lambda a: Y @ a,
        "mv": lambda a: torch.mv(a, v),
        "x@A": lambda a: w @ a,
        "mm": lambda a: torch.mm(a, X),
        "A@A.T": lambda a: a @ (A.t() if a is A else x.t()),
        "einsum": lambda a: torch.einsum("ij,jk->ik", a, X),
        "addmm": lambda a: torch.addmm(_dense((m, k), A.dtype, seed), a, X, beta=2, alpha=1),
        "linear": lambda a: torch.nn.functional.linear(Y.T.to(a.dtype) if k else Y.T, a),
    }[name]
    agree(lambda: f(A), lambda: f(x))


@SETTINGS
@given(BATCHES, st.integers(0, 3), st.integers(0, 99))
def test_batched_products(A, k, seed):
    b, m, n = A.shape
    x = A.to_dense()
    X = _dense((b, n, k), A.dtype, seed)
    agree(lambda: torch.bmm(A, X), lambda: torch.bmm(x, X))
    agree(lambda: A @ X, lambda: x @ X)
    agree(lambda: torch.einsum("bij,bjk->bik", A, X), lambda: torch.einsum("bij,bjk->bik", x, X))


@SETTINGS
@given(MATRICES, sparse_tensors(dtypes=FLOATS + [torch.int64], min_dim=2, max_dim=2))
def test_sparse_sparse_product(A, B):
    """``A @ B`` where the inner sizes match (else both raise)."""
    agree(lambda: A @ B, lambda: A.to_dense() @ B.to_dense())
