"""A GNN attention layer on a SparseTensor adjacency with an indefinite fill (masked softmax over the
neighbours, edge dropout, a residual), trained with AdamW against the same layer on the dense boolean
adjacency (-inf masked softmax): the same losses and gradients, eager (COO, CSR),
``torch.utils.checkpoint``, ``torch.autocast`` (bfloat16) and ``torch.compile`` (``aot_eager``, dynamic,
fullgraph).
"""

import warnings
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close
from torch.utils.checkpoint import checkpoint
import sparsefill
from sparsefill import masked
from tests.models import _LAYOUTS, _no_densify


pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:Sparse:UserWarning"),
]


# ============================================================================== 1. a GNN attention layer
_N, _D = 12, 6


_g = torch.Generator().manual_seed(0)


_KEEP = (torch.rand(_N, _N, generator=_g) < 0.3) | torch.eye(
    _N, dtype=torch.bool
)  # self loops: no empty row


_EI = _KEEP.nonzero().t()


_E = _EI.shape[1]


_X = torch.randn(_N, _D, generator=_g)


_Y = torch.randint(0, 3, (_N,), generator=_g)


# edge dropout (DropEdge on the attention), p = 0.25: one keep-mask per step, drawn once so that sparse and dense
# models see the same one (F.dropout draws nse numbers on a SparseTensor, N * N on a dense one)
_DROPS = [(torch.rand(_E, generator=_g) > 0.25).float() / 0.75 for _ in range(5)]


def _adj(layout=torch.sparse_coo, values=None):
    A = sparsefill.sparse_coo_tensor(
        _EI,
        torch.ones(_E) if values is None else values,
        (_N, _N),
        fill_value=sparsefill.indefinite,
    )
    return A.to_sparse(layout=layout) if layout is torch.sparse_csr else A


def _drop(step, A):
    if isinstance(A, sparsefill.SparseTensor):
        return _adj(A.sparse_layout, _DROPS[step])
    return torch.zeros(_N, _N).index_put((_EI[0], _EI[1]), _DROPS[step])


class _Attn(nn.Module):
    """One attention head: scores on the edges, masked softmax over each node's neighbours, edge dropout, ELU and a
    residual, a linear classifier.  ``A`` a SparseTensor (indefinite fill) or the dense boolean adjacency."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.lin = nn.Linear(_D, _D)
        self.a_src = nn.Parameter(torch.randn(_D) * 0.3)
        self.a_dst = nn.Parameter(torch.randn(_D) * 0.3)
        self.out = nn.Linear(_D, 3)

    def forward(self, x, A, drop):
        h = self.lin(x)
        ed, es = h @ self.a_dst, h @ self.a_src
        if isinstance(A, sparsefill.SparseTensor):
            P = masked.softmax(F.leaky_relu(A * ed[:, None] + A * es[None, :], 0.2), 1) * drop
        else:
            S = F.leaky_relu(ed[:, None] + es[None, :], 0.2).masked_fill(~A, float("-inf"))
            P = torch.softmax(S, 1) * drop
        return self.out(F.elu(P @ h) + x)


def _train_attn(A, wrap=None, ctx=None, steps=5):
    m = _Attn()
    f = wrap(m) if wrap else m
    opt = torch.optim.AdamW(m.parameters(), lr=0.05)
    losses, grads = [], []
    for i in range(steps):
        opt.zero_grad()
        if ctx is None:
            loss = F.cross_entropy(f(_X, A, _drop(i, A)), _Y)
        else:
            with ctx():
                loss = F.cross_entropy(f(_X, A, _drop(i, A)), _Y)
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
        opt.step()
        losses.append(loss.detach().float())
    return torch.stack(losses), torch.stack(grads)


@_LAYOUTS
def test_attention_layer_trains_like_dense(layout):
    """5 AdamW steps: losses and every parameter's gradient equal the dense model's (-inf masked softmax); no
    densify."""
    ref = _train_attn(_KEEP)
    with warnings.catch_warnings():
        _no_densify()
        got = _train_attn(_adj(layout))
    assert_close(got, ref)


def test_attention_layer_with_checkpoint():
    """``torch.utils.checkpoint`` (non-reentrant) around the whole layer: the same losses and gradients."""
    ref = _train_attn(_KEEP)
    with warnings.catch_warnings():
        _no_densify()
        got = _train_attn(
            _adj(), wrap=lambda m: lambda x, A, d: checkpoint(m, x, A, d, use_reentrant=False)
        )
    assert_close(got, ref)
    # reentrant too (an input requiring grad), and the gradient of the adjacency's values through the checkpoint
    vals = torch.ones(_E, requires_grad=True)
    for reentrant in (True, False):
        m = _Attn()
        X, Xd = _X.clone().requires_grad_(), _X.clone().requires_grad_()
        A = _adj(values=vals)
        F.cross_entropy(checkpoint(m, X, A, _drop(0, A), use_reentrant=reentrant), _Y).backward()
        g = [p.grad.clone() for p in m.parameters()]
        m.zero_grad()
        F.cross_entropy(m(Xd, _KEEP, _drop(0, _KEEP)), _Y).backward()
        assert_close(g, [p.grad for p in m.parameters()])
        assert_close(X.grad, Xd.grad)
    vals_grad = vals.grad.clone()
    vals.grad = None
    A = _adj(values=vals)
    F.cross_entropy(m(_X, A, _drop(0, A)), _Y).backward()
    assert_close(vals_grad, 2 * vals.grad)


def test_attention_layer_under_autocast_bfloat16():
    """``torch.autocast("cpu", bfloat16)``: the products run in bfloat16 on both sides; losses and gradients within
    bfloat16's precision of the dense model under the same autocast (and of float32)."""
    ctx = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    ref = _train_attn(_KEEP, ctx=ctx)
    with warnings.catch_warnings():
        _no_densify()
        got = _train_attn(_adj(), ctx=ctx)
    assert_close(got[0], ref[0], atol=2e-2, rtol=2e-2)
    assert_close(got[1], ref[1], atol=5e-2, rtol=5e-2)
    assert_close(got[0], _train_attn(_KEEP)[0], atol=3e-2, rtol=3e-2)


def test_attention_edge_dropout_by_f_dropout():
    """``F.dropout`` of the masked attention (the usual spelling of attention dropout): the pattern stays, masked-out
    elements stay masked out, each stored value is 0 or value / (1 - p); dense of it equals the dense dropout with
    that keep-mask; ``training=False`` and ``nn.Dropout().eval()`` return the input."""
    A = _adj()
    P = masked.softmax(A * torch.randn(_N)[:, None], 1)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        _no_densify()
        Dp = F.dropout(P, 0.3, training=True)
    assert Dp._indefinite and Dp._nse() == P._nse()
    kept = Dp._vals != 0
    assert 0 < int(kept.sum()) < P._nse()
    assert_close(Dp._vals[kept], P._vals[kept] / 0.7)
    Pd = P.to_dense(fill_value=0.0)
    keep_mask = Dp.to_dense(fill_value=0.0) != 0
    assert_close(Dp.to_dense(fill_value=0.0), Pd * keep_mask / 0.7)
    assert F.dropout(P, 0.3, training=False) is P
    assert nn.Dropout(0.3).eval()(P) is P


def test_attention_layer_compiled_aot_eager_dynamic_fullgraph():
    """``torch.compile(model, backend="aot_eager", dynamic=True, fullgraph=True)`` (the README's GAT row): one
    graph, the same 5 losses and gradients as the dense model."""
    torch._dynamo.reset()
    ref = _train_attn(_KEEP)
    got = _train_attn(
        _adj(), wrap=lambda m: torch.compile(m, backend="aot_eager", dynamic=True, fullgraph=True)
    )
    assert_close(got, ref, atol=1e-4, rtol=1e-4)
