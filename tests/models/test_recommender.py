"""A recommender: ``KeyedJaggedBatch.pooled`` embeddings and a SparseTensor multi-hot history times a
SparseTensor ``nn.Parameter``, batches from ``DataLoader(num_workers=2)`` with the library's collate, a
checkpoint (``torch.save``/``torch.load``) of the model and optimizer state: resumed training equals
uninterrupted training, and both equal the dense model.
"""

import io
import warnings
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close
import sparsefill
from sparsefill.segment import KeyedJaggedBatch
from tests.models import _no_densify


pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:Sparse:UserWarning"),
]


# ============================================================================== 2. a recommender
_R, _DM, _K = 20, 4, 2


class _Events(torch.utils.data.Dataset):
    """Per example: dense features, a one-example KeyedJaggedBatch (ids per key), the user's history as a
    SparseTensor multi-hot over the items (fill 0), a label."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        ex = {}
        for k in range(_K):
            n = int(torch.randint(0, 4, (), generator=g))
            if n:
                ex[k] = torch.randint(0, _R, (n,), generator=g).tolist()
        hist = torch.randint(0, _R, (3,), generator=g).unique()
        H = sparsefill.sparse_coo_tensor(hist[None], torch.ones(len(hist)), (_R,))
        return (
            torch.randn(3, generator=g),
            KeyedJaggedBatch.from_lists([ex]),
            H,
            torch.randint(0, 2, (), generator=g).float(),
        )


class _Rec(nn.Module):
    def __init__(self, dense_ref=False):
        super().__init__()
        torch.manual_seed(0)
        self.dense_ref = dense_ref
        self.tables = nn.ParameterList(
            [nn.Parameter(torch.randn(_R, _DM) * 0.1) for _ in range(_K)]
        )
        self.hist_w = nn.Parameter(
            sparsefill.sparse_coo_tensor([[0, 5, 7]], torch.randn(3, _DM) * 0.1, (_R, _DM))
        )
        self.bot, self.top = nn.Linear(3, _DM), nn.Linear(_DM * (_K + 2), 1)

    def forward(self, x, kj, H):
        if self.dense_ref:  # the same model by hand on dense tensors
            pooled = [
                torch.stack(
                    [
                        self.tables[k][torch.tensor(e[k])].mean(0) if k in e else torch.zeros(_DM)
                        for e in kj.to_dict()
                    ]
                )
                for k in range(_K)
            ]
            h = H.to_dense() @ self.hist_w.to_dense()
        else:
            out = kj.pooled(dict(enumerate(self.tables)), "mean")
            pooled, h = [out[k] for k in range(_K)], H @ self.hist_w
        return self.top(torch.cat([self.bot(x), h] + pooled, 1)).squeeze(1)


def _batches(workers):
    return list(torch.utils.data.DataLoader(_Events(), batch_size=4, num_workers=workers))


def _train_rec(batches, steps, m=None, opt=None, start=0, dense_ref=False):
    m = m or _Rec(dense_ref)
    opt = opt or torch.optim.Adam(m.parameters(), lr=0.05)
    losses = []
    for i in range(start, start + steps):
        x, kj, H, y = batches[i % len(batches)]
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(m(x, kj, H), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return m, opt, torch.stack(losses)


def test_recommender_dataloader_workers_and_checkpoint_resume():
    """Batches from ``DataLoader(num_workers=2)`` equal ``num_workers=0``'s (a SparseTensor history stacked, the
    KeyedJaggedBatches concatenated); training equals the dense model's; ``torch.save``/``torch.load(weights_only)``
    of model and Adam state after 2 steps, loaded into a fresh model and optimizer, then 2 more steps: the losses of
    4 uninterrupted steps."""
    b0, b2 = _batches(0), _batches(2)
    assert len(b0) == len(b2) == 4
    for a, b in zip(b0, b2):
        assert (
            type(b[2]) is sparsefill.SparseTensor
            and b[2].shape == (4, _R)
            and b[2]._nse() == a[2]._nse()
        )
        assert_close(b[2].to_dense(), a[2].to_dense())
        assert isinstance(b[1], KeyedJaggedBatch) and b[1].to_dict() == a[1].to_dict()
        assert_close(b[0], a[0])
    with warnings.catch_warnings():
        _no_densify()
        _, _, full = _train_rec(b2, 4)
        m, opt, first = _train_rec(b2, 2)
    assert_close(full, _train_rec(b0, 4, dense_ref=True)[2])
    buf = io.BytesIO()
    torch.save({"model": m.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    ck = torch.load(buf, weights_only=True)
    m2 = _Rec()
    opt2 = torch.optim.Adam(m2.parameters(), lr=0.05)
    m2.load_state_dict(ck["model"])
    opt2.load_state_dict(ck["opt"])
    assert type(m2.hist_w) is nn.Parameter or isinstance(m2.hist_w, sparsefill.SparseTensor)
    assert isinstance(opt2.state[m2.hist_w]["exp_avg"], sparsefill.SparseTensor)
    with warnings.catch_warnings():
        _no_densify()
        _, _, second = _train_rec(b2, 2, m2, opt2, start=2)
    assert_close(torch.cat([first, second]), full)
