"""Layout invariance over PyTorch's OpInfo database::

    densify(op(A, ...)) == op(A.to_dense(), ...)          (assert_close, equal_nan=True)

For every op of ``op_db`` that supports float64, up to ``MAX_SAMPLES`` sample
inputs; the float64 strided tensors of each sample become SparseTensors in each
variant below, holding the same dense values.  The outcome of every (op, variant,
sample) is recorded and printed at the end of the run (``conftest.py``):

* ``native``  — the result matched and no DensifyWarning was emitted;
* ``densify`` — the result matched, computed (partly) by the densify fallback;
* ``declared`` — an op in ``DECLARED`` behaved as declared there;
* ``n/a``     — the sample has no float64 strided tensor of a shape the variant needs;
* ``ref-rejects`` — the dense op raises on the sample; the sparse call must raise too.

A mismatch, or an exception from the sparse call that the dense call does not
raise, fails the op's test.
"""

from __future__ import annotations

import collections
import itertools
import warnings

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

import sparsefill
from sparsefill import SparseTensor

MAX_SAMPLES = 4
# ops whose later samples reach cases the first ones do not: op name -> samples run
MORE_SAMPLES = {
    "masked_fill": 8,  # sample 4: every operand 0-d (masked_fill's value must stay 0-d)
    "hash_tensor": 20,
}  # its dims and keepdim forms (the xor closed form over stored values)
REPORT: dict = collections.defaultdict(
    collections.Counter
)  # op id -> Counter of (variant, outcome)
NO_FLOAT64 = sorted(op.name for op in op_db if not op.supports_dtype(torch.float64, "cpu"))

# Ops whose sparse behaviour differs from the dense one by design: (reason, the check that holds instead).
#   meta:        uninitialized output; shapes and dtypes are compared
#   fixed-shape: where the dense op changes the input's shape, the sparse call raises ValueError
#   nan-crashes: the dense kernel crashes the process on the "nan" variant's input (torch 2.13 + MKL: linalg.eigvals
#                of a partly-NaN matrix segfaults in DGEBAL on some CPUs, seen here); the sparse call must raise
#                RuntimeError there (it goes through linalg_eig, which rejects NaN), the dense one is not run
#   low-rank:    (U, S, V) of a low-rank SVD: compared by S and U diag(S) V^H (singular vectors of
#                near-equal or near-zero singular values are not unique: rounding picks others)
DECLARED = {
    "pca_lowrank": (
        "singular vectors of a (near-)degenerate spectrum are not unique: S and U diag(S) V^H are "
        "compared",
        "low-rank",
    ),
    "svd_lowrank": (
        "singular vectors of a (near-)degenerate spectrum are not unique: S and U diag(S) V^H are "
        "compared",
        "low-rank",
    ),
    "empty_like": ("uninitialized output", "meta"),
    "new_empty": ("uninitialized output", "meta"),
    "new_empty_strided": ("uninitialized output", "meta"),
    "resize_": (
        "a SparseTensor's shape is fixed: resize_ to another shape raises ValueError",
        "fixed-shape",
    ),
    "resize_as_": (
        "a SparseTensor's shape is fixed: resize_as_ to another shape raises ValueError",
        "fixed-shape",
    ),
    "linalg.eigvals": (
        "torch itself sends tensor subclasses through linalg_eig, which rejects NaN/inf inputs; the "
        "dense kernel segfaults on them here (MKL DGEBAL), so its nan variant is not run",
        "nan-crashes",
    ),
}

# Ops whose dense CPU kernels order equal elements in an unspecified way (torch.sort with
# stable=False past 16 elements, topk, kthvalue: introselect; mode: std::sort with ``<``, which
# does not order NaN): sparsefill gives the stable order. Checked instead: the values match
# (mode: in the slices without NaN) and every index selects an element equal to its value.
# op name -> (where dim, keepdim sit: position in args, keyword, default)
TIES = {
    "sort": ((0, "dim", -1), None),
    "argsort": ((0, "dim", -1), None),
    "topk": ((1, "dim", -1), None),
    "kthvalue": ((1, "dim", -1), (2, "keepdim", False)),
    "mode": ((0, "dim", -1), (1, "keepdim", False)),
}


def _arg(args, kwargs, where):
    pos, name, default = where
    return args[pos] if len(args) > pos else kwargs.get(name, default)


def _check_ties(op, dense, out, ref):
    """The TIES check: values as dense torch's, indices selecting equal elements."""
    x, args, kwargs = dense
    dim_at, keep_at = TIES[op.name]
    dim = _arg(args, kwargs, dim_at)
    keep = True if keep_at is None else _arg(args, kwargs, keep_at)
    if op.name == "argsort":
        out, ref = (None, out), (x.gather(dim, ref) if x.dim() else x, ref)
    vals, idx = out
    if x.dim() == 0:
        torch.testing.assert_close(idx, torch.zeros_like(idx))
        return
    sel = x.gather(dim, idx if keep else idx.unsqueeze(dim))
    picked = ref[0] if vals is None else vals
    torch.testing.assert_close(sel, picked if keep else picked.unsqueeze(dim), equal_nan=True)
    if op.name == "mode":  # (torch's NaN order is where they stand: slices without NaN)
        clean = ~torch.isnan(x).any(dim, keepdim=keep)
        vals, ref = vals[clean], ref[0][clean]
    if vals is not None:
        torch.testing.assert_close(vals, ref if op.name == "mode" else ref[0], equal_nan=True)


def _sparsify(x: torch.Tensor, variant: str, gen: torch.Generator):
    """``(A, x')``: ``x'`` is ``x`` with ~half its elements (dense slices) set to a fill, ``A`` its SparseTensor.

    ``uncoalesced``: COO with every stored element followed, in shuffled order, by a zero-valued duplicate."""
    layout = torch.sparse_csr if variant == "csr" else torch.sparse_coo
    dense_dim = 1 if variant == "hybrid" else 0
    if x.dim() < {"csr": 2, "hybrid": 2}.get(variant, 0):
        return None
    flat = x.flatten(0, -2) if dense_dim else x.reshape(-1)
    if variant == "nan":
        fill = torch.tensor(float("nan"), dtype=x.dtype)
    elif flat.shape[0]:
        fill = flat[0].clone()
    else:
        fill = torch.zeros(x.shape[x.dim() - dense_dim :], dtype=x.dtype)
    xm = x.detach().clone()
    mask = torch.rand(x.shape[: x.dim() - dense_dim], generator=gen) < 0.5
    xm[mask] = fill
    A = sparsefill.to_sparse(xm, fill_value=fill, layout=layout, dense_dim=dense_dim)
    if variant == "uncoalesced":
        idx, v = A.indices(), A.values()
        perm = torch.randperm(2 * v.shape[0], generator=gen)
        A = sparsefill.sparse_coo_tensor(
            torch.cat([idx, idx], 1)[:, perm],
            torch.cat([v, torch.zeros_like(v)])[perm],
            x.shape,
            fill_value=fill,
        )
    return A, xm


# variant -> which tensors of a sample become sparse: the input only, or every float64 tensor
VARIANTS = {"coo": "input", "csr": "input", "hybrid": "input", "nan": "input", "coo-all": "all"}


def _convert_sample(sample, variant, seed, dtype=torch.float64):
    """``(sparse (input, args, kwargs), dense (input, args, kwargs))`` or None when not applicable.
    Strided tensors of ``dtype`` become SparseTensors."""
    gen = torch.Generator().manual_seed(seed)
    base = variant.split("-")[0]
    everything = VARIANTS.get(variant, "input") == "all"
    scope = (sample.input, sample.args, sample.kwargs) if everything else (sample.input,)
    flat, spec = tree_flatten(scope)
    sp, dn, hit = [], [], False
    for t in flat:
        ok = isinstance(t, torch.Tensor) and t.dtype == dtype and t.layout is torch.strided
        pair = _sparsify(t, base, gen) if ok else None
        hit |= pair is not None
        sp.append(pair[0] if pair else t)
        dn.append(pair[1] if pair else t)
    if not hit:
        return None
    rest = () if everything else (sample.args, sample.kwargs)
    (s_in, *s_rest), (d_in, *d_rest) = tree_unflatten(sp, spec), tree_unflatten(dn, spec)
    return (s_in, *(s_rest or rest)), (d_in, *(d_rest or rest))


def _densify(o):
    def f(t):
        if isinstance(t, SparseTensor):
            return t.to_dense()
        if isinstance(t, torch.Tensor) and t.layout is not torch.strided:
            return t.to_dense()
        return t

    return tree_map(f, o)


def _clone(o):
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, o)


def _call(op, inp, args, kwargs):
    torch.manual_seed(0)
    return op(inp, *args, **kwargs)


REJECTS = (
    object()
)  # what _reference returns when the dense op rejects the sample (and so did the sparse call)


def _reference(op, dense, sparse):
    """The dense result of ``op`` on ``dense``; if the dense op raises, the sparse call must raise too: REJECTS."""
    try:
        return _call(op, *_clone(dense))
    except Exception:  # noqa: BLE001 - the dense op rejects the sample: the sparse call must reject it too
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(Exception):
                _call(op, *sparse)
        return REJECTS


def _run(op, sample, variant, seed):
    """Outcome of one (op, variant, sample); raises AssertionError on a mismatch."""
    conv = _convert_sample(sample, variant, seed)
    if conv is None:
        return "n/a"
    (s_in, s_args, s_kw), dense = conv
    check = DECLARED.get(op.name, ("", None))[1]
    if (
        check == "nan-crashes"
        and variant == "nan"
        and any(t.isnan().any() for t in tree_flatten(dense)[0] if isinstance(t, torch.Tensor))
    ):
        with pytest.raises(RuntimeError):
            _call(op, s_in, s_args, s_kw)
        return "declared"
    ref = _reference(op, dense, (s_in, s_args, s_kw))
    if ref is REJECTS:
        return "ref-rejects"
    if check == "fixed-shape" and ref.shape != dense[0].shape:
        with pytest.raises(ValueError):
            _call(op, s_in, s_args, s_kw)
        return "declared"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = _call(op, s_in, s_args, s_kw)
    out, ref = _densify(out), _densify(ref)
    if check == "low-rank":
        (u, sv, v), (ru, rs, rv) = out, ref
        torch.testing.assert_close(sv, rs, equal_nan=True)

        def rebuild(u, s, v):
            return u @ torch.diag_embed(s).to(u.dtype) @ v.mH

        torch.testing.assert_close(rebuild(u, sv, v), rebuild(ru, rs, rv), equal_nan=True)
        return "declared"
    if check == "meta":  # uninitialized output: compare metadata only
        o, r = tree_flatten(out)[0], tree_flatten(ref)[0]
        assert [(t.shape, t.dtype) for t in o] == [(t.shape, t.dtype) for t in r]
        return "declared"
    if op.name in TIES:
        _check_ties(op, dense, out, ref)
    else:
        torch.testing.assert_close(
            out, ref, equal_nan=True, msg=lambda m: f"{op.name} [{variant}]: {m}"
        )
    return (
        "densify"
        if any(issubclass(w.category, sparsefill.DensifyWarning) for w in caught)
        else "native"
    )


OPS = [op for op in op_db if op.supports_dtype(torch.float64, "cpu")]


@pytest.mark.parametrize(
    "op",
    OPS,
    ids=[op.name + (f".{op.variant_test_name}" if op.variant_test_name else "") for op in OPS],
)
def test_layout_invariance(op):
    key = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
    n = MORE_SAMPLES.get(op.name, MAX_SAMPLES)
    # (the first n samples only: some ops generate hundreds)
    samples = list(itertools.islice(op.sample_inputs("cpu", torch.float64, requires_grad=False), n))
    failures = []
    for variant in VARIANTS:
        for seed, sample in enumerate(samples):
            try:
                outcome = _run(op, sample, variant, seed)
            except Exception as e:  # noqa: BLE001 - collected and reported below
                outcome = "FAIL"
                failures.append(f"[{variant}, sample {seed}] {type(e).__name__}: {str(e)[:300]}")
            REPORT[key][(variant, outcome)] += 1
    if not samples:
        REPORT[key][("-", "no samples")] += 1
    assert not failures, "\n".join(failures)
