"""``F.pad`` of SparseTensors against the dense pad, forward and the gradients of values and fill:
constant (a value equal to the fill keeps the pattern, shifted; another value stores the border),
reflect, replicate and circular, over sparse and dense dims, with negative pads cropping."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from tests.ops.leaves import LAYOUTS, Leaves, check_op

import sparsefill

CONSTANT_PADS = [(1, 2), (0, 0, 2, 1), (-1, 2, 1, 0), (1, 1, 1, 1, 1, 1)]


@pytest.mark.parametrize("pad", CONSTANT_PADS, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("value", (0.25, 1.5))
def test_constant_pad(layout, pad, value):
    lv = Leaves((3, 4, 2), layout)
    check_op(lambda x: F.pad(x, pad, value=value), lv)


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64))
def test_constant_pad_value_equal_to_fill_keeps_pattern(dtype):
    A = sparsefill.sparse_coo_tensor([[0, 2], [1, 0]], [1.0, 2.0], (3, 2), fill_value=0.5)
    A = A.to(dtype)
    out = F.pad(A, (1, 0, 2, 3), value=0.5)
    assert isinstance(out, sparsefill.SparseTensor) and out._nse() == 2
    assert out.indices().tolist() == [[2, 4], [2, 1]]
    torch.testing.assert_close(out.to_dense(), F.pad(A.to_dense(), (1, 0, 2, 3), value=0.5))
    border = F.pad(A, (1, 0, 2, 3), value=7.0)  # the border stored: 8 x 3 - 3 x 2 elements
    assert border._nse() == 2 + 8 * 3 - 3 * 2
    torch.testing.assert_close(border.to_dense(), F.pad(A.to_dense(), (1, 0, 2, 3), value=7.0))


def test_constant_pad_indefinite():
    v = torch.tensor([1.0, 2.0], requires_grad=True)
    A = sparsefill.sparse_coo_tensor([[0, 1], [1, 0]], v, (2, 2), fill_value=sparsefill.indefinite)
    out = F.pad(A, (1, 1), value=3.0)  # the border is defined (3): stored; the rest stays masked
    assert out.is_fill_indefinite() and out._nse() == 2 + 4
    ref = torch.tensor([[3.0, 0.0, 1.0, 3.0], [3.0, 2.0, 0.0, 3.0]])
    torch.testing.assert_close(out.to_dense(fill_value=0.0), ref)
    out.values().sum().backward()
    torch.testing.assert_close(v.grad, torch.ones(2))


def test_constant_pad_border_under_policy():
    A = sparsefill.sparse_coo_tensor([[0]], [1.0], (1000,), fill_value=0.0)
    with sparsefill.densify_policy(dense_by_nature="raise"):
        F.pad(A, (2, 2), value=0.0)  # no border stored: fine
        with pytest.raises(sparsefill.DensifyError):
            F.pad(A, (2, 2), value=1.0)
    assert "dense by nature" in str(sparsefill.explain(F.pad, A, (2, 2), value=1.0))


@pytest.mark.parametrize("mode", ("reflect", "replicate", "circular"))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pad", [(1, 2), (2, 1, 1, 2)], ids=str)
def test_index_pads(mode, layout, pad):
    lv = Leaves((2, 4, 3), layout)
    check_op(lambda x: F.pad(x, pad, mode=mode), lv)


def test_replicate_negative_and_3d():
    check_op(lambda x: F.pad(x, (-1, 2, 1, -1), mode="replicate"), Leaves((2, 4, 3), "coo"))
    check_op(lambda x: F.pad(x, (1, 1, 1, 0, 0, 1), mode="reflect"), Leaves((1, 3, 3, 2), "coo"))
    check_op(lambda x: F.pad(x, (1, 1, 2, 0), mode="replicate"), Leaves((2, 3, 3, 2), "hybrid"))


def test_reflect_keeps_fill_and_copies_stored():
    A = sparsefill.sparse_coo_tensor([[0], [1]], [5.0], (1, 4), fill_value=-1.0)
    out = F.pad(A, (2, 2), mode="reflect")
    assert (
        out.fill_value().item() == -1.0 and out._nse() == 3
    )  # position 1 and its mirrors (1, 3, 7)
    torch.testing.assert_close(out.to_dense(), F.pad(A.to_dense(), (2, 2), mode="reflect"))


def test_pad_errors_as_torch():
    A = sparsefill.sparse_coo_tensor([[0]], [1.0], (3,), fill_value=0.0)
    with pytest.raises(NotImplementedError):
        F.pad(A, (1, 1), mode="reflect")  # 1-d input: torch's error
    B = sparsefill.to_sparse(torch.zeros(1, 2), fill_value=0.0)
    with pytest.raises(RuntimeError):
        F.pad(B, (3, 0), mode="reflect")  # pad >= size


UPSTREAM_CASES = [
    (mode, pad)
    for mode in ("reflect", "replicate", "circular")
    for pad in [(1, 2), (2, 1, 1, 2), (-1, 2, 1, 0)]
    if mode != "reflect" or min(pad) >= 0  # (reflect takes no negative pad)
]


@pytest.mark.parametrize("mode,pad", UPSTREAM_CASES, ids=[f"{m}-{p}" for m, p in UPSTREAM_CASES])
@pytest.mark.parametrize("layout", ("coo", "hybrid", "uncoalesced", "nan"))
def test_index_pad_sparse_upstream_gradient(mode, layout, pad):
    # a SparseTensor upstream gradient (of sum, of a square): the gradient stays sparse, the
    # band where positions are read twice stored (fill != 0)
    lv = Leaves((2, 4, 3), layout)
    for loss in (lambda y: y.sum(), lambda y: (y * y).sum()):
        v, f = lv.leaves()
        A = lv.sparse(v, f)
        with warnings.catch_warnings():
            warnings.simplefilter("error", sparsefill.DensifyWarning)
            loss(F.pad(A, pad, mode=mode)).backward()
        dv, df = lv.leaves()
        loss(F.pad(lv.dense(dv, df), pad, mode=mode)).backward()
        torch.testing.assert_close(v.grad, dv.grad, equal_nan=True)
        torch.testing.assert_close(f.grad, df.grad, equal_nan=True)


@pytest.mark.parametrize("pad", [(-1, 2), (2, -1, -1, 1), (-2, -1), (4, 4)], ids=str)
@pytest.mark.parametrize("layout", ("coo", "hybrid", "nan"))
def test_circular_wraps_the_cropped_input(layout, pad):
    # negative pads crop first; the positive ones wrap around what is left, as torch does
    check_op(lambda x: F.pad(x, pad, mode="circular"), Leaves((2, 4, 3), layout))


def test_circular_keeps_pattern_and_3d():
    A = sparsefill.sparse_coo_tensor(
        [[0, 0], [1, 2], [3, 0]], [1.0, 2.0], (1, 3, 4), fill_value=-1.0
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        with sparsefill.densify_policy(dense_by_nature="raise"):
            out = F.pad(A, (1, 2, 1, 0), mode="circular")
    assert isinstance(out, sparsefill.SparseTensor) and out.fill_value().item() == -1.0
    # each stored element copied to every position reading it: columns 3 and 0 are read twice,
    # row 2 twice (rows 0 and 3), row 1 once
    assert out._nse() == 2 * 2 + 1 * 2
    torch.testing.assert_close(out.to_dense(), F.pad(A.to_dense(), (1, 2, 1, 0), mode="circular"))
    assert "route" in str(sparsefill.explain(F.pad, A, (1, 1), mode="circular"))
    check_op(lambda x: F.pad(x, (1, 0, 0, 1, 1, 1), mode="circular"), Leaves((1, 2, 3, 2), "coo"))
    with torch.no_grad():  # (routed in every grad mode)
        out = torch.nn.CircularPad1d(2)(A)
    torch.testing.assert_close(out.to_dense(), F.pad(A.to_dense(), (2, 2), mode="circular"))


def test_circular_errors():
    A = sparsefill.sparse_coo_tensor([[0, 0], [1, 2]], [1.0, 2.0], (2, 3), fill_value=0.0)
    with pytest.raises(RuntimeError, match="more than once"):
        F.pad(A, (4, 0), mode="circular")
    with pytest.raises(NotImplementedError):
        F.pad(A, (1, 1, 1, 1), mode="circular")  # 2-d input, two dims padded: torch's error
    with pytest.raises(ValueError, match="nothing to wrap"):
        F.pad(A, (-3, 2), mode="circular")  # (torch reads uninitialized memory there)


@pytest.mark.parametrize("mode", ("reflect", "replicate", "circular"))
def test_index_pads_of_a_masked_tensor(mode):
    # an indefinite fill: the copies of stored elements are specified, the rest stays masked out;
    # the gradient reaches the stored values from every copy
    v = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    idx = torch.tensor([[0, 0, 1], [0, 2, 3]])
    A = sparsefill.sparse_coo_tensor(idx, v, (2, 4), fill_value=sparsefill.indefinite)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        out = F.pad(A.unsqueeze(0), (2, 1), mode=mode)
        assert out.is_fill_indefinite()
        D = torch.zeros(2, 4).index_put(tuple(idx), v)
        M = torch.zeros(2, 4).index_put(tuple(idx), torch.tensor(1.0))
        ref = F.pad(D[None], (2, 1), mode=mode)
        mask = F.pad(M[None], (2, 1), mode=mode).bool()
        torch.testing.assert_close(out.to_dense(fill_value=0.0), torch.where(mask, ref, 0.0))
        W = torch.randn(ref.shape, generator=torch.Generator().manual_seed(0))
        (g,) = torch.autograd.grad((out.to_dense(fill_value=0.0) * W).sum(), v)
        (gd,) = torch.autograd.grad((ref * W * mask).sum(), v)
    torch.testing.assert_close(g, gd)
