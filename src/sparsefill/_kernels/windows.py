"""Compiled window sums over sorted sources: the union of target intervals, then every target's
window sum, each one linear pass (numba; imported lazily by ``_core``, absent without numba).
Kernels know arrays only.

For sources sorted by ``(row, x)`` (positions ``x`` unique within a row), each reaching the targets
``[ceil((m2*x + d0) / q2), floor((m2*x + d1) / q2)]`` clipped to ``[0, T)`` (the ``reach``), and the
edge targets ``t < tL`` and ``t > tR`` of every row, the targets are the union of those intervals,
row-major sorted (:func:`runs`: runs of consecutive targets), and (:func:`sums`)::

    sums[c, k] = (sum of cols[c, e] over the sources e of row(k) with A(t_k) <= x_e <= B(t_k)
                  + base) * (1 / div)
    A(t) = max(ceil((m*t + c0) / q), 0),  B(t) = min(floor((m*t + c1) / q), S - 1)  (the ``window``)

at the targets in ``[tL, tR]``, the bare sum at the edge targets (``A``, ``B`` non-decreasing in
``t``): each target's window is a contiguous range of the row's sources, kept by two pointers.  A
running float64 sum per column, restarted at 0 when the window empties (no rounding carried from one
cluster of sources to the next); NaN, +inf and -inf are counted apart (a window holding +inf and
-inf is NaN, as the dense sum).
"""

from __future__ import annotations

try:
    import numba
    import numpy as np
    from numba import njit
# numba is optional: this module then defines nothing and ``_core`` uses torch ops
except ImportError:
    numba = None

__all__ = ["runs", "sums"]

if numba is not None:

    @njit(cache=True, inline="always")
    def _floor(a, q):
        return a if q == 1 else a // q

    @njit(cache=True, inline="always")
    def _ceil(a, q):
        return a if q == 1 else -((-a) // q)

    @njit(cache=True)
    def _runs(srow, x, reach, n_rows, T, tL, tR, rr, r0, r1, rb, re):
        """``(runs, targets)`` of the union; writes the runs (row, first and last target, the row's
        sources ``[rb, re)``)."""
        m2, d0, d1, q2 = reach
        n = x.shape[0]
        nr = tot = 0
        lend, rbeg = (
            min(tL, T) - 1,
            max(tR + 1, 0),
        )  # the left edge targets [0, lend], the right ones [rbeg, T)
        e = 0
        for r in range(n_rows):
            b0 = e
            if srow.shape[0] == 0:
                e = n
            else:
                while e < n and srow[e] == r:
                    e += 1
            cur_lo, cur_hi, has = 0, lend, lend >= 0
            right = rbeg <= T - 1
            for i in range(b0, e):
                a = max(_ceil(m2 * x[i] + d0, q2), 0)
                b = min(_floor(m2 * x[i] + d1, q2), T - 1)
                if a > b:
                    continue
                # [a, b] lies in the right edge: the edge now (and later sources in it)
                if right and rbeg < a:
                    a, b, right = rbeg, T - 1, False
                if has and a <= cur_hi + 1:
                    cur_hi = max(cur_hi, b)
                    continue
                if has:
                    rr[nr], r0[nr], r1[nr], rb[nr], re[nr] = r, cur_lo, cur_hi, b0, e
                    nr += 1
                    tot += cur_hi - cur_lo + 1
                cur_lo, cur_hi, has = a, b, True
            if right:
                if has and rbeg <= cur_hi + 1:
                    cur_hi = T - 1
                else:
                    if has:
                        rr[nr], r0[nr], r1[nr], rb[nr], re[nr] = r, cur_lo, cur_hi, b0, e
                        nr += 1
                        tot += cur_hi - cur_lo + 1
                    cur_lo, cur_hi, has = rbeg, T - 1, True
            if has:
                rr[nr], r0[nr], r1[nr], rb[nr], re[nr] = r, cur_lo, cur_hi, b0, e
                nr += 1
                tot += cur_hi - cur_lo + 1
        return nr, tot

    @njit(cache=True, inline="always")
    def _span_one(r, ta, tb, edge, e, state, consts):
        """The targets ``ta..tb`` of row ``r`` (its sources end at ``e``) from ``state = (k, ne, lp,
        hp, s)`` (the next target's place, the next edge's, the window's sources ``[lp, hp)`` and
        their sum); one column of finite values.  Returns the state after them."""
        k, ne, lp, hp, s = state
        x, col, window, S, base, inv, t_out, r_out, out, edges = consts
        m, c0, c1, q = window
        rows = r_out.shape[0] > 0
        for t in range(ta, tb + 1):
            A = max(_ceil(m * t + c0, q), 0)
            B = min(_floor(m * t + c1, q), S - 1)
            while lp < hp and x[lp] < A:  # leaves the window
                s -= col[lp]
                lp += 1
            if lp == hp:  # empty: restart exactly, past the sources before the window
                s = 0.0
                while hp < e and x[hp] < A:
                    hp += 1
                lp = hp
            while hp < e and x[hp] <= B:  # enters it
                s += col[hp]
                hp += 1
            t_out[k] = t
            if rows:
                r_out[k] = r
            if edge:
                out[k] = s
                edges[ne] = k
                ne += 1
            else:
                out[k] = (s + base) * inv
            k += 1
        return k, ne, lp, hp, s

    @njit(cache=True)
    def _sums_one(
        rr, r0, r1, rb, re, x, col, window, S, tL, tR, base, inv, t_out, r_out, out, edges
    ):
        """:func:`sums` for one column of finite values: the running sum in a register; each run as
        three spans (left edge, interior, right edge) so that the interior's loop tests nothing."""
        consts = (x, col, window, S, base, inv, t_out, r_out, out, edges)
        state = (0, 0, 0, 0, 0.0)
        for j in range(rr.shape[0]):
            r, t0, t1, e = rr[j], r0[j], r1[j], re[j]
            if j == 0 or r != rr[j - 1]:
                state = (state[0], state[1], rb[j], rb[j], 0.0)
            state = _span_one(r, t0, min(t1, tL - 1), True, e, state, consts)
            state = _span_one(r, max(t0, tL), min(t1, tR), False, e, state, consts)
            state = _span_one(r, max(t0, tL, tR + 1), t1, True, e, state, consts)

    @njit(cache=True)
    def _sums_many(
        rr, r0, r1, rb, re, x, cols, window, S, tL, tR, base, inv, t_out, r_out, out, edges
    ):
        """:func:`sums` for any columns, non-finite values counted apart."""
        m, c0, c1, q = window
        kc = cols.shape[0]
        acc = np.zeros(kc)
        bad = np.zeros((3, kc), np.int64)  # per column: NaN, +inf, -inf in the window
        k = ne = 0
        lp = hp = 0
        for j in range(rr.shape[0]):
            r, e = rr[j], re[j]
            if j == 0 or r != rr[j - 1]:
                lp = hp = rb[j]
                acc[:] = 0.0
                bad[:] = 0
            for t in range(r0[j], r1[j] + 1):
                A = max(_ceil(m * t + c0, q), 0)
                B = min(_floor(m * t + c1, q), S - 1)
                while lp < hp and x[lp] < A:
                    for c in range(kc):
                        _count(acc, bad, c, cols[c, lp], -1)
                    lp += 1
                if lp == hp:
                    acc[:] = 0.0
                    bad[:] = 0
                    while hp < e and x[hp] < A:
                        hp += 1
                    lp = hp
                while hp < e and x[hp] <= B:
                    for c in range(kc):
                        _count(acc, bad, c, cols[c, hp], 1)
                    hp += 1
                edge = t < tL or t > tR
                for c in range(kc):
                    v = acc[c]
                    if bad[0, c] > 0 or (bad[1, c] > 0 and bad[2, c] > 0):
                        v = np.nan
                    elif bad[1, c] > 0:
                        v = np.inf
                    elif bad[2, c] > 0:
                        v = -np.inf
                    out[c, k] = v if edge else (v + base) * inv
                t_out[k] = t
                if r_out.shape[0]:
                    r_out[k] = r
                if edge:
                    edges[ne] = k
                    ne += 1
                k += 1

    @njit(cache=True, inline="always")
    def _count(acc, bad, c, v, sign):
        if np.isfinite(v):
            acc[c] += sign * v
        elif v != v:
            bad[0, c] += sign
        elif v > 0:
            bad[1, c] += sign
        else:
            bad[2, c] += sign

    @njit(cache=True)
    def _finite(a):
        for v in a.ravel():
            if not np.isfinite(v):
                return False
        return True


def runs(srow, x, reach, n_rows, T, tL, tR):
    """``(runs, targets, edge targets)``: the union's runs as five int64 arrays (row, first and last
    target, the row's sources ``[rb, re)``), the number of targets and of edge targets; ``srow``
    empty for one row."""
    # (at most: untouched pages cost nothing)
    R = np.empty((5, x.shape[0] + 2 * n_rows + 1), np.int64)
    nr, tot = _runs(srow, x, reach, n_rows, T, tL, tR, *R)
    R = R[:, :nr]
    # each run's targets in [tL, tR]
    inner = (np.minimum(R[2], tR) - np.maximum(R[1], tL) + 1).clip(min=0)
    return R, tot, int((R[2] - R[1] + 1 - inner).sum())


def sums(R, x, cols, window, S, tL, tR, base, div, t_out, r_out, out, edges):
    """Writes the targets ``t_out`` (rows ``r_out`` when it is not empty), the window sums ``out``
    (columns x targets) and the positions of the edge targets ``edges`` (sized by :func:`runs`);
    ``window``: ``(m, c0, c1, q)``."""
    base, inv = float(base), 1.0 / float(div)
    if cols.shape[0] == 1 and _finite(cols):
        _sums_one(*R, x, cols[0], window, S, tL, tR, base, inv, t_out, r_out, out[0], edges)
    else:
        _sums_many(*R, x, cols, window, S, tL, tR, base, inv, t_out, r_out, out, edges)
