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

Example::

    >>> import torch
    >>> from sparsefill._kernels.reducer import REDUCERS
    >>> v = torch.tensor([1., 2., 3.]); seg = torch.tensor([0, 0, 2])
    >>> REDUCERS["sum"](v, seg, 3, fill=torch.tensor(10.), n_fill=torch.tensor([1, 0, 2]))
    tensor([13.,  0., 23.])
"""

from __future__ import annotations

import cmath
import math

import torch

from sparsefill._kernels import engine as _engine
from sparsefill._kernels.trace import bincount, traced
from sparsefill._kernels.grouping import pattern_cached
from sparsefill._kernels.index import runs_to_ids

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

_SCATTER_IDENTITY = {"sum": 0, "prod": 1, "amax": -math.inf, "amin": math.inf}


def identity_of(mode: str, dtype: torch.dtype):
    """The identity of the scatter ``mode`` in ``dtype`` (the extreme finite value for integers)."""
    v = _SCATTER_IDENTITY[mode]
    if math.isinf(v) and not (dtype.is_floating_point or dtype.is_complex):
        if dtype == torch.bool:
            return v > 0
        info = torch.iinfo(dtype)
        return info.min if v < 0 else info.max
    return v


def broadcast_seg(seg: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``seg`` (shape ``(k,)``) viewed with the trailing dims of ``values`` (shape ``(k, *D)``)."""
    return seg.view(-1, *([1] * (values.dim() - 1))).expand_as(values)


def segment_combine(
    values: torch.Tensor,
    seg: torch.Tensor,
    num_segments: int,
    mode: str,
    init=None,
    lengths=None,
    csr=None,
    wide: bool = False,
) -> torch.Tensor:
    """``out[s] = combine(init, values[i] for i with seg[i] == s)`` along dim 0, for every ``s``.

    ``mode`` is a ``scatter_reduce`` mode (``sum prod amax amin``); ``init`` defaults to the
    identity. NaN propagates as in torch's reductions.  ``lengths`` (optional): the segments are
    contiguous runs of these lengths, in order (``seg`` sorted); floating values then take torch's
    sorted ``segment_reduce`` kernel, which reads each run once instead of scattering.  ``csr``
    (:class:`sparsefill._kernels.engine.CsrRows`): the segments are rows of a CSR matrix whose
    stored values are ``values`` (a row sum may take its SpMV).  The engine:
    :func:`sparsefill._kernels.engine.choose`.

    Floating sums are at least as accurate as torch's dense sum of the same elements
    (:func:`accurate_sum`); ``wide``: return such a sum in its accumulator dtype
    (:func:`accumulator_dtype`), for a caller that folds fills or divides by a count before the
    one final rounding.
    """
    fake = traced(values)  # (torch.compile: sizes are symbols, and the scatter forms trace)
    if mode == "sum" and not fake and values.is_floating_point() and values.numel():
        acc = accurate_sum(values, seg, num_segments, lengths=lengths, csr=csr)
        acc = acc if init is None or init == 0 else acc + init
        return acc if wide else acc.to(values.dtype)
    ident = identity_of(mode, values.dtype) if init is None else init
    rows = csr is not None and init is None and not fake and values.numel() > 0
    engine = _engine.choose(
        mode,
        values.dtype,
        runs=lengths is not None and (fake or values.numel() > 0),
        csr_rows=rows and values.dim() == 1,
        compiled=rows and csr.compiled,
        one_dim=values.dim() == 1,
        traced=fake,
    )
    return _engine.run(
        engine, mode, values, seg, num_segments, ident, lengths=lengths, csr=csr, traced=fake
    )


_ACCUMULATOR = {
    torch.float16: torch.float32,
    torch.bfloat16: torch.float32,
    torch.float32: torch.float64,
}
_BLOCK = 8  # (float64 runs: summed in blocks of at most this many, then the block sums likewise)


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a segment sum of ``dtype`` values accumulates in: float32 for the half types (as
    torch), float64 for float32 (a segment's sum is then its correctly rounded float32 sum, whatever
    its order and length), the dtype itself otherwise."""
    return _ACCUMULATOR.get(dtype, dtype)


def accurate_sum(
    values: torch.Tensor, seg, num_segments: int, *, lengths=None, csr=None
) -> torch.Tensor:
    """Per-segment sums of floating ``values`` (along dim 0), in :func:`accumulator_dtype`, at least
    as accurate as torch's own dense sum of each segment's elements::

        one segment   torch's pairwise (cascade) sum of the values (accumulating as torch does)
        many (CPU)    each segment's run cut into blocks of at most 8 values, summed in the
                      values' dtype; the block sums then summed in float64 (float32 values) or as
                      a tree of such blocks (float64; the half types in float32); unsorted ids are
                      sorted first (cached)
        other devices accumulated in the wider dtype, on the engine of ``_kernels.engine.choose``

    so a segment's error grows as ``log(k)`` (or not at all), never as ``k``: a single slot fed
    ``k`` values in order (``scatter_add_``, ``segment_reduce``, a CSR SpMV) errs ~``k * eps`` in
    the worst case: 1.7e-2 for 10M float32 values, where torch's sum errs ~1e-8.

    >>> v = torch.full((1_000_000,), 0.1)
    >>> round(
    ...     float(accurate_sum(v, None, 1, lengths=torch.tensor([1_000_000]))[0]), 1
    ... )  # (one slot: 100958.3)
    100000.0
    >>> accurate_sum(torch.tensor([1., 2., 4.]), torch.tensor([1, 0, 1]), 2).tolist()
    [2.0, 5.0]
    """
    acc = accumulator_dtype(values.dtype)
    if num_segments == 1:
        # (halves: torch accumulates in float32)
        if values.dtype != acc and values.dtype != torch.float32:
            return values.sum(0, keepdim=True, dtype=acc)
        # (float32: the pairwise sum, ~6x faster than in float64)
        return values.sum(0, keepdim=True).to(acc)
    if values.device.type != "cpu" or values.is_complex():
        values = values.to(acc)
        runs, rows = lengths is not None, csr is not None and values.dim() == 1
        engine = _engine.choose(
            "sum",
            values.dtype,
            runs=runs,
            csr_rows=rows,
            compiled=rows and csr.compiled,
            one_dim=values.dim() == 1,
        )
        return _engine.run(engine, "sum", values, seg, num_segments, 0, lengths=lengths, csr=csr)
    # unsorted ids: each into its own block of 8
    if values.dtype == torch.float32 and lengths is None:
        slot, nb, total = pattern_cached(
            "sum_slots", (seg,), lambda: _block_slots(seg, num_segments)
        )
        part = values.new_zeros((total, *values.shape[1:]))
        part = (
            part.index_add_(0, slot, values)
            if values.dim() > 1
            else part.scatter_add_(0, slot, values)
        )
        values, lengths = (
            part,
            nb,
        )  # (a gather into segment order instead: 20x slower, random reads)
    elif lengths is None:
        order, lengths = pattern_cached(
            "sum_order", (seg,), lambda: _sort_segments(seg, num_segments)
        )
        values = values.index_select(0, order)
    else:
        nb = None
    # (the half types: in float32, their accumulator; float64 as it is)
    if values.dtype != torch.float32:
        return _blocked_runs_sum(values.to(acc), lengths)
    if nb is not None:  # (the block sums of unsorted ids: summed per segment in float64)
        return torch.segment_reduce(values.to(acc), "sum", lengths=lengths, unsafe=True)
    if values.dim() != 1 or values.requires_grad:
        blocks, nb = _blocks(lengths)
        # (<= 8 values each, in float32)
        part = torch.segment_reduce(values, "sum", lengths=blocks, unsafe=True)
        return torch.segment_reduce(part.to(acc), "sum", lengths=nb, unsafe=True)
    return _block_sums_mv(values, lengths)


def _block_sums_mv(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Run sums of 1-D float32 ``values`` in float64 (blocks of at most 8 summed in float32): both
    levels by torch's CSR SpMV (``_kernels.engine``'s ``csr_mv``; ~5x faster than ``segment_reduce``
    over many short runs, and no float64 copy of the values: a fresh 8 MB allocation costs more than
    the sums here)."""
    blocks, nb = _blocks(lengths)
    outer = pattern_cached("sum_block_rows", (lengths,), lambda: _unit_rows(nb, blocks.numel()))
    inner = pattern_cached("sum_block_rows", (blocks,), lambda: _unit_rows(blocks, values.shape[0]))
    part = _engine.run("csr_mv", "sum", values, None, blocks.numel(), 0, csr=inner)
    return _engine.run("csr_mv", "sum", part.to(torch.float64), None, nb.numel(), 0, csr=outer)


def _unit_rows(lengths: torch.Tensor, k: int):
    """:class:`_kernels.engine.CsrRows` of a CSR matrix of one column whose rows hold runs of
    ``lengths`` (``k`` in all): its SpMV with a one is the run sums."""
    crow = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths, 0, out=crow[1:])
    col = _zero_columns(k, lengths.device)
    return _engine.CsrRows(
        crow, col, 1, None, False, (crow.to(torch.int32), col) if k < 2**31 else None
    )


_ZEROS: dict = {}


def _zero_columns(k: int, device) -> torch.Tensor:
    """``k`` int32 zeros (column indices of a one-column matrix): a view of one shared, read-only
    buffer per device, grown as needed (no k-sized allocation per call)."""
    buf = _ZEROS.get(device)
    if buf is None or buf.numel() < k:
        buf = _ZEROS[device] = torch.zeros(
            max(k, 2 * (0 if buf is None else buf.numel())), dtype=torch.int32, device=device
        )
    return buf[:k]


def _block_slots(seg, num_segments):
    """``(slot, nb, total)``: element ``i`` goes to block ``slot[i]``, the ``r // 8``-th block of
    its segment (``r``: its rank there, in order); segment ``s`` owns ``nb[s]`` consecutive blocks
    (at least one), in segment order, ``total`` in all."""
    order, lengths = _sort_segments(seg, num_segments)
    starts = torch.cumsum(lengths, 0) - lengths
    rank = torch.empty_like(seg)
    rank[order] = torch.arange(seg.numel(), device=seg.device) - starts.index_select(
        0, seg.index_select(0, order)
    )
    nb = torch.div(lengths + (_BLOCK - 1), _BLOCK, rounding_mode="floor").clamp_min(1)
    first = torch.cumsum(nb, 0) - nb
    slot = first.index_select(0, seg) + torch.div(rank, _BLOCK, rounding_mode="floor")
    return slot, nb, int(nb.sum())


def _sort_segments(seg, num_segments):
    """``(order, lengths)``: a stable permutation grouping elements by segment id, and the run
    lengths."""
    return torch.sort(seg, stable=True).indices, bincount(seg, num_segments)


def _blocks(lengths: torch.Tensor):
    """``(blocks, nb)``: runs of ``lengths`` cut into ``nb[s]`` blocks of at most ``_BLOCK`` (the
    last partial; an empty run one empty block), in order; cached with ``lengths``."""

    def cut():
        nb = torch.div(lengths + (_BLOCK - 1), _BLOCK, rounding_mode="floor").clamp_min(1)
        blocks = torch.full((int(nb.sum()),), _BLOCK, dtype=lengths.dtype, device=lengths.device)
        # (each run's last, partial block)
        blocks[torch.cumsum(nb, 0) - 1] = lengths - _BLOCK * (nb - 1)
        return blocks, nb

    return pattern_cached("sum_blocks", (lengths,), cut)


def _blocked_runs_sum(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Sums of the contiguous runs of ``lengths`` as a tree of blocks of at most ``_BLOCK`` values
    (``segment_reduce`` over the blocks, then over the block sums, ...): the error of a run of ``k``
    grows as ``log(k)`` instead of ``k``."""
    while lengths.numel() and int(lengths.max()) > _BLOCK:
        blocks, nb = _blocks(lengths)
        values = torch.segment_reduce(values, "sum", lengths=blocks, unsafe=True)
        lengths = nb
    return torch.segment_reduce(values, "sum", lengths=lengths, unsafe=True)


def seg_ids(seg, lengths, k: int) -> torch.Tensor:
    """``seg``, or, when it is None, the ids of ``k`` elements in contiguous runs of ``lengths``."""
    return seg if seg is not None else runs_to_ids(lengths, k)


def segment_counts(seg: torch.Tensor, num_segments: int, lengths=None) -> torch.Tensor:
    """Number of stored values per segment (int64, shape ``(num_segments,)``)."""
    if lengths is not None:
        return lengths
    return (
        bincount(seg, num_segments)
        if traced(seg) or seg.numel()
        else torch.zeros(num_segments, dtype=torch.int64, device=seg.device)
    )


def gather_seg(t: torch.Tensor, seg, lengths, k: int) -> torch.Tensor:
    """``t[seg]``: a per-segment value at each of the ``k`` elements (``seg`` may be None with
    ``lengths``)."""
    return t.index_select(0, seg_ids(seg, lengths, k))


def _table(n, acc) -> bool:
    """``n`` is a fill table ``(num_segments, C)`` for a per-segment accumulator ``acc``
    ``(num_segments,)``."""
    return isinstance(n, torch.Tensor) and n.dim() == 2 and acc.dim() == 1


def _n_total(n, acc):
    """Fill copies per segment (a table summed over its classes)."""
    return n.sum(-1) if _table(n, acc) else n


def _per_segment(t, acc, n):
    """A per-segment statistic shaped to meet the fills: ``(S, 1)`` against a fill table."""
    return t[:, None] if _table(n, acc) else t


def _fold_sum(acc, f, n):
    """``acc + n * f`` for a per-segment ``n`` or a fill table (summed over its classes)."""
    if _table(n, acc):
        f = torch.as_tensor(f, dtype=acc.dtype, device=acc.device).expand(n.shape)
        return acc + times(f, n, f).sum(-1)
    f = _like(f, acc)
    # no 0 * inf to guard where n = 0: one fused op (n promoted in it)
    if f.dim() == 0 and _finite_scalar(f):
        return torch.addcmul(acc, _bcast(n, acc), f)
    return acc + times(f, n, acc)


def _like(t, like) -> torch.Tensor:
    """``torch.as_tensor(t, dtype=like.dtype, device=like.device)``, ``t`` itself where it already
    is that."""
    if isinstance(t, torch.Tensor) and t.dtype == like.dtype and t.device == like.device:
        return t
    return torch.as_tensor(t, dtype=like.dtype, device=like.device)


def _finite_scalar(f: torch.Tensor) -> bool:
    """A 0-d ``f`` is known finite (False while traced: its data is not read)."""
    if traced(f):
        return False
    v = f.item()
    return cmath.isfinite(v) if isinstance(v, complex) else math.isfinite(v)


def _bcast(t, like):
    """A per-segment tensor ``(S,)`` (or a fill shaped like the trailing dims) broadcast against
    ``like``."""
    if not (isinstance(t, torch.Tensor) and t.device == like.device):
        t = torch.as_tensor(t, device=like.device)
    if t.dim() == 1 and like.dim() > 1 and t.shape[0] == like.shape[0]:
        return t.view(-1, *([1] * (like.dim() - 1)))
    return t


def times(f, n, like):
    """``n * f`` where ``n > 0`` and 0 elsewhere (so an inf or NaN fill with no copies adds
    nothing)."""
    f = torch.as_tensor(f, dtype=like.dtype, device=like.device)
    n = _bcast(n, like)
    return torch.where(
        n > 0, f * n.to(like.dtype), torch.zeros((), dtype=like.dtype, device=like.device)
    )


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


def segment_arg(
    values: torch.Tensor,
    seg: torch.Tensor,
    num_segments: int,
    positions: torch.Tensor,
    best: torch.Tensor,
    *,
    fill=None,
    fill_position=None,
) -> torch.Tensor:
    """Position of the first element equal to ``best[s]`` in every segment (torch's argmax/argmin
    tie rule).

    ``positions[i]`` is the position of ``values[i]`` within its slice; a NaN ``best`` matches a
    NaN. Where the fill equals ``best`` and ``fill_position[s]`` (the first unspecified position, or
    ``None``/-1 for none) comes earlier, that position wins.  Segments with no match get -1. With a
    fill table (``fill``/``fill_position`` of shape ``(num_segments, C)``) every class is a
    candidate at its own first position.
    """
    b = best[seg]
    hit = (
        (values == b) | (torch.isnan(values) & torch.isnan(b))
        if values.is_floating_point()
        else values == b
    )
    big = torch.iinfo(torch.int64).max
    pos = torch.where(
        hit, broadcast_seg(positions, values), torch.full_like(hit, big, dtype=torch.int64)
    )
    out = segment_combine(pos, seg, num_segments, "amin", init=big)
    if fill is not None and fill_position is not None:
        f = torch.as_tensor(fill, dtype=values.dtype, device=values.device)
        fp = torch.as_tensor(fill_position, device=out.device)
        b = best[:, None] if _table(fp, out) else best
        fhit = (
            (f == b) | (torch.isnan(f) & torch.isnan(b)) if values.is_floating_point() else f == b
        )
        if _table(fp, out):  # a fill table: the first position among the classes that hit
            out = torch.minimum(
                out, torch.where(fhit & (fp >= 0), fp, torch.full_like(fp, big)).amin(-1)
            )
        else:
            fp = _bcast(fp, out)
            out = torch.where(fhit & (fp >= 0), torch.minimum(out, fp.expand_as(out)), out)
    return torch.where(out == big, torch.full_like(out, -1), out)


def first_gap(
    seg: torch.Tensor, pos: torch.Tensor, num_segments: int, presorted: bool = False
) -> torch.Tensor:
    """Per segment, the smallest non-negative position not among its ``pos`` (the count when they
    are ``0 .. count - 1``): the first unspecified position of a slice, where argmax finds a winning
    fill. Sorted by (segment, position), the k-th element of a segment sits at position k until the
    first gap.  ``presorted``: ``pos`` already ascends within every segment.

    >>> first_gap(torch.tensor([0, 0, 1, 1]), torch.tensor([0, 2, 0, 1]), 3).tolist()
    [1, 2, 0]
    """
    order = (
        torch.arange(seg.numel(), device=seg.device)
        if presorted
        else torch.argsort(pos, stable=True)
    )
    order = order[torch.argsort(seg[order], stable=True)]
    s, p = seg[order], pos[order]
    counts = segment_counts(s, num_segments)
    rank = torch.arange(s.numel(), device=s.device) - (torch.cumsum(counts, 0) - counts)[s]
    bad = p != rank
    return counts.clone().scatter_reduce(0, s[bad], rank[bad], "amin", include_self=True)


def tie_counts(values, best, seg, num_segments, *, fill=None, n_fill=None, nan=False):
    """``(hit, count, n_hit)``: the ties of each segment's extreme ``best``, the one tie rule of
    amax/amin
    gradients (:func:`even_ties`, ``segment.reduce``'s max/min backward)::

        hit[i] = values[i] == best[seg[i]]    (``nan``: a NaN also matches a NaN best, torch's rule)
        count[s] = #{i : seg[i] == s, hit[i]} + sum of n_hit[s]

    ``n_hit``: the fill copies equal to ``best`` (per segment, or per class of a fill table), None
    without fills.  ``count`` has ``values``' dtype and ``best``'s shape.

    >>> hit, count, _ = tie_counts(
    ...     torch.tensor([2.0, 2.0, 1.0]), torch.tensor([2.0, 1.0]), torch.tensor([0, 0, 1]), 2
    ... )
    >>> hit.tolist(), count.tolist()
    ([True, True, True], [2.0, 1.0])
    """
    b = best.index_select(0, seg)
    hit = values == b
    if nan and values.is_floating_point():
        hit = hit | (torch.isnan(values) & torch.isnan(b))
    count = segment_combine(hit.to(best.dtype), seg, num_segments, "sum")
    if fill is None or n_fill is None:
        return hit, count, None
    table = _table(torch.as_tensor(n_fill), best)
    bb = best[:, None] if table else best
    n = n_fill if table else _bcast(n_fill, best)
    nf = torch.where((fill == bb) & (n > 0), n, torch.zeros_like(n)).to(best.dtype)
    return hit, count + (nf.sum(-1) if table else nf.expand_as(best)), nf


def even_ties(best, values, seg, num_segments, fill=None, n_fill=None):
    """``best`` (each segment's extreme) rewritten as the mean of the elements equal to it, so that
    its gradient splits evenly among all of them, fill copies included (torch's amax/amin backward
    on the dense slice).  Same value; segments with no such element (none, or NaN) keep ``best``, no
    gradient."""
    b = best.detach()
    hit, count, nf = tie_counts(values, b, seg, num_segments, fill=fill, n_fill=n_fill)
    total = segment_combine(
        torch.where(hit, values, torch.zeros_like(values)), seg, num_segments, "sum"
    )
    if nf is not None:
        ftot = torch.where(nf > 0, fill * nf, torch.zeros((), dtype=b.dtype, device=b.device))
        total = total + (ftot.sum(-1) if nf.dim() == 2 and b.dim() == 1 else ftot.expand_as(b))
    return torch.where(count > 0, total / count.clamp_min(1), b)


def segment_median(
    values: torch.Tensor,
    seg: torch.Tensor,
    num_segments: int,
    *,
    fill=None,
    n_fill=None,
    return_index: bool = False,
):
    """Lower median of the non-NaN elements of each segment (``torch.nanmedian``), for 1-D
    ``values`` plus ``n_fill`` copies of ``fill`` (per segment, or a fill table); NaN (0 for
    integers) for a segment with none.  The one median rank rule of sparse, masked and whole-tensor
    medians: sorted once by (segment, value), the copies enter as one weighted element per class,
    ahead of equal stored values, and the median is the element whose cumulative weight first
    exceeds ``(N - 1) // 2``.

    ``return_index``: also the element picked: ``i < k`` the stored ``values[i]``, ``k + s * C + c``
    the fill class ``c`` of segment ``s`` (``C`` classes, 1 without a table), -1 for a segment with
    none.

    >>> segment_median(
    ...     torch.tensor([3.0, 1.0, 2.0]),
    ...     torch.tensor([0, 0, 1]),
    ...     2,
    ...     fill=torch.tensor(0.0),
    ...     n_fill=torch.tensor([2, 0]),
    ... ).tolist()
    [0.0, 2.0]
    """
    k = values.shape[0]
    vals, segs, mult = values, seg, torch.ones_like(seg)
    ids = torch.arange(k, device=seg.device)
    if fill is not None and n_fill is not None:
        n = torch.as_tensor(n_fill, device=seg.device)
        n = n if n.dim() == 2 else n[:, None]
        F = torch.as_tensor(fill, dtype=values.dtype, device=values.device).expand(n.shape)
        # (fills first: ahead of equal stored values in the stable sort)
        vals = torch.cat([F.reshape(-1), values])
        segs = torch.cat(
            [torch.arange(num_segments, device=seg.device).repeat_interleave(n.shape[1]), seg]
        )
        mult = torch.cat([n.reshape(-1), mult])
        ids = torch.cat([k + torch.arange(n.numel(), device=seg.device), ids])
    keep = (mult > 0) & ~torch.isnan(vals)
    vals, segs, mult, ids = vals[keep], segs[keep], mult[keep], ids[keep]
    order = torch.argsort(vals.detach(), stable=True)
    order = order[torch.argsort(segs[order], stable=True)]
    vals, segs, mult, ids = vals[order], segs[order], mult[order], ids[order]
    total = torch.zeros(num_segments, dtype=torch.int64, device=seg.device).index_add_(
        0, segs, mult
    )
    after = torch.cumsum(mult, 0) - (torch.cumsum(total, 0) - total)[segs]
    t = (total - 1).div(2, rounding_mode="floor")[segs]
    sel = (after - mult <= t) & (t < after)
    empty = math.nan if values.is_floating_point() or values.is_complex() else 0
    out = torch.full((num_segments,), empty, dtype=values.dtype, device=values.device).index_put(
        (segs[sel],), vals[sel]
    )
    if not return_index:
        return out
    return out, torch.full((num_segments,), -1, dtype=torch.int64, device=seg.device).index_put(
        (segs[sel],), ids[sel]
    )
