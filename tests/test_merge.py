"""Linear-time merges of sorted key runs (sparsefill._merge) against torch.unique / set intersection, the compiled
(numba) path against the torch fallback, and the element-wise ops that use them (``A + B`` of different
patterns, COO/CSR/hybrid, indefinite fills) against the dense result."""

import pytest
import torch

import sparsefill
from sparsefill import _merge

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
PATHS = [False, pytest.param(True, marks=pytest.mark.skipif(not _merge._compiled(), reason="numba not installed"))]


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
        for r, s in zip(got, _merge.merge_union(x, y, compiled=not compiled) if _merge._compiled() else got):
            assert torch.equal(r, s)
        got = _merge.merge_intersect(x, y, compiled=compiled)
        _check_intersect(x, y, got)
        for r, s in zip(got, _merge.merge_intersect(x, y, compiled=not compiled) if _merge._compiled() else got):
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


@pytest.fixture(params=["search", "unique", pytest.param("numba", marks=pytest.mark.skipif(
    not _merge._compiled(), reason="numba not installed"))])
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
    A, B = _pair(kind, (6, 9), dense, g, layout, (1.0, torch.arange(2.0, 2.0 + (dense or (1,))[0], dtype=torch.float64).reshape(dense)))
    torch.testing.assert_close((A + B).to_dense(), A.to_dense() + B.to_dense())
    torch.testing.assert_close((B * A).to_dense(), B.to_dense() * A.to_dense())
    torch.testing.assert_close(torch.maximum(A, B).to_dense(), torch.maximum(A.to_dense(), B.to_dense()))
    # the pattern is the union of the operands' (positions of the sparse dims, ascending), in A's layout
    S = (6, 9)
    ka, kb = (_keys(T, S) for T in (A, B))
    assert torch.equal(_keys(A + B, S), torch.unique(torch.cat([ka, kb])))


def _keys(T, S):
    from sparsefill._convert import coalesced_parts
    from sparsefill._index import linearize
    return linearize(coalesced_parts(T)[0], S)


@pytest.mark.parametrize("dense", [(), (2,)])
@pytest.mark.parametrize("kind", KINDS)
def test_indefinite_operands_keep_the_intersection(merge_path, kind, dense):
    g = torch.Generator().manual_seed(len(kind) + 1)
    A, B = _pair(kind, (5, 8), dense, g, torch.sparse_coo, (sparsefill.indefinite, sparsefill.indefinite))
    C = A - B
    ka, kb = _keys(A, (5, 8)), _keys(B, (5, 8))
    assert torch.equal(_keys(C, (5, 8)), ka[torch.isin(ka, kb)])
    zero = torch.zeros(dense, dtype=torch.float64)
    sel = tuple(torch.unravel_index(_keys(C, (5, 8)), (5, 8)))
    got = C.to_dense(fill_value=zero)[sel]
    torch.testing.assert_close(got, A.to_dense(fill_value=zero)[sel] - B.to_dense(fill_value=zero)[sel])


@pytest.mark.parametrize("kind", KINDS)
def test_one_indefinite_operand_keeps_its_pattern(merge_path, kind):
    g = torch.Generator().manual_seed(len(kind) + 2)
    A, B = _pair(kind, (5, 8), (), g, torch.sparse_coo, (sparsefill.indefinite, 1.5))
    C = B + A
    assert torch.equal(_keys(C, (5, 8)), _keys(A, (5, 8)))
    torch.testing.assert_close(C.to_dense(fill_value=0.0), torch.where(
        A.to_dense(fill_value=float("nan")).isnan(), 0.0, B.to_dense() + A.to_dense(fill_value=0.0)))


def test_add_near_the_largest_keys(merge_path):
    """Keys near 2**62 (a (2**31, 2**31) sparse shape)."""
    n = 1 << 31
    ia = torch.tensor([[n - 3, n - 1, n - 1], [5, 0, n - 1]])
    ib = torch.tensor([[0, n - 1, n - 1], [0, 0, n - 2]])
    A = sparsefill.sparse_coo_tensor(ia, torch.tensor([1., 2., 3.]), (n, n), fill_value=1.0)
    B = sparsefill.sparse_coo_tensor(ib, torch.tensor([10., 20., 30.]), (n, n), fill_value=2.0)
    C = (A + B).coalesce()
    assert C._indices().tolist() == [[0, n - 3, n - 1, n - 1, n - 1], [0, 5, 0, n - 2, n - 1]]
    assert C._values().tolist() == [11., 3., 22., 31., 5.]
    assert C.fill_value().item() == 3.0


def test_distributed_combine_of_three_patterns(merge_path):
    """The n-run fold through a caller: ``combine(SUM, [A, B, C])`` (distributed reductions) == the dense sum."""
    from torch.distributed import ReduceOp

    from sparsefill.distributed._combine import combine
    g = torch.Generator().manual_seed(3)
    Ts = [sparsefill.sparse_coo_tensor(torch.stack(torch.unravel_index(k, (4, 7))), torch.randn(k.numel(), 2,
          generator=g, dtype=torch.float64), (4, 7, 2), fill_value=f)
          for k, f in zip(_runs("random", 9, g) + _runs("inside", 9, g), (0.5, 1.0, -2.0, 0.0))]
    ref = sum(T.to_dense() for T in Ts)
    torch.testing.assert_close(combine(ReduceOp.SUM, Ts).to_dense(), ref)
    torch.testing.assert_close(combine(ReduceOp.MAX, Ts[:3]).to_dense(),
                               torch.stack([T.to_dense() for T in Ts[:3]]).amax(0))


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
