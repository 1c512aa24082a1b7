"""A constant sparse data matrix ``X`` (features, TF-IDF, graph propagation) in training loops:
``X @ w``, ``X @ W``, ``X.t() @ G``, ``F.linear(X, W)`` differentiable in the dense operand, forward
and backward equal to dense, every step.  The transposed pattern (and a constant ``X``'s values in
that order) is computed once per pattern and kept: these tests check it never goes stale.
"""

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import sparsefill
from sparsefill import SparseTensor

LAYOUTS = ["coo", "csr"]
DTYPES = [torch.float32, torch.float64]


def _data_matrix(layout, dtype, shape=(30, 20), density=0.2, seed=0, fill=0.0):
    gen = torch.Generator().manual_seed(seed)
    dense = torch.rand(shape, generator=gen, dtype=torch.float64)
    keep = torch.rand(shape, generator=gen) < density
    x = torch.where(keep, dense, torch.tensor(fill, dtype=torch.float64)).to(dtype)
    X = sparsefill.to_sparse(x, fill_value=fill)
    return (X.to_sparse_csr() if layout == "csr" else X), x


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fill", [0.0, 0.5])
def test_logistic_regression_steps_match_dense(layout, dtype, fill):
    """Three Adam steps of ``bce(X @ w)``: the loss and ``w.grad`` equal the dense model's each step
    (the kept transpose of ``X`` is reused from the second step on)."""
    X, x = _data_matrix(layout, dtype, fill=fill)
    y = (torch.arange(x.shape[0]) % 2).to(dtype)
    w_sparse = torch.zeros(x.shape[1], dtype=dtype, requires_grad=True)
    w_dense = torch.zeros(x.shape[1], dtype=dtype, requires_grad=True)
    opts = [torch.optim.Adam([w], lr=0.1) for w in (w_sparse, w_dense)]
    for _ in range(3):
        losses = []
        for A, w, opt in ((X, w_sparse, opts[0]), (x, w_dense, opts[1])):
            opt.zero_grad()
            loss = F.binary_cross_entropy_with_logits(A @ w, y)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        assert_close(losses[0], losses[1])
        assert_close(w_sparse.grad, w_dense.grad)
        assert_close(w_sparse, w_dense)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", ["X @ W", "F.linear", "X.t() @ G", "W.t() @ X.t()", "mm"])
def test_products_with_a_constant_matrix_forward_and_backward(layout, dtype, form):
    X, x = _data_matrix(layout, dtype, fill=0.25)
    gen = torch.Generator().manual_seed(1)
    n, k = x.shape
    fns = {
        "X @ W": (lambda A, W: A @ W, (k, 4)),
        "F.linear": (lambda A, W: F.linear(A, W), (4, k)),
        "X.t() @ G": (lambda A, W: A.t() @ W, (n, 3)),
        "W.t() @ X.t()": (lambda A, W: W.t() @ A.t(), (k, 3)),
        "mm": (lambda A, W: torch.mm(A, W), (k, 2)),
    }
    fn, wshape = fns[form]
    for step in range(2):  # the second call reads the kept transpose
        W = torch.randn(wshape, generator=gen, dtype=dtype, requires_grad=True)
        Wd = W.detach().clone().requires_grad_()
        out, ref = fn(X, W), fn(x, Wd)
        assert not isinstance(out, SparseTensor)
        assert_close(out, ref)
        g = torch.randn(ref.shape, generator=gen, dtype=dtype)
        out.backward(g)
        ref.backward(g)
        assert_close(W.grad, Wd.grad)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_kept_transpose_follows_in_place_changes(layout):
    """An in-place change of ``X`` (its values' version moves) or a new ``X`` on the same pattern is
    never answered from the kept copy of the old values."""
    X, x = _data_matrix(layout, torch.float64)
    g = torch.randn(x.shape[0], 3, dtype=torch.float64)
    writes = [
        lambda T: T.mul_(3.0),
        lambda T: (
            T.values().mul_(2.0) if isinstance(T, SparseTensor) else T.mul_(2.0)
        ),  # same memory
        lambda T: T.clamp_(max=2.0),
        lambda T: T.copy_(T * 2),
        lambda T: T.sqrt_(),
        lambda T: T.__setitem__((0, slice(None)), 0.25),
        lambda T: T.add_(T),
    ]
    for write in writes:
        assert_close(X.t() @ g, x.t() @ g)  # (kept)
        with torch.no_grad():
            write(X)
            write(x)
        assert_close(X.t() @ g, x.t() @ g)
    Y = X * -1.0  # new values on the same index tensors
    assert_close(Y.t() @ g, -x.t() @ g)
    assert_close(X.t() @ g, x.t() @ g)
    w = torch.randn(x.shape[1], dtype=torch.float64, requires_grad=True)
    (X @ w).sum().backward()
    assert_close(w.grad, x.sum(0))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("form", ["X @ W", "W @ X", "X.t()"])
def test_gradcheck_with_values_perturbed_in_place(layout, form):
    """gradcheck perturbs the values through ``.data`` (no version change): a SparseTensor that needs
    a gradient never has its values kept reordered, so every evaluation reads the perturbed values."""
    gen = torch.Generator().manual_seed(0)
    idx = torch.tensor([[0, 0, 1, 2, 3], [1, 3, 0, 2, 1]])
    v = torch.randn(5, dtype=torch.float64, generator=gen, requires_grad=True)
    W = torch.randn(4, 2, dtype=torch.float64, generator=gen, requires_grad=True)

    def fn(v, W):
        A = sparsefill.sparse_coo_tensor(idx, v, (4, 4), fill_value=0.5)
        A = A.to_sparse_csr() if layout == "csr" else A
        if form == "X @ W":
            return A @ W
        if form == "W @ X":
            return W.t() @ A
        return A.t() @ W

    assert torch.autograd.gradcheck(fn, (v, W))


@pytest.mark.parametrize(
    "shape, dense_dim, layout",
    [((5, 6), 0, "coo"), ((5, 6), 0, "csr"), ((5, 6, 2), 1, "coo"), ((3, 5, 6), 0, "csr")],
)
def test_transpose_of_a_coalesced_tensor_is_coalesced(shape, dense_dim, layout):
    """``A.t()`` / ``A.transpose`` of a coalesced tensor is coalesced (sorted, the values reordered
    with the indices) and equals the dense transpose, also on the second call (kept)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    x = x * (torch.rand(shape[: len(shape) - dense_dim], generator=gen) < 0.4).reshape(
        shape[: len(shape) - dense_dim] + (1,) * dense_dim
    )
    A = sparsefill.to_sparse(x, dense_dim=dense_dim) if dense_dim else sparsefill.to_sparse(x)
    if layout == "csr":
        A = A.to_sparse_csr()
    d0, d1 = len(shape) - dense_dim - 2, len(shape) - dense_dim - 1
    for _ in range(2):
        T = A.transpose(d0, d1)
        assert T.is_coalesced()
        idx = T.coalesce().indices()
        keys = idx[0] * T.shape[1] + idx[1] if idx.shape[0] == 2 else None
        if keys is not None:
            assert bool((keys[1:] > keys[:-1]).all())
        assert_close(T.to_dense(), x.transpose(d0, d1))
