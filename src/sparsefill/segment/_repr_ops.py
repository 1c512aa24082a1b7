"""The segment conversions (``_repr``) and ``KeyedJaggedBatch``'s checks as ``torch.library`` custom
ops: what torch.compile records for them.

Their results' sizes (``sum(lengths)`` ids, ``max(segment_ids) + 1`` lengths) and their checks (a
negative length, an id out of range) read the data: under torch.compile (``_compile.traced``) the
public functions call these ops, whose real implementation is the eager function (its checks run at
run time and raise the eager errors) and whose fake implementation gives the sizes from the input
sizes, or a dynamic size (``_compile.new_dynamic_size()``: also without ``fullgraph``) where the
data decide it::

    sparsefill::lengths_to_segment_ids(lengths, validate)
        == segment.lengths_to_segment_ids   (N: dynamic)
    sparsefill::segment_ids_to_lengths(ids, num_segments, sorted, validate)
        (S: num_segments, else dynamic)
    sparsefill::lengths_to_offsets(lengths, include_last, validate)
    sparsefill::offsets_to_lengths(offsets, total, validate)
    sparsefill::lengths_to_weights(lengths, power, dtype, validate)              (N: dynamic)
    sparsefill::lengths_range_fill(lengths, validate)                           (N: dynamic)
    sparsefill::lengths_gather_rows(lengths, indices, n, validate)
        the rows of items lengths_gather reads
    sparsefill::gather_ranges_rows(ranges, n, validate)         the rows of data gather_ranges reads
    sparsefill::lengths_max_range(lengths)                    arange(max(lengths)): the padded width
    sparsefill::jagged_check(example_lengths, values_lengths, keys, total)
        KeyedJaggedBatch's data checks

The differentiable conversions (``lengths_tile``, ``lengths_gather``, ``gather_ranges``) gather
their data with ``index_select`` at the rows these ops give (autograd as usual).  Every op is
registered *effectful* (``torch.library._register_effectful_op``, ordered): never removed as dead
code, so a compiled call with bad input raises even where its result is unused.  Registered on the
first import (by the first traced call).

>>> import torch
>>> torch.ops.sparsefill.lengths_to_segment_ids(torch.tensor([2, 0, 1]), True)
tensor([0, 0, 2])
"""

from __future__ import annotations

import torch
from torch._library.effects import EffectType
from torch.library import custom_op

from sparsefill._kernels.trace import new_dynamic_size
from sparsefill.segment import _repr

__all__ = [
    "lengths_to_segment_ids",
    "segment_ids_to_lengths",
    "lengths_to_offsets",
    "offsets_to_lengths",
    "lengths_to_weights",
    "lengths_range_fill",
    "lengths_gather_rows",
    "gather_ranges_rows",
    "jagged_check",
]


def _dynamic():
    # (also where dynamo compiles without fullgraph: _compile.new_dynamic_size)
    return new_dynamic_size()


def _effectful(op):
    """``op`` kept in the graph and in program order (its checks must run: no dead-code
    elimination)."""
    torch.library._register_effectful_op(op._qualname, EffectType.ORDERED)
    return op


@custom_op("sparsefill::lengths_to_segment_ids", mutates_args=())
def lengths_to_segment_ids(lengths: torch.Tensor, validate: bool) -> torch.Tensor:
    return _repr.lengths_to_segment_ids(lengths, validate=validate)


@lengths_to_segment_ids.register_fake
def _(lengths, validate):
    return lengths.new_empty(_dynamic())


@custom_op("sparsefill::segment_ids_to_lengths", mutates_args=())
def segment_ids_to_lengths(
    segment_ids: torch.Tensor, num_segments: int | None, sorted: bool, validate: bool
) -> torch.Tensor:
    return _repr.segment_ids_to_lengths(segment_ids, num_segments, sorted=sorted, validate=validate)


@segment_ids_to_lengths.register_fake
def _(segment_ids, num_segments, sorted, validate):
    return segment_ids.new_empty(_dynamic() if num_segments is None else num_segments)


@custom_op("sparsefill::lengths_to_offsets", mutates_args=())
def lengths_to_offsets(lengths: torch.Tensor, include_last: bool, validate: bool) -> torch.Tensor:
    return _repr.lengths_to_offsets(lengths, include_last=include_last, validate=validate)


@lengths_to_offsets.register_fake
def _(lengths, include_last, validate):
    return lengths.new_empty(lengths.shape[0] + int(include_last))


@custom_op("sparsefill::offsets_to_lengths", mutates_args=())
def offsets_to_lengths(offsets: torch.Tensor, total: int | None, validate: bool) -> torch.Tensor:
    return _repr.offsets_to_lengths(offsets, total, validate=validate)


@offsets_to_lengths.register_fake
def _(offsets, total, validate):
    return offsets.new_empty(offsets.shape[0] - int(total is None))


@custom_op("sparsefill::lengths_to_weights", mutates_args=())
def lengths_to_weights(
    lengths: torch.Tensor, power: float, dtype: torch.dtype, validate: bool
) -> torch.Tensor:
    return _repr.lengths_to_weights(lengths, power, dtype=dtype, validate=validate)


@lengths_to_weights.register_fake
def _(lengths, power, dtype, validate):
    return lengths.new_empty(_dynamic(), dtype=dtype)


@custom_op("sparsefill::lengths_range_fill", mutates_args=())
def lengths_range_fill(lengths: torch.Tensor, validate: bool) -> torch.Tensor:
    return _repr.lengths_range_fill(lengths, validate=validate)


@lengths_range_fill.register_fake
def _(lengths, validate):
    return lengths.new_empty(_dynamic())


@custom_op("sparsefill::lengths_gather_rows", mutates_args=())
def lengths_gather_rows(
    lengths: torch.Tensor, indices: torch.Tensor, n: int, validate: bool
) -> torch.Tensor:
    """The rows (int64) of ``n`` items that ``lengths_gather`` reads, after its checks."""
    return _repr.lengths_gather_rows(lengths, indices, n, validate)


@lengths_gather_rows.register_fake
def _(lengths, indices, n, validate):
    return lengths.new_empty(_dynamic(), dtype=torch.int64)


@custom_op("sparsefill::gather_ranges_rows", mutates_args=())
def gather_ranges_rows(ranges: torch.Tensor, n: int, validate: bool) -> torch.Tensor:
    """The rows (int64) of data with ``n`` rows that ``gather_ranges`` reads, after its checks."""
    return _repr.gather_ranges_rows(ranges, n, validate)


@gather_ranges_rows.register_fake
def _(ranges, n, validate):
    return ranges.new_empty(_dynamic(), dtype=torch.int64)


@custom_op("sparsefill::lengths_max_range", mutates_args=())
def lengths_max_range(lengths: torch.Tensor) -> torch.Tensor:
    """``arange(max(lengths))`` (int64; empty for no lengths): its size, the longest segment, is the
    width of a padded layout, a dynamic size read from no host value (``int(lengths.max())`` is a
    graph break without ``fullgraph``)."""
    return torch.arange(int(lengths.max()) if lengths.numel() else 0, device=lengths.device)


@lengths_max_range.register_fake
def _(lengths):
    return lengths.new_empty(_dynamic(), dtype=torch.int64)


@custom_op("sparsefill::jagged_check", mutates_args=())
def jagged_check(
    example_lengths: torch.Tensor, values_lengths: torch.Tensor, keys: torch.Tensor, total: int
) -> None:
    """``KeyedJaggedBatch``'s data checks (its errors) for a batch of ``total`` values."""
    from sparsefill.segment._jagged import KeyedJaggedBatch

    # (the count of values only)
    stub = torch.zeros(1, dtype=torch.int64, device=keys.device).expand(total)
    KeyedJaggedBatch(stub, values_lengths, keys, example_lengths)


@jagged_check.register_fake
def _(example_lengths, values_lengths, keys, total):
    return None


for _op in (
    lengths_to_segment_ids,
    segment_ids_to_lengths,
    lengths_to_offsets,
    offsets_to_lengths,
    lengths_to_weights,
    lengths_range_fill,
    lengths_gather_rows,
    gather_ranges_rows,
    jagged_check,
):
    _effectful(_op)
