"""Segment reductions: ``sparsefill.segment.reduce`` against the torch code a user would
write.

Inputs (seed 0): ``N`` rows (about 1,000,000) of float32 data with ``D`` in {1, 16, 64} columns
(``SPARSEFILL_BENCH_SEGMENT_D=64`` restricts the full-size runs), in ``S = N / 20`` segments of
lengths ``1 + Poisson(19)`` (no empty segment, so every peer's empty convention agrees).  Fused
forms gather from a table of ``N / 4`` rows with uniform random indices.  Unsorted forms shuffle the
rows and their segment ids.

Peers: ``embedding_bag`` (offsets; indices ``arange(N)`` precomputed for the unfused forms),
``torch.segment_reduce`` (lengths), ``index_add_`` / ``scatter_reduce_`` (segment ids),
``torch_scatter`` (``segment_csr`` / ``scatter``) when it imports, and for the unsorted forms the
sort-first compositions ``argsort + embedding_bag`` / ``argsort + segment_reduce`` (a stable sort of
the ids, offsets from their counts, then the sorted op): ``embedding_bag`` and ``segment_reduce``
need sorted segments, so this is how a user applies them to unsorted ids.  ``torch_scatter`` has no
wheel for this torch on PyPI; it was built from its sdist (``pip wheel torch-scatter==2.1.2``, 20
min on one core) into a separate folder put on ``PYTHONPATH`` for the run, not installed in the
venv.

Recorded results and their reading: the "Segment reductions" section of this folder's
``README.md``.
"""

from __future__ import annotations

import os
import types

import torch
import torch.nn.functional as F

from sparsefill import segment
from sparsefill._kernels import segment as segment_kernels

from sparsefill.benchmarks.runner import Bench, case, optional_import, skipped

# SPARSEFILL_BENCH_SEGMENT_D=64 (comma-separated) restricts the full-size runs to those D
_DIMS = [int(d) for d in os.environ.get("SPARSEFILL_BENCH_SEGMENT_D", "1,16,64").split(",")]
SIZES = {f"N=1M D={d}": (1_000_000, d) for d in _DIMS}
QUICK = {f"N=200k D={d}": (200_000, d) for d in (1, 64)}
TINY = {"N=2000 D=3": (2_000, 3)}


def _batch(n: int, d: int):
    """The common inputs: ``x`` (N, d), ``lengths`` / ``offsets`` / sorted ``ids`` of ``S``
    segments, the generator ``g`` for what a case adds, and ``N``, ``S``, ``d``.  The compiled
    kernels are selected here, when a case is built (the default backend "auto" would import numba
    inside a timed round)."""
    if segment.compiled_available() and segment_kernels.backend() == "auto":
        segment.set_backend("numba")
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
    return lambda reducer: lambda param: make(reducer, _batch(*param))


def _bytes(n, d, extra_per_row=8):
    S = max(1, n // 20)
    return n * d * 4 + S * d * 4 + n * extra_per_row


def _check_all_close(param, out):
    ref = next(iter(out.values()))
    ref = ref[0] if isinstance(ref, tuple) else ref
    for label, o in out.items():
        o = o[0] if isinstance(o, tuple) else o
        torch.testing.assert_close(
            o.reshape(ref.shape), ref, rtol=1e-4, atol=1e-4, msg=lambda m: f"{label}: {m}"
        )


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
    impls = [
        ("sparsefill", lambda: segment.reduce(x, reducer, lengths=lengths, weights=w)),
        (
            "embedding_bag",
            lambda: F.embedding_bag(
                ar, x, offsets, mode=mode, per_sample_weights=w, include_last_offset=True
            ),
        ),
        (
            "cumsum + embedding_bag",
            lambda: F.embedding_bag(
                ar,
                x,
                _offsets_of(lengths),
                mode=mode,
                per_sample_weights=w,
                include_last_offset=True,
            ),
        ),
    ]
    if w is None:
        impls.append(
            ("segment_reduce", lambda: torch.segment_reduce(x, mode, lengths=lengths, axis=0))
        )
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
    lengths, offsets, ids, g, N, S, d = b.lengths, b.offsets, b.ids, b.g, b.N, b.S, b.d
    table = torch.randn(max(1, N // 4), d, generator=g)
    idx = torch.randint(0, table.shape[0], (N,), generator=g)
    w = torch.rand(N, generator=g) if reducer == "weighted_sum" else None
    mode = "mean" if reducer == "mean" else "sum"
    impls = [
        (
            "sparsefill",
            lambda: segment.reduce(table, reducer, lengths=lengths, indices=idx, weights=w),
        ),
        (
            "embedding_bag",
            lambda: F.embedding_bag(
                idx, table, offsets, mode=mode, per_sample_weights=w, include_last_offset=True
            ),
        ),
        (
            "cumsum + embedding_bag",
            lambda: F.embedding_bag(
                idx,
                table,
                _offsets_of(lengths),
                mode=mode,
                per_sample_weights=w,
                include_last_offset=True,
            ),
        ),
    ]
    if w is None and mode == "sum":
        impls.append(
            (
                "index_select + index_add_",
                lambda: table.new_zeros(S, d).index_add_(0, ids, table.index_select(0, idx)),
            )
        )
    return Bench(impls, bytes=_bytes(N, d, 16 if w is None else 20))


@_builder
def _extreme(reducer, b):
    x, lengths, offsets, ids, N, S, d = b.x, b.lengths, b.offsets, b.ids, b.N, b.S, b.d
    amode = "amax" if reducer == "max" else "amin"
    idx2 = ids[:, None].expand(N, d)
    impls = [
        ("sparsefill", lambda: segment.reduce(x, reducer, lengths=lengths)),
        ("segment_reduce", lambda: torch.segment_reduce(x, reducer, lengths=lengths, axis=0)),
        (
            "scatter_reduce_",
            lambda: x.new_empty(S, d).scatter_reduce_(0, idx2, x, amode, include_self=False),
        ),
    ]
    if reducer == "max":
        ar = torch.arange(N)
        impls.append(
            (
                "embedding_bag",
                lambda: F.embedding_bag(ar, x, offsets, mode="max", include_last_offset=True),
            )
        )
    seg, skip = _torch_scatter_peer("segment_csr", "torch_scatter.segment_csr")
    impls.append(skip or ("torch_scatter.segment_csr", lambda: seg(x, offsets, reduce=reducer)))
    return Bench(impls, bytes=_bytes(N, d, 8))


@_builder
def _unsorted(reducer, b):
    x, lengths, ids, g, N, S, d = b.x, b.lengths, b.ids, b.g, b.N, b.S, b.d
    perm = torch.randperm(N, generator=g)
    xs, us = x[perm].contiguous(), ids[perm].contiguous()
    impls = [
        (
            "sparsefill",
            lambda: segment.reduce(xs, reducer, segment_ids=us, num_segments=S, sorted=False),
        )
    ]

    def sort_then(
        fn,
    ):  # the peer that sorts the ids first (offsets from the counts, as a user would)
        def run():
            order = torch.sort(us, stable=True).indices
            offs = torch.zeros(S + 1, dtype=torch.long)
            torch.cumsum(torch.bincount(us, minlength=S), 0, out=offs[1:])
            return fn(order, offs)

        return run

    if reducer in ("sum", "mean"):
        cnt = lengths[:, None].to(x.dtype)
        impls.append(
            (
                "index_add_",
                (lambda: xs.new_zeros(S, d).index_add_(0, us, xs))
                if reducer == "sum"
                else (lambda: xs.new_zeros(S, d).index_add_(0, us, xs) / cnt),
            )
        )
        impls.append(
            (
                "argsort + embedding_bag",
                sort_then(
                    lambda o, offs: F.embedding_bag(
                        o, xs, offs, mode=reducer, include_last_offset=True
                    )
                ),
            )
        )
    else:
        amode = "amax" if reducer == "max" else "amin"
        idx2 = us[:, None].expand(N, d)
        impls.append(
            (
                "scatter_reduce_",
                lambda: xs.new_empty(S, d).scatter_reduce_(0, idx2, xs, amode, include_self=False),
            )
        )
        if reducer == "max":
            impls.append(
                (
                    "argsort + embedding_bag",
                    sort_then(
                        lambda o, offs: F.embedding_bag(
                            o, xs, offs, mode="max", include_last_offset=True
                        )
                    ),
                )
            )
        impls.append(
            (
                "argsort + segment_reduce",
                sort_then(
                    lambda o, offs: torch.segment_reduce(
                        xs.index_select(0, o), reducer, offsets=offs, axis=0
                    )
                ),
            )
        )
    sc, skip = _torch_scatter_peer("scatter", "torch_scatter.scatter")
    impls.append(
        skip or ("torch_scatter.scatter", lambda: sc(xs, us, 0, dim_size=S, reduce=reducer))
    )
    return Bench(impls, bytes=_bytes(N, d, 8))


for _name, _build in [
    ("segment sum (lengths)", _sum_family("sum")),
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
    ("segment min, unsorted ids (unsorted_segment_min)", _unsorted("min")),
]:
    case(_name, sizes=SIZES, quick_sizes=QUICK, tiny_sizes=TINY, check=_check_all_close)(_build)


# ---------------------------------------------------------------------------- keyed jagged batches
def _jagged(param):
    """A DLRM-style batch (``examples/dlrm.py``'s shape): ``B`` examples, ``K`` keys, lists of 0-40
    ids (0: the key is absent), ids skewed to small rows, one ``rows x D`` float32 table per key."""
    B, K, rows, D = param
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(0, 41, (B, K), generator=g)
    present = lengths.flatten() > 0
    vl = lengths.flatten()[present]
    ids = (torch.rand(int(vl.sum()), generator=g) ** 3 * rows).long()
    kj = segment.KeyedJaggedBatch(ids, vl, torch.arange(K).repeat(B)[present], (lengths > 0).sum(1))
    return kj, {k: torch.randn(rows, D, generator=g) for k in range(K)}


def _split_by_masks(kj, keys):
    """What a user writes from the flat batch: per key, a mask over the entries and one over the
    ids, the key's per-example lengths and offsets: ``{key: (ids, offsets)}``, ``embedding_bag``'s
    input."""
    key_of_id = torch.repeat_interleave(kj.keys, kj.values_lengths)
    ex = torch.repeat_interleave(torch.arange(kj.batch_size), kj.example_lengths)
    out = {}
    for k in keys:
        sel = kj.keys == k
        per_ex = torch.zeros(kj.batch_size, dtype=torch.long).index_put_(
            (ex[sel],), kj.values_lengths[sel]
        )
        offs = torch.zeros(kj.batch_size + 1, dtype=torch.long)
        torch.cumsum(per_ex, 0, out=offs[1:])
        out[k] = (kj.values[key_of_id == k], offs)
    return out


def _bags(split, tables):
    return {
        k: F.embedding_bag(i, tables[k], o, mode="sum", include_last_offset=True)
        for k, (i, o) in split.items()
    }


def _check_pooled(param, out):
    ref = out["sparsefill"]
    for label, o in out.items():
        for k in ref:
            torch.testing.assert_close(
                o[k], ref[k], rtol=1e-5, atol=1e-5, msg=lambda m: f"{label}, key {k}: {m}"
            )


@case(
    "segment: KeyedJaggedBatch.pooled sum, per-key tables",
    sizes={"batch 2048, 8 keys, 50k x 64": (2048, 8, 50_000, 64)},
    quick_sizes={"batch 512, 8 keys, 10k x 64": (512, 8, 10_000, 64)},
    tiny_sizes={"batch 32, 4 keys, 200 x 8": (32, 4, 200, 8)},
    check=_check_pooled,
)
def jagged_pooled(param):
    """``kj.pooled(tables, "sum")`` (the forward of examples/dlrm.py's lookups) against one
    ``embedding_bag`` per key on inputs split per key beforehand (``nn.EmbeddingBag``'s layout: the
    split not timed) and with the split done per key by masks in the call."""
    kj, tables = _jagged(param)
    split = _split_by_masks(kj, tables)
    return [
        ("sparsefill", lambda: kj.pooled(tables, "sum")),
        ("embedding_bag per key, inputs split beforehand", lambda: _bags(split, tables)),
        ("per-key masks + embedding_bag", lambda: _bags(_split_by_masks(kj, tables), tables)),
    ]
