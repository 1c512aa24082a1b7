"""SparseTensor basics: accessors, fill changes, factories, conversions, equality, serialization, repr,
the densify policy and in-place ops through the densify fallback.

Semantics: docs/architecture.md (the invariant ``densify(op(A)) == op(densify(A))``).
"""

import copy
import io
import pickle
import warnings

import pytest
import torch

import sparsefill
from sparsefill import SparseTensor
import math
from hypothesis import given, strategies as st
from tests.sparse_cases import outcome, scalars, random_values, SETTINGS
from tests.models.test_training_loops import _W

COO, CSR = torch.sparse_coo, torch.sparse_csr


def assert_same(actual, expected):
    """Exact equality of plain tensors, NaN == NaN, dtype and shape included."""
    assert not isinstance(actual, SparseTensor) and not isinstance(expected, SparseTensor)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def dense(T):
    return T.to_dense() if isinstance(T, SparseTensor) else T


@pytest.fixture
def quiet():
    """Run a block that densifies on purpose without DensifyWarning noise."""
    with sparsefill.densify_policy("allow"):
        yield


# ---------------------------------------------------------------------- accessors
def test_coo_accessors():
    idx = torch.tensor([[0, 2], [1, 0]])
    vals = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    A = sparsefill.sparse_coo_tensor(
        idx, vals, (3, 3, 2), fill_value=torch.tensor([7.0, 8.0]), is_coalesced=True
    )
    assert isinstance(A, SparseTensor) and isinstance(A, torch.Tensor)
    assert (
        A.sparse_layout is COO and A.layout is torch.strided
    )  # a SparseTensor reports the strided layout, as the dense tensor it stands for
    assert A.shape == (3, 3, 2) and A.dtype == torch.float32 and A.device.type == "cpu"
    assert A.sparse_dim() == 2 and A.dense_dim() == 1 and A._nse() == 2
    assert A.is_coalesced()
    assert_same(A.indices(), idx)
    assert_same(A._indices(), idx)
    assert_same(A.values(), vals)
    assert_same(A._values(), vals)
    assert_same(A.fill_value(), torch.tensor([7.0, 8.0]))
    assert_same(A._fill_value(), torch.tensor([7.0, 8.0]))
    expected = torch.tensor([7.0, 8.0]).expand(3, 3, 2).clone()
    expected[0, 1] = torch.tensor([1.0, 2.0])
    expected[2, 0] = torch.tensor([3.0, 4.0])
    assert_same(A.to_dense(), expected)
    assert A.coalesce().is_coalesced()
    assert_same(A.coalesce().to_dense(), expected)
    with pytest.raises(RuntimeError):
        A.crow_indices()
    with pytest.raises(RuntimeError):
        A.col_indices()


def test_csr_accessors():
    crow = torch.tensor([[0, 1, 3], [0, 2, 3]])
    col = torch.tensor([[1, 0, 2], [0, 1, 1]])
    vals = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    A = sparsefill.sparse_csr_tensor(crow, col, vals, (2, 2, 3), fill_value=-1.0)
    assert A.sparse_layout is CSR and A.layout is torch.strided
    assert A.sparse_dim() == 2 and A.dense_dim() == 0 and A._nse() == 3  # nse per batch, as torch
    assert_same(A.crow_indices(), crow)
    assert_same(A.col_indices(), col)
    assert_same(A.values(), vals)
    assert_same(A._fill_value(), torch.tensor(-1.0))
    assert_same(A.fill_value(), torch.tensor(-1.0))
    expected = torch.tensor(
        [[[-1.0, 1.0, -1.0], [2.0, -1.0, 3.0]], [[4.0, 5.0, -1.0], [-1.0, 6.0, -1.0]]]
    )
    assert_same(A.to_dense(), expected)
    with pytest.raises(RuntimeError):
        A.indices()
    with pytest.raises(RuntimeError):
        A._indices()


def test_fill_value_of_hybrid_tensor():
    A = sparsefill.sparse_coo_tensor([[0, 3]], [[0.11, 0.12], [0.31, 0.32]], (4, 2), fill_value=1.2)
    assert_same(A.fill_value(), torch.tensor([1.2, 1.2]))
    assert_same(A._fill_value(), torch.tensor(1.2))
    assert A.fill_value().shape == A.values().shape[1:]
    assert A.fill_value().dtype == A.dtype and A.fill_value().device == A.device
    assert_same(A.to_dense(), torch.tensor([[0.11, 0.12], [1.2, 1.2], [1.2, 1.2], [0.31, 0.32]]))
    # default fill of a hybrid tensor: zero
    B = sparsefill.sparse_coo_tensor([[0, 3]], [[0.11, 0.12], [0.31, 0.32]], (4, 2))
    assert_same(B.fill_value(), torch.zeros(2))


def test_to_sparse_of_ones():
    A = sparsefill.to_sparse(torch.ones(10), fill_value=1.0)
    assert A._nse() == 0 and A.indices().shape == (1, 0)
    assert_same(A._fill_value(), torch.tensor(1.0))
    assert_same(A.to_dense(), torch.ones(10))


def test_uncoalesced_indices_and_values_raise():
    A = sparsefill.sparse_coo_tensor(
        [[1, 0, 1]], [1.0, 2.0, 3.0], (3,), fill_value=-1.0, is_coalesced=False
    )
    assert not A.is_coalesced()
    with pytest.raises(RuntimeError, match="coalesce"):
        A.indices()
    with pytest.raises(RuntimeError, match="coalesce"):
        A.values()
    assert_same(A._indices(), torch.tensor([[1, 0, 1]]))
    assert_same(A._values(), torch.tensor([1.0, 2.0, 3.0]))
    assert A._nse() == 3
    assert_same(A.to_dense(), torch.tensor([2.0, 4.0, -1.0]))
    C = A.coalesce()
    assert C.is_coalesced() and C._nse() == 2
    assert_same(C.indices(), torch.tensor([[0, 1]]))
    assert_same(C.values(), torch.tensor([2.0, 4.0]))
    assert_same(C.to_dense(), torch.tensor([2.0, 4.0, -1.0]))


# ---------------------------------------------------------------------- fill changes in place
@pytest.mark.parametrize("layout", [COO, CSR])
def test_fill_value_changed_in_place(layout):
    x = torch.tensor([[1.0, 0.0, 2.0], [0.0, 0.0, 3.0]])
    A = sparsefill.to_sparse(x, layout=layout)
    A.fill_value().fill_(1.2)
    assert_same(A.to_dense(), torch.tensor([[1.0, 1.2, 2.0], [1.2, 1.2, 3.0]]))
    A._fill_value().fill_(-4.0)
    assert_same(A.to_dense(), torch.tensor([[1.0, -4.0, 2.0], [-4.0, -4.0, 3.0]]))
    assert A.set_fill_value_(7.0) is A
    assert_same(A.to_dense(), torch.tensor([[1.0, 7.0, 2.0], [7.0, 7.0, 3.0]]))
    A.set_fill_value_([])
    assert A.is_fill_indefinite()
    with pytest.raises(ValueError):
        A.to_dense()
    A.set_fill_value_(0.0)
    assert not A.is_fill_indefinite()
    assert_same(A.to_dense(), x)


def test_fill_value_changed_in_place_hybrid():
    A = sparsefill.sparse_coo_tensor([[0, 3]], [[0.11, 0.12], [0.31, 0.32]], (4, 2), fill_value=1.2)
    A.fill_value().fill_(2.5)
    assert_same(A.to_dense(), torch.tensor([[0.11, 0.12], [2.5, 2.5], [2.5, 2.5], [0.31, 0.32]]))
    A.set_fill_value_(torch.tensor([5.0, 6.0]))
    assert_same(A.to_dense(), torch.tensor([[0.11, 0.12], [5.0, 6.0], [5.0, 6.0], [0.31, 0.32]]))
    A._fill_value()[1] = -1.0
    assert_same(A.to_dense(), torch.tensor([[0.11, 0.12], [5.0, -1.0], [5.0, -1.0], [0.31, 0.32]]))


def test_in_place_fill_change_invalidates_the_zero_fill_flag():
    """A zero fill made nonzero in place is no longer zero for the zero-fill fast paths."""
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    for change in (lambda A: A._fill_value().fill_(2.0), lambda A: A.fill_value().fill_(2.0)):
        A = sparsefill.to_sparse(x)
        assert_same(A.to_torch().to_dense(), x)
        change(A)
        with pytest.raises(ValueError, match="materialize"):
            A.to_torch()
        assert_same(A.to_dense(), torch.tensor([[1.0, 2.0], [2.0, 2.0]]))


# ---------------------------------------------------------------------- factories
@pytest.mark.parametrize("layout", [COO, CSR, torch.strided])
def test_factories(layout):
    size = (2, 3)
    cases = [
        (sparsefill.full(size, 2.5, layout=layout), torch.full(size, 2.5)),
        (sparsefill.full(size, 7, layout=layout), torch.full(size, 7)),
        (sparsefill.zeros(2, 3, layout=layout), torch.zeros(size)),
        (
            sparsefill.zeros(size, layout=layout, dtype=torch.float64),
            torch.zeros(size, dtype=torch.float64),
        ),
        (sparsefill.ones(2, 3, layout=layout), torch.ones(size)),
        (
            sparsefill.ones(size, layout=layout, dtype=torch.int32),
            torch.ones(size, dtype=torch.int32),
        ),
        (sparsefill.eye(3, layout=layout), torch.eye(3)),
        (sparsefill.eye(3, 4, layout=layout), torch.eye(3, 4)),
    ]
    for T, expected in cases:
        if layout is torch.strided:
            assert not isinstance(T, SparseTensor) and T.layout is torch.strided
            assert_same(T, expected)
            continue
        assert isinstance(T, SparseTensor) and T.sparse_layout is layout
        assert_same(T.to_dense(), expected)
        if expected.shape == size:  # full/zeros/ones: no specified element, the fill is the value
            assert T._nse() == 0
            assert_same(T._fill_value(), expected[0, 0])
        else:  # eye: the diagonal is specified, fill 0
            assert T._nse() == min(expected.shape)
            assert_same(T._fill_value(), torch.tensor(0.0))
    E = sparsefill.empty(2, 3, layout=layout, dtype=torch.float64)
    assert E.shape == size and E.dtype == torch.float64
    if layout is not torch.strided:
        assert isinstance(E, SparseTensor) and E.sparse_layout is layout and E._nse() == 0
        assert E.to_dense().shape == size


def test_full_with_dense_dim_and_array_fill():
    T = sparsefill.full((3, 2), torch.tensor([1.0, 2.0]), dense_dim=1)
    assert T.dense_dim() == 1 and T._nse() == 0
    assert_same(T.to_dense(), torch.tensor([[1.0, 2.0]] * 3))
    R = sparsefill.full((2, 3, 2), 4.0, layout=CSR, dense_dim=1)
    assert R.sparse_layout is CSR and R.dense_dim() == 1
    assert_same(R.to_dense(), torch.full((2, 3, 2), 4.0))


@pytest.mark.parametrize("layout", [COO, CSR])
def test_like_factories(layout):
    x = torch.tensor([[1.0, 0.0, 2.0], [0.0, 0.0, 3.0]])
    A = sparsefill.to_sparse(x, layout=layout, fill_value=0.0)
    for T, expected in [
        (sparsefill.full_like(A, 4.0), torch.full_like(x, 4.0)),
        (sparsefill.zeros_like(A), torch.zeros_like(x)),
        (sparsefill.ones_like(A), torch.ones_like(x)),
        (sparsefill.ones_like(A, dtype=torch.int64), torch.ones_like(x, dtype=torch.int64)),
        (torch.full_like(A, 4.0), torch.full_like(x, 4.0)),
        (torch.zeros_like(A), torch.zeros_like(x)),
        (torch.ones_like(A), torch.ones_like(x)),
        (sparsefill.zeros_like(x, layout=layout), torch.zeros_like(x)),
        (sparsefill.full_like(x, 2.0, layout=layout), torch.full_like(x, 2.0)),
    ]:
        assert isinstance(T, SparseTensor) and T.sparse_layout is layout and T._nse() == 0
        assert_same(T.to_dense(), expected)
        assert_same(T._fill_value(), expected[0, 0])
    for T in (sparsefill.empty_like(A), torch.empty_like(A)):
        assert isinstance(T, SparseTensor) and T.sparse_layout is layout and T.shape == x.shape
        assert T.dtype == x.dtype and T._nse() == 0
    for T, expected in [
        (sparsefill.ones_like(A, layout=torch.strided), torch.ones_like(x)),
        (sparsefill.full_like(A, 3.0, layout=torch.strided), torch.full_like(x, 3.0)),
        (sparsefill.zeros_like(x), torch.zeros_like(x)),
    ]:
        assert not isinstance(T, SparseTensor)
        assert_same(T, expected)
    E = sparsefill.empty_like(A, layout=torch.strided)
    assert not isinstance(E, SparseTensor) and E.shape == x.shape


def test_like_factories_keep_dense_dims():
    A = sparsefill.sparse_coo_tensor([[0, 3]], [[0.11, 0.12], [0.31, 0.32]], (4, 2), fill_value=1.2)
    T = sparsefill.full_like(A, 3.0)
    assert T.dense_dim() == 1 and T.sparse_dim() == 1
    assert_same(T.to_dense(), torch.full((4, 2), 3.0))


# ---------------------------------------------------------------------- detach, clone, to, copy_
def test_detach_clone_to(quiet):
    x = torch.tensor([[1.5, 2.5, 2.5], [2.5, -3.5, 2.5]])
    for layout in (COO, CSR):
        A = sparsefill.to_sparse(x, fill_value=2.5, layout=layout)
        D = A.detach()
        assert isinstance(D, SparseTensor) and D.sparse_layout is layout and not D.requires_grad
        assert_same(D.to_dense(), x)
        C = A.clone()
        assert isinstance(C, SparseTensor) and C.sparse_layout is layout
        C._fill_value().fill_(0.0)
        C._values().mul_(10)
        assert_same(A.to_dense(), x)  # the clone is independent
        assert_same(C.to_dense(), torch.tensor([[15.0, 0.0, 0.0], [0.0, -35.0, 0.0]]))
        for T, dtype in [
            (A.to(torch.float64), torch.float64),
            (A.double(), torch.float64),
            (A.to(dtype=torch.int64), torch.int64),
            (A.to(torch.complex64), torch.complex64),
        ]:
            assert isinstance(T, SparseTensor) and T.sparse_layout is layout
            assert (
                T.dtype == dtype and T._fill_value().dtype == dtype and T._values().dtype == dtype
            )
            assert_same(T.to_dense(), x.to(dtype))
        assert_same(A.to(torch.float32).to_dense(), x)


def test_copy_between_layouts_and_dense(quiet):
    x = torch.tensor([[1.0, 5.0, 2.0], [5.0, 5.0, 3.0]])
    y = torch.tensor([[0.0, 1.0, 0.0], [4.0, 0.0, 0.0]])
    # SparseTensor <- SparseTensor of the other layout
    for src_layout, dst_layout in [(COO, CSR), (CSR, COO), (COO, COO)]:
        S = sparsefill.to_sparse(x, fill_value=5.0, layout=src_layout)
        D = sparsefill.to_sparse(y, layout=dst_layout)
        assert D.copy_(S) is D
        assert isinstance(D, SparseTensor) and D.sparse_layout is dst_layout
        assert_same(D.to_dense(), x)
        assert_same(S.to_dense(), x)
    # SparseTensor <- SparseTensor of another dtype: the destination keeps its dtype
    D = sparsefill.to_sparse(y.double(), layout=CSR)
    D.copy_(sparsefill.to_sparse(x, fill_value=5.0))
    assert D.dtype == torch.float64
    assert_same(D.to_dense(), x.double())
    # SparseTensor <- dense
    for layout in (COO, CSR):
        D = sparsefill.to_sparse(y, fill_value=0.0, layout=layout)
        src = x.clone()
        D.copy_(src)
        assert isinstance(D, SparseTensor) and D.sparse_layout is layout
        assert_same(D.to_dense(), x)
        assert_same(src, x)
    # dense <- SparseTensor
    d = torch.zeros(2, 3)
    d.copy_(sparsefill.to_sparse(x, fill_value=5.0, layout=CSR))
    assert not isinstance(d, SparseTensor)
    assert_same(d, x)


def test_torch_equal():
    x = torch.tensor([[1.0, 5.0, 2.0], [5.0, 5.0, 3.0]])
    A = sparsefill.to_sparse(x, fill_value=5.0)
    B = sparsefill.to_sparse(
        x, fill_value=0.0, layout=CSR
    )  # other pattern, other fill, other layout
    C = sparsefill.sparse_coo_tensor(
        [[0, 0, 1, 1], [0, 1, 1, 2]], [1.0, 5.0, 5.0, 3.0], (2, 3), fill_value=2.0
    )
    # C stores fill-like values and has fill 2: its dense tensor is [[1, 5, 2], [2, 5, 3]]
    assert torch.equal(A, x) and torch.equal(x, A)
    assert torch.equal(A, B) and torch.equal(B, A)
    assert not torch.equal(A, C) and not torch.equal(C, A)
    assert torch.equal(C, torch.tensor([[1.0, 5.0, 2.0], [2.0, 5.0, 3.0]]))
    assert not torch.equal(A, x + 1) and not torch.equal(x + 1, A)
    # same pattern and values, fills differ only where unspecified
    D = sparsefill.to_sparse(x, fill_value=5.0)
    D.set_fill_value_(6.0)
    assert not torch.equal(A, D)
    # all elements specified: the fills do not matter
    F1 = sparsefill.to_sparse(x, fill_value=-1.0)
    F2 = sparsefill.to_sparse(x, fill_value=-2.0, layout=CSR)
    assert torch.equal(F1, F2)
    assert not torch.equal(A, sparsefill.to_sparse(x[:, :2].contiguous()))


# ---------------------------------------------------------------------- serialization
def _examples():
    x = torch.tensor([[1.0, 5.0, 2.0], [5.0, 5.0, 3.0]])
    return [
        sparsefill.to_sparse(x, fill_value=5.0),
        sparsefill.to_sparse(x, fill_value=5.0, layout=CSR),
        sparsefill.sparse_coo_tensor(
            [[0, 3]], [[0.11, 0.12], [0.31, 0.32]], (4, 2), fill_value=torch.tensor([1.0, 2.0])
        ),
        sparsefill.sparse_coo_tensor(
            [[1, 0, 1]], [1.0, 2.0, 3.0], (3,), fill_value=-1.0, is_coalesced=False
        ),
        sparsefill.to_sparse(x, fill_value=[]),
        sparsefill.to_sparse(torch.tensor([[1, 0], [0, 2]]), fill_value=0),
    ]


def _check_same_tensor(B, A):
    assert isinstance(B, SparseTensor)
    assert B.sparse_layout is A.sparse_layout and B.shape == A.shape and B.dtype == A.dtype
    assert B.dense_dim() == A.dense_dim() and B._nse() == A._nse()
    assert B.is_coalesced() == A.is_coalesced() and B.is_fill_indefinite() == A.is_fill_indefinite()
    if A.is_fill_indefinite():
        assert_same(B.to_dense(fill_value=0), A.to_dense(fill_value=0))
    else:
        assert_same(B._fill_value(), A._fill_value())
        assert_same(B.to_dense(), A.to_dense())


@pytest.mark.parametrize("i", range(6))
def test_torch_save_load_weights_only(i):
    A = _examples()[i]
    buf = io.BytesIO()
    torch.save({"A": A, "w": torch.arange(3)}, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    _check_same_tensor(loaded["A"], A)
    assert_same(loaded["w"], torch.arange(3))


def test_save_load_keeps_requires_grad():
    A = sparsefill.to_sparse(
        torch.tensor([[1.0, 0.0], [0.0, 2.0]]), fill_value=0.5
    ).requires_grad_()
    buf = io.BytesIO()
    torch.save(A, buf)
    buf.seek(0)
    B = torch.load(buf, weights_only=True)
    assert B.requires_grad and B.is_leaf
    _check_same_tensor(B.detach(), A.detach())


@pytest.mark.parametrize("i", range(6))
def test_pickle_and_deepcopy(i):
    A = _examples()[i]
    _check_same_tensor(pickle.loads(pickle.dumps(A)), A)
    B = copy.deepcopy(A)
    _check_same_tensor(B, A)
    before = A.to_dense(fill_value=0) if A.is_fill_indefinite() else A.to_dense()
    B.set_fill_value_(9)
    B._values().add_(1)
    after = A.to_dense(fill_value=0) if A.is_fill_indefinite() else A.to_dense()
    assert_same(after, before)  # the copy is independent of the original
    if not A.is_fill_indefinite():
        assert_same(A._fill_value(), _examples()[i]._fill_value())


def test_deepcopy_in_place_fill_change_of_copy():
    A = sparsefill.to_sparse(torch.tensor([1.0, 0.0, 2.0]))
    B = copy.deepcopy(A)
    B.fill_value().fill_(3.0)
    assert_same(A.to_dense(), torch.tensor([1.0, 0.0, 2.0]))
    assert_same(B.to_dense(), torch.tensor([1.0, 3.0, 2.0]))


# ---------------------------------------------------------------------- repr
def test_repr_never_densifies(monkeypatch):
    examples = _examples()

    def boom(*args, **kwargs):
        raise AssertionError("repr densified")

    for module in (sparsefill._tensor.parts, sparsefill._tensor.dense, sparsefill._tensor.native):
        monkeypatch.setattr(module, "dense_of", boom)
    monkeypatch.setattr(SparseTensor, "to_dense", boom)
    A, C, H, U, I, N = examples
    r = repr(A)
    for part in ("(2, 3)", "sparse_coo", "nse=3", "fill_value", "5.", "float32"):
        assert part in r, (part, r)
    r = repr(C)
    for part in ("(2, 3)", "sparse_csr", "nse=3", "5.", "float32"):
        assert part in r, (part, r)
    r = repr(H)
    for part in ("(4, 2)", "nse=2", "1.", "2."):
        assert part in r, (part, r)
    assert "indefinite" in repr(I)
    assert "int64" in repr(N)
    assert "nse=3" in repr(U)
    assert str(A) == repr(A)
    assert "sparse_coo" in f"{A}"
    big = sparsefill.full((10**6, 10**6), 1.0)  # 10**12 elements: densifying is impossible
    assert "(1000000, 1000000)" in repr(big)


# ---------------------------------------------------------------------- densify policy
def _densifying_op(A):
    """An op with no sparse handler: computed by the densify fallback."""
    return torch.geqrf(A)[0]


def test_densify_policy_modes():
    x = torch.tensor([[1.0, 5.0, 2.0], [5.0, 5.0, 3.0]])
    A = sparsefill.to_sparse(x, fill_value=5.0)
    expected = _densifying_op(x)
    assert sparsefill.get_densify_policy().mode == "warn"  # the default
    with pytest.warns(sparsefill.DensifyWarning):
        assert_same(dense(_densifying_op(A)), expected)
    with sparsefill.densify_policy("raise"):
        with pytest.raises(sparsefill.DensifyError):
            _densifying_op(A)
        # dense by nature, explicitly asked for: allowed
        assert_same(A.to_dense(), x)
    with sparsefill.densify_policy("allow"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert_same(dense(_densifying_op(A)), expected)
    for mode in ("allow", "warn"):
        with sparsefill.densify_policy(mode, limit_bytes=8):
            with pytest.raises(sparsefill.DensifyError, match="8"):
                _densifying_op(A)
    with sparsefill.densify_policy("allow", limit_bytes=10**6):
        assert_same(dense(_densifying_op(A)), expected)
    assert sparsefill.get_densify_policy().mode == "warn"  # contexts restore


def test_to_dense_emits_no_densify_warning():
    A = sparsefill.to_sparse(torch.tensor([[1.0, 5.0], [5.0, 3.0]]), fill_value=5.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        A.to_dense()


def test_set_densify_policy_returns_the_old_policy():
    old = sparsefill.set_densify_policy("raise")
    try:
        assert old.mode == "warn"
        assert sparsefill.get_densify_policy().mode == "raise"
        A = sparsefill.to_sparse(torch.tensor([[1.0, 5.0], [5.0, 3.0]]), fill_value=5.0)
        with pytest.raises(sparsefill.DensifyError):
            _densifying_op(A)
        prev = sparsefill.set_densify_policy(limit_bytes=123)
        assert prev.mode == "raise"
        assert sparsefill.get_densify_policy().limit_bytes == 123
        assert sparsefill.get_densify_policy().mode == "raise"  # left out: kept
    finally:
        sparsefill.set_densify_policy(old.mode, old.limit_bytes)
    assert sparsefill.get_densify_policy() == old


def test_bad_policy_rejected():
    with pytest.raises(ValueError, match="mode"):
        with sparsefill.densify_policy("sometimes"):
            pass
    with pytest.raises(ValueError, match="limit_bytes"):
        with sparsefill.densify_policy(limit_bytes=-1):
            pass


# ---------------------------------------------------------------------- in-place ops
def _run_recording_densify(op, *args):
    """``(result, densified)``: run ``op`` under the default policy, noting whether it densified."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = op(*args)
    return out, any(issubclass(w.category, sparsefill.DensifyWarning) for w in caught)


IN_PLACE_OPS = {
    "mul_": lambda t: t.mul_(2),
    "add_": lambda t: t.add_(1),
    "clamp_": lambda t: t.clamp_(max=2.0),
    "cumsum_": lambda t: t.cumsum_(1),
    "cummax_out": lambda t: torch.cummax(
        t, dim=0, out=(t, torch.empty(t.shape, dtype=torch.int64))
    )[0],
}


@pytest.mark.parametrize("layout", [COO, CSR])
@pytest.mark.parametrize("name", sorted(IN_PLACE_OPS))
def test_in_place_ops_keep_sparse_tensor(layout, name):
    op = IN_PLACE_OPS[name]
    x = torch.tensor([[1.0, 5.0, 2.0], [5.0, 5.0, 3.0]])
    expected = op(x.clone())
    A = sparsefill.to_sparse(x, fill_value=5.0, layout=layout)
    out, densified = _run_recording_densify(op, A)
    assert out is A
    assert isinstance(A, SparseTensor) and A.sparse_layout is layout and A.shape == x.shape
    assert_same(A.to_dense(), expected)
    if densified:  # through the densify fallback: A is re-specified against its own fill
        assert_same(A._fill_value(), torch.tensor(5.0))
    elif name == "mul_":  # a pointwise rule maps the fill too
        assert_same(A._fill_value(), torch.tensor(10.0))


def test_in_place_op_refused_leaves_tensor_unchanged():
    x = torch.tensor([[1.0, 5.0, 2.0], [5.0, 5.0, 3.0]])
    A = sparsefill.to_sparse(x, fill_value=5.0)
    with sparsefill.densify_policy("raise"):
        with pytest.raises(sparsefill.DensifyError):
            A.cumsum_(1)
    assert_same(A.to_dense(), x)
    assert A._nse() == 3


def _setitem_row(t):
    t[0] = 3.0


def _setitem_element(t):
    t[0, 1] = 9.0


def _setitem_index(t):
    t[torch.tensor([1])] = -1.0


def _fill_diagonal(t):
    t.fill_diagonal_(7.0)


def _select_fill(t):
    t[1].fill_(0.5)


@pytest.mark.parametrize("layout", [COO, CSR])
@pytest.mark.parametrize(
    "op", [_setitem_row, _setitem_element, _setitem_index, _fill_diagonal, _select_fill]
)
def test_in_place_writes_through_views_are_not_lost(layout, op, quiet):
    """An in-place write either takes effect (as on the dense tensor) or raises; it is never silently lost."""
    x = torch.tensor([[1.0, 5.0, 2.0], [5.0, 5.0, 3.0]])
    expected = x.clone()
    op(expected)
    A = sparsefill.to_sparse(x, fill_value=5.0, layout=layout)
    try:
        op(A)
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        assert_same(A.to_dense(), x)  # refused: unchanged
        return
    assert isinstance(A, SparseTensor)
    assert_same(A.to_dense(), expected)


# ---------------------------------------------------------------------- ops/core._item
@SETTINGS
@given(
    st.sampled_from([(), (1,), (1, 1), (1, 1, 1)]),
    st.booleans(),
    st.sampled_from([torch.float32, torch.float64, torch.int64, torch.bool, torch.complex64]),
    st.integers(0, 3),
    st.sampled_from(["zero", "value", "indefinite"]),
    st.booleans(),
    st.integers(0, 100),
)
def test_item_of_one_element(shape, hybrid, dtype, nse, kind, csr, seed):
    g = torch.Generator().manual_seed(seed)
    sdim = len(shape) - (1 if hybrid and shape else 0)
    vals = random_values(g, (nse,) + shape[sdim:], dtype, True)
    idx = torch.zeros((sdim, nse), dtype=torch.int64)
    fill = (
        sparsefill.indefinite
        if kind == "indefinite"
        else torch.tensor(
            scalars(dtype)[min(2, len(scalars(dtype)) - 1)] if kind == "value" else 0, dtype=dtype
        )
    )
    A = sparsefill.sparse_coo_tensor(idx, vals, shape, fill_value=fill)
    if csr and sdim == 2 and nse <= 1:
        A = A.to_sparse_csr()
    if kind == "indefinite" and nse == 0:
        with pytest.raises(ValueError, match="indefinite"):
            A.item()
        return
    x = (
        A.to_dense(fill_value=torch.zeros((), dtype=dtype))
        if kind == "indefinite"
        else A.to_dense()
    )
    a, b = A.item(), x.item()
    assert type(a) is type(b) and (a == b or a != a and b != b), (a, b)
    if not dtype.is_complex:
        assert type(float(A)) is float and (float(A) == float(x) or math.isnan(float(x)))
        assert bool(A) == bool(x)
        if not (dtype.is_floating_point and not math.isfinite(b)):
            assert int(A) == int(x)
    if A.dim() == 0:
        assert f"{A}" == f"{x}"
        if dtype.is_floating_point:
            assert f"{A:.2f}" == f"{x:.2f}"
    if A.dim():
        assert A[(0,) * A.dim()].item() == b or b != b


def test_item_of_many_elements_raises_as_dense():
    A = sparsefill.sparse_coo_tensor([[0]], [1.0], (2,))
    for f in (lambda t: t.item(), bool, float):
        (ks, es), (kd, ed) = outcome(lambda: f(A)), outcome(lambda: f(A.to_dense()))
        assert ks == kd == "raise" and es is ed


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


def test_format_zero_dim():
    """f-strings format a 0-d SparseTensor's item as torch.Tensor's (it raised TypeError); any other one as torch
    does (``""``: str, a format spec: TypeError)."""
    A = _W()
    D = A.to_dense()
    assert f"{A[0, 1]:.2f}" == "1.00" and f"{A[0, 0]:>8.3f}" == f"{D[0, 0]:>8.3f}" == "   0.100"
    assert f"{A[0, 0]}" == f"{D[0, 0]}" and f"{A.sum():.4g}" == f"{D.sum():.4g}"
    assert f"{A.requires_grad_()[0, 1]:.1f}" == "1.0"
    assert f"{A}" == str(A)
    for T in (A, D):
        with pytest.raises(TypeError, match="unsupported format string"):
            f"{T:.2f}"
    assert f"{sparsefill.sparse_coo_tensor([[0]], [3], (2,))[1]:03d}" == "000"
    B = sparsefill.sparse_coo_tensor([[0]], [1.5], (2,), fill_value=sparsefill.indefinite)
    assert f"{B[0]:.2f}" == "1.50"
    with pytest.raises(ValueError, match="indefinite"):
        f"{B[1]:.2f}"


def test_item_float_bool_of_one_element_without_densifying():
    """``item()``, ``float()``, ``bool()`` of a one-element SparseTensor: its stored value (duplicates summed) or its
    fill, no DensifyWarning; a specified element of an indefinite tensor its value, an unspecified one a ValueError;
    more elements: torch's error."""
    A = sparsefill.sparse_coo_tensor(
        [[0, 1, 0], [1, 0, 1]], [1.0, 2.0, 3.0], (2, 3), fill_value=5.0
    )
    D = A.to_dense()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i, j in [(0, 1), (1, 0), (1, 2)]:
            assert A[i, j].item() == D[i, j].item() and float(A[i, j]) == float(D[i, j])
            assert bool(A[i, j]) and int(A.to(torch.int64)[i, j]) == int(D.to(torch.int64)[i, j])
        H = sparsefill.sparse_coo_tensor(
            [[0]], torch.tensor([[7]]), (1, 1), fill_value=torch.tensor([2])
        )
        assert H.item() == 7 and (H * 0).sum().item() == 0
        assert (
            sparsefill.sparse_coo_tensor([[0, 0]], [True, False], (1,), fill_value=False).item()
            is True
        )
        M = sparsefill.sparse_coo_tensor(
            [[0], [1]], [1.5], (2, 3), fill_value=sparsefill.indefinite
        )
        assert M[0, 1].item() == 1.5
        with pytest.raises(ValueError, match="indefinite"):
            M[0, 0].item()
    with pytest.raises(RuntimeError, match="6 elements cannot be converted"):
        A.item()
