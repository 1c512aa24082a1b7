"""Pairwise distances between the rows of a SparseTensor matrix and those of a dense one
(``torch.cdist``, nearest centroids of a sparse data matrix)::

    torch.cdist(A, X, p) == torch.cdist(A.to_dense(), X, p)

Every row of ``A`` with nothing stored is the fill row ``f``, at ``S_k = Σ_j |f_j - x_kj|^p`` from
row ``k`` of ``X``; a row with stored elements differs from it there only::

    d(a_i, x_k)^p = S_k + Σ_{j stored in row i} (|a_ij - x_kj|^p - |f - x_kj|^p)

(``p = 0`` counts the differing elements alike; the p-th root taken last), ``O(nse K + D K)`` work
for ``K`` rows of ``X``; a hybrid ``A``'s stored rows are whole rows, measured as they are.  The
euclidean form of torch's matrix-product path (``_euclidean_dist``: more than 25 rows) is
``sqrt(|a|^2 + |x|^2 - 2 a.x)`` with the product over the stored elements (``A @ X.T``).  The result
(``N x K``) is dense by nature; neither form builds ``A``'s dense matrix.  A batched, indefinite or
``p = inf`` call, one with both operands SparseTensors, or an inf or NaN in the fill or the
dense operand takes the next stage.  The backward (through ``torch.cdist``) is as sparse: the
euclidean form's products' on the pattern, the direct form's in closed form (:class:`PDistance`).
"""

from __future__ import annotations

import math

import torch

from sparsefill._autograd.functions import _pattern, refuse_vmap, sparse_inside
from sparsefill._kernels.grouping import pattern_cached
from sparsefill._tensor.parts import coalesced_parts
from sparsefill._tensor.policy import check_densify
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops._schema import meta_like
from sparsefill.ops.autograd_routes import register_route
from sparsefill.ops.linalg.backward import _matmul, gradient_on_pattern, pattern_grad_is_exact
from sparsefill.ops.registry import register

aten = torch.ops.aten
_CHUNK = 1 << 22  # elements of the (stored elements x rows of X) differences made at once


def _operands(x1, x2):
    """``(A, X, swapped)``: the SparseTensor matrix and the dense one (``swapped``: ``A`` is
    ``x2``), or None where this module does not take the call."""
    s1, s2 = isinstance(x1, SparseTensor), isinstance(x2, SparseTensor)
    if s1 == s2 or x1.dim() != 2 or x2.dim() != 2:
        return None
    A, X = (x1, x2) if s1 else (x2, x1)
    if A._indefinite or A.dense_dim() > 1 or X.dtype != A.dtype or not A.dtype.is_floating_point:
        return None
    # (an inf or NaN in the fill or in X: the corrections would subtract inf from inf)
    if not (bool(torch.isfinite(A._fill).all()) and bool(torch.isfinite(X).all())):
        return None
    return A, X, not s1


def _oriented(d: torch.Tensor, swapped: bool) -> torch.Tensor:
    """The ``(N, K)`` distances of ``A``'s rows as the call's result (``K x N`` where ``A`` came
    second)."""
    return d.mT.contiguous() if swapped else d


def _gate(A: SparseTensor, X: torch.Tensor) -> None:
    """The densify policy's dense-by-nature gate for the ``N x K`` result."""
    check_densify(
        "cdist of a SparseTensor", A.shape[0] * X.shape[0] * A.element_size(), by_nature=True
    )


@register_route(torch.cdist, always=True)
def _cdist_route(func, args, kwargs):
    """``torch.cdist(x1, x2, p, compute_mode)`` with one 2-d SparseTensor operand: computed here,
    past torch's batching reshapes (a view of ``A`` as ``(1, N, D)``).  Under autograd the
    euclidean form's own ops carry the gradient (its products' backward on the pattern), the
    direct form's is :class:`PDistance`'s; a leaf ``A`` (dense semantics: its gradient is dense by
    nature) takes torch's path."""
    names = ("x1", "x2", "p", "compute_mode")
    got = dict(zip(names, args))
    if set(got) & set(kwargs) or set(kwargs) - set(names):
        return NotImplemented
    got.update(kwargs)
    x1, x2 = got.get("x1"), got.get("x2")
    p, mode = got.get("p", 2.0), got.get("compute_mode")
    if not isinstance(x1, torch.Tensor) or not isinstance(x2, torch.Tensor):
        return NotImplemented
    ops = _operands(x1, x2)
    if ops is None or not isinstance(p, (int, float)) or p < 0 or math.isinf(p):
        return NotImplemented
    A, X, swapped = ops
    if A.shape[-1] != X.shape[-1] or mode not in _MODES:
        return NotImplemented  # (torch's errors)
    mm = p == 2 and (
        mode == "use_mm_for_euclid_dist"
        or mode != "donot_use_mm_for_euclid_dist"
        and max(A.shape[0], X.shape[0]) > 25
    )
    if mm:
        d = euclidean(A, X)
    elif torch.is_grad_enabled() and (A.requires_grad or X.requires_grad):
        if A.requires_grad and not pattern_grad_is_exact(A):  # (a leaf: dense semantics)
            return NotImplemented
        d = PDistance.apply(A, X, float(p))
    else:
        d = p_distance(A, X, float(p))
    return _oriented(d, swapped)


_MODES = (
    None,
    "use_mm_for_euclid_dist_if_necessary",
    "use_mm_for_euclid_dist",
    "donot_use_mm_for_euclid_dist",
)


@register(aten._euclidean_dist.default)
def _euclidean(func, args, kwargs):
    """``sqrt(max(|a|² + |x|² - 2 a·x, 1e-30))`` (torch's form), the product on the stored
    elements."""
    x1, x2 = args
    func(meta_like(x1), meta_like(x2))  # torch's errors
    ops = _operands(x1, x2)
    if ops is None:
        return NotImplemented
    A, X, swapped = ops
    d = euclidean(A, X)
    return _oriented(d, swapped)


@register(aten._cdist_forward.default)
def _cdist(func, args, kwargs):
    """``cdist(A, X, p)`` for a finite ``p``: :func:`p_distance`."""
    x1, x2, p = args[0], args[1], args[2]
    meta = func(meta_like(x1), meta_like(x2), *args[2:])  # torch's errors, the result's shape
    ops = _operands(x1, x2)
    if ops is None or math.isinf(p):
        return NotImplemented
    A, X, swapped = ops
    d = p_distance(A, X, p)
    return _oriented(d, swapped).reshape(meta.shape)


def euclidean(A: SparseTensor, X: torch.Tensor) -> torch.Tensor:
    """``(N, K)``: ``sqrt(max(|a_i|² + |x_k|² - 2 a_i·x_k, 1e-30))``, torch's matrix-product
    form, from ``A``'s ops (``A @ X^T``: its sparse backward)."""
    _gate(A, X)
    na = _row_norms(A)
    dot = _product(A, X.mT)
    dot = dot.to_dense() if isinstance(dot, SparseTensor) else dot
    nx = (X * X).sum(-1, keepdim=True).mT
    if dot.requires_grad:
        return (na + nx - 2 * dot).clamp_min(1e-30).sqrt()
    # (in place on the product, which nothing else holds: no N x K temporaries)
    return dot.mul_(-2).add_(na).add_(nx).clamp_min_(1e-30).sqrt_()


def _product(A: SparseTensor, X: torch.Tensor) -> torch.Tensor:
    """``A @ X`` through the matrix products' autograd route where it applies (a route runs with
    ``__torch_function__`` off: called directly), else the op."""
    out = _matmul(A, X)
    return A @ X if out is NotImplemented else out


def _row_norms(A: SparseTensor) -> torch.Tensor:
    """``(N, 1)``: ``|a_i|²``, kept while ``A``'s pattern, values and fill are unchanged (the
    rows of a data matrix measured against new centroids each step) unless ``A`` needs a
    gradient."""

    def compute():  # (a product with ones: its backward is on the pattern, as A @ X^T's)
        n = _product(A * A, torch.ones(A.shape[-1], 1, dtype=A.dtype, device=A.device))
        return n.to_dense() if isinstance(n, SparseTensor) else n

    if A.requires_grad and torch.is_grad_enabled():
        return compute()
    parts = (A._idx,) if A._sf_layout is torch.sparse_coo else (A._crow, A._col)
    return pattern_cached("row norms", (*parts, A._vals, A._fill), compute)


def p_distance(A: SparseTensor, X: torch.Tensor, p: float) -> torch.Tensor:
    """``(N, K)``: the fill row's distances ``S_k``, corrected at the stored elements (module
    docstring); a hybrid ``A``'s stored rows measured whole."""
    _gate(A, X)
    f = A._fill.to(A.dtype).expand(A._dense_shape)  # (D,) for a hybrid A, else ()
    S = _powered(f - X, p).sum(-1)  # (K,): the fill row's
    out = S.expand(A.shape[0], X.shape[0]).clone()
    idx, vals = coalesced_parts(A)
    if A.dense_dim():  # whole stored rows
        step = max(1, _CHUNK // max(X.numel(), 1))
        for s in range(0, vals.shape[0], step):
            out[idx[0, s : s + step]] = _powered(vals[s : s + step, None] - X, p).sum(-1)
    else:
        out = _correct(out, idx[0], idx[1], vals, f, X, p)
    return out if p in (0, 1) else out.clamp_min(0).pow(1 / p)


def _powered(diff: torch.Tensor, p: float) -> torch.Tensor:
    """``|diff|^p`` as torch's cdist sums it (``p = 0``: 1 where the elements differ)."""
    if p == 0:
        return (diff != 0).to(diff.dtype)
    if p == 1:
        return diff.abs()
    if p == 2:
        return diff * diff
    return diff.abs().pow(p)


def _correct(out, rows, cols, vals, f, X, p) -> torch.Tensor:
    """``out[i, k] + |a_ij - x_kj|^p - |f - x_kj|^p`` summed over the stored ``(i, j)``, in
    chunks of stored elements (out of place: ``X``'s gradient flows through)."""
    K = X.shape[0]
    step = max(1, _CHUNK // max(K, 1))
    XT = X.mT
    for s in range(0, vals.shape[0], step):
        c = XT[cols[s : s + step]]  # (n, K)
        delta = _powered(vals[s : s + step, None] - c, p) - _powered(f - c, p)
        out = out.index_add(0, rows[s : s + step], delta)
    return out


class PDistance(torch.autograd.Function):
    """:func:`p_distance` with its gradients as torch's cdist backward gives them, ``A``'s on its
    pattern: with ``w_ik = G_ik / d_ik^(p-1)`` (0 where ``d_ik = 0``; ``G_ik`` for ``p = 1``)
    and ``u(z) = sign(z) |z|^(p-1)`` (0 at ``z = 0``)::

        dA_ij = Σ_k w_ik u(a_ij - x_kj)        dX_kj = -Σ_i w_ik u(a_ij - x_kj)

    the unspecified elements' terms summed by the fill row's ``u(f - x_kj)`` less the stored
    columns' (``O(nse K + D K)``; ``p = 0``: no gradient)."""

    @staticmethod
    def forward(A, X, p):
        return p_distance(A, X, p)

    @staticmethod
    def setup_context(ctx, inputs, output):
        A, X, p = inputs
        ctx.pattern, ctx.p = _pattern(A), p
        ctx.save_for_backward(X, output)

    vmap = staticmethod(lambda info, in_dims, *args: refuse_vmap("cdist"))

    @staticmethod
    def backward(ctx, G):
        X, D = ctx.saved_tensors
        P, p = ctx.pattern, ctx.p
        G = sparse_inside(G)
        if p == 0:
            gA = gradient_on_pattern(P, *_zero_grads(P))
            return gA if ctx.needs_input_grad[0] else None, torch.zeros_like(X), None
        w = G if p == 1 else torch.where(D == 0, 0.0, G / D.pow(p - 1)).to(G.dtype)
        idx, vals = coalesced_parts(P)
        f = P._fill.to(P.dtype).expand(P._dense_shape)
        uf = _slope(f - X, p)  # (K, D): the fill row's
        Wk = w.sum(0)  # (K,)
        if P.dense_dim():  # whole stored rows
            gv, rest, gX = _row_grads(w, Wk, idx[0], vals, uf, X, p)
            gA = gradient_on_pattern(P, idx, gv, rest) if ctx.needs_input_grad[0] else None
            return gA, gX if ctx.needs_input_grad[1] else None, None
        gv = vals.new_empty(vals.shape)
        rest = (Wk * uf.sum(1)).sum()
        gX = -(Wk[:, None] * uf)
        K = X.shape[0]
        step = max(1, _CHUNK // max(K, 1))
        XT = X.mT
        for s in range(0, vals.shape[0], step):
            r, c = idx[0, s : s + step], idx[1, s : s + step]
            xs = XT[c]  # (n, K)
            ws = w[r]  # (n, K)
            us, ufs = _slope(vals[s : s + step, None] - xs, p), _slope(f - xs, p)
            gv[s : s + step] = (ws * us).sum(1)
            rest = rest - (ws * ufs).sum()
            gX.index_add_(1, c, -(ws * (us - ufs)).mT)
        gA = gradient_on_pattern(P, idx, gv, rest) if ctx.needs_input_grad[0] else None
        return gA, gX if ctx.needs_input_grad[1] else None, None


def _row_grads(w, Wk, rows, V, uf, X, p) -> tuple:
    """A hybrid ``A``'s gradients (its stored rows ``V`` whole; ``Wk = w.sum(0)``): the stored
    rows', the unspecified rows' summed (``(D,)``) and ``X``'s."""
    ws = w[rows]  # (nr, K)
    unspecified = Wk - ws.sum(0)  # (K,): the unspecified rows' weights
    rest = unspecified @ uf  # (D,)
    gX = -(unspecified[:, None] * uf)
    gv = V.new_empty(V.shape)
    step = max(1, _CHUNK // max(X.numel(), 1))
    for s in range(0, V.shape[0], step):
        t = ws[s : s + step, :, None] * _slope(V[s : s + step, None] - X, p)  # (n, K, D)
        gv[s : s + step] = t.sum(1)
        gX -= t.sum(0)
    return gv, rest, gX


def _slope(z: torch.Tensor, p: float) -> torch.Tensor:
    """``u(z) = sign(z) |z|^(p-1)``, 0 at ``z = 0`` (torch's cdist backward per element)."""
    if p == 1:
        return torch.sign(z)
    if p == 2:
        return z
    return torch.where(z == 0, 0.0, torch.sign(z) * z.abs().pow(p - 1)).to(z.dtype)


def _zero_grads(P: SparseTensor) -> tuple:
    idx, vals = coalesced_parts(P)
    return idx, torch.zeros_like(vals), torch.zeros((), dtype=vals.dtype, device=vals.device)
