"""Sparse optimizers: Caffe2's sequential rule against a Python loop, the coalesced rule against dense
torch.optim.Adagrad in a training loop, FTRL against its formula, errors that modify nothing."""

import math

import pytest
import torch
from torch.testing import assert_close

from sparsefill import segment


def _data(seed=0, rows=6, D=3, K=9):
    g = torch.Generator().manual_seed(seed)
    param = torch.randn(rows, D, generator=g, dtype=torch.float64)
    idx = torch.tensor([4, 1, 4, 0, 4, 1, 5, 2, 0])[:K]
    grad = torch.randn(K, D, generator=g, dtype=torch.float64)
    return param, idx, grad


def loop_adagrad(param, moment, idx, grad, lr, eps, wd, decay, rowwise=False):
    p, h = param.clone(), moment.clone()
    for i, r in enumerate(idx.tolist()):  # Caffe2: in order, one index at a time
        gi = grad[i] + wd * p[r]
        if rowwise:
            h[r] = h[r] + (gi * gi).mean()
            p[r] = p[r] - lr * gi / (math.sqrt(h[r]) + eps)
        else:
            h[r] = h[r] * decay + gi * gi
            p[r] = p[r] - lr * gi / (h[r].sqrt() + eps)
    return p, h


def loop_ftrl(param, n, z, idx, grad, alpha, beta, l1, l2):
    p, n, z = param.clone(), n.clone(), z.clone()
    for i, r in enumerate(idx.tolist()):
        for j in range(p.shape[1]):
            g = grad[i, j].item()
            nn = n[r, j].item() + g * g
            sigma = (math.sqrt(nn) - math.sqrt(n[r, j].item())) / alpha
            zz = z[r, j].item() + g - sigma * p[r, j].item()
            n[r, j], z[r, j] = nn, zz
            p[r, j] = (
                ((math.copysign(l1, zz) - zz) / ((beta + math.sqrt(nn)) / alpha + l2))
                if abs(zz) > l1
                else 0.0
            )
    return p, n, z


@pytest.mark.parametrize("wd,decay", [(0.0, 1.0), (0.1, 0.9)])
def test_sparse_adagrad_sequential_matches_caffe2_loop(wd, decay):
    param, idx, grad = _data()
    moment = torch.rand_like(param)
    ep, eh = loop_adagrad(param, moment, idx, grad, 0.1, 1e-5, wd, decay)
    segment.sparse_adagrad(param, moment, idx, grad, lr=0.1, weight_decay=wd, decay=decay)
    assert_close(param, ep)
    assert_close(moment, eh)


def test_rowwise_sequential_matches_caffe2_loop():
    param, idx, grad = _data(1)
    moment = torch.rand(param.shape[0], dtype=torch.float64)
    ep, eh = loop_adagrad(param, moment, idx, grad, 0.05, 1e-5, 0.01, 1.0, rowwise=True)
    segment.rowwise_sparse_adagrad(param, moment, idx, grad, lr=0.05, weight_decay=0.01)
    assert_close(param, ep)
    assert_close(moment, eh)


@pytest.mark.parametrize("mode", ["sequential", "coalesced"])
def test_ftrl(mode):
    param, idx, grad = _data(2)
    n, z = torch.rand_like(param), torch.randn_like(param)
    if mode == "coalesced":
        rows, inv = torch.unique(idx, return_inverse=True)
        g2 = torch.zeros(rows.numel(), 3, dtype=torch.float64).index_add_(0, inv, grad)
        ep, en, ez = loop_ftrl(param, n, z, rows, g2, 0.1, 1.0, 0.05, 0.01)
    else:
        ep, en, ez = loop_ftrl(param, n, z, idx, grad, 0.1, 1.0, 0.05, 0.01)
    segment.sparse_ftrl(
        param, n, z, idx, grad, alpha=0.1, beta=1.0, lambda1=0.05, lambda2=0.01, mode=mode
    )
    assert_close(param, ep)
    assert_close(n, en)
    assert_close(z, ez)


def test_coalesced_equals_dense_adagrad_on_touched_rows():
    param, idx, grad = _data(3)
    dense_grad = torch.zeros_like(param).index_add_(0, idx, grad)
    ref = param.clone().requires_grad_()
    opt = torch.optim.Adagrad([ref], lr=0.1, eps=1e-10)
    ref.grad = dense_grad
    opt.step()
    moment = torch.zeros_like(param)
    segment.sparse_adagrad(param, moment, idx, grad, lr=0.1, eps=1e-10, mode="coalesced")
    assert_close(param, ref.detach())


@pytest.mark.parametrize("reducer", ["sum", "mean", "weighted_sum"])
def test_training_loop_sparse_vs_dense_adagrad(reducer):
    """A model: pooled embedding lookups -> linear -> MSE.  SparseAdagrad on sparse gradients equals
    torch.optim.Adagrad on dense gradients (rows never touched stay as they were in both)."""
    g = torch.Generator().manual_seed(0)
    table0 = torch.randn(50, 8, generator=g, dtype=torch.float64)
    head0 = torch.randn(8, 1, generator=g, dtype=torch.float64)
    sp_table = table0.clone().requires_grad_()
    de_table = table0.clone().requires_grad_()
    sp_head, de_head = head0.clone().requires_grad_(), head0.clone().requires_grad_()
    sp_opt = segment.SparseAdagrad([sp_table], lr=0.05)
    sp_head_opt = torch.optim.Adagrad([sp_head], lr=0.05)
    de_opt = torch.optim.Adagrad([de_table, de_head], lr=0.05)
    for step in range(6):
        lengths = torch.randint(0, 5, (7,), generator=g)
        n = int(lengths.sum())
        idx = torch.randint(0, 30, (n,), generator=g)  # rows 30..49 are never looked up
        w = torch.rand(n, generator=g, dtype=torch.float64) if reducer == "weighted_sum" else None
        target = torch.randn(7, 1, generator=g, dtype=torch.float64)
        for table, head, opts, sparse in (
            (sp_table, sp_head, (sp_opt, sp_head_opt), True),
            (de_table, de_head, (de_opt,), False),
        ):
            for o in opts:
                o.zero_grad()
            pooled = segment.reduce(
                table, reducer, lengths=lengths, indices=idx, weights=w, sparse_grad=sparse
            )
            loss = ((pooled @ head - target) ** 2).mean()
            loss.backward()
            if sparse:
                assert sp_table.grad.is_sparse
            for o in opts:
                o.step()
    assert_close(sp_table.detach(), de_table.detach())
    assert_close(sp_head.detach(), de_head.detach())
    assert torch.equal(sp_table.detach()[30:], table0[30:])


def test_sparse_grad_equals_dense_grad():
    g = torch.Generator().manual_seed(4)
    table = torch.randn(6, 2, generator=g, dtype=torch.float64)
    idx = torch.tensor([1, 1, 4, 0, 1])
    a, b = table.clone().requires_grad_(), table.clone().requires_grad_()
    segment.reduce(
        a, "max", lengths=torch.tensor([3, 2]), indices=idx, sparse_grad=True
    ).sum().backward()
    segment.reduce(b, "max", lengths=torch.tensor([3, 2]), indices=idx).sum().backward()
    assert a.grad.is_sparse
    assert_close(a.grad.to_dense(), b.grad)
    with pytest.raises(ValueError, match="sparse_grad=True needs indices="):
        segment.reduce(a, "sum", lengths=torch.tensor([6]), sparse_grad=True)


def test_sparse_ftrl_optimizer_runs_and_dense_grad():
    p = torch.nn.Parameter(torch.randn(5, 2, dtype=torch.float64))
    opt = segment.SparseFtrl([p], alpha=0.1, beta=1.0, lambda1=0.01, lambda2=0.0)
    p.grad = torch.randn(5, 2, dtype=torch.float64)
    n0, z0 = torch.zeros(5, 2, dtype=torch.float64), torch.zeros(5, 2, dtype=torch.float64)
    ep, _, _ = loop_ftrl(p.detach(), n0, z0, torch.arange(5), p.grad, 0.1, 1.0, 0.01, 0.0)
    opt.step()
    assert_close(p.detach(), ep)


def test_errors_modify_nothing():
    param, idx, grad = _data()
    moment = torch.zeros_like(param)
    before = param.clone(), moment.clone()
    with pytest.raises(IndexError, match=r"indices\[1\] = 6 is out of range for 6 rows of param"):
        segment.sparse_adagrad(param, moment, torch.tensor([0, 6]), grad[:2], lr=0.1)
    with pytest.raises(ValueError, match=r"grad must have shape \(9, 3\)"):
        segment.sparse_adagrad(param, moment, idx, grad[:4], lr=0.1)
    with pytest.raises(ValueError, match=r"moment must have shape \(6,\)"):
        segment.rowwise_sparse_adagrad(param, moment, idx, grad, lr=0.1)
    with pytest.raises(ValueError, match="mode must be"):
        segment.sparse_adagrad(param, moment, idx, grad, lr=0.1, mode="fast")
    with pytest.raises(TypeError, match="grad must have the dtype of param"):
        segment.sparse_adagrad(param, moment, idx, grad.float(), lr=0.1)
    assert torch.equal(param, before[0]) and torch.equal(moment, before[1])


@pytest.mark.parametrize("mode", ["sequential", "coalesced"])
@pytest.mark.parametrize("rowwise", [False, True])
def test_sparse_adagrad_optimizer_with_a_sparse_gradient(rowwise, mode):
    """The wrapper on an uncoalesced sparse gradient (duplicate rows) equals the functional form on its
    (indices, rows): Caffe2's loop for "sequential", the summed rows for "coalesced"."""
    param, idx, grad = _data(5)
    p = torch.nn.Parameter(param.clone())
    p.grad = torch.sparse_coo_tensor(idx[None], grad, param.shape, check_invariants=True)
    opt = segment.SparseAdagrad(
        [p], lr=0.1, eps=1e-5, weight_decay=0.01, rowwise=rowwise, mode=mode
    )
    opt.step()
    moment = torch.zeros(param.shape[0] if rowwise else param.shape, dtype=param.dtype)
    if mode == "sequential":
        ep, eh = loop_adagrad(param, moment, idx, grad, 0.1, 1e-5, 0.01, 1.0, rowwise=rowwise)
    else:
        rows, inv = torch.unique(idx, return_inverse=True)
        summed = grad.new_zeros(rows.numel(), grad.shape[1]).index_add_(0, inv, grad)
        ep, eh = loop_adagrad(param, moment, rows, summed, 0.1, 1e-5, 0.01, 1.0, rowwise=rowwise)
    assert_close(p.detach(), ep)
    assert_close(opt.state[p]["moment"], eh)


@pytest.mark.parametrize("mode", ["sequential", "coalesced"])
def test_sparse_ftrl_optimizer_with_a_sparse_gradient(mode):
    param, idx, grad = _data(6)
    p = torch.nn.Parameter(param.clone())
    p.grad = torch.sparse_coo_tensor(idx[None], grad, param.shape, check_invariants=True)
    opt = segment.SparseFtrl([p], alpha=0.1, beta=1.0, lambda1=0.01, lambda2=0.02, mode=mode)
    opt.step()
    zeros = torch.zeros_like(param)
    if mode == "sequential":
        ep, en, ez = loop_ftrl(param, zeros, zeros, idx, grad, 0.1, 1.0, 0.01, 0.02)
    else:
        rows, inv = torch.unique(idx, return_inverse=True)
        summed = grad.new_zeros(rows.numel(), grad.shape[1]).index_add_(0, inv, grad)
        ep, en, ez = loop_ftrl(param, zeros, zeros, rows, summed, 0.1, 1.0, 0.01, 0.02)
    assert_close(p.detach(), ep)
    assert_close(opt.state[p]["n"], en)
    assert_close(opt.state[p]["z"], ez)


_BACKENDS = ["torch"] + (
    ["numba"] if segment.compiled_available() else []
)  # numba: the fused kernels


def _coalesced_reference(param, moment, idx, grad, lr, eps, wd, decay, rowwise):
    rows, inv = torch.unique(idx, return_inverse=True)
    summed = grad.new_zeros(rows.numel(), *grad.shape[1:]).index_add_(0, inv, grad)
    p, h = param.clone().reshape(param.shape[0], -1), moment.clone()
    h = h if rowwise else h.reshape(param.shape[0], -1)
    ep, eh = loop_adagrad(
        p, h, rows, summed.reshape(rows.numel(), -1), lr, eps, wd, decay, rowwise=rowwise
    )
    return ep.view(param.shape), eh.view(moment.shape)


@pytest.mark.parametrize("backend", _BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rowwise", [False, True])
@pytest.mark.parametrize("wd,decay", [(0.0, 1.0), (0.1, 0.9)])
@pytest.mark.parametrize("rows_shape", [(40, 5), (40, 2, 3), (40,), (70_000, 2)])
def test_coalesced_adagrad_paths_match_the_loop(backend, dtype, rowwise, wd, decay, rows_shape):
    """The coalesced update on both backends (the compiled kernel fuses coalescing and update; the torch
    path marks the rows in a table or, for a table much larger than the gradient (70k rows), sorts them) against
    Caffe2's loop over the summed rows; rows never indexed are untouched.  Row-wise Adagrad has no decay."""
    if rowwise and decay != 1.0:
        decay = 1.0
    g = torch.Generator().manual_seed(7)
    param = torch.randn(rows_shape, generator=g, dtype=dtype)
    moment = torch.rand(rows_shape[0] if rowwise else rows_shape, generator=g, dtype=dtype)
    idx = torch.randint(0, 30, (50,), generator=g)  # duplicates; rows 30.. never touched
    grad = torch.randn(50, *rows_shape[1:], generator=g, dtype=dtype)
    ep, eh = _coalesced_reference(param, moment, idx, grad, 0.1, 1e-5, wd, decay, rowwise)
    with segment.use_backend(backend):
        if rowwise:
            segment.rowwise_sparse_adagrad(
                param, moment, idx, grad, lr=0.1, eps=1e-5, weight_decay=wd, mode="coalesced"
            )
        else:
            segment.sparse_adagrad(
                param,
                moment,
                idx,
                grad,
                lr=0.1,
                eps=1e-5,
                weight_decay=wd,
                decay=decay,
                mode="coalesced",
            )
    assert_close(param[:30], ep[:30])  # (the touched rows; the others unchanged, bit for bit)
    assert_close(moment[:30], eh[:30])
    assert torch.equal(param[30:], ep[30:]) and torch.equal(moment[30:], eh[30:])


@pytest.mark.filterwarnings(
    "ignore:Sparse invariant checks"
)  # (torch.optim.Adagrad's own sparse tensors)
@pytest.mark.parametrize("backend", _BACKENDS)
def test_sparse_adagrad_equals_torch_adagrad_over_steps(backend, monkeypatch):
    """SparseAdagrad (coalesced) on uncoalesced sparse gradients equals torch.optim.Adagrad on the same
    sparse gradients over several steps, float32, on one and on two threads (the compiled kernel splits
    the rows ``r % T`` between threads); empty gradients change nothing."""
    from sparsefill._kernels import segment as _kernels

    monkeypatch.setattr(_kernels, "GRAIN", 64)  # (two threads already at this small size)
    g = torch.Generator().manual_seed(8)
    table = torch.randn(200, 6, generator=g)
    ours, ref = torch.nn.Parameter(table.clone()), torch.nn.Parameter(table.clone())
    opt, ref_opt = segment.SparseAdagrad([ours], lr=0.05), torch.optim.Adagrad([ref], lr=0.05)
    threads = torch.get_num_threads()
    try:
        for step, n in enumerate([300, 0, 120, 300]):
            torch.set_num_threads(1 + step % 2)
            idx = (torch.rand(n, generator=g) ** 2 * 150).long()
            grad = torch.randn(n, 6, generator=g)
            for p in (ours, ref):
                p.grad = torch.sparse_coo_tensor(idx[None], grad, p.shape, check_invariants=True)
            with segment.use_backend(backend):
                opt.step()
            ref_opt.step()
            assert_close(ours.detach(), ref.detach())
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(ours.detach()[150:], table[150:])
    assert_close(opt.state[ours]["moment"], ref_opt.state[ref]["sum"])


@pytest.mark.parametrize("backend", _BACKENDS)
def test_coalesced_ftrl_and_the_kept_marks(backend):
    """Coalesced FTRL on both backends (the compiled coalescing, then the torch update) against the loop
    over the summed rows; the compiled kernels leave their kept table of row marks all -1 (they restore
    every mark they set), and while another step holds it a call takes a fresh one, with the same result."""
    from sparsefill.segment import _optim

    param, idx, grad = _data(9)
    n, z = torch.rand_like(param), torch.randn_like(param)
    rows, inv = torch.unique(idx, return_inverse=True)
    summed = grad.new_zeros(rows.numel(), 3).index_add_(0, inv, grad)
    ep, en, ez = loop_ftrl(param, n, z, rows, summed, 0.1, 1.0, 0.05, 0.01)
    with segment.use_backend(backend):
        segment.sparse_ftrl(
            param,
            n,
            z,
            idx,
            grad,
            alpha=0.1,
            beta=1.0,
            lambda1=0.05,
            lambda2=0.01,
            mode="coalesced",
        )
    assert_close(param, ep)
    assert_close(n, en)
    assert_close(z, ez)
    p2, idx2, grad2 = _data(10)
    m_free, m_held = torch.zeros_like(p2), torch.zeros_like(p2)
    p_free, p_held = p2.clone(), p2.clone()
    with segment.use_backend(backend):
        segment.sparse_adagrad(p_free, m_free, idx2, grad2, lr=0.1, mode="coalesced")
        with _optim._MARKS_LOCK:  # (another step holds the kept table)
            segment.sparse_adagrad(p_held, m_held, idx2, grad2, lr=0.1, mode="coalesced")
    assert torch.equal(p_free, p_held) and torch.equal(m_free, m_held)
    assert (_optim._MARKS["buf"] == -1).all()


# ---------------------------------------------------------------- edge cases
import inspect  # noqa: E402


def test_ftrl_defaults_are_caffe2s():
    """Caffe2 FtrlParams: alpha 0.005, beta 1.0, lambda1 0.001, lambda2 0.001."""
    want = dict(alpha=0.005, beta=1.0, lambda1=0.001, lambda2=0.001)
    for fn in (segment.sparse_ftrl, segment.SparseFtrl.__init__):
        params = inspect.signature(fn).parameters
        assert {k: params[k].default for k in want} == want


@pytest.mark.parametrize("backend", _BACKENDS)
@pytest.mark.parametrize("rowwise", [False, True])
@pytest.mark.parametrize("mode", ["sequential", "coalesced"])
@pytest.mark.parametrize("rows_shape", [(10, 4), (10,), (10, 2, 3)])
def test_adagrad_with_no_gradient_rows_changes_nothing(backend, rowwise, mode, rows_shape):
    """A gradient of 0 rows (a shard no id reached) is a no-op on both paths (row-wise raised on a 0-row reshape)."""
    param = torch.randn(rows_shape, dtype=torch.float64)
    moment = torch.rand(rows_shape[0] if rowwise else rows_shape, dtype=torch.float64)
    p0, m0 = param.clone(), moment.clone()
    idx, grad = (
        torch.zeros(0, dtype=torch.long),
        torch.zeros(0, *rows_shape[1:], dtype=torch.float64),
    )
    with segment.use_backend(backend):
        if rowwise:
            segment.rowwise_sparse_adagrad(param, moment, idx, grad, lr=0.1, mode=mode)
        else:
            segment.sparse_adagrad(param, moment, idx, grad, lr=0.1, mode=mode)
    assert torch.equal(param, p0) and torch.equal(moment, m0)
