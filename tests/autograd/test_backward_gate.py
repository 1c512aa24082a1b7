"""The densify policy over torch's own derivative formulas (``ops/backward_gate.py``): a passed-through call's
formula that would form the dense gradient of a SparseTensor operand asks the policy first, so a byte limit
holds in backward (DensifyError before the allocation), and a formula on sparse gradients is not stopped."""

from __future__ import annotations

import pytest
import torch
from tests.ops.linalg.test_einsum_hybrid import DenseFormLog, _gat
from torch.testing import assert_close

import sparsefill
from sparsefill import DensifyError


def test_decomposition_backward_raises_before_the_dense_gradient():
    """A leaf ``P`` (its gradient has dense semantics: the einsum route declines): torch's decomposition runs
    ``bmm``, whose formula would form the dense (H, N, N) gradient of ``P``: DensifyError naming the formula, the
    op and the bytes, and no kernel allocates it."""
    N, H, D = 1000, 4, 8
    P, _, Wh = _gat(N, H, D, E=4000)
    P = P.detach().requires_grad_()
    log = DenseFormLog()
    with sparsefill.densify_policy("raise", limit_bytes=1 << 20), log:
        out = torch.einsum("ijh,jhd->ihd", P, Wh)
        with pytest.raises(
            DensifyError, match=rf"BmmBackward0 .*einsum.*\(4, {N}, {N}\).* {N * N * H * 4} bytes"
        ):
            out.sum().backward()
    assert log.largest < N * N


def test_gate_passes_within_the_limit_and_gives_the_dense_gradient():
    """Under the default policy (dense by nature allowed, 1 GiB) the same formula runs: the leaf's gradient is
    the dense one."""
    g = torch.Generator().manual_seed(0)
    A = sparsefill.sparse_coo_tensor(
        [[0, 1, 2], [1, 2, 0]], torch.randn(3, 2, generator=g), (3, 3, 2)
    )
    A = A.requires_grad_()
    X = torch.randn(3, 2, 4, generator=g)
    torch.einsum("ijh,jhd->ihd", A, X).sum().backward()
    Ad = A.detach().to_dense().requires_grad_()
    torch.einsum("ijh,jhd->ihd", Ad, X).sum().backward()
    assert_close(A.grad.to_dense(), Ad.grad)


def test_dense_by_nature_raise_refuses_torchs_dense_gradient():
    """``dense_by_nature="raise"`` finds the formulas that would densify a gradient (the forward is sparse)."""
    A = sparsefill.sparse_coo_tensor([[0, 1], [1, 0]], [1.0, 2.0], (2, 2)).requires_grad_()
    with sparsefill.densify_policy(dense_by_nature="raise"):
        y = A @ torch.ones(2, 3)
        with pytest.raises(
            DensifyError, match=r"MmBackward0 \(torch's derivative formula of matmul\).* 16 bytes"
        ):
            y.sum().backward()


def test_sparse_gradients_are_not_stopped():
    """A formula whose incoming gradient is a SparseTensor runs through the handlers (which ask the policy
    themselves): ``(2 * A).sum()`` under a limit below A's dense form raises nothing."""
    v = torch.tensor([1.0, 2.0], requires_grad=True)
    A = sparsefill.sparse_coo_tensor([[0, 1], [1, 0]], v, (2, 2), fill_value=0.5)
    with sparsefill.densify_policy("raise", limit_bytes=8):
        (2 * A).sum().backward()
    assert_close(v.grad, torch.tensor([2.0, 2.0]))
