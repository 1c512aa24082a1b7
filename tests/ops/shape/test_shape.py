"""Shape and view ops of SparseTensors (ops/shape/reshape.py, ops/views.py) against the dense computation::

    op(A).to_dense() == op(A.to_dense())                    (assert_close, equal_nan=True)

for COO / CSR / hybrid / uncoalesced inputs with scalar, NaN, inf, indefinite and array fills
(uniform, mostly uniform, all distinct), empty patterns and 0-size dims, never a DensifyWarning
where the result is not dense by nature:

1. permutes / views that move a dense dim before a sparse one (a SparseTensor keeps its dense dims after its sparse ones): the dense dims
   become sparse, an array fill becomes its most common value plus specified elements;
2. writes through views (``A[0].add_(1)``, ``A.t().mul_(2)``...) are written back natively, base
   and view both compared with torch's own views of the dense tensor;
3. the shape ops and COO <-> CSR conversions keep the fill;
4. gradcheck over ``(values, fill)`` of transpose and permute alone.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.autograd import gradcheck

import sparsefill
from sparsefill import SparseTensor
from tests.ops.linalg.test_linalg import respecified

F64 = torch.float64
NAN, INF = float("nan"), float("inf")


@pytest.fixture(autouse=True)
def _no_densify():
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        yield


def array_fill(kind, D, dtype=F64):
    """An array fill over the dense shape ``D``."""
    n = torch.Size(D).numel()
    if kind == "uniform":
        f = torch.full((n,), 2.5, dtype=dtype)
    elif kind == "mostly":  # one value but two entries
        f = torch.full((n,), -1.0, dtype=dtype)
        f[1:3] = torch.tensor([4.0, NAN], dtype=dtype)[: max(0, min(2, n - 1))]
    elif kind == "distinct":
        f = torch.arange(n, dtype=dtype) + 0.5
        if n > 2:
            f[-1], f[-2] = INF, NAN
    else:
        raise ValueError(kind)
    return f.reshape(D)


def make(
    shape,
    fill,
    *,
    layout=torch.sparse_coo,
    dense_dim=0,
    uncoalesced=False,
    p=0.4,
    seed=0,
    dtype=F64,
):
    """``(A, dense reference)``; ``fill`` a number, ``"indefinite"`` or an array-fill kind of :func:`array_fill`."""
    g = torch.Generator().manual_seed(seed)
    shape = tuple(shape)
    x = torch.randn(shape, generator=g, dtype=F64).to(dtype)
    S, D = shape[: len(shape) - dense_dim], shape[len(shape) - dense_dim :]
    mask = torch.rand(S, generator=g) < p
    indefinite = fill == "indefinite"
    if indefinite:
        f = torch.zeros((), dtype=dtype)
    elif isinstance(fill, str):
        f = array_fill(fill, D, dtype)
    else:
        f = torch.tensor(fill, dtype=dtype)
    x[~mask] = f
    return respecified(
        x, f, layout, dense_dim, g, indefinite=indefinite, uncoalesced=uncoalesced
    ), x


def dense(o, fill=None):
    if isinstance(o, (tuple, list)):
        return tuple(dense(t, fill) for t in o)
    return o.to_dense(fill_value=fill) if isinstance(o, SparseTensor) else o


def close(got, ref):
    """``got`` (SparseTensor or tuple of them) equals ``ref``; indefinite: where specified."""
    if isinstance(got, (tuple, list)):
        assert len(got) == len(ref)
        for a, b in zip(got, ref):
            close(a, b)
        return
    assert isinstance(got, SparseTensor), type(got)
    if got.is_fill_indefinite():
        spec = torch.ones_like(got).to_dense(fill_value=0).bool()
        got, ref = got.to_dense(fill_value=NAN), torch.where(spec, ref, NAN)
    else:
        got = got.to_dense()
    assert got.shape == ref.shape
    torch.testing.assert_close(got, ref, equal_nan=True)


# ---------------------------------------------------------------------- 1. dense dims that become sparse
# (name, shape, dense_dim, op)
MOVES = [
    ("t", (5, 4), 1, lambda t: t.t()),
    ("transpose", (5, 3, 4), 1, lambda t: t.transpose(0, 2)),
    ("transpose dense-dense", (5, 3, 4), 2, lambda t: t.transpose(1, 2)),
    ("transpose sparse-dense", (5, 3, 4), 2, lambda t: t.transpose(0, 1)),
    ("permute", (4, 3, 2, 3), 2, lambda t: t.permute(2, 0, 3, 1)),
    ("permute 2 sparse", (4, 3, 2, 3), 1, lambda t: t.permute(3, 1, 0, 2)),
    ("reshape merge", (5, 3, 4), 2, lambda t: t.reshape(5, 12)),
    ("reshape across", (6, 4), 1, lambda t: t.reshape(4, 6)),
    ("view across", (5, 3, 4), 1, lambda t: t.view(3, 20)),
    ("flatten", (5, 3, 4), 2, lambda t: t.flatten()),
    ("flatten 0-1", (5, 3, 4), 2, lambda t: t.flatten(0, 1)),
    ("unflatten dense", (5, 6), 1, lambda t: t.unflatten(1, (2, 3)).permute(2, 0, 1)),
    (
        "tensordot",
        (5, 4),
        1,
        lambda t: torch.tensordot(
            t, torch.arange(10.0, dtype=t.dtype).reshape(5, 2), dims=([0], [0])
        ),
    ),
    (
        "tensordot 3d",
        (3, 4, 2),
        1,
        lambda t: torch.tensordot(
            t, torch.arange(8.0, dtype=t.dtype).reshape(4, 2), dims=([1], [0])
        ),
    ),
    ("einsum", (5, 4), 1, lambda t: torch.einsum("ij,ik->jk", t, torch.ones(5, 3, dtype=t.dtype))),
    ("einsum transpose", (3, 4, 2), 1, lambda t: torch.einsum("ijk->kji", t)),
    ("matmul t", (5, 4), 1, lambda t: t.t() @ torch.ones(5, 2, dtype=t.dtype)),
]
ARRAY_FILLS = ["uniform", "mostly", "distinct"]


def _sparse_result(name):
    return not name.startswith(("tensordot", "einsum ij", "matmul")) and name != "einsum"


# (products with an indefinite fill are masked products: test_linalg.py)
@pytest.mark.parametrize(
    "case, kind, fill",
    [
        pytest.param(c, k, f, id=f"{c[0]}-{k}-{f}")
        for c in MOVES
        for k in ["coo", "csr", "uncoalesced", "empty"]
        for f in ARRAY_FILLS + [0.0, NAN, -INF, "indefinite"]
        if f != "indefinite" or _sparse_result(c[0])
    ],
)
def test_dense_dims_become_sparse(case, kind, fill):
    name, shape, dd, op = case
    layout = torch.sparse_csr if kind == "csr" and len(shape) - dd >= 2 else torch.sparse_coo
    A, x = make(
        shape,
        fill,
        layout=layout,
        dense_dim=dd,
        uncoalesced=kind == "uncoalesced",
        p=0.0 if kind == "empty" else 0.4,
    )
    out = op(A)
    if _sparse_result(name):
        close(out, op(x))
    else:
        torch.testing.assert_close(dense(out), op(x), equal_nan=True)
    if (
        _sparse_result(name)
        and isinstance(fill, str)
        and fill != "indefinite"
        and not out.dense_dim()
    ):
        # the fill becomes the array fill's most common value, no more elements specified than needed
        f = array_fill(fill, shape[len(shape) - dd :]).reshape(-1)
        same = (f == out._fill) | (f.isnan() & out._fill.isnan())
        n_free = torch.Size(shape[: len(shape) - dd]).numel() - (
            A.to_sparse_coo().coalesce()._nse()
        )
        assert out._fill.numel() == 1
        assert out._nse() <= A.to_sparse_coo()._nse() * f.numel() + n_free * int((~same).sum())
        eq = (f[:, None] == f[None]) | (f[:, None].isnan() & f[None].isnan())
        assert int(same.sum()) == int(eq.sum(1).max())  # the most common value


@pytest.mark.parametrize("fill", ARRAY_FILLS + [1.5], ids=str)
@pytest.mark.parametrize(
    "shape,dd,op",
    [
        ((0, 3), 1, lambda t: t.t()),
        ((4, 0), 1, lambda t: t.t()),
        ((3, 2, 0), 1, lambda t: t.permute(2, 0, 1)),
        ((0, 2, 3), 2, lambda t: t.reshape(3, 0)),
        ((1, 3), 1, lambda t: t.t()),
        ((3, 1), 1, lambda t: t.t()),
        ((2, 1, 3), 2, lambda t: t.permute(1, 0, 2)),
        ((2, 3, 1), 2, lambda t: t.permute(2, 0, 1)),
        ((4, 1, 1, 1), 3, lambda t: t.view(4)),
    ],
    ids=[
        "0-sparse",
        "0-dense",
        "0-dense-3d",
        "0-reshape",
        "1-sparse",
        "1-dense",
        "size1-moves",
        "size1-moves2",
        "size1-dense-dropped",
    ],
)
def test_zero_size_and_size_one_dims(shape, dd, op, fill):
    A, x = make(shape, fill, dense_dim=dd, p=0.5)
    close(op(A), op(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.complex128])
def test_dtypes(dtype):
    x = (torch.arange(24).reshape(6, 4) % 5).to(dtype)
    f = torch.tensor([1, 1, 4, 2]).to(dtype)
    x[[0, 2, 3]] = f
    A = sparsefill.to_sparse(x, fill_value=f, dense_dim=1)
    for op in (lambda t: t.t(), lambda t: t.reshape(4, 6), lambda t: t.flatten()):
        out = op(A)
        assert out._fill.numel() == 1 and out._fill.item() == 1
        torch.testing.assert_close(out.to_dense(), op(x))


def test_many_specified_fill_elements_warn():
    """Past QUIET_ELEMENTS specified fill elements the (dense by nature) result warns; the policy applies."""
    from sparsefill._tensor.policy import SPECIFY_QUIET_ELEMENTS as QUIET_ELEMENTS

    n = QUIET_ELEMENTS // 2 + 10
    A = sparsefill.sparse_coo_tensor(
        [[0, 5]],
        torch.ones(2, 3, dtype=F64),
        (n, 3),
        fill_value=torch.tensor([0.0, 1.0, 2.0], dtype=F64),
    )
    with pytest.warns(sparsefill.DensifyWarning, match="array fill"):
        out = A.t()
    assert out._nse() == 2 * 3 + (n - 2) * 2
    torch.testing.assert_close(out.to_dense(), A.to_dense().t())
    with sparsefill.densify_policy("raise"), pytest.raises(sparsefill.DensifyError):
        A.t()
    small = sparsefill.sparse_coo_tensor(
        [[0, 5]],
        torch.ones(2, 3, dtype=F64),
        (n, 3),
        fill_value=torch.tensor([1.0, 1.0, 2.0], dtype=F64),
    )
    assert small[:100].t()._nse() == 2 * 3 + 98  # few enough: no warning


@pytest.mark.parametrize("fill", [0.0, 2.5, "array"], ids=str)
def test_one_element_fill_of_more_dims_than_a_view_keeps_dense(fill):
    """A view whose new dense dims are fewer than its one-element fill's dims (``A.t()`` of a ``(1, n)`` hybrid
    makes every dim dense, fill ``(1, 1)``; ``reshape(-1)`` then keeps one dense dim): the fill becomes a scalar
    (it kept its dims, and to_dense, sum and indexing raised); and ``repeat`` of a size-1 dense dim with an array
    fill, which takes that path."""
    f = torch.tensor([5.0, 6.0, 7.0]) if fill == "array" else fill
    H = sparsefill.sparse_coo_tensor([[0]], torch.tensor([[1.0, 2.0, 3.0]]), (1, 3), fill_value=f)
    for op in (
        lambda t: t.t().reshape(-1),
        lambda t: t.t().reshape(3),
        lambda t: t.t().flatten(),
        lambda t: t.t().reshape(-1).sum(),
        lambda t: t.t().reshape(-1)[1],
        lambda t: t.t().reshape(1, 3),
    ):
        out = op(H)
        torch.testing.assert_close(
            out.to_dense() if isinstance(out, SparseTensor) else out, op(H.to_dense())
        )
    G = sparsefill.sparse_coo_tensor(
        [[0]], torch.tensor([[1.0]]), (2, 1), fill_value=torch.tensor([5.0])
    )
    for reps in ((2, 1), (1, 3), (2, 2, 1)):
        torch.testing.assert_close(G.repeat(*reps).to_dense(), G.to_dense().repeat(*reps))


def test_t_of_3d_raises_as_torch():
    A, x = make((2, 3, 4), 1.0)
    with pytest.raises(RuntimeError, match="expects a tensor with <= 2 dimensions"):
        x.t()
    with pytest.raises(RuntimeError, match="expects a tensor with <= 2 dimensions"):
        A.t()


def test_input_unchanged():
    A, x = make((5, 3, 4), "distinct", dense_dim=2)
    parts = [t.clone() for t in (A._idx, A._vals, A._fill)]
    A.permute(2, 0, 1)
    A.reshape(12, 5)
    for a, b in zip(parts, (A._idx, A._vals, A._fill)):
        assert torch.equal(a.nan_to_num(), b.nan_to_num())
    close(A, x)


# ---------------------------------------------------------------------- 2. writes through views
VIEWS = {
    "select0": lambda t: t[1],
    "select1": lambda t: t[:, 2],
    "select_last": lambda t: t.select(-1, 1),
    "slice_step": lambda t: t[1::2],
    "slice1": lambda t: t[:, 1:4],
    "narrow": lambda t: t.narrow(1, 1, 2),
    "t": lambda t: t.transpose(0, 1),
    "permute": lambda t: t.permute(*range(t.dim() - 1, -1, -1)),
    "unsqueeze": lambda t: t.unsqueeze(1),
    "squeeze": lambda t: t[2:3].squeeze(0),
    "flatten": lambda t: t.reshape(-1),
    "flatten01": lambda t: t.flatten(0, 1),
    "unflatten": lambda t: t.unflatten(0, (2, -1)),
    "diagonal": lambda t: t.diagonal(),
    "detach": lambda t: t.detach(),
    "alias": lambda t: torch.ops.aten.alias(t),
    "chain": lambda t: t.transpose(0, 1)[1][1:],
    "unbind": lambda t: t.unbind(0)[2],
    "split": lambda t: t.split(2, 1)[1],
    "chunk": lambda t: t.chunk(2, 0)[0],
}


def _setitem(v):
    v[0] = 7.0
    return v


WRITES = {
    "add_": lambda v: v.add_(1.5),
    "mul_": lambda v: v.mul_(-2.0),
    "fill_": lambda v: v.fill_(0.25),
    "zero_": lambda v: v.zero_(),
    "setitem": _setitem,
    "copy_": lambda v: v.copy_(torch.full(v.shape, 3.0)),
    "nan": lambda v: v.div_(0.0),
    "clamp_": lambda v: v.clamp_(min=-0.5),
}  # (clamp_: the fill may stay)
BASES = {  # name -> (shape, fill, layout, dense_dim, uncoalesced)
    "coo": ((4, 6), 5.0, torch.sparse_coo, 0, False),
    "csr": ((4, 6), 5.0, torch.sparse_csr, 0, False),
    "coo3d-nan": ((4, 6, 3), NAN, torch.sparse_coo, 0, False),
    "csr3d": ((4, 6, 3), -1.0, torch.sparse_csr, 0, False),
    "uncoalesced": ((4, 6), 0.0, torch.sparse_coo, 0, True),
    "hybrid": ((4, 6, 3), 2.0, torch.sparse_coo, 1, False),
    "hybrid-array": ((4, 6, 3), "mostly", torch.sparse_coo, 1, False),
    "hybrid-csr-array": ((4, 6, 3), "distinct", torch.sparse_csr, 1, False),
}
FULL = (
    "coo",
    "hybrid-array",
)  # every write; the other bases: a write that keeps the fill and one that changes it


@pytest.mark.parametrize(
    "base, view, write",
    [
        pytest.param(b, v, w, id=f"{b}-{v}-{w}")
        for b in BASES
        for v in VIEWS
        for w in WRITES
        if b in FULL or w in ("add_", "fill_", "clamp_")
    ],
)
def test_write_through_view_is_native(base, view, write):
    """``write(view(A))``: A and the view equal torch's base and view after the same write on the dense tensor."""
    shape, fill, layout, dd, unc = BASES[base]
    A, x = make(shape, fill, layout=layout, dense_dim=dd, uncoalesced=unc)
    layout0, dd0 = A.sparse_layout, A.dense_dim()
    V = VIEWS[view](A)
    v = VIEWS[view](x)
    WRITES[write](V)
    WRITES[write](v)
    close(V, v)
    close(A, x)
    assert A.sparse_layout is layout0 and A.dense_dim() == dd0  # the base keeps its storage format
    close(VIEWS[view](A), v)  # a fresh view agrees too


@pytest.mark.parametrize(
    "view", ["select0", "slice_step", "t", "flatten", "chain", "unbind", "split"]
)
@pytest.mark.parametrize("dd", [0, 1])
def test_write_through_view_indefinite(view, dd):
    """Masked base: the view's stored elements are written, its unspecified positions stay unspecified."""
    A, x = make((4, 6, 3)[: 2 + dd], "indefinite", dense_dim=dd)
    ref = A.to_dense(fill_value=NAN)
    V = VIEWS[view](A)
    V.add_(1.0).mul_(3.0)
    v = VIEWS[view](ref)
    v.add_(1.0).mul_(3.0)
    torch.testing.assert_close(A.to_dense(fill_value=NAN), ref, equal_nan=True)
    torch.testing.assert_close(V.to_dense(fill_value=NAN), v, equal_nan=True)
    assert A.is_fill_indefinite()


def test_write_through_view_indefinite_pattern_changes():
    """A masked view's pattern may shrink (copy_ of a sparser tensor) or grow; a dense slice of the base
    left partly specified raises ValueError."""
    A, _ = make((4, 6), "indefinite", p=0.6)
    ref = A.to_dense(fill_value=NAN)
    row = sparsefill.sparse_coo_tensor(
        [[1]], [9.0], (6,), fill_value=sparsefill.indefinite, dtype=F64
    )
    A[2].copy_(row)
    ref[2] = NAN
    ref[2, 1] = 9.0
    torch.testing.assert_close(A.to_dense(fill_value=NAN), ref, equal_nan=True)
    H, _ = make((4, 3), "indefinite", dense_dim=1, p=0.5)
    with pytest.raises(ValueError, match="partly specified"):
        H.t()[0].copy_(
            sparsefill.sparse_coo_tensor(
                [[1]], [9.0], (4,), fill_value=sparsefill.indefinite, dtype=F64
            )
        )


def test_write_grows_the_pattern_by_the_view_only():
    """A[0].fill_(x) specifies row 0 only; A[:, 1].add_(1) with a scalar fill specifies column 1 only."""
    A = sparsefill.sparse_coo_tensor([[0, 2], [1, 3]], [1.0, 2.0], (1000, 1000), fill_value=5.0)
    A[3].fill_(0.0)
    assert A._nse() == 2 + 1000
    A[:, 7].add_(1.0)
    assert A._nse() == 2 + 1000 + 999
    A.t()[7].mul_(2.0)  # the same column through a transpose: no new element
    assert A._nse() == 2 + 1000 + 999
    d = torch.full((1000, 1000), 5.0)
    d[0, 1], d[2, 3] = 1.0, 2.0
    d[3] = 0.0
    d[:, 7] += 1.0
    d.t()[7] *= 2.0
    torch.testing.assert_close(A.to_dense(), d)


def test_large_fill_change_through_a_view_warns():
    A = sparsefill.sparse_coo_tensor([[0], [1]], [1.0], (400, 400), fill_value=5.0)
    with pytest.warns(sparsefill.DensifyWarning, match="fill differs"):
        A.t().fill_(1.0)
    assert torch.equal(A.to_dense(), torch.ones(400, 400, dtype=A.dtype))
    B = sparsefill.sparse_coo_tensor([[0], [1]], [1.0], (400, 400), fill_value=5.0)
    B.t().mul_(1.0)  # same fill (5 * 1): no warning
    B.t().add_(0.0)
    assert B._nse() == 1


@pytest.mark.parametrize("base", ["coo", "csr", "hybrid-array", "hybrid-csr-array"])
def test_sibling_view_reads_the_write_natively(base):
    """A view whose base changed is refreshed by running its view op again on the base (natively)."""
    shape, fill, layout, dd, unc = BASES[base]
    A, x = make(shape, fill, layout=layout, dense_dim=dd, uncoalesced=unc)
    row, col = A[1], A[:, 2]
    A.transpose(0, 1)[2].add_(10.0)
    x.transpose(0, 1)[2].add_(10.0)
    close(row, x[1])
    close(col, x[:, 2])
    A.mul_(2.0)
    x.mul_(2.0)
    close(row, x[1])
    close(A, x)


def test_overlapping_view_writes_go_the_dense_way():
    """expand() is not injective: writes through it use the dense path, announced."""
    from sparsefill.ops.views import strided_map

    A, x = make((1, 6), 5.0)
    E = A.expand(3, 6)
    assert strided_map(E) is None
    assert strided_map(A.t()) is not None
    with pytest.warns(sparsefill.DensifyWarning, match="writing through a view"):
        E.fill_(1.0)
    x.expand(3, 6).fill_(1.0)
    close(A, x)
    close(E, x.expand(3, 6))


# ---------------------------------------------------------------------- 3. shape ops and conversions, natively
SHAPE_OPS = {
    "reshape": lambda t: t.reshape(t.shape[0], -1),
    "reshape_split": lambda t: t.reshape(2, -1, *t.shape[2:]),
    "view": lambda t: t.view(-1, *t.shape[2:]),
    "flatten": lambda t: t.flatten(),
    "flatten_sparse": lambda t: t.flatten(0, 1),
    "unflatten": lambda t: t.unflatten(1, (2, 3)),
    "squeeze": lambda t: t.unsqueeze(0).unsqueeze(-1).squeeze(),
    "squeeze_dim": lambda t: t.unsqueeze(1).squeeze(1),
    "unsqueeze0": lambda t: t.unsqueeze(0),
    "unsqueeze_last": lambda t: t.unsqueeze(-1),
    "expand": lambda t: t.unsqueeze(1).expand(-1, 2, *t.shape[1:]),
    "narrow": lambda t: t.narrow(1, 1, 3),
    "chunk": lambda t: t.chunk(3, 1),
    "split": lambda t: t.split([1, 3], 0),
    "t": lambda t: t.flatten(1).t(),
    "transpose": lambda t: t.transpose(0, 1),
    "transpose_last": lambda t: t.transpose(0, -1),
    "permute": lambda t: t.permute(*range(t.dim() - 1, -1, -1)),
}
SHAPE_KINDS = {  # name -> (layout, dense_dim, fill)
    "coo": (torch.sparse_coo, 0, 2.5),
    "coo-nan": (torch.sparse_coo, 0, NAN),
    "csr": (torch.sparse_csr, 0, -1.0),
    "csr-hybrid": (torch.sparse_csr, 1, "mostly"),
    "hybrid": (torch.sparse_coo, 1, 2.5),
    "hybrid-array": (torch.sparse_coo, 1, "distinct"),
    "hybrid2-array": (torch.sparse_coo, 2, "mostly"),
    "indefinite": (torch.sparse_coo, 0, "indefinite"),
}


@pytest.mark.parametrize("op", list(SHAPE_OPS))
@pytest.mark.parametrize("kind", list(SHAPE_KINDS))
def test_shape_ops_are_native(kind, op):
    layout, dd, fill = SHAPE_KINDS[kind]
    A, x = make((4, 6, 3), fill, layout=layout, dense_dim=dd)
    out = SHAPE_OPS[op](A)
    close(out, SHAPE_OPS[op](x))


@pytest.mark.parametrize("fill", [0.0, 2.5, NAN, "uniform", "distinct", "indefinite"], ids=str)
@pytest.mark.parametrize("dd", [0, 1])
def test_conversions_keep_the_fill(dd, fill):
    if isinstance(fill, str) and fill != "indefinite" and not dd:
        fill = 1.0
    A, x = make((3, 4, 2) if dd else (6, 4), fill, dense_dim=dd)
    f = A._fill_value().clone()
    convs = [
        lambda t: t.to_sparse_csr(),
        lambda t: t.to_sparse_coo(),
        lambda t: t.to_sparse(layout=torch.sparse_csr),
        lambda t: t.to_sparse(layout=torch.sparse_coo),
        lambda t: t.to_sparse_csr().to_sparse_coo(),
        lambda t: sparsefill.to_sparse(t, layout=torch.sparse_csr),
    ]
    for conv in convs:
        B = conv(A)
        assert B.is_fill_indefinite() == A.is_fill_indefinite()
        assert torch.equal(B._fill_value().nan_to_num(), f.nan_to_num()) and B.dense_dim() == dd
        close(B, x)
    C = A.to_sparse_csr()
    assert (
        C.sparse_layout is torch.sparse_csr and C.to_sparse_coo().sparse_layout is torch.sparse_coo
    )


def test_batched_csr_conversion_of_a_masked_tensor_with_unequal_batches_raises():
    A, _ = make((3, 4, 2), "indefinite", p=0.5)
    with pytest.raises(ValueError, match="same nse in every batch"):
        A.to_sparse_csr()


# ---------------------------------------------------------------------- 4. gradcheck over (values, fill)
GRAD_CASES = {  # name -> (shape, dense_dim, layout, op)
    "t": ((4, 5), 0, torch.sparse_coo, lambda t: t.t()),
    "t csr": ((4, 5), 0, torch.sparse_csr, lambda t: t.t()),
    "transpose": ((3, 4, 2), 0, torch.sparse_coo, lambda t: t.transpose(0, 2)),
    "transpose hybrid dense-dense": ((3, 4, 2), 2, torch.sparse_coo, lambda t: t.transpose(1, 2)),
    "transpose hybrid array fill": ((4, 3), 1, torch.sparse_coo, lambda t: t.transpose(0, 1)),
    "permute": ((3, 4, 2), 0, torch.sparse_coo, lambda t: t.permute(1, 2, 0)),
    "permute hybrid array fill": ((3, 4, 2), 1, torch.sparse_coo, lambda t: t.permute(2, 0, 1)),
    "permute csr hybrid": ((3, 4, 2), 1, torch.sparse_csr, lambda t: t.permute(1, 0, 2)),
    "view drops size-1 dense dims": ((4, 1, 1), 2, torch.sparse_coo, lambda t: t.view(4) * 2),
}


@pytest.mark.parametrize("name", list(GRAD_CASES))
def test_gradcheck_over_values_and_fill(name):
    """``g(v, f) = op(SparseTensor(P, v, fill=f)).to_dense()``: gradients reach the values and the (array) fill."""
    shape, dd, layout, op = GRAD_CASES[name]
    gen = torch.Generator().manual_seed(0)
    S, D = shape[: len(shape) - dd], shape[len(shape) - dd :]
    n = min(5, torch.Size(S).numel() - 1)  # (at least one unspecified position: the fill matters)
    keys = torch.randperm(torch.Size(S).numel(), generator=gen)[:n].sort().values
    idx = torch.stack(torch.unravel_index(keys, S))
    v = torch.randn((n,) + D, dtype=F64, generator=gen, requires_grad=True)
    f = (
        torch.tensor([0.5, -1.0, 0.5, 2.0], dtype=F64)[: D[-1]].expand(D).clone()
        if dd
        else torch.tensor(1.5, dtype=F64)
    ).requires_grad_()

    def fn(v, f):
        A = sparsefill.sparse_coo_tensor(idx, v, shape, fill_value=f)
        if layout is torch.sparse_csr:
            A = A.to_sparse_csr()
        out = op(A)
        assert isinstance(out, SparseTensor)
        return out.to_dense()

    assert gradcheck(fn, (v, f), check_batched_grad=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.complex64])
def test_write_through_view_dtypes(dtype):
    x = (
        (torch.arange(24).reshape(4, 6) % 4 == 0).to(dtype)
        if dtype is torch.bool
        else (torch.arange(24).reshape(4, 6) % 5).to(dtype)
    )
    fill = x[0, 1].clone()
    A = sparsefill.to_sparse(x, fill_value=fill)
    for view, write in [
        (lambda t: t[1], lambda v: v.fill_(True if dtype is torch.bool else 2)),
        (lambda t: t.t()[2], lambda v: v.logical_not_() if dtype is torch.bool else v.mul_(3)),
        (lambda t: t[:, 1:5:2], lambda v: v.zero_()),
    ]:
        write(view(A))
        write(view(x))
        torch.testing.assert_close(A.to_dense(), x)


IN_PLACE_VIEWS = {
    "unsqueeze_0": lambda t: t.unsqueeze_(0),
    "unsqueeze_last": lambda t: t.unsqueeze_(-1),
    "squeeze_": lambda t: t.unsqueeze_(1).squeeze_(),
    "squeeze_dim": lambda t: t.unsqueeze_(0).squeeze_(0),
    "t_": lambda t: t.t_(),
    "transpose_": lambda t: t.transpose_(0, 1),
    "swapdims_": lambda t: t.swapdims_(1, 0),
}


@pytest.mark.parametrize("name", list(IN_PLACE_VIEWS))
@pytest.mark.parametrize("kind", ["coo", "csr", "hybrid", "indefinite"])
def test_in_place_view_ops_keep_identity(kind, name):
    """``A.unsqueeze_(0)`` (and the other in-place view ops) is ``A`` holding ``A.unsqueeze(0)``, as dense;
    a view of ``A``, or ``A`` once viewed, keeps its shape: ValueError, nothing modified."""
    fill = "indefinite" if kind == "indefinite" else "distinct" if kind == "hybrid" else 0.5
    A, x = make(
        (4, 3),
        fill,
        layout=torch.sparse_csr if kind == "csr" else torch.sparse_coo,
        dense_dim=1 if kind == "hybrid" else 0,
    )
    op = IN_PLACE_VIEWS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        assert op(A) is A
    op(x)
    assert A.shape == x.shape
    close(A, x)
    before, V = A.to_dense(fill_value=0.0 if kind == "indefinite" else None), A[0]
    for T in (A, V):
        with pytest.raises(ValueError, match="keeps its shape"):
            op(T)
    assert A.shape == before.shape
    torch.testing.assert_close(
        A.to_dense(fill_value=0.0 if kind == "indefinite" else None), before, equal_nan=True
    )


@pytest.mark.parametrize("stored", [True, False])
def test_in_place_view_of_an_intermediate_in_a_backward_formula(stored):
    """group_norm's backward (all three outputs used) reshapes ``(dY * X).sum(3)`` in place (``unsqueeze_``);
    on a (1, C) hybrid input that intermediate is a SparseTensor (dY varies over its dense dims only): the
    gradients of the values and the fill are dense's."""
    idx = torch.zeros((1, int(stored)), dtype=torch.int64)
    v0, f0 = torch.randn(int(stored), 3, dtype=F64), torch.tensor([0.5, -1.0, 2.0], dtype=F64)
    w, b = torch.randn(3, dtype=F64), torch.randn(3, dtype=F64)
    grads = []
    for sparse in (True, False):
        v, f = v0.clone().requires_grad_(), f0.clone().requires_grad_()
        A = sparsefill.sparse_coo_tensor(idx, v, (1, 3), fill_value=f)
        X = A if sparse else A.to_dense()
        with (
            warnings.catch_warnings()
        ):  # (native_group_norm has no sparse form: its forward densifies, announced)
            warnings.simplefilter("ignore", sparsefill.DensifyWarning)
            out, mean, rstd = torch.native_group_norm(X, w, b, 1, 3, 1, 1, 1e-5)
        (out.sum() * 0.5 + (out * out).sum() + mean.sum() + rstd.sum() * 2).backward()
        grads.append((v.grad, f.grad))
    for g, r in zip(*grads):
        torch.testing.assert_close(g, r)
