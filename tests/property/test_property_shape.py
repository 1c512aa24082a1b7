"""Shape and index ops of generated SparseTensors equal dense torch: reshape, permute, t, transpose, select,
slicing, index_select, split, chunk, cat, stack, repeat, expand, flip, squeeze/unsqueeze, flatten; both raising is
agreement."""

from __future__ import annotations

import torch
from hypothesis import given, strategies as st

import sparsefill

from tests.property.sparse_strategies import ALL_DTYPES, SETTINGS, agree, sparse_tensors


def _dim(data, A, extra=0):
    n = A.dim() + extra
    return data.draw(st.integers(-n, n - 1)) if n else 0


def _factorization(data, numel, n):
    """A shape of ``n`` dims holding ``numel`` elements, maybe with one -1."""
    shape = []
    rest = numel
    for _ in range(n - 1):
        divisors = [k for k in range(1, 5) if rest % k == 0] if rest else [0, 1, 2]
        k = data.draw(st.sampled_from(divisors))
        shape.append(k)
        rest = rest // k if k else rest
    shape.append(rest if numel else data.draw(st.sampled_from([0, 3])))
    if numel and shape and data.draw(st.booleans()):
        shape[data.draw(st.integers(0, len(shape) - 1))] = -1
    return shape


OPS = [
    "reshape",
    "permute",
    "t",
    "transpose",
    "select",
    "slice",
    "index_select",
    "split",
    "chunk",
    "unbind",
    "repeat",
    "expand",
    "flip",
    "squeeze",
    "unsqueeze",
    "flatten",
    "narrow",
    "movedim",
    "getitem_mask",
    "getitem_tensor",
    "roll",
]


@SETTINGS
@given(sparse_tensors(dtypes=ALL_DTYPES), st.sampled_from(OPS), st.data())
def test_shape_op(A, name, data):
    x = A.to_dense()
    n = A.dim()
    if name == "reshape":
        shape = _factorization(
            data,
            x.numel(),
            data.draw(st.integers(0, 4)) if x.numel() <= 1 else data.draw(st.integers(1, 4)),
        )
        f = lambda t: t.reshape(shape)  # noqa: E731
    elif name == "permute":
        perm = data.draw(st.permutations(range(n)))
        f = lambda t: t.permute(perm)  # noqa: E731
    elif name == "t":
        f = lambda t: t.t()  # noqa: E731
    elif name == "transpose":
        a, b = _dim(data, A), _dim(data, A)
        f = lambda t: t.transpose(a, b)  # noqa: E731
    elif name in ("select", "narrow", "index_select", "slice", "flip", "roll", "unbind", "movedim"):
        f = _indexing(name, data, A)
    elif name in ("split", "chunk"):
        d, k = _dim(data, A), data.draw(st.integers(1, 3))
        f = lambda t: tuple(getattr(t, name)(k, d))  # noqa: E731
    elif name == "repeat":
        reps = data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n + 1))
        f = lambda t: t.repeat(reps)  # noqa: E731
    elif name == "expand":
        size = [data.draw(st.sampled_from([s, -1] if s != 1 else [1, 2, 3, -1])) for s in A.shape]
        lead = data.draw(st.lists(st.integers(1, 2), max_size=1))
        f = lambda t: t.expand(lead + size)  # noqa: E731
    elif name == "squeeze":
        d = data.draw(st.one_of(st.none(), st.integers(-max(n, 1), max(n, 1) - 1)))
        f = lambda t: t.squeeze() if d is None else t.squeeze(d)  # noqa: E731
    elif name == "unsqueeze":
        d = _dim(data, A, 1)
        f = lambda t: t.unsqueeze(d)  # noqa: E731
    elif name == "flatten":
        a = _dim(data, A)
        f = lambda t: t.flatten(a) if n else t.flatten()  # noqa: E731
    else:
        f = _getitem(name, data, A)
    agree(lambda: f(A), lambda: f(x))


def _indexing(name, data, A):
    n = A.dim()
    d = _dim(data, A)
    size = A.shape[d] if n else 0
    if name == "select":
        i = data.draw(st.integers(-size, size - 1)) if size else 0
        return lambda t: t.select(d, i)
    if name == "narrow":
        s = data.draw(st.integers(0, size))
        k = data.draw(st.integers(0, size - s))
        return lambda t: t.narrow(d, s, k)
    if name == "index_select":
        idx = torch.tensor(
            data.draw(st.lists(st.integers(0, max(size - 1, 0)), max_size=4)) if size else [],
            dtype=torch.int64,
        )
        return lambda t: t.index_select(d, idx)
    if name == "slice":
        a, b = data.draw(st.integers(-5, 5)), data.draw(st.integers(-5, 5))
        step = data.draw(st.integers(1, 3))
        key = (slice(None),) * (d % n if n else 0) + (slice(a, b, step),)
        return lambda t: t[key]
    if name == "flip":
        dims = data.draw(st.lists(st.integers(0, max(n - 1, 0)), unique=True, max_size=n))
        return lambda t: t.flip(dims)
    if name == "roll":
        k = data.draw(st.integers(-3, 3))
        return lambda t: t.roll(k, d) if n else t.roll(k)
    if name == "movedim":
        e = _dim(data, A)
        return lambda t: t.movedim(d, e)
    return lambda t: tuple(t.unbind(d))


def _getitem(name, data, A):
    if name == "getitem_mask":  # a bool mask of the leading dims
        k = data.draw(st.integers(1, A.dim())) if A.dim() else 0
        g = torch.Generator().manual_seed(data.draw(st.integers(0, 99)))
        m = torch.rand(tuple(A.shape[:k]), generator=g) < 0.5
        return lambda t: t[m]
    n0 = A.shape[0] if A.dim() else 0
    idx = torch.tensor(
        data.draw(st.lists(st.integers(-n0, n0 - 1), max_size=4)) if n0 else [], dtype=torch.int64
    )
    return lambda t: t[idx]


@st.composite
def _joinable(draw):
    """Two or three SparseTensors whose shapes differ only along ``dim`` (cat) or not at all (stack)."""
    A = draw(sparse_tensors(min_dim=1, fills=("zero", "value", "array")))
    d = draw(st.integers(0, A.dim() - 1))
    out = [A]
    for _ in range(draw(st.integers(1, 2))):
        x = A.to_dense()
        k = draw(st.integers(0, 3))
        y = torch.cat([x] * (k // max(x.shape[d], 1) + 1), d).narrow(
            d, 0, min(k, x.shape[d] * (k + 1))
        )
        fill = draw(st.sampled_from([0, 1])) if y.dtype != torch.bool else True
        out.append(sparsefill.to_sparse(y, fill_value=fill, dense_dim=A.dense_dim()))
    return out, d


@SETTINGS
@given(_joinable(), st.booleans())
def test_cat_and_stack(parts, stack):
    tensors, d = parts
    xs = [t.to_dense() for t in tensors]
    if stack:
        agree(lambda: torch.stack(tensors, d), lambda: torch.stack(xs, d))
    else:
        agree(lambda: torch.cat(tensors, d), lambda: torch.cat(xs, d))
        agree(lambda: torch.cat([tensors[0], xs[-1]], d), lambda: torch.cat([xs[0], xs[-1]], d))
