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
itself; across a strided output, line by line from events made at their final slots
(``order_lines_numba``).  Many floating stored elements of a row (past ``order_numba._RADIX``)
are sorted by a stable radix sort of their bits (NaN the largest, -0.0 equal to 0.0), without the
comparisons that mispredict.
"""

from __future__ import annotations

from sparsefill._kernels.order_numba import _BLOCK, _SMALL, _TOP, numba

if numba is not None:
    import numpy as np
    from numba import njit

    from sparsefill._kernels.order_lines_numba import _head_lines, _sort_lines
    from sparsefill._kernels.order_numba import (
        _ahead,
        _before,
        _insert,
        _place_sorted,
        _sort_row,
    )

__all__ = ["head_rows"]

_SHORT = 16  # elements of a fill run written by plain stores (longer: through views)


if numba is not None:

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
