"""Compiled CPU kernels (numba) writing the rows of :mod:`~sparsefill._kernels.order_grouped_numba`
across a strided output (``post > 1``: a sort or a long head along a dim with elements after it)
line by line: each row's elements become *events* at their final output slots (the stored ones,
the fill run's steps over stored positions), counted by output line ``(r // post, s)``; every line
is then written once, contiguously (the fill, the previous line's positions plus one), and its
events over it.  The event buffers are the caller's scratch (:func:`line_scratch`), kept between
calls.
"""

from __future__ import annotations

from sparsefill._kernels.order_numba import _SMALL, numba

if numba is not None:
    import numpy as np
    from numba import njit

    from sparsefill._kernels.order_numba import _before, _insert, _place_sorted, _sort_row

__all__ = ["line_scratch"]


def line_scratch(nse: int, R: int, L: int) -> tuple:
    """``(int64 elements, value elements)`` of the scratch :func:`head_rows` writes line by line
    (``nse`` stored elements in ``R`` rows, ``L`` output lines): events (slots, positions, rows;
    values), the count per line, then the events in line order."""
    cap = 2 * nse + R + 1
    return 5 * cap + 2 * L + 1, 2 * cap


if numba is not None:

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
