"""``A.to_dense()`` (one scatter of cached linear keys): against a dense tensor built element by element.

The reference is written independently of sparsefill's kernels: start from the fill broadcast to the shape,
then add each stored element (duplicates sum) at its index.
"""

import itertools

import pytest
import torch

import sparsefill
from sparsefill._tensor import parts as _convert
from sparsefill._kernels import index as _index
import math
from hypothesis import given, strategies as st
from tests.sparse_cases import assert_identical, random_values, stored_as, SETTINGS


def reference(indices, values, shape, fill):
    """The dense tensor of COO parts: ``fill`` where nothing is stored, the sum of the stored values elsewhere."""
    out = torch.as_tensor(fill, dtype=values.dtype).expand(shape).clone()
    seen = set()
    for j in range(indices.shape[1]):
        pos = tuple(int(i) for i in indices[:, j])
        out[pos] = values[j] if pos not in seen else out[pos] + values[j]
        seen.add(pos)
    return out


def check(A, expected):
    got = A.to_dense()
    assert type(got) is torch.Tensor and got.dtype == expected.dtype and got.shape == expected.shape
    torch.testing.assert_close(got, expected, equal_nan=True, rtol=0, atol=0)


IDX2 = torch.tensor([[0, 1, 2, 2], [3, 0, 1, 4]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool])
@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_matrix(layout, dtype):
    vals = torch.tensor([1, 0, 7, 2]).to(dtype)
    fill = True if dtype is torch.bool else 5
    A = sparsefill.sparse_coo_tensor(IDX2, vals, (3, 5), fill_value=fill).to_sparse(layout)
    check(A, reference(IDX2, vals, (3, 5), fill))


def test_uncoalesced_duplicates_sum():
    idx = torch.tensor([[2, 0, 2, 1, 2], [1, 3, 1, 0, 1]])
    vals = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=torch.float64)
    A = sparsefill.sparse_coo_tensor(idx, vals, (3, 4), fill_value=-1.0)
    assert not A.is_coalesced()
    check(A, reference(idx, vals, (3, 4), -1.0))  # position (2, 1) holds 1 + 3 + 5, not the fill
    check(A, reference(idx, vals, (3, 4), -1.0))  # twice: nothing cached from the first call


def test_hybrid_array_fill():
    idx = torch.tensor([[0, 2], [1, 1]])
    vals = torch.arange(6.0).reshape(2, 3)
    fill = torch.tensor([10.0, 20.0, float("nan")])
    A = sparsefill.sparse_coo_tensor(idx, vals, (3, 2, 3), fill_value=fill)
    expected = fill.expand(3, 2, 3).clone()
    expected[0, 1], expected[2, 1] = vals[0], vals[1]
    check(A, expected)
    check(A.to_sparse(torch.sparse_csr, dense_dim=1), expected)


def test_nan_inf_values_and_fill():
    idx = torch.tensor([[0, 3]])
    vals = torch.tensor([float("nan"), float("-inf")])
    A = sparsefill.sparse_coo_tensor(idx, vals, (5,), fill_value=float("inf"))
    check(A, torch.tensor([float("nan"), float("inf"), float("inf"), float("-inf"), float("inf")]))


def test_indefinite_needs_a_replacement_fill():
    A = sparsefill.sparse_coo_tensor(IDX2, torch.ones(4), (3, 5), fill_value=sparsefill.indefinite)
    with pytest.raises(ValueError, match="indefinite"):
        A.to_dense()
    torch.testing.assert_close(
        A.to_dense(fill_value=-2.0), reference(IDX2, torch.ones(4), (3, 5), -2.0)
    )
    with pytest.raises(ValueError, match="must be defined"):
        A.to_dense(fill_value=sparsefill.indefinite)


@pytest.mark.parametrize("shape", [(), (0,), (0, 3), (3, 0)])
def test_zero_dim_and_zero_size(shape):
    if shape == ():
        A = sparsefill.sparse_coo_tensor(
            torch.zeros(0, 1, dtype=torch.int64), torch.tensor([4.0]), (), fill_value=1.0
        )
        check(A, torch.tensor(4.0))
        A = sparsefill.sparse_coo_tensor(
            torch.zeros(0, 0, dtype=torch.int64), torch.zeros(0), (), fill_value=1.0
        )
        check(A, torch.tensor(1.0))
        return
    A = sparsefill.sparse_coo_tensor(
        torch.zeros(len(shape), 0, dtype=torch.int64), torch.zeros(0), shape, fill_value=3.0
    )
    check(A, torch.full(shape, 3.0))
    if len(shape) == 2:
        check(A.to_sparse(torch.sparse_csr), torch.full(shape, 3.0))


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_pattern_changed_in_place_is_seen(layout):
    """The linear keys are cached per pattern: an in-place write to the index tensors is a new pattern."""
    vals = torch.tensor([1.0, 2.0, 3.0, 4.0])
    A = sparsefill.sparse_coo_tensor(IDX2.clone(), vals, (3, 5), fill_value=0.5).to_sparse(
        layout
    )  # written below
    keys = _convert.linear_parts(A)[0]
    assert _convert.linear_parts(A)[0] is keys  # cached: the same tensor for the same pattern
    check(A, reference(IDX2, vals, (3, 5), 0.5))
    moved = IDX2.clone()
    moved[1, 0] = 4  # (0, 3) -> (0, 4): still sorted, one per row 0
    if layout is torch.sparse_coo:
        A.indices()[1, 0] = 4
    else:
        A.col_indices()[0] = 4
    assert not torch.equal(_convert.linear_parts(A)[0], keys)
    check(A, reference(moved, vals, (3, 5), 0.5))


def test_same_index_tensor_other_shape_is_not_a_hit():
    """The cache key holds the sparse shape: one index tensor under two shapes gives two key sets."""
    vals = torch.ones(4)
    A = sparsefill.sparse_coo_tensor(IDX2, vals, (3, 5), fill_value=0.0)
    B = _convert.rewrap(A, size=(4, 7))
    check(A, reference(IDX2, vals, (3, 5), 0.0))
    check(B, reference(IDX2, vals, (4, 7), 0.0))


def test_keys_match_linearize():
    for layout, shape in itertools.product(
        (torch.sparse_coo, torch.sparse_csr), ((3, 5), (2, 3, 5))
    ):
        x = torch.arange(float(torch.Size(shape).numel())).reshape(shape) % 4
        A = sparsefill.to_sparse(x, layout=layout)
        idx, _ = _convert.coalesced_parts(A)
        torch.testing.assert_close(
            _convert.linear_parts(A)[0], _index.linearize(idx, A._sparse_shape)
        )


def test_gradient_path_and_graph_free_path():
    vals = torch.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    A = sparsefill.sparse_coo_tensor(IDX2, vals, (3, 5), fill_value=2.0)
    d = A.to_dense()
    assert d.requires_grad
    (d * torch.arange(15.0).reshape(3, 5)).sum().backward()
    torch.testing.assert_close(vals.grad, torch.tensor([3.0, 5.0, 11.0, 14.0]))
    with torch.no_grad():
        assert A.to_dense().grad_fn is None
    assert sparsefill.sparse_coo_tensor(IDX2, vals.detach(), (3, 5)).to_dense().grad_fn is None


@pytest.mark.parametrize("shape", [(3,), (0,), (2, 3)])
def test_no_sparse_dims(shape):
    """Every dim dense (``dense_dim=A.dim()``): the one stored element is the whole tensor."""
    x = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
    A = sparsefill.to_sparse(x, dense_dim=len(shape))
    assert A._sparse_ndim() == 0
    check(A, x)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize(
    "shape,nse", [((12,), 2), ((12,), 9), ((3, 4), 2), ((3, 4), 9), ((3, 4, 2), 3)]
)
def test_put_and_index_copy_paths(shape, nse, deterministic):
    """Both scatters (``put_`` at most a quarter stored, ``index_copy_`` above it, for hybrid tensors and under
    deterministic algorithms) give the reference, on COO and CSR, coalesced or not."""
    S = shape[:2] if len(shape) == 3 else shape
    g = torch.Generator().manual_seed(nse)
    idx = _index.unravel(torch.randperm(torch.Size(S).numel(), generator=g)[:nse], S)
    vals = torch.randn((nse,) + shape[len(S) :], generator=g, dtype=torch.float64)
    fill = torch.tensor([1.5, -2.0], dtype=torch.float64) if len(shape) == 3 else 1.5
    A = sparsefill.sparse_coo_tensor(idx, vals, shape, fill_value=fill)
    expected = reference(idx, vals, shape, torch.as_tensor(fill, dtype=vals.dtype).expand(shape))
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        check(A, expected)
        check(A.coalesce(), expected)
        if len(S) == 2:
            check(A.to_sparse(torch.sparse_csr, dense_dim=len(shape) - 2), expected)
    finally:
        torch.use_deterministic_algorithms(before)


def test_large_result_advised_into_huge_pages():
    """A dense result of at least 4 MiB (its memory advised into transparent huge pages on Linux) holds the fill
    and the stored values like a small one; the advice is a hint, never an error."""
    n = (_convert._HUGE_MIN // 8) + 12345  # float64 elements: just above the bound
    keys = torch.tensor([0, 1, 4099, n // 2, n - 1])
    vals = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=torch.float64)
    A = sparsefill.sparse_coo_tensor(keys[None], vals, (n,), fill_value=-0.5)
    expected = torch.full((n,), -0.5, dtype=torch.float64)
    expected[keys] = vals
    check(A, expected)
    out = _convert.empty_dense((3, n), torch.float32, torch.device("cpu"))
    assert out.shape == (3, n) and out.dtype == torch.float32 and out.is_contiguous()


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.float64, torch.int64, torch.bool, torch.complex64, torch.bfloat16],
)
def test_compiled_scatter_matches_put(dtype):
    """``_kernels.merge.put_flat`` (a compiled loop from ``_SCATTER_MIN`` values on CPU; ``put_`` below it, for other
    dtypes or without numba) == ``put_``, and ``to_dense`` through it == the reference."""
    from sparsefill._kernels import merge as _merge

    n = 4 * _merge._SCATTER_MIN + 7
    g = torch.Generator().manual_seed(1)
    for nse in (_merge._SCATTER_MIN - 1, _merge._SCATTER_MIN, n // 4):
        keys = torch.randperm(n, generator=g)[:nse].sort().values
        vals = (torch.randn(nse, generator=g) * 5).to(dtype)
        fill = torch.tensor(True if dtype is torch.bool else 2, dtype=dtype)
        ref = fill.expand(n).clone().put_(keys, vals)
        assert torch.equal(_merge.put_flat(fill.expand(n).clone(), keys, vals), ref)
        A = sparsefill.sparse_coo_tensor(keys[None], vals, (n,), fill_value=fill)
        check(A, ref)
        B = sparsefill.sparse_coo_tensor(
            torch.stack(torch.unravel_index(keys, (7, n // 7 + 1))),
            vals,
            (7, n // 7 + 1),
            fill_value=fill,
        )
        check(B, fill.expand(7 * (n // 7 + 1)).clone().put_(keys, vals).view(7, -1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.complex128, torch.float16])
@pytest.mark.parametrize("frac", [0.5, 1.0])
def test_dense_patterns_above_a_quarter(dtype, frac):
    """More than a quarter of the positions stored (half, all): the compiled scatter where it applies (numba,
    its dtypes), ``index_copy_`` for the others (float16 here) and under deterministic algorithms; 1-D, 2-D
    and CSR, with values requiring grad (the ``ToDense`` path and its gradient), against the reference."""
    from sparsefill._kernels import merge as _merge

    n = 2 * _merge._SCATTER_MIN + 8  # (above the compiled loop's bound at half stored; 8 rows)
    g = torch.Generator().manual_seed(3)
    nse = int(n * frac)
    keys = torch.randperm(n, generator=g)[:nse].sort().values
    vals = (torch.randn(nse, generator=g, dtype=torch.float64) * 5).to(dtype)
    fill = torch.tensor(-3, dtype=dtype)
    ref = fill.expand(n).clone()
    ref[keys] = vals
    before = torch.are_deterministic_algorithms_enabled()
    for deterministic in (False, True):
        torch.use_deterministic_algorithms(deterministic)
        try:
            check(sparsefill.sparse_coo_tensor(keys[None], vals, (n,), fill_value=fill), ref)
            idx2 = torch.stack(torch.unravel_index(keys, (8, n // 8)))
            B = sparsefill.sparse_coo_tensor(idx2, vals, (8, n // 8), fill_value=fill)
            check(B, ref.view(8, -1))
            check(B.to_sparse(torch.sparse_csr), ref.view(8, -1))
        finally:
            torch.use_deterministic_algorithms(before)
    if dtype.is_floating_point or dtype.is_complex:
        v = vals.clone().requires_grad_(True)
        A = sparsefill.sparse_coo_tensor(keys[None], v, (n,), fill_value=fill)
        out = A.to_dense()
        torch.testing.assert_close(out.detach(), ref, rtol=0, atol=0)
        w = torch.randn(n, generator=g, dtype=torch.float64).to(dtype)
        (out * w).real.sum().backward() if dtype.is_complex else (out * w).sum().backward()
        torch.testing.assert_close(
            v.grad, w[keys].conj() if dtype.is_complex else w[keys], rtol=0, atol=0
        )


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
        torch.complex128,
    ],
)
def test_blocked_fill_and_scatter_matches_fill_put(dtype):
    """``_kernels.merge.fill_put_sorted`` (fill a block, then the values falling in it) == ``fill_`` then ``put_``: keys on
    both sides of block edges, at the first and last position, none at all; a size that is no multiple of the
    block; a 2-D buffer; fills NaN and -0.0; and ``to_dense`` through it (at most a quarter stored).  Every
    element size: 1, 2, 4 and 8 bytes fill by ``rep stos`` on x86-64, complex128's 16 by the loop."""
    from sparsefill._kernels import merge as _merge

    pytest.importorskip(
        "numba", reason="fill_put_sorted is a numba kernel (without numba it declines)"
    )
    B = _merge._FILL_BYTES // dtype.itemsize  # (elements per block)
    n = 2 * B + 37
    g = torch.Generator().manual_seed(5)
    edges = torch.tensor([0, B - 1, B, B + 1, 2 * B - 1, 2 * B, n - 1])
    for keys in (
        edges,
        torch.cat([edges, torch.randperm(n, generator=g)[:300]]).unique(),
        edges[:0],
    ):
        vals = (torch.randn(keys.numel(), generator=g) * 9).to(dtype)
        fills = [torch.tensor(True if dtype is torch.bool else 3, dtype=dtype)]
        if dtype.is_floating_point:
            fills += [torch.tensor(float("nan"), dtype=dtype), torch.tensor(-0.0, dtype=dtype)]
        for fill in fills:
            ref = torch.empty(n, dtype=dtype).fill_(fill).put_(keys, vals)
            out = torch.empty(n, dtype=dtype)
            assert _merge.fill_put_sorted(out, fill, keys, vals)
            torch.testing.assert_close(out, ref, equal_nan=True, rtol=0, atol=0)
            assert (out.view(torch.int8) == ref.view(torch.int8)).all()  # bitwise (-0.0)
            out2 = torch.empty((2, (n - 37) // 2), dtype=dtype)
            k2 = keys[keys < n - 37]
            assert _merge.fill_put_sorted(out2, fill, k2, vals[keys < n - 37])
            torch.testing.assert_close(
                out2.view(-1),
                torch.empty(n - 37, dtype=dtype).fill_(fill).put_(k2, vals[keys < n - 37]),
                equal_nan=True,
                rtol=0,
                atol=0,
            )
            check(sparsefill.sparse_coo_tensor(keys[None], vals, (n,), fill_value=fill), ref)
    assert not _merge.fill_put_sorted(
        torch.empty(4, dtype=torch.float16),
        torch.tensor(1.0, dtype=torch.float16),
        edges[:1],
        torch.ones(1, dtype=torch.float16),
    )  # (not a numba dtype)


def test_blocked_pass_declines_what_it_cannot_read_by_address():
    """The compiled pass reads and writes at the tensors' addresses: it declines (False, ``out`` untouched) a
    non-contiguous operand, values with a negative or conjugate bit, keys and values of different lengths,
    tensors off the CPU and a fill that is not 0-d; a fill with a negative or conjugate bit is read exactly;
    ``to_dense`` of such values is right either way."""
    from sparsefill._kernels import merge as _merge

    pytest.importorskip(
        "numba", reason="fill_put_sorted is a numba kernel (without numba it declines)"
    )
    n, g = 50, torch.Generator().manual_seed(9)
    keys = torch.tensor([0, 7, 31, 49])
    wide = torch.randn(8, generator=g)
    z = torch.randn(4, generator=g, dtype=torch.complex64)
    fill = torch.tensor(2.5)
    declined = {
        "strided values": (torch.empty(n), fill, keys, wide[::2]),
        "strided keys": (
            torch.empty(n),
            fill,
            torch.tensor([0, 0, 7, 0, 31, 0, 49, 0])[::2],
            wide[:4],
        ),
        "strided out": (torch.empty(2 * n)[::2], fill, keys, wide[:4]),
        "negative bit": (torch.empty(n), fill, keys, z.conj().imag),
        "conjugate bit": (torch.empty(n, dtype=torch.complex64), torch.tensor(1j), keys, z.conj()),
        "lengths differ": (torch.empty(n), fill, keys[:3], wide[:4]),
        "meta values": (torch.empty(n), fill, keys, wide[:4].to("meta")),
        "meta keys": (torch.empty(n), fill, keys.to("meta"), wide[:4]),
        "1-d fill": (torch.empty(n), fill[None], keys, wide[:4]),
    }
    for what, (out, f, k, v) in declined.items():
        before = out.fill_(-7.0).clone()
        assert not _merge.fill_put_sorted(out, f, k, v), what
        assert torch.equal(out, before), what
    for f in (
        torch.tensor([1 + 2j]).conj().imag[0],
        torch.tensor(3 - 1j, dtype=torch.complex64).conj(),
    ):
        vals = (wide[:4] if not f.is_complex() else z).to(f.dtype)
        out = torch.empty(n, dtype=f.dtype)
        assert _merge.fill_put_sorted(out, f, keys, vals) and (f.is_neg() or f.is_conj())
        torch.testing.assert_close(
            out, f.resolve_neg().resolve_conj().expand(n).clone().put_(keys, vals), rtol=0, atol=0
        )
    for vals in (wide[::2], z.conj().imag, z.conj()):
        A = sparsefill.sparse_coo_tensor(keys[None], vals, (n,), fill_value=-1.0)
        check(A, reference(keys[None], vals.resolve_neg().resolve_conj(), (n,), -1.0))


# ---------------------------------------------------------------------- to_dense's by-address kernels
@SETTINGS
@given(
    st.sampled_from(
        [
            torch.float32,
            torch.float64,
            torch.int8,
            torch.uint8,
            torch.int32,
            torch.int64,
            torch.bool,
            torch.complex64,
            torch.complex128,
            torch.float16,
        ]
    ),
    st.sampled_from([(9000,), (96, 96), (8, 40, 40)]),
    st.sampled_from([0.01, 0.2, 0.6]),
    st.sampled_from(["plain", "noncontig", "offset", "neg", "conj"]),
    st.sampled_from(["noncontig_idx", "plain"]),
    st.integers(0, 2**16),
    st.booleans(),
)
def test_to_dense_kernels(dtype, shape, density, how, idx_how, seed, special):
    """``fill_put_sorted`` (a quarter stored or less) and ``put_flat`` (4096+ stored, more than a quarter) read
    tensors by address: every dtype, values stored non-contiguous, at an offset, with negative or conjugate
    bits, non-contiguous indices; NaN/inf/-0.0 fills; against ``full(fill); [idx] = vals`` built here."""
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    keys = torch.randperm(n, generator=g)[: int(n * density)].sort().values
    idx = torch.stack(torch.unravel_index(keys, shape)) if len(shape) > 1 else keys[None]
    if idx_how == "noncontig_idx":
        idx = torch.stack([idx, idx], -1)[..., 0]
    vals = stored_as(random_values(g, (keys.numel(),), dtype, special), how)
    fill = random_values(g, (), dtype, special)
    A = sparsefill.sparse_coo_tensor(idx, vals, shape, fill_value=fill)
    expected = torch.full(shape, fill.item(), dtype=dtype)
    # (torch's own reading of the values: its vectorized complex neg gives 0.0 for -(0.0), its scalar loop -0.0)
    expected[tuple(idx)] = vals.resolve_conj().resolve_neg()
    assert_identical(A.to_dense(), expected)
    I = sparsefill.sparse_coo_tensor(idx, vals, shape, fill_value=sparsefill.indefinite)
    assert_identical(I.to_dense(fill_value=fill), expected)


def test_kernels_decline_what_they_cannot_read():
    """The by-address helpers either compute ``fill_(f).put_(keys, vals)`` exactly or decline (``out`` untouched)."""
    from sparsefill._kernels import merge as _merge

    n = 9000
    keys = torch.arange(0, n, 3)
    vals = torch.randn(keys.numel())
    ref = torch.full((n,), -1.0).put_(keys, vals)
    for out, f, k, v in [
        (torch.empty(n), torch.tensor(-1.0), keys, vals),
        (torch.empty(2 * n)[::2], torch.tensor(-1.0), keys, vals),  # strided out
        (torch.empty(n), torch.tensor(-1.0), keys.int(), vals),  # int32 keys
        (torch.empty(n), torch.tensor(-1.0), keys[:-1], vals),  # another length
        (torch.empty(n), torch.tensor(-1.0, dtype=torch.float64), keys, vals),  # fill's dtype
        (torch.empty(n + 1)[1:], torch.tensor(-1.0), keys, vals),  # storage offset
        (torch.empty(n), torch.tensor(1.0)._neg_view(), keys, vals),
    ]:  # fill's neg bit
        out.fill_(7.0)  # (a declined call leaves out untouched)
        if _merge.fill_put_sorted(out, f, k, v):
            assert_identical(out, ref)
        else:
            assert bool((out == 7.0).all())
    big = torch.arange(0, n, 2)
    bv = torch.randn(big.numel())
    for v in (bv, torch.stack([bv, bv], -1)[:, 0], (-bv)._neg_view(), torch.cat([bv[:1], bv])[1:]):
        out = torch.zeros(n)
        assert_identical(_merge.put_flat(out, big, v), torch.zeros(n).put_(big, bv))
    c = torch.randn(big.numel(), dtype=torch.complex64)
    assert_identical(
        _merge.put_flat(torch.zeros(n, dtype=torch.complex64), big, c.conj()),
        torch.zeros(n, dtype=torch.complex64).put_(big, c.conj()),
    )
