"""Joining: ``cat`` and ``stack`` of SparseTensors (and dense tensors beside them)::

    cat(As, dim).to_dense() == cat([A.to_dense() for A in As], dim)
    stack(As, dim) == cat([A.unsqueeze(dim) for A in As], dim)

Along a sparse dim the stored elements of each operand are shifted by the sizes before it; along a
dense dim the values are joined at the union of the patterns, and the fills are joined.  The result
takes the fill of the largest operand; the elements of an operand with another fill are specified
(stored), a DensifyWarning past ``_tensor.policy.SPECIFY_QUIET_ELEMENTS`` of them.  A dense operand
is stored where it differs from that fill.  A masked (indefinite) operand makes the result masked
where it is unspecified and defined elsewhere, as ``torch.masked``'s ``cat`` (a defined operand's
mask is all True): the fill is indefinite and every element of the defined operands is stored
(through the same gate); along a dense dim a slice would be partly masked, which no hybrid holds:
refused (the densify fallback's ValueError).

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor([[1]], [2.], (3,), fill_value=5.)
>>> B = sparsefill.sparse_coo_tensor([[0]], [7.], (2,), fill_value=5.)
>>> torch.cat([A, B]).to_dense()
tensor([5., 2., 5., 7., 5.])
>>> torch.stack([A, A]).indices().tolist()
[[0, 1], [1, 1]]
>>> M = sparsefill.sparse_coo_tensor([[1]], [3.], (2,), fill_value=sparsefill.indefinite)
>>> torch.cat([M, B]).to_dense(fill_value=float("nan"))  # B's elements all stored, M's mask kept
tensor([nan, 3., 7., 5.])
"""

from __future__ import annotations

import torch

from sparsefill._kernels import index as _index
from sparsefill._tensor.parts import (
    coalesced_parts,
    dense_of,
    dense_to_parts,
    dense_to_sparse,
    every_element,
    parts_to_sparse,
    union_parts,
)
from sparsefill._tensor.policy import check_specify
from sparsefill._tensor.dense_dims import one_split
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops._schema import meta_like, probe_of
from sparsefill.ops.shape.indexing import _build, _dense_fill
from sparsefill.ops.registry import register

aten = torch.ops.aten


@register(aten.cat.default)
def _cat(func, args, kwargs):
    tensors = [
        t
        for t in args[0]
        if not (t.dim() == 1 and t.numel() == 0 and not isinstance(t, SparseTensor))
    ]
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    sparse = [t for t in tensors if isinstance(t, SparseTensor)]
    if not sparse:
        return NotImplemented
    if any(t.dim() == 0 for t in tensors):  # torch's error (a 0-d tensor cannot be concatenated)
        _check_cat(tensors, dim, dim)
    if len({t.dense_dim() for t in sparse}) > 1 and len({t.dim() for t in sparse}) == 1:
        # split differently: at one split first, exactly
        conv = iter(one_split(sparse, sparse[0]._sf_layout)[0])
        tensors = [next(conv) if isinstance(t, SparseTensor) else t for t in tensors]
        sparse = [t for t in tensors if isinstance(t, SparseTensor)]
    # (a masked operand's fill: no other can stand in; an operand storing every element has no fill
    # to give)
    A = max(sparse, key=lambda t: (t._indefinite, not _fully_stored(t), t.numel()))
    sd = A.dim() - A.dense_dim()
    # a dense operand is already materialised: stored where it differs from the fill
    if len(sparse) != len(tensors):
        if (
            any(
                not isinstance(t, SparseTensor) and (t.dim() != A.dim() or t.dtype != A.dtype)
                for t in tensors
            )
            or A._indefinite
            and dim % A.dim() >= sd
        ):
            return NotImplemented

        def fill_for(
            t,
        ):  # (along a dense dim the operand's dense shape differs: one value of A's fill)
            return (
                _dense_fill(A)
                if dim % A.dim() < sd
                else A._fill.reshape(-1)[0].expand(t.shape[sd:])
            )

        tensors = [
            t
            if isinstance(t, SparseTensor)
            # (beside a masked operand: every element stored)
            else dense_to_sparse(
                t, fill_for(t), A._indefinite, False, torch.sparse_coo, A.dense_dim()
            )
            for t in tensors
        ]
        sparse = tensors
    dim %= A.dim()
    if any(
        t.dim() != A.dim() or t.dense_dim() != A.dense_dim() or t.dtype != A.dtype for t in sparse
    ):
        return NotImplemented
    _check_cat(tensors, args[1] if len(args) > 1 else kwargs.get("dim", 0), dim)
    if dim >= sd:  # along a dense dim: the values at the union of the patterns, then cat
        if A._indefinite:  # (a slice partly masked out: no hybrid holds it, no dense form exists)
            return NotImplemented
        idx, vals = union_parts(tensors)
        vals = torch.cat(vals, dim - sd + 1)
        fill = torch.cat([_dense_fill(t) for t in tensors], dim - sd)
        return _build(A, idx, vals, A.shape[:sd] + vals.shape[1:], fill)
    fill = _dense_fill(A)
    # the operands stored whole (defined beside masked, or another fill): asked once for all of
    # them, before any is formed (the byte limit holds for the result's values, not per operand)
    whole = [
        A._indefinite
        and not t._indefinite
        or not A._indefinite
        and not _fully_stored(t)
        and not torch.equal(_dense_fill(t), fill)
        for t in tensors
    ]
    if any(whole):
        n = sum(t.numel() for t, w in zip(tensors, whole) if w)
        check_specify(
            "cat of a masked (indefinite) operand and a defined one"
            if A._indefinite
            else "cat of operands with different fills",
            n,
            A.element_size(),
        )
    idxs, valss, offset = [], [], 0
    for t, w in zip(tensors, whole):
        if w and A._indefinite:  # defined beside masked: every element of t stored
            i, v = every_element(t)
        elif w:  # t's elements that differ from the fill
            i, v = dense_to_parts(dense_of(t), A._fill, False, t.dense_dim())
        else:
            i, v = coalesced_parts(t)
        i = i.clone()
        i[dim] += offset
        offset += t.shape[dim]
        idxs.append(i)
        valss.append(v)
    shape = list(A.shape)
    shape[dim] = offset
    out = parts_to_sparse(
        torch.cat(idxs, 1),
        torch.cat(valss),
        torch.Size(shape),
        A._fill,
        indefinite=A._indefinite,
        layout=torch.sparse_coo,
        coalesced=dim == 0,
    )
    return _in_layout(out, A._sf_layout)


def _fully_stored(t: SparseTensor) -> bool:
    """Every element of ``t`` is stored (coalesced COO): its fill is read nowhere, so it joins any
    fill as it is (the 0-d gradients of ``unbind``'s pieces: a stored one has fill 0, an unstored
    one its gradient as the fill)."""
    return (
        t._sf_layout is torch.sparse_coo
        and t._coalesced
        and t._nse() == _index.numel(t._sparse_shape)
    )


def _in_layout(out: SparseTensor, layout) -> SparseTensor:
    """The joined ``out`` (COO) in the operands' ``layout`` where it holds it: COO below 2 sparse
    dims, and for a masked result whose batches store different numbers of elements (a batched CSR
    pads them with the fill)."""
    sd = out.dim() - out.dense_dim()
    if layout is torch.sparse_coo or sd < 2:
        return out
    if out._indefinite and sd > 2:
        batch = out.shape[: sd - 2]
        counts = torch.bincount(
            _index.linearize(out._coo_parts()[0][: sd - 2], batch), minlength=_index.numel(batch)
        )
        if counts.numel() and bool((counts != counts[0]).any()):
            return out
    return out.to_sparse(layout=layout)


def _check_cat(tensors, dim, d):
    """torch's errors for ``cat(tensors, dim)`` (``d``: ``dim`` wrapped), without a meta tensor
    (cat's meta kernel is Python; its first call in a process imports torch._dynamo): the dim, dtype
    and device from ``cat`` of one-element tensors, the sizes here, with torch's words."""
    probes = [torch.zeros((1,) * t.dim(), dtype=t.dtype, device=t.device) for t in tensors]
    # (else torch's error names the 0-d one's position) one per dtype and device:
    if all(t.dim() for t in tensors):
        probes = list({(p.dtype, p.device): p for p in probes}.values())  # no element per operand
    torch.cat(probes, dim)
    for i, t in enumerate(tensors):
        for j, (m, n) in enumerate(zip(tensors[0].shape, t.shape)):
            if j != d and m != n:
                raise RuntimeError(
                    f"Sizes of tensors must match except in dimension {d}. Expected size {m} but "
                    f"got size {n} for tensor number {i} in the list."
                )


@register(aten.stack.default)
def _stack(func, args, kwargs):
    tensors = list(args[0])
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    if not tensors or not any(isinstance(t, SparseTensor) for t in tensors):
        return NotImplemented
    for i, t in enumerate(tensors):  # torch's error, with torch's words
        if t.shape != tensors[0].shape:
            raise RuntimeError(
                f"stack expects each tensor to be equal size, but got {list(tensors[0].shape)} at "
                f"entry 0 and {list(t.shape)} at entry {i}"
            )
    # torch's dim, dtype and device errors: one probe per (dtype, device), so that this check
    # allocates no element per operand (stacking n 0-d tensors would form n)
    torch.stack(list({(t.dtype, t.device): probe_of(t) for t in tensors}.values()), dim)
    dim %= tensors[0].dim() + 1
    lifted = []
    for t in tensors:
        # (cat stores a dense operand where it differs from the fill)
        if not isinstance(t, SparseTensor):
            lifted.append(t.unsqueeze(dim))
            continue
        i, v = coalesced_parts(t)
        sd = t.dim() - t.dense_dim()
        shape = t.shape[:dim] + (1,) + t.shape[dim:]
        if dim > sd:  # a new dense dim: on the values and on the fill
            fill = t._fill if t._indefinite else _dense_fill(t).unsqueeze(dim - sd)
            lifted.append(_build(t, i, v.unsqueeze(dim - sd + 1), shape, fill, torch.sparse_coo))
            continue
        i = torch.cat([i[:dim], i.new_zeros(1, i.shape[1]), i[dim:]])
        lifted.append(
            parts_to_sparse(
                i,
                v,
                torch.Size(shape),
                t._fill,
                indefinite=t._indefinite,
                layout=torch.sparse_coo,
                coalesced=True,
            )
        )
    out = _cat(aten.cat.default, (lifted, dim), {})
    layout = next(t for t in tensors if isinstance(t, SparseTensor))._sf_layout
    return out if out is NotImplemented else _in_layout(out, layout)


@register(aten.block_diag.default)
def _block_diag(func, args, kwargs):
    """``block_diag`` of SparseTensors and dense tensors (0-d, 1-d as a row, 2-d; torch's result
    dtype): fill 0 (the off-diagonal blocks' value), each block's stored elements shifted to its
    corner (a batch of graphs' adjacencies); a block of a nonzero fill, or a dense one, stores
    every element (dense by nature in part: ``check_specify``).  All masked (indefinite): the
    off-diagonal blocks masked too (no edge between the graphs); masked and not: next stage::

        block_diag(A, B).to_dense() == block_diag(A.to_dense(), B.to_dense())

    >>> import torch, sparsefill
    >>> A = sparsefill.sparse_coo_tensor([[0], [1]], [2.], (1, 2))
    >>> torch.block_diag(A, A).indices().tolist()
    [[0, 1], [1, 3]]
    """
    ts = list(args[0])
    meta = func([meta_like(t) for t in ts])  # torch's errors, result shape and dtype
    sparse = [t for t in ts if isinstance(t, SparseTensor)]
    masked = any(t._indefinite for t in sparse)
    if masked and (len(sparse) < len(ts) or not all(t._indefinite for t in sparse)):
        return NotImplemented
    blocks = [_block_parts(t, meta.dtype) for t in ts]
    shapes = torch.tensor([[0, 0]] + [list(b[2]) for b in blocks]).cumsum(0)
    dev = sparse[0].device  # (a handler's call has a SparseTensor operand)
    idx = torch.cat(
        [i.to(dev) + shapes[k, :, None].to(dev) for k, (i, _, _) in enumerate(blocks)], 1
    )
    vals = torch.cat([v for _, v, _ in blocks])
    fill = (
        sparse[0]._fill.to(meta.dtype) if masked else torch.zeros((), dtype=meta.dtype, device=dev)
    )
    out = parts_to_sparse(
        idx, vals, meta.shape, fill, indefinite=masked, known_zero=not masked, coalesced=True
    )
    return _in_layout(out, sparse[0]._sf_layout)


def _block_parts(t, dtype) -> tuple:
    """``(idx (2, n), values, (rows, cols))`` of one operand of ``block_diag`` as its 2-D block
    (0-d: 1 x 1, 1-d: a row), in ``dtype``: a zero or masked fill's stored elements, else every
    element."""
    shape = (1, 1) if t.dim() == 0 else (1, t.shape[0]) if t.dim() == 1 else tuple(t.shape)
    if isinstance(t, SparseTensor):
        from sparsefill.ops.shape.reshape import all_sparse

        t = t.reshape(shape) if t.dim() != 2 else t
        t = all_sparse(t) if t.dense_dim() else t
        if t._indefinite or t._fill_is_zero():
            idx, vals = coalesced_parts(t)
            return idx, vals.to(dtype), shape
        check_specify("block_diag of a block with a nonzero fill", t.numel(), t.element_size())
    x = dense_of(t) if isinstance(t, SparseTensor) else t
    x = x.reshape(shape)
    keys = torch.arange(x.numel(), device=x.device)
    return _index.unravel(keys, shape), x.reshape(-1).to(dtype), shape
