"""Rare events on a constant baseline
==================================

Rare events on a constant baseline: the fill-value RFC's signal, trained end to end.

A device samples a signal that sits at 5 except for rare spikes (fill-value-rfc.md, "random sequence of
rare events with nonzero mean"): 10M samples, 0.1% of them events.  As a SparseTensor with fill 5 it
stores 10k values; the code below is the code one writes for a dense tensor, and runs unchanged on both::

    potential = signal * -8                                # to mV (the RFC's mV_unit)
    ratio = exp(-0.1 * potential)                          # a Nernst-like concentration ratio
    window_mean = avg_pool1d(ratio[None], w, stride=1)[0]  # the mean over w samples
    loss = relu(window_mean - threshold).mean()            # how far the windowed mean exceeds a threshold

and ``loss.backward()`` gives the gradients of the stored values and of the fill (the baseline level).
The windowed mean of a signal with fill ``c`` is ``c`` except within ``w`` samples of an event, so every
step, forward and backward, stores O(events * w) elements (``ops/windows/``): ``pipeline``.

``pipeline_cumsum`` writes the same windowed mean as a difference of running sums,
``(cumsum(ratio)[w:] - cumsum(ratio)[:-w]) / w``.  The running sum of a signal with a nonzero fill grows
at every sample: it is dense by nature, and its forward and backward pass over all 10M samples whatever
the representation.  Its floor is a dense ``cumsum`` forward + backward over 10M samples (``cumsum_floor``):
no implementation of that form can be faster than the dense pipeline's time divided by the floor's.
``events_only`` is the pipeline without the window.  Each is checked against dense torch (same loss,
same gradients) and timed against it.

Measured (``python -m sparsefill bench --filter 'rare events' --threads 1``, 10M samples, 0.1% events,
float64, interleaved medians of one run at commit ``eeca1a4`` on a quiet 2-core machine, other processes
at most 0.01 cores busy)::

    pipeline (avg_pool1d), window 100   sparsefill 62 ms    dense 929 ms   15x faster, 194 MB vs 480 MB peak
    pipeline (avg_pool1d), window 10    sparsefill 12.4 ms  dense 640 ms   52x faster, 20 MB vs 480 MB peak
    pipeline_cumsum                     sparsefill 650 ms   dense 791 ms   1.2x; its floor, a dense cumsum forward +
                                        backward over 10M samples, 152 ms: at best 5.2x faster than dense
    events_only                         sparsefill 1.28 ms  dense 384 ms   ~300x faster

The windowed pipeline stores ~1M elements (10% of the samples: 10k events times a window of 100) forward
and ~1.8M (18%) in the gradient.  What bounds it is memory traffic on those elements, not arithmetic: the
window ops run as compiled linear passes over sorted runs (``_kernels/windows.py``: numba, under the
segment backend's policy; torch ops without it), the selections ``[None]``/``[0]`` and their backward
move index rows (views, or one row copied into a zeroed index), and the rest is one pass per element-wise
op over the stored values.  About a quarter of the time is the window's backward (1.8M outputs written),
much of the rest first touches of freshly allocated pages (the results of each step). ::

    python examples/rare_events.py               # 10M samples, 0.1% events, 1 thread
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import sparsefill
from sparsefill.benchmarks.measure import (
    interleaved,
)  # (one round: each warmed up, then the median of reps)

FILL = 5.0


def make_events(samples: int = 10_000_000, rate: float = 0.001, seed: int = 0, dtype=torch.float64):
    """``(positions, values)``: ``round(samples * rate)`` distinct sorted positions, values 6..9."""
    g = torch.Generator().manual_seed(seed)
    k = round(samples * rate)
    positions = torch.randperm(samples, generator=g)[:k].sort().values
    return positions, torch.randint(6, 10, (k,), generator=g).to(dtype)


def sparse_signal(positions, values, fill, samples: int):
    """The signal as a SparseTensor: ``values`` at ``positions``, ``fill`` elsewhere (both differentiable)."""
    return sparsefill.sparse_coo_tensor(positions[None], values, (samples,), fill_value=fill)


def dense_signal(positions, values, fill, samples: int):
    """The same signal as a dense tensor (the peer)."""
    return fill.expand(samples).index_put((positions,), values)


def pipeline(signal: torch.Tensor, window: int = 100, threshold: float = 56.0) -> torch.Tensor:
    """The loss; the same code for a SparseTensor and a dense tensor."""
    potential = signal * -8.0
    ratio = torch.exp(-0.1 * potential)
    window_mean = F.avg_pool1d(ratio[None], window, stride=1)[0]  # (one channel, unbatched)
    return F.relu(window_mean - threshold).mean()


def pipeline_cumsum(
    signal: torch.Tensor, window: int = 100, threshold: float = 56.0
) -> torch.Tensor:
    """The same windowed mean written with running sums: ``cumsum`` of a signal with a nonzero fill is
    dense, so this form costs at least a dense cumsum forward + backward (:func:`cumsum_floor`)."""
    potential = signal * -8.0
    ratio = torch.exp(-0.1 * potential)
    csum = torch.cumsum(ratio, 0)
    window_mean = (csum[window:] - csum[:-window]) / window
    return F.relu(window_mean - threshold).mean()


def events_only(signal: torch.Tensor, threshold: float = 56.0) -> torch.Tensor:
    """The pipeline without the windowed mean: every step keeps the signal's pattern."""
    return F.relu(torch.exp(-0.1 * (signal * -8.0)) - threshold).mean()


def cumsum_floor(samples: int, dtype=torch.float64):
    """A dense ``cumsum`` forward + backward over ``samples`` elements: the least :func:`pipeline_cumsum` does."""
    x = torch.full((samples,), FILL, dtype=dtype, requires_grad=True)
    g = torch.ones(samples, dtype=dtype)
    return lambda: torch.autograd.grad(torch.cumsum(x, 0), x, g)[0]


PIPELINES = (pipeline, pipeline_cumsum, events_only)


def step(make, positions, values, samples: int, loss_fn=pipeline):
    """``(loss, d loss / d values, d loss / d fill)`` of one forward and backward from fresh leaves."""
    v = values.detach().clone().requires_grad_()
    f = torch.tensor(FILL, dtype=values.dtype, requires_grad=True)
    loss = loss_fn(make(positions, v, f, samples))
    loss.backward()
    return loss.detach(), v.grad, f.grad


def check(samples: int = 20_000, rate: float = 0.002, rtol: float = 1e-7, atol: float = 1e-12):
    """Same loss and same gradients (values, fill) as dense torch, for each pipeline; returns the losses."""
    positions, values = make_events(samples, rate)
    losses = []
    for fn in PIPELINES:
        ours = step(sparse_signal, positions, values, samples, fn)
        dense = step(dense_signal, positions, values, samples, fn)
        for a, b, what in zip(ours, dense, ("loss", "values' gradient", "fill's gradient")):
            torch.testing.assert_close(
                a, b, rtol=rtol, atol=atol, msg=lambda m: f"{fn.__name__}, {what}: {m}"
            )
        assert ours[0] > 0 and ours[1].abs().sum() > 0, "a check that cannot fail"
        assert fn is events_only or ours[2] != 0, "the fill's gradient is not exercised"
        losses.append((float(ours[0]), float(dense[0])))
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


def plot_window(ax, positions, values, samples: int, window: int = 100, span: int = 3000):
    """The windowed mean of ``pipeline`` over the first ``span`` samples, from the SparseTensor: the
    fill's level except within a window of an event."""
    fill = torch.tensor(FILL, dtype=values.dtype)
    signal = sparse_signal(positions, values, fill, samples)
    ratio = torch.exp(-0.1 * (signal * -8.0))
    mean = F.avg_pool1d(ratio[None], window, stride=1)[0]
    ax.plot(mean[:span].to_dense(), lw=1)
    ax.set(xlabel="sample", ylabel="windowed mean", title=f"window {window}: {mean._nnz()} stored")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--samples", type=int, default=10_000_000)
    p.add_argument("--rate", type=float, default=0.001)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--plot", action="store_true", help="draw the windowed mean and step times")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    print("losses (sparsefill, dense):", check())
    positions, values = make_events(args.samples, args.rate)
    times = {}
    for fn in PIPELINES:
        t = [
            1e3 * t
            for t in interleaved(
                {
                    make: (lambda make=make: step(make, positions, values, args.samples, fn))
                    for make in (sparse_signal, dense_signal)
                },
                1,
                args.reps,
            ).values()
        ]
        print(
            f"{fn.__name__}, {args.samples} samples, {values.numel()} events, forward + backward: "
            f"sparsefill {t[0]:.1f} ms, dense torch {t[1]:.1f} ms ({t[1] / t[0]:.1f}x faster)"
        )
        times[fn.__name__] = (t[0], t[1])
        if fn is pipeline_cumsum:
            floor = (
                1e3
                * interleaved({"floor": cumsum_floor(args.samples, values.dtype)}, 1, args.reps)[
                    "floor"
                ]
            )
            print(
                f"  floor of the cumsum form: a dense cumsum forward + backward, {floor:.1f} ms "
                f"(at best {t[1] / floor:.1f}x faster than dense)"
            )

    if args.plot:
        import matplotlib.pyplot as plt

        _, (ax0, ax1) = plt.subplots(1, 2, figsize=(9, 3.5), layout="constrained")
        plot_window(ax0, positions, values, args.samples)
        plot_step_times(ax1, times, ("sparsefill", "dense torch"))


if __name__ == "__main__":
    main()
