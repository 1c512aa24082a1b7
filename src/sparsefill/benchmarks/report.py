"""Markdown out of the runner's records: the table (stdout, README) and results.md (table +
context)."""

from __future__ import annotations

from typing import Any
from collections.abc import Mapping, Sequence

__all__ = ["markdown_table", "markdown_summary", "markdown_report", "fmt_time", "fmt_bytes"]

COLUMNS = (
    "case",
    "size",
    "threads",
    "sparsefill",
    "peer",
    "peer time",
    "sparsefill / peer",
    "sparsefill − peer",
    "sparsefill GB/s (% of copy)",
    "peak memory sparsefill / peer",
    "other CPU",
)


def fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(s) >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def _fmt_impl(s: Mapping[str, Any]) -> str:
    return f"{fmt_time(s['median_s'])} ±{100 * s['spread']:.0f}%"


def _gbps(s: Mapping[str, Any]) -> str:
    g = s.get("gbps")
    if g is None:
        return "-"
    pct = s.get("pct_copy")
    return f"{g:.3g}" + ("" if pct is None else f" ({pct:.0f}%)")


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(results: Sequence[Mapping[str, Any]], *, dry_run: bool = False) -> str:
    """One row per (case, size, threads, peer).

    Times: median of the round medians ± half their range; ``sparsefill / peer`` > 1 means
    sparsefill is slower (bold when >= 2); ``sparsefill − peer``: the time difference (the per-call
    overhead for tiny inputs); GB/s: the bytes the case must read and write / sparsefill's time, and
    its share of the machine's copy bandwidth; peak memory: the larger of torch's allocation peak
    and the RSS growth during one call; other CPU: cores other processes kept busy meanwhile.
    """
    rows = [
        "| " + " | ".join(COLUMNS) + " |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    if dry_run:
        rows.insert(0, "<!-- dry run: nothing was timed, the times are placeholders -->")
    for r in results:
        head = f"| {_cell(r['case'])} | {_cell(r['size'])} | {r['threads']} "
        if "error" in r:
            last = r["error"].strip().splitlines()[-1]
            rows.append(head + f"| **error** | {_cell(last)} | - | - | - | - | - | - |")
            continue
        if "skipped" in r:
            rows.append(head + f"| skipped: {_cell(r['skipped'])} | - | - | - | - | - | - | - |")
            continue
        subject = r["impls"][0]
        other = r.get("other_cpu")
        tail = (
            f" | {_gbps(subject)} | {{mem}} | " + ("-" if other is None else f"{other:.2f}") + " |"
        )
        ratios = {q["peer"]: q["ratio"] for q in r["ratios"]}
        peers = r["impls"][1:]
        if not peers:
            rows.append(
                head
                + f"| {_fmt_impl(subject)} | - | - | - | -"
                + tail.format(mem=fmt_bytes(subject.get("peak_bytes")))
            )
            continue
        for peer in peers:
            if "skipped" in peer:
                rows.append(
                    head + f"| {_fmt_impl(subject)} | `{_cell(peer['label'])}` | skipped: "
                    f"{_cell(peer['skipped'])} | - | -"
                    + tail.format(mem=fmt_bytes(subject.get("peak_bytes")) + " / -")
                )
                continue
            q = ratios.get(peer["label"])
            ratio = "-" if q is None else (f"**{q:.2f}**" if q >= 2 else f"{q:.2f}")
            diff = fmt_time(subject["median_s"] - peer["median_s"])
            mem = f"{fmt_bytes(subject.get('peak_bytes'))} / {fmt_bytes(peer.get('peak_bytes'))}"
            rows.append(
                head + f"| {_fmt_impl(subject)} | `{_cell(peer['label'])}` | {_fmt_impl(peer)} | "
                f"{ratio} | {diff}" + tail.format(mem=mem)
            )
    return "\n".join(rows)


def markdown_summary(results: Sequence[Mapping[str, Any]]) -> str:
    """One row per (case, size, threads): sparsefill's time, then every peer as ``time (sparsefill /
    peer)``.

    Skipped peers read ``label: skipped``; ratios < 1 mean sparsefill is faster, bold when >= 2.
    """
    rows = [
        "| case | size | threads | sparsefill | peers: time (sparsefill / peer) | GB/s (% of "
        "copy) |",
        "|---|---|---:|---:|---|---:|",
    ]
    for r in results:
        head = f"| {_cell(r['case'])} | {_cell(r['size'])} | {r['threads']} "
        if "error" in r:
            rows.append(head + f"| **error** | {_cell(r['error'].strip().splitlines()[-1])} | - |")
            continue
        if "skipped" in r:
            rows.append(head + f"| skipped | {_cell(r['skipped'])} | - |")
            continue
        ratios = {q["peer"]: q["ratio"] for q in r["ratios"]}
        peers = []
        for s in r["impls"][1:]:
            if "skipped" in s:
                peers.append(f"{_cell(s['label'])}: skipped")
                continue
            q = ratios.get(s["label"])
            qs = "-" if q is None else (f"**{q:.2f}**" if q >= 2 else f"{q:.2f}")
            peers.append(f"{_cell(s['label'])} {fmt_time(s['median_s'])} ({qs})")
        rows.append(
            head + f"| {fmt_time(r['impls'][0]['median_s'])} | {' · '.join(peers) or '-'} | "
            f"{_gbps(r['impls'][0])} |"
        )
    return "\n".join(rows)


def markdown_report(report: Mapping[str, Any]) -> str:
    """results.md: how it was run, on what, the copy bandwidth, the table, the plots, what was left
    out."""
    env = report.get("environment", {})
    bw = report.get("copy_bandwidth") or {}
    lines = ["# sparsefill benchmarks", ""]
    if report.get("dry_run"):
        lines += ["**Dry run: nothing was timed; times, GB/s and ratios are placeholders.**", ""]
    lines += [
        f"`{report.get('command', '')}` — started {report.get('started')}, "
        f"{report.get('total_s', 0):.0f} s in all"
        + (f", time budget {report['budget_s']:.0f} s" if report.get("budget_s") else "")
        + ".",
        "",
        f"Machine: {env.get('cpu_model') or env.get('processor') or '?'}, {env.get('cpu_count')} "
        f"cores; torch {env.get('torch')}, Python {env.get('python')}, sparsefill "
        f"{env.get('sparsefill')} at `{(env.get('git_commit') or '?')[:7]}`"
        + (" (src/ modified)" if env.get("src_dirty") else "")
        + f"; THP_MEM_ALLOC_ENABLE={env.get('THP_MEM_ALLOC_ENABLE') or 'unset'}"
        + f"; rounds {report.get('settings', {}).get('rounds')}, "
        f"{report.get('settings', {}).get('min_run_time')} s per measurement.",
        "",
    ]
    if bw:
        lines += [
            "Copy bandwidth (`dst.copy_(src)`, float32, read + write): "
            + ", ".join(
                f"{n} thread{'s' if int(n) > 1 else ''} {v / 1e9:.3g} GB/s" for n, v in bw.items()
            )
            + ".",
            "",
        ]
    peers = env.get("peers") or {}
    if peers:
        lines += [
            "Peer libraries: "
            + ", ".join(
                f"{k} {v}" if v else f"{k} not installed (its rows say skipped)"
                for k, v in peers.items()
            )
            + ".",
            "",
        ]
    lines += [
        "## Summary",
        "",
        markdown_summary(report.get("results", [])),
        "",
        "## Every peer",
        "",
        markdown_table(report.get("results", []), dry_run=bool(report.get("dry_run"))),
        "",
        (markdown_table.__doc__ or "").split("\n\n", 1)[-1].strip().replace("\n    ", " "),
        "",
    ]
    if report.get("plots"):
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in report["plots"]] + [""]
    if report.get("plots_note"):
        lines += [report["plots_note"], ""]
    errors = [r for r in report.get("results", []) if "error" in r]
    if errors:
        lines += ["## Errors", ""]
        for r in errors:
            lines += [
                f"### {r['case']} [{r['size']}] threads={r['threads']}",
                "",
                "```",
                r["error"].rstrip(),
                "```",
                "",
            ]
    return "\n".join(lines).rstrip()
