"""The products of a sparse pattern with dense rows as ``torch.library`` custom ops (namespace
``sparsefill::``): what torch.compile records for a SparseTensor's sparse-dense products on the CPU
when the compiled kernels (numba) are loaded.

For a pattern of ``n`` stored elements at ``(rows[e], cols[e])`` with values ``w``::

    pattern_spmm(w, x, rows, cols, m)[r] = sum(w[e] * x[cols[e]] for e with rows[e] == r)  (m, D)
    pattern_sddmm(u, v, rows, cols)[e]   = u[rows[e]] . v[cols[e]]                         (n,)

that is ``csr(rows, cols, w) @ x`` and ``(u @ v.T)`` read at the pattern, and each is the other's
gradient (the transposed product is the same op with ``rows`` and ``cols`` swapped)::

    d spmm / d w = sddmm(G, x, rows, cols)      d spmm / d x = spmm(w, G, cols, rows, k)
    d sddmm / d u = spmm(g, v, rows, cols, m)   d sddmm / d v = spmm(g, u, cols, rows, k)

Why custom ops: traced, torch's sparse kernels do not trace, and the products become a gather, a
product and an ``index_add`` (inductor's loops, one ``(n, D)`` row read at random per element:
the cache misses are the time).  The compiled kernels (``_kernels.segment``: ``gather_scatter_sum``,
``sampled_dot``) prefetch the rows they read and write at random, form no ``(n, D)`` temporary and
need no sort of the pattern (the transposed product scatters in the pattern's order): at 1.1M
stored elements and 32 columns each ran 1.5-1.8x faster than inductor's loops (one thread).  Their
sums are in the values' dtype, in the pattern's order (as ``index_add``).

:func:`usable` says where they run (CPU, float32/float64, the compiled kernels chosen by the
segment backend); elsewhere the callers keep the traceable gather forms.  Every index is checked
when the op runs (an IndexError).

>>> import torch
>>> w, x = torch.tensor([1., 2., 3.]), torch.tensor([[1., 0.], [0., 1.], [1., 1.]])
>>> rows, cols = torch.tensor([0, 0, 1]), torch.tensor([1, 2, 0])
>>> torch.ops.sparsefill.pattern_spmm(w, x, rows, cols, 2).tolist()
[[2.0, 3.0], [3.0, 0.0]]
>>> torch.ops.sparsefill.pattern_sddmm(x, x, rows, cols).tolist()
[0.0, 1.0, 0.0]
"""

from __future__ import annotations

import torch
from torch.library import custom_op

from sparsefill._kernels import segment as _kernels

__all__ = ["usable", "pattern_spmm", "pattern_sddmm"]

_FLOATS = (torch.float32, torch.float64)


def usable(a: torch.Tensor, b: torch.Tensor, elements: int) -> bool:
    """Whether the products of ``a`` and ``b`` (values or dense rows, one dtype) run as these ops:
    CPU, float32/float64, and the segment backend runs the compiled kernels for ``elements`` (stored
    elements x columns) of work.  A symbolic count (a dynamic stored count) is not read (a guard on
    it would be a recompile per size): taken as enough work to load the kernels, which a compile's
    seconds pay for."""
    if not isinstance(elements, int):
        elements = _kernels.COMPILED_AFTER_WORK
    return (
        a.dtype in _FLOATS
        and b.dtype == a.dtype
        and a.device.type == "cpu"
        and b.device.type == "cpu"
        and _kernels.compiled_for(a.device, elements)
    )


def _check_rows(x: torch.Tensor, name: str) -> None:
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D (rows, columns), got shape {tuple(x.shape)}")


@custom_op("sparsefill::pattern_spmm", mutates_args=())
def pattern_spmm(
    w: torch.Tensor, x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, m: int
) -> torch.Tensor:
    """``out[r] = sum(w[e] * x[cols[e]] for e with rows[e] == r)``, ``(m, x.shape[1])``."""
    _check_rows(x, "x")
    return _kernels.gather_scatter_sum(x, cols, rows, w, m)


@pattern_spmm.register_fake
def _(w, x, rows, cols, m):
    _check_rows(x, "x")
    return x.new_empty(m, x.shape[1])


@custom_op("sparsefill::pattern_sddmm", mutates_args=())
def pattern_sddmm(
    u: torch.Tensor, v: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor
) -> torch.Tensor:
    """``out[e] = u[rows[e]] . v[cols[e]]``, ``(n,)``."""
    _check_rows(u, "u")
    _check_rows(v, "v")
    return _kernels.sampled_dot(u, v, rows, cols)


@pattern_sddmm.register_fake
def _(u, v, rows, cols):
    _check_rows(u, "u")
    _check_rows(v, "v")
    return u.new_empty(rows.shape[0])


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:4])
    ctx.m = inputs[4] if len(inputs) > 4 else None


def _spmm_grad(ctx, G):
    w, x, rows, cols = ctx.saved_tensors
    gw = pattern_sddmm(G, x, rows, cols) if ctx.needs_input_grad[0] else None
    gx = pattern_spmm(w, G, cols, rows, x.shape[0]) if ctx.needs_input_grad[1] else None
    return gw, gx, None, None, None


def _sddmm_grad(ctx, g):
    u, v, rows, cols = ctx.saved_tensors
    gu = pattern_spmm(g, v, rows, cols, u.shape[0]) if ctx.needs_input_grad[0] else None
    gv = pattern_spmm(g, u, cols, rows, v.shape[0]) if ctx.needs_input_grad[1] else None
    return gu, gv, None, None


pattern_spmm.register_autograd(_spmm_grad, setup_context=_setup)
pattern_sddmm.register_autograd(_sddmm_grad, setup_context=_setup)
