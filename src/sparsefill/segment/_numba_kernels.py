"""Compiled CPU segment kernels (numba; imported lazily by ``_kernels``, absent without numba).

Sorted kernels run one segment per parallel iteration over the positions ``offs[s] .. offs[s+1]-1``;
scatter kernels (unsorted ids, no sort) run over the positions in input order, the columns split
into blocks across threads.  Position ``k`` reads row ``rows[k]`` of ``x`` (or ``k`` when ``rows``
is empty).  A row index outside ``[0, M)`` is never read: the kernel records it in ``bad`` and the
caller raises.  Max/min propagate NaN (as torch) and, with ``arg``, record the first position of
the extreme.
"""

import numba
import numpy as np
from numba import njit, prange

__all__ = ["seg_extreme", "seg_extreme_arg", "scatter_sum", "scatter_extreme", "count_ids", "counting_sort",
           "set_threads"]


def set_threads(n: int) -> None:
    numba.set_num_threads(max(1, min(int(n), numba.config.NUMBA_NUM_THREADS)))


@njit(parallel=True, cache=True, nogil=True)
def seg_extreme(x, offs, rows, out, init, largest, bad):  # pragma: no cover - compiled
    S = offs.shape[0] - 1
    D = x.shape[1]
    M = x.shape[0]
    has_rows = rows.shape[0] > 0
    for s in prange(S):
        for d in range(D):
            out[s, d] = init
        for k in range(offs[s], offs[s + 1]):
            r = rows[k] if has_rows else k
            if r < 0 or r >= M:
                bad[s] = 1
                continue
            if largest:
                for d in range(D):
                    c = out[s, d]
                    v = x[r, d]
                    out[s, d] = c if (c >= v or c != c) else v
            else:
                for d in range(D):
                    c = out[s, d]
                    v = x[r, d]
                    out[s, d] = c if (c <= v or c != c) else v


@njit(parallel=True, cache=True, nogil=True)
def seg_extreme_arg(x, offs, rows, out, arg, largest, bad):  # pragma: no cover - compiled
    """``arg`` must be -1 on entry."""
    S = offs.shape[0] - 1
    D = x.shape[1]
    M = x.shape[0]
    has_rows = rows.shape[0] > 0
    for s in prange(S):
        for k in range(offs[s], offs[s + 1]):
            r = rows[k] if has_rows else k
            if r < 0 or r >= M:
                bad[s] = 1
                continue
            for d in range(D):
                v = x[r, d]
                c = out[s, d]
                better = (v > c) if largest else (v < c)
                if arg[s, d] < 0 or better or (v != v and c == c):
                    out[s, d] = v
                    arg[s, d] = k


@njit(parallel=True, cache=True, nogil=True)
def scatter_sum(x, ids, rows, w, out, bad, B):  # pragma: no cover - compiled
    """``out[ids[i]] += w[i] * x[rows[i]]`` (ids already checked to lie in range); ``B`` column blocks."""
    n = ids.shape[0]
    D = x.shape[1]
    M = x.shape[0]
    has_rows = rows.shape[0] > 0
    has_w = w.shape[0] > 0
    for b in prange(B):
        d0 = b * D // B
        d1 = (b + 1) * D // B
        for i in range(n):
            s = ids[i]
            r = rows[i] if has_rows else i
            if r < 0 or r >= M:
                if b == 0 and bad[0] < 0:
                    bad[0] = i
                continue
            if has_w:
                wk = w[i]
                for d in range(d0, d1):
                    out[s, d] += wk * x[r, d]
            else:
                for d in range(d0, d1):
                    out[s, d] += x[r, d]


@njit(parallel=True, cache=True, nogil=True)
def scatter_extreme(x, ids, rows, out, arg, largest, bad, B):  # pragma: no cover - compiled
    """Max/min by unsorted ids; ``arg`` (-1 on entry) receives the first position of the extreme."""
    n = ids.shape[0]
    D = x.shape[1]
    M = x.shape[0]
    has_rows = rows.shape[0] > 0
    for b in prange(B):
        d0 = b * D // B
        d1 = (b + 1) * D // B
        for i in range(n):
            s = ids[i]
            r = rows[i] if has_rows else i
            if r < 0 or r >= M:
                if b == 0 and bad[0] < 0:
                    bad[0] = i
                continue
            for d in range(d0, d1):
                v = x[r, d]
                c = out[s, d]
                better = (v > c) if largest else (v < c)
                if arg[s, d] < 0 or better or (v != v and c == c):
                    out[s, d] = v
                    arg[s, d] = i


@njit(cache=True, nogil=True)
def count_ids(ids, counts):  # pragma: no cover - compiled
    """``counts[s] = #{i: ids[i] == s}``; returns the first position with an id outside ``[0, S)``, or -1."""
    S = counts.shape[0]
    for i in range(ids.shape[0]):
        v = ids[i]
        if v < 0 or v >= S:
            return i
        counts[v] += 1
    return -1


@njit(cache=True, nogil=True)
def counting_sort(ids, order, offs):  # pragma: no cover - compiled
    """Stable counting sort of ``ids`` (in range) into ``order``; ``offs`` (S+1) holds the group offsets."""
    cur = offs[:-1].copy()
    for i in range(ids.shape[0]):
        v = ids[i]
        order[cur[v]] = i
        cur[v] += 1
