"""Per-call overhead: ``torch.exp(A)`` on a SparseTensor of 10 elements (3 specified) and up.

The per-call target: ``torch.exp(A)`` costs at most 15 µs more than ``torch.exp`` on its values
tensor: the ``sparsefill − peer`` column of the 10-element row against ``torch.exp(A.values())`` is
that number (measured, not asserted).  The sizes sweep from 10 to 10M elements (30% specified, fill
5, float32) so the plot shows where the fixed cost stops mattering.  Peers: ``torch.exp`` on the
values alone (the floor) and on the dense tensor.
"""

from __future__ import annotations

import torch

import sparsefill

from sparsefill.benchmarks.runner import Bench, case

DENSITY = 0.3


def _inputs(n: int, fill: float = 5.0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    nse = round(n * DENSITY)
    idx = torch.randperm(n, generator=g)[:nse].sort().values
    vals = torch.randn(nse, generator=g)
    A = sparsefill.sparse_coo_tensor(idx[None], vals, (n,), fill_value=fill)
    x = torch.full((n,), fill)
    x[idx] = vals
    return A, vals, x


def _check(param, out):
    got = out["sparsefill torch.exp(A)"]
    torch.testing.assert_close(got._values(), out["torch.exp(values)"])
    torch.testing.assert_close(got.to_dense(), out["dense torch.exp(x)"])


@case(
    "overhead: torch.exp(A), 30% specified, fill 5",
    sizes={
        "10": 10,
        "100": 100,
        "1k": 1_000,
        "10k": 10_000,
        "100k": 100_000,
        "1M": 1_000_000,
        "10M": 10_000_000,
    },
    quick_sizes={"10": 10, "100": 100, "1k": 1_000, "10k": 10_000, "100k": 100_000},
    tiny_sizes={"10": 10},
    sweep="elements (numel of A)",
    check=_check,
)
def exp_overhead(n):
    A, vals, x = _inputs(n)
    return Bench(
        [
            ("sparsefill torch.exp(A)", lambda: torch.exp(A)),
            ("torch.exp(values)", lambda: torch.exp(vals)),
            ("dense torch.exp(x)", lambda: torch.exp(x)),
        ],
        bytes=2 * vals.numel() * 4,
    )


def _check_add(param, out):
    torch.testing.assert_close(out["sparsefill A + B"].to_dense(), out["dense x + y"])


@case("overhead: A + B, 10 elements, different patterns", sizes={"10": 10}, check=_check_add)
def add_overhead(n):
    A, _, x = _inputs(n, 1.0, 0)
    B, _, y = _inputs(n, 2.0, 1)
    return [("sparsefill A + B", lambda: A + B), ("dense x + y", lambda: x + y)]
