"""Which element of a slice a reduction selects, over stored values and fill copies alike: the
position of the first element equal to the slice's extreme (argmax/argmin, :func:`segment_arg`),
the first unspecified position (:func:`first_gap`), the ties of the extreme that share an amax/amin
gradient (:func:`tie_counts`, :func:`even_ties`) and the lower median (:func:`segment_median`).

Invariant: each equals the same question asked of the dense slice ``cat(values[seg == s], fill
copies)``, with torch's tie rules (the first position wins; the gradient splits evenly).

>>> import torch
>>> first_gap(torch.tensor([0, 0, 1, 1]), torch.tensor([0, 2, 0, 1]), 3).tolist()
[1, 2, 0]
"""

from __future__ import annotations

import math

import torch

from sparsefill._kernels.combine import (
    _bcast,
    _table,
    broadcast_seg,
    segment_combine,
    segment_counts,
)


def segment_arg(
    values: torch.Tensor,
    seg: torch.Tensor,
    num_segments: int,
    positions: torch.Tensor,
    best: torch.Tensor,
    *,
    fill=None,
    fill_position=None,
) -> torch.Tensor:
    """Position of the first element equal to ``best[s]`` in every segment (torch's argmax/argmin
    tie rule).

    ``positions[i]`` is the position of ``values[i]`` within its slice; a NaN ``best`` matches a
    NaN. Where the fill equals ``best`` and ``fill_position[s]`` (the first unspecified position, or
    ``None``/-1 for none) comes earlier, that position wins.  Segments with no match get -1. With a
    fill table (``fill``/``fill_position`` of shape ``(num_segments, C)``) every class is a
    candidate at its own first position.
    """
    b = best[seg]
    hit = (
        (values == b) | (torch.isnan(values) & torch.isnan(b))
        if values.is_floating_point()
        else values == b
    )
    big = torch.iinfo(torch.int64).max
    pos = torch.where(
        hit, broadcast_seg(positions, values), torch.full_like(hit, big, dtype=torch.int64)
    )
    out = segment_combine(pos, seg, num_segments, "amin", init=big)
    if fill is not None and fill_position is not None:
        f = torch.as_tensor(fill, dtype=values.dtype, device=values.device)
        fp = torch.as_tensor(fill_position, device=out.device)
        b = best[:, None] if _table(fp, out) else best
        fhit = (
            (f == b) | (torch.isnan(f) & torch.isnan(b)) if values.is_floating_point() else f == b
        )
        if _table(fp, out):  # a fill table: the first position among the classes that hit
            out = torch.minimum(
                out, torch.where(fhit & (fp >= 0), fp, torch.full_like(fp, big)).amin(-1)
            )
        else:
            fp = _bcast(fp, out)
            out = torch.where(fhit & (fp >= 0), torch.minimum(out, fp.expand_as(out)), out)
    return torch.where(out == big, torch.full_like(out, -1), out)


def first_gap(
    seg: torch.Tensor, pos: torch.Tensor, num_segments: int, presorted: bool = False
) -> torch.Tensor:
    """Per segment, the smallest non-negative position not among its ``pos`` (the count when they
    are ``0 .. count - 1``): the first unspecified position of a slice, where argmax finds a winning
    fill. Sorted by (segment, position), the k-th element of a segment sits at position k until the
    first gap.  ``presorted``: ``pos`` already ascends within every segment.

    >>> first_gap(torch.tensor([0, 0, 1, 1]), torch.tensor([0, 2, 0, 1]), 3).tolist()
    [1, 2, 0]
    """
    order = (
        torch.arange(seg.numel(), device=seg.device)
        if presorted
        else torch.argsort(pos, stable=True)
    )
    order = order[torch.argsort(seg[order], stable=True)]
    s, p = seg[order], pos[order]
    counts = segment_counts(s, num_segments)
    rank = torch.arange(s.numel(), device=s.device) - (torch.cumsum(counts, 0) - counts)[s]
    bad = p != rank
    return counts.clone().scatter_reduce(0, s[bad], rank[bad], "amin", include_self=True)


def tie_counts(values, best, seg, num_segments, *, fill=None, n_fill=None, nan=False):
    """``(hit, count, n_hit)``: the ties of each segment's extreme ``best``, the one tie rule of
    amax/amin
    gradients (:func:`even_ties`, ``segment.reduce``'s max/min backward)::

        hit[i] = values[i] == best[seg[i]]    (``nan``: a NaN also matches a NaN best, torch's rule)
        count[s] = #{i : seg[i] == s, hit[i]} + sum of n_hit[s]

    ``n_hit``: the fill copies equal to ``best`` (per segment, or per class of a fill table), None
    without fills.  ``count`` has ``values``' dtype and ``best``'s shape.

    >>> hit, count, _ = tie_counts(
    ...     torch.tensor([2.0, 2.0, 1.0]), torch.tensor([2.0, 1.0]), torch.tensor([0, 0, 1]), 2
    ... )
    >>> hit.tolist(), count.tolist()
    ([True, True, True], [2.0, 1.0])
    """
    b = best.index_select(0, seg)
    hit = values == b
    if nan and values.is_floating_point():
        hit = hit | (torch.isnan(values) & torch.isnan(b))
    count = segment_combine(hit.to(best.dtype), seg, num_segments, "sum")
    if fill is None or n_fill is None:
        return hit, count, None
    table = _table(torch.as_tensor(n_fill), best)
    bb = best[:, None] if table else best
    n = n_fill if table else _bcast(n_fill, best)
    nf = torch.where((fill == bb) & (n > 0), n, torch.zeros_like(n)).to(best.dtype)
    return hit, count + (nf.sum(-1) if table else nf.expand_as(best)), nf


def even_ties(best, values, seg, num_segments, fill=None, n_fill=None):
    """``best`` (each segment's extreme) rewritten as the mean of the elements equal to it, so that
    its gradient splits evenly among all of them, fill copies included (torch's amax/amin backward
    on the dense slice).  Same value; segments with no such element (none, or NaN) keep ``best``, no
    gradient."""
    b = best.detach()
    hit, count, nf = tie_counts(values, b, seg, num_segments, fill=fill, n_fill=n_fill)
    total = segment_combine(
        torch.where(hit, values, torch.zeros_like(values)), seg, num_segments, "sum"
    )
    if nf is not None:
        ftot = torch.where(nf > 0, fill * nf, torch.zeros((), dtype=b.dtype, device=b.device))
        total = total + (ftot.sum(-1) if nf.dim() == 2 and b.dim() == 1 else ftot.expand_as(b))
    return torch.where(count > 0, total / count.clamp_min(1), b)


def segment_median(
    values: torch.Tensor,
    seg: torch.Tensor,
    num_segments: int,
    *,
    fill=None,
    n_fill=None,
    return_index: bool = False,
):
    """Lower median of the non-NaN elements of each segment (``torch.nanmedian``), for 1-D
    ``values`` plus ``n_fill`` copies of ``fill`` (per segment, or a fill table); NaN (0 for
    integers) for a segment with none.  The one median rank rule of sparse, masked and whole-tensor
    medians: sorted once by (segment, value), the copies enter as one weighted element per class,
    ahead of equal stored values, and the median is the element whose cumulative weight first
    exceeds ``(N - 1) // 2``.

    ``return_index``: also the element picked: ``i < k`` the stored ``values[i]``, ``k + s * C + c``
    the fill class ``c`` of segment ``s`` (``C`` classes, 1 without a table), -1 for a segment with
    none.

    >>> segment_median(
    ...     torch.tensor([3.0, 1.0, 2.0]),
    ...     torch.tensor([0, 0, 1]),
    ...     2,
    ...     fill=torch.tensor(0.0),
    ...     n_fill=torch.tensor([2, 0]),
    ... ).tolist()
    [0.0, 2.0]
    """
    k = values.shape[0]
    vals, segs, mult = values, seg, torch.ones_like(seg)
    ids = torch.arange(k, device=seg.device)
    if fill is not None and n_fill is not None:
        n = torch.as_tensor(n_fill, device=seg.device)
        n = n if n.dim() == 2 else n[:, None]
        F = torch.as_tensor(fill, dtype=values.dtype, device=values.device).expand(n.shape)
        # (fills first: ahead of equal stored values in the stable sort)
        vals = torch.cat([F.reshape(-1), values])
        segs = torch.cat(
            [torch.arange(num_segments, device=seg.device).repeat_interleave(n.shape[1]), seg]
        )
        mult = torch.cat([n.reshape(-1), mult])
        ids = torch.cat([k + torch.arange(n.numel(), device=seg.device), ids])
    keep = (mult > 0) & ~torch.isnan(vals)
    vals, segs, mult, ids = vals[keep], segs[keep], mult[keep], ids[keep]
    order = torch.argsort(vals.detach(), stable=True)
    order = order[torch.argsort(segs[order], stable=True)]
    vals, segs, mult, ids = vals[order], segs[order], mult[order], ids[order]
    total = torch.zeros(num_segments, dtype=torch.int64, device=seg.device).index_add_(
        0, segs, mult
    )
    after = torch.cumsum(mult, 0) - (torch.cumsum(total, 0) - total)[segs]
    t = (total - 1).div(2, rounding_mode="floor")[segs]
    sel = (after - mult <= t) & (t < after)
    empty = math.nan if values.is_floating_point() or values.is_complex() else 0
    out = torch.full((num_segments,), empty, dtype=values.dtype, device=values.device).index_put(
        (segs[sel],), vals[sel]
    )
    if not return_index:
        return out
    return out, torch.full((num_segments,), -1, dtype=torch.int64, device=seg.device).index_put(
        (segs[sel],), ids[sel]
    )
