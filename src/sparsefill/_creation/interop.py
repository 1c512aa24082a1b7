"""Conversions that keep the fill, both ways, never densifying: scipy.sparse, pydata ``sparse``,
pandas.

A peer object stands for a dense array whose unspecified elements equal its fill (scipy: 0; pydata
``sparse`` and pandas: ``x.fill_value``).  Every conversion keeps the fill, the pattern (the
positions stored, explicit fill-valued ones included) and the stored values exactly, in O(nse) time
and memory:

    from_pydata(x).to_dense() == torch.from_numpy(x.todense())
    to_pydata(A).todense()    == A.to_dense().numpy()

Stored data are copied (the result shares no memory with its source).  Labels (pandas index and
column names) are not kept.  numpy dtypes map to torch dtypes one to one (bool, uint8, int8-64,
float16-64, complex64/128); any other dtype raises TypeError.  scipy, ``sparse`` and pandas are
imported only when a function here is called with them.

>>> import numpy as np, sparse, sparsefill
>>> x = sparse.COO(np.array([[0, 5]]), np.array([1., 2.]), shape=(10**9,), fill_value=7.)
>>> A = sparsefill.from_pydata(x)
>>> A.shape, A._nse(), A.fill_value()
(torch.Size([1000000000]), 2, tensor(7., dtype=torch.float64))
>>> sparsefill.to_pydata(A)
<COO: shape=(1000000000,), dtype=float64, nnz=2, fill_value=7.0>
"""

from __future__ import annotations

import importlib
import math
import sys
from typing import Any

import numpy as np
import torch

from sparsefill._tensor import parts as _convert
from sparsefill._creation.constructors import FillValue, sparse_coo_tensor, sparse_csr_tensor
from sparsefill._tensor.tensor import SparseTensor, install_hooks

__all__ = ["from_scipy", "to_scipy", "from_pydata", "to_pydata", "from_pandas", "to_pandas"]

_TORCH_OF_NUMPY = {
    np.dtype(n): t
    for n, t in (
        ("bool", torch.bool),
        ("uint8", torch.uint8),
        ("int8", torch.int8),
        ("int16", torch.int16),
        ("int32", torch.int32),
        ("int64", torch.int64),
        ("float16", torch.float16),
        ("float32", torch.float32),
        ("float64", torch.float64),
        ("complex64", torch.complex64),
        ("complex128", torch.complex128),
    )
}
_NUMPY_OF_TORCH = {t: n for n, t in _TORCH_OF_NUMPY.items()}
_SCIPY_FORMATS = ("coo", "csr", "csc", "bsr", "dia", "lil", "dok")


# ---------------------------------------------------------------------- dtypes, fills, arrays
def torch_dtype(dtype, what: str) -> torch.dtype:
    """The torch dtype of a numpy dtype (any byte order), or TypeError naming it."""
    try:
        d = np.dtype(dtype)
    except TypeError:
        d = None
    t = _TORCH_OF_NUMPY.get(d.newbyteorder("=")) if d is not None else None
    if t is None:
        why = (
            " (torch has no arithmetic on unsigned integers wider than 8 bits)"
            if d is not None and d.kind == "u"
            else ""
        )
        raise TypeError(
            f"{what}: dtype {dtype} has no torch equivalent{why}; supported: bool, uint8, int8, "
            "int16, int32, int64, float16, float32, float64, complex64, complex128"
        )
    return t


def numpy_dtype(dtype: torch.dtype, what: str) -> np.dtype:
    d = _NUMPY_OF_TORCH.get(dtype)
    if d is None:
        raise TypeError(
            f"{what}: dtype {dtype} has no numpy equivalent; convert first, e.g. "
            "A.to(torch.float32)"
        )
    return d


def _ints(a, share: bool = False) -> torch.Tensor:
    """``a`` as an int64 tensor; ``share``: its memory where it already is a writeable int64 C
    array."""
    return (
        _shared(a, np.int64)
        if share
        else torch.from_numpy(np.array(a, dtype=np.int64, copy=True, order="C"))
    )


def _vals(a, dtype: torch.dtype, share: bool = False) -> torch.Tensor:
    """``a`` as a tensor of ``dtype``; ``share``: its memory where it already is a writeable C array
    of it."""
    np_dtype = _NUMPY_OF_TORCH[dtype]
    return (
        _shared(a, np_dtype)
        if share
        else torch.from_numpy(np.array(a, dtype=np_dtype, copy=True, order="C"))
    )


def _shared(a, np_dtype) -> torch.Tensor:
    """``torch.from_numpy(a)`` (no copy) where ``a`` is a writeable, aligned, C-contiguous
    native-order array of ``np_dtype``; a copy otherwise."""
    a = np.asarray(a)
    if (
        a.dtype == np_dtype
        and a.dtype.isnative
        and a.flags.c_contiguous
        and a.flags.writeable
        and a.flags.aligned
    ):
        return torch.from_numpy(a)
    return torch.from_numpy(np.array(a, dtype=np_dtype, copy=True, order="C"))


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy().copy()


def _exact_fill(fill, dtype, what: str) -> torch.Tensor:
    """A peer's fill as a 0-d tensor of ``dtype``; ValueError when that dtype cannot hold it
    exactly."""
    d = np.dtype(dtype).newbyteorder("=")
    try:
        with np.errstate(all="ignore"):
            f = np.asarray(fill)
            c = f.astype(d)
            same = bool(c == f) or (d.kind in "fc" and bool(np.isnan(c)) and bool(np.isnan(f)))
    except (TypeError, ValueError):
        same = False
    if not same:
        raise ValueError(f"{what}: fill_value {fill!r} cannot be represented exactly in dtype {d}")
    return torch.from_numpy(np.array(c, dtype=d))


def _scalar_fill(A: SparseTensor, what: str, peer: str):
    """``A``'s fill as one numpy scalar; ValueError when it is indefinite or varies over the dense
    dims."""
    if A._indefinite:
        raise ValueError(
            f"{what}: A's fill is indefinite (its unspecified elements are masked out) and "
            f"{peer} has no such fill; give them a value first, e.g. "
            "A.detach().clone().set_fill_value_(0)"
        )
    f = A._fill.detach().reshape(-1)
    if f.numel() == 0:
        return numpy_dtype(A.dtype, what).type(0)
    if not _same_fill(f, f[:1].expand_as(f)):
        raise ValueError(
            f"{what}: {peer} has one scalar fill, and A's fill (shape {tuple(A._fill.shape)}) "
            f"varies over its dense dims {tuple(A._dense_shape)}"
        )
    return f[:1].numpy()[0]


def _exportable(A, what: str) -> SparseTensor:
    if not isinstance(A, SparseTensor):
        raise TypeError(f"{what} takes a sparsefill SparseTensor, got {type(A).__name__}")
    if A.requires_grad:
        raise RuntimeError(
            f"Can't call {what} on a SparseTensor that requires grad (the result has no autograd). "
            "Use A.detach() first."
        )
    if A.device.type != "cpu":
        raise TypeError(f"{what}: can't convert a {A.device} device type tensor; use A.cpu() first")
    return A._sync()


def _scalar_coo(A: SparseTensor, coalesce: bool):
    """``(indices over all dims, values (nse,))``: a hybrid tensor's dense slices as scalar
    elements."""
    idx, vals = _convert.coalesced_parts(A) if coalesce else A._coo_parts()
    return _convert.scalar_parts(idx, vals, A._dense_shape) if A.dense_dim() else (idx, vals)


def _module(name: str, what: str):
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ImportError(f"{what} needs the {name!r} package ({e})") from None


# ---------------------------------------------------------------------- scipy.sparse
def from_scipy(m: Any, *, fill_value: FillValue = 0) -> SparseTensor:
    """SparseTensor of a scipy.sparse matrix or array (any format), its stored elements kept as they
    are.

    scipy's unspecified elements are 0; ``fill_value`` says what they stand for in the result (a
    number,
    or ``sparsefill.indefinite``; default 0: the same matrix)::

        from_scipy(m, fill_value=f).to_dense() == where(pattern of m, m.toarray(), f)

    coo stays COO (duplicates kept: they add up, as in scipy); csr, csc and bsr become CSR through
    scipy's ``tocsr()`` (a non-canonical csr is sorted and summed by scipy's ``sum_duplicates()``);
    dia, lil and dok become COO through scipy's ``tocoo()``, whose stored elements are the pattern
    (dia's drop explicit zeros).  O(nse), never densifying.

    Memory is shared, as ``torch.from_numpy`` shares it, where the arrays allow: a canonical csr's
    (or coo's) values always (writeable, C-contiguous: a write to ``m.data`` shows in the result),
    its index arrays where they are int64.  It copies: int32 index arrays (scipy's default below
    2**31 stored elements; SparseTensor indices are int64), read-only or strided arrays, and every
    format that scipy itself converts (csc, bsr, dia, lil, dok, a non-canonical csr).  The indices
    are validated either way (row pointers, column bounds and order).

    >>> import scipy.sparse as sp, sparsefill
    >>> sparsefill.from_scipy(sp.csr_array([[0., 2.], [3., 0.]]), fill_value=-1.).to_dense()
    tensor([[-1.,  2.],
            [ 3., -1.]], dtype=torch.float64)
    """
    sp = _module("scipy.sparse", "from_scipy()")
    if not sp.issparse(m):
        raise TypeError(
            f"from_scipy() takes a scipy.sparse matrix or array, got {type(m).__name__}"
        )
    dtype = torch_dtype(m.dtype, "from_scipy()")
    if m.format in ("csr", "csc", "bsr") and m.ndim == 2:
        m = m.tocsr()
        if not m.has_canonical_format:
            m = m.copy()
            m.sum_duplicates()
        return sparse_csr_tensor(
            _ints(m.indptr, True),
            _ints(m.indices, True),
            _vals(m.data, dtype, True),
            m.shape,
            fill_value=fill_value,
        )
    m = m if m.format == "coo" else m.tocoo()
    coords = getattr(m, "coords", None) or (m.row, m.col)
    return sparse_coo_tensor(
        _ints(np.stack(coords)).reshape(len(coords), len(m.data)),
        _vals(m.data, dtype, True),
        m.shape,
        fill_value=fill_value,
    )


def to_scipy(A: SparseTensor, format: str | None = None, *, materialize: bool = False) -> Any:
    """scipy.sparse array (``coo_array``, ``csr_array``, ...) of a 2-D SparseTensor with zero fill:
    the same matrix, pattern and stored values (a hybrid tensor's dense slices become scalar
    elements); O(nse).

    ``format``: None (``A``'s layout: "coo" or "csr"), "coo", "csr", "csc", or "bsr", "dia", "lil",
    "dok" through scipy's own conversion from coo (``scipy.sparse.csr_matrix(to_scipy(A))`` gives
    the matrix classes).  scipy has no fill (its unspecified elements are 0): a nonzero or
    indefinite fill raises ValueError, unless ``materialize=True``, which re-specifies ``A`` with
    fill 0 first (O(numel), under the densify policy's byte limit) as :func:`sparsefill.to_torch`
    does. ``from_scipy(to_scipy(A)) == A`` exactly.

    >>> import sparsefill
    >>> A = sparsefill.sparse_coo_tensor([[0, 1], [1, 0]], [2., 3.], (2, 2))
    >>> sparsefill.to_scipy(A, "csr").toarray()
    array([[0., 2.],
           [3., 0.]], dtype=float32)
    """
    A = _exportable(A, "to_scipy()")
    sp = _module("scipy.sparse", "to_scipy()")
    if A.dim() != 2:
        raise ValueError(
            f"to_scipy(): scipy.sparse holds 2-D matrices; A has shape {tuple(A.shape)} "
            f"({A.dim()} dims)"
        )
    fmt = format or ("csr" if A._sf_layout is torch.sparse_csr else "coo")
    if fmt not in _SCIPY_FORMATS:
        raise ValueError(
            f"to_scipy(): format must be one of {_SCIPY_FORMATS} or None, got {format!r}"
        )
    numpy_dtype(A.dtype, "to_scipy()")
    if A._indefinite or bool(A._fill.any()):
        if not materialize or A._indefinite:
            fill = (
                "indefinite"
                if A._indefinite
                else A._fill.tolist()
                if A._fill.numel() <= 8
                else f"an array of shape {tuple(A._fill.shape)}"
            )
            raise ValueError(
                "to_scipy(): scipy.sparse has no fill value (its unspecified elements are 0) "
                f"and A's fill is {fill}; pass materialize=True to specify every element that is "
                "not 0 (O(numel)), or read a scipy matrix with another fill by from_scipy(m, "
                "fill_value=...)"
            )
        A = A.to_sparse(fill_value=0)
    if fmt == "csr" and A._sf_layout is torch.sparse_csr and not A.dense_dim():
        return sp.csr_array((_np(A._vals), _np(A._col), _np(A._crow)), shape=tuple(A.shape))
    idx, vals = _scalar_coo(A, coalesce=False)
    m = sp.coo_array((_np(vals), (_np(idx[0]), _np(idx[1]))), shape=tuple(A.shape))
    return m if fmt == "coo" else m.asformat(fmt)


# ---------------------------------------------------------------------- pydata sparse
def from_pydata(x: Any) -> SparseTensor:
    """SparseTensor of a pydata ``sparse`` array with its fill, pattern and stored values, any
    number of dims: ``from_pydata(x).to_dense() == torch.from_numpy(x.todense())``.

    A 2-D GCXS compressed along rows becomes CSR; COO, other GCXS and DOK (through pydata's
    ``asformat("coo")``) become COO.  O(nse), never densifying; a shape with more than 2**63 - 1
    positions raises ValueError.
    """
    sparse = _module("sparse", "from_pydata()")
    if not isinstance(x, sparse.SparseArray):
        raise TypeError(
            "from_pydata() takes a pydata sparse array (sparse.COO, sparse.GCXS), got "
            f"{type(x).__name__}"
        )
    dtype = torch_dtype(x.dtype, "from_pydata()")
    fill = _exact_fill(x.fill_value, x.dtype, "from_pydata()")
    if isinstance(x, sparse.GCXS) and x.ndim == 2 and tuple(x.compressed_axes) == (0,):
        return sparse_csr_tensor(
            _ints(x.indptr), _ints(x.indices), _vals(x.data, dtype), x.shape, fill_value=fill
        )
    x = x if isinstance(x, sparse.COO) else x.asformat("coo")
    return sparse_coo_tensor(
        _ints(x.coords).reshape(x.ndim, len(x.data)), _vals(x.data, dtype), x.shape, fill_value=fill
    )


def to_pydata(A: SparseTensor, format: str | None = None) -> Any:
    """pydata ``sparse.COO`` or ``sparse.GCXS`` of ``A`` with its fill, pattern and stored values (a
    hybrid tensor's dense slices become scalar elements; its fill must be one value); O(nse).

    ``format``: None (``A``'s layout: COO -> "coo", CSR -> "gcxs"), "coo" or "gcxs".  An indefinite
    fill raises ValueError (pydata has none).  ``from_pydata(to_pydata(A))`` stands for the same
    tensor.
    """
    A = _exportable(A, "to_pydata()")
    sparse = _module("sparse", "to_pydata()")
    fmt = format or ("gcxs" if A._sf_layout is torch.sparse_csr else "coo")
    if fmt not in ("coo", "gcxs"):
        raise ValueError(f"to_pydata(): format must be 'coo', 'gcxs' or None, got {format!r}")
    numpy_dtype(A.dtype, "to_pydata()")
    fill = _scalar_fill(A, "to_pydata()", "pydata sparse")
    if fmt == "gcxs" and A._sf_layout is torch.sparse_csr and A.dim() == 2 and not A.dense_dim():
        return sparse.GCXS(
            (_np(A._vals), _np(A._col), _np(A._crow)),
            shape=tuple(A.shape),
            compressed_axes=(0,),
            fill_value=fill,
        )
    idx, vals = _scalar_coo(A, coalesce=True)
    x = sparse.COO(
        _np(idx),
        _np(vals),
        shape=tuple(A.shape),
        has_duplicates=False,
        sorted=True,
        fill_value=fill,
    )
    return x if fmt == "coo" else x.asformat("gcxs")


# ---------------------------------------------------------------------- pandas
def from_pandas(obj: Any) -> SparseTensor:
    """SparseTensor of a pandas ``SparseArray`` or ``Series`` of sparse dtype (1-D), or of a
    ``DataFrame`` whose columns are all sparse with one dtype and one fill (2-D, rows x columns),
    fill, pattern and values kept: ``from_pandas(obj).to_dense() ==
    torch.from_numpy(obj.to_numpy())``.

    A DataFrame's row and column labels are kept with the result for :func:`to_pandas` (the round
    trip gives them back); a Series' and SparseArray's are dropped.  A non-numeric dtype or a dense
    column raises TypeError, columns with different fills ValueError.  O(nse), never densifying.

    >>> import pandas as pd, sparsefill
    >>> A = sparsefill.from_pandas(pd.arrays.SparseArray([5, 0, 5, 5, 1], fill_value=5))
    >>> A._nse(), A.fill_value(), A.to_dense()
    (2, tensor(5), tensor([5, 0, 5, 5, 1]))
    """
    pd = _module("pandas", "from_pandas()")
    if isinstance(obj, pd.DataFrame):
        A = _from_frame(pd, obj)
        A._pandas_labels = (  # type: ignore[attr-defined]  # (read back by to_pandas)
            obj.index,
            obj.columns,
        )  # (read back by to_pandas: the round trip keeps them)
        return A
    arr = obj.array if isinstance(obj, pd.Series) else obj
    if not isinstance(arr, pd.arrays.SparseArray):
        raise TypeError(
            "from_pandas() takes a pandas SparseArray, a Series of sparse dtype or a DataFrame "
            f"of sparse columns, got a {type(obj).__name__} of dtype {getattr(obj, 'dtype', '?')}"
        )
    idx, vals, fill = _column(arr, "from_pandas()")
    return sparse_coo_tensor(idx[None], vals, (len(arr),), fill_value=fill, is_coalesced=True)


def _column(arr, what):
    """``(positions, values, fill)`` of a pandas SparseArray."""
    sub = arr.dtype.subtype
    dtype = torch_dtype(sub, f"{what} (pandas dtype {arr.dtype})")
    fill = _exact_fill(arr.fill_value, sub, what)
    return _ints(arr.sp_index.to_int_index().indices), _vals(arr.sp_values, dtype), fill


def _from_frame(pd, df) -> SparseTensor:
    what = "from_pandas()"
    cols = [df.iloc[:, j].array for j in range(df.shape[1])]
    for j, a in enumerate(cols):
        if not isinstance(a, pd.arrays.SparseArray):
            raise TypeError(
                f"{what}: column {df.columns[j]!r} has dtype {a.dtype}, not sparse; a DataFrame "
                "converts when all its columns are sparse (DataFrame.sparse)"
            )
    if not cols:
        raise ValueError(
            f"{what}: a DataFrame with no columns has no sparse dtype or fill to convert"
        )
    dtypes = sorted({str(a.dtype.subtype) for a in cols})
    if len(dtypes) > 1:
        raise TypeError(
            f"{what}: the columns have different dtypes {dtypes}; one SparseTensor has one dtype "
            "(cast with df.astype(pd.SparseDtype(dtype, fill)))"
        )
    parts = [_column(a, what) for a in cols]
    f0 = parts[0][2]
    for j, (_, _, f) in enumerate(parts):
        if not _same_fill(f, f0):
            raise ValueError(
                f"{what}: column {df.columns[j]!r} has fill {f.item()} and column "
                f"{df.columns[0]!r} has {f0.item()}; one SparseTensor has one fill (convert the "
                "columns separately)"
            )
    rows = torch.cat([p[0] for p in parts])
    colno = torch.cat([torch.full_like(p[0], j) for j, p in enumerate(parts)])
    perm = torch.argsort(rows * len(cols) + colno)
    return sparse_coo_tensor(
        torch.stack([rows[perm], colno[perm]]),
        torch.cat([p[1] for p in parts])[perm],
        (df.shape[0], len(cols)),
        fill_value=f0,
        is_coalesced=True,
    )


def to_pandas(A: SparseTensor, *, index: Any = None, columns: Any = None) -> Any:
    """pandas object of a 1-D (``pandas.arrays.SparseArray``) or 2-D (``DataFrame`` of SparseArray
    columns) SparseTensor, with its fill, pattern and stored values; O(nse).

    A DataFrame's labels: ``index`` and ``columns`` where given, else those :func:`from_pandas` kept
    with ``A`` (``to_pandas(from_pandas(df))`` has ``df``'s labels), else ``0..n-1``.

    A hybrid tensor's dense slices become scalar elements (its fill must be one value); an
    indefinite fill, or a position past pandas' int32 sparse indices, raises ValueError.

    >>> import sparsefill
    >>> s = sparsefill.to_pandas(sparsefill.sparse_coo_tensor([[1]], [2.], (3,), fill_value=5.))
    >>> s.to_numpy(), s.sp_index.indices, s.fill_value
    (array([5., 2., 5.], dtype=float32), array([1], dtype=int32), np.float32(5.0))
    """
    A = _exportable(A, "to_pandas()")
    pd = _module("pandas", "to_pandas()")
    if A.dim() not in (1, 2):
        raise ValueError(
            f"to_pandas(): pandas holds 1-D (SparseArray) and 2-D (DataFrame) data; A has shape "
            f"{tuple(A.shape)}"
        )
    np_dtype = numpy_dtype(A.dtype, "to_pandas()")
    fill = _scalar_fill(A, "to_pandas()", "pandas")
    idx, vals = _scalar_coo(A, coalesce=True)
    if idx.shape[1] and int(idx[0].max()) > np.iinfo(np.int32).max:
        raise ValueError(
            f"to_pandas(): pandas' sparse indices are int32 and A stores row {int(idx[0].max())}"
        )
    if A.dim() == 1:
        return _sparse_array(pd, vals, idx[0], A.shape[0], fill, np_dtype)
    n, m = A.shape
    perm = torch.argsort(idx[1] * n + idx[0])  # column by column
    counts = torch.bincount(idx[1], minlength=m).tolist()
    rows, vs = idx[0][perm].split(counts), vals[perm].split(counts)
    index, columns = _labels(pd, A, index, columns)
    frame = pd.DataFrame(
        {j: _sparse_array(pd, v, r, n, fill, np_dtype) for j, (r, v) in enumerate(zip(rows, vs))},
        index=index,
    )
    frame.columns = columns
    return frame


def _labels(pd, A: SparseTensor, index, columns):
    """``(index, columns)`` of ``A``'s DataFrame: those given, else those kept by from_pandas, else
    ranges."""
    kept = getattr(A, "_pandas_labels", None)
    n, m = A.shape
    index = index if index is not None else kept[0] if kept is not None else pd.RangeIndex(n)
    columns = columns if columns is not None else kept[1] if kept is not None else pd.RangeIndex(m)
    index, columns = pd.Index(index), pd.Index(columns)
    if (len(index), len(columns)) != (n, m):
        raise ValueError(
            f"to_pandas(): {len(index)} row and {len(columns)} column labels for a SparseTensor of "
            f"shape {(n, m)}"
        )
    return index, columns


def _sparse_array(pd, vals, rows, length, fill, np_dtype):
    if hasattr(pd.arrays.SparseArray, "from_indices"):  # pandas >= 3.1
        return pd.arrays.SparseArray.from_indices(
            _np(vals), _np(rows), length, fill_value=fill, dtype=np_dtype
        )
    from pandas._libs.sparse import IntIndex

    return pd.arrays.SparseArray(
        _np(vals),
        sparse_index=IntIndex(length, _np(rows).astype(np.int32)),
        fill_value=fill,
        dtype=np_dtype,
    )


# ---------------------------------------------------------------------- to_sparse of other objects
def from_peer(x, fill_value=None):
    """``(A, fill_value)`` for ``to_sparse(x, fill_value=...)``: ``A`` is the SparseTensor of a
    scipy, pydata or pandas sparse object (the ``from_*`` function; None for any other object),
    ``fill_value`` what is left to apply.  A ``fill_value`` equal to ``x``'s own fill is applied
    here, by pruning (O(nse))."""
    A = None
    sp, sparse, pd = (sys.modules.get(n) for n in ("scipy.sparse", "sparse", "pandas"))
    if sp is not None and sp.issparse(x):
        A = from_scipy(x)
    elif (
        sparse is not None
        and isinstance(getattr(sparse, "SparseArray", None), type)
        and isinstance(x, sparse.SparseArray)
    ):
        A = from_pydata(x)
    elif pd is not None and (
        isinstance(x, pd.arrays.SparseArray)
        or isinstance(x, (pd.Series, pd.DataFrame))
        and any(
            isinstance(d, pd.SparseDtype)
            for d in (x.dtypes if isinstance(x, pd.DataFrame) else [x.dtype])
        )
    ):
        A = from_pandas(x)
    if A is not None and fill_value is not None and _is_own_fill(A, fill_value):
        return A.prune(), None
    return A, fill_value


def _is_own_fill(A: SparseTensor, fill_value) -> bool:
    from sparsefill._tensor.fill import normalize_fill

    try:
        f, indefinite, _ = normalize_fill(fill_value, A.dtype, A.device, A._dense_shape)
    except (TypeError, ValueError):
        return False
    return not (indefinite or A._indefinite) and f.shape == A._fill.shape and _same_fill(f, A._fill)


def _same_fill(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal fills of one shape, NaN equal to NaN."""
    same = a == b
    if a.is_floating_point() or a.is_complex():
        same |= a.isnan() & b.isnan()
    return bool(same.all())


def as_dense(x) -> torch.Tensor:
    """A dense tensor of an object ``to_sparse`` takes (not a peer's sparse object).

    An object that densifies (with a ``toarray()`` or ``todense()`` method, e.g. a sparse array of
    another library) goes through the densify policy (``sparsefill.densify_policy``: a
    DensifyWarning, DensifyError past the byte limit) before it is allocated; a numpy array must
    have a dtype torch supports (:func:`torch_dtype`).
    """
    to_dense = next(
        (getattr(x, n) for n in ("toarray", "todense") if callable(getattr(x, n, None))), None
    )
    if to_dense is not None and not isinstance(x, np.ndarray):
        try:
            nbytes = math.prod(x.shape) * np.dtype(x.dtype).itemsize
        except (AttributeError, TypeError):
            raise TypeError(
                f"to_sparse(): cannot tell the dense size of a {type(x).__name__} (no numpy "
                "shape and dtype); convert it to a tensor or numpy array first"
            ) from None
        from sparsefill._tensor.policy import check_densify

        check_densify(f"to_sparse() of a {type(x).__module__}.{type(x).__name__}", nbytes)
        x = np.asarray(to_dense())
    if isinstance(x, np.ndarray):
        torch_dtype(x.dtype, "to_sparse()")
        # (np.matrix -> ndarray; native byte order)
        x = np.asarray(x, dtype=x.dtype.newbyteorder("="))
    return torch.as_tensor(x)


install_hooks(to_scipy=to_scipy, to_pydata=to_pydata, to_pandas=to_pandas)
