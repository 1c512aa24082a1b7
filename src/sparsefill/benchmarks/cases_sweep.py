"""Density sweeps: where sparsefill stops beating dense torch.

One 1-D float32 tensor of ``n`` elements (10M; ``--quick`` 1M), ``round(n * density)``
specified at distinct random positions (fixed seed), densities 0.01% to 50%; a plot per case
(time against density, log-log).  Peers: the same computation on the dense tensor (torch), torch
native sparse where it applies, and pydata ``sparse`` with the same fill (skipped when not
installed).  ``bytes``: the least the sparse operation must read and write (values and indices
of the operands and of the result; int64 indices, float32 values).
"""

from __future__ import annotations

import numpy as np
import torch

import sparsefill

from sparsefill.benchmarks.runner import Bench, case, optional_import, skipped

DENSITIES = [0.0001, 0.001, 0.01, 0.05, 0.1, 0.25, 0.5]
QUICK_DENSITIES = [0.0001, 0.001, 0.01, 0.1, 0.5]
N, QUICK_N = 10_000_000, 1_000_000


def _sizes(n, densities):
    return {f"{n / 1e6:g}M, {100 * d:g}%": (n, d) for d in densities}


SWEEP = dict(
    sizes=_sizes(N, DENSITIES),
    quick_sizes=_sizes(QUICK_N, QUICK_DENSITIES),
    tiny_sizes=_sizes(200, [0.01, 0.5]),
    sweep="density (% of elements specified)",
    x=lambda p: 100 * p[1],
)
NO_PYDATA = "pydata sparse not installed (pip install sparse)"


def _pattern(n: int, density: float, fill: float, seed: int):
    """Sorted distinct positions, values ``randn + fill + 3``, the SparseTensor and the dense
    tensor."""
    g = torch.Generator().manual_seed(seed)
    nse = round(n * density)
    idx = torch.randperm(n, generator=g)[:nse].sort().values
    vals = torch.randn(nse, generator=g) + fill + 3.0
    A = sparsefill.sparse_coo_tensor(idx[None], vals, (n,), fill_value=fill)
    x = torch.full((n,), fill)
    x[idx] = vals
    return idx, vals, A, x


def _pydata(idx, vals, n, fill):
    sparse = optional_import("sparse")
    if sparse is None:
        return None
    return sparse.COO(
        idx[None].numpy(),
        vals.numpy(),
        shape=(n,),
        fill_value=fill,
        sorted=True,
        has_duplicates=False,
    )


def _check_against_dense(dense_label):
    def check(param, out):
        ref = out[dense_label]
        for label, got in out.items():
            if isinstance(got, sparsefill.SparseTensor):
                got = got.to_dense()
            elif isinstance(got, np.ndarray):
                got = torch.from_numpy(got)
            elif not isinstance(got, torch.Tensor):  # pydata sparse
                got = torch.from_numpy(np.asarray(got.todense()))
            elif got.layout is not torch.strided:
                continue
            torch.testing.assert_close(got, ref, msg=lambda m: f"{label} != {dense_label}: {m}")

    return check


@case("sweep: exp(A * -8), fill 5", check=_check_against_dense("dense torch"), **SWEEP)
def sweep_exp(param):
    """``torch.exp(A * -8)``: values and fill mapped, the pattern kept; dense: every element."""
    n, d = param
    idx, vals, A, x = _pattern(n, d, 5.0, 0)
    s = _pydata(idx, vals, n, 5.0)
    return Bench(
        [
            ("sparsefill", lambda: torch.exp(A * -8.0)),
            ("dense torch", lambda: torch.exp(x * -8.0)),
            ("pydata sparse", lambda: np.exp(s * -8.0))
            if s is not None
            else skipped("pydata sparse", NO_PYDATA),
        ],
        bytes=2 * vals.numel() * 4,
    )


@case(
    "sweep: A + B, fills 1 and 2, independent patterns",
    check=_check_against_dense("dense torch"),
    **SWEEP,
)
def sweep_add(param):
    """``A + B``: union of the two patterns; dense: ``x + y``."""
    n, d = param
    ia, va, A, x = _pattern(n, d, 1.0, 0)
    ib, vb, B, y = _pattern(n, d, 2.0, 1)
    union = torch.cat([ia, ib]).unique().numel()
    sa, sb = _pydata(ia, va, n, 1.0), _pydata(ib, vb, n, 2.0)
    return Bench(
        [
            ("sparsefill", lambda: A + B),
            ("dense torch", lambda: x + y),
            ("pydata sparse", lambda: sa + sb)
            if sa is not None
            else skipped("pydata sparse", NO_PYDATA),
        ],
        bytes=(ia.numel() + ib.numel() + union) * (8 + 4),
    )


@case("sweep: A.to_dense(), fill 5", check=_check_against_dense("dense torch x.clone()"), **SWEEP)
def sweep_to_dense(param):
    """``A.to_dense()`` against torch native sparse (fill 0: ``t.to_dense() + 5``), pydata's
    ``todense()``, a copy of the dense tensor (``x.clone()``) and the same result written by hand,
    the floors at low density: ``torch.full`` then ``index_put_`` (torch's fill of a fresh buffer),
    ``np.full`` then a fancy-index assignment (pydata's ``todense()`` without its Python)."""
    n, d = param
    idx, vals, A, x = _pattern(n, d, 5.0, 0)
    t = torch.sparse_coo_tensor(idx[None], vals - 5.0, (n,)).coalesce()
    s = _pydata(idx, vals, n, 5.0)
    inp, vnp = idx.numpy(), vals.numpy()

    def by_numpy():
        out = np.full(n, 5.0, dtype=np.float32)
        out[inp] = vnp
        return out

    return Bench(
        [
            ("sparsefill", lambda: A.to_dense()),
            ("dense torch x.clone()", lambda: x.clone()),
            ("torch native t.to_dense() + 5", lambda: t.to_dense() + 5.0),
            ("pydata sparse", lambda: s.todense())
            if s is not None
            else skipped("pydata sparse", NO_PYDATA),
            (
                "torch by hand: full + index_put_",
                lambda: torch.full((n,), 5.0).index_put_((idx,), vals),
            ),
            ("numpy by hand: full + fancy index", by_numpy),
        ],
        bytes=n * 4 + vals.numel() * (8 + 4),
    )
