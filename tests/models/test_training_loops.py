"""A PyTorch user's training loop on a SparseTensor weight, checked against the same loop on the dense
equivalent: gradient hooks, clipping by norm and by value, ``torch.utils.checkpoint`` and a
``state_dict`` round trip.
"""

import copy
import io
import pytest
import torch
from torch.testing import assert_close
import sparsefill
from tests.models import _LAYOUTS


pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _W(layout=torch.sparse_coo, fill=0.1):
    A = sparsefill.sparse_coo_tensor(
        [[0, 1, 3, 2], [1, 2, 0, 2]], [1.0, 2.0, 3.0, -1.0], (4, 3), fill_value=fill
    )
    return A if layout is torch.sparse_coo else A.to_sparse(layout=layout)


_X = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))


_Y = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))


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
