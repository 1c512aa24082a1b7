"""numpy: ``A.numpy()``, ``np.asarray(A)``, ``A.__array__``, ``A.tolist()`` are the dense array.

Invariant::

    A.numpy() == np.asarray(A) == A.to_dense().numpy()        A.tolist() == A.to_dense().tolist()

under the densify policy (a DensifyWarning; DensifyError past the byte limit or in mode "raise"),
with torch's rules for tensors that require grad (``numpy`` raises, ``tolist`` works).
"""

import warnings

import numpy as np
import pytest
import torch

import sparsefill
from sparsefill import DensifyError, DensifyWarning

NAN, INF = float("nan"), float("inf")


def _examples():
    """(name, SparseTensor) over layouts, dtypes, fills, hybrid, uncoalesced, empty, 0-d and 0-size."""
    coo = sparsefill.sparse_coo_tensor
    i2 = [[0, 1, 1], [2, 0, 3]]
    out = [
        ("coo_f32_fill", coo(i2, [1.0, 2.0, 3.0], (2, 4), fill_value=0.5)),
        ("coo_f64_nan", coo(i2, [1.0, NAN, 3.0], (2, 4), fill_value=NAN, dtype=torch.float64)),
        ("coo_inf", coo(i2, [1.0, -INF, 3.0], (2, 4), fill_value=INF)),
        ("coo_int", coo(i2, [1, 2, 3], (2, 4), fill_value=-7)),
        ("coo_int32", coo(i2, [1, 2, 3], (2, 4), fill_value=9, dtype=torch.int32)),
        ("coo_bool", coo(i2, [False, False, True], (2, 4), fill_value=True)),
        ("coo_complex", coo(i2, [1j, 2.0, 3 + 1j], (2, 4), fill_value=1 - 1j)),
        ("coo_uncoalesced", coo([[0, 0, 2], [1, 1, 0]], [1.0, 2.0, 3.0], (3, 2), fill_value=4.0)),
        (
            "coo_empty",
            coo(torch.zeros(2, 0, dtype=torch.long), torch.zeros(0), (3, 2), fill_value=6.0),
        ),
        ("coo_0d", coo(torch.zeros(0, 1, dtype=torch.long), [5.0], (), fill_value=1.0)),
        (
            "coo_0size",
            coo(torch.zeros(2, 0, dtype=torch.long), torch.zeros(0), (0, 3), fill_value=2.0),
        ),
        (
            "hybrid_array_fill",
            coo([[0, 2]], [[1.0, 2.0], [3.0, 4.0]], (3, 2), fill_value=[7.0, 8.0]),
        ),
        (
            "csr",
            sparsefill.sparse_csr_tensor(
                [0, 1, 3], [2, 0, 1], [1.0, 2.0, 3.0], (2, 3), fill_value=-1.0
            ),
        ),
        (
            "csr_batched",
            sparsefill.sparse_csr_tensor(
                [[0, 1, 1], [0, 0, 1]], [[1], [0]], [[1.0], [2.0]], (2, 2, 2), fill_value=3.0
            ),
        ),
    ]
    return out


EXAMPLES = _examples()
IDS = [n for n, _ in EXAMPLES]


def _expected(A):
    return A.to_dense().numpy()


def _same(a, b):
    assert isinstance(a, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, (
        type(a),
        a.dtype,
        b.dtype,
    )
    np.testing.assert_array_equal(a, b)  # NaN == NaN here


@pytest.mark.parametrize("A", [A for _, A in EXAMPLES], ids=IDS)
def test_numpy_asarray_tolist_are_the_dense_array(A):
    want = _expected(A)
    with pytest.warns(DensifyWarning, match="numpy"):
        _same(A.numpy(), want)
    with pytest.warns(DensifyWarning):
        _same(np.asarray(A), want)
    with pytest.warns(DensifyWarning):
        _same(np.array(A), want)
    with pytest.warns(DensifyWarning):
        _same(A.__array__(copy=True), want)
    with pytest.warns(DensifyWarning):
        _same(A.detach().cpu().numpy(), want)
    with pytest.warns(DensifyWarning, match="tolist"):
        got = A.tolist()
    assert type(got) is type(want.tolist())
    np.testing.assert_array_equal(np.array(got, dtype=want.dtype).reshape(want.shape), want)
    assert repr(got) == repr(A.to_dense().tolist())


@pytest.mark.parametrize("A", [A for _, A in EXAMPLES[:7]], ids=IDS[:7])
def test_asarray_with_dtype(A):
    want = _expected(A)
    with sparsefill.densify_policy("allow"):
        for dt in (
            (np.complex128, np.float64)
            if want.dtype.kind == "c"
            else (np.float64, np.int64, np.bool_)
        ):
            with warnings.catch_warnings():
                warnings.simplefilter(
                    "ignore", RuntimeWarning
                )  # (inf/NaN -> int, as numpy's own astype)
                _same(np.asarray(A, dtype=dt), want.astype(dt))
                _same(A.__array__(dt), want.astype(dt))


def test_result_is_a_new_array():
    A = sparsefill.sparse_coo_tensor([[1]], [2.0], (3,), fill_value=5.0)
    with sparsefill.densify_policy("allow"):
        a = A.numpy()
        a[:] = 0
        assert A.to_dense().tolist() == [5.0, 2.0, 5.0]
        with pytest.raises(ValueError, match="copy=False"):
            np.asarray(A, copy=False)


def test_densify_policy_applies():
    A = sparsefill.sparse_coo_tensor([[1]], [2.0], (1000,), fill_value=5.0)  # 4000 bytes dense
    calls = [A.numpy, lambda: np.asarray(A), A.tolist, lambda: A.numpy(force=True)]
    with sparsefill.densify_policy("raise"):
        for f in calls:
            with pytest.raises(DensifyError):
                f()
    with sparsefill.densify_policy("allow", limit_bytes=3999):
        for f in calls:
            with pytest.raises(DensifyError, match="4000 bytes"):
                f()
    with sparsefill.densify_policy("allow", limit_bytes=4000), warnings.catch_warnings():
        warnings.simplefilter("error")
        for f in calls:
            assert len(f()) == 1000


def test_huge_tensor_is_refused_before_allocating():
    A = sparsefill.sparse_coo_tensor(
        [[0, 10**9 - 1]], [1.0, 2.0], (10**9,), dtype=torch.float64, fill_value=7.0
    )
    for f in (A.numpy, lambda: np.asarray(A), A.tolist):
        with pytest.raises(DensifyError, match="8000000000 bytes"):
            f()


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_indefinite_fill_raises_as_to_dense(layout):
    A = sparsefill.sparse_coo_tensor(
        [[0, 1], [1, 0]], [1.0, 2.0], (2, 2), fill_value=sparsefill.indefinite
    )
    A = A.to_sparse(layout)
    with pytest.raises(ValueError, match="indefinite"):
        A.to_dense()
    for f in (A.numpy, lambda: np.asarray(A), A.tolist):
        with pytest.raises(ValueError, match="indefinite"):
            f()
    with sparsefill.densify_policy("allow"):
        np.testing.assert_array_equal(A.to_dense(fill_value=0.0).numpy(), [[0.0, 1.0], [2.0, 0.0]])


def test_requires_grad_as_torch():
    d = torch.tensor([[5.0, 1.0], [5.0, 5.0]], requires_grad=True)
    A = sparsefill.sparse_coo_tensor([[0], [1]], [1.0], (2, 2), fill_value=5.0).requires_grad_()
    for T in (d, A):  # the same errors and results for the dense tensor and the SparseTensor
        with pytest.raises(RuntimeError, match="requires grad"):
            T.numpy()
        with pytest.raises(RuntimeError, match="requires grad"):
            np.asarray(T)
        with sparsefill.densify_policy("allow"):
            assert T.tolist() == d.tolist()
            _same(T.numpy(force=True), d.detach().numpy())
            _same(T.detach().numpy(), d.detach().numpy())
    # a non-leaf result that requires grad, too
    B = A * 2
    assert B.requires_grad
    with pytest.raises(RuntimeError, match="requires grad"):
        B.numpy()
    with sparsefill.densify_policy("allow"):
        _same(B.detach().numpy(), (d * 2).detach().numpy())


def test_to_dense_of_a_view_catches_up_before_numpy():
    A = sparsefill.sparse_coo_tensor([[0, 1], [1, 0]], [1.0, 2.0], (2, 2), fill_value=5.0)
    row = A[0]
    A.mul_(2)
    with sparsefill.densify_policy("allow"):
        _same(row.numpy(), (A.to_dense()[0]).numpy())
