"""torch.distributed on SparseTensors: collectives, bad inputs, several processes.

Each test spawns a gloo group on 127.0.0.1 (a free port chosen here) and runs many checks per spawn;
every spawn is bounded (a process-group timeout inside, a join deadline outside: the suite never hangs).
Oracles: the dense collective of ``A.to_dense()`` and the single-process computation (every rank can
build every rank's inputs: they are seeded by case and rank).
"""

from __future__ import annotations

import datetime
import multiprocessing
import socket
import time
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import sparsefill
import sparsefill.distributed

R = dist.ReduceOp
DEADLINE = 90  # seconds per spawn (each normally takes a few)
# the processes fork from one server that imported torch and sparsefill once (spawn re-imports them per process)
multiprocessing.set_forkserver_preload(["torch", "sparsefill", "sparsefill.distributed", __name__])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, fn, world, port, args):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=30),
    )
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def spawn(fn, world: int, *args) -> None:
    """Run ``fn(rank, world, *args)`` in ``world`` processes of one gloo group; a failure in any raises here."""
    ctx = mp.start_processes(
        _entry,
        args=(fn, world, _free_port(), args),
        nprocs=world,
        join=False,
        start_method="forkserver",
    )
    end = time.monotonic() + DEADLINE
    while not ctx.join(timeout=1):
        if time.monotonic() > end:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            pytest.fail(f"distributed test {fn.__name__} (world {world}) ran past {DEADLINE} s")


# ---------------------------------------------------------------------- inputs, seeded by (case, rank)
CASES = [
    "coo1d",
    "coo2d_f64_uncoalesced",
    "csr",
    "hybrid",
    "empty",
    "zerosize",
    "zero_d",
    "nonfinite",
    "int64",
    "bool",
    "indefinite",
    "mixed_indefinite",
]


def make(case: str, rank: int) -> sparsefill.SparseTensor:
    g = torch.Generator().manual_seed(CASES.index(case) * 100 + rank)

    def dense(shape, fill, dtype=torch.float32, p=0.3):
        x = torch.randn(shape, generator=g, dtype=torch.float64).mul(4).round().to(dtype)
        return torch.where(
            torch.rand(shape, generator=g) < p, x, torch.as_tensor(fill, dtype=dtype)
        )

    if case == "coo1d":
        return sparsefill.to_sparse(dense((12,), float(rank)), fill_value=float(rank))
    if case == "coo2d_f64_uncoalesced":
        idx = torch.randint(0, 3, (2, 6), generator=g)
        return sparsefill.sparse_coo_tensor(
            idx, torch.randn(6, generator=g, dtype=torch.float64), (3, 4), fill_value=0.5 * rank
        )
    if case == "csr":
        return sparsefill.to_sparse(
            dense((4, 5), rank - 1.0), fill_value=rank - 1.0, layout=torch.sparse_csr
        )
    if case == "hybrid":
        f = torch.tensor([float(rank), -float(rank)])
        x = torch.where(
            torch.rand(4, 3, 1, generator=g) < 0.3, torch.randn(4, 3, 2, generator=g), f
        )
        return sparsefill.to_sparse(x, fill_value=f, dense_dim=1)
    if case == "empty":
        x = dense((6,), 2.0) if rank else torch.full((6,), 2.0)
        return sparsefill.to_sparse(x, fill_value=2.0)
    if case == "zerosize":
        return sparsefill.to_sparse(torch.zeros(0, 3), fill_value=float(rank))
    if case == "zero_d":
        return sparsefill.to_sparse(torch.tensor(3.0 + rank), fill_value=0.0)
    if case == "nonfinite":
        x = dense((8,), 1.0)
        x[rank % 8] = float("nan") if rank % 2 else float("inf")
        fill = float("inf") if rank == 0 else -1.0
        return sparsefill.to_sparse(torch.where(x == 1.0, torch.tensor(fill), x), fill_value=fill)
    if case == "int64":
        return sparsefill.to_sparse(dense((3, 4), rank + 1, torch.int64), fill_value=rank + 1)
    if case == "bool":
        x = torch.rand(10, generator=g) < 0.5
        return sparsefill.to_sparse(x, fill_value=rank % 2 == 0)
    if case == "indefinite" or case == "mixed_indefinite" and rank % 2 == 0:
        return _indefinite_of(dense((3, 4), 0.0, p=0.4))
    return sparsefill.to_sparse(
        dense((3, 4), float(rank)), fill_value=float(rank)
    )  # mixed_indefinite, odd rank


def _indefinite_of(x):
    """A SparseTensor with indefinite fill storing the nonzero elements of ``x``."""
    idx = x.nonzero().T
    return sparsefill.sparse_coo_tensor(
        idx, x[tuple(idx)], x.shape, fill_value=sparsefill.indefinite
    )


FUNCS = {
    R.SUM: torch.add,
    R.AVG: torch.add,
    R.PRODUCT: torch.mul,
    R.MIN: torch.minimum,
    R.MAX: torch.maximum,
    R.BAND: torch.bitwise_and,
    R.BOR: torch.bitwise_or,
    R.BXOR: torch.bitwise_xor,
}


def ops_for(dtype):
    if dtype == torch.bool:
        return [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR]
    if dtype.is_floating_point:
        return [R.SUM, R.AVG, R.PRODUCT, R.MIN, R.MAX]
    return [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR]


def local_reduce(op, tensors):
    """The single-process oracle: ``(values, mask)`` of the element-wise reduction over ranks, masked
    semantics for indefinite fills (a rank contributes where it defines the element)."""
    vals = [T.to_dense(fill_value=0) if T.is_fill_indefinite() else T.to_dense() for T in tensors]
    masks = [_mask(T) for T in tensors]
    acc, have = vals[0].clone(), masks[0].clone()
    count = masks[0].long()
    for v, m in zip(vals[1:], masks[1:]):
        acc = torch.where(m & have, FUNCS[op](acc, v), torch.where(m, v, acc))
        have |= m
        count += m.long()
    if op == R.AVG:
        acc = acc / count.clamp(min=1)
    return acc, have


def _mask(T) -> torch.Tensor:
    if not T.is_fill_indefinite():
        return torch.ones(T.shape, dtype=torch.bool)
    ones = sparsefill.sparse_coo_tensor(
        T._indices()
        if T.sparse_layout == torch.sparse_coo
        else T.to_sparse(torch.sparse_coo)._indices(),
        torch.ones(T._nse(), dtype=torch.bool),
        T.shape,
        fill_value=False,
    )
    return ones.to_dense()


def assert_holds(R_, values, mask, msg, indefinite=None):
    """``R_`` stands for ``values`` where ``mask`` and is unspecified (indefinite fill) elsewhere."""
    if bool(mask.all()) if indefinite is None else not indefinite:
        assert not R_.is_fill_indefinite(), msg
        torch.testing.assert_close(R_.to_dense(), values, equal_nan=True, msg=msg)
    else:
        assert R_.is_fill_indefinite(), msg
        torch.testing.assert_close(_mask(R_), mask, msg=msg)
        torch.testing.assert_close(
            R_.to_dense(fill_value=0)[mask], values[mask], equal_nan=True, msg=msg
        )


# ---------------------------------------------------------------------- the collectives
def _check_all_reduce(rank, world, ops=None, algorithms=("auto", "sparse", "dense")):
    for case in CASES:
        everyone = [make(case, j) for j in range(world)]
        for op in [o for o in ops_for(everyone[0].dtype) if ops is None or o in ops]:
            for algorithm in algorithms:
                indefinite = any(T.is_fill_indefinite() for T in everyone)
                if algorithm == "dense" and indefinite:
                    continue  # (refused: tested in the bad inputs)
                A = make(case, rank)
                layout = A.sparse_layout
                msg = f"all_reduce {case} {op} {algorithm} rank {rank}"
                sparsefill.distributed.all_reduce(A, op, algorithm=algorithm)
                nan_minmax = case == "nonfinite" and op in (
                    R.MIN,
                    R.MAX,
                )  # gloo's dense min/max skip NaN
                if not (nan_minmax and algorithm == "dense"):
                    assert_holds(
                        A,
                        *local_reduce(op, everyone),
                        msg,
                        all(T.is_fill_indefinite() for T in everyone),
                    )
                assert A.sparse_layout == layout and isinstance(A, sparsefill.SparseTensor), msg
                if not indefinite and op != R.AVG and (algorithm == "dense" or not nan_minmax):
                    D = make(case, rank).to_dense()
                    dist.all_reduce(
                        D, op
                    )  # the dense collective (gloo's MIN/MAX skip NaN: not compared there)
                    torch.testing.assert_close(A.to_dense(), D, equal_nan=True, msg=msg)
    # bytes: the stored elements (8-byte key + value) and the fill to each peer, and the headers; the dense way
    # counts the ring's 2 (W-1)/W * numel * itemsize
    g = torch.Generator().manual_seed(rank)
    A = sparsefill.to_sparse(
        torch.where(torch.rand(100, 100, generator=g) < 0.01, 1.0, 0.0), fill_value=0.0
    )
    nses = [None] * world
    dist.all_gather_object(nses, A._nse())
    sd = sparsefill.distributed
    sd.traffic.reset()
    sd.all_reduce(A, algorithm="sparse")
    header = 2 * world * sd._wire.H * 8
    payload = [
        -(-(n * 12 + 4) // 8) * 8 for n in nses
    ]  # keys, values and the 4-byte fill, padded to 8
    assert sd.traffic.sent == (world - 1) * (header + payload[rank]), (sd.traffic, nses)
    assert sd.traffic.received == (world - 1) * header + sum(payload) - payload[rank]
    sd.traffic.reset()
    sd.all_reduce(A, algorithm="dense")
    assert sd.traffic.sent == (world - 1) * header + 2 * (world - 1) * 100 * 100 * 4 // world
    # the functional collectives return SparseTensors
    import torch.distributed._functional_collectives as funcol

    W = dist.group.WORLD
    for case in ("coo1d", "hybrid", "csr", "indefinite"):
        everyone = [make(case, j) for j in range(world)]
        A = make(case, rank)
        r = funcol.wait_tensor(funcol.all_reduce(A, "sum", W))
        assert isinstance(r, sparsefill.SparseTensor)
        assert_holds(
            r,
            *local_reduce(R.SUM, everyone),
            f"funcol.all_reduce {case}",
            all(T.is_fill_indefinite() for T in everyone),
        )
        assert_holds(
            A,
            *local_reduce(R.MAX, [make(case, rank)]),
            "funcol input unchanged",
            A.is_fill_indefinite(),
        )
        r = funcol.wait_tensor(funcol.broadcast(A, 1, W))
        assert_holds(
            r,
            *local_reduce(R.MAX, [everyone[1]]),
            f"funcol.broadcast {case}",
            everyone[1].is_fill_indefinite(),
        )
        if case != "indefinite":
            r = funcol.wait_tensor(funcol.all_gather_tensor(A, 0, W))
            torch.testing.assert_close(r.to_dense(), torch.cat([T.to_dense() for T in everyone]))
    X = sparsefill.to_sparse(
        torch.arange(world * 2 * 3.0).reshape(world * 2, 3) % (rank + 2), fill_value=1.0
    )
    r = funcol.wait_tensor(funcol.reduce_scatter_tensor(X, "sum", 0, W))
    full = sum(torch.arange(world * 2 * 3.0).reshape(world * 2, 3) % (j + 2) for j in range(world))
    torch.testing.assert_close(r.to_dense(), full[2 * rank : 2 * rank + 2])
    # complex: dist.all_reduce runs on torch.view_as_real(A) (a view, written through)
    C = sparsefill.sparse_coo_tensor([[rank]], torch.tensor([1 + 2j]), (4,), fill_value=1j * rank)
    D = C.to_dense()
    with warnings.catch_warnings():  # (the write through view_as_real densifies: 4 elements)
        warnings.simplefilter("ignore", sparsefill.DensifyWarning)
        dist.all_reduce(C)
    dist.all_reduce(D)
    torch.testing.assert_close(C.to_dense(), D)
    # the plain torch call on a fill of the rank, in place, and the same for a view and async_op
    B = sparsefill.sparse_coo_tensor([[0, 3]], [1.0, 2.0], (5,), fill_value=float(rank))
    same = B
    dist.all_reduce(B)
    assert B is same
    base = world * (world - 1) / 2
    torch.testing.assert_close(B.to_dense(), torch.tensor([world, base, base, 2.0 * world, base]))
    A = sparsefill.to_sparse(torch.arange(12.0).reshape(3, 4) * (rank + 1), fill_value=0.0)
    work = dist.all_reduce(A[1], async_op=True)
    work.wait()
    expect = torch.arange(12.0).reshape(3, 4) * (rank + 1)
    expect[1] = torch.arange(4.0, 8.0) * sum(range(1, world + 1))
    torch.testing.assert_close(A.to_dense(), expect)


def _check_moves(rank, world):
    """broadcast, all_gather(_into_tensor), reduce_scatter(_tensor), all_to_all(_single), reduce, gather,
    scatter, send/recv: against the dense collective or the inputs themselves."""
    for case in CASES:
        everyone = [make(case, j) for j in range(world)]
        A = make(case, rank)
        indefinite = any(T.is_fill_indefinite() for T in everyone)
        like = [
            sparsefill.full_like(A, 7 if A.dtype != torch.bool else True)
            if not A.is_fill_indefinite()
            else make(case, rank)
            for _ in range(world)
        ]
        for root in range(world):  # broadcast
            B = make(case, rank)
            dist.broadcast(B, root)
            assert_holds(
                B,
                *local_reduce(R.MAX, [everyone[root]]),
                f"broadcast {case} root {root}",
                everyone[root].is_fill_indefinite(),
            )
            assert B.is_fill_indefinite() == everyone[root].is_fill_indefinite()
        dist.all_gather(like, A)
        for j in range(world):
            assert_holds(
                like[j],
                *local_reduce(R.MAX, [everyone[j]]),
                f"all_gather {case} from {j}",
                everyone[j].is_fill_indefinite(),
            )
        if not indefinite:
            outs = [torch.empty(A.shape, dtype=A.dtype) for _ in range(world)]  # dense outputs
            dist.all_gather(outs, A)
            dense = [torch.empty(A.shape, dtype=A.dtype) for _ in range(world)]
            dist.all_gather(dense, A.to_dense())  # the dense collective
            for o, d in zip(outs, dense):
                torch.testing.assert_close(o, d, equal_nan=True)
        if A.dim() and not indefinite:
            out = sparsefill.zeros((world * A.shape[0],) + tuple(A.shape[1:]), dtype=A.dtype)
            dist.all_gather_into_tensor(out, A)
            torch.testing.assert_close(
                out.to_dense(), torch.cat([T.to_dense() for T in everyone]), equal_nan=True
            )
        # all_to_all: rank i sends its case tensor + j * fill shift to rank j
        sends = [make(case, rank) for j in range(world)]
        outs = [make(case, rank) for j in range(world)]
        dist.all_to_all(outs, sends)
        for j in range(world):
            assert_holds(
                outs[j],
                *local_reduce(R.MAX, [everyone[j]]),
                f"all_to_all {case} from {j}",
                everyone[j].is_fill_indefinite(),
            )
        if everyone[0].dtype in (torch.float32, torch.float64, torch.int64) and not indefinite:
            for op in (
                R.SUM,
                R.MAX,
            ):  # reduce_scatter: rank j gets the reduction of the ranks' inputs[j]
                ins = [make(case, (rank + j) % world) for j in range(world)]
                out = make(case, rank)
                dist.reduce_scatter(out, ins, op)
                values, mask = local_reduce(
                    op, [make(case, (i + rank) % world) for i in range(world)]
                )
                assert_holds(out, values, mask, f"reduce_scatter {case} {op}")
                root = world - 1
                T = make(case, rank)
                dist.reduce(T, root, op)
                expect = local_reduce(op, everyone) if rank == root else local_reduce(R.MAX, [A])
                assert_holds(T, *expect, f"reduce {case} {op}")
    # rows: reduce_scatter_tensor and all_to_all_single along the first dim, gather, scatter
    X = sparsefill.to_sparse(
        torch.arange(world * 2 * 3.0).reshape(world * 2, 3) % (rank + 2), fill_value=1.0
    )
    out = sparsefill.zeros(2, 3)
    dist.reduce_scatter_tensor(out, X)
    full = sum(torch.arange(world * 2 * 3.0).reshape(world * 2, 3) % (j + 2) for j in range(world))
    torch.testing.assert_close(out.to_dense(), full[2 * rank : 2 * rank + 2])
    out = sparsefill.zeros(world * 2, 3)
    dist.all_to_all_single(out, X)
    expect = torch.cat(
        [
            (torch.arange(world * 2 * 3.0).reshape(world * 2, 3) % (j + 2))[2 * rank : 2 * rank + 2]
            for j in range(world)
        ]
    )
    torch.testing.assert_close(out.to_dense(), expect)
    gl = [sparsefill.zeros(world * 2, 3) for _ in range(world)] if rank == 0 else None
    dist.gather(X, gl, dst=0)
    if rank == 0:
        for j in range(world):
            torch.testing.assert_close(
                gl[j].to_dense(), torch.arange(world * 2 * 3.0).reshape(world * 2, 3) % (j + 2)
            )
    S = sparsefill.zeros(world * 2, 3)
    dist.scatter(S, [X * (j + 1) for j in range(world)] if rank == 0 else None, src=0)
    torch.testing.assert_close(
        S.to_dense(), (torch.arange(world * 2 * 3.0).reshape(world * 2, 3) % 2) * (rank + 1)
    )
    # send/recv around the ring, every case
    for case in CASES:
        A = make(case, rank)
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        got = make(case, rank)
        if rank % 2 == 0:
            dist.send(A, nxt)
            dist.recv(got, prv)
        else:
            dist.recv(got, prv)
            dist.send(A, nxt)
        assert_holds(
            got,
            *local_reduce(R.MAX, [make(case, prv)]),
            f"send/recv {case}",
            make(case, prv).is_fill_indefinite(),
        )


def _check_groups(rank, world):
    """A subgroup: group ranks, not global ranks, inside; the others take no part."""
    g = dist.new_group([1, 3])
    A = make("coo1d", rank)
    if rank in (1, 3):
        dist.all_reduce(A, group=g)
        torch.testing.assert_close(
            A.to_dense(), make("coo1d", 1).to_dense() + make("coo1d", 3).to_dense()
        )
        B = make("csr", rank)
        dist.broadcast(B, src=3, group=g)
        torch.testing.assert_close(B.to_dense(), make("csr", 3).to_dense())
        C = make("csr", rank)
        if rank == 1:
            dist.send(make("csr", 1), dst=3, group=g)
        else:
            dist.recv(C, src=1, group=g)
            torch.testing.assert_close(C.to_dense(), make("csr", 1).to_dense())
    else:
        torch.testing.assert_close(A.to_dense(), make("coo1d", rank).to_dense())
    dist.barrier()


def test_collectives_world2():
    spawn(_worker_w2, 2)


def _worker_w2(rank, world):
    _check_all_reduce(rank, world)
    _check_moves(rank, world)
    _check_data_parallel(rank, world)
    _check_sharded(rank, world)


def test_collectives_world4():
    spawn(_worker_w4, 4)


def _worker_w4(rank, world):
    _check_all_reduce(rank, world, (R.SUM, R.AVG, R.MAX, R.BXOR), ("sparse", "dense"))
    _check_moves(rank, world)
    _check_groups(rank, world)
    _check_bad_inputs(rank, world, VARIANTS[:1])
    _check_data_parallel(rank, world)
    _check_sharded(rank, world)


# ---------------------------------------------------------------------- bad inputs: the same error on every rank
def _snapshot(T):
    return (T.to_dense(fill_value=0) if T.is_fill_indefinite() else T.to_dense()).clone()


def _expect_error(world, err, match, fn, *tensors):
    """``fn()`` raises ``err`` on every rank with the same message, modifies none of ``tensors``, and the
    group is still in step afterwards (a dense all_reduce gives the right sum)."""
    before = [_snapshot(T) for T in tensors]
    with pytest.raises(err, match=match) as info:
        fn()
    msgs = [None] * world
    dist.all_gather_object(msgs, str(info.value))
    assert len(set(msgs)) == 1, msgs
    for T, b in zip(tensors, before):
        torch.testing.assert_close(_snapshot(T), b, equal_nan=True)
    x = torch.ones(1)
    dist.all_reduce(x)
    assert x.item() == world


def _bad(rank, world, **kw):
    """Rank 0 gets the base tensor, the others the variant ``kw`` describes."""
    shape, dtype, layout, dense_dim = (4, 3), torch.float32, torch.sparse_coo, 0
    if rank:
        shape = kw.get("shape", shape)
        dtype = kw.get("dtype", dtype)
        layout = kw.get("layout", layout)
        dense_dim = kw.get("dense_dim", dense_dim)
    x = torch.zeros(shape, dtype=dtype)
    x[0, 0] = 1
    return sparsefill.to_sparse(x, fill_value=0, layout=layout, dense_dim=dense_dim)


VARIANTS = [
    (dict(shape=(4, 4)), ValueError, "shapes differ"),
    (dict(dtype=torch.float64), TypeError, "dtypes differ"),
    (dict(layout=torch.sparse_csr), ValueError, "layouts differ"),
    (dict(dense_dim=1), ValueError, "layouts"),
]


def _check_bad_inputs(rank, world, variants=VARIANTS):
    W = world
    for kw, err, match in variants:
        A = _bad(rank, world, **kw)
        others = [_bad(rank, world, **kw) for _ in range(W)]
        _expect_error(W, err, match, lambda: dist.all_reduce(A), A)
        _expect_error(W, err, match, lambda: dist.broadcast(A, 0), A)
        _expect_error(W, err, match, lambda: dist.reduce(A, 0), A)
        _expect_error(W, err, match, lambda: dist.all_gather(others, A), A, *others)
        _expect_error(
            W,
            err,
            match,
            lambda: dist.all_to_all(others, [_bad(rank, world, **kw) for _ in range(W)]),
            *others,
        )
        _expect_error(
            W,
            err,
            match,
            lambda: dist.reduce_scatter(A, [_bad(rank, world, **kw) for _ in range(W)]),
            A,
        )
        _expect_error(
            W, err, match, lambda: dist.gather(A, others if rank == 0 else None, 0), A, *others
        )
        _expect_error(W, err, match, lambda: dist.scatter(A, others if rank == 0 else None, 0), A)
        X = sparsefill.zeros((W * 4,) + tuple(A.shape[1:]), dtype=A.dtype)
        _expect_error(W, err, match, lambda: dist.all_gather_into_tensor(X, A), X, A)
        out = _bad(rank, world, **kw)
        _expect_error(W, err, match, lambda: dist.all_to_all_single(out, A), out, A)
        out = _bad(rank, world, **kw)[: 4 // W].clone()
        _expect_error(W, err, match, lambda: dist.reduce_scatter_tensor(out, A), out, A)
        msg = ""
        if rank in (
            0,
            1,
        ):  # send/recv: the receiver's tensor differs; both sides raise the same error
            before = _snapshot(A)
            with pytest.raises(err, match=match) as info:
                dist.send(A, 1) if rank == 0 else dist.recv(A, 0)
            msg = str(info.value)
            torch.testing.assert_close(_snapshot(A), before)
        msgs = [None] * W
        dist.all_gather_object(msgs, msg)
        assert msgs[0] == msgs[1] != "", msgs
    # the ranks make different calls: another op, another root
    A = _bad(rank, world)
    _expect_error(
        W, ValueError, "different calls", lambda: dist.all_reduce(A, R.SUM if rank else R.MAX), A
    )
    _expect_error(W, ValueError, "different calls", lambda: dist.broadcast(A, rank % 2), A)
    # ops with no closed form for the dtype, and the dense form of an indefinite fill
    _expect_error(W, TypeError, "integer or bool", lambda: dist.all_reduce(A, R.BAND), A)
    _expect_error(
        W, TypeError, "AVG needs a floating", lambda: dist.all_reduce(A.to(torch.int64), R.AVG)
    )
    I = _indefinite_of(torch.eye(3))
    _expect_error(
        W,
        ValueError,
        "indefinite fill has no dense form",
        lambda: sparsefill.distributed.all_reduce(I, algorithm="dense"),
        I,
    )
    outs = [torch.zeros(3, 3) for _ in range(W)]
    _expect_error(W, ValueError, "masked-out elements", lambda: dist.all_gather(outs, I), I)
    with pytest.raises(ValueError, match="algorithm must be"):
        sparsefill.distributed.all_reduce(A, algorithm="ring")
    with pytest.raises(NotImplementedError, match="source rank"):
        dist.recv(A)


def test_bad_inputs_world2():
    spawn(_check_bad_inputs, 2)


# ---------------------------------------------------------------------- data-parallel training
class _Model(torch.nn.Module):
    """A table read by sparse_lengths_sum (sparse gradient), a SparseLinear (DDP buckets its values), a
    SparseTensor parameter (dense semantics: excluded from DDP) and a dense head."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.table = torch.nn.Parameter(torch.randn(20, 4, generator=g))
        self.lin = sparsefill.nn.SparseLinear.from_dense(
            torch.randn(3, 4, generator=g) * (torch.rand(3, 4, generator=g) < 0.5)
        )
        x = torch.randn(3, 3, generator=g) * (torch.rand(3, 3, generator=g) < 0.5)
        self.S = torch.nn.Parameter(sparsefill.to_sparse(x, fill_value=0.1))
        self.head = torch.nn.Linear(3, 1)
        with torch.no_grad():
            self.head.weight.copy_(torch.randn(1, 3, generator=g))
            self.head.bias.copy_(torch.randn(1, generator=g))

    def forward(self, ids, lengths):
        pooled = sparsefill.segment.sparse_lengths_sum(self.table, ids, lengths, sparse_grad=True)
        return self.head(torch.relu(self.lin(pooled)) @ self.S).squeeze(-1)


def _batches(steps, n):
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(steps):
        lengths = torch.randint(0, 4, (n,), generator=g)
        out.append(
            (
                torch.randint(0, 20, (int(lengths.sum()),), generator=g),
                lengths,
                torch.randn(n, generator=g),
            )
        )
    return out


def _train(model, batches, lr=0.1):
    opt1 = sparsefill.segment.SparseAdagrad(
        [model.table if hasattr(model, "table") else model.module.table], lr=lr
    )
    rest = [p for n, p in model.named_parameters() if not n.endswith("table")]
    opt2 = torch.optim.SGD(rest, lr=lr)
    for ids, lengths, y in batches:
        opt1.zero_grad()
        opt2.zero_grad()
        (model(ids, lengths) - y).square().mean().backward()
        opt1.step()
        opt2.step()


def _check_data_parallel(rank, world, B=3, steps=3):
    full = _batches(steps, world * B)
    mine = []
    for ids, lengths, y in full:
        at = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        lo, hi = int(at[rank * B]), int(at[(rank + 1) * B])
        mine.append((ids[lo:hi], lengths[rank * B : (rank + 1) * B], y[rank * B : (rank + 1) * B]))
    model = _Model()
    with torch.no_grad():  # other ranks start elsewhere: data_parallel broadcasts rank 0's values
        model.table.add_(rank)
        model.S.mul_(rank + 1)
        model.head.bias.add_(rank)
    ddp = sparsefill.distributed.data_parallel(model, sparse=["table"])
    assert isinstance(ddp, torch.nn.parallel.DistributedDataParallel)
    assert len(ddp.sparse_grad_sync.params) == 2  # the table and S
    _train(ddp, mine)
    ref = _Model()
    _train(ref, full)
    got = dict(model.named_parameters())
    for n, p in ref.named_parameters():
        q = got[n]
        torch.testing.assert_close(
            q.to_dense() if isinstance(q, sparsefill.SparseTensor) else q,
            p.to_dense() if isinstance(p, sparsefill.SparseTensor) else p,
            msg=f"data-parallel parameter {n} (rank {rank}, world {world})",
        )
    ddp.sparse_grad_sync.remove()


# ---------------------------------------------------------------------- row-sharded embedding tables
def _bags(steps, n, N, seed=11):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        lengths = torch.randint(0, 5, (n,), generator=g)
        out.append(
            (
                torch.randint(0, N, (int(lengths.sum()),), generator=g),
                lengths,
                torch.randn(n, generator=g),
            )
        )
    return out


def _mine(batch, rank, B):
    ids, lengths, y = batch
    at = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    return (
        ids[int(at[rank * B]) : int(at[(rank + 1) * B])],
        lengths[rank * B : (rank + 1) * B],
        y[rank * B : (rank + 1) * B],
    )


def _check_sharded(rank, world, N=23, D=4, B=3, steps=3):
    """Step for step equal to the unsharded table (SparseAdagrad, plain and row-wise; mean loss per rank)."""
    table = torch.randn(N, D, generator=torch.Generator().manual_seed(5))
    v = torch.randn(D, generator=torch.Generator().manual_seed(6))
    full = _bags(steps, world * B, N)
    for rowwise, pool in ((False, "requester"), (True, "requester"), (False, "owner")):
        emb = sparsefill.distributed.RowShardedEmbeddingBag.from_pretrained(table, pool=pool)
        assert emb.weight.shape == (emb.hi - emb.lo, D)
        opt = sparsefill.segment.SparseAdagrad([emb.weight], lr=0.1, rowwise=rowwise)
        ref = torch.nn.Parameter(table.clone())
        ref_opt = sparsefill.segment.SparseAdagrad([ref], lr=0.1, rowwise=rowwise)
        for batch in full:
            ids, lengths, y = _mine(batch, rank, B)
            pooled = emb(ids, lengths=lengths)
            rp = sparsefill.segment.sparse_lengths_sum(ref, batch[0], batch[1], sparse_grad=True)
            torch.testing.assert_close(pooled, rp[rank * B : (rank + 1) * B].detach())
            opt.zero_grad()
            (pooled @ v - y).square().mean().backward()
            assert (
                emb.weight.grad is None
                if emb.hi == emb.lo or not bool(((batch[0] >= emb.lo) & (batch[0] < emb.hi)).any())
                else emb.weight.grad.is_sparse
            )
            opt.step()
            ref_opt.zero_grad()
            (rp @ v - batch[2]).square().mean().backward()
            ref_opt.step()
            torch.testing.assert_close(
                emb.full_weight(), ref.detach(), msg=f"sharded step, {rowwise=}, {pool=}"
            )
    # nn.EmbeddingBag's input forms and modes, and a keyed jagged batch (one exchange for every key)
    for pool in ("requester", "owner"):
        emb = sparsefill.distributed.RowShardedEmbeddingBag.from_pretrained(
            table, mode="mean", pool=pool
        )
        ids = torch.tensor([[1, 22 - rank, 5], [0, 0, 7]]) + rank
        torch.testing.assert_close(
            emb(ids), torch.nn.functional.embedding_bag(ids, table, mode="mean")
        )
        flat, offsets = ids.reshape(-1), torch.tensor([0, 2, 2])  # (an empty bag)
        torch.testing.assert_close(
            emb(flat, offsets), torch.nn.functional.embedding_bag(flat, table, offsets, mode="mean")
        )
    kj = sparsefill.segment.KeyedJaggedBatch.from_lists(
        [{1: [3, 4], 2: [22]}, {2: [rank, 1, 1]}, {}]
    )
    emb = sparsefill.distributed.RowShardedEmbeddingBag.from_pretrained(table)
    got = emb.forward_jagged(kj, keys=[2, 1, 9])
    want = kj.pooled(table, keys=[2, 1, 9])
    assert list(got) == [2, 1, 9]
    for k in want:
        torch.testing.assert_close(got[k], want[k])
    # bad input: an id out of range on one rank, or another table: the same error on every rank
    _expect_error(
        world,
        IndexError,
        "rank 1 looks up id 23",
        lambda: emb(torch.tensor([0, N if rank == 1 else 1]), lengths=torch.tensor([2])),
    )
    other = sparsefill.distributed.RowShardedEmbeddingBag.from_pretrained(
        table if rank else table[:-1]
    )
    _expect_error(
        world,
        ValueError,
        "tables differ",
        lambda: other(torch.tensor([0]), lengths=torch.tensor([1])),
    )
