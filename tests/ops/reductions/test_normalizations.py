"""softmax, log_softmax and softmin on SparseTensors, and gradcheck over
``(values, fill)`` of the reductions and normalizations."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.autograd import gradcheck

import sparsefill
from sparsefill import SparseTensor

F64 = torch.float64
NORMS = {
    "softmax": lambda t, d: t.softmax(d),
    "log_softmax": lambda t, d: t.log_softmax(d),
    "softmin": lambda t, d: torch.nn.functional.softmin(t, d),
    "softmax_f32": lambda t, d: torch.softmax(t, d, dtype=torch.float32),
}


def test_softmax_along_only_sparse_dim_gives_array_fill():
    A = sparsefill.sparse_coo_tensor([[0, 3]], [[0.11, 0.12], [0.31, 0.32]], (4, 2), fill_value=0.0)
    out = A.softmax(0)
    assert isinstance(out, SparseTensor) and torch.equal(out.indices(), A.indices())
    torch.testing.assert_close(
        out.values(), torch.tensor([[0.2492, 0.2503], [0.3044, 0.3057]]), atol=1e-4, rtol=0
    )
    torch.testing.assert_close(out.fill_value(), torch.tensor([0.2232, 0.2220]), atol=1e-4, rtol=0)
    torch.testing.assert_close(out.to_dense(), A.to_dense().softmax(0))


def _inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, 3, generator=g, dtype=F64)
    x[torch.rand(4, 5, 3, generator=g) < 0.6] = 0.5
    for dd in (0, 1, 2):
        for lay in (torch.sparse_coo, torch.sparse_csr):
            if not (lay is torch.sparse_csr and dd == 2):
                yield (
                    f"{str(lay)[13:]}-dense{dd}",
                    sparsefill.to_sparse(x, fill_value=0.5, layout=lay, dense_dim=dd),
                    x,
                )
    y = torch.randn(6, 2, generator=g, dtype=F64)
    y[torch.rand(6, generator=g) < 0.5] = torch.tensor([float("nan"), 1.0], dtype=F64)
    yield (
        "hybrid-nan-array-fill",
        sparsefill.to_sparse(
            y, fill_value=torch.tensor([float("nan"), 1.0], dtype=F64), dense_dim=1
        ),
        y,
    )
    yield (
        "empty",
        sparsefill.to_sparse(torch.zeros(0, 3, dtype=F64), fill_value=0.0),
        torch.zeros(0, 3, dtype=F64),
    )


@pytest.mark.parametrize("name", list(NORMS))
@pytest.mark.parametrize("label,A,x", list(_inputs()), ids=[k for k, _, _ in _inputs()])
def test_normalization_equals_dense_and_is_native(label, A, x, name):
    f = NORMS[name]
    for d in range(-x.dim(), x.dim()):
        with warnings.catch_warnings():
            warnings.simplefilter("error", sparsefill.DensifyWarning)
            out = f(A, d)
        dense_by_nature = (d % x.dim()) < A.dim() - A.dense_dim() and A.dim() - A.dense_dim() > 1
        assert isinstance(out, SparseTensor) or dense_by_nature, (label, d)
        torch.testing.assert_close(
            out.to_dense() if isinstance(out, SparseTensor) else out, f(x, d), equal_nan=True
        )


def test_masked_softmax_of_an_indefinite_fill():
    x = torch.tensor([[1.0, 2.0, 0.0], [0.0, 0.0, 3.0]], dtype=F64)
    keep = x != 0
    M = sparsefill.sparse_coo_tensor(
        keep.nonzero().T, x[keep], x.shape, fill_value=sparsefill.indefinite
    )
    for d in (0, 1):
        out = M.softmax(d)
        assert out._indefinite and torch.equal(out.indices(), M.indices())
        ref = torch.masked.softmax(x, d, mask=keep)
        torch.testing.assert_close(out.values(), ref[keep])


# ---------------------------------------------------------------- gradcheck over (values, fill)
IDX = torch.tensor([[0, 1, 3, 3], [2, 0, 1, 4]])
GRAD_OPS = {
    "sum": lambda t: t.sum(),
    "sum0": lambda t: t.sum(0),
    "mean1": lambda t: t.mean(1),
    "amax1": lambda t: t.amax(1),
    "logsumexp0": lambda t: t.logsumexp(0),
    "var1": lambda t: t.var(1),
    "softmax0": lambda t: t.softmax(0),
    "softmax1": lambda t: t.softmax(1),
    "log_softmax1": lambda t: t.log_softmax(1),
}


@pytest.mark.parametrize("name", list(GRAD_OPS))
@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_gradcheck_over_values_and_fill(name, layout):
    op = GRAD_OPS[name]

    def fn(v, f):
        A = sparsefill.sparse_coo_tensor(IDX, v, (4, 5), fill_value=f)
        if layout is torch.sparse_csr:
            A = A.to_sparse(layout=torch.sparse_csr)
        out = op(A)
        return out.to_dense() if isinstance(out, SparseTensor) else out

    v = torch.tensor(
        [0.3, -1.2, 2.0, 0.7], dtype=F64, requires_grad=True
    )  # distinct from the fill: no amax ties
    f = torch.tensor(0.1, dtype=F64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", sparsefill.DensifyWarning
        )  # backward formulas may use shape ops
        assert gradcheck(fn, (v, f), check_batched_grad=False)


# ---------------------------------------------------------------- edge cases
import math  # noqa: E402

import sparsefill as sf  # noqa: E402


def D(t):
    if isinstance(t, tuple):
        return tuple(D(x) for x in t)
    return t.to_dense() if isinstance(t, sf.SparseTensor) else t


@pytest.mark.filterwarnings("ignore::sparsefill.DensifyWarning")
def test_softmax_of_a_slice_holding_inf_is_nan_as_in_torch():
    x = torch.tensor([1.0, math.inf, 0.0])
    torch.testing.assert_close(
        D(sf.to_sparse(x, fill_value=0.0).softmax(0)), x.softmax(0), equal_nan=True
    )
    y = torch.tensor([[1.0, 2.0], [math.inf, 0.0]])
    B = sf.to_sparse(y, fill_value=math.inf)
    torch.testing.assert_close(D(B.softmax(0)), y.softmax(0), equal_nan=True)
    torch.testing.assert_close(D(B.log_softmax(1)), y.log_softmax(1), equal_nan=True)


@pytest.mark.parametrize(
    "shape,dense_dim", [((0,), 0), ((0, 3), 0), ((3, 0), 0), ((0, 3), 1), ((2, 0, 2), 1)], ids=str
)
def test_normalize_of_a_tensor_with_no_element(shape, dense_dim):
    """``F.normalize`` of a 0-element SparseTensor is dense's empty result (the expanded denominator, size 0 along
    a sparse dim, was indexed at 0: IndexError)."""
    import torch.nn.functional as F

    E = sparsefill.to_sparse(torch.zeros(shape), fill_value=1.0, dense_dim=dense_dim)
    for dim in range(len(shape)):
        out = F.normalize(E, dim=dim)
        assert isinstance(out, SparseTensor)
        torch.testing.assert_close(out.to_dense(), F.normalize(E.to_dense(), dim=dim))
