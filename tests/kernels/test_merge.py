"""Linear-time merges of sorted key runs (sparsefill._kernels.merge) against torch.unique / set intersection, the compiled
(numba) path against the torch fallback, and the element-wise ops that use them (``A + B`` of different
patterns, COO/CSR/hybrid, indefinite fills) against the dense result."""

import pytest
import torch

import sparsefill
from sparsefill._kernels import merge as _merge
from hypothesis import given, strategies as st
from tests.sparse_cases import (
    assert_identical,
    scalars,
    random_values,
    dense_and_unspecified,
    check_masked,
    SETTINGS,
)

BIG = 1 << 62


def _runs(kind, n, g, base=0):
    """Two strictly increasing int64 runs of the given relation, keys offset by ``base``."""

    def rnd(m, hi):
        return torch.randperm(hi, generator=g)[:m].sort().values

    if kind == "empty":
        a, b = torch.zeros(0, dtype=torch.int64), rnd(n, 3 * n + 1)
    elif kind == "both empty":
        a = b = torch.zeros(0, dtype=torch.int64)
    elif kind == "disjoint":
        a, b = 2 * rnd(n, 3 * n + 1), 2 * rnd(n, 3 * n + 1) + 1
    elif kind == "identical":
        a = rnd(n, 3 * n + 1)
        b = a.clone()
    elif kind == "inside":
        b = rnd(n, 3 * n + 1)
        a = b[torch.randperm(n, generator=g)[: n // 3].sort().values]
    elif kind == "after":
        a, b = rnd(n, 3 * n + 1), rnd(n, 3 * n + 1) + 3 * n + 1
    else:
        a, b = rnd(n, 3 * n + 1), rnd(n // 2 + 1, 3 * n + 1)
    return a + base, b + base


KINDS = ["random", "empty", "both empty", "disjoint", "identical", "inside", "after"]
PATHS = [
    False,
    pytest.param(
        True, marks=pytest.mark.skipif(not _merge._compiled(), reason="numba not installed")
    ),
]


def _check_union(a, b, out):
    u, pa, pb = out
    assert torch.equal(u, torch.unique(torch.cat([a, b])))
    assert torch.equal(u[pa], a) and torch.equal(u[pb], b)
    assert pa.dtype == pb.dtype == torch.int64


def _check_intersect(a, b, out):
    common, ia, ib = out
    ref = a[torch.isin(a, b)]
    assert torch.equal(common, ref) and torch.equal(a[ia], ref) and torch.equal(b[ib], ref)


@pytest.mark.parametrize("compiled", PATHS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [1, 7, 3000])
@pytest.mark.parametrize("base", [0, BIG - 10_000, (1 << 63) - 20_000])
def test_merge_matches_unique_and_paths_agree(kind, n, base, compiled):
    a, b = _runs(kind, n, torch.Generator().manual_seed(n), base)
    for x, y in ((a, b), (b, a)):
        got = _merge.merge_union(x, y, compiled=compiled)
        _check_union(x, y, got)
        for r, s in zip(
            got, _merge.merge_union(x, y, compiled=not compiled) if _merge._compiled() else got
        ):
            assert torch.equal(r, s)
        got = _merge.merge_intersect(x, y, compiled=compiled)
        _check_intersect(x, y, got)
        for r, s in zip(
            got, _merge.merge_intersect(x, y, compiled=not compiled) if _merge._compiled() else got
        ):
            assert torch.equal(r, s)


@pytest.mark.parametrize("sizes", [[5], [5, 0, 7], [40, 3, 40, 1]])
def test_union_inverse_folds_runs(sizes):
    g = torch.Generator().manual_seed(len(sizes))
    keys = [torch.randperm(60, generator=g)[:m].sort().values for m in sizes]
    u, pos = _merge.union_inverse(keys)
    ref, inv = torch.unique(torch.cat(keys), return_inverse=True)
    assert torch.equal(u, ref)
    for k, p, q in zip(keys, pos, inv.split(sizes)):
        assert torch.equal(p, q) and torch.equal(u[p], k)


def test_merge_rejects_bad_keys():
    a = torch.arange(3)
    with pytest.raises(TypeError, match="int64"):
        _merge.merge_union(a.int(), a)
    with pytest.raises(TypeError, match="1-d"):
        _merge.merge_intersect(a[None], a)


@pytest.fixture(
    params=[
        "search",
        "unique",
        pytest.param(
            "numba", marks=pytest.mark.skipif(not _merge._compiled(), reason="numba not installed")
        ),
    ]
)
def merge_path(request, monkeypatch):
    """Every merge through one path: torch's binary searches (other devices), the CPU merge of presorted runs
    without numba, or the compiled kernel (any size)."""
    monkeypatch.setattr(_merge, "_path", lambda a, b, compiled: request.param)
    return request.param


def _pair(kind, shape, dense, g, layout, fills):
    n = shape[0] * shape[1]
    a, b = _runs(kind, max(n // 4, 1), g)
    a, b = a[a < n], b[b < n]
    out = []
    for keys, fill in zip((a, b), fills):
        idx = torch.stack(torch.unravel_index(keys, shape))
        vals = torch.randn((keys.numel(),) + dense, generator=g, dtype=torch.float64)
        T = sparsefill.sparse_coo_tensor(idx, vals, shape + dense, fill_value=fill)
        out.append(T.to_sparse_csr() if layout is torch.sparse_csr else T)
    return out


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
@pytest.mark.parametrize("dense", [(), (3,)])
@pytest.mark.parametrize("kind", KINDS)
def test_add_of_different_patterns_matches_dense(merge_path, kind, dense, layout):
    g = torch.Generator().manual_seed(len(kind))
    A, B = _pair(
        kind,
        (6, 9),
        dense,
        g,
        layout,
        (1.0, torch.arange(2.0, 2.0 + (dense or (1,))[0], dtype=torch.float64).reshape(dense)),
    )
    torch.testing.assert_close((A + B).to_dense(), A.to_dense() + B.to_dense())
    torch.testing.assert_close((B * A).to_dense(), B.to_dense() * A.to_dense())
    torch.testing.assert_close(
        torch.maximum(A, B).to_dense(), torch.maximum(A.to_dense(), B.to_dense())
    )
    # the pattern is the union of the operands' (positions of the sparse dims, ascending), in A's layout
    S = (6, 9)
    ka, kb = (_keys(T, S) for T in (A, B))
    assert torch.equal(_keys(A + B, S), torch.unique(torch.cat([ka, kb])))


def _keys(T, S):
    from sparsefill._tensor.parts import coalesced_parts
    from sparsefill._kernels.index import linearize

    return linearize(coalesced_parts(T)[0], S)


@pytest.mark.parametrize("dense", [(), (2,)])
@pytest.mark.parametrize("kind", KINDS)
def test_indefinite_operands_keep_the_intersection(merge_path, kind, dense):
    g = torch.Generator().manual_seed(len(kind) + 1)
    A, B = _pair(
        kind, (5, 8), dense, g, torch.sparse_coo, (sparsefill.indefinite, sparsefill.indefinite)
    )
    C = A - B
    ka, kb = _keys(A, (5, 8)), _keys(B, (5, 8))
    assert torch.equal(_keys(C, (5, 8)), ka[torch.isin(ka, kb)])
    zero = torch.zeros(dense, dtype=torch.float64)
    sel = tuple(torch.unravel_index(_keys(C, (5, 8)), (5, 8)))
    got = C.to_dense(fill_value=zero)[sel]
    torch.testing.assert_close(
        got, A.to_dense(fill_value=zero)[sel] - B.to_dense(fill_value=zero)[sel]
    )


@pytest.mark.parametrize("kind", KINDS)
def test_one_indefinite_operand_keeps_its_pattern(merge_path, kind):
    g = torch.Generator().manual_seed(len(kind) + 2)
    A, B = _pair(kind, (5, 8), (), g, torch.sparse_coo, (sparsefill.indefinite, 1.5))
    C = B + A
    assert torch.equal(_keys(C, (5, 8)), _keys(A, (5, 8)))
    torch.testing.assert_close(
        C.to_dense(fill_value=0.0),
        torch.where(
            A.to_dense(fill_value=float("nan")).isnan(),
            0.0,
            B.to_dense() + A.to_dense(fill_value=0.0),
        ),
    )


def test_add_near_the_largest_keys(merge_path):
    """Keys near 2**62 (a (2**31, 2**31) sparse shape)."""
    n = 1 << 31
    ia = torch.tensor([[n - 3, n - 1, n - 1], [5, 0, n - 1]])
    ib = torch.tensor([[0, n - 1, n - 1], [0, 0, n - 2]])
    A = sparsefill.sparse_coo_tensor(ia, torch.tensor([1.0, 2.0, 3.0]), (n, n), fill_value=1.0)
    B = sparsefill.sparse_coo_tensor(ib, torch.tensor([10.0, 20.0, 30.0]), (n, n), fill_value=2.0)
    C = (A + B).coalesce()
    assert C._indices().tolist() == [[0, n - 3, n - 1, n - 1, n - 1], [0, 5, 0, n - 2, n - 1]]
    assert C._values().tolist() == [11.0, 3.0, 22.0, 31.0, 5.0]
    assert C.fill_value().item() == 3.0


def test_distributed_combine_of_three_patterns(merge_path):
    """The n-run fold through a caller: ``combine(SUM, [A, B, C])`` (distributed reductions) == the dense sum."""
    from torch.distributed import ReduceOp

    from sparsefill.distributed._combine import combine

    g = torch.Generator().manual_seed(3)
    Ts = [
        sparsefill.sparse_coo_tensor(
            torch.stack(torch.unravel_index(k, (4, 7))),
            torch.randn(k.numel(), 2, generator=g, dtype=torch.float64),
            (4, 7, 2),
            fill_value=f,
        )
        for k, f in zip(_runs("random", 9, g) + _runs("inside", 9, g), (0.5, 1.0, -2.0, 0.0))
    ]
    ref = sum(T.to_dense() for T in Ts)
    torch.testing.assert_close(combine(ReduceOp.SUM, Ts).to_dense(), ref)
    torch.testing.assert_close(
        combine(ReduceOp.MAX, Ts[:3]).to_dense(),
        torch.stack([T.to_dense() for T in Ts[:3]]).amax(0),
    )


@pytest.mark.parametrize("dense", [(), (2,)])
@pytest.mark.parametrize("kind", ["random", "disjoint", "inside", "empty"])
def test_masked_pattern_combination(merge_path, kind, dense):
    """A sparse mask joined to the input's pattern (masked ops that do not ignore masked-in fills): the
    merged union (no dense dims: the mask's positions come sorted) or torch.unique (dense dims)."""
    g = torch.Generator().manual_seed(len(kind) + 5)
    A, M = _pair(kind, (4, 6), dense, g, torch.sparse_coo, (1.5, 0.0))
    M = sparsefill.sparse_coo_tensor(M._indices(), M._values() > -5, M.shape, fill_value=False)
    x, m = A.to_dense(), M.to_dense()
    for op in (torch.masked.amax, torch.masked.prod):
        torch.testing.assert_close(op(A, 1, mask=M).to_dense(), op(x, 1, mask=m), equal_nan=True)


# ---------------------------------------------------------------------- the other merge call sites
@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
@pytest.mark.parametrize("dense", [(), (2,)])
@pytest.mark.parametrize("written", ["sorted", "random with repeats", "inside the pattern", "none"])
def test_writes_join_the_pattern_by_merge(merge_path, written, dense, layout):
    """``index_put_`` / ``index_put_(accumulate=True)`` / ``scatter_add``: the written positions (sorted alone,
    then merged with the pattern) join it; against the dense writes."""
    g = torch.Generator().manual_seed(len(written))
    A, _ = _pair("random", (6, 9), dense, g, layout, (1.5, 0.0))
    ka = _keys(A, (6, 9))
    if written == "sorted":
        k = torch.randperm(54, generator=g)[:11].sort().values
    elif written == "random with repeats":
        k = torch.randint(54, (15,), generator=g)
    elif written == "inside the pattern":
        k = ka[torch.randint(ka.numel(), (4,), generator=g)]
    else:
        k = torch.zeros(0, dtype=torch.int64)
    rows, cols = torch.unravel_index(k, (6, 9))
    v = torch.randn((k.numel(),) + dense, generator=g, dtype=torch.float64)
    for accumulate in (False, True):
        B, x = A.clone(), A.to_dense()
        B.index_put_((rows, cols), v, accumulate=accumulate)
        x.index_put_((rows, cols), v, accumulate=accumulate)
        torch.testing.assert_close(B.to_dense(), x)
        assert torch.equal(_keys(B, (6, 9)), torch.unique(torch.cat([ka, k])))
    if not dense:
        idx = torch.randint(6, (3, 9), generator=g)
        src = torch.randn(3, 9, generator=g, dtype=torch.float64)
        torch.testing.assert_close(
            A.scatter_add(0, idx, src).to_dense(), A.to_dense().scatter_add(0, idx, src)
        )


def _sorted_runs(sizes, hi, g, dup=False):
    runs = [torch.randint(hi, (m,), generator=g).sort().values for m in sizes]
    return torch.cat(runs if not dup else runs + [runs[0][: max(sizes[0] // 3, 1)]])


@pytest.mark.parametrize(
    "case",
    [
        "sorted",
        "sorted with repeats",
        "2 runs",
        "5 runs with repeats",
        "many runs",
        "random",
        "one",
        "empty",
    ],
)
@pytest.mark.parametrize("n", [9, 5000])
def test_sort_keys_is_a_stable_sort(case, n):
    """``_kernels.index.sort_keys`` (numpy's run-merging sort for a few runs on CPU, torch.sort else) == torch.sort(stable)."""
    from sparsefill._kernels import index as _index

    g = torch.Generator().manual_seed(n)
    keys = {
        "sorted": torch.arange(n) * 3,
        "sorted with repeats": torch.arange(n) // 2,
        "2 runs": _sorted_runs([n // 2, n - n // 2], 4 * n, g),
        "5 runs with repeats": _sorted_runs([n // 5] * 5, n, g, dup=True),
        "many runs": _sorted_runs([max(n // 100, 1)] * 100, 4 * n, g),
        "random": torch.randint(n, (n,), generator=g),
        "one": torch.tensor([7]),
        "empty": torch.zeros(0, dtype=torch.int64),
    }[case]
    k, perm = _index.sort_keys(keys)
    ref_k, ref_p = torch.sort(keys, stable=True)
    assert torch.equal(k, ref_k)
    assert torch.equal(ref_p, torch.arange(keys.numel()) if perm is None else perm)


@pytest.mark.parametrize("runs", [1, 2, 3, 80])
@pytest.mark.parametrize("dense", [(), (2,)])
def test_coalesce_of_concatenated_runs(runs, dense):
    """An uncoalesced COO tensor made of sorted runs that overlap (duplicates sum), as torch's native ``A + B``
    or a concatenation of coalesced patterns gives: coalesce() and to_dense() against the dense sum, COO and CSR."""
    g = torch.Generator().manual_seed(runs)
    shape, n = (70, 90), 70 * 90
    keys = _sorted_runs(
        [max(8000 // runs, 1)] * runs, n, g
    )  # (8000 keys: numpy's merge of the runs)
    idx = torch.stack(torch.unravel_index(keys, shape))
    vals = torch.randn((keys.numel(),) + dense, generator=g, dtype=torch.float64)
    A = sparsefill.sparse_coo_tensor(idx, vals, shape + dense, fill_value=0.5)
    ref = torch.full(shape + dense, 0.5, dtype=torch.float64)
    ref.view((n,) + dense).index_fill_(0, keys, 0).index_add_(0, keys, vals)
    C = A.coalesce()
    assert C.is_coalesced() and torch.equal(_keys(C, shape), torch.unique(keys))
    torch.testing.assert_close(C.to_dense(), ref)
    torch.testing.assert_close(A.to_dense(), ref)
    torch.testing.assert_close(A.to_sparse_csr(dense_dim=len(dense)).to_dense(), ref)


@pytest.mark.parametrize("coalesce", [True, False])
def test_all_sparse_merges_the_fill_elements(merge_path, coalesce):
    """A dense dim moved before a sparse one with an array fill: the elements whose fill differs from the most
    common one join the stored elements (a merge of two sorted runs when coalesced); against the dense permute."""
    g = torch.Generator().manual_seed(4)
    idx = torch.tensor([[0, 3, 1, 2], [2, 0, 4, 0]])
    vals = torch.randn(4, 3, generator=g, dtype=torch.float64)
    fill = torch.tensor([1.0, 2.0, 1.0], dtype=torch.float64)
    A = sparsefill.sparse_coo_tensor(idx, vals, (4, 5, 3), fill_value=fill)
    A = A.coalesce() if coalesce else A
    for dims in ((2, 0, 1), (0, 2, 1)):
        torch.testing.assert_close(A.permute(dims).to_dense(), A.to_dense().permute(dims))
    from sparsefill.ops.shape.reshape import all_sparse

    S = all_sparse(A)
    torch.testing.assert_close(S.to_dense(), A.to_dense())
    assert S.dense_dim() == 0 and S._nse() == 4 * 3 + (20 - 4) * 1 and S.is_coalesced() == coalesce
    k = _keys(S, S.shape)
    assert bool((k[1:] > k[:-1]).all()) or not coalesce


def test_batched_csr_padding_merges(merge_path):
    """A batched CSR needs the same nse per batch: fill-valued elements pad the short batches, merged into
    the sorted pattern; against the dense tensor."""
    idx = torch.tensor([[0, 0, 0, 1], [0, 1, 2, 1], [1, 0, 2, 2]])
    vals = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    A = sparsefill.sparse_coo_tensor(idx, vals, (2, 3, 3), fill_value=-1.0)
    C = A.to_sparse(torch.sparse_csr)
    assert C.col_indices().shape == (2, 3)
    torch.testing.assert_close(C.to_dense(), A.to_dense())


@pytest.mark.parametrize(
    "shape",
    [
        (3, 4),
        (20000, 20000),
        (7, 1, 5),
        (2, 3, 0 + 1, 9),
        (1 << 26, 1 << 26),
        ((1 << 40) + 7, 4095),
        (1 << 31, 1 << 31),
    ],
)
def test_linearize_and_unravel_are_inverse(shape):
    """The keys of :mod:`._index` (fused adds; float64 quotients below 2**52 positions, torch.unravel_index above)
    against torch.unravel_index, at random keys, the first and last, and next to multiples of the last dim."""
    from sparsefill._kernels import index as _index

    g = torch.Generator().manual_seed(len(shape))
    n, s = _index.numel(shape), shape[-1]
    m = torch.randint(max(n // s, 1), (300,), generator=g) * s
    keys = torch.cat(
        [
            torch.randint(n, (300,), generator=g),
            torch.tensor([0, n - 1]),
            m,
            (m - 1).clamp(min=0),
            (m + 1).clamp(max=n - 1),
        ]
    ).unique()
    idx = _index.unravel(keys, shape)
    assert torch.equal(idx, torch.stack(torch.unravel_index(keys, shape)))
    assert torch.equal(_index.linearize(idx, shape), keys)
    assert torch.equal(_index.linearize(idx.int(), shape), keys) or n > (1 << 31)
    assert _index.unravel(keys[:0], shape).shape == (len(shape), 0)


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    ],
)
def test_find_differ_matches_nonzero(dtype):
    """``_kernels.merge.find_differ`` (a vectorized count, then blocks of ``_FIND_BLOCK`` tested and written) ==
    ``(x != fill).nonzero()`` with NaN equal to NaN: sizes around the block edges, densities 0 to 100%, fills
    0, 3, NaN and -0.0, and ``to_sparse`` through it (COO and CSR, 2-D and 3-D) == the input."""
    pytest.importorskip("numba", reason="find_differ is a numba kernel (without numba it declines)")
    B, g = _merge._FIND_BLOCK, torch.Generator().manual_seed(3)
    fills = (
        [False, True]
        if dtype is torch.bool
        else [0, 3] + ([float("nan"), -0.0] if dtype.is_floating_point else [])
    )
    for n in (0, 1, B - 1, B, B + 1, 2 * B, 5 * B + 3, 3000):
        for p in (0.0, 0.01, 0.3, 1.0):
            for fv in fills:
                x = (
                    (torch.rand(n, generator=g) * 9).to(dtype)
                    if dtype is not torch.bool
                    else torch.rand(n, generator=g) > 0.5
                )
                if dtype.is_floating_point:
                    x[torch.rand(n, generator=g) < 0.1] = float("nan")
                x[torch.rand(n, generator=g) >= p] = fv
                fill = torch.tensor(fv, dtype=dtype)
                got = _merge.find_differ(x, fill)
                assert got is not None
                keys = sparsefill._tensor.parts.differs(x, fill).nonzero()[:, 0]
                assert torch.equal(got[0], keys)
                torch.testing.assert_close(got[1], x[keys], equal_nan=True, rtol=0, atol=0)
    x = (
        (torch.rand(6, 7, 9, generator=g) * 4).round().to(dtype)
        if dtype is not torch.bool
        else torch.rand(6, 7, 9, generator=g) > 0.6
    )
    for layout in (torch.sparse_coo, torch.sparse_csr):
        A = sparsefill.to_sparse(x, fill_value=fills[0], layout=layout)
        assert torch.equal(A.to_dense(), x)
        assert layout is torch.sparse_csr or A._nse() == int(
            (x != fills[0]).sum()
        )  # (batched CSR: nse per batch)


def test_find_differ_declines_what_it_cannot_read_by_address():
    """The compiled passes read ``x`` at its address: non-contiguous, negative-bit, complex, a fill of another
    dtype or shape, autograd recording: None (``x`` untouched), and ``to_sparse`` is right either way, its
    gradient included."""
    pytest.importorskip("numba", reason="find_differ is a numba kernel (without numba it declines)")
    g = torch.Generator().manual_seed(4)
    x = torch.randn(40, 30, generator=g).double()
    x[x.abs() < 1] = 2.0
    f = torch.tensor(2.0, dtype=torch.float64)
    for bad, fill in [
        (x.t(), f),
        (x._neg_view(), f),
        (x.to(torch.complex128), f.to(torch.complex128)),
        (x, f.float()),
        (x, f.expand(30)),
        (x.clone().requires_grad_(), f),
    ]:
        assert _merge.find_differ(bad, fill) is None
    for t in (x.t(), x._neg_view()):
        assert torch.equal(sparsefill.to_sparse(t, fill_value=2.0).to_dense(), t)
    w = x.clone().requires_grad_()
    A = sparsefill.to_sparse(w, fill_value=2.0)
    (A * 3).sum().backward()
    torch.testing.assert_close(w.grad, torch.full_like(x, 3.0))


# ---------------------------------------------------------------------- _merge.union_or_superset
@st.composite
def superset_pairs(draw):
    """Two SparseTensors of shape (20, 20), one pattern holding every key of the other, 17x+ larger (or one key
    outside, or an empty small one)."""
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.int64]))
    nbig = draw(st.integers(70, 300))
    keys = torch.randperm(400, generator=g)
    big = keys[:nbig].sort().values
    nsmall = draw(st.integers(0, nbig // 17))
    small = big[torch.randperm(nbig, generator=g)[:nsmall]]
    if nsmall and draw(st.booleans()):  # not a subset: the merge
        small = torch.cat([small[1:], keys[nbig : nbig + 1]])
    hybrid = draw(st.booleans())
    out = []
    for k in (big, small):
        k = k[torch.randperm(k.numel(), generator=g)]
        vals = random_values(g, (k.numel(),) + ((2,) if hybrid else ()), dtype, draw(st.booleans()))
        kind = draw(st.sampled_from(["zero", "value", "indefinite"]))
        fill = (
            sparsefill.indefinite
            if kind == "indefinite"
            else torch.tensor(
                draw(st.sampled_from(scalars(dtype))) if kind == "value" else 0, dtype=dtype
            )
        )
        T = sparsefill.sparse_coo_tensor(
            torch.stack([k // 20, k % 20]),
            vals,
            (20, 20) + ((2,) if hybrid else ()),
            fill_value=fill,
        ).coalesce()
        out.append(T.to_sparse_csr() if draw(st.booleans()) else T)
    if draw(st.booleans()):
        out.reverse()
    return out


@SETTINGS
@given(superset_pairs(), st.sampled_from(["add", "mul", "maximum", "sub"]))
def test_superset_union_matches_dense(pair, name):
    A, B = pair
    f = {"add": torch.add, "mul": torch.mul, "maximum": torch.maximum, "sub": torch.sub}[name]
    (a, ua), (b, ub) = dense_and_unspecified(A), dense_and_unspecified(B)
    signed = (
        name != "maximum"
    )  # (torch's own maximum(-0.0, 0.0) differs between its vectorized and scalar loops)
    if ua is None and ub is None:
        assert_identical(f(A, B), f(a, b), signed)
        assert_identical(f(A.to_sparse_coo(), B.to_sparse_coo()), f(a, b), signed)
    else:
        unspecified = (torch.zeros_like(a, dtype=torch.bool) if ua is None else ua) | (
            torch.zeros_like(b, dtype=torch.bool) if ub is None else ub
        )
        check_masked(f(A, B), f(a, b), unspecified, signed)


def test_superset_union_gradients():
    """A gradient's pattern beside the forward's (the case union_or_superset is for): values and fill gradients
    of ``A + B`` and ``A * B`` (B's pattern a 1/20 subset of A's) vs the dense computation at the pattern."""
    g = torch.Generator().manual_seed(3)
    keys = torch.randperm(400, generator=g)[:200].sort().values
    sub = keys[::20]
    for op in (torch.add, torch.mul):
        leaves, dense = [], []
        for k in (keys, sub):
            v = torch.randn(k.numel(), generator=g, dtype=torch.float64, requires_grad=True)
            f = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
            idx = torch.stack([k // 20, k % 20])
            leaves.append((sparsefill.sparse_coo_tensor(idx, v, (20, 20), fill_value=f), v, f))
            m = torch.zeros(20, 20, dtype=torch.bool)
            m[tuple(idx)] = True
            dense.append(
                torch.where(m, torch.zeros(20, 20, dtype=torch.float64).index_put(tuple(idx), v), f)
            )
        w = torch.randn(20, 20, generator=g, dtype=torch.float64)
        inputs = [t for _, v, f in leaves for t in (v, f)]
        got = torch.autograd.grad((op(leaves[0][0], leaves[1][0]).to_dense() * w).sum(), inputs)
        ref = torch.autograd.grad((op(dense[0], dense[1]) * w).sum(), inputs)
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b)


def test_union_caches_see_index_writes():
    """``union2``'s cache (small patterns) and the superset shortcut's (large ones) after an index tensor is
    written in place (still sorted): the new pattern's union, as dense."""
    keys = torch.arange(0, 400, 2)
    for big, small in ((keys[:3], keys[3:5]), (keys, keys[:5])):
        A = sparsefill.sparse_coo_tensor(
            torch.stack([big // 20, big % 20]), torch.ones(big.numel()), (20, 20), fill_value=0.5
        )
        B = sparsefill.sparse_coo_tensor(
            torch.stack([small // 20, small % 20]),
            torch.full((small.numel(),), 3.0),
            (20, 20),
            fill_value=1.0,
        )
        for _ in range(2):
            assert_identical(A + B, A.to_dense() + B.to_dense())
            assert_identical(A * B, A.to_dense() * B.to_dense())
            B.indices()[1, -1] = 19  # (the last key moves to the end of its row: still sorted)


def test_in_place_under_no_grad_is_seen_by_the_backward():
    """An optimizer-style ``A.mul_(2)`` under no_grad (``inplace_fast``) bumps the version: a backward that saved
    ``A`` raises as dense."""
    A = sparsefill.sparse_coo_tensor(
        [[0, 1, 2], [1, 0, 2]], [1.0, 2.0, 3.0], (3, 4), fill_value=0.5
    )
    for L in (A.detach().requires_grad_(), A.to_dense().requires_grad_()):
        y = (L * L.exp()).sum()
        with torch.no_grad():
            L.mul_(2.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.backward()
