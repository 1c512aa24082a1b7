"""Real models, trained: the scripts of the repository's ``examples/`` against
their peers.

- ``model: GAT training step``: ``examples/gat.py``, a two-layer graph attention network on a
  SparseTensor adjacency with an indefinite fill (COO, and CSR as a second case), one Adam step
  (forward, backward, step) against torch_geometric's ``GATConv`` with the same weights; 10 edges a
  node plus self loops, D=32, 8 classes.  Measured on 2026-11-24 ~09:00-09:10 UTC (``--filter
  'model: GAT' --threads 1``, two runs, other processes keeping 1.7 of the 2 cores busy: absolute
  times ~3x a quiet machine's), time ratio to GATConv and peak memory ratio: COO 5k 0.53-0.58x, 20k
  0.45-0.47x; CSR 5k 0.72-0.80x, 20k 0.49-0.54x; peak memory 0.18x (5.3 MB against 30 MB) and 0.17x
  (20.6 MB against 120 MB).
- ``model: DLRM training step``: ``examples/dlrm.py``, keyed jagged features pooled with
  ``sparsefill.segment`` and ``SparseAdagrad`` against ``nn.EmbeddingBag(sparse=True)`` +
  ``torch.optim.Adagrad``; batch 2048, 8 tables of 50k x 64, lists of 0-40 ids.  Measured on
  2026-11-24 08:50-09:25 UTC (``--filter DLRM --threads 1``, four runs, other processes keeping
  1.6-1.7 of the 2 cores busy): 0.42-0.46x the peer's time with numba installed (``SparseAdagrad``'s
  fused kernel; the peer's sparse Adagrad coalesces by a sort and updates in ~8 passes), 0.87x on
  the torch-only segment backend (``SPARSEFILL_SEGMENT_BACKEND=torch``); peak memory 106 MB against
  113 MB.  Before (one boolean mask per key, a sort in every coalescing, the sums' backward
  gathering the table rows for nothing): 1.2-2.2x.
- ``model: rare events ...``: ``examples/rare_events.py``, the membrane potential signal (fill 5,
  0.1% events, float64): ``* -8``, ``exp``, a windowed mean (``avg_pool1d``), ``relu`` threshold,
  ``.mean()`` loss, backward to the values and the fill, against the same code on a dense tensor;
  the same with the windowed mean written with ``cumsum`` (dense by nature: its floor, a bare dense
  cumsum forward + backward, is the third column); and the same without the windowed mean (every
  step keeps the pattern). Measured on 2026-11-24 ~13:37 UTC (``--filter 'rare events' --threads
  1``, commit ``fe5e3de``, other processes keeping 1.5-1.7 of the 2 cores busy), 10M samples: window
  100 16x faster than dense (204 ms against 3.27 s), window 10 55x (29.8 ms against 1.65 s); 5.2x at
  window 100 on the torch-only window path (``SPARSEFILL_SEGMENT_BACKEND=torch``, CPU time, ~13:41).
  Before (the previous quiet run, commit ``c70847c``): 4.6x and 24x.

The model code exists once, in the scripts: this module loads them from the ``examples/`` folder of
the source checkout the package is installed from (editable install).  From a wheel there is no such
folder, and these cases are not registered (``--list`` does not show them).

A training step changes the model, so a call's output is ``(steps taken before it, loss)``: the
check compares the two losses when both models took the same number of steps (always so at the first
thread count: the warm-up call is the first call) and otherwise only that both are finite.
"""

from __future__ import annotations

import functools

import importlib.util
import math
import sys
from pathlib import Path

import torch

from sparsefill.benchmarks.runner import case, optional_import, skipped

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _example(name: str, folder: Path = EXAMPLES):
    """``<folder>/<name>.py`` (the checkout's ``examples/``) as a module, imported once under one
    name for the bench cases and the tests; a script that is absent or fails to import leaves
    nothing behind."""
    key = f"sparsefill_examples_{name}"
    if key not in sys.modules:
        path = Path(folder) / f"{name}.py"
        if not path.is_file():
            raise FileNotFoundError(
                f"{path}: the example scripts are in the repository's examples/ folder, not in "
                "the installed package (run from a checkout)"
            )
        spec = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[key]
            raise
    return sys.modules[key]


def _counted(step):
    """``step`` returning ``(steps taken before this one, loss)``."""
    count = [0]

    def call():
        n, count[0] = count[0], count[0] + 1
        return n, step()

    return call


def _check_losses(param, out):
    (n0, ref), *rest = out.values()
    for label, (n, loss) in list(out.items())[1:]:
        if n == n0:
            torch.testing.assert_close(
                loss, ref, rtol=1e-4, atol=1e-5, msg=lambda m: f"{label}: {m}"
            )
        elif not (math.isfinite(loss) and math.isfinite(ref)):
            raise AssertionError(f"{label}: loss {loss}, sparsefill {ref}")


def _check_grads(param, out):
    ref = out["sparsefill"]
    for label, o in out.items():
        for a, b, what in zip(o, ref, ("loss", "values' gradient", "fill's gradient")):
            torch.testing.assert_close(
                a, b, rtol=1e-7, atol=1e-12, msg=lambda m: f"{label}, {what}: {m}"
            )


if (EXAMPLES / "gat.py").is_file():
    _GAT_SIZES = {"5k nodes, 55k edges": 5_000, "20k nodes, 220k edges": 20_000}

    def _gat(nodes, layout):
        gat = _example("gat")
        pyg = optional_import("torch_geometric")
        x, A, edge_index, y, model, peer = gat.setup(
            nodes, layout=layout, with_peer=pyg is not None
        )
        return [
            ("sparsefill", _counted(gat.trainer(model, (x, A), y))),
            ("torch_geometric GATConv", _counted(gat.trainer(peer, (x, edge_index), y)))
            if pyg
            else skipped("torch_geometric GATConv", "not installed (pip install torch_geometric)"),
        ]

    @case(
        "model: GAT training step, COO adjacency",
        sizes=_GAT_SIZES,
        quick_sizes={"2k nodes, 22k edges": 2_000},
        tiny_sizes={"100 nodes": 100},
        check=_check_losses,
    )
    def gat_coo(nodes):
        return _gat(nodes, torch.sparse_coo)

    @case(
        "model: GAT training step, CSR adjacency",
        sizes=_GAT_SIZES,
        quick_sizes={"2k nodes, 22k edges": 2_000},
        tiny_sizes={"100 nodes": 100},
        check=_check_losses,
    )
    def gat_csr(nodes):
        return _gat(nodes, torch.sparse_csr)


if (EXAMPLES / "dlrm.py").is_file():

    @case(
        "model: DLRM training step",
        sizes={"batch 2048, 8 tables 50k x 64": (2048, 8, 50_000, 64)},
        quick_sizes={"batch 512, 8 tables 10k x 64": (512, 8, 10_000, 64)},
        tiny_sizes={"batch 32, 4 tables 200 x 8": (32, 4, 200, 8)},
        check=_check_losses,
    )
    def dlrm(param):
        ex = _example("dlrm")
        (m, x, y), (p, xp, yp) = ex.setup(*param)
        return [
            ("sparsefill", _counted(ex.trainer(m, x, y))),
            ("nn.EmbeddingBag(sparse=True) + Adagrad", _counted(ex.trainer(p, xp, yp))),
        ]


if (EXAMPLES / "rare_events.py").is_file():

    def _check_rare(param, out):
        """The pipelines' outputs as in :func:`_check_grads`; the floor's (a bare dense cumsum) is
        no pipeline."""
        _check_grads(param, {k: v for k, v in out.items() if not k.startswith("floor")})

    _RARE = dict(
        sizes={"10M, 0.1%": (10_000_000, 0.001)},
        quick_sizes={"1M, 0.1%": (1_000_000, 0.001)},
        tiny_sizes={"20k, 0.2%": (20_000, 0.002)},
        check=_check_rare,
    )

    def _rare(param, fn_name):
        ex = _example("rare_events")
        samples, rate = param
        positions, values = ex.make_events(samples, rate)
        fn = getattr(ex, fn_name) if isinstance(fn_name, str) else fn_name
        return [
            (label, lambda make=make: ex.step(make, positions, values, samples, fn))
            for label, make in (("sparsefill", ex.sparse_signal), ("dense torch", ex.dense_signal))
        ]

    @case(
        "model: rare events, exp, windowed mean (avg_pool1d), threshold, mean loss, forward + "
        "backward",
        sizes={
            "10M, 0.1%, window 100": (10_000_000, 0.001, 100),
            "10M, 0.1%, window 10": (10_000_000, 0.001, 10),
        },
        quick_sizes={"1M, 0.1%, window 100": (1_000_000, 0.001, 100)},
        tiny_sizes={"20k, 0.2%, window 100": (20_000, 0.002, 100)},
        check=_check_rare,
    )
    def rare_events(param):
        """``examples/rare_events.py``'s ``pipeline``: every step stores O(events * window)
        elements, so the window sets the density of the windowed signal (0.1% events: ~10% at window
        100, ~1% at window 10)."""
        samples, rate, window = param
        ex = _example("rare_events")
        return _rare((samples, rate), functools.partial(ex.pipeline, window=window))

    @case(
        "model: rare events, exp, cumsum windowed mean, threshold, mean loss, forward + backward",
        **_RARE,
    )
    def rare_events_cumsum(param):
        """``pipeline_cumsum``: the windowed mean as a difference of running sums, dense by nature;
        the third column is its floor, a bare dense cumsum forward + backward over the samples."""
        ex = _example("rare_events")
        return _rare(param, "pipeline_cumsum") + [
            ("floor: dense cumsum forward + backward", ex.cumsum_floor(param[0]))
        ]

    @case("model: rare events, exp, threshold, mean loss (no window), forward + backward", **_RARE)
    def rare_events_no_window(param):
        return _rare(param, "events_only")
