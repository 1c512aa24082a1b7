"""segment.reduce: golden tables in every representation against a slow reference, both backends,
gradients (gradcheck for every reducer, double backward for the linear ones), aliases, errors."""

import math

import pytest
import torch
from torch.testing import assert_close

from sparsefill import segment

BACKENDS = ["numba", "torch"]  # ("auto" picks one of them by the work done: see test_coldstart)
REDUCERS = list(segment.SEGMENT_REDUCERS)
WEIGHTED = {"weighted_sum", "weighted_mean", "positional_weighted_sum"}
REPS = [
    "lengths",
    "offsets",
    "sorted_ids",
    "unsorted_ids",
    "fused_lengths",
    "fused",
    "fused_unsorted",
]


@pytest.fixture(params=BACKENDS)
def backend(request):
    if request.param == "numba" and not segment.compiled_available():
        pytest.skip(
            "numba not installed: the compiled backend is not available"
        )  # reported as a skip
    with segment.use_backend(request.param):
        yield request.param


# ---- the slow, obvious reference ---------------------------------------------------------------
def ref_reduce(data, lengths, reducer, weights=None, empty=None):
    """Loop over segments; reduce the stacked rows with plain torch reductions."""
    red = segment.SEGMENT_REDUCERS[reducer]
    empty = red.empty if empty is None else empty
    out, k = [], 0
    for n in lengths.tolist():
        rows = data[k : k + n]
        w = None
        if reducer in ("weighted_sum", "weighted_mean"):
            w = weights[k : k + n]
        elif reducer == "positional_weighted_sum":
            w = weights[:n]
        k += n
        if n == 0:
            dt = (
                data.dtype if data.is_floating_point() or reducer in ("max", "min") else torch.int64
            )
            out.append(torch.full(data.shape[1:], empty, dtype=dt))
            continue
        wb = None if w is None else w.view(-1, *([1] * (data.dim() - 1)))
        r = {
            "sum": lambda: rows.sum(0),
            "mean": lambda: rows.mean(0),
            "sqrt_n": lambda: rows.sum(0) / math.sqrt(n),
            "weighted_sum": lambda: (rows * wb).sum(0),
            "weighted_mean": lambda: (rows * wb).sum(0) / w.sum(),
            "positional_weighted_sum": lambda: (rows * wb).sum(0),
            "max": lambda: rows.amax(0),
            "min": lambda: rows.amin(0),
            "prod": lambda: rows.prod(0),
            "logsumexp": lambda: torch.logsumexp(rows, 0),
            "logmeanexp": lambda: torch.logsumexp(rows, 0) - math.log(n),
        }[reducer]()
        out.append(r)
    if not out:
        dt = data.dtype if data.is_floating_point() or reducer in ("max", "min") else torch.int64
        return torch.zeros((0, *data.shape[1:]), dtype=dt)
    return torch.stack(out)


# ---- golden tables -----------------------------------------------------------------------------
def _t(x):
    return torch.tensor(x, dtype=torch.float64)


GOLDEN = {
    # name: (data, lengths)
    "empty_segments": (
        _t([[1.0, 2.0], [3.0, -4.0], [5.0, 6.0], [-7.0, 8.0]]),
        torch.tensor([0, 2, 0, 0, 2, 0]),
    ),
    "ties": (
        _t([[2.0, 1.0], [2.0, 1.0], [0.0, 1.0], [5.0, 5.0], [5.0, 5.0]]),
        torch.tensor([3, 2]),
    ),
    "single_segment": (_t([[1.5], [-2.0], [3.25]]), torch.tensor([3])),
    "zero_rows": (torch.zeros(0, 3, dtype=torch.float64), torch.tensor([0, 0])),
    "no_segments": (torch.zeros(0, 2, dtype=torch.float64), torch.tensor([], dtype=torch.long)),
    "negative_max": (_t([[-3.0, -1.0], [-2.0, -9.0], [-8.0, -7.0]]), torch.tensor([2, 1])),
    "inf_nan": (
        _t([[float("-inf"), 1.0], [float("-inf"), float("nan")], [float("inf"), 2.0]]),
        torch.tensor([2, 1]),
    ),
    "multi_dim": (
        torch.arange(24, dtype=torch.float64).reshape(4, 3, 2) - 11,
        torch.tensor([1, 3]),
    ),
}


def weights_for(reducer, n, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    if reducer in ("weighted_sum", "weighted_mean"):
        return torch.rand(n, generator=g, dtype=torch.float64) + 0.5
    if reducer == "positional_weighted_sum":
        longest = int(lengths.max()) if lengths.numel() else 0
        return torch.rand(longest + 1, generator=g, dtype=torch.float64) + 0.5
    return None


def in_representation(rep, data, lengths, weights, reducer, seed=0):
    """Call segment.reduce on the batch written in representation ``rep``; return (out, arg or None, rowmap)
    where rowmap maps an input position of that call to the position in the lengths form."""
    g = torch.Generator().manual_seed(seed)
    N, S = data.shape[0], lengths.numel()
    ids = torch.repeat_interleave(torch.arange(S), lengths)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    row_w = weights if reducer in ("weighted_sum", "weighted_mean") else None
    kw = dict(weights=weights)
    ext = reducer in ("max", "min")
    if ext:
        kw["return_arg"] = True
    if rep in ("unsorted_ids", "fused_unsorted"):
        # random interleaving that keeps the order within every segment (positional weights need it)
        slots = torch.randperm(N, generator=g)
        ids_u = ids[slots]
        rowmap = torch.empty(N, dtype=torch.long)
        rowmap[torch.sort(ids_u, stable=True).indices] = torch.arange(N)
        data_u = data[rowmap]
        if row_w is not None:
            kw["weights"] = row_w[rowmap]
    else:
        rowmap = torch.arange(N)
        data_u = data
    if rep.startswith("fused"):
        extra = (torch.randn(3, *data.shape[1:], dtype=torch.float64, generator=g) * 100).to(
            data.dtype
        )
        table_rows = torch.cat([data_u, extra])
        perm = torch.randperm(table_rows.shape[0], generator=g)
        table = table_rows[perm]
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.numel())
        kw["indices"] = inv[:N]
        src = table
    else:
        src = data_u
    if rep in ("lengths", "fused_lengths"):
        res = segment.reduce(src, reducer, lengths=lengths, **kw)
    elif rep == "offsets":
        res = segment.reduce(src, reducer, offsets=offsets, **kw)
    elif rep in ("sorted_ids", "fused"):
        res = segment.reduce(src, reducer, segment_ids=ids, num_segments=S, **kw)
    else:
        res = segment.reduce(src, reducer, segment_ids=ids_u, num_segments=S, sorted=False, **kw)
    out, arg = res if ext else (res, None)
    return out, arg, rowmap


@pytest.mark.parametrize("case", list(GOLDEN))
@pytest.mark.parametrize("reducer", REDUCERS)
def test_golden_every_representation(backend, case, reducer):
    data, lengths = GOLDEN[case]
    if reducer == "prod":
        data = data.clamp(-3, 3)
    weights = weights_for(reducer, data.shape[0], lengths)
    expect = ref_reduce(data, lengths, reducer, weights)
    for rep in REPS:
        out, arg, rowmap = in_representation(rep, data, lengths, weights, reducer)
        assert_close(out, expect, equal_nan=True, msg=lambda m: f"{rep}: {m}")
        if arg is not None:
            # the arg position is the first position (in input order) holding the extreme
            pos = torch.where(arg >= 0, rowmap[arg.clamp_min(0)], arg) if rowmap.numel() else arg
            offs = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
            for s in range(lengths.numel()):
                p = pos[s].reshape(-1)
                if lengths[s] == 0:
                    assert bool((p == -1).all()), rep
                    continue
                rows = data[offs[s] : offs[s + 1]].reshape(int(lengths[s]), -1)
                fn = torch.argmax if reducer == "max" else torch.argmin
                first = (
                    torch.stack(
                        [
                            fn(
                                torch.nan_to_num(
                                    rows[:, j], nan=math.inf if reducer == "max" else -math.inf
                                )
                            )
                            for j in range(rows.shape[1])
                        ]
                    )
                    + offs[s]
                )
                assert p.tolist() == first.tolist(), (rep, s)


def test_golden_values_by_hand():
    data, lengths = GOLDEN["empty_segments"]
    assert segment.reduce(data, "sum", lengths=lengths).tolist() == [
        [0, 0],
        [4, -2],
        [0, 0],
        [0, 0],
        [-2, 14],
        [0, 0],
    ]
    assert segment.reduce(data, "max", lengths=lengths).tolist() == [
        [0, 0],
        [3, 2],
        [0, 0],
        [0, 0],
        [5, 8],
        [0, 0],
    ]
    assert segment.reduce(data, "max", lengths=lengths, empty=-math.inf)[0].tolist() == [
        -math.inf,
        -math.inf,
    ]
    assert segment.reduce(data, "prod", lengths=lengths).tolist() == [
        [1, 1],
        [3, -8],
        [1, 1],
        [1, 1],
        [-35, 48],
        [1, 1],
    ]
    data, lengths = GOLDEN["negative_max"]
    out, arg = segment.reduce(data, "max", lengths=lengths, return_arg=True)
    assert out.tolist() == [[-2, -1], [-8, -7]] and arg.tolist() == [[1, 0], [2, 2]]
    out, arg = segment.reduce(data, "min", lengths=lengths, return_arg=True)
    assert out.tolist() == [[-3, -9], [-8, -7]] and arg.tolist() == [[0, 1], [2, 2]]


@pytest.mark.parametrize("reducer", ["max", "min"])
@pytest.mark.parametrize("empty", [None, -7.5, math.nan, -math.inf])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_extreme_empty_value_every_path(backend, reducer, empty, dtype):
    # the compiled sorted kernel writes the empty value itself; every path gives the same rows
    g = torch.Generator().manual_seed(5)
    lengths = torch.tensor([0, 3, 0, 0, 1, 4, 0])
    data = torch.randn(int(lengths.sum()), 3, generator=g, dtype=dtype)
    data[2, 1] = math.nan
    ids = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
    perm = torch.randperm(ids.numel(), generator=g)
    kw = {} if empty is None else {"empty": empty}
    ref = ref_reduce(data, lengths, reducer, empty=empty)
    fill = 0.0 if empty is None else empty
    assert (
        torch.isnan(ref[1, 1]) and ref[0].tolist() != []
    )  # the NaN wins; rows of empty segments follow
    offs = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    outs = {
        "lengths": segment.reduce(data, reducer, lengths=lengths, **kw),
        "offsets": segment.reduce(data, reducer, offsets=offs, **kw),
        "sorted ids": segment.reduce(data, reducer, segment_ids=ids, num_segments=7, **kw),
        "unsorted ids": segment.reduce(
            data[perm], reducer, segment_ids=ids[perm], num_segments=7, sorted=False, **kw
        ),
        "gather": segment.reduce(
            data.flip(0), reducer, lengths=lengths, indices=torch.arange(8).flip(0), **kw
        ),
        "arg": segment.reduce(data, reducer, lengths=lengths, return_arg=True, **kw)[0],
        "grad": segment.reduce(
            data.clone().requires_grad_(), reducer, lengths=lengths, **kw
        ).detach(),
    }
    for name, out in outs.items():
        torch.testing.assert_close(out, ref, equal_nan=True, msg=lambda m: f"{name}: {m}")
        for s in (0, 2, 3, 6):
            assert torch.equal(out[s], torch.full((3,), fill, dtype=dtype)) or (
                math.isnan(fill) and bool(out[s].isnan().all())
            ), name
    _, arg = segment.reduce(data, reducer, lengths=lengths, return_arg=True, **kw)
    assert arg[[0, 2, 3, 6]].eq(-1).all()


def test_spec_examples(backend):
    # SortedSegmentSum on the spec's 5x2 data
    data = torch.tensor([[1, 4], [3, 2], [8, 1], [9, 4], [5, 8]], dtype=torch.float32)
    out = segment.sorted_segment_sum(data, torch.tensor([0, 0, 0, 1, 1]))
    assert out.tolist() == [[12.0, 7.0], [14.0, 12.0]]
    # values with lengths / with segment ids: scores summed per example
    scores = torch.tensor([0.4, 0.7, 0.5, 0.5, 0.1])
    assert_close(segment.lengths_sum(scores, torch.tensor([2, 3])), torch.tensor([1.1, 1.1]))
    assert_close(
        segment.sorted_segment_sum(scores, torch.tensor([0, 0, 1, 1, 1])), torch.tensor([1.1, 1.1])
    )
    # the sparse tensor interpretation: one-hot rows summed per example = the spec's sparse_matrix
    values = torch.tensor([1, 2, 3, 2, 4, 6, 7, 3, 6])
    onehot = torch.eye(8)[values]
    assert segment.lengths_sum(onehot, torch.tensor([3, 4, 2])).tolist() == [
        [0, 1, 1, 1, 0, 0, 0, 0],
        [0, 0, 1, 0, 1, 0, 1, 1],
        [0, 0, 0, 1, 0, 0, 1, 0],
    ]
    # unsorted ids of the spec: same per-example sums as the sorted batch
    unsorted_vals = torch.tensor([4.0, 1, 3, 6, 3, 2, 7, 2, 6])
    unsorted_ids = torch.tensor([1, 0, 2, 1, 0, 1, 1, 0, 2])
    assert segment.unsorted_segment_sum(unsorted_vals, unsorted_ids).tolist() == [6.0, 19.0, 9.0]
    assert segment.lengths_sum(values.double(), torch.tensor([3, 4, 2])).tolist() == [
        6.0,
        19.0,
        9.0,
    ]
    # nested: LIST<MAP<INT, LIST<INT>>>: sum per (example, key), then per example
    nested = torch.tensor([10.0, 11, 101, 11, 50, 102, 103])
    per_key = segment.lengths_sum(nested, torch.tensor([2, 1, 1, 1, 2]))
    assert per_key.tolist() == [21.0, 101.0, 11.0, 50.0, 205.0]
    assert segment.lengths_sum(per_key, torch.tensor([2, 3])).tolist() == [122.0, 266.0]


# ---- random inputs: float32/float64/int, empty, multi-dim ----------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "S,D", [(0, (3,)), (1, ()), (40, (5,)), (17, (2, 3)), (9, (40,)), (9, (100,))]
)
def test_random_against_reference(backend, dtype, S, D):
    """(The compiled kernels: D = 1, one column, a local accumulator; max/min at D = 40 float64 (320 bytes),
    a kernel compiled for that width; at D = 100, rows too long to be read in pairs.)"""
    g = torch.Generator().manual_seed(S)
    lengths = torch.randint(0, 5, (S,), generator=g)
    N = int(lengths.sum())
    data = torch.randn(N, *D, generator=g, dtype=torch.float64).to(dtype)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else {}
    for reducer in REDUCERS:
        w = weights_for(reducer, N, lengths, seed=S)
        w = None if w is None else w.to(dtype)
        expect = ref_reduce(data.double(), lengths, reducer, None if w is None else w.double()).to(
            dtype
        )
        for rep in ("lengths", "fused", "unsorted_ids", "fused_unsorted"):
            out, _, _ = in_representation(rep, data, lengths, w, reducer, seed=S)
            assert out.dtype == dtype
            assert_close(out, expect, equal_nan=True, **tol)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("reducer", ["sum", "max", "min", "prod"])
def test_integer_data(backend, dtype, reducer):
    lengths = torch.tensor([2, 0, 3, 1])
    data = torch.tensor([[3, -1], [2, 7], [-5, 4], [9, 0], [1, 1], [4, -2]], dtype=dtype)
    expect = ref_reduce(data, lengths, reducer)
    for rep in ("lengths", "unsorted_ids", "fused"):
        out, _, _ = in_representation(rep, data, lengths, None, reducer)
        assert_close(out, expect)
    with pytest.raises(TypeError, match="floating-point"):
        segment.reduce(data, "mean", lengths=lengths)


def test_id_dtypes_and_num_segments(backend):
    data = torch.randn(6, 2)
    for dt in (torch.int32, torch.int64):
        ids = torch.tensor([0, 0, 2, 2, 2, 3], dtype=dt)
        out = segment.reduce(data, "sum", segment_ids=ids, num_segments=6)
        assert out.shape == (6, 2)
        assert_close(out[2], data[2:5].sum(0))
        assert bool((out[[1, 4, 5]] == 0).all())
        assert_close(
            segment.reduce(data, "sum", segment_ids=ids.flip(0), sorted=False),
            segment.reduce(data.flip(0), "sum", segment_ids=ids),
        )
        lengths = torch.tensor([1, 5], dtype=dt)
        idx = torch.tensor([5, 0, 0, 1, 2, 3], dtype=dt)
        assert_close(
            segment.reduce(data, "mean", lengths=lengths, indices=idx),
            torch.stack([data[5], data[idx[1:].long()].mean(0)]),
        )


def test_out_of_range_policies(backend):
    data = torch.arange(10.0).reshape(5, 2)
    ids = torch.tensor([0, -1, 1, 3, 1])
    with pytest.raises(
        IndexError, match=r"segment_ids must be non-negative, got segment_ids\[1\] = -1"
    ):
        segment.reduce(data, "sum", segment_ids=ids, sorted=False, num_segments=3)
    with pytest.raises(
        IndexError, match=r"segment_ids\[3\] = 3 is out of range for num_segments = 3"
    ):
        segment.reduce(data, "sum", segment_ids=ids.abs(), sorted=False, num_segments=3)
    out = segment.reduce(
        data, "sum", segment_ids=ids, sorted=False, num_segments=3, out_of_range="drop"
    )
    assert out.tolist() == [[0, 1], [12, 14], [0, 0]]
    w = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    out = segment.reduce(
        data[:, 0],
        "weighted_sum",
        segment_ids=ids,
        sorted=False,
        num_segments=3,
        out_of_range="drop",
        weights=w,
    )
    assert out.tolist() == [0.0, 3 * 4 + 5 * 8, 0.0]
    out, arg = segment.reduce(
        data,
        "max",
        segment_ids=ids,
        sorted=False,
        num_segments=3,
        out_of_range="drop",
        return_arg=True,
    )
    assert arg.tolist() == [[0, 0], [4, 4], [-1, -1]]
    out = segment.reduce(
        data, "sum", segment_ids=ids, sorted=False, num_segments=3, out_of_range="clip"
    )
    assert out.tolist() == [[2, 4], [12, 14], [6, 7]]
    sorted_ids = torch.tensor([-1, 0, 0, 1, 5])
    out = segment.reduce(data, "sum", segment_ids=sorted_ids, num_segments=2, out_of_range="drop")
    assert out.tolist() == [[6, 8], [6, 7]]


def test_errors_name_the_numbers(backend):
    data = torch.randn(5, 2)
    with pytest.raises(ValueError, match=r"lengths sum to 4, but there are 5 rows"):
        segment.reduce(data, "sum", lengths=torch.tensor([1, 3]))
    with pytest.raises(ValueError, match=r"lengths must be non-negative, got lengths\[0\] = -1"):
        segment.reduce(data, "sum", lengths=torch.tensor([-1, 6]))
    with pytest.raises(ValueError, match=r"lengths sum to 3, but there are 2 indices"):
        segment.reduce(data, "sum", lengths=torch.tensor([3]), indices=torch.tensor([0, 1]))
    with pytest.raises(IndexError, match=r"indices\[1\] = 5 is out of range for 5 rows of data"):
        segment.reduce(data, "sum", lengths=torch.tensor([2]), indices=torch.tensor([0, 5]))
    with pytest.raises(IndexError, match=r"indices\[0\] = -1 is out of range"):
        segment.reduce(
            data, "max", lengths=torch.tensor([2]), indices=torch.tensor([-1, 0]), validate=False
        )
    with pytest.raises(
        ValueError,
        match=r"segment_ids must have 5 entries along dim 0 \(one per row of data\), got 4",
    ):
        segment.reduce(data, "sum", segment_ids=torch.tensor([0, 0, 1, 1]))
    with pytest.raises(
        ValueError,
        match=r"must be sorted \(sorted=True\), got segment_ids\[1\] = 2 > segment_ids\[2\] = 1",
    ):
        segment.reduce(data, "sum", segment_ids=torch.tensor([0, 2, 1, 3, 3]))
    with pytest.raises(
        ValueError, match=r"weights must have 5 entries along dim 0 \(one per row of data\), got 3"
    ):
        segment.reduce(data, "weighted_sum", lengths=torch.tensor([5]), weights=torch.ones(3))
    with pytest.raises(
        ValueError, match=r"positional weights have 2 entries, but the longest segment has 4"
    ):
        segment.reduce(
            data, "positional_weighted_sum", lengths=torch.tensor([1, 4]), weights=torch.ones(2)
        )
    with pytest.raises(
        TypeError, match=r"weights must have the dtype of data \(torch.float32\), got torch.float64"
    ):
        segment.reduce(
            data,
            "weighted_sum",
            lengths=torch.tensor([5]),
            weights=torch.ones(5, dtype=torch.float64),
        )
    with pytest.raises(ValueError, match="needs weights="):
        segment.reduce(data, "weighted_sum", lengths=torch.tensor([5]))
    with pytest.raises(ValueError, match="takes no weights"):
        segment.reduce(data, "sum", lengths=torch.tensor([5]), weights=torch.ones(5))
    with pytest.raises(ValueError, match="unknown reducer 'median'"):
        segment.reduce(data, "median", lengths=torch.tensor([5]))
    with pytest.raises(ValueError, match="exactly one of lengths=, offsets=, segment_ids="):
        segment.reduce(data, "sum", lengths=torch.tensor([5]), offsets=torch.tensor([0, 5]))
    with pytest.raises(ValueError, match=r"offsets end at 4, but the data has 5 rows"):
        segment.reduce(data, "sum", offsets=torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="return_arg=True needs the max or min"):
        segment.reduce(data, "sum", lengths=torch.tensor([5]), return_arg=True)
    with pytest.raises(ValueError, match="num_segments = 3 but lengths has 2 entries"):
        segment.reduce(data, "sum", lengths=torch.tensor([2, 3]), num_segments=3)
    # O(1) guards without validation: sorted ids out of range are still caught
    with pytest.raises(IndexError, match="entries >= num_segments = 2"):
        segment.reduce(
            data, "sum", segment_ids=torch.tensor([0, 0, 1, 1, 2]), num_segments=2, validate=False
        )
    with pytest.raises(IndexError, match="out of range for num_segments = 2"):
        segment.reduce(
            data,
            "sum",
            segment_ids=torch.tensor([0, 3, 1, 1, 0]),
            num_segments=2,
            sorted=False,
            validate=False,
        )


BAD_CALLS = {  # name: (reducer, keyword arguments, error type, message)
    "unsorted id out of range": (
        "weighted_sum",
        dict(segment_ids=[0, 1, 7, 1, 0], sorted=False, num_segments=3),
        IndexError,
        r"segment_ids\[2\] = 7 is out of range for num_segments = 3",
    ),
    "negative unsorted id": (
        "max",
        dict(segment_ids=[0, 1, -1, 1, 0], sorted=False),
        IndexError,
        r"segment_ids must be non-negative, got segment_ids\[2\] = -1",
    ),
    "sorted id out of range": (
        "sum",
        dict(segment_ids=[0, 0, 1, 2, 3], num_segments=3),
        IndexError,
        r"out of range|>= num_segments = 3",
    ),
    "lengths not summing to N": (
        "mean",
        dict(lengths=[2, 2]),
        ValueError,
        r"lengths sum to 4, but there are 5 rows",
    ),
    "fused lengths not summing": (
        "sum",
        dict(lengths=[2, 2], indices=[0, 1, 2]),
        ValueError,
        r"lengths sum to 4, but there are 3 indices",
    ),
    "weights too short": (
        "weighted_sum",
        dict(lengths=[2, 3], weights=4),
        ValueError,
        r"weights must have 5 entries along dim 0 \(one per row of data\), got 4",
    ),
    "weights for the fused positions": (
        "weighted_mean",
        dict(lengths=[1, 1], indices=[4, 0], weights=5),
        ValueError,
        r"weights must have 2 entries along dim 0 \(one per entry of indices\), got 5",
    ),
    "fused index out of range": (
        "min",
        dict(lengths=[1, 2], indices=[0, 9, 1]),
        IndexError,
        r"indices\[1\] = 9 is out of range for 5 rows of data",
    ),
    "fused unsorted index, no validation": (
        "sum",
        dict(segment_ids=[1, 0, 1], sorted=False, indices=[0, 2, -4], validate=False),
        IndexError,
        r"indices\[2\] = -4 is out of range",
    ),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_failed_call_modifies_nothing(backend, case):
    """Bad ids, lengths that do not sum to N, mismatched weights, bad indices: a clear error naming the
    numbers, and none of the caller's tensors (nor a gradient) changed."""
    reducer, kw, err, msg = BAD_CALLS[case]
    g = torch.Generator().manual_seed(0)
    data = torch.randn(5, 2, generator=g).requires_grad_()
    kw = {k: (torch.tensor(v) if isinstance(v, list) else v) for k, v in kw.items()}
    if reducer in WEIGHTED:
        kw["weights"] = torch.rand(kw.get("weights", 5), generator=g).requires_grad_()
    before = {
        k: v.detach().clone()
        for k, v in [("data", data), *kw.items()]
        if isinstance(v, torch.Tensor)
    }
    with pytest.raises(err, match=msg):
        segment.reduce(data, reducer, **kw)
    for k, v in [("data", data), *kw.items()]:
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, before[k]), k
            assert v.grad is None, k


# ---- gradients ---------------------------------------------------------------------------------
def _grad_inputs(reducer, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([2, 0, 3, 1, 4])
    N = int(lengths.sum())
    # distinct values: max/min/prod are differentiable there; a zero in prod's data is tested separately
    data = torch.randperm(3 * N, generator=g)[: N * 2].reshape(N, 2).double() / 7 + 0.3
    data = data * torch.where(torch.rand(N, 2, generator=g) < 0.3, -1.0, 1.0).double()
    w = weights_for(reducer, N, lengths, seed)
    return data, lengths, w


@pytest.mark.parametrize(
    "rep", ["lengths", "offsets", "sorted_ids", "unsorted_ids", "fused_lengths", "fused_unsorted"]
)
@pytest.mark.parametrize("reducer", REDUCERS)
def test_gradcheck(backend, reducer, rep):
    """gradcheck of data and weights in every representation; gradgradcheck of the linear reducers and of
    logsumexp/logmeanexp (whose backward recomputes the result from the data when differentiated)."""
    data, lengths, w = _grad_inputs(reducer)
    S = lengths.numel()
    ids = torch.repeat_interleave(torch.arange(S), lengths)
    kw = {}
    if rep == "fused_lengths":  # a table with repeated lookups, sorted segments
        kw.update(lengths=lengths, indices=torch.tensor([4, 1, 2, 0, 3, 1, 2, 4, 0, 1]))
        data = data[:5].clone()
    elif rep == "lengths":
        kw["lengths"] = lengths
    elif rep == "offsets":
        kw["offsets"] = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    elif rep == "sorted_ids":
        kw.update(segment_ids=ids, num_segments=S)
    else:
        perm = torch.randperm(data.shape[0], generator=torch.Generator().manual_seed(1))
        kw.update(segment_ids=ids[perm], sorted=False, num_segments=S)
        data = data[perm]
        if w is not None and reducer != "positional_weighted_sum":
            w = w[perm]
        if rep == "fused_unsorted":  # a table with repeated lookups: indices with duplicates
            kw["indices"] = torch.tensor([0, 1, 2, 0, 3, 1, 2, 4, 0, 1])
            data = data[:5].clone()
    x = data.clone().requires_grad_()
    inputs = [x]
    if w is not None:
        inputs.append(w.clone().requires_grad_())

    def f(
        x, w=None
    ):  # empty=0: a constant, finite empty value (the default -inf of logsumexp breaks gradcheck)
        return segment.reduce(x, reducer, weights=w, empty=0.0, **kw)

    assert torch.autograd.gradcheck(f, tuple(inputs))
    if segment.SEGMENT_REDUCERS[reducer].kind in ("sum", "lse"):
        assert torch.autograd.gradgradcheck(f, tuple(inputs))


def test_gradcheck_prod_with_zeros(backend):
    data = torch.tensor(
        [[0.0, 2.0], [3.0, 0.0], [0.0, 5.0], [1.5, 0.0], [2.0, 0.5]],
        dtype=torch.float64,
        requires_grad=True,
    )
    lengths = torch.tensor(
        [2, 3]
    )  # segment 0: one zero per column; segment 1: column 0 one zero, column 1 one
    assert torch.autograd.gradcheck(lambda x: segment.reduce(x, "prod", lengths=lengths), (data,))
    d2 = torch.tensor(
        [[0.0], [0.0], [2.0]], dtype=torch.float64, requires_grad=True
    )  # two zeros: gradient 0
    segment.reduce(d2, "prod", lengths=torch.tensor([3])).sum().backward()
    assert d2.grad.tolist() == [[0.0], [0.0], [0.0]]


@pytest.mark.parametrize(
    "ties,expect",
    [
        ("split", [0.5, 0.5, 0.0, 1.0]),
        ("first", [1.0, 0.0, 0.0, 1.0]),
        ("all", [1.0, 1.0, 0.0, 1.0]),
    ],
)
def test_tie_policies(backend, ties, expect):
    x = torch.tensor([[2.0], [2.0], [1.0], [5.0]], requires_grad=True)
    segment.reduce(x, "max", lengths=torch.tensor([3, 1]), ties=ties).sum().backward()
    assert x.grad.flatten().tolist() == expect
    # same as torch.amax for "split"
    if ties == "split":
        y = x.detach().clone().requires_grad_()
        torch.amax(y[:3], 0).sum().backward()
        assert_close(x.grad[:3], y.grad[:3])


def test_gradient_matches_dense_autograd(backend):
    g = torch.Generator().manual_seed(3)
    table = torch.randn(7, 4, dtype=torch.float64, generator=g)
    idx = torch.randint(0, 7, (12,), generator=g)
    lengths = torch.tensor([3, 0, 5, 4])
    w = torch.rand(12, dtype=torch.float64, generator=g)
    a = table.clone().requires_grad_()
    wa = w.clone().requires_grad_()
    out = segment.reduce(a, "weighted_sum", lengths=lengths, indices=idx, weights=wa)
    up = torch.randn_like(out)
    (out * up).sum().backward()
    b = table.clone().requires_grad_()
    wb = w.clone().requires_grad_()
    eb = torch.nn.functional.embedding_bag(
        idx, b, torch.tensor([0, 3, 3, 8]), mode="sum", per_sample_weights=wb
    )
    (eb * up).sum().backward()
    assert_close(out, eb)
    assert_close(a.grad, b.grad)
    assert_close(wa.grad, wb.grad)


# ---- Caffe2 aliases ----------------------------------------------------------------------------
def test_every_alias_matches_reduce(backend):
    g = torch.Generator().manual_seed(5)
    lengths = torch.tensor([2, 0, 3])
    ids = torch.repeat_interleave(torch.arange(3), lengths)
    data = torch.randn(5, 2, dtype=torch.float64, generator=g)
    table = torch.randn(4, 2, dtype=torch.float64, generator=g)
    idx = torch.tensor([3, 0, 0, 2, 1])
    w = torch.rand(5, dtype=torch.float64, generator=g) + 0.5
    checked = 0
    for name, (fam, r) in segment.ALIASES.items():
        fn = getattr(segment, name)
        weighted = r in WEIGHTED
        wa = [w] if weighted else []
        if fam in ("reduce_front", "reduce_back"):
            x = torch.randn(3, 4, 2, dtype=torch.float64, generator=g)
            wf = torch.rand(3 if fam == "reduce_front" else 2, dtype=torch.float64, generator=g)
            got = fn(x, *([wf] if weighted else []))
            if fam == "reduce_front":
                ref = ref_reduce(x, torch.tensor([3]), r, wf)[0]
            else:
                ref = ref_reduce(x.movedim(-1, 0), torch.tensor([2]), r, wf)[0]
            assert_close(got, ref, msg=name)
            checked += 1
            continue
        if fam == "lengths":
            got, ref = (
                fn(data, *wa, lengths),
                segment.reduce(data, r, lengths=lengths, weights=w if weighted else None),
            )
        elif fam == "sparse_lengths":
            got = fn(table, *wa, idx, lengths)
            ref = segment.reduce(
                table, r, lengths=lengths, indices=idx, weights=w if weighted else None
            )
        elif fam in ("sorted_segment", "sorted_segment_range"):
            got = fn(data, *wa, ids)
            ref = ref_reduce(data, torch.tensor([2, 0, 3]), r, w if weighted else None)
        elif fam == "sparse_sorted_segment":
            got = fn(table, *wa, idx, ids)
            ref = ref_reduce(table[idx], lengths, r, w if weighted else None)
        elif fam == "unsorted_segment":
            got = fn(data.flip(0), *[t.flip(0) for t in wa], ids.flip(0), num_segments=3)
            ref = ref_reduce(data, lengths, r, w if weighted else None)
        else:  # sparse_unsorted_segment
            got = fn(table, *[t.flip(0) for t in wa], idx.flip(0), ids.flip(0), num_segments=3)
            ref = ref_reduce(table[idx], lengths, r, w if weighted else None)
        assert_close(got, ref, msg=name)
        checked += 1
    assert checked == len(segment.ALIASES) >= 40
    with pytest.raises(
        TypeError, match=r"lengths_weighted_sum\(\) takes data and 2 more positional tensors"
    ):
        segment.lengths_weighted_sum(data, lengths)


# ---- gather / scatter --------------------------------------------------------------------------
def test_gather_scatter_sequential_reference():
    g = torch.Generator().manual_seed(0)
    data = torch.randn(6, 3, generator=g)
    idx = torch.tensor([4, 1, 4, 0, 4])
    assert_close(segment.gather(data, idx.view(5, 1)), data[idx].view(5, 1, 3))
    sl = torch.randn(5, 3, generator=g)
    ref = data.clone()
    for i, r in enumerate(idx.tolist()):
        ref[r] = sl[i]
    out = data.clone()
    assert segment.scatter_assign(out, idx, sl) is out
    assert_close(out, ref)
    x1, x2 = torch.randn(5, 3, generator=g), torch.randn(5, 3, generator=g)
    ref = data.clone()
    for r in idx.tolist():  # Caffe2: every occurrence scales, then every update adds
        ref[r] *= 0.9
    for x, wk in ((x1, 2.0), (x2, -0.5)):
        for i, r in enumerate(idx.tolist()):
            ref[r] += wk * x[i]
    out = data.clone()
    segment.scatter_weighted_sum(out, 0.9, idx, x1, 2.0, x2, torch.tensor(-0.5))
    assert_close(out, ref)
    before = data.clone()
    with pytest.raises(IndexError, match=r"indices\[1\] = 6 is out of range for 6"):
        segment.scatter_weighted_sum(data, 0.9, torch.tensor([0, 6]), torch.ones(2, 3), 1.0)
    with pytest.raises(ValueError, match=r"slices must have shape \(2, 3\)"):
        segment.scatter_assign(data, torch.tensor([0, 1]), torch.ones(3, 3))
    assert torch.equal(data, before)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("shape", ["long_segments", "many_segments"])
def test_threaded_kernels(backend, threads, shape, monkeypatch):
    """The compiled kernels split a call over threads (forced here on small inputs): sorted segments by
    ranges; unsorted ids by position ranges into partial tables then merged (few segments), or by ranges
    of segments (many).  Same values and first-extreme positions as the reference, NaN included."""
    from sparsefill._kernels import segment as _kernels

    monkeypatch.setattr(_kernels, "GRAIN", 1)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(11)
        lengths = (
            torch.randint(0, 30, (6,), generator=g)
            if shape == "long_segments"
            else torch.randint(0, 3, (40,), generator=g)
        )
        lengths[1] = 0
        N = int(lengths.sum())
        data = torch.randn(N, 24, generator=g, dtype=torch.float64)
        data[3, 5] = float("nan")
        data[N - 1, 0] = float("nan")
        for reducer in ("sum", "weighted_sum", "max", "min", "mean"):
            w = weights_for(reducer, N, lengths, seed=2)
            expect = ref_reduce(data, lengths, reducer, w)
            _, arg1, _ = in_representation("lengths", data, lengths, w, reducer)
            for rep in ("lengths", "fused", "unsorted_ids", "fused_unsorted"):
                out, arg, rowmap = in_representation(rep, data, lengths, w, reducer, seed=3)
                assert_close(out, expect, equal_nan=True, msg=lambda m: f"{rep} {reducer}: {m}")
                if arg is not None:
                    assert torch.equal(
                        torch.where(arg >= 0, rowmap[arg.clamp_min(0)], arg), arg1
                    ), (rep, reducer)
        # a bad row index found by a thread other than the first: the error names the first bad entry
        idx = torch.arange(N)
        idx[N - 2], idx[N - 1] = N + 5, -3
        ids = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
        for kw in (dict(lengths=lengths), dict(segment_ids=ids.flip(0), sorted=False)):
            with pytest.raises(IndexError, match=rf"indices\[{N - 2}\] = {N + 5} is out of range"):
                segment.reduce(data, "max", indices=idx, validate=False, **kw)
        # unsorted ids out of range, found by the kernels (not counted first for the sums)
        S = lengths.numel()
        bad_ids = ids.flip(0).clone()
        bad_ids[N - 3], bad_ids[N - 1] = S, -1
        for reducer in ("sum", "weighted_sum", "max"):
            w = weights_for(reducer, N, lengths)
            with pytest.raises(
                IndexError, match=rf"segment_ids\[{N - 3}\] = {S} is out of range for num_segments"
            ):
                segment.reduce(
                    data, reducer, segment_ids=bad_ids, sorted=False, num_segments=S, weights=w
                )
    finally:
        torch.set_num_threads(saved)


def _run_python(code: str) -> str:
    """Run ``code`` in a fresh interpreter; its stdout (stripped), after checking it exited cleanly."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_without_numba_the_torch_path_runs():
    """numba is an optional extra: with it absent, the package imports and every reducer runs on torch ops."""
    code = (
        "import sys; sys.modules['numba'] = None\n"
        "import torch, sparsefill\n"
        "from sparsefill import segment\n"
        "assert not segment.compiled_available()\n"
        "x = torch.tensor([[1., 5.], [3., 2.], [0., 7.]]); ids = torch.tensor([1, 0, 1])\n"
        "assert segment.reduce(x, 'max', segment_ids=ids, sorted=False).tolist() == [[3., 2.], [1., 7.]]\n"
        "assert segment.reduce(x, 'sum', lengths=torch.tensor([2, 1])).tolist() == [[4., 7.], [0., 7.]]\n"
        "print('ok')\n"
    )
    assert _run_python(code) == "ok"


@pytest.mark.skipif(
    not segment.compiled_available(), reason="needs numba (the compiled backend)"
)  # reported by -rs
def test_compiled_kernels_keep_torch_thread_count():
    """numba's OpenMP layer shares libgomp with torch and sets the process-wide thread count when it
    starts (the first parallel call in a process): torch.get_num_threads() must not change."""
    code = (
        "import torch; torch.set_num_threads(1)\n"
        "from sparsefill import segment\n"
        "segment.set_backend('numba')\n"
        "x = torch.randn(50, 16); ids = torch.randint(0, 5, (50,))\n"
        "segment.reduce(x, 'sum', segment_ids=ids, num_segments=5, sorted=False)\n"
        "segment.reduce(x, 'max', lengths=torch.tensor([20, 30]))\n"
        "print(torch.get_num_threads())\n"
    )
    assert _run_python(code) == "1"


@pytest.mark.skipif(
    not segment.compiled_available() or not hasattr(__import__("os"), "fork"),
    reason="needs numba (the compiled backend) and os.fork",
)  # reported by -rs
def test_threaded_kernels_after_fork():
    """A forked child (e.g. a data-loader worker) gets its own worker threads: no wait on the parent's."""
    code = (
        "import os, torch\n"
        "from sparsefill import segment\n"
        "from sparsefill._kernels import segment as _kernels\n"
        "segment.set_backend('numba'); _kernels.GRAIN = 1; torch.set_num_threads(2)\n"
        "x = torch.randn(1000, 8); ids = torch.randint(0, 5, (1000,))\n"
        "a = segment.reduce(x, 'sum', segment_ids=ids, num_segments=5, sorted=False)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    b = segment.reduce(x, 'max', segment_ids=ids, num_segments=5, sorted=False)\n"
        "    os._exit(0 if torch.equal(b, torch.stack([x[ids == s].amax(0) for s in range(5)])) else 3)\n"
        "print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
    )
    assert _run_python(code) == "0"


# ---------------------------------------------------------------- edge cases
import numpy as np  # noqa: E402


def test_logsumexp_double_backward_is_the_softmax_jacobian():
    """The Hessian of logsumexp is diag(p) - p p^T (it was diagonal: the saved result was used as a constant)."""
    x = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    for reducer, ref in [
        ("logsumexp", lambda a: torch.logsumexp(a, 0)),
        ("logmeanexp", lambda a: torch.logsumexp(a, 0) - torch.log(torch.tensor(3.0))),
    ]:
        H = torch.autograd.functional.hessian(
            lambda a: segment.reduce(a, reducer, lengths=torch.tensor([3])).sum(), x
        )
        assert_close(H, torch.autograd.functional.hessian(ref, x))


@pytest.mark.parametrize("reducer", ["sum", "mean", "weighted_sum", "max", "prod", "logsumexp"])
def test_output_can_be_modified_in_place(reducer):
    """As embedding_bag's: the result is not a view of a saved tensor.  Where the backward needs the result
    (max/min, logsumexp), modifying it in place makes the backward raise, as torch's own ops do."""
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    w = torch.rand(5, dtype=torch.float64) if reducer == "weighted_sum" else None
    out = segment.reduce(x, reducer, lengths=torch.tensor([2, 3]), weights=w)
    out.relu_()
    if reducer in ("max", "logsumexp"):
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()
        return
    out.sum().backward()
    x2 = x.detach().clone().requires_grad_()
    ref = segment.reduce(x2, reducer, lengths=torch.tensor([2, 3]), weights=w).relu()
    ref.sum().backward()
    assert_close(x.grad, x2.grad)


def test_scatter_weighted_sum_weights_are_scalars():
    """Caffe2 enforces one element per weight; a (2,) weight used to broadcast over rows or columns."""
    data = torch.ones(2, 2)
    before = data.clone()
    with pytest.raises(
        ValueError, match=r"weight0 must be a scalar \(one element\), got shape \(2,\)"
    ):
        segment.scatter_weighted_sum(data, torch.tensor([2.0, 3.0]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"w_2 must be a scalar"):
        segment.scatter_weighted_sum(
            data,
            1.0,
            torch.tensor([0, 1]),
            torch.ones(2, 2),
            1.0,
            torch.ones(2, 2),
            torch.tensor([2.0, 3.0]),
        )
    assert torch.equal(data, before)
    segment.scatter_weighted_sum(
        data, torch.tensor([2.0]), torch.tensor([0]), torch.ones(1, 2), torch.tensor(3.0)
    )
    assert data.tolist() == [[5.0, 5.0], [1.0, 1.0]]


def test_arguments_checked_on_every_path():
    x = torch.ones(4, 2)
    L = torch.tensor([1, 3])
    with pytest.raises(
        ValueError, match="out_of_range must be 'error', 'drop' or 'clip', got 'bogus'"
    ):
        segment.reduce(x, "sum", lengths=L, out_of_range="bogus")
    with pytest.raises(ValueError, match="num_segments must be a non-negative int, got -1"):
        segment.reduce(
            x, "sum", segment_ids=torch.tensor([0, 0, 1, 1]), sorted=False, num_segments=-1
        )
    with pytest.raises(ValueError, match="mode must be 'sequential' or 'coalesced', got 'bogus'"):
        segment.SparseFtrl([torch.nn.Parameter(torch.ones(2))], mode="bogus")
    ids = torch.tensor([0, 0, 1, 1])
    for n in (np.int64(3), torch.tensor(3)):  # numpy integers and 0-d integer tensors count as ints
        for sorted_ in (True, False):
            assert segment.reduce(
                x, "sum", segment_ids=ids, sorted=sorted_, num_segments=n
            ).shape == (3, 2)
    xi = torch.tensor([[1], [2], [3], [4]])
    with pytest.raises(ValueError, match="empty=1000 cannot be stored in torch.int8 data"):
        segment.reduce(xi.to(torch.int8), "max", lengths=torch.tensor([4, 0]), empty=1000)
    for empty in (float("-inf"), float("nan"), 0.5):
        with pytest.raises(
            ValueError, match=rf"empty={empty} cannot be stored in torch.int64 data"
        ):
            segment.reduce(xi, "max", lengths=torch.tensor([4, 0]), empty=empty)
    assert segment.reduce(xi, "max", lengths=torch.tensor([4, 0]), empty=-7).tolist() == [[4], [-7]]


@pytest.mark.parametrize("empty", ["x", {}, 1j, torch.ones(2)])
def test_empty_is_checked_before_any_segment_is_read(empty):
    """``empty`` that is no real number raises a TypeError naming it, also when no segment is empty (it was read
    only by the fill of an empty segment, whose error came from torch's ``index_fill_``)."""
    x = torch.ones(3, 2)
    for lengths in ([1, 2], [1, 0, 2]):
        with pytest.raises(TypeError, match="empty must be a real number"):
            segment.reduce(x, "sum", lengths=torch.tensor(lengths), empty=empty)
    assert segment.reduce(
        x, "sum", lengths=torch.tensor([3, 0]), empty=torch.tensor(-1.0)
    ).tolist() == [[3, 3], [-1, -1]]


def test_lengths_whose_sum_overflows_raise():
    """(They wrapped to a small total: the compiled kernels then looped ~2**62 times.)"""
    L = torch.tensor([2**62, 2**62, 2**62, 2**62 + 5])
    for backend in ("numba", "torch") if segment.compiled_available() else ("torch",):
        with segment.use_backend(backend):
            for D in (1, 4):
                with pytest.raises(ValueError, match=r"lengths overflow int64: .* at lengths\[1\]"):
                    segment.reduce(torch.randn(5, D), "max", lengths=L)


def test_lengths_and_offsets_are_checked_even_without_validation():
    """validate=False skips the O(N) checks only: a negative length made embedding_bag read garbage."""
    x = torch.ones(2, 3)
    with pytest.raises(ValueError, match=r"lengths must be non-negative, got lengths\[1\] = -3"):
        segment.reduce(x, "sum", lengths=torch.tensor([5, -3]), validate=False)
    with pytest.raises(ValueError, match="offsets must not decrease"):
        segment.reduce(x, "sum", offsets=torch.tensor([0, 5, 2]), validate=False)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("reducer", ["sum", "mean", "weighted_sum", "max", "min", "logsumexp"])
def test_half_precision_data(dtype, reducer):
    """float16 / bfloat16 data (the torch path): the float32 result rounded, within half precision."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([3, 0, 2, 4])
    x = torch.randn(9, 3, generator=g).to(dtype)
    w = torch.rand(9, generator=g).to(dtype) if reducer == "weighted_sum" else None
    ids = torch.repeat_interleave(torch.arange(4), lengths)
    ref = segment.reduce(
        x.float(), reducer, lengths=lengths, weights=None if w is None else w.float()
    )
    for kw in (dict(lengths=lengths), dict(segment_ids=ids.flip(0), sorted=False, num_segments=4)):
        xx = x if "lengths" in kw else x.flip(0)
        ww = w if (w is None or "lengths" in kw) else w.flip(0)
        out = segment.reduce(xx, reducer, weights=ww, **kw)
        assert out.dtype == dtype
        assert_close(out.float(), ref, atol=2e-2, rtol=2e-2, equal_nan=True)
