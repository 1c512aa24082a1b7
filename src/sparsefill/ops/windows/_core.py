"""The shared machinery of the window ops: runs of outputs over stored positions (:func:`_union`),
prefix-sum window sums (:func:`_window_sums`), parts in and results out (see the package
docstring)."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from sparsefill._kernels import index as _index
from sparsefill._kernels.trace import traced
from sparsefill._tensor.parts import coalesced_parts, parts_to_sparse
from sparsefill._tensor.tensor import SparseTensor

aten = torch.ops.aten
_PAIRS_PER_ELEMENT = (
    8  # (element, tap) pairs per dense element beyond which a conv goes the dense way
)


# ---------------------------------------------------------------------- the pattern of a windowed
# scatter
class _Runs(NamedTuple):
    """The union of target intervals, in runs of consecutive targets: run ``r`` holds targets
    ``first[r] ..`` of row ``row[r]``, ``length[r]`` of them, from index ``offset[r]`` of the union;
    ``run`` of each source (-1: it meets no target)."""

    row: torch.Tensor
    first: torch.Tensor
    offset: torch.Tensor
    length: torch.Tensor
    run: torch.Tensor

    def numel(self) -> int:
        return int(self.length.sum())

    def rows_and_targets(self):
        """``(row, t)`` of every target of the union, row-major sorted (no division; ``row`` a
        stride-0 view when every run is in one row)."""
        n = self.numel()
        if not self.row.numel() or bool((self.row == self.row[0]).all()):
            rows = (self.row[:1] if self.row.numel() else self.row.new_zeros(1)).expand(n)
        else:
            rows = torch.repeat_interleave(self.row, self.length, output_size=n)
        t = torch.arange(n, device=self.row.device) + torch.repeat_interleave(
            self.first - self.offset, self.length, output_size=n
        )
        return rows, t

    def edges(self, tL: int, tR: int):
        """Indices in the union of its targets ``t < tL`` or ``t > tR`` (from the runs: no pass over
        targets)."""
        last = self.first + self.length - 1
        nl = (tL - self.first).clamp(0).minimum(self.length)  # the first nl targets of each run
        nr = (last - tR).clamp(0).minimum(self.length - nl)  # and its last nr
        parts = []
        for n, at in ((nl, self.offset), (nr, self.offset + self.length - nr)):
            keep = (n > 0).nonzero().squeeze(1)
            if keep.numel():
                n, at = n[keep], at[keep]
                tot = int(n.sum())
                parts.append(
                    torch.arange(tot, device=at.device)
                    + torch.repeat_interleave(at - (n.cumsum(0) - n), n, output_size=tot)
                )
        return torch.cat(parts) if parts else self.first.new_zeros(0)

    def index(self, t, run):
        """Index in the union of target ``t`` of a source in run ``run`` (any value where ``run`` is
        -1)."""
        if not self.first.numel():
            return t
        run = run.clamp(min=0)
        return (self.offset - self.first)[run] + t


def _union(rows, lo, hi, n_rows: int, T: int, tL: int, tR: int, presorted: bool = True) -> _Runs:
    """Per row, the union of the sources' target intervals ``[lo, hi]`` (empty where ``lo > hi``)
    and of the edge targets ``t < tL`` and ``t > tR`` (every row).  ``presorted``: the sources are
    sorted by row, then by ``lo``, with ``hi`` non-decreasing too (the edges are put in place
    without a sort, and the sources whose intervals touch -- a run of stored elements -- are merged
    first, in one pass)."""
    dev, n = lo.device, lo.numel()
    if presorted and n > 1:
        ok = lo <= hi
        touch = (lo[1:] <= hi[:-1] + 1) & ok[1:] & ok[:-1]
        if n_rows > 1:
            touch &= rows[1:] == rows[:-1]
        # one interval per group of touching ones: the union of fewer intervals
        if bool(touch.any()):
            first = torch.ones(n, dtype=torch.bool, device=dev)
            first[1:] = ~touch
            at = first.nonzero().squeeze(1)
            last = torch.cat([at[1:] - 1, at.new_full((1,), n - 1)])
            R = _union(rows[at], lo[at], hi[last], n_rows, T, tL, tR)
            return R._replace(run=R.run[first.cumsum(0) - 1])
    perm = None
    if not presorted:
        perm = torch.sort(rows * (T + 1) + lo.clamp(0, T), stable=True)[1]
        rows, lo, hi = rows[perm], lo[perm], hi[perm]
    nl, nr = int(min(tL, T) > 0), int(max(tR + 1, 0) < T)
    # an interval starting past the right edge's start lies within the edge (hi < T): started there,
    # the
    if nr:
        # edge (put after the row's sources) comes in order of start
        lo = torch.where(lo <= hi, lo.clamp(max=max(tR + 1, 0)), lo)
    counts = torch.bincount(rows, minlength=n_rows)
    block = counts + nl + nr
    bstart = block.cumsum(0) - block
    src_at = (bstart - (counts.cumsum(0) - counts) + nl)[rows] + torch.arange(n, device=dev)
    starts, ends = lo.new_empty(n + n_rows * (nl + nr)), lo.new_empty(n + n_rows * (nl + nr))
    rws = torch.empty_like(starts)
    starts[src_at], ends[src_at], rws[src_at] = lo, hi, rows
    r = torch.arange(n_rows, device=dev)
    if nl:
        starts[bstart], ends[bstart], rws[bstart] = 0, min(tL, T) - 1, r
    if nr:
        at = bstart + nl + counts
        starts[at], ends[at], rws[at] = max(tR + 1, 0), T - 1, r
    valid = starts <= ends
    K = T + 1
    ks, ke = (rws * K + starts, rws * K + ends) if n_rows > 1 else (starts, ends)
    if not bool(valid.all()):
        ks, ke, rws, starts = ks[valid], ke[valid], rws[valid], starts[valid]
    cm = ke.cummax(0).values if ke.numel() else ke
    new = torch.ones_like(ks, dtype=torch.bool)
    new[1:] = ks[1:] > cm[:-1]
    last = torch.ones_like(new)
    last[:-1] = new[1:]
    row, first = rws[new], starts[new]
    length = cm[last] - ks[new] + 1
    run_all = torch.full_like(valid, -1, dtype=torch.int64)
    run_all[valid] = new.cumsum(0) - 1
    run = run_all[src_at]
    if perm is not None:
        run = torch.empty_like(run).scatter_(0, perm, run)
    return _Runs(row, first, length.cumsum(0) - length, length, run)


class _Targets(NamedTuple):
    """The union's targets: ``idx`` their index over the result's shape (row-major sorted), ``row``
    and ``t`` (their row over the leading dims and position), ``sums`` the window sums ``(columns,
    targets)``, ``edge`` the positions in the union of the targets ``t < tL`` or ``t > tR``."""

    idx: torch.Tensor
    row: torch.Tensor
    t: torch.Tensor
    sums: torch.Tensor
    edge: torch.Tensor


def _window_fn(window):
    """``win(t) = (ceil((m*t + c0) / q), floor((m*t + c1) / q))`` of ``window = (m, c0, c1, q)`` (no
    division when ``q`` is 1: it is the slow pass)."""
    m, c0, c1, q = window
    if q == 1:
        return (lambda t: (t + c0, t + c1)) if m == 1 else (lambda t: (t * m + c0, t * m + c1))
    return lambda t: (
        -torch.div(-(t * m + c0), q, rounding_mode="floor"),
        torch.div(t * m + c1, q, rounding_mode="floor"),
    )


def _windowed(
    rows, x, cols, shape, tL: int, tR: int, window, reach, S: int, base=0.0, div=1.0, work: int = 0
) -> _Targets:
    """The targets of the result of ``shape`` (leading dims x ``T`` positions) that the sources
    reach -- per row the union of the sources' target intervals ``reach(x)`` (clipped to ``[0, T)``)
    and of the edge targets ``t < tL``, ``t > tR`` -- and their window sums over the ``S`` source
    positions (float64)::

        sums[:, k] = (sum of cols[:, e] over the sources e of row(k) with x_e in window(t_k)
                      + base) / div

    at the targets in ``[tL, tR]``, the bare sum at the edge targets; ``window`` and ``reach`` are
    ``(m, c0, c1, q)``: ``t -> (ceil((m*t + c0) / q), floor((m*t + c1) / q))`` (:func:`_window_fn`).
    The sources come sorted by row, then by ``x`` (unique in a row).  One linear pass of the
    compiled kernel (``_kernels``: numba on the CPU, once the segment backend's policy has loaded
    it; ``work`` counts towards it); else :func:`_union` and :func:`_window_sums`."""
    n_rows, T = _index.numel(shape[:-1]), shape[-1]
    cols = cols.to(torch.float64)
    if x.device.type == "cpu" and not traced(x) and _compiled(x.device, work):
        return _windowed_compiled(rows, x, cols, shape, tL, tR, window, reach, S, base, div)
    lo, hi = _window_fn(reach)(x)
    R = _union(rows, lo.clamp(min=0), hi.clamp(max=T - 1), n_rows, T, tL, tR)
    orow, t = R.rows_and_targets()
    edge = R.edges(tL, tR)
    m, c0, _, q = window
    sums = _window_sums(R, t, x, cols, S, _window_fn(window), edge, c0 if m == q == 1 else None)
    if base != 0.0 or div != 1.0:
        raw = sums[:, edge]
        sums = (sums + base) / div
        sums[:, edge] = raw
    return _Targets(_target_index(orow, t, shape), orow, t, sums, edge)


def _compiled(device, work: int) -> bool:
    from sparsefill._kernels.segment import compiled_for

    return compiled_for(device, work) and _kernels() is not None


def _kernels():
    from sparsefill._kernels import windows as mod

    return mod if mod.numba is not None else None


def _windowed_compiled(rows, x, cols, shape, tL, tR, window, reach, S, base, div) -> _Targets:
    k = _kernels()
    n_rows, T = _index.numel(shape[:-1]), shape[-1]
    one = n_rows == 1
    a = lambda t: t.detach().contiguous().numpy()  # noqa: E731
    srow, xs = a(x[:0] if one else rows), a(x)
    R, n, ne = k.runs(srow, xs, reach, n_rows, T, tL, tR)
    # (numpy's zeros come from calloc: the pages of the rows of the size-1 leading dims are never
    # touched)
    idx = torch.from_numpy(k.np.zeros((len(shape), n), k.np.int64)) if one else None
    t = idx[-1] if one else x.new_empty(n)
    row = x.new_empty(0 if one else n)
    sums, edge = cols.new_empty((cols.shape[0], n)), x.new_empty(ne)
    k.sums(
        R,
        xs,
        a(cols),
        window,
        S,
        tL,
        tR,
        base,
        div,
        t.numpy(),
        row.numpy(),
        sums.numpy(),
        edge.numpy(),
    )
    if one:
        return _Targets(idx, x.new_zeros(1).expand(n), t, sums, edge)
    return _Targets(_target_index(row, t, shape), row, t, sums, edge)


def _target_index(rows, t, shape):
    """The index over ``shape`` of targets ``t`` of rows ``rows`` over ``shape[:-1]``."""
    lead = shape[:-1]
    if _index.numel(lead) == 1:
        idx = t.new_zeros((len(shape), t.numel()))
        idx[-1] = t
        return idx
    return torch.cat([_index.unravel(rows, lead), t[None]])


def _taps(x, w: int, a: int, b: int, e: int, q: int, T: int):
    """Targets of sources ``x`` through taps ``j < w`` (``q*t = a*x + b + e*j``): ``(t, ok)`` ``(n,
    w)`` (``ok``: the tap meets a target in ``[0, T)``) and each source's target interval ``(lo,
    hi)``."""
    j = torch.arange(w, device=x.device)
    num = a * x[:, None] + (b + e * j)[None, :]
    t = torch.div(num, q, rounding_mode="floor")
    ok = (t * q == num) & (t >= 0) & (t < T)
    return t, ok, torch.where(ok, t, T).amin(1), torch.where(ok, t, -1).amax(1)


def _window_sums(R: _Runs, t, x, cols, S: int, win, edge, span: int | None = None):
    """``out[c, k] = sum of cols[c, e] over the sources e (positions x) in the window of target
    t[k]``, the window ``win(t) = (first, last)`` source positions (non-decreasing in ``t``) clipped
    to ``[0, S)``, which changes only the windows of the targets ``edge``; ``span``: every window is
    ``(t + span, t + span + w - 1)`` (stride 1: no division, one pass).

    Each run's windows cover a contiguous range of source positions that holds only the run's own
    sources: the sources go to one buffer of those ranges, and a window sum is a difference of its
    prefix sums (float64 accumulation), O(nse + targets) with no search.  Non-finite values are
    counted apart."""
    dev = x.device
    b0 = win(R.first)[0].clamp(0, S)
    b1 = win(R.first + R.length - 1)[1].clamp(-1, S - 1)
    blen = (b1 - b0 + 1).clamp(min=0)
    # buffer index of source position x in run r: shift[r] + x
    shift = blen.cumsum(0) - blen - b0 + 1
    has = R.run >= 0
    if bool(has.all()):
        at = shift[R.run] + x
    else:
        at, cols = shift[R.run[has]] + x[has], cols[:, has]
    finite = bool(torch.isfinite(cols).all())
    if not finite:  # NaN, +inf, -inf counted in three more rows; the finite part summed
        cols = torch.cat(
            [torch.where(torch.isfinite(cols), cols, 0)]
            + [c.to(cols.dtype) for c in (cols.isnan(), cols == math.inf, cols == -math.inf)],
            0,
        )
    buf = torch.zeros((cols.shape[0], int(blen.sum()) + 1), dtype=torch.float64, device=dev)
    buf[:, at] = cols.to(torch.float64)
    csum = buf.cumsum_(1)
    if span is not None:
        w = int(win(t.new_zeros(1))[1]) - span + 1
        lo = t + torch.repeat_interleave(shift + span - 1, R.length, output_size=t.numel())
        hi = lo + w
    else:
        first, last = win(t)
        lo, hi = _clipped(
            first, last, torch.repeat_interleave(shift, R.length, output_size=t.numel()), S
        )
    if span is not None and edge.numel():  # the windows that the signal's ends clip
        run = torch.searchsorted(R.offset, edge, right=True) - 1
        first, last = win(t[edge])
        lo[edge], hi[edge] = _clipped(first, last, shift[run], S)
    out = csum[:, hi] - csum[:, lo]
    if finite:
        return out
    n = out.shape[0] // 4
    fin, nan, pinf, ninf = out[:n], out[n : 2 * n], out[2 * n : 3 * n], out[3 * n :]
    inf = torch.tensor(math.inf, dtype=out.dtype, device=dev)
    return (
        fin
        + torch.where(pinf > 0, inf, 0)
        + torch.where(ninf > 0, -inf, 0)
        + torch.where(nan > 0, inf - inf, 0)
    )


def _clipped(first, last, shift, S: int):
    """Prefix-sum indices ``(lo, hi)`` of windows ``[first, last]`` clipped to ``[0, S)`` (``hi -
    lo`` elements, none where the clipped window is empty)."""
    lo = first.clamp(0, S) + shift - 1
    return lo, torch.maximum(last.clamp(-1, S - 1) + shift, lo)


def _parts(X: SparseTensor):
    """``(rows, positions, values)`` of ``X``'s stored elements, rows row-major over
    ``X.shape[:-1]``."""
    idx, vals = coalesced_parts(X)
    if _index.numel(X.shape[:-1]) == 1:  # (one row: no arithmetic over the leading index rows)
        return idx.new_zeros(idx.shape[1]), idx[-1], vals
    return _index.linearize(idx[:-1], X.shape[:-1]), idx[-1], vals


def _build(rows, t, vals, shape, fill, layout, idx=None) -> SparseTensor:
    """The SparseTensor of ``shape`` holding ``vals`` at the union's targets (rows over
    ``shape[:-1]``; ``idx``: their index, when made already)."""
    idx = _target_index(rows, t, shape) if idx is None else idx
    return parts_to_sparse(idx, vals, shape, fill, layout=layout, coalesced=True)


def _meta(func, args, kwargs):
    """``func`` on meta tensors of the arguments' shapes: torch's own argument checks and result
    shapes."""
    m = lambda a: (
        torch.empty(a.shape, dtype=a.dtype, device="meta") if isinstance(a, torch.Tensor) else a
    )  # noqa: E731
    return func(*map(m, args), **{k: m(v) for k, v in kwargs.items()})


def _refuse_indefinite(X, what):
    if isinstance(X, SparseTensor) and X._indefinite:
        raise ValueError(
            f"sparsefill: {what} of a SparseTensor with indefinite fill: a window over "
            "masked-out elements has no dense meaning; give the tensor a fill first "
            "(A.to_sparse(fill_value=...))"
        )


def _scatter(n: int, dst, ok, vals):
    """``out[dst[ok]] += vals[ok]`` into ``n`` zeros (``vals`` broadcast to ``dst``'s shape)."""
    v = vals.expand(dst.shape)[ok]
    return v.new_zeros(n).index_add_(0, dst[ok], v)


def _fill_term(fill, weight, count):
    """``fill`` times the total ``weight`` of the fill-valued taps (``count`` of them); a non-finite
    fill is what it gives wherever a fill-valued tap exists (weights are positive there: the pooling
    case)."""
    if bool(torch.isfinite(fill)):
        return fill * weight
    return torch.where(count > 0, fill, fill.new_zeros(()))


# ---------------------------------------------------------------------- avg_pool1d (avg_pool2d,
# kernel height 1)
