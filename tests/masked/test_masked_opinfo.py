"""``sparsefill.masked`` against ``torch.masked`` over PyTorch's OpInfo ``masked.*`` entries.

For every op and every float64 sample (masks included), the input is made sparse in each INPUT
variant (~half of its elements set to the variant's fill, so the sparse tensor has unspecified
elements; the dense reference uses the same values) and the mask is passed in each MASK variant.
Invariant checked at every output position with at least one masked-in element::

    densify(sparsefill.masked.op(sparse input, ..., mask=mask variant))
        == torch.masked.op(dense input, ..., mask=dense mask)                (assert_close, equal_nan)

with no ``sparsefill.DensifyWarning``.  An indefinite-fill input is a masked tensor: its reference
mask is ``pattern & mask``.  Samples that cannot be supported are listed in ``DECLARED`` with the
reason and printed in the summary at the end of the run; nothing is skipped silently.
"""

from __future__ import annotations

import collections
import warnings

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

import sparsefill
from sparsefill import SparseTensor
from sparsefill import masked as M

OPS = [op for op in op_db if op.name.startswith("masked.")]
REPORT: dict = collections.defaultdict(collections.Counter)  # op -> Counter of outcome
PAIRS: dict = collections.defaultdict(set)  # op -> (input variant, mask variant) pairs checked


# Samples not supported on sparse inputs: op -> (reason, predicate on the sample).  The sparse call must
# raise ValueError for them; the summary prints every entry and how many samples it caught.  None today
# (negative finite norm orders, the last entry, are supported: test_masked.py checks them).
DECLARED: dict = {}
DECLARED_HITS: collections.Counter = collections.Counter()


def _declared(name, sample):
    """The reason a sample is not supported on sparse inputs, or None."""
    reason, pred = DECLARED.get(name, (None, None))
    return reason if pred is not None and pred(sample) else None


INPUTS = {
    # name: (layout, dense_dim, fill) ; fill "first" = the first dense slice (an array fill)
    "sf-coo fill 0": (torch.sparse_coo, 0, 0.0),
    "sf-coo fill 1.5": (torch.sparse_coo, 0, 1.5),
    "sf-csr fill -0.5": (torch.sparse_csr, 0, -0.5),
    "sf-hybrid array fill": (torch.sparse_coo, 1, "first"),
    "sf-indefinite": (torch.sparse_coo, 0, "indefinite"),
    "native-coo": ("native", torch.sparse_coo, 0.0),
    "native-csr": ("native", torch.sparse_csr, 0.0),
}
MASKS = ["strided", "native-coo", "sf-csr"]
LOGADDEXP_BOTH_SPARSE = {"sf-coo fill 1.5", "native-coo", "sf-csr fill -0.5"}


def _sparsify(x, variant, gen):
    """``(sparse input, dense values, pattern or None)`` or None when the variant does not apply."""
    spec = INPUTS[variant]
    if spec[0] == "native":
        layout = spec[1]
        if layout is torch.sparse_csr and x.dim() < 2:  # (3-d: batched CSR)
            return None
        xm = x.clone()
        # (batched CSR: torch wants the same nse per batch, so the dropped positions repeat per batch)
        drop = (
            torch.rand(x.shape if layout is torch.sparse_coo else x.shape[-2:], generator=gen) < 0.5
        )
        xm[drop.expand(x.shape)] = 0.0
        xm[(xm == 0) & ~drop.expand(x.shape)] = (
            1.0  # (no stray zeros: they would change a batch's nse)
        )
        return (xm.to_sparse() if layout is torch.sparse_coo else xm.to_sparse_csr()), xm, None
    layout, dd, fill = spec
    if x.dim() < (2 if layout is torch.sparse_csr else 0) + dd or (dd and x.dim() < 2):
        return None
    xm = x.clone()
    drop = torch.rand(x.shape[: x.dim() - dd], generator=gen) < 0.5
    if fill == "indefinite":
        idx = (~drop).nonzero().T
        A = sparsefill.sparse_coo_tensor(idx, xm[~drop], x.shape, fill_value=sparsefill.indefinite)
        return A, xm, ~drop
    if fill == "first":
        f = xm.flatten(0, -2)[0].clone() if xm.numel() else torch.zeros(x.shape[-1:], dtype=x.dtype)
    else:
        f = torch.tensor(fill, dtype=x.dtype)
    xm[drop] = f
    return sparsefill.to_sparse(xm, fill_value=f, layout=layout, dense_dim=dd), xm, None


def _mask_variant(mask, variant):
    if mask is None or variant == "strided":
        return mask
    if variant == "native-coo":
        return mask.to_sparse()
    if mask.dim() < 2:
        return None
    return sparsefill.to_sparse(mask, layout=torch.sparse_csr)


def _densify(t):
    if isinstance(t, SparseTensor):
        return t.to_dense(fill_value=float("nan")) if t.is_fill_indefinite() else t.to_dense()
    return t.to_dense() if t.layout is not torch.strided else t


_CACHE: dict = {}  # (id(sample), input variant or mask variant) -> conversions shared by the mask variants


def _cached(key, make):
    if key not in _CACHE:
        _CACHE[key] = make()
    return _CACHE[key]


def _check_sample(op, sample, in_variant, mask_variant, seed):
    """Outcome string; raises AssertionError on a mismatch."""
    name = op.name.split(".", 1)[1]
    gen = torch.Generator().manual_seed(seed)
    conv = _cached((id(sample), in_variant), lambda: _sparsify(sample.input, in_variant, gen))
    if conv is None:
        return "n/a"
    A, xm, pattern = conv
    kwargs = dict(sample.kwargs)
    args = list(sample.args)
    ref_args = list(args)
    if name == "logaddexp" and in_variant in LOGADDEXP_BOTH_SPARSE:  # the other operand sparse too
        conv_o = _cached(
            (id(sample), in_variant, "other"),
            lambda: _sparsify(args[0], in_variant, torch.Generator().manual_seed(seed + 1000)),
        )
        if conv_o is None or conv_o[2] is not None:
            return "n/a"
        args[0], ref_args[0] = conv_o[0], conv_o[1]
    mask_keys = ["input_mask", "other_mask"] if name == "logaddexp" else ["mask"]
    ref_kwargs, sp_kwargs = dict(kwargs), dict(kwargs)
    for key in mask_keys:
        mk = kwargs.get(key)
        mv = _cached((id(sample), key, mask_variant), lambda: _mask_variant(mk, mask_variant))
        if mk is not None and mv is None:
            return "n/a"
        sp_kwargs[key] = mv
    if pattern is not None:  # indefinite fill: the pattern is the mask
        base = kwargs.get(mask_keys[0])
        ref_kwargs[mask_keys[0]] = pattern if base is None else pattern & base.expand(pattern.shape)
    reason = _declared(name, sample)
    ref_op = getattr(torch.masked, name)
    try:
        ref = _cached((id(sample), in_variant, "ref"), lambda: ref_op(xm, *ref_args, **ref_kwargs))
    except Exception:  # noqa: BLE001 - the dense op rejects the sample: so must we
        with pytest.raises(Exception):
            getattr(M, name)(A, *args, **sp_kwargs)
        return "ref-rejects"
    if reason is not None:
        with pytest.raises(ValueError):
            getattr(M, name)(A, *args, **sp_kwargs)
        DECLARED_HITS[name] += 1
        return "declared"
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        out = getattr(M, name)(A, *args, **sp_kwargs)
    if isinstance(out, SparseTensor):
        assert out.sparse_layout in (
            torch.sparse_coo,
            A.sparse_layout if isinstance(A, SparseTensor) else A.layout,
        )
    got = _densify(out)
    assert got.shape == ref.shape and got.dtype == ref.dtype, (
        got.shape,
        ref.shape,
        got.dtype,
        ref.dtype,
    )
    where = _compared_positions(name, out, ref.shape, pattern)
    g, r = got[where], ref[where]
    if not (
        g.dtype.is_floating_point and torch.allclose(g, r, rtol=1e-7, atol=1e-7, equal_nan=True)
    ):
        torch.testing.assert_close(
            g, r, equal_nan=True, atol=1e-7, rtol=1e-7
        )  # (the slow path explains)
    return "ok"


def _output_positions(name, x, args, kwargs, shape):
    """Output positions with at least one masked-in element."""
    if name == "logaddexp":
        ms = [kwargs.get(k) for k in ("input_mask", "other_mask")]
        if any(m is None for m in ms):
            return torch.ones(shape, dtype=torch.bool)
        return (ms[0] | ms[1]).expand(shape)
    mask = kwargs.get("mask")
    if mask is None:
        return torch.ones(shape, dtype=torch.bool)
    fn = getattr(torch.masked, name)
    out = torch.masked._ops._output_mask(fn, x, *args, **kwargs)
    return out.expand(shape) if out.shape != shape else out


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny tensors: on 2 busy cores an intra-op thread pool wait costs ~15 ms per parallel kernel."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module", autouse=True)
def _summary(request):
    class Summary:
        def pytest_terminal_summary(self, terminalreporter):
            tr = terminalreporter
            tr.section("sparsefill.masked vs torch.masked (OpInfo samples)")
            for key, c in sorted(REPORT.items()):
                tr.write_line(
                    f"{key}: {dict(c)}; (input x mask) layout pairs checked: {len(PAIRS[key])}"
                )
            for name, (reason, _) in sorted(DECLARED.items()):
                tr.write_line(
                    f"declared unsupported on sparse inputs: masked.{name} ({reason}): "
                    f"{DECLARED_HITS[name]} samples"
                )

    plugin = Summary()
    request.config.pluginmanager.register(plugin, "sparsefill-masked-summary")
    yield


def _with_masks(samples):
    """The samples again with a random mask of the input's shape."""
    from torch.testing._internal.opinfo.core import SampleInput

    g = torch.Generator().manual_seed(7)
    return [
        SampleInput(
            s.input,
            args=s.args,
            kwargs={**s.kwargs, "mask": torch.rand(s.input.shape, generator=g) < 0.6},
        )
        for s in samples
    ]


def _signature(sample):
    """Shapes and non-tensor arguments of a sample (and whether it has a mask): OpInfo repeats some with
    fresh random values only."""

    def sig(v):
        return ("T", tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else repr(v)

    return (
        sig(sample.input),
        tuple(sig(a) for a in sample.args),
        tuple(sorted((k, sig(v)) for k, v in sample.kwargs.items())),
    )


@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
def test_masked_layout_invariance(op):
    """Every distinct sample x every input variant x every mask layout (strided, COO, CSR)."""
    samples = list(op.sample_inputs("cpu", torch.float64, requires_grad=False))
    assert samples
    if (
        not any(sample.kwargs.get("mask") is not None for sample in samples)
        and op.name != "masked.logaddexp"
    ):
        samples += _with_masks(samples)  # (masked.normalize's samples have none)
    seen, failures = set(), []
    for seed, sample in enumerate(samples):
        key = _signature(sample)
        if key in seen:
            REPORT[op.name]["repeated sample"] += 1
            continue
        seen.add(key)
        _CACHE.clear()
        has_mask = any(
            sample.kwargs.get(k) is not None for k in ("mask", "input_mask", "other_mask")
        )
        for iv in INPUTS:
            for mv in MASKS if has_mask else ["strided"]:  # (mask=None: no mask layout to vary)
                try:
                    outcome = _check_sample(op, sample, iv, mv, seed)
                except Exception as e:  # noqa: BLE001 - collected and reported below
                    outcome = "FAIL"
                    kw = {
                        k: (tuple(v.shape) if isinstance(v, torch.Tensor) else v)
                        for k, v in sample.kwargs.items()
                    }
                    failures.append(
                        f"[{iv}, mask {mv}, sample {seed}: input {tuple(sample.input.shape)} kwargs {kw}] "
                        f"{type(e).__name__}: {str(e)[:400]}"
                    )
                REPORT[op.name][outcome] += 1
                if outcome == "ok":
                    PAIRS[op.name].add((iv, mv))
    _CACHE.clear()
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:15])


NORMALIZATIONS = {"softmax", "log_softmax", "softmin", "normalize", "cumsum", "cumprod"}


def _compared_positions(name, out, shape, pattern):
    """Every output position (the drop-in promise), except the unspecified elements of a normalization's
    result for an indefinite-fill input (they have no value: the result keeps the input's pattern)."""
    if (
        pattern is not None
        and name in NORMALIZATIONS
        and isinstance(out, SparseTensor)
        and out.is_fill_indefinite()
    ):
        return pattern.expand(shape)
    return torch.ones(shape, dtype=torch.bool)
