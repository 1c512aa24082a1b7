"""Compiled CPU segment kernels (numba; imported lazily by ``_kernels``, absent without numba).

Every reduction kernel is generated from one template by :func:`kernel` (``form``, ``op``, ``arg``),
with ``op`` one of ``"sum"``, ``"wsum"`` (weighted), ``"mean"``, ``"max"``, ``"min"``, and ``arg``
(max/min) also recording the first position of the extreme:

* ``"sorted"``: ``f(x, offs, rows, w, scale, out, arg, s0, s1, bad)`` reduces the segments ``s0 <= s
  < s1``, segment ``s`` holding the positions ``offs[s] <= k < offs[s+1]`` (with one column, the
  running value stays in a local: the fast path of 1-D data, used for the sums too);
* ``"scatter"``: ``f(x, ids, rows, w, scale, out, arg, lo, hi, p0, p1, bad)`` reduces, in input
  order, the positions ``p0 <= i < p1`` whose segment ``ids[i]`` lies in ``[lo, hi)`` (unsorted ids,
  no sort);
* ``"merge"``: ``f(out, arg, parts, part_args, scale, s0, s1)`` folds the partial results
  ``parts[t]`` (of later position ranges, in order) into ``out[s0:s1]``.

Position ``k`` reads row ``rows[k]`` of ``x`` (``k`` itself when ``rows`` is empty) with weight
``w[k]`` (``"wsum"``); for max/min the sorted kernel writes ``w[0]`` (when ``w`` is not empty) into
every row of an empty segment.  A kernel writes exactly the rows ``out[s0:s1]`` (``out[lo:hi]``),
starting from the identity (0, -inf, +inf; ``arg = -1``): disjoint ranges run on separate threads
with no synchronisation.  ``"mean"`` divides a row by ``max(scale[s], 1)`` (the count) at the end
(the scatter kernel only when ``scale`` is not empty).  A row index outside ``[0, M)`` is never
read: the kernel keeps the smallest such position in ``bad[0]`` (-1 if none) and the caller raises;
the scatter kernel also keeps in ``bad[1]`` the first position whose id is outside ``[0,
len(out))``. Max/min propagate NaN (as torch).

Beside them: ``adagrad_coalesced`` / ``rowwise_adagrad_coalesced`` / ``coalesce_rows`` (the sparse
optimizers of ``_optim``: the gradient rows of each distinct row summed with no sort, then one
update of the row) and ``gather_runs`` (runs of a 1-D tensor copied to new places:
``KeyedJaggedBatch``'s lists grouped by key).

The loops and the combine step are written once; ``op`` and ``arg`` are closure constants (plain
flags, so the compiled code is cached on disk), and numba compiles one specialised loop per variant
(the weight and NaN branches resolved at compile time, the column loop vectorised).  Random rows
(the out rows of unsorted ids, the table rows of a fused gather) are prefetched ``_AHEAD``
positions ahead (``llvm.prefetch``): 1.6x faster than waiting on each one.
"""

from __future__ import annotations

import functools

try:
    import numba
    import numpy as np
    from llvmlite import ir
    from numba import njit, types
    from numba.core import cgutils
    from numba.extending import intrinsic
# numba is optional: this module then defines nothing and ``_kernels`` uses torch ops
except ImportError:
    numba = None

__all__ = [
    "kernel",
    "fixed_width",
    "offsets_of",
    "count_ids",
    "counting_sort",
    "sorted_offsets",
    "adagrad_coalesced",
    "rowwise_adagrad_coalesced",
    "coalesce_rows",
    "gather_runs",
    "sampled_dot",
    "OPS",
]

OPS = ("sum", "wsum", "mean", "max", "min")
_AHEAD = 16  # positions
_L2_BYTES = 1 << 20
_PAIR_BYTES = 384  # the longest row (bytes) that max/min read in pairs
_INT64_MAX = (1 << 63) - 1


if numba is not None:

    @intrinsic
    def _prefetch(typingctx, arr, i, j):
        """Hint the cache to fetch ``arr[i, j]`` (never faults, whatever the index)."""

        def codegen(context, builder, sig, args):
            aryty = sig.args[0]
            ary = context.make_array(aryty)(context, builder, args[0])
            ptr = cgutils.get_item_pointer(
                context, builder, aryty, ary, [args[1], args[2]], wraparound=False
            )
            i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
            fn = cgutils.get_or_insert_function(
                builder.module,
                ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                "llvm.prefetch.p0",
            )
            builder.call(
                fn,
                [
                    builder.bitcast(ptr, i8p),
                    ir.Constant(i32, 1),
                    ir.Constant(i32, 3),
                    ir.Constant(i32, 1),
                ],
            )
            return context.get_dummy_value()

        return types.void(arr, i, j), codegen

    @njit(inline="always")
    def _prefetch_row(a, r, D):
        j = 0
        while j < D:  # one hint per cache line (a stepped range measured slower at D=1)
            _prefetch(a, r, j)
            j += 64 // a.itemsize if a.itemsize < 64 else 1

    # The steps, inlined into the loops below, where the flags are compile-time constants (SUM:
    # sum/wsum/mean; W: weighted; MEAN: divide by the count; LARGEST: max; ARG: track the arg). (The
    # row range check stays written out in the loops: as a helper it measured 1.6x slower.)
    @njit(inline="always")
    def _start(out, s, arg, D, SUM, LARGEST, ARG):  # out[s] <- the identity
        for d in range(D):
            out[s, d] = 0 if SUM else (-np.inf if LARGEST else np.inf)
        if ARG:
            for d in range(D):
                arg[s, d] = -1

    @njit(inline="always")
    # out[s] <- out[s] (+) x[r] (position k)
    def _combine(out, s, arg, x, r, w, k, D, SUM, W, LARGEST, ARG):
        if SUM:
            if W:
                wk = w[k]
                for d in range(D):
                    out[s, d] += wk * x[r, d]
            elif D == 1:
                out[s, 0] += x[r, 0]
            else:
                for d in range(D):
                    out[s, d] += x[r, d]
        elif ARG:  # the first extreme; a NaN wins over numbers
            for d in range(D):
                v = x[r, d]
                c = out[s, d]
                better = (v > c) if LARGEST else (v < c)
                if arg[s, d] < 0 or better or (v != v and c == c):
                    out[s, d] = v
                    arg[s, d] = k
        elif D == 1:
            out[s, 0] = _pick(out[s, 0], x[r, 0], LARGEST)
        else:
            for d in range(D):
                out[s, d] = _pick(out[s, d], x[r, d], LARGEST)

    @njit(inline="always")
    def _step1(acc, x1, r, w, k, SUM, W, LARGEST):  # acc (+) x1[r] (position k), x1 the one column
        if SUM:
            return acc + w[k] * x1[r] if W else acc + x1[r]
        return _pick(acc, x1[r], LARGEST)

    @njit(inline="always")
    # max / min of two values, NaN first (the non-short-circuit | vectorises)
    def _pick(c, v, LARGEST):
        return c if (((c >= v) if LARGEST else (c <= v)) | (c != c)) else v

    @njit(inline="always")
    def _combine2(out, s, x, r, q, D, LARGEST):  # out[s] <- max(out[s], max(x[r], x[q])) (or min)
        for d in range(D):
            out[s, d] = _pick(out[s, d], _pick(x[r, d], x[q, d], LARGEST), LARGEST)

    @njit(inline="always")
    # (o, a) <- (o, a) (+) (p, pa), p from later positions
    def _combine_arg(o, a, p, pa, D, LARGEST):
        for d in range(D):
            v = p[d]
            c = o[d]
            better = (v > c) if LARGEST else (v < c)
            if pa[d] >= 0 and (a[d] < 0 or better or (v != v and c == c)):
                o[d] = v
                a[d] = pa[d]

    @njit(inline="always")
    def _finish(out, s, scale, D, MEAN):
        if MEAN and scale.shape[0] > 0:
            n = max(scale[s], 1)
            for d in range(D):
                out[s, d] /= n

    @njit(inline="always")
    def _merge1(a, b, SUM, LARGEST):
        return a + b if SUM else _pick(a, b, LARGEST)

    @njit(inline="always")
    def _sorted_one_column(x, x1, offs, rows, w, scale, out, s0, s1, bad, SUM, W, MEAN, LARGEST):
        """The sorted kernel (no arg) for one column, ``x1`` = ``x`` as 1-D: two running values in
        locals (registers), every other position each, so that two additions are in flight (1.6-2x
        faster)."""
        M = x1.shape[0]
        has_rows = rows.shape[0] > 0
        n = rows.shape[0]
        # (rows read at random: prefetched past the L2 cache)
        pf = has_rows and M * x1.itemsize > _L2_BYTES
        for s in range(s0, s1):
            _start(out, s, out, 1, SUM, LARGEST, False)
            a0 = out[s, 0]
            a1 = a0
            k, end = offs[s], offs[s + 1]
            # the rows are the positions: in range, checked once
            if not has_rows and k >= 0 and end <= M:
                while k + 1 < end:
                    a0 = _step1(a0, x1, k, w, k, SUM, W, LARGEST)
                    a1 = _step1(a1, x1, k + 1, w, k + 1, SUM, W, LARGEST)
                    k += 2
            while k + 1 < end:
                if pf and k + 1 + _AHEAD < n:
                    _prefetch(x, rows[k + _AHEAD], 0)
                    _prefetch(x, rows[k + 1 + _AHEAD], 0)
                r = rows[k] if has_rows else k
                q = rows[k + 1] if has_rows else k + 1
                if r < 0 or r >= M or q < 0 or q >= M:
                    break  # the checked loop below takes over
                a0 = _step1(a0, x1, r, w, k, SUM, W, LARGEST)
                a1 = _step1(a1, x1, q, w, k + 1, SUM, W, LARGEST)
                k += 2
            while k < end:
                r = rows[k] if has_rows else k
                if r < 0 or r >= M:
                    bad[0] = k if bad[0] < 0 else min(bad[0], k)
                else:
                    a0 = _step1(a0, x1, r, w, k, SUM, W, LARGEST)
                k += 1
            out[s, 0] = _merge1(a0, a1, SUM, LARGEST)
            _finish(out, s, scale, 1, MEAN)
            if not SUM and w.shape[0] > 0 and offs[s] == end:  # max/min: the caller's empty value
                out[s, 0] = w[0]

    def _template(op: str, with_arg: bool, width: int = 0):
        """The (sorted, scatter, merge) kernels of one combine op (the closures hold only flags:
        cacheable); ``width`` > 0: a sorted kernel for rows of exactly that many columns (see
        :func:`kernel`)."""
        SUM = op in ("sum", "wsum", "mean")
        W = op == "wsum"
        MEAN = op == "mean"
        LARGEST = op == "max"
        ARG = with_arg and not SUM
        # max/min without arg take the rows of a segment in pairs when a row is short (at most
        # _PAIR_BYTES): the running extreme is then stored once per two rows (1.5-2x faster for D =
        # 8..64 float32).  Longer rows go one at a time: two interleaved streams of rows that far
        # apart ran at a third of the speed (D >= 120 float32).
        PAIRS = not SUM and not ARG

        @njit(nogil=True, cache=True)
        def sorted_kernel(
            x, offs, rows, w, scale, out, arg, s0, s1, bad
        ):  # pragma: no cover - compiled
            M = x.shape[0]
            D = width if width else x.shape[1]
            has_rows = rows.shape[0] > 0
            n = rows.shape[0]
            pairs = PAIRS and D * x.itemsize <= _PAIR_BYTES
            # one column, 1-D: the running value in a local (a register), 1.7x faster
            if D == 1 and not ARG:
                _sorted_one_column(
                    x, x.reshape(M), offs, rows, w, scale, out, s0, s1, bad, SUM, W, MEAN, LARGEST
                )
                return
            for s in range(s0, s1):
                _start(out, s, arg, D, SUM, LARGEST, ARG)
                k, end = offs[s], offs[s + 1]
                while k < end:
                    if has_rows and k + _AHEAD < n:
                        _prefetch_row(x, rows[k + _AHEAD], D)
                    r = rows[k] if has_rows else k
                    if r < 0 or r >= M:
                        bad[0] = k if bad[0] < 0 else min(bad[0], k)
                        k += 1
                        continue
                    q = (rows[k + 1] if has_rows else k + 1) if pairs and k + 1 < end else -1
                    if q >= 0 and q < M:
                        if has_rows and k + 1 + _AHEAD < n:
                            _prefetch_row(x, rows[k + 1 + _AHEAD], D)
                        _combine2(out, s, x, r, q, D, LARGEST)
                        k += 2
                        continue
                    _combine(out, s, arg, x, r, w, k, D, SUM, W, LARGEST, ARG)
                    k += 1
                _finish(out, s, scale, D, MEAN)
                # max/min: the caller's empty value
                if not SUM and w.shape[0] > 0 and offs[s] == end:
                    for d in range(D):
                        out[s, d] = w[0]

        @njit(nogil=True, cache=True)
        def scatter_kernel(
            x, ids, rows, w, scale, out, arg, lo, hi, p0, p1, bad
        ):  # pragma: no cover - compiled
            M, D = x.shape
            for s in range(lo, hi):
                _start(out, s, arg, D, SUM, LARGEST, ARG)
            has_rows = rows.shape[0] > 0
            # prefetch the out rows / the rows read at random only when they outgrow the L2 cache
            pf_out = out.shape[0] * D * out.itemsize > _L2_BYTES
            pf_x = has_rows and x.size * x.itemsize > _L2_BYTES
            one = D == 1 and not ARG  # one column: 1-D views index faster (1.2x)
            x1, out1 = x.reshape(x.size), out.reshape(out.size)
            for i in range(p0, p1):
                if i + _AHEAD < p1:
                    if pf_out:
                        _prefetch_row(out, ids[i + _AHEAD], D)
                    if pf_x:
                        _prefetch_row(x, rows[i + _AHEAD], D)
                s = ids[i]
                if s < lo or s >= hi:
                    if (s < 0 or s >= out.shape[0]) and bad[1] < 0:
                        bad[1] = i
                    continue
                r = rows[i] if has_rows else i
                if r < 0 or r >= M:
                    bad[0] = i if bad[0] < 0 else min(bad[0], i)
                    continue
                if one:
                    out1[s] = _step1(out1[s], x1, r, w, i, SUM, W, LARGEST)
                else:
                    _combine(out, s, arg, x, r, w, i, D, SUM, W, LARGEST, ARG)
            for s in range(lo, hi):
                _finish(out, s, scale, D, MEAN)

        merge_kernel = _merge_template(SUM, MEAN, LARGEST, ARG)
        return {"sorted": sorted_kernel, "scatter": scatter_kernel, "merge": merge_kernel}

    def _merge_template(SUM: bool, MEAN: bool, LARGEST: bool, ARG: bool):
        """The merge kernel of one combine op (:func:`_template`'s flags): ``out[s]`` combined with
        each partial result ``parts[t, s]`` of the threads, then finished (the mean's scale)."""

        @njit(nogil=True, cache=True)
        def merge_kernel(out, arg, parts, part_args, scale, s0, s1):  # pragma: no cover - compiled
            D = out.shape[1]
            for s in range(s0, s1):
                for t in range(parts.shape[0]):
                    if ARG:
                        _combine_arg(out[s], arg[s], parts[t, s], part_args[t, s], D, LARGEST)
                    else:
                        _combine(out, s, arg, parts[t], s, scale, 0, D, SUM, False, LARGEST, False)
                _finish(out, s, scale, D, MEAN)

        return merge_kernel

    @functools.cache
    def kernel(form: str, op: str, arg: bool = False, width: int = 0):
        """The compiled kernel of ``form`` (``"sorted"``, ``"scatter"``, ``"merge"``) for ``op``
        (see above).

        ``width`` (sorted form only): the kernel is compiled for ``x`` of exactly that many columns
        (:func:`fixed_width` says when that pays)."""
        if op not in OPS:
            raise ValueError(f"op must be one of {OPS}, got {op!r}")
        return _template(op, arg, width if form == "sorted" else 0)[form]

    def fixed_width(op: str, arg: bool, D: int, itemsize: int) -> int:
        """``D`` where sorted max/min (no arg) over rows of whole cache lines, 128 to
        ``_PAIR_BYTES`` bytes (float32 D = 32, 48, 64, 80, 96), get a kernel compiled for that width
        (its column loop fully unrolled: 5-10% faster at D = 48, 64 float32, measured; shorter rows
        ran slower so), else 0 (one kernel for every width).  At most 5 widths per dtype, each
        compiled once (~1.5 s) and cached on disk."""
        row = D * itemsize
        return (
            D
            if op in ("max", "min") and not arg and 128 <= row <= _PAIR_BYTES and row % 64 == 0
            else 0
        )

    # ------------------------------------------------------------------------------- ids
    @njit(nogil=True, cache=True)
    def offsets_of(lengths, offs):  # pragma: no cover - compiled
        """``offs[s] = lengths[:s].sum()`` (``S + 1`` entries) in one pass; returns ``(first s with
        lengths[s] < 0, first s where the int64 sum overflows)``, each -1 if none."""
        offs[0] = 0
        acc = 0
        neg = -1
        over = -1
        for s in range(lengths.shape[0]):
            v = lengths[s]
            if v < 0 and neg < 0:
                neg = s
            # (tested before adding: no wrap relied on)
            if v > 0 and acc >= 0 and v > _INT64_MAX - acc and over < 0:
                over = s
            acc += v
            offs[s + 1] = acc
        return neg, over

    @njit(nogil=True, cache=True)
    def count_ids(ids, counts, lo, hi):  # pragma: no cover - compiled
        """``counts[s] += #{lo <= i < hi: ids[i] == s}``; returns the first position in ``[lo, hi)``
        with an id outside ``[0, S)``, or -1."""
        S = counts.shape[0]
        for i in range(lo, hi):
            v = ids[i]
            if v < 0 or v >= S:
                return i
            counts[v] += 1
        return -1

    @njit(nogil=True, cache=True)
    def sorted_offsets(ids, offs):  # pragma: no cover - compiled
        """When ``ids`` is non-decreasing and in ``[0, S)`` (``S + 1 = len(offs)``), ``offs`` gets
        the segment offsets (segment ``s`` holds the positions ``offs[s] <= i < offs[s+1]``) and the
        result is -1; otherwise the first position that descends or is out of range (``offs`` is
        then partly written)."""
        S = offs.shape[0] - 1
        s = 0
        offs[0] = 0
        for i in range(ids.shape[0]):
            v = ids[i]
            if v < s or v >= S:
                return i
            while s < v:
                s += 1
                offs[s] = i
        while s < S:
            s += 1
            offs[s] = ids.shape[0]
        return -1

    @njit(cache=True, nogil=True)
    def counting_sort(ids, order, offs):  # pragma: no cover - compiled
        """Stable counting sort of ``ids`` (in range) into ``order``; ``offs`` (S+1) holds the group
        offsets."""
        cur = offs[:-1].copy()
        for i in range(ids.shape[0]):
            v = ids[i]
            order[cur[v]] = i
            cur[v] += 1

    # ------------------------------------------------------------------------------- optimizers
    # Coalesced row updates (``_optim``): the gradient rows of every distinct row of ``idx`` are
    # summed in position order into ``acc[s]`` (``rows[s]`` = that row, ``s`` in order of first
    # occurrence), then the row is updated once -- no sort: ``mark[r]`` (-1 on entry, restored on
    # exit) holds the slot of row ``r``.  A call handles the rows ``r % T == t`` only: T calls on
    # disjoint rows run on separate threads (each with its own ``rows`` and ``acc``, ``mark``
    # shared).  The indices are in range (the caller checked them).  ``error_model="numpy"``: a
    # division by zero gives inf/NaN (as torch) rather than a test per element, which kept the
    # update loop from vectorising (4.5x slower).
    @njit(inline="always")
    def _coalesce_rows(idx, grad, mark, rows, acc, t, T):
        D = grad.shape[1]
        u = 0
        for p in range(idx.shape[0]):
            r = idx[p]
            if T > 1 and r % T != t:
                continue
            s = mark[r]
            if s < 0:
                s = u
                mark[r] = s
                rows[s] = r
                u += 1
                for j in range(D):
                    acc[s, j] = grad[p, j]
            else:
                for j in range(D):
                    acc[s, j] += grad[p, j]
        return u

    @njit(nogil=True, cache=True, error_model="numpy")
    def adagrad_coalesced(
        param, moment, idx, grad, mark, rows, acc, lr, eps, wd, decay, t, T
    ):  # pragma: no cover
        """Per distinct row ``r`` with summed gradient ``g`` (``+ wd * w``), per element:
        ``h = decay * h + g * g;  w += -lr * (g / (sqrt(h) + eps))`` (torch.optim.Adagrad's sparse
        step, operation for operation).  Returns the number of rows updated."""
        u = _coalesce_rows(idx, grad, mark, rows, acc, t, T)
        D = grad.shape[1]
        for s in range(u):
            if s + _AHEAD < u:
                _prefetch_row(param, rows[s + _AHEAD], D)
                _prefetch_row(moment, rows[s + _AHEAD], D)
            r = rows[s]
            mark[r] = -1
            for j in range(D):
                g = acc[s, j] + wd * param[r, j] if wd != 0 else acc[s, j]
                h = moment[r, j] * decay + g * g if decay != 1 else moment[r, j] + g * g
                moment[r, j] = h
                param[r, j] += -lr * (g / (np.sqrt(h) + eps))
        return u

    @njit(nogil=True, cache=True, error_model="numpy")
    def rowwise_adagrad_coalesced(
        param, moment, idx, grad, mark, rows, acc, lr, eps, wd, t, T
    ):  # pragma: no cover
        """Row-wise Adagrad (one ``h`` per row): ``h += mean_j g_j^2;  w -= (lr / (sqrt(h) + eps)) *
        g``."""
        u = _coalesce_rows(idx, grad, mark, rows, acc, t, T)
        D = grad.shape[1]
        for s in range(u):
            if s + _AHEAD < u:
                _prefetch_row(param, rows[s + _AHEAD], D)
            r = rows[s]
            mark[r] = -1
            if wd != 0:
                for j in range(D):
                    acc[s, j] += wd * param[r, j]
            sq = 0.0
            for j in range(D):
                sq += acc[s, j] * acc[s, j]
            h = moment[r] + sq / D
            moment[r] = h
            step = lr / (np.sqrt(h) + eps)
            for j in range(D):
                param[r, j] -= step * acc[s, j]
        return u

    @njit(nogil=True, cache=True)
    def coalesce_rows(idx, grad, mark, rows, acc):  # pragma: no cover - compiled
        """The coalescing alone (for the updates written in torch ops); returns the count of
        rows."""
        u = _coalesce_rows(idx, grad, mark, rows, acc, 0, 1)
        for s in range(u):
            mark[rows[s]] = -1
        return u

    # ------------------------------------------------------------------------------- lists
    @njit(nogil=True, cache=True)
    def gather_runs(src, starts, lengths, offsets, out):  # pragma: no cover - compiled
        """``out[offsets[j]:offsets[j] + lengths[j]] = src[starts[j]:starts[j] + lengths[j]]`` for
        every ``j`` (runs in range: the caller built them)."""
        for j in range(lengths.shape[0]):
            a, o = starts[j], offsets[j]
            for i in range(lengths[j]):
                out[o + i] = src[a + i]

    # ------------------------------------------------------------------------------- products
    # The dot products may be summed in any order (reassociated: vectorised, 2.2x faster at 32
    # columns); NaN and inf keep their meaning (no "nnan"/"ninf" flags).
    @njit(nogil=True, cache=True, fastmath={"reassoc", "contract", "nsz"})
    def sampled_dot(u, v, rows, cols, out, p0, p1, bad):  # pragma: no cover - compiled
        """``out[i] = u[rows[i]] . v[cols[i]]`` for ``p0 <= i < p1`` (the sampled product ``(u @
        v.T)[rows, cols]``), summed in the dtype of ``out`` in any order; the rows read at random
        are prefetched ``_AHEAD`` positions ahead.  A pair out of range is not read (``out[i] =
        0``): the smallest such position is kept in ``bad[0]``."""
        M, K, D = u.shape[0], v.shape[0], u.shape[1]
        pf_u = u.size * u.itemsize > _L2_BYTES
        pf_v = v.size * v.itemsize > _L2_BYTES
        zero = out.dtype.type(0)
        for i in range(p0, p1):
            if i + _AHEAD < p1:
                if pf_u:
                    _prefetch_row(u, rows[i + _AHEAD], D)
                if pf_v:
                    _prefetch_row(v, cols[i + _AHEAD], D)
            r, c = rows[i], cols[i]
            if r < 0 or r >= M or c < 0 or c >= K:
                bad[0] = i if bad[0] < 0 else min(bad[0], i)
                out[i] = zero
                continue
            acc = zero
            for d in range(D):
                acc += u[r, d] * v[c, d]
            out[i] = acc
