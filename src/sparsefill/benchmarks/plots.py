"""PNG plots of a benchmark report (matplotlib, no display needed: figures are drawn with Agg).

* one plot per case that declares ``sweep=``: time per call against the swept parameter
  (density, size...), log scales, one line per library (and per thread count when several);
* ``crossover.png``: for the cases swept over density, sparsefill time / dense time against
  density, one line per case (its peers labelled ``dense ...``): where a line crosses 1,
  sparsefill stops beating dense torch;
* ``summary.png``: sparsefill time / peer time for every (case, size, peer) of the cases that are
  not sweeps, at the largest thread count, log scale, 1 marked (left of it sparsefill is faster).

``matplotlib`` is imported here only, when a plot is drawn (importing this module needs none):
the runner writes no plots (with a note) when it is missing.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any
from collections.abc import Mapping

__all__ = ["write_plots", "sweep_plot", "crossover_plot", "summary_plot"]

_STYLES = ["-", "--", ":", "-."]


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")[:60] or "case"


def _time_unit(seconds: list[float]) -> tuple[str, float]:
    top = max(seconds)
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if top >= scale:
            return unit, scale
    return "ns", 1e-9


def _new_figure(width=6.4, height=4.2):
    """A matplotlib ``Figure`` on an Agg canvas (``ImportError`` without matplotlib)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def sweep_plot(case: str, rows: list[Mapping[str, Any]], path: str) -> bool:
    """Time per call against ``x`` for one case; False (nothing written) with fewer than 2 x
    values."""
    rows = [r for r in rows if "impls" in r and r.get("x") is not None]
    if len({r["x"] for r in rows}) < 2:
        return False
    threads = sorted({r["threads"] for r in rows})
    labels: list[str] = []
    skipped: dict[str, str] = {}
    for r in rows:
        for s in r["impls"]:
            if "skipped" in s:
                skipped.setdefault(s["label"], s["skipped"])
            elif s["label"] not in labels:
                labels.append(s["label"])
    unit, scale = _time_unit([s["median_s"] for r in rows for s in r["impls"] if "median_s" in s])
    fig = _new_figure()
    ax = fig.add_subplot()
    colors = [f"C{i % 10}" for i in range(len(labels))]
    for li, label in enumerate(labels):
        for ti, n in enumerate(threads):
            pts = sorted(
                (r["x"], s["median_s"] / scale)
                for r in rows
                if r["threads"] == n
                for s in r["impls"]
                if s["label"] == label and "median_s" in s
            )
            if not pts:
                continue
            name = label if len(threads) == 1 else f"{label}, {n} thread{'s' if n > 1 else ''}"
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                _STYLES[ti % len(_STYLES)],
                marker="o",
                markersize=4,
                color=colors[li],
                label=name,
                linewidth=2.2 if li == 0 else 1.4,
            )
    xs = [r["x"] for r in rows]
    if min(xs) > 0 and max(xs) / min(xs) >= 10:
        ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(rows[0].get("sweep") or "x")
    ax.set_ylabel(f"time per call ({unit}, median)")
    one = f", {threads[0]} thread{'s' if threads[0] > 1 else ''}" if len(threads) == 1 else ""
    ax.set_title(f"{case}{one}", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    if skipped:
        fig.text(
            0.01,
            0.005,
            "; ".join(f"{k}: skipped ({v})" for k, v in skipped.items()),
            fontsize=7,
            color="gray",
            va="bottom",
        )
    fig.savefig(path)
    return True


def crossover_plot(results: list[Mapping[str, Any]], path: str) -> bool:
    """sparsefill / dense against density for every density sweep; False when there is none."""
    rows = [
        r
        for r in results
        if "impls" in r
        and r.get("x") is not None
        and str(r.get("sweep") or "").startswith("density")
    ]
    if not rows:
        return False
    top = max(r["threads"] for r in rows)
    lines: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        if r["threads"] != top:
            continue
        for q in r["ratios"]:
            if q["peer"].startswith("dense") and q["ratio"]:
                lines.setdefault(f"{r['case']} vs {q['peer']}", []).append((r["x"], q["ratio"]))
    lines = {k: sorted(v) for k, v in lines.items() if len(v) >= 2}
    if not lines:
        return False
    fig = _new_figure()
    ax = fig.add_subplot()
    for i, (name, pts) in enumerate(lines.items()):
        ax.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            "-",
            marker="o",
            markersize=4,
            color=f"C{i % 10}",
            label=name.removeprefix("sweep: "),
        )
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(rows[0]["sweep"])
    ax.set_ylabel("sparsefill time / dense torch time")
    ax.set_title(
        f"Below 1 sparsefill beats dense torch ({top} thread{'s' if top > 1 else ''})", fontsize=10
    )
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7)
    fig.savefig(path)
    return True


def summary_plot(results: list[Mapping[str, Any]], path: str) -> bool:
    """Horizontal bars of sparsefill / peer at the largest thread count; False when there is nothing
    to show."""
    rows = [r for r in results if "impls" in r and r.get("ratios") and not r.get("sweep")]
    if not rows:
        return False
    top = max(r["threads"] for r in rows)
    bars = [
        (f"{r['case']} [{r['size']}] vs {q['peer']}", q["ratio"])
        for r in rows
        if r["threads"] == top
        for q in r["ratios"]
        if q["ratio"] is not None and q["ratio"] > 0
    ]
    if not bars:
        return False
    bars.reverse()  # first case at the top
    fig = _new_figure(8.0, 1.2 + 0.22 * len(bars))
    ax = fig.add_subplot()
    y = range(len(bars))
    vals = [b[1] for b in bars]
    ax.barh(list(y), vals, color=["C2" if v < 1 else "C3" for v in vals], height=0.7)
    ax.set_yticks(list(y), [b[0][:70] for b in bars], fontsize=7)
    ax.set_xscale("log")
    lo, hi = min(vals + [1.0]), max(vals + [1.0])
    ax.set_xlim(10 ** math.floor(math.log10(lo) - 0.05), 10 ** math.ceil(math.log10(hi) + 0.05))
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xlabel("sparsefill time / peer time (log; < 1: sparsefill faster, green)")
    ax.set_title(f"sparsefill against each peer, {top} thread{'s' if top > 1 else ''}", fontsize=10)
    ax.grid(True, axis="x", which="major", alpha=0.3)
    fig.savefig(path)
    return True


def write_plots(report: Mapping[str, Any], out_dir: str) -> list[str]:
    """Write the sweep plots and summary.png for ``report`` (the runner's results.json); return the
    paths. ``ImportError`` without matplotlib, even when no plot would be drawn."""
    import matplotlib  # noqa: F401

    os.makedirs(out_dir, exist_ok=True)
    results = report.get("results", [])
    written: list[str] = []
    by_case: dict[str, list] = {}
    for r in results:
        if r.get("sweep"):
            by_case.setdefault(r["case"], []).append(r)
    for name, rows in by_case.items():
        path = os.path.join(out_dir, _slug(name) + ".png")
        if sweep_plot(name, rows, path):
            written.append(path)
    for name, plot in (("crossover.png", crossover_plot), ("summary.png", summary_plot)):
        path = os.path.join(out_dir, name)
        if plot(results, path):
            written.append(path)
    return written
