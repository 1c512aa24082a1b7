"""Element-wise ops (aten ops tagged ``torch.Tag.pointwise``), fill-value-rfc.md point 8::

    f(A) == SparseTensor(A.indices, f(A.values), fill_value=f(A.fill))    so    f(A).to_dense() == f(A.to_dense())

This module covers one SparseTensor operand (it may appear several times: ``A * A``),
Python scalars, 0-d tensors and dense tensors that broadcast over the dense dims only (the
result keeps A's pattern and gets an array fill); the index tensors are reused untouched.
A dense operand that varies along the sparse dims makes the result dense by nature: it is
computed on ``A.to_dense()``, quietly.  The fill goes
through the op as a 1-element batch ``(1, *fill.shape)`` (padded to the rank of any dense
operand) so that type promotion and broadcasting treat it as they treat the values (a 0-d fill with a 0-d tensor operand would promote differently).
An uncoalesced input is coalesced first: ``f`` of a sum is not the sum of ``f``.
Indefinite fills stay indefinite.  Other operand mixes go to the next stage.
"""

from __future__ import annotations

import torch

from .._convert import coalesce_of, dense_of, rewrap
from .._tensor import SparseTensor
from .fallback import assign_, flat_args, written_args, written_positions


def is_pointwise(func) -> bool:
    """Deterministic element-wise ops (random ones would give every unspecified element one draw)."""
    tags = func.tags
    return torch.Tag.pointwise in tags and torch.Tag.nondeterministic_seeded not in tags


def unary_pointwise(func, args, kwargs):
    tensors = [t for t in flat_args(args, kwargs) if isinstance(t, torch.Tensor)]
    sparse = {id(t): t for t in tensors if isinstance(t, SparseTensor)}
    if len(sparse) != 1 or "out" in kwargs:
        return NotImplemented
    (A,) = sparse.values()
    written = written_args(func, args, kwargs)
    if written_positions(func) and not (len(written) == 1 and written[0] is A):
        return NotImplemented  # e.g. a dense tensor updated in place from A
    sub = {id(A): None}
    for t in tensors:
        if not isinstance(t, SparseTensor) and t.dim():
            sub[id(t)] = _over_dense_dims(t, A)
            if sub[id(t)] is None:  # t varies along sparse dims: the result is dense by nature
                return NotImplemented if written else func(*_swap(args, A, dense_of(A)), **_swap(kwargs, A, dense_of(A)))
    B = A if A._coalesced else coalesce_of(A)

    def apply(x):  # pointwise schemas are flat: substitute x for A, the dense-dims form for dense operands
        sub[id(A)] = x
        return func(*[sub.get(id(a), a) for a in args], **{k: sub.get(id(v), v) for k, v in kwargs.items()})

    # the fill as a batch of one, padded to the rank of the dense operands: (1, *fill.shape)
    pad = max([d.dim() for d in sub.values() if d is not None] + [B._fill.dim()]) - B._fill.dim()
    F = B._fill.reshape((1,) * (1 + pad) + tuple(B._fill.shape))
    if written:  # in place: compute out of place, then store (inner tensors may be shared with other tensors)
        if len(sub) > 1 and not B._indefinite:  # a dense operand may turn a scalar fill into an array
            F = B._fill.expand(B._dense_shape)[None]
        vals, fill = apply(B._vals.clone()), (B._fill if B._indefinite else apply(F.clone())[0])
        return assign_(A, rewrap(B, values=vals, fill=fill, known_zero=False))
    vals = apply(B._vals)
    fills = None if B._indefinite else apply(F)
    if isinstance(vals, torch.Tensor):
        return _result(B, vals, None if fills is None else fills[0])
    return type(vals)(_result(B, v, None if fills is None else f[0]) for v, f in zip(vals, fills or vals))


def _over_dense_dims(t: torch.Tensor, A: SparseTensor):
    """``t`` as an operand of the values (shape of the dense dims) if it broadcasts over A's sparse dims
    without changing A's shape; else None.  It keeps >= 1 dim so that type promotion sees a dimensioned tensor."""
    if t.dim() > A.dim():
        return None
    padded = (1,) * (A.dim() - t.dim()) + tuple(t.shape)
    sdim, D = A.dim() - A.dense_dim(), tuple(A.shape[A.dim() - A.dense_dim():])
    if any(n != 1 for n in padded[:sdim]) or torch.broadcast_shapes(padded[sdim:], D) != D:
        return None
    d = t.reshape(padded[sdim:])
    return d.reshape(1) if d.dim() == 0 else d


def _swap(tree, A, x):
    if isinstance(tree, dict):
        return {k: x if v is A else v for k, v in tree.items()}
    return [x if a is A else a for a in tree]


def _result(B: SparseTensor, vals: torch.Tensor, fill) -> SparseTensor:
    return rewrap(B, values=vals, fill=vals.new_empty(0) if fill is None else fill, known_zero=False)
