"""Order statistics and set ops (``ops/order/sort.py``, ``quantiles.py``, ``search.py``) at 1%
density (fill 0, float64), against dense torch on ``A.to_dense()``::

    topk(A, 10, dim)   sort(A, dim)   unique(A)   quantile(A, 0.3, dim)

over a 1000 x 1000 matrix along dim 1 and dim 0 (COO; CSR along dim 1) and a 1-D tensor of 1M
elements.  (pydata ``sparse`` has none of them.)  The sparse side sorts each slice's stored
values once and places the fill's run by rank arithmetic: ``topk``/``quantile`` touch the output
and the stored values; ``sort``'s output is dense by nature (every slice), written in one pass.
On CPU the compiled row kernels (``_kernels/order_numba.py``) do that work once numba is loaded
(the segment backend's ``auto`` rule: after enough work); the case warms them up first.
"""

from __future__ import annotations

import torch

import sparsefill

from sparsefill.benchmarks.runner import case

SIZES = {  # label: (shape, density, dim, layout)
    "1000x1000, 1%, dim 1": ((1000, 1000), 0.01, 1, "coo"),
    "1000x1000, 1%, dim 0": ((1000, 1000), 0.01, 0, "coo"),
    "1000x1000 CSR, 1%, dim 1": ((1000, 1000), 0.01, 1, "csr"),
    "1M (1-D), 1%": ((1_000_000,), 0.01, 0, "coo"),
}
QUICK = {k: SIZES[k] for k in ("1000x1000, 1%, dim 1", "1M (1-D), 1%")}
TINY = {"40x50, 5%, dim 1": ((40, 50), 0.05, 1, "coo")}
_WARM = 8  # calls of the subject before the runner's own (the compiled kernels loaded)


def _matrix(param):
    shape, density, dim, layout = param
    g = torch.Generator().manual_seed(0)
    n = shape[0] * (shape[1] if len(shape) > 1 else 1)
    nse = round(n * density)
    keys = torch.randperm(n, generator=g)[:nse].sort().values
    idx = torch.stack([keys // shape[1], keys % shape[1]]) if len(shape) > 1 else keys[None]
    vals = torch.randn(nse, generator=g, dtype=torch.float64)
    A = sparsefill.sparse_coo_tensor(idx, vals, shape, fill_value=0.0).coalesce()
    if layout == "csr":
        A = A.to_sparse_csr()
    return A, A.to_dense(), dim


def _pairs(subject, peer):
    for _ in range(_WARM):
        subject()
    return [("sparsefill", subject), ("dense torch", peer)]


def _same(param, out):
    a, b = out["sparsefill"], out["dense torch"]
    for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
        torch.testing.assert_close(x.to_dense() if isinstance(x, sparsefill.SparseTensor) else x, y)


def _values(param, out):  # (topk/sort: equal elements' order is torch's kernel's own)
    torch.testing.assert_close(out["sparsefill"][0], out["dense torch"][0])


@case("topk(A, 10, dim) 1%", sizes=SIZES, quick_sizes=QUICK, tiny_sizes=TINY, check=_values)
def topk(param):
    A, D, d = _matrix(param)
    return _pairs(lambda: tuple(torch.topk(A, 10, d)), lambda: tuple(torch.topk(D, 10, d)))


@case("sort(A, dim) 1%", sizes=SIZES, quick_sizes=QUICK, tiny_sizes=TINY, check=_values)
def sort(param):
    """Beside the two sorts, "the output alone": allocating the two outputs and writing each
    element once, the floor of any sort that returns new tensors (the first touch of fresh
    memory, page faults included, is most of it when the allocator hands out new pages)."""
    A, D, d = _matrix(param)
    pairs = _pairs(lambda: tuple(torch.sort(A, d)), lambda: tuple(torch.sort(D, d)))
    return [*pairs, ("the output alone", lambda: tuple(t.fill_(0) for t in _outputs(D)))]


def _outputs(D):
    return torch.empty(D.shape, dtype=D.dtype), torch.empty(D.shape, dtype=torch.int64)


@case("sort(A, dim, out=) 1%", sizes=SIZES, quick_sizes=QUICK, tiny_sizes=TINY, check=_values)
def sort_out(param):
    """Into outputs allocated once (``out=``, both sides): the sort's own work, without the
    first touch of a new output."""
    A, D, d = _matrix(param)
    mine, theirs = _outputs(D), _outputs(D)
    return _pairs(
        lambda: tuple(torch.sort(A, d, out=mine)), lambda: tuple(torch.sort(D, d, out=theirs))
    )


@case("unique(A, return_counts) 1%", sizes=SIZES, quick_sizes=QUICK, tiny_sizes=TINY, check=_same)
def unique(param):
    A, D, _ = _matrix(param)
    return _pairs(
        lambda: tuple(torch.unique(A, return_counts=True)),
        lambda: tuple(torch.unique(D, return_counts=True)),
    )


@case("quantile(A, 0.3, dim) 1%", sizes=SIZES, quick_sizes=QUICK, tiny_sizes=TINY, check=_same)
def quantile(param):
    A, D, d = _matrix(param)
    return _pairs(lambda: torch.quantile(A, 0.3, dim=d), lambda: torch.quantile(D, 0.3, dim=d))
