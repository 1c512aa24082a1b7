"""The segment kernels: a compiled CPU path (numba, optional) and the torch path (any device).

For a :class:`~._plan.Plan` (segments of input positions; ``x_p`` = row ``rows[p]`` of ``x``)::

    segment_sum(x, plan, w)[s]      = sum_{p in s} w_p x_p         (mode="mean": divided by n_s)
    segment_extreme(x, plan)[s]     = max_{p in s} x_p  (or min), arg[s] = the first input position of it

Sums over sorted segments run on ``embedding_bag`` (its CPU kernel is fbgemm's; on GPU CUDA's) with
``include_last_offset``.  Max/min, and every reduction over *unsorted* ids, run on the compiled
kernels of ``_numba_kernels`` for float32/float64 CPU tensors when numba imports (``pip install
sparsefill[segment]``): unsorted ids are reduced in place by scatter kernels, with no sort.
``set_backend("torch")`` (or no numba, or another device) gives the torch path: ``embedding_bag``,
and the reducer protocol's scatter kernels (``sparsefill._reduce``) over the segment order.  Both
paths return the same values; the compiled kernels check every row index they read.
"""

from __future__ import annotations

import contextlib
import os

import torch

from .. import _reduce

__all__ = ["set_backend", "backend", "use_backend", "compiled_available", "compiled_for", "segment_sum",
           "segment_extreme", "sort_by_segment", "count_ids", "segment_ids_of"]

_STATE = {"backend": os.environ.get("SPARSEFILL_SEGMENT_BACKEND", "auto"), "nb": None}
_FLOATS = (torch.float32, torch.float64)


def set_backend(name: str) -> None:
    """``"auto"`` (compiled CPU kernels when numba is installed, the default) or ``"torch"``."""
    if name not in ("auto", "torch"):
        raise ValueError(f"backend must be 'auto' or 'torch', got {name!r}")
    _STATE["backend"] = name


def backend() -> str:
    return _STATE["backend"]


@contextlib.contextmanager
def use_backend(name: str):
    """Context manager: run the enclosed calls with ``set_backend(name)``."""
    old = _STATE["backend"]
    set_backend(name)
    try:
        yield
    finally:
        _STATE["backend"] = old


def _nb():
    """The compiled kernels module, or False when numba is not installed."""
    if _STATE["nb"] is None:
        from . import _numba_kernels as mod
        if mod.numba is None:
            mod = False
        _STATE["nb"] = mod
    return _STATE["nb"]


def compiled_available() -> bool:
    return bool(_nb())


def compiled_for(device) -> bool:
    return _STATE["backend"] == "auto" and torch.device(device).type == "cpu" and bool(_nb())


def _compiled(x) -> bool:
    return x.dtype in _FLOATS and compiled_for(x.device)


def _np(t):
    return t.detach().numpy()


def _nb_call(name, *args):
    """Run a compiled kernel with torch's thread count.  numba's OpenMP layer shares libgomp with torch
    and sets the process-wide OpenMP thread count when it starts: torch's setting is restored."""
    nb = _nb()
    n = torch.get_num_threads()
    try:
        nb.set_threads(n)
        return getattr(nb, name)(*(_np(a) if isinstance(a, torch.Tensor) else a for a in args))
    finally:
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)


_ARANGE = {"t": torch.empty(0, dtype=torch.int64)}


_ARANGE_CACHE_MAX = 1 << 24  # at most 128 MB of cached int64 positions


def _arange(n, device):
    """``arange(n)`` (int64), cached for the CPU up to ``_ARANGE_CACHE_MAX`` (read-only use)."""
    if torch.device(device).type != "cpu" or n > _ARANGE_CACHE_MAX:
        return torch.arange(n, device=device)
    if _ARANGE["t"].numel() < n:
        _ARANGE["t"] = torch.arange(min(max(n, 2 * _ARANGE["t"].numel()), _ARANGE_CACHE_MAX))
    return _ARANGE["t"][:n]


def _raise_bad_rows(rows, m, pos=None):
    from ._check import check_indices
    check_indices(rows, m, "indices")
    raise IndexError(f"a row index is out of range for {m} rows of data (position {pos})")  # not reached


def segment_ids_of(offsets: torch.Tensor, n: int) -> torch.Tensor:
    """The segment of every position ``k < n`` (int64), from offsets."""
    S = offsets.numel() - 1
    return torch.repeat_interleave(torch.arange(S, device=offsets.device), offsets.diff(), output_size=n)


def count_ids(ids: torch.Tensor, S: int) -> torch.Tensor:
    """``bincount(ids, minlength=S)``; an id outside ``[0, S)`` raises an IndexError naming it."""
    if compiled_for(ids.device) and ids.numel():
        counts = torch.zeros(S, dtype=torch.int64)
        bad = _nb_call("count_ids", ids, counts)
    else:
        bad = -1
        if ids.numel():
            lo, hi = (int(v) for v in torch.aminmax(ids))
            if lo < 0 or hi >= S:
                bad = int(((ids < 0) | (ids >= S)).nonzero()[0, 0])
        counts = None if bad >= 0 else (torch.bincount(ids, minlength=S) if ids.numel() else
                                        torch.zeros(S, dtype=torch.int64, device=ids.device))
    if bad >= 0:
        v = int(ids[bad])
        if v < 0:
            raise IndexError(f"segment_ids must be non-negative, got segment_ids[{bad}] = {v}")
        raise IndexError(f"segment_ids[{bad}] = {v} is out of range for num_segments = {S}")
    return counts


def sort_by_segment(ids: torch.Tensor, num_segments: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(order, offsets)``: a stable permutation grouping the positions by id (ids in range), and the
    offsets of the groups."""
    counts = count_ids(ids, num_segments)
    offsets = torch.zeros(num_segments + 1, dtype=torch.int64, device=ids.device)
    torch.cumsum(counts, 0, out=offsets[1:])
    if compiled_for(ids.device) and ids.numel():
        order = torch.empty(ids.numel(), dtype=torch.int64)
        _nb_call("counting_sort", ids, order, offsets)
    else:
        order = torch.sort(ids, stable=True).indices
    return order, offsets


def _direct(plan, x) -> bool:
    """Reduce unsorted ids in place (compiled scatter kernels) rather than through the segment order."""
    return plan.unsorted and not plan._sorted and _compiled(x)


def segment_sum(x: torch.Tensor, plan, w: torch.Tensor | None = None, *, mode: str = "sum",
                w_in_segment_order: bool = False) -> torch.Tensor:
    """``out[s] = sum_{p in s} w_p x_p`` (``mode="mean"``: divided by the count; empty segments 0).

    ``x`` is 2-D.  ``w`` is per input position, or per segment-order position with
    ``w_in_segment_order`` (positional weights).
    """
    S = plan.num_segments
    if S == 0:
        return x.new_zeros(0, x.shape[1])
    if not w_in_segment_order and _direct(plan, x):
        out = torch.zeros(S, x.shape[1], dtype=x.dtype)
        bad = torch.full((1,), -1, dtype=torch.int64)
        rows = plan.direct_rows()
        wd = plan.direct(w)
        _nb_call("scatter_sum", x.contiguous(), plan.ids, rows if rows is not None else _arange(0, "cpu"),
                 wd if wd is not None else x.new_empty(0), out, bad)
        if int(bad[0]) >= 0:
            _raise_bad_rows(rows, x.shape[0], int(bad[0]))
        return out / plan.counts.clamp_min(1)[:, None] if mode == "mean" else out
    w_seg = w if (w is None or w_in_segment_order) else plan.to_segment_order(w)
    if x.is_floating_point() and not x.is_complex():
        rows = plan.rows
        idx = rows if rows is not None else _arange(x.shape[0], x.device)
        eb_mode = "mean" if (mode == "mean" and w_seg is None) else "sum"
        out = torch.nn.functional.embedding_bag(idx, x, plan.offsets, mode=eb_mode, per_sample_weights=w_seg,
                                                include_last_offset=True)
        return out / plan.counts.clamp_min(1)[:, None] if (mode == "mean" and eb_mode == "sum") else out
    vals = x if plan.rows is None else x.index_select(0, plan.rows)
    if w_seg is not None:
        vals = vals * w_seg[:, None]
    out = _reduce.segment_combine(vals.to(torch.int64) if not vals.is_floating_point() else vals, plan.seg, S, "sum")
    return out / plan.counts.clamp_min(1)[:, None] if mode == "mean" else out


def segment_extreme(x: torch.Tensor, plan, *, largest: bool, want_arg: bool = True):
    """``(best, arg)``: per segment and column the max (``largest``) or min of ``x_p`` and the first input
    position holding it (NaN wins, as in torch); empty segments: ``best`` unspecified, ``arg = -1``."""
    S = plan.num_segments
    D = x.shape[1]
    if S == 0:
        return x.new_zeros(0, D), (torch.zeros(0, D, dtype=torch.int64, device=x.device) if want_arg else None)
    init = float("-inf") if largest else float("inf")
    if _direct(plan, x):
        bad = torch.full((1,), -1, dtype=torch.int64)
        rows = plan.direct_rows()
        r = rows if rows is not None else _arange(0, "cpu")
        if want_arg:
            out = torch.empty(S, D, dtype=x.dtype)
            arg = torch.full((S, D), -1, dtype=torch.int64)
            _nb_call("scatter_extreme_arg", x.contiguous(), plan.ids, r, out, arg, bool(largest), bad)
        else:
            out, arg = torch.full((S, D), init, dtype=x.dtype), None
            _nb_call("scatter_extreme", x.contiguous(), plan.ids, r, out, bool(largest), bad)
        if int(bad[0]) >= 0:
            _raise_bad_rows(rows, x.shape[0], int(bad[0]))
        return out, (plan.direct_positions(arg) if want_arg else None)
    rows = plan.rows
    if _compiled(x):
        bad = torch.zeros(S, dtype=torch.uint8)
        r = rows if rows is not None else _arange(0, "cpu")
        if want_arg:
            out = torch.empty(S, D, dtype=x.dtype)
            arg = torch.full((S, D), -1, dtype=torch.int64)
            _nb_call("seg_extreme_arg", x.contiguous(), plan.offsets, r, out, arg, bool(largest), bad)
        else:
            out, arg = torch.full((S, D), init, dtype=x.dtype), None
            _nb_call("seg_extreme", x.contiguous(), plan.offsets, r, out, bool(largest), bad)
        if rows is not None and bool(bad.any()):
            _raise_bad_rows(rows, x.shape[0])
        return out, (plan.input_positions(arg) if want_arg else None)
    vals = x if rows is None else x.index_select(0, rows)
    mode = "amax" if largest else "amin"
    best = _reduce.segment_combine(vals, plan.seg, S, mode)
    arg = None
    if want_arg:
        k = _reduce.segment_arg(vals, plan.seg, S, _arange(vals.shape[0], x.device), best)
        arg = plan.input_positions(k)
    return best, arg
