"""Order statistics and set ops (``ops/order/sort.py``, ``quantiles.py``, ``search.py``): a 1000 x
1000 float64 matrix at 1% density (fill 0), against dense torch on ``A.to_dense()``::

    topk(A, 10, dim=1)   sort(A, dim=1)   unique(A)   quantile(A, 0.3, dim=1)

(pydata ``sparse`` has none of them.)  The sparse side sorts the stored values once and places the
fill's run by rank arithmetic: ``topk``/``quantile`` touch the output and the stored values;
``sort``'s output is dense by nature (every slice), written in one pass.
"""

from __future__ import annotations

import torch

import sparsefill

from sparsefill.benchmarks.runner import case

SIZES = {"1000x1000, 1%": ((1000, 1000), 0.01)}


def _matrix(param):
    (n, m), density = param
    g = torch.Generator().manual_seed(0)
    nse = round(n * m * density)
    keys = torch.randperm(n * m, generator=g)[:nse].sort().values
    idx = torch.stack([keys // m, keys % m])
    vals = torch.randn(nse, generator=g, dtype=torch.float64)
    A = sparsefill.sparse_coo_tensor(idx, vals, (n, m), fill_value=0.0).coalesce()
    return A, A.to_dense()


def _same(param, out):
    a, b = out["sparsefill"], out["dense torch"]
    for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
        torch.testing.assert_close(x.to_dense() if isinstance(x, sparsefill.SparseTensor) else x, y)


def _values(param, out):  # (topk/sort: equal elements' order is torch's kernel's own)
    torch.testing.assert_close(out["sparsefill"][0], out["dense torch"][0])


@case("topk(A, 10, dim=1) 1%", sizes=SIZES, check=_values)
def topk(param):
    A, D = _matrix(param)
    return [
        ("sparsefill", lambda: tuple(torch.topk(A, 10, 1))),
        ("dense torch", lambda: tuple(torch.topk(D, 10, 1))),
    ]


@case("sort(A, dim=1) 1%", sizes=SIZES, check=_values)
def sort(param):
    A, D = _matrix(param)
    return [
        ("sparsefill", lambda: tuple(torch.sort(A, 1))),
        ("dense torch", lambda: tuple(torch.sort(D, 1))),
    ]


@case("unique(A, return_counts) 1%", sizes=SIZES, check=_same)
def unique(param):
    A, D = _matrix(param)
    return [
        ("sparsefill", lambda: tuple(torch.unique(A, return_counts=True))),
        ("dense torch", lambda: tuple(torch.unique(D, return_counts=True))),
    ]


@case("quantile(A, 0.3, dim=1) 1%", sizes=SIZES, check=_same)
def quantile(param):
    A, D = _matrix(param)
    return [
        ("sparsefill", lambda: torch.quantile(A, 0.3, dim=1)),
        ("dense torch", lambda: torch.quantile(D, 0.3, dim=1)),
    ]
