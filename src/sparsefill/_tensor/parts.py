"""Conversion kernels: SparseTensor <-> dense, COO <-> CSR, torch native sparse.

The kernels here carry no autograd; the public, differentiable entry points wrap
them in the Functions of ``_autograd/functions.py``.  Invariant of every kernel::

    dense_of(kernel(A)) == dense_of(A)

This module holds the storage algebra on parts (rewraps, unions, layouts, re-specification) and
re-exports the kernels it builds on: the canonical parts (``coalesced.py``), the dense tensor and
back (``dense.py``), torch's native sparse tensors (``native.py``).
"""

from __future__ import annotations

import torch

from sparsefill._kernels import index as _index, merge as _merge
from sparsefill._kernels.trace import bincount, traced
from sparsefill._tensor.coalesced import coalesced_parts, linear_parts as linear_parts
from sparsefill._tensor.dense import (
    _HUGE_MIN as _HUGE_MIN,
    check_densify_quiet,
    dense_of,
    dense_to_parts,
    differs as differs,
    empty_dense as empty_dense,
)
from sparsefill._tensor.native import from_native as from_native, to_torch as to_torch
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


def convert_fill(A: SparseTensor, fill, indefinite, known_zero, layout, dense_dim) -> SparseTensor:
    """Re-specify ``A`` for a new fill or dense_dim: via the dense tensor (O(numel),
    limit-checked)."""
    check_densify_quiet(A)
    if A._indefinite and indefinite:
        return _redim_indefinite(A, layout, dense_dim)
    base = fill if A._indefinite and not indefinite else None
    return dense_to_sparse(dense_of(A, base), fill, indefinite, known_zero, layout, dense_dim)


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
