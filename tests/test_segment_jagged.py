"""The keyed jagged batch (the spec's nested example) and the bridge to CSR SparseTensor."""

import random

import pytest
import torch
from torch.testing import assert_close

import sparsefill
from sparsefill import segment
from sparsefill.segment import KeyedJaggedBatch

SPEC = [{1: [10, 11], 3: [101]}, {1: [11], 2: [50], 3: [102, 103]}]


def random_batch(seed, B=6, keys=(1, 2, 3, 7)):
    rng = random.Random(seed)
    batch, weights = [], []
    for _ in range(B):
        ks = [k for k in keys if rng.random() < 0.6]
        rng.shuffle(ks)
        ex = {k: [rng.randrange(20) for _ in range(rng.randrange(0, 4))] for k in ks}
        batch.append(ex)
        weights.append({k: [rng.random() for _ in v] for k, v in ex.items()})
    return batch, weights


def test_spec_nested_example():
    kj = KeyedJaggedBatch.from_lists(SPEC)
    assert kj.values.tolist() == [10, 11, 101, 11, 50, 102, 103]
    assert kj.values_lengths.tolist() == [2, 1, 1, 1, 2]
    assert kj.keys.tolist() == [1, 3, 1, 2, 3]
    assert kj.example_lengths.tolist() == [2, 3]
    assert kj.to_dict() == SPEC


@pytest.mark.parametrize("seed", range(4))
def test_roundtrip_select_split_concat(seed):
    batch, weights = random_batch(seed)
    kj = KeyedJaggedBatch.from_lists(batch, weights=weights)
    d = kj.to_dict()
    assert [{k: v for k, (v, _) in ex.items()} for ex in d] == batch
    for keys in ([3, 1], [7], [2, 1, 3, 7], [5]):
        sel = kj.select_keys(keys).to_dict()
        assert sel == [{k: ex[k] for k in keys if k in ex} for ex in d]
    parts = kj.split([2, 0, 4])
    assert [p.batch_size for p in parts] == [2, 0, 4]
    assert sum((p.to_dict() for p in parts), []) == d
    assert KeyedJaggedBatch.concat(parts).to_dict() == d


def test_to_padded_and_pooled():
    batch, weights = random_batch(9)
    kj = KeyedJaggedBatch.from_lists(batch, weights=weights)
    keys = [1, 2, 3, 7]
    padded, mask = kj.to_padded(keys, pad_value=-1)
    L = padded.shape[2]
    for e, ex in enumerate(batch):
        for j, k in enumerate(keys):
            ids = ex.get(k, [])
            assert padded[e, j].tolist() == ids + [-1] * (L - len(ids))
            assert mask[e, j].tolist() == [True] * len(ids) + [False] * (L - len(ids))
    g = torch.Generator().manual_seed(0)
    tables = {k: torch.randn(20, 3, generator=g, dtype=torch.float64) for k in keys}
    for reducer in ("sum", "mean", "max", "weighted_sum"):
        pooled = kj.pooled(tables, reducer)
        for k in keys:
            for e, ex in enumerate(batch):
                ids = ex.get(k, [])
                if not ids:
                    expect = torch.zeros(3, dtype=torch.float64)
                elif reducer == "weighted_sum":
                    w = torch.tensor(weights[e][k], dtype=torch.float64)
                    expect = (tables[k][ids] * w[:, None]).sum(0)
                else:
                    rows = tables[k][ids]
                    expect = {"sum": rows.sum(0), "mean": rows.mean(0), "max": rows.amax(0)}[reducer]
                assert_close(pooled[k][e], expect)
    # one shared table, gradients flow into it
    t = torch.randn(20, 2, dtype=torch.float64, requires_grad=True)
    out = kj.pooled(t, "sum")
    sum(o.sum() for o in out.values()).backward()
    counts = torch.bincount(kj.values, minlength=20).double()
    assert_close(t.grad, counts[:, None].expand(20, 2))


def test_jagged_errors():
    with pytest.raises(ValueError, match="example_lengths sum to 3, but the data has 2 rows"):
        KeyedJaggedBatch(torch.tensor([1, 2]), torch.tensor([1, 1]), torch.tensor([0, 1]), torch.tensor([3]))
    with pytest.raises(ValueError, match="values_lengths has 1 entries but keys has 2"):
        KeyedJaggedBatch(torch.tensor([1, 2]), torch.tensor([2]), torch.tensor([0, 1]), torch.tensor([2]))
    kj = KeyedJaggedBatch.from_lists(SPEC)
    with pytest.raises(ValueError, match="sizes"):
        kj.split([1, 2])
    with pytest.raises(ValueError, match="distinct"):
        kj.select_keys([1, 1])


# ---- CSR bridge --------------------------------------------------------------------------------
@pytest.mark.parametrize("D", [(), (2,)])
def test_to_sparse_csr_is_the_padded_form(D):
    lengths = torch.tensor([2, 0, 3, 1])
    data = torch.randn(6, *D, dtype=torch.float64)
    A = segment.to_sparse_csr(data, lengths, fill_value=-2.0)
    assert isinstance(A, sparsefill.SparseTensor) and A.sparse_layout == torch.sparse_csr
    assert_close(A.to_dense(), segment.pack_segments(data, lengths, pad_value=-2.0))
    v, l, c = segment.from_sparse_csr(A)
    assert_close(v, data)
    assert l.tolist() == lengths.tolist()
    assert c.tolist() == segment.lengths_range_fill(lengths).tolist()
    assert segment.to_sparse_csr(data, lengths, num_columns=5).shape == (4, 5, *D)
    x = data.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda x: segment.to_sparse_csr(x, lengths, fill_value=1.0).to_dense(), (x,))
    with pytest.raises(ValueError, match="num_columns = 2 is shorter than the longest segment \\(3\\)"):
        segment.to_sparse_csr(data, lengths, num_columns=2)


def test_ids_to_sparse_duplicates_add_and_row_sums():
    ids = torch.tensor([1, 3, 2, 3, 5, 3])
    lengths = torch.tensor([2, 0, 4])
    w = torch.tensor([0.4, 0.7, 0.5, 0.5, 0.1, 2.0])
    A = segment.ids_to_sparse(ids, lengths, 6, weights=w)
    dense = torch.zeros(3, 6)
    for s, (o, n) in enumerate(zip([0, 2, 2], lengths.tolist())):
        for i in range(o, o + n):
            dense[s, ids[i]] += w[i]
    assert_close(A.to_dense(), dense)
    # row sums of the sparse reading = the weighted segment sums of the weights
    assert_close(A.to_dense().sum(1), segment.lengths_sum(w, lengths))
    with pytest.raises(IndexError, match=r"ids\[4\] = 5 is out of range for 5 columns"):
        segment.ids_to_sparse(ids, lengths, 5)


@pytest.mark.parametrize("backend", ["numba", "torch"] if segment.compiled_available() else ["torch"])
@pytest.mark.parametrize("fill", [0.0, 1.5, -3.0, float("-inf"), "indefinite"])
@pytest.mark.parametrize("reducer", ["sum", "mean", "max", "min", "prod", "logsumexp"])
def test_csr_row_reduce_equals_dense(backend, fill, reducer):
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([0, 3, 5, 1, 2])
    ncols = 5
    cols = torch.cat([torch.randperm(ncols, generator=g)[:n].sort().values for n in lengths.tolist()])
    vals = torch.randn(int(lengths.sum()), generator=g, dtype=torch.float64)
    crow = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    fv = sparsefill.indefinite if fill == "indefinite" else fill
    A = sparsefill.sparse_csr_tensor(crow, cols, vals, (5, ncols), fill_value=fv)
    with segment.use_backend(backend):
        got = segment.csr_row_reduce(A, reducer)
    if fill == "indefinite":  # masked: the stored values only (empty rows: the reducer's identity / nan)
        dense = torch.full((5, ncols), float("nan"), dtype=torch.float64)
        mask = torch.zeros(5, ncols, dtype=torch.bool)
        rows = torch.repeat_interleave(torch.arange(5), lengths)
        dense[rows, cols], mask[rows, cols] = vals, True
        expect = torch.stack([_dense_reduce(dense[s][mask[s]], reducer) for s in range(5)])
    else:
        expect = torch.stack([_dense_reduce(row, reducer) for row in A.to_dense()])
    assert_close(got, expect, equal_nan=True)


def _dense_reduce(row, reducer):
    f = {"sum": torch.sum, "mean": torch.mean, "prod": torch.prod, "logsumexp": lambda r: torch.logsumexp(r, 0),
         "max": lambda r: r.amax() if r.numel() else torch.tensor(float("-inf"), dtype=r.dtype),
         "min": lambda r: r.amin() if r.numel() else torch.tensor(float("inf"), dtype=r.dtype)}[reducer]
    return f(row)
