"""Masked reductions and normalizations (``sparsefill.masked``) against ``torch.masked`` and
``torch.sparse``.

Input (fixed seed): an ``n x n`` float32 matrix with ``round(n * n * density)`` distinct random
positions specified (values ``randn``), fill 0; the mask is its pattern
(``sparsefill.masked.pattern_mask``).  Peers: ``torch.masked.<op>`` on the dense equivalent with a
dense mask (what a user of torch.masked writes), ``torch.sparse.softmax`` on the torch native COO
tensor (its unspecified elements are masked out, the same semantics), and ``torch.masked.sum`` /
``amax`` on the native COO input with a native COO mask (torch 2.13's sparse support for them).
Full size 10000x10000 at 1% (1e6 elements); ``--quick`` 2000x2000 at 1%.

``masked softmax forward + backward, GAT edge scores``: the edge softmax of a graph attention layer:
the scores ``S`` of a random graph (10 edges a node plus self loops, as
``examples/gat.py``) as an N x N SparseTensor with indefinite fill, a leaf requiring grad;
``masked.softmax(S, 1)`` and the gradient of ``S`` for a random upstream gradient of its values,
against ``torch_geometric.utils.softmax`` (scores indexed by target node) forward and backward with
the same values; 5k and 20k nodes.  Measured on 2026-11-24 ~09:00 UTC (``--filter 'GAT edge scores'
--threads 1``, two runs; other processes kept
1.7 of the 2 cores busy, so absolute times are ~3x a quiet machine's and spreads large)::

    COO  5k nodes   3.29 ms  pyg 4.19 ms (0.78)   20k nodes  10.8 ms  pyg 16.7 ms (0.64)  peak 0.46x
    CSR  5k nodes   2.94 ms  pyg 3.66 ms (0.80)   20k nodes  10.6 ms  pyg 16.1 ms (0.66)  peak 0.46x

(a lighter moment, a plain timing loop: 5k 0.85 ms against 1.10 ms, 20k 2.37 ms against 4.2 ms).
With ``S`` built each call from a values leaf (``sparse_coo_tensor(..., check_invariants=False)``
inside the timed call) it stays under the peer (0.86 ms at 5k); with the constructor's default index
validation it does not (~1.4 ms: the validation, not the softmax).

Measured here on 2026-11-21 at 10:42 UTC (``python -m sparsefill bench --filter masked --threads
1``, 5 interleaved rounds; a shared 2-core machine, other processes kept ~1.2-1.3 cores busy, so the
spreads are 2-26%; peak memory from the runner, temporaries of the call; input: COO 20 MB, CSR
12 MB)::

    softmax COO   9.0 ms   torch.sparse.softmax 17.0 ms (1.9x faster), 8.4 MB peak
                           torch.masked dense 684 ms (76x)
    softmax CSR  13.0 ms   torch.sparse.softmax 24.7 ms (1.9x faster), 16.4 MB peak
                           torch.masked dense 675 ms (52x)
    sum COO       2.95 ms  torch.masked on native COO 2.0 s (680x), 0.5 MB peak
                           torch.masked dense 114 ms (39x)
    amax COO      3.57 ms  torch.masked on native COO 1.98 s (555x), 0.5 MB peak
                           torch.masked dense 114 ms (32x)

(The ~1,080 ms ``torch.masked.sum`` peer once quoted is the native-COO call; against the dense call
sum/amax are 32-39x faster, short of 50x: ~1 ms of segment_reduce and ~0.6 ms of run lengths
from the COO row indices.)
"""

from __future__ import annotations

import torch

import sparsefill
from sparsefill import masked

from sparsefill.benchmarks.runner import case

SIZES = {"10000x10000, 1%": (10000, 0.01)}
QUICK = {"2000x2000, 1%": (2000, 0.01)}
TINY = {"200x200, 5%": (200, 0.05)}


def _inputs(param):
    n, density = param
    g = torch.Generator().manual_seed(0)
    nse = round(n * n * density)
    keys = torch.randperm(n * n, generator=g)[:nse].sort().values
    idx = torch.stack([keys // n, keys % n])
    vals = torch.randn(nse, generator=g)
    A = sparsefill.sparse_coo_tensor(idx, vals, (n, n), is_coalesced=True)
    T = torch.sparse_coo_tensor(idx, vals, (n, n), is_coalesced=True, check_invariants=False)
    return A, T


def _check(param, out):
    """Every implementation agrees with the first at the masked-in (specified) elements."""
    ref = out[next(iter(out))]
    ref_d = ref.to_dense() if isinstance(ref, sparsefill.SparseTensor) else ref
    pattern = None
    for label, o in out.items():
        d = (
            o.to_dense()
            if (isinstance(o, sparsefill.SparseTensor) or o.layout is not torch.strided)
            else o
        )
        if d.shape != ref_d.shape:
            raise AssertionError(f"{label}: shape {tuple(d.shape)} != {tuple(ref_d.shape)}")
        if ref_d.dim() == 2:  # normalizations: compare at the pattern only
            if pattern is None:
                pattern = (
                    masked.pattern_mask(ref).to_dense()
                    if isinstance(ref, sparsefill.SparseTensor)
                    else None
                )
            sel = pattern if pattern is not None else torch.ones_like(ref_d, dtype=torch.bool)
            torch.testing.assert_close(d[sel], ref_d[sel], atol=1e-5, rtol=1e-4, msg=label)
        else:
            torch.testing.assert_close(d, ref_d, atol=1e-4, rtol=1e-4, equal_nan=True, msg=label)


def _softmax_case(layout):
    def fn(param):
        A, T = _inputs(param)
        S = A if layout is torch.sparse_coo else A.to_sparse_csr()
        Ms = masked.pattern_mask(S)
        D, Md = A.to_dense(), masked.pattern_mask(A).to_dense()
        return [
            (
                f"sparsefill {'COO' if layout is torch.sparse_coo else 'CSR'}",
                lambda: masked.softmax(S, 1, mask=Ms),
            ),
            ("torch.sparse.softmax (COO)", lambda: torch.sparse.softmax(T, 1)),
            ("torch.masked.softmax (dense)", lambda: torch.masked.softmax(D, 1, mask=Md)),
        ]

    return fn


case(
    "masked softmax dim 1, COO, pattern mask",
    sizes=SIZES,
    quick_sizes=QUICK,
    tiny_sizes=TINY,
    check=_check,
)(_softmax_case(torch.sparse_coo))
case(
    "masked softmax dim 1, CSR, pattern mask",
    sizes=SIZES,
    quick_sizes=QUICK,
    tiny_sizes=TINY,
    check=_check,
)(_softmax_case(torch.sparse_csr))


def _reduce_case(name):
    def fn(param):
        A, T = _inputs(param)
        Ms, Mt = masked.pattern_mask(A), masked.pattern_mask(T)
        D, Md = A.to_dense(), Mt.to_dense()
        op, ref = getattr(masked, name), getattr(torch.masked, name)
        return [
            ("sparsefill COO", lambda: op(A, 1, mask=Ms)),
            (f"torch.masked.{name} (native COO)", lambda: ref(T, 1, mask=Mt)),
            (f"torch.masked.{name} (dense)", lambda: ref(D, 1, mask=Md)),
        ]

    return fn


case(
    "masked sum dim 1, COO, pattern mask",
    sizes=SIZES,
    quick_sizes=QUICK,
    tiny_sizes=TINY,
    check=_check,
)(_reduce_case("sum"))
case(
    "masked amax dim 1, COO, pattern mask",
    sizes=SIZES,
    quick_sizes=QUICK,
    tiny_sizes=TINY,
    check=_check,
)(_reduce_case("amax"))


# ---------------------------------------------------------------------- the edge softmax of a GAT,
# with backward
_EDGE_SIZES = {"5k nodes, 55k edges": 5_000, "20k nodes, 220k edges": 20_000}


def _edge_scores(nodes: int, edges_per_node: int = 10):
    """``(target, source)`` of a random graph as ``examples/gat.py`` builds it (self loops, no
    duplicates, sorted by target), its edge scores (randn) and an upstream gradient (randn)."""
    g = torch.Generator().manual_seed(0)
    src = torch.randint(0, nodes, (nodes * edges_per_node,), generator=g)
    dst = torch.randint(0, nodes, (nodes * edges_per_node,), generator=g)
    loops = torch.arange(nodes)
    keys = torch.unique(torch.cat([dst, loops]) * nodes + torch.cat([src, loops]))
    return (
        keys // nodes,
        keys % nodes,
        torch.randn(keys.numel(), generator=g),
        torch.randn(keys.numel(), generator=g),
    )


def _edge_softmax_case(layout):
    name = "COO" if layout is torch.sparse_coo else "CSR"

    def fn(nodes):
        from sparsefill.benchmarks.runner import optional_import, skipped

        dst, src, scores, up = _edge_scores(nodes)
        S = sparsefill.sparse_coo_tensor(
            torch.stack([dst, src]),
            scores,
            (nodes, nodes),
            fill_value=sparsefill.indefinite,
            is_coalesced=True,
        )
        S = (S if layout is torch.sparse_coo else S.to_sparse_csr()).requires_grad_()
        v = scores.clone().requires_grad_()

        def ours():
            P = masked.softmax(S, 1)
            (g,) = torch.autograd.grad(P._values(), S, up)
            return P._values().detach(), g._values()

        pyg = optional_import("torch_geometric.utils")
        if pyg is None:
            return [
                (f"sparsefill {name}", ours),
                skipped(
                    "torch_geometric.utils.softmax", "not installed (pip install torch_geometric)"
                ),
            ]

        def peer():
            out = pyg.softmax(v, dst, num_nodes=nodes)
            (g,) = torch.autograd.grad(out, v, up)
            return out.detach(), g

        return [(f"sparsefill {name}", ours), ("torch_geometric.utils.softmax", peer)]

    return fn


def _check_edge_softmax(param, out):
    (ref_y, ref_g), *rest = out.values()
    for label, (y, g) in list(out.items())[1:]:
        torch.testing.assert_close(
            y, ref_y, atol=1e-6, rtol=1e-5, msg=lambda m: f"{label}, softmax: {m}"
        )
        torch.testing.assert_close(
            g, ref_g, atol=1e-6, rtol=1e-5, msg=lambda m: f"{label}, gradient: {m}"
        )


for _layout in (torch.sparse_coo, torch.sparse_csr):
    case(
        f"masked softmax forward + backward, GAT edge scores (indefinite fill), "
        f"{'COO' if _layout is torch.sparse_coo else 'CSR'}",
        sizes=_EDGE_SIZES,
        quick_sizes={"2k nodes, 22k edges": 2_000},
        tiny_sizes={"100 nodes": 100},
        check=_check_edge_softmax,
    )(_edge_softmax_case(_layout))
