"""``KeyedJaggedBatch``'s reads of its data as ``torch.library`` custom ops (namespace
``sparsefill::``): what torch.compile records for ``select_keys``, ``to_padded`` and ``pooled``
(``_jagged``)::

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
by two ops of one graph breaks the graph (``_custom_ops._one_sparse_grad_per_table``).  Registered
on the first import of this module (by the first traced call).
"""

from __future__ import annotations

import math

import torch
from torch.library import custom_op

from sparsefill._kernels.trace import new_dynamic_size
from sparsefill._kernels import segment as _kernels
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
from sparsefill.segment._custom_ops import _one_sparse_grad_per_table

__all__ = [
    "jagged_key_lists",
    "jagged_pooled",
    "jagged_pooled_backward",
    "pooled_fused",
    "distinct_tables",
]


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
    from sparsefill.segment._jagged_lists import key_lists

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
    from sparsefill.segment._jagged_lists import key_lists

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


# (jagged_pooled's checks of the data run even where its result is unused: kept as a side effect,
# with no effect token, which inductor cannot lower for its lists)
torch.fx.node.has_side_effect(torch.ops.sparsefill.jagged_pooled.default)
