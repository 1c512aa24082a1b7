"""Matrices by their diagonals: ``tril``, ``triu``, ``diagonal``, ``diag_embed`` and ``trace``::

    op(A).to_dense() == op(A.to_dense())

The stored elements are kept or dropped by ``idx[d2] - idx[d1]`` against the offset; on dense
matrix dims the op runs on the values and on the fill.  ``tril``/``triu`` of a nonzero fill are
dense by nature in part (``_tensor.policy.check_specify``).
"""

from __future__ import annotations

import torch

from sparsefill._kernels import index as _index
from sparsefill._tensor.parts import dense_of, parts_to_sparse
from sparsefill._tensor.policy import check_specify
from sparsefill.ops._schema import check_dtype, meta_of, probe_of
from sparsefill.ops.registry import register
from sparsefill.ops.shape.indexing import _build, _dense_fill, _on_dense_dim, _parts

aten = torch.ops.aten


@register(aten.tril.default, aten.triu.default)
def _tril_triu(func, args, kwargs):
    """Elements off the kept triangle ``K`` become 0.  Zero (or indefinite) fill: only stored
    elements move.  A nonzero fill ``f``: the result is dense by nature in part, and the cheaper of
    two exact forms is built — fill ``f`` with the zeroed triangle stored as zeros, or fill 0 with
    ``K``'s unspecified elements stored as ``f`` (``_tensor.policy.check_specify`` past 65536 of
    them)."""
    A = args[0]
    k = args[1] if len(args) > 1 else kwargs.get("diagonal", 0)
    func(probe_of(A), k)  # torch's errors (fewer than 2 dims)
    sd = A.dim() - A.dense_dim()
    if A.dense_dim() >= 2:  # the matrix dims are dense: on the values and on the fill
        return _on_dense_dim(A, A.dim() - 1, lambda t, d: func(t, k))
    # one sparse, one dense matrix dim: every dense dim becomes sparse (a SparseTensor keeps its
    # dense dims after its sparse ones)
    if A.dense_dim():
        from sparsefill.ops.shape.reshape import all_sparse

        return _tril_triu(func, (all_sparse(A), k), {})
    idx, vals, _ = _parts(A)
    lower = func is aten.tril.default
    off = idx[sd - 1] - idx[sd - 2]
    keep = off <= k if lower else off >= k
    idx, vals = idx[:, keep], vals[keep]
    if A._indefinite or A._fill_is_zero():
        return _build(A, idx, vals, A.shape, layout=A._sf_layout)
    r, c = A.shape[-2:]
    tri = (torch.tril_indices if lower else torch.triu_indices)(r, c, k, device=idx.device)
    zeroed = (torch.triu_indices if lower else torch.tril_indices)(
        r, c, k + 1 if lower else k - 1, device=idx.device
    )
    nb = _index.numel(A.shape[:-2])
    batch = _index.unravel(torch.arange(nb, device=idx.device), A.shape[:-2])
    # (per matrix, roughly)
    fill_zero = zeroed.shape[1] <= tri.shape[1] - vals.shape[0] // max(nb, 1)
    extra = zeroed if fill_zero else tri
    check_specify(
        f"{func.__name__} of a tensor with a nonzero fill", nb * extra.shape[1], A.element_size()
    )
    pos = torch.cat([batch.repeat_interleave(extra.shape[1], 1), extra.repeat(1, nb)])
    # fill f, the zeroed triangle stored as zeros (disjoint from the kept stored elements)
    if fill_zero:
        return parts_to_sparse(
            torch.cat([idx, pos], 1),
            torch.cat([vals, vals.new_zeros(pos.shape[1])]),
            A.shape,
            A._fill,
            layout=A._sf_layout,
        ).coalesce()
    keys = _index.linearize(pos, A.shape)  # fill 0, the kept triangle stored: f where unspecified
    out = A._fill.reshape(()).expand(keys.numel()).clone()
    at, _ = _index.lookup(keys, _index.linearize(idx, A.shape))
    out[at] = vals
    return parts_to_sparse(
        pos, out, A.shape, torch.zeros_like(A._fill), layout=A._sf_layout
    ).coalesce()


@register(aten.diagonal.default, aten.diagonal_copy.default)
def _diagonal(func, args, kwargs):
    """The stored elements on the diagonal ``idx[d2] - idx[d1] == offset`` (all-sparse tensors); the
    diagonal becomes the last dim, at position ``idx[d1]`` (``idx[d2]`` below the main diagonal)."""
    A = args[0]
    offset = args[1] if len(args) > 1 else kwargs.get("offset", 0)
    d1 = args[2] if len(args) > 2 else kwargs.get("dim1", 0)
    d2 = args[3] if len(args) > 3 else kwargs.get("dim2", 1)
    meta = func(meta_of(A), offset, d1, d2)  # torch's errors and the result's shape
    d1, d2 = d1 % A.dim(), d2 % A.dim()
    idx, vals, sd = _parts(A)
    if d1 >= sd and d2 >= sd:  # two dense dims: on the values and on the fill
        fill = (
            A._fill if A._indefinite else torch.diagonal(_dense_fill(A), offset, d1 - sd, d2 - sd)
        )
        return _build(
            A, idx, torch.diagonal(vals, offset, d1 - sd + 1, d2 - sd + 1), meta.shape, fill
        )
    # one of each: every dense dim becomes sparse (a SparseTensor keeps its dense dims after its
    # sparse ones)
    if d1 >= sd or d2 >= sd:
        from sparsefill.ops.shape.reshape import all_sparse

        return _diagonal(func, (all_sparse(A), offset, d1, d2), {})
    keep = idx[d2] - idx[d1] == offset
    pos = (idx[d1] if offset >= 0 else idx[d2])[keep]
    rest = [d for d in range(sd) if d not in (d1, d2)]
    new = torch.cat([idx[rest][:, keep], pos[None]])
    shape = [A.shape[d] for d in rest] + [meta.shape[-1]] + list(A._dense_shape)
    out = parts_to_sparse(
        new,
        vals[keep],
        torch.Size(shape),
        A._fill,
        indefinite=A._indefinite,
        layout=A._sf_layout if new.shape[0] >= 2 and not A.dense_dim() else torch.sparse_coo,
    )
    if A.dense_dim():  # torch puts the diagonal last, after the dense dims
        n = len(shape)
        out = out.permute(list(range(len(rest))) + list(range(len(rest) + 1, n)) + [len(rest)])
    return out


@register(aten.diag_embed.default)
def _diag_embed(func, args, kwargs):
    """The last dim of ``A`` (``n``) on the diagonal ``offset`` of the new dims ``dim1, dim2``
    (``n + |offset|`` each), 0 off it: fill 0 and the diagonal's elements stored -- ``A``'s stored
    ones, and for a nonzero fill every one (``numel(A)``: the diagonal is dense by nature, the
    matrices are not); a hybrid ``A`` as its all-sparse form.  An indefinite fill: next stage."""
    A = args[0]
    offset = args[1] if len(args) > 1 else kwargs.get("offset", 0)
    d1 = args[2] if len(args) > 2 else kwargs.get("dim1", -2)
    d2 = args[3] if len(args) > 3 else kwargs.get("dim2", -1)
    meta = func(meta_of(A), offset, d1, d2)  # torch's errors and the result's shape
    if A._indefinite or A.dim() == 0:
        return NotImplemented
    if A.dense_dim():
        from sparsefill.ops.shape.reshape import all_sparse

        return _diag_embed(func, (all_sparse(A), offset, d1, d2), {})
    n = meta.dim()
    d1, d2 = d1 % n, d2 % n
    idx, vals, _ = _parts(A)
    if not A._fill_is_zero():
        check_specify("diag_embed of a tensor with a nonzero fill", A.numel(), A.element_size())
        vals = dense_of(A).reshape(-1)
        idx = _index.unravel(torch.arange(vals.numel(), device=idx.device), A.shape)
    *batch, last = idx
    rows, cols = (last, last + offset) if offset >= 0 else (last - offset, last)
    new = [None] * n
    new[d1], new[d2] = rows, cols
    rest = iter(batch)
    new = torch.stack([next(rest) if t is None else t for t in new]) if n else idx
    zero = torch.zeros((), dtype=A.dtype, device=vals.device)
    return parts_to_sparse(new, vals, meta.shape, zero, known_zero=True).coalesce()


@register(aten.trace.default)
def _trace(func, args, kwargs):
    """``trace(A) = diagonal(A).sum()``."""
    A = args[0]
    check_dtype(func, A)  # torch's errors (2-D only; no bool)
    return aten.sum.default(aten.diagonal.default(A))
