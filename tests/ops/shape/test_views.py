"""Views of a SparseTensor (``A[0]``, ``A.t()``, ``A.unbind()``, ``A.detach()``) behave as views of
``A.to_dense()``: writes go through to the base, and a view reads what its base holds now."""

import warnings

import pytest
import torch

import sparsefill
from sparsefill import SparseTensor
from hypothesis import given, strategies as st
from sparsefill.ops._writes import viewed
from tests.sparse_cases import assert_identical, outcome, sparse_cases, SETTINGS
import copy
import io

LAYOUTS = [torch.sparse_coo, torch.sparse_csr]


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sparsefill.DensifyWarning)
        yield


def _pair(layout):
    x = torch.tensor([[1.0, 5, 2, 5], [5, 5, 3, 5], [4, 5, 5, 5]], dtype=torch.float64)
    return sparsefill.to_sparse(x, fill_value=5.0, layout=layout), x.clone()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_view_is_refreshed_after_its_base_changes(layout):
    A, d = _pair(layout)
    row, col = A[1], A[:, 2]
    A.mul_(2)
    d.mul_(2)
    torch.testing.assert_close(row.to_dense(), d[1])
    torch.testing.assert_close(col.to_dense(), d[:, 2])
    A[1, 2] = -7.0
    d[1, 2] = -7.0
    assert float(col.to_dense()[1]) == -7.0
    torch.testing.assert_close(torch.exp(row), torch.exp(d[1]))  # refreshed on dispatch too


@pytest.mark.parametrize("layout", LAYOUTS)
def test_writes_through_a_chain_of_views(layout):
    A, d = _pair(layout)
    A.t()[2][1:].add_(100.0)
    d.t()[2][1:].add_(100.0)
    torch.testing.assert_close(A.to_dense(), d)
    sib = A[0]
    A.t()[0].zero_()
    d.t()[0].zero_()
    torch.testing.assert_close(sib.to_dense(), d[0])  # a sibling view sees the write


@pytest.mark.parametrize("layout", LAYOUTS)
def test_multi_output_views(layout):
    A, d = _pair(layout)
    a, b, c = A.unbind(0)
    b.sub_(1.0)
    d[1].sub_(1.0)
    p, q = A.split(2, dim=1)
    q.fill_(0.5)
    d[:, 2:].fill_(0.5)
    torch.testing.assert_close(A.to_dense(), d)
    torch.testing.assert_close(a.to_dense(), d[0])


def test_detach_and_parameter_share_with_their_base():
    A, d = _pair(torch.sparse_coo)
    p = torch.nn.Parameter(A)
    with torch.no_grad():
        p.mul_(3.0)
    d.mul_(3.0)
    torch.testing.assert_close(A.to_dense(), d)
    A.add_(1.0)
    d.add_(1.0)
    torch.testing.assert_close(p.detach().to_dense(), d)
    assert isinstance(A, SparseTensor) and isinstance(p, SparseTensor)


def test_write_through_bumps_the_base_version_for_autograd():
    A, _ = _pair(torch.sparse_coo)
    A.requires_grad_()
    y = A * A  # saves A for backward
    v0 = A._version
    with torch.no_grad():
        A.detach()[0].fill_(0.0)  # a write through a view: A's version counter must move...
    assert A._version > v0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()  # ...so autograd refuses the stale graph instead of a wrong gradient


def test_write_through_an_expanded_view():
    A = sparsefill.to_sparse(torch.eye(2))
    d = torch.eye(2)
    A.expand(2, 2, 2).fill_(5.0)
    d.expand(2, 2, 2).fill_(5.0)
    torch.testing.assert_close(A.to_dense(), d)


# ---------------------------------------------------------------- edge cases
import sparsefill as sf  # noqa: E402


@pytest.mark.filterwarnings("ignore::sparsefill.DensifyWarning")
def test_a_failed_write_through_leaves_the_view_unchanged(monkeypatch):
    """The in-place op runs on the view, then its write-through fails: the view gets its old contents back."""
    from sparsefill.ops import views

    A = sf.sparse_coo_tensor([[0, 1], [1, 2]], [1.0, 2.0], (3, 4), fill_value=5.0)
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


# ---------------------------------------------------------------------- _writes.assign_ (in-place results)
@SETTINGS
@given(
    sparse_cases(
        dtypes=[torch.float32, torch.float64, torch.int64],
        fills=("zero", "value", "array"),
        max_sdim=2,
    ),
    st.sampled_from(["view0", "t", "detach", "param", "data", "self"]),
    st.sampled_from(["mul_2", "add_self", "copy_f64", "clamp_", "neg_", "unsqueeze_"]),
)
def test_in_place_on_views_and_aliases(A, which, op):
    """An in-place op on a SparseTensor, a view or an alias of it: the written tensor and the base read as the
    dense tensors do after the same writes (or both raise)."""
    if which == "view0" and (A.dim() == 0 or A.shape[0] == 0) or which == "t" and A.dim() > 2:
        return
    x = A.to_dense()
    get = {
        "view0": lambda t: t[0],
        "t": lambda t: t.t(),
        "detach": lambda t: t.detach(),
        "data": lambda t: t.data,
        "param": lambda t: torch.nn.Parameter(t, requires_grad=False),
        "self": lambda t: t,
    }[which]
    do = {
        "mul_2": lambda t: t.mul_(2),
        "add_self": lambda t: t.add_(t),
        "clamp_": lambda t: t.clamp_(min=0),
        "copy_f64": lambda t: t.copy_(torch.full(t.shape, 1.5, dtype=torch.float64)),
        "neg_": lambda t: t.neg_(),
        "unsqueeze_": lambda t: t.unsqueeze_(0),
    }[op]
    V, v = get(A), get(x)
    before = x.clone()
    if (
        op == "unsqueeze_" and which != "self"
    ):  # (torch allows unsqueeze_ on a dense view; not a fast path)
        return
    ks, _ = outcome(lambda: do(V))
    kd, _ = outcome(lambda: do(v))
    if op == "unsqueeze_" and (A._view is not None or viewed(A)):  # a view's, or a viewed
        # tensor's, shape is fixed (its views would not follow): ValueError, nothing modified
        assert ks == "raise" and A.shape == before.shape
        assert_identical(A.to_dense(), before)
        return
    assert ks == kd
    # (the sign of a zero fill is not kept through a view's write-through: the library's -0.0 == 0.0 convention)
    assert_identical(V.to_dense(), v, signed_zeros=False)
    assert_identical(A.to_dense(), x, signed_zeros=False)


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


@pytest.mark.parametrize("layout", LAYOUTS)
def test_unsafe_view_is_a_view(layout):
    """``aten._unsafe_view`` (a view whose schema does not say so; torch's composites write
    through it: ``kron``'s ``out=``) writes through to its base, as ``view`` does."""
    A, d = _pair(layout)
    V = torch.ops.aten._unsafe_view(A, (2, 6))
    V.add_(1)
    d.view(2, 6).add_(1)
    torch.testing.assert_close(A.to_dense(), d)
