"""Order statistics of a SparseTensor: ``sort``, ``argsort``, ``msort``, ``topk``, ``kthvalue``,
``mode``, ``aminmax`` (and, through ``sort``, the composite ``quantile``/``nanquantile``), without
its dense form::

    op(A, ...) == op(A.to_dense(), ...)          values and indices, ties in stable order

Along a sparse dim every 1-D slice (a *row*: the other sparse dims and each dense coordinate fixed)
is its stored values merged with one run of ``n`` copies of the fill (``n`` = its unspecified
elements).  In stable order a row is::

    [stored x "before" f, sorted]  [the run: every position whose value equals f, ascending]
                                   [stored x "after" f, sorted]

("before": ``x < f`` ascending, ``x > f`` descending, NaN the largest as in torch), so the rank of
every element follows from a sort of the stored values alone: ``O(nse log nse)``, plus the output.
On CPU the compiled row kernels (``_kernels/order_numba.py``, once the segment backend loads numba)
sort each row's stored values and write the output in one pass; elsewhere torch ops do it
(:class:`Rows`).
The run's ``t``-th position is ``u = t + #{j : e_j - j <= t}`` over the row's stored positions
``e_0 < e_1 < ...`` outside the run (:class:`Rows`).  Along a dense dim: the op on the stored
values and on the fill, the pattern kept (a SparseTensor result).

A sort's output (and ``topk``'s, ``kthvalue``'s... over a sparse dim) holds every slice: it is
*dense by nature*; it is built in one pass, under the densify policy's ``dense_by_nature`` gate.
Ties are ordered as torch's stable sort orders them (``stable=True``: indices equal to dense's);
where torch's unstable kernels (``stable=False`` past 16 elements, ``topk``, ``kthvalue``, ``mode``)
leave the order of equal elements unspecified, the stable order is given (``mode``: the last
occurrence, as dense torch on short slices).

An indefinite fill (masked semantics, as the masked reductions of ``reductions.py``): each slice is
its stored elements only.  ``sort`` gives them compacted at the front of the slice, the rest of the
slice unspecified (a SparseTensor with an indefinite fill); ``topk``/``kthvalue`` take the ``k``
among them (fewer stored: the missing ones unspecified); ``mode`` and ``aminmax`` reduce over them
(a slice with none stored is unspecified).

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor([[0, 0, 1], [1, 3, 2]], [5., -1., 2.], (2, 4), fill_value=0.)
>>> torch.sort(A, 1).values
tensor([[-1.,  0.,  0.,  5.],
        [ 0.,  0.,  0.,  2.]])
>>> torch.topk(A, 2, 1).indices
tensor([[1, 0],
        [2, 0]])
"""

from __future__ import annotations

import torch

from sparsefill._kernels import index as _index
from sparsefill._kernels import order as _order
from sparsefill._kernels.grouping import pattern_cached
from sparsefill._kernels.trace import traced
from sparsefill._tensor.parts import coalesced_parts, dense_of, parts_to_sparse
from sparsefill._tensor.policy import check_densify
from sparsefill._tensor.fill import indefinite
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops._schema import meta_call
from sparsefill.ops.registry import register, register_shortcut

aten = torch.ops.aten


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


def _gate(what: str, A: SparseTensor, n: int) -> None:
    """The densify policy's dense-by-nature gate for an ``n``-element result (values and
    indices)."""
    check_densify(what, n * (A.element_size() + 8), by_nature=True)


def _along_dense(func, A: SparseTensor, dim: int, rest: dict, meta):
    """The op along a dense dim: on the stored values and on the fill, the pattern kept."""
    idx, vals = coalesced_parts(A)
    d = dim - A._sparse_ndim()
    vr = func(vals, **{**rest, "dim": d + 1})
    if A._indefinite:
        return tuple(
            parts_to_sparse(idx, v, m.shape, v.new_empty(0), indefinite=True, coalesced=True)
            for v, m in zip(vr, meta)
        )
    fr = func(A._fill.to(A.dtype).expand(A._dense_shape).contiguous(), **{**rest, "dim": d})
    return tuple(
        parts_to_sparse(idx, v, m.shape, f, layout=A._sf_layout, coalesced=True)
        for v, f, m in zip(vr, fr, meta)
    )


def _stable_topk(x, k, dim, largest):
    v, i = torch.sort(x, dim=dim, descending=largest, stable=True)
    return v.narrow(dim, 0, k), i.narrow(dim, 0, k)


def _stable_kth(x, k, dim, keepdim):
    v, i = torch.sort(x, dim=dim, stable=True)
    v, i = v.narrow(dim, k - 1, 1), i.narrow(dim, k - 1, 1)
    return (v, i) if keepdim else (v.squeeze(dim), i.squeeze(dim))


def _plain(func, A, args, kwargs):
    """A 0-d or empty ``A``: the op on its dense form, of one element or none (a 0-d ``A`` with
    an indefinite fill: the fallback's error)."""
    if A._indefinite and A.numel():
        return NotImplemented
    return func(dense_of(A, A._vals.new_zeros(()) if A._indefinite else None), *args[1:], **kwargs)


def _check_dim(A, dim) -> None:
    """torch's error for a dim out of range (meta kernels of sort/topk skip it)."""
    n = max(A.dim(), 1)
    if not -n <= dim < n:
        raise IndexError(
            f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})"
        )


def _sparse_dim(func, A, dim):
    """``dim`` normalised; None when ``func`` along it is the op on the values and on the fill (a
    dense dim)."""
    dim %= A.dim()
    return None if dim >= A._sparse_ndim() else dim


@register(aten.sort.default, aten.sort.stable)
def _sort(func, args, kwargs):
    """``sort(A, dim, descending, stable)``: values and indices, ties in stable order (dense by
    nature over a sparse dim: every slice of the result is built, in one pass)."""
    b = bind(func, args, kwargs)
    A, dim, desc = b["self"], b["dim"], b["descending"]
    _check_dim(A, b["dim"])
    meta = meta_call(func, A, *args[1:], **kwargs)  # (torch's errors: dim, dtype)
    if A.dim() == 0 or A.numel() == 0:
        return _plain(func, A, args, kwargs)
    d = _sparse_dim(func, A, dim)
    if A._indefinite and d is not None:
        return masked_sort(A, d, desc)
    if d is None:
        rest = {"stable": True, "descending": desc}
        return _along_dense(aten.sort.stable, A, dim % A.dim(), rest, meta)
    _gate(f"sort of a SparseTensor along sparse dim {d}", A, A.numel())
    return sorted_head(A, d, A.shape[d], desc, A.shape)


_sort.dense_by_nature = (
    "along a sparse dim every slice of the sorted result is built (in one pass, under the densify "
    "policy's dense_by_nature); along a dense dim the pattern is kept"
)


@register(aten.topk.default)
def _topk(func, args, kwargs):
    """``topk(A, k, dim, largest, sorted)``: the first ``k`` of each slice's stable sort (dense
    by nature over a sparse dim: ``k`` per slice, built in one pass); ``sorted=False`` gives them
    sorted too (torch leaves that order unspecified)."""
    b = bind(func, args, kwargs)
    A, k, dim, largest = b["self"], b["k"], b["dim"], b["largest"]
    _check_dim(A, b["dim"])
    meta = meta_call(func, A, *args[1:], **kwargs)  # (torch's errors: k out of range, dim)
    if A.dim() == 0 or A.numel() == 0:
        return _plain(func, A, args, kwargs)
    d = _sparse_dim(func, A, dim)
    if A._indefinite and d is not None:
        return masked_sort(A, d, largest, k)
    if d is None:
        return _along_dense(_stable_topk, A, dim % A.dim(), {"k": k, "largest": largest}, meta)
    _gate(f"topk of a SparseTensor along sparse dim {d}", A, A.numel() // A.shape[d] * k)
    return sorted_head(A, d, k, largest, meta[0].shape)


# dtypes whose sort/topk torch runs on CPU and CUDA alike (the shortcuts' plain operands)
_SHORT_DTYPES = {
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
}


def _short_dim(A, dim) -> int | None:
    """The sparse dim ``dim`` of ``A`` (normalised) where the order shortcuts take the call: ``A``
    a coalesced COO SparseTensor or a CSR matrix with a definite fill and elements, no view
    (``views.around`` has nothing to do), not traced, of a dtype of ``_SHORT_DTYPES``; ``dim`` an
    int in range.  Else None (the full path: its checks, errors and other cases)."""
    if (
        A.__class__ is not SparseTensor
        or A._view is not None
        or A._indefinite
        or type(A._vals) is not torch.Tensor
        or A._vals.dtype not in _SHORT_DTYPES
        or type(dim) is not int
        or traced()
    ):
        return None
    size = A._size
    n = len(size)
    if not -n <= dim < n or not _index.numel(size):
        return None
    dim %= n
    if A._sf_layout is torch.sparse_coo:
        return dim if A._coalesced and dim < A._idx.shape[0] else None
    return dim if A._sf_layout is torch.sparse_csr and A._crow.dim() == 1 and dim < 2 else None


def _flags(*flags) -> bool:
    return all(type(b) is bool for b in flags)


@register_shortcut(aten.topk.default)
def _topk_shortcut(func, args, kwargs):
    """``topk(A, k, dim, largest, sorted)`` along a sparse dim of a plain operand
    (:func:`_short_dim`), ``0 <= k <= A.shape[dim]``: what :func:`_topk` computes, straight from
    ``__torch_dispatch__`` (no schema binding, no meta call: the arguments are checked here).
    None: the full path."""
    if kwargs or not 2 <= len(args) <= 5:
        return None
    A, k, dim, largest, srt = (*args, *(-1, True, True)[len(args) - 2 :])  # (the defaults)
    d = _short_dim(A, dim)
    if d is None or type(k) is not int or not _flags(largest, srt) or not 0 <= k <= A._size[d]:
        return None
    size = A._size
    shape = size[:d] + (k,) + size[d + 1 :]
    n = _index.numel(shape)
    check_densify(
        f"topk of a SparseTensor along sparse dim {d}",
        n * (A._vals.element_size() + 8),
        by_nature=True,
    )
    return sorted_head(A, d, k, largest, shape)


@register_shortcut(aten.sort.default)
def _sort_shortcut(func, args, kwargs):
    """``sort(A, dim, descending)`` along a sparse dim of a plain operand (:func:`_short_dim`):
    what :func:`_sort` computes, straight from ``__torch_dispatch__``.  None: the full path."""
    if kwargs or not 1 <= len(args) <= 3:
        return None
    A, dim, desc = (*args, *(-1, False)[len(args) - 1 :])  # (the defaults)
    d = _short_dim(A, dim)
    if d is None or not _flags(desc):
        return None
    size = A._size
    check_densify(
        f"sort of a SparseTensor along sparse dim {d}",
        _index.numel(size) * (A._vals.element_size() + 8),
        by_nature=True,
    )
    return sorted_head(A, d, size[d], desc, size)


@register_shortcut(aten.sort.stable)
def _sort_stable_shortcut(func, args, kwargs):
    """``sort(A, *, stable, dim, descending)`` (``torch.sort(A, dim=..., stable=True)``): the
    shortcut of :func:`_sort_shortcut` (the order given is the stable one either way)."""
    if len(args) != 1 or not kwargs.keys() <= {"stable", "dim", "descending"}:
        return None
    if kwargs.get("stable", False) not in (None, True, False):
        return None
    rest = (kwargs.get("dim", -1), kwargs.get("descending", False))
    return _sort_shortcut(aten.sort.default, (args[0], *rest), {})


@register(aten.sort.values, aten.sort.values_stable)
def _sort_out(func, args, kwargs):
    """``sort(A, dim, descending, out=(values, indices))`` along a sparse dim of a plain operand
    (:func:`_short_dim`) into contiguous outputs of the result's shape and dtypes: the kernel
    writes them (no second buffer).  NotImplemented otherwise: the registry's ``out=`` rule
    (the result written into the outputs)."""
    b = bind(func, args, kwargs)
    A, v, i, desc = b["self"], b["values"], b["indices"], b["descending"]
    d = _short_dim(A, b["dim"])
    if d is None or not _flags(desc) or not _fits(v, A, A.dtype) or not _fits(i, A, torch.int64):
        return NotImplemented
    if v.untyped_storage().data_ptr() == i.untyped_storage().data_ptr():
        return NotImplemented  # (torch's overlap error)
    size = A._size
    _gate(f"sort of a SparseTensor along sparse dim {d}", A, _index.numel(size))
    return sorted_head(A, d, size[d], desc, size, out=(v, i))


def _fits(t, A: SparseTensor, dtype) -> bool:
    """``t`` is a plain contiguous tensor of ``A``'s shape and device and of ``dtype``."""
    return (
        type(t) is torch.Tensor
        and t.dtype == dtype
        and t.shape == A._size
        and t.device == A._vals.device
        and t.is_contiguous()
    )


_topk.dense_by_nature = (
    "along a sparse dim k elements of every slice (sparsefill.topk(..., sparse=True): only the "
    "stored ones)"
)


def _reduced(t, moved, dim, keepdim):
    t = t.reshape(moved[:-1])
    return t.unsqueeze(dim) if keepdim else t


@register(aten.kthvalue.default)
def _kthvalue(func, args, kwargs):
    """``kthvalue(A, k, dim, keepdim)``: rank ``k - 1`` of each slice's stable ascending sort,
    found by rank arithmetic over the sorted stored values (no slice is built)."""
    b = bind(func, args, kwargs)
    A, k, dim, keep = b["self"], b["k"], b["dim"], b["keepdim"]
    _check_dim(A, b["dim"])
    meta = meta_call(func, A, *args[1:], **kwargs)
    if A.dim() == 0 or A.numel() == 0:
        return _plain(func, A, args, kwargs)
    d = _sparse_dim(func, A, dim)
    if A._indefinite and d is not None:
        return masked_reduced(A, d, keep, kth_pick(k))
    if d is None:
        return _along_dense(_stable_kth, A, dim % A.dim(), {"k": k, "keepdim": keep}, meta)
    _gate(f"kthvalue of a SparseTensor along sparse dim {d}", A, A.numel() // A.shape[d])
    v, p, moved = ranked(A, d, lambda rows: _full_rank(rows, k - 1))
    return _reduced(v[0], moved, d, keep), _reduced(p[0], moved, d, keep)


def _full_rank(rows, t: int) -> torch.Tensor:
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


def _mode_rows(rows: Rows, masked: bool = False):
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


@register(aten.mode.default)
def _mode(func, args, kwargs):
    """``mode(A, dim, keepdim)``: per slice the most frequent value (the fill counted ``n`` times,
    with the stored values equal to it), ties to the smallest; its index the last occurrence (a
    NaN mode: the first), as dense torch on slices of up to 16 elements."""
    b = bind(func, args, kwargs)
    A, dim, keep = b["self"], b["dim"], b["keepdim"]
    _check_dim(A, b["dim"])
    meta = meta_call(func, A, *args[1:], **kwargs)
    if A.dim() == 0 or A.numel() == 0:
        return _plain(func, A, args, kwargs)
    d = _sparse_dim(func, A, dim)
    if A._indefinite and d is not None:
        return masked_reduced(A, d, keep, mode_pick)
    if d is None:
        return _along_dense(_dense_mode, A, dim % A.dim(), {"keepdim": keep}, meta)
    _gate(f"mode of a SparseTensor along sparse dim {d}", A, A.numel() // A.shape[d])
    rows, moved = rows_of(A, d, False)
    v, p = _mode_rows(rows)
    return _reduced(v, moved, d, keep), _reduced(p, moved, d, keep)


def _dense_mode(x, dim, keepdim):
    """torch.mode of a dense tensor, with the tie rule above at any slice length."""
    xm = x.movedim(dim, -1)
    shape = xm.shape
    flat = xm.reshape(-1, shape[-1])
    R, size = flat.shape
    r = torch.arange(R, device=x.device).repeat_interleave(size)
    p = torch.arange(size, device=x.device).repeat(R)
    rows = Rows(
        r, p, flat.reshape(-1), flat[:, 0].clone() if size else flat.new_empty(R), R, size, False
    )
    v, i = _mode_rows(rows)
    v, i = v.reshape(shape[:-1]), i.reshape(shape[:-1])
    return (v.unsqueeze(dim), i.unsqueeze(dim)) if keepdim else (v, i)


@register(aten.aminmax.default)
def _aminmax(func, args, kwargs):
    """``aminmax(A, dim, keepdim) == (amin(A, dim, keepdim), amax(A, dim, keepdim))``: the two
    native reductions."""
    b = bind(func, args, kwargs)
    A, dim, keep = b["self"], b["dim"], b["keepdim"]
    meta_call(func, A, *args[1:], **kwargs)
    dims = [] if dim is None else [dim]
    return aten.amin.default(A, dims, keep), aten.amax.default(A, dims, keep)


# ------------------------------------------------------------ an indefinite fill: masked
class Masked:
    """The stored elements of every slice of an indefinite-fill ``A`` along its sparse dim
    ``dim`` (masked semantics: the unspecified elements are not there).  Groups ``g`` are the
    occupied slices (kept coordinates ``keys``), rows ``g * Dn + c`` their dense coordinates; each
    row's stored values sorted (stable).  ``sel(g, j)``: the flat position, among the coalesced
    stored scalars, of rank ``j`` of every row of the groups ``g``."""

    def __init__(self, A: SparseTensor, dim: int, descending: bool):
        idx, vals = coalesced_parts(A)
        sd, D = A._sparse_ndim(), tuple(A._dense_shape)
        self.Dn = Dn = _index.numel(D)
        kept = [i for i in range(sd) if i != dim]
        self.kshape = [A.shape[i] for i in kept]
        key = _index.linearize(idx[kept], self.kshape)
        self.keys, kinv, self.kcnt = torch.unique(key, return_inverse=True, return_counts=True)
        G, k, dev = self.keys.numel(), key.numel(), key.device
        gstart = torch.cumsum(self.kcnt, 0) - self.kcnt
        ok = torch.sort(kinv, stable=True).indices
        self.rank = torch.empty(k, dtype=torch.int64, device=dev)
        self.rank[ok] = torch.arange(k, device=dev) - gstart[kinv[ok]]
        self.kinv, self.idx, self.D, self.dim = kinv, idx, D, dim
        self.vals, self.size = vals, A.shape[dim]
        r = (kinv[:, None] * Dn + torch.arange(Dn, device=dev)).reshape(-1)
        v = vals.reshape(-1)
        order = torch.sort(v, stable=True, descending=descending).indices
        self.order = order[torch.sort(r[order], stable=True).indices]
        rc = torch.bincount(r, minlength=G * Dn)
        self.rstart = torch.cumsum(rc, 0) - rc
        self.p = idx[dim].repeat_interleave(Dn) if D else idx[dim]

    def sel(self, g: torch.Tensor, j) -> torch.Tensor:
        """``(len(g), Dn)`` flat positions of rank ``j`` (per group or one) of the rows of ``g``."""
        rows = g[:, None] * self.Dn + torch.arange(self.Dn, device=g.device)
        j = j[:, None] if isinstance(j, torch.Tensor) and j.dim() == 1 else j
        return self.order[self.rstart[rows] + j]

    def rows(self) -> Rows:
        """The masked rows as :class:`Rows` (a placeholder fill, never counted)."""
        G, Dn = self.keys.numel(), self.Dn
        r = (self.kinv[:, None] * Dn + torch.arange(Dn, device=self.kinv.device)).reshape(-1)
        v = coalesced_parts_values(self)
        return Rows(r, self.p, v, v.new_zeros(G * Dn), G * Dn, self.size, False)

    def out_indices(self, g: torch.Tensor, keepdim: bool) -> torch.Tensor:
        """The sparse indices of the reduced slices ``g`` (``keepdim``: 0 along ``dim``)."""
        kept = _index.unravel(self.keys[g], self.kshape)
        if not keepdim:
            return kept
        return torch.cat([kept[: self.dim], kept.new_zeros((1, g.numel())), kept[self.dim :]])


def masked_take(A: SparseTensor, sel: torch.Tensor, grad: bool) -> torch.Tensor:
    """The coalesced stored scalars of ``A`` at ``sel``; ``grad``: differentiable (the gradient
    goes to the selected stored values; an indefinite fill has none)."""
    if grad:
        from sparsefill.ops.order.sort_backward import Take

        return Take.apply(A, sel)
    return coalesced_parts(A)[1].reshape(-1)[sel]


def masked_sort(A: SparseTensor, dim: int, descending: bool, k=None, grad=False):
    """sort (``k``: topk) of an indefinite ``A`` along its sparse dim ``dim``: each slice's stored
    elements sorted and compacted to its front, the rest unspecified (indefinite fill)."""
    M = Masked(A, dim, descending)
    keep = torch.ones_like(M.rank, dtype=torch.bool) if k is None else M.rank < k
    g, j = M.kinv[keep], M.rank[keep]
    sel = M.sel(g, j)
    out_idx = M.idx[:, keep].clone()
    out_idx[dim] = j
    shape = list(A.shape)
    if k is not None:
        shape[dim] = k
    vshape = (-1,) + M.D
    vals = masked_take(A, sel.reshape(-1), grad).reshape(vshape)
    pos = M.p[sel].reshape(vshape)
    return tuple(_indefinite_result(out_idx, t, shape, grad) for t in (vals, pos))


def _indefinite_result(idx, vals, shape, grad):
    if grad and vals.requires_grad:
        from sparsefill._creation.constructors import sparse_coo_tensor

        return sparse_coo_tensor(idx, vals, shape, fill_value=indefinite)
    return parts_to_sparse(idx, vals, shape, vals.new_empty(0), indefinite=True)


def masked_reduced(A: SparseTensor, dim: int, keepdim: bool, pick, grad=False):
    """A selecting reduction of an indefinite ``A`` along its sparse dim ``dim``: ``pick(M)``
    gives ``(groups, rank per group)`` of each selected element (the slices with none to select
    are unspecified in the results)."""
    M = Masked(A, dim, False)
    g, sel = pick(M)
    shape = list(A.shape)
    if keepdim:
        shape[dim] = 1
    else:
        del shape[dim]
    vshape = (-1,) + M.D
    out_idx = M.out_indices(g, keepdim)
    vals = masked_take(A, sel.reshape(-1), grad).reshape(vshape)
    pos = M.p[sel].reshape(vshape)
    return tuple(_indefinite_result(out_idx, t, shape, grad) for t in (vals, pos))


def kth_pick(k: int):
    """The ``k``-th smallest of the groups with at least ``k`` stored elements."""

    def pick(M):
        g = torch.nonzero(M.kcnt >= k).squeeze(1)
        return g, M.sel(g, k - 1)

    return pick


def mode_pick(M):
    """The mode of each group's stored elements (:func:`_mode_rows` on them alone, per dense
    coordinate), as the flat position of its chosen element."""
    rows = M.rows()
    _, pos = _mode_rows(rows, masked=True)
    G, Dn, size = M.keys.numel(), M.Dn, max(M.size, 1)
    r = (M.kinv[:, None] * Dn + torch.arange(Dn, device=pos.device)).reshape(-1)
    skey, sorder = torch.sort(r * size + M.p)
    want = torch.arange(G * Dn, device=pos.device) * size + pos
    return torch.arange(G, device=pos.device), sorder[torch.searchsorted(skey, want)].reshape(G, Dn)


def coalesced_parts_values(M) -> torch.Tensor:
    return M.vals.reshape(-1)


def topk(
    A: SparseTensor,
    k: int,
    dim: int = -1,
    largest: bool = True,
    sorted: bool = True,
    *,
    sparse: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(A, k, dim, largest, sorted)``; ``sparse=True``: the result as SparseTensors of
    its shape (hybrid where ``A`` is), storing only the slots that hold a stored element of ``A``
    (pytorch#34951): ``values.to_dense()`` is the dense ``topk``'s values (the other slots hold the
    fill: ``values``' fill is ``A``'s), ``indices`` has an indefinite fill (a slot of the fill's
    run may point at any of its elements).  With an indefinite fill, the masked top-k: each slice's
    ``k`` largest stored elements (fewer where fewer are stored).  Along a dense dim of a hybrid
    tensor the result keeps ``A``'s pattern either way.

    >>> import torch, sparsefill
    >>> A = sparsefill.sparse_coo_tensor([[0, 0, 2], [1, 5, 3]], [5., 7., 4.], (3, 1000))
    >>> v, i = sparsefill.topk(A, 2, 1, sparse=True)
    >>> v.indices().tolist(), v.values().tolist(), i.values().tolist()
    ([[0, 0, 2], [0, 1, 0]], [7.0, 5.0, 4.0], [5, 1, 3])
    >>> torch.equal(v.to_dense(), torch.topk(A.to_dense(), 2, 1).values)
    True
    """
    if not sparse or not isinstance(A, SparseTensor):
        return torch.topk(A, k, dim, largest, sorted)
    _check_dim(A, dim)
    meta = meta_call(aten.topk.default, A, k, dim, largest, sorted)
    d = None if A.dim() == 0 else _sparse_dim(None, A, dim)
    if d is None or A._indefinite or A.numel() == 0:  # (already sparse, or nothing stored)
        return torch.topk(A, k, dim, largest, sorted)
    rows, moved = rows_of(A, d, largest)
    Dn, kshape = _index.numel(A._dense_shape), moved[: -1 - A.dense_dim()]
    slot = rows._slots()
    keep = slot < k
    pat = torch.unique((rows.r[keep] // Dn) * k + slot[keep])
    kk, ss = pat // k, pat % k
    R_all = (kk[:, None] * Dn + torch.arange(Dn, device=pat.device)).reshape(-1)
    v, p = rows.at(ss.repeat_interleave(Dn), R_all)
    kept = _index.unravel(kk, kshape)
    idx = torch.cat([kept[:d], ss[None], kept[d:]])
    shape, D = meta[0].shape, tuple(A._dense_shape)
    order = torch.argsort(_index.linearize(idx, shape[: A._sparse_ndim()]))
    idx, v, p = idx[:, order], v.reshape((-1,) + D)[order], p.reshape((-1,) + D)[order]
    values = parts_to_sparse(idx, v, shape, A._fill.to(A.dtype), coalesced=True)
    indices = parts_to_sparse(idx, p, shape, p.new_empty(0), indefinite=True, coalesced=True)
    return torch.return_types.topk((values, indices))
