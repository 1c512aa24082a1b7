"""The stored elements moved to new coordinates: ``flip``, ``roll``, ``rot90`` and ``repeat``::

    op(A).to_dense() == op(A.to_dense())

On a sparse dim the index is rewritten (``size - 1 - i``, ``(i + shift) % size``); on a dense dim
the op runs on the values and on the fill; ``rot90`` and ``repeat`` are torch's compositions of
native flips, transposes, reshapes and expands.
"""

from __future__ import annotations

import torch

from sparsefill._kernels import index as _index
from sparsefill.ops._schema import meta_of, probe_of
from sparsefill.ops.registry import register
from sparsefill.ops.shape.indexing import _build, _dense_fill, _parts

aten = torch.ops.aten


@register(aten.flip.default)
def _flip(func, args, kwargs):
    """``idx[d] -> size[d] - 1 - idx[d]`` on sparse dims; the values and the fill flip on dense
    dims."""
    A = args[0]
    dims = sorted({d % max(A.dim(), 1) for d in args[1]}) if A.dim() else []
    idx, vals, sd = _parts(A)
    idx = idx.clone()
    for d in (d for d in dims if d < sd):
        idx[d] = A.shape[d] - 1 - idx[d]
    dn = [d - sd for d in dims if d >= sd]
    if dn:
        vals = vals.flip([d + 1 for d in dn])
    fill = A._fill if A._indefinite or not dn else _dense_fill(A).flip(dn)
    return _build(A, idx, vals, A.shape, fill, coalesced=False)


@register(aten.roll.default)
def _roll(func, args, kwargs):
    """``idx[d] -> (idx[d] + shift) % size[d]``; with no dims, the flattened tensor rolls (linear
    keys)."""
    A = args[0]
    shifts = list(args[1])
    dims = list(args[2]) if len(args) > 2 else list(kwargs.get("dims", []))
    func(probe_of(A), shifts, dims)  # torch's errors
    idx, vals, sd = _parts(A)
    if not dims:
        if A.dense_dim():
            return NotImplemented
        keys = (_index.linearize(idx, A.shape) + shifts[0]) % max(A.numel(), 1)
        return _build(A, _index.unravel(keys, A.shape), vals, A.shape, coalesced=False)
    idx = idx.clone()
    for s, d in zip(shifts, dims):
        d %= A.dim()
        if d >= sd:
            vals = vals.roll(s, d - sd + 1)
            fill = A._fill if A._indefinite else _dense_fill(A).roll(s, d - sd)
            A = _build(A, idx, vals, A.shape, fill, layout=torch.sparse_coo, coalesced=False)
        elif A.shape[d]:
            idx[d] = (idx[d] + s) % A.shape[d]
    layout = args[0]._sf_layout if sd >= 2 else torch.sparse_coo
    return _build(A, idx, vals, A.shape, layout=layout, coalesced=False)


@register(aten.rot90.default)
def _rot90(func, args, kwargs):
    """torch's own composition: ``k = 1``: flip ``dims[1]`` then transpose; 2: flip both; 3: flip
    ``dims[0]`` then transpose (native flips and transposes)."""
    A = args[0]
    k = args[1] if len(args) > 1 else kwargs.get("k", 1)
    dims = list(args[2] if len(args) > 2 else kwargs.get("dims", [0, 1]))
    func(meta_of(A), k, dims)  # torch's errors
    k %= 4
    if k == 0:
        return A.clone()
    if k == 2:
        return A.flip(dims)
    return A.flip([dims[1] if k == 1 else dims[0]]).transpose(dims[0], dims[1])


@register(aten.repeat.default)
def _repeat(func, args, kwargs):
    """``A.repeat(r_0, ..., r_m)``: each dim ``i`` of size ``n_i`` is viewed as ``(1, n_i)``,
    expanded to ``(r_i, n_i)`` and merged: ``reshape(expand(reshape(A)))``, all native (the stored
    elements repeated).  The result is a new tensor, as torch's (a write to it leaves ``A`` as it
    is): the pieces' views are cloned off ``A``."""
    A, reps = args[0], list(args[1])
    out = func(meta_of(A), reps)  # torch's errors and the result's shape
    shape = (1,) * (len(reps) - A.dim()) + tuple(A.shape)
    split = [d for n in shape for d in (1, n)]
    grown = [d for r, n in zip(reps, shape) for d in (r, n)]
    R = A.reshape(split).expand(grown).reshape(out.shape)
    return R.clone() if R._view is not None else R
