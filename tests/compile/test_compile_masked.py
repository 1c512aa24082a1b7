"""torch.compile of ``sparsefill.masked`` normalizations of an INDEFINITE fill: softmax, log_softmax and
softmin with a mask, cumsum and cumprod, normalize, along a sparse and a dense dim, compile with ``fullgraph=True``
(backends ``eager``, ``aot_eager``, inductor) and give the eager result, forward and the gradient of the values::

    densify(compiled(A)) == densify(f(A))                 (NaN at the masked-out elements, equal_nan)
    grad(values)         == eager grad(values)

Each case is compiled once, warmed up on two patterns of different nse, then run on a third with
``error_on_recompile``.  Masks: None (the pattern), a sparse mask on the input's pattern (``A > 0``), a sparse mask
of another pattern (indefinite fill), a sparse mask of a definite fill, a strided mask.  COO, CSR and hybrid
inputs; float64, float32 and int64 (the scans).
"""

import pytest
import torch
import torch._dynamo

import sparsefill
from torch.testing import assert_close
from sparsefill import masked
from tests.models.test_graph_attention import _N

pytestmark = pytest.mark.filterwarnings("ignore")

M = sparsefill.masked
SHAPE = (6, 5)
STRIDED = torch.tensor([[True, False, True, True, False]]).expand(
    6, 5
)  # (a strided mask, broadcast rows)
DEF = sparsefill.sparse_coo_tensor(
    [[0, 1, 2, 4], [1, 2, 3, 0]], [1.0, -1.0, 2.0, 3.0], SHAPE, fill_value=0.5
)


def make(nse, seed, *, layout=torch.sparse_coo, dense=()):
    """``(A, values)``: a coalesced SparseTensor with indefinite fill and ``nse`` stored elements, from a leaf."""
    g = torch.Generator().manual_seed(seed)
    keys = torch.randperm(SHAPE[0] * SHAPE[1], generator=g)[:nse].sort().values
    idx = torch.stack([keys // SHAPE[1], keys % SHAPE[1]])
    vals = torch.randn((nse,) + dense, generator=g, dtype=torch.float64).requires_grad_()
    A = sparsefill.sparse_coo_tensor(idx, vals, SHAPE + dense, fill_value=sparsefill.indefinite)
    return (A.to_sparse_csr() if layout is torch.sparse_csr else A), vals


def dense(out):
    if isinstance(out, sparsefill.SparseTensor):
        masked = float("nan") if out.dtype.is_floating_point else -99
        return out.to_dense(fill_value=masked) if out._indefinite else out.to_dense()
    return out


def weighted(out):
    """A loss weighing every element differently (masked-out and NaN elements: 0)."""
    d = torch.nan_to_num(dense(out), nan=0.0, posinf=0.0, neginf=0.0)
    return (d * torch.linspace(0.1, 1, d.numel(), dtype=d.dtype).view(d.shape)).sum()


CASES = {
    "softmax_mask": lambda A, B: M.softmax(A, 1, mask=A > 0),
    "log_softmax_mask0": lambda A, B: M.log_softmax(A * 2, 0, mask=A > -0.5),
    "softmin_other_mask": lambda A, B: M.softmin(A, 1, mask=B > 0),
    "softmax_strided_mask": lambda A, B: M.softmax(A, 1, mask=STRIDED),
    "softmax_definite_mask": lambda A, B: M.softmax(
        A, 1, mask=DEF > 0
    ),  # (a True fill: read densely)
    "cumsum_definite_mask": lambda A, B: M.cumsum(A, 0, mask=DEF < 0),
    "cumsum1": lambda A, B: M.cumsum(A, 1),
    "cumsum0_mask": lambda A, B: M.cumsum(A, 0, mask=A > 0),
    "cumprod1": lambda A, B: M.cumprod(A, 1),
    "normalize2": lambda A, B: M.normalize(A, 2.0, 1),
    "normalize1_mask0": lambda A, B: M.normalize(A, 1.0, 0, mask=A < 0.5),
    "softmax_float32": lambda A, B: M.softmax(A.to(torch.float32), 1, mask=A > 0),
    "cumprod_float32": lambda A, B: M.cumprod(A.to(torch.float32) + 1, 0),
    "log_softmax_dense_dim": lambda A, B: M.log_softmax(
        A, -1, mask=A > 0
    ),  # (hybrid: along the dense dim)
    "cumsum_dense_dim": lambda A, B: M.cumsum(A, -1),
    # (reductions along dim 0: slices grouped by column, compiled by a count over the columns, no sort)
    "sum0_by_column": lambda A, B: M.sum(A * 2, 0),
    "amax0_by_column": lambda A, B: M.amax(A, 0, keepdim=True),
    # (the edge softmax of an n-ary result: its nse is an unbacked size, never tested)
    "softmax_of_sum": lambda A, B: M.softmax(A * 2 + B, 1),
    "torch_softmax_of_sum": lambda A, B: torch.softmax(A + B, 0),
    "torch_log_softmax_of_product": lambda A, B: torch.log_softmax(A * B, 1),
}
FORMS = {"coo": {}, "csr": {"layout": torch.sparse_csr}, "hybrid": {"dense": (3,)}}
SPARSE_DIM = [n for n in CASES if "dense_dim" not in n]


def run_case(name, backend, form):
    fn = CASES[name]
    kw = FORMS[form]
    torch._dynamo.reset()
    out_c = torch.compile(fn, backend=backend, fullgraph=True)
    loss_c = (
        (lambda A, B: weighted(out_c(A, B)))
        if backend == "eager"
        else torch.compile(lambda A, B: weighted(fn(A, B)), backend=backend, fullgraph=True)
    )
    for step, (na, nb) in enumerate([(8, 6), (11, 9), (13, 4)]):
        with torch._dynamo.config.patch(error_on_recompile=step == 2):
            A, va = make(na, 2 * step, **kw)
            B, _ = make(nb, 2 * step + 1, **kw)
            got, want = out_c(A, B), fn(A, B)
            assert isinstance(got, sparsefill.SparseTensor) and got._indefinite == want._indefinite
            torch.testing.assert_close(dense(got), dense(want), equal_nan=True)
            torch.testing.assert_close(
                torch.autograd.grad(loss_c(A, B), [va]),
                torch.autograd.grad(weighted(fn(A, B)), [va]),
            )


@pytest.mark.parametrize(
    "name,form",
    [(n, f) for n in SPARSE_DIM for f in ("coo", "csr")]
    + [
        (n, "hybrid")
        for n in (
            "softmax_mask",
            "cumsum1",
            "normalize2",
            "log_softmax_dense_dim",
            "cumsum_dense_dim",
        )
    ],
)
def test_eager_backend(name, form):
    run_case(name, "eager", form)


@pytest.mark.parametrize(
    "name,form",
    [
        ("sum0_by_column", "coo"),
        ("softmax_mask", "csr"),
        ("softmin_other_mask", "coo"),
        ("softmax_strided_mask", "coo"),
        ("cumsum0_mask", "coo"),
        ("cumprod1", "csr"),
        ("normalize1_mask0", "coo"),
        ("log_softmax_dense_dim", "hybrid"),
    ],
)
def test_aot_eager(name, form):
    """AOTAutograd traces the joint graph (a few cases: each compile takes seconds; every case on ``eager``)."""
    run_case(name, "aot_eager", form)


def test_inductor():
    run_case("softmax_mask", "inductor", "coo")


@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
def test_integer_scan(op):
    """int64 values (no gradient): the running sum/product in int64, as eager, no recompile on a third pattern."""
    fn = lambda A: getattr(M, op)((A.detach() * 3).to(torch.int64), 1)  # noqa: E731
    torch._dynamo.reset()
    cf = torch.compile(fn, backend="aot_eager", fullgraph=True)
    for step, nse in enumerate([8, 11, 13]):
        with torch._dynamo.config.patch(error_on_recompile=step == 2):
            A, _ = make(nse, step)
            got = cf(A)
            assert got.dtype == torch.int64
            torch.testing.assert_close(dense(got), dense(fn(A)))


def test_graph_break_where_not_traceable():
    """A torch native sparse mask cannot enter a compiled graph (torch's own limit): without ``fullgraph`` a
    graph break with the eager result, with ``fullgraph`` dynamo's Unsupported, never another error."""
    A, _ = make(8, 0)
    native = (DEF > 0).to_dense().to_sparse()
    fn = lambda A: M.cumsum(A, 1, mask=native)  # noqa: E731
    torch._dynamo.reset()
    torch.testing.assert_close(
        dense(torch.compile(fn, backend="eager")(A)), dense(fn(A)), equal_nan=True
    )
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported):
        torch.compile(fn, backend="eager", fullgraph=True)(A)


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
def test_edge_softmax_of_an_empty_sum(layout):
    """The edge softmax of ``A + B`` (an unbacked nse) under ``fullgraph=True``, compiled on overlapping patterns,
    then run without a recompile on two whose result stores nothing: empty values and gradients, as eager."""
    fn = lambda A, B: M.softmax(A + B, 1)  # noqa: E731
    torch._dynamo.reset()
    cf = torch.compile(fn, backend="aot_eager", fullgraph=True)
    rows = {"a": [0, 0, 2, 3, 5], "b": [1, 1, 4, 4, 4]}
    for step, (ra, rb) in enumerate([("a", "a"), ("a", "a"), ("a", "b")]):
        with torch._dynamo.config.patch(error_on_recompile=step == 2):
            va, vb = (torch.randn(5, dtype=torch.float64, requires_grad=True) for _ in range(2))
            A, B = (
                sparsefill.sparse_coo_tensor(
                    [rows[r], [0, step + 1, 1, 2, 3]], v, SHAPE, fill_value=sparsefill.indefinite
                ).to_sparse(layout=layout)
                for r, v in ((ra, va), (rb, vb))
            )
            got, want = cf(A, B), fn(A, B)
            assert isinstance(got, sparsefill.SparseTensor) and got._indefinite
            assert got._nse() == want._nse() == (0 if step == 2 else 5)
            torch.testing.assert_close(dense(got), dense(want), equal_nan=True)
            ga = torch.autograd.grad(weighted(got), [va, vb], allow_unused=True)
            gw = torch.autograd.grad(weighted(want), [va, vb], allow_unused=True)
            torch.testing.assert_close(ga, gw)


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
def test_indefinite_constructor_in_graph(layout):
    """A constructor with ``fill_value=sparsefill.indefinite`` inside a compiled function
    traces with ``fullgraph=True`` (the sentinel enters the graph as a constant), the result
    masked, values and gradients as eager, no recompile on a third pattern."""

    def fn(idx, v):
        if layout is torch.sparse_coo:
            A = sparsefill.sparse_coo_tensor(
                idx, v, SHAPE, fill_value=sparsefill.indefinite, is_coalesced=True
            )
        else:
            A = sparsefill.sparse_csr_tensor(*idx, v, SHAPE, fill_value=sparsefill.indefinite)
        return M.softmax(A * 2, 1)

    torch._dynamo.reset()
    cf = torch.compile(fn, backend="aot_eager", fullgraph=True)
    for step, nse in enumerate([8, 11, 13]):
        with torch._dynamo.config.patch(error_on_recompile=step == 2):
            A, v = make(nse, step, layout=layout)
            idx = A._idx if layout is torch.sparse_coo else (A._crow, A._col)
            got, want = cf(idx, v), fn(idx, v)
            assert isinstance(got, sparsefill.SparseTensor) and got._indefinite and want._indefinite
            torch.testing.assert_close(dense(got), dense(want), equal_nan=True)
            torch.testing.assert_close(
                torch.autograd.grad(weighted(got), [v]), torch.autograd.grad(weighted(want), [v])
            )


# Conversions of a constructor's result inside the graph (an uncoalesced COO's to_sparse_csr
# was dynamo's internal PendingUnbackedSymbolNotFound, its coalesce's count an unbound size).
def _coo(i, v, **kw):
    return sparsefill.sparse_coo_tensor(i, v, (4, 5), **kw)


CONVERSIONS = {
    "csr": lambda i, v: _coo(i, v).to_sparse_csr(),
    "csr_indefinite": lambda i, v: _coo(i, v, fill_value=sparsefill.indefinite).to_sparse_csr(),
    "csr_then_coo": lambda i, v: _coo(i, v, fill_value=0.5).to_sparse_csr().to_sparse_coo(),
    "refill": lambda i, v: _coo(i, v, fill_value=0.5).to_sparse(fill_value=1.0),
    "csr_refill": lambda i, v: _coo(i, v).to_sparse(layout=torch.sparse_csr, fill_value=2.0),
    "prune": lambda i, v: _coo(i, v).prune(),
    "coalesce_indices": lambda i, v: (
        _coo(i, v).coalesce().indices() * 1,
        _coo(i, v).coalesce().values() * 2,
    ),
    "csr_matmul": lambda i, v: (
        _coo(i, v).to_sparse_csr() @ torch.linspace(-1, 1, 10, dtype=v.dtype).view(5, 2)
    ),
}


@pytest.mark.parametrize("name", list(CONVERSIONS))
def test_conversion_of_an_in_graph_constructor(name):
    """An uncoalesced COO built in the graph (duplicates), converted: fullgraph (aot_eager), no recompile on a third
    pattern, the dense result and the values' gradient as eager."""
    fn = CONVERSIONS[name]
    torch._dynamo.reset()
    cf = torch.compile(fn, backend="aot_eager", fullgraph=True)
    g = torch.Generator().manual_seed(3)
    for step, nse in enumerate([6, 9, 11]):
        with torch._dynamo.config.patch(error_on_recompile=step == 2):
            i = torch.stack(
                [torch.randint(0, 4, (nse,), generator=g), torch.randint(0, 5, (nse,), generator=g)]
            )
            i[:, 1] = i[:, 0]  # (a duplicate at least)
            v = torch.randn(nse, dtype=torch.float64, generator=g, requires_grad=True)
            got, want = (
                tuple(dense(t) for t in (r if isinstance(r, tuple) else (r,)))
                for r in (cf(i, v), fn(i, v))
            )
            torch.testing.assert_close(got, want, equal_nan=True)
            loss = [sum(weighted(t) for t in r if t.requires_grad) for r in (got, want)]
            if isinstance(loss[1], torch.Tensor):
                torch.testing.assert_close(
                    torch.autograd.grad(loss[0], v), torch.autograd.grad(loss[1], v)
                )


def test_to_torch_in_graph_is_a_named_graph_break():
    """``to_torch`` (a native sparse tensor of a data-dependent nse: torch does not trace it) is a graph break with
    the eager result, and with ``fullgraph`` a named error, never dynamo's unnamed guard error."""
    i, v = torch.tensor([[0, 2, 1, 2], [1, 0, 2, 0]]), torch.randn(4)
    fn = lambda i, v: _coo(i, v).to_torch() * 2  # noqa: E731
    torch._dynamo.reset()
    torch.testing.assert_close(
        torch.compile(fn, backend="eager")(i, v).to_dense(), fn(i, v).to_dense()
    )
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match="sparsefill: to_torch not traceable"):
        torch.compile(fn, backend="eager", fullgraph=True)(i, v)


def test_masked_softmax_of_a_union_compiles_fullgraph():
    """(``ops.reductions.edge_softmax.applies`` once tested the union's unbacked nse, a guard on data.)"""
    keep = torch.rand(_N, _N, generator=torch.Generator().manual_seed(1)) < 0.3
    A = sparsefill.sparse_coo_tensor(
        keep.nonzero().t(), torch.ones(int(keep.sum())), (_N, _N), fill_value=sparsefill.indefinite
    )
    I = sparsefill.sparse_coo_tensor(
        torch.arange(_N).repeat(2, 1), torch.zeros(_N), (_N, _N), fill_value=sparsefill.indefinite
    )

    def f(A, I, v):
        return masked.softmax(A * v[:, None] + I, 1) @ v

    torch._dynamo.reset()
    v = torch.randn(_N)
    assert_close(torch.compile(f, backend="eager", fullgraph=True)(A, I, v), f(A, I, v))
