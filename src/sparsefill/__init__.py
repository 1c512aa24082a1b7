"""sparsefill: sparse tensors with fill values, a drop-in replacement for dense PyTorch tensors.

>>> import torch, sparsefill
>>> signal = sparsefill.sparse_coo_tensor([[3, 8, 9, 17]], [7., 6., 8., 9.], (20,), fill_value=5.)
>>> signal.to_dense()[:5]
tensor([5., 5., 5., 7., 5.])
"""

from ._creation import (
    indefinite,
    empty,
    empty_like,
    eye,
    from_torch,
    full,
    full_like,
    ones,
    ones_like,
    sparse_coo_tensor,
    sparse_csr_tensor,
    to_sparse,
    to_torch,
    zeros,
    zeros_like,
)
from ._interop import from_pandas, from_pydata, from_scipy, to_pandas, to_pydata, to_scipy
from ._policy import (
    DensifyError,
    DensifyWarning,
    densify_policy,
    get_densify_policy,
    set_densify_policy,
)
from ._tensor import SparseTensor
from ._explain import explain  # noqa: E402  (which stage computes an op: sparsefill.explain)
from . import ops  # noqa: F401  (fills the op registry)
from .ops.sorting import topk  # noqa: E402  (topk with a sparse output option)
from . import masked  # noqa: F401,E402  (sparsefill.masked)
from . import _compile  # noqa: E402

_compile._install()  # (torch.compile: sparsefill.masked entry points recorded whole, once torch._dynamo loads)
from . import segment  # noqa: F401  (sparsefill.segment: the Caffe2 segment operations)
from . import data  # noqa: F401  (sparsefill.data: DataLoader collate of SparseTensors, registered on import)
from . import nn  # noqa: F401,E402  (sparsefill.nn: SparseParameter, SparseLinear: sparse weights of fixed pattern)

__version__ = "0.1.0"

__all__ = [
    "SparseTensor",
    "indefinite",
    "sparse_coo_tensor",
    "sparse_csr_tensor",
    "to_sparse",
    "from_torch",
    "to_torch",
    "from_scipy",
    "to_scipy",
    "from_pydata",
    "to_pydata",
    "from_pandas",
    "to_pandas",
    "full",
    "zeros",
    "ones",
    "empty",
    "eye",
    "full_like",
    "zeros_like",
    "ones_like",
    "empty_like",
    "DensifyWarning",
    "DensifyError",
    "densify_policy",
    "set_densify_policy",
    "get_densify_policy",
    "topk",
]
