"""The element-wise reduction over ranks of SparseTensors of one shape, without densifying.

    combine(op, [T_0, ..., T_{W-1}]).to_dense() == op(T_0.to_dense(), ..., T_{W-1}.to_dense())

taken in rank order, on the union of the stored patterns: at a position ``p`` some rank stores, rank
``r`` contributes its stored value or, where it stores none, its fill; the result's fill is the
reduced fills.  Exact for any fill, NaN and inf included (the values are not shifted by the fills),
and the same bits on every rank (the same order).

An **indefinite** fill (masked-out elements) contributes nothing where it stores nothing: the result
at ``p`` reduces the ranks that define ``p`` (masked semantics, as ``torch.masked``), and is
unspecified only where no rank defines it -- its fill is indefinite when every rank's is.  AVG is
SUM divided by that count (the world size where every fill is definite).

>>> import torch, sparsefill
>>> from torch.distributed import ReduceOp
>>> a = sparsefill.sparse_coo_tensor([[0, 3]], [1., 2.], (5,), fill_value=0.)
>>> b = sparsefill.sparse_coo_tensor([[3]], [10.], (5,), fill_value=1.)
>>> combine(ReduceOp.SUM, [a, b]).to_dense()
tensor([ 2.,  1.,  1., 12.,  1.])
>>> i = sparsefill.sparse_coo_tensor([[1]], [7.], (5,), fill_value=sparsefill.indefinite)
>>> combine(ReduceOp.AVG, [a, i]).to_dense()
tensor([1.0000, 3.5000, 0.0000, 2.0000, 0.0000])
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed import ReduceOp

from sparsefill._kernels import merge as _merge
from sparsefill._tensor.parts import coalesced_parts, parts_to_sparse
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.distributed._wire import Parts, coords_of, keys_of

_R = ReduceOp.RedOpType
FUNCS = {
    _R.SUM: torch.add,
    _R.AVG: torch.add,
    _R.PRODUCT: torch.mul,
    _R.MIN: torch.minimum,
    _R.MAX: torch.maximum,
    _R.BAND: torch.bitwise_and,
    _R.BOR: torch.bitwise_or,
    _R.BXOR: torch.bitwise_xor,
}


def red_op(op) -> ReduceOp.RedOpType:
    """The ``RedOpType`` of ``op`` (a ``ReduceOp``, a ``RedOpType`` or c10d's boxed ReduceOp)."""
    if isinstance(op, torch.ScriptObject):
        op = op.op()
    if isinstance(op, ReduceOp) and not isinstance(op, ReduceOp.RedOpType):
        op = op.op
    return ReduceOp.RedOpType(int(op))


def check_op(op, dtype: torch.dtype) -> None:
    """Raise unless ``op`` has a closed form over stored elements for ``dtype``."""
    op = red_op(op)
    if op not in FUNCS:
        raise NotImplementedError(
            f"sparsefill.distributed: ReduceOp {op} is not supported on SparseTensors "
            f"(supported: {', '.join(str(o).split('.')[-1] for o in FUNCS)})"
        )
    if op in (_R.BAND, _R.BOR, _R.BXOR) and (dtype.is_floating_point or dtype.is_complex):
        raise TypeError(
            f"sparsefill.distributed: ReduceOp {op} needs an integer or bool dtype, got {dtype}"
        )
    if op in (_R.MIN, _R.MAX) and dtype.is_complex:
        raise TypeError(
            f"sparsefill.distributed: ReduceOp {op} is not defined for complex dtype {dtype}"
        )
    if op == _R.AVG and not (dtype.is_floating_point or dtype.is_complex):
        raise TypeError(
            "sparsefill.distributed: ReduceOp.AVG needs a floating-point or complex dtype, got "
            f"{dtype} (reduce with SUM and divide)"
        )


def combine(
    op: Any, tensors: list[SparseTensor], layout: torch.layout | None = None
) -> SparseTensor:
    """The reduction of ``tensors`` (SparseTensors of one shape, dtype and dense dims) by ``op``, in
    ``layout`` (default the first one's), coalesced; see the module docstring."""
    T0 = tensors[0]
    S = T0._sparse_shape
    parts = []
    for T in tensors:
        idx, vals = coalesced_parts(T)
        parts.append(Parts(keys_of(idx, S), vals, T._fill, T._indefinite, T._sf_layout))
    return combine_parts(op, parts, T0.shape, len(S), layout or T0._sf_layout)


def combine_parts(op, parts: list, shape, sdim: int, layout) -> SparseTensor:
    """:func:`combine` of tensors given as ``_wire.Parts`` (sorted unique linear keys over the first
    ``sdim`` dims of ``shape``, values, fill): one merge of the keys, one unravel of the union."""
    op = red_op(op)
    fn = FUNCS[op]
    S, D = tuple(shape[:sdim]), tuple(shape[sdim:])
    # (linear-time merges of the sorted runs)
    union, inverse = _merge.union_inverse([p.keys for p in parts])
    U = union.numel()
    acc = have = fill = count = None
    ndef = 0
    for p, inv in zip(parts, inverse):
        v = p.vals
        full = (v.new_zeros(()) if p.indefinite else p.fill).expand((U,) + D).clone()
        full.index_copy_(0, inv, v)
        defined = None
        if p.indefinite:
            defined = torch.zeros(U, dtype=torch.bool, device=v.device)
            defined[inv] = True
        else:
            fill = p.fill if fill is None else fn(fill, p.fill)
            ndef += 1
        if acc is None:
            acc, have = full, defined
        elif defined is None and have is None:
            acc = fn(acc, full)
        else:
            d = _mask(defined, U, v.device)
            h = _mask(have, U, v.device)
            acc = torch.where(_bc(d & h, D), fn(acc, full), torch.where(_bc(d, D), full, acc))
            have = d | h
        if op == _R.AVG:
            one = _mask(defined, U, v.device).to(torch.int64)
            count = one if count is None else count + one
    if op == _R.AVG:
        acc = acc / _bc(count.clamp(min=1), D).to(acc.dtype)
        fill = fill / ndef if fill is not None else None
    indefinite = fill is None
    if indefinite:
        fill = torch.empty(0, dtype=parts[0].vals.dtype, device=parts[0].vals.device)
    return parts_to_sparse(
        coords_of(union, S),
        acc,
        tuple(shape),
        fill,
        indefinite=indefinite,
        layout=layout,
        coalesced=True,
    )


def _mask(m, U, device):
    return torch.ones(U, dtype=torch.bool, device=device) if m is None else m


def _bc(m: torch.Tensor, D) -> torch.Tensor:
    return m.reshape((-1,) + (1,) * len(D))
