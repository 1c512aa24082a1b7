"""The segment kernels: a compiled CPU path (numba, optional) and the torch path (any device).

All kernels work in *segment order*: position ``k`` of segment ``s`` lies in
``offsets[s] <= k < offsets[s+1]`` and reads row ``rows[k]`` of ``x`` (``rows = None``: row ``k``)::

    segment_sum(x, offsets, rows, w)[s]  = sum_k  w[k] * x[rows[k]]
    segment_extreme(x, offsets, rows)[s] = max_k  x[rows[k]]   (or min), with arg[s] = the first such k

The compiled path is used for float32/float64 CPU tensors when numba imports (``pip install
sparsefill[segment]``); ``set_backend("torch")`` forces the torch path (``embedding_bag`` for sums,
the reducer protocol's scatter kernels otherwise), which is the only one on other devices.  Both
return the same values; the compiled kernels check every row index (an out-of-range row raises,
never reads out of bounds).
"""

from __future__ import annotations

import contextlib
import os

import torch

from .. import _reduce

__all__ = ["set_backend", "backend", "compiled_available", "segment_sum", "segment_extreme", "sort_by_segment"]

_STATE = {"backend": os.environ.get("SPARSEFILL_SEGMENT_BACKEND", "auto"), "nb": None}


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
        try:
            from . import _numba_kernels as mod
        except ImportError:
            mod = False
        _STATE["nb"] = mod
    return _STATE["nb"]


def compiled_available() -> bool:
    return bool(_nb())


def _use_compiled(*tensors) -> bool:
    if _STATE["backend"] != "auto":
        return False
    for t in tensors:
        if t is None:
            continue
        if t.device.type != "cpu" or (t.is_floating_point() and t.dtype not in (torch.float32, torch.float64)):
            return False
    return bool(_nb())


def _np(t):
    return t.detach().numpy()


def _threads():
    _nb().set_threads(torch.get_num_threads())


def _empty_i64():
    return torch.empty(0, dtype=torch.int64)


def _raise_bad_rows(rows, m):
    from ._check import check_indices
    check_indices(rows, m, "indices")
    raise IndexError("a row index is out of range")  # unreachable: check_indices raises


def segment_sum(x: torch.Tensor, offsets: torch.Tensor, rows: torch.Tensor | None, w: torch.Tensor | None,
                seg=None) -> torch.Tensor:
    """``out[s] = sum_k w[k] * x[rows[k]]`` over the positions of segment ``s``; ``x`` is 2-D, float.

    ``seg`` (segment id of every position, optional) saves recomputing it on the torch path.
    """
    S = offsets.numel() - 1
    if _use_compiled(x, w) and x.is_floating_point():
        out = torch.zeros(S, x.shape[1], dtype=x.dtype)
        bad = torch.zeros(max(S, 1), dtype=torch.uint8)
        _threads()
        _nb().seg_sum(_np(x.contiguous()), _np(offsets), _np(rows if rows is not None else _empty_i64()),
                      _np(w if w is not None else x.new_empty(0)), _np(out), _np(bad))
        if rows is not None and bool(bad.any()):
            _raise_bad_rows(rows, x.shape[0])
        return out
    if x.is_floating_point() and not x.is_complex():
        idx = rows if rows is not None else torch.arange(x.shape[0], device=x.device)
        return torch.nn.functional.embedding_bag(idx, x, offsets, mode="sum", per_sample_weights=w,
                                                 include_last_offset=True)
    vals = x if rows is None else x.index_select(0, rows)
    if w is not None:
        vals = vals * w[:, None]
    if seg is None:
        seg = segment_ids_of(offsets, vals.shape[0])
    return _reduce.segment_combine(vals, seg, S, "sum")


def segment_extreme(x: torch.Tensor, offsets: torch.Tensor, rows: torch.Tensor | None, *, largest: bool,
                    seg=None, want_arg: bool = True):
    """``(best, arg)``: per segment and column the max (``largest``) or min of ``x[rows[k]]`` and the
    first position ``k`` holding it (NaN wins, as in torch); empty segments: ``best`` undefined, ``arg = -1``."""
    S = offsets.numel() - 1
    if _use_compiled(x) and x.is_floating_point():
        out = torch.empty(S, x.shape[1], dtype=x.dtype)
        arg = torch.full((S, x.shape[1]) if want_arg else (0, 0), -1, dtype=torch.int64)
        bad = torch.zeros(max(S, 1), dtype=torch.uint8)
        _threads()
        _nb().seg_extreme(_np(x.contiguous()), _np(offsets), _np(rows if rows is not None else _empty_i64()),
                          _np(out), _np(arg), bool(largest), _np(bad))
        if rows is not None and bool(bad.any()):
            _raise_bad_rows(rows, x.shape[0])
        return out, (arg if want_arg else None)
    vals = x if rows is None else x.index_select(0, rows)
    if seg is None:
        seg = segment_ids_of(offsets, vals.shape[0])
    mode = "amax" if largest else "amin"
    best = _reduce.segment_combine(vals, seg, S, mode)
    arg = None
    if want_arg:
        arg = _reduce.segment_arg(vals, seg, S, torch.arange(vals.shape[0], device=x.device), best)
    return best, arg


def segment_ids_of(offsets: torch.Tensor, n: int) -> torch.Tensor:
    """The segment of every position ``k < n`` (int64), from offsets."""
    S = offsets.numel() - 1
    return torch.repeat_interleave(torch.arange(S, device=offsets.device), offsets.diff(), output_size=n)


def sort_by_segment(ids: torch.Tensor, num_segments: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(order, offsets)``: a stable permutation of the positions grouping them by segment id, and the
    offsets of the groups.  ``ids`` must lie in ``[0, num_segments)`` (checked by the caller or here)."""
    if _use_compiled(ids) and ids.numel():
        order = torch.empty(ids.numel(), dtype=torch.int64)
        offsets = torch.zeros(num_segments + 1, dtype=torch.int64)
        bad = _nb().counting_sort(_np(ids.long() if ids.dtype != torch.int64 else ids), _np(order), _np(offsets))
        if bad >= 0:
            v = int(ids[bad])
            if v < 0:
                raise IndexError(f"segment_ids must be non-negative, got segment_ids[{bad}] = {v}")
            raise IndexError(f"segment_ids[{bad}] = {v} is out of range for num_segments = {num_segments}")
        return order, offsets
    if ids.numel() and int(ids.min()) < 0:
        bad = int((ids < 0).nonzero()[0, 0])
        raise IndexError(f"segment_ids must be non-negative, got segment_ids[{bad}] = {int(ids[bad])}")
    counts = torch.bincount(ids.long(), minlength=num_segments) if ids.numel() else \
        torch.zeros(num_segments, dtype=torch.int64, device=ids.device)
    if counts.numel() > num_segments:
        bad = int((ids >= num_segments).nonzero()[0, 0])
        raise IndexError(f"segment_ids[{bad}] = {int(ids[bad])} is out of range for num_segments = {num_segments}")
    offsets = torch.zeros(num_segments + 1, dtype=torch.int64, device=ids.device)
    torch.cumsum(counts, 0, out=offsets[1:])
    order = torch.sort(ids, stable=True).indices
    return order, offsets
