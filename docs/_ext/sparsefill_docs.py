"""Sphinx extension of the sparsefill site: pages generated from data, and the API reference check.

* ``performance/results.json`` (the output of ``python -m sparsefill bench``, committed with the
  date, machine and commit it was measured at) becomes ``_generated/performance_results.md`` and the
  plots, through the bench's own ``report.markdown_summary`` / ``markdown_table`` and
  ``plots.write_plots``: the performance page is never copied by hand.
* Once every page is read, each name in ``__all__`` of the public modules (``PUBLIC_MODULES``) must
  be a documented Python object of the site: a name missing from the API reference stops the build
  (a warning, an error under ``-W``).
* ``gallery_argv``: the command-line arguments of each example in the gallery (small sizes).
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

from sphinx.util import logging

LOG = logging.getLogger(__name__)
DOCS = Path(__file__).resolve().parents[1]

# The modules whose __all__ the API reference documents, and the extra public names that live
# outside an __all__ (``sparsefill.explain`` is a function of the top-level package).
PUBLIC_MODULES = (
    "sparsefill",
    "sparsefill.masked",
    "sparsefill.segment",
    "sparsefill.distributed",
    "sparsefill.nn",
    "sparsefill.data",
)
EXTRA_NAMES = ("sparsefill.explain",)

# Small sizes for the gallery: the examples' defaults are the benchmark sizes (seconds each).
GALLERY_ARGV = {
    "gat": ["--nodes", "400", "--reps", "2", "--plot"],
    "dlrm": ["--batch", "128", "--rows", "2000", "--reps", "2", "--plot"],
    "rare_events": ["--samples", "200000", "--reps", "2", "--plot"],
    "sparse_attention": ["--tokens", "300", "--density", "0.05", "--reps", "2", "--plot"],
}


def gallery_argv(gallery_conf, script_vars) -> list[str]:
    """sphinx-gallery's ``reset_argv``: ``sys.argv[1:]`` for the example being run."""
    return list(GALLERY_ARGV.get(Path(script_vars["src_file"]).stem, []))


def public_names() -> dict[str, list[str]]:
    """``{module: [qualified names]}``: what the API reference must document."""
    out = {}
    for name in PUBLIC_MODULES:
        mod = importlib.import_module(name)
        out[name] = [f"{name}.{n}" for n in mod.__all__]
    out["extra"] = list(EXTRA_NAMES)
    return out


# ----------------------------------------------------------------------------- performance page
def _environment_line(report: dict) -> str:
    env = report.get("environment", {})
    settings = report.get("settings", {})
    commit = (env.get("git_commit") or "unknown")[:10]
    return (
        f"Measured with `{report.get('command', '')}`, started {report.get('started')}, "
        f"{report.get('total_s', 0):.0f} s in all; machine: "
        f"{env.get('cpu_model') or env.get('processor') or 'unknown CPU'}, "
        f"{env.get('cpu_count')} cores; torch {env.get('torch')}, Python {env.get('python')}, "
        f"sparsefill {env.get('sparsefill')} at commit `{commit}`"
        + (" (src/ modified)" if env.get("src_dirty") else "")
        + f"; {settings.get('rounds')} rounds of {settings.get('min_run_time')} s per measurement."
    )


def _load_line(report: dict) -> str:
    """How busy the machine was: the ``other_cpu`` of the timed rows (a loaded run reads slower)."""
    busy = sorted(
        r["other_cpu"] for r in report.get("results", []) if r.get("other_cpu") is not None
    )
    if not busy:
        return ""
    median = busy[len(busy) // 2]
    return (
        f"While the rows were timed, other processes kept a median of {median:.2f} cores busy "
        f"(at most {busy[-1]:.2f}; the **other CPU** column)"
        + (
            ": a loaded machine, so the times are noisy and on the slow side."
            if median > 0.2
            else "."
        )
    )


def _peers_line(report: dict) -> str:
    peers = (report.get("environment") or {}).get("peers") or {}
    if not peers:
        return ""
    return "Peer libraries: " + ", ".join(
        f"{k} {v}" if v else f"{k} not installed (its rows say skipped)" for k, v in peers.items()
    )


def write_performance(app) -> None:
    """``_generated/performance_results.md`` and the plots from ``performance/results.json``."""
    from sparsefill.benchmarks import plots, report as rep

    src = DOCS / "performance" / "results.json"
    out = DOCS / "_generated"
    out.mkdir(exist_ok=True)
    for old in out.glob("*.png"):
        old.unlink()
    report = json.loads(src.read_text())
    results = report.get("results", [])
    written = [Path(p).name for p in plots.write_plots(report, str(out))]
    bw = report.get("copy_bandwidth") or {}
    lines = [_environment_line(report), ""]
    if bw:
        lines += [
            "Copy bandwidth (`dst.copy_(src)`, float32, read + write): "
            + ", ".join(f"{n} thread(s) {v / 1e9:.3g} GB/s" for n, v in bw.items())
            + ".",
            "",
        ]
    if _load_line(report):
        lines += [_load_line(report), ""]
    if _peers_line(report):
        lines += [_peers_line(report) + ".", ""]
    lines += ["## Summary", "", rep.markdown_summary(results), ""]
    for name in ("crossover.png", "summary.png"):
        if name in written:
            lines += [f"![{name}](/_generated/{name})", ""]
    lines += ["## Density and size sweeps", ""]
    lines += [
        f"![{n}](/_generated/{n})" for n in written if n not in ("crossover.png", "summary.png")
    ]
    lines += ["", "## Every peer", "", rep.markdown_table(results), ""]
    lines += [
        (rep.markdown_table.__doc__ or "").split("\n\n", 1)[-1].strip().replace("\n    ", " ")
    ]
    text = "\n".join(lines) + "\n"
    target = out / "performance_results.md"
    if not target.exists() or target.read_text() != text:
        target.write_text(text)


# ----------------------------------------------------------------------------- docstrings
# Module-level dicts have no docstring of their own (autodoc would show ``dict``'s).
DATA_DOCS = {
    "sparsefill.segment.ALIASES": (
        "``{Caffe2 operator name: (reducer, positional argument order)}``: the Caffe2-named "
        "functions of this module, each :func:`sparsefill.segment.reduce` with a fixed reducer."
    ),
    "sparsefill.segment.SEGMENT_REDUCERS": (
        "``{name: SegmentReducer}``: the reducers :func:`sparsefill.segment.reduce` accepts by "
        "name (``'sum'``, ``'mean'``, ``'max'``, ...)."
    ),
}
# torch's docstrings (inherited by SparseTensor's methods, reused by sparsefill.distributed) refer
# to labels of torch's own site: without its inventory they become their text.
_REF = re.compile(r":ref:`([^`<]*?)\s*<([^`>]+)>`|:ref:`([^`]+)`")


def _ref_text(m: re.Match) -> str:
    return " ".join(m.group(1).split()) if m.group(1) else f"``{m.group(3)}``"


def process_docstring(app, what, name, obj, options, lines) -> None:
    if name in DATA_DOCS:
        lines[:] = [DATA_DOCS[name]]
        return
    text = "\n".join(lines)
    if ":ref:`" in text:  # (a role may span two lines)
        lines[:] = _REF.sub(_ref_text, text).split("\n")


# ----------------------------------------------------------------------------- API index check
def check_api_reference(app, env) -> None:
    """Every public name is a documented Python object of the site (else a warning: -W fails)."""
    documented = set(env.get_domain("py").objects)
    for module, names in public_names().items():
        missing = [n for n in names if n not in documented]
        if missing:
            LOG.warning(
                "API reference: %d public name(s) of %s are not documented: %s",
                len(missing),
                module,
                ", ".join(missing),
            )


def setup(app):
    app.connect("builder-inited", write_performance)
    app.connect("autodoc-process-docstring", process_docstring)
    app.connect("env-check-consistency", check_api_reference)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
