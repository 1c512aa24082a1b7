"""Element-wise ops (aten ops tagged ``torch.Tag.pointwise``)::

    f(A, B, ...) == SparseTensor(P, f(A[P], B[P], ...), fill_value=f(fill_A, fill_B, ...))
    so  f(A, B).to_dense() == f(A.to_dense(), B.to_dense())

``P`` is A's pattern when there is one SparseTensor operand (or the same index tensors
everywhere: ``A * A``, ``A + A.exp()``; no merge), else the union of the patterns, merged
by linear keys.  Other operands: Python scalars, 0-d tensors, and dense tensors that
broadcast over the dense dims only (the fill may become an array).  A dense operand that
varies along the sparse dims keeps the pattern where ``f(fill, t)`` is one value (``A * e``, a zero
fill), else makes the result dense by nature: computed densely, quietly (:mod:`.pointwise_dense`).

Each fill goes through the op as a batch of one, ``(1, *fill.shape)``, so that type
promotion and broadcasting treat it as they treat the values.  Uncoalesced inputs are
coalesced first (``f`` of a sum is not the sum of ``f``).  An indefinite operand leaves the
result unspecified wherever it is unspecified, and a dense operand that varies along the sparse
dims is then read only there.  SparseTensors broadcast over size-1 dims (their stored elements
repeat along the expanded dims); ``out=`` stores into a SparseTensor.

The common calls (a coalesced definite ``A``, Python scalars, SparseTensors of ``A``'s shape) take
the fast path first (:mod:`.fast_path`); the rest come here.
"""

from __future__ import annotations

import functools

import torch

from sparsefill._kernels.trace import same_tensor
from sparsefill._tensor.parts import (
    coalesce_of,
    coalesced_parts,
    dense_of,
    parts_to_sparse,
    rewrap,
    union_parts,
)
from sparsefill._tensor.dense_dims import one_split
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops._schema import broadcast_error, flat_args, written_args, written_positions
from sparsefill.ops._writes import assign_
from sparsefill.ops.pointwise.dense_operands import (
    _constant_fill,
    _dense_call,
    _into_dense,
    _over_dense_dims,
    join_small,
    unexpanded,
)


aten = torch.ops.aten
# element-wise aten ops that torch does not tag pointwise (every overload, out= and in-place ones
# included)
UNTAGGED = {
    getattr(p, o)
    for p in (
        aten.rsub,
        aten.polar,
        aten.masked_fill,
        aten._prelu_kernel,
        aten._prelu_kernel_backward,
        aten.complex,
        aten.floor_divide,
        aten.floor_divide_,
        aten.log_sigmoid_backward,
        aten.elu_backward,
        aten.hardsigmoid_backward,
        aten.hardswish,
        aten.hardswish_,
        aten.hardswish_backward,
        aten.hardtanh_backward,
        aten.leaky_relu_backward,
        aten.mish_backward,
        aten.softplus_backward,
        aten.softshrink_backward,
        aten.hardshrink_backward,
        aten.threshold_backward,
        aten.gelu_backward,
        aten.silu_backward,
        aten.sigmoid_backward,
        aten.tanh_backward,
        aten.logit_backward,
    )
    for o in p.overloads()
}


@functools.cache
def is_pointwise(func) -> bool:
    """Deterministic element-wise ops (random ones would give every unspecified element one draw);
    an in-place op (``abs_``) is one when its functional form (``abs``, same overload) is."""
    tags = func.tags
    if (
        torch.Tag.pointwise in tags and torch.Tag.nondeterministic_seeded not in tags
    ) or func in UNTAGGED:
        return True
    name = func._schema.name.split("::")[1]
    if name.endswith("_") and not name.endswith("__"):
        functional = getattr(getattr(aten, name[:-1], None), func._overloadname, None)
        return functional is not None and is_pointwise(functional)
    return False


def pointwise_rule(func, args, kwargs, pattern_only=False):
    """The rule (module docstring); ``pattern_only``: None where the result would be dense by nature
    (:func:`.pointwise_dense.join_small` asks)."""
    out = kwargs.get("out")
    # out=: computed out of place into fresh buffers of out's dtype, then stored
    if out is not None:
        if not isinstance(out, SparseTensor):
            return NotImplemented
        kwargs = {k: v for k, v in kwargs.items() if k != "out"}
    tensors = [t for t in flat_args(args, kwargs) if isinstance(t, torch.Tensor)]
    sparse = list({id(t): t for t in tensors if isinstance(t, SparseTensor)}.values())
    if not sparse:
        return NotImplemented
    A = sparse[0]
    written = [out] if out is not None else written_args(func, args, kwargs)
    if out is None and written_positions(func) and not (len(written) == 1 and written[0] is A):
        # e.g. a dense tensor updated from A
        return _into_dense(func, args, kwargs, tensors, sparse, written)
    # a 0-d SparseTensor beside a larger one is one value: it joins as a 0-d dense tensor (same
    # promotion), the first one too unless written (0-d f64 A + f32 B is f32, as dense)
    big = A if A.dim() or written else next((T for T in sparse if T.dim()), A)
    sub = {id(T): dense_of(T) for T in sparse if T.dim() == 0 < big.dim() and not T._indefinite}
    sparse = [T for T in sparse if id(T) not in sub]
    A = sparse[0]
    if not A.dim():
        if all(t.dim() == 0 for t in tensors):
            return _zero_dim(func, args, kwargs, sparse, out, bool(written))
        # beside a dense operand with dims: a 0-d dense one promotes as A's values do (zero-dim
        # tensors alike)
        sub.update(
            {
                id(t): t.reshape(1)
                for t in tensors
                if t.dim() == 0 and not isinstance(t, SparseTensor)
            }
        )
    layout = A._sf_layout
    conv = sparse
    # operands that broadcast along a sparse dim: as dense ones, where small
    if len(sparse) > 1 and out is None:
        conv = unexpanded(sparse, written)
        if any(C.shape != conv[0].shape for C in conv[1:]):
            joined = join_small(pointwise_rule, func, args, kwargs, sparse, conv, written)
            if joined is not None:
                return joined
    # operands that split their dims differently
    if any(T.dense_dim() != conv[0].dense_dim() for T in conv[1:]):
        # (_tensor/dense_dims.py)
        conv, layout = one_split(conv, layout, A if written and out is None else None)
    if any(C.shape != conv[0].shape for C in conv[1:]):
        expanded = _broadcast(conv)
        if expanded is None:
            broadcast_error(args, kwargs)  # (torch's error: the sizes that do not match)
            return NotImplemented
        if written and out is None and expanded[0][1] is not A:
            raise RuntimeError(
                f"output with shape {list(A.shape)} doesn't match the broadcast shape "
                f"{list(expanded[0][1].shape)}"
            )
        sparse, A = [(T, E) for T, (_, E) in zip(sparse, expanded)], expanded[0][1]
    else:
        sparse, A = list(zip(sparse, conv)), conv[0]
    indefinite = any(E._indefinite for _, E in sparse)
    dense_ops = [t for t in tensors if not isinstance(t, SparseTensor) and t.dim()]
    over = {id(t): _over_dense_dims(t, A) for t in dense_ops}
    varying = [t for t in dense_ops if over[id(t)] is None]
    # the result's fill where the dense operands vary along the sparse dims but op(fills, them) not
    const = None
    if varying:  # dense operands that vary along the sparse dims
        try:
            shape = torch.broadcast_shapes(A.shape, *[t.shape for t in dense_ops])
        except RuntimeError:
            broadcast_error(args, kwargs)
            return NotImplemented
        # (not inside a backward: torch's derivative formulas reshape such intermediates in place,
        # unsqueeze_)
        if (
            not indefinite
            and not written
            and shape == A.shape
            and torch._C._current_graph_task_id() == -1
        ):
            # e.g. A * e with A's fill 0: 0 * e == 0
            const = _constant_fill(func, args, kwargs, sparse, A)
        if not indefinite and const is None:  # the result is dense by nature
            return (
                None
                if pattern_only
                else NotImplemented
                if written
                else _dense_call(func, args, kwargs, tensors)
            )
        # a masked operand (or a constant fill): the result is specified where A is; the dense
        # operands are read there
        if shape != A.shape:
            sparse = [(T, E if E.shape == shape else _expand(E, shape)) for T, E in sparse]
            A = sparse[0][1]
            over = {id(t): _over_dense_dims(t, A) for t in dense_ops}
    sub.update({k: v for k, v in over.items() if v is not None})
    return _on_pattern(
        func, args, kwargs, sparse, A, layout, sub, varying, out, written, indefinite, const
    )


def _on_pattern(
    func, args, kwargs, sparse, A, layout, sub, varying, out, written, indefinite, const
):
    """The last step of :func:`pointwise_rule`: ``sparse`` holds pairs (operand, the operand
    broadcast to ``A``), aligned here on one pattern; the op runs once on their values and once on
    their fills (each a batch of one), the other operands substituted by ``sub`` (id -> tensor;
    the dense operands in ``varying`` are read at the result's positions).  ``const``: the result's
    fill where it does not follow from the fills."""
    build, at = _align([E for _, E in sparse], layout)
    if varying:
        idx = coalesced_parts(build(at[id(A)], None))[0]  # the result's positions (a CSR's: cached)
        vshape = at[id(A)].shape  # (a batched CSR stores (*batch, nnz, *dense))
        sub.update({id(t): t.broadcast_to(A.shape)[tuple(idx)].reshape(vshape) for t in varying})
    at = {id(T): at[id(E)] for T, E in sparse}
    fills = {id(T): E._fill for T, E in sparse}

    def apply(x):  # pointwise schemas are flat: substitute operands by id
        sub.update(x)
        kw = {k: sub.get(id(v), v) for k, v in kwargs.items()}
        if out is not None:
            kw["out"] = torch.empty(0, dtype=out.dtype, device=out.device)
        return func(*[sub.get(id(a), a) for a in args], **kw)

    # each fill as a batch of one, padded to the common rank: (1, *fill.shape)
    rank = max([d.dim() for d in sub.values()] + [f.dim() for f in fills.values()])
    fills = {k: f.reshape((1,) * (1 + rank - f.dim()) + tuple(f.shape)) for k, f in fills.items()}
    # in place: compute out of place, then store (inner tensors may be shared)
    if written and out is None:
        if not indefinite:
            fills[id(A)] = A._fill.expand(A._dense_shape)[None]  # the result's fill may be an array
        vals = apply({**at, id(A): at[id(A)].clone()})
        try:
            fill = None if indefinite else apply({**fills, id(A): fills[id(A)].clone()})[0]
        except Exception:
            fill = _unread_fill(A, vals)[0]
        return assign_(A, build(vals, fill))
    vals = apply(at)
    if const is not None:
        return build(vals, const.to(vals.dtype))
    try:
        out_fills = None if indefinite else apply(fills)
    except Exception:
        out_fills = _unread_fill(A, vals)
    nd = A.dense_dim()
    if isinstance(vals, torch.Tensor):
        result = build(vals, None if out_fills is None else _unbatch(out_fills, nd))
        return result if out is None else assign_(out, result)
    return type(vals)(
        build(v, None if out_fills is None else _unbatch(f, nd))
        for v, f in zip(vals, out_fills or vals)
    )


def _zero_dim(func, args, kwargs, sparse, out, written: bool):
    """Every operand 0-d: each SparseTensor is one value, its stored element or its fill, and the op
    runs on 0-d tensors exactly as on dense ones (zero-dim type promotion; ``masked_fill``'s value
    must be 0-d)::

        f(A, b).to_dense() == f(A.to_dense(), b)

    The result stores its element where an operand stores one (unspecified where an indefinite
    operand stores none); its fill is ``f`` of the fills.  In place (``written``: the first operand)
    and ``out=`` store it.

    >>> import sparsefill
    >>> A = sparsefill.sparse_coo_tensor(
    ...     torch.zeros(0, 1, dtype=torch.int64), torch.tensor([2.0]), (), fill_value=0.0
    ... )
    >>> A.masked_fill(torch.tensor(True), torch.tensor(5.)).to_dense()
    tensor(5.)
    """
    # (duplicates summed: one value)
    parts = {id(T): T if T._coalesced else coalesce_of(T) for T in sparse}
    has = {k: P._vals.shape[0] > 0 for k, P in parts.items()}
    indefinite = any(P._indefinite for P in parts.values())
    specified = any(has.values()) and not any(
        P._indefinite and not has[k] for k, P in parts.items()
    )
    target = out if out is not None else sparse[0] if written else None

    def call(point):  # the op on 0-d stand-ins (the target's cloned: an in-place op writes it)
        if written and out is None:
            point[id(sparse[0])] = point[id(sparse[0])].clone()
        kw = {k: point.get(id(v), v) for k, v in kwargs.items()}
        if out is not None:
            kw["out"] = torch.empty(0, dtype=out.dtype, device=out.device)
        return func(*[point.get(id(a), a) for a in args], **kw)

    # each operand's value: stored, else its fill (an unspecified one only types the result: 1 of
    # its dtype)
    vals = call(
        {
            k: P._vals[0] if has[k] else P._vals.new_ones(()) if P._indefinite else P._fill
            for k, P in parts.items()
        }
    )
    try:
        fills = None if indefinite else call({k: P._fill for k, P in parts.items()})
    except Exception:  # noqa: BLE001 - the fill is read only where no operand stores the element
        if specified:
            fills = vals
        else:
            raise
    single = isinstance(vals, torch.Tensor)
    results = [
        _one_value(v, None if fills is None else f, specified)
        for v, f in zip([vals] if single else vals, [fills] if single else fills or vals)
    ]
    if target is not None:
        return assign_(target, results[0])
    return results[0] if single else type(vals)(results)


def _one_value(v: torch.Tensor, fill, specified: bool) -> SparseTensor:
    """A 0-d SparseTensor holding ``v`` (stored if ``specified``) with ``fill`` (None:
    indefinite)."""
    idx = torch.zeros((0, int(specified)), dtype=torch.int64, device=v.device)
    vals = v.reshape(1) if specified else v.new_empty(0)
    return parts_to_sparse(
        idx,
        vals,
        (),
        v.new_empty(0) if fill is None else fill.to(v.dtype),
        indefinite=fill is None,
        coalesced=True,
    )


def _unread_fill(A: SparseTensor, vals):
    """The fill (a batch of one: zeros of the values' dtype, one per result) of a result of ``A``'s
    shape that has no unspecified element (no element at all, or ``vals``, coalesced, store every
    one), whose fills' op raised; called in an ``except`` block, which it re-raises when an element
    is unspecified (dense raises there too).
    No element reads that fill, so any is exact; dense returns the result::

        A.numel() == 0  =>  (A // 0).to_dense() == A.to_dense() // 0          (though 0 // 0 raises)
        nse == numel    =>  (A // B).to_dense() == A.to_dense() // B.to_dense()
            (though fill_A // 0 raises)

    >>> import sparsefill
    >>> A = sparsefill.sparse_coo_tensor(
    ...     torch.zeros(1, 0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), (0,)
    ... )
    >>> torch.equal((A // 0).to_dense(), A.to_dense() // 0)
    True
    >>> A = sparsefill.sparse_coo_tensor([[0, 1]], [4, 6], (2,), fill_value=1)
    >>> B = sparsefill.sparse_coo_tensor([[0, 1]], [2, 3], (2,))
    >>> (A // B).to_dense()
    tensor([2, 2])
    """
    first = vals if isinstance(vals, torch.Tensor) else vals[0]
    if A.numel() and first.numel() != A.numel():
        raise
    if isinstance(vals, torch.Tensor):
        return vals.new_zeros(1)
    return type(vals)(v.new_zeros(1) for v in vals)


def _unbatch(batch: torch.Tensor, ndense: int) -> torch.Tensor:
    """A result fill from its batch of one, less leading size-1 dims beyond the dense dims."""
    f = batch[0]
    while f.dim() > ndense and f.shape[0] == 1:
        f = f[0]
    return f


def _broadcast(sparse):
    """``[(T, T expanded to the common shape)]`` for SparseTensors that broadcast over size-1 dims
    (as many dense dims each), else None.  Expanding sparse dim ``d`` of size 1 to ``n`` repeats the
    stored elements ``n`` times: the result pattern is the union of the expanded patterns; a dense
    dim expands the values and the fill (``A - A.logsumexp(-1, keepdim=True)`` on a hybrid
    ``A``)."""
    try:
        shape = torch.broadcast_shapes(*[T.shape for T in sparse])
    except RuntimeError:
        return None
    return [(T, T if T.shape == shape else _expand(T, shape)) for T in sparse]


def _expand(T: SparseTensor, shape) -> SparseTensor:
    """``T`` expanded to ``shape`` physically (``shape.expand``: the stored elements repeat)."""
    from sparsefill.ops.shape.reshape import (
        expand,
    )  # (shape.py imports the registry, which imports this module)

    return expand(T, list(shape), keep_split=True)


def _align(sparse, layout):
    """``(build(values, fill) -> SparseTensor, {id(T): T's values at the result's positions})``.

    One pattern (or the same index tensors everywhere): the values as stored.  Otherwise the
    union of the patterns, merged by linear keys, less the positions
    an indefinite operand leaves unspecified (those stay unspecified in the result).  The result
    has ``layout``.
    """
    A = sparse[0]
    if all(_same_pattern(T, A) for T in sparse[1:]):
        B = A if A._coalesced else coalesce_of(A)
        return (
            lambda v, f: rewrap(
                B,
                values=v,
                fill=v.new_empty(0) if f is None else f,
                indefinite=f is None,
                known_zero=False,
            ),
            {id(T): (B if T is A else T)._vals for T in sparse},
        )
    idx, values = union_parts(sparse)

    def build(v, f):
        return parts_to_sparse(
            idx,
            v,
            A.shape,
            v.new_empty(0) if f is None else f,
            indefinite=f is None,
            layout=layout,
            coalesced=True,
        )

    return build, {id(T): v for T, v in zip(sparse, values)}


def _same_pattern(T: SparseTensor, A: SparseTensor) -> bool:
    """Same coalesced pattern: the same index tensors, or (a 2-d CSR beside a COO of the same stored
    elements, e.g. a gradient built from the CSR's indices) equal indices, checked in O(nse) with no
    merge.  Both layouts store a coalesced pattern in row-major order, so the values line up."""
    if not (T._coalesced and A._coalesced):
        return False
    if T._sf_layout is not A._sf_layout:
        return _same_across_layouts(T, A)
    if A._sf_layout is torch.sparse_coo:
        return same_tensor(T._idx, A._idx)
    return same_tensor(T._crow, A._crow) and same_tensor(T._col, A._col)


def _same_across_layouts(T: SparseTensor, A: SparseTensor) -> bool:
    C, O = (T, A) if T._sf_layout is torch.sparse_csr else (A, T)
    if (
        C._sf_layout is not torch.sparse_csr
        or O._sf_layout is not torch.sparse_coo
        or C._crow.dim() != 1
        or C.shape[:2] != O.shape[:2]
        or O._idx.shape != (2, C._col.shape[0])
    ):
        return False
    rows, cols = O._idx
    return torch.equal(cols, C._col.to(cols.dtype)) and torch.equal(
        torch._convert_indices_from_coo_to_csr(
            rows.contiguous(), C.shape[0], out_int32=C._crow.dtype == torch.int32
        ),
        C._crow,
    )
