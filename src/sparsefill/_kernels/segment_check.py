"""Argument checks shared by the segment operations.

Every check raises a ValueError / TypeError / IndexError that names the argument and the
offending numbers.  The O(N) checks (over every id or length) run only when the caller
passes ``validate=True`` (the default); the O(1) shape checks always run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

#: 1-D integer indices (lengths, offsets, segment ids, positions): an int32 or int64 tensor, or a
#: sequence of ints (read as int64).
IndexLike = torch.Tensor | Sequence[int]

__all__ = [
    "as_index",
    "check_lengths",
    "check_offsets",
    "check_segment_ids",
    "check_indices",
    "check_rows",
]


def as_index(x, name: str, device=None) -> torch.Tensor:
    """``x`` as a 1-D int32/int64 tensor (Python lists become int64); floats and bools are
    rejected."""
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(x, dtype=torch.int64, device=device)
    if t.dtype not in (
        torch.int32,
        torch.int64,
    ):  # (int8/int16/uint8 would wrap in sums and offsets)
        raise TypeError(f"{name} must be an int32 or int64 tensor, got dtype {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    if device is not None and t.device != torch.device(device):
        t = t.to(device)
    return t


def cpu_min(t: torch.Tensor) -> int:
    """``int(t.min())``; on the CPU by numpy (serial: torch would start a parallel region for this
    small reduction, whose OpenMP workers then spin next to the compiled kernels' threads)."""
    return int(t.numpy().min()) if t.device.type == "cpu" else int(t.min())


def cpu_sum(t: torch.Tensor) -> int:
    """``int(t.sum())`` of an integer tensor (int64 accumulation); on the CPU by numpy (less
    overhead)."""
    return int(t.numpy().sum(dtype=np.int64)) if t.device.type == "cpu" else int(t.sum())


def _first(mask: torch.Tensor) -> int:
    return int(mask.nonzero()[0, 0])


def check_lengths(
    lengths: torch.Tensor,
    total: int | None,
    name: str = "lengths",
    *,
    validate: bool = True,
    sum_: int | None = None,
) -> None:
    """Lengths are non-negative and (when ``total`` is given) sum to ``total``."""
    if validate and lengths.numel() and cpu_min(lengths) < 0:  # min: no temporary on the good path
        i = _first(lengths < 0)
        raise ValueError(f"{name} must be non-negative, got {name}[{i}] = {int(lengths[i])}")
    if total is not None:
        s = cpu_sum(lengths) if sum_ is None else sum_
        if s != total:
            raise ValueError(f"{name} sum to {s}, but the data has {total} rows along dim 0")


def _check_nondecreasing(t: torch.Tensor, name: str, rule: str, hint: str = "") -> None:
    """A ValueError naming the first decrease ``t[i] > t[i + 1]``, if any."""
    if t.numel() > 1:
        dec = t[1:] < t[:-1]
        if bool(dec.any()):
            i = _first(dec)
            raise ValueError(
                f"{name} {rule}, got {name}[{i}] = {int(t[i])} > {name}[{i + 1}] = "
                f"{int(t[i + 1])}{hint}"
            )


def check_offsets(
    offsets: torch.Tensor, total: int | None, name: str = "offsets", *, validate: bool = True
) -> None:
    """Offsets start at 0, do not decrease, and end at ``total`` (when given)."""
    if offsets.numel() == 0:
        raise ValueError(f"{name} must hold at least one entry (0), got an empty tensor")
    first, last = int(offsets[0]), int(offsets[-1])
    if first != 0:
        raise ValueError(f"{name} must start at 0, got {name}[0] = {first}")
    if total is not None and last != total:
        raise ValueError(f"{name} end at {last}, but the data has {total} rows along dim 0")
    if validate:
        _check_nondecreasing(offsets, name, "must not decrease")


def check_segment_ids(
    ids: torch.Tensor,
    num_segments: int | None,
    *,
    sorted: bool,
    name: str = "segment_ids",
    validate: bool = True,
) -> None:
    """Ids lie in ``[0, num_segments)`` and, when ``sorted``, do not decrease."""
    if not validate or ids.numel() == 0:
        return
    lo, hi = (int(v) for v in torch.aminmax(ids))
    if lo < 0:
        i = _first(ids < 0)
        raise IndexError(
            f"{name} must be non-negative, got {name}[{i}] = "
            f"{lo if int(ids[i]) == lo else int(ids[i])}"
        )
    if num_segments is not None and hi >= num_segments:
        i = _first(ids >= num_segments)
        raise IndexError(
            f"{name}[{i}] = {int(ids[i])} is out of range for num_segments = {num_segments}"
        )
    if sorted:
        _check_nondecreasing(
            ids, name, "must be sorted (sorted=True)", "; pass sorted=False for unsorted ids"
        )


def check_indices(
    indices: torch.Tensor,
    size: int,
    name: str = "indices",
    *,
    validate: bool = True,
    what: str = "rows of data",
) -> None:
    """Indices lie in ``[0, size)``."""
    if not validate or indices.numel() == 0:
        return
    lo, hi = (int(v) for v in torch.aminmax(indices))
    if lo < 0 or hi >= size:
        bad = (indices < 0) | (indices >= size)
        i = _first(bad)
        raise IndexError(f"{name}[{i}] = {int(indices[i])} is out of range for {size} {what}")


def check_rows(t: torch.Tensor, n: int, name: str, against: str) -> None:
    """``t`` has ``n`` entries along dim 0."""
    if t.dim() == 0 or t.shape[0] != n:
        got = "a 0-d tensor" if t.dim() == 0 else f"{t.shape[0]} entries"
        raise ValueError(f"{name} must have {n} entries along dim 0 (one per {against}), got {got}")
