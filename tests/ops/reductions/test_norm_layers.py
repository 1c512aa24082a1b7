"""Normalization layers of SparseTensors against the dense layers, forward and the gradients of
values and fill: layer_norm, group_norm, instance_norm, batch_norm (training updates the running
statistics exactly, eval), local_response_norm, over dense dims (pattern kept) and sparse dims;
the nn modules; the masked forms (statistics over the masked-in elements only)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from tests.ops.leaves import LAYOUTS, Leaves, check_op

import sparsefill
from sparsefill import SparseTensor

F64, F32 = torch.float64, torch.float32


def _params(C, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(C, generator=g, dtype=dtype), torch.randn(C, generator=g, dtype=dtype)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", (F32, F64))
def test_layer_norm(layout, dtype):
    lv = Leaves((4, 3, 5), layout, dtype=dtype)
    w, b = _params(5, dtype)
    check_op(lambda x: F.layer_norm(x, (5,), w, b, eps=1e-5), lv)
    check_op(lambda x: F.layer_norm(x, (3, 5)), lv)


def test_layer_norm_over_dense_dims_keeps_pattern():
    lv = Leaves((6, 4), "hybrid")
    A = lv.sparse(*lv.leaves())
    out = F.layer_norm(A, (4,))
    assert isinstance(out, SparseTensor) and torch.equal(out.indices(), A.indices())
    torch.testing.assert_close(out.fill_value(), F.layer_norm(A.fill_value(), (4,)))
    with sparsefill.densify_policy("raise", dense_by_nature="raise"):
        F.layer_norm(A, (4,))  # no dense temporary


def test_layer_norm_of_a_view_sees_writes_to_its_base():
    x = torch.randn(4, 5, 3, dtype=F64)
    f = torch.tensor([0.5, -1.0, 2.0], dtype=F64)
    x = torch.where((torch.arange(20).reshape(4, 5) % 3 == 0)[..., None], x, f)
    A = sparsefill.to_sparse(x, fill_value=f, dense_dim=1)
    V = A[1:]
    A.mul_(2.0)  # the view is brought up to date when next read
    torch.testing.assert_close(F.layer_norm(V, (3,)).to_dense(), F.layer_norm(2 * x[1:], (3,)))


def test_norm_over_sparse_dims_is_gated():
    A = Leaves((6, 4), "coo").sparse(*Leaves((6, 4), "coo").leaves())
    with sparsefill.densify_policy(dense_by_nature="raise"):
        with pytest.raises(sparsefill.DensifyError):
            F.layer_norm(A, (4,))  # each row its own mean: every element has its own value
        F.layer_norm(A, (6, 4))  # one slice: the fill maps to one value, the pattern is kept
    assert "dense by nature" in str(sparsefill.explain(F.layer_norm, A, (4,)))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_group_norm(layout):
    lv = Leaves((2, 4, 3), layout)
    w, b = _params(4)
    check_op(lambda x: F.group_norm(x, 2, w, b), lv)


def test_group_norm_sparse_weight():
    lv = Leaves((2, 4, 3), "coo")
    w = sparsefill.to_sparse(torch.tensor([1.0, 0.5, 0.5, 2.0], dtype=F64), fill_value=0.5)
    check_op(lambda x: F.group_norm(x, 2, w), lv)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_instance_norm(layout):
    lv = Leaves((2, 3, 4), layout)
    w, b = _params(3)
    check_op(lambda x: F.instance_norm(x, weight=w, bias=b), lv)


@pytest.mark.parametrize("layout", ("coo", "hybrid", "nan"))
@pytest.mark.parametrize("sparse_stats", (False, True))
def test_instance_norm_running_stats(layout, sparse_stats):
    """Running statistics (dense buffers, or SparseTensors: torch repeats them per sample and
    writes the mean back) updated as the dense call updates them; eval reads them."""
    lv = Leaves((2, 3, 4), layout)
    stats = {}

    def op(x, use_input_stats):
        key = isinstance(x, SparseTensor)
        rm, rv = torch.linspace(-1, 1, 3, dtype=F64), torch.linspace(0.5, 2, 3, dtype=F64)
        if key and sparse_stats:
            rm, rv = (sparsefill.to_sparse(t, fill_value=t[1].item()) for t in (rm, rv))
        out = F.instance_norm(x, rm, rv, use_input_stats=use_input_stats, momentum=0.3)
        stats[key] = tuple(t.to_dense() if isinstance(t, SparseTensor) else t for t in (rm, rv))
        return out

    for use_input_stats in (True, False):
        check_op(lambda x: op(x, use_input_stats), lv)
        torch.testing.assert_close(stats[True], stats[False], equal_nan=True)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("training", (True, False))
def test_batch_norm(layout, training):
    lv = Leaves((5, 3, 2), layout)
    w, b = _params(3)
    stats = {}

    def op(x):
        key = isinstance(x, SparseTensor)
        rm = torch.linspace(-1, 1, 3, dtype=F64)
        rv = torch.linspace(0.5, 2, 3, dtype=F64)
        out = F.batch_norm(x, rm, rv, w, b, training=training, momentum=0.3)
        stats[key] = (rm, rv)
        return out

    check_op(op, lv)
    # the running statistics of the sparse call equal the dense call's
    torch.testing.assert_close(stats[True], stats[False], equal_nan=True)


@pytest.mark.parametrize("layout", ("coo", "csr", "hybrid", "nan"))
def test_nn_modules_take_sparse_inputs(layout):
    lv = Leaves((6, 4), layout)
    for make in (lambda: nn.BatchNorm1d(4), lambda: nn.LayerNorm(4), lambda: nn.GroupNorm(2, 4)):
        torch.manual_seed(0)
        m_s, m_d = make().double(), make().double()
        m_d.load_state_dict(m_s.state_dict())
        check_op(lambda x: (m_s if isinstance(x, SparseTensor) else m_d)(x), lv)
        for k, v in m_s.state_dict().items():
            torch.testing.assert_close(v, m_d.state_dict()[k], msg=k, equal_nan=True)
        m_s.eval(), m_d.eval()
        check_op(lambda x: (m_s if isinstance(x, SparseTensor) else m_d)(x), lv)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("size", (1, 2, 3))
def test_local_response_norm(layout, size):
    check_op(lambda x: F.local_response_norm(x, size, alpha=0.3, k=1.5), Leaves((2, 5, 3), layout))


def test_local_response_norm_dense_channels_keep_pattern():
    lv = Leaves((4, 2, 5), "hybrid")  # (hybrid: the last dim is dense; channels sparse here)
    check_op(lambda x: F.local_response_norm(x, 3), lv)
    A = sparsefill.to_sparse(torch.randn(4, 6, 5, dtype=F64), fill_value=0.0, dense_dim=2)
    out = F.local_response_norm(A, 3)
    assert isinstance(out, SparseTensor) and out._nse() == A._nse()
    torch.testing.assert_close(out.to_dense(), F.local_response_norm(A.to_dense(), 3))


# ---------------------------------------------------------------------- masked forms
def _masked_case(shape=(4, 6), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=F64, requires_grad=True)
    m = torch.rand(shape, generator=g) < 0.6
    m[..., 0] = m[..., 1] = True  # every slice holds two masked-in elements
    return x, m


def _rowwise_reference(x, m, W, eps=1e-5):
    """layer norm of the masked-in elements of each row, and sum(out * W)."""
    out, loss = torch.zeros_like(x), 0
    for i in range(x.shape[0]):
        xi = x[i][m[i]]
        yi = (xi - xi.mean()) / torch.sqrt(xi.var(unbiased=False) + eps)
        out = out.index_put((torch.tensor(i), m[i].nonzero()[:, 0]), yi)
        loss = loss + (yi * W[i][m[i]]).sum()
    return out, loss


@pytest.mark.parametrize("mask_kind", ("dense", "sparse", "pattern"))
def test_masked_layer_norm(mask_kind):
    x, m = _masked_case()
    W = torch.randn(x.shape, dtype=F64)
    ref, loss = _rowwise_reference(x, m, W)
    (gref,) = torch.autograd.grad(loss, x)
    if mask_kind == "pattern":  # an indefinite fill is the mask
        v = x.detach()[m].requires_grad_()
        A = sparsefill.sparse_coo_tensor(
            m.nonzero().T, v, x.shape, fill_value=sparsefill.indefinite
        )
        out = sparsefill.masked.layer_norm(A, (6,))
        assert out.is_fill_indefinite()
        (g,) = torch.autograd.grad((out.to_dense(fill_value=0.0) * W).sum(), v)
        torch.testing.assert_close(out.to_dense(fill_value=0.0), ref)
        torch.testing.assert_close(g, gref[m])
        return
    mask = m if mask_kind == "dense" else sparsefill.to_sparse(m, fill_value=False)
    out = sparsefill.masked.layer_norm(x, (6,), mask=mask)
    torch.testing.assert_close(out, ref)
    (g,) = torch.autograd.grad((out * W).sum(), x)
    torch.testing.assert_close(g, gref)


def test_masked_layer_norm_sparse_input_and_affine():
    x, m = _masked_case()
    w, b = _params(6)
    A = sparsefill.to_sparse(x.detach(), fill_value=0.0)
    out = sparsefill.masked.layer_norm(A, (6,), w, b, mask=m)
    assert isinstance(out, SparseTensor) and out.is_fill_indefinite()
    ref, _ = _rowwise_reference(x.detach(), m, torch.zeros_like(x))
    torch.testing.assert_close(out.to_dense(fill_value=0.0), torch.where(m, ref * w + b, 0.0))


def test_masked_group_instance_batch_norm():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 4, 5, generator=g, dtype=F64, requires_grad=True)
    m = torch.rand(3, 4, 5, generator=g) < 0.6
    m[..., :2] = True
    W = torch.randn(x.shape, generator=g, dtype=F64)

    def check(out, ref_fn):
        ref = torch.zeros_like(x)
        loss = 0
        for sel, y in ref_fn():
            ref = ref.index_put(sel, y)
            loss = loss + (y * W[sel]).sum()
        torch.testing.assert_close(out, ref)
        (g1,) = torch.autograd.grad((out * W).sum(), x)
        (g2,) = torch.autograd.grad(loss, x)
        torch.testing.assert_close(g1, g2)

    def norm(v):
        return (v - v.mean()) / torch.sqrt(v.var(unbiased=False) + 1e-5)

    def per(groups):
        for sel in groups:
            yield sel, norm(x[sel])

    def sel_of(mask3):
        return tuple(mask3.nonzero().T)

    inst = [sel_of(m & _onehot(m.shape, (n, c))) for n in range(3) for c in range(4)]
    check(sparsefill.masked.instance_norm(x, mask=m), lambda: per(inst))
    groups = [
        sel_of(m & _onehot(m.shape, (n, slice(2 * k, 2 * k + 2))))
        for n in range(3)
        for k in range(2)
    ]
    check(sparsefill.masked.group_norm(x, 2, mask=m), lambda: per(groups))
    rm, rv = torch.zeros(4, dtype=F64), torch.ones(4, dtype=F64)
    chans = [sel_of(m & _onehot(m.shape, (slice(None), c))) for c in range(4)]
    check(sparsefill.masked.batch_norm(x, rm, rv, training=True, mask=m), lambda: per(chans))
    means = torch.stack([x.detach()[s].mean() for s in chans])
    varu = torch.stack([x.detach()[s].var(unbiased=True) for s in chans])
    torch.testing.assert_close(rm, 0.1 * means)
    torch.testing.assert_close(rv, 0.9 + 0.1 * varu)


def _onehot(shape, index):
    t = torch.zeros(shape, dtype=torch.bool)
    t[index] = True
    return t


def test_masked_cross_entropy():
    logits = torch.randn(3, 6, dtype=F64, requires_grad=True)
    m = torch.tensor([[1, 1, 0, 0, 1, 0], [0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    target = torch.tensor([4, 2, 0])
    out = sparsefill.masked.cross_entropy(logits, target, mask=m)
    ref = F.cross_entropy(logits.masked_fill(~m, float("-inf")), target)
    torch.testing.assert_close(out, ref)
    (g1,) = torch.autograd.grad(out, logits)
    (g2,) = torch.autograd.grad(ref, logits)
    torch.testing.assert_close(g1, g2)
    with pytest.raises(ValueError, match="not stored"):
        sparsefill.masked.cross_entropy(logits, torch.tensor([3, 2, 0]), mask=m)


def test_masked_local_response_norm_and_nll_loss():
    """The window sums over the masked-in channels only (a masked-out one adds nothing, as a
    zero); nll_loss reads the masked-in log-probabilities; gradients to the masked-in elements."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 5, 3, generator=g, dtype=F64, requires_grad=True)
    m = torch.rand(2, 5, 3, generator=g) < 0.6
    W = torch.randn(x.shape, generator=g, dtype=F64)
    out = sparsefill.masked.local_response_norm(x, 3, alpha=0.3, k=1.5, mask=m)
    ref = torch.where(m, F.local_response_norm(torch.where(m, x, 0.0), 3, alpha=0.3, k=1.5), 0.0)
    torch.testing.assert_close(out, ref)
    (g1,) = torch.autograd.grad((out * W).sum(), x)
    (g2,) = torch.autograd.grad((ref * W).sum(), x)
    torch.testing.assert_close(g1, g2)
    A = sparsefill.to_sparse(x.detach(), fill_value=0.0)
    out = sparsefill.masked.local_response_norm(A, 3, alpha=0.3, k=1.5, mask=m)
    assert out.is_fill_indefinite() and out._nse() == int(m.sum())
    torch.testing.assert_close(out.to_dense(fill_value=0.0), ref.detach())
    logp = torch.log_softmax(torch.randn(3, 6, generator=g, dtype=F64), 1).requires_grad_()
    mc = torch.tensor([[1, 1, 0, 0, 1, 0], [0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]]).bool()
    target = torch.tensor([4, 2, 0])
    w = torch.linspace(0.2, 2.0, 6, dtype=F64)
    for kw in ({}, {"reduction": "none", "weight": w}, {"reduction": "sum", "ignore_index": 2}):
        out = sparsefill.masked.nll_loss(logp, target, mask=mc, **kw)
        ref = F.nll_loss(logp, target, **kw)
        torch.testing.assert_close(out, ref)
        W = torch.randn(ref.shape, generator=g, dtype=F64)
        (g1,) = torch.autograd.grad((out * W).sum(), logp)
        (g2,) = torch.autograd.grad((ref * W).sum(), logp)
        torch.testing.assert_close(g1, g2)
    with pytest.raises(ValueError, match="not stored"):
        sparsefill.masked.nll_loss(logp, torch.tensor([3, 2, 0]), mask=mc)
