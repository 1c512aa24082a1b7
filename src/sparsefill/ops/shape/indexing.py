"""Indexing on the stored elements: ``select``, ``slice`` (``narrow``, ``A[a:b:s]``),
``index_select``, ``A[i, j, ...]``; ``split``, ``chunk`` and ``unbind`` decompose into them; ``flip
roll rot90 repeat tril triu diagonal trace nonzero masked_select masked_scatter``.  Writes and reads
at coordinates (``index_put``, ``scatter``, ``index_*``, ``gather``) are in ``coords.py``, joining
(``cat``, ``stack``) in ``concat.py``::

    op(A).to_dense() == op(A.to_dense())

Along a sparse dim the stored elements are filtered and their index re-based; along a dense dim
the op runs on the values and on the fill.

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor([[0, 2], [1, 0]], [1., 2.], (3, 2), fill_value=5.)
>>> A[1:].to_dense()
tensor([[5., 5.],
        [2., 5.]])
"""

from __future__ import annotations

import torch

from sparsefill._kernels import index as _index
from sparsefill._kernels.trace import traced
from sparsefill._tensor.parts import coalesced_parts, dense_of, every_element, parts_to_sparse
from sparsefill._kernels.grouping import pattern_cached
from sparsefill._tensor.policy import check_densify, check_specify
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops._schema import check_dtype, meta_of, probe_of
from sparsefill.ops.registry import register
from sparsefill.ops.shape.reshape import squeeze, with_zero_row

aten = torch.ops.aten


def _parts(A):
    idx, vals = coalesced_parts(A)
    return idx, vals, A.dim() - A.dense_dim()


def _build(A, idx, vals, shape, fill=None, layout=None):
    fill = A._fill if fill is None else fill
    sdim = idx.shape[0]
    layout = layout or (A._sf_layout if sdim >= 2 else torch.sparse_coo)
    return parts_to_sparse(
        idx, vals, torch.Size(shape), fill, indefinite=A._indefinite, layout=layout, coalesced=True
    )


def _dense_fill(A):
    return A._fill if A._indefinite else A._fill.expand(A._dense_shape)


def out_of_bounds(t: torch.Tensor, n: int, negative: bool = True):
    """The first index of ``t`` outside ``[-n, n)`` (``[0, n)`` unless ``negative``), or None.
    While traced None, and the check a runtime assert of the graph (it reads data)."""
    if traced(t):
        ok = ((t < n) & (t >= (-n if negative else 0))).all()
        torch._assert_async(ok, f"index out of range [{-n if negative else 0}, {n})")
        return None
    if not t.numel():
        return None
    bad = (t >= n) | (t < (-n if negative else 0))
    return int(t[bad].reshape(-1)[0]) if bool(bad.any()) else None


def _on_dense_dim(A, dim, fn):
    """``fn(t, d)`` applied to the values (dim ``d + 1``) and the fill (dim ``d``) along dense dim
    ``dim``."""
    idx, vals, sd = _parts(A)
    vals = fn(vals, dim - sd + 1)
    fill = A._fill if A._indefinite else fn(_dense_fill(A), dim - sd)
    return _build(A, idx, vals, A.shape[:sd] + vals.shape[1:], fill)


@register(aten.select.int)
def _select(func, args, kwargs):
    if args[0].dim() == 0:
        func(meta_of(args[0]), *args[1:])  # torch's error (a 0-d tensor has no dim to select)
    A, dim, index = args[0], args[1] % args[0].dim(), args[2]
    n = A.shape[dim]
    if not -n <= index < n:
        raise IndexError(
            f"select(): index {index} out of range for tensor of size {tuple(A.shape)} at "
            f"dimension {dim}"
        )
    index %= n
    # every element: a squeeze (O(1))
    if n == 1 and dim < A._sparse_ndim() and A._sf_layout is torch.sparse_coo:
        return squeeze(A, [dim])
    idx, vals, sd = _parts(A)
    if dim >= sd:
        return _on_dense_dim(A, dim, lambda t, d: t.select(d, index))
    keep = idx[dim] == index
    rest = [d for d in range(sd) if d != dim]
    shape = [s for d, s in enumerate(A.shape) if d != dim]
    # no sparse dim left: a 0-sparse-dim SparseTensor
    return _build(A, idx[rest][:, keep], vals[keep], shape)


@register(aten.slice.Tensor)
def _slice(func, args, kwargs):
    A = args[0]
    if A.dim() == 0:
        func(meta_of(A), *args[1:], **kwargs)  # torch's error (a 0-d tensor has no dim to slice)
    dim = (args[1] if len(args) > 1 else kwargs.get("dim", 0)) % A.dim()
    start, end = (
        (args[2] if len(args) > 2 else kwargs.get("start")),
        (args[3] if len(args) > 3 else kwargs.get("end")),
    )
    step = args[4] if len(args) > 4 else kwargs.get("step", 1)
    start, end, _ = slice(start, end, step).indices(A.shape[dim])
    count = max(0, -(-(end - start) // step))
    idx, vals, sd = _parts(A)
    if dim >= sd:
        return _on_dense_dim(
            A,
            dim,
            lambda t, d: t.narrow(d, 0, t.shape[d])[
                (slice(None),) * d + (slice(start, end, step),)
            ],
        )
    c = idx[dim] - start
    keep = (c >= 0) & (c < count * step) & (c % step == 0)
    idx = idx[:, keep].clone()
    idx[dim] = c[keep] // step
    shape = list(A.shape)
    shape[dim] = count
    return _build(A, idx, vals[keep], shape)


def _outside_stored(G: SparseTensor, sizes, dim: int, rest, fill) -> SparseTensor:
    """``slice_backward`` of ``G`` with a nonzero fill, the cheaper exact form where the slice takes
    most of ``sizes``: ``G``'s fill kept, ``G``'s stored elements moved into place and the positions
    outside the slice stored as zeros (O(nse + outside), not O(numel of G): the gradient of
    ``a[1:]`` of a long ``a``)."""
    start, stop, step = slice(rest[0], rest[1], rest[2]).indices(sizes[dim])
    hit = torch.zeros(sizes[dim], dtype=torch.bool, device=G.device)
    hit[start:stop:step] = True
    comp = (~hit).nonzero().squeeze(1)
    sd = G._sparse_ndim()
    outer = list(sizes[:sd])
    outer[dim] = comp.numel()
    out_idx = _index.unravel(torch.arange(_index.numel(outer), device=G.device), outer)
    out_idx[dim] = comp[out_idx[dim]]
    idx, vals = coalesced_parts(G)
    idx = idx.clone()
    idx[dim] = idx[dim] * step + start
    zeros = vals.new_zeros((out_idx.shape[1],) + tuple(vals.shape[1:]))
    return parts_to_sparse(
        torch.cat([idx, out_idx], 1),
        torch.cat([vals, zeros]),
        torch.Size(sizes),
        fill,
        layout=torch.sparse_coo,
    )


def _covers(func, sizes, dim, rest) -> bool:
    """Whether the select/slice took every index of ``dim`` (a select on a size-1 dim, a full
    slice)."""
    if func is aten.select_backward.default:
        return sizes[dim] == 1
    start, stop, step = slice(rest[0], rest[1], rest[2]).indices(sizes[dim])
    return start == 0 and step == 1 and stop == sizes[dim]


@register(aten.slice_backward.default, aten.select_backward.default)
def _slice_backward(func, args, kwargs):
    """``slice_backward(G, sizes, dim, start, end, step)``, ``select_backward(G, sizes, dim,
    index)``: ``G`` in zeros of ``sizes`` (a gradient: an indefinite fill is 0), fill 0, storing
    ``G``'s elements -- all of them where ``G``'s fill is not 0: O(numel of ``G``), never of
    ``sizes``.  A select along ``G``'s first dense dim position was on the input's last sparse dim
    or on its first dense dim: the gradient gets a sparse dim there where ``G``'s fill is 0 (only
    ``G``'s stored elements), else a dense dim (``G``'s pattern, the fill ``G``'s at ``index``); the
    constructor's backward (``_autograd.grad_parts``) reads either with the input's dense dims."""
    G, sizes, dim, rest = args[0], list(args[1]), args[2] % len(args[1]), args[3:]
    sd = G._sparse_ndim()
    if func is aten.select_backward.default:
        sd += (
            dim < sd
            or dim == sd
            and (G._indefinite or G._fill_is_zero() or not bool(G._fill.ne(0).any()))
        )
    fill = G._fill.new_zeros(()) if G._indefinite else G._fill.expand(G._dense_shape)
    if dim >= sd:  # a dense dim: the same on the values and the fill
        idx, vals = coalesced_parts(G)
        vals = func(vals, [vals.shape[0]] + sizes[sd:], dim - sd + 1, *rest)
        fill = func(fill, sizes[sd:], dim - sd, *rest)
        return parts_to_sparse(
            idx, vals, torch.Size(sizes), fill, layout=torch.sparse_coo, coalesced=True
        )
    # no zeros around G: G itself, its fill kept
    if _covers(func, sizes, dim, rest) and not G._indefinite:
        idx, vals = coalesced_parts(G)
        if func is aten.select_backward.default:
            idx = with_zero_row(idx, dim, G.shape)
        return parts_to_sparse(
            idx, vals, torch.Size(sizes), fill, layout=torch.sparse_coo, coalesced=True
        )
    if G._indefinite or G._fill_is_zero() or not bool(fill.ne(0).any()):
        idx, vals = coalesced_parts(G)
    elif (
        func is aten.slice_backward.default
        and _index.numel(sizes[:sd]) - _index.numel(G.shape[:sd])
        < _index.numel(G.shape[:sd]) - G._nse()
    ):
        return _outside_stored(G, sizes, dim, rest, fill)
    else:  # every element of G, stored
        check_specify(
            f"{func.__name__} of a gradient with a nonzero fill", G.numel(), G.element_size()
        )
        idx, vals = every_element(G)
    if func is aten.select_backward.default:
        idx = torch.cat(
            [idx[:dim], idx.new_full((1, idx.shape[1]), rest[0] % sizes[dim]), idx[dim:]]
        )
    else:
        start, _, step = slice(rest[0], rest[1], rest[2]).indices(sizes[dim])
        idx = idx.clone()
        idx[dim] = idx[dim] * step + start
    zero = vals.new_zeros(())
    return parts_to_sparse(
        idx, vals, torch.Size(sizes), zero, known_zero=True, layout=torch.sparse_coo, coalesced=True
    )


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
        crow = torch._convert_indices_from_coo_to_csr(idx[0], shape[0])
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
        crow = lambda: torch._convert_indices_from_coo_to_csr(rows, n)
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


@register(aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int)
def _split(func, args, kwargs):
    """Pieces along ``dim``: slices (split, split_with_sizes) or selects (unbind)."""
    A = args[0]
    dim = (
        (args[2] if len(args) > 2 else kwargs.get("dim", 0))
        if func is not aten.unbind.int
        else (args[1] if len(args) > 1 else kwargs.get("dim", 0))
    )
    dim %= A.dim()
    n = A.shape[dim]
    if func is aten.unbind.int:
        return tuple(_select(aten.select.int, (A, dim, i), {}) for i in range(n))
    sizes = args[1]
    if isinstance(sizes, int):
        if sizes <= 0 and n:
            raise RuntimeError(
                f"split_size can only be 0 if dimension size is 0, but got dimension size of {n}"
            )
        sizes = [min(sizes, n - s) for s in range(0, n, sizes)] if sizes and n else [0]
    if sum(sizes) != n:
        raise RuntimeError(
            f"split_with_sizes expects split_sizes to sum exactly to {n} (input tensor's size at "
            f"dimension {dim}), but got split_sizes={list(sizes)}"
        )
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return tuple(
        _slice(aten.slice.Tensor, (A, dim, s, s + k, 1), {}) for s, k in zip(starts, sizes)
    )


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
    return (
        parts_to_sparse(idx, vals, A.shape, fill, indefinite=A._indefinite, layout=torch.sparse_coo)
        if A._sf_layout is torch.sparse_coo or sd < 2
        else parts_to_sparse(
            idx, vals, A.shape, fill, indefinite=A._indefinite, layout=A._sf_layout
        )
    )


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
        return parts_to_sparse(
            _index.unravel(keys, A.shape),
            vals,
            A.shape,
            A._fill,
            indefinite=A._indefinite,
            layout=A._sf_layout if sd >= 2 else torch.sparse_coo,
        )
    idx = idx.clone()
    for s, d in zip(shifts, dims):
        d %= A.dim()
        if d >= sd:
            vals = vals.roll(s, d - sd + 1)
            fill = A._fill if A._indefinite else _dense_fill(A).roll(s, d - sd)
            A = parts_to_sparse(
                idx, vals, A.shape, fill, indefinite=A._indefinite, layout=torch.sparse_coo
            )
        elif A.shape[d]:
            idx[d] = (idx[d] + s) % A.shape[d]
    return parts_to_sparse(
        idx,
        vals,
        A.shape,
        A._fill,
        indefinite=A._indefinite,
        layout=args[0]._sf_layout if sd >= 2 else torch.sparse_coo,
    )


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
        return parts_to_sparse(
            idx,
            vals,
            A.shape,
            A._fill,
            indefinite=A._indefinite,
            layout=A._sf_layout,
            coalesced=True,
        )
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


@register(aten.index.Tensor)
def _index_tensor(func, args, kwargs):
    """``A[t]``, ``A[:, t]``, ``A[mask]``: one index tensor (the other positions ``:``) is an
    ``index_select`` — an integer tensor over one dim (result dims ``t.shape`` there), a bool mask
    over ``k`` dims through its true positions in those dims flattened.  Several index tensors: next
    stage."""
    A, indices = args[0], list(args[1])
    given = [i for i, t in enumerate(indices) if t is not None]
    if any(isinstance(indices[i], SparseTensor) for i in given):
        return NotImplemented
    if len(given) > 1:
        return _index_many(A, indices)
    p, t = given[0], indices[given[0]]
    shape = tuple(A.shape)
    if t.dtype in (torch.bool, torch.uint8):
        k = t.dim()
        if t.shape != shape[p : p + k]:
            raise IndexError(
                f"The shape of the mask {list(t.shape)} at index {p} does not match the shape of "
                f"the indexed tensor {list(shape)}"
            )
        keys = _index.linearize(t.nonzero().T, t.shape)
        B = A.reshape(shape[:p] + (_index.numel(t.shape),) + shape[p + k :]) if k != 1 else A
        return aten.index_select.default(B, p, keys)
    if t.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8):
        raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
    n = shape[p]
    bad = out_of_bounds(t, n)
    if bad is not None:
        raise IndexError(f"index {bad} is out of bounds for dimension {p} with size {n}")
    out = aten.index_select.default(A, p, t.reshape(-1) % max(n, 1))
    return out if t.dim() == 1 else out.reshape(shape[:p] + tuple(t.shape) + shape[p + 1 :])


def _index_many(A, indices):
    """Several index tensors (bool masks: their ``nonzero()`` coordinates): the indexed dims, moved
    to the front unless adjacent (torch's placement rule), merge into one dim by a ``reshape``,
    indexed by the linearised broadcast indices."""
    expanded = []
    for t in indices:
        if t is not None and t.dtype in (torch.bool, torch.uint8):
            d = len(expanded)
            if tuple(t.shape) != tuple(A.shape[d : d + t.dim()]):
                raise IndexError(
                    f"The shape of the mask {list(t.shape)} at index {d} does not match the "
                    f"shape of the indexed tensor {list(A.shape)}"
                )
            expanded += list(t.nonzero().T)
        else:
            expanded.append(t)
    try:
        torch.broadcast_shapes(*[t.shape for t in expanded if t is not None])
    except RuntimeError:
        raise IndexError(
            "shape mismatch: indexing tensors could not be broadcast together with shapes "
            + ", ".join(str(list(t.shape)) for t in expanded if t is not None)
        ) from None
    # torch's shape errors
    aten.index.Tensor(meta_of(A), [None if t is None else t.to("meta") for t in expanded])
    given = [i for i, t in enumerate(expanded) if t is not None]
    for d in given:
        bad = out_of_bounds(expanded[d], A.shape[d])
        if bad is not None:
            raise IndexError(
                f"index {bad} is out of bounds for dimension {d} with size {A.shape[d]}"
            )
    adjacent = given == list(range(given[0], given[-1] + 1))
    p = given[0] if adjacent else 0
    if not adjacent:
        A = A.permute(given + [d for d in range(A.dim()) if d not in given])
    sizes = [A.shape[p + j] for j in range(len(given))]
    idx = torch.broadcast_tensors(*[expanded[d] % max(A_n, 1) for d, A_n in zip(given, sizes)])
    flat = _index.linearize(torch.stack([t.reshape(-1) for t in idx]), sizes)
    shape = tuple(A.shape)
    B = A.reshape(shape[:p] + (_index.numel(sizes),) + shape[p + len(given) :])
    out = aten.index_select.default(B, p, flat)
    return out.reshape(shape[:p] + tuple(idx[0].shape) + shape[p + len(given) :])


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


@register(aten.nonzero.default, aten.argwhere.default)
def _nonzero(func, args, kwargs):
    """``nonzero(A)``: the coordinates of the nonzero elements in row-major order, as torch lists
    them.  With a zero fill they are stored ones, O(nse).  A nonzero (or NaN) fill makes every
    unspecified element nonzero: the result is dense by nature (as long as ``A`` has elements), so
    it is built in one pass from a mask of ``A``'s elements, the fill's where unspecified, under the
    densify policy's ``dense_by_nature``.  An indefinite fill: the next stage."""
    A = args[0]
    if A._indefinite:
        return NotImplemented
    idx, vals = coalesced_parts(A)
    if not A._fill_is_zero():
        return aten.nonzero.default(_nonzero_mask(A, idx, vals))
    if A.dense_dim():
        nz = (vals != 0).nonzero()
        idx = torch.cat([idx[:, nz[:, 0]], nz[:, 1:].T])
    else:
        idx = idx[:, vals != 0]
    return idx.T.contiguous()


_nonzero.dense_by_nature = "a nonzero fill: every unspecified element is listed"


def _nonzero_mask(A: SparseTensor, idx: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
    """``A != 0`` as a dense bool tensor: the fill's test where unspecified, the stored values'
    where stored (the mask of a result that lists every element, dense by nature)."""
    check_densify(
        "nonzero of a SparseTensor with a nonzero fill (every unspecified element listed)",
        A.numel() * (1 + 8 * max(A.dim(), 1)),
        by_nature=True,
    )
    S, Dn = A._sparse_shape, _index.numel(A._dense_shape)
    mask = (A._fill != 0).expand(A._dense_shape).reshape(1, Dn).repeat(_index.numel(S), 1)
    mask[_index.linearize(idx, S)] = (vals != 0).reshape(-1, Dn)
    return mask.reshape(A.shape)


@register(aten.nonzero_static.default)
def _nonzero_static(func, args, kwargs):
    """``nonzero_static(A, size=, fill_value=)``: :func:`_nonzero`'s rows, the first ``size`` of
    them, padded with rows of ``fill_value`` to ``size``."""
    A = args[0]
    size, fill_value = kwargs["size"], kwargs.get("fill_value", -1)
    if A._indefinite:
        return NotImplemented
    func(meta_of(A), size=size, fill_value=fill_value)  # torch's errors (a negative size)
    rows = _nonzero(aten.nonzero.default, (A,), {})[:size]
    pad = rows.new_full((size - rows.shape[0], rows.shape[1]), fill_value)
    return torch.cat([rows, pad])


@register(aten.masked_select.default)
def _masked_select(func, args, kwargs):
    """``A[mask]`` with ``A`` and ``mask`` broadcast (a 1-D SparseTensor of the selected
    elements)."""
    A, mask = args[0], args[1]
    if isinstance(mask, SparseTensor):
        return NotImplemented
    if mask.dtype != torch.bool:
        raise RuntimeError(f"masked_select: expected BoolTensor for mask, got {mask.dtype}")
    shape = torch.broadcast_shapes(A.shape, mask.shape)  # torch's shape error
    if A.shape != shape:
        A = A.expand(shape)
    return aten.index.Tensor(A, [mask.expand(shape)])


@register(aten.masked_scatter.default, aten.masked_scatter_.default)
def _masked_scatter(func, args, kwargs):
    """``A.masked_scatter(mask, source)``: the elements where ``mask`` (broadcast) is True take
    ``source``'s first elements in row-major order and join the pattern (``coords.write``), O(nse +
    mask's elements)::

        A.masked_scatter(mask, s).to_dense() == A.to_dense().masked_scatter(mask, s)

    It is the backward of ``masked_select`` (the upstream gradient scattered into
    ``zeros_like(A)``): a SparseTensor on the selected elements.  A SparseTensor mask with a False
    fill gives its stored True elements; a SparseTensor source is read densely at its first
    elements; other masks, an indefinite source, a hybrid indefinite ``A``: the next stage."""
    from sparsefill.ops.shape.coords import _result, write  # (coords.py imports this module)

    A, mask, source = args[0], args[1], args[2]
    sparse_mask = isinstance(mask, SparseTensor)
    if (
        not isinstance(A, SparseTensor)
        or isinstance(source, SparseTensor)
        and source._indefinite
        or A._indefinite
        and A.dense_dim()
        or sparse_mask
        and (mask._indefinite or not mask._fill_is_zero())
    ):
        return NotImplemented
    # torch's dtype errors, from the real kernel
    probe = torch.empty(0, dtype=A.dtype, device=A.device)
    probe.masked_scatter_(torch.empty(0, dtype=mask.dtype, device=A.device), source.new_empty(0))
    shape = torch.broadcast_shapes(A.shape, mask.shape)  # torch's shape error
    if shape != A.shape:
        if func is aten.masked_scatter_.default:
            raise RuntimeError(
                f"masked_scatter_: mask of shape {list(mask.shape)} does not broadcast to self "
                f"of shape {list(A.shape)}"
            )
        A = A.expand(shape)
    coords = aten.nonzero.default(mask.expand(shape)).T  # row-major, as torch fills them
    if source.numel() < coords.shape[1]:
        raise RuntimeError("Number of elements of source < number of ones in mask")
    src = source.reshape(-1)[: coords.shape[1]]
    return _result(
        func, args[0], write(A, coords, dense_of(src) if isinstance(src, SparseTensor) else src)
    )


@register(aten.masked_fill_.Scalar, aten.masked_fill_.Tensor)
def _masked_fill_(func, args, kwargs):
    """``A.masked_fill_(mask, value)`` with a dense ``mask`` that varies along ``A``'s sparse dims
    (``loss.masked_fill_(target == ignore_index, 0)`` in torch's cross_entropy): the elements where
    ``mask`` is True take ``value`` and join the pattern (``coords.write``), O(nse + mask's
    elements); the others keep their values and the fill.  Other masks (0-d, over the dense dims,
    a SparseTensor), a masked ``A``: the element-wise rule.  (Out of place, the rule gives the dense
    result: the mask is dense, and where it is mostly True the dense form is the cheaper one.)"""
    from sparsefill.ops.pointwise.dense_operands import _over_dense_dims
    from sparsefill.ops.shape.coords import _result, write  # (coords.py imports this module)

    A, mask, value = args[0], args[1], args[2]
    if (
        not isinstance(A, SparseTensor)
        or A._indefinite
        or isinstance(mask, SparseTensor)
        or isinstance(value, SparseTensor)
        or not mask.dim()
        or _over_dense_dims(mask, A) is not None
        or torch.broadcast_shapes(A.shape, mask.shape) != A.shape
    ):
        return NotImplemented
    if mask.dtype != torch.bool:  # (torch's error; its meta kernel does not check)
        raise RuntimeError(
            f"masked_fill_ only supports boolean masks, but got mask with dtype {mask.dtype}"
        )
    func(meta_of(A), mask.to("meta"), value.to("meta") if torch.is_tensor(value) else value)
    coords = aten.nonzero.default(mask.expand(A.shape)).T
    v = torch.as_tensor(value, dtype=A.dtype, device=A.device).expand(coords.shape[1])
    return _result(func, A, write(A, coords, v))


@register(aten.trace.default)
def _trace(func, args, kwargs):
    """``trace(A) = diagonal(A).sum()``."""
    A = args[0]
    check_dtype(func, A)  # torch's errors (2-D only; no bool)
    return aten.sum.default(aten.diagonal.default(A))


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
