"""A DLRM-like recommender: embeddings pooled with ``sparsefill.segment`` or a SparseTensor multi-hot
matrix, trained with gradient accumulation, clipping and a learning-rate scheduler: the same losses and
gradient norms as the dense model.
"""

import warnings
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close
import sparsefill
from sparsefill import segment
from tests.models import _no_densify


# (torch.jit's deprecation, imported by inductor; torch's beta/invariant notes on native sparse tensors)
pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:Sparse:UserWarning"),
]


# ---------------------------------------------------------------------------------------------- (b) DLRM-like
_R, _D, _B, _K = 30, 4, 12, 2


_g = torch.Generator().manual_seed(0)


_LENGTHS = torch.randint(0, 4, (_K, _B), generator=_g)


_IDS = [torch.randint(0, _R, (int(n.sum()),), generator=_g) for n in _LENGTHS]


_DX, _Y = torch.randn(_B, 3, generator=_g), torch.randint(0, 2, (_B,), generator=_g).float()


class DLRM(nn.Module):
    def __init__(self, mode):
        super().__init__()
        torch.manual_seed(0)
        self.mode = mode
        self.tables = nn.ParameterList([nn.Parameter(torch.randn(_R, _D) * 0.1) for _ in range(_K)])
        self.bot, self.top = nn.Linear(3, _D), nn.Linear(_D * (_K + 1), 1)

    def forward(self, lo, hi):
        pooled = []
        for k in range(_K):
            n = _LENGTHS[k][lo:hi]
            start = int(_LENGTHS[k][:lo].sum())
            ids = _IDS[k][start : start + int(n.sum())]
            if self.mode == "segment":
                pooled.append(segment.sparse_lengths_sum(self.tables[k], ids, n, sparse_grad=True))
            elif (
                self.mode == "multihot"
            ):  # a SparseTensor (batch, rows) of ones: the bag sum is a product
                rows = torch.repeat_interleave(torch.arange(len(n)), n)
                M = sparsefill.sparse_coo_tensor(
                    torch.stack([rows, ids]), torch.ones(len(ids)), (len(n), _R)
                )
                pooled.append(M @ self.tables[k])
            else:
                pooled.append(
                    F.embedding_bag(ids, self.tables[k], torch.cumsum(n, 0) - n, mode="sum")
                )
        return self.top(torch.cat([self.bot(_DX[lo:hi])] + pooled, 1)).squeeze(1)


def _train_dlrm(mode, steps=3, micro=3):
    m = DLRM(mode)
    dense = list(m.bot.parameters()) + list(m.top.parameters())
    opts = (
        [segment.SparseAdagrad(list(m.tables), lr=0.1), torch.optim.Adagrad(dense, lr=0.1)]
        if mode == "segment"
        else [torch.optim.Adagrad(m.parameters(), lr=0.1)]
    )
    scheds = [torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.5) for o in opts]
    losses, norms = [], []
    for _ in range(steps):
        for o in opts:
            o.zero_grad()
        total = 0.0
        for j in range(micro):  # gradient accumulation over micro-batches
            lo, hi = j * _B // micro, (j + 1) * _B // micro
            loss = F.binary_cross_entropy_with_logits(m(lo, hi), _Y[lo:hi]) / micro
            loss.backward()
            total += loss.detach()
        # (the tables' native sparse COO gradients: torch's clip_grad_norm_ does not take them, as for
        # nn.EmbeddingBag(sparse=True); the dense layers are clipped)
        norms.append(torch.nn.utils.clip_grad_norm_(dense, 0.5))
        for o in opts:
            o.step()
        for s in scheds:
            s.step()
        losses.append(total)
    return torch.stack(losses), torch.stack(norms), [p.detach() for p in m.parameters()]


@pytest.mark.parametrize("mode", ["segment", "multihot"])
def test_dlrm_accumulation_clipping_scheduler_match_dense(mode):
    """sparse_lengths_sum(sparse_grad=True) + SparseAdagrad, or a SparseTensor multi-hot @ table, against
    embedding_bag + Adagrad: micro-batch accumulation, clip_grad_norm_, StepLR; no densify."""
    ref = _train_dlrm("dense")
    with warnings.catch_warnings():
        _no_densify()
        got = _train_dlrm(mode)
    for a, b in zip(got, ref):
        assert_close(a, b)
