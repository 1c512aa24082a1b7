"""Sliding windows along the last dim: ``avg_pool1d`` and ``conv1d`` of a SparseTensor, forward and backward.

A window of a signal with fill ``c`` that holds no stored element has the interior value ``op(c, ...,
c)``; only the windows within reach of a stored element, and those that touch the padding at either end,
differ.  So, for ``X`` of shape ``(..., L)`` (every dim sparse) with stored positions ``P`` per row::

    avg_pool1d(X, w, s, p)[..., o] == mean(Xpad[..., o*s - p : o*s - p + w])
                                   == fill  unless the window meets P or the padding
    conv1d(X, W, b, s, p, d)[n, co, o] == b[co] + sum_{ci,j} W[co, ci, j] * Xpad[n, ci, o*s - p + d*j]

The result stores the union of the windows over the stored elements and the edge windows: at most
``nse * w + rows * 2 * (p / s + 1)`` elements, computed in O(nse * w) from the stored elements (a scatter
over (element, tap) pairs, no sort of them).  The gradients are the transposed windows of the gradient's
stored elements (as sparse as it is) and a closed form for the fill; ``conv1d``'s weight gradient adds the
stored pairs (a lookup per (element, tap)).  Where the result is dense by nature -- per output channel
interiors that differ, a stride that does not divide the window with a nonzero gradient fill -- it is
returned dense (forward) or computed by the densify fallback (backward).

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
finite fill).  A floating dtype, every dim sparse.  Anything else goes to the densify fallback (exact); an
indefinite fill raises (a window over masked-out elements has no dense meaning).
"""

from __future__ import annotations

import math

import torch

from .. import _index
from .._convert import coalesced_parts, parts_to_sparse
from .._tensor import SparseTensor
from .registry import register

aten = torch.ops.aten


# ---------------------------------------------------------------------- the pattern of a windowed scatter
def _pattern(rows, x, n_rows: int, w: int, a: int, b: int, e: int, q: int, T: int, tL: int, tR: int):
    """Targets of sources ``x`` (sorted within ``rows``) through taps ``j < w``: ``q*t = a*x + b + e*j``.

    Returns ``(keys, ok, dst, K)``: the sorted row-major keys ``row*K + t`` of the union, per row, of
    every source's target range and of the edge targets (``t < tL`` or ``t > tR``, in every row); ``ok``
    ``(n, w)``: the tap reaches a target in ``[0, T)``; ``dst`` ``(n, w)``: that target's index in ``keys``.
    """
    dev = x.device
    j = torch.arange(w, device=dev)
    num = a * x[:, None] + (b + e * j)[None, :]
    t = torch.div(num, q, rounding_mode="floor")
    ok = (t * q == num) & (t >= 0) & (t < T)
    lo, hi = torch.where(ok, t, T).amin(1), torch.where(ok, t, -1).amax(1)
    r = torch.arange(n_rows, device=dev)
    left, right = min(tL, T) - 1, max(tR + 1, 0)
    starts = torch.cat([lo, r.new_zeros(n_rows if left >= 0 else 0), r.new_full((n_rows if right < T else 0,), right)])
    ends = torch.cat([hi, r.new_full((n_rows if left >= 0 else 0,), left), r.new_full((n_rows if right < T else 0,), T - 1)])
    rws = torch.cat([rows, r[: n_rows if left >= 0 else 0], r[: n_rows if right < T else 0]])
    K = T + 1
    valid = starts <= ends
    ks, ke = (rws * K + starts)[valid], (rws * K + ends)[valid]
    ks, order = torch.sort(ks, stable=True)
    ke = ke[order]
    cm = ke.cummax(0).values if ke.numel() else ke
    new = torch.ones_like(ks, dtype=torch.bool)
    new[1:] = ks[1:] > cm[:-1]
    run = new.cumsum(0) - 1
    last = torch.ones_like(new)
    last[:-1] = new[1:]
    rstart, rlen = ks[new], cm[last] - ks[new] + 1
    shift = rstart - (rlen.cumsum(0) - rlen)  # key - index within keys, per run
    keys = torch.arange(int(rlen.sum()), device=dev) + torch.repeat_interleave(shift, rlen)
    run_of = torch.empty_like(run)
    run_of[order] = run
    n_src = int(valid[: x.numel()].sum())
    src_run = run.new_zeros(x.numel())
    src_run[valid[: x.numel()]] = run_of[:n_src]
    dst = t + (rows * K)[:, None] - shift[src_run][:, None] if shift.numel() else t
    return keys, ok, dst, K


def _parts(X: SparseTensor):
    """``(rows, positions, values)`` of ``X``'s stored elements, rows row-major over ``X.shape[:-1]``."""
    idx, vals = coalesced_parts(X)
    return _index.linearize(idx[:-1], X.shape[:-1]), idx[-1], vals


def _build(keys, K, vals, shape, fill, layout) -> SparseTensor:
    rows, t = torch.div(keys, K, rounding_mode="floor"), keys % K
    idx = torch.cat([_index.unravel(rows, shape[:-1]), t[None]]) if len(shape) > 1 else t[None]
    return parts_to_sparse(idx, vals, shape, fill, False, False, layout, True)


def _meta(func, args, kwargs):
    """``func`` on meta tensors of the arguments' shapes: torch's own argument checks and result shapes."""
    m = lambda a: torch.empty(a.shape, dtype=a.dtype, device="meta") if isinstance(a, torch.Tensor) else a  # noqa: E731
    return func(*map(m, args), **{k: m(v) for k, v in kwargs.items()})


def _refuse_indefinite(X, what):
    if isinstance(X, SparseTensor) and X._indefinite:
        raise ValueError(f"sparsefill: {what} of a SparseTensor with indefinite fill: a window over masked-out "
                         "elements has no dense meaning; give the tensor a fill first (sparsefill.convert(A, "
                         "fill_value=...))")


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


@register(aten.avg_pool2d.default)
def _avg_pool2d(func, args, kwargs):
    X = args[0]
    k, st, pd, ceil, cip, divisor = _pool_args(args, kwargs)
    _refuse_indefinite(X, "avg_pool")
    if not _pool_supported(X, k, st, pd):
        return NotImplemented
    out_shape = _meta(func, args, kwargs).shape
    L, Lo, w, s, p = X.shape[-1], out_shape[-1], k[1], st[1], pd[1]
    rows, x, v = _parts(X)
    keys, ok, dst, K = _pattern(rows, x, _index.numel(X.shape[:-1]), w, 1, p, -1, s, Lo,
                                -(-p // s), (L - 1 + p - (w - 1)) // s)
    m = keys.numel()
    div, real = _pool_div(keys % K, L, w, s, p, cip, divisor)
    n_fill = real - torch.bincount(dst[ok], minlength=m)
    vals = (_scatter(m, dst, ok, v[:, None]) + _fill_term(X._fill, n_fill, n_fill)) / div
    interior = func(X._fill.expand(1, 1, 1, w), [1, w], [1, s], [0, 0], False, cip, divisor).reshape(())
    return _build(keys, K, vals.to(interior.dtype), out_shape, interior, X._sf_layout)


@register(aten.avg_pool2d_backward.default)
def _avg_pool2d_backward(func, args, kwargs):
    """``grad_in[i] = sum_{o covers i} G[o] / div(o)``: the transposed windows of ``G``'s stored elements,
    and ``g * coverage / w`` at the unspecified elements (uniform when the stride divides the window)."""
    G, X = args[0], args[1]
    k, st, pd, ceil, cip, divisor = _pool_args(args[1:], kwargs)
    _refuse_indefinite(G, "the gradient of avg_pool")
    if not _pool_supported(X, k, st, pd) or not isinstance(G, SparseTensor) or G.dense_dim():
        return NotImplemented
    L, Lo, w, s, p = X.shape[-1], G.shape[-1], k[1], st[1], pd[1]
    g = G._fill
    if w % s and not (bool(torch.isfinite(g)) and not bool(g)):  # coverage w/s varies with i mod s: dense
        return NotImplemented
    rows, o, gv = _parts(G)
    div_int = divisor or w
    oL, oR = -(-p // s), (L - 1 + p - (w - 1)) // s  # interior outputs: the window inside [0, L), divisor w
    keys, ok, dst, K = _pattern(rows, o, _index.numel(G.shape[:-1]), w, s, -p, 1, 1, L,
                                oL * s - p + w - 1, oR * s - p)
    m = keys.numel()
    inv = 1 / _pool_div(o, L, w, s, p, cip, divisor)[0].to(gv.dtype)
    stored = _scatter(m, dst, ok, (gv * inv)[:, None])
    w_stored, n_stored = _scatter(m, dst, ok, inv[:, None]), torch.bincount(dst[ok], minlength=m)
    i = keys % K
    w_all = torch.full((m,), w // s / div_int, dtype=gv.dtype, device=gv.device)
    n_all = torch.full((m,), w // s, dtype=torch.int64, device=gv.device)
    edge = ((i < oL * s - p + w - 1) | (i > oR * s - p)).nonzero().squeeze(1)
    if edge.numel():  # the covering outputs of the edge inputs, one by one
        num = i[edge, None] + p - torch.arange(w, device=i.device)
        oo = torch.div(num, s, rounding_mode="floor")
        hit = (oo * s == num) & (oo >= 0) & (oo < Lo)
        d = _pool_div(oo.clamp(0, max(Lo - 1, 0)), L, w, s, p, cip, divisor)[0].to(gv.dtype)
        w_all[edge] = torch.where(hit, 1 / d, 0).sum(1)
        n_all[edge] = hit.sum(1)
    vals = stored + _fill_term(g, w_all - w_stored, n_all - n_stored)
    return _build(keys, K, vals, X.shape, g / div_int * (w // s), X._sf_layout)


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


def _expand_rows(keys, K, n_grows: int, per: int, N: int, C: int):
    """Every group row's pattern repeated for each of its ``per`` channels: ``(out keys, row start of each
    (sample, channel) row, group-row start)``, out keys over rows ``n*C + c``."""
    counts = torch.bincount(torch.div(keys, K, rounding_mode="floor"), minlength=n_grows)
    gstart = counts.cumsum(0) - counts
    out_rows = torch.arange(N * C, device=keys.device)
    gr = torch.div(out_rows, C, rounding_mode="floor") * (n_grows // max(N, 1)) + torch.div(out_rows % C, per,
                                                                                            rounding_mode="floor")
    lens = counts[gr]
    ostart = lens.cumsum(0) - lens
    src = torch.repeat_interleave(gstart[gr] - ostart, lens) + torch.arange(int(lens.sum()), device=keys.device)
    out_keys = keys[src] % K + torch.repeat_interleave(out_rows, lens) * K
    return out_keys, ostart, gstart


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
    rows, x, v = _parts(X)
    order, grow = _grouped(rows, x, Cin, Cin_g, L)
    keys, ok, dst, K = _pattern(grow, x[order], N * groups, w, 1, p, -d, s, Lo,
                                -(-p // s), (L - 1 + p - d * (w - 1)) // s)
    out_keys, ostart, gstart = _expand_rows(keys, K, N * groups, Cout_g, N, Cout)
    # contributions W[co, ci, j] * (v - c) of each (element, tap, output channel of its group)
    n, ci = torch.div(rows[order], Cin, rounding_mode="floor"), rows[order] % Cin
    co = (torch.div(ci, Cin_g, rounding_mode="floor") * Cout_g)[:, None] + torch.arange(Cout_g, device=x.device)
    wt = W[co, (ci % Cin_g)[:, None]]  # (nse, Cout_g, w)
    at = (ostart[n[:, None] * Cout + co] - gstart[grow][:, None])[:, :, None] + dst[:, None, :]
    delta = _scatter(out_keys.numel(), at, ok[:, None, :].expand(at.shape), wt * (v[order] - c)[:, None, None])
    interior = func(c.expand(1, Cin, d * (w - 1) + 1), W, bias, [1], [0], [d], False, [0], groups).reshape(Cout)
    vals = interior[torch.div(out_keys, K, rounding_mode="floor") % Cout] + delta
    edge = _conv_edge(out_keys, K, Cout, c, W, bias, L, s, p, d)
    if edge is not None:
        vals[edge[0]] = edge[1] + delta[edge[0]]
    if bool((interior == interior[0]).all()) or bool(interior.isnan().all()):
        return _build(out_keys, K, vals, out_shape, interior[0].clone(), X._sf_layout)
    out = interior[None, :, None].expand(out_shape).clone()  # per-channel interiors: dense by nature
    out.view(-1)[torch.div(out_keys, K, rounding_mode="floor") * Lo + out_keys % K] = vals
    return out


def _conv_edge(out_keys, K, Cout, c, W, bias, L, s, p, d):
    """``(positions in out_keys, values)`` of the outputs whose window meets the padding: ``c`` times the
    weights of their in-range taps, plus the bias."""
    o = out_keys % K
    w = W.shape[-1]
    edge = ((o * s - p < 0) | (o * s - p + d * (w - 1) > L - 1)).nonzero().squeeze(1)
    if not edge.numel():
        return None
    src = o[edge, None] * s - p + d * torch.arange(w, device=o.device)
    inside = (src >= 0) & (src < L)
    co = torch.div(out_keys[edge], K, rounding_mode="floor") % Cout
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
    rows, o, gv = _parts(G)
    order, grow = _grouped(rows, o, Cout, Cout // groups, Lo)
    keys, ok, dst, K = _pattern(grow, o[order], N * groups, w, s, -p, d, 1, L,
                                d * (w - 1) - p, (Lo - 1) * s - p)
    in_keys, istart, gstart = _expand_rows(keys, K, N * groups, Cin_g, N, Cin)
    n, co = torch.div(rows[order], Cout, rounding_mode="floor"), rows[order] % Cout
    ci = (torch.div(co, Cout // groups, rounding_mode="floor") * Cin_g)[:, None] + torch.arange(Cin_g,
                                                                                            device=o.device)
    wt = W[co[:, None], ci % Cin_g]  # (nse, Cin_g, w)
    at = (istart[n[:, None] * Cin + ci] - gstart[grow][:, None])[:, :, None] + dst[:, None, :]
    vals = _scatter(in_keys.numel(), at, ok[:, None, :].expand(at.shape), wt * (gv[order] - g)[:, None, None])
    i, chan = in_keys % K, torch.div(in_keys, K, rounding_mode="floor") % Cin
    vals += interior.reshape(-1)[0]
    edge = ((i < d * (w - 1) - p) | (i > (Lo - 1) * s - p)).nonzero().squeeze(1)
    if edge.numel():  # the in-range outputs over the aligned taps of the edge inputs
        num = i[edge, None] + p - d * torch.arange(w, device=i.device)
        oo = torch.div(num, s, rounding_mode="floor")
        hit = (oo * s == num) & (oo >= 0) & (oo < Lo)
        per_ci = W.reshape(groups, Cout // groups, Cin_g, w).sum(1).reshape(Cin, w)
        vals[edge] += g * (per_ci[chan[edge]] * hit).sum(1) - interior.reshape(-1)[0]
    return _build(in_keys, K, vals, X.shape, interior.reshape(-1)[0].clone(), X._sf_layout)


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
