"""Adversarial review of commit bf518f0 (issue 18: ``SparseTensor.to_dense()``'s eager path shortened) and its
follow-ups (b3470ea, 6aff509, a8457f3): every way a user reaches the changed code, against the dense result.

The invariant, forward and backward (DESIGN.md section 1)::

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
4. ``_merge.fill_put_sorted`` reads the fill at its address through numba's compiled entry point: every dtype it
   takes (bit for bit against the dense fill), fills at a storage offset, expanded, as_strided, with negative or
   conjugate bits, NaN payloads and -0.0, a fill on another device, the first call of a dtype (compiled, then
   loaded from numba's cache, in subprocesses), threads racing on first calls.

Defects found are strict xfails naming the defect (see each reason).
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
from sparsefill import SparseTensor, _convert, _merge

NAN, INF = float("nan"), float("inf")
PASS_DTYPES = [torch.bool, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.float32,
               torch.float64, torch.complex64, torch.complex128]
N = 3 * 8192 + 5  # elements of a 1-D result: over the fill pass's block (numba loads), several blocks


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sparsefill.DensifyWarning)
        yield


@pytest.fixture
def fill_pass_calls(monkeypatch):
    """The results of ``_merge.fill_put_sorted`` as ``dense_of`` calls it (True: the compiled pass wrote ``out``)."""
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
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, \
        (actual.dtype, expected.dtype, actual.shape, expected.shape)
    assert torch.equal(bits(actual), bits(expected)), (actual, expected)


def reference(indices, values, size, fill) -> torch.Tensor:
    """The dense tensor of COO ``(indices, values)`` (duplicates add up) and ``fill``, by torch ops alone."""
    indices, size = torch.as_tensor(indices), tuple(size)
    k = indices.shape[0]
    fill = torch.as_tensor(fill, dtype=values.dtype)
    out = fill.expand(size).clone()
    flat = out.view((-1,) + size[k:])
    if indices.shape[1]:
        lin = torch.zeros(indices.shape[1], dtype=torch.int64)
        for d in range(k):
            lin = lin * size[d] + indices[d]
        keys = lin.unique()
        acc = torch.zeros((keys.numel(),) + size[k:], dtype=values.dtype)
        acc.index_add_(0, torch.searchsorted(keys, lin), values) if values.dtype is not torch.bool else \
            acc.index_put_((torch.searchsorted(keys, lin),), values, accumulate=True)
        flat[keys] = acc
    return out


def special_values(dtype):
    """Fills that a conversion through a Python number could change: NaN payloads, -0.0, extremes."""
    if dtype is torch.bool:
        return [torch.tensor(True), torch.tensor(False)]
    if dtype.is_complex:
        real = torch.float32 if dtype is torch.complex64 else torch.float64
        parts = special_values(real)
        return [torch.complex(a, b) for a, b in zip(parts, parts[::-1])]
    if dtype.is_floating_point:
        quiet_payload = torch.tensor(0x7FC00123 if dtype is torch.float32 else 0x7FF8000000000123,
                                     dtype=torch.int32 if dtype is torch.float32 else torch.int64).view(dtype)
        return [torch.tensor(-0.0, dtype=dtype), torch.tensor(INF, dtype=dtype), torch.tensor(-INF, dtype=dtype),
                quiet_payload, torch.tensor(torch.finfo(dtype).tiny / 4, dtype=dtype), torch.tensor(1.5, dtype=dtype)]
    info = torch.iinfo(dtype)
    return [torch.tensor(info.min, dtype=dtype), torch.tensor(info.max, dtype=dtype), torch.tensor(7, dtype=dtype)]


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
    base = torch.arange(10).to(dtype) if dtype is not torch.bool else torch.tensor([False] * 5 + [True] * 5)
    five = base[5]
    views = {"offset": five, "strided": base[1::2][2], "as_strided": base.as_strided((), (), 5),
             "expanded": base[5:6].expand(4)[2], "clone": five.clone()}
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
    keys, vals, fill = torch.tensor([1, 4]), torch.tensor([2., 3.]), torch.tensor(9.)
    cases = {"meta fill": (fill.to("meta"), keys, vals), "f64 fill": (fill.double(), keys, vals),
             "1-d fill": (fill[None], keys, vals), "neg vals": (fill, keys, torch._neg_view(vals)),
             "strided vals": (fill, keys, torch.tensor([2., 0., 3.])[::2]), "int32 keys": (fill, keys.int(), vals),
             "strided keys": (fill, torch.tensor([1, 0, 4])[::2], vals), "short keys": (fill, keys[:1], vals)}
    for name, (f, k, v) in cases.items():
        out = torch.full((10,), -1.)
        assert not _merge.fill_put_sorted(out, f, k, v), name
        assert torch.equal(out, torch.full((10,), -1.)), name
    out = torch.full((10, 2), -1.).t()  # (a non-contiguous out)
    assert not _merge.fill_put_sorted(out, fill, keys, vals) and torch.equal(out, torch.full((2, 10), -1.))


def test_fill_on_another_device_through_to_dense():
    """``to_dense(fill_value=<meta tensor>)`` of a CPU tensor: a TypeError naming the devices; of a meta tensor: a
    meta result of the right shape (no data read)."""
    I = sparsefill.sparse_coo_tensor([[1, 5]], [3., 4.], (N,), fill_value=sparsefill.indefinite)
    with pytest.raises(TypeError, match="meta"):
        I.to_dense(fill_value=torch.tensor(2., device="meta"))
    A = sparsefill.sparse_coo_tensor([[1, 5]], [3., 4.], (N,), fill_value=2.).to("meta")
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
        keys, vals, fill = torch.tensor([[1, 5, 9000 + i]]), values_of(dtype, 3, i), special_values(dtype)[0]
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
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def test_fill_pass_first_call_compiles_then_loads_from_numba_cache(tmp_path):
    """A fresh process with an empty numba cache compiles the pass's entry point per dtype (misses); the next one
    loads them from the cache (hits); both give the dense result."""
    pytest.importorskip("numba")
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
    """A fill whose storage was freed (``untyped_storage().resize_(0)``, as FSDP frees parameters): bf518f0 reads it
    at ``data_ptr()`` == 0 and the process dies of SIGSEGV; before it (``fill.item()``) torch raised its
    RuntimeError 'data is not allocated yet'."""
    pytest.importorskip("numba")
    r = subprocess.run([sys.executable, "-c", _SCRIPT_FREED, "fill"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "not allocated" in r.stdout, (r.returncode, r.stdout, r.stderr[-1000:])


test_freed_fill_storage_is_an_error_not_a_crash = pytest.mark.xfail(strict=True, reason=(
    "bf518f0: fill_put_sorted reads the fill at fill.data_ptr() with no storage check: a freed fill (data_ptr 0) "
    "segfaults (before: fill.item() raised torch's RuntimeError)"))(test_freed_fill_storage_is_an_error_not_a_crash)


@pytest.mark.xfail(strict=True, reason=(
    "pre-existing (before bf518f0 too): fill_put_sorted/put_flat read values and indices at data_ptr() with no "
    "storage check: freed values or indices segfault where torch raises 'data is not allocated yet'"))
@pytest.mark.parametrize("part", ["values", "indices"])
def test_freed_values_or_indices_storage_is_an_error_not_a_crash(part):
    pytest.importorskip("numba")
    r = subprocess.run([sys.executable, "-c", _SCRIPT_FREED, part], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "not allocated" in r.stdout, (r.returncode, r.stdout, r.stderr[-1000:])


@pytest.mark.xfail(strict=True, reason=(
    "pre-existing (before bf518f0: NotImplementedError '<intrinsic address> is not usable in pure-python'; now "
    "AttributeError 'function' object has no attribute 'compile'): with NUMBA_DISABLE_JIT=1 (numba's debugging "
    "switch) _merge._compiled() hands out the pure-Python kernels, which cannot run: every to_dense of >= 8192 "
    "elements raises"))
def test_numba_disable_jit_falls_back_to_torch_ops():
    pytest.importorskip("numba")
    script = ("import torch, sparsefill\n"
              "A = sparsefill.sparse_coo_tensor([[1, 5]], [3., 4.], (20000,), fill_value=2.)\n"
              "R = torch.full((20000,), 2.); R[[1, 5]] = torch.tensor([3., 4.])\n"
              "assert torch.equal(A.to_dense(), R)\n")
    r = _run(script, NUMBA_DISABLE_JIT="1")
    assert r.returncode == 0, r.stderr[-1500:]
