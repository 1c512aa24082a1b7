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
                    expect = {"sum": rows.sum(0), "mean": rows.mean(0), "max": rows.amax(0)}[
                        reducer
                    ]
                assert_close(pooled[k][e], expect)
    # one shared table, gradients flow into it
    t = torch.randn(20, 2, dtype=torch.float64, requires_grad=True)
    out = kj.pooled(t, "sum")
    sum(o.sum() for o in out.values()).backward()
    counts = torch.bincount(kj.values, minlength=20).double()
    assert_close(t.grad, counts[:, None].expand(20, 2))


def _pooled_by_loop(batch, tables, keys, reducer, weights=None):
    """The golden reference: per key and example, the listed rows of the key's table reduced in Python."""
    out = {}
    for k in keys:
        t = tables[k] if isinstance(tables, dict) else tables
        rows = []
        for e, ex in enumerate(batch):
            ids = ex.get(k, [])
            x = t[ids]
            if not ids:
                rows.append(torch.zeros(t.shape[1:], dtype=t.dtype))
            elif reducer == "weighted_sum":
                rows.append((x * torch.tensor(weights[e][k], dtype=t.dtype)[:, None]).sum(0))
            else:
                rows.append({"sum": x.sum(0), "mean": x.mean(0), "max": x.amax(0)}[reducer])
        out[k] = torch.stack(rows) if rows else torch.zeros(0, *t.shape[1:], dtype=t.dtype)
    return out


@pytest.mark.parametrize(
    "backend", ["numba", "torch"] if segment.compiled_available() else ["torch"]
)
@pytest.mark.parametrize(
    "case",
    [
        "random",
        "key order",
        "repeated key",
        "absent key",
        "no examples",
        "no entries",
        "large and negative keys",
        "shared table",
    ],
)
def test_pooled_per_key_layout(case, backend):
    """pooled groups the ids by (key, example) once for all keys: against a loop over the lists for keys
    in any order, a key asked twice (pooled once), a key no example has (the empty value), an empty batch,
    examples with no entries, key ids far apart and negative, one shared table; the sparse gradient of
    each table equals the dense one."""
    batch, weights = random_batch(11, B=7)
    keys = [1, 2, 3, 7]
    if case == "key order":
        keys = [7, 3, 1, 2]
    elif case == "repeated key":
        keys = [3, 1, 3]
    elif case == "absent key":
        keys = [1, 99]
    elif case == "no examples":
        batch, weights = [], []
    elif case == "no entries":
        batch, weights = [{}, {}, {}], [{}, {}, {}]
    elif case == "large and negative keys":
        remap = {1: -5, 2: 1 << 40, 3: 0, 7: 64}
        batch = [{remap[k]: v for k, v in ex.items()} for ex in batch]
        weights = [{remap[k]: v for k, v in ex.items()} for ex in weights]
        keys = [1 << 40, -5, 64, 0]
    g = torch.Generator().manual_seed(1)
    shared = case == "shared table"
    tables = (
        torch.randn(20, 3, generator=g, dtype=torch.float64)
        if shared
        else {k: torch.randn(20, 3, generator=g, dtype=torch.float64) for k in keys}
    )
    kj = KeyedJaggedBatch.from_lists(batch, weights=weights)
    want_keys = list(dict.fromkeys(keys))
    for reducer in ("sum", "mean", "max", "weighted_sum"):
        with segment.use_backend(backend):  # (numba: the lists gathered by the compiled kernel)
            got = kj.pooled(tables, reducer, keys=keys)
        assert list(got) == want_keys
        expect = _pooled_by_loop(batch, tables, want_keys, reducer, weights)
        for k in want_keys:
            assert got[k].shape == (len(batch), 3)
            assert_close(got[k], expect[k])
    leaves = {k: (tables if shared else tables[k]).clone().requires_grad_() for k in want_keys[:1]}
    dense = {k: t.detach().clone().requires_grad_() for k, t in leaves.items()}
    for ts, sparse in ((leaves, True), (dense, False)):
        out = kj.pooled(ts, "sum", keys=list(ts), sparse_grad=sparse)
        sum((o * torch.arange(1.0, 4.0, dtype=o.dtype)).sum() for o in out.values()).backward()
    for k in leaves:
        assert leaves[k].grad.is_sparse
        assert_close(leaves[k].grad.to_dense(), dense[k].grad)
    # weights that require grad: their gradient (each id's row, dotted with the upstream gradient)
    w = kj.weights.clone().requires_grad_()
    kjw = KeyedJaggedBatch(kj.values, kj.values_lengths, kj.keys, kj.example_lengths, w)
    table = torch.randn(20, 3, generator=g, dtype=torch.float64)
    with segment.use_backend(backend):
        sum(o.sum() for o in kjw.pooled(table, "weighted_sum", keys=want_keys).values()).backward()
    wanted = torch.isin(
        torch.repeat_interleave(kj.keys, kj.values_lengths), torch.tensor(want_keys)
    )
    assert_close(w.grad, torch.where(wanted, table.sum(1)[kj.values], 0.0).to(w.dtype))


def test_jagged_errors():
    with pytest.raises(ValueError, match="example_lengths sum to 3, but the data has 2 rows"):
        KeyedJaggedBatch(
            torch.tensor([1, 2]), torch.tensor([1, 1]), torch.tensor([0, 1]), torch.tensor([3])
        )
    with pytest.raises(ValueError, match="values_lengths has 1 entries but keys has 2"):
        KeyedJaggedBatch(
            torch.tensor([1, 2]), torch.tensor([2]), torch.tensor([0, 1]), torch.tensor([2])
        )
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
    assert torch.autograd.gradcheck(
        lambda x: segment.to_sparse_csr(x, lengths, fill_value=1.0).to_dense(), (x,)
    )
    with pytest.raises(
        ValueError, match="num_columns = 2 is shorter than the longest segment \\(3\\)"
    ):
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


@pytest.mark.parametrize(
    "backend", ["numba", "torch"] if segment.compiled_available() else ["torch"]
)
@pytest.mark.parametrize("fill", [0.0, 1.5, -3.0, float("-inf"), "indefinite"])
@pytest.mark.parametrize("reducer", ["sum", "mean", "max", "min", "prod", "logsumexp"])
def test_csr_row_reduce_equals_dense(backend, fill, reducer):
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([0, 3, 5, 1, 2])
    ncols = 5
    cols = torch.cat(
        [torch.randperm(ncols, generator=g)[:n].sort().values for n in lengths.tolist()]
    )
    vals = torch.randn(int(lengths.sum()), generator=g, dtype=torch.float64)
    crow = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    fv = sparsefill.indefinite if fill == "indefinite" else fill
    A = sparsefill.sparse_csr_tensor(crow, cols, vals, (5, ncols), fill_value=fv)
    with segment.use_backend(backend):
        got = segment.csr_row_reduce(A, reducer)
    if (
        fill == "indefinite"
    ):  # masked: the stored values only (empty rows: the reducer's identity / nan)
        dense = torch.full((5, ncols), float("nan"), dtype=torch.float64)
        mask = torch.zeros(5, ncols, dtype=torch.bool)
        rows = torch.repeat_interleave(torch.arange(5), lengths)
        dense[rows, cols], mask[rows, cols] = vals, True
        expect = torch.stack([_dense_reduce(dense[s][mask[s]], reducer) for s in range(5)])
    else:
        expect = torch.stack([_dense_reduce(row, reducer) for row in A.to_dense()])
    assert_close(got, expect, equal_nan=True)


def _dense_reduce(row, reducer):
    f = {
        "sum": torch.sum,
        "mean": torch.mean,
        "prod": torch.prod,
        "logsumexp": lambda r: torch.logsumexp(r, 0),
        "max": lambda r: r.amax() if r.numel() else torch.tensor(float("-inf"), dtype=r.dtype),
        "min": lambda r: r.amin() if r.numel() else torch.tensor(float("inf"), dtype=r.dtype),
    }[reducer]
    return f(row)


# ---- validate=, the vectorised checks and to_dict against the previous implementation -------------------
def _old_check_lengths(lengths, total, name):
    """check_lengths as it was (torch reductions), the reference for the messages."""
    if lengths.numel() and int(lengths.min()) < 0:
        i = int((lengths < 0).nonzero()[0, 0])
        raise ValueError(f"{name} must be non-negative, got {name}[{i}] = {int(lengths[i])}")
    s = int(lengths.sum())
    if s != total:
        raise ValueError(f"{name} sum to {s}, but the data has {total} rows along dim 0")


def _old_validate(values, values_lengths, keys, example_lengths, weights=None):
    """KeyedJaggedBatch.__post_init__ before the vectorised checks (a unique over (example, key) pairs)."""
    from sparsefill._kernels.segment_check import as_index

    vl, k, el = (
        as_index(t, n, values.device).long()
        for t, n in (
            (values_lengths, "values_lengths"),
            (keys, "keys"),
            (example_lengths, "example_lengths"),
        )
    )
    _old_check_lengths(el, k.numel(), "example_lengths")
    if vl.numel() != k.numel():
        raise ValueError(
            f"values_lengths has {vl.numel()} entries but keys has {k.numel()} (one per (example, key))"
        )
    _old_check_lengths(vl, values.shape[0] if values.dim() else 0, "values_lengths")
    if k.numel() > 1:
        ex = torch.repeat_interleave(torch.arange(el.numel()), el, output_size=k.numel())
        pairs = torch.stack([ex, k], 1)
        _, inv, cnt = torch.unique(pairs, dim=0, return_inverse=True, return_counts=True)
        if bool((cnt > 1).any()):
            e, key = pairs[int((cnt[inv] > 1).nonzero()[0, 0])].tolist()
            raise ValueError(f"key {key} appears more than once in example {e}")
    if weights is not None and weights.shape[:1] != values.shape[:1]:
        raise ValueError(
            f"weights must have one entry per value ({values.shape[0]}), got shape "
            f"{tuple(weights.shape)}"
        )


def _old_to_dict(kj):
    """KeyedJaggedBatch.to_dict before (a loop reading one tensor element at a time): the golden reference."""
    vals = kj.values.tolist()
    ws = None if kj.weights is None else kj.weights.tolist()
    out, k, v = [], 0, 0
    for n_keys in kj.example_lengths.tolist():
        ex = {}
        for _ in range(n_keys):
            n = int(kj.values_lengths[k])
            ex[int(kj.keys[k])] = (
                vals[v : v + n] if ws is None else (vals[v : v + n], ws[v : v + n])
            )
            k, v = k + 1, v + n
        out.append(ex)
    return out


# the paths of the repeated-key test: residues (ids < 64), a table of counts, one int64 code sorted, two sorts
_KEY_SPACES = {"small": (0, 8), "wide": (-3, 200), "large": (0, 10**6), "huge": (-(2**62), 2**62)}


def _random_parts(seed, keyspace="small", B=7, dup=False, ids_dtype=torch.int64):
    """Random (values, values_lengths, keys, example_lengths, weights): empty examples and lists included;
    ``dup``: one key repeated within one example."""
    rng = random.Random(seed)
    lo, hi = _KEY_SPACES[keyspace]
    pool = sorted({rng.randint(lo, hi) for _ in range(12)} | {lo, hi})
    keys, elen = [], []
    for _ in range(B):
        ks = rng.sample(pool, rng.randint(0, min(5, len(pool))))
        keys += ks
        elen.append(len(ks))
    if dup:
        e = rng.choice([i for i, n in enumerate(elen) if n] or [0])
        if not elen[e]:
            elen[e], keys = 1, keys[: sum(elen[:e])] + [pool[0]] + keys[sum(elen[:e]) :]
        start = sum(elen[:e])
        keys.insert(start + rng.randint(0, elen[e]), keys[start + rng.randrange(elen[e])])
        elen[e] += 1
    vlen = [rng.randint(0, 3) for _ in keys]
    n = sum(vlen)
    vals = torch.tensor([rng.randrange(50) for _ in range(n)], dtype=torch.int64)
    w = torch.rand(n, generator=torch.Generator().manual_seed(seed))
    t = dict(dtype=ids_dtype)
    return (
        vals,
        torch.tensor(vlen, **t),
        torch.tensor(keys, dtype=torch.int64),
        torch.tensor(elen, **t),
        w,
    )


def _same_batch(a, b):
    for name in ("values", "values_lengths", "keys", "example_lengths", "weights"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype and torch.equal(x, y), name


@pytest.mark.parametrize("keyspace", list(_KEY_SPACES))
@pytest.mark.parametrize("ids_dtype", [torch.int64, torch.int32])
def test_validate_false_gives_the_same_batch(keyspace, ids_dtype):
    """validate=False skips the data checks only: on valid input the batch is the validated one."""
    for seed in range(15):
        vals, vlen, keys, elen, w = _random_parts(seed, keyspace, ids_dtype=ids_dtype)
        for weights in (None, w):
            a = KeyedJaggedBatch(vals, vlen, keys, elen, weights)
            b = KeyedJaggedBatch(vals, vlen, keys, elen, weights, validate=False)
            _same_batch(a, b)
            assert a.to_dict() == b.to_dict() == _old_to_dict(a)
            assert a.values_lengths.dtype == torch.int64 and a.example_lengths.dtype == torch.int64


def _raised(fn):
    try:
        fn()
    except (ValueError, TypeError, IndexError) as e:
        return type(e), str(e)
    return None


def _invalid_cases():
    v = torch.tensor([1, 2, 3, 4])
    yield (
        v,
        torch.tensor([1, 1, 2]),
        torch.tensor([5, 5, 5]),
        torch.tensor([1, 2]),
        None,
    )  # key twice
    yield v, torch.tensor([1, 1, 2]), torch.tensor([5, 6, 6]), torch.tensor([1, 2]), None
    yield v, torch.tensor([2, 2]), torch.tensor([3, 4]), torch.tensor([3]), None  # elen sum
    yield v, torch.tensor([2, 2]), torch.tensor([3, 4]), torch.tensor([3, -1]), None  # elen < 0
    yield v, torch.tensor([2]), torch.tensor([3, 4]), torch.tensor([2]), None  # entries
    yield v, torch.tensor([2, 1]), torch.tensor([3, 4]), torch.tensor([2]), None  # vlen sum
    yield v, torch.tensor([5, -1]), torch.tensor([3, 4]), torch.tensor([2]), None  # vlen < 0
    yield v, torch.tensor([2, 2]), torch.tensor([3, 4]), torch.tensor([2]), torch.ones(3)  # weights
    yield v, torch.tensor([2.0, 2.0]), torch.tensor([3, 4]), torch.tensor([2]), None  # dtype
    yield v, torch.tensor([[2, 2]]), torch.tensor([3, 4]), torch.tensor([2]), None  # dims
    yield v, torch.tensor([2, 2]), torch.tensor([3, 4], dtype=torch.int8), torch.tensor([2]), None
    yield (
        v,
        torch.tensor([1, 0, 1, 2]),
        torch.tensor([2**62, -5, 2**62, 7]),
        torch.tensor([4]),
        None,
    )
    yield v, torch.tensor([1, 1, 1, 1]), torch.tensor([70, 6, 64, 64]), torch.tensor([2, 2]), None
    yield v, torch.tensor([1, 1, 1, 1]), torch.tensor([-64, 6, 0, 0]), torch.tensor([2, 2]), None
    for seed in range(40):
        for keyspace in _KEY_SPACES:
            yield _random_parts(seed, keyspace, dup=True)


_CHECK_PATHS = ["numpy", "torch"] + (["numba"] if segment.compiled_available() else [])


@pytest.fixture(params=_CHECK_PATHS)
def check_path(request, monkeypatch):
    """The checks' valid path: numpy passes, the numba kernel (numba loaded), or none (every input then goes
    through the exact torch checks, as on a non-CPU device)."""
    from sparsefill.segment import _jagged, _jagged_check

    monkeypatch.setattr(_jagged_check, "_use_compiled", lambda: request.param == "numba")
    if request.param == "torch":
        monkeypatch.setattr(_jagged, "_quick_check", lambda *a: 1)
    return request.param


def test_validation_raises_as_before(check_path):
    """Every check of the former __post_init__ still fires with the same type and message (with several
    errors in one input, the same one first) on every path of the checks; a repeated key is found by each
    path of the exact test (key ids below 64, a small table, one int64 code, two sorts)."""
    n = 0
    for vals, vlen, keys, elen, w in _invalid_cases():
        expect = _raised(lambda: _old_validate(vals, vlen, keys, elen, w))
        assert expect is not None, (vlen, keys, elen)
        assert _raised(lambda: KeyedJaggedBatch(vals, vlen, keys, elen, w)) == expect
        n += 1
    assert n == 14 + 40 * len(_KEY_SPACES)
    # distinct keys of equal residue (0 and 64 mod 64): valid (the residue test only screens)
    kj = KeyedJaggedBatch(
        torch.tensor([1, 2, 3, 4]),
        torch.tensor([1, 1, 1, 1]),
        torch.tensor([70, 6, 0, 64]),
        torch.tensor([2, 2]),
    )
    assert kj.to_dict() == [{70: [1], 6: [2]}, {0: [3], 64: [4]}]


def _exact_ok(vals, vlen, keys, elen):
    """Whether the batch is valid, by the exact checks alone (Python ints: no wrapped sums)."""
    el, vl, k = elen.tolist(), vlen.tolist(), keys.tolist()
    if min(el + vl + [0]) < 0 or sum(el) != len(k) or len(vl) != len(k) or sum(vl) != vals.shape[0]:
        return False
    ends = [sum(el[: i + 1]) for i in range(len(el))]
    return all(len(set(k[e - n : e])) == n for e, n in zip(ends, el))


def _quick_cases():
    big = 2**62
    yield (
        torch.arange(2),
        torch.tensor([big, big, big, big + 2]),
        torch.tensor([1, 2, 3, 4]),
        torch.tensor([4]),
    )
    yield (
        torch.arange(2),
        torch.tensor([1, 1]),
        torch.tensor([1, 2]),
        torch.tensor([big, big, big, big + 2])[:1],
    )
    yield (
        torch.arange(3),
        torch.tensor([1, 1, 1]),
        torch.tensor([0, 63, 64]),
        torch.tensor([3]),
    )  # residues 0 0
    yield (
        torch.arange(3),
        torch.tensor([1, 1, 1]),
        torch.tensor([-1, 63, 5]),
        torch.tensor([3]),
    )  # -1 = 63 mod 64
    yield (
        torch.arange(3),
        torch.tensor([1, 1, 1]),
        torch.tensor([5, 63, 5]),
        torch.tensor([0, 3, 0]),
    )
    yield torch.arange(0), torch.tensor([0, 0]), torch.tensor([7, 7]), torch.tensor([1, 0, 1])
    none = torch.zeros(0, dtype=torch.long)
    yield none, none, none, torch.zeros(3, dtype=torch.long)
    yield none, none, none, none
    rng = random.Random(0)
    for seed in range(300):
        vals, vlen, keys, elen, _ = _random_parts(
            seed, list(_KEY_SPACES)[seed % 4], B=seed % 9, dup=seed % 3 == 0 and seed % 9 > 0
        )
        if seed % 5 == 1 and vlen.numel():  # a wrong sum or a negative length
            vlen[rng.randrange(vlen.numel())] += rng.choice([-5, -1, 1])
        if seed % 7 == 2 and elen.numel():
            elen[rng.randrange(elen.numel())] += rng.choice([-2, -1, 1])
        yield vals, vlen, keys, elen


@pytest.mark.parametrize("path", _CHECK_PATHS[::2])
def test_quick_checks_agree_with_the_exact_ones(path):
    """The fast valid path (numpy passes; the numba kernel) accepts only valid batches (state 0), every
    valid batch of key ids in [0, 64); 2 (keys left to the exact test) only with valid lengths; wrapped
    sums, residue collisions (0 and 64, -1 and 63), empty examples at either end included."""
    from sparsefill.segment import _jagged_check

    quick = _jagged_check._compiled_quick() if path == "numba" else _jagged_check._quick_numpy
    for vals, vlen, keys, elen in _quick_cases():
        ok = _exact_ok(vals, vlen, keys, elen)
        if vlen.numel() != keys.numel():
            continue
        state = quick(elen.numpy(), vlen.numpy(), keys.numpy(), vals.shape[0])
        assert state in (0, 1, 2) and (state == 0) <= ok, (vlen, keys, elen, state)
        if ok:  # (1: only for an invalid batch here; 2: residues collide, distinct keys or not)
            small = keys.numel() == 0 or 0 <= int(keys.min()) and int(keys.max()) < 64
            assert state == 0 if small else state in (0, 2), (vlen, keys, elen, state)
        if state == 2:
            assert (
                min(elen.tolist() + vlen.tolist() + [0]) >= 0 and sum(elen.tolist()) == keys.numel()
            )
            assert sum(vlen.tolist()) == vals.shape[0]


def test_wrapped_sums_raise(check_path):
    """Lengths whose int64 sum passes 2**63 - 1 raise (the wrapped sum equals the data's count: it passed
    before), naming the first length past the limit."""
    big = 2**62
    with pytest.raises(
        ValueError,
        match=r"values_lengths overflow int64: their running sum passes "
        r"2\*\*63 - 1 at values_lengths\[1\]",
    ):
        KeyedJaggedBatch(
            torch.arange(2),
            torch.tensor([big, big, big, big + 2]),
            torch.tensor([1, 2, 3, 4]),
            torch.tensor([4]),
        )
    with pytest.raises(
        ValueError, match=r"example_lengths overflow int64: .* at example_lengths\[2\]"
    ):
        KeyedJaggedBatch(
            torch.arange(2),
            torch.tensor([1, 1]),
            torch.tensor([1, 2]),
            torch.tensor([1, big, big, big, big + 1]),
        )


def test_validated_equals_unvalidated_on_every_path(check_path):
    """Valid batches pass every path, strided (non-contiguous) index tensors too; a repeated key in a
    strided batch is still found."""
    for seed in range(40):
        vals, vlen, keys, elen, w = _random_parts(seed, list(_KEY_SPACES)[seed % 4], B=seed % 9)
        _same_batch(
            KeyedJaggedBatch(vals, vlen, keys, elen, w),
            KeyedJaggedBatch(vals, vlen, keys, elen, w, validate=False),
        )
        strided = [torch.stack([t, t], 1)[:, 0] for t in (vlen, keys, elen)]
        assert not strided[1].is_contiguous() or keys.numel() < 2
        _same_batch(
            KeyedJaggedBatch(vals, *strided, w), KeyedJaggedBatch(vals, vlen, keys, elen, w)
        )
    k = torch.stack([torch.tensor([3, 9, 3]), torch.zeros(3, dtype=torch.long)], 1)[:, 0]
    with pytest.raises(ValueError, match="key 3 appears more than once in example 0"):
        KeyedJaggedBatch(torch.arange(3), torch.ones(3, dtype=torch.long), k, torch.tensor([3]))


def test_select_no_keys():
    kj = KeyedJaggedBatch.from_lists(SPEC)
    assert kj.select_keys([]).to_dict() == [{}, {}]
    padded, mask = kj.to_padded([])
    assert padded.shape == mask.shape == (2, 0, 0)


def test_validate_false_keeps_the_o1_checks():
    """validate=False reads no data (no device sync), but dtypes, dims and entry counts are still checked."""
    v = torch.tensor([1, 2, 3, 4])
    kj = KeyedJaggedBatch(
        v, torch.tensor([1, 1, 2]), torch.tensor([5, 5, 5]), torch.tensor([1, 2]), validate=False
    )
    assert kj.keys.tolist() == [5, 5, 5]  # (invalid, unchecked: the caller's promise)
    with pytest.raises(ValueError, match="values_lengths has 2 entries but keys has 3"):
        KeyedJaggedBatch(
            v, torch.tensor([2, 2]), torch.tensor([3, 4, 5]), torch.tensor([3]), validate=False
        )
    with pytest.raises(
        ValueError, match=r"weights must have one entry per value \(4\), got shape \(3,\)"
    ):
        KeyedJaggedBatch(
            v,
            torch.tensor([4]),
            torch.tensor([3]),
            torch.tensor([1]),
            torch.ones(3),
            validate=False,
        )
    with pytest.raises(TypeError, match="keys must be an int32 or int64 tensor"):
        KeyedJaggedBatch(
            v, torch.tensor([4]), torch.tensor([3.0]), torch.tensor([1]), validate=False
        )
    with pytest.raises(TypeError):
        KeyedJaggedBatch(
            v, torch.tensor([4]), torch.tensor([3]), torch.tensor([1]), None, False
        )  # keyword-only


@pytest.mark.parametrize("keyspace", list(_KEY_SPACES))
def test_to_dict_equals_the_previous_implementation(keyspace):
    """Golden comparison with the former element-by-element to_dict: ids, weights, 2-D values, empty
    examples and lists, an empty batch, and the batches select_keys / split / concat return."""
    for seed in range(25):
        vals, vlen, keys, elen, w = _random_parts(seed, keyspace, B=seed % 6)
        for kj in (
            KeyedJaggedBatch(vals, vlen, keys, elen),
            KeyedJaggedBatch(vals, vlen, keys, elen, w),
            KeyedJaggedBatch(torch.stack([vals, -vals], 1), vlen, keys, elen, w),
        ):
            assert kj.to_dict() == _old_to_dict(kj)
            if kj.batch_size:
                sel = kj.select_keys(keys.unique()[:3])
                assert sel.to_dict() == _old_to_dict(sel)
                parts = kj.split([1, kj.batch_size - 1])
                assert [p.to_dict() for p in parts] == [_old_to_dict(p) for p in parts]
                assert KeyedJaggedBatch.concat(parts).to_dict() == _old_to_dict(kj)


@pytest.mark.skipif(
    not segment.compiled_available(), reason="needs numba (the compiled backend)"
)  # reported by -rs
def test_the_checks_compile_only_where_numba_is_set_up():
    """The checks never import numba nor set up its compiler (0.7-1 s in a fresh process: see
    test_coldstart.py): numba imported alone leaves them on numpy; the kernel runs once an njit function
    has run in the process (and with the backend "numba")."""
    import os
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from sparsefill.segment import KeyedJaggedBatch, _jagged_check, use_backend\n"
        "def kj():\n"
        "    KeyedJaggedBatch.from_lists([{1: [10, 11], 3: [101]}, {1: [11], 2: [50]}])\n"
        "    return _jagged_check._compiled_quick.cache_info().currsize\n"
        "print(kj(), 'numba' in sys.modules)\n"
        "import numba\n"
        "print(kj())\n"
        "with use_backend('torch'):\n"
        "    numba.njit(lambda x: x)(0)\n"
        "    print(kj())\n"
        "print(kj())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SPARSEFILL_SEGMENT_BACKEND"}
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["0", "False", "0", "0", "1"]


# ---------------------------------------------------------------- edge cases
def test_keyed_jagged_batch_rejects_a_key_twice_in_an_example():
    """to_dict / to_padded hold one list per key: a repeated key lost ids silently."""
    with pytest.raises(ValueError, match="key 5 appears more than once in example 1"):
        segment.KeyedJaggedBatch(
            torch.tensor([1, 2, 3, 4]),
            torch.tensor([1, 1, 2]),
            torch.tensor([5, 5, 5]),
            torch.tensor([1, 2]),
        )
    kj = segment.KeyedJaggedBatch(
        torch.tensor([1, 2, 3]), torch.tensor([1, 2]), torch.tensor([5, 5]), torch.tensor([1, 1])
    )  # the same key in two examples is fine
    assert kj.to_dict() == [{5: [1]}, {5: [2, 3]}]


def test_pooled_positional_weighted_sum():
    kj = segment.KeyedJaggedBatch.from_lists([{1: [0, 2], 3: [1]}, {1: [3, 1, 1]}])
    table = torch.arange(8.0).reshape(4, 2)
    pw = torch.tensor([1.0, 10.0, 100.0])
    out = kj.pooled({1: table}, "positional_weighted_sum", weights=pw)[1]
    assert out.tolist() == [[0 + 10 * 4, 1 + 10 * 5], [6 + 10 * 2 + 100 * 2, 7 + 10 * 3 + 100 * 3]]
    with pytest.raises(ValueError, match="weights= is for positional_weighted_sum only"):
        kj.pooled({1: table}, "sum", weights=pw)
    with pytest.raises(ValueError, match="reducer 'positional_weighted_sum' needs weights="):
        kj.pooled({1: table}, "positional_weighted_sum")


@pytest.mark.parametrize("reducer", ["sum", "mean", "max", "min"])
def test_csr_row_reduce_keeps_autograd(reducer):
    """Rows of a CSR SparseTensor reduced through segment.reduce: values and gradient as on the dense matrix
    (the compiled one-column path had dropped the gradient)."""
    v = torch.tensor([5.0, -1.0, 3.0, 2.5], dtype=torch.float64, requires_grad=True)
    A = sparsefill.sparse_csr_tensor([0, 2, 3, 3, 4], [0, 3, 1, 2], v, (4, 4), fill_value=2.0)
    out = segment.csr_row_reduce(A, reducer)
    v2 = v.detach().clone().requires_grad_()
    dense = torch.full((4, 4), 2.0, dtype=torch.float64).index_put(
        (torch.tensor([0, 0, 1, 3]), torch.tensor([0, 3, 1, 2])), v2
    )
    ref = {"sum": dense.sum(1), "mean": dense.mean(1), "max": dense.amax(1), "min": dense.amin(1)}[
        reducer
    ]
    assert_close(out, ref)
    w = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    (out * w).sum().backward()
    (ref * w).sum().backward()
    assert_close(v.grad, v2.grad)
