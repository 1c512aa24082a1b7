"""Segment reductions (issue 6): ``sparsefill.segment.reduce`` against the torch code a user would write.

Inputs (seed 0): ``N`` rows (about 1,000,000) of float32 data with ``D`` in {1, 16, 64} columns
(``SPARSEFILL_BENCH_SEGMENT_D=64`` restricts the full-size runs), in ``S = N / 20`` segments of
lengths ``1 + Poisson(19)`` (no empty segment, so every peer's empty convention agrees).  Fused forms
gather from a table of ``N / 4`` rows with uniform random indices.  Unsorted forms shuffle the rows
and their segment ids.

Peers: ``embedding_bag`` (offsets; indices ``arange(N)`` precomputed for the unfused forms),
``torch.segment_reduce`` (lengths), ``index_add_`` / ``scatter_reduce_`` (segment ids),
``torch_scatter`` (``segment_csr`` / ``scatter``) when it imports, and for the unsorted forms the
sort-first compositions ``argsort + embedding_bag`` / ``argsort + segment_reduce`` (a stable sort of
the ids, offsets from their counts, then the sorted op): ``embedding_bag`` and ``segment_reduce``
need sorted segments, so this is how a user applies them to unsorted ids.  ``torch_scatter`` has no
wheel for this torch on PyPI; it was built from its sdist (``pip wheel torch-scatter==2.1.2``, 20 min
on one core) into a separate folder put on ``PYTHONPATH`` for the run, not installed in the venv.

Measured 11:05-11:37 UTC at commit 69c45e7 (sources as at f35a3a8) with
``SPARSEFILL_BENCH_SEGMENT_D=64 PYTHONPATH=<torch_scatter> python -m sparsefill bench --filter
segment --threads 1,2 --rounds 5 --min-run-time 0.3 --retry-noisy 0.3`` (the max/min and unsorted
rows again with ``--filter "segment max"`` etc. once the machine was quiet); 2 shared vCPUs, AMD
EPYC (Zen 4), torch 2.13.0+cpu, numba 0.68.1; copy bandwidth 24 GB/s at 1 thread, 33-47 GB/s at 2.
Time ratio sparsefill / peer at D = 64 (< 1: sparsefill is faster); ``other`` = cores other
processes kept busy during the row (all rows below: <= 0.5 for the sums, 0.0-0.16 for the rest):

| case (N = 1M, D = 64)            | 1 thread                                  | 2 threads                                  |
|----------------------------------|-------------------------------------------|--------------------------------------------|
| sum, lengths / embedding_bag      | 1.04 (17.3 ms, 16 GB/s)                   | 1.02 (9.8 ms, 28 GB/s)                     |
| mean, lengths / embedding_bag     | 1.02                                      | 1.04                                       |
| weighted_sum, lengths / EB        | 1.01                                      | 1.04                                       |
| sum, fused gather / EB            | 0.97 (23.3 ms)                            | 1.05 (10.7 ms)                             |
| mean, fused gather / EB           | 1.01                                      | 1.02                                       |
| weighted_sum, fused gather / EB   | 1.02                                      | 1.02                                       |
| max, lengths / scatter_reduce_    | **0.55** (14.3 ms, 19 GB/s)               | **0.61** (10.0 ms, 28 GB/s)                |
| min, lengths / scatter_reduce_    | **0.53** (12.4 ms, 22 GB/s)               | **0.63** (10.0 ms, 28 GB/s)                |
| sum, unsorted / index_add_        | 0.25 (20.8 ms, 13 GB/s)                   | 0.40 (13.9 ms, 20 GB/s)                    |
| sum, unsorted / argsort + EB      | 0.42                                      | **0.52**                                   |
| mean, unsorted / index_add_       | 0.27 (22.4 ms)                            | 0.47 (16.6 ms)                             |
| mean, unsorted / argsort + EB     | 0.33                                      | **0.52**                                   |
| max, unsorted / scatter_reduce_   | 0.24 (20.4 ms)                            | 0.40 (18.1 ms)                             |
| min, unsorted / scatter_reduce_   | 0.26 (22.5 ms)                            | 0.37 (16.3 ms)                             |

Bold: short of the issue's 2x target.  ``segment_reduce``, ``embedding_bag(mode="max")`` and
``torch_scatter`` are 5-40x slower than sparsefill for max/min; ``torch_scatter.scatter`` runs the
unsorted sum at the speed of ``index_add_``.

Sums run on ``embedding_bag`` itself: parity up to noise.  Max/min over sorted segments are one read
of the data by a compiled kernel (a segment's rows in pairs), at 19-28 GB/s, about 90% of the copy
bandwidth: 1.6-1.9x faster than ``scatter_reduce_``, short of the 2x target (``scatter_reduce_``
itself moves 11-17 GB/s here; 2x would need the kernel at the copy bandwidth or above).  Unsorted
ids are reduced in place, with no sort: 2.4-4x faster than the fastest peer at 1 thread, 2.1-2.7x
at 2 threads against ``index_add_`` / ``scatter_reduce_`` / ``torch_scatter``, 1.9x against the
sort-first ``argsort + embedding_bag``.  At 2 threads the compiled kernels split the work over
Python threads (sorted: ranges of segments; unsorted: position ranges into partial tables, then
merged); on this shared machine a 2-thread row is only meaningful when ``other`` is near 0.
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


def _offsets_of(lengths):
    """What a caller holding lengths does before ``embedding_bag``: the offsets, every call."""
    offs = torch.zeros(lengths.numel() + 1, dtype=torch.long)
    torch.cumsum(lengths, 0, out=offs[1:])
    return offs


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
                                                       include_last_offset=True)),
             ("cumsum + embedding_bag", lambda: F.embedding_bag(ar, x, _offsets_of(lengths), mode=mode,
                                                                per_sample_weights=w, include_last_offset=True))]
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
                                                       include_last_offset=True)),
             ("cumsum + embedding_bag", lambda: F.embedding_bag(idx, table, _offsets_of(lengths), mode=mode,
                                                                per_sample_weights=w, include_last_offset=True))]
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
