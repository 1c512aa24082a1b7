"""Set and search ops of a SparseTensor against the dense op (``sparsefill/ops/order/search.py``)::

    op(A, ...) == op(A.to_dense(), ...)

unique, unique_consecutive, isin, searchsorted/bucketize (a SparseTensor of values or of
boundaries, with a sorter), histc, histogram (weights and bins dense or sparse), bincount; COO,
CSR, hybrid, NaN fills, integer dtypes; an indefinite fill's masked meaning (the stored elements
only); no DensifyWarning.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import sparsefill
from sparsefill import SparseTensor, indefinite
from tests.ops.order.test_sorting import dense, make

NAN = float("nan")
CASES = [
    ((4, 7), 0, "coo"),
    ((4, 7), 0, "csr"),
    ((3, 5, 6), 0, "coo"),
    ((5, 6, 3), 1, "coo"),
    ((40,), 0, "coo"),
    ((0, 3), 0, "coo"),
]
IDS = [f"{c[2]}-{'x'.join(map(str, c[0]))}" for c in CASES]


@pytest.fixture(autouse=True)
def _no_densify():
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        yield


def _with_nan(A, x, dd):
    """``x`` with one stored NaN (floating, non-empty), and its SparseTensor."""
    if not x.is_floating_point() or not x.numel():
        return A, x
    x = x.clone()
    x.view(-1)[x.numel() // 2] = NAN
    fill = A.fill_value()
    return sparsefill.to_sparse(x, fill_value=fill[(0,) * dd] if dd else fill, dense_dim=dd), x


def test_searchsorted_rejects_a_bad_sorter_or_side_and_reads_nothing_past_a_row():
    """A sorter entry out of a row's range (which the bisection would read through: another row's
    element, or the fill of SparseTensor boundaries) and a side other than left/right are errors,
    as torch's are."""
    A = sparsefill.sparse_coo_tensor(
        [[0, 1, 2], [1, 2, 0]], [1.0, 2.0, 3.0], (3, 4), fill_value=0.5
    )
    rows = torch.arange(9.0).reshape(3, 3)
    S = sparsefill.to_sparse(torch.arange(4.0), fill_value=0.0)
    for bad in (torch.tensor([[0, 1, 5]] * 3), torch.tensor([[-1, 0, 1]] * 3)):
        with pytest.raises(IndexError, match="sorter"):
            torch.searchsorted(rows, A, sorter=bad)
    with pytest.raises(IndexError, match="sorter"):
        torch.searchsorted(S, torch.tensor([2.5]), sorter=torch.tensor([0, 1, 2, 9]))
    with pytest.raises(ValueError, match="side"):
        torch.searchsorted(S, torch.tensor([2.5]), side="middle")


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("fill", [0.0, 1.0, NAN])
@pytest.mark.parametrize("dtype", [torch.float64, torch.int64], ids=["f64", "i64"])
def test_unique(case, fill, dtype):
    shape, dd, layout = case
    if dtype == torch.int64 and fill != fill:
        return
    A, x = make(shape, fill, dd, layout, dtype=dtype)
    A, x = _with_nan(A, x, dd)
    for ri in (False, True):
        for rc in (False, True):
            got = torch.unique(A, sorted=True, return_inverse=ri, return_counts=rc)
            ref = torch.unique(x, sorted=True, return_inverse=ri, return_counts=rc)
            got = dense(tuple(got)) if isinstance(got, tuple) else (got,)
            ref = ref if isinstance(ref, tuple) else (ref,)
            if ri and x.isnan().any():  # (torch's order of the NaN entries is its sort's)
                m = x.isnan()
                assert got[0][got[1][m]].isnan().all()
                assert len(set(got[1][m].tolist())) == int(m.sum())
                got, ref = list(got), list(ref)
                got[1], ref[1] = got[1][~m], ref[1][~m]
            torch.testing.assert_close(tuple(got), tuple(ref), equal_nan=True)
    got = torch.unique(A, return_inverse=True)[1]
    if not (A.fill_value() != A.fill_value()).any():  # (the pattern kept, the fill mapped)
        assert isinstance(got, SparseTensor) and got._nnz() == A.coalesce()._nnz()


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("fill", [0.0, NAN])
def test_unique_consecutive(case, fill):
    shape, dd, layout = case
    A, x = make(shape, fill, dd, layout)
    A, x = _with_nan(A, x, dd)
    for ri in (False, True):
        for rc in (False, True):
            got = dense(tuple(torch.unique_consecutive(A, return_inverse=ri, return_counts=rc)))
            ref = torch.unique_consecutive(x, return_inverse=ri, return_counts=rc)
            torch.testing.assert_close(got, tuple(ref), equal_nan=True)


DIM_CASES = [
    ((9, 2), 0, "coo"),
    ((9, 2), 0, "csr"),
    ((9, 2), 0, "uncoalesced"),
    ((3, 6, 2), 0, "coo"),
    ((7, 2), 1, "coo"),
    ((0, 3), 0, "coo"),
]


@pytest.mark.parametrize("case", DIM_CASES, ids=[f"{c[2]}-{c[1]}-{c[0]}" for c in DIM_CASES])
@pytest.mark.parametrize("fill", [0.0, 1.0, NAN])
def test_unique_along_a_dim(case, fill):
    # the slices holding a stored element and one fill-only slice (a run of them, consecutive)
    # are the candidates; along a dense dim, or with a NaN, dense by nature (quiet)
    shape, dd, layout = case
    A, x = make(shape, fill, dd, layout, p=0.5)
    for dim in range(-len(shape), len(shape)):
        if x.numel() == 0 and x.shape[dim]:
            continue  # (torch: only the empty dim may be selected)
        for ri, rc in ((False, False), (True, True), (False, True)):
            kw = dict(return_inverse=ri, return_counts=rc, dim=dim)
            got, ref = torch.unique(A, **kw), torch.unique(x, **kw)
            torch.testing.assert_close(got, ref, equal_nan=True)
            got, ref = torch.unique_consecutive(A, **kw), torch.unique_consecutive(x, **kw)
            torch.testing.assert_close(got, ref, equal_nan=True)
    B = sparsefill.sparse_coo_tensor([[0, 2], [1, 0]], [1.0, 2.0], (5, 2), fill_value=indefinite)
    with pytest.raises(ValueError, match="indefinite"):
        torch.unique(B, dim=1)


HIST_CASES = [
    ((8, 2), 0, "coo"),
    ((8, 3), 0, "csr"),
    ((8, 3), 0, "uncoalesced"),
    ((4, 5, 2), 0, "coo"),
    ((9, 2), 1, "coo"),
]


@pytest.mark.parametrize("case", HIST_CASES, ids=[f"{c[2]}-{c[1]}-{c[0]}" for c in HIST_CASES])
@pytest.mark.parametrize("fill", [1.5, NAN])
def test_histogramdd(case, fill):
    # the points holding a stored coordinate, plus one fill point weighted by the others (a NaN
    # fill point: no bin; with computed edges both raise, the range not finite)
    shape, dd, layout = case
    A, x = make(shape, fill, dd, layout, p=0.5)
    D = shape[-1]
    g = torch.Generator().manual_seed(4)
    wd = torch.rand(shape[:-1], generator=g, dtype=torch.float64)
    ws = sparsefill.to_sparse(torch.where(wd < 0.5, wd, 0.5), fill_value=0.5)
    edges = [torch.linspace(-4, 4, 4, dtype=torch.float64)] * D
    for bins, w, density in (([3] * D, None, False), (edges, wd, True), ([2] * D, ws, False)):
        wx = w.to_dense() if isinstance(w, SparseTensor) else w
        try:
            ref = torch.histogramdd(x, bins, weight=wx, density=density)
        except RuntimeError:
            with pytest.raises(RuntimeError):
                torch.histogramdd(A, bins, weight=w, density=density)
            continue
        got = torch.histogramdd(A, bins, weight=w, density=density)
        torch.testing.assert_close(tuple(got), tuple(ref), equal_nan=True)


def test_histogramdd_indefinite_counts_the_stored_points():
    vals = torch.tensor([[1.0, 2.0], [0.5, 0.5], [3.0, -1.0]])
    A = sparsefill.sparse_coo_tensor([[0, 2, 3]], vals, (5, 2), fill_value=indefinite)
    torch.testing.assert_close(
        tuple(torch.histogramdd(A, [2, 2])), tuple(torch.histogramdd(vals, [2, 2]))
    )
    B = sparsefill.sparse_coo_tensor(
        [[0, 0, 2], [0, 1, 0]], [1.0, 2.0, 3.0], (5, 2), fill_value=indefinite
    )
    with pytest.raises(ValueError, match="unspecified coordinates"):
        torch.histogramdd(B, [2, 2])


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("fill", [0.0, 2.0, NAN])
def test_isin(case, fill):
    shape, dd, layout = case
    A, x = make(shape, fill, dd, layout)
    other = torch.tensor([0.0, 1.0, 3.0, NAN, -2.0], dtype=torch.float64)
    for test in (torch.tensor([0.0, 1.0, 2.5, -1.0], dtype=torch.float64), 2.0):
        for inv in (False, True):
            out = torch.isin(A, test, invert=inv)
            assert isinstance(out, SparseTensor)
            torch.testing.assert_close(dense(out), torch.isin(x, test, invert=inv))
            torch.testing.assert_close(
                torch.isin(other, A, invert=inv), torch.isin(other, x, invert=inv)
            )
    B, y = make((6,), 1.0, 0, "coo", seed=3)
    torch.testing.assert_close(dense(torch.isin(A, B)), torch.isin(x, y))


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("fill", [0.0, 0.5, NAN])
def test_searchsorted_and_bucketize(case, fill):
    shape, dd, layout = case
    A, x = make(shape, fill, dd, layout)
    bd = torch.tensor([-1.0, 0.0, 0.5, 1.0, 2.0], dtype=torch.float64)
    g = torch.Generator().manual_seed(5)
    for right in (False, True):
        for o32 in (False, True):
            out = torch.searchsorted(bd, A, right=right, out_int32=o32)
            assert isinstance(out, SparseTensor)  # (values to look up: the pattern kept)
            torch.testing.assert_close(
                dense(out), torch.searchsorted(bd, x, right=right, out_int32=o32)
            )
            got = dense(torch.bucketize(A, bd, right=right, out_int32=o32))
            torch.testing.assert_close(got, torch.bucketize(x, bd, right=right, out_int32=o32))
            # A as the boundaries (bisected as torch does: sorted or not)
            q = torch.randn(x.shape[:-1] + (5,), dtype=torch.float64, generator=g)
            if x.dim() > 1 and x.numel():
                q[..., 0] = 0.0 if fill != fill else fill
            side = "right" if right else "left"
            torch.testing.assert_close(
                torch.searchsorted(A, q, side=side, out_int32=o32),
                torch.searchsorted(x, q, side=side, out_int32=o32),
            )
            if x.dim() == 1:
                torch.testing.assert_close(
                    dense(torch.searchsorted(A, A, right=right)),
                    torch.searchsorted(x, x, right=right),
                )
                torch.testing.assert_close(torch.searchsorted(A, 0.3), torch.searchsorted(x, 0.3))
    if x.numel():
        srt = torch.argsort(x, dim=-1)
        torch.testing.assert_close(
            torch.searchsorted(A, q, sorter=srt), torch.searchsorted(x, q, sorter=srt)
        )


@pytest.mark.parametrize("case", [c for c in CASES if len(c[0]) > 1], ids=IDS[:4] + IDS[5:])
@pytest.mark.parametrize("fill", [0.5, NAN])
def test_searchsorted_in_rows(case, fill):
    """N-D boundaries: each element of a SparseTensor of values searched in its row (dense or
    SparseTensor boundaries, a sorter); the fill's result is the result's fill where every row
    places it alike, else the result is dense by nature (no fallback)."""
    shape, dd, layout = case
    A, x = make(shape, fill, dd, layout)
    g = torch.Generator().manual_seed(7)
    rows = x.shape[:-1]
    alike = torch.tensor([-4.0, -1.0, 0.0, 3.0, 5.0], dtype=torch.float64).expand(rows + (5,))
    alike = alike.contiguous()
    # (row r shifted by r - 1: a fill of 0.5 falls in other places in other rows; NaN last in all)
    shift = torch.arange(alike[..., 0].numel(), dtype=torch.float64).reshape(rows + (1,)) - 1
    differ = torch.sort(torch.randn(rows + (6,), generator=g, dtype=torch.float64))[0] + shift
    S, _ = make(rows + (6,), 0.25, 0, "coo", seed=4)
    for bd, bdd in ((alike, alike), (differ, differ), (S, S.to_dense())):
        for right in (False, True):
            out = torch.searchsorted(bd, A, right=right, out_int32=right)
            ref = torch.searchsorted(bdd, x, right=right, out_int32=right)
            torch.testing.assert_close(dense(out), ref)
            if bd is alike:
                assert isinstance(out, SparseTensor) and out._nse() == A._nse()
    perm = torch.argsort(torch.randn(differ.shape, generator=g), dim=-1)
    shuffled = differ.gather(-1, perm)
    srt = torch.argsort(shuffled, dim=-1)
    torch.testing.assert_close(
        dense(torch.searchsorted(shuffled, A, sorter=srt)),
        torch.searchsorted(shuffled, x, sorter=srt),
    )
    with sparsefill.densify_policy(dense_by_nature="raise"):
        torch.searchsorted(alike, A) if not dd else None  # (the fill placed alike: no dense form)
        if x.numel() and fill == fill:
            with pytest.raises(sparsefill.DensifyError):
                torch.searchsorted(differ, A)
    M = sparsefill.to_sparse(x, fill_value=indefinite, dense_dim=dd)
    out = torch.searchsorted(differ, M)
    assert out.is_fill_indefinite()
    keep = ~torch.isnan(x) if fill != fill else x != fill
    torch.testing.assert_close(
        out.to_dense(fill_value=0)[keep], torch.searchsorted(differ, x)[keep]
    )


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("fill", [0.0, 1.0, NAN])
def test_histc_and_histogram(case, fill):
    shape, dd, layout = case
    A, x = make(shape, fill, dd, layout)
    A, x = A * 0.3, x * 0.3
    for lo, hi in ((0, 0), (-1, 1), (0.3, 0.3)):
        if fill != fill and lo == hi and x.numel():
            with pytest.raises(RuntimeError):
                torch.histc(x, 7, lo, hi)
            with pytest.raises(RuntimeError):
                torch.histc(A, 7, lo, hi)
            continue
        torch.testing.assert_close(torch.histc(A, 7, lo, hi), torch.histc(x, 7, lo, hi))
    w = torch.rand(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    W = sparsefill.to_sparse(torch.where(w > 0.5, w, 0.25), fill_value=0.25)
    bins_t = torch.tensor([-2.0, 0.0, 0.5, 3.0], dtype=torch.float64)
    for bins in (5, bins_t) if fill == fill else (bins_t,):
        for weight in (None, w, W):
            for density in (False, True):
                got = torch.histogram(A, bins, weight=weight, density=density)
                ref = torch.histogram(x, bins, weight=dense(weight), density=density)
                torch.testing.assert_close(tuple(got), tuple(ref), equal_nan=True)
    got = torch.histogram(A, 4, range=(-1.0, 1.0))
    torch.testing.assert_close(tuple(got), tuple(torch.histogram(x, 4, range=(-1.0, 1.0))))
    sb = sparsefill.to_sparse(
        torch.tensor([-1.0, 0.0, 0.0, 2.0], dtype=torch.float64), fill_value=0.0
    )
    torch.testing.assert_close(
        tuple(torch.histogram(A, sb)), tuple(torch.histogram(x, sb.to_dense()))
    )


@pytest.mark.parametrize("n", [0, 10])
def test_bincount(n):
    A = sparsefill.sparse_coo_tensor([[1, 4, 5]], [3, 0, 7], (n + 6,), fill_value=2)
    x = A.to_dense()
    w = torch.rand(n + 6, dtype=torch.float64)
    for ml in (0, 12):
        torch.testing.assert_close(torch.bincount(A, minlength=ml), torch.bincount(x, minlength=ml))
        torch.testing.assert_close(
            torch.bincount(A, w, minlength=ml), torch.bincount(x, w, minlength=ml)
        )
    W = sparsefill.to_sparse(torch.where(w < 0.5, 0.25, w), fill_value=0.25)
    for ml in (0, 12):  # SparseTensor weights, of SparseTensor or dense indices
        for idx in (A, x):
            torch.testing.assert_close(
                torch.bincount(idx, W, minlength=ml), torch.bincount(x, W.to_dense(), minlength=ml)
            )
    neg = sparsefill.sparse_coo_tensor([[1]], [3], (4,), fill_value=-1)
    with pytest.raises(RuntimeError):
        torch.bincount(neg)
    with pytest.raises(RuntimeError):
        torch.bincount(x, W[1:])


def test_indefinite_fill_is_the_stored_elements_only():
    v = torch.tensor([3.0, 1.0, 3.0, NAN])
    A = sparsefill.sparse_coo_tensor([[0, 2, 5, 6]], v, (9,), fill_value=indefinite)
    vals, inv, cnt = torch.unique(A, return_inverse=True, return_counts=True)
    assert vals[:2].tolist() == [1.0, 3.0] and vals[2] != vals[2] and cnt.tolist() == [1, 2, 1]
    assert inv.is_fill_indefinite() and inv.values().tolist() == [1, 0, 1, 2]
    m = torch.isin(A, torch.tensor([3.0]))
    assert m.is_fill_indefinite() and m.values().tolist() == [True, False, True, False]
    assert torch.histc(A, 2, 0, 4).tolist() == [1.0, 2.0]
    s = torch.searchsorted(torch.tensor([0.0, 2.0]), A)
    assert s.is_fill_indefinite() and s.values().tolist() == [2, 1, 2, 2]
    vals, inv, cnt = torch.unique_consecutive(A, return_inverse=True, return_counts=True)
    assert vals[:3].tolist() == [3.0, 1.0, 3.0] and cnt.tolist() == [1, 1, 1, 1]
    assert inv.is_fill_indefinite() and inv.values().tolist() == [0, 1, 2, 3]
    lo, hi = torch.aminmax(A[:6])
    assert (lo.item(), hi.item()) == (1.0, 3.0)
    i = sparsefill.sparse_coo_tensor([[0, 3]], [2, 2], (5,), fill_value=indefinite)
    assert torch.bincount(i).tolist() == [0, 0, 2]


def test_unique_consecutive_inverse_is_dense_by_nature():
    A, _ = make((30, 30), 0.0)
    with sparsefill.densify_policy(dense_by_nature="raise"):
        torch.unique_consecutive(A, return_counts=True)
        with pytest.raises(sparsefill.DensifyError):
            torch.unique_consecutive(A, return_inverse=True)
