"""The densify policy: what happens when an op has no sparse handler.

An operation without a native handler is computed on ``A.to_dense()`` (the
*densify fallback*).  The policy decides whether that is allowed:

* ``mode="warn"`` (default): compute densely and emit :class:`DensifyWarning`;
* ``mode="allow"``: compute densely, silently;
* ``mode="raise"``: raise :class:`DensifyError` instead.

In every mode a dense temporary larger than ``limit_bytes`` raises
:class:`DensifyError` (``None`` means no limit).

>>> import sparsefill
>>> with sparsefill.densify_policy("raise"):
...     pass  # any densifying computation in here raises DensifyError
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import warnings

__all__ = ["DensifyWarning", "DensifyError", "densify_policy", "set_densify_policy", "get_densify_policy"]

_MODES = ("warn", "allow", "raise")


class DensifyWarning(UserWarning):
    """An operation on a SparseTensor was computed by densifying its operands."""


class DensifyError(RuntimeError):
    """A densifying computation was refused by the densify policy."""


@dataclasses.dataclass(frozen=True)
class DensifyPolicy:
    mode: str = "warn"
    limit_bytes: int | None = 1 << 30  # 1 GiB

    def __post_init__(self):
        if self.mode not in _MODES:
            raise ValueError(f"densify policy mode must be one of {_MODES}, got {self.mode!r}")
        if self.limit_bytes is not None and (not isinstance(self.limit_bytes, int) or self.limit_bytes < 0):
            raise ValueError(f"densify policy limit_bytes must be a non-negative int or None, got {self.limit_bytes!r}")


_state = threading.local()
_global = [DensifyPolicy()]


def get_densify_policy() -> DensifyPolicy:
    """The policy in force: the innermost :func:`densify_policy` context, else the global one."""
    stack = getattr(_state, "stack", None)
    return stack[-1] if stack else _global[0]


def set_densify_policy(mode: str | None = None, limit_bytes: int | None | type(...) = ...) -> DensifyPolicy:
    """Set the global policy; arguments left out keep their current value. Returns the previous policy."""
    old = _global[0]
    _global[0] = DensifyPolicy(old.mode if mode is None else mode, old.limit_bytes if limit_bytes is ... else limit_bytes)
    return old


@contextlib.contextmanager
def densify_policy(mode: str | None = None, limit_bytes: int | None | type(...) = ...):
    """Context manager: use this policy inside the ``with`` block (thread-local)."""
    cur = get_densify_policy()
    pol = DensifyPolicy(cur.mode if mode is None else mode, cur.limit_bytes if limit_bytes is ... else limit_bytes)
    stack = _state.__dict__.setdefault("stack", [])
    stack.append(pol)
    try:
        yield pol
    finally:
        stack.pop()


def _caller_stacklevel() -> int:
    """``warnings.warn`` stacklevel of the first frame outside sparsefill and torch (the user's line)."""
    import os
    import sys

    import torch
    inside = (os.path.dirname(__file__), os.path.dirname(torch.__file__))
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


def check_densify(what: str, nbytes: int) -> None:
    """Apply the policy to a densifying computation ``what`` needing ``nbytes`` of dense temporaries."""
    pol = get_densify_policy()
    if pol.mode == "raise":
        raise DensifyError(f"{what}: no sparse implementation, and the densify policy is 'raise' "
                           f"(dense temporaries would take {nbytes} bytes)")
    if pol.limit_bytes is not None and nbytes > pol.limit_bytes:
        raise DensifyError(f"{what}: densifying needs {nbytes} bytes, over the densify policy's limit of "
                           f"{pol.limit_bytes} bytes (see sparsefill.densify_policy)")
    if pol.mode == "warn":
        warnings.warn(f"{what}: computed by densifying ({nbytes} bytes)", DensifyWarning,
                      stacklevel=_caller_stacklevel())


SPECIFY_QUIET_ELEMENTS = 1 << 16


def check_specify(what: str, n_elements: int, element_size: int) -> None:
    """A result that is dense by nature in part: ``n_elements`` unspecified elements must be stored
    explicitly (e.g. ``cat`` of operands with different fills, a fill that cannot stay uniform).
    Quiet up to ``SPECIFY_QUIET_ELEMENTS``; past it, the densify policy applies (a DensifyWarning
    by default) to the bytes they take."""
    if n_elements > SPECIFY_QUIET_ELEMENTS:
        check_densify(what, n_elements * element_size)
