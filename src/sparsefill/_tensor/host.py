"""The host and process side of a SparseTensor: dense exports (numpy, lists, scipy, pydata, pandas),
pickling and ``torch.multiprocessing`` (its inner tensors, never a dense one), shared and pinned
memory, deep copies.

A mixin of :class:`sparsefill.SparseTensor` (``class SparseTensor(HostMixin, torch.Tensor)``), apart
from the storage class so that each reads in one sitting.  The invariants::

    A.numpy() == A.to_dense().numpy()            (a new array, under the densify policy)
    pickle.loads(pickle.dumps(A)) == A    (same layout, pattern, values and fill: its inner tensors)
    A.share_memory_().values().is_shared()    (every inner tensor moves; in-place ops write through)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.types import Device

if TYPE_CHECKING:
    import numpy as np

    from sparsefill._tensor.tensor import SparseTensor

__all__ = ["HostMixin"]


class HostMixin:
    """Host-side methods of :class:`sparsefill.SparseTensor` (see the module docstring)."""

    def _densify_for(self, what: str) -> torch.Tensor:
        """``A.to_dense()`` without autograd, for an export that is dense by its type: under the
        densify policy."""
        self._sync()
        from sparsefill._tensor.parts import dense_of
        from sparsefill._tensor.policy import check_densify

        if self._indefinite:
            raise ValueError(
                f"{what} of a SparseTensor with indefinite fill: its unspecified elements have "
                "no value; give them one first, e.g. A.to_dense(fill_value=0)"
            )
        check_densify(what, self.numel() * self.element_size())
        return dense_of(self).detach()

    def numpy(self, *, force: bool = False) -> np.ndarray:
        """The dense array ``A`` stands for: ``A.numpy() == A.to_dense().numpy()``, a new array
        (writing to it leaves ``A`` unchanged), under the densify policy (DensifyWarning;
        DensifyError past its byte limit).

        As torch, a tensor that requires grad or is not on the CPU raises unless ``force=True``
        (``A.detach().cpu().numpy()``).  ``np.asarray(A)`` and ``A.tolist()`` are the same array.

        >>> import numpy as np, sparsefill
        >>> A = sparsefill.sparse_coo_tensor([[1]], [7.], (3,), fill_value=5.)
        >>> with sparsefill.densify_policy("allow"):
        ...     A.numpy(), np.asarray(A, dtype=np.int64), A.tolist()
        (array([5., 7., 5.], dtype=float32), array([5, 7, 5]), [5.0, 7.0, 5.0])
        """
        if not force and self.requires_grad:
            raise RuntimeError(
                "Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() "
                "instead."
            )
        if not force and self.device.type != "cpu":
            raise TypeError(
                f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to "
                "copy the tensor to host memory first."
            )
        return self._densify_for("numpy()").cpu().resolve_conj().resolve_neg().numpy()

    def __array__(self, dtype=None, copy=None):
        """``np.asarray(A, dtype)``: ``A.numpy()``; always a new array, so ``copy=False`` raises
        (numpy 2's rule)."""
        if copy is False:
            raise ValueError(
                "np.asarray(A, copy=False): a SparseTensor has no dense buffer to share; its "
                "dense array is always a new one (pass copy=None or copy=True)"
            )
        out = self.numpy()
        return out if dtype is None else out.astype(dtype, copy=False)

    def tolist(self) -> Any:
        """``A.to_dense().tolist()``, under the densify policy (as torch, also when ``A`` requires
        grad)."""
        return self._densify_for("tolist()").tolist()

    def to_scipy(self, format: str | None = None) -> Any:
        """A scipy.sparse array (``A``'s fill must be 0), never densifying; see
        :func:`sparsefill.to_scipy`."""
        from sparsefill._tensor.tensor import HOOKS

        return HOOKS.to_scipy(self, format)

    def to_pydata(self, format: str | None = None) -> Any:
        """A pydata ``sparse.COO``/``GCXS`` with ``A``'s fill, never densifying; see
        :func:`sparsefill.to_pydata`."""
        from sparsefill._tensor.tensor import HOOKS

        return HOOKS.to_pydata(self, format)

    def to_pandas(self) -> Any:
        """A pandas ``SparseArray`` (1-D) or sparse ``DataFrame`` (2-D) with ``A``'s fill; see
        :func:`sparsefill.to_pandas`."""
        from sparsefill._tensor.tensor import HOOKS

        return HOOKS.to_pandas(self)

    def _rebuild_args(self, fn=lambda t: t):
        names, ctx = self.__tensor_flatten__()
        return (
            tuple(self.shape),
            {n: fn(getattr(self, n)) for n in names},
            ctx,
            self.requires_grad,
        )

    def __reduce_ex__(self, proto):
        """Pickled as its inner tensors: ``torch.save`` stores them, ``torch.multiprocessing``
        (queues, spawn, DataLoader workers) sends them by torch's shared-memory reductions, never as
        a dense tensor."""
        from sparsefill._tensor.tensor import (
            _STATE,
            TRANSIENT,
            _rebuild,
        )  # pickles name sparsefill._tensor._rebuild

        extra = {
            k: v
            for k, v in self.__dict__.items()  # e.g. _is_param of nn.Parameter(A)
            if k not in _STATE and k not in TRANSIENT
        }
        return (_rebuild, self._rebuild_args(torch.Tensor.detach) + ((extra,) if extra else ()))

    def _inner(self) -> list:
        return [getattr(self, n) for n in self.__tensor_flatten__()[0]]

    def share_memory_(self) -> SparseTensor:
        """Move the inner tensors (indices or crow/col, values, fill) to shared memory, in place;
        returns ``self``.

        As for a dense tensor, tensors sharing storage with them (views, aliases) are shared too,
        and an in-place op that replaces the storage (a new pattern) leaves the new storage
        unshared.

        >>> import sparsefill
        >>> A = sparsefill.sparse_coo_tensor(
        ...     [[0, 2]], [1.0, 2.0], (4,), fill_value=3.0
        ... ).share_memory_()
        >>> A.is_shared(), A.values().is_shared()
        (True, True)
        """
        for t in self._inner():
            t.share_memory_()
        return self

    def is_shared(self) -> bool:
        """True when every inner tensor is in shared memory (``share_memory_``) or on an
        accelerator."""
        return all(t.is_shared() for t in self._inner())

    def is_pinned(self, device: Device = None) -> bool:
        """True when every inner tensor is in pinned (page-locked) host memory."""
        return all(t.is_pinned() if device is None else t.is_pinned(device) for t in self._inner())

    def pin_memory(self, device: Device = None) -> SparseTensor:
        """A copy with its inner tensors in pinned memory (as ``Tensor.pin_memory``: differentiable,
        and a RuntimeError where torch has no accelerator)."""
        return _Pin.apply(self, device)

    def _write_shared_(self, new: SparseTensor) -> bool:
        """Store ``new`` (same shape and dtype) in this tensor's own storage when that is shared
        memory and ``new`` has its pattern: values and fill are copied in, so that other processes
        see an in-place op as for a dense tensor (Hogwild training after ``module.share_memory()``).
        False, having written nothing, otherwise (the caller then takes ``new``'s tensors, which are
        not shared)."""
        if (
            not self._vals.untyped_storage().is_shared()
            or not self._vals.is_cpu
            or self._vals.is_inference()
            or (new._sf_layout, new._indefinite, new._coalesced)
            != (self._sf_layout, self._indefinite, self._coalesced)
        ):
            return False
        names = ("_idx",) if self._sf_layout is torch.sparse_coo else ("_crow", "_col")
        pairs = [(getattr(self, n), getattr(new, n)) for n in names + ("_vals", "_fill")]
        if (
            any(a.shape != b.shape or a.dtype != b.dtype for a, b in pairs)
            or any(a is not b and not torch.equal(a, b) for a, b in pairs[:-2])
            or any(a is not b and torch._debug_has_internal_overlap(a) != 0 for a, b in pairs[-2:])
        ):
            return False
        for a, b in pairs[-2:]:
            if a is not b:
                a.copy_(
                    b.clone()
                    if a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
                    else b
                )
        return True

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        import copy
        from sparsefill._tensor.tensor import _STATE, TRANSIENT, _rebuild

        size, inner, ctx, rg = self._rebuild_args(lambda t: copy.deepcopy(t.detach(), memo))
        new = _rebuild(size, inner, ctx, rg)
        memo[id(self)] = new
        for k, v in self.__dict__.items():  # e.g. _is_param of nn.Parameter(A); a copy is no view
            if k not in _STATE and k not in TRANSIENT:
                setattr(new, k, copy.deepcopy(v, memo))
        return new


class _Pin(torch.autograd.Function):
    """``A.pin_memory()``: the inner tensors pinned; the gradient passes through unchanged."""

    @staticmethod
    def forward(ctx, A, device):
        pin = (lambda t: t.pin_memory()) if device is None else (lambda t: t.pin_memory(device))
        names, meta = A.__tensor_flatten__()
        return type(A).__tensor_unflatten__(
            {n: pin(getattr(A, n)) for n in names}, meta, A.shape, None
        )

    @staticmethod
    def backward(ctx, grad):
        return grad, None
