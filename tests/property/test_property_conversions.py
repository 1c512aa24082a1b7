"""Conversions of generated SparseTensors keep the dense tensor: to_dense, to_sparse_csr / to_sparse_coo (and
back), coalesce, to_sparse with another fill, clone, and the constructors from a dense tensor (to_sparse stores
exactly the elements that differ from the fill); the input is never modified."""

from __future__ import annotations

import torch
from hypothesis import given, strategies as st

import sparsefill
from tests.property.sparse_strategies import (
    ALL_DTYPES,
    SETTINGS,
    agree,
    assert_same,
    outcome,
    sparse_tensors,
)


@SETTINGS
@given(
    sparse_tensors(dtypes=ALL_DTYPES),
    st.sampled_from(
        ["coo", "csr", "coalesce", "clone", "refill", "detach", "to_float64", "contiguous"]
    ),
)
def test_conversion_keeps_the_dense_tensor(A, how):
    x = A.to_dense()
    before = (A._vals.clone(), A._fill.clone())
    dd = A.dense_dim()
    f = {
        "coo": lambda t: t.to_sparse_coo(),
        "csr": lambda t: t.to_sparse_csr(dense_dim=dd),
        "coalesce": lambda t: t.coalesce() if isinstance(t, sparsefill.SparseTensor) else t,
        "clone": lambda t: t.clone(),
        "detach": lambda t: t.detach(),
        "contiguous": lambda t: t.contiguous(),
        "refill": lambda t: (
            t.to_sparse(fill_value=torch.ones((), dtype=t.dtype))
            if isinstance(t, sparsefill.SparseTensor)
            else t
        ),
        "to_float64": lambda t: t.to(torch.float64),
    }[how]
    # a layout conversion keeps the dense tensor; it may raise only where torch's own conversion of the dense
    # tensor raises (torch refuses more: a batched CSR with no batch)
    native = how in ("coo", "csr")
    if native:
        kind, R = outcome(lambda: f(A))
        if kind == "ok":
            assert_same(R, x, exact=True)
        else:
            assert outcome(lambda: f(x))[0] == "raise", R
            R = None
    else:
        R = agree(lambda: f(A), lambda: f(x), exact=True)
    if R is not None and isinstance(R, sparsefill.SparseTensor):
        assert R.shape == A.shape and (how != "coalesce" or R.is_coalesced())
    assert torch.equal(A._vals, before[0]) or torch.equal(A._vals.isnan(), before[0].isnan())
    assert_same(A.to_dense(), x, exact=True)


@SETTINGS
@given(sparse_tensors(dtypes=ALL_DTYPES), st.sampled_from(["coo", "csr"]), st.data())
def test_to_sparse_of_the_dense_tensor_stores_what_differs_from_the_fill(A, layout, data):
    x = A.to_dense()
    dd = data.draw(st.integers(0, A.dense_dim()))
    fill = data.draw(st.sampled_from(["A's", "zero", "first"]))
    f = (
        A._fill
        if fill == "A's" and A._fill.dim() == 0
        else torch.zeros((), dtype=x.dtype)
        if fill != "first" or not x.numel()
        else x.reshape(-1)[0].clone()
    )
    lay = torch.sparse_coo if layout == "coo" else torch.sparse_csr
    kind, R = outcome(lambda: sparsefill.to_sparse(x, fill_value=f, layout=lay, dense_dim=dd))
    if (
        kind == "raise"
    ):  # (only where torch's own conversion raises: CSR of fewer than 2 sparse dims)
        assert outcome(lambda: x.to_sparse(layout=lay, dense_dim=dd))[0] == "raise", R
        return
    assert_same(R, x, exact=True)
    if R is not None and dd == 0:
        differ = (x != f) & ~(
            x.isnan() & f.isnan() if x.is_floating_point() else torch.zeros_like(x, dtype=bool)
        )
        assert R._nnz() == int(differ.sum()) or R.sparse_layout == torch.sparse_csr and R.dim() > 2
