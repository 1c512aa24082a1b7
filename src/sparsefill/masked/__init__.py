"""``sparsefill.masked``: ``torch.masked`` reductions and normalizations for every layout.

Same names, signatures and results as ``torch.masked.<op>`` on strided tensors
(masked-reductions-rfc.md); inputs and masks may each be strided, torch native sparse (COO, CSR)
or SparseTensors (COO, CSR, hybrid, any fill).  Invariant, for every op and layout::

    densify(masked.op(input, ..., mask=mask))[p] == torch.masked.op(dense(input), ..., mask=dense(mask))[p]

at every output position ``p`` with at least one masked-in element.  A sparse input is never
densified: work and memory are O(nse of input and mask + size of output), and the result has the
input's layout.  A SparseTensor with indefinite fill is a masked tensor: its pattern is the mask
(``mask=None`` works; a mask given too is intersected with it).

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor([[0, 0, 1], [0, 2, 1]], [-3., -1., 1.], (2, 3), fill_value=sparsefill.indefinite)
>>> sparsefill.masked.sum(A, 1).to_dense()
tensor([-4.,  1.])
"""

from ._elementwise import logaddexp
from ._masks import coo_mask, csr_mask, input_mask, output_mask, pattern_mask
from ._normalizations import cumprod, cumsum, log_softmax, normalize, softmax, softmin
from ._reductions import amax, amin, argmax, argmin, logsumexp, mean, median, norm, prod, std, sum, var

__all__ = ["sum", "prod", "cumsum", "cumprod", "amax", "amin", "argmax", "argmin", "mean", "median", "norm", "var",
           "std", "logsumexp", "logaddexp", "softmax", "log_softmax", "softmin", "normalize",
           "input_mask", "output_mask", "pattern_mask", "coo_mask", "csr_mask"]
