"""Validation of a SparseTensor's stored parts, on plain tensors: the invariants every kernel relies
on before it indexes memory with a stored index.

The constructors check their arguments with these helpers; :func:`check_parts` checks parts that
arrive whole (``torch.load``, pickle, queues, deep copies, collectives, torch's own sparse tensors).
A failed check raises a ``ValueError``, ``TypeError`` or ``IndexError`` that names the part and
the numbers; nothing is modified.
"""

from __future__ import annotations

import numbers

import torch

from sparsefill._kernels import index as _index
from sparsefill._kernels.trace import traced
from sparsefill._tensor.tensor import SparseTensor
from sparsefill._tensor.fill import _check_fill_shape


def _size_tuple(size, name="size") -> tuple[int, ...]:
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = size[0]
    size = tuple(size)
    if not all(isinstance(s, numbers.Integral) and int(s) >= 0 for s in size):
        raise ValueError(f"{name} must be a sequence of non-negative ints, got {size}")
    return tuple(int(s) for s in size)


def _check_bounds(idx: torch.Tensor, sizes, name: str, dim_name: str | None = None) -> None:
    flat = idx if idx.dim() == 2 else idx[None]
    # torch.compile: the data is not known while tracing; checked when the graph runs
    if traced(idx):
        ok = (
            (flat >= 0)
            & (flat < torch.tensor(list(sizes)[: flat.shape[0]], device=idx.device)[:, None])
        ).all()
        torch._assert_async(
            ok, f"{name} has an entry out of range [0, size) for sizes {tuple(sizes)}"
        )
        return
    if idx.shape[-1] == 0:
        return
    lo, hi = torch.aminmax(flat, dim=1)  # (one pass)
    for d, (a, b, s) in enumerate(zip(lo.tolist(), hi.tolist(), sizes)):
        where = f"{name}[{d}]" if idx.dim() > 1 else name
        if a < 0:
            raise IndexError(f"{where} has a negative entry {a}")
        if b >= s:
            raise IndexError(
                f"{where} has an entry {b} out of range for size {s} of "
                f"{dim_name or f'sparse dim {d}'}"
            )


def _check_crow(crow: torch.Tensor, nse: int) -> None:
    """``crow_indices`` ``(*batch, nrows + 1)`` starts at 0, ends at ``nse`` and never decreases, in
    every batch (so every entry is in ``[0, nse]``): one pass."""
    if not crow.numel():
        return
    first, last, steps = crow[..., 0], crow[..., -1], crow[..., 1:] - crow[..., :-1]
    if bool((first != 0).any()) or bool((last != nse).any()):
        raise ValueError(
            f"crow_indices must start at 0 and end at nse={nse} in every batch; got first "
            f"{first.unique().tolist()[:4]}, last {last.unique().tolist()[:4]}"
        )
    if bool((steps < 0).any()):
        at = (steps < 0).nonzero()[0].tolist()
        raise ValueError(
            f"crow_indices must be non-decreasing: at {tuple(at[:-1])} row {at[-1]} it goes from "
            f"{int(crow[tuple(at)])} to {int(crow[tuple(at[:-1]) + (at[-1] + 1,)])}"
        )


def _check_rows_sorted(crow: torch.Tensor, col: torch.Tensor) -> None:
    """``col_indices`` strictly increase within each row (sorted, no duplicates), for a
    ``crow_indices`` that :func:`_check_crow` accepted: adjacent stored elements compared, except
    where a row starts.  O(nse + nrows), no linear keys (so no bound on the number of positions)."""
    nse = col.shape[-1]
    if nse < 2 or not col.numel():
        return
    c, r = col.reshape(-1, nse), crow.reshape(col.numel() // nse, -1)
    starts = torch.zeros(c.shape[0], nse + 1, dtype=torch.bool, device=col.device).scatter_(
        1, r, True
    )
    bad = ((c[:, 1:] <= c[:, :-1]) & ~starts[:, 1:nse]).nonzero()
    if bad.numel():
        b, n = bad[0].tolist()
        row = int(torch.searchsorted(r[b], n + 1, right=True)) - 1
        where = (
            f"batch {tuple(_index.unravel(torch.tensor([b]), col.shape[:-1])[:, 0].tolist())}, "
            if col.dim() > 1
            else ""
        )
        raise ValueError(
            f"col_indices must be strictly increasing within each row: in {where}row {row}, stored "
            f"element {n + 1} (column {int(c[b, n + 1])}) follows column {int(c[b, n])}"
        )


def _first_unordered_column(crow: torch.Tensor, col: torch.Tensor):
    """The first stored element ``n`` of a 2-D CSR pattern whose column is not above its
    predecessor's in the same row (``col[n] <= col[n - 1]``), or None: ``crow`` already checked (0
    .. nse, non-decreasing)."""
    if col.numel() < 2:
        return None
    bad = col[1:] <= col[:-1]
    starts = crow[1:-1]
    bad[starts[(starts > 0) & (starts < col.numel())] - 1] = (
        False  # (a pair across two rows is not ordered)
    )
    at = bad.nonzero()
    return int(at[0]) + 1 if at.numel() else None


# ---------------------------------------------------------------------- parts from outside
def check_parts(
    layout,
    size,
    values,
    fill,
    indices=None,
    crow=None,
    col=None,
    *,
    indefinite: bool = False,
    coalesced: bool = False,
) -> None:
    """Raise (ValueError, TypeError or IndexError, naming the part and the numbers) unless the parts
    form a valid SparseTensor as it is stored: the invariants every kernel relies on before it
    indexes memory with a stored index.  The constructors' checks (``check_invariants=True``), for
    parts that arrive whole (``torch.load``, pickle, queues, deep copies, collectives: see
    ``_tensor.loading.rebuild``)::

        COO  indices int64 (sparse_dim, nse), each row in [0, size[d]); values (nse, *dense_shape);
             coalesced: the columns sorted without duplicates
        CSR  crow_indices int64 (*batch, nrows + 1): 0, non-decreasing, nse;
             col_indices int64 (*batch, nse) in [0, ncols), strictly increasing within each row;
             values (*batch, nse, *dense_shape)
        fill of the values' dtype and device: (0,) when indefinite, else broadcasting to dense_shape

    One vectorised pass over the indices, O(nse + nrows); nothing dense is allocated.  The data
    checks are skipped where there is no data to read (meta tensors, torch.compile's fake tensors).

    >>> check_parts(
    ...     torch.sparse_csr,
    ...     (2, 3),
    ...     torch.ones(1),
    ...     torch.tensor(0.0),
    ...     crow=torch.tensor([0, 1, 1]),
    ...     col=torch.tensor([7]),
    ... )
    Traceback (most recent call last):
    ...
    IndexError: col_indices has an entry 7 out of range for size 3 of columns
    """
    size = _size_tuple(size)
    coo = layout is torch.sparse_coo
    if not coo and layout is not torch.sparse_csr:
        raise ValueError(f"layout must be torch.sparse_coo or torch.sparse_csr, got {layout}")
    named = {"indices": indices} if coo else {"crow_indices": crow, "col_indices": col}
    _check_part_types(dict(named, values=values, fill_value=fill))
    nse = (_coo_shapes if coo else _csr_shapes)(size, values, *named.values())
    sparse_ndim = len(size) - (values.dim() - (1 if coo else col.dim()))
    if _index.numel(size) > _index._INT64_MAX:
        raise ValueError(f"size {size} has more than 2**63 - 1 elements")
    if indefinite and tuple(fill.shape) != (0,):
        raise ValueError(
            f"an indefinite fill is stored as a tensor of shape (0,), got fill_value of shape "
            f"{tuple(fill.shape)}"
        )
    if not indefinite:
        _check_fill_shape(fill, size[sparse_ndim:])
    if not _has_data(values, *named.values()):
        return
    if coo:
        _check_bounds(indices, size, "indices")
        if coalesced:
            _check_sorted_unique(indices, size[:sparse_ndim])
        return
    _check_crow(crow, nse)
    _check_bounds(col.reshape(-1), [size[sparse_ndim - 1]], "col_indices", dim_name="columns")
    _check_rows_sorted(crow, col)


def _check_part_types(parts: dict) -> None:
    values = parts["values"]
    for name, t in parts.items():
        if (
            not isinstance(t, torch.Tensor)
            or isinstance(t, SparseTensor)
            or t.layout is not torch.strided
        ):
            raise TypeError(f"{name} must be a strided torch.Tensor, got {_what(t)}")
        if t.device != values.device:
            raise ValueError(f"{name} is on device {t.device} but values is on {values.device}")
        if name.endswith("indices") and t.dtype != torch.int64:
            raise TypeError(f"{name} must have dtype torch.int64, got {t.dtype}")
    if parts["fill_value"].dtype != values.dtype:
        raise TypeError(
            f"fill_value has dtype {parts['fill_value'].dtype} but values has dtype {values.dtype}"
        )


def _what(t) -> str:
    if isinstance(t, torch.Tensor):
        return f"a {type(t).__name__} of layout {t.layout}"
    return f"{type(t).__name__}"


def _coo_shapes(size, values, indices) -> int:
    """nse of COO parts whose shapes agree with ``size``."""
    if indices.dim() != 2 or values.dim() < 1:
        raise ValueError(
            f"indices must be 2-D (sparse_dim, nse) and values at least 1-D (nse, *dense_shape), "
            f"got shapes {tuple(indices.shape)} and {tuple(values.shape)}"
        )
    sdim, nse = indices.shape
    if values.shape[0] != nse:
        raise ValueError(
            f"values has {values.shape[0]} rows (shape {tuple(values.shape)}) but indices has "
            f"nse={nse} columns"
        )
    if len(size) != sdim + values.dim() - 1 or size[sdim:] != tuple(values.shape[1:]):
        raise ValueError(
            f"size {size} does not match indices with sparse_dim={sdim} and values with dense "
            f"shape {tuple(values.shape[1:])}"
        )
    return nse


def _csr_shapes(size, values, crow, col) -> int:
    """nse (per batch) of CSR parts whose shapes agree with ``size``."""
    if crow.dim() < 1 or col.dim() != crow.dim() or crow.shape[-1] < 1:
        raise ValueError(
            f"crow_indices (shape {tuple(crow.shape)}) and col_indices (shape {tuple(col.shape)}) "
            "must have the same number (>= 1) of dims, crow_indices at least one entry (nrows + 1)"
        )
    batch, nse = tuple(crow.shape[:-1]), col.shape[-1]
    if tuple(col.shape[:-1]) != batch or tuple(values.shape[: len(batch) + 1]) != batch + (nse,):
        raise ValueError(
            f"values (shape {tuple(values.shape)}) and col_indices (shape {tuple(col.shape)}) must "
            f"start with the batch shape {batch} of crow_indices followed by nse={nse}"
        )
    k = len(batch)
    if (
        len(size) != values.dim() + 1
        or size[: k + 1] != batch + (crow.shape[-1] - 1,)
        or size[k + 2 :] != tuple(values.shape[k + 1 :])
    ):
        raise ValueError(
            f"size {size} does not match crow_indices (batch {batch}, nrows {crow.shape[-1] - 1}) "
            f"and values with dense shape {tuple(values.shape[k + 1 :])}"
        )
    if nse > size[k] * size[k + 1]:
        raise ValueError(
            f"nse={nse} exceeds the {size[k] * size[k + 1]} positions of a {size[k]} x "
            f"{size[k + 1]} matrix"
        )
    return nse


def _has_data(*ts) -> bool:
    """The tensors' values can be read on the host (no meta or fake tensor, nothing being
    traced)."""
    fake = torch._subclasses.fake_tensor.FakeTensor
    return not traced() and not any(t.is_meta or isinstance(t, fake) for t in ts)


def _check_sorted_unique(indices: torch.Tensor, sparse_shape) -> None:
    """COO ``indices`` claimed coalesced: their columns strictly increase in row-major order."""
    j = _first_unsorted(indices, sparse_shape)
    if j is not None:
        raise ValueError(
            f"is_coalesced=True but indices are not sorted without duplicates: column {j} "
            f"{tuple(indices[:, j].tolist())} follows {tuple(indices[:, j - 1].tolist())}"
        )


def _first_unsorted(indices: torch.Tensor, sparse_shape) -> int | None:
    """The first column of in-range COO ``indices`` not past its predecessor in row-major order
    (None: sorted without duplicates): one pass over their linear keys (which fit int64: torch has
    no tensor of more than 2**63 - 1 elements)."""
    if indices.shape[1] < 2:
        return None
    keys = _index.linearize(indices, sparse_shape)
    bad = keys[1:] <= keys[:-1]
    return None if not bool(bad.any()) else int(bad.nonzero()[0]) + 1
