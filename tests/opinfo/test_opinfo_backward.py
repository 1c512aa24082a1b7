"""Backward conformance over PyTorch's OpInfo database: the gradients of the constructor's leaves::

    grad(values, fill) of (op(A, ...) * W).sum()  ==  grad(values, fill) of (op(D, ...) * W).sum()
    A = sparse_coo_tensor(idx, values, shape, fill_value=fill)        (CSR: A.to_sparse_csr())
    D = torch.where(mask, zeros.index_put(idx, values), fill)        (the same leaves, dense)

so the gradient of ``values`` is the dense gradient read at the pattern and that of ``fill`` the dense
gradient summed over the unspecified elements.  ``W`` is a fixed random upstream gradient over the
result's dense form (``out.to_dense()`` for a SparseTensor result).

For every op of ``op_db`` with autograd (``op.supports_autograd``) and float64, the first
``MAX_SAMPLES`` (= 2, to keep this module near a minute on 2 cores) samples with ``requires_grad=True``;
the sample's input (the first tensor of a sequence input: ``cat``, ``stack``...) becomes the SparseTensor
(its other tensor arguments are detached: only the gradients of ``values`` and ``fill`` are compared
here), in each variant:

* ``coo``: ~half the elements unspecified, the fill a scalar leaf (the input's first element);
* ``csr``: the same on 2-d inputs, converted with ``to_sparse_csr()`` (the gradient flows through it);
* ``hybrid``: one trailing dense dim, the fill a random array leaf over it (inputs of 2 dims or more);
* ``nan``: a NaN scalar fill;
* ``indefinite``: no fill leaf; the loss is the masked sum ``(out.to_dense(fill_value=0) * W).sum()``
  over the result's pattern.  Element-wise ops (``unary_ufuncs``, ``binary_ufuncs``; a result broadcast
  past the input's shape is ``n/a``): the reference is ``(op(D) * W * mask).sum()`` (the masked-out
  elements never reach the gradient of ``values``); the reductions of ``MASKED_REDUCTIONS``: the
  reference is ``torch.masked.<name>(D, ..., mask=mask)``.  Other ops on an indefinite fill are ``n/a``
  here (var/std/norm take other arguments in ``torch.masked``; ``tests/ops/reductions/test_backward_reductions.py``
  checks them).

Outcomes per (op, variant, sample), printed at the end of the run (``conftest.py``):

* ``native``: gradients match, no DensifyWarning forward or backward;
* ``densify-backward``: gradients match, the forward ran natively but the backward densified: the op's
  test fails (every backward is as sparse as its forward) unless the variant is declared;
* ``densify``: gradients match, the forward densified (and so, usually, the backward);
* ``declared``: an op of ``DECLARED_BACKWARD`` failed, or densified in backward only, in a declared variant
  (the reason is printed);
* ``n/a``: the variant does not apply (no float64 input of a shape the variant needs, or no output
  with a gradient);
* ``ref-rejects``: the dense forward or backward raises on the sample (the forward test checks that
  the sparse call raises too).

Wrong gradients, or a sparse forward/backward that raises where the dense one does not, fail the op's test.
"""

from __future__ import annotations

import collections
import itertools
import warnings

import pytest
import torch
from torch.testing._internal.common_methods_invocations import binary_ufuncs, op_db, unary_ufuncs
from torch.utils._pytree import tree_flatten, tree_map

import sparsefill
from sparsefill import SparseTensor

MAX_SAMPLES = 2
# ops whose later samples reach cases the first ones do not: op name -> samples run
MORE_SAMPLES = {
    "masked_fill": 5,  # sample 4: every operand 0-d (masked_fill's value must stay 0-d)
    "combinations": 17,  # sample 16: r = 4, a keepdim sum whose size-1 dense dims a view drops
    "native_group_norm": 12,
}  # samples 8-11: a (1, C) hybrid, whose backward unsqueeze_s in place
REPORT: dict = collections.defaultdict(
    collections.Counter
)  # op id -> Counter of (variant, outcome)
VARIANTS = ("coo", "csr", "hybrid", "nan", "indefinite")
ELEMENTWISE = {id(op) for op in unary_ufuncs + binary_ufuncs}
# reductions whose masked meaning torch.masked gives with the same arguments (dim, keepdim): the reference
MASKED_REDUCTIONS = ("sum", "prod", "amax", "amin", "mean", "logsumexp")

# Failures measured on the first run of this sweep (torch 2.13), each a defect to fix in the library, not
# in the test, and backwards that densify by nature where the forward did not: op id -> (reason, the variants
# whose failures and ``densify-backward`` outcomes are recorded ``declared``).  Either in another variant
# still fails the test; a declared op that passes is reported ``native``/``densify``.
DECLARED_BACKWARD = {
    "prod": (
        "prod(A, dim) on an indefinite fill (3-d, some slices partly stored): its backward reaches an aten "
        "call that falls back to densify_call, which raises ValueError (to_dense() of an indefinite fill); "
        "the full prod and the dense reference (torch.masked.prod) run",
        ("indefinite",),
    ),
    "nn.functional.avg_pool1d": (
        "the sweep's upstream gradient is dense (W over the result's dense form), so the input's "
        "gradient is dense by nature: ops/windows/pooling.py's avg_pool2d_backward takes a SparseTensor "
        "gradient natively and leaves a dense one to the densify fallback, announced (by "
        "design: tests/ops/windows/test_windows.py)",
        ("coo", "csr", "nan"),
    ),
    "nn.functional.conv1d": (
        "the result of a random kernel is dense by nature (each output channel its own interior "
        "value), so the upstream gradient is dense: ops/windows/convolution.py's convolution_backward takes a "
        "SparseTensor gradient natively and leaves a dense one to the densify fallback, announced "
        "(by design: tests/ops/windows/test_windows.py)",
        ("coo", "csr", "nan"),
    ),
    "nn.functional.rrelu": (
        "in training mode each element draws its own slope: on an indefinite fill the forward "
        "raises ValueError (the masked-out elements have no value to draw for)",
        ("indefinite",),
    ),
    "mode": (
        "torch.mode's CPU kernel sorts each slice with `<`, which does not order NaN: with a NaN "
        "fill, which element it selects (so where the gradient goes) depends on where the NaNs "
        "stand; sparsefill counts NaN as one value (tests/test_sorting.py)",
        ("nan",),
    ),
}
# Ops whose dense CPU kernels order equal elements in an unspecified way (test_opinfo.TIES): the
# gradient goes to whichever equal element the kernel picked.  Their "coo" fill (the input's first
# element, stored too where the pattern holds it) is moved off every stored value by 0.5, so that
# no stored element ties with the fill's copies (ties among the copies share the fill's gradient).
TIES = ("sort", "argsort", "msort", "topk", "kthvalue", "mode")


def _key(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


class Leaves:
    """The pattern of ``x`` (random, ~half stored) and the leaves ``values``/``fill`` of a variant."""

    def __init__(self, x: torch.Tensor, variant: str, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.variant, self.shape = variant, x.shape
        self.dense_dim = 1 if variant == "hybrid" else 0
        S = x.shape[: x.dim() - self.dense_dim]
        self.mask = torch.rand(S, generator=g) < 0.5
        self.idx = (
            self.mask.nonzero().T
            if x.dim() - self.dense_dim
            else torch.zeros((0, int(self.mask)), dtype=torch.long)
        )
        self.values = (
            x.detach()[self.mask] if self.mask.dim() else x.detach().reshape(1)[: int(self.mask)]
        ).clone()
        D = x.shape[x.dim() - self.dense_dim :]
        flat = x.detach().reshape(-1)
        self.fill = (
            None
            if variant == "indefinite"
            else torch.full((), float("nan"), dtype=x.dtype)
            if variant == "nan"
            else torch.randn(D, dtype=x.dtype, generator=g)
            if variant == "hybrid"
            else (flat[0] if flat.numel() else torch.zeros((), dtype=x.dtype)).clone()
        )

    def leaves(self):
        v = self.values.clone().requires_grad_()
        return v, None if self.fill is None else self.fill.clone().requires_grad_()

    def sparse(self, v, f):
        A = sparsefill.sparse_coo_tensor(
            self.idx, v, self.shape, fill_value=sparsefill.indefinite if f is None else f
        )
        return A.to_sparse_csr() if self.variant == "csr" else A

    def dense(self, v, f):
        z = (
            torch.zeros(self.shape, dtype=v.dtype).index_put(tuple(self.idx), v)
            if self.mask.dim()
            else v.reshape(())[()]
            if self.mask
            else torch.zeros((), dtype=v.dtype)
        )
        m = self.mask.reshape(self.mask.shape + (1,) * self.dense_dim)
        return torch.where(m, z, torch.ones((), dtype=v.dtype) if f is None else f)


def _applies(op, x, variant) -> bool:
    if not (isinstance(x, torch.Tensor) and x.dtype == torch.float64 and x.layout is torch.strided):
        return False
    if variant == "csr":
        return x.dim() == 2
    if variant == "hybrid":
        return x.dim() >= 2
    if variant == "indefinite":
        return id(op) in ELEMENTWISE or op.name in MASKED_REDUCTIONS
    return True


def _detach(o):
    return tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, o)


NOT_ELEMENTWISE = (
    "n/a"  # the result of an indefinite input is broadcast past the input's shape: no pattern
)


def _loss(out, masked_shape=None, mask=None):
    """``sum((out_i * W_i).sum())`` over the floating outputs with a gradient; None if there is none."""
    total, g = None, torch.Generator().manual_seed(1)
    for t in tree_flatten(out)[0]:
        if not (
            isinstance(t, torch.Tensor)
            and t.requires_grad
            and (t.is_floating_point() or t.is_complex())
        ):
            continue
        if isinstance(t, SparseTensor):
            t = t.to_dense(fill_value=0.0) if t.is_fill_indefinite() else t.to_dense()
        elif mask is not None:  # the dense reference of an indefinite input: the masked sum
            if t.shape != mask.shape:
                return NOT_ELEMENTWISE
            t = torch.where(mask, t, 0.0)
        W = torch.randn(t.shape, dtype=t.real.dtype, generator=g)
        term = (t.real * W).sum() if t.is_complex() else (t * W).sum()
        total = term if total is None else total + term
    return total


def _grads(op, lv, args, kwargs, sparse, rest=None):
    """Gradients of (values, fill) and whether a DensifyWarning came (forward, backward).
    ``rest``: the other tensors of a sequence input (``cat``, ``stack``...), the first one made sparse."""
    v, f = lv.leaves()
    inp = lv.sparse(v, f) if sparse else lv.dense(v, f)
    if rest is not None:
        inp = [inp, *rest]
    with warnings.catch_warnings(record=True) as fw:
        warnings.simplefilter("always")
        torch.manual_seed(0)
        reduction = lv.fill is None and op.name in MASKED_REDUCTIONS
        if reduction and not sparse:  # the masked reference of an indefinite input
            out = getattr(torch.masked, op.name)(inp, *args, mask=lv.mask, **kwargs)
        else:
            out = op(inp, *args, **kwargs)
    mask = None if (sparse or lv.fill is not None or reduction) else lv.mask
    loss = _loss(out, mask=mask)
    if loss is None or loss is NOT_ELEMENTWISE:
        return None
    with warnings.catch_warnings(record=True) as bw:
        warnings.simplefilter("always")
        loss.backward()
    dens = [any(issubclass(w.category, sparsefill.DensifyWarning) for w in ws) for ws in (fw, bw)]
    zero = lambda t, ref: torch.zeros_like(ref) if t is None else t  # noqa: E731 - no path to the leaf: a zero gradient
    return (zero(v.grad, v), None if f is None else zero(f.grad, f)), dens


def _run(op, sample, variant, seed):
    x, rest = sample.input, None
    if isinstance(x, (list, tuple)) and x:  # a sequence of tensors: the first one becomes sparse
        x, rest = x[0], _detach(list(x[1:]))
    if not _applies(op, x, variant):
        return "n/a"
    lv = Leaves(x, variant, seed)
    if op.name in TIES and variant == "coo":
        lv.fill = lv.fill + 0.5
    args, kwargs = _detach(sample.args), _detach(sample.kwargs)
    try:
        ref = _grads(op, lv, args, kwargs, sparse=False, rest=rest)
    except Exception:  # noqa: BLE001 - the dense op rejects the sample (the forward test checks the sparse call)
        return "ref-rejects"
    if ref is None:
        return "n/a"
    got = _grads(op, lv, args, kwargs, sparse=True, rest=rest)
    assert got is not None, (
        "the sparse result has no output with a gradient where the dense one has"
    )
    (gv, gf), (fwd_dens, bwd_dens) = got
    (rv, rf), _ = ref
    torch.testing.assert_close(gv, rv, equal_nan=True, msg=lambda m: f"grad of values: {m}")
    if rf is not None:
        torch.testing.assert_close(gf, rf, equal_nan=True, msg=lambda m: f"grad of fill: {m}")
    return "densify" if fwd_dens else "densify-backward" if bwd_dens else "native"


OPS = [op for op in op_db if op.supports_autograd and op.supports_dtype(torch.float64, "cpu")]


@pytest.mark.parametrize("op", OPS, ids=[_key(op) for op in OPS])
def test_backward_conformance(op):
    key = _key(op)
    n = MORE_SAMPLES.get(op.name, MAX_SAMPLES)
    # (the first n samples only: some ops generate hundreds)
    samples = list(itertools.islice(op.sample_inputs("cpu", torch.float64, requires_grad=True), n))
    failures = []
    for variant in VARIANTS:
        for seed, sample in enumerate(samples):
            declared = variant in DECLARED_BACKWARD.get(key, ("", ()))[1]
            try:
                outcome = _run(op, sample, variant, seed)
            except Exception as e:  # noqa: BLE001 - collected and reported below
                outcome = "declared" if declared else "FAIL"
                if not declared:
                    failures.append(
                        f"[{variant}, sample {seed}] {type(e).__name__}: {str(e)[:300]}"
                    )
            if outcome == "densify-backward":
                if declared:
                    outcome = "declared"
                else:  # recorded as such (the summary names the variant) and failed
                    failures.append(
                        f"[{variant}, sample {seed}] the forward ran natively but the backward densified "
                        "(a DensifyWarning in backward): make it native or declare it with a reason"
                    )
            REPORT[key][(variant, outcome)] += 1
    if not samples:
        REPORT[key][("-", "no samples")] += 1
    assert not failures, "\n".join(failures)
