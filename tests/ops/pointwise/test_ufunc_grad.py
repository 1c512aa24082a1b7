"""Autograd of every differentiable unary and binary ufunc of PyTorch's OpInfo database (gradients of dense semantics).

1. gradcheck over ``(values, fill)``: ``g(v, f) = op(SparseTensor(P, v, fill=f), ...).to_dense()``
   (for binary ops, the second operand sparse too: ``(v_a, f_a, v_b, f_b)``).
2. Leaf gradients: for a SparseTensor leaf ``A`` and an upstream gradient that is a SparseTensor with
   a uniform fill ``g``, ``A.grad`` is a SparseTensor, ``A.grad.to_dense()`` equals the gradient of the
   dense computation, and its fill is ``f'(fill) * g`` (the chain rule on the fill).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.autograd import gradcheck
from torch.testing._internal.common_methods_invocations import binary_ufuncs, op_db, unary_ufuncs

import sparsefill
from sparsefill import SparseTensor

IN_OP_DB = {id(op) for op in op_db}
OPS = [
    op
    for op in unary_ufuncs + binary_ufuncs
    if id(op) in IN_OP_DB
    and op.supports_autograd
    and op.supports_dtype(torch.float64, "cpu")
    and not op.name.startswith("jiterator_")
]
RANDOM = {
    "nn.functional.rrelu"
}  # training-mode samples draw per element: no fixed function to check
# op -> why its leaf gradient may densify (the values are still compared); printed by the report test
DENSE_BACKWARD = {
    "nn.functional.prelu": "the weight's gradient is a reduction (_prelu_kernel_backward): reductions are not yet native",
    "mvlgamma": "its backward unsqueezes: shape ops are not yet native",
}
MAX_SAMPLES = 2


def _pattern(x: torch.Tensor, gen):
    """Positions (COO indices) that stay specified; the others take the fill ``x.flatten()[0]``."""
    keep = torch.rand(x.shape, generator=gen) < 0.5
    return keep.nonzero().T, keep


def _sparse_fn(x, gen):
    """``(build(v, f) -> SparseTensor, v0, f0)`` with ``build(v0, f0)`` close to ``x`` (half its elements)."""
    idx, keep = _pattern(x, gen)
    f0 = x.detach().reshape(-1)[0].clone() if x.numel() else torch.zeros((), dtype=x.dtype)
    v0 = x.detach()[keep].clone()
    return (lambda v, f: sparsefill.sparse_coo_tensor(idx, v, x.shape, fill_value=f)), v0, f0


def _samples(op, n=MAX_SAMPLES):
    out = []
    for s in op.sample_inputs(
        "cpu", torch.float64, requires_grad=True
    ):  # samples made for gradient checks
        s = s.transform(lambda t: t.detach() if isinstance(t, torch.Tensor) else t)
        if isinstance(s.input, torch.Tensor) and s.input.dim() > 0 and s.input.numel() > 1:
            out.append(s)
        if len(out) == n:
            break
    return out


NARROWING = {
    "bfloat16",
    "float",
    "half",
    "cfloat",
    "chalf",
}  # casts to a narrower dtype: no gradcheck possible


def test_declared_dense_backwards_are_reported(summary_line):
    summary_line(
        f"not gradchecked (narrowing casts; their leaf gradients are compared): {sorted(NARROWING)}"
    )
    for name, reason in DENSE_BACKWARD.items():
        summary_line(f"declared (ufunc gradients) {name}: {reason}")


def _binary_other(op, s):
    o = s.args[0] if s.args else None
    return o if isinstance(o, torch.Tensor) and o.dtype == torch.float64 and o.dim() > 0 else None


@pytest.mark.parametrize(
    "op",
    [op for op in OPS if op.name not in RANDOM],
    ids=lambda op: op.name + (f".{op.variant_test_name}" if op.variant_test_name else ""),
)
def test_gradcheck_over_values_and_fill(op):
    samples = _samples(
        op, 4 * MAX_SAMPLES
    )  # candidates: the first MAX_SAMPLES that gradcheck can take
    assert samples, f"{op.name}: no sample with a tensor input of 2+ elements"
    # then the same with positive operands, for ops whose samples all leave the domain (e.g. (-7.6) ** x)
    samples += [
        s.transform(
            lambda t: t.abs() + 0.5 if isinstance(t, torch.Tensor) and t.is_floating_point() else t
        )
        for s in samples
    ]
    gen = torch.Generator().manual_seed(0)
    checked = 0
    for s in samples:
        if checked == MAX_SAMPLES:
            break
        outs = [
            o
            for o in torch.utils._pytree.tree_leaves(op(s.input, *s.args, **s.kwargs))
            if isinstance(o, torch.Tensor) and (o.is_floating_point() or o.is_complex())
        ]
        if any(o.dtype not in (torch.float64, torch.complex128) for o in outs):
            continue  # gradcheck itself refuses a narrowing cast (float, half...): the leaf test covers these
        if not all(torch.isfinite(o).all() for o in outs):
            continue  # a non-finite output (e.g. (-2) ** x) has no finite-difference gradient to compare
        checked += 1
        build_a, va, fa = _sparse_fn(s.input, gen)
        other = _binary_other(op, s)
        with warnings.catch_warnings():
            warnings.simplefilter(
                "ignore", sparsefill.DensifyWarning
            )  # binary results may be dense by nature
            if other is None:

                def g(v, f):
                    return _dense(op(build_a(v, f), *s.args, **s.kwargs))

                inputs = (va.requires_grad_(), fa.requires_grad_())
            else:
                build_b, vb, fb = _sparse_fn(other, gen)

                def g(v, f, w, h):
                    return _dense(op(build_a(v, f), build_b(w, h), *s.args[1:], **s.kwargs))

                inputs = (
                    va.requires_grad_(),
                    fa.requires_grad_(),
                    vb.requires_grad_(),
                    fb.requires_grad_(),
                )
            assert gradcheck(
                g, inputs, check_batched_grad=False, check_undefined_grad=False, fast_mode=True
            )
    assert checked or op.name in NARROWING, f"{op.name}: no sample could be gradchecked"


def _dense(t):
    return (
        tuple(_dense(x) for x in t)
        if isinstance(t, (tuple, list))
        else t.to_dense()
        if isinstance(t, SparseTensor)
        else t
    )


@pytest.mark.parametrize(
    "op",
    [op for op in unary_ufuncs if op in OPS and op.name not in RANDOM],
    ids=lambda op: op.name + (f".{op.variant_test_name}" if op.variant_test_name else ""),
)
def test_leaf_gradient_is_sparse_with_fill_fprime_times_g(op):
    gen = torch.Generator().manual_seed(1)
    for s in _samples(op):
        build, v0, f0 = _sparse_fn(s.input, gen)
        A = build(v0, f0).requires_grad_()
        declared = op.name in DENSE_BACKWARD
        with warnings.catch_warnings():
            warnings.simplefilter("ignore" if declared else "error", sparsefill.DensifyWarning)
            out = op(A, *s.args, **s.kwargs)
            if not isinstance(out, SparseTensor) or not out.dtype.is_floating_point:
                continue  # multi-output (frexp) or integer results: no gradient to this output
            G = sparsefill.sparse_coo_tensor(
                out.indices(),
                torch.rand(out._nnz(), generator=gen, dtype=torch.float64),
                out.shape,
                fill_value=0.75,
            )
            out.backward(G)
        x = A.detach().to_dense().requires_grad_()
        op(x, *s.args, **s.kwargs).backward(G.detach().to_dense())
        torch.testing.assert_close(torch.as_tensor(_dense(A.grad)), x.grad, equal_nan=True)
        if not isinstance(
            A.grad, SparseTensor
        ):  # a derivative that is identically zero (sgn, floor...):
            assert declared or not x.grad.any(), (
                f"{op.name}: leaf gradient is dense"
            )  # torch's dense zeros
            continue
        unspecified = ~torch.zeros(A.shape, dtype=torch.bool).index_put_(
            tuple(A.indices()), torch.tensor(True)
        )
        if (
            unspecified.any()
        ):  # the gradient's fill is f'(fill) * g: the dense gradient at an unspecified element
            torch.testing.assert_close(
                A.grad.fill_value().expand(A.shape)[unspecified],
                x.grad[unspecified],
                equal_nan=True,
            )
