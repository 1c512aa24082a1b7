"""Regressions from the session-2 adversarial review: each was a wrong result, a crash on valid input or
invalid input accepted."""

import math
import warnings

import pytest
import torch

import sparsefill as sf


def D(t):
    if isinstance(t, tuple):
        return tuple(D(x) for x in t)
    return t.to_dense() if isinstance(t, sf.SparseTensor) else t


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sf.DensifyWarning)
        yield


@pytest.mark.parametrize("op", [lambda t: t.cumsum(-1), lambda t: t.softmax(-1), lambda t: t.cummax(-1),
                                lambda t: t.log_softmax(-1), lambda t: t.argmax(-1), lambda t: t.max(-1)])
def test_batched_csr_hybrid_dense_dim_ops(op):
    x = torch.zeros(2, 2, 2, 2)
    x[0, 1, 0, 1], x[1, 0, 1, 0] = 1., 3.
    A = sf.to_sparse(x, fill_value=0., layout=torch.sparse_csr, dense_dim=1)
    ref = op(x)
    torch.testing.assert_close(D(op(A)), tuple(ref) if isinstance(ref, tuple) else ref)


@pytest.mark.parametrize("dense_dim", [1, 2])
def test_arg_reductions_along_dense_dims_have_torch_shapes(dense_dim):
    x = torch.tensor([[[1., 5., 0.], [0., 0., 0.]], [[7., 2., 1.], [0., 3., 0.]]])
    A = sf.to_sparse(x, fill_value=0., dense_dim=dense_dim)
    for d in range(3):
        torch.testing.assert_close(D(torch.argmax(A, d)), torch.argmax(x, d))
        torch.testing.assert_close(D(torch.min(A, d, keepdim=True)), tuple(torch.min(x, d, keepdim=True)))


def test_softmax_of_a_slice_holding_inf_is_nan_as_in_torch():
    x = torch.tensor([1., math.inf, 0.])
    torch.testing.assert_close(D(sf.to_sparse(x, fill_value=0.).softmax(0)), x.softmax(0), equal_nan=True)
    y = torch.tensor([[1., 2.], [math.inf, 0.]])
    B = sf.to_sparse(y, fill_value=math.inf)
    torch.testing.assert_close(D(B.softmax(0)), y.softmax(0), equal_nan=True)
    torch.testing.assert_close(D(B.log_softmax(1)), y.log_softmax(1), equal_nan=True)


def test_complex_prod_with_a_nan_fill_only_where_the_fill_is():
    x = torch.tensor([[math.nan], [-3.]], dtype=torch.complex64)
    torch.testing.assert_close(D(sf.to_sparse(x, fill_value=math.nan).prod(1)), x.prod(1), equal_nan=True)


def test_reductions_of_a_shape_over_2_63_bytes():
    A = sf.sparse_coo_tensor([[1], [3]], [1.], (2**31 + 5, 2**31 + 3), fill_value=0.)
    assert float(A.sum()) == 1.0 and int(A.argmax()) == 1 * (2**31 + 3) + 3
    assert float(A.mean()) == pytest.approx(1.0 / ((2**31 + 5) * (2**31 + 3)))


@pytest.mark.parametrize("bad", [lambda: sf.to_sparse(torch.tensor([True, False])).argmax(),
                                 lambda: sf.to_sparse(torch.tensor([1, 0])).var(),
                                 lambda: sf.to_sparse(torch.tensor([True, False])).median(),
                                 lambda: sf.to_sparse(torch.tensor([1j, 0])).nansum(),
                                 lambda: torch._foreach_add([sf.to_sparse(torch.tensor([1., 0.]))], [1., 2.]),
                                 lambda: sf.to_sparse(torch.ones(1, 3)).add_(sf.to_sparse(torch.ones(2, 3)))])
def test_invalid_input_raises_as_dense_torch(bad):
    with pytest.raises(RuntimeError):  # (NotImplementedError, torch's "not implemented for 'Bool'", is one)
        bad()


def test_logsumexp_promotes_bool_and_int():
    for x in [torch.tensor([True, False]), torch.tensor([3, 0, 1])]:
        torch.testing.assert_close(torch.logsumexp(sf.to_sparse(x), 0), torch.logsumexp(x, 0))


def test_a_failed_write_through_leaves_the_view_unchanged(monkeypatch):
    """The in-place op runs on the view, then its write-through fails: the view gets its old contents back."""
    from sparsefill.ops import views

    A = sf.sparse_coo_tensor([[0, 1], [1, 2]], [1., 2.], (3, 4), fill_value=5.)
    V = A[0]
    before = V.to_dense().clone()

    def boom(_):
        raise ValueError("write-through refused")
    monkeypatch.setattr(views, "write_through", boom)
    with pytest.raises(ValueError, match="refused"):
        V.add_(1)
    monkeypatch.undo()
    torch.testing.assert_close(V.to_dense(), before)
    torch.testing.assert_close(A.to_dense()[0], before)


# ---------------------------------------------------------------- session 3 review
def _d(t):
    return t.to_dense() if isinstance(t, sf.SparseTensor) else t


def test_median_dim_of_integer_tensors():
    x = torch.tensor([[1, 0, 2], [0, 0, 3]])
    for layout in (torch.sparse_coo, torch.sparse_csr):
        A = sf.to_sparse(x, fill_value=0, layout=layout)
        for fn in (torch.median, torch.nanmedian):
            v, i = fn(A, 1)
            torch.testing.assert_close(v, fn(x, 1).values)
            torch.testing.assert_close(x.gather(1, i[:, None])[:, 0], v)


def test_strided_targets_with_sparse_sources_and_sparse_masks():
    xd = torch.zeros(4, 3)
    S = sf.to_sparse(torch.eye(4, 3), fill_value=0.)
    i = torch.tensor([3, 0, 3, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sf.DensifyWarning)
        torch.testing.assert_close(_d(torch.index_add(xd, 0, i, S)), torch.index_add(xd, 0, i, torch.eye(4, 3)))
        torch.testing.assert_close(_d(torch.index_copy(xd, 0, torch.tensor([2, 0, 1, 3]), S)),
                                   torch.index_copy(xd, 0, torch.tensor([2, 0, 1, 3]), torch.eye(4, 3)))
        y, z = xd.clone(), xd.clone()
        y[torch.tensor([1, 2])] = S[:2]
        z[torch.tensor([1, 2])] = torch.eye(4, 3)[:2]
        torch.testing.assert_close(_d(y), z)
        x = torch.tensor([[1., 0, 2], [0, 0, 3]])
        A = sf.to_sparse(x, fill_value=0.)
        A[sf.to_sparse(x > 0, fill_value=False)] = 5.
        torch.testing.assert_close(A.to_dense(), torch.where(x > 0, 5., x))


def test_meta_cache_follows_the_default_dtype():
    B = sf.to_sparse(torch.tensor([[1, 0, 2], [0, 0, 3]]), fill_value=0)
    old = torch.get_default_dtype()
    try:
        assert torch.logsumexp(B, 1).dtype == torch.float32
        torch.set_default_dtype(torch.float64)
        assert torch.logsumexp(B, 1).dtype == torch.float64
    finally:
        torch.set_default_dtype(old)


def test_index_errors_as_torch():
    A4 = sf.to_sparse(torch.arange(20.).reshape(4, 5), fill_value=0.)
    with pytest.raises(IndexError):
        A4[torch.tensor([True, False, True]), torch.tensor([0, 1])]  # the mask's length is not dim 0's
    for bad in (lambda t: torch.index_add(t, 0, torch.tensor([-1]), torch.ones(1, 5)),
                lambda t: torch.index_copy(t, 0, torch.tensor([-1]), torch.ones(1, 5)),
                lambda t: torch.index_select(t, 0, torch.tensor([-1]))):
        with pytest.raises(Exception) as dense_err:
            bad(torch.arange(20.).reshape(4, 5))
        with pytest.raises(type(dense_err.value)):
            bad(A4)
    torch.testing.assert_close(A4[torch.tensor([-1])].to_dense(), torch.arange(20.).reshape(4, 5)[[-1]])
    torch.testing.assert_close(torch.index_fill(A4, 0, torch.tensor([-1]), 2.).to_dense(),
                               torch.index_fill(torch.arange(20.).reshape(4, 5), 0, torch.tensor([-1]), 2.))
    E = sf.to_sparse(torch.zeros(3, 0), fill_value=0.)
    for fn in (lambda t: torch.max(t, 1), lambda t: torch.min(t, 1), lambda t: torch.median(t, 1),
               lambda t: torch.argmax(t, 1)):
        with pytest.raises(IndexError):
            fn(E)


def test_scatter_reduce_max_and_min_names():
    x = torch.tensor([[1., 0, 2], [0, 0, 3]])
    A = sf.to_sparse(x, fill_value=0.)
    idx, src = torch.tensor([[1, 1, 0]]), torch.tensor([[5., -1., 7.]])
    for name in ("max", "min"):
        with warnings.catch_warnings():
            warnings.simplefilter("error", sf.DensifyWarning)
            out = torch.scatter_reduce(A, 0, idx, src, name)
        torch.testing.assert_close(out.to_dense(), torch.scatter_reduce(x, 0, idx, src, name))
