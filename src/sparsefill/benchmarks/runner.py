"""A small benchmark runner: sparsefill against the code a user would write instead.

Protocol
--------
A *case* is a function registered with :func:`case` (or ``Registry.case``).  For one
*size* parameter it builds its inputs (fixed seed) and returns a list of
``(label, callable)`` pairs: the first pair is the sparsefill implementation (the
*subject*), the others are the *peers* measured in the same run.  A peer that cannot run
here (a library not installed) is ``skipped(label, reason)``: the table notes it, the run
goes on.  A case may return ``Bench(impls, bytes=N)`` instead of the list, ``N`` being the
bytes the operation must read and write (for the effective GB/s; or ``bytes=`` at
registration).  For every ``(case, size, thread count)``:

1. ``torch.set_num_threads(n)`` (also passed to the timer, which would otherwise use 1);
2. warm-up: every callable is called once; the outputs go to the case's optional
   ``check(param, outputs)`` (which raises when the implementations disagree) and are
   then dropped;
3. memory (first thread count only): one more untimed call of each implementation under
   ``measure.measure_memory`` (result bytes, peak allocation; see ``measure.py``);
4. ``rounds`` rounds, interleaved: subject, peer 1, ..., subject, peer 1, ...; each
   measurement is the median of a ``torch.utils.benchmark.Timer(...).blocked_autorange``;
5. the reported time of an implementation is the median of its per-round medians
   (``spread`` is ``(max - min) / 2 / median`` over the rounds), and the ratio is
   ``subject / peer`` (> 1: sparsefill is slower).  Defaults: 5 rounds of 1 s
   (``--quick``: 2 rounds of 0.05 s).
6. ``other_cpu``: cores that other processes kept busy meanwhile (``/proc/stat`` minus
   this process's CPU time); with ``retry_noisy`` a row above that is measured again
   (up to 3 tries, the quietest kept).  On a small shared machine, look at it first.

``budget_s`` (``--quick``: 100 s) bounds a run: each case gets a fair share of what is
left (the budget left / the cases left); a case past its share skips its remaining
(size, threads) rows, noted in the table; the first row of a case runs while any budget
is left, with one round only when its warm-up calls alone would overrun the share.

Cases live in ``sparsefill/benchmarks/cases_*.py`` (shipped with the package);
:func:`discover` imports every such module, so a new file registers its cases without
editing anything else.  Nothing happens on import, and ``import sparsefill`` does not
import this package.
:func:`run_cases` is the machinery (the timer is a parameter, so a test can run it on a
tiny case with :func:`stub_timer`); :func:`main` is the command line
(``python -m sparsefill bench`` calls it, through ``sparsefill.bench``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import importlib
import json
import numbers
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterable, Mapping, Sequence

import torch

from sparsefill.benchmarks.measure import (
    copy_bandwidth,
    cpu_snapshot,
    loadavg,
    measure_memory,
    other_cpu,
    stub_timer,
    torch_timer,
)
from sparsefill.benchmarks.report import markdown_report, markdown_table

__all__ = [
    "Case",
    "Bench",
    "Skipped",
    "skipped",
    "optional_import",
    "Registry",
    "REGISTRY",
    "case",
    "discover",
    "Settings",
    "FULL",
    "QUICK",
    "QUICK_BUDGET_S",
    "torch_timer",
    "stub_timer",
    "run_cases",
    "markdown_table",
    "environment",
    "main",
]

Impl = tuple[str, Any]  # (label, callable) or (label, Skipped)
# timer(fn, *, num_threads, min_run_time) -> median seconds per call of fn()
Timer = Callable[..., float]


# ---------------------------------------------------------------------- cases
@dataclasses.dataclass(frozen=True)
class Skipped:
    """Stands in for a peer's callable when the peer cannot run here (``reason`` goes to the
    table)."""

    reason: str


def skipped(label: str, reason: str) -> Impl:
    return (label, Skipped(reason))


def optional_import(module: str):
    """The module, or None when it is not installed (for peers: ``skipped(label, ...)`` then)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


@dataclasses.dataclass
class Bench:
    """What a case may return instead of a plain list: the implementations and the bytes moved."""

    impls: Sequence[Impl]
    bytes: int | None = None  # bytes the operation must read + write (for GB/s)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    fn: Callable[[Any], Sequence[Impl] | Bench]
    sizes: Mapping[str, Any]  # label -> parameter passed to fn (full run)
    quick_sizes: Mapping[str, Any]  # the same for --quick
    check: Callable[[Any, Mapping[str, Any]], None] | None = None
    doc: str = ""
    sweep: str | None = None  # x-axis label of the plot, with units, e.g. "density (%)"
    x: Callable[[Any], float] | None = (
        None  # param -> x value (default: the param itself if a number)
    )
    bytes: Callable[[Any], int] | None = None  # param -> bytes read + written (for GB/s)
    tiny_sizes: Mapping[str, Any] | None = (
        None  # for the test that builds every case (default: shrunk quick)
    )
    module: str = ""

    def size_items(self, quick: bool):
        return list((self.quick_sizes if quick else self.sizes).items())

    def tiny_items(self):
        """The sizes the test suite builds: ``tiny_sizes``, else the quick sizes, shrunk when they
        are ``(shape, density)`` pairs (each dim at most 50, density at least 5%)."""
        if self.tiny_sizes is not None:
            return list(self.tiny_sizes.items())
        items = self.size_items(True)
        if all(_is_shape_density(p) for _, p in items):
            return [(k, (tuple(min(d, 50) for d in p[0]), max(p[1], 0.05))) for k, p in items]
        return items

    def x_of(self, param) -> float | None:
        if self.x is not None:
            return float(self.x(param))
        if self.sweep is not None and isinstance(param, numbers.Real):
            return float(param)
        return None


def _is_shape_density(p) -> bool:
    return (
        isinstance(p, tuple)
        and len(p) == 2
        and isinstance(p[0], tuple)
        and all(isinstance(d, int) for d in p[0])
        and isinstance(p[1], float)
    )


def _as_sizes(sizes) -> dict[str, Any]:
    if sizes is None:
        return {"-": None}
    if isinstance(sizes, Mapping):
        return dict(sizes)
    return {str(s): s for s in sizes}


class Registry:
    """An ordered collection of cases; ``@registry.case(name, sizes=...)`` adds one."""

    def __init__(self):
        self.cases: list[Case] = []
        self.import_errors: dict[str, str] = {}  # module -> traceback, filled by discover()

    def case(
        self,
        name: str,
        *,
        sizes=None,
        quick_sizes=None,
        check=None,
        sweep=None,
        x=None,
        bytes=None,
        tiny_sizes=None,
    ):
        """Register ``fn(param) -> [(label, callable), ...]`` (first pair: sparsefill).

        ``sizes`` / ``quick_sizes`` / ``tiny_sizes``: ``{label: param}`` or a list of params
        (label ``str(param)``); ``quick_sizes`` defaults to ``sizes``; ``tiny_sizes`` (what the
        test suite builds; keep it to milliseconds) defaults to ``quick_sizes`` shrunk when a
        param is ``(shape, density)``, else to ``quick_sizes``.  ``check(param, {label: output})``
        runs on the warm-up outputs and raises if they disagree.  ``sweep``: the x-axis label
        (with units) of the case's plot, one point per size; ``x(param)``: its value
        (default: the param).  ``bytes(param)``: bytes the operation must read and write.
        """

        def deco(fn):
            full = _as_sizes(sizes)
            quick = full if quick_sizes is None else _as_sizes(quick_sizes)
            tiny = None if tiny_sizes is None else _as_sizes(tiny_sizes)
            if any(c.name == name for c in self.cases):
                raise ValueError(f"benchmark case {name!r} is registered twice")
            self.cases.append(
                Case(
                    name,
                    fn,
                    full,
                    quick,
                    check,
                    (fn.__doc__ or "").strip(),
                    sweep,
                    x,
                    bytes,
                    tiny,
                    getattr(fn, "__module__", ""),
                )
            )
            return fn

        return deco

    def select(self, substr: str | None = None) -> list[Case]:
        if not substr:
            return list(self.cases)
        return [c for c in self.cases if substr.lower() in c.name.lower()]


REGISTRY = Registry()
case = REGISTRY.case


def discover(package: str = __package__, registry: Registry = REGISTRY) -> dict[str, str]:
    """Import every ``cases_*.py`` module of ``package`` (each registers its cases on import).

    A module that fails to import does not stop the others: its traceback is returned and kept
    in ``registry.import_errors`` (the command line reports it as an error row).
    """
    pkg = importlib.import_module(package)
    errors: dict[str, str] = {}
    for path in sorted(Path(pkg.__file__).parent.glob("cases_*.py")):
        name = f"{package}.{path.stem}"
        try:
            importlib.import_module(name)
        except Exception:
            errors[name] = traceback.format_exc()
    registry.import_errors.update(errors)
    return errors


# ---------------------------------------------------------------------- settings
@dataclasses.dataclass(frozen=True)
class Settings:
    rounds: int  # interleaved rounds; the reported time is the median of the round medians
    min_run_time: float  # seconds per blocked_autorange measurement


FULL = Settings(rounds=5, min_run_time=1.0)
QUICK = Settings(rounds=2, min_run_time=0.05)
QUICK_BUDGET_S = 100.0  # seconds of case running in --quick (the whole command: under 2 minutes)


# ---------------------------------------------------------------------- progress
class Progress:
    """A tqdm bar on a terminal when tqdm is installed, else one plain line per row on stderr."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.i, self.t0, self.enabled, self.bar = (
            total,
            0,
            time.monotonic(),
            enabled,
            None,
        )
        if enabled and sys.stderr.isatty():
            try:
                from tqdm import tqdm

                self.bar = tqdm(
                    total=total, unit="row", file=sys.stderr, dynamic_ncols=True, leave=False
                )
            except ImportError:
                pass

    def start(self, desc: str) -> None:
        if self.bar is not None:
            self.bar.set_description_str(desc[:60])
        elif self.enabled:
            print(
                f"# [{self.i + 1}/{self.total}, {time.monotonic() - self.t0:.0f} s] {desc}",
                file=sys.stderr,
                flush=True,
            )

    def done(self, n: int = 1) -> None:
        self.i += n
        if self.bar is not None:
            self.bar.update(n)

    def write(self, msg: str) -> None:
        if self.bar is not None:
            self.bar.write(msg, file=sys.stderr)
        elif self.enabled:
            print(msg, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# ---------------------------------------------------------------------- running
def _stats(samples: list[float]) -> dict[str, Any]:
    med = statistics.median(samples)
    spread = (max(samples) - min(samples)) / 2 / med if med > 0 else 0.0
    return {"median_s": med, "rounds_s": samples, "spread": spread}


def _build(c: Case, param) -> tuple[list[Impl], int | None]:
    built = c.fn(param)
    nbytes = c.bytes(param) if c.bytes is not None else None
    if isinstance(built, Bench):
        impls, nbytes = list(built.impls), (built.bytes if built.bytes is not None else nbytes)
    else:
        impls = list(built)
    if not impls:
        raise ValueError(f"case {c.name!r} returned no implementations")
    labels = [lab for lab, _ in impls]
    if len(set(labels)) != len(labels):
        raise ValueError(f"case {c.name!r} has duplicate labels {labels}")
    if isinstance(impls[0][1], Skipped):
        raise ValueError(f"case {c.name!r}: the sparsefill implementation cannot be skipped")
    return impls, nbytes


def run_cases(
    cases: Iterable[Case],
    threads: Sequence[int] = (1, 2),
    quick: bool = False,
    *,
    timer: Timer = torch_timer,
    settings: Settings | None = None,
    raise_errors: bool = False,
    retry_noisy: float | None = None,
    max_tries: int = 3,
    memory: bool = True,
    budget_s: float | None = None,
    copy_bw: Mapping[int, float] | None = None,
    progress: Progress | None = None,
    log: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Run ``cases`` under the protocol of this module; returns one record per (case, size,
    threads).

    A record: ``case, size, threads, x, sweep, bytes, impls, ratios, other_cpu`` where ``impls`` is
    ``[{label, median_s, rounds_s, spread, gbps, pct_copy, result_bytes, peak_bytes, ...}]`` (a
    skipped peer: ``{label, skipped}``) and ``ratios`` ``[{peer, ratio}]`` (subject median / peer
    median); or ``error`` (a traceback) when the case failed and ``raise_errors`` is false; or
    ``skipped`` (the reason) for a row the time budget left out.  ``copy_bw``: bytes/s per thread
    count (for ``pct_copy``).  The global torch thread count is restored.
    """
    cases = list(cases)
    settings = settings or (QUICK if quick else FULL)
    say = log or (progress.write if progress is not None else (lambda msg: None))
    results: list[dict[str, Any]] = []
    saved = torch.get_num_threads()
    t_start = time.monotonic()
    gc.collect()
    # the modules' objects (torch, numba...) out of the collections between rows: 0.2 s -> ms each
    gc.freeze()
    if memory:
        measure_memory(lambda: None)  # the profiler's first use allocates; not a case's memory
    try:
        for ci, c in enumerate(cases):
            t_case = time.monotonic()
            share = (
                None if budget_s is None else (budget_s - (t_case - t_start)) / (len(cases) - ci)
            )
            first = share is None or share > 0  # budget spent: not even the first row of a case
            for size_label, param in c.size_items(quick):
                base = {"case": c.name, "size": size_label, "x": c.x_of(param), "sweep": c.sweep}
                if not first and share is not None and time.monotonic() - t_case > share:
                    reason = (
                        f"time budget ({share:.1f} s for this case of {budget_s:.0f} s)"
                        if share > 0
                        else f"time budget of {budget_s:.0f} s spent"
                    )
                    results.extend({**base, "threads": n, "skipped": reason} for n in threads)
                    if progress is not None:
                        progress.done(len(threads))
                    continue
                impls: list[Impl] | None = None
                done: set[int] = set()
                try:
                    impls, nbytes = _build(c, param)
                    mem = None
                    for n in threads:
                        if not first and share is not None and time.monotonic() - t_case > share:
                            results.append(
                                {**base, "threads": n, "skipped": f"time budget ({share:.1f} s)"}
                            )
                            done.add(n)
                            if progress is not None:
                                progress.done()
                            continue
                        first = False
                        if progress is not None:
                            progress.start(f"{c.name} [{size_label}] threads={n}")
                        best = _run_one(
                            c, param, impls, n, timer, settings, memory and mem is None, share
                        )
                        mem = mem or best.pop("memory")
                        tries = 1
                        while (
                            retry_noisy is not None
                            and tries < max_tries
                            and best["other_cpu"] is not None
                            and best["other_cpu"] > retry_noisy
                        ):
                            say(
                                f"  other processes used {best['other_cpu']:.2f} cores: "
                                "measuring again"
                            )
                            again = _run_one(c, param, impls, n, timer, settings, False)
                            tries += 1
                            if (
                                again["other_cpu"] is not None
                                and again["other_cpu"] < best["other_cpu"]
                            ):
                                best = again
                        best.pop("memory", None)
                        _annotate(best, mem, nbytes, None if copy_bw is None else copy_bw.get(n))
                        results.append({**base, **best, "bytes": nbytes, "tries": tries})
                        done.add(n)
                        if progress is not None:
                            progress.done()
                except Exception:
                    if raise_errors:
                        raise
                    first = False
                    for n in threads:
                        if n not in done:
                            results.append({**base, "threads": n, "error": traceback.format_exc()})
                    if progress is not None:
                        progress.done(len(threads) - len(done))
                    say(f"{c.name} [{size_label}] FAILED:\n{traceback.format_exc()}")
                finally:
                    del impls
                    gc.collect()
    finally:
        torch.set_num_threads(saved)
        gc.unfreeze()
    return results


def _run_one(
    c: Case,
    param,
    impls: Sequence[Impl],
    n: int,
    timer: Timer,
    settings: Settings,
    with_memory: bool,
    share: float | None = None,
) -> dict[str, Any]:
    torch.set_num_threads(n)
    active = [(label, fn) for label, fn in impls if not isinstance(fn, Skipped)]
    t0 = time.monotonic()
    outputs = {label: fn() for label, fn in active}  # warm-up
    warm = time.monotonic() - t0
    if share is not None and settings.rounds > 1 and warm * (settings.rounds + 1) > share:
        # slow calls and a time budget: one round
        settings = dataclasses.replace(settings, rounds=1)
    if c.check is not None:
        c.check(param, outputs)
    del outputs
    gc.collect()
    mem = {label: measure_memory(fn) for label, fn in active} if with_memory else None
    gc.collect()
    samples: dict[str, list[float]] = {label: [] for label, _ in active}
    load = loadavg()
    cpu0 = cpu_snapshot()
    for _ in range(settings.rounds):
        for label, fn in active:
            torch.set_num_threads(n)
            samples[label].append(
                float(timer(fn, num_threads=n, min_run_time=settings.min_run_time))
            )
    other = other_cpu(cpu0, cpu_snapshot())
    stats = [
        {"label": label, "skipped": fn.reason}
        if isinstance(fn, Skipped)
        else {"label": label, **_stats(samples[label])}
        for label, fn in impls
    ]
    subject = stats[0]
    ratios = [
        {
            "peer": s["label"],
            "ratio": subject["median_s"] / s["median_s"] if s["median_s"] > 0 else None,
        }
        for s in stats[1:]
        if "skipped" not in s
    ]
    return {
        "threads": n,
        "impls": stats,
        "ratios": ratios,
        "loadavg_1min": load,
        "other_cpu": other,
        "rounds": settings.rounds,
        "memory": mem,
    }


def _annotate(rec: dict[str, Any], mem, nbytes: int | None, bw: float | None) -> None:
    """Effective GB/s (the case's bytes / time), % of the copy bandwidth, and the memory of each
    impl."""
    for s in rec["impls"]:
        if "skipped" in s:
            continue
        gbps = nbytes / s["median_s"] / 1e9 if nbytes and s["median_s"] > 0 else None
        s["gbps"] = gbps
        s["pct_copy"] = 100 * gbps * 1e9 / bw if gbps is not None and bw else None
        if mem is not None:
            s.update(mem.get(s["label"], {}))


# ---------------------------------------------------------------------- environment
def environment() -> dict[str, Any]:
    """What the numbers were measured on (torch, sparsefill, git commit, CPU, peers' versions)."""
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "torch_default_threads": torch.get_num_threads(),
        "loadavg_start": loadavg(),
    }
    try:
        import sparsefill

        env["sparsefill"] = getattr(sparsefill, "__version__", "?")
    except Exception as e:  # pragma: no cover - reported, not fatal
        env["sparsefill"] = f"import failed: {e}"
    env["peers"] = {}
    for mod in ("sparse", "torch_scatter", "scipy"):
        m = optional_import(mod)
        env["peers"][mod] = getattr(m, "__version__", "?") if m is not None else None
    env.update(git_state())
    # torch's CPU allocator on huge pages
    env["THP_MEM_ALLOC_ENABLE"] = os.environ.get("THP_MEM_ALLOC_ENABLE")
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            env["transparent_hugepage"] = f.read().strip()
    except OSError:
        pass
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        env["cpu_model"] = names[0] if names else None
    except OSError:
        pass
    return env


def git_state(package_dir: str | None = None) -> dict[str, Any]:
    """``git_commit`` and ``src_dirty`` (uncommitted changes under the package) when the imported
    package is a tracked folder of a git checkout (an editable install), else ``git_commit: None``
    (an installed wheel: its commit is unknown, even when the venv sits inside a checkout)."""
    # .../sparsefill
    pkg = package_dir or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=pkg, capture_output=True, text=True, timeout=10)

    try:
        if git("ls-files", "--error-unmatch", "__init__.py").returncode != 0:
            return {"git_commit": None}
        return {
            "git_commit": git("rev-parse", "HEAD").stdout.strip() or None,
            "src_dirty": bool(git("status", "--porcelain", "--", ".").stdout.strip()),
        }
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": None}


# ---------------------------------------------------------------------- command line
def _parse_threads(s: str) -> list[int]:
    try:
        out = [int(t) for t in s.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--threads must be comma-separated ints, got {s!r}"
        ) from None
    if not out or any(t < 1 for t in out):
        raise argparse.ArgumentTypeError(f"--threads must be positive ints, got {s!r}")
    return out


def parser(prog: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="sparsefill benchmarks against its peers "
        "(every case in sparsefill/benchmarks/cases_*.py)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"small sizes, few repeats, a {QUICK_BUDGET_S:.0f} s budget (under 2 minutes in all)",
    )
    p.add_argument(
        "--filter", default=None, metavar="SUBSTR", help="only cases whose name contains SUBSTR"
    )
    p.add_argument(
        "--threads",
        type=_parse_threads,
        default=None,
        metavar="N,M",
        help="torch thread counts to run each case with (default 1,2; --quick 1)",
    )
    p.add_argument(
        "--out",
        default="bench-out",
        metavar="DIR",
        help="where results.json, results.md and the plots go (default bench-out/)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        metavar="N",
        help=f"interleaved rounds (default {FULL.rounds}, --quick {QUICK.rounds})",
    )
    p.add_argument(
        "--min-run-time",
        type=float,
        default=None,
        metavar="S",
        help=f"seconds per blocked_autorange (default {FULL.min_run_time}, --quick "
        f"{QUICK.min_run_time})",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        metavar="S",
        help=f"seconds for running the cases; each case gets a fair share (default: none; "
        f"--quick {QUICK_BUDGET_S:.0f})",
    )
    p.add_argument(
        "--retry-noisy",
        type=float,
        default=None,
        metavar="CORES",
        help="re-measure (up to 3 tries, keep the quietest) when other processes kept more than "
        "CORES cores busy meanwhile",
    )
    p.add_argument(
        "--no-memory",
        action="store_true",
        help="skip the memory measurement (one call less per row)",
    )
    p.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or progress lines")
    p.add_argument(
        "--list", action="store_true", help="list the selected cases and sizes, run nothing"
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="build inputs, run every implementation once and the checks; no timing",
    )
    p.add_argument(
        "--tiny",
        action="store_true",
        help="the tiny sizes the test suite uses (implies --quick; with --dry-run: check every "
        "case fast)",
    )
    return p


def main(
    argv: Sequence[str] | None = None,
    cases: Sequence[Case] | None = None,
    *,
    prog: str | None = None,
) -> int:
    """Command line: run ``cases`` (default: every ``cases_*.py`` here), print Markdown, write
    ``results.json``, ``results.md`` and PNG plots to ``--out``."""
    p = parser(prog)
    args = p.parse_args(argv)
    t0 = time.monotonic()
    import_errors: dict[str, str] = {}
    if cases is None:
        discover()
        import_errors = dict(REGISTRY.import_errors)
        cases = REGISTRY.cases
    registry = Registry()
    registry.cases = list(cases)
    selected = registry.select(args.filter)
    if not selected and not import_errors:
        print(f"no benchmark case matches --filter {args.filter!r}", file=sys.stderr)
        return 2
    if args.tiny:
        args.quick = True
        selected = [dataclasses.replace(c, quick_sizes=dict(c.tiny_items())) for c in selected]
    threads = args.threads or ([1] if args.quick else [1, 2])
    if args.list:
        for c in selected:
            sweep = f"  (plot against {c.sweep})" if c.sweep else ""
            print(f"{c.name}: {'; '.join(lab for lab, _ in c.size_items(args.quick))}{sweep}")
        for mod, tb in import_errors.items():
            print(f"IMPORT ERROR {mod}: {tb.strip().splitlines()[-1]}")
        return 1 if import_errors else 0

    timer = stub_timer if args.dry_run else torch_timer
    base = QUICK if args.quick else FULL
    settings = (
        Settings(rounds=1, min_run_time=0.0)
        if args.dry_run
        else Settings(
            rounds=base.rounds if args.rounds is None else args.rounds,
            min_run_time=base.min_run_time if args.min_run_time is None else args.min_run_time,
        )
    )
    if settings.rounds < 1 or settings.min_run_time < 0:
        p.error("--rounds must be >= 1 and --min-run-time >= 0")
    budget = (
        args.budget
        if args.budget is not None
        else (QUICK_BUDGET_S if args.quick and not args.dry_run else None)
    )
    started = datetime.datetime.now(datetime.timezone.utc)
    env = environment()  # before running: the commit and load the numbers belong to
    progress = Progress(
        sum(len(c.size_items(args.quick)) for c in selected) * len(threads),
        enabled=not args.no_progress,
    )
    bw = copy_bandwidth(
        threads,
        timer,
        quick=args.quick,
        min_run_time=0.0 if args.dry_run else 0.3,
        numel=2**10 if args.dry_run else None,
    )
    try:
        results = run_cases(
            selected,
            threads,
            args.quick,
            timer=timer,
            settings=settings,
            retry_noisy=args.retry_noisy,
            memory=not args.no_memory,
            budget_s=budget,
            copy_bw=bw,
            progress=progress,
        )
    finally:
        progress.close()
    for mod, tb in import_errors.items():
        results.append({"case": f"(import {mod})", "size": "-", "threads": "-", "error": tb})
    report = {
        "started": started.isoformat(timespec="seconds"),
        "quick": args.quick,
        "dry_run": args.dry_run,
        "command": " ".join(
            [prog or "python -m sparsefill bench", *(argv if argv is not None else sys.argv[1:])]
        ),
        "threads": threads,
        "filter": args.filter,
        "retry_noisy": args.retry_noisy,
        "budget_s": budget,
        "settings": dataclasses.asdict(settings),
        "environment": env,
        "copy_bandwidth": bw,
        "loadavg_end": loadavg(),
        "results": results,
    }
    os.makedirs(args.out, exist_ok=True)
    plots: list[str] = []
    if not args.no_plots:
        try:
            from sparsefill.benchmarks import plots as _plots

            plots = _plots.write_plots(report, args.out)
        except ImportError as e:
            report["plots_note"] = f"no plots: {e} (pip install '.[bench]')"
            print(f"# {report['plots_note']}", file=sys.stderr)
    report["plots"] = [os.path.basename(f) for f in plots]
    report["total_s"] = time.monotonic() - t0
    print(markdown_table(results, dry_run=args.dry_run))
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(markdown_report(report) + "\n")
    print(
        f"# total {report['total_s']:.1f} s; wrote {os.path.join(args.out, 'results.json')}, "
        f"results.md and {len(plots)} plots",
        file=sys.stderr,
    )
    return 1 if any("error" in r for r in results) else 0
