"""Autograd: gradcheck of constructors and conversions over (values, fill), and leaf gradients
compared with the same computation on the dense tensor (gradients have dense semantics).

gradcheck directly on a SparseTensor leaf is vacuous, so every gradcheck here is of a function
of plain tensors (values, fill).
"""

import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.autograd import gradcheck

import sparsefill
from sparsefill import SparseTensor

COO, CSR = torch.sparse_coo, torch.sparse_csr
F64 = torch.float64


def assert_same(actual, expected, exact=False):
    assert not isinstance(actual, SparseTensor) and not isinstance(expected, SparseTensor)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, (actual, expected)
    kw = dict(rtol=0, atol=0) if exact else {}
    torch.testing.assert_close(actual, expected, equal_nan=True, **kw)


def dense(T):
    return T.to_dense() if isinstance(T, SparseTensor) else T


def param(*shape, gen=None):
    return torch.randn(shape, dtype=F64, generator=gen).requires_grad_()


def coo_dense(idx, size):
    return lambda v, f: sparsefill.sparse_coo_tensor(idx, v, size, fill_value=f).to_dense()


# ---------------------------------------------------------------------- gradcheck over (values, fill)
def test_gradcheck_coo_coalesced():
    idx = torch.tensor([[0, 1, 2], [1, 2, 0]])
    assert gradcheck(coo_dense(idx, (3, 3)), (param(3), param()))


def test_gradcheck_coo_uncoalesced_with_duplicates():
    idx = torch.tensor([[2, 0, 2, 1, 0], [0, 1, 0, 2, 1]])  # (2, 0) and (0, 1) twice, unsorted
    fn = coo_dense(idx, (3, 3))
    v, f = param(5), param()
    assert gradcheck(fn, (v, f))
    # each duplicate gets the upstream gradient of its position; the fill gets the unspecified ones
    w = torch.randn(3, 3, dtype=F64)
    (fn(v, f) * w).sum().backward()
    assert_same(v.grad, w[idx[0], idx[1]])
    mask = torch.ones(3, 3, dtype=torch.bool)
    mask[idx[0], idx[1]] = False
    assert_same(f.grad, w[mask].sum())


def test_gradcheck_coo_hybrid_array_fill():
    idx = torch.tensor([[0, 3, 1]])
    assert gradcheck(coo_dense(idx, (4, 2)), (param(3, 2), param(2)))


def test_gradcheck_coo_hybrid_smaller_fill():
    idx = torch.tensor([[0, 2], [1, 0]])
    # scalar fill on a hybrid tensor
    assert gradcheck(coo_dense(idx, (3, 3, 2)), (param(2, 2), param()))
    # fill (1, d) on dense dims (c, d)
    assert gradcheck(coo_dense(idx, (3, 3, 2, 4)), (param(2, 2, 4), param(1, 4)))
    # fill (c, 1) on dense dims (c, d)
    assert gradcheck(coo_dense(idx, (3, 3, 2, 4)), (param(2, 2, 4), param(2, 1)))


def test_gradcheck_fill_gradient_values():
    """The fill's gradient is the upstream gradient summed over the unspecified elements, to the fill's shape."""
    idx = torch.tensor([[0, 2], [1, 0]])
    v, f = param(2, 2, 4), param(1, 4)
    w = torch.randn(3, 3, 2, 4, dtype=F64)
    (coo_dense(idx, (3, 3, 2, 4))(v, f) * w).sum().backward()
    mask = torch.ones(3, 3, dtype=torch.bool)
    mask[idx[0], idx[1]] = False
    assert_same(f.grad, w[mask].sum(0).sum(0, keepdim=True))
    assert_same(v.grad, w[idx[0], idx[1]])


def test_gradcheck_csr():
    crow, col = torch.tensor([0, 2, 2, 3]), torch.tensor([0, 3, 1])
    fn = lambda v, f: sparsefill.sparse_csr_tensor(crow, col, v, (3, 4), fill_value=f).to_dense()
    assert gradcheck(fn, (param(3), param()))


def test_gradcheck_csr_batched():
    crow = torch.tensor([[0, 1, 3], [0, 2, 3]])
    col = torch.tensor([[1, 0, 2], [0, 1, 1]])
    fn = lambda v, f: sparsefill.sparse_csr_tensor(crow, col, v, (2, 2, 3), fill_value=f).to_dense()
    assert gradcheck(fn, (param(2, 3), param()))
    fn_h = lambda v, f: sparsefill.sparse_csr_tensor(
        crow, col, v, (2, 2, 3, 2), fill_value=f
    ).to_dense()
    assert gradcheck(fn_h, (param(2, 3, 2), param(2)))


def test_gradcheck_indefinite_to_dense_with_fill():
    idx = torch.tensor([[0, 1, 2], [1, 2, 0]])

    def fn(v, t):
        A = sparsefill.sparse_coo_tensor(idx, v, (3, 3), fill_value=[])
        return A.to_dense(fill_value=t)

    v, t = param(3), param()
    assert gradcheck(fn, (v, t))
    fn(v, t).sum().backward()
    assert_same(t.grad, torch.tensor(6.0, dtype=F64))  # 9 elements, 3 specified
    assert_same(v.grad, torch.ones(3, dtype=F64))


def test_gradcheck_through_conversions():
    idx = torch.tensor([[1, 0, 1, 2], [2, 1, 2, 0]])  # uncoalesced: (1, 2) twice
    size = (3, 3)
    g = torch.tensor(0.25, dtype=F64)
    make = lambda v, f: sparsefill.sparse_coo_tensor(idx, v, size, fill_value=f)
    for conv in (
        lambda A: A.to_sparse(layout=CSR),
        lambda A: A.coalesce(),
        lambda A: A.to_sparse(fill_value=g),
        lambda A: A.to_sparse(layout=CSR).to_sparse(layout=COO),
        lambda A: A.to_sparse(fill_value=g, layout=CSR),
    ):
        assert gradcheck(lambda v, f: conv(make(v, f)).to_dense().sin(), (param(4), param()))


@st.composite
def coo_grad_cases(draw):
    sdim = draw(st.integers(1, 3))
    ssizes = tuple(draw(st.lists(st.integers(1, 3), min_size=sdim, max_size=sdim)))
    dense_shape = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))
    nse = draw(st.integers(0, 6))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    idx = torch.stack([torch.randint(0, s, (nse,), generator=gen) for s in ssizes])
    fshape = draw(st.sampled_from([(), dense_shape, tuple(1 for _ in dense_shape)]))
    return idx, ssizes + dense_shape, (nse,) + dense_shape, fshape, gen


@settings(max_examples=25, deadline=None)
@given(coo_grad_cases())
def test_gradcheck_coo_random(case):
    idx, size, vshape, fshape, gen = case
    v, f = param(*vshape, gen=gen), param(*fshape, gen=gen)
    # (fast_mode: the Jacobian against finite differences along random directions, rather than one
    # backward per element of the dense result, up to 243 of them: any wrong entry shows)
    assert gradcheck(
        lambda v, f: sparsefill.sparse_coo_tensor(idx, v, size, fill_value=f).to_dense() ** 2,
        (v, f),
        fast_mode=True,
    )


# ---------------------------------------------------------------------- leaf gradients vs dense
LOSSES = {
    "weighted_sum": lambda d, w: (d * w).sum(),
    "sin_sq": lambda d, w: (d.sin() ** 2 * w).sum(),
    "matmul": lambda d, w: (d.reshape(d.shape[0], -1) @ w.reshape(w.shape[0], -1)[0]).pow(2).sum(),
}


def dense_leaf_grad(x, loss, w):
    xd = x.detach().clone().requires_grad_()
    loss(xd, w).backward()
    return xd.grad


@st.composite
def leaf_cases(draw):
    layout = draw(st.sampled_from([COO, CSR]))
    ndim = draw(st.integers(2 if layout is CSR else 1, 4))
    dense_dim = draw(st.integers(0, ndim - (2 if layout is CSR else 1)))
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=ndim, max_size=ndim)))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    fill = draw(st.sampled_from([0.0, 1.5, "array"]))
    F = (
        torch.randn(shape[ndim - dense_dim :], dtype=F64, generator=gen)
        if fill == "array"
        else torch.tensor(fill, dtype=F64)
    )
    x = torch.randn(shape, dtype=F64, generator=gen)
    mask = torch.rand(shape[: ndim - dense_dim] + (1,) * dense_dim, generator=gen) < 0.5
    x = torch.where(mask, F.expand(shape), x)
    loss = draw(st.sampled_from(sorted(LOSSES)))
    return x, F, layout, dense_dim, loss


@settings(max_examples=40, deadline=None)
@given(leaf_cases())
def test_leaf_gradient_matches_dense(case):
    x, F, layout, dense_dim, loss_name = case
    loss = LOSSES[loss_name]
    w = torch.randn(x.shape, dtype=F64)
    A = sparsefill.to_sparse(x, fill_value=F, layout=layout, dense_dim=dense_dim).requires_grad_()
    assert A.is_leaf and A.requires_grad
    loss(A.to_dense(), w).backward()
    assert A.grad is not None
    assert_same(dense(A.grad), dense_leaf_grad(x, loss, w))


@pytest.mark.parametrize("layout", [COO, CSR])
def test_values_gradient_is_sparse_with_the_pattern_and_zero_fill(layout):
    x = torch.tensor([[1.0, 5.0, 2.0], [5.0, 5.0, 3.0]], dtype=F64)
    A = sparsefill.to_sparse(x, fill_value=5.0, layout=layout).requires_grad_()
    (A.values() * torch.tensor([1.0, 2.0, 3.0], dtype=F64)).sum().backward()
    G = A.grad
    assert isinstance(G, SparseTensor) and G.sparse_layout is layout and G.shape == A.shape
    assert not G.is_fill_indefinite()
    assert_same(G._fill_value(), torch.zeros((), dtype=F64).expand(G._fill_value().shape))
    if layout is COO:
        assert_same(G.coalesce().indices(), A.indices(), exact=True)
    else:
        assert_same(G.crow_indices(), A.crow_indices(), exact=True)
        assert_same(G.col_indices(), A.col_indices(), exact=True)
    assert_same(G.to_dense(), torch.tensor([[1.0, 0.0, 2.0], [0.0, 0.0, 3.0]], dtype=F64))


def test_values_and_to_dense_gradients_accumulate():
    x = torch.tensor([[1.0, 5.0, 2.0], [5.0, 5.0, 3.0]], dtype=F64)
    A = sparsefill.to_sparse(x, fill_value=5.0).requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sparsefill.DensifyWarning)
        (A.values().sum() + (A.to_dense() * 2).sum()).backward()
    assert_same(dense(A.grad), torch.tensor([[3.0, 2.0, 3.0], [2.0, 2.0, 3.0]], dtype=F64))


def _leaf(x, layout=COO, fill=5.0):
    return sparsefill.to_sparse(x, fill_value=fill, layout=layout).requires_grad_()


X = torch.tensor([[1.0, 5.0, 2.0], [5.0, 5.0, 3.0]], dtype=F64)
W = torch.tensor([[0.5, -1.0, 2.0], [3.0, 0.25, -2.0]], dtype=F64)


@pytest.mark.parametrize("src, dst", [(COO, CSR), (CSR, COO), (CSR, CSR), (COO, COO)])
def test_gradient_through_layout_change(src, dst):
    A = _leaf(X, src)
    (A.to_sparse(layout=dst).to_dense().sin() * W).sum().backward()
    assert_same(dense(A.grad), X.cos() * W)


def test_gradient_through_coalesce():
    A = sparsefill.sparse_coo_tensor(
        [[1, 0, 1]],
        torch.tensor([1.0, 2.0, 3.0], dtype=F64),
        (3,),
        fill_value=-1.0,
        is_coalesced=False,
    ).requires_grad_()
    w = torch.tensor([2.0, 3.0, 4.0], dtype=F64)
    C = A.coalesce()
    assert C.is_coalesced()
    (C.to_dense() ** 2 * w).sum().backward()
    assert_same(dense(A.grad), 2 * torch.tensor([2.0, 4.0, -1.0], dtype=F64) * w)


@pytest.mark.parametrize("layout", [COO, CSR])
@pytest.mark.parametrize("fill", [0.0, 5.0, [], float("nan")])
def test_gradient_reaches_dense_input_of_to_sparse(layout, fill):
    x = X.clone().requires_grad_()
    A = sparsefill.to_sparse(x, fill_value=fill, layout=layout)
    assert A.requires_grad
    out = A.to_dense(fill_value=0.0) if isinstance(fill, list) else A.to_dense()
    (out.sin() * W).sum().backward()
    assert_same(x.grad, X.cos() * W)


@pytest.mark.parametrize("layout", [COO, CSR])
def test_gradient_through_fill_change(layout):
    A = _leaf(X, layout)
    B = A.to_sparse(fill_value=2.0)
    assert_same(B._fill_value(), torch.tensor(2.0, dtype=F64))
    (B.to_dense().exp() * W).sum().backward()
    assert_same(dense(A.grad), X.exp() * W)


def test_gradient_through_dense_dim_change():
    x = torch.tensor([[[1.0, 2.0], [0.0, 0.0]], [[0.0, 0.0], [3.0, 0.0]]], dtype=F64)
    w = torch.randn(x.shape, dtype=F64)
    A = sparsefill.to_sparse(x).requires_grad_()
    (A.to_sparse(dense_dim=1).to_dense() ** 2 * w).sum().backward()
    assert_same(dense(A.grad), 2 * x * w)


def test_gradcheck_of_to_sparse_from_dense():
    w = torch.randn(2, 3, dtype=F64)
    x = torch.tensor([[1.0, 0.0, 2.0], [0.0, -1.5, 3.0]], dtype=F64, requires_grad=True)
    for layout in (COO, CSR):
        assert gradcheck(
            lambda t: (sparsefill.to_sparse(t, fill_value=0.5, layout=layout).to_dense() * w).sin(),
            (x,),
        )


def test_sgd_step_on_sparse_parameter():
    x = torch.tensor([[1.0, 5.0, 2.0], [5.0, 5.0, 3.0]], dtype=F64)
    p = torch.nn.Parameter(sparsefill.to_sparse(x, fill_value=5.0))
    assert isinstance(p, SparseTensor) and p.requires_grad
    opt = torch.optim.SGD([p], lr=0.1)
    (p.to_dense() * W).sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sparsefill.DensifyWarning)
        opt.step()
    assert isinstance(p, SparseTensor)
    assert_same(p.detach().to_dense(), x - 0.1 * W)


def test_fill_gradient_of_a_fully_stored_tensor_is_zero():
    """No unspecified element reads the fill: its gradient is 0 even where the derivative at the fill is NaN
    (not NaN * 0), as the dense gradient."""
    for shape, idx in (((), torch.zeros((0, 1), dtype=torch.long)), ((2,), torch.tensor([[0, 1]]))):
        v = torch.ones(idx.shape[1], dtype=torch.float64, requires_grad=True)
        f = torch.tensor(float("nan"), dtype=torch.float64, requires_grad=True)
        A = sparsefill.sparse_coo_tensor(idx, v, shape, fill_value=f)
        torch.atan2(A, torch.tensor(2.0, dtype=torch.float64)).sum().backward()
        assert f.grad == 0 and not v.grad.isnan().any()


def test_conj_and_complex_gradients():
    x = torch.tensor([[1 + 2j, 0j], [0j, 3j]], dtype=torch.complex128)
    A = sparsefill.to_sparse(x)
    torch.testing.assert_close(A.conj().to_dense(), x.conj())
    torch.testing.assert_close(A.mH.to_dense(), x.mH)
    d = x.clone()
    A.mH[0].fill_(5j)
    d.mH[0].fill_(5j)
    torch.testing.assert_close(A.to_dense(), d)
    c = torch.randn(2, 2, dtype=torch.complex128, requires_grad=True)
    c2 = c.detach().clone().requires_grad_()
    (A * c).abs().sum().backward()
    (A.to_dense() * c2).abs().sum().backward()
    torch.testing.assert_close(c.grad, c2.grad)


def test_to_torch_is_differentiable():
    A = sparsefill.to_sparse(torch.tensor([1.0, 0.0, 2.0])).requires_grad_()
    t = A.to_torch()
    assert t.grad_fn is not None
    (t.to_dense() ** 2).sum().backward()
    g = A.grad.to_dense() if isinstance(A.grad, SparseTensor) else A.grad
    torch.testing.assert_close(g, torch.tensor([2.0, 0.0, 4.0]))
