"""Conversions between the segment representations of a batch (Caffe2's utility ops).

A batch of ``S`` segments over ``N`` rows is written as any of::

    lengths      (S,)    lengths[s] = number of rows of segment s             sum(lengths) == N
    offsets      (S+1,)  offsets[s] = lengths[:s].sum()             offsets[0] == 0, offsets[S] == N
    segment_ids  (N,)    segment_ids[i] = the segment of row i (sorted: non-decreasing)
    ranges       (S, 2)  ranges[s] = (offsets[s], lengths[s])
    padded       (S, L, *D) with a presence mask (see pack_segments)

Integer outputs keep the dtype of the integer input (int32 stays int32).  ``validate=False`` skips
the O(N) checks (negative lengths, ids out of range); the O(1) ones always run.  Under torch.compile
the parts that read the data (sizes such as ``sum(lengths)``, the checks) are custom ops
(``_repr_ops``): they trace with ``fullgraph=True`` and raise the eager errors at run time.

Example (the spec's batch ``{1,2,3}, {2,4,6,7}, {3,6}``)::

    >>> import torch
    >>> from sparsefill import segment
    >>> lengths = torch.tensor([3, 4, 2])
    >>> segment.lengths_to_segment_ids(lengths)
    tensor([0, 0, 0, 1, 1, 1, 1, 2, 2])
    >>> segment.lengths_to_offsets(lengths)
    tensor([0, 3, 7, 9])
    >>> segment.lengths_range_fill(lengths)
    tensor([0, 1, 2, 0, 1, 2, 3, 0, 1])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sparsefill._kernels.trace import traced
from sparsefill._kernels.segment_check import (
    IndexLike,
    as_index,
    check_indices,
    check_lengths,
    check_offsets,
    check_segment_ids,
)

__all__ = [
    "lengths_to_segment_ids",
    "segment_ids_to_lengths",
    "lengths_to_offsets",
    "offsets_to_lengths",
    "lengths_to_ranges",
    "segment_ids_to_ranges",
    "lengths_to_weights",
    "lengths_range_fill",
    "lengths_tile",
    "lengths_gather",
    "gather_ranges",
    "segment_ids_to_offsets",
]


def _i64(t):
    return t if t.dtype == torch.int64 else t.long()


def _ops():
    """The custom ops of the conversions (registered on the first traced call)."""
    from sparsefill.segment import _repr_ops

    return _repr_ops


def lengths_to_segment_ids(lengths: IndexLike, *, validate: bool = True) -> torch.Tensor:
    """``segment_ids[i] = s`` for ``offsets[s] <= i < offsets[s+1]`` (Caffe2
    ``LengthsToSegmentIds``).

    >>> lengths_to_segment_ids(torch.tensor([1, 0, 2]))
    tensor([0, 2, 2])
    """
    lengths = as_index(lengths, "lengths")
    if traced(lengths):
        return _ops().lengths_to_segment_ids(lengths, validate)
    check_lengths(lengths, None, validate=validate)
    ids = torch.repeat_interleave(
        torch.arange(lengths.numel(), device=lengths.device), _i64(lengths)
    )
    return ids.to(lengths.dtype)


def segment_ids_to_lengths(
    segment_ids: IndexLike,
    num_segments: int | None = None,
    *,
    sorted: bool = True,
    validate: bool = True,
) -> torch.Tensor:
    """``lengths[s] = #{i : segment_ids[i] == s}`` for ``s < num_segments`` (Caffe2
    ``SegmentIdsToLengths``).

    Gaps give zero lengths; ``num_segments`` defaults to ``max(segment_ids) + 1`` (0 for no ids) and
    may exceed it (trailing empty segments).  With ``sorted=True`` (the Caffe2 rule) the ids must
    not decrease; ``sorted=False`` counts unsorted ids as well.

    >>> segment_ids_to_lengths(torch.tensor([0, 0, 2]), num_segments=4)
    tensor([2, 0, 1, 0])
    """
    ids = as_index(segment_ids, "segment_ids")
    if traced(ids):
        return _ops().segment_ids_to_lengths(ids, num_segments, sorted, validate)
    check_segment_ids(ids, num_segments, sorted=sorted, validate=validate)
    if num_segments is None:
        num_segments = int(ids.max()) + 1 if ids.numel() else 0
    if ids.numel() == 0:
        return torch.zeros(num_segments, dtype=ids.dtype, device=ids.device)
    return torch.bincount(_i64(ids), minlength=num_segments).to(ids.dtype)


def lengths_to_offsets(
    lengths: IndexLike, *, include_last: bool = True, validate: bool = True
) -> torch.Tensor:
    """``offsets[s] = lengths[:s].sum()`` for ``s = 0..S`` (CSR ``crow_indices``; ``S + 1``
    entries).

    ``include_last=False`` drops ``offsets[S]`` (Caffe2 ``LengthsToOffsets``' default output).

    >>> lengths_to_offsets(torch.tensor([3, 4, 2]), include_last=False)
    tensor([0, 3, 7])
    """
    lengths = as_index(lengths, "lengths")
    if traced(lengths):
        return _ops().lengths_to_offsets(lengths, include_last, validate)
    check_lengths(lengths, None, validate=validate)
    out = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths, 0, out=out[1:])
    out = out if include_last else out[:-1]
    if lengths.dtype == torch.int32 and out.numel() and int(out[-1]) > torch.iinfo(torch.int32).max:
        raise ValueError(
            f"int32 lengths give an offset of {int(out[-1])}, past the int32 range; "
            "pass int64 lengths"
        )
    return out.to(lengths.dtype)


def offsets_to_lengths(
    offsets: IndexLike, total: int | None = None, *, validate: bool = True
) -> torch.Tensor:
    """``lengths[s] = offsets[s+1] - offsets[s]``.

    ``offsets`` holds ``S + 1`` entries (``offsets[S] = N``); given ``total = N`` it may hold the
    ``S`` start offsets only (Caffe2's form), and then ``N`` is appended.

    >>> offsets_to_lengths(torch.tensor([0, 3, 7, 9]))
    tensor([3, 4, 2])
    >>> offsets_to_lengths(torch.tensor([0, 3, 7]), total=9)
    tensor([3, 4, 2])
    """
    offsets = as_index(offsets, "offsets")
    if traced(offsets):
        if offsets.shape[0] == 0 and total is None:  # (the eager error; a size, not data)
            check_offsets(offsets, None)
        return _ops().offsets_to_lengths(offsets, total, validate)
    if total is not None:
        if offsets.numel() and int(offsets[-1]) > total:
            raise ValueError(f"offsets end at {int(offsets[-1])}, beyond total = {total}")
        offsets = torch.cat([offsets, offsets.new_tensor([total])])
    check_offsets(offsets, total, validate=validate)
    return offsets.diff()


def segment_ids_to_offsets(
    segment_ids: IndexLike, num_segments: int | None = None, *, validate: bool = True
) -> torch.Tensor:
    """Offsets (``S + 1`` entries) of sorted segment ids; gaps give empty segments."""
    return lengths_to_offsets(
        segment_ids_to_lengths(segment_ids, num_segments, validate=validate), validate=False
    )


def lengths_to_ranges(lengths: IndexLike, *, validate: bool = True) -> torch.Tensor:
    """``ranges[s] = (offsets[s], lengths[s])``, shape ``(S, 2)`` (Caffe2 ``LengthsToRanges``).

    >>> lengths_to_ranges(torch.tensor([3, 0, 2]))
    tensor([[0, 3],
            [3, 0],
            [3, 2]])
    """
    lengths = as_index(lengths, "lengths")
    starts = lengths_to_offsets(lengths, include_last=False, validate=validate)
    return torch.stack([starts, lengths], 1)


def segment_ids_to_ranges(
    segment_ids: IndexLike, num_segments: int | None = None, *, validate: bool = True
) -> torch.Tensor:
    """``ranges[s] = (first row of segment s, its length)`` for sorted ids (Caffe2
    ``SegmentIdsToRanges``).

    An empty segment (a gap) starts where the next one does; trailing empty segments
    (``num_segments`` past the last id, which Caffe2's op has no argument for) start at ``N``.

    >>> segment_ids_to_ranges(torch.tensor([0, 0, 2]))
    tensor([[0, 2],
            [2, 0],
            [2, 1]])
    """
    return lengths_to_ranges(
        segment_ids_to_lengths(segment_ids, num_segments, validate=validate), validate=False
    )


def lengths_to_weights(
    lengths: IndexLike,
    power: float = 0.5,
    *,
    dtype: torch.dtype | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """``weights[i] = lengths[s] ** -power`` for every row ``i`` of segment ``s`` (Caffe2
    ``LengthsToWeights``; its default ``power = 0.5`` makes a weighted sum the ``sqrt_n``
    reduction).

    >>> lengths_to_weights(torch.tensor([4, 1]))
    tensor([0.5000, 0.5000, 0.5000, 0.5000, 1.0000])
    """
    lengths = as_index(lengths, "lengths")
    dtype = dtype or torch.get_default_dtype()
    if traced(lengths):
        return _ops().lengths_to_weights(lengths, float(power), dtype, validate)
    check_lengths(lengths, None, validate=validate)
    w = lengths.to(dtype).pow(-power)
    return torch.repeat_interleave(w, _i64(lengths))


def lengths_range_fill(lengths: IndexLike, *, validate: bool = True) -> torch.Tensor:
    """``out[i] = i - offsets[s]``: the position of row ``i`` within its segment (Caffe2
    ``LengthsRangeFill``).

    >>> lengths_range_fill(torch.tensor([1, 3, 0, 2]))
    tensor([0, 0, 1, 2, 0, 1])
    """
    lengths = as_index(lengths, "lengths")
    if traced(lengths):
        return _ops().lengths_range_fill(lengths, validate)
    check_lengths(lengths, None, validate=validate)
    li = _i64(lengths)
    starts = torch.cumsum(li, 0) - li
    n = int(li.sum()) if li.numel() else 0
    pos = torch.arange(n, device=li.device) - torch.repeat_interleave(starts, li, output_size=n)
    return pos.to(lengths.dtype)


def lengths_tile(data: torch.Tensor, lengths: IndexLike, *, validate: bool = True) -> torch.Tensor:
    """Row ``s`` of ``data`` repeated ``lengths[s]`` times (Caffe2 ``LengthsTile``); differentiable.

    ``out[i] = data[segment_ids[i]]``.

    >>> lengths_tile(torch.tensor([[1., 2.], [3., 4.]]), torch.tensor([2, 1]))
    tensor([[1., 2.],
            [1., 2.],
            [3., 4.]])
    """
    lengths = as_index(lengths, "lengths", data.device)
    if data.dim() == 0 or data.shape[0] != lengths.numel():
        raise ValueError(
            f"lengths must have one entry per row of data: data has "
            f"{data.shape[0] if data.dim() else 'no'} rows, lengths has {lengths.numel()} entries"
        )
    if traced(lengths):  # (out[i] = data[segment_ids[i]]: a gather, differentiable)
        return data.index_select(0, _ops().lengths_to_segment_ids(lengths, validate))
    check_lengths(lengths, None, validate=validate)
    return torch.repeat_interleave(data, _i64(lengths), dim=0)


def _gather_rows(starts: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """The concatenation of ``arange(starts[j], starts[j] + lens[j])`` over ``j`` (int64)."""
    n = int(lens.sum()) if lens.numel() else 0
    out_starts = torch.cumsum(lens, 0) - lens
    return torch.arange(n, device=lens.device) + torch.repeat_interleave(
        starts - out_starts, lens, output_size=n
    )


def lengths_gather(
    items: torch.Tensor, lengths: IndexLike, indices: IndexLike, *, validate: bool = True
) -> torch.Tensor:
    """The segments ``indices[0], indices[1], ...`` of ``items`` concatenated (Caffe2
    ``LengthsGather``).

    The output has ``lengths[indices].sum()`` rows; its lengths are ``lengths[indices]``.
    Differentiable.

    >>> lengths_gather(
    ...     torch.tensor([1, 2, 3, 2, 4, 6, 7, 3, 6]), torch.tensor([3, 4, 2]), torch.tensor([2, 0])
    ... )
    tensor([3, 6, 1, 2, 3])
    """
    lengths = as_index(lengths, "lengths", items.device)
    indices = as_index(indices, "indices", items.device)
    n = items.shape[0] if items.dim() else 0
    rows = (_ops().lengths_gather_rows if traced(items) else lengths_gather_rows)(
        lengths, indices, n, validate
    )
    return items.index_select(0, rows)


def lengths_gather_rows(
    lengths: torch.Tensor, indices: torch.Tensor, n: int, validate: bool = True
):
    """The rows (int64) of ``n`` items that :func:`lengths_gather` reads, after its checks."""
    check_lengths(lengths, n, validate=validate)
    check_indices(indices, lengths.numel(), validate=validate, what="segments")
    li = _i64(lengths)
    starts = torch.cumsum(li, 0) - li
    idx = _i64(indices)
    return _gather_rows(starts[idx], li[idx])


def gather_ranges(
    data: torch.Tensor, ranges: torch.Tensor | Sequence[Sequence[int]], *, validate: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate ``data[start:start + length]`` over ``ranges`` (shape ``(B, R, 2)``; Caffe2
    ``GatherRanges``).

    Returns ``(output, lengths)`` with ``lengths[b] = ranges[b, :, 1].sum()``. Differentiable in
    ``data``.

    >>> data = torch.tensor([1, 2, 3, 4, 5, 6])
    >>> gather_ranges(data, torch.tensor([[[0, 2], [4, 1]], [[1, 3], [0, 0]]]))
    (tensor([1, 2, 5, 2, 3, 4]), tensor([3, 3]))
    """
    ranges = (
        ranges if isinstance(ranges, torch.Tensor) else torch.as_tensor(ranges, dtype=torch.int64)
    )
    if ranges.dtype.is_floating_point or ranges.dtype == torch.bool:
        raise TypeError(f"ranges must be an integer tensor, got dtype {ranges.dtype}")
    if ranges.dim() != 3 or ranges.shape[-1] != 2:
        raise ValueError(
            f"ranges must have shape (batch, num_ranges, 2), got {tuple(ranges.shape)}"
        )
    ranges = ranges.to(data.device)
    n = data.shape[0] if data.dim() else 0
    rows = (_ops().gather_ranges_rows if traced(data) else gather_ranges_rows)(ranges, n, validate)
    return data.index_select(0, rows), ranges[..., 1].sum(1).to(ranges.dtype)


def gather_ranges_rows(ranges: torch.Tensor, n: int, validate: bool = True) -> torch.Tensor:
    """The rows (int64) of data with ``n`` rows that :func:`gather_ranges` reads (``ranges``: ``(B,
    R, 2)``), after its checks."""
    r = _i64(ranges).reshape(-1, 2)
    starts, lens = r[:, 0], r[:, 1]
    if validate and r.numel():
        bad = (starts < 0) | (lens < 0) | (starts + lens > n)
        if bool(bad.any()):
            j = int(bad.nonzero()[0, 0])
            b, k = divmod(j, ranges.shape[1])
            raise IndexError(
                f"ranges[{b}, {k}] = (start {int(starts[j])}, length {int(lens[j])}) is out of "
                f"bounds for data with {n} rows"
            )
    return _gather_rows(starts, lens)
