"""torch.compile of ``sparsefill.segment``: the segment kernels as ``sparsefill::`` custom ops.

Compiled with ``fullgraph=True`` (backends ``eager``, ``aot_eager``, inductor), warmed up on two batches of
different lengths / offsets / ids counts, then run on a third with ``error_on_recompile``; every result
against eager::

    compiled(sparse_lengths_sum + MLP) loss, gradients (table: sparse rows; MLP)  == eager
    table, moment after SparseAdagrad (plain / row-wise) steps                     == eager

plus ``segment.reduce`` variants (max with ties, weighted, unsorted ids whose count of segments is a
dynamic size), ``KeyedJaggedBatch.pooled``, the run-time checks (an out-of-range index raises the eager
error inside the compiled graph), the torch fallback of the ops without numba, and
``torch.library.opcheck`` of every op at small sizes.  Then (aot_eager, fullgraph, three patterns, as eager)
the conversions of ``_repr`` (their ``_repr_ops``), a ``KeyedJaggedBatch`` built inside the compiled function,
``pooled`` of a shared table with ``keys=``, a custom ``SegmentReducer`` object; their bad data raising the
eager errors from the compiled function; ``pooled`` of a shared table without ``keys=`` as a graph break.  A
reduction whose result is unused still checks its data (``segment_reduce`` is effectful); reducers made in a loop
leave no entry in the registry that names them for the op (weak references).  An unweighted ``pooled`` is one
op, ``jagged_pooled`` (forward, gradients, its id checks, opcheck), and the DLRM example's training step compiled
with inductor gives the eager step's losses and tables.
"""

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
import torch.nn.functional as F

from sparsefill import segment
from sparsefill.segment import _custom_ops
from sparsefill._kernels import segment as _kernels
from sparsefill.segment import _jagged_ops, _optim_ops, _repr_ops  # noqa: F401 (the ops registered)

pytestmark = pytest.mark.filterwarnings("ignore")

R, D, B, X = 30, 4, 5, 3  # table rows, table width, batch, dense features


def batches():
    """Three ``(ids, lengths, x, y)`` batches of ``B`` examples, each with another count of ids."""
    out = []
    for seed, lengths in enumerate([[3, 0, 4, 1, 2], [1, 5, 2, 2, 3], [2, 2, 0, 6, 1]]):
        g = torch.Generator().manual_seed(seed)
        lengths = torch.tensor(lengths)
        ids = torch.randint(0, R, (int(lengths.sum()),), generator=g)
        out.append(
            (
                ids,
                lengths,
                torch.randn(B, X, generator=g, dtype=torch.float64),
                torch.randint(0, 2, (B,), generator=g).double(),
            )
        )
    return out


class Model(torch.nn.Module):
    """``sparse_lengths_sum`` of a table, concatenated with dense features, through an MLP to a logit."""

    def __init__(self, sparse_grad):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.table = torch.nn.Parameter(torch.randn(R, D, generator=g, dtype=torch.float64))
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(D + X, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)
        ).double()
        self.sparse_grad = sparse_grad

    def forward(self, ids, lengths, x, y):
        pooled = segment.sparse_lengths_sum(self.table, ids, lengths, sparse_grad=self.sparse_grad)
        return F.binary_cross_entropy_with_logits(self.mlp(torch.cat([pooled, x], 1)).squeeze(1), y)


def _dense(g):
    return g.to_dense() if g.is_sparse else g


@pytest.mark.parametrize(
    "backend,sparse_grad,rowwise",
    [
        ("eager", True, False),
        ("aot_eager", True, True),
        ("aot_eager", False, False),
        ("inductor", True, False),
        ("inductor", False, True),
    ],
)
def test_training_step(backend, sparse_grad, rowwise):
    """Loss and backward compiled (fullgraph); the table's SparseAdagrad step eager on its sparse gradient, or
    compiled itself (fullgraph) on a dense one; the MLP's Adagrad eager.  Against the same model in eager."""
    torch.manual_seed(0)
    eager, comp = Model(sparse_grad), Model(sparse_grad)
    comp.load_state_dict(eager.state_dict())
    opts = {
        m: (
            segment.SparseAdagrad([m.table], lr=0.1, rowwise=rowwise),
            torch.optim.Adagrad(m.mlp.parameters(), lr=0.1),
        )
        for m in (eager, comp)
    }
    torch._dynamo.reset()
    loss_c = torch.compile(comp, backend=backend, fullgraph=True)
    step_c = (
        opts[comp][0].step
        if sparse_grad
        else torch.compile(opts[comp][0].step, backend=backend, fullgraph=True)
    )
    for k, batch in enumerate(batches()):
        with torch._dynamo.config.patch(error_on_recompile=k == 2):
            got, want = loss_c(*batch), eager(*batch)
            torch.testing.assert_close(got, want)
            for m, loss in ((comp, got), (eager, want)):
                for o in opts[m]:
                    o.zero_grad()
                loss.backward()
            assert comp.table.grad.is_sparse == sparse_grad
            for p, q in zip(comp.parameters(), eager.parameters()):
                torch.testing.assert_close(_dense(p.grad), _dense(q.grad))
            step_c()
            opts[comp][1].step()
            for o in opts[eager]:
                o.step()
        torch.testing.assert_close(comp.table, eager.table)
        moments = [opts[m][0].state[m.table]["moment"] for m in (comp, eager)]
        torch.testing.assert_close(*moments)


REDUCE_CASES = {
    # name: fn of (data, weights, ids, lengths, offsets)
    "max_first": lambda d, w, ids, lengths, offs: segment.reduce(
        d, "max", lengths=lengths, indices=ids, ties="first", return_arg=True
    ),
    "weighted_offsets": lambda d, w, ids, lengths, offs: segment.reduce(
        d, "weighted_sum", offsets=offs, indices=ids, weights=w
    ),
    "unsorted_ids": lambda d, w, ids, lengths, offs: segment.reduce(
        d[: ids.numel()], "logsumexp", segment_ids=ids % 7, sorted=False
    ),  # (S = max + 1: a dynamic size)
    "mean_front": lambda d, w, ids, lengths, offs: segment.reduce_front_mean(d, num_reduce_dims=1),
}


@pytest.mark.parametrize("name", list(REDUCE_CASES))
def test_reduce(name):
    """``segment.reduce`` variants (aot_eager): forward and the gradients of data and weights as eager."""
    fn = REDUCE_CASES[name]
    torch._dynamo.reset()
    cf = torch.compile(fn, backend="aot_eager", fullgraph=True)
    for k, (ids, lengths, _, _) in enumerate(batches()):
        g = torch.Generator().manual_seed(k)
        data = (
            torch.randn(R, 2, generator=g, dtype=torch.float64).round(decimals=1).requires_grad_()
        )  # (ties)
        w = torch.randn(ids.numel(), generator=g, dtype=torch.float64, requires_grad=True)
        offs = segment.lengths_to_offsets(lengths)
        with torch._dynamo.config.patch(error_on_recompile=k == 2):
            got, want = cf(data, w, ids, lengths, offs), fn(data, w, ids, lengths, offs)
            torch.testing.assert_close(got, want)
            out, ref = (got[0], want[0]) if isinstance(got, tuple) else (got, want)
            sel = [data, w] if name == "weighted_offsets" else [data]
            c = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)
            torch.testing.assert_close(
                torch.autograd.grad((out * c).sum(), sel), torch.autograd.grad((ref * c).sum(), sel)
            )


def test_pooled_keyed_jagged():
    """``KeyedJaggedBatch.pooled`` (weighted, a key absent from the batch, a key of the batch not asked for):
    per key one dynamic count of ids; forward and the gradients of tables and weights as eager."""
    tables = {k: torch.randn(R, 2, dtype=torch.float64, requires_grad=True) for k in (1, 3, 4)}

    def f(kj):
        out = kj.pooled(tables, "weighted_sum")
        return sum((v * (k + 1)).sum() for k, v in out.items()), out

    torch._dynamo.reset()
    cf = torch.compile(f, backend="aot_eager", fullgraph=True)
    for k in range(3):
        g = torch.Generator().manual_seed(k)
        lists = [
            {
                key: torch.randint(0, R, (int(n),), generator=g).tolist()
                for key, n in zip((1, 2, 3), torch.randint(0, 4, (3,), generator=g))
                if n or key == 3
            }
            for _ in range(B)
        ]
        kj = segment.KeyedJaggedBatch.from_lists(
            lists,
            weights=[
                {key: [0.5 + i for i in range(len(v))] for key, v in ex.items()} for ex in lists
            ],
        )
        kj.weights.requires_grad_()
        leaves = [*tables.values(), kj.weights]
        with torch._dynamo.config.patch(error_on_recompile=k == 2):
            (lc, oc), (le, oe) = cf(kj), f(kj)
            torch.testing.assert_close(oc, oe)
            torch.testing.assert_close(
                torch.autograd.grad(lc, leaves), torch.autograd.grad(le, leaves)
            )


def test_runtime_checks_raise_eager_errors():
    """The checks of the data run in the ops, at run time: an index out of range, lengths that do not sum
    to the ids, raise the eager errors from the compiled function."""
    fn = lambda d, ids, lengths: segment.sparse_lengths_sum(d, ids, lengths)  # noqa: E731
    torch._dynamo.reset()
    cf = torch.compile(fn, backend="aot_eager", fullgraph=True)
    d = torch.randn(R, 2)
    torch.testing.assert_close(
        cf(d, torch.tensor([1, 2, 3]), torch.tensor([2, 1])),
        fn(d, torch.tensor([1, 2, 3]), torch.tensor([2, 1])),
    )
    with pytest.raises(IndexError, match=rf"indices\[1\] = {R} is out of range for {R} rows"):
        cf(d, torch.tensor([1, R, 3]), torch.tensor([2, 1]))
    with pytest.raises(ValueError, match="lengths sum to 4, but there are 3 indices"):
        cf(d, torch.tensor([1, 2, 3]), torch.tensor([2, 2]))


@pytest.mark.parametrize("backend", ["torch", "numba", "numba missing"])
def test_ops_real_implementation(backend, monkeypatch):
    """The ops run the segment backend's kernels: torch's, numba's, and torch's where numba is not installed
    (the "auto" backend then never loads it); forward, backward and an optimizer step as eager."""
    if backend == "numba" and not _kernels.compiled_available():
        pytest.skip("numba is not installed: the compiled kernels are not there to run")
    if backend == "numba missing":
        monkeypatch.setitem(_kernels._STATE, "nb", False)
        monkeypatch.setitem(_kernels._STATE, "work", 1 << 40)
    ids, lengths, _, _ = batches()[0]
    data = torch.randn(R, 3, dtype=torch.float64, requires_grad=True)
    with segment.use_backend("auto" if backend == "numba missing" else backend):
        out, arg = torch.ops.sparsefill.segment_reduce(
            data,
            lengths,
            None,
            None,
            ids,
            None,
            "max",
            None,
            True,
            0.0,
            True,
            "split",
            "error",
            True,
            False,
        )
        want, want_arg = segment.reduce(data, "max", lengths=lengths, indices=ids, return_arg=True)
        torch.testing.assert_close((out, arg), (want, want_arg))
        torch.testing.assert_close(
            torch.autograd.grad(out.sum(), data), torch.autograd.grad(want.sum(), data)
        )
        p, m = torch.randn(R, 3, dtype=torch.float64), torch.zeros(R, 3, dtype=torch.float64)
        p2, m2 = p.clone(), m.clone()
        grad = torch.randn(ids.numel(), 3, dtype=torch.float64)
        torch.ops.sparsefill.sparse_adagrad_(p, m, ids, grad, 0.1, 1e-10, 0.0, 1.0, "coalesced")
        segment.sparse_adagrad(p2, m2, ids, grad, lr=0.1, eps=1e-10, mode="coalesced")
        torch.testing.assert_close((p, m), (p2, m2))


def _opcheck(op, args):
    torch.library.opcheck(
        op,
        args,
        test_utils=(
            "test_schema",
            "test_autograd_registration",
            "test_faketensor",
            "test_aot_dispatch_dynamic",
        ),
    )


def test_opcheck():
    """``torch.library.opcheck`` of every op (schema and mutations, autograd registration, fake implementation
    against the real one, AOT dispatch with dynamic sizes) at small sizes."""
    ids, lengths = torch.tensor([0, 3, 3, 1, 2]), torch.tensor([2, 0, 3])
    data = torch.randn(4, 2, dtype=torch.float64, requires_grad=True)
    w = torch.rand(5, dtype=torch.float64, requires_grad=True)
    op = torch.ops.sparsefill.segment_reduce.default
    common = ("error", True)
    _opcheck(
        op,
        (
            data,
            lengths,
            None,
            None,
            ids,
            None,
            "sum",
            None,
            True,
            0.0,
            False,
            "split",
            *common,
            False,
        ),
    )
    _opcheck(
        op,
        (
            data,
            None,
            torch.tensor([0, 2, 2, 5]),
            None,
            ids,
            w,
            "weighted_sum",
            None,
            True,
            0.0,
            False,
            "split",
            *common,
            False,
        ),
    )
    data5 = torch.tensor(
        [[1.0, 2.0], [1.0, 0.0], [3.0, 3.0], [3.0, -1.0], [0.0, 3.0]],
        dtype=torch.float64,
        requires_grad=True,
    )
    _opcheck(
        op,
        (
            data5,
            lengths,
            None,
            None,
            None,
            None,
            "max",
            None,
            True,
            0.0,
            True,
            "first",
            *common,
            False,
        ),
    )
    # sparse gradient rows, ids out of range dropped (the backward's count of rows: a dynamic size)
    _opcheck(
        op,
        (
            data,
            None,
            None,
            torch.tensor([1, 0, 1, 5, 9]),
            ids,
            None,
            "sum",
            3,
            False,
            0.0,
            False,
            "split",
            "drop",
            True,
            True,
        ),
    )
    _opcheck(
        op,
        (
            data,
            None,
            None,
            torch.tensor([2, 0, 2, 1]),
            None,
            None,
            "logsumexp",
            None,
            False,
            float("-inf"),
            False,
            "split",
            *common,
            False,
        ),
    )
    x = data.detach()
    out = segment.reduce(x, "sum", lengths=lengths, indices=ids)
    _opcheck(
        torch.ops.sparsefill.segment_reduce_backward.default,
        (
            torch.ones_like(out),
            x,
            lengths,
            None,
            None,
            ids,
            None,
            out,
            torch.zeros(0, dtype=torch.int64),
            "sum",
            None,
            True,
            "split",
            "error",
            True,
            False,
        ),
    )
    g = torch.randn(5, 2, dtype=torch.float64)
    p, m = torch.randn(4, 2, dtype=torch.float64), torch.zeros(4, 2, dtype=torch.float64)
    _opcheck(
        torch.ops.sparsefill.sparse_adagrad_.default,
        (p, m, ids, g, 0.1, 1e-10, 0.0, 1.0, "coalesced"),
    )
    _opcheck(
        torch.ops.sparsefill.rowwise_sparse_adagrad_.default,
        (p, torch.zeros(4, dtype=torch.float64), ids, g, 0.1, 1e-10, 0.0, "sequential"),
    )
    _opcheck(
        torch.ops.sparsefill.sparse_ftrl_.default,
        (p, m.clone(), m.clone(), ids, g, 0.005, 1.0, 0.001, 0.001, "coalesced"),
    )
    kj = segment.KeyedJaggedBatch.from_lists(
        [{1: [10, 11], 3: [101]}, {1: [11], 2: [50], 3: [102, 103]}]
    )
    for values in (kj.values, torch.arange(kj.values.numel())):
        _opcheck(
            torch.ops.sparsefill.jagged_key_lists.default,
            (values, kj.values_lengths, kj.keys, kj.example_lengths, [3, 1, 7]),
        )


def test_optimizer_step_sparse_gradient_graph_break():
    """A sparse gradient (torch's sparse COO: dynamo cannot wrap it, pytorch#130687) reaches a compiled
    ``SparseAdagrad.step`` without ``fullgraph``: a graph break, and the step of eager (plain and row-wise)."""
    for rowwise in (False, True):
        p, q = (
            torch.nn.Parameter(torch.linspace(-1, 1, R * D, dtype=torch.float64).view(R, D))
            for _ in range(2)
        )
        opt, ref = (segment.SparseAdagrad([t], lr=0.1, rowwise=rowwise) for t in (p, q))
        torch._dynamo.reset()
        step = torch.compile(opt.step, backend="eager")
        for ids, _, _, _ in batches():
            g = torch.sparse_coo_tensor(
                ids[None], torch.randn(ids.numel(), D, dtype=torch.float64), (R, D)
            )
            p.grad, q.grad = g.clone(), g.clone()
            step()
            ref.step()
            torch.testing.assert_close(p, q)


# ---------------------------------------------------------------------------------------------------------------
# The conversions (_repr), a KeyedJaggedBatch built in the compiled function, pooled with a shared table, a custom
# SegmentReducer: fullgraph (aot_eager), no recompile on a third pattern, forward and gradients as eager; the
# checks of the data raise the eager errors from the compiled function.

PATTERNS = [
    [3, 0, 4, 1, 2],
    [1, 5, 2, 2, 3],
    [2, 2, 0, 6, 1],
]  # (every count of ids >= 2: no 0/1 specialization)


def _compiled_against_eager(fn, make_args, grads=(), fullgraph=True):
    """``fn`` compiled (aot_eager, fullgraph unless told) on three patterns, the third with ``error_on_recompile``:
    no graph break (also without ``fullgraph``), its outputs and the gradients of ``make_args``'s
    arguments at positions ``grads`` as eager."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    cf = torch.compile(fn, backend=counter, fullgraph=fullgraph)
    for k, lengths in enumerate(PATTERNS):
        args = make_args(torch.tensor(lengths), k)
        with torch._dynamo.config.patch(error_on_recompile=k == 2):
            got, want = cf(*args), fn(*args)
            torch.testing.assert_close(got, want)
            if grads:
                leaves = [args[i] for i in grads]
                outs = [
                    o for o in torch.utils._pytree.tree_leaves((got, want)) if o.is_floating_point()
                ]
                n = len(outs) // 2
                c = [
                    torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view(o.shape) for o in outs[:n]
                ]
                got_g, want_g = (
                    torch.autograd.grad(sum((o * ci).sum() for o, ci in zip(part, c)), leaves)
                    for part in (outs[:n], outs[n:])
                )
                torch.testing.assert_close(
                    [_dense(g) for g in got_g], [_dense(g) for g in want_g]
                )  # (sparse: dense)
    breaks = {
        k: dict(torch._dynamo.utils.counters[k]) for k in ("graph_break", "unimplemented")
    }  # (a break that
    assert counter.frame_count and not any(breaks.values()), (
        breaks
    )  # restarts the frame counts as "unimplemented")


def _conversions(lengths, lengths32):
    ids = segment.lengths_to_segment_ids(lengths)
    offs = segment.lengths_to_offsets(lengths)
    return (
        ids,
        segment.lengths_to_segment_ids(lengths32),
        offs,
        segment.lengths_to_offsets(lengths32),
        segment.lengths_to_offsets(lengths, include_last=False),
        segment.offsets_to_lengths(offs),
        segment.offsets_to_lengths(offs[:-1], total=ids.shape[0]),
        segment.lengths_to_ranges(lengths),
        segment.segment_ids_to_lengths(ids),
        segment.segment_ids_to_lengths(ids, num_segments=B + 2),
        segment.segment_ids_to_lengths(ids.flip(0), B, sorted=False),
        segment.segment_ids_to_offsets(ids),
        segment.segment_ids_to_ranges(ids, B),
        segment.lengths_to_weights(lengths, dtype=torch.float64),
        segment.lengths_to_weights(lengths32, 1.0),
        segment.lengths_range_fill(lengths32),
    )


def test_conversions():
    """Every conversion of ``_repr`` (int64 and int32 lengths; sizes ``sum(lengths)`` and ``max(ids) + 1``:
    dynamic sizes) as eager, with no recompile on a third pattern."""
    _compiled_against_eager(_conversions, lambda lengths, k: (lengths, lengths.int()))


def _gathers(data, lengths, items, indices, ranges):
    return (
        segment.lengths_tile(data, lengths),
        segment.lengths_gather(items, lengths, indices),
        segment.gather_ranges(items, ranges),
    )


def test_conversions_differentiable():
    """``lengths_tile``, ``lengths_gather``, ``gather_ranges``: forward and the gradients of their data."""

    def make(lengths, k):
        g = torch.Generator().manual_seed(k)
        n = int(lengths.sum())
        data = torch.randn(B, 2, generator=g, dtype=torch.float64, requires_grad=True)
        items = torch.randn(n, 3, generator=g, dtype=torch.float64, requires_grad=True)
        starts = torch.randint(0, n - 2, (2, 3), generator=g)
        ranges = torch.stack([starts, torch.randint(0, 3, (2, 3), generator=g)], -1)
        return data, lengths, items, torch.tensor([k + 1, 0, 3, k + 1]), ranges

    _compiled_against_eager(_gathers, make, grads=(0, 2))


BAD_CONVERSIONS = {
    # name: (fn of lengths, the bad lengths or ids, the eager error)
    "negative length": (lambda t: segment.lengths_to_offsets(t), [2, -1, 3], ValueError),
    "negative length, tile": (
        lambda t: segment.lengths_tile(torch.ones(3, 2), t),
        [2, -1, 3],
        ValueError,
    ),
    "negative length, weights": (lambda t: segment.lengths_to_weights(t), [2, -1, 3], ValueError),
    "unsorted ids": (lambda t: segment.segment_ids_to_lengths(t), [0, 2, 1], ValueError),
    "id out of range": (lambda t: segment.segment_ids_to_lengths(t, 2), [0, 1, 2], IndexError),
    "negative id": (
        lambda t: segment.segment_ids_to_lengths(t, 4, sorted=False),
        [0, -1, 2],
        IndexError,
    ),
    "decreasing offsets": (lambda t: segment.offsets_to_lengths(t), [0, 3, 2], ValueError),
    "offsets past total": (lambda t: segment.offsets_to_lengths(t, total=2), [0, 1, 3], ValueError),
    "gather index": (
        lambda t: segment.lengths_gather(torch.ones(5), torch.tensor([2, 3]), t),
        [0, 2, 1],
        IndexError,
    ),
    "gather lengths": (
        lambda t: segment.lengths_gather(torch.ones(6), t, torch.tensor([0])),
        [2, 3, 0],
        ValueError,
    ),
    "range": (
        lambda t: segment.gather_ranges(torch.ones(4), t.view(1, -1, 2)),
        [0, 2, 3, 2],
        IndexError,
    ),
    "result unused": (
        lambda t: (segment.lengths_to_segment_ids(t), t * 2)[1],
        [2, -1, 3],
        ValueError,
    ),
}


@pytest.mark.parametrize("name", list(BAD_CONVERSIONS))
def test_conversions_bad_input_raise(name):
    """A compiled conversion (fullgraph) on bad data raises the eager error from the compiled function, its
    result used or not (the ops are effectful: never dead code)."""
    fn, bad, err = BAD_CONVERSIONS[name]
    with pytest.raises(err) as want:
        fn(torch.tensor(bad))
    torch._dynamo.reset()
    with pytest.raises(err) as got:
        torch.compile(fn, backend="aot_eager", fullgraph=True)(torch.tensor(bad))
    assert str(got.value) == str(want.value)


BAD_REDUCE = {
    # name: (fn of (data, lengths or ids), bad tensor, the eager error)
    "lengths sum": (lambda d, t: segment.reduce(d, "sum", lengths=t), [2, 2], ValueError),
    "negative length": (lambda d, t: segment.reduce(d, "max", lengths=t), [4, -1], ValueError),
    "index": (
        lambda d, t: segment.sparse_lengths_sum(d, t, torch.tensor([1, 2])),
        [0, 5, 1],
        IndexError,
    ),
    "unsorted ids": (lambda d, t: segment.reduce(d, "mean", segment_ids=t), [0, 2, 1], ValueError),
    "offsets": (
        lambda d, t: segment.reduce(d, "sum", offsets=t, indices=torch.tensor([0, 1, 2])),
        [0, 2, 1, 3],
        ValueError,
    ),
}


@pytest.mark.parametrize(
    "name,backend", [(n, "aot_eager") for n in BAD_REDUCE] + [("index", "inductor")]
)
def test_reduce_bad_input_raises_result_unused(name, backend):
    """``sparsefill::segment_reduce`` is effectful: a compiled (fullgraph) reduction whose result is unused still
    runs, and bad data raise the eager error from the compiled function (the op is not dead code)."""
    fn, bad, err = BAD_REDUCE[name]
    data = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    unused = lambda d, t: (fn(d, t), d * 2)[1]  # noqa: E731
    with pytest.raises(err) as want:
        fn(data, torch.tensor(bad))
    torch._dynamo.reset()
    with pytest.raises(err) as got:
        torch.compile(unused, backend=backend, fullgraph=True)(data, torch.tensor(bad))
    assert str(got.value) == str(want.value)


def _jagged(seed):
    """A batch of ``B`` examples of keys 1..3 (values in [0, R)) with weights, as its tensors."""
    g = torch.Generator().manual_seed(seed)
    lists = [
        {
            key: torch.randint(0, R, (int(n),), generator=g).tolist()
            for key, n in zip((1, 2, 3), torch.randint(0, 4, (3,), generator=g))
            if n or key == 3
        }
        for _ in range(B)
    ]
    kj = segment.KeyedJaggedBatch.from_lists(
        lists,
        weights=[{key: [0.5 + i for i in range(len(v))] for key, v in ex.items()} for ex in lists],
    )
    return (
        kj.values,
        kj.values_lengths,
        kj.keys,
        kj.example_lengths,
        kj.weights.double().requires_grad_(),
    )


def test_keyed_jagged_batch_built_traced():
    """A ``KeyedJaggedBatch`` built inside the compiled function (its checks: the op ``jagged_check``) and
    pooled (a table per key; one shared table with ``keys=``): forward, gradients of tables and weights."""
    tables = {k: torch.randn(R, 2, dtype=torch.float64, requires_grad=True) for k in (1, 3)}
    shared = torch.randn(R, 2, dtype=torch.float64, requires_grad=True)

    def f(values, values_lengths, keys, example_lengths, weights, t1, t3, shared):
        kj = segment.KeyedJaggedBatch(values, values_lengths, keys, example_lengths, weights)
        return kj.pooled({1: t1, 3: t3}, "weighted_sum"), kj.pooled(shared, "max", keys=[3, 2])

    _compiled_against_eager(
        f, lambda lengths, k: (*_jagged(k), tables[1], tables[3], shared), grads=(4, 5, 6, 7)
    )


def _pooled_cases(kj, t1, t3, shared):
    return (
        kj.pooled({1: t1, 3: t3}, "sum"),
        kj.pooled({1: t1, 3: t3}, "max"),
        kj.pooled(shared, "sqrt_n", keys=[3, 2], sparse_grad=True),
    )


def _padded_cases(values, values_lengths, keys, example_lengths, weights):
    kj = segment.KeyedJaggedBatch(values, values_lengths, keys, example_lengths)
    fw = segment.KeyedJaggedBatch(
        weights, values_lengths, keys, example_lengths
    )  # (float values: a gradient)
    return (
        kj.to_padded([3, 1]),
        kj.to_padded([2, 4, 3], max_length=2, pad_value=-1),
        kj.to_padded([]),
        fw.to_padded((1, 3), pad_value=0.5),
        fw.to_padded([3], max_length=1),
    )


def _select_cases(values, values_lengths, keys, example_lengths, weights):
    kj = segment.KeyedJaggedBatch(values, values_lengths, keys, example_lengths, weights)
    parts = lambda b: (b.values, b.values_lengths, b.keys, b.example_lengths, b.weights)  # noqa: E731
    return (
        parts(kj.select_keys([3, 1])),
        parts(kj.permute_keys((3, 2, 1))),
        parts(kj.select_keys([4, 2])),
        parts(kj.select_keys([])),
    )


@pytest.mark.parametrize("fullgraph", [True, False], ids=["fullgraph", "plain"])
def test_select_keys(fullgraph):
    """``select_keys`` / ``permute_keys`` (keys as a list or tuple, a key absent from the batch, none) trace, with
    and without ``fullgraph`` (their unique/nonzero/bincount were a graph break, and with ``fullgraph`` dynamo's
    unnamed guard error): no graph break, no recompile, the batch's tensors and the weights' gradient as eager."""
    _compiled_against_eager(
        _select_cases, lambda lengths, k: _jagged(k), grads=(4,), fullgraph=fullgraph
    )


@pytest.mark.parametrize("method", ["select_keys", "to_padded"])
def test_keys_as_a_tensor_graph_break(method):
    """Keys given as a tensor are data: a graph break with the eager result, with ``fullgraph`` dynamo's error
    naming the method, never its unnamed guard error."""
    kj = _pooled_batch(0)
    f = lambda kj: getattr(kj, method)(torch.tensor([3, 1]))  # noqa: E731
    parts = lambda r: (
        (r.values, r.values_lengths, r.keys, r.example_lengths) if method == "select_keys" else r
    )  # noqa
    torch._dynamo.reset()
    torch.testing.assert_close(parts(torch.compile(f, backend="aot_eager")(kj)), parts(f(kj)))
    torch._dynamo.reset()
    with pytest.raises(
        torch._dynamo.exc.Unsupported,
        match=f"KeyedJaggedBatch.{method} with keys given as a tensor",
    ):
        torch.compile(f, backend="aot_eager", fullgraph=True)(kj)


@pytest.mark.parametrize("fullgraph", [True, False], ids=["fullgraph", "plain"])
def test_to_padded(fullgraph):
    """``KeyedJaggedBatch.to_padded`` (keys as a list or tuple, a key absent from the batch, ``max_length``
    truncating, no keys; float values with a gradient) traces, with and without ``fullgraph`` (``select_keys``' data-dependent sizes were a graph break, and with ``fullgraph`` dynamo's unnamed
    guard error): no graph break, no recompile, outputs and gradients as eager."""
    _compiled_against_eager(
        _padded_cases, lambda lengths, k: _jagged(k), grads=(4,), fullgraph=fullgraph
    )


@pytest.mark.parametrize("name", ["pooled", "built traced", "conversions"])
def test_traced_without_fullgraph(name):
    """Without ``fullgraph`` the ops of a dynamic output size (``jagged_pooled``, ``jagged_key_lists``, the
    conversions) are traced as with it (once a graph break "Dynamic shape operator" at each):
    no graph break, no recompile on the third batch, outputs and gradients as eager."""
    tables = [torch.randn(R, 2, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    if name == "pooled":
        _compiled_against_eager(
            _pooled_cases,
            lambda lengths, k: (_pooled_batch(k), *tables),
            grads=(1, 2, 3),
            fullgraph=False,
        )
    elif name == "built traced":

        def f(values, values_lengths, keys, example_lengths, weights, t1, t3):
            kj = segment.KeyedJaggedBatch(values, values_lengths, keys, example_lengths, weights)
            return kj.pooled({1: t1, 3: t3}, "weighted_sum"), kj.pooled(t3, "max", keys=[3, 2])

        _compiled_against_eager(
            f, lambda lengths, k: (*_jagged(k), *tables[:2]), grads=(4, 5, 6), fullgraph=False
        )
    else:
        _compiled_against_eager(
            _conversions, lambda lengths, k: (lengths, lengths.int()), fullgraph=False
        )


@pytest.mark.parametrize("bad", ["negative length", "sum", "repeated key"])
def test_keyed_jagged_batch_bad_input_raises(bad):
    """Built in a compiled function (fullgraph) from bad tensors: the eager error, from the compiled function,
    the batch used or not."""
    values, vl, keys, el, _ = _jagged(0)
    vl, keys, el = vl.clone(), keys.clone(), el.clone()
    if bad == "negative length":
        vl[1], vl[2] = -1, vl[2] + vl[1] + 1
    elif bad == "sum":
        el[0] += 1
    else:
        keys[1] = keys[0]
    fns = [
        lambda *t: segment.KeyedJaggedBatch(*t).values * 2,
        lambda *t: (segment.KeyedJaggedBatch(*t), t[0])[1],
    ]
    with pytest.raises(ValueError) as want:
        segment.KeyedJaggedBatch(values, vl, keys, el)
    for fn in fns:
        torch._dynamo.reset()
        with pytest.raises(ValueError) as got:
            torch.compile(fn, backend="aot_eager", fullgraph=True)(values, vl, keys, el)
        assert str(got.value) == str(want.value)


def test_pooled_shared_table_without_keys_graph_break():
    """``pooled`` of one shared table and no ``keys=`` pools the keys read from the batch: with ``fullgraph``
    dynamo's error says to pass ``keys=``; without, a graph break and the eager result and gradients."""
    table = torch.randn(R, 2, dtype=torch.float64, requires_grad=True)
    f = lambda kj: kj.pooled(table, "mean")  # noqa: E731
    kj = segment.KeyedJaggedBatch(*_jagged(0)[:4])
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match="pass keys="):
        torch.compile(f, backend="aot_eager", fullgraph=True)(kj)
    torch._dynamo.reset()
    cf = torch.compile(f, backend="aot_eager")
    for k in range(3):
        kj = segment.KeyedJaggedBatch(*_jagged(k)[:4])
        got, want = cf(kj), f(kj)
        assert list(got) == list(want)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(
            torch.autograd.grad(sum(v.sum() for v in got.values()), table),
            torch.autograd.grad(sum(v.sum() for v in want.values()), table),
        )


def test_custom_reducer():
    """A ``SegmentReducer`` object of the user's (a mean with another empty value; a sqrt-n mean of squares):
    one op ``sparsefill::segment_reduce`` naming it, forward and gradients of data and weights as eager; a
    reducer made inside the compiled function (unnamed to the op) breaks the graph and gives the eager result."""
    import dataclasses
    from sparsefill._kernels import reducer as _reduce

    mean_m1 = dataclasses.replace(
        segment.SEGMENT_REDUCERS["weighted_mean"], name="wmean_m1", empty=-1.0
    )
    rms = segment.SegmentReducer(
        "rms_n", _reduce.Reducer("rms_n", "sum", finalize=lambda acc, n: acc / n.clamp(1)), 0.0
    )

    def f(data, w, lengths):
        return (
            segment.reduce(data, mean_m1, lengths=lengths, weights=w),
            segment.reduce(data * data, rms, lengths=lengths),
        )

    def make(lengths, k):
        g = torch.Generator().manual_seed(k)
        n = int(lengths.sum())
        return (
            torch.randn(n, 2, generator=g, dtype=torch.float64, requires_grad=True),
            torch.rand(n, generator=g, dtype=torch.float64, requires_grad=True),
            lengths,
        )

    _compiled_against_eager(f, make, grads=(0, 1))

    def g(data, lengths):
        red = dataclasses.replace(segment.SEGMENT_REDUCERS["max"], name="max_inner", empty=-5.0)
        return segment.reduce(data, red, lengths=lengths)

    data, _, lengths = make(torch.tensor(PATTERNS[0]), 0)
    torch._dynamo.reset()
    torch.testing.assert_close(
        torch.compile(g, backend="aot_eager")(data, lengths), g(data, lengths)
    )


def test_custom_reducers_made_in_a_loop_are_forgotten():
    """Every ``SegmentReducer`` is named for ``sparsefill::segment_reduce`` by a weak reference: reducers made in a
    loop and dropped leave no entry (the registry stays bounded); a live one keeps its name, a dead name raises."""
    import dataclasses
    import gc
    from sparsefill.segment import _reduce_ops

    gc.collect()
    before = len(_reduce_ops._CREATED)
    keep = dataclasses.replace(segment.SEGMENT_REDUCERS["mean"], name="kept", empty=-2.0)
    data, lengths = torch.arange(6.0).view(3, 2), torch.tensor([2, 0, 1])
    keys = set()
    for i in range(200):
        red = dataclasses.replace(segment.SEGMENT_REDUCERS["sum"], name=f"loop{i}", empty=float(i))
        keys.add(_reduce_ops.reducer_key(red))
        out, _ = _custom_ops.segment_reduce(
            data, _reduce_ops.reducer_key(red), lengths=lengths, empty=float(i)
        )
        torch.testing.assert_close(out, segment.reduce(data, red, lengths=lengths))
    del red
    gc.collect()
    assert len(_reduce_ops._CREATED) == before + 1
    assert _reduce_ops.reducer_of(_reduce_ops.reducer_key(keep)) is keep
    with pytest.raises(ValueError, match="no SegmentReducer 'loop3@"):
        _reduce_ops.reducer_of(next(k for k in keys if k.startswith("loop3@")))


def test_opcheck_conversions():
    """``torch.library.opcheck`` of the conversions' ops and ``jagged_check`` (int64 and int32 inputs)."""
    L, ids = torch.tensor([2, 0, 3]), torch.tensor([0, 0, 2, 2, 2])
    kj = segment.KeyedJaggedBatch.from_lists(
        [{1: [10, 11], 3: [101]}, {1: [11], 2: [50], 3: [102, 103]}]
    )
    ops = torch.ops.sparsefill
    for op, args in [
        (ops.lengths_to_segment_ids, (L, True)),
        (ops.segment_ids_to_lengths, (ids, None, True, True)),
        (ops.segment_ids_to_lengths, (ids.int(), 4, False, True)),
        (ops.lengths_to_offsets, (L, False, True)),
        (ops.offsets_to_lengths, (torch.tensor([0, 2, 2]), 5, True)),
        (ops.lengths_to_weights, (L, 0.5, torch.float64, True)),
        (ops.lengths_range_fill, (L.int(), True)),
        (ops.lengths_gather_rows, (L, torch.tensor([2, 0]), 5, True)),
        (ops.gather_ranges_rows, (torch.tensor([[[0, 2], [3, 1]]]), 5, True)),
        (ops.lengths_max_range, (L,)),
        (ops.lengths_max_range, (L[:0].int(),)),
        (ops.jagged_check, (kj.example_lengths, kj.values_lengths, kj.keys, 7)),
    ]:
        _opcheck(op.default, args)


# KeyedJaggedBatch.pooled of an unweighted sum / mean / sqrt_n: one op for every key (sparsefill::jagged_pooled),
# forward and backward; the DLRM example's training step compiled against eager.


def _pooled_batch(k):
    """Batch ``k`` of three (other counts of ids per key): keys 1, 2, 3 (key 2 never asked for), ids < R."""
    g = torch.Generator().manual_seed(10 + k)
    lists = [
        {
            key: torch.randint(0, R, (int(n),), generator=g).tolist()
            for key, n in zip((1, 2, 3), torch.randint(0, 4, (3,), generator=g))
            if n or key == 3
        }
        for _ in range(B)
    ]
    return segment.KeyedJaggedBatch.from_lists(lists)


def _graph_ops(gm):
    return [
        str(n.target)
        for n in gm.graph.nodes
        if n.op == "call_function" and "sparsefill" in str(n.target)
    ]


@pytest.mark.parametrize(
    "reducer,sparse_grad", [("sum", True), ("mean", False), ("sqrt_n", True), ("sum", False)]
)
def test_pooled_one_op(reducer, sparse_grad):
    """An unweighted ``pooled`` (a table per key, a key absent from the batch, ``empty=``) is one
    ``jagged_pooled`` op in the graph (no per-key ops), its results and the tables' gradients (sparse rows or
    dense) as eager, on three batches with no recompile on the third."""
    tables = {k: torch.randn(R, 2, dtype=torch.float64, requires_grad=True) for k in (1, 3, 4)}
    f = lambda kj: kj.pooled(tables, reducer, sparse_grad=sparse_grad, empty=-1.0)  # noqa: E731
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    cf = torch.compile(f, backend=counter, fullgraph=True)
    leaves = list(tables.values())
    for k in range(3):
        kj = _pooled_batch(k)
        with torch._dynamo.config.patch(error_on_recompile=k == 2):
            got, want = cf(kj), f(kj)
        assert list(got) == list(want)
        torch.testing.assert_close(got, want)
        c = {
            key: torch.linspace(-1, 1, v.numel(), dtype=v.dtype).view(v.shape)
            for key, v in want.items()
        }
        gg = torch.autograd.grad(sum((v * c[key]).sum() for key, v in got.items()), leaves)
        gw = torch.autograd.grad(sum((v * c[key]).sum() for key, v in want.items()), leaves)
        assert all(a.is_sparse == sparse_grad == b.is_sparse for a, b in zip(gg, gw))
        torch.testing.assert_close([_dense(a) for a in gg], [_dense(b) for b in gw])
    assert _graph_ops(counter.graphs[0]) == ["sparsefill.jagged_pooled.default"]


def test_pooled_one_op_checks_ids():
    """The ids' range check runs in ``jagged_pooled``: an id out of range of its table raises the eager error
    from the compiled function."""
    tables = {k: torch.randn(R, 2) for k in (1, 3)}
    kj = segment.KeyedJaggedBatch.from_lists([{1: [0, 2], 3: [R]}, {3: [1]}])
    f = lambda kj: kj.pooled(tables, "sum")  # noqa: E731
    with pytest.raises(IndexError) as want:
        f(kj)
    torch._dynamo.reset()
    with pytest.raises(IndexError) as got:
        torch.compile(f, backend="aot_eager", fullgraph=True)(kj)
    assert str(got.value) == str(want.value) and f"= {R}" in str(want.value)


def test_opcheck_jagged_pooled():
    """``torch.library.opcheck`` of ``jagged_pooled`` (sparse and dense gradients; a key absent from the batch; a
    table shared by two keys) and of its backward."""
    kj = segment.KeyedJaggedBatch.from_lists([{1: [1, 2], 3: [0]}, {1: [2], 2: [3], 3: [1, 3]}])
    tables = [torch.randn(4, 2, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    args = (kj.values, kj.values_lengths, kj.keys, kj.example_lengths, [3, 1, 7], [0, 1, 0])
    for reducer, sparse_grad in (("sum", True), ("mean", False)):
        _opcheck(
            torch.ops.sparsefill.jagged_pooled.default,
            (tables, *args, reducer, 0.0, True, sparse_grad),
        )
    outs, offsets, lists = torch.ops.sparsefill.jagged_pooled(tables, *args, "sum", 0.0, True, True)
    for sparse_grad in (True, False):
        _opcheck(
            torch.ops.sparsefill.jagged_pooled_backward.default,
            (
                [torch.randn_like(o) for o in outs],
                [t.detach() for t in tables],
                [0, 1, 0],
                offsets,
                lists,
                "sum",
                sparse_grad,
            ),
        )


def test_dlrm_step_compiled(backend="inductor"):
    """The DLRM example's training step (4 tables; the model compiled, fullgraph; SparseAdagrad and Adagrad
    eager, as ``benchmarks.cases_compile`` times it): losses over three steps and the tables after them as the
    eager step's, on two copies of one model; one graph, no break."""
    import copy
    from pathlib import Path

    from sparsefill.benchmarks.cases_models import _example

    # (the checkout's examples/: an installed package has none)
    dlrm = _example("dlrm", Path(__file__).resolve().parents[2] / "examples")
    (model, (x, kj), y), _ = dlrm.setup(batch=16, keys=4, rows=50, dim=4)
    twin = copy.deepcopy(model)
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    steps = [dlrm.trainer(compiled, (x, kj), y), dlrm.trainer(twin, (x, kj), y)]
    for _ in range(3):
        got, want = (s() for s in steps)
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(list(model.parameters()), list(twin.parameters()))
    assert counter.frame_count == 1
    assert _graph_ops(counter.graphs[0]) == ["sparsefill.jagged_pooled.default"]


# A table shared by keys (TorchRec's shared tables): one pooled call, or two; dense nn.Parameter and SparseTensor
# parameter; the training step compiled against eager.


class SharedTables(torch.nn.Module):
    """Keys 1 and 3 share ``shared``, key 4 has ``own`` (absent from the batches: empty); with dense gradients
    a second ``pooled`` call reads ``shared`` again."""

    def __init__(self, sparse_grad, kind):
        super().__init__()
        import sparsefill

        g = torch.Generator().manual_seed(0)
        t = torch.randn(R, 2, generator=g, dtype=torch.float64)
        if kind == "SparseTensor":  # (every other row stored, fill 0)
            t = sparsefill.sparse_coo_tensor(
                torch.arange(0, R, 2)[None], t[::2], (R, 2), fill_value=0.0
            )
        self.shared = torch.nn.Parameter(t)
        self.own = torch.nn.Parameter(torch.randn(R, 2, generator=g, dtype=torch.float64))
        self.sparse_grad = sparse_grad

    def forward(self, kj):
        out = list(
            kj.pooled(
                {1: self.shared, 3: self.shared, 4: self.own}, "sum", sparse_grad=self.sparse_grad
            ).values()
        )
        if not self.sparse_grad:
            out += kj.pooled({3: self.shared}, "max").values()
        return sum(((v - 0.3) ** 2).sum() for v in out)


@pytest.mark.parametrize(
    "backend,sparse_grad,kind",
    [
        ("aot_eager", False, "Parameter"),
        ("inductor", True, "Parameter"),
        ("aot_eager", False, "SparseTensor"),
    ],
)
def test_pooled_shared_table_training(backend, sparse_grad, kind):
    """Three training steps (SparseAdagrad on sparse gradients, else SGD) of a model whose keys share a table:
    the compiled model's losses and tables after the steps as eager's (fullgraph; no recompile on the third
    batch, except the SparseTensor table, whose count of stored rows grows each step: a parameter's sizes are
    static to dynamo)."""
    import copy

    model = SharedTables(sparse_grad, kind)
    twin = copy.deepcopy(model)
    opts = [
        segment.SparseAdagrad(list(m.parameters()), lr=0.1)
        if sparse_grad
        else torch.optim.SGD(m.parameters(), lr=0.1)
        for m in (model, twin)
    ]
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    for k in range(3):
        kj = _pooled_batch(k)
        with torch._dynamo.config.patch(error_on_recompile=k == 2 and kind == "Parameter"):
            losses = [compiled(kj), twin(kj)]
        torch.testing.assert_close(*losses)
        for o, loss in zip(opts, losses):
            o.zero_grad()
            loss.backward()
            o.step()
    assert model.shared.grad is None or type(model.shared.grad) is type(twin.shared.grad)
    torch.testing.assert_close(
        [_dense(p) for p in model.parameters()], [_dense(p) for p in twin.parameters()]
    )


def test_pooled_sparse_grad_twice_graph_break():
    """One table given ``sparse_grad=True`` by two ``pooled`` calls: two sparse gradients, whose sum torch 2.13
    cannot trace (data-dependent sizes): with ``fullgraph`` dynamo's error says what to do, without a graph
    break and the eager result and gradient."""
    table = torch.randn(R, 2, dtype=torch.float64, requires_grad=True)

    def f(kj):
        return kj.pooled({1: table}, "sum", sparse_grad=True)[1], kj.pooled(
            {3: table}, "mean", sparse_grad=True
        )[3]

    kj = _pooled_batch(0)
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match="in one KeyedJaggedBatch.pooled call"):
        torch.compile(f, backend="aot_eager", fullgraph=True)(kj)
    torch._dynamo.reset()
    got, want = torch.compile(f, backend="aot_eager")(kj), f(kj)
    torch.testing.assert_close(got, want)
    gg, gw = (torch.autograd.grad(a.sum() + 2 * b.sum(), table)[0] for a, b in (got, want))
    assert gg.is_sparse and gw.is_sparse
    torch.testing.assert_close(gg.to_dense(), gw.to_dense())


def test_pooled_sparse_grad_of_sparse_tensor_table_raises():
    """``sparse_grad=True`` asks for torch's sparse COO gradient of a dense table; a SparseTensor table's gradient
    is a SparseTensor: a TypeError saying so, eager and compiled (autograd refused the COO gradient with an
    internal 'hook has changed the type of value')."""
    import sparsefill

    table = sparsefill.sparse_coo_tensor([[0, 2]], torch.ones(2, 2), (R, 2)).requires_grad_()
    kj = _pooled_batch(0)
    f = lambda kj: kj.pooled({1: table, 3: table}, "sum", sparse_grad=True)  # noqa: E731
    torch._dynamo.reset()
    for fn in (f, torch.compile(f, backend="aot_eager")):
        with pytest.raises(
            TypeError, match="SparseTensor, whose gradient is a SparseTensor already"
        ):
            fn(kj)


def test_pooled_result_unused_checks_ids():
    """A compiled ``pooled`` whose result is unused still checks its ids (``jagged_pooled`` is never dead
    code): an id out of range of its table raises the eager error (inductor)."""
    tables = {k: torch.randn(R, 2, requires_grad=True) for k in (1, 3)}

    def f(kj, x):
        kj.pooled(tables, "sum")
        return x * 2

    bad = segment.KeyedJaggedBatch.from_lists([{1: [0, 2], 3: [R]}, {3: [1]}])
    with pytest.raises(IndexError) as want:
        kj_out = bad.pooled(tables, "sum")  # noqa: F841
    torch._dynamo.reset()
    cf = torch.compile(f, backend="inductor", fullgraph=True)
    cf(segment.KeyedJaggedBatch.from_lists([{1: [0, 2], 3: [1]}, {3: [1]}]), torch.ones(2))
    with pytest.raises(IndexError) as got:
        cf(bad, torch.ones(2))
    assert str(got.value) == str(want.value)


# torch.unique on other compiled paths, under inductor: masked/_canon (a strided mask's rows, a sparse mask's union
# with the pattern) compile with fullgraph; max(dim)'s sparse backward (ops/select_autograd) is behind a forward that
# does not trace: a clean graph break.


def _unique_case(name):
    """``(fn of the values v, v, fullgraph)``: a 4 x 4 COO of fill 0.25 built from ``v`` inside ``fn``."""
    import sparsefill
    from sparsefill import masked

    v = torch.tensor([1.0, -2.0, 3.0, 0.5, 4.0], dtype=torch.float64, requires_grad=True)
    A = lambda v: sparsefill.sparse_coo_tensor(
        [[0, 0, 1, 2, 3], [1, 3, 0, 2, 3]],
        v,
        (4, 4),  # noqa: E731
        fill_value=0.25,
    )
    ones = torch.ones(5, dtype=torch.bool)
    if name == "strided mask":
        mask = torch.tensor(
            [[1, 1, 0, 0], [0, 1, 1, 0], [1, 0, 1, 0], [0, 0, 0, 1]], dtype=torch.bool
        )
        B = torch.linspace(-2, 2, 16, dtype=torch.float64).view(4, 4)
        return lambda v: masked.logaddexp(A(v), B, input_mask=mask).to_dense(), v, True
    if name == "sparse mask":  # (partly outside the pattern, then inside it: the union's two ends)
        M = sparsefill.sparse_coo_tensor([[0, 1, 2, 3, 3], [0, 2, 1, 3, 0]], ones, (4, 4))
        M2 = sparsefill.sparse_coo_tensor([[0, 2], [1, 2]], ones[:2], (4, 4))
        return lambda v: (masked.amax(A(v), 1, mask=M), masked.sum(A(v), 0, mask=M2)), v, True
    return lambda v: A(v).max(1).values, v, False  # max(dim): a graph break


@pytest.mark.parametrize("name", ["strided mask", "sparse mask", "max dim"])
def test_unique_paths_inductor(name):
    """Compiled with inductor (fullgraph where it traces): forward and the values' gradient as eager."""
    fn, v, fullgraph = _unique_case(name)
    torch._dynamo.reset()
    got, want = torch.compile(fn, backend="inductor", fullgraph=fullgraph)(v), fn(v)
    got, want = (
        torch.stack(t)
        if isinstance(t, tuple)
        else t.to_dense()
        if type(t) is not torch.Tensor
        else t
        for t in (got, want)
    )
    torch.testing.assert_close(got, want, equal_nan=True)
    c = torch.linspace(-1, 1, want.numel(), dtype=want.dtype).view(want.shape)
    torch.testing.assert_close(
        torch.autograd.grad((got * c).nan_to_num().sum(), v),
        torch.autograd.grad((want * c).nan_to_num().sum(), v),
    )
    if not fullgraph:
        torch._dynamo.reset()
        with pytest.raises(torch._dynamo.exc.Unsupported, match="sparsefill"):
            torch.compile(fn, backend="inductor", fullgraph=True)(v)
