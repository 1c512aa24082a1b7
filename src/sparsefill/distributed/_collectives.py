"""The collectives on SparseTensors, each one :func:`_exchange.exchange` and a local step.

Every function takes the (Python) ``ProcessGroup`` and group ranks, and writes its result into its
output tensors in place, as torch's collectives do::

    all_reduce(A, op, pg).to_dense()  == dist.all_reduce(A.to_dense(), op)     (on every rank)
    broadcast(A, root, pg)            == dist.broadcast(A.to_dense(), root)
    all_gather(outs, A, pg)           == dist.all_gather(outs, A.to_dense())   ...

A SparseTensor output takes the result's storage and fill (it keeps its identity, layout and dense
dims; a view writes through to its base); a dense output takes the result's dense values.
"""

from __future__ import annotations

import contextvars

import torch
import torch.distributed as dist

from sparsefill._tensor.parts import dense_of, dense_to_sparse, to_layout
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops._writes import assign_, respecify_
from sparsefill.distributed import _wire
from sparsefill.distributed._combine import FUNCS, check_op, combine, combine_parts, red_op
from sparsefill.distributed._exchange import exchange, traffic

_R = dist.ReduceOp.RedOpType
# set by the public all_reduce
ALGORITHM = contextvars.ContextVar("sparsefill_all_reduce_algorithm", default="auto")
# all_reduce "auto": dense when the ranks' sparse payloads exceed this times a dense ring
# all-reduce's bytes.  Not 1: the dense way costs a densify and a re-sparsify, the sparse way a
# merge that costs more per byte than the ring's sums; measured on loopback (README "Scaling out"),
# 10% stored: sparse faster at W=2 (payloads 0.3 of the ring's bytes: 30 vs 46 ms), dense faster at
# W=4 (0.6: 221 vs 93 ms)
DENSE_BYTES_RATIO = 0.5


def store(out: torch.Tensor, value: torch.Tensor) -> None:
    """Write ``value`` (same shape and dtype) into ``out`` in place."""
    if not isinstance(out, SparseTensor):
        out.copy_(_wire.dense_value(value))
        return
    if not isinstance(value, SparseTensor):
        respecify_(out, value)
    else:
        assign_(out, to_layout(value, out._sf_layout))
    if not out.is_inference():
        torch.autograd.graph.increment_version(out)
    if out._view is not None:
        from sparsefill.ops.views import write_through

        write_through(out)


def as_sparse(x: torch.Tensor, like: SparseTensor) -> SparseTensor:
    """``x`` as a SparseTensor of ``like``'s layout and dense dims (``like``'s fill, 0 for an
    indefinite one)."""
    if isinstance(x, SparseTensor):
        return x
    fill = torch.zeros((), dtype=x.dtype, device=x.device) if like._indefinite else like._fill
    return dense_to_sparse(x, fill, False, False, like._sf_layout, like.dense_dim())


def _combine_received(op, got, like: SparseTensor) -> SparseTensor:
    """``combine`` of what the ranks sent (``_wire.Parts``, SparseTensors or dense tensors) in
    ``like``'s layout."""
    if all(isinstance(g, _wire.Parts) for g in got):
        return combine_parts(op, got, like.shape, like._sparse_ndim(), like._sf_layout)
    got = [_wire.parts_to_tensor(g, like.shape) if isinstance(g, _wire.Parts) else g for g in got]
    return combine(op, [as_sparse(g, like) for g in got], like._sf_layout)


def _reduce_into(out, op, received) -> None:
    if isinstance(out, SparseTensor):
        store(out, combine(op, [as_sparse(r, out) for r in received], out._sf_layout))
        return
    dense = [_wire.dense_value(r) for r in received]
    acc = dense[0].clone()
    for d in dense[1:]:
        acc = FUNCS[red_op(op)](acc, d)
    store(out, acc / len(dense) if red_op(op) == _R.AVG else acc)


# ---------------------------------------------------------------------- all_reduce
def all_reduce(A, op, pg, algorithm: str = "auto") -> None:
    """In place on every rank: ``A`` becomes the element-wise reduction of the ranks' ``A``.

    ``algorithm``: ``"sparse"`` moves the stored elements (each rank all-gathers the others' and
    merges them, :func:`_combine.combine`: the union pattern); ``"dense"`` all-reduces
    ``A.to_dense()`` and re-specifies the result against the reduced fill; ``"auto"`` takes the
    dense way when the ranks' sparse payloads add up to more than ``DENSE_BYTES_RATIO`` times a ring
    all-reduce's bytes (``2 (W-1) numel * itemsize``), never for an indefinite fill, nor for MIN/MAX
    where a rank holds a NaN (the sparse way propagates NaN as ``torch.minimum``; a backend's dense
    min/max may skip it)."""
    W = pg.size()
    op = red_op(op)
    if algorithm not in ("auto", "sparse", "dense"):
        raise ValueError(f"algorithm must be 'auto', 'sparse' or 'dense', got {algorithm!r}")

    def go_dense(allh):
        check_op(op, A.dtype)
        if any(allh[:, W, _wire.INDEFINITE]):
            if algorithm == "dense":
                raise ValueError(
                    "sparsefill.distributed.all_reduce(algorithm='dense'): an indefinite fill "
                    "has no dense form; use algorithm='sparse' or 'auto'"
                )
            return False
        if algorithm == "dense":
            return True
        # (backends' min/max may skip NaN)
        if op in (_R.MIN, _R.MAX) and allh[:, 0, _wire.HAS_NAN].any():
            return False
        sparse_bytes = int(
            allh[:, :, _wire.NBYTES].sum() - allh.diagonal(0, 0, 1)[_wire.NBYTES].sum()
        )
        return algorithm == "auto" and sparse_bytes > DENSE_BYTES_RATIO * dense_bytes(A, W)

    allh, got = exchange(
        pg,
        "all_reduce",
        [A] * W,
        [A] * W,
        int(op),
        go_dense,
        keys=True,
        nan=algorithm == "auto" and op in (_R.MIN, _R.MAX),
    )
    if got is None:
        return _dense_all_reduce(A, op, pg, allh)
    store(A, _combine_received(op, got, A))


def dense_bytes(A, W: int) -> int:
    """Bytes all ranks send in a ring all-reduce of ``A.to_dense()``: ``2 (W-1) numel *
    itemsize``."""
    return 2 * (W - 1) * A.numel() * A.element_size()


def _dense_all_reduce(A, op, pg, allh) -> None:
    W = pg.size()
    native = dist.ReduceOp.SUM if op == _R.AVG else dist.ReduceOp(op)
    x = dense_of(A)
    fill = A._fill.expand(A._dense_shape).contiguous()
    dist.all_reduce(x, native, group=pg)
    dist.all_reduce(fill, native, group=pg)
    if op == _R.AVG:
        x, fill = x / W, fill / W
    if not allh[:, W, _wire.FILL_NDIM].any():  # every rank's fill a scalar: so is the result's
        fill = fill.reshape(-1)[0].clone() if fill.numel() else fill.new_zeros(())
    traffic.sent += dense_bytes(A, W) // W
    traffic.received += dense_bytes(A, W) // W
    store(A, dense_to_sparse(x, fill, False, False, A._sf_layout, A.dense_dim()))


# ---------------------------------------------------------------------- one to all, all to one
def broadcast(A, root: int, pg) -> None:
    """``A`` on every rank becomes the root's ``A``."""
    W, me = pg.size(), pg.rank()
    sends = [A if me == root and j != root else None for j in range(W)]
    expects = [A if j == root and me != root else None for j in range(W)]
    _, got = exchange(pg, "broadcast", sends, expects, root)
    if me != root:
        store(A, got[root])


def reduce(A, op, root: int, pg) -> None:
    """``A`` on the root becomes the reduction of the ranks' ``A`` (the others' are unchanged)."""
    W, me = pg.size(), pg.rank()
    op = red_op(op)
    expects = [A if me == root else None] * W
    _, got = exchange(
        pg,
        "reduce",
        [A if j == root else None for j in range(W)],
        expects,
        int(op) * 1024 + root,
        lambda h: check_op(op, A.dtype),
    )
    if me == root:
        _reduce_into(A, op, got)


def all_gather(outputs, A, pg) -> None:
    """``outputs[j]`` on every rank becomes rank ``j``'s ``A``."""
    W = pg.size()
    _check_len("all_gather", "tensor_list", outputs, W)
    _, got = exchange(pg, "all_gather", [A] * W, list(outputs))
    for out, g in zip(outputs, got):
        store(out, g)


def gather(outputs, A, root: int, pg) -> None:
    """``outputs[j]`` on the root becomes rank ``j``'s ``A``."""
    W, me = pg.size(), pg.rank()
    if me == root:
        _check_len("gather", "gather_list", outputs, W)
    _, got = exchange(
        pg,
        "gather",
        [A if j == root else None for j in range(W)],
        list(outputs) if me == root else [None] * W,
        root,
    )
    if me == root:
        for out, g in zip(outputs, got):
            store(out, g)


def scatter(out, inputs, root: int, pg) -> None:
    """``out`` on rank ``j`` becomes the root's ``inputs[j]``."""
    W, me = pg.size(), pg.rank()
    if me == root:
        _check_len("scatter", "scatter_list", inputs, W)
    _, got = exchange(
        pg,
        "scatter",
        list(inputs) if me == root else [None] * W,
        [out if j == root else None for j in range(W)],
        root,
    )
    store(out, got[root])


def gathered(A, pg) -> list:
    """The ranks' ``A``, in rank order (new tensors)."""
    W = pg.size()
    return exchange(pg, "all_gather_into_tensor", [A] * W, [A] * W)[1]


def all_gather_into_tensor(out, A, pg) -> None:
    """``out`` (``(W * n, ...)`` or ``(W, n, ...)``) becomes the ranks' ``A`` concatenated (or
    stacked)."""
    got = gathered(A, pg)
    stacked = out.dim() == A.dim() + 1
    store(out, torch.stack(got) if stacked else torch.cat(got))


# ---------------------------------------------------------------------- all to all
def reduce_scatter(out, inputs, op, pg) -> None:
    """``out`` on rank ``j`` becomes the reduction over the ranks of their ``inputs[j]``."""
    W = pg.size()
    op = red_op(op)
    _check_len("reduce_scatter", "input_list", inputs, W)
    _, got = exchange(
        pg, "reduce_scatter", list(inputs), [out] * W, int(op), lambda h: check_op(op, out.dtype)
    )
    _reduce_into(out, op, got)


def reduce_scatter_tensor(out, A, op, pg) -> None:
    """``reduce_scatter`` of ``A``'s ``W`` blocks along its first dim (TorchRec's row-wise
    shards)."""
    W = pg.size()
    n = out.shape[0] if out.dim() else 0
    if A.dim() == 0 or A.shape[0] != W * n:
        raise ValueError(
            f"reduce_scatter_tensor: input of shape {tuple(A.shape)} must have W * "
            f"output.shape[0] = {W} * {n} rows"
        )
    reduce_scatter(out, [A[j * n : (j + 1) * n] for j in range(W)], op, pg)


def all_to_all(outputs, inputs, pg) -> None:
    """``outputs[i]`` on rank ``j`` becomes rank ``i``'s ``inputs[j]``."""
    W = pg.size()
    _check_len("all_to_all", "input_tensor_list", inputs, W)
    _check_len("all_to_all", "output_tensor_list", outputs, W)
    _, got = exchange(pg, "all_to_all", list(inputs), list(outputs))
    for out, g in zip(outputs, got):
        store(out, g)


def all_to_all_single(out, A, out_splits, in_splits, pg) -> None:
    """``all_to_all`` of ``A``'s blocks along dim 0 (``in_splits`` rows each; equal when empty) into
    ``out``."""
    W = pg.size()
    ins = _blocks(A, in_splits, W, "input")
    outs = _blocks(out, out_splits, W, "output")
    _, got = exchange(pg, "all_to_all_single", ins, outs)
    store(out, torch.cat(got) if out.dim() else got[0])


def _blocks(T, splits, W, name):
    splits = list(splits or [])
    if not splits:
        if T.dim() == 0 or T.shape[0] % W:
            raise ValueError(
                f"all_to_all_single: {name} of shape {tuple(T.shape)} has no first dim divisible "
                f"by the world size {W}; pass {name}_split_sizes"
            )
        splits = [T.shape[0] // W] * W
    if len(splits) != W or sum(splits) != T.shape[0]:
        raise ValueError(
            f"all_to_all_single: {name}_split_sizes {splits} must have {W} entries summing to "
            f"{name}.shape[0] = {T.shape[0]}"
        )
    at = [0]
    for s in splits:
        at.append(at[-1] + s)
    return [T[at[j] : at[j + 1]] for j in range(W)]


def _check_len(fn: str, name: str, xs, W: int) -> None:
    if len(xs) != W:
        raise ValueError(
            f"sparsefill.distributed.{fn}: {name} has {len(xs)} tensors, the group has {W} ranks"
        )


# ---------------------------------------------------------------------- point to point
def send(A, dst: int, pg, tag: int = 0) -> None:
    """Send ``A`` to group rank ``dst`` (which calls :func:`recv`): header, the receiver's header
    back (both check them: a mismatch raises on both sides), then the stored elements."""
    h, payload = _wire.pack(A, _exchange_call(), 0)
    peer = torch.empty_like(h, device=A.device)
    pg.send([h.to(A.device)], dst, tag).wait()
    pg.recv([peer], dst, tag).wait()
    _p2p_check(h, peer.cpu(), pg.rank(), dst)
    if payload.numel():
        pg.send([payload.to(A.device)], dst, tag).wait()
    traffic.sent += payload.numel() + h.numel() * 8
    traffic.received += h.numel() * 8


def recv(A, src: int, pg, tag: int = 0) -> None:
    """Receive into ``A`` what group rank ``src`` sends (:func:`send`)."""
    mine = _wire.describe(A, _exchange_call(), 0)
    h = torch.empty_like(mine).to(A.device)
    pg.recv([h], src, tag).wait()
    pg.send([mine.to(A.device)], src, tag).wait()
    h = h.cpu()
    _p2p_check(h, mine, src, pg.rank())
    buf = torch.empty(int(h[_wire.NBYTES]), dtype=torch.uint8, device=A.device)
    if buf.numel():
        pg.recv([buf], src, tag).wait()
    traffic.sent += mine.numel() * 8
    traffic.received += buf.numel() + mine.numel() * 8
    store(A, _wire.unpack(h, buf, A.shape, A.device))


def _exchange_call() -> int:
    from sparsefill.distributed._exchange import call_code

    return call_code("send/recv")


def _p2p_check(s, e, src, dst) -> None:
    bad = _wire.mismatch(s, e)
    if bad is not None:
        err, why = bad
        raise err(
            f"sparsefill.distributed.send/recv: rank {src} sends {_wire.what(s)} where rank "
            f"{dst} expects {_wire.what(e)}: {why}"
        )
