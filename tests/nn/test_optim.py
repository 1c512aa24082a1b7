"""torch.optim steps a SparseTensor nn.Parameter as it steps the dense one, with sparse gradients:

    P = nn.Parameter(A);  D = nn.Parameter(A.to_dense());  same loss, same steps  =>  P.to_dense() == D

The upstream gradient is uniform over the unspecified elements (a SparseTensor with a fill), so
``P.grad`` and the optimizer states stay SparseTensors (gradients of dense semantics, sparse storage) and no step densifies.
"""

import warnings

import pytest
import torch

import sparsefill
from sparsefill import SparseTensor
import copy
from torch import nn
from torch.testing import assert_close
from tests.nn.test_modules import _M, _XM

OPTIMIZERS = [
    (torch.optim.SGD, dict(lr=0.1)),
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
    (torch.optim.Adam, dict(lr=0.05)),
    (torch.optim.AdamW, dict(lr=0.05, weight_decay=0.1)),
    (torch.optim.Adagrad, dict(lr=0.1)),
    (torch.optim.RMSprop, dict(lr=0.01)),
]


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
@pytest.mark.parametrize(
    "opt_cls,kw", OPTIMIZERS, ids=lambda v: v.__name__ if isinstance(v, type) else str(v)
)
def test_optimizer_steps_a_sparse_parameter_like_the_dense_one(opt_cls, kw, layout, foreach):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, generator=g, dtype=torch.float64)
    x[torch.rand(6, 5, generator=g) < 0.6] = 0.3
    P = torch.nn.Parameter(sparsefill.to_sparse(x, fill_value=0.3, layout=layout))
    D = torch.nn.Parameter(x.clone())
    oP, oD = opt_cls([P], foreach=foreach, **kw), opt_cls([D], foreach=foreach, **kw)
    for step in range(3):
        idx = P.detach().to_sparse(torch.sparse_coo).indices()
        G = sparsefill.sparse_coo_tensor(
            idx,
            torch.rand(idx.shape[1], generator=g, dtype=torch.float64),
            P.shape,
            fill_value=0.5 + step,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("error", sparsefill.DensifyWarning)
            oP.zero_grad()
            (torch.exp(P * 0.5) * 2.0).backward(G)
            assert isinstance(P.grad, SparseTensor)
            oP.step()
        oD.zero_grad()
        (torch.exp(D * 0.5) * 2.0).backward(G.to_dense())
        oD.step()
        assert isinstance(P, SparseTensor) and isinstance(P.detach(), SparseTensor)
        torch.testing.assert_close(P.detach().to_dense(), D.detach())
    for state in oP.state[P].values():
        assert (
            not isinstance(state, torch.Tensor)
            or state.dim() == 0
            or isinstance(state, SparseTensor)
        )


def _step_both(Opt, kw, foreach, steps=3):
    """``Opt`` steps ``W`` of a deep copy of the model (an EMA/teacher copy; a model pickled whole by torch.save and
    loaded gives the same: its ``W`` is no view, unlike ``nn.Parameter(A)``'s, and takes pointwise.unary_fast)."""
    m = copy.deepcopy(_M())
    Wd = nn.Parameter(m.W.detach().to_dense())
    md = copy.deepcopy(m)
    opt, optd = Opt([m.W], foreach=foreach, **kw), Opt([Wd], foreach=foreach, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sparsefill.DensifyWarning)
        for _ in range(steps):
            opt.zero_grad()
            m(_XM).pow(2).sum().backward()
            opt.step()
            optd.zero_grad()
            md.dense(_XM, Wd).pow(2).sum().backward()
            optd.step()
    return m.W.detach().to_dense(), Wd.detach()


@pytest.mark.parametrize(
    "Opt, kw",
    [
        (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
        (torch.optim.NAdam, {}),
        (torch.optim.RMSprop, {}),
        (torch.optim.Adadelta, {}),
        (torch.optim.ASGD, {}),
        (torch.optim.Rprop, {}),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
@pytest.mark.parametrize("foreach", [False, True], ids=["single", "foreach"])
def test_optimizers_step_a_sparse_parameter_like_dense(Opt, kw, foreach):
    """The parameter's pattern (3 stored) differs from its gradient's (8 stored, some stored zeros)."""
    got, want = _step_both(Opt, kw, foreach)
    assert_close(got, want)


@pytest.mark.parametrize(
    "Opt, kw, foreach",
    [
        pytest.param(torch.optim.Adam, {}, False, id="Adam-single"),
        pytest.param(torch.optim.Adam, {}, True, id="Adam-foreach"),
        pytest.param(torch.optim.Adam, {"amsgrad": True}, False, id="Adam-amsgrad-single"),
        pytest.param(torch.optim.Adamax, {}, False, id="Adamax-single"),
        pytest.param(torch.optim.Adamax, {}, True, id="Adamax-foreach"),
        pytest.param(torch.optim.AdamW, {}, False, id="AdamW-single"),
        pytest.param(torch.optim.AdamW, {}, True, id="AdamW-foreach"),
        pytest.param(torch.optim.Adam, {"amsgrad": True}, True, id="Adam-amsgrad-foreach"),
        pytest.param(torch.optim.RAdam, {}, True, id="RAdam-foreach"),
        pytest.param(torch.optim.Adagrad, {}, True, id="Adagrad-foreach"),
    ],
)
def test_optimizers_with_a_ternary_update_step_a_sparse_parameter_like_dense(Opt, kw, foreach):
    got, want = _step_both(Opt, kw, foreach)
    assert_close(got, want)
