"""A keyed jagged batch: ``LIST<MAP<INT, LIST<INT>>>`` as flat tensors (the spec's nested example).

::

    batch = [{1: [10, 11], 3: [101]}, {1: [11], 2: [50], 3: [102, 103]}]

    values          = [10, 11, 101, 11, 50, 102, 103]    every id, example by example, key by key
    values_lengths  = [ 2,       1,   1,  1,       2]    one entry per (example, key)
    keys            = [ 1,       3,   1,  2,       3]
    example_lengths = [                2,          3]    entries per example
    weights         = optional, one per value (scores)

Invariants: ``sum(example_lengths) == len(keys) == len(values_lengths)``,
``sum(values_lengths) == len(values)``, lengths non-negative and a key at most once per example:
checked on construction by a few vectorised passes (``validate=False`` skips the ones that read the
data).  Every operation is a few segment ops (no Python loop over values; loops over keys only where
the result is per key; ``to_dict`` loops over the lists it creates).

>>> import torch
>>> kj = KeyedJaggedBatch.from_lists([{1: [10, 11], 3: [101]}, {1: [11], 2: [50], 3: [102, 103]}])
>>> kj.values.tolist(), kj.values_lengths.tolist(), kj.keys.tolist(), kj.example_lengths.tolist()
([10, 11, 101, 11, 50, 102, 103], [2, 1, 1, 1, 2], [1, 3, 1, 2, 3], [2, 3])
>>> kj.select_keys([3, 1]).to_dict()
[{3: [101], 1: [10, 11]}, {3: [102, 103], 1: [11]}]
>>> KeyedJaggedBatch(kj.values, kj.values_lengths, kj.keys, kj.example_lengths, validate=False).to_dict()
[{1: [10, 11], 3: [101]}, {1: [11], 2: [50], 3: [102, 103]}]
"""

from __future__ import annotations

import dataclasses
import gc

import numpy as np
import torch

from ._check import as_index, check_lengths
from ._pack import pack_segments
from ._reduce_ops import reduce
from ._repr import lengths_gather

__all__ = ["KeyedJaggedBatch"]


def _seg_of(lengths: torch.Tensor, n: int) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths, output_size=n)


def _rank(match: torch.Tensor) -> torch.Tensor:
    """Per row of ``match`` (entries x wanted keys) the column of its first True (0 if none; no columns too)."""
    return match.to(torch.int64).argmax(1) if match.shape[1] else match.new_zeros(match.shape[0], dtype=torch.int64)


def _distinct_residues(example_lengths: torch.Tensor, keys: torch.Tensor) -> bool:
    """A sufficient test (CPU) that no example holds a key twice: per example, the OR of ``1 << (key mod 64)``
    has as many bits set as the example has entries (the residues are distinct, so the keys are).  For key
    ids below 64 (the usual feature ids) it is also necessary."""
    el = example_lengths.numpy()
    bits = np.bitwise_and(keys.numpy(), 63)
    np.left_shift(1, bits, out=bits)
    nz = el > 0
    ors = np.bitwise_or.reduceat(bits, (np.cumsum(el) - el)[nz]).view(np.uint64) if bits.size else bits
    count = getattr(np, "bitwise_count", None)  # (numpy >= 2)
    n_bits = count(ors) if count else np.unpackbits(ors.view(np.uint8)).reshape(-1, 64).sum(1)
    return bool((n_bits == el[nz]).all())


def _has_repeated_key(example_lengths: torch.Tensor, keys: torch.Tensor) -> bool:
    """Whether some example holds a key twice: the residue test, else the (example, key) pairs counted in
    a table (when it is small) or sorted."""
    if keys.device.type == "cpu" and _distinct_residues(example_lengths, keys):
        return False
    E, B = keys.numel(), example_lengths.numel()
    ex = _seg_of(example_lengths, E)
    lo, hi = (int(v) for v in torch.aminmax(keys))
    span = hi - lo + 1
    if span * B <= max(8 * E, 1 << 16):
        return bool(torch.bincount(ex * span + (keys - lo), minlength=span * B).max() > 1)
    if span * B < 2 ** 62:  # one int64 code per pair
        code = torch.sort(ex * span + (keys - lo)).values
        return bool((code[1:] == code[:-1]).any())
    order = torch.sort(keys, stable=True).indices
    order = order[torch.sort(ex[order], stable=True).indices]
    k, e = keys[order], ex[order]
    return bool(((k[1:] == k[:-1]) & (e[1:] == e[:-1])).any())


@dataclasses.dataclass(frozen=True, eq=False)
class KeyedJaggedBatch:
    """The batch (see the module docstring); ``validate=False`` skips the checks that read the data (the
    signs and sums of the lengths, a key at most once per example), as ``torch.sparse_coo_tensor(...,
    check_invariants=False)``: no pass over the data and no device sync; the result is then unspecified
    for invalid input.  The checks of dtypes and entry counts always run."""
    values: torch.Tensor
    values_lengths: torch.Tensor
    keys: torch.Tensor
    example_lengths: torch.Tensor
    weights: torch.Tensor | None = None
    _: dataclasses.KW_ONLY
    validate: dataclasses.InitVar[bool] = True

    def __post_init__(self, validate: bool):
        for name in ("values_lengths", "keys", "example_lengths"):
            object.__setattr__(self, name, as_index(getattr(self, name), name, self.values.device).long())
        E = self.keys.numel()
        if validate:
            check_lengths(self.example_lengths, E, "example_lengths")
        if self.values_lengths.numel() != E:
            raise ValueError(f"values_lengths has {self.values_lengths.numel()} entries but keys has "
                             f"{E} (one per (example, key))")
        if validate:
            check_lengths(self.values_lengths, self.values.shape[0] if self.values.dim() else 0, "values_lengths")
        # a key at most once per example (to_dict and to_padded hold one list per key)
        if validate and E > 1 and _has_repeated_key(self.example_lengths, self.keys):
            pairs = torch.stack([_seg_of(self.example_lengths, E), self.keys], 1)  # (the error path: the first)
            _, inv, cnt = torch.unique(pairs, dim=0, return_inverse=True, return_counts=True)
            e, k = pairs[int((cnt[inv] > 1).nonzero()[0, 0])].tolist()
            raise ValueError(f"key {k} appears more than once in example {e}")
        if self.weights is not None and self.weights.shape[:1] != self.values.shape[:1]:
            raise ValueError(f"weights must have one entry per value ({self.values.shape[0]}), got shape "
                             f"{tuple(self.weights.shape)}")

    # ---------------------------------------------------------------------------- construction
    @classmethod
    def from_lists(cls, batch, *, weights=None, dtype=torch.int64, device=None) -> "KeyedJaggedBatch":
        """From a list of ``{key: [ids]}`` dicts (key order kept); ``weights`` alike (``{key: [w]}``)."""
        keys, vlen, elen, vals, ws = [], [], [], [], []
        for e, ex in enumerate(batch):
            elen.append(len(ex))
            for k, ids in ex.items():
                keys.append(int(k))
                vlen.append(len(ids))
                vals.extend(ids)
                if weights is not None:
                    w = weights[e][k]
                    if len(w) != len(ids):
                        raise ValueError(f"weights of example {e}, key {k} have {len(w)} entries for {len(ids)} ids")
                    ws.extend(w)
        t = dict(dtype=torch.int64, device=device)
        return cls(torch.tensor(vals, dtype=dtype, device=device), torch.tensor(vlen, **t), torch.tensor(keys, **t),
                   torch.tensor(elen, **t),
                   None if weights is None else torch.tensor(ws, dtype=torch.get_default_dtype(), device=device))

    def to_dict(self) -> list[dict]:
        """The batch as a list of ``{key: [ids]}`` (``{key: ([ids], [weights])}`` with weights)."""
        enabled = gc.isenabled()
        gc.disable()  # (the lists built here hold no cycles: the collector's passes over them took half the time)
        try:
            vals = self.values.tolist()
            ws = None if self.weights is None else self.weights.tolist()
            ends = torch.cumsum(self.values_lengths, 0).tolist()
            starts = [0, *ends[:-1]]
            if ws is None:
                lists = [vals[a:b] for a, b in zip(starts, ends)]
            else:
                lists = [(vals[a:b], ws[a:b]) for a, b in zip(starts, ends)]
            keys, out, e = self.keys.tolist(), [], 0
            for n in self.example_lengths.tolist():
                out.append(dict(zip(keys[e:e + n], lists[e:e + n])))
                e += n
            return out
        finally:
            if enabled:
                gc.enable()

    @property
    def batch_size(self) -> int:
        return self.example_lengths.numel()

    def _entries(self, order: torch.Tensor, example_lengths: torch.Tensor) -> "KeyedJaggedBatch":
        """The batch made of the entries ``order`` (in that order), grouped as ``example_lengths``."""
        vals = lengths_gather(self.values, self.values_lengths, order, validate=False)
        w = None if self.weights is None else lengths_gather(self.weights, self.values_lengths, order, validate=False)
        return KeyedJaggedBatch(vals, self.values_lengths[order], self.keys[order], example_lengths, w, validate=False)

    # ---------------------------------------------------------------------------- keys
    def select_keys(self, keys) -> "KeyedJaggedBatch":
        """Keep the entries whose key is in ``keys``, ordered as ``keys`` within every example
        (``permute_keys`` is the same call with every key)."""
        want = as_index(keys, "keys", self.keys.device).long()
        if want.unique().numel() != want.numel():
            raise ValueError(f"keys must be distinct, got {want.tolist()}")
        match = self.keys[:, None] == want[None, :]
        present = match.any(1)
        rank = _rank(match)
        ex = _seg_of(self.example_lengths, self.keys.numel())
        idx = present.nonzero().squeeze(1)
        order = idx[torch.sort(ex[idx] * max(want.numel(), 1) + rank[idx], stable=True).indices]
        new_elen = torch.bincount(ex[idx], minlength=self.batch_size)
        return self._entries(order, new_elen)

    permute_keys = select_keys

    # ---------------------------------------------------------------------------- batches
    def split(self, sizes) -> list["KeyedJaggedBatch"]:
        """Split along the examples into batches of ``sizes`` examples (as ``torch.split`` with a list)."""
        sizes = list(sizes)
        if sum(sizes) != self.batch_size or any(s < 0 for s in sizes):
            raise ValueError(f"sizes {sizes} must be non-negative and sum to the batch size {self.batch_size}")
        ent = [int(t.sum()) for t in torch.split(self.example_lengths, sizes)]
        vals_per = [int(t.sum()) for t in torch.split(self.values_lengths, ent)]
        out = []
        for el, vl, k, v, w in zip(torch.split(self.example_lengths, sizes), torch.split(self.values_lengths, ent),
                                   torch.split(self.keys, ent), torch.split(self.values, vals_per),
                                   torch.split(self.weights, vals_per) if self.weights is not None
                                   else [None] * len(sizes)):
            out.append(KeyedJaggedBatch(v, vl, k, el, w, validate=False))  # (parts of a valid batch)
        return out

    @staticmethod
    def concat(batches) -> "KeyedJaggedBatch":
        """The examples of ``batches`` one after the other."""
        batches = list(batches)
        if not batches:
            raise ValueError("concat needs at least one batch")
        has_w = {b.weights is not None for b in batches}
        if len(has_w) != 1:
            raise ValueError("concat: either every batch has weights or none has")
        return KeyedJaggedBatch(torch.cat([b.values for b in batches]),
                                torch.cat([b.values_lengths for b in batches]),
                                torch.cat([b.keys for b in batches]),
                                torch.cat([b.example_lengths for b in batches]),
                                torch.cat([b.weights for b in batches]) if has_w == {True} else None,
                                validate=False)  # (examples of valid batches make a valid batch)

    # ---------------------------------------------------------------------------- dense and pooled
    def to_padded(self, keys, *, pad_value=0, max_length: int | None = None):
        """``(padded, mask)``: ``padded[e, j, :]`` holds the ids of key ``keys[j]`` in example ``e``,
        padded with ``pad_value`` to the longest list (or ``max_length``, truncating); shape ``(B, K, L)``."""
        want = as_index(keys, "keys", self.keys.device).long()
        sel = self.select_keys(want)
        K, B = want.numel(), self.batch_size
        packed, mask = pack_segments(sel.values, sel.values_lengths, max_length=max_length, pad_value=pad_value,
                                     return_presence_mask=True)
        L = packed.shape[1]
        ex = _seg_of(sel.example_lengths, sel.keys.numel())
        slot = ex * K + _rank(sel.keys[:, None] == want[None, :])
        out = packed.new_full((B * K, L, *packed.shape[2:]), pad_value).index_copy(0, slot, packed)
        m = torch.zeros(B * K, L, dtype=torch.bool, device=mask.device).index_copy(0, slot, mask)
        return out.view(B, K, L, *packed.shape[2:]), m.view(B, K, L)

    def pooled(self, tables, reducer: str = "sum", *, keys=None, **kw) -> dict[int, torch.Tensor]:
        """Per key, the ids of every example looked up in ``tables[key]`` (or one shared table) and reduced:
        ``out[key][e] = reduce(table[ids of key in example e])``, shape ``(B, D)``; a missing key gives the
        empty value.  Weighted reducers use the batch's weights; ``positional_weighted_sum`` takes ``weights=``
        (one per place).  ``kw`` goes to ``segment.reduce``."""
        if keys is None:
            keys = list(tables) if isinstance(tables, dict) else sorted(set(self.keys.tolist()))
        pos_w = kw.pop("weights", None)  # positional_weighted_sum: one weight per place in a segment
        if reducer == "positional_weighted_sum" and pos_w is None:
            raise ValueError("reducer 'positional_weighted_sum' needs weights= (one per place in a segment)")
        if reducer != "positional_weighted_sum" and pos_w is not None:
            raise ValueError(f"weights= is for positional_weighted_sum only (the weighted reducers use the batch's "
                             f"weights), got reducer {reducer!r}")
        ex_of_entry = _seg_of(self.example_lengths, self.keys.numel())
        out = {}
        for k in keys:
            table = tables[k] if isinstance(tables, dict) else tables
            entries = (self.keys == int(k)).nonzero().squeeze(1)
            ids = lengths_gather(self.values, self.values_lengths, entries, validate=False)
            seg = torch.repeat_interleave(ex_of_entry[entries], self.values_lengths[entries], output_size=ids.numel())
            w = pos_w
            if reducer in ("weighted_sum", "weighted_mean"):
                if self.weights is None:
                    raise ValueError(f"reducer {reducer!r} needs a batch with weights")
                w = lengths_gather(self.weights, self.values_lengths, entries, validate=False).to(table.dtype)
            out[int(k)] = reduce(table, reducer, segment_ids=seg, num_segments=self.batch_size,
                                 indices=ids, weights=w, **kw)
        return out
