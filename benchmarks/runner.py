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
   ``subject / peer`` (> 1: sparsefill is slower).

Nothing happens on import.  :func:`run_cases` is the machinery (the timer is a parameter,
so a test can run it on a tiny case with a stub timer); :func:`main` is the command line
(``benchmarks/run.py`` calls it with the registered cases)::

    python benchmarks/run.py [--quick] [--filter SUBSTR] [--threads 1,2] [--out DIR]

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


FULL = Settings(rounds=3, min_run_time=0.5)
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
              log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Run ``cases`` under the protocol of this module; returns one record per (case, size, threads).

    A record: ``case, size, threads, impls: [{label, median_s, rounds_s, spread}], ratios:
    [{peer, ratio}]`` (ratio = subject median / peer median), or ``error`` (a traceback) when
    the case failed and ``raise_errors`` is false.  The global torch thread count is restored.
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
                        results.append(_run_one(c, size_label, param, impls, n, timer, settings))
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
    outputs = {label: fn() for label, fn in impls}    # warm-up
    if c.check is not None:
        c.check(param, outputs)
    del outputs
    gc.collect()
    samples: dict[str, list[float]] = {label: [] for label, _ in impls}
    for _ in range(settings.rounds):
        for label, fn in impls:
            torch.set_num_threads(n)
            samples[label].append(float(timer(fn, num_threads=n, min_run_time=settings.min_run_time)))
    stats = [{"label": label, **_stats(samples[label])} for label, _ in impls]
    subject = stats[0]
    ratios = [{"peer": s["label"], "ratio": subject["median_s"] / s["median_s"] if s["median_s"] > 0 else None}
              for s in stats[1:]]
    return {"case": c.name, "size": size_label, "threads": n, "impls": stats, "ratios": ratios}


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
    """One row per (case, size, threads, peer): medians (± half range over rounds) and the ratio."""
    rows = ["| case | size | threads | sparsefill | peer | peer time | sparsefill / peer |",
            "|---|---|---:|---:|---|---:|---:|"]
    for r in results:
        head = f"| {r['case']} | {r['size']} | {r['threads']} "
        if "error" in r:
            last = r["error"].strip().splitlines()[-1].replace("|", "\\|")
            rows.append(head + f"| **error** | {last} | - | - |")
            continue
        subject = r["impls"][0]
        peers = r["impls"][1:] or [None]
        for peer, ratio in zip(peers, r["ratios"] or [None]):
            if peer is None:
                rows.append(head + f"| {_fmt_impl(subject)} | - | - | - |")
                continue
            q = ratio["ratio"]
            rows.append(head + f"| {_fmt_impl(subject)} | `{peer['label']}` | {_fmt_impl(peer)} | "
                        + ("-" if q is None else f"{'**' if q >= 2 else ''}{q:.2f}{'**' if q >= 2 else ''}") + " |")
    return "\n".join(rows)


def environment() -> dict[str, Any]:
    """What the numbers were measured on (torch, sparsefill, git commit, CPU)."""
    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "platform": platform.platform(), "machine": platform.machine(),
                           "processor": platform.processor(), "cpu_count": os.cpu_count(),
                           "torch_default_threads": torch.get_num_threads()}
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
    settings = Settings(rounds=1, min_run_time=0.0) if args.dry_run else None
    started = datetime.datetime.now(datetime.timezone.utc)
    results = run_cases(selected, args.threads, args.quick, timer=timer, settings=settings,
                        log=lambda msg: print(f"# {msg}", file=sys.stderr, flush=True))
    used = settings or (QUICK if args.quick else FULL)
    table = markdown_table(results)
    print(table)

    report = {"started": started.isoformat(timespec="seconds"), "quick": args.quick, "dry_run": args.dry_run,
              "threads": args.threads, "filter": args.filter, "settings": dataclasses.asdict(used),
              "environment": environment(), "results": results}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(table + "\n")
    print(f"# wrote {os.path.join(args.out, 'results.json')}", file=sys.stderr)
    return 1 if any("error" in r for r in results) else 0
