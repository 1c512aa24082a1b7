"""The reducer protocol: one description of a reduction serves sparse, masked and segment
reductions.

A slice holds ``k`` stored values ``x_1..x_k`` and ``n`` unspecified elements equal to a fill ``f``.
Its reduction is computed in closed form, never by materialising the ``n`` fills::

    reduce(slice) = finalize(fold(combine(identity, x_1, ..., x_k), f, n), k + n)

* ``identity``   the value of an empty combine (0 for sum, 1 for prod, -inf for amax, ...);
* ``combine``    the associative step, run for all slices at once by one scatter kernel over
                 ``(values, segment ids)`` (:func:`segment_combine`);
* ``fold``       ``combine`` applied to ``n`` copies of ``f`` (sum adds ``f * n``, prod multiplies
                 by ``f ** n``, amax takes ``max(acc, f)`` where ``n > 0``);
* ``finalize``   maps the accumulator and the element count to the result (mean divides by the
                 count).

Reductions that need a statistic of the slice first (logsumexp shifts by the max, var centres on
the mean) are two passes of the same machinery (:class:`LogSumExp`, :class:`Var`).

*Fill tables* (masked reductions): for scalar values (``values`` 1-D) a slice may hold several
*classes* of identical unspecified elements, ``n[s, c]`` copies of ``F[s, c]`` (one class per
reduced dense position of a hybrid tensor, the masked-out zeros of a negative-order norm, ...).
Pass ``fill=F`` and ``n_fill=n`` of shape ``(num_segments, C)``; ``fold`` combines every class::

    reduce(slice s) = finalize(fold(combine(x_1..x_k), F[s, :], n[s, :]), k + sum_c n[s, c])

Invariant, for every reducer ``r`` and any split of a slice into stored values and fills::

    r(values, seg, S, fill=f, n_fill=n)[s] == r.dense(torch.cat([values[seg == s], f.expand(n[s])]))

Where the steps live: ``combine`` and ``fold`` in ``_kernels/combine.py``, the accurate floating
sums in ``_kernels/accurate_sum.py``, the element a reduction selects (argmax positions, ties,
medians) in ``_kernels/selection.py``; this module holds the reducers and re-exports those names.

Example::

    >>> import torch
    >>> from sparsefill._kernels.reducer import REDUCERS
    >>> v = torch.tensor([1., 2., 3.]); seg = torch.tensor([0, 0, 2])
    >>> REDUCERS["sum"](v, seg, 3, fill=torch.tensor(10.), n_fill=torch.tensor([1, 0, 2]))
    tensor([13.,  0., 23.])
"""

from __future__ import annotations

import math

import torch

from sparsefill._kernels.accurate_sum import accumulator_dtype, accurate_sum
from sparsefill._kernels.combine import (
    _bcast,
    _fold_sum,
    _like,
    _n_total,
    _per_segment,
    _table,
    broadcast_seg,
    gather_seg,
    identity_of as identity_of,
    seg_ids,
    segment_combine,
    segment_counts,
    times as times,
)
from sparsefill._kernels.selection import (
    even_ties,
    first_gap,
    segment_arg,
    segment_median,
    tie_counts,
)

__all__ = [
    "Reducer",
    "LogSumExp",
    "Var",
    "Norm",
    "Xor",
    "REDUCERS",
    "segment_combine",
    "accurate_sum",
    "accumulator_dtype",
    "segment_counts",
    "segment_arg",
    "segment_median",
    "broadcast_seg",
    "gather_seg",
    "first_gap",
    "even_ties",
    "tie_counts",
    "finite_shift",
    "shifted_exp_sums",
]


class Reducer:
    """A reduction described by a scatter ``mode``, an optional term map ``pre`` (applied to every
    element, stored or fill), a ``finalize(acc, count)`` and the start value ``init`` of ``combine``
    (the identity by default).  Subclasses override :meth:`__call__` for two-pass reductions."""

    def __init__(self, name, mode, pre=None, finalize=None, dense=None, init=None):
        self.name, self.mode, self.pre, self._finalize, self._dense = (
            name,
            mode,
            pre,
            finalize,
            dense,
        )
        self.init = init

    def identity(self, dtype):
        return identity_of(self.mode, dtype)

    def combine(self, values, seg, num_segments, lengths=None, csr=None, wide=False):
        return segment_combine(
            values if self.pre is None else self.pre(values),
            seg,
            num_segments,
            self.mode,
            self.init,
            lengths=lengths,
            csr=csr,
            wide=wide,
        )

    def fold(self, acc, fill, n):
        """``combine`` of ``acc`` with ``n`` copies of ``fill`` (``n`` per segment, broadcast), or
        with a fill table (``n[s, c]`` copies of ``fill[s, c]``, see the module docstring)."""
        f = fill if self.pre is None else self.pre(fill)
        if self.mode == "sum":
            return _fold_sum(acc, f, n)
        f = torch.as_tensor(f, dtype=acc.dtype, device=acc.device)
        one = torch.ones((), dtype=acc.dtype, device=acc.device)
        if _table(n, acc):
            if n.shape[-1] == 0:  # no class (a 0-size reduced dense dim)
                return acc
            f = f.expand(n.shape)
            if self.mode == "prod":
                return acc * torch.where(n > 0, torch.pow(f, n), one).prod(-1)
            g = torch.where(
                n > 0,
                f,
                torch.full((), self.identity(acc.dtype), dtype=acc.dtype, device=acc.device),
            )
            return (
                torch.maximum(acc, g.amax(-1))
                if self.mode == "amax"
                else torch.minimum(acc, g.amin(-1))
            )
        n = _bcast(n, acc)
        if self.mode == "prod":  # (pow(nan + 0j, 0) is NaN: no copies multiply by 1)
            return acc * torch.where(n > 0, torch.pow(f, n), one)
        op = torch.maximum if self.mode == "amax" else torch.minimum
        return torch.where(n > 0, op(acc, f), acc)

    def finalize(self, acc, count):
        return acc if self._finalize is None else self._finalize(acc, _bcast(count, acc))

    def __call__(
        self, values, seg, num_segments, *, fill=None, n_fill=None, lengths=None, csr=None
    ):
        """Reduce ``values`` (shape ``(k, *D)``) into ``num_segments`` slices by ``seg``; each slice
        also holds ``n_fill[s]`` copies of ``fill`` (a scalar or a tensor of shape ``D``), or a fill
        table. ``lengths``: the segments are contiguous runs of these lengths (see
        :func:`segment_combine`); ``seg`` may then be None.  ``csr``: they are the rows of a CSR
        matrix (:class:`_kernels.engine.CsrRows`). amax/amin under autograd: the gradient splits
        evenly among tied elements, fill copies included (:func:`even_ties`, torch's amax
        backward)."""
        if self.mode in ("sum", "prod") and not (values.is_floating_point() or values.is_complex()):
            # torch's rule: integer and bool sums and products are int64
            values = values.to(torch.int64)
        # (a floating sum stays in its accumulator dtype through the fold and finalize: one rounding
        # at the end)
        acc = self.combine(values, seg, num_segments, lengths, csr, wide=True)
        folded = fill is not None and n_fill is not None
        if folded:
            fill = _like(fill, values)
            acc = self.fold(acc, fill, n_fill)
        if (
            self.mode in ("amax", "amin")
            and torch.is_grad_enabled()
            and (values.requires_grad or (folded and fill.requires_grad))
        ):
            pre = (lambda t: t) if self.pre is None else self.pre
            acc = even_ties(
                acc,
                pre(values),
                seg_ids(seg, lengths, values.shape[0]),
                num_segments,
                pre(fill) if folded else None,
                n_fill if folded else None,
            )
        if self._finalize is None:  # (the count is needed by finalize only)
            return _narrow(acc, values)
        count = segment_counts(seg, num_segments, lengths)
        return _narrow(
            self.finalize(acc, count if not folded else count + _n_total(n_fill, acc)), values
        )

    def of_fills(self, fill, n: int, dtype: torch.dtype) -> torch.Tensor:
        """The reduction of a slice of ``n`` copies of ``fill`` and no stored value, for values of
        ``dtype``
        (the fill of a reduction's result)::

            r.of_fills(f, n, v.dtype) == r(v[:0], seg[:0], 1, fill=f, n_fill=torch.tensor([n]))[0]

        >>> f = torch.tensor(2.)
        >>> (
        ...     REDUCERS["mean"].of_fills(f, 3, torch.float32),
        ...     REDUCERS["prod"].of_fills(f, 3, torch.float32),
        ... )
        (tensor(2.), tensor(8.))
        """
        fill = torch.as_tensor(fill)
        if type(self).__call__ is not Reducer.__call__ or (
            torch.is_grad_enabled() and fill.requires_grad
        ):
            v = fill.new_empty((0, *fill.shape), dtype=dtype)
            seg = torch.zeros(0, dtype=torch.int64, device=fill.device)
            return self(v, seg, 1, fill=fill, n_fill=torch.tensor([n], device=fill.device))[0]
        if self.mode in ("sum", "prod") and not (dtype.is_floating_point or dtype.is_complex):
            dtype = torch.int64
        f = fill.to(dtype)
        f = f if self.pre is None else self.pre(f)
        start = identity_of(self.mode, f.dtype) if self.init is None else self.init
        if n <= 0:
            acc = torch.full(f.shape, start, dtype=f.dtype, device=f.device)
        elif self.mode == "sum":
            acc = f * n if start == 0 else f * n + start
        elif self.mode == "prod":
            acc = torch.pow(f, n) if start == 1 else torch.pow(f, n) * start
        else:
            op = torch.maximum if self.mode == "amax" else torch.minimum
            acc = op(f, torch.full((), start, dtype=f.dtype, device=f.device))
        return (
            acc if self._finalize is None else self._finalize(acc, torch.tensor(n, device=f.device))
        )

    def dense(self, x: torch.Tensor) -> torch.Tensor:
        """The same reduction of a dense 1-D-leading tensor along dim 0 (the reference)."""
        return self._dense(x)

    def __repr__(self):
        return f"Reducer({self.name!r})"


def _narrow(acc, values):
    """A sum accumulated wider (:func:`accumulator_dtype`) rounded once to the floating dtype of
    ``values``."""
    if acc.dtype == values.dtype or not (values.is_floating_point() and acc.is_floating_point()):
        return acc
    return acc.to(values.dtype)


def _mean(acc, count):
    return acc / count


class LogSumExp(Reducer):
    """``log(sum(exp(x)))`` as ``m + log(sum(exp(x - m)))`` with ``m`` the slice max (0 where
    infinite; a constant for the gradient, which is exact for any ``m``)."""

    def __init__(self, mean: bool = False):
        """``mean``: ``logmeanexp = logsumexp - log(count)`` (the finalize step)."""
        if mean:
            super().__init__(
                "logmeanexp",
                "sum",
                finalize=lambda lse, n: lse - torch.log(n.to(lse.dtype)),
                dense=lambda x: torch.logsumexp(x, 0) - math.log(x.shape[0]),
            )
        else:
            super().__init__("logsumexp", "sum", dense=lambda x: torch.logsumexp(x, 0))

    def __call__(
        self, values, seg, num_segments, *, fill=None, n_fill=None, lengths=None, csr=None
    ):
        lse = self.parts(
            values, seg, num_segments, fill=fill, n_fill=n_fill, lengths=lengths, csr=csr
        )[0]
        if self._finalize is None:
            return lse
        count = segment_counts(seg, num_segments, lengths)
        return self.finalize(
            lse, count if fill is None or n_fill is None else count + _n_total(n_fill, lse)
        )

    def parts(self, values, seg, num_segments, *, fill=None, n_fill=None, lengths=None, csr=None):
        """``(lse, e, acc)``: the result, the shifted terms ``e = exp(x - m[seg])`` of the stored
        values and their per-segment sum ``acc`` (fills included), so that ``softmax = e /
        acc[seg]`` costs one gather and one division more."""
        with torch.no_grad():
            m = finite_shift(
                REDUCERS["amax"](
                    values, seg, num_segments, fill=fill, n_fill=n_fill, lengths=lengths, csr=csr
                )
            )
        _, e, acc = shifted_exp_sums(
            values, seg, num_segments, m, fill=fill, n_fill=n_fill, lengths=lengths, csr=csr
        )
        return torch.log(acc) + m, e, acc


def finite_shift(m: torch.Tensor) -> torch.Tensor:
    """The shift of a log-sum-exp: the slice max ``m``, 0 where it is not finite (an empty or all
    -inf slice, an inf or NaN max); any shift gives the same result, and the gradient through it is
    0."""
    return torch.where(torch.isfinite(m), m, torch.zeros((), dtype=m.dtype, device=m.device))


def shifted_exp_sums(
    values, seg, num_segments, m, *, fill=None, n_fill=None, lengths=None, csr=None
):
    """``(shifted, e, Z)``: ``shifted = x - m[seg]``, ``e = exp(shifted)`` and the per-segment sums
    ``Z[s] = sum_{seg[i] == s} e[i] + n[s] * exp(f - m[s])`` (fills by count or fill table), so
    that::

        logsumexp = log(Z) + m,   softmax = e / Z[seg],   log_softmax = shifted - log(Z)[seg]

    The one shifted log-sum-exp of sparse, masked and segment reductions and softmaxes (``m``: the
    slice max, :func:`finite_shift` for a logsumexp; ``seg`` may be None with ``lengths``).

    >>> v = torch.tensor([0., 1., 5.]); seg = torch.tensor([0, 0, 1])
    >>> _, _, Z = shifted_exp_sums(
    ...     v, seg, 2, torch.tensor([1.0, 5.0]), fill=torch.tensor(1.0), n_fill=torch.tensor([1, 0])
    ... )
    >>> torch.allclose(
    ...     torch.log(Z) + torch.tensor([1.0, 5.0]),
    ...     torch.tensor([torch.logsumexp(torch.tensor([0.0, 1.0, 1.0]), 0), 5.0]),
    ... )
    True
    """
    seg = seg_ids(seg, lengths, values.shape[0])
    shifted = values - m.index_select(0, seg)
    e = torch.exp(shifted)
    Z = segment_combine(e, seg, num_segments, "sum", lengths=lengths, csr=csr)
    if fill is not None and n_fill is not None:
        f = torch.as_tensor(fill, dtype=values.dtype, device=values.device)
        Z = _fold_sum(Z, torch.exp(f - _per_segment(m, Z, n_fill)), n_fill)
    return shifted, e, Z


class Var(Reducer):
    """``sum((x - mean)^2) / (count - correction)``; centred on the mean for accuracy (two
    passes)."""

    def __init__(self, correction=1):
        self.correction = correction
        super().__init__("var", "sum", dense=lambda x: torch.var(x, 0, correction=correction))

    def __call__(
        self, values, seg, num_segments, *, fill=None, n_fill=None, lengths=None, csr=None
    ):
        # (as torch's var of float32: its moments in float64)
        wide = accumulator_dtype(values.dtype)
        if wide != values.dtype:
            return _narrow(
                self(
                    values.to(wide),
                    seg,
                    num_segments,
                    fill=None if fill is None else _like(fill, values).to(wide),
                    n_fill=n_fill,
                    lengths=lengths,
                    csr=csr,
                ),
                values,
            )
        table = isinstance(n_fill, torch.Tensor) and n_fill.dim() == 2 and values.dim() == 1
        # shifted by the (finite) fill: a slice of
        if fill is not None and n_fill is not None and not table:
            # fills only is then exactly 0, as torch's var of equal elements
            fill = _like(fill, values)
            shift = torch.where(
                torch.isfinite(fill), fill, torch.zeros((), dtype=fill.dtype, device=fill.device)
            )
            values, fill = values - shift.detach(), fill - shift.detach()
        mean = REDUCERS["mean"](
            values, seg, num_segments, fill=fill, n_fill=n_fill, lengths=lengths, csr=csr
        )
        seg = seg_ids(seg, lengths, values.shape[0])
        d = values - mean.index_select(0, seg)
        acc = segment_combine(
            (d * d.conj()).real if d.is_complex() else d * d,
            seg,
            num_segments,
            "sum",
            lengths=lengths,
            csr=csr,
        )
        count = segment_counts(seg, num_segments, lengths)
        if fill is not None and n_fill is not None:
            df = torch.as_tensor(fill, dtype=values.dtype, device=values.device) - _per_segment(
                mean, acc, n_fill
            )
            acc = _fold_sum(acc, (df * df.conj()).real if df.is_complex() else df * df, n_fill)
            count = count + _n_total(n_fill, acc)
        return acc / (_bcast(count, acc) - self.correction).clamp_min(0)


def _root(p):
    """``s^(1/p)``; for ``p > 0`` the root has no derivative at 0: 0 there, as
    torch.linalg.vector_norm."""
    if p < 0:
        return lambda s, c: s ** (1.0 / p)

    def root(s, c):
        pos = s != 0
        return torch.where(
            pos, torch.where(pos, s, torch.ones_like(s)) ** (1.0 / p), torch.zeros_like(s)
        )

    return root


class Norm(Reducer):
    """The vector ``p``-norm: ``(sum |x|^p)^(1/p)``; ``p = inf`` is ``max |x|`` (0 for no element),
    ``p = -inf`` is ``min |x|``, ``p = 0`` counts nonzeros."""

    def __init__(self, p=2.0):
        self.p = p
        if math.isinf(p):
            super().__init__(
                "norm",
                "amax" if p > 0 else "amin",
                pre=lambda x: torch.abs(x),
                init=0.0 if p > 0 else None,
            )
        elif p == 0:
            super().__init__("norm", "sum", pre=lambda x: (x != 0).to(x.abs().dtype))
        else:
            super().__init__("norm", "sum", pre=lambda x: torch.abs(x) ** p, finalize=_root(p))
        self._dense = lambda x: torch.linalg.vector_norm(x, p, 0)


def bits64(x: torch.Tensor) -> torch.Tensor:
    """The 64-bit pattern of each element, as ``torch.hash_tensor`` reads it: floating values upcast
    to float64, integers and bool to int64 (uint64 as is), bitcast to int64.

    >>> bits64(torch.tensor([1.5], dtype=torch.float32)).view(torch.uint64) == torch.hash_tensor(
    ...     torch.tensor([1.5])
    ... )
    tensor([True])
    """
    if x.dtype in (torch.int64, torch.uint64):
        return x.view(torch.int64)
    return x.to(torch.float64).view(torch.int64) if x.is_floating_point() else x.to(torch.int64)


_XOR_CHUNK = 1 << 16  # stored elements per pass of the bit-plane count (64 bytes each)


class Xor(Reducer):
    """``torch.hash_tensor`` (mode 0): the xor of the elements' 64-bit patterns (:func:`bits64`),
    uint64.
    ``n`` copies of a fill xor to the fill's pattern where ``n`` is odd, to 0 where it is even::

        hash(slice) = xor(bits64(x_1), ..., bits64(x_k)) ^ (bits64(f) if n % 2 else 0)

    No scatter kernel xors: each slice's parity of every bit plane is counted in uint8 (which wraps
    modulo 256, keeping the parity), in chunks of ``_XOR_CHUNK`` elements.

    >>> v = torch.tensor([1., 2., 3.]); seg = torch.tensor([0, 0, 2])
    >>> h = Xor()(v, seg, 3, fill=torch.tensor(10.), n_fill=torch.tensor([1, 2, 2]))
    >>> (
    ...     bool(h[0] == torch.hash_tensor(torch.tensor([1.0, 2.0, 10.0]))),
    ...     int(h[1]),
    ...     bool(h[2] == torch.hash_tensor(v[2:])),
    ... )
    (True, 0, True)
    """

    def __init__(self):
        super().__init__("hash_tensor", "xor", dense=lambda x: torch.hash_tensor(x, [0]))

    def __call__(
        self, values, seg, num_segments, *, fill=None, n_fill=None, lengths=None, csr=None
    ):
        k = values.shape[0]
        seg = seg_ids(seg, lengths, k)
        shifts = torch.arange(64, dtype=torch.int64, device=values.device)
        count = torch.zeros(
            (num_segments, *values.shape[1:], 64), dtype=torch.uint8, device=values.device
        )
        for i in range(0, k, _XOR_CHUNK):
            planes = (bits64(values[i : i + _XOR_CHUNK]).unsqueeze(-1) >> shifts) & 1
            count.index_add_(0, seg[i : i + _XOR_CHUNK], planes.to(torch.uint8))
        # (distinct bits: the sum is their or)
        acc = ((count & 1).to(torch.int64) << shifts).sum(-1)
        if fill is not None and n_fill is not None:
            f = bits64(torch.as_tensor(fill, device=values.device))
            odd = _bcast(n_fill, acc) % 2 == 1
            if _table(n_fill, acc):  # the classes with an odd count, xored together
                f = torch.where(odd, f.expand(n_fill.shape), 0)
                f, odd = torch.hash_tensor(f, [-1]).view(torch.int64), True
            acc = torch.where(odd, acc ^ f, acc)
        return acc.view(torch.uint64)


REDUCERS: dict[str, Reducer] = {
    "sum": Reducer("sum", "sum", dense=lambda x: torch.sum(x, 0)),
    "prod": Reducer("prod", "prod", dense=lambda x: torch.prod(x, 0)),
    "amax": Reducer("amax", "amax", dense=lambda x: torch.amax(x, 0)),
    "amin": Reducer("amin", "amin", dense=lambda x: torch.amin(x, 0)),
    "mean": Reducer("mean", "sum", finalize=_mean, dense=lambda x: torch.mean(x, 0)),
    "logsumexp": LogSumExp(),
    "var": Var(),
    "norm": Norm(),
    "hash_tensor": Xor(),
}
