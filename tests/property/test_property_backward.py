"""Gradients through generated SparseTensors equal the dense gradients (the invariant, backward)::

    d loss(op(A)) / d (values, fill)  ==  d loss(op(A.to_dense())) / d (values, fill)

for ``A`` built from leaf values and fill (float64; COO, CSR, hybrid, uncoalesced; scalar and array fills) and
element-wise ops, reductions, shape ops, products and softmax; ``loss`` weighs every output element."""

from __future__ import annotations

import torch
from hypothesis import given, strategies as st

import sparsefill
from tests.property.sparse_strategies import SETTINGS, outcome, sparse_tensors

OPS = {
    "exp": torch.exp,
    "mul_self": lambda a: a * a,
    "add_scalar": lambda a: a + 2.5,
    "sum": torch.sum,
    "sum0": lambda a: a.sum(0),
    "sum_last": lambda a: a.sum(-1),
    "mean0": lambda a: a.mean(0),
    "amax0": lambda a: a.amax(0),
    "prod0": lambda a: a.prod(0),
    "var0": lambda a: a.var(0),
    "logsumexp0": lambda a: torch.logsumexp(a, 0),
    "softmax_last": lambda a: torch.softmax(a, -1),
    "t": lambda a: a.t() if a.dim() <= 2 else a.transpose(0, 1),
    "reshape": lambda a: a.reshape(-1),
    "select": lambda a: a.select(0, 0),
    "slice": lambda a: a[1:],
    "flip": lambda a: a.flip(0),
    "matmul": lambda a: a @ torch.linspace(-1, 1, a.shape[-1], dtype=a.dtype),
    "rmatmul": lambda a: (
        torch.linspace(-1, 1, a.shape[-2], dtype=a.dtype) @ a if a.dim() >= 2 else a
    ),
    "relu": torch.relu,
    "abs": torch.abs,
    "cumsum0": lambda a: a.cumsum(0),
    "norm": torch.linalg.vector_norm,
}


def _leaves(A):
    """``A`` rebuilt from leaf values and fill: ``(A, values, fill)``."""
    v = A._vals.detach().clone().requires_grad_()
    f = A._fill.detach().clone().requires_grad_()
    if A.sparse_layout == torch.sparse_coo:
        B = sparsefill.sparse_coo_tensor(A._idx, v, A.shape, fill_value=f)
    else:
        B = sparsefill.sparse_csr_tensor(A._crow, A._col, v, A.shape, fill_value=f)
    return B, v, f


def _grads(out, v, f):
    out = out.to_dense() if isinstance(out, sparsefill.SparseTensor) else out
    w = torch.linspace(-1, 2, out.numel(), dtype=out.dtype).reshape(out.shape)
    gv, gf = torch.autograd.grad((out * w).sum(), (v, f), allow_unused=True)
    return [torch.zeros_like(v) if gv is None else gv, torch.zeros_like(f) if gf is None else gf]


@SETTINGS
@given(
    sparse_tensors(dtypes=[torch.float64], min_dim=1, layouts=("coo", "csr")),
    st.sampled_from(sorted(OPS)),
)
def test_gradients_of_values_and_fill_are_dense(A, name):
    f = OPS[name]
    Bs, vs, fs = _leaves(A)
    Bd, vd, fd = _leaves(A)
    ks, out_s = outcome(lambda: f(Bs))
    kd, out_d = outcome(lambda: f(Bd.to_dense()))
    assert ks == kd, (ks, out_s, kd, out_d)
    if ks != "ok" or not out_d.requires_grad:
        return
    gs, gd = _grads(out_s, vs, fs), _grads(out_d, vd, fd)
    for a, b in zip(gs, gd):
        a = a.to_dense() if isinstance(a, sparsefill.SparseTensor) else a
        torch.testing.assert_close(a, b, equal_nan=True)
