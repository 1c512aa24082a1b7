"""Normalization layers of SparseTensors: layer_norm, group_norm, instance_norm, batch_norm.

Each normalizes by a mean and a variance over some dims and applies an affine map::

    y = (x - mean) / sqrt(var + eps) * weight + bias

Over a hybrid tensor's dense dims (``layer_norm`` of the trailing features) the statistics are per
stored row, plus one for the fill row: the pattern is kept, O(nse * D).  Over sparse dims the
statistics are closed forms from the sums of the stored values and the count of unspecified
elements (``mean = (sum(values) + n * fill) / N``); the result is dense by nature where one sparse
slice gets another mean than the next (each unspecified element then has its slice's value) and is
built once, under the densify policy.  ``batch_norm`` in training updates the running statistics
exactly as torch does (``running = (1 - momentum) running + momentum * stat``, the variance
unbiased).  The gradients are torch's formulas, whose pieces are native alike.

>>> import torch, sparsefill, torch.nn.functional as F
>>> A = sparsefill.to_sparse(torch.tensor([[0., 0., 3.], [1., 0., 0.]]), fill_value=0., dense_dim=1)
>>> out = F.layer_norm(A, (3,))
>>> type(out).__name__, torch.allclose(out.to_dense(), F.layer_norm(A.to_dense(), (3,)))
('SparseTensor', True)
"""

from __future__ import annotations

import torch

from sparsefill._tensor.parts import coalesce_of, dense_of
from sparsefill._tensor.policy import check_densify
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops.decomposed import decomposed
from sparsefill.ops.registry import register, register_shortcut
from sparsefill._kernels.trace import traced

aten = torch.ops.aten


def _layer_varies(A, args, sd) -> bool:
    """layer_norm: the normalized (last ``k``) dims reach a sparse dim and the leading dims hold
    more than one sparse slice."""
    lead = A.dim() - len(args[1])
    return lead < sd and any(A.shape[d] > 1 for d in range(min(lead, sd)))


def _channel_varies(A, args, sd) -> bool:
    """group_norm, batch_norm: the channel dim 1 is sparse (its statistics or affine map differ
    from one channel, or group of them, to the next)."""
    return sd > 1 and (A.shape[1] > 1 or A.shape[0] > 1)


_DENSE_BY_NATURE = {  # forward op -> whether the result is dense by nature for its input
    aten.native_layer_norm.default: _layer_varies,
    aten.native_group_norm.default: _channel_varies,
    aten.native_batch_norm.default: _channel_varies,
    aten._native_batch_norm_legit.default: _channel_varies,
    aten._native_batch_norm_legit.no_stats: _channel_varies,
    aten._native_batch_norm_legit_no_training.default: _channel_varies,
    aten._batch_norm_with_update.default: _channel_varies,
    aten._batch_norm_no_update.default: _channel_varies,
}


def _gate(func, args) -> None:
    """The policy's gate for a result dense by nature: statistics (or the per-channel affine
    map) that vary along a sparse dim of more than one slice give each slice's unspecified
    elements their own value, so every element is stored."""
    varies = _DENSE_BY_NATURE.get(func)
    A = args[0]
    if varies is None or not isinstance(A, SparseTensor) or A._indefinite:
        return
    if varies(A, args, A.dim() - A.dense_dim()) and A.numel() > A._vals.numel():
        check_densify(
            f"{func} along sparse dims (each slice its own statistics)",
            A.numel() * A.element_size(),
            by_nature=True,
        )


@register(aten.native_group_norm.default, aten.native_group_norm_backward.default)
def _group_norm(func, args, kwargs):
    """``group_norm``: the statistics of each (sample, group) over its channels and positions, as
    the module docstring says.  A SparseTensor ``weight`` or ``bias`` (a parameter per channel,
    which the reference reshapes by strides) is read densely: C numbers."""
    args = [_dense_param(a) if i and isinstance(a, SparseTensor) else a for i, a in enumerate(args)]
    _gate(func, args)
    return decomposed(func, args, kwargs)


def _dense_param(p: SparseTensor) -> torch.Tensor:
    check_densify(
        "a SparseTensor weight or bias of group_norm", p.numel() * p.element_size(), by_nature=True
    )
    return dense_of(p)


@register(
    aten.native_layer_norm.default,
    aten.native_layer_norm_backward.default,
    aten.native_batch_norm.default,
    aten.native_batch_norm_backward.default,
    aten._native_batch_norm_legit.default,
    aten._native_batch_norm_legit.no_stats,
    aten._native_batch_norm_legit_no_training.default,
    aten._batch_norm_with_update.default,
    aten._batch_norm_no_update.default,
    aten.batch_norm_backward.default,
)
def _norm_layer(func, args, kwargs):
    """The layer's reference formula (module docstring), its pieces native."""
    if func is aten.native_layer_norm.default and not kwargs:
        out = _rowwise_layer_norm(*args)
        if out is not None:
            return out
    _gate(func, args)
    return decomposed(func, args, kwargs)


@register_shortcut(aten.native_layer_norm.default)
def _layer_norm_shortcut(func, args, kwargs):
    """``native_layer_norm`` over dense dims with plain (or no) weight and bias, eagerly: straight
    to :func:`_rowwise_layer_norm` from ``__torch_dispatch__`` (None: the full path).  A view
    declines: the shortcut runs before ``views.around``, which brings a view up to date with a
    base written since it was taken."""
    plain = (torch.Tensor, torch.nn.Parameter)  # (a module's weight arrives a Parameter in no_grad)
    if kwargs or traced() or any(a is not None and type(a) not in plain for a in args[2:4]):
        return None
    if isinstance(args[0], SparseTensor) and args[0]._view is not None:
        return None
    return _rowwise_layer_norm(*args)


def _rowwise_layer_norm(A, normalized_shape, weight=None, bias=None, eps=1e-5):
    """``native_layer_norm`` over dense dims only: torch's kernel on the stored rows and on the
    fill row, the pattern kept (output, mean and rstd alike); None where it does not apply."""
    k = len(normalized_shape)
    if not isinstance(A, SparseTensor) or k > A.dense_dim() or not k:
        return None
    if isinstance(weight, SparseTensor) or isinstance(bias, SparseTensor):
        return None
    B = A if A._coalesced else coalesce_of(A)
    if B._indefinite:
        rows = aten.native_layer_norm.default(B._vals, normalized_shape, weight, bias, eps)
        fills = (B._fill,) * 3
    else:  # (the fill row normalized with the stored ones: one kernel call)
        V = B._vals
        f = B._fill.to(V.dtype).expand(V.shape[V.dim() - B.dense_dim() :])[None]
        out = aten.native_layer_norm.default(torch.cat([V, f]), normalized_shape, weight, bias, eps)
        n = V.shape[0]
        rows, fills = [t.narrow(0, 0, n) for t in out], [t.select(0, n) for t in out]
    # (A._size: A.shape without a __torch_function__ hop)
    stat = tuple(A._size[: len(A._size) - k]) + (1,) * k
    # (B's pattern, new values and fills: the wrapper alone, as rewrap(B, values=v, fill=f,
    # size=size, known_zero=False) builds it)
    lay, idx, crow, col = B._sf_layout, B._idx, B._crow, B._col
    return tuple(
        SparseTensor._make(lay, size, v, f, idx, crow, col, B._indefinite, B._coalesced, False)
        for v, f, size in zip(rows, fills, (A._size, stat, stat))
    )


_NATURE = "statistics vary along a sparse dim: every element stored (the policy's dense_by_nature)"
_group_norm.dense_by_nature = _norm_layer.dense_by_nature = _NATURE
