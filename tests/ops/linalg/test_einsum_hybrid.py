"""einsum of a SparseTensor and a dense operand whose equation is a (batched) matrix product, the batch letter
anywhere (the heads of a hybrid ``(N, N, H)`` attention, ``"ijh,jhd->ihd"``), or absent from the dense operand
(``"ijh,jd->ihd"``: broadcast over it): forward and the gradients of the constructor's leaves (values, fill)
and of the dense operand equal the dense computation's, and the backward runs on the pattern (no DensifyWarning,
nothing past a tight byte limit: ``ops/linalg_autograd._route_einsum``)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.testing import assert_close
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import sparsefill
from sparsefill import SparseTensor

# equation, sparse shape, its sparse dims, dense shape
EQUATIONS = [
    ("ijh,jhd->ihd", (5, 5, 3), 2, (5, 3, 4)),
    ("ijh,jd->ihd", (5, 5, 3), 2, (5, 4)),
    ("ijh,jhd->hid", (5, 6, 3), 2, (6, 3, 4)),
    ("jih,hjd->dhi", (6, 5, 3), 2, (3, 6, 4)),
    ("jhd,ijh->ihd", (5, 5, 3), 2, (5, 3, 4)),  # the dense operand first
    ("bij,bjd->bid", (3, 5, 4), 3, (3, 4, 2)),
    ("bij,bjd->bid", (3, 5, 4), 2, (3, 4, 2)),  # hybrid: the contracted letter a dense dim
    ("bij,jd->bid", (3, 5, 4), 3, (4, 2)),
    ("ibj,jbd->ibd", (5, 3, 4), 3, (4, 3, 2)),
    ("ij,jk->ik", (5, 4), 2, (4, 3)),
]
FILLS = {"zero": 0.0, "scalar": 1.5, "nan": float("nan"), "indefinite": None}


def _leaves(shape, sd, fill, seed):
    g = torch.Generator().manual_seed(seed)
    nse = 7
    idx = torch.stack([torch.randint(0, n, (nse,), generator=g) for n in shape[:sd]])
    v = torch.randn((nse,) + tuple(shape[sd:]), dtype=torch.float64, generator=g).requires_grad_()
    f = None if fill is None else torch.tensor(fill, dtype=torch.float64, requires_grad=True)
    return idx, v, f


def _sparse(idx, v, f, shape, layout, coalesce):
    A = sparsefill.sparse_coo_tensor(
        idx, v, shape, fill_value=sparsefill.indefinite if f is None else f
    )
    if layout == "csr":
        return A.to_sparse_csr()
    return A.coalesce() if coalesce else A


def _dense(idx, v, f, shape):
    """The dense equivalent of the same leaves (duplicates summed; 0 at masked-out elements)."""
    sd = idx.shape[0]
    z = torch.zeros(shape, dtype=v.dtype).index_put(tuple(idx), v, accumulate=True)
    mask = torch.zeros(shape[:sd], dtype=torch.bool).index_put(tuple(idx), torch.tensor(True))
    mask = mask.reshape(mask.shape + (1,) * (len(shape) - sd))
    return torch.where(mask, z, 0.0 if f is None else f)


# (CSR: two sparse dims, here the leading two, with the dense dims after them)
CASES = [
    (e, layout)
    for e in EQUATIONS
    for layout in ("coo", "coo-uncoalesced", "csr")
    if layout != "csr" or e[2] == 2
]


@pytest.mark.parametrize("fill", FILLS, ids=list(FILLS))
@pytest.mark.parametrize(
    "case", CASES, ids=[f"{e[0]}-{e[2]}sparse-{layout}" for e, layout in CASES]
)
def test_einsum_matches_dense_forward_and_backward(case, fill):
    (eq, sshape, sd, dshape), layout = case
    f0 = FILLS[fill]
    idx, v, f = _leaves(sshape, sd, f0, seed=len(eq) + sd)
    X = torch.randn(
        dshape, dtype=torch.float64, generator=torch.Generator().manual_seed(3)
    ).requires_grad_()
    ops = eq.split("->")[0].split(",")
    order = (
        (lambda S, D: (D, S))
        if len(ops[0]) == len(dshape) and ops[0][0] != ops[1][0] and eq.startswith("jhd")
        else (lambda S, D: (S, D))
    )
    A = _sparse(idx, v, f, sshape, layout.split("-")[0], coalesce=layout == "coo")
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        with sparsefill.densify_policy(
            "raise", limit_bytes=64
        ):  # below every sparse shape's dense form
            out = torch.einsum(eq, *order(A, X))
            W = torch.randn(
                out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(4)
            )
            leaves = (v, X) + (() if f is None else (f,))
            got = torch.autograd.grad((out * W).sum(), leaves)
    Xd = X.detach().requires_grad_()
    ref_out = torch.einsum(eq, *order(_dense(idx, v, f, sshape), Xd))
    ref = torch.autograd.grad((ref_out * W).sum(), (v, Xd) + (() if f is None else (f,)))
    assert type(out) is torch.Tensor
    assert_close(out, ref_out, equal_nan=True)
    for name, a, b in zip(("values", "dense operand", "fill"), got, ref):
        assert_close(a, b, equal_nan=True, msg=lambda m, name=name: f"gradient of the {name}: {m}")


class DenseFormLog(TorchDispatchMode):
    """The largest floating tensor a torch kernel allocates on plain tensors, the handlers' and the derivative
    formulas' alike (a call with a SparseTensor argument goes on to its ``__torch_dispatch__``, whose own calls
    come back here)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(isinstance(a, SparseTensor) for a in tree_flatten((args, kwargs))[0]):
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if (
                isinstance(t, torch.Tensor)
                and t.layout is torch.strided
                and t.device.type == "cpu"
                and t.is_floating_point()
            ):  # (its storage: an expand allocates nothing, meta neither)
                self.largest = max(self.largest, t.untyped_storage().nbytes() // t.element_size())
        return out


def _gat(N, H, D, E, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, N, (2, E), generator=g)
    v = torch.rand(E, H, generator=g).requires_grad_()
    Wh = torch.randn(N, H, D, generator=g).requires_grad_()
    return sparsefill.sparse_coo_tensor(idx, v, (N, N, H)).coalesce(), v, Wh


def test_multihead_einsum_backward_stays_within_the_policy():
    """The multi-head GAT aggregation at N = 4000 under ``densify_policy("raise", limit_bytes=1 << 20)``: the
    forward and backward raise nothing and no kernel allocates an N x N x H (or N x N) temporary."""
    N, H, D = 4000, 4, 8
    P, v, Wh = _gat(N, H, D, E=16000)
    log = DenseFormLog()
    with sparsefill.densify_policy("raise", limit_bytes=1 << 20), log:
        out = torch.einsum("ijh,jhd->ihd", P, Wh)
        (out * out).sum().backward()
    assert v.grad.shape == v.shape and Wh.grad.shape == Wh.shape
    assert log.largest < N * N, f"a temporary of {log.largest} elements (N * N = {N * N})"
