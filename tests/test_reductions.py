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
from test_opinfo import _call, _clone, _convert_sample, _densify

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
            try:
                ref = _call(op, *_clone(dense))
            except Exception:  # noqa: BLE001 - the dense op rejects the sample: so must the sparse one
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    with pytest.raises(Exception):
                        _call(op, s_in, s_args, s_kw)
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
