"""torch.compile measurements: not a harness case (compiling takes seconds per case, and
the test suite runs the harness cases); run ``python -m sparsefill.benchmarks.cases_compile
[--quick]``.

1. **Elementwise chain** ``torch.exp(A * -8) + 1`` on a 1-D SparseTensor of ``n`` elements, 1%
   stored (at least one), fill 0.5, float32, at ``n`` = 10, 1k, 100k, 10M: compiled sparsefill
   (inductor, ``fullgraph=True``) against eager sparsefill, compiled dense torch on ``A.to_dense()``
   and compiled torch on the stored values alone (``A.values()``: the floor of any sparse format)
   and on the values (a dynamic size, as the nse) and the fill as two plain tensors (``compiled
   parts``: sparsefill's compiled graph without the subclass, so ``compiled sparsefill - compiled
   parts`` is the wrapper's per-call cost: dynamo's guards on the inner tensors, AOTAutograd's
   unwrapping and rewrapping) and compiled on a ``minimal subclass`` (:class:`Minimal`: the fewest
   lines a traceable wrapper subclass of the same three inner tensors needs, nse dynamic as
   sparsefill's: the floor of torch's subclass machinery for this case).
2. **GAT training step** (``examples/gat.py``, 5k nodes, COO): forward + loss compiled
   (``fullgraph=True``), backward through the compiled graph, eager Adam step; against the eager
   step.
3. **GAT training step at scale** (``examples/gat.py``, 100k nodes, 1.1M edges, COO; one head on
   a 2-D adjacency and 4 heads on a hybrid ``(N, N, 4)`` one): sparsefill's loss compiled with
   ``fullgraph=True`` (dynamo's graphs, graph breaks and recompiles over the timed steps
   reported), eager, and torch_geometric's ``GATConv`` model of the same weights eager and
   compiled; one Adam step each, the median of 3 rounds of 3 steps per side (a side's first step
   in a round, after the other sides', runs on memory they left: the median of 3 leaves it out),
   peak memory beside time (one more step, measured alone), and the CPU time of the same steps
   (on a loaded machine the wall time is mostly waiting for a core).  ``--scale-edges-per-node
   19``: 2M edges at 100k nodes; ``--scale-hidden 64``: 64 channels per head; ``--only-scale``:
   this case alone.
4. **DLRM training step** (``examples/dlrm.py``, small tables): the model compiled with
   ``fullgraph=True`` (the pooling of every key by ``KeyedJaggedBatch.pooled``: one
   ``sparsefill::jagged_pooled`` custom op forward and one ``jagged_pooled_backward``, each key's
   count of ids a dynamic size; dynamo's count of graph breaks reported), backward through the
   compiled graph (sparse table gradients), eager ``SparseAdagrad`` and ``Adagrad`` steps; against
   the eager step and the ``nn.EmbeddingBag(sparse=True)`` + ``torch.optim.Adagrad`` model of the
   example.  What separates compiled from eager here is per-call overhead, not kernels (the same
   ``embedding_bag`` and gathers run in both): torch's compiled-function wrapper (guards,
   AOTAutograd's runtime; about 0.3 ms forward on this model, as for the compiled ``EmbeddingBag``
   peer) and ~40 us per custom op call (the reason the keys are pooled by one op).

Interleaved: every round times each implementation in turn (median of ``reps`` calls), the figure is
the median of the rounds; one thread.  The CPU kept busy by other processes during the run is
printed (the noise).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import sparsefill

from sparsefill.benchmarks.measure import cpu_snapshot, loadavg, other_cpu
from sparsefill.benchmarks.measure import interleaved as measure_interleaved

SIZES = (10, 1_000, 100_000, 10_000_000)


def interleaved(fns: dict, rounds: int, reps: int) -> dict:
    """``{name: ms}``: :func:`measure.interleaved` (each fn called once first: compiled)."""
    return {name: 1e3 * t for name, t in measure_interleaved(fns, rounds, reps).items()}


def chain(A):
    return torch.exp(A * -8) + 1


class Minimal(torch.Tensor):
    """The floor of torch's wrapper-subclass machinery for :func:`chain`: a traceable wrapper of the
    inner tensors a 1-D COO SparseTensor has (``_idx`` (1, nse) passed through, ``_vals`` (nse,),
    0-d ``_fill``; the nse a dynamic size, marked as sparsefill marks it) whose ops apply to the
    values and the fill, with nothing else: no metadata, no checks, no fast paths.  Compiled, it
    costs what any such subclass costs per call (dynamo's guards on three inner tensors,
    AOTAutograd's unwrapping and rewrapping)."""

    @staticmethod
    def __new__(cls, size, idx, vals, fill):
        r = torch.Tensor._make_wrapper_subclass(cls, size, dtype=vals.dtype, device=vals.device)
        r._idx, r._vals, r._fill = idx, vals, fill
        return r

    def __init__(self, *args):
        super().__init__()

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __tensor_flatten__(self):
        return ["_idx", "_vals", "_fill"], None

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return Minimal(outer_size, inner["_idx"], inner["_vals"], inner["_fill"])

    def _stable_hash_for_caching(self):
        return repr((tuple(self.shape), self.dtype, tuple(self._vals.shape[1:])))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        A = next(a for a in args if isinstance(a, Minimal))
        part = lambda name: func(
            *[getattr(a, name) if isinstance(a, Minimal) else a for a in args],  # noqa: E731
            **(kwargs or {}),
        )
        return Minimal(A.shape, A._idx, part("_vals"), part("_fill"))

    @staticmethod
    def of(A) -> Minimal:
        """The Minimal of a 1-D COO SparseTensor's inner tensors (copies), its nse dynamic."""
        idx, vals = A._idx.clone(), A._vals.detach().clone()
        idx._dynamo_propagated_dynamic_indices, vals._dynamo_propagated_dynamic_indices = {1}, {0}
        return Minimal(A.shape, idx, vals, A._fill.clone())


def elementwise(n: int, backend: str, rounds: int, reps: int) -> dict:
    g = torch.Generator().manual_seed(n)
    nse = max(1, n // 100)
    idx = torch.randperm(n, generator=g)[:nse].sort().values[None]
    A = sparsefill.sparse_coo_tensor(
        idx, torch.randn(nse, generator=g), (n,), fill_value=0.5, is_coalesced=True
    )
    D, V = A.to_dense(), A.values()
    V2, fill = V.clone(), A._fill_value()
    torch._dynamo.mark_dynamic(V2, 0)  # (as a SparseTensor's nse)
    torch._dynamo.reset()
    comp = torch.compile(chain, backend=backend, fullgraph=True, dynamic=False)
    comp_dense = torch.compile(chain, backend=backend, fullgraph=True, dynamic=False)
    comp_vals = torch.compile(chain, backend=backend, fullgraph=True, dynamic=False)
    comp_parts = torch.compile(
        lambda v, f: (chain(v), chain(f)), backend=backend, fullgraph=True, dynamic=False
    )
    M, comp_min = (
        Minimal.of(A),
        torch.compile(chain, backend=backend, fullgraph=True, dynamic=False),
    )
    torch.testing.assert_close(comp(A).to_dense(), chain(D))
    out, floor = comp(A), comp_min(M)
    torch.testing.assert_close((floor._vals, floor._fill), (out._vals, out._fill))
    return interleaved(
        {
            "compiled sparsefill": lambda: comp(A),
            "eager sparsefill": lambda: chain(A),
            "compiled dense": lambda: comp_dense(D),
            "compiled values": lambda: comp_vals(V),
            "compiled parts": lambda: comp_parts(V2, fill),
            "compiled minimal subclass": lambda: comp_min(M),
        },
        rounds,
        reps,
    )


def gat_step(nodes: int, backend: str, rounds: int, reps: int) -> dict:
    from sparsefill.benchmarks.cases_models import _example

    gat = _example("gat")
    x, A, _, y, model, _ = gat.setup(nodes, with_peer=False)
    opt = torch.optim.Adam(model.parameters(), lr=0.005)
    loss_fn = lambda: F.cross_entropy(model(x, A), y)  # noqa: E731
    torch._dynamo.reset()
    compiled = torch.compile(loss_fn, backend=backend, fullgraph=True)

    def step(fn):
        opt.zero_grad()
        loss = fn()
        loss.backward()
        opt.step()
        return loss

    torch.testing.assert_close(compiled(), loss_fn())
    return interleaved(
        {"compiled": lambda: step(compiled), "eager": lambda: step(loss_fn)}, rounds, reps
    )


def _compile_counts() -> dict:
    """Dynamo's counts since the last ``counters.clear()``: graphs, graph breaks, recompiles."""
    from torch._dynamo.utils import counters

    return {
        "graphs": counters["stats"]["unique_graphs"],
        "breaks": sum(counters["graph_break"].values()),
        "recompiles": sum(counters["recompiles"].values()),
    }


def gat_at_scale(
    nodes: int,
    heads: int,
    backend: str,
    rounds: int,
    reps: int,
    edges_per_node: int = 10,
    hidden: int | None = None,
) -> dict:
    """The two-layer GAT of ``examples/gat.py`` (``heads`` heads: a hybrid ``(N, N, heads)``
    adjacency when ``heads > 1``; about ``nodes * (edges_per_node + 1)`` edges; ``hidden``
    channels per head, default the example's) and torch_geometric's ``GATConv`` model with the same
    weights, one Adam step each: eager, and with the loss compiled (``fullgraph=True`` for
    sparsefill; the peer as torch.compile takes it), backward through the compiled graph.  ``{side:
    (ms, peak MB)}`` plus ``"counts"``: dynamo's graphs, breaks and recompiles of sparsefill's
    compiled loss over the warm-up and every timed step (the same graph each step: 1 graph, 0
    breaks, 0 recompiles), ``"edges"`` and ``"hidden"`` (channels per head)."""
    from torch._dynamo.utils import counters

    from sparsefill.benchmarks.cases_models import _example
    from sparsefill.benchmarks.measure import measure_memory

    gat = _example("gat")
    x, A, edge_index, y, model, peer = gat.setup(
        nodes, heads=heads, edges_per_node=edges_per_node, hidden=hidden
    )
    sides, counts = {}, {}
    torch._dynamo.reset()
    for name, m, graph, fullgraph in (
        ("PyG", peer, edge_index, False),
        ("sparsefill", model, A, True),
    ):
        counters.clear()
        loss = lambda m=m, g=graph: F.cross_entropy(m(x, g), y)  # noqa: E731
        compiled = torch.compile(loss, backend=backend, fullgraph=fullgraph)
        torch.testing.assert_close(compiled(), loss(), rtol=1e-4, atol=1e-5)
        opt = torch.optim.Adam(m.parameters(), lr=0.005)

        def step(fn, opt=opt):
            opt.zero_grad()
            out = fn()
            out.backward()
            opt.step()
            return out.detach()

        suffix = " PyG" if name == "PyG" else ""
        sides[f"compiled{suffix}"] = lambda fn=compiled, s=step: s(fn)
        sides[f"eager{suffix}"] = lambda fn=loss, s=step: s(fn)
        sides[f"compiled{suffix}"]()  # (its backward graph compiles: not a recompile)
        counts[name] = _compile_counts()
    counters.clear()
    times, cpu = _interleaved_wall_cpu(sides, rounds, reps)
    out = {k: (t, measure_memory(sides[k])["peak_bytes"] / 2**20, cpu[k]) for k, t in times.items()}
    out["counts"] = dict(counts["sparsefill"], recompiles=_compile_counts()["recompiles"])
    out["edges"] = edge_index.shape[1]
    out["hidden"] = model.layer1.d_out
    return out


def _interleaved_wall_cpu(fns: dict, rounds: int, reps: int) -> tuple[dict, dict]:
    """``({name: ms}, {name: CPU ms})``: :func:`interleaved`'s medians of the wall time and, of the
    same calls, of this thread's CPU time (one thread: torch's kernels, inductor's and the compiled
    kernels all run on it).  On a machine other processes keep busy the CPU time leaves out the
    waits for a core, which the wall time of a step there is mostly made of."""
    import statistics
    import time

    for fn in fns.values():
        fn()
    wall, cpu = ({name: [] for name in fns} for _ in range(2))
    for _ in range(rounds):
        for name, fn in fns.items():
            ws, cs = [], []
            for _ in range(reps):
                t, c = time.perf_counter(), time.thread_time()
                fn()
                ws.append(time.perf_counter() - t)
                cs.append(time.thread_time() - c)
            wall[name].append(statistics.median(ws))
            cpu[name].append(statistics.median(cs))
    med = lambda d: {k: 1e3 * statistics.median(v) for k, v in d.items()}  # noqa: E731
    return med(wall), med(cpu)


_SCALE_SIDES = ("compiled", "eager", "compiled PyG", "eager PyG")


def _print_gat_at_scale(nodes: int, heads: int, t: dict) -> None:
    c, e, cp, ep = (t[k][0] for k in _SCALE_SIDES)
    cc, ce, ccp, cep = (t[k][2] for k in _SCALE_SIDES)
    print(
        f"GAT training step at scale, {nodes} nodes, {t['edges']} edges, {heads} head(s) of "
        f"{t['hidden']} channels: "
        + ", ".join(f"{k} {t[k][0]:.0f} ms {t[k][1]:.0f} MB" for k in _SCALE_SIDES)
        + f"; compiled / eager {c / e:.2f}x, compiled / compiled PyG {c / cp:.2f}x, eager / eager"
        f" PyG {e / ep:.2f}x, PyG compiled / PyG eager {cp / ep:.2f}x; sparsefill compiled "
        f"(fullgraph): {t['counts']['graphs']} graph(s), {t['counts']['breaks']} breaks; "
        f"{t['counts']['recompiles']} recompiles (either side) over the timed steps; CPU time "
        + ", ".join(f"{k} {t[k][2]:.0f} ms" for k in _SCALE_SIDES)
        + f": compiled / eager {cc / ce:.2f}x, compiled / compiled PyG {cc / ccp:.2f}x, eager / "
        f"eager PyG {ce / cep:.2f}x"
    )


def dlrm_step(batch: int, rows: int, backend: str, rounds: int, reps: int) -> tuple[dict, str]:
    """The timings (compiled, eager, the EmbeddingBag + Adagrad peer) and how dynamo compiled the
    forward (graphs, breaks and the first break's reason)."""
    from sparsefill.benchmarks.cases_models import _example

    dlrm = _example("dlrm")
    (model, inputs, labels), (peer, peer_inputs, _) = dlrm.setup(
        batch=batch, keys=4, rows=rows, dim=32
    )
    opts, peer_opts = model.optimizers(), peer.optimizers()
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    torch.testing.assert_close(compiled(*inputs), model(*inputs))
    torch.testing.assert_close(compiled(*inputs), peer(*peer_inputs))
    breaks = counters["graph_break"]
    why = next(iter(breaks)).splitlines()[0] if breaks else "none"
    how = (
        f"{counters['stats']['unique_graphs']} graph(s), {sum(breaks.values())} graph breaks, "
        f"first: {why}"
    )

    def step(m, x, optimizers):
        for o in optimizers:
            o.zero_grad()
        loss = F.binary_cross_entropy_with_logits(m(*x), labels)
        loss.backward()
        for o in optimizers:
            o.step()
        return loss

    return interleaved(
        {
            "compiled": lambda: step(compiled, inputs, opts),
            "eager": lambda: step(model, inputs, opts),
            "EmbeddingBag + Adagrad": lambda: step(peer, peer_inputs, peer_opts),
        },
        rounds,
        reps,
    ), how


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--dlrm-batch", type=int, default=512)
    p.add_argument("--dlrm-rows", type=int, default=10_000)
    p.add_argument("--backend", default="inductor")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument(
        "--scale-nodes",
        type=int,
        nargs="*",
        default=[100_000],
        help="nodes of the GAT at scale (about 11 edges per node: 100k nodes, 1.1M edges)",
    )
    p.add_argument(
        "--scale-edges-per-node",
        type=int,
        nargs="*",
        default=[10],
        help="random edges per node of the GAT at scale, plus a self loop (19: 100k nodes, 2M "
        "edges)",
    )
    p.add_argument(
        "--scale-hidden",
        type=int,
        default=None,
        help="channels per head of the GAT at scale (default the example's, 32)",
    )
    p.add_argument(
        "--only-scale", action="store_true", help="only the GAT at scale (no other measurement)"
    )
    p.add_argument("--scale-heads", type=int, nargs="*", default=[1, 4])
    p.add_argument("--scale-rounds", type=int, default=3, help="rounds at scale")
    p.add_argument(
        "--scale-reps",
        type=int,
        default=3,
        help="steps of each side per round at scale (the median: not the first step after the "
        "other sides', whose memory they took)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="10 and 1k elements, 500 nodes, 3 rounds of 3; the GAT at scale at 2000 nodes",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.nodes, args.dlrm_batch, args.rounds, args.reps = [10, 1000], 500, 64, 3, 3
        args.scale_nodes, args.scale_rounds, args.scale_reps = [2000], 3, 3
    torch.set_num_threads(1)
    import logging

    # (the DLRM's graph-break warnings: counted)
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    out = {}
    a = cpu_snapshot()
    print(
        f"backend {args.backend}, 1 thread, median of {args.rounds} interleaved rounds of "
        f"{args.reps} calls; load average {loadavg()}"
    )
    if not args.only_scale:
        _small_cases(args, out)
    for n in args.scale_nodes:
        for h in args.scale_heads:
            for k in args.scale_edges_per_node:
                t = out[("gat at scale", n, h, k)] = gat_at_scale(
                    n, h, args.backend, args.scale_rounds, args.scale_reps, k, args.scale_hidden
                )
                _print_gat_at_scale(n, h, t)
    if not args.only_scale:
        _dlrm_case(args, out)
    o = other_cpu(a, cpu_snapshot())
    print(
        f"other processes kept {o:.2f} cores busy during the run; load average {loadavg()}"
        if o is not None
        else ""
    )
    return out


def _small_cases(args, out: dict) -> None:
    """The elementwise chain and the GAT step at ``args.nodes``, printed."""
    for n in args.sizes:
        t = out[("exp", n)] = elementwise(n, args.backend, args.rounds, args.reps)
        c = t["compiled sparsefill"]
        print(
            f"torch.exp(A * -8) + 1, {n} elements (1% stored): "
            + ", ".join(f"{k} {v:.4f} ms" for k, v in t.items())
            + f"; compiled sparsefill / eager {c / t['eager sparsefill']:.2f}x, / compiled dense "
            f"{c / t['compiled dense']:.2f}x, / compiled values "
            f"{c / t['compiled values']:.2f}x; the wrapper's per-call cost "
            f"{1e3 * (c - t['compiled parts']):.1f} us; the floor of a subclass: compiled "
            "minimal subclass / compiled values "
            f"{t['compiled minimal subclass'] / t['compiled values']:.2f}x, compiled "
            "sparsefill - compiled minimal subclass "
            f"{1e3 * (c - t['compiled minimal subclass']):.1f} us"
        )
    t = out["gat"] = gat_step(args.nodes, args.backend, args.rounds, args.reps)
    print(
        f"GAT training step, {args.nodes} nodes: compiled {t['compiled']:.1f} ms, eager "
        f"{t['eager']:.1f} ms ({t['compiled'] / t['eager']:.2f}x)"
    )


def _dlrm_case(args, out: dict) -> None:
    """The DLRM training step, printed."""
    t, how = out["dlrm"] = dlrm_step(
        args.dlrm_batch, args.dlrm_rows, args.backend, args.rounds, args.reps
    )
    peer = t["EmbeddingBag + Adagrad"]
    print(
        f"DLRM training step, batch {args.dlrm_batch}, 4 tables of {args.dlrm_rows} x 32: "
        f"compiled (fullgraph: {how}) {t['compiled']:.2f} ms, eager {t['eager']:.2f} ms, "
        f"EmbeddingBag + Adagrad {peer:.2f} ms; compiled / eager "
        f"{t['compiled'] / t['eager']:.2f}x, compiled / EmbeddingBag + Adagrad "
        f"{t['compiled'] / peer:.2f}x, eager / EmbeddingBag + Adagrad {t['eager'] / peer:.2f}x"
    )


if __name__ == "__main__":
    main()
