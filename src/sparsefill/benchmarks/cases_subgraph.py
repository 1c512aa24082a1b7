"""Row and column selection at graph scale: ``A[idx][:, idx]`` (the induced subgraph of a node set),
``A[idx]``, ``A[:, idx]`` and ``A.index_select(0 / 1, idx)`` on a graph's adjacency matrix (edge
weights as values, fill 0), COO and CSR, against ``torch_geometric.utils.subgraph(idx, edge_index,
edge_attr, relabel_nodes=True)`` on the same edges: the bar for every form (the induced subgraph is
what a user of PyG computes; the single selections are its halves).  ``k-hop subgraph`` adds the
set's construction: the 1-hop set of the seeds read off ``A[seeds]``'s columns, then its induced
subgraph, against ``torch_geometric.utils.k_hop_subgraph(seeds, 1, ...)``.

Input (fixed seed): ``N`` nodes, ``E`` edges drawn with power-law-ish degrees (both endpoints with
weights ``rank ** -0.8`` over a random node order), duplicates dropped, float32 weights; the node
sets: ``k`` random seeds (unsorted) or their 1-hop set (sorted, as ``k_hop_subgraph`` gives it;
about 10k nodes at full size).  Full size 100k nodes, 1M edges, 1024 seeds; ``--quick`` 20k nodes,
200k edges, 256 seeds.  The graph is built once per size and kept; a COO tensor's row pointers are
computed on its first row selection and kept with its pattern (the timed calls are warm, as a graph
reused across mini-batches).

Measured 2026-12-06 05:35 UTC (``--filter 'subgraph selection' --threads 1``, full size; a shared
2-core machine, other processes kept ~1.5 cores busy, so spreads are 5-60%), sparsefill / PyG, COO
and CSR::

    A[idx][:, idx]   1024 seeds 0.14 / 0.26    1-hop set 0.38 / 0.32    (1.5-7 ms against 10-22 ms)
    A[idx]           1024 seeds 0.02 / 0.02    1-hop set 0.07 / 0.07    index_select(0): 0.02-0.06
    A[:, idx]        1024 seeds 0.51 / 0.53    1-hop set 0.86 / 1.00    index_select(1): 0.49-1.07
    k-hop subgraph   0.37 / 0.39 against k_hop_subgraph

(before: ``A[idx][:, idx]`` 5.3x PyG at 1024 seeds, 7.1x on the 1-hop set).  A column selection
reads a mask per stored edge, as PyG does: its ratio is about 1 where the set holds a tenth of the
nodes; an interleaved timing loop at a quieter moment gave 0.6-0.9 there (0.93-0.98 for an unsorted
set, which the result's sort adds to).
"""

from __future__ import annotations

import torch

import sparsefill

from sparsefill.benchmarks.runner import case, optional_import, skipped

_GRAPHS: dict = {}
SIZES = {
    f"{lay}, {what}": (lay, what, 100_000, 1_000_000, 1024)
    for lay in ("COO", "CSR")
    for what in ("1024 seeds", "1-hop set")
}
QUICK = {
    f"{lay}, {what}": (lay, what, 20_000, 200_000, 256)
    for lay in ("COO", "CSR")
    for what in ("256 seeds", "1-hop set")
}
TINY = {
    f"{lay}, {what}": (lay, what, 300, 3_000, 16)
    for lay in ("COO", "CSR")
    for what in ("16 seeds", "1-hop set")
}


def graph(n: int, e: int, k: int):
    """``(edge_index, weights, seeds, hop)`` of the power-law-ish graph (cached per size)."""
    key = (n, e, k)
    if key not in _GRAPHS:
        g = torch.Generator().manual_seed(0)
        w = torch.arange(1, n + 1, dtype=torch.float64).pow(-0.8)
        src = torch.randperm(n, generator=g)[torch.multinomial(w, e, replacement=True, generator=g)]
        dst = torch.randperm(n, generator=g)[torch.multinomial(w, e, replacement=True, generator=g)]
        keys = torch.unique(src * n + dst)
        ei = torch.stack([keys // n, keys % n])
        vals = torch.randn(keys.numel(), generator=g)
        seeds = torch.randperm(n, generator=g)[:k]
        near = torch.zeros(n, dtype=torch.bool)
        near[seeds] = True
        near[ei[1][near[ei[0]]]] = (
            True  # (the seeds and their out-neighbours: k_hop_subgraph's 1-hop set)
        )
        _GRAPHS.clear()
        _GRAPHS[key] = (ei, vals, seeds, near.nonzero().squeeze(1))
    return _GRAPHS[key]


def _inputs(param):
    lay, what, n, e, k = param
    ei, vals, seeds, hop = graph(n, e, k)
    A = sparsefill.sparse_coo_tensor(ei, vals, (n, n), is_coalesced=True)
    return (
        (A if lay == "COO" else A.to_sparse_csr()),
        ei,
        vals,
        (hop if what == "1-hop set" else seeds),
        n,
    )


def _edges(A):
    """``(row, col, values)`` of a 2-D SparseTensor in row-major order."""
    if A.sparse_layout is torch.sparse_csr:
        crow = A.crow_indices()
        row = torch.repeat_interleave(torch.arange(crow.numel() - 1), crow.diff())
        return row, A.col_indices(), A.values()
    return A.indices()[0], A.indices()[1], A.values()


def _same_edges(S, ei, ev) -> None:
    """``S`` (an induced subgraph as a SparseTensor) holds exactly the edges ``ei`` with weights
    ``ev``."""
    order = torch.argsort(ei[0] * S.shape[1] + ei[1])
    row, col, v = _edges(S)
    if not (
        torch.equal(row, ei[0][order])
        and torch.equal(col, ei[1][order])
        and torch.equal(v, ev[order])
    ):
        raise AssertionError("sparsefill's induced subgraph differs from torch_geometric's")


def _pyg_peer(ei, vals, idx, n):
    pyg = optional_import("torch_geometric.utils")
    if pyg is None:
        return skipped(
            "torch_geometric.utils.subgraph", "not installed (pip install torch_geometric)"
        )
    return (
        "torch_geometric.utils.subgraph",
        lambda: pyg.subgraph(idx, ei, vals, relabel_nodes=True, num_nodes=n),
    )


def _register(name, op):
    def check(param, out):
        """Against the edge-mask formula: the induced subgraph edge for edge, a selection by its
        count and sum."""
        S = next(iter(out.values()))
        _, ei, vals, idx, n = _inputs(param)
        lut = torch.full((n,), -1)
        lut[idx] = torch.arange(idx.numel())
        src, dst = lut[ei[0]], lut[ei[1]]
        if name == "A[idx][:, idx]":
            keep = (src >= 0) & (dst >= 0)
            return _same_edges(S, torch.stack([src[keep], dst[keep]]), vals[keep])
        i = ei[0] if "0" in name or name == "A[idx]" else ei[1]
        # (each edge once per occurrence of its node in idx)
        count = torch.bincount(idx, minlength=n)[i]
        if S._nse() != int(count.sum()) or not torch.allclose(
            S.values().sum(), (vals * count).sum(), atol=1e-2
        ):
            raise AssertionError(f"{name}: {S._nse()} stored, {int(count.sum())} edges selected")

    def bench(param):
        A, ei, vals, idx, n = _inputs(param)
        return [(f"sparsefill {name}", lambda: op(A, idx)), _pyg_peer(ei, vals, idx, n)]

    bench.__doc__ = __doc__
    case(
        f"subgraph selection: {name}", sizes=SIZES, quick_sizes=QUICK, tiny_sizes=TINY, check=check
    )(bench)


_OPS = {
    "A[idx][:, idx]": lambda A, i: A[i][:, i],
    "A[idx]": lambda A, i: A[i],
    "A[:, idx]": lambda A, i: A[:, i],
    "A.index_select(0, idx)": lambda A, i: A.index_select(0, i),
    "A.index_select(1, idx)": lambda A, i: A.index_select(1, i),
}
for _name, _op in _OPS.items():
    _register(_name, _op)


def _k_hop(param):
    """The seeds' 1-hop set read off ``A[seeds]``'s columns, then its induced subgraph."""
    lay, _, n, e, k = param
    ei, vals, seeds, _ = graph(n, e, k)
    A, *_ = _inputs(param)

    def ours():
        near = torch.zeros(n, dtype=torch.bool)
        near[seeds] = True
        near[_edges(A[seeds])[1]] = True
        hop = near.nonzero().squeeze(1)
        return A[hop][:, hop], hop

    pyg = optional_import("torch_geometric.utils")
    if pyg is None:
        return [
            ("sparsefill hop set + A[hop][:, hop]", ours),
            skipped(
                "torch_geometric.utils.k_hop_subgraph",
                "not installed (pip install torch_geometric)",
            ),
        ]
    peer = lambda: pyg.k_hop_subgraph(
        seeds,
        1,
        ei,
        relabel_nodes=True,
        num_nodes=n,  # noqa: E731
        flow="target_to_source",
    )
    return [
        ("sparsefill hop set + A[hop][:, hop]", ours),
        ("torch_geometric.utils.k_hop_subgraph", peer),
    ]


def _check_k_hop(param, out):
    (S, hop), peer = list(out.values())[0], list(out.values())[-1]
    if not isinstance(peer, tuple):
        return
    subset, ei, _, mask = peer
    if not torch.equal(hop, subset):
        raise AssertionError("the 1-hop sets differ")
    _same_edges(S, ei, graph(*param[2:])[1][mask])


def _seeds_only(sizes):
    return {k: v for k, v in sizes.items() if "seeds" in k}


case(
    "subgraph selection: k-hop subgraph (1 hop)",
    sizes=_seeds_only(SIZES),
    quick_sizes=_seeds_only(QUICK),
    tiny_sizes=_seeds_only(TINY),
    check=_check_k_hop,
)(_k_hop)
