"""Reductions and softmax with nonzero and array fills.

* ``A.sum(1)`` of an ``n x n`` CSR matrix, 0.1% specified, fill 5: against a hand-written torch
  reduction on the CSR arrays (sorted segment sum, and native CSR ``mv`` with ones), pydata
  ``sparse`` (``s.sum(axis=1)``) and dense ``x.sum(1)``.
* ``A.amax(1)`` likewise (no torch native sparse peer: torch.sparse has no amax over a dim).
* ``A.median(1)`` of a COO matrix, 1% specified, fill 0.5 (the one median rank rule,
  ``_kernels.reducer.segment_median``): against dense ``x.median(1)`` (pydata ``sparse`` has no
  median).

The small row reductions are the first sizes (targets): ``A.sum(1)`` at 4000^2 with 16k stored at
most 2x the hand-written CSR ``mv``, ``A.amax(1)`` at 2000^2, 1% at most 1.0x pydata.
* ``A.softmax(0)`` of a hybrid ``(n, 16)`` tensor (one sparse dim, fill 0): the result keeps the
  pattern with an array fill (the fill of the result is an array); against dense ``x.softmax(0)``.
"""

from __future__ import annotations

import warnings

import torch

import sparsefill

from sparsefill.benchmarks.runner import case, optional_import, skipped


_TINY = {"50x50, 5%": (50, 0.05)}  # (what the test suite builds)


def _matrix(n, density, fill=0.5):
    g = torch.Generator().manual_seed(0)
    nse = round(n * n * density)
    keys = torch.randperm(n * n, generator=g)[:nse].sort().values
    idx = torch.stack([keys // n, keys % n])
    vals = torch.randn(nse, generator=g, dtype=torch.float64)
    return idx, vals, sparsefill.sparse_coo_tensor(idx, vals, (n, n), fill_value=fill)


def _check_close(param, out):
    ref = out["sparsefill"]
    ref = ref.to_dense() if isinstance(ref, sparsefill.SparseTensor) else ref
    for label, o in out.items():
        o = torch.as_tensor(o.todense() if hasattr(o, "todense") else o)
        o = (
            o.to_dense()
            if isinstance(o, sparsefill.SparseTensor) or o.layout is not torch.strided
            else o
        )
        # float32 sums: order differs
        torch.testing.assert_close(o.to(ref.dtype), ref, rtol=1e-4, atol=1e-7, msg=label)


@case(
    "A.sum(1), A CSR fill 5",
    sizes={"4000x4000, 0.1%": (4000, 0.001), "20000x20000, 0.1%": (20_000, 0.001)},
    quick_sizes={"4000x4000, 0.1%": (4000, 0.001)},
    tiny_sizes=_TINY,
    check=_check_close,
)
def sum_dim(param):
    """Against a hand-written torch reduction on the same CSR arrays (sorted segment
    sum over ``crow`` plus ``fill * (n - row counts)``; and the same through torch's native CSR
    ``mv`` with ones), pydata ``sparse`` and dense ``x.sum(1)``."""
    n, density = param
    idx, vals, A = _matrix(n, density, fill=5.0)
    vals = vals.float()
    A = sparsefill.sparse_coo_tensor(idx, vals, (n, n), fill_value=5.0).to_sparse_csr()
    crow, col, v = A.crow_indices(), A.col_indices(), A.values()
    with warnings.catch_warnings():
        # torch: "Sparse CSR tensor support is in beta state"
        warnings.simplefilter("ignore", UserWarning)
        T = torch.sparse_csr_tensor(crow, col, v, (n, n))
    ones = torch.ones(n)
    x = A.to_dense()
    impls = [
        ("sparsefill", lambda: A.sum(1)),
        (
            "torch segment_reduce(values, offsets=crow) + fill*(n - counts)",
            lambda: torch.segment_reduce(v, "sum", offsets=crow) + 5.0 * (n - crow.diff()),
        ),
        (
            "torch native CSR mv(ones) + fill*(n - counts)",
            lambda: torch.mv(T, ones) + 5.0 * (n - crow.diff()),
        ),
        ("dense x.sum(1)", lambda: x.sum(1)),
    ]
    sp = optional_import("sparse")
    if sp is None:
        return impls + [skipped("pydata sparse", "not installed")]
    s = sp.COO(idx.numpy(), vals.numpy(), shape=(n, n), fill_value=5.0)
    return impls + [("pydata sparse", lambda: s.sum(axis=1))]


@case(
    "A.amax(1), fill 0.5",
    sizes={"2000x2000, 1%": (2000, 0.01), "10000x10000, 1%": (10_000, 0.01)},
    quick_sizes={"2000x2000, 1%": (2000, 0.01)},
    tiny_sizes=_TINY,
    check=_check_close,
)
def amax_dim(param):
    n, density = param
    idx, vals, A = _matrix(n, density)
    x = A.to_dense()
    impls = [("sparsefill", lambda: A.amax(1)), ("dense x.amax(1)", lambda: x.amax(1))]
    sp = optional_import("sparse")
    if sp is None:
        return impls + [skipped("pydata sparse", "not installed")]
    s = sp.COO(idx.numpy(), vals.numpy(), shape=(n, n), fill_value=0.5)
    return impls + [("pydata sparse", lambda: s.max(axis=1))]


def _check_median(param, out):
    ref = out["sparsefill"][0]
    for (
        label,
        o,
    ) in out.items():  # (the indices of equal elements may differ: torch leaves which unspecified)
        torch.testing.assert_close(o[0], ref, msg=label)


@case(
    "A.median(1), fill 0.5",
    sizes={"2000x2000, 1%": (2000, 0.01), "10000x10000, 1%": (10_000, 0.01)},
    quick_sizes={"2000x2000, 1%": (2000, 0.01)},
    tiny_sizes=_TINY,
    check=_check_median,
)
def median_dim(param):
    """The lower median of every row (values and indices, as ``torch.median(dim)``): the stored
    values and the row's fills ranked together, in closed form over the fill count; against dense
    ``x.median(1)``."""
    n, density = param
    idx, vals, A = _matrix(n, density)
    x = A.to_dense()
    return [("sparsefill", lambda: A.median(1)), ("dense x.median(1)", lambda: x.median(1))]


@case(
    "hybrid softmax(0), array fill",
    sizes={"(1M, 16), 1%": (1_000_000, 0.01)},
    quick_sizes={"(100k, 16), 1%": (100_000, 0.01)},
    check=_check_close,
)
def hybrid_softmax(param):
    """A (1e6 x 16) hybrid tensor (one sparse dim), 1% of the rows specified; the
    result keeps the pattern with an array fill.  Peak memory is reported by the runner: O(nse) for
    sparsefill."""
    n, density = param
    g = torch.Generator().manual_seed(0)
    nse = round(n * density)
    rows = torch.randperm(n, generator=g)[:nse].sort().values
    # (float32 sums of 1M terms differ by 1e-3)
    vals = torch.randn(nse, 16, generator=g, dtype=torch.float64)
    A = sparsefill.sparse_coo_tensor(rows[None], vals, (n, 16), fill_value=0.0)
    x = A.to_dense()
    return [("sparsefill", lambda: A.softmax(0)), ("dense x.softmax(0)", lambda: x.softmax(0))]
