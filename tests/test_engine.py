"""The engine boundary (sparsefill._engine) and the one-implementation helpers of sparsefill._reduce."""

import math

import pytest
import torch

from sparsefill import _engine
from sparsefill._reduce import segment_combine, segment_median, shifted_exp_sums, tie_counts


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
    assert _engine.choose("sum", torch.float32, unsorted=True, compiled=True, bag=True) == "numba_scatter"
    assert _engine.choose("sum", torch.float32, compiled=True, bag=True, one_column=True) == "numba_sorted"
    assert _engine.choose("sum", torch.float32, compiled=True, bag=True, one_column=True, gather=True) == \
        "embedding_bag"
    assert _engine.choose("prod", torch.float32, compiled=True, runs=True) == "segment_reduce"
    assert _engine.choose("sum", torch.int64, one_dim=True) == "scatter_add"
    assert _engine.choose("sum", torch.complex64) == "index_add"
    assert set(_engine.ENGINES) >= {"csr_mv", "embedding_bag", "scatter_reduce"}


def test_shifted_exp_sums_with_fills_is_logsumexp_and_softmax():
    v = torch.tensor([0., 1., 5., -math.inf])
    seg = torch.tensor([0, 0, 1, 2])
    f, n = torch.tensor(2.), torch.tensor([1, 0, 2])
    m = torch.tensor([2., 5., 2.])
    shifted, e, Z = shifted_exp_sums(v, seg, 3, m, fill=f, n_fill=n)
    dense = [torch.tensor([0., 1., 2.]), torch.tensor([5.]), torch.tensor([-math.inf, 2., 2.])]
    for s in range(3):
        torch.testing.assert_close(torch.log(Z[s]) + m[s], torch.logsumexp(dense[s], 0))
    torch.testing.assert_close(e / Z[seg], torch.cat([torch.softmax(dense[0], 0)[:2], torch.ones(1),
                                                      torch.zeros(1)]))


def test_tie_counts_match_torch_amax_backward_including_fills_and_nan():
    x = torch.tensor([3., 3., 1., math.nan, math.nan, 2.], requires_grad=True)
    seg = torch.tensor([0, 0, 0, 1, 1, 2])
    best = torch.tensor([3., math.nan, 2.])
    hit, count, nf = tie_counts(x.detach(), best, seg, 3, fill=torch.tensor(3.), n_fill=torch.tensor([2, 0, 1]),
                                nan=True)
    assert hit.tolist() == [True, True, False, True, True, True]
    assert count.tolist() == [4., 2., 1.] and nf.tolist() == [2., 0., 0.]


@pytest.mark.parametrize("fill", [0., 2., math.nan])
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
