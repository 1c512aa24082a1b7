"""Views keep a view record of their base, and every result that is dense by nature passes the one
densify gate (``sparsefill._tensor.policy.check_densify(..., by_nature=True)``): quiet under the
default policy, a DensifyWarning or a DensifyError under ``densify_policy(dense_by_nature="warn" /
"raise")``, and the byte limit applies, forward and backward."""

import warnings

import pytest
import torch

import sparsefill
from sparsefill import DensifyError, DensifyWarning, masked
from sparsefill.ops import views

LAYOUTS = [torch.sparse_coo, torch.sparse_csr]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_view_holds_a_view_record(layout):
    x = torch.tensor([[1.0, 5, 2], [5, 3, 5]])
    A = sparsefill.to_sparse(x, fill_value=5.0, layout=layout)
    V = A.t()
    assert (
        isinstance(V._view, views.View)
        and V._view.base is A
        and V._view.func is torch.ops.aten.t.default
    )
    assert V._view.index is None and V._view.args == () and V._view.kwargs == {}
    rows = A.unbind(0)
    assert [R._view.index for R in rows] == [0, 1] and all(R._view.base is A for R in rows)
    assert A.detach().detach()._view.base is A  # an alias of an alias: of the first one's base
    state = V._view.state
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DensifyWarning)
        A.mul_(2.0)
        x.mul_(2.0)
        torch.testing.assert_close(V.to_dense(), x.t())  # refreshed from the changed base
        assert V._view.state != state
        V[0].add_(1.0)  # a write through a view of a view reaches the base
        x.t()[0].add_(1.0)
    torch.testing.assert_close(A.to_dense(), x)
    torch.testing.assert_close(rows[0].to_dense(), x[0])


# ---------------------------------------------------------------------- the densify gate, dense by nature
def _leaf(layout, fill=2.0):
    v = torch.tensor([1.0, 3.0, 4.0], dtype=torch.float64, requires_grad=True)
    A = sparsefill.sparse_coo_tensor([[0, 1, 1], [0, 0, 2]], v, (2, 3), fill_value=fill)
    return v, (A if layout is torch.sparse_coo else A.to_sparse_csr())


def _dense(t):
    return t.to_dense() if isinstance(t, sparsefill.SparseTensor) else t


CASES = {  # forward computations that are dense by nature: (sparsefill, dense reference)
    "cumsum along a sparse dim": lambda A: torch.cumsum(A, 0),
    "A + dense varying over the sparse dims": lambda A: (
        A + torch.arange(6.0, dtype=torch.float64).view(2, 3)
    ),
    "dense.add_(A)": lambda A: torch.ones(2, 3, dtype=torch.float64).add_(A),
}


@pytest.mark.parametrize("layout", LAYOUTS, ids=["coo", "csr"])
@pytest.mark.parametrize("case", list(CASES))
def test_dense_by_nature_results_pass_the_gate(case, layout):
    f = CASES[case]
    _, A = _leaf(layout)
    A = A.detach()
    ref = f(A.to_dense())
    for mode in (
        "warn",
        "allow",
        "raise",
    ):  # the fallback's mode does not apply: permissive by default
        with sparsefill.densify_policy(mode), warnings.catch_warnings():
            warnings.simplefilter("error", DensifyWarning)
            torch.testing.assert_close(_dense(f(A)), ref)
    with (
        sparsefill.densify_policy(dense_by_nature="warn"),
        pytest.warns(DensifyWarning, match="bytes"),
    ):
        torch.testing.assert_close(_dense(f(A)), ref)
    with (
        sparsefill.densify_policy(dense_by_nature="raise"),
        pytest.raises(DensifyError, match="dense by nature"),
    ):
        f(A)
    with sparsefill.densify_policy(limit_bytes=8), pytest.raises(DensifyError, match="48 bytes"):
        f(A)


BACKWARD = {  # backward computations that are dense by nature: (input shape, stored positions, op)
    "softmax, a dense upstream gradient": ((5,), lambda A: torch.softmax(A, 0)),
}
PATTERN_BACKWARD = {  # masked-in fills of a constructor's tensor: the backward stays on the pattern (no gate)
    "masked.sum, fill masked in": ((2, 3), lambda A: masked.sum(A, 1)),
    "masked.amax, fill masked in": ((2, 3), lambda A: masked.amax(A, 1)),
}


@pytest.mark.parametrize(
    "case,layout",
    [
        (c, lay)
        for c in BACKWARD
        for lay in LAYOUTS
        if len(BACKWARD[c][0]) == 2 or lay is torch.sparse_coo
    ],
)  # (CSR: 2-d)
def test_dense_by_nature_backward_passes_the_gate(case, layout):
    shape, f = BACKWARD[case]
    v = torch.tensor([1.0, 3.0, 4.0], dtype=torch.float64, requires_grad=True)
    idx = [[0, 1, 1], [0, 0, 2]] if len(shape) == 2 else [[0, 2, 3]]
    A = sparsefill.sparse_coo_tensor(idx, v, shape, fill_value=2.0).to_sparse(layout)
    x = A.to_dense().detach().requires_grad_()
    (gx,) = torch.autograd.grad(_dense(f(x)).pow(2).sum(), x)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DensifyWarning)
        (g,) = torch.autograd.grad(_dense(f(A)).pow(2).sum(), v)
    torch.testing.assert_close(g, gx[tuple(torch.tensor(idx))])
    out = _dense(f(A)).pow(2).sum()
    with (
        sparsefill.densify_policy(dense_by_nature="raise"),
        pytest.raises(DensifyError, match="dense by nature"),
    ):
        torch.autograd.grad(out, v)


@pytest.mark.parametrize("case,layout", [(c, lay) for c in PATTERN_BACKWARD for lay in LAYOUTS])
def test_masked_in_fill_backward_stays_on_the_pattern(case, layout):
    shape, f = PATTERN_BACKWARD[case]
    v = torch.tensor([1.0, 3.0, 4.0], dtype=torch.float64, requires_grad=True)
    fill = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    A = sparsefill.sparse_coo_tensor([[0, 1, 1], [0, 0, 2]], v, shape, fill_value=fill).to_sparse(
        layout
    )
    x = A.to_dense().detach().requires_grad_()
    (gx,) = torch.autograd.grad(_dense(f(x)).pow(2).sum(), x)
    out = _dense(f(A)).pow(2).sum()
    with sparsefill.densify_policy("raise", dense_by_nature="raise"):
        g, gf = torch.autograd.grad(out, (v, fill))
    torch.testing.assert_close(g, torch.stack([gx[0, 0], gx[1, 0], gx[1, 2]]))
    torch.testing.assert_close(gf, gx[0, 1] + gx[0, 2] + gx[1, 1])


def test_policy_dense_by_nature_is_validated_and_kept():
    with pytest.raises(ValueError, match="dense_by_nature"):
        with sparsefill.densify_policy(dense_by_nature="never"):
            pass
    with sparsefill.densify_policy(dense_by_nature="raise"):
        with sparsefill.densify_policy("allow", 10):  # left out: kept
            assert sparsefill.get_densify_policy().dense_by_nature == "raise"
    old = sparsefill.set_densify_policy(dense_by_nature="warn")
    try:
        assert old.dense_by_nature == "allow" and sparsefill.get_densify_policy().mode == old.mode
    finally:
        sparsefill.set_densify_policy(
            old.mode, old.limit_bytes, dense_by_nature=old.dense_by_nature
        )
    assert sparsefill.get_densify_policy() == old


def test_backward_densification_passes_the_gate():
    """A gradient read as a dense tensor in a backward (here: a dense leaf's gradient through a SparseTensor
    product, and a reduction whose upstream gradient has another split) asks the gate: quiet by default,
    refused under dense_by_nature='raise', and the gradient equals the dense computation's."""
    from sparsefill._autograd.functions import dense_grad

    G = sparsefill.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (4,), fill_value=0.5)
    torch.testing.assert_close(dense_grad(G), G.to_dense())
    with (
        pytest.raises(sparsefill.DensifyError, match="dense by nature"),
        sparsefill.densify_policy(dense_by_nature="raise"),
    ):
        dense_grad(G)
    I = sparsefill.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (4,), fill_value=sparsefill.indefinite)
    torch.testing.assert_close(
        dense_grad(I), torch.tensor([1.0, 0.0, 2.0, 0.0])
    )  # a gradient's masked-out: 0
    one = sparsefill.sparse_coo_tensor(
        torch.zeros(0, 0, dtype=torch.long), torch.zeros(0), (), fill_value=3.0
    )
    with sparsefill.densify_policy(dense_by_nature="raise"):
        assert float(dense_grad(one)) == 3.0  # one element: a number, not a densification
