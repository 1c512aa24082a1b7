"""Generate docs/coverage.md: which stage computes each op on SparseTensor operands, from the code itself.

    python tools/coverage.py                     # the whole OpInfo database (forward and backward sweeps)
    python tools/coverage.py --ops exp,sum,mm    # a subset (OpInfo names, variant names included)
    python tools/coverage.py --out /tmp/c.md --no-backward

Two tables, neither written by hand:

* **OpInfo ops**: for each op of torch's ``op_db`` that the sweeps run (float64), the forward stage
  ``sparsefill.explain`` names for its first sample made sparse (COO), the aten ops reached; the forward
  outcome of ``tests/opinfo/test_opinfo.py`` and the backward outcome of ``tests/opinfo/test_opinfo_backward.py``
  (both sweeps run here, their per-op outcome classified by ``tests/conftest.py``'s ``_classify``, the
  code of the end-of-run summary), and the layout variants whose samples matched the dense result;
* **registry**: every aten ``OpOverload`` with a handler in ``ops/registry.py HANDLERS``, its handler and
  file:line.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import importlib.util
import os
import sys
import time
import warnings
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests")
if (
    sys.path and os.path.abspath(sys.path[0] or ".") == HERE
):  # run as a script: this file is not the
    sys.path.pop(0)  # 'coverage' package numba imports

FORWARD_ORDER = ("FAIL", "densify", "native", "declared")  # tests/conftest.py's summary orders
BACKWARD_ORDER = ("FAIL", "declared", "densify-backward", "densify", "native")
PASSING = {"native", "densify", "declared", "densify-backward"}


def _modules():
    root = os.path.dirname(
        TESTS
    )  # the sweeps import as tests.opinfo.<module> (tests/ is a package)
    if root not in sys.path:
        sys.path.insert(0, root)
    # tests/conftest.py by its path: under pytest another folder's conftest may hold the name "conftest"
    spec = importlib.util.spec_from_file_location(
        "sparsefill_tests_conftest", Path(TESTS) / "conftest.py"
    )
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    from tests.opinfo import test_opinfo, test_opinfo_backward

    return conftest, test_opinfo, test_opinfo_backward


@contextlib.contextmanager
def _fresh_report(mod):
    """The sweep module's REPORT, empty for this run (the suite's own run, if any, is left as it was)."""
    saved = mod.REPORT
    mod.REPORT = collections.defaultdict(collections.Counter)
    try:
        yield mod.REPORT
    finally:
        mod.REPORT = saved


def _sweep(mod, test, ops):
    with _fresh_report(mod) as report, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for op in ops:
            try:
                test(op)
            except AssertionError:  # recorded in REPORT as FAIL by the sweep itself
                pass
        return dict(report)


def _layouts(counts) -> str:
    ok = sorted({v for (v, o) in counts if o in PASSING})
    return " ".join(ok) if ok else "-"


def _forward_stage(op, fwd_mod):
    """``(stage, aten ops)`` that ``sparsefill.explain`` names for the op's first sample made sparse."""
    import torch
    import sparsefill

    try:
        for seed, sample in enumerate(op.sample_inputs("cpu", torch.float64, requires_grad=False)):
            conv = fwd_mod._convert_sample(sample, "coo", seed)
            if conv is None:
                continue
            (s_in, s_args, s_kw), _ = conv
            e = sparsefill.explain(op.op, s_in, *s_args, **s_kw)
            return e.stage, sorted({s.op for s in e.steps})
    except Exception as e:  # noqa: BLE001 (said in the table, not raised)
        return f"? ({type(e).__name__})", []
    return "n/a", []


def _revision() -> str:
    """`` at commit abc1234`` (``, src/ modified`` when the working tree differs there), or ``""``."""
    import subprocess

    root = os.path.dirname(HERE)
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return f" at commit {head}" + (" with src/ modified in the working tree" if dirty else "")


def _key(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def generate(names=None, out=None, backward=True) -> str:
    """The markdown of docs/coverage.md for the OpInfo ops named in ``names`` (None: every one the sweeps
    run); written to ``out`` when given."""
    conftest, fwd_mod, bwd_mod = _modules()
    from sparsefill.ops import registry
    from sparsefill._explain import _where

    pick = (
        (lambda op: True) if names is None else (lambda op: _key(op) in names or op.name in names)
    )  # noqa: E731
    fops = [op for op in fwd_mod.OPS if pick(op)]
    bops = [op for op in bwd_mod.OPS if pick(op)] if backward else []
    t0 = time.time()
    fwd = _sweep(fwd_mod, fwd_mod.test_layout_invariance, fops)
    bwd = _sweep(bwd_mod, bwd_mod.test_backward_conformance, bops)
    _, fhow = conftest._classify(fwd, FORWARD_ORDER)
    _, bhow = conftest._classify(bwd, BACKWARD_ORDER) if bwd else ({}, {})
    took = time.time() - t0

    stamp = (
        datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC") + _revision()
    )
    import torch

    lines = [
        "# Coverage: which stage computes each op",
        "",
        f"Generated by `python tools/coverage.py` on {stamp} (torch {torch.__version__}, "
        f"{len(fops)} OpInfo ops forward, {len(bops)} backward, {took:.0f} s); do not edit by hand.",
        "",
        "Stages, in the registry's order (`sparsefill.explain(op, *args)` answers for one call): "
        "`route` (an autograd route of `ops/autograd_routes.py`), `handler` (`ops/registry.py HANDLERS`), "
        "`pointwise` (the rule of ops tagged `Tag.pointwise`), `decomposition` (CompositeImplicitAutograd), "
        "`densify` (the fallback, under the densify policy). The forward stage is the first that could take "
        "the call; a handler or route may decline some inputs (then the outcome says `densify`).",
        "",
        "Forward and backward outcomes are those of the OpInfo sweeps (`tests/opinfo/test_opinfo.py`, "
        "`tests/opinfo/test_opinfo_backward.py`, classified as their end-of-run summary does in `tests/conftest.py`): "
        "`native` matched the dense result with no densify, `densify` matched through the fallback, "
        "`declared` behaves as declared in the sweep module, `FAIL` a mismatch, `not exercised` no applicable "
        "sample. Layouts: the variants whose samples matched (`coo`, `csr`, `hybrid`, `nan` fill, `coo-all` "
        "every float64 operand sparse; backward: also `indefinite`).",
        "",
        "## OpInfo ops",
        "",
        "| op | forward stage (first COO sample) | aten ops reached | forward | layouts | backward | backward layouts |",
        "|---|---|---|---|---|---|---|",
    ]
    counts = collections.Counter()
    for op in fops:
        k = _key(op)
        stage, aten = _forward_stage(op, fwd_mod)
        counts[stage] += 1
        b = bhow.get(k, "-") if backward else "not run"
        lines.append(
            f"| `{k}` | {stage} | {', '.join(f'`{a}`' for a in aten) or '-'} | {fhow.get(k, '-')} | "
            f"{_layouts(fwd.get(k, {}))} | {b} | {_layouts(bwd.get(k, {})) if k in bwd else '-'} |"
        )
    fsum = collections.Counter(fhow.values())
    bsum = collections.Counter(bhow.values())
    lines[4:4] = [
        f"Totals: forward stage {dict(sorted(counts.items()))}; forward outcome "
        f"{dict(sorted(fsum.items()))}; backward outcome {dict(sorted(bsum.items()))}.",
        "",
    ]
    lines += [
        "",
        "## Registered aten handlers",
        "",
        "| aten op | handler | where |",
        "|---|---|---|",
    ]
    for func, h in sorted(registry.HANDLERS.items(), key=lambda kv: str(kv[0])):
        lines.append(f"| `{func}` | `{h.__qualname__}` | `{_where(h)}` |")
    text = "\n".join(lines) + "\n"
    if out:
        with open(out, "w") as f:
            f.write(text)
    return text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ops", help="comma-separated OpInfo names (default: all)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "docs", "coverage.md"))
    p.add_argument("--no-backward", action="store_true", help="skip the backward sweep")
    a = p.parse_args(argv)
    names = set(a.ops.split(",")) if a.ops else None
    generate(names, a.out, backward=not a.no_backward)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
