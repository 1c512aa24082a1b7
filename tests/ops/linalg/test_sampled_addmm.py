"""``torch.sparse.sampled_addmm`` on a SparseTensor pattern, 2-D and batched ``(b, m, n)``: values and
gradients against the dense masked computation and torch's own kernel on a native CSR tensor."""

from __future__ import annotations

import warnings

import pytest
import torch

import sparsefill


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
