"""Handlers of the functional collectives (``torch.distributed._functional_collectives``, what
DTensor and ``torch.compile`` use): ``_c10d_functional.all_reduce(input, "sum", group_name)`` and
friends return a new tensor, so on a SparseTensor they return a SparseTensor::

    funcol.all_reduce(A, "sum", group).to_dense() == funcol.all_reduce(A.to_dense(), "sum", group)

(without a handler they would be computed on dense copies: correct, dense, and a DensifyWarning).
The exchange runs at the call; ``wait_tensor`` returns its input, and so does the wrapping in an
``AsyncCollectiveTensor`` (``_wrap_tensor_autograd``).  ``src`` of ``broadcast`` is a group rank
(the process group's root, as c10d's functional kernels pass it).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# (defines _c10d_functional._wrap_tensor_autograd)
import torch.distributed._functional_collectives  # noqa: F401

from sparsefill.ops.registry import register
from sparsefill.distributed import _collectives as C

F = torch.ops._c10d_functional
_OPS = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.AVG,
    "product": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "band": dist.ReduceOp.BAND,
    "bor": dist.ReduceOp.BOR,
    "bxor": dist.ReduceOp.BXOR,
}


def _pg(group):
    if isinstance(group, torch.ScriptObject):
        return dist.ProcessGroup.unbox(group)
    if isinstance(group, dist.ProcessGroup):
        return group
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(group)


def _op(name: str):
    if name.lower() not in _OPS:
        raise NotImplementedError(
            f"sparsefill.distributed: reduce_op {name!r} is not supported on SparseTensors "
            f"(supported: {', '.join(_OPS)})"
        )
    return _OPS[name.lower()]


@register(F.all_reduce.default, F.all_reduce_.default)
def _all_reduce(func, args, kwargs):
    A, op, group = args
    out = A if func is F.all_reduce_.default else A.clone()
    C.all_reduce(out, _op(op), _pg(group), C.ALGORITHM.get())
    return out


@register(F.broadcast.default, F.broadcast_.default)
def _broadcast(func, args, kwargs):
    A, src, group = args
    out = A if func is F.broadcast_.default else A.clone()
    C.broadcast(out, src, _pg(group))
    return out


@register(F.all_gather_into_tensor.default)
def _all_gather_into_tensor(func, args, kwargs):
    A, group_size, group = args
    return (
        torch.cat(C.gathered(A, _pg(group))) if A.dim() else torch.stack(C.gathered(A, _pg(group)))
    )


@register(F.reduce_scatter_tensor.default)
def _reduce_scatter_tensor(func, args, kwargs):
    A, op, group_size, group = args
    n = A.shape[0] // group_size if A.dim() else 0
    out = A[:n].clone()
    C.reduce_scatter_tensor(out, A, _op(op), _pg(group))
    return out


@register(F.wait_tensor.default, F._wrap_tensor_autograd.default)
def _wait_tensor(func, args, kwargs):
    """The result is complete at the call: no ``AsyncCollectiveTensor`` around it, nothing to wait
    for."""
    return args[0]
