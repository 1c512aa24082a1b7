"""``torch.sparse.sampled_addmm`` on a SparseTensor pattern, 2-D and batched ``(b, m, n)``: values and
gradients against the dense masked computation and torch's own kernel on a native CSR tensor."""

from __future__ import annotations

import warnings

import pytest
import torch

import sparsefill
from hypothesis import given, strategies as st
from tests.sparse_cases import random_values, stored_as, SETTINGS


def _pattern(shape, layout, fill, seed=0, dtype=torch.float64):
    """A SparseTensor of ``shape`` (2-D or 3-D; the same nse in every batch, as a batched CSR needs), its
    stored-element mask and its dense form (fill read as 0 where indefinite)."""
    g = torch.Generator().manual_seed(seed)
    nb, m, n = (1, *shape) if len(shape) == 2 else shape
    k = (m * n * 2) // 5
    flat = torch.stack([torch.randperm(m * n, generator=g)[:k] for _ in range(nb)])
    mask = torch.zeros(nb, m * n, dtype=torch.bool).scatter_(1, flat, True).reshape(shape)
    A = sparsefill.sparse_coo_tensor(
        mask.nonzero().T,
        torch.randn(int(mask.sum()), generator=g, dtype=dtype),
        shape,
        fill_value=fill,
    )
    A = A.to_sparse_csr() if layout == "csr" else A
    dense = A.to_dense(fill_value=0.0) if fill is sparsefill.indefinite else A.to_dense()
    return A, mask, dense


@pytest.mark.parametrize("shape", [(5, 6), (3, 5, 6)], ids=["2d", "batched"])
@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize(
    "fill", [0.0, 2.0, sparsefill.indefinite], ids=["zero", "two", "indefinite"]
)
def test_sampled_addmm_values_and_gradients(shape, layout, fill):
    A, mask, a0 = _pattern(shape, layout, fill)
    g = torch.Generator().manual_seed(1)
    m1 = torch.randn(*shape[:-1], 4, generator=g, dtype=torch.float64, requires_grad=True)
    m2 = torch.randn(
        *shape[:-2], 4, shape[-1], generator=g, dtype=torch.float64, requires_grad=True
    )
    out = torch.sparse.sampled_addmm(A, m1, m2, beta=0.5, alpha=-2.0)
    unspecified = 0.0 if fill is sparsefill.indefinite else 0.5 * fill
    expected = torch.where(mask, 0.5 * a0 + -2.0 * (m1 @ m2), unspecified)
    got = out.to_dense(fill_value=0.0) if fill is sparsefill.indefinite else out.to_dense()
    torch.testing.assert_close(got, expected)
    assert out.is_fill_indefinite() == (fill is sparsefill.indefinite)
    w = torch.randn(shape, generator=g, dtype=torch.float64)
    want = torch.autograd.grad((expected * w).sum(), (m1, m2))
    for a, b in zip(torch.autograd.grad((got * w).sum(), (m1, m2)), want):
        torch.testing.assert_close(a, b)
    if fill == 0.0 and (
        layout == "csr" or len(shape) == 2
    ):  # torch's kernel on a native CSR (batched: padded)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            nat = torch.sparse.sampled_addmm(
                A.to_torch().to_sparse_csr() if layout == "coo" else A.to_torch(),
                m1.detach(),
                m2.detach(),
                beta=0.5,
                alpha=-2.0,
            )
        torch.testing.assert_close(got.detach(), nat.to_dense())


def test_sampled_addmm_gradient_of_the_pattern_values():
    """``A`` requiring grad: its gradient is ``beta * G`` (fill included: the result's fill is ``beta * fill``)."""
    A, mask, a0 = _pattern((3, 4, 5), "coo", 2.0)
    L = A.detach().requires_grad_()
    m1, m2 = torch.randn(3, 4, 2, dtype=torch.float64), torch.randn(3, 2, 5, dtype=torch.float64)
    out = torch.sparse.sampled_addmm(L, m1, m2, beta=3.0)
    out.sum().backward()
    torch.testing.assert_close(L.grad.to_dense(), torch.full((3, 4, 5), 3.0, dtype=torch.float64))


def test_sampled_addmm_half_types_by_bounded_rows():
    """bfloat16 (no torch kernel): the product row by row, as the float32 result rounded."""
    A, mask, _ = _pattern((2, 30, 40), "coo", 0.0, dtype=torch.float32)
    m1, m2 = torch.randn(2, 30, 8), torch.randn(2, 8, 40)
    ref = torch.sparse.sampled_addmm(A, m1, m2).to_dense()
    got = torch.sparse.sampled_addmm(A.to(torch.bfloat16), m1.bfloat16(), m2.bfloat16()).to_dense()
    torch.testing.assert_close(got.float(), ref, atol=0.1, rtol=0.05)


def test_sampled_addmm_errors_name_what_works():
    A = sparsefill.sparse_coo_tensor([[0], [1]], torch.ones(1, 3), (2, 2, 3))  # hybrid
    with pytest.raises(RuntimeError, match=r"sparsefill.convert\(A, dense_dim=0\)"):
        torch.sparse.sampled_addmm(A, torch.ones(2, 4), torch.ones(4, 2))
    B = sparsefill.sparse_coo_tensor([[0], [1], [1]], [1.0], (2, 2, 2))
    with pytest.raises(RuntimeError, match="same batch dims"):
        torch.sparse.sampled_addmm(B, torch.ones(3, 2, 4), torch.ones(3, 4, 2))
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.sparse.sampled_addmm(B, torch.ones(2, 2, 4, dtype=torch.float64), torch.ones(2, 4, 2))


# ---------------------------------------------------------------------- ops/linalg/sampled.py
def test_sampled_addmm_dtype_mismatch_raises_as_torch():
    """mat1/mat2 of another dtype than self: torch raises (native CSR), and so does sparsefill (never a silent cast)."""
    A = sparsefill.to_sparse(torch.tensor([[1.0, 0.0], [0.0, 2.0]]), layout=torch.sparse_csr)
    m1, m2 = torch.ones(2, 3, dtype=torch.float64), torch.ones(3, 2, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.sparse.sampled_addmm(A.to_torch(), m1, m2)
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.sparse.sampled_addmm(A, m1, m2)
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.sparse.sampled_addmm(A, m1.float(), m2)


@SETTINGS
@given(
    st.integers(0, 2**16),
    st.sampled_from(["coo", "csr", "uncoalesced"]),
    st.sampled_from([0.0, 2.0, "indefinite"]),
    st.sampled_from([(1.0, 1.0), (0.0, 2.0), (0.5, -1.0)]),
    st.sampled_from(["plain", "noncontig", "neg"]),
    st.booleans(),
)
def test_sampled_addmm_and_sparse_mask_vs_dense(seed, form, fill, beta_alpha, how, special):
    """Values at A's pattern ``beta * A + alpha * (m1 @ m2)`` (fill ``beta * fill``), ``x.sparse_mask(A)``: x at
    the pattern, fill 0; gradients of m1, m2, x vs the dense masked computation; native CSR where fill is 0."""
    g = torch.Generator().manual_seed(seed)
    beta, alpha = beta_alpha
    keys = torch.randperm(20, generator=g)[:7]
    if form == "uncoalesced":
        keys = torch.cat([keys, keys[:2]])
    idx = torch.stack([keys // 5, keys % 5])
    vals = random_values(g, (keys.numel(),), torch.float64, special)
    A = sparsefill.sparse_coo_tensor(
        idx, vals, (4, 5), fill_value=sparsefill.indefinite if fill == "indefinite" else fill
    )
    A = A.to_sparse_csr() if form == "csr" else A
    m = torch.zeros(4, 5, dtype=torch.bool)
    m[tuple(idx)] = True
    a0 = torch.zeros(4, 5, dtype=torch.float64).index_put(tuple(idx), vals, accumulate=True)
    m1 = stored_as(torch.randn(4, 3, generator=g, dtype=torch.float64), how).requires_grad_()
    m2 = stored_as(torch.randn(3, 5, generator=g, dtype=torch.float64), how).requires_grad_()
    out = torch.sparse.sampled_addmm(A, m1, m2, beta=beta, alpha=alpha)
    expected = torch.where(
        m, beta * a0 + alpha * (m1 @ m2), 0.0 if fill == "indefinite" else beta * fill
    )
    got = out.to_dense(fill_value=0.0) if fill == "indefinite" else out.to_dense()
    torch.testing.assert_close(got, expected, equal_nan=True)
    if fill == "indefinite":
        assert out.is_fill_indefinite()
    elif fill == 0.0 and form != "uncoalesced":
        nat = torch.sparse.sampled_addmm(
            A.to_torch().to_sparse_csr(), m1, m2, beta=beta, alpha=alpha
        )
        torch.testing.assert_close(got, nat.to_dense(), equal_nan=True)
    w = torch.randn(4, 5, generator=g, dtype=torch.float64)
    gg = torch.autograd.grad((got * w).sum(), (m1, m2))
    rr = torch.autograd.grad((expected * w).sum(), (m1, m2))
    for a, b in zip(gg, rr):
        torch.testing.assert_close(a, b)
    x = stored_as(torch.randn(4, 5, generator=g, dtype=torch.float64), how)
    s = x.sparse_mask(A)
    assert not s.is_fill_indefinite()
    torch.testing.assert_close(s.to_dense(), torch.where(m, x, 0.0))


@pytest.mark.parametrize("form", ["coo", "csr", "uncoalesced"])
@pytest.mark.parametrize(
    "fill", [0.0, 2.0, sparsefill.indefinite], ids=["zero", "two", "indefinite"]
)
def test_sparse_mask_gradient_of_x(form, fill):
    """``x.sparse_mask(A)`` with ``x`` requiring grad: the gradient of x is G at A's pattern, 0 elsewhere, a dense
    tensor as x (it raised in torch's formula: ``sparse_mask_backward`` calls ``mask.is_coalesced()``)."""
    idx = (
        torch.tensor([[0, 1, 2, 0], [1, 0, 2, 1]])
        if form == "uncoalesced"
        else torch.tensor([[0, 1, 2], [1, 0, 2]])
    )
    A = sparsefill.sparse_coo_tensor(idx, torch.ones(idx.shape[1]), (3, 3), fill_value=fill)
    A = A.to_sparse_csr() if form == "csr" else A
    m = torch.zeros(3, 3, dtype=torch.bool).index_put(tuple(idx), torch.tensor(True))
    x = torch.randn(3, 3, requires_grad=True)
    w = torch.randn(3, 3)
    s = x.sparse_mask(A)
    torch.testing.assert_close(s.to_dense(), torch.where(m, x, 0.0))
    (gx,) = torch.autograd.grad((s.to_dense() * w).sum(), x)
    assert type(gx) is torch.Tensor
    torch.testing.assert_close(gx, torch.where(m, w, 0.0))
    (gx,) = torch.autograd.grad(s.sum(), x)
    torch.testing.assert_close(gx, m.float())
