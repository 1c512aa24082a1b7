"""Graph attention network (GAT) on a SparseTensor adjacency
=========================================================

A two-layer graph attention network (GAT) written as a dense model would be, on a SparseTensor adjacency.

The adjacency ``A`` is a SparseTensor with an *indefinite* fill (no edge = masked out, not 0): ``A[i, j]``
is stored when node ``j`` sends a message to node ``i``.  One attention layer is the dense formula::

    Wh = x @ W,   S[i, j] = (Wh @ a_dst)[i] + (Wh @ a_src)[j]   on the edges of A,
    out = masked.softmax(leaky_relu(S, 0.2), 1) @ Wh + b,

with no gather, no scatter, no edge list: ``S = A * e_dst[:, None] + A * e_src[None, :]`` keeps A's
pattern, ``F.leaky_relu`` maps the stored scores, ``sparsefill.masked.softmax`` normalises each row
over its stored entries and ``@`` is the sparse-dense product.  Autograd trains it as it is (Adam).

With ``H`` heads (``--heads``) the adjacency is a hybrid ``(N, N, H)`` SparseTensor, the heads a dense
dim: each head's scores ``A * e_dst[:, None, :] + A * e_src[None]`` stay on the one pattern, the
softmax runs over dim 1 for every head at once, and the product with ``Wh`` viewed ``(N, H, D)`` is::

    out = torch.einsum("ijh,jhd->ihd", P, Wh)        # head h: P[:, :, h] @ Wh[:, h]

which runs on the pattern head by head, forward and backward (no ``N x N`` tensor).  The first layer
concatenates the heads (``GATConv(heads=H)``), the second has one head on ``A[:, :, 0]``.

Checked against torch_geometric's ``GATConv`` (same weights): same forward outputs and same losses over
a few Adam steps; timed against it (one training step: forward + backward + step). ::

    python examples/gat.py                 # 5k nodes / 55k edges and 20k / 220k, D=32, 1 thread
    python examples/gat.py --nodes 5000    # one size
    python examples/gat.py --csr           # the adjacency in CSR
    python examples/gat.py --heads 4       # four heads: a hybrid (N, N, 4) adjacency
    python examples/gat.py --nodes 100000 --edges-per-node 19 --heads 4 --hidden 64   # 2M edges
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

import sparsefill
from sparsefill import masked
from sparsefill.benchmarks.measure import (
    interleaved,
)  # (one round: each warmed up, then the median of reps)


# ----------------------------------------------------------------------------- data
def make_graph(
    nodes: int, edges_per_node: int = 10, features: int = 32, classes: int = 8, seed: int = 0
):
    """A random graph: ``x`` (nodes, features), ``edge_index`` (2, E) as torch_geometric spells it
    (row 0: source, row 1: target; self loops included, no duplicates, sorted by target), labels ``y``.
    E is about ``nodes * (edges_per_node + 1)``."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, nodes, (nodes * edges_per_node,), generator=g)
    dst = torch.randint(0, nodes, (nodes * edges_per_node,), generator=g)
    loops = torch.arange(nodes)
    keys = torch.unique(
        torch.cat([dst, loops]) * nodes + torch.cat([src, loops])
    )  # sorted by (target, source)
    edge_index = torch.stack([keys % nodes, keys // nodes])
    x = torch.randn(nodes, features, generator=g)
    y = torch.randint(0, classes, (nodes,), generator=g)
    return x, edge_index, y


def adjacency(
    edge_index: torch.Tensor, nodes: int, layout=torch.sparse_coo, heads: int = 1
) -> sparsefill.SparseTensor:
    """``A[target, source] = 1`` on the edges, masked out elsewhere (indefinite fill); COO or CSR.
    With ``heads > 1``: a hybrid ``(nodes, nodes, heads)`` tensor, the heads a dense dim."""
    dense = (heads,) if heads > 1 else ()
    A = sparsefill.sparse_coo_tensor(
        edge_index.flip(0),
        torch.ones((edge_index.shape[1],) + dense),
        (nodes, nodes) + dense,
        fill_value=sparsefill.indefinite,
    )
    return A.to_sparse_csr() if layout is torch.sparse_csr else A


# ----------------------------------------------------------------------------- the model
class GATLayer(nn.Module):
    """Attention with ``heads`` heads, concatenated; parameters named as ``GATConv(heads=heads)``'s."""

    def __init__(self, d_in: int, d_out: int, heads: int = 1):
        super().__init__()
        self.heads, self.d_out = heads, d_out
        self.lin = nn.Linear(d_in, heads * d_out, bias=False)
        shape = (heads, d_out) if heads > 1 else (d_out,)
        self.att_src = nn.Parameter(torch.empty(shape))
        self.att_dst = nn.Parameter(torch.empty(shape))
        self.bias = nn.Parameter(torch.zeros(heads * d_out))
        nn.init.xavier_uniform_(self.lin.weight)
        nn.init.normal_(self.att_src, std=0.3)
        nn.init.normal_(self.att_dst, std=0.3)

    def forward(self, x: torch.Tensor, A: sparsefill.SparseTensor) -> torch.Tensor:
        if self.heads == 1:  # A (N, N)
            Wh = self.lin(x)
            S = (
                A * (Wh @ self.att_dst)[:, None] + A * (Wh @ self.att_src)[None, :]
            )  # scores on A's pattern
            P = masked.softmax(F.leaky_relu(S, 0.2), 1)  # each row over its edges
            return P @ Wh + self.bias
        Wh = self.lin(x).view(-1, self.heads, self.d_out)  # A (N, N, heads)
        e_dst, e_src = (Wh * self.att_dst).sum(-1), (Wh * self.att_src).sum(-1)  # (N, heads)
        S = A * e_dst[:, None, :] + A * e_src[None, :, :]
        P = masked.softmax(F.leaky_relu(S, 0.2), 1)
        return torch.einsum("ijh,jhd->ihd", P, Wh).flatten(1) + self.bias


class GAT(nn.Module):
    """Two layers: ``heads`` concatenated heads (a hybrid ``(N, N, heads)`` adjacency when ``heads > 1``),
    then one head."""

    def __init__(self, d_in: int, hidden: int, classes: int, heads: int = 1):
        super().__init__()
        self.layer1, self.layer2 = GATLayer(d_in, hidden, heads), GATLayer(heads * hidden, classes)

    def forward(self, x, A):
        return self.layer2(F.elu(self.layer1(x, A)), A if A.dim() == 2 else A[:, :, 0])


# ----------------------------------------------------------------------------- the peer
def pyg_model(model: GAT):
    """torch_geometric's two-layer ``GATConv`` with ``model``'s weights (``forward(x, edge_index)``)."""
    from torch_geometric.nn import GATConv

    class PygGAT(nn.Module):
        def __init__(self):
            super().__init__()
            conv = lambda layer: GATConv(
                layer.lin.in_features, layer.d_out, heads=layer.heads, add_self_loops=False
            )  # the graph already has them
            self.layer1, self.layer2 = conv(model.layer1), conv(model.layer2)

        def forward(self, x, edge_index):
            return self.layer2(F.elu(self.layer1(x, edge_index)), edge_index)

    peer = PygGAT()
    with torch.no_grad():
        for ours, theirs in ((model.layer1, peer.layer1), (model.layer2, peer.layer2)):
            theirs.lin.weight.copy_(ours.lin.weight)
            theirs.att_src.copy_(ours.att_src.view_as(theirs.att_src))
            theirs.att_dst.copy_(ours.att_dst.view_as(theirs.att_dst))
            theirs.bias.copy_(ours.bias)
    return peer


# ----------------------------------------------------------------------------- training
def trainer(model: nn.Module, graph, y: torch.Tensor, lr: float = 0.005):
    """``step()``: one Adam step on the cross-entropy of all nodes; returns the loss (a float)."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    x, graph = graph

    def step() -> float:
        opt.zero_grad()
        loss = F.cross_entropy(model(x, graph), y)
        loss.backward()
        opt.step()
        return loss.item()

    return step


def setup(
    nodes: int,
    features: int = 32,
    classes: int = 8,
    seed: int = 0,
    layout=torch.sparse_coo,
    with_peer: bool = True,
    heads: int = 1,
    edges_per_node: int = 10,
    hidden: int | None = None,
):
    """The graph, our model and the peer with the same weights: ``(x, A, edge_index, y, model, peer)``
    (``peer`` None unless ``with_peer``).  About ``nodes * (edges_per_node + 1)`` edges (self loops
    included: 10 gives 1.1M edges at 100k nodes, 19 gives 2M); ``hidden`` the first layer's
    channels per head (``GATConv``'s ``out_channels``; default ``features``)."""
    x, edge_index, y = make_graph(nodes, edges_per_node, features, classes, seed)
    torch.manual_seed(seed)
    model = GAT(features, features if hidden is None else hidden, classes, heads)
    A = adjacency(edge_index, nodes, layout, heads)
    return x, A, edge_index, y, model, pyg_model(model) if with_peer else None


def check(
    nodes: int = 300,
    steps: int = 3,
    layout=torch.sparse_coo,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    heads: int = 1,
) -> list[tuple[float, float]]:
    """Same forward outputs and same losses over ``steps`` Adam steps as ``GATConv``; returns the losses."""
    x, A, edge_index, y, model, peer = setup(nodes, layout=layout, heads=heads)
    torch.testing.assert_close(model(x, A), peer(x, edge_index), atol=atol, rtol=rtol)
    ours, theirs = trainer(model, (x, A), y), trainer(peer, (x, edge_index), y)
    losses = [(ours(), theirs()) for _ in range(steps)]
    for a, b in losses:
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol)
    return losses


def _peak_mb(fn) -> float:
    from sparsefill.benchmarks.measure import (
        measure_memory,
    )  # torch's allocations + Python's, one call

    return measure_memory(fn)["peak_bytes"] / 2**20


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
    p.add_argument("--nodes", type=int, nargs="*", default=[5000, 20000])
    p.add_argument("--csr", action="store_true", help="the adjacency in CSR (default COO)")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--plot", action="store_true", help="draw the losses and step times")
    p.add_argument("--heads", type=int, default=1, help="attention heads of the first layer")
    p.add_argument(
        "--edges-per-node", type=int, default=10, help="random edges per node (plus a self loop)"
    )
    p.add_argument("--hidden", type=int, default=None, help="channels per head (default 32)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    layout = torch.sparse_csr if args.csr else torch.sparse_coo
    losses = check(layout=layout, heads=args.heads)
    print("losses (sparsefill, GATConv):", [f"{a:.6f} {b:.6f}" for a, b in losses])
    times = {}
    for n in args.nodes:
        x, A, edge_index, y, model, peer = setup(
            n,
            layout=layout,
            heads=args.heads,
            edges_per_node=args.edges_per_node,
            hidden=args.hidden,
        )
        ours, theirs = trainer(model, (x, A), y), trainer(peer, (x, edge_index), y)
        t_ours, t_theirs = (
            1e3 * t for t in interleaved({"ours": ours, "theirs": theirs}, 1, args.reps).values()
        )
        m_ours, m_theirs = _peak_mb(ours), _peak_mb(theirs)
        print(
            f"{n} nodes, {edge_index.shape[1]} edges, training step: sparsefill {t_ours:.1f} ms, "
            f"{m_ours:.0f} MB; GATConv {t_theirs:.1f} ms, {m_theirs:.0f} MB "
            f"({t_ours / t_theirs:.2f}x the time, {m_ours / m_theirs:.2f}x the memory)"
        )
        times[f"{n} nodes"] = (t_ours, t_theirs)
    if args.plot:
        import matplotlib.pyplot as plt

        _, (ax0, ax1) = plt.subplots(1, 2, figsize=(9, 3.5), layout="constrained")
        plot_losses(ax0, losses, ("sparsefill", "GATConv"))
        plot_step_times(ax1, times, ("sparsefill", "GATConv"))


if __name__ == "__main__":
    main()
