"""Row lookups and in-place row updates (Caffe2 ``Gather``, ``ScatterAssign``,
``ScatterWeightedSum``).

Every update checks all its arguments before touching ``data``: a failed call modifies nothing.

>>> import torch
>>> data = torch.zeros(4, 2)
>>> scatter_weighted_sum(data.fill_(1.0), 2.0, torch.tensor([1, 3, 1]), torch.ones(3, 2), 0.5)
tensor([[1.0000, 1.0000],
        [5.0000, 5.0000],
        [1.0000, 1.0000],
        [2.5000, 2.5000]])
"""

from __future__ import annotations

import torch

from sparsefill._kernels.segment_check import IndexLike, as_index, check_indices

__all__ = ["gather", "scatter_assign", "scatter_weighted_sum"]


def gather(data: torch.Tensor, indices: IndexLike, *, validate: bool = True) -> torch.Tensor:
    """``out[i...] = data[indices[i...]]`` along dim 0 (an embedding lookup; ``indices`` of any
    shape).

    >>> gather(torch.tensor([[1, 2], [3, 4], [5, 6]]), torch.tensor([[2, 0]]))
    tensor([[[5, 6],
             [1, 2]]])
    """
    idx = (
        indices
        if isinstance(indices, torch.Tensor)
        else torch.as_tensor(indices, dtype=torch.int64)
    )
    if idx.dtype.is_floating_point or idx.dtype == torch.bool:
        raise TypeError(f"indices must be an integer tensor, got dtype {idx.dtype}")
    flat = idx.reshape(-1).to(data.device)
    check_indices(flat, data.shape[0] if data.dim() else 0, validate=validate)
    return data.index_select(0, flat.long()).reshape(*idx.shape, *data.shape[1:])


def _check_slices(data, idx, slices, name):
    want = (idx.numel(), *data.shape[1:])
    if tuple(slices.shape) != want:
        raise ValueError(
            f"{name} must have shape {want} (one row per index), got {tuple(slices.shape)}"
        )
    if slices.dtype != data.dtype:
        raise TypeError(f"{name} must have the dtype of data ({data.dtype}), got {slices.dtype}")


def scatter_assign(data: torch.Tensor, indices: IndexLike, slices: torch.Tensor) -> torch.Tensor:
    """In place: ``data[indices[i]] = slices[i]``; for a repeated index the last occurrence wins.
    Returns ``data``.

    >>> scatter_assign(torch.zeros(3), torch.tensor([2, 0, 2]), torch.tensor([1., 2., 3.]))
    tensor([2., 0., 3.])
    """
    idx = as_index(indices, "indices", data.device).long()
    _check_slices(data, idx, slices, "slices")
    check_indices(idx, data.shape[0])
    if idx.numel() == 0:
        return data
    pos = torch.arange(idx.numel(), device=idx.device)
    last = torch.full((data.shape[0],), -1, dtype=torch.int64, device=idx.device).scatter_reduce_(
        0, idx, pos, "amax"
    )
    rows = (last >= 0).nonzero().squeeze(1)
    return data.index_copy_(0, rows, slices.index_select(0, last[rows]))


def scatter_weighted_sum(
    data: torch.Tensor, weight0: torch.Tensor, indices: IndexLike, *updates: torch.Tensor
) -> torch.Tensor:
    """In place, Caffe2's sequential rule: every occurrence of a row in ``indices`` scales it by
    ``weight0``,
    then every update adds ``w_k * x_k[i]``::

        data[r] = weight0 ** d_r * data[r] + sum_k w_k * sum_{i: indices[i] = r} x_k[i]

    (``d_r`` = occurrences of ``r``).  ``updates`` = ``x_1, w_1, x_2, w_2, ...``; ``weight0`` and
    every ``w_k`` are scalars (one element).  Returns ``data``.
    """
    if len(updates) % 2:
        raise ValueError(
            f"updates must be pairs (x_1, w_1, x_2, w_2, ...), got {len(updates)} arguments"
        )
    for name, w in [
        ("weight0", weight0),
        *((f"w_{j + 1}", w) for j, w in enumerate(updates[1::2])),
    ]:
        if torch.as_tensor(w).numel() != 1:  # Caffe2 enforces one weight per update
            raise ValueError(
                f"{name} must be a scalar (one element), got shape "
                f"{tuple(torch.as_tensor(w).shape)}"
            )
    idx = as_index(indices, "indices", data.device).long()
    xs = updates[0::2]
    ws = updates[1::2]
    for j, x in enumerate(xs):
        _check_slices(data, idx, x, f"x_{j + 1}")
    check_indices(idx, data.shape[0])
    if idx.numel() == 0:
        return data
    w0 = torch.as_tensor(weight0, dtype=data.dtype, device=data.device)
    occ = torch.bincount(idx, minlength=data.shape[0])
    touched = (occ > 0).nonzero().squeeze(1)
    scale = torch.pow(w0, occ[touched].to(data.dtype)).view(-1, *([1] * (data.dim() - 1)))
    compact = torch.searchsorted(touched, idx)
    upd = data.new_zeros((touched.numel(), *data.shape[1:]))
    for x, w in zip(xs, ws):
        upd.index_add_(0, compact, x * torch.as_tensor(w, dtype=data.dtype, device=data.device))
    data[touched] = data[touched] * scale + upd
    return data
