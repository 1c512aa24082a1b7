"""DLRM recommender on keyed jagged features
=========================================

A small DLRM-style recommender on keyed jagged features, pooled with ``sparsefill.segment``.

Every example has dense features and, per sparse feature ("key"), a list of ids of any length (or none).
The batch is one ``sparsefill.segment.KeyedJaggedBatch`` (flat ids, lengths, keys); each key's ids are
looked up in its embedding table and summed per example (``KeyedJaggedBatch.pooled``: the ids grouped by
(key, example) once for all keys, then per key ``segment.reduce(table, "sum", offsets=..., indices=ids)``,
Caffe2's ``SparseLengthsSum``, one ``embedding_bag``) with a sparse gradient (``sparse_grad=True``: one
row per looked-up id, as ``nn.EmbeddingBag(sparse=True)`` gives), which ``segment.SparseAdagrad`` applies
to the touched rows only (the rows' gradients summed, then one update each: ``torch.optim.Adagrad``'s
sparse step; one fused compiled kernel with numba installed).  The dense features go through a bottom MLP;
the bottom output and the pooled embeddings, concatenated, through a top MLP to a click logit.

Checked against the same model on ``nn.EmbeddingBag(mode="sum", sparse=True)`` tables with
``torch.optim.Adagrad`` (same weights, same losses over a few steps) and timed against it (one training
step: forward, backward, both optimizers' steps). ::

    python examples/dlrm.py                          # 8 tables of 50k x 64, batch 2048, 1 thread
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

from sparsefill import segment
from sparsefill.benchmarks.measure import (
    interleaved,
)  # (one round: each warmed up, then the median of reps)


# ----------------------------------------------------------------------------- data
def make_batch(
    batch: int = 2048,
    keys: int = 8,
    rows: int = 50_000,
    mean_length: int = 20,
    dense: int = 13,
    seed: int = 0,
):
    """``(dense_x, kj, labels)``: ``kj`` a KeyedJaggedBatch, example by example, key by key; a key with no id
    in an example is absent from it.  List lengths are uniform in ``[0, 2 * mean_length]``, ids skewed
    toward small ones (popular items), labels 0/1."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 2 * mean_length + 1, (batch, keys), generator=g)
    present = lengths.flatten() > 0
    entry_keys = torch.arange(keys).repeat(batch)[present]
    values_lengths = lengths.flatten()[present]
    ids = (torch.rand(int(values_lengths.sum()), generator=g) ** 3 * rows).long()
    kj = segment.KeyedJaggedBatch(ids, values_lengths, entry_keys, (lengths > 0).sum(1))
    return (
        torch.randn(batch, dense, generator=g),
        kj,
        torch.randint(0, 2, (batch,), generator=g).float(),
    )


def embedding_bag_inputs(kj: segment.KeyedJaggedBatch, keys: int):
    """Per key, ``(ids, offsets)`` as ``nn.EmbeddingBag`` takes them (the peer's input layout)."""
    key_of_id = torch.repeat_interleave(kj.keys, kj.values_lengths)
    example_of_entry = torch.repeat_interleave(torch.arange(kj.batch_size), kj.example_lengths)
    out = []
    for k in range(keys):
        per_example = torch.zeros(kj.batch_size, dtype=torch.long)
        sel = kj.keys == k
        per_example[example_of_entry[sel]] = kj.values_lengths[sel]
        out.append((kj.values[key_of_id == k], torch.cumsum(per_example, 0) - per_example))
    return out


# ----------------------------------------------------------------------------- the model
def mlp(*sizes: int) -> nn.Sequential:
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class DLRM(nn.Module):
    """Tables as plain parameters, pooled with ``sparsefill.segment``."""

    def __init__(self, keys: int = 8, rows: int = 50_000, dim: int = 64, dense: int = 13):
        super().__init__()
        self.tables = nn.ParameterList(
            [nn.Parameter(torch.randn(rows, dim) * 0.01) for _ in range(keys)]
        )
        self.bottom = mlp(dense, 128, dim)
        self.top = mlp(dim * (keys + 1), 256, 1)

    def forward(self, dense_x: torch.Tensor, kj: segment.KeyedJaggedBatch) -> torch.Tensor:
        pooled = kj.pooled(dict(enumerate(self.tables)), "sum", sparse_grad=True)  # {key: (B, dim)}
        z = torch.cat([self.bottom(dense_x)] + [pooled[k] for k in range(len(self.tables))], 1)
        return self.top(z).squeeze(1)

    def optimizers(self, lr: float = 0.01):
        return [
            segment.SparseAdagrad(list(self.tables), lr=lr),
            torch.optim.Adagrad(
                list(self.bottom.parameters()) + list(self.top.parameters()), lr=lr
            ),
        ]


class EmbeddingBagDLRM(nn.Module):
    """The peer: ``nn.EmbeddingBag(mode="sum", sparse=True)`` tables, ``torch.optim.Adagrad``."""

    def __init__(self, model: DLRM):
        super().__init__()
        rows, dim = model.tables[0].shape
        self.tables = nn.ModuleList(
            [nn.EmbeddingBag(rows, dim, mode="sum", sparse=True) for _ in model.tables]
        )
        self.bottom = mlp(model.bottom[0].in_features, 128, dim)
        self.top = mlp(dim * (len(model.tables) + 1), 256, 1)
        self.load_state_dict(_peer_state(model))

    def forward(self, dense_x, bags):
        z = torch.cat(
            [self.bottom(dense_x)]
            + [t(ids, offsets) for t, (ids, offsets) in zip(self.tables, bags)],
            1,
        )
        return self.top(z).squeeze(1)

    def optimizers(self, lr: float = 0.01):
        return [torch.optim.Adagrad(self.parameters(), lr=lr)]


def _peer_state(model: DLRM) -> dict:
    """``model``'s weights under the peer's names (``tables.3`` -> ``tables.3.weight``)."""
    return {
        (f"tables.{k.split('.')[1]}.weight" if k.startswith("tables.") else k): v.detach().clone()
        for k, v in model.state_dict().items()
    }


# ----------------------------------------------------------------------------- training
def trainer(model, inputs, labels, lr: float = 0.01):
    """``step()``: one step of every optimizer on the mean binary cross-entropy; returns the loss."""
    opts = model.optimizers(lr)

    def step() -> float:
        for o in opts:
            o.zero_grad()
        loss = F.binary_cross_entropy_with_logits(model(*inputs), labels)
        loss.backward()
        for o in opts:
            o.step()
        return loss.item()

    return step


def setup(batch: int = 2048, keys: int = 8, rows: int = 50_000, dim: int = 64, seed: int = 0):
    """``(ours, peer)``: ``(model, inputs, labels)`` each, same weights, same batch."""
    dense_x, kj, labels = make_batch(batch, keys, rows, seed=seed)
    torch.manual_seed(seed)
    model = DLRM(keys, rows, dim)
    peer = EmbeddingBagDLRM(model)
    return (model, (dense_x, kj), labels), (peer, (dense_x, embedding_bag_inputs(kj, keys)), labels)


def check(
    batch: int = 64,
    keys: int = 4,
    rows: int = 500,
    dim: int = 8,
    steps: int = 4,
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> list[tuple[float, float]]:
    """Same losses over ``steps`` steps and same tables afterwards as the EmbeddingBag peer."""
    (m, x, y), (p, xp, yp) = setup(batch, keys, rows, dim)
    ours, theirs = trainer(m, x, y), trainer(p, xp, yp)
    losses = [(ours(), theirs()) for _ in range(steps)]
    for a, b in losses:
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol)
    for t, bag in zip(m.tables, p.tables):
        torch.testing.assert_close(t.detach(), bag.weight.detach(), atol=atol, rtol=rtol)
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
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--rows", type=int, default=50_000)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--plot", action="store_true", help="draw the losses and step times")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    losses = check()
    print("losses (sparsefill, EmbeddingBag):", [f"{a:.6f} {b:.6f}" for a, b in losses])
    (m, x, y), (pm, xp, yp) = setup(args.batch, rows=args.rows)
    t_ours, t_theirs = (
        1e3 * t
        for t in interleaved(
            {"ours": trainer(m, x, y), "theirs": trainer(pm, xp, yp)}, 1, args.reps
        ).values()
    )
    print(
        f"batch {args.batch}, 8 tables of {args.rows} x 64, {x[1].values.numel()} ids: training step "
        f"sparsefill {t_ours:.1f} ms, EmbeddingBag + Adagrad {t_theirs:.1f} ms ({t_ours / t_theirs:.2f}x)"
    )
    if args.plot:
        import matplotlib.pyplot as plt

        _, (ax0, ax1) = plt.subplots(1, 2, figsize=(9, 3.5), layout="constrained")
        plot_losses(ax0, losses, ("sparsefill", "EmbeddingBag"))
        plot_step_times(
            ax1, {f"batch {args.batch}": (t_ours, t_theirs)}, ("sparsefill", "EmbeddingBag")
        )


if __name__ == "__main__":
    main()
