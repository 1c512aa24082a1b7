"""``A.to_dense()`` under tracing: ``_compile.traced()`` (``is_dynamo_compiling()``, the compile flag, the
FAKE mode) agrees with ``is_compiling()`` under torch.export (strict, non-strict) and make_fx (the eager,
fake-mode, compile-session, dynamo and backend cases are in tests/compile/test_compile.py); dynamo puts
no guard on the flag (no recompile when it flips); a compiled to_dense (aot_eager, fullgraph, dynamic)
equals eager, forward and backward; jit.trace and make_fx(tracing_mode="real") replay the dense result
(the by-address kernels step aside while torch's ops are recorded).
"""

import warnings
import pytest
import torch
import sparsefill
from sparsefill._kernels import merge as _merge
from tests.tensor.test_to_dense_eager import assert_identical, reference, N, NAN
from tests.autograd.test_to_dense_autograd import leaf, dense_ref, grads, W, SIZE, ROWS, COLS


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sparsefill.DensifyWarning)
        yield


# ---------------------------------------------------------------------- 1. traced(): export, make_fx, compile, jit
_FAKE = torch._C._TorchDispatchModeKey.FAKE


def old_traced() -> bool:
    """``traced()``'s earlier definition: ``is_compiling()`` or a FAKE mode."""
    return torch.compiler.is_compiling() or torch._C._get_dispatch_mode(_FAKE) is not None


def _probe(x):
    from sparsefill._kernels.trace import traced

    return x + (1 if traced() else 0) + (10 if old_traced() else 0)


def test_traced_agrees_under_export_and_make_fx():
    """torch.export strict (dynamo) and non-strict (the flag): both True (11); make_fx real: both False; fake and
    symbolic: both True. (Eager, fake mode, compile session, dynamo, backend: tests/compile/test_compile.py.)"""

    class M(torch.nn.Module):
        def forward(self, x):
            return _probe(x)

    x = torch.zeros(1)
    for strict in (True, False):
        assert torch.equal(torch.export.export(M(), (x,), strict=strict).module()(x), x + 11), (
            strict
        )
    from torch.fx.experimental.proxy_tensor import make_fx

    for mode, expected in (("real", 0), ("fake", 11), ("symbolic", 11)):
        assert torch.equal(make_fx(_probe, tracing_mode=mode)(x)(x), x + expected), mode


def test_export_to_dense_of_a_parameter_and_of_constructed_values():
    """torch.export (strict and non-strict) of a module holding a SparseTensor parameter, and of a function building
    one from its input: the exported program gives eager's result (the general path, not the by-address pass)."""

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.A = torch.nn.Parameter(
                sparsefill.sparse_coo_tensor(
                    [[1, 5, N - 1]], [1.0, 2.0, 3.0], (N,), fill_value=-0.0
                )
            )

        def forward(self, x):
            return x + self.A.to_dense()

    class C(torch.nn.Module):
        def forward(self, v):
            return sparsefill.sparse_coo_tensor(
                torch.tensor([[1, 5, N - 1]]), v, (N,), fill_value=2.0
            ).to_dense()

    m, x, v = M(), torch.randn(N), torch.tensor([7.0, 8.0, 9.0])
    for strict in (True, False):
        assert_identical(torch.export.export(m, (x,), strict=strict).module()(x), m(x))
        assert_identical(
            torch.export.export(C(), (torch.ones(3),), strict=strict).module()(v), C()(v)
        )


def test_compiled_to_dense_matches_eager_forward_backward_no_recompile():
    """aot_eager, fullgraph, dynamic: to_dense of A, A.t(), A[1] and of an indefinite A with a tensor fill_value
    that requires grad, values' and fill's gradients as eager; new values/nse of the same flags reuse the graph;
    flipping the compile flag between calls (another thread compiling) recompiles nothing."""

    def f(A, I, fv):
        return (
            (A.to_dense() * W).sum()
            + (A.t().to_dense() ** 2).sum()
            + (A[1].to_dense() * fv).sum()
            + (I.to_dense(fill_value=fv) * W).sum()
        )

    def inputs(n, seed):
        g = torch.Generator().manual_seed(seed)
        v = torch.randn(n, dtype=torch.float64, generator=g, requires_grad=True)
        idx = torch.stack(
            [torch.arange(n) % 3, torch.arange(n) % 4]
        )  # (distinct for n <= 12: coalesced)
        A = sparsefill.sparse_coo_tensor(idx, v, SIZE, fill_value=1.5)
        I = sparsefill.sparse_coo_tensor(idx, v, SIZE, fill_value=sparsefill.indefinite)
        return A, I, torch.tensor(0.5, dtype=torch.float64, requires_grad=True), v

    torch._dynamo.reset()
    cf = torch.compile(f, backend="aot_eager", fullgraph=True, dynamic=True)
    A, I, fv, v = inputs(5, 0)
    cf(A, I, fv)  # (the first compile)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for n, seed, flag in ((5, 1, False), (7, 2, False), (6, 3, True)):
            A, I, fv, v = inputs(n, seed)
            old = torch.compiler._is_compiling_flag
            torch.compiler._is_compiling_flag = flag
            try:
                out = cf(A, I, fv)
            finally:
                torch.compiler._is_compiling_flag = old
            g = grads(out, v, fv)
            A, I, fv, v = inputs(n, seed)
            ref = f(A, I, fv)
            e = grads(ref, v, fv)
            torch.testing.assert_close(out, ref)
            torch.testing.assert_close(g[0], e[0])
            torch.testing.assert_close(g[1], e[1])
    torch._dynamo.reset()


def test_eager_to_dense_while_another_thread_compiles():
    """The compile flag is process-wide: set (another thread compiling), an eager to_dense takes the general path
    (traced() True): the same result, the same gradients."""
    A, v = leaf()
    B = sparsefill.sparse_coo_tensor([[1, 5, N - 1]], [1.0, 2.0, 3.0], (N,), fill_value=NAN)
    old = torch.compiler._is_compiling_flag
    torch.compiler._is_compiling_flag = True
    try:
        DB, D = B.to_dense(), A.to_dense()
        (g,) = grads((D * W).sum(), v)
    finally:
        torch.compiler._is_compiling_flag = old
    assert_identical(DB, reference([[1, 5, N - 1]], torch.tensor([1.0, 2.0, 3.0]), (N,), NAN))
    torch.testing.assert_close(D, dense_ref(v.detach(), 2.0), rtol=0, atol=0)
    torch.testing.assert_close(g, W[ROWS, COLS])


def test_jit_trace_replays_to_dense():
    """torch.jit.trace of to_dense (>= 8192 elements, <= 1/4 stored) replays the dense result: the by-address pass
    writes memory the tracer never sees, so it declines while jit.trace records (else the trace holds new_empty
    alone and its replay returns uninitialized memory)."""
    if _merge._compiled() is False:
        pytest.skip("numba not installed: the torch ops are traced")
    idx = torch.tensor([[1, 5, N - 1]])

    def f(v):
        return sparsefill.sparse_coo_tensor(idx, v, (N,), fill_value=2.0).to_dense() * 1

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced_f = torch.jit.trace(f, (torch.ones(3),), check_trace=False)
    graph = str(traced_f.graph)
    assert any(
        op in graph for op in ("aten::fill_", "aten::copy_", "aten::full", "aten::expand")
    ), graph
    v = torch.tensor([7.0, 8.0, 9.0])
    assert_identical(traced_f(v), f(v))


def test_jit_trace_small_tensor_without_the_pass():
    """Under the pass's size (numba not needed) torch.jit.trace records fill_ and put_: the replay is right (the
    contrast to the test above)."""
    idx = torch.tensor([[1, 5, 60]])

    def f(v):
        return sparsefill.sparse_coo_tensor(idx, v, (64,), fill_value=2.0).to_dense() * 1

    calls = []
    real = _merge.fill_put_sorted
    try:
        _merge.fill_put_sorted = lambda *a: calls.append(1) or False  # (as without numba)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traced_f = torch.jit.trace(f, (torch.ones(3),), check_trace=False)
    finally:
        _merge.fill_put_sorted = real
    assert "aten::fill_" in str(traced_f.graph)
    v = torch.tensor([7.0, 8.0, 9.0])
    assert_identical(traced_f(v), f(v))


def test_make_fx_real_replays_to_dense():
    if _merge._compiled() is False:
        pytest.skip("numba not installed")
    from torch.fx.experimental.proxy_tensor import make_fx

    A = sparsefill.sparse_coo_tensor([[1, 5, N - 1]], [1.0, 2.0, 3.0], (N,), fill_value=2.0)
    gm = make_fx(lambda A: A.to_dense() * 1, tracing_mode="real")(A)
    ops = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert ops & _WRITES, (
        ops
    )  # (deterministic: new_empty's memory may happen to hold the right values)
    assert_identical(gm(A), A.to_dense())


_WRITES = {
    "aten.fill_.Tensor",
    "aten.fill_.Scalar",
    "aten.copy_.default",
    "aten.put_.default",
    "aten.index_copy_.default",
    "aten.index_put_.default",
    "aten.full.default",
    "aten.expand.default",
}
