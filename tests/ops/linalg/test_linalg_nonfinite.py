"""Sparse products with inf/NaN in the dense operand or the upstream gradient are the dense products
(ops/linalg/product.py, ops/linalg/backward.py): nothing is skipped, no ``inf - inf`` is introduced::

    op(A, X) == op(A.to_dense(), X)      and so are the gradients of values, fill and X

where ``X`` holds ``inf``, ``-inf`` and NaN at contracted indices that are stored in some rows of ``A`` and
unspecified in others (``0 * inf`` is NaN in the dense product), and/or the upstream gradient ``G`` holds
``inf`` and NaN; for COO, CSR and hybrid (scalar and array fills) operands, fills 0, 2.5, NaN, +-inf, and
indefinite (masked: the unspecified elements form no products, compared with an explicit masked sum);
float64 and float32; the routed backward (``SparseMMBackward``), torch's formulas (only ``X`` needs a
gradient), and torch.compile (aot_eager) against eager.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import sparsefill
from tests.ops.linalg.test_backward_sparse import _routed

NAN, INF = float("nan"), float("inf")
COO, CSR = torch.sparse_coo, torch.sparse_csr


# name: (A shape, X shape, fn, the dim of X contracted with A, A's contracted dim)
OPS = {
    "A@X": ((6, 5), (5, 3), lambda A, X: A @ X, -2, -1),
    "X@A": ((6, 5), (4, 6), lambda A, X: X @ A, -1, -2),
    "mm": ((6, 5), (5, 3), torch.mm, -2, -1),
    "mv": ((6, 5), (5,), torch.mv, 0, -1),
    "x@A": ((6, 5), (6,), lambda A, x: x @ A, 0, -2),
    "A2@X3": ((6, 5), (2, 5, 3), torch.matmul, -2, -1),
    "bmm": ((2, 6, 5), (2, 5, 3), torch.bmm, -2, -1),
    "X3@A3": ((2, 6, 5), (2, 4, 6), lambda A, X: X @ A, -1, -2),
    "addmm": (
        (6, 5),
        (5, 3),
        lambda A, X: torch.addmm(torch.ones(6, 3, dtype=X.dtype), A, X, beta=0.5, alpha=2),
        -2,
        -1,
    ),
    "addmm dense@sparse": (
        (6, 5),
        (3, 6),
        lambda A, X: torch.addmm(torch.ones(5, dtype=X.dtype), X, A),
        -1,
        -2,
    ),
    "linear weight": (
        (6, 5),
        (2, 4, 5),
        lambda A, x: F.linear(x, A, torch.arange(6, dtype=x.dtype)),
        -1,
        -1,
    ),
    "linear input": ((6, 5), (3, 5), lambda A, W: F.linear(A, W), -1, -1),
    "einsum ij,jk": ((6, 5), (5, 3), lambda A, X: torch.einsum("ij,jk->ik", A, X), -2, -1),
    "einsum ij,kj->ki": ((6, 5), (4, 5), lambda A, X: torch.einsum("ij,kj->ki", A, X), -1, -1),
    "einsum bij,bjk": (
        (2, 6, 5),
        (2, 5, 3),
        lambda A, X: torch.einsum("bij,bjk->bik", A, X),
        -2,
        -1,
    ),
}


def _pattern(shape, nse_per_row, acdim, g):
    """A pattern over ``shape``'s sparse dims (all of them here, or all but the last for hybrid) where
    contracted index 0 and 1 are stored in some rows and unspecified in others (asserted)."""
    keys = []
    per = shape[-2] * shape[-1]
    nb = shape[0] if len(shape) == 3 else 1
    for b in range(nb):
        keys.append(b * per + torch.randperm(per, generator=g)[: nse_per_row * shape[-2]])
    keys = torch.cat(keys).sort().values
    idx = torch.stack(torch.unravel_index(keys, shape))
    c = idx[acdim % len(shape)]
    for k in (0, 1):
        stored = int((c == k).sum())
        other = shape[-1] if acdim % len(shape) == len(shape) - 2 else shape[-2]
        assert 0 < stored < nb * other, "the contracted index must be stored in some rows only"
    return idx


class Case:
    def __init__(self, op, layout, fill, dtype=torch.float64, x_bad=True, g_bad=False, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.ashape, xshape, self.fn, xc, ac = OPS[op]
        self.layout, self.dtype, self.g_bad = layout, dtype, g_bad
        self.hybrid = layout == "hybrid"
        while True:
            try:
                self.idx = _pattern(self.ashape, 2, ac, g)
                break
            except AssertionError:
                continue
        if (
            self.hybrid
        ):  # the last dim dense: the stored "rows" are whole slices; keep the distinct sparse keys
            sd = len(self.ashape) - 1
            self.idx = torch.unique(self.idx[:sd], dim=1)
        D = self.ashape[len(self.ashape) - 1 :] if self.hybrid else ()
        self.values = torch.randn((self.idx.shape[1],) + tuple(D), dtype=dtype, generator=g)
        self.indefinite = fill == "indefinite"
        if self.indefinite:
            self.fill = None
        elif isinstance(
            fill, str
        ):  # "array" / "array_inf": an array fill over the dense dim (hybrid)
            self.fill = torch.randn(D, dtype=dtype, generator=g)
            if fill == "array_inf":
                self.fill[1] = INF
        else:
            self.fill = torch.tensor(fill, dtype=dtype)
        X = torch.randn(xshape, dtype=dtype, generator=g)
        if x_bad:
            Xm = X.movedim(xc, 0)  # a view: (contracted, ...)
            X = Xm.contiguous()
            X[0].view(-1)[0] = INF
            X[1].view(-1)[min(1, X[1].numel() - 1)] = NAN
            X[2].view(-1)[0] = -INF
            X[3].view(-1)[-1] = INF
            X = X.movedim(0, xc).contiguous()
        self.X = X

    def leaves(self):
        v = self.values.clone().requires_grad_()
        f = None if self.fill is None else self.fill.clone().requires_grad_()
        return v, f, self.X.clone().requires_grad_()

    def build(self, v, f):
        A = sparsefill.sparse_coo_tensor(
            self.idx, v, self.ashape, fill_value=sparsefill.indefinite if f is None else f
        )
        return A.to_sparse_csr() if self.layout is CSR else A

    def masked_dense(self, v):
        """The dense operand of an indefinite ``A`` (zeros outside the pattern) and its mask."""
        Ad = torch.zeros(self.ashape, dtype=self.dtype).index_put(tuple(self.idx), v)
        mask = torch.zeros(self.ashape, dtype=torch.bool).index_put(
            tuple(self.idx), torch.tensor(True)
        )
        return Ad, mask

    def upstream(self, shape):
        W = torch.randn(shape, dtype=self.dtype, generator=torch.Generator().manual_seed(1))
        if self.g_bad == "inf":  # one +inf (with a positive X: the dense sums are +inf, not NaN)
            W.view(-1)[0] = INF
        elif self.g_bad:
            W.view(-1)[0], W.view(-1)[-1] = INF, NAN
            if W.numel() > 3:
                W.view(-1)[2] = -INF
        return W


def _grads(case, how, x_only=False):
    v, f, X = case.leaves()
    if x_only:
        v.requires_grad_(False)
        if f is not None:
            f.requires_grad_(False)
    A = case.build(v, f)
    if how == "dense":
        A = A.to_dense()
    out = case.fn(A, X)
    G = case.upstream(out.shape)
    out.backward(G)
    return out, (None if x_only else v.grad, None if (x_only or f is None) else f.grad, X.grad)


def _assert(case, got, want, what=""):
    tol = {} if case.dtype == torch.float64 else dict(rtol=1e-4, atol=1e-4)
    (out, g), (ref, w) = got, want
    torch.testing.assert_close(
        out, ref, equal_nan=True, **tol, msg=lambda m: f"forward {what}: {m}"
    )
    for name, a, b in zip(("values", "fill", "X"), g, w):
        assert (a is None) == (b is None), name
        if a is not None:
            torch.testing.assert_close(
                a, b, equal_nan=True, **tol, msg=lambda m: f"grad of {name} {what}: {m}"
            )


def check(case, x_only=False):
    got = _grads(case, "sparse", x_only)
    assert x_only or _routed(got[0])
    want = _grads(case, "dense", x_only)
    _assert(case, got, want)


FILLS = [0.0, 2.5, -1.5, NAN, INF, -INF]


@pytest.mark.parametrize(
    "layout,fill", [(COO, f) for f in FILLS] + [(CSR, f) for f in (0.0, 2.5, INF)], ids=str
)
@pytest.mark.parametrize("op", list(OPS))
def test_nonfinite_x(op, layout, fill):
    case = Case(op, layout, fill)
    check(case)
    out = case.fn(case.build(case.values, case.fill), case.X)
    assert (
        out.isnan().any()
    )  # the case exercises the non-finite path (0 * inf or inf - inf somewhere)


@pytest.mark.parametrize(
    "fill,g", [(f, "inf, -inf, NaN") for f in FILLS] + [(0.0, "one inf"), (2.5, "one inf")], ids=str
)
@pytest.mark.parametrize(
    "op", ["A@X", "X@A", "bmm", "X3@A3", "linear weight", "einsum ij,kj->ki", "mv"]
)
def test_nonfinite_upstream_gradient(op, fill, g):
    case = Case(op, COO, fill, x_bad=False, g_bad=True if g != "one inf" else "inf")
    if g == "one inf":  # a positive X: the dense sums are +inf (inf - inf would give NaN)
        case.X = case.X.abs() + 0.1
    check(case)


@pytest.mark.parametrize("fill", [0.0, 2.5, INF], ids=str)
@pytest.mark.parametrize("op", ["A@X", "X@A", "bmm", "addmm dense@sparse", "linear input"])
def test_nonfinite_x_and_upstream_gradient(op, fill):
    check(Case(op, CSR, fill, g_bad=True))


@pytest.mark.parametrize("fill", [0.0, 2.5, NAN, INF, "array", "array_inf"], ids=str)
@pytest.mark.parametrize("op", ["A@X", "X@A", "bmm", "X3@A3", "addmm", "mv", "x@A"])
def test_hybrid(op, fill):
    check(Case(op, "hybrid", fill))


@pytest.mark.parametrize("fill", [0.0, 2.5, -INF], ids=str)
@pytest.mark.parametrize("op", ["A@X", "X@A", "bmm", "linear weight", "einsum bij,bjk"])
def test_float32(op, fill):
    check(Case(op, COO, fill, dtype=torch.float32, g_bad=True))


@pytest.mark.parametrize("fill", [0.0, 2.5, NAN], ids=str)
@pytest.mark.parametrize("op", ["A@X", "X@A", "bmm", "addmm dense@sparse", "einsum ij,jk"])
def test_torchs_formulas_gradient_of_x(op, fill):
    """Only ``X`` needs a gradient: torch's derivative formulas (``A^T @ G`` through the handlers)."""
    check(Case(op, CSR, fill, g_bad=True), x_only=True)


def test_no_grad_forward():
    for fill in (0.0, 2.5):
        case = Case("A@X", COO, fill)
        with torch.no_grad():
            A = case.build(case.values, case.fill)
            torch.testing.assert_close(A @ case.X, A.to_dense() @ case.X, equal_nan=True)
            torch.testing.assert_close(case.X.T @ A.T, case.X.T @ A.to_dense().T, equal_nan=True)


@pytest.mark.parametrize("layout", [COO, CSR], ids=["coo", "csr"])
@pytest.mark.parametrize("op", ["A@X", "X@A", "bmm", "X3@A3", "mv"])
def test_indefinite_is_masked(op, layout):
    """Indefinite fill: the unspecified elements form no products (no ``0 * inf``): the masked sum."""
    case = Case(op, layout, "indefinite", g_bad=True)
    v, _, X = case.leaves()
    out = case.fn(case.build(v, None), X)
    out.backward(case.upstream(out.shape))
    got = out, (v.grad, None, X.grad)
    v2, _, X2 = case.leaves()
    Ad, mask = case.masked_dense(v2)
    if op in ("A@X", "bmm", "mv"):
        Xe = X2 if X2.dim() > 1 else X2[:, None]
        ref = torch.where(mask[..., None], Ad[..., None] * Xe[..., None, :, :], 0).sum(-2)
        ref = ref if X2.dim() > 1 else ref[..., 0]
    else:
        ref = torch.where(mask[..., None, :, :], X2[..., :, :, None] * Ad[..., None, :, :], 0).sum(
            -2
        )
    ref.backward(case.upstream(ref.shape))
    _assert(case, got, (ref, (v2.grad, None, X2.grad)))
    assert out.isnan().sum() < out.numel()


def test_integer_operands_unchanged():
    A = sparsefill.sparse_coo_tensor([[0, 1], [1, 0]], torch.tensor([2, 3]), (2, 2), fill_value=1)
    X = torch.tensor([[1, 2], [3, 4]])
    assert torch.equal(A @ X, A.to_dense() @ X) and torch.equal(X @ A, X @ A.to_dense())


@pytest.mark.parametrize("fill,layout", [(0.0, CSR), (2.5, COO)], ids=str)
def test_compiled_matches_eager(fill, layout):
    """Traced (no data read): the exact path, branch-free; the same as eager and dense."""
    torch._dynamo.reset()
    case = Case("A@X", layout, fill)
    fn = torch.compile(lambda A, X: (A @ X, X.T @ A.T), backend="aot_eager", fullgraph=True)
    A = case.build(case.values, case.fill)
    for X in (case.X, torch.randn(case.X.shape, dtype=case.dtype)):
        got = fn(A, X)
        torch.testing.assert_close(got[0], A.to_dense() @ X, equal_nan=True)
        torch.testing.assert_close(got[1], X.T @ A.to_dense().T, equal_nan=True)


@pytest.mark.parametrize(
    "op,fill,inside,bad",
    [
        ("A@X", 2.5, True, "one inf in G"),
        ("X@A", 0.0, True, "one inf in G"),
        ("A@X", 0.0, False, "X and G"),
    ],
    ids=str,
)
def test_compiled_gradients(op, fill, inside, bad):
    """The gradients of values, fill and X of a compiled loss (aot_eager: the joint graph) equal the dense
    ones, for a non-finite ``X`` and ``G``: ``A`` built inside the compiled function (the routed backward,
    traced: the fill's gradient is the branch-free exact sum) or passed in (torch's formulas)."""
    torch._dynamo.reset()
    case = Case(op, COO, fill, x_bad=bad == "X and G", g_bad=True if bad == "X and G" else "inf")
    if bad != "X and G":
        case.X = case.X.abs() + 0.1
    W = case.upstream(case.fn(case.build(case.values, case.fill), case.X).shape)
    if inside:
        loss = torch.compile(
            lambda v, f, X: (case.fn(case.build(v, f), X) * W).sum(),
            backend="aot_eager",
            fullgraph=True,
        )
    else:
        inner = torch.compile(
            lambda A, X: (case.fn(A, X) * W).sum(), backend="aot_eager", fullgraph=True
        )
        loss = lambda v, f, X: inner(case.build(v, f), X)  # noqa: E731
    got, want = case.leaves(), case.leaves()
    loss(*got).backward()
    (case.fn(case.build(*want[:2]).to_dense(), want[2]) * W).sum().backward()
    for name, a, b in zip(("values", "fill", "X"), got, want):
        torch.testing.assert_close(
            a.grad, b.grad, equal_nan=True, msg=lambda m: f"grad of {name}: {m}"
        )
    assert not torch.isfinite(want[1].grad)  # (the case reaches the non-finite sums)
    assert bad == "X and G" or want[1].grad == INF  # (inf: where inf - inf would give NaN)


# ---------------------------------------------------------------------- sparse @ sparse, stored inf/NaN
# A stored inf/NaN in one operand meets the other's unspecified elements (a fill, 0 included): ``0 * inf`` is
# NaN, ``2.5 * inf`` is inf, as dense; an indefinite operand's unspecified elements form no products (masked).
# name: (A shape, B shape, fn)
SPSP = {
    "A@B": ((6, 5), (5, 4), lambda A, B: A @ B),
    "mm": ((6, 5), (5, 4), torch.mm),
    "bmm": ((2, 6, 5), (2, 5, 4), torch.bmm),
    "addmm": (
        (6, 5),
        (5, 4),
        lambda A, B: torch.addmm(torch.ones(6, 4, dtype=A.dtype), A, B, beta=0.5, alpha=2),
    ),
    "matmul 3x2": ((2, 6, 5), (5, 4), torch.matmul),
    "mv": ((6, 5), (5,), torch.mv),
    "dot": ((5,), (5,), torch.dot),
}


class SpSp:
    """Two SparseTensor operands with stored ``inf``, ``-inf`` and NaN (in ``A``, ``B`` or both: ``bad``)."""

    def __init__(self, op, fa, fb, layout=COO, bad="both", dtype=torch.float64, seed=0):
        g = torch.Generator().manual_seed(seed)
        sa, sb, self.fn = SPSP[op]
        self.layout, self.dtype, self.fills = layout, dtype, (fa, fb)
        self.parts = [
            self._operand(s, f, g, bad in (name, "both"))
            for s, f, name in ((sa, fa, "A"), (sb, fb, "B"))
        ]
        self.shapes = (sa, sb)

    def _operand(self, shape, fill, g, bad):
        dd = int(self.layout == "hybrid" and len(shape) >= 2)  # hybrid: the last dim dense
        S = shape[: len(shape) - dd]
        mask = torch.rand(S, generator=g) < 0.5
        mask.view(-1)[:3] = True
        mask.view(-1)[-1] = False
        idx = mask.nonzero().T
        vals = torch.randn((idx.shape[1],) + tuple(shape[len(S) :]), dtype=self.dtype, generator=g)
        if bad:
            v = vals.view(-1)
            pos = torch.randperm(v.numel(), generator=g)[:3]
            v[pos] = torch.tensor([INF, -INF, NAN], dtype=self.dtype)
        if fill == "indefinite":
            f = None
        elif fill == "array":
            f = torch.randn(shape[len(S) :], dtype=self.dtype, generator=g)
        else:
            f = torch.tensor(fill, dtype=self.dtype)
        return idx, vals, f

    def leaves(self):
        return [
            (i, v.clone().requires_grad_(), None if f is None else f.clone().requires_grad_())
            for i, v, f in self.parts
        ]

    def build(self, i, v, f, shape):
        A = sparsefill.sparse_coo_tensor(
            i, v, shape, fill_value=sparsefill.indefinite if f is None else f
        )
        # (CSR: 2-d, or batched with a definite fill: an indefinite batched CSR needs equal nse per batch)
        return (
            A.to_sparse_csr()
            if self.layout is CSR and (len(shape) == 2 or len(shape) == 3 and f is not None)
            else A
        )

    def run(self, dense):
        leaves = self.leaves()
        ops = [self.build(i, v, f, s) for (i, v, f), s in zip(leaves, self.shapes)]
        if (
            dense
        ):  # masked: sum over k where both are defined, as an explicit where (no 0 * inf outside)
            ops = [self.masked(T, v, f) for T, (_, v, f) in zip(ops, leaves)]
            out = (
                self.masked_fn(*ops)
                if any(m is not None for _, m in ops)
                else self.fn(*(d for d, _ in ops))
            )
        else:
            out = self.fn(*ops)
        G = torch.randn(out.shape, dtype=self.dtype, generator=torch.Generator().manual_seed(1))
        out.backward(G)
        out = out.to_dense() if isinstance(out, sparsefill.SparseTensor) else out
        return out, [t.grad for _, v, f in leaves for t in (v, f) if t is not None]

    def masked(self, T, v, f):
        if f is not None:
            return T.to_dense(), None
        return T.to_dense(fill_value=0.0), torch.ones_like(T).to_dense(fill_value=0).bool()

    def masked_fn(self, a, b):
        """``fn`` with the masked product ``sum_k where(ma & mb, a * b, 0)`` (both operands 2-d/3-d here)."""
        (a, ma), (b, mb) = a, b
        ma = torch.ones(a.shape, dtype=torch.bool) if ma is None else ma
        mb = torch.ones(b.shape, dtype=torch.bool) if mb is None else mb
        if a.dim() == 1:
            m = ma & mb
            return (torch.where(m, a, 0) * torch.where(m, b, 0)).sum()
        if b.dim() == 1:  # mv: b a column
            return self.masked_fn((a, ma), (b[:, None], mb[:, None]))[..., 0]
        m = ma.unsqueeze(-1) & mb.unsqueeze(-3)
        prod = torch.where(m, a.unsqueeze(-1), 0) * torch.where(m, b.unsqueeze(-3), 0)
        mat = lambda A, B: prod.sum(-2)  # noqa: E731  (the op's own arithmetic around the product)
        with_prod = {"addmm": lambda A, B: 0.5 * torch.ones(6, 4, dtype=a.dtype) + 2 * mat(A, B)}
        return with_prod.get(self.op_name, mat)(a, b)


def check_spsp(case, op):
    case.op_name = op
    got, want = case.run(False), case.run(True)
    assert want[0].isnan().any() or not torch.isfinite(want[0]).all()
    tol = {} if case.dtype == torch.float64 else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(
        got[0], want[0], equal_nan=True, **tol, msg=lambda m: f"forward: {m}"
    )
    assert len(got[1]) == len(want[1])
    for n, (a, b) in enumerate(zip(got[1], want[1])):
        torch.testing.assert_close(a, b, equal_nan=True, **tol, msg=lambda m: f"gradient {n}: {m}")


SPSP_FILLS = [
    (0.0, 0.0),
    (2.5, -1.5),
    (0.0, 2.5),
    (-1.5, 0.0),
    (NAN, 0.0),
    (0.0, INF),
    (INF, 2.5),
    ("indefinite", 0.0),
    (0.0, "indefinite"),
    ("indefinite", "indefinite"),
    ("indefinite", 2.5),
]


@pytest.mark.parametrize("bad", ["A", "B", "both"])
@pytest.mark.parametrize("fa,fb", SPSP_FILLS, ids=str)
def test_sparse_sparse_stored_nonfinite(fa, fb, bad):
    check_spsp(SpSp("A@B", fa, fb, bad=bad), "A@B")


@pytest.mark.parametrize("fa,fb", [(0.0, 0.0), (2.5, -1.5), ("indefinite", 0.0)], ids=str)
@pytest.mark.parametrize(
    "op,layout",
    [(op, lay) for op in SPSP for lay in (COO, CSR, "hybrid") if not (op == "dot" and lay != COO)],
    ids=str,
)  # (1-d: COO only)
def test_sparse_sparse_stored_nonfinite_ops(op, layout, fa, fb):
    check_spsp(SpSp(op, fa, fb, layout=layout, seed=3), op)


@pytest.mark.parametrize(
    "fa,fb", [(0.0, 0.0), (2.5, -1.5), ("array", 0.0), (0.0, "array")], ids=str
)
def test_sparse_sparse_stored_nonfinite_hybrid_array_fill(fa, fb):
    check_spsp(SpSp("A@B", fa, fb, layout="hybrid", seed=5), "A@B")


@pytest.mark.parametrize("fa,fb", [(0.0, 0.0), (2.5, -1.5)], ids=str)
def test_sparse_sparse_stored_nonfinite_float32(fa, fb):
    check_spsp(SpSp("bmm", fa, fb, dtype=torch.float32, seed=7), "bmm")


def test_linalg_autograd_imports_alone():
    """``ops.linalg_autograd`` imports first in a fresh interpreter (no circular import through autograd_routes)."""
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-c", "import sparsefill.ops.linalg.backward"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-2000:]


# ---------------------------------------------------------------------- complex; a fill varying along both dims
def _no_densify_check(fn):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        return fn()


def _against_dense(build, leaves, X, fn, ref_fn=None):
    """Forward and the gradients of every leaf (values, fill, X) of ``fn(build(...), X)`` against the dense;
    with ``ref_fn`` (complex: the sum of the terms), each element equals one of the two dense computations."""

    def run(how):
        ls = [t.detach().clone().requires_grad_() for t in leaves + [X]]
        A = build(*ls[:-1])
        out = fn(A, ls[-1]) if how is None else how(A.to_dense(), ls[-1])
        G = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1))
        out.backward(G)
        return [out] + [t.grad for t in ls]

    got = _no_densify_check(lambda: run(None))
    refs = [run(fn)] + ([run(ref_fn)] if ref_fn else [])
    assert not torch.isfinite(refs[0][0]).all()
    for n, a in enumerate(got):
        ok = [torch.isclose(_nan(a), _nan(r[n]), equal_nan=True) for r in refs]
        bad = ~torch.stack(ok).any(0)
        assert not bad.any(), (
            f"{'forward' if n == 0 else f'gradient {n - 1}'}: {a[bad]} vs {[r[n][bad] for r in refs]}"
        )


def _nan(z):
    """A complex NaN (``torch.isnan``: either part NaN) as ``nan + nan j`` (which part is NaN depends on the order
    of the complex products' operations)."""
    return torch.where(z.isnan(), complex(NAN, NAN), z) if z.is_complex() else z


# the complex products as the sums of their terms: torch's dense gradients multiply by conjugate views, whose
# BLAS path differs from the terms' products where inf meets inf (``G @ A.mH`` gives ``nan + nan j`` where
# ``G @ A.mH.contiguous()`` and the sum of the terms give ``-inf - inf j``)
TERMS = {
    "A@X": lambda A, X: (A[:, :, None] * X[None]).sum(1),
    "X@A": lambda A, X: (X[:, :, None] * A[None]).sum(1),
    "bmm": lambda A, X: (A[..., None] * X[:, None]).sum(2),
}


CPLX = torch.complex128


@pytest.mark.parametrize("layout", [COO, CSR], ids=["coo", "csr"])
@pytest.mark.parametrize("fill", [2.5 + 1j, -1j, 0j, complex(NAN, 0), complex(INF, 1)], ids=str)
@pytest.mark.parametrize("op", ["A@X", "X@A", "bmm"])
def test_complex_nonfinite_x(op, fill, layout):
    """Complex operands with inf/NaN in ``X`` (real and imaginary parts) and any fill: the dense product (as the
    real products of the real and imaginary parts: the same sums of the same terms), no densifying."""
    g = torch.Generator().manual_seed(4)
    ashape, xshape, fn, xc, _ = OPS[op]
    keys = (
        torch.randperm(torch.Size(ashape).numel(), generator=g)[: torch.Size(ashape).numel() // 3]
        .sort()
        .values
    )
    idx = torch.stack(torch.unravel_index(keys, ashape))
    v = torch.randn(idx.shape[1], dtype=CPLX, generator=g)
    X = torch.randn(xshape, dtype=CPLX, generator=g).movedim(xc, 0).contiguous()
    X[0].view(-1)[0] = INF
    X[1].view(-1)[0] = complex(-INF, 1)
    X[2].view(-1)[-1] = complex(1, NAN)
    X[3].view(-1)[0] = complex(2, INF)
    X = X.movedim(0, xc).contiguous()

    def build(v, f):
        A = sparsefill.sparse_coo_tensor(idx, v, ashape, fill_value=f)
        return A.to_sparse_csr() if layout is CSR else A

    _against_dense(build, [v, torch.tensor(fill, dtype=CPLX)], X, fn, TERMS[op])
    A = build(v, torch.tensor(fill, dtype=CPLX))
    torch.testing.assert_close(
        _nan(fn(A, X)), _nan(fn(A.to_dense(), X)), equal_nan=True
    )  # torch's dense forward


@pytest.mark.parametrize("fill", ["finite", "inf"])
@pytest.mark.parametrize("op", ["bmm", "X3@A3", "matmul 3x2", "A3@x"])
def test_fill_varying_along_both_dims(op, fill):
    """A batch of matrices sparse along the batch only (two dense dims: the fill an ``(m, k)`` array, varying along
    both matrix dims) times an ``X`` with inf/NaN: each matrix is stored or the fill, so the product is the dense
    one, no densifying.  (COO only: CSR needs 2 sparse dims.)"""
    g = torch.Generator().manual_seed(6)
    fns = {
        "bmm": (lambda A, X: torch.bmm(A, X), (3, 5, 2)),
        "X3@A3": (lambda A, X: X @ A, (3, 2, 4)),
        "matmul 3x2": (lambda A, X: torch.matmul(A, X), (5, 2)),
        "A3@x": (lambda A, x: A @ x, (5,)),
    }
    fn, xshape = fns[op]
    v = torch.randn(2, 4, 5, dtype=torch.float64, generator=g)
    f = torch.randn(4, 5, dtype=torch.float64, generator=g)
    if fill == "inf":
        f[1, 2], f[3, 0] = INF, NAN
    X = torch.randn(xshape, dtype=torch.float64, generator=g)
    X.view(-1)[0], X.view(-1)[-1] = INF, NAN
    v.view(-1)[3] = -INF

    def build(v, f):
        return sparsefill.sparse_coo_tensor([[0, 2]], v, (3, 4, 5), fill_value=f)

    _against_dense(build, [v, f], X, fn)
