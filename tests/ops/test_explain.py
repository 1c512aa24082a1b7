"""sparsefill.explain: the stage it names is the one the registry takes, nothing runs on the caller's tensors."""

import os

import pytest
import torch
import torch.nn.functional as F

import sparsefill
from sparsefill._explain import STAGES, Explanation
from sparsefill.ops import registry

aten = torch.ops.aten


def _A(fill=3.0, layout=torch.sparse_coo):
    A = sparsefill.sparse_coo_tensor([[0, 1], [1, 0]], [1.0, 2.0], (2, 2), fill_value=fill)
    return A.to_sparse_csr() if layout is torch.sparse_csr else A


def _file_line(where):
    path, line = where.rsplit(":", 1)
    root = os.path.dirname(os.path.dirname(sparsefill.__file__))
    with open(os.path.join(root, path)) as f:
        return f.read().splitlines()[int(line) - 1]


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_stages_for_inputs(layout):
    A = _A(layout=layout)
    e = sparsefill.explain(torch.exp, A)
    assert (
        isinstance(e, Explanation)
        and e.stage == "pointwise"
        and e.steps[0].op == "aten.exp.default"
    )
    e = sparsefill.explain(torch.Tensor.sum, A, dim=0)
    assert e.stage == "handler" and e.steps[0].op == "aten.sum.dim_IntList"
    assert e.steps[0].note == registry.HANDLERS[aten.sum.dim_IntList].__qualname__
    assert sparsefill.explain(F.softmax, A, dim=1).steps[0].op == "aten._softmax.default"
    e = sparsefill.explain(torch.geqrf, A)
    assert e.stage == "densify" and "fallback.py" in e.steps[0].where


def test_where_points_at_the_code():
    for e in (
        sparsefill.explain(torch.Tensor.sum, _A(), dim=0),
        sparsefill.explain(torch.exp, _A()),
        sparsefill.explain(torch.geqrf, _A()),
    ):
        assert _file_line(e.steps[0].where).lstrip().startswith(("def ", "@"))


def test_densify_stage_agrees_with_the_policy():
    """The stage named is the one taken: a densify answer densifies (the 'raise' policy refuses), the
    handler and pointwise answers do not."""
    A = _A()
    with sparsefill.densify_policy("raise"):
        with pytest.raises(sparsefill.DensifyError):
            torch.geqrf(A)
        torch.exp(A), torch.sum(A, dim=0)
    assert sparsefill.explain(torch.geqrf, A).stage == "densify"


def test_routes_and_their_predicates():
    A = _A()
    L = A.detach().requires_grad_()
    assert sparsefill.explain(torch.Tensor.sum, L).stage == "route"
    assert L.grad is None and L.grad_fn is None
    e = sparsefill.explain(
        torch.Tensor.sum, A
    )  # no grad needed: the route declines, the aten handler runs
    assert e.stage == "handler" and any("declines" in n for n in e.notes)
    with torch.no_grad():
        assert sparsefill.explain(torch.Tensor.sum, L).stage == "handler"
    e = sparsefill.explain(
        torch.sparse.sum, A
    )  # torch.sparse.sum calls the routed torch._sparse_sum
    assert e.stage == "route" and e.steps[0].op == "torch._sparse_sum"


def test_no_side_effects():
    A = _A()
    before = A.to_dense().clone()
    e = sparsefill.explain(torch.Tensor.add_, A, 1)
    assert e.stage == "pointwise" and e.steps[0].op == "aten.add_.Tensor"
    torch.testing.assert_close(A.to_dense(), before)
    x = torch.ones(2, 2)
    sparsefill.explain(torch.Tensor.mul_, x, 2)
    assert torch.equal(x, torch.ones(2, 2))


def test_without_arguments_lists_candidates():
    e = sparsefill.explain(aten.sum)
    assert e.stage == "handler" and {s.op for s in e.steps} >= {
        "aten.sum.default",
        "aten.sum.dim_IntList",
    }
    assert [s.stage for s in e.steps if s.op == "aten.sum.out"] == ["densify"]
    e = sparsefill.explain(torch.matmul)
    assert e.stage == "route" and "decomposition" in {s.stage for s in e.steps}
    assert sparsefill.explain(aten.softmax.int).stage == "decomposition"
    assert (
        sparsefill.explain(torch.ops.c10d.barrier.default).stage == "refused"
    )  # (no handler; collectives have)
    for e in (sparsefill.explain(torch.exp), sparsefill.explain(aten.mm.default)):
        assert all(s.stage in STAGES for s in e.steps)
        assert str(e).splitlines()[0] == f"{e.op}: {e.stage}"


def test_names_and_errors():
    assert sparsefill.explain(torch.linalg.det, _A()).op == "torch.linalg.det"
    assert sparsefill.explain(torch.exp).op == "torch.exp"
    assert sparsefill.explain(torch.Tensor.sum).op == "torch.Tensor.sum"
    e = sparsefill.explain(torch.exp, torch.ones(2))
    assert any("no SparseTensor operand" in n for n in e.notes)
    with pytest.raises(TypeError, match="op must be"):
        sparsefill.explain(3)


def test_data_dependent_op_is_said_not_raised():
    e = sparsefill.explain(torch.nonzero, _A())
    assert e.stage == "handler" and any("meta" in n for n in e.notes)


def test_coverage_generator_on_a_subset(tmp_path):
    """tools/coverage.py (docs/coverage.md) on two ops: the sweeps' outcomes and explain's stages, not by hand."""
    import importlib.util

    path = os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        "tools",
        "coverage.py",
    )
    spec = importlib.util.spec_from_file_location("sparsefill_tools_coverage", path)
    cov = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cov)
    out = tmp_path / "coverage.md"
    text = cov.generate({"exp", "geqrf"}, str(out))
    assert out.read_text() == text
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in text.splitlines()
        if line.startswith("| `")
    }
    assert rows["`exp`"][:3] == ["pointwise", "`aten.exp.default`", "native"]
    assert rows["`exp`"][4] == "native" and "csr" in rows["`exp`"][3].split()
    assert rows["`geqrf`"][0] == "densify" and rows["`geqrf`"][2] == "densify"
    h = registry.HANDLERS[aten.sum.dim_IntList]
    assert rows["`aten.sum.dim_IntList`"][0] == f"`{h.__qualname__}`"


def test_dunders_without_arguments():
    assert sparsefill.explain(torch.Tensor.__radd__).steps[0].op == "aten.add.Tensor"
    assert sparsefill.explain(torch.Tensor.__iadd__).steps[0].op == "aten.add_.Tensor"
    e = sparsefill.explain(torch.Tensor.__getitem__)  # a route takes row/column selections
    assert (
        e.stage == "route" and [s.op for s in e.steps] == ["torch.Tensor.__getitem__"] and e.notes
    )
    assert sparsefill.explain(torch.Tensor.__getitem__, _A(), 0).stage in STAGES
