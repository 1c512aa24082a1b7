"""A SparseTensor operand broadcast along a sparse dim of the result (a row or column reduction with keepdim=True:
``F.normalize``, ``A / A.sum(1, keepdim=True)``, ``A - A.amax(1, keepdim=True)``) and ``expand`` of size-1 sparse
dims: the invariant ``densify(op(A, ...)) == op(A.to_dense(), ...)`` forward and backward, the pattern kept where the
result has one (a masked ``A``; one fill ``f(fill, t)``), O(nse) storage for ``expand`` where it can be, the
densify policy's gate where it cannot; and torch's own error for operands that do not broadcast.

A masked (indefinite) ``A`` is compared where it is specified, against dense ``A`` with a fill that the op reads as
"absent" (0 for sums and norms of positive values, -inf under a max and exp)."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import sparsefill
from sparsefill import SparseTensor

F64 = torch.float64
N = 24
_g = torch.Generator().manual_seed(0)
_EI = torch.unique(torch.randint(0, N, (2, 70), generator=_g), dim=1)  # some rows and columns empty
_NSE = _EI.shape[1]
_W = torch.randn(N, N, 2, generator=_g, dtype=F64)
assert (torch.bincount(_EI[0], minlength=N) == 0).any() and (
    torch.bincount(_EI[1], minlength=N) == 0
).any()

FNS = {  # name -> (fn, the dense fill that an indefinite A stands for, result keeps a fill-0 A's pattern)
    "normalize_p1_dim1": (lambda X: F.normalize(X, p=1, dim=1), 0.0, True),
    "normalize_p2_dim1": (lambda X: F.normalize(X, p=2, dim=1), 0.0, True),
    "normalize_p1_dim0": (lambda X: F.normalize(X, p=1, dim=0), 0.0, True),
    "normalize_p2_dim0": (lambda X: F.normalize(X, p=2, dim=0), 0.0, True),
    "div_row_sum": (
        lambda X: X / X.sum(1, keepdim=True),
        0.0,
        False,
    ),  # (0 / 0 in the empty rows: NaN)
    "div_col_sum_clamped": (lambda X: X / X.sum(0, keepdim=True).clamp_min(0.5), 0.0, True),
    "row_sum_over_x": (lambda X: X.sum(1, keepdim=True) / X.clamp_min(0.5), 0.0, False),
    "sub_row_max": (lambda X: X - X.amax(1, keepdim=True), float("-inf"), False),
    "softmax_by_hand": (
        lambda X: (
            (X - X.amax(1, keepdim=True)).exp()
            / (X - X.amax(1, keepdim=True)).exp().sum(1, keepdim=True)
        ),
        float("-inf"),
        False,
    ),
}
KINDS = ["coo", "csr", "hybrid", "uncoalesced"]


def _leaf(kind, fill):
    """``(X, v, vd, shape, M)``: a SparseTensor of leaf values ``v``, a copy ``vd`` of them for the dense computation,
    the shape, and the mask ``M`` of X's specified elements."""
    hybrid = kind == "hybrid"
    shape = (N, N, 2) if hybrid else (N, N)
    vals = (
        torch.rand(
            (_NSE, 2) if hybrid else (_NSE,), generator=torch.Generator().manual_seed(1), dtype=F64
        )
        + 0.1
    )
    v, vd = vals.clone().requires_grad_(), vals.clone().requires_grad_()
    if kind == "uncoalesced":  # every element stored twice, in halves
        X = sparsefill.sparse_coo_tensor(
            torch.cat([_EI, _EI], 1), torch.cat([v * 0.5, v * 0.5]), shape, fill_value=fill
        )
    else:
        X = sparsefill.sparse_coo_tensor(_EI, v, shape, fill_value=fill)
        X = X.to_sparse(layout=torch.sparse_csr) if kind == "csr" else X
    M = torch.zeros(N, N, dtype=torch.bool)
    M[_EI[0], _EI[1]] = True
    return X, v, vd, shape, (M[..., None].expand(shape) if hybrid else M)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fill", [0.0, sparsefill.indefinite], ids=["fill0", "indefinite"])
@pytest.mark.parametrize("name", list(FNS))
def test_reduction_broadcast_along_a_sparse_dim_forward_and_backward(name, fill, kind):
    fn, absent, keeps = FNS[name]
    X, v, vd, shape, M = _leaf(kind, fill)
    masked = fill is sparsefill.indefinite
    Xd = torch.full(shape, absent if masked else 0.0, dtype=F64).index_put((_EI[0], _EI[1]), vd)
    W = _W if kind == "hybrid" else _W[..., 0]
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        R = fn(X)
    Rd = fn(Xd)
    assert isinstance(R, SparseTensor)
    if (
        masked
    ):  # specified exactly where X is (every row and column that X stores in has a reduction)
        assert R._indefinite and R._nse() == _NSE
        assert_close(R.to_dense(fill_value=float("nan"))[M], Rd[M], equal_nan=True)
        loss, lossd = (R * W).sum(), (Rd * W)[M].sum()
    else:
        assert_close(R.to_dense(), Rd, equal_nan=True)
        if keeps:
            assert R._nse() == _NSE
        loss, lossd = (R * W).sum(), (Rd * W).sum()
    loss.backward()
    lossd.backward()
    assert_close(loss, lossd, equal_nan=True)
    assert_close(v.grad, vd.grad, equal_nan=True)


@pytest.mark.parametrize("fill", [0.0, sparsefill.indefinite], ids=["fill0", "indefinite"])
def test_normalize_of_a_large_adjacency_stays_within_the_policy(fill):
    """50000 nodes: the denominators' expand and the division take O(nse), under a 10 MB densify policy."""
    n, e = 50000, 100000
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, n, (2, e), generator=g)
    X = sparsefill.sparse_coo_tensor(
        ei, torch.rand(e, generator=g), (n, n), fill_value=fill
    ).coalesce()
    with sparsefill.densify_policy("raise", limit_bytes=10_000_000):
        for R in (
            F.normalize(X, p=1, dim=1),
            F.normalize(X, p=2, dim=1),
            X / X.sum(0, keepdim=True).clamp_min(1e-9),
            X / X.norm(2, 1, keepdim=True).clamp_min(1e-9),
        ):
            assert R._nse() == X._nse() and R._indefinite == X._indefinite
        if fill == 0.0:
            assert F.normalize(X, p=1, dim=0)._nse() == X._nse()
            with pytest.raises(
                sparsefill.DensifyError, match="repeat 50000 times"
            ):  # dense by nature: 0 - max
                X - X.amax(1, keepdim=True)
        else:
            assert (X - X.amax(1, keepdim=True))._nse() == X._nse()
            # (F.normalize(X, dim=0) of a masked X with an empty column: expand_as of the (1, n) norms cannot keep
            # them as one dense slice, so it repeats them, n * n elements: the policy's gate refuses)
            with pytest.raises(sparsefill.DensifyError, match="repeat 50000 times"):
                F.normalize(X, p=1, dim=0)


def test_a_masked_broadcast_operand_masks_the_result():
    """X * Y.sum(1, keepdim=True), both indefinite: unspecified where Y's row has no element, although X has some."""
    X = sparsefill.sparse_coo_tensor(
        _EI, torch.rand(_NSE, dtype=F64), (N, N), fill_value=sparsefill.indefinite
    )
    Y = sparsefill.sparse_coo_tensor(
        [[1, 1, 5], [0, 3, 2]],
        torch.tensor([1.0, 2.0, 3.0], dtype=F64),
        (N, N),
        fill_value=sparsefill.indefinite,
    )
    s = Y.sum(1, keepdim=True)
    for R in (X * s, s * X):
        rows = set(R.indices()[0].tolist())
        assert (
            R._indefinite
            and rows <= {1, 5}
            and R._nse() == int(((_EI[0] == 1) | (_EI[0] == 5)).sum())
        )
        i = R.indices()
        assert_close(
            R.values(), (X.to_dense(fill_value=0.0) * s.to_dense(fill_value=0.0))[i[0], i[1]]
        )


def test_an_integer_masked_operand_with_no_value_at_a_zero():
    """An integer floor division by a masked row sum: the masked rows' placeholder is a stored value, not 0."""
    X = sparsefill.sparse_coo_tensor(
        _EI, torch.arange(1, _NSE + 1), (N, N), fill_value=sparsefill.indefinite
    )
    Y = sparsefill.sparse_coo_tensor(
        [[0, 2], [1, 1]], torch.tensor([3, 4]), (N, N), fill_value=sparsefill.indefinite
    )
    R = X // Y.sum(1, keepdim=True)
    i = R.indices()
    assert set(i[0].tolist()) <= {0, 2}
    assert_close(
        R.values(),
        (X.to_dense(fill_value=0) // Y.to_dense(fill_value=0).sum(1, keepdim=True).clamp_min(1))[
            i[0], i[1]
        ],
    )


@pytest.mark.parametrize("fill", [0.0, sparsefill.indefinite], ids=["fill0", "indefinite"])
def test_in_place_and_out_with_a_broadcast_sparse_operand(fill):
    X, _, _, _, M = _leaf("coo", fill)
    X = X.detach()
    ref = X.to_dense(fill_value=0.0) / X.sum(1, keepdim=True).clamp_min(1.0).to_dense(
        fill_value=1.0
    )
    Y = X.clone()
    Y.div_(Y.sum(1, keepdim=True).clamp_min(1.0))
    assert_close(Y.to_dense(fill_value=0.0), ref)
    if fill == 0.0:
        O = sparsefill.zeros(N, N, dtype=F64)
        torch.div(X, X.sum(1, keepdim=True).clamp_min(1.0), out=O)
        assert_close(O.to_dense(), ref)
    else:
        assert Y._nse() == _NSE


def _fills(shape, fill, hybrid):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(shape, generator=g, dtype=F64)
    x[torch.rand(shape, generator=g) < 0.5] = 0.0
    if fill == "array":
        return sparsefill.to_sparse(
            x, fill_value=torch.arange(shape[-1], dtype=F64) % 3, dense_dim=1
        )
    return sparsefill.to_sparse(x, fill_value=fill, dense_dim=1 if hybrid else 0)


EXPANDS = [
    ((N, 1), (N, N)),
    ((1, N), (N, N)),
    ((3,), (2, 3)),
    ((3,), (4, 2, 3)),
    ((2, 1, 3), (2, 5, 3)),
    ((1, 1, 3), (4, 5, 3)),
    ((2, 1), (2, 0)),
    ((0, 1), (0, 4)),
]


_EXPAND_CASES = [
    (src, size, fill, hybrid, layout)
    for src, size in EXPANDS
    for fill in (0.0, 1.5, "array", "masked")
    for hybrid in (False, True)
    for layout in (torch.sparse_coo, torch.sparse_csr)
    if (hybrid or fill != "array")
    and (not hybrid or len(src) >= 2)  # an array fill needs a dense dim
    and (layout is torch.sparse_coo or len(src) - hybrid >= 2 and fill != "array")
]  # CSR: 2 sparse dims


@pytest.mark.parametrize(
    "src,size,fill,hybrid,layout",
    _EXPAND_CASES,
    ids=[
        f"{a}->{b}-{f}-{'hybrid' if h else 'sparse'}-{str(lay)[13:]}"
        for a, b, f, h, lay in _EXPAND_CASES
    ],
)
def test_expand_equals_dense_and_stores_no_repeats(src, size, fill, hybrid, layout):
    A = _fills(src, sparsefill.indefinite if fill == "masked" else fill, hybrid)
    A = A.to_sparse(layout=layout) if layout is torch.sparse_csr else A
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        E = A.expand(size)
    assert E.shape == torch.Size(size)
    ref = A.to_dense(fill_value=float("nan")) if fill == "masked" else A.to_dense()
    got = E.to_dense(fill_value=float("nan")) if fill == "masked" else E.to_dense()
    assert_close(got, ref.expand(size), equal_nan=True)
    grown = [s for o, s in zip((1,) * (len(size) - len(src)) + src, size) if o == 1 and s != 1]
    if (
        fill != "masked" and grown
    ):  # one slice of the grown dims on per stored prefix, never nse * repeats
        assert E._nse() <= max(A._nse(), 1)
    assert_close(
        ((E * 2).to_dense(fill_value=float("nan")) if fill == "masked" else (E * 2).to_dense()),
        ref.expand(size) * 2,
        equal_nan=True,
    )


def test_expand_that_must_repeat_passes_the_policy_gate():
    """A masked (1, n) with a column masked out cannot become one dense slice: its stored elements repeat n times,
    through the densify policy's gate (a DensifyError past the byte limit, quiet below it)."""
    n = 3000
    A = sparsefill.sparse_coo_tensor(
        [[0] * 50, list(range(0, 100, 2))], torch.ones(50), (1, n), fill_value=sparsefill.indefinite
    )
    with sparsefill.densify_policy("raise", limit_bytes=1_000_000):
        with pytest.raises(
            sparsefill.DensifyError,
            match=r"expand of a SparseTensor of shape \[1, 3000\] to "
            r"\[3000, 3000\].*50 stored elements repeat 3000 times",
        ):
            A.expand(n, n)
    E = A.expand(n, n)
    assert E._nse() == 50 * n
    B = sparsefill.sparse_coo_tensor(
        [[0] * 50, list(range(50))], torch.ones(50), (1, 50), fill_value=sparsefill.indefinite
    )
    assert B.expand(50, 50)._nse() == 1  # wholly specified: one dense slice


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
def test_repeats_below_the_quiet_threshold_hold_the_byte_limit(layout):
    """Few repeats are quiet, but a byte limit below what they store raises DensifyError before they are formed
    (``F.normalize`` along a dim of size > 1 of a tensor with a nonzero fill: the norms repeat along it, every
    element of the result differing); with room, normalize equals dense, forward and the gradients of the values
    and the fill."""
    v = torch.tensor([1.0, -2.0, 3.0, 4.0], dtype=torch.float64, requires_grad=True)
    f = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    idx = [[0, 1, 2, 3], [1, 0, 2, 2]]
    make = lambda: sparsefill.sparse_coo_tensor(idx, v, (4, 3), fill_value=f)  # noqa: E731
    X = make().to_sparse(layout=layout)
    with sparsefill.densify_policy("raise", limit_bytes=4 * 3 * 8 - 1):
        with pytest.raises(sparsefill.DensifyError, match=r"repeat 4 times.*bytes"):
            F.normalize(X, p=1, dim=0)
    w = torch.arange(12, dtype=torch.float64).reshape(4, 3)
    (F.normalize(X, p=1, dim=0) * w).sum().backward()
    got = v.grad.clone(), f.grad.clone()
    v.grad = f.grad = None
    (F.normalize(make().to_dense(), p=1, dim=0) * w).sum().backward()
    torch.testing.assert_close(got, (v.grad, f.grad))
    assert_close(F.normalize(X, p=1, dim=0).to_dense(), F.normalize(make().to_dense(), p=1, dim=0))


def test_expand_follows_its_base():
    A = sparsefill.sparse_coo_tensor([[0, 2], [0, 0]], torch.tensor([1.0, 2.0]), (3, 1))
    E = A.expand(3, 4)
    A.mul_(3.0)
    assert_close(E.to_dense(), A.to_dense().expand(3, 4))


CASES = {
    "mul_column": lambda A: A * torch.randn(N + 1)[:, None],
    "add_matrix": lambda A: A + torch.randn(N + 1, N + 1),
    "dense_first": lambda A: torch.randn(N, N + 1) + A,
    "where": lambda A: torch.where(torch.ones(N + 1, N + 1, dtype=torch.bool), A, 0.0),
    "lerp": lambda A: torch.lerp(A, torch.zeros(N, N), torch.rand(N + 1, 1)),
    "sparse_pair": lambda A: A * sparsefill.zeros(N + 1, 1),
    "in_place": lambda A: A.add_(torch.randn(N + 1)[:, None]),
    "zeta": lambda A: torch.special.zeta(A, torch.rand(1, N + 1)),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("fill", [0.0, sparsefill.indefinite], ids=["fill0", "indefinite"])
def test_operands_that_do_not_broadcast_raise_torchs_error_and_change_nothing(case, fill):
    A = sparsefill.sparse_coo_tensor(
        _EI, torch.rand(_NSE, dtype=torch.float32), (N, N), fill_value=fill
    )
    before = A.values().clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        with pytest.raises(
            RuntimeError,
            match=r"The size of tensor a \(\d+\) must match the size of tensor b \(\d+\)",
        ):
            CASES[case](A)
    assert torch.equal(A.values(), before) and A._nse() == _NSE


def test_a_large_operand_that_does_not_broadcast_raises_torchs_error_not_densify_error():
    A = sparsefill.sparse_coo_tensor([[0, 1], [1, 2]], torch.ones(2), (50000, 50000))
    with sparsefill.densify_policy("raise", limit_bytes=1_000_000):
        with pytest.raises(
            RuntimeError,
            match=r"size of tensor a \(50000\) must match the size of tensor b \(50001\)",
        ):
            A * torch.randn(50001)[:, None]


@pytest.mark.parametrize(
    "sx,ss", [((4, 0), (4, 1)), ((0, 3), (1, 3)), ((0, 3), (0, 1)), ((3, 4), (1, 4))]
)
@pytest.mark.parametrize("fill", [0.0, sparsefill.indefinite], ids=["fill0", "indefinite"])
def test_zero_size_and_empty_broadcast_operands(sx, ss, fill):
    """0-size results, and a broadcast operand with nothing stored (masked: it masks every element out)."""
    X = sparsefill.to_sparse(torch.ones(sx), fill_value=fill)
    S = sparsefill.sparse_coo_tensor(
        torch.zeros(len(ss), 0, dtype=torch.int64), torch.zeros(0), ss, fill_value=fill
    )
    for op in (torch.add, lambda a, b: b * a, lambda a, b: a / b.exp()):
        R = op(X, S)
        assert R.shape == torch.broadcast_shapes(sx, ss)
        if fill == 0.0:
            assert_close(R.to_dense(), op(X.to_dense(), S.to_dense()))
        else:
            assert R._indefinite and R._nse() == 0


@pytest.mark.parametrize(
    "rows", [None, [0, 1, 2, 3, 5, 7, 9]], ids=["masks_none_of_A", "masks_some_of_A"]
)
def test_in_place_masked_fill_by_a_masked_broadcast_mask(rows):
    """``g.masked_fill_(norm == 0, 0)`` (norm's backward) with a masked (N, 1) condition: A keeps its pattern where
    the condition is specified on every row A stores in, else loses the elements of the masked rows."""
    A = sparsefill.sparse_coo_tensor(
        _EI, torch.rand(_NSE, dtype=F64), (N, N), fill_value=sparsefill.indefinite
    )
    ref = A.to_dense(fill_value=0.0)
    S = (
        A.sum(1, keepdim=True)
        if rows is None
        else sparsefill.sparse_coo_tensor(
            [rows, [0] * len(rows)],
            torch.zeros(len(rows), dtype=F64),
            (N, 1),
            fill_value=sparsefill.indefinite,
        )
    )
    M = S < 0.5
    A.masked_fill_(M, -1.0)
    i = A.indices()
    assert A._indefinite and A._nse() == (
        _NSE if rows is None else int(torch.isin(_EI[0], torch.tensor(rows)).sum())
    )
    assert_close(A.values(), ref.masked_fill(M.to_dense(fill_value=False), -1.0)[i[0], i[1]])


def test_an_uncoalesced_masked_broadcast_operand():
    """Duplicates of the (N, 1) operand add up; its unspecified rows mask the result's."""
    X = sparsefill.sparse_coo_tensor(
        [[0, 1, 2, 3], [1, 2, 3, 4]],
        torch.tensor([1.0, 2.0, 3.0, 4.0]),
        (6, 6),
        fill_value=sparsefill.indefinite,
    )
    S = sparsefill.sparse_coo_tensor(
        [[0, 0, 1, 3, 3], [0] * 5],
        torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]),
        (6, 1),
        fill_value=sparsefill.indefinite,
    )
    assert not S.is_coalesced()
    R = X * S
    assert R.indices().tolist() == [[0, 1, 3], [1, 2, 4]] and R.values().tolist() == [
        3.0,
        6.0,
        36.0,
    ]


@pytest.mark.parametrize("fill", [0.0, sparsefill.indefinite], ids=["fill0", "indefinite"])
def test_normalize_under_torch_compile_forward_and_backward(fill):
    """Traced, expand repeats (its slice count and its stored count are data): no guard on them, the eager results."""

    def f(v):
        R = F.normalize(sparsefill.sparse_coo_tensor(_EI, v, (N, N), fill_value=fill), p=1, dim=1)
        return (R * R).sum()

    vals = torch.rand(_NSE, generator=torch.Generator().manual_seed(2), dtype=F64)
    v1, v2 = vals.clone().requires_grad_(), vals.clone().requires_grad_()
    out, ref = torch.compile(f, backend="aot_eager")(v1), f(v2)
    out.backward()
    ref.backward()
    assert_close(out, ref)
    assert_close(v1.grad, v2.grad)


EXPANDS = {
    "expand": lambda t: t.expand(3, 5, 4),
    "broadcast_to": lambda t: torch.broadcast_to(t, (2, 3, 5, 4)),
    "broadcast_tensors": lambda t: torch.broadcast_tensors(
        t, torch.zeros(2, 1, 1, 1, dtype=t.dtype)
    )[0],
}


@pytest.mark.parametrize("kind", ["coo", "csr", "hybrid"])
@pytest.mark.parametrize("name", list(EXPANDS))
def test_expand_over_new_and_grown_dims_backward_forms_no_broadcast_element(name, kind):
    """``expand``/``broadcast_to``/``broadcast_tensors`` of a ``(3, 1, 4)`` SparseTensor over grown and new leading
    dims store one slice per stored prefix (stride 0 along the grown dims); the gradient of their sum keeps that
    broadcast (its values' storage no larger than the input's dense form: no element per result position), and
    the forward and the gradients of the values and the fill (also through dense weights) equal dense's."""
    shape = (3, 1, 4)
    idx = [[0, 2], [0, 0], [1, 3]] if kind != "hybrid" else [[0, 2], [0, 0]]
    v = (
        torch.tensor([1.0, -2.0], dtype=torch.float64)
        if kind != "hybrid"
        else torch.arange(8.0, dtype=torch.float64).reshape(2, 4)
    )
    v.requires_grad_()
    f = torch.tensor(0.25, dtype=torch.float64, requires_grad=True)
    make = lambda: sparsefill.sparse_coo_tensor(idx, v, shape, fill_value=f)  # noqa: E731
    A = make().to_sparse(layout=torch.sparse_csr) if kind == "csr" else make()
    B = EXPANDS[name](A)
    assert_close(B.to_dense(), EXPANDS[name](make().to_dense()))
    G = torch.autograd.grad(B.sum(), B, retain_graph=True)[0]
    assert G._vals.untyped_storage().nbytes() <= A.numel() * 8
    B.sum().backward()
    got = v.grad.clone(), f.grad.clone()
    v.grad = f.grad = None
    EXPANDS[name](make().to_dense()).sum().backward()
    assert_close(got, (v.grad, f.grad))
    v.grad = f.grad = None
    w = torch.arange(B.numel(), dtype=torch.float64).reshape(B.shape)
    (EXPANDS[name](A) * w).sum().backward()
    got = v.grad.clone(), f.grad.clone()
    v.grad = f.grad = None
    (EXPANDS[name](make().to_dense()) * w).sum().backward()
    assert_close(got, (v.grad, f.grad))


def test_copy_of_broadcast_values_asks_the_byte_limit():
    """``expand_copy`` (``A.expand(...).clone()``) stores each element of the broadcast values: their bytes
    ask the densify policy first (DensifyError past the limit, nothing allocated); within it the copy equals
    dense and owns its values."""
    A = sparsefill.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (3,), fill_value=0.5)
    E = A.expand(4, 3)
    with sparsefill.densify_policy(limit_bytes=8):
        with pytest.raises(sparsefill.DensifyError, match="broadcast"):
            torch.expand_copy(A, (4, 3))
        with pytest.raises(sparsefill.DensifyError, match="broadcast"):
            E.clone()
    C = torch.expand_copy(A, (4, 3))
    torch.testing.assert_close(C.to_dense(), A.to_dense().expand(4, 3))
    C[0, 0] = 7.0  # (its own storage: a write to one element, as on dense)
    assert C.to_dense()[0, 0] == 7.0 and C.to_dense()[1, 0] == 1.0


# ============================================================================== found while scaling the GNN up
def _rows_graph(fill, n=2000, e=8000):
    g = torch.Generator().manual_seed(0)
    ei = torch.stack(
        [torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g)]
    )
    return sparsefill.sparse_coo_tensor(
        ei, torch.rand(e, generator=g), (n, n), fill_value=fill
    ).coalesce()


def test_row_normalisation_by_a_dense_norm_keeps_the_pattern():
    """The workaround of the case below: dividing by the row norms as a dense (N, 1) tensor keeps the pattern."""
    for fill in (0.0, sparsefill.indefinite):
        X = _rows_graph(fill)
        with sparsefill.densify_policy("raise", limit_bytes=1_000_000):
            R = X / torch.linalg.vector_norm(X, 1, 1, keepdim=True).to_dense(
                fill_value=0.0
            ).clamp_min(1e-12)
        assert R._nse() == X._nse()
        assert_close(
            R.to_dense(fill_value=0.0), F.normalize(X.to_dense(fill_value=0.0), p=1, dim=1)
        )


def test_row_normalisation_f_normalize_keeps_the_pattern():
    X = _rows_graph(0.0)
    with sparsefill.densify_policy("raise", limit_bytes=1_000_000):
        R = F.normalize(X, p=1, dim=1)
    assert R._nse() == X._nse()
    assert_close(R.to_dense(), F.normalize(X.to_dense(), p=1, dim=1))


@pytest.mark.parametrize("fill", [0.0, sparsefill.indefinite], ids=["fill0", "indefinite"])
def test_expand_of_a_size_one_sparse_dim_is_bounded_by_the_policy(fill):
    """F.normalize's denominator ``norm(keepdim=True).clamp_min(eps).expand_as(X)``: at most O(N) stored, or a
    DensifyError under the policy's byte limit; never O(N^2) stored elements without either."""
    X = _rows_graph(fill)
    d = X.norm(1, 1, keepdim=True).clamp_min(1e-12)
    with sparsefill.densify_policy("raise", limit_bytes=1_000_000):
        try:
            E = d.expand_as(X)
        except sparsefill.DensifyError:
            return
    assert E._nse() <= 2 * X.shape[0]
