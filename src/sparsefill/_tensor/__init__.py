"""The data class: :class:`SparseTensor`, its fill value, the densify policy, validation of stored
parts and the storage algebra on them (``parts``, ``dense_dims``).

This layer imports only the kernels; it reaches the layers above through one seam, the hook table
``hooks.HOOKS`` that they fill when they load (``docs/architecture.md``).

``sparsefill._tensor.SparseTensor`` and ``sparsefill._tensor._rebuild`` are the names that pickles
and ``torch.save`` files of every version refer to.
"""

from sparsefill._tensor.tensor import SparseTensor, _rebuild

__all__ = ["SparseTensor", "_rebuild"]
