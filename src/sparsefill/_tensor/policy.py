"""The densify policy: what happens when an op has no sparse handler.

An operation without a native handler is computed on ``A.to_dense()`` (the
*densify fallback*).  The policy decides whether that is allowed:

* ``mode="warn"`` (default): compute densely and emit :class:`DensifyWarning`;
* ``mode="allow"``: compute densely, silently;
* ``mode="raise"``: raise :class:`DensifyError` instead.

In every mode a dense temporary larger than ``limit_bytes`` raises
:class:`DensifyError` (``None`` means no limit).

A result that is *dense by nature* -- ``A.cumsum(d)`` along a sparse dim, a dense tensor updated
from ``A`` (``x.add_(A)``), a gradient that varies over the unspecified elements (softmax along
one of several sparse dims, a masked op's backward where they are masked in) -- needs the dense
form whatever the handler does.  It passes the same gate (:func:`check_densify` with
``by_nature=True``) under its own mode, ``dense_by_nature``: ``"allow"`` by default (quiet, as a
dense result is expected to be), ``"warn"`` or ``"raise"`` to find or forbid them; the byte limit
applies alike.

>>> import sparsefill
>>> with sparsefill.densify_policy("raise"):
...     pass  # any densifying computation for want of a sparse handler raises DensifyError in here
>>> with sparsefill.densify_policy("raise", dense_by_nature="raise"):
...     pass  # ... and so does any dense-by-nature one
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import warnings
from collections.abc import Iterator
from types import EllipsisType, FrameType

__all__ = [
    "DensifyWarning",
    "DensifyError",
    "densify_policy",
    "set_densify_policy",
    "get_densify_policy",
]

_MODES = ("warn", "allow", "raise")


class DensifyWarning(UserWarning):
    """An operation on a SparseTensor was computed by densifying its operands."""


class DensifyError(RuntimeError):
    """A densifying computation was refused by the densify policy."""


# Users meet both classes as sparsefill.DensifyWarning / sparsefill.DensifyError (warning filters,
# except clauses, tracebacks): name them where they are exported.
DensifyWarning.__module__ = DensifyError.__module__ = "sparsefill"


@dataclasses.dataclass(frozen=True)
class DensifyPolicy:
    mode: str = "warn"
    limit_bytes: int | None = 1 << 30  # 1 GiB
    dense_by_nature: str = "allow"

    def __post_init__(self):
        if self.mode not in _MODES:
            raise ValueError(f"densify policy mode must be one of {_MODES}, got {self.mode!r}")
        if self.dense_by_nature not in _MODES:
            raise ValueError(
                f"densify policy dense_by_nature must be one of {_MODES}, got "
                f"{self.dense_by_nature!r}"
            )
        if self.limit_bytes is not None and (
            not isinstance(self.limit_bytes, int) or self.limit_bytes < 0
        ):
            raise ValueError(
                "densify policy limit_bytes must be a non-negative int or None, got "
                f"{self.limit_bytes!r}"
            )


_state = threading.local()
_global = [DensifyPolicy()]


def get_densify_policy() -> DensifyPolicy:
    """The policy in force: the innermost :func:`densify_policy` context, else the global one."""
    stack = getattr(_state, "stack", None)
    return stack[-1] if stack else _global[0]


def _with(cur: DensifyPolicy, mode, limit_bytes, dense_by_nature) -> DensifyPolicy:
    return DensifyPolicy(
        cur.mode if mode is None else mode,
        cur.limit_bytes if limit_bytes is ... else limit_bytes,
        cur.dense_by_nature if dense_by_nature is None else dense_by_nature,
    )


def set_densify_policy(
    mode: str | None = None,
    limit_bytes: int | None | EllipsisType = ...,
    *,
    dense_by_nature: str | None = None,
) -> DensifyPolicy:
    """Set the global policy; arguments left out keep their current value. Returns the previous
    policy."""
    old = _global[0]
    _global[0] = _with(old, mode, limit_bytes, dense_by_nature)
    return old


@contextlib.contextmanager
def densify_policy(
    mode: str | None = None,
    limit_bytes: int | None | EllipsisType = ...,
    *,
    dense_by_nature: str | None = None,
) -> Iterator[DensifyPolicy]:
    """Context manager: use this policy inside the ``with`` block (thread-local); arguments left out
    keep the value in force."""
    pol = _with(get_densify_policy(), mode, limit_bytes, dense_by_nature)
    stack = _state.__dict__.setdefault("stack", [])
    stack.append(pol)
    try:
        yield pol
    finally:
        stack.pop()


def _caller_stacklevel() -> int:
    """``warnings.warn`` stacklevel of the first frame outside sparsefill and torch (the user's
    line)."""
    import os
    import sys

    import torch

    inside = (os.path.dirname(os.path.dirname(__file__)), os.path.dirname(torch.__file__))
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


def check_densify(what: str, nbytes: int, *, by_nature: bool = False) -> None:
    """The densify gate: every computation that makes the dense form of a SparseTensor (``nbytes``
    of dense temporaries) asks it first.  ``by_nature=False``: for want of a sparse implementation
    (the densify fallback, a view written the dense way), under the policy's ``mode``;
    ``by_nature=True``: a result or gradient that is dense by nature, or an explicitly requested
    dense form, under ``dense_by_nature``.

    >>> from sparsefill import DensifyError, densify_policy
    >>> check_densify("A.cumsum(0)", 800, by_nature=True)         # quiet under the default policy
    >>> with densify_policy(dense_by_nature="raise"):
    ...     check_densify("A.cumsum(0)", 800, by_nature=True)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    sparsefill.DensifyError: A.cumsum(0): dense by nature, and the densify policy's ...
    """
    pol = get_densify_policy()
    mode = pol.dense_by_nature if by_nature else pol.mode
    if mode == "raise":
        why = (
            "dense by nature, and the densify policy's dense_by_nature is"
            if by_nature
            else "no sparse implementation, and the densify policy is"
        )
        raise DensifyError(f"{what}: {why} 'raise' (dense temporaries would take {nbytes} bytes)")
    _check_limit(what, nbytes, pol)
    if mode == "warn":
        warnings.warn(
            f"{what}: computed by densifying ({nbytes} bytes)",
            DensifyWarning,
            stacklevel=_caller_stacklevel(),
        )


def check_limit(what: str, nbytes: int) -> None:
    """The byte limit alone (quiet otherwise): for stored elements a result needs below the quiet
    threshold of :func:`check_specify` (a user who set ``limit_bytes`` can trust it at any size)."""
    _check_limit(what, nbytes, get_densify_policy())


def _check_limit(what: str, nbytes: int, pol: DensifyPolicy) -> None:
    if pol.limit_bytes is not None and nbytes > pol.limit_bytes:
        raise DensifyError(
            f"{what}: densifying needs {nbytes} bytes, over the densify policy's limit of "
            f"{pol.limit_bytes} bytes (see sparsefill.densify_policy)"
        )


SPECIFY_QUIET_ELEMENTS = 1 << 16


def check_specify(what: str, n_elements: int, element_size: int) -> None:
    """A result that is dense by nature in part: ``n_elements`` unspecified elements must be stored
    explicitly (e.g. ``cat`` of operands with different fills, a fill that cannot stay uniform).
    Quiet up to ``SPECIFY_QUIET_ELEMENTS``; past it, the densify policy applies (a DensifyWarning
    by default) to the bytes they take.  The byte limit holds at any size (the policy's promise: in
    every mode a dense form larger than ``limit_bytes`` raises).

    >>> from sparsefill import densify_policy
    >>> check_specify("cat of operands with different fills", 100, 8)   # quiet: few elements
    >>> with densify_policy(limit_bytes=799):
    ...     check_specify("cat of operands with different fills", 100, 8)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    sparsefill.DensifyError: cat of operands with different fills: densifying needs 800 ...
    """
    nbytes = n_elements * element_size
    if n_elements > SPECIFY_QUIET_ELEMENTS:
        check_densify(what, nbytes)
        return
    _check_limit(what, nbytes, get_densify_policy())
