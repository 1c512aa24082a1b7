"""Losses of SparseTensors against the dense losses, forward and the gradients of values and fill:
element-wise losses against a dense or SparseTensor target (every reduction), nll_loss and
cross_entropy over sparse logits (weights, ignore_index, label smoothing), and the sampled softmax
of logits with an indefinite fill."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.ops.leaves import LAYOUTS, Leaves, check_op

import sparsefill

F64, F32 = torch.float64, torch.float32
REDUCTIONS = ("mean", "sum", "none")


def _target(shape, dtype, sparse, kind="real"):
    g = torch.Generator().manual_seed(5)
    t = torch.rand(shape, generator=g, dtype=dtype)
    if kind == "sign":
        t = torch.where(t < 0.5, -1.0, 1.0).to(dtype)
    if not sparse:
        return t
    t[torch.rand(shape, generator=g) < 0.5] = t.reshape(-1)[0] if t.numel() else 0.0
    return sparsefill.to_sparse(t, fill_value=t.reshape(-1)[0] if t.numel() else 0.0)


ELEMENTWISE = {
    "mse_loss": (lambda x, t, r: F.mse_loss(x, t, reduction=r), "real"),
    "l1_loss": (lambda x, t, r: F.l1_loss(x, t, reduction=r), "real"),
    "smooth_l1_loss": (lambda x, t, r: F.smooth_l1_loss(x, t, reduction=r, beta=0.5), "real"),
    "huber_loss": (lambda x, t, r: F.huber_loss(x, t, reduction=r, delta=0.7), "real"),
    "soft_margin_loss": (lambda x, t, r: F.soft_margin_loss(x, t, reduction=r), "sign"),
    "bce_with_logits": (
        lambda x, t, r: F.binary_cross_entropy_with_logits(
            x, t, reduction=r, pos_weight=torch.full(x.shape[-1:], 1.5, dtype=x.dtype)
        ),
        "real",
    ),
    "binary_cross_entropy": (
        lambda x, t, r: F.binary_cross_entropy(torch.sigmoid(x), t, reduction=r),
        "real",
    ),
}


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_elementwise_loss_dense_target(name, layout, reduction):
    fn, kind = ELEMENTWISE[name]
    lv = Leaves((4, 3), layout)
    t = _target(lv.shape, F64, sparse=False, kind=kind)
    if name == "binary_cross_entropy" and layout == "nan":  # NaN is out of [0, 1]: both raise
        for x in (lv.sparse(*lv.leaves()), lv.dense(*lv.leaves())):
            with pytest.raises(RuntimeError, match="between 0 and 1"):
                fn(x, t, reduction)
        return
    check_op(lambda x: fn(x, t, reduction), lv)


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
@pytest.mark.parametrize("dtype", (F32, F64))
def test_elementwise_loss_sparse_target(name, dtype):
    fn, kind = ELEMENTWISE[name]
    lv = Leaves((5, 4), "coo", dtype=dtype)
    t = _target(lv.shape, dtype, sparse=True, kind=kind)
    for reduction in REDUCTIONS:
        check_op(lambda x: fn(x, t, reduction), lv)


def test_sparse_pair_stays_sparse_and_closed_form():
    # both operands sparse: the unreduced loss keeps the union pattern, the sum folds the fills
    A = sparsefill.sparse_coo_tensor([[0, 2]], [1.0, 3.0], (1000,), fill_value=0.5)
    B = sparsefill.sparse_coo_tensor([[2, 7]], [1.0, 1.0], (1000,), fill_value=0.0)
    out = F.mse_loss(A, B, reduction="none")
    assert isinstance(out, sparsefill.SparseTensor) and out._nse() == 3
    assert out.fill_value().item() == 0.25
    torch.testing.assert_close(F.mse_loss(A, B), F.mse_loss(A.to_dense(), B.to_dense()))


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_indefinite_loss_is_masked(name, reduction):
    # an indefinite input is a mask: the loss of the stored elements, reduced over them only
    fn, kind = ELEMENTWISE[name]
    v = torch.tensor([0.2, -1.0, 3.0], dtype=F64, requires_grad=True)
    idx = torch.tensor([[0, 1, 3], [1, 0, 2]])
    A = sparsefill.sparse_coo_tensor(idx, v, (4, 3), fill_value=sparsefill.indefinite)
    t = _target((4, 3), F64, sparse=False, kind=kind)
    out = fn(A, t, reduction)
    vd = v.detach().clone().requires_grad_()
    ref = fn(vd[None], t[tuple(idx)][None], reduction)  # (pos_weight broadcasts over 3 too)
    if reduction == "none":
        assert out.is_fill_indefinite() and torch.equal(out.indices(), idx)
        out, ref = out.values(), ref[0]
    torch.testing.assert_close(out, ref)
    W = torch.randn(ref.shape, dtype=F64)
    (g,) = torch.autograd.grad((out * W).sum(), v)
    (gd,) = torch.autograd.grad((ref * W).sum(), vd)
    torch.testing.assert_close(g, gd)


def test_binary_cross_entropy_range_error():
    A = sparsefill.sparse_coo_tensor([[0]], [1.5], (3,), fill_value=0.5)
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        F.binary_cross_entropy(A, torch.full((3,), 0.5))
    B = sparsefill.sparse_coo_tensor([[0, 1, 2]], [0.1, 0.2, 0.3], (3,), fill_value=float("nan"))
    F.binary_cross_entropy(B, torch.full((3,), 0.5))  # the NaN fill holds nowhere: no error


NLL = {
    "plain": {},
    "sum": {"reduction": "sum"},
    "none": {"reduction": "none"},
    "ignore": {"ignore_index": 2},
    "weight": {"weight": torch.tensor([0.5, 1.0, 2.0, 0.1, 0.7], dtype=F64)},
    "weight_ignore_none": {
        "weight": torch.tensor([0.5, 1.0, 2.0, 0.1, 0.7], dtype=F64),
        "ignore_index": 1,
        "reduction": "none",
    },
    "smoothing": {"label_smoothing": 0.2},
    "smoothing_ignore_weight": {
        "label_smoothing": 0.3,
        "ignore_index": 2,
        "weight": torch.tensor([0.5, 1.0, 2.0, 0.1, 0.7], dtype=F64),
    },
    "smoothing_none": {"label_smoothing": 0.1, "reduction": "none", "ignore_index": 0},
    "smoothing_sum": {"label_smoothing": 0.1, "reduction": "sum"},
}


NLL_CASES = [(loss, kw) for loss in ("cross_entropy", "nll_loss") for kw in sorted(NLL)]
# (nll_loss takes no label_smoothing)
NLL_CASES = [(loss, kw) for loss, kw in NLL_CASES if loss != "nll_loss" or "smoothing" not in kw]


@pytest.mark.parametrize("loss,kw", NLL_CASES, ids=[f"{a}-{b}" for a, b in NLL_CASES])
@pytest.mark.parametrize("layout", ("coo", "csr", "hybrid", "uncoalesced", "nan"))
def test_nll_and_cross_entropy(loss, layout, kw):
    lv = Leaves((4, 5), layout)
    target = torch.tensor([1, 2, 0, 4])
    fn = getattr(F, loss)
    kwargs = NLL[kw]
    check_op(lambda x: fn(x, target, **kwargs), lv)


def test_nll_loss_spatial_and_float32():
    lv = Leaves((2, 3, 4), "coo", dtype=F32)
    target = torch.tensor([[0, 2, 1, 1], [2, 2, 0, 1]])
    check_op(lambda x: F.cross_entropy(x, target), lv)
    check_op(lambda x: F.nll_loss(x, target, reduction="none"), Leaves((2, 3, 4), "hybrid"))


def test_nll_loss_errors():
    A = sparsefill.to_sparse(torch.randn(3, 4), fill_value=0.0)
    with pytest.raises(IndexError, match="Target 4 is out of bounds"):
        F.nll_loss(A, torch.tensor([0, 4, 1]))
    with pytest.raises((ValueError, RuntimeError)):
        F.nll_loss(A, torch.tensor([0, 1]))


def _sampled(n_rows=3, n_classes=50):
    g = torch.Generator().manual_seed(3)
    idx = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2], [3, 7, 40, 7, 9, 0, 1, 2, 49]])
    v = torch.randn(idx.shape[1], generator=g, dtype=F64)
    return idx, v, (n_rows, n_classes)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"reduction": "sum"},
        {"reduction": "none"},
        {"ignore_index": 9},
        {"weight": torch.linspace(0.1, 2.0, 50, dtype=F64)},
        {"label_smoothing": 0.1},
    ],
    ids=["mean", "sum", "none", "ignore", "weight", "smoothing"],
)
def test_sampled_softmax_cross_entropy(kw):
    # an indefinite fill: the classes not stored are no candidates, as -inf logits would be
    # (label smoothing: torch's formula, the candidates' log-probabilities summed and divided by
    # the number of classes C, as the composite computes it on the masked log-softmax)
    idx, v0, shape = _sampled()
    target = torch.tensor([40, 9, 2])
    v = v0.clone().requires_grad_()
    A = sparsefill.sparse_coo_tensor(idx, v, shape, fill_value=sparsefill.indefinite)
    out = F.cross_entropy(A, target, **kw)
    vd = v0.clone().requires_grad_()
    D = torch.full(shape, float("-inf"), dtype=F64).index_put(tuple(idx), vd)
    if "label_smoothing" in kw:
        logp = torch.log_softmax(D, 1)
        nll = F.nll_loss(logp, target)
        stored = torch.zeros(shape, dtype=torch.bool).index_put(tuple(idx), torch.tensor(True))
        smooth = -torch.where(stored, logp, 0).sum(1).mean() / shape[1]
        ref = (1 - kw["label_smoothing"]) * nll + kw["label_smoothing"] * smooth
    else:
        ref = F.cross_entropy(D, target, **kw)
    torch.testing.assert_close(out, ref)
    W = torch.randn(ref.shape, dtype=F64)
    (g,) = torch.autograd.grad((out * W).sum(), v)
    (gd,) = torch.autograd.grad((ref * W).sum(), vd)
    torch.testing.assert_close(g, gd)


def test_sampled_softmax_target_not_stored():
    idx, v, shape = _sampled()
    A = sparsefill.sparse_coo_tensor(idx, v, shape, fill_value=sparsefill.indefinite)
    with pytest.raises(ValueError, match="not stored in the logits"):
        F.cross_entropy(A, torch.tensor([40, 8, 2]))


POISSON = {
    "log_input": {},
    "full_sum": {"full": True, "reduction": "sum"},
    "rate_full_none": {"log_input": False, "full": True, "reduction": "none"},
}


@pytest.mark.parametrize("kw", sorted(POISSON))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_poisson_nll_loss(layout, kw):
    # (the Stirling term of full=True applies where the target exceeds 1)
    lv = Leaves((4, 3), layout, fill=0.4)
    t = 3 * _target(lv.shape, F64, sparse=False)
    fn = lambda x: F.poisson_nll_loss(x.abs() if "rate" in kw else x, t, **POISSON[kw])  # noqa: E731
    check_op(fn, lv)


@pytest.mark.parametrize("dtype", (F32, F64))
def test_poisson_nll_loss_sparse_target_and_aten_call(dtype):
    lv = Leaves((5, 4), "coo", dtype=dtype)
    t = _target(lv.shape, dtype, sparse=True)
    t = sparsefill.sparse_coo_tensor(t.indices(), 3 * t.values(), t.shape, fill_value=2.5)
    check_op(lambda x: F.poisson_nll_loss(x, t, full=True), lv)
    check_op(lambda x: torch.poisson_nll_loss(x, t, True, True, 1e-8, 0), lv)


@pytest.mark.parametrize("reduction", ("mean", "none"))
def test_poisson_nll_loss_indefinite_is_masked(reduction):
    v0 = torch.tensor([0.2, -1.0, 3.0], dtype=F64)
    idx = torch.tensor([[0, 1, 3], [1, 0, 2]])
    t = 3 * _target((4, 3), F64, sparse=False)
    v, vd = v0.clone().requires_grad_(), v0.clone().requires_grad_()
    A = sparsefill.sparse_coo_tensor(idx, v, (4, 3), fill_value=sparsefill.indefinite)
    out = F.poisson_nll_loss(A, t, full=True, reduction=reduction)
    ref = F.poisson_nll_loss(vd, t[tuple(idx)], full=True, reduction=reduction)
    if reduction == "none":
        out = out.values()
    torch.testing.assert_close(out, ref)
    W = torch.randn(ref.shape, dtype=F64)
    torch.testing.assert_close(
        *torch.autograd.grad((out * W).sum(), v), *torch.autograd.grad((ref * W).sum(), vd)
    )
