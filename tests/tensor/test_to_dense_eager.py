"""``A.to_dense()``'s eager path against the dense tensor ``A`` stands for, bit for bit (NaN payloads,
-0.0), same dtype::

    A.to_dense() == the dense tensor A stands for

- ``_kernels.merge.fill_put_sorted`` reads the fill at its address through numba's compiled entry point: every
  dtype it takes, fills at a storage offset, expanded, as_strided, with negative or conjugate bits, NaN
  payloads and -0.0, a fill on another device, the first call of a dtype (compiled, then loaded from
  numba's cache, in subprocesses), threads racing on first calls; a freed storage is a RuntimeError (never
  a crash) and ``NUMBA_DISABLE_JIT=1`` falls back to torch ops;
- ``dense_of(eager=True)`` reads ``A._size``: COO 1-3 dims, uncoalesced, batched CSR, hybrid with array
  fills, 0-d, 0-size, over 4 MiB (the huge-page advice), two torch threads, deterministic algorithms;
- a fill_value of a torch.Tensor subclass gives the same result type on every path.
"""

import ast
import os
import subprocess
import sys
import textwrap
import warnings
from concurrent.futures import ThreadPoolExecutor
import pytest
import torch
import sparsefill
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
    from sparsefill._kernels import merge as _merge
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
    import os, sys, torch, sparsefill
    from sparsefill._kernels import merge as _merge
    _merge._compiled()
    for part in ("fill", "values", "indices"):
        sys.stdout.flush()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # each part in a child forked after the imports: a crash kills the child alone
            os.close(r)
            A = sparsefill.sparse_coo_tensor([[1, 5]], [3., 4.], (20000,), fill_value=2.)
            {"fill": A._fill, "values": A._vals, "indices": A._idx}[part].untyped_storage().resize_(0)
            try:
                A.to_dense()
                os.write(w, b"no error")
            except RuntimeError as e:
                os.write(w, f"RuntimeError {e}".encode())
            os._exit(0)
        os.close(w)
        out = b"".join(iter(lambda: os.read(r, 4096), b"")).decode()
        os.close(r)
        _, status = os.waitpid(pid, 0)
        print(f"{part}\t{os.waitstatus_to_exitcode(status)}\t{out!r}")
""")


@pytest.fixture(scope="module")
def freed_storage_outcomes():
    """``{part: (exit code, output)}`` of ``to_dense()`` after the part's storage is freed, each part in a
    fresh process (forked after one import of torch and sparsefill)."""
    pytest.importorskip(
        "numba", reason="the compiled kernels under test need numba (without it torch ops run)"
    )
    r = subprocess.run(
        [sys.executable, "-c", _SCRIPT_FREED], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-1000:]
    rows = (line.split("\t") for line in r.stdout.splitlines())
    return {part: (int(code), ast.literal_eval(out)) for part, code, out in rows}


def test_freed_fill_storage_is_an_error_not_a_crash(freed_storage_outcomes):
    """A fill whose storage was freed (``untyped_storage().resize_(0)``, as FSDP frees parameters): reading it at
    ``data_ptr()`` == 0 would kill the process (SIGSEGV; torch's own ``fill_``/``put_`` crash there too): the
    fill pass raises a RuntimeError naming the part."""
    code, out = freed_storage_outcomes["fill"]
    assert code == 0 and out.startswith("RuntimeError"), (code, out)


@pytest.mark.parametrize("part", ["values", "indices"])
def test_freed_values_or_indices_storage_is_an_error_not_a_crash(part, freed_storage_outcomes):
    code, out = freed_storage_outcomes[part]
    assert code == 0 and out.startswith("RuntimeError"), (code, out)


def test_numba_disable_jit_falls_back_to_torch_ops():
    """NUMBA_DISABLE_JIT=1 (numba's debugging switch): the pure-Python kernels cannot run (they would raise for
    every to_dense of >= 8192 elements): torch ops run instead."""
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


def test_subclass_fill_value_same_type_on_every_path():
    """A fill_value of a torch.Tensor subclass (its __torch_function__ wraps results): the result's type is the same
    on the no-graph path and the graph path (a no-graph path under DisableTorchFunctionSubclass would give a plain
    Tensor where the graph path gives the subclass), as torch.where(mask, x, fill) gives it."""

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
