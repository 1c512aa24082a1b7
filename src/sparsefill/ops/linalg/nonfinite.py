"""Exact matrix products where an operand holds inf or NaN (the non-finite paths of :mod:`.linalg`).

The decomposition ``A @ X = A0 @ X + F @ X`` of :mod:`.linalg` needs finite operands: ``A0 = A - F``
is NaN everywhere for a non-finite fill, and ``0 * inf`` terms of unspecified elements vanish from
``A0 @ X``.  Here those terms are summed as the dense product sums them::

    (A @ X)[i, j] = sum_{k stored} A[i, k] X[k, j] + sum_{k unspecified} F[i, k] X[k, j]

the second sum from its finite part and the counts of ``+inf``, ``-inf`` and NaN terms (one native
product of ``4n`` indicator columns; ``inf + -inf`` and any NaN give NaN), so ``densify(A) @ X == A
@ X`` holds bitwise in where the NaN and infinities fall:

* :func:`sp_dense_exact`: sparse @ dense with an inf/NaN in ``X`` or the fill (zero fill: NaN where
  a row's unspecified element meets a non-finite ``X[k, j]``; a fill constant along the rows, along
  each row (:func:`_rowfill_exact`: sign counts), or along neither (:func:`_batchfill_exact`);
  complex: the exact real products).
* :func:`sp_sp_stored_nonfinite`: sparse @ sparse with finite fills and a stored inf/NaN (zero fills
  keep a sparse result: NaN at the rows/columns holding them, :func:`_uncovered`).
* :func:`nonfinite_sp_sp`: sparse @ sparse with a scalar non-finite fill, each sum a product with
  finite fills; :func:`one_dense` densifies an operand when it is no larger than the result.

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor([[0, 1], [2, 0]], [1., 2.], (2, 3), fill_value=float("inf"))
>>> x = torch.tensor([[1.], [0.], [-1.]])
>>> torch.equal((A @ x).isnan(), (A.to_dense() @ x).isnan())
True
"""

from __future__ import annotations

import torch

from sparsefill._kernels import index as _index
from sparsefill._kernels.trace import known_true
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops.shape import reshape as _shape
from sparsefill.ops.linalg.product import (
    _dense_sp,
    _Mat,
    _native_pairs,
    _native_spmm,
    _sp_dense,
    _sp_sp,
    product,
)


def sp_dense_exact(M: _Mat, X: torch.Tensor) -> torch.Tensor:
    """``A @ X`` (``X`` dense ``(nb | 1, k, n)``) where ``X`` or the fill is not finite: the
    unspecified elements' terms ``F[i, k] * X[k, j]`` summed as dense sums them (``0 * inf`` is NaN;
    ``inf - inf`` never arises from the decomposition)."""
    if M.fill is not None and M.fill.shape[1] != 1 and M.fill.shape[2] != 1:
        return _batchfill_exact(M, X)
    if M.vals.dtype.is_complex:
        return _complex_exact(M, X)
    # zero fill, X not finite: NaN where a row's unspecified k meets an inf/NaN X[k, j]
    if M.fill is None:
        nf = (~torch.isfinite(X)).to(M.vals.dtype)
        C = nf.sum(-2, keepdim=True) - _native_spmm(M, nf, torch.ones_like(M.vals))
        nan = torch.full((), float("nan"), dtype=M.vals.dtype, device=X.device)
        return _native_spmm(M, X, M.vals) + torch.where(C > 0, nan, 0)
    if M.fill.shape[1] != 1:
        return _rowfill_exact(M, X)
    # T[b, k, j] = F[b, :, k] * X[b, k, j]; the fill term sums T over the unspecified k of each row
    T = M.fill.transpose(-1, -2) * X
    n = X.shape[-1]
    big = torch.cat(
        [torch.where(torch.isfinite(T), T, 0), T == float("inf"), T == -float("inf"), T.isnan()], -1
    )
    big = big.to(T.dtype)
    ones = torch.ones_like(M.vals)
    C = big.sum(-2, keepdim=True) - _native_spmm(M, big, ones)
    cf, cp, cn, cnan = C.split(n, -1)
    out = _native_spmm(M, X, M.vals) + cf
    return out + _inf_terms(cp, cn, cnan)


def _complex_exact(M: _Mat, X: torch.Tensor) -> torch.Tensor:
    """``A @ X`` for complex values where ``X`` or the fill is not finite, from the exact real
    products: ``(Ar @ Xr - Ai @ Xi) + i (Ar @ Xi + Ai @ Xr)`` sums the real and imaginary parts of
    the terms ``A[i, k] * X[k, j]`` that dense sums (grouped otherwise: a sum of extended reals is
    NaN, +-inf or finite whatever its grouping)."""

    def part(f):
        fill = None if M.fill is None else f(M.fill)
        finite = fill is None or known_true(torch.isfinite(fill).all())
        return _Mat(
            M.nb,
            M.m,
            M.k,
            M.crow,
            M.col,
            f(M.vals),
            fill,
            finite,
            M.layout,
            M._rows,
            M.key,
            M.indefinite,
        )

    re, im = part(torch.real), part(torch.imag)
    Xr, Xi = X.real, X.imag
    return torch.complex(
        _sp_dense(re, Xr) - _sp_dense(im, Xi), _sp_dense(re, Xi) + _sp_dense(im, Xr)
    )


def _batchfill_exact(M: _Mat, X: torch.Tensor) -> torch.Tensor:
    """``A @ X`` for a fill varying along both matrix dims (``A`` sparse along its batch dim only:
    each matrix is stored whole or is the fill), exact for any ``X`` and fill: the stored matrices'
    products plus ``F @ X`` (dense) for the others."""
    # (nb,): a matrix with stored elements is stored whole
    stored = (M.crow[M.m :: M.m] - M.crow[: -1 : M.m]) > 0
    return _native_spmm(M, X, M.vals) + torch.where(
        stored[:, None, None], 0, torch.matmul(M.fill, X)
    )


def _inf_terms(cp, cn, cnan):
    """The sum of ``cp`` terms ``+inf``, ``cn`` terms ``-inf`` and ``cnan`` NaN terms: NaN, +-inf or
    0."""
    inf = torch.full((), float("inf"), dtype=cp.dtype, device=cp.device)
    return torch.where(
        (cnan > 0) | ((cp > 0) & (cn > 0)),
        inf - inf,
        torch.where(cp > 0, inf, torch.where(cn > 0, -inf, torch.zeros_like(inf))),
    )


def _rowfill_exact(M: _Mat, X: torch.Tensor) -> torch.Tensor:
    """``A @ X`` for a fill constant along each row (``F[b, i, :] = f[b, i]``) where ``f`` or ``X``
    is not finite.

    Over the unspecified ``k`` of row ``i``: the sum ``S`` of ``X[k, j]`` (its finite part plus the
    counts of ``+inf``, ``-inf``, NaN) and the counts of positive, negative and zero-or-NaN entries;
    ``f * S`` where ``f`` is finite (``0 * inf`` NaN, as dense), else the sign rules of ``f * X[k,
    j]`` (NaN fill: NaN wherever a row has an unspecified element)."""
    n = X.shape[-1]
    Xf = torch.where(torch.isfinite(X), X, 0)
    big = torch.cat(
        [Xf, X > 0, X < 0, (X == 0) | X.isnan(), X == float("inf"), X == -float("inf"), X.isnan()],
        -1,
    )
    C = big.to(X.dtype).sum(-2, keepdim=True) - _native_spmm(
        M, big.to(X.dtype), torch.ones_like(M.vals)
    )
    s, cp, cn, cz, cpi, cni, cnan = C.split(n, -1)
    f = M.fill
    nan = torch.full((), float("nan"), dtype=X.dtype, device=X.device)
    inf = torch.full((), float("inf"), dtype=X.dtype, device=X.device)
    unspec = (cp + cn + cz) > 0
    # f = +inf: +inf if only positive X, -inf if only negative, NaN if a zero/NaN or both signs;
    # -inf mirrored
    signed = torch.where(
        (cz > 0) | ((cp > 0) & (cn > 0)),
        nan,
        torch.where(cp > 0, inf, torch.where(cn > 0, -inf, 0)),
    )
    S = s + _inf_terms(cpi, cni, cnan)
    term = torch.where(
        torch.isfinite(f),
        torch.where(torch.isfinite(f), f, 0) * S,
        torch.where(f.isnan(), torch.where(unspec, nan, 0), torch.where(f > 0, signed, -signed)),
    )
    return _native_spmm(M, X, M.vals) + term


def _like(M: _Mat, vals, fill) -> _Mat:
    """``M``'s pattern with other stored values and a finite fill (None: zero), definite."""
    return _Mat(M.nb, M.m, M.k, M.crow, M.col, vals, fill, True, M.layout, M._rows, M.key)


def _dense_product(L: _Mat, R: _Mat) -> torch.Tensor:
    """``L @ R`` of two finite operands as a dense ``(nb, m, n)`` tensor."""
    r = _sp_sp(L, R)
    if isinstance(r, tuple):
        b, i, j, vals = r
        r = vals.new_zeros(L.nb, L.m, R.k).index_put_((b, i, j), vals, accumulate=True)
    return r


def sp_sp_stored_nonfinite(A: _Mat, B: _Mat):
    """``A @ B`` (finite fills) where a stored value is inf or NaN, as dense sums it: the term
    ``A[i, k] * B[k, j]`` of a stored inf/NaN meeting the other's unspecified element is formed too
    (``0 * inf`` NaN, ``2.5 * inf`` inf; none where that operand's fill is indefinite: masked).

    * Zero (or indefinite) fills: the native sparse product (exact for stored pairs) plus NaN at
      ``(i, j)`` where row ``i`` of ``A`` has more non-finite stored elements than meet stored
      elements of column ``j`` of ``B`` (counted by a sparse product of indicators), and the same
      for the non-finite columns of ``B``: the result stays sparse (the NaN positions are in the
      rows and columns holding a non-finite value).
    * Otherwise (dense result): the product with the non-finite stored values replaced by 0, plus
      the sum of the non-finite terms from the counts of ``+inf``, ``-inf`` and NaN terms
      (:func:`_inf_terms`), each a product of indicator operands (sign indicators of the finite
      values, fills included).

    Complex values: None (an operand densified when small, else the densify fallback: exact)."""
    if A.vals.dtype.is_complex:
        return None
    if A.fill is None and B.fill is None:
        return _zero_fill_nonfinite(A, B)
    nfa, nfb = ~torch.isfinite(A.vals), ~torch.isfinite(B.vals)
    dt = A.vals.dtype
    zero = A.vals.new_zeros(())
    out = _dense_product(
        _like(A, torch.where(nfa, zero, A.vals), A.fill),
        _like(B, torch.where(nfb, zero, B.vals), B.fill),
    )

    def ind(M, stored, on_fill=None):
        """An indicator operand: ``stored`` at the pattern, ``on_fill(fill)`` elsewhere (None: 0;
        indefinite: 0)."""
        f = M.fill if M.fill is not None else zero.reshape(1, 1, 1)
        return _like(
            M, stored.to(dt), None if M.indefinite or on_fill is None else on_fill(f).to(dt)
        )

    def prod(L, R):  # (0 when an operand is all zero: no non-finite value on that side)
        nothing = lambda M: M.fill is None and not bool(M.vals.any())  # noqa: E731
        return torch.zeros_like(out) if nothing(L) or nothing(R) else _dense_product(L, R)

    a, b = A.vals, B.vals
    sgn = lambda x: torch.where(x.isnan(), 0, torch.sign(x))  # noqa: E731
    one = lambda f: torch.ones_like(f)  # noqa: E731
    a_inf, a_sinf = ind(A, a.isinf()), ind(A, torch.where(a.isinf(), sgn(a), 0))
    b_inf, b_sinf = ind(B, b.isinf()), ind(B, torch.where(b.isinf(), sgn(b), 0))
    # terms of a non-finite A[i, k] with every B[k, j], then of a finite A[i, k] with a non-finite
    # B[k, j]: s counts the +-inf terms, d their signs; NaN terms: inf * (0 or NaN), NaN * anything,
    # 0 * inf, finite * NaN
    s = prod(a_inf, ind(B, sgn(b) != 0, lambda f: f != 0)) + prod(
        ind(A, ~nfa & (a != 0), lambda f: f != 0), b_inf
    )
    d = prod(a_sinf, ind(B, sgn(b), torch.sign)) + prod(
        ind(A, torch.where(nfa, 0, torch.sign(a)), torch.sign), b_sinf
    )
    cnan = (
        prod(a_inf, ind(B, (b == 0) | b.isnan(), lambda f: f == 0))
        + prod(ind(A, a.isnan()), ind(B, torch.ones_like(b), one))
        + prod(ind(A, a == 0, lambda f: f == 0), b_inf)
        + prod(ind(A, ~nfa, one), ind(B, b.isnan()))
    )
    return out + _inf_terms((s + d) / 2, (s - d) / 2, cnan)


def _zero_fill_nonfinite(A: _Mat, B: _Mat):
    """``A @ B`` for zero or indefinite fills with a stored inf/NaN: ``(b, i, j, values)`` of the
    native product and of the NaN terms ``inf * 0`` (see :func:`sp_sp_stored_nonfinite`)."""
    b, i, j, vals = _native_pairs(A, B)
    m, n = A.m, B.k
    rows, cols = [vals.new_zeros(0, dtype=torch.int64)], [vals.new_zeros(0, dtype=torch.int64)]
    if not B.indefinite:  # a non-finite A[r, k] meets the unspecified B[k, j] of its block
        r, c = _uncovered(A, B, by_rows=True)
        rows.append(r), cols.append(c)
    if not A.indefinite:  # an unspecified A[i, k] meets a non-finite B[k, c]
        r, c = _uncovered(A, B, by_rows=False)
        rows.append(r), cols.append(c)
    r, c = torch.cat(rows), torch.cat(cols)
    bb = r // m if m else r
    nan = torch.full((r.numel(),), float("nan"), dtype=vals.dtype, device=vals.device)
    return (
        torch.cat([b, bb]),
        torch.cat([i, r - bb * m]),
        torch.cat([j, c - bb * n]),
        torch.cat([vals, nan]),
    )


def _uncovered(A: _Mat, B: _Mat, by_rows: bool):
    """Global ``(rows, cols)`` of the block-diagonal product where a non-finite stored element of
    ``A`` (``by_rows``: in row ``r``) or of ``B`` (in column ``c``) meets an unspecified element of
    the other operand: its count of non-finite elements exceeds those meeting stored partners (a
    native product of indicators).  ``O(rows * n)`` or ``O(m * cols)`` for the rows/columns holding
    a non-finite value."""
    S, O = (A, B) if by_rows else (B, A)
    dt = S.vals.dtype
    nf = (~torch.isfinite(S.vals)).to(dt)
    keys = S.rows if by_rows else S.col
    cnt = nf.new_zeros(S.nb * (S.m if by_rows else S.k)).index_add_(0, keys, nf)
    sel = cnt.nonzero()[:, 0]
    if not sel.numel():
        return sel, sel
    ones = torch.ones_like(O.vals)
    P = (
        _like(A, nf, None).csr() @ _like(B, ones, None).csr()
        if by_rows
        else _like(A, ones, None).csr() @ _like(B, nf, None).csr()
    )
    crow, col, v = P.crow_indices(), P.col_indices(), P.values()
    prow = torch.repeat_interleave(
        torch.arange(crow.numel() - 1, device=col.device),
        crow[1:] - crow[:-1],
        output_size=col.numel(),
    )
    m, n = A.m, B.k
    pos = torch.full_like(cnt, -1, dtype=torch.int64)
    pos[sel] = torch.arange(sel.numel(), device=sel.device)
    if by_rows:  # D[t, j] = cnt[sel[t]] - covered[sel[t], block col j]
        at, blk = pos[prow], sel // m if m else sel
        D = cnt[sel][:, None].expand(-1, n).clone()
        keep = at >= 0
        D.index_put_((at[keep], col[keep] - (prow[keep] // m) * n), -v[keep], accumulate=True)
        t, j = (D > 0).nonzero(as_tuple=True)
        return sel[t], blk[t] * n + j
    at = pos[col]  # D[i, t] = cnt[sel[t]] - covered[block row i, sel[t]]
    blk = sel // n if n else sel
    D = cnt[sel][None, :].expand(m, -1).clone()
    keep = at >= 0
    D.index_put_((prow[keep] - (col[keep] // n) * m, at[keep]), -v[keep], accumulate=True)
    i, t = (D > 0).nonzero(as_tuple=True)
    return blk[t] * m + i, sel[t]


def _as_2d(T, vec_dim):
    return T if T.dim() > 1 else _shape.unsqueeze(T, vec_dim)


def nonfinite_sp_sp(a: SparseTensor, b: SparseTensor):
    """``a @ b`` (both SparseTensors) where a scalar fill is NaN or +-inf: exact, no densifying.

    With ``a`` the non-finite one (else the transposed product): ``a @ b = a_spec @ b + N`` where
    ``a_spec`` is ``a``'s specified elements (an indefinite fill: nothing else multiplies) and
    ``N[i, j]`` sums ``T = fill * b`` over the unspecified ``k`` of row ``i``: ``colsum(Y) - P @ Y``
    for ``Y`` the finite part of ``T`` and the indicators of its ``+inf``, ``-inf`` and NaN
    elements (each a SparseTensor with a finite fill; ``P`` the pattern of ``a``), then the sign
    rules.  Returns ``(nb, m, n)`` dense, or None."""
    a, b = _as_2d(a, 0), _as_2d(b, 1)
    fa_ok = a._indefinite or bool(torch.isfinite(a._fill).all())
    if fa_ok and (b._indefinite or bool(torch.isfinite(b._fill).all())):
        return None
    if fa_ok:  # only b is non-finite: (b^T @ a^T)^T
        tr = [*range(b.dim() - 2), b.dim() - 1, b.dim() - 2]
        bt, at = (
            _shape.permute(b, tr),
            _shape.permute(a, [*range(a.dim() - 2), a.dim() - 1, a.dim() - 2]),
        )
        if bt is None or at is None:
            return None
        r = nonfinite_sp_sp(bt, at)
        return None if r is None else r.transpose(-1, -2)
    if a._fill.numel() != 1:
        return None
    from sparsefill._tensor.parts import coalesce_of, rewrap

    nb = (a.shape[0],) if a.dim() == 3 else ()
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    out_shape = nb + (m, n)

    def prod(x, y):
        r = product(x, y, out_shape if x.shape[-2] == m else nb + (1, n), sparse_ok=False)
        if r is None:
            raise _Unhandled
        return r

    try:
        zero = a._vals.new_zeros(())
        # the specified elements alone (masked: an indefinite fill skips the rest, no 0 * inf)
        spec = prod(rewrap(a, fill=a._vals.new_empty(0), indefinite=True, known_zero=False), b)
        ac = coalesce_of(a)
        P = rewrap(ac, values=torch.ones_like(ac._vals), fill=zero, known_zero=True)
        ones = a._vals.new_ones(nb + (1, k))
        T = b * a._fill.reshape(())
        parts = [
            torch.where(torch.isfinite(T), T, zero),
            T == float("inf"),
            T == -float("inf"),
            T.isnan(),
        ]
        Cs = []
        for Y in parts:
            Y = Y.to(a.dtype)
            Cs.append(prod(ones, Y) - prod(P, Y))
    except _Unhandled:
        return None
    cf, cp, cn, cnan = Cs
    nan = torch.full((), float("nan"), dtype=cf.dtype, device=cf.device)
    inf = torch.full((), float("inf"), dtype=cf.dtype, device=cf.device)
    nonfinite = torch.where(
        (cnan > 0) | ((cp > 0) & (cn > 0)),
        nan,
        torch.where(cp > 0, inf, torch.where(cn > 0, -inf, 0)),
    )
    r = spec + cf + nonfinite
    return r if r.dim() == 3 else r.unsqueeze(0)


class _Unhandled(Exception):
    pass


def one_dense(a, b, A, B, out_shape):
    """``A @ B`` with the operand of non-finite fill densified (the other one if that is not
    handled), when its dense tensor is no larger than the dense result; else None."""
    from sparsefill._tensor.parts import dense_of

    order = [0, 1] if not A.finite else [1, 0]
    for side in order:
        T = (a, b)[side]
        if T.dim() > 1 and T.numel() > _index.numel(out_shape):
            continue
        d = dense_of(T, T._vals.new_zeros(()) if T._indefinite else None)
        if side == 0:
            X = d.unsqueeze(0) if d.dim() == 1 else d
            r = _dense_sp(X if X.dim() == 3 else X.unsqueeze(0), B)
        else:
            X = d.unsqueeze(-1) if d.dim() == 1 else d
            r = _sp_dense(A, X if X.dim() == 3 else X.unsqueeze(0))
        if r is not None:
            return r
    return None
