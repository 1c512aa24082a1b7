"""torch.compile of training steps over SparseTensor parameters, without ``fullgraph`` (where
tracing is impossible a graph break, never an error): the compiled step runs and trains as the eager loop on the
dense equivalent::

    losses(compiled step on P) == losses(eager step on P.to_dense())    W after the steps alike

for optimizers with state (SGD momentum / Nesterov, Adam, AdamW, RMSprop), COO and CSR, backends ``eager`` and
``aot_eager``, the whole step compiled or ``optimizer.step`` alone.  Such a step's gradient and momentum buffer hold
the parameter's index tensor (sparsefill shares a same pattern), which dynamo (the parameter is a graph
attribute) and AOTAutograd (one wrapper per input) failed on.  Small sizes.
"""

import pytest
import torch
import torch._dynamo
from torch.testing import assert_close

import sparsefill
from tests.models.test_training_loops import _loss

pytestmark = pytest.mark.filterwarnings("ignore")

_X = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
_Y = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))

OPTIMIZERS = {
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "sgd_nesterov": lambda p: torch.optim.SGD(
        p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01
    ),
    "adam": lambda p: torch.optim.Adam(p, lr=0.05),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.05, weight_decay=0.1),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.5),
}


def _W(layout):
    A = sparsefill.sparse_coo_tensor(
        [[0, 1, 3, 2], [1, 2, 0, 2]], [1.0, 2.0, 3.0, -1.0], (4, 3), fill_value=0.1
    )
    return A.coalesce() if layout is torch.sparse_coo else A.to_sparse(layout=layout)


def _train(opt, layout, backend, whole, sparse, steps=3):
    """``steps`` training steps of ``((X @ W.t() - Y) ** 2).mean()``: the losses and W after them (dense)."""
    W = torch.nn.Parameter(_W(layout) if sparse else _W(layout).to_dense())
    o = OPTIMIZERS[opt]([W])

    def loss():
        return ((_X @ W.t() - _Y) ** 2).mean()

    def step():
        o.zero_grad()
        out = loss()
        out.backward()
        o.step()
        return out.detach()

    if sparse and whole:
        step = torch.compile(step, backend=backend)
    elif sparse:
        compiled = torch.compile(o.step, backend=backend)

        def step():
            o.zero_grad()
            out = loss()
            out.backward()
            compiled()
            return out.detach()

    losses = torch.stack([step() for _ in range(steps)])
    if sparse:
        assert type(W) is sparsefill.SparseTensor and W.sparse_layout is layout
    return W.detach().to_dense() if sparse else W.detach(), losses


@pytest.mark.parametrize(
    "opt,layout,backend,whole",
    [
        ("sgd_momentum", torch.sparse_coo, "aot_eager", True),
        ("sgd_momentum", torch.sparse_csr, "eager", True),
        ("sgd_nesterov", torch.sparse_coo, "aot_eager", False),
        ("adam", torch.sparse_coo, "aot_eager", False),
        ("adam", torch.sparse_csr, "eager", True),
        ("adamw", torch.sparse_csr, "aot_eager", False),
        ("rmsprop", torch.sparse_coo, "eager", False),
    ],
    ids=lambda v: (
        v if isinstance(v, str) else {True: "step", False: "opt.step"}.get(v, str(v).split("_")[-1])
    ),
)
def test_compiled_training_with_optimizer_state_matches_dense(opt, layout, backend, whole):
    torch._dynamo.reset()
    W, losses = _train(opt, layout, backend, whole, sparse=True)
    Wd, losses_d = _train(opt, layout, backend, whole, sparse=False)
    assert_close(losses, losses_d, rtol=1e-5, atol=1e-5)
    assert_close(W, Wd, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_optimizer_step_gradient_sharing_the_index(backend):
    """An eager backward whose gradient keeps the parameter's pattern (its very index tensor), then a compiled
    ``optimizer.step`` (plain SGD): the parameter, a graph attribute, shares an inner tensor with an input (it
    raised InternalTorchDynamoError: a node used before its definition)."""
    torch._dynamo.reset()
    A = _W(torch.sparse_coo)
    W, Wd = torch.nn.Parameter(A.clone()), torch.nn.Parameter(A.to_dense())
    o, od = torch.optim.SGD([W], lr=0.1), torch.optim.SGD([Wd], lr=0.1)
    step = torch.compile(o.step, backend=backend)
    for _ in range(3):
        o.zero_grad()
        od.zero_grad()
        (W * W).sum().backward()
        (Wd * Wd).sum().backward()
        assert W.grad._idx is W._idx  # (the case under test)
        step()
        od.step()
        assert_close(W.detach().to_dense(), Wd.detach())


def _weights(layout):
    """Three weights of (4, 3), another pattern and fill each (one uncoalesced COO): a warm-up, a recompile
    with dynamic sizes, a reuse."""

    def make(idx, vals, fill, coalesce=True):
        A = sparsefill.sparse_coo_tensor(idx, vals, (4, 3), fill_value=fill)
        A = A.coalesce() if coalesce else A
        return A if layout is torch.sparse_coo else A.to_sparse(layout=layout)

    return [
        make([[0, 1, 3, 2], [1, 2, 0, 2]], [1.0, 2.0, 3.0, -1.0], 0.1),
        make([[0, 3, 2], [1, 0, 2]], [1.0, 3.0, -1.0], 0.0),
        make(
            [[0, 1, 3, 2, 2, 0], [1, 2, 0, 2, 1, 2]],
            [1.0, 2.0, 3.0, -1.0, 4.0, 5.0],
            -0.5,
            coalesce=False,
        ),
    ]


_LINEAR = {
    "x@W.t()": lambda x, W: x @ W.t(),
    "F.linear": lambda x, W: torch.nn.functional.linear(x, W, torch.arange(4.0)),
    "x@W.mT": lambda x, W: x @ W.mT,
}


@pytest.mark.parametrize(
    "fn,layout,fullgraph",
    [
        ("F.linear", torch.sparse_coo, False),
        ("x@W.t()", torch.sparse_csr, False),
        ("x@W.mT", torch.sparse_coo, True),
    ],
)
def test_inductor_transposed_weight(fn, layout, fullgraph):
    """``x @ W.t()`` / ``F.linear(x, W, b)`` with a SparseTensor ``W`` under inductor, forward and gradients of
    ``x`` and ``W`` against eager: the transpose's re-coalesce gave ``unique_consecutive``, and without
    ``fullgraph`` the handlers' ``nonzero``, which inductor refused (DynamicOutputShapeException)."""
    torch._dynamo.reset()
    f = _LINEAR[fn]
    compiled = torch.compile(f, backend="inductor", fullgraph=fullgraph)
    for i, A in enumerate(_weights(layout)):
        x = torch.randn(5, 3, generator=torch.Generator().manual_seed(i))
        (W, x1), (We, x2) = [
            (A.clone().requires_grad_(), x.clone().requires_grad_()) for _ in range(2)
        ]
        out, ref = compiled(x1, W), f(x2, We)
        assert_close(out, ref)
        G = torch.randn(ref.shape, generator=torch.Generator().manual_seed(10 + i))
        out.backward(G)
        ref.backward(G)
        assert_close(x1.grad, x2.grad)
        assert_close(W.grad.to_dense(), We.grad.to_dense())


def _adagrad_run(compile_step, sparse):
    """Three ``SparseAdagrad`` steps on an embedding table (sparse or dense gradients): the table and losses."""
    from sparsefill import segment

    emb = torch.nn.Embedding(10, 3, sparse=sparse)
    emb.weight.data = torch.randn(10, 3, generator=torch.Generator().manual_seed(0))
    o = segment.SparseAdagrad(emb.parameters(), lr=0.1)
    step = compile_step(o.step) if compile_step else o.step
    losses = []
    for ids in (torch.tensor([1, 3, 3, 7]), torch.tensor([0, 1, 2]), torch.tensor([9, 9])):
        o.zero_grad()
        loss = emb(ids).pow(2).sum()
        loss.backward()
        assert emb.weight.grad.is_sparse == sparse
        step()
        losses.append(loss.detach())
    return emb.weight.detach(), torch.stack(losses)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_sparse_adagrad_native_sparse_gradients_graph_break(backend):
    """``SparseAdagrad.step`` on torch native sparse gradients (which no compiled graph can take:
    pytorch/pytorch#130687) compiled without ``fullgraph``: a graph break, the eager result."""
    torch._dynamo.reset()
    W, losses = _adagrad_run(lambda f: torch.compile(f, backend=backend), sparse=True)
    We, losses_e = _adagrad_run(None, sparse=True)
    assert_close(W, We)
    assert_close(losses, losses_e)


def test_sparse_adagrad_native_sparse_gradients_fullgraph_error():
    """With ``fullgraph=True`` an error naming sparsefill and the cause; dense gradients still compile whole."""
    torch._dynamo.reset()
    with pytest.raises(
        torch._dynamo.exc.Unsupported, match="sparsefill: .*native sparse gradients"
    ):
        _adagrad_run(lambda f: torch.compile(f, backend="eager", fullgraph=True), sparse=True)
    torch._dynamo.reset()
    W, losses = _adagrad_run(
        lambda f: torch.compile(f, backend="eager", fullgraph=True), sparse=False
    )
    We, losses_e = _adagrad_run(None, sparse=False)
    assert_close(W, We)
    assert_close(losses, losses_e)


def test_sum_of_a_union_fullgraph():
    """``(A * B).sum()`` of two patterns (a union of unbacked nse) with ``fullgraph=True``, value and gradients of
    both values and fills against eager (the full sum guarded on the unbacked count: an error)."""
    idx = ([[0, 1, 3, 2], [1, 2, 0, 2]], [[0, 2], [1, 1]])

    def parts():
        return [
            t.requires_grad_()
            for t in (
                torch.tensor([1.0, 2.0, 3.0, -1.0]),
                torch.tensor(0.1),
                torch.tensor([1.0, 2.0]),
                torch.tensor(0.2),
            )
        ]

    def f(va, fa, vb, fb):
        A = sparsefill.sparse_coo_tensor(idx[0], va, (4, 3), fill_value=fa)
        B = sparsefill.sparse_coo_tensor(idx[1], vb, (4, 3), fill_value=fb)
        return (A * B).sum()

    torch._dynamo.reset()
    compiled = torch.compile(lambda A, B: (A * B).sum(), backend="aot_eager", fullgraph=True)
    p, q = parts(), parts()
    A = sparsefill.sparse_coo_tensor(idx[0], p[0], (4, 3), fill_value=p[1])
    B = sparsefill.sparse_coo_tensor(idx[1], p[2], (4, 3), fill_value=p[3])
    out, ref = compiled(A, B), f(*q)
    assert_close(out, ref)
    out.backward()
    ref.backward()
    for a, b in zip(p, q):
        assert_close(a.grad, b.grad)


def _example(name):
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[2] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_compiled_rare_events_step():
    """``examples/rare_events.py``'s forward and backward (windows of a sparse signal) compiled with ``aot_eager``,
    no ``fullgraph``: loss and gradients of values and fill as eager (the backward's ``torch.unique`` outside a
    handler's dispatch, and dynamo compiling numba's dispatcher frames, raised)."""
    example = _example("rare_events")
    positions, values = example.make_events(20_000, 0.002)
    for fn in example.PIPELINES:
        torch._dynamo.reset()
        got = torch.compile(example.step, backend="aot_eager")(
            example.sparse_signal, positions, values, 20_000, fn
        )
        ref = example.step(example.sparse_signal, positions, values, 20_000, fn)
        for a, b in zip(got, ref):
            assert_close(a, b, rtol=1e-7, atol=1e-12)


def test_compiled_sparse_attention_training_step():
    """``examples/sparse_attention.py``'s AdamW step (SDDMM scores on an indefinite-fill mask, ``masked.softmax``,
    checkpoint) compiled with ``aot_eager``, no ``fullgraph``: the eager losses (the backward's ``sparse_mask``
    read index bounds and a repeat count from the data: errors in AOTAutograd's trace)."""
    example = _example("sparse_attention")
    torch._dynamo.reset()
    step, _ = example.setup(48, 0.1)
    ref, _ = example.setup(48, 0.1)
    compiled = torch.compile(step, backend="aot_eager")
    assert_close(
        torch.tensor([compiled() for _ in range(2)]),
        torch.tensor([ref() for _ in range(2)]),
        rtol=1e-4,
        atol=1e-5,
    )


def test_compiled_training_step_matches_dense():
    """zero_grad, forward, backward and an SGD step under one torch.compile (graph breaks allowed), a
    SparseTensor nn.Parameter against the eager loop on its dense equivalent (it silently did not train)."""
    torch._dynamo.reset()
    out = []
    for sparse in (True, False):
        W = torch.nn.Parameter(_W(torch.sparse_coo) if sparse else _W(torch.sparse_coo).to_dense())
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
