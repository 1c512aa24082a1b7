"""KeyedJaggedBatch: construction (validated / ``validate=False``) and ``to_dict`` against the offsets.

One process, 1 thread, median of ``--repeat`` timed calls (and the minimum: the machine may be shared).
The reference is what a batch needs anyway: its offsets, ``torch.cumsum`` of ``values_lengths`` and of
``example_lengths``; ``to_dict`` is also set against ``values.tolist()`` (the Python ints it must create).
The checks run as numpy passes in a process that has not used numba, as one compiled kernel once it has:
the "numba loaded" column is measured after a first njit call, against the offsets measured again then.
Calls of a few ms are often preempted on a shared machine: their minimum is the steadier figure.

    python tools/jagged_bench.py
    python tools/jagged_bench.py --parts                         # the floor: each pass of the checks alone
    PYTHONPATH=/tmp/before/src python tools/jagged_bench.py     # an older checkout (no validate=)
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time

import torch

from sparsefill.segment import KeyedJaggedBatch


def _time(fn, repeat):
    fn()
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3, min(ts) * 1e3


def batch(B=512, K=16, L=10, p=0.9, seed=0):
    """``B`` examples, each with about ``p * K`` of ``K`` keys in random order, lists of 0..L-1 ids."""
    g = torch.Generator().manual_seed(seed)
    elen = (torch.rand(B, K, generator=g) < p).sum(1)
    keys = torch.cat([torch.randperm(K, generator=g)[: int(n)] for n in elen])
    vlen = torch.randint(0, L, (keys.numel(),), generator=g)
    vals = torch.randint(0, 10**6, (int(vlen.sum()),), generator=g)
    return vals, vlen, keys, elen


def parts(repeat):
    """The floor of the checks: each numpy pass of the valid path alone (their sum is what numpy cannot go
    below), the compiled kernel alone, and the construction without checks; microseconds, median."""
    import numpy as np
    from sparsefill.segment import _jagged_check

    print(
        "| batch | offsets | no checks | .numpy() x 3 | OR + sum of example_lengths (accumulate) | "
        "OR + sum of values_lengths | 1 << key | OR per example (reduceat) | popcount >= length, all | "
        "numpy passes, sum | kernel (numba set up) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for B, K, L in [(512, 16, 10), (512, 64, 40)]:
        vals, vlen, keys, elen = batch(B, K, L)
        el, vl, k = elen.numpy(), vlen.numpy(), keys.numpy()
        ends = np.add.accumulate(el)
        starts = ends - el
        bits = np.left_shift(1, k)
        ors = np.bitwise_or.reduceat(bits, starts).view(np.uint64)
        n_bits = np.bitwise_count(ors)
        us = {
            name: _time(fn, repeat)[0] * 1e3
            for name, fn in [
                ("off", lambda: (torch.cumsum(vlen, 0), torch.cumsum(elen, 0))),
                ("none", lambda: KeyedJaggedBatch(vals, vlen, keys, elen, validate=False)),
                ("np", lambda: (elen.numpy(), vlen.numpy(), keys.numpy())),
                ("el", lambda: (np.bitwise_or.reduce(el), np.add.accumulate(el))),
                ("vl", lambda: (np.bitwise_or.reduce(vl), np.add.reduce(vl))),
                ("shift", lambda: np.left_shift(1, k, out=bits)),
                ("or", lambda: np.bitwise_or.reduceat(bits, ends - el)),
                ("cmp", lambda: (np.bitwise_count(ors) >= el).all()),
            ]
        }
        numpy_sum = sum(us[n] for n in ("np", "el", "vl", "shift", "or", "cmp"))
        kern = "-"
        if _jagged_check._use_compiled():
            q = _jagged_check._compiled_quick()
            kern = f"{_time(lambda: q(el, vl, k, vals.shape[0]), repeat)[0] * 1e3:.1f}"
        print(
            f"| {B} x {K} | {us['off']:.1f} | {us['none']:.1f} | {us['np']:.1f} | {us['el']:.1f} | {us['vl']:.1f} | "
            f"{us['shift']:.1f} | {us['or']:.1f} | {us['cmp']:.1f} | {numpy_sum:.1f} | {kern} |"
        )
        del n_bits


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument(
        "--parts", action="store_true", help="the floor: each pass of the checks alone (us)"
    )
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    if a.parts:
        parts(a.repeat)
        import numba

        numba.njit(lambda x: x)(0)
        parts(a.repeat)
        return
    has_validate = "validate" in inspect.signature(KeyedJaggedBatch).parameters
    cases = [(512, 16, 10), (512, 64, 40)]
    rows = []
    for B, K, L in cases:  # numba not loaded: the numpy checks
        vals, vlen, keys, elen = batch(B, K, L)
        kj = KeyedJaggedBatch(vals, vlen, keys, elen)
        r = dict(case=(B, K, L, keys.numel(), vals.numel()))
        r["off"] = _time(lambda: (torch.cumsum(vlen, 0), torch.cumsum(elen, 0)), a.repeat)
        r["val"] = _time(
            lambda: KeyedJaggedBatch(vals, vlen, keys, elen), a.repeat if has_validate else 5
        )
        r["nov"] = (
            _time(lambda: KeyedJaggedBatch(vals, vlen, keys, elen, validate=False), a.repeat)
            if has_validate
            else None
        )
        r["td"] = _time(kj.to_dict, max(5, a.repeat // 20))
        r["tl"] = _time(vals.tolist, max(5, a.repeat // 20))
        rows.append(r)
    numba_loaded = "numba" in sys.modules
    try:  # a process that uses numba (its compiler set up): the checks then run as one compiled kernel
        import numba

        numba.njit(lambda x: x)(0)
    except ImportError:
        pass
    for (B, K, L), r in zip(cases, rows):
        vals, vlen, keys, elen = batch(B, K, L)
        r["nb"] = (
            _time(lambda: KeyedJaggedBatch(vals, vlen, keys, elen), a.repeat if has_validate else 5)
            if "numba" in sys.modules and not numba_loaded
            else None
        )
        r["off2"] = _time(lambda: (torch.cumsum(vlen, 0), torch.cumsum(elen, 0)), a.repeat)

    def cell(t, off):
        return "-" if t is None else f"{t[0]:.3f} (min {t[1]:.3f}; {t[0] / off[0]:.1f}x)"

    print(
        "| batch (examples x keys, lengths) | entries / values | offsets (ms) | validated (numpy) | "
        "validated (numba loaded) | validate=False | to_dict | values.tolist() |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        B, K, L, E, N = r["case"]
        off = r["off"]
        print(
            f"| {B} x {K}, 0..{L - 1} | {E} / {N} | {off[0]:.4f} (min {off[1]:.4f}; then {r['off2'][0]:.4f}) | "
            f"{cell(r['val'], off)} | {cell(r['nb'], r['off2'])} | {cell(r['nov'], off)} | {cell(r['td'], off)} | "
            f"{cell(r['tl'], off)} |"
        )


if __name__ == "__main__":
    main()
