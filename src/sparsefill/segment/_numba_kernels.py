"""Compiled CPU segment kernels (numba; imported lazily by ``_kernels``, absent without numba).

Sorted kernels run one segment per parallel iteration over the positions ``offs[s] .. offs[s+1]-1``;
scatter kernels (unsorted ids, no sort) run serially over the positions in input order.  Position ``k`` reads row ``rows[k]`` of ``x`` (or
``k`` when ``rows`` is empty).  A row index outside ``[0, M)`` is never read: the kernel records it
in ``bad`` and the caller raises.  Max/min propagate NaN (as torch) and, with ``arg``, record the
first position of the extreme.  ``out`` holds the identity (-inf / +inf) on entry for max/min
without ``arg``, and ``arg`` holds -1 on entry for the arg kernels.
"""

try:
    import numba
    from numba import njit, prange
except ImportError:  # numba is optional: this module then defines nothing and ``_kernels`` uses torch ops
    numba = None

__all__ = ["seg_extreme", "seg_extreme_arg", "scatter_sum", "scatter_extreme", "scatter_extreme_arg",
           "count_ids", "counting_sort", "set_threads"]


if numba is not None:
    def set_threads(n: int) -> None:
        numba.set_num_threads(max(1, min(int(n), numba.config.NUMBA_NUM_THREADS)))


    # ------------------------------------------------------------------------------- sorted segments
    @njit(parallel=True, cache=True, nogil=True)
    def seg_extreme(x, offs, rows, out, largest, bad):  # pragma: no cover - compiled
        S = offs.shape[0] - 1
        D = x.shape[1]
        M = x.shape[0]
        has_rows = rows.shape[0] > 0
        for s in prange(S):
            o = out[s]
            if D == 1:
                c = o[0]
                for k in range(offs[s], offs[s + 1]):
                    r = rows[k] if has_rows else k
                    if r < 0 or r >= M:
                        bad[s] = 1
                        continue
                    v = x[r, 0]
                    if largest:
                        c = c if (c >= v or c != c) else v
                    else:
                        c = c if (c <= v or c != c) else v
                o[0] = c
                continue
            for k in range(offs[s], offs[s + 1]):
                r = rows[k] if has_rows else k
                if r < 0 or r >= M:
                    bad[s] = 1
                    continue
                xr = x[r]
                if largest:
                    for d in range(D):
                        c = o[d]
                        v = xr[d]
                        o[d] = c if (c >= v or c != c) else v
                else:
                    for d in range(D):
                        c = o[d]
                        v = xr[d]
                        o[d] = c if (c <= v or c != c) else v


    @njit(parallel=True, cache=True, nogil=True)
    def seg_extreme_arg(x, offs, rows, out, arg, largest, bad):  # pragma: no cover - compiled
        S = offs.shape[0] - 1
        D = x.shape[1]
        M = x.shape[0]
        has_rows = rows.shape[0] > 0
        for s in prange(S):
            o = out[s]
            a = arg[s]
            for k in range(offs[s], offs[s + 1]):
                r = rows[k] if has_rows else k
                if r < 0 or r >= M:
                    bad[s] = 1
                    continue
                xr = x[r]
                for d in range(D):
                    v = xr[d]
                    c = o[d]
                    better = (v > c) if largest else (v < c)
                    if a[d] < 0 or better or (v != v and c == c):
                        o[d] = v
                        a[d] = k


    # ------------------------------------------------------------------------------- unsorted ids
    @njit(nogil=True)
    def _sum_cols(x, ids, rows, w, out, bad, d0, d1, report):  # pragma: no cover - compiled
        M = x.shape[0]
        has_rows = rows.shape[0] > 0
        has_w = w.shape[0] > 0
        for i in range(ids.shape[0]):
            r = rows[i] if has_rows else i
            if r < 0 or r >= M:
                if report and bad[0] < 0:
                    bad[0] = i
                continue
            o = out[ids[i]]
            xr = x[r]
            if has_w:
                wk = w[i]
                for d in range(d0, d1):
                    o[d] += wk * xr[d]
            else:
                for d in range(d0, d1):
                    o[d] += xr[d]


    @njit(nogil=True)
    def _extreme_cols(x, ids, rows, out, largest, bad, d0, d1, report):  # pragma: no cover - compiled
        M = x.shape[0]
        has_rows = rows.shape[0] > 0
        for i in range(ids.shape[0]):
            r = rows[i] if has_rows else i
            if r < 0 or r >= M:
                if report and bad[0] < 0:
                    bad[0] = i
                continue
            o = out[ids[i]]
            xr = x[r]
            if largest:
                for d in range(d0, d1):
                    c = o[d]
                    v = xr[d]
                    o[d] = c if (c >= v or c != c) else v
            else:
                for d in range(d0, d1):
                    c = o[d]
                    v = xr[d]
                    o[d] = c if (c <= v or c != c) else v


    @njit(nogil=True)
    def _extreme_arg_cols(x, ids, rows, out, arg, largest, bad, d0, d1, report):  # pragma: no cover - compiled
        M = x.shape[0]
        has_rows = rows.shape[0] > 0
        for i in range(ids.shape[0]):
            r = rows[i] if has_rows else i
            if r < 0 or r >= M:
                if report and bad[0] < 0:
                    bad[0] = i
                continue
            s = ids[i]
            o = out[s]
            a = arg[s]
            xr = x[r]
            for d in range(d0, d1):
                v = xr[d]
                c = o[d]
                better = (v > c) if largest else (v < c)
                if a[d] < 0 or better or (v != v and c == c):
                    o[d] = v
                    a[d] = i


    @njit(cache=True, nogil=True)
    def scatter_sum(x, ids, rows, w, out, bad):  # pragma: no cover - compiled
        """``out[ids[i]] += w[i] * x[rows[i]]`` (ids already checked), serially: a parallel split of the
        columns measured 3-10x slower (numba does not vectorize the blocked loop)."""
        _sum_cols(x, ids, rows, w, out, bad, 0, x.shape[1], True)

    @njit(cache=True, nogil=True)
    def scatter_extreme(x, ids, rows, out, largest, bad):  # pragma: no cover - compiled
        _extreme_cols(x, ids, rows, out, largest, bad, 0, x.shape[1], True)

    @njit(cache=True, nogil=True)
    def scatter_extreme_arg(x, ids, rows, out, arg, largest, bad):  # pragma: no cover - compiled
        _extreme_arg_cols(x, ids, rows, out, arg, largest, bad, 0, x.shape[1], True)

    # ------------------------------------------------------------------------------- ids
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
