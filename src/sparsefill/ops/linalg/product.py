"""Matrix products of SparseTensors with fill values, by decomposition (the product of the stored
part plus the fill's rank-one part).

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
* Non-finite fill (NaN, +-inf): ``A0 = A - F`` would be NaN everywhere, so the fill term is summed
  exactly over the unspecified elements of each row: with ``T = F * X`` (``F`` constant along the
  rows), ``C = T.sum(-2) - P @ T`` for the finite part of ``T`` and the counts of ``+inf``, ``-inf``
  and NaN terms (``P`` the pattern matrix), all in one native product of 4n columns; a fill constant
  along each row (a transposed hybrid) counts the signs of ``X`` instead.  Sparse @ sparse with a
  scalar non-finite fill: the same sums, each a sparse @ sparse product with finite fills
  (``linalg_nonfinite.nonfinite_sp_sp``).  Other non-finite array fills: the operand is densified
  quietly when no larger than the result, else the densify fallback (warned).
* Hybrid operands: the dense dims are unrolled into matrix coordinates (each stored dense
  slice is ``prod(dense_shape)`` stored elements); the array fill stays a broadcastable
  tensor in the correction.
* Non-finite dense operand (an ``inf``/NaN in ``X``; checked once, by its finite column sums, O(X);
  traced: always this path, branch-free): the products are the dense ones, unlike torch's own sparse
  products.  Zero fill: NaN wherever a row's unspecified element meets an ``inf``/NaN ``X[k, j]``
  (``0 * inf``), counted by one native product; a nonzero fill: its terms summed over the
  unspecified elements as the non-finite fill's are (counts of ``+inf``, ``-inf``, NaN terms: no
  ``inf - inf`` from the decomposition).  An indefinite fill forms no products there (masked).
  Complex: the exact real products of the real and imaginary parts; a fill varying along both matrix
  dims (sparse along the batch only): each matrix is stored whole or is the fill.
* Stored inf/NaN in a sparse @ sparse product (checked by the sums of the stored values, O(nse)):
  the terms they form with the other operand's unspecified elements are formed as dense forms them
  (zero fills: NaN in the rows/columns holding them, the result stays sparse; otherwise the counts
  of ``+inf``, ``-inf``, NaN terms, each a product of indicator operands):
  :func:`.linalg_nonfinite.sp_sp_stored_nonfinite`.

* Half types (bfloat16, float16; torch's sparse kernels have none): computed in float32 and rounded
  once (:func:`product`; ``addmm``-like ops too, ``products._half_in_float32``), as torch's dense
  CPU ``mm`` accumulates them: equal to the dense bfloat16 product but for float32 summation order
  (one ulp in ~0.01% of elements), and 6-14x faster than a gather/index_add product in the half
  type.  Under ``torch.autocast`` the SparseTensor operand is cast by autocast itself (``_to_copy``:
  values and fill), as a dense one.

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
>>> Ah, xh = A.to(torch.bfloat16), torch.ones(3, 2, dtype=torch.bfloat16)
>>> torch.equal(Ah @ xh, Ah.to_dense() @ xh), (Ah @ xh).dtype
(True, torch.bfloat16)
>>> B = sparsefill.sparse_coo_tensor([[0], [1]], [float("inf")], (3, 2))   # inf * 0 = NaN, as dense
>>> (B @ B.T).to_dense().tolist()
[[inf, nan, nan], [nan, 0.0, 0.0], [nan, 0.0, 0.0]]
"""

from __future__ import annotations

import warnings

import torch

from sparsefill._kernels import index as _index
from sparsefill._kernels.trace import bincount, known_true, traced
from sparsefill._tensor.parts import (
    coalesce_of,
    coalesced_parts,
    map_inner,
    parts_to_sparse,
    scalar_parts,
)
from sparsefill._kernels.grouping import gathered_cached, kept_values_owner, pattern_cached
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops.shape import reshape as _shape

aten = torch.ops.aten


class _Mat:
    """A sparse operand as ``nb`` matrices ``(m, k)`` in block-diagonal coordinates.

    ``crow`` (``nb*m + 1``) and ``col`` (``b*k + j``) index the stored elements row by row;
    ``vals`` are the stored values, ``fill`` the fill as a 3-d tensor broadcastable to
    ``(nb, m, k)`` (None when zero or indefinite), ``finite`` whether it is finite."""

    def __init__(
        self, nb, m, k, crow, col, vals, fill, finite, layout, rows=None, key=None, indefinite=False
    ):
        self.nb, self.m, self.k, self.indefinite = nb, m, k, indefinite
        self.crow, self.col, self.vals, self.fill, self.finite = crow, col, vals, fill, finite
        self.layout, self._rows = layout, rows
        self.key = (
            key  # (the operand's index tensors, a tag of what else the pattern depends on) or None
        )
        self.values_owner = None  # (set by _mat: the operand's values may be kept reordered)

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
            values = (
                self.vals if self.fill is None or not self.finite else self.vals - self.fill_at()
            )
        with warnings.catch_warnings():
            # "Sparse CSR tensor support is in beta state"
            warnings.simplefilter("ignore", UserWarning)
            return torch.sparse_csr_tensor(
                self.crow, self.col, values, (self.nb * self.m, self.nb * self.k)
            )

    def t(self) -> _Mat:
        """The transposed matrices: global rows and columns swap roles (a stable counting sort)."""
        # compiled: the gather/scatter-add products read rows and columns in any order
        if traced(self.col):
            fill = None if self.fill is None else self.fill.transpose(-1, -2)
            return _Mat(
                self.nb,
                self.k,
                self.m,
                None,
                self.rows,
                self.vals,
                fill,
                self.finite,
                self.layout,
                self.col,
                indefinite=self.indefinite,
            )
        if self.key is None:
            perm, crow, tcol, trows = self._transposed_pattern()
        # the operand's own index tensors: the same pattern recurs (a training loop), sorted once
        else:
            tensors, tag = self.key
            tag = ("mat_t", self.nb, self.m, self.k) + tag
            perm, crow, tcol, trows = pattern_cached(tag, tensors, self._transposed_pattern)
        vals = (
            self.vals[perm]
            if self.key is None
            else gathered_cached(self.vals, perm, tag, tensors, self.values_owner)
        )
        fill = None if self.fill is None else self.fill.transpose(-1, -2)
        return _Mat(
            self.nb,
            self.k,
            self.m,
            crow,
            tcol,
            vals,
            fill,
            self.finite,
            self.layout,
            trows,
            indefinite=self.indefinite,
        )

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
            crow = torch.cat(
                [(crow[:, :-1] + off * nse).reshape(-1), crow.new_full((1,), nb * nse)]
            )
            col, vals = (col + off * k).reshape(-1), vals.reshape(-1)
        M = _Mat(
            nb,
            m,
            k,
            crow,
            col,
            vals,
            fill,
            finite,
            A._sf_layout,
            key=((A._crow, A._col), ()),
            indefinite=A._indefinite,
        )
        M.values_owner = kept_values_owner(A)
        return M
    idx, vals = coalesced_parts(A)
    key = (
        (idx,),
        tuple(A._dense_shape),
    )  # (indices, not their row views: untracked in __torch_dispatch__)
    if A.dense_dim():
        idx, vals = scalar_parts(idx, vals, A._dense_shape)
    if nd == 2:
        rows, col = idx[0], idx[1]
    else:
        rows, col = idx[0] * m + idx[1], idx[0] * k + idx[2]
    counts = bincount(rows, nb * m)
    crow = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    M = _Mat(nb, m, k, crow, col, vals, fill, finite, A._sf_layout, rows, key, A._indefinite)
    M.values_owner = kept_values_owner(A)
    return M


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
    # torch's sparse kernels do not trace: a gather and a scatter-add
    if traced(M.col) or traced(Xs):
        out = _gather_spmm(M, Xs, values).view(M.nb, M.m, n)
        return out if bias is None else out + bias
    mat = M.csr(values)
    # torch's CSR kernels: floating only
    if not (mat.dtype.is_floating_point or mat.dtype.is_complex):
        mat = torch.sparse_coo_tensor(
            torch.stack([M.rows, M.col]), mat.values(), mat.shape, is_coalesced=True
        )
    # (float64 sums, rounded once: as accurate as
    if mat.dtype == torch.float32 and _longest_row(M) > _LONG_ROW:
        # torch's dense)
        out = (mat.to(torch.float64) @ Xs.to(torch.float64)).to(mat.dtype).view(M.nb, M.m, n)
        return out if bias is None else out + bias
    if (
        bias is not None
        and M.nb == 1
        and bias.dim() == 3
        and bias.shape[0] == 1
        and bias.dtype == mat.dtype
    ):
        return torch.addmm(bias[0], mat, Xs).view(1, M.m, n)
    out = (mat @ Xs).view(M.nb, M.m, n)
    return out if bias is None else out + bias


_LONG_ROW = 256  # (a float32 row longer than this accumulates in float64)


def _longest_row(M: _Mat) -> int:
    """The most stored elements of a row of ``M``: torch's CSR kernels sum a row's products in
    order, in one float32 slot (a 1M-element row: ~1e-4 relative error, where torch's dense ``dot``
    and ``mv`` err ~1e-7)."""
    if M.crow.numel() < 2:
        return 0
    if M.key is None:
        return int((M.crow[1:] - M.crow[:-1]).max())
    tensors, tag = M.key
    return pattern_cached(
        ("longest_row", M.nb, M.m, M.k, M.crow.numel()) + tag,
        tensors,
        lambda: int((M.crow[1:] - M.crow[:-1]).max()),
    )


def _gather_spmm(M: _Mat, Xs: torch.Tensor, values=None) -> torch.Tensor:
    """``out[r] = sum(values[e] * Xs[col[e]] for the stored e of row r)``, ``(nb * m, n)``:
    ``M.csr(values) @ Xs`` in ops that torch.compile traces (values default to ``A0 = A - F``, as
    :meth:`_Mat.csr`): the custom op ``sparsefill::pattern_spmm`` where the compiled kernels run
    (:mod:`.pattern_ops`), else a gather and an ``index_add``."""
    if values is None:
        values = M.vals if M.fill is None or not M.finite else M.vals - M.fill_at()
    from sparsefill.ops.linalg import pattern_ops

    # (the compiled kernels: no (nse, n) temporary, the rows read at random prefetched; a
    # transpose (no crow: rows in any order) scatters at random, which inductor's loop did faster
    # for rows shorter than a cache line: 6 against 10 ms at 1.1M elements x 8 float32 columns)
    if (
        values.dim() == 1
        and (M.crow is not None or Xs.shape[-1] * Xs.element_size() >= 64)
        and pattern_ops.usable(values, Xs, M.col.shape[0] * Xs.shape[-1])
    ):
        return pattern_ops.pattern_spmm(values, Xs, M.rows, M.col, M.nb * M.m)
    terms = values[:, None] * Xs.index_select(0, M.col)
    return terms.new_zeros(M.nb * M.m, Xs.shape[-1]).index_add_(0, M.rows, terms)


def _colsum_if_finite(X: torch.Tensor):
    """``X.sum(-2, keepdim=True)`` when it is finite, else None (traced: None, no data read).  A
    finite column sum means no inf or NaN in ``X`` (they propagate); an overflow only sends a finite
    ``X`` to the exact path.  One pass of adds (``isfinite(X).all()`` costs ~20x more on CPU); the
    nonzero fill's correction reuses the sums."""
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
        return _native_spmm(
            M, X, bias=M.fill * s if M.fill.shape[-1] == 1 else torch.matmul(M.fill, X)
        )
    from sparsefill.ops.linalg.nonfinite import sp_dense_exact

    return sp_dense_exact(M, X)


def _dense_sp(X: torch.Tensor, M: _Mat) -> torch.Tensor | None:
    """``X @ B`` with ``X`` dense ``(nb | 1, m, k)``: ``(B^T @ X^T)^T``."""
    out = _sp_dense(M.t(), X.transpose(-1, -2))
    return None if out is None else out.transpose(-1, -2)


def _sp_sp(A: _Mat, B: _Mat):
    """``A @ B``: a SparseTensor for zero fills, else dense ``(nb, m, n)`` (None: not handled here).
    A stored inf/NaN (checked by the sum of the stored values, O(nse)) takes
    :func:`.linalg_nonfinite.sp_sp_stored_nonfinite`."""
    if not (A.finite and B.finite and (A.vals.dtype.is_floating_point or A.vals.dtype.is_complex)):
        return None
    if not (known_true(torch.isfinite(A.vals.sum())) and known_true(torch.isfinite(B.vals.sum()))):
        from sparsefill.ops.linalg.nonfinite import sp_sp_stored_nonfinite

        return sp_sp_stored_nonfinite(A, B)
    nb, m, n = A.nb, A.m, B.k
    b, i, j, vals = _native_pairs(A, B)
    if A.fill is None and B.fill is None:
        return b, i, j, vals
    out = vals.new_zeros(nb, m, n).index_put_((b, i, j), vals, accumulate=True)
    if A.fill is not None:  # F @ B0
        f = A.fill
        if f.shape[-1] == 1:
            colsum = B.vals.new_zeros(nb * n).index_put_(
                (B.col,), B.csr().values(), accumulate=True
            )
            out = out + f * colsum.view(nb, 1, n)
        else:
            out = out + _dense_sp(
                f.expand(f.shape[0], f.shape[1], A.k),
                _Mat(
                    B.nb, B.m, B.k, B.crow, B.col, B.csr().values(), None, True, B.layout, B._rows
                ),
            )
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
        out = out + torch.matmul(
            f.expand(f.shape[0], f.shape[1], A.k), g.expand(g.shape[0], B.m, g.shape[-1])
        )
    return out


def _native_pairs(A: _Mat, B: _Mat):
    """``A0 @ B0`` by torch's native CSR product (block diagonal ``(nb*m, nb*n)``) as ``(b, i, j,
    values)``."""
    P = A.csr() @ B.csr()
    crow, col, vals = P.crow_indices(), P.col_indices(), P.values()
    m, n = A.m, B.k
    rows = torch.repeat_interleave(
        torch.arange(A.nb * m, device=col.device), crow[1:] - crow[:-1], output_size=col.numel()
    )
    b = rows // m if m else rows
    return b, rows - b * m, col - b * n, vals


# ---------------------------------------------------------------------- the product of two operands
def product(a, b, out_shape, *, sparse_ok=True):
    """``a @ b`` for 1-d, 2-d or 3-d (batched, equal batch) operands, at least one a SparseTensor.

    Returns a tensor of ``out_shape``: a SparseTensor when both are SparseTensors with zero (or
    indefinite) fills and ``sparse_ok``, else dense; None when not handled here.  Half types
    (bfloat16, float16; torch's sparse kernels have none) are computed in float32 and rounded once,
    as torch's dense CPU product accumulates them."""
    if min(a.dim(), b.dim()) == 0:
        return None
    if a.dtype in _HALF:
        r = product(_upcast(a), _upcast(b), out_shape, sparse_ok=sparse_ok)
        return None if r is None else _cast(r, a.dtype)
    if any(s == 0 for s in tuple(a.shape) + tuple(b.shape)) or not _index.numel(out_shape):
        dtype, device = a.dtype, a.device
        both = isinstance(a, SparseTensor) and isinstance(b, SparseTensor)
        if (
            both
            and sparse_ok
            and a._fill_is_zero() | a._indefinite
            and b._fill_is_zero() | b._indefinite
        ):
            return _sparse_out(
                a,
                b,
                out_shape,
                *(torch.zeros(0, dtype=torch.int64, device=device),) * 3,
                torch.zeros(0, dtype=dtype, device=device),
            )
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
            from sparsefill.ops.linalg.nonfinite import nonfinite_sp_sp, one_dense

            r = nonfinite_sp_sp(a, b)
            if r is None:  # one operand dense, if that costs no more than the result
                r = one_dense(a, b, A, B, out_shape)
    elif A is not None:
        X = b.unsqueeze(-1) if b.dim() == 1 else b
        r = _sp_dense(A, X if X.dim() == 3 else X.unsqueeze(0))
    else:
        X = a.unsqueeze(0) if a.dim() == 1 else a
        r = _dense_sp(X if X.dim() == 3 else X.unsqueeze(0), B)
    return None if r is None else r.reshape(out_shape)


_HALF = (torch.bfloat16, torch.float16)


def _upcast(T: torch.Tensor) -> torch.Tensor:
    """``T`` in float32 (exact); a SparseTensor is coalesced first: its duplicates add up in its own
    dtype, as in its dense tensor."""
    if not isinstance(T, SparseTensor):
        return T.float()
    return map_inner(T if T._coalesced else coalesce_of(T), torch.Tensor.float)


def _cast(T: torch.Tensor, dtype) -> torch.Tensor:
    """``T`` (a product's result) rounded to ``dtype``."""
    return map_inner(T, lambda t: t.to(dtype)) if isinstance(T, SparseTensor) else T.to(dtype)


def _sparse_out(a, b, out_shape, bb, i, j, vals):
    """The zero-fill sparse product as a SparseTensor of ``out_shape`` (layout of ``a``)."""
    idx = torch.stack([bb, i, j])
    keep = [d for d, v in zip((0, 1, 2), (len(out_shape) == 3, a.dim() > 1, b.dim() > 1)) if v]
    zero = torch.zeros((), dtype=vals.dtype, device=vals.device)
    layout = a._sf_layout if len(out_shape) >= 2 else torch.sparse_coo
    return parts_to_sparse(idx[keep], vals, out_shape, zero, known_zero=True, layout=layout)
