"""``torch.cdist`` with a SparseTensor operand: dense torch's distances, without the operand's
dense matrix::

    torch.cdist(A, X, p) == torch.cdist(A.to_dense(), X, p)
"""

from __future__ import annotations

import warnings

import pytest
import torch

import sparsefill

MODES = ("use_mm_for_euclid_dist_if_necessary", "donot_use_mm_for_euclid_dist")


def _data(rows, cols, fill, dtype, dense_dim=0, p=0.7, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g, dtype=dtype)
    x[torch.rand(rows, cols, generator=g) < p] = fill
    x[1] = fill  # (a row with nothing stored)
    return sparsefill.to_sparse(x, fill_value=fill, dense_dim=dense_dim), x


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("fill", [0.0, 0.7])
@pytest.mark.parametrize("dense_dim", [0, 1])
@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, 0.5, 3.5])
def test_cdist_matches_dense(dtype, fill, dense_dim, p):
    A, x = _data(40, 12, fill, dtype, dense_dim)
    X = torch.randn(7, 12, dtype=dtype)
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        for mode in MODES:
            torch.testing.assert_close(
                torch.cdist(A, X, p, compute_mode=mode),
                torch.cdist(x, X, p, compute_mode=mode),
                **tol,
            )
            torch.testing.assert_close(
                torch.cdist(X, A, p, compute_mode=mode),
                torch.cdist(X, x, p, compute_mode=mode),
                **tol,
            )


def test_cdist_of_a_data_matrix_never_densifies_it():
    """A 20000 x 5000 matrix at 0.1% (800 MB dense in float64) against 8 centroids, on the matrix
    product path (more than 25 rows) and the direct one, under a policy refusing anything past
    4 MB."""
    g = torch.Generator().manual_seed(1)
    n, d, nse = 20000, 5000, 100000
    keys = torch.randint(0, n * d, (nse,), generator=g).unique()
    nse = keys.numel()
    A = sparsefill.sparse_coo_tensor(
        torch.stack([keys // d, keys % d]),
        torch.randn(nse, generator=g, dtype=torch.float64),
        (n, d),
    ).coalesce()
    C = torch.randn(8, d, generator=g, dtype=torch.float64)
    rows = torch.tensor([0, 7, 19999])
    ref = torch.cdist(A.index_select(0, rows).to_dense(), C)
    with sparsefill.densify_policy("raise", limit_bytes=1 << 22):
        for mode in MODES:
            out = torch.cdist(A, C, compute_mode=mode)
            assert out.shape == (n, 8)
            torch.testing.assert_close(out[rows], ref)
        torch.testing.assert_close(
            torch.cdist(A, C, 1.0)[rows], torch.cdist(A.index_select(0, rows).to_dense(), C, 1.0)
        )


@pytest.mark.parametrize("fill", [float("nan"), float("inf")])
def test_cdist_with_a_nonfinite_fill_is_dense_torchs(fill):
    """An inf or NaN fill (or dense operand): the fill row's sums would subtract inf from inf; the
    densify fallback gives dense torch's result."""
    A, x = _data(30, 6, fill, torch.float64)
    x[0] = torch.arange(6.0)  # (a row with every element stored: finite distances)
    A = sparsefill.to_sparse(x, fill_value=fill)
    X = torch.randn(4, 6, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sparsefill.DensifyWarning)
        for mode in MODES:
            torch.testing.assert_close(
                torch.cdist(A, X, compute_mode=mode),
                torch.cdist(x, X, compute_mode=mode),
                equal_nan=True,
            )


@pytest.mark.parametrize("fill", [0.0, 0.7])
def test_cdist_gradients_of_the_matrix_product_form(fill):
    """The euclidean form's gradients (more than 25 rows): of the stored values (the products'
    backward on the pattern: no dense matrix of ``A`` formed) and of the dense operand, as dense
    torch's; the direct form's for the dense operand."""
    A, x = _data(60, 12, fill, torch.float64)
    idx = A.indices()
    X = torch.randn(5, 12, dtype=torch.float64)
    W = torch.randn(60, 5, dtype=torch.float64)
    v, Xs = A.values().clone().requires_grad_(), X.clone().requires_grad_()
    with sparsefill.densify_policy("raise", limit_bytes=60 * 12 * 8 - 1):
        S = sparsefill.sparse_coo_tensor(idx, v, x.shape, fill_value=fill)
        (torch.cdist(S, Xs) * W).sum().backward()
    xd, Xd = x.clone().requires_grad_(), X.clone().requires_grad_()
    (torch.cdist(xd, Xd) * W).sum().backward()
    torch.testing.assert_close(Xs.grad, Xd.grad)
    torch.testing.assert_close(v.grad, xd.grad[tuple(idx)])
    Xs.grad = Xd.grad = None
    mode = "donot_use_mm_for_euclid_dist"
    (torch.cdist(A, Xs, 3.0, compute_mode=mode) * W).sum().backward()
    (torch.cdist(x, Xd, 3.0, compute_mode=mode) * W).sum().backward()
    torch.testing.assert_close(Xs.grad, Xd.grad)


@pytest.mark.parametrize("fill", [0.0, 0.7])
@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 2.0, 3.0])
@pytest.mark.parametrize("dense_dim", [0, 1])
def test_cdist_gradients_of_the_direct_form(fill, p, dense_dim):
    """The direct form's gradients (few rows, or ``p != 2``): of the stored values and of a fill
    that is a leaf too (summed over the unspecified elements), and of the dense operand, as dense
    torch's, with no dense matrix of ``A`` formed; a hybrid ``A``'s stored rows whole."""
    A, x = _data(20, 9, fill, torch.float64, seed=4)
    x[3, 2] = 0.25  # (a stored element equal to a centroid's: u(0) = 0)
    A = sparsefill.to_sparse(x, fill_value=fill, dense_dim=dense_dim)
    idx, W = A.indices(), torch.randn(20, 4, dtype=torch.float64)
    X = torch.randn(4, 9, dtype=torch.float64)
    X[1, 2] = 0.25
    f0 = A.fill_value().to(torch.float64)
    v, f, Xs = (t.clone().requires_grad_() for t in (A.values(), f0, X))
    mode = "donot_use_mm_for_euclid_dist"
    with sparsefill.densify_policy("raise", limit_bytes=20 * 9 * 8 - 1):
        S = sparsefill.sparse_coo_tensor(idx, v, x.shape, fill_value=f)
        (torch.cdist(S, Xs, p, compute_mode=mode) * W).sum().backward()
    xd, Xd = x.clone().requires_grad_(), X.clone().requires_grad_()
    (torch.cdist(xd, Xd, p, compute_mode=mode) * W).sum().backward()
    torch.testing.assert_close(Xs.grad, Xd.grad)
    torch.testing.assert_close(v.grad, xd.grad[tuple(idx)])
    unspecified = torch.ones(x.shape[: 2 - dense_dim], dtype=torch.bool)
    unspecified[tuple(idx)] = False
    torch.testing.assert_close(f.grad, xd.grad[unspecified].sum(0))
