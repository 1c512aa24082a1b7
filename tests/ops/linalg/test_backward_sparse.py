"""The backward of the matrix products is as sparse as their forward (ops/linalg/backward.py), and
gradient types follow torch's contract (ops/autograd_routes.py).

For ``A`` built from ``(values, fill)`` and a dense ``X``, the gradients of ``values``, ``fill`` and ``X``
through ``op(A, X)`` equal those through ``op(A.to_dense(), X)`` (the dense gradient read at the
pattern, and summed over the unspecified elements for the fill)::

    grad(values, fill, X) of op(A, X) == grad(values, fill, X) of op(A.to_dense(), X)

for COO, CSR, uncoalesced and hybrid (array fill) operands, zero, nonzero, NaN, inf and indefinite
fills (indefinite: masked, compared with ``to_dense(fill_value=0)``), float32/float64, the sparse
operand on either side; the route is asserted taken (a ``SparseMMBackward`` node), and no aten call of
the forward or backward returns an N x N dense tensor.  A dense leaf's ``.grad`` is a dense tensor.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import sparsefill
from sparsefill import SparseTensor

NAN, INF = float("nan"), float("inf")
COO, CSR = torch.sparse_coo, torch.sparse_csr


def _pattern(shape, nse, dense_dim, uncoalesced, g):
    """Indices over the sparse dims: ``nse`` distinct positions (per batch for 3-d), plus duplicates."""
    S = shape[: len(shape) - dense_dim]
    if (
        len(S) == 3
    ):  # the same count per batch: a batched CSR tensor needs it with an indefinite fill
        per = torch.Size(S[1:]).numel()
        keys = (
            torch.cat([b * per + torch.randperm(per, generator=g)[:nse] for b in range(S[0])])
            .sort()
            .values
        )
    else:
        keys = torch.randperm(torch.Size(S).numel(), generator=g)[:nse].sort().values
    if uncoalesced:
        keys = torch.cat([keys, keys[:3]])
        keys = keys[torch.randperm(keys.numel(), generator=g)]
    return torch.stack(torch.unravel_index(keys, S))


class Case:
    """Leaves ``values``, ``fill``, ``X`` and the two ways to build ``A`` from them."""

    def __init__(
        self,
        shape,
        xshape,
        fill,
        *,
        layout=COO,
        dense_dim=0,
        uncoalesced=False,
        dtype=torch.float64,
        nse=6,
        seed=0,
    ):
        g = torch.Generator().manual_seed(seed)
        self.shape, self.layout, self.dtype = shape, layout, dtype
        self.idx = _pattern(shape, nse, dense_dim, uncoalesced, g)
        D = shape[len(shape) - dense_dim :]
        self.values = torch.randn((self.idx.shape[1],) + tuple(D), dtype=dtype, generator=g)
        self.indefinite = fill == "indefinite"
        self.fill = (
            None
            if self.indefinite
            else (
                torch.randn(D, dtype=dtype, generator=g)
                if fill == "array"
                else torch.tensor(fill, dtype=dtype)
            )
        )
        self.X = torch.randn(xshape, dtype=dtype, generator=g)

    def leaves(self):
        v = self.values.clone().requires_grad_()
        f = None if self.indefinite else self.fill.clone().requires_grad_()
        return v, f, self.X.clone().requires_grad_()

    def build(self, v, f):
        A = sparsefill.sparse_coo_tensor(
            self.idx, v, self.shape, fill_value=sparsefill.indefinite if f is None else f
        )
        return A.to_sparse_csr() if self.layout is CSR else A


def _routed(out, node: str = "SparseMMBackward") -> bool:
    """Whether the autograd graph of ``out`` holds a ``node`` (a routed Function's backward)."""
    seen, todo = set(), [out.grad_fn]
    while todo:
        n = todo.pop()
        if n is None or n in seen:
            continue
        seen.add(n)
        if type(n).__name__ == node:
            return True
        todo.extend(m for m, _ in n.next_functions)
    return False


def _grads(case, fn, dense: bool):
    v, f, X = case.leaves()
    A = case.build(v, f)
    if dense:
        A = A.to_dense(fill_value=0.0) if case.indefinite else A.to_dense()
    out = fn(A, X)
    W = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1))
    (out * W).sum().backward()
    return out, (v.grad, None if f is None else f.grad, X.grad)


def check(case, fn):
    out, got = _grads(case, fn, dense=False)
    ref_out, want = _grads(case, fn, dense=True)
    assert _routed(out)
    tol = {} if case.dtype == torch.float64 else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out, ref_out, equal_nan=True, **tol)
    for name, a, b in zip(("values", "fill", "X"), got, want):
        assert (a is None) == (b is None), name
        if a is not None:
            assert type(a) is torch.Tensor, name
            torch.testing.assert_close(
                a, b, equal_nan=True, **tol, msg=lambda m: f"grad of {name}: {m}"
            )


OPS = {  # name: (A shape, X shape, fn)
    "A@X": ((6, 5), (5, 3), lambda A, X: A @ X),
    "X@A": ((6, 5), (4, 6), lambda A, X: X @ A),
    "mm": ((6, 5), (5, 3), torch.mm),
    "Tensor.mm dense@sparse": ((6, 5), (4, 6), lambda A, X: X.mm(A)),
    "mv": ((6, 5), (5,), torch.mv),
    "A@x": ((6, 5), (5,), torch.matmul),
    "x@A": ((6, 5), (6,), lambda A, x: x @ A),
    "A2@X3": ((6, 5), (2, 5, 3), torch.matmul),
    "X3@A2": ((6, 5), (2, 4, 6), lambda A, X: torch.matmul(X, A)),
    "A3@X2": ((2, 6, 5), (5, 3), torch.matmul),
    "A3@x": ((2, 6, 5), (5,), torch.matmul),
    "bmm": ((2, 6, 5), (2, 5, 3), torch.bmm),
    "X3@A3": ((2, 6, 5), (2, 4, 6), lambda A, X: X @ A),
    "addmm": (
        (6, 5),
        (5, 3),
        lambda A, X: torch.addmm(torch.ones(6, 3, dtype=X.dtype), A, X, beta=0.5, alpha=2),
    ),
    "addmm dense@sparse": (
        (6, 5),
        (3, 6),
        lambda A, X: torch.addmm(torch.ones(5, dtype=X.dtype), X, A),
    ),
    "addmv": ((6, 5), (5,), lambda A, x: torch.addmv(torch.ones(6, dtype=x.dtype), A, x)),
    "baddbmm": (
        (2, 6, 5),
        (2, 5, 3),
        lambda A, X: torch.baddbmm(torch.zeros(1, dtype=X.dtype), A, X, beta=0),
    ),
    "linear weight": (
        (6, 5),
        (2, 4, 5),
        lambda A, x: F.linear(x, A, torch.arange(A.shape[0], dtype=x.dtype)),
    ),
    "linear input": ((6, 5), (3, 5), lambda A, W: F.linear(A, W)),
    "einsum ij,jk": ((6, 5), (5, 3), lambda A, X: torch.einsum("ij,jk->ik", A, X)),
    "einsum ij,kj->ki": ((6, 5), (4, 5), lambda A, X: torch.einsum("ij,kj->ki", A, X)),
    "einsum ji,jk": ((6, 5), (6, 3), lambda A, X: torch.einsum("ji,jk->ik", A, X)),
    "einsum kj,ij dense first": ((6, 5), (4, 6), lambda A, X: torch.einsum("kj,ji->ki", X, A)),
    "einsum bij,bjk": ((2, 6, 5), (2, 5, 3), lambda A, X: torch.einsum("bij,bjk->bik", A, X)),
    "torch.sparse.mm": ((6, 5), (5, 3), torch.sparse.mm),
    "X@A.t()": ((6, 5), (4, 5), lambda A, X: X @ A.t()),
    "A.mT@X": ((2, 6, 5), (2, 6, 3), lambda A, X: A.mT @ X),
}
FILLS = [0.0, 2.5, NAN, INF, "indefinite"]
MAIN = ["A@X", "X@A", "A3@X2", "bmm", "X3@A3", "A2@X3"]


@pytest.mark.parametrize("fill", FILLS, ids=str)
@pytest.mark.parametrize("layout", ["coo", "csr", "uncoalesced"])
@pytest.mark.parametrize("op", MAIN)
def test_gradients_match_dense(op, layout, fill):
    shape, xshape, fn = OPS[op]
    kw = (
        dict(layout=CSR)
        if layout == "csr"
        else dict(uncoalesced=True)
        if layout == "uncoalesced"
        else {}
    )
    check(Case(shape, xshape, fill, **kw), fn)


@pytest.mark.parametrize("fill", [2.5, "indefinite"], ids=str)
@pytest.mark.parametrize("op", sorted(set(OPS) - set(MAIN)))
def test_every_function_of_the_family(op, fill):
    shape, xshape, fn = OPS[op]
    check(Case(shape, xshape, fill, seed=3), fn)
    check(Case(shape, xshape, fill, layout=CSR, uncoalesced=True, seed=4), fn)


@pytest.mark.parametrize("fill", [0.0, 1.5, "array", NAN, "indefinite"], ids=str)
@pytest.mark.parametrize("op", ["A@X", "X@A", "A3@X2", "linear weight"])
def test_hybrid(op, fill):
    """A row-sparse operand (its last dim dense): each stored row is a dense slice; an array fill's
    gradient keeps the dense dim."""
    shape, xshape, fn = OPS[op]
    check(Case(shape, xshape, fill, dense_dim=1, nse=3), fn)
    check(Case(shape, xshape, fill, dense_dim=1, nse=2, uncoalesced=True), fn)


@pytest.mark.parametrize("fill", [0.0, -1.25, INF, "indefinite"], ids=str)
@pytest.mark.parametrize("op", ["A@X", "X@A", "bmm"])
def test_float32(op, fill):
    shape, xshape, fn = OPS[op]
    check(Case(shape, xshape, fill, dtype=torch.float32), fn)
    check(Case(shape, xshape, fill, dtype=torch.float32, layout=CSR), fn)


@pytest.mark.parametrize("layout", [COO, CSR], ids=["coo", "csr"])
@pytest.mark.parametrize("op", ["A@X", "X@A", "A3@X2", "einsum ij,kj->ki", "addmm"])
def test_gradcheck(op, layout):
    shape, xshape, fn = OPS[op]
    case = Case(shape, xshape, 1.5, layout=layout, uncoalesced=True)
    v, f, X = case.leaves()
    assert torch.autograd.gradcheck(lambda v, f, X: fn(case.build(v, f), X), (v, f, X))
    if layout is COO:  # (the hybrid case is COO in both parametrizations: checked once)
        hyb = Case(shape, xshape, "array", dense_dim=1, nse=3, layout=COO)
        v, f, X = hyb.leaves()
        assert torch.autograd.gradcheck(lambda v, f, X: fn(hyb.build(v, f), X), (v, f, X))
    ind = Case(shape, xshape, "indefinite", layout=layout)
    v, _, X = ind.leaves()
    assert torch.autograd.gradcheck(lambda v, X: fn(ind.build(v, None), X), (v, X))


class _Shapes(TorchDispatchMode):
    """The largest strided result of any aten call (sparse results, SparseTensor or native, are counted by
    their storage: the aten calls that build it)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if (
                isinstance(t, torch.Tensor)
                and not isinstance(t, SparseTensor)
                and t.layout is torch.strided
            ):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("fill", [0.0, 2.5, NAN, "indefinite"], ids=str)
@pytest.mark.parametrize("layout", [COO, CSR], ids=["coo", "csr"])
@pytest.mark.parametrize("op", ["A@X", "X@A", "linear weight"])
def test_no_n_by_n_temporary(op, layout, fill):
    """(300, 400) with 60 stored elements and 4 columns: nothing of 300 * 400 elements is made, and the
    backward runs under a densify policy that raises past 64 kB."""
    xshape = {"A@X": (400, 4), "X@A": (4, 300), "linear weight": (4, 400)}[op]
    case = Case((300, 400), xshape, fill, layout=layout, nse=60)
    v, f, X = case.leaves()
    with _Shapes() as rec:
        out = OPS[op][2](case.build(v, f), X)
        with sparsefill.densify_policy("raise", limit_bytes=1 << 16):
            out.sum().backward()
    assert _routed(out)
    assert v.grad is not None and X.grad is not None and (f is None or f.grad is not None)
    assert rec.largest < 300 * 400 // 20, rec.largest


def test_route_taken_only_where_the_pattern_gradient_is_exact():
    """A leaf (dense semantics: its ``.grad`` is ``G @ X^T``) and ``A`` computed from another SparseTensor
    with a definite fill by other than element-wise ops take torch's path; through coalesce / CSR
    conversion and element-wise ops the route is taken."""
    case = Case((6, 5), (5, 3), 2.5, uncoalesced=True)
    v, f, X = case.leaves()
    A = case.build(v, f)
    assert _routed(A.coalesce() @ X) and _routed(A.to_sparse_csr() @ X)
    assert (
        _routed(X.T @ A.t())
        and _routed(X.mT @ A.T)
        and _routed(X.T @ A.to_sparse_csr().transpose(0, 1))
    )
    assert _routed((A * 2) @ X) and _routed(A.exp() @ X)
    assert not _routed(A.flip(0) @ X)
    sel = torch.tensor(
        [1, 0, 2, 3, 4, 4]
    )  # a row selection passes the pattern gradient on (index_autograd)
    out = A[sel] @ X
    assert _routed(out)
    gv, gf, gX = torch.autograd.grad(out.sum(), (v, f, X))
    rv, rf, rX = torch.autograd.grad((A.to_dense()[sel] @ X).sum(), (v, f, X))
    torch.testing.assert_close((gv, gf, gX), (rv, rf, rX))
    leaf = A.detach().requires_grad_()
    out = leaf @ X
    assert not _routed(out)
    out.sum().backward()
    torch.testing.assert_close(leaf.grad, torch.ones(6, 3, dtype=X.dtype) @ X.detach().T)
    with torch.no_grad():
        assert not _routed(A @ X)
    # an indefinite leaf: no gradient outside its pattern (the forward reads nothing there)
    ind = Case((6, 5), (5, 3), "indefinite")
    L = ind.build(ind.values, None).requires_grad_()
    (L @ ind.X).sum().backward()
    assert isinstance(L.grad, SparseTensor)
    want = (torch.ones(6, 3, dtype=X.dtype) @ ind.X.T) * (L.detach().to_dense(fill_value=0.0) != 0)
    torch.testing.assert_close(L.grad.to_dense(), want)


def test_gradient_reaches_values_through_the_sparse_gradient():
    """The gradient that reaches ``A`` is a SparseTensor with ``A``'s pattern whose fill is the mean of the
    dense gradient over the unspecified elements (its sum is the fill's gradient)."""
    case = Case((6, 5), (5, 3), 2.5)
    v, f, X = case.leaves()
    A = case.build(v, f)
    seen = []
    A.register_hook(lambda g: seen.append(g))
    (A @ X).sum().backward()
    (G,) = seen
    dense = torch.ones(6, 3, dtype=X.dtype) @ X.detach().T
    assert isinstance(G, SparseTensor) and G._nse() == A._nse()
    mask = torch.ones(6, 5, dtype=torch.bool)  # the unspecified elements
    mask[tuple(case.idx)] = False
    torch.testing.assert_close(G.to_dense()[~mask], dense[~mask])
    torch.testing.assert_close(G._fill_value(), dense[mask].mean())


@pytest.mark.parametrize("fill", [0.0, 3.0, NAN], ids=str)
@pytest.mark.parametrize("layout", [COO, CSR], ids=["coo", "csr"])
@pytest.mark.parametrize(
    "op",
    [
        lambda A, w: A * w,
        lambda A, w: w * A,
        lambda A, w: A + w,
        lambda A, w: torch.sub(w, A),
        lambda A, w: A / (w + 10),
        lambda A, w: torch.where(w > 0, A, w),
        lambda A, w: torch.cat([A, w]),
        lambda A, w: torch.maximum(A, w),
    ],
    ids=["mul", "rmul", "add", "sub", "div", "where", "cat", "maximum"],
)
def test_dense_leaf_gradient_is_dense(op, layout, fill):
    """torch's contract: a dense leaf's ``.grad`` is a dense tensor (was a SparseTensor after ``A * w``)."""
    case = Case((4, 5), (4, 5), fill, layout=layout, nse=7)
    A = case.build(case.values, case.fill)
    w, wd = case.X.clone().requires_grad_(), case.X.clone().requires_grad_()
    out = op(A, w)
    (out.to_dense() if isinstance(out, SparseTensor) else out).sum().backward()
    assert type(w.grad) is torch.Tensor and w.grad.layout is torch.strided
    w.grad.numpy()
    op(A.to_dense(), wd).sum().backward()
    torch.testing.assert_close(w.grad, wd.grad, equal_nan=True)


@pytest.mark.parametrize("layout", [COO, CSR], ids=["coo", "csr"])
def test_dense_leaf_gradient_with_an_indefinite_operand(layout):
    """Masked: ``A * w`` and ``A + w`` are specified where ``A`` is; ``w``'s gradient is dense, 0 elsewhere."""
    case = Case((4, 5), (4, 5), "indefinite", layout=layout, nse=7)
    A = case.build(case.values, None)
    specified = A.to_dense(fill_value=NAN).isnan().logical_not()
    for op, local in (
        (torch.mul, A.to_dense(fill_value=0.0)),
        (torch.add, torch.ones(4, 5, dtype=A.dtype)),
    ):
        w = case.X.clone().requires_grad_()
        op(A, w).to_dense(fill_value=0.0).sum().backward()
        assert type(w.grad) is torch.Tensor
        torch.testing.assert_close(w.grad, torch.where(specified, local, 0))


@pytest.mark.parametrize("layout", [COO, CSR], ids=["coo", "csr"])
def test_attention_chain_with_an_indefinite_fill(layout):
    """A GAT layer's core: ``masked.softmax(leaky_relu(S), 1) @ Wh`` on the edge scores (indefinite fill);
    the gradients of the scores and of ``Wh`` equal the dense masked computation (-inf off the edges)."""
    n, d = 30, 4
    g = torch.Generator().manual_seed(2)
    keys = torch.randperm(n * n, generator=g)[:150].sort().values
    idx = torch.stack([keys // n, keys % n])
    s0, Wh0 = (
        torch.randn(150, dtype=torch.float64, generator=g),
        torch.randn(n, d, dtype=torch.float64, generator=g),
    )
    s, Wh = s0.clone().requires_grad_(), Wh0.clone().requires_grad_()
    S = sparsefill.sparse_coo_tensor(idx, s, (n, n), fill_value=sparsefill.indefinite)
    S = S.to_sparse_csr() if layout is CSR else S
    out = sparsefill.masked.softmax(F.leaky_relu(S, 0.2), 1) @ Wh
    assert _routed(out)
    out.square().sum().backward()
    sd, Whd = s0.clone().requires_grad_(), Wh0.clone().requires_grad_()
    dense = torch.full((n, n), -INF, dtype=torch.float64).index_put(
        (idx[0], idx[1]), F.leaky_relu(sd, 0.2)
    )
    (torch.softmax(dense, 1).nan_to_num(0.0) @ Whd).square().sum().backward()
    torch.testing.assert_close(s.grad, sd.grad)
    torch.testing.assert_close(Wh.grad, Whd.grad)


def test_indefinite_gradient_reaches_the_constructor_as_zero_outside():
    """A gradient with an indefinite fill (masked-out outputs: nothing read them) is 0 there."""
    v = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    f = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
    A = sparsefill.sparse_coo_tensor([[0, 2]], v, (4,), fill_value=f)
    M = sparsefill.sparse_coo_tensor(
        [[0, 1]], torch.ones(2, dtype=torch.float64), (4,), fill_value=sparsefill.indefinite
    )
    (A * M).to_dense(fill_value=0.0).sum().backward()  # specified at 0 and 1 only
    torch.testing.assert_close(v.grad, torch.tensor([1.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(f.grad, torch.tensor(1.0, dtype=torch.float64))


def test_batched_csr_padded_with_fill_valued_elements():
    """A batched CSR tensor with unequal counts per batch stores fill-valued padding: the padded elements
    are specified in the gradient that reaches the COO constructor, unspecified there."""
    case = Case((2, 6, 5), (2, 5, 3), 2.5, layout=CSR)
    keep = case.idx[0] == 0
    keep[(case.idx[0] == 1).nonzero()[0]] = True  # batch 1 keeps one element: 6 against 1
    case.idx, case.values = case.idx[:, keep], case.values[keep]
    v, f, X = case.leaves()
    assert case.build(v, f)._nse() == 6
    check(case, torch.bmm)


def test_routes_first_imported_under_no_grad():
    """The routes module may be imported by a first call under ``no_grad`` (e.g. ``torch.sparse.sum``):
    the route for ``A.t() @ X`` is still taken afterwards."""
    import subprocess
    import sys

    code = (
        "import torch, sparsefill\n"
        "with torch.no_grad():\n"
        "    torch.sparse.sum(sparsefill.sparse_coo_tensor([[0]], [1.], (2,)))\n"
        "v = torch.ones(2, requires_grad=True)\n"
        "A = sparsefill.sparse_coo_tensor([[0, 1], [1, 0]], v, (2, 2), fill_value=3.)\n"
        "out = torch.ones(3, 2) @ A.t()\n"
        "print(type(out.grad_fn).__name__)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["SparseMMBackward"], r.stdout


COMPUTED = {  # name: (A shape, X shape, fn): the SparseTensor operand computed by element-wise ops
    "(2*A)@X": ((6, 5), (5, 3), lambda A, X: (2 * A) @ X),
    "X@exp(A)": ((6, 5), (4, 6), lambda A, X: X @ torch.exp(A * 0.5)),
    "(A+A*A)@X": ((6, 5), (5, 3), lambda A, X: (A + A * A) @ X),
    "(2*A.t())@X": ((6, 5), (6, 3), lambda A, X: (2 * A.t()) @ X),
    "(A*s)@X": ((6, 5), (5, 3), lambda A, X: (A * X[0, 0]) @ X),
    "linear(x, tanh(A))": ((6, 5), (2, 5), lambda A, x: F.linear(x, torch.tanh(A))),
    "(2*A).t()@X": ((6, 5), (6, 3), lambda A, X: (2 * A).t() @ X),
    "X@(A+A.t().t()*3).T": ((6, 5), (4, 5), lambda A, X: X @ (A + A.t().t() * 3).T),
    "(2*A3).mT@X": ((2, 6, 5), (2, 6, 3), lambda A, X: (2 * A).mT @ X),
}


@pytest.mark.parametrize("fill", [0.0, 2.5, "indefinite"], ids=str)
@pytest.mark.parametrize("layout", ["coo", "csr", "uncoalesced"])
@pytest.mark.parametrize("op", sorted(COMPUTED))
def test_matmul_of_a_computed_operand(op, layout, fill):
    """``(2 * W) @ X``: a SparseTensor operand computed by element-wise ops whose derivative is the same at
    every unspecified element (numbers, 0-d tensors, SparseTensors within its pattern) is routed; the
    gradients equal the dense ones."""
    if fill == "indefinite" and op == "X@exp(A)":
        fill = NAN  # (exp(0) != 0: the 0-filled dense reference is not the masked product)
    shape, xshape, fn = COMPUTED[op]
    kw = (
        dict(layout=CSR)
        if layout == "csr"
        else dict(uncoalesced=True)
        if layout == "uncoalesced"
        else {}
    )
    check(Case(shape, xshape, fill, **kw), fn)


@pytest.mark.parametrize("fill", [0.0, 2.5], ids=str)
@pytest.mark.parametrize("layout", [COO, CSR], ids=["coo", "csr"])
def test_matmul_of_a_computed_operand_has_no_n_by_n_temporary(layout, fill):
    case = Case((300, 400), (400, 4), fill, layout=layout, nse=60)
    v, f, X = case.leaves()
    with _Shapes() as rec:
        out = torch.exp(0.5 * case.build(v, f)) @ X
        with sparsefill.densify_policy("raise", limit_bytes=1 << 16):
            out.sum().backward()
    assert _routed(out)
    assert rec.largest < 300 * 400 // 20, rec.largest


def test_matmul_of_an_operand_with_a_varying_derivative_takes_torchs_path():
    """``(A * B) @ X`` where ``B`` stores elements outside the result's pattern cannot happen (element-wise
    results store the union); an operand whose derivative varies over its unspecified elements -- rows gathered
    by index -- is not routed, and exact.  A SparseTensor multiplied by a dense tensor over its dense dims has
    the same derivative at the unspecified elements of each dense position: routed (linalg_autograd), exact."""
    case = Case((6, 5, 2), (2, 3), 1.5, dense_dim=1)
    v, f, _ = case.leaves()
    w = torch.tensor([2.0, -1.0], dtype=torch.float64)
    A = case.build(v, f) * w  # (6, 5, 2): its dense dim scaled element by element
    from sparsefill.ops.linalg.backward import pattern_grad_is_exact

    assert isinstance(A, SparseTensor) and pattern_grad_is_exact(A)
    out = A.sum((0, 1))
    out.sum().backward()
    vd, fd, _ = case.leaves()
    (case.build(vd, fd).to_dense() * w).sum((0, 1)).sum().backward()
    torch.testing.assert_close((v.grad, f.grad), (vd.grad, fd.grad))


@pytest.mark.parametrize("fill", [0.0, 2.5, NAN], ids=str)
@pytest.mark.parametrize(
    "shape,take",
    [
        ((1, 1, 3000), lambda y: y[0, 0]),
        ((1, 3000), lambda y: y[0]),
        ((3, 1, 1000), lambda y: y[:, 0]),
        ((3, 1000), lambda y: y[0:3]),
        ((3, 1000), lambda y: y[:, 0:1000]),
    ],
    ids=[
        "[0,0] of (1,1,L)",
        "[0] of (1,L)",
        "[:,0] of (3,1,L)",
        "full slice dim 0",
        "full slice dim 1",
    ],
)
def test_select_or_slice_of_everything_keeps_the_fill(shape, take, fill):
    """A select on a size-1 dim or a full slice has no zeros around it: its backward is the upstream gradient
    with its fill (a nonzero fill stored every element before), forward and backward against dense."""
    g = torch.Generator().manual_seed(3)
    n = int(torch.tensor(shape).prod())
    pos = torch.randperm(n, generator=g)[:20].sort().values
    idx = torch.stack(torch.unravel_index(pos, shape))
    vals = torch.rand(20, generator=g, dtype=torch.float64)
    v, f = (
        vals.clone().requires_grad_(),
        torch.tensor(fill, dtype=torch.float64, requires_grad=True),
    )
    with _Shapes() as rec:
        A = sparsefill.sparse_coo_tensor(idx, v, shape, fill_value=f)
        (take(torch.exp(A)) * 3).sum().backward()
    assert rec.largest < n // 10
    vd, fd = (
        vals.clone().requires_grad_(),
        torch.tensor(fill, dtype=torch.float64, requires_grad=True),
    )
    D = fd.expand(shape).index_put(tuple(idx), vd)
    (take(torch.exp(D)) * 3).sum().backward()
    torch.testing.assert_close(v.grad, vd.grad, equal_nan=True)
    torch.testing.assert_close(f.grad, fd.grad, equal_nan=True)
