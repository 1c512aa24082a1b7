"""Order statistics of rows of stored elements merged with a fill, on plain tensors: the compiled
kernels of :mod:`sparsefill._kernels.order_numba` behind a torch face.

Row ``r`` in ``[0, R)`` has ``size`` elements: the stored ``(r[i], p[i], v[i])`` (each row's in
ascending position) and ``f[r]`` elsewhere; rows sorted stably (NaN the largest, as torch)::

    sort_head(...)[0].reshape(R // post, width, post)[r // post, :, r % post]
        == torch.sort(row r, descending, stable=True).values[:width]
    rank_select(...)[0][j, r] == torch.sort(row r, stable=True).values[t[j, r]]

(positions alike).  :func:`compiled` says whether a call runs them: CPU, a dtype numba reads, not
traced, and the segment backend's choice (``auto``: once enough work has come to pay for numba's
import, :func:`sparsefill._kernels.segment.compiled_for`); the callers keep a torch path.

>>> import torch
>>> r, p, v = torch.tensor([0, 0]), torch.tensor([1, 3]), torch.tensor([5., -1.])
>>> if compiled(v, 0, force=True):
...     vals, pos = sort_head(r, p, v, torch.zeros(1), 4, 4, 1, False)
...     assert vals.tolist() == [-1., 0., 0., 5.] and pos.tolist() == [3, 0, 2, 1]
...     vals, pos = head_rows(*group_rows(r, 1, p), v, torch.tensor(0.), 4, 2, 1, True, (1, 2))
...     assert vals.tolist() == [[5., 0.]] and pos.tolist() == [[1, 0]]
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from sparsefill._kernels.segment import _np, _nb, compiled_for
from sparsefill._kernels.trace import traced

__all__ = ["compiled", "sort_head", "head_rows", "group_rows", "rank_select"]

_EMPTY_I = np.empty(0, np.int64)
_DTYPES = (
    torch.float64,
    torch.float32,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
)


def compiled(v: torch.Tensor, work: int, force: bool = False) -> bool:
    """Whether the compiled kernels run for values ``v`` and ``work`` elements (the dense
    op's); ``force``: whenever numba is installed (tests, examples)."""
    if v.device.type != "cpu" or v.dtype not in _DTYPES or traced(v):
        return False
    if force:
        return bool(_nb())
    return compiled_for(v.device, work)


def _grouped():
    from sparsefill._kernels import order_grouped_numba

    return order_grouped_numba


def _mod():
    from sparsefill._kernels import order_numba

    return order_numba


def sort_head(r, p, v, f, size: int, width: int, post: int, descending: bool):
    """``(values, positions)``, flat ``R * width`` (``R = len(f)``): the first ``width`` of each
    stably sorted row, row ``r`` at ``(r // post, :, r % post)`` of ``(R // post, width, post)``."""
    R = f.numel()
    out_v = torch.empty(R * width, dtype=v.dtype)
    out_p = torch.empty(R * width, dtype=torch.int64)
    _mod().sort_head(
        *_args(r, p, v, f), size, width, max(post, 1), descending, _np(out_v), _np(out_p)
    )
    return out_v, out_p


def group_rows(key: torch.Tensor, R: int, p: torch.Tensor) -> tuple:
    """``(offs, order, p)`` as NumPy arrays: the elements of rows ``key`` (in ``[0, R)``) grouped
    by row, stably (row ``j``'s are ``order[offs[j]:offs[j + 1]]``), and their positions ``p``
    (int64): :func:`head_rows`' rows, worth keeping for a pattern."""
    offs, order = _mod()._group(_np(key.to(torch.int64).contiguous()), R)
    return offs, order, _np(p.to(torch.int64).contiguous())


def head_rows(
    offs,
    order,
    p,
    v: torch.Tensor,
    fill: torch.Tensor,
    size: int,
    width: int,
    post: int,
    descending: bool,
    shape,
    out=None,
):
    """``(values, positions)`` of ``shape`` (``(R // post, width, post)`` elements): the first
    ``width`` of every stably sorted row, rows of :func:`group_rows` (each row's in ascending
    position), values ``v`` (1-D), the one fill ``fill``; row ``r`` at ``(r // post, :, r %
    post)``.  Written into ``out`` (contiguous tensors of that shape, ``v``'s dtype and int64)
    where given."""
    if out is None:
        out = (torch.empty(shape, dtype=v.dtype), torch.empty(shape, dtype=torch.int64))
    out_v, out_p = out
    if fill.dtype != v.dtype:
        fill = fill.to(v.dtype)
    post = max(post, 1)
    mod = _grouped()
    wi, wv = _scratch(order.shape[0], offs.shape[0] - 1, post, width, v.dtype)
    # (NumPy's reshapes: a fraction of torch's cost, on a call of a few microseconds' work)
    mod.head_rows(
        offs,
        order,
        p,
        _np(v.contiguous()),
        _np(fill).reshape(1),
        size,
        width,
        post,
        descending,
        _np(out_v).reshape(-1),
        _np(out_p).reshape(-1),
        wi,
        wv,
        v.dtype.is_floating_point,
    )
    return out_v, out_p


_KEEP = 1 << 24  # bytes of line scratch kept per thread between calls
_LOCAL = threading.local()


def _scratch(nse: int, R: int, post: int, width: int, dtype) -> tuple:
    """NumPy scratch of ``order_lines_numba.line_scratch`` for a write line by line (``post >
    1``; empty otherwise).  Kept per thread up to ``_KEEP`` bytes: a sort repeated on a pattern
    reuses pages already mapped and in the cache instead of new ones each call."""
    if post == 1:
        return _EMPTY_I, torch.empty(0, dtype=dtype).numpy()
    from sparsefill._kernels.order_lines_numba import line_scratch

    n_i, n_v = line_scratch(nse, R, (R // post) * width)
    kept = getattr(_LOCAL, "scratch", {}).get(dtype)
    if kept is not None and kept[0].shape[0] >= n_i and kept[1].shape[0] >= n_v:
        return kept
    made = (np.empty(n_i, np.int64), torch.empty(n_v, dtype=dtype).numpy())
    if (n_i + n_v) * 8 <= _KEEP:
        if not hasattr(_LOCAL, "scratch"):
            _LOCAL.scratch = {}
        _LOCAL.scratch[dtype] = made
    return made


def rank_select(r, p, v, f, size: int, t: torch.Tensor):
    """``(values, positions)``, each ``t``'s shape ``(Q, R)``: rank ``t[j, r]`` of each
    ascending stably sorted row."""
    t = t.to(torch.int64).contiguous()
    out_v = torch.empty(t.shape, dtype=v.dtype)
    out_p = torch.empty(t.shape, dtype=torch.int64)
    _mod().rank_select(*_args(r, p, v, f), size, _np(t), _np(out_v), _np(out_p))
    return out_v, out_p


def _args(r, p, v, f):
    return (
        _np(r.to(torch.int64).contiguous()),
        _np(p.to(torch.int64).contiguous()),
        _np(v.contiguous()),
        _np(f.to(v.dtype).contiguous()),
    )
