"""Ops computed by their reference decomposition (``torch._decomp``), whose pieces are native here.

A loss, a normalization layer and their gradients are element-wise maps followed by reductions
(``mse_loss(A, t) == mean((A - t) ** 2)``); torch's reference decompositions (the ones inductor
compiles) spell them out in such pieces.  Run on SparseTensor operands, every piece meets its own
handler: an element-wise map maps the stored values and the fill (a union pattern for two
SparseTensors), a reduction folds the stored values and ``n`` unspecified ones in closed form
(``sum = sum(values) + n * fill``).  So the whole op costs O(nse) plus its dense operands, and the
result equals the dense op's exactly.  An operand that is dense makes the element-wise part dense
by nature (``A - t`` for a dense target ``t``): computed once, through the densify policy.

>>> import torch, sparsefill, torch.nn.functional as F
>>> A = sparsefill.sparse_coo_tensor([[0, 2]], [1., 3.], (4,), fill_value=2.)
>>> F.mse_loss(A, torch.zeros(4)), F.mse_loss(A.to_dense(), torch.zeros(4))
(tensor(4.5000), tensor(4.5000))
"""

from __future__ import annotations

import torch
from torch._decomp import decomposition_table

from sparsefill._tensor.parts import coalesced_parts
from sparsefill._tensor.tensor import SparseTensor


def decomposed(func, args, kwargs):
    """``func(*args, **kwargs)`` by its reference decomposition (its pieces dispatch to their
    handlers), or ``NotImplemented`` where torch has none."""
    ref = decomposition_table.get(func)
    if ref is None:
        return NotImplemented
    return ref(*args, **kwargs)


def sparse_operands(args, kwargs) -> list:
    """The SparseTensor operands among ``args`` and ``kwargs`` (top level and in lists)."""
    out = []
    for a in list(args) + list(kwargs.values()):
        for t in a if isinstance(a, (list, tuple)) else (a,):
            if isinstance(t, SparseTensor):
                out.append(t)
    return out


def stored_and_fill(A: SparseTensor) -> list[torch.Tensor]:
    """``A``'s stored values (duplicates summed) and, unless indefinite, its fill: every value
    ``A`` takes (a check on them is a check on ``A.to_dense()``, with no dense temporary)."""
    vals = coalesced_parts(A)[1]
    unspecified = A.numel() > vals.numel()
    return [vals, A._fill] if unspecified and not A._indefinite else [vals]
