"""Sparse optimizers on (param, state, indices, gradient rows): Caffe2 ``SparseAdagrad``,
``RowWiseSparseAdagrad`` and ``SparseFtrl``, in place, and ``torch.optim`` wrappers.

Row ``indices[i]`` of ``param`` receives gradient row ``grad[i]``.  Two ways to treat a row that
appears several times:

* ``mode="sequential"`` (Caffe2): the updates are applied one after the other, in order, each seeing
  the state left by the previous one;
* ``mode="coalesced"``: the gradient rows of a row are summed first, then one update is applied
  (what ``torch.optim.Adagrad`` does with a sparse gradient; equal to dense Adagrad on the touched
  rows).

Sequential updates run in rounds -- round ``r`` applies the ``r``-th occurrence of every row at once
-- so the work is ``max multiplicity`` vectorized passes, never a Python loop over elements.
Coalesced updates find the distinct rows with no sort where ``param`` has few rows next to the
gradient (a table of one flag per row; ``torch.unique`` otherwise), sum their gradient rows with one
``index_add_``, and update them in place (``addcmul_``, ``sqrt_``, ``index_add_``: the operations of
``torch.optim.Adagrad``'s sparse step).  On CPU float tensors, with the compiled segment backend
(numba, ``segment.set_backend``), Adagrad runs as one fused kernel instead: one pass over the
gradient rows summing them per row, one over the touched rows updating them (3-8x faster than
torch's sparse Adagrad on embedding-table gradients). ``lr`` is positive and the step descends
(Caffe2 passes a negative rate instead).  Every argument is checked before anything is written: a
failed call modifies nothing.

Under torch.compile each function is one custom op that updates ``param`` and its states in place
(``sparsefill::sparse_adagrad_``, ``rowwise_sparse_adagrad_``, ``sparse_ftrl_``: ``mutates_args``;
the checks and kernels above at run time), so an optimizer's ``step`` compiles with
``fullgraph=True`` on dense gradients.  torch's sparse gradients cannot enter a compiled graph
(dynamo does not wrap sparse tensors): a compiled ``step`` on them breaks the graph (without
``fullgraph``) and runs eagerly.

Adagrad (per element; rowwise: ``h`` per row and ``mean_j g_j^2`` added)::

    g = grad + weight_decay * w;   h = decay * h + g^2;   w = w - lr * (g / (sqrt(h) + eps))

FTRL-proximal (per element)::

    n' = n + g^2;   z = z + g - (sqrt(n') - sqrt(n)) / alpha * w;   n = n'
    w = (sign(z) lambda1 - z) / ((beta + sqrt(n)) / alpha + lambda2)  if |z| > lambda1  else 0
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any, overload
import threading
import weakref

import numpy as np
import torch
from torch.optim.optimizer import ParamsT

from sparsefill._kernels import segment as _kernels
from sparsefill._kernels.trace import traced
from sparsefill._compile.dynamo import when_dynamo_loads
from sparsefill._kernels.segment_check import IndexLike, as_index, check_indices

__all__ = ["sparse_adagrad", "rowwise_sparse_adagrad", "sparse_ftrl", "SparseAdagrad", "SparseFtrl"]

_FLOATS = (torch.float32, torch.float64)


def _check(param, indices, grad, states, state_names, rowwise=False):
    if not isinstance(param, torch.Tensor) or param.dim() == 0:
        raise ValueError("param must be a tensor with at least one dimension (rows)")
    idx = as_index(indices, "indices", param.device).long()
    want = (idx.numel(), *param.shape[1:])
    if tuple(grad.shape) != want:
        raise ValueError(
            f"grad must have shape {want} (one row per index), got {tuple(grad.shape)}"
        )
    if grad.dtype != param.dtype:
        raise TypeError(f"grad must have the dtype of param ({param.dtype}), got {grad.dtype}")
    for st, name in zip(states, state_names):
        shape = (param.shape[0],) if rowwise else tuple(param.shape)
        if tuple(st.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(st.shape)}")
        if st.dtype != param.dtype:
            raise TypeError(f"{name} must have the dtype of param ({param.dtype}), got {st.dtype}")
    check_indices(idx, param.shape[0], what="rows of param")
    return idx


def _ops():
    # (registers the ops: imported by the first traced call)
    from sparsefill.segment import _optim_ops

    return _optim_ops


def _index(indices, param):
    """``indices`` as an int64 tensor (a list too) for the custom ops, which check its values at run
    time."""
    return as_index(indices, "indices", param.device).long()


_MARK_ROWS = (
    16  # rows of param per gradient row up to which coalescing marks rows in a table (no sort)
)


def _marks_fit(R: int, n: int) -> bool:
    """Whether a table of one entry per row of param (``R``) is cheap next to ``n`` gradient
    rows."""
    return R <= _MARK_ROWS * n + (1 << 16)


def _coalesce(idx, grad, R):
    """``(rows, g)``: the distinct rows of ``idx`` and the sum of the gradient rows of each, ``g[i]
    = sum_{p: idx[p] == rows[i]} grad[p]``.  By the compiled kernel where it applies (rows in order
    of first appearance), else by marking the rows in a table of ``R`` flags when that is small next
    to ``idx`` (no sort), else by ``torch.unique`` (rows ascending)."""
    n, D = idx.numel(), math.prod(grad.shape[1:])
    if _compilable(idx, grad) and _kernels.compiled_for(grad.device, n * D):
        rows, acc = torch.empty(n, dtype=torch.int64), torch.empty(n, D, dtype=grad.dtype)
        with _marks(R) as mark:
            g = grad.detach().reshape(n, D).contiguous().numpy()
            u = _kernels._nb().coalesce_rows(
                idx.contiguous().numpy(), g, mark, rows.numpy(), acc.numpy()
            )
        return rows[:u], acc[:u].view(u, *grad.shape[1:])
    if _marks_fit(R, n):
        mark = torch.zeros(R, dtype=torch.bool, device=idx.device).index_fill_(0, idx, True)
        rows = mark.nonzero().squeeze(1)
        slot = torch.empty(R, dtype=torch.int64, device=idx.device)
        slot[rows] = torch.arange(rows.numel(), device=idx.device)
        inv = slot.index_select(0, idx)
    else:
        rows, inv = torch.unique(idx, return_inverse=True)
    return rows, grad.new_zeros((rows.numel(), *grad.shape[1:])).index_add_(0, inv, grad)


def _compilable(idx, param, *states) -> bool:
    """Whether the compiled row kernels can take these tensors: CPU, float32/float64, some gradient
    rows, ``param`` and ``states`` contiguous (they are written in place through numpy views)."""
    n, D = idx.numel(), math.prod(param.shape[1:])
    return (
        0 < n < 2**31
        and D > 0
        and param.device.type == "cpu"
        and param.dtype in _FLOATS
        and all(t.is_contiguous() for t in states)
    )


def _rounds(idx):
    """Positions grouped by occurrence rank: a list of position tensors, each holding distinct rows,
    in order."""
    n = idx.numel()
    if n == 0:
        return []
    srt, order = torch.sort(idx, stable=True)
    start = torch.ones(n, dtype=torch.bool, device=idx.device)
    start[1:] = srt[1:] != srt[:-1]
    pos = torch.arange(n, device=idx.device)
    first = torch.cummax(torch.where(start, pos, torch.zeros_like(pos)), 0).values
    rank = torch.empty_like(pos)
    rank[order] = pos - first
    if int(rank.max()) == 0:
        return [None]  # all rows distinct: one round over every position
    by_rank = torch.sort(rank, stable=True).indices
    counts = torch.bincount(rank).tolist()
    return list(torch.split(by_rank, counts))


def _check_mode(mode):
    if mode not in ("sequential", "coalesced"):
        raise ValueError(f"mode must be 'sequential' or 'coalesced', got {mode!r}")


def _apply(idx, grad, mode, update, R):
    """Run ``update(rows, g)`` (distinct rows) once (coalesced) or round by round (sequential)."""
    _check_mode(mode)
    if mode == "coalesced":
        update(*_coalesce(idx, grad, R))
    else:
        for sel in _rounds(idx):
            if sel is None:
                update(idx, grad)
            else:
                update(idx.index_select(0, sel), grad.index_select(0, sel))


_MARKS = {"buf": np.empty(0, dtype=np.int32)}
_MARKS_LOCK = threading.Lock()


@contextlib.contextmanager
def _marks(R: int):
    """A table of ``R`` int32 marks, all -1, for the compiled kernels (which restore every mark they
    set): one buffer kept for the process (grown to the largest table seen: 4 bytes a row) so that a
    step costs no pass over the table's rows; a fresh one while another step holds it.  An exception
    inside drops the kept buffer (its marks may not have been restored)."""
    if not _MARKS_LOCK.acquire(blocking=False):
        yield np.full(R, -1, dtype=np.int32)
        return
    try:
        if _MARKS["buf"].shape[0] < R:
            _MARKS["buf"] = np.full(R, -1, dtype=np.int32)
        yield _MARKS["buf"]
    except BaseException:
        _MARKS["buf"] = np.empty(0, dtype=np.int32)
        raise
    finally:
        _MARKS_LOCK.release()


def _compiled(kernel: str, param, states, idx, grad, mode, *scalars) -> bool:
    """Run the fused compiled kernel ``kernel`` of ``_numba_kernels`` (coalescing and update in one
    pass over the gradient rows and one over the touched rows, no sort) when it applies:
    ``mode="coalesced"``, CPU float32/float64 contiguous tensors and the segment backend's choice
    (``_kernels.compiled_for``). Returns whether it ran.  The touched rows are split ``r % T``
    between ``T`` threads."""
    n, R = idx.numel(), param.shape[0]
    D = math.prod(param.shape[1:])
    if not (
        mode == "coalesced"
        and _compilable(idx, param, param, *states)
        and _kernels.compiled_for(param.device, n * D)
    ):
        return False
    fn = getattr(_kernels._nb(), kernel)
    rowwise = kernel.startswith("rowwise")  # (its one state stays 1-D: one accumulator a row)
    arr = [t.detach().view(R, D).numpy() for t in (param, *([] if rowwise else states))]
    arr += [t.detach().numpy() for t in states] if rowwise else []
    g = grad.detach().reshape(n, D).contiguous().numpy()
    dt = arr[0].dtype.type
    T = _kernels._threads(n * D)
    with _marks(R) as mark:
        jobs = [
            (
                *arr,
                idx.contiguous().numpy(),
                g,
                mark,
                np.empty(n, dtype=np.int64),
                np.empty((n, D), dtype=g.dtype),
                *(dt(v) for v in scalars),
                t,
                T,
            )
            for t in range(T)
        ]
        futures = [_kernels._pool(T - 1).submit(fn, *job) for job in jobs[1:]]
        fn(*jobs[0])
        for f in futures:
            f.result()
    return True


@torch.no_grad()
def sparse_adagrad(
    param: torch.Tensor,
    moment: torch.Tensor,
    indices: IndexLike,
    grad: torch.Tensor,
    *,
    lr: float,
    eps: float = 1e-5,
    weight_decay: float = 0.0,
    decay: float = 1.0,
    mode: str = "sequential",
) -> None:
    """In place Adagrad on the rows ``indices`` of ``param`` (``moment`` shaped like ``param``); see
    the module."""
    if traced(param):  # torch.compile: the custom op (the checks and the kernels at run time)
        return _ops().sparse_adagrad_(
            param, moment, _index(indices, param), grad, lr, eps, weight_decay, decay, mode
        )
    idx = _check(param, indices, grad, [moment], ["moment"])
    if _compiled(
        "adagrad_coalesced", param, [moment], idx, grad, mode, lr, eps, weight_decay, decay
    ):
        return

    def update(rows, g):  # (torch.optim.Adagrad's sparse step, operation for operation)
        if weight_decay:
            g = g + weight_decay * param.index_select(0, rows)
        h = moment.index_select(0, rows)
        if decay != 1:
            h.mul_(decay)
        h.addcmul_(g, g)
        moment.index_copy_(0, rows, h)
        param.index_add_(0, rows, g / h.sqrt_().add_(eps), alpha=-lr)

    _apply(idx, grad, mode, update, param.shape[0])


@torch.no_grad()
def rowwise_sparse_adagrad(
    param: torch.Tensor,
    moment: torch.Tensor,
    indices: IndexLike,
    grad: torch.Tensor,
    *,
    lr: float,
    eps: float = 1e-5,
    weight_decay: float = 0.0,
    mode: str = "sequential",
) -> None:
    """In place row-wise Adagrad (Caffe2 ``RowWiseSparseAdagrad``): one accumulator per row
    (``moment`` of shape ``(rows,)``) that adds the mean of ``g^2`` over the row."""
    if traced(param):
        return _ops().rowwise_sparse_adagrad_(
            param, moment, _index(indices, param), grad, lr, eps, weight_decay, mode
        )
    idx = _check(param, indices, grad, [moment], ["moment"], rowwise=True)
    if _compiled(
        "rowwise_adagrad_coalesced", param, [moment], idx, grad, mode, lr, eps, weight_decay
    ):
        return

    def update(rows, g):
        if weight_decay:
            g = g + weight_decay * param.index_select(0, rows)
        g2 = g.flatten(1) if g.dim() > 1 else g[:, None]
        h = moment.index_select(0, rows) + (g2 * g2).mean(1)
        moment.index_copy_(0, rows, h)
        step = (lr / (h.sqrt() + eps)).view(-1, *([1] * (g.dim() - 1)))
        param.index_add_(0, rows, step * g, alpha=-1)

    _apply(idx, grad, mode, update, param.shape[0])


@torch.no_grad()
def sparse_ftrl(
    param: torch.Tensor,
    n: torch.Tensor,
    z: torch.Tensor,
    indices: IndexLike,
    grad: torch.Tensor,
    *,
    alpha: float = 0.005,
    beta: float = 1.0,
    lambda1: float = 0.001,
    lambda2: float = 0.001,
    mode: str = "sequential",
) -> None:
    """In place FTRL-proximal (Caffe2 ``SparseFtrl``) with per-element states ``n`` and ``z``; see
    the module. The defaults are Caffe2's (``FtrlParams``)."""
    if traced(param):
        return _ops().sparse_ftrl_(
            param, n, z, _index(indices, param), grad, alpha, beta, lambda1, lambda2, mode
        )
    idx = _check(param, indices, grad, [n, z], ["n", "z"])
    if alpha <= 0:
        raise ValueError(f"alpha must be positive, got {alpha}")

    def update(rows, g):
        w = param.index_select(0, rows)
        n_old = n.index_select(0, rows)
        n_new = n_old + g * g
        z_new = z.index_select(0, rows) + g - (n_new.sqrt() - n_old.sqrt()) / alpha * w
        w_new = torch.where(
            z_new.abs() > lambda1,
            (torch.sign(z_new) * lambda1 - z_new) / ((beta + n_new.sqrt()) / alpha + lambda2),
            torch.zeros((), dtype=w.dtype, device=w.device),
        )
        n.index_copy_(0, rows, n_new)
        z.index_copy_(0, rows, z_new)
        param.index_copy_(0, rows, w_new)

    _apply(idx, grad, mode, update, param.shape[0])


def _rows_and_grad(p):
    g = p.grad
    if g.is_sparse:
        if g.sparse_dim() != 1:
            raise ValueError(
                f"a sparse gradient must have one sparse dim (rows), got {g.sparse_dim()}"
            )
        return g._indices()[0], g._values()
    return torch.arange(p.shape[0], device=p.device), g


_NATIVE_SPARSE = (
    "sparsefill: a row optimizer's step (SparseAdagrad, SparseFtrl) on torch native sparse "
    "gradients (embedding(sparse=True), sparse_grad=True) does not compile: torch.compile "
    "cannot trace torch's sparse tensors (pytorch/pytorch#130687), so the step runs eagerly (a "
    "graph break; with fullgraph=True this error). Dense gradients compile."
)


def _note_grad_layouts(opt_ref):
    """A post-accumulate-grad hook noting in the optimizer whether ``p.grad`` is a torch native
    sparse tensor: a compiled ``step`` reads that Python flag (``p.grad`` itself dynamo cannot even
    wrap)."""

    def hook(p):
        opt = opt_ref()
        if opt is not None:
            opt._native_grads[id(p)] = p.grad is not None and p.grad.layout is not torch.strided

    return hook


def _eager_step(opt, closure):
    return opt._step(closure)


def _disable_eager_step():  # (when torch._dynamo loads: torch.compiler.disable imports it)
    global _eager_step
    _eager_step = torch.compiler.disable(_eager_step, reason=_NATIVE_SPARSE)


when_dynamo_loads(_disable_eager_step)


class _RowOptimizer(torch.optim.Optimizer):
    """The step loop shared by the row-sparse optimizers: ``_update(p, state, rows, grad_rows,
    group)`` for every parameter with a gradient (sparse or dense).

    Under torch.compile a step on torch native sparse gradients is a graph break and runs eagerly
    (with ``fullgraph=True``: an error naming sparsefill), known from a flag its parameters'
    post-accumulate-grad hooks set (a gradient assigned to ``p.grad`` by hand sets none: dynamo's
    own graph break or error then)."""

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        if "_native_grads" not in self.__dict__:
            # id(param) -> its last accumulated gradient is a torch native sparse tensor
            self._native_grads: dict[int, bool] = {}
        hook = _note_grad_layouts(weakref.ref(self))
        for p in self.param_groups[-1]["params"]:
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(hook)

    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        if torch.compiler.is_compiling() and any(self._native_grads.values()):
            return _eager_step(self, closure)
        return self._step(closure)

    @torch.no_grad()
    def _step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, self.state[p], *_rows_and_grad(p), group)
        return loss


class SparseAdagrad(_RowOptimizer):
    """``torch.optim``-style Adagrad for embedding tables with sparse (or dense) gradients.

    Sparse gradients (``segment.reduce(..., indices=..., sparse_grad=True)``,
    ``embedding(sparse=True)``) update only their rows.  ``mode="coalesced"`` (default) equals
    ``torch.optim.Adagrad`` on the touched rows; ``"sequential"`` applies duplicate rows one after
    the other (Caffe2).  ``rowwise=True``: one accumulator per row.
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-2,
        eps: float = 1e-10,
        weight_decay: float = 0.0,
        rowwise: bool = False,
        mode: str = "coalesced",
    ):
        if lr <= 0 or eps < 0 or weight_decay < 0:
            raise ValueError(
                f"invalid hyperparameters: lr={lr}, eps={eps}, weight_decay={weight_decay}"
            )
        _check_mode(mode)
        super().__init__(
            params, dict(lr=lr, eps=eps, weight_decay=weight_decay, rowwise=rowwise, mode=mode)
        )

    def _update(self, p, st, rows, g, group):
        if "moment" not in st:
            st["moment"] = p.new_zeros(p.shape[0] if group["rowwise"] else p.shape)
        fn = rowwise_sparse_adagrad if group["rowwise"] else sparse_adagrad
        fn(
            p,
            st["moment"],
            rows,
            g,
            lr=group["lr"],
            eps=group["eps"],
            weight_decay=group["weight_decay"],
            mode=group["mode"],
        )


class SparseFtrl(_RowOptimizer):
    """``torch.optim``-style FTRL-proximal for tables with sparse (or dense) gradients (see
    ``sparse_ftrl``)."""

    def __init__(
        self,
        params: ParamsT,
        alpha: float = 0.005,
        beta: float = 1.0,
        lambda1: float = 0.001,
        lambda2: float = 0.001,
        mode: str = "coalesced",
    ):
        _check_mode(mode)
        if alpha <= 0 or beta < 0 or lambda1 < 0 or lambda2 < 0:
            raise ValueError(
                f"invalid hyperparameters: alpha={alpha}, beta={beta}, lambda1={lambda1}, "
                f"lambda2={lambda2}"
            )
        super().__init__(
            params, dict(alpha=alpha, beta=beta, lambda1=lambda1, lambda2=lambda2, mode=mode)
        )

    def _update(self, p, st, rows, g, group):
        if "n" not in st:
            st["n"], st["z"] = torch.zeros_like(p), torch.zeros_like(p)
        sparse_ftrl(
            p,
            st["n"],
            st["z"],
            rows,
            g,
            alpha=group["alpha"],
            beta=group["beta"],
            lambda1=group["lambda1"],
            lambda2=group["lambda2"],
            mode=group["mode"],
        )
