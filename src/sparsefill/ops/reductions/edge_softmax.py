"""The edge softmax: softmax, log_softmax and softmin of a masked tensor along a sparse dim.

Shared by ``sparsefill.masked`` (``masked.softmax(A, d)`` with ``mask=None``) and the
``torch.softmax`` handlers of ``ops/reductions/softmax.py``, for a SparseTensor with indefinite fill
(its pattern is the mask): the result keeps the input's pattern and index tensors, so the work is a
few segment kernels over its values.  For every slice ``s`` along ``dim`` (the stored elements
sharing the other sparse coordinates)
and every dense position, ``m_s`` the slice max::

    softmax:      y = exp(x - m_s) / sum_s exp(x - m_s)          grad_x = y * (g - sum_s(g * y))
    log_softmax:  y = x - m_s - log(sum_s exp(x - m_s))          grad_x = g - exp(y) * sum_s(g)
    softmin:      y = softmax(-x)                                grad_x = -(y * (g - sum_s(g * y)))

the values and gradients of ``torch.masked.<op>`` on the dense equivalent at the stored elements, as
torch computes them (a slice holding +inf or NaN is NaN, one of -inf only too: ``-inf - m_s``).  The
grouping of a pattern into slices (:class:`Plan`) is computed once per pattern and dim
(``sparsefill._kernels.grouping.pattern_cached``: an adjacency reused every training step pays it
once; compiled, where no cache is read and the plan is traced into every step, a slice per key,
empty ones included, when there are few keys per element: no ranking of the non-empty slices);
:func:`segment_softmax` runs the forward and the closed-form backward above in one
``autograd.Function``, with no graph inside.

>>> import torch, sparsefill
>>> v = torch.tensor([-3., -1., 1.], requires_grad=True)
>>> A = sparsefill.sparse_coo_tensor(
...     [[0, 0, 1], [0, 2, 1]], v, (2, 3), fill_value=sparsefill.indefinite
... )
>>> P = sparsefill.masked.softmax(A, 1)
>>> P._values()
tensor([0.1192, 0.8808, 1.0000], grad_fn=<ValuesBackward>)
>>> P._values()[0].backward(); v.grad          # y0 (1 - y0), -y0 y1, 0
tensor([ 0.1050, -0.1050,  0.0000])
"""

from __future__ import annotations

import dataclasses

import torch

from sparsefill._tensor import parts as _convert
from sparsefill._kernels import index as _index, reducer as _reduce
from sparsefill._autograd.functions import (
    _pattern,
    grad_parts,
    refuse_vmap,
    sparse_inside,
    unwrapped,
)
from sparsefill._kernels.grouping import csr_row_slices, pattern_cached, sorted_runs
from sparsefill._kernels.trace import traced
from sparsefill._tensor.tensor import SparseTensor

__all__ = ["applies", "segment_softmax", "softmax_values", "softmax_grad_values", "Plan", "plan_of"]

_FLOATS = (torch.float32, torch.float64)
_DIRECT_KEYS = 4  # compiled: slices by key where there are at most ~this many keys per element


def applies(A, dim: int) -> bool:
    """The edge softmax serves ``A`` along ``dim`` (canonical): an indefinite, coalesced COO or
    plain CSR SparseTensor of float32/float64 with stored elements, and ``dim`` a sparse dim.  A
    symbolic stored count (torch.compile: a union's is unbacked) is not tested (a guard on data:
    dynamo's unnamed error with ``fullgraph=True``, a graph break without) but taken as nonzero: the
    edge softmax of none stored is the empty result the general path gives."""
    n = A._vals.numel() if isinstance(A, SparseTensor) else 0
    return (
        isinstance(A, SparseTensor)
        and A._indefinite
        and A._coalesced
        and A._vals.dtype in _FLOATS
        and (A._sf_layout is torch.sparse_coo or A._crow.dim() == 1)
        and dim < _sparse_ndim(A)
        and (isinstance(n, torch.SymInt) or n > 0)
    )


def _sparse_ndim(A: SparseTensor) -> int:
    """The sparse dims of a COO or plain CSR (read off the index tensors: no ``__torch_function__``
    call)."""
    return A._idx.shape[0] if A._sf_layout is torch.sparse_coo else 2


@dataclasses.dataclass(frozen=True)
class Plan:
    """The slices along one sparse dim of a pattern (the backend's grouping:
    ``_kernels.grouping.sorted_runs``, ``_kernels.grouping.csr_row_slices``): stored element
    ``perm[i]`` (``i`` when ``perm`` is None) is the ``i``-th in slice order, in slice ``seg[i]``;
    slice ``s`` holds ``lengths[s]`` elements (contiguous runs in that order); ``inv`` undoes
    ``perm``."""

    seg: torch.Tensor
    lengths: torch.Tensor
    perm: torch.Tensor | None
    inv: torch.Tensor | None

    @property
    def nseg(self) -> int:
        return self.lengths.numel()


def _plan(keys: torch.Tensor, nkeys: int, presorted: bool) -> Plan:
    """The plan for slice keys ``keys`` (one per stored element, in ``[0, nkeys)``): sorted (stably)
    unless ``presorted``, then grouped into runs."""
    perm = inv = None
    if not presorted:
        keys, perm = torch.sort(keys, stable=True)
        inv = torch.empty_like(perm).index_put_(
            (perm,), torch.arange(perm.numel(), device=perm.device)
        )
    if traced(keys) and 0 < nkeys <= _DIRECT_KEYS * _hint(keys.numel(), nkeys) + 4096:
        # compiled (recomputed every step): every key a slice, the empty ones too, so that the
        # slice of an element is its key; no ranking of the non-empty slices (a nonzero, a scatter
        # and a cumsum over the elements), and no data-dependent count of them
        lengths = torch.diff(torch._convert_indices_from_coo_to_csr(keys.contiguous(), nkeys))
        return Plan(keys, lengths, perm, inv)
    _, seg, lengths = sorted_runs(keys, nkeys)
    return Plan(seg, lengths, perm, inv)


def _hint(n, fallback: int) -> int:
    """``n``, a dynamic size read as its hint with no guard (the choice of a plan: both are exact,
    and a guard would recompile per size), ``fallback`` where it has none (data-dependent)."""
    if isinstance(n, int):
        return n
    from torch.fx.experimental.symbolic_shapes import optimization_hint

    return optimization_hint(n, fallback=fallback)


def plan_of(A: SparseTensor, dim: int) -> Plan:
    """The cached :class:`Plan` of ``A``'s pattern along sparse ``dim`` (kept while its index
    tensors live)."""
    S = tuple(A.shape[: _sparse_ndim(A)])
    if A._sf_layout is torch.sparse_csr:
        if dim == 1:  # the rows are the slices

            def compute():
                _, _, lengths = csr_row_slices(torch.diff(A._crow), S[1], all_rows=True)
                return Plan(_index.runs_to_ids(lengths, A._col.numel()), lengths, None, None)

            return pattern_cached(("segsoftmax_plan", S, dim), (A._crow,), compute)
        tensors = (A._crow, A._col)
    else:
        tensors = (A._idx,)

    def compute():
        idx = _convert.coalesced_parts(A)[0]
        keep = [d for d in range(len(S)) if d != dim]
        keys = _index.linearize(_index.rows_at(idx, keep), [S[d] for d in keep])
        return _plan(keys, _index.numel([S[d] for d in keep]), presorted=dim == len(S) - 1)

    return pattern_cached(("segsoftmax_plan", S, dim), tensors, compute)


def _segsum(t: torch.Tensor, plan: Plan) -> torch.Tensor:
    """Per-slice sums (the protocol's combine: ``scatter_add_`` for 1-D values, as
    ``_kernels.engine.choose`` picks)."""
    return _reduce.segment_combine(t, plan.seg, plan.nseg, "sum")


def _forward(x: torch.Tensor, plan: Plan, log: bool) -> torch.Tensor:
    # (runs: segment_reduce)
    m = _reduce.segment_combine(x, plan.seg, plan.nseg, "amax", lengths=plan.lengths)
    # (no lengths: scatter_add_ for 1-D)
    shifted, e, s = _reduce.shifted_exp_sums(x, plan.seg, plan.nseg, m)
    if log:
        return shifted.sub_(torch.log(s).index_select(0, plan.seg))
    return e.div_(s.index_select(0, plan.seg))


def _backward(g: torch.Tensor, y: torch.Tensor, plan: Plan, log: bool) -> torch.Tensor:
    if log:
        return g - torch.exp(y).mul_(_segsum(g, plan).index_select(0, plan.seg))
    return (g - _segsum(g * y, plan).index_select(0, plan.seg)).mul_(y)


def _sorted(t: torch.Tensor, plan: Plan) -> torch.Tensor:
    return t if plan.perm is None else t.index_select(0, plan.perm)


def _unsorted(t: torch.Tensor, plan: Plan) -> torch.Tensor:
    return t if plan.inv is None else t.index_select(0, plan.inv)


def softmax_values(A: SparseTensor, dim: int, log: bool, sign: float = 1.0) -> torch.Tensor:
    """The values of the (log_)softmax of ``A`` along sparse ``dim`` (``sign`` -1: softmin), where
    :func:`applies`, in ``A``'s storage order (no autograd)."""
    plan = plan_of(A, dim)
    x = _sorted(A._vals, plan)
    return _unsorted(_forward(-x if sign < 0 else x, plan, log), plan)


def softmax_grad_values(
    g: torch.Tensor, y: torch.Tensor, A: SparseTensor, dim: int, log: bool, sign: float = 1.0
) -> torch.Tensor:
    """The gradient of the values of ``A`` for the output values ``y`` of :func:`softmax_values` and
    their upstream gradient ``g`` (both in ``A``'s storage order)."""
    plan = plan_of(A, dim)
    gx = _backward(_sorted(g.to(y.dtype), plan), _sorted(y, plan), plan, log)
    return _unsorted(gx.neg_() if sign < 0 else gx, plan)


class _SegmentSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(A, dim, sign, log):
        return _convert.rewrap(A, values=softmax_values(A, dim, log, sign), known_zero=False)

    @staticmethod
    def setup_context(ctx, inputs, output):
        A, ctx.dim, ctx.sign, ctx.log = inputs
        ctx.pattern = _pattern(A)  # (its pattern; the output's values hold what the backward needs)
        ctx.save_for_backward(unwrapped(output)._vals)

    vmap = staticmethod(lambda info, in_dims, *args: refuse_vmap("a SparseTensor softmax"))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, G):
        (y,), P, G = ctx.saved_tensors, ctx.pattern, sparse_inside(G)
        gv, _ = grad_parts(G, P)  # the values of G on the output's (= the input's) pattern
        gx = softmax_grad_values(gv, y, P, ctx.dim, ctx.log, ctx.sign)
        return (
            _convert.rewrap(P, values=gx, fill=gx.new_zeros(()), indefinite=False, known_zero=True),
            None,
            None,
            None,
        )


def segment_softmax(A: SparseTensor, dim: int, sign: float, log: bool) -> SparseTensor:
    """``masked.softmax`` (``sign`` 1), ``masked.softmin`` (-1) or ``masked.log_softmax`` (``log``)
    of ``A`` along sparse ``dim`` (canonical), where :func:`applies`, with autograd: ``A``'s pattern
    and index tensors, indefinite fill; the gradient of ``A`` is a SparseTensor on its pattern and
    index tensors, fill 0."""
    if torch.is_grad_enabled() and A.requires_grad:
        return _SegmentSoftmax.apply(A, dim, sign, log)
    return _convert.rewrap(A, values=softmax_values(A, dim, log, sign), known_zero=False)
