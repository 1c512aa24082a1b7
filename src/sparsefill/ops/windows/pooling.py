"""``avg_pool`` along the last dim (``avg_pool2d`` with a kernel of height 1, what ``avg_pool1d``
calls) and its backward (see the package docstring)."""

from __future__ import annotations

import torch

from sparsefill._tensor.parts import every_element, parts_to_sparse, rewrap
from sparsefill._tensor.policy import check_densify
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops.registry import register
from sparsefill.ops.windows._core import (
    _build,
    _fill_term,
    _meta,
    _parts,
    _refuse_indefinite,
    _windowed,
    aten,
)


def _pool_args(args, kwargs):
    names = [
        "kernel_size",
        "stride",
        "padding",
        "ceil_mode",
        "count_include_pad",
        "divisor_override",
    ]
    kw = dict(zip(names, args[1:]), **kwargs)
    two = lambda v: (list(v) * 2)[:2] if len(v) == 1 else list(v)  # noqa: E731
    k = two(kw["kernel_size"])
    st = two(kw.get("stride") or k)
    pd = kw.get("padding", 0)
    pd = two([pd] if isinstance(pd, int) else pd)
    return (
        k,
        st,
        pd,
        kw.get("ceil_mode", False),
        kw.get("count_include_pad", True),
        kw.get("divisor_override"),
    )


def _pool_supported(X, k, st, pd) -> bool:
    return (
        isinstance(X, SparseTensor)
        and X.dense_dim() == 0
        and X.dim() >= 3
        and X.dtype.is_floating_point
        and k[0] == 1
        and st[0] == 1
        and pd[0] == 0
    )


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
    """``(window of output o in input positions, window of input i in output positions)`` as ``(m,
    c0, c1, q)``: ``t -> (ceil((m*t + c0) / q), floor((m*t + c1) / q))`` (``_core._window_fn``)."""
    return (s, -p, w - 1 - p, 1), (1, p - w + 1, p, s)  # (each the other's reach)


@register(aten.avg_pool2d.default)
def _avg_pool2d(func, args, kwargs):
    X = args[0]
    k, st, pd, ceil, cip, divisor = _pool_args(args, kwargs)
    _refuse_indefinite(X, "avg_pool")
    per = _dense_window(X, k, st, pd)
    # the windows lie in the dense dims: the op on every stored slice and on the fill
    if per is not None:
        v, f = (
            _slices(func, t, per, args[1:], kwargs)
            for t in (X._vals, X._fill.expand(X._dense_shape))
        )
        return rewrap(X, values=v, fill=f, size=_meta(func, args, kwargs).shape, known_zero=False)
    if not _pool_supported(X, k, st, pd):
        return NotImplemented
    out_shape = _meta(func, args, kwargs).shape
    w, s = k[1], st[1]
    T, vals = _pool_values(X, out_shape, w, s, pd[1], cip, divisor)
    interior = func(
        X._fill.expand(1, 1, 1, w), [1, w], [1, s], [0, 0], False, cip, divisor
    ).reshape(())
    return _build(T.row, T.t, vals.to(interior.dtype), out_shape, interior, X._sf_layout, T.idx)


def _dense_window(X, k, st, pd):
    """For a SparseTensor whose dense dims hold the pooling window (the last two, or the last one
    with a window of height 1): how many trailing dims the op takes from each slice; else None."""
    if (
        not isinstance(X, SparseTensor)
        or not X.dense_dim()
        or X._indefinite
        or not X.dtype.is_floating_point
    ):
        return None
    if X.dense_dim() >= 2:
        return 2
    return 1 if k[0] == 1 and st[0] == 1 and pd[0] == 0 else None


def _slices(func, t, per: int, args, kwargs):
    """``func`` on every trailing ``per``-dim slice of ``t`` (as a batch of one-channel images)."""
    lead, tail = t.shape[: t.dim() - per], t.shape[t.dim() - per :]
    out = func(t.reshape((-1, 1) + (1,) * (2 - per) + tuple(tail)), *args, **kwargs)
    return out.reshape(tuple(lead) + tuple(out.shape[4 - per :]))


def _pool_values(X: SparseTensor, shape, w: int, s: int, p: int, cip: bool, divisor):
    """``(targets, values)`` of the windows over ``X``'s last dim that its stored elements or the
    padding reach (``_core._Targets`` over the result's ``shape``; float64 values); ``divisor`` 1
    gives the window sums."""
    L, c, div_int = X.shape[-1], X._fill, divisor or w
    rows, x, v = _parts(X)
    oL, oR = -(-p // s), (L - 1 + p - (w - 1)) // s  # interior outputs: the window inside [0, L)
    win, reach = _pool_windows(w, s, p)
    work = x.numel() * -(-w // s)
    if bool(torch.isfinite(c)):  # sum(v - c) over the window, + c for each of its elements in range
        T = _windowed(
            rows, x, (v - c)[None], shape, oL, oR, win, reach, L, float(c) * w, div_int, work
        )
        vals = T.sums[0]
        if T.edge.numel():
            div, real = _pool_div(T.t[T.edge], L, w, s, p, cip, divisor)
            vals[T.edge] = (vals[T.edge] + c * real) / div
        return T, vals
    T = _windowed(
        rows, x, torch.stack([v, torch.ones_like(v)]), shape, oL, oR, win, reach, L, work=work
    )
    div, real = _pool_div(T.t, L, w, s, p, cip, divisor)
    n_fill = real - T.sums[1].round().long()
    return T, (T.sums[0] + _fill_term(c.to(T.sums.dtype), n_fill, n_fill)) / div


@register(aten.avg_pool2d_backward.default)
def _avg_pool2d_backward(func, args, kwargs):
    """``grad_in[i] = sum_{o covers i} G[o] / div(o)``: the transposed windows of ``G``'s stored
    elements, and ``g * coverage / w`` at the unspecified elements (uniform when the stride divides
    the window)."""
    G, X = args[0], args[1]
    k, st, pd, ceil, cip, divisor = _pool_args(args[1:], kwargs)
    _refuse_indefinite(G, "the gradient of avg_pool")
    # a dense gradient: so is this one
    if isinstance(X, SparseTensor) and not isinstance(G, SparseTensor):
        check_densify(
            f"{func} (a dense upstream gradient)", X.numel() * X.element_size(), by_nature=True
        )
        # (the input's values are not read)
        return func(G, G.new_empty(X.shape), *args[2:], **kwargs)
    per = _dense_window(X, k, st, pd)
    # slice by slice
    if per is not None and isinstance(G, SparseTensor) and G.dense_dim() == X.dense_dim():
        D = tuple(X._dense_shape)
        grad = lambda g: func(g, g.new_empty(g.shape[: 4 - per] + D[-per:]), *args[2:], **kwargs)
        v, f = (_slices(grad, t, per, (), {}) for t in (G._vals, G._fill.expand(G._dense_shape)))
        return rewrap(G, values=v, fill=f, size=X.shape, known_zero=False)
    if not _pool_supported(X, k, st, pd) or not isinstance(G, SparseTensor) or G.dense_dim():
        return NotImplemented
    w, s, g = k[1], st[1], G._fill
    # coverage w/s varies with i mod s: dense
    if w % s and not (bool(torch.isfinite(g)) and not bool(g)):
        if not bool(torch.isfinite(g)) or not bool(torch.isfinite(G._vals).all()):
            return NotImplemented
        G = _every_output_stored(G)  # dense by nature: O(outputs), the input's size over the stride
        g = G._fill
    T, vals = _pool_grad_values(G, X.shape, w, s, pd[1], cip, divisor)
    return _build(
        T.row, T.t, vals.to(G.dtype), X.shape, g / (divisor or w) * (w // s), X._sf_layout, T.idx
    )


def _every_output_stored(G: SparseTensor) -> SparseTensor:
    """``G`` with every element stored and fill 0 (a gradient whose pooled form is dense by
    nature)."""
    check_densify(
        "avg_pool's gradient with a stride that does not divide the window",
        G.numel() * G.element_size(),
        by_nature=True,
    )
    return parts_to_sparse(
        *every_element(G),
        G.shape,
        G._fill.new_zeros(()),
        known_zero=True,
        layout=torch.sparse_coo,
        coalesced=True,
    )


def _pool_grad_values(G: SparseTensor, shape, w: int, s: int, p: int, cip: bool, divisor):
    """``(targets, values)`` of the gradient of :func:`_pool_values` where it differs from the
    interior value ``g / div * (w // s)`` (over the input's ``shape``; float64 values)."""
    L, Lo, g = shape[-1], G.shape[-1], G._fill
    rows, o, gv = _parts(G)
    div_int = divisor or w
    oL, oR = (
        -(-p // s),
        (L - 1 + p - (w - 1)) // s,
    )  # interior outputs: the window inside [0, L), divisor w
    iL, iR = oL * s - p + w - 1, oR * s - p  # interior inputs: every covering output interior
    win, reach = _pool_windows(w, s, p)
    # outputs whose divisors differ (padding, ceil_mode): at either end of a row
    oedge = ((o < oL) | (o > oR)).nonzero().squeeze(1) if oL > 0 or oR < Lo - 1 else o[:0]
    inv_edge = 1 / _pool_div(o[oedge], L, w, s, p, cip, divisor)[0].to(torch.float64)
    work = o.numel() * -(-w // s)
    # sum((G - g) / div) over the covering outputs, + g times their total weight
    if bool(torch.isfinite(g)):
        cols = (
            gv.to(torch.float64)
            if G._fill_is_zero() and not oedge.numel()
            else (gv - g).to(torch.float64)
        )
        if oedge.numel():
            cols[oedge] *= inv_edge * div_int
        T = _windowed(
            rows, o, cols[None], shape, iL, iR, reach, win, Lo, float(g) * (w // s), div_int, work
        )
        vals = T.sums[0]
        if T.edge.numel():
            w_edge, _ = _edge_weights(T.t[T.edge], Lo, L, w, s, p, cip, divisor)
            vals[T.edge] = vals[T.edge] / div_int + g * w_edge
        return T, vals
    inv = torch.full(o.shape, 1 / div_int, dtype=torch.float64, device=o.device)
    inv[oedge] = inv_edge
    T = _windowed(
        rows,
        o,
        torch.stack([gv * inv, inv, torch.ones_like(inv)]),
        shape,
        iL,
        iR,
        reach,
        win,
        Lo,
        work=work,
    )
    w_all = torch.full((T.t.numel(),), w // s / div_int, dtype=torch.float64, device=gv.device)
    n_all = torch.full((T.t.numel(),), w // s, dtype=torch.int64, device=gv.device)
    w_all[T.edge], n_all[T.edge] = _edge_weights(T.t[T.edge], Lo, L, w, s, p, cip, divisor)
    sums = T.sums
    return T, sums[0] + _fill_term(
        g.to(sums.dtype), w_all - sums[1], n_all - sums[2].round().long()
    )


def _edge_weights(i, Lo: int, L: int, w: int, s: int, p: int, cip: bool, divisor):
    """``(total weight 1 / div, count)`` of the outputs covering the inputs ``i`` (one by one: the
    edge inputs). One tap of the window at a time: temporaries of ``len(i)`` elements, not ``len(i)
    x w`` (which outgrows the input where its rows are short against the window)."""
    total = torch.zeros(i.shape, dtype=torch.float64, device=i.device)
    count = torch.zeros(i.shape, dtype=torch.int64, device=i.device)
    zero = total.new_zeros(())
    for j in range(w if i.numel() else 0):
        num = i + (p - j)
        oo = torch.div(num, s, rounding_mode="floor")
        hit = (oo * s == num) & (oo >= 0) & (oo < Lo)
        d = _pool_div(oo.clamp(0, max(Lo - 1, 0)), L, w, s, p, cip, divisor)[0]
        total += torch.where(hit, 1 / d.to(torch.float64), zero)
        count += hit
    return total, count


# ---------------------------------------------------------------------- conv1d (convolution, 1-d)
