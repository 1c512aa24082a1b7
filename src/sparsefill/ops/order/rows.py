"""The rows of an order statistic: every 1-D slice of a SparseTensor along a sparse dim (the other
sparse dims and each dense coordinate fixed) is its stored values merged with one run of ``n``
copies of the fill (``n`` = its unspecified elements).  In stable order a row is::

    [stored x "before" f, sorted]  [the run: every position whose value equals f, ascending]
                                   [stored x "after" f, sorted]

("before": ``x < f`` ascending, ``x > f`` descending, NaN the largest as in torch), so the rank of
every element follows from a sort of the stored values alone: ``O(nse log nse)``.  On CPU the
compiled row kernels (``_kernels/order_numba.py``, once the segment backend loads numba) sort each
row's stored values and write the output in one pass (:func:`sorted_head`, :func:`ranked`);
elsewhere torch ops do it (:class:`Rows`).  The run's ``t``-th position is
``u = t + #{j : e_j - j <= t}`` over the row's stored positions ``e_0 < e_1 < ...`` outside the
run.
"""

from __future__ import annotations

import torch

from sparsefill._kernels import index as _index
from sparsefill._kernels import order as _order
from sparsefill._kernels.grouping import pattern_cached
from sparsefill._tensor.parts import coalesced_parts
from sparsefill._tensor.tensor import SparseTensor


def bind(func, args, kwargs) -> dict:
    """The arguments of ``func`` by name, defaults from its schema."""
    out = {}
    for i, a in enumerate(func._schema.arguments):
        out[a.name] = args[i] if i < len(args) else kwargs.get(a.name, a.default_value)
    return out


def _nan(t: torch.Tensor) -> torch.Tensor:
    return torch.isnan(t) if t.is_floating_point() else torch.zeros_like(t, dtype=torch.bool)


def _ahead(x: torch.Tensor, f: torch.Tensor, descending: bool) -> torch.Tensor:
    """``x`` sorts strictly ahead of ``f`` (NaN the largest, as torch.sort)."""
    nx, nf = _nan(x), _nan(f)
    if descending:
        return (x > f) | (nx & ~nf)
    return (x < f) | (nf & ~nx)


class Rows:
    """Rows ``r`` in ``[0, R)`` of ``size`` elements each: the stored ones ``(r, p, v)`` (in
    ``(r, p)`` order within a row), the rest ``f_rows[r]``; stable-sorted once.

    :meth:`dense` gives the first ``width`` elements of every sorted row (values, positions),
    :meth:`at` the element of rank ``t[r]`` of each row.

    >>> rows = Rows(torch.tensor([0, 0]), torch.tensor([1, 3]), torch.tensor([5., -1.]),
    ...             torch.tensor([0.]), 1, 4, descending=False)
    >>> [t.tolist() for t in rows.dense(4)]
    [[[[-1.0], [0.0], [0.0], [5.0]]], [[[3], [0], [2], [1]]]]
    """

    def __init__(self, r, p, v, f_rows, R: int, size: int, descending: bool):
        self.R, self.size, self.f_rows = R, size, f_rows
        k, dev = r.numel(), r.device
        if k > 1 and not bool((r[1:] >= r[:-1]).all()):
            # (a stable sort by row keeps each row's (r, p) order)
            g = torch.sort(r, stable=True).indices
            r, p, v = r[g], p[g], v[g]
        self.cnt = torch.bincount(r, minlength=R)
        self.start = torch.cumsum(self.cnt, 0) - self.cnt
        fr = f_rows[r]
        before, after = _ahead(v, fr, descending), _ahead(fr, v, descending)
        self.nlow = torch.bincount(r[before], minlength=R)
        self.nhigh = torch.bincount(r[after], minlength=R)
        # the stored elements outside the run in (row, position) order: e_j, and b_j = e_j - j
        ex = before | after
        self.all_ex = bool(ex.all())
        if self.all_ex:
            self.erow, self.estart, eb_j = r, self.start, None
        else:
            self.erow = r[ex]
            ecnt = torch.bincount(self.erow, minlength=R)
            self.estart = torch.cumsum(ecnt, 0) - ecnt
            eb_j = torch.arange(self.erow.numel(), device=dev) - self.estart[self.erow]
        self.q = torch.arange(k, device=dev) - self.start[r]  # (rank within the row)
        self.eb = p - self.q if eb_j is None else p[ex] - eb_j
        self._ex = ex
        order = _row_order(r, v, self.cnt, self.start, self.q, R, descending)
        self.order = order
        self.r, self.p, self.v = r, p[order], v[order]
        self.before, self.after = before[order], after[order]

    def _slots(self):
        """The output slot of every stored element (sorted order): its rank among the stored
        ahead of the fill, its place in the fill's run, or from the end."""
        r, q = self.r, self.q
        slot = torch.where(self.before, q, self.size - self.cnt[r] + q)
        if self.all_ex:
            return slot
        # in the run: its position less the stored outside the run ahead of it in its row (those
        # ahead of it in all rows, less those of the rows before: estart)
        exc = torch.cumsum(self._ex, 0) - self._ex.long()
        ex_ahead = (exc - self.estart[r])[self.order]
        run = self.nlow[r] + self.p - ex_ahead
        return torch.where(self.before | self.after, slot, run)

    def dense(self, width: int, post: int = 1):
        """``(values, positions)``, each ``(R // post, width, post)``: the first ``width`` of
        every sorted row, row ``r`` at ``(r // post, :, r % post)`` (the layout of a tensor whose
        sorted dim has ``post`` elements after it: no transpose)."""
        R, dev = self.R, self.r.device
        pre = R // max(post, 1)
        f = self.f_rows
        vals = torch.empty((pre, width, post), dtype=f.dtype, device=dev)
        if f.numel() and f.stride(0) == 0:  # (one fill: a plain fill_ of the output)
            vals.fill_(f[0])
        else:
            vals.copy_(f.reshape(pre, 1, post).expand(pre, width, post))
        # positions: the run's t-th element is t + #{j : b_j <= t}: a cumulative sum of ones,
        # -nlow[r] at column 0 and one more step at each b_j + nlow[r] (in place: one pass)
        pos = torch.ones((pre, width, post), dtype=torch.int64, device=dev)
        if width:
            pos[:, 0, :] = -self.nlow.reshape(pre, post)
        col = self.eb + self.nlow[self.erow]
        ok = col < width
        steps = self._flat(self.erow[ok], col[ok], width, post)
        pos.view(-1).index_add_(0, steps, torch.ones_like(steps))
        pos.cumsum_(1)
        slot = self._slots()
        ok = slot < width
        flat = self._flat(self.r[ok], slot[ok], width, post)
        vals.view(-1)[flat] = self.v[ok]
        pos.view(-1)[flat] = self.p[ok]
        return vals, pos

    @staticmethod
    def _flat(r, col, width: int, post: int):
        """The flat index of ``(row, column)`` in the ``(R // post, width, post)`` layout."""
        if post == 1:
            return r * width + col
        return (r // post) * (width * post) + col * post + r % post

    def at(self, t: torch.Tensor, rows=None):
        """``(values, positions)`` of rank ``t`` (``0 <= t < size``) of each row (``rows``: of
        those rows, ``t`` one per row given)."""
        size, dev = self.size, self.r.device
        rows = torch.arange(self.R, device=dev) if rows is None else rows
        nlow, nhigh, start, cnt = (
            self.nlow[rows],
            self.nhigh[rows],
            self.start[rows],
            self.cnt[rows],
        )
        low = t < nlow
        high = t >= size - nhigh
        tp = t - nlow
        # (b_j ascends within a row: count those <= tp by a search over (row, b) keys)
        bkey = self.erow * (size + 1) + self.eb
        n_le = torch.searchsorted(bkey, rows * (size + 1) + tp, right=True) - self.estart[rows]
        u = tp + n_le
        k = self.v.numel()
        gi = torch.where(low, start + t, start + cnt - (size - t))
        gi = torch.where(low | high, gi, k).clamp(0, k)
        v = torch.cat([self.v, self.v.new_zeros(1)])[gi]
        p = torch.cat([self.p, self.p.new_zeros(1)])[gi]
        stored = low | high
        return torch.where(stored, v, self.f_rows[rows].to(v.dtype)), torch.where(stored, p, u)


def _row_order(r, v, cnt, start, q, R: int, descending: bool) -> torch.Tensor:
    """The permutation sorting the stored elements, grouped by row in position order, by (row,
    value; stable: position).  Rows of at most a few elements each (the common case): every row
    padded to the longest and sorted at once (``torch.sort`` along a small last dim), else two
    stable sorts of all of them."""
    k = r.numel()
    if not k:
        return torch.zeros(0, dtype=torch.int64, device=r.device)
    width = int(cnt.max())
    if R * width > 4 * k + 1024 or v.dtype == torch.bool:
        order = torch.sort(v, stable=True, descending=descending).indices
        return order[torch.sort(r[order], stable=True).indices]
    flat = r * width + q
    P = torch.full((R, width), _pad_value(v.dtype, descending), dtype=v.dtype, device=v.device)
    P.view(-1)[flat] = v
    srt = torch.sort(P, dim=1, stable=True, descending=descending).indices
    # (pads sort last in every row, after equal values, being later: the row's first cnt[r]
    # sorted columns are its elements)
    return start[r] + srt.view(-1)[flat]


def _pad_value(dtype, descending: bool):
    """A value every element sorts no later than (stable: a pad after real equal values)."""
    if dtype.is_floating_point:
        return float("-inf") if descending else float("nan")
    info = torch.iinfo(dtype)
    return info.min if descending else info.max


def row_parts(A: SparseTensor, dim: int) -> tuple:
    """The slices of ``A`` along its sparse dim ``dim`` (a definite fill) as rows: ``(r, p, v,
    f_rows)``, the stored elements (each row's in ascending position) and each row's fill; the
    shape of ``A`` with ``dim`` moved last (the rows' order)."""
    idx, vals = coalesced_parts(A)
    # (A._size, A._vals' dtype: A's shape and dtype without a __torch_function__ hop each)
    shape, dtype = A._size, vals.dtype
    sd = idx.shape[0]
    D = tuple(shape[sd:])
    Dn = _index.numel(D)
    kept = [i for i in range(sd) if i != dim]
    kshape = [shape[i] for i in kept]
    # (one kept dim, the common 2-D case: its index row itself, no copy)
    key = idx[kept[0]].to(torch.int64) if len(kept) == 1 else _index.linearize(idx[kept], kshape)
    R = _index.numel(kshape) * Dn
    fill = A._fill if A._fill.dtype == dtype else A._fill.to(dtype)
    if D:
        r = (key[:, None] * Dn + torch.arange(Dn, device=key.device)).reshape(-1)
        p = idx[dim].repeat_interleave(Dn)
        f_rows = fill.expand(D).reshape(1, Dn).expand(R // Dn, Dn).reshape(-1)
    else:
        r, p = key, idx[dim].to(torch.int64)
        f_rows = fill.reshape(()).expand(R)
    return (r, p, vals.reshape(-1), f_rows), kshape + list(D) + [shape[dim]]


def rows_of(A: SparseTensor, dim: int, descending: bool) -> tuple[Rows, list]:
    """The slices of ``A`` along its sparse dim ``dim`` as :class:`Rows` (a definite fill), and the
    shape of ``A`` with ``dim`` moved last (the rows' order)."""
    (r, p, v, f_rows), moved = row_parts(A, dim)
    return Rows(r, p, v, f_rows, f_rows.numel(), A.shape[dim], descending), moved


def sorted_head(A: SparseTensor, dim: int, width: int, descending: bool, shape, out=None):
    """``(values, positions)`` of ``shape`` (``A``'s, ``width`` along ``dim``): the first
    ``width`` of every stably sorted slice along the sparse dim ``dim`` -- the compiled kernel
    where it runs (one pass over the output; rows of a plain pattern grouped once per pattern:
    :func:`grouped_rows`), else :meth:`Rows.dense`.  Written into ``out`` where given (contiguous
    tensors of ``shape``, ``A``'s dtype and int64)."""
    size = A._size
    post = _index.numel(size[dim + 1 :])
    vals = A._vals
    if _plain_rows(A) and _order.compiled(vals, _index.numel(size)):
        g = grouped_rows(A, dim)
        return _order.head_rows(*g, vals, A._fill, size[dim], width, post, descending, shape, out)
    if out is not None:
        got = sorted_head(A, dim, width, descending, shape)
        return tuple(o.copy_(r) for o, r in zip(out, got))
    parts, _ = row_parts(A, dim)
    if _order.compiled(parts[2], _index.numel(size)):
        v, p = _order.sort_head(*parts, size[dim], width, post, descending)
    else:
        rows = Rows(*parts, parts[3].numel(), size[dim], descending)
        v, p = rows.dense(width, post)
    return v.view(shape), p.view(shape)


def _plain_rows(A: SparseTensor) -> bool:
    """``A``'s stored elements are the rows of :func:`grouped_rows` as they are: one value each
    (no dense dims), in order (coalesced COO, or a CSR matrix), a definite fill of one value."""
    if A._vals.dim() != 1 or A._indefinite or A._fill.numel() != 1:
        return False
    if A._sf_layout is torch.sparse_coo:
        return A._coalesced
    return A._sf_layout is torch.sparse_csr and A._crow.dim() == 1


def grouped_rows(A: SparseTensor, dim: int) -> tuple:
    """``(offs, order, p)`` (NumPy, :func:`sparsefill._kernels.order.group_rows`): the slices of a
    plain ``A`` (:func:`_plain_rows`) along its sparse dim ``dim`` as rows of its stored elements,
    in the order of the other dims (row-major), each row's in ascending position ``p``.  Kept per
    pattern (a pattern sorted again costs the kernel alone)."""
    key = A._idx if A._sf_layout is torch.sparse_coo else (A._crow, A._col)
    tensors = (key,) if A._sf_layout is torch.sparse_coo else key
    return pattern_cached(("order rows", dim), tensors, lambda: _group(A, dim))


def _group(A: SparseTensor, dim: int) -> tuple:
    idx, _ = coalesced_parts(A)
    kept = [i for i in range(idx.shape[0]) if i != dim]
    kshape = [A._size[i] for i in kept]
    if len(kept) == 1:  # (the common 2-D case: its index row itself)
        key = idx[kept[0]]
    else:
        key = _index.linearize(idx[kept], kshape)
    return _order.group_rows(key, _index.numel(kshape), idx[dim])


def ranked(A: SparseTensor, dim: int, t_of):
    """``(values, positions, moved)``: the elements of rank ``t_of(rows)`` (``(Q, R)``) of every
    ascending stably sorted slice along the sparse dim ``dim`` (``rows``: :class:`Rows`, or the
    row parts ``(r, p, v, f_rows)`` for the compiled kernel, with ``size``)."""
    parts, moved = row_parts(A, dim)
    size = A.shape[dim]
    if _order.compiled(parts[2], A.numel()):
        t = t_of(_Parts(*parts, size))
        v, p = _order.rank_select(*parts, size, t)
        return v, p, moved
    rows = Rows(*parts, parts[3].numel(), size, False)
    v, p = rows.at(t_of(rows))
    return v, p, moved


class _Parts:
    """Row parts with :class:`Rows`' names for what a rank function reads: ``r``, ``v``,
    ``f_rows``, ``R``, ``size``."""

    def __init__(self, r, p, v, f_rows, size):
        self.r, self.p, self.v, self.f_rows, self.size = r, p, v, f_rows, size
        self.R = f_rows.numel()


def full_rank(rows, t: int) -> torch.Tensor:
    return torch.full((1, rows.R), t, dtype=torch.int64, device=rows.r.device)


def _same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a == b``, NaN equal to NaN (one value for ``mode``)."""
    return (a == b) | (_nan(a) & _nan(b))


def _last_gap(rows: Rows) -> torch.Tensor:
    """Per row, the largest position not stored (-1 where every position is stored)."""
    R, size = rows.R, rows.size
    flipped = torch.sort(rows.r * size + (size - 1 - rows.p)).values
    from sparsefill._kernels.reducer import first_gap

    g = first_gap(flipped // max(size, 1), flipped % max(size, 1), R, presorted=True)
    return size - 1 - g


def mode_rows(rows: Rows, masked: bool = False):
    """``(value, position)`` of each row's mode: the most frequent value (NaNs one value), ties to
    the smallest (NaN the largest); its position the last occurrence (NaN: the first), as dense
    torch gives them on slices of up to 16 elements (its sort is stable there)."""
    R, size, dev = rows.R, rows.size, rows.r.device
    r, p, v = rows.r, rows.p, rows.v
    k = v.numel()
    new = torch.ones(k, dtype=torch.bool, device=dev)
    if k > 1:
        new[1:] = (r[1:] != r[:-1]) | ~_same(v[1:], v[:-1])
    run = torch.cumsum(new, 0) - 1
    nrun = int(run[-1]) + 1 if k else 0
    count = torch.bincount(run, minlength=nrun)
    eq = ~(rows.before | rows.after)  # (the stored elements equal to the fill: its run)
    run_row, run_val = r[new], v[new]
    first = p[new]
    last = torch.zeros(nrun, dtype=torch.int64, device=dev).scatter_reduce(
        0, run, p, "amax", include_self=False
    )
    n_fill = torch.zeros_like(rows.cnt) if masked else size - rows.cnt
    is_fill_run = torch.zeros(nrun, dtype=torch.bool, device=dev)
    if not masked:
        is_fill_run.index_put_((run[eq],), eq[eq])
    gap = _last_gap(rows)
    fnan = _nan(rows.f_rows)
    count = count + torch.where(is_fill_run, n_fill[run_row], 0)
    last = torch.where(is_fill_run, torch.maximum(last, gap[run_row]), last)
    has_run = torch.zeros(R, dtype=torch.bool, device=dev).index_put_(
        (run_row[is_fill_run],), is_fill_run[is_fill_run]
    )
    extra = torch.nonzero((n_fill > 0) & ~has_run).squeeze(1)  # the fill's own candidates
    first_gap_row = _first_gap_rows(rows)
    c_row = torch.cat([run_row, extra])
    c_val = torch.cat([run_val, rows.f_rows[extra].to(v.dtype)])
    c_cnt = torch.cat([count, n_fill[extra]])
    c_first = torch.cat(
        [
            torch.minimum(first, torch.where(is_fill_run, first_gap_row[run_row], size)),
            first_gap_row[extra],
        ]
    )
    c_last = torch.cat([last, gap[extra]])
    c_pos = torch.where(_nan(c_val), c_first, c_last)
    del fnan
    # per row: the largest count, then the smallest value (NaN last): sorts, stable
    o = torch.sort(c_val, stable=True).indices
    o = o[torch.sort(c_cnt[o], stable=True, descending=True).indices]
    o = o[torch.sort(c_row[o], stable=True).indices]
    cr = c_row[o]
    head = torch.ones_like(cr, dtype=torch.bool)
    if cr.numel() > 1:
        head[1:] = cr[1:] != cr[:-1]
    o = o[head]
    val = torch.empty(R, dtype=v.dtype, device=dev).index_put_((c_row[o],), c_val[o])
    pos = torch.empty(R, dtype=torch.int64, device=dev).index_put_((c_row[o],), c_pos[o])
    return val, pos


def _first_gap_rows(rows: Rows) -> torch.Tensor:
    from sparsefill._kernels.reducer import first_gap

    key = torch.sort(rows.r * rows.size + rows.p).values
    size = max(rows.size, 1)
    return first_gap(key // size, key % size, rows.R, presorted=True)
