"""The Caffe2 operator names, generated as thin aliases of :func:`segment.reduce`.

Positional arguments follow Caffe2's input order (``DATA, [SCALARS,] [INDICES,]
LENGTHS|SEGMENT_IDS``); keyword arguments go to ``reduce`` unchanged.  The table ``ALIASES`` maps
every name to ``(family, reducer)``::

    lengths_<r>(data, [weights,] lengths)                     reduce(data, r, lengths=lengths)
    sparse_lengths_<r>(data, [weights,] indices, lengths)  reduce(data, r, lengths=..., indices=...)
    sorted_segment_<r>(data, [weights,] segment_ids)          reduce(data, r, segment_ids=...)
    sorted_segment_range_<r>(data, segment_ids)               the same (Caffe2's Range kernels)
    sparse_sorted_segment_<r>(data, [weights,] indices, segment_ids)
    unsorted_segment_<r>(data, [weights,] segment_ids, num_segments=None)    sorted=False
    sparse_unsorted_segment_<r>(data, [weights,] indices, segment_ids, num_segments=None)
    reduce_front_<r>(data, [weights,] num_reduce_dims=1)      the first dims reduced as one segment
    reduce_back_<r>(data, [weights,] num_reduce_dims=1)       the last dims reduced as one segment

>>> import torch
>>> sorted_segment_sum(
...     torch.tensor([[1.0, 4.0], [3.0, 2.0], [8.0, 1.0], [9.0, 4.0], [5.0, 8.0]]),
...     torch.tensor([0, 0, 0, 1, 1]),
... )
tensor([[12.,  7.],
        [14., 12.]])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from sparsefill.segment._reduce_ops import SEGMENT_REDUCERS, reduce

_FAMILIES = {
    # family: (reducers, takes indices, representation, sorted)
    "lengths": (("sum", "mean", "weighted_sum", "max"), False, "lengths", True),
    "sparse_lengths": (
        ("sum", "mean", "weighted_sum", "positional_weighted_sum"),
        True,
        "lengths",
        True,
    ),
    "sorted_segment": (("sum", "mean", "weighted_sum", "max", "min"), False, "segment_ids", True),
    "sparse_sorted_segment": (
        ("sum", "mean", "weighted_sum", "max", "min"),
        True,
        "segment_ids",
        True,
    ),
    "unsorted_segment": (
        ("sum", "mean", "weighted_sum", "max", "min"),
        False,
        "segment_ids",
        False,
    ),
    "sparse_unsorted_segment": (
        ("sum", "mean", "weighted_sum", "max", "min"),
        True,
        "segment_ids",
        False,
    ),
    "sorted_segment_range": (
        ("sum", "mean", "max", "logsumexp", "logmeanexp"),
        False,
        "segment_ids",
        True,
    ),
    "reduce_front": (("sum", "mean", "weighted_sum", "max", "min"), False, "front", True),
    "reduce_back": (("sum", "mean", "weighted_sum", "max", "min"), False, "back", True),
}

ALIASES: dict[str, tuple[str, str]] = {
    f"{fam}_{r}": (fam, r) for fam, (rs, *_) in _FAMILIES.items() for r in rs
}


def _make(family: str, rname: str) -> Callable[..., torch.Tensor]:
    _, fused, rep, is_sorted = _FAMILIES[family]
    weighted = SEGMENT_REDUCERS[rname].weights is not None
    alias: Callable[..., torch.Tensor]

    if rep in ("front", "back"):

        def over_dims(
            data: torch.Tensor, *args: Any, num_reduce_dims: int = 1, **kw: Any
        ) -> torch.Tensor:
            if not 0 <= num_reduce_dims <= data.dim():
                raise ValueError(
                    f"num_reduce_dims must be in [0, {data.dim()}], got {num_reduce_dims}"
                )
            if rep == "front":
                x = data.reshape(-1, *data.shape[num_reduce_dims:])
            else:
                keep = data.shape[: data.dim() - num_reduce_dims]
                x = data.reshape(*keep, -1).movedim(-1, 0)
            lengths = torch.tensor([x.shape[0]], device=data.device)
            out = reduce(x, rname, lengths=lengths, weights=args[0] if weighted else None, **kw)[0]
            return out

        alias = over_dims
    else:
        n_pos = int(weighted) + int(fused) + 1

        def positional(data: torch.Tensor, *args: Any, **kw: Any) -> torch.Tensor:
            if len(args) != n_pos:
                raise TypeError(
                    f"{family}_{rname}() takes data and {n_pos} more positional tensors "
                    f"({', '.join(_arg_names(weighted, fused, rep))}), got {len(args)}"
                )
            rest = list(args)
            w = rest.pop(0) if weighted else None
            idx = rest.pop(0) if fused else None
            order: dict[str, Any] = {} if is_sorted else {"sorted": False}
            return reduce(
                data,
                rname,
                **{rep: rest[0]},
                indices=idx,
                weights=w,
                **order,
                **kw,
            )

        alias = positional

    alias.__name__ = alias.__qualname__ = f"{family}_{rname}"
    caffe2 = "".join(p.capitalize() for p in family.split("_")) + "".join(
        p.capitalize() for p in rname.split("_")
    )
    alias.__doc__ = (
        f"Caffe2 ``{caffe2}``: ``segment.reduce(data, {rname!r}, ...)`` with "
        f"({', '.join(['data', *_arg_names(weighted, fused, rep)])}) positional."
    )
    return alias


def _arg_names(weighted, fused, rep):
    names = ["weights"] if weighted else []
    if rep in ("front", "back"):
        return names
    return names + (["indices"] if fused else []) + [rep]


for _name, (_fam, _r) in ALIASES.items():
    globals()[_name] = _make(_fam, _r)

__all__ = ["ALIASES", *ALIASES]
