"""Regression tests from review: each once gave a silently wrong result; each is checked against dense."""

import copy
import io
import warnings

import pytest
import torch

import sparsefill
from sparsefill import SparseTensor


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sparsefill.DensifyWarning)
        yield


def test_in_place_fill_change_is_seen_by_every_later_op():
    A = sparsefill.sparse_coo_tensor([[0]], [1.0], (3,))  # fill known zero at construction
    A.fill_value().fill_(5.0)
    A.mul_(0)
    torch.testing.assert_close(A.to_dense(), torch.zeros(3))
    B = sparsefill.sparse_coo_tensor([[0]], [1.0], (3,))
    B._fill_value().add_(5.0)
    for C in (B.detach(), copy.deepcopy(B)):
        with pytest.raises(ValueError, match="not zero"):
            C.to_torch()
        torch.testing.assert_close(
            C.to_torch(materialize=True).to_dense(), torch.tensor([1.0, 5.0, 5.0])
        )


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.float32])
def test_cast_of_uncoalesced_sums_duplicates_first(dtype):
    A = sparsefill.sparse_coo_tensor(
        [[0, 0, 1, 1]], torch.tensor([0.5, 0.5, 0.25, -0.25], dtype=torch.float64), (3,)
    )
    torch.testing.assert_close(A.to(dtype).to_dense(), A.to_dense().to(dtype))
    C = sparsefill.zeros(3, dtype=dtype)
    C.copy_(A)
    torch.testing.assert_close(C.to_dense(), A.to_dense().to(dtype))


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


def test_saving_a_stale_view_saves_what_its_base_holds_now():
    A = sparsefill.to_sparse(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))
    V = A[1]
    A.mul_(10)
    buf = io.BytesIO()
    torch.save(V, buf)
    buf.seek(0)
    for W in (copy.deepcopy(V), torch.load(buf, weights_only=True)):
        torch.testing.assert_close(W.to_dense(), torch.tensor([0.0, 20.0]))


def test_views_under_inference_mode():
    x = torch.tensor([[1.0, 1.5], [1.5, 2.0]])
    A = sparsefill.to_sparse(x, fill_value=1.5)
    with torch.inference_mode():
        assert A[0].shape == (2,) and A.t().shape == (2, 2)
        A[0] = 3.0
        B = sparsefill.to_sparse(x, fill_value=1.5)
        V = B[1]
        B.fill_value().fill_(7.0)
        torch.testing.assert_close(V.to_dense(), torch.tensor([7.0, 2.0]))
    torch.testing.assert_close(A.to_dense()[0], torch.tensor([3.0, 3.0]))


def test_set_fill_value_copies_and_writes_through_views():
    f = torch.tensor(2.0)
    A = sparsefill.sparse_coo_tensor([[0]], [1.0], (3,))
    A.set_fill_value_(f)
    f.add_(1)
    torch.testing.assert_close(A.to_dense(), torch.tensor([1.0, 2.0, 2.0]))
    x = torch.tensor([[1.0, 1.5], [1.5, 2.0]])
    B = sparsefill.to_sparse(x, fill_value=1.5)
    B.t().set_fill_value_(0.0)
    torch.testing.assert_close(B.to_dense(), torch.tensor([[1.0, 0.0], [0.0, 2.0]]))


def test_deepcopy_of_a_parameter_is_a_parameter():
    p = torch.nn.Parameter(sparsefill.to_sparse(torch.ones(3)))
    q = copy.deepcopy(p)
    assert isinstance(q, torch.nn.Parameter) and isinstance(q, SparseTensor) and q.requires_grad
    m = torch.nn.Module()
    m.w = p
    assert isinstance(copy.deepcopy(m).w, torch.nn.Parameter)


def test_to_torch_is_differentiable():
    A = sparsefill.to_sparse(torch.tensor([1.0, 0.0, 2.0])).requires_grad_()
    t = A.to_torch()
    assert t.grad_fn is not None
    (t.to_dense() ** 2).sum().backward()
    g = A.grad.to_dense() if isinstance(A.grad, SparseTensor) else A.grad
    torch.testing.assert_close(g, torch.tensor([2.0, 0.0, 4.0]))
