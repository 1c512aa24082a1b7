"""The backward of the reductions over every sparse dim is as sparse as their forward (ops/reductions/backward.py).

For ``A`` built from ``(values, fill)``, the gradients of ``values`` and ``fill`` through ``r(A)`` equal those
through ``r(A.to_dense())`` (an indefinite fill: masked semantics, the reduction of the stored elements
only, i.e. ``r`` of the stored values stacked along one dim)::

    grad(values, fill) of r(A, dims) == grad(values, fill) of r(A.to_dense(), dims)

for every routed reduction with and without dims, keepdim and dtype, on COO, CSR, uncoalesced, hybrid
(array fill), empty (nse 0), 0-size and 0-d operands, zero, nonzero, NaN, inf and indefinite fills,
float32/float64; the route is asserted taken (a ``SparseReduceBackward`` node), its gradient is a
SparseTensor on the input's pattern, and no aten call of the forward or backward returns a tensor of the
input's size.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import sparsefill
from sparsefill import SparseTensor
from tests.ops.linalg.test_backward_sparse import _Shapes as _Sizes, _routed as routed

NAN, INF = float("nan"), float("inf")
COO, CSR = torch.sparse_coo, torch.sparse_csr


class Case:
    """Leaves ``values`` and ``fill`` and the SparseTensor built from them."""

    def __init__(
        self,
        shape,
        fill,
        *,
        layout=COO,
        dense_dim=0,
        uncoalesced=False,
        dtype=torch.float64,
        nse=6,
        seed=0,
        values=None,
    ):
        g = torch.Generator().manual_seed(seed)
        self.shape, self.layout, self.dtype, self.dense_dim = shape, layout, dtype, dense_dim
        S = shape[: len(shape) - dense_dim]
        D = tuple(shape[len(shape) - dense_dim :])
        keys = torch.randperm(math.prod(S), generator=g)[:nse].sort().values
        if uncoalesced and keys.numel():
            keys = torch.cat([keys, keys[:2]])
            keys = keys[torch.randperm(keys.numel(), generator=g)]
        self.idx = (
            torch.stack(torch.unravel_index(keys, S))
            if S
            else torch.zeros(0, keys.numel(), dtype=torch.long)
        )
        self.values = (
            torch.randn((keys.numel(),) + D, dtype=dtype, generator=g)
            if values is None
            else torch.tensor(values, dtype=dtype)
        )
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

    def leaves(self):
        v = self.values.clone().requires_grad_()
        return v, None if self.indefinite else self.fill.clone().requires_grad_()

    def build(self, v, f):
        A = sparsefill.sparse_coo_tensor(
            self.idx, v, self.shape, fill_value=sparsefill.indefinite if f is None else f
        )
        return A.to_sparse_csr() if self.layout is CSR else A


def _routed(out) -> bool:
    return routed(out, "SparseReduceBackward")


def _stored(case, A):
    """The stored elements of ``A`` (indefinite fill), coalesced, stacked along dim 0: ``(nse, *dense)``."""
    D = A.to_dense(fill_value=0.0)
    keys = torch.unique(
        torch.tensor([0]).new_tensor(
            [
                int(k)
                for k in torch.tensor(list(zip(*case.idx.tolist()))).matmul(
                    torch.tensor(
                        [
                            math.prod(case.shape[i + 1 : case.idx.shape[0]])
                            for i in range(case.idx.shape[0])
                        ]
                    )
                )
            ]
            if case.idx.shape[1]
            else [],
            dtype=torch.long,
        )
    )
    return D.reshape((-1,) + tuple(A.shape[case.idx.shape[0] :]))[keys]


def _grads(case, fn, mode):
    v, f = case.leaves()
    A = case.build(v, f)
    if mode == "dense":
        A = A.to_dense()
    elif mode == "masked":
        A = _stored(case, A)
    out = fn(A)
    W = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1))
    (out * W).sum().backward()
    return out, (v.grad, None if f is None else f.grad)


def check(case, fn, fn_masked=None):
    """``fn_masked``: the same reduction of the stored values ``(nse, *dense)`` (indefinite fill)."""
    out, got = _grads(case, fn, "sparse")
    ref_out, want = (
        _grads(case, fn_masked, "masked") if case.indefinite else _grads(case, fn, "dense")
    )
    assert _routed(out)
    tol = {} if case.dtype == torch.float64 else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out, ref_out, equal_nan=True, **tol)
    for name, a, b in zip(("values", "fill"), got, want):
        assert (a is None) == (b is None), name
        if a is not None:
            torch.testing.assert_close(
                a, b, equal_nan=True, **tol, msg=lambda m: f"grad of {name}: {m}"
            )


# name: (fn on A with all sparse dims reduced, fn on the stored values (nse, *dense) for the masked reference);
# ``d`` is A's sparse dims as a tuple, ``n`` the number of sparse dims
def _ops(d, n):
    sd = tuple(range(n))
    return {
        "sum()": (lambda A: A.sum(), lambda S: S.sum()),
        "sum(d)": (lambda A: torch.sum(A, sd), lambda S: S.sum(0)),
        "sum(d, keepdim)": (
            lambda A: A.sum(sd, keepdim=True),
            lambda S: S.sum(0).reshape((1,) * n + S.shape[1:]),
        ),
        "sum(dtype)": (
            lambda A: torch.sum(A, dtype=torch.float32),
            lambda S: S.sum(dtype=torch.float32),
        ),
        "mean()": (lambda A: A.mean(), lambda S: S.mean()),
        "mean(d, dtype)": (
            lambda A: torch.mean(A, sd, dtype=torch.float64),
            lambda S: S.mean(0, dtype=torch.float64),
        ),
        "nansum()": (torch.nansum, torch.nansum),
        "nanmean(d)": (lambda A: A.nanmean(sd), lambda S: S.nanmean(0)),
        "prod()": (torch.prod, torch.prod),
        "amax()": (torch.amax, torch.amax),
        "amin(d, keepdim)": (
            lambda A: A.amin(sd, True),
            lambda S: S.amin(0).reshape((1,) * n + S.shape[1:]),
        ),
        "max()": (torch.max, torch.max),
        "min()": (lambda A: A.min(), lambda S: S.min()),
        "logsumexp(d)": (lambda A: torch.logsumexp(A, sd), lambda S: torch.logsumexp(S, 0)),
        "var()": (torch.var, torch.var),
        "var(d, correction=0)": (
            lambda A: A.var(sd, correction=0),
            lambda S: S.var(0, correction=0),
        ),
        "std(unbiased=False)": (lambda A: torch.std(A, False), lambda S: torch.std(S, False)),
        "std(d, keepdim)": (
            lambda A: A.std(sd, keepdim=True),
            lambda S: S.std(0).reshape((1,) * n + S.shape[1:]),
        ),
        "norm()": (lambda A: A.norm(), lambda S: S.norm()),
        "norm(p=1)": (lambda A: torch.norm(A, 1), lambda S: torch.norm(S, 1)),
        "norm(p=3, d)": (lambda A: torch.norm(A, 3, sd), lambda S: torch.norm(S, 3, 0)),
        "vector_norm(0.5)": (
            lambda A: torch.linalg.vector_norm(A, 0.5),
            lambda S: torch.linalg.vector_norm(S, 0.5),
        ),
        "vector_norm(inf)": (
            lambda A: torch.linalg.vector_norm(A, INF),
            lambda S: torch.linalg.vector_norm(S, INF),
        ),
        "vector_norm(-inf, d)": (
            lambda A: torch.linalg.vector_norm(A, -INF, sd),
            lambda S: torch.linalg.vector_norm(S, -INF, 0),
        ),
        "vector_norm(0)": (
            lambda A: torch.linalg.vector_norm(A, 0),
            lambda S: torch.linalg.vector_norm(S, 0),
        ),
    }


OPS2 = _ops((0, 1), 2)
FILLS = [0.0, 2.5, NAN, INF, -INF, "indefinite"]


def _case_kw(layout):
    return (
        dict(layout=CSR)
        if layout == "csr"
        else dict(uncoalesced=True)
        if layout == "uncoalesced"
        else {}
    )


@pytest.mark.parametrize("fill", FILLS, ids=str)
@pytest.mark.parametrize("layout", ["coo", "csr", "uncoalesced"])
@pytest.mark.parametrize("op", sorted(OPS2))
def test_gradients_match_dense(op, layout, fill):
    fn, masked = OPS2[op]
    check(Case((6, 5), fill, **_case_kw(layout)), fn, masked)


@pytest.mark.parametrize("fill", [0.0, -1.5, INF, "indefinite"], ids=str)
@pytest.mark.parametrize("op", sorted(OPS2))
def test_float32(op, fill):
    fn, masked = OPS2[op]
    check(Case((6, 5), fill, dtype=torch.float32), fn, masked)
    check(Case((6, 5), fill, dtype=torch.float32, layout=CSR, seed=2), fn, masked)


HYB = _ops((0, 1), 2)
HYB.update(
    {  # dense dims reduced too
        "sum(all dims)": (lambda A: A.sum((0, 1, 2)), lambda S: S.sum((0, 1))),
        "amax(2, 0, 1)": (lambda A: A.amax((2, 0, 1)), lambda S: S.amax((1, 0))),
        "logsumexp(-1, 0, 1, keepdim)": (
            lambda A: torch.logsumexp(A, (-1, 0, 1), True),
            lambda S: torch.logsumexp(S, (0, 1)).reshape(1, 1, 1),
        ),
        "var(all dims)": (lambda A: A.var((0, 1, 2)), lambda S: S.var((0, 1))),
        "norm(inf, all dims)": (
            lambda A: torch.linalg.vector_norm(A, INF, (0, 1, 2)),
            lambda S: torch.linalg.vector_norm(S, INF, (0, 1)),
        ),
        "mean(all dims, keepdim)": (
            lambda A: A.mean((0, 1, 2), True),
            lambda S: S.mean((0, 1)).reshape(1, 1, 1),
        ),
    }
)
HYB.pop("prod()")  # prod over a dense dim too: not routed (test_not_routed)


@pytest.mark.parametrize("fill", [0.0, 1.5, "array", NAN, "indefinite"], ids=str)
@pytest.mark.parametrize("op", sorted(HYB))
def test_hybrid(op, fill):
    """Sparse dims (6, 4), a dense dim of 3: an array fill's gradient keeps the dense dim."""
    fn, masked = HYB[op]
    check(Case((6, 4, 3), fill, dense_dim=1, nse=5), fn, masked)
    check(Case((6, 4, 3), fill, dense_dim=1, nse=4, uncoalesced=True, seed=3), fn, masked)


@pytest.mark.parametrize("fill", [0.0, 2.0, "array", "indefinite"], ids=str)
def test_hybrid_prod_over_the_sparse_dim(fill):
    check(
        Case((5, 3), fill, dense_dim=1, nse=3),
        lambda A: torch.prod(A, 0),
        lambda S: torch.prod(S, 0),
    )


OPS1 = _ops((0,), 1)


@pytest.mark.parametrize("op", sorted(OPS1))
def test_empty(op):
    """No stored element: every element is the fill."""
    fn, _ = OPS1[op]
    check(Case((7,), 1.5, nse=0), fn)
    check(Case((4, 3), -0.5, nse=0, layout=CSR), OPS2[op][0])


@pytest.mark.parametrize(
    "op",
    [
        "sum()",
        "mean()",
        "nansum()",
        "nanmean(d)",
        "prod()",
        "logsumexp(d)",
        "var()",
        "norm()",
        "sum(d, keepdim)",
    ],
)
def test_zero_size(op):
    fn, _ = OPS2[op]
    check(Case((0, 5), 2.0, nse=0), fn)
    check(Case((3, 0), 2.0, nse=0, layout=CSR), fn)


@pytest.mark.parametrize(
    "op",
    [
        "sum()",
        "mean()",
        "amax()",
        "max()",
        "prod()",
        "var()",
        "std(unbiased=False)",
        "norm()",
        "logsumexp(d)",
    ],
)
def test_zero_d_and_fully_stored(op):
    """A 0-d SparseTensor (one stored element or none) and a 1-d one storing every element (no fill)."""
    fn = OPS1[op][0] if op != "logsumexp(d)" else (lambda A: torch.logsumexp(A, ()))
    if op != "logsumexp(d)":
        check(Case((), 1.5, nse=1), fn)
        check(Case((), 1.5, nse=0), fn)
    check(Case((4,), 1.5, nse=4), OPS1[op][0])


@pytest.mark.parametrize(
    "op",
    ["amax()", "amin(d, keepdim)", "max()", "min()", "vector_norm(inf)", "vector_norm(-inf, d)"],
)
@pytest.mark.parametrize("values", [[2.0, 2.0, -1.0], [-2.0, 5.0, 5.0], [NAN, 2.0, 5.0]], ids=str)
def test_ties_split_as_torch(op, values):
    """Maxima among stored elements and the fill (fill 2: 6 unspecified elements of value 2): torch's rule,
    evenly among the maxima (``amax``: ``G / count`` at each; a NaN result: NaN (amax), its NaNs (max))."""
    fn, masked = OPS1[op]
    for fill in (2.0, -2.0, "indefinite"):
        check(Case((9,), fill, nse=3, values=values), fn, masked)


@pytest.mark.parametrize("fill", [0.0, 3.0], ids=str)
@pytest.mark.parametrize("values", [[0.0, 2.0, 4.0], [0.0, 0.0, 4.0], [1.0, 2.0, 4.0]], ids=str)
def test_prod_with_zeros(values, fill):
    """Zeros among the stored elements and the fill: the product of the others, exactly."""
    check(Case((4,), fill, nse=3, values=values), torch.prod)
    check(Case((3,), fill, nse=3, values=values), torch.prod)  # no unspecified element
    check(Case((5,), fill, nse=3, values=values), torch.prod)


@pytest.mark.parametrize("fill", [0.0, 3.0, "indefinite"], ids=str)
@pytest.mark.parametrize("correction", [1, 2, 5])
def test_var_with_no_degrees_of_freedom(correction, fill):
    """``n <= correction``: torch's ``inf``/``NaN`` gradients (no dim: NaN where x == mean, else inf)."""
    for fn in (
        lambda A: A.var(correction=correction),
        lambda A: A.var(0, correction=correction),
        lambda A: A.std(correction=correction),
    ):
        check(Case((2,), fill, nse=1), fn, fn)
        check(Case((2,), fill, nse=2, values=[1.0, 1.0]), fn, fn)


@pytest.mark.parametrize("fill", [0.0, 5.0, NAN, "indefinite"], ids=str)
@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize(
    "chain",
    [
        "(A * 1.).sum()",
        "exp(-0.1 * A).mean()",
        "exp(A).sum()",
        "exp(A).mean()",
        "square().sum()",
        "relu(A - 1).amax()",
        "(A * A).logsumexp()",
    ],
)
def test_through_elementwise_ops(chain, layout, fill):
    """The reduced SparseTensor computed by element-wise ops: their backward (torch's formulas through
    ``__torch_dispatch__``) consumes the SparseTensor gradient natively."""
    fn = {
        "(A * 1.).sum()": lambda A: (A * 1.0).sum(),
        "exp(-0.1 * A).mean()": lambda A: torch.exp(-0.1 * A).mean(),
        "exp(A).sum()": lambda A: torch.exp(A).sum(),
        "exp(A).mean()": lambda A: torch.exp(A).mean(),
        "square().sum()": lambda A: A.square().sum(),
        "relu(A - 1).amax()": lambda A: torch.relu(A - 1).amax(),
        "(A * A).logsumexp()": lambda A: torch.logsumexp(A * A, tuple(range(A.dim()))),
    }[chain]
    check(Case((6, 5), fill, **_case_kw(layout)), fn, fn)


def test_gradient_is_a_sparse_tensor_on_the_pattern():
    """The gradient reaching ``A``: a SparseTensor with ``A``'s pattern and layout, its fill the gradient of
    every unspecified element (``mean``: ``G / numel``)."""
    for layout in (COO, CSR):
        case = Case((6, 5), 2.5, layout=layout)
        v, f = case.leaves()
        A = case.build(v, f)
        seen = []
        A.register_hook(seen.append)
        (A.mean() * 3).backward()
        (G,) = seen
        assert isinstance(G, SparseTensor) and G.sparse_layout is layout and G._nse() == A._nse()
        torch.testing.assert_close(G.to_dense(), torch.full((6, 5), 0.1, dtype=torch.float64))
        torch.testing.assert_close(G._fill_value(), torch.tensor(0.1, dtype=torch.float64))


def test_gradcheck():
    for case in (Case((6, 5), 1.5, uncoalesced=True), Case((6, 4, 3), "array", dense_dim=1, nse=4)):
        v, f = case.leaves()
        for fn in (
            lambda A: A.sum(),
            lambda A: A.mean(),
            lambda A: torch.logsumexp(A, (0, 1)),
            lambda A: A.var(),
            lambda A: A.norm(),
            lambda A: torch.linalg.vector_norm(A, 3),
        ):
            assert torch.autograd.gradcheck(lambda v, f: fn(case.build(v, f)), (v, f))
    ind = Case((6, 5), "indefinite", layout=CSR)
    v, _ = ind.leaves()
    assert torch.autograd.gradcheck(lambda v: ind.build(v, None).std(), (v,))


def test_not_routed():
    """``prod`` over a dense dim, a SparseTensor that needs no gradient,
    grad mode off, and a reduction keeping a sparse dim of a definite-fill SparseTensor computed by other
    ops (its gradient varies over the unspecified elements and may be read there): torch's path (exact)."""
    case = Case((6, 5), 2.5)
    v, f = case.leaves()
    A = case.build(v, f)
    assert not _routed(A.flip(0).sum(1))
    sel = torch.tensor(
        [1, 0, 2, 3, 4, 4]
    )  # a row selection passes the pattern gradient on (index_autograd)
    out = A[sel].sum(1)
    assert _routed(out)
    got = torch.autograd.grad(out.to_dense().sum(), (v, f))
    want = torch.autograd.grad(A.to_dense()[sel].sum(1).sum(), (v, f))
    torch.testing.assert_close(got, want)
    assert routed(A.max(0).values, "SparseSelectBackward") and _routed(A.prod(1))
    assert _routed((A * 2).sum(1)) and _routed(
        torch.exp(A).amax(0)
    )  # element-wise ops: a uniform derivative
    assert _routed(A.sum(1)) and _routed(A.coalesce().to_sparse_csr().logsumexp(0))
    H = Case((5, 3), 2.0, dense_dim=1, nse=3)
    assert not _routed(torch.prod(H.build(*H.leaves()), 1))
    assert not _routed(case.build(case.values, case.fill).sum())
    with torch.no_grad():
        assert A.sum().grad_fn is None
    perm = torch.tensor([1, 0, 2, 3, 4, 5])
    out = A[perm].sum(0).sum()  # through torch's path, the gradients are still exact
    out.backward()
    vd, fd = case.leaves()
    case.build(vd, fd).to_dense()[perm].sum(0).sum().backward()
    torch.testing.assert_close((v.grad, f.grad), (vd.grad, fd.grad))


# reductions keeping a sparse dim: name -> (fn on A, fn on the dense masked reference: (x, mask))
PARTIAL = {
    "sum(1)": (lambda A: A.sum(1), lambda x, m: torch.masked.sum(x, 1, mask=m)),
    "sum(0, keepdim)": (
        lambda A: A.sum(0, keepdim=True),
        lambda x, m: torch.masked.sum(x, 0, keepdim=True, mask=m),
    ),
    "mean(0)": (lambda A: A.mean(0), lambda x, m: torch.masked.mean(x, 0, mask=m)),
    "nansum(1)": (lambda A: A.nansum(1), None),
    "nanmean(0)": (lambda A: torch.nanmean(A, 0), None),
    "amax(1)": (lambda A: A.amax(1), lambda x, m: torch.masked.amax(x, 1, mask=m)),
    "amin(0, keepdim)": (
        lambda A: A.amin(0, True),
        lambda x, m: torch.masked.amin(x, 0, keepdim=True, mask=m),
    ),
    "logsumexp(1)": (
        lambda A: torch.logsumexp(A, 1),
        lambda x, m: torch.masked.logsumexp(x, 1, mask=m),
    ),
    "var(1)": (lambda A: A.var(1), lambda x, m: torch.masked.var(x, 1, mask=m)),
    "std(0, correction=0)": (
        lambda A: A.std(0, correction=0),
        lambda x, m: torch.masked.std(x, 0, unbiased=False, mask=m),
    ),
    "norm(dim=1)": (lambda A: A.norm(dim=1), lambda x, m: torch.masked.norm(x, 2.0, 1, mask=m)),
    "vector_norm(inf, 0)": (lambda A: torch.linalg.vector_norm(A, INF, 0), None),
    "vector_norm(3, 1)": (lambda A: torch.linalg.vector_norm(A, 3, 1), None),
    "prod(1)": (lambda A: A.prod(1), lambda x, m: torch.masked.prod(x, 1, mask=m)),
    "prod(0, keepdim)": (
        lambda A: torch.prod(A, 0, True),
        lambda x, m: torch.masked.prod(x, 0, keepdim=True, mask=m),
    ),
}


@pytest.mark.parametrize("fill", [0.0, 2.5, NAN, -INF], ids=str)
@pytest.mark.parametrize("layout", ["coo", "csr", "uncoalesced"])
@pytest.mark.parametrize("op", sorted(PARTIAL))
def test_partial_reductions(op, layout, fill):
    """Some sparse dims kept: the gradient reaching the constructor (exact at the pattern, the mean over the
    unspecified elements as the fill: what the constructor reads) equals the dense one; empty slices and
    slices with stored elements both."""
    fn, _ = PARTIAL[op]
    check(Case((6, 5), fill, **_case_kw(layout), nse=8), fn)
    check(Case((6, 5), fill, **_case_kw(layout), nse=0), fn)


@pytest.mark.parametrize("fill", [0.0, 1.5, "array"], ids=str)
@pytest.mark.parametrize("op", sorted(PARTIAL))
def test_partial_reductions_hybrid_and_3d(op, fill):
    fn, _ = PARTIAL[op]
    check(Case((6, 5, 3), fill, dense_dim=1, nse=7), fn)
    if fill != "array":
        check(Case((4, 3, 5), fill, nse=9, uncoalesced=True), fn)
        check(Case((4, 3, 5), fill, nse=9, dtype=torch.float32), fn)


@pytest.mark.parametrize("op", sorted(op for op in PARTIAL if PARTIAL[op][1] is not None))
@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_partial_reductions_indefinite(op, layout):
    """Masked semantics: against ``torch.masked`` on the 0-filled dense tensor with the pattern as mask (the
    slices with no stored element are masked out in both: not compared, no gradient)."""
    fn, ref = PARTIAL[op]
    case = Case((6, 5), "indefinite", nse=12, **_case_kw(layout))
    v, _ = case.leaves()
    out = fn(case.build(v, None))
    assert _routed(out)
    d0, d1 = out.to_dense(fill_value=0.0).detach(), out.to_dense(fill_value=1.0).detach()
    spec = (d0 == d1) | d0.isnan()  # the specified outputs (NaN ones too)
    W = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1))
    (out.to_dense(fill_value=0.0) * W).sum().backward()
    vd = case.values.clone().requires_grad_()
    A = case.build(vd, None)
    mask = ~torch.isnan(A.detach().to_dense(fill_value=NAN))
    r = ref(A.to_dense(fill_value=0.0), mask)
    torch.testing.assert_close(d0, torch.where(spec, r, 0.0).detach(), equal_nan=True)
    (torch.where(spec, r, 0.0) * W).sum().backward()
    keep = slice(None)
    if op in (
        "var(1)",
        "std(0, correction=0)",
    ):  # a slice of one element: torch.var's rule gives NaN (inf * 0),
        d = 1 if op == "var(1)" else 0  # torch.std's 0 (std == 0), torch.masked's composites differ
        keep = mask.sum(d)[case.idx[1 - d]] > 1
    torch.testing.assert_close(v.grad[keep], vd.grad[keep], equal_nan=True)


def test_errors_come_from_the_forward():
    """Bad arguments raise torch's own errors (the forward runs the reduction as it is)."""
    case = Case((6, 5), 2.5)
    A = case.build(*case.leaves())
    with pytest.raises(IndexError):
        A.sum(2)
    with pytest.raises(TypeError):
        A.sum(keepdims=True, bogus=1)
    with pytest.raises(RuntimeError):
        Case((0,), 1.0, nse=0).build(*Case((0,), 1.0, nse=0).leaves()).amax()


@pytest.mark.parametrize("fill", [0.0, 5.0, NAN, "indefinite"], ids=str)
@pytest.mark.parametrize("layout", [COO, CSR], ids=["coo", "csr"])
@pytest.mark.parametrize(
    "chain",
    [
        "(A * 1.).sum()",
        "exp(-0.1 * A).mean()",
        "exp(A).mean()",
        "A.amax()",
        "A.var()",
        "A.norm()",
        "logsumexp",
        "A.prod()",
        "nanmean",
    ],
)
def test_no_temporary_of_the_input_size(chain, layout, fill):
    """(300, 400) with 60 stored elements: nothing of 120k elements is made, forward or backward, and the
    backward runs under a densify policy that raises past 64 kB."""
    fn = {
        "(A * 1.).sum()": lambda A: (A * 1.0).sum(),
        "exp(-0.1 * A).mean()": lambda A: torch.exp(-0.1 * A).mean(),
        "exp(A).mean()": lambda A: torch.exp(A).mean(),
        "A.amax()": lambda A: A.amax(),
        "A.var()": torch.var,
        "A.norm()": lambda A: A.norm(),
        "logsumexp": lambda A: torch.logsumexp(A, (0, 1)),
        "A.prod()": lambda A: (A * 0.999).prod(),
        "nanmean": torch.nanmean,
    }[chain]
    case = Case((300, 400), fill, layout=layout, nse=60)
    v, f = case.leaves()
    with _Sizes() as rec:
        out = fn(case.build(v, f))
        with sparsefill.densify_policy("raise", limit_bytes=1 << 16):
            out.backward()
    assert _routed(out)
    assert v.grad is not None and (f is None or f.grad is not None)
    assert rec.largest < 300 * 400 // 20, rec.largest


SLICES = {  # name: (shape, dense_dim, fn)
    "x[:4].sum()": ((10,), 0, lambda A: A[:4].sum()),
    "x[2:9:3].exp().sum()": ((10,), 0, lambda A: A[2:9:3].exp().sum()),
    "A[1:5:2].sum()": ((6, 5), 0, lambda A: A[1:5:2].sum()),
    "A[:, 1:4].amax()": ((6, 5), 0, lambda A: A[:, 1:4].amax()),
    "A[3].mean()": ((6, 5), 0, lambda A: A[3].mean()),
    "(A[1:3] * 2)": ((6, 5), 0, lambda A: A[1:3] * 2),
    "A.narrow(1, 1, 3).sum()": ((6, 5), 0, lambda A: A.narrow(1, 1, 3).sum()),
    "split(2)": ((6, 5), 0, lambda A: sum(t.sum() for t in A.split(2))),
    "H[..., 1:].sum()": ((6, 5, 3), 1, lambda A: A[..., 1:].sum()),
    "H[2].sum()": ((6, 5, 3), 1, lambda A: A[2].sum()),
    "H[1:4, :, ::2].var()": ((6, 5, 3), 1, lambda A: A[1:4, :, ::2].var()),
    "H4[:, :, :, 1].sum()": ((6, 5, 4, 3), 2, lambda A: A[:, :, :, 1].sum()),
    "A[:, 3].sum()": ((6, 5), 0, lambda A: A[:, 3].sum()),
    "A.select(1, 2).exp().sum()": ((6, 5), 0, lambda A: A.select(1, 2).exp().sum()),
    "H[:, :, 1].sum()": ((6, 5, 3), 1, lambda A: A[:, :, 1].sum()),
    "(2*H)[..., 2].var()": ((6, 5, 3), 1, lambda A: (2 * A)[..., 2].var()),
    "H4[:, :, 1].sum()": ((6, 5, 4, 3), 2, lambda A: A[:, :, 1].sum()),
}


LINEAR = {
    "x[:4].sum()",
    "A[1:5:2].sum()",
    "(A[1:3] * 2)",
    "A.narrow(1, 1, 3).sum()",
    "split(2)",
    "H[..., 1:].sum()",
    "H[2].sum()",
    "H4[:, :, :, 1].sum()",
    "A[:, 3].sum()",
    "H[:, :, 1].sum()",
    "H4[:, :, 1].sum()",
}  # where an indefinite fill's masked reference is the 0-filled one


def _slice_params():
    for op, (shape, dd, _) in sorted(SLICES.items()):
        for layout in ["coo", "csr"] if len(shape) - dd >= 2 else ["coo"]:
            for fill in (
                [0.0, 2.5, NAN]
                + (["array"] if dd else [])
                + (["indefinite"] if op in LINEAR else [])
            ):
                yield op, layout, fill


def _dense_out(out):
    return (
        out
        if not isinstance(out, SparseTensor)
        else out.to_dense(fill_value=0.0)
        if out.is_fill_indefinite()
        else out.to_dense()
    )


@pytest.mark.parametrize("op, layout, fill", list(_slice_params()), ids=str)
def test_slice_and_select_backward(op, layout, fill):
    """``slice_backward``/``select_backward`` of a SparseTensor gradient (``ops/shape/indexing.py``): ``G`` in zeros
    of the input's shape, as a SparseTensor, never densified (a DensifyWarning is an error here); an
    indefinite fill against the 0-filled dense computation (sums: the masked sum)."""
    shape, dd, fn = SLICES[op]
    case = Case(shape, fill, dense_dim=dd, nse=5, **_case_kw(layout))
    v, f = case.leaves()
    out = fn(case.build(v, f))
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        _dense_out(out).sum().backward()
    got = (v.grad, None if f is None else f.grad)
    v, f = case.leaves()
    A = case.build(v, f)
    fn(A.to_dense(fill_value=0.0) if case.indefinite else A.to_dense()).sum().backward()
    torch.testing.assert_close(got, (v.grad, None if f is None else f.grad), equal_nan=True)


@pytest.mark.parametrize("fill", [0.0, 5.0, "indefinite"], ids=str)
@pytest.mark.parametrize("op", ["A[:, 7].sum()", "H[:, :, 1].sum()"])
def test_select_at_the_first_dense_dim_position_has_no_temporary_of_the_input_size(op, fill):
    """``select_backward`` along ``G``'s first dense dim position (the input's last sparse dim, or its first
    dense dim): a sparse dim there, read by the constructor with the input's dense dims; (2000, 500) and
    (300, 400, 4) with 50 stored: nothing of the input's size is made, the gradients are exact."""
    shape, dd = ((2000, 500), 0) if op.startswith("A") else ((300, 400, 4), 1)
    case = Case(shape, fill, dense_dim=dd, nse=50)
    fn = (lambda A: A[:, 7].sum()) if dd == 0 else (lambda A: A[:, :, 1].sum())
    v, f = case.leaves()
    with _Sizes() as rec:
        out = fn(case.build(v, f))
        with sparsefill.densify_policy("raise", limit_bytes=1 << 16):
            out.backward()
    assert rec.largest < 100_000, rec.largest
    vd, fd = case.leaves()
    A = case.build(vd, fd)
    fn(A.to_dense(fill_value=0.0) if case.indefinite else A.to_dense()).backward()
    torch.testing.assert_close(
        (v.grad, None if f is None else f.grad), (vd.grad, None if fd is None else fd.grad)
    )


@pytest.mark.parametrize("fill", [0.0, 5.0, "indefinite"], ids=str)
def test_slice_backward_has_no_temporary_of_the_input_size(fill):
    """``x[:100].sum()`` on 1M elements with 50 stored: the gradient stores at most the slice's 100 elements."""
    case = Case((1_000_000,), fill, nse=50)
    v, f = case.leaves()
    with _Sizes() as rec:
        out = case.build(v, f)[:100].sum()
        with sparsefill.densify_policy("raise", limit_bytes=1 << 16):
            out.backward()
    assert rec.largest <= 1000, rec.largest
    in_slice = case.idx[0] < 100
    torch.testing.assert_close(v.grad, in_slice.to(v.dtype))
    if f is not None:
        torch.testing.assert_close(
            f.grad, torch.tensor(100.0 - int(in_slice.sum()), dtype=torch.float64)
        )


@pytest.mark.parametrize("fill", [0.0, 5.0, "indefinite"], ids=str)
@pytest.mark.parametrize("layout", [COO, CSR], ids=["coo", "csr"])
@pytest.mark.parametrize(
    "op", ["sum(1)", "mean(0)", "amax(1)", "logsumexp(1)", "var(1)", "norm(dim=1)", "prod(1)"]
)
def test_partial_reductions_have_no_temporary_of_the_input_size(op, layout, fill):
    """(300, 400) with 60 stored elements, a row or column reduction: nothing of 120k elements is made."""
    case = Case((300, 400), fill, layout=layout, nse=60)
    v, f = case.leaves()
    with _Sizes() as rec:
        out = PARTIAL[op][0](case.build(v, f))
        with sparsefill.densify_policy("raise", limit_bytes=1 << 16):
            (out.to_dense(fill_value=0.0) if case.indefinite else out.to_dense()).sum().backward()
    assert _routed(out)
    assert rec.largest < 300 * 400 // 20, rec.largest


@pytest.mark.parametrize("fill", [0.0, 2.5, NAN], ids=str)
@pytest.mark.parametrize("layout", ["coo", "csr", "uncoalesced"])
@pytest.mark.parametrize(
    "chain",
    [
        "(2*A).sum(1)",
        "exp(A).amax(0)",
        "(A+A*A).mean(0)",
        "(A*s).var(1)",
        "sigmoid(A).logsumexp(1)",
        "(2*A).t().sum(1)",
    ],
)
def test_partial_reductions_of_computed_tensors(chain, layout, fill):
    """A reduction keeping a sparse dim of a definite-fill tensor computed by element-wise ops (a derivative
    the same at every unspecified element) is routed; the gradients equal the dense ones."""
    s = torch.tensor(1.5, dtype=torch.float64)
    fn = {
        "(2*A).sum(1)": lambda A: (2 * A).sum(1),
        "exp(A).amax(0)": lambda A: torch.exp(A).amax(0),
        "(A+A*A).mean(0)": lambda A: (A + A * A).mean(0),
        "(A*s).var(1)": lambda A: (A * s).var(1),
        "sigmoid(A).logsumexp(1)": lambda A: torch.sigmoid(A).logsumexp(1),
        "(2*A).t().sum(1)": lambda A: (2 * A).t().sum(1),
    }[chain]
    check(Case((6, 5), fill, **_case_kw(layout), nse=8), fn)


@pytest.mark.parametrize("fill", [0.0, 5.0], ids=str)
@pytest.mark.parametrize("layout", [COO, CSR], ids=["coo", "csr"])
def test_partial_reduction_of_a_computed_tensor_has_no_temporary_of_the_input_size(layout, fill):
    case = Case((300, 400), fill, layout=layout, nse=60)
    v, f = case.leaves()
    with _Sizes() as rec:
        out = torch.exp(-0.1 * case.build(v, f)).sum(1)
        with sparsefill.densify_policy("raise", limit_bytes=1 << 16):
            out.to_dense().sum().backward()
    assert _routed(out)
    assert rec.largest < 300 * 400 // 20, rec.largest


def _max_min_out(r):
    """``(values as dense, indices)`` of a ``max``/``min`` with a dim."""
    return _dense_out(r.values), r.indices


def _max_min_params():
    for op in [
        "max(0)",
        "max(1, keepdim)",
        "min(-1)",
        "min(0, keepdim)",
        "max(1) hybrid",
        "Tensor.min(dim=0) 3d",
    ]:
        for layout in ["coo", "uncoalesced"] + (
            [] if op.endswith(("hybrid", "3d")) else ["csr"]
        ):  # (CSR: 2-d)
            for fill in [0.0, 5.0, -5.0, NAN]:  # (indefinite: the forward is not native)
                yield op, layout, fill


@pytest.mark.parametrize("op, layout, fill", list(_max_min_params()), ids=str)
def test_max_min_with_a_dim(op, layout, fill):
    """``max``/``min`` with a dim over a sparse dim (values and indices): the gradient of the values goes to the
    selected element, exact at the pattern, the rest summed into the fill's gradient; against dense."""
    hybrid, three = op.endswith("hybrid"), op.endswith("3d")
    shape, dd = ((6, 5, 3), 1) if hybrid else ((4, 3, 5), 0) if three else ((6, 5), 0)
    fn = {
        "max(0)": lambda A: torch.max(A, 0),
        "max(1, keepdim)": lambda A: A.max(1, keepdim=True),
        "min(-1)": lambda A: A.min(-1),
        "min(0, keepdim)": lambda A: torch.min(A, 0, True),
        "max(1) hybrid": lambda A: A.max(1),
        "Tensor.min(dim=0) 3d": lambda A: A.min(dim=0),
    }[op]
    case = Case(shape, fill, dense_dim=dd, nse=9, **_case_kw(layout))
    v, f = case.leaves()
    r = fn(case.build(v, f))
    assert routed(r.values, "SparseSelectBackward")
    vals, ind = _max_min_out(r)
    W = torch.randn(vals.shape, dtype=vals.dtype, generator=torch.Generator().manual_seed(1))
    (vals * W).sum().backward()
    vd, fd = case.leaves()
    A = case.build(vd, fd)
    rd = fn(A.to_dense())
    torch.testing.assert_close(vals, rd.values, equal_nan=True)
    torch.testing.assert_close(ind, rd.indices)
    (rd.values * W).sum().backward()
    torch.testing.assert_close(f.grad, fd.grad, equal_nan=True)
    torch.testing.assert_close(v.grad, vd.grad, equal_nan=True)


@pytest.mark.parametrize("fill", [0.0, 5.0], ids=str)
@pytest.mark.parametrize("layout", [COO, CSR], ids=["coo", "csr"])
def test_max_min_with_a_dim_have_no_temporary_of_the_input_size(layout, fill):
    case = Case((300, 400), fill, layout=layout, nse=60)
    v, f = case.leaves()
    with _Sizes() as rec:
        r, s = case.build(v, f).max(1), case.build(v, f).min(0, keepdim=True)
        with sparsefill.densify_policy("raise", limit_bytes=1 << 16):
            (_dense_out(r.values).sum() + _dense_out(s.values).sum()).backward()
    assert rec.largest < 300 * 400 // 20, rec.largest


@pytest.mark.parametrize("fill", [0.0, 3.0, INF], ids=str)
@pytest.mark.parametrize(
    "values",
    [
        [0.0, 2.0, 4.0, 1.5, -1.0, 3.0],
        [0.0, 0.0, 4.0, 1.5, 0.0, 3.0],
        [1.0, 2.0, 4.0, 1.5, -1.0, INF],
    ],
    ids=str,
)
@pytest.mark.parametrize("op", ["prod(0)", "prod(1)"])
def test_partial_prod_with_zeros_and_inf(op, values, fill):
    """``prod`` keeping a sparse dim: ``G * Y / x`` without a 0 in the input (torch's rule), the products of
    the others (no division) with one; zeros stored, zero fills, several zeros in a slice, inf."""
    fn = {"prod(0)": lambda A: A.prod(0), "prod(1)": lambda A: A.prod(1)}[op]
    check(Case((4, 3), fill, nse=6, values=values), fn)


DENSE_DIM = {  # reductions over dense dims only of a (6, 5, 3) hybrid (2 sparse dims)
    "amax(-1)": lambda A: A.amax(-1),
    "amin(2, keepdim)": lambda A: A.amin(2, True),
    "sum(-1)": lambda A: A.sum(-1),
    "mean(2)": lambda A: torch.mean(A, 2),
    "logsumexp(-1)": lambda A: A.logsumexp(-1),
    "var(-1)": lambda A: A.var(-1),
    "norm(dim=-1)": lambda A: A.norm(dim=-1),
    "vector_norm(inf, -1)": lambda A: torch.linalg.vector_norm(A, INF, -1),
    "exp(2*A).amax(-1)": lambda A: torch.exp(2 * A).amax(-1),
}


@pytest.mark.parametrize("fill", [0.0, "array", NAN, "indefinite"], ids=str)
@pytest.mark.parametrize("layout", ["coo", "csr", "uncoalesced"])
@pytest.mark.parametrize("op", sorted(DENSE_DIM))
def test_reductions_over_a_dense_dim(op, layout, fill):
    """``A.amax(-1)`` over a dense dim of a hybrid: torch's formula on each stored slice and on the fill's; the
    gradients equal the dense ones (an indefinite fill: the 0-filled dense tensor, whose rows that are
    masked out hold no leaf value)."""
    fn = DENSE_DIM[op]
    case = Case((6, 5, 3), fill, dense_dim=1, nse=7, uncoalesced=layout == "uncoalesced")
    build = (
        case.build if layout != "csr" else lambda v, f: case.build(v, f).to_sparse_csr(dense_dim=1)
    )
    v, f = case.leaves()
    A = build(v, f)
    assert A.sparse_layout is (CSR if layout == "csr" else COO) and A.dense_dim() == 1
    out = fn(A)
    assert _routed(out)
    W = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1))
    (_dense_out(out) * W).sum().backward()
    vd, fd = case.leaves()
    A = build(vd, fd)
    ref = fn(A.to_dense(fill_value=0.0) if case.indefinite else A.to_dense())
    (torch.where(torch.isnan(ref), 0.0, ref) * W if case.indefinite else ref * W).sum().backward()
    torch.testing.assert_close(v.grad, vd.grad, equal_nan=True)
    if f is not None:
        torch.testing.assert_close(f.grad, fd.grad, equal_nan=True)


@pytest.mark.parametrize("fill", [0.0, 5.0, "indefinite"], ids=str)
@pytest.mark.parametrize("op", ["amax(-1)", "logsumexp(-1)", "var(-1)"])
def test_reductions_over_a_dense_dim_have_no_temporary_of_the_input_size(op, fill):
    """(300, 400, 4) with 60 stored rows: nothing of 480k elements is made, forward or backward."""
    case = Case((300, 400, 4), fill, dense_dim=1, nse=60)
    v, f = case.leaves()
    with _Sizes() as rec:
        out = DENSE_DIM[op](case.build(v, f))
        with sparsefill.densify_policy("raise", limit_bytes=1 << 16):
            out.sum((0, 1)).sum().backward()
    assert _routed(out)
    assert rec.largest < 300 * 400, rec.largest
