"""The reducer protocol (sparsefill._kernels.reducer) against the dense reduction of every slice, fills included."""

import math
import warnings

import pytest
import torch
from torch.testing import assert_close

from sparsefill._kernels.reducer import REDUCERS, Norm, Var, segment_arg

FILLS = [0.0, 1.5, -2.0, math.inf, -math.inf, math.nan]


def _case(seed, dtype=torch.float64, D=(), S=6, k=20):
    g = torch.Generator().manual_seed(seed)
    seg = torch.randint(0, S, (k,), generator=g)
    if dtype.is_floating_point:
        values = torch.randn(k, *D, generator=g, dtype=dtype)
        values[torch.rand(k, generator=g) < 0.1] = math.nan if seed % 3 == 0 else math.inf
    else:
        values = torch.randint(-3, 4, (k, *D), generator=g).to(dtype)
    n_fill = torch.randint(0, 3, (S,), generator=g)
    n_fill[0] = 0
    return values, seg, n_fill


def _reference(r, values, seg, S, fill, n_fill):
    out = []
    for s in range(S):
        f = torch.as_tensor(fill, dtype=values.dtype).expand(int(n_fill[s]), *values.shape[1:])
        with (
            warnings.catch_warnings()
        ):  # torch.var warns on a slice of one element (and returns NaN, as we do)
            warnings.simplefilter("ignore")
            out.append(r.dense(torch.cat([values[seg == s], f])))
    return torch.stack(out)


@pytest.mark.parametrize(
    "name", ["sum", "prod", "amax", "amin", "mean", "logsumexp", "var", "norm"]
)
@pytest.mark.parametrize("fill", FILLS)
@pytest.mark.parametrize("D", [(), (3,)])
def test_reducer_equals_dense_reduction_of_each_slice(name, fill, D):
    r = REDUCERS[name]
    for seed in range(4):
        values, seg, n_fill = _case(seed, D=D)
        n_fill = n_fill + (
            seg.bincount(minlength=6) + n_fill == 0
        )  # no empty slice: torch's amax refuses them
        got = r(values, seg, 6, fill=fill, n_fill=n_fill)
        assert_close(got, _reference(r, values, seg, 6, fill, n_fill), equal_nan=True)


def test_array_fill_over_trailing_dims():
    values, seg, n_fill = _case(1, D=(3,))
    fill = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    n_fill = n_fill + 1
    for name in ["sum", "prod", "amax", "mean", "logsumexp", "var"]:
        r = REDUCERS[name]
        assert_close(
            r(values, seg, 6, fill=fill, n_fill=n_fill),
            _reference(r, values, seg, 6, fill, n_fill),
            equal_nan=True,
        )


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_integer_and_bool(dtype):
    values, seg, n_fill = _case(2, dtype=dtype)
    for name in ["amax", "amin"] + (["sum", "prod"] if dtype != torch.bool else []):
        r = REDUCERS[name]
        n = n_fill + 1
        assert_close(r(values, seg, 6, fill=1, n_fill=n), _reference(r, values, seg, 6, 1, n))


def test_empty_slices_give_the_identity_and_empty_input():
    v = torch.tensor([2.0, 3.0])
    seg = torch.tensor([1, 1])
    assert REDUCERS["sum"](v, seg, 3).tolist() == [0.0, 5.0, 0.0]
    assert REDUCERS["prod"](v, seg, 3).tolist() == [1.0, 6.0, 1.0]
    assert REDUCERS["amax"](v, seg, 3).tolist() == [-math.inf, 3.0, -math.inf]
    assert REDUCERS["sum"](
        v[:0], seg[:0], 2, fill=math.nan, n_fill=torch.tensor([0, 2])
    ).isnan().tolist() == [False, True]
    assert REDUCERS["mean"](v[:0], seg[:0], 0).shape == (0,)


def test_var_correction_and_norm_orders():
    values, seg, n_fill = _case(5)
    n_fill = n_fill + 2
    for r in [Var(0), Var(2), Norm(1), Norm(3.0), Norm(math.inf), Norm(-math.inf), Norm(0)]:
        assert_close(
            r(values, seg, 6, fill=-1.5, n_fill=n_fill),
            _reference(r, values, seg, 6, -1.5, n_fill),
            equal_nan=True,
        )


def test_segment_arg_first_position_and_fill_tie():
    v = torch.tensor([1.0, 3.0, 3.0, math.nan, 0.5])
    seg = torch.tensor([0, 0, 0, 1, 1])
    pos = torch.tensor([0, 4, 2, 5, 1])
    best = REDUCERS["amax"](v, seg, 3)
    assert segment_arg(v, seg, 3, pos, best).tolist() == [2, 5, -1]
    # the fill equals the max of slice 0 at an earlier unspecified position 1
    assert segment_arg(
        v, seg, 3, pos, best, fill=3.0, fill_position=torch.tensor([1, 0, 0])
    ).tolist() == [1, 5, -1]
