"""A masked-attention transformer block and the attention spellings around it (``sdpa`` with a sparse
``attn_mask``, ``sampled_addmm`` and ``sparse_mask``, SDDMM attention, ``examples/sparse_attention.py``,
a multi-head GAT's scores on a masked hybrid), each against the same computation on dense tensors.
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


# (torch.jit's deprecation, imported by inductor; torch's beta/invariant notes on native sparse tensors)
pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:Sparse:UserWarning"),
]


# ---------------------------------------------------------------------------------------------- (c) attention
_L, _E = 6, 8


_KEEP = (torch.rand(_L, _L, generator=torch.Generator().manual_seed(0)) < 0.4) | torch.eye(
    _L, dtype=torch.bool
)


_MASK = sparsefill.sparse_coo_tensor(
    _KEEP.nonzero().t(), torch.zeros(int(_KEEP.sum())), (_L, _L), fill_value=sparsefill.indefinite
)


class Block(nn.Module):
    def __init__(self, sparse):
        super().__init__()
        torch.manual_seed(1)
        self.sparse = sparse
        self.qkv, self.o, self.ln = nn.Linear(_E, 3 * _E), nn.Linear(_E, _E), nn.LayerNorm(_E)
        self.ff = nn.Sequential(nn.Linear(_E, 16), nn.GELU(), nn.Linear(16, _E))

    def attn(self, h):
        q, k, v = self.qkv(h).chunk(3, -1)
        S = q @ k.t() / _E**0.5
        if self.sparse:  # the scores on the mask's pattern, masked out elsewhere
            return masked.softmax(_MASK + S, 1) @ v
        return torch.softmax(S.masked_fill(~_KEEP, float("-inf")), 1) @ v

    def forward(self, h):
        h = h + self.o(checkpoint(self.attn, self.ln(h), use_reentrant=False))
        return h + self.ff(self.ln(h))


def test_masked_attention_block_trains_like_dense():
    """An indefinite-fill attention mask, ``masked.softmax``, ``torch.utils.checkpoint``, dense layers around;
    SGD with momentum (Adam would amplify the k-bias's rounding-level gradient, zero in exact arithmetic)."""
    x = torch.randn(_L, _E, generator=torch.Generator().manual_seed(2))
    out = []
    for sparse in (True, False):
        m = Block(sparse)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        losses = []
        with warnings.catch_warnings():
            _no_densify()
            for _ in range(3):
                opt.zero_grad()
                loss = m(x).pow(2).mean()
                loss.backward()
                opt.step()
                losses.append(loss.detach())
        out.append((torch.stack(losses), [p.detach() for p in m.parameters()]))
    assert_close(out[0][0], out[1][0])
    assert_close(out[0][1], out[1][1])


def test_sdpa_with_sparse_attn_mask():
    """``F.scaled_dot_product_attention`` with a SparseTensor ``attn_mask``: bool (fill False) and additive
    (fill -inf) masks give the dense masks' result; an indefinite one masks out its unspecified pairs
    (as ``masked.softmax`` of the sampled scores: the fused path of ``ops/linalg/attention.py``)."""
    q, k, v = torch.randn(3, 1, _L, _E, generator=torch.Generator().manual_seed(3)).unbind(0)
    idx = _KEEP.nonzero().t()
    additive = sparsefill.sparse_coo_tensor(
        idx, torch.zeros(idx.shape[1]), (_L, _L), fill_value=float("-inf")
    )
    for mask, dense in [(sparsefill.to_sparse(_KEEP), _KEEP), (additive, additive.to_dense())]:
        assert_close(
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
            F.scaled_dot_product_attention(q, k, v, attn_mask=dense),
        )
    assert_close(
        F.scaled_dot_product_attention(q, k, v, attn_mask=_MASK),
        F.scaled_dot_product_attention(q, k, v, attn_mask=_KEEP),
    )


@_LAYOUTS
@pytest.mark.parametrize("fill", [0.0, "indefinite"])
def test_sampled_addmm_and_sparse_mask(layout, fill):
    """``torch.sparse.sampled_addmm`` (SDDMM) of a SparseTensor (it densified, then torch raised
    NotImplementedError) and ``x.sparse_mask(A)``: as torch's on the native CSR tensor, forward and the
    gradients of the constructor's values, mat1 and mat2 (a dense and a sparse upstream gradient); an
    indefinite fill stays indefinite."""
    idx = torch.tensor([[0, 1, 2, 2, 0], [1, 2, 0, 2, 1]])  # (uncoalesced: (0, 1) twice)
    v = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.5], requires_grad=True)
    f = sparsefill.indefinite if fill == "indefinite" else fill
    A = sparsefill.sparse_coo_tensor(idx, v, (3, 3), fill_value=f).to_sparse(layout=layout)
    m1, m2 = torch.randn(3, 2, requires_grad=True), torch.randn(2, 3, requires_grad=True)
    nat = torch.sparse_coo_tensor(idx, v.detach(), (3, 3)).coalesce().to_sparse_csr()
    with warnings.catch_warnings():
        _no_densify()
        r = torch.sparse.sampled_addmm(A, m1, m2, beta=0.5, alpha=2.0)
        D = torch.randn(3, 3)
        Dm = D.sparse_mask(A)
    want = torch.sparse.sampled_addmm(nat, m1.detach(), m2.detach(), beta=0.5, alpha=2.0).to_dense()
    assert r.sparse_layout is layout and r._indefinite == (fill == "indefinite")
    assert_close(r.to_dense(fill_value=0.0), want)
    assert not Dm._indefinite and Dm.sparse_layout is layout
    assert_close(Dm.to_dense(), D.sparse_mask(nat).to_dense())
    keep = torch.zeros(3, 3, dtype=torch.bool).index_put((idx[0], idx[1]), torch.tensor(True))
    vd, m1d, m2d = (t.detach().requires_grad_() for t in (v, m1, m2))
    Ad = torch.zeros(3, 3).index_put((idx[0], idx[1]), vd, accumulate=True)
    dense = torch.where(keep, 0.5 * Ad + 2.0 * (m1d @ m2d), 0.0)
    G = torch.randn(3, 3)
    ref = torch.autograd.grad((dense * G).sum(), [vd, m1d, m2d])
    for loss in (lambda r: (r.to_dense(fill_value=0.0) * G).sum(), lambda r: masked.sum(r * G)):
        with warnings.catch_warnings():
            _no_densify()
            got = torch.autograd.grad(loss(r), [v, m1, m2], retain_graph=True)
        assert_close(got, ref)


def test_sddmm_attention_matches_dense():
    """Sparse attention with no dense score matrix: ``masked.softmax(sampled_addmm(mask, q, k^T), 1) @ v``
    on an indefinite-fill mask, forward and gradients of q, k, v as the dense masked attention."""
    q, k, v = (
        torch.randn(_L, _E, generator=torch.Generator().manual_seed(s), requires_grad=True)
        for s in (4, 5, 6)
    )
    with warnings.catch_warnings():
        _no_densify()
        out = masked.softmax(torch.sparse.sampled_addmm(_MASK.to_sparse_csr(), q, k.t()), 1) @ v
        got = torch.autograd.grad(out.pow(2).sum(), [q, k, v])
    ref_out = torch.softmax((q @ k.t()).masked_fill(~_KEEP, float("-inf")), 1) @ v
    assert_close(out, ref_out)
    assert_close(got, torch.autograd.grad(ref_out.pow(2).sum(), [q, k, v]))


def test_sparse_attention_example():
    """examples/sparse_attention.py (SDDMM scores, masked.softmax, checkpoint, AdamW) at smoke size: the same
    losses as the dense masked block; its main runs."""
    from pathlib import Path
    from sparsefill.benchmarks.cases_models import _example as load

    folder = Path(__file__).resolve().parents[2] / "examples"
    if not (folder / "sparse_attention.py").is_file():
        pytest.skip(f"no {folder / 'sparse_attention.py'} (not a source checkout)")
    ex = load("sparse_attention", folder)
    with warnings.catch_warnings():
        _no_densify()
        losses = ex.check(tokens=40, density=0.1, steps=2)
        ex.main(["--tokens", "50", "--reps", "1"])
    assert len(losses) == 2


def test_hybrid_times_dense_along_sparse_dims_stays_sparse():
    """Multi-head GAT scores ``A * e[:, None, :]`` (heads as a dense dim; fill 0): a SparseTensor of A's pattern (it was
    computed dense with no DensifyWarning: ops/pointwise_dense._constant_fill)."""
    idx = torch.tensor([[0, 1, 2], [1, 2, 0]])
    A = sparsefill.sparse_coo_tensor(idx, torch.arange(6.0).view(3, 2), (3, 3, 2))
    e = torch.randn(3, 2)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        r = A * e[:, None, :]
    assert_close(
        r.to_dense() if isinstance(r, sparsefill.SparseTensor) else r, A.to_dense() * e[:, None, :]
    )
    assert isinstance(r, sparsefill.SparseTensor) and r._nse() == 3, type(r)
    assert not w


def test_multihead_gat_scores_on_masked_hybrid():
    """The multi-head GAT on an indefinite hybrid adjacency (it raised to_dense's ValueError)."""
    N, H, D = 7, 2, 3
    idx = (torch.eye(N, dtype=torch.bool) | torch.eye(N, dtype=torch.bool).roll(1, 1)).nonzero().t()
    keep = torch.zeros(N, N, dtype=torch.bool).index_put((idx[0], idx[1]), torch.tensor(True))
    A = sparsefill.sparse_coo_tensor(
        idx, torch.ones(idx.shape[1], H), (N, N, H), fill_value=sparsefill.indefinite
    )
    Wh = torch.randn(N, H, D, generator=torch.Generator().manual_seed(7), requires_grad=True)
    a_src, a_dst = torch.randn(2, H, D, generator=torch.Generator().manual_seed(8)).unbind(0)

    def attend(scores_of):
        es, ed = (Wh * a_src).sum(-1), (Wh * a_dst).sum(-1)
        return scores_of(ed[:, None, :], es[None, :, :])

    P = attend(lambda d, s: masked.softmax(F.leaky_relu(A * d + A * s, 0.2), 1))
    out = torch.einsum("ijh,jhd->ihd", P, Wh)
    Pd = attend(
        lambda d, s: torch.softmax(
            F.leaky_relu(d + s, 0.2).masked_fill(~keep[..., None], float("-inf")), 1
        )
    )
    assert_close(out, torch.einsum("ijh,jhd->ihd", Pd, Wh))
