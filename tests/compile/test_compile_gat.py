"""torch.compile of ``examples/gat.py``'s training step: the two-layer GAT with one head (a 2-D
adjacency) and with several (a hybrid ``(N, N, H)`` adjacency, ``einsum("ijh,jhd->ihd", P, Wh)``
over the heads), its loss compiled with ``fullgraph=True``, backward through the compiled graph, an
eager Adam step::

    compiled loss, parameters after each step == eager's (float64)
    one graph, no graph break; no recompile over the steps, nor for a graph of the same nodes and
    other edges (the stored count is a dynamic size)

The compiled graphs hold no sort: the hybrid product's backward for ``Wh`` is the scatter
``(G^T P)^T`` while traced (eager's ``P^T G`` transposes the pattern, cached per pattern there, a sort
per head in every compiled step).
"""

import copy

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch._dynamo.utils import counters

pytestmark = pytest.mark.filterwarnings("ignore")


def _gat():
    from pathlib import Path

    from sparsefill.benchmarks.cases_models import _example

    folder = Path(__file__).resolve().parents[2] / "examples"
    if not (folder / "gat.py").is_file():
        pytest.skip(f"no {folder / 'gat.py'} (not a source checkout)")
    return _example("gat", folder)


def _graph(gat, nodes, heads, seed, layout=torch.sparse_coo):
    """``(x, A, y)`` in float64: a random graph of ``nodes`` nodes (its edges drawn by ``seed``)."""
    x, edge_index, y = gat.make_graph(nodes, 3, 5, 3, seed)
    return x.double(), gat.adjacency(edge_index, nodes, layout, heads).double(), y


@pytest.mark.parametrize(
    "heads,backend,layout",
    [
        (1, "aot_eager", torch.sparse_coo),
        (3, "aot_eager", torch.sparse_csr),
        (3, "inductor", torch.sparse_coo),
    ],
)
def test_gat_training_steps_compile_whole(heads, backend, layout):
    gat = _gat()
    torch.manual_seed(0)
    model = gat.GAT(5, 4, 3, heads).double()
    twin = copy.deepcopy(model)
    opt, opt_twin = (torch.optim.Adam(m.parameters(), lr=0.05) for m in (model, twin))
    graphs = [_graph(gat, 30, heads, s, layout) for s in (0, 1)]
    assert graphs[0][1]._nse() != graphs[1][1]._nse()
    torch._dynamo.reset()
    counters.clear()
    ops = []
    compiled = torch.compile(
        lambda x, A, y: F.cross_entropy(model(x, A), y),
        backend=_recorded(ops) if backend == "aot_eager" else backend,
        fullgraph=True,
    )
    for step, (x, A, y) in enumerate(graphs[:1] * 3 + graphs[1:] * 2):
        for o in (opt, opt_twin):
            o.zero_grad()
        with torch._dynamo.config.patch(error_on_recompile=step > 0):
            loss = compiled(x, A, y)
        want = F.cross_entropy(twin(x, A), y)
        torch.testing.assert_close(loss, want)
        loss.backward()
        want.backward()
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
        opt.step()
        opt_twin.step()
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"] and not counters["recompiles"]
    if backend == "aot_eager":  # (its forward and backward graphs recorded)
        assert any("index_put" in o for o in ops) and not [o for o in ops if "sort" in o]


def _recorded(ops):
    """The ``aot_eager`` backend, recording the aten ops of AOTAutograd's forward and backward
    graphs in ``ops``."""

    def backend(gm, example_inputs):
        from torch._functorch.aot_autograd import aot_module_simplified

        def record(g, _):
            ops.extend(str(n.target) for n in g.graph.nodes if n.op == "call_function")
            return g

        return aot_module_simplified(gm, example_inputs, fw_compiler=record, bw_compiler=record)

    return backend
