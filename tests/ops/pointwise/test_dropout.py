"""Dropout of a SparseTensor with a zero or indefinite fill drops stored values only (``ops/pointwise/dropout.py``)::

    dropout(A) == A * M      M: A's pattern, values in {0, 1 / (1 - p)}, fill 0 (indefinite: masked)

checked by the invariant on the result itself (every element 0 or ``A / (1 - p)``, the unspecified elements
unchanged), the gradient ``G * M`` at the pattern, the keep rate, and torch's conventions (eval mode returns the
input, ``p`` checked, in-place writes the input).  A nonzero fill is dense by nature (the composite, warned)."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import sparsefill
from sparsefill import SparseTensor
from hypothesis import given, strategies as st
from tests.sparse_cases import (
    assert_identical,
    sparse_cases,
    dense_and_unspecified,
    differ,
    SETTINGS,
)

FORMS = ["coo", "csr", "hybrid", "uncoalesced"]


def make(form, fill=0.0, n=400, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape, dense = (20, 30), (3,) if form == "hybrid" else ()
    keys = torch.randperm(600, generator=g)[:n]
    if form == "uncoalesced":
        keys = torch.cat([keys, keys[:50]])
    idx = torch.stack([keys // 30, keys % 30])
    vals = (
        torch.rand((keys.numel(),) + dense, generator=g, dtype=torch.float64) + 0.5
    ).requires_grad_()
    A = sparsefill.sparse_coo_tensor(idx, vals, shape + dense, fill_value=fill)
    return (A.to_sparse_csr() if form == "csr" else A), vals, idx


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("fill", [0.0, sparsefill.indefinite], ids=["zero", "indefinite"])
def test_drops_stored_values_only(form, fill):
    A, vals, idx = make(form, fill)
    p = 0.25
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no densify
        out = F.dropout(A, p)
    assert (
        isinstance(out, SparseTensor)
        and out.sparse_layout == A.sparse_layout
        and out._indefinite == A._indefinite
    )
    ref = A.detach().to_dense(fill_value=0.0) if A._indefinite else A.detach().to_dense()
    got = out.detach().to_dense(fill_value=0.0) if out._indefinite else out.detach().to_dense()
    kept = got != 0
    assert_close(got[kept], ref[kept] / (1 - p))  # each element dropped whole or scaled
    assert 0.6 < kept.sum() / (ref != 0).sum() < 0.9  # ~1 - p of the nonzero elements kept
    if A._indefinite:  # masked stays masked
        assert torch.equal(
            out.detach().to_dense(fill_value=float("nan")).isnan(),
            A.detach().to_dense(fill_value=float("nan")).isnan(),
        )
    w = torch.linspace(0.1, 1, ref.numel(), dtype=ref.dtype).view(ref.shape)
    (out.to_dense(fill_value=0.0) if out._indefinite else out.to_dense()).mul(w).sum().backward()
    # d out / d vals: 1 / (1 - p) where the element was kept, else 0, at each stored element's position
    assert_close(vals.grad, torch.where(kept, w / (1 - p), 0.0)[tuple(idx)])


def test_training_flag_p_and_errors():
    A, _, _ = make("coo")
    assert F.dropout(A, 0.5, training=False) is A and torch.nn.Dropout(0.3).eval()(A) is A
    assert F.dropout(A, 0.0) is A
    assert F.dropout(A, 1.0).detach().to_dense().abs().sum() == 0
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.dropout(A, 1.5)
    with torch.no_grad():
        assert F.dropout(A, 0.5)._nse() == A._nse()


@pytest.mark.parametrize("form", ["coo", "uncoalesced"])
def test_inplace_writes_the_input(form):
    A, _, _ = make(form)
    A = A.detach()
    before = A.to_dense()
    out = F.dropout(A, 0.5, inplace=True)
    assert out is A
    after = A.to_dense()
    kept = after != 0
    assert_close(after[kept], 2 * before[kept]) and 0 < kept.sum() < (before != 0).sum()


def test_nonzero_fill_is_dense_by_nature():
    A = sparsefill.sparse_coo_tensor([[0], [1]], [1.0], (20, 30), fill_value=1.0)
    with pytest.warns(sparsefill.DensifyWarning):
        out = F.dropout(A, 0.5)
    d = out.to_dense()
    assert set(d.unique().tolist()) <= {0.0, 2.0} and 0 < (d == 0).sum() < 600


def test_gat_attention_dropout():
    """The GAT's attention dropout: dropout of a masked softmax (it raised)."""
    M = sparsefill.sparse_coo_tensor(
        [[0, 1, 1], [1, 0, 2]], [1.0, 2.0, 3.0], (2, 3), fill_value=sparsefill.indefinite
    )
    att = F.dropout(sparsefill.masked.softmax(M, 1), 0.5)
    assert att._indefinite and att._nse() == 3


# ---------------------------------------------------------------------- ops/pointwise/dropout.py
@SETTINGS
@given(
    sparse_cases(dtypes=[torch.float32, torch.float64], fills=("zero", "indefinite", "array")),
    st.sampled_from([0.0, 0.3, 1.0]),
    st.booleans(),
    st.sampled_from(["grad", "no_grad", "inference"]),
    st.integers(0, 2**16),
)
def test_dropout_matches_dense(A, p, inplace, mode, seed):
    """p = 0 and p = 1 are deterministic: equal to dense (NaN * 0 is NaN); otherwise every element is dropped
    whole (0) or scaled by 1 / (1 - p); masked elements stay masked; in place writes the input."""
    x, unspecified = dense_and_unspecified(A)
    zero_fill = (
        unspecified is None
        and bool((A.fill_value() == 0).all())
        and not A.fill_value().signbit().any()
    )
    ctx = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference": torch.inference_mode}[
        mode
    ]
    torch.manual_seed(seed)
    with ctx():
        T = A.clone()
        out = F.dropout(T, p, training=True, inplace=inplace)
        ref = F.dropout(x.clone(), p, training=True) if p in (0.0, 1.0) else None
    if inplace:
        assert out is T
    if unspecified is not None:
        assert out.is_fill_indefinite()
        r0 = out.to_dense(fill_value=0.0)
        assert torch.equal(differ(r0, out.to_dense(fill_value=1.0)), unspecified)
        got, x = r0[~unspecified], x[~unspecified]
        ref = None if ref is None else ref[~unspecified]
    else:
        got = out.to_dense()
        if not zero_fill:  # a nonzero fill (or -0.0): torch's composite, dense by nature
            if ref is not None:
                assert_identical(got, ref)
            return
    if ref is not None:
        assert_identical(got, ref)
    else:  # each element kept (x / (1 - p)) or dropped (x * 0: NaN for inf and NaN, as dense's x * mask)
        ok = torch.isclose(got, x / (1 - p), equal_nan=True) | torch.isclose(
            got, x * 0, equal_nan=True
        )
        assert bool(ok.all()), (got, x)


def test_dropout_negative_zero_fill():
    """A -0.0 fill (a zero fill, as the library compares) times the keep mask's fill -0.0 gave 0.0; dense
    keeps -0.0 * 0 = -0.0 (p = 1: deterministic)."""
    for fill in (torch.tensor(-0.0), torch.tensor([-0.0, 0.0])):
        A = sparsefill.sparse_coo_tensor(
            [[0]], torch.ones(1, *fill.shape), (3,) + tuple(fill.shape), fill_value=fill
        )
        assert_identical(F.dropout(A, 1.0), F.dropout(A.to_dense(), 1.0))
