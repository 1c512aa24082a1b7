"""Element-wise ops (aten ops tagged ``torch.Tag.pointwise``)::

    f(A, B, ...) == SparseTensor(P, f(A[P], B[P], ...), fill_value=f(fill_A, fill_B, ...))
    so  f(A, B).to_dense() == f(A.to_dense(), B.to_dense())

``P`` is A's pattern when there is one SparseTensor operand (or the same index tensors
everywhere: ``A * A``, ``A + A.exp()``; no merge), else the union of the patterns, merged
by linear keys.  Other operands: Python scalars, 0-d tensors, and dense tensors that
broadcast over the dense dims only (the fill may become an array).  A dense operand that
varies along the sparse dims keeps the pattern where ``f(fill, t)`` is one value (``A * e``, a zero
fill), else makes the result dense by nature: computed densely, quietly (:mod:`.pointwise_dense`).

Each fill goes through the op as a batch of one, ``(1, *fill.shape)``, so that type
promotion and broadcasting treat it as they treat the values.  Uncoalesced inputs are
coalesced first (``f`` of a sum is not the sum of ``f``).  An indefinite operand leaves the
result unspecified wherever it is unspecified, and a dense operand that varies along the sparse
dims is then read only there.  SparseTensors broadcast over size-1 dims (their stored elements
repeat along the expanded dims); ``out=`` stores into a SparseTensor.
"""

from __future__ import annotations

import array
import functools
import weakref

import torch

from sparsefill._kernels import index as _index, merge as _merge
from sparsefill._kernels.trace import same_tensor
from sparsefill._tensor.parts import (
    coalesce_of,
    coalesced_parts,
    dense_of,
    parts_to_sparse,
    rewrap,
    union_parts,
)
from sparsefill._tensor.dense_dims import one_split
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops._schema import broadcast_error, flat_args, written_args, written_positions
from sparsefill.ops._writes import assign_
from sparsefill.ops.pointwise.dense_operands import (
    _constant_fill,
    _dense_call,
    _into_dense,
    _over_dense_dims,
    join_small,
    unexpanded,
)


aten = torch.ops.aten
# element-wise aten ops that torch does not tag pointwise (every overload, out= and in-place ones
# included)
UNTAGGED = {
    getattr(p, o)
    for p in (
        aten.rsub,
        aten.polar,
        aten.masked_fill,
        aten._prelu_kernel,
        aten._prelu_kernel_backward,
        aten.complex,
        aten.floor_divide,
        aten.floor_divide_,
        aten.log_sigmoid_backward,
        aten.elu_backward,
        aten.hardsigmoid_backward,
        aten.hardswish_backward,
        aten.hardtanh_backward,
        aten.leaky_relu_backward,
        aten.mish_backward,
        aten.softplus_backward,
        aten.softshrink_backward,
        aten.hardshrink_backward,
        aten.threshold_backward,
        aten.gelu_backward,
        aten.silu_backward,
        aten.sigmoid_backward,
        aten.tanh_backward,
        aten.logit_backward,
    )
    for o in p.overloads()
}


@functools.cache
def is_pointwise(func) -> bool:
    """Deterministic element-wise ops (random ones would give every unspecified element one draw);
    an in-place op (``abs_``) is one when its functional form (``abs``, same overload) is."""
    tags = func.tags
    if (
        torch.Tag.pointwise in tags and torch.Tag.nondeterministic_seeded not in tags
    ) or func in UNTAGGED:
        return True
    name = func._schema.name.split("::")[1]
    if name.endswith("_") and not name.endswith("__"):
        functional = getattr(getattr(aten, name[:-1], None), func._overloadname, None)
        return functional is not None and is_pointwise(functional)
    return False


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


_UNION_CACHE_MAX = 1024  # stored elements of two patterns up to which union2 caches their union
# (id(A._idx), id(B._idx)) -> (weakrefs of both, their versions and the union's, the union)
_UNIONS: dict = {}
_UNIONS_SIZE = 64
_SMALL = 64  # stored elements of two CPU patterns up to which union2 merges them as Python tuples


def union2(A: SparseTensor, B: SparseTensor):
    """``(indices, (pa, pb))``: the union of two coalesced COO patterns of one sparse shape, ``A``'s
    stored
    elements at its positions ``pa``, ``B``'s at ``pb``::

        indices[:, pa] == A._idx     indices[:, pb] == B._idx  (sorted, unique: a coalesced pattern)

    (``pa`` None: ``A``'s pattern holds ``B``'s, ``indices`` is ``A._idx`` itself; likewise ``pb``),
    by :func:`_kernels.merge.union_or_superset` of the linear keys (:func:`_union_small` for small
    CPU patterns); while the two hold at most ``_UNION_CACHE_MAX`` elements, cached per pair of
    index tensors (patterns that recur, a training step or a loop over small tensors, merge once;
    the key is the two tensors' identity and versions, cheaper to form than
    ``_kernels.grouping.pattern_cached``'s storage keys; the pattern of index tensors changed
    through ``set_`` is a version change too).  The indices are shared by the results: an in-place
    change of them is seen (version) and the union merged again."""
    ia, ib = A._idx, B._idx
    if ia.shape[1] + ib.shape[1] > _UNION_CACHE_MAX:
        return _merge2(A, B)
    key = (id(ia), id(ib))
    try:
        hit = _UNIONS.get(key)
        if (
            hit is not None
            and hit[0]() is ia
            and hit[1]() is ib
            and hit[2] == (ia._version, ib._version, hit[3][0]._version)
        ):
            return hit[3]
        versions = (ia._version, ib._version)
    except RuntimeError:  # inference tensors: no version counter, no cache
        return _merge2(A, B)
    out = _merge2(A, B)
    if len(_UNIONS) >= _UNIONS_SIZE:
        _UNIONS.pop(next(iter(_UNIONS)), None)
    _UNIONS[key] = (weakref.ref(ia), weakref.ref(ib), versions + (out[0]._version,), out)
    return out


def _merge2(A: SparseTensor, B: SparseTensor):
    """:func:`union2`, uncached."""
    ia, ib = A._idx, B._idx
    d = ia.shape[0]
    if 0 < ia.shape[1] + ib.shape[1] <= _SMALL and d and ia.is_cpu and ib.is_cpu:
        idx, pa, pb = _union_small(ia, ib)
        return idx, (pa, pb)
    S = A._size[:d]
    ka, kb = (T._idx[0] if d == 1 else _index.linearize(T._idx, S) for T in (A, B))
    # (None: that pattern is the union, e.g. a gradient's)
    union, pa, pb = _merge.union_or_superset(ka, kb)
    if pa is None or pb is None:
        return (ia if pa is None else ib), (pa, pb)
    return (union[None] if d == 1 else _index.unravel(union, S)), (pa, pb)


def _union_small(ia: torch.Tensor, ib: torch.Tensor):
    """``(indices, pa, pb)``: the union of two coalesced CPU COO index tensors (``d >= 1`` sparse
    dims, some stored element), merged as Python tuples (row-major order is their lexicographic
    order), the three results views of one int64 tensor built from a buffer: on a few stored
    elements this beats the fixed cost of torch ops.

    >>> [
    ...     t.tolist()
    ...     for t in _union_small(torch.tensor([[0, 1], [2, 0]]), torch.tensor([[0, 0], [1, 2]]))
    ... ]
    [[[0, 0, 1], [1, 2, 0]], [1, 2], [0, 1]]
    """
    d = ia.shape[0]
    if d == 1:  # (keys as they are: no tuples)
        ta, tb = ia.tolist()[0], ib.tolist()[0]
        union = sorted(set(ta).union(tb))
        flat = union.copy()
    else:
        ta, tb = list(zip(*ia.tolist())), list(zip(*ib.tolist()))
        union = sorted(set(ta).union(tb))
        flat = [x for col in zip(*union) for x in col]
    at = {t: i for i, t in enumerate(union)}
    k, na = len(union), len(ta)
    flat += [at[t] for t in ta] + [at[t] for t in tb]
    # (clone: torch-owned storage)
    buf = torch.frombuffer(array.array("q", flat), dtype=torch.int64).clone()
    return (
        buf.as_strided((d, k), (k, 1)),
        buf.as_strided((na,), (1,), d * k),
        buf.as_strided((len(tb),), (1,), d * k + na),
    )


def _spread(T: SparseTensor, pos: torch.Tensor | None, n: int) -> torch.Tensor:
    """``T``'s values at ``n`` positions: its stored ones at ``pos``, its fill elsewhere (``pos``
    None or of length ``n``: ``T``'s pattern is the union)."""
    v, fill = T._vals, T._fill
    if pos is None or pos.shape[0] == n:  # T's pattern is the union
        return v
    if v.dim() == 1 and v.is_cpu and not fill.dim():  # (fill_, put_: cheaper on small tensors)
        return v.new_empty(n).fill_(fill).put_(pos, v)
    return v.new_empty((n,) + v.shape[1:]).copy_(fill).index_copy_(0, pos, v)


def pointwise_rule(func, args, kwargs, pattern_only=False):
    """The rule (module docstring); ``pattern_only``: None where the result would be dense by nature
    (:func:`.pointwise_dense.join_small` asks)."""
    out = kwargs.get("out")
    # out=: computed out of place into fresh buffers of out's dtype, then stored
    if out is not None:
        if not isinstance(out, SparseTensor):
            return NotImplemented
        kwargs = {k: v for k, v in kwargs.items() if k != "out"}
    tensors = [t for t in flat_args(args, kwargs) if isinstance(t, torch.Tensor)]
    sparse = list({id(t): t for t in tensors if isinstance(t, SparseTensor)}.values())
    if not sparse:
        return NotImplemented
    A = sparse[0]
    written = [out] if out is not None else written_args(func, args, kwargs)
    if out is None and written_positions(func) and not (len(written) == 1 and written[0] is A):
        # e.g. a dense tensor updated from A
        return _into_dense(func, args, kwargs, tensors, sparse, written)
    # a 0-d SparseTensor beside a larger one is one value: it joins as a 0-d dense tensor (same
    # promotion), the first one too unless written (0-d f64 A + f32 B is f32, as dense)
    big = A if A.dim() or written else next((T for T in sparse if T.dim()), A)
    sub = {id(T): dense_of(T) for T in sparse if T.dim() == 0 < big.dim() and not T._indefinite}
    sparse = [T for T in sparse if id(T) not in sub]
    A = sparse[0]
    if not A.dim():
        if all(t.dim() == 0 for t in tensors):
            return _zero_dim(func, args, kwargs, sparse, out, bool(written))
        # beside a dense operand with dims: a 0-d dense one promotes as A's values do (zero-dim
        # tensors alike)
        sub.update(
            {
                id(t): t.reshape(1)
                for t in tensors
                if t.dim() == 0 and not isinstance(t, SparseTensor)
            }
        )
    layout = A._sf_layout
    conv = sparse
    # operands that broadcast along a sparse dim: as dense ones, where small
    if len(sparse) > 1 and out is None:
        conv = unexpanded(sparse, written)
        if any(C.shape != conv[0].shape for C in conv[1:]):
            joined = join_small(pointwise_rule, func, args, kwargs, sparse, conv, written)
            if joined is not None:
                return joined
    # operands that split their dims differently
    if any(T.dense_dim() != conv[0].dense_dim() for T in conv[1:]):
        # (_tensor/dense_dims.py)
        conv, layout = one_split(conv, layout, A if written and out is None else None)
    if any(C.shape != conv[0].shape for C in conv[1:]):
        expanded = _broadcast(conv)
        if expanded is None:
            broadcast_error(args, kwargs)  # (torch's error: the sizes that do not match)
            return NotImplemented
        if written and out is None and expanded[0][1] is not A:
            raise RuntimeError(
                f"output with shape {list(A.shape)} doesn't match the broadcast shape "
                f"{list(expanded[0][1].shape)}"
            )
        sparse, A = [(T, E) for T, (_, E) in zip(sparse, expanded)], expanded[0][1]
    else:
        sparse, A = list(zip(sparse, conv)), conv[0]
    indefinite = any(E._indefinite for _, E in sparse)
    dense_ops = [t for t in tensors if not isinstance(t, SparseTensor) and t.dim()]
    over = {id(t): _over_dense_dims(t, A) for t in dense_ops}
    varying = [t for t in dense_ops if over[id(t)] is None]
    # the result's fill where the dense operands vary along the sparse dims but op(fills, them) not
    const = None
    if varying:  # dense operands that vary along the sparse dims
        try:
            shape = torch.broadcast_shapes(A.shape, *[t.shape for t in dense_ops])
        except RuntimeError:
            broadcast_error(args, kwargs)
            return NotImplemented
        # (not inside a backward: torch's derivative formulas reshape such intermediates in place,
        # unsqueeze_)
        if (
            not indefinite
            and not written
            and shape == A.shape
            and torch._C._current_graph_task_id() == -1
        ):
            # e.g. A * e with A's fill 0: 0 * e == 0
            const = _constant_fill(func, args, kwargs, sparse, A)
        if not indefinite and const is None:  # the result is dense by nature
            return (
                None
                if pattern_only
                else NotImplemented
                if written
                else _dense_call(func, args, kwargs, tensors)
            )
        # a masked operand (or a constant fill): the result is specified where A is; the dense
        # operands are read there
        if shape != A.shape:
            sparse = [(T, E if E.shape == shape else _expand(E, shape)) for T, E in sparse]
            A = sparse[0][1]
            over = {id(t): _over_dense_dims(t, A) for t in dense_ops}
    sub.update({k: v for k, v in over.items() if v is not None})
    return _on_pattern(
        func, args, kwargs, sparse, A, layout, sub, varying, out, written, indefinite, const
    )


def _on_pattern(
    func, args, kwargs, sparse, A, layout, sub, varying, out, written, indefinite, const
):
    """The last step of :func:`pointwise_rule`: ``sparse`` holds pairs (operand, the operand
    broadcast to ``A``), aligned here on one pattern; the op runs once on their values and once on
    their fills (each a batch of one), the other operands substituted by ``sub`` (id -> tensor;
    the dense operands in ``varying`` are read at the result's positions).  ``const``: the result's
    fill where it does not follow from the fills."""
    build, at = _align([E for _, E in sparse], layout)
    if varying:
        idx = coalesced_parts(build(at[id(A)], None))[0]  # the result's positions (a CSR's: cached)
        vshape = at[id(A)].shape  # (a batched CSR stores (*batch, nnz, *dense))
        sub.update({id(t): t.broadcast_to(A.shape)[tuple(idx)].reshape(vshape) for t in varying})
    at = {id(T): at[id(E)] for T, E in sparse}
    fills = {id(T): E._fill for T, E in sparse}

    def apply(x):  # pointwise schemas are flat: substitute operands by id
        sub.update(x)
        kw = {k: sub.get(id(v), v) for k, v in kwargs.items()}
        if out is not None:
            kw["out"] = torch.empty(0, dtype=out.dtype, device=out.device)
        return func(*[sub.get(id(a), a) for a in args], **kw)

    # each fill as a batch of one, padded to the common rank: (1, *fill.shape)
    rank = max([d.dim() for d in sub.values()] + [f.dim() for f in fills.values()])
    fills = {k: f.reshape((1,) * (1 + rank - f.dim()) + tuple(f.shape)) for k, f in fills.items()}
    # in place: compute out of place, then store (inner tensors may be shared)
    if written and out is None:
        if not indefinite:
            fills[id(A)] = A._fill.expand(A._dense_shape)[None]  # the result's fill may be an array
        vals = apply({**at, id(A): at[id(A)].clone()})
        try:
            fill = None if indefinite else apply({**fills, id(A): fills[id(A)].clone()})[0]
        except Exception:
            fill = _unread_fill(A, vals)[0]
        return assign_(A, build(vals, fill))
    vals = apply(at)
    if const is not None:
        return build(vals, const.to(vals.dtype))
    try:
        out_fills = None if indefinite else apply(fills)
    except Exception:
        out_fills = _unread_fill(A, vals)
    nd = A.dense_dim()
    if isinstance(vals, torch.Tensor):
        result = build(vals, None if out_fills is None else _unbatch(out_fills, nd))
        return result if out is None else assign_(out, result)
    return type(vals)(
        build(v, None if out_fills is None else _unbatch(f, nd))
        for v, f in zip(vals, out_fills or vals)
    )


def _zero_dim(func, args, kwargs, sparse, out, written: bool):
    """Every operand 0-d: each SparseTensor is one value, its stored element or its fill, and the op
    runs on 0-d tensors exactly as on dense ones (zero-dim type promotion; ``masked_fill``'s value
    must be 0-d)::

        f(A, b).to_dense() == f(A.to_dense(), b)

    The result stores its element where an operand stores one (unspecified where an indefinite
    operand stores none); its fill is ``f`` of the fills.  In place (``written``: the first operand)
    and ``out=`` store it.

    >>> import sparsefill
    >>> A = sparsefill.sparse_coo_tensor(
    ...     torch.zeros(0, 1, dtype=torch.int64), torch.tensor([2.0]), (), fill_value=0.0
    ... )
    >>> A.masked_fill(torch.tensor(True), torch.tensor(5.)).to_dense()
    tensor(5.)
    """
    # (duplicates summed: one value)
    parts = {id(T): T if T._coalesced else coalesce_of(T) for T in sparse}
    has = {k: P._vals.shape[0] > 0 for k, P in parts.items()}
    indefinite = any(P._indefinite for P in parts.values())
    specified = any(has.values()) and not any(
        P._indefinite and not has[k] for k, P in parts.items()
    )
    target = out if out is not None else sparse[0] if written else None

    def call(point):  # the op on 0-d stand-ins (the target's cloned: an in-place op writes it)
        if written and out is None:
            point[id(sparse[0])] = point[id(sparse[0])].clone()
        kw = {k: point.get(id(v), v) for k, v in kwargs.items()}
        if out is not None:
            kw["out"] = torch.empty(0, dtype=out.dtype, device=out.device)
        return func(*[point.get(id(a), a) for a in args], **kw)

    # each operand's value: stored, else its fill (an unspecified one only types the result: 1 of
    # its dtype)
    vals = call(
        {
            k: P._vals[0] if has[k] else P._vals.new_ones(()) if P._indefinite else P._fill
            for k, P in parts.items()
        }
    )
    try:
        fills = None if indefinite else call({k: P._fill for k, P in parts.items()})
    except Exception:  # noqa: BLE001 - the fill is read only where no operand stores the element
        if specified:
            fills = vals
        else:
            raise
    single = isinstance(vals, torch.Tensor)
    results = [
        _one_value(v, None if fills is None else f, specified)
        for v, f in zip([vals] if single else vals, [fills] if single else fills or vals)
    ]
    if target is not None:
        return assign_(target, results[0])
    return results[0] if single else type(vals)(results)


def _one_value(v: torch.Tensor, fill, specified: bool) -> SparseTensor:
    """A 0-d SparseTensor holding ``v`` (stored if ``specified``) with ``fill`` (None:
    indefinite)."""
    idx = torch.zeros((0, int(specified)), dtype=torch.int64, device=v.device)
    vals = v.reshape(1) if specified else v.new_empty(0)
    return parts_to_sparse(
        idx,
        vals,
        (),
        v.new_empty(0) if fill is None else fill.to(v.dtype),
        indefinite=fill is None,
        coalesced=True,
    )


def _unread_fill(A: SparseTensor, vals):
    """The fill (a batch of one: zeros of the values' dtype, one per result) of a result of ``A``'s
    shape that has no unspecified element (no element at all, or ``vals``, coalesced, store every
    one), whose fills' op raised; called in an ``except`` block, which it re-raises when an element
    is unspecified (dense raises there too).
    No element reads that fill, so any is exact; dense returns the result::

        A.numel() == 0  =>  (A // 0).to_dense() == A.to_dense() // 0          (though 0 // 0 raises)
        nse == numel    =>  (A // B).to_dense() == A.to_dense() // B.to_dense()
            (though fill_A // 0 raises)

    >>> import sparsefill
    >>> A = sparsefill.sparse_coo_tensor(
    ...     torch.zeros(1, 0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), (0,)
    ... )
    >>> torch.equal((A // 0).to_dense(), A.to_dense() // 0)
    True
    >>> A = sparsefill.sparse_coo_tensor([[0, 1]], [4, 6], (2,), fill_value=1)
    >>> B = sparsefill.sparse_coo_tensor([[0, 1]], [2, 3], (2,))
    >>> (A // B).to_dense()
    tensor([2, 2])
    """
    first = vals if isinstance(vals, torch.Tensor) else vals[0]
    if A.numel() and first.numel() != A.numel():
        raise
    if isinstance(vals, torch.Tensor):
        return vals.new_zeros(1)
    return type(vals)(v.new_zeros(1) for v in vals)


def _unbatch(batch: torch.Tensor, ndense: int) -> torch.Tensor:
    """A result fill from its batch of one, less leading size-1 dims beyond the dense dims."""
    f = batch[0]
    while f.dim() > ndense and f.shape[0] == 1:
        f = f[0]
    return f


def _broadcast(sparse):
    """``[(T, T expanded to the common shape)]`` for SparseTensors that broadcast over size-1 dims
    (as many dense dims each), else None.  Expanding sparse dim ``d`` of size 1 to ``n`` repeats the
    stored elements ``n`` times: the result pattern is the union of the expanded patterns; a dense
    dim expands the values and the fill (``A - A.logsumexp(-1, keepdim=True)`` on a hybrid
    ``A``)."""
    try:
        shape = torch.broadcast_shapes(*[T.shape for T in sparse])
    except RuntimeError:
        return None
    return [(T, T if T.shape == shape else _expand(T, shape)) for T in sparse]


def _expand(T: SparseTensor, shape) -> SparseTensor:
    """``T`` expanded to ``shape`` physically (``shape.expand``: the stored elements repeat)."""
    from sparsefill.ops.shape.reshape import (
        expand,
    )  # (shape.py imports the registry, which imports this module)

    return expand(T, list(shape), keep_split=True)


def _align(sparse, layout):
    """``(build(values, fill) -> SparseTensor, {id(T): T's values at the result's positions})``.

    One pattern (or the same index tensors everywhere): the values as stored.  Otherwise the
    union of the patterns, merged by linear keys, less the positions
    an indefinite operand leaves unspecified (those stay unspecified in the result).  The result
    has ``layout``.
    """
    A = sparse[0]
    if all(_same_pattern(T, A) for T in sparse[1:]):
        B = A if A._coalesced else coalesce_of(A)
        return (
            lambda v, f: rewrap(
                B,
                values=v,
                fill=v.new_empty(0) if f is None else f,
                indefinite=f is None,
                known_zero=False,
            ),
            {id(T): (B if T is A else T)._vals for T in sparse},
        )
    idx, values = union_parts(sparse)

    def build(v, f):
        return parts_to_sparse(
            idx,
            v,
            A.shape,
            v.new_empty(0) if f is None else f,
            indefinite=f is None,
            layout=layout,
            coalesced=True,
        )

    return build, {id(T): v for T, v in zip(sparse, values)}


def _same_pattern(T: SparseTensor, A: SparseTensor) -> bool:
    """Same coalesced pattern: the same index tensors, or (a 2-d CSR beside a COO of the same stored
    elements, e.g. a gradient built from the CSR's indices) equal indices, checked in O(nse) with no
    merge.  Both layouts store a coalesced pattern in row-major order, so the values line up."""
    if not (T._coalesced and A._coalesced):
        return False
    if T._sf_layout is not A._sf_layout:
        return _same_across_layouts(T, A)
    if A._sf_layout is torch.sparse_coo:
        return same_tensor(T._idx, A._idx)
    return same_tensor(T._crow, A._crow) and same_tensor(T._col, A._col)


def _same_across_layouts(T: SparseTensor, A: SparseTensor) -> bool:
    C, O = (T, A) if T._sf_layout is torch.sparse_csr else (A, T)
    if (
        C._sf_layout is not torch.sparse_csr
        or O._sf_layout is not torch.sparse_coo
        or C._crow.dim() != 1
        or C.shape[:2] != O.shape[:2]
        or O._idx.shape != (2, C._col.shape[0])
    ):
        return False
    rows, cols = O._idx
    return torch.equal(cols, C._col.to(cols.dtype)) and torch.equal(
        torch._convert_indices_from_coo_to_csr(
            rows, C.shape[0], out_int32=C._crow.dtype == torch.int32
        ),
        C._crow,
    )
