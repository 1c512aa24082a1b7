"""Sparse attention in a transformer block
=======================================

Sparse attention in a transformer block: the attention mask is a SparseTensor with an *indefinite* fill (a
pair (i, j) is stored when token i may attend to token j, masked out elsewhere), and the block is written as
the dense one would be, with no dense ``L x L`` score matrix::

    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

torch's call with the SparseTensor as the mask computes, in one pass per block of rows, the scores at the
mask's stored pairs only, their row softmax and the product with ``v``; its backward recomputes them
(``sparsefill/ops/linalg/attention.py``).  It equals the three steps written out (``attention_steps``)::

    S = torch.sparse.sampled_addmm(mask, q, k.T, alpha=1 / sqrt(E))   the scores at the mask's pattern (SDDMM)
    P = sparsefill.masked.softmax(S, 1)                             each row over its stored elements
    out = P @ v                                                     a sparse-dense product

which keep ``S`` and ``P`` (the values at every stored pair) for the backward.  A bool SparseTensor (stored
True, fill False) or a float one (the stored values added to the scores, fill -inf) works as well.

``torch.utils.checkpoint`` around the attention, LayerNorm and an MLP around it, AdamW.  Checked against the
same block with the dense bool mask (same weights, same losses over a few steps) and timed against it (one
training step). ::

    python examples/sparse_attention.py                   # L = 2000 tokens, 1% of the pairs, 1 thread
    python examples/sparse_attention.py --tokens 4000 --density 0.005
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import sparsefill
from sparsefill import masked
from sparsefill.benchmarks.measure import (
    interleaved,
)  # (one round: each warmed up, then the median of reps)


def make_mask(tokens: int, density: float, seed: int = 0):
    """``(mask, keep)``: the allowed pairs (random, the diagonal included) as an indefinite-fill CSR SparseTensor
    and as the dense boolean mask."""
    g = torch.Generator().manual_seed(seed)
    keep = (torch.rand(tokens, tokens, generator=g) < density) | torch.eye(tokens, dtype=torch.bool)
    idx = keep.nonzero().t()
    mask = sparsefill.sparse_coo_tensor(
        idx, torch.zeros(idx.shape[1]), keep.shape, fill_value=sparsefill.indefinite
    )
    return mask.to_sparse_csr(), keep


class Block(nn.Module):
    """Pre-norm attention block (one head) and MLP; ``mask`` a SparseTensor, or a dense bool tensor (the peer)."""

    def __init__(self, dim: int, mask):
        super().__init__()
        self.mask = mask
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def attention(self, h):
        q, k, v = self.qkv(h).chunk(3, -1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)

    def forward(self, x):
        x = x + self.out(checkpoint(self.attention, self.ln1(x), use_reentrant=False))
        return x + self.mlp(self.ln2(x))


def attention_steps(q, k, v, mask):
    """The attention of ``mask`` (an indefinite-fill SparseTensor) in three steps: the scores at its
    pattern, their masked softmax, the product with ``v``."""
    S = torch.sparse.sampled_addmm(mask, q, k.t(), alpha=q.shape[-1] ** -0.5)
    return masked.softmax(S, 1) @ v


def trainer(model: nn.Module, x: torch.Tensor, target: torch.Tensor, lr: float = 1e-3):
    """``step()``: one AdamW step on the mean squared error; returns the loss (a float)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)

    def step() -> float:
        opt.zero_grad()
        loss = F.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        return loss.item()

    return step


def setup(tokens: int, density: float, dim: int = 32, seed: int = 0):
    """``(ours, peer)`` trainers: the same weights and data, the sparse and the dense mask."""
    mask, keep = make_mask(tokens, density, seed)
    g = torch.Generator().manual_seed(seed + 1)
    x, target = torch.randn(tokens, dim, generator=g), torch.randn(tokens, dim, generator=g)
    torch.manual_seed(seed)
    ours = Block(dim, mask)
    peer = Block(dim, keep)
    peer.load_state_dict(ours.state_dict())
    return trainer(ours, x, target), trainer(peer, x, target)


def check(tokens: int = 64, density: float = 0.1, steps: int = 3) -> list[tuple[float, float]]:
    """Same losses over ``steps`` AdamW steps as the dense block, and the attention equal to its
    three steps; returns the losses."""
    mask, _ = make_mask(tokens, density)
    q, k, v = torch.randn(3, tokens, 8).unbind(0)
    torch.testing.assert_close(
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask), attention_steps(q, k, v, mask)
    )
    ours, peer = setup(tokens, density)
    losses = [(ours(), peer()) for _ in range(steps)]
    for a, b in losses:
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    return losses


def plot_step_times(ax, times: dict, labels=("sparsefill", "peer")):
    """Grouped bars: one training step's time (ms) per case, sparsefill beside its peer."""
    names = list(times)
    for k, label in enumerate(labels):
        xs = [i + (k - 0.5) * 0.38 for i in range(len(names))]
        ax.bar(xs, [times[n][k] for n in names], width=0.38, label=label)
    ax.set_xticks(range(len(names)), names)
    ax.set(ylabel="ms per step", title="one step at this size, on the machine that ran it")
    ax.legend()


def plot_losses(ax, losses, labels=("sparsefill", "peer")):
    """The losses of both models over the training steps of ``check`` (the lines coincide)."""
    for k, label in enumerate(labels):
        ax.plot([pair[k] for pair in losses], marker="o", ls="-" if k == 0 else "--", label=label)
    ax.set(xlabel="step", ylabel="loss", title="same weights, same losses")
    ax.legend()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--tokens", type=int, default=2000)
    p.add_argument("--density", type=float, default=0.01)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--plot", action="store_true", help="draw the losses and step times")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    losses = check()
    print("losses (sparse mask, dense mask):", [f"{a:.6f} {b:.6f}" for a, b in losses])
    ours, peer = setup(args.tokens, args.density)
    t_ours, t_peer = (
        1e3 * t for t in interleaved({"ours": ours, "peer": peer}, 1, args.reps).values()
    )
    print(
        f"{args.tokens} tokens, {args.density:.1%} of the pairs: training step sparse {t_ours:.1f} ms, "
        f"dense bool mask {t_peer:.1f} ms ({t_ours / t_peer:.2f}x the time)"
    )
    if args.plot:
        import matplotlib.pyplot as plt

        _, (ax0, ax1) = plt.subplots(1, 2, figsize=(9, 3.5), layout="constrained")
        plot_losses(ax0, losses, ("sparse mask", "dense mask"))
        plot_step_times(
            ax1, {f"{args.tokens} tokens": (t_ours, t_peer)}, ("sparse mask", "dense mask")
        )


if __name__ == "__main__":
    main()
