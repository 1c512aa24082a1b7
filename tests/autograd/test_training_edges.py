"""Training edge cases of the sparse backwards: never silently wrong, never a crash.

Each test builds ``A`` from leaves ``(values, fill)`` and checks, against the same computation on
``A.to_dense()`` (an indefinite fill: ``torch.masked`` or the masked-out elements at +-inf / 0), the forward
and the gradients of ``values`` and ``fill``::

    grad(values, fill) of L(op(A)) == grad(values, fill) of L(op(A.to_dense()))     (equal_nan)

1. ``masked.normalize`` of a fill-0 tensor (softmax of a -inf fill...) with ``mask=None``: the backward keeps
   the pattern (no densifying under a raising policy; a leaf's, dense by nature, passes the gate);
2. ``var_mean``/``std_mean`` of computed tensors, partial and full, and reductions over sparse and dense dims
   keeping a sparse dim: routed, exact;
3. ``logsumexp`` of a hybrid CSR over a dense dim: a SparseTensor of its layout, as for COO;
4. ``max``/``min``/``argmax``/``argmin`` with a dim of an indefinite fill (as ``torch.masked``), and over a
   dense dim of a hybrid (routed, no densifying);
5. an ``inf`` in the upstream gradient (or in the dense operand of a product) gives the fill the gradient
   the dense computation gives (``inf``, not a NaN from ``inf - inf``);
6. a torch native sparse leaf's ``.grad`` is a native sparse tensor of its layout, equal to the dense one;
7. a second backward is exact, or raises torch's ``once_differentiable`` error (never silently constant).
"""

from __future__ import annotations

import pytest
import torch

import sparsefill
from tests.ops.reductions.test_backward_reductions import Case as RCase, _case_kw, _dense_out
from tests.ops.linalg.test_backward_sparse import Case as MCase, _routed

NAN, INF = float("nan"), float("inf")
COO, CSR = torch.sparse_coo, torch.sparse_csr


def _dense(t):
    return _dense_out(t) if isinstance(t, sparsefill.SparseTensor) else t


def _specified(A):
    """Where a SparseTensor with an indefinite fill specifies its elements (dense bool)."""
    return ~torch.isnan(A.to_dense(fill_value=NAN))


def _grads_with(case, fn, W, dense):
    """Gradients of the leaves through ``(fn(A) * W).sum()``."""
    v, f = case.leaves()
    A = case.build(v, f)
    out = fn(A.to_dense() if dense else A)
    (_dense(out) * W).sum().backward()
    return _dense(out), v.grad, f.grad


def _inf_weights(shape, where, sign=1.0):
    W = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    W.view(-1)[list(where)] = sign * INF
    return W


# ---------------------------------------------------------------------- 5. inf in the upstream gradient
INF_REDUCTIONS = {  # name: (shape, dense_dim, fn, positions of the output that get an inf weight)
    "sum(1)": ((6, 5), 0, lambda A: A.sum(1), (0, 3)),
    "mean(0)": ((6, 5), 0, lambda A: A.mean(0), (1,)),
    "sum(0) keepdim": ((6, 5), 0, lambda A: A.sum(0, keepdim=True), (2, 4)),
    "sum(-1) hybrid": ((6, 5, 3), 1, lambda A: A.sum(-1), (0, 7, 29)),
    "mean(-1) hybrid": ((6, 5, 3), 1, lambda A: A.mean(-1), (3,)),
    "max(1)": ((6, 5), 0, lambda A: A.max(1).values, (0, 2, 5)),
    "min(0)": ((6, 5), 0, lambda A: A.min(0).values, (1, 3)),
}


def _inf_reduction_params():
    for op, (shape, dd, _, _) in sorted(INF_REDUCTIONS.items()):
        # (an array fill needs a dense dim; a CSR hybrid: test_inf_in_the_upstream_gradient_of_a_csr_hybrid_reduction)
        for layout in ["coo", "uncoalesced"] + ([] if dd else ["csr"]):
            for fill in [0.0, 2.5] + (["array"] if dd else []):
                for sign in (1.0, -1.0):
                    yield op, layout, fill, sign


@pytest.mark.parametrize("op, layout, fill, sign", list(_inf_reduction_params()), ids=str)
def test_inf_in_the_upstream_gradient_of_a_reduction(op, layout, fill, sign):
    shape, dd, fn, where = INF_REDUCTIONS[op]
    case = RCase(shape, fill, dense_dim=dd, nse=9, **_case_kw(layout))
    with torch.no_grad():
        out_shape = _dense(fn(case.build(*case.leaves()))).shape
    W = _inf_weights(out_shape, where, sign)
    out, gv, gf = _grads_with(case, fn, W, dense=False)
    ref, rv, rf = _grads_with(case, fn, W, dense=True)
    torch.testing.assert_close(out, ref, equal_nan=True)
    torch.testing.assert_close(gv, rv, equal_nan=True)
    torch.testing.assert_close(gf, rf, equal_nan=True)
    assert not bool(torch.isnan(rf).any()) or bool(torch.isnan(gf).any())


def test_inf_in_the_upstream_gradient_of_a_csr_hybrid_reduction():
    case = RCase((6, 5, 3), "array", dense_dim=1, nse=7)
    fn = lambda A: A.sum(-1)  # noqa: E731
    W = _inf_weights((6, 5), (0, 7, 29))
    v, f = case.leaves()
    out = fn(case.build(v, f).to_sparse_csr(dense_dim=1))
    (_dense(out) * W).sum().backward()
    ref, rv, rf = _grads_with(case, fn, W, dense=True)
    torch.testing.assert_close(v.grad, rv, equal_nan=True)
    torch.testing.assert_close(f.grad, rf, equal_nan=True)


INF_PRODUCTS = {  # name: (A shape, X shape, fn, output positions with an inf weight, X positions set to inf)
    "A@X G inf": ((6, 5), (5, 3), lambda A, X: A @ X, (0, 4), ()),
    "X@A G inf": ((6, 5), (4, 6), lambda A, X: X @ A, (3,), ()),
    "A@X X inf": ((6, 5), (5, 3), lambda A, X: A @ X, (), (2,)),
    "bmm G inf": ((2, 6, 5), (2, 5, 3), torch.bmm, (1, 20), ()),
    "A@x G inf": ((6, 5), (5,), torch.matmul, (2,), ()),
}


def _inf_product_params():
    for op in sorted(INF_PRODUCTS):
        for layout in ["coo", "csr", "uncoalesced", "hybrid"]:
            for fill in [0.0, 2.5, "indefinite"] + (["array"] if layout == "hybrid" else []):
                yield op, layout, fill


@pytest.mark.parametrize("op, layout, fill", list(_inf_product_params()), ids=str)
def test_inf_in_the_gradient_of_a_product(op, layout, fill):
    """``G`` or ``X`` with an inf: the gradient of the fill is the dense sum over the unspecified elements (inf
    where it is inf; NaN only where the dense one is NaN).  Hybrid: the last dim dense (3-d: one or two)."""
    shape, xshape, fn, wpos, xpos = INF_PRODUCTS[op]
    kw = (
        dict(layout=CSR)
        if layout == "csr"
        else dict(uncoalesced=True)
        if layout == "uncoalesced"
        else dict(dense_dim=1 if len(shape) == 2 or "bmm" in op else 2)
        if layout == "hybrid"
        else {}
    )
    case = MCase(shape, xshape, fill, nse=2 if layout == "hybrid" else 6, **kw)
    case.X.view(-1)[list(xpos)] = INF
    out_shape = fn(torch.zeros(shape, dtype=torch.float64), case.X).shape
    W = _inf_weights(out_shape, wpos)
    res = []
    for dense in (False, True):
        v, f, X = case.leaves()
        A = case.build(v, f)
        if dense:
            A = A.to_dense(fill_value=0.0) if case.indefinite else A.to_dense()
        out = fn(A, X)
        if not dense:
            assert _routed(out)
        (out * W).sum().backward()
        res.append((v.grad, None if f is None else f.grad))
    # (the gradients of A's values and fill: the forward and X's gradient are the sparse products of linalg.py)
    for name, a, b in zip(("values", "fill"), *res):
        if b is not None:
            torch.testing.assert_close(a, b, equal_nan=True, msg=lambda m: f"{name}: {m}")


# ---------------------------------------------------------------------- 6. a torch native sparse leaf's .grad
NATIVE_OPS = {
    "A*nat": lambda A, n: A * n,
    "nat*A": lambda A, n: n * A,
    "A+nat": lambda A, n: A + n,
    "A@nat": lambda A, n: A @ n,
    "A.mul(nat).sum(0)": lambda A, n: A.mul(n).sum(0),
}


def _native_leaf(layout, hybrid):
    g = torch.Generator().manual_seed(3)
    d = torch.randn((4, 4, 2) if hybrid else (4, 4), dtype=torch.float64, generator=g)
    d[torch.rand(4, 4, generator=g) < 0.6] = 0
    n = d.to_sparse(layout=layout, dense_dim=1 if hybrid else 0)
    return n.requires_grad_(), d


@pytest.mark.parametrize("fill", [0.0, 2.5, "indefinite"], ids=str)
@pytest.mark.parametrize("native", ["coo", "csr", "coo hybrid"])
@pytest.mark.parametrize("op", sorted(NATIVE_OPS))
def test_native_sparse_leaf_gradient_is_native_of_its_layout(op, native, fill):
    """``.grad`` of a torch native sparse leaf is a native sparse tensor of its layout and dense dims, equal to
    the dense gradient (an indefinite ``A``: the masked-out elements read as 0 by the reference); twice
    accumulates."""
    hybrid = native.endswith("hybrid")
    if hybrid and op == "A@nat":
        return  # (a matrix product needs a 2-d right operand: the hybrid leaf is 3-d)
    layout = CSR if native.startswith("csr") else COO
    shape = (4, 4, 2) if hybrid else (4, 4)
    case = RCase(shape, fill, dense_dim=1 if hybrid else 0, nse=5, seed=2)
    A = case.build(*[None if t is None else t.detach() for t in case.leaves()])
    nat, d = _native_leaf(layout, hybrid)
    fn = NATIVE_OPS[op]
    W = None
    for _ in range(2):
        out = fn(A, nat)
        dense_out = _dense(out)
        W = torch.randn(
            dense_out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1)
        )
        (dense_out * W).sum().backward()
    g = nat.grad
    assert type(g) is torch.Tensor and g.layout is layout and g.dense_dim() == nat.dense_dim()
    ref = d.clone().requires_grad_()
    Ad = A.to_dense(fill_value=0.0) if case.indefinite else A.to_dense()
    out_ref = fn(Ad, ref)
    if case.indefinite and op in (
        "A*nat",
        "nat*A",
        "A+nat",
    ):  # element-wise, masked: no gradient through
        out_ref = torch.where(
            torch.isnan(A.to_dense(fill_value=NAN)), 0.0, out_ref
        )  # a masked-out element
    (2 * out_ref * W).sum().backward()
    torch.testing.assert_close(g.to_dense(), ref.grad, equal_nan=True)


# ---------------------------------------------------------------------- 4. max/min with a dim: indefinite, dense dim
def _masked_max_ref(case, v, fn_name, dim, keepdim):
    """``max``/``min`` over the stored elements only: the masked-out ones set to -inf / +inf on the dense tensor."""
    A = case.build(v, None)
    D = A.to_dense(fill_value=0.0)
    M = ~torch.isnan(A.to_dense(fill_value=NAN)) | torch.isnan(D)
    worst = -INF if fn_name == "max" else INF
    r = getattr(torch.where(M, D, worst), fn_name)(dim, keepdim)
    some = M.any(dim, keepdim)
    return r.values, r.indices, some


def _max_indefinite_params():
    for fn_name in ["max", "min"]:
        for shape, dd, dim in [
            ((6, 5), 0, 0),
            ((6, 5), 0, 1),
            ((6, 5), 0, -1),
            ((4, 3, 5), 0, 1),
            ((6, 5, 3), 1, 0),
            ((6, 5, 3), 1, 2),
        ]:
            for layout in ["coo", "uncoalesced"] + (["csr"] if len(shape) - dd == 2 else []):
                for keepdim in (False, True):
                    yield fn_name, shape, dd, dim, layout, keepdim


@pytest.mark.parametrize(
    "fn_name, shape, dd, dim, layout, keepdim", list(_max_indefinite_params()), ids=str
)
def test_max_min_with_a_dim_of_an_indefinite_fill(fn_name, shape, dd, dim, layout, keepdim):
    """As torch.masked: the extreme over the stored elements of each slice and the index of its first
    occurrence; a slice with none stored is masked out (the results' fill is indefinite).  Values, indices
    and the gradient of the values against the dense tensor with the masked-out elements at -inf / +inf."""
    case = RCase(shape, "indefinite", dense_dim=dd, nse=7, **_case_kw(layout))
    case.values.view(-1)[3] = (
        NAN if fn_name == "max" and dim == 1 else case.values.view(-1)[3]
    )  # (a NaN wins)
    v, _ = case.leaves()
    A = case.build(v, None)
    r = getattr(A, fn_name)(dim, keepdim)
    assert (
        r.values.is_fill_indefinite()
        and r.indices.is_fill_indefinite()
        and r.indices.dtype == torch.int64
    )
    vd, _ = case.leaves()
    ref_v, ref_i, some = _masked_max_ref(case, vd, fn_name, dim, keepdim)
    got_v, got_i = r.values.to_dense(fill_value=0.0), r.indices.to_dense(fill_value=0)
    torch.testing.assert_close(got_v, torch.where(some, ref_v, 0.0), equal_nan=True)
    torch.testing.assert_close(got_i, torch.where(some, ref_i, 0))
    W = torch.randn(got_v.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    (got_v * W).sum().backward()
    (torch.where(some, ref_v, 0.0) * W).sum().backward()
    torch.testing.assert_close(v.grad, vd.grad, equal_nan=True)


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_argmax_of_an_indefinite_fill(layout):
    case = RCase((6, 5), "indefinite", nse=7, **_case_kw(layout))
    A = case.build(*[t for t in case.leaves()][:1], None)
    D = A.to_dense(fill_value=-INF)
    for dim in (0, 1):
        got = A.argmax(dim).to_dense(fill_value=-1)
        M = ~torch.isnan(A.to_dense(fill_value=NAN))
        torch.testing.assert_close(got, torch.where(M.any(dim), D.argmax(dim), -1))
        got = A.argmin(dim).to_dense(fill_value=-1)
        torch.testing.assert_close(
            got, torch.where(M.any(dim), A.to_dense(fill_value=INF).argmin(dim), -1)
        )
    assert (
        A.argmax().item() == D.argmax().item()
        and A.argmin().item() == A.to_dense(fill_value=INF).argmin().item()
    )
    E = sparsefill.sparse_coo_tensor(
        torch.zeros(2, 0, dtype=torch.long),
        torch.zeros(0),
        (3, 4),
        fill_value=sparsefill.indefinite,
    )
    with pytest.raises(IndexError, match="no specified element"):
        E.argmax()
    assert E.max(1).values._nse() == 0 and E.max(1).values.is_fill_indefinite()


def _max_dense_dim_params():
    for op in ["max(-1)", "min(2, keepdim)", "max(2) 4-d"]:
        for layout in ["coo", "csr", "uncoalesced"]:
            for fill in [0.0, "array", NAN, "indefinite"]:
                if not (op.endswith("4-d") and layout == "csr"):
                    yield op, layout, fill


@pytest.mark.parametrize("op, layout, fill", list(_max_dense_dim_params()), ids=str)
def test_max_min_over_a_dense_dim_run_on_the_pattern(op, layout, fill):
    """``A.max(-1)`` of a hybrid: routed (the gradient scattered to the selected position of each stored slice
    and of the fill), equal to the dense gradient, with no densifying under a raising densify policy."""
    four = op.endswith("4-d")
    shape, dd = ((6, 5, 3, 2), 2) if four else ((6, 5, 3), 1)
    fn = {
        "max(-1)": lambda A: A.max(-1),
        "min(2, keepdim)": lambda A: A.min(2, keepdim=True),
        "max(2) 4-d": lambda A: A.max(2),
    }[op]
    case = RCase(shape, fill, dense_dim=dd, nse=7, uncoalesced=layout == "uncoalesced")
    build = (
        (lambda v, f: case.build(v, f).to_sparse_csr(dense_dim=dd))
        if layout == "csr"
        else case.build
    )
    v, f = case.leaves()
    with sparsefill.densify_policy("raise", dense_by_nature="raise"):
        r = fn(build(v, f))
        assert _routed(r.values, "SparseSelectBackward")
        vals = r.values.to_dense(fill_value=0.0) if case.indefinite else r.values.to_dense()
        W = torch.randn(vals.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        (torch.nan_to_num(vals, nan=0.0) * 0 + vals * W).sum().backward()
    vd, fd = case.leaves()
    Ad = build(vd, fd)
    rd = fn(Ad.to_dense(fill_value=0.0) if case.indefinite else Ad.to_dense())
    ind = r.indices.to_dense(fill_value=0) if case.indefinite else r.indices.to_dense()
    torch.testing.assert_close(vals, rd.values, equal_nan=True)
    torch.testing.assert_close(ind, rd.indices)
    (rd.values * W).sum().backward()
    torch.testing.assert_close(v.grad, vd.grad, equal_nan=True)
    if f is not None:
        torch.testing.assert_close(f.grad, fd.grad, equal_nan=True)


# ---------------------------------------------------------------------- 1. masked normalizations, fill masked in
def _norm_params():
    ops = [
        ("normalize", 2.0, 0.0),
        ("normalize", 1.0, 0.0),
        ("normalize", 3.0, 0.0),
        ("normalize", INF, 0.0),
        ("softmax", None, -INF),
        ("log_softmax", None, -INF),
        ("softmin", None, INF),
    ]
    for name, p, fill in ops:
        for layout in ["coo", "csr", "uncoalesced"]:
            for dim in (0, 1):
                yield name, p, fill, layout, dim


def _masked_op(name, p, dim, **kw):
    if name == "normalize":
        return lambda x: (
            getattr(sparsefill.masked, name)(x, p, dim, **kw)
            if isinstance(x, sparsefill.SparseTensor)
            else torch.masked.normalize(x, p, dim, **kw)
        )
    return lambda x: (
        getattr(sparsefill.masked, name)(x, dim)
        if isinstance(x, sparsefill.SparseTensor)
        else getattr(torch.masked, name)(x, dim)
    )


def _check_masked_norm(case, fn, sparse_weights=False, computed=False):
    W = torch.randn(case.shape, dtype=case.dtype, generator=torch.Generator().manual_seed(1))
    if sparse_weights:  # an upstream gradient that is a SparseTensor (fill 0) on another pattern
        W = sparsefill.to_sparse(
            torch.where(
                torch.rand(case.shape, generator=torch.Generator().manual_seed(2)) < 0.3, W, 0.0
            ),
            dense_dim=case.dense_dim,
        )
    res = []
    for dense in (False, True):
        v, f = case.leaves()
        A = case.build(v, f)
        A = 2 * A if computed else A
        if dense:
            out = fn(A.to_dense())
            (out * (W.to_dense() if sparse_weights else W)).sum().backward()
        else:
            with sparsefill.densify_policy("raise", dense_by_nature="raise"):
                out = fn(A)
                assert isinstance(out, sparsefill.SparseTensor)
                (out * W).sum().backward() if sparse_weights else (
                    out.to_dense() * W
                ).sum().backward()
            out = out.to_dense()
        res.append((out, v.grad, f.grad))
    tol = {} if case.dtype == torch.float64 else dict(rtol=1e-4, atol=1e-4)
    for name, a, b in zip(("out", "values", "fill"), *res):
        torch.testing.assert_close(a, b, equal_nan=True, **tol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("name, p, fill, layout, dim", list(_norm_params()), ids=str)
def test_masked_normalization_with_the_fill_masked_in_runs_on_the_pattern(
    name, p, fill, layout, dim
):
    """``masked.normalize`` of a fill-0 tensor (softmax of a -inf fill...), ``mask=None``: the forward keeps the
    pattern, and so does the backward (no densifying under a raising policy): the values' gradient exact, the
    fill's the sum over the unspecified elements from the fill classes; against ``torch.masked`` on dense.
    Rows with no stored element included (normalize: ``G / eps`` there, as dense)."""
    case = RCase((6, 5), fill, nse=8, **_case_kw(layout))
    if (
        name != "normalize"
    ):  # every row and column stored (a slice of -inf fills only is NaN: dense by nature)
        keys = torch.tensor([0, 6, 12, 18, 24, 29, 2, 21])
        case.idx = torch.stack(torch.unravel_index(keys, (6, 5)))
        case.values = torch.randn(
            8, dtype=torch.float64, generator=torch.Generator().manual_seed(4)
        )
    _check_masked_norm(case, _masked_op(name, p, dim))


@pytest.mark.parametrize(
    "how",
    [
        "sparse upstream gradient",
        "computed input",
        "float32",
        "hybrid sparse dim",
        "hybrid dense dim, array fill",
        "3-d",
        "eps=1e-3",
    ],
)
def test_masked_normalization_with_the_fill_masked_in_variants(how):
    kw = dict(dense_dim=1) if how.startswith("hybrid") else {}
    shape = (6, 5, 3) if how.startswith("hybrid") or how == "3-d" else (6, 5)
    fill = "array" if how.endswith("array fill") else 0.0
    dtype = torch.float32 if how == "float32" else torch.float64
    case = RCase(shape, fill, nse=9, dtype=dtype, **kw)
    if fill == "array":  # (a dense dim: every fill is masked in, any array fill keeps the pattern)
        case.fill = case.fill.abs() + 0.5
    dim = 2 if how.endswith("array fill") else 1
    fn = _masked_op("normalize", 2.0, dim, **(dict(eps=1e-3) if how == "eps=1e-3" else {}))
    _check_masked_norm(
        case, fn, sparse_weights=how == "sparse upstream gradient", computed=how == "computed input"
    )


MASKED_REDUCTIONS = {
    "sum()": (lambda A: sparsefill.masked.sum(A), lambda D: torch.masked.sum(D)),
    "mean(0)": (lambda A: sparsefill.masked.mean(A, 0), lambda D: torch.masked.mean(D, 0)),
    "amax()": (lambda A: sparsefill.masked.amax(A), lambda D: torch.masked.amax(D)),
    "var(1)": (lambda A: sparsefill.masked.var(A, 1), lambda D: torch.masked.var(D, 1)),
    "logsumexp((0, 1))": (
        lambda A: sparsefill.masked.logsumexp(A, (0, 1)),
        lambda D: torch.masked.logsumexp(D, (0, 1)),
    ),
    "norm(2, 1)": (
        lambda A: sparsefill.masked.norm(A, 2.0, 1),
        lambda D: torch.masked.norm(D, 2.0, 1),
    ),
}


@pytest.mark.parametrize("fill", [0.0, 2.5], ids=str)
@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize("op", sorted(MASKED_REDUCTIONS))
def test_masked_reduction_with_the_fill_masked_in_runs_on_the_pattern(op, layout, fill):
    """``sparsefill.masked.<reduction>(A)`` with ``mask=None`` on a defined fill: the backward gives the fill its
    total over the unspecified elements with no densifying; against torch.masked on dense."""
    fn, ref = MASKED_REDUCTIONS[op]
    case = RCase((6, 5), fill, nse=8, **_case_kw(layout))
    v, f = case.leaves()
    with sparsefill.densify_policy("raise", dense_by_nature="raise"):
        out = _dense(fn(case.build(v, f)))
        W = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1))
        (out * W).sum().backward()
    vd, fd = case.leaves()
    want = ref(case.build(vd, fd).to_dense())
    (want * W).sum().backward()
    torch.testing.assert_close(out, want, equal_nan=True)
    torch.testing.assert_close(v.grad, vd.grad, equal_nan=True)
    torch.testing.assert_close(f.grad, fd.grad, equal_nan=True)


def test_masked_normalization_of_a_leaf_declares_its_densifying_backward():
    """A SparseTensor leaf's gradient varies over its unspecified elements (``G / norm`` per slice): dense by
    nature, through the densify gate (refused under ``dense_by_nature='raise'``), and equal to the dense one."""
    x = torch.tensor(
        [[0.0, 3.0, 0.0, 4.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]], dtype=torch.float64
    )
    A = sparsefill.to_sparse(x).requires_grad_()
    out = sparsefill.masked.normalize(A, 2.0, 1)
    with (
        sparsefill.densify_policy(dense_by_nature="raise"),
        pytest.raises(sparsefill.DensifyError, match="masked"),
    ):
        out.to_dense().sum().backward(retain_graph=True)
    out.to_dense().sum().backward()
    xd = x.clone().requires_grad_()
    torch.masked.normalize(xd, 2.0, 1).sum().backward()
    torch.testing.assert_close(A.grad.to_dense(), xd.grad)


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_masked_normalize_backward_has_no_temporary_of_the_input_size(layout, dim):
    """(300, 400) with 60 stored elements, fill 0, a sparse upstream gradient: nothing of 120k elements is made."""
    from tests.ops.linalg.test_backward_sparse import _Shapes

    case = RCase((300, 400), 0.0, nse=60, **_case_kw(layout))
    W = sparsefill.sparse_coo_tensor(
        torch.tensor([[1, 7, 250], [3, 399, 0]]),
        torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64),
        (300, 400),
    )
    v, f = case.leaves()
    with _Shapes() as rec, sparsefill.densify_policy("raise", limit_bytes=1 << 16):
        out = sparsefill.masked.normalize(case.build(v, f), 2.0, dim)
        (out * W).sum().backward()
    assert v.grad is not None and f.grad is not None
    assert rec.largest < 300 * 400 // 20, rec.largest


# ---------------------------------------------------------------------- 2. var_mean / std_mean of computed tensors
VAR_MEAN = {
    "var_mean(2*A, 1)": lambda A: torch.var_mean(A * 2, 1),
    "std_mean(exp(A), 0)": lambda A: torch.std_mean(torch.exp(A), 0),
    "var_mean(2*A, (0, 1))": lambda A: torch.var_mean(2 * A, (0, 1)),
    "std_mean(2*A, 1, keepdim, correction=0)": lambda A: torch.std_mean(
        2 * A, 1, keepdim=True, correction=0
    ),
    "var_mean(sigmoid(A).t(), 1)": lambda A: torch.var_mean(torch.sigmoid(A).t(), 1),
    "std_mean(A*s)": lambda A: torch.std_mean(A * torch.tensor(1.5, dtype=A.dtype)),
}
VAR_MEAN_MASKED = {  # the same on the stored values (nse,) of an indefinite fill: torch.masked with the pattern
    "var_mean(2*A, 1)": lambda D, M: (
        torch.masked.var(2 * D, 1, mask=M),
        torch.masked.mean(2 * D, 1, mask=M),
    ),
    "std_mean(exp(A), 0)": lambda D, M: (
        torch.masked.std(D.exp(), 0, mask=M),
        torch.masked.mean(D.exp(), 0, mask=M),
    ),
    "var_mean(2*A, (0, 1))": lambda D, M: (
        torch.masked.var(2 * D, (0, 1), mask=M),
        torch.masked.mean(2 * D, (0, 1), mask=M),
    ),
}


def _vm_params():
    for op in sorted(VAR_MEAN):
        for layout in ["coo", "csr", "uncoalesced"]:
            for fill in [0.0, 2.5, NAN] + (["indefinite"] if op in VAR_MEAN_MASKED else []):
                yield op, layout, fill


@pytest.mark.parametrize("op, layout, fill", list(_vm_params()), ids=str)
def test_var_mean_std_mean_of_computed_tensors(op, layout, fill):
    """``var_mean``/``std_mean`` of a tensor computed by element-wise ops, partial and full: routed (both
    outputs), no densifying under a raising policy, forward and gradients of values and fill as dense (an
    indefinite fill: as torch.masked over the pattern)."""
    fn = VAR_MEAN[op]
    case = RCase((6, 5), fill, nse=9, **_case_kw(layout))
    W = None
    v, f = case.leaves()
    with sparsefill.densify_policy("raise", dense_by_nature="raise"):
        out = fn(case.build(v, f))
        assert all(_routed(o, "SparseReduceBackward") for o in out)
        dn = [_dense(o) for o in out]
        W = [
            torch.randn(o.shape, dtype=o.dtype, generator=torch.Generator().manual_seed(i))
            for i, o in enumerate(dn)
        ]
        sum((o * w).sum() for o, w in zip(dn, W)).backward()
    vd, fd = case.leaves()
    A = case.build(vd, fd)
    if case.indefinite:
        D = A.to_dense(fill_value=0.0)
        ref = VAR_MEAN_MASKED[op](D, ~torch.isnan(A.to_dense(fill_value=NAN)))
        # (a slice with nothing stored: masked out in the result, read as 0 by _dense; NaN in torch.masked)
        ref = [torch.where(torch.isnan(r) & (o == 0), 0.0, r) for r, o in zip(ref, dn)]
    else:
        ref = fn(A.to_dense())
    sum((r * w).sum() for r, w in zip(ref, W)).backward()
    for a, b in zip(dn, ref):
        torch.testing.assert_close(a, b, equal_nan=True)
    torch.testing.assert_close(v.grad, vd.grad, equal_nan=True)
    if f is not None:
        torch.testing.assert_close(f.grad, fd.grad, equal_nan=True)


@pytest.mark.parametrize("fill", [0.0, "array"], ids=str)
@pytest.mark.parametrize(
    "op", ["var_mean(2*A, -1)", "std_mean(2*A, 1)", "var_mean(exp(A), (0, 1))"]
)
def test_var_mean_of_computed_hybrid_tensors(op, fill):
    fn = {
        "var_mean(2*A, -1)": lambda A: torch.var_mean(2 * A, -1),
        "std_mean(2*A, 1)": lambda A: torch.std_mean(2 * A, 1),
        "var_mean(exp(A), (0, 1))": lambda A: torch.var_mean(A.exp(), (0, 1)),
    }[op]
    case = RCase((6, 5, 3), fill, dense_dim=1, nse=7)
    v, f = case.leaves()
    with sparsefill.densify_policy("raise", dense_by_nature="raise"):
        out = fn(case.build(v, f))
        assert all(_routed(o, "SparseReduceBackward") for o in out)
        dn = [_dense(o) for o in out]
        W = [
            torch.randn(o.shape, dtype=o.dtype, generator=torch.Generator().manual_seed(i))
            for i, o in enumerate(dn)
        ]
        sum((o * w).sum() for o, w in zip(dn, W)).backward()
    vd, fd = case.leaves()
    ref = fn(case.build(vd, fd).to_dense())
    sum((r * w).sum() for r, w in zip(ref, W)).backward()
    for a, b in zip(dn, ref):
        torch.testing.assert_close(a, b, equal_nan=True)
    torch.testing.assert_close(v.grad, vd.grad, equal_nan=True)
    torch.testing.assert_close(f.grad, fd.grad, equal_nan=True)


MIXED = {  # reductions over sparse and dense dims keeping a sparse dim, of a (6, 5, 3) hybrid (4-d: (5, 4, 3, 2))
    "sum((1, 2))": lambda A: A.sum((1, 2)),
    "mean((0, 2))": lambda A: A.mean((0, 2)),
    "amax((1, 2), keepdim)": lambda A: A.amax((1, 2), keepdim=True),
    "amin(2*A, (0, 2))": lambda A: (2 * A).amin((0, 2)),
    "logsumexp((1, 2))": lambda A: A.logsumexp((1, 2)),
    "var((1, 2))": lambda A: A.var((1, 2)),
    "std((0, 2), correction=0)": lambda A: A.std((0, 2), correction=0),
    "norm(dim=(1, 2))": lambda A: A.norm(dim=(1, 2)),
    "vector_norm(inf, (1, 2))": lambda A: torch.linalg.vector_norm(A, INF, (1, 2)),
    "std_mean(exp(A), (1, 2))": lambda A: torch.std_mean(A.exp(), (1, 2)),
    "var_mean(2*A, (0, 2), keepdim)": lambda A: torch.var_mean(2 * A, (0, 2), keepdim=True),
    "4-d sum((1, 3))": lambda A: A.sum((1, 3)),
    "4-d var((0, 2, 3))": lambda A: A.var((0, 2, 3)),
}


def _mixed_params():
    for op in sorted(MIXED):
        for layout in ["coo", "uncoalesced"] + ([] if op.startswith("4-d") else ["csr"]):
            for fill in [0.0, "array", NAN]:
                yield op, layout, fill


@pytest.mark.parametrize("op, layout, fill", list(_mixed_params()), ids=str)
def test_reductions_over_sparse_and_dense_dims_keeping_a_sparse_dim(op, layout, fill):
    """Routed (torch's formula per slice, the reduced dense dims summed in the slice statistics), no densifying
    under a raising policy; forward and gradients of values and fill as dense."""
    fn, four = MIXED[op], op.startswith("4-d")
    case = RCase(
        (5, 4, 3, 2) if four else (6, 5, 3),
        fill,
        dense_dim=2 if four else 1,
        nse=7,
        uncoalesced=layout == "uncoalesced",
    )
    build = (
        (lambda v, f: case.build(v, f).to_sparse_csr(dense_dim=1))
        if layout == "csr"
        else case.build
    )
    v, f = case.leaves()
    with sparsefill.densify_policy("raise", dense_by_nature="raise"):
        out = fn(build(v, f))
        out = out if isinstance(out, tuple) else (out,)
        assert all(_routed(o, "SparseReduceBackward") for o in out)
        dn = [_dense(o) for o in out]
        W = [
            torch.randn(o.shape, dtype=o.dtype, generator=torch.Generator().manual_seed(i))
            for i, o in enumerate(dn)
        ]
        sum((o * w).sum() for o, w in zip(dn, W)).backward()
    vd, fd = case.leaves()
    ref = fn(build(vd, fd).to_dense())
    ref = ref if isinstance(ref, tuple) else (ref,)
    sum((r * w).sum() for r, w in zip(ref, W)).backward()
    for a, b in zip(dn, ref):
        torch.testing.assert_close(a, b, equal_nan=True)
    torch.testing.assert_close(v.grad, vd.grad, equal_nan=True)
    torch.testing.assert_close(f.grad, fd.grad, equal_nan=True)


@pytest.mark.parametrize(
    "op", ["sum((1, 2))", "var((1, 2))", "amax((0, 2))", "logsumexp((1, 2))", "norm((1, 2))"]
)
def test_reductions_over_sparse_and_dense_dims_of_an_indefinite_fill(op):
    """Masked semantics: as ``torch.masked`` with the pattern as mask (a slice with nothing stored: masked out)."""
    fn, fm = {
        "sum((1, 2))": (lambda A: A.sum((1, 2)), lambda D, M: torch.masked.sum(D, (1, 2), mask=M)),
        "var((1, 2))": (lambda A: A.var((1, 2)), lambda D, M: torch.masked.var(D, (1, 2), mask=M)),
        "amax((0, 2))": (
            lambda A: A.amax((0, 2)),
            lambda D, M: torch.masked.amax(D, (0, 2), mask=M),
        ),
        "logsumexp((1, 2))": (
            lambda A: A.logsumexp((1, 2)),
            lambda D, M: torch.masked.logsumexp(D, (1, 2), mask=M),
        ),
        "norm((1, 2))": (
            lambda A: A.norm(dim=(1, 2)),
            lambda D, M: torch.masked.norm(D, 2.0, (1, 2), mask=M),
        ),
    }[op]
    case = RCase((6, 5, 3), "indefinite", dense_dim=1, nse=7)
    v, _ = case.leaves()
    out = fn(case.build(v, None))
    assert _routed(out, "SparseReduceBackward")
    dn = _dense(out)
    W = torch.randn(dn.shape, dtype=dn.dtype, generator=torch.Generator().manual_seed(1))
    (dn * W).sum().backward()
    vd, _ = case.leaves()
    A = case.build(vd, None)
    M = _specified(A)
    some = M.any(2).any(1) if op.endswith("(1, 2))") else M.any(2).any(0)
    ref = torch.where(some, fm(A.to_dense(fill_value=0.0), M), 0.0)
    (ref * W).sum().backward()
    torch.testing.assert_close(dn, ref)
    torch.testing.assert_close(v.grad, vd.grad)


# ---------------------------------------------------------------------- 3. logsumexp of a hybrid CSR over a dense dim
@pytest.mark.parametrize("grad", ["leaf", "constructor", "no grad"])
@pytest.mark.parametrize("fill", [0.0, "array", "indefinite"], ids=str)
@pytest.mark.parametrize("shape", [(6, 5, 3), (2, 4, 5, 3)], ids=["csr", "batched csr"])
def test_logsumexp_of_a_hybrid_csr_over_a_dense_dim_is_sparse(shape, fill, grad):
    """As for COO: a SparseTensor of the input's layout and pattern (an indefinite fill stays indefinite), equal
    to dense (indefinite: at the pattern), gradients included (a leaf's ``.grad``, or the constructor's)."""
    case = RCase(shape, fill, dense_dim=1, nse=6 if len(shape) == 3 else 20)
    if (
        len(shape) == 4 and fill == "indefinite"
    ):  # (a batched CSR with an indefinite fill: equal nse per batch)
        case.idx = torch.stack(
            torch.unravel_index(torch.tensor([0, 3, 7, 12, 20, 23, 27, 32]), shape[:3])
        )
        case.values = torch.randn(
            8, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(5)
        )
    v, f = case.leaves()
    with torch.set_grad_enabled(grad != "no grad"):
        A = case.build(v, f).to_sparse_csr(dense_dim=1)
        if grad == "leaf":
            A = A.detach().requires_grad_()
        out = torch.logsumexp(A, -1)
    assert (
        isinstance(out, sparsefill.SparseTensor)
        and out.sparse_layout is CSR
        and out.dense_dim() == 0
    )
    assert out.is_fill_indefinite() == case.indefinite
    vd, fd = case.leaves()
    Ad = case.build(vd, fd)
    spec = _specified(Ad)[..., 0] if case.indefinite else torch.ones((), dtype=torch.bool)
    ref = torch.where(
        spec,
        torch.logsumexp(Ad.to_dense(fill_value=0.0) if case.indefinite else Ad.to_dense(), -1),
        0.0,
    )
    torch.testing.assert_close(_dense(out), ref)
    if grad == "no grad":
        return
    W = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    (_dense(out) * W).sum().backward()
    (ref * W).sum().backward()
    if grad == "leaf":
        g = A.grad.to_dense(fill_value=0.0) if A.grad.is_fill_indefinite() else A.grad.to_dense()
        want = (
            torch.zeros(shape, dtype=torch.float64).index_put_(
                tuple(case.idx), vd.grad, accumulate=True
            )
            if case.indefinite
            else None
        )
        if (
            not case.indefinite
        ):  # the dense gradient: the leaf's elements (the constructor's read of it)
            Al = case.build(vd.detach(), fd.detach()).to_dense().requires_grad_()
            (torch.logsumexp(Al, -1) * W).sum().backward()
            want = Al.grad
        torch.testing.assert_close(g, want)
    else:
        assert v.grad is not None
        torch.testing.assert_close(v.grad, vd.grad)
        if f is not None:
            torch.testing.assert_close(f.grad, fd.grad)


# ---------------------------------------------------------------------- 7. double backward: exact or a clear error
_SPEC_IDX = torch.tensor([[0, 0, 1, 2], [1, 2, 0, 1]])
_SPEC = torch.zeros(3, 3, dtype=torch.bool).index_put_(tuple(_SPEC_IDX), torch.tensor(True))
SECOND_ORDER = {  # name: (fn on A, the same on the dense tensor (indefinite: masked-out elements at 0, mask M))
    "A*A": (lambda A: A * A, lambda D, M: D * D),
    "exp": (torch.exp, lambda D, M: torch.exp(D)),
    "masked.softmax": (
        lambda A: sparsefill.masked.softmax(A, 1),
        lambda D, M: torch.masked.softmax(D, 1, mask=M),
    ),
    "torch.softmax": (
        lambda A: torch.softmax(A, 1),
        lambda D, M: torch.masked.softmax(D, 1, mask=M),
    ),
}
ONCE_DIFFERENTIABLE = {
    "sum(1)": lambda A: A.sum(1),
    "A@X": lambda A: A @ torch.ones(3, 2, dtype=A.dtype),
    "masked.softmax": lambda A: sparsefill.masked.softmax(A, 1),
}


def _second(fn, A_of, v0, indefinite):
    v = v0.clone().requires_grad_()
    out = fn(A_of(v))
    out = _dense(out) if isinstance(out, sparsefill.SparseTensor) else out
    if indefinite and out.shape == _SPEC.shape:
        out = torch.where(_SPEC, out, 0.0)
    (g,) = torch.autograd.grad(out.pow(3).sum(), v, create_graph=True)
    (g.sum() + v.sum()).backward()
    return v.grad


@pytest.mark.parametrize("fill", [0.0, 1.5, "indefinite"], ids=str)
@pytest.mark.parametrize("op", sorted(SECOND_ORDER))
def test_double_backward_is_exact(op, fill):
    """A SparseTensor gradient under ``create_graph`` keeps its graph (the constructor reads it through its dense
    form): the second derivative equals the dense one, never silently missing a term."""
    ind = fill == "indefinite"
    if ind and op == "masked.softmax":
        return  # (the edge softmax, once differentiable: test_double_backward_of_a_once_differentiable_op_raises)
    v0 = torch.randn(4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    f = sparsefill.indefinite if ind else fill
    got = _second(
        SECOND_ORDER[op][0],
        lambda v: sparsefill.sparse_coo_tensor(_SPEC_IDX, v, (3, 3), fill_value=f),
        v0,
        ind,
    )

    def dense(v):
        return sparsefill.sparse_coo_tensor(
            _SPEC_IDX, v, (3, 3), fill_value=0.0 if ind else f
        ).to_dense()

    want = _second(lambda D: SECOND_ORDER[op][1](D, _SPEC if ind else None), dense, v0, ind)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("fill", [0.0, "indefinite"], ids=str)
@pytest.mark.parametrize("op", sorted(ONCE_DIFFERENTIABLE))
def test_double_backward_of_a_once_differentiable_op_raises(op, fill):
    """The routed backwards (reductions, products, the edge softmax) are once differentiable: a second backward
    raises torch's error saying so, it does not give a silently constant gradient."""
    if op == "masked.softmax" and fill != "indefinite":
        return  # (a defined fill: masked.softmax runs the generic masked path, twice differentiable: above)
    f = sparsefill.indefinite if fill == "indefinite" else fill
    v0 = torch.randn(4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with pytest.raises(
        RuntimeError,
        match="differentiate twice a function that was marked with @once_differentiable",
    ):
        _second(
            ONCE_DIFFERENTIABLE[op],
            lambda v: sparsefill.sparse_coo_tensor(_SPEC_IDX, v, (3, 3), fill_value=f),
            v0,
            fill == "indefinite",
        )
