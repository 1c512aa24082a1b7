"""Handlers of the ``c10d`` ops, so that torch's own calls work on SparseTensors in place::

    dist.all_reduce(A); dist.broadcast(A, 0); dist.all_gather(outs, A); dist.send(A, 1) ...

``torch.distributed``'s Python functions call ``ProcessGroup`` methods, which reach
``__torch_dispatch__`` as ``c10d.allreduce_(tensors, process_group, reduce_op, ...)`` with the group
and the op boxed; each handler unboxes them, runs the collective of ``_collectives.py`` and returns
what the schema returns, with a completed ``Work`` (the sparse exchange runs at the call: its
message sizes depend on the counts it exchanges first, so ``async_op=True`` gives a handle that is
already done).  Multi-tensor lists (one tensor per local device, a deprecated form) are refused, as
is ``recv`` from any source.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from sparsefill.ops.registry import register
from sparsefill.distributed import _collectives as C

c10d = torch.ops.c10d


def _bind(func, args, kwargs) -> dict:
    out = {}
    for i, a in enumerate(func._schema.arguments):
        out[a.name] = args[i] if i < len(args) else kwargs.get(a.name, a.default_value)
    return out


def _work(result):
    fut = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut).boxed()


def _one(func, tensors, name="tensors"):
    if len(tensors) != 1:
        raise ValueError(
            f"sparsefill.distributed: {func} got {len(tensors)} tensors in '{name}'; "
            "SparseTensors go one per call (one device per process)"
        )
    t = tensors[0]
    if hasattr(t, "_sync"):
        t._sync()
    return t


def _pg(a):
    return dist.ProcessGroup.unbox(a["process_group"])


@register(c10d.allreduce_.default)
def _allreduce(func, args, kwargs):
    a = _bind(func, args, kwargs)
    if a["sparse_indices"] is not None:
        raise ValueError(
            f"sparsefill.distributed: {func} with sparse_indices is torch's native sparse path; a "
            "SparseTensor carries its own indices"
        )
    C.all_reduce(_one(func, a["tensors"]), a["reduce_op"], _pg(a), C.ALGORITHM.get())
    return a["tensors"], _work(a["tensors"])


@register(c10d.allreduce_coalesced_.default)
def _allreduce_coalesced(func, args, kwargs):
    a = _bind(func, args, kwargs)
    for t in a["tensors"]:
        C.all_reduce(t, a["reduce_op"], _pg(a), C.ALGORITHM.get())
    return _work(a["tensors"])


@register(c10d.broadcast_.default)
def _broadcast(func, args, kwargs):
    a = _bind(func, args, kwargs)
    C.broadcast(_one(func, a["tensors"]), a["root_rank"], _pg(a))
    return a["tensors"], _work(a["tensors"])


@register(c10d.reduce_.default)
def _reduce(func, args, kwargs):
    a = _bind(func, args, kwargs)
    C.reduce(_one(func, a["tensors"]), a["reduce_op"], a["root_rank"], _pg(a))
    return _work(a["tensors"])


@register(c10d.allgather_.default)
def _allgather(func, args, kwargs):
    a = _bind(func, args, kwargs)
    C.all_gather(
        _one(func, a["output_tensors"], "output_tensors"),
        _one(func, a["input_tensors"], "input_tensors"),
        _pg(a),
    )
    return a["output_tensors"], _work(a["output_tensors"])


@register(c10d.allgather_coalesced_.default)
def _allgather_coalesced(func, args, kwargs):
    a = _bind(func, args, kwargs)
    for outs, t in zip(a["output_lists"], a["input_list"]):
        C.all_gather(outs, t, _pg(a))
    return _work(a["output_lists"])


@register(c10d._allgather_base_.default)
def _allgather_base(func, args, kwargs):
    a = _bind(func, args, kwargs)
    C.all_gather_into_tensor(a["output_tensor"], a["input_tensor"], _pg(a))
    return a["output_tensor"], _work([a["output_tensor"]])


@register(c10d.allgather_into_tensor_coalesced_.default)
def _allgather_into_tensor_coalesced(func, args, kwargs):
    a = _bind(func, args, kwargs)
    for out, t in zip(a["outputs"], a["inputs"]):
        C.all_gather_into_tensor(out, t, _pg(a))
    return _work(a["outputs"])


@register(c10d.gather_.default)
def _gather(func, args, kwargs):
    a = _bind(func, args, kwargs)
    outs = a["output_tensors"]
    C.gather(
        outs[0] if outs else [],
        _one(func, a["input_tensors"], "input_tensors"),
        a["root_rank"],
        _pg(a),
    )
    return _work(outs)


@register(c10d.scatter_.default)
def _scatter(func, args, kwargs):
    a = _bind(func, args, kwargs)
    ins = a["input_tensors"]
    C.scatter(
        _one(func, a["output_tensors"], "output_tensors"),
        ins[0] if ins else [],
        a["root_rank"],
        _pg(a),
    )
    return a["output_tensors"], _work(a["output_tensors"])


@register(c10d.reduce_scatter_.default)
def _reduce_scatter(func, args, kwargs):
    a = _bind(func, args, kwargs)
    C.reduce_scatter(
        _one(func, a["output_tensors"], "output_tensors"),
        _one(func, a["input_tensors"], "input_tensors"),
        a["reduce_op"],
        _pg(a),
    )
    return a["output_tensors"], _work(a["output_tensors"])


@register(c10d._reduce_scatter_base_.default)
def _reduce_scatter_base(func, args, kwargs):
    a = _bind(func, args, kwargs)
    C.reduce_scatter_tensor(a["output_tensor"], a["input_tensor"], a["reduce_op"], _pg(a))
    return a["output_tensor"], _work([a["output_tensor"]])


@register(c10d.reduce_scatter_tensor_coalesced_.default)
def _reduce_scatter_tensor_coalesced(func, args, kwargs):
    a = _bind(func, args, kwargs)
    for out, t in zip(a["outputs"], a["inputs"]):
        C.reduce_scatter_tensor(out, t, a["reduce_op"], _pg(a))
    return _work(a["outputs"])


@register(c10d.alltoall_.default)
def _alltoall(func, args, kwargs):
    a = _bind(func, args, kwargs)
    C.all_to_all(a["output_tensors"], a["input_tensors"], _pg(a))
    return a["output_tensors"], _work(a["output_tensors"])


@register(c10d.alltoall_base_.default)
def _alltoall_base(func, args, kwargs):
    a = _bind(func, args, kwargs)
    C.all_to_all_single(
        a["output"], a["input"], a["output_split_sizes"], a["input_split_sizes"], _pg(a)
    )
    return _work([a["output"]])


@register(c10d.send.default)
def _send(func, args, kwargs):
    a = _bind(func, args, kwargs)
    C.send(_one(func, a["tensors"]), a["dst"], _pg(a), a["tag"])
    return _work(a["tensors"])


@register(c10d.recv_.default)
def _recv(func, args, kwargs):
    a = _bind(func, args, kwargs)
    C.recv(_one(func, a["tensors"]), a["src"], _pg(a), a["tag"])
    return _work(a["tensors"])


@register(c10d.recv_any_source_.default)
def _recv_any(func, args, kwargs):
    raise NotImplementedError(
        "sparsefill.distributed: recv into a SparseTensor needs its source rank (src=...): the "
        "sender and the receiver compare their tensors before the stored elements move"
    )
