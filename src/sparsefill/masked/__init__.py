"""``sparsefill.masked``: ``torch.masked`` reductions and normalizations for every layout.

Same names, signatures and results as ``torch.masked.<op>`` on strided tensors
(torch.masked); inputs and masks may each be strided, torch native sparse (COO, CSR)
or SparseTensors (COO, CSR, hybrid, any fill).  Invariant, for every op and layout (the drop-in
promise)::

    densify(masked.op(input, ..., mask=mask))[p]
        == torch.masked.op(dense(input), ..., mask=dense(mask))[p]

at every output position ``p``, fully masked-out slices and masked-out elements of normalizations
included (each op's docstring says which value they read).

* Strided input: exactly ``torch.masked.<op>`` (a sparse mask is read densely).
* Sparse input: never densified; work and memory O(nse of input and mask + size of output). The mask
  is combined with the input's pattern into the union pattern ``P`` (``_canon``,
  masked-reductions-on-sparse.md's ``input_mask3``; elements outside ``P`` are all masked in or all
  masked out), and each slice is reduced over its stored elements plus, in closed form, its ``n``
  unspecified ones (``_slices``, the reducer protocol of ``sparsefill._kernels.reducer``
  with fill tables).  A strided mask is read at the input's positions (O(nse)); the unspecified
  elements it masks in are counted per output slice for reductions (O(mask + output) memory, never
  joined) and joined to ``P`` for normalizations and argmax/argmin (whose results need their
  positions); a sparse mask costs O(its nse).  The result is a SparseTensor with the input's layout
  (also for torch native inputs, whose zero-fill type cannot hold e.g. the -inf of an empty amax
  slice): reductions specify the slices that meet ``P`` and take the value of the other slices as
  fill; normalizations keep ``P`` and choose their fill by counts (``_normalizations``: the value
  most unspecified elements read; the others are stored).  Results with no sparse dim left are
  strided tensors.
* ``mask=None``: every element is masked in, unspecified ones with the fill's value.  A
  SparseTensor with indefinite fill is a masked tensor: its pattern is the mask (``mask=None``
  works; a mask given too is intersected with it), and normalizations return its pattern with an
  indefinite fill.
* Autograd as ``torch.masked`` on dense inputs: gradients reach a SparseTensor's values and fill
  (``_apply``); they are sparse unless unspecified elements are masked in.

Helpers: ``input_mask``/``output_mask`` (the canonical masks in the input's layout),
``pattern_mask`` (True at a sparse tensor's specified elements), ``coo_mask``/``csr_mask``.

>>> import torch, sparsefill
>>> A = sparsefill.sparse_coo_tensor(
...     [[0, 0, 1], [0, 2, 1]], [-3.0, -1.0, 1.0], (2, 3), fill_value=sparsefill.indefinite
... )
>>> sparsefill.masked.sum(A, 1).to_dense()
tensor([-4.,  1.])
>>> sparsefill.masked.softmax(A, 1)._values()
tensor([0.1192, 0.8808, 1.0000])
"""

from sparsefill.masked._elementwise import logaddexp
from sparsefill.masked._layers import (
    batch_norm,
    cross_entropy,
    group_norm,
    instance_norm,
    layer_norm,
    local_response_norm,
    nll_loss,
)
from sparsefill.masked._masks import coo_mask, csr_mask, input_mask, output_mask, pattern_mask
from sparsefill.masked._normalizations import (
    cumprod,
    cumsum,
    log_softmax,
    normalize,
    softmax,
    softmin,
)
from sparsefill.masked._masked_reductions import (
    amax,
    amin,
    argmax,
    argmin,
    logsumexp,
    mean,
    median,
    norm,
    prod,
    std,
    sum,
    var,
)

__all__ = [
    "sum",
    "prod",
    "cumsum",
    "cumprod",
    "amax",
    "amin",
    "argmax",
    "argmin",
    "mean",
    "median",
    "norm",
    "var",
    "std",
    "logsumexp",
    "logaddexp",
    "softmax",
    "log_softmax",
    "softmin",
    "normalize",
    "layer_norm",
    "group_norm",
    "instance_norm",
    "batch_norm",
    "local_response_norm",
    "cross_entropy",
    "nll_loss",
    "input_mask",
    "output_mask",
    "pattern_mask",
    "coo_mask",
    "csr_mask",
]
