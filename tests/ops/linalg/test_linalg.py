"""Matrix products of SparseTensors (ops/linalg/product.py, ops/shape/reshape.py) against the dense computation::

    densify(op(A, ...)) == op(A.to_dense(), ...)           (assert_close, equal_nan=True)

over COO / CSR / hybrid / uncoalesced inputs, zero, nonzero, NaN, inf and indefinite fills
(indefinite: masked semantics, compared with ``to_dense(fill_value=0)``), float32/float64,
0-size dims, the sparse operand on either side or both; never a DensifyWarning.  gradcheck
over ``(values, fill)`` of mm and matmul, and over the dense operand.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import sparsefill
from sparsefill import SparseTensor
from torch.testing import assert_close
from tests.models.test_training_loops import _W, _X

NAN, INF = float("nan"), float("inf")
FILLS = [0.0, 2.5, NAN, -INF, "indefinite"]


@pytest.fixture(autouse=True)
def _no_densify():
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        yield


def make(
    shape,
    fill,
    *,
    layout=torch.sparse_coo,
    dense_dim=0,
    uncoalesced=False,
    dtype=torch.float64,
    seed=0,
    p=0.4,
):
    """``(A, reference dense)``: ~``p`` of the (sparse) positions specified with random values."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, dtype=dtype, generator=g)
    S = shape[: len(shape) - dense_dim]
    mask = torch.rand(S, generator=g) < p
    indefinite = fill == "indefinite"
    if indefinite:
        f = torch.zeros((), dtype=dtype)
    elif dense_dim and fill != 0:  # an array fill over the dense dims
        f = torch.full(shape[len(S) :], fill, dtype=dtype) + torch.arange(shape[-1], dtype=dtype)
    else:
        f = torch.tensor(fill, dtype=dtype)
    x[~mask] = f
    return respecified(
        x, f, layout, dense_dim, g, indefinite=indefinite, uncoalesced=uncoalesced
    ), x


def respecified(x, f, layout, dense_dim, g, *, indefinite=False, uncoalesced=False):
    """``x`` as a SparseTensor with fill ``f`` (indefinite: the same pattern, masked; uncoalesced: every
    element split in two duplicates, order shuffled)."""
    A = sparsefill.to_sparse(x, fill_value=f, layout=layout, dense_dim=dense_dim)
    if indefinite or uncoalesced:
        C = A.to_sparse_coo()
        idx, v = C._indices(), C._values()
        if uncoalesced:
            perm = torch.randperm(2 * v.shape[0], generator=g)
            idx, v = torch.cat([idx, idx], 1)[:, perm], torch.cat([v - 1, torch.ones_like(v)])[perm]
        A = sparsefill.sparse_coo_tensor(
            idx, v, x.shape, fill_value=sparsefill.indefinite if indefinite else f
        )
        if layout is torch.sparse_csr:
            A = A.to_sparse_csr()
    return A


def close(got, ref):
    if isinstance(got, SparseTensor) and got.is_fill_indefinite():  # compare where specified
        mask = torch.ones_like(got).to_dense(fill_value=0).bool()
        got, ref = got.to_dense(fill_value=NAN), torch.where(mask, ref, NAN)
    if isinstance(got, SparseTensor):
        got = got.to_dense()
    assert got.shape == ref.shape
    torch.testing.assert_close(got, ref, equal_nan=True)


def rand(*shape, dtype=torch.float64, seed=1):
    return torch.randn(shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


# (name, shape of the sparse operand, function of (sparse-or-dense operand) -> result, position)
def _cases():
    X43, X25, v4 = rand(4, 3), rand(2, 5), rand(4)
    B243, X253 = rand(2, 4, 3), rand(2, 2, 5)
    M35, v5 = rand(3, 5), rand(5)
    yield "mm sparse@dense", (5, 4), lambda A: torch.mm(A, X43)
    yield "mm dense@sparse", (5, 4), lambda A: torch.mm(X25, A)
    yield "matmul 2x2", (5, 4), lambda A: A @ X43
    yield "matmul 2x1", (5, 4), lambda A: torch.matmul(A, v4)
    yield "matmul 1x2", (5,), lambda A: torch.matmul(A, rand(5, 3))
    yield "matmul 2x1 dense@sparse", (5,), lambda A: torch.matmul(M35, A)
    yield "matmul 1x1", (5,), lambda A: torch.matmul(A, v5)
    yield "matmul 3x2", (2, 5, 4), lambda A: torch.matmul(A, X43)
    yield "matmul 2x3", (5, 4), lambda A: torch.matmul(A, B243)
    yield "matmul 3x3", (2, 5, 4), lambda A: torch.matmul(A, B243)
    yield "matmul dense 3x2", (5, 4), lambda A: torch.matmul(rand(2, 3, 5), A)
    yield "mv", (5, 4), lambda A: torch.mv(A, v4)
    yield "mv dense@sparse", (5,), lambda A: torch.mv(M35, A)
    yield "bmm sparse@dense", (2, 5, 4), lambda A: torch.bmm(A, B243)
    yield "bmm dense@sparse", (2, 5, 4), lambda A: torch.bmm(X253, A)
    yield "addmm bias", (5, 3), lambda A: torch.addmm(A, rand(5, 4), X43, beta=0.5, alpha=2)
    yield "addmm mat1", (5, 4), lambda A: torch.addmm(rand(5, 3), A, X43, beta=0.5, alpha=2)
    yield "addmm mat2", (5, 4), lambda A: torch.addmm(rand(2, 4), X25, A)
    yield (
        "addmm beta=0",
        (5, 4),
        lambda A: torch.addmm(torch.full((5, 3), NAN, dtype=A.dtype), A, X43, beta=0),
    )
    yield "addmv", (5, 4), lambda A: torch.addmv(rand(5), A, v4, alpha=-1)
    yield "addmv vec", (4,), lambda A: torch.addmv(rand(5), rand(5, 4), A)
    yield "baddbmm", (2, 5, 4), lambda A: torch.baddbmm(rand(2, 5, 3), A, B243, beta=2)
    yield "addbmm", (2, 5, 4), lambda A: torch.addbmm(rand(5, 3), A, B243, alpha=0.5)
    yield "addbmm bias", (5, 3), lambda A: torch.addbmm(A, rand(2, 5, 4), B243)
    yield "addr", (5,), lambda A: torch.addr(rand(5, 4), A, v4, beta=2)
    yield "addr vec2", (4,), lambda A: torch.addr(rand(5, 4), v5, A)
    yield "outer", (5,), lambda A: torch.outer(A, v4)
    yield "dot", (5,), lambda A: torch.dot(A, v5)
    yield "dot dense.sparse", (5,), lambda A: torch.dot(v5, A)
    yield "vdot", (5,), lambda A: torch.vdot(A, v5)
    yield "inner", (5, 4), lambda A: torch.inner(A, rand(3, 4))
    yield "inner 1d", (5,), lambda A: torch.inner(A, v5)
    yield "tensordot", (3, 4, 5), lambda A: torch.tensordot(A, rand(4, 5, 2), dims=2)
    yield (
        "tensordot dense first",
        (4, 5),
        lambda A: torch.tensordot(rand(3, 4, 5), A, dims=([1, 2], [0, 1])),
    )
    yield "einsum ij,jk", (5, 4), lambda A: torch.einsum("ij,jk->ik", A, X43)
    yield "einsum ki,kj", (4, 5), lambda A: torch.einsum("ki,kj->ij", A, X43)
    yield "einsum bij,bjk", (2, 5, 4), lambda A: torch.einsum("bij,bjk->bik", A, B243)
    yield "einsum ij,ij->", (5, 4), lambda A: torch.einsum("ij,ij->", A, rand(5, 4))
    yield "einsum i,i->", (5,), lambda A: torch.einsum("i,i->", A, v5)


CASES = list(_cases())


# CSR needs 2 sparse dims: 1-d operands are COO only
ONE = [
    pytest.param(c, f, lay, id=f"{c[0]}-{f}-{lay}")
    for c in CASES
    for f in FILLS
    for lay in ("coo", "csr", "uncoalesced")
    if lay != "csr" or len(c[1]) >= 2
]


@pytest.mark.parametrize("case, fill, layout", ONE)
def test_one_sparse_operand(case, fill, layout):
    name, shape, fn = case
    lay = torch.sparse_csr if layout == "csr" else torch.sparse_coo
    A, x = make(shape, fill, layout=lay, uncoalesced=layout == "uncoalesced")
    close(fn(A), fn(x))


@pytest.mark.parametrize("fill", [0.0, 2.5, NAN, "indefinite"], ids=str)
@pytest.mark.parametrize("case", [c for c in CASES if len(c[1]) >= 2], ids=lambda c: c[0])
def test_hybrid(case, fill):
    """One dense dim (row-sparse matrices; an array fill along it).  Where a dense dim must become
    sparse (a transpose, a merge of a sparse with a dense dim: tensordot, einsum), the array fill
    becomes its most common value plus specified elements (test_shape.py)."""
    name, shape, fn = case
    A, x = make(shape, fill, dense_dim=1)
    close(fn(A), fn(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("fill", FILLS, ids=str)
@pytest.mark.parametrize("la", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
@pytest.mark.parametrize("lb", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
def test_sparse_sparse(la, lb, fill, dtype):
    A, a = make((6, 5), fill, layout=la, dtype=dtype, seed=2)
    B, b = make((5, 4), 1.5 if fill == 2.5 else fill, layout=lb, dtype=dtype, seed=3)
    out = A @ B
    close(out, a @ b)
    # zero (and indefinite: masked, an empty sum is 0) fills: the product is sparse
    assert isinstance(out, SparseTensor) == (fill in (0.0, "indefinite"))
    if isinstance(out, SparseTensor):
        assert out._fill_is_zero() and out.sparse_layout is la
    close(
        torch.mv(A, make((5,), fill, dtype=dtype, seed=4)[0]),
        a @ make((5,), fill, dtype=dtype, seed=4)[1],
    )
    C, c = make((2, 6, 5), fill, dtype=dtype, seed=5)
    D, d = make((2, 5, 3), fill, dtype=dtype, seed=6)
    close(torch.bmm(C, D), torch.bmm(c, d))
    close(torch.matmul(C, B), torch.matmul(c, b))
    u, uu = make((5,), fill, dtype=dtype, seed=7)
    w, ww = make((5,), 2.0 if fill == 2.5 else fill, dtype=dtype, seed=8)
    close(torch.dot(u, w), torch.dot(uu, ww))
    (M, mm_) = make((6, 4), fill, dtype=dtype)
    close(torch.addmm(M, A, B), torch.addmm(mm_, a, b))


@pytest.mark.parametrize("fa", [0.0, 2.5, NAN, INF, "indefinite"], ids=str)
@pytest.mark.parametrize("fb", [0.0, -1.5, NAN, -INF, "indefinite"], ids=str)
def test_sparse_sparse_mixed_fills(fa, fb):
    """Every pair of fill kinds; non-finite fills are exact (no densifying), e.g. 0 * inf = NaN."""
    A, a = make((6, 5), fa, seed=2)
    B, b = make((5, 4), fb, layout=torch.sparse_csr, seed=3)
    close(A @ B, masked_matmul(A, a, B, b))
    C, c = make((2, 6, 5), fa, seed=5)
    D, d = make((2, 5, 3), fb, seed=6)
    close(torch.bmm(C, D), masked_matmul(C, c, D, d))
    (u, uu), (w, ww) = make((5,), fa, seed=7), make((5,), fb, seed=8)
    close(torch.dot(u, w), masked_matmul(u, uu, w, ww))
    if "indefinite" not in (fa, fb):
        (u, uu), (w, ww) = make((5,), fa, seed=7), make((4,), fb, seed=9)
        close(torch.outer(u, w), torch.outer(uu, ww))


def _mask(A, x):
    if isinstance(A, SparseTensor) and A.is_fill_indefinite():
        return torch.ones_like(A).to_dense(fill_value=0).bool()
    return torch.ones(x.shape, dtype=torch.bool)


def masked_matmul(A, a, B, b):
    """Reference: ``sum_k a[.., i, k] * b[.., k, j]`` over the ``k`` where both are defined
    (an indefinite fill's unspecified elements are skipped: masked semantics)."""
    ma, mb = _mask(A, a), _mask(B, b)
    if a.dim() == 1:
        return torch.where(ma & mb, a * b, 0).sum()
    prod = a.unsqueeze(-1) * b.unsqueeze(-3)
    return torch.where(ma.unsqueeze(-1) & mb.unsqueeze(-3), prod, 0).sum(-2)


@pytest.mark.parametrize("fill", [0.0, 2.5, NAN], ids=str)
def test_sparse_sparse_hybrid(fill):
    A, a = make((6, 5), fill, dense_dim=1, seed=2)
    B, b = make((5, 4), fill, dense_dim=1, seed=3)
    close(A @ B, a @ b)
    C, c = make((2, 6, 5), fill, dense_dim=1, seed=4)
    D, d = make((2, 5, 3), fill, seed=5)
    close(torch.bmm(C, D), torch.bmm(c, d))


@pytest.mark.parametrize("fill", [0.0, 2.5, NAN], ids=str)
def test_float32_and_batched_csr(fill):
    A, a = make((5, 4), fill, layout=torch.sparse_csr, dtype=torch.float32)
    X = rand(4, 3, dtype=torch.float32)
    close(A @ X, a @ X)
    close(X.T @ A.T, X.T @ a.T)
    B, b = make((3, 5, 4), fill, layout=torch.sparse_csr, dtype=torch.float32)
    close(
        torch.bmm(B, rand(3, 4, 2, dtype=torch.float32)),
        torch.bmm(b, rand(3, 4, 2, dtype=torch.float32)),
    )


@pytest.mark.parametrize("fill", [0.0, 2.5, NAN], ids=str)
@pytest.mark.parametrize(
    "shapes",
    [((0, 4), (4, 3)), ((5, 0), (0, 3)), ((5, 4), (4, 0)), ((0, 5, 4), (0, 4, 3))],
    ids=str,
)
def test_empty(shapes, fill):
    sa, sb = shapes
    A, a = make(sa, fill)
    X = rand(*sb)
    op = torch.bmm if len(sa) == 3 else torch.mm
    close(op(A, X), op(a, X))
    B, b = make(sb, fill)
    close(op(A, B), op(a, b))
    Y = rand(*sa)
    close(op(Y, B), op(Y, b))


def test_zero_fill_native_csr_arrays():
    """Zero fill, 2-d CSR: the stored arrays go to torch's kernel as they are (no correction)."""
    A, a = make((50, 40), 0.0, layout=torch.sparse_csr)
    native = torch.sparse_csr_tensor(A.crow_indices(), A.col_indices(), A.values(), A.shape)
    X = rand(40, 8)
    torch.testing.assert_close(A @ X, native @ X, rtol=0, atol=0)


def test_rank_one_correction_by_hand():
    """A @ X == (A - a) @ X + a * X.sum(0), with (A - a) a native zero-fill CSR matrix."""
    A, a = make((30, 20), 3.0, layout=torch.sparse_csr)
    X = rand(20, 6)
    native = torch.sparse_csr_tensor(A.crow_indices(), A.col_indices(), A.values() - 3.0, A.shape)
    torch.testing.assert_close(A @ X, native @ X + 3.0 * X.sum(0), rtol=1e-12, atol=1e-12)


def test_errors_as_torch():
    A, _ = make((5, 4), 2.0)
    with pytest.raises(RuntimeError):
        torch.mm(A, rand(5, 3))
    with pytest.raises(RuntimeError):
        torch.mm(A, rand(4, 3, dtype=torch.float32))
    with pytest.raises(RuntimeError):
        torch.bmm(make((2, 5, 4), 1.0)[0], rand(3, 4, 2))


def test_inputs_unchanged():
    A, a = make((5, 4), 2.0, uncoalesced=True)
    vals, idx, fill = A._vals.clone(), A._idx.clone(), A._fill.clone()
    A @ rand(4, 3)
    torch.mm(rand(2, 5), A)
    assert torch.equal(A._vals, vals) and torch.equal(A._idx, idx) and torch.equal(A._fill, fill)


# ---------------------------------------------------------------------- autograd
def _coo_fn(idx, shape, op, layout=torch.sparse_coo):
    def f(values, fill, x):
        A = sparsefill.sparse_coo_tensor(idx, values, shape, fill_value=fill)
        if layout is torch.sparse_csr:
            A = A.to_sparse_csr()
        return op(A, x)

    return f


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
@pytest.mark.parametrize(
    "op",
    [
        ("mm", (5, 4), (4, 3), lambda A, x: torch.mm(A, x)),
        ("mm dense@sparse", (5, 4), (2, 5), lambda A, x: torch.mm(x, A)),
        ("matmul", (5, 4), (4, 3), lambda A, x: torch.matmul(A, x)),
        ("matmul 3x2", (2, 5, 4), (4, 3), lambda A, x: torch.matmul(A, x)),
        ("matmul 2x1", (5, 4), (4,), lambda A, x: torch.matmul(A, x)),
        ("matmul dense 3x2", (5, 4), (2, 3, 5), lambda A, x: torch.matmul(x, A)),
    ],
    ids=lambda o: o[0],
)
def test_gradcheck_values_fill(op, layout):
    name, shape, xshape, fn = op
    if layout is torch.sparse_csr and len(shape) != 2:
        layout = (
            torch.sparse_coo
        )  # (batched CSR is compared with dense in test_float32_and_batched_csr)
    g = torch.Generator().manual_seed(0)
    keys = torch.randperm(torch.Size(shape).numel(), generator=g)[:7].sort().values
    idx = torch.stack(torch.unravel_index(keys, shape))
    values = torch.randn(7, dtype=torch.float64, generator=g, requires_grad=True)
    fill = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
    x = torch.randn(xshape, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(_coo_fn(idx, shape, fn, layout), (values, fill, x))


def test_gradients_match_dense():
    A, a = make((5, 4), 2.0)
    Ad = A.to_dense().detach().requires_grad_()
    x = rand(4, 3).requires_grad_()
    xd = x.detach().clone().requires_grad_()
    A.requires_grad_()
    (A @ x).sin().sum().backward()
    (Ad @ xd).sin().sum().backward()
    close(A.grad, Ad.grad)
    close(x.grad, xd.grad)


def test_inference_mode():
    A, a = make((2, 5, 4), 2.5)
    X = rand(4, 3)
    with torch.inference_mode():
        close(torch.matmul(A, X), torch.matmul(a, X))
        close(torch.einsum("bij,jk->bik", A, X), torch.einsum("bij,jk->bik", a, X))


@pytest.mark.parametrize("fill", [0, 5])
def test_integer_dtype(fill):
    """torch's CSR kernels are floating-point only: integer products run on the COO kernel."""
    x = torch.tensor([[1, 5, 2], [5, 5, 3]])
    y = torch.arange(6).reshape(3, 2)
    for layout in (torch.sparse_coo, torch.sparse_csr):
        A = sparsefill.to_sparse(x, fill_value=fill, layout=layout)
        assert torch.equal(A @ y, x @ y)
        assert torch.equal(y.T @ A.T, y.T @ x.T)
        assert torch.equal(torch.mv(A, y[:, 0]), x @ y[:, 0])


def test_gradcheck_sparse_sparse_and_bmm():
    g = torch.Generator().manual_seed(3)

    def parts(shape, nse):
        keys = torch.randperm(torch.Size(shape).numel(), generator=g)[:nse].sort().values
        return (
            torch.stack(torch.unravel_index(keys, shape)),
            torch.randn(nse, dtype=torch.float64, generator=g, requires_grad=True),
            torch.tensor(0.7, dtype=torch.float64, requires_grad=True),
        )

    (ia, va, fa), (ib, vb, fb) = parts((4, 3), 5), parts((3, 5), 6)

    def f(va, fa, vb, fb):
        A = sparsefill.sparse_coo_tensor(ia, va, (4, 3), fill_value=fa)
        B = sparsefill.sparse_coo_tensor(ib, vb, (3, 5), fill_value=fb).to_sparse_csr()
        return torch.mm(A, B)

    assert torch.autograd.gradcheck(f, (va, fa, vb, fb))
    ic, vc, fc = parts((2, 4, 3), 7)
    x = torch.randn(2, 3, 2, dtype=torch.float64, generator=g, requires_grad=True)

    def h(vc, fc, x):
        return torch.bmm(sparsefill.sparse_coo_tensor(ic, vc, (2, 4, 3), fill_value=fc), x)

    assert torch.autograd.gradcheck(h, (vc, fc, x))


@pytest.mark.parametrize("fill", [0.0, 2.5, NAN, "indefinite"], ids=str)
def test_linear_and_4d_matmul(fill):
    """nn.functional.linear (a transposed sparse weight into addmm/matmul), 4-d matmul (views), einsum
    with a transposed operand."""
    A, a = make((2, 3, 5, 4), fill)
    close(torch.matmul(A, rand(4, 3)), torch.matmul(a, rand(4, 3)))
    close(torch.matmul(rand(2, 3, 6, 5), A), torch.matmul(rand(2, 3, 6, 5), a))
    W, w = make((6, 4), fill)
    for x in (rand(3, 4), rand(2, 3, 4)):
        close(torch.nn.functional.linear(x, W, rand(6)), torch.nn.functional.linear(x, w, rand(6)))
    close(torch.einsum("ij,kj->ik", W, rand(3, 4)), torch.einsum("ij,kj->ik", w, rand(3, 4)))
    B, b = make((2, 5, 4), fill)
    close(
        torch.einsum("bij,bkj->bik", B, rand(2, 3, 4)),
        torch.einsum("bij,bkj->bik", b, rand(2, 3, 4)),
    )


def test_linear_layer_gradients_reach_values_and_fill():
    """A sparse weight with a fill: gradients of (values, fill) equal those through the dense weight."""
    g = torch.Generator().manual_seed(5)
    idx = torch.stack(
        torch.unravel_index(torch.randperm(24, generator=g)[:6].sort().values, (6, 4))
    )
    x, bias = torch.randn(3, 4, dtype=torch.float64, generator=g), rand(6)
    grads = []
    for through_dense in (False, True):
        values = torch.randn(
            6, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True
        )
        fill = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
        W = sparsefill.sparse_coo_tensor(idx, values, (6, 4), fill_value=fill)
        W = W.to_dense() if through_dense else W
        torch.nn.functional.linear(x, W, bias).tanh().sum().backward()
        grads.append((values.grad, fill.grad))
    torch.testing.assert_close(grads[0], grads[1])


VIEWS = [
    ("t", (5, 4), lambda A: A.t()),
    ("transpose", (2, 5, 4), lambda A: A.transpose(0, 2)),
    ("permute", (2, 5, 4), lambda A: A.permute(1, 2, 0)),
    ("unsqueeze", (5, 4), lambda A: A.unsqueeze(1)),
    ("unsqueeze last", (5, 4), lambda A: A.unsqueeze(-1)),
    ("squeeze", (5, 1, 4), lambda A: A.squeeze(1)),
    ("view merge", (2, 5, 4), lambda A: A.view(10, 4)),
    ("view split", (6, 4), lambda A: A.reshape(2, 3, 2, 2)),
    ("expand", (1, 5, 4), lambda A: A.expand(3, 5, 4)),
    ("expand new dim", (5, 4), lambda A: A.expand(2, 5, 4)),
]


@pytest.mark.parametrize("kind", ["coo", "csr", "hybrid", "uncoalesced"])
@pytest.mark.parametrize("fill", [0.0, 2.5, NAN, "indefinite"], ids=str)
@pytest.mark.parametrize("case", VIEWS, ids=[v[0] for v in VIEWS])
def test_shape_views(case, fill, kind):
    """The views of shape.py on the stored elements: same dense tensor as the dense view, no densifying
    (a hybrid tensor's array fill follows a dense dim that becomes sparse: test_shape.py)."""
    name, shape, fn = case
    A, x = make(
        shape,
        fill,
        layout=torch.sparse_csr if kind == "csr" else torch.sparse_coo,
        dense_dim=int(kind == "hybrid"),
        uncoalesced=kind == "uncoalesced",
    )
    out = fn(A)
    assert isinstance(out, SparseTensor)
    close(out, fn(x))


# ---------------------------------------------------------------------- routed backward of a scaled hybrid operand
@pytest.mark.parametrize("w_grad", [False, True], ids=["w", "w leaf"])
@pytest.mark.parametrize("op", ["var_mean dim 1", "var_mean", "std_mean (0, 2)", "A@X"])
def test_routed_backward_of_a_dense_dims_scaled_operand(op, w_grad):
    """``A * w`` with ``w`` over the dense dims of a hybrid ``A`` has the same derivative at every unspecified
    element of each dense position: the routed backwards (var_mean/std_mean, products) take it (as sparse as the
    forward), with the gradients of values, fill and ``w`` as dense; ``w`` varying along a sparse dim is not
    routed (torch's formulas) and exact too."""
    g = torch.Generator().manual_seed(2)
    idx = torch.tensor([[0, 1, 2, 3, 3], [1, 0, 2, 1, 3]])
    V, F, X = (torch.randn(s, dtype=torch.float64, generator=g) for s in ((5, 3), (3,), (3, 2)))
    fns = {
        "var_mean dim 1": lambda B: torch.var_mean(B, 1),
        "var_mean": lambda B: torch.var_mean(B),
        "std_mean (0, 2)": lambda B: torch.std_mean(B, (0, 2)),
        "A@X": lambda B: (B @ X,),
    }
    for wshape, routed in (((3,), True), ((4, 1, 1), False)):
        W = torch.randn(wshape, dtype=torch.float64, generator=g)
        grads = []
        for dense in (False, True):
            v, f, w = (
                V.clone().requires_grad_(),
                F.clone().requires_grad_(),
                W.clone().requires_grad_(w_grad),
            )
            A = sparsefill.sparse_coo_tensor(idx, v, (4, 4, 3), fill_value=f)
            outs = fns[op]((A.to_dense() if dense else A) * w)
            if not dense and routed:
                assert all(
                    type(o.grad_fn).__name__ in ("SparseReduceBackward", "SparseMMBackward")
                    for o in outs
                )
            outs = [o.to_dense() if isinstance(o, SparseTensor) else o for o in outs]
            sum((o * (n + 1)).sum() for n, o in enumerate(outs)).backward()
            grads.append([outs, v.grad, f.grad] + ([w.grad] if w_grad else []))
        torch.testing.assert_close(grads[0], grads[1])


# ---------------------------------------------------------------------- half types and autocast
HALF = [torch.bfloat16, torch.float16]


def _half_cases():
    """(name, shape of the sparse operand, fn(A, r)) with ``r(*shape)`` the dense operands in A's dtype."""
    lin = torch.nn.functional.linear
    yield "mm", (5, 4), lambda A, r: torch.mm(A, r(4, 3))
    yield "mm dense@sparse", (5, 4), lambda A, r: torch.mm(r(2, 5), A)
    yield "matmul 2x1", (5, 4), lambda A, r: A @ r(4)
    yield "matmul 1x2", (5,), lambda A, r: A @ r(5, 3)
    yield "matmul 3x2", (2, 5, 4), lambda A, r: A @ r(4, 3)
    yield "mv", (5, 4), lambda A, r: torch.mv(A, r(4))
    yield "bmm", (2, 5, 4), lambda A, r: torch.bmm(A, r(2, 4, 3))
    yield "addmm", (5, 4), lambda A, r: torch.addmm(r(5, 3), A, r(4, 3), beta=0.5, alpha=2)
    yield "addmm bias", (5, 3), lambda A, r: torch.addmm(A, r(5, 4), r(4, 3))
    yield "addmv", (5, 4), lambda A, r: torch.addmv(r(5), A, r(4))
    yield "baddbmm", (2, 5, 4), lambda A, r: torch.baddbmm(r(2, 5, 3), A, r(2, 4, 3))
    yield "addbmm", (2, 5, 4), lambda A, r: torch.addbmm(r(5, 3), A, r(2, 4, 3))
    yield "addr", (5,), lambda A, r: torch.addr(r(5, 4), A, r(4))
    yield "dot", (5,), lambda A, r: torch.dot(A, r(5))
    yield "linear", (6, 4), lambda A, r: lin(r(3, 4), A, r(6))
    yield "linear sparse input", (3, 4), lambda A, r: lin(A, r(6, 4), r(6))
    yield "einsum", (5, 4), lambda A, r: torch.einsum("ij,kj->ik", A, r(3, 4))
    yield "sparse.mm", (5, 4), lambda A, r: torch.sparse.mm(A, r(4, 3))


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("case", list(_half_cases()), ids=lambda c: c[0])
def test_half_dtypes(case, dtype):
    """bfloat16/float16 (no sparse kernel of torch's has them): computed in float32 and rounded once, as torch's
    dense CPU product; the result's dtype and values are the dense product's (torch's tolerances for the dtype).
    COO, CSR, uncoalesced, hybrid; zero, nonzero, NaN and indefinite fills."""
    name, shape, fn = case
    r = lambda *s: rand(*s, seed=sum(s)).to(dtype)  # noqa: E731  (the same operands for A and its dense tensor)
    for kind in ("coo", "csr", "uncoalesced", "hybrid"):
        if kind == "csr" and len(shape) == 1:
            continue  # (CSR needs 2 sparse dims)
        for fill in (0.0, 2.5, NAN, "indefinite"):
            A, _ = make(
                shape,
                fill,
                layout=torch.sparse_csr if kind == "csr" else torch.sparse_coo,
                dtype=dtype,
                dense_dim=int(kind == "hybrid" and len(shape) > 1),
                uncoalesced=kind == "uncoalesced",
            )
            got, ref = (
                fn(A, r),
                fn(A.to_dense(fill_value=0) if fill == "indefinite" else A.to_dense(), r),
            )
            assert got.dtype == ref.dtype == dtype, (kind, fill)
            if name == "addbmm":  # torch's dense addbmm rounds once per batch: 2 roundings apart
                torch.testing.assert_close(
                    got,
                    ref,
                    equal_nan=True,
                    rtol=2**-7 if dtype == torch.float16 else 0.032,
                    atol=1e-5,
                )
            else:
                close(got, ref)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("fill", [0.0, 2.5, NAN], ids=str)
def test_half_sparse_sparse(fill, dtype):
    """Sparse @ sparse in half types: sparse for zero fills (values rounded once), else dense, as dense."""
    for la, lb in ((torch.sparse_coo, torch.sparse_csr), (torch.sparse_csr, torch.sparse_coo)):
        A, _ = make((6, 5), fill, layout=la, dtype=dtype, seed=2)
        B, _ = make((5, 4), fill, layout=lb, dtype=dtype, seed=3)
        out = A @ B
        assert out.dtype == dtype and isinstance(out, SparseTensor) == (fill == 0.0)
        close(out, A.to_dense() @ B.to_dense())
    C, _ = make((2, 6, 5), fill, dtype=dtype, seed=5)
    D, _ = make((2, 5, 3), fill, dtype=dtype, seed=6)
    close(torch.bmm(C, D), torch.bmm(C.to_dense(), D.to_dense()))


def _grad_ops():
    lin = torch.nn.functional.linear
    yield "matmul", (5, 4), (4, 3), lambda A, x, b: A @ x
    yield "mm dense@sparse", (5, 4), (3, 5), lambda A, x, b: torch.mm(x, A)
    yield "mv", (5, 4), (4,), lambda A, x, b: torch.mv(A, x)
    yield "addmm", (5, 4), (4, 3), lambda A, x, b: torch.addmm(b[:3].expand(5, 3), A, x, alpha=2)
    yield "addmv", (5, 4), (4,), lambda A, x, b: torch.addmv(b[:5], A, x)
    yield "linear", (6, 4), (3, 4), lambda A, x, b: lin(x, A, b)
    yield "bmm", (2, 5, 4), (2, 4, 3), lambda A, x, b: torch.bmm(A, x)
    yield "sparse@sparse", (5, 4), (5, 3), lambda A, x, b: A @ A.T @ x


@pytest.mark.parametrize("mode", ["autocast", "bfloat16", "float16"])
@pytest.mark.parametrize("kind", ["coo", "csr", "hybrid"])
@pytest.mark.parametrize("op", list(_grad_ops()), ids=lambda o: o[0])
def test_half_gradients(op, kind, mode):
    """Forward dtype and gradients of values, fill and the dense operands as through the dense tensor: under
    ``torch.autocast("cpu", dtype=torch.bfloat16)`` (float32 leaves: autocast casts the SparseTensor, fill
    included, as dense; mv/addmv stay float32, as dense) and with half leaves.  Positive data: relative
    tolerances of the half type hold for the sums."""
    name, shape, xshape, fn = op
    if kind == "csr" and len(shape) == 3:
        kind = "coo"  # (batched CSR: test_half_dtypes)
    dt = torch.float32 if mode == "autocast" else getattr(torch, mode)
    g = torch.Generator().manual_seed(0)
    pos = lambda *s: (torch.rand(s, generator=g) + 0.5).to(dt)  # noqa: E731
    sd = len(shape) - (kind == "hybrid")
    keys = torch.randperm(torch.Size(shape[:sd]).numel(), generator=g)[:3].sort().values
    idx = torch.stack(torch.unravel_index(keys, shape[:sd]))
    V, X, Bias = pos(3, *shape[sd:]), pos(*xshape), pos(6)
    out, grads = [], []
    for dense in (False, True):
        v, f = V.clone().requires_grad_(), torch.tensor(0.3, dtype=dt, requires_grad=True)
        x, b = X.clone().requires_grad_(), Bias.clone().requires_grad_()
        A = sparsefill.sparse_coo_tensor(idx, v, shape, fill_value=f)
        A = A.to_sparse_csr() if kind == "csr" else A
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast"):
            y = fn(A.to_dense() if dense else A, x, b)
        y = y.to_dense() if isinstance(y, SparseTensor) else y
        (y.float() * torch.arange(1.0, y.numel() + 1).reshape(y.shape)).sum().backward()
        out.append(y)
        grads.append([t.grad for t in (v, f, x, b) if t.grad is not None])
    assert out[0].dtype == out[1].dtype and [t.dtype for t in grads[0]] == [
        t.dtype for t in grads[1]
    ]
    tol = dict(rtol=1.6e-2, atol=1e-5) if torch.bfloat16 in (dt, out[1].dtype) else {}
    torch.testing.assert_close(out[0], out[1], **tol)
    torch.testing.assert_close(grads[0], grads[1], **tol)


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=str)
def test_added_tensor_of_another_dtype_raises_as_dense(layout):
    """``F.linear``'s bias and ``addmm``'s input are not promoted (torch raises "self and mat2 must have the same
    dtype"); the routed products raise the same (a bfloat16 weight with a float32 bias returned float32).  Under
    autocast the bias is cast as dense casts it."""
    W = sparsefill.sparse_coo_tensor(
        [[0, 1, 3], [1, 2, 0]], [1.0, 2.0, 3.0], (4, 3), fill_value=0.5
    )
    W = W.to_sparse_csr() if layout is torch.sparse_csr else W
    x = torch.randn(2, 3)
    for Wt, xt, b in [
        (W, x, torch.randn(4, dtype=torch.float64)),
        (W.to(torch.bfloat16), x.to(torch.bfloat16), torch.randn(4)),
    ]:
        for f in (
            lambda w: torch.nn.functional.linear(xt, w, b),
            lambda w: torch.addmm(b, xt, w.t()),
        ):
            with pytest.raises(RuntimeError) as dense_err:
                f(Wt.to_dense())
            with pytest.raises(RuntimeError, match="must have the same dtype") as ours:
                f(Wt)
            assert str(ours.value) == str(dense_err.value)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        b = torch.randn(4)
        out, ref = (
            torch.nn.functional.linear(x, W, b),
            torch.nn.functional.linear(x, W.to_dense(), b),
        )
    assert out.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref)


BOOL_PRODUCTS = {
    "mm": lambda a, d: torch.mm(a, a),
    "mm dense": lambda a, d: torch.mm(a, d),
    "dense mm": lambda a, d: torch.mm(d, a),
    "matmul": lambda a, d: a @ a,
    "mv": lambda a, d: torch.mv(a, d[0]),
    "bmm": lambda a, d: torch.bmm(a[None], a[None]),
    "bmm dense": lambda a, d: torch.bmm(a[None], d[None]),
    "einsum": lambda a, d: torch.einsum("ij,jk->ik", a, a),
    "einsum dense": lambda a, d: torch.einsum("ij,jk->ik", a, d),
    "addmm": lambda a, d: torch.addmm(d, a, d),
    "trace": lambda a, d: torch.trace(a),
}


@pytest.mark.parametrize("fill", [False, True], ids=["fill False", "fill True"])
@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
@pytest.mark.parametrize("name", sorted(BOOL_PRODUCTS))
def test_bool_products_raise_as_dense(name, layout, fill):
    """Dense CPU products and ``trace`` of bool tensors raise NotImplementedError: so do they of bool SparseTensors
    (``trace`` returned an int64 sum, the products of a True fill a RuntimeError from the fill's subtraction)."""
    d = torch.tensor([[True, False], [False, True]])
    A = sparsefill.to_sparse(d, fill_value=fill, layout=layout)
    f = BOOL_PRODUCTS[name]
    with pytest.raises(NotImplementedError):
        f(d, d)
    with pytest.raises(NotImplementedError):
        f(A, d)


def test_products_of_empty_operands_check_dtypes_as_dense():
    """Empty operands run no kernel, but torch's checks still hold: ``A @ B`` of float and int64 raises as dense
    (the meta kernel takes mixed dtypes; it returned an empty result), and bool ``addmm`` with ``beta=2`` keeps
    bool (``True * 2`` promoted the result to int64)."""
    A = sparsefill.to_sparse(torch.zeros(0, 2), layout=torch.sparse_csr)
    B = sparsefill.to_sparse(torch.zeros(2, 0, dtype=torch.int64), layout=torch.sparse_csr)
    with pytest.raises(RuntimeError, match="same dtype"):
        A.to_dense() @ B.to_dense()
    with pytest.raises(RuntimeError, match="same dtype"):
        A @ B
    M = sparsefill.to_sparse(torch.ones(1, 1, dtype=torch.bool))
    X, S = torch.ones(1, 0, dtype=torch.bool), torch.ones(1, 0, dtype=torch.bool)
    out, want = torch.addmm(S, M, X, beta=2), torch.addmm(S, M.to_dense(), X, beta=2)
    assert out.dtype == want.dtype == torch.bool and out.shape == want.shape


@pytest.mark.parametrize(
    "x_shape,w_shape",
    [((0, 0), (0, 0)), ((2, 0), (3, 0)), ((0, 4), (3, 4)), ((2, 0, 4), (3, 4))],
    ids=str,
)
def test_linear_of_an_input_with_no_element(x_shape, w_shape):
    """``F.linear(x, W)`` with a sparse ``W`` and an ``x`` of 0 elements is dense's empty result (the route reshaped
    ``x`` to ``(-1, in_features)``, ambiguous for 0 elements: RuntimeError)."""
    for dtype in (torch.float32, torch.int64):
        W = sparsefill.to_sparse(torch.zeros(w_shape, dtype=dtype), layout=torch.sparse_csr)
        x = torch.zeros(x_shape, dtype=dtype)
        out, want = torch.nn.functional.linear(x, W), torch.nn.functional.linear(x, W.to_dense())
        assert out.dtype == want.dtype and out.shape == want.shape


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_precision_matmul(dtype):
    """bfloat16/float16 products as dense (they raised NotImplementedError: torch's sparse kernels have no half
    types; ``ops/linalg.product`` computes them in float32 and rounds once, as dense CPU ``mm``)."""
    W, x = _W().to(dtype), _X.T[:, :2].to(dtype)
    assert_close(W @ x, W.to_dense() @ x)
    assert_close(torch.nn.functional.linear(x.T, W), torch.nn.functional.linear(x.T, W.to_dense()))
