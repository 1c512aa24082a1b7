"""Multi-class margin losses of SparseTensor scores ``x`` (``(N, C)`` or ``(C,)``) against dense
index targets, in closed form over the stored elements and the count of unspecified ones::

    multi_margin_loss        loss_n = sum_{i != t_n} w[t_n] h(margin - x[n, t_n] + x[n, i]) / C
                             h(z) = z ** p where z > 0, else 0             (p = 1 or 2)
    multilabel_margin_loss   loss_n = sum_{j in T_n} sum_{i not in T_n} h(1 - x[n, j] + x[n, i]) / C
                             (T_n: the targets of row n before its first -1; p = 1)

Every unspecified element ``i`` of row ``n`` meets the same ``z`` (it holds the fill), so the sum
over them is their count times one term: O(nse + N) for ``multi_margin_loss`` and
O(sum_n |T_n| (nse_n + 1)) for ``multilabel_margin_loss``.  A hybrid ``x`` (sparse rows, classes
dense) computes its stored rows by torch's kernel and the rows holding the fill once per distinct
target.  An indefinite fill is a mask: the unspecified classes are no candidates (as ``-inf``
scores would be, whose ``z`` is never positive) and each target class must be stored.

The gradient of ``x`` is a constant over the unspecified elements of a row, but a different one
per row (it depends on the row's target score): dense by nature, built in one pass under the
densify policy (``check_densify(..., by_nature=True)``); for an indefinite ``x`` it is a
SparseTensor on ``x``'s pattern.

>>> import torch, sparsefill, torch.nn.functional as F
>>> x = sparsefill.sparse_coo_tensor([[0, 1], [2, 0]], [2., 1.], (2, 1000), fill_value=0.5)
>>> F.multi_margin_loss(x, torch.tensor([2, 0]), reduction="none")  # row 1: 999 h(1 - 1 + .5)
tensor([0.0000, 0.4995])
"""

from __future__ import annotations

import torch

from sparsefill._kernels.index import lookup
from sparsefill._tensor.parts import coalesced_parts, dense_of, parts_to_sparse, values_at
from sparsefill._tensor.policy import check_densify
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops.losses.losses import _bound
from sparsefill.ops.registry import register

aten = torch.ops.aten


class _Rows:
    """``x`` (2-D, or 1-D as one row) as rows ``r``, classes ``c`` and values ``v`` of its stored
    elements (coalesced, sorted by row), its fill ``f`` and the shape ``(N, C)``."""

    def __init__(self, x: SparseTensor):
        idx, self.v = coalesced_parts(x)
        if x.dim() == 1:
            self.r, self.c = torch.zeros_like(idx[0]), idx[0]
            self.N, self.C = 1, x.shape[0]
        else:
            self.r, self.c = idx[0], idx[1]
            self.N, self.C = x.shape
        self.keys = self.r * self.C + self.c
        self.indefinite = x._indefinite
        # (an indefinite fill takes no part: a placeholder keeps the formulas whole)
        self.f = self.v.new_zeros(()) if self.indefinite else x._fill.to(self.v.dtype)
        self.per_row = torch.bincount(self.r, minlength=self.N)

    def at(self, rows: torch.Tensor, cls: torch.Tensor, what: str):
        """``(x[rows, cls], stored?)``: the stored value or the fill; an indefinite ``x`` must
        store each such element."""
        pos, found = lookup(self.keys, rows * self.C + cls)
        if self.indefinite and not bool(found.all()):
            raise ValueError(
                f"{what}: a target class is not stored in the input, whose fill is indefinite (the "
                "unspecified classes are no candidates); store the target class of every sample"
            )
        vals = self.v[pos] if self.v.numel() else self.f.expand(pos.shape)
        return torch.where(found, vals, self.f), found

    def dense_grad(self, per_row_fill: torch.Tensor, what: str) -> torch.Tensor:
        """The dense ``(N, C)`` gradient holding ``per_row_fill[n]`` in row ``n`` (to be written
        at the stored and target elements), under the densify policy."""
        check_densify(what, self.N * self.C * self.v.element_size(), by_nature=True)
        return per_row_fill[:, None].expand(self.N, self.C).clone()


def _is_closed_form(x) -> bool:
    return isinstance(x, SparseTensor) and x.dim() in (1, 2) and x.dense_dim() == 0 and x.numel()


def _is_hybrid_rows(x) -> bool:
    return (
        isinstance(x, SparseTensor)
        and x.dim() == 2
        and x.dense_dim() == 1
        and not x._indefinite
        and x.numel()
    )


def _positive_term(z: torch.Tensor, p: int) -> torch.Tensor:
    """``h(z)``: ``z ** p`` where ``z > 0`` (a NaN ``z`` is not: 0, as torch's kernel)."""
    return torch.where(z > 0, z if p == 1 else z * z, 0)


def _times(count: torch.Tensor, term: torch.Tensor) -> torch.Tensor:
    """``count * term``, 0 where the count is 0 (no ``0 * inf``)."""
    return torch.where(count > 0, count.to(term.dtype) * term, 0)


def _reduce(loss: torch.Tensor, reduction: int, shape) -> torch.Tensor:
    if reduction == 0:
        return loss.reshape(shape)
    return loss.sum() if reduction == 2 else loss.mean()


def _row_scale(go: torch.Tensor, reduction: int, N: int, C: int) -> torch.Tensor:
    """The upstream gradient of each row's loss, divided by ``C`` (``N C`` for mean)."""
    g = go.reshape(-1) if reduction == 0 else go.reshape(()).expand(N)
    return g / (C * N) if reduction == 1 else g / C


def _weight_at(weight, t: torch.Tensor, dtype) -> torch.Tensor | None:
    if weight is None:
        return None
    w = values_at(weight, t, 1) if isinstance(weight, SparseTensor) else weight[t]
    return w.to(dtype)


def _weighted(term: torch.Tensor, w) -> torch.Tensor:
    """``term * w`` where the term is nonzero (torch weighs only the positive terms: a weight of
    inf or NaN leaves a zero term 0)."""
    return term if w is None else torch.where(term != 0, term * w, 0)


def _meta(t):
    if isinstance(t, SparseTensor):
        return torch.empty(t.shape, dtype=t.dtype, device="meta")
    return t.to("meta")


# --------------------------------------------------------------------------- multi_margin_loss
@register(aten.multi_margin_loss.default)
def _multi_margin_loss(func, args, kwargs):
    """``multi_margin_loss`` of the module docstring: per row the stored non-target terms, plus
    the unspecified non-target count times the fill's term."""
    x, t, p, margin, weight, reduction = _bound(func, args, kwargs)
    if isinstance(t, SparseTensor) or not isinstance(x, SparseTensor):
        return NotImplemented
    out = func(
        _meta(x), t.to("meta"), p, margin, _meta(weight) if weight is not None else None, reduction
    )  # torch's argument and shape errors
    if x.dim() == 0 or not x.numel():
        return func(dense_of(x), t, p, margin, _dense_weight(weight), reduction)
    if _is_hybrid_rows(x):
        return _reduce(_mm_hybrid(x, t, p, margin, weight), reduction, out.shape)
    if not _is_closed_form(x):
        return NotImplemented
    R = _Rows(x)
    tf = _checked_targets(t, R.C)
    xt, tstored = R.at(torch.arange(R.N), tf, "multi_margin_loss")
    w = _weight_at(weight, tf, R.v.dtype)
    nt = R.c != tf[R.r]
    stored = _weighted(_positive_term(margin - xt[R.r] + R.v, p), None if w is None else w[R.r])
    loss = torch.zeros(R.N, dtype=R.v.dtype).index_add_(0, R.r, torch.where(nt, stored, 0))
    if not R.indefinite:
        unspec = R.C - R.per_row - (~tstored).long()
        loss = loss + _times(unspec, _weighted(_positive_term(margin - xt + R.f, p), w))
    return _reduce(loss / R.C, reduction, out.shape)


@register(aten.multi_margin_loss_backward.default)
def _multi_margin_loss_backward(func, args, kwargs):
    """The gradient of ``multi_margin_loss``: ``g w[t] h'(z)`` at each non-target element with
    ``z > 0`` (``g``: the row's upstream gradient over ``C``), minus their sum at the target."""
    go, x, t, p, margin, weight, reduction = _bound(func, args, kwargs)
    if isinstance(t, SparseTensor) or isinstance(go, SparseTensor):
        return NotImplemented
    if isinstance(x, SparseTensor) and (x.dim() == 0 or not x.numel()):
        return func(go, dense_of(x), t, p, margin, _dense_weight(weight), reduction)
    if _is_hybrid_rows(x):
        return _mm_hybrid_grad(x, go, t, p, margin, weight, reduction)
    if not _is_closed_form(x):
        return NotImplemented
    R = _Rows(x)
    tf = _checked_targets(t, R.C)
    xt, tstored = R.at(torch.arange(R.N), tf, "multi_margin_loss")
    w = _weight_at(weight, tf, R.v.dtype)
    g = _row_scale(go, reduction, R.N, R.C)
    gw = g if w is None else g * w

    def slope(z, scale):
        return torch.where(z > 0, scale if p == 1 else 2 * z * scale, 0)

    nt = R.c != tf[R.r]
    gs = torch.where(nt, slope(margin - xt[R.r] + R.v, gw[R.r]), 0)
    tgrad = -torch.zeros(R.N, dtype=gs.dtype).index_add_(0, R.r, gs)
    if R.indefinite:
        gs = torch.where(nt, gs, tgrad[R.r])  # (each target is stored)
        return _on_pattern(x, R, gs)
    gf = slope(margin - xt + R.f, gw)
    tgrad = tgrad - _times(R.C - R.per_row - (~tstored).long(), gf)
    G = R.dense_grad(gf, "multi_margin_loss_backward")
    G[R.r, R.c] = gs
    G[torch.arange(R.N), tf] = tgrad
    return G.reshape(x.shape)


def _checked_targets(t: torch.Tensor, C: int) -> torch.Tensor:
    tf = t.reshape(-1)
    if bool(((tf < 0) | (tf >= C)).any()):
        raise RuntimeError("target out of range")
    return tf


def _on_pattern(x: SparseTensor, R: _Rows, vals: torch.Tensor) -> SparseTensor:
    """A gradient of an indefinite ``x``: ``vals`` at its stored elements, 0 elsewhere."""
    idx = torch.stack([R.r, R.c]) if x.dim() == 2 else R.c[None]
    return parts_to_sparse(
        idx,
        vals,
        x.shape,
        vals.new_zeros(()),
        known_zero=True,
        layout=x._sf_layout,
        coalesced=True,
    )


def _dense_weight(weight):
    if isinstance(weight, SparseTensor):  # (C elements, the size of a row of the input)
        check_densify(
            "a SparseTensor loss weight", weight.numel() * weight.element_size(), by_nature=True
        )
        return dense_of(weight)
    return weight


# --------------------------------------------------------------------------- hybrid rows
def _hybrid_parts(x: SparseTensor, t: torch.Tensor):
    """``(stored rows r, their values, the fill rows' distinct targets u, each row's index into
    u)`` of a hybrid ``(N, C)`` ``x`` with targets ``t`` (a row's fill loss depends on its target
    alone)."""
    idx, vals = coalesced_parts(x)
    r = idx[0]
    t = t.reshape(x.shape[0], *t.shape[1:])
    u, inv = torch.unique(t, dim=0, return_inverse=True)
    return r, vals, u, inv


def _mm_hybrid(x, t, p, margin, weight):
    f = x._fill.to(x.dtype).expand(x.shape[1:])
    r, vals, u, inv = _hybrid_parts(x, _checked_targets(t, x.shape[1]))
    kern = aten.multi_margin_loss.default
    loss = kern(f.expand(u.shape[0], -1).contiguous(), u, p, margin, None, 0)[inv]
    loss[r] = kern(vals, t.reshape(-1)[r], p, margin, None, 0)
    return _weighted(loss, _weight_at(weight, t.reshape(-1), x.dtype))


def _mm_hybrid_grad(x, go, t, p, margin, weight, reduction):
    N, C = x.shape
    f = x._fill.to(x.dtype).expand(x.shape[1:])
    tf = _checked_targets(t, C)
    r, vals, u, inv = _hybrid_parts(x, tf)
    g = _row_scale(go, reduction, N, C) * C  # (the kernel divides by C)
    w = _weight_at(weight, tf, x.dtype)
    kern = aten.multi_margin_loss_backward.default
    one = torch.ones(u.shape[0], dtype=x.dtype)
    check_densify("multi_margin_loss_backward", x.numel() * x.element_size(), by_nature=True)
    G = kern(one, f.expand(u.shape[0], -1).contiguous(), u, p, margin, None, 0)[inv]
    G = G * g[:, None]
    G[r] = kern(g[r], vals, tf[r], p, margin, None, 0)
    return G if w is None else _weighted(G, w[:, None])


# --------------------------------------------------------------------------- multilabel_margin
class _Labels:
    """The targets of each row before its first ``-1``: entries ``(row er, class ec)``, the
    sorted linear positions ``keys`` of the distinct ``(row, target)`` pairs and the per-row
    count of distinct targets (no pass over the target beyond finding each row's first -1)."""

    def __init__(self, t: torch.Tensor, N: int, C: int):
        t2 = t.reshape(N, C)
        first = (t2 < 0).to(torch.uint8).argmax(1) if C else t2.new_zeros(N)
        rows = torch.arange(N, device=t.device)
        count = torch.where(t2[rows, first] < 0, first, C) if C else first
        self.er = torch.repeat_interleave(rows, count)
        j = (
            torch.arange(self.er.numel(), device=t.device)
            - (torch.cumsum(count, 0) - count)[self.er]
        )
        self.ec = t2[self.er, j]
        if bool((self.ec >= C).any()):
            raise RuntimeError("argument #2 'target' is out of range")
        self.C, self.shape = C, (N, C)
        self.keys = torch.unique(self.er * C + self.ec)
        self.distinct = torch.bincount(self.keys // max(C, 1), minlength=N)

    def holds(self, rows: torch.Tensor, cls: torch.Tensor) -> torch.Tensor:
        """Whether ``(rows, cls)`` is a target pair."""
        return lookup(self.keys, rows * self.C + cls)[1]

    def mask(self, dtype) -> torch.Tensor:
        """torch's ``is_target``: 1 at the target pairs, dense as the target."""
        out = torch.zeros(self.shape, dtype=dtype)
        out.view(-1)[self.keys] = 1
        return out


def _label_pairs(R: _Rows, L: _Labels, nt: torch.Tensor):
    """Each (target entry, stored non-target element of its row) pair: ``(entry, stored)``."""
    counts = torch.zeros(R.N, dtype=torch.long).index_add_(0, R.r, nt.long())
    start = torch.cumsum(counts, 0) - counts
    order = torch.nonzero(nt).reshape(-1)  # the stored non-targets, sorted by row
    per_entry = counts[L.er]
    e = torch.repeat_interleave(torch.arange(L.er.numel()), per_entry)
    within = torch.arange(e.numel()) - (torch.cumsum(per_entry, 0) - per_entry)[e]
    return e, order[start[L.er][e] + within]


def _multilabel_terms(x: SparseTensor, t: torch.Tensor):
    """``(R, L, x at each target entry, pairs, z of each pair, z of each entry vs the fill, count
    of unspecified non-targets per row)``."""
    R = _Rows(x)
    L = _Labels(t, R.N, R.C)
    xe, _ = R.at(L.er, L.ec, "multilabel_margin_loss")
    nt = ~L.holds(R.r, R.c)
    e, s = _label_pairs(R, L, nt)
    z = 1 - xe[e] + R.v[s]
    zf = 1 - xe + R.f
    stored_nt = torch.zeros(R.N, dtype=torch.long).index_add_(0, R.r, nt.long())
    unspec = R.C - L.distinct - stored_nt
    return R, L, e, s, z, zf, unspec


@register(aten.multilabel_margin_loss_forward.default)
def _multilabel_margin_loss(func, args, kwargs):
    """``multilabel_margin_loss`` of the module docstring (and torch's ``is_target``, dense as
    the target): the pairs of a target entry and a stored non-target, plus per entry the count
    of unspecified non-targets times the fill's term."""
    x, t, reduction = _bound(func, args, kwargs)
    if isinstance(t, SparseTensor) or not isinstance(x, SparseTensor):
        return NotImplemented
    out, _ = func(_meta(x), t.to("meta"), reduction)
    if x.dim() == 0 or not x.numel():
        return func(dense_of(x), t, reduction)
    if _is_hybrid_rows(x):
        loss, is_target = _ml_hybrid(x, t)
        return _reduce(loss, reduction, out.shape), is_target
    if not _is_closed_form(x):
        return NotImplemented
    R, L, e, s, z, zf, unspec = _multilabel_terms(x, t)
    loss = torch.zeros(R.N, dtype=R.v.dtype)
    loss.index_add_(0, L.er[e], _positive_term(z, 1))
    if not R.indefinite:
        loss.index_add_(0, L.er, _times(unspec[L.er], _positive_term(zf, 1)))
    return _reduce(loss / R.C, reduction, out.shape), L.mask(R.v.dtype).reshape(x.shape)


@register(aten.multilabel_margin_loss_backward.default)
def _multilabel_margin_loss_backward(func, args, kwargs):
    """The gradient of ``multilabel_margin_loss``: ``g`` at a non-target element per target entry
    whose ``z > 0`` (``g``: the row's upstream gradient over ``C``), ``-g`` per such pair at the
    entry's target."""
    go, x, t, reduction, is_target = _bound(func, args, kwargs)
    if isinstance(t, SparseTensor) or isinstance(go, SparseTensor):
        return NotImplemented
    if isinstance(x, SparseTensor) and (x.dim() == 0 or not x.numel()):
        return func(go, dense_of(x), t, reduction, is_target)
    if _is_hybrid_rows(x):
        return _ml_hybrid_grad(x, go, t, reduction)
    if not _is_closed_form(x):
        return NotImplemented
    R, L, e, s, z, zf, unspec = _multilabel_terms(x, t)
    g = _row_scale(go, reduction, R.N, R.C)
    hit = (z > 0).to(R.v.dtype)
    gs = torch.zeros_like(R.v).index_add_(0, s, hit * g[L.er[e]])
    per_entry = torch.zeros(L.er.numel(), dtype=R.v.dtype).index_add_(0, e, hit)
    if R.indefinite:
        keys = L.er * R.C + L.ec
        pos, _ = lookup(R.keys, keys)  # (each target is stored)
        gs.index_add_(0, pos, -per_entry * g[L.er])
        return _on_pattern(x, R, gs)
    fhit = (zf > 0).to(R.v.dtype)
    per_entry = per_entry + _times(unspec[L.er], fhit)
    gf = torch.zeros(R.N, dtype=R.v.dtype).index_add_(0, L.er, fhit) * g
    G = R.dense_grad(gf, "multilabel_margin_loss_backward")
    G.view(-1)[L.keys] = 0
    nt = ~L.holds(R.r, R.c)
    G[R.r[nt], R.c[nt]] = gs[nt]
    G.index_put_((L.er, L.ec), -per_entry * g[L.er], accumulate=True)
    return G.reshape(x.shape)


def _ml_hybrid(x, t):
    f = x._fill.to(x.dtype).expand(x.shape[1:])
    r, vals, u, inv = _hybrid_parts(x, t)
    kern = aten.multilabel_margin_loss_forward.default
    loss = kern(f.expand(u.shape[0], -1).contiguous(), u, 0)[0][inv]
    t2 = t.reshape(x.shape)
    loss[r] = kern(vals, t2[r], 0)[0]
    L = _Labels(t2, *x.shape)
    return loss, L.mask(x.dtype)


def _ml_hybrid_grad(x, go, t, reduction):
    N, C = x.shape
    f = x._fill.to(x.dtype).expand(x.shape[1:])
    t2 = t.reshape(x.shape)
    r, vals, u, inv = _hybrid_parts(x, t2)
    g = _row_scale(go, reduction, N, C) * C  # (the kernel divides by C)
    kern = aten.multilabel_margin_loss_backward.default
    one = torch.ones(u.shape[0], dtype=x.dtype)
    fu = f.expand(u.shape[0], -1).contiguous()
    is_t = aten.multilabel_margin_loss_forward.default(fu, u, 0)[1]
    check_densify("multilabel_margin_loss_backward", x.numel() * x.element_size(), by_nature=True)
    G = kern(one, fu, u, 0, is_t)[inv] * g[:, None]
    is_r = aten.multilabel_margin_loss_forward.default(vals, t2[r], 0)[1]
    G[r] = kern(g[r], vals, t2[r], 0, is_r)
    return G


_multi_margin_loss_backward.dense_by_nature = _multilabel_margin_loss_backward.dense_by_nature = (
    "a defined fill: each row's unspecified elements share a gradient that differs by row"
)
