"""sparsefill on ``torch.distributed``: collectives on SparseTensors, data-parallel training with
sparse gradients, row-sharded embedding tables.

Importing ``sparsefill`` is enough for torch's own collectives to work on SparseTensors, in place,
with the dense result (the ``c10d`` handlers of this package are loaded on the first collective)::

    dist.all_reduce(A)  ->  A.to_dense() == dist.all_reduce(A.to_dense()) would give
        (on every rank)

A SUM all-reduce moves the stored elements, not the dense tensor: every rank gathers the others'
``(keys, values, fill)`` and merges them into the union pattern; the fill becomes the reduced fills.
Indefinite fills reduce the ranks that define an element (masked semantics, ``_combine.py``).
Before any data moves the ranks exchange a small header and compare shapes, dtypes, layouts and
calls: a mismatch raises the same error on every rank.  This module adds options to the same calls
(``algorithm=`` of :func:`all_reduce`) and :data:`traffic`, the bytes sent and received.

>>> import torch, torch.distributed as dist, sparsefill
>>> # (one process here)
>>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
>>> A = sparsefill.sparse_coo_tensor([[0, 3]], [1., 2.], (5,), fill_value=0.5)
>>> dist.all_reduce(A, op=dist.ReduceOp.MAX)
>>> A.to_dense(), A._nse()
(tensor([1.0000, 0.5000, 0.5000, 2.0000, 0.5000]), 2)
>>> # the dense way re-specifies against the fill
>>> traffic.reset(); all_reduce(A, algorithm="dense"); A._nse()
2
>>> dist.destroy_process_group()

The functional collectives (``torch.distributed._functional_collectives``: ``all_reduce``,
``broadcast``, ``all_gather_tensor``, ``reduce_scatter_tensor``) return SparseTensors once this
module is imported (``_functional.py``; before, they compute on dense copies: dense results and a
DensifyWarning).

Training: :func:`data_parallel` (DDP for what it can bucket, gradient hooks with these collectives
for SparseTensor parameters and sparse-gradient tables; ``_ddp.py``);
:class:`RowShardedEmbeddingBag` (a table split by rows over the ranks, ids and rows moved by
``all_to_all_single``; ``_sharded.py``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

# (register the c10d and functional-collective handlers)
from sparsefill.distributed import _c10d, _functional  # noqa: F401
from sparsefill.distributed._collectives import ALGORITHM, dense_bytes  # noqa: F401
from sparsefill.distributed._combine import combine
from sparsefill.distributed._ddp import GradSync, average, data_parallel
from sparsefill.distributed._sharded import RowShardedEmbeddingBag
from sparsefill.distributed._exchange import Traffic, traffic

ReduceOp = dist.ReduceOp

__all__ = [
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "send",
    "recv",
    "reduce",
    "gather",
    "scatter",
    "combine",
    "traffic",
    "Traffic",
    "ReduceOp",
    "data_parallel",
    "GradSync",
    "average",
    "RowShardedEmbeddingBag",
]


def all_reduce(
    tensor: torch.Tensor,
    op: Any = ReduceOp.SUM,
    group: dist.ProcessGroup | None = None,
    async_op: bool = False,
    *,
    algorithm: str = "auto",
) -> Any:
    """``dist.all_reduce(tensor, op, group, async_op)`` (SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR,
    BXOR), with ``algorithm`` for a SparseTensor: ``"sparse"`` moves the stored elements (the result
    has the union pattern), ``"dense"`` all-reduces the dense tensor (the result stores what differs
    from the reduced fill), ``"auto"`` takes the dense way once the ranks' sparse payloads exceed
    half a dense ring all-reduce's bytes (``_collectives.DENSE_BYTES_RATIO``; never for an
    indefinite fill).  AVG of floating dtypes is computed as SUM / W on every backend."""
    token = ALGORITHM.set(algorithm)
    try:
        return dist.all_reduce(tensor, op, group, async_op)
    finally:
        ALGORITHM.reset(token)


broadcast = dist.broadcast
all_gather = dist.all_gather
all_gather_into_tensor = dist.all_gather_into_tensor
reduce_scatter = dist.reduce_scatter
reduce_scatter_tensor = dist.reduce_scatter_tensor
all_to_all = dist.all_to_all
all_to_all_single = dist.all_to_all_single
send, recv, reduce, gather, scatter = dist.send, dist.recv, dist.reduce, dist.gather, dist.scatter
