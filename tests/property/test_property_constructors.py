"""Constructors on generated inputs: valid parts give the dense tensor built by hand (duplicates add up, the fill
elsewhere); invalid parts raise ValueError/TypeError/IndexError naming the argument, and modify nothing."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, strategies as st

import sparsefill
from tests.property.sparse_strategies import DTYPES, SETTINGS, assert_same, random_values


@st.composite
def _coo_parts(draw):
    """``(indices, values, size, fill, dtype)`` of a valid COO tensor (maybe duplicates, maybe hybrid)."""
    dtype = draw(st.sampled_from(DTYPES))
    sdim, ddim = draw(st.integers(1, 3)), draw(st.integers(0, 1))
    size = tuple(draw(st.lists(st.integers(1, 4), min_size=sdim + ddim, max_size=sdim + ddim)))
    nse = draw(st.integers(0, 6))
    g = torch.Generator().manual_seed(draw(st.integers(0, 999)))
    idx = (
        torch.stack([torch.randint(0, n, (nse,), generator=g) for n in size[:sdim]])
        if sdim
        else torch.zeros(0, nse, dtype=torch.int64)
    )
    vals = random_values(g, (nse,) + size[sdim:], dtype, False)
    fill = draw(st.sampled_from([0, 1])) if dtype != torch.bool else draw(st.booleans())
    return idx, vals, size, fill, dtype


def _by_hand(idx, vals, size, fill, dtype):
    sdim = idx.shape[0]
    out = torch.full(size, fill, dtype=dtype)
    if idx.shape[1]:
        seen = torch.zeros(size[:sdim], dtype=torch.bool)
        seen[tuple(idx)] = True
        acc = torch.zeros(size, dtype=torch.float64 if dtype != torch.int64 else torch.int64)
        acc.index_put_(tuple(idx), vals.to(acc.dtype), accumulate=True)
        if dtype == torch.bool:
            acc = acc != 0
        out[seen] = acc[seen].to(dtype)
    return out


@SETTINGS
@given(_coo_parts(), st.booleans())
def test_valid_parts_give_the_dense_tensor_by_hand(parts, csr):
    idx, vals, size, fill, dtype = parts
    A = sparsefill.sparse_coo_tensor(idx, vals, size, fill_value=fill)
    want = _by_hand(idx, vals, size, fill, dtype)
    assert_same(A, want)
    if csr and idx.shape[0] == 2:
        assert_same(A.to_sparse_csr(dense_dim=len(size) - 2), want)


BAD = [
    "index_out_of_range",
    "index_negative",
    "index_float",
    "index_rank",
    "values_count",
    "size_small",
    "size_negative",
    "fill_shape",
    "fill_lossy",
    "fill_object",
    "fill_overflow",
    "values_rank",
]


@SETTINGS
@given(_coo_parts(), st.sampled_from(BAD))
def test_invalid_coo_parts_raise_naming_the_argument(parts, how):
    idx, vals, size, fill, dtype = parts
    kw = {"fill_value": fill}
    name, nse, sdim = None, idx.shape[1], idx.shape[0]
    if how == "index_out_of_range" and nse:
        idx = idx.clone()
        idx[-1, 0] = size[sdim - 1]
        name = "ind|size"
    elif how == "index_negative" and nse:
        idx = idx.clone()
        idx[0, -1] = -1
        name = "ind|negative"
    elif how == "index_float":
        idx, name = idx.double(), "ind"
    elif how == "index_rank":
        idx, name = idx.reshape(-1), "ind"
    elif how == "values_count":
        vals, name = (
            torch.cat([vals, vals[:1] if nse else torch.zeros((1,) + vals.shape[1:], dtype=dtype)]),
            "values|nse|ind",
        )
    elif how == "size_small":
        size, name = (0,) + size[1:], "size|ind|out of"
        if not nse:
            return
    elif how == "size_negative":
        size, name = (-1,) + size[1:], "size"
    elif how == "fill_shape":
        kw["fill_value"], name = torch.zeros(7, dtype=dtype), "fill_value"
    elif how == "fill_lossy" and dtype in (torch.int64, torch.bool):
        kw["fill_value"], name = 0.5, "fill_value"
    elif how == "fill_object":
        kw["fill_value"], name = {"a": 1}, "fill_value"
    elif how == "fill_overflow" and dtype == torch.float32:
        kw["fill_value"], name = 1e300, "fill_value"
    elif how == "values_rank":
        vals, name = vals.reshape((1,) + tuple(vals.shape)), "values|dense|size"
    if name is None:
        return
    before = (idx.clone(), vals.clone())
    with pytest.raises((ValueError, TypeError, IndexError), match=f"(?i)({name})"):
        sparsefill.sparse_coo_tensor(idx, vals, size, **kw)
    assert torch.equal(idx, before[0]) and torch.equal(vals, before[1])


@SETTINGS
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=4),
    st.integers(1, 4),
    st.sampled_from(
        [
            "crow_decreasing",
            "crow_length",
            "crow_first",
            "col_out_of_range",
            "col_negative",
            "values_count",
            "crow_last",
        ]
    ),
    st.integers(0, 99),
)
def test_invalid_csr_parts_raise_naming_the_argument(counts, ncols, how, seed):
    g = torch.Generator().manual_seed(seed)
    counts = [min(c, ncols) for c in counts]
    crow = torch.cat([torch.zeros(1, dtype=torch.int64), torch.tensor(counts).cumsum(0)])
    col = torch.cat([torch.randperm(ncols, generator=g)[:c].sort().values for c in counts]).to(
        torch.int64
    )
    vals = torch.ones(col.numel())
    size = (len(counts), ncols)
    sparsefill.sparse_csr_tensor(crow, col, vals, size)  # (valid)
    nnz = col.numel()
    if how == "crow_decreasing" and nnz and len(counts) >= 2:
        crow = crow.clone()
        crow[1], crow[-1] = nnz + 1, nnz  # (a row of more elements than stored, the next negative)
        name = "crow"
    elif how == "crow_length":
        crow, name = torch.cat([crow, crow[-1:]]), "crow|size|rows"
    elif how == "crow_first":
        crow, name = crow + 1, "crow"
    elif how == "crow_last" and nnz:
        crow, name = crow.clone(), "crow|nnz|col|values"
        crow[-1] = nnz - 1
    elif how == "col_out_of_range" and nnz:
        col, name = col.clone(), "col|size|out of"
        col[0] = ncols
    elif how == "col_negative" and nnz:
        col, name = col.clone(), "col|negative"
        col[-1] = -1
    elif how == "values_count":
        vals, name = torch.ones(nnz + 1), "values|nnz|col"
    else:
        return
    with pytest.raises((ValueError, TypeError, IndexError), match=f"(?i)({name})"):
        sparsefill.sparse_csr_tensor(crow, col, vals, size)
