"""Reductions are at least as accurate as torch's on the dense equivalent.

For every reduction, layout (COO, CSR, hybrid) and floating dtype, on data with a wide spread
(uniform, lognormal, mixed signs, a large constant offset plus small noise), against a reference in
extended precision (numpy's longdouble, float64 where that is all the platform has)::

    ||sparse(A) - ref|| <= 2 * ||dense(A.to_dense()) - ref|| + eps(dtype) * ||ref||

(the floor: one rounding of the result, what a correctly rounded answer may still differ by).
One large case (the 10M-value sum) and small ones, to keep the suite fast.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sparsefill
from sparsefill import segment

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
KINDS = ["uniform", "lognormal", "mixed", "offset"]
LAYOUTS = ["coo", "csr", "hybrid"]
_LD = np.longdouble


def _draw(kind: str, n: int, gen: torch.Generator) -> torch.Tensor:
    if kind == "uniform":
        return torch.rand(n, generator=gen, dtype=torch.float64)
    if kind == "lognormal":
        return torch.empty(n, dtype=torch.float64).log_normal_(0, 1.5, generator=gen)
    if (
        kind == "mixed"
    ):  # (a mean of 1: a sum that cancels to ~0 has no relative accuracy to compare)
        return torch.randn(n, generator=gen, dtype=torch.float64) * 10 + 1
    return 100 + torch.randn(n, generator=gen, dtype=torch.float64) * 1e-2


def _matrix(kind: str, layout: str, dtype, shape=(16, 1500), density=0.3, seed=0):
    """A 2-D SparseTensor (hybrid: 2 sparse dims and a dense one of 3) of ``kind`` values; its fill is
    0 (uniform, mixed) or a value of the same spread (lognormal, offset: ``count * fill`` terms)."""
    gen = torch.Generator().manual_seed(seed)
    n, m = shape
    k = int(n * m * density)
    flat = torch.randperm(n * m, generator=gen)[:k].sort().values
    dense = (3,) if layout == "hybrid" else ()
    vals = _draw(kind, k * (3 if dense else 1), gen).reshape(k, *dense).to(dtype)
    fill = {"uniform": 0.0, "mixed": 0.0, "lognormal": 1.0, "offset": 100.0}[kind]
    A = sparsefill.sparse_coo_tensor(
        torch.stack([flat // m, flat % m]), vals, (n, m, *dense), fill_value=fill
    )
    return A.to_sparse_csr() if layout == "csr" else A


def _ld(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy().astype(_LD)


def _lse(x, axis):
    m = np.max(x, axis=axis, keepdims=True)
    return np.squeeze(m, axis) + np.log(np.sum(np.exp(x - m), axis=axis))


# name -> (the torch call, the extended-precision reference on a longdouble array)
OPS = {
    "sum()": (lambda t: t.sum(), lambda x: np.sum(x)),
    "sum(0)": (lambda t: t.sum(0), lambda x: np.sum(x, 0)),
    "sum(1)": (lambda t: t.sum(1), lambda x: np.sum(x, 1)),
    "mean()": (lambda t: t.mean(), lambda x: np.mean(x)),
    "mean(1)": (lambda t: t.mean(1), lambda x: np.mean(x, 1)),
    "nansum(1)": (lambda t: torch.nansum(t, 1), lambda x: np.sum(x, 1)),
    "nanmean(0)": (lambda t: torch.nanmean(t, 0), lambda x: np.mean(x, 0)),
    "var(1)": (lambda t: t.var(1), lambda x: np.var(x, 1, ddof=1)),
    "std()": (lambda t: t.std(), lambda x: np.std(x, ddof=1)),
    "var_mean(0)": (lambda t: torch.var_mean(t, 0)[0], lambda x: np.var(x, 0, ddof=1)),
    "std_mean(1)": (lambda t: torch.std_mean(t, 1)[1], lambda x: np.mean(x, 1)),
    "vector_norm()": (lambda t: torch.linalg.vector_norm(t), lambda x: np.sqrt(np.sum(x * x))),
    "norm(1)": (lambda t: torch.norm(t, dim=1), lambda x: np.sqrt(np.sum(x * x, 1))),
    "logsumexp(1)": (lambda t: torch.logsumexp(t, 1), lambda x: _lse(x, 1)),
}
_HALF_OWN = {
    "logsumexp(1)"
}  # (the half types' logsumexp has its own bound: test_half_types_logsumexp)


def _err(out, ref) -> float:
    out = out.to_dense() if isinstance(out, sparsefill.SparseTensor) else out
    return float(np.sqrt(np.sum((_ld(out) - ref) ** 2)))


def _eps(dtype) -> float:
    return torch.finfo(dtype).eps


def accuracy_ratio(op: str, kind: str, layout: str, dtype, **kw):
    """``(sparse error, dense error, bound)`` of ``op`` on one matrix."""
    A = _matrix(kind, layout, dtype, **kw)
    fn, ref_fn = OPS[op]
    D = A.to_dense()
    ref = ref_fn(_ld(D))
    e_sparse, e_dense = _err(fn(A), ref), _err(fn(D), ref)
    scale = float(np.sqrt(np.sum(np.asarray(ref, dtype=_LD) ** 2)))
    return e_sparse, e_dense, 2 * e_dense + _eps(dtype) * scale


_CASES = [
    (op, layout, dtype)
    for op in OPS
    for layout in LAYOUTS
    for dtype in DTYPES
    if not (dtype in (torch.float16, torch.bfloat16) and op in _HALF_OWN)
]


@pytest.mark.parametrize("op, layout, dtype", _CASES, ids=lambda v: str(v).replace("torch.", ""))
def test_reduction_as_accurate_as_dense(op, layout, dtype):
    for kind in KINDS:
        if dtype in (torch.float16, torch.bfloat16) and kind == "offset":
            continue  # (100 + 1e-2 noise is below a half type's resolution: every answer is the rounding)
        e_sparse, e_dense, bound = accuracy_ratio(op, kind, layout, dtype)
        assert e_sparse <= bound, (
            f"{op} {layout} {dtype} {kind}: error {e_sparse:.3g}, dense {e_dense:.3g}"
        )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_types_logsumexp(dtype):
    """logsumexp of the half types: sums accumulate in float32, as torch's."""
    e_sparse, e_dense, bound = accuracy_ratio("logsumexp(1)", "mixed", "coo", dtype)
    assert e_sparse <= max(bound, 2 * _eps(dtype) * 40)


@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize("op", ["var(1)", "norm(1)", "logsumexp(1)", "mean(1)"])
def test_backward_as_accurate_as_dense(op, layout):
    """The gradient of a reduction through its forward result: float32 against float64's."""
    A = _matrix("offset", layout, torch.float32, shape=(20, 2000)).requires_grad_()
    D = A.detach().to_dense().requires_grad_()
    D64 = D.detach().double().requires_grad_()
    fn = OPS[op][0]
    gs = torch.autograd.grad(fn(A).sum(), A)[0].to_dense()
    gd = torch.autograd.grad(fn(D).sum(), D)[0]
    g64 = torch.autograd.grad(fn(D64).sum(), D64)[0]
    e_sparse, e_dense = float((gs.double() - g64).norm()), float((gd.double() - g64).norm())
    assert e_sparse <= 2 * e_dense + _eps(torch.float32) * float(g64.norm())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_masked_and_segment_sums(kind, dtype):
    """``sparsefill.masked`` sums and means and ``sparsefill.segment``'s, against the dense sum of the same
    elements (long segments: 3000 values each)."""
    gen = torch.Generator().manual_seed(1)
    x = _draw(kind, 8 * 3000, gen).reshape(8, 3000).to(dtype)
    mask = torch.rand(8, 3000, generator=gen) < 0.7
    xm = torch.where(mask, x, torch.zeros((), dtype=dtype))
    ref_sum, ref_mean = np.sum(_ld(xm), 1), np.sum(_ld(xm), 1) / _ld(mask.sum(1))
    floor = _eps(dtype) * float(np.sqrt(np.sum(ref_sum**2)))
    e_dense = _err(xm.sum(1), ref_sum)
    assert _err(sparsefill.masked.sum(x, 1, mask=mask), ref_sum) <= 2 * e_dense + floor
    e_dense_mean = _err(xm.sum(1) / mask.sum(1), ref_mean)
    floor_mean = _eps(dtype) * float(np.sqrt(np.sum(ref_mean**2)))
    assert _err(sparsefill.masked.mean(x, 1, mask=mask), ref_mean) <= 2 * e_dense_mean + floor_mean
    data = x.reshape(-1, 1)
    lengths = torch.full((8,), 3000)
    ref_seg = np.sum(_ld(x), 1)
    e_seg = _err(x.sum(1), ref_seg)
    floor_seg = _eps(dtype) * float(np.sqrt(np.sum(ref_seg**2)))
    for reducer, ref in (("sum", ref_seg), ("mean", ref_seg / 3000)):
        out = segment.reduce(data, reducer, lengths=lengths)[:, 0]
        assert _err(out, ref) <= 2 * (e_seg if reducer == "sum" else e_seg / 3000) + floor_seg, (
            reducer
        )


def test_sum_of_ten_million_float32_values():
    """10M uniform float32 values in a 1-D SparseTensor of 2e8 elements, fill 0: ``A.sum()`` within 2x of
    ``values.sum()``'s error (a sum accumulated in one float32 slot in order errs ~1700x more)."""
    gen = torch.Generator().manual_seed(0)
    k, n = 10_000_000, 200_000_000
    idx = torch.arange(k, dtype=torch.int64) * (n // k) + torch.randint(
        0, n // k, (k,), generator=gen
    )
    v = torch.rand(k, generator=gen)
    ref = float(np.sum(v.numpy().astype(_LD)))
    A = sparsefill.sparse_coo_tensor(idx[None], v, (n,), fill_value=0.0, is_coalesced=True)
    e_sparse, e_dense = abs(float(A.sum()) - ref), abs(float(v.sum()) - ref)
    assert e_sparse <= 2 * e_dense + _eps(torch.float32) * ref
    assert abs(float(A.mean()) * n - ref) <= 2 * e_dense + 2 * _eps(torch.float32) * ref


@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_prod_and_scans(layout, dtype):
    """prod (each of its ``n`` roundings counts once, in any order) and the scans (along a sparse dim: the
    dense scan itself) on factors near 1, fill 1."""
    gen = torch.Generator().manual_seed(3)
    A = _matrix("uniform", layout, dtype)
    A = sparsefill.sparse_coo_tensor(
        A.to_sparse_coo().indices(),
        (1 + 1e-2 * torch.randn(A._nse(), generator=gen, dtype=torch.float64)).to(dtype),
        A.shape,
        fill_value=1.0,
    )
    A = A.to_sparse_csr() if layout == "csr" else A
    D = A.to_dense()
    x = _ld(D)
    refs = {
        "prod(1)": np.prod(x, 1),
        "cumsum(1)": np.cumsum(x, 1),
        "logcumsumexp(1)": np.log(np.cumsum(np.exp(x), 1)),
    }
    fns = {
        "prod(1)": lambda t: t.prod(1),
        "cumsum(1)": lambda t: t.cumsum(1),
        "logcumsumexp(1)": lambda t: torch.logcumsumexp(t, 1),
    }
    for name, ref in refs.items():
        e_sparse, e_dense = _err(fns[name](A), ref), _err(fns[name](D), ref)
        assert e_sparse <= 2 * e_dense + _eps(dtype) * float(np.sqrt(np.sum(ref**2))), name


@pytest.mark.parametrize("op", ["dot", "vdot", "mv", "mm"])
def test_products_with_long_rows(op):
    """A row of 100k stored float32 values times a dense vector: accumulated in float64 (torch's CSR kernels
    sum a row in one float32 slot, in order: ~100x dense's error)."""
    gen = torch.Generator().manual_seed(4)
    n, k = 200_000, 100_000
    idx = torch.randperm(n, generator=gen)[:k].sort().values
    A = sparsefill.sparse_coo_tensor(idx[None], torch.rand(k, generator=gen), (n,), fill_value=0.0)
    x = torch.rand(n, generator=gen)
    fn = {
        "dot": lambda a: torch.dot(a, x),
        "vdot": lambda a: torch.vdot(a, x),
        "mv": lambda a: torch.mv(a.reshape(1, n), x),
        "mm": lambda a: torch.mm(a.reshape(1, n), x[:, None]),
    }[op]
    D = A.to_dense()
    ref = np.sum(_ld(D) * _ld(x))
    e_sparse, e_dense = _err(fn(A).reshape(()), ref), _err(fn(D).reshape(()), ref)
    assert e_sparse <= 2 * e_dense + _eps(torch.float32) * abs(float(ref))
