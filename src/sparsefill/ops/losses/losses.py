"""Element-wise losses between a SparseTensor and a dense or SparseTensor target, in closed form.

Each loss is an element-wise map ``l(x, y)`` followed by the reduction (``none``, ``sum``,
``mean``)::

    mse_loss           (x - y) ** 2
    smooth_l1_loss     |x - y| < beta  ?  0.5 (x - y) ** 2 / beta  :  |x - y| - 0.5 beta
    huber_loss         |x - y| < delta ?  0.5 (x - y) ** 2         :  delta (|x - y| - 0.5 delta)
    soft_margin_loss   log(1 + exp(-y x))
    binary_cross_entropy               -w (y log x + (1 - y) log(1 - x))     (logs clamped at -100)
    binary_cross_entropy_with_logits   -w (p y log sigmoid(x) + (1 - y) log(1 - sigmoid(x)))

For two SparseTensors ``l`` maps the union of their patterns and the fills (``l(fA, fB)``), and
``sum`` is ``sum over stored + n * l(fA, fB)``: O(nse).  A dense target makes the element-wise
loss dense by nature (each unspecified element meets its own target): it is computed once, and a
reduction of it is a dense reduction.  An indefinite fill is a mask: the reductions skip the
masked-out elements (``mean`` divides by the number of stored elements), as ``torch.masked`` does.
The gradients (``mse_loss_backward``, ...) are the element-wise derivative times the upstream
gradient, on the same pattern.

>>> import torch, sparsefill, torch.nn.functional as F
>>> A = sparsefill.sparse_coo_tensor([[0, 2]], [1., 3.], (4,), fill_value=0.)
>>> B = sparsefill.sparse_coo_tensor([[2, 3]], [1., 1.], (4,), fill_value=0.)
>>> F.smooth_l1_loss(A, B, reduction="sum")
tensor(2.5000)
"""

from __future__ import annotations

import torch

from sparsefill._tensor.parts import coalesced_parts, linear_parts, values_at
from sparsefill._kernels.index import linearize, lookup, unravel
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops.decomposed import decomposed, sparse_operands, stored_and_fill
from sparsefill.ops.registry import register

aten = torch.ops.aten


@register(
    aten.mse_loss.default,
    aten.smooth_l1_loss.default,
    aten.huber_loss.default,
    aten.soft_margin_loss.default,
    aten.binary_cross_entropy_with_logits.default,
)
def _elementwise_loss(func, args, kwargs):
    """The loss as the element-wise map and reduction of the module docstring, on the stored
    elements and the fills."""
    return decomposed(func, args, kwargs)


@register(
    aten.mse_loss_backward.default,
    aten.huber_loss_backward.default,
    aten.soft_margin_loss_backward.default,
)
def _elementwise_loss_backward(func, args, kwargs):
    """The gradient of an element-wise loss: its derivative times the upstream gradient, on the
    loss's pattern; ``mean`` divides by the number of elements the forward averaged (for an
    indefinite operand: the specified ones)."""
    return _per_mean(func, args, kwargs, decomposed)


def _per_mean(func, args, kwargs, grad_of):
    """``grad_of`` for reduction ``sum``, divided by the count of averaged elements for
    ``mean``."""
    bound = _bound(func, args, kwargs)
    names = [a.name for a in func._schema.arguments]
    r = names.index("reduction")
    if bound[r] != 1:  # none or sum
        return grad_of(func, bound, {})
    bound[r] = 2
    return grad_of(func, bound, {}) / averaged_count(bound[1], bound[2])


def averaged_count(x, y) -> int:
    """How many elements ``mean`` of an element-wise loss of ``x`` and ``y`` averages: all of them,
    or with an indefinite operand the specified ones (``mean`` is then the masked mean)."""
    if not any(isinstance(t, SparseTensor) and t._indefinite for t in (x, y)):
        return torch.broadcast_shapes(x.shape, y.shape).numel()
    return coalesced_parts(x - y)[1].numel()


@register(aten.binary_cross_entropy.default, aten.binary_cross_entropy_backward.default)
def _binary_cross_entropy(func, args, kwargs):
    """``binary_cross_entropy`` (and its gradient) in closed form; torch's check that every
    input is in ``[0, 1]`` runs on the stored values and the fill (NaN fails it, as in torch)."""
    if func is aten.binary_cross_entropy.default:
        x = args[0] if args else kwargs["self"]
        for A in sparse_operands((x,), {}):
            for v in stored_and_fill(A):
                if not bool(((v >= 0) & (v <= 1)).all()):
                    raise RuntimeError("all elements of input should be between 0 and 1")
        return decomposed(func, args, kwargs)
    return _per_mean(func, args, kwargs, decomposed)


@register(aten.smooth_l1_loss_backward.default)
def _smooth_l1_loss_backward(func, args, kwargs):
    """The gradient of ``smooth_l1_loss``, as torch's kernel branches (a NaN difference gives a NaN
    gradient, where ``sign`` would give 0)::

        x < -beta: -g        x > beta: g        else: g x / beta        (g: grad / count for mean)
    """
    return _per_mean(func, args, kwargs, _smooth_l1_grad)


def _smooth_l1_grad(func, args, kwargs):
    g, x, y, _, beta = args
    d = x - y
    return torch.where(d < -beta, -g, torch.where(d > beta, g, g * d / beta))


def _bound(func, args, kwargs) -> list:
    """The arguments of ``func``'s schema in order, keywords and defaults filled in."""
    names = [a.name for a in func._schema.arguments]
    defaults = {a.name: a.default_value for a in func._schema.arguments if a.has_default_value()}
    given = dict(zip(names, args), **kwargs)
    return [given[n] if n in given else defaults[n] for n in names]


# ---------------------------------------------------------------------- nll_loss over sparse logits
@register(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def _nll_loss_forward(func, args, kwargs):
    """``nll_loss`` of SparseTensor log-probabilities ``x`` (class dim 1, or 0 for one sample)::

        loss_p = -w[t_p] x[p, t_p]       (0 where t_p == ignore_index)
        sum: sum_p loss_p        mean: sum_p loss_p / sum_p w[t_p]        none: loss_p

    The picked elements are looked up among the stored ones (the fill elsewhere): O(P log nse) for
    P targets.  An indefinite ``x`` is a sampled (masked) log-softmax: its unspecified classes are
    no candidates, so a target there raises ValueError.  ``cross_entropy`` is ``log_softmax`` then
    this, both native: sampled softmax for extreme classification (``label_smoothing`` follows
    torch's formula there: the candidates' log-probabilities summed, divided by the class count).

    >>> import torch, sparsefill, torch.nn.functional as F
    >>> logits = sparsefill.sparse_coo_tensor([[0, 0, 1], [1, 4, 2]], [2., 1., 3.], (2, 1000),
    ...                                       fill_value=sparsefill.indefinite)
    >>> F.cross_entropy(logits, torch.tensor([1, 2]))   # row 0: 2 candidates, row 1: one
    tensor(0.1566)
    """
    x, t, w, reduction, ignore = _bound(func, args, kwargs)
    if not isinstance(x, SparseTensor) or isinstance(t, SparseTensor):
        return NotImplemented
    func(
        torch.empty(x.shape, dtype=x.dtype, device="meta"),
        t.to("meta"),
        None if w is None else torch.empty(w.shape, dtype=w.dtype, device="meta"),
        reduction,
        ignore,
    )  # torch's shape and argument errors
    keep, cls, picked = _picked(x, t, ignore)
    wt = torch.where(keep, _class_weights(w, cls, picked.dtype), 0)
    loss = -(wt * torch.where(keep, picked, 0))
    if reduction == 0:  # none
        return loss.reshape(t.shape), x._vals.new_zeros(())
    total = wt.sum()
    return (loss.sum() / total if reduction == 1 else loss.sum()), total


@register(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def _nll_loss_backward(func, args, kwargs):
    """The gradient of :func:`_nll_loss_forward`: a SparseTensor of ``x``'s shape, fill 0 (or
    indefinite, as ``x``), that stores ``-g w[t_p]`` (``/ total_weight`` for mean) at each picked
    element ``(p, t_p)`` only: O(P)."""
    g, x, t, w, reduction, ignore, total = _bound(func, args, kwargs)
    if (
        not isinstance(x, SparseTensor)
        or isinstance(t, SparseTensor)
        or isinstance(g, SparseTensor)
    ):
        return NotImplemented
    cd = 0 if x.dim() == 1 else 1
    tf = t.reshape(-1)
    keep = tf != ignore
    cls = torch.where(keep, tf, 0)
    wt = _class_weights(w, cls, x.dtype)
    gv = g.reshape(-1).expand(tf.shape) if reduction == 0 else g.reshape(()).expand(tf.shape)
    vals = -(gv * wt)
    if reduction == 1:
        vals = vals / total
    coords = _coords(t.shape, cls, cd)[:, keep]
    vals = vals[keep]
    sd = x.dim() - x.dense_dim()
    D = tuple(x._dense_shape)
    rows = vals.new_zeros((vals.shape[0],) + D)
    rows[(torch.arange(vals.shape[0]),) + tuple(coords[sd:])] = vals
    return SparseTensor(
        torch.sparse_coo,
        x.shape,
        rows,
        rows.new_zeros(()),
        indices=coords[:sd],
        indefinite=False,
        coalesced=False,
        known_zero=True,
    )


def _class_weights(w, cls: torch.Tensor, dtype) -> torch.Tensor:
    """``w[cls]`` (ones for no weight; a SparseTensor weight read at ``cls``)."""
    if w is None:
        return torch.ones(cls.shape, dtype=dtype, device=cls.device)
    return (values_at(w, cls, 1) if isinstance(w, SparseTensor) else w[cls]).to(dtype)


def _coords(tshape, cls: torch.Tensor, cd: int) -> torch.Tensor:
    """The full coordinates ``(dims, P)`` of the picked elements: each target position with its
    class inserted at the class dim ``cd``."""
    P = cls.numel()
    pos = unravel(torch.arange(P, device=cls.device), tuple(tshape))
    return torch.cat([pos[:cd], cls[None], pos[cd:]])


def _picked(x: SparseTensor, t: torch.Tensor, ignore: int):
    """``(kept, class, x[p, t_p])`` per target position ``p`` (flattened); torch's bounds error
    for a class out of range."""
    C = x.shape[0 if x.dim() == 1 else 1]
    tf = t.reshape(-1)
    keep = tf != ignore
    bad = keep & ((tf < 0) | (tf >= C))
    if bool(bad.any()):
        raise IndexError(f"Target {int(tf[bad][0])} is out of bounds.")
    cls = torch.where(keep, tf, 0)
    coords = _coords(t.shape, cls, 0 if x.dim() == 1 else 1)[:, keep]
    sd = x.dim() - x.dense_dim()
    keys = linearize(coords[:sd], x._sparse_shape)
    rows = _rows_at(x, keys, coords)
    picked = rows.new_zeros(tf.shape)
    picked[keep] = rows[(torch.arange(rows.shape[0]),) + tuple(coords[sd:])]
    return keep, cls, picked


def _rows_at(x: SparseTensor, keys: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
    """``x``'s rows (dense dims) at the linear sparse positions ``keys``: the stored row, or the
    fill; for an indefinite ``x`` every position must be stored (a sampled softmax's candidates)."""
    stored, vals = linear_parts(x)
    pos, found = lookup(stored, keys)
    if x._indefinite and not bool(found.all()):
        where = coords[:, ~found][:, 0].tolist()
        raise ValueError(
            f"nll_loss/cross_entropy: the target class at position {where} is not stored in the "
            "logits, whose fill is indefinite (a sampled softmax: unspecified classes are not "
            "candidates); store the target class of every sample"
        )
    D = tuple(x._dense_shape)
    rows = vals[pos] if vals.shape[0] else vals.new_zeros((keys.numel(),) + D)
    if x._indefinite:
        return rows
    return torch.where(found.view((-1,) + (1,) * len(D)), rows, x._fill)
