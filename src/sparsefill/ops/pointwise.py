"""Element-wise ops (aten ops tagged ``torch.Tag.pointwise``), fill-value-rfc.md points 8-9::

    f(A, B, ...) == SparseTensor(P, f(A[P], B[P], ...), fill_value=f(fill_A, fill_B, ...))
    so  f(A, B).to_dense() == f(A.to_dense(), B.to_dense())

``P`` is A's pattern when there is one SparseTensor operand (or the same index tensors
everywhere: ``A * A``, ``A + A.exp()``; no merge), else the union of the patterns, merged
by linear keys.  Other operands: Python scalars, 0-d tensors, and dense tensors that
broadcast over the dense dims only (the fill may become an array).  A dense operand that
varies along the sparse dims makes the result dense by nature: computed densely, quietly.

Each fill goes through the op as a batch of one, ``(1, *fill.shape)``, so that type
promotion and broadcasting treat it as they treat the values.  Uncoalesced inputs are
coalesced first (``f`` of a sum is not the sum of ``f``).  An indefinite operand leaves the
result unspecified wherever it is unspecified.  SparseTensors of different shapes go to the
next stage.
"""

from __future__ import annotations

import torch

from .._convert import coalesce_of, dense_of, parts_to_sparse, rewrap, union_parts
from .._tensor import SparseTensor
from .fallback import assign_, flat_args, written_args, written_positions


def is_pointwise(func) -> bool:
    """Deterministic element-wise ops (random ones would give every unspecified element one draw)."""
    tags = func.tags
    return torch.Tag.pointwise in tags and torch.Tag.nondeterministic_seeded not in tags


def unary_fast_ok(func) -> bool:
    """``func`` may take :func:`unary_fast`: pointwise, out of place, one tensor result, no handler."""
    from .registry import HANDLERS
    r = func._schema.returns
    return (is_pointwise(func) and func not in HANDLERS and not written_positions(func)
            and len(r) == 1 and str(r[0].type) == "Tensor")


def unary_fast(func, args, kwargs):
    """The common cases at the cost of the aten calls: a coalesced SparseTensor ``A`` first (not a view,
    definite fill), every other positional argument a Python value or a SparseTensor of the same
    pattern object, dtype and shape (``A * A``, ``A + A.exp()``), keyword arguments Python values::

        f(A, B, c) = SparseTensor(P, f(A.values, B.values, c), f(fill_A, fill_B, c))

    Operands of one dtype beside Python scalars promote alike whatever their rank, so the fills need
    no reshape.  Returns None when the call does not qualify (the general rule then takes it).
    """
    A = args[0]
    if type(A) is not SparseTensor or A._view is not None or not A._coalesced or A._indefinite:
        return None
    vals, fills = [A._vals], [A._fill]
    for a in args[1:]:
        if isinstance(a, torch.Tensor):
            if not (type(a) is SparseTensor and a._idx is A._idx and a._crow is A._crow and a._col is A._col
                    and a._coalesced and a._view is None and not a._indefinite and a.dtype == A.dtype
                    and a.shape == A.shape):
                return None
            vals.append(a._vals)
            fills.append(a._fill)
        else:
            vals.append(a)
            fills.append(a)
    for a in kwargs.values():
        if isinstance(a, torch.Tensor):
            return None
    return SparseTensor(A._sf_layout, A.shape, func(*vals, **kwargs), func(*fills, **kwargs),
                        indices=A._idx, crow=A._crow, col=A._col, coalesced=True)


def pointwise_rule(func, args, kwargs):
    tensors = [t for t in flat_args(args, kwargs) if isinstance(t, torch.Tensor)]
    sparse = list({id(t): t for t in tensors if isinstance(t, SparseTensor)}.values())
    if not sparse or "out" in kwargs:
        return NotImplemented
    A = sparse[0]
    written = written_args(func, args, kwargs)
    if written_positions(func) and not (len(written) == 1 and written[0] is A):
        return NotImplemented  # e.g. a dense tensor updated in place from A
    # a 0-d SparseTensor beside a larger one is one value: it joins as a 0-d dense tensor (same promotion)
    sub = {id(T): dense_of(T) for T in sparse[1:] if T.dim() == 0 < A.dim() and not T._indefinite}
    sparse = [T for T in sparse if id(T) not in sub]
    if any(T.shape != A.shape or T.dense_dim() != A.dense_dim() for T in sparse[1:]):
        return NotImplemented  # broadcasting between SparseTensors: not yet
    for t in tensors:
        if not isinstance(t, SparseTensor) and t.dim():
            sub[id(t)] = _over_dense_dims(t, A)
            if sub[id(t)] is None:  # t varies along sparse dims: the result is dense by nature
                return NotImplemented if written else _dense_call(func, args, kwargs, tensors)
    build, at = _align(sparse)
    indefinite = any(T._indefinite for T in sparse)

    def apply(x):  # pointwise schemas are flat: substitute operands by id
        sub.update(x)
        return func(*[sub.get(id(a), a) for a in args], **{k: sub.get(id(v), v) for k, v in kwargs.items()})

    # each fill as a batch of one, padded to the common rank: (1, *fill.shape)
    rank = max([d.dim() for d in sub.values()] + [T._fill.dim() for T in sparse])
    fills = {id(T): T._fill.reshape((1,) * (1 + rank - T._fill.dim()) + tuple(T._fill.shape)) for T in sparse}
    if written:  # in place: compute out of place, then store (inner tensors may be shared with other tensors)
        if not indefinite:
            fills[id(A)] = A._fill.expand(A._dense_shape)[None]  # the result's fill may be an array
        vals = apply({**at, id(A): at[id(A)].clone()})
        fill = None if indefinite else apply({**fills, id(A): fills[id(A)].clone()})[0]
        return assign_(A, build(vals, fill))
    vals = apply(at)
    out_fills = None if indefinite else apply(fills)
    if isinstance(vals, torch.Tensor):
        return build(vals, None if out_fills is None else out_fills[0])
    return type(vals)(build(v, None if out_fills is None else f[0]) for v, f in zip(vals, out_fills or vals))


def _align(sparse):
    """``(build(values, fill) -> SparseTensor, {id(T): T's values at the result's positions})``.

    One pattern (or the same index tensors everywhere): the values as stored.  Otherwise the
    union of the patterns, merged by linear keys (fill-value-rfc.md point 9), less the positions
    an indefinite operand leaves unspecified (those stay unspecified in the result).
    """
    A = sparse[0]
    if all(_same_pattern(T, A) for T in sparse[1:]):
        B = A if A._coalesced else coalesce_of(A)
        return (lambda v, f: rewrap(B, values=v, fill=v.new_empty(0) if f is None else f, known_zero=False),
                {id(T): (B if T is A else T)._vals for T in sparse})
    idx, values = union_parts(sparse)

    def build(v, f):
        return parts_to_sparse(idx, v, A.shape, v.new_empty(0) if f is None else f, f is None, False,
                               A._sf_layout, True)
    return build, {id(T): v for T, v in zip(sparse, values)}


def _same_pattern(T: SparseTensor, A: SparseTensor) -> bool:
    if T._sf_layout is not A._sf_layout or not (T._coalesced and A._coalesced):
        return False
    if A._sf_layout is torch.sparse_coo:
        return T._idx is A._idx
    return T._crow is A._crow and T._col is A._col


def _dense_call(func, args, kwargs, tensors):
    dense = {id(T): dense_of(T) for T in tensors if isinstance(T, SparseTensor)}
    return func(*[dense.get(id(a), a) for a in args], **{k: dense.get(id(v), v) for k, v in kwargs.items()})


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
