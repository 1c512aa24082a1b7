"""Compiled CPU segment kernels (numba; imported lazily by ``_kernels``, absent without numba).

Each kernel runs one segment per parallel iteration over contiguous rows of ``x`` (shape ``(M, D)``);
position ``k`` reads row ``rows[k]`` (or ``k`` when ``rows`` is empty).  A row index outside
``[0, M)`` is never read: the kernel flags its segment in ``bad`` and the caller raises.
"""

import numba
import numpy as np
from numba import njit, prange

__all__ = ["seg_sum", "seg_extreme", "counting_sort", "set_threads"]


def set_threads(n: int) -> None:
    numba.set_num_threads(max(1, min(int(n), numba.config.NUMBA_NUM_THREADS)))


@njit(parallel=True, cache=True, nogil=True)
def seg_sum(x, offs, rows, w, out, bad):  # pragma: no cover - compiled
    S = offs.shape[0] - 1
    D = x.shape[1]
    M = x.shape[0]
    has_rows = rows.shape[0] > 0
    has_w = w.shape[0] > 0
    for s in prange(S):
        for k in range(offs[s], offs[s + 1]):
            r = rows[k] if has_rows else k
            if r < 0 or r >= M:
                bad[s] = 1
                continue
            if has_w:
                wk = w[k]
                for d in range(D):
                    out[s, d] += wk * x[r, d]
            else:
                for d in range(D):
                    out[s, d] += x[r, d]


@njit(parallel=True, cache=True, nogil=True)
def seg_extreme(x, offs, rows, out, arg, largest, bad):  # pragma: no cover - compiled
    S = offs.shape[0] - 1
    D = x.shape[1]
    M = x.shape[0]
    has_rows = rows.shape[0] > 0
    want_arg = arg.shape[0] > 0
    for s in prange(S):
        a = offs[s]
        b = offs[s + 1]
        started = False
        for k in range(a, b):
            r = rows[k] if has_rows else k
            if r < 0 or r >= M:
                bad[s] = 1
                continue
            if not started:
                started = True
                for d in range(D):
                    out[s, d] = x[r, d]
                if want_arg:
                    for d in range(D):
                        arg[s, d] = k
                continue
            if want_arg:
                if largest:
                    for d in range(D):
                        v = x[r, d]
                        c = out[s, d]
                        if v > c or (v != v and c == c):
                            out[s, d] = v
                            arg[s, d] = k
                else:
                    for d in range(D):
                        v = x[r, d]
                        c = out[s, d]
                        if v < c or (v != v and c == c):
                            out[s, d] = v
                            arg[s, d] = k
            else:
                if largest:
                    for d in range(D):
                        v = x[r, d]
                        c = out[s, d]
                        out[s, d] = v if (v > c or v != v) else c
                else:
                    for d in range(D):
                        v = x[r, d]
                        c = out[s, d]
                        out[s, d] = v if (v < c or v != v) else c


@njit(cache=True, nogil=True)
def counting_sort(ids, order, offs):  # pragma: no cover - compiled
    """Stable counting sort of ``ids`` into ``order``; ``offs`` (S+1, zeroed) receives the group offsets.
    Returns the first position with an id outside ``[0, S)``, or -1."""
    S = offs.shape[0] - 1
    n = ids.shape[0]
    for i in range(n):
        v = ids[i]
        if v < 0 or v >= S:
            return i
        offs[v + 1] += 1
    for s in range(S):
        offs[s + 1] += offs[s]
    cur = offs[:-1].copy()
    for i in range(n):
        v = ids[i]
        order[cur[v]] = i
        cur[v] += 1
    return -1
