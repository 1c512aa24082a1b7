"""Order statistics of a SparseTensor against the dense op (``sparsefill/ops/order/sort.py``,
``quantiles.py``, ``sorting_autograd.py``)::

    op(A, ...) == op(A.to_dense(), ...)         values, and indices in stable order

sort, argsort, msort, topk, kthvalue, mode, aminmax, quantile, nanquantile along every dim (and
over all), on COO, CSR, hybrid (array fill), uncoalesced, NaN/inf fills, integer and bool dtypes,
with no DensifyWarning; gradients of values and fill against dense; an indefinite fill's masked
meaning.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import sparsefill
from sparsefill import DensifyError, SparseTensor

NAN, INF = float("nan"), float("inf")
CASES = [  # (shape, dense_dim, layout)
    ((4, 7), 0, "coo"),
    ((4, 7), 0, "csr"),
    ((3, 5, 6), 0, "coo"),
    ((5, 6, 3), 1, "coo"),
    ((4, 20), 0, "uncoalesced"),
    ((9,), 0, "coo"),
]
IDS = [f"{c[2]}-{'x'.join(map(str, c[0]))}" for c in CASES]


def make(shape, fill, dense_dim=0, layout="coo", dtype=torch.float64, p=0.35, seed=0):
    """``(A, x)``: a SparseTensor and its dense tensor, ~``p`` of the sparse positions stored;
    integer-valued floats (many ties) unless ``dtype`` is floating and ``fill`` is NaN/inf."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, shape, generator=g).to(dtype)
    S = shape[: len(shape) - dense_dim]
    m = (torch.rand(S, generator=g) < p).reshape(S + (1,) * dense_dim).expand(shape)
    f = (
        torch.full(shape[len(S) :], fill, dtype=dtype)
        if dense_dim
        else torch.tensor(fill, dtype=dtype)
    )
    x = torch.where(m, x, f)
    lay = torch.sparse_csr if layout == "csr" else torch.sparse_coo
    A = sparsefill.to_sparse(x, fill_value=f, layout=lay, dense_dim=dense_dim)
    if layout == "uncoalesced":  # every stored element split in two halves, shuffled
        idx, v = A.indices(), A.values()
        perm = torch.randperm(2 * v.shape[0], generator=g)
        A = sparsefill.sparse_coo_tensor(
            torch.cat([idx, idx], 1)[:, perm], torch.cat([v / 2, v / 2])[perm], shape, fill_value=f
        )
    return A, x


def dense(t):
    if isinstance(t, tuple):
        return tuple(dense(u) for u in t)
    return t.to_dense() if isinstance(t, SparseTensor) else t


@pytest.fixture(autouse=True)
def _no_densify():
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        yield


def stable_sort(x, dim, descending=False):
    return torch.sort(x, dim=dim, descending=descending, stable=True)


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("fill", [0.0, 1.0, NAN, -INF])
def test_sort_values_and_stable_indices(case, fill):
    shape, dd, layout = case
    A, x = make(shape, fill, dd, layout)
    for dim in range(-len(shape), len(shape)):
        for desc in (False, True):
            got = dense(tuple(torch.sort(A, dim=dim, descending=desc, stable=True)))
            ref = stable_sort(x, dim, desc)
            torch.testing.assert_close(got[0], ref.values, equal_nan=True)
            assert torch.equal(got[1], ref.indices), (dim, desc)
            assert torch.equal(dense(torch.sort(A, dim, desc).indices), ref.indices)
            assert torch.equal(dense(torch.argsort(A, dim, desc)), ref.indices)
    torch.testing.assert_close(dense(torch.msort(A)), torch.msort(x), equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.float32])
def test_sort_of_other_dtypes(dtype):
    A, x = make((5, 9), 1, 0, "coo", dtype=dtype)
    for dim in (0, 1):
        got, ref = torch.sort(A, dim=dim, stable=True), stable_sort(x, dim)
        assert torch.equal(got.values, ref.values) and torch.equal(got.indices, ref.indices)
        got, ref = torch.topk(A.to(torch.float32), 3, dim), stable_sort(x.float(), dim, True)
        assert torch.equal(got.indices, ref.indices[:, :3] if dim else ref.indices[:3])


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("fill", [0.0, 2.0, NAN])
def test_topk_and_kthvalue_are_ranks_of_the_stable_sort(case, fill):
    shape, dd, layout = case
    A, x = make(shape, fill, dd, layout)
    for dim in range(len(shape)):
        size = shape[dim]
        for k in sorted({1, 2, size}):
            for largest in (True, False):
                got = dense(tuple(torch.topk(A, k, dim, largest)))
                ref = stable_sort(x, dim, largest)
                torch.testing.assert_close(got[0], ref.values.narrow(dim, 0, k), equal_nan=True)
                assert torch.equal(got[1], ref.indices.narrow(dim, 0, k))
            for keep in (False, True):
                got = dense(tuple(torch.kthvalue(A, k, dim, keep)))
                ref = stable_sort(x, dim)
                rv, ri = ref.values.narrow(dim, k - 1, 1), ref.indices.narrow(dim, k - 1, 1)
                if not keep:
                    rv, ri = rv.squeeze(dim), ri.squeeze(dim)
                torch.testing.assert_close(got[0], rv, equal_nan=True)
                assert torch.equal(got[1], ri)


def _mode_reference(x, dim):
    """torch.mode's rule at any length: the most frequent value (NaN one value), ties to the
    smallest (NaN the largest), the last occurrence (a NaN mode: the first)."""
    xm = x.movedim(dim, -1)
    flat = xm.reshape(-1, xm.shape[-1])
    vals, idxs = [], []
    for row in flat:
        key = [("nan" if v != v else v) for v in row.tolist()]
        counts = {k: key.count(k) for k in key}
        best = max(counts.values())
        cands = [k for k, c in counts.items() if c == best]
        num = [k for k in cands if k != "nan"]
        pick = min(num) if num else "nan"
        where = [i for i, k in enumerate(key) if k == pick]
        vals.append(NAN if pick == "nan" else pick)
        idxs.append(where[0] if pick == "nan" else where[-1])
    shape = xm.shape[:-1]
    return torch.tensor(vals, dtype=x.dtype).reshape(shape), torch.tensor(idxs).reshape(shape)


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("fill", [0.0, 3.0, NAN])
def test_mode(case, fill):
    shape, dd, layout = case
    A, x = make(shape, fill, dd, layout)
    for dim in range(len(shape)):
        got = dense(tuple(torch.mode(A, dim)))
        rv, ri = _mode_reference(x, dim)
        torch.testing.assert_close(got[0], rv, equal_nan=True)
        assert torch.equal(got[1], ri)
        if shape[dim] <= 16 and not x.isnan().any():  # (torch's own rule on short slices)
            ref = torch.mode(x, dim, keepdim=True)
            got = dense(tuple(torch.mode(A, dim, keepdim=True)))
            assert torch.equal(got[0], ref.values) and torch.equal(got[1], ref.indices)


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("fill", [0.0, NAN, INF])
def test_aminmax(case, fill):
    shape, dd, layout = case
    A, x = make(shape, fill, dd, layout)
    torch.testing.assert_close(tuple(torch.aminmax(A)), tuple(torch.aminmax(x)), equal_nan=True)
    for dim in range(len(shape)):
        for keep in (False, True):
            got = dense(tuple(torch.aminmax(A, dim=dim, keepdim=keep)))
            ref = tuple(torch.aminmax(x, dim=dim, keepdim=keep))
            torch.testing.assert_close(got, ref, equal_nan=True)


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("fill", [0.0, NAN])
@pytest.mark.parametrize("fn", [torch.quantile, torch.nanquantile], ids=["quantile", "nan"])
def test_quantile_every_interpolation(case, fill, fn):
    shape, dd, layout = case
    A, x = make(shape, fill, dd, layout)
    A, x = A.to(torch.float64) * 0.7, x * 0.7  # (non-integer ranks and values)
    if fill == 0.0 and x.dim() > 1:  # a stored NaN in one slice
        x[(0,) * x.dim()] = NAN
        A = sparsefill.to_sparse(
            x, fill_value=A.fill_value()[(0,) * dd] if dd else 0.0, dense_dim=dd
        )
    qs = [0.5, torch.tensor([0.0, 0.3, 0.75, 1.0], dtype=torch.float64)]
    for interp in ("linear", "lower", "higher", "midpoint", "nearest"):
        for dim in [None, *range(len(shape))]:
            for keep in (False, True):
                for q in qs:
                    got = dense(fn(A, q, dim, keep, interpolation=interp))
                    ref = fn(x, q, dim, keep, interpolation=interp)
                    torch.testing.assert_close(got, ref, equal_nan=True)


def test_zero_dim_and_empty():
    A = sparsefill.sparse_coo_tensor(torch.zeros(0, 1, dtype=torch.long), [4.0], (), fill_value=1.0)
    x = A.to_dense()
    for f in (
        lambda t: tuple(torch.sort(t)),
        lambda t: tuple(torch.topk(t, 1)),
        lambda t: tuple(torch.kthvalue(t, 1)),
        lambda t: tuple(torch.mode(t)),
        lambda t: torch.quantile(t, 0.5),
    ):
        torch.testing.assert_close(dense(f(A)), f(x))
    E, e = make((0, 4), 1.0)
    torch.testing.assert_close(dense(tuple(torch.sort(E, 1))), tuple(torch.sort(e, 1)))
    torch.testing.assert_close(dense(tuple(torch.topk(E, 2, 1))), tuple(torch.topk(e, 2, 1)))


def test_errors_as_torch():
    A, x = make((3, 4), 0.0)
    for f, err in (
        (lambda t: torch.topk(t, 5, 1), RuntimeError),
        (lambda t: torch.kthvalue(t, 0, 1), RuntimeError),
        (lambda t: torch.sort(t, 2), IndexError),
        (lambda t: torch.quantile(t, 1.5), RuntimeError),
        (lambda t: torch.quantile(t, 0.5, interpolation="cubic"), RuntimeError),
        (lambda t: torch.quantile(t.to(torch.int64), 0.5), RuntimeError),
    ):
        with pytest.raises(err):
            f(x)
        with pytest.raises(err):
            f(A)


def test_sort_is_dense_by_nature_under_the_policy():
    A, x = make((50, 40), 0.0, 1, "coo")
    with sparsefill.densify_policy(dense_by_nature="raise"):
        with pytest.raises(DensifyError, match="sort of a SparseTensor along sparse dim 0"):
            torch.sort(A, 0)
        with pytest.raises(DensifyError):
            torch.topk(A, 3, 0)
        out = torch.sort(A, 1)  # along a dense dim: the pattern kept, no dense result
        assert isinstance(out.values, SparseTensor) and out.values._nnz() == A._nnz()
        torch.quantile(A, 0.2, dim=1)
    with sparsefill.densify_policy(limit_bytes=1000):
        with pytest.raises(DensifyError):
            torch.sort(A, 0)


# ------------------------------------------------------------------------------- backward
def _leaves(shape, dd, seed=0):
    g = torch.Generator().manual_seed(seed)
    S = shape[: len(shape) - dd]
    m = torch.rand(S, generator=g) < 0.4
    idx = m.nonzero().T
    v = torch.randn((idx.shape[1],) + shape[len(S) :], dtype=torch.float64, generator=g)
    f = torch.randn(shape[len(S) :], dtype=torch.float64, generator=g)
    return m, idx, v.requires_grad_(), f.requires_grad_()


def _grads(shape, dd, layout, fn):
    """The gradients of (values, fill) through ``fn`` of the SparseTensor and of its dense form."""
    m, idx, v, f = _leaves(shape, dd)
    A = sparsefill.sparse_coo_tensor(idx, v, shape, fill_value=f)
    A = A.to_sparse_csr() if layout == "csr" else A
    mm = m.reshape(m.shape + (1,) * dd)
    D = torch.where(mm, torch.zeros(shape, dtype=torch.float64).index_put(tuple(idx), v), f)
    out = []
    W = None
    for X in (A, D):
        o = dense(fn(X))
        if W is None:
            W = torch.randn(
                o.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1)
            )
        out.append(torch.autograd.grad((o * W).sum(), (v, f)))
    return out


BACKWARD = {
    "sort": lambda X, d: torch.sort(X, d).values,
    "sort_desc": lambda X, d: torch.sort(X, dim=d, descending=True, stable=True).values,
    "msort": lambda X, d: torch.msort(X),
    "topk": lambda X, d: torch.topk(X, 2, d).values,
    "topk_smallest": lambda X, d: torch.topk(X, 3, d, largest=False).values,
    "kthvalue": lambda X, d: torch.kthvalue(X, 2, d).values,
    "kthvalue_keepdim": lambda X, d: torch.kthvalue(X, 3, d, keepdim=True).values,
    "mode": lambda X, d: torch.mode(X, d).values,
    "aminmax": lambda X, d: torch.aminmax(X, dim=d)[0] * 2 + torch.aminmax(X, dim=d)[1],
    "quantile": lambda X, d: torch.quantile(X, torch.tensor([0.2, 0.7], dtype=X.dtype), dim=d),
    "nanquantile_mid": lambda X, d: torch.nanquantile(X, 0.4, d, interpolation="midpoint"),
    "quantile_all": lambda X, d: torch.quantile(X, 0.35),
    "median_dim": lambda X, d: torch.median(X, d).values + torch.nanmedian(X, d, True).values.sum(),
    "median_all": lambda X, d: torch.median(X) * 2 + torch.nanmedian(X),
    "quantile_lower_higher_nearest": lambda X, d: sum(
        torch.quantile(X, 0.45, d, interpolation=i) * w
        for i, w in (("lower", 1.0), ("higher", 2.0), ("nearest", -1.5))
    ),
}


@pytest.mark.parametrize("name", BACKWARD)
@pytest.mark.parametrize(
    "case", [((5, 7), 0, "coo"), ((5, 7), 0, "csr"), ((3, 4, 6), 0, "coo"), ((5, 6, 3), 1, "coo")]
)
def test_gradients_of_values_and_fill_as_dense(name, case):
    shape, dd, layout = case
    for d in range(len(shape)):
        got, ref = _grads(shape, dd, layout, lambda X: BACKWARD[name](X, d))
        torch.testing.assert_close(got, ref)


def test_topk_backward_touches_the_output_only():
    """topk over a sparse dim of a large tensor: the backward reads the k selected positions."""
    n = 4000
    v = torch.randn(50, dtype=torch.float64, requires_grad=True)
    A = sparsefill.sparse_coo_tensor(
        torch.stack([torch.arange(50), torch.arange(50) * 7]), v, (50, n), fill_value=0.0
    )
    with sparsefill.densify_policy("raise"):
        torch.topk(A, 2, 1).values.sum().backward()
    assert torch.equal(v.grad, (v > 0).double())


# ------------------------------------------------------------------- an indefinite fill
def _masked(shape, dd, seed=0):
    """``(A, x, mask)``: an indefinite-fill SparseTensor, its stored values at their places in
    ``x`` (0 elsewhere), and which elements are specified."""
    g = torch.Generator().manual_seed(seed)
    S = shape[: len(shape) - dd]
    m = torch.rand(S, generator=g) < 0.4
    idx = m.nonzero().T
    v = torch.randint(-3, 4, (idx.shape[1],) + shape[len(S) :], generator=g).double()
    A = sparsefill.sparse_coo_tensor(idx, v, shape, fill_value=sparsefill.indefinite)
    x = torch.zeros(shape, dtype=torch.float64).index_put(tuple(idx), v)
    return A, x, m.reshape(m.shape + (1,) * dd).expand(shape)


def _slices(x, mask, dim):
    """Each slice along ``dim``: (index, its stored values, their positions)."""
    xm, mm = x.movedim(dim, -1), mask.movedim(dim, -1)
    for ix in torch.cartesian_prod(*[torch.arange(s) for s in xm.shape[:-1]]).reshape(
        -1, xm.dim() - 1
    ):
        ix = tuple(ix.tolist())
        yield ix, xm[ix][mm[ix]], mm[ix].nonzero().flatten()


MASKED = [((4, 7), 0), ((3, 5, 6), 0), ((5, 6, 3), 1)]


@pytest.mark.parametrize("shape, dd", MASKED)
def test_indefinite_sort_and_topk_compact_each_slices_stored_elements(shape, dd):
    A, x, mask = _masked(shape, dd)
    for dim in range(len(shape) - dd):
        for desc in (False, True):
            for k in (None, 2):
                out = (
                    torch.sort(A, dim=dim, descending=desc, stable=True)
                    if k is None
                    else torch.topk(A, k, dim, largest=desc)
                )
                assert out.values.is_fill_indefinite() and out.indices.is_fill_indefinite()
                V = out.values.to_dense(fill_value=NAN).movedim(dim, -1)
                ind = out.indices.to_dense(fill_value=-1).movedim(dim, -1)
                for ix, vals, pos in _slices(x, mask, dim):
                    s = torch.sort(vals, stable=True, descending=desc)
                    n = vals.numel() if k is None else min(k, vals.numel())
                    assert torch.equal(V[ix][:n], s.values[:n]) and V[ix][n:].isnan().all()
                    assert torch.equal(ind[ix][:n], pos[s.indices[:n]])


@pytest.mark.parametrize("shape, dd", MASKED)
def test_indefinite_kthvalue_mode_quantile_over_the_stored_elements(shape, dd):
    A, x, mask = _masked(shape, dd)
    for dim in range(len(shape) - dd):
        kth = torch.kthvalue(A, 2, dim)
        mode = torch.mode(A, dim)
        q = torch.quantile(A, 0.3, dim, interpolation="midpoint")
        got = [t.to_dense(fill_value=NAN) for t in (kth.values, mode.values, q)]
        kpos, mpos = kth.indices.to_dense(fill_value=-1), mode.indices.to_dense(fill_value=-1)
        for ix, vals, pos in _slices(x, mask, dim):
            if vals.numel() < 2:
                assert got[0][ix].isnan()
            else:
                s = torch.sort(vals, stable=True)
                assert got[0][ix] == s.values[1] and kpos[ix] == pos[s.indices[1]]
            if not vals.numel():
                assert got[1][ix].isnan() and got[2][ix].isnan()
                continue
            u, c = vals.unique(return_counts=True)
            best = u[c == c.max()].min()
            assert got[1][ix] == best and mpos[ix] == pos[vals == best].max()
            ref = torch.quantile(vals, 0.3, interpolation="midpoint")
            torch.testing.assert_close(got[2][ix], ref)


@pytest.mark.parametrize("shape, dd", [((4, 7), 0), ((4, 5, 2), 1)])
def test_indefinite_gradients_go_to_the_selected_stored_values(shape, dd):
    """Against finite differences: the masked results are piecewise linear in the values."""
    A, x, mask = _masked(shape, dd)
    idx, v0 = (
        A.indices(),
        A.values() + torch.linspace(0, 0.01, A.values().numel()).reshape(A.values().shape),
    )
    for dim in range(len(shape) - dd):
        for fn in (
            lambda X: torch.sort(X, dim).values,
            lambda X: torch.topk(X, 2, dim).values,
            lambda X: torch.kthvalue(X, 1, dim).values,
            lambda X: torch.mode(X, dim).values,
            lambda X: torch.quantile(X, 0.4, dim),
        ):

            def loss(v, W=None):
                o = fn(
                    sparsefill.sparse_coo_tensor(idx, v, shape, fill_value=sparsefill.indefinite)
                )
                return o.to_dense(fill_value=0.0)

            v = v0.clone().requires_grad_()
            out = loss(v)
            W = torch.randn(
                out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3)
            )
            (g,) = torch.autograd.grad((out * W).sum(), v)
            num = torch.zeros_like(v0).reshape(-1)
            with torch.no_grad():
                base = (loss(v0) * W).sum()
                for i in range(num.numel()):
                    d = torch.zeros_like(num)
                    d[i] = 1e-6
                    num[i] = ((loss(v0 + d.reshape(v0.shape)) * W).sum() - base) / 1e-6
            torch.testing.assert_close(g.reshape(-1), num, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------- topk's sparse output
@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("fill", [0.0, NAN])
def test_topk_sparse_output_stores_the_picked_stored_elements(case, fill):
    shape, dd, layout = case
    A, x = make(shape, fill, dd, layout)
    for dim in range(len(shape)):
        for k in (1, 3):
            for largest in (True, False):
                if k > shape[dim]:
                    continue
                v, i = sparsefill.topk(A, k, dim, largest, sparse=True)
                ref = stable_sort(x, dim, largest)
                rv, ri = ref.values.narrow(dim, 0, k), ref.indices.narrow(dim, 0, k)
                torch.testing.assert_close(dense(v), rv, equal_nan=True)
                di = dense(i) if not isinstance(i, SparseTensor) else i.to_dense(fill_value=-1)
                assert ((di == ri) | (di == -1)).all()
                if dim < len(shape) - dd and isinstance(v, SparseTensor):
                    # (only slots holding a stored scalar: at most one per stored scalar)
                    assert v._nnz() <= A.coalesce().values().numel()
    assert sparsefill.topk(x, 2).values.shape == torch.topk(x, 2).values.shape


# ------------------------------------------------------ the compiled row kernels and the torch path
LONG = [  # (shape, dense_dim, layout): rows of 40-150 stored (past the kernels' insertion sort)
    ((3, 150), 0, "coo"),
    ((150, 4), 0, "csr"),
    ((2, 60, 3), 1, "coo"),
    ((300,), 0, "coo"),
]


@pytest.mark.parametrize("backend", ["numba", "torch"])
@pytest.mark.parametrize("case", LONG, ids=[f"{c[2]}-{'x'.join(map(str, c[0]))}" for c in LONG])
@pytest.mark.parametrize("fill", [0.0, NAN, -INF])
def test_long_rows_sort_topk_kthvalue_quantile_on_each_backend(backend, case, fill):
    """Rows longer than the kernels' insertion sort (a merge sort), a short head of a long row (a
    selection), many ties, a NaN among the stored values: values and stable indices as dense."""
    from sparsefill import segment

    if backend == "numba" and not segment.compiled_available():
        pytest.skip("needs numba (the compiled kernels)")
    shape, dd, layout = case
    A, x = make(shape, fill, dd, layout, p=0.6, seed=3)
    if fill == 0.0:  # (a stored NaN: the largest, in position order with the others)
        x = x.clone()
        x.view(-1)[5] = NAN
        A = sparsefill.to_sparse(x, fill_value=A.fill_value(), dense_dim=dd)
    with segment.use_backend(backend):
        for dim in range(len(shape) - dd):
            for desc in (False, True):
                got, ref = torch.sort(A, dim=dim, descending=desc), stable_sort(x, dim, desc)
                torch.testing.assert_close(got.values, ref.values, equal_nan=True)
                assert torch.equal(got.indices, ref.indices)
                for k in sorted({1, 3, 70, shape[dim] - 2} & set(range(shape[dim] + 1))):
                    got = torch.topk(A, k, dim, largest=desc)
                    torch.testing.assert_close(
                        got.values, ref.values.narrow(dim, 0, k), equal_nan=True
                    )
                    assert torch.equal(got.indices, ref.indices.narrow(dim, 0, k))
            for k in sorted({1, max(shape[dim] // 2, 1), shape[dim]}):
                got, ref = torch.kthvalue(A, k, dim), stable_sort(x, dim)
                rv = ref.values.select(dim, k - 1)
                torch.testing.assert_close(got.values, rv, equal_nan=True)
                assert torch.equal(got.indices, ref.indices.select(dim, k - 1))
            q = torch.tensor([0.0, 0.3, 1.0], dtype=x.dtype)
            for fn in (torch.quantile, torch.nanquantile):
                torch.testing.assert_close(fn(A, q, dim), fn(x, q, dim), equal_nan=True)


@pytest.mark.parametrize("backend", ["numba", "torch"])
@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_sort_into_out_tensors_on_each_backend(backend, layout):
    """``torch.sort(A, dim, out=(values, indices))``: the kernel writes contiguous outputs of the
    result's shape themselves (no DensifyWarning); outputs of another shape are resized and a
    strided one is written through, as torch does."""
    from sparsefill import segment

    if backend == "numba" and not segment.compiled_available():
        pytest.skip("needs numba (the compiled kernels)")
    A, x = make((40, 30), 0.5, 0, layout, p=0.3, seed=5)
    with segment.use_backend(backend), warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        for dim in (0, 1):
            for desc in (False, True):
                ref = stable_sort(x, dim, desc)
                outs = (torch.full_like(x, 7.0), torch.full(x.shape, 7))
                got = torch.sort(A, dim, desc, out=outs)
                assert got[0] is outs[0] and got[1] is outs[1]
                assert torch.equal(outs[0], ref.values) and torch.equal(outs[1], ref.indices)
                strided = (torch.empty(x.shape[::-1]).t(), torch.empty(0, dtype=torch.long))
                torch.sort(A, dim=dim, descending=desc, stable=True, out=strided)
                assert torch.equal(strided[0], ref.values)
                assert torch.equal(strided[1], ref.indices)


def test_strided_sorts_of_other_sizes_reuse_the_kernels_scratch():
    """The line-by-line kernels keep their scratch between calls: a larger call, then smaller
    ones (a buffer longer than they need), then a larger one again, each as dense."""
    from sparsefill import segment

    if not segment.compiled_available():
        pytest.skip("needs numba (the compiled kernels)")
    with segment.use_backend("numba"):
        for shape, p, width in (((60, 50), 0.3, None), ((7, 5), 0.5, 3), ((90, 80), 0.2, 70)):
            A, x = make(shape, 0.25, 0, "coo", p=p, seed=shape[0])
            ref = stable_sort(x, 0, False)
            if width is None:
                got = torch.sort(A, 0)
                assert torch.equal(got.values, ref.values)
                assert torch.equal(got.indices, ref.indices)
            else:
                got = torch.topk(A, width, 0, largest=False)
                assert torch.equal(got.values, ref.values[:width])
                assert torch.equal(got.indices, ref.indices[:width])


def test_stored_values_equal_to_the_fill_sit_in_its_run():
    """A stored element equal to the fill (a stored -0.0 beside a fill of 0.0, a stored 0.0) takes
    its place in the fill's run by position; rows with nothing stored around it."""
    A = sparsefill.sparse_coo_tensor(
        [[0, 0, 0, 2], [1, 3, 4, 0]], [0.0, 2.0, -0.0, -1.0], (4, 5), fill_value=0.0
    )
    x = A.to_dense()
    for dim in (0, 1):
        for desc in (False, True):
            got, ref = (
                torch.sort(A, dim=dim, descending=desc, stable=True),
                stable_sort(x, dim, desc),
            )
            assert torch.equal(got.values, ref.values) and torch.equal(got.indices, ref.indices)
            assert torch.equal(got.values.signbit(), ref.values.signbit())
            got = torch.topk(A, 3, dim, largest=desc)
            assert torch.equal(got.indices, ref.indices.narrow(dim, 0, 3))


@pytest.mark.parametrize("backend", ["numba", "torch"])
@pytest.mark.parametrize("fill", [0.0, NAN])
def test_topk_head_of_a_long_row_with_later_elements_ahead_of_the_fill(backend, fill):
    """A short head of a long row (a selection) whose later stored elements sort ahead of the
    fill and replace earlier ones behind it, and stored elements equal to the fill: the fill's
    run placed from the counts of the whole row."""
    from sparsefill import segment

    if backend == "numba" and not segment.compiled_available():
        pytest.skip("needs numba (the compiled kernels)")
    vals = torch.cat([torch.arange(1.0, 21.0), -torch.arange(1.0, 11.0), torch.full((4,), fill)])
    A = sparsefill.sparse_coo_tensor(
        torch.stack([torch.zeros(34, dtype=torch.long), torch.arange(34)]),
        vals,
        (2, 40),
        fill_value=fill,
    )
    x = A.to_dense()
    with segment.use_backend(backend):
        for largest in (False, True):
            for k in (12, 20):
                got, ref = torch.topk(A, k, 1, largest=largest), stable_sort(x, 1, largest)
                torch.testing.assert_close(got.values, ref.values.narrow(1, 0, k), equal_nan=True)
                assert torch.equal(got.indices, ref.indices.narrow(1, 0, k))


@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize("fill", [0.0, NAN])
def test_long_head_across_a_strided_output_on_the_compiled_kernels(layout, fill):
    """A sort along dim 0 of a matrix of 70 rows (a head longer than the kernels' selection,
    written line by line across the output) and a topk along it: stored elements equal to the
    fill (``-0.0`` beside ``0.0``) in its run, stored NaNs, empty columns; ``k = 0``."""
    from sparsefill import segment

    if not segment.compiled_available():
        pytest.skip("needs numba (the compiled kernels)")
    g = torch.Generator().manual_seed(5)
    x = torch.randint(-2, 3, (70, 6), generator=g).double()
    x[torch.rand(70, 6, generator=g) < 0.1] = NAN
    x[torch.rand(70, 6, generator=g) < 0.6] = fill
    x[:, 4] = fill
    keep = (x != fill) & ~x.isnan() if fill == fill else ~x.isnan()
    keep |= torch.rand(70, 6, generator=g) < 0.1  # (some stored elements equal to the fill)
    idx = keep.nonzero().t()
    vals = x[keep]
    vals[vals == 0] = -0.0 if fill == 0 else 0.0
    A = sparsefill.sparse_coo_tensor(idx, vals, x.shape, fill_value=fill).coalesce()
    A = A.to_sparse_csr() if layout == "csr" else A
    x = A.to_dense()
    with segment.use_backend("numba"):
        for desc in (False, True):
            got, ref = torch.sort(A, 0, desc), stable_sort(x, 0, desc)
            torch.testing.assert_close(got.values, ref.values, equal_nan=True)
            assert torch.equal(got.values.signbit(), ref.values.signbit())
            assert torch.equal(got.indices, ref.indices)
            for k in (0, 3, 66):
                got = torch.topk(A, k, 0, largest=desc)
                assert torch.equal(got.indices, ref.indices[:k])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("fill", [0.0, -0.0, NAN, -INF, 1.5])
def test_sort_of_many_stored_per_slice_on_the_compiled_kernels(dtype, fill):
    """Slices with hundreds of stored elements on each side of the fill (a radix sort of their
    bits): ties of -0.0 and 0.0, both NaNs, infinities and repeated values in stable order, the
    fill's sign kept, ascending and descending; the rows of a 2-D sort likewise."""
    from sparsefill import segment

    if not segment.compiled_available():
        pytest.skip("needs numba (the compiled kernels)")
    g = torch.Generator().manual_seed(7)
    x = torch.randn(3000, generator=g, dtype=torch.float64).to(dtype)
    pool = torch.tensor([NAN, -NAN, 0.0, -0.0, INF, -INF, 1.5, -1.5], dtype=dtype)
    odd = torch.rand(3000, generator=g) < 0.4
    x[odd] = pool[torch.randint(0, 8, (int(odd.sum()),), generator=g)]
    x[torch.rand(3000, generator=g) < 0.5] = fill
    keep = torch.rand(3000, generator=g) < 0.7  # (stored: some equal to the fill)
    for shape, dim in (((3000,), 0), ((2, 1500), 1)):
        A = sparsefill.sparse_coo_tensor(
            keep.reshape(shape).nonzero().t(), x[keep], shape, fill_value=fill
        ).coalesce()
        d = A.to_dense()
        with segment.use_backend("numba"):
            for desc in (False, True):
                got, ref = torch.sort(A, dim, desc), stable_sort(d, dim, desc)
                torch.testing.assert_close(got.values, ref.values, equal_nan=True)
                assert torch.equal(got.values.signbit(), ref.values.signbit())
                assert torch.equal(got.indices, ref.indices)


def test_sort_topk_shortcuts_take_plain_calls_and_decline_the_rest():
    """The dispatch shortcuts of sort/topk give the handlers' result for a plain coalesced COO
    operand or CSR matrix (omitted arguments at their defaults), and pass views, uncoalesced operands, an
    indefinite fill, dense dims and out-of-range arguments to the full path (None)."""
    from sparsefill.ops.order import sort as S

    aten = torch.ops.aten
    A = sparsefill.sparse_coo_tensor(
        [[0, 0, 1, 2], [1, 3, 2, 0]], [5.0, -1.0, 2.0, 0.0], (3, 4), fill_value=0.0
    ).coalesce()
    for args in [(A, 2), (A, 2, 0), (A, 3, 1, False), (A, 1, -2, True, False)]:
        got = S._topk_shortcut(aten.topk.default, args, {})
        assert got is not None
        for g, w in zip(got, S._topk(aten.topk.default, args, {})):
            assert torch.equal(g, w)
    C = A.to_sparse_csr()
    for args in [(C, 2), (C, 3, 0, False)]:
        got = S._topk_shortcut(aten.topk.default, args, {})
        assert got is not None
        for g, w in zip(got, S._topk(aten.topk.default, args, {})):
            assert torch.equal(g, w)
    for args in [(A,), (A, 0), (A, 1, True), (C, 0)]:
        got = S._sort_shortcut(aten.sort.default, args, {})
        assert got is not None
        for g, w in zip(got, S._sort(aten.sort.default, args, {})):
            assert torch.equal(g, w)
    for kw in [{"stable": True, "dim": 0}, {"stable": False, "descending": True}]:
        got = S._sort_stable_shortcut(aten.sort.stable, (C,), kw)
        assert got is not None
        for g, w in zip(got, S._sort(aten.sort.stable, (C,), kw)):
            assert torch.equal(g, w)
    H = sparsefill.sparse_coo_tensor([[0, 2]], [[1.0, 2.0], [3.0, 4.0]], (3, 2), fill_value=0.0)
    masked = sparsefill.sparse_coo_tensor(
        [[0, 2]], [1.0, 2.0], (3,), fill_value=sparsefill.indefinite
    )
    declined = [
        (A[1:], 2, 1),  # a view
        (sparsefill.sparse_coo_tensor([[0, 0]], [1.0, 2.0], (3,)), 1, 0),  # uncoalesced
        (masked.coalesce(), 1, 0),  # an indefinite fill
        (H.coalesce(), 1, 1),  # a dense dim
        (A, 5, 1),  # k past the slice
        (A, 2, 2),  # dim out of range
    ]
    for args in declined:
        assert S._topk_shortcut(aten.topk.default, args, {}) is None
