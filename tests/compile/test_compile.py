"""torch.compile: compiled functions of SparseTensors give the eager result, forward and gradients of
values and fill, with ``fullgraph=True`` and no recompile when the pattern (and its nse) changes::

    compiled(A)            == f(A)                      (densified, equal_nan)
    grad(values, fill)     == eager grad(values, fill)

Backends: ``eager`` (dynamo, SparseTensor ops run by sparsefill's handlers), ``aot_eager`` (AOTAutograd
traces the handlers into aten ops on the inner tensors, forward and backward) and ``inductor`` on a few
cases (its compile is slow).  Each case is compiled once, warmed up on two patterns of different nse, then
run on a third with ``error_on_recompile``.  Where a handler cannot trace, compiling without ``fullgraph``
graph-breaks and gives the eager result.  Also: ``examples/gat.py``'s attention layer (three graphs of
different nse), ``sparsefill.masked`` reductions of a definite fill, and a smoke run of
``python -m sparsefill.benchmarks.cases_compile``.
"""

import warnings

import pytest
import torch
import torch._dynamo

import sparsefill
from sparsefill import SparseTensor
from tests.sparse_cases import assert_identical
from torch.testing import assert_close
from sparsefill import masked
from sparsefill.nn import SparseParameter
from tests.models.test_graph_attention import _adj, _E, _N
from tests.models import _LAYOUTS
from tests.models.test_training_loops import _W

pytestmark = pytest.mark.filterwarnings("ignore")

SHAPE = (6, 5)
X = torch.linspace(-1, 1, 15, dtype=torch.float64).reshape(5, 3)
Y = torch.linspace(-1, 2, 24, dtype=torch.float64).reshape(4, 6)


def make(nse, seed, *, layout=torch.sparse_coo, dense=(), fill=0.5):
    """``(A, values, fill)``: a coalesced SparseTensor of ``nse`` stored elements built from leaves that
    require grad (fill None: indefinite, no fill leaf)."""
    g = torch.Generator().manual_seed(seed)
    keys = torch.randperm(SHAPE[0] * SHAPE[1], generator=g)[:nse].sort().values
    idx = torch.stack([keys // SHAPE[1], keys % SHAPE[1]])
    vals = torch.randn((nse,) + dense, generator=g, dtype=torch.float64).requires_grad_()
    f = (
        sparsefill.indefinite
        if fill is None
        else torch.tensor(fill, dtype=torch.float64).requires_grad_()
    )
    A = sparsefill.sparse_coo_tensor(idx, vals, SHAPE + dense, fill_value=f)
    return (A.to_sparse_csr() if layout is torch.sparse_csr else A), vals, f


def dense(out):
    if isinstance(out, sparsefill.SparseTensor):
        return out.to_dense(fill_value=float("nan")) if out._indefinite else out.to_dense()
    return out


def weighted(out):
    """A loss that weighs every element differently (a plain sum would hide misplaced gradients)."""
    d = dense(out)
    if isinstance(out, sparsefill.SparseTensor) and out._indefinite:
        d = torch.nan_to_num(d)
    return (d * torch.linspace(0.1, 1, d.numel(), dtype=d.dtype).view(d.shape)).sum()


CASES = {
    "unary": lambda A, B: torch.exp(A * -8) + 1,
    "same_pattern": lambda A, B: A * A.exp() - A / 3,
    "scalar_0d": lambda A, B: A * torch.tensor(2.0, dtype=torch.float64) + 1.5,
    "dense_dims": lambda A, B: (
        A * torch.linspace(1, 2, A.shape[-1], dtype=A.dtype)
    ),  # (hybrid: over the dense dim)
    "union": lambda A, B: A + B,
    "sum": lambda A, B: A.sum(),
    "sum_dim": lambda A, B: A.sum(1),
    "amax_dim": lambda A, B: A.amax(0),
    "amin_dim": lambda A, B: A.amin(1),  # (along the last dim: the sorted-runs combine)
    "softmax": lambda A, B: torch.softmax(A, 1),
    "A@X": lambda A, B: A @ X,
    "Y@A": lambda A, B: Y @ A,
    "masked_softmax": lambda A, B: sparsefill.masked.softmax(A, 1),  # (run on an indefinite fill)
    "masked_sum": lambda A, B: sparsefill.masked.sum(A, 1),
    "masked_amax": lambda A, B: sparsefill.masked.amax(A, 0),
    # masked normalizations of a definite fill: dense by nature, compiled all-stored (static nse)
    "masked_softmax_def": lambda A, B: sparsefill.masked.softmax(A, 1),
    "masked_cumsum_def": lambda A, B: sparsefill.masked.cumsum(A, 0),
    "masked_normalize_mask": lambda A, B: sparsefill.masked.normalize(A, 2.0, 1, mask=B > 0),
}
FORMS = {"coo": {}, "csr": {"layout": torch.sparse_csr}, "hybrid": {"dense_shape": (3,)}}
ALL = tuple(FORMS)
# every case family in every form it applies to (eager backend: dynamo's graph, autograd eager)
FAMILIES = {
    **{n: ALL for n in CASES},
    "dense_dims": ("hybrid",),
    "A@X": ("coo", "csr"),
    "Y@A": ("coo", "csr"),
}


def run_case(name, backend, layout=torch.sparse_coo, dense_shape=(), fill=0.5):
    """``CASES[name]`` compiled (fullgraph) against eager on three pattern pairs of different nse, the third
    under ``error_on_recompile``: forward, and the gradients of values and fill of a loss computed inside
    the compiled function (backends with AOTAutograd: the joint graph) or of the compiled output (eager)."""
    fn = CASES[name]
    fill = None if name == "masked_softmax" else fill
    torch._dynamo.reset()
    out_c = torch.compile(fn, backend=backend, fullgraph=True)
    loss_c = (
        (lambda A, B: weighted(out_c(A, B)))
        if backend == "eager"
        else torch.compile(lambda A, B: weighted(fn(A, B)), backend=backend, fullgraph=True)
    )
    kw = dict(layout=layout, dense=dense_shape, fill=fill)
    leaves = (lambda v, f: [v]) if fill is None else (lambda v, f: [v, f])
    for step, (na, nb) in enumerate([(8, 6), (11, 9), (13, 4)]):
        with torch._dynamo.config.patch(error_on_recompile=step == 2):
            A, va, fa = make(na, 2 * step, **kw)
            B, _, _ = make(nb, 2 * step + 1, **{**kw, "fill": -0.25 if fill is not None else None})
            torch.testing.assert_close(dense(out_c(A, B)), dense(fn(A, B)), equal_nan=True)
            got = torch.autograd.grad(loss_c(A, B), leaves(va, fa))
            want = torch.autograd.grad(weighted(fn(A, B)), leaves(va, fa))
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name,form", [(n, f) for n, forms in FAMILIES.items() for f in forms])
def test_eager_backend(name, form):
    run_case(name, "eager", **FORMS[form])


@pytest.mark.parametrize(
    "name,form",
    [
        ("masked_sum", "coo"),
        ("masked_amax", "coo"),
        ("masked_softmax_def", "csr"),
        ("masked_normalize_mask", "hybrid"),
    ],
)
def test_aot_eager_masked_definite(name, form):
    """``sparsefill.masked`` of a definite fill: reductions without a mask (the pattern is the mask: known
    without reading the mask's values); normalizations (dense by nature: compiled in the all-stored form)."""
    run_case(name, "aot_eager", **FORMS[form])


@pytest.mark.parametrize(
    "name", ["unary", "union", "sum", "sum_dim", "amax_dim", "amin_dim", "softmax", "A@X", "Y@A"]
)
def test_aot_eager_coo(name):
    run_case(name, "aot_eager")


@pytest.mark.parametrize(
    "name,layout,dense_shape",
    [
        ("union", torch.sparse_csr, ()),
        ("sum_dim", torch.sparse_csr, ()),
        ("amin_dim", torch.sparse_csr, ()),
        ("A@X", torch.sparse_csr, ()),
        ("dense_dims", torch.sparse_coo, (3,)),
        ("sum_dim", torch.sparse_coo, (3,)),
    ],
)
def test_aot_eager_csr_hybrid(name, layout, dense_shape):
    run_case(name, "aot_eager", layout, dense_shape)


@pytest.mark.parametrize(
    "name,form",
    [
        ("unary", "coo"),
        ("unary", "csr"),
        ("scalar_0d", "coo"),
        ("dense_dims", "hybrid"),
        ("union", "coo"),
        ("union", "hybrid"),
        ("sum", "coo"),
        ("sum_dim", "csr"),
        ("amin_dim", "coo"),
        ("softmax", "coo"),
        ("A@X", "coo"),
        ("Y@A", "coo"),
    ],
)
def test_inductor(name, form):
    run_case(name, "inductor", **FORMS[form])


def test_sparse_output_gradient_through_sparse_ops():
    """A compiled function that returns a SparseTensor: the gradient that reaches it from sparsefill ops
    (a SparseTensor tangent, of another pattern than the traced one) goes through the compiled backward."""
    torch._dynamo.reset()
    f = torch.compile(lambda A: torch.exp(A * -8) + 1, backend="aot_eager", fullgraph=True)
    for nse, seed in [(8, 0), (12, 1)]:
        A, va, fa = make(nse, seed)
        B, _, _ = make(5, seed + 7)
        got = torch.autograd.grad(
            (f(A) * B).sum(), [va, fa]
        )  # (mul's backward: a SparseTensor of B's pattern)
        want = torch.autograd.grad(((torch.exp(A * -8) + 1) * B).sum(), [va, fa])
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize(
    "backend,layout,dense_shape,fill",
    [
        ("aot_eager", torch.sparse_coo, (), 0.5),
        ("aot_eager", torch.sparse_csr, (), 0.5),
        ("aot_eager", torch.sparse_coo, (3,), 0.5),
        ("aot_eager", torch.sparse_coo, (), None),
        ("inductor", torch.sparse_coo, (), 0.5),
    ],
)
def test_dense_gradient_of_sparse_output(backend, layout, dense_shape, fill):
    """A compiled function returns a SparseTensor and its gradient arrives dense: ``out.backward(G)`` with a
    dense ``G``, a dense loss of ``out`` computed eagerly, ``out.sum()``, and a second (dense) output alone
    differentiated (the SparseTensor's gradient then zero): values' and fill's gradients as eager, no
    recompile on a third pattern (COO, CSR, hybrid, an indefinite output)."""
    if fill is None:
        fn = lambda A: (sparsefill.masked.softmax(A, 1) * 2, (A * A).sum())  # noqa: E731
    else:
        fn = lambda A: (torch.exp(A * -8) + 1, (A * A).sum())  # noqa: E731
    torch._dynamo.reset()
    cf = torch.compile(fn, backend=backend, fullgraph=True)
    G = torch.linspace(
        -1, 1, 30 * (dense_shape[0] if dense_shape else 1), dtype=torch.float64
    ).view(SHAPE + dense_shape)
    losses = [
        lambda o: (o[0], G),
        lambda o: (weighted(o[0]), None),
        lambda o: (o[0].sum(), None),
        lambda o: (o[1], None),
    ]
    for step, nse in enumerate([8, 11, 13]):
        A, v, f = make(nse, step, layout=layout, dense=dense_shape, fill=fill)
        leaves = [v] if fill is None else [v, f]
        for loss in losses:
            with torch._dynamo.config.patch(error_on_recompile=step == 2):
                out, g = loss(cf(A))
                got = torch.autograd.grad(out, leaves, g)
            out, g = loss(fn(A))
            torch.testing.assert_close(got, torch.autograd.grad(out, leaves, g))


def test_graph_break_never_an_error():
    """Without fullgraph, an op whose handler does not trace (sparse @ sparse: torch's native sparse kernels) is a
    graph break and the result is the eager one; with fullgraph the break is reported.  (``masked.cumsum`` of an
    indefinite fill, once a break, now traces: tests/compile/test_compile_masked.py; here compiled without fullgraph.)"""
    fn = lambda A, B: torch.exp((A @ B.t()) * -1) + 1  # noqa: E731
    A, _, _ = make(8, 0)
    B, _, _ = make(9, 1)
    torch._dynamo.reset()
    torch.testing.assert_close(dense(torch.compile(fn, backend="eager")(A, B)), dense(fn(A, B)))
    M, _, _ = make(8, 0, fill=None)
    mc = lambda A: sparsefill.masked.cumsum(A * 2, 1)  # noqa: E731
    torch._dynamo.reset()
    torch.testing.assert_close(
        dense(torch.compile(mc, backend="eager")(M)), dense(mc(M)), equal_nan=True
    )
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match="sparsefill"):
        torch.compile(fn, backend="eager", fullgraph=True)(A, B)


def test_metadata_reads_no_data_and_marks_nse_dynamic():
    """``__tensor_flatten__``: metadata from no data (a fake fill would raise on a read), the nse dims of the
    inner tensors dynamic; ``__tensor_unflatten__`` accepts the 4-entry metadata of files saved before."""
    A, _, _ = make(8, 0)
    names, meta = A.__tensor_flatten__()
    assert names == ["_idx", "_vals", "_fill"] and meta == (torch.sparse_coo, False, True)
    assert A._idx._dynamo_propagated_dynamic_indices == {
        1
    } and A._vals._dynamo_propagated_dynamic_indices == {0}
    inner = {n: getattr(A, n) for n in names}
    old = sparsefill.SparseTensor.__tensor_unflatten__(inner, meta + (False,), A.shape, None)
    torch.testing.assert_close(old.to_dense(), A.to_dense())
    C, _, _ = make(8, 0, layout=torch.sparse_csr)
    names, meta = C.__tensor_flatten__()
    assert names == ["_crow", "_col", "_vals", "_fill"] and meta == (torch.sparse_csr, False, True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            F = sparsefill.SparseTensor(
                torch.sparse_coo,
                A.shape,
                mode.from_tensor(A._vals.detach()),
                mode.from_tensor(A._fill.detach()),
                indices=mode.from_tensor(A._idx),
                coalesced=True,
            )
            assert F.__tensor_flatten__()[1] == (torch.sparse_coo, False, True)
            assert not F._fill_is_zero()  # (structural only: never read)


def test_coerce_tangent():
    """A SparseTensor tangent is traced and converted in the all-stored form (sizes from the shape only), its
    dense tensor kept: uncoalesced, either layout, indefinite; a dense output's tangent has no such form."""
    from sparsefill._compile.dynamo import ALL_STORED, coerce_tangent

    G = sparsefill.sparse_coo_tensor(
        [[2, 0, 2], [1, 1, 1]], [1.0, 2.0, 3.0], (3, 2), fill_value=0.5
    )
    for layout in (torch.sparse_coo, torch.sparse_csr):
        for T in (G, G.to_sparse_csr()):
            H = coerce_tangent(T, (layout, False, True, ALL_STORED, 0))
            assert (
                H.__tensor_flatten__()[1] == (layout, False, True, ALL_STORED, 0) and H._nse() == 6
            )
            torch.testing.assert_close(H.to_dense(), G.to_dense())
            K = sparsefill.SparseTensor.__tensor_unflatten__(
                {n: getattr(H, n) for n in H.__tensor_flatten__()[0]},
                H.__tensor_flatten__()[1],
                H.shape,
                None,
            )
            assert K.__tensor_flatten__()[1][3:] == (ALL_STORED, 0)
    M = sparsefill.sparse_coo_tensor([[0]], [1.0], (2,), fill_value=sparsefill.indefinite)
    torch.testing.assert_close(
        coerce_tangent(M, (torch.sparse_coo, True, True, ALL_STORED)).to_dense(fill_value=9.0),
        torch.tensor([1.0, 0.0]),
    )
    assert coerce_tangent(G, (torch.sparse_coo, False, True, ALL_STORED), torch.Tensor) is None
    # a dense gradient (of a hybrid output: the metadata's 5th entry counts the dense dims)
    D = torch.arange(12.0).reshape(3, 2, 2)
    for layout in (torch.sparse_coo, torch.sparse_csr):
        H = coerce_tangent(D, (layout, False, True, ALL_STORED, 1), sparsefill.SparseTensor)
        assert H.__tensor_flatten__()[1] == (layout, False, True, ALL_STORED, 1) and H._nse() == 6
        torch.testing.assert_close(H.to_dense(), D)
    assert (
        D.__coerce_same_metadata_as_tangent__(
            (torch.sparse_coo, False, True, ALL_STORED, 1), torch.Tensor
        )
        is None
    )


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_constructor_inside(backend, layout):
    """The public constructors compile (recorded whole by dynamo): gradients reach values and fill, a new
    pattern does not recompile, and invariants are still checked (a runtime assert while traced)."""

    def f(a, b, v, fv):
        if layout is torch.sparse_csr:
            A = sparsefill.sparse_csr_tensor(a, b, v, (3, 4), fill_value=fv)
        else:
            A = sparsefill.sparse_coo_tensor(torch.stack([a, b]), v, (3, 4), fill_value=fv)
        return weighted(torch.exp(A * -8) + 1)

    coo = [([0, 1, 2, 2], [2, 0, 1, 3]), ([0, 0, 1, 2, 2], [1, 2, 0, 0, 3]), ([1, 1, 2], [0, 3, 2])]
    torch._dynamo.reset()
    cf = torch.compile(f, backend=backend, fullgraph=True)
    for step, (r, c) in enumerate(coo):
        r, c = torch.tensor(r), torch.tensor(c)
        a = torch._convert_indices_from_coo_to_csr(r, 3) if layout is torch.sparse_csr else r
        v = torch.linspace(1, 2, len(c), dtype=torch.float64, requires_grad=True)
        fv = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
        with torch._dynamo.config.patch(error_on_recompile=step == 2):
            got = torch.autograd.grad(cf(a, c, v, fv), [v, fv])
        torch.testing.assert_close(got, torch.autograd.grad(f(a, c, v, fv), [v, fv]))
    with pytest.raises((IndexError, RuntimeError), match="out of range"):
        cf(a, c + 5, v, fv)


def _example(name):
    """examples/<name>.py loaded from the checkout (the bench cases' loader: one module per script)."""
    from pathlib import Path
    from sparsefill.benchmarks.cases_models import _example as load

    folder = Path(__file__).resolve().parents[2] / "examples"
    if not (folder / f"{name}.py").is_file():
        pytest.skip(f"no {folder / name}.py (not a source checkout)")
    return load(name, folder)


def _gat():
    return _example("gat")


@pytest.mark.parametrize(
    "backend,layout",
    [
        ("aot_eager", torch.sparse_coo),
        ("aot_eager", torch.sparse_csr),
        ("inductor", torch.sparse_coo),
    ],
)
def test_gat_layer(backend, layout):
    """examples/gat.py's attention layer (scores on an indefinite-fill adjacency, ``F.leaky_relu``,
    ``sparsefill.masked.softmax``, ``@``): forward and the gradients of the parameters and the features as
    eager, on three graphs of the same nodes and different edges (nse), the third without a recompile."""
    gat = _gat()
    torch.manual_seed(0)
    layer = gat.GATLayer(4, 3).double()
    params = list(layer.parameters())
    torch._dynamo.reset()
    cf = torch.compile(layer, backend=backend, fullgraph=True)
    for step in range(3):
        x, edge_index, _ = gat.make_graph(15, 2, 4, 3, seed=step)
        x = x.double().requires_grad_()
        A = gat.adjacency(edge_index, 15, layout).double()
        with torch._dynamo.config.patch(error_on_recompile=step == 2):
            out = cf(x, A)
            want = layer(x, A)
            torch.testing.assert_close(out, want)
            w = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)
            torch.testing.assert_close(
                torch.autograd.grad((out * w).sum(), params + [x]),
                torch.autograd.grad((want * w).sum(), params + [x]),
            )


def test_benchmark_script_smoke():
    """``python -m sparsefill.benchmarks.cases_compile`` at a tiny size on the eager backend: every part runs
    (each checks its compiled result against eager before timing) and reports."""
    from sparsefill.benchmarks import cases_compile

    _example("gat"), _example("dlrm")  # (from the checkout: an installed package has no examples/)
    out = cases_compile.main(
        [
            "--sizes",
            "10",
            "--nodes",
            "40",
            "--dlrm-batch",
            "8",
            "--dlrm-rows",
            "50",
            "--scale-nodes",
            "40",
            "--scale-heads",
            "2",
            "--scale-edges-per-node",
            "3",
            "--scale-hidden",
            "6",
            "--scale-rounds",
            "1",
            "--rounds",
            "1",
            "--reps",
            "1",
            "--backend",
            "eager",
        ]
    )
    assert set(out) == {("exp", 10), "gat", ("gat at scale", 40, 2, 3), "dlrm"}
    at_scale = out[("gat at scale", 40, 2, 3)]
    assert out["gat"]["compiled"] > 0 and at_scale["compiled"][0] > 0
    assert at_scale["hidden"] == 6 and 40 < at_scale["edges"] <= 40 * 4
    only = cases_compile.main(
        ["--only-scale", "--scale-nodes", "30", "--scale-heads", "1", "--scale-rounds", "1"]
        + ["--scale-reps", "1", "--backend", "eager"]
    )
    assert set(only) == {("gat at scale", 30, 1, 10)}


def test_traced_agrees_with_is_compiling():
    """``_compile.traced()`` reads ``torch.compiler.is_dynamo_compiling()`` and the compile session's flag (cheaper
    than ``is_compiling()``): it is False eagerly, True in dynamo's trace (constant-folded: no guard on the flag, no
    recompile per call), in AOTAutograd's trace, under a FakeTensorMode and in a compile session; the names it
    reads exist (a torch that renames them fails here, not silently)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from sparsefill._kernels.trace import traced

    assert hasattr(torch.compiler, "_is_compiling_flag") and callable(
        torch.compiler.is_dynamo_compiling
    )
    assert traced() is False and torch.compiler.is_compiling() is False
    with FakeTensorMode():
        assert traced()
    with torch.compiler._compile_session_context():
        assert traced() == torch.compiler.is_compiling() is True
    seen = []

    def backend(gm, example_inputs):  # AOTAutograd-like: runs inside the compile session
        seen.append(traced())
        return gm.forward

    f = torch.compile(lambda x: x + 1 if traced() else x - 1, backend=backend, fullgraph=True)
    x = torch.arange(3.0)
    with torch._dynamo.config.patch(error_on_recompile=True):
        assert (
            torch.equal(f(x), x + 1) and torch.equal(f(x), x + 1) and torch.equal(f(x + 2), x + 3)
        )
    assert seen == [True] and traced() is False


# ---------------------------------------------------------------------- torch.compile (aot_eager), a few cases
def test_compiled_fast_paths_match_eager():
    import torch._dynamo

    A = sparsefill.sparse_coo_tensor([[0, 1, 1], [1, 0, 2]], [1.0, 2.0, 3.0], (2, 3))
    e = torch.tensor([[1.0, -2.0, 3.0], [4.0, 5.0, -6.0]])
    I = sparsefill.sparse_coo_tensor([[0, 2]], torch.tensor([1, 2]), (4,))

    def f(A, e, I):
        return (A * e).exp() * 2, I * 1, I * 1.0

    torch._dynamo.reset()
    got = torch.compile(f, backend="aot_eager")(A, e, I)
    ref = f(A, e, I)
    for a, b in zip(got, ref):
        assert_identical(a.to_dense() if isinstance(a, SparseTensor) else a, b.to_dense())


def test_indefinite_constructor_and_sparse_parameter_compile_fullgraph():
    """A learned per-edge attention bias as ``SparseParameter`` of the masked adjacency, inside a compiled function:
    the fill_value=[] spelling of a constructor compiles, the sentinel should too.  (The sentinel
    enters dynamo's graph as a constant, ``_compile._as_constant``.)"""
    torch._dynamo.reset()
    bias = SparseParameter(_adj(values=torch.randn(_E)))
    e = torch.randn(_N)

    def f(e):
        return masked.softmax(bias() * e[:, None], 1) @ e

    assert_close(torch.compile(f, backend="eager", fullgraph=True)(e), f(e))


# ---------------------------------------------------------------------------------------------- in-place ops in a compiled function
_INPLACE = {
    "mul_": lambda W: W.mul_(2.0),
    "add_scalar": lambda W: W.add_(1.5),
    "add_same_pattern": lambda W: W.add_(W * 0.5),
    "addcmul_": lambda W: W.addcmul_(W, W, value=0.25),
}


@_LAYOUTS
def test_compiled_inplace_on_input_writes_through(layout):
    """An in-place op on a SparseTensor input of a compiled function reaches the caller's tensor (it was silently
    dropped: AOTAutograd saw no write into the input's inner tensors; ``ops/_writes._traced_write_``).  One
    compiled function applies each op of ``_INPLACE`` to its own input (one graph per layout: each write is
    checked on its input, in the first call and in the cached graph's)."""
    torch._dynamo.reset()
    ops = list(_INPLACE.values())
    refs = [op(_W().to_dense()) for op in ops]

    def f(*Ws):
        with torch.no_grad():
            for op, W in zip(ops, Ws):
                op(W)

    for _ in range(2):  # the second call runs the cached graph
        Ws = [_W(layout).coalesce() if layout is torch.sparse_coo else _W(layout) for _ in ops]
        torch.compile(f, backend="aot_eager", fullgraph=True)(*Ws)
        for name, W, ref in zip(_INPLACE, Ws, refs):
            assert isinstance(W, sparsefill.SparseTensor) and W.sparse_layout is layout, name
            assert_close(W.to_dense(), ref, msg=lambda m: f"{name}: {m}")


def test_compiled_inplace_new_pattern_graph_break_or_error():
    """A result with another pattern cannot be written into an input's inner tensors: a graph break (the op runs
    eagerly, exactly: an uncoalesced input's result is coalesced, a union adds elements); with fullgraph an
    error naming sparsefill."""
    torch._dynamo.reset()
    B = sparsefill.sparse_coo_tensor(
        [[0, 0, 1], [0, 1, 1]], [5.0, 6.0, 7.0], (4, 3), fill_value=0.2
    )
    W, U = (
        _W(),
        sparsefill.sparse_coo_tensor(
            [[0, 1, 0], [1, 2, 1]], [1.0, 2.0, 3.0], (4, 3), fill_value=0.1
        ),
    )
    refW, refU = W.to_dense() + B.to_dense(), U.to_dense() * 2

    def f(W, B, U):
        W.add_(B)
        U.mul_(2.0)

    torch.compile(f, backend="aot_eager")(W, B, U)
    assert_close(W.to_dense(), refW)
    assert_close(U.to_dense(), refU)
    torch._dynamo.reset()

    def g(W, B):
        W.add_(B)

    with pytest.raises(torch._dynamo.exc.Unsupported, match="sparsefill"):
        torch.compile(g, backend="aot_eager", fullgraph=True)(_W().coalesce(), B)


def test_compiled_intermediate_inplace_and_aliases():
    """In-place ops on a SparseTensor made inside the compiled function keep tracing; an intermediate sharing
    the input's index tensor is not disturbed by a write into the input."""
    torch._dynamo.reset()
    D = _W().to_dense()

    def f(W):
        C = W * 2
        C.add_(1.0)
        with torch.no_grad():
            W.mul_(3.0)
        return C

    W = _W().coalesce()
    C = torch.compile(f, backend="aot_eager", fullgraph=True)(W)
    assert_close(C.to_dense(), D * 2 + 1)
    assert_close(W.to_dense(), D * 3)
    B = sparsefill.sparse_coo_tensor(
        [[0, 0, 1, 1], [0, 1, 0, 1]], [4.0, 5.0, 6.0, 7.0], (4, 3), fill_value=0.3
    )

    def g(
        W, B, G
    ):  # another pattern of the same nse written into an intermediate and into an input
        C = W * 2
        C.copy_(B)
        G.copy_(B)
        return C, W * 1

    W = _W().coalesce()
    G = W * 5  # shares W's index tensor
    C, W1 = torch.compile(g, backend="aot_eager")(W, B, G)
    assert_close(C.to_dense(), B.to_dense())
    assert_close(G.to_dense(), B.to_dense())
    assert_close(W1.to_dense(), D)
    assert_close(W.to_dense(), D)
