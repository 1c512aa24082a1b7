"""Accurate per-segment sums: the ``combine`` of a floating ``sum`` in the reducer protocol
(``_kernels/reducer.py``).

A single slot fed ``k`` values in order (``scatter_add_``, ``segment_reduce``, a CSR SpMV) errs
~``k * eps`` in the worst case; here each segment's run is cut into blocks of at most ``_BLOCK``
values and the block sums are summed again, in a wider accumulator (:func:`accumulator_dtype`),
so a segment's error grows as ``log(k)`` (or not at all)::

    accurate_sum(v, seg, S)[s] == sum(v[i] for i with seg[i] == s)   (rounded once, or better)

>>> import torch
>>> accurate_sum(torch.tensor([1., 2., 4.]), torch.tensor([1, 0, 1]), 2).tolist()
[2.0, 5.0]
"""

from __future__ import annotations

import torch

from sparsefill._kernels import engine as _engine
from sparsefill._kernels.trace import bincount
from sparsefill._kernels.grouping import pattern_cached


_ACCUMULATOR = {
    torch.float16: torch.float32,
    torch.bfloat16: torch.float32,
    torch.float32: torch.float64,
}


_BLOCK = 8  # (float64 runs: summed in blocks of at most this many, then the block sums likewise)


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a segment sum of ``dtype`` values accumulates in: float32 for the half types (as
    torch), float64 for float32 (a segment's sum is then its correctly rounded float32 sum, whatever
    its order and length), the dtype itself otherwise."""
    return _ACCUMULATOR.get(dtype, dtype)


def accurate_sum(
    values: torch.Tensor, seg, num_segments: int, *, lengths=None, csr=None
) -> torch.Tensor:
    """Per-segment sums of floating ``values`` (along dim 0), in :func:`accumulator_dtype`, at least
    as accurate as torch's own dense sum of each segment's elements::

        one segment   torch's pairwise (cascade) sum of the values (accumulating as torch does)
        many (CPU)    each segment's run cut into blocks of at most 8 values, summed in the
                      values' dtype; the block sums then summed in float64 (float32 values) or as
                      a tree of such blocks (float64; the half types in float32); unsorted ids are
                      sorted first (cached)
        other devices accumulated in the wider dtype, on the engine of ``_kernels.engine.choose``

    so a segment's error grows as ``log(k)`` (or not at all), never as ``k``: a single slot fed
    ``k`` values in order (``scatter_add_``, ``segment_reduce``, a CSR SpMV) errs ~``k * eps`` in
    the worst case: 1.7e-2 for 10M float32 values, where torch's sum errs ~1e-8.

    >>> v = torch.full((1_000_000,), 0.1)
    >>> round(
    ...     float(accurate_sum(v, None, 1, lengths=torch.tensor([1_000_000]))[0]), 1
    ... )  # (one slot: 100958.3)
    100000.0
    >>> accurate_sum(torch.tensor([1., 2., 4.]), torch.tensor([1, 0, 1]), 2).tolist()
    [2.0, 5.0]
    """
    acc = accumulator_dtype(values.dtype)
    if num_segments == 1:
        # (halves: torch accumulates in float32)
        if values.dtype != acc and values.dtype != torch.float32:
            return values.sum(0, keepdim=True, dtype=acc)
        # (float32: the pairwise sum, ~6x faster than in float64)
        return values.sum(0, keepdim=True).to(acc)
    if values.device.type != "cpu" or values.is_complex():
        values = values.to(acc)
        runs, rows = lengths is not None, csr is not None and values.dim() == 1
        engine = _engine.choose(
            "sum",
            values.dtype,
            runs=runs,
            csr_rows=rows,
            compiled=rows and csr.compiled,
            one_dim=values.dim() == 1,
        )
        return _engine.run(engine, "sum", values, seg, num_segments, 0, lengths=lengths, csr=csr)
    # unsorted ids: each into its own block of 8
    if values.dtype == torch.float32 and lengths is None:
        slot, nb, total = pattern_cached(
            "sum_slots", (seg,), lambda: _block_slots(seg, num_segments)
        )
        part = values.new_zeros((total, *values.shape[1:]))
        part = (
            part.index_add_(0, slot, values)
            if values.dim() > 1
            else part.scatter_add_(0, slot, values)
        )
        values, lengths = (
            part,
            nb,
        )  # (a gather into segment order instead: 20x slower, random reads)
    elif lengths is None:
        order, lengths = pattern_cached(
            "sum_order", (seg,), lambda: _sort_segments(seg, num_segments)
        )
        values = values.index_select(0, order)
    else:
        nb = None
    # (the half types: in float32, their accumulator; float64 as it is)
    if values.dtype != torch.float32:
        return _blocked_runs_sum(values.to(acc), lengths)
    if nb is not None:  # (the block sums of unsorted ids: summed per segment in float64)
        return torch.segment_reduce(values.to(acc), "sum", lengths=lengths, unsafe=True)
    if values.dim() != 1 or values.requires_grad:
        blocks, nb = _blocks(lengths)
        # (<= 8 values each, in float32)
        part = torch.segment_reduce(values, "sum", lengths=blocks, unsafe=True)
        return torch.segment_reduce(part.to(acc), "sum", lengths=nb, unsafe=True)
    return _block_sums_mv(values, lengths)


def _block_sums_mv(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Run sums of 1-D float32 ``values`` in float64 (blocks of at most 8 summed in float32): both
    levels by torch's CSR SpMV (``_kernels.engine``'s ``csr_mv``; ~5x faster than ``segment_reduce``
    over many short runs, and no float64 copy of the values: a fresh 8 MB allocation costs more than
    the sums here)."""
    blocks, nb = _blocks(lengths)
    outer = pattern_cached("sum_block_rows", (lengths,), lambda: _unit_rows(nb, blocks.numel()))
    inner = pattern_cached("sum_block_rows", (blocks,), lambda: _unit_rows(blocks, values.shape[0]))
    part = _engine.run("csr_mv", "sum", values, None, blocks.numel(), 0, csr=inner)
    return _engine.run("csr_mv", "sum", part.to(torch.float64), None, nb.numel(), 0, csr=outer)


def _unit_rows(lengths: torch.Tensor, k: int):
    """:class:`_kernels.engine.CsrRows` of a CSR matrix of one column whose rows hold runs of
    ``lengths`` (``k`` in all): its SpMV with a one is the run sums."""
    crow = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths, 0, out=crow[1:])
    col = _zero_columns(k, lengths.device)
    return _engine.CsrRows(
        crow, col, 1, None, False, (crow.to(torch.int32), col) if k < 2**31 else None
    )


_ZEROS: dict = {}


def _zero_columns(k: int, device) -> torch.Tensor:
    """``k`` int32 zeros (column indices of a one-column matrix): a view of one shared, read-only
    buffer per device, grown as needed (no k-sized allocation per call)."""
    buf = _ZEROS.get(device)
    if buf is None or buf.numel() < k:
        buf = _ZEROS[device] = torch.zeros(
            max(k, 2 * (0 if buf is None else buf.numel())), dtype=torch.int32, device=device
        )
    return buf[:k]


def _block_slots(seg, num_segments):
    """``(slot, nb, total)``: element ``i`` goes to block ``slot[i]``, the ``r // 8``-th block of
    its segment (``r``: its rank there, in order); segment ``s`` owns ``nb[s]`` consecutive blocks
    (at least one), in segment order, ``total`` in all."""
    order, lengths = _sort_segments(seg, num_segments)
    starts = torch.cumsum(lengths, 0) - lengths
    rank = torch.empty_like(seg)
    rank[order] = torch.arange(seg.numel(), device=seg.device) - starts.index_select(
        0, seg.index_select(0, order)
    )
    nb = torch.div(lengths + (_BLOCK - 1), _BLOCK, rounding_mode="floor").clamp_min(1)
    first = torch.cumsum(nb, 0) - nb
    slot = first.index_select(0, seg) + torch.div(rank, _BLOCK, rounding_mode="floor")
    return slot, nb, int(nb.sum())


def _sort_segments(seg, num_segments):
    """``(order, lengths)``: a stable permutation grouping elements by segment id, and the run
    lengths."""
    return torch.sort(seg, stable=True).indices, bincount(seg, num_segments)


def _blocks(lengths: torch.Tensor):
    """``(blocks, nb)``: runs of ``lengths`` cut into ``nb[s]`` blocks of at most ``_BLOCK`` (the
    last partial; an empty run one empty block), in order; cached with ``lengths``."""

    def cut():
        nb = torch.div(lengths + (_BLOCK - 1), _BLOCK, rounding_mode="floor").clamp_min(1)
        blocks = torch.full((int(nb.sum()),), _BLOCK, dtype=lengths.dtype, device=lengths.device)
        # (each run's last, partial block)
        blocks[torch.cumsum(nb, 0) - 1] = lengths - _BLOCK * (nb - 1)
        return blocks, nb

    return pattern_cached("sum_blocks", (lengths,), cut)


def _blocked_runs_sum(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Sums of the contiguous runs of ``lengths`` as a tree of blocks of at most ``_BLOCK`` values
    (``segment_reduce`` over the blocks, then over the block sums, ...): the error of a run of ``k``
    grows as ``log(k)`` instead of ``k``."""
    while lengths.numel() and int(lengths.max()) > _BLOCK:
        blocks, nb = _blocks(lengths)
        values = torch.segment_reduce(values, "sum", lengths=blocks, unsafe=True)
        lengths = nb
    return torch.segment_reduce(values, "sum", lengths=lengths, unsafe=True)
