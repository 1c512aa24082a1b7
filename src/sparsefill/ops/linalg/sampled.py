"""Sampling at a SparseTensor's pattern (2-D; the sampled product also a batch ``(b, m, n)``):
``x.sparse_mask(A)`` and the sampled product (SDDMM) ``torch.sparse.sampled_addmm(A, m1, m2, beta=,
alpha=)``::

    out = A with values beta * A[i, j] + alpha * (m1 @ m2)[i, j] at A's stored (i, j),
          and fill beta * fill

    x.sparse_mask(A) = A's pattern with the values x[i, j] and fill 0

as torch's on a native CSR tensor (fill 0: the unspecified elements stay 0); an indefinite fill
stays indefinite (the scores of a sparse attention on the mask's pattern, no dense ``m1 @ m2``).
O(nse x k).

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor(
...     [[0, 1], [1, 0]], [1.0, 2.0], (2, 2), fill_value=sparsefill.indefinite
... )
>>> torch.sparse.sampled_addmm(A.to_sparse_csr(), torch.ones(2, 3), torch.ones(3, 2)).values()
tensor([4., 5.])
"""

from __future__ import annotations

import warnings

import torch

from sparsefill._kernels.trace import bincount
from sparsefill._tensor.parts import coalesced_parts
from sparsefill._kernels.grouping import pattern_cached
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops.registry import register

aten = torch.ops.aten


@register(aten.sparse_sampled_addmm.default)
def _sampled_addmm(func, args, kwargs):
    """``beta * A + alpha * (m1 @ m2)`` at A's stored elements, for a 2-D ``A`` ``(m, n)`` or a
    batch of them ``(b, m, n)`` with ``m1`` ``(b, m, k)``, ``m2`` ``(b, k, n)``: torch's fused SDDMM
    kernel on a CSR view of the pattern (batches block-diagonal), O(nse x k) with no ``(nse, k)``
    temporary."""
    A, m1, m2 = args[:3]
    beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
    if (
        not isinstance(A, SparseTensor)
        or isinstance(m1, SparseTensor)
        or isinstance(m2, SparseTensor)
    ):
        return NotImplemented
    _check(A, m1, m2)
    if A.sparse_layout is torch.sparse_coo and not A.is_coalesced():
        A = A.coalesce()  # (one value per stored position, as torch's CSR)
    vals = _sddmm(A, m1, m2, beta, alpha)
    # (a batched CSR's values are (b, nse per batch))
    vals = vals.to(A.dtype).reshape(A._vals.shape)
    return _like(A, vals, A._fill if A._indefinite or beta == 1 else A._fill * beta)


def _check(A, m1, m2):
    """torch's errors for the shapes and dtypes, and one naming what works where a form is not
    supported."""
    if A.dense_dim() or A.dim() not in (2, 3):
        raise RuntimeError(
            f"sampled_addmm: self of shape {tuple(A.shape)} with {A.dense_dim()} dense dims: a "
            "SparseTensor pattern is 2-D (m, n) or a batch (b, m, n) with no dense dims; convert "
            "a hybrid one with sparsefill.convert(A, dense_dim=0)"
        )
    b = A.shape[:-2]
    if (
        m1.dim() != A.dim()
        or m2.dim() != A.dim()
        or m1.shape[:-2] != b
        or m2.shape[:-2] != b
        or m1.shape[-1] != m2.shape[-2]
        or (m1.shape[-2], m2.shape[-1]) != tuple(A.shape[-2:])
    ):
        raise RuntimeError(
            f"sampled_addmm: self {tuple(A.shape)}, mat1 {tuple(m1.shape)} and mat2 "
            f"{tuple(m2.shape)} do not fit: need mat1 (*, m, k), mat2 (*, k, n), self (*, m, n) "
            "with the same batch dims"
        )
    for name, m in (
        ("mat1", m1),
        ("mat2", m2),
    ):  # (as torch's: the product is not cast to self's dtype)
        if m.dtype != A.dtype:
            raise RuntimeError(
                f"sampled_addmm: Expected {name} and self to have the same dtype, but got "
                f"{m.dtype} and {A.dtype}"
            )


def _sddmm(A: SparseTensor, m1, m2, beta, alpha):
    """The stored values of the result (coalesced order): torch's kernel for the float types on a
    CSR view of the pattern, ``(b*m, b*n)`` block-diagonal for a batch; other dtypes by rows of 4096
    stored elements."""
    crow, col, vals = _csr_view(A)
    nb = A.shape[0] if A.dim() == 3 else 1
    m, n, k = A.shape[-2], A.shape[-1], m1.shape[-1]
    U = m1.reshape(nb * m, k)
    V = m2.reshape(nb, k, n).permute(1, 0, 2).reshape(k, nb * n) if nb > 1 else m2
    if A.dtype in (torch.float32, torch.float64, torch.complex64, torch.complex128) and col.numel():
        with warnings.catch_warnings():
            # "Sparse CSR tensor support is in beta state"
            warnings.simplefilter("ignore", UserWarning)
            P = torch.sparse_csr_tensor(crow, col, vals, (nb * m, nb * n), check_invariants=False)
        return torch.sparse.sampled_addmm(P, U, V, beta=beta, alpha=alpha).values()
    rows = torch.repeat_interleave(
        torch.arange(nb * m, device=col.device), crow.diff(), output_size=col.numel()
    )
    Vt = V.t()
    parts = [
        # (bounded temporaries: 4096 x k at a time)
        (U.index_select(0, r) * Vt.index_select(0, c)).sum(1)
        for r, c in zip(rows.split(4096), col.split(4096))
    ]
    sampled = torch.cat(parts) if parts else vals.new_zeros(0)
    return (vals * beta if beta != 1 else vals) + (sampled * alpha if alpha != 1 else sampled)


def pattern_product(A: SparseTensor, gvals, m1, m2, needs=(True, True)):
    """``(P @ m2^T, m1^T @ P)`` (batched as ``A``) for ``P`` the matrix of values ``gvals`` at
    ``A``'s coalesced pattern: the gradients of the sampled product, by torch's CSR kernels on the
    pattern's CSR view."""
    crow, col, _ = _csr_view(A)
    nb = A.shape[0] if A.dim() == 3 else 1
    m, n, k = A.shape[-2], A.shape[-1], m1.shape[-1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Sparse CSR tensor support is in beta state"
        P = torch.sparse_csr_tensor(
            crow, col, gvals.to(m1.dtype), (nb * m, nb * n), check_invariants=False
        )
    g1 = g2 = None
    if needs[0]:  # (b*m, b*n) @ (b*n, k): block-diagonal, one CSR product for every batch
        V = m2.reshape(nb, k, n).transpose(1, 2).reshape(nb * n, k)
        g1 = torch.mm(P, V.conj()).reshape(m1.shape)
    # P^T as a CSR matrix of its own (cached with the pattern): 10x torch's mm of P.t()
    if needs[1]:
        crow_t, col_t, perm = pattern_cached(
            ("sampled_csr_t", nb * m, nb * n), (crow, col), lambda: _transposed(crow, col, nb * n)
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            PT = torch.sparse_csr_tensor(
                crow_t,
                col_t,
                P.values().index_select(0, perm),
                (nb * n, nb * m),
                check_invariants=False,
            )
        g2 = (
            torch.mm(PT, m1.reshape(nb * m, k).conj())
            .reshape(nb, n, k)
            .transpose(1, 2)
            .reshape(m2.shape)
        )
    return g1, g2


def _transposed(crow, col, ncols: int):
    """``(crow, col, perm)`` of the transpose of the CSR pattern ``(crow, col)``: its values are
    ``values[perm]``."""
    rows = torch.repeat_interleave(
        torch.arange(crow.numel() - 1, device=col.device), crow.diff(), output_size=col.numel()
    )
    perm = torch.sort(col, stable=True).indices  # (rows ascend within each column: stable)
    return (
        torch._convert_indices_from_coo_to_csr(col.index_select(0, perm), ncols),
        rows.index_select(0, perm),
        perm,
    )


def _csr_view(A: SparseTensor):
    """``(crow, col, values)`` of ``A``'s coalesced pattern as a 2-D CSR matrix (a batch:
    block-diagonal, rows ``b*m + i``, columns ``b*n + j``), cached with the pattern."""
    if A._sf_layout is torch.sparse_csr and A._crow.dim() == 1:
        return A._crow, A._col, A._vals
    idx, vals = coalesced_parts(A)
    m, n = A.shape[-2], A.shape[-1]
    nrows = m * (A.shape[0] if A.dim() == 3 else 1)

    def view():
        r, c = (idx[0], idx[1]) if A.dim() == 2 else (idx[0] * m + idx[1], idx[0] * n + idx[2])
        crow = torch.zeros(nrows + 1, dtype=torch.int64, device=idx.device)
        torch.cumsum(bincount(r, nrows), 0, out=crow[1:])
        return crow, c

    crow, col = pattern_cached(("sampled_csr_view", tuple(A.shape)), (idx,), view)
    return crow, col, vals


def _like(A: SparseTensor, vals, fill, indefinite=None) -> SparseTensor:
    """A SparseTensor of (coalesced) ``A``'s pattern holding ``vals`` and ``fill`` (indefinite as
    ``A`` unless told)."""
    indefinite = A._indefinite if indefinite is None else indefinite
    return SparseTensor(
        A.sparse_layout,
        A.shape,
        vals,
        fill,
        indices=A._idx,
        crow=A._crow,
        col=A._col,
        indefinite=indefinite,
        coalesced=True,
    )


def _pattern(A: SparseTensor):
    """``(A coalesced, rows, cols)`` of a 2-D SparseTensor (CSR: rows expanded from
    ``crow_indices``)."""
    if A.sparse_layout is torch.sparse_coo and not A.is_coalesced():
        A = A.coalesce()  # (one value per stored position, as torch's CSR)
    if A.sparse_layout is torch.sparse_csr:
        rows = torch.repeat_interleave(
            torch.arange(A.shape[0], device=A._col.device),
            A._crow.diff(),
            output_size=A._col.numel(),
        )
        return A, rows, A._col
    return A, A._idx[0], A._idx[1]


@register(aten.sparse_mask.default)
def _sparse_mask(func, args, kwargs):
    x, A = args[0], args[1]
    if not isinstance(A, SparseTensor) or A.dim() == 0 or A.dense_dim() or x.shape != A.shape:
        return NotImplemented
    if A.dim() == 2:
        A, rows, cols = _pattern(A)
        vals = x[rows, cols]
    else:
        A = A.coalesce() if A.sparse_layout is torch.sparse_coo and not A.is_coalesced() else A
        vals = x[tuple(coalesced_parts(A)[0])].reshape(A._vals.shape)
    vals = vals.to_dense() if isinstance(vals, SparseTensor) else vals
    return _like(
        A, vals.to(x.dtype), torch.zeros((), dtype=x.dtype, device=x.device), indefinite=False
    )
