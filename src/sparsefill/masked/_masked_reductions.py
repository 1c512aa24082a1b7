"""Masked reductions: ``sum prod amax amin argmax argmin mean median norm var std logsumexp``.

Each is ``torch.masked.<op>`` with the same signature.  On a strided input it *is*
``torch.masked.<op>`` (a sparse mask is read densely).  On a sparse input (torch native COO/CSR
or a SparseTensor of any fill) nothing is densified: with ``P`` the union of the input's pattern
and the mask's masked-in pattern, each output slice reduces its ``k`` masked-in stored elements
and ``n`` masked-in unspecified elements (all equal to the fill) in closed form::

    out[slice] = op(input[p] for p in slice if mask[p])   (= torch.masked.<op> on the dense tensors)

The result has the input's layout (COO when fewer than 2 sparse dims remain; a strided tensor
when none remain): its specified elements are the slices that meet ``P``, its fill is the value
of a slice that does not.  Fully masked-out slices get torch.masked's value: sum 0, prod 1,
amax -inf (integer min), amin +inf (integer max), argmax/argmin 0, mean/median/var/std NaN,
logsumexp -inf, norm 0 (+inf for ``ord=-inf``).

>>> import torch, sparsefill
>>> x = torch.tensor([[-3., -2., -1.], [0., 1., 2.]])
>>> mask = torch.tensor([[True, False, True], [False, False, False]])
>>> sparsefill.masked.sum(x.to_sparse(), 1, mask=mask).to_dense()
tensor([-4.,  0.])
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import torch

from sparsefill._kernels import index as _index
from sparsefill._kernels.reducer import (
    REDUCERS,
    Norm,
    Var,
    first_gap,
    identity_of,
    segment_arg,
    segment_counts,
    segment_median,
)
from sparsefill.masked import _slices
from sparsefill.masked._apply import Result, check_dtype_as_torch_masked, dense_mask, run
from sparsefill.masked._canon import as_sparse, is_sparse

__all__ = [
    "sum",
    "prod",
    "amax",
    "amin",
    "argmax",
    "argmin",
    "mean",
    "median",
    "norm",
    "var",
    "std",
    "logsumexp",
]

_builtin_sum = sum
_INT_PROMOTE = {torch.uint8, torch.bool, torch.int8, torch.int16, torch.int32}


def _finish(sl, vals, fill, keepdim, layout):
    """A :class:`Result` from per-segment values ``(nseg,)`` and the untouched slice's ``(Pk,)``."""
    sshape, dshape = sl.out_shape(keepdim)
    vals = vals.reshape((sl.S_out,) + dshape)
    fill = fill.reshape(dshape)
    if not sshape:
        return Result(dense=vals[0] if sl.S_out else fill)
    idx = sl.out_indices(keepdim)
    if sl.unsorted:  # slices appended by a strided mask's counts
        order = torch.argsort(_index.linearize(idx, sshape[: idx.shape[0]]))
        idx, vals = idx[:, order], vals[order]
    return Result(idx=idx, vals=vals, fill=fill, shape=sshape + dshape, layout=layout)


def _check_nonempty(name, A, dims):
    """As torch: a reduction with no identity (amax, argmax, median...) refuses a 0-size reduced
    dim."""
    for d in dims or range(A.dim()):
        if A.shape[d] == 0:
            raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")


def _reduction(
    input,
    mask,
    dim,
    keepdim,
    kernel,
    dense_ref,
    cast=None,
    post=None,
    name=None,
    zero_absorbs=False,
    counts=True,
):
    """Run ``kernel(values, seg, nseg, fill=F, n_fill=n, lengths=)`` (a reducer of
    ``sparsefill._kernels.reducer`` over fill tables) over the slices of ``dim``; ``cast`` first,
    ``post`` after. ``name``: a reduction with no identity, refusing 0-size reduced dims;
    ``zero_absorbs``: masked-in zeros do not change the result (see :func:`._canon.combine`)."""
    A = as_sparse(input)
    dims = _slices.canonical_dims(dim, A.dim())
    if name is not None:
        _check_nonempty(name, A, dims)
    if getattr(dense_ref, "probe", None) is not None:
        check_dtype_as_torch_masked(dense_ref.probe, input, mask)

    def compute(X):
        sl = _slices.Slices(X, dims)
        u, f = X.u, X.fill
        if cast is not None:
            u, f = u.to(cast), f.to(cast)
        v, seg, lengths = sl.masked_in(u)
        (F, n), (F0, n0) = sl.fill_classes(f)
        if getattr(kernel, "wants_size", False):  # (the slice size: the negative-order norm)
            out = kernel(v, seg, sl.nseg, fill=F, n_fill=n, lengths=lengths, size=sl.N_r * sl.Pr)
            out0 = kernel(v[:0], seg[:0], sl.Pk, fill=F0, n_fill=n0, size=sl.N_r * sl.Pr)
        else:
            out, out0 = _slices.reduce(kernel, sl, v, seg, F, n, F0, n0, lengths)
        if post is not None:
            out, out0 = post(out), post(out0)
        return _finish(sl, out, out0, bool(keepdim), A._sf_layout)

    return run(A, mask, compute, dense_ref, zero_absorbs, counts)


def _sum_dtype(x, dtype):
    if dtype is not None:
        return dtype
    return torch.int64 if x.dtype in _INT_PROMOTE else x.dtype


class _Reduction(Protocol):
    """The signature that ``sum prod amax amin argmax argmin mean logsumexp`` share with
    ``torch.masked``."""

    def __call__(
        self,
        input: torch.Tensor,
        dim: int | list[int] | tuple[int, ...] | None = None,
        *,
        keepdim: bool = False,
        dtype: torch.dtype | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor: ...


def _public(name: str, sparse: Callable[..., torch.Tensor], doc: str) -> _Reduction:
    """``torch.masked.<name>`` on a strided input, else ``sparse(input, dim, keepdim, dtype,
    mask)``, under the public name ``name``."""

    def op(
        input: torch.Tensor,
        dim: int | list[int] | tuple[int, ...] | None = None,
        *,
        keepdim: bool = False,
        dtype: torch.dtype | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if not is_sparse(input):
            return getattr(torch.masked, name)(
                input, dim, keepdim=keepdim, dtype=dtype, mask=dense_mask(mask, input)
            )
        return sparse(input, dim, keepdim, dtype, mask)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = doc
    return op


def _mean_options(input, dtype):
    dt = dtype or input.dtype
    if not (dt.is_floating_point or dt.is_complex):
        raise ValueError(
            f"mean(): Could not infer output dtype. {'Optional' if dtype else 'Input'} dtype "
            f"must be either a floating point or complex dtype. Got: {dt}"
        )
    return dict(cast=dt)


def _logsumexp_options(input, dtype):
    dt = dtype or input.dtype
    cdt = (
        input.dtype
        if input.dtype.is_floating_point or input.dtype.is_complex
        else torch.get_default_dtype()
    )
    return dict(cast=cdt, post=lambda t: t.to(dt))


def _extreme_options(name):
    """amax, amin: no identity (0-size reduced dims refused); the result in ``dtype``."""

    def options(input, dtype):
        dt = dtype or input.dtype
        return dict(post=lambda t: t.to(dt), name=name)

    return options


# name: (the options of :func:`_reduction` for ``(input, dtype)``, the docstring); the reducer is
# ``REDUCERS[name]``
_TABLE: dict[str, tuple[Callable[..., dict], str]] = {
    "sum": (
        lambda input, dtype: dict(cast=_sum_dtype(input, dtype), zero_absorbs=True),
        "Masked sum: ``torch.sum(torch.where(mask, input, 0), dim)``; fully masked-out slices "
        "give 0.",
    ),
    "prod": (
        lambda input, dtype: dict(cast=_sum_dtype(input, dtype)),
        "Masked product: ``torch.prod(torch.where(mask, input, 1), dim)``; fully masked-out "
        "slices give 1.",
    ),
    "amax": (
        _extreme_options("amax"),
        "Masked amax: ``torch.amax(input.masked_fill(~mask, -inf), dim)``; fully masked-out "
        "slices give -inf (the integer min for integer dtypes).",
    ),
    "amin": (
        _extreme_options("amin"),
        "Masked amin: ``torch.amin(input.masked_fill(~mask, +inf), dim)``; fully masked-out "
        "slices give +inf (the integer max for integer dtypes).",
    ),
    "mean": (
        _mean_options,
        "Masked mean: ``sum(input * mask, dim) / sum(mask, dim)``; fully masked-out slices give "
        "NaN.",
    ),
    "logsumexp": (
        _logsumexp_options,
        "Masked logsumexp: ``torch.logsumexp(input.masked_fill(~mask, -inf), dim)``; fully "
        "masked-out slices give -inf.",
    ),
}


def _table_op(name: str) -> _Reduction:
    """The public reduction ``name`` of :data:`_TABLE`."""
    options, doc = _TABLE[name]

    def sparse(input, dim, keepdim, dtype, mask):
        opts = options(input, dtype)
        ref = _ref(name, dim, keepdim=keepdim, dtype=dtype, mask=mask)
        return _reduction(input, mask, dim, keepdim, REDUCERS[name], ref, **opts)

    return _public(name, sparse, doc)


sum = _table_op("sum")
prod = _table_op("prod")
amax = _table_op("amax")
amin = _table_op("amin")
mean = _table_op("mean")
logsumexp = _table_op("logsumexp")


def norm(
    input: torch.Tensor,
    ord: float = 2.0,
    dim: int | list[int] | tuple[int, ...] | None = None,
    *,
    keepdim: bool = False,
    dtype: torch.dtype | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Masked vector norm: ``torch.linalg.vector_norm(torch.where(mask, input, 0), ord, dim)``, i.e.
    ``(sum_{masked-in} |x|^ord)^(1/ord)``; fully masked-out slices give 0 (+inf for ``ord=-inf``,
    whose masked-out elements read +inf).  For a negative finite ``ord`` the masked-out elements are
    zeros (as torch.masked): a slice with a masked-out element has norm 0.

    >>> import torch, sparsefill
    >>> x = torch.tensor([[-3., -2., -1.], [0., 1., 2.]]).to_sparse()
    >>> m = torch.tensor([[True, False, True], [True, True, True]])
    >>> sparsefill.masked.norm(x, -1.0, 1, mask=m).to_dense()
    tensor([0., 0.])
    """
    if not is_sparse(input):
        return torch.masked.norm(
            input, ord, dim, keepdim=keepdim, dtype=dtype, mask=dense_mask(mask, input)
        )
    p = 2.0 if ord is None else float(ord)
    dt = dtype or input.dtype
    if not (dt.is_floating_point or dt.is_complex):
        raise RuntimeError(
            f"linalg.vector_norm: Expected a floating point or complex tensor as input. Got {dt}"
        )
    out_dt = dt.to_real() if dt.is_complex else dt
    # no identity: torch.linalg.vector_norm raises
    if (p < 0 or p == math.inf) and input.numel() == 0:
        for d in _slices.canonical_dims(dim, input.dim()):
            if input.shape[d] == 0:
                raise RuntimeError(
                    f"masked norm: cannot compute the {ord} norm over dim {d} of size 0 (input "
                    f"shape {tuple(input.shape)}): the operation has no identity (as "
                    "torch.masked.norm)"
                )
    return _reduction(
        input,
        mask,
        dim,
        keepdim,
        norm_kernel(p),
        _ref("norm", ord, dim, keepdim=keepdim, dtype=dtype, mask=mask),
        cast=dt,
        post=lambda t: t.to(out_dt),
        zero_absorbs=p >= 0,
    )


def norm_kernel(p):
    """The ``p``-norm over fill tables; for a negative finite ``p`` the masked-out elements of a
    slice of ``size`` elements join the table as one more class of zeros (``|0|^p = inf``: the norm
    is 0)."""
    r = Norm(p)
    if not (p < 0 and not math.isinf(p)):
        return r

    def kernel(v, seg, nseg, *, fill, n_fill, lengths=None, size):
        out_n = size - segment_counts(seg, nseg, lengths) - n_fill.sum(1)
        F = torch.cat([fill, fill.new_zeros((fill.shape[0], 1))], 1)
        return r(
            v, seg, nseg, fill=F, n_fill=torch.cat([n_fill, out_n[:, None]], 1), lengths=lengths
        )

    kernel.wants_size = True
    return kernel


def _std_var(name, input, dim, unbiased, correction, keepdim, dtype, mask, take_sqrt):
    if not is_sparse(input):
        return getattr(torch.masked, name)(
            input,
            dim,
            unbiased,
            correction=correction,
            keepdim=keepdim,
            dtype=dtype,
            mask=dense_mask(mask, input),
        )
    if unbiased is not None and correction is not None:
        raise ValueError("Only one of unbiased and correction may be given")
    corr = (
        1.0
        if unbiased is None and correction is None
        else ((1.0 if unbiased else 0.0) if unbiased is not None else float(correction))
    )
    dt = dtype or (
        input.dtype if input.dtype.is_floating_point or input.dtype.is_complex else torch.float32
    )
    cdt = dt if dt.is_floating_point or dt.is_complex else torch.float32

    r = Var(corr)

    def kernel(*a, **k):
        out = r(*a, **k)
        return torch.sqrt(out) if take_sqrt else out

    return _reduction(
        input,
        mask,
        dim,
        keepdim,
        kernel,
        _ref(name, dim, unbiased, correction=correction, keepdim=keepdim, dtype=dtype, mask=mask),
        cast=cdt,
        post=lambda t: t.to(dt),
    )


def var(
    input: torch.Tensor,
    dim: int | list[int] | tuple[int, ...] | None = None,
    unbiased: bool | None = None,
    *,
    correction: float | None = None,
    keepdim: bool = False,
    dtype: torch.dtype | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Masked variance ``sum((x - mean)^2) / max(count - correction, 0)`` over the masked-in
    elements; fully masked-out slices give NaN."""
    return _std_var("var", input, dim, unbiased, correction, keepdim, dtype, mask, False)


def std(
    input: torch.Tensor,
    dim: int | list[int] | tuple[int, ...] | None = None,
    unbiased: bool | None = None,
    *,
    correction: float | None = None,
    keepdim: bool = False,
    dtype: torch.dtype | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Masked standard deviation: ``sqrt(var(...))``; fully masked-out slices give NaN."""
    return _std_var("std", input, dim, unbiased, correction, keepdim, dtype, mask, True)


def median(
    input: torch.Tensor,
    dim: int = -1,
    *,
    keepdim: bool = False,
    dtype: torch.dtype | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Masked median (``torch.nanmedian`` of the masked-in elements: the lower median, NaN values
    ignored); fully masked-out slices give NaN (integer inputs raise ValueError then, as
    torch.masked)."""
    if not is_sparse(input):
        return torch.masked.median(
            input, dim, keepdim=keepdim, dtype=dtype, mask=dense_mask(mask, input)
        )
    A = as_sparse(input)
    is_float = A.dtype.is_floating_point
    dims = _slices.canonical_dims(dim, A.dim())[:1] if A.dim() else ()
    out = _reduction(
        A,
        mask,
        dims,
        keepdim,
        lambda v, seg, nseg, lengths=None, **k: segment_median(v, seg, nseg, **k),
        _ref("median", dim, keepdim=keepdim, dtype=dtype, mask=mask),
        cast=None if is_float else torch.float32,
        name="median",
    )
    if is_float:
        return out
    from sparsefill._tensor.tensor import SparseTensor

    vals = [out._vals] if isinstance(out, SparseTensor) else [out]
    if isinstance(out, SparseTensor) and not _every_position_stored(out):
        vals.append(out._fill)  # some position reads the fill
    if _builtin_sum(int(torch.isnan(t).sum()) for t in vals):
        raise ValueError(
            "masked median expects no fully masked out rows if dtype is not floating point"
        )
    return out.to(dtype or A.dtype)


def _every_position_stored(out) -> bool:
    """No position of the (coalesced) sparse result reads its fill: stored elements == positions."""
    stored = out._vals.shape[0] if out._sf_layout is torch.sparse_coo else out._col.numel()
    return bool(out._coalesced) and stored == _index.numel(out._sparse_shape)


def _argext(name: str, mode: str) -> _Reduction:
    def sparse(input, dim, keepdim, dtype, mask):
        A = as_sparse(input)
        dims = _slices.canonical_dims(dim, A.dim())
        _check_nonempty(name, A, dims if dim is not None else ())
        ref = _ref(name, dim, keepdim=keepdim, dtype=dtype, mask=mask)
        check_dtype_as_torch_masked(ref.probe, input, mask)
        dt = dtype or A.dtype

        def compute(X):
            sl = _slices.Slices(X, dims)
            ident = identity_of(mode, X.u.dtype)
            eff = torch.where(X.m, X.u, torch.full((), ident, dtype=X.u.dtype, device=X.u.device))
            feff = X.fill if X.mfill else torch.full_like(X.fill, ident)
            v, seg = sl.scalars(eff).reshape(-1), sl.seg3.reshape(-1)
            pr = torch.arange(sl.Pr, device=v.device)
            key_r = _index.linearize(X.indices()[sl.red_s], [X.S[d] for d in sl.red_s])
            pos = (key_r[:, None, None] * sl.Pr + pr).expand(-1, sl.Pk, sl.Pr).reshape(-1)
            (F, n), (F0, n0) = sl.fill_classes(feff, counts=True)
            mex = first_gap(sl.seg_row, key_r, sl.S_out, presorted=True)
            fpos = (
                (mex[:, None, None] * sl.Pr + pr)
                .expand(sl.S_out, sl.Pk, sl.Pr)
                .reshape(sl.nseg, sl.Pr)
            )
            out = _arg(v, seg, sl.nseg, pos, F, n, fpos, mode)
            out0 = _arg(v[:0], seg[:0], sl.Pk, pos[:0], F0, n0, pr.expand(sl.Pk, sl.Pr), mode)
            return _finish(sl, out.to(dt), out0.to(dt), bool(keepdim), A._sf_layout)

        # an index: not differentiable (as torch.masked.argmax, whose result has no grad_fn)
        with torch.no_grad():
            return run(A, mask, compute, ref)

    return _public(
        name,
        sparse,
        f"Masked {name}: ``torch.{name}(input.masked_fill(~mask, "
        f"{'-inf' if mode == 'amax' else '+inf'}), dim)`` (first index on ties, NaN is the "
        "extreme; the result has the input's dtype, as torch.masked); fully masked-out slices "
        "give 0.",
    )


def _arg(v, seg, nseg, pos, F, n, fpos, mode):
    """Position of the first extreme of every segment over a fill table (class ``c`` first at
    ``fpos[s, c]``), NaN counting as the extreme (torch's argmax/argmin rule)."""
    with torch.no_grad():
        best = REDUCERS[mode](v, seg, nseg, fill=F, n_fill=n)
    if v.is_floating_point():
        has_nan = torch.zeros(nseg, dtype=torch.bool, device=v.device).index_put(
            (seg,), torch.isnan(v), accumulate=True
        ) | (torch.isnan(F) & (n > 0)).any(1)
        best = torch.where(
            has_nan, torch.full((), math.nan, dtype=best.dtype, device=best.device), best
        )
    return segment_arg(v, seg, nseg, pos, best, fill=F, fill_position=torch.where(n > 0, fpos, -1))


argmax = _argext("argmax", "amax")
argmin = _argext("argmin", "amin")


def _ref(name, *args, mask=None, **kwargs):
    """The dense reference (used for gradients when unspecified elements are masked in)."""

    def f(x):
        m = None if mask is None else dense_mask(mask, x)
        return getattr(torch.masked, name)(x, *args, mask=m, **kwargs)

    # (check_dtype_as_torch_masked)
    f.probe = lambda x, m: getattr(torch.masked, name)(x, *args, mask=m, **kwargs)
    return f
