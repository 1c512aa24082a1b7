"""Masked normalizations along one dim: ``softmax log_softmax softmin normalize cumsum cumprod``.

Same signatures and results as ``torch.masked.<op>`` (the drop-in promise), at EVERY position::

    densify(masked.op(input, dim, mask=mask))
        == torch.masked.op(dense(input), dim, mask=dense(mask))

On a sparse input the statistics of each slice along ``dim`` (logsumexp, norm) come from the
reducers of ``sparsefill._kernels.reducer`` (fill tables over the segments of ``_slices``)
on the union pattern ``P`` of input and mask (``_canon``), prefix sums from :func:`_segmented_scan`;
e.g. for
softmax every masked-in element ``p`` of ``P`` gets::

    out[p] = exp(x[p] - lse_slice),    lse_slice = log(sum_{q in slice, mask[q]} exp(x[q]))

A masked-out element reads torch.masked's value: for softmax/softmin/log_softmax ``c`` (0, 0, -inf)
when its slice holds a masked-in element and ``e`` = NaN when the slice is fully masked out, and NaN
where the slice's normalizer is NaN or -inf (``exp(-inf - lse)``); normalize ``0 / max(norm, eps)``
(0 unless that norm is NaN or the divisor 0); cumsum/cumprod the running value (the scan of
``where(mask, input, 0 / 1)``).  The result's fill is chosen adaptively (:func:`_extend`): with the
unspecified elements counted in fully masked-out slices (value ``e``) and in partly masked-in slices
(value ``c``), the fill is the value of the larger group and the smaller group is stored explicitly
(``sparsefill._tensor.policy.check_specify``: a DensifyWarning past 65536 of them; cumsum/cumprod
take the identity as fill and store the unspecified elements after the first masked-in one of their
slice). In the pattern-as-mask use with no empty slice nothing is added.  An input with indefinite
fill keeps its pattern and indefinite fill (its unspecified elements have no value).

When unspecified elements are masked in along a sparse ``dim`` (``mask=None`` on a defined fill)
and the op does not map them to one value (softmax of a finite fill, any cumsum), the result is
dense by nature: it is computed on the dense equivalent (no DensifyWarning; the densify policy's
byte limit applies) and returned in the input's layout.

>>> import torch, sparsefill
>>> x = torch.tensor([[-3., -2., -1.], [0., 1., 2.]])
>>> m = torch.tensor([[True, False, True], [False, False, False]])
>>> sparsefill.masked.softmax(x.to_sparse(), 1, mask=m).to_dense()
tensor([[0.1192, 0.0000, 0.8808],
        [   nan,    nan,    nan]])
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from sparsefill._kernels import index as _index
from sparsefill._kernels.trace import known_true, traced
from sparsefill._tensor.policy import check_specify
from sparsefill._kernels.reducer import REDUCERS, gather_seg
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.masked import _slices
from sparsefill.ops.reductions import edge_softmax as _segsoftmax
from sparsefill.masked._apply import (
    Result,
    check_dtype_as_torch_masked,
    dense_fallback,
    dense_mask,
    run,
)
from sparsefill.masked._canon import Masked, _same_indices, as_sparse, is_sparse
from sparsefill.masked._masked_reductions import norm_kernel

__all__ = ["softmax", "log_softmax", "softmin", "normalize", "cumsum", "cumprod"]


class _DenseByNature(Exception):
    pass


def _same(a, b):
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


def _has_in(sl, seg, n):
    """Per segment: holds a masked-in element (stored ``seg`` or ``n`` masked-in fill copies)."""
    has = torch.zeros(sl.nseg, dtype=torch.bool, device=seg.device).index_fill_(0, seg, True)
    return has | (n > 0).any(1) if n.dim() == 2 else has  # (n: (nseg, Pr), or (0,) for none)


def _unspecified(X: Masked, sl, groups, start, untouched: bool) -> torch.Tensor:
    """Sparse indices of the unspecified elements ``q >= start[j]`` along the reduced sparse dim of
    the touched slices ``sl.out_idx[:, groups[j]]``, plus every element of the untouched slices if
    ``untouched``. O(output + nse): only positions that are returned or stored are enumerated."""
    S, d = X.S, sl.red_s[0]
    N, keep = S[d], [i for i in range(len(S)) if i != d]
    kshape = [S[i] for i in keep]
    gk, start = sl.out_idx[:, groups], start.to(torch.int64)
    if untouched:
        allk = torch.arange(_index.numel(kshape), device=gk.device)
        rest = allk[~torch.isin(allk, _index.linearize(sl.out_idx, kshape))]
        gk = torch.cat([gk, _index.unravel(rest, kshape)], 1)
        start = torch.cat([start, start.new_zeros(rest.numel())])
    lens = (N - start).clamp_min(0)
    total = int(lens.sum())
    if total == 0:
        return gk.new_zeros((len(S), 0))
    rep = torch.repeat_interleave(
        torch.arange(lens.numel(), device=gk.device), lens, output_size=total
    )
    q = torch.arange(total, device=gk.device) - (torch.cumsum(lens, 0) - lens)[rep] + start[rep]
    idx = gk.new_empty((len(S), total))
    idx[keep] = gk[:, rep]
    idx[d] = q
    return idx[:, ~torch.isin(_index.linearize(idx, S), _index.linearize(X.indices(), S))]


def _extend(name, X: Masked, sl, c_out, e_out, scan):
    """``(X', fill)``: ``X`` with the masked-out unspecified elements that do not read ``fill``
    joined to its pattern (``m`` False, ``u`` the input's fill), for a reduction along a sparse dim
    with ``X.mfill`` False.

    Softmax-like (``scan`` None): an unspecified element reads ``e_out`` when its slice is fully
    masked out, ``c_out`` otherwise; ``fill`` is the value of the larger group.  Scans: ``fill`` =
    the identity ``c_out``; an unspecified element after the first masked-in one of its slice reads
    the running value.
    """
    S, d = X.S, sl.red_s[0]
    N, G = S[d], _index.numel([s for i, s in enumerate(S) if i != d])
    ms = sl.scalars(X.m)
    # the pattern as mask, no empty slice: nothing to add
    if scan is None and sl.every_in and G == sl.S_out:
        return X, c_out
    has = _has_in(sl, sl.seg3[ms], ms.new_zeros((0,))).reshape(sl.S_out, sl.Pk)
    any_in = has.any(1)
    if scan is not None:
        rows_in = X.m.reshape(X.m.shape[0], _index.numel(X.D)).any(1)
        first = torch.full((sl.S_out,), N, dtype=torch.int64, device=has.device).scatter_reduce(
            0, sl.seg_row[rows_in], X.indices()[d][rows_in], "amin"
        )
        groups, untouched, fill = any_in.nonzero().squeeze(1), False, c_out
        start = first[groups]
    else:
        if _same(torch.tensor(c_out), torch.tensor(e_out)):
            return X, c_out
        all_in = has.all(1)
        empty = (G - sl.S_out) * N + int(sl.n_u[~any_in].sum())
        partial = int(sl.n_u[all_in].sum())
        if empty > partial:
            groups, untouched, fill = any_in.nonzero().squeeze(1), False, e_out
        else:
            groups, untouched, fill = (~all_in).nonzero().squeeze(1), G > sl.S_out, c_out
        start = torch.zeros(groups.numel(), dtype=torch.int64, device=has.device)
    return _store(name, X, _unspecified(X, sl, groups, start, untouched), fill), fill


def _store(name, X: Masked, new, fill) -> Masked:
    """``X`` with the masked-out unspecified elements at sparse indices ``new`` joined to its
    pattern."""
    S, t = X.S, new.shape[1]
    if t == 0:
        return X
    check_specify(
        f"masked {name}: {t} masked-out unspecified elements that do not read the result's fill "
        f"({fill}) are stored",
        t,
        _index.numel(X.D) * X.u.element_size() + 8 * len(S),
    )
    idx = torch.cat([X.indices(), new], 1)
    order = torch.argsort(_index.linearize(idx, S))
    D = X.D
    u = torch.cat([X.u, X.fill.expand((t,) + D)])[order]
    m = torch.cat([X.m, X.m.new_zeros((t,) + D)])[order]
    return Masked(X.A, idx[:, order], u, m, X.fill, False, False)


def _same_each(a, b):
    return (a == b) | (torch.isnan(a) & torch.isnan(b))


def _normalization(
    name, input, mask, dim, per_element, c_out, e_out, cast, dense_op, zero_absorbs=False, scan=None
):
    """``per_element(sl, v, seg, F, n, F0, n0) -> (out values (nv,), fill outputs (nseg, Pr), (Pk,
    Pr), masked-out value (nseg,))`` for the masked-in elements (``F0 = n0 = None``: the ``(Pk,
    Pr)`` outputs of the unspecified rows are not needed, return None there); masked-out ones read
    that value (usually ``c_out``; e.g. NaN where the slice's normalizer is NaN) in a slice with a
    masked-in element, ``e_out`` in a fully masked-out slice.  A slice whose masked-out value is
    neither ``c_out`` nor the result's fill gets its unspecified elements stored (rare: a NaN
    normalizer) and the slice is computed again. ``scan`` ("sum"/"prod"): every element reads the
    inclusive scan of ``where(mask, input, c_out)``."""
    check_dtype_as_torch_masked(dense_op, input, mask)
    A = as_sparse(input)
    dims = _slices.canonical_dims(dim, A.dim())[:1] if A.dim() else ()

    def compute(X, check=True):
        sl = _slices.Slices(X, dims)
        fill_out = c_out
        if not X.mfill and not X.A._indefinite:
            if sl.red_s:
                X, fill_out = _extend(name, X, sl, c_out, e_out, scan)
                sl = _slices.Slices(X, dims) if X is not sl.X else sl
            # unspecified rows: fully masked-out slices
            elif scan is None and _index.numel(X.S) > X.u.shape[0]:
                fill_out = e_out
        u, f = (X.u, X.fill) if cast is None else (X.u.to(cast), X.fill.to(cast))
        ms = sl.scalars(X.m)
        (F, n), (F0, n0) = sl.fill_classes(f)
        if scan is not None:
            ident = torch.full((), c_out, dtype=u.dtype, device=u.device)
            eff = torch.where(ms, sl.scalars(u), ident)
            vals = sl.unscalars(
                _segmented_scan(
                    eff.reshape(-1), sl.seg3.reshape(-1), sl.nseg, scan, sl.N_r * sl.Pr
                ).reshape(ms.shape)
            )
            g0 = torch.where(n0 > 0, F0, ident)
            g0 = (
                torch.cumsum(g0, 1, dtype=g0.dtype)
                if scan == "sum"
                else torch.cumprod(g0, 1, dtype=g0.dtype)
            )
            g = torch.where(n > 0, F, ident)
        else:
            nz = None
            # (one nonzero for the gather and the scatter: one unbacked size)
            if traced(u) and not X.all_in:
                nz = ms.nonzero(as_tuple=True)
                v, seg, lengths = sl.scalars(u)[nz], sl.seg3[nz], None
            else:
                v, seg, lengths = sl.masked_in(u)
            # (the fill classes of the unspecified rows matter only for a masked-in fill)
            out_v, g, g0, mo = per_element(
                sl, v, seg, F, n, *((F0, n0) if X.mfill else (None, None)), lengths
            )
            has = _has_in(sl, seg, n)
            if check and sl.red_s and not X.mfill and not X.A._indefinite:
                c, fo = (
                    torch.full((), x, dtype=mo.dtype, device=mo.device) for x in (c_out, fill_out)
                )
                # unspecified elements would read fo
                odd = has & ~_same_each(mo, c) & ~_same_each(mo, fo)
                if bool(odd.any()):
                    rows = odd.reshape(sl.S_out, sl.Pk).any(1).nonzero().squeeze(1)
                    new = _unspecified(X, sl, rows, rows.new_zeros(rows.numel()), False)
                    if new.shape[1]:
                        return compute(_store(name, X, new, fill_out), check=False)
            # the usual case (mask = the pattern)
            if X.all_in if traced(v) else v.numel() == ms.numel():
                vals = sl.unscalars(out_v.reshape(ms.shape))
            else:
                e = torch.full((), e_out, dtype=out_v.dtype, device=out_v.device)
                base = torch.where(has, mo.to(out_v.dtype), e)[sl.seg3]
                vals = sl.unscalars(
                    base.index_put(ms.nonzero(as_tuple=True) if nz is None else nz, out_v)
                )
        c = torch.full((), fill_out, dtype=vals.dtype, device=vals.device)
        classes = None
        if X.A._indefinite:
            fill = vals.new_empty(0)
        elif sl.red_s and X.mfill and scan is not None:  # running values over masked-in fills
            raise _DenseByNature
        elif sl.red_s and X.mfill:  # fill elements along a sparse dim: one value per slice
            if not _index.numel([s for i, s in enumerate(X.S) if i not in sl.red_s]) > sl.S_out:
                n0 = torch.zeros_like(n0)  # no slice without a stored element: g0 is read by none
            if not (_same(g[n > 0], c) and _same(g0[n0 > 0], c)):
                raise _DenseByNature
            fill, classes = (
                c,
                (sl, g, n, g0, n0),
            )  # (the backward reads g, g0: the unspecified outputs' values)
        elif X.mfill:  # a dense dim: every unspecified row is the same slice
            fill = sl.unscalars(g0[None])[0]
        else:
            fill = c
        like = X.A if X.same_pattern and X.A._coalesced else None
        return Result(
            idx=X.indices() if like is None else None,
            vals=vals,
            fill=fill,
            shape=tuple(X.A.shape),
            layout=X.A._sf_layout,
            indefinite=X.A._indefinite,
            like=like,
            classes=classes,
        )

    ref = _dense_ref(dense_op, mask)
    if (
        not A._indefinite
        and (mask is not None or dims and dims[0] < len(A._sparse_shape))
        and traced(A)
    ):
        # (compiled: the pattern a definite fill needs is read from data)
        return dense_fallback(A, mask, dense_op)
    try:
        return run(A, mask, compute, ref, zero_absorbs)
    except _DenseByNature:
        return dense_fallback(A, mask, dense_op)


def _no_mask(A, mask) -> bool:
    """``mask`` masks out nothing of an indefinite ``A``'s pattern: None, or a sparse mask on
    ``A``'s own pattern that is True everywhere there (e.g. ``masked.pattern_mask(A)``)."""
    if mask is None:
        return True
    same = _same_indices(A, mask)
    # (traced: the general path, reading no data)
    return same is not None and known_true(same.all())


def _dense_ref(dense_op, mask):
    def f(x):
        return dense_op(x, None if mask is None else dense_mask(mask, x))

    return f


def _softmax_parts(sign, log):
    """Per segment ``lse = logsumexp`` of the masked-in elements (the shared reducer, fill tables
    included); then ``softmax = exp(x - lse)``, ``log_softmax = x - lse`` at every masked-in element
    and fill class.  A slice holding +inf is NaN (as torch's softmax)."""
    lse_reducer = REDUCERS["logsumexp"]

    def stats(v, seg, nseg, F, n, lengths=None):
        lse, e, acc = lse_reducer.parts(v, seg, nseg, fill=F, n_fill=n, lengths=lengths)
        lse = torch.where(
            torch.isposinf(lse), torch.full((), math.nan, dtype=lse.dtype, device=lse.device), lse
        )
        xf = F - lse[:, None]
        # a masked-out element: -inf - lse (NaN when lse is NaN or -inf)
        mo = -math.inf - lse.detach()
        if log:
            return v - gather_seg(lse, seg, lengths, v.shape[0]), xf, mo
        # exp(x - lse) = e / acc with e = exp(x - m): no second exp; a NaN lse (a +inf or NaN in the
        # slice) makes the whole slice NaN, as torch's softmax
        acc = torch.where(torch.isnan(lse), lse, acc)
        return e / gather_seg(acc, seg, lengths, v.shape[0]), torch.exp(xf), mo.exp()

    def per_element(sl, v, seg, F, n, F0, n0, lengths=None):
        if sign < 0:
            v, F, F0 = -v, -F, (None if F0 is None else -F0)
        ov, g, mo = stats(v, seg, sl.nseg, F, n, lengths)
        g0 = None if F0 is None else stats(v[:0], seg[:0], sl.Pk, F0, n0)[1]
        return ov, g, g0, mo

    return per_element


_SOFTMAX_DOC = """Masked {name} along ``dim``:
``torch.nn.functional.{name}(input.masked_fill(~mask, {fillv}), dim)``, i.e. for a slice ``x`` with
masked-in set ``I``::

    out[p] = {formula}

Masked-out elements read {c} in a slice with a masked-in element and NaN in a fully masked-out
slice (as torch.masked on the dense input); a sparse result takes the more frequent of the two
among its unspecified elements as fill and stores the others.  An input with indefinite fill gives
its pattern with an indefinite fill.  An integer or bool input raises as torch.masked does (its
NotImplementedError where the input is masked: a mask given or an indefinite fill);
``dtype=torch.float32`` computes in floating point.

>>> import torch, sparsefill
>>> x = torch.tensor([[-3., -2., -1.], [0., 1., 2.]]).to_sparse()
>>> m = torch.tensor([[True, False, True], [False, False, False]])
>>> sparsefill.masked.{name}(x, 1, mask=m).to_dense()
{example}
"""


def _along_dim(
    name: str, sparse: Callable[..., torch.Tensor], doc: str
) -> Callable[..., torch.Tensor]:
    """``torch.masked.<name>`` on a strided input, else ``sparse(input, dim, dtype, mask)``, under
    the public name ``name``: the signature every normalization shares with ``torch.masked``."""

    def op(
        input: torch.Tensor,
        dim: int,
        *,
        dtype: torch.dtype | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if not is_sparse(input):
            return getattr(torch.masked, name)(
                input, dim, dtype=dtype, mask=dense_mask(mask, input)
            )
        return sparse(input, dim, dtype, mask)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = doc
    return op


def _softmax_like(name, sign, log, c_out, formula, example) -> Callable[..., torch.Tensor]:
    def sparse(input, dim, dtype, mask):
        cast = dtype or (
            input.dtype if input.dtype.is_floating_point else torch.get_default_dtype()
        )
        nd = input.dim()
        if isinstance(input, SparseTensor) and nd:
            input._sync()
            d = _slices.canonical_dims(dim, nd)[0]
            # the edge softmax
            if cast == input.dtype and _segsoftmax.applies(input, d) and _no_mask(input, mask):
                return _segsoftmax.segment_softmax(input, d, sign, log)

        def dense_op(x, m):
            return getattr(torch.masked, name)(x, dim, dtype=dtype, mask=m)

        out = _normalization(
            name, input, mask, dim, _softmax_parts(sign, log), c_out, math.nan, cast, dense_op
        )
        # an integer input that has passed torch.masked's dtype check
        if cast != input.dtype and dtype is None:
            out = out.to(input.dtype)  # is empty: torch's softmax keeps its dtype
        return out

    doc = _SOFTMAX_DOC.format(
        name=name,
        fillv="+inf" if sign < 0 else "-inf",
        formula=formula,
        c="-inf" if log else "0",
        example=example,
    )
    return _along_dim(name, sparse, doc)


softmax = _softmax_like(
    "softmax",
    1.0,
    False,
    0.0,
    "exp(x[p]) / sum_{q in I} exp(x[q])   (p in I)",
    "tensor([[0.1192, 0.0000, 0.8808],\n        [   nan,    nan,    nan]])",
)
log_softmax = _softmax_like(
    "log_softmax",
    1.0,
    True,
    -math.inf,
    "x[p] - log(sum_{q in I} exp(x[q]))   (p in I)",
    "tensor([[-2.1269,    -inf, -0.1269],\n        [    nan,     nan,     nan]])",
)
softmin = _softmax_like(
    "softmin",
    -1.0,
    False,
    0.0,
    "exp(-x[p]) / sum_{q in I} exp(-x[q])   (p in I)",
    "tensor([[0.8808, 0.0000, 0.1192],\n        [   nan,    nan,    nan]])",
)


def normalize(
    input: torch.Tensor,
    ord: float,
    dim: int,
    *,
    eps: float = 1e-12,
    dtype: torch.dtype | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Masked normalize along ``dim``: for a slice ``x`` with masked-in set ``I``::

        out[p] = where(p in I, x[p], 0) / max(masked.norm(x, ord, mask=I), eps)

    (``torch.masked.normalize``).  Masked-out elements read 0, fully masked-out slices included; a
    negative finite ``ord`` counts masked-out elements as zeros (the norm is then 0 and the slice is
    divided by ``eps``, as torch.masked).  An integer or bool input raises torch.masked's
    RuntimeError (its norm takes floating-point and complex inputs only, whatever ``dtype``).

    >>> import torch, sparsefill
    >>> x = torch.tensor([[-3., -2., -1.], [0., 1., 2.]]).to_sparse()
    >>> m = torch.tensor([[True, False, True], [False, False, False]])
    >>> sparsefill.masked.normalize(x, 2.0, 1, mask=m).to_dense()
    tensor([[-0.9487,  0.0000, -0.3162],
            [ 0.0000,  0.0000,  0.0000]])
    """
    if not is_sparse(input):
        return torch.masked.normalize(
            input, ord, dim, eps=eps, dtype=dtype, mask=dense_mask(mask, input)
        )
    p = float(ord)
    cast = dtype or input.dtype

    kernel = norm_kernel(p)

    def per_element(sl, v, seg, F, n, F0, n0, lengths=None):
        size = {"size": sl.N_r * sl.Pr} if getattr(kernel, "wants_size", False) else {}
        d = kernel(v, seg, sl.nseg, fill=F, n_fill=n, lengths=lengths, **size).clamp_min(eps)
        g0 = (
            None
            if F0 is None
            else F0
            / kernel(v[:0], seg[:0], sl.Pk, fill=F0, n_fill=n0, **size).clamp_min(eps)[:, None]
        )
        return v / gather_seg(d, seg, lengths, v.shape[0]), F / d[:, None], g0, 0.0 / d.detach()

    def dense_op(x, m):
        return torch.masked.normalize(x, ord, dim, eps=eps, dtype=dtype, mask=m)

    # a fully masked-out slice: 0 / max(norm of nothing, eps), the norm of nothing being +inf for
    # ord=-inf
    den = max(math.inf if p == -math.inf else 0.0, eps) if not math.isnan(eps) else math.nan
    e_out = 0.0 / den if den != 0 and not math.isnan(den) else math.nan
    return _normalization(
        "normalize", input, mask, dim, per_element, 0.0, e_out, cast, dense_op, zero_absorbs=p >= 0
    )


_CUM_EXAMPLE = {
    "sum": "tensor([[-3., -3., -4.],\n            [ 0.,  0.,  0.]])",
    "prod": "tensor([[-3., -3.,  3.],\n            [ 1.,  1.,  1.]])",
}


def _cum(name: str, mode: str) -> Callable[..., torch.Tensor]:
    ident = 0.0 if mode == "sum" else 1.0

    def sparse(input, dim, dtype, mask):
        cast = dtype or input.dtype
        # as torch.masked.{name}: torch.{name} has no bool kernel
        if cast is torch.bool and input.numel():
            raise NotImplementedError(
                f"masked {name}: not implemented for 'Bool' (pass dtype=, as torch.{name})"
            )

        def dense_op(x, m):
            return getattr(torch.masked, name)(x, dim, dtype=dtype, mask=m)

        A = as_sparse(input)
        if cast is torch.bool or (
            A.dim()
            and _slices.canonical_dims(dim, A.dim())[0] < len(A._sparse_shape)
            and mask is None
            and not A._indefinite
        ):  # (bool: an empty input)
            return dense_fallback(A, mask, dense_op)
        return _normalization(name, input, mask, dim, None, ident, ident, cast, dense_op, scan=mode)

    sym = "+" if mode == "sum" else "*"
    i0 = int(ident)
    doc = f"""Masked {name} along ``dim``:
    ``torch.{name}(torch.where(mask, input, {i0}), dim)``, i.e.::

        out[p] = {i0} {sym} x[q_1] {sym} ... {sym} x[q_j]      (the masked-in q_i <= p of p's slice)

    at every position, masked-out ones included (the running value; {i0} before the first masked-in
    element and in fully masked-out slices).  A sparse result has fill {i0} and stores the
    unspecified elements after the first masked-in element of their slice (dense by nature along a
    sparse dim: ``check_specify``).  With ``mask=None`` along a sparse dim of a defined fill the
    result is computed densely (dense by nature).

    >>> import torch, sparsefill
    >>> x = torch.tensor([[-3., -2., -1.], [0., 1., 2.]]).to_sparse()
    >>> m = torch.tensor([[True, False, True], [False, False, False]])
    >>> sparsefill.masked.{name}(x, 1, mask=m).to_dense()
    {_CUM_EXAMPLE[mode]}
    """
    return _along_dim(name, sparse, doc)


def _segmented_scan(v, seg, nseg, mode, longest=None):
    """Inclusive cumulative sum/product of ``v`` within each segment, in the order of ``v``.

    Segments are padded into rows of a power-of-two width, one table per width class (at most ~64
    of them), so the tables hold fewer than ``2 * len(v)`` elements whatever the segment lengths.
    While traced (the classes are read from the data) :func:`_doubling_scan`, whose steps depend on
    ``longest`` (a bound of the segments' lengths from the shape) only."""
    if traced(v) and longest is not None:
        return _doubling_scan(v, seg, mode, longest)
    if v.numel() == 0:
        return v
    order = torch.argsort(seg, stable=True)
    s = seg[order]
    counts = torch.bincount(s, minlength=nseg)
    rank = torch.arange(s.numel(), device=s.device) - (torch.cumsum(counts, 0) - counts)[s]
    width_class = torch.ceil(torch.log2(counts[s].to(torch.float64))).to(torch.int64)
    vo = v[order]
    parts, where = [], []
    for c in torch.unique(width_class).tolist():
        sel = (width_class == c).nonzero().squeeze(1)
        rows, inv = torch.unique(s[sel], return_inverse=True)
        pad = v.new_full((rows.numel(), 1 << c), 0 if mode == "sum" else 1).index_put(
            (inv, rank[sel]), vo[sel]
        )
        pad = (
            torch.cumsum(pad, 1, dtype=v.dtype)
            if mode == "sum"
            else torch.cumprod(pad, 1, dtype=v.dtype)
        )
        parts.append(pad[inv, rank[sel]])
        where.append(order[sel])
    return torch.empty_like(v).index_put((torch.cat(where),), torch.cat(parts))


def _doubling_scan(v, seg, mode, longest: int):
    """:func:`_segmented_scan` by doubling (Hillis-Steele): ``ceil(log2(longest))`` steps over the
    elements sorted by segment, step ``s`` combining each element with the one ``2**s`` places
    before it in its
    segment; ``O(len(v) log longest)``, sizes from ``len(v)`` only (no value read on the host)::

        _doubling_scan(v, seg, mode, L)[i] == op(v[j] for j <= i with seg[j] == seg[i])

    >>> _doubling_scan(
    ...     torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([0, 1, 0, 0]), "sum", 3
    ... ).tolist()
    [1.0, 2.0, 4.0, 8.0]
    """
    order = torch.argsort(seg, stable=True)
    s, x = seg[order], v[order]
    pos = torch.arange(s.shape[0], device=s.device)
    shift = 1
    while shift < longest:
        src = (pos - shift).clamp_min(0)
        same = (pos >= shift) & (s[src] == s)
        y = x[src] + x if mode == "sum" else x[src] * x
        x = torch.where(same, y, x)
        shift *= 2
    return torch.empty_like(v).index_put((order,), x)


cumsum = _cum("cumsum", "sum")
cumprod = _cum("cumprod", "prod")
