"""Indexing and joining on SparseTensors (select, slices, index_select, split/chunk/unbind, cat, stack)
equal the dense ops, natively, for COO, CSR and hybrid inputs; gradcheck over (values, fill)."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch.autograd import gradcheck

import sparsefill
from sparsefill import SparseTensor

F64 = torch.float64
g = torch.Generator().manual_seed(0)
X = torch.randn(4, 5, 3, generator=g, dtype=F64)
X[torch.rand(4, 5, 3, generator=g) < 0.6] = 0.5
Y = torch.randn(2, 5, 3, generator=g, dtype=F64)
Y[torch.rand(2, 5, 3, generator=g) < 0.6] = -1.0
KINDS = [
    (lay, dd)
    for dd in (0, 1, 2)
    for lay in (torch.sparse_coo, torch.sparse_csr)
    if not (lay is torch.sparse_csr and dd == 2)
]
IDS = [f"{str(lay)[13:]}-dense{dd}" for lay, dd in KINDS]
OPS = {
    "select0": lambda t: t[1],
    "select1": lambda t: t[:, 2],
    "select_last": lambda t: t[:, :, -1],
    "element": lambda t: t[1, 2],
    "slice_step": lambda t: t[1:4:2],
    "slice1": lambda t: t[:, ::2],
    "slice_dense": lambda t: t[..., 1:],
    "slice_empty": lambda t: t[3:1],
    "narrow": lambda t: t.narrow(1, 1, 3),
    "index_select0": lambda t: t.index_select(0, torch.tensor([3, 0, 3])),
    "index_select1": lambda t: t.index_select(1, torch.tensor([4, 4, 1, 0])),
    "index_select2": lambda t: t.index_select(2, torch.tensor([2, 0])),
    "index_select_empty": lambda t: t.index_select(1, torch.tensor([], dtype=torch.long)),
    "unbind": lambda t: t.unbind(1),
    "split": lambda t: t.split(2, 1),
    "split_sizes": lambda t: t.split([1, 3], 0),
    "chunk": lambda t: t.chunk(2, 0),
    "flip0": lambda t: t.flip(0),
    "flip12": lambda t: t.flip((1, 2)),
    "roll": lambda t: t.roll(2, 1),
    "roll2": lambda t: t.roll((1, -1), (0, 2)),
    "repeat": lambda t: t.repeat(2, 1, 3),
    "repeat_new_dims": lambda t: t.repeat(2, 1, 1, 2),
    "tile": lambda t: t.tile((2,)),
    "rot90": lambda t: t.rot90(1, (0, 2)),
    "rot90_2": lambda t: t.rot90(2, (1, 2)),
    "rot90_3": lambda t: t.rot90(-1),
    "masked_fill": lambda t: t.masked_fill(t > 0.6, -2.0),
    "masked_fill_tensor": lambda t: t.masked_fill(t > 0.6, torch.tensor(-2.0, dtype=F64)),
}


ADVANCED = {
    "int": lambda t: t[torch.tensor([3, 0, 3])],
    "int_dim1": lambda t: t[:, torch.tensor([4, -1])],
    "int_2d": lambda t: t[torch.tensor([[1, 2], [0, 0]])],
    "mask": lambda t: t[X[:, 0, 0] > 0],
    "mask_2d": lambda t: t[X[:, :, 0] > 0],
    "mask_dim1": lambda t: t[:, X[0, :, 0] > 0],
    "two": lambda t: t[torch.tensor([0, 3, -1]), torch.tensor([1, 4, 0])],
    "three": lambda t: t[
        torch.tensor([0, 3, -1]), torch.tensor([1, 4, 0]), torch.tensor([0, 0, 2])
    ],
    "broadcast_after_slice": lambda t: t[:, torch.tensor([1, 4]), torch.tensor([[2], [0]])],
    "apart": lambda t: t[torch.tensor([0, 3, -1]), :, torch.tensor([1, 1, 2])],
    "mask_and_int": lambda t: t[X[:, :, 0] > 0, torch.tensor(1)],
    "ellipsis_apart": lambda t: t[torch.tensor([1]), ..., torch.tensor([2])],
}
assert not set(ADVANCED) & set(OPS)
OPS.update(ADVANCED)  # (run by test_indexing_is_native)


def _d(o):
    if isinstance(o, (tuple, list)):
        return tuple(_d(x) for x in o)
    return o.to_dense() if isinstance(o, SparseTensor) else o


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("layout,dd", KINDS, ids=IDS)
def test_indexing_is_native(layout, dd, name):
    """Every op of ``OPS`` (the advanced-indexing forms of ``ADVANCED`` included)."""
    A = sparsefill.to_sparse(X, fill_value=0.5, layout=layout, dense_dim=dd)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        out = OPS[name](A)
    torch.testing.assert_close(_d(out), OPS[name](X))


@pytest.mark.parametrize("layout,dd", KINDS, ids=IDS)
def test_cat_and_stack(layout, dd):
    A = sparsefill.to_sparse(X, fill_value=0.5, layout=layout, dense_dim=dd)
    B = sparsefill.to_sparse(Y, fill_value=-1.0, layout=layout, dense_dim=dd)
    C = sparsefill.to_sparse(X[:3], fill_value=0.5, layout=layout, dense_dim=dd)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        cases = [
            (torch.cat([A, B]), torch.cat([X, Y])),
            (torch.cat([A, C], 0), torch.cat([X, X[:3]])),
            (torch.cat([A, A], 1), torch.cat([X, X], 1)),
            (torch.stack([A, A], 1), torch.stack([X, X], 1)),
            (torch.stack([A, A]), torch.stack([X, X])),
        ]
    for out, ref in cases:
        assert isinstance(out, SparseTensor)
        torch.testing.assert_close(out.to_dense(), ref)
    assert torch.cat([A, B]).fill_value().eq(0.5).all()  # the largest operand's fill


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_roll_flat_and_triangles_of_a_zero_fill(layout):
    z = X[:, :, 0].clone()
    z[z == 0.5] = 0
    Z = sparsefill.to_sparse(z, fill_value=0.0, layout=layout)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        for op in [
            lambda t: t.roll(7),
            lambda t: t.tril(),
            lambda t: t.triu(1),
            lambda t: t.tril(-1),
            lambda t: t.diagonal(),
            lambda t: t.diagonal(-2),
            lambda t: torch.diag(t, 1),
            torch.trace,
        ]:
            torch.testing.assert_close(op(Z).to_dense(), op(z))


@pytest.mark.parametrize("layout,dd", KINDS, ids=IDS)
def test_triangles_of_hybrid_tensors(layout, dd):
    A = sparsefill.to_sparse(X, fill_value=0.5, layout=layout, dense_dim=dd)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        for k in (-1, 0, 2):
            for op in (torch.tril, torch.triu):
                torch.testing.assert_close(op(A, k).to_dense(), op(X, k))


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
@pytest.mark.parametrize("fill", [2.0, float("nan")])
def test_triangles_of_a_nonzero_fill(layout, fill):
    """Dense by nature in part: the cheaper exact form (zeros stored, or the kept triangle stored)."""
    gen = torch.Generator().manual_seed(3)
    for shape in [(5, 5), (4, 7), (7, 3), (2, 3, 4), (0, 3)]:
        for density in (0.1, 0.9):
            x = torch.randn(shape, generator=gen, dtype=F64)
            x[torch.rand(shape, generator=gen) > density] = fill
            A = sparsefill.to_sparse(x, fill_value=fill, layout=layout)
            with warnings.catch_warnings():
                warnings.simplefilter("error", sparsefill.DensifyWarning)
                for k in (-2, 0, 1, 3):
                    for op in (torch.tril, torch.triu):
                        out = op(A, k)
                        assert isinstance(out, SparseTensor) and out.sparse_layout == layout
                        torch.testing.assert_close(out.to_dense(), op(x, k), equal_nan=True)


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
def test_split_along_a_size_zero_dim_gives_one_empty_piece(layout):
    """Dense ``split`` along a size-0 dim returns a 1-tuple holding the empty tensor (it returned ``()``)."""
    for shape, dim in (((0, 3), 0), ((3, 0), 1), ((2, 0), 1)):
        A = sparsefill.to_sparse(torch.zeros(shape), fill_value=1.5, layout=layout)
        for how in (1, 2, 0, [0]):
            got, want = A.split(how, dim), A.to_dense().split(how, dim)
            assert len(got) == len(want) == 1
            torch.testing.assert_close(got[0].to_dense(), want[0])
        assert len(A.chunk(3, dim)) == len(A.to_dense().chunk(3, dim))


def test_bad_indices_raise():
    A = sparsefill.to_sparse(X, fill_value=0.5)
    with pytest.raises(IndexError, match="index 5 is out of bounds for dimension 1 with size 5"):
        A[torch.tensor([0]), torch.tensor([5])]
    with pytest.raises(IndexError):
        A[torch.tensor([0, 1]), torch.tensor([0, 1, 2])]  # (shapes do not broadcast)
    with pytest.raises(IndexError):
        A[4]
    with pytest.raises(IndexError):
        A.index_select(1, torch.tensor([5]))
    with pytest.raises(RuntimeError):
        A.split([1, 2], 0)
    with pytest.raises(IndexError):
        A[torch.tensor([7])]
    with pytest.raises(IndexError):
        A[torch.ones(3, dtype=torch.bool)]


IDX = torch.tensor([[0, 1, 3, 3], [2, 0, 1, 4]])


@pytest.mark.parametrize(
    "name,op",
    [
        ("index_select", lambda t: t.index_select(1, torch.tensor([4, 0, 0, 2]))),
        ("select", lambda t: t[3]),
        ("slice", lambda t: t[1:, ::2]),
        ("cat", lambda t: torch.cat([t, t * 2], 0)),
    ],
)
def test_gradcheck_over_values_and_fill(name, op):
    def fn(v, f):
        out = op(sparsefill.sparse_coo_tensor(IDX, v, (4, 5), fill_value=f))
        return out.to_dense() if isinstance(out, SparseTensor) else out

    v = torch.tensor([0.3, -1.2, 2.0, 0.7], dtype=F64, requires_grad=True)
    f = torch.tensor(0.1, dtype=F64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", sparsefill.DensifyWarning
        )  # backward formulas may scatter densely
        assert gradcheck(fn, (v, f), check_batched_grad=False)


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_index_put(layout, accumulate):
    x = X[:, :, 0].clone()
    A, y = sparsefill.to_sparse(x, fill_value=0.5, layout=layout), x.clone()
    i, j, v = (
        torch.tensor([0, 3, -1]),
        torch.tensor([1, 4, 0]),
        torch.tensor([9.0, 8.0, 7.0], dtype=F64),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        A.index_put_((i, j), v, accumulate=accumulate)
        y.index_put_((i, j), v, accumulate=accumulate)
        torch.testing.assert_close(A.to_dense(), y)
        m = y > 1
        A[m] = -1.0
        y[m] = -1.0
        torch.testing.assert_close(A.to_dense(), y)
        B = torch.index_put(A, (torch.tensor([2]), torch.tensor([2])), torch.tensor(3.0, dtype=F64))
        torch.testing.assert_close(
            B.to_dense(),
            torch.index_put(
                y, (torch.tensor([2]), torch.tensor([2])), torch.tensor(3.0, dtype=F64)
            ),
        )
    torch.testing.assert_close(A.to_dense(), y)  # the functional form left A alone
    before = A.to_dense()
    with pytest.raises(IndexError):
        A.index_put_((torch.tensor([9]), torch.tensor([0])), torch.tensor(1.0, dtype=F64))
    with pytest.raises(RuntimeError, match="dtypes match"):
        A.index_put_((torch.tensor([0]), torch.tensor([0])), torch.tensor(1))
    torch.testing.assert_close(A.to_dense(), before)  # failed calls change nothing


SCATTERS = {
    "scatter1": lambda t, i, s: t.scatter(1, i, s),
    "scatter0": lambda t, i, s: t.scatter(0, i, s),
    "scatter_value": lambda t, i, s: t.scatter(1, i, 2.5),
    "scatter_add": lambda t, i, s: t.scatter_add(1, i, s),
    "scatter_": lambda t, i, s: t.clone().scatter_(0, i, 1.0),
    "scatter_add_": lambda t, i, s: t.clone().scatter_add_(1, i, s),
}


@pytest.mark.parametrize("name", list(SCATTERS))
@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_scatter(layout, name):
    x = X[:, :, 0].clone()
    A = sparsefill.to_sparse(x, fill_value=0.5, layout=layout)
    idx, src = torch.tensor([[0, 1, 2], [3, 0, 1]]), torch.arange(12, dtype=F64).reshape(2, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        out = SCATTERS[name](A, idx, src)
    torch.testing.assert_close(out.to_dense(), SCATTERS[name](x, idx, src))


WRITES = {
    "rows": lambda t: t.index_put_((torch.tensor([0, 2]),), torch.tensor(7.0, dtype=F64)),
    "slice_then_index": lambda t: t.__setitem__((slice(None), torch.tensor([1, -1])), -3.0),
    "two_then_dense": lambda t: t.index_put_(
        (torch.tensor([1, 3]), torch.tensor([0, 0])), torch.arange(3, dtype=F64), accumulate=True
    ),
    "mask_rows": lambda t: t.__setitem__(X[:, 0, 0] > 0, 4.0),
    "scatter_add_": lambda t: t.scatter_add_(
        1, torch.tensor([[[0, 1, 0]], [[4, 4, 4]]]), torch.ones(2, 1, 3, dtype=F64)
    ),
    "scatter_multiply": lambda t: t.scatter_(
        0, torch.tensor([[[1, 1, 2]]]), 2.5, reduce="multiply"
    ),
    "scatter_reduce_amax": lambda t: t.scatter_reduce_(
        1,
        torch.tensor([[[0, 2, 2], [2, 2, 0]]]),
        torch.full((1, 2, 3), 0.7, dtype=F64),
        "amax",
        include_self=False,
    ),
    "scatter_reduce_mean": lambda t: t.scatter_reduce_(
        2, torch.tensor([[[0, 0], [1, 1]]]), torch.ones(1, 2, 2, dtype=F64), "mean"
    ),
    "index_add_": lambda t: t.index_add_(
        1, torch.tensor([0, 4, 0]), torch.ones(4, 3, 3, dtype=F64), alpha=2
    ),
    "index_copy_": lambda t: t.index_copy_(
        0, torch.tensor([3, 1]), torch.full((2, 5, 3), -1.0, dtype=F64)
    ),
    "index_fill_": lambda t: t.index_fill_(2, torch.tensor([1]), 0.25),
    "index_reduce_prod": lambda t: t.index_reduce_(
        0, torch.tensor([0, 0, 2]), torch.full((3, 5, 3), 2.0, dtype=F64), "prod", include_self=True
    ),
}


@pytest.mark.parametrize("name", list(WRITES))
@pytest.mark.parametrize("layout,dd", KINDS, ids=IDS)
def test_writes_every_index_form(layout, dd, name):
    """index_put with index tensors, masks and ``:``; scatter/scatter_add/scatter_reduce; index_add/copy/fill/
    reduce: native (the written positions join the pattern), equal to the dense write."""
    A, y = sparsefill.to_sparse(X, fill_value=0.5, layout=layout, dense_dim=dd), X.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        WRITES[name](A)
    WRITES[name](y)
    assert isinstance(A, SparseTensor)
    torch.testing.assert_close(A.to_dense(), y)


@pytest.mark.parametrize("src_sparse", [False, True])
def test_functional_writes_leave_the_input_alone_and_errors_change_nothing(src_sparse):
    A = sparsefill.to_sparse(X, fill_value=0.5)
    src = torch.randn(4, 5, 3, dtype=F64, generator=torch.Generator().manual_seed(4))
    src_arg = sparsefill.to_sparse(src, fill_value=0.0) if src_sparse else src
    index = torch.tensor([[[0, 1, 2]], [[4, 3, 2]]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        out = torch.scatter(A, 1, index, src_arg)
        torch.testing.assert_close(out.to_dense(), torch.scatter(X, 1, index, src))
        out = torch.scatter_reduce(A, 1, index, src_arg, "prod")
        torch.testing.assert_close(out.to_dense(), torch.scatter_reduce(X, 1, index, src, "prod"))
    torch.testing.assert_close(A.to_dense(), X)
    for bad in (
        lambda: A.scatter_(1, torch.tensor([[[5]]]), 1.0),
        lambda: A.index_add_(0, torch.tensor([4]), src[:1]),
        lambda: A.index_put_((torch.tensor([0]),), torch.ones(2, dtype=F64)),
        lambda: A.index_copy_(0, torch.tensor([0]), src[:1].float()),
    ):
        with pytest.raises((IndexError, RuntimeError)):
            bad()
        torch.testing.assert_close(A.to_dense(), X)


@pytest.mark.parametrize("layout,dd", KINDS, ids=IDS)
def test_cat_and_stack_along_dense_dims_and_with_dense_operands(layout, dd):
    """Along a dense dim the patterns join (each operand's fill where it has no slice); a strided operand
    is stored where it differs from the fill."""
    A = sparsefill.to_sparse(X, fill_value=0.5, layout=layout, dense_dim=dd)
    B = sparsefill.to_sparse(X.flip(0), fill_value=0.5, layout=layout, dense_dim=dd)
    cases = [
        lambda a, b: torch.cat([a, b], -1),
        lambda a, b: torch.stack([a, b], -1),
        lambda a, b: torch.stack([a, b], 2),
        lambda a, b: torch.cat([a, X], 1),
        lambda a, b: torch.stack([X, a], 0),
        lambda a, b: torch.cat([a, b, X], -1),
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        outs = [op(A, B) for op in cases]
    for op, out in zip(cases, outs):
        assert isinstance(out, SparseTensor)
        torch.testing.assert_close(out.to_dense(), op(X, X.flip(0)))


@pytest.mark.parametrize("layout,dd", KINDS, ids=IDS)
def test_diagonal_of_hybrid_tensors(layout, dd):
    """Two sparse dims: the stored diagonal, moved after the dense dims; two dense dims: on the values and the
    fill; one of each: the dense dims become sparse first."""
    A = sparsefill.to_sparse(X, fill_value=0.5, layout=layout, dense_dim=dd)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        for offset in (-1, 0, 2):
            for d1, d2 in [(0, 1), (1, 0), (0, 2), (1, 2), (-1, -2)]:
                out = torch.diagonal(A, offset, d1, d2)
                torch.testing.assert_close(out.to_dense(), torch.diagonal(X, offset, d1, d2))


@pytest.mark.parametrize("layout,dd", KINDS, ids=IDS)
@pytest.mark.parametrize("fill", [0.0, 0.5])
def test_diag_embed_stores_the_diagonal_only(layout, dd, fill):
    """diag_embed: fill 0 and the new diagonal's elements stored (the stored ones for a zero fill,
    every one for another), forward and backward as dense."""
    x = X.clone()
    x[x == 0.5] = fill
    A = sparsefill.to_sparse(x, fill_value=fill, layout=layout, dense_dim=dd)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        for offset, d1, d2 in [(0, -2, -1), (1, 0, 1), (-2, 3, 1), (0, 2, 0)]:
            out = torch.diag_embed(A, offset, d1, d2)
            assert out.fill_value().item() == 0
            stored = A.numel() if fill else A.values().numel()
            assert out._nnz() <= stored
            torch.testing.assert_close(out.to_dense(), torch.diag_embed(x, offset, d1, d2))
    L = A.detach().requires_grad_()
    w = torch.randn(torch.diag_embed(x).shape, dtype=x.dtype)
    (torch.diag_embed(L) * w).sum().backward()
    xl = x.clone().requires_grad_()
    (torch.diag_embed(xl) * w).sum().backward()
    torch.testing.assert_close(L.grad.to_dense(), xl.grad)


@pytest.mark.parametrize("layout,dd", KINDS, ids=IDS)
def test_gather_masked_select_and_nonzero(layout, dd):
    """gather/take_along_dim read stored values or the fill at the index's coordinates; masked_select is A[mask]
    (broadcast); nonzero of a zero-fill tensor lists the stored nonzeros."""
    A = sparsefill.to_sparse(X, fill_value=0.5, layout=layout, dense_dim=dd)
    index = torch.tensor([[[0, 2, 1], [4, 4, 0]], [[1, 1, 1], [0, 3, 2]]])
    z = X.clone()
    z[z == 0.5] = 0
    Z = sparsefill.to_sparse(z, fill_value=0.0, layout=layout, dense_dim=dd)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        for dim in (0, 1, 2, -1):
            i = index.clamp(max=X.shape[dim] - 1)
            torch.testing.assert_close(_d(torch.gather(A, dim, i)), torch.gather(X, dim, i))
            shape = list(X.shape)
            shape[dim] = 2
            j = torch.randint(
                0, X.shape[dim], shape, generator=torch.Generator().manual_seed(dim % 3)
            )
            torch.testing.assert_close(
                _d(torch.take_along_dim(A, j, dim)), torch.take_along_dim(X, j, dim)
            )
        for mask in (X > 0.6, X[0, :, :1] > 0):
            torch.testing.assert_close(
                _d(torch.masked_select(A, mask)), torch.masked_select(X, mask)
            )
        assert torch.equal(torch.nonzero(Z), torch.nonzero(z))
        assert torch.equal(torch.argwhere(Z), torch.argwhere(z))
    with pytest.raises(RuntimeError):
        torch.gather(A, 0, torch.tensor([[[4]]]))


@pytest.mark.parametrize("layout,dd", KINDS, ids=IDS)
@pytest.mark.parametrize("fill", (0.5, float("nan")))
def test_nonzero_of_a_nonzero_fill(layout, dd, fill):
    """A nonzero fill lists every unspecified element (dense by nature: one pass, no fallback);
    stored zeros are left out; nonzero_static truncates or pads the rows as torch does."""
    x = X.clone()
    x[x == 0.5] = fill
    x[0, 1] = 0.0  # stored zeros (a whole dense row of a hybrid tensor)
    A = sparsefill.to_sparse(x, fill_value=fill, layout=layout, dense_dim=dd)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        assert torch.equal(torch.nonzero(A), torch.nonzero(x))
        assert torch.equal(torch.argwhere(A), torch.argwhere(x))
        for a, b in zip(torch.nonzero(A, as_tuple=True), torch.nonzero(x, as_tuple=True)):
            assert torch.equal(a, b)
        for size in (0, 3, x.numel() + 2):
            got = torch.nonzero_static(A, size=size, fill_value=-7)
            assert torch.equal(got, torch.nonzero_static(x, size=size, fill_value=-7))
    with sparsefill.densify_policy(dense_by_nature="raise"), pytest.raises(sparsefill.DensifyError):
        torch.nonzero(A)
    assert "dense by nature" in str(sparsefill.explain(torch.nonzero, A))
    B = sparsefill.to_sparse(torch.tensor(2.0), fill_value=1.0)  # 0-d
    assert torch.equal(torch.nonzero(B), torch.nonzero(torch.tensor(2.0)))


# ---------------------------------------------------------------- edge cases
import sparsefill as sf  # noqa: E402


@pytest.mark.filterwarnings("ignore::sparsefill.DensifyWarning")
def test_strided_targets_with_sparse_sources_and_sparse_masks():
    xd = torch.zeros(4, 3)
    S = sf.to_sparse(torch.eye(4, 3), fill_value=0.0)
    i = torch.tensor([3, 0, 3, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sf.DensifyWarning)
        torch.testing.assert_close(
            _d(torch.index_add(xd, 0, i, S)), torch.index_add(xd, 0, i, torch.eye(4, 3))
        )
        torch.testing.assert_close(
            _d(torch.index_copy(xd, 0, torch.tensor([2, 0, 1, 3]), S)),
            torch.index_copy(xd, 0, torch.tensor([2, 0, 1, 3]), torch.eye(4, 3)),
        )
        y, z = xd.clone(), xd.clone()
        y[torch.tensor([1, 2])] = S[:2]
        z[torch.tensor([1, 2])] = torch.eye(4, 3)[:2]
        torch.testing.assert_close(_d(y), z)
        x = torch.tensor([[1.0, 0, 2], [0, 0, 3]])
        A = sf.to_sparse(x, fill_value=0.0)
        A[sf.to_sparse(x > 0, fill_value=False)] = 5.0
        torch.testing.assert_close(A.to_dense(), torch.where(x > 0, 5.0, x))


@pytest.mark.filterwarnings("ignore::sparsefill.DensifyWarning")
def test_index_errors_as_torch():
    A4 = sf.to_sparse(torch.arange(20.0).reshape(4, 5), fill_value=0.0)
    with pytest.raises(IndexError):
        A4[
            torch.tensor([True, False, True]), torch.tensor([0, 1])
        ]  # the mask's length is not dim 0's
    for bad in (
        lambda t: torch.index_add(t, 0, torch.tensor([-1]), torch.ones(1, 5)),
        lambda t: torch.index_copy(t, 0, torch.tensor([-1]), torch.ones(1, 5)),
        lambda t: torch.index_select(t, 0, torch.tensor([-1])),
    ):
        with pytest.raises(Exception) as dense_err:
            bad(torch.arange(20.0).reshape(4, 5))
        with pytest.raises(type(dense_err.value)):
            bad(A4)
    torch.testing.assert_close(
        A4[torch.tensor([-1])].to_dense(), torch.arange(20.0).reshape(4, 5)[[-1]]
    )
    torch.testing.assert_close(
        torch.index_fill(A4, 0, torch.tensor([-1]), 2.0).to_dense(),
        torch.index_fill(torch.arange(20.0).reshape(4, 5), 0, torch.tensor([-1]), 2.0),
    )
    E = sf.to_sparse(torch.zeros(3, 0), fill_value=0.0)
    for fn in (
        lambda t: torch.max(t, 1),
        lambda t: torch.min(t, 1),
        lambda t: torch.median(t, 1),
        lambda t: torch.argmax(t, 1),
    ):
        with pytest.raises(IndexError):
            fn(E)


@pytest.mark.filterwarnings("ignore::sparsefill.DensifyWarning")
def test_scatter_reduce_max_and_min_names():
    x = torch.tensor([[1.0, 0, 2], [0, 0, 3]])
    A = sf.to_sparse(x, fill_value=0.0)
    idx, src = torch.tensor([[1, 1, 0]]), torch.tensor([[5.0, -1.0, 7.0]])
    for name in ("max", "min"):
        with warnings.catch_warnings():
            warnings.simplefilter("error", sf.DensifyWarning)
            out = torch.scatter_reduce(A, 0, idx, src, name)
        torch.testing.assert_close(out.to_dense(), torch.scatter_reduce(x, 0, idx, src, name))


# ---------------------------------------------------------------- row and column selection (graph subsets)
def _selection_input(kind, fill, shape):
    """``(A, dense)``: a float64 SparseTensor of ``kind`` with ``fill`` (None: indefinite, the dense side NaN
    there) and the dense tensor it stands for; ``uncoalesced``: COO with repeated positions."""
    gen = torch.Generator().manual_seed(len(shape) + sum(shape))
    dd = 1 if kind.endswith("hybrid") else 0
    sparse_shape = shape[: len(shape) - dd]
    keep = torch.rand(sparse_shape, generator=gen) < 0.3
    if (
        kind == "csr-batched"
    ):  # one pattern in every batch (an indefinite fill cannot pad unequal batches)
        keep[:] = keep[0]
    idx = keep.nonzero().T
    vals = torch.randn(
        (idx.shape[1],) + tuple(shape[len(sparse_shape) :]), generator=gen, dtype=F64
    )
    if kind == "uncoalesced":  # every element twice, reversed: halves that sum to the values
        idx, vals = torch.cat([idx, idx.flip(1)], 1), torch.cat([vals / 2, vals.flip(0) / 2])
    A = sparsefill.sparse_coo_tensor(
        idx, vals, shape, fill_value=sparsefill.indefinite if fill is None else fill
    )
    if kind.startswith("csr"):
        A = A.to_sparse_csr()
    dense = A.to_dense(fill_value=float("nan")) if fill is None else A.to_dense()
    return A, dense


SELECTION_KINDS = {
    "coo": (6, 7),
    "csr": (6, 7),
    "coo-hybrid": (6, 7, 2),
    "csr-hybrid": (6, 7, 2),
    "uncoalesced": (6, 7),
    "coo-3d": (4, 5, 6),
    "csr-batched": (3, 4, 5),
    "coo-tall": (5000, 3),
    "coo-wide": (3, 5000),
    "csr-wide": (3, 5000),
}
SELECTION_INDICES = {
    "sorted": [0, 2, 3],
    "unsorted": [2, 0, 1],
    "duplicates": [1, 1, 2, 2],
    "unsorted_duplicates": [2, 0, 2, 1, 0],
    "empty": [],
    "one": [1],
    "last": [-1],
}


def _is_sorted_unique(keys):
    return keys.numel() < 2 or bool((keys[1:] > keys[:-1]).all())


@pytest.mark.parametrize("fill", [0.0, 1.5, None], ids=["fill0", "fill1.5", "indefinite"])
@pytest.mark.parametrize("kind", list(SELECTION_KINDS))
def test_row_and_column_selection_equals_dense(kind, fill):
    """``index_select`` / ``A[idx]`` / ``A[:, idx]`` along every sparse dim (leading: row ranges; others: a
    lookup table, or binary searches along the 5000-wide dims) equal the dense op for sorted, unsorted,
    repeated, empty and int32 indices, and come out coalesced (sorted unique indices) in the input's layout."""
    A, dense = _selection_input(kind, fill, SELECTION_KINDS[kind])
    sd = A.dim() - A.dense_dim()
    for dim in range(sd):
        for name, raw in SELECTION_INDICES.items():
            index = torch.tensor(raw, dtype=torch.long) % A.shape[dim]
            for i in (index, index.to(torch.int32)):
                outs = [A.index_select(dim, i), A[(slice(None),) * dim + (i.long(),)]]
                for out in outs:
                    ref = dense.index_select(dim, i)
                    got = out.to_dense(fill_value=float("nan")) if fill is None else out.to_dense()
                    torch.testing.assert_close(
                        got, ref, equal_nan=True, msg=lambda m: f"{dim} {name}: {m}"
                    )
                    assert out.sparse_layout is A.sparse_layout and out._indefinite == A._indefinite
                    keys = out._keys()
                    assert out._coalesced and _is_sorted_unique(keys), (dim, name)
    with pytest.raises(IndexError):
        A.index_select(sd - 1, torch.tensor([A.shape[sd - 1]]))


def test_selection_of_a_large_graph_matches_an_edge_mask():
    """``A[idx][:, idx]`` on a 2000-node graph with hubs equals the induced subgraph an edge mask gives
    (``torch_geometric.utils.subgraph``'s formula), relabelled to the positions in ``idx``, COO and CSR."""
    gen = torch.Generator().manual_seed(5)
    n = 2000
    src = (torch.rand(30_000, generator=gen) ** 3 * n).long()  # (skewed degrees: hubs)
    dst = torch.randint(n, (30_000,), generator=gen)
    keys = torch.unique(src * n + dst)
    row, col, vals = keys // n, keys % n, torch.randn(keys.numel(), generator=gen, dtype=F64)
    A = sparsefill.sparse_coo_tensor(torch.stack([row, col]), vals, (n, n), fill_value=-1.0)
    idx = torch.randperm(n, generator=gen)[:300]
    lut = torch.full((n,), -1)
    lut[idx] = torch.arange(idx.numel())
    mask = (lut[row] >= 0) & (lut[col] >= 0)
    ref = torch.full((idx.numel(), idx.numel()), -1.0, dtype=F64)
    ref[lut[row[mask]], lut[col[mask]]] = vals[mask]
    for M in (A, A.to_sparse_csr()):
        out = M[idx][:, idx]
        assert out._nse() == int(mask.sum())
        torch.testing.assert_close(out.to_dense(), ref)
        torch.testing.assert_close(M.index_select(0, idx).index_select(1, idx).to_dense(), ref)


SELECTIONS = {
    "rows_unsorted_duplicates": lambda t: t[torch.tensor([3, 0, 3, 1])],
    "rows_negative": lambda t: t[torch.tensor([-1, 0])],
    "columns_unsorted": lambda t: t[:, torch.tensor([4, 0, 2])],
    "index_select0": lambda t: t.index_select(0, torch.tensor([2, 2, 0], dtype=torch.int32)),
    "index_select1_duplicates": lambda t: torch.index_select(t, 1, torch.tensor([4, 1, 4])),
    "subgraph": lambda t: t[torch.tensor([3, 1, 0])][:, torch.tensor([3, 1, 0])],
    "empty": lambda t: t[torch.tensor([], dtype=torch.long)],
}
READS = {
    "to_dense": lambda o: o.to_dense(fill_value=0.0),
    "sum": lambda o: o.sum(),
    "weighted_sum": lambda o: (
        o * torch.arange(1.0, 1.0 + o.numel(), dtype=F64).reshape(o.shape)
    ).sum(),
}


@pytest.mark.parametrize(
    "fill,read",
    [(0.1, "to_dense"), (0.1, "sum"), (None, "to_dense")],  # (indefinite:
    ids=["fill-to_dense", "fill-sum", "indefinite-to_dense"],
)  # to_dense reads the masked sum)
@pytest.mark.parametrize(
    "layout,dd",
    [(torch.sparse_coo, 0), (torch.sparse_csr, 0), (torch.sparse_coo, 1)],
    ids=["coo", "csr", "coo-hybrid"],
)
@pytest.mark.parametrize("name", list(SELECTIONS))
def test_selection_gradcheck_over_values_and_fill(name, layout, dd, fill, read):
    """Row and column selection's backward (a sparse scatter back to the selected coordinates, never
    torch's dense ``new_zeros(A.shape)``) against finite differences over the values and the fill; the
    upstream gradient dense (``to_dense``) or with a nonzero fill (``sum``; stored values: the leaf test)."""

    def fn(v, *f):
        A = sparsefill.sparse_coo_tensor(
            IDX, v, (4, 5) + (2,) * dd, fill_value=f[0] if f else sparsefill.indefinite
        )
        return READS[read](SELECTIONS[name](A if layout is torch.sparse_coo else A.to_sparse_csr()))

    v = torch.tensor([0.3, -1.2, 2.0, 0.7], dtype=F64)
    v = (v[:, None] * torch.tensor([1.0, -0.5], dtype=F64) if dd else v).requires_grad_()
    f = (
        None
        if fill is None
        else torch.tensor(fill, dtype=F64).expand((2,) * dd).clone().requires_grad_()
    )
    inputs = (v,) if f is None else (v, f)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        assert gradcheck(fn, inputs, check_batched_grad=False)


def test_selection_backward_stays_sparse_at_graph_scale():
    """``A[idx][:, idx]`` of a 1M x 1M graph: the backward stores what the forward selected, under a
    densify limit far below ``A``'s dense size (torch's formula allocates ``new_zeros(A.shape)``)."""
    n = 1_000_000
    gen = torch.Generator().manual_seed(7)
    keys = torch.unique(torch.randint(n * n, (20_000,), generator=gen))
    ei = torch.stack([keys // n, keys % n])
    v = torch.randn(keys.numel(), generator=gen, dtype=F64, requires_grad=True)
    idx = torch.cat([ei[0, :50], ei[1, :50]])  # (nodes with edges among them)
    with sparsefill.densify_policy("raise", limit_bytes=1 << 20):
        A = sparsefill.sparse_coo_tensor(ei, v, (n, n), fill_value=0.0, is_coalesced=True)
        S = A[idx][:, idx]
        (g,) = torch.autograd.grad((S * 2.0).sum(), v)
    lut = torch.full((n,), -1)
    lut[idx] = torch.arange(idx.numel())
    count = torch.bincount(idx, minlength=n)
    assert S._nse() == int((count[ei[0]] * count[ei[1]]).sum()) > 0
    torch.testing.assert_close(g, 2.0 * (count[ei[0]] * count[ei[1]]).to(F64))


@pytest.mark.parametrize("read", ["sum", "weighted_sum"])
@pytest.mark.parametrize(
    "layout,dd",
    [(torch.sparse_coo, 0), (torch.sparse_csr, 0), (torch.sparse_coo, 1)],
    ids=["coo", "csr", "coo-hybrid"],
)
def test_selection_gradient_of_a_leaf_equals_dense(layout, dd, read):
    """A SparseTensor leaf's ``.grad`` through every selection form is the dense gradient, exactly (its
    elements stored where the upstream gradient's fill is not 0)."""
    A = sparsefill.to_sparse(
        X[..., 0] if not dd else X[..., :2], fill_value=0.5, layout=layout, dense_dim=dd
    )
    for name, op in SELECTIONS.items():
        L = A.detach().requires_grad_()
        x = A.to_dense().requires_grad_()
        READS[read](op(L)).backward()
        READS[read](op(x)).backward()
        assert isinstance(L.grad, SparseTensor), name
        torch.testing.assert_close(L.grad.to_dense(), x.grad, msg=lambda m: f"{name}: {m}")


def test_selection_backward_route_with_torch_geometric_wrapper_spelling():
    """torch_geometric replaces ``torch.index_select`` by a wrapper that calls torch's function with
    ``out=None``: that spelling takes the sparse backward too."""
    v = torch.tensor([1.0, 2.0, 3.0], dtype=F64, requires_grad=True)
    A = sparsefill.sparse_coo_tensor([[0, 1, 2], [1, 0, 2]], v, (3, 3), fill_value=0.0)
    out = torch._C._VariableFunctions.index_select(A, 0, torch.tensor([2, 2]), out=None)
    assert type(out.grad_fn).__name__ == "SparseIndexSelectBackward"
    (g,) = torch.autograd.grad(out.sum(), v)
    assert g.tolist() == [0.0, 0.0, 2.0]


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
def test_new_dense_tensors_of_a_sparse_tensor_ask_the_byte_limit_first(layout):
    """``A.new_zeros(shape)`` (and new_ones/new_empty/new_full: torch's formulas call them on a gradient, e.g. an
    advanced index's backward) is a dense tensor: under the densify policy's byte limit before it is allocated;
    below it, torch's result (dtype, device, values)."""
    A = sparsefill.sparse_coo_tensor(
        [[0, 1], [1, 0]], torch.tensor([1.0, 2.0], dtype=torch.float64), (2, 2), fill_value=3.0
    ).to_sparse(layout=layout)
    with sparsefill.densify_policy("raise", limit_bytes=4 * 8 * 3 - 1):
        with pytest.raises(sparsefill.DensifyError, match="new_zeros.*96 bytes"):
            A.new_zeros((3, 4))
        with pytest.raises(sparsefill.DensifyError, match="new_full.*96 bytes"):
            A.new_full((3, 4, 1), 7.0)
    with sparsefill.densify_policy("raise", limit_bytes=4 * 8 * 3):
        Z = A.new_zeros((3, 4))
        F = A.new_full((2, 3), 7.0, dtype=torch.float32)
    assert type(Z) is torch.Tensor and Z.dtype == torch.float64 and not Z.any()
    torch.testing.assert_close(F, torch.full((2, 3), 7.0, dtype=torch.float32))


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
def test_advanced_index_backward_under_a_byte_limit(layout):
    """``A[[1, 2]]``'s backward (torch's ``IndexBackward0``: ``grad.new_zeros(A.shape)``) raises DensifyError
    before forming a dense tensor past the limit; with room, the gradients of the values and fill match dense."""
    v = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    f = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    idx = [[0, 1, 2], [1, 0, 2]]
    A = sparsefill.sparse_coo_tensor(idx, v, (3, 3), fill_value=f).to_sparse(layout=layout)
    with sparsefill.densify_policy("raise", limit_bytes=9 * 8 - 1):
        with pytest.raises(sparsefill.DensifyError, match="new_zeros.*72 bytes"):
            A[[1, 2]].sum().backward()
    v.grad = f.grad = None
    w = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    (A[[1, 2]] * w).sum().backward()
    got = (v.grad.clone(), f.grad.clone())
    v.grad = f.grad = None
    (
        sparsefill.sparse_coo_tensor(idx, v, (3, 3), fill_value=f).to_dense()[[1, 2]] * w
    ).sum().backward()
    torch.testing.assert_close(got, (v.grad, f.grad))


SPLITS = {
    "hsplit": lambda t: torch.hsplit(t, 2),
    "vsplit": lambda t: t.vsplit([1, 3]),
    "dsplit": lambda t: torch.dsplit(t, [1]),
    "tensor_split": lambda t: torch.tensor_split(t, 3, dim=1),
    "tensor_split_idx": lambda t: t.tensor_split([1, 5], 0),
}


@pytest.mark.parametrize("kind", ["coo", "csr", "hybrid"])
@pytest.mark.parametrize("name", list(SPLITS))
def test_hsplit_vsplit_dsplit_forward_and_backward_against_dense(name, kind):
    """``hsplit``/``vsplit``/``dsplit``/``tensor_split`` of a SparseTensor requiring grad (routed as ``split``): the
    pieces equal dense, and the gradients of the values and the fill equal dense's with some pieces unused; the
    pieces' gradients joined keep the pattern (a byte limit below the dense form holds)."""
    shape = (4, 4, 2)
    idx = (
        [[0, 1, 3, 3], [1, 0, 2, 3]]
        if kind != "coo"
        else [[0, 1, 3, 3], [1, 0, 2, 3], [0, 1, 1, 0]]
    )
    v = torch.arange(1.0, 9.0 if kind != "coo" else 5.0, dtype=torch.float64)
    v = (v.reshape(4, 2) if kind != "coo" else v).requires_grad_()
    f = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    make = lambda: sparsefill.sparse_coo_tensor(idx, v, shape, fill_value=f)  # noqa: E731
    A = make().to_sparse(layout=torch.sparse_csr) if kind == "csr" else make()
    with sparsefill.densify_policy("raise", limit_bytes=32 * 8 - 1):
        pieces = SPLITS[name](A)
        sum(p.sum() for p in pieces[::2]).backward()  # every other piece has no gradient
    got = v.grad.clone(), f.grad.clone()
    v.grad = f.grad = None
    dense = SPLITS[name](make().to_dense())
    assert len(pieces) == len(dense)
    for p, d in zip(pieces, dense):
        torch.testing.assert_close(p.to_dense(), d)
    sum(d.sum() for d in dense[::2]).backward()
    torch.testing.assert_close(got, (v.grad, f.grad))
    v.grad = f.grad = None
    w = torch.arange(32, dtype=torch.float64).reshape(shape)
    sum(
        (p * q).sum() for p, q in zip(SPLITS[name](A), SPLITS[name](w))
    ).backward()  # dense weights per piece
    got = v.grad.clone(), f.grad.clone()
    v.grad = f.grad = None
    (make().to_dense() * w).sum().backward()
    torch.testing.assert_close(got, (v.grad, f.grad))


def test_hsplit_errors_are_torchs():
    """The routed splits raise torch's errors for bad sections (as on the dense tensor)."""
    A = sparsefill.sparse_coo_tensor(
        [[0, 1], [1, 0]], torch.tensor([1.0, 2.0], requires_grad=True), (2, 3)
    )
    for call in (lambda t: torch.hsplit(t, 2), lambda t: torch.dsplit(t, 1), lambda t: t.vsplit(0)):
        with pytest.raises(RuntimeError) as dense_err:
            call(torch.zeros(2, 3))
        with pytest.raises(RuntimeError, match=re.escape(str(dense_err.value))):
            call(A)


@pytest.mark.parametrize("kind", ["coo", "csr", "hybrid"])
@pytest.mark.parametrize("name", ["a[1:]", "a[:-2, 1:]", "gradient"])
def test_slice_backward_of_a_nonzero_fill_gradient_stores_the_outside(name, kind):
    """A slice's backward with a gradient of nonzero fill (``a[1:].sum()``) keeps that fill and stores the few
    positions outside the slice as zeros where that is cheaper than storing the slice: the gradients of
    ``torch.gradient``'s pieces add up on a small pattern (O(nse), a byte limit of a third of the dense form
    holds); the gradients of the values and the fill equal dense's."""
    shape = (40, 6) if kind != "hybrid" else (40, 6)
    keep = (
        torch.rand(
            shape[:1] if kind == "hybrid" else shape, generator=torch.Generator().manual_seed(2)
        )
        < 0.1
    )
    idx = keep.nonzero().T
    v = torch.linspace(
        -1.0, 2.0, idx.shape[1] * (6 if kind == "hybrid" else 1), dtype=torch.float64
    )
    v = (v.reshape(-1, 6) if kind == "hybrid" else v).requires_grad_()
    f = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    make = lambda: sparsefill.sparse_coo_tensor(idx, v, shape, fill_value=f)  # noqa: E731
    A = make().to_sparse(layout=torch.sparse_csr) if kind == "csr" else make()
    op = {
        "a[1:]": lambda t: (t[1:] * 3).sum(),
        "a[:-2, 1:]": lambda t: t[:-2, 1:].sum(),
        "gradient": lambda t: sum(g.sum() for g in torch.gradient(t, dim=0)),
    }[name]
    with sparsefill.densify_policy("raise", limit_bytes=40 * 6 * 8 // 3):
        (GA,) = torch.autograd.grad(op(A), A, retain_graph=True)
        op(A).backward()
    assert isinstance(GA, SparseTensor) and GA._nse() <= 3 * A._nse() + 2 * 6, (
        GA._nse()
    )  # not every element
    got = v.grad.clone(), f.grad.clone()
    v.grad = f.grad = None
    op(make().to_dense()).backward()
    torch.testing.assert_close(got, (v.grad, f.grad))


def test_repeat_is_a_new_tensor():
    """A write to ``A.repeat(...)`` leaves ``A`` as it is (torch's repeat copies; the pieces it is
    built of here are views)."""
    A = sparsefill.to_sparse(torch.tensor([1.0, 0.0, 2.0]), fill_value=0.0)
    for reps in ((2,), (1,), (2, 1)):
        R = A.repeat(*reps)
        R.copy_(torch.arange(float(R.numel())).reshape(R.shape))
        R.mul_(3)
        assert A.to_dense().tolist() == [1.0, 0.0, 2.0]
        torch.testing.assert_close(
            R.to_dense(), 3 * torch.arange(float(R.numel())).reshape(R.shape)
        )


@pytest.mark.parametrize("dd", (0, 1))
def test_masked_fill_inplace_dense_mask(dd):
    """``A.masked_fill_(mask, v)`` with a dense mask varying along the sparse dims: the True
    elements stored with ``v``, the rest kept (no dense form); torch's errors."""
    x = torch.tensor([[1.0, 0.0, 2.0], [0.0, 0.0, 3.0], [0.0, 0.0, 0.0]])
    masks = (x > 1.5, torch.tensor([[True], [False], [False]]), torch.tensor([True, False, False]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        for mask in masks:
            for value in (5.0, torch.tensor(0.0)):
                A = sparsefill.to_sparse(x, fill_value=torch.zeros(3) if dd else 0.0, dense_dim=dd)
                before = A._nse()
                A.masked_fill_(mask, value)
                torch.testing.assert_close(A.to_dense(), x.masked_fill(mask, value))
                m = mask.expand(x.shape)
                assert A._nse() <= before + int((m.any(-1) if dd else m).sum())
    with pytest.raises(RuntimeError, match="boolean masks"):
        A.masked_fill_(masks[0].long(), 1.0)
    with pytest.raises(RuntimeError, match="0-dimensional"):
        A.masked_fill_(masks[0], torch.tensor([1.0, 2.0]))


@pytest.mark.parametrize("layout,dd", KINDS, ids=IDS)
def test_view_scatters_replace_the_view_in_a_copy(layout, dd):
    """slice_scatter, select_scatter, diagonal_scatter: a copy with the view replaced by ``src``
    (dense, or a SparseTensor: into a dense input too), the input unchanged, as dense."""
    A = sparsefill.to_sparse(X, fill_value=0.5, layout=layout, dense_dim=dd)
    before = A.to_dense().clone()
    cases = [
        (torch.slice_scatter, X[:, 1:4], (1, 1, 4)),
        (torch.slice_scatter, X[::2], (0, 0, None, 2)),
        (torch.select_scatter, X[2], (0, 2)),
        (torch.diagonal_scatter, torch.diagonal(X, 1, 0, 1), (1, 0, 1)),
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        for op, view, rest in cases:
            for src in (view.flip(0) + 1, sparsefill.to_sparse(view.flip(0), fill_value=0.5)):
                out = op(A, src, *rest)
                dense_src = src.to_dense() if isinstance(src, SparseTensor) else src
                torch.testing.assert_close(out.to_dense(), op(X, dense_src, *rest))
                if isinstance(src, SparseTensor):  # (a dense input: a dense copy)
                    torch.testing.assert_close(op(X, src, *rest), op(X, dense_src, *rest))
    torch.testing.assert_close(A.to_dense(), before)
