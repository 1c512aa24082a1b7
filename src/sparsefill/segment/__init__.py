"""sparsefill.segment: the Caffe2 segment operations on plain tensors.

A batch of variable-length examples is a values tensor (rows along dim 0) plus one of
``lengths``, ``offsets``, sorted or unsorted ``segment_ids``, or a padded tensor; this package
converts between them and reduces the rows of every segment.

Modules (each small enough to read at once):

* ``_repr``, ``_pack``  -- conversions: lengths / offsets / segment ids / ranges, weights, range
  fill, tile, ``lengths_gather``, ``gather_ranges``, ``pack_segments`` / ``unpack_segments``,
  ``sparse_to_dense``, ``lengths_top_k``;
* ``_reduce_ops``       -- ``reduce(data, reducer, lengths= | offsets= | segment_ids=, indices=,
  weights=)`` for ``sum mean sqrt_n weighted_sum weighted_mean positional_weighted_sum max min prod
  logsumexp logmeanexp``, built on the reducer protocol of ``sparsefill._kernels.reducer``, with
  autograd;
* ``_aliases``          -- the Caffe2 names (``lengths_sum``, ``sparse_lengths_weighted_sum``,
  ``unsorted_segment_max``, ``reduce_front_mean``, ...), generated from one table;
* ``_plan``, ``_kernels``, ``_numba_kernels`` -- the canonical segment order and the kernels
  (``embedding_bag``; compiled CPU kernels when numba is installed and the process's work has paid
  for its import -- ``set_backend("auto" | "numba" | "torch")`` -- torch ops otherwise);
* ``_basic``            -- ``gather``, ``scatter_assign``, ``scatter_weighted_sum``;
* ``_jagged``           -- ``KeyedJaggedBatch``, the spec's ``LIST<MAP<INT, LIST<INT>>>``
  (``validate=False`` skips its data checks); its checks in ``_jagged_check``, its (key, example)
  lists in ``_jagged_lists``;
* ``_bridge``           -- the batch as a CSR ``SparseTensor`` and ``ids_to_sparse``;
* ``_optim``            -- ``sparse_adagrad``, ``rowwise_sparse_adagrad``, ``sparse_ftrl`` and the
  ``SparseAdagrad`` / ``SparseFtrl`` optimizers;
* ``_custom_ops`` (``reduce``), ``_optim_ops``, ``_jagged_ops``, ``_repr_ops`` -- what torch.compile
  records: the parts that read data (kernels, checks, data-dependent sizes) as ``sparsefill::``
  custom ops, so every function here traces with ``fullgraph=True`` except
  ``KeyedJaggedBatch.pooled`` of one shared table without ``keys=`` (its keys are data: a graph
  break).

>>> import torch
>>> from sparsefill import segment
>>> data = torch.tensor([[1., 4.], [3., 2.], [8., 1.], [9., 4.], [5., 8.]])
>>> segment.lengths_to_segment_ids(torch.tensor([3, 2]))
tensor([0, 0, 0, 1, 1])
>>> segment.reduce(data, "sum", lengths=torch.tensor([3, 2]))
tensor([[12.,  7.],
        [14., 12.]])
>>> segment.sorted_segment_sum(data, torch.tensor([0, 0, 0, 1, 1]))   # the Caffe2 name
tensor([[12.,  7.],
        [14., 12.]])
"""

from typing import TYPE_CHECKING

from sparsefill.segment._repr import (
    gather_ranges,
    lengths_gather,
    lengths_range_fill,
    lengths_tile,
    lengths_to_offsets,
    lengths_to_ranges,
    lengths_to_segment_ids,
    lengths_to_weights,
    offsets_to_lengths,
    segment_ids_to_lengths,
    segment_ids_to_offsets,
    segment_ids_to_ranges,
)
from sparsefill.segment._pack import lengths_top_k, pack_segments, sparse_to_dense, unpack_segments
from sparsefill.segment._reduce_ops import SEGMENT_REDUCERS, SegmentReducer, reduce
from sparsefill.segment._basic import gather, scatter_assign, scatter_weighted_sum
from sparsefill.segment._bridge import csr_row_reduce, from_sparse_csr, ids_to_sparse, to_sparse_csr
from sparsefill.segment._jagged import KeyedJaggedBatch
from sparsefill.segment._optim import (
    SparseAdagrad,
    SparseFtrl,
    rowwise_sparse_adagrad,
    sparse_adagrad,
    sparse_ftrl,
)
from sparsefill._kernels.segment import compiled_available, set_backend, use_backend
from sparsefill.segment import _aliases
from sparsefill.segment._aliases import ALIASES

globals().update({_n: getattr(_aliases, _n) for _n in ALIASES})

if TYPE_CHECKING:  # the aliases made above, for type checkers (tests/test_lint.py: the same names)
    from collections.abc import Callable

    import torch

    lengths_max: Callable[..., torch.Tensor]
    lengths_mean: Callable[..., torch.Tensor]
    lengths_sum: Callable[..., torch.Tensor]
    lengths_weighted_sum: Callable[..., torch.Tensor]
    reduce_back_max: Callable[..., torch.Tensor]
    reduce_back_mean: Callable[..., torch.Tensor]
    reduce_back_min: Callable[..., torch.Tensor]
    reduce_back_sum: Callable[..., torch.Tensor]
    reduce_back_weighted_sum: Callable[..., torch.Tensor]
    reduce_front_max: Callable[..., torch.Tensor]
    reduce_front_mean: Callable[..., torch.Tensor]
    reduce_front_min: Callable[..., torch.Tensor]
    reduce_front_sum: Callable[..., torch.Tensor]
    reduce_front_weighted_sum: Callable[..., torch.Tensor]
    sorted_segment_max: Callable[..., torch.Tensor]
    sorted_segment_mean: Callable[..., torch.Tensor]
    sorted_segment_min: Callable[..., torch.Tensor]
    sorted_segment_range_logmeanexp: Callable[..., torch.Tensor]
    sorted_segment_range_logsumexp: Callable[..., torch.Tensor]
    sorted_segment_range_max: Callable[..., torch.Tensor]
    sorted_segment_range_mean: Callable[..., torch.Tensor]
    sorted_segment_range_sum: Callable[..., torch.Tensor]
    sorted_segment_sum: Callable[..., torch.Tensor]
    sorted_segment_weighted_sum: Callable[..., torch.Tensor]
    sparse_lengths_mean: Callable[..., torch.Tensor]
    sparse_lengths_positional_weighted_sum: Callable[..., torch.Tensor]
    sparse_lengths_sum: Callable[..., torch.Tensor]
    sparse_lengths_weighted_sum: Callable[..., torch.Tensor]
    sparse_sorted_segment_max: Callable[..., torch.Tensor]
    sparse_sorted_segment_mean: Callable[..., torch.Tensor]
    sparse_sorted_segment_min: Callable[..., torch.Tensor]
    sparse_sorted_segment_sum: Callable[..., torch.Tensor]
    sparse_sorted_segment_weighted_sum: Callable[..., torch.Tensor]
    sparse_unsorted_segment_max: Callable[..., torch.Tensor]
    sparse_unsorted_segment_mean: Callable[..., torch.Tensor]
    sparse_unsorted_segment_min: Callable[..., torch.Tensor]
    sparse_unsorted_segment_sum: Callable[..., torch.Tensor]
    sparse_unsorted_segment_weighted_sum: Callable[..., torch.Tensor]
    unsorted_segment_max: Callable[..., torch.Tensor]
    unsorted_segment_mean: Callable[..., torch.Tensor]
    unsorted_segment_min: Callable[..., torch.Tensor]
    unsorted_segment_sum: Callable[..., torch.Tensor]
    unsorted_segment_weighted_sum: Callable[..., torch.Tensor]

__all__ = [
    "lengths_to_segment_ids",
    "segment_ids_to_lengths",
    "segment_ids_to_offsets",
    "lengths_to_offsets",
    "offsets_to_lengths",
    "lengths_to_ranges",
    "segment_ids_to_ranges",
    "lengths_to_weights",
    "lengths_range_fill",
    "lengths_tile",
    "lengths_gather",
    "gather_ranges",
    "pack_segments",
    "unpack_segments",
    "sparse_to_dense",
    "lengths_top_k",
    "reduce",
    "SEGMENT_REDUCERS",
    "SegmentReducer",
    "gather",
    "scatter_assign",
    "scatter_weighted_sum",
    "set_backend",
    "use_backend",
    "compiled_available",
    "sparse_adagrad",
    "rowwise_sparse_adagrad",
    "sparse_ftrl",
    "SparseAdagrad",
    "SparseFtrl",
    "to_sparse_csr",
    "from_sparse_csr",
    "ids_to_sparse",
    "csr_row_reduce",
    "KeyedJaggedBatch",
    "ALIASES",
    *ALIASES,
]
