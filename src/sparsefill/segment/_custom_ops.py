"""The segment operations as ``torch.library`` custom ops (namespace ``sparsefill::``): what
torch.compile records for them.

The kernels (numba's, when loaded, else torch's; ``_kernels``) read numpy views, build plans and
check their data in Python: opaque to dynamo and to fake tensors.  Under torch.compile
(``_compile.traced``) ``segment.reduce``, the sparse optimizers and ``KeyedJaggedBatch.pooled`` call
these ops instead; each op's real implementation is the eager function (its checks of the data run
then, at run time, and raise the eager errors), its fake implementation gives the output sizes from
the input sizes, or a dynamic size
(``_compile.new_dynamic_size()``: also without ``fullgraph``) where they depend on the data::

    sparsefill::segment_reduce(data, ...)      == segment.reduce(data, ...)    (out, arg); autograd:
    sparsefill::segment_reduce_backward(...)
        == the gradients of _SegmentReduceFn  (data, or rows+values; weights)
    sparsefill::sparse_adagrad_(param!, moment!, indices, grad, ...)       == segment.sparse_adagrad
    sparsefill::rowwise_sparse_adagrad_(param!, moment!, indices, grad, ...)
        == segment.rowwise_sparse_adagrad
    sparsefill::sparse_ftrl_(param!, n!, z!, indices, grad, ...)              == segment.sparse_ftrl
    sparsefill::jagged_key_lists(values, values_lengths, keys, example_lengths, wanted)
        == (offsets of the (key, example) lists, per wanted key its entries of values)
    sparsefill::jagged_pooled(tables, values, values_lengths, keys, example_lengths, wanted,
                              table_of, reducer, ...)
        == (per wanted key segment_reduce(tables[table_of[j]], ...) over its ids; offsets; per key
            its ids); autograd:
    sparsefill::jagged_pooled_backward(grads, tables, table_of, offsets, lists, ...)
        == the tables' gradients

``jagged_pooled`` is ``KeyedJaggedBatch.pooled`` of an unweighted sum, mean or sqrt_n in one op (one
op call forward, one backward, instead of ``jagged_key_lists`` then a ``segment_reduce`` per key:
each custom op call has a dispatch cost: with four keys, most of what a compiled DLRM step lost to
eager; the figures are in the benchmarks).  It is not registered effectful (torch 2.13's inductor
cannot lower an effectful op with a ``Tensor[]`` argument or result: an IndexError in its lowering)
but as a side effect (``torch.fx.node.has_side_effect``: no effect token, no cost), so a compiled
``pooled`` whose result is unused is never dead code and still checks its ids. A table shared by
keys is passed once (``table_of``): one gradient per table.  Autograd would add two sparse gradients
of one table, which torch 2.13 cannot trace for data-dependent sizes; a table given ``sparse_grad``
by two ops of one graph breaks the graph (:func:`_one_sparse_grad_per_table`).

The optimizers' ops declare the tensors they update in place (``mutates_args``); ``segment_reduce``
is registered effectful (``_repr_ops._effectful``): a compiled call whose result is unused is not
removed as dead code, so its checks of the data still raise.  Registered on the first import of this
module (by the first traced call).

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
    _args,
    _backward,
    _flat,
    _out_dtype,
    _reduce_eager,
    _scatter_rows,
    _sparse_rows_grad,
    reducer_key,
    reducer_of,
)

__all__ = [
    "segment_reduce",
    "segment_reduce_op",
    "segment_reduce_backward",
    "sparse_adagrad_",
    "rowwise_sparse_adagrad_",
    "sparse_ftrl_",
    "jagged_key_lists",
    "jagged_pooled",
    "jagged_pooled_backward",
    "pooled_fused",
    "distinct_tables",
]


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


# ------------------------------------------------------------------------------------------
# optimizers
@custom_op("sparsefill::sparse_adagrad_", mutates_args=("param", "moment"))
def sparse_adagrad_(
    param: torch.Tensor,
    moment: torch.Tensor,
    indices: torch.Tensor,
    grad: torch.Tensor,
    lr: float,
    eps: float,
    weight_decay: float,
    decay: float,
    update_mode: str,
) -> None:
    from sparsefill.segment._optim import sparse_adagrad

    sparse_adagrad(
        param,
        moment,
        indices,
        grad,
        lr=lr,
        eps=eps,
        weight_decay=weight_decay,
        decay=decay,
        mode=update_mode,
    )


@sparse_adagrad_.register_fake
def _(param, moment, indices, grad, lr, eps, weight_decay, decay, update_mode):
    return None


@custom_op("sparsefill::rowwise_sparse_adagrad_", mutates_args=("param", "moment"))
def rowwise_sparse_adagrad_(
    param: torch.Tensor,
    moment: torch.Tensor,
    indices: torch.Tensor,
    grad: torch.Tensor,
    lr: float,
    eps: float,
    weight_decay: float,
    update_mode: str,
) -> None:
    from sparsefill.segment._optim import rowwise_sparse_adagrad

    rowwise_sparse_adagrad(
        param, moment, indices, grad, lr=lr, eps=eps, weight_decay=weight_decay, mode=update_mode
    )


@rowwise_sparse_adagrad_.register_fake
def _(param, moment, indices, grad, lr, eps, weight_decay, update_mode):
    return None


@custom_op("sparsefill::sparse_ftrl_", mutates_args=("param", "n", "z"))
def sparse_ftrl_(
    param: torch.Tensor,
    n: torch.Tensor,
    z: torch.Tensor,
    indices: torch.Tensor,
    grad: torch.Tensor,
    alpha: float,
    beta: float,
    lambda1: float,
    lambda2: float,
    update_mode: str,
) -> None:
    from sparsefill.segment._optim import sparse_ftrl

    sparse_ftrl(
        param,
        n,
        z,
        indices,
        grad,
        alpha=alpha,
        beta=beta,
        lambda1=lambda1,
        lambda2=lambda2,
        mode=update_mode,
    )


@sparse_ftrl_.register_fake
def _(param, n, z, indices, grad, alpha, beta, lambda1, lambda2, update_mode):
    return None


# ------------------------------------------------------------------------------------------ keyed
# jagged batches
@custom_op("sparsefill::jagged_key_lists", mutates_args=())
def jagged_key_lists(
    values: torch.Tensor,
    values_lengths: torch.Tensor,
    keys: torch.Tensor,
    example_lengths: torch.Tensor,
    wanted: list[int],
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``(offsets, lists)``: ``KeyedJaggedBatch._by_key``'s offsets (``K * B + 1``) and, per wanted
    key ``j``, its entries of ``values`` example by example (their count: a dynamic size)."""
    from sparsefill.segment._jagged import key_lists

    return key_lists(values, values_lengths, keys, example_lengths, wanted)


@jagged_key_lists.register_fake
def _(values, values_lengths, keys, example_lengths, wanted):
    offsets = keys.new_empty(len(wanted) * example_lengths.shape[0] + 1, dtype=torch.int64)
    return offsets, [values.new_empty(new_dynamic_size()) for _ in wanted]


def _key_slices(offsets, B: int, j: int):
    """Key ``j``'s ``B + 1`` offsets of ``jagged_key_lists``, from 0."""
    offs = offsets[j * B : (j + 1) * B + 1]
    return offs - offs[0]


@custom_op("sparsefill::jagged_pooled", mutates_args=())
def jagged_pooled(
    tables: list[torch.Tensor],
    values: torch.Tensor,
    values_lengths: torch.Tensor,
    keys: torch.Tensor,
    example_lengths: torch.Tensor,
    wanted: list[int],
    table_of: list[int],
    reducer: str,
    empty: float,
    validate: bool,
    sparse_grad: bool,
) -> tuple[list[torch.Tensor], torch.Tensor, list[torch.Tensor]]:
    """``(outs, offsets, lists)``: :func:`jagged_key_lists`, then per wanted key ``j`` ``outs[j] =
    segment.reduce(tables[table_of[j]], reducer, offsets=<key j's offsets>, indices=lists[j])`` (the
    eager function, its checks included); ``offsets`` and ``lists`` are the backward's.  ``tables``
    are distinct (a table shared by keys is given once: its gradient is one tensor, the rows of all
    its keys; two sparse gradients of one tensor would be added by autograd, which torch 2.13 cannot
    trace for data-dependent counts of rows)."""
    from sparsefill.segment._jagged import key_lists

    offsets, lists = key_lists(values, values_lengths, keys, example_lengths, wanted)
    B, red = example_lengths.shape[0], reducer_of(reducer)
    with torch.no_grad():
        outs = [
            _reduce_eager(
                t,
                red,
                lengths=None,
                offsets=_key_slices(offsets, B, j),
                segment_ids=None,
                indices=ids,
                weights=None,
                num_segments=None,
                sorted=True,
                empty=empty if t.is_floating_point() else int(empty),
                want_arg=False,
                ties="split",
                out_of_range="error",
                validate=validate,
                sparse_grad=sparse_grad,
            )[0]
            for j, (t, ids) in enumerate(zip((tables[i] for i in table_of), lists))
        ]
    return outs, offsets, lists


@jagged_pooled.register_fake
def _(
    tables,
    values,
    values_lengths,
    keys,
    example_lengths,
    wanted,
    table_of,
    reducer,
    empty,
    validate,
    sparse_grad,
):
    _one_sparse_grad_per_table(tables, sparse_grad)
    B, red = example_lengths.shape[0], reducer_of(reducer)
    outs = [
        tables[i].new_empty((B, *tables[i].shape[1:]), dtype=_out_dtype(red, tables[i].dtype))
        for i in table_of
    ]
    offsets = keys.new_empty(len(wanted) * B + 1, dtype=torch.int64)
    return outs, offsets, [values.new_empty(new_dynamic_size()) for _ in wanted]


def _pooled_setup(ctx, inputs, output):
    tables, table_of, reducer, sparse_grad = inputs[0], inputs[6], inputs[7], inputs[10]
    _, offsets, lists = output
    ctx.save_for_backward(*tables, offsets, *lists)
    ctx.k, ctx.B, ctx.args = len(tables), inputs[4].shape[0], (table_of, reducer, sparse_grad)


def _pooled_grad(ctx, grad_outs, _grad_offsets, _grad_lists):
    saved = ctx.saved_tensors
    tables, offsets, lists = list(saved[: ctx.k]), saved[ctx.k], list(saved[ctx.k + 1 :])
    table_of, reducer, sparse_grad = ctx.args
    grads = [
        torch.zeros((ctx.B, *tables[i].shape[1:]), dtype=tables[i].dtype, device=tables[i].device)
        if g is None
        else g
        for g, i in zip(grad_outs, table_of)
    ]
    gx, rows = jagged_pooled_backward(grads, tables, table_of, offsets, lists, reducer, sparse_grad)
    if sparse_grad:
        gx = [_sparse_rows_grad(r, g, t.shape) for r, g, t in zip(rows, gx, tables)]
    return (list(gx),) + (None,) * 10


jagged_pooled.register_autograd(_pooled_grad, setup_context=_pooled_setup)


@custom_op("sparsefill::jagged_pooled_backward", mutates_args=())
def jagged_pooled_backward(
    grads: list[torch.Tensor],
    tables: list[torch.Tensor],
    table_of: list[int],
    offsets: torch.Tensor,
    lists: list[torch.Tensor],
    reducer: str,
    sparse_grad: bool,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``(grad_tables, rows)`` of :func:`jagged_pooled` for the upstream ``grads`` (one per key),
    one per table: per key as ``segment_reduce_backward``, the keys of one table together
    (``sparse_grad``: one gradient row per id of its keys, ``rows`` those ids; else the table's
    gradient, ``rows`` empty).  No check of the data: the forward checked it."""
    from sparsefill._kernels.segment_plan import Plan

    red = reducer_of(reducer)
    no_rows = offsets.new_empty(0)
    # per table, (per-position gradient rows, plan, ids) of each of its keys
    pos = [[] for _ in tables]
    with torch.no_grad():
        for j, (g, i, ids) in enumerate(zip(grads, table_of, lists)):
            x2, B = _flat(tables[i]), g.shape[0]
            plan = Plan(
                B,
                ids.shape[0],
                offsets=_key_slices(offsets, B, j),
                indices=ids,
                compiled=_kernels.compiled_for(tables[i].device, ids.shape[0] * x2.shape[1]),
            )
            pos[i].append(
                (_backward(red, plan, "split", x2, None, None, no_rows, _flat(g))[0], plan, ids)
            )
        gx, rows = [], []
        for t, parts in zip(tables, pos):
            shape = t.shape[1:]
            if sparse_grad:  # (new tensors, never views of grads; the ids: inputs, copied)
                if len(parts) == 1:
                    gx.append(parts[0][0].reshape(-1, *shape))
                    rows.append(parts[0][2].clone())
                else:  # (the keys of a shared table, or none)
                    gx.append(
                        torch.cat(
                            [g.reshape(-1, *shape) for g, _, _ in parts]
                            or [t.new_empty((0, *shape))]
                        )
                    )
                    rows.append(torch.cat([ids for _, _, ids in parts] or [no_rows]))
                continue
            m = t.shape[0]
            if len(parts) == 1:
                total = _scatter_rows(parts[0][0], parts[0][1], m)
            else:  # (the keys of a shared table: their gradient rows summed into one)
                total = t.new_zeros((m, math.prod(shape)))
                for g, p, _ in parts:
                    total.index_add_(0, p.rows, g)
            gx.append(total.reshape(t.shape))
            rows.append(no_rows.clone())
    return gx, rows


@jagged_pooled_backward.register_fake
def _(grads, tables, table_of, offsets, lists, reducer, sparse_grad):
    if not sparse_grad:
        return [t.new_empty(t.shape) for t in tables], [offsets.new_empty(0) for _ in tables]
    n = [0] * len(tables)
    for i, ids in zip(table_of, lists):
        n[i] = n[i] + ids.shape[0]
    return [t.new_empty((k, *t.shape[1:])) for t, k in zip(tables, n)], [
        offsets.new_empty(k) for k in n
    ]


def pooled_fused(tables: list, batch, keys: list[int], reducer, kw: dict):
    """``KeyedJaggedBatch.pooled``'s ``{key: out}`` by one :func:`jagged_pooled` where it applies
    (an unweighted sum, mean or sqrt_n, keywords among ``sparse_grad``, ``validate``, ``empty``),
    else None (the per-key ops). A table given for several keys is passed once (``table_of``)."""
    if not (
        tables
        and set(kw) <= {"sparse_grad", "validate", "empty"}
        and all(isinstance(t, torch.Tensor) for t in tables)
    ):
        return None
    sparse_grad, validate = bool(kw.get("sparse_grad", False)), bool(kw.get("validate", True))
    for t in tables:  # (reduce's checks of its arguments, which read no data)
        red, _, empty = _args(
            t, reducer, None, "split", sparse_grad, False, batch.values, kw.get("empty")
        )
    name = reducer_key(red)
    if name is None or red.kind != "sum" or red.weights is not None:
        return None
    distinct, table_of = distinct_tables(tables)
    outs, _, _ = jagged_pooled(
        distinct,
        batch.values,
        batch.values_lengths,
        batch.keys,
        batch.example_lengths,
        keys,
        table_of,
        name,
        float(empty),
        validate,
        sparse_grad,
    )
    return dict(zip(keys, outs))


def distinct_tables(tables: list) -> tuple[list, list[int]]:
    """``(distinct, table_of)``: the tables without repeats (by identity, first occurrence first)
    and per given table its place there: ``tables[j] is distinct[table_of[j]]``."""
    place, distinct = {}, []
    for t in tables:
        if id(t) not in place:
            place[id(t)] = len(distinct)
            distinct.append(t)
    return distinct, [place[id(t)] for t in tables]


# (its checks of the data run even where its result is unused: never dead code)
_effectful(segment_reduce_op)
# (jagged_pooled's checks too: kept as a side effect, with no effect token, which inductor cannot
# lower for its lists)
torch.fx.node.has_side_effect(torch.ops.sparsefill.jagged_pooled.default)
