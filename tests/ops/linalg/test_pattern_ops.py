"""The custom ops of the compiled sparse-dense products (``sparsefill::pattern_spmm``,
``sparsefill::pattern_sddmm``: ``ops/linalg/pattern_ops.py``) against the dense products they stand
for, values and gradients, on sorted and unsorted patterns with repeated pairs; their registrations
(fake, autograd) checked by ``torch.library.opcheck``; an index out of range raises; and a
SparseTensor product compiled with ``fullgraph=True`` records them and trains as eager does."""

from __future__ import annotations

import pytest
import torch

import sparsefill
from sparsefill._kernels import segment as _kernels
from sparsefill.ops.linalg import pattern_ops

pytestmark = pytest.mark.skipif(
    not _kernels.compiled_available(), reason="the compiled kernels need numba"
)


def _pattern(m, k, n, sort, seed=0):
    """``n`` pairs ``(rows, cols)`` in ``[0, m) x [0, k)`` (repeats included), rows sorted or
    not."""
    g = torch.Generator().manual_seed(seed)
    rows, cols = torch.randint(0, m, (n,), generator=g), torch.randint(0, k, (n,), generator=g)
    if sort:
        rows = rows.sort().values
    return rows, cols


def _dense(w, rows, cols, m, k):
    """The ``(m, k)`` matrix of the pattern: repeated pairs add up."""
    return w.new_zeros(m, k).index_put((rows, cols), w, accumulate=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("sort", [True, False])
def test_pattern_products_equal_dense_values_and_gradients(dtype, sort):
    m, k, d = 7, 5, 3
    rows, cols = _pattern(m, k, 23, sort)
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(23, generator=g, dtype=dtype), torch.randn(k, d, generator=g, dtype=dtype)
    u = torch.randn(m, d, generator=g, dtype=dtype)
    leaves = [t.clone().requires_grad_() for t in (w, x, u)]
    wl, xl, ul = leaves
    out = pattern_ops.pattern_spmm(wl, xl, rows, cols, m)
    s = pattern_ops.pattern_sddmm(ul, xl, rows, cols)
    dense = [t.clone().requires_grad_() for t in (w, x, u)]
    wd, xd, ud = dense
    want_out = _dense(wd, rows, cols, m, k) @ xd
    want_s = (ud @ xd.T)[rows, cols]
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(s, want_s)
    G, h = torch.randn(m, d, generator=g, dtype=dtype), torch.randn(23, generator=g, dtype=dtype)
    got = torch.autograd.grad((out * G).sum() + (s * h).sum(), leaves)
    want = torch.autograd.grad((want_out * G).sum() + (want_s * h).sum(), dense)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_pattern_ops_registrations():
    rows, cols = _pattern(4, 3, 9, sort=False)
    g = torch.Generator().manual_seed(2)
    w = torch.randn(9, generator=g, dtype=torch.float64, requires_grad=True)
    x = torch.randn(3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    u = torch.randn(4, 2, generator=g, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(torch.ops.sparsefill.pattern_spmm, (w, x, rows, cols, 4))
    torch.library.opcheck(torch.ops.sparsefill.pattern_sddmm, (u, x, rows, cols))
    assert torch.autograd.gradcheck(
        lambda w, x, u: (
            pattern_ops.pattern_spmm(w, x, rows, cols, 4),
            pattern_ops.pattern_sddmm(u, x, rows, cols),
        ),
        (w, x, u),
    )


def test_pattern_ops_index_out_of_range():
    x = torch.randn(3, 2)
    rows, cols = torch.tensor([0, 1]), torch.tensor([0, 3])
    with pytest.raises(IndexError):
        pattern_ops.pattern_spmm(torch.ones(2), x, rows, cols, 2)
    with pytest.raises(IndexError):
        pattern_ops.pattern_sddmm(x, x, rows, cols)


def test_pattern_ops_sorted_rows_edges_and_non_finite():
    """Sorted rows with empty segments first, between and last (the sorted kernel) equal the
    scattered sum; a sorted row index past the output raises; NaN and inf in the sampled dot
    products propagate as dense (the dot products are summed in any order)."""
    x = torch.tensor([[1.0, 2.0], [3.0, float("inf")], [float("nan"), 1.0]])
    rows, cols = torch.tensor([1, 1, 3, 3, 3]), torch.tensor([0, 2, 1, 0, 1])
    w = torch.tensor([1.0, 0.0, 2.0, -1.0, 0.5])
    want = _dense(w, rows, cols, 5, 3) @ x.nan_to_num(nan=7.0, posinf=9.0)
    got = pattern_ops.pattern_spmm(w, x.nan_to_num(nan=7.0, posinf=9.0), rows, cols, 5)
    torch.testing.assert_close(got, want)
    with pytest.raises(IndexError):
        pattern_ops.pattern_spmm(w, x, rows, cols, 3)
    u = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, -1.0]])
    torch.testing.assert_close(
        pattern_ops.pattern_sddmm(u, x, rows, cols), (u @ x.T)[rows, cols], equal_nan=True
    )


def test_compiled_sparse_product_records_pattern_ops_and_trains_as_eager():
    """``softmax(A * s) @ X`` trained three steps: the compiled loss (``fullgraph=True``, one graph,
    no recompile) and its gradients equal eager's, its graphs run the two ops (forward product,
    backward sampled product and transposed product)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    g = torch.Generator().manual_seed(3)
    n = 12
    keys = torch.unique(torch.randint(0, n * n, (40,), generator=g))
    A = sparsefill.sparse_coo_tensor(
        torch.stack([keys // n, keys % n]),
        torch.ones(keys.numel(), dtype=torch.float64),
        (n, n),
        fill_value=sparsefill.indefinite,
    )
    X = torch.randn(n, 8, generator=g, dtype=torch.float64, requires_grad=True)
    s = torch.randn(n, generator=g, dtype=torch.float64, requires_grad=True)

    def loss(X, s):
        P = sparsefill.masked.softmax(A * s[:, None], 1)
        return ((P @ X) ** 2).sum()

    ops = []

    def backend(gm, example_inputs):
        from functorch.compile import make_boxed_func
        from torch._functorch.aot_autograd import aot_module_simplified

        def record(graph, _):
            ops.extend(str(v.target) for v in graph.graph.nodes if v.op == "call_function")
            return make_boxed_func(graph.forward)

        return aot_module_simplified(gm, example_inputs, fw_compiler=record, bw_compiler=record)

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(loss, backend=backend, fullgraph=True)
    with _kernels.use_backend("numba"):
        for step in range(3):
            with torch._dynamo.config.patch(error_on_recompile=step > 0):
                got = compiled(X, s)
            want = loss(X, s)
            torch.testing.assert_close(got, want)
            gg = torch.autograd.grad(got, (X, s))
            gw = torch.autograd.grad(want, (X, s))
            for a, b in zip(gg, gw):
                torch.testing.assert_close(a, b)
            with torch.no_grad():
                X -= 0.1 * gw[0]
                s -= 0.1 * gw[1]
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"] and not counters["recompiles"]
    # forward, and P^T @ G (rows of 64 bytes: a transpose of shorter rows keeps the gather)
    assert ops.count("sparsefill.pattern_spmm.default") == 2
    assert ops.count("sparsefill.pattern_sddmm.default") == 1  # the gradient of P
