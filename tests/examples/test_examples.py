"""The models of ``examples/`` at smoke size, against their peers.

- ``gat.py``: the two-layer GAT on an indefinite-fill SparseTensor adjacency (COO and CSR) gives
  torch_geometric ``GATConv``'s forward output and its losses over three Adam steps, same weights;
- ``dlrm.py``: the DLRM on a ``KeyedJaggedBatch`` pooled with ``sparsefill.segment`` + ``SparseAdagrad``
  gives the losses and the tables of ``nn.EmbeddingBag(sparse=True)`` + ``torch.optim.Adagrad``;
- ``rare_events.py``: the rare-event pipeline's loss and the gradients of the signal's values and fill
  equal dense torch's, with the windowed mean as ``avg_pool1d`` and as a ``cumsum`` difference, and
  without it; the ``avg_pool1d`` form and the one without a window densify nothing;
- each script's ``main`` (the command line) runs at a tiny size.

The scripts are loaded from the checkout's ``examples/`` folder (skipped, with the reason, when the
tests run without it).  The full sizes are in ``python -m sparsefill bench --filter model:``.
"""

import math
import warnings
from pathlib import Path

import pytest
import torch

import sparsefill

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if not EXAMPLES.is_dir():
    pytest.skip(
        f"no examples/ folder at {EXAMPLES} (not a source checkout)", allow_module_level=True
    )


def _load(name):
    """The checkout's script, through the bench cases' loader (one module per script for both)."""
    from sparsefill.benchmarks.cases_models import _example

    return _example(name, EXAMPLES)


@pytest.fixture
def gat():
    pytest.importorskip("torch_geometric", reason="the GAT peer: pip install '.[test]'")
    return _load("gat")


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
@pytest.mark.parametrize("heads", [1, 4])
def test_gat_matches_gatconv(gat, layout, heads):
    """Outputs and three Adam steps' losses equal ``GATConv(heads=heads)``'s; with 4 heads the
    adjacency is a hybrid ``(N, N, 4)`` tensor and the product an einsum over its dense dim."""
    losses = gat.check(nodes=200, steps=3, layout=layout, heads=heads)
    assert len(losses) == 3 and all(math.isfinite(a) for a, _ in losses)
    assert losses[-1][0] < losses[0][0]  # it trains


def test_multi_head_gat_layer_is_the_dense_masked_model(gat):
    """Each head of the hybrid layer equals the dense formula with -inf off the edges, forward and the
    gradients of every parameter."""
    n, heads = 50, 3
    x, A, edge_index, y, model, _ = gat.setup(n, with_peer=False, heads=heads)
    layer = model.layer1
    adj = torch.zeros(n, n, dtype=torch.bool).index_put_(
        (edge_index[1], edge_index[0]), torch.tensor(True)
    )

    def dense(x):
        Wh = layer.lin(x).view(n, heads, -1)
        e_dst, e_src = (Wh * layer.att_dst).sum(-1), (Wh * layer.att_src).sum(-1)
        S = torch.nn.functional.leaky_relu(e_dst[:, None, :] + e_src[None, :, :], 0.2)
        P = torch.softmax(S.masked_fill(~adj[:, :, None], -math.inf), 1)
        return torch.einsum("ijh,jhd->ihd", P, Wh).flatten(1) + layer.bias

    out, ref = layer(x, A), dense(x)
    torch.testing.assert_close(out, ref)
    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(0))
    grads = torch.autograd.grad(out, list(layer.parameters()), g)
    ref_grads = torch.autograd.grad(ref, list(layer.parameters()), g)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_gat_is_the_dense_masked_model(gat):
    """The layer equals the dense formula with -inf off the edges (the peer aside)."""
    x, A, edge_index, y, model, _ = gat.setup(60, with_peer=False)
    layer = model.layer1
    Wh = layer.lin(x)
    S = (Wh @ layer.att_dst)[:, None] + (Wh @ layer.att_src)[None, :]
    adj = torch.zeros(60, 60, dtype=torch.bool).index_put_(
        (edge_index[1], edge_index[0]), torch.tensor(True)
    )
    dense = (
        torch.softmax(torch.nn.functional.leaky_relu(S, 0.2).masked_fill(~adj, -math.inf), 1) @ Wh
        + layer.bias
    )
    torch.testing.assert_close(layer(x, A), dense)


def _layer_grads(gat, softmax):
    """The first layer's parameter gradients with ``softmax`` over the scores, on the SparseTensor adjacency
    and, for ``softmax=None``, the dense masked model (scores of non-edges -inf before torch.softmax)."""
    x, A, edge_index, y, model, _ = gat.setup(60, with_peer=False)
    layer = model.layer1
    adj = torch.zeros(60, 60, dtype=torch.bool).index_put_(
        (edge_index[1], edge_index[0]), torch.tensor(True)
    )
    Wh = layer.lin(x)
    A = A if softmax is not None else adj.to(x.dtype)
    S = torch.nn.functional.leaky_relu(
        A * (Wh @ layer.att_dst)[:, None] + A * (Wh @ layer.att_src)[None, :], 0.2
    )
    P = softmax(S, 1) if softmax is not None else torch.softmax(S.masked_fill(~adj, -math.inf), 1)
    (P @ Wh).square().sum().backward()
    return [p.grad for p in layer.parameters() if p.grad is not None]


def test_gat_layer_gradients_are_the_dense_masked_models(gat):
    torch.testing.assert_close(
        _layer_grads(gat, sparsefill.masked.softmax), _layer_grads(gat, None), rtol=1e-5, atol=1e-4
    )  # float32, sums in another order


def test_gat_layer_with_torch_softmax(gat):
    """The layer with the dense model's spelling ``torch.softmax``: the dense masked model's gradients, nothing
    densified (its backward once raised 'to_dense() of a SparseTensor with indefinite fill')."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        got = _layer_grads(gat, torch.softmax)
    torch.testing.assert_close(got, _layer_grads(gat, None), rtol=1e-5, atol=1e-4)


def test_gat_parameter_gradients_are_dense_tensors(gat):
    """After a step every parameter's gradient is a plain dense tensor of its shape (torch's leaf contract)."""
    x, A, edge_index, y, model, _ = gat.setup(80, with_peer=False)
    gat.trainer(model, (x, A), y)()
    for name, p in model.named_parameters():
        assert type(p.grad) is torch.Tensor and p.grad.shape == p.shape, name


def test_dlrm_matches_embedding_bag():
    dlrm = _load("dlrm")
    losses = dlrm.check(batch=64, keys=4, rows=300, dim=8, steps=4)
    assert losses[-1][0] < losses[0][0]


def test_rare_events_match_dense():
    losses = _load("rare_events").check(samples=20_000, rate=0.002)
    assert len(losses) == 3 and all(a > 0 for a, _ in losses)


@pytest.mark.parametrize("fn", ["pipeline", "events_only"])
def test_rare_events_stay_sparse(fn):
    """The windowed pipeline and the one without the window densify nothing, forward or backward (the
    cumsum form is dense by nature: its cumsum returns a dense tensor)."""
    ex = _load("rare_events")
    positions, values = ex.make_events(20_000, 0.002)
    with sparsefill.densify_policy("raise"):
        loss, gv, gf = ex.step(ex.sparse_signal, positions, values, 20_000, getattr(ex, fn))
    assert loss > 0 and gv.abs().sum() > 0
    v = values.detach().clone().requires_grad_()
    x = ex.sparse_signal(positions, v, torch.tensor(ex.FILL, dtype=values.dtype), 20_000)
    ratio = torch.exp(-0.1 * (x * -8.0))
    window = torch.nn.functional.avg_pool1d(ratio[None, None], 100, stride=1)[0, 0]
    assert isinstance(window, sparsefill.SparseTensor) and window._nse() <= 100 * values.numel()


def test_rare_events_cumsum_floor():
    ex = _load("rare_events")
    g = ex.cumsum_floor(1000)()
    torch.testing.assert_close(g, torch.arange(1000, 0, -1, dtype=torch.float64))


@pytest.mark.parametrize(
    "name, argv",
    [
        ("gat", ["--nodes", "150", "--reps", "1"]),
        ("gat", ["--nodes", "150", "--reps", "1", "--heads", "2"]),
        ("dlrm", ["--batch", "32", "--rows", "300", "--reps", "1"]),
        ("rare_events", ["--samples", "20000", "--rate", "0.002", "--reps", "1"]),
    ],
)
def test_script_main_runs(name, argv, capsys):
    if name == "gat":
        pytest.importorskip("torch_geometric", reason="the GAT peer: pip install '.[test]'")
    threads = torch.get_num_threads()
    try:
        _load(name).main(argv)
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "losses" in out and " ms" in out
