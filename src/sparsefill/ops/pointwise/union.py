"""The union of two coalesced COO patterns of one sparse shape (:func:`union2`, cached per pair of
index tensors while small) and an operand's values spread over it (:func:`_spread`): what the fast
path of element-wise ops (:mod:`.fast_path`) computes ``A + B`` on.
"""

from __future__ import annotations

import array
import weakref

import torch

from sparsefill._kernels import index as _index, merge as _merge
from sparsefill._tensor.tensor import SparseTensor


_UNION_CACHE_MAX = 1024  # stored elements of two patterns up to which union2 caches their union
# (id(A._idx), id(B._idx)) -> (weakrefs of both, their versions and the union's, the union)
_UNIONS: dict = {}
_UNIONS_SIZE = 64
_SMALL = 64  # stored elements of two CPU patterns up to which union2 merges them as Python tuples


def union2(A: SparseTensor, B: SparseTensor):
    """``(indices, (pa, pb))``: the union of two coalesced COO patterns of one sparse shape, ``A``'s
    stored
    elements at its positions ``pa``, ``B``'s at ``pb``::

        indices[:, pa] == A._idx     indices[:, pb] == B._idx  (sorted, unique: a coalesced pattern)

    (``pa`` None: ``A``'s pattern holds ``B``'s, ``indices`` is ``A._idx`` itself; likewise ``pb``),
    by :func:`_kernels.merge.union_or_superset` of the linear keys (:func:`_union_small` for small
    CPU patterns); while the two hold at most ``_UNION_CACHE_MAX`` elements, cached per pair of
    index tensors (patterns that recur, a training step or a loop over small tensors, merge once;
    the key is the two tensors' identity and versions, cheaper to form than
    ``_kernels.grouping.pattern_cached``'s storage keys; the pattern of index tensors changed
    through ``set_`` is a version change too).  The indices are shared by the results: an in-place
    change of them is seen (version) and the union merged again."""
    ia, ib = A._idx, B._idx
    if ia.shape[1] + ib.shape[1] > _UNION_CACHE_MAX:
        return _merge2(A, B)
    key = (id(ia), id(ib))
    try:
        hit = _UNIONS.get(key)
        if (
            hit is not None
            and hit[0]() is ia
            and hit[1]() is ib
            and hit[2] == (ia._version, ib._version, hit[3][0]._version)
        ):
            return hit[3]
        versions = (ia._version, ib._version)
    except RuntimeError:  # inference tensors: no version counter, no cache
        return _merge2(A, B)
    out = _merge2(A, B)
    if len(_UNIONS) >= _UNIONS_SIZE:
        _UNIONS.pop(next(iter(_UNIONS)), None)
    _UNIONS[key] = (weakref.ref(ia), weakref.ref(ib), versions + (out[0]._version,), out)
    return out


def _merge2(A: SparseTensor, B: SparseTensor):
    """:func:`union2`, uncached."""
    ia, ib = A._idx, B._idx
    d = ia.shape[0]
    if 0 < ia.shape[1] + ib.shape[1] <= _SMALL and d and ia.is_cpu and ib.is_cpu:
        idx, pa, pb = _union_small(ia, ib)
        return idx, (pa, pb)
    S = A._size[:d]
    ka, kb = (T._idx[0] if d == 1 else _index.linearize(T._idx, S) for T in (A, B))
    # (None: that pattern is the union, e.g. a gradient's)
    union, pa, pb = _merge.union_or_superset(ka, kb)
    if pa is None or pb is None:
        return (ia if pa is None else ib), (pa, pb)
    return (union[None] if d == 1 else _index.unravel(union, S)), (pa, pb)


def _union_small(ia: torch.Tensor, ib: torch.Tensor):
    """``(indices, pa, pb)``: the union of two coalesced CPU COO index tensors (``d >= 1`` sparse
    dims, some stored element), merged as Python tuples (row-major order is their lexicographic
    order), the three results views of one int64 tensor built from a buffer: on a few stored
    elements this beats the fixed cost of torch ops.

    >>> [
    ...     t.tolist()
    ...     for t in _union_small(torch.tensor([[0, 1], [2, 0]]), torch.tensor([[0, 0], [1, 2]]))
    ... ]
    [[[0, 0, 1], [1, 2, 0]], [1, 2], [0, 1]]
    """
    d = ia.shape[0]
    if d == 1:  # (keys as they are: no tuples)
        ta, tb = ia.tolist()[0], ib.tolist()[0]
        union = sorted(set(ta).union(tb))
        flat = union.copy()
    else:
        ta, tb = list(zip(*ia.tolist())), list(zip(*ib.tolist()))
        union = sorted(set(ta).union(tb))
        flat = [x for col in zip(*union) for x in col]
    at = {t: i for i, t in enumerate(union)}
    k, na = len(union), len(ta)
    flat += [at[t] for t in ta] + [at[t] for t in tb]
    # (clone: torch-owned storage)
    buf = torch.frombuffer(array.array("q", flat), dtype=torch.int64).clone()
    return (
        buf.as_strided((d, k), (k, 1)),
        buf.as_strided((na,), (1,), d * k),
        buf.as_strided((len(tb),), (1,), d * k + na),
    )


def _spread(T: SparseTensor, pos: torch.Tensor | None, n: int) -> torch.Tensor:
    """``T``'s values at ``n`` positions: its stored ones at ``pos``, its fill elsewhere (``pos``
    None or of length ``n``: ``T``'s pattern is the union)."""
    v, fill = T._vals, T._fill
    if pos is None or pos.shape[0] == n:  # T's pattern is the union
        return v
    if v.dim() == 1 and v.is_cpu and not fill.dim():  # (fill_, put_: cheaper on small tensors)
        return v.new_empty(n).fill_(fill).put_(pos, v)
    return v.new_empty((n,) + v.shape[1:]).copy_(fill).index_copy_(0, pos, v)
