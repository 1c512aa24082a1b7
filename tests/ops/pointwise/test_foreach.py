"""``torch._foreach_*`` ops over lists holding SparseTensors equal the dense computation, natively
(unary, binary, pointwise; out of place and in place), from PyTorch's OpInfo foreach database."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.testing._internal.common_methods_invocations import (
    foreach_binary_op_db,
    foreach_pointwise_op_db,
    foreach_unary_op_db,
)
from torch.utils._pytree import tree_map

import sparsefill
from sparsefill import SparseTensor
from torch import nn
from torch.testing import assert_close
from tests.models import _no_densify

OPS = [
    op
    for op in foreach_unary_op_db + foreach_binary_op_db + foreach_pointwise_op_db
    if op.supports_dtype(torch.float64, "cpu")
]


def _sparse(t, gen):
    if not (isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.dim() > 0 and t.numel()):
        return t, t
    x = t.detach().clone()
    fill = x.reshape(-1)[0].clone()
    x[torch.rand(x.shape, generator=gen) < 0.5] = fill
    return sparsefill.to_sparse(x, fill_value=fill), x


def _pairs(o, gen):
    flat = [(_sparse(t, gen)) for t in (o if isinstance(o, (list, tuple)) else [o])]
    sp, dn = [a for a, _ in flat], [b for _, b in flat]
    return (sp, dn) if isinstance(o, (list, tuple)) else (sp[0], dn[0])


CASES = [
    (op, inplace)
    for op in OPS
    for inplace in (False, True)
    if (op.inplace_variant if inplace else op.op) is not None
]  # (an op without an in-place form: none)


@pytest.mark.parametrize(
    "op,inplace", CASES, ids=lambda v: v.name if hasattr(v, "name") else ("_" if v else "")
)
def test_foreach_is_native(op, inplace):
    fn = op.inplace_variant if inplace else op.op
    gen = torch.Generator().manual_seed(0)
    ran = 0
    for sample in list(op.sample_inputs("cpu", torch.float64, num_input_tensors=[3]))[:4]:
        s_in, d_in = _pairs(sample.input, gen)
        s_args, d_args = zip(*[_pairs(a, gen) for a in sample.args]) if sample.args else ((), ())
        try:
            ref = fn(d_in, *d_args, **sample.kwargs)
        except Exception:  # noqa: BLE001 - the dense op rejects the sample: so must the sparse one
            with pytest.raises(Exception):
                fn(s_in, *s_args, **sample.kwargs)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("error", sparsefill.DensifyWarning)
            out = fn(s_in, *s_args, **sample.kwargs)
        got, want = (s_in, d_in) if inplace else (out, ref)
        dense = tree_map(lambda t: t.to_dense() if isinstance(t, SparseTensor) else t, list(got))
        torch.testing.assert_close(dense, list(want), equal_nan=True)
        ran += 1
    assert ran, f"{op.name}: no sample ran"


def test_foreach_norm_of_a_sparse_gradient_does_not_densify():
    G = sparsefill.sparse_coo_tensor([[0, 1, 3], [1, 2, 0]], torch.randn(3), (4, 3), fill_value=0.5)
    with warnings.catch_warnings():
        _no_densify()
        got = torch._foreach_norm([G], 2.0)[0]
        assert_close(torch.ops.aten.norm.Scalar(G, 1), torch.linalg.vector_norm(G.to_dense(), 1))
        p = nn.Parameter(torch.zeros(4, 3))
        p.grad = G
        n = torch.nn.utils.clip_grad_norm_([p], 1e9, foreach=True)
    assert_close(got, torch.linalg.vector_norm(G.to_dense()))
    assert_close(n, got)
