"""Every unary and binary ufunc of PyTorch's OpInfo database is element-wise on SparseTensors, natively::

    op(A, B).to_dense() == op(A.to_dense(), B.to_dense())     and    op(A, B) is a SparseTensor

with no DensifyWarning (it is an error here), for COO, CSR, hybrid with an array fill, uncoalesced
and NaN-fill inputs, in float64 and in the integer and bool dtypes the op supports.  The result
may be dense only when a dense operand varies along the sparse dims (dense by nature).
Each (op, dtype) must exercise at least one sample whose result is required to be sparse.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.testing._internal.common_methods_invocations import binary_ufuncs, op_db, unary_ufuncs
from torch.utils._pytree import tree_flatten

import sparsefill
from sparsefill import SparseTensor
from tests.opinfo.test_opinfo import REJECTS, _call, _convert_sample, _densify, _reference

VARIANTS = ["coo", "csr", "hybrid", "uncoalesced", "nan", "coo-all"]
DTYPES = [torch.float64, torch.int64, torch.bool]
MAX_SAMPLES = 4
ALL = frozenset(VARIANTS)
# op -> (variants in which densifying is allowed (the result is still compared), reason); printed in the summary
DECLARED = {
    "nn.functional.rrelu": (
        ALL,
        "its samples use training=True: a random slope per element is not element-wise "
        "on a fill (rrelu in evaluation mode is native)",
    ),
}
CUDA_ONLY = ("jiterator_",)  # rejected on CPU by the dense op itself: no sample can be exercised
IN_OP_DB = {
    id(op) for op in op_db
}  # the lists also hold Python references (_refs.*): they are not ops
CASES = [
    (op, dt)
    for op in unary_ufuncs + binary_ufuncs
    if id(op) in IN_OP_DB and not op.name.startswith(CUDA_ONLY)
    for dt in DTYPES
    if op.supports_dtype(dt, "cpu")
]


def test_declared_exceptions_are_reported(summary_line):
    for name, (variants, reason) in DECLARED.items():
        summary_line(f"declared (ufuncs) {name} [{', '.join(sorted(variants))}]: {reason}")
    summary_line(
        f"not run: ops starting with {CUDA_ONLY} (CUDA-only: the dense op rejects every CPU sample)"
    )


def _strict_run(op, sample, variant, seed, dtype, declared=False):
    """``None`` (not applicable), ``"rejects"`` (dense and sparse both raise), ``"sparse"`` or ``"dense-by-nature"``."""
    conv = _convert_sample(sample, variant, seed, dtype)
    if conv is None:
        return None
    (s_in, s_args, s_kw), dense = conv
    ref = _reference(op, dense, (s_in, s_args, s_kw))
    if ref is REJECTS:
        return "rejects"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore" if declared else "error", sparsefill.DensifyWarning)
        out = _call(op, s_in, s_args, s_kw)
    torch.testing.assert_close(_densify(out), _densify(ref), equal_nan=True)
    if declared:
        return "declared"
    flat = tree_flatten((s_in, s_args, s_kw))[0]
    by_nature = any(
        isinstance(t, torch.Tensor) and not isinstance(t, SparseTensor) and t.dim() > 0
        for t in flat
    )
    if by_nature:
        return "dense-by-nature"
    outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
    assert outs and all(isinstance(o, SparseTensor) for o in outs), (
        f"{op.name} [{variant}]: result is not sparse"
    )
    return "sparse"


@pytest.mark.parametrize(
    "op,dtype",
    CASES,
    ids=[
        f"{op.name}{'.' + op.variant_test_name if op.variant_test_name else ''}-{str(dt)[6:]}"
        for op, dt in CASES
    ],
)
def test_ufunc_is_native_and_sparse(op, dtype):
    samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))[:MAX_SAMPLES]
    declared = DECLARED.get(op.name, ((), ""))[0]
    outcomes, failures = [], []
    for variant in VARIANTS:
        if variant == "nan" and not dtype.is_floating_point:
            continue
        for seed, sample in enumerate(samples):
            try:
                outcomes.append(_strict_run(op, sample, variant, seed, dtype, variant in declared))
            except Exception as e:  # noqa: BLE001 - collected and reported below
                failures.append(f"[{variant}, sample {seed}] {type(e).__name__}: {str(e)[:300]}")
    assert not failures, "\n".join(failures)
    assert "sparse" in outcomes or declared == ALL, (
        f"no sample of {op.name} ({dtype}) required a sparse result: {outcomes}"
    )


UNARY = [
    op
    for op in unary_ufuncs
    if id(op) in IN_OP_DB
    and op.supports_dtype(torch.float64, "cpu")
    and not op.name.startswith(CUDA_ONLY)
    and op.name not in DECLARED
]


@pytest.mark.parametrize(
    "op",
    UNARY,
    ids=lambda op: op.name + (f".{op.variant_test_name}" if op.variant_test_name else ""),
)
def test_unary_ufunc_keeps_an_indefinite_fill(op):
    """``op(M)`` of a masked tensor ``M`` (indefinite fill) is masked with M's pattern, and its values are
    the dense result at the specified positions (masked semantics, as torch.masked)."""
    gen = torch.Generator().manual_seed(0)
    ran = 0
    for sample in list(op.sample_inputs("cpu", torch.float64, requires_grad=False))[:MAX_SAMPLES]:
        x = sample.input
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            continue
        try:
            ref = op(x, *sample.args, **sample.kwargs)
        except Exception:  # noqa: BLE001 - the dense op rejects the sample
            continue
        keep = torch.rand(x.shape, generator=gen) < 0.5
        M = sparsefill.sparse_coo_tensor(
            keep.nonzero().T, x[keep], x.shape, fill_value=sparsefill.indefinite
        )
        with warnings.catch_warnings():
            warnings.simplefilter("error", sparsefill.DensifyWarning)
            out = op(M, *sample.args, **sample.kwargs)
        for o, r in zip(*(t if isinstance(t, tuple) else (t,) for t in (out, ref))):
            assert isinstance(o, SparseTensor) and o._indefinite, (
                f"{op.name}: the result is not masked"
            )
            torch.testing.assert_close(o.indices(), M.indices())
            torch.testing.assert_close(o.values(), r[keep], equal_nan=True)
        ran += 1
    assert ran, f"{op.name}: no sample ran"


BINARY = [
    op
    for op in binary_ufuncs
    if id(op) in IN_OP_DB
    and op.supports_dtype(torch.float64, "cpu")
    and not op.name.startswith(CUDA_ONLY)
    and op.name not in DECLARED
]


@pytest.mark.parametrize(
    "op",
    BINARY,
    ids=lambda op: op.name + (f".{op.variant_test_name}" if op.variant_test_name else ""),
)
def test_binary_ufunc_with_an_indefinite_operand(op):
    """``op(M, B)`` with ``M`` masked (indefinite fill) and ``B`` a SparseTensor with a fill: masked, specified
    exactly where M is, with the dense values there (masked semantics)."""
    gen = torch.Generator().manual_seed(0)
    ran = 0
    for sample in op.sample_inputs("cpu", torch.float64, requires_grad=False):
        x, y = sample.input, sample.args[0] if sample.args else None
        if not (isinstance(y, torch.Tensor) and x.dim() and y.shape == x.shape):
            continue
        keep = torch.rand(x.shape, generator=gen) < 0.5
        M = sparsefill.sparse_coo_tensor(
            keep.nonzero().T, x[keep], x.shape, fill_value=sparsefill.indefinite
        )
        yb = y.clone()
        yb[torch.rand(y.shape, generator=gen) < 0.5] = y.reshape(-1)[0]
        B = sparsefill.to_sparse(yb, fill_value=y.reshape(-1)[0])
        ref = op(x, yb, *sample.args[1:], **sample.kwargs)
        with warnings.catch_warnings():
            warnings.simplefilter("error", sparsefill.DensifyWarning)
            out = op(M, B, *sample.args[1:], **sample.kwargs)
        assert isinstance(out, SparseTensor) and out._indefinite, (
            f"{op.name}: the result is not masked"
        )
        idx = out.coalesce().indices()
        torch.testing.assert_close(idx, M.indices())
        torch.testing.assert_close(out.coalesce().values(), ref[keep], equal_nan=True)
        ran += 1
        if ran == MAX_SAMPLES:
            break
    assert ran, f"{op.name}: no sample with two operands of one shape"
