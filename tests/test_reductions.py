"""Every float64 reduction of PyTorch's OpInfo ``reduction_ops`` is computed natively on SparseTensors::

    r(A, dims).to_dense() == r(A.to_dense(), dims)

for COO, CSR, hybrid (array fill), uncoalesced and NaN-fill inputs, with no DensifyWarning except
where DECLARED below (run anyway, compared with dense, and printed in the summary).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db, reduction_ops

import sparsefill
from test_opinfo import REJECTS, _call, _convert_sample, _densify, _reference

VARIANTS = ["coo", "csr", "hybrid", "uncoalesced", "nan"]
MAX_SAMPLES = 6
IN_OP_DB = {id(op) for op in op_db}
OPS = [op for op in reduction_ops if id(op) in IN_OP_DB and op.supports_dtype(torch.float64, "cpu")]
ALL = frozenset(VARIANTS)
DECLARED = {  # op name -> (variants, reason)
    "hash_tensor": (ALL, "a hash of the dense bits: computed densely, by definition"),
}


def test_declared_reductions_are_reported(capsys):
    with capsys.disabled():
        for name, (variants, reason) in sorted(DECLARED.items()):
            print(f"\ndeclared (reductions) {name} [{', '.join(sorted(variants))}]: {reason}")


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name + (f".{op.variant_test_name}" if op.variant_test_name else ""))
def test_reduction_is_native(op):
    declared = DECLARED.get(op.name, ((), ""))[0]
    failures, ran = [], 0
    for seed, sample in enumerate(list(op.sample_inputs("cpu", torch.float64, requires_grad=False))[:MAX_SAMPLES]):
        for variant in VARIANTS:
            conv = _convert_sample(sample, variant, seed)
            if conv is None:
                continue
            (s_in, s_args, s_kw), dense = conv
            ref = _reference(op, dense, (s_in, s_args, s_kw))
            if ref is REJECTS:
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore" if variant in declared else "error", sparsefill.DensifyWarning)
                    out = _call(op, s_in, s_args, s_kw)
                torch.testing.assert_close(_densify(out), _densify(ref), equal_nan=True)
                ran += 1
            except Exception as e:  # noqa: BLE001 - collected and reported below
                failures.append(f"[{variant}, sample {seed}] {type(e).__name__}: {str(e)[:200]}")
    assert not failures, "\n".join(failures)
    assert ran, f"{op.name}: no sample ran"


SCANS = {"cumsum": lambda t, d: t.cumsum(d), "cumprod": lambda t, d: t.cumprod(d), "cummax": lambda t, d: t.cummax(d),
         "cummin": lambda t, d: t.cummin(d), "logcumsumexp": lambda t, d: t.logcumsumexp(d)}


def _dense(o):
    if isinstance(o, tuple):
        return tuple(_dense(x) for x in o)
    return o.to_dense() if isinstance(o, sparsefill.SparseTensor) else o


@pytest.mark.parametrize("name", list(SCANS))
@pytest.mark.parametrize("dense_dim", [0, 1, 2])
def test_scans_native_along_dense_dims_dense_by_nature_along_sparse_ones(name, dense_dim):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, 3, generator=g, dtype=torch.float64)
    x[torch.rand(4, 5, 3, generator=g) < 0.6] = 0.5
    A = sparsefill.to_sparse(x, fill_value=0.5, dense_dim=dense_dim)
    for d in range(3):
        with warnings.catch_warnings():
            warnings.simplefilter("error", sparsefill.DensifyWarning)
            out = SCANS[name](A, d)
        first = out[0] if isinstance(out, tuple) else out
        assert isinstance(first, sparsefill.SparseTensor) == (d >= 3 - dense_dim)
        ref = SCANS[name](x, d)
        torch.testing.assert_close(_dense(out), tuple(ref) if isinstance(ref, tuple) else ref)


@pytest.mark.parametrize("fill", [0.5, -3.0, 9.0, float("nan")])
def test_median_and_nanmedian_in_closed_form(fill):
    g = torch.Generator().manual_seed(1)
    for n in (1, 2, 7, 20):
        x = torch.randn(n, generator=g, dtype=torch.float64)
        x[torch.rand(n, generator=g) < 0.5] = fill
        if n == 7:
            x[3] = float("nan")
        A = sparsefill.to_sparse(x, fill_value=fill)
        with warnings.catch_warnings():
            warnings.simplefilter("error", sparsefill.DensifyWarning)
            torch.testing.assert_close(A.median(), x.median(), equal_nan=True)
            torch.testing.assert_close(A.nanmedian(), x.nanmedian(), equal_nan=True)
