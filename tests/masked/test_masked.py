"""``sparsefill.masked``: worked example tables in every layout, gradients, huge shapes, errors.

The generic comparison with ``torch.masked`` over PyTorch's OpInfo samples is in
``test_masked_opinfo.py``; here: worked examples of each masked reduction, gradcheck over
the input's values and fill, semantics of indefinite fills, and shapes too large to densify.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch.testing import assert_close

import sparsefill
from sparsefill import SparseTensor
from sparsefill import masked as M

INF, NAN = math.inf, math.nan
X = torch.tensor([[-3.0, -2.0, -1.0], [0.0, 1.0, 2.0]])
MASK = torch.tensor([[True, False, True], [False, False, False]])


@pytest.fixture(autouse=True)
def _no_densify():
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        yield


def _layouts(x):
    """The same dense values in every input layout."""
    return {
        "strided": x,
        "native-coo": x.to_sparse(),
        "native-csr": x.to_sparse_csr(),
        "sf-coo": sparsefill.to_sparse(x),
        "sf-csr": sparsefill.to_sparse(x, layout=torch.sparse_csr),
        "sf-coo fill 5": sparsefill.to_sparse(x, fill_value=5.0),
        "sf-hybrid": sparsefill.to_sparse(x, dense_dim=1, fill_value=torch.tensor([1.0, 2.0, 3.0])),
        "sf-hybrid fill 0": sparsefill.to_sparse(x, dense_dim=1),
        "sf-indefinite (all specified)": sparsefill.to_sparse(x, fill_value=sparsefill.indefinite),
    }


def _masks(m):
    return {
        "strided": m,
        "native-coo": m.to_sparse(),
        "native-csr": m.to_sparse_csr(),
        "sf-coo": sparsefill.to_sparse(m),
        "sf-csr": sparsefill.to_sparse(m, layout=torch.sparse_csr),
    }


def _dense(t):
    if isinstance(t, SparseTensor):
        return t.to_dense(fill_value=NAN) if t.is_fill_indefinite() else t.to_dense()
    return t.to_dense() if t.layout is not torch.strided else t


REDUCTION_TABLE = {  # worked examples: one call per reduction and its expected result
    "sum": [-4.0, 0.0],
    "prod": [3.0, 1.0],
    "mean": [-2.0, NAN],
    "amin": [-3.0, INF],
    "amax": [-1.0, -INF],
}


@pytest.mark.parametrize("layout", list(_layouts(X)))
@pytest.mark.parametrize("mask_layout", list(_masks(MASK)))
def test_reduction_table_every_layout(layout, mask_layout):
    x, m = _layouts(X)[layout], _masks(MASK)[mask_layout]
    for name, want in REDUCTION_TABLE.items():
        out = getattr(M, name)(x, 1, mask=m)
        if layout != "strided":
            assert isinstance(out, SparseTensor) and out.dim() == 1
        assert_close(_dense(out), torch.tensor(want), equal_nan=True, msg=name)
        assert_close(_dense(out), getattr(torch.masked, name)(X, 1, mask=MASK), equal_nan=True)
    got = _dense(M.output_mask(x, 1, mask=m))
    assert got.tolist() == [True, False]  # torch.any(mask, 1)


SOFTMAX = torch.tensor([[0.1192, 0.0000, 0.8808], [NAN, NAN, NAN]], dtype=torch.float64)
LOG_SOFTMAX = torch.tensor([[-2.1269, -INF, -0.1269], [NAN, NAN, NAN]], dtype=torch.float64)
NORMALIZE = {
    2.0: torch.tensor([[-0.9487, 0.0000, -0.3162], [0.0000, 0.0000, 0.0000]]),
    3.0: torch.tensor([[-0.9880, 0.0000, -0.3293], [0.0000, 0.0000, 0.0000]]),
}


@pytest.mark.parametrize("layout", list(_layouts(X)))
@pytest.mark.parametrize("mask_layout", list(_masks(MASK)))
def test_normalization_table_every_layout(layout, mask_layout):
    """Exact at every element, the fully masked-out row's NaN included (the drop-in promise)."""
    x, m = _layouts(X)[layout], _masks(MASK)[mask_layout]
    sparse = layout != "strided"
    for op, want in [(M.softmax, SOFTMAX), (M.log_softmax, LOG_SOFTMAX)]:
        out = op(x, 1, dtype=torch.double, mask=m)
        assert isinstance(out, SparseTensor) == sparse
        d = _dense(out)
        assert d.dtype == torch.float64
        assert_close(d, want, atol=5e-5, rtol=0, equal_nan=True)
        assert_close(
            d,
            getattr(torch.masked, op.__name__)(X, 1, dtype=torch.double, mask=MASK),
            equal_nan=True,
        )
    for p, want in NORMALIZE.items():
        out = _dense(M.normalize(x, p, 1, mask=m))
        assert_close(out.float(), want, atol=5e-5, rtol=0)
        assert_close(out, torch.masked.normalize(X, p, 1, mask=MASK))
    for op in [M.softmin, M.cumsum, M.cumprod]:  # not in the table: torch.masked's values
        assert_close(
            _dense(op(x, 1, mask=m)),
            getattr(torch.masked, op.__name__)(X, 1, mask=MASK),
            equal_nan=True,
        )


def test_normalization_fill_is_chosen_by_counts():
    """The result's fill is the value of the larger group of unspecified elements (fully masked-out
    slices: NaN; partly masked-in slices: 0 / -inf); the smaller group is stored."""
    # 6 x 5, three stored rows: 3 empty rows (15 NaN elements) vs 3 * 3 = 9 unspecified 0s: fill NaN
    idx = torch.tensor([[0, 0, 2, 2, 4, 4], [0, 3, 1, 4, 2, 3]])
    A = sparsefill.sparse_coo_tensor(idx, torch.arange(6.0), (6, 5))
    m = M.pattern_mask(A)
    for op in [M.softmax, M.log_softmax, M.softmin]:
        out = op(A, 1, mask=m)
        assert math.isnan(out._fill_value().item()) and out._nse() == 15, op.__name__
        assert_close(
            out.to_dense(),
            getattr(torch.masked, op.__name__)(A.to_dense(), 1, mask=m.to_dense()),
            equal_nan=True,
        )
    # one empty row of five (5 NaNs) vs 4 * 3 = 12 unspecified 0s: fill 0, the empty row stored
    B = sparsefill.sparse_coo_tensor(
        torch.tensor([[0, 0, 1, 1, 2, 2, 3, 3], [0, 3, 1, 4, 2, 3, 0, 1]]),
        torch.arange(8.0),
        (5, 5),
        fill_value=0.0,
    )
    for layout in [torch.sparse_coo, torch.sparse_csr]:
        Bl = B if layout is torch.sparse_coo else B.to_sparse_csr()
        out = M.softmax(Bl, 1, mask=M.pattern_mask(Bl))
        assert (
            out.sparse_layout is layout and out._fill_value().item() == 0.0 and out._nse() == 8 + 5
        )
        assert_close(
            out.to_dense(),
            torch.masked.softmax(B.to_dense(), 1, mask=M.pattern_mask(B).to_dense()),
            equal_nan=True,
        )
    # the pattern-as-mask use with no empty row adds nothing: the input's own index tensors
    C = sparsefill.sparse_coo_tensor(
        torch.tensor([[0, 1, 2], [1, 0, 2]]), torch.ones(3), (3, 3)
    ).to_sparse_csr()
    out = M.log_softmax(C, 1, mask=M.pattern_mask(C))
    assert (
        out._nse() == 3
        and out.crow_indices() is C.crow_indices()
        and out._fill_value().item() == -INF
    )
    # along dim 0 with a dense dim: unspecified rows are fully masked-out slices
    H = sparsefill.to_sparse(torch.tensor([[1.0, 2.0], [0.0, 0.0], [3.0, 4.0]]), dense_dim=1)
    out = M.softmax(H, 1, mask=M.pattern_mask(H))
    assert math.isnan(out._fill_value().item()) and out._nse() == 2
    # an indefinite fill keeps its pattern; a fully masked-out stored slice reads NaN
    D = sparsefill.sparse_coo_tensor(
        idx, torch.arange(6.0), (6, 5), fill_value=sparsefill.indefinite
    )
    mk = torch.ones(6, 5, dtype=torch.bool)
    mk[2] = False
    out = M.softmax(D, 1, mask=mk)
    assert out.is_fill_indefinite() and torch.equal(out._indices(), D._indices())
    assert (
        torch.isnan(out._values()[2:4]).all() and not torch.isnan(out._values()[[0, 1, 4, 5]]).any()
    )


def test_normalization_storing_many_masked_out_elements_warns(monkeypatch):
    from sparsefill._tensor import policy as _policy

    monkeypatch.setattr(_policy, "SPECIFY_QUIET_ELEMENTS", 4)
    A = sparsefill.sparse_coo_tensor(torch.tensor([[0], [0]]), torch.ones(1), (10, 10))
    with pytest.warns(
        sparsefill.DensifyWarning, match="softmax"
    ):  # 9 unspecified 0s in row 0 are stored
        out = M.softmax(A, 1, mask=M.pattern_mask(A))
    assert out._nse() == 10 and math.isnan(out._fill_value().item())
    with pytest.warns(sparsefill.DensifyWarning, match="cumsum"):  # running values after (0, 0)
        assert M.cumsum(A, 1, mask=M.pattern_mask(A))._nse() == 10


def test_normalization_pattern_is_kept():
    A = sparsefill.to_sparse(X, layout=torch.sparse_csr)
    out = M.softmax(A, 1, mask=M.pattern_mask(A))
    assert out.sparse_layout is torch.sparse_csr and out._nse() == A._nse()
    assert out.crow_indices() is A.crow_indices()  # the same index tensors, no rebuild


# ---------------------------------------------------------------------- indefinite fill = masked tensor
def test_indefinite_fill_is_the_mask():
    A = sparsefill.sparse_coo_tensor(
        [[0, 0, 1], [0, 2, 1]], [-3.0, -1.0, 1.0], (2, 3), fill_value=sparsefill.indefinite
    )
    pattern = torch.tensor([[True, False, True], [False, True, False]])
    dense = A.to_dense(fill_value=0.0)
    for name in [
        "sum",
        "prod",
        "amax",
        "amin",
        "mean",
        "logsumexp",
        "var",
        "std",
        "norm",
        "median",
        "argmax",
    ]:
        assert_close(
            _dense(getattr(M, name)(A, 1)),
            getattr(torch.masked, name)(dense, 1, mask=pattern).to(torch.float32),
            equal_nan=True,
            msg=name,
        )
    out = M.softmax(A, 1)
    assert out.is_fill_indefinite() and torch.equal(out._indices(), A._indices())
    assert_close(out._values(), torch.masked.softmax(dense, 1, mask=pattern)[pattern])
    # a mask given too is intersected with the pattern
    m = torch.tensor([[True, True, False], [True, True, True]])
    assert_close(_dense(M.sum(A, 1, mask=m)), torch.tensor([-3.0, 1.0]))


def test_mask_none_counts_unspecified_fill():
    A = sparsefill.sparse_coo_tensor([[0, 1], [1, 2]], [4.0, -1.0], (3, 4), fill_value=2.0)
    d = A.to_dense()
    for name in [
        "sum",
        "prod",
        "amax",
        "amin",
        "mean",
        "var",
        "logsumexp",
        "norm",
        "median",
        "argmin",
    ]:
        assert_close(
            _dense(getattr(M, name)(A, 1)),
            getattr(torch.masked, name)(d, 1).to(torch.float32),
            msg=name,
        )
    # dense by nature (every element masked in, softmax of a finite fill): computed quietly, input layout
    out = M.softmax(A, 1)
    assert isinstance(out, SparseTensor) and out.sparse_layout is torch.sparse_coo
    assert_close(out.to_dense(), torch.softmax(d, 1))


def test_int_dtypes_follow_torch_masked():
    x = torch.tensor([[1, 0, 3], [0, 5, 0]])
    m = torch.tensor([[True, True, False], [False, True, True]])
    A = x.to_sparse()
    for name in ["sum", "prod", "amax", "amin", "argmax"]:
        got, want = (
            _dense(getattr(M, name)(A, 1, mask=m)),
            getattr(torch.masked, name)(x, 1, mask=m),
        )
        assert got.dtype == want.dtype and torch.equal(got, want), name
    with pytest.raises(ValueError, match="mean"):
        M.mean(A, 1, mask=m)


def test_mask_broadcasts_and_keepdim_and_dim_none():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, 3, generator=g, dtype=torch.float64)
    x[x < 0] = 0
    m = torch.rand(5, 1, generator=g) < 0.6
    for A in [
        sparsefill.to_sparse(x),
        sparsefill.to_sparse(x, dense_dim=1),
        sparsefill.to_sparse(x, layout=torch.sparse_csr),
    ]:
        for dim, keepdim in [(None, False), ((0, 2), True), (1, False), (-1, True)]:
            for name in ["sum", "amax", "mean", "var"]:
                ref = getattr(torch.masked, name)(x, dim, keepdim=keepdim, mask=m)
                got = _dense(getattr(M, name)(A, dim, keepdim=keepdim, mask=m))
                om = torch.masked._ops._output_mask(
                    getattr(torch.masked, name), x, dim, keepdim=keepdim, mask=m
                )
                assert got.shape == ref.shape
                assert_close(got[om], ref[om], msg=f"{name} {dim} {keepdim}")


def test_errors():
    A = X.to_sparse()
    with pytest.raises(IndexError):
        M.sum(A, 1, mask=torch.ones(1, 2, 3, dtype=torch.bool))
    with pytest.raises(ValueError):
        M.sum(A, 1, mask=torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(IndexError):
        M.sum(A, 2)
    with pytest.raises(RuntimeError):
        M.sum(A, (1, 1))


@pytest.mark.parametrize(
    "layout", ["native-coo", "native-csr", "sf-coo", "sf-coo fill 5", "sf-hybrid"]
)
def test_negative_norm_orders(layout):
    """ord < 0: masked-out elements count as zeros (torch.masked), so a slice with one has norm 0."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 3, generator=g)
    x[0, 1] = x[3, :2] = 0
    x[2] = 5.0
    m = torch.rand(5, 3, generator=g) < 0.7
    m[1] = m[2, :2] = True
    xs = _layouts(x)[layout]
    for mm in [m, None, m.to_sparse()]:
        dm = None if mm is None else m
        for p in [-1.0, -2.5, -math.inf]:
            for dim in [0, 1, None]:
                ref = torch.masked.norm(x, p, dim, mask=dm)
                assert_close(_dense(M.norm(xs, p, dim, mask=mm)), ref, msg=f"{p} {dim}")
            assert_close(
                _dense(M.normalize(xs, p, 1, mask=mm)), torch.masked.normalize(x, p, 1, mask=dm)
            )


# ---------------------------------------------------------------------- never densified
def test_huge_shape_is_never_densified():
    """A 10^6 x 10^6 input (10^12 elements) with 4 stored: any densifying step would fail."""
    n = 10**6
    A = sparsefill.sparse_coo_tensor(
        [[0, 0, 7, n - 1], [5, n - 1, 3, 0]], [1.0, 2.0, -3.0, 4.0], (n, n)
    )
    m = M.pattern_mask(A)
    with sparsefill.densify_policy("raise", limit_bytes=1 << 20):
        s = M.sum(A, 1, mask=m)
        assert s._nse() == 3 and s._values()[0].item() == 3.0
        assert M.amax(A, 0, mask=m)._nse() == 4
        assert M.argmax(A, 1, mask=m)._values().tolist() == [float(n - 1), 3.0, 0.0]
        assert M.median(A, 1, mask=m)._nse() == 3
        Ai = sparsefill.sparse_coo_tensor(
            A._indices(), A._values(), A.shape, fill_value=sparsefill.indefinite
        )
        assert_close(
            M.softmax(Ai, 1)._values(),
            torch.tensor([math.exp(-1) / (1 + math.exp(-1)), 1 / (1 + math.exp(-1)), 1.0, 1.0]),
        )
        with pytest.raises(sparsefill.DensifyError):
            M.softmax(
                A, 1, mask=m
            )  # drop-in: the 3 * 10^6 unspecified 0s of the 3 stored rows are stored
        assert M.cumsum(Ai, 1)._values().tolist() == [1.0, 3.0, -3.0, 4.0]
        assert M.sum(A, 1)._nse() == 3  # fill 0 masked in: closed form
        assert M.prod(A, 1)._fill_value().item() == 0.0
        assert M.normalize(A, 2.0, 1)._nse() == 4  # zero fill stays zero
        wide = torch.ones(1, n, dtype=torch.bool)  # a strided mask broadcast over 10^12 elements
        assert M.sum(A, 1, mask=wide)._nse() == 3  # masked-in zeros add nothing: never joined
        assert M.norm(A, 2.0, 0, mask=wide)._nse() == 4
        out = M.amax(A, 1, mask=wide)  # 10^12 masked-in fills: counted per row, not joined
        assert (
            out._nse() == 3
            and out._values().tolist() == [2.0, 0.0, 4.0]
            and out._fill_value().item() == 0.0
        )
        assert M.mean(A, None, mask=wide).item() == pytest.approx(4.0 / n**2)
        col = torch.zeros(n, 1, dtype=torch.bool)
        col[[0, 7, 9]] = True  # rows 0, 7, 9 masked in: row 9 holds only fills
        out = M.prod(A + 1, 1, mask=col)
        assert out._indices().tolist() == [[0, 7, 9, n - 1]] and out._values().tolist() == [
            6.0,
            -2.0,
            1.0,
            1.0,
        ]
        assert out._fill_value().item() == 1.0
        C = A.to_sparse_csr()
        with pytest.raises(sparsefill.DensifyError):
            M.log_softmax(C, 1, mask=M.pattern_mask(C))
        with pytest.raises(sparsefill.DensifyError):
            M.softmax(A, 1)  # dense by nature: every element masked in


# ---------------------------------------------------------------------- autograd
DIFFERENTIABLE = {
    "sum": lambda a, m: M.sum(a, 1, mask=m),
    "prod": lambda a, m: M.prod(a, 1, mask=m),
    "amax": lambda a, m: M.amax(a, 1, mask=m),
    "amin": lambda a, m: M.amin(a, 0, mask=m),
    "mean": lambda a, m: M.mean(a, 1, mask=m),
    "var": lambda a, m: M.var(a, 1, mask=m),
    "std": lambda a, m: M.std(a, 0, mask=m),
    "norm": lambda a, m: M.norm(a, 2.0, 1, mask=m),
    "logsumexp": lambda a, m: M.logsumexp(a, 1, mask=m),
    "median": lambda a, m: M.median(a, 1, mask=m),
    "softmax": lambda a, m: M.softmax(a, 1, mask=m),
    "log_softmax": lambda a, m: M.log_softmax(a, 1, mask=m),
    "softmin": lambda a, m: M.softmin(a, 0, mask=m),
    "normalize": lambda a, m: M.normalize(a, 2.0, 1, mask=m),
    "cumsum": lambda a, m: M.cumsum(a, 1, mask=m),
    "cumprod": lambda a, m: M.cumprod(a, 1, mask=m),
    "sum all": lambda a, m: M.sum(a, mask=m),
    "logaddexp": lambda a, m: M.logaddexp(a, a * 0.5, input_mask=m, other_mask=None),
}


def _grad_case(seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.tensor(
        [[0, 0, 1, 1, 2, 2, 3, 3], [0, 2, 1, 3, 1, 2, 0, 3]]
    )  # >= 2 per row and column
    vals = torch.randn(8, generator=g, dtype=torch.float64)
    mask = torch.zeros(4, 4, dtype=torch.bool)
    mask[idx[0], idx[1]] = True
    mask[1, 3] = False
    mask[2, 0] = mask[1, 2] = mask[3, 1] = mask[0, 3] = (
        True  # masked in where the input is unspecified
    )
    return idx, vals, mask


@pytest.mark.parametrize("name", list(DIFFERENTIABLE))
@pytest.mark.parametrize("mask_kind", ["sparse mask", "pattern mask", "mask=None, fill 0.7"])
def test_gradcheck_over_values_and_fill(name, mask_kind):
    idx, vals, mask = _grad_case()
    fn = DIFFERENTIABLE[name]
    fill0 = torch.tensor(0.7 if mask_kind.startswith("mask=None") else -0.4, dtype=torch.float64)
    if mask_kind == "pattern mask":  # every stored element masked in: the segment_reduce path
        mask = torch.zeros(4, 4, dtype=torch.bool)
        mask[idx[0], idx[1]] = True
    m = None if mask_kind.startswith("mask=None") else mask.to_sparse()

    def f(v, fill):
        A = sparsefill.sparse_coo_tensor(idx, v, (4, 4), fill_value=fill)
        out = fn(A, m)
        if isinstance(out, SparseTensor):
            out = out.to_dense()
        om = torch.isfinite(out)  # fully masked-out slices hold +-inf: not differentiable there
        return out[om]

    torch.autograd.gradcheck(f, (vals.clone().requires_grad_(), fill0.clone().requires_grad_()))
    # the same gradient as torch.masked on the dense tensor
    v, fl = vals.clone().requires_grad_(), fill0.clone().requires_grad_()
    A = sparsefill.sparse_coo_tensor(idx, v, (4, 4), fill_value=fl)
    out = fn(A, m)
    out = out.to_dense() if isinstance(out, SparseTensor) else out
    xd = A.detach().to_dense().requires_grad_()
    ref = fn(xd, None if m is None else mask)
    w = torch.isfinite(ref) & torch.isfinite(out)
    if (
        m is not None and out.shape == mask.shape
    ):  # masked-out outputs of normalizations have no fixed value
        w &= mask
    (gx,) = torch.autograd.grad(ref[w].sum(), xd)
    gv, gf = torch.autograd.grad(out[w].sum(), (v, fl), allow_unused=True)
    assert_close(gv, gx[idx[0], idx[1]], msg=name)
    unspec = torch.ones(4, 4, dtype=torch.bool)
    unspec[idx[0], idx[1]] = False
    assert_close(
        torch.zeros((), dtype=torch.float64) if gf is None else gf, gx[unspec].sum(), msg=name
    )


def test_gradient_of_a_native_sparse_input():
    x = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]]).to_sparse().requires_grad_()
    out = M.sum(x, 1, mask=M.pattern_mask(x.detach()))
    out.to_dense().sum().backward()
    assert_close(x.grad.to_dense(), torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]))


# ---------------------------------------------------------------------- random cases
def _random_case(rng: torch.Generator, it: int):
    """A random input (any fill kind, dense dims, layout), mask (any layout, broadcast), op and arguments."""

    def pick(seq):
        return seq[int(torch.randint(len(seq), (1,), generator=rng))]

    nd = int(torch.randint(1, 5, (1,), generator=rng))
    shape = tuple(int(s) for s in torch.randint(0, 5, (nd,), generator=rng))
    x = torch.randn(shape, generator=rng, dtype=torch.float64)
    dd = int(torch.randint(0, nd, (1,), generator=rng)) if nd > 1 else 0
    layout = pick([torch.sparse_coo, torch.sparse_csr]) if nd - dd >= 2 else torch.sparse_coo
    kind = pick(["zero", "scalar", "indefinite", "array"])
    keep = torch.rand(shape[: nd - dd], generator=rng) < 0.5
    xm, pattern = x.clone(), None
    if kind == "indefinite":
        idx = keep.nonzero().T
        A = sparsefill.sparse_coo_tensor(idx, xm[keep], shape, fill_value=sparsefill.indefinite)
        pattern = keep.reshape(keep.shape + (1,) * dd).expand(shape)
    else:
        f = (
            torch.randn(shape[nd - dd :], generator=rng, dtype=torch.float64)
            if kind == "array"
            else torch.tensor(0.0 if kind == "zero" else 1.5, dtype=torch.float64)
        )
        xm[~keep] = f
        A = sparsefill.to_sparse(xm, fill_value=f, layout=layout, dense_dim=dd)
    mshape = tuple(
        s if float(torch.rand((), generator=rng)) < 0.8 else 1 for s in shape[int(it % 3 == 0) :]
    )
    m = torch.rand(mshape, generator=rng) < 0.6
    mk = pick(["none", "strided", "coo", "csr", "hybrid"])
    mv = {
        "none": None,
        "strided": m,
        "coo": m.to_sparse(),
        "csr": sparsefill.to_sparse(m, layout=torch.sparse_csr) if m.dim() >= 2 else m,
        "hybrid": sparsefill.to_sparse(m, dense_dim=1) if m.dim() >= 2 else m,
    }[mk]
    ref_mask = None if mk == "none" else m
    if pattern is not None:
        ref_mask = pattern if ref_mask is None else pattern & m.expand(shape)
    d = int(torch.randint(-nd, nd, (1,), generator=rng))
    op = pick(
        [
            "sum",
            "prod",
            "amax",
            "amin",
            "mean",
            "logsumexp",
            "var",
            "std",
            "norm",
            "argmax",
            "argmin",
            "median",
            "softmax",
            "log_softmax",
            "softmin",
            "normalize",
            "cumsum",
            "cumprod",
        ]
    )
    if op in ("softmax", "log_softmax", "softmin", "cumsum", "cumprod", "normalize"):
        return op, A, xm, mv, ref_mask, ((2.0, d) if op == "normalize" else (d,)), {}
    dim = (
        d
        if op in ("argmax", "argmin", "median")
        else pick([d, None, tuple(sorted({d % nd, nd - 1}))])
    )
    kw = {"keepdim": bool(it % 2)}
    return op, A, xm, mv, ref_mask, ((2.0, dim) if op == "norm" else (dim,)), kw


def test_random_layouts_against_torch_masked():
    rng = torch.Generator().manual_seed(1234)
    checked = 0
    for it in range(300):
        op, A, xm, mv, ref_mask, args, kw = _random_case(rng, it)
        try:
            ref = getattr(torch.masked, op)(xm, *args, mask=ref_mask, **kw)
        except Exception:  # noqa: BLE001 - the dense op rejects the case: so must we
            with pytest.raises(Exception):
                getattr(M, op)(A, *args, mask=mv, **kw)
            continue
        got = _dense(getattr(M, op)(A, *args, mask=mv, **kw))
        where = torch.ones(
            ref.shape, dtype=torch.bool
        )  # every position (drop-in), but an indefinite fill's
        if (
            A.is_fill_indefinite() and ref.shape == xm.shape
        ):  # normalization has no value off its pattern
            where = M.pattern_mask(A).to_dense()
        assert got.shape == ref.shape and got.dtype == ref.dtype, (op, args, kw)
        assert_close(got[where], ref[where], equal_nan=True, msg=lambda s: f"{op} {args} {kw}: {s}")
        checked += 1
    assert checked > 200


def test_uncoalesced_input_and_mask():
    A = sparsefill.sparse_coo_tensor(
        [[1, 0, 1, 0], [2, 0, 2, 1]], [1.0, 2.0, 3.0, 4.0], (2, 3), fill_value=0.5
    )
    m = torch.sparse_coo_tensor(
        [[0, 1, 0], [1, 2, 1]], [True, True, True], (2, 3)
    )  # duplicates: or
    d, md = A.to_dense(), m.to_dense()
    for name in ["sum", "amax", "mean", "softmax"]:
        assert_close(
            _dense(getattr(M, name)(A, 1, mask=m))[md.any(1) if name != "softmax" else md],
            getattr(torch.masked, name)(d, 1, mask=md)[md.any(1) if name != "softmax" else md],
        )


@pytest.mark.parametrize(
    "dense_dim, layout", [(0, torch.sparse_csr), (1, torch.sparse_coo), (1, torch.sparse_csr)]
)
def test_gradients_match_torch_masked_hybrid_and_batched_csr(dense_dim, layout):
    """Batched CSR results pad their batches; hybrid inputs reduce over dense dims; zero slices in normalize."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 2, generator=g, dtype=torch.float64)
    x[torch.rand(3, 4, generator=g) < 0.4] = 0
    m = torch.rand(3, 4, 2, generator=g) < 0.7
    cases = [
        ("sum", (1,)),
        ("softmax", (1,)),
        ("amax", (0,)),
        ("var", ((0, 2),)),
        ("logsumexp", (None,)),
        ("normalize", (2.0, 2)),
        ("median", (2,)),
    ]
    for op, args in cases:
        for mm in [m, None]:
            A = sparsefill.to_sparse(x, layout=layout, dense_dim=dense_dim).requires_grad_()
            out = getattr(M, op)(A, *args, mask=mm)
            o = out.to_dense() if isinstance(out, SparseTensor) else out
            xd = x.clone().requires_grad_()
            r = getattr(torch.masked, op)(xd, *args, mask=mm)
            w = torch.isfinite(r) & torch.isfinite(o)
            if op in ("softmax", "normalize") and mm is not None:
                w &= m
            (ga,) = torch.autograd.grad(o[w].sum(), A)
            (gx,) = torch.autograd.grad(r[w].sum(), xd)
            assert_close(
                ga.to_dense() if isinstance(ga, SparseTensor) else ga, gx, msg=f"{op} {args}"
            )


@pytest.mark.parametrize("name", ["amax", "amin"])
def test_extreme_tie_gradients_split_evenly(name):
    """Ties among stored values and masked-in fills: the gradient splits evenly among all tied elements, as
    torch's amax/amin backward on the dense slice (the fill's share counts every tied unspecified element)."""
    idx = torch.tensor([[0, 0, 0, 1, 1, 2], [0, 1, 3, 0, 2, 4]])
    for fill0, vals in [
        (2.0, [2.0, 2.0, 1.0, 5.0, 5.0, -1.0]),
        (-1.0, [-1.0, 3.0, -1.0, -1.0, 0.0, -1.0]),
    ]:
        for mask in [
            None,
            torch.tensor([[1, 1, 1, 0, 1], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool),
        ]:
            v = torch.tensor(vals, dtype=torch.float64, requires_grad=True)
            f = torch.tensor(fill0, dtype=torch.float64, requires_grad=True)
            A = sparsefill.sparse_coo_tensor(idx, v, (3, 5), fill_value=f)
            xd = A.detach().to_dense().requires_grad_()
            for dim in [0, 1]:
                w = torch.arange(1.0, 6.0 if dim == 0 else 4.0, dtype=torch.float64)
                out = _dense(getattr(M, name)(A, dim, mask=mask))
                ref = getattr(torch.masked, name)(xd, dim, mask=mask)
                gv, gf = torch.autograd.grad((out * w).sum(), (v, f))
                (gx,) = torch.autograd.grad((ref * w).sum(), xd)
                unspec = torch.ones(3, 5, dtype=torch.bool)
                unspec[idx[0], idx[1]] = False
                assert_close(gv, gx[idx[0], idx[1]], msg=f"{fill0} {dim}")
                assert_close(gf, gx[unspec].sum(), msg=f"{fill0} {dim}")


def test_argmax_of_a_differentiable_input_has_no_grad_fn():
    """As torch.masked.argmax: an index, not differentiable (the result has no grad_fn)."""
    A = sparsefill.to_sparse(X).requires_grad_()
    for name in ["argmax", "argmin"]:
        out = getattr(M, name)(A, 1, mask=MASK)
        assert not out.requires_grad
        assert_close(
            _dense(out), getattr(torch.masked, name)(X.requires_grad_(False), 1, mask=MASK)
        )


def test_segmented_scan_matches_a_per_segment_scan():
    """One long segment among short ones: power-of-two width classes (tables < 2x the elements)."""
    from sparsefill.masked._normalizations import _segmented_scan

    g = torch.Generator().manual_seed(0)
    seg = torch.randint(0, 50, (1000,), generator=g)
    seg[:300] = 7
    v = torch.randn(1000, dtype=torch.float64, generator=g)
    for mode, scan in [("sum", torch.cumsum), ("prod", torch.cumprod)]:
        ref = torch.empty_like(v)
        for s in range(50):
            i = (seg == s).nonzero().squeeze(1)
            ref[i] = scan(v[i], 0)
        assert_close(_segmented_scan(v, seg, 60, mode), ref)


def _check_vs_torch(op, x, inputs, *args, mask=None, **kw):
    """``op`` on every input equals torch.masked on the dense ``x`` at every position (or raises the same type)."""
    try:
        want = getattr(torch.masked, op)(x, *args, mask=mask, **kw)
    except Exception as e:  # noqa: BLE001 - the same error type is expected
        for inp in inputs:
            with pytest.raises(type(e)):
                getattr(M, op)(inp, *args, mask=mask, **kw)
        return
    for inp in inputs:
        got = _dense(getattr(M, op)(inp, *args, mask=mask, **kw))
        assert got.dtype == want.dtype, (op, args, got.dtype, want.dtype)
        assert_close(got, want, equal_nan=True, msg=f"{op} {args}")


def _int_inputs(x):
    out = [x, x.to_sparse(), sparsefill.to_sparse(x), sparsefill.to_sparse(x, fill_value=1)]
    return out + (
        [sparsefill.to_sparse(x, layout=torch.sparse_csr), x.to_sparse_csr()]
        if x.dim() == 2
        else []
    )


@pytest.mark.parametrize(
    "dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool]
)
@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
def test_cumulative_integer_and_bool_inputs_keep_torch_dtype(op, dtype):
    """Regression: int32/16/8 scans wrote int64 running values into the input dtype; bool raises as torch."""
    z = torch.tensor([[1, 0, 3], [0, 5, 0]]).to(dtype)
    m = torch.tensor([[True, False, True], [False, True, True]])
    for dim in [0, 1]:
        for mask in [m, None]:
            for kw in [{}, {"dtype": torch.int64}]:
                _check_vs_torch(op, z, _int_inputs(z), dim, mask=mask, **kw)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_median_integer_input_raises_only_when_a_slice_is_fully_masked_out(dtype):
    """Regression: the result's (unread) NaN fill made integer/bool median raise with no empty slice."""
    y = torch.tensor([1, 0, 3, 4]).to(dtype)
    for m in [
        torch.tensor([False, False, True, True]),
        torch.tensor([True, False, False, False]),
        torch.zeros(4, dtype=torch.bool),
        None,
    ]:
        for keepdim in [True, False]:
            _check_vs_torch("median", y, _int_inputs(y), 0, mask=m, keepdim=keepdim)
    z = torch.tensor([[1, 0, 3, 4], [0, 0, 2, 0], [0, 0, 0, 0]]).to(dtype)
    mz = torch.tensor(
        [[False, False, True, True], [True, False, False, True], [False, True, False, False]]
    )
    for m in [mz, mz & (z != 0), None]:
        for dim in [0, 1, -1]:
            _check_vs_torch("median", z, _int_inputs(z), dim, mask=m, keepdim=dim == 1)


@pytest.mark.parametrize("ord", [INF, -INF, -1.0, -2.0, 0.0, 1.0, 2.0])
def test_norm_over_an_empty_dim_raises_as_torch_for_ords_without_identity(ord):
    """Regression: ord inf/-inf/negative over a size-0 dim returned a value; torch.masked raises RuntimeError."""
    for shape in [(2, 0), (0, 2), (0,)]:
        x = torch.zeros(shape)
        ins = [x, sparsefill.to_sparse(x), x.to_sparse(), sparsefill.to_sparse(x, fill_value=1.0)]
        for dim in [0, -1, None, (0,)]:
            _check_vs_torch("norm", x, ins, ord, dim, mask=torch.ones(shape, dtype=torch.bool))
            _check_vs_torch("norm", x, ins, ord, dim)


def test_normalizations_masked_out_elements_of_a_slice_with_nan_normalizer():
    """Regression: masked-out elements read torch.masked's value (masked_fill then the op) when the slice's
    normalizer is NaN or -inf (softmax: exp(-inf - lse); normalize: 0 / max(norm, eps)), not the usual 0/-inf."""
    assert_close(
        _dense(
            M.softmax(
                sparsefill.to_sparse(torch.tensor([[-1.0, -INF]]), fill_value=2.0),
                1,
                mask=torch.tensor([[False, True]]),
            )
        ),
        torch.tensor([[NAN, NAN]]),
        equal_nan=True,
    )
    assert_close(
        _dense(
            M.normalize(
                sparsefill.to_sparse(torch.tensor([[NAN, 0.0]])),
                2.0,
                1,
                mask=torch.tensor([[True, False]]),
            )
        ),
        torch.tensor([[NAN, NAN]]),
        equal_nan=True,
    )
    g = torch.Generator().manual_seed(0)
    pool = torch.tensor([0.0, 0.0, 1.0, -2.0, INF, -INF, NAN, 3.0], dtype=torch.float64)
    for shape in [(3, 5), (3, 4, 2)]:
        for fill in [0.0, 2.0, -INF]:
            x = pool[torch.randint(0, len(pool), shape, generator=g)]
            x[torch.rand(shape, generator=g) < 0.4] = fill
            m = torch.rand(shape, generator=g) < 0.6
            ins = [
                sparsefill.to_sparse(x, fill_value=fill),
                sparsefill.to_sparse(x, fill_value=fill, dense_dim=1),
            ] + ([x.to_sparse()] if fill == 0 else [])
            for dim in range(len(shape)):
                for mask in [m, None]:
                    for op in ["softmax", "log_softmax", "softmin"]:
                        _check_vs_torch(op, x, ins, dim, mask=mask)
                    for ord, eps in [
                        (2.0, 1e-12),
                        (1.0, 0.0),
                        (-INF, 1e-12),
                        (-1.0, 1e-12),
                        (0.0, -1.0),
                    ]:
                        _check_vs_torch("normalize", x, ins, ord, dim, mask=mask, eps=eps)


MASKED_DTYPE_OPS = {
    "softmax": (0,),
    "log_softmax": (0,),
    "softmin": (0,),
    "normalize": (2.0, 0),
    "amax": (0,),
    "amin": (0,),
    "argmax": (0,),
    "logsumexp": (0,),
    "var": (0,),
    "sum": (0,),
    "mean": (0,),
    "median": (0,),
}


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool], ids=str)
@pytest.mark.parametrize("name", sorted(MASKED_DTYPE_OPS))
def test_integer_and_bool_inputs_raise_where_torch_masked_does(name, dtype):
    """Integer/bool inputs: the result where ``torch.masked`` gives one, its error type where it raises (softmax,
    log_softmax, softmin of a masked int64, normalize of any int64, amax of a masked bool ...): the sparse path
    read no dtype and returned float results."""
    vals = torch.tensor([1, 2]).to(dtype)
    for fill in (0, sparsefill.indefinite):
        A = sparsefill.sparse_coo_tensor([[0, 1]], vals, (3,), fill_value=fill)
        x = A.to_dense(fill_value=torch.zeros((), dtype=dtype))
        for mask in (None, torch.tensor([True, False, True])):
            m = (
                mask
                if fill == 0
                else (
                    torch.tensor([True, True, False])
                    if mask is None
                    else mask & torch.tensor([True, True, False])
                )
            )
            args = MASKED_DTYPE_OPS[name]
            try:
                want = getattr(torch.masked, name)(x, *args, mask=m)
            except Exception as e:  # noqa: BLE001 (torch's error type is the expectation)
                with pytest.raises(type(e)):
                    getattr(sparsefill.masked, name)(A, *args, mask=mask)
                continue
            got = getattr(sparsefill.masked, name)(A, *args, mask=mask)
            if isinstance(got, SparseTensor):
                got = got.to_dense(
                    fill_value=torch.zeros((), dtype=got.dtype)
                    if got.is_fill_indefinite()
                    else None
                )
            assert got.dtype == want.dtype
            torch.testing.assert_close(
                got[m] if m is not None and got.shape == m.shape else got,
                want[m] if m is not None and want.shape == m.shape else want,
                equal_nan=True,
            )


@pytest.mark.parametrize("shape", [(0, 0), (0, 3), (3, 0)], ids=str)
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "softmin"])
def test_softmax_of_an_empty_integer_input_keeps_its_dtype(name, shape):
    """torch.masked's softmax of an empty int64 tensor is an empty int64 tensor (no kernel runs to refuse the
    dtype); sparsefill.masked's was float32."""
    x = torch.ones(shape, dtype=torch.int64)
    for mask in (None, torch.ones(shape, dtype=torch.bool)):
        for d in (0, 1):
            got = getattr(M, name)(sparsefill.to_sparse(x), d, mask=mask)
            want = getattr(torch.masked, name)(x, d, mask=mask)
            assert got.dtype == want.dtype == torch.int64 and got.shape == want.shape


@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
def test_scan_of_an_empty_bool_input_as_torch_masked(name):
    """torch.masked's cumsum/cumprod of an empty bool tensor is an empty bool tensor (torch's scan kernels refuse
    bool only when they run); sparsefill.masked raised NotImplementedError; a non-empty one raises on both."""
    for shape in ((0, 0), (0, 3), (3, 0)):
        x = torch.zeros(shape, dtype=torch.bool)
        for d in (0, 1):
            for mask in (None, torch.ones(shape, dtype=torch.bool)):
                got = getattr(M, name)(sparsefill.to_sparse(x), d, mask=mask)
                want = getattr(torch.masked, name)(x, d, mask=mask)
                assert got.dtype == want.dtype == torch.bool and got.shape == want.shape
    with pytest.raises(NotImplementedError):
        getattr(torch.masked, name)(torch.ones(2, dtype=torch.bool), 0)
    with pytest.raises(NotImplementedError):
        getattr(M, name)(sparsefill.to_sparse(torch.ones(2, dtype=torch.bool)), 0)
