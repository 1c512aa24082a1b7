"""The fill value: its normal form, and the indefinite fill.

A SparseTensor's fill ``f`` is a tensor of its values' dtype and device that broadcasts to the
dense dims ``D``; the elements a tensor does not store read ``f.expand(D)``.  The *indefinite* fill
(:data:`indefinite`, stored as a fill of shape ``(0,)``) marks them as masked out instead.
:func:`normalize_fill` turns what a user passes (a number, an array, ``indefinite``, ``[]``) into
that form and raises where the value does not fit the dtype.
"""

from __future__ import annotations

import cmath
import numbers
from collections.abc import Sequence
from typing import Any

import torch

from sparsefill._kernels.trace import traced


def _scalar_fits(x, dtype) -> bool:
    if isinstance(x, complex) and not dtype.is_complex:
        return False
    if dtype.is_complex or dtype.is_floating_point:
        return True
    if dtype == torch.bool:
        return x in (0, 1)
    if not (isinstance(x, numbers.Integral) or (isinstance(x, float) and x.is_integer())):
        return False
    info = torch.iinfo(dtype)
    if not info.min <= int(x) <= info.max:
        raise ValueError(
            f"fill_value {x!r} is out of range [{info.min}, {info.max}] of dtype {dtype}"
        )
    return True


class _Indefinite:
    """The indefinite fill: unspecified elements are masked out (torch.masked's semantics)."""

    def __repr__(self):
        return "sparsefill.indefinite"

    def __reduce__(self):
        return "indefinite"


indefinite = _Indefinite()

#: A fill value: a number, a tensor (0-d, or broadcasting to the dense dims), nested sequences of
#: numbers, or :data:`indefinite`; None where an argument takes its default (0, or the input's).
FillValue = bool | int | float | complex | torch.Tensor | Sequence[Any] | _Indefinite | None
#: A size: a sequence of ints (``torch.Size``, tuple, list).
Size = Sequence[int]


def _is_indefinite(fill_value, dense_shape) -> bool:
    """``sparsefill.indefinite``, or the spelling ``[]`` (a shape-(0,) array) where that
    shape is not a valid array fill (it is one when the dense dims end with a 0-size dim)."""
    if fill_value is indefinite:
        return True
    shape = (
        fill_value.shape
        if isinstance(fill_value, torch.Tensor)
        else ((0,) if isinstance(fill_value, (list, tuple)) and len(fill_value) == 0 else None)
    )
    return shape == (0,) and not (dense_shape and dense_shape[-1] == 0)


def normalize_fill(fill_value, dtype, device, dense_shape, *, own=False):
    """``(fill, indefinite, known_zero)`` from a user's fill (number, list, tensor, ``[]``/None).

    A tensor fill must match ``dtype`` and ``device`` exactly (TypeError); a Python number
    or list is converted when that loses nothing.  The fill must broadcast to ``dense_shape``.
    ``own=True`` returns a tensor the caller may keep (never the caller's object).
    """
    dense_shape = tuple(dense_shape)
    if fill_value is None:
        return torch.zeros((), dtype=dtype, device=device), False, True
    if _is_indefinite(fill_value, dense_shape):
        return torch.empty(0, dtype=dtype, device=device), True, False
    if isinstance(fill_value, torch.Tensor):
        if fill_value.dtype != dtype:
            raise TypeError(
                f"fill_value has dtype {fill_value.dtype} but the tensor has dtype {dtype}; "
                f"pass fill_value.to({dtype})"
            )
        if fill_value.device != torch.device(device):
            raise TypeError(
                f"fill_value is on device {fill_value.device} but the tensor is on {device}"
            )
        fill, zero = (
            fill_value,
            fill_value.device.type == "cpu" and not traced() and not bool(fill_value.any()),
        )
        fill = fill.resolve_conj().resolve_neg()  # (as the values': see _values_tensor)
        if own:
            fill = fill.detach().clone()
    elif isinstance(fill_value, numbers.Number):
        if not _scalar_fits(fill_value, dtype):
            raise TypeError(f"fill_value {fill_value!r} cannot be represented in dtype {dtype}")
        try:
            fill = torch.tensor(fill_value, dtype=dtype, device=device)
        except RuntimeError as e:
            raise ValueError(f"fill_value {fill_value!r} does not fit dtype {dtype}: {e}") from None
        zero = fill_value == 0
        _check_no_overflow(fill_value, cmath.isfinite(fill_value), fill, dtype)
    else:
        t = _array_fill(fill_value)
        if not torch.can_cast(t.dtype, dtype):
            raise TypeError(
                f"fill_value of dtype {t.dtype} cannot be cast to the tensor's dtype {dtype}"
            )
        fill, zero = t.to(dtype=dtype, device=device), not traced() and not bool(t.any())
        _check_no_overflow(
            fill_value,
            t.isfinite() if t.is_floating_point() or t.is_complex() else True,
            fill,
            dtype,
        )
    _check_fill_shape(fill, dense_shape)
    return fill, False, zero


def _check_fill_shape(fill: torch.Tensor, dense_shape) -> None:
    """The fill broadcasts to ``dense_shape``: every trailing dim of the fill is 1 or that dim (not
    torch.broadcast_shapes, whose first call imports sympy: 0.3 s of every process's first
    constructor)."""
    dense_shape = tuple(dense_shape)
    fits = fill.dim() <= len(dense_shape) and all(
        f in (1, d) for f, d in zip(reversed(fill.shape), reversed(dense_shape))
    )
    if not fits:
        raise ValueError(
            f"fill_value of shape {tuple(fill.shape)} does not broadcast to the dense dims "
            f"{dense_shape} of the tensor (a scalar, the dense shape, or smaller)"
        )


def _array_fill(fill_value) -> torch.Tensor:
    """A list/array fill as a tensor; a TypeError naming fill_value for anything that is not a
    number, an array of numbers, a tensor or ``sparsefill.indefinite`` (a dict, an object, a
    string)."""
    if isinstance(fill_value, (str, bytes, dict, set)):
        raise TypeError(
            f"fill_value must be a number, a tensor, a list of numbers or sparsefill.indefinite, "
            f"got {type(fill_value).__name__}"
        )
    try:
        return torch.as_tensor(fill_value)
    except ValueError as e:  # (a ragged list)
        raise ValueError(f"fill_value is no array of numbers: {e}") from None
    except (RuntimeError, TypeError) as e:
        raise TypeError(
            f"fill_value must be a number, a tensor, a list of numbers or sparsefill.indefinite, "
            f"got {type(fill_value).__name__} ({e})"
        ) from None


def _check_no_overflow(fill_value, finite, fill: torch.Tensor, dtype) -> None:
    """A finite number (``finite``: a bool or a mask over ``fill``) that becomes +-inf in ``dtype``
    (``1e6`` in float16) is refused as the integers out of range are: the fill would silently differ
    from what was asked."""
    if not (dtype.is_floating_point or dtype.is_complex) or traced() or fill.device.type != "cpu":
        return
    f = torch.view_as_real(fill) if fill.is_complex() else fill
    inf = f.isinf().any(-1) if fill.is_complex() else f.isinf()
    if isinstance(finite, bool):  # (a bool, not tensor & bool: torch.jit.trace has no such op)
        if not finite:
            return
        hit = inf
    else:
        hit = inf & finite
    if bool(hit.any()):
        info = torch.finfo(dtype)
        raise ValueError(
            f"fill_value {fill_value!r} is out of range [{info.min}, {info.max}] of dtype {dtype}"
        )
