"""The canonical input mask of a sparse input (masked-reductions-on-sparse.md, "four cases").

For a sparse ``input`` (sparse shape ``S``, dense shape ``D``) and a ``mask`` of any layout,
:func:`combine` returns a :class:`Masked`: the union ``P`` of the input's pattern and the
masked-in pattern of the mask (an input with indefinite fill keeps its own pattern only), with

    u[r] = input.to_dense()[idx[:, r]]          (the input's value there: stored or its fill)
    m[r] = mask.to_dense()[idx[:, r]]           (broadcast to the input's shape)

and one flag ``mfill`` for every position outside ``P``: masked in (``True``: ``mask=None`` on
a defined fill) or masked out (``False``: a sparse or strided mask, or an indefinite fill).
This is ``input_mask3`` of the design note with the unspecified rest folded into one flag, so a
reduction sees ``k`` stored elements and, per slice, a count of identical fill elements.

Mask rules: ``None`` masks every element in (an indefinite fill: its pattern is the mask); a
strided, torch native sparse or sparsefill mask is read as ``mask.to(bool)`` and broadcast to the
input's shape; an indefinite fill in a mask reads as ``False``.
"""

from __future__ import annotations

import dataclasses

import torch

from sparsefill._tensor import parts as _convert
from sparsefill._kernels import index as _index, merge as _merge
from sparsefill._kernels.trace import traced
from sparsefill._tensor.policy import check_specify
from sparsefill._tensor.tensor import SparseTensor

__all__ = [
    "Masked",
    "as_sparse",
    "is_sparse",
    "combine",
    "mask_to_dense",
    "true_positions",
    "mask_rows",
]


def is_sparse(t) -> bool:
    return isinstance(t, SparseTensor) or (
        isinstance(t, torch.Tensor) and t.layout is not torch.strided
    )


def as_sparse(t) -> SparseTensor:
    """A SparseTensor for a SparseTensor or a torch native sparse tensor (storage shared)."""
    if isinstance(t, SparseTensor):
        return t
    from sparsefill._creation.constructors import from_torch

    return from_torch(t)


@dataclasses.dataclass
class Masked:
    A: SparseTensor  # the input
    idx: torch.Tensor  # (len(S), k) coalesced union pattern
    u: torch.Tensor  # (k, *D) input values there (differentiable in A's values and fill)
    m: torch.Tensor  # (k, *D) bool: masked in
    fill: torch.Tensor  # the input fill expanded to D (zeros for an indefinite fill)
    mfill: bool  # elements outside the pattern are masked in
    same_pattern: bool  # idx is the input's own coalesced pattern (u are its values)
    rows: torch.Tensor | None = (
        None  # a plain CSR input: the row of every stored element (idx built lazily)
    )
    extra: torch.Tensor | None = (
        None  # a strided bool mask (the input's ndim, broadcastable): its True
    )
    # unspecified elements are masked in too, counted per slice (``counts``)
    all_in: bool = False  # every stored element is masked in (mask=None; known without reading m)

    def indices(self) -> torch.Tensor:
        """``idx``, built on first use for a plain CSR input (``[rows, col_indices]``)."""
        if self.idx is None:
            self.idx = torch.stack([self.rows, self.A._col])
        return self.idx

    @property
    def S(self):
        return tuple(self.A._sparse_shape)

    @property
    def D(self):
        return tuple(self.A._dense_shape)


def _check_broadcast(mask_shape, shape, name="mask"):
    if len(mask_shape) > len(shape):
        raise IndexError(
            f"{name} has {len(mask_shape)} dims but the input has {len(shape)}: a mask broadcasts "
            "to the input's shape and cannot have more dims"
        )
    for a, b in zip(reversed(tuple(mask_shape)), reversed(tuple(shape))):
        if a != b and a != 1:
            raise ValueError(
                f"{name} of shape {tuple(mask_shape)} does not broadcast to the input's shape "
                f"{tuple(shape)}"
            )


def mask_to_dense(mask, shape) -> torch.Tensor:
    """A strided bool mask of ``shape`` (an expanded view where broadcasting)."""
    _check_broadcast(mask.shape, shape)
    if isinstance(mask, SparseTensor):
        d = _convert.dense_of(mask, mask._vals.new_zeros(()) if mask._indefinite else None)
    elif mask.layout is not torch.strided:
        d = mask.to_dense()
    else:
        d = mask
    return (d if d.dtype == torch.bool else d != 0).expand(shape)


def true_positions(mask, shape) -> torch.Tensor:
    """Indices ``(len(shape), t)`` of the masked-in elements of ``mask`` broadcast to ``shape``.

    O(nse of the mask times the broadcast factor) for a sparse mask with a False/indefinite fill;
    a strided mask (or a sparse one with a True fill) is scanned densely.
    """
    _check_broadcast(mask.shape, shape)
    if is_sparse(mask):
        M = as_sparse(mask)
        if M._indefinite or _known_false_fill(M):
            idx, vals = _convert.coalesced_parts(M)
            nz = (vals != 0).nonzero()  # (t, 1 + dense_dim)
            pos = (
                torch.cat([idx[:, nz[:, 0]], nz[:, 1:].T], 0)
                if traced(nz) or nz.shape[0]
                else idx.new_zeros((M.dim(), 0))
            )
            return _broadcast_positions(pos, tuple(M.shape), tuple(shape))
        _convert.check_densify_quiet(M, "a sparse mask with a True fill")  # rare: read densely
        mask = mask_to_dense(M, M.shape)
    d = mask if mask.dtype == torch.bool else mask != 0
    pos = d.nonzero().T
    return _broadcast_positions(pos, tuple(d.shape), tuple(shape))


def _known_false_fill(M: SparseTensor) -> bool:
    """A definite mask's fill is False everywhere; not known while traced (torch.compile: the mask
    is then read densely, correct for either fill)."""
    return not traced(M._fill) and not bool(M._fill.any())


def _broadcast_positions(pos, mshape, shape):
    """Positions of a tensor of ``mshape`` broadcast to ``shape``: size-1 dims repeat, missing dims
    prepend."""
    lead = len(shape) - len(mshape)
    pos = torch.cat([pos.new_zeros((lead, pos.shape[1])), pos], 0)
    mshape = (1,) * lead + mshape
    factor = _index.numel([b for a, b in zip(mshape, shape) if a == 1 and b != 1])
    if factor > 1:
        _check_union(pos.shape[1] * factor, len(shape))
    for d, (a, b) in enumerate(zip(mshape, shape)):
        if a == 1 and b != 1:
            t = pos.shape[1]
            pos = pos.repeat(1, b)
            pos[d] = torch.arange(b, device=pos.device).repeat_interleave(t)
    return pos


def mask_rows(mask, A: SparseTensor):
    """The masked-in part of ``mask`` over ``A``'s split into sparse and dense dims: ``(idx, m)``
    with ``idx`` (len(S), r) coalesced and ``m`` (r, *D) bool; every row holds a masked-in
    element."""
    S, D = tuple(A._sparse_shape), tuple(A._dense_shape)
    pos = true_positions(mask, tuple(A.shape))
    keys, inv = torch.unique(_index.linearize(pos[: len(S)], S), return_inverse=True)
    m = torch.zeros((keys.numel(),) + D, dtype=torch.bool, device=pos.device)
    m[(inv,) + tuple(pos[len(S) :])] = True
    return _index.unravel(keys, S), m


def _same_indices(A: SparseTensor, M) -> torch.Tensor | None:
    """The mask's values on ``A``'s pattern when the mask is sparse with exactly ``A``'s pattern,
    else None."""
    if not is_sparse(M) or tuple(M.shape) != tuple(A.shape):
        return None
    M = as_sparse(M)
    if M.dense_dim() != A.dense_dim() or not (M._indefinite or _known_false_fill(M)):
        return None
    if M._sf_layout is A._sf_layout and M._coalesced and A._coalesced:
        pairs = (
            [(A._idx, M._idx)]
            if A._sf_layout is torch.sparse_coo
            else [(A._crow, M._crow), (A._col, M._col)]
        )
        if all(
            a is b or (not traced(a) and a.shape == b.shape and torch.equal(a, b)) for a, b in pairs
        ):
            k = A._vals.shape[0] if A._sf_layout is torch.sparse_coo else A._col.numel()
            v = M._vals.reshape((k,) + tuple(A._dense_shape))
            return v if v.dtype == torch.bool else v != 0
    return None


def _check_union(n_positions: int, words: int) -> None:
    """The union pattern stores every masked-in element of a strided mask that the input does not
    specify (``words`` index words each): elements stored explicitly, under the one size policy
    (``_tensor.policy.check_specify``: quiet up to 65536, then the densify policy's mode and byte
    limit)."""
    check_specify(
        f"a mask that masks in {n_positions} elements the sparse input does not specify (joined to "
        "its pattern: pass a sparse mask, or the input's pattern)",
        n_positions,
        words * 8,
    )


def csr_rows(A: SparseTensor) -> torch.Tensor:
    """The row of every stored element of a plain (unbatched) CSR tensor."""
    return _index.runs_to_ids(torch.diff(A._crow), A._col.numel())


def combine(input, mask, zero_absorbs: bool = False, counts: bool = False) -> Masked:
    """The canonical :class:`Masked` form of a sparse ``input`` and a ``mask`` of any layout (or
    None).

    ``zero_absorbs``: the op ignores masked-in zeros (sum, norm: ``input_mask6`` of the design
    note), so for a zero fill the masked-in unspecified elements are dropped instead of joined to
    the pattern. ``counts``: the op only needs, per output slice, how many unspecified elements a
    strided mask masks in (reductions but argmax/argmin): the pattern stays the input's and the mask
    rides along as ``extra`` (counted by ``_slices.Slices``; memory O(mask + output),
    however many it masks in).
    """
    A = as_sparse(input)
    D = tuple(A._dense_shape)
    plain_csr = A._sf_layout is torch.sparse_csr and A._crow.dim() == 1
    idx, vals = (None, A._vals) if plain_csr else _convert.coalesced_parts(A)
    rows = csr_rows(A) if plain_csr else None
    fill = (vals.new_zeros(()) if A._indefinite else A._fill).expand(D)
    if mask is None:
        return Masked(
            A,
            idx,
            vals,
            torch.ones(vals.shape, dtype=torch.bool, device=vals.device),
            fill,
            not A._indefinite,
            True,
            rows,
            all_in=True,
        )
    same = _same_indices(A, mask)
    if same is not None:
        return Masked(A, idx, vals, same, fill, False, True, rows)
    if idx is None:
        idx = torch.stack([rows, A._col])
    drop_rest = A._indefinite or (zero_absorbs and A._fill_is_zero())
    if not is_sparse(mask):  # a strided mask: read at the input's positions, O(nse)
        md = mask_to_dense(mask, A.shape)
        m = md[tuple(idx)] if idx.shape[0] else md.expand(vals.shape)
        if drop_rest:
            return Masked(A, idx, vals, m.clone(), fill, False, True, rows)
        base = mask if mask.dtype == torch.bool else mask != 0
        total = int(base.sum()) * (A.numel() // base.numel()) if base.numel() else 0
        if int(m.sum()) == total:  # no masked-in unspecified element
            return Masked(A, idx, vals, m.clone(), fill, False, True, rows)
        if counts:
            extra = base.reshape((1,) * (A.dim() - base.dim()) + tuple(base.shape))
            return Masked(A, idx, vals, m.clone(), fill, False, True, rows, extra=extra)
        _check_union(total, len(A._sparse_shape) + 1)
    S = tuple(A._sparse_shape)
    pos = true_positions(mask, tuple(A.shape))
    sd = len(S)
    mkeys = _index.linearize(pos[:sd], S)
    akeys = _index.linearize(idx, S)
    # no new positions: the pattern is the mask too, or the op ignores masked-in zeros
    if drop_rest:
        found_pos, found = _index.lookup(akeys, mkeys)
        m = torch.zeros(vals.shape, dtype=torch.bool, device=vals.device)
        sel = found.nonzero().squeeze(1)
        m[(found_pos[sel],) + tuple(pos[sd:, sel])] = True
        return Masked(A, idx, vals, m, fill, False, True, rows)
    # (no dense dims: linear-time merge of sorted runs)
    if not traced(mkeys) and _index.is_sorted_unique(mkeys):
        union, (ia, im) = _merge.union_inverse([akeys, mkeys])
    else:
        union, inv = torch.unique(torch.cat([akeys, mkeys]), return_inverse=True)
        ia, im = inv[: akeys.numel()], inv[akeys.numel() :]
    k = union.numel()
    # the masked-in positions are all specified in the input
    if not traced(union) and k == akeys.numel():
        m = torch.zeros(vals.shape, dtype=torch.bool, device=vals.device)
        m[(im,) + tuple(pos[sd:])] = True
        return Masked(A, idx, vals, m, fill, False, True, rows)
    u = torch.index_put(fill.expand((k,) + D), (ia,), vals)
    m = torch.zeros((k,) + D, dtype=torch.bool, device=vals.device)
    m[(im,) + tuple(pos[sd:])] = True
    return Masked(A, _index.unravel(union, S), u, m, fill, False, False)
