"""Sliding windows along the last dim: ``avg_pool1d`` and ``conv1d`` of a SparseTensor, forward and
backward.

A window of a signal with fill ``c`` that holds no stored element has the interior value ``op(c,
..., c)``; only the windows within reach of a stored element, and those that touch the padding at
either end, differ.  So, for ``X`` of shape ``(..., L)`` (every dim sparse) with stored positions
``P`` per row::

    avg_pool1d(X, w, s, p)[..., o] == mean(Xpad[..., o*s - p : o*s - p + w])
                                   == fill  unless the window meets P or the padding
    conv1d(X, W, b, s, p, d)[n, co, o]
        == b[co] + sum_{ci,j} W[co, ci, j] * Xpad[n, ci, o*s - p + d*j]

The result stores the union of the windows over the stored elements and the edge windows: at most
``nse * w / s + rows * 2 * (p / s + 1)`` elements, in runs of consecutive outputs (no sort: the
sources come sorted).  A moving sum (``avg_pool``; ``conv1d`` with one weight for all taps, one
channel per group) is ``_core._windowed``: with numba on the CPU (the segment backend's policy,
``sparsefill.segment. set_backend``) one compiled pass finds the runs and a second keeps each
output's window sum by two pointers over the sorted sources, writing the result's index directly
(``_kernels``); else torch ops, the union (``_union``) and a difference of prefix sums over one
buffer of the runs (``_window_sums``): O(nse + outputs) either way.  Any other kernel scatters its
(element, tap) pairs: O(nse * w * channels).  The gradients are the transposed windows of the
gradient's stored elements (as sparse as it is) and a closed form for the fill; ``conv1d``'s weight
gradient adds the stored pairs (a lookup per (element, tap)).  Where the result is dense by nature
-- per output channel interiors that differ, a stride that does not divide the window with a nonzero
gradient fill -- it is returned dense (forward) or with every element stored (backward); a kernel
whose pairs would outnumber 8 times the dense operand's elements (their index arrays would take more
memory than the dense way).

>>> import torch, torch.nn.functional as F, sparsefill
>>> x = sparsefill.sparse_coo_tensor([[3]], [8.], (8,), fill_value=5.)
>>> y = F.avg_pool1d(x[None, None], 3, stride=1)[0, 0]
>>> y.indices().tolist(), y.values().tolist(), float(y.fill_value())
([[1, 2, 3]], [6.0, 6.0, 6.0], 5.0)
>>> torch.equal(y.to_dense(), F.avg_pool1d(x.to_dense()[None, None], 3, stride=1)[0, 0])
True

Supported natively: ``avg_pool2d`` with a kernel of height 1 (what ``avg_pool1d`` calls; every
stride, padding, ``ceil_mode``, ``count_include_pad``, ``divisor_override``; any fill, NaN and inf
included); ``convolution`` in 1-D (not transposed; dense weight and bias; stride, padding, dilation,
groups; a finite fill).  A floating dtype, every dim sparse -- or, for ``avg_pool``, a hybrid tensor
whose dense dims hold the window (the op then runs on every stored slice and on the fill: any 2-d
window over the last two dense dims).  Anything else goes to the densify fallback (exact); an
indefinite fill raises (a window over masked-out elements has no dense meaning).
"""

from sparsefill.ops.windows import convolution, pooling  # noqa: F401  (register the handlers)
