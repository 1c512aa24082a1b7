"""``index_select`` on the stored elements::

    A.index_select(dim, index).to_dense() == A.to_dense().index_select(dim, index)

Along a sparse dim the stored elements whose coordinate ``index`` names, re-based to their
positions in ``index`` (each once per occurrence): the leading dim by ranges of rows
(:func:`_select_rows`; a CSR's rows from its row pointers), another by a lookup of the coordinates
(:func:`_select_coords`); while traced one general form.  Along a dense dim on the values and on
the fill.  ``A[t]`` and ``A[mask]`` (``indexing.py``) come here.
"""

from __future__ import annotations

import torch

from sparsefill._kernels import index as _index
from sparsefill._kernels.trace import traced
from sparsefill._tensor.parts import coalesced_parts, dense_of, parts_to_sparse
from sparsefill._kernels.grouping import pattern_cached
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops.registry import register
from sparsefill.ops.shape.indexing import _on_dense_dim, out_of_bounds

aten = torch.ops.aten


@register(aten.index_select.default)
def _index_select(func, args, kwargs):
    """``A.index_select(dim, index)``: along a sparse dim the stored elements whose coordinate
    ``index`` names, re-based to their positions in ``index`` (each once per occurrence), in
    O(output + |index|) for the leading dim and O(nse + |index| + size) along another
    (:func:`_select_rows`, :func:`_select_coords`); along a dense dim on the values and the fill."""
    A, dim, index = args[0], args[1] % max(args[0].dim(), 1), args[2]
    if A.dim() == 0:  # one value
        return func(dense_of(A), *args[1:], **kwargs)
    if out_of_bounds(index, A.shape[dim], negative=False) is not None:
        raise IndexError("index out of range in self")  # (torch's message; negative indices too)
    index = index.reshape(-1)
    sd = A.dim() - A.dense_dim()
    if dim >= sd:
        return _on_dense_dim(A, dim, lambda t, d: t.index_select(d, index))
    shape = list(A.shape)
    shape[dim] = index.numel()
    if traced(A._vals) or traced(index):  # (data-dependent branches below: the one general form)
        return _index_select_traced(A, dim, index, shape)
    index = index.long()
    if dim == 0 and A._sf_layout is torch.sparse_csr and A._crow.dim() == 1:
        return _select_csr_rows(A, index, shape)
    idx, vals = coalesced_parts(A)
    if dim == 0:
        owner = idx if A._sf_layout is torch.sparse_coo and A._coalesced else None
        pos, rows = _select_rows(idx[0], index, A.shape[0], owner)
        new = _index.take_columns(idx, pos, 0, rows)
    else:
        pos, coord, coalesced = _select_coords(idx[dim], index, A.shape[dim], last=dim == sd - 1)
        new = _index.take_columns(idx, pos, dim, coord)
        # sorted once here: later ops read a coalesced result without sorting it again
        if not coalesced:
            # (distinct positions: no tie)
            perm = torch.sort(_index.linearize(new, shape[:sd])).indices
            new, pos = _index.take_columns(new, perm), pos.index_select(0, perm)
    return _sorted_result(A, new, vals.index_select(0, pos), shape)


def _sorted_result(A, idx, vals, shape):
    """The SparseTensor of sorted, unique parts ``(idx, vals)`` with ``A``'s fill, in ``A``'s layout
    (COO with fewer than two sparse dims); a 2-D CSR's row pointers straight from the sorted
    rows."""
    known_zero = A._fill_is_zero()
    if A._sf_layout is torch.sparse_csr and idx.shape[0] == 2:
        crow = torch._convert_indices_from_coo_to_csr(idx[0].contiguous(), shape[0])
        return SparseTensor._make(
            torch.sparse_csr,
            torch.Size(shape),
            vals,
            A._fill,
            None,
            crow,
            idx[1],
            A._indefinite,
            True,
            known_zero,
        )
    return parts_to_sparse(
        idx,
        vals,
        torch.Size(shape),
        A._fill,
        indefinite=A._indefinite,
        known_zero=known_zero,
        coalesced=True,
        layout=A._sf_layout if idx.shape[0] >= 2 else torch.sparse_coo,
    )


def _ranges(starts: torch.Tensor, lengths: torch.Tensor):
    """``(run, pos)``: the positions ``starts[r] .. starts[r] + lengths[r] - 1`` of the ranges laid
    end to end, and the range ``r`` of each.

    >>> [t.tolist() for t in _ranges(torch.tensor([5, 0, 2]), torch.tensor([2, 0, 3]))]
    [[0, 0, 2, 2, 2], [5, 6, 2, 3, 4]]
    """
    run = _index.runs_to_ids(lengths, int(lengths.sum()))
    shift = starts - (torch.cumsum(lengths, 0) - lengths)  # (position minus place in the output)
    return run, torch.arange(run.numel(), device=run.device) + shift.index_select(0, run)


def _select_rows(rows: torch.Tensor, index: torch.Tensor, n: int, owner: torch.Tensor | None):
    """``(pos, new_rows)`` of ``index_select(0, index)`` over sorted leading coordinates ``rows`` in
    ``[0, n)``: row ``index[j]`` is the range ``crow[index[j]] .. crow[index[j] + 1]`` of the row
    pointers, gathered in the order of ``index``, so the result is sorted (coalesced) for any
    ``index``, duplicates and unsorted ones included.  The row pointers (O(nse + n)) are kept per
    pattern (``owner``: the tensor's own indices, whose first row is ``rows``; a view made here
    records no base, so the cache is keyed by the owner) while ``n`` is within a few per stored
    element; else two binary searches per entry of ``index`` (O(|index| log nse), memory-bound)."""
    if n <= _LUT_PER_ELEMENT * rows.numel() + 4096:
        crow = lambda: torch._convert_indices_from_coo_to_csr(rows.contiguous(), n)
        crow = crow() if owner is None else pattern_cached(("row_pointers", n), (owner,), crow)
        lo = crow.index_select(0, index)
        hi = crow.index_select(0, index + 1)
    else:
        lo = torch.searchsorted(rows, index)
        hi = torch.searchsorted(rows, index, right=True)
    run, pos = _ranges(lo, hi - lo)
    return pos, run


def _select_csr_rows(A, index, shape):
    """Rows ``index`` of a 2-D CSR (hybrid too): the ranges ``crow[i] .. crow[i + 1]`` read off the
    row pointers, O(output + |index|); the new row pointers are the cumulative lengths."""
    crow = A._crow
    lo = crow.index_select(0, index)
    lengths = crow.index_select(0, index + 1) - lo
    _, pos = _ranges(lo, lengths)
    new_crow = torch.cat([crow.new_zeros(1), torch.cumsum(lengths, 0)])
    return SparseTensor._make(
        torch.sparse_csr,
        torch.Size(shape),
        A._vals.index_select(0, pos),
        A._fill,
        None,
        new_crow,
        A._col.index_select(0, pos),
        A._indefinite,
        True,
        A._fill_is_zero(),
    )


_LUT_PER_ELEMENT = (
    8  # dim size per stored element and index entry up to which tables beat binary searches
)


def _select_coords(coord: torch.Tensor, index: torch.Tensor, n: int, last: bool):
    """``(src, new_coord, coalesced)``: the stored elements (``src``, repeated once per occurrence
    of their coordinate in ``index``) and their positions in ``index`` along a non-leading sparse
    dim of size ``n``.

    While ``n`` is within ``_LUT_PER_ELEMENT`` per stored element, tables over ``[0, n)``: a
    one-byte mask ``count[c] > 0`` read per stored element (O(nse + n), cache-friendly), then for
    the kept ones their places in ``index`` (``lut[c]``; repeated values: their run in the stably
    sorted ``index``); else binary searches in the sorted ``index`` (O(nse log |index|)).  The
    stored order is kept, so the result is coalesced when ``index`` is sorted and either unique or
    over the last sparse dim (no later coordinate to interleave); else the caller sorts it."""
    m = index.numel()
    ordered = m < 2 or bool((index[1:] >= index[:-1]).all())
    if not m or not coord.numel():
        return coord.new_zeros(0), coord.new_zeros(0), True
    if n <= _LUT_PER_ELEMENT * (coord.numel() + m) + 4096:
        count = torch.bincount(index, minlength=n)
        kept = _index.flat_nonzero((count > 0).index_select(0, coord))
        c = coord.index_select(0, kept)
        if int(count.max()) <= 1:  # unique: one place each
            # (read only where count > 0)
            lut = torch.empty(n, dtype=torch.int64, device=index.device)
            lut[index] = torch.arange(m, device=index.device)
            return kept, lut.index_select(0, c), ordered
        starts = torch.cumsum(count, 0) - count  # (first place of each value in the sorted index)
        run, at = _ranges(starts.index_select(0, c), count.index_select(0, c))
        order = (
            torch.arange(m, device=index.device) if ordered else torch.argsort(index, stable=True)
        )
        return kept.index_select(0, run), order.index_select(0, at), ordered and last
    order = None if ordered else torch.argsort(index, stable=True)
    sidx = index if ordered else index.index_select(0, order)
    lo = torch.searchsorted(sidx, coord)
    # (src: run = stored element)
    src, at = _ranges(lo, torch.searchsorted(sidx, coord, right=True) - lo)
    unique = m < 2 or bool((sidx[1:] != sidx[:-1]).all())
    return src, at if order is None else order.index_select(0, at), ordered and (unique or last)


def _index_select_traced(A, dim, index, shape):
    """The general form while traced (no data-dependent branch): each stored element goes to every
    output position ``j`` with ``index[j]`` equal to its coordinate, by binary searches in the
    sorted ``index``."""
    idx, vals = coalesced_parts(A)
    sd = idx.shape[0]
    order = torch.argsort(index, stable=True)
    lo = torch.searchsorted(index[order], idx[dim])
    hi = torch.searchsorted(index[order], idx[dim], right=True)
    reps = hi - lo
    src = _index.runs_to_ids(reps, reps.sum().item())  # (an unbacked size)
    within = torch.arange(src.numel(), device=idx.device) - (torch.cumsum(reps, 0) - reps)[src]
    new = idx[:, src].clone()
    new[dim] = order[lo[src] + within]
    B = parts_to_sparse(
        new,
        vals[src],
        torch.Size(shape),
        A._fill,
        indefinite=A._indefinite,
        layout=torch.sparse_coo,
    )
    return B if A._sf_layout is torch.sparse_coo or sd < 2 else B.to_sparse(layout=A._sf_layout)
