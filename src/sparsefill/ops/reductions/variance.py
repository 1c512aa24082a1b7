"""var and std (and ``var_mean``/``std_mean``) of a SparseTensor, as torch's: centred on each
slice's mean over sparse dims only or dense dims only (the reducer protocol's
:class:`_kernels.reducer.Var`, by :func:`ops.reductions.reduce.reduce_dims`), shifted sums over both
kinds of dims at once::

    var[s] = (sum_i (x_i - mean[s])^2 + n_fill[s] * (f - mean[s])^2) / max(N - correction, 0)

Invariant: ``torch.var(A, dims).to_dense() == torch.var(A.to_dense(), dims)``, the mean of
``var_mean`` as torch's Welford pass gives it (:func:`welford_mean`).

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor([[0, 2]], [1., 3.], (4,), fill_value=1.)
>>> torch.var(A), torch.var(A.to_dense())
(tensor(1.), tensor(1.))
"""

from __future__ import annotations

import warnings

import torch

from sparsefill._kernels import index as _index
from sparsefill._kernels.trace import traced
from sparsefill._kernels.reducer import accumulator_dtype
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops._schema import check_dtype, reduction_meta
from sparsefill.ops.registry import register
from sparsefill.ops.reductions.reduce import _dims_arg, _scalar, reduce_dims

aten = torch.ops.aten


def _correction(args, kwargs):
    c = kwargs.get("correction")
    return 1 if c is None else c


@register(
    aten.var.correction, aten.std.correction, aten.var_mean.correction, aten.std_mean.correction
)
def _var_std(func, args, kwargs):
    """var/std (and their means) as torch's: over sparse dims only, or dense dims only, centred on
    each slice's mean (the reducer protocol's :class:`_kernels.reducer.Var`, moments of float32 in
    float64,
    as torch)::

        var[s] = (sum_i (x_i - mean[s])^2 + n_fill[s] * (f - mean[s])^2) / max(N - correction, 0)

    with ``N`` the elements per output slice (the stored ones, for an indefinite fill); over both
    kinds of dims at once, shifted sums (:func:`_shifted_var`)."""
    A = args[0]
    if A.dim() == 0:
        return _scalar(func, args, kwargs)
    probe = {
        **kwargs,
        "correction": 0,
    }  # (torch's errors; on one element a correction would warn, see below)
    check_dtype(func, A, *args[1:], **probe)  # (var of integers raises)
    dims, keep = _dims_arg(args, kwargs, 1), bool(kwargs.get("keepdim", False))
    reduction_meta(
        func, A, dims, keep, *args[1:], **{k: v for k, v in probe.items() if k != "keepdim"}
    )  # errors
    dims = sorted({d % A.dim() for d in dims}) if dims else list(range(A.dim()))
    shape = [1 if d in dims else A.shape[d] for d in range(A.dim()) if keep or d not in dims]
    meta = torch.empty((), dtype=A.dtype.to_real(), device="meta").expand(shape)
    c = _correction(args, kwargs)
    n = _index.numel([A.shape[d] for d in dims])
    if not A._indefinite and n - c <= 0 and A.numel():
        warnings.warn(
            f"{func._schema.name.split('::')[1]}(): degrees of freedom is <= 0. Correction "
            "should be strictly less than the reduction factor (input numel divided by output "
            "numel)."
        )
    sd = A.dim() - A.dense_dim()
    # centred on each slice's mean (two passes)
    if all(d < sd for d in dims) or all(d >= sd for d in dims):
        var = reduce_dims(A, "var", dims, keep, meta, c)
    else:
        var = _shifted_var(A, dims, keep, c)
    out = var if func in (aten.var.correction, aten.var_mean.correction) else torch.sqrt(var)
    if func in (aten.var_mean.correction, aten.std_mean.correction):
        return out, welford_mean(A, A.mean(dims, keepdim=keep), dims, keep)
    return out


def welford_mean(A, mean, dims, keepdim):
    """The mean of ``var_mean``/``std_mean`` as dense torch gives it.  Its Welford pass runs over
    each slice in index order and its update ``m += (x - m) / n`` gives NaN (``inf - inf``) once a
    non-finite element has been met, but at the last element: the mean is ``mean``'s +-inf where the
    slice's one non-finite element is its last, NaN where the slice holds any other non-finite
    element (``mean`` gives +-inf there).

    >>> import sparsefill
    >>> A = sparsefill.sparse_coo_tensor([[0]], [1.], (3,), fill_value=float("inf"))
    >>> torch.var_mean(A)[1], torch.var_mean(A.to_dense())[1]
    (tensor(nan), tensor(nan))
    """
    if not A.is_floating_point() or A.numel() == 0:
        return mean
    bad = torch.isinf(A)  # (a NaN makes both means NaN: only infinities tell them apart)
    # (the common case: mean's own result and gradient)
    if not traced(A._vals) and not bool(bad.any()):
        return mean
    count, last = bad.sum(dims, keepdim=keepdim), bad
    for d in dims:
        last = last.narrow(d, A.shape[d] - 1, 1)
    last = last.sum(dims, keepdim=keepdim) > 0
    nan_at = (count >= 2) | ((count == 1) & ~last)
    return torch.where(
        nan_at, torch.full((), float("nan"), dtype=mean.dtype, device=mean.device), mean
    )


def _shifted_var(A: SparseTensor, dims, keep: bool, c):
    """var over sparse and dense dims at once: shifted sums in the accumulator dtype, shifted by the
    fill so
    that unspecified elements add nothing::

        var = (sum (x - f)^2 - |sum (x - f)|^2 / N) / max(N - correction, 0)"""
    dtype = A.dtype
    # (the half types too: no cancellation in float32)
    wide = accumulator_dtype(accumulator_dtype(dtype))
    A = A if wide == dtype else A.to(wide)
    B = A if A._indefinite else A - _shift(A, dims)
    sq = (B * B.conj()).real if B.is_complex() else B * B
    s1, s2 = B.sum(dims, keepdim=keep), sq.sum(dims, keepdim=keep)
    n = (
        torch.ones_like(sq).sum(dims, keepdim=keep)
        if A._indefinite
        else _index.numel([A.shape[d] for d in dims])
    )
    ss = s2 - ((s1 * s1.conj()).real if s1.is_complex() else s1 * s1) / n
    var = ss / ((n - c).clamp_min(0) if isinstance(n, torch.Tensor) else max(n - c, 0))
    return var if wide == dtype else var.to(dtype)


def _shift(A: SparseTensor, dims):
    """The fill, averaged over the reduced dense dims (a shift must be constant along them), 0 where
    not finite."""
    # (var is shift-invariant: no gradient flows through the shift)
    f = A._fill.expand(A._dense_shape)
    f = torch.where(torch.isfinite(f), f, torch.zeros((), dtype=f.dtype, device=f.device))
    sd = A.dim() - A.dense_dim()
    dn = [d - sd for d in dims if d >= sd]
    return f.mean(dn, keepdim=True) if dn and f.dim() else f
