"""Linear algebra: ``A @ x`` with ``A`` sparse of nonzero fill ``a`` and ``x`` dense ``(n, 64)``.

sparsefill computes ``A @ x = (A - a) @ x + a * x.sum(0)`` (ops/linalg.py) with ``A - a`` a
torch native CSR matrix.  Peers, in the same run:

* ``torch CSR (A - a) @ x + a * x.sum(0)``: the same decomposition written by hand on a
  prebuilt native CSR tensor (the floor sparsefill's overhead is measured against);
* ``torch CSR A0 @ x`` (zero-fill equivalent, no correction): the bare native kernel;
* ``dense torch.mm``: the dense ``A`` (1.6 GB at 20000x20000 float32) times ``x``.

Inputs (fixed seed, float32): ``round(n*n*density)`` distinct random positions holding
``randn() + 3``, fill 5, CSR.  Full sizes: 20000x20000 at 1% and 0.1%; ``--quick``: 4000x4000 at 1%.

Measured (``--filter "A @ x" --threads 1``, 2-core shared machine, other processes kept ~1.5
cores busy: spreads of +-100%, treat the ratios as rough):

=================  ==========  ===============  ==============  ===============
size               sparsefill  hand-written     bare A0 @ x     dense torch.mm
=================  ==========  ===============  ==============  ===============
20000^2, 1%        79 ms       96 ms (0.83x)    81 ms (0.98x)   2.74 s (35x)
20000^2, 0.1%      14 ms       21 ms (0.69x)    14 ms (1.01x)   1.78 s (124x)
4000^2, 1% quick   1.6 ms      2.1 ms (0.74x)   1.9 ms (0.83x)  43 ms (27x)
=================  ==========  ===============  ==============  ===============

(ratio in parentheses: sparsefill time / peer time for the middle columns, peer / sparsefill
for dense).  A quieter ad-hoc run (median of 7 calls, 1 thread, 20000^2 at 1%): sparsefill CSR
47-50 ms, sparsefill COO 54 ms, zero-fill CSR 45 ms, native ``(A - a) @ x + a * x.sum(0)``
46 ms; dense-on-the-left ``x.T @ A``: sparsefill 262 ms (a transposed CSR built by a counting
sort, then CSR @ dense) against torch's native ``x.T @ csr`` at 443 ms.  The hand-written peer uses ``torch.addmm`` with a CSR ``mat1``, which is no faster
than ``mm`` plus an add; sparsefill's overhead over the bare kernel is the ``values - a``
temporary (O(nse)) and the ``x.sum(0)`` correction.
"""

from __future__ import annotations

import math
import warnings

import torch

import sparsefill

from .runner import case

FILL = 5.0
COLS = 64
SEED = 0


def _pattern(shape, density):
    n, k = math.prod(shape), round(math.prod(shape) * density)
    g = torch.Generator().manual_seed(SEED)
    pos = torch.randint(n, (k + k // 4 + 16,), generator=g).unique()
    pos = pos[torch.randperm(pos.numel(), generator=g)[:k]].sort().values
    idx = torch.stack(torch.unravel_index(pos, shape))
    return idx, torch.randn(k, generator=g) + 3.0


def _check(param, out):
    ref = out["torch CSR (A - a) @ x + a * x.sum(0)"]
    scale = ref.abs().max().clamp_min(1.0)
    for label, y in out.items():
        if label.startswith("torch CSR A0"):
            continue
        if not torch.allclose(y / scale, ref / scale, rtol=1e-4, atol=1e-4):
            raise AssertionError(f"{label} differs from the hand-written decomposition by "
                                 f"{float((y - ref).abs().max())} (scale {float(scale)})")


@case("A @ x, A CSR fill 5, x dense (n, 64)",
      sizes={"20000x20000, 1%": ((20000, 20000), 0.01), "20000x20000, 0.1%": ((20000, 20000), 0.001)},
      quick_sizes={"4000x4000, 1%": ((4000, 4000), 0.01)}, check=_check,
      bytes=lambda p: round(math.prod(p[0]) * p[1]) * 12 + (p[0][0] + p[0][1]) * COLS * 4)
def spmm_fill(param):
    shape, density = param
    idx, vals = _pattern(shape, density)
    A = sparsefill.sparse_coo_tensor(idx, vals, shape, fill_value=FILL).to_sparse_csr()
    x = torch.randn(shape[1], COLS, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: "Sparse CSR tensor support is in beta state"
        A0 = torch.sparse_csr_tensor(A.crow_indices(), A.col_indices(), A.values() - FILL, shape)
        Az = torch.sparse_csr_tensor(A.crow_indices(), A.col_indices(), A.values(), shape)
    dense = torch.full(shape, FILL)
    dense[idx[0], idx[1]] = vals
    return [("sparsefill", lambda: A @ x),
            ("torch CSR (A - a) @ x + a * x.sum(0)", lambda: torch.addmm(x.sum(0).mul_(FILL), A0, x)),
            ("torch CSR A0 @ x (zero fill, no correction)", lambda: Az @ x),
            ("dense torch.mm", lambda: torch.mm(dense, x))]
