"""Conversion kernels: SparseTensor <-> dense, COO <-> CSR, torch native sparse.

The kernels here carry no autograd; the public, differentiable entry points wrap
them in the Functions of ``_autograd/functions.py``.  Invariant of every kernel::

    dense_of(kernel(A)) == dense_of(A)
"""

from __future__ import annotations

import sys

import torch

from sparsefill._kernels import index as _index, merge as _merge
from sparsefill._kernels.trace import bincount, traced
from sparsefill._kernels.grouping import pattern_cached
from sparsefill._tensor.tensor import SparseTensor


def rewrap(A: SparseTensor, **changes) -> SparseTensor:
    """A new SparseTensor sharing ``A``'s inner tensors, with ``changes`` applied (no autograd)."""
    kw = dict(
        indices=A._idx, crow=A._crow, col=A._col, indefinite=A._indefinite, coalesced=A._coalesced
    )
    kw.update(changes)
    if "known_zero" not in kw:
        kw["known_zero"] = A._fill_is_zero()
    # (A.shape only when no size is given: a __torch_function__ hop)
    size = kw.pop("size") if "size" in kw else A.shape
    values = kw.pop("values", A._vals)
    fill = kw.pop("fill", A._fill)
    layout = kw.pop("layout", A._sf_layout)
    return SparseTensor(layout, size, values, fill, **kw)


def pattern_mask(A: SparseTensor) -> SparseTensor:
    """True at ``A``'s specified elements, False elsewhere: ``A``'s pattern, values one True
    expanded (no memory per element), fill False.

    >>> import sparsefill
    >>> dense_of(pattern_mask(sparsefill.sparse_coo_tensor([[1]], [7.], (3,)))).tolist()
    [False, True, False]
    """
    v = torch.ones((), dtype=torch.bool, device=A._vals.device).expand(A._vals.shape)
    return rewrap(
        A,
        values=v,
        fill=torch.zeros((), dtype=torch.bool, device=A._vals.device),
        indefinite=False,
        known_zero=True,
    )


def dense_of(
    A: SparseTensor, fill: torch.Tensor | None = None, *, eager: bool = False
) -> torch.Tensor:
    """The dense tensor ``A`` stands for; ``fill`` replaces ``A``'s fill (needed when it is
    indefinite); ``eager=True``: the caller found that nothing traces (:func:`traced` is False), not
    asked again.

    ``out = fill expanded; out.view(-1, *dense_shape)[keys] = values`` with the linear keys of
    :func:`linear_parts` (a coalesced 1-D COO pattern's indices are its keys; sorted).  On CPU with
    numba, one torch thread (or a result under ``_PARALLEL_FILL_MIN`` elements), a scalar fill and
    at most a quarter of the positions stored: one compiled pass, block by block
    (:func:`_kernels.merge.fill_put_sorted`).  Otherwise ``fill_``/``copy_``, then ``put_`` into the
    flat buffer (:func:`_kernels.merge.put_flat`: a compiled loop on CPU, at any density: 0.7x
    ``index_copy_``'s time at half the positions stored) while the stored elements are at most a
    quarter of the positions or the compiled loop applies; ``index_copy_`` otherwise, for hybrid
    tensors and under deterministic algorithms.

    >>> import sparsefill
    >>> dense_of(sparsefill.sparse_coo_tensor([[1, 3]], [7., 8.], (5,), fill_value=-1.)).tolist()
    [-1.0, 7.0, -1.0, 8.0, -1.0]
    """
    if fill is None:
        if A._indefinite:
            raise ValueError(
                "to_dense() of a SparseTensor with indefinite fill: its unspecified elements "
                "have no value; pass to_dense(fill_value=...) to give them one"
            )
        fill = A._fill
    shape, vals, idx = A._size, A._vals, A._idx  # (A._size: A.shape without the op layer's route)
    nd = len(shape)
    # (new_empty: cheaper than torch.empty(dtype=, device=); of an int or a tuple, cheaper than of
    # a Size)
    out = fill.new_empty(shape[0] if nd == 1 else tuple(shape))
    numel, vd = out.numel(), vals.dim()
    if type(out) is _TENSOR and numel * out.itemsize >= _HUGE_MIN:  # (no fake or functional tensor)
        # (called only then: a Python call on this per-call path is not free)
        _advised(out)
    k = nd - vd + (1 if idx is not None else A._col.dim())  # sparse dims
    if k == 1 == nd and A._coalesced and idx.dtype is _INT64:
        keys = idx  # (one sparse dim: the indices are the keys; put_ reads them flat)
    # compiled: duplicates add in place (a coalesce's nse is data)
    elif not A._coalesced and traced(vals):
        out.copy_(fill) if fill.dim() else out.fill_(fill)
        keys = _index.linearize(A._coo_parts()[0], shape[:k])
        flat = out.view((_index.numel(shape[:k]),) + tuple(shape[k:]))
        flat.index_fill_(0, keys, 0).index_put_(
            (keys,), vals.reshape((-1,) + tuple(shape[k:])), accumulate=True
        )
        return out
    else:
        keys, vals = linear_parts(A, shape[:k])
        vd = vals.dim()  # (a batched CSR's values: flat)
    # (while traced, nse may be unbacked: no comparison)
    plain = vd == 1 and (eager or not traced(vals))
    # (numel(), not shape[0]: cheaper)
    quarter = plain and vals.numel() * 4 <= numel
    if (
        quarter
        and (numel < _PARALLEL_FILL_MIN or _num_threads() == 1)
        and (_merge._kernels or "numba" in sys.modules or numel >= _merge._FILL_BLOCK)
        and _merge.fill_put_sorted(out, fill, keys, vals)
    ):
        return out
    out.copy_(fill) if fill.dim() else out.fill_(fill)
    if (
        plain
        and not torch.are_deterministic_algorithms_enabled()
        and (
            quarter
            or vals.shape[0] >= _merge._SCATTER_MIN
            and vals.is_cpu
            and vals.dtype in _merge._SCATTER_DTYPES
            and _merge._compiled()
        )
    ):
        return _merge.put_flat(out, keys, vals)
    keys = keys.view(-1)
    # (a view only where needed: it has a per-call cost)
    flat = out if k == 1 else out.view((_index.numel(shape[:k]),) + tuple(shape[k:]))
    signed = _SIGNED_VIEW.get(vals.dtype)
    # (torch has no index_copy_ kernel for uint16/32/64: their bits, as signed)
    if signed is not None:
        flat, vals = flat.view(signed), vals.view(signed)
    flat.index_copy_(0, keys, vals)
    return out


_SIGNED_VIEW = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}


# elements from which fill_ on several torch threads goes before the one-thread pass
_PARALLEL_FILL_MIN = 1 << 18
# (bound here: ``torch.x`` looks x up in torch's module dict on every call)
_TENSOR, _INT64, _num_threads = torch.Tensor, torch.int64, torch.get_num_threads


# bytes from which a dense result's memory is advised into 2 MiB pages (numpy's bound)
_HUGE_MIN = 1 << 22
_madvise = None  # libc's madvise (Linux), or False


def empty_dense(shape, dtype, device) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype, device=device)``; on Linux CPU, a buffer of at least 4 MiB
    is advised into transparent huge pages before it is first written (``madvise(MADV_HUGEPAGE)``,
    as numpy does for its arrays): writing a fresh buffer then takes one page fault per 2 MiB
    instead of one per 4 KiB (3.6x faster to fill at 64 MB).  A hint: where the kernel keeps huge
    pages off, nothing changes.

    >>> empty_dense((2, 3), torch.float32, torch.device("cpu")).shape
    torch.Size([2, 3])
    """
    return _advised(torch.empty(shape, dtype=dtype, device=device))


def _advised(out: torch.Tensor) -> torch.Tensor:
    """``out``, a fresh buffer, advised into huge pages when it is a CPU buffer of at least
    ``_HUGE_MIN`` bytes."""
    # (not fake)
    if type(out) is torch.Tensor and out.is_cpu and out.nbytes >= _HUGE_MIN and not traced(out):
        _advise_huge(out.data_ptr(), out.nbytes)
    return out


def _advise_huge(ptr: int, nbytes: int) -> None:
    global _madvise
    if _madvise is None:
        _madvise = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                f = ctypes.CDLL(None, use_errno=True).madvise
                f.argtypes, f.restype = (
                    [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int],
                    ctypes.c_int,
                )
                _madvise = f
            except (OSError, AttributeError):  # pragma: no cover - no libc madvise
                pass
    start, end = (ptr + 4095) & ~4095, (ptr + nbytes) & ~4095  # whole pages inside the buffer
    if _madvise and end - start >= _HUGE_MIN:
        _madvise(start, end - start, 14)  # MADV_HUGEPAGE; an error (huge pages off) changes nothing


def linear_parts(A: SparseTensor, S=None):
    """``(linear keys, values)`` of ``A`` coalesced: ``keys == linearize(coalesced_parts(A)[0])``.

    The keys of a coalesced COO pattern with several sparse dims, or of a CSR pattern, are cached
    per pattern (:func:`pattern_cached`: an in-place change of the index tensors is a miss), not
    while traced.

    >>> import sparsefill
    >>> A = sparsefill.sparse_coo_tensor([[1, 0], [2, 0]], [1., 2.], (2, 3))
    >>> linear_parts(A)[0].tolist()
    [0, 5]
    """
    S = A._sparse_shape if S is None else S
    cache = len(S) > 1 and (A._sf_layout is torch.sparse_csr or A._coalesced)
    if (
        cache
        and (A._crow is None or A._crow.dim() == 1)
        and not traced(A._vals)
        and A._vals.shape[0] <= _CSR_INDEX_CACHE_MAX
    ):
        index = (A._idx,) if A._sf_layout is torch.sparse_coo else (A._crow, A._col)
        keys = pattern_cached(
            ("linear_keys", tuple(S)), index, lambda: _index.linearize(A._coo_parts()[0], S)
        )
        return keys, A._vals
    idx, vals = coalesced_parts(A)
    return _index.linearize(idx, S), vals


_CSR_INDEX_CACHE_MAX = 1 << 22  # stored elements of a CSR whose COO indices are cached (64 MB)


def coalesced_parts(A: SparseTensor):
    """``(indices, values)`` over all non-dense dims, sorted with no duplicates."""
    if (
        A._sf_layout is torch.sparse_csr
        and A._crow.dim() == 1
        and not traced(A._col)
        and A._col.numel() <= _CSR_INDEX_CACHE_MAX
    ):
        # the same index tensors for the same pattern (kept while its crow/col live: 16 bytes per
        # element)
        idx = pattern_cached("csr_indices", (A._crow, A._col), lambda: A._coo_parts()[0])
        return idx, A._vals
    idx, vals = A._coo_parts()
    return (idx, vals) if A._coalesced else _index.coalesce(idx, vals, A._sparse_shape)


def map_inner(A: SparseTensor, values_fn, index_fn=lambda t: t) -> SparseTensor:
    """A new SparseTensor with ``values_fn`` applied to values and fill, ``index_fn`` to the index
    tensors.

    ``values_fn`` must commute with summing duplicates (linear), or ``A`` must be coalesced.
    """
    ix = {
        n: index_fn(getattr(A, "_" + n))
        for n in ("idx", "crow", "col")
        if getattr(A, "_" + n) is not None
    }
    return rewrap(
        A,
        values=values_fn(A._vals),
        fill=values_fn(A._fill),
        indices=ix.get("idx"),
        crow=ix.get("crow"),
        col=ix.get("col"),
    )


def union_parts(tensors):
    """Merge SparseTensors of one sparse shape by linear keys: ``(indices of the union, [each one's
    values there])`` (dense shapes may differ).

    Where a tensor does not specify a position its fill stands in; positions an indefinite tensor
    leaves unspecified are dropped (they are unspecified in any result).  One linear-time merge of
    the sorted key runs (:func:`_kernels.merge.union_inverse`; two indefinite tensors:
    :func:`_kernels.merge.merge_intersect`) and a scatter per tensor (values and indices: no
    division to unravel the keys).
    """
    S = tensors[0]._sparse_shape
    parts = [coalesced_parts(T) for T in tensors]
    keys = [_index.linearize(i, S) for i, _ in parts]
    if (
        len(tensors) == 2
        and tensors[0]._indefinite
        and tensors[1]._indefinite
        and not traced(keys[0])
    ):
        _, ia, ib = _merge.merge_intersect(*keys)  # (only the positions both specify)
        return parts[0][0].index_select(1, ia), [
            parts[0][1].index_select(0, ia),
            parts[1][1].index_select(0, ib),
        ]
    union, inverse = _union_of(keys)
    U = union.numel()
    one_dim = len(S) == 1 and parts[0][0].dtype == union.dtype  # (the keys are the indices)
    # a pattern that is the union (e.g. a gradient beside the smaller pattern of the forward): its
    # parts as stored
    # (U: unbacked)
    whole = [False] * len(parts) if traced(keys[0]) else [i.shape[1] == U for i, _ in parts]
    indices = (
        union[None]
        if one_dim
        else parts[whole.index(True)][0]
        if any(whole)
        else parts[0][0].new_empty((len(S), U))
    )
    values, keep = [], None
    for T, (i, v), inv, same in zip(tensors, parts, inverse, whole):
        if same:
            values.append(v)
            continue
        for d in range(0 if one_dim or any(whole) else len(S)):
            indices[d].scatter_(0, inv, i[d])
        full = (
            (v.new_zeros(()) if T._indefinite else T._fill)
            .expand((U,) + tuple(T._dense_shape))
            .clone()
        )
        full.index_copy_(0, inv, v)
        values.append(full)
        if T._indefinite:
            present = torch.zeros(U, dtype=torch.bool, device=union.device)
            present[inv] = True
            keep = present if keep is None else keep & present
    if keep is not None:
        indices, values = indices[:, keep], [v[keep] for v in values]
    return indices, values


def _union_of(keys):
    """``_merge.union_inverse(keys)``; two runs through ``_kernels.merge.union_or_superset`` (where
    one holds every key of a much smaller one, a gradient beside the forward's pattern say, no
    merge: the large run's positions, the identity, are None)."""
    if len(keys) == 2 and not any(traced(k) for k in keys) and keys[0].device.type != "meta":
        union, pa, pb = _merge.union_or_superset(*keys)
        return union, [pa, pb]
    return _merge.union_inverse(keys)


def scalar_parts(
    idx: torch.Tensor, vals: torch.Tensor, dense_shape
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stored dense slices as scalar elements: ``(indices over all dims (nse * Q columns), values
    (nse * Q,))``, ``Q = prod(dense_shape)``, in row-major order (coalesced parts stay
    coalesced)."""
    D = tuple(dense_shape)
    if not D:
        return idx, vals.reshape(-1)
    Q = _index.numel(D)
    q = _index.unravel(torch.arange(Q, device=idx.device), D)
    return torch.cat([idx.repeat_interleave(Q, dim=1), q.repeat(1, idx.shape[1])]), vals.reshape(-1)


def coalesce_of(A: SparseTensor) -> SparseTensor:
    idx, vals = coalesced_parts(A)
    return rewrap(A, indices=idx, values=vals, coalesced=True)


def prune_of(A: SparseTensor, atol: float) -> SparseTensor:
    """``A`` without the stored elements (dense slices) within ``atol`` of the fill."""
    if A._indefinite:
        return A
    idx, vals = coalesced_parts(A)
    f = A._fill.expand(vals.shape[1:])
    same = (
        torch.isclose(vals, f, rtol=0, atol=atol, equal_nan=True)
        if vals.dtype.is_floating_point or vals.dtype.is_complex
        else vals == f
    )
    keep = ~same.flatten(1).all(1) if vals.dim() > 1 else ~same
    return parts_to_sparse(
        idx[:, keep],
        vals[keep],
        A.shape,
        A._fill,
        known_zero=A._fill_is_zero(),
        layout=A._sf_layout,
        coalesced=True,
    )


def values_at(S, keys: torch.Tensor, sdim: int) -> torch.Tensor:
    """Dense-semantics values of ``S`` (SparseTensor or dense) at linear positions ``keys`` of its
    first ``sdim`` dims."""
    if not isinstance(S, SparseTensor):
        return S.reshape((_index.numel(S.shape[:sdim]),) + tuple(S.shape[sdim:]))[keys]
    idx, vals = coalesced_parts(S)
    pos, found = _index.lookup(_index.linearize(idx, S._sparse_shape), keys)
    D = tuple(S._dense_shape)
    # (sizes may be unknown: one extra row, read where nothing is found; a runtime check)
    if traced(vals):
        if S._indefinite:
            torch._assert_async(
                found.all(), "values_at: a position is unspecified in a tensor with indefinite fill"
            )
        got = torch.cat([vals, vals.new_zeros((1,) + D)])[torch.where(found, pos, vals.shape[0])]
        return (
            got if S._indefinite else torch.where(found.view((-1,) + (1,) * len(D)), got, S._fill)
        )
    if S._indefinite:
        if not bool(found.all()):
            raise ValueError(
                "values_at: a position is unspecified in a tensor with indefinite fill"
            )
        return vals[pos]
    got = vals[pos] if vals.shape[0] else vals.new_zeros((keys.numel(),) + D)
    return torch.where(found.view((-1,) + (1,) * len(D)), got, S._fill)


def every_element(A: SparseTensor) -> tuple[torch.Tensor, torch.Tensor]:
    """COO indices and values of every element of ``A`` (all stored, coalesced): a result dense by
    nature kept in ``A``'s form, O(numel)."""
    S = A._sparse_shape
    idx = _index.unravel(torch.arange(_index.numel(S), device=A.device), S)
    return idx, dense_of(A).reshape((-1,) + tuple(A._dense_shape))


def dense_to_parts(
    x: torch.Tensor, fill: torch.Tensor, indefinite: bool, dense_dim: int, zero: bool = False
):
    """Indices and values of exactly the elements (dense slices) of ``x`` that differ from ``fill``.

    NaN equals NaN here, so a NaN fill leaves NaN elements unspecified.  ``zero``: the fill is
    known to be zero, so ``x.nonzero()`` finds the elements in one pass, as torch's ``to_sparse``.
    """
    sdim = x.dim() - dense_dim
    if (
        sdim
        and not (dense_dim or indefinite)
        and (found := _merge.find_differ(x, fill)) is not None
    ):
        keys, vals = found  # (CPU: two compiled passes, no nonzero)
        return _index.unravel(keys, x.shape), vals
    if zero and sdim and not dense_dim:
        idx = x.nonzero().T.contiguous()
        return idx, x[tuple(idx)]
    if indefinite:
        differ = torch.ones(x.shape[:sdim], dtype=torch.bool, device=x.device)
    elif (x.is_complex() or x.is_floating_point()) and bool(fill.isnan().any()):  # NaN == NaN
        differ = differs(x, fill)
    else:
        differ = x != fill
    if dense_dim and not indefinite:
        differ = differ.flatten(sdim).any(-1)
    idx = differ.nonzero().T.contiguous()
    return idx, (x[tuple(idx)] if sdim else x[differ])  # gather nse rows, not a second pass over x


def differs(f: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``f != c`` element-wise, NaN equal to NaN (component by component for complex).

    >>> differs(torch.tensor([1., float('nan'), 2.]), torch.tensor(float('nan'))).tolist()
    [True, False, True]
    """
    if f.is_complex():
        return differs(torch.view_as_real(f), torch.view_as_real(c.expand(f.shape))).any(-1)
    if f.is_floating_point():
        return ~((f == c) | (f.isnan() & c.isnan()))
    return f != c


def parts_to_sparse(
    idx,
    vals,
    shape,
    fill,
    *,
    indefinite: bool = False,
    known_zero: bool = False,
    layout: torch.layout = torch.sparse_coo,
    coalesced: bool = False,
) -> SparseTensor:
    """SparseTensor of ``layout`` from COO parts over all non-dense dims (sorted for CSR);
    ``known_zero``: the fill is known to be 0 (a host-side hint), ``coalesced``: ``idx`` is sorted
    and unique."""
    if layout is torch.sparse_coo:
        return SparseTensor(
            layout,
            shape,
            vals,
            fill,
            indices=idx,
            indefinite=indefinite,
            coalesced=coalesced,
            known_zero=known_zero,
        )
    sdim = idx.shape[0]
    if sdim < 2:
        raise ValueError(
            f"a sparse_csr tensor needs at least 2 sparse dims, got {sdim} (shape {tuple(shape)})"
        )
    if not coalesced:
        idx, vals = _index.coalesce(idx, vals, shape[:sdim])
    batch, (m, n) = tuple(shape[: sdim - 2]), tuple(shape[sdim - 2 : sdim])
    nb = _index.numel(batch)
    keys = _index.linearize(idx, shape[:sdim])
    bkey = keys // (m * n) if m * n else keys
    counts = bincount(bkey, nb) if nb else bkey.new_zeros(0)
    # equal nse per batch: pad with fill-valued elements
    if nb > 1 and bool((counts != counts.max()).any()):
        if indefinite:
            raise ValueError(
                "a batched sparse_csr tensor needs the same nse in every batch; with an indefinite "
                f"fill it cannot be padded (nse per batch: {counts.tolist()[:8]}...)"
            )
        extra = _pad_keys(keys, counts, m * n)
        keys, pk, pe = _merge.merge_union(keys, extra)  # (disjoint sorted runs: a linear merge)
        merged = vals.new_empty((keys.numel(),) + tuple(vals.shape[1:]))
        merged[pk], merged[pe] = vals, fill
        vals = merged
    per = keys.numel() // nb if nb else 0
    cols = keys % n if n else keys
    crow = keys.new_zeros(nb, m + 1)
    if nb and m:
        crow[:, 1:] = bincount(keys // n if n else keys, nb * m).view(nb, m).cumsum(1)
    return SparseTensor(
        layout,
        shape,
        vals.reshape(batch + (per,) + tuple(vals.shape[1:])),
        fill,
        crow=crow.reshape(batch + (m + 1,)),
        col=cols.reshape(batch + (per,)),
        indefinite=indefinite,
        known_zero=known_zero,
    )


def _pad_keys(keys, counts, per_batch):
    """Keys of unspecified positions that bring every batch up to ``counts.max()`` elements.

    Candidates are the first ``max`` positions of each batch: at most ``count[b]`` of them
    are taken, so at least the deficit is free.  O(nb * max), no densifying.
    """
    nb, mx = counts.numel(), int(counts.max())
    cand = (
        torch.arange(nb, device=keys.device)[:, None] * per_batch
        + torch.arange(mx, device=keys.device)[None, :]
    )
    free = ~_index.lookup(keys, cand.reshape(-1))[1].view(nb, mx)
    take = free & (free.cumsum(1) <= (mx - counts)[:, None])
    return cand[take]


def to_layout(A: SparseTensor, layout) -> SparseTensor:
    """Same fill and dense dims, other storage layout; the pattern is kept (CSR batches may gain
    fill-valued elements)."""
    if layout is A._sf_layout:
        return A
    if layout not in (torch.sparse_coo, torch.sparse_csr):
        raise ValueError(
            f"sparsefill layouts are torch.sparse_coo and torch.sparse_csr, got {layout}"
        )
    idx, vals = A._coo_parts() if layout is torch.sparse_coo else coalesced_parts(A)
    return parts_to_sparse(
        idx,
        vals,
        A.shape,
        A._fill,
        indefinite=A._indefinite,
        known_zero=A._fill_is_zero(),
        layout=layout,
        coalesced=A._coalesced,
    )


def dense_to_sparse(x, fill, indefinite, known_zero, layout, dense_dim) -> SparseTensor:
    idx, vals = dense_to_parts(x, fill, indefinite, dense_dim, known_zero and not indefinite)
    return parts_to_sparse(
        idx,
        vals,
        x.shape,
        fill,
        indefinite=indefinite,
        known_zero=known_zero,
        layout=layout,
        coalesced=True,
    )


def check_dense_dim(ndim: int, dense_dim, layout) -> int:
    dense_dim = 0 if dense_dim is None else dense_dim
    if not isinstance(dense_dim, int) or not 0 <= dense_dim <= ndim:
        raise ValueError(
            f"dense_dim must be an int in [0, {ndim}] for a {ndim}-d tensor, got {dense_dim!r}"
        )
    if layout is torch.sparse_csr and ndim - dense_dim < 2:
        raise ValueError(
            f"layout=torch.sparse_csr needs at least 2 sparse dims: a {ndim}-d tensor with "
            f"dense_dim={dense_dim} has {ndim - dense_dim}"
        )
    if layout not in (torch.sparse_coo, torch.sparse_csr):
        raise ValueError(f"layout must be torch.sparse_coo or torch.sparse_csr, got {layout}")
    return dense_dim


def to_torch(A: SparseTensor, *, materialize: bool = False) -> torch.Tensor:
    """Torch native sparse tensor (zero fill) of ``A``'s layout.

    Native sparse tensors have zero fill: a nonzero fill raises ``ValueError`` unless
    ``materialize=True``, which specifies every element equal to the fill (O(numel)).
    """
    if A._indefinite:
        raise ValueError(
            "to_torch(): the fill is indefinite and torch native sparse tensors have zero fill; "
            "define the unspecified elements first, e.g. "
            "A.to_sparse(fill_value=0).to_torch(materialize=True)"
        )
    if not bool(A._fill.any()):  # exact here: a cache can't see writes through .data
        if A._sf_layout is torch.sparse_coo:
            return torch.sparse_coo_tensor(A._idx, A._vals, A.shape, is_coalesced=A._coalesced)
        return torch.sparse_csr_tensor(A._crow, A._col, A._vals, A.shape)
    if not materialize:
        fill = (
            A._fill.tolist() if A._fill.numel() <= 8 else f"tensor of shape {tuple(A._fill.shape)}"
        )
        raise ValueError(
            f"to_torch(): fill value {fill} is not zero and torch native sparse tensors have zero "
            "fill; pass materialize=True to specify every element (O(numel) memory)"
        )
    check_densify_quiet(A, "to_torch(materialize=True)")
    return dense_of(A).to_sparse(layout=A._sf_layout, dense_dim=A.dense_dim())


def from_native(t: torch.Tensor, checked: bool = False) -> SparseTensor:
    """SparseTensor (zero fill) sharing the storage of a torch native sparse tensor.  ``checked``:
    ``t`` comes from a user (torch does not check the sparse tensors it loads unless told to), so
    its parts are checked (``_creation.check_parts``, O(nse)) before any kernel indexes memory with
    them."""
    zero = torch.zeros((), dtype=t.dtype, device=t.device)
    if t.layout not in (torch.sparse_coo, torch.sparse_csr):
        t = t.to_sparse_coo()
    if t.layout is torch.sparse_coo:
        out = SparseTensor(
            torch.sparse_coo,
            t.shape,
            t._values(),
            zero,
            indices=t._indices(),
            coalesced=t.is_coalesced(),
            known_zero=True,
        )
    else:
        out = SparseTensor(
            torch.sparse_csr,
            t.shape,
            t.values(),
            zero,
            crow=t.crow_indices().to(torch.int64),
            col=t.col_indices().to(torch.int64),
            known_zero=True,
        )
    if checked:
        from sparsefill._tensor.validate import check_parts

        try:
            check_parts(
                out._sf_layout,
                out.shape,
                out._vals,
                out._fill,
                out._idx,
                out._crow,
                out._col,
                coalesced=out._coalesced,
            )
        except (ValueError, TypeError, IndexError) as e:
            raise ValueError(
                f"a torch {t.layout} tensor with invalid parts (size {tuple(t.shape)}): {e}"
            ) from None
    return out


def convert_fill(A: SparseTensor, fill, indefinite, known_zero, layout, dense_dim) -> SparseTensor:
    """Re-specify ``A`` for a new fill or dense_dim: via the dense tensor (O(numel),
    limit-checked)."""
    check_densify_quiet(A)
    if A._indefinite and indefinite:
        return _redim_indefinite(A, layout, dense_dim)
    base = fill if A._indefinite and not indefinite else None
    return dense_to_sparse(dense_of(A, base), fill, indefinite, known_zero, layout, dense_dim)


def check_densify_quiet(A: SparseTensor, what: str = "changing the fill or dense_dim") -> None:
    """Dense by nature (or explicitly requested): the densify gate with ``by_nature=True`` (quiet
    under the default policy; the byte limit applies)."""
    from sparsefill._tensor.policy import check_densify

    check_densify(what, A.numel() * A.element_size(), by_nature=True)


def _redim_indefinite(A: SparseTensor, layout, dense_dim) -> SparseTensor:
    """Indefinite fill, other dense_dim: a new dense slice is specified iff all its elements
    were."""
    values = dense_of(A, A._vals.new_zeros(()))
    specified = dense_of(
        rewrap(
            A,
            values=torch.ones_like(A._vals, dtype=torch.bool),
            indefinite=False,
            fill=torch.zeros((), dtype=torch.bool, device=A.device),
        )
    )
    sdim = A.dim() - dense_dim
    flat = specified.flatten(sdim) if dense_dim else specified[..., None]
    mask = flat.any(-1)
    if flat.shape[-1] and not torch.equal(mask, flat.all(-1)):
        raise ValueError(
            f"dense_dim={dense_dim}: with an indefinite fill every dense slice must be wholly "
            "specified or wholly unspecified, and here some are partly specified"
        )
    return parts_to_sparse(
        mask.nonzero().T.contiguous(),
        values[mask],
        A.shape,
        A._fill,
        indefinite=True,
        layout=layout,
        coalesced=True,
    )
