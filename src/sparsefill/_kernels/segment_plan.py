"""A segmented batch in canonical form: every representation becomes offsets in segment order.

``Plan`` describes ``N`` input positions (rows of ``data``, or entries of ``indices`` for the fused
gather) grouped into ``S`` segments::

    positions of segment s (in segment order):  k = offsets[s] .. offsets[s+1] - 1
    input position of k:                          order[k]   (None: k itself, the input is sorted)
    row of data read at k:                        rows[k]    (None: k itself)

Lengths, offsets and sorted ids need no permutation (``order = None``).  Unsorted ids are kept as
they are (``plan.unsorted``): the compiled scatter kernels reduce them directly, and the segment
order is built only when something needs it (a backward, the torch path) by a stable counting sort
(compiled) or ``torch.sort(stable=True)`` -- so within a segment the input order is kept and ties
in max/min resolve to the earliest input position either way.
"""

from __future__ import annotations

import operator

import numpy as np
import torch

from sparsefill._kernels.index import flat_nonzero
from sparsefill._kernels import segment as _kernels
from sparsefill._kernels.segment_check import (
    as_index,
    check_indices,
    check_offsets,
    check_segment_ids,
    check_rows,
)

__all__ = ["Plan", "make_plan"]


class Plan:
    def __init__(
        self,
        num_segments: int,
        n: int,
        *,
        offsets=None,
        order=None,
        indices=None,
        ids=None,
        keep=None,
        counts=None,
        compiled: bool = False,
    ):
        self.num_segments = num_segments
        self.compiled = compiled  # this call runs the compiled kernels (``_kernels.compiled_for``)
        self.n = n  # input positions (before any dropped ids)
        self.indices = indices  # (n,) int64 or None: the fused gather
        self.ids = ids  # unsorted ids of the kept positions (None for sorted forms)
        self.keep = keep  # input positions kept by out_of_range="drop" (None: all)
        self._offsets, self._order = offsets, order
        self._rows = None
        self._seg = None
        self._counts = counts
        self._sorted = ids is None

    # -- unsorted ids, direct form (for the scatter kernels) -------------------------------------
    @property
    def unsorted(self) -> bool:
        return self.ids is not None

    def direct_rows(self):
        """Row of data of every kept position, in input order (None: the position itself)."""
        if self.keep is None:
            return self.indices
        return self.keep if self.indices is None else self.indices.index_select(0, self.keep)

    def direct(self, t):
        """A per-input-position tensor restricted to the kept positions."""
        return t if (t is None or self.keep is None) else t.index_select(0, self.keep)

    def direct_positions(self, p):
        """Kept positions (any shape; -1 stays -1) to input positions."""
        if self.keep is None or self.keep.numel() == 0:
            return p
        return torch.where(p >= 0, self.keep[p.clamp_min(0)], p)

    # -- segment order ---------------------------------------------------------------------------
    def _materialize(self):
        if self._sorted:
            return
        order, offs = _kernels.sort_by_segment(self.ids, self.num_segments, self.compiled)
        if self.keep is not None:
            order = self.keep.index_select(0, order)
        self._order, self._offsets, self._sorted = order, offs, True

    @property
    def offsets(self) -> torch.Tensor:
        self._materialize()
        return self._offsets

    @property
    def order(self):
        self._materialize()
        return self._order

    @property
    def rows(self):
        """Row of data read at every segment-order position (None: the position itself)."""
        if self._rows is None:
            order = self.order
            if self.indices is None:
                self._rows = order
            else:
                self._rows = self.indices if order is None else self.indices.index_select(0, order)
        return self._rows

    @property
    def seg(self) -> torch.Tensor:
        """Segment id of every segment-order position (int64)."""
        if self._seg is None:
            self._seg = _kernels.segment_ids_of(self.offsets, int(self.offsets[-1]))
        return self._seg

    @property
    def counts(self) -> torch.Tensor:
        if self._counts is None:
            if self._sorted:  # (numpy on the CPU: serial, see _check.cpu_min)
                o = self._offsets
                self._counts = (
                    torch.from_numpy(np.diff(o.numpy())) if o.device.type == "cpu" else o.diff()
                )
            else:  # (also the range check of the ids, when make_plan left it to the kernels)
                self._counts = _kernels.count_ids(self.ids, self.num_segments, self.compiled)
        return self._counts

    def fill_empty_(self, out: torch.Tensor, value) -> torch.Tensor:
        """``out`` (rows = segments) with the rows of the empty segments set to ``value``, in
        place."""
        counts = self.counts
        empty = flat_nonzero(counts == 0)
        return out.index_fill_(0, empty, value) if empty.numel() else out

    def to_segment_order(self, t: torch.Tensor | None) -> torch.Tensor | None:
        """A per-input-position tensor permuted into segment order."""
        if t is None or self.order is None:
            return t
        return t.index_select(0, self.order)

    def input_positions(self, k: torch.Tensor) -> torch.Tensor:
        """Map segment-order positions ``k`` (any shape; -1 stays -1) to input positions."""
        if self.order is None or self.order.numel() == 0:
            return k
        return torch.where(k >= 0, self.order[k.clamp_min(0)], k)


def _ids_policy(ids, num_segments, out_of_range):
    """Apply the out-of-range policy; returns (ids, keep) where keep lists the input positions kept
    (or None)."""
    if out_of_range == "error":
        return ids, None
    hi = num_segments if num_segments is not None else None
    if out_of_range == "clip":
        return ids.clamp(0, (hi - 1) if hi is not None else None), None
    keep = ids >= 0
    if hi is not None:
        keep &= ids < hi
    if bool(keep.all()):
        return ids, None
    return ids[keep], keep.nonzero().squeeze(1)


def _count_arg(v, name: str) -> int:
    """``v`` as a non-negative Python int (ints, numpy integers, 0-d integer tensors; not bools)."""
    try:
        if isinstance(v, bool) or (isinstance(v, torch.Tensor) and v.dtype == torch.bool):
            raise TypeError
        n = operator.index(v)
    except TypeError:
        raise ValueError(f"{name} must be a non-negative int, got {v!r}") from None
    if n < 0:
        raise ValueError(f"{name} must be a non-negative int, got {n}")
    return n


def make_plan(
    n_rows: int,
    device,
    *,
    lengths=None,
    offsets=None,
    segment_ids=None,
    num_segments=None,
    sorted=True,
    indices=None,
    validate=True,
    out_of_range="error",
    width: int = 1,
) -> Plan:
    """Build the Plan of one call of ``segment.reduce`` (see its docstring for the arguments;
    ``width``: the elements of a row of data, for the choice of kernels)."""
    given = [
        name
        for name, v in (("lengths", lengths), ("offsets", offsets), ("segment_ids", segment_ids))
        if v is not None
    ]
    if out_of_range not in ("error", "drop", "clip"):
        raise ValueError(f"out_of_range must be 'error', 'drop' or 'clip', got {out_of_range!r}")
    if num_segments is not None:
        num_segments = _count_arg(num_segments, "num_segments")
    if len(given) != 1:
        raise ValueError(
            "pass exactly one of lengths=, offsets=, segment_ids= "
            f"(got {', '.join(given) if given else 'none'})"
        )
    if indices is not None:
        indices = as_index(indices, "indices", device).long()
        n = indices.numel()
    else:
        n = n_rows
    # (decided once: the checks below depend on it)
    compiled = _kernels.compiled_for(device, n * width)
    # the compiled kernels check every row they read; the torch path checks here
    if indices is not None:
        check_indices(indices, n_rows, validate=validate and not compiled)
    against = "entry of indices" if indices is not None else "row of data"
    if lengths is not None:
        lengths = as_index(lengths, "lengths", device)
        if num_segments is not None and num_segments != lengths.numel():
            raise ValueError(
                f"num_segments = {num_segments} but lengths has {lengths.numel()} entries"
            )
        # (checked always: a negative length makes the kernels misread)
        offs = _kernels.offsets_of(lengths, compiled)
        if int(offs[-1]) != n:
            raise ValueError(
                f"lengths sum to {int(offs[-1])}, but there are {n} "
                f"{'indices' if indices is not None else 'rows of data along dim 0'}"
            )
        return Plan(lengths.numel(), n, offsets=offs, indices=indices, compiled=compiled)
    if offsets is not None:
        offs = as_index(offsets, "offsets", device).long()
        if num_segments is not None and num_segments != offs.numel() - 1:
            raise ValueError(
                f"num_segments = {num_segments} but offsets has {offs.numel()} entries "
                f"(num_segments + 1 expected)"
            )
        check_offsets(offs, n)  # O(S), always (as lengths)
        return Plan(offs.numel() - 1, n, offsets=offs, indices=indices, compiled=compiled)
    ids = as_index(segment_ids, "segment_ids", device)
    check_rows(ids, n, "segment_ids", against)
    ids, keep = _ids_policy(ids, num_segments, out_of_range)
    if num_segments is None:
        num_segments = int(ids.max()) + 1 if ids.numel() else 0
    S = num_segments
    if sorted:
        check_segment_ids(ids, S, sorted=True, validate=validate)
        offs = torch.searchsorted(ids, torch.arange(S + 1, device=device, dtype=ids.dtype))
        # O(1) guards that hold even without validation: nothing below 0, nothing at or above S
        if ids.numel() and int(offs[0]) != 0:
            raise IndexError(f"segment_ids has {int(offs[0])} negative entries")
        if int(offs[-1]) != ids.numel():
            raise IndexError(
                f"segment_ids has {ids.numel() - int(offs[-1])} entries >= num_segments = {S}"
            )
        return Plan(S, n, offsets=offs, order=keep, indices=indices, compiled=compiled)
    ids = ids.long()
    # unsorted ids: their range is always checked, by the compiled scatter kernels as they read them
    # (counted only when the counts are needed), or here in one pass with the counts
    counts = None if (compiled and S > 0) else _kernels.count_ids(ids, S, compiled)
    return Plan(S, n, indices=indices, ids=ids, keep=keep, counts=counts, compiled=compiled)
