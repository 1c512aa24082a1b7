"""Between a SparseTensor and the dense tensor it stands for: :func:`dense_of` writes the stored
values into a fresh buffer holding the fill (on Linux, a large one advised into huge pages:
:func:`empty_dense`), :func:`dense_to_parts` finds the elements of a dense tensor that differ from a
fill; every dense allocation passes the densify gate first (:func:`check_densify_quiet` for one
dense by nature).  The kernels carry no autograd (``_autograd/functions.py`` wraps them)::

    dense_of(A)[p] == value stored at p, else fill;    x == dense_of(parts of dense_to_parts(x, f))

>>> import sparsefill
>>> dense_of(sparsefill.sparse_coo_tensor([[1]], [7.], (3,), fill_value=-1.)).tolist()
[-1.0, 7.0, -1.0]
"""

from __future__ import annotations

import sys

import torch

from sparsefill._kernels import index as _index, merge as _merge
from sparsefill._kernels.trace import traced
from sparsefill._tensor.coalesced import linear_parts
from sparsefill._tensor.tensor import SparseTensor


def dense_of(
    A: SparseTensor, fill: torch.Tensor | None = None, *, eager: bool = False
) -> torch.Tensor:
    """The dense tensor ``A`` stands for; ``fill`` replaces ``A``'s fill (needed when it is
    indefinite); ``eager=True``: the caller found that nothing traces (:func:`traced` is False), not
    asked again.

    ``out = fill expanded; out.view(-1, *dense_shape)[keys] = values`` with the linear keys of
    :func:`linear_parts` (a coalesced 1-D COO pattern's indices are its keys; sorted).  On CPU with
    numba, one torch thread (or a result under ``_PARALLEL_FILL_MIN`` elements), a scalar fill and
    at most a quarter of the positions stored: one compiled pass, block by block
    (:func:`_kernels.merge.fill_put_sorted`).  Otherwise ``fill_``/``copy_``, then ``put_`` into the
    flat buffer (:func:`_kernels.merge.put_flat`: a compiled loop on CPU, at any density: 0.7x
    ``index_copy_``'s time at half the positions stored) while the stored elements are at most a
    quarter of the positions or the compiled loop applies; ``index_copy_`` otherwise, for hybrid
    tensors and under deterministic algorithms.

    >>> import sparsefill
    >>> dense_of(sparsefill.sparse_coo_tensor([[1, 3]], [7., 8.], (5,), fill_value=-1.)).tolist()
    [-1.0, 7.0, -1.0, 8.0, -1.0]
    """
    if fill is None:
        if A._indefinite:
            raise ValueError(
                "to_dense() of a SparseTensor with indefinite fill: its unspecified elements "
                "have no value; pass to_dense(fill_value=...) to give them one"
            )
        fill = A._fill
    shape, vals, idx = A._size, A._vals, A._idx  # (A._size: A.shape without the op layer's route)
    nd = len(shape)
    # (new_empty: cheaper than torch.empty(dtype=, device=); of an int or a tuple, cheaper than of
    # a Size)
    out = fill.new_empty(shape[0] if nd == 1 else tuple(shape))
    numel, vd = out.numel(), vals.dim()
    if type(out) is _TENSOR and numel * out.itemsize >= _HUGE_MIN:  # (no fake or functional tensor)
        # (called only then: a Python call on this per-call path is not free)
        _advised(out)
    k = nd - vd + (1 if idx is not None else A._col.dim())  # sparse dims
    if k == 1 == nd and A._coalesced and idx.dtype is _INT64:
        keys = idx  # (one sparse dim: the indices are the keys; put_ reads them flat)
    # compiled: duplicates add in place (a coalesce's nse is data)
    elif not A._coalesced and traced(vals):
        out.copy_(fill) if fill.dim() else out.fill_(fill)
        keys = _index.linearize(A._coo_parts()[0], shape[:k])
        flat = out.view((_index.numel(shape[:k]),) + tuple(shape[k:]))
        flat.index_fill_(0, keys, 0).index_put_(
            (keys,), vals.reshape((-1,) + tuple(shape[k:])), accumulate=True
        )
        return out
    else:
        keys, vals = linear_parts(A, shape[:k])
        vd = vals.dim()  # (a batched CSR's values: flat)
    # (while traced, nse may be unbacked: no comparison)
    plain = vd == 1 and (eager or not traced(vals))
    # (numel(), not shape[0]: cheaper)
    quarter = plain and vals.numel() * 4 <= numel
    if (
        quarter
        and (numel < _PARALLEL_FILL_MIN or _num_threads() == 1)
        and (_merge._kernels or "numba" in sys.modules or numel >= _merge._FILL_BLOCK)
        and _merge.fill_put_sorted(out, fill, keys, vals)
    ):
        return out
    out.copy_(fill) if fill.dim() else out.fill_(fill)
    if (
        plain
        and not torch.are_deterministic_algorithms_enabled()
        and (
            quarter
            or vals.shape[0] >= _merge._SCATTER_MIN
            and vals.is_cpu
            and vals.dtype in _merge._SCATTER_DTYPES
            and _merge._compiled()
        )
    ):
        return _merge.put_flat(out, keys, vals)
    keys = keys.view(-1)
    # (a view only where needed: it has a per-call cost)
    flat = out if k == 1 else out.view((_index.numel(shape[:k]),) + tuple(shape[k:]))
    signed = _SIGNED_VIEW.get(vals.dtype)
    # (torch has no index_copy_ kernel for uint16/32/64: their bits, as signed)
    if signed is not None:
        flat, vals = flat.view(signed), vals.view(signed)
    flat.index_copy_(0, keys, vals)
    return out


_SIGNED_VIEW = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}


# elements from which fill_ on several torch threads goes before the one-thread pass
_PARALLEL_FILL_MIN = 1 << 18


# (bound here: ``torch.x`` looks x up in torch's module dict on every call)
_TENSOR, _INT64, _num_threads = torch.Tensor, torch.int64, torch.get_num_threads


# bytes from which a dense result's memory is advised into 2 MiB pages (numpy's bound)
_HUGE_MIN = 1 << 22


_madvise = None  # libc's madvise (Linux), or False


def empty_dense(shape, dtype, device) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype, device=device)``; on Linux CPU, a buffer of at least 4 MiB
    is advised into transparent huge pages before it is first written (``madvise(MADV_HUGEPAGE)``,
    as numpy does for its arrays): writing a fresh buffer then takes one page fault per 2 MiB
    instead of one per 4 KiB (3.6x faster to fill at 64 MB).  A hint: where the kernel keeps huge
    pages off, nothing changes.

    >>> empty_dense((2, 3), torch.float32, torch.device("cpu")).shape
    torch.Size([2, 3])
    """
    return _advised(torch.empty(shape, dtype=dtype, device=device))


def _advised(out: torch.Tensor) -> torch.Tensor:
    """``out``, a fresh buffer, advised into huge pages when it is a CPU buffer of at least
    ``_HUGE_MIN`` bytes."""
    # (not fake)
    if type(out) is torch.Tensor and out.is_cpu and out.nbytes >= _HUGE_MIN and not traced(out):
        _advise_huge(out.data_ptr(), out.nbytes)
    return out


def _advise_huge(ptr: int, nbytes: int) -> None:
    global _madvise
    if _madvise is None:
        _madvise = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                f = ctypes.CDLL(None, use_errno=True).madvise
                f.argtypes, f.restype = (
                    [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int],
                    ctypes.c_int,
                )
                _madvise = f
            except (OSError, AttributeError):  # pragma: no cover - no libc madvise
                pass
    start, end = (ptr + 4095) & ~4095, (ptr + nbytes) & ~4095  # whole pages inside the buffer
    if _madvise and end - start >= _HUGE_MIN:
        _madvise(start, end - start, 14)  # MADV_HUGEPAGE; an error (huge pages off) changes nothing


def dense_to_parts(
    x: torch.Tensor, fill: torch.Tensor, indefinite: bool, dense_dim: int, zero: bool = False
):
    """Indices and values of exactly the elements (dense slices) of ``x`` that differ from ``fill``.

    NaN equals NaN here, so a NaN fill leaves NaN elements unspecified.  ``zero``: the fill is
    known to be zero, so ``x.nonzero()`` finds the elements in one pass, as torch's ``to_sparse``.
    """
    sdim = x.dim() - dense_dim
    if (
        sdim
        and not (dense_dim or indefinite)
        and (found := _merge.find_differ(x, fill)) is not None
    ):
        keys, vals = found  # (CPU: two compiled passes, no nonzero)
        return _index.unravel(keys, x.shape), vals
    if zero and sdim and not dense_dim:
        idx = x.nonzero().T.contiguous()
        return idx, x[tuple(idx)]
    if indefinite:
        differ = torch.ones(x.shape[:sdim], dtype=torch.bool, device=x.device)
    elif (x.is_complex() or x.is_floating_point()) and bool(fill.isnan().any()):  # NaN == NaN
        differ = differs(x, fill)
    else:
        differ = x != fill
    if dense_dim and not indefinite:
        differ = differ.flatten(sdim).any(-1)
    idx = differ.nonzero().T.contiguous()
    return idx, (x[tuple(idx)] if sdim else x[differ])  # gather nse rows, not a second pass over x


def differs(f: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``f != c`` element-wise, NaN equal to NaN (component by component for complex).

    >>> differs(torch.tensor([1., float('nan'), 2.]), torch.tensor(float('nan'))).tolist()
    [True, False, True]
    """
    if f.is_complex():
        return differs(torch.view_as_real(f), torch.view_as_real(c.expand(f.shape))).any(-1)
    if f.is_floating_point():
        return ~((f == c) | (f.isnan() & c.isnan()))
    return f != c


def check_densify_quiet(A: SparseTensor, what: str = "changing the fill or dense_dim") -> None:
    """Dense by nature (or explicitly requested): the densify gate with ``by_nature=True`` (quiet
    under the default policy; the byte limit applies)."""
    from sparsefill._tensor.policy import check_densify

    check_densify(what, A.numel() * A.element_size(), by_nature=True)
