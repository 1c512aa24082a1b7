"""Compiled window sums over sorted sources: the union of target intervals and every target's window sum
in one linear pass (numba; imported lazily by ``_core``, absent without numba).  Kernels know arrays only.

For sources sorted by ``(row, x)`` (positions ``x`` unique within a row), each reaching the targets
``[ceil((m2*x + d0) / q2), floor((m2*x + d1) / q2)]`` clipped to ``[0, T)`` (the ``reach``), and the edge
targets ``t < tL`` and ``t > tR`` of every row, the targets are the union of those intervals, row-major
sorted, and::

    sums[c, k] = (sum of cols[c, e] over the sources e of row(k) with A(t_k) <= x_e <= B(t_k) + base) / div
    A(t) = max(ceil((m*t + c0) / q), 0),  B(t) = min(floor((m*t + c1) / q), S - 1)     (the ``window``)

at the targets in ``[tL, tR]``, the bare sum at the edge targets (``A``, ``B`` non-decreasing in ``t``):
each target's window is a contiguous range of the row's sources, kept by two pointers.  A running float64 sum per column (reset when the window empties: no drift carried
from one cluster of sources to the next); NaN, +inf and -inf are counted apart (a window holding +inf
and -inf is NaN, as the dense sum).  ``count`` (the first pass) sizes the outputs, ``fill`` writes them.
"""

from __future__ import annotations

try:
    import numba
    import numpy as np
    from numba import njit
except ImportError:  # numba is optional: this module then defines nothing and ``_core`` uses torch ops
    numba = None

__all__ = ["count", "fill"]

if numba is not None:
    @njit(cache=True)
    def _sweep(srow, x, reach, n_rows, T, tL, tR, cols, window, S, base, div, t_out, r_out, sums, edges, write,
               finite):
        """Both passes: ``write`` False counts ``(targets, edge targets)``; True also writes them."""
        n = x.shape[0]
        m2, d0, d1, q2 = reach
        m, c0, c1, q = window
        kc = cols.shape[0]
        acc = np.zeros(kc)
        bad = np.zeros((3, kc), np.int64)  # per column: NaN, +inf, -inf in the window
        one_row = srow.shape[0] == 0
        k = 0
        ne = 0
        e = 0  # the next source
        lend = min(tL, T) - 1  # the left edge targets [0, lend] and the right ones [rbeg, T - 1]
        rbeg = max(tR + 1, 0)
        for r in range(n_rows):
            rb = e
            while e < n and (one_row or srow[e] == r):
                e += 1
            re = e
            lp = rb  # the window: sources [lp, hp)
            hp = rb
            cur_lo, cur_hi = 0, -1
            has = False
            if lend >= 0:
                cur_lo, cur_hi, has = 0, lend, True
            right = rbeg <= T - 1
            i = rb
            while i <= re:  # the row's intervals in order of their start, the right edge's included
                if i < re:
                    a = max(_ceil(m2 * x[i] + d0, q2), 0)
                    b = min(_floor(m2 * x[i] + d1, q2), T - 1)
                    i += 1
                    if a > b:
                        continue
                    if right and rbeg < a:  # the right edge comes first
                        i -= 1
                        a, b = rbeg, T - 1
                        right = False
                elif right:
                    a, b = rbeg, T - 1
                    right = False
                    i += 1
                else:
                    break
                if has and a <= cur_hi + 1:
                    if b > cur_hi:
                        cur_hi = b
                    continue
                if has:  # a run ends: emit it
                    k, ne, lp, hp = _emit(r, cur_lo, cur_hi, k, ne, lp, hp, re, x, cols, m, c0, c1, q, S, base, div,
                                          tL, tR, t_out, r_out, sums, edges, acc, bad, write, finite)
                cur_lo, cur_hi, has = a, b, True
            if has:
                k, ne, lp, hp = _emit(r, cur_lo, cur_hi, k, ne, lp, hp, re, x, cols, m, c0, c1, q, S, base, div,
                                      tL, tR, t_out, r_out, sums, edges, acc, bad, write, finite)
        return k, ne

    @njit(cache=True, inline="always")
    def _emit(r, t0, t1, k, ne, lp, hp, re, x, cols, m, c0, c1, q, S, base, div, tL, tR,
              t_out, r_out, sums, edges, acc, bad, write, finite):
        """The targets ``t0..t1`` of row ``r``: positions ``k..``, window sums through the pointers."""
        if not write:
            ne += t1 - t0 + 1 - max(0, min(t1, tR) - max(t0, tL) + 1)  # (the targets outside [tL, tR])
            return k + t1 - t0 + 1, ne, lp, hp
        kc = cols.shape[0]
        if finite and kc == 1:
            return _emit_one(r, t0, t1, k, ne, lp, hp, re, x, cols[0], m, c0, c1, q, S, base, div, tL, tR,
                             t_out, r_out, sums[0], edges, acc)
        for t in range(t0, t1 + 1):
            A = max(_ceil(m * t + c0, q), 0)
            B = min(_floor(m * t + c1, q), S - 1)
            while lp < hp and x[lp] < A:  # leaves the window
                for c in range(kc):
                    v = cols[c, lp]
                    if finite or np.isfinite(v):
                        acc[c] -= v
                    elif v != v:
                        bad[0, c] -= 1
                    elif v > 0:
                        bad[1, c] -= 1
                    else:
                        bad[2, c] -= 1
                lp += 1
            if lp == hp:  # empty: restart exactly, past the sources before the window
                for c in range(kc):
                    acc[c] = 0.0
                    bad[0, c] = 0
                    bad[1, c] = 0
                    bad[2, c] = 0
                while hp < re and x[hp] < A:
                    hp += 1
                lp = hp
            while hp < re and x[hp] <= B:  # enters it
                for c in range(kc):
                    v = cols[c, hp]
                    if finite or np.isfinite(v):
                        acc[c] += v
                    elif v != v:
                        bad[0, c] += 1
                    elif v > 0:
                        bad[1, c] += 1
                    else:
                        bad[2, c] += 1
                hp += 1
            edge = t < tL or t > tR
            for c in range(kc):
                s = acc[c]
                if not finite:
                    if bad[0, c] > 0 or (bad[1, c] > 0 and bad[2, c] > 0):
                        s = np.nan
                    elif bad[1, c] > 0:
                        s = np.inf
                    elif bad[2, c] > 0:
                        s = -np.inf
                sums[c, k] = s if edge else (s + base) / div
            t_out[k] = t
            if r_out.shape[0]:
                r_out[k] = r
            if edge:
                edges[ne] = k
                ne += 1
            k += 1
        return k, ne, lp, hp


if numba is not None:
    @njit(cache=True, inline="always")
    def _floor(a, q):
        return a if q == 1 else a // q

    @njit(cache=True, inline="always")
    def _ceil(a, q):
        return a if q == 1 else -((-a) // q)

    @njit(cache=True, inline="always")
    def _emit_one(r, t0, t1, k, ne, lp, hp, re, x, col, m, c0, c1, q, S, base, div, tL, tR,
                  t_out, r_out, out, edges, acc):
        """:func:`_emit` for one column of finite values: the running sum in a register."""
        s = acc[0]
        rows = r_out.shape[0] > 0
        for t in range(t0, t1 + 1):
            A = max(_ceil(m * t + c0, q), 0)
            B = min(_floor(m * t + c1, q), S - 1)
            while lp < hp and x[lp] < A:
                s -= col[lp]
                lp += 1
            if lp == hp:
                s = 0.0
                while hp < re and x[hp] < A:
                    hp += 1
                lp = hp
            while hp < re and x[hp] <= B:
                s += col[hp]
                hp += 1
            t_out[k] = t
            if rows:
                r_out[k] = r
            if t < tL or t > tR:
                out[k] = s
                edges[ne] = k
                ne += 1
            else:
                out[k] = (s + base) / div
            k += 1
        acc[0] = s
        return k, ne, lp, hp


def count(srow, x, reach, n_rows, T, tL, tR):
    """``(targets, edge targets)`` of the union (numpy int64 arrays in, ints out)."""
    e = np.zeros(0, np.int64)
    z = np.zeros((1, 0))
    return _sweep(srow, x, reach, n_rows, T, tL, tR, z, (1, 0, 0, 1), 1, 0.0, 1.0, e, e, z, e, False, True)


def fill(srow, x, reach, n_rows, T, tL, tR, cols, window, S, base, div, t_out, r_out, sums, edges):
    """Writes the targets ``t_out`` (rows ``r_out`` when it is not empty), ``sums`` and the positions of the
    edge targets ``edges`` (sized by :func:`count`); ``window``, ``reach``: ``(m, c0, c1, q)`` tuples of ints."""
    finite = bool(np.isfinite(cols).all())
    _sweep(srow, x, reach, n_rows, T, tL, tR, cols, window, S, float(base), float(div), t_out, r_out, sums, edges,
           True, finite)
