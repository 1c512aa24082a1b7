"""Element-wise ops (aten ops tagged ``torch.Tag.pointwise``), fill-value-rfc.md point 8::

    f(A) == SparseTensor(A.indices, f(A.values), fill_value=f(A.fill))    so    f(A).to_dense() == f(A.to_dense())

This module covers one SparseTensor operand (it may appear several times: ``A * A``),
Python scalars and 0-d tensors; the index tensors are reused untouched.  The fill goes
through the op as a 1-element batch ``fill[None]`` so that type promotion treats it as
it treats the values (a 0-d fill with a 0-d tensor operand would promote differently).
An uncoalesced input is coalesced first: ``f`` of a sum is not the sum of ``f``.
Indefinite fills stay indefinite.  Other operand mixes go to the next stage.
"""

from __future__ import annotations

import torch

from .._convert import coalesce_of, rewrap
from .._tensor import SparseTensor
from .fallback import assign_, flat_args, written_args, written_positions


def is_pointwise(func) -> bool:
    """Deterministic element-wise ops (random ones would give every unspecified element one draw)."""
    tags = func.tags
    return torch.Tag.pointwise in tags and torch.Tag.nondeterministic_seeded not in tags


def unary_pointwise(func, args, kwargs):
    tensors = [t for t in flat_args(args, kwargs) if isinstance(t, torch.Tensor)]
    sparse = {id(t): t for t in tensors if isinstance(t, SparseTensor)}
    if len(sparse) != 1 or "out" in kwargs or any(t.dim() and not isinstance(t, SparseTensor) for t in tensors):
        return NotImplemented
    (A,) = sparse.values()
    written = written_args(func, args, kwargs)
    if written_positions(func) and not (len(written) == 1 and written[0] is A):
        return NotImplemented  # e.g. a dense tensor updated in place from A
    B = A if A._coalesced else coalesce_of(A)

    def apply(x):  # pointwise schemas are flat: substitute x for A
        return func(*[x if a is A else a for a in args], **{k: x if v is A else v for k, v in kwargs.items()})

    if written:  # in place: compute out of place, then store (inner tensors may be shared with other tensors)
        vals, fill = apply(B._vals.clone()), (B._fill if B._indefinite else apply(B._fill[None].clone())[0])
        return assign_(A, rewrap(B, values=vals, fill=fill, known_zero=False))
    vals = apply(B._vals)
    fills = None if B._indefinite else apply(B._fill[None])
    if isinstance(vals, torch.Tensor):
        return _result(B, vals, None if fills is None else fills[0])
    return type(vals)(_result(B, v, None if fills is None else f[0]) for v, f in zip(vals, fills or vals))


def _result(B: SparseTensor, vals: torch.Tensor, fill) -> SparseTensor:
    return rewrap(B, values=vals, fill=vals.new_empty(0) if fill is None else fill, known_zero=False)
