"""``A @ X`` forward + backward (gradients of values, fill and X) against gather + ``index_add_`` by hand.

    python tools/bench_backward_mm.py            # N=5k/50k stored and N=50k/500k stored, D=32, 1 thread

Each (implementation, size) runs in a fresh subprocess: after a step on a tiny problem (lazy imports), the
peak resident memory of one step above the peak after set-up (``ru_maxrss``), then the median time of
``--reps`` steps.  ``sparsefill COO unrouted`` is the path before the route (torch's formula, N=5k only).
sparsefill builds ``A`` from ``(values, fill)`` each step (as in training) with fill 0 and ``fill.requires_grad``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

SIZES = {
    "N=5k, 50k stored, D=32": (5000, 50000, 32),
    "N=50k, 500k stored, D=32": (50000, 500000, 32),
}


def _inputs(n, nse, d):
    import torch

    g = torch.Generator().manual_seed(0)
    keys = torch.randint(n * n, (nse + nse // 8,), generator=g).unique()[:nse]
    keys = keys[torch.randperm(keys.numel(), generator=g)].sort().values
    rows, cols = keys // n, keys % n
    return rows, cols, torch.randn(keys.numel(), generator=g), torch.randn(n, d, generator=g)


def _step_fn(impl, n, nse, d):
    import torch
    import sparsefill

    rows, cols, v0, X0 = _inputs(n, nse, d)
    v, X = v0.clone().requires_grad_(), X0.clone().requires_grad_()
    f = torch.tensor(0.0, requires_grad=True)
    idx = torch.stack([rows, cols])
    W = torch.randn(n, d, generator=torch.Generator().manual_seed(1))

    def ours():
        A = sparsefill.sparse_coo_tensor(idx, v, (n, n), fill_value=f, is_coalesced=True)
        ((A @ X) * W).sum().backward()

    def ours_csr():
        A = sparsefill.sparse_coo_tensor(
            idx, v, (n, n), fill_value=f, is_coalesced=True
        ).to_sparse_csr()
        ((A @ X) * W).sum().backward()

    def hand():
        out = torch.zeros(n, d).index_add_(0, rows, v[:, None] * X[cols])
        (out * W).sum().backward()

    def unrouted():  # the path before the route (torch's formula: the dense G @ X^T)
        from sparsefill import SparseTensor

        SparseTensor._route = lambda *a: NotImplemented
        ours()

    def dense():
        A = torch.zeros(n, n).index_put_((rows, cols), v)
        ((A @ X) * W).sum().backward()

    fn = {
        "sparsefill COO": ours,
        "sparsefill CSR": ours_csr,
        "gather + index_add_": hand,
        "dense": dense,
        "sparsefill COO unrouted": unrouted,
    }[impl]

    def step():
        v.grad = X.grad = f.grad = None
        fn()

    return step


def _child(impl, size, reps):
    import torch

    torch.set_num_threads(1)
    _step_fn(impl, 100, 500, 32)()  # lazy imports and first-call set-up, outside the measured peak
    step = _step_fn(impl, *SIZES[size])
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    print(json.dumps({"ms": statistics.median(times) * 1e3, "peak_mb": peak / 1024}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--child", nargs=2)
    p.add_argument(
        "--impls",
        default="sparsefill COO,sparsefill CSR,gather + index_add_,sparsefill COO unrouted",
    )
    a = p.parse_args()
    if a.child:
        return _child(*a.child, a.reps)
    for size in SIZES:
        for impl in a.impls.split(","):
            if impl == "sparsefill COO unrouted" and SIZES[size][0] > 5000:
                continue  # the dense N x N gradient: 10 GB at N=50k
            r = subprocess.run(
                [sys.executable, __file__, "--child", impl, size, "--reps", str(a.reps)],
                capture_output=True,
                text=True,
            )
            res = (
                json.loads(r.stdout)
                if r.returncode == 0
                else {"error": r.stderr.strip().splitlines()[-1:]}
            )
            print(f"{size:28s} {impl:22s} {res}", flush=True)


if __name__ == "__main__":
    main()
