"""The edge softmax: ``masked.softmax/log_softmax/softmin`` and ``torch.softmax/log_softmax`` of a SparseTensor with
indefinite fill along a sparse dim (``ops/reductions/edge_softmax.py``, one cached segment plan per pattern, closed-form backward).

Values and gradients against ``torch.masked.<op>`` on the dense equivalent with the pattern as mask, read at the
pattern, for COO (2 and 3 sparse dims, hybrid) and CSR, every sparse dim, float32/float64, slices holding +inf,
NaN, -inf only, and empty slices; the shortcut is checked to have run (the result shares the input's index
tensors), and its plan to be cached per pattern.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

import sparsefill
from sparsefill import SparseTensor
from sparsefill import masked as M
from sparsefill.ops.reductions import edge_softmax as _segsoftmax

OPS = ("softmax", "log_softmax", "softmin", "torch.softmax", "torch.log_softmax")


def _pattern(shape, nse, seed, dense=()):
    """A random coalesced COO pattern of ``shape`` (some slices empty) with randn values; special values in
    three slices: +inf, NaN, and -inf only."""
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    keys = torch.randperm(n, generator=g)[:nse].sort().values
    idx = torch.stack(torch.unravel_index(keys, shape))
    vals = torch.randn((nse,) + tuple(dense), generator=g, dtype=torch.float64)
    return idx, vals


def _special(idx, vals):
    """+inf in the slice (along the last dim) of the first stored element, NaN in that of the 6th, -inf in
    every element of that of the 11th."""
    vals = vals.clone()
    keys = idx[:-1]
    for pos, v in ((0, math.inf), (5, math.nan)):
        vals[pos] = v
    k = keys[:, 10:11]
    vals[(keys == k).all(0)] = -math.inf
    return vals


def _reference(op, idx, vals, shape, dim, g):
    """``torch.masked.<op>`` on the dense equivalent, and the gradient of ``(out * G).sum()`` (``G``: ``g`` at
    the pattern), both read at the pattern."""
    sd = idx.shape[0]
    dense_shape = tuple(shape) + tuple(vals.shape[1:])
    x = torch.zeros(dense_shape, dtype=vals.dtype).index_put_(tuple(idx), vals).requires_grad_()
    mask = torch.zeros(dense_shape, dtype=torch.bool).index_put_(tuple(idx), torch.tensor(True))
    out = getattr(torch.masked, op)(x, dim, mask=mask)
    G = torch.zeros(dense_shape, dtype=vals.dtype).index_put_(tuple(idx), g)
    (gx,) = torch.autograd.grad(out, x, G)
    at = tuple(idx)
    assert sd == len(shape)
    return out.detach()[at], gx[at]


def _fn(op):
    """``masked.<op>``, or ``torch.softmax``/``torch.log_softmax`` for ``torch.<op>`` (an indefinite fill is a mask)."""
    return getattr(torch, op[6:]) if op.startswith("torch.") else getattr(M, op)


def _check(op, A, idx, vals, shape, dim, dtype, calls):
    A.requires_grad_()
    n = len(calls)
    P = _fn(op)(A, dim)
    own = (
        (P._idx is A._idx)
        if A.sparse_layout is torch.sparse_coo
        else (P._crow is A._crow and P._col is A._col)
    )
    assert own and P.is_fill_indefinite() and P.dtype == dtype and len(calls) == n + 1, (
        "the edge softmax did not run"
    )
    g = torch.randn(vals.shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
    (gA,) = torch.autograd.grad(P._values(), A, g)
    assert len(calls) == n + 2, "its backward did not run"
    ref_out, ref_grad = _reference(op.removeprefix("torch."), idx, vals.to(dtype), shape, dim, g)
    tol = dict(atol=1e-5, rtol=1e-4) if dtype is torch.float32 else {}
    assert_close(P._values().detach(), ref_out, equal_nan=True, **tol)
    assert isinstance(
        gA, SparseTensor
    )  # (masked.*: fill 0; torch.*: indefinite, 0 at the masked-out elements)
    assert_close(gA._values(), ref_grad, equal_nan=True, **tol)
    with torch.no_grad():  # the same values without a graph
        assert_close(_fn(op)(A, dim)._values(), P._values().detach(), equal_nan=True)


@pytest.fixture
def calls(monkeypatch):
    """The calls of the edge softmax's forward and backward kernels."""
    seen = []
    for name in ("softmax_values", "softmax_grad_values"):
        real = getattr(_segsoftmax, name)
        monkeypatch.setattr(
            _segsoftmax, name, lambda *a, real=real, **k: seen.append(real) or real(*a, **k)
        )
    return seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_matches_torch_masked_on_the_dense_equivalent(layout, op, dim, dtype, calls):
    shape = (12, 9)
    idx, vals = _pattern(shape, 40, seed=0)
    vals = _special(idx, vals).to(dtype)
    A = sparsefill.sparse_coo_tensor(idx, vals, shape, fill_value=sparsefill.indefinite)
    if layout == "csr":
        A = A.to_sparse_csr()
    _check(op, A, idx, vals, shape, dim, dtype, calls)


@pytest.mark.parametrize("dim", [0, 1, 2])
@pytest.mark.parametrize("op", OPS)
def test_three_sparse_dims_and_hybrid(op, dim, calls):
    shape = (4, 5, 6)
    idx, vals = _pattern(shape, 50, seed=2)
    vals = _special(idx, vals)
    A = sparsefill.sparse_coo_tensor(idx, vals, shape, fill_value=sparsefill.indefinite)
    _check(op, A, idx, vals, shape, dim, torch.float64, calls)
    if dim < 2:  # a trailing dense dim: each dense position is its own slice
        idx2, vals2 = _pattern(shape[:2], 12, seed=3, dense=(3,))
        H = sparsefill.sparse_coo_tensor(
            idx2, vals2, shape[:2] + (3,), fill_value=sparsefill.indefinite
        )
        _check(op, H, idx2, vals2, shape[:2], dim, torch.float64, calls)


@pytest.mark.parametrize("op", OPS)
def test_one_sparse_dim(op, calls):
    idx, vals = _pattern((9,), 5, seed=7)
    A = sparsefill.sparse_coo_tensor(idx, vals, (9,), fill_value=sparsefill.indefinite)
    _check(op, A, idx, vals, (9,), 0, torch.float64, calls)


def test_gradient_through_a_product_and_a_dense_read():
    """The upstream gradient as the matmul route gives it (a SparseTensor on the pattern) and as a dense read
    gives it (a dense tensor): both equal the dense computation's."""
    shape = (7, 7)
    idx, vals = _pattern(shape, 20, seed=4)
    X = torch.randn(7, 3, dtype=torch.float64)
    for layout in (torch.sparse_coo, torch.sparse_csr):
        v = vals.clone().requires_grad_()
        A = sparsefill.sparse_coo_tensor(idx, v, shape, fill_value=sparsefill.indefinite)
        A = A.to_sparse_csr() if layout is torch.sparse_csr else A
        P = M.softmax(A, 1)
        loss = (P @ X).square().sum() + (P.to_dense(fill_value=0.0) * X[:, :1]).sum()
        loss.backward()
        x = torch.zeros(shape, dtype=torch.float64).index_put_(tuple(idx), vals).requires_grad_()
        mask = torch.zeros(shape, dtype=torch.bool).index_put_(tuple(idx), torch.tensor(True))
        Pd = torch.masked.softmax(x, 1, mask=mask).nan_to_num(0.0)
        ((Pd @ X).square().sum() + (Pd * X[:, :1]).sum()).backward()
        assert_close(v.grad, x.grad[tuple(idx)])


def test_the_plan_is_cached_per_pattern():
    idx, vals = _pattern((6, 6), 15, seed=5)
    A = sparsefill.sparse_coo_tensor(idx, vals, (6, 6), fill_value=sparsefill.indefinite)
    B = sparsefill.sparse_coo_tensor(
        A._idx, vals * 2, (6, 6), fill_value=sparsefill.indefinite, is_coalesced=True
    )
    assert _segsoftmax.plan_of(A, 1) is _segsoftmax.plan_of(B, 1)  # one pattern, one plan
    assert _segsoftmax.plan_of(A, 0) is not _segsoftmax.plan_of(A, 1)
    p0 = _segsoftmax.plan_of(A, 0)
    assert p0.perm is not None and torch.equal(p0.perm[p0.inv], torch.arange(15))
    assert torch.equal(p0.lengths, torch.bincount(idx[1], minlength=6))


def test_a_mask_of_the_whole_pattern_is_no_mask(calls):
    """``mask=masked.pattern_mask(A)`` (or any sparse mask True on exactly A's pattern) masks out nothing."""
    idx, vals = _pattern((6, 8), 20, seed=8)
    for layout in (torch.sparse_coo, torch.sparse_csr):
        A = sparsefill.sparse_coo_tensor(idx, vals, (6, 8), fill_value=sparsefill.indefinite)
        A = A.to_sparse_csr() if layout is torch.sparse_csr else A
        out = M.log_softmax(A, 1, mask=M.pattern_mask(A))
        assert len(calls) == 1
        assert_close(out._values(), M.log_softmax(A, 1)._values())
        calls.clear()


def test_other_cases_take_the_general_path(calls):
    """A mask, a dtype cast, a defined fill, no stored element, a dense dim: not the edge softmax, and the general
    path's results (a cast: the same values in the new dtype)."""
    idx, vals = _pattern((5, 5), 9, seed=6)
    A = sparsefill.sparse_coo_tensor(idx, vals, (5, 5), fill_value=sparsefill.indefinite)
    ref = M.softmax(A, 1)._values()
    assert len(calls) == 1
    out = M.softmax(A, 1, dtype=torch.float32)
    assert out.dtype == torch.float32
    assert_close(out._values(), ref.float())
    assert_close(M.softmax(A, 1, mask=torch.ones(5, 5, dtype=torch.bool))._values(), ref)
    m = M.pattern_mask(A).clone()
    m._vals[0] = False  # a sparse mask on A's pattern masking an element out: the general path
    assert_close(
        M.softmax(A, 1, mask=m)._values(),
        torch.masked.softmax(A.to_dense(fill_value=0.0), 1, mask=m.to_dense())[tuple(idx)],
    )
    E = sparsefill.sparse_coo_tensor(
        torch.zeros(2, 0, dtype=torch.int64),
        torch.zeros(0),
        (3, 3),
        fill_value=sparsefill.indefinite,
    )
    assert M.softmax(E, 1)._nse() == 0 and torch.softmax(E, 1)._nse() == 0
    H = sparsefill.sparse_coo_tensor(
        [[0, 2, 3]], vals[:6].reshape(3, 2), (5, 2), fill_value=sparsefill.indefinite
    )
    M.softmax(H, 1), torch.softmax(H, 1)  # along the dense dim
    assert len(calls) == 1
    assert not _segsoftmax.applies(sparsefill.to_sparse(torch.eye(3)), 1)  # a defined fill
