"""The view ops that linear algebra decomposes into, on the stored elements (no densifying).

``matmul``, ``einsum``, ``tensordot``, ``inner`` and the backward formulas of ``mm``/``bmm``
reach ``__torch_dispatch__`` as ``t``, ``transpose``, ``permute``, ``unsqueeze``, ``squeeze``,
``view``/``_unsafe_view`` and ``expand`` around ``mm``/``bmm``/``mv``.  Each handler here maps
indices and values; the dense tensor follows exactly::

    op(A).to_dense() == op(A.to_dense())

* sparse dims stay in front of dense dims: a permute that would move a dense dim before a
  sparse one first turns every dense dim into a sparse dim (:func:`all_sparse`: dense dims trail
  sparse ones); an array fill then becomes its most common value, and the unspecified elements whose
  fill differs are specified (a DensifyWarning when they are many: such a result is dense by
  nature);
* ``view`` re-linearises the indices over the new shape (dense dims untouched when the
  new shape keeps them; else they become sparse dims as above);
* ``expand`` of a size-1 sparse dim makes the sparse dims from it on dense and expands the values (a
  view, O(nse)); where it cannot, it repeats the stored elements (O(nse * repeats), under the
  densify policy).

Results are COO (a CSR input is read through its COO parts): the products in
``linalg.py`` rebuild CSR arrays themselves.  The outputs are SparseTensor views of
their input (``views.py`` keeps them consistent).

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor([[0, 1], [2, 0]], [1., 2.], (2, 3), fill_value=5.)
>>> torch.equal(A.t().to_dense(), A.to_dense().t())
True
"""

from __future__ import annotations

import numpy as np
import torch

from sparsefill._kernels import index as _index, merge as _merge
from sparsefill._kernels.trace import traced
from sparsefill._tensor.parts import differs, scalar_parts
from sparsefill._kernels.grouping import gathered_cached, kept_values_owner, pattern_cached
from sparsefill._tensor.policy import (
    SPECIFY_QUIET_ELEMENTS,
    check_densify,
    check_limit,
    check_specify,
)
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops._writes import reshape_, unmark_viewed, viewed
from sparsefill.ops.registry import register

aten = torch.ops.aten


def _fill_dense(A: SparseTensor) -> torch.Tensor:
    """The fill with exactly ``A.dense_dim()`` dims (size-1 dims where it broadcasts)."""
    f, nd = A._fill, A.dense_dim()
    return f if A._indefinite else f.reshape((1,) * (nd - f.dim()) + tuple(f.shape))


def _make(A: SparseTensor, shape, idx, vals, fill, coalesced, known_zero=None) -> SparseTensor:
    return SparseTensor(
        torch.sparse_coo,
        shape,
        vals,
        fill,
        indices=idx,
        indefinite=A._indefinite,
        coalesced=coalesced,
        known_zero=A._fill_is_zero() if known_zero is None else known_zero,
    )


def _uniform_fill(A: SparseTensor) -> bool:
    return A._indefinite or A._fill.numel() == 1


def _mode(f: torch.Tensor) -> torch.Tensor:
    """The most common value of the 1-d ``f`` (all NaNs count as one value), as a 0-d tensor."""
    if not f.numel():
        return f.new_zeros(())
    nan = f.isnan() if f.is_floating_point() else None
    g = f[~nan] if nan is not None else f
    # (the choice only affects how many elements get specified, never the values)
    if g.is_complex():
        u, counts = torch.unique(torch.view_as_real(g), dim=0, return_counts=True)
        u = torch.view_as_complex(u.contiguous()) if u.numel() else u
    else:
        u, counts = torch.unique(g, return_counts=True)
    if nan is not None and int(nan.sum()) > (int(counts.max()) if counts.numel() else 0):
        return f[nan][0].clone()
    return u[counts.argmax()].clone() if u.numel() else f[0].clone()


def all_sparse(A: SparseTensor) -> SparseTensor:
    """``A`` with every dense dim turned into a sparse dim (a SparseTensor keeps its dense dims
    after its sparse ones).

    Each stored dense slice becomes ``prod(dense_shape)`` stored elements.  An array fill ``f``
    becomes the scalar fill ``c = mode(f)``; every unspecified position whose fill differs from
    ``c``
    is specified explicitly::

        extra elements = (#unspecified sparse positions) * (#{q : f[q] != c})

    through ``_tensor.policy.check_specify`` (a DensifyWarning past 65536: such a result is dense by
    nature)."""
    if not A.dense_dim():
        return (
            A
            if A._sf_layout is torch.sparse_coo
            else _make(A, A.shape, *A._coo_parts(), A._fill, A._coalesced)
        )
    idx, vals = A._coo_parts()
    D, S = tuple(A._dense_shape), tuple(A._sparse_shape)
    nse = idx.shape[1]
    full, vals = scalar_parts(idx, vals, D)
    if _uniform_fill(A):
        fill = A._fill if A._indefinite else A._fill.reshape(())
        return _make(A, A.shape, full, vals, fill, A._coalesced)
    f = A._fill.expand(D).reshape(-1)
    c = _mode(f)
    diff = differs(f, c).nonzero().reshape(-1)
    if diff.numel():
        keys = _index.linearize(idx, S)
        stored = nse if A._coalesced else torch.unique(keys).numel()
        n = (_index.numel(S) - stored) * diff.numel()
        check_specify(
            f"a dense dim of a tensor with an array fill becoming sparse ({n} elements specified)",
            n,
            vals.element_size() + 8 * A.dim(),
        )
        free = torch.ones(_index.numel(S), dtype=torch.bool, device=idx.device)
        free[keys] = False
        free = free.nonzero().reshape(-1)
        extra = torch.cat(
            [
                _index.unravel(free, S).repeat_interleave(diff.numel(), dim=1),
                _index.unravel(diff, D).repeat(1, free.numel()),
            ]
        )
        extra_vals = f[diff].repeat(free.numel())
        if A._coalesced:  # (two disjoint sorted runs: a linear merge, not a sort)
            keys, ps, pe = _merge.merge_union(
                _index.linearize(full, A.shape), _index.linearize(extra, A.shape)
            )
            merged, mvals = (
                full.new_empty((full.shape[0], keys.numel())),
                vals.new_empty(keys.numel()),
            )
            merged[:, ps], merged[:, pe] = full, extra
            mvals[ps], mvals[pe] = vals, extra_vals
            full, vals = merged, mvals
        else:
            full, vals = torch.cat([full, extra], 1), torch.cat([vals, extra_vals])
    return _make(A, A.shape, full, vals, c, A._coalesced, known_zero=not bool(c.any()))


def permute(A: SparseTensor, dims) -> SparseTensor | None:
    """Permute dims.  Size-1 dims move freely between the sparse and dense parts; when a dense
    dim of size > 1 would precede a sparse one, every dense dim becomes sparse first."""
    n = A.dim()
    dims = [d % n if n else d for d in dims]
    sd = A._sparse_ndim()

    def real(lo, hi):
        return [p for p, d in enumerate(dims) if lo <= d < hi and A.shape[d] != 1]

    rs, rd = real(0, sd), real(sd, n)
    if rs and rd and max(rs) > min(rd):
        A = all_sparse(A)
        sd, rd = n, []
    nsd = min(rd) if rd else n
    shape = [A.shape[d] for d in dims]
    sp = [d for d in dims[:nsd] if d < sd and A.shape[d] != 1]
    coalesced = A._coalesced and sp == sorted(sp)
    vals = A._vals.reshape((-1,) + tuple(A._dense_shape))  # (a batched CSR's batches flattened)
    if A._coalesced and not coalesced and not traced(vals):
        perm, new_idx, tag, tensors = _sorted_permuted_pattern(A, dims[:nsd], shape[:nsd])
        vals, coalesced = gathered_cached(vals, perm, tag, tensors, kept_values_owner(A)), True
    else:
        new_idx = _permuted_indices(A, dims[:nsd])
    order = dims[nsd:] + dims[:nsd]  # the new sparse dims last, where every axis has size 1

    # t: `lead` leading axes, then one axis per dim of A (size 1 for sparse dims)
    def move(t, lead):
        t = t.permute(list(range(lead)) + [lead + d for d in order])
        return t.reshape(t.shape[: lead + n - nsd])

    vals = move(vals[(slice(None),) + (None,) * sd], 1)
    fill = A._fill if A._indefinite else move(_fill_dense(A)[(None,) * sd], 0)
    return _make(A, shape, new_idx, vals, fill, coalesced)


def _permuted_indices(A: SparseTensor, sparse_dims) -> torch.Tensor:
    """The index rows of the permuted tensor's sparse dims (``sparse_dims`` of ``A``; a dense dim of
    size 1 that becomes sparse gets a row of zeros)."""
    idx, sd = A._coo_parts()[0], A._sparse_ndim()
    rows = [idx[d] if d < sd else idx.new_zeros(idx.shape[1]) for d in sparse_dims]
    return torch.stack(rows) if rows else idx.new_zeros((0, idx.shape[1]))


def _sorted_permuted_pattern(A: SparseTensor, sparse_dims, sparse_shape):
    """``(perm, indices, tag, tensors)``: the permuted pattern of a coalesced ``A`` in sorted order,
    so the result is coalesced too (``X.t() @ G`` of a data matrix then never sorts).  Computed once
    per pattern: a training loop transposes the same constant matrix every step."""

    def compute():
        idx = _permuted_indices(A, sparse_dims)
        _, perm = _index.sort_keys(_index.linearize(idx, sparse_shape))
        if perm is None:
            perm = torch.arange(idx.shape[1], device=idx.device)
        return perm, idx.index_select(1, perm)

    tensors = (A._idx,) if A._sf_layout is torch.sparse_coo else (A._crow, A._col)
    tag = ("permute", tuple(A.shape), tuple(sparse_dims), A._sparse_ndim())
    return pattern_cached(tag, tensors, compute) + (tag, tensors)


def unsqueeze(A: SparseTensor, dim: int) -> SparseTensor:
    dim = dim % (A.dim() + 1)
    sd = A._sparse_ndim()
    idx, vals = A._coo_parts()
    shape = list(A.shape)
    shape.insert(dim, 1)
    if dim <= sd:
        return _make(A, shape, with_zero_row(idx, dim, A.shape), vals, A._fill, A._coalesced)
    fill = A._fill if A._indefinite else _fill_dense(A).unsqueeze(dim - sd)
    return _make(A, shape, idx, vals.unsqueeze(1 + dim - sd), fill, A._coalesced)


def with_zero_row(idx: torch.Tensor, dim: int, shape) -> torch.Tensor:
    """``idx`` (over ``shape``'s sparse dims) with a row of zeros inserted at ``dim`` (a new size-1
    dim).  A large CPU index is allocated zeroed by calloc (numpy's zeros): the rows of the size-1
    dims, zeros, are not written (their pages stay untouched until read) -- one row copied per dim
    of size > 1."""
    n = idx.shape[1]
    if idx.device.type != "cpu" or idx.dtype != torch.int64 or n < _CALLOC_MIN or traced(idx):
        return torch.cat([idx[:dim], idx.new_zeros((1, n)), idx[dim:]])
    out = torch.from_numpy(np.zeros((idx.shape[0] + 1, n), np.int64))
    for d in range(idx.shape[0]):
        if shape[d] != 1:
            out[d + (d >= dim)] = idx[d]
    return out


_CALLOC_MIN = 1 << 16  # index columns from which with_zero_row allocates through calloc


def squeeze(A: SparseTensor, dims=None) -> SparseTensor:
    n = A.dim()
    dims = range(n) if dims is None else [d % n if n else d for d in dims]
    drop = sorted({d for d in dims if n and A.shape[d] == 1})
    sd = A._sparse_ndim()
    idx, vals = A._coo_parts()
    keep_s = [d for d in range(sd) if d not in drop]
    drop_d = [d - sd for d in drop if d >= sd]
    shape = [s for d, s in enumerate(A.shape) if d not in drop]
    if drop_d:
        vals = vals.squeeze([1 + d for d in drop_d])
    fill = A._fill if A._indefinite or not drop_d else _fill_dense(A).squeeze(drop_d)
    return _make(A, shape, _kept_rows(idx, keep_s, A.shape), vals, fill, A._coalesced)


def _kept_rows(idx, keep, shape):
    """``idx[keep]``, as a view of consecutive rows where some match: the row of a size-1 dim (all
    0) stands for any other's (O(1) instead of a copy of the index rows)."""
    for a in range(idx.shape[0] - len(keep) + 1):
        if all(a + j == d or shape[a + j] == 1 and shape[d] == 1 for j, d in enumerate(keep)):
            return idx[a : a + len(keep)]
    return idx[keep]


def _infer(shape, numel):
    shape = list(shape)
    if -1 in shape:
        i = shape.index(-1)
        rest = _index.numel(shape[:i] + shape[i + 1 :])
        shape[i] = numel // rest if rest else 0
    return shape


def view(A: SparseTensor, shape) -> SparseTensor | None:
    """Re-linearise the sparse indices; the dense dims stay when the new shape ends with them
    (size-1 dims aside), else they become sparse dims (:func:`all_sparse`)."""
    shape = _infer(shape, A.numel())
    if _index.numel(shape) != A.numel():
        return None  # torch's error comes from the next stage
    t = _dense_tail(A, shape)
    if t is None:
        A = all_sparse(A)
        t = 0
    tail = shape[len(shape) - t :]
    idx, vals = A._coo_parts()
    vals = vals.reshape((vals.shape[0],) + tuple(tail))
    fill = A._fill
    # (a one-element array fill too: dense dims (1, 1) may become ())
    if not A._indefinite and fill.dim():
        fill = _fill_dense(A).expand(A._dense_shape).reshape(tail)
    # (a one-element fill of more dims than the new dense ones)
    elif not A._indefinite and fill.dim() > len(tail):
        fill = fill.reshape(())
    new = _index.unravel(_index.linearize(idx, A._sparse_shape), shape[: len(shape) - t])
    return _make(A, shape, new, vals, fill, A._coalesced)


def _dense_tail(A: SparseTensor, shape):
    """The fewest trailing dims of ``shape`` that hold ``A``'s dense dims (size-1 dims aside)."""
    D = [d for d in A._dense_shape if d != 1]
    S = _index.numel(A._sparse_shape)
    for t in range(len(shape) + 1):
        tail = shape[len(shape) - t :]
        if [d for d in tail if d != 1] == D and _index.numel(shape[: len(shape) - t]) == S:
            return t
    return None


def expand(A: SparseTensor, size, keep_split: bool = False) -> SparseTensor | None:
    """``A.expand(size)``, O(nse) where a grown sparse dim can become dense (the values then grow as
    a view)::

        expand(A, size).to_dense() == A.to_dense().expand(size)

    Grown dense dims expand the values and the fill (stride 0).  Where sparse dims grow (size 1 to
    ``n``, or new leading dims), the sparse dims from the first grown one on become dense dims
    (:func:`_tensor.dense_dims.coarser`: one slice per stored prefix, exact) and the values expand
    along them: the column of a row reduction ``d = A.norm(1, 1, keepdim=True)`` expanded to ``A``'s
    shape (``F.normalize``) stores ``d``'s elements, not ``n`` times as many.  Else (``keep_split``,
    the pointwise rule's broadcast that merges patterns at one split; an indefinite prefix partly
    stored; or more slice elements than the repeats would store) the stored elements repeat along
    the grown sparse dims (O(nse * repeats)), a dense-by-nature result past
    ``SPECIFY_QUIET_ELEMENTS`` under the densify policy's gate (its byte limit raises
    DensifyError)."""
    n = A.dim()
    lead = len(size) - n
    old = [1] * lead + list(A.shape)
    size = [o if s == -1 else s for s, o in zip(size, old)]
    if any(o != 1 and o != s for o, s in zip(old, size)):
        return None
    sd = A._sparse_ndim() + lead
    grown = [d for d in range(sd) if old[d] == 1 and size[d] != 1]
    r = _index.numel([size[d] for d in grown])
    if grown and not keep_split:
        out = _expand_as_dense_dims(A, size, grown[0], r)
        if out is not None:
            return out
    idx, vals = A._coo_parts()
    if grown and not traced(idx):  # (traced: nse may be unbacked)
        what = (
            f"expand of a SparseTensor of shape {list(A.shape)} to {size} along sparse dims: its "
            f"{idx.shape[1]} stored elements repeat {r} times"
        )
        nbytes = idx.shape[1] * r * (8 * sd + vals.element_size() * _index.numel(vals.shape[1:]))
        if idx.shape[1] * r > SPECIFY_QUIET_ELEMENTS:
            check_densify(what, nbytes, by_nature=True)
        else:  # quiet, but under the byte limit
            check_limit(what, nbytes)
    idx = torch.cat([idx.new_zeros((lead, idx.shape[1])), idx])
    ordered = A._coalesced
    # innermost first: each repeat keeps the order when the dims before are 1
    for d in reversed(range(sd)):
        if old[d] == 1 and size[d] != 1:
            r = size[d]
            nse = idx.shape[1]
            idx = idx.repeat(1, r)
            idx[d] = torch.arange(r, device=idx.device).repeat_interleave(nse)
            vals = vals.repeat((r,) + (1,) * (vals.dim() - 1))
            ordered = ordered and all(old[e] == 1 for e in range(d))
    vals = vals.expand([vals.shape[0]] + size[sd:])
    # an array fill: as the values
    fill = A._fill if A._indefinite or not A._fill.dim() else A._fill.expand(size[sd:])
    return _make(A, size, idx, vals, fill, ordered)


def _expand_as_dense_dims(A: SparseTensor, size, f: int, r: int) -> SparseTensor | None:
    """:func:`expand` with the dims from ``f`` on (of ``size``) dense, when
    :func:`_tensor.dense_dims.coarser` can make them dense (None for an indefinite ``A`` whose
    slices there are partly stored) and stores no more than the repeats would (one slice of the old
    dims ``f..`` per stored prefix, against ``nse * r`` slices)."""
    from sparsefill._tensor.dense_dims import (
        coarser,
    )  # (_splits imports _convert, which the registry's modules import first)

    if traced(A._vals):  # (torch.compile: coarser's slice count is data; the repeats are not)
        return None
    nd, lead = len(size) - f, len(size) - A.dim()
    old = [1] * lead + list(A.shape)
    nse = A._nse()
    prefixes = min(nse, _index.numel(old[:f]))
    if prefixes * _index.numel(old[f : len(old) - A.dense_dim()]) > nse * r:
        return None
    B = coarser(A, nd)
    if B is None:
        return None
    idx = B._idx
    idx = (
        torch.cat([idx.new_zeros((f - idx.shape[0], idx.shape[1])), idx])
        if idx.shape[0] < f
        else idx
    )
    vals = B._vals.reshape((B._vals.shape[0],) + tuple(old[f:])).expand(
        [B._vals.shape[0]] + size[f:]
    )
    fill = B._fill if B._indefinite or not B._fill.dim() else B._fill.expand(size[f:])
    return SparseTensor(
        torch.sparse_coo,
        size,
        vals,
        fill,
        indices=idx,
        indefinite=B._indefinite,
        coalesced=B._coalesced,
        known_zero=B._fill_is_zero(),
    )


# ---------------------------------------------------------------------- handlers
def _or_next(out):
    return NotImplemented if out is None else out


@register(aten.t.default)
def _t(func, args, kwargs):
    A = args[0]
    if A.dim() < 2:  # a new object: torch forbids a view op returning its input
        return _make(A, A.shape, *A._coo_parts(), A._fill, A._coalesced)
    if A.dim() > 2:
        # torch's error (t() takes <= 2-D)
        func(torch.empty((), dtype=A.dtype, device="meta").expand(A.shape))
    return _or_next(permute(A, [1, 0]))


@register(aten.transpose.int)
def _transpose(func, args, kwargs):
    A, d0, d1 = args[0], *args[1:3]
    n = max(A.dim(), 1)
    dims = list(range(A.dim()))
    if A.dim():
        dims[d0 % n], dims[d1 % n] = dims[d1 % n], dims[d0 % n]
    return _or_next(permute(A, dims))


@register(aten.permute.default)
def _permute(func, args, kwargs):
    return _or_next(permute(args[0], list(args[1])))


@register(aten.unsqueeze.default)
def _unsqueeze(func, args, kwargs):
    return unsqueeze(args[0], args[1])


@register(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def _squeeze(func, args, kwargs):
    dims = None if len(args) < 2 else ([args[1]] if isinstance(args[1], int) else list(args[1]))
    return squeeze(args[0], dims)


@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(func, args, kwargs):
    return _or_next(view(args[0], list(args[1])))


@register(aten.expand.default)
def _expand(func, args, kwargs):
    return _or_next(expand(args[0], list(args[1])))


# in-place view ops -> their out-of-place form (swapdims_ and swapaxes_ reach transpose_)
_IN_PLACE_VIEWS = {
    aten.unsqueeze_.default: aten.unsqueeze.default,
    aten.squeeze_.default: aten.squeeze.default,
    aten.squeeze_.dim: aten.squeeze.dim,
    aten.squeeze_.dims: aten.squeeze.dims,
    aten.t_.default: aten.t.default,
    aten.transpose_.default: aten.transpose.int,
}


@register(*_IN_PLACE_VIEWS)
def _in_place_view(func, args, kwargs):
    """``A.unsqueeze_(0) == A.unsqueeze(0)``, ``A`` itself (:func:`._writes.reshape_`)."""
    A = args[0]
    was_viewed = viewed(A)
    # (torch's errors; tracked as a view of A, then dropped)
    new = _IN_PLACE_VIEWS[func](*args, **kwargs)
    if not was_viewed:
        unmark_viewed(A)
    return reshape_(A, new, func, args, kwargs)
