"""``segment.reduce`` as ``torch.library`` custom ops (namespace ``sparsefill::``): what
torch.compile records for it.

The kernels (numba's, when loaded, else torch's; ``_kernels``) read numpy views, build plans and
check their data in Python: opaque to dynamo and to fake tensors.  Under torch.compile
(``_compile.traced``) ``segment.reduce``, the sparse optimizers and ``KeyedJaggedBatch.pooled`` call
custom ops instead (the optimizers' in ``_optim_ops``, the keyed jagged batch's in ``_jagged_ops``,
the conversions' in ``_repr_ops``); each op's real implementation is the eager function (its checks
of the data run then, at run time, and raise the eager errors), its fake implementation gives the
output sizes from the input sizes, or a dynamic size (``_compile.new_dynamic_size()``: also without
``fullgraph``) where they depend on the data::

    sparsefill::segment_reduce(data, ...)      == segment.reduce(data, ...)    (out, arg); autograd:
    sparsefill::segment_reduce_backward(...)
        == the gradients of _SegmentReduceFn  (data, or rows+values; weights)

``segment_reduce`` is registered effectful (``_repr_ops._effectful``): a compiled call whose result
is unused is not removed as dead code, so its checks of the data still raise.  A table given
``sparse_grad`` by two ops of one graph breaks the graph (:func:`_one_sparse_grad_per_table`, also
asked by ``_jagged_ops``).  Registered on the first import of this module (by the first traced
call).

>>> import torch
>>> out, arg = torch.ops.sparsefill.segment_reduce(
...     torch.tensor([[1.0], [2.0], [4.0]]),
...     torch.tensor([2, 1]),
...     None,
...     None,
...     None,
...     None,
...     "sum",
...     None,
...     True,
...     0.0,
...     False,
...     "split",
...     "error",
...     True,
...     False,
... )
>>> out.tolist(), arg.numel()
([[3.0], [4.0]], 0)
"""

from __future__ import annotations

import math
import weakref

import torch
from torch.library import custom_op

from sparsefill._kernels.trace import new_dynamic_size
from sparsefill._kernels import segment as _kernels
from sparsefill._kernels.segment_check import as_index
from sparsefill.segment._repr_ops import _effectful
from sparsefill.segment._reduce_ops import (
    _backward,
    _flat,
    _out_dtype,
    _reduce_eager,
    _scatter_rows,
    _sparse_rows_grad,
    reducer_of,
)

__all__ = ["segment_reduce", "segment_reduce_op", "segment_reduce_backward"]


def _wants_arg(reducer: str, want_arg: bool, ties: str) -> bool:
    """Whether the op computes the arg positions (returned, or read by the ``ties="first"``
    backward)."""
    return want_arg or (reducer_of(reducer).kind == "extreme" and ties == "first")


def _num_segments(data, lengths, offsets, segment_ids, num_segments):
    """``S`` from the sizes of the segments' description; a dynamic size where it is the data's (max
    id + 1)."""
    if lengths is not None:
        return lengths.shape[0]
    if offsets is not None:
        return offsets.shape[0] - 1
    if num_segments is not None:
        return num_segments
    return new_dynamic_size()


def _plan(data, lengths, offsets, segment_ids, indices, num_segments, sorted, out_of_range):
    """The forward's Plan again, for the backward.  The forward checked these inputs (autograd's
    version counters keep them unchanged since), so offsets and lengths become the Plan directly,
    with no second check of their data (``make_plan``'s O(S) checks and syncs: a quarter of a
    compiled DLRM backward); segment ids are grouped again by ``make_plan`` (its O(N) checks
    skipped)."""
    from sparsefill._kernels.segment_plan import Plan, make_plan

    width = math.prod(data.shape[1:])
    if segment_ids is not None:
        return make_plan(
            data.shape[0],
            data.device,
            segment_ids=segment_ids,
            num_segments=num_segments,
            sorted=sorted,
            indices=indices,
            validate=False,
            out_of_range=out_of_range,
            width=width,
        )
    n = data.shape[0] if indices is None else indices.shape[0]
    compiled = _kernels.compiled_for(data.device, n * width)
    offs = offsets.long() if offsets is not None else _kernels.offsets_of(lengths, compiled)
    return Plan(
        offs.shape[0] - 1,
        n,
        offsets=offs,
        indices=None if indices is None else indices.long(),
        compiled=compiled,
    )


# dynamo's FX graph -> {id(table): node}
_SPARSE_GRADS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _one_sparse_grad_per_table(tables, sparse_grad: bool) -> None:
    """In dynamo's trace (its fake run of the op, whose node is then the graph's last): a table that
    requires grad and had a sparse gradient from another op of the graph breaks the graph here (with
    ``fullgraph``: dynamo's error, this message).  Autograd would add the two sparse gradients, and
    torch 2.13 cannot trace that sum for data-dependent counts of rows (its sparse ``add`` reads
    ``_nnz()`` as an int: an internal assert in AOTAutograd; ``nn.Embedding(sparse=True)`` used
    twice fails alike).  After the break the ops are in two graphs and eager autograd adds the
    gradients.  (The keys of one ``pooled`` call that share a table are one op: one gradient.)"""
    if not sparse_grad:
        return
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        graph = InstructionTranslator.current_tx().output.graph  # (the FX graph being built)
    except AttributeError:  # (not dynamo: opcheck, make_fx)
        return
    node = next(reversed(graph.nodes), None)
    if node is None or node.op == "output":
        return  # (AOTAutograd's trace of the finished graph: dynamo has passed it)
    seen = _SPARSE_GRADS.setdefault(graph, {})
    if any(seen.setdefault(id(t), node) is not node for t in tables if t.requires_grad):
        from torch._dynamo.exc import unimplemented

        unimplemented(
            gb_type="sparsefill: a second sparse gradient of one table",
            context="sparse_grad=True on a table that has a sparse gradient from another op of "
            "the graph",
            explanation="A table given sparse_grad=True by two ops of one graph gets two sparse "
            "gradients, which autograd adds: torch 2.13 cannot trace that sum of "
            "sparse tensors of data-dependent sizes.",
            hints=[
                "Pool every key of the table in one KeyedJaggedBatch.pooled call (its keys share "
                "one gradient), or use sparse_grad=False."
            ],
        )


# ------------------------------------------------------------------------------------------
# segment_reduce
@custom_op("sparsefill::segment_reduce", mutates_args=())
def segment_reduce_op(
    data: torch.Tensor,
    lengths: torch.Tensor | None,
    offsets: torch.Tensor | None,
    segment_ids: torch.Tensor | None,
    indices: torch.Tensor | None,
    weights: torch.Tensor | None,
    reducer: str,
    num_segments: int | None,
    sorted: bool,
    empty: float,
    want_arg: bool,
    ties: str,
    out_of_range: str,
    validate: bool,
    sparse_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, arg)`` of ``segment.reduce`` (``arg``: empty unless ``want_arg`` or ``ties="first"``
    of max/min; ``sparse_grad`` is the backward's)."""
    red = reducer_of(reducer)
    if not data.is_floating_point():
        empty = int(empty)
    with torch.no_grad():
        return _reduce_eager(
            data,
            red,
            lengths=lengths,
            offsets=offsets,
            segment_ids=segment_ids,
            indices=indices,
            weights=weights,
            num_segments=num_segments,
            sorted=sorted,
            empty=empty,
            want_arg=_wants_arg(reducer, want_arg, ties),
            ties=ties,
            out_of_range=out_of_range,
            validate=validate,
            sparse_grad=sparse_grad,
        )


@segment_reduce_op.register_fake
def _(
    data,
    lengths,
    offsets,
    segment_ids,
    indices,
    weights,
    reducer,
    num_segments,
    sorted,
    empty,
    want_arg,
    ties,
    out_of_range,
    validate,
    sparse_grad,
):
    _one_sparse_grad_per_table([data], sparse_grad)
    S = _num_segments(data, lengths, offsets, segment_ids, num_segments)
    shape = (S, *data.shape[1:])
    out = data.new_empty(shape, dtype=_out_dtype(reducer_of(reducer), data.dtype))
    arg = data.new_empty(shape if _wants_arg(reducer, want_arg, ties) else (0,), dtype=torch.int64)
    return out, arg


def _setup(ctx, inputs, output):
    # inputs: segment_reduce_op's arguments; the first six are the tensors (data, lengths, offsets,
    # segment_ids, indices, weights); empty, want_arg and validate are the forward's only
    reducer, num_segments, sorted = inputs[6:9]
    ties, out_of_range, sparse_grad = inputs[11], inputs[12], inputs[14]
    out, arg = output
    keep = reducer_of(reducer).kind in ("extreme", "lse")  # (their backward reads the result)
    ctx.save_for_backward(*inputs[:6], out if keep else None, arg)
    ctx.args = (reducer, num_segments, sorted, ties, out_of_range, sparse_grad)
    ctx.data_shape = inputs[0].shape


def _segment_reduce_grad(ctx, grad_out, _grad_arg):
    # (data, lengths, offsets, segment_ids, indices, weights, out, arg: the backward's arguments
    # after grad, then ctx.args: reducer, num_segments, sorted, ties, out_of_range, sparse_grad)
    saved = list(ctx.saved_tensors)
    need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[5]
    nones = [None] * 9
    if not (need_x or need_w):
        return (None,) * 6 + tuple(nones)
    if saved[6] is None:  # (out: saved for max, min and logsumexp only)
        saved[6] = grad_out.new_empty(0)
    gx, rows, gw = segment_reduce_backward(grad_out, *saved, *ctx.args, need_w)
    if ctx.args[-1] and need_x:  # sparse_grad
        gx = _sparse_rows_grad(rows, gx, ctx.data_shape)
    return (gx if need_x else None, None, None, None, None, gw if need_w else None, *nones)


segment_reduce_op.register_autograd(_segment_reduce_grad, setup_context=_setup)


@custom_op("sparsefill::segment_reduce_backward", mutates_args=())
def segment_reduce_backward(
    grad: torch.Tensor,
    data: torch.Tensor,
    lengths: torch.Tensor | None,
    offsets: torch.Tensor | None,
    segment_ids: torch.Tensor | None,
    indices: torch.Tensor | None,
    weights: torch.Tensor | None,
    out: torch.Tensor,
    arg: torch.Tensor,
    reducer: str,
    num_segments: int | None,
    sorted: bool,
    ties: str,
    out_of_range: str,
    sparse_grad: bool,
    need_weights: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(grad_data, rows, grad_weights)`` of ``segment_reduce`` for the upstream ``grad``:
    ``grad_data`` shaped like ``data`` (``rows`` empty), or with ``sparse_grad`` one gradient row
    per position read and ``rows`` the row of data each was read from; ``grad_weights`` empty unless
    ``need_weights``."""
    red = reducer_of(reducer)
    plan = _plan(data, lengths, offsets, segment_ids, indices, num_segments, sorted, out_of_range)
    x2 = _flat(data)
    raw = _flat(out) if red.kind in ("extreme", "lse") else None
    with torch.no_grad():
        gpos, gw = _backward(
            red,
            plan,
            ties,
            x2,
            weights,
            raw,
            _flat(arg) if arg.dim() > 1 else arg,
            _flat(grad),
            need_w=need_weights,
        )
        gw = data.new_empty(0) if gw is None else gw
        # (gpos: a new tensor, never a view of grad; rows may be indices itself: a copy)
        if sparse_grad:
            return gpos.reshape(-1, *data.shape[1:]), plan.rows.clone(), gw
        gx = _scatter_rows(gpos, plan, x2.shape[0]).reshape(data.shape)
        return gx, torch.zeros(0, dtype=torch.int64, device=data.device), gw


@segment_reduce_backward.register_fake
def _(
    grad,
    data,
    lengths,
    offsets,
    segment_ids,
    indices,
    weights,
    out,
    arg,
    reducer,
    num_segments,
    sorted,
    ties,
    out_of_range,
    sparse_grad,
    need_weights,
):
    gw = (
        weights.new_empty(weights.shape)
        if (need_weights and weights is not None)
        else data.new_empty(0)
    )
    if not sparse_grad:
        return data.new_empty(data.shape), data.new_empty(0, dtype=torch.int64), gw
    n = indices.shape[0] if (segment_ids is None or out_of_range != "drop") else new_dynamic_size()
    return data.new_empty((n, *data.shape[1:])), data.new_empty(n, dtype=torch.int64), gw


def segment_reduce(
    data,
    reducer: str,
    *,
    lengths=None,
    offsets=None,
    segment_ids=None,
    indices=None,
    weights=None,
    num_segments=None,
    sorted=True,
    empty=0.0,
    want_arg=False,
    ties="split",
    out_of_range="error",
    validate=True,
    sparse_grad=False,
):
    """:func:`segment_reduce_op` with ``segment.reduce``'s keywords (lists of ids become
    tensors)."""
    dev = data.device
    lengths, offsets, segment_ids, indices = (
        None if t is None else as_index(t, name, dev)
        for t, name in (
            (lengths, "lengths"),
            (offsets, "offsets"),
            (segment_ids, "segment_ids"),
            (indices, "indices"),
        )
    )
    return segment_reduce_op(
        data,
        lengths,
        offsets,
        segment_ids,
        indices,
        weights,
        reducer,
        num_segments,
        sorted,
        float(empty),
        want_arg,
        ties,
        out_of_range,
        validate,
        sparse_grad,
    )


# (its checks of the data run even where its result is unused: never dead code)
_effectful(segment_reduce_op)
