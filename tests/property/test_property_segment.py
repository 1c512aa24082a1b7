"""``sparsefill.segment.reduce`` on generated data and segments equals a reference by hand: each segment's rows
reduced by torch on a slice (``data[rows of s]``), an empty segment ``empty`` (default per reducer); segments by
lengths, offsets, sorted or unsorted ids, with a fused gather (``indices``) or not; invalid segment arguments raise
ValueError/IndexError naming the argument."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, strategies as st

from tests.property.sparse_strategies import SETTINGS, assert_same
from sparsefill import segment

REDUCERS = {  # name: (reference over a (n, ...) slice with n >= 1, takes integers)
    "sum": (lambda x: x.sum(0), True),
    "mean": (lambda x: x.mean(0), False),
    "sqrt_n": (lambda x: x.sum(0) / math.sqrt(x.shape[0]), False),
    "max": (lambda x: x.amax(0), True),
    "min": (lambda x: x.amin(0), True),
    "prod": (lambda x: x.prod(0), True),
    "logsumexp": (lambda x: torch.logsumexp(x, 0), False),
    "logmeanexp": (lambda x: torch.logsumexp(x, 0) - math.log(x.shape[0]), False),
}


@st.composite
def _segments(draw):
    """``(data, kwargs of reduce, the rows of every segment)``."""
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.int64]))
    lengths = draw(st.lists(st.integers(0, 3), max_size=5))
    n_pos = sum(lengths)
    gather = draw(st.booleans())
    rows = draw(st.integers(0 if not gather or not n_pos else 1, 5)) if gather else n_pos
    width = draw(st.sampled_from([(), (1,), (2,), (2, 2)]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 999)))
    data = torch.randint(-4, 5, (rows,) + width, generator=g).to(dtype)
    if dtype.is_floating_point and draw(st.booleans()):
        data = data / 2
    indices = torch.randint(0, max(rows, 1), (n_pos,), generator=g) if gather else None
    kind = draw(st.sampled_from(["lengths", "offsets", "sorted_ids", "unsorted_ids"]))
    L = torch.tensor(lengths, dtype=torch.int64)
    seg = torch.repeat_interleave(torch.arange(len(lengths)), L)
    kw = {}
    if kind == "lengths":
        kw["lengths"] = L
    elif kind == "offsets":
        kw["offsets"] = torch.cat([torch.zeros(1, dtype=torch.int64), L.cumsum(0)])
    else:
        perm = torch.randperm(n_pos, generator=g) if kind == "unsorted_ids" else torch.arange(n_pos)
        seg = seg[perm]
        kw.update(segment_ids=seg, num_segments=len(lengths), sorted=kind == "sorted_ids")
        if indices is not None:
            indices = indices[perm]
    if indices is not None:
        kw["indices"] = indices
    src = torch.arange(n_pos) if indices is None else indices  # (the row each position reads)
    members = [src[seg == s] if kind.endswith("ids") else None for s in range(len(lengths))]
    if not kind.endswith("ids"):
        starts = [sum(lengths[:s]) for s in range(len(lengths))]
        members = [src[a : a + k] for a, k in zip(starts, lengths)]
    return data, kw, members


@SETTINGS
@given(_segments(), st.sampled_from(sorted(REDUCERS)), st.sampled_from([None, -1.0, 7]))
def test_reduce_matches_a_reference_by_hand(case, name, empty):
    data, kw, members = case
    ref, int_ok = REDUCERS[name]
    if not data.is_floating_point() and not int_ok:
        with pytest.raises(TypeError, match="floating-point"):
            segment.reduce(data, name, **kw)
        return
    default = segment.SEGMENT_REDUCERS[name].empty
    e = default if empty is None else empty
    out = segment.reduce(data, name, empty=empty, **kw)
    want = (
        torch.stack(
            [
                ref(data[rows]) if rows.numel() else torch.full(data.shape[1:], e, dtype=data.dtype)
                for rows in members
            ]
        )
        if members
        else data.new_zeros((0,) + data.shape[1:])
    )
    assert_same(out, want.to(data.dtype))


@SETTINGS
@given(
    _segments(), st.sampled_from(["negative", "short", "long", "out_of_range_id", "index", "empty"])
)
def test_invalid_segments_raise_naming_the_argument(case, how):
    data, kw, members = case
    bad = dict(kw)
    key = next(k for k in ("lengths", "offsets", "segment_ids") if k in kw)
    if how == "negative" and kw[key].numel():
        bad[key] = kw[key].clone()
        bad[key][0] = -1
        name = key
    elif how in ("short", "long") and key != "offsets" and (how == "long" or kw[key].numel()):
        v = kw[key]  # (lengths: their sum is not the rows; segment_ids: not one per row)
        bad[key] = torch.cat([v, torch.ones(1, dtype=v.dtype)]) if how == "long" else v[:-1]
        if key == "lengths" and how == "short" and not int(v[-1]):
            return  # (a last length 0 dropped: still valid)
        name = key
    elif how == "out_of_range_id" and key == "segment_ids" and kw[key].numel():
        bad[key] = kw[key].clone()
        bad[key][-1] = kw["num_segments"]
        name = "segment_ids|num_segments"
    elif how == "index" and "indices" in kw and kw["indices"].numel():
        bad["indices"] = kw["indices"].clone()
        bad["indices"][0] = data.shape[0]
        name = "indices"
    elif how == "empty":
        bad["empty"] = "none"
        name = "empty"
    else:
        return
    with pytest.raises((ValueError, IndexError, TypeError), match=name):
        segment.reduce(data, "sum", **bad)
