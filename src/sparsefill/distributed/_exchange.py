"""The one exchange every sparse collective is made of: headers first, then the payloads.

    received[j] == what rank j sent to this rank        (for every j of the group)

1. every rank all-gathers a small int64 block: the header (``_wire.describe``) of what it sends to
   each rank and of what it expects from each rank, with the call and its argument (the reduce op,
   the root);
2. every rank checks every pair ``(i, j)`` on that same block, so a mismatch (another call, shape,
   dtype, layout) raises the **same** error on every rank and nothing is modified, nothing hangs;
3. the payloads (``_wire.pack``: stored elements, never the dense tensor) move with one
   ``all_to_all_single`` of bytes whose splits every rank read from the headers.

``traffic`` counts the bytes this process sent and received to and from the other ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from sparsefill.distributed import _wire
from sparsefill.distributed._wire import H, NBYTES, PRESENT, CALL, CALL_ARG

CALLS = [
    "",
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "reduce",
    "gather",
    "scatter",
    "send/recv",
]


@dataclass
class Traffic:
    """Bytes this process sent to and received from other ranks in sparsefill's collectives (headers
    included; a dense path counts the ring all-reduce estimate ``2 (W-1)/W`` times the tensor's
    bytes)."""

    sent: int = 0
    received: int = 0
    calls: int = 0

    def reset(self) -> None:
        self.sent = self.received = self.calls = 0


traffic = Traffic()
# (renamed in torch 2.13)
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def call_code(name: str) -> int:
    return CALLS.index(name)


def exchange(
    pg, name: str, sends, expects, arg: int = 0, decide=None, keys: bool = False, nan: bool = False
):
    """``(headers (W, 2W, H), received)``: ``received[j]`` is what rank ``j`` sent here (``None``
    where it sends nothing; ``keys``: a SparseTensor as its ``_wire.Parts`` where it can).
    ``sends[j]``/``expects[j]`` are this rank's tensors for rank ``j`` (None: nothing); ``decide``
    ``(headers) -> bool`` may stop after the check (no payload moves: ``received`` is None);
    ``nan``: each header says whether its tensor holds a NaN."""
    W, me = pg.size(), pg.rank()
    call = call_code(name)
    memo: dict = {}  # (all_reduce and all_gather send one tensor to every rank: packed once)
    for T in sends:
        if id(T) not in memo:
            memo[id(T)] = _wire.pack(T, call, arg, nan)
    packed = [memo[id(T)] for T in sends]
    mine = torch.stack([h for h, _ in packed] + [_wire.describe(E, call, arg) for E in expects])
    device = _device(sends, expects)
    allh = torch.empty((W * 2 * W, H), dtype=torch.int64, device=device)
    _ALL_GATHER(allh, mine.to(device), group=pg)
    allh = allh.cpu().view(W, 2 * W, H)
    traffic.sent += mine.numel() * 8 * (W - 1)
    traffic.received += mine.numel() * 8 * (W - 1)
    traffic.calls += 1
    check(name, allh)
    if decide is not None and decide(allh):
        return allh, None
    payload = torch.cat([p for _, p in packed]).to(device)
    in_splits = [p.numel() for _, p in packed]
    out_splits = [int(allh[j, me, NBYTES]) for j in range(W)]
    out = torch.empty(sum(out_splits), dtype=torch.uint8, device=device)
    dist.all_to_all_single(out, payload, out_splits, in_splits, group=pg)
    traffic.sent += sum(in_splits) - in_splits[me]
    traffic.received += sum(out_splits) - out_splits[me]
    received, at = [], 0
    for j, n in enumerate(out_splits):
        E = expects[j]
        received.append(
            _wire.unpack(allh[j, me], out[at : at + n], E.shape, E.device, keys=keys)
            if allh[j, me, PRESENT]
            else None
        )
        at += n
    return allh, received


def _device(sends, expects):
    for T in (*sends, *expects):
        if T is not None:
            return T.device
    return torch.device("cpu")


def check(name: str, allh: torch.Tensor) -> None:
    """Raise, identically on every rank, when the ranks' calls or tensors do not fit together."""
    W = allh.shape[0]
    calls = allh[:, 0, [CALL, CALL_ARG]]
    for i in range(1, W):
        if not torch.equal(calls[i], calls[0]):
            raise ValueError(
                "sparsefill.distributed: the ranks make different calls: rank 0 calls "
                f"{_call(calls[0])} and rank {i} calls {_call(calls[i])}; every rank of the "
                "group must make the same collective call"
            )
    for i in range(W):
        for j in range(W):
            s, e = allh[i, j], allh[j, W + i]
            bad = _wire.mismatch(s, e)
            if bad is not None:
                err, why = bad
                raise err(
                    f"sparsefill.distributed.{name}: rank {i} sends {_wire.what(s)} where rank "
                    f"{j} expects {_wire.what(e)}: {why}"
                )


def _call(c) -> str:
    return f"{CALLS[int(c[0])]}(arg {int(c[1])})"
