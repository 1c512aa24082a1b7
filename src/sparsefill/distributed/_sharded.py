"""A row-sharded embedding table: ``num_embeddings x D`` split by rows over the ranks (TorchRec's
row-wise sharding), pooled per bag as ``nn.EmbeddingBag`` and ``segment.reduce``.

Rank ``r`` owns rows ``[r * R, (r + 1) * R)``, ``R = ceil(num_embeddings / W)``.  A forward on this
rank's bags:

1. the ids are bucketed by owner; counts first (``all_to_all_single``, with a status word: an id out
   of range or a table configured differently raises the same error on every rank), then the ids;
2. ``pool="owner"`` (the default for ``mode`` sum and mean: TorchRec's row-wise pooling): each id
   travels with its bag, owners sum their rows per (requester, bag) and send back the partial sums,
   summed here; ``pool="requester"`` (any ``segment.reduce`` mode): owners send back the rows,
   pooled here;
3. backward sends the gradient rows back to their owners, whose shard gets a sparse COO gradient
   (one row per id looked up: what ``segment.SparseAdagrad`` / ``rowwise_sparse_adagrad`` consume).

With ``average_grad=True`` (default) the shard's gradient is the mean over the ranks, as DDP
averages dense gradients: ``W`` ranks each with a mean loss over their ``B`` bags then equal, step
for step, one process with the unsharded table on the ``W * B`` bags and the same row-sparse
optimizer::

    emb = RowShardedEmbeddingBag.from_pretrained(table)         # every rank the same full table, or
    emb = RowShardedEmbeddingBag(num_embeddings, D)              # each rank initialises its shard
    pooled = emb(ids, lengths=lengths)                           # (bags of this rank, D)
    pooled = emb.forward_jagged(batch)                           # KeyedJaggedBatch -> {key: (B, D)}
    opt = sparsefill.segment.SparseAdagrad([emb.weight], lr=0.1)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.types import Device

from sparsefill import segment
from sparsefill.distributed._exchange import _ALL_GATHER, traffic

if TYPE_CHECKING:
    from sparsefill.segment import KeyedJaggedBatch


class RowShardedEmbeddingBag(nn.Module):
    """``nn.EmbeddingBag``-like pooling over a table whose rows are split over ``group`` (see the
    module docstring).  ``weight`` is this rank's shard, ``(hi - lo, embedding_dim)`` for rows
    ``[lo, hi)``."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        mode: str = "sum",
        pool: str | None = None,
        group: dist.ProcessGroup | None = None,
        average_grad: bool = True,
        dtype: torch.dtype | None = None,
        device: Device = None,
        _shard: Any = None,
    ) -> None:
        super().__init__()
        # (owners pool sums and means: fewer bytes, no id-sized gradient back; measured faster)
        if pool is None:
            pool = "owner" if mode in ("sum", "mean") else "requester"
        if pool not in ("requester", "owner"):
            raise ValueError(f"pool must be 'requester' or 'owner', got {pool!r}")
        if pool == "owner" and mode not in ("sum", "mean"):
            raise ValueError(
                f"pool='owner' pools partial sums at the owners: mode must be 'sum' or 'mean', got "
                f"{mode!r}"
            )
        self.pool = pool
        if num_embeddings < 0 or embedding_dim < 0:
            raise ValueError(
                f"num_embeddings and embedding_dim must be >= 0, got {num_embeddings}, "
                f"{embedding_dim}"
            )
        self.num_embeddings, self.embedding_dim, self.mode = num_embeddings, embedding_dim, mode
        self.group, self.average_grad = group, average_grad
        W, r = dist.get_world_size(group), dist.get_rank(group)
        self.rows_per_rank = max(1, math.ceil(num_embeddings / W)) if W else 0
        R = self.rows_per_rank
        self.lo, self.hi = min(num_embeddings, r * R), min(num_embeddings, (r + 1) * R)
        if _shard is None:
            _shard = torch.empty(
                self.hi - self.lo, embedding_dim, dtype=dtype, device=device
            ).normal_()
        self.weight = nn.Parameter(_shard)

    @classmethod
    def from_pretrained(
        cls, embeddings: torch.Tensor, *, freeze: bool = False, **kw: Any
    ) -> RowShardedEmbeddingBag:
        """This rank's rows of ``embeddings`` (the full ``num_embeddings x D`` table, the same on
        every rank)."""
        if embeddings.dim() != 2:
            raise ValueError(
                f"embeddings must be 2-D (num_embeddings, embedding_dim), got shape "
                f"{tuple(embeddings.shape)}"
            )
        N, D = embeddings.shape
        W, r = dist.get_world_size(kw.get("group")), dist.get_rank(kw.get("group"))
        R = max(1, math.ceil(N / W))
        m = cls(N, D, _shard=embeddings.detach()[min(N, r * R) : min(N, (r + 1) * R)].clone(), **kw)
        m.weight.requires_grad_(not freeze)
        return m

    def full_weight(self) -> torch.Tensor:
        """The whole table, gathered from every rank (for checks and checkpoints: O(num_embeddings *
        D))."""
        W, R = dist.get_world_size(self.group), self.rows_per_rank
        pad = self.weight.detach().new_zeros(R, self.embedding_dim)
        pad[: self.hi - self.lo] = self.weight.detach()
        out = pad.new_empty(W * R, self.embedding_dim)
        _ALL_GATHER(out, pad, group=self.group)
        return out[: self.num_embeddings]

    def forward(
        self,
        input: torch.Tensor,
        offsets: torch.Tensor | None = None,
        *,
        lengths: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Pooled bags ``(B, D)``: ``input`` 2-D ``(B, L)`` (a bag per row), or 1-D with ``offsets``
        (each bag's start, as ``nn.EmbeddingBag``) or ``lengths``."""
        if input.dim() == 2:
            if offsets is not None or lengths is not None:
                raise ValueError("a 2-D input is one bag per row: pass no offsets or lengths")
            lengths = torch.full(
                (input.shape[0],), input.shape[1], dtype=torch.int64, device=input.device
            )
            input = input.reshape(-1)
        elif (offsets is None) == (lengths is None):
            raise ValueError("a 1-D input needs exactly one of offsets (bag starts) and lengths")
        elif offsets is not None:
            lengths = torch.diff(
                offsets.long(), append=torch.tensor([input.numel()], device=offsets.device)
            )
        assert lengths is not None  # (one of offsets and lengths is given: checked above)
        return self._pool(
            input,
            segment.lengths_to_offsets(lengths.long())
            if lengths.numel()
            else torch.zeros(1, dtype=torch.int64, device=input.device),
        )

    def forward_jagged(
        self, batch: KeyedJaggedBatch, keys: Sequence[int] | None = None
    ) -> dict[int, torch.Tensor]:
        """``{key: (B, D)}`` for a ``KeyedJaggedBatch``: every key's ids of every example pooled,
        one exchange for all keys (a missing key: the empty bag)."""
        keys = sorted(set(batch.keys.tolist())) if keys is None else [int(k) for k in keys]
        offsets, ids, _ = batch._by_key(keys)
        pooled = self._pool(ids, offsets)
        B = batch.batch_size
        return {k: pooled[j * B : (j + 1) * B] for j, k in enumerate(keys)}

    def _pool(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        ids = ids.long().reshape(-1)
        if self.pool == "owner":
            return self._pool_at_owners(ids, offsets)
        perm, send, recv, local = _route(self, ids)
        rows = _Rows.apply(self.weight, local, send, recv, self.group, self.average_grad)
        inv = torch.empty_like(perm).scatter_(
            0, perm, torch.arange(perm.numel(), device=perm.device)
        )
        return segment.reduce(rows, self.mode, offsets=offsets, indices=inv)

    def _pool_at_owners(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """``pool='owner'``: each id goes with its bag; owners sum their rows per (requester, bag)
        and send back the partial sums (TorchRec's row-wise pooling: fewer bytes back when bags hold
        several ids of one owner), summed here per bag."""
        nb = offsets.numel() - 1
        lengths = offsets[1:] - offsets[:-1]
        bag = torch.repeat_interleave(
            torch.arange(nb, device=ids.device), lengths, output_size=ids.numel()
        )
        perm, send, recv, local, asked_bag = _route(self, ids, bag)
        W = dist.get_world_size(self.group)
        src = torch.repeat_interleave(
            torch.arange(W, device=ids.device), recv, output_size=local.numel()
        )
        # (requester, bag) pairs
        uniq, inv = torch.unique(src * (1 << 32) + asked_bag, return_inverse=True)
        back = torch.bincount(torch.div(uniq, 1 << 32, rounding_mode="floor"), minlength=W)
        got = torch.empty(W, dtype=torch.int64, device=ids.device)
        dist.all_to_all_single(got, back, group=self.group)
        bags = uniq.new_empty(int(got.sum()))
        dist.all_to_all_single(
            bags, uniq % (1 << 32), got.tolist(), back.tolist(), group=self.group
        )
        traffic.sent += 8 * (int(back.sum()) - int(back[dist.get_rank(self.group)]))
        partial = _Partial.apply(
            self.weight, local, inv, uniq.numel(), back, got, self.group, self.average_grad
        )
        out = partial.new_zeros(nb, self.embedding_dim).index_add(0, bags, partial)
        return out / lengths.clamp(min=1)[:, None].to(out.dtype) if self.mode == "mean" else out

    def extra_repr(self) -> str:
        return (
            f"{self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}, rows [{self.lo}, "
            f"{self.hi}) of {dist.get_world_size(self.group)} shards"
        )


def _route(emb, ids: torch.Tensor, bag: torch.Tensor | None = None):
    """``(perm, send counts, receive counts, local ids asked of this rank)``: ids sorted by owner,
    the counts and a status word exchanged first, then the ids."""
    W, R, N = dist.get_world_size(emb.group), emb.rows_per_rank, emb.num_embeddings
    bad = (ids < 0) | (ids >= N)
    first_bad = int(ids[bad][0]) if bool(bad.any()) else 0
    owner = torch.div(ids, R, rounding_mode="floor").clamp_(0, W - 1)
    send = torch.bincount(owner, minlength=W)
    perm = torch.argsort(owner, stable=True)
    status = torch.tensor(
        [0, int(bool(bad.any())), first_bad, N, emb.embedding_dim, R], dtype=torch.int64
    )
    out = torch.empty(W, 6, dtype=torch.int64, device=ids.device)
    dist.all_to_all_single(
        out,
        torch.cat([send[:, None], status.to(ids.device).expand(W, 6)[:, 1:]], 1),
        group=emb.group,
    )
    out = out.cpu()
    for j in range(W):
        if int(out[j, 1]):
            raise IndexError(
                f"RowShardedEmbeddingBag: rank {j} looks up id {int(out[j, 2])}, out of range for "
                f"{N} embeddings"
            )
    for j in range(W):
        if out[j, 3:].tolist() != out[0, 3:].tolist():
            raise ValueError(
                f"RowShardedEmbeddingBag: the ranks' tables differ: rank 0 has (num_embeddings, "
                f"embedding_dim) = {tuple(out[0, 3:5].tolist())}, rank {j} "
                f"{tuple(out[j, 3:5].tolist())}"
            )
    recv = out[:, 0].to(ids.device)
    k = 1 if bag is None else 2  # (with bags: each id travels with its bag)
    sent = ids[perm] if bag is None else torch.stack([ids[perm], bag[perm]], 1)
    asked = ids.new_empty((int(recv.sum()),) + sent.shape[1:])
    dist.all_to_all_single(asked, sent, recv.tolist(), send.tolist(), group=emb.group)
    me = dist.get_rank(emb.group)
    traffic.sent += 8 * k * (int(send.sum()) - int(send[me])) + 48 * (W - 1)
    traffic.received += 8 * k * (int(recv.sum()) - int(recv[me])) + 48 * (W - 1)
    if bag is None:
        return perm, send, recv, asked - emb.lo
    return perm, send, recv, asked[:, 0] - emb.lo, asked[:, 1]


class _Rows(torch.autograd.Function):
    """The rows this rank asked for, in owner order: gathered by their owners and sent back; the
    backward sends the gradient rows to the owners (a sparse COO gradient of the shard)."""

    @staticmethod
    def forward(ctx, shard, local, send, recv, group, average):
        ctx.save_for_backward(local)
        ctx.send, ctx.recv, ctx.group, ctx.average, ctx.shape = (
            send.tolist(),
            recv.tolist(),
            group,
            average,
            shard.shape,
        )
        rows = shard.index_select(0, local)
        return _swap(rows, ctx.send, ctx.recv, group)

    @staticmethod
    def backward(ctx, grad):
        (local,) = ctx.saved_tensors
        back = _swap(grad, ctx.recv, ctx.send, ctx.group)
        if ctx.average:
            back = back / dist.get_world_size(ctx.group)
        # no rank looked up a row of this shard: no gradient (the optimizer skips it)
        if not local.numel():
            return None, None, None, None, None, None
        grad_shard = torch.sparse_coo_tensor(local[None], back, ctx.shape, check_invariants=False)
        return grad_shard, None, None, None, None, None


class _Partial(torch.autograd.Function):
    """Owner side: the shard's rows summed per (requester, bag) pair (``inv``), sent back; the
    requester gets its partial sums in owner order.  Backward: each pair's gradient row goes back to
    its owner and to every id of the pair (a sparse COO gradient of the shard)."""

    @staticmethod
    def forward(ctx, shard, local, inv, npairs, back, got, group, average):
        ctx.save_for_backward(local, inv)
        ctx.back, ctx.got, ctx.group, ctx.average, ctx.shape = (
            back.tolist(),
            got.tolist(),
            group,
            average,
            shard.shape,
        )
        partial = shard.new_zeros(npairs, shard.shape[1]).index_add_(
            0, inv, shard.index_select(0, local)
        )
        return _swap(partial, ctx.got, ctx.back, group)

    @staticmethod
    def backward(ctx, grad):
        local, inv = ctx.saved_tensors
        gp = _swap(grad, ctx.back, ctx.got, ctx.group)
        if ctx.average:
            gp = gp / dist.get_world_size(ctx.group)
        if not local.numel():
            return (None,) * 8
        return (
            torch.sparse_coo_tensor(
                local[None], gp.index_select(0, inv), ctx.shape, check_invariants=False
            ),
            None,
            None,
            None,
            None,
            None,
            None,
            None,
        )


def _swap(rows: torch.Tensor, got_splits: list, sent_splits: list, group) -> torch.Tensor:
    """``all_to_all_single`` of 2-D ``rows`` (``sent_splits`` rows to each rank, ``got_splits`` from
    each), counted."""
    out = rows.new_empty(sum(got_splits), rows.shape[1])
    dist.all_to_all_single(out, rows.contiguous(), got_splits, sent_splits, group=group)
    _count(rows, out, sent_splits, got_splits, group)
    return out


def _count(sent_rows, got_rows, sent_splits, got_splits, group) -> None:
    me, width = (
        dist.get_rank(group),
        sent_rows.element_size() * (sent_rows.shape[1] if sent_rows.dim() > 1 else 1),
    )
    traffic.sent += width * (sum(sent_splits) - sent_splits[me])
    traffic.received += width * (sum(got_splits) - got_splits[me])
