"""A keyed jagged batch: ``LIST<MAP<INT, LIST<INT>>>`` as flat tensors (the spec's nested example).

::

    batch = [{1: [10, 11], 3: [101]}, {1: [11], 2: [50], 3: [102, 103]}]

    values          = [10, 11, 101, 11, 50, 102, 103]    every id, example by example, key by key
    values_lengths  = [ 2,       1,   1,  1,       2]    one entry per (example, key)
    keys            = [ 1,       3,   1,  2,       3]
    example_lengths = [                2,          3]    entries per example
    weights         = optional, one per value (scores)

Invariants: ``sum(example_lengths) == len(keys) == len(values_lengths)``, ``sum(values_lengths) ==
len(values)`` (no int64 overflow), lengths non-negative and a key at most once per example: checked
on construction in one pass over each tensor on the CPU (numpy; one compiled kernel once numba is
set up in the process), the exact checks naming the first error only where it fails
(``validate=False`` skips every check that reads the data).  Every operation is a few segment ops
(no Python loop over values; loops over keys only where the result is per key; ``to_dict`` loops
over the lists it creates).  The checks are in ``_jagged_check``, the (key, example) lists that
``select_keys``, ``to_padded`` and ``pooled`` read in ``_jagged_lists``.

>>> import torch
>>> kj = KeyedJaggedBatch.from_lists([{1: [10, 11], 3: [101]}, {1: [11], 2: [50], 3: [102, 103]}])
>>> kj.values.tolist(), kj.values_lengths.tolist(), kj.keys.tolist(), kj.example_lengths.tolist()
([10, 11, 101, 11, 50, 102, 103], [2, 1, 1, 1, 2], [1, 3, 1, 2, 3], [2, 3])
>>> kj.select_keys([3, 1]).to_dict()
[{3: [101], 1: [10, 11]}, {3: [102, 103], 1: [11]}]
>>> KeyedJaggedBatch(
...     kj.values, kj.values_lengths, kj.keys, kj.example_lengths, validate=False
... ).to_dict()
[{1: [10, 11], 3: [101]}, {1: [11], 2: [50], 3: [102, 103]}]
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Iterable, Mapping, Sequence
from itertools import islice
from typing import Any, cast

import torch
from torch.types import Device

from sparsefill._kernels.trace import traced
from sparsefill._kernels import segment as _kernels
from sparsefill._kernels.segment_check import IndexLike, as_index
from sparsefill.segment._pack import pack_segments
from sparsefill.segment._reduce_ops import reduce
from sparsefill.segment._repr import lengths_gather
from sparsefill.segment._jagged_check import _check_lengths, _has_repeated_key, _quick_check
from sparsefill.segment._jagged_lists import _positions, _seg_of, _slots

__all__ = ["KeyedJaggedBatch"]


def _traced_keys(keys, method: str) -> list[int]:
    """The wanted keys of a traced ``method`` as distinct ints: a list or tuple (a tensor's values
    are data: a graph break, with ``fullgraph`` dynamo's error with this message)."""
    if not isinstance(keys, (list, tuple)):
        torch._dynamo.graph_break(
            msg=f"KeyedJaggedBatch.{method} with keys given as a tensor reads them (data); "
            f"pass a list of ints to trace it"
        )
    keys = [int(k) for k in keys]
    if len(set(keys)) != len(keys):
        raise ValueError(f"keys must be distinct, got {keys}")
    return keys


def _rank(match: torch.Tensor) -> torch.Tensor:
    """Per row of ``match`` (entries x wanted keys) the column of its first True (0 if none; no
    columns too)."""
    return (
        match.to(torch.int64).argmax(1)
        if match.shape[1]
        else match.new_zeros(match.shape[0], dtype=torch.int64)
    )


@dataclasses.dataclass(frozen=True, eq=False)
class KeyedJaggedBatch:
    """The batch (see the module docstring); ``validate=False`` skips the checks that read the data
    (the signs and sums of the lengths, a key at most once per example), as
    ``torch.sparse_coo_tensor(..., check_invariants=False)``: no pass over the data and no device
    sync; the result is then unspecified for invalid input.  The checks of dtypes and entry counts
    always run."""

    values: torch.Tensor
    values_lengths: torch.Tensor
    keys: torch.Tensor
    example_lengths: torch.Tensor
    weights: torch.Tensor | None = None
    _: dataclasses.KW_ONLY
    validate: dataclasses.InitVar[bool] = True

    def __post_init__(self, validate: bool):
        # (the tests below are the cheapest torch has: this is the valid path)
        cpu = self.values.is_cpu
        dev = None if cpu else self.values.device
        for name in ("values_lengths", "keys", "example_lengths"):
            t = getattr(self, name)
            if not (
                type(t) is torch.Tensor
                and t.dtype is torch.int64
                and t.dim() == 1
                and (t.is_cpu if cpu else t.device == dev)
            ):
                object.__setattr__(self, name, as_index(t, name, self.values.device).long())
        el, vl, keys = self.example_lengths, self.values_lengths, self.keys
        E = keys.shape[0]
        state = 0  # (validate=False: no check reads the data)
        # torch.compile: the checks as a custom op, at run time
        if validate and traced(self.values):
            from sparsefill.segment._repr_ops import jagged_check

            jagged_check(el, vl, keys, self.values.shape[0] if self.values.dim() else 0)
            validate = False
        # one pass over each tensor on the CPU; the exact checks, in order, only where it fails
        if validate:
            total = self.values.shape[0] if self.values.dim() else 0
            state = _quick_check(el, vl, keys, total) if cpu and vl.shape[0] == E else 1
        # invalid, not settled, or not on the CPU: the checks that name the first error
        if state == 1:
            _check_lengths(el, E, "example_lengths")
        if vl.shape[0] != E:
            raise ValueError(
                f"values_lengths has {vl.shape[0]} entries but keys has {E} (one per (example, "
                "key))"
            )
        if state == 1:
            _check_lengths(vl, total, "values_lengths")
        # a key at most once per example (to_dict and to_padded hold one list per key)
        if state and E > 1 and _has_repeated_key(el, keys):
            pairs = torch.stack([_seg_of(el, E), keys], 1)  # (the error path: the first)
            _, inv, cnt = torch.unique(pairs, dim=0, return_inverse=True, return_counts=True)
            e, k = pairs[int((cnt[inv] > 1).nonzero()[0, 0])].tolist()
            raise ValueError(f"key {k} appears more than once in example {e}")
        if self.weights is not None and self.weights.shape[:1] != self.values.shape[:1]:
            raise ValueError(
                f"weights must have one entry per value ({self.values.shape[0]}), got shape "
                f"{tuple(self.weights.shape)}"
            )

    def __reduce__(self):
        """Pickled (files, ``torch.multiprocessing`` queues, DataLoader workers, deep copies) as the
        constructor's call, so that a batch from outside is checked (one pass) before a kernel reads
        its lengths: the dataclass default would restore the fields unchecked."""
        return type(self), (
            self.values,
            self.values_lengths,
            self.keys,
            self.example_lengths,
            self.weights,
        )

    # ---------------------------------------------------------------------------- construction
    @classmethod
    def from_lists(
        cls,
        batch: Sequence[Mapping[int, Sequence[int]]],
        *,
        weights: Sequence[Mapping[int, Sequence[float]]] | None = None,
        dtype: torch.dtype = torch.int64,
        device: Device = None,
    ) -> KeyedJaggedBatch:
        """From a list of ``{key: [ids]}`` dicts (key order kept); ``weights`` alike (``{key:
        [w]}``)."""
        keys: list[int] = []
        vlen: list[int] = []
        elen: list[int] = []
        vals: list[int] = []
        ws: list[float] = []
        for e, ex in enumerate(batch):
            elen.append(len(ex))
            for k, ids in ex.items():
                keys.append(int(k))
                vlen.append(len(ids))
                vals.extend(ids)
                if weights is not None:
                    w = weights[e][k]
                    if len(w) != len(ids):
                        raise ValueError(
                            f"weights of example {e}, key {k} have {len(w)} entries for "
                            f"{len(ids)} ids"
                        )
                    ws.extend(w)
        t: dict[str, Any] = dict(dtype=torch.int64, device=device)
        return cls(
            torch.tensor(vals, dtype=dtype, device=device),
            torch.tensor(vlen, **t),
            torch.tensor(keys, **t),
            torch.tensor(elen, **t),
            None
            if weights is None
            else torch.tensor(ws, dtype=torch.get_default_dtype(), device=device),
        )

    def to_dict(self) -> list[dict]:
        """The batch as a list of ``{key: [ids]}`` (``{key: ([ids], [weights])}`` with weights)."""
        enabled = gc.isenabled()
        # (the lists built here hold no cycles: the collector's passes over them took half the time)
        gc.disable()
        try:
            vals = self.values.tolist()
            ws = None if self.weights is None else self.weights.tolist()
            ends = torch.cumsum(self.values_lengths, 0).tolist()
            starts = [0, *ends[:-1]]
            lists: list[Any]
            if ws is None:
                lists = [vals[a:b] for a, b in zip(starts, ends)]
            else:
                lists = [(vals[a:b], ws[a:b]) for a, b in zip(starts, ends)]
            # (one iterator: no slice of keys or lists per example)
            entries = zip(self.keys.tolist(), lists)
            return [dict(islice(entries, n)) for n in self.example_lengths.tolist()]
        finally:
            if enabled:
                gc.enable()

    @property
    def batch_size(self) -> int:
        return self.example_lengths.numel()

    def _entries(self, order: torch.Tensor, example_lengths: torch.Tensor) -> KeyedJaggedBatch:
        """The batch made of the entries ``order`` (in that order), grouped as
        ``example_lengths``."""
        w: torch.Tensor | None
        # (one gather of rows: one size for values and weights)
        if self.weights is not None and traced(self.values):
            from sparsefill.segment._repr_ops import lengths_gather_rows

            rows = lengths_gather_rows(self.values_lengths, order, self.values.shape[0], False)
            vals, w = self.values.index_select(0, rows), self.weights.index_select(0, rows)
            return KeyedJaggedBatch(
                vals,
                self.values_lengths[order],
                self.keys[order],
                example_lengths,
                w,
                validate=False,
            )
        vals = lengths_gather(self.values, self.values_lengths, order, validate=False)
        w = (
            None
            if self.weights is None
            else lengths_gather(self.weights, self.values_lengths, order, validate=False)
        )
        return KeyedJaggedBatch(
            vals, self.values_lengths[order], self.keys[order], example_lengths, w, validate=False
        )

    # ---------------------------------------------------------------------------- keys
    def select_keys(self, keys: IndexLike) -> KeyedJaggedBatch:
        """Keep the entries whose key is in ``keys``, ordered as ``keys`` within every example
        (``permute_keys`` is the same call with every key)."""
        if traced(self.values):  # torch.compile: sizes read from data
            return self._select_traced(_traced_keys(keys, "select_keys"))
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

    def _select_traced(self, keys: list[int]) -> KeyedJaggedBatch:
        """``select_keys`` under torch.compile: each wanted key's entries, example by example, by
        the custom op ``sparsefill::jagged_key_lists`` over the entry numbers (a dynamic count per
        key, also without ``fullgraph``), then in (example, rank of the key) order by a sort."""
        from sparsefill.segment._jagged_ops import jagged_key_lists

        E, K, B = self.keys.shape[0], len(keys), self.batch_size
        ent = torch.arange(E, device=self.keys.device)
        offsets, lists = jagged_key_lists(
            ent, torch.ones_like(ent), self.keys, self.example_lengths, keys
        )
        per = torch.diff(offsets).view(K, B)  # (0 or 1: a key at most once per example)
        ids = torch.cat(lists) if K else ent[:0]
        n = ids.shape[0]
        rank = torch.repeat_interleave(
            torch.arange(K, device=ent.device), per.sum(1), output_size=n
        )
        ex = _seg_of(self.example_lengths, E).index_select(0, ids)
        order = ids.index_select(0, torch.sort(ex * max(K, 1) + rank, stable=True).indices)
        return self._entries(order, per.sum(0))

    # ---------------------------------------------------------------------------- batches
    def split(self, sizes: Sequence[int]) -> list[KeyedJaggedBatch]:
        """Split along the examples into batches of ``sizes`` examples (as ``torch.split`` with a
        list)."""
        sizes = list(sizes)
        if sum(sizes) != self.batch_size or any(s < 0 for s in sizes):
            raise ValueError(
                f"sizes {sizes} must be non-negative and sum to the batch size {self.batch_size}"
            )
        ent = [int(t.sum()) for t in torch.split(self.example_lengths, sizes)]
        vals_per = [int(t.sum()) for t in torch.split(self.values_lengths, ent)]
        out = []
        for el, vl, k, v, w in zip(
            torch.split(self.example_lengths, sizes),
            torch.split(self.values_lengths, ent),
            torch.split(self.keys, ent),
            torch.split(self.values, vals_per),
            torch.split(self.weights, vals_per)
            if self.weights is not None
            else [None] * len(sizes),
        ):
            # (parts of a valid batch)
            out.append(KeyedJaggedBatch(v, vl, k, el, w, validate=False))
        return out

    @staticmethod
    def concat(batches: Iterable[KeyedJaggedBatch]) -> KeyedJaggedBatch:
        """The examples of ``batches`` one after the other."""
        batches = list(batches)
        if not batches:
            raise ValueError("concat needs at least one batch")
        has_w = {b.weights is not None for b in batches}
        if len(has_w) != 1:
            raise ValueError("concat: either every batch has weights or none has")
        return KeyedJaggedBatch(
            torch.cat([b.values for b in batches]),
            torch.cat([b.values_lengths for b in batches]),
            torch.cat([b.keys for b in batches]),
            torch.cat([b.example_lengths for b in batches]),
            torch.cat([cast(torch.Tensor, b.weights) for b in batches])
            if has_w == {True}
            else None,
            validate=False,
        )  # (examples of valid batches make a valid batch)

    # ---------------------------------------------------------------------------- dense and pooled
    def to_padded(
        self, keys: IndexLike, *, pad_value: int = 0, max_length: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(padded, mask)``: ``padded[e, j, :]`` holds the ids of key ``keys[j]`` in example
        ``e``, padded with ``pad_value`` to the longest list (or ``max_length``, truncating); shape
        ``(B, K, L)``."""
        if traced(self.values):  # torch.compile: no select_keys (data sizes)
            return self._padded_traced(_traced_keys(keys, "to_padded"), pad_value, max_length)
        want = as_index(keys, "keys", self.keys.device).long()
        sel = self.select_keys(want)
        K, B = want.numel(), self.batch_size
        packed, mask = pack_segments(
            sel.values,
            sel.values_lengths,
            max_length=max_length,
            pad_value=pad_value,
            return_presence_mask=True,
        )
        L = packed.shape[1]
        ex = _seg_of(sel.example_lengths, sel.keys.numel())
        slot = ex * K + _rank(sel.keys[:, None] == want[None, :])
        out = packed.new_full((B * K, L, *packed.shape[2:]), pad_value).index_copy(0, slot, packed)
        m = torch.zeros(B * K, L, dtype=torch.bool, device=mask.device).index_copy(0, slot, mask)
        return out.view(B, K, L, *packed.shape[2:]), m.view(B, K, L)

    def _padded_traced(self, keys: list[int], pad_value, max_length):
        """``to_padded`` under torch.compile: the ids' positions per (key, example) list by the
        custom op ``sparsefill::jagged_key_lists`` (slot ``j * B + e``), the width by
        ``sparsefill::lengths_max_range`` (both dynamic sizes, also without ``fullgraph``); each
        list copied to row ``e * K + j`` of the padded layout, its places past ``max_length`` to a
        dropped slot."""
        from sparsefill.segment._jagged_ops import jagged_key_lists
        from sparsefill.segment._repr_ops import lengths_max_range

        if max_length is not None and max_length < 0:
            raise ValueError(f"max_length must be non-negative, got {max_length}")
        vals, K, B = self.values, len(keys), self.batch_size
        dev = vals.device
        offsets, lists = jagged_key_lists(
            torch.arange(vals.shape[0], device=dev),
            self.values_lengths,
            self.keys,
            self.example_lengths,
            keys,
        )
        lens = torch.diff(offsets)  # (K * B,) slot j * B + e
        L = lengths_max_range(lens).shape[0] if max_length is None else max_length
        at = torch.cat(lists) if K else offsets.new_empty(0)  # (the ids' positions in slot order)
        n = at.shape[0]
        slot = torch.arange(K * B, device=dev)
        row = (slot % B) * K + slot // B if B else slot
        pos = torch.arange(n, device=dev) - torch.repeat_interleave(
            offsets[:-1], lens, output_size=n
        )
        dest = torch.repeat_interleave(row * L, lens, output_size=n) + pos
        if max_length is not None:
            dest = torch.where(pos < L, dest, B * K * L)
        flat = vals.new_full((B * K * L + 1, *vals.shape[1:]), pad_value).index_copy(
            0, dest, vals.index_select(0, at)
        )
        by_row = lens.view(K, B).t().reshape(B * K, 1)
        mask = torch.arange(L, device=dev) < by_row
        return flat[: B * K * L].view(B, K, L, *vals.shape[1:]), mask.view(B, K, L)

    def pooled(
        self,
        tables: torch.Tensor | dict[int, torch.Tensor],
        reducer: str = "sum",
        *,
        keys: IndexLike | None = None,
        **kw: Any,
    ) -> dict[int, torch.Tensor]:
        """Per key, the ids of every example looked up in ``tables[key]`` (or one shared table) and
        reduced: ``out[key][e] = reduce(table[ids of key in example e])``, shape ``(B, D)``; a
        missing key gives the empty value; a key asked twice is pooled once.  Weighted reducers use
        the batch's weights; ``positional_weighted_sum`` takes ``weights=`` (one per place).  ``kw``
        goes to ``segment.reduce``.

        The ids are grouped by (key, example) once for all keys (:meth:`_by_key`), then each key is
        one ``segment.reduce`` over its slice of the ids with offsets (for the sums, one
        ``embedding_bag``).

        >>> kj = KeyedJaggedBatch.from_lists([{1: [0, 2], 3: [1]}, {3: [2, 2]}])
        >>> table = torch.tensor([[1.], [10.], [100.]])
        >>> out = kj.pooled({1: table, 3: table})
        >>> out[1].tolist(), out[3].tolist()
        ([[101.0], [0.0]], [[10.0], [200.0]])
        """
        if keys is None:
            # (the keys are data: eager)
            if not isinstance(tables, dict) and torch.compiler.is_compiling():
                torch._dynamo.graph_break(
                    msg="KeyedJaggedBatch.pooled with one shared table and no keys= pools "
                    "the keys the batch holds (data); pass keys= to trace it"
                )
            keys = list(tables) if isinstance(tables, dict) else sorted(set(self.keys.tolist()))
        # positional_weighted_sum: one weight per place in a segment
        pos_w = kw.pop("weights", None)
        if reducer == "positional_weighted_sum" and pos_w is None:
            raise ValueError(
                "reducer 'positional_weighted_sum' needs weights= (one per place in a segment)"
            )
        if reducer != "positional_weighted_sum" and pos_w is not None:
            raise ValueError(
                "weights= is for positional_weighted_sum only (the weighted reducers use the "
                f"batch's weights), got reducer {reducer!r}"
            )
        given: dict = {}  # key -> as given (a key asked twice is pooled once)
        for k in keys:
            given.setdefault(int(k), k)
        keys = list(given)
        weighted = reducer in ("weighted_sum", "weighted_mean")
        if weighted and self.weights is None:
            raise ValueError(f"reducer {reducer!r} needs a batch with weights")
        # torch.compile: per key the positions of its ids (sizes known at run time)
        if traced(self.values):
            return self._pooled_traced(tables, given, keys, reducer, weighted, pos_w, kw)
        offsets, ids, w = self._by_key(keys, with_weights=weighted)
        B = self.batch_size
        bounds = offsets[::B].tolist() if B else [0] * (len(keys) + 1)  # each key's ids: one sync
        out = {}
        for j, k in enumerate(keys):
            table = tables[given[k]] if isinstance(tables, dict) else tables
            lo, hi = bounds[j], bounds[j + 1]
            wk = w[lo:hi].to(table.dtype) if weighted else pos_w
            out[k] = reduce(
                table,
                reducer,
                offsets=offsets[j * B : (j + 1) * B + 1] - lo,
                indices=ids[lo:hi],
                weights=wk,
                **kw,
            )
        return out

    def _pooled_traced(self, tables, given, keys, reducer, weighted, pos_w, kw):
        """``pooled`` under torch.compile: every key's ids (or, weighted, their positions) by the
        custom op ``sparsefill::jagged_key_lists`` (one dynamic size per key), then as ``pooled``;
        an unweighted sum, mean or sqrt_n is one op for every key (``_jagged_ops.pooled_fused``).
        The keys of a table given for several keys are one ``segment.reduce`` (their lists one after
        the other): one gradient for the table (two sparse gradients of one tensor would be added by
        autograd, which torch 2.13 cannot trace for data-dependent counts of rows), unless
        ``return_arg`` (its positions are per key)."""
        from sparsefill.segment._jagged_ops import distinct_tables, jagged_key_lists, pooled_fused

        per_key = [tables[given[k]] if isinstance(tables, dict) else tables for k in keys]
        if not weighted and pos_w is None:
            fused = pooled_fused(per_key, self, keys, reducer, kw)
            if fused is not None:
                return fused
        distinct, table_of = distinct_tables(per_key)
        if kw.get("return_arg"):
            table_of = list(range(len(keys)))
        # (the keys of a table together; stable)
        order = sorted(range(len(keys)), key=lambda j: table_of[j])
        vals = self.values
        # (weighted: positions)
        src = torch.arange(vals.shape[0], device=vals.device) if weighted else vals
        offsets, lists = jagged_key_lists(
            src, self.values_lengths, self.keys, self.example_lengths, [keys[j] for j in order]
        )
        B = self.batch_size
        out, at = {}, 0
        while at < len(order):
            group = [j for j in order[at:] if table_of[j] == table_of[order[at]]]
            table, parts = per_key[group[0]], lists[at : at + len(group)]
            ids = parts[0] if len(parts) == 1 else torch.cat(parts)
            wk = pos_w
            if weighted:
                ids, wk = (
                    vals.index_select(0, ids),
                    self.weights.index_select(0, ids).to(table.dtype),
                )
            offs = offsets[at * B : (at + len(group)) * B + 1]
            res = reduce(table, reducer, offsets=offs - offs[0], indices=ids, weights=wk, **kw)
            for n, j in enumerate(group):
                out[keys[j]] = res if len(group) == 1 else res[n * B : (n + 1) * B]
            at += len(group)
        return {k: out[k] for k in keys}

    def _by_key(self, keys: list[int], *, with_weights: bool = False):
        """``(offsets, ids, weights)``: the ids of the batch ordered by (key in ``keys``, example),
        and the ``K * B + 1`` offsets of those (key, example) lists: the ids of key ``keys[j]`` in
        example ``e`` are ``ids[offsets[j * B + e]:offsets[j * B + e + 1]]`` (an absent key: an
        empty list).  Computed once for all keys, with no sort and no per-key mask (:func:`_slots`),
        then one gather of the ids (and weights) reads the lists in slot order (one compiled copy
        per list on the compiled segment backend; weights that require grad go through
        ``index_select``)."""
        dev = self.keys.device
        offsets, starts, lengths = _slots(
            self.values_lengths, self.keys, self.example_lengths, keys
        )
        KB = offsets.shape[0] - 1
        n = int(offsets[-1])
        srcs = [self.values] + ([cast(torch.Tensor, self.weights)] if with_weights else [])
        if all(
            t.dim() == 1 and t.is_contiguous() and not (t.requires_grad and torch.is_grad_enabled())
            for t in srcs
        ) and _kernels.compiled_for(dev, n):
            # (one copy of each list: fewer passes than the torch ops)
            nb, parts = _kernels._nb(), []
            for t in srcs:
                out = t.new_empty(n)
                nb.gather_runs(
                    t.detach().numpy(),
                    starts[:KB].numpy(),
                    lengths[:KB].numpy(),
                    offsets.numpy(),
                    out.numpy(),
                )
                parts.append(out)
            return offsets, parts[0], parts[1] if with_weights else None
        at = _positions(offsets, starts, lengths, n)
        return offsets, *(t.index_select(0, at) for t in srcs), *([] if with_weights else [None])
