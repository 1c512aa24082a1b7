"""Scale-out measurements: several processes on loopback gloo, so not a harness case (the
harness times one process); run ``python -m sparsefill.benchmarks.cases_distributed [--quick]``.

1. **all_reduce bytes and time** of a ``(rows, cols)`` float32 SparseTensor at 0.1%, 1%, 10%, 30%
   stored (a different random pattern per rank, fill 0): bytes each rank sends
   (``sparsefill.distributed.traffic``, headers included) against a dense ring all-reduce (``2
   (W-1)/W * numel * 4``) and torch's native sparse COO all-reduce on gloo (an all-gather of sizes,
   indices and values: ``(W-1) * nnz * (8 * 2 + 4)``); time per call of sparsefill
   (``algorithm='sparse'`` and ``'auto'``), the dense all-reduce of ``A.to_dense()`` and torch's
   sparse COO all-reduce, at 2 and 4 processes.
2. **Row-sharded embedding step** (forward, backward, ``SparseAdagrad`` step) of a ``N x D`` table
   on a global batch of bags, at world sizes 1, 2 and 4 (each rank ``1/W`` of the bags), against one
   process with the unsharded table (``segment.sparse_lengths_sum(..., sparse_grad=True)``); bytes
   moved per step.

Interleaved: every round times each implementation in turn (median of ``reps`` calls after a
barrier); rank 0 reports the median of the rounds.  One thread per process.  On a 2-core machine W
processes share the cores: these figures show the exchange's overhead and bytes, not a speedup.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sparsefill.benchmarks.measure import interleaved

DENSITIES = (0.001, 0.01, 0.1, 0.3)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, fn, args, q):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=300),
    )
    try:
        out = fn(rank, world, *args)
        if rank == 0:
            q.put(out)
    finally:
        dist.destroy_process_group()


def run(fn, world, *args):
    """``fn(rank, world, *args)`` in ``world`` processes; rank 0's return value."""
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.start_processes(
        _entry, args=(world, _port(), fn, args, q), nprocs=world, start_method="spawn"
    )
    return q.get()


def _interleaved(impls, rounds, reps):
    """Seconds per call, every rank starting each call together (a barrier, untimed)."""
    return interleaved(impls, rounds, reps, before=dist.barrier)


# ---------------------------------------------------------------------- 1. all_reduce
def _all_reduce(rank, world, shape, rounds, reps):
    import sparsefill
    import sparsefill.distributed as sd

    rows, cols = shape
    out = []
    for density in DENSITIES:
        g = torch.Generator().manual_seed(rank * 1000 + int(density * 1e6))
        nse = max(1, int(rows * cols * density))
        keys = torch.randperm(rows * cols, generator=g)[:nse].sort().values
        idx = torch.stack([keys // cols, keys % cols])
        vals = torch.randn(nse, generator=g)
        A = sparsefill.sparse_coo_tensor(idx, vals, shape, fill_value=0.0)
        D = A.to_dense()
        nat = torch.sparse_coo_tensor(idx, vals, shape, check_invariants=False).coalesce()
        sd.traffic.reset()
        sd.all_reduce(A.clone(), algorithm="sparse")
        sparse_bytes = sd.traffic.sent
        sd.traffic.reset()
        sd.all_reduce(A.clone(), algorithm="auto")
        auto_bytes = sd.traffic.sent
        nnz = torch.tensor([nse])
        dist.all_reduce(nnz, op=dist.ReduceOp.MAX)
        impls = {
            "sparsefill sparse": lambda: sd.all_reduce(A.clone(), algorithm="sparse"),
            "sparsefill auto": lambda: sd.all_reduce(A.clone(), algorithm="auto"),
            "dense all_reduce": lambda: dist.all_reduce(D.clone()),
            "torch sparse COO": lambda: dist.all_reduce(nat.clone()),
        }
        t = _interleaved(impls, rounds, reps)
        out.append(
            dict(
                density=density,
                nse=nse,
                sparse_bytes=sparse_bytes,
                auto_bytes=auto_bytes,
                dense_bytes=2 * (world - 1) * rows * cols * 4 // world,
                native_bytes=(world - 1) * int(nnz) * (8 * 2 + 4),
                times=t,
                load=os.getloadavg()[0],
            )
        )
    return out


# ---------------------------------------------------------------------- 2. sharded embedding step
def _bags(n_bags, N, mean_len, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 2 * mean_len + 1, (n_bags,), generator=g)
    return (
        torch.randint(0, N, (int(lengths.sum()),), generator=g),
        lengths,
        torch.randn(n_bags, generator=g),
    )


def _sharded(rank, world, N, D, bags, mean_len, rounds, reps, pool="requester"):
    import sparsefill.distributed as sd
    from sparsefill import segment

    table = torch.randn(N, D, generator=torch.Generator().manual_seed(1))
    v = torch.randn(D, generator=torch.Generator().manual_seed(2))
    ids, lengths, y = _bags(bags, N, mean_len)
    B = bags // world
    at = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    mine = (
        ids[int(at[rank * B]) : int(at[(rank + 1) * B])],
        lengths[rank * B : (rank + 1) * B],
        y[rank * B : (rank + 1) * B],
    )
    emb = sd.RowShardedEmbeddingBag.from_pretrained(table, pool=pool)
    opt = segment.SparseAdagrad([emb.weight], lr=0.01)

    def step():
        opt.zero_grad()
        (emb(mine[0], lengths=mine[1]) @ v - mine[2]).square().mean().backward()
        opt.step()

    sd.traffic.reset()
    step()
    moved = sd.traffic.sent
    impls = {"sharded": step}
    t = _interleaved(impls, rounds, reps)
    return dict(world=world, time=t["sharded"], bytes=moved, load=os.getloadavg()[0])


def _unsharded(N, D, bags, mean_len, rounds, reps):
    from sparsefill import segment

    torch.set_num_threads(1)
    table = torch.nn.Parameter(torch.randn(N, D, generator=torch.Generator().manual_seed(1)))
    v = torch.randn(D, generator=torch.Generator().manual_seed(2))
    ids, lengths, y = _bags(bags, N, mean_len)
    opt = segment.SparseAdagrad([table], lr=0.01)

    def step():
        opt.zero_grad()
        (
            segment.sparse_lengths_sum(table, ids, lengths, sparse_grad=True) @ v - y
        ).square().mean().backward()
        opt.step()

    step()
    ts = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(reps):
            step()
        ts.append((time.perf_counter() - t) / reps)
    return statistics.median(ts)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller tensors, fewer rounds")
    p.add_argument("--only", choices=["all_reduce", "sharded"], help="one of the two parts")
    p.add_argument(
        "--worlds", default="2,4", help="world sizes of the all_reduce part (default 2,4)"
    )
    a = p.parse_args(argv)
    shape = (500, 500) if a.quick else (1000, 1000)
    rounds, reps = (3, 3) if a.quick else (5, 5)
    print(
        f"# sparsefill.distributed on loopback gloo, {os.cpu_count()} cores, torch "
        f"{torch.__version__}\n"
    )
    if a.only != "sharded":
        _print_all_reduce(shape, rounds, reps, [int(w) for w in a.worlds.split(",")])
    if a.only != "all_reduce":
        _print_sharded(a.quick, rounds, reps)


def _print_all_reduce(shape, rounds, reps, worlds=(2, 4)):
    print(
        f"## all_reduce (SUM) of a {shape[0]} x {shape[1]} float32 SparseTensor, fill 0 "
        f"(dense: {shape[0] * shape[1] * 4 / 1e6:.1f} MB)\n"
    )
    print(
        "| W | stored | bytes sent/rank: sparse | auto | dense ring | torch sparse COO | time: "
        "sparse | auto | dense | torch sparse COO | sparse / dense | load |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    cross = []
    for W in worlds:
        rs = run(_all_reduce, W, shape, rounds, reps)
        # bytes per element
        per = (rs[-1]["sparse_bytes"] - rs[0]["sparse_bytes"]) / (rs[-1]["nse"] - rs[0]["nse"])
        cross.append(f"W={W}: {rs[0]['dense_bytes'] / per / (shape[0] * shape[1]):.1%} stored")
        for r in rs:
            t = r["times"]
            print(
                f"| {W} | {r['density']:.1%} | {r['sparse_bytes']:,} | {r['auto_bytes']:,} | "
                f"{r['dense_bytes']:,} | {r['native_bytes']:,} | "
                f"{t['sparsefill sparse'] * 1e3:.2f} ms | {t['sparsefill auto'] * 1e3:.2f} ms | "
                f"{t['dense all_reduce'] * 1e3:.2f} ms | {t['torch sparse COO'] * 1e3:.2f} ms | "
                f"{t['sparsefill sparse'] / t['dense all_reduce']:.2f} | {r['load']:.1f} |"
            )
    from sparsefill.distributed._collectives import DENSE_BYTES_RATIO

    print(
        "\nbyte crossover (the sparse payload per rank equals the dense ring's): "
        f"{', '.join(cross)}; 'auto' turns dense at {DENSE_BYTES_RATIO} of it"
    )


def _print_sharded(quick, rounds, reps):
    N, D, bags, mean_len = (20_000, 32, 256, 10) if quick else (100_000, 64, 1024, 20)
    print(
        f"\n## Row-sharded embedding step: {N:,} x {D} table, {bags} bags of ~{mean_len} ids "
        "(global batch), forward + backward + SparseAdagrad\n"
    )
    base = _unsharded(N, D, bags, mean_len, rounds, reps)
    print(f"unsharded, one process: {base * 1e3:.2f} ms per step\n")
    print("| W | pooled at | per-rank step | / unsharded | bytes sent per rank per step | load |")
    print("|---|---|---|---|---|---|")
    for W in (1, 2, 4):
        for pool in ("requester", "owner"):
            r = run(_sharded, W, N, D, bags, mean_len, rounds, reps, pool)
            print(
                f"| {W} | {pool} | {r['time'] * 1e3:.2f} ms | {r['time'] / base:.2f} | "
                f"{r['bytes']:,} | {r['load']:.1f} |"
            )


if __name__ == "__main__":
    main()
