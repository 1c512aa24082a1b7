"""Training edge cases of the sparse backwards (issue 13): never silently wrong, never a crash.

Each test builds ``A`` from leaves ``(values, fill)`` and checks, against the same computation on
``A.to_dense()``, the forward and the gradients of ``values`` and ``fill``::

    grad(values, fill) of L(op(A)) == grad(values, fill) of L(op(A.to_dense()))     (equal_nan)

* an ``inf`` in the upstream gradient (or in the dense operand of a product) gives the fill the gradient
  the dense computation gives (``inf``, not a NaN from ``inf - inf``): the sum over the unspecified
  elements is taken over them, never as the total less the pattern's part;
"""

from __future__ import annotations

import pytest
import torch

import sparsefill
from test_backward_reductions import Case as RCase, _case_kw, _dense_out
from test_backward_sparse import Case as MCase, _routed

NAN, INF = float("nan"), float("inf")
COO, CSR = torch.sparse_coo, torch.sparse_csr


def _dense(t):
    return _dense_out(t) if isinstance(t, sparsefill.SparseTensor) else t


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
    kw = dict(layout=CSR) if layout == "csr" else dict(uncoalesced=True) if layout == "uncoalesced" else \
        dict(dense_dim=1 if len(shape) == 2 or "bmm" in op else 2) if layout == "hybrid" else {}
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
        W = torch.randn(dense_out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        (dense_out * W).sum().backward()
    g = nat.grad
    assert type(g) is torch.Tensor and g.layout is layout and g.dense_dim() == nat.dense_dim()
    ref = d.clone().requires_grad_()
    Ad = A.to_dense(fill_value=0.0) if case.indefinite else A.to_dense()
    out_ref = fn(Ad, ref)
    if case.indefinite and op in ("A*nat", "nat*A", "A+nat"):  # element-wise, masked: no gradient through
        out_ref = torch.where(torch.isnan(A.to_dense(fill_value=NAN)), 0.0, out_ref)  # a masked-out element
    (2 * out_ref * W).sum().backward()
    torch.testing.assert_close(g.to_dense(), ref.grad, equal_nan=True)


# ---------------------------------------------------------------------- 4. max/min with a dim: indefinite fill, dense dim
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
        for shape, dd, dim in [((6, 5), 0, 0), ((6, 5), 0, 1), ((6, 5), 0, -1), ((4, 3, 5), 0, 1), ((6, 5, 3), 1, 0),
                               ((6, 5, 3), 1, 2)]:
            for layout in ["coo", "uncoalesced"] + (["csr"] if len(shape) - dd == 2 else []):
                for keepdim in (False, True):
                    yield fn_name, shape, dd, dim, layout, keepdim


@pytest.mark.parametrize("fn_name, shape, dd, dim, layout, keepdim", list(_max_indefinite_params()), ids=str)
def test_max_min_with_a_dim_of_an_indefinite_fill(fn_name, shape, dd, dim, layout, keepdim):
    """As torch.masked: the extreme over the stored elements of each slice and the index of its first
    occurrence; a slice with none stored is masked out (the results' fill is indefinite).  Values, indices
    and the gradient of the values against the dense tensor with the masked-out elements at -inf / +inf."""
    case = RCase(shape, "indefinite", dense_dim=dd, nse=7, **_case_kw(layout))
    case.values.view(-1)[3] = NAN if fn_name == "max" and dim == 1 else case.values.view(-1)[3]  # (a NaN wins)
    v, _ = case.leaves()
    A = case.build(v, None)
    r = getattr(A, fn_name)(dim, keepdim)
    assert r.values.is_fill_indefinite() and r.indices.is_fill_indefinite() and r.indices.dtype == torch.int64
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
        torch.testing.assert_close(got, torch.where(M.any(dim), A.to_dense(fill_value=INF).argmin(dim), -1))
    assert A.argmax().item() == D.argmax().item() and A.argmin().item() == A.to_dense(fill_value=INF).argmin().item()
    E = sparsefill.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.long), torch.zeros(0), (3, 4),
                                     fill_value=sparsefill.indefinite)
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
    fn = {"max(-1)": lambda A: A.max(-1), "min(2, keepdim)": lambda A: A.min(2, keepdim=True),
          "max(2) 4-d": lambda A: A.max(2)}[op]
    case = RCase(shape, fill, dense_dim=dd, nse=7, uncoalesced=layout == "uncoalesced")
    build = (lambda v, f: case.build(v, f).to_sparse_csr(dense_dim=dd)) if layout == "csr" else case.build
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
