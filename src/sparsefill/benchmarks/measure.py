"""What the runner measures besides time: memory, the machine's copy bandwidth, other processes'
load.

Memory of one call of an implementation (an extra, untimed call after the warm-up):

* ``result_bytes``: bytes of the storages the result refers to (unique storages; indices a result
  shares with its input count, as they do for a user keeping the result).  numpy arrays, pydata
  ``sparse`` and scipy sparse results count their arrays' ``nbytes``.
* ``peak_torch_bytes``: the peak, above the level at the start of the call, of the bytes allocated
  through torch's allocators during the call, from torch's profiler (``profile_memory=True``):
  the running sum of its allocation and free records.  Exact for torch tensors (temporaries
  included), blind to numpy.
* ``peak_python_bytes``: the peak of ``tracemalloc`` during the call: Python objects and numpy
  arrays (numpy reports its buffers to tracemalloc), which torch's profiler does not see.
* ``peak_rss_bytes`` (results.json only): how far the process's peak resident set (``VmHWM``,
  reset through ``/proc/self/clear_refs``) rose above its resident set at the start of the call.
  Linux only; page-granular and blind to memory malloc recycles, so a rough lower bound.

``peak_bytes`` (the table's column) is ``peak_torch_bytes + peak_python_bytes``: the two count
disjoint allocations, so the sum is at least the true peak and equals it for code that allocates
through only one of them (as every implementation here mostly does).

Copy bandwidth: ``dst.copy_(src)`` of two float32 tensors of 256 MB (64 MB with ``--quick``),
well above the last-level cache, timed like a case at each thread count; bytes moved per second
= 2 x 256 MB / time (read + write).  A case's effective GB/s is the bytes it must read and
write (declared by the case) / its time; ``% of copy`` compares it with that bandwidth.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import statistics
import sys
import tempfile
import time
import tracemalloc
from typing import Any
from collections.abc import Callable

import torch

__all__ = [
    "torch_timer",
    "stub_timer",
    "result_bytes",
    "measure_memory",
    "copy_bandwidth",
    "cpu_snapshot",
    "other_cpu",
    "loadavg",
]


# ---------------------------------------------------------------------- timers
def torch_timer(fn: Callable[[], Any], *, num_threads: int, min_run_time: float) -> float:
    """Median seconds per call of ``fn()`` from
    ``torch.utils.benchmark.Timer.blocked_autorange``."""
    from torch.utils.benchmark import Timer as _Timer

    t = _Timer(stmt="fn()", globals={"fn": fn}, num_threads=num_threads)
    return float(t.blocked_autorange(min_run_time=min_run_time).median)


def stub_timer(fn: Callable[[], Any], *, num_threads: int, min_run_time: float) -> float:
    """A timer that calls ``fn`` once and reports 1 ms: exercises the machinery, measures
    nothing."""
    fn()
    return 1e-3


# ---------------------------------------------------------------------- memory
def interleaved(
    impls: dict, rounds: int, reps: int, *, before: Callable[[], Any] | None = None
) -> dict:
    """``{name: seconds}``: for the standalone scripts (compile, distributed) that the harness
    cannot time -- each implementation called once (warm-up, compilation), then ``rounds`` rounds of
    ``reps`` calls of each in turn; the median over rounds of each round's median.  ``before`` runs
    ahead of every timed call (``dist.barrier`` for collectives: every rank starts together) and is
    not timed."""
    for fn in impls.values():
        fn()
    per = {name: [] for name in impls}
    for _ in range(rounds):
        for name, fn in impls.items():
            ts = []
            for _ in range(reps):
                if before is not None:
                    before()
                t = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t)
            per[name].append(statistics.median(ts))
    return {name: statistics.median(v) for name, v in per.items()}


def result_bytes(obj: Any) -> int:
    """Bytes held by the storages ``obj`` refers to (tensors, SparseTensors, numpy, pydata/scipy
    sparse, and tuples/lists/dicts of them); a storage referred to twice counts once."""
    seen: set = set()

    def visit(x) -> int:
        if isinstance(x, torch.Tensor):
            if hasattr(x, "__tensor_flatten__") and type(x) is not torch.Tensor:
                names, _ = x.__tensor_flatten__()
                return sum(visit(getattr(x, n)) for n in names)
            if x.layout is torch.sparse_coo:
                return visit(x._indices()) + visit(x._values())
            if x.layout in (torch.sparse_csr, torch.sparse_bsr):
                return visit(x.crow_indices()) + visit(x.col_indices()) + visit(x.values())
            if x.layout in (torch.sparse_csc, torch.sparse_bsc):
                return visit(x.ccol_indices()) + visit(x.row_indices()) + visit(x.values())
            try:
                s = x.untyped_storage()
            except (RuntimeError, NotImplementedError):
                return x.numel() * x.element_size()
            key = (s.data_ptr(), str(x.device))
            if key in seen:
                return 0
            seen.add(key)
            return s.nbytes()
        if isinstance(x, (tuple, list)):
            return sum(visit(v) for v in x)
        if isinstance(x, dict):
            return sum(visit(v) for v in x.values())
        if all(hasattr(x, a) for a in ("data", "indices", "indptr")):  # scipy.sparse compressed
            return sum(visit(getattr(x, a)) for a in ("data", "indices", "indptr"))
        nbytes = getattr(x, "nbytes", None)  # numpy arrays, pydata sparse
        if isinstance(nbytes, int):
            key = ("np", id(x))
            return 0 if key in seen else (seen.add(key) or nbytes)
        return 0

    return visit(obj)


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            m = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M)
    except OSError:
        return None
    return int(m.group(1)) if m else None


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


@contextlib.contextmanager
def _quiet_profiler_stderr():
    """The profiler's native code prints 'USDT ... profiler_start' lines on fd 2: hide those, keep
    the rest."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [
                ln
                for ln in tmp.read().decode(errors="replace").splitlines(True)
                if "USDT:" not in ln
            ]
            if kept:
                sys.stderr.write("".join(kept))


def _torch_peak(events) -> int:
    """Peak of the running sum of the profiler's allocation records (bytes above the start), per
    device; max."""
    by_device: dict[str, list[tuple[int, int]]] = {}
    for e in events:
        if e.name() == "[memory]":
            by_device.setdefault(str(e.device_type()), []).append((e.start_ns(), e.nbytes()))
    peak = 0
    for recs in by_device.values():
        recs.sort()
        peak = max(peak, max(itertools.accumulate(n for _, n in recs), default=0))
    return peak


def measure_memory(fn: Callable[[], Any]) -> dict[str, int | None]:
    """Call ``fn()`` once; return ``result_bytes``, ``peak_torch_bytes``, ``peak_python_bytes``,
    ``peak_rss_bytes`` and ``peak_bytes`` (see the module docstring)."""
    peak_torch = None
    rss_ok = _reset_peak_rss()
    rss0 = _status_kb("VmRSS") if rss_ok else None
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        try:
            # the autograd profiler directly: torch.profiler.profile would import torch._inductor
            # (seconds)
            from torch.autograd.profiler import profile

            cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
            with _quiet_profiler_stderr():
                with profile(
                    use_cpu=True, use_device="cuda" if cuda else None, profile_memory=True
                ) as prof:
                    out = fn()
            peak_torch = _torch_peak(prof.kineto_results.events())
        except (ImportError, AttributeError):  # profiler unavailable
            out = fn()
        peak_py = max(0, tracemalloc.get_traced_memory()[1] - base)
    finally:
        if not tracing:
            tracemalloc.stop()
    hwm = _status_kb("VmHWM") if rss0 is not None else None
    peak_rss = None if hwm is None else max(0, hwm - rss0) * 1024
    res = result_bytes(out)
    del out
    return {
        "result_bytes": res,
        "peak_torch_bytes": peak_torch,
        "peak_python_bytes": peak_py,
        "peak_rss_bytes": peak_rss,
        "peak_bytes": (peak_torch or 0) + peak_py,
    }


# ---------------------------------------------------------------------- copy bandwidth
def copy_bandwidth(
    threads,
    timer=torch_timer,
    *,
    quick: bool = False,
    min_run_time: float = 0.3,
    device: str | torch.device | None = None,
    numel: int | None = None,
) -> dict[int, float]:
    """Bytes per second of ``dst.copy_(src)`` (read + write) at each thread count; float32 tensors
    of ``numel`` elements (default 64M, 256 MB; ``quick``: 16M, 64 MB)."""
    n = numel or (16 if quick else 64) * 2**20
    device = torch.device(device) if device is not None else torch.empty(0).device
    src = torch.rand(n, device=device)
    dst = torch.empty_like(src)
    saved = torch.get_num_threads()
    out: dict[int, float] = {}
    try:
        for t in threads:
            torch.set_num_threads(t)
            dst.copy_(src)
            s = timer(lambda: dst.copy_(src), num_threads=t, min_run_time=min_run_time)
            out[t] = 2 * src.nbytes / s if s > 0 else float("nan")
    finally:
        torch.set_num_threads(saved)
    return out


# ---------------------------------------------------------------------- load of other processes
def cpu_snapshot():
    """(wall, machine busy CPU seconds, this process's CPU seconds) or None off Linux."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # all but idle and iowait
    busy = (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    t = os.times()
    return time.monotonic(), busy, t.user + t.system


def other_cpu(a, b) -> float | None:
    """Cores kept busy by other processes while timing (CPU time not ours / wall time): the
    noise."""
    if a is None or b is None or b[0] <= a[0]:
        return None
    return max(0.0, (b[1] - a[1]) - (b[2] - a[2])) / (b[0] - a[0])


def loadavg() -> float | None:
    """1-minute load average (other processes make the numbers noisy)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
