"""Cold start: what importing sparsefill and the first call of each op family cost in a fresh process.

Every case runs in its own ``python -c`` subprocess (``--repeat`` of them, median reported)::

    t0; import torch; t1; import sparsefill; t2; <setup: the inputs>; t3; <first call>; t4; <same call>; t5

and reports, in milliseconds: ``torch`` (t1 - t0), ``import`` (t2 - t1), ``first`` (t4 - t3: the first
call, its inputs already built), ``warm`` (t5 - t4: the same call again) and ``over torch``
(t4 - t1: everything after ``import torch``, i.e. importing sparsefill, building the inputs and the
first call -- the budget is 0.3 s).  The bytecode of the package is cached (``PYCACHE``) as an installed
package's is.  ``--importtime CASE`` prints the ``-X importtime``
lines of the modules that case imports after torch, heaviest first; ``--modules`` lists the heavy
optional modules (sympy, numba, scipy, ...) loaded at the end of each case.

    python tools/coldstart.py                 # the table, median of 5 fresh processes
    python tools/coldstart.py --importtime cumsum
    python tools/coldstart.py --before /tmp/before/src   # and the same cases on an older checkout
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

# name: (setup, first call).  The setup builds small inputs (the size of a unit test, a DataLoader item).
_SP = (
    "A = sparsefill.sparse_coo_tensor(torch.tensor([[0, 1, 1, 3], [2, 0, 3, 1]]), torch.tensor([1., 2., 3., 4.]),"
    " (4, 5), fill_value=0.5)\n"
)
_CSR = "C = sparsefill.sparse_csr_tensor([0, 1, 2, 2, 3], [1, 0, 4], [3., 4., 5.], (4, 5), fill_value=-1.)\n"
_SEG = (
    "data = torch.randn(100, 8); lengths = torch.tensor([30, 0, 50, 20]); "
    "ids = torch.randint(0, 4, (100,)); idx = torch.randint(0, 100, (60,)); ilen = torch.tensor([20, 40])\n"
)
CASES = {
    "import torch": ("", "pass"),
    "import sparsefill": ("", "pass"),
    "construction": (
        "i = torch.tensor([[0, 1, 1, 3], [2, 0, 3, 1]]); v = torch.tensor([1., 2., 3., 4.])",
        "sparsefill.sparse_coo_tensor(i, v, (4, 5), fill_value=0.5)",
    ),
    "element-wise": (_SP, "torch.exp(A) + A"),
    "reduction": (_SP, "A.sum(1)"),
    "cumsum": (_SP, "torch.cumsum(A, 1)"),
    "softmax": (_SP, "torch.softmax(A, 1)"),
    "matmul": (_SP + "x = torch.randn(5, 3)", "A @ x"),
    "indexing": (_SP, "A[torch.tensor([0, 3])]"),
    "mean": (_SP, "A.mean(1)"),
    "std": (_SP, "A.std(1)"),
    "norm": (_SP, "A.norm()"),
    "logsumexp": (_SP, "torch.logsumexp(A, 1)"),
    "CSR @ vector": (_CSR + "v = torch.randn(5)", "C @ v"),
    "addmm": (_SP + "b = torch.randn(4, 3); x = torch.randn(5, 3)", "torch.addmm(b, A, x)"),
    "matmul with a vector": (_SP + "v = torch.randn(5)", "torch.matmul(A, v)"),
    "cat": (_SP, "torch.cat([A, A])"),
    "stack": (_SP, "torch.stack([A, A])"),
    "roll": (_SP, "torch.roll(A, 1, 0)"),
    "tril": (_SP, "torch.tril(A)"),
    "masked.sum": (_SP + "m = torch.rand(4, 5) > 0.5", "sparsefill.masked.sum(A, 1, mask=m)"),
    "masked.softmax": (
        _SP + "m = torch.rand(4, 5) > 0.5",
        "sparsefill.masked.softmax(A, 1, mask=m)",
    ),
    "segment.reduce sum": (_SEG, "sparsefill.segment.reduce(data, 'sum', lengths=lengths)"),
    "segment.reduce max": (_SEG, "sparsefill.segment.reduce(data, 'max', lengths=lengths)"),
    "unsorted_segment_sum": (
        _SEG,
        "sparsefill.segment.unsorted_segment_sum(data, ids, num_segments=4)",
    ),
    "sparse_lengths_sum": (_SEG, "sparsefill.segment.sparse_lengths_sum(data, idx, ilen)"),
    "KeyedJaggedBatch": (
        "b = [{1: [10, 11], 3: [101]}, {1: [11], 2: [50], 3: [102, 103]}]; t = torch.randn(200, 4)",
        "kj = sparsefill.segment.KeyedJaggedBatch.from_lists(b); kj.to_dict(); kj.pooled(t, 'sum')",
    ),
    "every family": (
        _SP + _SEG + "x = torch.randn(5, 3); m = torch.rand(4, 5) > 0.5",
        "sparsefill.sparse_coo_tensor([[0, 2]], [1., 2.], (3,), fill_value=0.5); A * 2 + A; A.sum(1); "
        "A.cumsum(0); A @ x; sparsefill.masked.sum(A, 1, mask=m); "
        "sparsefill.segment.reduce(data, 'sum', lengths=lengths)",
    ),
    "peer: wrapper subclass, first op": (
        "class W(torch.Tensor):\n"
        "    __torch_function__ = torch._C._disabled_torch_function_impl\n"
        "    @classmethod\n"
        "    def __torch_dispatch__(cls, func, types, args, kwargs=None):\n"
        "        return func(*[a.t if isinstance(a, W) else a for a in args], **(kwargs or {}))\n"
        "w = torch.Tensor._make_wrapper_subclass(W, (4, 5)); w.t = torch.randn(4, 5)",
        "torch.exp(w)",
    ),
    "peer: torch.optim.Adagrad step": (
        "w = torch.nn.Parameter(torch.randn(100, 8)); opt = torch.optim.Adagrad([w], lr=0.1); "
        "w.grad = torch.sparse_coo_tensor(torch.tensor([[1, 5, 5]]), torch.randn(3, 8), (100, 8))",
        "opt.step()",
    ),
    "sparse optimizer step": (
        "w = torch.nn.Parameter(torch.randn(100, 8)); opt = sparsefill.segment.SparseAdagrad([w], lr=0.1); "
        "w.grad = torch.sparse_coo_tensor(torch.tensor([[1, 5, 5]]), torch.randn(3, 8), (100, 8))",
        "opt.step()",
    ),
}
HEAVY = (
    "sympy",
    "numba",
    "llvmlite",
    "scipy",
    "pandas",
    "sparse",
    "numpy.f2py",
    "torch._dynamo",
    "torch._inductor",
)


def _script(name: str, preload: str = "") -> str:
    setup, call = CASES[name]
    imp = "pass" if name == "import torch" or name.startswith("peer:") else "import sparsefill"
    return (
        f"import time, sys, json\nt0 = time.perf_counter()\nimport torch\n{preload}\nt1 = time.perf_counter()\n"
        f"{imp}\nt2 = time.perf_counter()\n{setup}\nt3 = time.perf_counter()\n{call}\n"
        f"t4 = time.perf_counter()\n{call}\nt5 = time.perf_counter()\n"
        f"print('@@' + json.dumps(dict(torch=t1 - t0, imp=t2 - t1, first=t4 - t3, warm=t5 - t4, over=t4 - t1, "
        f"mods=[m for m in {HEAVY!r} if m in sys.modules])))\n"
    )


# sparsefill's bytecode is cached here, as an installed package's is (pip compiles it); with
# PYTHONDONTWRITEBYTECODE set (as in some CI and sandboxes) every process would compile the package from
# source (~0.6-0.9 s) while torch's own bytecode comes from site-packages
PYCACHE = os.path.join(os.environ.get("TMPDIR", "/tmp"), "sparsefill-coldstart-pycache")


def run_case(name: str, extra_env=None, python=sys.executable, preload: str = "") -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPYCACHEPREFIX=PYCACHE, **(extra_env or {}))
    out = subprocess.run(
        [python, "-c", _script(name, preload)], capture_output=True, text=True, env=env, check=True
    ).stdout
    return json.loads(out[out.rindex("@@") + 2 :].splitlines()[0])


def measure(names=None, repeat: int = 5, variants=None, preload: str = "") -> dict:
    """``{variant: {case: {key: median over `repeat` fresh processes}}}`` (seconds; ``mods``: those of the
    last run).  ``variants`` maps a label to extra environment variables (e.g. ``{"before": {"PYTHONPATH":
    old_src}}``).  Cases and variants are interleaved (round-robin) so that machine noise spreads over all."""
    names = list(names or CASES)
    variants = variants or {"now": {}}
    runs = {v: {n: [] for n in names} for v in variants}
    for env in variants.values():  # (writes the bytecode cache: PYCACHE)
        run_case("import sparsefill", env, preload=preload)
    for _ in range(repeat):
        for n in names:
            for v, env in variants.items():
                runs[v][n].append(run_case(n, env, preload=preload))
    return {
        v: {
            n: {
                **{
                    k: statistics.median(r[k] for r in rs)
                    for k in ("torch", "imp", "first", "warm", "over")
                },
                "mods": rs[-1]["mods"],
            }
            for n, rs in rv.items()
        }
        for v, rv in runs.items()
    }


def importtime(name: str, top: int = 25, preload: str = "") -> str:
    """The ``-X importtime`` lines (cumulative us, module) of the modules imported after torch, heaviest first."""
    err = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", _script(name, preload)],
        capture_output=True,
        text=True,
    ).stderr
    lines, seen_torch = [], False
    for ln in err.splitlines():
        if not ln.startswith("import time:") or "|" not in ln:
            continue
        _, cum, mod = (p.strip() for p in ln[len("import time:") :].split("|"))
        if mod == "torch":
            seen_torch = True
            continue
        if seen_torch and cum.isdigit():
            lines.append((int(cum), mod))
    lines.sort(reverse=True)
    return "\n".join(f"{c / 1e3:9.1f} ms  {m}" for c, m in lines[:top])


def _over(n, r):
    return r["torch"] if n == "import torch" else r["over"]


def table(res: dict) -> str:
    """A markdown table: per case and variant the first call, the warm call and the cost over ``import torch``."""
    vs = list(res)
    head = " | ".join(f"{v}: first call / warm call / over `import torch` (ms)" for v in vs)
    rows = [
        f"| family | {head} | heavy modules loaded ({vs[-1]}) |",
        "|---|" + "---:|" * len(vs) + "---|",
    ]
    for n in res[vs[0]]:
        cells = " | ".join(
            f"{res[v][n]['first'] * 1e3:.1f} / {res[v][n]['warm'] * 1e3:.2f} / "
            f"**{_over(n, res[v][n]) * 1e3:.0f}**"
            for v in vs
        )
        rows.append(f"| {n} | {cells} | {', '.join(res[vs[-1]][n]['mods']) or '-'} |")
    return "\n".join(rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", help="case names (default: all)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--importtime", metavar="CASE")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--preload",
        default="",
        metavar="CODE",
        help="run after `import torch` and count it as torch's (e.g. 'import torch.distributed.tensor': "
        "what torch itself imports on the first __torch_dispatch__ of any subclass)",
    )
    ap.add_argument(
        "--before",
        metavar="SRC",
        help="also measure the package found in SRC (PYTHONPATH; e.g. "
        "`git archive <commit> src | tar -x -C /tmp/before`, then /tmp/before/src), interleaved",
    )
    ap.add_argument(
        "--after",
        metavar="SRC",
        help="with --before: the package in SRC instead of the installed one",
    )
    a = ap.parse_args(argv)
    if a.importtime:
        print(importtime(a.importtime, preload=a.preload))
        return
    variants = {"now": {}}
    if a.before:
        variants = {
            "before": {"PYTHONPATH": a.before},
            "after": {"PYTHONPATH": a.after} if a.after else {},
        }
    res = measure(a.cases or None, a.repeat, variants, preload=a.preload)
    print(json.dumps(res, indent=1) if a.json else table(res))


if __name__ == "__main__":
    main()
