"""Grouping: the stored elements of a pattern sorted into the slices a reduction maps them to, and
the pattern cache that keeps such a grouping while its index tensors recur (every training step).

A reduction over sparse dims ``R`` of a coalesced pattern sees each output slice ``s`` as
``count[s]`` stored elements and ``n_fill[s]`` unspecified ones (the reducer protocol,
:mod:`sparsefill._kernels.reducer`,
folds those in closed form)::

    n_fill[s] == prod(size[d] for d in R) - count[s]         seg[i] == the slice of stored element i

* :func:`group_slices` a COO pattern (``seg``, the slices' indices, ``n_fill``);
* :func:`csr_row_slices` a 2-D CSR pattern over its columns, read off the row pointers (the slices
  are contiguous runs);
* :func:`sorted_runs` the grouping step of sorted keys (also the edge softmax's plan);
* :func:`pattern_cached` any such result of index tensors, keyed by their identity and version;
  :func:`storage_cached` by their memory (a custom op's arguments under torch.compile).

Example::

    >>> import torch
    >>> seg, out, n = group_slices(torch.tensor([[0, 0, 2], [1, 3, 1]]), (3, 4), [1])
    >>> seg.tolist(), out.tolist(), n.tolist()
    ([0, 0, 1], [[0, 2]], [2, 3])
"""

from __future__ import annotations

import contextlib
import weakref

import torch

from sparsefill._kernels.trace import bincount, traced, unique_consecutive
from sparsefill._kernels.index import linearize, numel, rows_at, runs_to_ids, unravel

__all__ = ["pattern_cached", "gathered_cached", "group_slices", "sorted_runs", "csr_row_slices"]

_PATTERN_CACHE: dict = {}
_PATTERN_CACHE_SIZE = 64


def _tensor_key(t: torch.Tensor):
    """``(the tensor owning t's memory, a key of t's view and contents version)``."""
    b = t._base
    b = t if b is None else b
    return b, (
        id(b),
        t.data_ptr(),
        t.storage_offset(),
        t.shape,
        t.stride(),
        t.dtype,
        t.device,
        t._version,
    )


def pattern_cached(tag, tensors, compute):
    """``compute()``, cached for index tensors ``tensors`` (a pattern that recurs, e.g. every
    training step): keyed by ``tag`` and each tensor's identity (its memory owner, view and contents
    version: an in-place change, ``set_`` or a new tensor is a miss, never a stale hit); an entry is
    dropped when a key tensor dies, and the cache holds at most 64.  The results are shared: never
    modify them in place.  Not cached under ``torch.compile``, for tensors without storage or
    version counter.

    >>> i = torch.tensor([3, 1]); f = lambda: i.sort()[1]
    >>> pattern_cached("sort", (i,), f) is pattern_cached("sort", (i,), f)
    True
    >>> i[0] = 0; pattern_cached("sort", (i,), f).tolist()     # changed in place: recomputed
    [0, 1]
    """
    try:
        if torch.compiler.is_compiling():
            return compute()
        key, bases = [tag], []
        for t in tensors:
            b, k = _tensor_key(t)
            bases.append(b)
            key.append(k)
    except (
        RuntimeError,
        NotImplementedError,
        AttributeError,
    ):  # inference tensors, tensors without storage
        return compute()
    key = tuple(key)
    hit = _PATTERN_CACHE.get(key)
    if hit is not None:
        for r, b in zip(hit[0], bases):
            if r() is not b:
                break
        else:
            return hit[1]
    out = compute()
    if len(_PATTERN_CACHE) >= _PATTERN_CACHE_SIZE:
        _PATTERN_CACHE.pop(next(iter(_PATTERN_CACHE)), None)
    # (safe at exit)
    drop = lambda _ref, key=key, cache=_PATTERN_CACHE: cache.pop(key, None)
    _PATTERN_CACHE[key] = ([weakref.ref(b, drop) for b in bases], out)
    return out


def _storage_key(t: torch.Tensor) -> tuple:
    return (
        t.untyped_storage()._cdata,
        t.storage_offset(),
        tuple(t.shape),
        t.stride(),
        t.dtype,
        t.device,
        t._version,
    )


# Keyed by the memory (storage) of the tensors, not their objects: a compiled graph hands a custom
# op new views of its inputs every call, which :func:`pattern_cached` (keyed by the base tensor)
# takes for a new pattern.  A weak reference keeps a storage's address from being reused while its
# entry exists (an expired one is a miss), and views share their base's version counter (an
# in-place change: a miss).  Small: what it holds is as large as a pattern.
_STORAGE_CACHE: dict = {}
_STORAGE_CACHE_SIZE = 8


def storage_cached(tag, tensors, compute):
    """``compute()``, cached for the memory of ``tensors`` (a custom op's arguments: views made anew
    each call of a compiled graph).  Not cached (computed) for inference tensors, which have no
    version counter.

    >>> i = torch.tensor([3, 1]); f = lambda: i.sort()[1]
    >>> storage_cached("sort", (i[:],), f) is storage_cached("sort", (i[:],), f)
    True
    """
    from torch.multiprocessing.reductions import StorageWeakRef

    try:
        key = (tag,) + tuple(_storage_key(t) for t in tensors)
    except RuntimeError:
        return compute()
    hit = _STORAGE_CACHE.get(key)
    if hit is not None and not any(r.expired() for r in hit[0]):
        return hit[1]
    for k in [k for k, (refs, _) in _STORAGE_CACHE.items() if any(r.expired() for r in refs)]:
        del _STORAGE_CACHE[k]  # (a pattern gone: what it kept freed)
    if len(_STORAGE_CACHE) >= _STORAGE_CACHE_SIZE:
        _STORAGE_CACHE.pop(next(iter(_STORAGE_CACHE)))
    out = compute()
    _STORAGE_CACHE[key] = ([StorageWeakRef(t.untyped_storage()) for t in tensors], out)
    return out


_KEEP_VALUES = [True]


@contextlib.contextmanager
def values_not_kept():
    """No :func:`gathered_cached` copies while inside: for products whose sparse operand needs a
    gradient, seen inside dispatch as a plain pattern."""
    old, _KEEP_VALUES[0] = _KEEP_VALUES[0], False
    try:
        yield
    finally:
        _KEEP_VALUES[0] = old


def kept_values_owner(A: torch.Tensor):
    """The tensor whose reordered copies :func:`gathered_cached` may keep for the SparseTensor
    ``A``: its stored values, or None where ``A`` needs a gradient (its values change every
    optimizer step, and gradcheck perturbs them through ``.data``, which no version counter
    sees)."""
    return A._vals if _KEEP_VALUES[0] and not A.requires_grad else None


def gathered_cached(values: torch.Tensor, perm: torch.Tensor, tag, tensors, owner=None):
    """``values.index_select(0, perm)``, kept beside the pattern ``tensors`` while ``owner`` (the
    stored values ``values`` is read from, see :func:`kept_values_owner`; None: never kept) is the
    same unchanged tensor: the transpose of a constant data matrix (``X.t() @ G`` in every training
    step) then reorders its values once.  One slot per pattern, so new or changed values replace the
    kept copy instead of adding one.

    >>> v, p = torch.tensor([1., 2., 3.]), torch.tensor([2, 0, 1]); i = torch.tensor([0, 1, 2])
    >>> gathered_cached(v, p, "t", (i,), v) is gathered_cached(v, p, "t", (i,), v)
    True
    """
    if owner is None or owner.requires_grad:
        return values.index_select(0, perm)
    slot = pattern_cached(("gathered",) + tuple(tag), tensors, dict)
    # The memory and version of the stored values, not the objects: autograd unpacks a saved tensor
    # as a new alias each step, and a view made inside dispatch has a version counter of its own.
    try:
        key = (
            owner.data_ptr(),
            owner.storage_offset(),
            owner.shape,
            owner.stride(),
            owner.dtype,
            owner.device,
            owner._version,
            values.data_ptr(),
            values.shape,
            values.stride(),
        )
    except (RuntimeError, NotImplementedError, AttributeError):  # no storage or version counter
        return values.index_select(0, perm)
    if slot.get("key") == key and slot["perm"] is perm:
        return slot["out"]
    out = values.index_select(0, perm)
    # (the slot holds ``owner``: its memory cannot be freed and reused under the same key)
    slot.update(owner=owner, key=key, perm=perm, out=out)
    return out


def group_slices(indices: torch.Tensor, sparse_shape, dims):
    """Group the stored elements of a COO pattern by the slice that reducing sparse ``dims`` maps
    them to.

    ``indices`` (shape ``(len(sparse_shape), k)``) must be coalesced (no duplicates).  Returns
    ``(seg, out_indices, n_fill)``: stored element ``i`` lands in output slice ``seg[i]``; the ``S``
    slices that hold a stored element have indices ``out_indices`` (shape ``(ndim - len(dims), S)``,
    sorted row-major) over the kept dims; ``n_fill[s] = prod(sparse_shape[d] for d in dims) -
    count[s]`` is the number of unspecified elements of slice ``s``.  Slices absent from
    ``out_indices`` hold only unspecified elements (``prod(...)`` of them).

    >>> seg, out, n = group_slices(torch.tensor([[0, 0, 2], [1, 3, 1]]), (3, 4), [1])
    >>> seg.tolist(), out.tolist(), n.tolist()
    ([0, 0, 1], [[0, 2]], [2, 3])
    """
    dims = sorted(d % len(sparse_shape) for d in dims) if len(sparse_shape) else []
    shape = tuple(int(n) for n in sparse_shape)
    return pattern_cached(
        ("group_slices", shape, tuple(dims)),
        (indices,),
        lambda: _group_slices(indices, shape, dims),
    )


# compiled: unsorted slice keys grouped by a count over every key up to this many
_COUNTED_KEYS = 1 << 24


def _group_slices(indices, sparse_shape, dims):
    keep = [d for d in range(len(sparse_shape)) if d not in dims]
    keep_shape = [sparse_shape[d] for d in keep]
    keys = linearize(rows_at(indices, keep), keep_shape)
    nk = numel(keep_shape)
    # compiled: counted, no sort
    if keep != list(range(len(keep))) and traced(keys) and nk <= _COUNTED_KEYS:
        counts = bincount(keys, nk)
        nonempty = counts > 0
        out_keys = nonempty.nonzero().squeeze(1)
        # (the rank of its key among the non-empty ones)
        seg = (torch.cumsum(nonempty, 0) - 1)[keys]
        counts = counts[out_keys]
    elif keep != list(range(len(keep))):
        out_keys, seg, counts = torch.unique(
            keys, sorted=True, return_inverse=True, return_counts=True
        )
    else:  # reduced dims trail: keys already sorted (coalesced order)
        out_keys, seg, counts = sorted_runs(keys, nk)
    n_fill = numel([sparse_shape[d] for d in dims]) - counts
    return seg, unravel(out_keys, keep_shape), n_fill


def sorted_runs(keys: torch.Tensor, num_keys: int):
    """``(out_keys, seg, counts)`` of sorted slice keys in ``[0, num_keys)``: the distinct keys, the
    run of every element and the run lengths (a CSR compression of the keys in a small range, else
    ``unique_consecutive``).  The grouping step of :func:`group_slices` and of the edge softmax's
    plan.

    >>> [t.tolist() for t in sorted_runs(torch.tensor([1, 1, 4]), 6)]
    [[1, 4], [0, 0, 1], [2, 1]]
    """
    k = keys.numel()
    if 0 < num_keys <= 4 * k + 4096:  # run lengths off a CSR compression
        # (contiguous: torch's kernel reads a strided row of an index tensor as if it were not)
        counts = torch.diff(torch._convert_indices_from_coo_to_csr(keys.contiguous(), num_keys))
        nonempty = counts > 0
        out_keys = nonempty.nonzero().squeeze(1)
        lengths = counts[out_keys]
        if traced(keys):  # (a key's rank among the non-empty ones: no pass that writes k ids)
            seg = (torch.cumsum(nonempty, 0) - 1)[keys]
        else:
            seg = keys if out_keys.numel() == num_keys else runs_to_ids(lengths, k)
        return out_keys, seg, lengths
    if traced(keys):  # (inductor lowers no unique_consecutive)
        return unique_consecutive(keys, return_counts=True)
    return torch.unique_consecutive(keys, return_inverse=True, return_counts=True)


def csr_row_slices(counts: torch.Tensor, ncols, all_rows: bool = False):
    """:func:`group_slices` of a 2-D CSR pattern over its columns, read off its row lengths
    ``counts`` (``crow.diff()``): ``(out_indices, n_fill, lengths)`` of the non-empty rows
    (``all_rows``: every row). The slices are the contiguous runs of ``lengths`` (``seg =
    runs_to_ids(lengths, k)``; with every row, each stored element's row).

    >>> [t.tolist() for t in csr_row_slices(torch.tensor([2, 0, 1]), 4)]
    [[[0, 2]], [2, 3], [2, 1]]
    """
    if all_rows:
        return torch.arange(counts.numel(), device=counts.device)[None], ncols - counts, counts
    rows = counts.nonzero().reshape(1, -1)
    lengths = counts[rows[0]]
    return rows, ncols - lengths, lengths
