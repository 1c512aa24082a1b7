"""The densify policy holds over PyTorch's OpInfo database, forward and backward: under
``densify_policy("raise", limit_bytes=L)`` with ``L`` below the dense form of the SparseTensor input, every op
either runs without a dense allocation past ``L`` or raises :class:`~sparsefill.DensifyError` naming the op and
the bytes -- never allocates past the limit silently.

For every op of ``op_db`` supporting float64, its first sample; the sample's input (the first tensor of a sequence
input) becomes a COO SparseTensor with about a quarter of its elements stored (at least one), its values a leaf
requiring grad where the op has autograd (its other tensor arguments detached).  ``L`` is one byte less than the
input's dense form (``numel * 8``).  The op runs, then the backward of ``sum`` over its floating outputs (their
``.sum()``: the upstream gradient of a SparseTensor result stays sparse), all under the policy and a
:class:`AllocationLog` dispatch mode that records every tensor a torch kernel allocates (an output with a storage
of its own) on plain tensors: that is, inside sparsefill's handlers and in torch's derivative formulas.  An
allocation counts against the policy when it is a dense form (floating values of at least the input's number of
elements) larger than ``L`` plus the dense tensors the sample passes and the op's dense results (a result the
size of the dense operands is theirs, ``cat``'s of them, and a dense result, ``A @ X``, is what was asked for:
these sizes are the user's, not the SparseTensor's).

Outcomes per op (printed at the end of the run, the counts in ``COUNTS``):

* ``native``: ran, forward and backward, with no allocation past the limit;
* ``DensifyError``: the policy refused (the message names the op and its bytes);
* ``rejects``: the op raises another error on this input (the dense op's own error, an unsupported argument:
  ``tests/opinfo/test_opinfo.py`` checks that these match the dense op);
* ``n/a``: no float64 tensor input with two or more elements;
* ``violates``: an allocation past the limit -- fails the test;
* ``declared``: a violation in ``DECLARED`` (a known defect, with what allocates).
"""

from __future__ import annotations

import collections
import re

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import sparsefill
from sparsefill import DensifyError, SparseTensor

COUNTS: collections.Counter = collections.Counter()  # outcome -> number of ops
# Allocations past the limit found by the first run of this sweep, each a defect to fix in the library (not in the
# test): op id -> what allocates.  Reported ``declared``; an undeclared violation fails its test, and so does a
# declared op that no longer violates (remove it from here).
DECLARED = {
    "gradient": "no densification: the pieces (a[2:] - a[:-2]) / 2 and the edges store the union of shifted "
    "patterns natively, which at the sample's 5 elements is every element; cat joins those stored "
    "values (aten.cat of (5,)), the size this sweep counts as a dense form",
    "nn.functional.pad.reflect": "no densification: the pad copies each stored element to every "
    "output position that reads it (index_select); the sample's (1, 3) input padded to (1, 6) "
    "holds more stored copies (aten.index_select of (3,)) than the input has elements, the size "
    "this sweep counts as a dense form",
    "nn.functional.pad.replicate": "no densification: as reflect, the edge elements copied into "
    "the border (aten.index_select of (5,) stored copies for a (1, 3) input padded to (1, 6))",
    "nn.functional.glu": "no densification: the gradient's two halves have different fills, so "
    "cat stores the second half whole (asking the byte limit for it: 8 bytes); at the sample's 2 "
    "elements that and the first half's stored element are every element (aten.cat of (2,)), the "
    "size this sweep counts as a dense form",
}
OUTCOMES: dict = {}  # op id -> outcome
OPS = [op for op in op_db if op.supports_dtype(torch.float64, "cpu")]


class AllocationLog(TorchDispatchMode):
    """Records the largest storage of a dense form (:func:`_dense_form`) that any plain-tensor aten call
    allocates (``self.largest``: (bytes, op)).  A call
    with a SparseTensor argument is left to ``SparseTensor.__torch_dispatch__`` (``NotImplemented``), whose
    own calls on plain tensors come back here: the mode sees every kernel the handlers run."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel, self.largest = numel, (0, None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat = tree_flatten((args, kwargs))[0]
        if any(isinstance(a, SparseTensor) for a in flat):
            return NotImplemented
        out = func(*args, **kwargs)
        seen = {a.untyped_storage().data_ptr() for a in flat if _has_storage(a)}
        for t in tree_flatten(out)[0]:
            if (
                _has_storage(t)
                and t.untyped_storage().data_ptr() not in seen
                and _dense_form(t, self.numel)
            ):
                n = t.untyped_storage().nbytes()
                if n > self.largest[0]:
                    self.largest = (n, f"{func} ({tuple(t.shape)}, {t.dtype})")
        return out


def _has_storage(t) -> bool:
    return (
        isinstance(t, torch.Tensor)
        and not isinstance(t, SparseTensor)
        and t.layout is torch.strided
        and t.device.type == "cpu"
    )


def _dense_form(t: torch.Tensor, numel: int) -> bool:
    """``t`` may be a dense form: floating values of at least the SparseTensor's number of elements (index
    tensors and masks are not: they grow with the stored elements or are a byte an element)."""
    return (
        t.is_floating_point() or t.is_complex()
    ) and t.untyped_storage().nbytes() >= numel * t.element_size()


def _sparse_input(x: torch.Tensor, grad: bool):
    """A COO SparseTensor of ``x``'s values at about a quarter of its elements (fill: its first element)."""
    g = torch.Generator().manual_seed(0)
    keep = torch.rand(x.shape, generator=g) < 0.25
    keep.view(-1)[0] = True
    idx = keep.nonzero().T
    v = x.detach()[keep].clone().requires_grad_(grad)
    return sparsefill.sparse_coo_tensor(
        idx, v, x.shape, fill_value=float(x.detach().reshape(-1)[-1])
    )


def _dense_bytes(flat) -> int:
    return sum(t.untyped_storage().nbytes() for t in flat if _has_storage(t))


def _loss(out):
    terms = [
        t.sum()
        for t in tree_flatten(out)[0]
        if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()
    ]
    return sum(terms[1:], terms[0]) if terms else None


def _run(op) -> tuple[str, str]:
    samples = op.sample_inputs("cpu", torch.float64, requires_grad=False)
    sample = next(iter(samples), None)
    x = None if sample is None else sample.input
    rest = None
    if isinstance(x, (list, tuple)) and x:
        x, rest = x[0], list(x[1:])
    if not (
        isinstance(x, torch.Tensor)
        and x.dtype == torch.float64
        and x.layout is torch.strided
        and x.numel() > 1
    ):
        return "n/a", ""
    A = _sparse_input(x, op.supports_autograd)
    inp = A if rest is None else [A, *rest]
    args, kwargs = sample.args, sample.kwargs
    limit = x.numel() * 8 - 1
    allowed = limit + _dense_bytes(tree_flatten((rest, args, kwargs))[0])
    log = AllocationLog(x.numel())
    try:
        with sparsefill.densify_policy("raise", limit_bytes=limit), log:
            out = op(inp, *args, **kwargs)
            allowed += _dense_bytes(tree_flatten(out)[0])
            loss = _loss(out) if op.supports_autograd else None
            if loss is not None:
                loss.backward()
    except DensifyError as e:
        assert re.search(r"\d+ bytes", str(e)), str(e)
        outcome, why = "DensifyError", str(e)[:200]
    except Exception as e:  # noqa: BLE001 - the op's own error on this input (tests/opinfo/test_opinfo.py compares them)
        outcome, why = "rejects", f"{type(e).__name__}: {str(e)[:200]}"
    else:
        outcome, why = "native", ""
    if log.largest[0] > allowed:
        return (
            "violates",
            f"{log.largest[1]} allocated {log.largest[0]} bytes, the limit is {limit} ({outcome})",
        )
    return outcome, why


def _key(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


@pytest.mark.parametrize("op", OPS, ids=[_key(op) for op in OPS])
def test_densify_policy_holds(op):
    key = _key(op)
    outcome, why = _run(op)
    if key in DECLARED:
        assert outcome == "violates", (
            f"{key} no longer allocates past the limit ({outcome}): remove it from DECLARED"
        )
        outcome = "declared"
    OUTCOMES[key] = outcome
    COUNTS[outcome] += 1
    assert outcome != "violates", why
