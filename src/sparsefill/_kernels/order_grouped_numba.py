"""Compiled CPU kernels (numba) of the order statistics over rows given grouped, one fill: the
rows of a pattern (:func:`sparsefill._kernels.order.group_rows`, kept by the caller), the row
primitives of :mod:`sparsefill._kernels.order_numba`.

:func:`head_rows` is ``order_numba.sort_head`` for rows given grouped and one fill: only the
stored elements ahead of the fill are sorted (a short head: selected in one pass), those behind it
only where the head reaches them (a head of most of each row, a sort: the run written in one pass
over the row's stored elements that collects both sides, after counting those ahead of the fill).
Across a strided output (``post > 1``) a long head is written line by line: every output line
``(r // post, s)`` once, contiguously (the fill, the previous line's positions plus one), then the
few elements that differ (the stored ones, the run's steps over stored positions), bucketed by
line beforehand.

A whole sort (``width == size``) writes every row in full: row by row, the values the fill in
one pass, the run's positions as runs of consecutive positions between the stored ones outside
it, the few stored ahead of and behind the fill inserted into their sorted slots in the output
itself; across a strided output, line by line from events made at their final slots.  Many
floating stored elements of a row (past ``_RADIX``) are sorted by a stable radix sort of their
bits (NaN the largest, -0.0 equal to 0.0), without the comparisons that mispredict.
"""

from __future__ import annotations

from sparsefill._kernels.order_numba import _BLOCK, _SMALL, _TOP, numba

if numba is not None:
    import numpy as np
    from numba import njit

    from sparsefill._kernels.order_numba import _ahead, _sort_row

__all__ = ["head_rows", "line_scratch"]

_SHORT = 16  # elements of a fill run written by plain stores (longer: through views)
_RADIX = 256  # floating elements of a row past which a whole row's are radix sorted
_KMAX = 0x7FFFFFFFFFFFFFFF


def line_scratch(nse: int, R: int, L: int) -> tuple:
    """``(int64 elements, value elements)`` of the scratch :func:`head_rows` writes line by line
    (``nse`` stored elements in ``R`` rows, ``L`` output lines): events (slots, positions, rows;
    values), the count per line, then the events in line order."""
    cap = 2 * nse + R + 1
    return 5 * cap + 2 * L + 1, 2 * cap


if numba is not None:

    @njit(inline="always")
    def _before(a, b, desc):
        """:func:`_ahead` without branches (the comparisons of random values mispredict)."""
        if desc:
            return (a > b) | ((a != a) & (b == b))
        return (a < b) | ((b != b) & (a == a))

    @njit(cache=True)
    def _gather(p, v, order, a, b, fr, desc, which, ix):
        """The stored elements of ``order[a:b]`` ahead of the fill (``which`` 0) or behind it
        (``which`` 1) into ``ix``, in position order: ``(their number, the other side's)``."""
        n = 0
        other = 0
        for i in range(a, b):
            e = order[i]
            x = v[e]
            lo = _before(x, fr, desc)
            hi = _before(fr, x, desc)
            ix[n] = e
            if which == 0:
                n += lo
                other += hi
            else:
                n += hi
                other += lo
        return n, other

    @njit(inline="always")
    def _top_ahead(p, v, order, a, b, fr, desc, width, bv, bp):
        """The first ``width`` of the stored elements of ``order[a:b]`` ahead of the fill, stably
        sorted, into ``bv``/``bp`` (values, positions) in one pass: each inserted into the sorted
        buffer (a full buffer passes over an element not ahead of its last at one comparison).
        ``(their number in the buffer, all ahead of the fill, all behind it)``."""
        m = 0
        nlow = 0
        nhigh = 0
        for i in range(a, b):
            e = order[i]
            x = v[e]
            if _ahead(x, fr, desc):
                nlow += 1
                if m == width:
                    if not _ahead(x, bv[m - 1], desc):
                        continue
                    j = m - 1
                else:
                    j = m
                    m += 1
                while j > 0 and _ahead(x, bv[j - 1], desc):
                    bv[j] = bv[j - 1]
                    bp[j] = bp[j - 1]
                    j -= 1
                bv[j] = x
                bp[j] = p[e]
            elif _ahead(fr, x, desc):
                nhigh += 1
        return m, nlow, nhigh

    @njit(nogil=True, cache=True)
    def head_rows(
        offs, order, p, v, f, size, width, post, desc, out_v, out_p, wi, wv, radix=False
    ):  # pragma: no cover
        """:func:`sort_head` of rows given grouped, one fill ``f[0]``: row ``j``'s stored elements
        are ``order[offs[j]:offs[j + 1]]`` (ascending position); the output ``(R // post, width,
        post)`` written in its own order.  ``post == 1``: row by row; else the rows' events
        bucketed by output line ``(r // post, s)`` and every line written once: the implied
        slots as a fill and the previous line's positions plus one, then its events, kept in the
        caller's scratch ``wi`` (int64) and ``wv`` (values' dtype) of :func:`line_scratch`
        elements."""
        R = offs.shape[0] - 1
        if width == 0:
            return
        fr = f[0]
        nmax = _longest(offs)
        if width == size:  # (a whole sort: see _sort_full, _sort_lines)
            ix = np.empty(nmax, np.int64)
            tmp = np.empty(nmax, np.int64)
            if post == 1:
                _sort_full(offs, order, p, v, fr, size, desc, ix, tmp, out_v, out_p, radix)
            else:
                _sort_lines(
                    offs, order, p, v, fr, size, post, desc, ix, tmp, out_v, out_p, wi, wv, radix
                )
            return
        # (index buffers of the longest row; a short head needs them only for the stored
        # behind the fill: made when a row first does)
        ix = np.empty(nmax if width > _TOP else 0, np.int64)
        tmp = np.empty(ix.shape[0], np.int64)
        if width > _TOP and post > 1:
            _head_lines(
                offs, order, p, v, fr, size, width, post, desc, ix, tmp, out_v, out_p, wi, wv
            )
            return
        if width > _TOP and 2 * width > size:  # (most of every row: see _head_long)
            _head_long(offs, order, p, v, fr, size, width, desc, ix, tmp, out_v, out_p)
            return
        bv = np.empty(min(width, _TOP), v.dtype)
        bp = np.empty(min(width, _TOP), np.int64)
        # post == 1: one block, written in place; else blocks of rows adjacent in the output
        # written to a buffer, then copied across (runs of whole cache lines)
        direct = post == 1
        B = R if direct else min(_BLOCK, post)
        buf_v = out_v if direct else np.empty(B * width, out_v.dtype)
        buf_p = out_p if direct else np.empty(B * width, np.int64)
        r0 = 0
        while r0 < R:
            nb = R if direct else min(B, post - r0 % post)  # (within one leading index)
            for i in range(nb):
                # (the row's body written here, not an inlined function: twice as fast)
                a, b = offs[r0 + i], offs[r0 + i + 1]
                o = i * width
                # the stored ahead of the fill: a short head selected in one pass, else sorted
                if width <= _TOP:
                    s, nlow, nhigh = _top_ahead(p, v, order, a, b, fr, desc, width, bv, bp)
                    for j in range(s):
                        buf_v[o + j] = bv[j]
                        buf_p[o + j] = bp[j]
                else:
                    nlow, nhigh = _gather(p, v, order, a, b, fr, desc, 0, ix)
                    s = min(nlow, width)
                    if nlow:
                        _sort_row(v, ix[:nlow], tmp, desc, width)
                    for j in range(s):
                        buf_v[o + j] = v[ix[j]]
                        buf_p[o + j] = p[ix[j]]
                # the fill's run between the stored positions
                lim = min(size - nhigh, width)
                c = 0
                k = a
                while s < lim:
                    pc = size if k == b else p[order[k]]
                    m = min(pc - c, lim - s)  # (the fill between stored positions)
                    q = o + s
                    if m < _SHORT:  # (a view costs more than a few stores)
                        for t in range(m):
                            buf_v[q + t] = fr
                            buf_p[q + t] = c + t
                    else:  # (through views from index 0, one array per loop: tight loops)
                        dv = buf_v[q : q + m]
                        dp = buf_p[q : q + m]
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
                    if not (_before(x, fr, desc) | _before(fr, x, desc)):  # (in the run)
                        buf_v[o + s] = x
                        buf_p[o + s] = pc
                        s += 1
                # the stored behind the fill, as far as width reaches
                if s < width:
                    if ix.shape[0] < nmax:
                        ix = np.empty(nmax, np.int64)
                        tmp = np.empty(nmax, np.int64)
                    n, _ = _gather(p, v, order, a, b, fr, desc, 1, ix)
                    _sort_row(v, ix[:n], tmp, desc, width - s)
                    j = 0
                    while s < width:
                        buf_v[o + s] = v[ix[j]]
                        buf_p[o + s] = p[ix[j]]
                        s += 1
                        j += 1
            if not direct:
                base = (r0 // post) * width * post + r0 % post
                for s in range(width):
                    o = base + s * post
                    for i in range(nb):
                        out_v[o + i] = buf_v[i * width + s]
                        out_p[o + i] = buf_p[i * width + s]
            r0 += nb

    @njit(cache=True)
    def _longest(offs):
        """The most elements of a row."""
        n = 0
        for j in range(offs.shape[0] - 1):
            n = max(n, offs[j + 1] - offs[j])
        return n

    @njit(nogil=True, cache=True)
    def _sort_full(
        offs, order, p, v, fr, size, desc, ix, tmp, out_v, out_p, radix
    ):  # pragma: no cover
        """:func:`head_rows` of whole rows (a sort), ``post == 1``: per row, the values the fill
        in one tight pass, the stored ahead of and behind the fill counted, then one pass over
        the stored elements in position order writing the run's positions (runs of consecutive
        positions between the stored ones outside it) and each stored element: a few ahead of or
        behind the fill inserted into their sorted slots in the output itself (no index
        buffers), more collected and sorted after."""
        R = offs.shape[0] - 1
        iy = np.empty(ix.shape[0], np.int64)
        for row in range(R):
            a, b = offs[row], offs[row + 1]
            dv = out_v[row * size : (row + 1) * size]
            dp = out_p[row * size : (row + 1) * size]
            for t in range(size):
                dv[t] = fr
            nlow = 0
            nhigh = 0
            for i in range(a, b):  # (branchless: random values mispredict)
                x = v[order[i]]
                nlow += _before(x, fr, desc)
                nhigh += _before(fr, x, desc)
            small = nlow <= _SMALL and nhigh <= _SMALL
            h0 = size - nhigh  # (the first slot behind the fill)
            s = nlow
            c = 0  # (the run's next position)
            na = 0
            nh = 0
            for i in range(a, b + 1):
                e = order[i] if i < b else -1
                pc = p[e] if i < b else size
                if pc > c:  # (the fill at positions c .. pc - 1: through a view, a tight loop)
                    dq = dp[s : s + pc - c]
                    for t in range(pc - c):
                        dq[t] = c + t
                    s += pc - c
                if e < 0:
                    break
                c = pc + 1
                x = v[e]
                if _before(x, fr, desc):
                    if small:
                        _insert(dv, dp, 0, na, x, pc, desc)
                    ix[na] = e
                    na += 1
                elif _before(fr, x, desc):
                    if small:
                        _insert(dv, dp, h0, nh, x, pc, desc)
                    iy[nh] = e
                    nh += 1
                else:  # (stored, equal to the fill: in the run at its position)
                    dv[s] = x
                    dp[s] = pc
                    s += 1
            if not small:
                _place_sorted(p, v, ix[:na], tmp, desc, dv, dp, 0, radix)
                _place_sorted(p, v, iy[:nh], tmp, desc, dv, dp, h0, radix)

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

    @njit(nogil=True, cache=True)
    def _head_long(
        offs, order, p, v, fr, size, width, desc, ix, tmp, out_v, out_p
    ):  # pragma: no cover
        """:func:`head_rows` of a head of most of every row (a sort), ``post == 1``: per row, the
        stored ahead of the fill counted, then one pass over its stored elements in position
        order writing the fill's run from that slot on and collecting the stored ahead of and
        behind the fill, which are sorted and written after (a shorter head: the run walked only
        as far as it reaches, in head_rows)."""
        R = offs.shape[0] - 1
        iy = np.empty(ix.shape[0], np.int64)
        for row in range(R):
            a, b = offs[row], offs[row + 1]
            o = row * width
            nlow = 0
            for i in range(a, b):
                nlow += _before(v[order[i]], fr, desc)
            s = nlow
            c = 0  # (the run's next position)
            na = 0
            nh = 0
            for i in range(a, b + 1):
                if i < b:
                    e = order[i]
                    pc = p[e]
                else:
                    e = -1
                    pc = size
                m = min(pc - c, width - s)  # (the fill at positions c .. pc - 1, in width)
                if m > 0:
                    q = o + s
                    if m < _SHORT:  # (a view costs more than a few stores)
                        for t in range(m):
                            out_v[q + t] = fr
                            out_p[q + t] = c + t
                    else:  # (through views from index 0, one array per loop: tight loops)
                        dv = out_v[q : q + m]
                        dp = out_p[q : q + m]
                        for t in range(m):
                            dv[t] = fr
                        for t in range(m):
                            dp[t] = c + t
                s += max(pc - c, 0)
                if e < 0:
                    break
                c = pc + 1
                x = v[e]
                if _before(x, fr, desc):
                    ix[na] = e
                    na += 1
                elif _before(fr, x, desc):
                    iy[nh] = e
                    nh += 1
                else:  # (stored, equal to the fill: in the run at its position)
                    if s < width:
                        out_v[o + s] = x
                        out_p[o + s] = pc
                    s += 1
            if na:
                _sort_row(v, ix[:na], tmp, desc, width)
            for j in range(min(na, width)):
                out_v[o + j] = v[ix[j]]
                out_p[o + j] = p[ix[j]]
            s = size - nh  # (the first slot behind the fill)
            if s < width:
                _sort_row(v, iy[:nh], tmp, desc, width - s)
                for j in range(width - s):
                    out_v[o + s + j] = v[iy[j]]
                    out_p[o + s + j] = p[iy[j]]

    @njit(nogil=True, cache=True)
    def _sort_lines(
        offs, order, p, v, fr, size, post, desc, ix, tmp, out_v, out_p, wi, wv, radix
    ):  # pragma: no cover
        """:func:`head_rows` of whole rows (a sort) across a strided output (``post > 1``), line
        by line as :func:`_head_lines`: each row's events made at their final slots (the stored
        ahead of the fill counted first; a few inserted in sorted order among the events
        themselves) and counted by line as they are made."""
        R = offs.shape[0] - 1
        L = (R // post) * size
        ev_s, ev_v, ev_p, ev_r, start = _events(wi, wv, order.shape[0], R, L)
        iy = np.empty(ix.shape[0], np.int64)
        # (the rows' elements come in another order than stored: one sequential pass over the
        # values and positions brings them to the cache before the reads out of order, whose
        # cache misses would each stall)
        if _touch(p, v) < 0:  # (never: positions are not negative)
            return
        ne = 0
        for row in range(R):
            a, b = offs[row], offs[row + 1]
            pre = row // post
            col = row - pre * post
            line0 = pre * size
            nlow = 0
            nhigh = 0
            for i in range(a, b):  # (branchless: random values mispredict)
                x = v[order[i]]
                nlow += _before(x, fr, desc)
                nhigh += _before(fr, x, desc)
            small = nlow <= _SMALL and nhigh <= _SMALL
            e0 = ne  # (the stored ahead of the fill at e0.., behind it at e1..: sorted in place)
            e1 = ne + nlow
            ne = e1 + nhigh
            na = 0
            nh = 0
            c = 0  # (the run's next position)
            s = line0 + nlow  # (its next slot)
            jump = True  # (the run's next slot follows no slot of the run at the position before)
            for i in range(a, b):
                e = order[i]
                x = v[e]
                pc = p[e]
                if pc > c:  # (the fill at positions c .. pc - 1)
                    if jump:
                        ev_s[ne] = s
                        ev_v[ne] = fr
                        ev_p[ne] = c
                        ev_r[ne] = col
                        start[s + 1] += 1
                        ne += 1
                    s += pc - c
                    jump = False
                c = pc + 1
                if _before(x, fr, desc):
                    if small:
                        _insert(ev_v, ev_p, e0, na, x, pc, desc)
                    ix[na] = e
                    na += 1
                    jump = True
                elif _before(fr, x, desc):
                    if small:
                        _insert(ev_v, ev_p, e1, nh, x, pc, desc)
                    iy[nh] = e
                    nh += 1
                    jump = True
                else:  # (stored, equal to the fill: in the run at its position)
                    ev_s[ne] = s
                    ev_v[ne] = x
                    ev_p[ne] = pc
                    ev_r[ne] = col
                    start[s + 1] += 1
                    ne += 1
                    s += 1
                    jump = False
            if size > c and jump:
                ev_s[ne] = s
                ev_v[ne] = fr
                ev_p[ne] = c
                ev_r[ne] = col
                start[s + 1] += 1
                ne += 1
            if not small:
                _place_sorted(p, v, ix[:na], tmp, desc, ev_v, ev_p, e0, radix)
                _place_sorted(p, v, iy[:nh], tmp, desc, ev_v, ev_p, e1, radix)
            h0 = line0 + size - nhigh - e1  # (slot of the event at e1 less e1)
            for j in range(e0, e1):
                ev_s[j] = line0 + j - e0
                ev_r[j] = col
                start[line0 + j - e0 + 1] += 1
            for j in range(e1, e1 + nhigh):
                ev_s[j] = h0 + j
                ev_r[j] = col
                start[h0 + j + 1] += 1
        _write_lines(
            ev_s[:ne], ev_v, ev_p, ev_r, start, fr, size, post, out_v, out_p, wi, wv, ev_s.shape[0]
        )

    @njit(cache=True)
    def _events(wi, wv, nse, R, L):
        """The event buffers carved from the scratch (:func:`line_scratch`): slots, values,
        positions and rows of up to ``2 nse + R + 1`` events, and the count per line zeroed."""
        cap = 2 * nse + R + 1
        start = wi[3 * cap : 3 * cap + L + 1]
        start[:] = 0
        return wi[:cap], wv[:cap], wi[cap : 2 * cap], wi[2 * cap : 3 * cap], start

    @njit(cache=True)
    def _touch(p, v):
        """A sum of a word of every cache line of ``p`` and ``v`` (not negative: read to bring them
        to the cache)."""
        acc = 0
        for i in range(0, p.shape[0], 8):
            acc += p[i]
        for i in range(0, v.shape[0], 8):
            acc += v[i] != v[i]
        return acc

    @njit(cache=True)
    def _write_lines(ev_s, ev_v, ev_p, ev_r, start, fr, width, post, out_v, out_p, wi, wv, cap):
        """Every output line ``(r // post, s)`` of ``out_v``/``out_p`` written once: the fill and
        the previous line's positions plus one (0 on a first line), then the events of the line
        (``ev_s``: their lines; ``start``: the number of events of each line before it, a
        count per line shifted by one on entry; the events moved into line order in the rest of
        the scratch ``wi``/``wv`` of :func:`_events`, for ``cap`` events)."""
        L = start.shape[0] - 1
        ne = ev_s.shape[0]
        for j in range(L):
            start[j + 1] += start[j]
        # (the events moved into line order: read in order below; the buffers zeroed first, in
        # order, to have them in the cache before the writes out of order)
        o = 3 * cap + L + 1
        at = wi[o : o + L]
        at[:] = start[:-1]
        sr = wi[o + L : o + L + ne]
        sp = wi[o + L + cap : o + L + cap + ne]
        sv = wv[cap : cap + ne]
        sr[:] = 0
        sp[:] = 0
        sv[:] = 0
        for e in range(ne):
            j = at[ev_s[e]]
            at[ev_s[e]] += 1
            sr[j] = ev_r[e]
            sv[j] = ev_v[e]
            sp[j] = ev_p[e]
        for line in range(L):
            o = line * post
            dv = out_v[o : o + post]
            dp = out_p[o : o + post]
            for i in range(post):
                dv[i] = fr
            if line % width == 0:
                for i in range(post):
                    dp[i] = 0
            else:
                prev = out_p[o - post : o]
                for i in range(post):
                    dp[i] = prev[i] + 1
            for j in range(start[line], start[line + 1]):
                dv[sr[j]] = sv[j]
                dp[sr[j]] = sp[j]

    @njit(nogil=True, cache=True)
    def _head_lines(
        offs, order, p, v, fr, size, width, post, desc, ix, tmp, out_v, out_p, wi, wv
    ):  # pragma: no cover
        """:func:`head_rows` through events, line by line (a long head across a strided
        output)."""
        R = offs.shape[0] - 1
        L = (R // post) * width
        ev_s, ev_v, ev_p, ev_r, start = _events(wi, wv, order.shape[0], R, L)
        iy = np.empty(ix.shape[0], np.int64)
        ne = 0
        for row in range(R):
            # the row's events in one pass over its stored elements in position order (its
            # body written here: see head_rows): the run's slots counted from its start (``t``),
            # placed once the number ahead of the fill is known
            a, b = offs[row], offs[row + 1]
            pre = row // post
            col = row - pre * post
            line0 = pre * width
            nlow = 0
            nhigh = 0
            c = 0  # (the run's next position)
            t = 0
            jump = True  # (the run's next slot follows no slot of the run at the position before)
            r0 = ne
            for i in range(a, b):
                e = order[i]
                x = v[e]
                pc = p[e]
                lo = _before(x, fr, desc)
                hi = _before(fr, x, desc)
                if pc > c:  # (the fill at positions c .. pc - 1)
                    if jump:
                        ev_s[ne] = t
                        ev_v[ne] = fr
                        ev_p[ne] = c
                        ne += 1
                    t += pc - c
                    jump = False
                c = pc + 1
                if lo:
                    ix[nlow] = e
                    nlow += 1
                    jump = True
                elif hi:
                    iy[nhigh] = e
                    nhigh += 1
                    jump = True
                else:  # (stored, equal to the fill: in the run at its position)
                    ev_s[ne] = t
                    ev_v[ne] = x
                    ev_p[ne] = pc
                    ne += 1
                    t += 1
                    jump = False
            if size > c and jump:
                ev_s[ne] = t
                ev_v[ne] = fr
                ev_p[ne] = c
                ne += 1
            # the run's events moved past the stored ahead of the fill (those past width: gone)
            n1 = r0
            for e in range(r0, ne):
                sl = ev_s[e] + nlow
                if sl < width:
                    ev_s[n1] = line0 + sl
                    ev_v[n1] = ev_v[e]
                    ev_p[n1] = ev_p[e]
                    ev_r[n1] = col
                    n1 += 1
            ne = n1
            if nlow:
                _sort_row(v, ix[:nlow], tmp, desc, width)
            for j in range(min(nlow, width)):
                ev_s[ne] = line0 + j
                ev_v[ne] = v[ix[j]]
                ev_p[ne] = p[ix[j]]
                ev_r[ne] = col
                ne += 1
            s = size - nhigh  # (the first slot behind the fill)
            if s < width:
                _sort_row(v, iy[:nhigh], tmp, desc, width - s)
                for j in range(width - s):
                    ev_s[ne] = line0 + s + j
                    ev_v[ne] = v[iy[j]]
                    ev_p[ne] = p[iy[j]]
                    ev_r[ne] = col
                    ne += 1
        for e in range(ne):
            start[ev_s[e] + 1] += 1
        _write_lines(
            ev_s[:ne], ev_v, ev_p, ev_r, start, fr, width, post, out_v, out_p, wi, wv, ev_s.shape[0]
        )
