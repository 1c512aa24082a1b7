"""The invariants of a :class:`~._jagged.KeyedJaggedBatch`, checked on construction:
``sum(example_lengths) == len(keys) == len(values_lengths)``, ``sum(values_lengths) ==
len(values)`` with no int64 overflow, lengths non-negative, a key at most once per example.

:func:`_quick_check` is the valid path, one pass over each tensor on the CPU (numpy, or one numba
kernel once numba's compiler is set up in the process: :func:`_use_compiled`); where it cannot
settle a batch the exact checks (:func:`_check_lengths`, :func:`_has_repeated_key`) run and name
the first error.
"""

from __future__ import annotations

import functools
import sys

import numpy as np
import torch

from sparsefill._kernels import segment as _kernels
from sparsefill._kernels.segment_check import check_lengths
from sparsefill.segment._jagged_lists import _seg_of


_INT64_MAX = (1 << 63) - 1


def _quick_numpy(el: np.ndarray, vl: np.ndarray, keys: np.ndarray, total: int) -> int:
    """The valid path of the checks in a few numpy passes (see ``_quick_check``): the OR of the
    lengths (its sign: none negative; it bounds each one, so ``n * OR < 2**64`` rules out a wrapped
    sum), their sum, and the residue bitmask per example: ``1 << (key mod 64)`` OR-ed per example
    (``reduceat``) has as many bits set as the example has entries iff the residues are distinct
    (then so are the keys; for ids below 64, the usual feature ids, it is also necessary; those are
    tried first, without the mod). An empty example reads the next one's first bit (or the padding
    0): ``popcount >= length`` holds for it, and means ``==`` for the others."""
    E, B = keys.shape[0], el.shape[0]
    if B:
        o = int(np.bitwise_or.reduce(el))
        if o < 0 or B * o >> 64:
            return 1
        ends = np.add.accumulate(el)  # (the ufunc itself: np.cumsum adds wrappers)
        if ends[-1] != E:
            return 1
    elif E:
        return 1
    if E:
        o = int(np.bitwise_or.reduce(vl))
        if o < 0 or E * o >> 64 or vl.sum() != total:
            return 1
    elif total:
        return 1
    if E > 1:
        bits = np.empty(E + 1, dtype=np.int64)
        bits[E] = 0
        starts = ends - el
        count = getattr(np, "bitwise_count", None)  # (numpy >= 2)
        for wrap in (
            False,
            True,
        ):  # key ids in [0, 64) first: one pass (numpy's 1 << k is 0 for other k)
            np.left_shift(1, np.bitwise_and(keys, 63, out=bits[:E]) if wrap else keys, out=bits[:E])
            ors = np.bitwise_or.reduceat(bits, starts).view(np.uint64)
            n_bits = (
                count(ors) if count else np.unpackbits(ors.view(np.uint8)).reshape(-1, 64).sum(1)
            )
            if (n_bits >= el).all():
                return 0
        return 2
    return 0


@functools.cache
def _compiled_quick():
    """The valid path of the checks as one numba kernel (compiled once, cached on disk: it closes
    over nothing): a vectorised pass over each lengths tensor (sum and OR, as ``_quick_numpy``),
    then the residue bitmask of every example, its popcount against the example's length."""
    from numba import njit

    @njit(nogil=True, cache=True)
    def quick(el, vl, keys, total):  # pragma: no cover - compiled
        E, B = keys.shape[0], el.shape[0]
        s, o = 0, 0
        for b in range(B):
            s += el[b]
            o |= el[b]
        # (each length at most o: no wrapped sum)
        if o < 0 or (B and o > (2**63 - 1) // B) or s != E:
            return 1
        s, o = 0, 0
        for i in range(E):
            s += vl[i]
            o |= vl[i]
        if o < 0 or (E and o > (2**63 - 1) // E) or s != total:
            return 1
        start, bad = 0, np.uint64(0)
        m1, m2, m4 = (
            np.uint64(0x5555555555555555),
            np.uint64(0x3333333333333333),
            np.uint64(0x0F0F0F0F0F0F0F0F),
        )
        for b in range(B):
            x = np.uint64(0)
            for i in range(start, start + el[b]):
                x |= np.uint64(1) << np.uint64(keys[i] & 63)
            x -= (x >> np.uint64(1)) & m1  # popcount (LLVM emits the instruction)
            x = (x & m2) + ((x >> np.uint64(2)) & m2)
            x = (x + (x >> np.uint64(4))) & m4
            bad |= ((x * np.uint64(0x0101010101010101)) >> np.uint64(56)) ^ np.uint64(el[b])
            start += el[b]
        return 0 if bad == 0 else 2

    return quick


_NUMBA_SET_UP = [False]  # (once set up, numba's compiler stays so)


def _use_compiled() -> bool:
    """Whether the checks run as the numba kernel: with the segment backend ``"numba"``, or
    ``"auto"`` once numba's compiler is set up in this process (by any njit function's first call:
    0.7-1 s, more than a batch's checks cost, so never here; the kernel then loads from numba's disk
    cache in ~20 ms)."""
    name = _kernels.backend()
    if name == "numba":
        return _kernels.compiled_available()
    if name != "auto":
        return False
    if not _NUMBA_SET_UP[0] and "numba" in sys.modules:
        registry = getattr(getattr(sys.modules["numba"], "core", None), "registry", None)
        # (its context is a cached property: read, not computed)
        target = getattr(registry, "cpu_target", None)
        _NUMBA_SET_UP[0] = "_toplevel_target_context" in getattr(target, "__dict__", ())
    return _NUMBA_SET_UP[0]


def _quick_check(el: torch.Tensor, vl: torch.Tensor, keys: torch.Tensor, total: int) -> int:
    """The checks' valid path on the CPU, one pass over each tensor: 0 if the batch is valid, 2 if
    its lengths are and the residue test cannot settle the keys, 1 otherwise (the exact checks then
    run and name the first error).  The numba kernel where ``_use_compiled()``, else numpy (2-3x
    slower: a dozen calls); the kernel reads C-contiguous arrays only (one compiled signature)."""
    el_np, vl_np, k_np = el.numpy(), vl.numpy(), keys.numpy()
    if (
        el_np.flags.c_contiguous
        and vl_np.flags.c_contiguous
        and k_np.flags.c_contiguous
        and _use_compiled()
    ):
        return int(_compiled_quick()(el_np, vl_np, k_np, total))
    return _quick_numpy(el_np, vl_np, k_np, total)


def _check_lengths(lengths: torch.Tensor, total: int, name: str) -> None:
    """``check_lengths`` (the same messages), and the int64 overflow of the sum, which would
    wrap."""
    check_lengths(lengths, None, name)
    n = lengths.numel()
    if n and int(lengths.max()) > _INT64_MAX // n:  # (else the sum cannot pass 2**63 - 1)
        run = torch.cumsum(lengths, 0)
        # (non-negative: a decrease is a wrap; no diff, it wraps too)
        dec = (run[1:] < run[:-1]).nonzero()
        if dec.numel():
            raise ValueError(
                f"{name} overflow int64: their running sum passes 2**63 - 1 at "
                f"{name}[{int(dec[0, 0]) + 1}]"
            )
    check_lengths(lengths, total, name, validate=False)


def _has_repeated_key(example_lengths: torch.Tensor, keys: torch.Tensor) -> bool:
    """Whether some example holds a key twice: the (example, key) pairs counted in a table (when it
    is small) or sorted."""
    E, B = keys.numel(), example_lengths.numel()
    ex = _seg_of(example_lengths, E)
    lo, hi = (int(v) for v in torch.aminmax(keys))
    span = hi - lo + 1
    if span * B <= max(8 * E, 1 << 16):
        return bool(torch.bincount(ex * span + (keys - lo), minlength=span * B).max() > 1)
    if span * B < 2**62:  # one int64 code per pair
        code = torch.sort(ex * span + (keys - lo)).values
        return bool((code[1:] == code[:-1]).any())
    order = torch.sort(keys, stable=True).indices
    order = order[torch.sort(ex[order], stable=True).indices]
    k, e = keys[order], ex[order]
    return bool(((k[1:] == k[:-1]) & (e[1:] == e[:-1])).any())
