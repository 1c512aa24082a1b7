"""sparsefill.segment conversions: against slow Python references, the spec's examples, errors."""

import doctest

import pytest
import torch
from torch.testing import assert_close

from sparsefill import segment
from sparsefill.segment import _pack, _repr

IDX = [torch.int64, torch.int32]


def rand_lengths(S, hi=4, seed=0, dtype=torch.int64):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, hi, (S,), generator=g).to(dtype)


# ---- slow references -------------------------------------------------------------------------
def ref_segment_ids(lengths):
    return [s for s, n in enumerate(lengths.tolist()) for _ in range(n)]


def ref_offsets(lengths):
    out, acc = [0], 0
    for n in lengths.tolist():
        acc += n
        out.append(acc)
    return out


def ref_pack(data, lengths, width, pad):
    rows, k = [], 0
    for n in lengths.tolist():
        seg = [data[k + j] if j < n else torch.full_like(data[0], pad) for j in range(width)]
        k += n
        rows.append(torch.stack(seg) if seg else data.new_zeros((0, *data.shape[1:])))
    return torch.stack(rows) if rows else data.new_zeros((0, width, *data.shape[1:]))


@pytest.mark.parametrize("dtype", IDX)
@pytest.mark.parametrize("S", [0, 1, 7, 50])
def test_conversions_against_reference(S, dtype):
    lengths = rand_lengths(S, dtype=dtype, seed=S)
    ids = segment.lengths_to_segment_ids(lengths)
    assert ids.dtype == dtype and ids.tolist() == ref_segment_ids(lengths)
    offs = segment.lengths_to_offsets(lengths)
    assert offs.dtype == dtype and offs.tolist() == ref_offsets(lengths)
    assert (
        segment.lengths_to_offsets(lengths, include_last=False).tolist()
        == ref_offsets(lengths)[:-1]
    )
    assert segment.offsets_to_lengths(offs).tolist() == lengths.tolist()
    assert (
        segment.offsets_to_lengths(offs[:-1], total=int(lengths.sum())).tolist() == lengths.tolist()
    )
    assert segment.segment_ids_to_lengths(ids, num_segments=S).tolist() == lengths.tolist()
    assert segment.segment_ids_to_offsets(ids, num_segments=S).tolist() == offs.tolist()
    r = segment.lengths_to_ranges(lengths)
    assert r.shape == (S, 2) and r.tolist() == [
        [o, n] for o, n in zip(ref_offsets(lengths), lengths.tolist())
    ]
    assert segment.segment_ids_to_ranges(ids, num_segments=S).tolist() == r.tolist()
    fill = segment.lengths_range_fill(lengths)
    assert fill.tolist() == [j for n in lengths.tolist() for j in range(n)]
    w = segment.lengths_to_weights(lengths, power=0.7, dtype=torch.float64)
    assert_close(
        w, torch.tensor([n**-0.7 for n in lengths.tolist() for _ in range(n)], dtype=torch.float64)
    )


def test_spec_examples():
    values = torch.tensor([1, 2, 3, 2, 4, 6, 7, 3, 6])
    lengths = torch.tensor([3, 4, 2])
    assert segment.lengths_to_segment_ids(lengths).tolist() == [0, 0, 0, 1, 1, 1, 1, 2, 2]
    assert segment.segment_ids_to_lengths(torch.tensor([0, 0, 0, 1, 1, 1, 1, 2, 2])).tolist() == [
        3,
        4,
        2,
    ]
    packed = segment.pack_segments(values, lengths, pad_value=-1)
    assert packed.tolist() == [[1, 2, 3, -1], [2, 4, 6, 7], [3, 6, -1, -1]]
    assert segment.unpack_segments(packed, lengths).tolist() == values.tolist()
    # unsorted segment ids of the spec count the same lengths
    unsorted = torch.tensor([1, 0, 2, 1, 0, 1, 1, 0, 2])
    assert segment.segment_ids_to_lengths(unsorted, sorted=False).tolist() == [3, 4, 2]
    # the "sparse tensor" interpretation: sparse_to_dense per example row
    dense = torch.stack(
        [
            segment.sparse_to_dense(values[o : o + n], torch.ones(n, dtype=torch.long), 8)
            for o, n in zip([0, 3, 7], [3, 4, 2])
        ]
    )
    assert dense.tolist() == [
        [0, 1, 1, 1, 0, 0, 0, 0],
        [0, 0, 1, 0, 1, 0, 1, 1],
        [0, 0, 0, 1, 0, 0, 1, 0],
    ]


def test_segment_ids_gaps_and_num_segments():
    ids = torch.tensor([0, 0, 2, 2, 2, 5])
    assert segment.segment_ids_to_lengths(ids).tolist() == [2, 0, 3, 0, 0, 1]
    assert segment.segment_ids_to_lengths(ids, num_segments=8).tolist() == [2, 0, 3, 0, 0, 1, 0, 0]
    assert segment.segment_ids_to_ranges(ids).tolist() == [
        [0, 2],
        [2, 0],
        [2, 3],
        [5, 0],
        [5, 0],
        [5, 1],
    ]
    assert segment.segment_ids_to_lengths(torch.tensor([], dtype=torch.long)).tolist() == []
    assert segment.segment_ids_to_lengths(
        torch.tensor([], dtype=torch.long), num_segments=2
    ).tolist() == [0, 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
@pytest.mark.parametrize("S", [0, 1, 9])
def test_tile_gather_ranges(S, dtype):
    lengths = rand_lengths(S, seed=S + 1)
    data = (torch.randn(S, 3) * 10).to(dtype)
    assert_close(
        segment.lengths_tile(data, lengths),
        torch.stack([data[s] for s in ref_segment_ids(lengths)])
        if int(lengths.sum())
        else data.new_zeros(0, 3),
    )
    N = int(lengths.sum())
    items = (torch.randn(N, 2) * 10).to(dtype)
    sel = torch.randint(0, max(S, 1), (5,)) if S else torch.zeros(0, dtype=torch.long)
    offs = ref_offsets(lengths)
    expect = [items[offs[s] + j] for s in sel.tolist() for j in range(lengths[s])]
    assert_close(
        segment.lengths_gather(items, lengths, sel),
        torch.stack(expect) if expect else items.new_zeros(0, 2),
    )
    # gather_ranges: random in-bound ranges
    g = torch.Generator().manual_seed(S)
    B, R = 3, 2
    starts = torch.randint(0, N + 1, (B, R), generator=g)
    lens = (torch.rand(B, R, generator=g) * (N - starts + 1)).long().clamp_max(N - starts)
    out, out_len = segment.gather_ranges(items, torch.stack([starts, lens], -1))
    expect = [
        items[a + j]
        for a, n in zip(starts.flatten().tolist(), lens.flatten().tolist())
        for j in range(n)
    ]
    assert_close(out, torch.stack(expect) if expect else items.new_zeros(0, 2))
    assert out_len.tolist() == lens.sum(1).tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32])
@pytest.mark.parametrize("S,D", [(0, ()), (1, ()), (6, (3,)), (6, (2, 2))])
def test_pack_unpack(S, D, dtype):
    lengths = rand_lengths(S, seed=7 + S)
    N = int(lengths.sum())
    data = (torch.randn(N, *D) * 10).to(dtype)
    width = int(lengths.max()) if S else 0
    packed, mask = segment.pack_segments(data, lengths, pad_value=-3, return_presence_mask=True)
    assert_close(packed, ref_pack(data, lengths, width, -3))
    assert mask.tolist() == [[j < n for j in range(width)] for n in lengths.tolist()]
    assert_close(segment.unpack_segments(packed, lengths), data)
    if dtype.is_floating_point:
        p = segment.pack_segments(data, lengths, pad_minf=True)
        assert bool((p[~mask] == float("-inf")).all())
    # max_length truncates, and unpack with the same max_length inverts it
    if S:
        short = segment.pack_segments(data, lengths, max_length=1, pad_value=0)
        assert short.shape[:2] == (S, 1)
        assert_close(short, ref_pack(data, lengths, width, 0)[:, :1])
        cut = segment.unpack_segments(short, lengths, max_length=1)
        assert cut.shape[0] == int((lengths > 0).sum())


def test_pack_gradcheck():
    lengths = torch.tensor([2, 0, 3, 1])
    x = torch.randn(6, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda x: segment.pack_segments(x, lengths, pad_value=1.5), (x,)
    )
    p = torch.randn(4, 3, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda p: segment.unpack_segments(p, lengths), (p,))
    assert torch.autograd.gradgradcheck(lambda x: segment.pack_segments(x, lengths), (x,))


def test_sparse_to_dense_duplicates():
    idx = torch.tensor([4, 1, 4, 4], dtype=torch.int32)
    v = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
    out = segment.sparse_to_dense(idx, v)
    assert out.tolist() == [[0, 0], [3, 4], [0, 0], [0, 0], [13, 16]]
    assert segment.sparse_to_dense(idx, v, 7).shape == (7, 2)
    with pytest.raises(IndexError, match=r"indices\[0\] = 4 is out of range for 3"):
        segment.sparse_to_dense(idx, v, 3)


@pytest.mark.parametrize("S", [0, 1, 12])
def test_lengths_top_k(S):
    lengths = rand_lengths(S, hi=6, seed=S)
    N = int(lengths.sum())
    data = torch.randint(0, 4, (N,)).double()  # many ties
    for k in (1, 3, 7):
        vals, pos = segment.lengths_top_k(data, lengths, k)
        assert vals.shape == pos.shape == (S, k)
        for s, (o, n) in enumerate(zip(ref_offsets(lengths), lengths.tolist())):
            seg = [(-data[o + j].item(), j) for j in range(n)]
            best = sorted(seg)[:k]
            assert pos[s].tolist() == [j for _, j in best] + [-1] * (k - len(best))
            assert vals[s].tolist() == [-v for v, _ in best] + [0.0] * (k - len(best))


def test_lengths_top_k_inf_nan_and_grad():
    data = torch.tensor(
        [float("-inf"), 1.0, float("-inf")], dtype=torch.float64, requires_grad=True
    )
    vals, pos = segment.lengths_top_k(data, torch.tensor([2, 1]), 2)
    assert pos.tolist() == [[1, 0], [0, -1]]
    assert vals.tolist() == [[1.0, float("-inf")], [float("-inf"), 0.0]]
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda x: segment.lengths_top_k(x, torch.tensor([3, 2]), 2)[0], (x,)
    )


# ---- errors: clear, naming the numbers ---------------------------------------------------------
def test_errors():
    with pytest.raises(ValueError, match=r"lengths must be non-negative, got lengths\[1\] = -2"):
        segment.lengths_to_segment_ids(torch.tensor([1, -2]))
    with pytest.raises(TypeError, match="int32 or int64"):
        segment.lengths_to_offsets(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="1-D"):
        segment.lengths_to_offsets(torch.tensor([[1]]))
    with pytest.raises(
        ValueError, match=r"sorted=True.*segment_ids\[1\] = 2 > segment_ids\[2\] = 1"
    ):
        segment.segment_ids_to_lengths(torch.tensor([0, 2, 1]))
    with pytest.raises(
        IndexError, match=r"segment_ids\[2\] = 3 is out of range for num_segments = 3"
    ):
        segment.segment_ids_to_lengths(torch.tensor([0, 1, 3]), num_segments=3)
    with pytest.raises(
        IndexError, match=r"segment_ids must be non-negative, got segment_ids\[0\] = -1"
    ):
        segment.segment_ids_to_lengths(torch.tensor([-1, 0]))
    with pytest.raises(ValueError, match=r"offsets must start at 0, got offsets\[0\] = 1"):
        segment.offsets_to_lengths(torch.tensor([1, 2]))
    with pytest.raises(
        ValueError, match=r"must not decrease, got offsets\[1\] = 3 > offsets\[2\] = 2"
    ):
        segment.offsets_to_lengths(torch.tensor([0, 3, 2, 4]))
    with pytest.raises(ValueError, match=r"lengths sum to 5, but the data has 4 rows"):
        segment.pack_segments(torch.zeros(4), torch.tensor([2, 3]))
    with pytest.raises(ValueError, match=r"lengths sum to 3, but the data has 4 rows"):
        segment.lengths_gather(torch.zeros(4), torch.tensor([2, 1]), torch.tensor([0]))
    with pytest.raises(IndexError, match=r"indices\[1\] = 2 is out of range for 2 segments"):
        segment.lengths_gather(torch.zeros(3), torch.tensor([2, 1]), torch.tensor([0, 2]))
    with pytest.raises(
        IndexError, match=r"ranges\[0, 1\] = \(start 2, length 3\) is out of bounds for data with 4"
    ):
        segment.gather_ranges(torch.zeros(4), torch.tensor([[[0, 1], [2, 3]]]))
    with pytest.raises(ValueError, match=r"lengths must have one entry per row of data"):
        segment.lengths_tile(torch.zeros(3, 2), torch.tensor([1, 1]))
    with pytest.raises(ValueError, match=r"lengths has an entry 3 longer than the padded length 2"):
        segment.unpack_segments(torch.zeros(2, 2), torch.tensor([3, 1]))
    with pytest.raises(ValueError, match=r"k must be a positive int"):
        segment.lengths_top_k(torch.zeros(2), torch.tensor([2]), 0)


def test_validate_false_skips_the_scan():
    # with validate=False a negative length is not looked for: no error is raised by the O(N) check
    lengths = torch.tensor([2, -1, 1])
    segment.lengths_to_offsets(lengths, validate=False)  # computes cumsum, no error
    with pytest.raises(ValueError):
        segment.lengths_to_offsets(lengths)


@pytest.mark.parametrize("mod", [segment, _repr, _pack])
def test_doctests(mod):
    res = doctest.testmod(mod, extraglobs=dict(vars(mod)), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert res.attempted > 0 and res.failed == 0


# ---------------------------------------------------------------- edge cases
def test_small_integer_index_dtypes_are_rejected():
    """int8/int16/uint8 lengths and ids wrapped (uint8 lengths [200, 100] gave offsets [0, 200, 44])."""
    for dt in (torch.uint8, torch.int8, torch.int16):
        with pytest.raises(
            TypeError, match=rf"lengths must be an int32 or int64 tensor, got dtype {dt}"
        ):
            segment.lengths_to_offsets(torch.tensor([100, 20], dtype=dt))
        with pytest.raises(TypeError, match="segment_ids must be an int32 or int64 tensor"):
            segment.reduce(torch.ones(3), "sum", segment_ids=torch.tensor([0, 1, 1], dtype=dt))


def test_int32_offsets_past_the_int32_range_raise():
    big = torch.tensor([2**30, 2**30], dtype=torch.int32)
    with pytest.raises(
        ValueError, match="int32 lengths give an offset of 2147483648, past the int32 range"
    ):
        segment.lengths_to_offsets(big)
    assert segment.lengths_to_offsets(big.long()).tolist() == [0, 2**30, 2**31]
    assert segment.lengths_to_offsets(torch.tensor([3, 4], dtype=torch.int32)).dtype == torch.int32


def test_int32_offsets_check_only_what_is_returned():
    L = torch.tensor([2**31 - 1, 1], dtype=torch.int32)
    assert segment.lengths_to_offsets(L, include_last=False).tolist() == [0, 2**31 - 1]
    assert segment.lengths_to_ranges(L).tolist() == [[0, 2**31 - 1], [2**31 - 1, 1]]
    with pytest.raises(ValueError, match="past the int32 range"):
        segment.lengths_to_offsets(L)
