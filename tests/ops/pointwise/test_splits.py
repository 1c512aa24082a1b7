"""Element-wise ops between SparseTensors that split their dims differently into sparse and dense::

    op(A, B).to_dense() == op(A.to_dense(), B.to_dense())          (forward)
    grad(values, fill of A and B) == the same gradients through the dense tensors        (backward)

with no densify fallback, forward or backward (``densify_policy("raise")``: the fallback raises
``DensifyError``), and the forward not dense by nature either.  The upstream gradient is a SparseTensor on
even samples (the backward then merges its split with the operands': ``dense_by_nature="raise"`` there
too) and a dense tensor on odd ones (a gradient dense by nature).  Over every OpInfo binary ufunc (``binary_ufuncs`` of ``op_db``, float64), every sample
whose input and first argument are tensors: one operand hybrid (one trailing dense dim, COO or CSR), the
other all-sparse (COO, or CSR on 2-d), in both orders (:data:`PAIRS`), so that broadcasting meets both
kinds of size-1 dims ((5, 1) hybrid against (5,), (10, 1, 5) against (10, 5)...).  The fills rotate over
the samples (:data:`FILLS`): a non-uniform array fill on the hybrid operand, a uniform one, NaN, and an
indefinite fill on either operand (then the result is compared where it is specified, which must be
exactly where every indefinite operand is, and the loss is the masked sum).

The counts of (op, pair, sample) outcomes are printed by :func:`test_report`: ``native``, ``declared``, ``n/a``
(an operand of a shape the kind does not take), ``ref-rejects`` (the dense op raises: so must the sparse one).
"""

from __future__ import annotations

import collections

import pytest
import torch
from torch.testing._internal.common_methods_invocations import binary_ufuncs, op_db

import sparsefill
from sparsefill import SparseTensor
from sparsefill._tensor.dense_dims import coarser, finer, merge_dense_dim, uniform_along


IN_OP_DB = {id(op) for op in op_db}
BINARY = [
    op
    for op in binary_ufuncs
    if id(op) in IN_OP_DB
    and op.supports_dtype(torch.float64, "cpu")
    and not op.name.startswith("jiterator_")
]  # (jiterator: CUDA only, the dense op rejects every CPU sample)
KINDS = {
    "hybrid": (torch.sparse_coo, 1),
    "coo": (torch.sparse_coo, 0),
    "csr": (torch.sparse_csr, 0),
    "hybrid-csr": (torch.sparse_csr, 1),
}
PAIRS = [
    ("hybrid", "coo"),
    ("coo", "hybrid"),
    ("hybrid", "csr"),
    ("csr", "hybrid"),
    ("hybrid-csr", "coo"),
    ("coo", "hybrid-csr"),
]
FILLS = ["array", "uniform", "nan", "indefinite-hybrid", "indefinite-sparse", "array"]
REPORT: dict = collections.defaultdict(collections.Counter)
# op -> (fills not run, reason): printed by test_report
DECLARED = {
    "special." + name: (
        ("nan",),
        "torch 2.13's CPU kernel returns uninitialized memory for a NaN x at some "
        "n (6.95e-310 for x = NaN, n = 6.39, seen): no value to compare",
    )
    for name in (
        "chebyshev_polynomial_u",
        "chebyshev_polynomial_w",
        "shifted_chebyshev_polynomial_t",
        "shifted_chebyshev_polynomial_u",
        "shifted_chebyshev_polynomial_w",
        "laguerre_polynomial_l",
        "legendre_polynomial_p",
    )
}


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
        self.shape, D = x.shape, x.shape[x.dim() - self.dd :]
        self.mask = torch.rand(x.shape[: x.dim() - self.dd], generator=g) < 0.5
        self.idx = self.mask.nonzero().T
        self.values = (
            x.detach()[self.mask].clone()
            if self.mask.dim()
            else x.detach()[None][: int(self.mask)].clone()
        )
        first = x.reshape(-1)[0] if x.numel() else torch.ones((), dtype=x.dtype)
        indefinite = (
            fill == "indefinite-hybrid" and self.dd or fill == "indefinite-sparse" and not self.dd
        )
        self.fill = (
            None
            if indefinite
            else torch.full((), float(fill), dtype=x.dtype)
            if fill in ("nan", "inf")
            else torch.randn(D, dtype=x.dtype, generator=g)
            if fill == "array" and self.dd
            else first.expand(D).clone()
            if self.dd
            else first.clone()
        )

    def leaves(self):
        v = self.values.clone().requires_grad_()
        return v, None if self.fill is None else self.fill.clone().requires_grad_()

    def sparse(self, v, f):
        A = sparsefill.sparse_coo_tensor(
            self.idx, v, self.shape, fill_value=sparsefill.indefinite if f is None else f
        )
        return A.to_sparse_csr() if self.layout is torch.sparse_csr else A

    def dense(self, v, f):
        z = (
            torch.zeros(self.shape, dtype=v.dtype).index_put(tuple(self.idx), v)
            if self.mask.dim()
            else (
                v.reshape(self.shape) if int(self.mask) else torch.zeros(self.shape, dtype=v.dtype)
            )
        )
        return torch.where(self.stored(), z, torch.ones((), dtype=v.dtype) if f is None else f)

    def stored(self):
        return self.mask.reshape(self.mask.shape + (1,) * self.dd).expand(self.shape)

    def specified(self):
        """Where the dense tensor has a value: everywhere but the unspecified elements of an indefinite fill."""
        return self.stored() if self.fill is None else torch.ones(self.shape, dtype=torch.bool)


def _operands(sample, pair, fill, seed):
    x, y = sample.input, sample.args[0] if sample.args else None
    if not all(
        isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.layout is torch.strided
        for t in (x, y)
    ):
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
    spec = (
        ops[0].specified() & ops[1].specified()
        if ops[0].fill is None or ops[1].fill is None
        else None
    )
    try:
        ref = op(*[o.dense(*vf) for o, vf in zip(ops, leaves)], *rest, **kw)
    except Exception:  # noqa: BLE001 - the dense op rejects the sample: so must the sparse call
        with pytest.raises(Exception):
            op(
                *[
                    o.sparse(
                        *[t.detach() for t in vf if t is not None],
                        *([None] if vf[1] is None else []),
                    )
                    for o, vf in zip(ops, leaves)
                ],
                *rest,
                **kw,
            )
        return "ref-rejects"
    with sparsefill.densify_policy("raise", dense_by_nature="raise"):
        out = op(*[o.sparse(*vf) for o, vf in zip(ops, leaves)], *rest, **kw)
    assert isinstance(out, SparseTensor), (
        f"the result is a {type(out).__name__}, not a SparseTensor"
    )
    with sparsefill.densify_policy("raise"):
        if spec is None:
            torch.testing.assert_close(out.to_dense(), ref, equal_nan=True)
        else:
            spec = spec.expand(ref.shape)
            d0, d1 = out.to_dense(fill_value=0), out.to_dense(fill_value=1)
            assert torch.equal((d0 != 0) | (d1 != 1), spec), (
                "the result is not specified where the operands are"
            )
            torch.testing.assert_close(d0[spec], ref[spec], equal_nan=True)
        if not (ref.dtype.is_floating_point and op.supports_autograd and flat):
            return "native"
        g = torch.Generator().manual_seed(seed)
        W = torch.randn(ref.shape, dtype=ref.dtype, generator=g)
        sparse_upstream = spec is None and seed % 2 == 0 and ref.dim()
        if (
            sparse_upstream
        ):  # the backward merges the gradient's split with the operands': sparse throughout
            W[torch.rand(ref.shape, generator=g) < 0.5] = 0.25
        dense_loss = (ref * W).sum() if spec is None else torch.where(spec, ref * W, 0).sum()
        try:
            want = torch.autograd.grad(dense_loss, flat, allow_unused=True)
        except (
            RuntimeError
        ):  # no derivative formula (e.g. igamma's in its first argument): nor sparse
            return "native"
        if sparse_upstream:
            with sparsefill.densify_policy(dense_by_nature="raise"):
                got = torch.autograd.grad(
                    (out * sparsefill.to_sparse(W, fill_value=0.25)).sum(), flat, allow_unused=True
                )
        else:  # a dense upstream gradient: dense by nature in backward (allowed), never the fallback
            loss = ((out.to_dense() if spec is None else out.to_dense(fill_value=0)) * W).sum()
            got = torch.autograd.grad(loss, flat, allow_unused=True)
    for w, g_, t in zip(want, got, flat):
        torch.testing.assert_close(
            torch.zeros_like(t) if g_ is None else g_,
            torch.zeros_like(t) if w is None else w,
            equal_nan=True,
        )
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
                failures.append(
                    f"[{pair}, {fill}, sample {seed}] {type(e).__name__}: {str(e)[:300]}"
                )
            REPORT[_key(op)][outcome] += 1
    assert not failures, "\n".join(failures)
    assert REPORT[_key(op)]["native"], (
        f"{_key(op)}: no sample ran natively: {dict(REPORT[_key(op)])}"
    )


def test_report(summary_line):
    """The counts of the sweep above (when it ran in this run): ops with a densified or failed sample."""
    if not REPORT:
        pytest.skip("the OpInfo sweep did not run in this run")
    total = sum(REPORT.values(), collections.Counter())
    bad = sorted(k for k, c in REPORT.items() if c["densify"] or c["FAIL"])
    for name, (fills, reason) in DECLARED.items():
        summary_line(f"declared (mixed splits) {name} [{', '.join(fills)}]: {reason}")
    summary_line(
        f"mixed splits: {len(REPORT)} ops, outcomes {dict(total)}; ops with a densified or failed sample: "
        f"{len(bad)}{': ' + ', '.join(bad) if bad else ''}"
    )


# ---------------------------------------------------------------------- the conversions and the rule
def _hybrid(x, fill, dense_dim=1, layout=torch.sparse_coo, p=0.5, seed=0):
    """``x`` with about ``p`` of its slices (over the sparse dims) replaced by the fill, as a SparseTensor."""
    g = torch.Generator().manual_seed(seed)
    xm = x.clone()
    if fill is not sparsefill.indefinite:
        xm[torch.rand(x.shape[: x.dim() - dense_dim], generator=g) < p] = torch.as_tensor(
            fill, dtype=x.dtype
        )
        return sparsefill.to_sparse(xm, fill_value=fill, dense_dim=dense_dim, layout=layout), xm
    keep = torch.rand(x.shape[: x.dim() - dense_dim], generator=g) >= p
    A = sparsefill.sparse_coo_tensor(
        keep.nonzero().T, x[keep], x.shape, fill_value=sparsefill.indefinite
    )
    return (A.to_sparse_csr() if layout is torch.sparse_csr else A), xm


def _same(T, ref, spec=None):
    """``T`` stands for ``ref`` (an indefinite ``T``: specified exactly where ``spec`` is, equal there)."""
    if not T._indefinite:
        torch.testing.assert_close(T.to_dense(), ref, equal_nan=True)
        return
    d0, d1 = T.to_dense(fill_value=0), T.to_dense(fill_value=1)
    assert torch.equal((d0 != 0) | (d1 != 1), spec)
    torch.testing.assert_close(d0[spec], ref[spec], equal_nan=True)


FILL_CASES = {  # name -> (fill of a (3, 2, 4, 3) hybrid with 2 dense dims, uniform along the first / both dense dims)
    "scalar": (2.5, (True, True)),
    "uniform": (torch.tensor([1.0, 2.0, 3.0]), (True, False)),
    "nan": (float("nan"), (True, True)),
    "array": (torch.arange(12.0).reshape(4, 3), (False, False)),
    "array-nan-inf": (
        torch.tensor([[float("nan"), 1, float("inf")], [float("nan"), 2, float("inf")]] * 2),
        (False, False),
    ),
    "indefinite": (sparsefill.indefinite, (True, True)),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", list(FILL_CASES))
@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_finer_and_coarser_are_exact(case, layout, dtype):
    """``finer``/``coarser`` stand for the same tensor; ``finer`` stores ``nse * |K|`` elements where the fill is
    uniform along K and more where it varies; ``coarser`` back gives one slice per stored prefix."""
    fill, uniform = FILL_CASES[case]
    fill = fill.to(dtype) if isinstance(fill, torch.Tensor) else fill
    x = torch.randn(3, 2, 4, 3, dtype=dtype)
    A, xm = _hybrid(x, fill, dense_dim=2, layout=layout)
    spec = (
        ((A.to_dense(fill_value=0) != 0) | (A.to_dense(fill_value=1) != 1))
        if A._indefinite
        else None
    )
    assert (uniform_along(A, 1), uniform_along(A, 2)) == uniform
    for nd, k, nK in ((1, 1, 4), (0, 2, 12)):
        F = finer(A, nd)
        assert F.dense_dim() == nd and F.sparse_layout is torch.sparse_coo and F.is_coalesced()
        _same(F, xm, spec)
        assert F._nse() == A._nse() * nK if uniform[k - 1] else F._nse() > A._nse() * nK
        for back in range(nd, 3):
            C = coarser(F, back)
            assert C.dense_dim() == back and C.is_coalesced()
            _same(C, xm, spec)
            assert C._nse() == A._nse() * (12, 4, 1)[back] or not uniform[k - 1]
    assert finer(A, 2) is A and coarser(A, 1) is A


def test_finer_stores_the_varying_fill_exactly():
    """``finer``'s equation: the fill's first slice along K is the new fill, and the fill's other values are
    stored at every unspecified slice (NaN equal to NaN: not stored where it is the first slice's)."""
    H = sparsefill.sparse_coo_tensor(
        [[1]], [[5.0, 6.0, 7.0]], (3, 3), fill_value=torch.tensor([0.0, 1.0, 0.0])
    )
    F = finer(H, 0)
    assert F.fill_value().item() == 0.0
    assert F.indices().tolist() == [[0, 1, 1, 1, 2], [1, 0, 1, 2, 1]] and F.values().tolist() == [
        1.0,
        5.0,
        6.0,
        7.0,
        1.0,
    ]
    N = sparsefill.sparse_coo_tensor(
        [[0]], [[5.0, 6.0]], (2, 2), fill_value=torch.tensor([float("nan"), float("nan")])
    )
    assert finer(N, 0)._nse() == 2  # uniform: only the stored slice's elements


def test_coarser_of_a_partly_stored_indefinite_slice_is_refused():
    I = sparsefill.sparse_coo_tensor(
        [[0, 0, 1], [0, 1, 0]], [1.0, 2.0, 3.0], (2, 2), fill_value=sparsefill.indefinite
    )
    assert (
        coarser(I, 1) is None
    )  # row 1 is half specified: a hybrid slice is all specified or all masked out
    W = sparsefill.sparse_coo_tensor(
        [[0, 0], [0, 1]], [1.0, 2.0], (2, 2), fill_value=sparsefill.indefinite
    )
    C = coarser(W, 1)
    assert C._indefinite and C.indices().tolist() == [[0]] and C.values().tolist() == [[1.0, 2.0]]


def test_coarser_pads_leading_dims_and_takes_uncoalesced_input():
    U = sparsefill.sparse_coo_tensor(
        [[2, 0, 2]], [1.0, 2.0, 3.0], (3,), fill_value=9.0
    )  # uncoalesced: 2 twice
    C = coarser(U, 2)
    assert C.shape == (1, 3) and C.dense_dim() == 2 and C.values().tolist() == [[[2.0, 9.0, 4.0]]]
    torch.testing.assert_close(C.to_dense()[0], U.to_dense())
    E = sparsefill.sparse_coo_tensor(
        torch.zeros(2, 0, dtype=torch.long), torch.zeros(0), (0, 3), fill_value=1.0
    )
    assert coarser(E, 1)._nse() == 0 and finer(coarser(E, 1), 0).shape == (0, 3)


def test_merge_dense_dim_rule():
    h = torch.randn(4, 3)
    scalar = sparsefill.to_sparse(h, fill_value=0.0, dense_dim=1)
    varying = sparsefill.to_sparse(h, fill_value=torch.tensor([0.0, 1.0, 2.0]), dense_dim=1)
    coo = sparsefill.to_sparse(h, fill_value=0.0)
    masked = sparsefill.sparse_coo_tensor(
        [[0], [1]], [1.0], (4, 3), fill_value=sparsefill.indefinite
    )
    column = sparsefill.sparse_coo_tensor([[0], [0]], [1.0], (4, 1), fill_value=0.0)
    assert merge_dense_dim([scalar, coo]) == 0  # the finest split: the uniform fill stores nothing
    assert (
        merge_dense_dim([varying, coo]) == 1
    )  # the coarser: the all-sparse operand's slices are stored
    assert (
        merge_dense_dim([varying, masked]) == 0
    )  # a masked operand cannot be coarsened: the fill is stored
    assert merge_dense_dim([varying, column]) == 1  # free: the size-1 dim becomes dense
    three = sparsefill.to_sparse(torch.randn(2, 4, 3), fill_value=0.0, dense_dim=2)
    assert (
        merge_dense_dim([three, varying, coo]) == 1 and merge_dense_dim([three, scalar, coo]) == 0
    )


# ---------------------------------------------------------------------- through the ops
def _pair(op, A, B, xa, xb):
    with sparsefill.densify_policy("raise"):
        out = op(A, B)
    assert isinstance(out, SparseTensor)
    torch.testing.assert_close(out.to_dense(), op(xa, xb), equal_nan=True)
    return out


def test_array_fill_beside_all_sparse_is_native():
    """A hybrid with an array fill beside an all-sparse COO of the same shape (``A + B``, ``A * B``), and a (5, 1)
    hybrid broadcast against a (5,) COO: the pointwise rule takes them (``explain``), no densify fallback."""
    x = torch.randn(5, 3)
    A, xa = _hybrid(x, torch.tensor([1.0, 2.0, 3.0]))
    B, xb = _hybrid(torch.randn(5, 3), 0.5, dense_dim=0, seed=1)
    for op in (torch.add, torch.mul):
        assert (
            sparsefill.explain(op, A, B).stage == "pointwise"
            and sparsefill.explain(op, B, A).stage == "pointwise"
        )
        out = _pair(op, A, B, xa, xb)
        assert (
            out.dense_dim() == 1 and out._nse() <= A._nse() + B._nse()
        )  # the varying fill: B's rows stored
        _pair(op, B, A, xb, xa)
    A1, xa1 = _hybrid(torch.randn(5, 1), torch.tensor([0.0]))
    B1, xb1 = _hybrid(torch.randn(5), 0.0, dense_dim=0)
    assert (
        _pair(torch.add, A1, B1, xa1, xb1).shape == (5, 5)
        and _pair(torch.sub, B1, A1, xb1, xa1).dense_dim() == 0
    )


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_integer_and_bool(dtype):
    x = torch.randint(-3, 4, (4, 3)).to(dtype)
    A, xa = _hybrid(x, torch.tensor([1, 0, 1]).to(dtype))
    B, xb = _hybrid(
        torch.randint(-3, 4, (4, 3)).to(dtype), 1 if dtype is torch.bool else 2, dense_dim=0, seed=1
    )
    ops = [torch.eq, torch.logical_xor, torch.maximum, torch.bitwise_and] + (
        [] if dtype is torch.bool else [torch.add, torch.mul, torch.sub]
    )
    for op in ops:
        _pair(op, A, B, xa, xb)
        _pair(op, B, A, xb, xa)
        _pair(op, B.to_sparse_csr(), A, xb, xa)


def test_three_operands_of_three_splits():
    D2, x2 = _hybrid(torch.randn(4, 3, 2), torch.tensor(1.5), dense_dim=2)
    D1, x1 = _hybrid(
        torch.randn(4, 3, 2),
        torch.tensor([[0.5, 1.0], [2.0, 3.0], [4.0, 5.0]])[0],
        dense_dim=1,
        seed=1,
    )
    D0, x0 = _hybrid(torch.randn(4, 3, 2), 0.0, dense_dim=0, seed=2)
    with sparsefill.densify_policy("raise"):
        out = torch.addcmul(D2, D1, D0, value=0.5)
        torch.testing.assert_close(out.to_dense(), torch.addcmul(x2, x1, x0, value=0.5))
        cond, xc = _hybrid(torch.rand(4, 3, 2) < 0.5, False, dense_dim=0, seed=3)
        torch.testing.assert_close(torch.where(cond, D1, D0).to_dense(), torch.where(xc, x1, x0))


@pytest.mark.parametrize("target", ["hybrid", "coo", "csr"])
def test_in_place_keeps_the_targets_split(target):
    """``A.add_(B)``: ``A`` keeps its dense dims and layout (the other operand is converted to them, storing a
    varying fill's values where ``A`` is finer)."""
    hybrid = _hybrid(torch.randn(4, 3), torch.tensor([1.0, 2.0, 3.0]))
    sparse = _hybrid(
        torch.randn(4, 3),
        0.5,
        dense_dim=0,
        seed=1,
        layout=torch.sparse_csr if target == "csr" else torch.sparse_coo,
    )
    (A, xa), (B, xb) = (hybrid, sparse) if target == "hybrid" else (sparse, hybrid)
    dd, layout = A.dense_dim(), A.sparse_layout
    with sparsefill.densify_policy("raise"):
        assert A.mul_(B) is A and A.add_(B) is A
    assert A.dense_dim() == dd and A.sparse_layout is layout
    torch.testing.assert_close(A.to_dense(), xa * xb + xb)
    out = sparsefill.zeros_like(B)
    with sparsefill.densify_policy("raise"):
        torch.add(A, B, out=out)
    torch.testing.assert_close(out.to_dense(), xa * xb + 2 * xb)


def test_a_varying_fill_stored_past_the_quiet_limit_passes_the_gate(monkeypatch):
    """Where ``finer`` must store a varying fill (an in-place target finer than a hybrid operand with a varying
    fill), past ``SPECIFY_QUIET_ELEMENTS`` elements the densify policy applies."""
    import sparsefill._tensor.policy as policy

    monkeypatch.setattr(policy, "SPECIFY_QUIET_ELEMENTS", 2)
    A, xa = _hybrid(torch.randn(8, 3), 0.5, dense_dim=0)
    B, xb = _hybrid(torch.randn(8, 3), torch.tensor([1.0, 2.0, 3.0]), seed=1)
    with pytest.warns(sparsefill.DensifyWarning, match="fill varying"):
        A.add_(B)
    torch.testing.assert_close(A.to_dense(), xa + xb)
    with (
        sparsefill.densify_policy("raise"),
        pytest.raises(sparsefill.DensifyError, match="fill varying"),
    ):
        A.add_(B)


def test_in_place_with_a_partly_masked_slice_is_refused():
    """``A.add_(I)``: ``I`` masked out in part of a slice of ``A``'s dense dims cannot be stored in ``A``'s form:
    ValueError naming the dims, ``A`` unchanged; ``A + I`` (out of place) merges at the finer split."""
    A, xa = _hybrid(torch.randn(2, 2), torch.tensor([0.0, 1.0]))
    I = sparsefill.sparse_coo_tensor(
        [[0, 0, 1], [0, 1, 0]], [1.0, 2.0, 3.0], (2, 2), fill_value=sparsefill.indefinite
    )
    with pytest.raises(ValueError, match="1 dense dims.*partly specified"):
        A.add_(I)
    torch.testing.assert_close(A.to_dense(), xa)
    with sparsefill.densify_policy("raise"):
        out = A + I
    spec = torch.tensor([[True, True], [True, False]])
    assert out._indefinite and out.dense_dim() == 0
    _same(out, xa + I.to_dense(fill_value=0), spec)


@pytest.mark.parametrize("fill", ["scalar", "array", "indefinite"])
def test_equal_and_copy_across_splits(fill):
    """``torch.equal`` and ``copy_`` between SparseTensors split differently: at one split, exactly, no fallback
    (``copy_``: the target keeps its dense dims; ``equal`` of a masked tensor: same pattern and values)."""
    x = torch.randn(5, 3)
    x[1] = torch.tensor([1.0, 2.0, 3.0])
    f = {
        "scalar": torch.tensor(2.0),
        "array": torch.tensor([1.0, 2.0, 3.0]),
        "indefinite": sparsefill.indefinite,
    }[fill]
    H, xh = _hybrid(x, f)
    C = finer(H, 0)
    with sparsefill.densify_policy("raise"):
        assert torch.equal(H, C) and torch.equal(C, H)
        assert not torch.equal(H, C * 2) and not torch.equal(C * 2, H)
        for dst, src in ((H.clone(), C), (C.clone(), H)):
            dd = dst.dense_dim()
            dst.copy_(src * 2)
            assert dst.dense_dim() == dd
            _same(
                dst, 2 * xh, (dst.to_dense(fill_value=0) != 0) | (dst.to_dense(fill_value=1) != 1)
            )


# ---------------------------------------------------------------------- gradients, comparisons, joins, to_sparse
def _x_for(pair, g, dtype=torch.float64):
    """A tensor both kinds of ``pair`` take (a hybrid CSR: 3-d; a CSR: 2-d)."""
    return torch.randn((4, 5, 3) if "hybrid-csr" in pair else (4, 3), dtype=dtype, generator=g)


def _fill_name(fill, kind):
    """``Operand``'s fill name: ``indefinite`` makes both operands masked."""
    return (
        ("indefinite-hybrid" if KINDS[kind][1] else "indefinite-sparse")
        if fill == "indefinite"
        else fill
    )


def _sparse_w(shape, dtype, g):
    """An upstream weight ``W`` (half its elements 0.25) and ``W`` as an all-sparse SparseTensor of fill 0.25."""
    W = torch.randn(shape, dtype=dtype, generator=g)
    W[torch.rand(shape, generator=g) < 0.5] = 0.25
    return W, sparsefill.to_sparse(W, fill_value=0.25)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("fill", ["uniform", "array", "nan", "inf"])
@pytest.mark.parametrize("pair", PAIRS, ids="-".join)
def test_leaf_gradient_of_another_split_stays_sparse(pair, fill, dtype):
    """``A * B`` with ``A`` a SparseTensor leaf and ``B`` split differently, a sparse upstream gradient: the
    gradient reaching ``A`` has the merged split (finer or coarser than ``A``'s); ``A.grad`` is a SparseTensor
    of ``A``'s layout and dense dims equal to the dense gradient, with no densifying (``leaf_grad``:
    ``_tensor.dense_dims.finer``/``coarser``); the same through the constructor's ``values``/``fill`` (``grad_parts``)."""
    g = torch.Generator().manual_seed(11)
    x, y = _x_for(pair, g, dtype), _x_for(pair, g, dtype)
    P, Q = Operand(x, pair[0], fill, g), Operand(y, pair[1], fill, g)
    (vp, fp), (vq, fq) = P.leaves(), Q.leaves()
    A = P.sparse(vp.detach(), fp.detach()).requires_grad_()
    B = Q.sparse(vq.detach(), fq.detach())
    W, Ws = _sparse_w(x.shape, dtype, g)
    with sparsefill.densify_policy("raise", dense_by_nature="raise"):
        (A * B * Ws).sum().backward()
        (P.sparse(vp, fp) * B * Ws).sum().backward()
    assert type(A.grad) is SparseTensor and A.grad.sparse_layout is A.sparse_layout
    assert A.grad.shape == A.shape and A.grad.dense_dim() == A.dense_dim()
    tol = dict(rtol=1e-4, atol=1e-4) if dtype is torch.float32 else {}
    torch.testing.assert_close(
        A.grad.to_dense(), W * Q.dense(vq, fq).detach(), equal_nan=True, **tol
    )
    v2, f2 = vp.detach().clone().requires_grad_(), fp.detach().clone().requires_grad_()
    (P.dense(v2, f2) * Q.dense(vq, fq).detach() * W).sum().backward()
    torch.testing.assert_close(vp.grad, v2.grad, equal_nan=True, **tol)
    torch.testing.assert_close(fp.grad, f2.grad, equal_nan=True, **tol)


@pytest.mark.parametrize("fill", ["scalar", "uniform", "varying", "nan", "inf", "indefinite"])
@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
@pytest.mark.parametrize("direction", ["finer", "coarser"])
def test_leaf_grad_converts_the_split_exactly(direction, layout, fill):
    """``leaf_grad(G, P)`` for ``G`` with more dense dims than ``P`` (``finer``: was densified) or fewer
    (``coarser``): a SparseTensor of ``P``'s layout and dense dims, ``G``'s dense tensor (masked-out elements of
    an indefinite ``G``: 0 for a defined ``P``), no densifying; an indefinite ``P`` beside an indefinite ``G``
    stays masked where ``finer`` keeps it so."""
    from sparsefill._autograd.functions import leaf_grad

    f = {
        "scalar": 1.5,
        "uniform": torch.tensor([2.0, 2.0, 2.0]),
        "varying": torch.tensor([1.0, 2.0, 3.0]),
        "nan": float("nan"),
        "inf": float("inf"),
        "indefinite": sparsefill.indefinite,
    }[fill]
    gd, pd = (1, 0) if direction == "finer" else (0, 1)
    if direction == "coarser" and isinstance(f, torch.Tensor):
        f = f[0].item()  # (an all-sparse G: a scalar fill)
    f = f.double() if isinstance(f, torch.Tensor) else f
    shape = (4, 3) if direction == "finer" else (4, 5, 3)  # (a CSR leaf: unbatched, or hybrid)
    G, xg = _hybrid(torch.randn(shape, dtype=torch.float64), f, dense_dim=gd, seed=1)
    for pfill in (0.5, sparsefill.indefinite):
        P = _hybrid(
            torch.randn(shape, dtype=torch.float64), pfill, dense_dim=pd, layout=layout, seed=2
        )[0]
        with sparsefill.densify_policy("raise", dense_by_nature="raise"):
            out = leaf_grad(G, P)
        assert type(out) is SparseTensor and out.sparse_layout is layout and out.dense_dim() == pd
        assert out.shape == P.shape
        if G._indefinite:
            assert out._indefinite == (P._indefinite and direction == "finer")
            torch.testing.assert_close(out.to_dense(fill_value=0), G.to_dense(fill_value=0))
        else:
            torch.testing.assert_close(out.to_dense(), xg, equal_nan=True)
    E = _hybrid(torch.zeros((0,) + shape[1:]), 1.0, dense_dim=gd)[0]  # 0-size
    P0 = _hybrid(torch.zeros((0,) + shape[1:]), 0.0, dense_dim=pd, layout=layout)[0]
    with sparsefill.densify_policy("raise", dense_by_nature="raise"):
        out = leaf_grad(E, P0)
    assert out.shape == P0.shape and out.dense_dim() == pd and out.sparse_layout is layout


@pytest.mark.parametrize("fill", ["uniform", "array", "nan", "inf"])
@pytest.mark.parametrize("pair", PAIRS, ids="-".join)
def test_allclose_and_dist_across_splits(pair, fill):
    """``torch.allclose`` (rtol/atol/equal_nan) and ``torch.dist`` (p = 2, 1, 0, inf, 3.5) of operands split
    differently equal the dense results with no densifying; ``dist``'s gradients of values and fill too."""
    g = torch.Generator().manual_seed(12)
    x = _x_for(pair, g)
    P, Q = Operand(x, pair[0], fill, g), Operand(x, pair[1], fill, g)
    (vp, fp), (vq, fq) = P.leaves(), Q.leaves()
    A, B = P.sparse(vp.detach(), fp.detach()), Q.sparse(vq.detach(), fq.detach())
    same = A.to_sparse(B.sparse_layout, dense_dim=B.dense_dim())  # the same tensor at B's split
    xa, xb = A.to_dense(), B.to_dense()
    with sparsefill.densify_policy("raise", dense_by_nature="raise"):
        for a, b, da, db in (
            (A, B, xa, xb),
            (B, A, xb, xa),
            (A, same, xa, xa),
            (same, A, xa, xa),
            (A, same * (1 + 1e-3), xa, xa * (1 + 1e-3)),
        ):
            for kw in ({}, dict(rtol=1e-2), dict(atol=1e-2, equal_nan=True), dict(equal_nan=True)):
                assert torch.allclose(a, b, **kw) == torch.allclose(da, db, **kw), (kw, fill)
            for p in (2, 1, 0, float("inf"), 3.5):
                torch.testing.assert_close(
                    torch.dist(a, b, p), torch.dist(da, db, p), equal_nan=True
                )
        assert torch.allclose(A, same) == (fill != "nan") and torch.allclose(
            A, same, equal_nan=True
        )
        for p in (2, 1, float("inf")):
            for t in (vp, fp, vq, fq):
                t.grad = None
            torch.dist(P.sparse(vp, fp), Q.sparse(vq, fq), p).backward()
            got = [t.grad for t in (vp, fp, vq, fq)]
            leaves = [t.detach().clone().requires_grad_() for t in (vp, fp, vq, fq)]
            torch.dist(P.dense(*leaves[:2]), Q.dense(*leaves[2:]), p).backward()
            for gt, t in zip(got, leaves):
                torch.testing.assert_close(gt, t.grad, equal_nan=True)


def test_allclose_and_dist_of_masked_and_other_dtypes():
    """Masked operands (an indefinite fill): close when both are masked at the same elements with close values
    (at one split, as ``equal``); ``dist`` is the norm over the elements both specify.  int64 and bool
    ``allclose``; torch's errors for mixed dtypes and an integer ``dist``; 0-size and 0-d operands."""
    I = sparsefill.sparse_coo_tensor(
        [[0, 2]], [[1.0, 2.0], [3.0, 4.0]], (3, 2), fill_value=sparsefill.indefinite
    )
    F = finer(I, 0)
    J = sparsefill.sparse_coo_tensor(
        [[0, 1]], [[1.0, 4.0], [3.0, 4.0]], (3, 2), fill_value=sparsefill.indefinite
    )
    D = sparsefill.to_sparse(I.to_dense(fill_value=0.0), fill_value=0.0)
    with sparsefill.densify_policy("raise", dense_by_nature="raise"):
        assert torch.allclose(I, F) and torch.allclose(F, I) and torch.allclose(I, F * (1 + 1e-7))
        assert not torch.allclose(I, F * 1.1) and torch.allclose(I, F * 1.1, rtol=0.2)
        assert not torch.allclose(I, J) and not torch.allclose(F, J) and not torch.allclose(I, D)
        assert torch.allclose(I, I[None].expand(2, 3, 2))  # (broadcast)
        assert torch.dist(I, F).item() == 0.0
        torch.testing.assert_close(torch.dist(I, D * 2, 1), torch.tensor(10.0))  # (rows 0 and 2)
        torch.testing.assert_close(
            torch.dist(F, J, float("inf")), torch.tensor(2.0)
        )  # (row 0 only)
        xi = torch.tensor([[1, 0, 2], [0, 0, 3]])
        for dtype in (torch.int64, torch.bool):
            Hi = sparsefill.to_sparse(
                xi.to(dtype), fill_value=torch.tensor([0, 0, 1]).to(dtype), dense_dim=1
            )
            Ci = sparsefill.to_sparse(xi.to(dtype), fill_value=0)
            assert torch.allclose(Hi, Ci) and torch.allclose(Ci, Hi)
            assert not torch.allclose(
                Hi, sparsefill.to_sparse(torch.zeros(2, 3, dtype=dtype), fill_value=0)
            )
        E = sparsefill.to_sparse(torch.zeros(0, 3), fill_value=1.0, dense_dim=1)
        assert torch.allclose(E, finer(E, 0)) and torch.dist(E, finer(E, 0)).item() == 0.0
        Z = sparsefill.to_sparse(torch.tensor(2.0), fill_value=1.0)
        assert torch.allclose(Z, Z) and torch.dist(Z, Z * 2).item() == 2.0
    A64 = sparsefill.to_sparse(torch.ones(2, 3, dtype=torch.float64), fill_value=0.0, dense_dim=1)
    with pytest.raises(RuntimeError, match="did not match"):
        torch.allclose(A64, finer(A64, 0).float())
    with pytest.raises(RuntimeError, match="floating point or complex"):
        torch.dist(sparsefill.to_sparse(xi), sparsefill.to_sparse(xi, dense_dim=1))
    torch.testing.assert_close(
        torch.dist(A64, finer(A64, 0).float() * 2),  # (dist promotes)
        torch.dist(torch.ones(2, 3, dtype=torch.float64), torch.full((2, 3), 2.0)),
    )


@pytest.mark.parametrize("fill", ["uniform", "array", "nan", "indefinite"])
@pytest.mark.parametrize("pair", PAIRS, ids="-".join)
def test_cat_and_stack_across_splits(pair, fill):
    """``torch.cat``/``torch.stack`` of SparseTensors split differently, along every dim: brought to one split
    (``_tensor.dense_dims.one_split``), no densifying; equal to the dense result (masked operands: specified where they
    are), and the gradients of values and fill equal the dense ones (a sparse upstream gradient)."""
    g = torch.Generator().manual_seed(13)
    x, y = _x_for(pair, g), _x_for(pair, g)
    P, Q = (
        Operand(x, pair[0], _fill_name(fill, pair[0]), g),
        Operand(y, pair[1], _fill_name(fill, pair[1]), g),
    )
    for join, dims in ((torch.cat, range(-1, x.dim())), (torch.stack, range(-1, x.dim() + 1))):
        for dim in dims:
            (vp, fp), (vq, fq) = P.leaves(), Q.leaves()
            ref = join([P.dense(vp, fp), Q.dense(vq, fq)], dim)
            with sparsefill.densify_policy("raise", dense_by_nature="raise"):
                out = join([P.sparse(vp, fp), Q.sparse(vq, fq)], dim)
                assert isinstance(out, SparseTensor) and out.shape == ref.shape
                if fill == "indefinite":
                    spec = join([P.specified(), Q.specified()], dim)
                    _same(out.detach(), ref.detach(), spec)
                    continue
                W, Ws = _sparse_w(ref.shape, ref.dtype, g)
                (out * Ws).sum().backward()
            torch.testing.assert_close(out.detach().to_dense(), ref.detach(), equal_nan=True)
            got = [t.grad for t in (vp, fp, vq, fq)]
            leaves = [t.detach().clone().requires_grad_() for t in (vp, fp, vq, fq)]
            (join([P.dense(*leaves[:2]), Q.dense(*leaves[2:])], dim) * W).sum().backward()
            for gt, t in zip(got, leaves):
                torch.testing.assert_close(gt, t.grad, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", list(FILL_CASES))
@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_to_sparse_resplits_exactly(layout, case, dtype):
    """``A.to_sparse(layout, dense_dim=n)`` / ``to_sparse_csr(dense_dim=n)`` / ``A.to_sparse(sparse_dim)`` with the
    fill kept: the same tensor at the new split (``_tensor.dense_dims.resplit``), no dense temporary (the densify gate
    raises), no ``fill_value=`` asked of an array fill; the stored pattern kept (nothing pruned)."""
    fill, uniform = FILL_CASES[case]
    fill = fill.to(dtype) if isinstance(fill, torch.Tensor) else fill
    x = torch.randn(3, 2, 4, 3, dtype=dtype)
    A, xm = _hybrid(x, fill, dense_dim=2, layout=layout)
    spec = (
        ((A.to_dense(fill_value=0) != 0) | (A.to_dense(fill_value=1) != 1))
        if A._indefinite
        else None
    )
    with sparsefill.densify_policy("raise", dense_by_nature="raise"):
        for nd in range(5):
            for to in (torch.sparse_coo, torch.sparse_csr):
                if to is torch.sparse_csr and nd > 2:
                    with pytest.raises(ValueError, match="at least 2 sparse dims"):
                        A.to_sparse(to, dense_dim=nd)
                    continue
                if A._indefinite and nd > 2 and coarser(A, nd) is None:
                    with pytest.raises(ValueError, match=f"dense_dim={nd}: .*partly specified"):
                        A.to_sparse(to, dense_dim=nd)
                    continue
                try:
                    R = (
                        A.to_sparse_csr(dense_dim=nd)
                        if to is torch.sparse_csr
                        else A.to_sparse(to, dense_dim=nd)
                    )
                except (
                    ValueError
                ) as e:  # a masked tensor whose batches store different numbers: no batched CSR
                    assert A._indefinite and to is torch.sparse_csr and nd < 2, e
                    assert "same nse in every batch" in str(e)
                    continue
                assert (
                    R.dense_dim() == nd and R.sparse_layout is to and R._indefinite == A._indefinite
                )
                _same(R, xm, spec)
                if (
                    to is torch.sparse_coo and nd < 2 and uniform[1 - nd]
                ):  # (uniform along the new sparse dims)
                    assert R._nse() == A._nse() * (12, 4)[nd]
        if coarser(A, 3) is not None:
            R = A.to_sparse(1)  # (torch's int form: sparse_dim)
            assert R.dense_dim() == 3 and R.sparse_layout is torch.sparse_coo
            _same(R, xm, spec)
    with pytest.raises(ValueError, match=r"dense_dim must be an int in \[0, 4\]"):
        A.to_sparse(dense_dim=5)


def test_to_sparse_resplit_gradients_and_other_dtypes():
    """Gradients of values and fill through ``to_sparse(dense_dim=...)`` both ways equal the dense ones (a sparse
    upstream gradient, no densifying); int64 and bool; an uncoalesced COO; a masked tensor with a partly specified
    slice: ValueError, the tensor unchanged."""
    g = torch.Generator().manual_seed(14)
    for kind, nd, fill in (
        ("hybrid", 0, "array"),
        ("coo", 1, "uniform"),
        ("hybrid-csr", 0, "nan"),
        ("coo", 2, "inf"),
        ("hybrid", 2, "array"),
    ):
        x = torch.randn(
            (4, 5, 3) if kind == "hybrid-csr" else (4, 3), dtype=torch.float64, generator=g
        )
        P = Operand(x, kind, fill, g)
        v, f = P.leaves()
        W, Ws = _sparse_w(x.shape, x.dtype, g)
        with sparsefill.densify_policy("raise", dense_by_nature="raise"):
            R = P.sparse(v, f).to_sparse(dense_dim=nd)
            assert R.dense_dim() == nd
            (R * Ws).sum().backward()
        v2, f2 = v.detach().clone().requires_grad_(), f.detach().clone().requires_grad_()
        (P.dense(v2, f2) * W).sum().backward()
        torch.testing.assert_close(v.grad, v2.grad, equal_nan=True)
        torch.testing.assert_close(f.grad, f2.grad, equal_nan=True)
    xi = torch.tensor([[1, 0, 2], [0, 1, 1], [3, 3, 3]])
    for dtype in (torch.int64, torch.bool):
        H = sparsefill.to_sparse(
            xi.to(dtype), fill_value=torch.tensor([0, 1, 1]).to(dtype), dense_dim=1
        )
        with sparsefill.densify_policy("raise", dense_by_nature="raise"):
            assert torch.equal(H.to_sparse(dense_dim=0).to_dense(), xi.to(dtype))
            back = H.to_sparse(dense_dim=0).to_sparse_csr().to_sparse(torch.sparse_coo, dense_dim=1)
            assert back.dense_dim() == 1 and torch.equal(back.to_dense(), xi.to(dtype))
    U = sparsefill.sparse_coo_tensor(
        [[2, 0, 2], [1, 1, 1]], [1.0, 2.0, 3.0], (3, 2), fill_value=9.0
    )  # uncoalesced
    with sparsefill.densify_policy("raise", dense_by_nature="raise"):
        torch.testing.assert_close(U.to_sparse(dense_dim=1).to_dense(), U.to_dense())
        torch.testing.assert_close(U.to_sparse(dense_dim=2).to_dense(), U.to_dense())
    I = sparsefill.sparse_coo_tensor(
        [[0, 0, 1], [0, 1, 0]], [1.0, 2.0, 3.0], (2, 2), fill_value=sparsefill.indefinite
    )
    with pytest.raises(ValueError, match="dense_dim=1: .*partly specified"):
        I.to_sparse(dense_dim=1)
    assert I.dense_dim() == 0 and I._nse() == 3 and I.values().tolist() == [1.0, 2.0, 3.0]
