"""Constructors: ``sparse_coo_tensor``, ``sparse_csr_tensor``, ``to_sparse``, ``from_torch`` and
factories.

Every constructor validates its input (errors name the argument and the numbers,
nothing passed in is modified) and is differentiable with respect to ``values``
and ``fill_value``.  Invariant::

    sparse_coo_tensor(i, v, size, fill_value=f).to_dense()[p]
        == sum(v[n] for n if i[:, n] == p)  if p in i
        == f                                otherwise
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.types import Device

from sparsefill._tensor import parts as _convert
from sparsefill._kernels import index as _index
from sparsefill._autograd.functions import Construct, SameDense, refuse_dual
from sparsefill._kernels.trace import inner_sizes, traced, tracing_mode
from sparsefill._tensor.tensor import SparseTensor, install_hooks


from sparsefill._tensor.fill import FillValue, Size, _array_fill, indefinite, normalize_fill
from sparsefill._tensor.validate import (
    _check_bounds,
    _check_crow,
    _check_rows_sorted,
    _first_unordered_column,
    _first_unsorted,
    _size_tuple,
)

__all__ = [
    "indefinite",
    "sparse_coo_tensor",
    "sparse_csr_tensor",
    "to_sparse",
    "from_torch",
    "to_torch",
    "full",
    "zeros",
    "ones",
    "empty",
    "eye",
    "full_like",
    "zeros_like",
    "ones_like",
    "empty_like",
]


def _index_tensor(x, name: str, device) -> torch.Tensor:
    t = (
        x
        if isinstance(x, torch.Tensor)
        else torch.as_tensor(x, dtype=torch.int64 if _is_empty_like(x) else None)
    )
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got dtype {t.dtype}")
    return t.to(device=device, dtype=torch.int64)


def _is_empty_like(x) -> bool:
    try:
        return len(x) == 0 or all(len(r) == 0 for r in x)
    except TypeError:
        return False


def _values_tensor(values, dtype, device, fill_value) -> torch.Tensor:
    # (conjugate/negative bits resolved: ops inside __torch_dispatch__ run
    if isinstance(values, torch.Tensor):
        # with those dispatch keys excluded and would read the raw data, A * 2 of values.conj()
        # conjugated)
        return (
            values.to(dtype=dtype or values.dtype, device=device or values.device)
            .resolve_conj()
            .resolve_neg()
        )
    v = torch.as_tensor(values)
    if (
        dtype is None
        and fill_value is not None
        and fill_value is not indefinite
        and not (isinstance(fill_value, (list, tuple)) and len(fill_value) == 0)
    ):
        f = fill_value if isinstance(fill_value, torch.Tensor) else torch.as_tensor(fill_value)
        dtype = (
            f.dtype
            if v.numel() == 0 or isinstance(fill_value, torch.Tensor)
            else torch.promote_types(v.dtype, f.dtype)
        )
    return v.to(dtype=dtype or v.dtype, device=device)


def _size_from_data(what: str) -> None:
    """While torch.compile traces, a size inferred from the indices would be a value read from data:
    a graph break (the constructor runs eagerly)."""
    if traced():
        sys.modules["torch._dynamo"].graph_break(
            msg=f"sparsefill.{what} with size=None reads the indices (pass size= to compile it)"
        )


def _build(make, values, fill, requires_grad: bool) -> SparseTensor:
    """Run ``make(values, fill)`` under autograd when either input requires grad."""
    refuse_dual("a sparsefill constructor", values, fill)
    if (
        torch.is_grad_enabled()
        and (values.requires_grad or fill.requires_grad)
        or _func_wrapped(values, fill)
    ):
        out = Construct.apply(values, fill, make)
    else:
        out = make(values.detach(), fill.detach())
    if requires_grad and not out.requires_grad:
        out.requires_grad_(True)
    return out


def _func_wrapped(*ts) -> bool:
    """A tensor of a torch.func transform (vmap's batched, jvp's dual): built through the
    autograd.Function, whose rules answer for the transform (never a SparseTensor holding the
    transform's wrapper inside)."""
    wrapped = torch._C._functorch.is_functorch_wrapped_tensor
    return torch._C._are_functorch_transforms_active() and any(map(wrapped, ts))


def _same_dense(x, fn):
    """``fn(x)`` (a conversion: the same dense tensor), differentiable.  While traced its inner
    data-dependent sizes may stay unbound (``_compile.inner_sizes``): dynamo runs a conversion
    method (``to_sparse_csr``) as one node of its graph, on fake tensors."""
    refuse_dual("a sparsefill conversion", x)
    if tracing_mode() is not None:
        with inner_sizes():
            return _same_dense_of(x, fn)
    return _same_dense_of(x, fn)


def _same_dense_of(x, fn):
    if torch.is_grad_enabled() and x.requires_grad or _func_wrapped(x):
        return SameDense.apply(x, fn)
    return fn(x.detach())


# ---------------------------------------------------------------------- constructors
def sparse_coo_tensor(
    indices: Any,
    values: Any,
    size: Size | None = None,
    *,
    fill_value: FillValue = None,
    dtype: torch.dtype | None = None,
    device: Device = None,
    requires_grad: bool = False,
    is_coalesced: bool | None = None,
    check_invariants: bool = True,
) -> SparseTensor:
    """COO SparseTensor, as :func:`torch.sparse_coo_tensor` plus ``fill_value``.

    ``indices``: ``(sparse_dim, nse)`` integers; ``values``: ``(nse, *dense_shape)``; duplicates add
    up. ``fill_value``: None (zero), a number, an array broadcasting to ``dense_shape``, or
    ``sparsefill.indefinite`` (also spelled ``[]``).

    ``check_invariants=True`` (the default) checks the indices against ``size`` and, unless
    ``is_coalesced=False``, whether they are sorted without duplicates: one vectorised O(nse) pass
    (a few reductions over ``indices``).  ``False`` skips it, as torch's switch: indices out of
    range then give undefined results (compiled kernels index memory with them).  Files, pickles,
    queues and collectives are always checked (:func:`check_parts`).

    >>> import sparsefill
    >>> A = sparsefill.sparse_coo_tensor([[0, 3]], [[.11, .12], [.31, .32]], (4, 2), fill_value=1.2)
    >>> A.fill_value(), A._fill_value()
    (tensor([1.2000, 1.2000]), tensor(1.2000))
    """
    values = _values_tensor(values, dtype, device, fill_value)
    idx = _index_tensor(indices, "indices", values.device)
    if idx.dim() != 2:
        raise ValueError(f"indices must be 2-D (sparse_dim, nse), got shape {tuple(idx.shape)}")
    if values.dim() == 0:
        raise ValueError("values must have at least one dim (nse, *dense_shape), got a 0-d tensor")
    sdim, nse = idx.shape
    if values.shape[0] != nse:
        raise ValueError(
            f"values has {values.shape[0]} rows (shape {tuple(values.shape)}) but indices has "
            f"nse={nse} columns"
        )
    dense_shape = tuple(values.shape[1:])
    if size is None:
        _size_from_data("sparse_coo_tensor")
        _check_bounds(idx, [_index._INT64_MAX] * sdim, "indices")
        size = tuple((idx.amax(1) + 1).tolist() if nse else [0] * sdim) + dense_shape
    else:
        size = _size_tuple(size)
        if len(size) != sdim + len(dense_shape) or size[sdim:] != dense_shape:
            raise ValueError(
                f"size {size} does not match indices with sparse_dim={sdim} and values with dense "
                f"shape {dense_shape} (expected {sdim} sparse sizes followed by {dense_shape})"
            )
        if check_invariants:
            _check_bounds(idx, size, "indices")
    fill, indefinite, zero = normalize_fill(fill_value, values.dtype, values.device, dense_shape)
    coalesced = False
    if check_invariants and is_coalesced and traced(idx):  # (checked when the graph runs)
        keys = _index.linearize(idx, size[:sdim])
        torch._assert_async(
            (keys[1:] > keys[:-1]).all(),
            "is_coalesced=True but indices are not sorted without duplicates",
        )
        coalesced = True
    elif check_invariants and is_coalesced is not False and traced(idx):
        coalesced = (
            False  # (not known without reading the indices: the handlers coalesce where they need)
        )
    elif check_invariants and is_coalesced is not False:
        coalesced = _first_unsorted(idx, size[:sdim]) is None
        if is_coalesced and not coalesced:
            raise ValueError("is_coalesced=True but indices are not sorted without duplicates")
    elif is_coalesced:
        coalesced = True

    def make(v, f):
        return SparseTensor(
            torch.sparse_coo,
            size,
            v,
            f.clone(),
            indices=idx,
            indefinite=indefinite,
            coalesced=coalesced,
            known_zero=zero,
        )

    return _build(make, values, fill, requires_grad)


def sparse_csr_tensor(
    crow_indices: Any,
    col_indices: Any,
    values: Any,
    size: Size | None = None,
    *,
    fill_value: FillValue = None,
    dtype: torch.dtype | None = None,
    device: Device = None,
    requires_grad: bool = False,
    check_invariants: bool = True,
) -> SparseTensor:
    """CSR SparseTensor, as :func:`torch.sparse_csr_tensor` plus ``fill_value``.

    ``crow_indices``: ``(*batch, nrows + 1)``; ``col_indices``: ``(*batch, nse)`` sorted within
    rows; ``values``: ``(*batch, nse, *dense_shape)``.

    ``check_invariants=True`` (the default) checks ``crow_indices`` (0, non-decreasing, nse), the
    columns' range and their order within each row: one vectorised O(nse + nrows) pass.  ``False``
    skips it, as torch's switch: parts that break these give undefined results (compiled kernels
    index memory with them).  Files, pickles, queues and collectives are always checked
    (:func:`check_parts`).

    >>> import sparsefill
    >>> sparsefill.sparse_csr_tensor([0, 1, 1], [2], [3.], (2, 3), fill_value=-1.).to_dense()
    tensor([[-1., -1.,  3.],
            [-1., -1., -1.]])
    """
    values = _values_tensor(values, dtype, device, fill_value)
    crow = _index_tensor(crow_indices, "crow_indices", values.device)
    col = _index_tensor(col_indices, "col_indices", values.device)
    if crow.dim() < 1 or col.dim() != crow.dim():
        raise ValueError(
            f"crow_indices (shape {tuple(crow.shape)}) and col_indices (shape {tuple(col.shape)}) "
            "must have the same number (>= 1) of dims"
        )
    batch, nse = tuple(crow.shape[:-1]), col.shape[-1]
    if tuple(col.shape[:-1]) != batch or tuple(values.shape[: len(batch) + 1]) != batch + (nse,):
        raise ValueError(
            f"values (shape {tuple(values.shape)}) and col_indices (shape {tuple(col.shape)}) must "
            f"start with the batch shape {batch} of crow_indices followed by nse={nse}"
        )
    nrows, dense_shape = crow.shape[-1] - 1, tuple(values.shape[len(batch) + 1 :])
    if nrows < 0:
        raise ValueError("crow_indices must have at least one entry per batch (nrows + 1)")
    if check_invariants and traced(crow):  # (checked when the graph runs)
        steps = crow[..., 1:] - crow[..., :-1]
        torch._assert_async(
            ((crow[..., 0] == 0) & (crow[..., -1] == nse)).all() & (steps >= 0).all(),
            "crow_indices must start at 0, end at nse and be non-decreasing in every batch",
        )
    elif check_invariants:
        _check_crow(crow, nse)
    if size is None:
        _size_from_data("sparse_csr_tensor")
        _check_bounds(col, [_index._INT64_MAX], "col_indices")
        ncols = int(col.max()) + 1 if col.numel() else 0
        size = batch + (nrows, ncols) + dense_shape
    else:
        size = _size_tuple(size)
        want = batch + (nrows,)
        if (
            len(size) != len(batch) + 2 + len(dense_shape)
            or size[: len(want)] != want
            or size[len(want) + 1 :] != dense_shape
        ):
            raise ValueError(
                f"size {size} does not match crow_indices (batch {batch}, nrows {nrows}) and "
                f"values with dense shape {dense_shape}"
            )
    ncols = size[len(batch) + 1]
    if check_invariants:
        _check_bounds(col.reshape(-1), [ncols], "col_indices", dim_name="columns")
    fill, indefinite, zero = normalize_fill(fill_value, values.dtype, values.device, dense_shape)

    def make(v, f):
        return SparseTensor(
            torch.sparse_csr,
            size,
            v,
            f.clone(),
            crow=crow,
            col=col,
            indefinite=indefinite,
            known_zero=zero,
        )

    out = _build(make, values, fill, requires_grad)
    if check_invariants and traced(col):
        keys = out._keys()
        torch._assert_async(
            (keys[1:] > keys[:-1]).all(), "col_indices must be strictly increasing within each row"
        )
    elif check_invariants and not batch:  # (no key tensor: 3x faster at 1M stored)
        n = _first_unordered_column(crow, col)
        if n is not None:
            rows = (
                torch.searchsorted(crow, torch.tensor([n - 1, n], device=crow.device), right=True)
                - 1
            ).tolist()
            raise ValueError(
                f"col_indices must be strictly increasing within each row: stored element {n} "
                f"(position {(rows[1], int(col[n]))}) follows position {(rows[0], int(col[n - 1]))}"
            )
    elif check_invariants:
        _check_rows_sorted(crow, col)
    return out


def to_sparse(
    x: Any,
    *,
    fill_value: FillValue = None,
    layout: torch.layout = torch.sparse_coo,
    dense_dim: int | None = None,
) -> SparseTensor:
    """SparseTensor specifying exactly the elements (dense slices) of ``x`` that differ from
    ``fill_value``.

    NaN fills leave NaN elements unspecified.  ``x`` may be dense, torch native sparse or a
    SparseTensor (then layout/fill/dense_dim change, as ``x.to_sparse(...)``).  Invariant:
    ``to_sparse(x, ...).to_dense() == x``.

    A scipy.sparse, pydata ``sparse`` or pandas sparse object is read by
    :func:`sparsefill.from_scipy`, :func:`~sparsefill.from_pydata` or
    :func:`~sparsefill.from_pandas` (its fill and pattern kept; a ``fill_value`` equal to its fill
    prunes its fill-valued elements, another one re-specifies it, O(numel)), then treated as a
    SparseTensor.  Another object that densifies (``toarray()``/``todense()``) goes through the
    densify policy before its dense array is allocated.

    >>> import torch, sparsefill
    >>> sparsefill.to_sparse(torch.ones(10), fill_value=1.)._nse()
    0
    """
    if isinstance(x, SparseTensor):
        return x.to_sparse(layout, fill_value=fill_value, dense_dim=dense_dim)
    if not isinstance(x, torch.Tensor):
        from sparsefill._creation.interop import as_dense, from_peer

        A, fill_value = from_peer(x, fill_value)
        if A is not None:
            return A.to_sparse(layout, fill_value=fill_value, dense_dim=dense_dim)
        x = as_dense(x)
    if x.layout is not torch.strided:
        return from_torch(x).to_sparse(layout, fill_value=fill_value, dense_dim=dense_dim)
    dd = _convert.check_dense_dim(x.dim(), dense_dim, layout)
    fill, indefinite, zero = normalize_fill(
        fill_value, x.dtype, x.device, x.shape[x.dim() - dd :], own=True
    )
    return _same_dense(x, lambda t: _convert.dense_to_sparse(t, fill, indefinite, zero, layout, dd))


def convert(A: SparseTensor, layout=None, fill_value=None, dense_dim=None) -> SparseTensor:
    """``A.to_sparse(layout, fill_value=, dense_dim=)``: same dense tensor, other layout/fill/dense
    dims."""
    layout = A._sf_layout if layout is None else layout
    dd = _convert.check_dense_dim(
        A.dim(), A.dense_dim() if dense_dim is None else dense_dim, layout
    )
    keep = (indefinite if A._indefinite else A._fill) if fill_value is None else fill_value
    try:
        fill, indef, zero = normalize_fill(
            keep, A.dtype, A.device, A.shape[A.dim() - dd :], own=True
        )
    except ValueError as e:
        if fill_value is not None:
            raise
        raise ValueError(
            f"dense_dim {A.dense_dim()} -> {dd}: the fill of shape {tuple(A._fill.shape)} does "
            f"not fit the new dense dims {tuple(A.shape[A.dim() - dd :])}; pass fill_value= as "
            "well"
        ) from e
    if dd == A.dense_dim() and (fill_value is None or indef and A._indefinite):  # the pattern stays
        return (
            A if layout is A._sf_layout else _same_dense(A, lambda a: _convert.to_layout(a, layout))
        )
    return _same_dense(A, lambda a: _convert.convert_fill(a, fill, indef, zero, layout, dd))


def from_torch(t: torch.Tensor) -> SparseTensor:
    """SparseTensor (zero fill) from a torch native sparse tensor (COO, CSR; CSC/BSR/BSC become
    COO).

    Built on ``t``'s index and value tensors without copying them (an op that re-specifies the
    SparseTensor later gives it new storage, as any SparseTensor op).  A dense ``t`` goes through
    :func:`to_sparse`.  Its parts are checked first (:func:`check_parts`, one O(nse) pass;
    ValueError): torch does not check the sparse tensors it loads unless
    ``torch.sparse.check_sparse_tensor_invariants`` is on.
    """
    if t.layout is torch.strided:
        return to_sparse(t)
    return _same_dense(t, lambda a: _convert.from_native(a, checked=True))


def to_torch(A: SparseTensor, *, materialize: bool = False) -> torch.Tensor:
    """Torch native sparse tensor of ``A`` (differentiable); see :meth:`SparseTensor.to_torch`.
    Under torch.compile a graph break (with ``fullgraph=True`` dynamo's error, this message): torch
    traces no native sparse tensor of a data-dependent nse (it guards on it)."""
    # (dynamo runs A.to_torch() on fake tensors, as one node of its graph: a graph break there)
    if traced(A._vals):
        from torch._dynamo.exc import unimplemented

        unimplemented(
            gb_type="sparsefill: to_torch not traceable",
            context="SparseTensor.to_torch",
            explanation="A torch native sparse tensor of a data-dependent nse does not trace "
            "(torch guards on its nse); to_torch runs eagerly",
            hints=["Convert outside the compiled function."],
        )
    return _same_dense(A, lambda a: _convert.to_torch(a, materialize=materialize))


# ---------------------------------------------------------------------- factories
# (the fill is the value the factory names: full, zeros, ones; empty: indefinite)
def full(
    size: int | Size,
    fill_value: FillValue,
    *,
    layout: torch.layout = torch.sparse_coo,
    dtype: torch.dtype | None = None,
    device: Device = None,
    requires_grad: bool = False,
    dense_dim: int = 0,
) -> torch.Tensor:
    """A tensor with no specified element: every element is ``fill_value`` (a SparseTensor; a dense
    tensor for ``layout=torch.strided``)."""
    size = _size_tuple(size if isinstance(size, (tuple, list, torch.Size)) else (size,))
    if layout is torch.strided:
        # (a fill torch.full does not take: torch's own error)
        return torch.full(
            size,
            fill_value,  # type: ignore[arg-type]
            dtype=dtype,
            device=device,
            requires_grad=requires_grad,
        )
    if dtype is None:
        dtype = _array_fill(fill_value).dtype
    dd = _convert.check_dense_dim(len(size), dense_dim, layout)
    device = torch.device(device) if device is not None else torch.get_default_device()
    fill, indefinite, zero = normalize_fill(
        fill_value, dtype, device, size[len(size) - dd :], own=True
    )
    sdim = len(size) - dd
    idx = torch.zeros((sdim, 0), dtype=torch.int64, device=device)
    vals = torch.zeros((0,) + size[sdim:], dtype=dtype, device=device)
    out = _convert.parts_to_sparse(
        idx, vals, size, fill, indefinite=indefinite, known_zero=zero, layout=layout, coalesced=True
    )
    return out.requires_grad_(True) if requires_grad else out


def _factory(value: FillValue) -> Callable[..., torch.Tensor]:
    def make(
        *size: Any,
        layout: torch.layout = torch.sparse_coo,
        dtype: torch.dtype | None = None,
        device: Device = None,
        requires_grad: bool = False,
        dense_dim: int = 0,
    ) -> torch.Tensor:
        dtype = dtype or torch.get_default_dtype()
        v = (
            value
            if value is not None
            else torch.empty((), dtype=dtype, device=device or torch.get_default_device())
        )
        return full(
            _size_tuple(size),
            v,
            layout=layout,
            dtype=dtype,
            device=device,
            requires_grad=requires_grad,
            dense_dim=dense_dim,
        )

    return make


zeros, ones, empty = _factory(0), _factory(1), _factory(None)


zeros.__doc__ = "Sparse zeros: nse 0, fill 0."


ones.__doc__ = "Sparse ones: nse 0, fill 1."


empty.__doc__ = "Sparse empty: nse 0, fill uninitialized."


def eye(
    n: int,
    m: int | None = None,
    *,
    layout: torch.layout = torch.sparse_coo,
    dtype: torch.dtype | None = None,
    device: Device = None,
    requires_grad: bool = False,
) -> torch.Tensor:
    """Identity: the diagonal specified with ones, fill 0."""
    m = n if m is None else m
    if layout is torch.strided:
        return torch.eye(n, m, dtype=dtype, device=device, requires_grad=requires_grad)
    dtype = dtype or torch.get_default_dtype()
    device = torch.device(device) if device is not None else torch.get_default_device()
    _convert.check_dense_dim(2, 0, layout)
    k = torch.arange(min(n, m), device=device)
    out = _convert.parts_to_sparse(
        torch.stack([k, k]),
        torch.ones(k.numel(), dtype=dtype, device=device),
        (n, m),
        torch.zeros((), dtype=dtype, device=device),
        known_zero=True,
        layout=layout,
        coalesced=True,
    )
    return out.requires_grad_(True) if requires_grad else out


def full_like(
    input: torch.Tensor,
    fill_value: FillValue,
    *,
    layout: torch.layout | None = None,
    dtype: torch.dtype | None = None,
    device: Device = None,
    requires_grad: bool = False,
    dense_dim: int | None = None,
    memory_format: torch.memory_format | None = None,
) -> torch.Tensor:
    """``full(input.shape, fill_value)`` with ``input``'s layout (and dense dims), dtype and device
    by default."""
    if layout is None:
        layout = input.sparse_layout if isinstance(input, SparseTensor) else input.layout
    if dense_dim is None:
        dense_dim = input.dense_dim() if isinstance(input, SparseTensor) else 0
    if layout is torch.strided:
        return torch.full(
            input.shape,
            fill_value,  # type: ignore[arg-type]  # (one torch.full does not take: its error)
            dtype=dtype or input.dtype,
            device=device or input.device,
            requires_grad=requires_grad,
        )
    return full(
        input.shape,
        fill_value,
        layout=layout,
        dtype=dtype or input.dtype,
        device=device or input.device,
        requires_grad=requires_grad,
        dense_dim=dense_dim,
    )


def _like(value: FillValue) -> Callable[..., torch.Tensor]:
    def make(
        input: torch.Tensor,
        *,
        layout: torch.layout | None = None,
        dtype: torch.dtype | None = None,
        device: Device = None,
        requires_grad: bool = False,
        dense_dim: int | None = None,
        memory_format: torch.memory_format | None = None,
    ) -> torch.Tensor:
        v = (
            value
            if value is not None
            else torch.empty((), dtype=dtype or input.dtype, device=device or input.device)
        )
        return full_like(
            input,
            v,
            layout=layout,
            dtype=dtype,
            device=device,
            requires_grad=requires_grad,
            dense_dim=dense_dim,
        )

    return make


zeros_like, ones_like, empty_like = _like(0), _like(1), _like(None)


install_hooks(same_dense=_same_dense, convert=convert, to_sparse=to_sparse, to_torch=to_torch)
