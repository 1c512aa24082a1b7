"""Padded form of a batch, dense scatter of ids, and top-k per segment (Caffe2 ``PackSegments``,
``UnpackSegments``, ``SparseToDense``, ``LengthsTopK``).

``pack_segments`` / ``unpack_segments`` are inverse on the valid rows::

    packed[s, j] = data[offsets[s] + j]    for j < lengths[s],   pad elsewhere
    unpack_segments(pack_segments(data, lengths), lengths) == data

>>> import torch
>>> from sparsefill import segment
>>> packed, mask = segment.pack_segments(
...     torch.tensor([1, 2, 3, 2, 4, 6, 7, 3, 6]),
...     torch.tensor([3, 4, 2]),
...     pad_value=-1,
...     return_presence_mask=True,
... )
>>> packed
tensor([[ 1,  2,  3, -1],
        [ 2,  4,  6,  7],
        [ 3,  6, -1, -1]])
"""

from __future__ import annotations

import torch

from sparsefill._kernels.segment_check import IndexLike, as_index, check_indices, check_lengths

__all__ = ["pack_segments", "unpack_segments", "sparse_to_dense", "lengths_top_k"]


def _slots(lengths: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For every row: its flat slot ``s * width + j`` in the padded layout, and whether ``j <
    width``."""
    li = lengths.long()
    n = int(li.sum()) if li.numel() else 0
    seg = torch.repeat_interleave(torch.arange(li.numel(), device=li.device), li, output_size=n)
    pos = torch.arange(n, device=li.device) - torch.repeat_interleave(
        torch.cumsum(li, 0) - li, li, output_size=n
    )
    return seg * width + pos, pos < width


def pack_segments(
    data: torch.Tensor,
    lengths: IndexLike,
    *,
    max_length: int | None = None,
    pad_value: float = 0,
    pad_minf: bool = False,
    return_presence_mask: bool = False,
    validate: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Padded ``(S, L, *D)`` tensor of a values+lengths batch; differentiable in ``data``.

    ``L = max_length`` if given (longer segments are truncated, Caffe2's rule), else
    ``max(lengths)``. Padding is ``pad_value``, or ``-inf`` with ``pad_minf=True`` (so a following
    max ignores it). With ``return_presence_mask=True`` also returns ``mask`` (bool, ``(S, L)``):
    ``mask[s, j] = j < lengths[s]``.
    """
    lengths = as_index(lengths, "lengths", data.device)
    if data.dim() == 0:
        raise ValueError("data must have at least one dimension (the rows to pack)")
    check_lengths(lengths, data.shape[0], validate=validate)
    if max_length is not None and max_length < 0:
        raise ValueError(f"max_length must be non-negative, got {max_length}")
    longest = int(lengths.max()) if lengths.numel() else 0
    width = longest if max_length is None else max_length
    if pad_minf:
        if not data.is_floating_point():
            raise TypeError(f"pad_minf=True needs a floating-point data tensor, got {data.dtype}")
        pad_value = float("-inf")
    S = lengths.numel()
    slot, keep = _slots(lengths, width)
    if width < longest:
        slot, src = slot[keep], data[keep]
    else:
        src = data
    flat = data.new_full((S * width, *data.shape[1:]), pad_value).index_copy(0, slot, src)
    packed = flat.view(S, width, *data.shape[1:])
    if not return_presence_mask:
        return packed
    mask = torch.arange(width, device=data.device) < lengths.long()[:, None]
    return packed, mask


def unpack_segments(
    packed: torch.Tensor,
    lengths: IndexLike,
    *,
    max_length: int | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """The rows of ``packed`` (shape ``(S, L, *D)``) that ``lengths`` marks valid, concatenated.

    ``out[offsets[s] + j] = packed[s, j]`` for ``j < lengths[s]``; ``max_length`` truncates (as in
    ``pack_segments``).  Differentiable in ``packed``.
    """
    if packed.dim() < 2:
        raise ValueError(
            f"packed must have shape (segments, length, ...), got {tuple(packed.shape)}"
        )
    lengths = as_index(lengths, "lengths", packed.device)
    S, width = packed.shape[0], packed.shape[1]
    if lengths.numel() != S:
        raise ValueError(f"lengths has {lengths.numel()} entries but packed holds {S} segments")
    check_lengths(lengths, None, validate=validate)
    li = lengths.long()
    if max_length is not None:
        li = li.clamp_max(max_length)
    longest = int(li.max()) if li.numel() else 0
    if longest > width:
        raise ValueError(f"lengths has an entry {longest} longer than the padded length {width}")
    slot, _ = _slots(li, width)
    return packed.reshape(S * width, *packed.shape[2:]).index_select(0, slot)


def sparse_to_dense(
    indices: IndexLike,
    values: torch.Tensor,
    output_size: int | None = None,
    *,
    validate: bool = True,
) -> torch.Tensor:
    """``out[j] = sum(values[i] for i with indices[i] == j)``: duplicates add (Caffe2
    ``SparseToDense``).

    ``output_size`` defaults to ``max(indices) + 1``. Differentiable in ``values``.

    >>> sparse_to_dense(torch.tensor([0, 3, 0]), torch.tensor([1., 2., 3.]))
    tensor([4., 0., 0., 2.])
    """
    indices = as_index(indices, "indices", values.device)
    if values.dim() == 0 or values.shape[0] != indices.numel():
        raise ValueError(
            f"values must have one row per index: {indices.numel()} indices, "
            f"values of shape {tuple(values.shape)}"
        )
    if output_size is None:
        output_size = int(indices.max()) + 1 if indices.numel() else 0
    check_indices(indices, output_size, validate=validate, what="rows of the output (output_size)")
    out = values.new_zeros((output_size, *values.shape[1:]))
    return out.index_add(0, indices, values)


def lengths_top_k(
    data: torch.Tensor, lengths: IndexLike, k: int, *, validate: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest values of every segment and their positions within it (Caffe2
    ``LengthsTopK``).

    Returns ``(values, positions)``, both ``(S, k)``, in decreasing order (ties: the earlier
    position first); a segment shorter than ``k`` is padded with value 0 and position -1.
    Differentiable in ``data``.

    >>> lengths_top_k(torch.tensor([3., 1., 2., 5.]), torch.tensor([3, 0, 1]), 2)
    (tensor([[3., 2.],
            [0., 0.],
            [5., 0.]]), tensor([[ 0,  2],
            [-1, -1],
            [ 0, -1]]))
    """
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    if data.dim() != 1:
        raise ValueError(f"data must be 1-D, got shape {tuple(data.shape)}")
    if not data.is_floating_point():
        raise TypeError(f"lengths_top_k needs floating-point data, got {data.dtype}")
    packed, mask = pack_segments(
        data, lengths, pad_minf=True, return_presence_mask=True, validate=validate
    )
    S, width = packed.shape
    # sort the padding last whatever the values (even -inf and NaN): by (present, value) descending,
    # stable
    order = torch.sort(packed.detach(), dim=1, descending=True, stable=True).indices
    order = torch.gather(
        order,
        1,
        torch.sort(torch.gather(~mask, 1, order).to(torch.uint8), dim=1, stable=True).indices,
    )
    kk = min(k, width)
    pos = order[:, :kk]
    present = torch.gather(mask, 1, pos)
    vals = torch.gather(packed, 1, pos)
    vals = torch.where(present, vals, torch.zeros((), dtype=data.dtype, device=data.device))
    pos = torch.where(present, pos, torch.full_like(pos, -1))
    if kk < k:
        vals = torch.cat([vals, vals.new_zeros(S, k - kk)], 1)
        pos = torch.cat([pos, pos.new_full((S, k - kk), -1)], 1)
    return vals, pos
