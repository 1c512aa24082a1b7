"""sparsefill: sparse tensors with fill values, a drop-in replacement for dense PyTorch tensors.

>>> import torch, sparsefill
>>> signal = sparsefill.sparse_coo_tensor([[3, 8, 9, 17]], [7., 6., 8., 9.], (20,), fill_value=5.)
>>> signal.to_dense()[:5]
tensor([5., 5., 5., 7., 5.])
"""

from sparsefill._tensor.fill import indefinite
from sparsefill._creation.constructors import (
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
from sparsefill._creation.interop import (
    from_pandas,
    from_pydata,
    from_scipy,
    to_pandas,
    to_pydata,
    to_scipy,
)
from sparsefill._tensor.policy import (
    DensifyError,
    DensifyWarning,
    densify_policy,
    get_densify_policy,
    set_densify_policy,
)
from sparsefill._tensor.tensor import SparseTensor
from sparsefill._explain import explain

# The imports below run for their side effects, in this order: ``ops`` fills the op registry and
# installs the op layer into SparseTensor, ``_compile._install`` records the sparsefill.masked entry
# points for torch.compile (once torch._dynamo loads), ``data`` registers the DataLoader collate.
from sparsefill import ops  # noqa: F401
from sparsefill.ops.order.sort import topk  # (with a sparse output option)
from sparsefill import masked  # noqa: F401
from sparsefill._compile import dynamo as _compile

_compile._install()
# sparsefill.segment: the Caffe2 segment operations
from sparsefill import segment  # noqa: F401, E402

# sparsefill.data: DataLoader collate, registered on import
from sparsefill import data  # noqa: F401, E402

# sparsefill.nn: SparseParameter, SparseLinear
from sparsefill import nn  # noqa: F401, E402

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
    "explain",
    "topk",
]
