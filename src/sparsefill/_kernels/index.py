"""Index kernels on (sparse_dim, nse) COO indices, with no Python loops.

Positions of a sparse shape ``S`` are linearised row-major:
``key = sum_d indices[d] * stride[d]`` with ``stride = contiguous strides of S``,
so that sorting keys sorts indices lexicographically (torch's coalesced order).
"""

from __future__ import annotations

import math

import torch

from sparsefill._kernels import trace
from sparsefill._kernels.trace import traced

_INT64_MAX = (1 << 63) - 1


def numel(shape) -> int:
    return math.prod(shape)


def strides(shape) -> list[int]:
    out, acc = [], 1
    for s in reversed(tuple(shape)):
        out.append(acc)
        acc *= s
    return out[::-1]


def rows_at(indices: torch.Tensor, dims) -> torch.Tensor:
    """``indices[dims]`` (rows of an index tensor), contiguous: a view where ``dims`` are
    consecutive rows of a contiguous tensor (traced, no ``(len(dims), nse)`` copy written every
    step), else a copy (kernels such as ``_convert_indices_from_coo_to_csr`` read their input as
    contiguous).

    >>> i = torch.tensor([[0, 1], [2, 3], [4, 5]])
    >>> rows_at(i, [1, 2])._base is i, rows_at(i, [0, 2]).tolist()
    (True, [[0, 1], [4, 5]])
    """
    dims = list(dims)
    if dims and dims == list(range(dims[0], dims[0] + len(dims))):
        rows = indices[dims[0] : dims[0] + len(dims)]
        if rows.is_contiguous():
            return rows
    return indices[dims]


def linearize(indices: torch.Tensor, shape) -> torch.Tensor:
    """Row-major linear keys of the columns of ``indices`` (shape ``(len(shape), nse)``): one fused
    ``add(keys, indices[d], alpha=stride[d])`` per dim (2.5x the product-and-sum of a stride
    column)."""
    if numel(shape) > _INT64_MAX:
        raise ValueError(
            f"sparse shape {tuple(shape)} has more than 2**63 positions; cannot linearise its "
            "indices"
        )
    nse = indices.shape[1]
    if len(shape) == 0:
        return torch.zeros(nse, dtype=torch.int64, device=indices.device)
    if len(shape) == 1:
        return indices[0].to(torch.int64)
    if traced(indices):  # (symbolic sizes: the strides as a tensor)
        st = torch.tensor(strides(shape), dtype=torch.int64, device=indices.device)
        return (indices.to(torch.int64) * st[:, None]).sum(0)
    st = strides(shape)
    keys = indices[-1].to(torch.int64)
    for d in range(len(shape) - 2, -1, -1):
        keys = torch.add(keys, indices[d], alpha=st[d])
    return keys


_EXACT_MAX = 1 << 52  # positions up to which int64 keys are exact float64 values


def unravel(keys: torch.Tensor, shape) -> torch.Tensor:
    """Inverse of :func:`linearize`: indices of shape ``(len(shape), nse)``.

    On CPU (keys ``0 <= k < 2**52``) each quotient is a float64 division, floored: exact, as ``k``
    and ``s`` are exact doubles and ``k / s`` is at least ``1 / s`` from the next integer while its
    rounding error is below ``k * 2**-53 / s < 1 / (2 s)``.  3-4x ``torch.unravel_index``, whose
    int64 divisions are slow there.

    >>> unravel(torch.tensor([0, 7, 11]), (3, 4)).tolist()
    [[0, 1, 2], [0, 3, 3]]
    """
    if len(shape) == 0:
        return keys.new_zeros((0, keys.numel()))
    if len(shape) == 1:
        return keys[None]
    if traced(keys):
        return torch.stack(torch.unravel_index(keys, tuple(shape)))
    if not keys.numel():
        return keys.new_zeros((len(shape), 0))
    if keys.device.type != "cpu" or numel(shape) > _EXACT_MAX:
        return torch.stack(torch.unravel_index(keys, tuple(shape)))
    out = keys.new_empty((len(shape), keys.numel()))
    rest = keys
    for d in range(len(shape) - 1, 0, -1):
        s = int(shape[d])
        q = rest.double().div_(s).floor_().long()
        torch.sub(rest, q, alpha=s, out=out[d])
        rest = q
    out[0] = rest
    return out


def runs_to_ids(lengths: torch.Tensor, total: int) -> torch.Tensor:
    """``repeat_interleave(arange(len(lengths)), lengths)``: the run of each of ``total`` elements
    laid out in contiguous runs of ``lengths`` (zeros allowed), as a cumulative sum of run starts
    (several times faster than ``repeat_interleave`` on CPU).

    >>> runs_to_ids(torch.tensor([0, 2, 0, 1]), 3).tolist()
    [1, 1, 3]
    """
    starts = torch.zeros(total + 1, dtype=torch.int64, device=lengths.device)
    # (traced: the size may be unknown; none or one adds nothing)
    if traced(lengths) or lengths.numel() > 1:
        starts.index_add_(
            0, lengths[:-1].cumsum(0), torch.ones_like(lengths[:-1], dtype=torch.int64)
        )
    return starts[:-1].cumsum(0)


def flat_nonzero(mask: torch.Tensor) -> torch.Tensor:
    """``mask.nonzero().squeeze(1)`` of a 1-D bool ``mask``: the positions that hold True,
    ascending.  On the CPU by numpy's ``flatnonzero`` (serial, a third faster than torch's CPU
    ``nonzero`` at 1M elements).

    >>> flat_nonzero(torch.tensor([False, True, True, False])).tolist()
    [1, 2]
    """
    if mask.device.type == "cpu" and not traced(mask):
        import numpy as np

        return torch.from_numpy(np.flatnonzero(mask.numpy()).astype(np.int64, copy=False))
    return mask.nonzero().squeeze(1)


def take_columns(
    indices: torch.Tensor, pos: torch.Tensor, row: int | None = None, given=None
) -> torch.Tensor:
    """``indices.index_select(1, pos)`` for a ``(k, nse)`` index tensor, as one gather per row (on
    CPU a gather along the inner dim of a 2-D tensor takes another kernel, ~20x slower: 26 ms
    against 1.2 ms for 91k columns of a (2, 1M) tensor); row ``row`` is ``given`` instead, not
    gathered.

    >>> take_columns(torch.tensor([[0, 1, 2], [3, 4, 5]]), torch.tensor([2, 0])).tolist()
    [[2, 0], [5, 3]]
    """
    out = indices.new_empty((indices.shape[0], pos.numel()))
    for d in range(indices.shape[0]):
        if d == row:
            out[d] = given
        else:
            torch.index_select(indices[d], 0, pos, out=out[d])
    return out


def sum_duplicates(values: torch.Tensor, inverse: torch.Tensor, n: int) -> torch.Tensor:
    """``out[inverse[i]] += values[i]`` into ``n`` rows; bool adds as logical or (as torch's
    coalesce).

    ``index_put_(accumulate=True)``, not ``index_add_``: the latter multiplies by alpha and turns
    complex ``inf + 2j`` into ``inf + nanj``.
    """
    out = values.new_zeros((n,) + tuple(values.shape[1:]))
    return out.index_put_((inverse,), values, accumulate=True)


def coalesce(indices: torch.Tensor, values: torch.Tensor, shape):
    """Sort the columns of ``indices`` and sum the values of duplicates. Returns ``(indices,
    values)``.

    The keys are sorted by :func:`sort_keys` (a concatenation of a few sorted runs, as ``cat`` of
    coalesced tensors or torch's native ``A + B`` leave, merges in linear time on CPU; sorted keys
    are not moved).
    """
    keys = linearize(indices, shape)
    skeys, perm = sort_keys(keys)
    ukeys, inverse = (
        trace.unique_consecutive(skeys)
        if traced(keys)
        else torch.unique_consecutive(skeys, return_inverse=True)
    )  # (traced: inductor lowers no unique_consecutive)
    # (traced: the general path, sizes unknown)
    if not traced(keys) and ukeys.numel() == keys.numel():
        return (indices, values) if perm is None else (indices[:, perm], values[perm])
    if perm is None:
        return unravel(ukeys, shape), sum_duplicates(values, inverse, ukeys.numel())
    return unravel(ukeys, shape), sum_duplicates(values[perm], inverse, ukeys.numel())


_RUNS_MAX = (
    64  # descents from which a CPU stable sort is torch.sort, not numpy's run-merging timsort
)


def sort_keys(keys: torch.Tensor):
    """``torch.sort(keys, stable=True)`` as ``(sorted keys, perm)``; ``perm`` is None when ``keys``
    are sorted.

    On CPU, keys made of at most ``_RUNS_MAX`` ascending runs (a count of descents, O(n)) are sorted
    by numpy's stable argsort, a timsort that merges presorted runs in O(n log runs) (10x faster
    than ``torch.sort`` on two runs); elsewhere, for many runs and while traced, ``torch.sort``.

    >>> k, p = sort_keys(torch.tensor([1, 4, 9, 0, 4, 5]))
    >>> k.tolist(), p.tolist()
    ([0, 1, 4, 4, 5, 9], [3, 0, 1, 4, 5, 2])
    """
    if keys.device.type == "cpu" and not traced(keys) and keys.dim() == 1:
        descents = int((keys[1:] < keys[:-1]).sum()) if keys.numel() > 1 else 0
        if not descents:
            return keys, None
        if descents < _RUNS_MAX and keys.numel() >= 4096:
            import numpy as np

            perm = torch.from_numpy(np.argsort(keys.numpy(), kind="stable"))
            return keys.index_select(0, perm), perm
    return torch.sort(keys, stable=True)


def unique_inverse(keys: torch.Tensor):
    """``torch.unique(keys, return_inverse=True)`` (sorted), fast for a concatenation of sorted
    runs.

    On CPU, numpy's stable argsort (timsort) merges presorted runs in linear time, about 5x faster
    than ``torch.unique`` on the union of two coalesced patterns; elsewhere ``torch.unique``.
    """
    # (small: torch.unique's lower overhead)
    if keys.device.type != "cpu" or traced(keys) or keys.numel() < 4096:
        return torch.unique(keys, return_inverse=True)
    import numpy as np

    perm = torch.from_numpy(np.argsort(keys.numpy(), kind="stable"))
    # (index_select and scatter_: several times faster than [] indexing)
    skeys = keys.index_select(0, perm)
    new = torch.ones_like(skeys, dtype=torch.bool)
    torch.ne(skeys[1:], skeys[:-1], out=new[1:])
    slot = torch.cumsum(new, 0).sub_(1)
    union = skeys.new_empty(int(slot[-1]) + 1).scatter_(0, slot, skeys)
    return union, torch.empty_like(perm).scatter_(0, perm, slot)


def is_sorted_unique(keys: torch.Tensor) -> bool:
    return keys.numel() < 2 or bool((keys[1:] > keys[:-1]).all())


def lookup(sorted_keys: torch.Tensor, query: torch.Tensor):
    """Positions of ``query`` in strictly increasing ``sorted_keys``: ``(pos, found)``; pos is valid
    where found."""
    # (the size may be unknown: a sentinel past every key instead of the clamp)
    if traced(sorted_keys):
        padded = torch.cat([sorted_keys, sorted_keys.new_full((1,), _INT64_MAX)])
        pos = torch.searchsorted(padded, query)
        return pos.clamp(max=sorted_keys.shape[0] - 1).clamp_(min=0), padded[pos] == query
    if sorted_keys.numel() == 0:
        return torch.zeros_like(query), torch.zeros_like(query, dtype=torch.bool)
    pos = torch.searchsorted(sorted_keys, query).clamp_(max=sorted_keys.numel() - 1)
    return pos, sorted_keys[pos] == query
