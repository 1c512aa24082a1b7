"""Indexing on the stored elements: ``select``, ``slice`` (``narrow``, ``A[a:b:s]``) and their
backward, ``A[i, j, ...]``; ``split``, ``chunk`` and ``unbind`` decompose into them.  Elsewhere:
``index_select`` (``index_select.py``), ``flip roll rot90 repeat`` (``rearrange.py``), ``tril
triu diagonal trace`` (``diagonals.py``), ``nonzero masked_select masked_scatter``
(``masked_index.py``); writes and reads at coordinates (``index_put``, ``scatter``, ``index_*``,
``gather``) in ``coords.py``, joining (``cat``, ``stack``) in ``concat.py``.  The helpers here
(``_parts``, ``_build``, ``_dense_fill``, ``out_of_bounds``, ``_on_dense_dim``) serve them all::

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
from sparsefill._tensor.parts import coalesced_parts, every_element, parts_to_sparse
from sparsefill._tensor.policy import check_specify
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops._schema import meta_like, meta_of
from sparsefill.ops.registry import register
from sparsefill.ops.shape.reshape import squeeze, with_zero_row

aten = torch.ops.aten


def _parts(A):
    idx, vals = coalesced_parts(A)
    return idx, vals, A.dim() - A.dense_dim()


def _build(A, idx, vals, shape, fill=None, layout=None, coalesced=True):
    """The SparseTensor of parts ``(idx, vals)`` with ``A``'s fill (or ``fill``) and definiteness,
    in ``layout`` (default: ``A``'s, COO with fewer than two sparse dims)."""
    fill = A._fill if fill is None else fill
    sdim = idx.shape[0]
    layout = layout or (A._sf_layout if sdim >= 2 else torch.sparse_coo)
    return parts_to_sparse(
        idx,
        vals,
        torch.Size(shape),
        fill,
        indefinite=A._indefinite,
        layout=layout,
        coalesced=coalesced,
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


@register(
    aten.split.Tensor,
    aten.split_with_sizes.default,
    aten.unsafe_split.Tensor,
    aten.unsafe_split_with_sizes.default,
    aten.unbind.int,
)
def _split(func, args, kwargs):
    """Pieces along ``dim``: slices (split, split_with_sizes; their ``unsafe_`` forms, whose
    pieces are no views: no write goes through) or selects (unbind)."""
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


# the view each ``*_scatter`` op replaces (the same arguments after ``src``)
_SCATTER_VIEWS = {
    aten.slice_scatter.default: aten.slice.Tensor,
    aten.select_scatter.default: aten.select.int,
    aten.diagonal_scatter.default: aten.diagonal.default,
}


@register(*_SCATTER_VIEWS)
def _view_scatter(func, args, kwargs):
    """``slice_scatter(A, src, ...)``, ``select_scatter``, ``diagonal_scatter``: a copy of ``A``
    with its view (``slice(A, ...)``...) replaced by ``src``, written through the view of a
    clone: ``A``'s stored elements outside the view kept, the view's elements ``src``'s::

        slice_scatter(A, src, 1, 0, 2).to_dense() == slice_scatter(A.to_dense(), src, 1, 0, 2)
    """
    A, src, rest = args[0], args[1], args[2:]  # (a dense A: a dense copy, src written in)
    view = _SCATTER_VIEWS[func]
    func(meta_like(A), meta_like(src), *rest, **kwargs)  # torch's errors (the src's shape, dtype)
    out = aten.clone.default(A)
    view(out, *rest, **kwargs).copy_(src)
    return out
