"""Matrix products of SparseTensors with fill values, by decomposition (fill-value-rfc.md point 10.2).

A sparse operand ``A`` (a batch of ``(m, k)`` matrices) is its zero-fill part ``A0`` plus its fill
``F`` (constant along the sparse dims: ``F = a * ones`` for a scalar fill, ``ones_m (x) f`` for a
row-sparse hybrid tensor's array fill)::

    A0 = A - F              specified where A is, value A[p] - F[p]; a torch native CSR matrix
    A @ X = A0 @ X + F @ X  F @ X = a * X.sum(-2) for a scalar fill: a rank-one correction
    A @ B = A0 @ B0 + F @ B0 + A0 @ G + F @ G          (B = B0 + G sparse)

where ``F @ B0 = a * colsum(B0)`` and ``A0 @ G = rowsum(A0) * b`` (a scalar fill ``b``).  The
products ``A0 @ X`` run on torch's native CSR kernel; a batch is one block-diagonal CSR
matrix ``(nb * m, nb * k)``.  ``X @ B`` (dense on the left) is ``(B0^T @ X^T)^T + X @ G`` with
``B0^T`` built by a stable counting sort of the column indices.

* Zero fill: ``A0`` is ``A`` itself (a 2-D CSR input's arrays are used as they are); no
  correction.  Sparse @ sparse with zero fills is sparse (the native CSR product); every
  other product is dense by nature and returned dense, with no DensifyWarning.
* Indefinite fill (masked semantics, as the reductions): unspecified elements are skipped,
  i.e. contribute nothing to the sums, so the operand acts as its zero-fill part
  (``A @ x == A.to_dense(fill_value=0) @ x``; an empty sum is 0).
* Non-finite fill (NaN, +-inf): ``A0 = A - F`` would be NaN everywhere, so the fill term is
  summed exactly over the unspecified elements of each row: with ``T = F * X`` (``F`` constant
  along the rows), ``C = T.sum(-2) - P @ T`` for the finite part of ``T`` and the counts of
  ``+inf``, ``-inf`` and NaN terms (``P`` the pattern matrix), all in one native product of
  4n columns; a fill constant along each row (a transposed hybrid) counts the signs of ``X``
  instead.  Sparse @ sparse with a scalar non-finite fill: the same sums, each a sparse @ sparse
  product with finite fills (``_nonfinite_sp_sp``).  Other non-finite array fills: the operand
  is densified quietly when no larger than the result, else the densify fallback (warned).
* Hybrid operands: the dense dims are unrolled into matrix coordinates (each stored dense
  slice is ``prod(dense_shape)`` stored elements); the array fill stays a broadcastable
  tensor in the correction.
* Non-finite dense operand (an ``inf``/NaN in ``X``; checked once, by its finite column sums, O(X); traced:
  always this path, branch-free): the products are the dense ones, unlike torch's own sparse
  products.  Zero fill: NaN wherever a row's unspecified element meets an ``inf``/NaN ``X[k, j]``
  (``0 * inf``), counted by one native product; a nonzero fill: its terms summed over the
  unspecified elements as the non-finite fill's are (counts of ``+inf``, ``-inf``, NaN terms: no
  ``inf - inf`` from the decomposition).  An indefinite fill forms no products there (masked).  Complex: the
  exact real products of the real and imaginary parts; a fill varying along both matrix dims (sparse along
  the batch only): each matrix is stored whole or is the fill.
* Stored inf/NaN in a sparse @ sparse product (checked by the sums of the stored values, O(nse)): the
  terms they form with the other operand's unspecified elements are formed as dense forms them (zero
  fills: NaN in the rows/columns holding them, the result stays sparse; otherwise the counts of
  ``+inf``, ``-inf``, NaN terms, each a product of indicator operands): :func:`_sp_sp_stored_nonfinite`.

Ops: ``mm bmm mv dot vdot addmm addmv baddbmm addbmm addr`` here; ``matmul einsum tensordot
inner outer`` (CompositeImplicit) arrive as these plus the views of ``shape.py``.  Integer
dtypes run on torch's COO kernel (its CSR kernels are floating-point only); integer sparse @
sparse is not in torch and goes to the densify fallback unless an operand is small.

Gradients: autograd's formulas for ``mm``/``bmm``/``mv``/``addmm`` call these handlers again
(``mat1.t().mm(grad)``, with ``t``/``transpose`` from ``shape.py``); the gradient of the
sparse operand is ``grad @ x.T``, dense by nature, which reaches ``(values, fill)``
through the constructors.

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor([[0, 1], [2, 0]], [1., 2.], (2, 3), fill_value=5.)
>>> x = torch.ones(3, 2)
>>> torch.equal(A @ x, A.to_dense() @ x)
True
>>> x[1, 0] = float("inf")                  # 0 * inf and 5 * inf, as dense
>>> torch.equal((A @ x).isnan(), (A.to_dense() @ x).isnan()), (A @ x)[:, 0].tolist()
(True, [inf, inf])
>>> B = sparsefill.sparse_coo_tensor([[0], [1]], [float("inf")], (3, 2))   # inf * 0 = NaN, as dense
>>> (B @ B.T).to_dense().tolist()
[[inf, nan, nan], [nan, 0.0, 0.0], [nan, 0.0, 0.0]]
"""

from __future__ import annotations

import warnings

import torch

from .. import _index
from .._compile import bincount, known_true, traced
from .._convert import coalesced_parts, parts_to_sparse, scalar_parts
from .._grouping import pattern_cached
from .._tensor import SparseTensor
from . import shape as _shape

aten = torch.ops.aten


class _Mat:
    """A sparse operand as ``nb`` matrices ``(m, k)`` in block-diagonal coordinates.

    ``crow`` (``nb*m + 1``) and ``col`` (``b*k + j``) index the stored elements row by row;
    ``vals`` are the stored values, ``fill`` the fill as a 3-d tensor broadcastable to
    ``(nb, m, k)`` (None when zero or indefinite), ``finite`` whether it is finite."""

    def __init__(self, nb, m, k, crow, col, vals, fill, finite, layout, rows=None, key=None, indefinite=False):
        self.nb, self.m, self.k, self.indefinite = nb, m, k, indefinite
        self.crow, self.col, self.vals, self.fill, self.finite = crow, col, vals, fill, finite
        self.layout, self._rows = layout, rows
        self.key = key  # (the operand's index tensors, a tag of what else the pattern depends on) or None

    @property
    def rows(self):
        if self._rows is None:
            self._rows = _index.runs_to_ids(self.crow[1:] - self.crow[:-1], self.col.numel())
        return self._rows

    def fill_at(self):
        """The fill at each stored element."""
        f = self.fill
        if f.numel() == 1:
            return f.reshape(())
        r, c = self.rows, self.col
        b = r // self.m if self.m else r
        return f.expand(self.nb, self.m, self.k)[b, r - b * self.m, c - b * self.k]

    def csr(self, values=None):
        """The native CSR block-diagonal matrix; ``values`` default to ``A0 = A - F``."""
        if values is None:
            values = self.vals if self.fill is None or not self.finite else self.vals - self.fill_at()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "Sparse CSR tensor support is in beta state"
            return torch.sparse_csr_tensor(self.crow, self.col, values, (self.nb * self.m, self.nb * self.k))

    def t(self) -> "_Mat":
        """The transposed matrices: global rows and columns swap roles (a stable counting sort)."""
        if traced(self.col):  # compiled: the gather/scatter-add products read rows and columns in any order
            fill = None if self.fill is None else self.fill.transpose(-1, -2)
            return _Mat(self.nb, self.k, self.m, None, self.rows, self.vals, fill, self.finite, self.layout, self.col,
                        indefinite=self.indefinite)
        if self.key is None:
            perm, crow, tcol, trows = self._transposed_pattern()
        else:  # the operand's own index tensors: the same pattern recurs (a training loop), sorted once
            tensors, tag = self.key
            perm, crow, tcol, trows = pattern_cached(("mat_t", self.nb, self.m, self.k) + tag, tensors,
                                                     self._transposed_pattern)
        fill = None if self.fill is None else self.fill.transpose(-1, -2)
        return _Mat(self.nb, self.k, self.m, crow, tcol, self.vals[perm], fill, self.finite, self.layout, trows,
                    indefinite=self.indefinite)

    def _transposed_pattern(self):
        """``(perm, crow, col, rows)`` of the transpose: the stored elements reordered by column."""
        cols = self.col
        perm = torch.sort(cols, stable=True)[1]
        counts = bincount(cols, self.nb * self.k)
        crow = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
        return perm, crow, self.rows[perm], cols[perm]


def _mat(A: SparseTensor) -> _Mat | None:
    """``_Mat`` of a 2-d or 3-d SparseTensor (a 1-d one goes through ``unsqueeze`` first)."""
    nd = A.dim()
    nb, m, k = ((1,) + tuple(A.shape)) if nd == 2 else tuple(A.shape)
    zero = A._indefinite or A._fill_is_zero()
    fill = None
    if not zero:
        f = _shape._fill_dense(A)
        fill = f.reshape((1,) * (3 - f.dim()) + tuple(f.shape))
    finite = fill is None or known_true(torch.isfinite(fill).all())  # (traced: the general path)
    if A._sf_layout is torch.sparse_csr and not A.dense_dim():
        crow, col, vals = A._crow, A._col, A._vals
        if nd == 3:
            nse = col.shape[-1]
            off = torch.arange(nb, device=col.device)[:, None]
            crow = torch.cat([(crow[:, :-1] + off * nse).reshape(-1), crow.new_full((1,), nb * nse)])
            col, vals = (col + off * k).reshape(-1), vals.reshape(-1)
        return _Mat(nb, m, k, crow, col, vals, fill, finite, A._sf_layout, key=((A._crow, A._col), ()),
                    indefinite=A._indefinite)
    idx, vals = coalesced_parts(A)
    key = ((idx,), tuple(A._dense_shape))  # (indices, not their row views: untracked in __torch_dispatch__)
    if A.dense_dim():
        idx, vals = scalar_parts(idx, vals, A._dense_shape)
    if nd == 2:
        rows, col = idx[0], idx[1]
    else:
        rows, col = idx[0] * m + idx[1], idx[0] * k + idx[2]
    counts = bincount(rows, nb * m)
    crow = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    return _Mat(nb, m, k, crow, col, vals, fill, finite, A._sf_layout, rows, key, A._indefinite)


def _as_matrix(T, vec_dim=None):
    """SparseTensor -> ``_Mat``; a 1-d operand becomes a column (``vec_dim=1``) or a row (``0``)."""
    if vec_dim is not None:
        T = _shape.unsqueeze(T, vec_dim)
    return _mat(T)


def _native_spmm(M: _Mat, X: torch.Tensor, values=None, bias=None) -> torch.Tensor:
    """``A0 @ X (+ bias)`` for ``X`` ``(nb | 1, k, n)``: ``(nb, m, n)``; a ``bias`` broadcastable to
    ``(1, m, n)`` is added by the same kernel (``addmm``: no second pass over the result)."""
    n = X.shape[-1]
    Xs = X.expand(M.nb, M.k, n).reshape(M.nb * M.k, n)
    if traced(M.col) or traced(Xs):  # torch's sparse kernels do not trace: a gather and a scatter-add
        out = _gather_spmm(M, Xs, values).view(M.nb, M.m, n)
        return out if bias is None else out + bias
    mat = M.csr(values)
    if not (mat.dtype.is_floating_point or mat.dtype.is_complex):  # torch's CSR kernels: floating only
        mat = torch.sparse_coo_tensor(torch.stack([M.rows, M.col]), mat.values(), mat.shape, is_coalesced=True)
    if bias is not None and M.nb == 1 and bias.dim() == 3 and bias.shape[0] == 1 and bias.dtype == mat.dtype:
        return torch.addmm(bias[0], mat, Xs).view(1, M.m, n)
    out = (mat @ Xs).view(M.nb, M.m, n)
    return out if bias is None else out + bias


def _gather_spmm(M: _Mat, Xs: torch.Tensor, values=None) -> torch.Tensor:
    """``out[r] = sum(values[e] * Xs[col[e]] for the stored e of row r)``, ``(nb * m, n)``: ``M.csr(values) @ Xs``
    in ops that torch.compile traces (values default to ``A0 = A - F``, as :meth:`_Mat.csr`)."""
    if values is None:
        values = M.vals if M.fill is None or not M.finite else M.vals - M.fill_at()
    terms = values[:, None] * Xs.index_select(0, M.col)
    return terms.new_zeros(M.nb * M.m, Xs.shape[-1]).index_add_(0, M.rows, terms)


def _colsum_if_finite(X: torch.Tensor):
    """``X.sum(-2, keepdim=True)`` when it is finite, else None (traced: None, no data read).  A finite
    column sum means no inf or NaN in ``X`` (they propagate); an overflow only sends a finite ``X`` to the
    exact path.  One pass of adds (``isfinite(X).all()`` costs ~20x more on CPU); the nonzero fill's
    correction reuses the sums."""
    s = X.sum(-2, keepdim=True)
    if not (X.dtype.is_floating_point or X.dtype.is_complex):
        return s
    return s if known_true(torch.isfinite(s).all()) else None


def _sp_dense(M: _Mat, X: torch.Tensor) -> torch.Tensor | None:
    """``A @ X`` with ``X`` dense ``(nb | 1, k, n)``.

    An inf or NaN in ``X`` (or a non-finite fill) takes the exact path: the unspecified elements'
    terms ``F[i, k] * X[k, j]`` are summed as dense sums them (``0 * inf`` is NaN, ``inf - inf``
    never arises from the decomposition); an indefinite fill forms no products there (masked)."""
    if M.indefinite:
        return _native_spmm(M, X)
    s = _colsum_if_finite(X) if M.finite else None
    if s is not None:
        if M.fill is None:
            return _native_spmm(M, X)
        return _native_spmm(M, X, bias=M.fill * s if M.fill.shape[-1] == 1 else torch.matmul(M.fill, X))
    if M.fill is not None and M.fill.shape[1] != 1 and M.fill.shape[2] != 1:
        return _batchfill_exact(M, X)
    if M.vals.dtype.is_complex:
        return _complex_exact(M, X)
    if M.fill is None:  # zero fill, X not finite: NaN where a row's unspecified k meets an inf/NaN X[k, j]
        nf = (~torch.isfinite(X)).to(M.vals.dtype)
        C = nf.sum(-2, keepdim=True) - _native_spmm(M, nf, torch.ones_like(M.vals))
        nan = torch.full((), float("nan"), dtype=M.vals.dtype, device=X.device)
        return _native_spmm(M, X, M.vals) + torch.where(C > 0, nan, 0)
    if M.fill.shape[1] != 1:
        return _rowfill_exact(M, X)
    # T[b, k, j] = F[b, :, k] * X[b, k, j]; the fill term sums T over the unspecified k of each row
    T = M.fill.transpose(-1, -2) * X
    n = X.shape[-1]
    big = torch.cat([torch.where(torch.isfinite(T), T, 0), T == float("inf"), T == -float("inf"), T.isnan()], -1)
    big = big.to(T.dtype)
    ones = torch.ones_like(M.vals)
    C = big.sum(-2, keepdim=True) - _native_spmm(M, big, ones)
    cf, cp, cn, cnan = C.split(n, -1)
    out = _native_spmm(M, X, M.vals) + cf
    return out + _inf_terms(cp, cn, cnan)


def _complex_exact(M: _Mat, X: torch.Tensor) -> torch.Tensor:
    """``A @ X`` for complex values where ``X`` or the fill is not finite, from the exact real products:
    ``(Ar @ Xr - Ai @ Xi) + i (Ar @ Xi + Ai @ Xr)`` sums the real and imaginary parts of the terms
    ``A[i, k] * X[k, j]`` that dense sums (grouped otherwise: a sum of extended reals is NaN, +-inf or finite
    whatever its grouping)."""
    def part(f):
        fill = None if M.fill is None else f(M.fill)
        finite = fill is None or known_true(torch.isfinite(fill).all())
        return _Mat(M.nb, M.m, M.k, M.crow, M.col, f(M.vals), fill, finite, M.layout, M._rows, M.key, M.indefinite)
    re, im = part(torch.real), part(torch.imag)
    Xr, Xi = X.real, X.imag
    return torch.complex(_sp_dense(re, Xr) - _sp_dense(im, Xi), _sp_dense(re, Xi) + _sp_dense(im, Xr))


def _batchfill_exact(M: _Mat, X: torch.Tensor) -> torch.Tensor:
    """``A @ X`` for a fill varying along both matrix dims (``A`` sparse along its batch dim only: each matrix
    is stored whole or is the fill), exact for any ``X`` and fill: the stored matrices' products plus
    ``F @ X`` (dense) for the others."""
    stored = (M.crow[M.m::M.m] - M.crow[:-1:M.m]) > 0  # (nb,): a matrix with stored elements is stored whole
    return _native_spmm(M, X, M.vals) + torch.where(stored[:, None, None], 0, torch.matmul(M.fill, X))


def _inf_terms(cp, cn, cnan):
    """The sum of ``cp`` terms ``+inf``, ``cn`` terms ``-inf`` and ``cnan`` NaN terms: NaN, +-inf or 0."""
    inf = torch.full((), float("inf"), dtype=cp.dtype, device=cp.device)
    return torch.where((cnan > 0) | ((cp > 0) & (cn > 0)), inf - inf,
                       torch.where(cp > 0, inf, torch.where(cn > 0, -inf, torch.zeros_like(inf))))


def _rowfill_exact(M: _Mat, X: torch.Tensor) -> torch.Tensor:
    """``A @ X`` for a fill constant along each row (``F[b, i, :] = f[b, i]``) where ``f`` or ``X`` is not finite.

    Over the unspecified ``k`` of row ``i``: the sum ``S`` of ``X[k, j]`` (its finite part plus the
    counts of ``+inf``, ``-inf``, NaN) and the counts of positive, negative and zero-or-NaN entries;
    ``f * S`` where ``f`` is finite (``0 * inf`` NaN, as dense), else the sign rules of ``f * X[k, j]``
    (NaN fill: NaN wherever a row has an unspecified element)."""
    n = X.shape[-1]
    Xf = torch.where(torch.isfinite(X), X, 0)
    big = torch.cat([Xf, X > 0, X < 0, (X == 0) | X.isnan(), X == float("inf"), X == -float("inf"), X.isnan()], -1)
    C = big.to(X.dtype).sum(-2, keepdim=True) - _native_spmm(M, big.to(X.dtype), torch.ones_like(M.vals))
    s, cp, cn, cz, cpi, cni, cnan = C.split(n, -1)
    f = M.fill
    nan = torch.full((), float("nan"), dtype=X.dtype, device=X.device)
    inf = torch.full((), float("inf"), dtype=X.dtype, device=X.device)
    unspec = (cp + cn + cz) > 0
    # f = +inf: +inf if only positive X, -inf if only negative, NaN if a zero/NaN or both signs; -inf mirrored
    signed = torch.where((cz > 0) | ((cp > 0) & (cn > 0)), nan,
                         torch.where(cp > 0, inf, torch.where(cn > 0, -inf, 0)))
    S = s + _inf_terms(cpi, cni, cnan)
    term = torch.where(torch.isfinite(f), torch.where(torch.isfinite(f), f, 0) * S,
                       torch.where(f.isnan(), torch.where(unspec, nan, 0), torch.where(f > 0, signed, -signed)))
    return _native_spmm(M, X, M.vals) + term


def _dense_sp(X: torch.Tensor, M: _Mat) -> torch.Tensor | None:
    """``X @ B`` with ``X`` dense ``(nb | 1, m, k)``: ``(B^T @ X^T)^T``."""
    out = _sp_dense(M.t(), X.transpose(-1, -2))
    return None if out is None else out.transpose(-1, -2)


def _sp_sp(A: _Mat, B: _Mat):
    """``A @ B``: a SparseTensor for zero fills, else dense ``(nb, m, n)`` (None: not handled here).  A stored
    inf/NaN (checked by the sum of the stored values, O(nse)) takes :func:`_sp_sp_stored_nonfinite`."""
    if not (A.finite and B.finite and (A.vals.dtype.is_floating_point or A.vals.dtype.is_complex)):
        return None
    if not (known_true(torch.isfinite(A.vals.sum())) and known_true(torch.isfinite(B.vals.sum()))):
        return _sp_sp_stored_nonfinite(A, B)
    nb, m, n = A.nb, A.m, B.k
    b, i, j, vals = _native_pairs(A, B)
    if A.fill is None and B.fill is None:
        return b, i, j, vals
    out = vals.new_zeros(nb, m, n).index_put_((b, i, j), vals, accumulate=True)
    if A.fill is not None:  # F @ B0
        f = A.fill
        if f.shape[-1] == 1:
            colsum = B.vals.new_zeros(nb * n).index_put_((B.col,), B.csr().values(), accumulate=True)
            out = out + f * colsum.view(nb, 1, n)
        else:
            out = out + _dense_sp(f.expand(f.shape[0], f.shape[1], A.k), _Mat(
                B.nb, B.m, B.k, B.crow, B.col, B.csr().values(), None, True, B.layout, B._rows))
    if B.fill is not None:  # A0 @ G
        g = B.fill
        a0 = A.csr().values()
        if g.shape[-2] == 1:
            rowsum = a0.new_zeros(nb * m).index_put_((A.rows,), a0, accumulate=True)
            out = out + rowsum.view(nb, m, 1) * g
        else:
            out = out + _native_spmm(A, g.expand(g.shape[0], B.m, g.shape[-1]))
    if A.fill is not None and B.fill is not None:  # F @ G
        f, g = A.fill, B.fill
        out = out + torch.matmul(f.expand(f.shape[0], f.shape[1], A.k), g.expand(g.shape[0], B.m, g.shape[-1]))
    return out


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


def _sp_sp_stored_nonfinite(A: _Mat, B: _Mat):
    """``A @ B`` (finite fills) where a stored value is inf or NaN, as dense sums it: the term
    ``A[i, k] * B[k, j]`` of a stored inf/NaN meeting the other's unspecified element is formed too
    (``0 * inf`` NaN, ``2.5 * inf`` inf; none where that operand's fill is indefinite: masked).

    * Zero (or indefinite) fills: the native sparse product (exact for stored pairs) plus NaN at ``(i, j)`` where
      row ``i`` of ``A`` has more non-finite stored elements than meet stored elements of column ``j`` of ``B``
      (counted by a sparse product of indicators), and the same for the non-finite columns of ``B``: the
      result stays sparse (the NaN positions are in the rows and columns holding a non-finite value).
    * Otherwise (dense result): the product with the non-finite stored values replaced by 0, plus the sum
      of the non-finite terms from the counts of ``+inf``, ``-inf`` and NaN terms (:func:`_inf_terms`),
      each a product of indicator operands (sign indicators of the finite values, fills included).

    Complex values: None (an operand densified when small, else the densify fallback: exact)."""
    if A.vals.dtype.is_complex:
        return None
    if A.fill is None and B.fill is None:
        return _zero_fill_nonfinite(A, B)
    nfa, nfb = ~torch.isfinite(A.vals), ~torch.isfinite(B.vals)
    dt = A.vals.dtype
    zero = A.vals.new_zeros(())
    out = _dense_product(_like(A, torch.where(nfa, zero, A.vals), A.fill),
                         _like(B, torch.where(nfb, zero, B.vals), B.fill))

    def ind(M, stored, on_fill=None):
        """An indicator operand: ``stored`` at the pattern, ``on_fill(fill)`` elsewhere (None: 0; indefinite: 0)."""
        f = M.fill if M.fill is not None else zero.reshape(1, 1, 1)
        return _like(M, stored.to(dt), None if M.indefinite or on_fill is None else on_fill(f).to(dt))

    def prod(L, R):  # (0 when an operand is all zero: no non-finite value on that side)
        nothing = lambda M: M.fill is None and not bool(M.vals.any())  # noqa: E731
        return torch.zeros_like(out) if nothing(L) or nothing(R) else _dense_product(L, R)

    a, b = A.vals, B.vals
    sgn = lambda x: torch.where(x.isnan(), 0, torch.sign(x))  # noqa: E731
    one = lambda f: torch.ones_like(f)  # noqa: E731
    a_inf, a_sinf = ind(A, a.isinf()), ind(A, torch.where(a.isinf(), sgn(a), 0))
    b_inf, b_sinf = ind(B, b.isinf()), ind(B, torch.where(b.isinf(), sgn(b), 0))
    # terms of a non-finite A[i, k] with every B[k, j], then of a finite A[i, k] with a non-finite B[k, j]:
    # s counts the +-inf terms, d their signs; NaN terms: inf * (0 or NaN), NaN * anything, 0 * inf, finite * NaN
    s = prod(a_inf, ind(B, sgn(b) != 0, lambda f: f != 0)) + prod(ind(A, ~nfa & (a != 0), lambda f: f != 0), b_inf)
    d = prod(a_sinf, ind(B, sgn(b), torch.sign)) + prod(ind(A, torch.where(nfa, 0, torch.sign(a)), torch.sign), b_sinf)
    cnan = (prod(a_inf, ind(B, (b == 0) | b.isnan(), lambda f: f == 0))
            + prod(ind(A, a.isnan()), ind(B, torch.ones_like(b), one))
            + prod(ind(A, a == 0, lambda f: f == 0), b_inf)
            + prod(ind(A, ~nfa, one), ind(B, b.isnan())))
    return out + _inf_terms((s + d) / 2, (s - d) / 2, cnan)


def _zero_fill_nonfinite(A: _Mat, B: _Mat):
    """``A @ B`` for zero or indefinite fills with a stored inf/NaN: ``(b, i, j, values)`` of the native product
    and of the NaN terms ``inf * 0`` (see :func:`_sp_sp_stored_nonfinite`)."""
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
    return torch.cat([b, bb]), torch.cat([i, r - bb * m]), torch.cat([j, c - bb * n]), torch.cat([vals, nan])


def _native_pairs(A: _Mat, B: _Mat):
    """``A0 @ B0`` by torch's native CSR product (block diagonal ``(nb*m, nb*n)``) as ``(b, i, j, values)``."""
    P = A.csr() @ B.csr()
    crow, col, vals = P.crow_indices(), P.col_indices(), P.values()
    m, n = A.m, B.k
    rows = torch.repeat_interleave(torch.arange(A.nb * m, device=col.device), crow[1:] - crow[:-1],
                                   output_size=col.numel())
    b = rows // m if m else rows
    return b, rows - b * m, col - b * n, vals


def _uncovered(A: _Mat, B: _Mat, by_rows: bool):
    """Global ``(rows, cols)`` of the block-diagonal product where a non-finite stored element of ``A`` (``by_rows``:
    in row ``r``) or of ``B`` (in column ``c``) meets an unspecified element of the other operand: its count of
    non-finite elements exceeds those meeting stored partners (a native product of indicators).  ``O(rows * n)``
    or ``O(m * cols)`` for the rows/columns holding a non-finite value."""
    S, O = (A, B) if by_rows else (B, A)
    dt = S.vals.dtype
    nf = (~torch.isfinite(S.vals)).to(dt)
    keys = S.rows if by_rows else S.col
    cnt = nf.new_zeros(S.nb * (S.m if by_rows else S.k)).index_add_(0, keys, nf)
    sel = cnt.nonzero()[:, 0]
    if not sel.numel():
        return sel, sel
    ones = torch.ones_like(O.vals)
    P = _like(A, nf, None).csr() @ _like(B, ones, None).csr() if by_rows else \
        _like(A, ones, None).csr() @ _like(B, nf, None).csr()
    crow, col, v = P.crow_indices(), P.col_indices(), P.values()
    prow = torch.repeat_interleave(torch.arange(crow.numel() - 1, device=col.device), crow[1:] - crow[:-1],
                                   output_size=col.numel())
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


# ---------------------------------------------------------------------- the product of two operands
def product(a, b, out_shape, *, sparse_ok=True):
    """``a @ b`` for 1-d, 2-d or 3-d (batched, equal batch) operands, at least one a SparseTensor.

    Returns a tensor of ``out_shape``: a SparseTensor when both are SparseTensors with zero
    (or indefinite) fills and ``sparse_ok``, else dense; None when not handled here."""
    if min(a.dim(), b.dim()) == 0:
        return None
    if any(s == 0 for s in tuple(a.shape) + tuple(b.shape)) or not _index.numel(out_shape):
        dtype, device = a.dtype, a.device
        both = isinstance(a, SparseTensor) and isinstance(b, SparseTensor)
        if both and sparse_ok and a._fill_is_zero() | a._indefinite and b._fill_is_zero() | b._indefinite:
            return _sparse_out(a, b, out_shape, *(torch.zeros(0, dtype=torch.int64, device=device),) * 3,
                               torch.zeros(0, dtype=dtype, device=device))
        return torch.zeros(out_shape, dtype=dtype, device=device)
    va, vb = (0 if a.dim() == 1 else None), (1 if b.dim() == 1 else None)
    A = _as_matrix(a, va) if isinstance(a, SparseTensor) else None
    B = _as_matrix(b, vb) if isinstance(b, SparseTensor) else None
    if A is not None and B is not None:
        r = _sp_sp(A, B)
        if isinstance(r, tuple):
            if sparse_ok:
                return _sparse_out(a, b, out_shape, *r)
            bb, i, j, vals = r
            out = vals.new_zeros(A.nb, A.m, B.k)
            out.index_put_((bb, i, j), vals, accumulate=True)
            r = out
        elif r is None:  # a non-finite fill
            r = _nonfinite_sp_sp(a, b)
            if r is None:  # one operand dense, if that costs no more than the result
                r = _one_dense(a, b, A, B, out_shape)
    elif A is not None:
        X = b.unsqueeze(-1) if b.dim() == 1 else b
        r = _sp_dense(A, X if X.dim() == 3 else X.unsqueeze(0))
    else:
        X = a.unsqueeze(0) if a.dim() == 1 else a
        r = _dense_sp(X if X.dim() == 3 else X.unsqueeze(0), B)
    return None if r is None else r.reshape(out_shape)


def _as_2d(T, vec_dim):
    return T if T.dim() > 1 else _shape.unsqueeze(T, vec_dim)


def _nonfinite_sp_sp(a: SparseTensor, b: SparseTensor):
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
        bt, at = _shape.permute(b, tr), _shape.permute(a, [*range(a.dim() - 2), a.dim() - 1, a.dim() - 2])
        if bt is None or at is None:
            return None
        r = _nonfinite_sp_sp(bt, at)
        return None if r is None else r.transpose(-1, -2)
    if a._fill.numel() != 1:
        return None
    from .._convert import coalesce_of, rewrap
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
        parts = [torch.where(torch.isfinite(T), T, zero), T == float("inf"), T == -float("inf"), T.isnan()]
        Cs = []
        for Y in parts:
            Y = Y.to(a.dtype)
            Cs.append(prod(ones, Y) - prod(P, Y))
    except _Unhandled:
        return None
    cf, cp, cn, cnan = Cs
    nan = torch.full((), float("nan"), dtype=cf.dtype, device=cf.device)
    inf = torch.full((), float("inf"), dtype=cf.dtype, device=cf.device)
    nonfinite = torch.where((cnan > 0) | ((cp > 0) & (cn > 0)), nan,
                            torch.where(cp > 0, inf, torch.where(cn > 0, -inf, 0)))
    r = spec + cf + nonfinite
    return r if r.dim() == 3 else r.unsqueeze(0)


class _Unhandled(Exception):
    pass


def _one_dense(a, b, A, B, out_shape):
    """``A @ B`` with the operand of non-finite fill densified (the other one if that is not
    handled), when its dense tensor is no larger than the dense result; else None."""
    from .._convert import dense_of
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


def _sparse_out(a, b, out_shape, bb, i, j, vals):
    """The zero-fill sparse product as a SparseTensor of ``out_shape`` (layout of ``a``)."""
    idx = torch.stack([bb, i, j])
    keep = [d for d, v in zip((0, 1, 2), (len(out_shape) == 3, a.dim() > 1, b.dim() > 1)) if v]
    zero = torch.zeros((), dtype=vals.dtype, device=vals.device)
    layout = a._sf_layout if len(out_shape) >= 2 else torch.sparse_coo
    return parts_to_sparse(idx[keep], vals, out_shape, zero, known_zero=True, layout=layout)
