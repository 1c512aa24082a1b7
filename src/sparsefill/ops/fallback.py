"""The densify fallback: any op computed on the dense equivalents of its SparseTensor operands.

    densify_call(op, A, ...) == op(A.to_dense(), ...)

Subject to the densify policy (``sparsefill.densify_policy``).  SparseTensor arguments that the op
writes to (in-place and ``out=`` variants) are written back, re-specified against their own fill:
``A.mul_(2)`` leaves ``A`` a SparseTensor, specified wherever the result differs from ``A``'s fill
(everywhere, unless ``2 * fill == fill``). An element-wise op whose operands do not broadcast raises
torch's own error first (not the policy's).
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_map_only, tree_unflatten

from sparsefill._tensor.parts import dense_of, dense_to_sparse
from sparsefill._tensor.policy import check_densify
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops._schema import broadcast_error, written_args
from sparsefill.ops._writes import respecify_

# tagged pointwise, but compares the shapes (False where they differ)
_EQUAL = torch.ops.aten.equal.default
_POINTWISE = torch.Tag.pointwise


def densify_call(func, args, kwargs):
    flat, spec = tree_flatten((args, kwargs))
    sparse = [a for a in flat if isinstance(a, SparseTensor)]
    # torch's error where the operands do not broadcast, first
    if _POINTWISE in func.tags and func is not _EQUAL:
        broadcast_error(args, kwargs)
    check_densify(str(func), sum(a.numel() * a.element_size() for a in sparse))
    # (dense_of would say "to_dense()": a call the user never made)
    if any(a._indefinite for a in sparse):
        raise ValueError(
            f"{func} has no sparse handler and is computed on the dense equivalent, but an operand "
            "has an indefinite fill (masked-out elements have no dense value): give it a fill "
            "(A.to_dense(fill_value=...)), or use sparsefill.masked's form of the op"
        )
    dense_for = {id(a): dense_of(a) for a in sparse}
    dargs, dkwargs = tree_unflatten(
        [dense_for.get(id(a), a) if isinstance(a, SparseTensor) else a for a in flat], spec
    )
    out = func(*dargs, **dkwargs)
    written = {id(dense_for[id(A)]): A for A in written_args(func, args, kwargs)}
    for A in written.values():
        respecify_(A, dense_for[id(A)])
    if written:
        return tree_map(lambda o: written.get(id(o), o), out)
    # a view stays a SparseTensor (see views.py)
    if func.is_view and isinstance(args[0], SparseTensor):
        return tree_map_only(torch.Tensor, lambda t: _resparsify(t, args[0]), out)
    return out


def _resparsify(t: torch.Tensor, base: SparseTensor) -> SparseTensor:
    """COO SparseTensor of ``t`` with a scalar fill taken from ``base``'s fill where dtypes
    agree."""
    f = (
        base._fill.reshape(-1)[:1].reshape(())
        if base._fill.numel() and base._fill.dtype == t.dtype
        else torch.zeros((), dtype=t.dtype, device=t.device)
    )
    return dense_to_sparse(t, f.clone(), False, False, torch.sparse_coo, 0)
