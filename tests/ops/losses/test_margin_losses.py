"""Multi-class margin losses of SparseTensor scores against the dense losses, forward and the
gradients of values and fill: ``multi_margin_loss`` (p, margin, weight, every reduction) and
``multilabel_margin_loss`` (targets ending at -1, repeated targets), on every layout, and the
masked form of an indefinite fill (unspecified classes are no candidates: ``-inf`` scores)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.ops.leaves import LAYOUTS, Leaves, check_op

import sparsefill

F64, F32 = torch.float64, torch.float32
W5 = torch.tensor([0.5, 2.0, -1.0, 0.1, 3.0], dtype=F64)
MULTI = {
    "plain": {},
    "p2_sum": {"p": 2, "reduction": "sum"},
    "margin_none": {"margin": -0.3, "reduction": "none"},
    "weight": {"weight": W5},
}
# rows: repeated targets, an early -1 (the rest ignored), no target at all, every class
LABELS = torch.tensor([[4, 4, 1, -1, 2], [0, 2, 3, 1, -1], [-1, 3, 0, 1, 2], [4, 3, 2, 1, 0]])


@pytest.mark.parametrize("kw", sorted(MULTI))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_multi_margin_loss(layout, kw):
    lv = Leaves((4, 5), layout)
    target = torch.tensor([1, 4, 0, 4])[: lv.shape[0]]
    check_op(lambda x: F.multi_margin_loss(x, target, **MULTI[kw]), lv)


@pytest.mark.parametrize("reduction", ("mean", "none"))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_multilabel_margin_loss(layout, reduction):
    lv = Leaves((4, 5), layout)
    target = LABELS[: lv.shape[0]]
    check_op(lambda x: F.multilabel_margin_loss(x, target, reduction=reduction), lv)


def test_margin_losses_one_sample_float32_and_fill_near_targets():
    # one sample (1-D scores), float32; a fill that makes some of the fill's terms positive
    lv = Leaves((6,), "coo", dtype=F32, fill=0.9)
    check_op(lambda x: F.multi_margin_loss(x, torch.tensor([2]), p=2), lv)
    check_op(lambda x: F.multilabel_margin_loss(x, torch.tensor([3, 0, -1, 1, 1, 1])), lv)
    lv = Leaves((3, 6), "coo", dtype=F32, fill=-0.5)
    check_op(lambda x: F.multi_margin_loss(x, torch.tensor([5, 0, 2]), reduction="sum"), lv)


def test_margin_losses_nonfinite_values():
    # torch's kernels count a term only where z > 0: a NaN score contributes nothing
    v = torch.tensor([float("nan"), float("inf"), 1.0, -float("inf")], dtype=F64)
    idx = torch.tensor([[0, 0, 1, 2], [0, 3, 1, 2]])
    for fill in (0.5, float("inf"), float("nan")):
        A = sparsefill.sparse_coo_tensor(idx, v, (3, 4), fill_value=fill)
        D = A.to_dense()
        for fn in (
            lambda x: F.multi_margin_loss(x, torch.tensor([0, 2, 3]), reduction="none"),
            lambda x: F.multilabel_margin_loss(x, torch.tensor([[1, -1, 0, 0]] * 3)),
        ):
            torch.testing.assert_close(fn(A), fn(D), equal_nan=True)


def test_indefinite_scores_are_masked_classes():
    # an indefinite fill: the unspecified classes are no candidates, as -inf scores
    v0 = torch.tensor([0.3, -1.0, 2.0, 0.5, 0.1], dtype=F64)
    idx = torch.tensor([[0, 0, 1, 1, 2], [1, 40, 7, 9, 3]])
    shape = (3, 50)
    w = torch.linspace(-1.0, 2.0, 50, dtype=F64)
    for fn in (
        lambda x: F.multi_margin_loss(x, torch.tensor([40, 9, 3]), reduction="none"),
        lambda x: F.multi_margin_loss(x, torch.tensor([40, 9, 3]), p=2, weight=w),
        lambda x: F.multilabel_margin_loss(
            x, torch.tensor([[1] + [-1] * 49, [7, 9] + [-1] * 48, [3] + [-1] * 49])
        ),
    ):
        v = v0.clone().requires_grad_()
        out = fn(sparsefill.sparse_coo_tensor(idx, v, shape, fill_value=sparsefill.indefinite))
        vd = v0.clone().requires_grad_()
        ref = fn(torch.full(shape, float("-inf"), dtype=F64).index_put(tuple(idx), vd))
        torch.testing.assert_close(out, ref)
        W = torch.randn(ref.shape, dtype=F64)
        (g,) = torch.autograd.grad((out * W).sum(), v)
        (gd,) = torch.autograd.grad((ref * W).sum(), vd)
        torch.testing.assert_close(g, gd)
    A = sparsefill.sparse_coo_tensor(idx, v0, shape, fill_value=sparsefill.indefinite)
    with pytest.raises(ValueError, match="not stored"):
        F.multi_margin_loss(A, torch.tensor([2, 9, 3]))


def test_margin_loss_errors():
    A = sparsefill.to_sparse(torch.randn(3, 4), fill_value=0.0)
    with pytest.raises(RuntimeError, match="target out of range"):
        F.multi_margin_loss(A, torch.tensor([0, 4, 1]))
    with pytest.raises(RuntimeError, match="out of range"):
        F.multilabel_margin_loss(A, torch.tensor([[0, 4, -1, 0]] * 3))
    with pytest.raises(ValueError, match="p == 1 and p == 2"):
        F.multi_margin_loss(A, torch.tensor([0, 1, 1]), p=3)
