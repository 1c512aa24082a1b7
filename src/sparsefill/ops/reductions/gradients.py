"""The gradients of the reductions as SparseTensors with the input's pattern (no autograd here:
``backward.py`` holds the Function and the routes that call these).

For ``Y = name(P)`` over ``dims`` with upstream ``G``, torch's derivative formula ``d`` is
evaluated once at each stored element and once at the fill, the slice statistics it needs in
closed form over the ``m`` unspecified elements (:class:`_Slices`, :class:`_Segments`)::

    grad at a stored x = d(x, G, Y),   grad's fill = d(fill, G, Y),
    stat = stat(stored) + m * stat(fill)

over every sparse dim (:func:`reduction_grad`), some of them (:func:`partial_grad`: the fill is the
mean over the unspecified elements) or dense dims only (:func:`dense_dims_grad`).

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor([[0, 2]], [1., 4.], (5,), fill_value=4.)
>>> g = reduction_grad(A, "amax", [0], None, torch.tensor(4.), torch.tensor(1.))
>>> g.values().tolist(), g.fill_value().item()      # four maxima (one stored), 1/4 each
([0.0, 0.25], 0.25)
"""

from __future__ import annotations

import torch

from sparsefill._kernels import index as _index
from sparsefill._kernels.trace import traced
from sparsefill._autograd.functions import dense_grad, sum_outside
from sparsefill._tensor.parts import coalesced_parts, parts_to_sparse, rewrap, values_at
from sparsefill._kernels.grouping import group_slices
from sparsefill._tensor.tensor import SparseTensor


class _Slices:
    """The stored values ``V`` ``(nse, *D)`` and the fill ``F`` ``(*D)`` counted ``m`` times,
    reduced over every sparse dim and the dense dims ``rd``: statistics of shape ``K`` (``D`` with
    ``rd`` of size 1); ``Y`` the result (shape ``K``)."""

    def __init__(self, V, F, m, rd, K, Y):
        self.V, self.F, self.m, self.rd, self.K, self.Y = V, F, m, rd, K, Y

    def sum(self, fn):
        """``sum of fn(x, y)`` over each slice: the stored elements plus ``m`` times the fill's."""
        s = fn(self.V, self.Y).sum([0] + [d + 1 for d in self.rd], keepdim=True).reshape(self.K)
        if not self.m:
            return s
        f = fn(self.F, self.Y)
        # (sum over [] is over every dim)
        return s + self.m * (f.sum(self.rd, keepdim=True) if self.rd else f)

    def count(self):
        return self.sum(lambda x, y: torch.ones_like(x, dtype=torch.bool))


class _Segments:
    """Statistics of the slices of a reduction that keeps sparse dims: stored element ``i`` in slice
    ``seg[i]`` of ``S``, slice ``s`` holding ``m[s]`` unspecified elements; ``Ys`` the result at the
    slices ``(S, *K)`` (``K``: the dense shape with the reduced dense dims ``rd`` of size 1).
    ``at_values``: the statistics gathered to the stored elements (else one row per slice)."""

    def __init__(self, V, F, m, seg, Ys, at_values, rd=()):
        self.V, self.F, self.m, self.seg, self.Ys, self.at_values = V, F, m, seg, Ys, at_values
        self.rd = [d + 1 for d in rd]

    def _over_rd(self, t):
        return t.sum(self.rd, keepdim=True) if self.rd else t

    def sum(self, fn):
        t = fn(self.V, self.Ys[self.seg])
        t = self._over_rd(t.to(torch.int64) if t.dtype == torch.bool else t)
        s = torch.zeros(self.Ys.shape, dtype=t.dtype, device=t.device).index_add_(0, self.seg, t)
        f = fn(self.F, self.Ys)
        if self.rd:  # (per slice, over the reduced dense dims)
            f = self._over_rd(
                (f.to(torch.int64) if f.dtype == torch.bool else f).expand(
                    (self.Ys.shape[0],) + tuple(self.F.shape)
                )
            )
        m = self.m.view((-1,) + (1,) * (s.dim() - 1))
        # (0 * a NaN fill: no term)
        s = s + torch.where(m > 0, m * f, torch.zeros((), dtype=s.dtype))
        return s[self.seg] if self.at_values else s

    def count(self):
        return self.sum(lambda x, y: torch.ones_like(x, dtype=torch.bool))


# ---------------------------------------------------------------------- torch's formulas,
# element-wise
def _bc(G, x):
    return G.expand(torch.broadcast_shapes(G.shape, x.shape))


def _d_sum(x, G, Y, st, o):
    return _bc(G, x)


def _d_nansum(x, G, Y, st, o):
    return G * x.isnan().logical_not()


def _d_mean(x, G, Y, st, o):
    return _bc(G / st.count(), x)


def _d_nanmean(x, G, Y, st, o):
    keep = x.isnan().logical_not()
    return (G / st.sum(lambda t, y: t.isnan().logical_not())) * keep


def _d_amax(x, G, Y, st, o):
    """``amax``/``amin`` (``scale_grad_by_count``): ``G / count`` at each element equal to the
    result."""
    return (G / st.sum(lambda t, y: t == y)) * (x == Y)


def _d_max(x, G, Y, st, o):
    """``max()``/``min()`` (``evenly_distribute_backward``): NaN elements are the maxima of a NaN
    result."""

    def mask(t, y):
        return (t == y).logical_or(t.isnan().logical_and(y.isnan()))

    return mask(x, Y) * (G / st.sum(mask))


def _d_logsumexp(x, G, Y, st, o):
    return G * (x - Y).exp()


def _d_norm(x, G, Y, st, p):
    """``norm_backward`` of torch, ``Y`` the norm."""
    if p == 0:
        return torch.zeros_like(x * G)
    if p == 1:
        return x.sgn() * G
    if p == 2:
        return G * (x / Y).masked_fill(Y == 0, 0)
    if abs(p) == float("inf"):

        def mask(t, y):
            return t.abs().eq(y).logical_or(t.abs().isnan())

        return x.sgn() * ((G / st.sum(mask)) * mask(x, Y))
    if p < 1:
        return x.sgn() * x.abs().pow(p - 1).masked_fill(x == 0, 0) * G * Y.pow(1 - p)
    scale = (G / Y.pow(p - 1)).masked_fill(Y == 0, 0)
    return (x.sgn() * x.abs().pow(p - 1) if p < 2 else x * x.abs().pow(p - 2)) * scale


def _d_var(x, G, Y, st, o):
    """``var_backward``: ``2 / (n - correction) * G * (x - mean)``; with no dim and ``n <=
    correction``, ``G * (nan where x == mean else inf)``."""
    correction, no_dim = o
    n = st.count()
    mean = st.sum(lambda t, y: t) / n
    dof = n - correction
    out = (2.0 / dof) * G * (x - mean)
    if no_dim:
        nan, inf = x.new_tensor(float("nan")), x.new_tensor(float("inf"))
        out = torch.where(dof <= 0, G * torch.where(x == mean, nan, inf), out)
    return out


def _d_std(x, G, Y, st, o):
    return _d_var(x, (G / (Y * 2)).masked_fill(Y == 0, 0), Y, st, o)


def _prod_grads(V, F, m, G, Y):
    """``prod`` over the sparse dims (``prod_backward``): ``G * Y / x`` where no element is 0, else
    ``G`` times the product of the others (exclusive products from both ends of the stored values,
    ``F ** m`` for the unspecified ones)."""
    if not bool((V == 0).any()) and not (m and bool((F == 0).any())):
        return G * (Y / V), G * (Y / F)
    one = torch.ones_like(V[:1])
    left = torch.cat([one, V[:-1]]).cumprod(0)
    right = torch.cat([one, V.flip(0)[:-1]]).cumprod(0).flip(0)
    gv = G * left * right * F.pow(m)
    gf = G * V.prod(0) * F.pow(max(m - 1, 0))
    return gv, gf


FORMULAS = {
    "sum": _d_sum,
    "nansum": _d_nansum,
    "mean": _d_mean,
    "nanmean": _d_nanmean,
    "amax": _d_amax,
    "amin": _d_amax,
    "max": _d_max,
    "min": _d_max,
    "logsumexp": _d_logsumexp,
    "norm": _d_norm,
    "var": _d_var,
    "std": _d_std,
    "prod": None,
}


def reduction_grad(
    P: SparseTensor, name: str, dims, opt, Y: torch.Tensor, G: torch.Tensor
) -> SparseTensor:
    """The gradient of ``P`` through ``Y = name(P)`` over ``dims`` (every sparse dim, and these
    dense dims) for upstream ``G``: a SparseTensor with ``P``'s pattern and layout, its fill (over
    the dense dims) the gradient of every unspecified element."""
    sd, D = P._sparse_ndim(), tuple(P._dense_shape)
    rd = [d - sd for d in dims if d >= sd]
    K = tuple(1 if i in rd else n for i, n in enumerate(D))
    idx, V = coalesced_parts(P)
    ct = Y.dtype if Y.dtype.is_floating_point else P.dtype
    V = V.to(ct)
    F = V.new_zeros(D) if P._indefinite else P._fill.expand(D).to(ct)
    m = 0 if P._indefinite else _index.numel(P._sparse_shape) - idx.shape[1]
    G, Y = G.to(ct).reshape(K), Y.to(ct).reshape(K)
    if name == "prod":
        gv, gf = (G, G) if P.dim() == 0 else _prod_grads(V, F, m, G, Y)
    else:
        st = _Slices(V, F, m, rd, K, Y)
        gv, gf = FORMULAS[name](V, G, Y, st, opt), FORMULAS[name](F, G, Y, st, opt)
    # a gradient constant along dims (sum's: G broadcast) stays a broadcast view, as P's values may
    # be (an expanded SparseTensor's: one stored slice per prefix, stride 0 along the grown dims):
    # no element of it is formed
    gv = _broadcast(gv, V.shape, P.dtype)
    # no unspecified element reads the fill's gradient
    zero = P._indefinite or (not traced() and m == 0)
    gf = gf.new_zeros(D) if zero else _broadcast(gf, D, P.dtype)
    return _on_pattern(P, idx, gv, gf, zero)


def _broadcast(g: torch.Tensor, shape, dtype) -> torch.Tensor:
    """``g`` broadcast to ``shape`` in ``dtype``: a view where it repeats elements (stride 0 along
    the broadcast dims; autograd accumulates no subclass in place and clones a leaf's gradient that
    is not dense), else contiguous."""
    g = g.to(dtype).expand(shape)
    if traced(g):  # (symbolic sizes and strides: no branch on them)
        return g.contiguous()
    return g if any(st == 0 and n > 1 for st, n in zip(g.stride(), g.shape)) else g.contiguous()


def _on_pattern(P: SparseTensor, idx, gv, gf, zero: bool) -> SparseTensor:
    """A gradient of ``P`` with its pattern and layout: the values ``gv`` at ``P``'s coalesced
    indices ``idx``, the fill ``gf`` (``zero``: known to be 0)."""
    # P's own index tensors: the constructor's backward reads the values as they are
    if P._coalesced:
        return rewrap(
            P, values=gv.reshape(P._vals.shape), fill=gf, indefinite=False, known_zero=zero
        )
    return parts_to_sparse(
        idx, gv, P.shape, gf, known_zero=zero, layout=P._sf_layout, coalesced=True
    )


def _upstream(G, sd: int):
    """The upstream gradient ``G`` of a result with ``sd`` sparse dims: an indefinite fill read as
    0, and dense where it splits its dims otherwise."""
    G = _zero_fill(G)
    return dense_grad(G) if isinstance(G, SparseTensor) and G._sparse_ndim() != sd else G


def _zero_fill(G):
    """A gradient's indefinite fill is 0 (no output read those elements)."""
    if isinstance(G, SparseTensor) and G._indefinite:
        return rewrap(G, fill=G._vals.new_zeros(()), indefinite=False, known_zero=True)
    return G


def _seg_scan_prod(x, s):
    """Inclusive products along dim 0 within the runs of equal (sorted) ``s``: log2(n) passes, no
    division."""
    k, n = 1, x.shape[0]
    while k < n:
        same = (s[k:] == s[:-k]).view((-1,) + (1,) * (x.dim() - 1))
        x = torch.cat([x[:k], torch.where(same, x[k:] * x[:-k], x[k:])])
        k *= 2
    return x


def _exclusive_prods(V, seg):
    """``(products of the other stored elements of each one's slice, product of each slice's stored
    elements)``."""
    order = torch.argsort(seg, stable=True)
    x, s = V[order], seg[order]

    def before(x, s):  # the product of the earlier elements of the run: 1 for its first
        start = torch.cat([s.new_ones(1, dtype=torch.bool), s[1:] != s[:-1]]).view(
            (-1,) + (1,) * (x.dim() - 1)
        )
        return torch.where(start, 1, torch.cat([torch.ones_like(x[:1]), _seg_scan_prod(x, s)[:-1]]))

    others_sorted = before(x, s) * before(x.flip(0), s.flip(0)).flip(0)
    others = torch.empty_like(V).index_copy_(0, order, others_sorted)
    whole = torch.ones(
        (int(seg.max()) + 1 if seg.numel() else 0,) + tuple(V.shape[1:]),
        dtype=V.dtype,
        device=V.device,
    )
    whole[s] = others_sorted * x  # (one value per slice)
    return others, whole


def _prod_as_formula(V, F, m, seg, Gs, Ys, fill_counts):
    """``prod`` keeping sparse dims as a formula ``fn(x, G, Y, st, opt)`` of :func:`partial_grad`:
    ``G * Y / x`` where the input has no 0 (torch's ``prod_backward``), else ``G`` times the product
    of the others: for a stored element the other stored ones' times ``F ** m``, for an unspecified
    one the stored ones' times ``F ** (m - 1)``; a slice of fills only (``st`` a :class:`_Slices` of
    ``N`` fills): ``G * F ** (N - 1)``."""
    if not bool((V == 0).any()) and not (fill_counts and bool((F == 0).any())):
        return lambda x, G, Y, st, o: G * (Y / x)
    others, whole = _exclusive_prods(V, seg)
    mv = m.view((-1,) + (1,) * (V.dim() - 1))

    def fn(x, G, Y, st, o):
        if isinstance(st, _Slices):
            return G * F.pow(st.m - 1)
        if st.at_values:
            return G * others * F.pow(mv[seg])
        return G * whole * torch.where(mv > 0, F.pow((mv - 1).clamp(min=0)), 0)

    return fn


def partial_grad(P: SparseTensor, name: str, dims, opt, Y, G) -> SparseTensor:
    """The gradient of ``P`` through ``Y = name(P)`` over some of its sparse dims (and any of its
    dense dims): exact at the pattern, the mean over the unspecified elements as its fill (exact for
    a reader of the values and of the sum over the unspecified elements: the constructor; the
    gradient varies from slice to slice).

    Slices holding a stored element: torch's formula per slice (:class:`_Segments`); the others hold
    only fills, all alike: the formula is linear in ``G``, so their total is ``N * d(fill; sum of G
    there)``."""
    sd, D = P._sparse_ndim(), tuple(P._dense_shape)
    idx, V = coalesced_parts(P)
    ct = Y.dtype if Y.dtype.is_floating_point else P.dtype
    V = V.to(ct)
    F = V.new_zeros(D) if P._indefinite else P._fill.expand(D).to(ct)
    sdims, rd = [d for d in dims if d < sd], [d - sd for d in dims if d >= sd]
    K = tuple(1 if i in rd else n for i, n in enumerate(D))
    seg, out_idx, n_fill = group_slices(idx, P._sparse_shape, sdims)
    keep = Y.dim() == P.dim()
    osd = sd if keep else sd - len(sdims)
    if keep:  # keepdim: the reduced dims stay, of size 1, index 0
        full = out_idx.new_zeros((sd, out_idx.shape[1]))
        full[[d for d in range(sd) if d not in dims]] = out_idx
        out_idx = full
    keys = _index.linearize(out_idx, Y.shape[:osd])
    G = _upstream(G, osd)
    Gs = values_at(G, keys, osd).to(ct).reshape((-1,) + K)
    Ys = values_at(_zero_fill(Y), keys, osd).to(ct).reshape((-1,) + K)
    m = torch.zeros_like(n_fill) if P._indefinite else n_fill
    n_unspecified = _index.numel(P._sparse_shape) - idx.shape[1]
    if name == "prod":  # (the exclusive products: a formula of its own, prod_backward's)
        fn = _prod_as_formula(V, F, m, seg, Gs, Ys, not P._indefinite and n_unspecified > 0)
    else:
        fn = FORMULAS[name]
    gv = fn(V, Gs[seg], Ys[seg], _Segments(V, F, m, seg, Ys, True, rd), opt)
    gv = gv.expand(V.shape).to(P.dtype).contiguous()
    if P._indefinite or not n_unspecified:
        gf, zero = gv.new_zeros(D), True
    else:
        per_slice = fn(F, Gs, Ys, _Segments(V, F, m, seg, Ys, False, rd), opt)
        mask = (m > 0).view((-1,) + (1,) * len(D))
        total = torch.where(mask, m.view(mask.shape) * per_slice, torch.zeros((), dtype=ct)).sum(0)
        N = _index.numel([P.shape[d] for d in sdims])
        if n_unspecified > int(m.sum()):  # slices of fills only, alike: Y's fill there
            Yd = tuple(Y.shape[osd:])
            # (summed there: an inf stays inf)
            G_rest = sum_outside(G, out_idx, Y.shape, Yd).to(ct).reshape(K)
            Ye = Y._fill.expand(Yd).to(ct).reshape(K)
            total = total + N * fn(F, G_rest, Ye, _Slices(V[:0], F, N, rd, K, Ye), opt)
        gf, zero = (total / n_unspecified).to(P.dtype), False
    return _on_pattern(P, idx, gv, gf, zero)


def dense_dims_grad(P: SparseTensor, name: str, dims, opt, Y, G) -> SparseTensor:
    """The gradient of ``P`` through ``Y = name(P)`` over dense dims only (``A.amax(-1)`` of a
    hybrid): torch's formula on each stored element's dense slice (exact), and on the fill's with
    the sum of ``G`` over the unspecified elements (the formula is linear in ``G``), divided among
    them: the mean as the fill (what the constructor reads; routed where
    ``pattern_grad_is_exact``)."""
    sd, D = P._sparse_ndim(), tuple(P._dense_shape)
    rd = [d - sd for d in dims]
    K = tuple(1 if i in rd else n for i, n in enumerate(D))
    idx, V = coalesced_parts(P)
    ct = Y.dtype if Y.dtype.is_floating_point else P.dtype
    V = V.to(ct)
    keys = _index.linearize(idx, P._sparse_shape)
    G, Y = _zero_fill(G), _zero_fill(Y)  # (Y: a SparseTensor with P's sparse pattern)
    Gv = values_at(G, keys, sd).to(ct)
    Gs, Ys = Gv.reshape((-1,) + K), values_at(Y, keys, sd).to(ct).reshape((-1,) + K)
    fn = FORMULAS[name]
    # (sum's: G broadcast, a view)
    gv = _broadcast(fn(V, Gs, Ys, _RowStats(V, Ys, rd, 1), opt), V.shape, P.dtype)
    n = _index.numel(P._sparse_shape) - idx.shape[1]
    if P._indefinite or not n:
        gf, zero = (
            gv.new_zeros(()).expand(D),
            True,
        )  # (a broadcast zero: no element per dense position)
    else:
        F = P._fill.expand(D).to(ct)
        G_rest = sum_outside(G, idx, G.shape, G.shape[sd:]).to(ct).reshape(K)  # (an inf stays inf)
        Yf = Y._fill.to(ct).expand(tuple(Y.shape[sd:])).reshape(K)
        gf, zero = (
            (fn(F, G_rest, Yf, _RowStats(F, Yf, rd, 0), opt).expand(D) / n).to(P.dtype),
            False,
        )
    return _on_pattern(P, idx, gv, gf, zero)


class _RowStats:
    """:class:`_Slices` for a reduction over dense dims only: ``x`` ``(nse, *D)`` (``lead`` 1) or
    the fill ``(*D)`` (``lead`` 0), each slice its own, ``y`` the result broadcast to it."""

    def __init__(self, x, y, rd, lead):
        self.x, self.y, self.dims = x, y, [d + lead for d in rd]

    def sum(self, fn):
        return fn(self.x, self.y).sum(self.dims, keepdim=True)

    def count(self):
        return self.sum(lambda t, y: torch.ones_like(t, dtype=torch.bool))
