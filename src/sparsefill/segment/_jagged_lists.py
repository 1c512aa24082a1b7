"""The (key, example) lists of a keyed jagged batch: every entry's ids placed at the slot of its
key and example (:func:`_slots`), read in slot order (:func:`_positions`) or one tensor per wanted
key (:func:`key_lists`: ``KeyedJaggedBatch._by_key`` and the custom op
``sparsefill::jagged_key_lists``).
"""

from __future__ import annotations

import torch

from sparsefill._kernels import segment as _kernels


def _seg_of(lengths: torch.Tensor, n: int) -> torch.Tensor:
    return torch.repeat_interleave(
        torch.arange(lengths.numel(), device=lengths.device), lengths, output_size=n
    )


def _slots(values_lengths, keys, example_lengths, wanted: list[int]):
    """``(offsets, starts, lengths)`` of the lists of ``wanted`` keys placed by (key, example):
    every entry's list at its slot ``j * B + e`` (its length and start in ``values`` there; an entry
    of another key goes to the discarded slot ``K * B``, an absent (key, example) is an empty list);
    ``offsets`` (``K * B + 1``) the running sum of the lengths of the ``K * B`` slots."""
    K, B, E = len(wanted), example_lengths.shape[0], keys.shape[0]
    dev = keys.device
    KB = K * B
    lengths = torch.zeros(KB + 1, dtype=torch.int64, device=dev)
    starts = torch.zeros(KB + 1, dtype=torch.int64, device=dev)
    if K and E:
        srt, perm = torch.sort(torch.tensor(wanted, dtype=torch.int64, device=dev))
        at = torch.searchsorted(srt, keys).clamp_max_(K - 1)
        slot = perm.index_select(0, at).mul_(B).add_(_seg_of(example_lengths, E))
        slot.masked_fill_(srt.index_select(0, at) != keys, KB)  # (another key: the discarded slot)
        # (the discarded slot gets any one of its entries)
        lengths.index_copy_(0, slot, values_lengths)
        starts.index_copy_(0, slot, torch.cumsum(values_lengths, 0).sub_(values_lengths))
    offsets = torch.zeros(KB + 1, dtype=torch.int64, device=dev)
    torch.cumsum(lengths[:KB], 0, out=offsets[1:])
    return offsets, starts, lengths


def _positions(offsets, starts, lengths, n: int):
    """The position in ``values`` of every id of the slots, in slot order (``n = offsets[-1]`` of
    them)."""
    KB = offsets.shape[0] - 1
    return torch.arange(n, device=offsets.device).add_(
        torch.repeat_interleave(starts[:KB] - offsets[:-1], lengths[:KB], output_size=n)
    )


def key_lists(values, values_lengths, keys, example_lengths, wanted: list[int]):
    """``(offsets, lists)``: the offsets of ``KeyedJaggedBatch._by_key`` and, per wanted key ``j``,
    its entries of ``values`` (1-D) example by example (``_by_key``'s ids ``[offsets[j *
    B]:offsets[(j + 1) * B]]``), each its own tensor (one compiled copy per list on the compiled
    segment backend, else a gather)."""
    offsets, starts, lengths = _slots(values_lengths, keys, example_lengths, wanted)
    B = example_lengths.shape[0]
    bounds = offsets[::B].tolist() if B else [0] * (len(wanted) + 1)
    nb = (
        values.dim() == 1
        and values.is_contiguous()
        and _kernels.compiled_for(values.device, bounds[-1])
    )
    out = []
    for j, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        slots = slice(j * B, (j + 1) * B)
        offs = offsets[slots] - lo
        if nb:
            part = values.new_empty(hi - lo)
            _kernels._nb().gather_runs(
                values.numpy(),
                starts[slots].numpy(),
                lengths[slots].numpy(),
                offs.numpy(),
                part.numpy(),
            )
        else:
            part = values.index_select(
                0,
                torch.arange(hi - lo, device=values.device).add_(
                    torch.repeat_interleave(
                        starts[slots] - offs, lengths[slots], output_size=hi - lo
                    )
                ),
            )
        out.append(part)
    return offsets, out
