"""Schema and meta helpers of aten calls: their flat arguments, what they write, and torch's result
shape, dtype and errors without the data (the same shape, dtype and errors)::

    meta_call(func, A, *rest).shape == func(A.to_dense(), *rest).shape

Lower than every op handler: this module knows ``SparseTensor`` only as a type (``written_args``).
"""

from __future__ import annotations

import functools
import warnings

import torch

from sparsefill._tensor.tensor import SparseTensor


def flat_args(args, kwargs):
    """The arguments of an aten call, lists of tensors opened one level (aten schemas nest no
    deeper)."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)):
            yield from a
        else:
            yield a


@functools.cache
def meta_of(A: torch.Tensor) -> torch.Tensor:
    """A meta tensor of ``A``'s shape and dtype, to run an op for torch's result shape, dtype and
    errors. Expanded from one element: no storage-size limit (a (2**31, 2**31) float64 shape is
    fine)."""
    return torch.empty((), dtype=A.dtype, device="meta").expand(A.shape)


def meta_like(t):
    """The meta form of an operand, for torch's errors and result: :func:`meta_of` of a
    SparseTensor, ``t.to("meta")`` of a dense tensor (its strides kept), anything else as it
    is."""
    if isinstance(t, SparseTensor):
        return meta_of(t)
    return t.to("meta") if isinstance(t, torch.Tensor) else t


_META_CACHE: dict = {}


def _key(a):
    """A hashable stand-in for an op argument (None when it has none: the call is not cached)."""
    if isinstance(a, (list, tuple)):
        items = [_key(x) for x in a]
        return None if any(i is None for i in items) else (type(a).__name__, *items)
    if a is None or isinstance(
        a, (bool, int, float, str, torch.dtype, torch.layout, torch.memory_format)
    ):
        return (type(a).__name__, a)
    return None


def meta_call(func, A: torch.Tensor, *rest, **kwargs):
    """``func(meta_of(A), *rest, **kwargs)``, memoised on (func, shape, dtype, arguments): torch's
    meta kernels for reductions run Python references (~0.3 ms); a repeated call costs a dict
    lookup."""
    key = _key((rest, sorted(kwargs.items())))
    if key is None:
        return func(meta_of(A), *rest, **kwargs)
    key = (func, tuple(A.shape), A.dtype, torch.get_default_dtype(), key)
    out = _META_CACHE.get(key)
    if out is None:
        out = func(meta_of(A), *rest, **kwargs)
        if len(_META_CACHE) > 4096:
            _META_CACHE.clear()
        _META_CACHE[key] = out
    return out


def probe_of(A: torch.Tensor) -> torch.Tensor:
    """A real tensor of ``A``'s dtype and device with at most one element per dim (its 0-size dims
    kept): torch's rank, dim, dtype and device errors, and its result dtype, from the real kernels.
    (A meta tensor runs torch's Python meta kernel for many ops -- mean, std, norm, logsumexp, mv,
    addmm, cat, stack, roll... -- whose first call in a process imports ``torch._dynamo``: 0.4-1
    s.)"""
    return torch.zeros([min(n, 1) for n in A.shape], dtype=A.dtype, device=A.device)


def reduced_shape(shape, dims, keepdim: bool) -> list:
    """The shape of a reduction of ``shape`` over ``dims`` (None or empty: every dim)::

        reduced_shape(s, dims, keepdim) == list(torch.sum(torch.zeros(s), dims, keepdim).shape)

    >>> (
    ...     reduced_shape((4, 5, 6), [1], False),
    ...     reduced_shape((4, 5, 6), [-1], True),
    ...     reduced_shape((4, 5), None, False),
    ... )
    ([4, 6], [4, 5, 1], [])
    """
    nd = len(shape)
    dims = {d % nd for d in dims} if dims and nd else set(range(nd))
    return [1 if d in dims else n for d, n in enumerate(shape) if keepdim or d not in dims]


def reduction_meta(func, A: torch.Tensor, dims, keepdim: bool, /, *rest, **kwargs) -> torch.Tensor:
    """``meta_call(func, A, *rest, **kwargs)`` for a reduction over ``dims`` (None or empty: every
    dim) without torch's Python meta kernels: errors and dtype from ``func`` on :func:`probe_of`
    ``(A)``, the shape from :func:`reduced_shape` -- checked on the probe's result, else (a ``dims``
    torch reads
    otherwise) the meta call.  Memoised as ``meta_call``::

        reduction_meta(f, A, dims, k, *rest).shape == meta_call(f, A, *rest).shape  (and the dtype)
    """
    key = _key((rest, sorted(kwargs.items())))
    if key is not None:
        key = ("reduction", func, tuple(A.shape), A.dtype, A.device, torch.get_default_dtype(), key)
        out = _META_CACHE.get(key)
        if out is not None:
            return out
    P = probe_of(A)
    with warnings.catch_warnings():  # (std's "degrees of freedom <= 0" of a one-element probe)
        warnings.simplefilter("ignore", UserWarning)
        r = func(P, *rest, **kwargs)
    r = r[0] if isinstance(r, tuple) else r
    if (
        isinstance(dims, (list, tuple))
        and not dims
        or list(r.shape) != reduced_shape(P.shape, dims, keepdim)
    ):
        out = meta_call(func, A, *rest, **kwargs)
    else:
        out = torch.empty((), dtype=r.dtype, device="meta").expand(
            reduced_shape(A.shape, dims, keepdim)
        )
    if key is not None:
        if len(_META_CACHE) > 4096:
            _META_CACHE.clear()
        _META_CACHE[key] = out
    return out


def check_dtype(func, A: torch.Tensor, *rest, **kwargs) -> None:
    """Run ``func`` on at most one element of ``A``'s dtype and device (its 0-size dims kept):
    torch's dtype errors and empty-reduction errors, which meta kernels skip."""
    func(torch.zeros([min(n, 1) for n in A.shape], dtype=A.dtype, device=A.device), *rest, **kwargs)


def written_positions(func) -> tuple:
    """``(position, name, keyword-only)`` of each argument ``func``'s schema marks as written
    (cached per op, under ``func._op``: an OpOverload's own ``__hash__`` is Python code)."""
    w = _WRITTEN.get(func._op)
    if w is None:
        w = _WRITTEN[func._op] = tuple(
            (i, a.name, a.kwarg_only)
            for i, a in enumerate(func._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write
        )
    return w


_WRITTEN: dict = {}  # OpOverload._op -> written_positions


def written_args(func, args, kwargs) -> list:
    """The SparseTensor arguments ``func``'s schema marks as written to (``self`` of ``add_``,
    ``out=``)."""
    out = []
    for i, name, kwarg_only in written_positions(func):
        v = args[i] if i < len(args) and not kwarg_only else kwargs.get(name)
        out.extend(v if isinstance(v, (list, tuple)) else [v])
    return [v for v in out if isinstance(v, SparseTensor)]


def broadcast_error(args, kwargs) -> None:
    """Raise torch's own error where the tensor operands (``out=`` aside) do not broadcast, as
    TensorIterator words it (``The size of tensor a (12) must match the size of tensor b (13) at
    non-singleton dimension 0``): their shapes folded pairwise, in order, by torch's ``infer_size``,
    nothing allocated."""
    shape = None
    for a in (*args, *(v for k, v in kwargs.items() if k != "out")):
        if isinstance(a, torch.Tensor):
            shape = a.shape if shape is None else torch._C._infer_size(shape, a.shape)
