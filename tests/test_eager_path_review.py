"""``SparseTensor.to_dense()``'s short eager path: every way a user reaches it, against the dense
result.

The invariant, forward and backward::

    A.to_dense() == the dense tensor A stands for          bit for bit (NaN payloads, -0.0), same dtype
    grad of values/fill through A.to_dense() == the gradient through the dense construction

What changed, and what is checked here:

1. ``_compile.traced()`` reads ``is_dynamo_compiling()``, the compile flag and the FAKE mode instead of
   ``is_compiling()``: it agrees with the old definition under torch.export (strict, non-strict) and make_fx (the
   eager, fake-mode, compile-session, dynamo and backend cases are in tests/test_compile.py), dynamo puts no guard on
   the flag (no recompile when it flips), and a compiled to_dense (aot_eager, fullgraph, dynamic) equals eager,
   forward and backward.
2. The no-graph test ``torch._C._any_requires_grad(A[, fill_value])``: leaf and non-leaf SparseTensors, views,
   detach, a fill_value tensor that requires grad, a Parameter, no_grad/inference_mode/enable_grad, torch.func
   grad/vjp, checkpointing, saved-tensor hooks, double backward, a list fill_value.
3. ``dense_of(eager=True)`` reads ``A._size``: COO 1-3 dims, uncoalesced, batched CSR, hybrid with array fills,
   0-d, 0-size, over 4 MiB (the huge-page advice), two torch threads, deterministic algorithms.
4. ``_kernels.merge.fill_put_sorted`` reads the fill at its address through numba's compiled entry point: every dtype it
   takes (bit for bit against the dense fill), fills at a storage offset, expanded, as_strided, with negative or
   conjugate bits, NaN payloads and -0.0, a fill on another device, the first call of a dtype (compiled, then
   loaded from numba's cache, in subprocesses), threads racing on first calls.

Defects found (each now a plain regression test): jit.trace and make_fx(tracing_mode="real") replayed uninitialized
memory (the by-address kernels step aside while torch's ops are recorded), a freed fill storage segfaulted (a
RuntimeError), NUMBA_DISABLE_JIT=1 raised (torch ops), forward-mode AD dropped tangents silently (refused).
"""

import os
import subprocess
import sys
import textwrap
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import sparsefill
from sparsefill import SparseTensor
from sparsefill._kernels import merge as _merge

NAN, INF = float("nan"), float("inf")
PASS_DTYPES = [
    torch.bool,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
]
N = (
    3 * 8192 + 5
)  # elements of a 1-D result: over the fill pass's block (numba loads), several blocks


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sparsefill.DensifyWarning)
        yield


@pytest.fixture
def fill_pass_calls(monkeypatch):
    """The results of ``_kernels.merge.fill_put_sorted`` as ``dense_of`` calls it (True: the compiled pass wrote ``out``)."""
    calls, real = [], _merge.fill_put_sorted

    def spy(*args):
        calls.append(real(*args))
        return calls[-1]

    monkeypatch.setattr(_merge, "fill_put_sorted", spy)
    return calls


# ---------------------------------------------------------------------- helpers
def bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes (bit-for-bit comparisons: NaN payloads, signed zeros)."""
    t = t.resolve_conj().resolve_neg().contiguous()
    return t.to(torch.uint8) if t.dtype is torch.bool else t.reshape(-1).view(torch.uint8)


def assert_identical(actual, expected):
    assert type(actual) is torch.Tensor, type(actual)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, (
        actual.dtype,
        expected.dtype,
        actual.shape,
        expected.shape,
    )
    assert torch.equal(bits(actual), bits(expected)), (actual, expected)


def reference(indices, values, size, fill) -> torch.Tensor:
    """The dense tensor of COO ``(indices, values)`` (duplicates add up) and ``fill``, by torch ops alone."""
    indices, size = torch.as_tensor(indices), tuple(size)
    k = indices.shape[0]
    fill = torch.as_tensor(fill, dtype=values.dtype)
    out = fill.expand(size).clone()
    flat = out.view((_prod(size[:k]),) + size[k:])
    if indices.shape[1]:
        lin = torch.zeros(indices.shape[1], dtype=torch.int64)
        for d in range(k):
            lin = lin * size[d] + indices[d]
        keys = lin.unique()
        acc = torch.zeros((keys.numel(),) + size[k:], dtype=values.dtype)
        acc.index_add_(
            0, torch.searchsorted(keys, lin), values
        ) if values.dtype is not torch.bool else acc.index_put_(
            (torch.searchsorted(keys, lin),), values, accumulate=True
        )
        flat[keys] = acc
    return out


def _prod(sizes) -> int:
    n = 1
    for s in sizes:
        n *= s
    return n


def special_values(dtype):
    """Fills that a conversion through a Python number could change: NaN payloads, -0.0, extremes."""
    if dtype is torch.bool:
        return [torch.tensor(True), torch.tensor(False)]
    if dtype.is_complex:
        real = torch.float32 if dtype is torch.complex64 else torch.float64
        parts = special_values(real)
        return [torch.complex(a, b) for a, b in zip(parts, parts[::-1])]
    if dtype.is_floating_point:
        quiet_payload = torch.tensor(
            0x7FC00123 if dtype is torch.float32 else 0x7FF8000000000123,
            dtype=torch.int32 if dtype is torch.float32 else torch.int64,
        ).view(dtype)
        return [
            torch.tensor(-0.0, dtype=dtype),
            torch.tensor(INF, dtype=dtype),
            torch.tensor(-INF, dtype=dtype),
            quiet_payload,
            torch.tensor(torch.finfo(dtype).tiny / 4, dtype=dtype),
            torch.tensor(1.5, dtype=dtype),
        ]
    info = torch.iinfo(dtype)
    return [
        torch.tensor(info.min, dtype=dtype),
        torch.tensor(info.max, dtype=dtype),
        torch.tensor(7, dtype=dtype),
    ]


def values_of(dtype, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        return torch.rand(n, generator=g) > 0.5
    return (torch.randn(n, generator=g, dtype=torch.float64) * 50).to(dtype)


# ---------------------------------------------------------------------- 4. the fill pass
@pytest.mark.parametrize("dtype", PASS_DTYPES, ids=str)
def test_fill_pass_every_dtype_bit_for_bit(dtype, fill_pass_calls):
    """Each dtype the pass takes, each special fill: the result is the dense fill bit for bit (a NaN's payload,
    -0.0, integer extremes), the stored values at their keys, and the compiled pass did it."""
    keys = torch.tensor([0, 7, 8191, 8192, 20000, N - 1])
    vals = values_of(dtype, keys.numel())
    for fill in special_values(dtype):
        A = sparsefill.sparse_coo_tensor(keys[None], vals, (N,), fill_value=fill)
        assert_identical(A.to_dense(), reference(keys[None], vals, (N,), fill))
        I = sparsefill.sparse_coo_tensor(keys[None], vals, (N,), fill_value=sparsefill.indefinite)
        assert_identical(I.to_dense(fill_value=fill), reference(keys[None], vals, (N,), fill))
    assert fill_pass_calls and all(fill_pass_calls)


def _fills_as_views(dtype):
    """0-d fills of value 5 (conjugate/negative views: of a value giving 5) not at their storage's start."""
    base = (
        torch.arange(10).to(dtype)
        if dtype is not torch.bool
        else torch.tensor([False] * 5 + [True] * 5)
    )
    five = base[5]
    views = {
        "offset": five,
        "strided": base[1::2][2],
        "as_strided": base.as_strided((), (), 5),
        "expanded": base[5:6].expand(4)[2],
        "clone": five.clone(),
    }
    if dtype.is_signed or dtype.is_floating_point or dtype.is_complex:
        views["neg"] = torch._neg_view(-base)[5]
    if dtype.is_complex:
        views["conj_view"] = (base + 1j * base).conj()[5]  # 5 - 5j
        views["neg_conj_view"] = torch._neg_view((base + 1j * base).conj())[5]  # -5 + 5j
    return views


@pytest.mark.parametrize("dtype", PASS_DTYPES, ids=str)
def test_fill_pass_reads_views_of_the_fill(dtype):
    """``fill_put_sorted`` called directly with 0-d fills that are views (at a storage offset, strided, as_strided,
    expanded, negative or conjugate bits): ``out`` is ``out.fill_(fill).put_(keys, vals)``."""
    if _merge._compiled() is False:
        pytest.skip("numba not installed: fill_put_sorted is a no-op returning False")
    keys, vals = torch.tensor([3, 9000, 9001]), values_of(dtype, 3)
    for name, fill in _fills_as_views(dtype).items():
        out = torch.empty(N, dtype=dtype)
        assert _merge.fill_put_sorted(out, fill, keys, vals), name
        expected = fill.resolve_conj().resolve_neg().expand(N).clone().put_(keys, vals)
        assert_identical(out, expected)


def test_fill_pass_refuses_what_it_cannot_read():
    """False and ``out`` untouched: a fill on another device, of another dtype or not 0-d, values with negative
    bits, non-contiguous operands, int32 keys, keys and values of different lengths."""
    if _merge._compiled() is False:
        pytest.skip("numba not installed")
    keys, vals, fill = torch.tensor([1, 4]), torch.tensor([2.0, 3.0]), torch.tensor(9.0)
    cases = {
        "meta fill": (fill.to("meta"), keys, vals),
        "f64 fill": (fill.double(), keys, vals),
        "1-d fill": (fill[None], keys, vals),
        "neg vals": (fill, keys, torch._neg_view(vals)),
        "strided vals": (fill, keys, torch.tensor([2.0, 0.0, 3.0])[::2]),
        "int32 keys": (fill, keys.int(), vals),
        "strided keys": (fill, torch.tensor([1, 0, 4])[::2], vals),
        "short keys": (fill, keys[:1], vals),
    }
    for name, (f, k, v) in cases.items():
        out = torch.full((10,), -1.0)
        assert not _merge.fill_put_sorted(out, f, k, v), name
        assert torch.equal(out, torch.full((10,), -1.0)), name
    out = torch.full((10, 2), -1.0).t()  # (a non-contiguous out)
    assert not _merge.fill_put_sorted(out, fill, keys, vals) and torch.equal(
        out, torch.full((2, 10), -1.0)
    )


def test_fill_on_another_device_through_to_dense():
    """``to_dense(fill_value=<meta tensor>)`` of a CPU tensor: a TypeError naming the devices; of a meta tensor: a
    meta result of the right shape (no data read)."""
    I = sparsefill.sparse_coo_tensor([[1, 5]], [3.0, 4.0], (N,), fill_value=sparsefill.indefinite)
    with pytest.raises(TypeError, match="meta"):
        I.to_dense(fill_value=torch.tensor(2.0, device="meta"))
    A = sparsefill.sparse_coo_tensor([[1, 5]], [3.0, 4.0], (N,), fill_value=2.0).to("meta")
    D = A.to_dense()
    assert D.device.type == "meta" and D.shape == (N,) and D.dtype == torch.float32


def test_fill_pass_first_calls_racing_threads(monkeypatch):
    """First calls of every dtype from 8 threads at once (each compiles or loads its entry point): every result
    right, one entry per dtype."""
    if _merge._compiled() is False:
        pytest.skip("numba not installed")
    monkeypatch.setattr(_merge, "_FILL_ENTRY", {})

    def one(i):
        dtype = PASS_DTYPES[i % len(PASS_DTYPES)]
        keys, vals, fill = (
            torch.tensor([[1, 5, 9000 + i]]),
            values_of(dtype, 3, i),
            special_values(dtype)[0],
        )
        A = sparsefill.sparse_coo_tensor(keys, vals, (N + i,), fill_value=fill)
        return torch.equal(bits(A.to_dense()), bits(reference(keys, vals, (N + i,), fill)))

    with ThreadPoolExecutor(8) as ex:
        assert all(ex.map(one, range(40)))
    assert set(_merge._FILL_ENTRY) == set(PASS_DTYPES)


_SCRIPT_DTYPES = textwrap.dedent("""
    import torch, sparsefill
    from sparsefill import _merge
    for dt in (torch.int16, torch.complex128, torch.bool):
        v = torch.tensor([3, -2, 7]).to(dt)
        f = torch.tensor(-5).to(dt).conj() if dt.is_complex else torch.tensor(-5).to(dt)
        A = sparsefill.sparse_coo_tensor([[1, 5, 9000]], v, (20000,), fill_value=f)
        R = f.expand(20000).clone(); R[[1, 5, 9000]] = v
        assert torch.equal(A.to_dense(), R), dt
    stats = _merge._kernels[3].stats
    print(sum(stats.cache_hits.values()), sum(stats.cache_misses.values()))
""")


def _run(script, **env):
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_fill_pass_first_call_compiles_then_loads_from_numba_cache(tmp_path):
    """A fresh process with an empty numba cache compiles the pass's entry point per dtype (misses); the next one
    loads them from the cache (hits); both give the dense result."""
    pytest.importorskip(
        "numba", reason="the compiled kernels under test need numba (without it torch ops run)"
    )
    first = _run(_SCRIPT_DTYPES, NUMBA_CACHE_DIR=str(tmp_path))
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.split() == ["0", "3"], first.stdout
    second = _run(_SCRIPT_DTYPES, NUMBA_CACHE_DIR=str(tmp_path))
    assert second.returncode == 0, second.stderr[-2000:]
    assert second.stdout.split() == ["3", "0"], second.stdout


_SCRIPT_FREED = textwrap.dedent("""
    import sys, torch, sparsefill
    from sparsefill import _merge
    _merge._compiled()
    A = sparsefill.sparse_coo_tensor([[1, 5]], [3., 4.], (20000,), fill_value=2.)
    {"fill": A._fill, "values": A._vals, "indices": A._idx}[sys.argv[1]].untyped_storage().resize_(0)
    try:
        A.to_dense()
    except RuntimeError as e:
        print("RuntimeError", e)
""")


def test_freed_fill_storage_is_an_error_not_a_crash():
    """A fill whose storage was freed (``untyped_storage().resize_(0)``, as FSDP frees parameters): bf518f0 read it
    at ``data_ptr()`` == 0 and the process died of SIGSEGV (before it, ``fill.item()`` raised torch's RuntimeError;
    torch's own ``fill_``/``put_`` crash there too): the fill pass raises a RuntimeError naming the part."""
    pytest.importorskip(
        "numba", reason="the compiled kernels under test need numba (without it torch ops run)"
    )
    r = subprocess.run(
        [sys.executable, "-c", _SCRIPT_FREED, "fill"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and r.stdout.startswith("RuntimeError"), (
        r.returncode,
        r.stdout,
        r.stderr[-1000:],
    )


@pytest.mark.parametrize("part", ["values", "indices"])
def test_freed_values_or_indices_storage_is_an_error_not_a_crash(part):
    pytest.importorskip(
        "numba", reason="the compiled kernels under test need numba (without it torch ops run)"
    )
    r = subprocess.run(
        [sys.executable, "-c", _SCRIPT_FREED, part], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and r.stdout.startswith("RuntimeError"), (
        r.returncode,
        r.stdout,
        r.stderr[-1000:],
    )


def test_numba_disable_jit_falls_back_to_torch_ops():
    """NUMBA_DISABLE_JIT=1 (numba's debugging switch): the pure-Python kernels cannot run (before bf518f0 a
    NotImplementedError, after it an AttributeError, for every to_dense of >= 8192 elements); 4a91f3b: torch ops."""
    pytest.importorskip(
        "numba", reason="the compiled kernels under test need numba (without it torch ops run)"
    )
    script = (
        "import torch, sparsefill\n"
        "A = sparsefill.sparse_coo_tensor([[1, 5]], [3., 4.], (20000,), fill_value=2.)\n"
        "R = torch.full((20000,), 2.); R[[1, 5]] = torch.tensor([3., 4.])\n"
        "assert torch.equal(A.to_dense(), R)\n"
    )
    r = _run(script, NUMBA_DISABLE_JIT="1")
    assert r.returncode == 0, r.stderr[-1500:]


# ---------------------------------------------------------------------- 3. dense_of(eager=True): layouts and sizes
def _coo_cases():
    """``(name, indices, values, size, fill)``: 1-3 sparse dims, uncoalesced, hybrid with scalar and array fills,
    0-d, 0-size, a result over 4 MiB (the huge-page advice), more than a quarter stored."""
    g = torch.Generator().manual_seed(1)
    big = (1 << 20) + 3  # float32: over _HUGE_MIN (4 MiB)
    rows = torch.randint(0, 300, (40,), generator=g)
    return [
        ("1d", [[1, 4, 6]], torch.tensor([1.0, -2.0, 3.0]), (9,), 2.5),
        ("1d_uncoalesced", [[4, 1, 4]], torch.tensor([1.0, -2.0, 3.0]), (9,), NAN),
        ("1d_over_4MiB", [[0, 7, big - 1]], torch.tensor([1.0, -2.0, 3.0]), (big,), -0.0),
        ("1d_over_4MiB_dup", [[7, 0, 7]], torch.tensor([1.0, -2.0, 3.0]), (big,), INF),
        ("1d_half_stored", [list(range(0, 20000, 2))], torch.arange(10000.0), (20000,), -1.0),
        (
            "2d",
            torch.stack([rows, (rows * 7) % 200]),
            torch.randn(40, generator=g),
            (300, 200),
            0.5,
        ),
        ("2d_uncoalesced", [[0, 2, 0], [1, 0, 1]], torch.tensor([1.0, 2.0, 3.0]), (3, 4), -0.0),
        ("3d", [[0, 1, 1], [2, 0, 2], [3, 3, 0]], torch.tensor([1.0, 2.0, 3.0]), (2, 3, 4), -INF),
        ("hybrid", [[0, 2], [1, 3]], torch.tensor([[1.0, 2.0], [3.0, 4.0]]), (3, 4, 2), 7.0),
        (
            "hybrid_array_fill",
            [[0, 2], [1, 3]],
            torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
            (3, 4, 2),
            torch.tensor([-0.0, NAN]),
        ),
        (
            "hybrid_uncoalesced",
            [[2, 2]],
            torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
            (3, 2),
            torch.tensor([5.0, 6.0]),
        ),
        ("0d", torch.zeros(0, 1, dtype=torch.int64), torch.tensor([3.0]), (), 1.0),
        ("0d_unspecified", torch.zeros(0, 0, dtype=torch.int64), torch.zeros(0), (), -0.0),
        ("0size", torch.zeros(2, 0, dtype=torch.int64), torch.zeros(0), (0, 3), 1.0),
        ("0size_hybrid", torch.zeros(1, 0, dtype=torch.int64), torch.zeros(0, 0), (3, 0), 1.0),
    ]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("deterministic", [False, True])
def test_coo_layouts_and_sizes(threads, deterministic):
    """Every COO case, fill definite and replaced (``to_dense(fill_value=)`` of the indefinite tensor), on one and
    two torch threads, with and without deterministic algorithms: the dense result bit for bit."""
    old_threads, old_det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)
    try:
        for name, idx, vals, size, fill in _coo_cases():
            R = reference(idx, vals, size, fill)
            A = sparsefill.sparse_coo_tensor(idx, vals, size, fill_value=fill)
            assert_identical(A.to_dense(), R)
            assert_identical(A.coalesce().to_dense(), R)
            I = sparsefill.sparse_coo_tensor(idx, vals, size, fill_value=sparsefill.indefinite)
            assert_identical(I.to_dense(fill_value=fill), R)
    finally:
        torch.set_num_threads(old_threads)
        torch.use_deterministic_algorithms(old_det)


def test_csr_plain_batched_hybrid():
    """CSR, batched CSR (flat values after linear_parts: the values' dims counted again) and hybrid CSR."""
    crow, col = torch.tensor([[0, 1, 3, 3], [0, 0, 2, 3]]), torch.tensor([[2, 0, 3], [1, 3, 0]])
    v = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    for fill in (2.5, -0.0, NAN):
        B = sparsefill.sparse_csr_tensor(crow, col, v, (2, 3, 4), fill_value=fill)
        R = torch.full((2, 3, 4), fill)
        for b in range(2):
            for r in range(3):
                for p in range(int(crow[b, r]), int(crow[b, r + 1])):
                    R[b, r, col[b, p]] = v[b, p]
        assert_identical(B.to_dense(), R)
        assert_identical(
            sparsefill.sparse_csr_tensor(crow[1], col[1], v[1], (3, 4), fill_value=fill).to_dense(),
            R[1],
        )
        I = sparsefill.sparse_csr_tensor(crow, col, v, (2, 3, 4), fill_value=sparsefill.indefinite)
        assert_identical(I.to_dense(fill_value=fill), R)
    H = sparsefill.sparse_csr_tensor(
        crow[0],
        col[0],
        torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]),
        (3, 4, 2),
        fill_value=torch.tensor([-1.0, NAN]),
    )
    R = torch.tensor([-1.0, NAN]).expand(3, 4, 2).clone()
    R[0, 2], R[1, 0], R[1, 3] = (
        torch.tensor([1.0, 2.0]),
        torch.tensor([3.0, 4.0]),
        torch.tensor([5.0, 6.0]),
    )
    assert_identical(H.to_dense(), R)


def test_parts_at_an_offset_or_strided():
    """Values and indices that are views (at a storage offset: the pass reads data_ptr(); strided: refused there),
    the fill a view of the values' storage."""
    store = torch.arange(20.0)
    ibase = torch.tensor([[0, 9, 1, 9, 4, 9, 8000, 9]])
    cases = {
        "offset": (ibase[:, ::2].contiguous()[:, 1:], store[5:8]),
        "strided_vals": (ibase[:, 2::2], store[::3][:3]),
        "strided_idx": (ibase[:, 2::2], store[5:8].clone()),
    }
    for name, (idx, vals) in cases.items():
        A = sparsefill.sparse_coo_tensor(idx, vals, (N,), fill_value=0.0)
        A._fill = store[11]  # (a 0-d view at an offset of the values' storage)
        assert_identical(A.to_dense(), reference(idx, vals, (N,), 11.0))


def test_size_read_without_the_op_layer():
    """``A._size`` (read instead of ``A.shape``) stays A's shape: after ``A.data = B``, for a view after its base
    changed (the sync), and after refused in-place metadata ops (A unchanged)."""
    A = sparsefill.sparse_coo_tensor([[0, 1], [2, 0]], [1.0, 2.0], (2, 3), fill_value=-1.0)
    B = sparsefill.sparse_coo_tensor([[0], [1]], [5.0], (3, 2), fill_value=4.0)
    A.data = B
    assert tuple(A._size) == tuple(A.shape) == (3, 2)
    assert_identical(A.to_dense(), B.to_dense())
    A = sparsefill.sparse_coo_tensor([[0, 1], [2, 0]], [1.0, 2.0], (2, 3), fill_value=-1.0)
    V, T = A[1], A.t()
    A.mul_(2)
    assert_identical(V.to_dense(), A.to_dense()[1])
    assert_identical(T.to_dense(), A.to_dense().t())
    for op in (lambda X: X.t_(), lambda X: X.unsqueeze_(0), lambda X: X.resize_(3, 2)):
        with pytest.raises(ValueError):
            op(A)
        assert tuple(A._size) == tuple(A.shape) == (2, 3)
        assert_identical(
            A.to_dense(), reference([[0, 1], [2, 0]], torch.tensor([2.0, 4.0]), (2, 3), -2.0)
        )


# ---------------------------------------------------------------------- 2. the no-graph test (autograd)
ROWS, COLS, SIZE = torch.tensor([0, 1, 2, 2]), torch.tensor([1, 0, 2, 3]), (3, 4)
W = torch.arange(12.0, dtype=torch.float64).reshape(SIZE) - 5


def leaf(fill=2.0, layout="coo"):
    """``(A, v)``: A built from the leaf values ``v`` (requires grad)."""
    v = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=torch.float64, requires_grad=True)
    if layout == "coo":
        return sparsefill.sparse_coo_tensor(torch.stack([ROWS, COLS]), v, SIZE, fill_value=fill), v
    return sparsefill.sparse_csr_tensor([0, 1, 2, 4], COLS, v, SIZE, fill_value=fill), v


def dense_ref(v, fill):
    """The dense construction of ``leaf``'s tensor, differentiable in ``v`` and a tensor ``fill``."""
    f = torch.as_tensor(fill, dtype=torch.float64)
    return f.expand(SIZE).clone().index_put((ROWS, COLS), v)


def grads(loss, *inputs):
    return torch.autograd.grad(loss, inputs, allow_unused=True)


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_graph_recorded_for_values_views_nonleaf(layout):
    """Values that require grad, reached through A, A[1], A.t(), A * 3 (non-leaf), A.detach() (no graph): the
    gradient of the values is the dense construction's."""
    v0 = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=torch.float64, requires_grad=True)
    for name, f in {
        "A": lambda A: A,
        "A[1]": lambda A: A[1],
        "A.t()": lambda A: A.t(),
        "A*3": lambda A: A * 3,
        "A[:, 1:]": lambda A: A[:, 1:],
    }.items():
        A, v = leaf(layout=layout)
        D = f(A).to_dense()
        assert D.requires_grad and D.grad_fn is not None, name
        R = f(dense_ref(v0, 2.0))
        torch.testing.assert_close(D, R, rtol=0, atol=0)
        Wn = torch.arange(R.numel(), dtype=torch.float64).reshape(R.shape) - 3
        (g,), (e,) = grads((D * Wn).sum(), v), grads((R * Wn).sum(), v0)
        torch.testing.assert_close(g, e, msg=name)
    A, v = leaf(layout=layout)
    D = A.detach().to_dense()
    assert not D.requires_grad and D.grad_fn is None


def test_sparse_leaf_and_parameter():
    """A SparseTensor leaf (requires_grad_()) and an nn.Parameter of one: the gradient is a SparseTensor whose
    dense form is the upstream gradient."""
    A, _ = leaf()
    A = A.detach().requires_grad_()
    (A.to_dense() * W).sum().backward()
    assert isinstance(A.grad, SparseTensor)
    torch.testing.assert_close(A.grad.to_dense(), W)
    P = torch.nn.Parameter(leaf()[0].detach())
    (P.to_dense() * W).sum().backward()
    torch.testing.assert_close(P.grad.to_dense(), W)


def test_fill_value_tensor_requiring_grad():
    """``to_dense(fill_value=f)`` of an indefinite tensor, ``f`` requiring grad, the values requiring grad or not:
    the graph is recorded and ``f`` gets the sum over the unspecified positions (the dense construction's)."""
    for values_grad in (True, False):
        A, v = leaf(fill=sparsefill.indefinite)
        if not values_grad:
            A, v = A.detach(), v.detach()
        f = torch.tensor(0.25, dtype=torch.float64, requires_grad=True)
        D = A.to_dense(fill_value=f)
        assert D.requires_grad
        f0, v0 = f.detach().requires_grad_(), v.detach().requires_grad_()
        R = dense_ref(v0, f0)
        torch.testing.assert_close(D, R, rtol=0, atol=0)
        g, e = grads((D * W).sum(), f, *([v] if values_grad else [])), grads((R * W).sum(), f0, v0)
        torch.testing.assert_close(g[0], e[0])
        if values_grad:
            torch.testing.assert_close(g[1], e[1])


def test_list_fill_value_of_tensors_requiring_grad_as_torch_tensor():
    """A list/tuple fill_value holding tensors that require grad (``_any_requires_grad`` looks into lists, not
    tuples): no graph and no gradient, as ``torch.tensor([f1, f2])`` (a tensor fill_value is the way to one)."""
    H = sparsefill.sparse_coo_tensor(
        [[0, 2]], torch.tensor([[1.0, 2.0], [3.0, 4.0]]), (3, 2), fill_value=sparsefill.indefinite
    )
    f1, f2 = torch.tensor(5.0, requires_grad=True), torch.tensor(6.0, requires_grad=True)
    for fv in ([f1, f2], (f1, f2)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            D = H.to_dense(fill_value=fv)
        assert not D.requires_grad
        torch.testing.assert_close(D, torch.tensor([[1.0, 2.0], [5.0, 6.0], [3.0, 4.0]]))
    D = H.to_dense(fill_value=torch.stack([f1, f2]))
    D.sum().backward()
    assert f1.grad == 1 and f2.grad == 1


def test_grad_modes():
    """no_grad and inference_mode: no graph (the kernel alone), same values; enable_grad inside no_grad: the
    graph; an inference tensor: its dense form."""
    A, v = leaf()
    R = dense_ref(v.detach(), 2.0)
    with torch.no_grad():
        D = A.to_dense()
    assert not D.requires_grad and torch.equal(D, R)
    with torch.inference_mode():
        D = A.to_dense()
    assert not D.requires_grad and D.is_inference() and torch.equal(D, R)
    with torch.no_grad(), torch.enable_grad():
        D = A.to_dense()
    (g,) = grads((D * W).sum(), v)
    torch.testing.assert_close(g, W[ROWS, COLS])
    with torch.inference_mode():
        I, _ = leaf()
    assert torch.equal(I.to_dense(), R)


def test_torch_func_grad_vjp_jacrev():
    """torch.func.grad/vjp/jacrev of the values through the constructor and to_dense, and of a tensor fill."""

    def dense_of_values(vals):
        return sparsefill.sparse_coo_tensor(
            torch.stack([ROWS, COLS]), vals, SIZE, fill_value=2.0
        ).to_dense()

    v = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=torch.float64)
    torch.testing.assert_close(
        torch.func.grad(lambda x: (dense_of_values(x) * W).sum())(v), W[ROWS, COLS]
    )
    out, vjp = torch.func.vjp(dense_of_values, v)
    torch.testing.assert_close(out, dense_ref(v, 2.0))
    torch.testing.assert_close(vjp(W)[0], W[ROWS, COLS])
    J = torch.func.jacrev(lambda x: dense_of_values(x)[1])(v)
    torch.testing.assert_close(J, torch.func.jacrev(lambda x: dense_ref(x, 2.0)[1])(v))

    def dense_of_fill(f):
        return sparsefill.sparse_coo_tensor(
            torch.stack([ROWS, COLS]), v, SIZE, fill_value=f
        ).to_dense()

    f = torch.tensor(0.5, dtype=torch.float64)
    torch.testing.assert_close(
        torch.func.grad(lambda f: (dense_of_fill(f) * W).sum())(f), W.sum() - W[ROWS, COLS].sum()
    )


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint(reentrant):
    from torch.utils.checkpoint import checkpoint

    A, v = leaf()
    out = checkpoint(lambda a: (a.to_dense() ** 2 * W).sum(), A, use_reentrant=reentrant)
    out.backward()  # (use_reentrant=True: .backward() only)
    torch.testing.assert_close(v.grad, 2 * v.detach() * W[ROWS, COLS])


def test_saved_tensor_hooks_and_double_backward():
    """Saved-tensor hooks see plain tensors (pack/unpack round trip); create_graph's second derivative."""
    A, v = leaf()
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: (packed.append(type(t)), t.clone())[1], lambda t: t
    ):
        out = (A.to_dense() ** 3 * W).sum()
    (g,) = torch.autograd.grad(out, v, create_graph=True)
    torch.testing.assert_close(g, 3 * v.detach() ** 2 * W[ROWS, COLS])
    (gg,) = torch.autograd.grad(g.sum(), v)
    torch.testing.assert_close(gg, 6 * v.detach() * W[ROWS, COLS])
    assert packed and set(packed) == {torch.Tensor}


def test_forward_ad_tangent_kept_or_refused():
    """Dual values entering the constructor: the tangent kept or a NotImplementedError (it was dropped silently
    before 732b1af)."""
    import torch.autograd.forward_ad as fwAD

    v = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=torch.float64)
    with fwAD.dual_level():
        dv = fwAD.make_dual(v, torch.ones(4, dtype=torch.float64))
        try:
            D = sparsefill.sparse_coo_tensor(
                torch.stack([ROWS, COLS]), dv, SIZE, fill_value=2.0
            ).to_dense()
        except NotImplementedError:
            return  # (refused: acceptable)
        tangent = fwAD.unpack_dual(D).tangent
        assert tangent is not None
        torch.testing.assert_close(tangent, fwAD.unpack_dual(dense_ref(dv, 2.0)).tangent)


def test_forward_ad_of_a_dual_fill_value():
    """``to_dense(fill_value=<dual>)``, a third of the positions stored (torch's fill_ and put_, no by-address pass):
    the fill's tangent at the unspecified positions, as dense."""
    import torch.autograd.forward_ad as fwAD

    I, _ = leaf(fill=sparsefill.indefinite)
    I = I.detach()
    with fwAD.dual_level():
        f = fwAD.make_dual(
            torch.tensor(4.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)
        )
        try:
            D = I.to_dense(fill_value=f)
        except NotImplementedError:
            return
        expected = fwAD.unpack_dual(dense_ref(I._vals, f)).tangent
        torch.testing.assert_close(fwAD.unpack_dual(D).tangent, expected)


def test_forward_ad_of_a_dual_fill_value_through_the_fill_pass():
    import torch.autograd.forward_ad as fwAD

    I = sparsefill.sparse_coo_tensor(
        [[1, 5, N - 1]], [3.0, 4.0, 5.0], (N,), fill_value=sparsefill.indefinite
    )
    with fwAD.dual_level():
        f = fwAD.make_dual(torch.tensor(2.0), torch.tensor(1.0))
        try:
            D = I.to_dense(fill_value=f)
        except NotImplementedError:
            return
        tangent = fwAD.unpack_dual(D).tangent
        assert tangent is not None
        torch.testing.assert_close(tangent, reference([[1, 5, N - 1]], torch.zeros(3), (N,), 1.0))


def test_forward_ad_of_a_dual_sparse_tensor():
    import torch.autograd.forward_ad as fwAD

    A, _ = leaf()
    A = A.detach()
    T = sparsefill.sparse_coo_tensor(
        torch.stack([ROWS, COLS]), torch.ones(4, dtype=torch.float64), SIZE
    )
    with fwAD.dual_level():
        dA = fwAD.make_dual(A, T)
        try:
            D = dA.to_dense()
        except NotImplementedError:
            return
        tangent = fwAD.unpack_dual(D).tangent
        assert tangent is not None
        torch.testing.assert_close(tangent, T.to_dense())


# ---------------------------------------------------------------------- 1. traced(): export, make_fx, compile, jit
_FAKE = torch._C._TorchDispatchModeKey.FAKE


def old_traced() -> bool:
    """``traced()`` before bf518f0."""
    return torch.compiler.is_compiling() or torch._C._get_dispatch_mode(_FAKE) is not None


def _probe(x):
    from sparsefill._kernels.trace import traced

    return x + (1 if traced() else 0) + (10 if old_traced() else 0)


def test_traced_agrees_under_export_and_make_fx():
    """torch.export strict (dynamo) and non-strict (the flag): both True (11); make_fx real: both False; fake and
    symbolic: both True. (Eager, fake mode, compile session, dynamo, backend: tests/test_compile.py.)"""

    class M(torch.nn.Module):
        def forward(self, x):
            return _probe(x)

    x = torch.zeros(1)
    for strict in (True, False):
        assert torch.equal(torch.export.export(M(), (x,), strict=strict).module()(x), x + 11), (
            strict
        )
    from torch.fx.experimental.proxy_tensor import make_fx

    for mode, expected in (("real", 0), ("fake", 11), ("symbolic", 11)):
        assert torch.equal(make_fx(_probe, tracing_mode=mode)(x)(x), x + expected), mode


def test_export_to_dense_of_a_parameter_and_of_constructed_values():
    """torch.export (strict and non-strict) of a module holding a SparseTensor parameter, and of a function building
    one from its input: the exported program gives eager's result (the general path, not the by-address pass)."""

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.A = torch.nn.Parameter(
                sparsefill.sparse_coo_tensor(
                    [[1, 5, N - 1]], [1.0, 2.0, 3.0], (N,), fill_value=-0.0
                )
            )

        def forward(self, x):
            return x + self.A.to_dense()

    class C(torch.nn.Module):
        def forward(self, v):
            return sparsefill.sparse_coo_tensor(
                torch.tensor([[1, 5, N - 1]]), v, (N,), fill_value=2.0
            ).to_dense()

    m, x, v = M(), torch.randn(N), torch.tensor([7.0, 8.0, 9.0])
    for strict in (True, False):
        assert_identical(torch.export.export(m, (x,), strict=strict).module()(x), m(x))
        assert_identical(
            torch.export.export(C(), (torch.ones(3),), strict=strict).module()(v), C()(v)
        )


def test_compiled_to_dense_matches_eager_forward_backward_no_recompile():
    """aot_eager, fullgraph, dynamic: to_dense of A, A.t(), A[1] and of an indefinite A with a tensor fill_value
    that requires grad, values' and fill's gradients as eager; new values/nse of the same flags reuse the graph;
    flipping the compile flag between calls (another thread compiling) recompiles nothing."""

    def f(A, I, fv):
        return (
            (A.to_dense() * W).sum()
            + (A.t().to_dense() ** 2).sum()
            + (A[1].to_dense() * fv).sum()
            + (I.to_dense(fill_value=fv) * W).sum()
        )

    def inputs(n, seed):
        g = torch.Generator().manual_seed(seed)
        v = torch.randn(n, dtype=torch.float64, generator=g, requires_grad=True)
        idx = torch.stack(
            [torch.arange(n) % 3, torch.arange(n) % 4]
        )  # (distinct for n <= 12: coalesced)
        A = sparsefill.sparse_coo_tensor(idx, v, SIZE, fill_value=1.5)
        I = sparsefill.sparse_coo_tensor(idx, v, SIZE, fill_value=sparsefill.indefinite)
        return A, I, torch.tensor(0.5, dtype=torch.float64, requires_grad=True), v

    torch._dynamo.reset()
    cf = torch.compile(f, backend="aot_eager", fullgraph=True, dynamic=True)
    A, I, fv, v = inputs(5, 0)
    cf(A, I, fv)  # (the first compile)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for n, seed, flag in ((5, 1, False), (7, 2, False), (6, 3, True)):
            A, I, fv, v = inputs(n, seed)
            old = torch.compiler._is_compiling_flag
            torch.compiler._is_compiling_flag = flag
            try:
                out = cf(A, I, fv)
            finally:
                torch.compiler._is_compiling_flag = old
            g = grads(out, v, fv)
            A, I, fv, v = inputs(n, seed)
            ref = f(A, I, fv)
            e = grads(ref, v, fv)
            torch.testing.assert_close(out, ref)
            torch.testing.assert_close(g[0], e[0])
            torch.testing.assert_close(g[1], e[1])
    torch._dynamo.reset()


def test_eager_to_dense_while_another_thread_compiles():
    """The compile flag is process-wide: set (another thread compiling), an eager to_dense takes the general path
    (traced() True): the same result, the same gradients."""
    A, v = leaf()
    B = sparsefill.sparse_coo_tensor([[1, 5, N - 1]], [1.0, 2.0, 3.0], (N,), fill_value=NAN)
    old = torch.compiler._is_compiling_flag
    torch.compiler._is_compiling_flag = True
    try:
        DB, D = B.to_dense(), A.to_dense()
        (g,) = grads((D * W).sum(), v)
    finally:
        torch.compiler._is_compiling_flag = old
    assert_identical(DB, reference([[1, 5, N - 1]], torch.tensor([1.0, 2.0, 3.0]), (N,), NAN))
    torch.testing.assert_close(D, dense_ref(v.detach(), 2.0), rtol=0, atol=0)
    torch.testing.assert_close(g, W[ROWS, COLS])


def test_jit_trace_replays_to_dense():
    """torch.jit.trace of to_dense (>= 8192 elements, <= 1/4 stored): bf518f0 recorded new_empty alone (the by-address
    pass wrote memory the tracer never sees; before, fill.item() raised a numba TypingError at trace time) and the
    replay returned uninitialized memory; fixed in 4a91f3b (the kernels decline while jit.trace records)."""
    if _merge._compiled() is False:
        pytest.skip("numba not installed: the torch ops are traced")
    idx = torch.tensor([[1, 5, N - 1]])

    def f(v):
        return sparsefill.sparse_coo_tensor(idx, v, (N,), fill_value=2.0).to_dense() * 1

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced_f = torch.jit.trace(f, (torch.ones(3),), check_trace=False)
    graph = str(traced_f.graph)
    assert any(
        op in graph for op in ("aten::fill_", "aten::copy_", "aten::full", "aten::expand")
    ), graph
    v = torch.tensor([7.0, 8.0, 9.0])
    assert_identical(traced_f(v), f(v))


def test_jit_trace_small_tensor_without_the_pass():
    """Under the pass's size (numba not needed) torch.jit.trace records fill_ and put_: the replay is right (the
    contrast to the test above)."""
    idx = torch.tensor([[1, 5, 60]])

    def f(v):
        return sparsefill.sparse_coo_tensor(idx, v, (64,), fill_value=2.0).to_dense() * 1

    calls = []
    real = _merge.fill_put_sorted
    try:
        _merge.fill_put_sorted = lambda *a: calls.append(1) or False  # (as without numba)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traced_f = torch.jit.trace(f, (torch.ones(3),), check_trace=False)
    finally:
        _merge.fill_put_sorted = real
    assert "aten::fill_" in str(traced_f.graph)
    v = torch.tensor([7.0, 8.0, 9.0])
    assert_identical(traced_f(v), f(v))


def test_make_fx_real_replays_to_dense():
    if _merge._compiled() is False:
        pytest.skip("numba not installed")
    from torch.fx.experimental.proxy_tensor import make_fx

    A = sparsefill.sparse_coo_tensor([[1, 5, N - 1]], [1.0, 2.0, 3.0], (N,), fill_value=2.0)
    gm = make_fx(lambda A: A.to_dense() * 1, tracing_mode="real")(A)
    ops = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert ops & _WRITES, (
        ops
    )  # (deterministic: new_empty's memory may happen to hold the right values)
    assert_identical(gm(A), A.to_dense())


_WRITES = {
    "aten.fill_.Tensor",
    "aten.fill_.Scalar",
    "aten.copy_.default",
    "aten.put_.default",
    "aten.index_copy_.default",
    "aten.index_put_.default",
    "aten.full.default",
    "aten.expand.default",
}


def test_subclass_fill_value_same_type_on_every_path():
    """A fill_value of a torch.Tensor subclass (its __torch_function__ wraps results): the result's type is the same
    on the no-graph path and the graph path (before bf518f0 the no-graph path ran under DisableTorchFunctionSubclass
    and gave a plain Tensor where the graph path gave the subclass), as torch.where(mask, x, fill) gives it."""

    class Tagged(torch.Tensor):
        pass

    for n in (64, N):
        I = sparsefill.sparse_coo_tensor(
            [[1, 5, n - 1]], [3.0, 4.0, 5.0], (n,), fill_value=sparsefill.indefinite
        )
        Ig = sparsefill.sparse_coo_tensor(
            [[1, 5, n - 1]],
            torch.tensor([3.0, 4.0, 5.0], requires_grad=True),
            (n,),
            fill_value=sparsefill.indefinite,
        )
        f = torch.tensor(2.0).as_subclass(Tagged)
        kinds = {type(I.to_dense(fill_value=f)), type(Ig.to_dense(fill_value=f))}
        with torch.no_grad():
            kinds.add(type(Ig.to_dense(fill_value=f)))
        assert kinds == {type(torch.where(torch.zeros(n, dtype=torch.bool), torch.zeros(n), f))}, (
            kinds
        )
        R = reference([[1, 5, n - 1]], torch.tensor([3.0, 4.0, 5.0]), (n,), 2.0)
        assert torch.equal(I.to_dense(fill_value=f).as_subclass(torch.Tensor), R)
