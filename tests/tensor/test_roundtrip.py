"""Property tests: dense -> sparse -> dense round trips, layout and fill changes, duplicate indices.

Invariant (sparsefill.to_sparse docstring)::

    to_sparse(x, fill_value=f, layout=L, dense_dim=k).to_dense() == x           (NaN == NaN)

and the result specifies exactly the dense slices of ``x`` that differ from ``f``.
Inputs are drawn by hypothesis (shape, dtype, layout, fill kind, densities) and
filled from a seeded torch generator; a good fraction of elements equal the fill.
"""

import math
import warnings

import pytest
import torch
from hypothesis import example, given, settings, strategies as st

import sparsefill
from sparsefill import SparseTensor

NAN, INF = float("nan"), float("inf")
DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32, torch.bool, torch.complex64]
FILL_KINDS = ["scalar", "array", "small_array", "indefinite"]
SETTINGS = settings(max_examples=150, deadline=None)


# ---------------------------------------------------------------------- helpers
def assert_same(actual, expected):
    """Exact equality, NaN == NaN, dtype and shape included."""
    assert not isinstance(actual, SparseTensor), "expected a plain tensor"
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def scalars(dtype):
    """Candidate scalar fills for ``dtype`` (specials included for float and complex)."""
    if dtype.is_complex:
        return [0j, 1 + 2j, -0.5j, complex(NAN, NAN), complex(INF, 0.0)]
    if dtype.is_floating_point:
        return [0.0, 1.0, -2.5, NAN, INF, -INF]
    if dtype == torch.bool:
        return [False, True]
    return [0, 1, -2, 7]


def random_values(gen, shape, dtype, special_p=0.0):
    """Small discrete values (so that repeats are common), NaN/inf with probability ``special_p``."""
    shape = tuple(shape)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if not (dtype.is_floating_point or dtype.is_complex):
        return torch.randint(-3, 4, shape, generator=gen).to(dtype)

    def part():
        p = torch.randint(-4, 5, shape, generator=gen).double() / 2
        if special_p:
            specials = torch.tensor([NAN, INF, -INF], dtype=torch.float64)
            pick = specials[torch.randint(0, 3, shape, generator=gen)]
            p = torch.where(torch.rand(shape, generator=gen) < special_p, pick, p)
        return p

    if dtype.is_complex:
        return torch.complex(part(), part()).to(dtype)
    return part().to(dtype)


def same_as_fill(x, F):
    """Element-wise ``x == F`` with NaN == NaN; complex numbers compare part by part, so that
    ``nan+1j`` differs from ``nan+0j`` and the round trip is bit-exact."""
    if x.is_complex():
        return same_as_fill(x.real, F.real) & same_as_fill(x.imag, F.imag)
    eq = x == F
    if x.is_floating_point():
        eq |= x.isnan() & F.isnan()
    return eq


def differing_slices(x, F, sdim):
    """Bool tensor over the sparse shape: True where the dense slice of ``x`` differs from ``F``."""
    eq = same_as_fill(x, F.expand(x.shape))
    return ~eq.reshape(tuple(x.shape[:sdim]) + (math.prod(x.shape[sdim:]),)).all(-1)


def small_fill_shape(draw, dense_shape):
    """A shape broadcastable to ``dense_shape``, strictly smaller in numel or ndim where possible."""
    keep = [draw(st.booleans()) for _ in dense_shape]
    shape = [d if k else 1 for d, k in zip(dense_shape, keep)]
    drop = draw(st.integers(0, len(shape)))
    return tuple(shape[drop:])


def csr_pattern(A):
    """Bool tensor over the sparse shape marking the stored positions of a CSR SparseTensor."""
    batch = tuple(A.shape[: A.crow_indices().dim() - 1])
    m, n = A.shape[len(batch)], A.shape[len(batch) + 1]
    nb = math.prod(batch)
    crow = A.crow_indices().reshape(nb, m + 1)
    col = A.col_indices().reshape(nb, A._nse())
    out = torch.zeros(nb, m, n, dtype=torch.bool)
    for b in range(nb):
        for r in range(m):
            cols = col[b, crow[b, r] : crow[b, r + 1]]
            assert not out[b, r, cols].any(), "duplicate column in a CSR row"
            out[b, r, cols] = True
    return out.reshape(batch + (m, n))


@st.composite
def dense_cases(draw, layouts=(torch.sparse_coo, torch.sparse_csr)):
    """``(x, fill_value, F, layout, dense_dim)``; ``F`` is the fill as a tensor (None when indefinite)."""
    dtype = draw(st.sampled_from(DTYPES))
    ndim = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=ndim, max_size=ndim)))
    # mostly non-empty shapes, but 0-size dims are drawn too
    if draw(st.integers(0, 4)) > 0:
        shape = tuple(max(s, 1) for s in shape)
    dense_dim = draw(st.integers(0, ndim))
    sdim = ndim - dense_dim
    layout = draw(st.sampled_from([L for L in layouts if L is torch.sparse_coo or sdim >= 2]))
    dense_shape = shape[sdim:]
    kinds = [
        k
        for k in FILL_KINDS
        # `[]` is also a valid array fill when the dense dims end with a 0-size dim: keep it unambiguous
        if not (k == "indefinite" and dense_shape and dense_shape[-1] == 0)
    ]
    kind = draw(st.sampled_from(kinds))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    special_p = draw(st.sampled_from([0.0, 0.1, 0.4]))
    base = random_values(gen, shape, dtype, special_p)

    if kind == "scalar":
        fill_value = draw(st.sampled_from(scalars(dtype)))
        F = torch.tensor(fill_value, dtype=dtype)
    elif kind in ("array", "small_array"):
        fshape = dense_shape if kind == "array" else small_fill_shape(draw, dense_shape)
        F = fill_value = random_values(gen, fshape, dtype, special_p)
    else:
        fill_value, F = [], None
    if F is None:
        # indefinite: still plant repeated values, every element is specified anyway
        F_plant = torch.tensor(draw(st.sampled_from(scalars(dtype))), dtype=dtype)
    else:
        F_plant = F
    slice_p = draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]))
    elem_p = draw(st.sampled_from([0.0, 0.3]))
    slice_mask = torch.rand(shape[:sdim], generator=gen) < slice_p
    elem_mask = torch.rand(shape, generator=gen) < elem_p
    mask = slice_mask.reshape(shape[:sdim] + (1,) * dense_dim) | elem_mask
    x = torch.where(mask, F_plant.expand(shape), base)
    return x, fill_value, F, layout, dense_dim


# ---------------------------------------------------------------------- dense -> sparse -> dense
@SETTINGS
@given(dense_cases())
def test_dense_sparse_dense_round_trip(case):
    x, fill_value, F, layout, dense_dim = case
    x_before = x.clone()
    A = sparsefill.to_sparse(x, fill_value=fill_value, layout=layout, dense_dim=dense_dim)
    assert isinstance(A, SparseTensor)
    assert A.sparse_layout is layout
    assert A.shape == x.shape and A.dtype == x.dtype and A.dense_dim() == dense_dim
    assert_same(x, x_before)  # the input is not modified
    sdim = x.dim() - dense_dim
    if F is None:
        assert A.is_fill_indefinite()
        with pytest.raises(ValueError, match="fill_value"):
            A.to_dense()
        g = scalars(x.dtype)[1]
        assert_same(A.to_dense(fill_value=g), x)  # every element is specified
        differ = torch.ones(x.shape[:sdim], dtype=torch.bool)
    else:
        assert not A.is_fill_indefinite()
        assert_same(A.to_dense(), x)
        differ = differing_slices(x, F, sdim)

    if layout is torch.sparse_coo:
        assert A.is_coalesced()
        assert A._nse() == int(differ.sum())
        torch.testing.assert_close(A.indices(), differ.nonzero().T, rtol=0, atol=0)
    else:
        # per batch: the differing slices are stored; batches are padded to the same nse
        batch = x.shape[: sdim - 2]
        counts = differ.reshape(math.prod(batch), math.prod(x.shape[sdim - 2 : sdim])).sum(1)
        expected_nse = int(counts.max()) if counts.numel() else 0
        assert A._nse() == expected_nse
        stored = csr_pattern(A)
        assert not (differ & ~stored).any(), "a slice that differs from the fill is not stored"


@SETTINGS
@given(dense_cases(), st.data())
def test_layout_and_fill_changes_keep_the_dense_tensor(case, data):
    x, fill_value, F, layout, dense_dim = case
    A = sparsefill.to_sparse(x, fill_value=fill_value, layout=layout, dense_dim=dense_dim)
    g = scalars(x.dtype)[1]

    def dense(T):
        return T.to_dense(fill_value=g) if T.is_fill_indefinite() else T.to_dense()

    if x.dim() - dense_dim >= 2:
        B = A.to_sparse(layout=torch.sparse_csr)
        assert B.sparse_layout is torch.sparse_csr and B.is_fill_indefinite() == (F is None)
        C = B.to_sparse(layout=torch.sparse_coo)
        assert C.sparse_layout is torch.sparse_coo and C.dense_dim() == dense_dim
        assert_same(dense(B), x)
        assert_same(dense(C), x)
    D = A.to_sparse(layout=torch.sparse_coo)
    assert_same(dense(D), x)

    new_fill = data.draw(st.sampled_from(scalars(x.dtype)), label="new_fill")
    E = A.to_sparse(fill_value=new_fill)
    assert E.sparse_layout is layout and not E.is_fill_indefinite()
    assert_same(E.to_dense(), x)
    assert_same(E._fill_value(), torch.tensor(new_fill, dtype=x.dtype))
    if layout is torch.sparse_coo:
        differ = differing_slices(x, torch.tensor(new_fill, dtype=x.dtype), x.dim() - dense_dim)
        assert E._nse() == int(differ.sum())

    dense_shape = x.shape[x.dim() - dense_dim :]
    if not (dense_shape and dense_shape[-1] == 0):  # there `[]` would also be a valid array fill
        I = A.to_sparse(fill_value=[])
        assert I.is_fill_indefinite()
        assert_same(I.to_dense(fill_value=g), x)

    # an array fill must still broadcast to the new dense dims
    new_dd = data.draw(st.integers(0 if F is None else F.dim(), x.dim()), label="new_dense_dim")
    K = A.to_sparse(layout=torch.sparse_coo, dense_dim=new_dd)
    assert K.dense_dim() == new_dd and K.is_fill_indefinite() == (F is None)
    assert_same(dense(K), x)
    assert_same(dense(A), x)  # A itself is unchanged


# ---------------------------------------------------------------------- sparse_coo_tensor with duplicates
@st.composite
def coo_cases(draw):
    dtype = draw(st.sampled_from(DTYPES))
    sdim = draw(st.integers(0, 3))
    ssizes = tuple(draw(st.lists(st.integers(0, 4), min_size=sdim, max_size=sdim)))
    if draw(st.integers(0, 4)) > 0:
        ssizes = tuple(max(s, 1) for s in ssizes)
    ddim = draw(st.integers(0, 2))
    dense_shape = tuple(draw(st.lists(st.integers(1, 3), min_size=ddim, max_size=ddim)))
    nse = draw(st.integers(0, 10)) if math.prod(ssizes) > 0 else 0
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    idx = (
        torch.stack([torch.randint(0, max(s, 1), (nse,), generator=gen) for s in ssizes])
        if sdim
        else torch.zeros((0, nse), dtype=torch.int64)
    )
    special_p = draw(st.sampled_from([0.0, 0.2]))
    vals = random_values(gen, (nse,) + dense_shape, dtype, special_p)
    kind = draw(st.sampled_from(FILL_KINDS))
    if kind == "scalar":
        fill_value = draw(st.sampled_from(scalars(dtype)))
        F = torch.tensor(fill_value, dtype=dtype)
    elif kind == "array":
        F = fill_value = random_values(gen, dense_shape, dtype, special_p)
    elif kind == "small_array":
        F = fill_value = random_values(gen, small_fill_shape(draw, dense_shape), dtype, special_p)
    else:
        fill_value, F = [], None
    return idx, vals, ssizes + dense_shape, fill_value, F


def coo_reference(idx, vals, size, F):
    """Dense reference: the fill where never specified, the sum of the values where specified."""
    sdim = idx.shape[0]
    dtype = vals.dtype
    work = torch.int64 if dtype == torch.bool else dtype  # bool: duplicates combine as logical or
    ref = F.to(work).expand(size).clone()
    if idx.shape[1]:
        if sdim == 0:
            ref = vals.to(work).sum(0, dtype=work)
        else:
            specified = torch.zeros(size[:sdim], dtype=torch.bool)
            specified[tuple(idx)] = True
            ref[specified] = 0
            ref.index_put_(tuple(idx), vals.to(work), accumulate=True)
    return ref.bool() if dtype == torch.bool else ref


@SETTINGS
@given(coo_cases())
# sparse_dim 0: every stored value lands on the one position (torch allows it)
@example(
    case=(
        torch.zeros((0, 2), dtype=torch.int64),
        torch.tensor([2.0, 3.0]),
        (),
        -2.0,
        torch.tensor(-2.0),
    )
)
# duplicates of complex values with an infinite part: inf+2j + 3+1j == inf+3j, not inf+nanj
@example(
    case=(
        torch.tensor([[0, 0]]),
        torch.tensor([complex(INF, 2), 3 + 1j], dtype=torch.complex64),
        (1,),
        0j,
        torch.tensor(0j, dtype=torch.complex64),
    )
)
def test_sparse_coo_tensor_duplicates_add_up(case):
    idx, vals, size, fill_value, F = case
    idx_before, vals_before = idx.clone(), vals.clone()
    A = sparsefill.sparse_coo_tensor(idx, vals, size, fill_value=fill_value)
    assert A.shape == size and A.dtype == vals.dtype and A._nse() == idx.shape[1]
    assert A.sparse_dim() == idx.shape[0] and A.dense_dim() == vals.dim() - 1
    g = scalars(vals.dtype)[1]
    ref = coo_reference(idx, vals, size, torch.tensor(g, dtype=vals.dtype) if F is None else F)
    assert_same(A.to_dense(fill_value=g) if F is None else A.to_dense(), ref)
    assert_same(idx, idx_before)
    assert_same(vals, vals_before)


@SETTINGS
@given(coo_cases())
def test_coalesce_keeps_the_dense_tensor(case):
    idx, vals, size, fill_value, F = case
    A = sparsefill.sparse_coo_tensor(idx, vals, size, fill_value=fill_value)
    g = scalars(vals.dtype)[1]
    ref = coo_reference(idx, vals, size, torch.tensor(g, dtype=vals.dtype) if F is None else F)
    C = A.coalesce()
    assert C.is_coalesced() and C.is_fill_indefinite() == (F is None)
    if idx.shape[0]:
        expected_indices = torch.unique(idx, dim=1)  # sorted lexicographically, no duplicates
    else:
        expected_indices = torch.zeros((0, min(idx.shape[1], 1)), dtype=torch.int64)
    torch.testing.assert_close(C.indices(), expected_indices, rtol=0, atol=0)
    assert C._nse() == expected_indices.shape[1]
    assert_same(C.to_dense(fill_value=g) if F is None else C.to_dense(), ref)
    assert C.coalesce().is_coalesced()
    assert_same(A.to_dense(fill_value=g) if F is None else A.to_dense(), ref)  # A is unchanged


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_indefinite_fill_conversions(layout):
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    A = sparsefill.to_sparse(x, fill_value=[], layout=layout)
    assert A.is_fill_indefinite() and A._nse() == 6
    for B in (
        A.to_sparse(fill_value=[]),  # indefinite -> indefinite
        A.to_sparse(
            layout=torch.sparse_coo, dense_dim=1
        ),  # dense_dim change keeps the indefinite fill
        A.to_sparse(layout=torch.sparse_csr),
    ):
        assert B.is_fill_indefinite()
        assert_same(B.to_dense(fill_value=0.0), x)
    assert_same(A.to_sparse(fill_value=2.0).to_dense(), x)


def test_indefinite_sentinel_and_empty_list():
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    for spelling in (sparsefill.indefinite, [], torch.empty(0)):
        A = sparsefill.to_sparse(x, fill_value=spelling)
        assert A.is_fill_indefinite() and A._nse() == 4
        assert_same(A.to_dense(fill_value=7.0), x)
    # dense dims ending with a 0-size dim: `[]` is an array fill there, the sentinel stays indefinite
    z = torch.ones(2, 0)
    assert not sparsefill.to_sparse(z, fill_value=[], dense_dim=1).is_fill_indefinite()
    assert sparsefill.to_sparse(
        z, fill_value=sparsefill.indefinite, dense_dim=1
    ).is_fill_indefinite()
    assert_same(sparsefill.to_sparse(z, fill_value=[], dense_dim=1).to_dense(), z)


# ---------------------------------------------------------------------- torch native sparse
@SETTINGS
@given(
    st.sampled_from([torch.float32, torch.float64, torch.int64, torch.complex64]),
    st.integers(1, 3),
    st.integers(0, 1),
    st.integers(0, 8),
    st.integers(0, 2**31 - 1),
)
def test_from_torch_to_torch_coo(dtype, sdim, ddim, nse, seed):
    gen = torch.Generator().manual_seed(seed)
    size = tuple(torch.randint(1, 4, (sdim + ddim,), generator=gen).tolist())
    idx = torch.stack([torch.randint(0, s, (nse,), generator=gen) for s in size[:sdim]])
    vals = random_values(gen, (nse,) + size[sdim:], dtype)
    t = torch.sparse_coo_tensor(idx, vals, size)  # uncoalesced, possibly duplicates
    A = sparsefill.from_torch(t)
    assert isinstance(A, SparseTensor) and A.sparse_layout is torch.sparse_coo
    assert A.sparse_dim() == sdim and A.dense_dim() == ddim
    assert_same(A._fill_value(), torch.zeros((), dtype=dtype))
    assert_same(A.to_dense(), t.to_dense())
    T = A.to_torch()
    assert T.layout is torch.sparse_coo and T.shape == t.shape and T.dtype == dtype
    assert_same(T.to_dense(), t.to_dense())
    tc = t.coalesce()
    Ac = sparsefill.from_torch(tc)
    assert Ac.is_coalesced()
    assert_same(Ac.to_torch().to_dense(), t.to_dense())


@SETTINGS
@given(
    st.sampled_from([torch.float32, torch.float64, torch.int64, torch.complex64]),
    st.integers(0, 2),
    st.integers(0, 1),
    st.integers(0, 2**31 - 1),
)
def test_from_torch_to_torch_csr(dtype, nbatch, ddim, seed):
    gen = torch.Generator().manual_seed(seed)
    size = tuple(torch.randint(1, 4, (nbatch + 2 + ddim,), generator=gen).tolist())
    x = random_values(gen, size, dtype)
    x = torch.where(x == 0, torch.ones((), dtype=dtype), x)
    # the same pattern in every batch: torch native batched CSR needs equal nse per batch
    pattern = (
        torch.rand((1,) * nbatch + size[nbatch : nbatch + 2] + (1,) * ddim, generator=gen) < 0.5
    )
    x = torch.where(pattern, x, torch.zeros((), dtype=dtype))
    t = x.to_sparse_csr(dense_dim=ddim)
    A = sparsefill.from_torch(t)
    assert (
        isinstance(A, SparseTensor)
        and A.sparse_layout is torch.sparse_csr
        and A.dense_dim() == ddim
    )
    assert_same(A.to_dense(), x)
    T = A.to_torch()
    assert T.layout is torch.sparse_csr and T.shape == x.shape
    assert_same(T.to_dense(), x)
    # from_torch and back through COO
    assert_same(A.to_sparse(layout=torch.sparse_coo).to_torch().to_dense(), x)


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_to_torch_nonzero_fill(layout):
    x = torch.tensor([[1.0, 5.0, 5.0], [5.0, 2.0, 5.0]])
    A = sparsefill.to_sparse(x, fill_value=5.0, layout=layout)
    with pytest.raises(ValueError, match="materialize"):
        A.to_torch()
    with pytest.raises(ValueError, match="materialize"):
        sparsefill.to_torch(A)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sparsefill.DensifyWarning)
        T = A.to_torch(materialize=True)
    assert T.layout is layout
    assert_same(T.to_dense(), x)
    # zero fill: no error, no materialization needed
    Z = sparsefill.to_sparse(x, fill_value=0.0, layout=layout)
    assert_same(Z.to_torch().to_dense(), x)
    # indefinite fill: no zero-fill equivalent
    with pytest.raises(ValueError):
        sparsefill.to_sparse(x, fill_value=[], layout=layout).to_torch()


def test_to_sparse_of_native_tensor_changes_fill():
    x = torch.tensor([[0.0, 3.0], [4.0, 0.0]])
    A = sparsefill.to_sparse(x.to_sparse(), fill_value=3.0, layout=torch.sparse_csr)
    assert A.sparse_layout is torch.sparse_csr and A._nse() == 3
    assert_same(A.to_dense(), x)
