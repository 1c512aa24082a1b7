"""``convolution`` in 1-D (``conv1d``) and its backward (see the package docstring)."""

from __future__ import annotations

import math

import torch

from sparsefill._kernels import index as _index
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops.registry import register
from sparsefill.ops.windows._core import (
    _PAIRS_PER_ELEMENT,
    _Runs,
    _build,
    _meta,
    _parts,
    _refuse_indefinite,
    _scatter,
    _taps,
    _union,
    aten,
)
from sparsefill.ops.windows.pooling import _pool_grad_values, _pool_values


def _conv_args(args, kwargs):
    names = [
        "input",
        "weight",
        "bias",
        "stride",
        "padding",
        "dilation",
        "transposed",
        "output_padding",
        "groups",
    ]
    kw = dict(zip(names, args), **kwargs)
    return kw, kw["stride"][0], kw["padding"][0], kw["dilation"][0], kw["groups"]


def _conv_supported(X, kw) -> bool:
    W, bias = kw["weight"], kw["bias"]
    return (
        isinstance(X, SparseTensor)
        and X.dim() == 3
        and X.dense_dim() == 0
        and X.dtype.is_floating_point
        and not kw["transposed"]
        and len(kw["stride"]) == 1
        and not isinstance(W, SparseTensor)
        and not isinstance(bias, SparseTensor)
        and bool(torch.isfinite(X._fill))
    )


def _grouped(rows, x, C: int, Cg: int, L: int):
    """Sources re-sorted by (sample, group, position): ``(order, group rows)``."""
    grow = torch.div(rows, C, rounding_mode="floor") * (C // Cg) + torch.div(
        rows % C, Cg, rounding_mode="floor"
    )
    order = torch.sort(grow * (L + 1) + x, stable=True)[1]
    return order, grow[order]


def _expand_rows(R: _Runs, n_grows: int, per: int, N: int, C: int):
    """Every group row's targets repeated for each of its ``per`` channels: ``(rows n*C + c,
    targets, start of each such row in the result, start of each group row in the union)``."""
    grow, t = R.rows_and_targets()
    counts = torch.bincount(grow, minlength=n_grows)
    gstart = counts.cumsum(0) - counts
    out_rows = torch.arange(N * C, device=t.device)
    gr = torch.div(out_rows, C, rounding_mode="floor") * (n_grows // max(N, 1)) + torch.div(
        out_rows % C, per, rounding_mode="floor"
    )
    lens = counts[gr]
    ostart = lens.cumsum(0) - lens
    n = int(lens.sum())
    src = torch.repeat_interleave(gstart[gr] - ostart, lens, output_size=n) + torch.arange(
        n, device=t.device
    )
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
    interior = func(
        c.expand(1, Cin, d * (w - 1) + 1), W, bias, [1], [0], [d], False, [0], groups
    ).reshape(Cout)
    if _moving_sum(W, d, groups):  # one channel per group, equal taps: a window sum per row, scaled
        T, sums = _pool_values(X, out_shape, w, s, p, True, 1)
        orow, o = T.row, T.t
        ch = orow % Cout
        vals = (sums * W[:, 0, 0][ch] + (bias[ch] if bias is not None else 0)).to(X.dtype)
        return _conv_result(orow, o, vals, interior, out_shape, X._sf_layout)
    # the pairs would outweigh the dense way
    if X._nse() * w * Cout_g > _PAIRS_PER_ELEMENT * X.numel():
        return NotImplemented
    rows, x, v = _parts(X)
    order, grow = _grouped(rows, x, Cin, Cin_g, L)
    t, ok, lo, hi = _taps(x[order], w, 1, p, -d, s, Lo)
    R = _union(
        grow, lo, hi, N * groups, Lo, -(-p // s), (L - 1 + p - d * (w - 1)) // s, presorted=False
    )
    dst = R.index(t, R.run[:, None])
    orow, o, ostart, gstart = _expand_rows(R, N * groups, Cout_g, N, Cout)
    # contributions W[co, ci, j] * (v - c) of each (element, tap, output channel of its group)
    n, ci = torch.div(rows[order], Cin, rounding_mode="floor"), rows[order] % Cin
    co = (torch.div(ci, Cin_g, rounding_mode="floor") * Cout_g)[:, None] + torch.arange(
        Cout_g, device=x.device
    )
    wt = W[co, (ci % Cin_g)[:, None]]  # (nse, Cout_g, w)
    at = (ostart[n[:, None] * Cout + co] - gstart[grow][:, None])[:, :, None] + dst[:, None, :]
    delta = _scatter(
        o.numel(), at, ok[:, None, :].expand(at.shape), wt * (v[order] - c)[:, None, None]
    )
    vals = interior[orow % Cout] + delta
    edge = _conv_edge(orow, o, Cout, c, W, bias, L, s, p, d)
    if edge is not None:
        vals[edge[0]] = edge[1] + delta[edge[0]]
    return _conv_result(orow, o, vals, interior, out_shape, X._sf_layout)


def _moving_sum(W, d: int, groups: int) -> bool:
    """``W`` maps each channel to itself alone with one weight for all taps: a scaled moving sum,
    summed by prefix sums (:func:`_pool_values`) in O(nse + outputs) -- the pairs would take O(nse *
    w)."""
    return d == 1 and W.shape[1] == 1 and W.shape[0] == groups and bool((W == W[..., :1]).all())


def _conv_result(orow, o, vals, interior, out_shape, layout):
    """The SparseTensor of the outputs (a dense tensor when the channels' interior values
    differ)."""
    if bool((interior == interior[0]).all()) or bool(interior.isnan().all()):
        return _build(orow, o, vals, out_shape, interior[0].clone(), layout)
    # per-channel interiors: dense by nature
    out = interior[None, :, None].expand(out_shape).clone()
    out.view(-1)[orow * out_shape[-1] + o] = vals
    return out


def _conv_edge(orow, o, Cout, c, W, bias, L, s, p, d):
    """``(indices, values)`` of the outputs (rows ``orow``, positions ``o``) whose window meets the
    padding: ``c`` times the weights of their in-range taps, plus the bias."""
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
    names = [
        "grad_output",
        "input",
        "weight",
        "bias_sizes",
        "stride",
        "padding",
        "dilation",
        "transposed",
        "output_padding",
        "groups",
        "output_mask",
    ]
    kw = dict(zip(names, args), **kwargs)
    G, X, W = kw["grad_output"], kw["input"], kw["weight"]
    _refuse_indefinite(G, "the gradient of convolution")
    conv_kw = dict(kw, bias=None)
    if (
        not _conv_supported(X, conv_kw)
        or not isinstance(G, SparseTensor)
        or G.dense_dim()
        or not bool(torch.isfinite(G._fill))
    ):
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
    """``(Cin, s)``: per input channel and residue ``(i + p) mod s``, the sum of the weights of the
    output channels of its group over the taps aligned with the stride."""
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
        # the gradient's unspecified elements differ by channel or residue: dense
        return NotImplemented
    if _moving_sum(W, d, groups):
        T, vals = _pool_grad_values(G, X.shape, w, s, p, True, 1)
        vals = (vals * W[:, 0, 0][T.row % Cin]).to(X.dtype)
        return _build(
            T.row, T.t, vals, X.shape, interior.reshape(-1)[0].clone(), X._sf_layout, T.idx
        )
    # the pairs would outweigh the dense way
    if G._nse() * w * Cin_g > _PAIRS_PER_ELEMENT * G.numel():
        return NotImplemented
    rows, o, gv = _parts(G)
    order, grow = _grouped(rows, o, Cout, Cout // groups, Lo)
    t, ok, lo, hi = _taps(o[order], w, s, -p, d, 1, L)
    R = _union(grow, lo, hi, N * groups, L, d * (w - 1) - p, (Lo - 1) * s - p, presorted=False)
    dst = R.index(t, R.run[:, None])
    irow, i, istart, gstart = _expand_rows(R, N * groups, Cin_g, N, Cin)
    n, co = torch.div(rows[order], Cout, rounding_mode="floor"), rows[order] % Cout
    ci = (torch.div(co, Cout // groups, rounding_mode="floor") * Cin_g)[:, None] + torch.arange(
        Cin_g, device=o.device
    )
    wt = W[co[:, None], ci % Cin_g]  # (nse, Cin_g, w)
    at = (istart[n[:, None] * Cin + ci] - gstart[grow][:, None])[:, :, None] + dst[:, None, :]
    vals = _scatter(
        i.numel(), at, ok[:, None, :].expand(at.shape), wt * (gv[order] - g)[:, None, None]
    )
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
    """``gw[co, ci, j] = sum_{n,o} G[n, co, o] * Xpad[n, ci, o*s - p + d*j]`` with ``G = g + dG``
    and ``X = c + dX`` (dG, dX at the stored elements): four sums, the last over stored pairs
    only."""
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
    co = (torch.div(ci, Cin_g, rounding_mode="floor") * Cout_g)[:, None] + torch.arange(
        Cout_g, device=x.device
    )
    # g * sum of dX over the taps that reach an output
    A = dx.new_zeros(Cin, w).index_add_(0, ci, dx)
    gw += g * A.reshape(groups, 1, Cin_g, w)[torch.arange(Cout, device=W.device) // Cout_g, 0]
    grows, go, gvals = _parts(G)
    inside = (go[:, None] * s - p + d * j >= 0) & (go[:, None] * s - p + d * j < L)
    B = gvals.new_zeros(Cout, w).index_add_(
        0, grows % Cout, torch.where(inside, (gvals - g)[:, None], 0)
    )
    gw += c * B[:, None, :]
    gkeys = grows * Lo + go  # sorted (coalesced)
    q = (n[:, None, None] * Cout + co[:, :, None]) * Lo + o[:, None, :]  # (nse, Cout_g, w)
    pos, found = _index.lookup(gkeys, q.reshape(-1))
    hit = (found & ok[:, None, :].expand(q.shape).reshape(-1)).reshape(q.shape)
    # -> gw[co, ci, j]
    pair = torch.where(hit, (gvals[pos].reshape(q.shape) - g) * (v - c)[:, None, None], 0)
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
