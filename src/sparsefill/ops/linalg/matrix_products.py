"""The aten handlers of the matrix-product family on SparseTensors: ``mm``, ``bmm``, ``mv``,
``dot``/``vdot``, ``addmm``/``addmv``/``baddbmm``/``addbmm``, ``addr``, torch's sparse ``addmm`` and
``_sparse_mm_reduce_impl``. Each checks its arguments as torch does (:func:`_check`: torch's own
errors and the result shape), then computes with :func:`sparsefill.ops.linalg.product` (whose
docstring states the decomposition and the
invariant ``densify(A @ B) == A.to_dense() @ B.to_dense()``)::

    addmm(self, a, b, beta, alpha) == beta * self + alpha * (a @ b)

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor([[0, 1], [1, 0]], [1., 2.], (2, 2), fill_value=1.)
>>> torch.mm(A, torch.eye(2)).tolist()
[[1.0, 1.0], [2.0, 1.0]]
"""

from __future__ import annotations

import warnings

import torch

from sparsefill._kernels import index as _index
from sparsefill._tensor.parts import coalesced_parts
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops.shape import reshape as _shape
from sparsefill.ops._schema import probe_of
from sparsefill.ops.linalg.product import _HALF, _cast, _mat, _upcast, product
from sparsefill.ops.registry import register

aten = torch.ops.aten

# products whose meta kernel is torch's C++ one; the others' (mv, dot, addmm, addmv, addr) is
# Python, and its first call in a process imports torch._dynamo (0.4-0.5 s)
_CPP_META = (aten.mm.default, aten.bmm.default, aten.baddbmm.default, aten.addbmm.default)


def _check(func, args, kwargs):
    """torch's own shape/dtype errors and the result shape: from the op on meta tensors where its
    meta kernel is C++; else from the op on one-element tensors (rank, dtype and device errors) and
    ``mm`` on meta tensors (the sizes: ``(m, k) @ (k,) -> (m, 1)[:, 0]``; ``self`` expands to the
    product's shape)."""
    meta = [
        torch.empty(a.shape, dtype=a.dtype, device="meta") if isinstance(a, torch.Tensor) else a
        for a in args
    ]
    if func in _CPP_META:
        shape = func(*meta, **kwargs).shape
        dtypes = {a.dtype for a in args if isinstance(a, torch.Tensor)}
        # (meta kernels take bool and mixed dtypes; CPU's do not)
        if torch.bool in dtypes or len(dtypes) > 1:
            func(*[probe_of(a) if isinstance(a, torch.Tensor) else a for a in args], **kwargs)
        return shape
    func(*[probe_of(a) if isinstance(a, torch.Tensor) else a for a in args], **kwargs)
    if func is aten.addr.default:
        shape = aten.mm.default(meta[1][:, None], meta[2][None]).shape
    else:
        a, b = meta[1:3] if func in (aten.addmm.default, aten.addmv.default) else meta[:2]
        p = aten.mm.default(a if a.dim() == 2 else a[None], b if b.dim() == 2 else b[:, None])
        shape = p.shape[(a.dim() == 1) : 2 - (b.dim() == 1)]
    if func in (aten.addmm.default, aten.addmv.default, aten.addr.default):
        meta[0].expand(shape)  # torch's error for a self that does not broadcast
    return shape


# ---------------------------------------------------------------------- handlers
def _half_in_float32(handler):
    """``beta * self + alpha * (a @ b)`` in bfloat16/float16 computed in float32 and rounded once,
    as torch's dense CPU kernels (rounding the product first, then the sum, is 2-3 roundings: not
    the dense result)."""

    def wrapped(func, args, kwargs):
        dtype = args[1].dtype
        if dtype not in _HALF:
            return handler(func, args, kwargs)
        _check(func, args, kwargs)  # (torch's errors in the operands' dtypes)
        out = handler(
            func, [_upcast(a) if isinstance(a, torch.Tensor) else a for a in args], kwargs
        )
        return out if out is NotImplemented else _cast(out, dtype)

    return wrapped


def _handle(func, args, kwargs, a, b, *, sparse_ok=True):
    out_shape = _check(func, args, kwargs)
    r = product(a, b, out_shape, sparse_ok=sparse_ok)
    return NotImplemented if r is None else r


@register(aten.mm.default, aten.bmm.default, aten.mv.default)
def _mm(func, args, kwargs):
    return _handle(func, args, kwargs, args[0], args[1])


@register(aten.dot.default, aten.vdot.default)
def _dot(func, args, kwargs):
    a, b = args[0], args[1]
    if func is aten.vdot.default and a.is_complex():
        a = a.conj_physical()
    return _handle(func, args, kwargs, a, b, sparse_ok=False)


def _add_scaled(self, prod, beta, alpha, out_shape):
    """``beta * self + alpha * prod`` (``self`` ignored when ``beta == 0``, as torch); a
    SparseTensor ``self`` joins by the element-wise rule (``pointwise.py``)."""
    out = prod if alpha == 1 else prod * alpha
    if (
        beta != 0
        and isinstance(self, SparseTensor)
        and self._indefinite
        and not isinstance(out, SparseTensor)
    ):
        if tuple(self.shape) != tuple(out_shape):
            return NotImplemented
        # masked: specified exactly where self is (an n-ary op with an indefinite operand)
        from sparsefill._tensor.parts import rewrap

        idx, vals = coalesced_parts(self)
        keys = _index.linearize(idx, self._sparse_shape)
        at = out.reshape((_index.numel(self._sparse_shape),) + tuple(self._dense_shape))[keys]
        new = vals * beta + at
        if self._sf_layout is torch.sparse_coo:
            return rewrap(self, indices=idx, values=new, coalesced=True)
        return rewrap(self, values=new.reshape(self._vals.shape))
    if beta != 0:
        out = out + (self if beta == 1 else self * beta)
    # (bool: True * 2 promotes to int64; torch's addmm keeps its operands' dtype)
    if out.dtype != prod.dtype:
        out = out.to(prod.dtype)
    return out.expand(out_shape) if tuple(out.shape) != tuple(out_shape) else out


@register(aten.addmm.default, aten.addmv.default, aten.baddbmm.default)
@_half_in_float32
def _addmm(func, args, kwargs):
    self, m1, m2 = args[:3]
    beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
    out_shape = _check(func, args, kwargs)
    mm_shape = out_shape
    if isinstance(m1, SparseTensor) or isinstance(m2, SparseTensor):
        prod = product(m1, m2, mm_shape)
        if prod is None:
            return NotImplemented
    else:
        prod = torch.matmul(m1, m2)
    return _add_scaled(self, prod, beta, alpha, out_shape)


@register(aten.addbmm.default)
@_half_in_float32
def _addbmm(func, args, kwargs):
    """``beta * self + alpha * sum_b(batch1[b] @ batch2[b])``."""
    self, b1, b2 = args[:3]
    out_shape = _check(func, args, kwargs)
    if not (isinstance(b1, SparseTensor) or isinstance(b2, SparseTensor)):
        prod = torch.bmm(b1, b2).sum(0)
    else:
        prod = product(b1, b2, (b1.shape[0],) + tuple(out_shape))
        if prod is None:
            return NotImplemented
        prod = prod.sum(0)
    return _add_scaled(self, prod, kwargs.get("beta", 1), kwargs.get("alpha", 1), out_shape)


def _unsq(v, dim):
    return _shape.unsqueeze(v, dim) if isinstance(v, SparseTensor) else v.unsqueeze(dim)


@register(aten.addr.default)
@_half_in_float32
def _addr(func, args, kwargs):
    """``beta * self + alpha * outer(vec1, vec2)``, the outer product as ``(m, 1) @ (1, n)``."""
    self, v1, v2 = args[:3]
    out_shape = _check(func, args, kwargs)
    if not (isinstance(v1, SparseTensor) or isinstance(v2, SparseTensor)):
        prod = torch.outer(v1, v2)
    else:
        prod = product(_unsq(v1, 1), _unsq(v2, 0), (v1.shape[0], v2.shape[0]))
        if prod is None:
            return NotImplemented
    return _add_scaled(self, prod, kwargs.get("beta", 1), kwargs.get("alpha", 1), out_shape)


# ---------------------------------------------------------------------- torch.sparse.mm / addmm
@register(aten._sparse_addmm.default)
def _sparse_addmm(func, args, kwargs):
    """``torch.sparse.addmm`` (and ``torch.sparse.mm``, which decomposes into it): ``addmm`` of the
    dense tensors; an indefinite operand forms no products at its unspecified elements, as torch's
    native ones."""
    return _addmm(aten.addmm.default, args, kwargs)


def _reduce_operand(A: SparseTensor, reduce: str) -> torch.Tensor:
    """The native CSR matrix torch's ``reduce`` kernel reads for ``A``: the specified elements when
    they are all that counts (an indefinite fill; a zero fill under ``sum``), else every element
    (O(numel), under the densify policy), since ``out[i, j] = reduce_k A[i, k] * X[k, j]`` runs over
    every ``k``."""
    if A._indefinite or (reduce == "sum" and A._fill_is_zero()):
        M = _mat(A)
        return M.csr(M.vals)
    from sparsefill._tensor.parts import dense_of
    from sparsefill._tensor.policy import check_densify

    check_densify(
        f"torch.sparse.mm(reduce={reduce!r}) of a SparseTensor with a fill",
        A.numel() * A.element_size(),
    )
    (m, k), dev = A.shape, A.device
    crow = torch.arange(m + 1, device=dev) * k
    col = torch.arange(k, device=dev).repeat(m)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Sparse CSR tensor support is in beta state"
        return torch.sparse_csr_tensor(crow, col, dense_of(A).reshape(-1), (m, k))


@register(aten._sparse_mm_reduce_impl.default, aten._sparse_mm_reduce_impl_backward.default)
def _sparse_mm_reduce(func, args, kwargs):
    """``torch.sparse.mm(A, X, reduce)``: ``out[i, j] = reduce_k A[i, k] * X[k, j]`` over every
    ``k`` of the dense ``A`` (torch's formula), on torch's CSR kernel; an indefinite fill reduces
    over the specified elements only (torch's rule for a native tensor: an empty row gives 0).  COO
    and CSR, 2-D, no dense dims.  The backward runs on the same CSR matrix; ``A``'s gradient is its
    SparseTensor (fill 0)."""
    A = args[0]
    reduce = args[2] if func is aten._sparse_mm_reduce_impl.default else args[3]
    if not isinstance(A, SparseTensor) or A.dim() != 2 or A.dense_dim():
        # (a native A goes to the densify fallback as it is: registry.KEEPS_NATIVE)
        return NotImplemented
    from sparsefill._tensor.parts import dense_of
    from sparsefill._tensor.policy import check_densify

    for X in args[1:3]:
        if isinstance(X, SparseTensor):  # a dense operand of torch's kernel
            check_densify(f"{func}: a SparseTensor in a dense role", X.numel() * X.element_size())
    rest = [dense_of(a) if isinstance(a, SparseTensor) else a for a in args[1:]]
    out = func(_reduce_operand(A, reduce), *rest, **kwargs)
    if func is aten._sparse_mm_reduce_impl.default:
        return out
    from sparsefill._tensor.parts import from_native

    return (None if out[0] is None else from_native(out[0]), out[1])
