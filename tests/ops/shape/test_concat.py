"""``cat``/``stack`` of a masked (indefinite) operand and defined ones (``ops/shape/concat.py``): the result is masked
where the masked operand is unspecified and defined everywhere else, as ``torch.masked``'s ``cat`` (a defined
operand's mask is all True): fill indefinite, every element of each defined operand stored.  Checked against the
dense result: ``R.to_dense(fill_value=s) == cat([M.to_dense(fill_value=s), B.to_dense()])`` for two sentinels
``s`` (so the mask is checked too)."""

from __future__ import annotations

import warnings

import pytest
import torch

import sparsefill
from sparsefill import DensifyWarning, SparseTensor

g = torch.Generator().manual_seed(5)
KINDS = [
    (lay, dd)
    for dd in (0, 1, 2)
    for lay in (torch.sparse_coo, torch.sparse_csr)
    if not (lay is torch.sparse_csr and dd == 2)
]
IDS = [f"{str(lay)[13:]}-dense{dd}" for lay, dd in KINDS]


def _operands(layout, dd, dtype=torch.float64, m_rows=4, b_rows=2):
    """A masked ``M`` (a quarter of its slices stored; the pattern is its mask) and a defined ``B`` with fill 5
    (NaN and inf among its elements where the dtype has them), of shapes ``(m_rows, 3, 2)``/``(b_rows, 3, 2)``."""
    x = torch.randint(-3, 9, (m_rows, 3, 2), generator=g).to(dtype)
    keep = torch.rand((m_rows, 3, 2)[: 3 - dd], generator=g) < 0.5
    idx = keep.nonzero().T
    M = sparsefill.sparse_coo_tensor(
        idx, x[tuple(idx)], (m_rows, 3, 2), fill_value=sparsefill.indefinite
    )
    y = torch.randint(-3, 9, (b_rows, 3, 2), generator=g).to(dtype)
    y[y == 4] = 5
    if dtype.is_floating_point and y.numel() > 2:
        y.view(-1)[:2] = torch.tensor([float("nan"), float("inf")])
    B = sparsefill.to_sparse(y, fill_value=5, layout=layout, dense_dim=dd)
    return (
        (M.to_sparse(layout=layout) if layout is torch.sparse_csr and dd == 1 else M),
        B,
        y,
    )  # (a batched CSR
    # with an indefinite fill needs the same nse in every batch: COO there)


def _check(out, ref_fn, M, dtype):
    """``out`` is a masked SparseTensor equal to ``ref_fn(M.to_dense(fill_value=s))`` for two sentinels."""
    assert isinstance(out, SparseTensor) and out._indefinite
    for s in (float("nan"), -7.0) if dtype.is_floating_point else (-7, 99):
        torch.testing.assert_close(
            out.to_dense(fill_value=s), ref_fn(M.to_dense(fill_value=s)), equal_nan=True
        )


@pytest.mark.parametrize("layout,dd", KINDS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_cat_and_stack_of_masked_and_defined(layout, dd, dtype):
    M, B, y = _operands(layout, dd, dtype)
    M2, _, _ = _operands(layout, dd, dtype, m_rows=2)
    sd = 3 - dd
    cases = {
        "cat0": (lambda m, b: torch.cat([m, b]), lambda m: torch.cat([m, y])),
        "cat0_defined_first": (lambda m, b: torch.cat([b, m, b]), lambda m: torch.cat([y, m, y])),
        "cat_dense_operand": (lambda m, b: torch.cat([m, y]), lambda m: torch.cat([m, y])),
        "stack0": (lambda m, b: torch.stack([M2, b]), None),
        "stack_dense_operand": (lambda m, b: torch.stack([y, M2], 1), None),
    }
    if sd >= 2:
        cases["cat1"] = (lambda m, b: torch.cat([m[:2], b], 1), lambda m: torch.cat([m[:2], y], 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DensifyWarning)  # (small: every element of B stored quietly)
        for name, (op, ref) in cases.items():
            out = op(M, B)
            if name == "stack0":
                _check(out, lambda m: torch.stack([m, y]), M2, dtype)
            elif name == "stack_dense_operand":
                _check(out, lambda m: torch.stack([y, m], 1), M2, dtype)
            else:
                _check(out, ref, M, dtype)
            if name in ("cat0", "cat1"):
                assert out.sparse_layout is M.sparse_layout  # (the masked operand's)


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_cat_of_masked_and_defined_at_different_splits(layout):
    """A hybrid masked operand beside an all-sparse defined one: converted to one split first, exactly."""
    M, _, _ = _operands(layout, 1)
    _, B, y = _operands(layout, 0)
    _check(torch.cat([M, B]), lambda m: torch.cat([m, y]), M, torch.float64)
    _check(
        torch.cat([B, M.to_sparse(layout=torch.sparse_coo)]),
        lambda m: torch.cat([y, m]),
        M,
        torch.float64,
    )


def test_cat_of_masked_and_defined_empty_and_zero_size():
    M, B, y = _operands(torch.sparse_coo, 0, m_rows=0)
    _check(torch.cat([M, B]), lambda m: torch.cat([m, y]), M, torch.float64)
    M, B, y = _operands(torch.sparse_coo, 0, b_rows=0)
    _check(torch.cat([B, M]), lambda m: torch.cat([y, m]), M, torch.float64)
    E = sparsefill.sparse_coo_tensor(
        torch.zeros(3, 0, dtype=torch.long),
        torch.zeros(0, dtype=torch.float64),
        (2, 3, 2),
        fill_value=sparsefill.indefinite,
    )  # nothing specified
    _check(torch.cat([E, B]), lambda m: torch.cat([m, y]), E, torch.float64)


def test_cat_of_masked_and_defined_past_the_quiet_limit_warns(monkeypatch):
    """Every element of the defined operand is stored: the specify gate applies (a DensifyWarning past
    ``_tensor.policy.SPECIFY_QUIET_ELEMENTS``; a DensifyError under the raise policy, nothing returned)."""
    from sparsefill._tensor import policy as _policy

    M, B, y = _operands(torch.sparse_coo, 0)
    monkeypatch.setattr(_policy, "SPECIFY_QUIET_ELEMENTS", 4)
    with pytest.warns(DensifyWarning, match="masked"):
        out = torch.cat([M, B])
    _check(out, lambda m: torch.cat([m, y]), M, torch.float64)
    with sparsefill.densify_policy("raise"), pytest.raises(sparsefill.DensifyError):
        torch.cat([M, B])


@pytest.mark.filterwarnings(
    "ignore::sparsefill.DensifyWarning"
)  # (the refused stack tries the dense form)
def test_cat_of_masked_and_defined_along_a_dense_dim_is_refused():
    """Along a dense dim a slice would be partly masked, which a hybrid cannot hold (a slice is all specified or
    all masked out), and no dense form exists: a clear ValueError, as before."""
    M, B, y = _operands(torch.sparse_coo, 1, b_rows=4)
    for op in (
        lambda: torch.cat([M, B], -1),
        lambda: torch.cat([M, y], -1),
        lambda: torch.stack([B, M], -1),
    ):
        with pytest.raises(ValueError, match="indefinite"):
            op()


@pytest.mark.parametrize("fill", [1.0, sparsefill.indefinite])
def test_cat_of_0d_tensors_raises_torchs_error(fill):
    """A 0-d operand: torch's RuntimeError (it was a ZeroDivisionError wrapping the dim)."""
    A = sparsefill.sparse_coo_tensor(
        torch.zeros(0, 1, dtype=torch.long), [2.0], (), fill_value=fill
    )
    with pytest.raises(RuntimeError, match="zero-dimensional"):
        torch.cat([A, A])
    with pytest.raises(RuntimeError, match="zero-dimensional"):
        torch.cat([A, torch.tensor(1.0)])
    with pytest.raises(RuntimeError, match="zero-dimensional"):
        torch.cat([torch.ones(2), A])


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
@pytest.mark.parametrize("dim", [0, 1])
def test_cat_of_masked_and_defined_backward(layout, dim):
    """The gradients of the values of both operands and of the defined one's fill equal the dense computation's
    over the specified elements (``(R * W).sum()`` skips the masked ones)."""
    F = torch.float64
    vm, vb = torch.tensor([1.0, 2.0, 3.0], dtype=F), torch.tensor([4.0, 5.0], dtype=F)
    fb = torch.tensor(7.0, dtype=F)
    im, ib = torch.tensor([[0, 1, 2], [1, 0, 2]]), torch.tensor([[0, 1], [0, 1]])
    bshape = (2, 3) if dim == 0 else (3, 2)
    W = torch.arange(15.0, dtype=F).view((5, 3) if dim == 0 else (3, 5)) + 1

    def leaves():
        return [t.clone().requires_grad_() for t in (vm, vb, fb)]

    lm, lb, lf = leaves()
    M = sparsefill.sparse_coo_tensor(im, lm, (3, 3), fill_value=sparsefill.indefinite)
    B = sparsefill.sparse_coo_tensor(ib, lb, bshape, fill_value=lf)
    if layout is torch.sparse_csr:
        M, B = M.to_sparse_csr(), B.to_sparse_csr()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DensifyWarning)
        (torch.cat([M, B], dim) * W).sum().backward()
    dm, db, df = leaves()
    Md = torch.zeros(3, 3, dtype=F).index_put(tuple(im), dm)
    Bd = df.expand(bshape).index_put(tuple(ib), db)
    mask = torch.cat(
        [
            torch.zeros(3, 3, dtype=torch.bool).index_put(tuple(im), torch.tensor(True)),
            torch.ones(bshape, dtype=torch.bool),
        ],
        dim,
    )
    (torch.cat([Md, Bd], dim) * W)[mask].sum().backward()
    for got, ref in ((lm, dm), (lb, db), (lf, df)):
        torch.testing.assert_close(got.grad, ref.grad)


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
def test_cat_of_different_fills_asks_the_byte_limit_for_all_operands_at_once(layout):
    """``cat`` of operands with different fills stores them whole (quiet below 65536 elements); the densify
    policy's byte limit holds for all the elements it stores together, before any is formed -- and below it the
    result is exact against dense, forward and the gradient of the values and fills."""
    va, vb = (torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True) for _ in range(2))
    fa, fb = (torch.tensor(f, dtype=torch.float64, requires_grad=True) for f in (3.0, -1.0))
    A = sparsefill.sparse_coo_tensor([[0, 2], [1, 0]], va, (3, 2), fill_value=fa).to_sparse(
        layout=layout
    )
    B = sparsefill.sparse_coo_tensor([[1, 0], [1, 0]], vb, (2, 2), fill_value=fb).to_sparse(
        layout=layout
    )
    # B twice, each stored whole (its fill is not A's): 8 elements, 64 bytes, 32 per operand
    with sparsefill.densify_policy("raise", limit_bytes=8 * 8 - 1):
        with pytest.raises(sparsefill.DensifyError, match="different fills.*64 bytes"):
            torch.cat([A, B, B])
    with sparsefill.densify_policy("raise", limit_bytes=8 * 8):
        R = torch.cat([A, B, B])
    w = torch.arange(14, dtype=torch.float64).reshape(7, 2)
    (R.to_dense() * w).sum().backward()
    grads = [t.grad.clone() for t in (va, vb, fa, fb)]
    for t in (va, vb, fa, fb):
        t.grad = None
    Ad, Bd = (
        sparsefill.sparse_coo_tensor(i, v, s, fill_value=f).to_dense()
        for i, v, s, f in (([[0, 2], [1, 0]], va, (3, 2), fa), ([[1, 0], [1, 0]], vb, (2, 2), fb))
    )
    expected = torch.cat([Ad, Bd, Bd])
    torch.testing.assert_close(R.to_dense(), expected)
    (expected * w).sum().backward()
    for got, t in zip(grads, (va, vb, fa, fb)):
        torch.testing.assert_close(got, t.grad)


def test_stack_of_many_0d_operands_checks_errors_without_an_element_each():
    """``stack``'s probe for torch's errors forms one element per dtype, not per operand (a densify byte limit
    below the operands' count holds); the result against dense."""
    pieces = list(
        sparsefill.sparse_coo_tensor(
            [[0, 3]], torch.tensor([1.0, 2.0], dtype=torch.float64), (6,), fill_value=4.0
        ).unbind(0)
    )
    with sparsefill.densify_policy("raise", limit_bytes=8):
        R = torch.stack(pieces)
    torch.testing.assert_close(
        R.to_dense(), torch.tensor([1.0, 4.0, 4.0, 2.0, 4.0, 4.0], dtype=torch.float64)
    )
    with pytest.raises(
        IndexError, match=r"range of \[-1, 0\], but got 2"
    ):  # torch's error, as on dense
        torch.stack(pieces, 2)


def _unbind_case(layout, dd):
    """A ``(5, 3)`` (hybrid: ``(5, 3)`` with one dense dim) SparseTensor of fill 0.5 storing rows 0 and 3, its
    values and fill leaves, and its dense form built from the same leaves."""
    v = torch.arange(1.0, 7.0, dtype=torch.float64).reshape(2, 3)
    v = (v if dd else v[:, 0]).clone().requires_grad_()
    f = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    idx = [[0, 3]] if dd else [[0, 3], [1, 2]]
    make = lambda: sparsefill.sparse_coo_tensor(idx, v, (5, 3), fill_value=f)  # noqa: E731
    return make, v, f


@pytest.mark.parametrize("kind", ["coo", "hybrid", "csr"])
def test_unbind_backward_stays_on_the_pattern(kind):
    """The backward of ``unbind`` (torch's formula stacks the pieces' gradients): a stored piece's gradient stores
    every element (fill 0), an unstored one is its fill; joined, the gradient keeps the pattern -- no element
    stored per piece, so a byte limit below the dense form holds -- and matches dense for the values and fill."""
    dd = kind == "hybrid"
    make, v, f = _unbind_case(torch.sparse_coo, dd)
    A = make() if kind != "csr" else make().to_sparse(layout=torch.sparse_csr)
    w = torch.arange(15, dtype=torch.float64).reshape(5, 3)
    with sparsefill.densify_policy("raise", limit_bytes=5 * 3 * 8 - 1):
        pieces = A.unbind(0)
        sum(p.sum() for p in pieces).backward()
    got = v.grad.clone(), f.grad.clone()
    v.grad = f.grad = None
    sum(p.to_dense().sum() for p in make().to_dense().unbind(0)).backward()
    torch.testing.assert_close(got, (v.grad, f.grad))
    v.grad = f.grad = None
    sum((p * w[i]).sum() for i, p in enumerate(A.unbind(0))).backward()  # dense weights per piece
    got = v.grad.clone(), f.grad.clone()
    v.grad = f.grad = None
    (make().to_dense() * w).sum().backward()
    torch.testing.assert_close(got, (v.grad, f.grad))


def test_cat_of_fully_stored_operands_keeps_the_other_fill():
    """An operand storing every element joins any fill as it is (its fill is read nowhere): the result's fill is that
    of an operand with unspecified elements, and the dense form is unchanged."""
    full = sparsefill.sparse_coo_tensor(
        [[0, 1]], torch.tensor([2.0, 3.0], dtype=torch.float64), (2,), fill_value=0.0
    )
    part = sparsefill.sparse_coo_tensor(
        [[1]], torch.tensor([5.0], dtype=torch.float64), (4,), fill_value=7.0
    )
    R = torch.cat([full, part])
    assert float(R.fill_value()) == 7.0 and R._nse() == 3
    torch.testing.assert_close(R.to_dense(), torch.cat([full.to_dense(), part.to_dense()]))


@pytest.mark.parametrize("fill", [0.0, 1.5, float("nan")])
@pytest.mark.parametrize("dense_dim", [0, 1])
def test_block_diag_of_sparse_and_dense_operands(fill, dense_dim):
    """block_diag of SparseTensors (2-D, hybrid, a 1-D row, CSR) and dense tensors of other dtypes:
    fill 0, each block's stored elements at its corner (every element of a nonzero-fill block or
    a dense one), torch's result dtype, forward and backward as dense."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 3, generator=g, dtype=torch.float64)
    x[torch.rand(4, 3, generator=g) < 0.5] = fill
    v = torch.randn(5, generator=g, dtype=torch.float64)
    v[v < 0] = fill
    A = sparsefill.to_sparse(x, fill_value=fill, dense_dim=dense_dim)
    V = sparsefill.to_sparse(v, fill_value=fill)
    cases = [
        (A, V),
        (V, A, torch.ones(2, 2)),
        (A, torch.tensor(3)),
        (A.to_sparse_csr() if not dense_dim else A, A),
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error", DensifyWarning)
        for ops in cases:
            dense = [o.to_dense() if isinstance(o, SparseTensor) else o for o in ops]
            out, ref = torch.block_diag(*ops), torch.block_diag(*dense)
            assert isinstance(out, SparseTensor) and out.dtype == ref.dtype
            assert out.fill_value().item() == 0
            torch.testing.assert_close(out.to_dense(), ref, equal_nan=True)
    zero = sparsefill.to_sparse(torch.where(torch.isnan(x), 0.0, x), fill_value=0.0)
    assert torch.block_diag(zero, zero)._nnz() == 2 * zero._nnz()
    vals = zero.values().clone().requires_grad_()
    Z = sparsefill.sparse_coo_tensor(zero.indices(), vals, zero.shape, fill_value=0.0)
    w = torch.randn(8, 6, generator=g, dtype=torch.float64)
    (torch.block_diag(Z, Z).to_dense() * w).sum().backward()
    xd = zero.to_dense().requires_grad_()
    (torch.block_diag(xd, xd) * w).sum().backward()
    torch.testing.assert_close(vals.grad, xd.grad[tuple(zero.indices())])
