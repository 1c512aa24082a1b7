"""Sliding windows along the last dim: ``avg_pool1d`` and ``conv1d`` of a SparseTensor, forward and backward.

A window of a signal with fill ``c`` that holds no stored element has the interior value ``op(c, ...,
c)``; only the windows within reach of a stored element, and those that touch the padding at either end,
differ.  So, for ``X`` of shape ``(..., L)`` (every dim sparse) with stored positions ``P`` per row::

    avg_pool1d(X, w, s, p)[..., o] == mean(Xpad[..., o*s - p : o*s - p + w])
                                   == fill  unless the window meets P or the padding
    conv1d(X, W, b, s, p, d)[n, co, o] == b[co] + sum_{ci,j} W[co, ci, j] * Xpad[n, ci, o*s - p + d*j]

The result stores the union of the windows over the stored elements and the edge windows: at most
``nse * w / s + rows * 2 * (p / s + 1)`` elements (:func:`_union`, runs of consecutive outputs, no sort
when the sources come sorted).  A moving sum (``avg_pool``; ``conv1d`` with one weight for all taps, one
channel per group) is a difference of prefix sums over one buffer of the runs (:func:`_window_sums`): O(nse
+ outputs); any other kernel scatters its (element, tap) pairs: O(nse * w * channels).  The gradients are
the transposed windows of the gradient's stored elements (as sparse as it is) and a closed form for the
fill; ``conv1d``'s weight gradient adds the stored pairs (a lookup per (element, tap)).  Where the result
is dense by nature -- per output channel interiors that differ, a stride that does not divide the window
with a nonzero gradient fill -- it is returned dense (forward) or computed by the densify fallback
(backward); so is a kernel whose pairs would outnumber 8 times the dense operand's elements (their index
arrays would take more memory than the dense way).

>>> import torch, torch.nn.functional as F, sparsefill
>>> x = sparsefill.sparse_coo_tensor([[3]], [8.], (8,), fill_value=5.)
>>> y = F.avg_pool1d(x[None, None], 3, stride=1)[0, 0]
>>> y.indices().tolist(), y.values().tolist(), float(y.fill_value())
([[1, 2, 3]], [6.0, 6.0, 6.0], 5.0)
>>> torch.equal(y.to_dense(), F.avg_pool1d(x.to_dense()[None, None], 3, stride=1)[0, 0])
True

Supported natively: ``avg_pool2d`` with a kernel of height 1 (what ``avg_pool1d`` calls; every stride,
padding, ``ceil_mode``, ``count_include_pad``, ``divisor_override``; any fill, NaN and inf included);
``convolution`` in 1-D (not transposed; dense weight and bias; stride, padding, dilation, groups; a
finite fill).  A floating dtype, every dim sparse -- or, for ``avg_pool``, a hybrid tensor whose dense dims
hold the window (the op then runs on every stored slice and on the fill: any 2-d window over the last two
dense dims).  Anything else goes to the densify fallback (exact); an indefinite fill raises (a window over
masked-out elements has no dense meaning).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .. import _index
from .._convert import coalesced_parts, dense_of, parts_to_sparse, rewrap
from .._policy import check_densify
from .._tensor import SparseTensor
from .registry import register

aten = torch.ops.aten
_PAIRS_PER_ELEMENT = 8  # (element, tap) pairs per dense element beyond which a conv goes the dense way


# ---------------------------------------------------------------------- the pattern of a windowed scatter
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
        """``(row, t)`` of every target of the union, row-major sorted (no division; ``row`` a stride-0 view
        when every run is in one row)."""
        n = self.numel()
        if not self.row.numel() or bool((self.row == self.row[0]).all()):
            rows = (self.row[:1] if self.row.numel() else self.row.new_zeros(1)).expand(n)
        else:
            rows = torch.repeat_interleave(self.row, self.length, output_size=n)
        t = torch.arange(n, device=self.row.device) + torch.repeat_interleave(self.first - self.offset, self.length,
                                                                              output_size=n)
        return rows, t

    def edges(self, tL: int, tR: int):
        """Indices in the union of its targets ``t < tL`` or ``t > tR`` (from the runs: no pass over targets)."""
        last = self.first + self.length - 1
        nl = (tL - self.first).clamp(0).minimum(self.length)  # the first nl targets of each run
        nr = (last - tR).clamp(0).minimum(self.length - nl)  # and its last nr
        parts = []
        for n, at in ((nl, self.offset), (nr, self.offset + self.length - nr)):
            keep = (n > 0).nonzero().squeeze(1)
            if keep.numel():
                n, at = n[keep], at[keep]
                tot = int(n.sum())
                parts.append(torch.arange(tot, device=at.device) + torch.repeat_interleave(at - (n.cumsum(0) - n), n,
                                                                                           output_size=tot))
        return torch.cat(parts) if parts else self.first.new_zeros(0)

    def index(self, t, run):
        """Index in the union of target ``t`` of a source in run ``run`` (any value where ``run`` is -1)."""
        if not self.first.numel():
            return t
        run = run.clamp(min=0)
        return (self.offset - self.first)[run] + t


def _union(rows, lo, hi, n_rows: int, T: int, tL: int, tR: int, presorted: bool = True) -> _Runs:
    """Per row, the union of the sources' target intervals ``[lo, hi]`` (empty where ``lo > hi``) and of the
    edge targets ``t < tL`` and ``t > tR`` (every row).  ``presorted``: the sources are sorted by row, then
    by ``lo``, with ``hi`` non-decreasing too (the edges are put in place without a sort, and the sources
    whose intervals touch -- a run of stored elements -- are merged first, in one pass)."""
    dev, n = lo.device, lo.numel()
    if presorted and n > 1:
        ok = lo <= hi
        touch = (lo[1:] <= hi[:-1] + 1) & ok[1:] & ok[:-1]
        if n_rows > 1:
            touch &= rows[1:] == rows[:-1]
        if bool(touch.any()):  # one interval per group of touching ones: the union of fewer intervals
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


def _taps(x, w: int, a: int, b: int, e: int, q: int, T: int):
    """Targets of sources ``x`` through taps ``j < w`` (``q*t = a*x + b + e*j``): ``(t, ok)`` ``(n, w)``
    (``ok``: the tap meets a target in ``[0, T)``) and each source's target interval ``(lo, hi)``."""
    j = torch.arange(w, device=x.device)
    num = a * x[:, None] + (b + e * j)[None, :]
    t = torch.div(num, q, rounding_mode="floor")
    ok = (t * q == num) & (t >= 0) & (t < T)
    return t, ok, torch.where(ok, t, T).amin(1), torch.where(ok, t, -1).amax(1)


def _window_sums(R: _Runs, t, x, cols, S: int, win, edge, span: int | None = None):
    """``out[c, k] = sum of cols[c, e] over the sources e (positions x) in the window of target t[k]``, the
    window ``win(t) = (first, last)`` source positions (non-decreasing in ``t``) clipped to ``[0, S)``, which
    changes only the windows of the targets ``edge``; ``span``: every window is ``(t + span, t + span + w - 1)``
    (stride 1: no division, one pass).

    Each run's windows cover a contiguous range of source positions that holds only the run's own sources:
    the sources go to one buffer of those ranges, and a window sum is a difference of its prefix sums
    (float64 accumulation), O(nse + targets) with no search.  Non-finite values are counted apart."""
    dev = x.device
    b0 = win(R.first)[0].clamp(0, S)
    b1 = win(R.first + R.length - 1)[1].clamp(-1, S - 1)
    blen = (b1 - b0 + 1).clamp(min=0)
    shift = blen.cumsum(0) - blen - b0 + 1  # buffer index of source position x in run r: shift[r] + x
    has = R.run >= 0
    if bool(has.all()):
        at = shift[R.run] + x
    else:
        at, cols = shift[R.run[has]] + x[has], cols[:, has]
    finite = bool(torch.isfinite(cols).all())
    if not finite:  # NaN, +inf, -inf counted in three more rows; the finite part summed
        cols = torch.cat([torch.where(torch.isfinite(cols), cols, 0)] + [c.to(cols.dtype) for c in (
            cols.isnan(), cols == math.inf, cols == -math.inf)], 0)
    buf = torch.zeros((cols.shape[0], int(blen.sum()) + 1), dtype=torch.float64, device=dev)
    buf[:, at] = cols.to(torch.float64)
    csum = buf.cumsum_(1)
    if span is not None:
        w = int(win(t.new_zeros(1))[1]) - span + 1
        lo = t + torch.repeat_interleave(shift + span - 1, R.length, output_size=t.numel())
        hi = lo + w
    else:
        first, last = win(t)
        lo, hi = _clipped(first, last, torch.repeat_interleave(shift, R.length, output_size=t.numel()), S)
    if span is not None and edge.numel():  # the windows that the signal's ends clip
        run = torch.searchsorted(R.offset, edge, right=True) - 1
        first, last = win(t[edge])
        lo[edge], hi[edge] = _clipped(first, last, shift[run], S)
    out = csum[:, hi] - csum[:, lo]
    if finite:
        return out
    n = out.shape[0] // 4
    fin, nan, pinf, ninf = out[:n], out[n:2 * n], out[2 * n:3 * n], out[3 * n:]
    inf = torch.tensor(math.inf, dtype=out.dtype, device=dev)
    return fin + torch.where(pinf > 0, inf, 0) + torch.where(ninf > 0, -inf, 0) + torch.where(nan > 0, inf - inf, 0)


def _clipped(first, last, shift, S: int):
    """Prefix-sum indices ``(lo, hi)`` of windows ``[first, last]`` clipped to ``[0, S)`` (``hi - lo``
    elements, none where the clipped window is empty)."""
    lo = first.clamp(0, S) + shift - 1
    return lo, torch.maximum(last.clamp(-1, S - 1) + shift, lo)


def _parts(X: SparseTensor):
    """``(rows, positions, values)`` of ``X``'s stored elements, rows row-major over ``X.shape[:-1]``."""
    idx, vals = coalesced_parts(X)
    if _index.numel(X.shape[:-1]) == 1:  # (one row: no arithmetic over the leading index rows)
        return idx.new_zeros(idx.shape[1]), idx[-1], vals
    return _index.linearize(idx[:-1], X.shape[:-1]), idx[-1], vals


def _build(rows, t, vals, shape, fill, layout) -> SparseTensor:
    """The SparseTensor of ``shape`` holding ``vals`` at the union's targets (rows over ``shape[:-1]``)."""
    lead = shape[:-1]
    if _index.numel(lead) == 1:
        idx = t.new_zeros((len(shape), t.numel()))
        idx[-1] = t
    else:
        idx = torch.cat([_index.unravel(rows, lead), t[None]])
    return parts_to_sparse(idx, vals, shape, fill, layout=layout, coalesced=True)


def _meta(func, args, kwargs):
    """``func`` on meta tensors of the arguments' shapes: torch's own argument checks and result shapes."""
    m = lambda a: torch.empty(a.shape, dtype=a.dtype, device="meta") if isinstance(a, torch.Tensor) else a  # noqa: E731
    return func(*map(m, args), **{k: m(v) for k, v in kwargs.items()})


def _refuse_indefinite(X, what):
    if isinstance(X, SparseTensor) and X._indefinite:
        raise ValueError(f"sparsefill: {what} of a SparseTensor with indefinite fill: a window over masked-out "
                         "elements has no dense meaning; give the tensor a fill first (A.to_sparse(fill_value=...))")


def _scatter(n: int, dst, ok, vals):
    """``out[dst[ok]] += vals[ok]`` into ``n`` zeros (``vals`` broadcast to ``dst``'s shape)."""
    v = vals.expand(dst.shape)[ok]
    return v.new_zeros(n).index_add_(0, dst[ok], v)


def _fill_term(fill, weight, count):
    """``fill`` times the total ``weight`` of the fill-valued taps (``count`` of them); a non-finite fill is
    what it gives wherever a fill-valued tap exists (weights are positive there: the pooling case)."""
    if bool(torch.isfinite(fill)):
        return fill * weight
    return torch.where(count > 0, fill, fill.new_zeros(()))


# ---------------------------------------------------------------------- avg_pool1d (avg_pool2d, kernel height 1)
def _pool_args(args, kwargs):
    names = ["kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override"]
    kw = dict(zip(names, args[1:]), **kwargs)
    two = lambda v: (list(v) * 2)[:2] if len(v) == 1 else list(v)  # noqa: E731
    k = two(kw["kernel_size"])
    st = two(kw.get("stride") or k)
    pd = kw.get("padding", 0)
    pd = two([pd] if isinstance(pd, int) else pd)
    return k, st, pd, kw.get("ceil_mode", False), kw.get("count_include_pad", True), kw.get("divisor_override")


def _pool_supported(X, k, st, pd) -> bool:
    return isinstance(X, SparseTensor) and X.dense_dim() == 0 and X.dim() >= 3 and X.dtype.is_floating_point \
        and k[0] == 1 and st[0] == 1 and pd[0] == 0


def _pool_div(o, L, w, s, p, count_include_pad, divisor):
    """``(divisor, real taps)`` of output windows ``o``, as aten's CPU kernel computes them."""
    start = o * s - p
    end = torch.clamp(start + w, max=L + p)
    real = (torch.clamp(end, max=L) - torch.clamp(start, min=0)).clamp(min=0)
    div = torch.full_like(o, divisor) if divisor else (end - start if count_include_pad else real)
    return div, real


def _ceil_div(a, b):
    return -torch.div(-a, b, rounding_mode="floor")


def _pool_windows(w: int, s: int, p: int):
    """``(window of output o in input positions, window of input i in output positions)``."""
    if s == 1:  # (no integer division: it is the slow pass)
        return (lambda o: (o - p, o - p + w - 1)), (lambda i: (i + p - w + 1, i + p))
    return ((lambda o: (o * s - p, o * s - p + w - 1)),
            (lambda i: (_ceil_div(i + p - w + 1, s), torch.div(i + p, s, rounding_mode="floor"))))


@register(aten.avg_pool2d.default)
def _avg_pool2d(func, args, kwargs):
    X = args[0]
    k, st, pd, ceil, cip, divisor = _pool_args(args, kwargs)
    _refuse_indefinite(X, "avg_pool")
    per = _dense_window(X, k, st, pd)
    if per is not None:  # the windows lie in the dense dims: the op on every stored slice and on the fill
        v, f = (_slices(func, t, per, args[1:], kwargs) for t in (X._vals, X._fill.expand(X._dense_shape)))
        return rewrap(X, values=v, fill=f, size=_meta(func, args, kwargs).shape, known_zero=False)
    if not _pool_supported(X, k, st, pd):
        return NotImplemented
    out_shape = _meta(func, args, kwargs).shape
    w, s = k[1], st[1]
    orow, o, vals = _pool_values(X, out_shape[-1], w, s, pd[1], cip, divisor)
    interior = func(X._fill.expand(1, 1, 1, w), [1, w], [1, s], [0, 0], False, cip, divisor).reshape(())
    return _build(orow, o, vals.to(interior.dtype), out_shape, interior, X._sf_layout)


def _dense_window(X, k, st, pd):
    """For a SparseTensor whose dense dims hold the pooling window (the last two, or the last one with a
    window of height 1): how many trailing dims the op takes from each slice; else None."""
    if not isinstance(X, SparseTensor) or not X.dense_dim() or X._indefinite or not X.dtype.is_floating_point:
        return None
    if X.dense_dim() >= 2:
        return 2
    return 1 if k[0] == 1 and st[0] == 1 and pd[0] == 0 else None


def _slices(func, t, per: int, args, kwargs):
    """``func`` on every trailing ``per``-dim slice of ``t`` (as a batch of one-channel images)."""
    lead, tail = t.shape[: t.dim() - per], t.shape[t.dim() - per:]
    out = func(t.reshape((-1, 1) + (1,) * (2 - per) + tuple(tail)), *args, **kwargs)
    return out.reshape(tuple(lead) + tuple(out.shape[4 - per:]))


def _pool_values(X: SparseTensor, Lo: int, w: int, s: int, p: int, cip: bool, divisor):
    """``(rows, outputs, values)`` of the windows over ``X``'s last dim that its stored elements or the
    padding reach (float64 values); ``divisor`` 1 gives the window sums."""
    L, c, div_int = X.shape[-1], X._fill, divisor or w
    rows, x, v = _parts(X)
    lo, hi = _ceil_div(x + p - w + 1, s).clamp(min=0), torch.div(x + p, s, rounding_mode="floor").clamp(max=Lo - 1)
    oL, oR = -(-p // s), (L - 1 + p - (w - 1)) // s  # interior outputs: the window inside [0, L)
    R = _union(rows, lo, hi, _index.numel(X.shape[:-1]), Lo, oL, oR)
    orow, o = R.rows_and_targets()
    win = _pool_windows(w, s, p)[0]
    edge, span = R.edges(oL, oR), (-p if s == 1 else None)
    if bool(torch.isfinite(c)):  # sum(v - c) over the window, + c for each of its elements in range
        delta = _window_sums(R, o, x, (v - c)[None], L, win, edge, span)[0]
        vals = (delta + c * w) / div_int
        div, real = _pool_div(o[edge], L, w, s, p, cip, divisor)
        vals[edge] = (delta[edge] + c * real) / div
        return orow, o, vals
    sums = _window_sums(R, o, x, torch.stack([v, torch.ones_like(v)]), L, win, edge, span)
    div, real = _pool_div(o, L, w, s, p, cip, divisor)
    n_fill = real - sums[1].round().long()
    return orow, o, (sums[0] + _fill_term(c.to(sums.dtype), n_fill, n_fill)) / div


@register(aten.avg_pool2d_backward.default)
def _avg_pool2d_backward(func, args, kwargs):
    """``grad_in[i] = sum_{o covers i} G[o] / div(o)``: the transposed windows of ``G``'s stored elements,
    and ``g * coverage / w`` at the unspecified elements (uniform when the stride divides the window)."""
    G, X = args[0], args[1]
    k, st, pd, ceil, cip, divisor = _pool_args(args[1:], kwargs)
    _refuse_indefinite(G, "the gradient of avg_pool")
    if isinstance(X, SparseTensor) and not isinstance(G, SparseTensor):  # a dense gradient: so is this one
        check_densify(f"{func} (a dense upstream gradient)", X.numel() * X.element_size(), by_nature=True)
        return func(G, G.new_empty(X.shape), *args[2:], **kwargs)  # (the input's values are not read)
    per = _dense_window(X, k, st, pd)
    if per is not None and isinstance(G, SparseTensor) and G.dense_dim() == X.dense_dim():  # slice by slice
        D = tuple(X._dense_shape)
        grad = lambda g: func(g, g.new_empty(g.shape[:4 - per] + D[-per:]), *args[2:], **kwargs)  # noqa: E731
        v, f = (_slices(grad, t, per, (), {}) for t in (G._vals, G._fill.expand(G._dense_shape)))
        return rewrap(G, values=v, fill=f, size=X.shape, known_zero=False)
    if not _pool_supported(X, k, st, pd) or not isinstance(G, SparseTensor) or G.dense_dim():
        return NotImplemented
    w, s, g = k[1], st[1], G._fill
    if w % s and not (bool(torch.isfinite(g)) and not bool(g)):  # coverage w/s varies with i mod s: dense
        if not bool(torch.isfinite(g)) or not bool(torch.isfinite(G._vals).all()):
            return NotImplemented
        G = _every_output_stored(G)  # dense by nature: O(outputs), the input's size over the stride
        g = G._fill
    irow, i, vals = _pool_grad_values(G, X.shape[-1], w, s, pd[1], cip, divisor)
    return _build(irow, i, vals.to(G.dtype), X.shape, g / (divisor or w) * (w // s), X._sf_layout)


def _every_output_stored(G: SparseTensor) -> SparseTensor:
    """``G`` with every element stored and fill 0 (a gradient whose pooled form is dense by nature)."""
    check_densify("avg_pool's gradient with a stride that does not divide the window", G.numel() * G.element_size(),
                  by_nature=True)
    idx = _index.unravel(torch.arange(G.numel(), device=G.device), G.shape)
    return parts_to_sparse(idx, dense_of(G).reshape(-1), G.shape, G._fill.new_zeros(()), known_zero=True,
                           layout=torch.sparse_coo, coalesced=True)


def _pool_grad_values(G: SparseTensor, L: int, w: int, s: int, p: int, cip: bool, divisor):
    """``(rows, inputs, values)`` of the gradient of :func:`_pool_values` where it differs from the
    interior value ``g / div * (w // s)`` (float64 values)."""
    Lo, g = G.shape[-1], G._fill
    finite = bool(torch.isfinite(g))
    rows, o, gv = _parts(G)
    div_int = divisor or w
    oL, oR = -(-p // s), (L - 1 + p - (w - 1)) // s  # interior outputs: the window inside [0, L), divisor w
    iL, iR = oL * s - p + w - 1, oR * s - p  # interior inputs: every covering output interior
    R = _union(rows, (o * s - p).clamp(min=0), (o * s - p + w - 1).clamp(max=L - 1), _index.numel(G.shape[:-1]),
               L, iL, iR)
    oedge = ((o < oL) | (o > oR)).nonzero().squeeze(1)  # (their divisors differ)
    inv_edge = 1 / _pool_div(o[oedge], L, w, s, p, cip, divisor)[0].to(torch.float64)
    irow, i = R.rows_and_targets()
    win = _pool_windows(w, s, p)[1]
    edge = R.edges(iL, iR)
    if edge.numel():  # the covering outputs of the edge inputs, one by one
        num = i[edge, None] + p - torch.arange(w, device=i.device)
        oo = torch.div(num, s, rounding_mode="floor")
        hit = (oo * s == num) & (oo >= 0) & (oo < Lo)
        d = _pool_div(oo.clamp(0, max(Lo - 1, 0)), L, w, s, p, cip, divisor)[0].to(torch.float64)
        w_edge, n_edge = torch.where(hit, 1 / d, 0).sum(1), hit.sum(1)
    else:
        w_edge, n_edge = torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.int64)
    w_int = w // s / div_int  # the total weight of the covering outputs of an interior input
    if finite:  # sum((G - g) / div) over the covering outputs, + g times their total weight
        cols = (gv - g).to(torch.float64) / div_int
        cols[oedge] = (gv[oedge] - g) * inv_edge
        vals = _window_sums(R, i, o, cols[None], Lo, win, edge, (p - w + 1) if s == 1 else None)[0]
        vals += g * w_int
        vals[edge] += g * (w_edge - w_int)
        return irow, i, vals
    inv = torch.full(o.shape, 1 / div_int, dtype=torch.float64, device=o.device)
    inv[oedge] = inv_edge
    sums = _window_sums(R, i, o, torch.stack([gv * inv, inv, torch.ones_like(inv)]), Lo, win, edge,
                        (p - w + 1) if s == 1 else None)
    w_all = torch.full((i.numel(),), w_int, dtype=sums.dtype, device=gv.device)
    n_all = torch.full((i.numel(),), w // s, dtype=torch.int64, device=gv.device)
    w_all[edge], n_all[edge] = w_edge, n_edge
    return irow, i, sums[0] + _fill_term(g.to(sums.dtype), w_all - sums[1], n_all - sums[2].round().long())


# ---------------------------------------------------------------------- conv1d (convolution, 1-d)
def _conv_args(args, kwargs):
    names = ["input", "weight", "bias", "stride", "padding", "dilation", "transposed", "output_padding", "groups"]
    kw = dict(zip(names, args), **kwargs)
    return kw, kw["stride"][0], kw["padding"][0], kw["dilation"][0], kw["groups"]


def _conv_supported(X, kw) -> bool:
    W, bias = kw["weight"], kw["bias"]
    return isinstance(X, SparseTensor) and X.dim() == 3 and X.dense_dim() == 0 and X.dtype.is_floating_point \
        and not kw["transposed"] and len(kw["stride"]) == 1 and not isinstance(W, SparseTensor) \
        and not isinstance(bias, SparseTensor) and bool(torch.isfinite(X._fill))


def _grouped(rows, x, C: int, Cg: int, L: int):
    """Sources re-sorted by (sample, group, position): ``(order, group rows)``."""
    grow = torch.div(rows, C, rounding_mode="floor") * (C // Cg) + torch.div(rows % C, Cg, rounding_mode="floor")
    order = torch.sort(grow * (L + 1) + x, stable=True)[1]
    return order, grow[order]


def _expand_rows(R: _Runs, n_grows: int, per: int, N: int, C: int):
    """Every group row's targets repeated for each of its ``per`` channels: ``(rows n*C + c, targets, start
    of each such row in the result, start of each group row in the union)``."""
    grow, t = R.rows_and_targets()
    counts = torch.bincount(grow, minlength=n_grows)
    gstart = counts.cumsum(0) - counts
    out_rows = torch.arange(N * C, device=t.device)
    gr = torch.div(out_rows, C, rounding_mode="floor") * (n_grows // max(N, 1)) + torch.div(out_rows % C, per,
                                                                                            rounding_mode="floor")
    lens = counts[gr]
    ostart = lens.cumsum(0) - lens
    n = int(lens.sum())
    src = torch.repeat_interleave(gstart[gr] - ostart, lens, output_size=n) + torch.arange(n, device=t.device)
    return torch.repeat_interleave(out_rows, lens, output_size=n), t[src], ostart, gstart


@register(aten.convolution.default)
def _convolution(func, args, kwargs):
    kw, s, p, d, groups = _conv_args(args, kwargs)
    X, W, bias = kw["input"], kw["weight"], kw["bias"]
    _refuse_indefinite(X, "convolution")
    if not _conv_supported(X, kw):
        return NotImplemented
    out_shape = _meta(func, args, kwargs).shape
    (N, Cin, L), (Cout, Cin_g, w), Lo = X.shape, W.shape, out_shape[-1]
    c, Cout_g = X._fill, Cout // groups
    interior = func(c.expand(1, Cin, d * (w - 1) + 1), W, bias, [1], [0], [d], False, [0], groups).reshape(Cout)
    if _moving_sum(W, d, groups):  # one channel per group, equal taps: a window sum per row, scaled
        orow, o, sums = _pool_values(X, Lo, w, s, p, True, 1)
        ch = orow % Cout
        vals = (sums * W[:, 0, 0][ch] + (bias[ch] if bias is not None else 0)).to(X.dtype)
        return _conv_result(orow, o, vals, interior, out_shape, X._sf_layout)
    if X._nse() * w * Cout_g > _PAIRS_PER_ELEMENT * X.numel():  # the pairs would outweigh the dense way
        return NotImplemented
    rows, x, v = _parts(X)
    order, grow = _grouped(rows, x, Cin, Cin_g, L)
    t, ok, lo, hi = _taps(x[order], w, 1, p, -d, s, Lo)
    R = _union(grow, lo, hi, N * groups, Lo, -(-p // s), (L - 1 + p - d * (w - 1)) // s, presorted=False)
    dst = R.index(t, R.run[:, None])
    orow, o, ostart, gstart = _expand_rows(R, N * groups, Cout_g, N, Cout)
    # contributions W[co, ci, j] * (v - c) of each (element, tap, output channel of its group)
    n, ci = torch.div(rows[order], Cin, rounding_mode="floor"), rows[order] % Cin
    co = (torch.div(ci, Cin_g, rounding_mode="floor") * Cout_g)[:, None] + torch.arange(Cout_g, device=x.device)
    wt = W[co, (ci % Cin_g)[:, None]]  # (nse, Cout_g, w)
    at = (ostart[n[:, None] * Cout + co] - gstart[grow][:, None])[:, :, None] + dst[:, None, :]
    delta = _scatter(o.numel(), at, ok[:, None, :].expand(at.shape), wt * (v[order] - c)[:, None, None])
    vals = interior[orow % Cout] + delta
    edge = _conv_edge(orow, o, Cout, c, W, bias, L, s, p, d)
    if edge is not None:
        vals[edge[0]] = edge[1] + delta[edge[0]]
    return _conv_result(orow, o, vals, interior, out_shape, X._sf_layout)


def _moving_sum(W, d: int, groups: int) -> bool:
    """``W`` maps each channel to itself alone with one weight for all taps: a scaled moving sum, summed
    by prefix sums (:func:`_pool_values`) in O(nse + outputs) -- the pairs would take O(nse * w)."""
    return d == 1 and W.shape[1] == 1 and W.shape[0] == groups and bool((W == W[..., :1]).all())


def _conv_result(orow, o, vals, interior, out_shape, layout):
    """The SparseTensor of the outputs (a dense tensor when the channels' interior values differ)."""
    if bool((interior == interior[0]).all()) or bool(interior.isnan().all()):
        return _build(orow, o, vals, out_shape, interior[0].clone(), layout)
    out = interior[None, :, None].expand(out_shape).clone()  # per-channel interiors: dense by nature
    out.view(-1)[orow * out_shape[-1] + o] = vals
    return out


def _conv_edge(orow, o, Cout, c, W, bias, L, s, p, d):
    """``(indices, values)`` of the outputs (rows ``orow``, positions ``o``) whose window meets the padding:
    ``c`` times the weights of their in-range taps, plus the bias."""
    w = W.shape[-1]
    edge = ((o * s - p < 0) | (o * s - p + d * (w - 1) > L - 1)).nonzero().squeeze(1)
    if not edge.numel():
        return None
    src = o[edge, None] * s - p + d * torch.arange(w, device=o.device)
    inside = (src >= 0) & (src < L)
    co = orow[edge] % Cout
    val = c * (W.sum(1)[co] * inside).sum(1)
    return edge, val + bias[co] if bias is not None else val


@register(aten.convolution_backward.default)
def _convolution_backward(func, args, kwargs):
    names = ["grad_output", "input", "weight", "bias_sizes", "stride", "padding", "dilation", "transposed",
             "output_padding", "groups", "output_mask"]
    kw = dict(zip(names, args), **kwargs)
    G, X, W = kw["grad_output"], kw["input"], kw["weight"]
    _refuse_indefinite(G, "the gradient of convolution")
    conv_kw = dict(kw, bias=None)
    if not _conv_supported(X, conv_kw) or not isinstance(G, SparseTensor) or G.dense_dim() \
            or not bool(torch.isfinite(G._fill)):
        return NotImplemented
    s, p, d, groups = kw["stride"][0], kw["padding"][0], kw["dilation"][0], kw["groups"]
    mask = kw["output_mask"]
    gi = _conv_grad_input(G, X, W, s, p, d, groups) if mask[0] else None
    if gi is NotImplemented:
        return NotImplemented
    gw = _conv_grad_weight(G, X, W, s, p, d, groups) if mask[1] else None
    gb = None
    if mask[2]:
        gb = aten.sum.dim_IntList(G, [0, 2])
        gb = gb.to_dense() if isinstance(gb, SparseTensor) else gb
    return gi, gw, gb


def _residue_weights(W, groups: int, s: int, p: int, d: int):
    """``(Cin, s)``: per input channel and residue ``(i + p) mod s``, the sum of the weights of the output
    channels of its group over the taps aligned with the stride."""
    Cout, Cin_g, w = W.shape
    j = torch.arange(w, device=W.device)
    per_ci = W.reshape(groups, Cout // groups, Cin_g, w).sum(1).reshape(groups * Cin_g, w)
    r = torch.arange(s, device=W.device)
    aligned = ((r[:, None] - d * j[None, :]) % s == 0).to(W.dtype)  # (s, w)
    return per_ci @ aligned.T


def _conv_grad_input(G, X, W, s, p, d, groups):
    (N, Cin, L), (Cout, Cin_g, w), Lo = X.shape, W.shape, G.shape[-1]
    g = G._fill
    per_res = _residue_weights(W, groups, s, p, d)
    interior = g * per_res
    if not bool((interior == interior.reshape(-1)[0]).all()):
        return NotImplemented  # the gradient's unspecified elements differ by channel or residue: dense
    if _moving_sum(W, d, groups):
        irow, i, vals = _pool_grad_values(G, L, w, s, p, True, 1)
        vals = (vals * W[:, 0, 0][irow % Cin]).to(X.dtype)
        return _build(irow, i, vals, X.shape, interior.reshape(-1)[0].clone(), X._sf_layout)
    if G._nse() * w * Cin_g > _PAIRS_PER_ELEMENT * G.numel():  # the pairs would outweigh the dense way
        return NotImplemented
    rows, o, gv = _parts(G)
    order, grow = _grouped(rows, o, Cout, Cout // groups, Lo)
    t, ok, lo, hi = _taps(o[order], w, s, -p, d, 1, L)
    R = _union(grow, lo, hi, N * groups, L, d * (w - 1) - p, (Lo - 1) * s - p, presorted=False)
    dst = R.index(t, R.run[:, None])
    irow, i, istart, gstart = _expand_rows(R, N * groups, Cin_g, N, Cin)
    n, co = torch.div(rows[order], Cout, rounding_mode="floor"), rows[order] % Cout
    ci = (torch.div(co, Cout // groups, rounding_mode="floor") * Cin_g)[:, None] + torch.arange(Cin_g,
                                                                                            device=o.device)
    wt = W[co[:, None], ci % Cin_g]  # (nse, Cin_g, w)
    at = (istart[n[:, None] * Cin + ci] - gstart[grow][:, None])[:, :, None] + dst[:, None, :]
    vals = _scatter(i.numel(), at, ok[:, None, :].expand(at.shape), wt * (gv[order] - g)[:, None, None])
    chan = irow % Cin
    vals += interior.reshape(-1)[0]
    edge = ((i < d * (w - 1) - p) | (i > (Lo - 1) * s - p)).nonzero().squeeze(1)
    if edge.numel():  # the in-range outputs over the aligned taps of the edge inputs
        num = i[edge, None] + p - d * torch.arange(w, device=i.device)
        oo = torch.div(num, s, rounding_mode="floor")
        hit = (oo * s == num) & (oo >= 0) & (oo < Lo)
        per_ci = W.reshape(groups, Cout // groups, Cin_g, w).sum(1).reshape(Cin, w)
        vals[edge] += g * (per_ci[chan[edge]] * hit).sum(1) - interior.reshape(-1)[0]
    return _build(irow, i, vals, X.shape, interior.reshape(-1)[0].clone(), X._sf_layout)


def _conv_grad_weight(G, X, W, s, p, d, groups):
    """``gw[co, ci, j] = sum_{n,o} G[n, co, o] * Xpad[n, ci, o*s - p + d*j]`` with ``G = g + dG`` and
    ``X = c + dX`` (dG, dX at the stored elements): four sums, the last over stored pairs only."""
    (N, Cin, L), (Cout, Cin_g, w), Lo = X.shape, W.shape, G.shape[-1]
    g, c, Cout_g = G._fill, X._fill, Cout // groups
    j = torch.arange(w, device=W.device)
    count = _valid_counts(L, Lo, w, s, p, d).to(W.device)
    gw = (g * c * N * count).to(W.dtype).expand(W.shape).clone()
    rows, x, v = _parts(X)
    n, ci = torch.div(rows, Cin, rounding_mode="floor"), rows % Cin
    num = x[:, None] + p - d * j
    o = torch.div(num, s, rounding_mode="floor")
    ok = (o * s == num) & (o >= 0) & (o < Lo)
    dx = torch.where(ok, (v - c)[:, None], 0)
    co = (torch.div(ci, Cin_g, rounding_mode="floor") * Cout_g)[:, None] + torch.arange(Cout_g, device=x.device)
    A = dx.new_zeros(Cin, w).index_add_(0, ci, dx)  # g * sum of dX over the taps that reach an output
    gw += g * A.reshape(groups, 1, Cin_g, w)[torch.arange(Cout, device=W.device) // Cout_g, 0]
    grows, go, gvals = _parts(G)
    inside = (go[:, None] * s - p + d * j >= 0) & (go[:, None] * s - p + d * j < L)
    B = gvals.new_zeros(Cout, w).index_add_(0, grows % Cout, torch.where(inside, (gvals - g)[:, None], 0))
    gw += c * B[:, None, :]
    gkeys = grows * Lo + go  # sorted (coalesced)
    q = (n[:, None, None] * Cout + co[:, :, None]) * Lo + o[:, None, :]  # (nse, Cout_g, w)
    pos, found = _index.lookup(gkeys, q.reshape(-1))
    hit = (found & ok[:, None, :].expand(q.shape).reshape(-1)).reshape(q.shape)
    pair = torch.where(hit, (gvals[pos].reshape(q.shape) - g) * (v - c)[:, None, None], 0)  # -> gw[co, ci, j]
    flat = (co[:, :, None] * Cin_g + (ci % Cin_g)[:, None, None]) * w + j
    gw.view(-1).index_add_(0, flat.reshape(-1), pair.reshape(-1))
    return gw


def _valid_counts(L, Lo, w, s, p, d):
    """Per tap ``j``: the outputs ``o < Lo`` whose source ``o*s - p + d*j`` lies in ``[0, L)``."""
    out = []
    for j in range(w):
        lo = max(0, math.ceil((p - d * j) / s))
        hi = min(Lo - 1, (L - 1 + p - d * j) // s)
        out.append(max(0, hi - lo + 1))
    return torch.tensor(out)
