"""The engine boundary (sparsefill._kernels.engine) and the one-implementation helpers of sparsefill._kernels.reducer."""

import math

import pytest
import torch

from sparsefill._kernels import engine as _engine
from sparsefill._kernels.reducer import (
    segment_combine,
    segment_median,
    shifted_exp_sums,
    tie_counts,
)


@pytest.mark.parametrize("mode", ["sum", "prod", "amax", "amin"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
@pytest.mark.parametrize("width", [None, 3])
def test_every_engine_of_segment_combine_gives_the_dense_reduction(mode, dtype, width):
    """Runs (segment_reduce), 1-D ids (scatter_add / scatter_reduce) and 2-D ids (index_add) against the dense op."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([2, 0, 3, 1])
    seg = torch.repeat_interleave(torch.arange(4), lengths)
    v = torch.randint(-3, 4, (6,) if width is None else (6, width), generator=g).to(dtype)
    dense = {"sum": torch.sum, "prod": torch.prod, "amax": torch.amax, "amin": torch.amin}[mode]
    for kw in ({}, {"lengths": lengths}):
        out = segment_combine(v, seg, 4, mode, **kw)
        for s in range(4):
            part = v[seg == s]
            if part.shape[0]:
                torch.testing.assert_close(out[s], dense(part, 0).to(out.dtype))


def test_choose_names_one_engine_per_plan():
    assert _engine.choose("sum", torch.float32, traced=True, runs=True) == "index_add"
    assert _engine.choose("amax", torch.float32, traced=True) == "scatter_reduce"
    assert _engine.choose("sum", torch.float64, csr_rows=True, runs=True) == "csr_mv"
    assert (
        _engine.choose("sum", torch.float32, unsorted=True, compiled=True, bag=True)
        == "numba_scatter"
    )
    assert (
        _engine.choose("sum", torch.float32, compiled=True, bag=True, one_column=True)
        == "numba_sorted"
    )
    assert (
        _engine.choose("sum", torch.float32, compiled=True, bag=True, one_column=True, gather=True)
        == "embedding_bag"
    )
    assert _engine.choose("prod", torch.float32, compiled=True, runs=True) == "segment_reduce"
    assert _engine.choose("sum", torch.int64, one_dim=True) == "scatter_add"
    assert _engine.choose("sum", torch.complex64) == "index_add"
    assert set(_engine.ENGINES) >= {"csr_mv", "embedding_bag", "scatter_reduce"}


def test_shifted_exp_sums_with_fills_is_logsumexp_and_softmax():
    v = torch.tensor([0.0, 1.0, 5.0, -math.inf])
    seg = torch.tensor([0, 0, 1, 2])
    f, n = torch.tensor(2.0), torch.tensor([1, 0, 2])
    m = torch.tensor([2.0, 5.0, 2.0])
    shifted, e, Z = shifted_exp_sums(v, seg, 3, m, fill=f, n_fill=n)
    dense = [
        torch.tensor([0.0, 1.0, 2.0]),
        torch.tensor([5.0]),
        torch.tensor([-math.inf, 2.0, 2.0]),
    ]
    for s in range(3):
        torch.testing.assert_close(torch.log(Z[s]) + m[s], torch.logsumexp(dense[s], 0))
    torch.testing.assert_close(
        e / Z[seg], torch.cat([torch.softmax(dense[0], 0)[:2], torch.ones(1), torch.zeros(1)])
    )


def test_tie_counts_match_torch_amax_backward_including_fills_and_nan():
    x = torch.tensor([3.0, 3.0, 1.0, math.nan, math.nan, 2.0], requires_grad=True)
    seg = torch.tensor([0, 0, 0, 1, 1, 2])
    best = torch.tensor([3.0, math.nan, 2.0])
    hit, count, nf = tie_counts(
        x.detach(), best, seg, 3, fill=torch.tensor(3.0), n_fill=torch.tensor([2, 0, 1]), nan=True
    )
    assert hit.tolist() == [True, True, False, True, True, True]
    assert count.tolist() == [4.0, 2.0, 1.0] and nf.tolist() == [2.0, 0.0, 0.0]


@pytest.mark.parametrize("fill", [0.0, 2.0, math.nan])
def test_segment_median_index_points_at_the_lower_median(fill):
    g = torch.Generator().manual_seed(1)
    v = torch.randint(0, 4, (12,), generator=g).float()
    seg = torch.sort(torch.randint(0, 4, (12,), generator=g)).values
    n = torch.tensor([0, 3, 1, 2])
    med, which = segment_median(v, seg, 4, fill=torch.tensor(fill), n_fill=n, return_index=True)
    for s in range(4):
        x = torch.cat([v[seg == s], torch.full((int(n[s]),), fill)])
        torch.testing.assert_close(med[s], x.nanmedian(), equal_nan=True)
        i = int(which[s])
        if i < 0:
            assert bool(torch.isnan(x).all())
        else:
            assert (v[i] if i < 12 else torch.tensor(fill)).item() == med[s].item()
            assert i >= 12 or int(seg[i]) == s


# ---------------------------------------------------------------------- the engines run at the boundary
def _csr(lengths, ncols, seed=0, dtype=torch.float64, dense=()):
    g = torch.Generator().manual_seed(seed)
    cols = torch.cat(
        [torch.randperm(ncols, generator=g)[:n].sort().values for n in lengths.tolist()]
    )
    crow = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    vals = torch.randn((int(lengths.sum()), *dense), generator=g, dtype=torch.float64).to(dtype)
    return crow, cols, vals


@pytest.mark.parametrize("mode", ["sum", "prod", "amax", "amin"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
@pytest.mark.parametrize("dense", [(), (2,)])
@pytest.mark.parametrize("compiled", [False, True])
def test_csr_rows_give_the_dense_row_reduction_on_every_engine(mode, dtype, dense, compiled):
    """``segment_combine`` over CSR rows (csr_mv for 1-D float sums, the compiled sorted kernels for max/min
    where numba loads, the runs or scatter forms otherwise), every row or a subset of them, against the
    dense op of each row's stored values (an empty row: the identity)."""
    from sparsefill import segment

    if compiled and not segment.compiled_available():
        pytest.skip("numba is not installed: the compiled engines do not exist here")
    lengths = torch.tensor([2, 0, 3, 1, 4])
    crow, col, v = _csr(lengths, 6, dtype=dtype, dense=dense)
    dense_op = {"sum": torch.sum, "prod": torch.prod, "amax": torch.amax, "amin": torch.amin}[mode]
    seg = torch.repeat_interleave(torch.arange(5), lengths)
    for rows in (None, torch.tensor([0, 2, 3, 4])):  # every row; the non-empty rows
        sel = torch.arange(5) if rows is None else rows
        lens = lengths[sel]
        ids = torch.repeat_interleave(torch.arange(sel.numel()), lens)
        out = segment_combine(
            v,
            ids,
            sel.numel(),
            mode,
            lengths=lens,
            csr=_engine.CsrRows(crow, col, 6, rows, compiled=compiled),
        )
        assert out.shape == (sel.numel(), *dense)
        for i, s in enumerate(sel.tolist()):
            part = v[seg == s]
            if part.shape[0]:
                torch.testing.assert_close(out[i], dense_op(part, 0).to(out.dtype))
            else:
                assert (out[i] == segment_combine(v[:0], seg[:0], 1, mode)[0]).all()  # the identity


def test_run_names_the_engine_it_runs():
    """``_kernels.engine.run`` of each engine ``choose`` can name for a plan gives the same sums."""
    lengths = torch.tensor([2, 0, 3])
    crow, col, v = _csr(lengths, 4)
    seg = torch.repeat_interleave(torch.arange(3), lengths)
    ref = torch.stack([v[seg == s].sum() for s in range(3)])
    csr = _engine.CsrRows(crow, col, 4)
    for engine in ("csr_mv", "segment_reduce", "scatter_add", "index_add", "scatter_reduce"):
        out = _engine.run(engine, "sum", v, seg, 3, 0.0, lengths=lengths, csr=csr)
        torch.testing.assert_close(out, ref, msg=engine)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_csr_mv_reads_int32_indices_alike(dtype):
    """``spmv_index``: int32 copies of a CPU pattern's indices (None for int32 input or sizes past int32);
    ``csr_mv`` on them gives the row sums and the values' gradient of the int64 indices, every row or some."""
    lengths = torch.tensor([2, 0, 3, 1])
    crow, col, v = _csr(lengths, 5, dtype=dtype)
    index32 = _engine.spmv_index(crow, col, 5)
    assert [t.dtype for t in index32] == [torch.int32, torch.int32]
    assert torch.equal(index32[0].long(), crow) and torch.equal(index32[1].long(), col)
    assert _engine.spmv_index(*index32, 5) is None and _engine.spmv_index(crow, col, 2**31) is None
    for rows in (None, torch.tensor([0, 2, 3])):
        outs = []
        for idx in (None, index32):
            x = v.clone().requires_grad_()
            out = _engine.run(
                "csr_mv", "sum", x, None, 4, 0, csr=_engine.CsrRows(crow, col, 5, rows, False, idx)
            )
            (out * torch.arange(1.0, out.numel() + 1, dtype=dtype)).sum().backward()
            outs.append((out.detach(), x.grad))
        torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
        seg = torch.repeat_interleave(torch.arange(4), lengths)
        ref = torch.stack([v[seg == s].sum() for s in range(4)])
        torch.testing.assert_close(outs[1][0], ref if rows is None else ref[rows])


@pytest.mark.filterwarnings("ignore:var.*degrees of freedom")  # (var of one fill: torch warns too)
@pytest.mark.parametrize(
    "name", ["sum", "prod", "amax", "amin", "mean", "logsumexp", "var", "norm"]
)
@pytest.mark.parametrize("fill", [2.5, -0.5, 0.0, math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("n", [0, 1, 3])
def test_of_fills_is_the_reducer_on_fills_only(name, fill, n):
    from sparsefill._kernels.reducer import REDUCERS

    r = REDUCERS[name]
    f = torch.tensor(fill, dtype=torch.float64)
    empty = torch.zeros(0, dtype=torch.float64)
    ref = r(empty, torch.zeros(0, dtype=torch.int64), 1, fill=f, n_fill=torch.tensor([n]))[0]
    torch.testing.assert_close(r.of_fills(f, n, torch.float64), ref, equal_nan=True)
    dense = r.dense(f.expand(n)) if n else ref  # (the reference reduction of n fills)
    torch.testing.assert_close(
        r.of_fills(f, n, torch.float64), dense.to(torch.float64), equal_nan=True
    )


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool])
def test_of_fills_of_integers_and_bool_follow_torch_dtypes(dtype):
    from sparsefill._kernels.reducer import REDUCERS

    f = torch.tensor(1, dtype=dtype)
    for name in ("sum", "prod", "amax", "amin"):
        got = REDUCERS[name].of_fills(f, 3, dtype)
        ref = REDUCERS[name].dense(f.expand(3))
        assert got.dtype == ref.dtype and got.item() == ref.item(), name


@pytest.mark.parametrize("backend", ["numba", "torch"])
@pytest.mark.parametrize("reducer", ["sum", "mean", "max", "min", "logsumexp", "prod"])
def test_csr_row_reduce_values_and_gradients_with_ties_between_stored_and_fill(backend, reducer):
    """``segment.csr_row_reduce`` through the protocol on either segment backend: values and gradients as on
    the dense matrix, a stored value tied with the fill included (max/min split the gradient among them)."""
    import sparsefill
    from sparsefill import segment

    if backend == "numba" and not segment.compiled_available():
        pytest.skip("numba is not installed: the compiled backend does not exist here")
    v = torch.tensor([5.0, -1.0, 3.0, 2.0], dtype=torch.float64, requires_grad=True)
    A = sparsefill.sparse_csr_tensor([0, 2, 3, 3, 4], [0, 3, 1, 2], v, (4, 4), fill_value=2.0)
    with segment.use_backend(backend):
        out = segment.csr_row_reduce(A, reducer)
    v2 = v.detach().clone().requires_grad_()
    dense = torch.full((4, 4), 2.0, dtype=torch.float64).index_put(
        (torch.tensor([0, 0, 1, 3]), torch.tensor([0, 3, 1, 2])), v2
    )
    ref = {
        "sum": dense.sum(1),
        "mean": dense.mean(1),
        "max": dense.amax(1),
        "min": dense.amin(1),
        "logsumexp": dense.logsumexp(1),
        "prod": dense.prod(1),
    }[reducer]
    torch.testing.assert_close(out, ref)
    w = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    (out * w).sum().backward()
    (ref * w).sum().backward()
    torch.testing.assert_close(v.grad, v2.grad)


def test_sorted_runs_small_and_large_key_ranges():
    from sparsefill._kernels.grouping import sorted_runs

    keys = torch.tensor([0, 0, 3, 3, 3, 7])
    for nkeys in (8, 10**9):  # a CSR compression, and unique_consecutive
        out, seg, counts = sorted_runs(keys, nkeys)
        assert (
            out.tolist() == [0, 3, 7]
            and seg.tolist() == [0, 0, 1, 1, 1, 2]
            and counts.tolist() == [2, 3, 1]
        )
    out, seg, counts = sorted_runs(
        torch.tensor([0, 1, 1, 2]), 3
    )  # every key present: the keys are the ids
    assert seg.tolist() == [0, 1, 1, 2] and counts.tolist() == [1, 2, 1]
