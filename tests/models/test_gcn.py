"""A GCN on a SparseTensor adjacency (the README's tour), trained a few steps against the same model on the
dense adjacency with the same seed (losses and parameters after the steps); block-diagonal batches of
graphs from DataLoader workers, a SparseTensor adjacency buffer in ``state_dict``, dropout of the
adjacency and of a masked attention.
"""

import io
import warnings
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close
import sparsefill
from sparsefill import masked
from tests.models import _LAYOUTS, _no_densify


# (torch.jit's deprecation, imported by inductor; torch's beta/invariant notes on native sparse tensors)
pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:Sparse:UserWarning"),
]


# ---------------------------------------------------------------------------------------------- (a) a GNN
def _graph(n=30, edges=90, seed=0, fill=0.0):
    """A random graph's symmetric-normalised adjacency ``D^-1/2 (A + I) D^-1/2`` (COO, coalesced), features."""
    g = torch.Generator().manual_seed(seed)
    src, dst = (
        torch.randint(0, n, (edges,), generator=g),
        torch.randint(0, n, (edges,), generator=g),
    )
    keys = torch.unique(torch.cat([dst, torch.arange(n)]) * n + torch.cat([src, torch.arange(n)]))
    ei = torch.stack([keys // n, keys % n])
    deg = torch.bincount(ei[0], minlength=n).float()
    A = sparsefill.sparse_coo_tensor(ei, (deg[ei[0]] * deg[ei[1]]).rsqrt(), (n, n), fill_value=fill)
    return A, torch.randn(n, 5, generator=g), torch.randint(0, 3, (n,), generator=g)


class GCN(nn.Module):
    def __init__(self, d_in=5, hidden=8, classes=3):
        super().__init__()
        torch.manual_seed(1)
        self.l1, self.l2, self.drop = (
            nn.Linear(d_in, hidden),
            nn.Linear(hidden, classes),
            nn.Dropout(0.5),
        )

    def forward(self, x, A):
        return A @ self.l2(self.drop(F.relu(A @ self.l1(x))))


def _train_gcn(A, x, y, steps=3, compile_backend=None):
    m = GCN()
    f = torch.compile(m, backend=compile_backend) if compile_backend else m
    opt = torch.optim.AdamW(m.parameters(), lr=0.01)
    losses = []
    for i in range(steps):
        torch.manual_seed(100 + i)  # (dropout draws on dense features: the same masks for both)
        opt.zero_grad()
        loss = F.cross_entropy(f(x, A), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    m.eval()
    with torch.inference_mode():
        out = f(x, A)
    return torch.stack(losses), [p.detach().clone() for p in m.parameters()], out


@_LAYOUTS
def test_gcn_trains_like_dense(layout):
    """Dropout, AdamW, eval + inference_mode, a constant SparseTensor adjacency (COO, CSR): no densify."""
    A, x, y = _graph()
    ref = _train_gcn(A.to_dense(), x, y)
    with warnings.catch_warnings():
        _no_densify()
        got = _train_gcn(A.to_sparse(layout=layout), x, y)
    assert type(got[2]) is torch.Tensor and not got[2].requires_grad
    assert_close(got[0], ref[0])
    assert_close(got[1], ref[1])
    assert_close(got[2], ref[2])


def test_gcn_compiled_aot_eager():
    """``torch.compile(model)``, eval and inference_mode included (inductor, checked by hand: the same, but a
    minute of compiling per layout here; tests/compile/test_compile_train.py has the product's inductor test)."""
    torch._dynamo.reset()
    A, x, y = _graph()
    ref = _train_gcn(A.to_dense(), x, y)
    got = _train_gcn(A, x, y, compile_backend="aot_eager")
    assert_close(got[0], ref[0])
    assert_close(got[1], ref[1])


def _block_diag_collate(batch):
    """A practitioner's collate for a batch of graphs: one block-diagonal adjacency, the features and labels
    concatenated."""
    As, xs, ys = zip(*batch)
    return torch.block_diag(*As), torch.cat(xs), torch.cat(ys)


class _Graphs(torch.utils.data.Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return _graph(4 + i, 3 * (4 + i), seed=i)


def test_block_diag_batches_graphs_in_dataloader_workers():
    """``DataLoader(num_workers=2)`` with a collate batching adjacencies by ``torch.block_diag``: a SparseTensor
    of the operands' stored elements (it densified), equal to the dense block_diag; the model's output per batch
    equals the dense model's."""
    loader = torch.utils.data.DataLoader(
        _Graphs(), batch_size=3, num_workers=2, collate_fn=_block_diag_collate
    )
    m = GCN().eval()
    batches = list(loader)
    assert len(batches) == 2
    for k, (A, x, y) in enumerate(batches):
        graphs = [_graph(4 + i, 3 * (4 + i), seed=i) for i in range(3 * k, 3 * k + 3)]
        assert isinstance(A, sparsefill.SparseTensor) and A._nse() == sum(
            g[0]._nse() for g in graphs
        )
        assert_close(A.to_dense(), torch.block_diag(*[g[0].to_dense() for g in graphs]))
        with warnings.catch_warnings():
            _no_densify()
            assert_close(m(x, A), m(x, A.to_dense()))


@_LAYOUTS
def test_block_diag_forward_backward(layout):
    """block_diag of SparseTensors with fill 0 (uncoalesced too) and of masked ones, forward and the gradient of
    the constructors' values, as on the dense equivalents; a block of another fill is stored whole."""
    v1, v2 = (
        torch.tensor([1.0, 2.0, 4.0], requires_grad=True),
        torch.tensor([3.0, 4.0, 5.0], requires_grad=True),
    )
    i1, i2 = [[0, 1, 0], [1, 0, 1]], [[0, 2, 1], [0, 1, 0]]  # (the first uncoalesced: a duplicate)
    A = sparsefill.sparse_coo_tensor(i1, v1, (2, 3))
    B = sparsefill.sparse_coo_tensor(i2, v2, (3, 2)).to_sparse(layout=layout)
    X = torch.randn(8, 4)
    with warnings.catch_warnings():
        _no_densify()
        R = torch.block_diag(A, B, A)
        got = torch.autograd.grad((R @ X).pow(2).sum(), [v1, v2])
    Ad = torch.zeros(2, 3).index_put(
        (torch.tensor(i1[0]), torch.tensor(i1[1])), v1, accumulate=True
    )
    Bd = torch.zeros(3, 2).index_put((torch.tensor(i2[0]), torch.tensor(i2[1])), v2)
    Rd = torch.block_diag(Ad, Bd, Ad)
    assert_close(R.to_dense(), Rd)
    want = torch.autograd.grad((Rd @ X).pow(2).sum(), [v1, v2])
    assert_close(got, want)
    M = sparsefill.sparse_coo_tensor(i2, v2.detach(), (3, 2), fill_value=sparsefill.indefinite)
    MM = torch.block_diag(M, M)
    assert MM._indefinite and MM._nse() == 6
    assert_close(
        MM.to_dense(fill_value=-1.0),
        torch.block_diag(M.to_dense(fill_value=-1.0), M.to_dense(fill_value=-1.0)).masked_fill(
            torch.block_diag(torch.ones(3, 2), torch.ones(3, 2)) == 0, -1.0
        ),
    )
    C = sparsefill.sparse_coo_tensor(i2, v2.detach(), (3, 2), fill_value=0.5)
    with warnings.catch_warnings():
        _no_densify()
        CA = torch.block_diag(C, A.detach())  # (C's block stored whole: its fill is not 0)
    assert CA.fill_value().item() == 0 and CA._nse() == C.numel() + A.detach().coalesce()._nse()
    assert_close(CA.to_dense(), torch.block_diag(C.to_dense(), A.detach().to_dense()))


def test_state_dict_of_sparse_adjacency_buffer():
    A, x, _ = _graph()
    m = GCN()
    m.register_buffer("A", A.to_sparse_csr())
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    m2 = GCN()
    m2.register_buffer("A", A.to_sparse_csr() * 0)
    m2.load_state_dict(torch.load(buf, weights_only=True))
    assert m2.A.sparse_layout is torch.sparse_csr
    m.eval(), m2.eval()
    assert_close(m2(x, m2.A), m(x, A.to_dense()))


def test_dropout_keeps_pattern():
    """F.dropout of a fill-0 adjacency drops stored values only (it densified: ops/pointwise/dropout.py)."""
    A, _, _ = _graph()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        D = F.dropout(A, 0.5, training=True)
    assert not [x for x in w if issubclass(x.category, sparsefill.DensifyWarning)]
    assert isinstance(D, sparsefill.SparseTensor) and D._nse() <= A._nse()


def test_dropout_of_masked_attention():
    """The GAT's attention dropout after masked.softmax: masked-out elements stay masked out (it raised)."""
    A, _, _ = _graph(fill=sparsefill.indefinite)
    P = masked.softmax(A, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sparsefill.DensifyWarning)
        D = F.dropout(P, 0.5, training=True)
    assert D._indefinite and D._nse() == P._nse()


def test_indefinite_operand_of_a_densifying_op_names_the_op():
    """An op with no handler and a masked operand: the ValueError names the op (it said "to_dense()")."""
    A, _, _ = _graph(8, 10, fill=sparsefill.indefinite)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sparsefill.DensifyWarning)
        with pytest.raises(ValueError, match="aten.bernoulli.*indefinite fill"):
            torch.bernoulli(A)
