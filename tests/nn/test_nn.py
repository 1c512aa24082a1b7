"""sparsefill.nn: sparse weights of fixed pattern.

Every gradient is checked against the dense computation: the values' gradient is the dense
gradient of ``W`` read at the pattern, the fill's the dense gradient summed over the unspecified
elements; training with each optimizer equals training a dense weight whose unspecified elements
are held at the fill; no dense ``(out, in)`` temporary is formed in a step.
"""

from __future__ import annotations

import copy
import io
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import sparsefill
from sparsefill.nn import SparseLinear, SparseParameter
from torch.testing import assert_close
from tests.models import _LAYOUTS
from tests.models.test_training_loops import _W, _X

LAYOUTS = [torch.sparse_coo, torch.sparse_csr]
FILLS = [
    (0.0, False),
    (0.5, True),
    (float("nan"), False),
    (sparsefill.indefinite, False),
    (-1.5, False),
]


def _pattern_mask(W):
    idx = W.detach().to_sparse(torch.sparse_coo).coalesce().indices()
    m = torch.zeros(W.shape, dtype=torch.bool)
    m[idx[0], idx[1]] = True
    return idx, m


def _dense_weight(W):
    W = W.detach()
    return W.to_dense(fill_value=0.0) if W.is_fill_indefinite() else W.to_dense()


class ResultShapes(TorchDispatchMode):
    """Records the numel of every dense (strided, plain) tensor an aten op returns."""

    def __init__(self):
        super().__init__()
        self.numels = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if (
                isinstance(o, torch.Tensor)
                and type(o) is torch.Tensor
                and o.layout is torch.strided
            ):
                self.numels.append((o.numel(), str(func)))
        return out


# ---------------------------------------------------------------------- gradients against dense
@pytest.mark.parametrize("layout", LAYOUTS, ids=["coo", "csr"])
@pytest.mark.parametrize(
    "fill,train_fill", FILLS, ids=["fill0", "fill0.5-trained", "nan", "indefinite", "fill-1.5"]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("xshape", [(7, 30), (30,), (2, 3, 30)], ids=["2d", "1d", "3d"])
def test_linear_forward_backward_against_dense(layout, fill, train_fill, dtype, xshape):
    torch.manual_seed(0)
    lin = SparseLinear(
        30, 20, density=0.1, layout=layout, fill_value=fill, train_fill=train_fill, dtype=dtype
    )
    x = torch.randn(xshape, dtype=dtype, requires_grad=True)
    y = lin(x)
    g = torch.randn(y.shape, dtype=dtype)
    y.backward(g)
    W = lin.weight
    assert W.sparse_layout is layout and W._nse() == 60
    idx, m = _pattern_mask(W)
    Wd = _dense_weight(W).requires_grad_()
    xd = x.detach().requires_grad_()
    yd = F.linear(xd, Wd, lin.bias.detach())
    yd.backward(g)
    tol = (
        dict(rtol=1e-4, atol=1e-4, equal_nan=True)
        if dtype == torch.float32
        else dict(equal_nan=True)
    )
    torch.testing.assert_close(y, yd, **tol)
    torch.testing.assert_close(x.grad, xd.grad, **tol)
    torch.testing.assert_close(lin.sparse_weight.values.grad, Wd.grad[idx[0], idx[1]], **tol)
    assert (
        not lin.sparse_weight.values.grad.isnan().any()
    )  # dL/dW = g^T x reads no weight (NaN fill included)
    torch.testing.assert_close(lin.bias.grad, g.reshape(-1, 20).sum(0), **tol)
    if train_fill:
        torch.testing.assert_close(lin.sparse_weight.fill.grad, Wd.grad[~m].sum(), **tol)
    else:
        assert not lin.sparse_weight.fill.requires_grad and lin.sparse_weight.fill.grad is None


@pytest.mark.parametrize("layout", LAYOUTS, ids=["coo", "csr"])
@pytest.mark.parametrize("train_fill", [False, True])
def test_step_is_sparse_no_dense_temporary(layout, train_fill):
    """Forward, backward and an Adam step: no dense tensor of the weight's size (or near it) is formed,
    and nothing densifies (the densify policy raises)."""
    torch.manual_seed(0)
    n_out, n_in, batch = 300, 400, 8
    lin = SparseLinear(
        n_in, n_out, density=0.01, layout=layout, fill_value=0.25, train_fill=train_fill
    )
    opt = torch.optim.Adam(lin.parameters(), lr=1e-2)
    x = torch.randn(batch, n_in, requires_grad=True)
    rec = ResultShapes()
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        with sparsefill.densify_policy("raise"), rec:
            lin(x).square().sum().backward()
            opt.step()
    biggest = max(rec.numels)
    assert biggest[0] <= batch * max(n_in, n_out), (
        biggest
    )  # O(nse + batch x features): no (out, in) tensor
    assert lin.sparse_weight.values.grad.shape == (1200,) and lin.weight._nse() == 1200


PRODUCTS = {
    "F.linear(x, W)": lambda W, x, X: F.linear(x, W),
    "W @ X": lambda W, x, X: W @ X,
    "x @ W.T": lambda W, x, X: x @ W.T,
    "x @ W.t()": lambda W, x, X: x @ W.t(),
    "torch.sparse.mm(W, X)": lambda W, x, X: torch.sparse.mm(W, X),
    "torch.addmm(b, W, X)": lambda W, x, X: torch.addmm(torch.ones(W.shape[0], 1), W, X),
    "einsum": lambda W, x, X: torch.einsum("oi,bi->bo", W, x),
}


@pytest.mark.parametrize("form", PRODUCTS)
@pytest.mark.parametrize("layout", LAYOUTS, ids=["coo", "csr"])
def test_products_of_the_weight_are_sparse_and_exact(form, layout):
    """The products the module docstring names: gradients of values and fill equal the dense ones, and no
    dense tensor of the weight's size is formed."""
    torch.manual_seed(0)
    dense = torch.randn(60, 80) * (torch.rand(60, 80) < 0.05)
    P = SparseParameter.from_dense(dense, fill_value=0.0, layout=layout, train_fill=True)
    with torch.no_grad():
        P.fill.fill_(0.3)
    x, X = torch.randn(4, 80), torch.randn(80, 4)
    rec = ResultShapes()
    with sparsefill.densify_policy("raise"), rec:
        PRODUCTS[form](P(), x, X).square().sum().backward()
    assert max(rec.numels)[0] < 60 * 80 // 4, max(rec.numels)
    Wd = P().detach().to_dense().requires_grad_()
    PRODUCTS[form](Wd, x, X).square().sum().backward()
    keep = dense != 0
    torch.testing.assert_close(P.values.grad, Wd.grad[keep], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(P.fill.grad, Wd.grad[~keep].sum(), rtol=1e-4, atol=1e-4)


def test_nn_parameter_of_sparse_tensor_has_dense_semantics():
    """The contrast: ``nn.Parameter(A)`` gets the dense gradient, and one step specifies every element."""
    torch.manual_seed(0)
    lin = SparseLinear(30, 20, density=0.1)
    A = torch.nn.Parameter(lin.weight.detach().clone())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sparsefill.DensifyWarning)
        F.linear(torch.randn(4, 30), A).sum().backward()
        torch.optim.SGD([A], lr=0.1).step()
    assert A._nse() == 600


def test_hybrid_and_array_fill_gradients():
    """A hybrid COO SparseParameter (dense dim 3) with a trained array fill, through an element-wise op and a
    reduction: the gradients equal the dense ones at the pattern / summed over the unspecified slices."""
    torch.manual_seed(0)
    A = sparsefill.sparse_coo_tensor(
        [[0, 2, 2, 4], [1, 0, 3, 3]],
        torch.randn(4, 3),
        (5, 4, 3),
        fill_value=torch.tensor([0.5, -1.0, 2.0]),
    )
    P = SparseParameter(A, train_fill=True)
    w = torch.randn(5, 4, 3, dtype=torch.float32)
    (P() * w).sin().sum().backward()
    Ad = A.to_dense().requires_grad_()
    (Ad * w).sin().sum().backward()
    idx = A.indices()
    m = torch.ones(5, 4, dtype=torch.bool)
    m[idx[0], idx[1]] = False
    torch.testing.assert_close(P.values.grad, Ad.grad[idx[0], idx[1]])
    torch.testing.assert_close(P.fill.grad, Ad.grad[m].sum(0))
    torch.testing.assert_close(P().to_dense(), A.to_dense())


def test_batched_csr_bmm_fill_gradient():
    """A batched CSR SparseParameter through ``torch.bmm`` (routed: sampled gradient): the fill's gradient."""
    torch.manual_seed(0)
    dense = torch.zeros(2, 6, 5)
    dense[0, :2], dense[1, 2:4] = 1.0, 2.0  # 10 stored elements per batch
    P = SparseParameter(sparsefill.to_sparse(dense, layout=torch.sparse_csr), train_fill=True)
    X, G = torch.randn(2, 5, 3), torch.randn(2, 6, 3)
    torch.bmm(P(), X).backward(G)
    Ad = dense.clone().requires_grad_()
    torch.bmm(Ad, X).backward(G)
    keep = dense != 0
    torch.testing.assert_close(P.values.grad.reshape(-1), Ad.grad[keep])
    torch.testing.assert_close(P.fill.grad, Ad.grad[~keep].sum())


def test_batched_csr_bmm_values_gradient():
    torch.manual_seed(0)
    dense = torch.zeros(2, 6, 5)
    dense[0, :2], dense[1, 2:4] = 1.0, 2.0
    P = SparseParameter(sparsefill.to_sparse(dense, layout=torch.sparse_csr))
    X, G = torch.randn(2, 5, 3), torch.randn(2, 6, 3)
    y = torch.bmm(P(), X)
    y.backward(G)
    Ad = dense.clone().requires_grad_()
    yd = torch.bmm(Ad, X)
    yd.backward(G)
    torch.testing.assert_close(y, yd)
    torch.testing.assert_close(P.values.grad.reshape(-1), Ad.grad[dense != 0])


def test_gradcheck_values_and_fill():
    torch.manual_seed(0)
    idx = torch.tensor([[0, 1, 3], [2, 0, 1]])
    x = torch.randn(5, 4, dtype=torch.float64)

    def f(v, fill, xx):
        W = sparsefill.sparse_coo_tensor(idx, v, (4, 4), fill_value=fill, is_coalesced=True)
        return F.linear(xx, W)

    v = torch.randn(3, dtype=torch.float64, requires_grad=True)
    fill = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(f, (v, fill, x.requires_grad_()))


# ---------------------------------------------------------------------- training with optimizers
def _dense_twin(lin):
    """(Wv, f, b): dense parameters equal to ``lin``: W = where(mask, Wv, f)."""
    _, m = _pattern_mask(lin.weight)
    Wv = torch.nn.Parameter(_dense_weight(lin.weight) * m)
    f = torch.nn.Parameter(lin.sparse_weight.fill.detach().clone())
    b = torch.nn.Parameter(lin.bias.detach().clone())
    return m, Wv, f, b


@pytest.mark.parametrize(
    "opt_cls,kw",
    [
        (torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
        (torch.optim.Adam, dict(lr=0.05)),
        (torch.optim.AdamW, dict(lr=0.05, weight_decay=0.1)),
        (torch.optim.Adagrad, dict(lr=0.1)),
    ],
    ids=["SGD", "Adam", "AdamW", "Adagrad"],
)
@pytest.mark.parametrize("layout", LAYOUTS, ids=["coo", "csr"])
@pytest.mark.parametrize("train_fill", [False, True])
def test_optimizers_keep_the_pattern_and_match_dense(opt_cls, kw, layout, train_fill):
    """Three steps: the pattern never changes, and the weights equal a dense weight trained with its
    unspecified elements held at the (trained) fill."""
    torch.manual_seed(0)
    lin = SparseLinear(
        12,
        9,
        density=0.2,
        layout=layout,
        fill_value=0.1,
        train_fill=train_fill,
        dtype=torch.float64,
    )
    idx0 = lin.weight.detach().to_sparse(torch.sparse_coo).indices().clone()
    m, Wv, f, b = _dense_twin(lin)
    opt = opt_cls(lin.parameters(), **kw)
    opt_d = opt_cls([Wv, f, b] if train_fill else [Wv, b], **kw)
    for _ in range(3):
        x = torch.randn(5, 12, dtype=torch.float64)
        opt.zero_grad()
        lin(x).tanh().square().sum().backward()
        opt.step()
        opt_d.zero_grad()
        F.linear(x, torch.where(m, Wv, f), b).tanh().square().sum().backward()
        Wv.grad *= m  # the elements off the pattern are not weights
        opt_d.step()
    W = lin.weight.detach()
    assert W._nse() == idx0.shape[1]
    assert torch.equal(W.to_sparse(torch.sparse_coo).indices(), idx0)
    torch.testing.assert_close(W.to_dense(), torch.where(m, Wv, f).detach())
    torch.testing.assert_close(lin.bias, b)
    if not train_fill:
        assert lin.sparse_weight.fill.item() == 0.1


# ---------------------------------------------------------------------- module mechanics
@pytest.mark.parametrize("layout", LAYOUTS, ids=["coo", "csr"])
@pytest.mark.parametrize("train_fill", [False, True])
def test_state_dict_save_load(layout, train_fill):
    torch.manual_seed(0)
    lin = SparseLinear(20, 10, density=0.2, layout=layout, fill_value=0.5, train_fill=train_fill)
    sd = lin.state_dict()
    keys = ["bias", "sparse_weight.values", "sparse_weight.fill"]
    keys += (
        ["sparse_weight.indices"]
        if layout is torch.sparse_coo
        else ["sparse_weight.crow_indices", "sparse_weight.col_indices"]
    )
    assert sorted(sd) == sorted(keys)
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    sd2 = torch.load(buf, weights_only=True)
    other = SparseLinear(
        20, 10, density=0.2, layout=layout, fill_value=0.0, train_fill=train_fill
    )  # other pattern
    other.load_state_dict(sd2)
    x = torch.randn(3, 20)
    torch.testing.assert_close(other(x), lin(x))
    torch.testing.assert_close(other.weight.to_dense(), lin.weight.to_dense())
    # the fill trained or frozen loads either way (same key)
    third = SparseLinear(20, 10, density=0.2, layout=layout, train_fill=not train_fill)
    third.load_state_dict(sd2)
    torch.testing.assert_close(third(x), lin(x))
    # the weight itself saves with weights_only=True (a SparseTensor)
    buf = io.BytesIO()
    torch.save(lin.weight.detach(), buf)
    buf.seek(0)
    torch.testing.assert_close(torch.load(buf, weights_only=True).to_dense(), lin.weight.to_dense())


def test_loaded_pattern_is_validated():
    lin = SparseLinear(5, 4, density=0.5)
    sd = lin.state_dict()
    sd["sparse_weight.indices"] = sd["sparse_weight.indices"].clone()
    sd["sparse_weight.indices"][1, 0] = 7
    lin.load_state_dict(sd)
    with pytest.raises(IndexError, match="out of range for size 5"):
        lin(torch.randn(2, 5))


@pytest.mark.parametrize("layout", LAYOUTS, ids=["coo", "csr"])
def test_to_dtype_deepcopy(layout):
    torch.manual_seed(0)
    lin = SparseLinear(20, 10, density=0.2, layout=layout, fill_value=0.5, train_fill=True)
    x = torch.randn(3, 20)
    y = lin(x)
    lin64 = copy.deepcopy(lin).to(torch.float64)
    assert (
        lin64.sparse_weight.values.dtype
        == lin64.sparse_weight.fill.dtype
        == lin64.bias.dtype
        == torch.float64
    )
    assert all(b.dtype == torch.int64 for n, b in lin64.named_buffers() if "indices" in n)
    assert lin64.weight.dtype == torch.float64 and lin64(x.double()).dtype == torch.float64
    torch.testing.assert_close(lin64(x.double()), y.double(), rtol=1e-5, atol=1e-6)
    c = copy.deepcopy(lin)
    with torch.no_grad():
        c.sparse_weight.values.add_(1.0)
    torch.testing.assert_close(lin(x), y)  # the copy owns its parameters
    assert c.sparse_weight.values.data_ptr() != lin.sparse_weight.values.data_ptr()
    buf = io.BytesIO()
    torch.save(lin, buf)  # the whole module (pickled: weights_only=False, as for any nn.Module)
    buf.seek(0)
    torch.testing.assert_close(torch.load(buf, weights_only=False)(x), y)
    assert lin.half().weight.dtype == torch.float16


def test_no_grad_and_inference_mode_forward():
    torch.manual_seed(0)
    lin = SparseLinear(20, 10, density=0.2, fill_value=0.5)
    x = torch.randn(3, 20)
    y = lin(x)
    with torch.no_grad():
        torch.testing.assert_close(lin(x), y)
    with torch.inference_mode():
        torch.testing.assert_close(lin(x), y)


def test_init_scaled_to_stored_elements():
    """Values and bias in U(-1/sqrt(k), 1/sqrt(k)), k = nse / out_features; output scale as nn.Linear's."""
    torch.manual_seed(0)
    lin = SparseLinear(1000, 200, density=0.04)  # k = 40
    v = lin.sparse_weight.values
    assert v.abs().max() <= 1 / 40**0.5 and v.abs().max() > 0.9 / 40**0.5
    assert lin.bias.abs().max() <= 1 / 40**0.5
    x = torch.randn(256, 1000)
    ref = torch.nn.Linear(1000, 200)
    ratio = (lin(x) - lin.bias).std() / (ref(x) - ref.bias).std()
    assert 0.8 < ratio < 1.25
    assert SparseLinear(4, 3, density=1.0).weight._nse() == 12
    assert SparseLinear(0, 3, density=0.5).weight._nse() == 0


def test_patterns_and_constructors():
    torch.manual_seed(0)
    mask = torch.rand(6, 8) < 0.3
    lin = SparseLinear(8, 6, pattern=mask, bias=False)
    assert lin.bias is None and "bias" not in lin.state_dict()
    idx = mask.nonzero().T
    assert torch.equal(lin.weight.indices(), idx)
    assert torch.equal(
        SparseLinear(8, 6, pattern=idx[:, torch.randperm(idx.shape[1])]).weight.indices(), idx
    )
    assert torch.equal(SparseLinear(8, 6, pattern=mask.float().to_sparse()).weight.indices(), idx)
    # from_dense / from_sparse: the pattern, fill and values are kept
    ref = torch.nn.Linear(8, 6)
    with torch.no_grad():
        ref.weight.mul_(mask)
    for layout in LAYOUTS:
        s = SparseLinear.from_dense(ref, layout=layout)
        x = torch.randn(4, 8)
        torch.testing.assert_close(s(x), ref(x))
        assert s.weight.sparse_layout is layout and s.weight._nse() == int(mask.sum())
    W = ref.weight.detach() + 2.0 * ~mask
    s = SparseLinear.from_dense(W, ref.bias, fill_value=2.0, train_fill=True)
    torch.testing.assert_close(s(x), F.linear(x, W, ref.bias))
    assert s.sparse_weight.fill.requires_grad
    s2 = SparseLinear.from_sparse(s.weight, s.bias)
    torch.testing.assert_close(s2(x), s(x))
    s3 = SparseLinear.from_sparse(ref.weight.detach().to_sparse_csr())
    torch.testing.assert_close(s3(x), ref(x) - ref.bias)
    P = SparseParameter.from_dense(torch.tensor([[0.0, 3.0], [4.0, 0.0]]), layout=torch.sparse_csr)
    assert P.shape == (2, 2) and P.dtype == torch.float32 and P().sparse_layout is torch.sparse_csr
    torch.testing.assert_close(
        SparseParameter.from_sparse(torch.eye(3).to_sparse())().to_dense(), torch.eye(3)
    )


def test_uncoalesced_input_is_coalesced():
    A = sparsefill.sparse_coo_tensor(
        [[1, 0, 1], [1, 0, 1]], [1.0, 2.0, 3.0], (2, 2), fill_value=-1.0
    )
    P = SparseParameter(A)
    assert P.values.shape == (2,) and P()._coalesced
    torch.testing.assert_close(P().to_dense(), A.to_dense())


def test_indefinite_fill_forward():
    A = sparsefill.sparse_coo_tensor(
        [[0, 1], [1, 0]], [2.0, 3.0], (2, 2), fill_value=sparsefill.indefinite
    )
    P = SparseParameter(A)
    assert P().is_fill_indefinite()
    X = torch.randn(2, 3)
    torch.testing.assert_close(P() @ X, A.to_dense(fill_value=0.0) @ X)


def test_errors():
    with pytest.raises(ValueError, match="exactly one of density= and pattern="):
        SparseLinear(3, 2)
    with pytest.raises(ValueError, match="exactly one of density= and pattern="):
        SparseLinear(3, 2, density=0.5, pattern=torch.ones(2, 3, dtype=torch.bool))
    for d in (0, 1.5, -0.1, "x"):
        with pytest.raises(ValueError, match="density must be in"):
            SparseLinear(3, 2, density=d)
    with pytest.raises(ValueError, match=r"in_features must be a non-negative int, got -1"):
        SparseLinear(-1, 2, density=0.5)
    with pytest.raises(ValueError, match=r"pattern mask has shape \(3, 2\), expected .* \(2, 3\)"):
        SparseLinear(3, 2, pattern=torch.ones(3, 2, dtype=torch.bool))
    with pytest.raises(IndexError, match="out of range for size 3"):
        SparseLinear(3, 2, pattern=torch.tensor([[0, 1], [2, 3]]))
    with pytest.raises(ValueError, match="pattern must be a bool mask"):
        SparseLinear(3, 2, pattern=torch.ones(2, 3))
    with pytest.raises(ValueError, match="layout must be"):
        SparseLinear(3, 2, density=0.5, layout=torch.strided)
    with pytest.raises(TypeError, match="use from_dense"):
        SparseParameter(torch.ones(2, 2))
    with pytest.raises(TypeError, match="floating point or complex dtype"):
        SparseParameter(sparsefill.sparse_coo_tensor([[0]], [1], (2,)))
    with pytest.raises(ValueError, match="indefinite fill has no value to train"):
        SparseParameter(
            sparsefill.sparse_coo_tensor([[0]], [1.0], (2,), fill_value=sparsefill.indefinite),
            train_fill=True,
        )
    with pytest.raises(TypeError, match="from_dense: x must be a dense"):
        SparseParameter.from_dense(torch.eye(2).to_sparse())
    with pytest.raises(ValueError, match="bias comes from the nn.Linear"):
        SparseLinear.from_dense(torch.nn.Linear(2, 2), torch.zeros(2))
    with pytest.raises(ValueError, match=r"bias has shape \(3,\), expected \(2,\)"):
        SparseLinear.from_sparse(torch.eye(2).to_sparse(), torch.zeros(3))
    with pytest.raises(ValueError, match="2-d sparse matrix"):
        SparseLinear.from_sparse(torch.ones(2, 2, 2).to_sparse())
    lin = SparseLinear(3, 2, density=0.5)
    with pytest.raises(RuntimeError):
        lin(torch.randn(4, 5))  # as nn.Linear: the input's last dim must be in_features


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
