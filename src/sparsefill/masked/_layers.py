"""Masked normalization layers and losses: ``layer_norm group_norm instance_norm batch_norm
local_response_norm cross_entropy nll_loss`` with a ``mask`` (masked-reductions-rfc.md's
normalizations).

The masked-in elements of ``input`` (``mask`` True; a SparseTensor with an indefinite fill: its
pattern) form a masked tensor, a SparseTensor with an indefinite fill; the layer runs on it
natively: its statistics (mean, variance) are over the masked-in elements of each slice only::

    layer_norm:  y[p] = (x[p] - mean_S) / sqrt(var_S + eps) * w + b,   mean_S, var_S over the
                 masked-in elements of p's slice S

``local_response_norm``'s window sums run over the masked-in elements (a masked-out channel adds
nothing).  ``cross_entropy(logits, target, mask=m)`` is a softmax over the masked-in classes of
each row only (sampled softmax; a target class masked out raises ValueError); ``nll_loss`` reads
the masked-in log-probabilities alike.  The result has the input's
layout: for a SparseTensor input the masked tensor (pattern = masked-in elements), for a strided
input a strided tensor with 0 at the masked-out elements (torch.masked's value for masked-out
elements of a normalization).  The gradient flows to the masked-in elements of ``input`` only.

>>> import torch, sparsefill
>>> x = torch.tensor([[1., 2., 100.], [3., 5., 7.]])
>>> m = torch.tensor([[True, True, False], [True, True, True]])
>>> sparsefill.masked.layer_norm(x, (3,), mask=m, eps=0.)
tensor([[-1.0000,  1.0000,  0.0000],
        [-1.2247,  0.0000,  1.2247]])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from sparsefill._kernels import index as _index
from sparsefill._tensor.parts import values_at
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.masked._canon import true_positions

__all__ = [
    "layer_norm",
    "group_norm",
    "instance_norm",
    "batch_norm",
    "local_response_norm",
    "cross_entropy",
    "nll_loss",
]


def masked_in(input, mask) -> SparseTensor | torch.Tensor:
    """``input`` with the elements where ``mask`` is False masked out: a SparseTensor with an
    indefinite fill holding the masked-in elements (``mask=None``: ``input`` itself)."""
    if mask is None:
        return input
    pos = true_positions(mask, input.shape)
    if isinstance(input, SparseTensor):
        sd = input.dim() - input.dense_dim()
        rows = values_at(input, _index.linearize(pos[:sd], input._sparse_shape), sd)
        vals = rows[(torch.arange(rows.shape[0], device=rows.device),) + tuple(pos[sd:])]
    else:
        vals = input[tuple(pos)]
    from sparsefill._creation.constructors import sparse_coo_tensor
    from sparsefill._tensor.fill import indefinite

    return sparse_coo_tensor(pos, vals, tuple(input.shape), fill_value=indefinite)


def _in_layout(out, input):
    """The result in ``input``'s layout: the masked tensor, or strided with 0 where masked out."""
    if isinstance(input, SparseTensor) or not isinstance(out, SparseTensor):
        return out
    return out.to_dense(fill_value=0.0)


def layer_norm(
    input: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """``F.layer_norm`` over the masked-in elements of each slice (module docstring)."""
    out = F.layer_norm(masked_in(input, mask), normalized_shape, weight, bias, eps)
    return _in_layout(out, input)


def group_norm(
    input: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """``F.group_norm`` over the masked-in elements of each (sample, group)."""
    return _in_layout(F.group_norm(masked_in(input, mask), num_groups, weight, bias, eps), input)


def instance_norm(
    input: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """``F.instance_norm`` (input statistics) over the masked-in elements of each (sample,
    channel)."""
    out = F.instance_norm(masked_in(input, mask), weight=weight, bias=bias, eps=eps)
    return _in_layout(out, input)


def batch_norm(
    input: torch.Tensor,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
    *,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """``F.batch_norm`` whose batch statistics (training) are over the masked-in elements of each
    channel; the running statistics are updated with them."""
    x = masked_in(input, mask)
    out = F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)
    return _in_layout(out, input)


def local_response_norm(
    input: torch.Tensor,
    size: int,
    alpha: float = 1e-4,
    beta: float = 0.75,
    k: float = 1.0,
    *,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """``F.local_response_norm`` whose window sums of squares run over the masked-in elements
    (``x[:, c] / (k + alpha / size * sum_{masked-in c' in window(c)} x[:, c'] ** 2) ** beta``)."""
    out = F.local_response_norm(masked_in(input, mask), size, alpha, beta, k)
    return _in_layout(out, input)


def cross_entropy(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    *,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """``F.cross_entropy`` whose softmax runs over the masked-in classes of each row only (a
    sampled softmax); a target class that is masked out raises ValueError."""
    return F.cross_entropy(
        masked_in(input, mask),
        target,
        weight=weight,
        ignore_index=ignore_index,
        reduction=reduction,
        label_smoothing=label_smoothing,
    )


def nll_loss(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    *,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """``F.nll_loss`` of the masked-in log-probabilities; a target class that is masked out raises
    ValueError (its log-probability is not given)."""
    return F.nll_loss(
        masked_in(input, mask),
        target,
        weight=weight,
        ignore_index=ignore_index,
        reduction=reduction,
    )
