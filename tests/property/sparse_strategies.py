"""Strategies and checks of the property suite: random SparseTensors and the comparison with dense torch.

Every property is the invariant of the project, on generated inputs::

    op(A, ...) densified == op(A.to_dense(), ...)         (dtype, shape, values; NaN == NaN)

or both raise (torch's error types).  Values compare with ``assert_close`` (the sign of a zero is not
compared: patterns and fills compare with ``==``, README), exactly for integers and bool.  An indefinite
fill compares where the result is specified (``check_masked``).

The value helpers (``scalars``, ``random_values``, ``stored_as``) and the masked comparison are those of
tests/sparse_cases.py, whose ``sparse_cases`` this module's :func:`sparse_tensors` extends to batched
CSR, two dense dims, float16/bfloat16 and duplicate entries holding values.
"""

from __future__ import annotations

import torch
from hypothesis import assume, settings, strategies as st

import sparsefill
from sparsefill import SparseTensor
from tests.sparse_cases import (
    check_masked,
    dense_and_unspecified,
    random_values,
    scalars,
    stored_as,
)


def _profile() -> settings:
    """The profile chosen by ``--hypothesis-profile`` where it is one of this folder's, else ``ci``
    (tests/property/conftest.py registers both)."""
    name = settings.get_current_profile_name()
    return settings.get_profile(name if name in ("ci", "long") else "ci")


SETTINGS = _profile()
FLOATS = [torch.float32, torch.float64]
DTYPES = FLOATS + [torch.int64, torch.bool]
ALL_DTYPES = DTYPES + [torch.float16, torch.bfloat16]
FILLS = ("zero", "value", "array", "indefinite")
DEFINITE = ("zero", "value", "array")
RAISES = (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError, ZeroDivisionError)


@st.composite
def sparse_tensors(
    draw,
    dtypes=DTYPES,
    fills=DEFINITE,
    layouts=("coo", "csr", "bcsr"),
    min_dim=0,
    max_dim=4,
    max_ddim=2,
    sizes=(0, 1, 2, 3, 4),
):
    """A SparseTensor: COO (0 to 3 sparse dims; maybe uncoalesced, duplicates holding values), CSR or batched
    CSR, 0 to ``max_ddim`` trailing dense dims, sizes among ``sizes`` (0 and 1 included), values stored
    plainly or not, a fill among ``fills`` (zero, a scalar among 0, -0.0, NaN, +-inf..., an array over the
    dense dims, indefinite)."""
    dtype = draw(st.sampled_from(dtypes))
    layout = draw(st.sampled_from(layouts))
    sdim = {"coo": draw(st.integers(0, 3)), "csr": 2, "bcsr": 3}[layout]
    ddim = draw(st.integers(0, max_ddim))
    assume(min_dim <= sdim + ddim <= max_dim)
    ssh = tuple(draw(st.lists(st.sampled_from(sizes), min_size=sdim, max_size=sdim)))
    dsh = tuple(draw(st.lists(st.sampled_from(sizes[1:] or sizes), min_size=ddim, max_size=ddim)))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    special = dtype.is_floating_point and draw(st.booleans())
    density = draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]))
    if layout == "bcsr" and ssh[0]:  # (torch's batched CSR: as many elements in every batch)
        row = torch.rand(ssh[1:], generator=g) < density
        mask = row.expand(ssh)
    else:
        mask = torch.rand(ssh, generator=g) < density
    idx = mask.nonzero().T.contiguous()
    vals = random_values(g, (idx.shape[1],) + dsh, dtype, special)
    coalesced = True
    if (
        layout == "coo" and idx.shape[1] and draw(st.booleans())
    ):  # uncoalesced: duplicates, in any order
        dup = torch.randint(0, idx.shape[1], (max(1, idx.shape[1] // 2),), generator=g)
        extra = random_values(g, (dup.numel(),) + dsh, dtype, False)
        if (
            dtype == torch.bool
        ):  # (duplicates of bool add as "or": kept False so the dense tensor is plain)
            extra = torch.zeros_like(extra)
        idx, vals = torch.cat([idx, idx[:, dup]], 1), torch.cat([vals, extra])
        perm = torch.randperm(idx.shape[1], generator=g)
        idx, vals = idx[:, perm], vals[perm]
        coalesced = False
    vals = stored_as(vals, draw(st.sampled_from(["plain", "noncontig", "offset", "neg"])))
    kind = draw(st.sampled_from([k for k in fills if k != "array" or dsh]))
    fill = {
        "zero": torch.zeros((), dtype=dtype),
        "value": torch.tensor(draw(st.sampled_from(_scalars(dtype))), dtype=dtype),
        "array": random_values(g, dsh, dtype, special),
        "indefinite": sparsefill.indefinite,
    }[kind]
    A = sparsefill.sparse_coo_tensor(idx, vals, ssh + dsh, fill_value=fill)
    if layout != "coo":
        A = A.to_sparse_csr(dense_dim=ddim)
    assert A.is_coalesced() or not coalesced
    return A


def _scalars(dtype):
    if dtype in (torch.float16, torch.bfloat16):
        return [0.0, -0.0, 1.0, -2.5, float("nan"), float("inf"), -float("inf")]
    return scalars(dtype)


def dims_of(draw, A, allow_none=True):
    """A dims argument of a reduction: None (all), one dim (maybe negative) or a tuple of distinct dims."""
    n = A.dim()
    choices = ["none"] * allow_none + (["one", "tuple"] if n else [])
    how = draw(st.sampled_from(choices))
    if how == "none":
        return None
    if how == "one":
        d = draw(st.integers(0, n - 1))
        return d - n if draw(st.booleans()) else d
    return tuple(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True)))


def densified(r):
    """A result as plain tensors: a SparseTensor densified, tuples element-wise."""
    if isinstance(r, (tuple, list)):
        return type(r)(densified(x) for x in r)
    if isinstance(r, SparseTensor):
        return r.to_dense()
    if type(r) is torch.nn.Parameter:
        return r.detach().as_subclass(torch.Tensor)
    return r


def assert_same(actual, expected, exact=False):
    """Same structure, types (plain tensors once densified), dtypes, shapes; values close (``exact``: equal),
    NaN == NaN, the sign of a zero not compared."""
    actual = densified(actual)
    if isinstance(expected, (tuple, list)):
        assert isinstance(actual, (tuple, list)) and len(actual) == len(expected), (
            actual,
            expected,
        )
        for a, e in zip(actual, expected):
            assert_same(a, e, exact)
        return
    if not isinstance(expected, torch.Tensor):
        assert actual == expected or (actual != actual and expected != expected), (actual, expected)
        return
    assert type(actual) is torch.Tensor, type(actual)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    tol = {} if not exact else {"rtol": 0, "atol": 0}
    if not exact and expected.dtype in (torch.float16, torch.bfloat16):
        tol = {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(actual, expected, equal_nan=True, **tol)


def outcome(f):
    """``("ok", result)`` or ``("raise", the exception)``."""
    try:
        return "ok", f()
    except RAISES as e:
        return "raise", e


def agree(sparse_f, dense_f, exact=False):
    """``sparse_f()`` densified equals ``dense_f()``, or both raise; returns the sparse result (None if raised)."""
    (ks, s), (kd, d) = outcome(sparse_f), outcome(dense_f)
    assert ks == kd, f"sparse: {ks} {s!r:.300}\ndense: {kd} {d!r:.300}"
    if ks == "ok":
        assert_same(s, d, exact)
        return s
    return None


def agree_masked(A, sparse_f, dense_f):
    """An element-wise op of a SparseTensor that may be indefinite: ``agree`` where it is definite, else the
    result is unspecified exactly where ``A`` is and dense's elsewhere (or both raise; an op dense raises on for
    an element masked out may give a result)."""
    x, unspecified = dense_and_unspecified(A)
    if unspecified is None:
        return agree(lambda: sparse_f(A), lambda: dense_f(x))
    (ks, R), (kd, expected) = outcome(lambda: sparse_f(A)), outcome(lambda: dense_f(x))
    assert ks == kd or ks == "ok", (ks, kd, R)
    if ks == kd == "ok" and isinstance(R, SparseTensor) and R.shape == x.shape:
        check_masked(R, expected, unspecified, signed_zeros=False)
    return R


__all__ = [
    "SETTINGS",
    "FLOATS",
    "DTYPES",
    "ALL_DTYPES",
    "FILLS",
    "DEFINITE",
    "RAISES",
    "sparse_tensors",
    "dims_of",
    "densified",
    "assert_same",
    "outcome",
    "agree",
    "agree_masked",
    "stored_as",
    "random_values",
]
