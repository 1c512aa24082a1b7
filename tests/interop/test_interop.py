"""Interop that keeps the fill: scipy.sparse, pydata ``sparse``, pandas.

Every round trip is compared with the peer's own object, exactly: the fill, the pattern (stored
indices, in order) and the stored values, and the dense array each stands for::

    from_X(x).to_dense() == torch.from_numpy(<x's dense array>)       to_X(A) stands for A.to_dense()

Large shapes run under ``densify_policy("raise")``: nothing may densify.
"""

import time
import warnings

import numpy as np
import pytest
import torch

import sparsefill
from sparsefill import DensifyError, DensifyWarning, SparseTensor

sp = pytest.importorskip("scipy.sparse")
sparse = pytest.importorskip("sparse")
pd = pytest.importorskip("pandas")

NAN = float("nan")
NP_DTYPES = [
    np.float64,
    np.float32,
    np.int64,
    np.int32,
    np.int16,
    np.int8,
    np.uint8,
    np.bool_,
    np.complex128,
    np.complex64,
    np.float16,
]
TORCH_OF = {
    np.float64: torch.float64,
    np.float32: torch.float32,
    np.int64: torch.int64,
    np.int32: torch.int32,
    np.int16: torch.int16,
    np.int8: torch.int8,
    np.uint8: torch.uint8,
    np.bool_: torch.bool,
    np.complex128: torch.complex128,
    np.complex64: torch.complex64,
    np.float16: torch.float16,
}


# ---------------------------------------------------------------------- helpers
def _values(rng, n, dtype):
    if dtype is np.bool_:
        return rng.random(n) < 0.5  # stored False elements too (explicit fill-valued elements)
    if np.dtype(dtype).kind == "c":
        return (rng.integers(-5, 5, n) + 1j * rng.integers(-5, 5, n)).astype(dtype)
    return rng.integers(-5, 6, n).astype(dtype)  # stored zeros included


def _fills(dtype):
    kind = np.dtype(dtype).kind
    return {"b": [False, True], "c": [0, 1 - 2j], "f": [0.0, 7.0, NAN]}.get(kind, [0, 7])


def _coords(rng, shape, nse):
    numel = int(np.prod(shape))
    if not shape:
        return np.zeros((0, min(nse, 1)), np.int64)
    keys = (
        np.sort(rng.choice(numel, min(nse, numel), replace=False))
        if numel
        else np.zeros(0, np.int64)
    )
    return np.stack(np.unravel_index(keys, shape)).reshape(len(shape), -1).astype(np.int64)


def _eq(a, b):
    """Exact equality of arrays/tensors (NaN == NaN), dtype included."""
    a = a.numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    b = b.numpy() if isinstance(b, torch.Tensor) else np.asarray(b)
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    np.testing.assert_array_equal(a, b, strict=True)


def _fill_eq(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a == b or (a != a and b != b), (a, b)


def _dense(A):
    return A.to_dense()


def _same_sparse(A, B):
    """Same layout, shape, fill, stored indices (in order) and values."""
    assert isinstance(A, SparseTensor) and isinstance(B, SparseTensor)
    assert A.sparse_layout == B.sparse_layout and A.shape == B.shape and A.dtype == B.dtype
    assert A.is_fill_indefinite() == B.is_fill_indefinite()
    if not A.is_fill_indefinite():
        _eq(A._fill_value(), B._fill_value())
    if A.sparse_layout is torch.sparse_coo:
        _eq(A._indices(), B._indices())
    else:
        _eq(A.crow_indices(), B.crow_indices())
        _eq(A.col_indices(), B.col_indices())
    _eq(A._values(), B._values())


# ---------------------------------------------------------------------- scipy
SCIPY_FORMATS = ["coo", "csr", "csc", "bsr", "dia", "lil", "dok"]


def _scipy(rng, dtype, shape=(6, 5), nse=9, cls="array", fmt="coo"):
    c = _coords(rng, shape, nse)
    m = getattr(sp, f"coo_{cls}")((_values(rng, c.shape[1], dtype), (c[0], c[1])), shape=shape)
    return m.asformat(fmt)


@pytest.mark.parametrize("cls", ["array", "matrix"])
@pytest.mark.parametrize("fmt", SCIPY_FORMATS)
@pytest.mark.parametrize("dtype", [d for d in NP_DTYPES if d is not np.float16])
def test_from_scipy_exact(dtype, fmt, cls):
    rng = np.random.default_rng(0)
    for nse in (0, 9):
        m = _scipy(rng, dtype, nse=nse, cls=cls, fmt=fmt)
        A = sparsefill.from_scipy(m)
        assert A.dtype == TORCH_OF[dtype] and A.shape == m.shape
        _eq(A.fill_value(), torch.zeros((), dtype=A.dtype))
        _eq(_dense(A), m.toarray())
        # the pattern: scipy's own csr (csr/csc/bsr) or coo (the others)
        if fmt in ("csr", "csc", "bsr"):
            ref = m.tocsr()
            assert A.sparse_layout is torch.sparse_csr
            _eq(A.crow_indices(), ref.indptr.astype(np.int64))
            _eq(A.col_indices(), ref.indices.astype(np.int64))
            _eq(A.values(), ref.data)
        else:
            ref = m.tocoo()
            assert A.sparse_layout is torch.sparse_coo
            _eq(A._indices(), np.stack(ref.coords).astype(np.int64))
            _eq(A._values(), ref.data)
        # and back: to_scipy in the same format gives scipy's own object
        back = sparsefill.to_scipy(A, fmt)
        assert back.format == fmt and back.dtype == m.dtype and back.shape == m.shape
        _eq(back.toarray(), m.toarray())
        if fmt in ("coo", "csr"):
            _eq(
                np.stack(back.tocoo().coords).astype(np.int64),
                np.stack(m.tocoo().coords).astype(np.int64),
            )
            _eq(back.data, m.data)


def test_from_scipy_keeps_duplicates_and_explicit_zeros():
    m = sp.coo_array(
        (np.array([1.0, 2.0, 0.0]), (np.array([0, 0, 1]), np.array([1, 1, 2]))), shape=(2, 3)
    )
    A = sparsefill.from_scipy(m)
    assert not A.is_coalesced() and A._nse() == 3
    _eq(A._indices(), np.stack(m.coords).astype(np.int64))
    _eq(_dense(A), m.toarray())
    back = sparsefill.to_scipy(A, "coo")
    _eq(back.coords[0].astype(np.int64), m.coords[0].astype(np.int64))
    _eq(back.data, m.data)
    # a non-canonical csr (unsorted columns, a duplicate) is summed and sorted by scipy
    c = sp.csr_array(
        (np.array([1.0, 2.0, 3.0]), np.array([2, 0, 2]), np.array([0, 3, 3])), shape=(2, 3)
    )
    assert not c.has_canonical_format
    C = sparsefill.from_scipy(c)
    _eq(_dense(C), c.toarray())
    _eq(C.col_indices(), [0, 2])
    _eq(C.values(), [2.0, 4.0])
    assert c.has_canonical_format is False  # the input is not modified


def test_from_scipy_fill_value_reinterprets_the_unspecified_elements():
    m = sp.csr_array(np.array([[0.0, 2.0], [3.0, 0.0]]))
    m2 = sp.csr_array(
        (np.array([0.0, 2.0]), np.array([0, 1]), np.array([0, 2, 2])), shape=(2, 2)
    )  # explicit 0
    for mat, want in ((m, [[5.0, 2.0], [3.0, 5.0]]), (m2, [[0.0, 2.0], [5.0, 5.0]])):
        A = sparsefill.from_scipy(mat, fill_value=5.0)
        _eq(_dense(A), np.array(want))
        _eq(A.fill_value(), torch.tensor(5.0, dtype=torch.float64))
        _eq(A.col_indices(), mat.indices.astype(np.int64))
    M = sparsefill.from_scipy(m, fill_value=sparsefill.indefinite)
    assert M.is_fill_indefinite()
    _eq(M.to_dense(fill_value=-1.0), np.array([[-1.0, 2.0], [3.0, -1.0]]))
    with pytest.raises(TypeError, match="cannot be represented"):
        sparsefill.from_scipy(sp.csr_array(np.array([[0, 1]])), fill_value=0.5)


def test_to_sparse_of_every_scipy_format():
    """to_sparse(scipy matrix) once raised "sparse array length is ambiguous"."""
    m = sp.random(30, 20, density=0.1, format="csr", random_state=1)
    for obj in (m, sp.csr_matrix(m), sp.coo_matrix(m), m.tocsc()):
        with sparsefill.densify_policy("raise"):
            A = sparsefill.to_sparse(obj)
        assert A.sparse_layout is torch.sparse_coo
        _eq(_dense(A), obj.toarray())
        _same_sparse(A, sparsefill.from_scipy(obj).to_sparse(torch.sparse_coo))
        _same_sparse(
            sparsefill.to_sparse(obj, layout=torch.sparse_csr), sparsefill.from_scipy(obj.tocsr())
        )


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_to_scipy_of_sparsefill_tensors(layout):
    A = sparsefill.sparse_coo_tensor(
        [[0, 1, 1, 3], [2, 0, 3, 3]], [1.0, 0.0, 3.0, 4.0], (4, 5)
    ).to_sparse(layout)
    m = A.to_scipy()
    assert m.format == ("coo" if layout is torch.sparse_coo else "csr") and isinstance(
        m, sp.sparray
    )
    _eq(m.toarray(), A.to_dense())
    assert m.nnz == 4  # the stored zero stays stored
    _same_sparse(sparsefill.from_scipy(m), A)
    for fmt in SCIPY_FORMATS:
        _eq(sparsefill.to_scipy(A, fmt).toarray(), A.to_dense())
    # uncoalesced COO: the duplicates go to scipy as they are
    U = sparsefill.sparse_coo_tensor([[0, 0], [1, 1]], [1.0, 2.0], (2, 2))
    assert not U.is_coalesced()
    _eq(sparsefill.to_scipy(U).data, np.array([1.0, 2.0], np.float32))
    _eq(sparsefill.to_scipy(U, "csr").toarray(), U.to_dense())
    # a hybrid 2-D tensor (1 sparse + 1 dense dim): its slices become scalar elements
    H = sparsefill.sparse_coo_tensor([[0, 2]], [[1.0, 0.0], [3.0, 4.0]], (3, 2))
    h = sparsefill.to_scipy(H)
    _eq(h.toarray(), H.to_dense())
    assert h.nnz == 4


def test_to_scipy_refusals():
    A = sparsefill.sparse_coo_tensor([[0], [1]], [1.0], (2, 2), fill_value=7.0)
    with pytest.raises(ValueError, match="no fill value.*7.0"):
        sparsefill.to_scipy(A)
    with (
        sparsefill.densify_policy("raise"),
        pytest.raises(ValueError),
    ):  # refused before anything densifies
        A.to_scipy()
    m = sparsefill.to_scipy(A, materialize=True)  # every element that is not 0 specified
    _eq(m.toarray(), A.to_dense())
    assert m.nnz == 4
    I = sparsefill.sparse_coo_tensor([[0], [1]], [1.0], (2, 2), fill_value=sparsefill.indefinite)
    for kw in ({}, {"materialize": True}):
        with pytest.raises(ValueError, match="indefinite"):
            sparsefill.to_scipy(I, **kw)
    for shape in ((3,), (2, 2, 2)):
        T = sparsefill.zeros(*shape)
        with pytest.raises(ValueError, match="2-D"):
            sparsefill.to_scipy(T)
    with pytest.raises(ValueError, match="format"):
        sparsefill.to_scipy(sparsefill.zeros(2, 2), "csx")
    with pytest.raises(TypeError, match="bfloat16"):
        sparsefill.to_scipy(sparsefill.zeros(2, 2, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="requires grad"):
        sparsefill.to_scipy(sparsefill.zeros(2, 2).requires_grad_())
    with pytest.raises(TypeError, match="SparseTensor"):
        sparsefill.to_scipy(torch.zeros(2, 2))


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.uint64, np.longdouble])
def test_unsupported_numpy_dtypes_raise(dtype):
    m = sp.coo_array((np.ones(2, dtype=dtype), (np.array([0, 1]), np.array([1, 0]))), shape=(2, 2))
    name = np.dtype(dtype).name
    for f in (sparsefill.from_scipy, sparsefill.to_sparse):
        with pytest.raises(TypeError, match=name):
            f(m)
    with pytest.raises(TypeError, match=name):
        sparsefill.from_pydata(sparse.COO.from_scipy_sparse(m))
    with pytest.raises(TypeError, match=name):
        sparsefill.to_sparse(np.ones(3, dtype=dtype))


# ---------------------------------------------------------------------- pydata sparse
SHAPES = [(7,), (4, 5), (3, 4, 2), (2, 3, 2, 3), ()]


def _pydata(rng, dtype, shape, nse, fill):
    c = _coords(rng, shape, nse)
    return sparse.COO(
        c,
        _values(rng, c.shape[1], dtype),
        shape=shape,
        fill_value=np.asarray(fill).astype(dtype)[()],
        has_duplicates=False,
        sorted=True,
    )


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", NP_DTYPES)
def test_pydata_round_trip_exact(dtype, shape):
    rng = np.random.default_rng(1)
    for fill in _fills(dtype):
        for nse in (0, 6):
            x = _pydata(rng, dtype, shape, nse, fill)
            A = sparsefill.from_pydata(x)
            assert (
                A.dtype == TORCH_OF[dtype]
                and A.shape == x.shape
                and A.sparse_layout is torch.sparse_coo
            )
            _fill_eq(A.fill_value().numpy(), x.fill_value)
            _eq(A._indices(), x.coords.astype(np.int64))
            _eq(A._values(), x.data)
            _eq(_dense(A), x.todense())
            y = sparsefill.to_pydata(A)
            assert isinstance(y, sparse.COO) and y.shape == x.shape and y.dtype == x.dtype
            _fill_eq(y.fill_value, x.fill_value)
            assert np.asarray(y.fill_value).dtype == x.dtype
            _eq(y.coords.astype(np.int64), x.coords.astype(np.int64))
            _eq(y.data, x.data)
            _same_sparse(sparsefill.to_sparse(x), A)


@pytest.mark.parametrize("compressed_axes", [(0,), (1,), None])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64, np.bool_])
def test_pydata_gcxs(dtype, compressed_axes):
    rng = np.random.default_rng(2)
    for fill in _fills(dtype):
        for nse in (0, 8):
            x = sparse.GCXS(_pydata(rng, dtype, (5, 6), nse, fill), compressed_axes=compressed_axes)
            A = sparsefill.from_pydata(x)
            _fill_eq(A.fill_value().numpy(), x.fill_value)
            _eq(_dense(A), x.todense())
            if tuple(x.compressed_axes) == (0,):
                assert A.sparse_layout is torch.sparse_csr
                _eq(A.crow_indices(), x.indptr.astype(np.int64))
                _eq(A.col_indices(), x.indices.astype(np.int64))
                _eq(A.values(), x.data)
            y = sparsefill.to_pydata(A, "gcxs")
            assert isinstance(y, sparse.GCXS)
            _fill_eq(y.fill_value, x.fill_value)
            _eq(y.todense(), x.todense())
            ref = x.tocoo()
            _eq(y.tocoo().coords, ref.coords)
            _eq(y.tocoo().data, ref.data)
    # 3-D GCXS and the default format of a CSR tensor
    x3 = sparse.GCXS(_pydata(rng, dtype, (3, 4, 2), 7, 7 if dtype is not np.bool_ else True))
    _eq(_dense(sparsefill.from_pydata(x3)), x3.todense())
    C = sparsefill.sparse_csr_tensor([0, 1, 2], [1, 0], [1.0, 2.0], (2, 2), fill_value=3.0)
    g = C.to_pydata()
    assert isinstance(g, sparse.GCXS) and g.fill_value == 3.0
    _eq(g.indptr.astype(np.int64), C.crow_indices())
    _same_sparse(sparsefill.from_pydata(g), C)


def test_to_sparse_of_a_pydata_coo_keeps_its_fill_7():
    """to_sparse(pydata COO with fill 7) once densified and dropped the fill."""
    x = sparse.COO(np.array([[0, 3, 5]]), np.array([1.0, 2.0, 3.0]), shape=(8,), fill_value=7.0)
    with sparsefill.densify_policy("raise"):
        A = sparsefill.to_sparse(x)
    assert A._nse() == 3
    _eq(A.fill_value(), torch.tensor(7.0, dtype=torch.float64))
    _eq(_dense(A), x.todense())


def test_pydata_1e9_elements_1k_stored_round_trip_without_densifying():
    n = 10**9
    rng = np.random.default_rng(3)
    x = sparse.COO(
        np.sort(rng.choice(n, 1000, replace=False))[None],
        rng.standard_normal(1000),
        shape=(n,),
        fill_value=7.0,
        has_duplicates=False,
        sorted=True,
    )
    x2 = sparse.COO(
        _coords(rng, (40000, 25000), 1000),
        rng.standard_normal(1000),
        shape=(40000, 25000),
        fill_value=-1.0,
        has_duplicates=False,
        sorted=True,
    )
    with sparsefill.densify_policy("raise"), warnings.catch_warnings():
        warnings.simplefilter("error")
        for obj in (x, x2, sparse.GCXS(x2)):
            t0 = time.perf_counter()
            A = sparsefill.to_sparse(obj)
            y = sparsefill.to_pydata(A, obj.format)
            elapsed = time.perf_counter() - t0  # reported, not asserted (about a millisecond)
            assert A.numel() == obj.size and A._nse() == 1000 and elapsed >= 0
            _fill_eq(A.fill_value().numpy(), obj.fill_value)
            assert type(y) is type(obj) and y.shape == obj.shape
            _fill_eq(y.fill_value, obj.fill_value)
            ref, got = obj.asformat("coo"), y.asformat("coo")
            _eq(got.coords, ref.coords)
            _eq(got.data, ref.data)
            _same_sparse(sparsefill.from_pydata(obj), sparsefill.from_pydata(y))


def test_pydata_refusals():
    obj = sparse.COO(np.array([[0]]), np.array(["a"], dtype=object), shape=(2,), fill_value="")
    with pytest.raises(TypeError, match="object"):
        sparsefill.from_pydata(obj)
    with pytest.raises(TypeError, match="object"):
        sparsefill.to_sparse(obj)
    with pytest.raises(ValueError, match="indefinite"):
        sparsefill.to_pydata(
            sparsefill.sparse_coo_tensor([[0]], [1.0], (2,), fill_value=sparsefill.indefinite)
        )
    H = sparsefill.sparse_coo_tensor([[0]], [[1.0, 2.0]], (3, 2), fill_value=[0.0, 1.0])
    with pytest.raises(ValueError, match="one scalar fill"):
        sparsefill.to_pydata(H)
    with pytest.raises(ValueError, match="format"):
        sparsefill.to_pydata(sparsefill.zeros(2), "dok")
    with pytest.raises(TypeError, match="pydata"):
        sparsefill.from_pydata(np.zeros(3))


def test_pydata_many_dims():
    """pydata's limits (2**63 - 1 positions, fewer than 64 dims) are within sparsefill's: a 40-d array."""
    rng = np.random.default_rng(6)
    x = _pydata(rng, np.float64, (2,) * 40, 50, 7.0)
    with sparsefill.densify_policy("raise"):
        A = sparsefill.from_pydata(x)
        y = sparsefill.to_pydata(A)
    assert A.shape == x.shape and A.fill_value().item() == 7.0
    _eq(A._indices(), x.coords)
    _eq(y.coords, x.coords)
    _eq(y.data, x.data)


def test_pydata_hybrid_uniform_fill_and_uncoalesced():
    H = sparsefill.sparse_coo_tensor(
        [[2, 0]], [[1.0, 2.0], [3.0, 4.0]], (3, 2), fill_value=[5.0, 5.0]
    )
    y = sparsefill.to_pydata(H)
    assert y.fill_value == 5.0 and y.nnz == 4
    _eq(y.todense(), H.to_dense())
    U = sparsefill.sparse_coo_tensor([[1, 1, 0]], [1, 2, 3], (4,), fill_value=-1)
    y = sparsefill.to_pydata(U)
    _eq(y.coords, np.array([[0, 1]]))
    _eq(y.data, np.array([3, 3]))
    _eq(y.todense(), U.to_dense())


def test_to_sparse_with_the_peers_own_fill_prunes_and_another_respecifies():
    x = sparse.COO(np.array([[0, 3, 5]]), np.array([7.0, 2.0, 3.0]), shape=(10**9,), fill_value=7.0)
    with sparsefill.densify_policy("raise"):
        A = sparsefill.to_sparse(x, fill_value=7.0)  # the stored 7 is dropped, nothing densifies
    _eq(A._indices(), np.array([[3, 5]]))
    small = sparse.COO(np.array([[0, 3]]), np.array([7.0, 2.0]), shape=(5,), fill_value=7.0)
    with sparsefill.densify_policy("allow"):
        B = sparsefill.to_sparse(small, fill_value=0.0)
    _eq(B.to_dense(), small.todense())
    _eq(B.fill_value(), torch.tensor(0.0, dtype=torch.float64))
    with pytest.raises(DensifyError):  # 8 GB: past the byte limit
        sparsefill.to_sparse(x, fill_value=0.0)


# ---------------------------------------------------------------------- pandas
@pytest.mark.parametrize("kind", ["integer", "block"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64, np.int32, np.bool_])
def test_pandas_sparse_array_round_trip(dtype, kind):
    rng = np.random.default_rng(4)
    for fill in _fills(dtype):
        if np.dtype(dtype).kind == "f" and fill != fill:
            data = np.where(rng.random(9) < 0.5, np.nan, _values(rng, 9, dtype)).astype(dtype)
        else:
            data = np.where(
                rng.random(9) < 0.5, np.asarray(fill).astype(dtype), _values(rng, 9, dtype)
            )
        for d in (data, data[:0]):
            a = pd.arrays.SparseArray(d, fill_value=np.asarray(fill).astype(dtype)[()], kind=kind)
            A = sparsefill.from_pandas(a)
            assert A.dtype == TORCH_OF[dtype] and A.shape == (len(a),)
            _fill_eq(A.fill_value().numpy(), a.fill_value)
            _eq(A._indices()[0], a.sp_index.to_int_index().indices.astype(np.int64))
            _eq(A._values(), a.sp_values)
            _eq(_dense(A), a.to_numpy())
            b = sparsefill.to_pandas(A)
            assert isinstance(b, pd.arrays.SparseArray) and b.dtype.subtype == a.dtype.subtype
            _fill_eq(b.fill_value, a.fill_value)
            _eq(b.sp_index.to_int_index().indices, a.sp_index.to_int_index().indices)
            _eq(b.sp_values, a.sp_values)
            for obj in (a, pd.Series(a)):
                _same_sparse(sparsefill.to_sparse(obj), A)
                _same_sparse(sparsefill.from_pandas(obj), A)


def test_to_sparse_of_a_pandas_sparse_array_keeps_its_fill_5():
    """to_sparse(SparseArray with fill 5) once densified and dropped the fill."""
    a = pd.arrays.SparseArray([5, 0, 5, 5, 1], fill_value=5)
    with sparsefill.densify_policy("raise"):
        A = sparsefill.to_sparse(a)
    assert A._nse() == 2
    _eq(A.fill_value(), torch.tensor(5))
    _eq(_dense(A), np.array([5, 0, 5, 5, 1]))


def test_pandas_dataframe_round_trip():
    rng = np.random.default_rng(5)
    for fill in (0.0, 7.0, NAN):
        cols = {}
        for j in range(4):
            d = np.where(rng.random(6) < 0.5, fill, rng.integers(-3, 3, 6).astype(float))
            cols[f"c{j}"] = pd.arrays.SparseArray(d, fill_value=fill)
        df = pd.DataFrame(cols, index=list("abcdef"))
        A = sparsefill.from_pandas(df)
        assert A.shape == (6, 4) and A.is_coalesced()
        _fill_eq(A.fill_value().numpy(), np.float64(fill))
        _eq(_dense(A), df.to_numpy())
        stored = {
            (int(df.columns.get_loc(c)), int(i))
            for c in df
            for i in df[c].array.sp_index.to_int_index().indices
        }
        assert {(c, r) for r, c in A._indices().T.tolist()} == stored
        back = sparsefill.to_pandas(A)
        assert (
            isinstance(back, pd.DataFrame)
            and back.shape == df.shape
            and list(back.columns) == list(df.columns)
        )
        assert list(back.index) == list(df.index)
        for c in df:
            a, b = df[c].array, back[c].array
            assert b.dtype == a.dtype
            _fill_eq(b.fill_value, a.fill_value)
            _eq(b.sp_index.to_int_index().indices, a.sp_index.to_int_index().indices)
            _eq(b.sp_values, a.sp_values)
        _same_sparse(sparsefill.to_sparse(df), A)
    # CSR and hybrid tensors to a DataFrame; a 0-row frame
    C = sparsefill.sparse_csr_tensor([0, 1, 3], [2, 0, 1], [1.0, 2.0, 3.0], (2, 3), fill_value=-1.0)
    _eq(sparsefill.to_pandas(C).to_numpy(), C.to_dense().numpy())
    H = sparsefill.sparse_coo_tensor([[1]], [[1, 2]], (3, 2), fill_value=9)
    _eq(sparsefill.to_pandas(H).to_numpy(), H.to_dense().numpy())
    E = sparsefill.full((0, 2), 3.0)
    _same_sparse(sparsefill.from_pandas(sparsefill.to_pandas(E)), E.to(torch.float32))


def test_pandas_refusals():
    a = pd.arrays.SparseArray([0.0, 1.0], fill_value=0.0)
    b = pd.arrays.SparseArray([0.0, 1.0], fill_value=1.0)
    with pytest.raises(ValueError, match="fill"):
        sparsefill.from_pandas(pd.DataFrame({"a": a, "b": b}))
    with pytest.raises(TypeError, match="dtypes"):
        sparsefill.from_pandas(
            pd.DataFrame({"a": a, "b": pd.arrays.SparseArray([0, 1], fill_value=0)})
        )
    with pytest.raises(TypeError, match="not sparse"):
        sparsefill.from_pandas(pd.DataFrame({"a": a, "b": [0.0, 1.0]}))
    with pytest.raises(TypeError, match="not sparse"):
        sparsefill.to_sparse(pd.DataFrame({"a": a, "b": [0.0, 1.0]}))
    with pytest.raises(ValueError, match="no columns"):
        sparsefill.from_pandas(pd.DataFrame())
    with pytest.raises(TypeError, match="Series"):
        sparsefill.from_pandas(pd.Series([1.0, 2.0]))
    for obj in (
        pd.arrays.SparseArray(["x", None, "y"]),
        pd.arrays.SparseArray(pd.to_datetime(["2020", "2021"])),
    ):
        with pytest.raises(TypeError, match="dtype"):
            sparsefill.from_pandas(obj)
        with pytest.raises(TypeError, match="dtype"):
            sparsefill.to_sparse(obj)
    with pytest.raises(ValueError, match="1-D"):
        sparsefill.to_pandas(sparsefill.zeros(2, 2, 2))
    with pytest.raises(ValueError, match="indefinite"):
        sparsefill.to_pandas(
            sparsefill.sparse_coo_tensor([[0]], [1.0], (2,), fill_value=sparsefill.indefinite)
        )
    with pytest.raises(ValueError, match="int32"):
        sparsefill.to_pandas(sparsefill.sparse_coo_tensor([[2**31]], [1.0], (2**32,)))
    # an int column with a NaN fill cannot be an int tensor
    with pytest.raises(ValueError, match="exactly"):
        sparsefill.from_pandas(
            pd.arrays.SparseArray(np.array([1, 0]), dtype=pd.SparseDtype(np.int64, NAN))
        )


def test_dense_pandas_and_numpy_objects_convert_as_before():
    s = pd.Series([0.0, 3.0, 0.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        A = sparsefill.to_sparse(s)
    _eq(A._indices(), np.array([[1]]))
    _eq(sparsefill.to_sparse(np.array([[0, 1]])).to_dense(), np.array([[0, 1]]))
    big_endian = np.array([0.0, 2.5], dtype=">f8")
    _eq(sparsefill.to_sparse(big_endian).to_dense(), np.array([0.0, 2.5]))
    x = sparse.COO(np.array([[0, 1]]), big_endian, shape=(3,), fill_value=np.array(1.0, ">f8")[()])
    _eq(sparsefill.from_pydata(x).to_dense(), np.array([0.0, 2.5, 1.0]))


# ---------------------------------------------------------------------- other objects that densify
class _LazySparse:
    """A sparse array of another library: only ``toarray()`` gives its values."""

    def __init__(self, shape, dtype=np.float64):
        self.shape, self.dtype, self.calls = shape, np.dtype(dtype), 0

    def toarray(self):
        self.calls += 1
        out = np.zeros(self.shape, self.dtype)
        out.flat[1] = 2
        return out


def test_other_densifying_objects_go_through_the_densify_policy():
    x = _LazySparse((4, 5))
    with pytest.warns(DensifyWarning, match="_LazySparse"):
        A = sparsefill.to_sparse(x)
    _eq(A.to_dense(), x.toarray())
    with sparsefill.densify_policy("raise"), pytest.raises(DensifyError):
        sparsefill.to_sparse(x)
    big = _LazySparse((10**5, 10**5))  # 80 GB
    with pytest.raises(DensifyError, match="80000000000 bytes"):
        sparsefill.to_sparse(big)
    assert big.calls == 0  # refused before allocating


def test_peer_modules_are_imported_lazily():
    import subprocess
    import sys

    code = (
        "import sys, sparsefill, torch; sparsefill.to_sparse([0., 1.]); "
        "print([m for m in ('scipy', 'sparse', 'pandas') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_from_scipy_shares_memory_where_dtypes_allow():
    """A canonical csr's values (and int64 index arrays) are shared, as torch.from_numpy shares them; int32
    index arrays are copied to int64."""
    sp = pytest.importorskip("scipy.sparse")
    m = sp.csr_array(np.array([[0.0, 2.0, 0.0], [3.0, 0.0, 4.0]]))
    m.indices, m.indptr = m.indices.astype(np.int64), m.indptr.astype(np.int64)
    A = sparsefill.from_scipy(m)
    assert A.values().data_ptr() == m.data.ctypes.data
    assert A.col_indices().data_ptr() == m.indices.ctypes.data
    m.data[0] = 7.0  # (shared: the write shows, as in torch.from_numpy)
    assert A.to_dense()[0, 1] == 7.0
    m32 = sp.csr_array(np.array([[0.0, 2.0], [3.0, 0.0]], dtype=np.float32))
    m32.indices = m32.indices.astype(np.int32)
    B = sparsefill.from_scipy(m32)
    assert B.col_indices().dtype == torch.int64 and B.values().data_ptr() == m32.data.ctypes.data
    torch.testing.assert_close(B.to_dense(), torch.from_numpy(m32.toarray()))


def test_from_scipy_rejects_unordered_columns():
    sp = pytest.importorskip("scipy.sparse")
    m = sp.csr_array((np.array([1.0, 2.0]), np.array([2, 0]), np.array([0, 2, 2])), shape=(2, 3))
    m.has_canonical_format = True  # (scipy told a lie: the columns of row 0 descend)
    with pytest.raises(
        ValueError, match=r"increasing within each row: stored element 1 \(position \(0, 0\)\)"
    ):
        sparsefill.from_scipy(m)


def test_to_pandas_round_trips_frame_labels():
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame(
        {
            "a": pd.arrays.SparseArray([0.0, 1.0, 0.0], fill_value=0.0),
            ("b", 2): pd.arrays.SparseArray([2.0, 0.0, 0.0], fill_value=0.0),
        },
        index=["x", "y", "z"],
    )
    A = sparsefill.from_pandas(df)
    pd.testing.assert_frame_equal(sparsefill.to_pandas(A), df)
    out = sparsefill.to_pandas(A, index=[7, 8, 9], columns=["p", "q"])
    assert out.index.tolist() == [7, 8, 9] and out.columns.tolist() == ["p", "q"]
    assert sparsefill.to_pandas(A * 2).columns.tolist() == [0, 1]  # (a new tensor: no labels kept)
    with pytest.raises(ValueError, match="3 row and 1 column labels"):
        sparsefill.to_pandas(A, columns=["p"])
