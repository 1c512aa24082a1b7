"""The element-wise rule's dense operands (:func:`.pointwise.pointwise_rule`): a dense tensor beside
SparseTensors.

* constant along the sparse dims (size 1 there, or expanded): an operand of the values over the
  dense dims, the result stays sparse (:func:`_over_dense_dims`: a reduction's gradient
  ``grad.expand(shape)`` is one);
* varying along them, with ``op(fill, t)`` one value over ``t``'s own shape: the result keeps the
  pattern, ``t`` read at it, that value the fill (:func:`_constant_fill`: ``A * e`` with a zero fill
  and a finite ``e``);
* otherwise dense by nature (:func:`_dense_call`, quiet under the default densify policy), as is a
  dense tensor updated in place from SparseTensors (:func:`_into_dense`).

The invariant, as the rule's: ``densify(op(A, t)) == op(densify(A), t)``.

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor([[0, 1], [1, 0]], [1., 2.], (2, 2))
>>> e = torch.tensor([[3.], [4.]])                      # varies along A's first (sparse) dim
>>> type(A * e).__name__, torch.equal((A * e).to_dense(), A.to_dense() * e), type(A + e).__name__
('SparseTensor', True, 'Tensor')
"""

from __future__ import annotations

import torch

from sparsefill._kernels import index as _index
from sparsefill._kernels.trace import traced
from sparsefill._tensor.parts import (
    coalesced_parts,
    dense_of,
    parts_to_sparse,
    pattern_mask,
    rewrap,
)
from sparsefill._tensor.policy import check_densify
from sparsefill._tensor.tensor import SparseTensor


def _constant_fill(func, args, kwargs, sparse, A: SparseTensor):
    """``op(fills, dense operands)`` over the dense operands' own shapes (no larger than them): the
    result's fill (over A's dense dims) when it is constant along A's sparse dims, else None (then
    the result is dense by nature; also where ``op`` raises, ``A // e`` with a zero in ``e``: dense
    raises too unless ``A`` has no element).  ``A * e`` with a zero fill and a finite ``e`` has fill
    0; ``A + e`` varies."""
    # (dimensioned: promotion)
    fills = {id(T): E._fill if E._fill.dim() else E._fill.reshape(1) for T, E in sparse}
    dense = [
        a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor) and id(a) not in fills
    ]
    if traced(A._vals) or any(traced(t) for t in dense):
        return None  # (no data read while traced: the dense result, as before)

    def call(sub):
        return func(
            *[sub.get(id(a), a) for a in args], **{k: sub.get(id(v), v) for k, v in kwargs.items()}
        )

    # (an op that raises, 0 // e: the dense call gives dense's outcome, an empty A's empty result)
    try:
        if (
            len(dense) == 1
            and all(f.shape == (1,) for f in fills.values())
            and dense[0].numel() > 2
        ):  # two first
            two = call({**fills, id(dense[0]): dense[0].reshape(-1)[[0, -1]]})
            if not isinstance(two, torch.Tensor) or not bool(
                (two[0] == two[1]) | (two[0] != two[0]) & (two[1] != two[1])
            ):
                return None
        F = call(fills)
    except Exception:
        return None
    if not isinstance(F, torch.Tensor) or not F.numel():
        return None
    # F's leading dims along A's sparse dims
    along = max(A.dim() - A.dense_dim() - (A.dim() - F.dim()), 0)
    ref = F[(0,) * along]
    if not bool(((F == ref) | (F != F) & (ref != ref)).all()):
        return None
    D = A._dense_shape
    return (
        ref.reshape(())
        if not D and ref.numel() == 1
        else ref.reshape((1,) * (len(D) - ref.dim()) + tuple(ref.shape)).expand(D).contiguous()
    )


def _into_dense(func, args, kwargs, tensors, sparse, written):
    """A dense tensor updated in place from SparseTensors (``x.add_(A)``; ``g.masked_fill_(A < B,
    0)`` in torch's derivative formulas of ``maximum``, ``std``, ``norm``): dense by nature, as ``x
    + A`` is, so computed with the SparseTensors' dense forms, quietly (they broadcast to the
    target: no larger than it).  A SparseTensor written too, or an indefinite operand (no dense
    form), takes the fallback."""
    if any(isinstance(w, SparseTensor) or w.layout is not torch.strided for w in written) or any(
        T._indefinite or T.numel() > w.numel() for T in sparse for w in written
    ):
        return NotImplemented
    return _dense_call(func, args, kwargs, tensors)


def _dense_call(func, args, kwargs, tensors):
    """``func`` on the SparseTensors' dense forms, for a result that is dense by nature (the densify
    gate's ``by_nature``: quiet under the default policy)."""
    sparse = {id(T): T for T in tensors if isinstance(T, SparseTensor)}
    check_densify(
        f"{func}: a dense result from SparseTensor operands",
        sum(T.numel() * T.element_size() for T in sparse.values()),
        by_nature=True,
    )
    dense = {k: dense_of(T) for k, T in sparse.items()}
    return func(
        *[dense.get(id(a), a) for a in args], **{k: dense.get(id(v), v) for k, v in kwargs.items()}
    )


def _over_dense_dims(t: torch.Tensor, A: SparseTensor):
    """``t`` as an operand of the values (shape of the dense dims) if it is constant along A's
    sparse dims (size 1 there, or an expanded tensor: stride 0) and broadcasts to A's shape; else
    None.  The gradient of a reduction (``grad.expand(shape)``) is such a tensor, so gradients stay
    sparse.  The result keeps >= 1 dim so that type promotion sees a dimensioned tensor."""
    if t.dim() > A.dim():
        return None
    lead = A.dim() - t.dim()
    sdim, D = A.dim() - A.dense_dim(), tuple(A.shape[A.dim() - A.dense_dim() :])
    along = range(max(sdim - lead, 0))  # t's dims that lie along A's sparse dims
    if any(
        t.shape[j] != 1 and (t.stride(j) != 0 or t.shape[j] != A.shape[lead + j]) for j in along
    ):
        return None
    # (A has no element: no slice to read, any values of its shape)
    if len(along) and 0 in t.shape[: len(along)]:
        d = t.new_zeros(t.shape[len(along) :])
    else:
        d = t[tuple(0 for _ in along)] if len(along) else t  # one slice: the dense-dims part
    d = d.reshape((1,) * (len(D) - d.dim()) + tuple(d.shape)) if d.dim() < len(D) else d
    if torch.broadcast_shapes(tuple(d.shape), D) != D:
        return None
    return d.reshape(1) if d.dim() == 0 else d


def unexpanded(sparse, written):
    """The SparseTensor operands with the dense dims along which their values are an expanded view
    (stride 0, a uniform fill there: ``d.expand_as(A)`` of a row reduction, :func:`.shape.expand`)
    back to size 1, where
    another operand not so expanded has that size (the result keeps its shape)::

        op(E, B) == op(E1, B)        E == E1.expand(E.shape),  B.shape == E.shape

    so that they broadcast (:func:`join_small`) instead of being merged at one split, which would
    store every element of ``E``.  Written operands stay as they are."""
    cut = [
        _expanded_dims(T) if T.dense_dim() and not any(T is w for w in written) else ()
        for T in sparse
    ]
    if not any(cut):
        return sparse
    sizes = {}  # position from the right -> it has its size in an operand not expanded there
    for T, c in zip(sparse, cut):
        for j in range(T.dim()):
            if T.shape[j] != 1 and j - T.dim() not in c:
                sizes[j - T.dim()] = True
    return [_narrowed(T, {p for p in c if sizes.get(p)}) if c else T for T, c in zip(sparse, cut)]


def _expanded_dims(T: SparseTensor):
    """``T``'s dense dims (counted from the right, negative) of size > 1 along which the values have
    stride 0 and the fill is uniform."""
    v, nd, f = T._vals, T.dense_dim(), T._fill
    out = set()
    for j in range(-nd, 0):
        if (
            v.stride(j) == 0
            and v.shape[j] > 1
            and (T._indefinite or f.dim() < -j or f.shape[j] == 1 or f.stride(j) == 0)
        ):
            out.add(j)
    return out


def _narrowed(T: SparseTensor, dims) -> SparseTensor:
    """``T`` at index 0 (kept as a size-1 dim) along its expanded dense dims ``dims`` (from the
    right)."""
    if not dims:
        return T
    v, f, size = T._vals, T._fill, list(T.shape)
    for j in dims:
        v, size[j] = v.narrow(j, 0, 1), 1
        if not T._indefinite and f.dim() >= -j:
            f = f.narrow(j, 0, 1)
    return rewrap(T, size=size, values=v, fill=f)


def join_small(rule, func, args, kwargs, sparse, conv, written):
    """``op`` with each SparseTensor operand ``T`` that broadcasts along a sparse dim of the result
    (size 1 where a full-shape operand has ``n``: ``A / A.sum(1, keepdim=True)``, ``A - A.amax(1,
    keepdim=True)``) given as its dense form, where that keeps a full operand's pattern (``rule``
    with ``pattern_only``: an indefinite ``A`` read
    at its pattern, or one fill ``f(fill, t)``, :func:`_constant_fill`)::

        op(A, T) == op(A, dense(T))
            (dense(T): T.numel() elements, no more than T expanded and A store)

    An indefinite ``T`` (beside indefinite full operands only) joins with a stored value as its
    fill, and the result then drops the positions where ``T`` is unspecified (:func:`_masked_where`;
    in place, only where that drops none of the target's elements: ``g.masked_fill_(norm == 0, 0)``
    in norm's backward).  None where it does not apply (the rule then expands ``T``:
    :func:`.shape.expand`, under the densify policy)."""
    try:
        shape = torch.broadcast_shapes(*[C.shape for C in conv])
    except RuntimeError:
        return None
    full = [C for C in conv if C.shape == shape]
    if not full or traced(full[0]._vals):
        return None
    sd = max(C._sparse_ndim() for C in full)
    small = {}
    for T, C in zip(sparse, conv):
        if C.shape == shape:
            continue
        pad = len(shape) - C.dim()
        grown = [j for j in range(sd) if shape[j] != 1 and (j < pad or C.shape[j - pad] == 1)]
        if (
            not grown
            or any(T is w for w in written)
            or C._indefinite
            and not all(F._indefinite for F in full)
        ):
            return None
        repeats = _index.numel([shape[j] for j in grown])
        if C.numel() > (max(C._nse(), 1) * repeats + full[0]._nse()) * _index.numel(C._dense_shape):
            # (no larger than T expanded, nse * repeats, and the result's part in its union)
            return None
        small[id(T)] = C
    dense, masks = {}, []
    for k, C in small.items():
        if C._indefinite:
            v = C._vals.reshape(-1)
            dense[k] = dense_of(
                C, v[0] if v.numel() else torch.ones((), dtype=C.dtype, device=C.device)
            )
            masks.append(dense_of(pattern_mask(C)))
        else:
            dense[k] = dense_of(C)
    # in place: where the masks drop none of the target's elements (nothing to undo after)
    if masks and written:
        if _masked_where(written[0], masks) is not written[0]:
            return None
        masks = []
    out = rule(
        func,
        [dense.get(id(a), a) for a in args],
        {k: dense.get(id(v), v) for k, v in kwargs.items()},
        pattern_only=True,
    )
    if not isinstance(out, SparseTensor):
        return None
    return _masked_where(out, masks) if masks else out


def _masked_where(R: SparseTensor, masks) -> SparseTensor | None:
    """The indefinite ``R`` less its stored elements where a mask (a dense bool tensor broadcasting
    to ``R``) is False; None where a mask varies within a dense slice of ``R`` (a slice is all
    specified or all masked out)."""
    idx, vals = coalesced_parts(R)
    sd = idx.shape[0]
    keep = None
    for m in masks:
        m = m.reshape((1,) * (R.dim() - m.dim()) + tuple(m.shape))
        if R.dim() > sd:
            lo, m = m.flatten(sd).all(-1), m.flatten(sd).any(-1)
            if not torch.equal(lo, m):
                return None
        k = (
            m[tuple(idx[j] if m.shape[j] != 1 else 0 for j in range(sd))]
            .reshape(-1)
            .expand(idx.shape[1])
        )
        keep = k if keep is None else keep & k
    if bool(keep.all()):
        return R
    return parts_to_sparse(
        idx[:, keep],
        vals[keep],
        R.shape,
        R._fill,
        indefinite=True,
        layout=R._sf_layout,
        coalesced=True,
    )
