"""The backward of the reductions, as sparse as their forward.

``sum mean prod amax amin max min logsumexp var std var_mean std_mean norm linalg.vector_norm nansum
nanmean`` of a SparseTensor ``A`` that needs a gradient, over every sparse dim (and any of its dense
dims), run through :class:`SparseReduce`.  Every unspecified element of ``A`` in one dense slice has
the same value (the fill), so torch's derivative formula gives them all the same gradient: the
gradient of ``A`` is a SparseTensor with ``A``'s pattern, exact everywhere::

    grad_A at a stored element x = d(x)        grad_A's fill = d(fill)
    d(x) = torch's formula at x, with y = result, G = upstream gradient, broadcast back over the
           reduced dims, and the slice statistics it needs (a count of maxima, the mean) in closed
           form over the count m of unspecified elements:  stat = stat(stored) + m * stat(fill)

e.g. ``sum``: ``d(x) = G``; ``mean``: ``G / count``; ``amax``: ``G / (number of maxima)`` at the
maxima (torch's rule: evenly among the maxima; a fill that is the maximum counts ``m`` times);
``prod``: ``G`` times the product of the others (exclusive products of the stored values times
``fill ** m``).  torch's formula would instead expand the dense ``G`` to ``A``'s full shape before
any handler sees it (hence an autograd route: docs/architecture.md).  An indefinite fill skips the
unspecified elements (masked semantics, as the forward): ``m = 0`` and the gradient's fill is 0.

A reduction over some sparse dims only (the rest kept) gives the unspecified elements gradients that
vary slice by slice: the gradient is then exact at the pattern with the *mean* over the unspecified
elements as its fill (:func:`partial_grad`), which is exact for what reads it only there and in sum,
the constructor; so it is routed only where ``linalg_autograd.pattern_grad_is_exact(A)`` (``A``
built by a constructor, through coalesce/layout changes/transposes or element-wise ops with the same
derivative at every unspecified element, or an indefinite fill).

``max``/``min`` with a dim (values and indices, the gradient to the selected element) are in
``select_autograd.py``.  A reduction over dense dims only (``A.amax(-1)`` of a hybrid):
:func:`dense_dims_grad`, routed as the partial ones (which may reduce dense dims too).  Not routed
(torch's formulas, as before): those partial reductions of another ``A``, ``prod`` over a dense dim,
named dims, complex dtypes, ``out=``.

>>> import torch, sparsefill
>>> v, f = torch.tensor([1., 4.], requires_grad=True), torch.tensor(4., requires_grad=True)
>>> A = sparsefill.sparse_coo_tensor([[0, 2]], v, (5,), fill_value=f)
>>> A.amax().backward()                 # dense [1, 4, 4, 4, 4]: four maxima, 1/4 each
>>> v.grad.tolist(), f.grad.item()      # the fill's gradient: its 3 elements' sum
([0.0, 0.25], 0.75)
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from sparsefill._kernels import index as _index
from sparsefill._kernels.trace import traced
from sparsefill._autograd.functions import (
    _pattern,
    dense_grad,
    refuse_vmap,
    sparse_inside,
    sum_outside,
)
from sparsefill._tensor.parts import coalesced_parts, parts_to_sparse, rewrap, values_at
from sparsefill._kernels.grouping import group_slices
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops.autograd_routes import register_route
from sparsefill.ops.linalg.backward import pattern_grad_is_exact
from sparsefill.ops.reductions.variance import welford_mean

T = torch.Tensor
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


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


class SparseReduce(torch.autograd.Function):
    """``Y = call(A)``: the reduction ``name`` over ``dims`` (``opt``: its parameter); the backward
    is :func:`reduction_grad`."""

    @staticmethod
    def forward(A, call, name, dims, opt):
        return call(_pattern(A))

    @staticmethod
    def setup_context(ctx, inputs, output):
        A, _, ctx.name, ctx.dims, ctx.opt = inputs
        ctx.pattern = _pattern(A)
        ctx.save_for_backward(output)

    vmap = staticmethod(lambda info, in_dims, *args: refuse_vmap("a SparseTensor reduction"))

    @staticmethod
    @once_differentiable
    def backward(ctx, G):
        (Y,), G = ctx.saved_tensors, sparse_inside(G)
        P = ctx.pattern
        if ctx.dims and ctx.dims[0] >= P._sparse_ndim():  # dense dims only
            return dense_dims_grad(P, ctx.name, ctx.dims, ctx.opt, Y, G), None, None, None, None
        if not set(range(P._sparse_ndim())) <= set(ctx.dims):
            return partial_grad(P, ctx.name, ctx.dims, ctx.opt, Y, G), None, None, None, None
        if isinstance(G, SparseTensor):
            G = dense_grad(G)
        return (
            reduction_grad(ctx.pattern, ctx.name, ctx.dims, ctx.opt, Y, G),
            None,
            None,
            None,
            None,
        )


# ---------------------------------------------------------------------- routes
def _dims(A, dim):
    """``dim`` (None, an int or a sequence of ints) as a sorted list of A's dims; None for named
    dims."""
    nd = A.dim()
    if dim is None:
        return list(range(nd))
    ds = [dim] if isinstance(dim, int) else list(dim)
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in ds) or not ds:
        return None
    if nd == 0:
        return [] if all(d in (0, -1) for d in ds) else None
    if not all(-nd <= d < nd for d in ds):
        return None  # torch's IndexError from the forward
    return sorted({d % nd for d in ds})


def _apply(func, args, kwargs, name, dim, opt=None):
    """``func(*args, **kwargs)`` through :class:`SparseReduce` when ``args[0]`` is a SparseTensor
    needing a gradient and ``dim`` covers every sparse dim; else ``NotImplemented``."""
    A = args[0] if args else kwargs.get("input")
    if not (isinstance(A, SparseTensor) and A.requires_grad and A.dtype in _FLOATS):
        return NotImplemented
    dims, sd = _dims(A, dim), A._sparse_ndim()
    if dims is None or name == "prod" and A.dense_dim() and any(d >= sd for d in dims):
        return NotImplemented
    # dense dims only (the gradient's fill: a mean, read as the constructor does)
    if dims and dims[0] >= sd and sd:
        if name in ("prod", "max", "min") or not pattern_grad_is_exact(A):
            return NotImplemented
    # some sparse dims kept (dense dims too): as the constructor reads
    elif not set(range(sd)) <= set(dims):
        if not dims or name in ("max", "min") or not pattern_grad_is_exact(A):
            return NotImplemented

    def call(P):
        return func(
            *(P if a is A else a for a in args),
            **{k: P if v is A else v for k, v in kwargs.items()},
        )

    return SparseReduce.apply(A, call, name, tuple(dims), opt)


def _bind(sig, args, kwargs):
    """``sig``'s reading of the call, or False (another overload, or torch's own error from the
    forward)."""
    try:
        return sig(*args, **kwargs)
    except TypeError:
        return False


def _sig_dim(input, dim=None, keepdim=False, *, dtype=None):
    return dim


def _sig_all(input):
    return None


def _sig_amax(input, dim=(), keepdim=False):
    return None if isinstance(dim, (tuple, list)) and not dim else dim


def _sig_logsumexp(input, dim, keepdim=False):
    return dim


def _sig_prod(input, dim=None, keepdim=False, *, dtype=None):
    return dim if dim is None or isinstance(dim, int) else False


def _route_simple(name, sig):
    def route(func, args, kwargs):
        dim = _bind(sig, args, kwargs)
        return NotImplemented if dim is False else _apply(func, args, kwargs, name, dim)

    return route


for _name, _sig, _funcs in (
    ("sum", _sig_dim, (torch.sum, T.sum)),
    ("mean", _sig_dim, (torch.mean, T.mean)),
    ("nansum", _sig_dim, (torch.nansum, T.nansum)),
    ("nanmean", _sig_dim, (torch.nanmean, T.nanmean)),
    ("amax", _sig_amax, (torch.amax, T.amax)),
    ("amin", _sig_amax, (torch.amin, T.amin)),
    ("logsumexp", _sig_logsumexp, (torch.logsumexp, T.logsumexp)),
    ("prod", _sig_prod, (torch.prod, T.prod)),
):
    register_route(*_funcs)(_route_simple(_name, _sig))


def _sig_var(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(dim, bool):  # var(input, unbiased)
        dim, unbiased = None, dim
    if unbiased is not None and correction is not None:
        return False
    return dim, (1 if unbiased is None else int(unbiased)) if correction is None else correction


@register_route(torch.var, T.var, torch.std, T.std)
def _route_var(func, args, kwargs):
    """``var``/``std`` with ``unbiased`` or ``correction`` (default 1)."""
    b = _bind(_sig_var, args, kwargs)
    if not b or not isinstance(b[1], (int, float)):
        return NotImplemented
    dim, correction = b
    return _apply(func, args, kwargs, func.__name__, dim, (correction, dim is None))


def _sig_keepdim(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    return keepdim


@register_route(torch.var_mean, torch.std_mean)
def _route_var_mean(func, args, kwargs):
    """``var_mean``/``std_mean`` as the routed ``(var or std, mean)`` of the same arguments: their
    backwards are as sparse as theirs (torch's formula forms ``A - A.mean(dim, True)``, which stores
    every element of each slice holding a stored one: O(nse * slice length))."""
    b, keepdim = _bind(_sig_var, args, kwargs), _bind(_sig_keepdim, args, kwargs)
    if not b or not isinstance(b[1], (int, float)) or not isinstance(keepdim, bool):
        return NotImplemented
    (dim, correction), A = b, args[0] if args else kwargs.get("input")
    first = torch.var if func is torch.var_mean else torch.std
    s = _apply(
        first,
        (A,),
        {"dim": dim, "correction": correction, "keepdim": keepdim},
        first.__name__,
        dim,
        (correction, dim is None),
    )
    m = _apply(torch.mean, (A,), {"dim": dim, "keepdim": keepdim}, "mean", dim)
    if s is NotImplemented or m is NotImplemented:
        return NotImplemented
    dims = list(range(A.dim())) if dim is None else [dim] if isinstance(dim, int) else list(dim)
    return s, welford_mean(A, m, dims, keepdim)


def _sig_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    return ord, dim


def _sig_norm(input, p="fro", dim=None, keepdim=False, out=None, dtype=None):
    if out is not None or p == "fro" and not (dim is None or isinstance(dim, int) or len(dim) <= 2):
        return False
    return (2 if p == "fro" else p), dim


@register_route(torch.linalg.vector_norm, torch.norm, T.norm)
def _route_norm(func, args, kwargs):
    """``vector_norm(A, ord, dim)``; ``torch.norm`` with ``p`` a number or ``'fro'`` (a vector
    2-norm)."""
    b = _bind(_sig_vector_norm if func is torch.linalg.vector_norm else _sig_norm, args, kwargs)
    if not b or isinstance(b[0], (str, bool)) or not isinstance(b[0], (int, float)):
        return NotImplemented
    return _apply(func, args, kwargs, "norm", b[1], float(b[0]))


# (max/min with a dim: registers its route with the helpers above)
from sparsefill.ops.reductions import select_backward as select_autograd  # noqa: E402,F401
