"""Random SparseTensors of every storage form and the exact comparison with the dense result, shared by
the element-wise, merge, to_dense, dropout and sampled-product tests and the property suite
(tests/property/sparse_strategies.py extends :func:`sparse_cases`).

The invariant, forward and backward::

    op(A).to_dense() == op(A.to_dense())          same dtype, NaN == NaN, and -0.0 is not 0.0

on COO/CSR/hybrid/uncoalesced/0-d/0-size SparseTensors with zero, nonzero, NaN/inf, array and
indefinite fills, values stored non-contiguous, at an offset, with negative or conjugate bits.
Hypothesis is derandomized (reproducible in CI) with modest example counts (:data:`SETTINGS`).
"""

import torch
from hypothesis import HealthCheck, settings, strategies as st

import sparsefill
from sparsefill import SparseTensor

NAN, INF = float("nan"), float("inf")
SETTINGS = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32, torch.bool, torch.complex64]


def assert_identical(actual, expected, signed_zeros=True):
    """Same type (plain tensor once densified), dtype, shape and elements; NaN == NaN; signed zeros compared."""
    if isinstance(actual, SparseTensor):
        actual = actual.to_dense()
    if type(expected) is torch.nn.Parameter:
        expected = expected.detach().as_subclass(torch.Tensor)
    assert type(actual) is torch.Tensor and type(expected) is torch.Tensor, (
        type(actual),
        type(expected),
    )
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)
    if signed_zeros and (actual.is_floating_point() or actual.is_complex()):
        a, e = (
            torch.view_as_real(t.resolve_conj().resolve_neg()) if t.is_complex() else t
            for t in (actual, expected)
        )
        sa, se = a.signbit() & ~a.isnan(), e.signbit() & ~e.isnan()
        assert torch.equal(sa, se), f"signed zeros differ at {(sa != se).nonzero().tolist()}"


def outcome(f):
    """``("ok", result)`` or ``("raise", exception type)``."""
    try:
        return "ok", f()
    except (RuntimeError, TypeError, ValueError, ZeroDivisionError) as e:
        return "raise", type(e)


def check_same_outcome(sparse_f, dense_f, signed_zeros=True):
    """``sparse_f()`` densified equals ``dense_f()``, or both raise (torch's errors: RuntimeError or TypeError)."""
    (ks, s), (kd, d) = outcome(sparse_f), outcome(dense_f)
    assert ks == kd, (
        f"sparse: {ks} {s if ks == 'raise' else ''}, dense: {kd} {d if kd == 'raise' else ''}"
    )
    if ks == "ok":
        assert_identical(s, d, signed_zeros)


def scalars(dtype):
    if dtype.is_complex:
        return [0j, 1 + 2j, complex(NAN, 0), complex(INF, -1)]
    if dtype.is_floating_point:
        return [0.0, -0.0, 1.0, -2.5, NAN, INF, -INF]
    if dtype == torch.bool:
        return [False, True]
    return [0, 1, -2, 7]


def random_values(g, shape, dtype, special):
    """Small discrete values (repeats common); NaN/inf/-0.0 where ``special``."""
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if not (dtype.is_floating_point or dtype.is_complex):
        return torch.randint(-3, 4, shape, generator=g).to(dtype)
    x = torch.randint(-4, 5, shape, generator=g).double() / 2
    if special:
        pick = torch.rand(shape, generator=g)
        x = torch.where(
            pick < 0.1, NAN, torch.where(pick < 0.2, INF, torch.where(pick < 0.3, -0.0, x))
        )
    if dtype.is_complex:
        x = torch.complex(x, torch.randint(-2, 3, shape, generator=g).double())
    return x.to(dtype)


def stored_as(vals, how):
    """``vals`` (the same elements) stored plainly, non-contiguous, at a storage offset, with a negative or a
    conjugate bit."""
    if how == "noncontig":
        return torch.stack([vals, torch.zeros_like(vals)], -1)[..., 0]
    if how == "offset":
        return torch.cat([vals[:1], vals])[1:] if vals.shape[0] else vals
    if how == "neg" and (vals.is_floating_point() or vals.is_complex()):
        return (-vals)._neg_view()
    if how == "conj" and vals.is_complex():
        return vals.conj_physical().conj()
    return vals


@st.composite
def sparse_cases(draw, dtypes=DTYPES, fills=("zero", "value", "array", "indefinite"), max_sdim=3):
    """A SparseTensor (COO; CSR for 2 sparse dims), every kind of fill, maybe uncoalesced, 0-d or 0-size."""
    dtype = draw(st.sampled_from(dtypes))
    sdim = draw(st.integers(0, max_sdim))
    ssh = tuple(draw(st.lists(st.integers(0, 4), min_size=sdim, max_size=sdim)))
    dsh = (draw(st.integers(1, 3)),) if draw(st.booleans()) else ()
    layout = draw(st.sampled_from(["coo", "csr"] if sdim == 2 else ["coo"]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    special = draw(st.booleans())
    mask = torch.rand(ssh, generator=g) < draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]))
    idx = mask.nonzero().T.contiguous()
    vals = random_values(g, (idx.shape[1],) + dsh, dtype, special)
    if (
        layout == "coo" and idx.shape[1] and draw(st.booleans())
    ):  # uncoalesced: duplicates holding zeros
        dup = torch.randint(0, idx.shape[1], (max(1, idx.shape[1] // 2),), generator=g)
        idx, vals = torch.cat([idx, idx[:, dup]], 1), torch.cat([vals, torch.zeros_like(vals[dup])])
        perm = torch.randperm(idx.shape[1], generator=g)
        idx, vals = idx[:, perm], vals[perm]
    vals = stored_as(vals, draw(st.sampled_from(["plain", "noncontig", "offset", "neg", "conj"])))
    kind = draw(st.sampled_from([k for k in fills if k != "array" or dsh]))
    fill = {
        "zero": torch.zeros((), dtype=dtype),
        "value": torch.tensor(draw(st.sampled_from(scalars(dtype))), dtype=dtype),
        "array": random_values(g, dsh, dtype, special),
        "indefinite": sparsefill.indefinite,
    }[kind]
    A = sparsefill.sparse_coo_tensor(idx, vals, ssh + dsh, fill_value=fill)
    return A.to_sparse_csr() if layout == "csr" else A


def ones_of(dtype):
    return torch.ones((), dtype=dtype)


def dense_and_unspecified(A):
    """``(A's dense tensor, None)``; indefinite: ``(the dense tensor with fill 0, the unspecified elements)``."""
    if not A.is_fill_indefinite():
        return A.to_dense(), None
    d0 = A.to_dense(fill_value=torch.zeros((), dtype=A.dtype))
    return d0, differ(d0, A.to_dense(fill_value=ones_of(A.dtype)))


def differ(a, b):
    """Element-wise ``a != b`` with NaN equal to NaN (the elements that a fill changes)."""
    return (a != b) & ~((a != a) & (b != b))


def check_masked(R, expected, unspecified, signed_zeros=True):
    """An indefinite result ``R``: unspecified exactly at ``unspecified``, ``expected`` elsewhere."""
    assert isinstance(R, SparseTensor) and R.is_fill_indefinite()
    r0 = R.to_dense(fill_value=torch.zeros((), dtype=R.dtype))
    assert torch.equal(differ(r0, R.to_dense(fill_value=ones_of(R.dtype))), unspecified)
    assert_identical(
        torch.where(unspecified, torch.zeros((), dtype=R.dtype), r0),
        torch.where(unspecified, torch.zeros((), dtype=R.dtype), expected),
        signed_zeros,
    )
