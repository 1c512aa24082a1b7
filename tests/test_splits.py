"""Element-wise ops between SparseTensors that split their dims differently into sparse and dense (issue 18)::

    op(A, B).to_dense() == op(A.to_dense(), B.to_dense())          (forward)
    grad(values, fill of A and B) == the same gradients through the dense tensors        (backward)

with no densify fallback, forward or backward (``densify_policy("raise")``: the fallback raises
``DensifyError``).  Over every OpInfo binary ufunc (``binary_ufuncs`` of ``op_db``, float64), every sample
whose input and first argument are tensors: one operand hybrid (one trailing dense dim, COO or CSR), the
other all-sparse (COO, or CSR on 2-d), in both orders (:data:`PAIRS`), so that broadcasting meets both
kinds of size-1 dims ((5, 1) hybrid against (5,), (10, 1, 5) against (10, 5)...).  The fills rotate over
the samples (:data:`FILLS`): a non-uniform array fill on the hybrid operand, a uniform one, NaN, and an
indefinite fill on either operand (then the result is compared where it is specified, which must be
exactly where every indefinite operand is, and the loss is the masked sum).

The counts of (op, pair, sample) outcomes are printed by :func:`test_report` (``-s``): ``native``, ``n/a``
(an operand of a shape the kind does not take), ``ref-rejects`` (the dense op raises: so must the sparse one).
"""

from __future__ import annotations

import collections
import warnings

import pytest
import torch
from torch.testing._internal.common_methods_invocations import binary_ufuncs, op_db

import sparsefill
from sparsefill import SparseTensor


IN_OP_DB = {id(op) for op in op_db}
BINARY = [op for op in binary_ufuncs if id(op) in IN_OP_DB and op.supports_dtype(torch.float64, "cpu")
          and not op.name.startswith("jiterator_")]  # (jiterator: CUDA only, the dense op rejects every CPU sample)
KINDS = {"hybrid": (torch.sparse_coo, 1), "coo": (torch.sparse_coo, 0), "csr": (torch.sparse_csr, 0),
         "hybrid-csr": (torch.sparse_csr, 1)}
PAIRS = [("hybrid", "coo"), ("coo", "hybrid"), ("hybrid", "csr"), ("csr", "hybrid"), ("hybrid-csr", "coo"),
         ("coo", "hybrid-csr")]
FILLS = ["array", "uniform", "nan", "indefinite-hybrid", "indefinite-sparse", "array"]
REPORT: dict = collections.defaultdict(collections.Counter)
# op -> (fills not run, reason): printed by test_report
DECLARED = {"special." + name: (("nan",), "torch 2.13's CPU kernel returns uninitialized memory for a NaN x at some "
                                          "n (6.95e-310 for x = NaN, n = 6.39, seen): no value to compare")
            for name in ("chebyshev_polynomial_u", "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t",
                         "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_w", "laguerre_polynomial_l",
                         "legendre_polynomial_p")}


def _key(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


class Operand:
    """A random pattern of ``x`` (about half its slices stored) of a kind (:data:`KINDS`) and fill, as leaves
    ``values``/``fill`` that build the SparseTensor (:meth:`sparse`) and the same dense tensor (:meth:`dense`)."""

    def __init__(self, x: torch.Tensor, kind: str, fill: str, g: torch.Generator):
        self.layout, self.dd = KINDS[kind]
        need = (2 if self.layout is torch.sparse_csr else 0) + self.dd
        self.ok = x.dim() >= need and (self.layout is not torch.sparse_csr or x.dim() == need)
        if not self.ok:
            return
        self.shape, D = x.shape, x.shape[x.dim() - self.dd:]
        self.mask = torch.rand(x.shape[: x.dim() - self.dd], generator=g) < 0.5
        self.idx = self.mask.nonzero().T
        self.values = x.detach()[self.mask].clone() if self.mask.dim() else x.detach()[None][: int(self.mask)].clone()
        first = x.reshape(-1)[0] if x.numel() else torch.ones((), dtype=x.dtype)
        indefinite = fill == "indefinite-hybrid" and self.dd or fill == "indefinite-sparse" and not self.dd
        self.fill = (None if indefinite else torch.full((), float("nan"), dtype=x.dtype) if fill == "nan" else
                     torch.randn(D, dtype=x.dtype, generator=g) if fill == "array" and self.dd else
                     first.expand(D).clone() if self.dd else first.clone())

    def leaves(self):
        v = self.values.clone().requires_grad_()
        return v, None if self.fill is None else self.fill.clone().requires_grad_()

    def sparse(self, v, f):
        A = sparsefill.sparse_coo_tensor(self.idx, v, self.shape, fill_value=sparsefill.indefinite if f is None else f)
        return A.to_sparse_csr() if self.layout is torch.sparse_csr else A

    def dense(self, v, f):
        z = torch.zeros(self.shape, dtype=v.dtype).index_put(tuple(self.idx), v) if self.mask.dim() else \
            (v.reshape(self.shape) if int(self.mask) else torch.zeros(self.shape, dtype=v.dtype))
        return torch.where(self.stored(), z, torch.ones((), dtype=v.dtype) if f is None else f)

    def stored(self):
        return self.mask.reshape(self.mask.shape + (1,) * self.dd).expand(self.shape)

    def specified(self):
        """Where the dense tensor has a value: everywhere but the unspecified elements of an indefinite fill."""
        return self.stored() if self.fill is None else torch.ones(self.shape, dtype=torch.bool)


def _operands(sample, pair, fill, seed):
    x, y = sample.input, sample.args[0] if sample.args else None
    if not all(isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.layout is torch.strided for t in (x, y)):
        return None
    g = torch.Generator().manual_seed(seed)
    ops = [Operand(t, kind, fill, g) for t, kind in zip((x, y), pair)]
    return ops if all(o.ok for o in ops) else None


def _run(op, sample, pair, fill, seed):
    """One (op, sample, pair): compares forward and backward with the dense computation; the outcome."""
    ops = _operands(sample, pair, fill, seed)
    if ops is None:
        return "n/a"
    rest, kw = sample.args[1:], sample.kwargs
    leaves = [o.leaves() for o in ops]
    flat = [t for vf in leaves for t in vf if t is not None]
    spec = ops[0].specified() & ops[1].specified() if ops[0].fill is None or ops[1].fill is None else None
    try:
        ref = op(*[o.dense(*vf) for o, vf in zip(ops, leaves)], *rest, **kw)
    except Exception:  # noqa: BLE001 - the dense op rejects the sample: so must the sparse call
        with pytest.raises(Exception):
            op(*[o.sparse(*[t.detach() for t in vf if t is not None], *([None] if vf[1] is None else []))
                 for o, vf in zip(ops, leaves)], *rest, **kw)
        return "ref-rejects"
    with sparsefill.densify_policy("raise"):
        out = op(*[o.sparse(*vf) for o, vf in zip(ops, leaves)], *rest, **kw)
        assert isinstance(out, SparseTensor), f"the result is a {type(out).__name__}, not a SparseTensor"
        if spec is None:
            torch.testing.assert_close(out.to_dense(), ref, equal_nan=True)
        else:
            spec = spec.expand(ref.shape)
            d0, d1 = out.to_dense(fill_value=0), out.to_dense(fill_value=1)
            assert torch.equal((d0 != 0) | (d1 != 1), spec), "the result is not specified where the operands are"
            torch.testing.assert_close(d0[spec], ref[spec], equal_nan=True)
        if not (ref.dtype.is_floating_point and op.supports_autograd and flat):
            return "native"
        W = torch.randn(ref.shape, dtype=ref.dtype, generator=torch.Generator().manual_seed(seed))
        dense_loss = (ref * W).sum() if spec is None else torch.where(spec, ref * W, 0).sum()
        try:
            want = torch.autograd.grad(dense_loss, flat, allow_unused=True)
        except RuntimeError:  # no derivative formula (e.g. igamma's in its first argument): nor sparse
            return "native"
        loss = ((out.to_dense() if spec is None else out.to_dense(fill_value=0)) * W).sum()
        got = torch.autograd.grad(loss, flat, allow_unused=True)
    for w, g_, t in zip(want, got, flat):
        torch.testing.assert_close(torch.zeros_like(t) if g_ is None else g_,
                                   torch.zeros_like(t) if w is None else w, equal_nan=True)
    return "native"


@pytest.mark.parametrize("op", BINARY, ids=_key)
def test_mixed_splits_are_native(op):
    failures = []
    for seed, sample in enumerate(op.sample_inputs("cpu", torch.float64, requires_grad=False)):
        for p, pair in enumerate(PAIRS):
            fill = FILLS[(seed + p) % len(FILLS)]
            if fill in DECLARED.get(_key(op), ((),))[0]:
                REPORT[_key(op)]["declared"] += 1
                continue
            try:
                outcome = _run(op, sample, pair, fill, seed)
            except sparsefill.DensifyError as e:
                outcome = "densify"
                failures.append(f"[{pair}, {fill}, sample {seed}] densified: {str(e)[:200]}")
            except Exception as e:  # noqa: BLE001 - collected and reported below
                outcome = "FAIL"
                failures.append(f"[{pair}, {fill}, sample {seed}] {type(e).__name__}: {str(e)[:300]}")
            REPORT[_key(op)][outcome] += 1
    assert not failures, "\n".join(failures)
    assert REPORT[_key(op)]["native"], f"{_key(op)}: no sample ran natively: {dict(REPORT[_key(op)])}"


def test_report(capsys):
    """The counts of the sweep above (when it ran in this session): ops with a densified or failed sample."""
    if not REPORT:
        pytest.skip("the OpInfo sweep did not run in this session")
    total = sum(REPORT.values(), collections.Counter())
    bad = sorted(k for k, c in REPORT.items() if c["densify"] or c["FAIL"])
    with capsys.disabled():
        for name, (fills, reason) in DECLARED.items():
            print(f"\ndeclared (mixed splits) {name} [{', '.join(fills)}]: {reason}")
        print(f"\nmixed splits: {len(REPORT)} ops, outcomes {dict(total)}; ops with a densified or failed sample: "
              f"{len(bad)}{': ' + ', '.join(bad) if bad else ''}")
