"""Conversion cases: dense -> SparseTensor (``sparsefill.to_sparse``) and back (``A.to_dense()``).

Peers are torch native sparse tensors, which have fill 0: for a nonzero fill ``f`` the peer
is what a user would write by hand, ``(x - f).to_sparse()`` and ``t.to_dense() + f``.

Inputs (fixed seed): a float32 tensor equal to the fill except at exactly
``round(numel * density)`` distinct random positions holding ``randn() + 3``.
Full sizes: 1-D 10M elements at 1%, 2-D 20000x20000 (1.6 GB dense) at 0.1%; ``--quick``:
1-D 1M at 1%, 2-D 4000x4000 at 0.1%.  CSR cases run on the 2-D size only.
"""

from __future__ import annotations

import math

import torch

import sparsefill

from sparsefill.benchmarks.runner import case

FILL = 1.5
SEED = 0

SIZES_1D = {"1-D 10M, 1%": ((10_000_000,), 0.01)}
SIZES_2D = {"2-D 20000x20000, 0.1%": ((20000, 20000), 0.001)}
QUICK_1D = {"1-D 1M, 1%": ((1_000_000,), 0.01)}
QUICK_2D = {"2-D 4000x4000, 0.1%": ((4000, 4000), 0.001)}
SIZES, QUICK = {**SIZES_1D, **SIZES_2D}, {**QUICK_1D, **QUICK_2D}

_CACHE: dict[tuple, torch.Tensor] = {}
_CACHE_MAX = (
    4  # dense inputs kept between cases: (1-D, 2-D) x (fill 0, fill 1.5); 3.3 GB at full size
)


def dense_input(shape, density: float, fill: float = 0.0) -> torch.Tensor:
    """Float32 tensor of ``shape``: ``fill`` except at ``round(numel * density)`` distinct random
    positions."""
    key = (tuple(shape), density, fill)
    if key in _CACHE:
        return _CACHE[key]
    n, k = math.prod(shape), round(math.prod(shape) * density)
    g = torch.Generator().manual_seed(SEED)
    # distinct positions without a randperm of numel: oversample, dedupe, pick k at random
    pos = torch.randint(n, (k + k // 4 + 16,), generator=g).unique()
    while pos.numel() < k:  # pragma: no cover - needs absurd densities
        pos = torch.cat([pos, torch.randint(n, (k,), generator=g)]).unique()
    pos = pos[torch.randperm(pos.numel(), generator=g)[:k]]
    vals = torch.randn(k, generator=g) + 3.0
    x = torch.full(tuple(shape), fill, dtype=torch.float32)
    x.view(-1)[pos] = vals
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = x
    return x


def clear_cache() -> None:
    _CACHE.clear()


# ---------------------------------------------------------------------- checks (on the warm-up
# outputs)
def _allclose_chunked(a: torch.Tensor, b: torch.Tensor, chunk: int = 1 << 24) -> bool:
    """``torch.allclose`` without its numel-sized temporaries (several GB at 20000x20000)."""
    a, b = a.reshape(-1), b.reshape(-1)
    return all(
        torch.allclose(a[i : i + chunk], b[i : i + chunk]) for i in range(0, a.numel(), chunk)
    )


def _check_to_sparse(fill):
    def check(param, out):
        shape, density = param
        A, t = out.values()
        if A.sparse_layout is not t.layout:
            raise AssertionError(f"layouts differ: {A.sparse_layout} vs {t.layout}")
        k = round(math.prod(shape) * density)
        if A._nse() != k or t._nnz() != k:
            raise AssertionError(f"nse: sparsefill {A._nse()}, torch {t._nnz()}, expected {k}")
        if A.sparse_layout is torch.sparse_coo:
            same_idx = torch.equal(A.indices(), t.indices())
        else:
            same_idx = torch.equal(A.crow_indices(), t.crow_indices()) and torch.equal(
                A.col_indices(), t.col_indices()
            )
        if not same_idx:
            raise AssertionError("sparsefill and torch specify different positions")
        if not torch.allclose(A.values().detach() - fill, t.values()):
            raise AssertionError("sparsefill values - fill != torch values of (x - fill)")
        if float(A.fill_value()) != fill:
            raise AssertionError(f"fill {A.fill_value()} != {fill}")

    return check


# ---------------------------------------------------------------------- registration
def _bytes(param) -> int:
    """Least bytes moved: the float32 dense tensor once, plus int64 indices and float32 values per
    specified element."""
    shape, density = param
    return math.prod(shape) * 4 + round(math.prod(shape) * density) * (8 * len(shape) + 4)


def _native(layout):
    return (
        (lambda x: x.to_sparse()) if layout is torch.sparse_coo else (lambda x: x.to_sparse_csr())
    )


def _layout_name(layout) -> str:
    return "coo" if layout is torch.sparse_coo else "csr"


def _register_to_sparse(layout, fill):
    native = _native(layout)
    lname = _layout_name(layout)
    peer = (
        f"x.to_sparse{'' if lname == 'coo' else '_csr'}()"
        if fill == 0
        else f"(x - {fill}).to_sparse{'' if lname == 'coo' else '_csr'}()"
    )
    sizes, quick = (SIZES, QUICK) if layout is torch.sparse_coo else (SIZES_2D, QUICK_2D)

    @case(
        f"to_sparse {lname} fill={fill:g}",
        sizes=sizes,
        quick_sizes=quick,
        check=_check_to_sparse(fill),
        bytes=_bytes,
    )
    def bench(param):
        shape, density = param
        x = dense_input(shape, density, fill)
        fv = None if fill == 0 else fill
        if fill == 0:
            return [
                ("sparsefill.to_sparse", lambda: sparsefill.to_sparse(x, layout=layout)),
                (peer, lambda: native(x)),
            ]
        return [
            ("sparsefill.to_sparse", lambda: sparsefill.to_sparse(x, fill_value=fv, layout=layout)),
            (peer, lambda: native(x - fill)),
        ]

    return bench


def _register_to_dense(layout, fill):
    native = _native(layout)
    lname = _layout_name(layout)
    peer = "t.to_dense()" if fill == 0 else f"t.to_dense() + {fill}"
    sizes, quick = (SIZES, QUICK) if layout is torch.sparse_coo else (SIZES_2D, QUICK_2D)

    def check(param, out):
        a, b = out.values()
        if a.shape != b.shape or not torch.equal(a, dense_input(*param, fill)):
            raise AssertionError("sparsefill to_dense does not give back the input")
        if not _allclose_chunked(a, b):
            raise AssertionError("sparsefill to_dense != torch to_dense (+ fill)")

    @case(
        f"to_dense {lname} fill={fill:g}", sizes=sizes, quick_sizes=quick, check=check, bytes=_bytes
    )
    def bench(param):
        shape, density = param
        x = dense_input(shape, density, fill)
        A = sparsefill.to_sparse(x, fill_value=None if fill == 0 else fill, layout=layout)
        t = native(x - fill) if fill else native(x)
        if fill == 0:
            return [("A.to_dense()", lambda: A.to_dense()), (peer, lambda: t.to_dense())]
        return [("A.to_dense()", lambda: A.to_dense()), (peer, lambda: t.to_dense() + fill)]

    return bench


for _layout in (torch.sparse_coo, torch.sparse_csr):
    for _fill in (0.0, FILL):
        _register_to_sparse(_layout, _fill)
for _layout in (torch.sparse_coo, torch.sparse_csr):
    for _fill in (0.0, FILL):
        _register_to_dense(_layout, _fill)
