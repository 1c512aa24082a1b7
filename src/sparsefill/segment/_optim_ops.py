"""The sparse optimizers' updates as ``torch.library`` custom ops (namespace ``sparsefill::``): what
torch.compile records for ``segment.sparse_adagrad``, ``rowwise_sparse_adagrad`` and
``sparse_ftrl`` (``_optim``)::

    sparsefill::sparse_adagrad_(param!, moment!, indices, grad, ...)       == segment.sparse_adagrad
    sparsefill::rowwise_sparse_adagrad_(param!, moment!, indices, grad, ...)
        == segment.rowwise_sparse_adagrad
    sparsefill::sparse_ftrl_(param!, n!, z!, indices, grad, ...)              == segment.sparse_ftrl

Each op's real implementation is the eager function (its checks of the data run at run time); each
declares the tensors it updates in place (``mutates_args``) and returns nothing.  Registered on the
first import of this module (by the first traced update).
"""

from __future__ import annotations

import torch
from torch.library import custom_op

__all__ = ["sparse_adagrad_", "rowwise_sparse_adagrad_", "sparse_ftrl_"]


@custom_op("sparsefill::sparse_adagrad_", mutates_args=("param", "moment"))
def sparse_adagrad_(
    param: torch.Tensor,
    moment: torch.Tensor,
    indices: torch.Tensor,
    grad: torch.Tensor,
    lr: float,
    eps: float,
    weight_decay: float,
    decay: float,
    update_mode: str,
) -> None:
    from sparsefill.segment._optim import sparse_adagrad

    sparse_adagrad(
        param,
        moment,
        indices,
        grad,
        lr=lr,
        eps=eps,
        weight_decay=weight_decay,
        decay=decay,
        mode=update_mode,
    )


@sparse_adagrad_.register_fake
def _(param, moment, indices, grad, lr, eps, weight_decay, decay, update_mode):
    return None


@custom_op("sparsefill::rowwise_sparse_adagrad_", mutates_args=("param", "moment"))
def rowwise_sparse_adagrad_(
    param: torch.Tensor,
    moment: torch.Tensor,
    indices: torch.Tensor,
    grad: torch.Tensor,
    lr: float,
    eps: float,
    weight_decay: float,
    update_mode: str,
) -> None:
    from sparsefill.segment._optim import rowwise_sparse_adagrad

    rowwise_sparse_adagrad(
        param, moment, indices, grad, lr=lr, eps=eps, weight_decay=weight_decay, mode=update_mode
    )


@rowwise_sparse_adagrad_.register_fake
def _(param, moment, indices, grad, lr, eps, weight_decay, update_mode):
    return None


@custom_op("sparsefill::sparse_ftrl_", mutates_args=("param", "n", "z"))
def sparse_ftrl_(
    param: torch.Tensor,
    n: torch.Tensor,
    z: torch.Tensor,
    indices: torch.Tensor,
    grad: torch.Tensor,
    alpha: float,
    beta: float,
    lambda1: float,
    lambda2: float,
    update_mode: str,
) -> None:
    from sparsefill.segment._optim import sparse_ftrl

    sparse_ftrl(
        param,
        n,
        z,
        indices,
        grad,
        alpha=alpha,
        beta=beta,
        lambda1=lambda1,
        lambda2=lambda2,
        mode=update_mode,
    )


@sparse_ftrl_.register_fake
def _(param, n, z, indices, grad, alpha, beta, lambda1, lambda2, update_mode):
    return None
