"""A small benchmark runner: sparsefill against the torch code a user would write instead.

Protocol
--------
A *case* is a function registered with :func:`case` (or ``Registry.case``).  For one
*size* parameter it builds its inputs (fixed seed) and returns a list of
``(label, callable)`` pairs: the first pair is the sparsefill implementation (the
*subject*), the others are the *peers* measured in the same run.  For every
``(case, size, thread count)``:

1. ``torch.set_num_threads(n)`` (also passed to the timer, which would otherwise use 1);
2. warm-up: every callable is called once; the outputs go to the case's optional
   ``check(param, outputs)`` (which raises when the implementations disagree) and are
   then dropped;
3. ``rounds`` rounds, interleaved: subject, peer 1, ..., subject, peer 1, ...; each
   measurement is the median of a ``torch.utils.benchmark.Timer(...).blocked_autorange``;
4. the reported time of an implementation is the median of its per-round medians
   (``spread`` is ``(max - min) / 2 / median`` over the rounds), and the ratio is
   ``subject / peer`` (> 1: sparsefill is slower).  Defaults: 5 rounds of 1 s
   (``--quick``: 2 rounds of 0.05 s).
5. ``other_cpu``: cores that other processes kept busy meanwhile (``/proc/stat`` minus
   this process's CPU time); with ``retry_noisy`` a row above that is measured again
   (up to 3 tries, the quietest kept).  On a small shared machine, look at it first.

Nothing happens on import.  :func:`run_cases` is the machinery (the timer is a parameter,
so a test can run it on a tiny case with a stub timer); :func:`main` is the command line
(``benchmarks/run.py`` calls it with the registered cases)::

    python benchmarks/run.py [--quick] [--filter SUBSTR] [--threads 1,2] [--out DIR]
                             [--rounds N] [--min-run-time S] [--retry-noisy CORES] [--list] [--dry-run]

It prints a Markdown table and writes ``DIR/results.json`` and ``DIR/results.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

__all__ = ["Case", "Registry", "REGISTRY", "case", "Settings", "FULL", "QUICK", "torch_timer", "stub_timer",
           "run_cases", "markdown_table", "environment", "main"]

Impl = tuple[str, Callable[[], Any]]
# timer(fn, *, num_threads, min_run_time) -> median seconds per call of fn()
Timer = Callable[..., float]


# ---------------------------------------------------------------------- cases
@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    fn: Callable[[Any], Sequence[Impl]]
    sizes: Mapping[str, Any]          # label -> parameter passed to fn (full run)
    quick_sizes: Mapping[str, Any]    # the same for --quick
    check: Callable[[Any, Mapping[str, Any]], None] | None = None
    doc: str = ""

    def size_items(self, quick: bool):
        return list((self.quick_sizes if quick else self.sizes).items())


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

    def case(self, name: str, *, sizes=None, quick_sizes=None, check=None):
        """Register ``fn(param) -> [(label, callable), ...]`` (first pair: sparsefill).

        ``sizes`` / ``quick_sizes``: ``{label: param}`` or a list of params (label ``str(param)``);
        ``quick_sizes`` defaults to ``sizes``.  ``check(param, {label: output})`` runs on the
        warm-up outputs and raises if they disagree.
        """
        def deco(fn):
            full = _as_sizes(sizes)
            quick = full if quick_sizes is None else _as_sizes(quick_sizes)
            if any(c.name == name for c in self.cases):
                raise ValueError(f"benchmark case {name!r} is registered twice")
            self.cases.append(Case(name, fn, full, quick, check, (fn.__doc__ or "").strip()))
            return fn
        return deco

    def select(self, substr: str | None = None) -> list[Case]:
        if not substr:
            return list(self.cases)
        return [c for c in self.cases if substr.lower() in c.name.lower()]


REGISTRY = Registry()
case = REGISTRY.case


# ---------------------------------------------------------------------- timing
@dataclasses.dataclass(frozen=True)
class Settings:
    rounds: int          # interleaved rounds; the reported time is the median of the round medians
    min_run_time: float  # seconds per blocked_autorange measurement


FULL = Settings(rounds=5, min_run_time=1.0)
QUICK = Settings(rounds=2, min_run_time=0.05)


def torch_timer(fn: Callable[[], Any], *, num_threads: int, min_run_time: float) -> float:
    """Median seconds per call of ``fn()`` from ``torch.utils.benchmark.Timer.blocked_autorange``."""
    from torch.utils.benchmark import Timer as _Timer
    t = _Timer(stmt="fn()", globals={"fn": fn}, num_threads=num_threads)
    return float(t.blocked_autorange(min_run_time=min_run_time).median)


def stub_timer(fn: Callable[[], Any], *, num_threads: int, min_run_time: float) -> float:
    """A timer that calls ``fn`` once and reports 1 ms: exercises the machinery, measures nothing."""
    fn()
    return 1e-3


# ---------------------------------------------------------------------- running
def _stats(samples: list[float]) -> dict[str, Any]:
    med = statistics.median(samples)
    spread = (max(samples) - min(samples)) / 2 / med if med > 0 else 0.0
    return {"median_s": med, "rounds_s": samples, "spread": spread}


def run_cases(cases: Iterable[Case], threads: Sequence[int] = (1, 2), quick: bool = False, *,
              timer: Timer = torch_timer, settings: Settings | None = None, raise_errors: bool = False,
              retry_noisy: float | None = None, max_tries: int = 3,
              log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Run ``cases`` under the protocol of this module; returns one record per (case, size, threads).

    A record: ``case, size, threads, impls: [{label, median_s, rounds_s, spread}], ratios:
    [{peer, ratio}]`` (ratio = subject median / peer median), or ``error`` (a traceback) when
    the case failed and ``raise_errors`` is false.  The global torch thread count is restored.
    ``retry_noisy``: when other processes kept more than this many cores busy during a
    measurement (``other_cpu``), measure again, up to ``max_tries`` in all, and keep the quietest.
    """
    settings = settings or (QUICK if quick else FULL)
    log = log or (lambda msg: None)
    results: list[dict[str, Any]] = []
    saved = torch.get_num_threads()
    try:
        for c in cases:
            for size_label, param in c.size_items(quick):
                impls: Sequence[Impl] | None = None
                try:
                    impls = list(c.fn(param))
                    if not impls:
                        raise ValueError(f"case {c.name!r} returned no implementations")
                    labels = [lab for lab, _ in impls]
                    if len(set(labels)) != len(labels):
                        raise ValueError(f"case {c.name!r} has duplicate labels {labels}")
                    for n in threads:
                        log(f"{c.name} [{size_label}] threads={n}")
                        best = _run_one(c, size_label, param, impls, n, timer, settings)
                        tries = 1
                        while (retry_noisy is not None and tries < max_tries and best["other_cpu"] is not None
                               and best["other_cpu"] > retry_noisy):
                            log(f"  other processes used {best['other_cpu']:.2f} cores: measuring again")
                            again = _run_one(c, size_label, param, impls, n, timer, settings)
                            tries += 1
                            if again["other_cpu"] is not None and again["other_cpu"] < best["other_cpu"]:
                                best = again
                        best["tries"] = tries
                        results.append(best)
                except Exception:
                    if raise_errors:
                        raise
                    done = {r["threads"] for r in results if r["case"] == c.name and r["size"] == size_label}
                    for n in threads:
                        if n not in done:
                            results.append({"case": c.name, "size": size_label, "threads": n,
                                            "error": traceback.format_exc()})
                    log(f"{c.name} [{size_label}] FAILED:\n{traceback.format_exc()}")
                finally:
                    del impls
                    gc.collect()
    finally:
        torch.set_num_threads(saved)
    return results


def _run_one(c: Case, size_label: str, param, impls: Sequence[Impl], n: int, timer: Timer,
             settings: Settings) -> dict[str, Any]:
    torch.set_num_threads(n)
    load = _loadavg()
    outputs = {label: fn() for label, fn in impls}    # warm-up
    if c.check is not None:
        c.check(param, outputs)
    del outputs
    gc.collect()
    samples: dict[str, list[float]] = {label: [] for label, _ in impls}
    cpu0 = _cpu_snapshot()
    for _ in range(settings.rounds):
        for label, fn in impls:
            torch.set_num_threads(n)
            samples[label].append(float(timer(fn, num_threads=n, min_run_time=settings.min_run_time)))
    other = _other_cpu(cpu0, _cpu_snapshot())
    stats = [{"label": label, **_stats(samples[label])} for label, _ in impls]
    subject = stats[0]
    ratios = [{"peer": s["label"], "ratio": subject["median_s"] / s["median_s"] if s["median_s"] > 0 else None}
              for s in stats[1:]]
    return {"case": c.name, "size": size_label, "threads": n, "impls": stats, "ratios": ratios,
            "loadavg_1min": load, "other_cpu": other}


def _cpu_snapshot():
    """(wall, machine busy CPU seconds, this process's CPU seconds) or None off Linux."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    busy = (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait
    t = os.times()
    return time.monotonic(), busy, t.user + t.system


def _other_cpu(a, b) -> float | None:
    """Cores kept busy by other processes while timing (CPU time not ours / wall time): the noise."""
    if a is None or b is None or b[0] <= a[0]:
        return None
    return max(0.0, (b[1] - a[1]) - (b[2] - a[2])) / (b[0] - a[0])


def _loadavg() -> float | None:
    """1-minute load average when the case started (other processes make the numbers noisy)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


# ---------------------------------------------------------------------- reporting
def _fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def _fmt_impl(s: Mapping[str, Any]) -> str:
    return f"{_fmt_time(s['median_s'])} ±{100 * s['spread']:.0f}%"


def markdown_table(results: Sequence[Mapping[str, Any]]) -> str:
    """One row per (case, size, threads, peer): medians (± half range over rounds) and the ratio.

    ``other CPU``: cores that other processes kept busy while the row was timed (0 = quiet machine).
    """
    rows = ["| case | size | threads | sparsefill | peer | peer time | sparsefill / peer | other CPU |",
            "|---|---|---:|---:|---|---:|---:|---:|"]
    for r in results:
        head = f"| {r['case']} | {r['size']} | {r['threads']} "
        if "error" in r:
            last = r["error"].strip().splitlines()[-1].replace("|", "\\|")
            rows.append(head + f"| **error** | {last} | - | - | - |")
            continue
        subject = r["impls"][0]
        other = r.get("other_cpu")
        tail = " | " + ("-" if other is None else f"{other:.2f}") + " |"
        peers = r["impls"][1:] or [None]
        for peer, ratio in zip(peers, r["ratios"] or [None]):
            if peer is None:
                rows.append(head + f"| {_fmt_impl(subject)} | - | - | -" + tail)
                continue
            q = ratio["ratio"]
            rows.append(head + f"| {_fmt_impl(subject)} | `{peer['label']}` | {_fmt_impl(peer)} | "
                        + ("-" if q is None else f"{'**' if q >= 2 else ''}{q:.2f}{'**' if q >= 2 else ''}") + tail)
    return "\n".join(rows)


def environment() -> dict[str, Any]:
    """What the numbers were measured on (torch, sparsefill, git commit, CPU)."""
    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "platform": platform.platform(), "machine": platform.machine(),
                           "processor": platform.processor(), "cpu_count": os.cpu_count(),
                           "torch_default_threads": torch.get_num_threads(), "loadavg_start": _loadavg()}
    try:
        import sparsefill
        env["sparsefill"] = getattr(sparsefill, "__version__", "?")
    except Exception as e:  # pragma: no cover - reported, not fatal
        env["sparsefill"] = f"import failed: {e}"
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        env["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                                           text=True, timeout=10).stdout.strip() or None
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=os.path.dirname(here),
                               capture_output=True, text=True, timeout=10).stdout.strip()
        env["src_dirty"] = bool(dirty)
    except Exception:
        env["git_commit"] = None
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        env["cpu_model"] = names[0] if names else None
    except OSError:
        pass
    return env


def _parse_threads(s: str) -> list[int]:
    try:
        out = [int(t) for t in s.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--threads must be comma-separated ints, got {s!r}") from None
    if not out or any(t < 1 for t in out):
        raise argparse.ArgumentTypeError(f"--threads must be positive ints, got {s!r}")
    return out


def main(argv: Sequence[str] | None = None, cases: Sequence[Case] | None = None, *, prog: str | None = None) -> int:
    """Command line: run ``cases`` (default: those in :data:`REGISTRY`), print Markdown, write JSON."""
    p = argparse.ArgumentParser(prog=prog, description="sparsefill benchmarks against torch peers")
    p.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats (well under a minute)")
    p.add_argument("--filter", default=None, metavar="SUBSTR", help="only cases whose name contains SUBSTR")
    p.add_argument("--threads", type=_parse_threads, default=[1, 2], metavar="N,M",
                   help="torch thread counts to run each case with (default 1,2)")
    p.add_argument("--out", default="bench-out", metavar="DIR", help="where results.json/.md go (default bench-out/)")
    p.add_argument("--rounds", type=int, default=None, metavar="N",
                   help=f"interleaved rounds (default {FULL.rounds}, --quick {QUICK.rounds})")
    p.add_argument("--min-run-time", type=float, default=None, metavar="S",
                   help=f"seconds per blocked_autorange (default {FULL.min_run_time}, --quick {QUICK.min_run_time})")
    p.add_argument("--retry-noisy", type=float, default=None, metavar="CORES",
                   help="re-measure (up to 3 tries, keep the quietest) when other processes kept more than "
                        "CORES cores busy meanwhile")
    p.add_argument("--list", action="store_true", help="list the selected cases and sizes, run nothing")
    p.add_argument("--dry-run", action="store_true",
                   help="build inputs, run every implementation once and the checks; no timing")
    args = p.parse_args(argv)

    registry = Registry()
    registry.cases = list(REGISTRY.cases if cases is None else cases)
    selected = registry.select(args.filter)
    if not selected:
        print(f"no benchmark case matches --filter {args.filter!r}", file=sys.stderr)
        return 2
    if args.list:
        for c in selected:
            print(f"{c.name}: {', '.join(lab for lab, _ in c.size_items(args.quick))}")
        return 0

    timer = stub_timer if args.dry_run else torch_timer
    base = QUICK if args.quick else FULL
    settings = Settings(rounds=1, min_run_time=0.0) if args.dry_run else Settings(
        rounds=base.rounds if args.rounds is None else args.rounds,
        min_run_time=base.min_run_time if args.min_run_time is None else args.min_run_time)
    if settings.rounds < 1 or settings.min_run_time < 0:
        p.error("--rounds must be >= 1 and --min-run-time >= 0")
    started = datetime.datetime.now(datetime.timezone.utc)
    env = environment()  # before running: the commit and load the numbers belong to
    results = run_cases(selected, args.threads, args.quick, timer=timer, settings=settings,
                        retry_noisy=args.retry_noisy, log=lambda msg: print(f"# {msg}", file=sys.stderr, flush=True))
    table = markdown_table(results)
    if args.dry_run:
        table = "<!-- dry run: nothing was timed, the times are placeholders -->\n" + table
    print(table)

    report = {"started": started.isoformat(timespec="seconds"), "quick": args.quick, "dry_run": args.dry_run,
              "threads": args.threads, "filter": args.filter, "retry_noisy": args.retry_noisy, "settings": dataclasses.asdict(settings),
              "environment": env, "loadavg_end": _loadavg(), "results": results}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(table + "\n")
    print(f"# wrote {os.path.join(args.out, 'results.json')}", file=sys.stderr)
    return 1 if any("error" in r for r in results) else 0
