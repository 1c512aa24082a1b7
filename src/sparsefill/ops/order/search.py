"""Set and search ops of a SparseTensor, from its stored values and one entry per fill value with
the count of unspecified elements ``n`` as its multiplicity::

    op(A, ...) == op(A.to_dense(), ...)

* ``unique`` (``dim=None``): the distinct values of the stored ones and of the fill (if ``n > 0``),
  the fill counted ``n`` times; ``return_inverse`` keeps ``A``'s pattern (the fill's inverse is the
  fill's index).  torch counts every NaN apart: a NaN fill gives ``n`` NaNs, and its inverse is
  dense by nature (built under the densify policy's ``dense_by_nature``);
* ``unique_consecutive`` (``dim=None``): the flattened tensor as runs: each gap between stored
  elements one run of the fill; its inverse is dense by nature;
* ``unique``/``unique_consecutive`` along a sparse dim ``d``: torch's kernel on the candidate
  slices only, the slices holding a stored element and one fill-only slice (for
  ``unique_consecutive`` one per run of them), each candidate counted as often as the slices it
  stands for; the result (distinct slices) is dense by nature.  Along a dense dim, or with a NaN
  (each slice holding one is its own entry), the dense form, under ``dense_by_nature``;
* ``isin``: the elements of a SparseTensor keep its pattern (the fill mapped); a SparseTensor of
  test elements is its stored values and the fill;
* ``searchsorted``/``bucketize``: a SparseTensor of values to look up keeps its pattern and maps
  the fill (1-D boundaries; N-D ones: the fill in each row, dense by nature where the rows place
  it differently); a SparseTensor of boundaries is searched as torch searches it, by
  bisection, each probe a look-up among the stored positions (``O(log size * log nse)`` per value:
  the same result as torch's even where the sequence is not sorted);
* ``histc``, ``histogram``: the stored values, plus ``n`` at the fill's bin (``histogram``'s
  weights: those of the unspecified elements summed);
* ``histogramdd``: the points holding a stored coordinate, plus one point of the fill's
  coordinates weighted by the number of the others;
* ``bincount`` of a SparseTensor of indices: the stored ones, plus ``n`` (or the unspecified
  elements' weights) at the fill's bin.

An indefinite fill (masked semantics): the stored elements only (``unique``/``histc``/...: the
set or histogram of the stored values; ``isin``/``searchsorted`` of one: the pattern kept, still
indefinite).

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor([[1, 3]], [7., 2.], (6,), fill_value=0.)
>>> torch.unique(A, return_counts=True)
(tensor([0., 2., 7.]), tensor([4, 1, 1]))
>>> torch.histc(A, bins=4, min=0, max=8)
tensor([4., 1., 0., 1.])
"""

from __future__ import annotations

import torch

from sparsefill._kernels import index as _index
from sparsefill._tensor.parts import coalesced_parts, dense_of, parts_to_sparse, values_at
from sparsefill._tensor.policy import check_densify
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops.registry import register
from sparsefill.ops.order.rows import _nan, bind

aten = torch.ops.aten


def _unspecified(A: SparseTensor) -> int:
    """The count of unspecified sparse positions (each a whole dense slice)."""
    return 0 if A._indefinite else _index.numel(A._sparse_shape) - coalesced_parts(A)[0].shape[1]


def _elements(A: SparseTensor):
    """``(stored, fills, n)``: the stored values flattened (row-major order), the fill's entries
    flattened (empty when none is unspecified), each standing for ``n`` elements."""
    idx, vals = coalesced_parts(A)
    n = _unspecified(A)
    fills = A._fill.to(A.dtype).expand(A._dense_shape).reshape(-1) if n else vals.new_empty(0)
    return vals.reshape(-1), fills, n


def _with_pattern(A: SparseTensor, vals: torch.Tensor, fill: torch.Tensor) -> SparseTensor:
    """A SparseTensor with ``A``'s (coalesced) pattern, ``vals`` per stored slice and ``fill``."""
    idx = coalesced_parts(A)[0]
    return parts_to_sparse(
        idx,
        vals,
        A.shape,
        fill if not A._indefinite else vals.new_empty(0),
        indefinite=A._indefinite,
        layout=A._sf_layout,
        coalesced=True,
    )


# ------------------------------------------------------------------------------------- unique
@register(aten._unique2.default, aten._unique.default)
def _unique(func, args, kwargs):
    """``unique(A, sorted, return_inverse, return_counts)`` over every element (torch's CPU
    result is sorted whatever ``sorted``; every NaN element its own entry, last, in position
    order)."""
    b = bind(func, args, kwargs)
    A = b["self"]
    inverse, counts = b.get("return_inverse", False), b.get("return_counts", False)
    func(torch.zeros(0, dtype=A.dtype, device=A.device), *args[1:], **kwargs)  # (dtype errors)
    st, fl, n = _elements(A)
    nst, nfl = _nan(st), _nan(fl)
    vals, inv = torch.unique(torch.cat([st[~nst], fl[~nfl]]), sorted=True, return_inverse=True)
    ks = int((~nst).sum())
    mult = torch.ones_like(inv)
    mult[ks:] = n
    cnt = torch.zeros(vals.shape[0], dtype=torch.int64, device=A.device).index_add_(0, inv, mult)
    n_nan = int(nst.sum()) + n * int(nfl.sum())
    base = vals.shape[0]
    if n_nan:
        vals = torch.cat([vals, vals.new_full((n_nan,), float("nan"))])
        cnt = torch.cat([cnt, cnt.new_ones(n_nan)])
    empty = torch.empty(0, dtype=torch.int64, device=A.device)
    iv = _unique_inverse(A, inv, ks, nst, nfl, base) if inverse else empty
    res = (vals, iv, cnt if counts else empty)
    return res[:2] if func is aten._unique.default else res


_unique.dense_by_nature = (
    "return_inverse with a NaN fill: torch gives every NaN element its own entry"
)


def _unique_inverse(A, inv, ks, nst, nfl, base):
    """``unique``'s inverse: ``A``'s pattern, the fill's index as its fill; a NaN fill's elements
    each their own index (dense by nature)."""
    ist = torch.full(nst.shape, -1, dtype=torch.int64, device=A.device)
    ist[~nst] = inv[:ks]
    ist[nst] = base + torch.arange(int(nst.sum()), device=A.device)
    ifl = torch.full(nfl.shape, -1, dtype=torch.int64, device=A.device)
    ifl[~nfl] = inv[ks:]
    vshape = coalesced_parts(A)[1].shape
    fill = ifl.reshape(A._dense_shape) if nfl.numel() else inv.new_zeros(())
    out = _with_pattern(A, ist.reshape(vshape), fill)
    if not bool(nfl.any()):
        return out
    check_densify(
        "unique's inverse of a SparseTensor with a NaN fill", A.numel() * 8, by_nature=True
    )
    nan_at = dense_of(torch.isnan(A)).reshape(-1)
    dense = dense_of(out).reshape(-1)
    dense[nan_at] = base + torch.arange(int(nan_at.sum()), device=A.device)
    return dense.reshape(A.shape)


@register(aten.unique_consecutive.default)
def _unique_consecutive(func, args, kwargs):
    """``unique_consecutive(A, return_inverse, return_counts)`` of the flattened tensor: the stored
    elements and, between them, one run of the fill per gap (a NaN fill: a run per element, as
    torch's ``!=`` gives); the inverse is dense by nature."""
    b = bind(func, args, kwargs)
    A, inverse, counts = b["self"], b["return_inverse"], b["return_counts"]
    if b["dim"] is not None:
        return _unique_dim_consecutive(A, b["dim"], inverse, counts)
    func(torch.zeros(0, dtype=A.dtype, device=A.device), *args[1:], **kwargs)  # (dtype errors)
    if A._indefinite:
        return _unique_consecutive_masked(A, inverse, counts)
    B = A.reshape(-1) if A.dim() != 1 or A.dense_dim() else A
    idx, vals = coalesced_parts(B)
    pos, N, f = idx[0], B.shape[0], B._fill.to(B.dtype).reshape(())
    gaps = torch.diff(pos, prepend=pos.new_full((1,), -1), append=pos.new_full((1,), N)) - 1
    k = vals.shape[0]
    # items in order: gap 0, element 0, gap 1, ..., element k-1, gap k (empty gaps dropped)
    item_val = torch.empty(2 * k + 1, dtype=vals.dtype, device=vals.device)
    item_cnt = torch.ones(2 * k + 1, dtype=torch.int64, device=vals.device)
    item_val[0::2], item_val[1::2] = f, vals
    item_cnt[0::2] = gaps
    keep = item_cnt > 0
    item_val, item_cnt = item_val[keep], item_cnt[keep]
    if bool(_nan(f)):  # (every NaN of a fill run its own entry)
        is_fill = torch.zeros(2 * k + 1, dtype=torch.bool, device=vals.device)
        is_fill[0::2] = True
        reps = torch.where(is_fill[keep], item_cnt, 1)
        item_val = item_val.repeat_interleave(reps)
        item_cnt = torch.where(is_fill[keep], 1, item_cnt).repeat_interleave(reps)
    new = torch.ones_like(item_cnt, dtype=torch.bool)
    new[1:] = item_val[1:] != item_val[:-1]
    run = torch.cumsum(new, 0) - 1
    out = item_val[new]
    cnt = torch.zeros(out.shape[0], dtype=torch.int64, device=vals.device).index_add_(
        0, run, item_cnt
    )
    empty = torch.empty(0, dtype=torch.int64, device=A.device)
    inv = empty
    if inverse:
        check_densify("unique_consecutive's inverse of a SparseTensor", N * 8, by_nature=True)
        inv = run.repeat_interleave(item_cnt).reshape(A.shape)
    return out, inv, cnt if counts else empty


def _unique_consecutive_masked(A, inverse: bool, counts: bool):
    """An indefinite fill: the stored elements in row-major order, consecutive as they are stored
    (the unspecified ones between them are not there); the inverse keeps ``A``'s pattern."""
    idx, vals = coalesced_parts(A)
    flat = vals.reshape(-1)
    out, inv, cnt = torch.unique_consecutive(flat, return_inverse=True, return_counts=True)
    empty = torch.empty(0, dtype=torch.int64, device=A.device)
    iv = _with_pattern(A, inv.reshape(vals.shape), inv.new_zeros(())) if inverse else empty
    return out, iv, cnt if counts else empty


_unique_consecutive.dense_by_nature = "return_inverse: every element's run index"


# --------------------------------------------------------------------------- unique along a dim
class _Slices:
    """``A``'s slices along a sparse dim ``d`` (``A.select(d, j)`` for each ``j``), each either
    holding a stored element or the fill alone.  ``rows``: the indices ``j`` of the candidate
    slices, sorted; ``dense``: them (dim ``d`` first, the other dims in ``A``'s order), built
    once: the stored elements written over the fill.  ``first_empty``: with ``runs``, the first
    slice of each run of fill-only slices is a candidate too (``unique_consecutive``), else only
    the first of all (every fill-only slice is the same)."""

    def __init__(self, A: SparseTensor, d: int, runs: bool):
        idx, vals = coalesced_parts(A)
        L = A.shape[d]
        held = torch.zeros(L, dtype=torch.bool, device=vals.device)
        held[idx[d]] = True
        empty = ~held
        if runs:  # the first slice of each run of empty ones
            first = empty.clone()
            first[1:] &= ~empty[:-1]
        else:
            first = empty & (torch.cumsum(empty, 0) == 1)
        self.rows = torch.nonzero(held | first).reshape(-1)
        slot = torch.full((L,), -1, dtype=torch.int64, device=vals.device)
        slot[self.rows] = torch.arange(self.rows.numel(), device=vals.device)
        # each slice's candidate: its own, or its run's (the first empty slice's)
        if runs:
            at = torch.arange(L, device=vals.device)
            self.of_slice = slot[torch.cummax(torch.where(held | first, at, -1), 0).values]
        else:
            # (the one empty candidate's slot; none read where every slice holds an element)
            self.of_slice = torch.where(held, slot, slot[first].sum())
        other = [n for i, n in enumerate(A.shape) if i != d]
        check_densify(
            "unique(dim=...) of a SparseTensor: its distinct slices",
            self.rows.numel() * _index.numel(other) * A.element_size(),
            by_nature=True,
        )
        fill = A._fill.to(A.dtype).expand(A._dense_shape)
        self.dense = fill.expand(self.rows.numel(), *other).clone()
        sd = [idx[i] for i in range(idx.shape[0]) if i != d]
        self.dense[(slot[idx[d]], *sd)] = vals
        self.mult = torch.bincount(self.of_slice, minlength=self.rows.numel())


def _dim_by_nature(A: SparseTensor, d: int) -> bool:
    """Computed on the dense form (dense by nature): along a dense dim (each slice crosses every
    sparse position), or with a NaN anywhere (torch makes each slice holding one its own entry:
    the fill-only slices would each be one)."""
    if d >= A._sparse_ndim() or A._indefinite:
        return True
    st, fl, _ = _elements(A)
    return bool(_nan(st).any() or _nan(A._fill).any())


def _dense_form(A: SparseTensor, what: str) -> torch.Tensor:
    if A._indefinite:
        raise ValueError(f"{what} of a SparseTensor with an indefinite fill: no dense form")
    check_densify(what, A.numel() * A.element_size(), by_nature=True)
    return dense_of(A)


@register(aten.unique_dim.default)
def _unique_dim(func, args, kwargs):
    """``unique(A, dim=d)``: the distinct slices along ``d``, sorted (dense, as torch returns
    them: dense by nature).  Only the slices holding a stored element and one fill-only slice are
    candidates: torch's kernel runs on them, the fill-only slice's count is their number."""
    b = bind(func, args, kwargs)
    A, inverse, counts = b["self"], b["return_inverse"], b["return_counts"]
    d = b["dim"] % A.dim() if A.dim() else b["dim"]
    if not A.dim() or not A.numel() or _dim_by_nature(A, d):
        return func(_dense_form(A, "unique(dim=...)"), *args[1:], **kwargs)
    S = _Slices(A, d, runs=False)
    vals, inv, cnt = torch.unique(S.dense, dim=0, return_inverse=True, return_counts=True)
    return _per_slice(A, d, vals, inv, cnt, S, inverse, counts)


_unique_dim.dense_by_nature = "always: the distinct slices, dense as torch returns them"


@register(aten.unique_dim_consecutive.default)
def _unique_dim_consecutive_op(func, args, kwargs):
    b = bind(func, args, kwargs)
    return _unique_dim_consecutive(b["self"], b["dim"], b["return_inverse"], b["return_counts"])


def _unique_dim_consecutive(A: SparseTensor, dim: int, inverse: bool, counts: bool):
    """``unique_consecutive(A, dim=d)``: runs of equal slices along ``d`` (dense, as torch's:
    dense by nature); a run of fill-only slices is one candidate, its count their number."""
    d = dim % A.dim() if A.dim() else dim
    if not A.dim() or not A.numel() or _dim_by_nature(A, d):
        x = _dense_form(A, "unique_consecutive(dim=...)")
        return aten.unique_consecutive.default(x, inverse, counts, dim)
    S = _Slices(A, d, runs=True)
    vals, inv, cnt = torch.unique_consecutive(
        S.dense, return_inverse=True, return_counts=True, dim=0
    )
    return _per_slice(A, d, vals, inv, cnt, S, inverse, counts)


def _per_slice(A, d, vals, inv, cnt, S: _Slices, inverse: bool, counts: bool):
    """The candidates' result mapped back: each slice's inverse is its candidate's, each entry's
    count sums its candidates' multiplicities."""
    cnt = torch.zeros_like(cnt).index_add_(0, inv, S.mult)
    empty = torch.empty(0, dtype=torch.int64, device=vals.device)
    return (
        vals.movedim(0, d),
        inv[S.of_slice] if inverse else empty,
        cnt if counts else empty,
    )


# ---------------------------------------------------------------------------------------- isin
def _set_of(T) -> torch.Tensor:
    """The values a SparseTensor (or dense tensor / scalar) holds, as a dense 1-D tensor."""
    if isinstance(T, SparseTensor):
        st, fl, _ = _elements(T)
        return torch.cat([st, fl])
    return T


@register(aten.isin.Tensor_Tensor, aten.isin.Tensor_Scalar, aten.isin.Scalar_Tensor)
def _isin(func, args, kwargs):
    """``isin(elements, test_elements)``: a SparseTensor of elements keeps its pattern (the fill
    tested once); a SparseTensor of test elements is its stored values and the fill."""
    b = bind(func, args, kwargs)
    E, Tst = b["elements"] if "elements" in b else b["element"], b.get("test_elements")
    if Tst is None:
        Tst = b["test_element"]
    invert = b["invert"]
    if isinstance(E, SparseTensor):
        test = _set_of(Tst)
        idx, vals = coalesced_parts(E)
        r = torch.isin(vals, test, invert=invert)
        rf = torch.isin(E._fill.to(E.dtype), test, invert=invert)
        return _with_pattern(E, r, rf)
    return torch.isin(E, _set_of(Tst), invert=invert)


# --------------------------------------------------------------------------- searchsorted
def _probe_values(S: SparseTensor):
    """``(keys, values, fill)`` of ``S`` flattened: the sorted linear positions of its stored
    scalars, their values, the scalar fill."""
    flat = S.reshape(-1) if S.dim() != 1 or S.dense_dim() else S
    idx, vals = coalesced_parts(flat)
    return idx[0], vals, flat._fill.to(S.dtype).reshape(())


def bisect(S: SparseTensor, v: torch.Tensor, right: bool, sorter=None) -> torch.Tensor:
    """torch's ``searchsorted`` bisection over the last dim of the SparseTensor ``S`` for the
    values ``v`` (``S`` 1-D, or its leading dims those of ``v``): the same probes as torch's
    kernel, each a look-up among the stored positions.

    >>> import sparsefill
    >>> S = sparsefill.sparse_coo_tensor([[3]], [9.], (4,), fill_value=1.)    # [1, 1, 1, 9]
    >>> bisect(S, torch.tensor([0., 1., 5.]), right=False).tolist()
    [0, 0, 3]
    """
    row = (
        torch.zeros(v.shape, dtype=torch.int64, device=v.device)
        if S.dim() == 1
        else torch.arange(v.numel() // max(v.shape[-1], 1), device=v.device)[:, None]
        .expand(-1, v.shape[-1])
        .reshape(v.shape)
    )
    return _bisect_rows(_reader(S), row, v, S.shape[-1], right, sorter)


def _reader(seq):
    """``read(p)``: the scalars at the flat positions ``p`` of ``seq`` (a dense tensor, or a
    SparseTensor: each a look-up among its stored positions)."""
    if not isinstance(seq, SparseTensor):
        flat = seq.reshape(-1)
        return lambda p: flat[p.clamp(max=max(flat.numel() - 1, 0))]
    keys, vals, f = _probe_values(seq)
    k = keys.numel()

    def read(p):
        if not k:
            return f.expand(p.shape)
        at = torch.searchsorted(keys, p).clamp(max=k - 1)
        return torch.where(keys[at] == p, vals[at], f)

    return read


def _bisect_rows(read, row, v, L: int, right: bool, sorter=None) -> torch.Tensor:
    """torch's lower/upper-bound bisection of each value ``v`` in row ``row`` (of length ``L``)
    of a sequence read by ``read`` (flat positions): the same probes as torch's kernel, so the
    same result even where a row is not sorted."""
    start = torch.zeros(v.shape, dtype=torch.int64, device=v.device)
    end = torch.full(v.shape, L, dtype=torch.int64, device=v.device)
    for _ in range(L.bit_length()):
        active = start < end
        mid = start + ((end - start) >> 1)
        at_mid = mid if sorter is None else _sorted_at(sorter, row, mid.clamp(max=max(L - 1, 0)))
        mv = read(row * L + at_mid)
        go_right = ~(mv > v) if right else ~(mv >= v)
        start = torch.where(active & go_right, mid + 1, start)
        end = torch.where(active & ~go_right, mid, end)
    return start


def _sorted_at(sorter, row, mid):
    """``sorter``'s entry ``mid`` of each value's row."""
    flat = sorter.reshape(-1, sorter.shape[-1])
    return flat[row if sorter.dim() > 1 else torch.zeros_like(row), mid]


def _lookup(seq, v, right: bool, out_int32: bool, sorter=None):
    """searchsorted of dense values ``v`` in ``seq`` (dense or SparseTensor)."""
    r = (
        bisect(seq, v, right, sorter)
        if isinstance(seq, SparseTensor)
        else torch.searchsorted(seq, v, right=right, sorter=sorter)
    )
    return r.to(torch.int32 if out_int32 else torch.int64)


@register(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def _searchsorted(func, args, kwargs):
    """``searchsorted(sorted_sequence, values)``: a SparseTensor of values keeps its pattern and
    maps the fill (N-D boundaries: :func:`_search_rows`); a SparseTensor of boundaries is bisected
    as torch does."""
    b = bind(func, args, kwargs)
    seq, v, sorter = b["sorted_sequence"], b["self"], b["sorter"]
    right = b["right"] or b["side"] == "right"
    if isinstance(sorter, SparseTensor) or (isinstance(seq, SparseTensor) and seq._indefinite):
        return NotImplemented
    _meta_check(func, args, kwargs)
    _check_side_sorter(b["side"], sorter, seq.shape[-1] if seq.dim() else 0)
    return _search(seq, v, right, b["out_int32"], sorter)


def _check_side_sorter(side, sorter, L: int) -> None:
    """The checks torch's kernel makes on data and the meta kernel does not: ``side`` and the
    range of ``sorter``'s entries (the bisection here reads through them: an entry out of
    ``[0, L)`` would read another row's element or the fill, not fail)."""
    if side is not None and side not in ("left", "right"):
        raise ValueError(f"searchsorted(): side must be 'left' or 'right', got {side!r}")
    if sorter is not None and sorter.numel():
        lo, hi = torch.aminmax(sorter)
        if bool(lo < 0) or bool(hi >= L):
            raise IndexError(
                f"searchsorted(): sorter holds index {int(lo) if lo < 0 else int(hi)}, out of"
                f" range for a sorted_sequence of {L} elements per row"
            )


_searchsorted.dense_by_nature = (
    "N-D boundaries that place the fill of a SparseTensor of values differently from row to row"
)


def _search(seq, v, right, out_int32, sorter=None):
    if isinstance(v, SparseTensor):
        if seq.dim() != 1:
            return _search_rows(seq, v, right, out_int32, sorter)
        idx, vals = coalesced_parts(v)
        fill = v._fill.to(v.dtype) if not v._indefinite else vals.new_zeros(())
        r = _lookup(seq, vals, right, out_int32, sorter)
        return _with_pattern(v, r, _lookup(seq, fill, right, out_int32, sorter))
    v = torch.as_tensor(v, dtype=seq.dtype, device=seq.device)
    return _lookup(seq, v, right, out_int32, sorter)


def _search_rows(seq, v: SparseTensor, right, out_int32, sorter):
    """An N-D sequence (dense or SparseTensor): each element of ``v`` is searched in the row of
    ``seq`` its leading coordinates name.  The stored ones keep ``v``'s pattern; the fill's result
    may differ from row to row: where it does not, it is the result's fill, O(nse log L + rows
    log L); where it does, the unspecified elements hold their row's result and the result is
    dense by nature, built in one pass (a hybrid ``v``: every element's fill is searched)."""
    L, K = seq.shape[-1], max(v.shape[-1], 1)
    dt = torch.int32 if out_int32 else torch.int64
    idx, vals = coalesced_parts(v)
    Dn = _index.numel(v._dense_shape)
    scalar = _scalar_positions(idx, v._sparse_shape, Dn)
    read = _reader(seq)
    r = _bisect_rows(read, scalar // K, vals.reshape(-1), L, right, sorter).to(dt)
    if v._indefinite:
        return _with_pattern(v, r.reshape(vals.shape), r.new_zeros(()))
    f = v._fill.to(v.dtype).expand(v._dense_shape).reshape(-1)
    if v.dense_dim():  # (the fill's value depends on the dense coordinates: every element)
        check_densify(
            "searchsorted of a hybrid SparseTensor in an N-D sequence (every element's fill)",
            v.numel() * 8,
            by_nature=True,
        )
        cells = torch.arange(v.numel(), device=v.device)
        fv = f.repeat(v.numel() // max(Dn, 1))
    else:
        cells = torch.arange(v.numel() // K, device=v.device) * K
        fv = f.expand(cells.shape)
    fr = _bisect_rows(read, cells // K, fv, L, right, sorter).to(dt)
    per = fr.reshape(-1, Dn)
    if not per.shape[0] or bool((per == per[:1]).all()):
        fill = per[0].reshape(v._dense_shape) if per.shape[0] else r.new_zeros(v._dense_shape)
        return _with_pattern(v, r.reshape(vals.shape), fill)
    check_densify(
        "searchsorted of a SparseTensor whose fill falls in other places in other rows",
        v.numel() * dt.itemsize,
        by_nature=True,
    )
    out = fr if v.dense_dim() else fr.repeat_interleave(K)
    out[scalar] = r
    return out.reshape(v.shape)


def _scalar_positions(idx: torch.Tensor, S, Dn: int) -> torch.Tensor:
    """The flat (row-major) positions of the stored scalars of a SparseTensor with sparse shape
    ``S`` and ``Dn`` scalars per stored element, in the order of its flattened values."""
    keys = _index.linearize(idx, S)
    return (keys[:, None] * Dn + torch.arange(Dn, device=keys.device)).reshape(-1)


def _meta_check(func, args, kwargs):
    """torch's argument errors (shapes, side/right, dtypes) from the op on meta tensors."""

    def meta(t):
        if isinstance(t, torch.Tensor):
            return torch.empty((), dtype=t.dtype, device="meta").expand(t.shape)
        return t

    func(*[meta(a) for a in args], **{k: meta(a) for k, a in kwargs.items()})


@register(aten.bucketize.Tensor, aten.bucketize.Scalar)
def _bucketize(func, args, kwargs):
    """``bucketize(input, boundaries) == searchsorted(boundaries, input)`` (1-D boundaries)."""
    b = bind(func, args, kwargs)
    bd = b["boundaries"]
    if isinstance(bd, SparseTensor) and bd._indefinite:
        return NotImplemented
    _meta_check(func, args, kwargs)
    return _search(bd, b["self"], b["right"], b["out_int32"])


# --------------------------------------------------------------------------------- histograms
@register(aten.histc.default)
def _histc(func, args, kwargs):
    """``histc(A, bins, min, max)``: the stored values' histogram plus ``n`` at each fill entry's
    bin; ``min == max``: the range of every element (the fill's included)."""
    b = bind(func, args, kwargs)
    A, bins, lo, hi = b["self"], b["bins"], b["min"], b["max"]
    st, fl, n = _elements(A)
    if lo == hi and st.numel() + fl.numel():
        data = torch.cat([st, fl])
        lo, hi = data.min().item(), data.max().item()
    h = torch.histc(st, bins, lo, hi)
    return h + n * torch.histc(fl, bins, lo, hi) if fl.numel() else h


def _weights(A: SparseTensor, weight, n: int):
    """The weights of the stored scalars and of each fill entry (its unspecified elements'
    summed); None, None without ``weight``."""
    if weight is None:
        return None, None
    idx, vals = coalesced_parts(A)
    sd = A._sparse_ndim()
    keys = _index.linearize(idx, A._sparse_shape)
    if isinstance(weight, SparseTensor) and weight._sparse_ndim() != sd:  # (read scalar by scalar)
        Dn = _index.numel(A._dense_shape)
        scalar = (keys[:, None] * Dn + torch.arange(Dn, device=keys.device)).reshape(-1)
        w_st = values_at(weight.reshape(-1), scalar, 1).reshape(vals.shape)
    else:
        w_st = values_at(weight, keys, sd).reshape(vals.shape)
    if not n:
        return w_st.reshape(-1), w_st.new_empty(0)
    w_fl = weight.sum(list(range(sd))) - w_st.sum(0) if sd else w_st.new_zeros(A._dense_shape)
    return w_st.reshape(-1), w_fl.reshape(-1)


@register(aten.histogram.bin_ct, aten.histogram.bins_tensor)
def _histogram(func, args, kwargs):
    """``histogram(A, bins, range, weight, density)``: the stored values and the fill's entries,
    weighted by 1 and ``n`` (or by ``weight``: the unspecified elements' summed)."""
    b = bind(func, args, kwargs)
    A, weight, bins = b["self"], b["weight"], b["bins"]
    if isinstance(weight, SparseTensor) and weight._indefinite:
        return NotImplemented
    if isinstance(bins, SparseTensor):  # (the bin edges, every one read: dense by nature)
        check_densify("histogram's bins given as a SparseTensor", bins.numel() * 8, by_nature=True)
        bins = bins.to_dense()
    st, fl, n = _elements(A)
    w_st, w_fl = _weights(A, weight, n)
    if w_st is None:
        w_st, w_fl = torch.ones_like(st), torch.full_like(fl, n)
    kw = {"weight": torch.cat([w_st, w_fl]), "density": b["density"]}
    if func is aten.histogram.bin_ct:
        kw["range"] = b["range"]
    return func(torch.cat([st, fl]), bins, **kw)


@register(
    aten._histogramdd_bin_edges.default,
    aten._histogramdd_from_bin_cts.default,
    aten._histogramdd_from_bin_tensors.default,
)
def _histogramdd(func, args, kwargs):
    """``histogramdd(A, bins, range, weight, density)`` of the points ``A[..., :]`` (the last dim
    their coordinates): torch's kernel on the points holding a stored coordinate (and those with
    a stored weight) and one point of the fill's coordinates weighted by the number of the others
    (or their weights summed), which leaves the bin edges (the coordinates' extremes) and every
    bin's total as dense's.  A point has ``D`` coordinates: O(nse D) for the candidates.  An
    indefinite ``A``: the points whose coordinates are all stored (masked: the others are not
    there).  More than one dense dim: the densify fallback."""
    b = bind(func, args, kwargs)
    A, weight = b["self"], b["weight"]
    if (
        not isinstance(A, SparseTensor)
        or A.dim() < 2
        or A.dense_dim() > 1
        or (isinstance(weight, SparseTensor) and (weight._indefinite or weight.dense_dim()))
        or (weight is not None and tuple(weight.shape) != tuple(A.shape[:-1]))
    ):
        return NotImplemented
    bins = b["bins"]
    if any(isinstance(e, SparseTensor) for e in bins):  # (every edge read: dense by nature)
        check_densify(
            "histogramdd's bins given as SparseTensors",
            sum(e.numel() * 8 for e in bins),
            by_nature=True,
        )
        bins = [e.to_dense() if isinstance(e, SparseTensor) else e for e in bins]
    pts, w = _points(A, weight)
    rest = {k: v for k, v in b.items() if k not in ("self", "bins", "weight")}
    return func(pts, bins, weight=w, **rest)


def _points(A: SparseTensor, weight):
    """``(points, weights)``: the candidate points of :func:`_histogramdd` with their weights."""
    grid, D = tuple(A.shape[:-1]), A.shape[-1]
    idx, vals = coalesced_parts(A)
    if A.dense_dim():
        keys, rows = _index.linearize(idx, grid), vals
    else:
        keys, inv = torch.unique(_index.linearize(idx[:-1], grid), return_inverse=True)
        if A._indefinite and keys.numel() * D != vals.numel():
            raise ValueError(
                "histogramdd of a SparseTensor with an indefinite fill: a point has unspecified "
                "coordinates (store every coordinate of a point, or none)"
            )
        check_densify("histogramdd's points", keys.numel() * D * A.element_size(), by_nature=True)
        rows = vals.new_zeros((keys.numel(), D)) if A._indefinite else _fill_rows(A, keys.numel())
        rows[inv, idx[-1]] = vals
    if isinstance(weight, SparseTensor):  # (its stored weights' points join, holding the fill)
        wkeys = _index.linearize(coalesced_parts(weight)[0], grid)
        both = torch.unique(torch.cat([keys, wkeys]))
        full = _fill_rows(A, both.numel())
        full[_index.lookup(both, keys)[0]] = rows
        keys, rows = both, full
    n_rest = _index.numel(grid) - keys.numel()
    w = None if weight is None else values_at(weight, keys, len(grid)).to(rows.dtype)
    if not n_rest or A._indefinite:
        return rows, (torch.ones(keys.numel(), dtype=rows.dtype) if w is None else w)
    if w is None:
        w_rest = torch.tensor(float(n_rest), dtype=rows.dtype)
        w = torch.ones(keys.numel(), dtype=rows.dtype)
    else:  # the weights of the other points, summed as they are (no inf - inf)
        mask = parts_to_sparse(
            _index.unravel(keys, grid),
            torch.ones(keys.numel(), dtype=torch.bool),
            grid,
            torch.tensor(False),
            coalesced=True,
        )
        w_rest = torch.where(mask, 0, weight).sum().to(rows.dtype)
    return torch.cat([rows, _fill_rows(A, 1)]), torch.cat([w, w_rest.reshape(1)])


def _fill_rows(A: SparseTensor, k: int) -> torch.Tensor:
    """``k`` points holding the fill's coordinates."""
    return A._fill.to(A.dtype).expand(A.shape[-1:]).expand(k, A.shape[-1]).clone()


@register(aten.bincount.default)
def _bincount(func, args, kwargs):
    """``bincount(A, weights, minlength)`` of a SparseTensor of indices: the stored ones, plus
    ``n`` (or the unspecified elements' weights) at the fill's bin; SparseTensor weights are read
    at the stored indices and summed over the unspecified ones.  Dense indices with SparseTensor
    weights read every weight: dense by nature, in one pass."""
    b = bind(func, args, kwargs)
    A, weights, minlength = b["self"], b["weights"], b["minlength"]
    if isinstance(weights, SparseTensor) and weights._indefinite:
        return NotImplemented
    if not isinstance(A, SparseTensor):
        check_densify(
            "bincount's SparseTensor weights of dense indices (every weight read)",
            weights.numel() * weights.element_size(),
            by_nature=True,
        )
        return func(A, dense_of(weights), minlength)
    if A.dim() != 1:
        return NotImplemented
    st, fl, n = _elements(A)
    if weights is None:
        out = torch.bincount(torch.cat([st, fl]), minlength=minlength)
        if fl.numel():
            out[fl[0]] += n - 1
        return out
    if weights.shape != A.shape:
        func(torch.zeros(A.shape, dtype=A.dtype), weights, minlength)  # (torch's error)
    w_st, w_fl = _weights(A, weights, n)
    return torch.bincount(torch.cat([st, fl]), torch.cat([w_st, w_fl]), minlength)
