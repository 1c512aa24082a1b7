"""Compiled CPU kernels of the order statistics over rows of stored elements merged with a fill
(numba; imported lazily by :mod:`sparsefill._kernels.order`, absent without numba).

Row ``r`` in ``[0, R)`` has ``size`` elements: the stored ones ``(r[i], p[i], v[i])`` (each row's
in ascending position ``p``, rows in any order) and ``f[r]`` everywhere else.  In stable order (NaN
the largest, as ``torch.sort``) a row is::

    [stored ahead of f, sorted]  [the run: every position whose value equals f, ascending]
                                 [stored behind f, sorted]

so one stable sort of each row's stored values (insertion sort up to ``_SMALL`` elements, a
bottom-up merge sort past it; a short head of a long row: a selection) places every element:
:func:`sort_head` writes the first ``width`` of every sorted row (values and positions, the layout
``(R // post, width, post)``: row ``r`` at ``(r // post, :, r % post)``, a sort along a dim with
``post`` elements after it); :func:`rank_select` gives the element of rank ``t[j, r]`` of each
row.  Work: ``O(nse log nse + R + output)``, one pass over the output (the fill's runs written as
plain loops).

:func:`head_rows` (``order_grouped_numba.py``) is :func:`sort_head` for rows given grouped.

(The row bodies are written out in the kernels rather than in ``inline="always"`` helpers: numba's
inlining of a helper that size made the caller about twice as slow.)
"""

from __future__ import annotations

try:
    import numba
    import numpy as np
    from numba import njit
# numba is optional: this module then defines nothing and the callers use torch ops
except ImportError:
    numba = None

__all__ = ["sort_head", "rank_select"]

_SMALL = 24  # elements: insertion sort up to here (a row of a 1%-dense matrix holds ~10)
_RUN = 16  # elements: a longer row's runs sorted by insertion before the merges
_BLOCK = 64  # rows written together across a strided output (a 512-byte run per write)
_TOP = 64  # a head of at most this many of a longer row: selected, not sorted whole
_RADIX = 256  # floating elements of a row past which a whole row's are radix sorted
_KMAX = 0x7FFFFFFFFFFFFFFF


if numba is not None:

    @njit(inline="always")
    def _ahead(a, b, desc):
        """``a`` sorts strictly ahead of ``b`` (NaN the largest)."""
        if desc:
            return a > b or (a != a and b == b)
        return a < b or (b != b and a == a)

    @njit(nogil=True, cache=True)
    def _group(r, R):  # pragma: no cover - compiled
        """Row offsets (``R + 1``) and the stable counting sort of the elements by row (none
        needed where the rows come grouped: the identity)."""
        n = r.shape[0]
        offs = np.zeros(R + 1, np.int64)
        grouped = True
        for i in range(n):
            offs[r[i] + 1] += 1
            if i and r[i] < r[i - 1]:
                grouped = False
        for j in range(R):
            offs[j + 1] += offs[j]
        order = np.arange(n)
        if not grouped:
            cur = offs[:-1].copy()
            for i in range(n):
                order[cur[r[i]]] = i
                cur[r[i]] += 1
        return offs, order

    @njit(inline="always")
    def _top_row(v, ix, width, desc):
        """The first ``width`` of ``ix`` stably sorted by value into ``ix[:width]``: an insertion
        into a sorted buffer (an element not ahead of its last is passed over at one comparison;
        equal values keep position order)."""
        m = 0
        for i in range(ix.shape[0]):
            x = ix[i]
            if m == width:
                if not _ahead(v[x], v[ix[m - 1]], desc):
                    continue
                j = m - 1
            else:
                j = m
                m += 1
            while j > 0 and _ahead(v[x], v[ix[j - 1]], desc):
                ix[j] = ix[j - 1]
                j -= 1
            ix[j] = x

    @njit(cache=True)
    def _sort_row(v, ix, tmp, desc, width):
        """``ix`` (indices into ``v``) sorted stably by value, in place (``width`` short of its
        length: only its first ``width``)."""
        n = ix.shape[0]
        if _SMALL < n and width <= _TOP and width < n:
            _top_row(v, ix, width, desc)
            return
        # runs of _RUN sorted by insertion, then merged bottom-up
        run = max(n, 1) if n <= _SMALL else _RUN
        for lo in range(0, n, run):
            hi = min(lo + run, n)
            for i in range(lo + 1, hi):
                x = ix[i]
                j = i
                while j > lo and _ahead(v[x], v[ix[j - 1]], desc):
                    ix[j] = ix[j - 1]
                    j -= 1
                ix[j] = x
        if n <= _SMALL:
            return
        w = run
        src, dst = ix, tmp[:n]
        flipped = False
        while w < n:
            for lo in range(0, n, 2 * w):
                mid, hi = min(lo + w, n), min(lo + 2 * w, n)
                a, b, k = lo, mid, lo
                while a < mid and b < hi:
                    if _ahead(v[src[b]], v[src[a]], desc):  # (equal: the left one first)
                        dst[k] = src[b]
                        b += 1
                    else:
                        dst[k] = src[a]
                        a += 1
                    k += 1
                while a < mid:
                    dst[k] = src[a]
                    a += 1
                    k += 1
                while b < hi:
                    dst[k] = src[b]
                    b += 1
                    k += 1
            src, dst = dst, src
            flipped = not flipped
            w *= 2
        if flipped:
            ix[:] = src

    @njit(inline="always")
    def _counts(v, ix, fr, desc):
        """``(nlow, nhigh)``: the row's stored elements (``ix``, any order) ahead of and behind
        the fill."""
        lo = 0
        hi = 0
        for i in range(ix.shape[0]):
            x = v[ix[i]]
            if _ahead(x, fr, desc):
                lo += 1
            elif _ahead(fr, x, desc):
                hi += 1
        return lo, hi

    @njit(inline="always")
    def _write_row(p, v, order, srt, a, b, fr, size, width, desc, out_v, out_p, o):
        """The first ``width`` elements of the stably sorted row of ``order[a:b]`` (position
        order; ``srt[a:b]`` the same sorted) into ``out_v``/``out_p`` from ``o`` on, contiguous."""
        # (counted over ``order``: a selected head leaves ``srt[a:b]`` past ``width`` a mix of
        # moved and repeated elements, no longer the row's)
        nlow, nhigh = _counts(v, order[a:b], fr, desc)
        s = 0
        while s < nlow and s < width:
            out_v[o + s] = v[srt[a + s]]
            out_p[o + s] = p[srt[a + s]]
            s += 1
        lim = min(size - nhigh, width)
        c = 0
        k = a
        while s < lim:
            pc = size if k == b else p[order[k]]
            m = min(pc - c, lim - s)  # (the fill between stored positions)
            q = o + s
            # (through views from index 0, one array per loop: numba makes these tight loops,
            # several times faster over a long run than two interleaved stores at offset q)
            dv = out_v[q : q + m]
            dp = out_p[q : q + m]
            for t in range(m):
                dv[t] = fr
            for t in range(m):
                dp[t] = c + t
            s += m
            c += m
            if s >= lim or k == b:
                break
            x = v[order[k]]
            k += 1
            c = pc + 1
            if not (_ahead(x, fr, desc) or _ahead(fr, x, desc)):  # (in the run)
                out_v[o + s] = x
                out_p[o + s] = pc
                s += 1
        # the stored behind the fill, from the first: a selected head holds those the output
        # reaches (nlow + neq + their number <= width)
        j = b - a - nhigh - s
        while s < width:
            out_v[o + s] = v[srt[a + j + s]]
            out_p[o + s] = p[srt[a + j + s]]
            s += 1

    @njit(nogil=True, cache=True)
    def sort_head(r, p, v, f, size, width, post, desc, out_v, out_p):  # pragma: no cover
        """The first ``width`` elements of every stably sorted row into ``out_v``/``out_p`` (flat,
        ``R * width``, the layout of the module docstring).  With ``post > 1`` a block of
        ``_BLOCK`` rows adjacent in the output is written to a buffer and copied across: runs of
        whole cache lines instead of one element per line."""
        R = f.shape[0]
        offs, order = _group(r, R)
        srt = order.copy()
        tmp = np.empty(order.shape[0], np.int64)
        for row in range(R):
            _sort_row(v, srt[offs[row] : offs[row + 1]], tmp, desc, width)
        if post == 1:
            for row in range(R):
                a, b = offs[row], offs[row + 1]
                _write_row(
                    p, v, order, srt, a, b, f[row], size, width, desc, out_v, out_p, row * width
                )
            return
        B = min(_BLOCK, post)
        buf_v = np.empty(B * width, out_v.dtype)
        buf_p = np.empty(B * width, np.int64)
        r0 = 0
        while r0 < R:
            nb = min(B, post - r0 % post)  # (a block stays within one leading index)
            for i in range(nb):
                row = r0 + i
                a, b = offs[row], offs[row + 1]
                _write_row(
                    p, v, order, srt, a, b, f[row], size, width, desc, buf_v, buf_p, i * width
                )
            base = (r0 // post) * width * post + r0 % post
            for s in range(width):
                o = base + s * post
                for i in range(nb):
                    out_v[o + i] = buf_v[i * width + s]
                    out_p[o + i] = buf_p[i * width + s]
            r0 += nb

    @njit(nogil=True, cache=True)
    def rank_select(r, p, v, f, size, t, out_v, out_p):  # pragma: no cover - compiled
        """``out[j, row]``: the element of rank ``t[j, row]`` of every ascending stably sorted row
        (``0 <= t < size``)."""
        R = f.shape[0]
        offs, order = _group(r, R)
        srt = order.copy()
        tmp = np.empty(order.shape[0], np.int64)
        for row in range(R):
            a, b = offs[row], offs[row + 1]
            fr = f[row]
            _sort_row(v, srt[a:b], tmp, False, b - a)
            nlow, nhigh = _counts(v, srt[a:b], fr, False)
            for j in range(t.shape[0]):
                tj = t[j, row]
                if tj < nlow:
                    i = srt[a + tj]
                elif tj >= size - nhigh:
                    i = srt[b - (size - tj)]
                else:
                    # the (tj - nlow)-th position outside the stored ahead of or behind the fill
                    c = tj - nlow
                    i = -1
                    for k in range(a, b):
                        e = order[k]
                        x = v[e]
                        if _ahead(x, fr, False) or _ahead(fr, x, False):
                            if p[e] <= c:
                                c += 1
                            else:
                                break
                    for k in range(a, b):  # (a stored element equal to the fill there)
                        if p[order[k]] == c:
                            i = order[k]
                        if p[order[k]] >= c:
                            break
                    if i < 0:
                        out_v[j, row] = fr
                        out_p[j, row] = c
                        continue
                out_v[j, row] = v[i]
                out_p[j, row] = p[i]


# ------------------------------------------------ primitives of the grouped rows' kernels
if numba is not None:

    @njit(inline="always")
    def _before(a, b, desc):
        """:func:`_ahead` without branches (the comparisons of random values mispredict)."""
        if desc:
            return (a > b) | ((a != a) & (b == b))
        return (a < b) | ((b != b) & (a == a))

    @njit(inline="always")
    def _insert(dv, dp, lo, n, x, pc, desc):
        """``(x, pc)`` inserted into the sorted ``dv[lo:lo + n]`` (positions ``dp``), after the
        equal values (stable)."""
        j = lo + n
        while j > lo and _ahead(x, dv[j - 1], desc):
            dv[j] = dv[j - 1]
            dp[j] = dp[j - 1]
            j -= 1
        dv[j] = x
        dp[j] = pc

    @njit(cache=True)
    def _place_sorted(p, v, ix, tmp, desc, dv, dp, lo, radix):
        """The elements ``ix`` (position order) stably sorted into ``dv``/``dp`` from ``lo``
        (``radix``: floating values, many of them sorted by :func:`_radix`)."""
        n = ix.shape[0]
        if radix and n > _RADIX:
            _radix(v, ix, tmp, desc)
        elif n:
            _sort_row(v, ix, tmp, desc, n)
        for j in range(n):
            dv[lo + j] = v[ix[j]]
            dp[lo + j] = p[ix[j]]

    @njit(cache=True)
    def _radix(v, ix, tmp, desc):
        """``ix`` stably sorted by the floating values ``v[ix]`` (NaN the largest, -0.0 equal to
        0.0), in place: a least-significant-digit radix sort of their bits as ordered integer
        keys, byte by byte (a stable pass each; a byte all keys share skipped) -- a fixed number
        of passes without the comparisons that mispredict on random values."""
        n = ix.shape[0]
        fv = np.empty(n, np.float64)
        for j in range(n):
            fv[j] = v[ix[j]]
        key = fv.view(np.int64)
        for j in range(n):
            x = fv[j]
            k = key[j]
            if x != x:
                k = _KMAX
            elif x == 0:
                k = 0
            elif k < 0:
                k ^= _KMAX  # (a negative float: a larger magnitude, a smaller key)
            key[j] = ~k if desc else k
        key2 = np.empty(n, np.int64)
        ix2 = tmp[:n]
        cnt = np.empty(256, np.int64)
        for d in range(8):
            sh = 8 * d
            top = 0x80 if d == 7 else 0  # (the sign byte: negative keys first)
            cnt[:] = 0
            for j in range(n):
                cnt[((key[j] >> sh) & 0xFF) ^ top] += 1
            if cnt[((key[0] >> sh) & 0xFF) ^ top] == n:
                continue
            at = 0
            for c in range(256):
                m = cnt[c]
                cnt[c] = at
                at += m
            for j in range(n):
                c = ((key[j] >> sh) & 0xFF) ^ top
                key2[cnt[c]] = key[j]
                ix2[cnt[c]] = ix[j]
                cnt[c] += 1
            key, key2 = key2, key
            ix[:] = ix2
