"""Sparse weights whose pattern never changes: :class:`SparseParameter` and :class:`SparseLinear`.

``nn.Parameter(A)`` of a SparseTensor has dense semantics: its gradient is the gradient of the
dense tensor ``A.to_dense()``, nonzero almost everywhere, so one optimizer step specifies every
element (4000 x 4000 at 0.5%: 80k stored values become 16M).  A weight with a *fixed pattern*
is trained instead through its parts: the stored values (and optionally the fill) are
``nn.Parameter``s, the pattern is a buffer, and the SparseTensor is rebuilt on access by the
differentiable constructors.  For a loss ``L`` of ``W = P()``, pattern ``S``::

    P.values.grad[n] = dL/dW[indices[:, n]]                          (each stored element)
    P.fill.grad      = sum(dL/dW[i] for i not in S)                  (when the fill trains)

the gradient that ``torch.sparse.mm`` gives a native sparse weight, plus the fill's.  The
matrix products (``F.linear``, ``@``, ``mm``, ``addmm``...) compute both without the dense
``dL/dW`` (``ops/linalg/backward.py``: the values' gradient is the sampled product at ``S``,
the fill's a closed form): a training step costs O(nse + batch x features).  This holds for the
weight used as it is in a product (``W @ X``, ``x @ W.T``, ``F.linear``, ``torch.sparse.mm``,
``addmm``, ``einsum``); an element-wise op on ``W`` before the product (``(2 * W) @ X``) or a
penalty computed on ``W`` (``W.square().sum()``) still gets torch's dense gradient of ``W``: scale
the output instead, and penalise ``values`` (or use the optimizer's ``weight_decay``).

The fill is frozen by default (a buffer, as the zeros of a pruned weight or of
``torch.sparse.mm``): ``train_fill=True`` makes it a parameter.  An indefinite fill
(``sparsefill.indefinite``) has no value to train.

>>> import torch, sparsefill
>>> torch.manual_seed(0) and None
>>> lin = sparsefill.nn.SparseLinear(6, 4, density=0.25)          # y = x @ W^T + b, W sparse (4, 6)
>>> opt = torch.optim.Adam(lin.parameters(), lr=0.1)
>>> x = torch.randn(8, 6)
>>> lin(x).square().sum().backward(); opt.step()
>>> lin.weight._nse(), lin.sparse_weight.values.shape             # the pattern kept its 6 elements
(6, torch.Size([6]))
>>> [n for n, _ in lin.named_parameters()]                         # the fill is a buffer by default
['bias', 'sparse_weight.values']
"""

from __future__ import annotations

import math
import weakref
from typing import Any, cast

import torch
from torch import nn
from torch.types import Device

from sparsefill._creation import constructors as _creation
from sparsefill._creation.constructors import FillValue
from sparsefill._tensor.tensor import SparseTensor

__all__ = ["SparseParameter", "SparseLinear"]


def _as_sparse(data, name: str) -> SparseTensor:
    if isinstance(data, SparseTensor):
        return data
    if isinstance(data, torch.Tensor) and data.layout is not torch.strided:
        return _creation.from_torch(data)
    raise TypeError(
        f"{name} must be a sparsefill.SparseTensor or a torch sparse tensor, got "
        f"{type(data).__name__}{'' if not isinstance(data, torch.Tensor) else ' (strided)'}; "
        "use from_dense() for a dense tensor"
    )


class SparseParameter(nn.Module):
    """A trainable SparseTensor of fixed pattern: ``P()`` is ``A`` rebuilt from ``P.values`` and
    ``P.fill``.

    ``values`` (``(nse, *dense_shape)``, or ``(*batch, nse, *dense_shape)`` for batched CSR) is an
    ``nn.Parameter``; ``fill`` is a parameter when ``train_fill=True``, else a buffer; the pattern
    (``indices`` for COO, ``crow_indices``/``col_indices`` for CSR) is a buffer.  All of them are in
    ``state_dict()``; ``.to(dtype)``, ``deepcopy`` and ``torch.save`` work as for any module.
    ``P()`` equals ``A`` (``P().to_dense() == A.to_dense()``), coalesced, in ``A``'s layout; its
    gradients reach ``values`` at the stored elements and ``fill`` summed over the others (module
    docstring).  ``A`` is copied; a COO ``A`` is coalesced first (duplicates add up).

    >>> import torch, sparsefill
    >>> A = sparsefill.sparse_coo_tensor([[0, 1], [2, 0]], [1., 2.], (2, 3), fill_value=0.5)
    >>> P = sparsefill.nn.SparseParameter(A, train_fill=True)
    >>> (P() * torch.arange(6.).reshape(2, 3)).sum().backward()
    >>> P.values.grad, P.fill.grad  # dense gradient at (0, 2), (1, 0); the rest summed
    (tensor([2., 3.]), tensor(10.))
    """

    # (buffers and parameters, declared for type checkers: nn.Module keeps them in its dicts)
    indices: torch.Tensor
    crow_indices: torch.Tensor
    col_indices: torch.Tensor
    values: nn.Parameter
    fill: torch.Tensor
    _checked: Any

    def __init__(self, data: torch.Tensor, *, train_fill: bool = False) -> None:
        super().__init__()
        A = cast(SparseTensor, _as_sparse(data, "data").detach())
        if not (A.dtype.is_floating_point or A.dtype.is_complex):
            raise TypeError(
                f"SparseParameter needs a floating point or complex dtype to train, got {A.dtype}"
            )
        A = A.coalesce() if A.sparse_layout is torch.sparse_coo else A
        self.size, self.sparse_layout = tuple(A.shape), A.sparse_layout
        self.indefinite = A.is_fill_indefinite()
        if train_fill and self.indefinite:
            raise ValueError("train_fill=True: an indefinite fill has no value to train")
        if self.sparse_layout is torch.sparse_coo:
            self.register_buffer("indices", A.indices().clone())
        else:
            self.register_buffer("crow_indices", A.crow_indices().clone())
            self.register_buffer("col_indices", A.col_indices().clone())
        self.values = nn.Parameter(A._vals.clone())
        fill = A._fill_value().clone()
        if train_fill:
            self.fill = nn.Parameter(fill)
        else:
            self.register_buffer("fill", fill)
        self._checked = (
            None  # ((weakref to a buffer, its version), ...) of the index buffers last validated
        )

    @classmethod
    def from_sparse(cls, data: torch.Tensor, *, train_fill: bool = False) -> SparseParameter:
        """``SparseParameter(data)``: ``data`` a SparseTensor or a torch sparse tensor (COO,
        CSR...)."""
        return cls(data, train_fill=train_fill)

    @classmethod
    def from_dense(
        cls,
        x: torch.Tensor,
        *,
        fill_value: FillValue = 0.0,
        layout: torch.layout = torch.sparse_coo,
        dense_dim: int | None = None,
        train_fill: bool = False,
    ) -> SparseParameter:
        """The elements of ``x`` that differ from ``fill_value`` as the pattern
        (:func:`sparsefill.to_sparse`)."""
        if (
            not isinstance(x, torch.Tensor)
            or isinstance(x, SparseTensor)
            or x.layout is not torch.strided
        ):
            raise TypeError(
                f"from_dense: x must be a dense (strided) torch.Tensor, got {type(x).__name__}"
                + (f" of layout {x.layout}" if isinstance(x, torch.Tensor) else "")
            )
        A = _creation.to_sparse(
            x.detach(), fill_value=fill_value, layout=layout, dense_dim=dense_dim
        )
        return cls(A, train_fill=train_fill)

    @property
    def shape(self) -> torch.Size:
        return torch.Size(self.size)

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    @property
    def device(self) -> torch.device:
        return self.values.device

    def _index_buffers(self):
        if self.sparse_layout is torch.sparse_coo:
            return (self.indices,)
        return (self.crow_indices, self.col_indices)

    def forward(self) -> SparseTensor:
        """The SparseTensor, differentiable with respect to ``values`` (and ``fill``)."""
        fill = _creation.indefinite if self.indefinite else self.fill
        bufs = self._index_buffers()
        check = self._checked is None or any(
            b is not c() or b._version != v for b, (c, v) in zip(bufs, self._checked)
        )
        # a new pattern (load_state_dict...): validated once
        key = tuple((weakref.ref(b), b._version) for b in bufs)
        if self.sparse_layout is torch.sparse_coo:
            A = _creation.sparse_coo_tensor(
                bufs[0],
                self.values,
                self.size,
                fill_value=fill,
                is_coalesced=True,
                check_invariants=check,
            )
        else:
            A = _creation.sparse_csr_tensor(
                bufs[0], bufs[1], self.values, self.size, fill_value=fill, check_invariants=check
            )
        self._checked = key
        return A

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_checked"] = None  # weak references do not pickle; a copy validates its pattern once
        return state

    def extra_repr(self) -> str:
        fill = (
            "indefinite"
            if self.indefinite
            else ("trained" if isinstance(self.fill, nn.Parameter) else "frozen")
        )
        nse = (
            self.indices.shape[1]
            if self.sparse_layout is torch.sparse_coo
            else self.col_indices.shape[-1]
        )
        return f"size={self.size}, nse={nse}, layout={self.sparse_layout}, fill={fill}"


def _random_pattern(out_features: int, in_features: int, density: float, device) -> torch.Tensor:
    """``round(density * out * in)`` distinct positions, uniform (global RNG), as sorted ``(2,
    nse)`` indices."""
    n = out_features * in_features
    k = min(n, max(1 if n else 0, round(density * n)))
    if 4 * k >= n:
        keys = torch.randperm(n, device=device)[:k]
    else:  # a uniform random set of >= k distinct keys, then a uniform k-subset of it
        keys = torch.empty(0, dtype=torch.int64, device=device)
        while keys.numel() < k:
            keys = torch.cat([keys, torch.randint(n, (k + k // 8 + 16,), device=device)]).unique()
        keys = keys[torch.randperm(keys.numel(), device=device)[:k]]
    keys = keys.sort().values
    return torch.stack([keys // in_features, keys % in_features])


def _pattern_indices(pattern, shape, device) -> torch.Tensor:
    """``(2, nse)`` indices from a bool mask of ``shape``, integer indices ``(2, nse)`` or a sparse
    tensor."""
    if (
        isinstance(pattern, SparseTensor)
        or isinstance(pattern, torch.Tensor)
        and pattern.layout is not torch.strided
    ):
        A = _as_sparse(pattern, "pattern")
        if tuple(A.shape) != shape:
            raise ValueError(
                f"pattern has shape {tuple(A.shape)}, expected (out_features, in_features) = "
                f"{shape}"
            )
        return A.to_sparse(torch.sparse_coo).coalesce().indices().to(device)
    p = torch.as_tensor(pattern, device=device)
    if p.dtype == torch.bool:
        if tuple(p.shape) != shape:
            raise ValueError(
                f"pattern mask has shape {tuple(p.shape)}, expected (out_features, in_features) "
                f"= {shape}"
            )
        return p.nonzero().T.contiguous()
    if p.dtype.is_floating_point or p.dtype.is_complex or p.dim() != 2 or p.shape[0] != 2:
        raise ValueError(
            f"pattern must be a bool mask of shape {shape}, integer indices of shape (2, nse) or a "
            f"sparse tensor; got dtype {p.dtype}, shape {tuple(p.shape)}"
        )
    p = p.long()
    ones = torch.ones(p.shape[1], dtype=torch.float32, device=device)
    A = _creation.sparse_coo_tensor(p, ones, shape)  # validates the bounds
    return A.coalesce().indices()


class SparseLinear(nn.Module):
    """``y = x @ W^T + b`` with a sparse weight ``W`` ``(out_features, in_features)`` of fixed
    pattern.

    As ``nn.Linear`` (input ``(*, in_features)``, output ``(*, out_features)``), with ``W`` a
    :class:`SparseParameter` (``self.sparse_weight``; ``self.weight`` is the SparseTensor ``W``,
    rebuilt on access).  The pattern is ``round(density * out * in)`` distinct uniform random
    positions (global RNG), or ``pattern``: a bool mask ``(out, in)``, integer indices ``(2, nse)``
    or a sparse tensor.  Unspecified elements of ``W`` equal ``fill_value`` (frozen unless
    ``train_fill=True``).  Initialisation: ``nn.Linear``'s ``U(-1/sqrt(k), 1/sqrt(k))`` for the
    stored values and the bias, with ``k = nse / out_features`` the mean number of stored elements
    per output (``in_features`` for a dense ``W``), so that outputs keep ``nn.Linear``'s scale at
    any density.  Forward and backward cost O(nse + batch x features): no dense ``W`` nor dense
    gradient of ``W`` is formed.  Under ``torch.autocast`` it computes as ``nn.Linear`` does (``W``,
    its fill and the bias cast: a bfloat16 output; float32 gradients).

    >>> import torch, sparsefill
    >>> torch.manual_seed(0) and None
    >>> lin = sparsefill.nn.SparseLinear(1000, 500, density=0.01)
    >>> lin.weight._nse(), lin(torch.randn(64, 1000)).shape
    (5000, torch.Size([64, 500]))
    >>> W = lin.weight.detach().to_dense()
    >>> x = torch.randn(2, 1000)
    >>> torch.testing.assert_close(lin(x), x @ W.T + lin.bias)
    """

    sparse_weight: SparseParameter
    bias: nn.Parameter | None

    def __init__(
        self,
        in_features: int,
        out_features: int,
        density: float | None = None,
        bias: bool = True,
        *,
        pattern: torch.Tensor | None = None,
        fill_value: FillValue = 0.0,
        layout: torch.layout = torch.sparse_coo,
        train_fill: bool = False,
        device: Device = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        for name, v in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be a non-negative int, got {v!r}")
        if (density is None) == (pattern is None):
            raise ValueError("SparseLinear: pass exactly one of density= and pattern=")
        if density is not None and not (isinstance(density, (int, float)) and 0 < density <= 1):
            raise ValueError(f"density must be in (0, 1], got {density!r}")
        if layout not in (torch.sparse_coo, torch.sparse_csr):
            raise ValueError(f"layout must be torch.sparse_coo or torch.sparse_csr, got {layout}")
        self.in_features, self.out_features = in_features, out_features
        dtype = dtype or torch.get_default_dtype()
        shape = (out_features, in_features)
        idx = (
            _random_pattern(out_features, in_features, cast(float, density), device)
            if pattern is None
            else _pattern_indices(pattern, shape, device)
        )
        vals = torch.empty(idx.shape[1], dtype=dtype, device=device)
        fill = (
            fill_value
            if fill_value is _creation.indefinite
            else torch.as_tensor(fill_value, dtype=dtype, device=device)
        )
        W = _creation.sparse_coo_tensor(idx, vals, shape, fill_value=fill, is_coalesced=True)
        self.sparse_weight = SparseParameter(W.to_sparse(layout), train_fill=train_fill)
        self.register_parameter(
            "bias",
            nn.Parameter(torch.empty(out_features, dtype=dtype, device=device)) if bias else None,
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``U(-1/sqrt(k), 1/sqrt(k))`` for the stored values and the bias, ``k = nse /
        out_features``."""
        k = self.sparse_weight.values.numel() / max(1, self.out_features)
        bound = 1 / math.sqrt(k) if k > 0 else 0.0
        with torch.no_grad():
            self.sparse_weight.values.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)

    @property
    def weight(self) -> SparseTensor:
        """``W`` ``(out_features, in_features)``, a SparseTensor rebuilt from ``sparse_weight``."""
        return self.sparse_weight()

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(input, self.sparse_weight(), self.bias)

    @classmethod
    def from_sparse(
        cls, weight: torch.Tensor, bias: torch.Tensor | None = None, *, train_fill: bool = False
    ) -> SparseLinear:
        """A SparseLinear of weight ``weight`` (SparseTensor or torch sparse, 2-d, its pattern and
        fill) and ``bias`` (copied; None: no bias)."""
        W = _as_sparse(weight, "weight").detach()
        if W.dim() != 2 or W.dense_dim():
            raise ValueError(
                "weight must be a 2-d sparse matrix without dense dims, got shape "
                f"{tuple(W.shape)} with {W.dense_dim()} dense dims"
            )
        if bias is not None and tuple(bias.shape) != (W.shape[0],):
            raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({W.shape[0]},)")
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.out_features, self.in_features = W.shape
        self.sparse_weight = SparseParameter(W, train_fill=train_fill)
        self.register_parameter(
            "bias", nn.Parameter(bias.detach().clone()) if bias is not None else None
        )
        return self

    @classmethod
    def from_dense(
        cls,
        weight: torch.Tensor | nn.Linear,
        bias: torch.Tensor | None = None,
        *,
        fill_value: FillValue = 0.0,
        layout: torch.layout = torch.sparse_coo,
        train_fill: bool = False,
    ) -> SparseLinear:
        """The elements of ``weight`` that differ from ``fill_value`` as the pattern; ``weight`` a
        dense ``(out, in)`` tensor or an ``nn.Linear`` (its weight and bias; ``bias`` must then be
        None)."""
        if isinstance(weight, nn.Linear):
            if bias is not None:
                raise ValueError(
                    "from_dense(nn.Linear, bias=...): the bias comes from the nn.Linear; pass "
                    "bias=None"
                )
            bias = weight.bias
            weight = weight.weight
        if (
            not isinstance(weight, torch.Tensor)
            or isinstance(weight, SparseTensor)
            or weight.layout is not torch.strided
            or weight.dim() != 2
        ):
            raise TypeError(
                "from_dense: weight must be a 2-d dense torch.Tensor or an nn.Linear, got "
                + (
                    f"shape {tuple(weight.shape)}, layout {weight.layout}, {type(weight).__name__}"
                    if isinstance(weight, torch.Tensor)
                    else type(weight).__name__
                )
            )
        W = _creation.to_sparse(weight.detach(), fill_value=fill_value, layout=layout)
        return cls.from_sparse(W, bias, train_fill=train_fill)

    def extra_repr(self) -> str:
        nse = self.sparse_weight.values.shape[0]
        dens = nse / max(1, self.in_features * self.out_features)
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, nse={nse} "
            f"({dens:.3g}), bias={self.bias is not None}"
        )
