"""The ``combine`` and ``fold`` steps of the reducer protocol (``_kernels/reducer.py``): one
scatter kernel over ``(values, segment ids)`` for all slices at once, and the closed-form fold of
``n`` fill copies (per segment, or a fill table ``n[s, c]`` copies of ``F[s, c]``)::

    segment_combine(v, seg, S, mode)[s] == combine(identity, v[i] for i with seg[i] == s)
    times(f, n, like)                    == n * f where n > 0, else 0 (an inf or NaN fill with no
                                            copies adds nothing)

>>> import torch
>>> segment_combine(torch.tensor([1., 5., 3.]), torch.tensor([0, 0, 2]), 3, "amax").tolist()
[5.0, -inf, 3.0]
"""

from __future__ import annotations

import cmath
import math

import torch

from sparsefill._kernels import engine as _engine
from sparsefill._kernels.accurate_sum import accurate_sum
from sparsefill._kernels.trace import bincount, traced
from sparsefill._kernels.index import runs_to_ids


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
