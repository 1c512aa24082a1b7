"""Element-wise cases: ``torch.exp(A * -8.0)`` with a nonzero fill (the membrane
potential), ``A + B`` over two patterns, and the per-call cost of small element-wise ops.

Peers: the same ops on the values tensor alone (the floor: what a user keeping
``(indices, values, fill)`` by hand would run), and pydata ``sparse`` (fill_value=5) when installed.

Per call: a coalesced 10-element COO tensor, 5 stored, fill 1, float64; the ``sparsefill
− peer`` column is the cost above the values-only op (``torch.exp(A)`` vs ``torch.exp(A.values())``,
``A * 2`` vs ``values * 2``, ``A + A`` vs ``values + values``, in place ``A.mul_(1.0)`` vs
``values.mul_(1.0)``, ``A.detach()`` vs ``values.detach()``) and, for ``A + B`` with another pattern
(5 stored, fill 2, 3 positions in common), above dense ``x + y`` on the 10 elements: with the same
``B`` every call (the pattern pair recurs: its union is merged once) and with a new ``B`` of that
pattern every call (a merge per call).
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

import sparsefill

from sparsefill.benchmarks.runner import case, skipped


def _signal(n: int, density: float, fill: float = 5.0):
    g = torch.Generator().manual_seed(0)
    nse = round(n * density)
    idx = torch.randperm(n, generator=g)[:nse].sort().values
    vals = torch.randn(nse, generator=g, dtype=torch.float64) + fill + 3
    return idx, vals


def _check(param, out):
    ref = out["sparsefill"]
    torch.testing.assert_close(ref._values(), out["values only"])
    torch.testing.assert_close(float(ref._fill_value()), float(np.exp(5.0 * -8.0)))
    if "pydata sparse" in out:
        s = out["pydata sparse"]
        torch.testing.assert_close(torch.from_numpy(s.data), ref._values())


@case(
    "exp(A * -8) fill=5",
    sizes={"1-D 10M, 1%": ((10_000_000,), 0.01)},
    quick_sizes={"1-D 1M, 1%": ((1_000_000,), 0.01)},
    check=_check,
    bytes=lambda p: 2 * round(p[0][0] * p[1]) * 8,
)  # float64 values read and written
def exp_scaled(param):
    (n,), density = param
    idx, vals = _signal(n, density)
    A = sparsefill.sparse_coo_tensor(idx[None], vals, (n,), fill_value=5.0)
    impls = [
        ("sparsefill", lambda: torch.exp(A * -8.0)),
        ("values only", lambda: torch.exp(vals * -8.0)),
    ]
    try:
        import sparse
    except ImportError:  # peer not installed: skipped, noted in the table
        return impls + [skipped("pydata sparse", "not installed (pip install sparse)")]
    s = sparse.COO(idx[None].numpy(), vals.numpy(), shape=(n,), fill_value=5.0)
    impls.append(("pydata sparse", lambda: np.exp(s * -8.0)))
    return impls


def _check_add(param, out):
    ref = out["sparsefill"]
    torch.testing.assert_close(ref._values(), out["torch native (fill 0)"].values() + 3.0)
    if "pydata sparse" in out:
        torch.testing.assert_close(torch.from_numpy(out["pydata sparse"].data), ref._values())


@case(
    "A + B, different patterns, fills 1 and 2",
    sizes={
        "20000x20000, 0.1% each": ((20_000, 20_000), 0.001),
        "1-D 10M, 1% each": ((10_000_000,), 0.01),
    },
    quick_sizes={"2000x2000, 1% each": ((2_000, 2_000), 0.01)},
    check=_check_add,
    bytes=lambda p: 4 * round(np.prod(p[0]) * p[1]) * (8 * len(p[0]) + 8),
)  # ~: 2 operands + union
def add_union(param):
    shape, density = param
    n = int(np.prod(shape))
    (ia, va), (ib, vb) = _signal(n, density, 1.0), _signal(n, density, 2.0)
    ib = torch.randperm(n, generator=torch.Generator().manual_seed(1))[: ib.numel()].sort().values
    ia, ib = (torch.stack(torch.unravel_index(i, shape)) for i in (ia, ib))  # row-major order kept
    A = sparsefill.sparse_coo_tensor(ia, va, shape, fill_value=1.0)
    B = sparsefill.sparse_coo_tensor(ib, vb, shape, fill_value=2.0)
    # by hand with torch native sparse: shift to zero fill, add, coalesce, remember fill 3
    An = torch.sparse_coo_tensor(ia, va - 1.0, shape).coalesce()
    Bn = torch.sparse_coo_tensor(ib, vb - 2.0, shape).coalesce()
    impls = [("sparsefill", lambda: A + B), ("torch native (fill 0)", lambda: (An + Bn).coalesce())]
    try:
        import sparse
    except ImportError:
        return impls + [skipped("pydata sparse", "not installed (pip install sparse)")]
    sa = sparse.COO(ia.numpy(), va.numpy(), shape=shape, fill_value=1.0)
    sb = sparse.COO(ib.numpy(), vb.numpy(), shape=shape, fill_value=2.0)
    impls.append(("pydata sparse", lambda: sa + sb))
    return impls


def _small(seed: int, fill: float):
    """A coalesced 10-element COO tensor with 5 stored (float64), its values and its dense
    tensor."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(10, generator=g)[:5].sort().values
    vals = torch.randn(5, generator=g, dtype=torch.float64)
    A = sparsefill.sparse_coo_tensor(idx[None], vals, (10,), fill_value=fill).coalesce()
    return A, A._values().detach(), A.to_dense()


def _check_per_call(param, out):
    got, peer = out["sparsefill"], [v for k, v in out.items() if k != "sparsefill"][0]
    torch.testing.assert_close(got.to_dense() if param.startswith("A + B") else got._values(), peer)


PER_CALL = {
    "torch.exp(A)": "torch.exp(A)",
    "A * 2": "A * 2",
    "A + A": "A + A",
    "A.mul_(1.0)": "A.mul_(1.0)",
    "A.detach()": "A.detach()",
    "A + B, other pattern": "A + B, other pattern",
    "A + B, other pattern, new each call": "A + B, other pattern, new each call",
}


@case("per call: 10 elements, 5 stored, fill 1, float64", sizes=PER_CALL, check=_check_per_call)
def per_call(op):
    """One small element-wise call against the same op on the values alone (dense ``x + y`` for ``A
    + B``)."""
    A, vals, x = _small(0, 1.0)
    if op == "torch.exp(A)":
        return [
            ("sparsefill", lambda: torch.exp(A)),
            ("torch.exp(values)", lambda: torch.exp(vals)),
        ]
    if op == "A * 2":
        return [("sparsefill", lambda: A * 2), ("values * 2", lambda: vals * 2)]
    if op == "A + A":
        return [("sparsefill", lambda: A + A), ("values + values", lambda: vals + vals)]
    if op == "A.mul_(1.0)":  # in place (times 1.0: every call the same values)
        v = vals.clone()
        return [("sparsefill", lambda: A.mul_(1.0)), ("values.mul_(1.0)", lambda: v.mul_(1.0))]
    if op == "A.detach()":
        return [("sparsefill", lambda: A.detach()), ("values.detach()", lambda: vals.detach())]
    B, _, y = _small(2, 2.0)
    # the union of a pattern pair that recurs is merged once (pointwise.union2)
    if op == "A + B, other pattern":
        return [("sparsefill", lambda: A + B), ("dense x + y", lambda: x + y)]
    # every call a B of that pattern with index tensors of its own (more than the pattern cache
    # holds): a merge
    Bs = itertools.cycle(
        [
            sparsefill.sparse_coo_tensor(
                B._indices().clone(), B._values().detach(), (10,), fill_value=2.0, is_coalesced=True
            )
            for _ in range(256)
        ]
    )
    ys = itertools.cycle([y] * 256)
    return [("sparsefill", lambda: A + next(Bs)), ("dense x + y", lambda: x + next(ys))]
