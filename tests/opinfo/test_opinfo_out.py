"""``out=`` over PyTorch's OpInfo database: every op that supports ``out=`` called with dense
outputs on a SparseTensor input gives dense torch's result in those outputs, returns them, and is
native wherever the op without ``out=`` is native on the same sample; SparseTensor outputs take
the same result::

    op(A, ..., out=o) is o      and      o == op(A.to_dense(), ...)
"""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_flatten, tree_map

import sparsefill
from tests.opinfo.test_opinfo import TIES, _check_ties, _clone, _convert_sample, _densify

OPS = [op for op in op_db if op.supports_out and op.supports_dtype(torch.float64, "cpu")]


def _densified(call) -> tuple:
    """``(result, whether a DensifyWarning was emitted)``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = call()
    return out, any(issubclass(w.category, sparsefill.DensifyWarning) for w in caught)


def _one(op, sample, variant) -> str:
    conv = _convert_sample(sample, variant, 0)
    if conv is None:
        return "n/a"
    (s_in, s_args, s_kw), (d_in, d_args, d_kw) = conv
    try:
        ref = op(*_clone((d_in, *d_args)), **_clone(d_kw))
        returns = op(*_clone((d_in, *d_args)), **_clone(d_kw), out=tree_map(torch.empty_like, ref))
    except Exception:  # noqa: BLE001 - the dense op rejects the sample (or its out= form)
        return "n/a"
    _, functional_densifies = _densified(lambda: op(s_in, *s_args, **s_kw))
    outs = tree_map(torch.empty_like, ref)
    got, densifies = _densified(lambda: op(s_in, *s_args, **s_kw, out=outs))
    _written(op, (d_in, d_args, d_kw), ref, returns, got, outs)
    assert functional_densifies or not densifies, "native without out=, densified with it"
    # SparseTensor outputs (of the result's shapes: theirs are fixed) take the result
    outs = tree_map(lambda t: sparsefill.to_sparse(torch.zeros_like(t)), ref)
    _written(op, (d_in, d_args, d_kw), ref, returns, op(s_in, *s_args, **s_kw, out=outs), outs)
    return "densify" if densifies else "native"


def _written(op, dense, ref, returns, got, outs) -> None:
    """``outs`` hold ``ref`` (dense torch's result) and ``got`` is them (nothing where dense
    torch's ``out=`` form returns nothing)."""
    if returns is None:  # (ops whose out= form returns nothing: split_with_sizes_copy)
        assert got is None
    else:
        assert all(g is o for g, o in zip(tree_flatten(got)[0], tree_flatten(outs)[0], strict=True))
    if op.name in TIES:
        _check_ties(op, dense, _densify(outs), ref)
    else:
        torch.testing.assert_close(_densify(outs), ref, equal_nan=True)


@pytest.mark.parametrize(
    "op",
    OPS,
    ids=[op.name + (f".{op.variant_test_name}" if op.variant_test_name else "") for op in OPS],
)
def test_out_variant(op):
    samples = list(itertools.islice(op.sample_inputs("cpu", torch.float64), 2))
    for variant, sample in itertools.product(("coo", "csr", "hybrid"), samples):
        _one(op, sample, variant)
