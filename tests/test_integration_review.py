"""Integration review: a PyTorch user's model code on SparseTensors, each checked against the same code on the
dense equivalent (values, and the types torch's conventions give).

The tests after "open findings" were the review's open findings (strict xfails), each now fixed.  Small
sizes, one compiled function per case where several ops share it (the file runs in ~11 s of CPU).
"""

import copy
import io

import warnings

import pytest
import torch
from torch.testing import assert_close

import sparsefill

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _W(layout=torch.sparse_coo, fill=0.1):
    A = sparsefill.sparse_coo_tensor(
        [[0, 1, 3, 2], [1, 2, 0, 2]], [1.0, 2.0, 3.0, -1.0], (4, 3), fill_value=fill
    )
    return A if layout is torch.sparse_coo else A.to_sparse(layout=layout)


_X = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
_Y = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
_LAYOUTS = pytest.mark.parametrize(
    "layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"]
)


def _loss(P):
    return ((_X @ P.t() - _Y) ** 2).mean()


@_LAYOUTS
@pytest.mark.parametrize("clip", [None, "norm", "value"])
def test_manual_loop_hooks_and_clipping_match_dense(layout, clip):
    """A hand-written loop: a tensor hook scaling the gradient, gradient clipping, ``P -= lr * P.grad`` under
    no_grad, ``grad.zero_()``; the SparseTensor stays a leaf SparseTensor of its layout."""
    W, Wd = _W(layout).requires_grad_(), _W().to_dense().requires_grad_()
    norms = []
    for P in (W, Wd):
        P.register_hook(lambda g: g * 0.5)
        for _ in range(3):
            _loss(P).backward()
            if clip == "norm":
                norms.append(torch.nn.utils.clip_grad_norm_([P], 0.05))
            elif clip == "value":
                torch.nn.utils.clip_grad_value_([P], 0.05)
            with torch.no_grad():
                P -= 0.1 * P.grad
            P.grad.zero_()
    assert isinstance(W, sparsefill.SparseTensor) and W.is_leaf and W.sparse_layout is layout
    assert_close(W.detach().to_dense(), Wd.detach())
    if norms:
        assert_close(torch.stack(norms[:3]), torch.stack(norms[3:]))


def test_checkpoint_and_state_dict_roundtrip():
    """``torch.utils.checkpoint`` through a SparseTensor weight; the module's state_dict through
    ``torch.save``/``torch.load(weights_only=True)`` into a deep copy, then loaded into a dense module."""
    from torch.utils.checkpoint import checkpoint

    m = torch.nn.Linear(3, 4)
    m.weight = torch.nn.Parameter(_W(torch.sparse_csr))
    md = copy.deepcopy(m)
    md.weight = torch.nn.Parameter(m.weight.detach().to_dense().clone())
    for mod in (m, md):
        checkpoint(lambda x: torch.tanh(mod(x)).sum(), _X, use_reentrant=False).backward()
    assert isinstance(m.weight.grad, sparsefill.SparseTensor)
    assert_close(m.weight.grad.to_dense(), md.weight.grad)
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    sd = torch.load(buf, weights_only=True)
    m2 = copy.deepcopy(m)
    with torch.no_grad():
        m2.weight.mul_(0)
    m2.load_state_dict(sd)
    assert m2.weight.sparse_layout is torch.sparse_csr
    assert_close(m2.weight.detach().to_dense(), m.weight.detach().to_dense())
    dense = torch.nn.Linear(3, 4)
    dense.load_state_dict(sd)
    assert type(dense.weight) is torch.nn.Parameter
    assert_close(dense.weight.detach(), m.weight.detach().to_dense())


# ---------------------------------------------------------------------------------------------- open findings
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


def test_compiled_training_step_matches_dense():
    """zero_grad, forward, backward and an SGD step under one torch.compile (graph breaks allowed), a
    SparseTensor nn.Parameter against the eager loop on its dense equivalent (it silently did not train)."""
    torch._dynamo.reset()
    out = []
    for sparse in (True, False):
        W = torch.nn.Parameter(_W().coalesce() if sparse else _W().to_dense())
        o = torch.optim.SGD([W], lr=0.05)

        def step():
            o.zero_grad()
            loss = _loss(W)
            loss.backward()
            o.step()
            return loss.detach()

        step = torch.compile(step, backend="aot_eager") if sparse else step
        losses = torch.stack([step() for _ in range(2)])  # (the second step runs the cached graphs)
        out.append((W.detach().to_dense() if sparse else W.detach(), losses))
    assert_close(out[0][1], out[1][1], rtol=1e-5, atol=1e-5)
    assert_close(out[0][0], out[1][0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_precision_matmul(dtype):
    """bfloat16/float16 products as dense (they raised NotImplementedError: torch's sparse kernels have no half
    types; ``ops/linalg.product`` computes them in float32 and rounds once, as dense CPU ``mm``)."""
    W, x = _W().to(dtype), _X.T[:, :2].to(dtype)
    assert_close(W @ x, W.to_dense() @ x)
    assert_close(torch.nn.functional.linear(x.T, W), torch.nn.functional.linear(x.T, W.to_dense()))


@_LAYOUTS
def test_autocast_sparse_linear_matches_nn_linear(layout):
    """``SparseLinear`` under ``torch.autocast("cpu", dtype=torch.bfloat16)`` as ``nn.Linear`` of its dense weight:
    a bfloat16 output (autocast casts the SparseTensor weight, its fill too, and the bias) and float32 gradients
    of the stored values, the trained fill and the bias as the dense weight's (positive data: bfloat16's relative
    tolerance holds for the sums)."""
    lin = sparsefill.nn.SparseLinear.from_sparse(
        _W(layout, fill=0.3).abs(), torch.full((4,), 0.5), train_fill=True
    )
    dense = torch.nn.Linear(3, 4)
    with torch.no_grad():
        dense.weight.copy_(lin.weight.to_dense())
        dense.bias.copy_(lin.bias)
    x = _X.abs() + 0.5
    out = []
    for m in (lin, dense):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = m(x)
        (y.float() * torch.arange(1.0, 21.0).reshape(5, 4)).sum().backward()
        out.append(y)
    assert out[0].dtype == out[1].dtype == torch.bfloat16
    assert_close(out[0], out[1])
    gW, P = dense.weight.grad, lin.sparse_weight
    mask = (
        lin.weight.to_dense(fill_value=0) != 0
    )  # the pattern (stored values are nonzero), row-major as values
    tol = dict(rtol=1.6e-2, atol=1e-5)
    assert_close(P.values.grad, gW[mask], **tol)
    assert_close(P.fill.grad, gW[~mask].sum(), **tol)
    assert_close(lin.bias.grad, dense.bias.grad, **tol)


def test_format_zero_dim():
    """f-strings format a 0-d SparseTensor's item as torch.Tensor's (it raised TypeError); any other one as torch
    does (``""``: str, a format spec: TypeError)."""
    A = _W()
    D = A.to_dense()
    assert f"{A[0, 1]:.2f}" == "1.00" and f"{A[0, 0]:>8.3f}" == f"{D[0, 0]:>8.3f}" == "   0.100"
    assert f"{A[0, 0]}" == f"{D[0, 0]}" and f"{A.sum():.4g}" == f"{D.sum():.4g}"
    assert f"{A.requires_grad_()[0, 1]:.1f}" == "1.0"
    assert f"{A}" == str(A)
    for T in (A, D):
        with pytest.raises(TypeError, match="unsupported format string"):
            f"{T:.2f}"
    assert f"{sparsefill.sparse_coo_tensor([[0]], [3], (2,))[1]:03d}" == "000"
    B = sparsefill.sparse_coo_tensor([[0]], [1.5], (2,), fill_value=sparsefill.indefinite)
    assert f"{B[0]:.2f}" == "1.50"
    with pytest.raises(ValueError, match="indefinite"):
        f"{B[1]:.2f}"


def test_item_of_one_element():
    """``item()``, ``float()``, ``bool()`` of a one-element SparseTensor: its stored value (duplicates summed) or its
    fill, no DensifyWarning; a specified element of an indefinite tensor its value, an unspecified one a ValueError;
    more elements: torch's error."""
    A = sparsefill.sparse_coo_tensor(
        [[0, 1, 0], [1, 0, 1]], [1.0, 2.0, 3.0], (2, 3), fill_value=5.0
    )
    D = A.to_dense()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i, j in [(0, 1), (1, 0), (1, 2)]:
            assert A[i, j].item() == D[i, j].item() and float(A[i, j]) == float(D[i, j])
            assert bool(A[i, j]) and int(A.to(torch.int64)[i, j]) == int(D.to(torch.int64)[i, j])
        H = sparsefill.sparse_coo_tensor(
            [[0]], torch.tensor([[7]]), (1, 1), fill_value=torch.tensor([2])
        )
        assert H.item() == 7 and (H * 0).sum().item() == 0
        assert (
            sparsefill.sparse_coo_tensor([[0, 0]], [True, False], (1,), fill_value=False).item()
            is True
        )
        M = sparsefill.sparse_coo_tensor(
            [[0], [1]], [1.5], (2, 3), fill_value=sparsefill.indefinite
        )
        assert M[0, 1].item() == 1.5
        with pytest.raises(ValueError, match="indefinite"):
            M[0, 0].item()
    with pytest.raises(RuntimeError, match="6 elements cannot be converted"):
        A.item()


def test_func_grad_through_constructor():
    from torch.func import grad

    idx = [[0, 1, 3, 2], [1, 2, 0, 2]]
    g = grad(
        lambda v: (
            sparsefill.sparse_coo_tensor(idx, v, (4, 3), fill_value=0.1) @ torch.ones(3)
        ).sum()
    )(torch.ones(4))
    assert_close(g, torch.ones(4))
