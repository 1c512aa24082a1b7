"""The fast path of element-wise ops: the common calls at the cost of the aten calls.

``registry.fast_path`` asks, once per op, whether an op may take :func:`unary_fast` (out of place:
``torch.exp(A)``, ``A * 2``, ``A + B``) or :func:`inplace_fast` (``A.mul_(c)``); either returns
None when a call does not qualify, and the general rule (:mod:`.rule`) takes it::

    f(A, B, c) = SparseTensor(P, f(A[P], B[P], c), f(fill_A, fill_B, c))

``P``: ``A``'s pattern, or the union of two COO patterns (:mod:`.union`).  The callables that run
``f`` are chosen once per op and kind of arguments and cached here (``_CALLS``, ``_BY_VALUE``).
"""

from __future__ import annotations

import torch

from sparsefill._tensor.parts import union_parts
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops._schema import written_positions
from sparsefill.ops._writes import assign_
from sparsefill.ops.pointwise.rule import is_pointwise
from sparsefill.ops.pointwise.union import _spread, union2

aten = torch.ops.aten


def unary_fast_ok(func) -> bool:
    """``func`` may take :func:`unary_fast`: pointwise, out of place, one tensor result (and, the
    registry checks, no handler: ``registry.fast_path``)."""
    r = func._schema.returns
    return (
        is_pointwise(func)
        and not written_positions(func)
        and len(r) == 1
        and str(r[0].type) == "Tensor"
    )


def unary_fast(func, args, kwargs):
    """The common cases at the cost of the aten calls: a coalesced SparseTensor ``A`` first (not a
    view, definite fill), every other positional argument a Python value or a coalesced definite
    SparseTensor
    of ``A``'s dtype and shape that is not a view, keyword arguments Python values::

        f(A, B, c) = SparseTensor(P, f(A[P], B[P], c), f(fill_A, fill_B, c))

    ``P`` is ``A``'s pattern when every SparseTensor operand holds ``A``'s index tensors (``A * A``,
    ``A + A.exp()``: the values as stored), else (COO operands with as many sparse dims) the union
    of the patterns (:func:`union2` for two, cached while small; :func:`_tensor.parts.union_parts`).
    Operands of one dtype beside Python scalars promote alike whatever their rank, so the fills need
    no reshape. ``f`` runs as :func:`_call_of` says.  Returns None when the call does not qualify
    (the general rule then takes it), and when ``f`` raises on a SparseTensor with no element (``A
    // 0`` of an empty integer ``A``: the general rule gives it a fill no element reads,
    :func:`_unread_fill`).
    """
    A = args[0]
    if type(A) is not SparseTensor or A._view is not None or not A._coalesced or A._indefinite:
        return None
    try:  # (free until it raises)
        if not kwargs:  # (the common calls, their kinds known: no argument lists)
            if len(args) == 1:  # torch.exp(A)
                op = _CALLS.get(func._op) or _call_of(func, (A._fill,), kwargs, func._op)
                return A._with_values(op(A._vals), op(A._fill))
            if len(args) == 2:
                c = args[1]
                if c is A:  # A + A (A qualifies: no _joins)
                    key = (func._op, SparseTensor)
                    op = _CALLS.get(key) or _call_of(func, (A._fill, A._fill), kwargs, key)
                    return A._with_values(op(A._vals, A._vals), op(A._fill, A._fill))
                if type(c) is not SparseTensor and not isinstance(c, torch.Tensor):  # A * 2
                    first = _FIRST_TENSOR.get(func._op)
                    # (aten.pow.Scalar(Scalar self, Tensor exponent) takes A second: not this rule)
                    if first is None:
                        first = _FIRST_TENSOR[func._op] = isinstance(
                            func._schema.arguments[0].type, torch.TensorType
                        )
                    if not first:
                        return None
                    v, tc = A._vals, type(c)
                    if (
                        (tc is float and c or tc is int)
                        and -_EXACT < c < _EXACT
                        and v.is_cpu
                        and type(v) is torch.Tensor
                    ):
                        op, c = _BY_VALUE.get((func._op, c, tc, v.dtype)) or _by_value(func, A, c)
                    else:  # (bool, complex, -0.0, NaN, inf, large ints; traced)
                        key = (func._op, tc)
                        op = _CALLS.get(key) or _call_of(func, (A._fill, c), kwargs, key)
                    return A._with_values(op(v, c), op(A._fill, c))
                if not _joins(c, A):
                    return None
                key = (func._op, SparseTensor)
                op = _CALLS.get(key) or _call_of(func, (A._fill, c._fill), kwargs, key)
                if c._idx is A._idx and c._crow is A._crow and c._col is A._col:  # A + A
                    return A._with_values(op(A._vals, c._vals), op(A._fill, c._fill))
                if not _mergeable(c, A):
                    return None
                return _on_union(op, args, kwargs, A, c, False)  # A + B
        for a in kwargs.values():
            if isinstance(a, torch.Tensor):
                return None
        vals, fills, B, many = [A._vals], [A._fill], None, False
        for a in args[1:]:
            if isinstance(a, torch.Tensor):
                if not _joins(a, A):
                    return None
                if a._idx is not A._idx or a._crow is not A._crow or a._col is not A._col:
                    if not _mergeable(a, A):
                        return None
                    many = many or B is not None and a._idx is not B._idx
                    B = a if B is None else B
                vals.append(a._vals)
                fills.append(a._fill)
            else:
                vals.append(a)
                fills.append(a)
        key = (
            (func._op, *map(type, args), *((k, type(v)) for k, v in kwargs.items()))
            if kwargs
            else (func._op, *map(type, args))
        )
        op = _CALLS.get(key) or _call_of(func, fills, kwargs, key)
        if B is None:
            return A._with_values(op(*vals, **kwargs), op(*fills, **kwargs))
        return _on_union(op, args, kwargs, A, B, many)
    # the fill's op may raise where no element reads it (A // B with every element
    except Exception:
        # stored, a fill 0 in B): the general rule decides (_unread_fill), or raises dense's error
        return None


def inplace_fast_ok(func) -> bool:
    """``func`` may take :func:`inplace_fast`: an in-place pointwise op (``mul_``) that writes
    ``self`` alone and whose functional op (``mul``, same overload) may take :func:`unary_fast`."""
    return _functional(func) is not None


def _functional(func):
    """The functional op of an in-place op that writes ``self`` alone and returns it (None
    otherwise; cached)."""
    try:
        return _FUNCTIONAL[func._op]
    except KeyError:
        out = _FUNCTIONAL[func._op] = _functional_of(func)
        return out


_FUNCTIONAL: dict = {}  # OpOverload._op -> _functional(func)


def _functional_of(func):
    name = func._schema.name.split("::")[1]
    if (
        not name.endswith("_")
        or name.endswith("__")
        or func.namespace != "aten"
        or not is_pointwise(func)
        or [p for p, _, _ in written_positions(func)] != [0]
        or len(func._schema.returns) != 1
    ):
        return None
    functional = getattr(getattr(aten, name[:-1], None), func._overloadname, None)
    return functional if functional is not None and unary_fast_ok(functional) else None


def inplace_fast(func, args, kwargs):
    """``A.mul_(c)`` for the calls :func:`unary_fast` takes: the functional op's result, stored in
    ``A``
    (``_writes.assign_``: ``A`` keeps its identity) when it has ``A``'s dtype::

        A.mul_(c)  ==  A.copy_(A * c)          torch.mul(A, c).dtype == A.dtype

    (else, e.g. an int ``A`` times 2.5, the general rule raises torch's error).  ``A`` is no view,
    so nothing writes through; the views of ``A`` see the change (its version and values)."""
    out = unary_fast(_functional(func), args, kwargs)
    if out is None or out._vals.dtype != args[0]._vals.dtype:
        return None
    return assign_(args[0], out)


def _joins(a: SparseTensor, A: SparseTensor) -> bool:
    """A tensor operand ``a`` beside ``A`` in :func:`unary_fast`: a coalesced definite SparseTensor
    of ``A``'s dtype and shape that is not a view."""
    return (
        type(a) is SparseTensor
        and a._view is None
        and a._coalesced
        and not a._indefinite
        and a._vals.dtype == A._vals.dtype
        and a._size == A._size
    )


def _mergeable(a: SparseTensor, A: SparseTensor) -> bool:
    """Another pattern than ``A``'s that :func:`unary_fast` merges: both COO, as many sparse
    dims."""
    return (
        a._sf_layout is torch.sparse_coo
        and A._sf_layout is torch.sparse_coo
        and a._idx.shape[0] == A._idx.shape[0]
    )


def _on_union(op, args, kwargs, A: SparseTensor, B: SparseTensor, many: bool):
    """``op`` on the SparseTensor operands' values at the union of their patterns (``A``'s and
    ``B``'s: two; or ``many``) and on the fills; None while traced (the general rule: a union's size
    is data)."""
    # torch.compile (fake tensors): the general rule (a union's nse is unbacked)
    if type(A._vals) is not torch.Tensor:
        return None
    if many:  # three patterns or more
        idx, at = union_parts([a for a in args if type(a) is SparseTensor])
        it = iter(at)
        vals = [next(it) if type(a) is SparseTensor else a for a in args]
    else:  # the two patterns' union
        idx, (pa, pb) = union2(A, B)
        n = idx.shape[1]
        va, vb = _spread(A, pa, n), _spread(B, pb, n)
        # (each operand's own values: a third one shares A's or B's index, not its values, as an
        # optimizer's exp_avg and denom share one)
        vals = [
            a
            if type(a) is not SparseTensor
            else va
            if a is A
            else vb
            if a is B
            else _spread(a, pa if a._idx is A._idx else pb, n)
            for a in args
        ]
    fills = [a._fill if type(a) is SparseTensor else a for a in args]
    return SparseTensor._make(
        torch.sparse_coo,
        A._size,
        op(*vals, **kwargs),
        op(*fills, **kwargs),
        idx,
        None,
        None,
        False,
        True,
        False,
    )


# The caches of the fast path are keyed by ``func._op`` (the C++ op), not by the OpOverload
# ``func``, whose ``__hash__`` is Python code (a large share of this path's own cost).
# (OpOverload._op, argument kinds) -> the callable unary_fast runs it with (see _call_of)
_CALLS: dict = {}
# (OpOverload._op, Python int/float, its type, dtype) -> (op, operand): see _by_value
_BY_VALUE: dict = {}
# |c| below which a Python int converts to float64 exactly (so to float32 in one rounding)
_EXACT = 2**53
_CAST_DTYPES = (torch.float32, torch.float64)


_FIRST_TENSOR: dict = {}  # OpOverload._op -> its first argument is a Tensor


def _by_value(func, A: SparseTensor, c):
    """``(op, operand)`` that :func:`unary_fast` runs ``func(A, c)`` with, for a Python int or float
    ``c`` (nonzero when a float, finite, below 2**53) and CPU values (cached under ``(func, c,
    type(c), dtype)``, at most 1024 entries: ``1 == 1.0`` hash alike, and an integer ``A * 1.0`` is
    float where ``A * 1`` is not).
    The operand is a cached 0-d CPU tensor of the values' dtype holding ``c`` where that is exact::

        func(v, c) == func(v, torch.tensor(c, dtype=v.dtype))
            v float32/float64, func taking a Tensor there

    (torch wrapped ``c`` as a *wrapped number*, which promotes as a Python number and which
    TensorIterator casts to the common dtype, ``v.dtype`` for a float ``v``: that cast done once,
    not twice a call).  Not for reduced floats (their kernels read the scalar uncast);
    -0.0 and NaN (keys equal to others') never come here.  Else the operand is ``c`` itself."""
    dtype, schema, value = A._vals.dtype, func._schema.arguments, c
    if dtype in _CAST_DTYPES and len(schema) > 1 and isinstance(schema[1].type, torch.TensorType):
        with torch.inference_mode(False):  # (usable in and out of inference mode)
            c = torch.tensor(c, dtype=dtype)
        key = (func._op, "0-d tensor")
    else:
        key = (func._op, type(c))
    out = (_CALLS.get(key) or _call_of(func, (A._fill, c), {}, key), c)
    # (a dispatch mode: _call_of's choice is not cached either)
    if not torch._C._len_torch_dispatch_stack():
        if len(_BY_VALUE) >= 1024:
            _BY_VALUE.clear()
        _BY_VALUE[(func._op, value, type(value), dtype)] = out
    return out


def _call_of(func, probe, kwargs, key):
    """What runs exactly ``func`` on plain tensors and Python values of the kinds in ``key``,
    fastest: torch's Python binding of the op's name (``torch.exp``: cheaper than ``func._op``,
    which parses its arguments against the schema) when, run once on ``probe`` (the
    call's fill arguments), it dispatches to ``func`` and to nothing else; else ``func._op``.
    Cached under ``key``, unless a dispatch mode is active (``torch.compile``'s fake tensors, a
    recording mode: ``func._op``, not cached)."""
    if torch._C._len_torch_dispatch_stack():
        return func._op
    call = func._op
    binding = (
        getattr(torch._C._VariableFunctions, func._schema.name.split("::")[1], None)
        if func.namespace == "aten"
        else None
    )
    if binding is not None:
        mode = _record_mode()
        try:
            with mode:
                binding(*probe, **kwargs)
            seen = mode.seen
        except Exception:  # (the binding does not take these arguments: the schema's call)
            seen = None
        if seen == [func]:
            call = binding
    if key is not None:
        _CALLS[key] = call
    return call


def _record_mode():
    """A dispatch mode recording the aten ops a call runs (``mode.seen``).  Its
    ``__torch_dispatch__`` is not wrapped in ``torch._disable_dynamo`` (``_should_skip_dynamo``:
    False), which would import ``torch._dynamo`` (0.5 s) on the first call of every op family
    (tests/test_coldstart.py)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls):
            return False

        def __torch_dispatch__(self, f, types, args=(), kw=None):
            self.seen.append(f)
            return f(*args, **(kw or {}))

    mode = Record()
    mode.seen = []
    return mode
