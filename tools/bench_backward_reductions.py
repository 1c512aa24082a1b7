"""Reductions' forward + backward on a 10M-element signal with 10k stored, against dense torch.

    python tools/bench_backward_reductions.py                     # sparsefill and dense, 1 thread, medians
    python tools/bench_backward_reductions.py --before /tmp/before/src   # also the sparsefill at another source tree

The signal ``s`` is built each step from leaves ``(values, fill)`` (10k stored, fill 5, COO) and each case's
loss is back-propagated to both; dense torch runs the same case on a dense 10M leaf.  Each implementation
runs in its own subprocess (``--before``: ``PYTHONPATH`` set to that tree, e.g. a ``git worktree`` of an
earlier commit); times are medians of ``--reps`` steps after one warm-up step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

N, NSE, FILL = 10_000_000, 10_000, 5.0

CASES = {
    "(s * 1.).sum()": lambda s, torch: (s * 1.0).sum(),
    "exp(-0.1 * s).mean()": lambda s, torch: torch.exp(-0.1 * s).mean(),
    "exp(s).sum()": lambda s, torch: torch.exp(s * 0.1).sum(),
    "exp(s).mean()": lambda s, torch: torch.exp(s * 0.1).mean(),
    "logsumexp(s, 0)": lambda s, torch: torch.logsumexp(s, 0),
    "s.norm()": lambda s, torch: s.norm(),
    "s.square().sum()": lambda s, torch: s.square().sum(),
    "s.amax()": lambda s, torch: s.amax(),
    "s.var()": lambda s, torch: s.var(),
    "s[:100].sum()": lambda s, torch: s[:100].sum(),
}


def _child(impl, reps):
    import torch

    torch.set_num_threads(1)
    import sparsefill

    g = torch.Generator().manual_seed(0)
    idx = torch.randperm(N, generator=g)[:NSE].sort().values[None]
    v = torch.randn(NSE, generator=g, dtype=torch.float64).requires_grad_()
    f = torch.tensor(FILL, dtype=torch.float64, requires_grad=True)
    x = (
        torch.full((N,), FILL, dtype=torch.float64)
        .index_put_((idx[0],), v.detach())
        .requires_grad_()
    )
    out = {}
    for name, fn in CASES.items():
        if impl == "dense":

            def step():
                x.grad = None
                fn(x, torch).backward()
        else:

            def step():
                v.grad = f.grad = None
                s = sparsefill.sparse_coo_tensor(idx, v, (N,), fill_value=f, is_coalesced=True)
                fn(s, torch).backward()

        step()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times) * 1e3
    print(json.dumps(out))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument(
        "--before", help="source tree of the sparsefill to compare with (e.g. a git worktree's src)"
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        return _child(a.child, a.reps)
    runs = [("dense torch", "dense", None), ("sparsefill", "sparsefill", None)]
    if a.before:
        runs.insert(1, ("sparsefill before", "sparsefill", a.before))
    res = {}
    for label, impl, path in runs:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if path:
            env["PYTHONPATH"] = path
        r = subprocess.run(
            [sys.executable, __file__, "--child", impl, "--reps", str(a.reps)],
            env=env,
            capture_output=True,
            text=True,
        )
        if r.returncode:
            sys.exit(f"{label} failed:\n{r.stderr}")
        res[label] = json.loads(r.stdout.strip().splitlines()[-1])
    print(
        f"forward + backward, N={N:,}, {NSE:,} stored, fill {FILL}, float64, 1 thread, median of {a.reps} (ms)"
    )
    labels = list(res)
    print(f"{'case':24s}" + "".join(f"{lab:>20s}" for lab in labels))
    for name in CASES:
        print(f"{name:24s}" + "".join(f"{res[lab][name]:20.2f}" for lab in labels))


if __name__ == "__main__":
    main()
