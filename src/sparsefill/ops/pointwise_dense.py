"""The element-wise rule's dense operands (:func:`.pointwise.pointwise_rule`): a dense tensor beside SparseTensors.

* constant along the sparse dims (size 1 there, or expanded): an operand of the values over the dense dims, the
  result stays sparse (:func:`_over_dense_dims`: a reduction's gradient ``grad.expand(shape)`` is one);
* varying along them, with ``op(fill, t)`` one value over ``t``'s own shape: the result keeps the pattern, ``t``
  read at it, that value the fill (:func:`_constant_fill`: ``A * e`` with a zero fill and a finite ``e``);
* otherwise dense by nature (:func:`_dense_call`, quiet under the default densify policy), as is a dense
  tensor updated in place from SparseTensors (:func:`_into_dense`).

The invariant, as the rule's: ``densify(op(A, t)) == op(densify(A), t)``.

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor([[0, 1], [1, 0]], [1., 2.], (2, 2))
>>> e = torch.tensor([[3.], [4.]])                      # varies along A's first (sparse) dim
>>> type(A * e).__name__, torch.equal((A * e).to_dense(), A.to_dense() * e), type(A + e).__name__
('SparseTensor', True, 'Tensor')
"""

from __future__ import annotations

import torch

from .._compile import traced
from .._convert import dense_of
from .._policy import check_densify
from .._tensor import SparseTensor


def _constant_fill(func, args, kwargs, sparse, A: SparseTensor):
    """``op(fills, dense operands)`` over the dense operands' own shapes (no larger than them): the result's fill
    (over A's dense dims) when it is constant along A's sparse dims, else None (then the result is dense by
    nature; also where ``op`` raises, ``A // e`` with a zero in ``e``: dense raises too unless ``A`` has no
    element).  ``A * e`` with a zero fill and a finite ``e`` has fill 0; ``A + e`` varies."""
    fills = {id(T): E._fill if E._fill.dim() else E._fill.reshape(1) for T, E in sparse}  # (dimensioned: promotion)
    dense = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor) and id(a) not in fills]
    if traced(A._vals) or any(traced(t) for t in dense):
        return None  # (no data read while traced: the dense result, as before)

    def call(sub):
        return func(*[sub.get(id(a), a) for a in args], **{k: sub.get(id(v), v) for k, v in kwargs.items()})
    try:  # (an op that raises, 0 // e: the dense call gives dense's outcome, an empty A's empty result)
        if len(dense) == 1 and all(f.shape == (1,) for f in fills.values()) and dense[0].numel() > 2:  # two first
            two = call({**fills, id(dense[0]): dense[0].reshape(-1)[[0, -1]]})
            if not isinstance(two, torch.Tensor) or \
                    not bool((two[0] == two[1]) | (two[0] != two[0]) & (two[1] != two[1])):
                return None
        F = call(fills)
    except Exception:
        return None
    if not isinstance(F, torch.Tensor) or not F.numel():
        return None
    along = max(A.dim() - A.dense_dim() - (A.dim() - F.dim()), 0)  # F's leading dims along A's sparse dims
    ref = F[(0,) * along]
    if not bool(((F == ref) | (F != F) & (ref != ref)).all()):
        return None
    D = A._dense_shape
    return ref.reshape(()) if not D and ref.numel() == 1 else \
        ref.reshape((1,) * (len(D) - ref.dim()) + tuple(ref.shape)).expand(D).contiguous()


def _into_dense(func, args, kwargs, tensors, sparse, written):
    """A dense tensor updated in place from SparseTensors (``x.add_(A)``; ``g.masked_fill_(A < B, 0)`` in torch's
    derivative formulas of ``maximum``, ``std``, ``norm``): dense by nature, as ``x + A`` is, so computed with
    the SparseTensors' dense forms, quietly (they broadcast to the target: no larger than it).  A SparseTensor
    written too, or an indefinite operand (no dense form), takes the fallback."""
    if any(isinstance(w, SparseTensor) or w.layout is not torch.strided for w in written) \
            or any(T._indefinite or T.numel() > w.numel() for T in sparse for w in written):
        return NotImplemented
    return _dense_call(func, args, kwargs, tensors)


def _dense_call(func, args, kwargs, tensors):
    """``func`` on the SparseTensors' dense forms, for a result that is dense by nature (the densify gate's
    ``by_nature``: quiet under the default policy)."""
    sparse = {id(T): T for T in tensors if isinstance(T, SparseTensor)}
    check_densify(f"{func}: a dense result from SparseTensor operands",
                  sum(T.numel() * T.element_size() for T in sparse.values()), by_nature=True)
    dense = {k: dense_of(T) for k, T in sparse.items()}
    return func(*[dense.get(id(a), a) for a in args], **{k: dense.get(id(v), v) for k, v in kwargs.items()})


def _over_dense_dims(t: torch.Tensor, A: SparseTensor):
    """``t`` as an operand of the values (shape of the dense dims) if it is constant along A's sparse dims
    (size 1 there, or an expanded tensor: stride 0) and broadcasts to A's shape; else None.  The gradient
    of a reduction (``grad.expand(shape)``) is such a tensor, so gradients stay sparse.  The result keeps
    >= 1 dim so that type promotion sees a dimensioned tensor."""
    if t.dim() > A.dim():
        return None
    lead = A.dim() - t.dim()
    sdim, D = A.dim() - A.dense_dim(), tuple(A.shape[A.dim() - A.dense_dim():])
    along = range(max(sdim - lead, 0))  # t's dims that lie along A's sparse dims
    if any(t.shape[j] != 1 and (t.stride(j) != 0 or t.shape[j] != A.shape[lead + j]) for j in along):
        return None
    d = t[tuple(0 for _ in along)] if len(along) else t  # one slice: the dense-dims part
    d = d.reshape((1,) * (len(D) - d.dim()) + tuple(d.shape)) if d.dim() < len(D) else d
    if torch.broadcast_shapes(tuple(d.shape), D) != D:
        return None
    return d.reshape(1) if d.dim() == 0 else d
