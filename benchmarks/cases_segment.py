"""Segment reductions (issue 6): ``sparsefill.segment.reduce`` against the torch code a user would write.

Inputs (seed 0): ``N`` rows (about 1,000,000) of float32 data with ``D`` in {1, 16, 64} columns, in
``S = N / 20`` segments of lengths ``1 + Poisson(19)`` (no empty segment, so every peer's empty
convention agrees).  Fused forms gather from a table of ``N / 4`` rows with uniform random indices.
Unsorted forms shuffle the segment ids (the order within a segment is kept irrelevant: sums and
max/min do not depend on it).

Peers: ``embedding_bag`` (offsets; indices ``arange(N)`` precomputed for the unfused forms),
``torch.segment_reduce`` (lengths), ``index_add_`` / ``scatter_reduce_`` (segment ids), and for the
unsorted forms ``argsort`` + ``embedding_bag`` / ``segment_reduce``.  ``torch_scatter`` is a peer when
installed (it is not here: skipped).

Measured here (2 shared vCPUs, AMD EPYC, torch 2.13.0+cpu, numba 0.68.1 installed; copy bandwidth
14.3 GB/s at 1 thread during the run) with ``python benchmarks/run.py --filter segment --threads 1,2
--rounds 3 --min-run-time 0.4 --retry-noisy 0.6`` at commit 2f61766.  Other sessions kept 1-1.3 cores
of the 2 busy throughout, so the 2-thread rows of that run measure the contention, not the code
(embedding_bag itself ran 3x slower at 2 threads than at 1), and are not quoted.  Time ratio
sparsefill / peer at 1 thread (< 1: sparsefill is faster):

| case (1 thread, N = 1M)                  | D=1               | D=16              | D=64              |
|------------------------------------------|-------------------|-------------------|-------------------|
| sum, lengths / embedding_bag             | 1.11              | 1.09              | 1.02 (12.4 GB/s)  |
| mean, lengths / embedding_bag            | 0.93              | 1.16              | 1.01              |
| weighted_sum, lengths / embedding_bag    | 1.13              | 1.07              | 1.02              |
| sum, fused gather / embedding_bag        | 1.07              | 1.36 (+-32%)      | 1.25 (+-15%)      |
| mean, fused gather / embedding_bag       | 1.06              | 1.03              | 0.96              |
| weighted_sum, fused / embedding_bag      | 1.00              | 1.01              | 1.05              |
| max, lengths / fastest peer              | 0.97 (seg_reduce) | 0.44 (scatter_r.) | 0.42 (scatter_r.; 22 GB/s) |
| min, lengths / fastest peer              | 1.71 (seg_reduce, +-50%) | 0.49 (scatter_r.) | 0.54 (scatter_r.) |
| sum, unsorted ids / fastest peer         | 1.05 (index_add_) | 0.29 (argsort+EB) | 0.56 (argsort+EB) |
| max, unsorted ids / fastest peer         | 0.32 (scatter_r.) | 0.25 (scatter_r.) | 0.51 (scatter_r.) |

Sums run on ``embedding_bag`` itself, so they sit at parity up to noise (what is left at D=1 is
about 0.1-0.2 ms of per-call work: the lengths check and cumsum, one 400 kB offsets allocation).
Max/min over sorted segments are one read of the data by a compiled kernel, 1.9-2.4x faster than
``scatter_reduce_`` and 8-10x faster than ``segment_reduce`` at D=64.  Unsorted ids are reduced in
place (no sort): 1.8x faster than the fastest peer for sums and 2x for max at D=64.

2 threads on this contended machine: OpenMP worker threads spin after a parallel region
(libgomp's default wait policy) and take the core the main thread needs, so every
implementation, torch's included, ran slower at 2 threads than at 1 -- sparsefill's parallel max
kernel most (about 6x).  With ``OMP_WAIT_POLICY=passive`` the 2-thread times equal the 1-thread
ones; on a quiet machine the sorted max/min kernels split the segments over the threads.
"""

from __future__ import annotations

import os
import types

import torch
import torch.nn.functional as F

from sparsefill import segment

from .runner import Bench, case, optional_import, skipped

# SPARSEFILL_BENCH_SEGMENT_D=64 (comma-separated) restricts the full-size runs to those D
_DIMS = [int(d) for d in os.environ.get("SPARSEFILL_BENCH_SEGMENT_D", "1,16,64").split(",")]
SIZES = {f"N=1M D={d}": (1_000_000, d) for d in _DIMS}
QUICK = {f"N=200k D={d}": (200_000, d) for d in (1, 64)}
TINY = {"N=2000 D=3": (2_000, 3)}


def _batch(n: int, d: int):
    """The common inputs: ``x`` (N, d), ``lengths`` / ``offsets`` / sorted ``ids`` of ``S`` segments, the
    generator ``g`` for what a case adds, and ``N``, ``S``, ``d``."""
    g = torch.Generator().manual_seed(0)
    S = max(1, n // 20)
    lengths = 1 + torch.poisson(torch.full((S,), 19.0), generator=g).long()
    N = int(lengths.sum())
    x = torch.randn(N, d, generator=g)
    offsets = torch.zeros(S + 1, dtype=torch.long)
    torch.cumsum(lengths, 0, out=offsets[1:])
    ids = torch.repeat_interleave(torch.arange(S), lengths)
    return types.SimpleNamespace(x=x, lengths=lengths, offsets=offsets, ids=ids, g=g, N=N, S=S, d=d)


def _builder(make):
    """A case body ``make(reducer, batch)`` as the runner's ``build(param)`` for one reducer."""
    return lambda reducer: (lambda param: make(reducer, _batch(*param)))


def _bytes(n, d, extra_per_row=8):
    S = max(1, n // 20)
    return n * d * 4 + S * d * 4 + n * extra_per_row


def _check_all_close(param, out):
    ref = next(iter(out.values()))
    ref = ref[0] if isinstance(ref, tuple) else ref
    for label, o in out.items():
        o = o[0] if isinstance(o, tuple) else o
        torch.testing.assert_close(o.reshape(ref.shape), ref, rtol=1e-4, atol=1e-4, msg=lambda m: f"{label}: {m}")


def _torch_scatter_peer(fn_name, label):
    ts = optional_import("torch_scatter")
    if ts is None:
        return None, skipped(label, "not installed (pip install torch-scatter)")
    return getattr(ts, fn_name), None


@_builder
def _sum_family(reducer, b):
    x, lengths, offsets, ids, g, N, S, d = b.x, b.lengths, b.offsets, b.ids, b.g, b.N, b.S, b.d
    ar = torch.arange(N)
    w = torch.rand(N, generator=g) if reducer == "weighted_sum" else None
    mode = "mean" if reducer == "mean" else "sum"
    impls = [("sparsefill", lambda: segment.reduce(x, reducer, lengths=lengths, weights=w)),
             ("embedding_bag", lambda: F.embedding_bag(ar, x, offsets, mode=mode, per_sample_weights=w,
                                                       include_last_offset=True))]
    if w is None:
        impls.append(("segment_reduce", lambda: torch.segment_reduce(x, mode, lengths=lengths, axis=0)))
    if reducer == "mean":
        cnt = lengths[:, None].to(x.dtype)
        impls.append(("index_add_", lambda: x.new_zeros(S, d).index_add_(0, ids, x) / cnt))
    elif w is None:
        impls.append(("index_add_", lambda: x.new_zeros(S, d).index_add_(0, ids, x)))
    else:
        impls.append(("index_add_", lambda: x.new_zeros(S, d).index_add_(0, ids, x * w[:, None])))
    seg_csr, skip = _torch_scatter_peer("segment_csr", "torch_scatter.segment_csr")
    xw = (lambda: x) if w is None else (lambda: x * w[:, None])
    impls.append(skip or ("torch_scatter.segment_csr", lambda: seg_csr(xw(), offsets, reduce=mode)))
    return Bench(impls, bytes=_bytes(N, d, 8 if w is None else 12))


@_builder
def _fused(reducer, b):
    x, lengths, offsets, ids, g, N, S, d = b.x, b.lengths, b.offsets, b.ids, b.g, b.N, b.S, b.d
    table = torch.randn(max(1, N // 4), d, generator=g)
    idx = torch.randint(0, table.shape[0], (N,), generator=g)
    w = torch.rand(N, generator=g) if reducer == "weighted_sum" else None
    mode = "mean" if reducer == "mean" else "sum"
    impls = [("sparsefill", lambda: segment.reduce(table, reducer, lengths=lengths, indices=idx, weights=w)),
             ("embedding_bag", lambda: F.embedding_bag(idx, table, offsets, mode=mode, per_sample_weights=w,
                                                       include_last_offset=True))]
    if w is None and mode == "sum":
        impls.append(("index_select + index_add_",
                      lambda: table.new_zeros(S, d).index_add_(0, ids, table.index_select(0, idx))))
    return Bench(impls, bytes=_bytes(N, d, 16 if w is None else 20))


@_builder
def _extreme(reducer, b):
    x, lengths, offsets, ids, g, N, S, d = b.x, b.lengths, b.offsets, b.ids, b.g, b.N, b.S, b.d
    amode = "amax" if reducer == "max" else "amin"
    idx2 = ids[:, None].expand(N, d)
    impls = [("sparsefill", lambda: segment.reduce(x, reducer, lengths=lengths)),
             ("segment_reduce", lambda: torch.segment_reduce(x, reducer, lengths=lengths, axis=0)),
             ("scatter_reduce_", lambda: x.new_empty(S, d).scatter_reduce_(0, idx2, x, amode,
                                                                            include_self=False))]
    if reducer == "max":
        ar = torch.arange(N)
        impls.append(("embedding_bag", lambda: F.embedding_bag(ar, x, offsets, mode="max",
                                                               include_last_offset=True)))
    seg, skip = _torch_scatter_peer("segment_csr", "torch_scatter.segment_csr")
    impls.append(skip or ("torch_scatter.segment_csr", lambda: seg(x, offsets, reduce=reducer)))
    return Bench(impls, bytes=_bytes(N, d, 8))


@_builder
def _unsorted(reducer, b):
    x, lengths, offsets, ids, g, N, S, d = b.x, b.lengths, b.offsets, b.ids, b.g, b.N, b.S, b.d
    perm = torch.randperm(N, generator=g)
    xs, us = x[perm].contiguous(), ids[perm].contiguous()
    impls = [("sparsefill", lambda: segment.reduce(xs, reducer, segment_ids=us, num_segments=S, sorted=False))]

    def sort_then(fn):  # the peer that sorts the ids first (offsets from the counts, as a user would)
        def run():
            order = torch.sort(us, stable=True).indices
            offs = torch.zeros(S + 1, dtype=torch.long)
            torch.cumsum(torch.bincount(us, minlength=S), 0, out=offs[1:])
            return fn(order, offs)
        return run
    if reducer in ("sum", "mean"):
        cnt = lengths[:, None].to(x.dtype)
        impls.append(("index_add_", (lambda: xs.new_zeros(S, d).index_add_(0, us, xs)) if reducer == "sum" else
                      (lambda: xs.new_zeros(S, d).index_add_(0, us, xs) / cnt)))
        impls.append(("argsort + embedding_bag", sort_then(lambda o, offs: F.embedding_bag(
            o, xs, offs, mode=reducer, include_last_offset=True))))
    else:
        amode = "amax" if reducer == "max" else "amin"
        idx2 = us[:, None].expand(N, d)
        impls.append(("scatter_reduce_", lambda: xs.new_empty(S, d).scatter_reduce_(0, idx2, xs, amode,
                                                                                      include_self=False)))
        if reducer == "max":
            impls.append(("argsort + embedding_bag", sort_then(lambda o, offs: F.embedding_bag(
                o, xs, offs, mode="max", include_last_offset=True))))
        impls.append(("argsort + segment_reduce", sort_then(lambda o, offs: torch.segment_reduce(
            xs.index_select(0, o), reducer, offsets=offs, axis=0))))
    sc, skip = _torch_scatter_peer("scatter", "torch_scatter.scatter")
    impls.append(skip or ("torch_scatter.scatter", lambda: sc(xs, us, 0, dim_size=S, reduce=reducer)))
    return Bench(impls, bytes=_bytes(N, d, 8))


for _name, _build in [("segment sum (lengths)", _sum_family("sum")),
                      ("segment mean (lengths)", _sum_family("mean")),
                      ("segment weighted_sum (lengths)", _sum_family("weighted_sum")),
                      ("segment sum, fused gather (sparse_lengths_sum)", _fused("sum")),
                      ("segment mean, fused gather (sparse_lengths_mean)", _fused("mean")),
                      ("segment weighted_sum, fused gather (sparse_lengths_weighted_sum)", _fused("weighted_sum")),
                      ("segment max (lengths)", _extreme("max")),
                      ("segment min (lengths)", _extreme("min")),
                      ("segment sum, unsorted ids (unsorted_segment_sum)", _unsorted("sum")),
                      ("segment mean, unsorted ids (unsorted_segment_mean)", _unsorted("mean")),
                      ("segment max, unsorted ids (unsorted_segment_max)", _unsorted("max")),
                      ("segment min, unsorted ids (unsorted_segment_min)", _unsorted("min"))]:
    case(_name, sizes=SIZES, quick_sizes=QUICK, tiny_sizes=TINY, check=_check_all_close)(_build)
