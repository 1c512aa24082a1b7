"""Data-parallel training with SparseTensor parameters and sparse gradients.

``DistributedDataParallel`` buckets dense and native-sparse gradients only, and NCCL has no sparse
all-reduce.  :func:`data_parallel` therefore splits a module's parameters:

* the ones DDP can bucket (dense parameters with dense gradients: ``SparseParameter.values``,
  ``SparseLinear``'s values and bias, every ordinary layer) stay with DDP;
* SparseTensor parameters (``nn.Parameter(A)``) and the parameters named in ``sparse=`` (tables read
  by ``segment.sparse_lengths_sum(..., sparse_grad=True)``: a native sparse COO gradient) are
  excluded from DDP, broadcast from rank 0 once, and their gradients are averaged over the ranks by
  a ``register_post_accumulate_grad_hook`` as soon as backward accumulates them, with the sparse
  collectives of this package (the stored rows move, never the dense table).

Then ``k`` steps on ``W`` workers, each on its own ``B`` examples with a mean loss, equal ``k``
steps of one process on the ``W * B`` examples (the gradients are the same averages)::

    model = sparsefill.distributed.data_parallel(model, sparse=["table"])
    for batch in loader:                      # this rank's share of the batch
        opt.zero_grad(); loss_fn(model(batch)).backward(); opt.step()
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from sparsefill._tensor.parts import from_native
from sparsefill._tensor.tensor import SparseTensor


class GradSync:
    """Average the gradients of ``params`` over ``group`` as backward accumulates them (a hook per
    parameter).

    Every rank's backward must reach every parameter (as for DDP with
    ``find_unused_parameters=False``): the hooks run one collective per parameter, in the order
    backward reaches them.  ``remove()`` takes the hooks off."""

    def __init__(
        self, params: Iterable[torch.Tensor], group: dist.ProcessGroup | None = None
    ) -> None:
        self.params = list(params)
        self.group = group
        self.handles = [p.register_post_accumulate_grad_hook(self._hook) for p in self.params]

    def _hook(self, p: torch.Tensor) -> None:
        if p.grad is not None:
            p.grad = average(p.grad, self.group)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


def average(g: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """The mean of ``g`` over the ranks: in place for a SparseTensor or a dense tensor; a native
    sparse tensor comes back as a new (coalesced) native sparse tensor."""
    if isinstance(g, SparseTensor):
        dist.all_reduce(g, dist.ReduceOp.AVG, group=group)
        return g
    # torch native sparse (COO from sparse_grad=True, embedding(sparse=True))
    if g.layout is not torch.strided:
        S = from_native(g.to_sparse_coo() if g.layout is not torch.sparse_coo else g)
        from sparsefill.distributed import all_reduce

        all_reduce(S, dist.ReduceOp.AVG, group=group, algorithm="sparse")
        return torch.sparse_coo_tensor(
            S._idx, S._vals, S.shape, is_coalesced=True, check_invariants=False
        )
    dist.all_reduce(g, group=group)
    return g.div_(dist.get_world_size(group))


def data_parallel(
    module: nn.Module,
    *,
    sparse: Iterable[str] = (),
    process_group: dist.ProcessGroup | None = None,
    **ddp_kwargs: Any,
) -> nn.Module:
    """``module`` for data-parallel training: a ``DistributedDataParallel`` over the parameters it
    can bucket (``module`` itself when there are none), and a :class:`GradSync`
    (``result.sparse_grad_sync``) over the SparseTensor parameters and the parameters named in
    ``sparse`` (module-relative names, e.g. tables with sparse gradients).  Rank 0's values of the
    latter are broadcast first (DDP broadcasts the rest)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    named = dict(module.named_parameters())
    unknown = [n for n in sparse if n not in named]
    if unknown:
        raise ValueError(
            f"data_parallel: sparse= names {unknown} are not parameters of the module (it has "
            f"{list(named)[:8]}{'...' if len(named) > 8 else ''})"
        )
    mine = [n for n, p in named.items() if isinstance(p, SparseTensor) or n in set(sparse)]
    # (DDP flattens buffers)
    bufs = [n for n, b in module.named_buffers() if isinstance(b, SparseTensor)]
    src = dist.get_global_rank(process_group, 0) if process_group is not None else 0
    with torch.no_grad():
        for t in [named[n] for n in mine] + [module.get_buffer(n) for n in bufs]:
            dist.broadcast(t, src, group=process_group)
    sync = GradSync([named[n] for n in mine if named[n].requires_grad], process_group)
    if all(n in mine or not p.requires_grad for n, p in named.items()):
        out = module
    else:
        ignore = mine + bufs  # (torch 2.13's reducer spells a top-level parameter's name ".name")
        DDP._set_params_and_buffers_to_ignore_for_model(
            module, ignore + ["." + n for n in ignore if "." not in n]
        )
        out = DDP(module, process_group=process_group, **ddp_kwargs)
    setattr(out, "sparse_grad_sync", sync)  # (setattr: a GradSync is neither Tensor nor Module)
    return out
