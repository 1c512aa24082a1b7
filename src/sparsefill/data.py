"""Batching for ``torch.utils.data``: SparseTensors and KeyedJaggedBatches collate one way, with or
without workers.

A batch of SparseTensors of one shape and one fill is stacked along a new leading (sparse) dim,
keeping the fill and the layout; a batch of KeyedJaggedBatches is their examples one after the
other::

    collate([A_0, ..., A_n-1]).to_dense() == torch.stack([A_i.to_dense() for i in range(n)])
    collate([A_0, ..., A_n-1]).fill_value() == A_0.fill_value()
    collate([kj_0, ..., kj_n-1]) == KeyedJaggedBatch.concat([kj_0, ..., kj_n-1])

Importing sparsefill registers both rules in torch's ``default_collate_fn_map``, so the plain
``DataLoader(dataset, batch_size=...)`` (``default_collate``) gives the same batch with
``num_workers=0`` and with worker processes (which send it to the main process by torch's
shared-memory reductions, the inner tensors only).  Without the rule, torch's tensor collate writes
a worker's batch into a dense shared-memory tensor.  :func:`collate` is ``default_collate`` with
both rules, for any nesting of tuples, lists and dicts:

>>> import torch, sparsefill
>>> from sparsefill.data import collate
>>> A = sparsefill.sparse_coo_tensor([[0, 2]], [1., 2.], (4,), fill_value=5.)
>>> B = sparsefill.sparse_coo_tensor([[1]], [3.], (4,), fill_value=5.)
>>> batch = collate([(A, 0), (B, 1)])
>>> batch[0].to_dense(), batch[1]
(tensor([[1., 5., 2., 5.],
        [5., 3., 5., 5.]]), tensor([0, 1]))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch.utils.data._utils.collate import collate as _torch_collate
from torch.utils.data._utils.collate import default_collate_fn_map

from sparsefill._tensor.tensor import SparseTensor
from sparsefill.segment._jagged import KeyedJaggedBatch

__all__ = ["collate", "collate_sparse", "collate_jagged"]


def _same_fill(A: SparseTensor, B: SparseTensor) -> bool:
    if A._indefinite or B._indefinite:
        return A._indefinite and B._indefinite
    a, b = A._fill.expand(A._dense_shape), B._fill.expand(B._dense_shape)
    return bool(
        (
            (a == b) | (a.isnan() & b.isnan())
            if a.is_floating_point() or a.is_complex()
            else a == b
        ).all()
    )


def _describe(A: SparseTensor) -> str:
    fill = (
        "indefinite"
        if A._indefinite
        else (A._fill.item() if A._fill.numel() == 1 else A._fill.tolist())
    )
    return f"shape {tuple(A.shape)}, {A.sparse_layout}, dense dims {A.dense_dim()}, fill {fill}"


def collate_sparse(
    batch: Sequence[SparseTensor], *, collate_fn_map: dict | None = None
) -> SparseTensor:
    """Stack SparseTensors along a new leading dim: ``torch.stack(batch)``, after checking that they
    share shape, layout, dense dims and fill (ValueError naming the first element that differs;
    TypeError for an element that is no SparseTensor).  The result has their fill and layout (CSR:
    one batch dim more).

    >>> import sparsefill
    >>> A = sparsefill.sparse_coo_tensor([[0, 2]], [1., 2.], (4,), fill_value=5.)
    >>> collate_sparse([A, A * 2])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: collate: element 1 of the batch (shape (4,), ..., fill 10.0) differs from ...
    """
    batch = list(batch)
    first = batch[0]
    for i, A in enumerate(batch[1:], 1):
        if not isinstance(A, SparseTensor):
            raise TypeError(
                f"collate: element {i} of the batch is a {type(A).__name__}, element 0 a "
                "SparseTensor; convert it (sparsefill.to_sparse(x, fill_value=...)) or use one "
                "type"
            )
        if (
            A.shape != first.shape
            or A.sparse_layout is not first.sparse_layout
            or A.dense_dim() != first.dense_dim()
            or not _same_fill(A, first)
        ):
            raise ValueError(
                f"collate: element {i} of the batch ({_describe(A)}) differs from element 0 "
                f"({_describe(first)}): a batch of SparseTensors needs one shape, layout, dense "
                "dims and fill"
            )
    return cast(SparseTensor, torch.stack(tuple(batch)))


def collate_jagged(
    batch: Sequence[KeyedJaggedBatch], *, collate_fn_map: dict | None = None
) -> KeyedJaggedBatch:
    """The examples of a batch of KeyedJaggedBatches one after the other
    (:meth:`KeyedJaggedBatch.concat`)."""
    batch = list(batch)
    for i, b in enumerate(batch):
        if not isinstance(b, KeyedJaggedBatch):
            raise TypeError(
                f"collate: element {i} of the batch is a {type(b).__name__}, element 0 a "
                "KeyedJaggedBatch"
            )
    return KeyedJaggedBatch.concat(batch)


def collate(batch: Sequence[Any]) -> Any:
    """``torch.utils.data.default_collate`` with the SparseTensor and KeyedJaggedBatch rules (usable
    as a DataLoader's ``collate_fn`` even where torch's default map was changed)."""
    return _torch_collate(batch, collate_fn_map={**default_collate_fn_map, **_RULES})


_RULES: dict[type | tuple[type, ...], Callable[..., Any]] = {
    SparseTensor: collate_sparse,
    KeyedJaggedBatch: collate_jagged,
}
default_collate_fn_map.update(_RULES)
