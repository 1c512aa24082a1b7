"""``segment.reduce``: one entry point for every segment reduction of Caffe2.

For a segment ``s`` holding input positions ``P_s`` (rows of ``data``, or entries of ``indices`` for
the fused gather ``x_p = data[indices[p]]``; otherwise ``x_p = data[p]``), with ``n_s = |P_s|``::

    sum                      out[s] = sum_p x_p
    mean                     out[s] = sum_p x_p / n_s
    sqrt_n                   out[s] = sum_p x_p / sqrt(n_s)
    weighted_sum             out[s] = sum_p w_p x_p
    weighted_mean            out[s] = sum_p w_p x_p / sum_p w_p
    positional_weighted_sum  out[s] = sum_j w_j x_(j-th position of s)
        (weights indexed by position)
    max / min                out[s] = max_p x_p / min_p x_p                (arg: the first position)
    prod                     out[s] = prod_p x_p
    logsumexp                out[s] = log sum_p exp(x_p)
    logmeanexp               out[s] = log (sum_p exp(x_p) / n_s)

element-wise over the trailing dims (multi-dimensional data reduces dim 0, the Caffe2 rule).  An
empty segment (``n_s = 0``) gets ``empty`` (default: 0 for the sums, means, max and min, as Caffe2's
Lengths ops; 1 for prod; -inf for logsumexp and logmeanexp).  The reductions are built on the
reducer protocol of :mod:`sparsefill._kernels.reducer` (identity, combine, finalize with the count);
sums, max and min run on the kernels of :mod:`._kernels`.

Gradients (data and weights) come from one ``autograd.Function`` whose backward is written in
differentiable torch ops, so the linear reducers have a double backward.  Under torch.compile the
call is one custom op, ``sparsefill::segment_reduce``, with its backward another (``_custom_ops``:
the same kernels and checks, run at run time; no double backward there).  Max/min ties share the
gradient by ``ties=``: ``"split"`` (equally, as ``torch.amax``; the default), ``"first"`` (the arg
position only, as ``torch.max(dim)``) or ``"all"`` (every tie gets the full gradient, Caffe2's
rule).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import weakref
from typing import Any, Literal, cast, overload

import torch

from sparsefill._kernels import reducer as _reduce
from sparsefill._kernels.trace import traced
from sparsefill._kernels import segment as _kernels
from sparsefill._kernels.segment_check import IndexLike, as_index, check_indices, check_rows
from sparsefill._kernels.segment_plan import Plan, make_plan

__all__ = ["reduce", "SegmentReducer", "SEGMENT_REDUCERS"]


# every live SegmentReducer by _key, as a weak reference (dynamo calls a plain weakref.ref)
_CREATED: dict = {}


def _forget(ref, key):
    """The weak reference's callback: its reducer died (a key reused since belongs to another
    reducer)."""
    if _CREATED.get(key) is ref:
        del _CREATED[key]


def _key(red) -> str:
    return f"{red.name}@{id(red):x}"


@dataclasses.dataclass(frozen=True)
class SegmentReducer:
    """A reducer of the protocol (:mod:`sparsefill._kernels.reducer`: identity, combine, finalize
    with the count)
    plus the weights of the positions and the count its finalize divides by::

        out[s] = base.finalize(base.combine(w_p x_p for p in s), count[s])

    ``weights``: None, ``"row"`` (one per position) or ``"position"`` (one per place in a segment);
    ``scale``: the count of ``finalize``: ``"count"`` (``n_s``, the default) or ``"weights"``
    (``sum_p w_p``: the weighted mean)."""

    name: str
    base: _reduce.Reducer  # the protocol reducer (identity, combine, finalize)
    empty: float  # value of an empty segment
    weights: str | None = (
        None  # None, "row" (one per position) or "position" (one per place in a segment)
    )
    scale: str = "count"  # what finalize divides by: "count" or "weights"
    int_ok: bool = False

    def __post_init__(self):  # (named for sparsefill::segment_reduce: reducer_key)
        key = _key(self)
        _CREATED[key] = weakref.ref(self, lambda ref, key=key: _forget(ref, key))

    @property
    def kind(self) -> str:
        """``"lse"`` (two passes), ``"extreme"`` (amax/amin), ``"prod"`` or ``"sum"`` (linear)."""
        if isinstance(self.base, _reduce.LogSumExp):
            return "lse"
        return {"sum": "sum", "prod": "prod", "amax": "extreme", "amin": "extreme"}[self.base.mode]

    @property
    def linear(self) -> bool:
        return self.kind == "sum"

    def count(self, plan: Plan, weights: torch.Tensor | None) -> torch.Tensor:
        """What ``finalize`` divides by, per segment."""
        if self.scale == "weights":
            return _weight_sums(plan, cast(torch.Tensor, weights))  # (a weighted mean has weights)
        return plan.counts

    def finalize(self, acc: torch.Tensor, plan: Plan, weights: torch.Tensor | None) -> torch.Tensor:
        """The protocol's finalize of the per-segment ``acc`` (shape ``(S, D)``)."""
        return (
            acc
            if self.base._finalize is None
            else self.base.finalize(acc, self.count(plan, weights))
        )

    def slope(
        self, plan: Plan, weights: torch.Tensor | None, dtype: torch.dtype
    ) -> torch.Tensor | None:
        """``d finalize / d acc`` per segment for a linear reducer (its finalize is linear in acc);
        None: 1."""
        if self.base._finalize is None:
            return None
        count = self.count(plan, weights)
        return self.base.finalize(torch.ones(count.shape, dtype=dtype, device=count.device), count)


_P = _reduce.REDUCERS
_sqrt_n = _reduce.Reducer(
    "sqrt_n",
    "sum",
    finalize=lambda acc, n: acc / torch.sqrt(n.to(acc.dtype)),
    dense=lambda x: x.sum(0) / math.sqrt(x.shape[0]),
)
_INF = float("inf")

SEGMENT_REDUCERS: dict[str, SegmentReducer] = {
    r.name: r
    for r in [
        SegmentReducer("sum", _P["sum"], 0.0, int_ok=True),
        SegmentReducer("mean", _P["mean"], 0.0),
        SegmentReducer("sqrt_n", _sqrt_n, 0.0),
        SegmentReducer("weighted_sum", _P["sum"], 0.0, weights="row"),
        SegmentReducer("weighted_mean", _P["mean"], 0.0, weights="row", scale="weights"),
        SegmentReducer("positional_weighted_sum", _P["sum"], 0.0, weights="position"),
        SegmentReducer("max", _P["amax"], 0.0, int_ok=True),
        SegmentReducer("min", _P["amin"], 0.0, int_ok=True),
        SegmentReducer("prod", _P["prod"], 1.0, int_ok=True),
        SegmentReducer("logsumexp", _P["logsumexp"], -_INF),
        SegmentReducer("logmeanexp", _reduce.LogSumExp(mean=True), -_INF),
    ]
}


def reducer_key(red: SegmentReducer) -> str | None:
    """The name of ``red`` for ``sparsefill::segment_reduce`` (a string argument; ``reducer_of(key)
    is red``): a built-in reducer's name, else its key registered on creation (None if it is not:
    made while tracing)."""
    if SEGMENT_REDUCERS.get(red.name) is red:
        return red.name
    key = _key(red)
    ref = _CREATED.get(key)
    return key if ref is not None and ref() is red else None


def reducer_of(key: str) -> SegmentReducer:
    """The reducer named ``key`` by :func:`reducer_key` (built-in, or a live one of the user's)."""
    if key in SEGMENT_REDUCERS:
        return SEGMENT_REDUCERS[key]
    ref = _CREATED.get(key)
    red = None if ref is None else ref()
    if red is None:
        raise ValueError(
            f"no SegmentReducer {key!r}: sparsefill::segment_reduce takes a built-in reducer's "
            "name or the key of a live SegmentReducer (reducer_key)"
        )
    return red


def _lookup(reducer) -> SegmentReducer:
    if isinstance(reducer, SegmentReducer):
        return reducer
    try:
        return SEGMENT_REDUCERS[reducer]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown reducer {reducer!r}; expected one of {', '.join(SEGMENT_REDUCERS)}"
        ) from None


# ------------------------------------------------------------------------------------------ forward
def _segment_weights(red: SegmentReducer, weights, plan: Plan):
    """The weight of every segment-order position (None for unweighted reducers)."""
    if red.weights is None:
        return None
    if red.weights == "row":
        return plan.to_segment_order(weights)
    pos = torch.arange(plan.seg.numel(), device=plan.offsets.device) - plan.offsets[
        :-1
    ].index_select(0, plan.seg)
    return weights.index_select(0, pos)


def _positions(plan: Plan, x2):
    """The rows ``x_k`` in segment order (a gather when needed)."""
    return x2 if plan.rows is None else x2.index_select(0, plan.rows)


def _weight_sums(plan: Plan, w: torch.Tensor) -> torch.Tensor:
    """``W[s] = sum_{p in s} w_p``."""
    S = plan.num_segments
    if plan.unsorted and not plan._sorted:
        return w.new_zeros(S).index_add_(0, cast(torch.Tensor, plan.ids), plan.direct(w))
    return w.new_zeros(S).index_add_(0, plan.seg, cast(torch.Tensor, plan.to_segment_order(w)))


def _forward(
    x2: torch.Tensor, weights, plan: Plan, red: SegmentReducer, want_arg: bool, empty=None
):
    """``(raw, arg)``: the reduction of every segment (empty segments not yet set, but for max/min:
    set to ``empty``) and, for max/min with ``want_arg``, the input position of the first extreme
    (-1 for an empty segment)."""
    S = plan.num_segments
    if S == 0:
        return x2.new_zeros((0, x2.shape[1]), dtype=_out_dtype(red, x2.dtype)), (
            torch.zeros(0, x2.shape[1], dtype=torch.int64, device=x2.device) if want_arg else None
        )
    kind, base = red.kind, red.base
    # the mean's finalize runs fused in the kernels (the count division in the same pass)
    if kind == "sum":
        position = red.weights == "position"
        fused = _fused_mean(red)
        w = _segment_weights(red, weights, plan) if position else weights
        acc = _kernels.segment_sum(
            x2, plan, w, mode="mean" if fused else "sum", w_in_segment_order=position
        )
        return (acc if fused else red.finalize(acc, plan, weights)), None
    if kind == "extreme":
        return _kernels.segment_extreme(
            x2, plan, largest=base.mode == "amax", want_arg=want_arg, empty=empty
        )
    if kind == "prod":
        return base(_positions(plan, x2), plan.seg, S), None
    # (empty segments: any m, log 0)
    m, _ = _kernels.segment_extreme(x2, plan, largest=True, want_arg=False)
    return red.finalize(_lse(_positions(plan, x2), plan.seg, S, m), plan, weights), None


def _fused_mean(red: SegmentReducer) -> bool:
    """The mean by the count: the kernels divide in the same pass (and leave 0 in an empty
    segment)."""
    return red.base is _P["mean"] and red.scale == "count"


def _lse(X: torch.Tensor, seg: torch.Tensor, S: int, m: torch.Tensor) -> torch.Tensor:
    """``lse[s] = log sum_{p in s} exp(X_p) = m_s + log sum exp(X_p - m_s)`` for a per-segment shift
    ``m`` (0 where not finite); differentiable in ``X``."""
    m = _reduce.finite_shift(m)
    return torch.log(_reduce.shifted_exp_sums(X, seg, S, m)[2]) + m


def _flat(t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed as 2-D ``(rows, prod(trailing dims))`` (also for zero rows)."""
    return t.reshape(t.shape[0], math.prod(t.shape[1:]))


def _out_dtype(red, dtype):
    if dtype.is_floating_point or dtype.is_complex or red.kind == "extreme":
        return dtype
    return torch.int64


def _set_empty(raw: torch.Tensor, plan: Plan, value, red: SegmentReducer) -> torch.Tensor:
    """``raw`` with the rows of empty segments set to ``value`` in place (skipped where the kernel
    already wrote it)."""
    if raw.numel() == 0:
        return raw
    if red.kind == "sum" and (red.base._finalize is None or _fused_mean(red)) and value == 0:
        return raw  # embedding_bag / the scatter kernels leave 0 in an empty segment
    if red.kind == "extreme":
        return raw  # segment_extreme set them (_forward passes the value)
    return plan.fill_empty_(raw, value)


# ------------------------------------------------------------------------------------------
# backward
def _scatter_rows(grad_pos: torch.Tensor, plan: Plan, m: int) -> torch.Tensor:
    """Sum the per-position gradients into the rows of data they were read from."""
    if plan.rows is None:
        return grad_pos
    return grad_pos.new_zeros((m, grad_pos.shape[1])).index_add(0, plan.rows, grad_pos)


def _sparse_rows_grad(rows: torch.Tensor, grad_rows: torch.Tensor, shape) -> torch.Tensor:
    """The gradient of a table of ``shape`` read by a fused gather, as a sparse COO tensor: one
    (row, gradient row) pair per position read, uncoalesced (what ``embedding(sparse=True)``
    gives)."""
    return torch.sparse_coo_tensor(
        rows[None], grad_rows, shape, is_coalesced=False, check_invariants=False
    )


def _to_input_order(g_seg: torch.Tensor, plan: Plan) -> torch.Tensor:
    if plan.order is None:
        return g_seg
    return g_seg.new_zeros(plan.n).index_copy(0, plan.order, g_seg)


def _backward(
    ctx_red: SegmentReducer, plan: Plan, ties: str, x2, weights, raw, arg, g2, need_w=None
):
    """Gradients ``(grad_x2, grad_weights)`` from the upstream ``g2`` (shape ``(S, D)``), in torch
    ops (``need_w``: whether the weights' gradient is wanted; default: whether they require
    grad)."""
    seg = plan.seg
    S = plan.num_segments
    G = g2.index_select(0, seg)  # upstream gradient at every position
    red = ctx_red
    need_w = weights is not None and (weights.requires_grad if need_w is None else need_w)
    gw = None
    # (the sums' data gradient reads no row)
    X: Any = _positions(plan, x2) if (red.kind != "sum" or need_w) else None
    if red.kind == "sum":
        w_seg: Any = _segment_weights(red, weights, plan)
        slope = red.slope(plan, weights, x2.dtype)  # d out / d acc: 1 / n_s, 1 / sqrt(n_s), 1 / W_s
        coef = None if slope is None else slope.index_select(0, seg)
        coef = w_seg if coef is None else coef if w_seg is None else coef * w_seg
        gx = G if coef is None else G * coef[:, None]
        if need_w:
            d = (G * X).sum(1)
            if red.scale == "weights":  # the weighted mean: W_s depends on the weights too
                W = w_seg.new_zeros(S).index_add(0, seg, w_seg)
                mean = (
                    X.new_zeros((S, X.shape[1])).index_add(0, seg, X * w_seg[:, None]) / W[:, None]
                )
                d = ((X - mean.index_select(0, seg)) * G).sum(1) / W.index_select(0, seg)
            if red.weights == "position":
                pos = torch.arange(seg.numel(), device=seg.device) - plan.offsets[:-1].index_select(
                    0, seg
                )
                gw = weights.new_zeros(weights.shape[0]).index_add(0, pos, d)
            else:
                gw = _to_input_order(d, plan)
    elif red.kind == "extreme":
        if ties == "first":  # arg holds input positions
            order = plan.order
            k = (order if order is not None else torch.arange(seg.numel(), device=seg.device))[
                :, None
            ]
            hit = k == arg.index_select(0, seg)
        else:
            hit, n_hit, _ = _reduce.tie_counts(X, raw, seg, S, nan=True)
        gx = torch.where(hit, G, torch.zeros((), dtype=G.dtype, device=G.device))
        if ties == "split":
            gx = gx / n_hit.index_select(0, seg).clamp_min(1)
    elif red.kind == "prod":
        zero = X == 0
        one = torch.ones((), dtype=X.dtype, device=X.device)
        nz = _reduce.segment_combine(torch.where(zero, one, X), seg, S, "prod").index_select(0, seg)
        n_zero = (
            X.new_zeros((S, X.shape[1])).index_add(0, seg, zero.to(X.dtype)).index_select(0, seg)
        )
        others = torch.where(
            zero,
            torch.where(n_zero == 1, nz, 0 * nz),
            torch.where(n_zero == 0, nz / torch.where(zero, one, X), 0 * nz),
        )
        gx = G * others
    else:  # lse / logmeanexp: softmax of the segment
        # a double backward: lse as a function of X (the saved result is not)
        if torch.is_grad_enabled():
            lse = _lse(X, seg, S, _reduce.segment_combine(X.detach(), seg, S, "amax"))
        else:
            lse = (
                raw
                if red.base._finalize is None
                else raw + torch.log(plan.counts.to(raw.dtype))[:, None]
            )
        L = lse.index_select(0, seg)
        p = torch.exp(X - torch.where(torch.isinf(L) & (L < 0), torch.zeros((), dtype=L.dtype), L))
        gx = G * torch.where(torch.isinf(L) & (L < 0), torch.zeros((), dtype=p.dtype), p)
    return gx, gw


class _SegmentReduceFn(torch.autograd.Function):
    generate_vmap_rule = (
        True  # (forward and backward are torch ops and kernels that vmap batches: jacrev)
    )

    @staticmethod
    def forward(data, weights, plan, red, ties, empty, want_arg, sparse_grad):
        x2 = _flat(data)
        raw, arg = _forward(
            x2, weights, plan, red, want_arg or (red.kind == "extreme" and ties == "first"), empty
        )
        raw = _set_empty(raw, plan, empty, red)  # (empty segments have no position to use it)
        # detach: not a view of raw in autograd's eyes, so the caller may modify it in place (as
        # embedding_bag's)
        out = raw.reshape(plan.num_segments, *data.shape[1:]).detach()
        if arg is None:
            arg = torch.zeros(0, dtype=torch.int64, device=data.device)
        return out, arg

    @staticmethod
    def setup_context(ctx, inputs, output):
        data, weights, plan, red, ties, _, _, sparse_grad = inputs
        out, arg = output
        # the backward of max/min/lse reads the result: saved, an in-place change of it then raises
        # there
        ctx.save_for_backward(data, weights, out if red.kind in ("extreme", "lse") else None, arg)
        ctx.plan, ctx.red, ctx.ties, ctx.sparse_grad = plan, red, ties, sparse_grad
        ctx.mark_non_differentiable(arg)

    @staticmethod
    def backward(ctx, grad_out, _grad_arg):
        data, weights, out, arg = ctx.saved_tensors
        x2, raw = _flat(data), None if out is None else _flat(out)
        g2 = _flat(grad_out)
        gpos, gw = _backward(ctx.red, ctx.plan, ctx.ties, x2, weights, raw, arg, g2)
        if ctx.sparse_grad:
            gx = _sparse_rows_grad(ctx.plan.rows, gpos.reshape(-1, *data.shape[1:]), data.shape)
        else:
            gx = _scatter_rows(gpos, ctx.plan, x2.shape[0]).reshape(data.shape)
        return gx, gw, None, None, None, None, None, None


# ------------------------------------------------------------------------------------------ entry
# point
# (the result: a tensor, or (result, arg) with return_arg=True)
@overload
def reduce(
    data: torch.Tensor,
    reducer: str | SegmentReducer = "sum",
    *,
    lengths: IndexLike | None = None,
    offsets: IndexLike | None = None,
    segment_ids: IndexLike | None = None,
    indices: IndexLike | None = None,
    weights: torch.Tensor | None = None,
    num_segments: int | None = None,
    sorted: bool = True,
    empty: float | None = None,
    return_arg: Literal[False] = False,
    ties: str = "split",
    out_of_range: str = "error",
    validate: bool = True,
    sparse_grad: bool = False,
) -> torch.Tensor: ...


@overload
def reduce(
    data: torch.Tensor,
    reducer: str | SegmentReducer = "sum",
    *,
    lengths: IndexLike | None = None,
    offsets: IndexLike | None = None,
    segment_ids: IndexLike | None = None,
    indices: IndexLike | None = None,
    weights: torch.Tensor | None = None,
    num_segments: int | None = None,
    sorted: bool = True,
    empty: float | None = None,
    return_arg: Literal[True],
    ties: str = "split",
    out_of_range: str = "error",
    validate: bool = True,
    sparse_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]: ...


def reduce(
    data: torch.Tensor,
    reducer: str | SegmentReducer = "sum",
    *,
    lengths: IndexLike | None = None,
    offsets: IndexLike | None = None,
    segment_ids: IndexLike | None = None,
    indices: IndexLike | None = None,
    weights: torch.Tensor | None = None,
    num_segments: int | None = None,
    sorted: bool = True,
    empty: float | None = None,
    return_arg: bool = False,
    ties: str = "split",
    out_of_range: str = "error",
    validate: bool = True,
    sparse_grad: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Reduce the rows of every segment of ``data`` (dim 0) with ``reducer`` (see the module
    docstring).

    The segments are given by exactly one of ``lengths`` (``S``), ``offsets`` (``S + 1``, CSR style)
    or ``segment_ids`` (one per position; ``sorted=False`` for any order; ``num_segments`` defaults
    to ``max + 1``).  ``indices`` fuses a gather: position ``p`` reads ``data[indices[p]]``
    (Caffe2's ``Sparse*`` ops, ``embedding_bag``).  ``weights`` (float, one per position, or for
    ``positional_weighted_sum`` one per place in a segment) feed the weighted reducers.

    ``empty``: the value of an empty segment (default per reducer: see the module docstring).
    ``return_arg`` (max/min): also return the input position of the first extreme (-1 for empty).
    ``out_of_range`` (segment ids): ``"error"`` (default), ``"drop"`` the positions, or ``"clip"``
    them into ``[0, num_segments)``; an entry of ``indices`` out of range always raises.
    ``validate=False`` skips the O(N) checks of segment ids and indices (the result is then
    unspecified for invalid input; out-of-range rows are still never read); lengths and offsets
    (O(S)) are always checked.
    ``sparse_grad`` (with ``indices``): the gradient of ``data`` is a sparse COO tensor holding one
    (row, gradient row) pair per position, uncoalesced -- what ``embedding(sparse=True)`` gives and
    what the sparse optimizers (``segment.SparseAdagrad``, ...) consume.

    >>> data = torch.tensor([[1., 4.], [3., 2.], [8., 1.], [9., 4.], [5., 8.]])
    >>> reduce(data, "sum", segment_ids=torch.tensor([0, 0, 0, 1, 1]))
    tensor([[12.,  7.],
            [14., 12.]])
    >>> reduce(data, "max", lengths=torch.tensor([2, 0, 3]), return_arg=True)
    (tensor([[3., 4.],
            [0., 0.],
            [9., 8.]]), tensor([[ 1,  0],
            [-1, -1],
            [ 3,  4]]))
    """
    red, weights, empty = _args(
        data, reducer, weights, ties, sparse_grad, return_arg, indices, empty
    )
    kw = dict(
        lengths=lengths,
        offsets=offsets,
        segment_ids=segment_ids,
        indices=indices,
        weights=weights,
        num_segments=num_segments,
        sorted=sorted,
        empty=empty,
        want_arg=return_arg,
        ties=ties,
        out_of_range=out_of_range,
        validate=validate,
        sparse_grad=sparse_grad,
    )
    key = reducer_key(red) if traced(data) else None
    if key is not None:  # torch.compile: one custom op (its checks at run time)
        from sparsefill.segment import _custom_ops

        out, arg = _custom_ops.segment_reduce(data, key, **kw)
    else:
        out, arg = _reduce_eager(data, red, **kw)
    if not return_arg:
        return out
    return out, arg.reshape(out.shape)


def _args(data, reducer, weights, ties, sparse_grad, return_arg, indices, empty):
    """``(red, weights, empty)`` after the checks of ``reduce``'s arguments that read no data."""
    red = _lookup(reducer)
    if not isinstance(data, torch.Tensor):
        raise TypeError(f"data must be a tensor, got {type(data).__name__}")
    if data.dim() == 0:
        raise ValueError("data must have at least one dimension (the rows to reduce)")
    if not (
        data.is_floating_point()
        or (red.int_ok and not data.is_complex() and data.dtype != torch.bool)
    ):
        raise TypeError(f"reducer {red.name!r} needs floating-point data, got {data.dtype}")
    if ties not in ("split", "first", "all"):
        raise ValueError(f"ties must be 'split', 'first' or 'all', got {ties!r}")
    if sparse_grad and indices is None:
        raise ValueError("sparse_grad=True needs indices= (the gradient rows of a fused gather)")
    # (autograd refuses torch's sparse gradient for a SparseTensor)
    if sparse_grad and hasattr(data, "_sf_layout"):
        raise TypeError(
            "sparse_grad=True gives a dense table torch's sparse COO gradient; data is a "
            "sparsefill SparseTensor, whose gradient is a SparseTensor already: pass "
            "sparse_grad=False"
        )
    if return_arg and red.kind != "extreme":
        raise ValueError(f"return_arg=True needs the max or min reducer, got {red.name!r}")
    if red.weights is None:
        if weights is not None:
            raise ValueError(
                f"reducer {red.name!r} takes no weights (use weighted_sum, weighted_mean or "
                f"positional_weighted_sum)"
            )
    else:
        if weights is None:
            raise ValueError(f"reducer {red.name!r} needs weights=")
        if not isinstance(weights, torch.Tensor):
            weights = torch.as_tensor(weights, dtype=data.dtype, device=data.device)
        if weights.dtype != data.dtype:
            raise TypeError(
                f"weights must have the dtype of data ({data.dtype}), got {weights.dtype}"
            )
        if weights.dim() != 1:
            raise ValueError(f"weights must be 1-D, got shape {tuple(weights.shape)}")
    empty = red.empty if empty is None else _real_number(empty, "empty")
    if not data.is_floating_point() and not (
        math.isfinite(empty)
        and float(empty).is_integer()
        and torch.iinfo(data.dtype).min <= empty <= torch.iinfo(data.dtype).max
    ):
        raise ValueError(f"empty={empty!r} cannot be stored in {data.dtype} data")
    return red, weights, empty


def _real_number(x, name):
    """``x`` as a Python float or int (a real number or a 0-d real tensor), else a TypeError naming
    ``name``: checked before any segment is read, not only when one is empty."""
    if isinstance(x, torch.Tensor) and x.dim() == 0 and not x.is_complex():
        return x.item()
    if isinstance(x, numbers.Real):
        return x
    raise TypeError(
        f"{name} must be a real number (the value of an empty segment), got "
        f"{type(x).__name__} {x!r}"
    )


def _reduce_eager(
    data,
    red: SegmentReducer,
    *,
    lengths,
    offsets,
    segment_ids,
    indices,
    weights,
    num_segments,
    sorted,
    empty,
    want_arg,
    ties,
    out_of_range,
    validate,
    sparse_grad,
):
    """``(out, arg)`` of ``reduce`` (``arg`` an empty tensor unless computed) after :func:`_args`:
    the plan, the checks that read data, and the kernels (through ``_SegmentReduceFn`` where a
    gradient is wanted)."""
    plan = make_plan(
        data.shape[0],
        data.device,
        lengths=lengths,
        offsets=offsets,
        segment_ids=segment_ids,
        num_segments=num_segments,
        sorted=sorted,
        indices=indices,
        validate=validate,
        out_of_range=out_of_range,
        width=math.prod(data.shape[1:]),
    )
    if red.weights == "row":
        check_rows(
            weights, plan.n, "weights", "entry of indices" if indices is not None else "row of data"
        )
    elif red.weights == "position":
        longest = int(plan.counts.max()) if plan.num_segments else 0
        if weights.shape[0] < longest:
            raise ValueError(
                f"positional weights have {weights.shape[0]} entries, but the longest segment "
                f"has {longest} positions"
            )
    try:
        if torch.is_grad_enabled() and (
            data.requires_grad or (weights is not None and weights.requires_grad)
        ):
            out, arg = _SegmentReduceFn.apply(
                data, weights, plan, red, ties, empty, want_arg, sparse_grad
            )
        else:
            x2 = _flat(data)
            raw, arg = _forward(x2, weights, plan, red, want_arg, empty)
            out = _set_empty(raw, plan, empty, red).reshape(plan.num_segments, *data.shape[1:])
    except (IndexError, RuntimeError):
        # torch's own range errors (embedding_bag, index_select) -> name the entry
        if indices is not None:
            check_indices(as_index(indices, "indices", data.device), data.shape[0])
        raise
    return out, (torch.zeros(0, dtype=torch.int64, device=data.device) if arg is None else arg)
