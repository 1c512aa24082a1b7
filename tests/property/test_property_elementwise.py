"""Element-wise ops on generated SparseTensors equal dense torch (the element-wise rule, pointwise.py)::

    f(A).to_dense() == f(A.to_dense())        f(A, B), f(A, c), f(A, d) likewise (B sparse, c scalar, d dense)

every layout, fill (indefinite: compared where specified) and dtype; both raising is agreement."""

from __future__ import annotations

import torch
from hypothesis import given, strategies as st

from tests.property.sparse_strategies import (
    ALL_DTYPES,
    DTYPES,
    FILLS,
    SETTINGS,
    agree,
    agree_masked,
    sparse_tensors,
)

UNARY = {
    "neg": torch.neg,
    "abs": torch.abs,
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "sin": torch.sin,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "relu": torch.relu,
    "floor": torch.floor,
    "sign": torch.sign,
    "isnan": torch.isnan,
    "isinf": torch.isinf,
    "logical_not": torch.logical_not,
    "bitwise_not": torch.bitwise_not,
    "square": torch.square,
    "reciprocal": torch.reciprocal,
    "clamp": lambda x: torch.clamp(x, -1, 2),
    "nan_to_num": torch.nan_to_num,
    "signbit": torch.signbit,
    "to_float64": lambda x: x.to(torch.float64),
    "to_int": lambda x: x.to(torch.int32),
    "erf": torch.erf,
    "round": torch.round,
    "trunc": torch.trunc,
    "frac": torch.frac,
}
BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "floor_divide": torch.floor_divide,
    "remainder": torch.remainder,
    "fmod": torch.fmod,
    "pow": torch.pow,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "eq": torch.eq,
    "lt": torch.lt,
    "logical_and": torch.logical_and,
    "bitwise_and": torch.bitwise_and,
    "atan2": torch.atan2,
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "fmax": torch.fmax,
    "copysign": torch.copysign,
    "where": lambda a, b: torch.where(a > 0 if a.dtype != torch.bool else a, a, b),
}
SCALARS = [0, 1, -2, 3, 2.5, -0.0, 0.0, float("nan"), float("inf"), True]


@SETTINGS
@given(sparse_tensors(dtypes=ALL_DTYPES, fills=FILLS), st.sampled_from(sorted(UNARY)))
def test_unary(A, name):
    agree_masked(A, UNARY[name], UNARY[name])


@SETTINGS
@given(
    sparse_tensors(fills=FILLS),
    st.sampled_from(sorted(BINARY)),
    st.sampled_from(SCALARS),
    st.booleans(),
)
def test_binary_with_a_scalar(A, name, c, scalar_first):
    f = BINARY[name]
    if name == "where":  # (its scalar form is another op)
        return
    op = (
        (lambda x: f(c, x))
        if scalar_first and name in ("add", "mul", "sub", "pow", "maximum")
        else (lambda x: f(x, c))
    )
    agree_masked(A, op, op)


@st.composite
def _pairs(draw):
    """Two SparseTensors of one shape (maybe of other patterns, layouts, dtypes and fills), or of shapes that
    broadcast (a size-1 dim)."""
    A = draw(sparse_tensors(fills=("zero", "value", "array")))
    how = draw(st.sampled_from(["same", "other", "dtype", "broadcast"]))
    if how == "same":
        return A, A
    dtypes = DTYPES if how == "dtype" else [A.dtype]
    B = draw(sparse_tensors(dtypes=dtypes, fills=("zero", "value", "array")))
    x = B.to_dense()
    shape = list(A.shape)
    if how == "broadcast" and shape:
        shape[draw(st.integers(0, len(shape) - 1))] = 1
    import sparsefill

    y = (
        torch.zeros(shape, dtype=x.dtype)
        if x.numel() == 0 or x.dim() == 0
        else x.reshape(-1)[torch.arange(int(torch.tensor(shape).prod())) % x.numel()].reshape(shape)
    )
    dd = min(A.dense_dim(), len(shape))
    return A, sparsefill.to_sparse(
        y,
        fill_value=draw(st.sampled_from([0, 1])) if y.dtype != torch.bool else False,
        dense_dim=dd,
    )


@SETTINGS
@given(_pairs(), st.sampled_from(sorted(BINARY)))
def test_binary_of_two_sparse_tensors(pair, name):
    A, B = pair
    f = BINARY[name]
    agree(lambda: f(A, B), lambda: f(A.to_dense(), B.to_dense()))
    agree(lambda: f(B, A), lambda: f(B.to_dense(), A.to_dense()))


@SETTINGS
@given(sparse_tensors(), st.sampled_from(["add", "mul", "sub", "maximum", "div", "eq"]), st.data())
def test_binary_with_a_dense_operand(A, name, data):
    """A dense operand over the trailing dims (the pattern kept) or of the full shape (dense by nature)."""
    f = BINARY[name]
    k = data.draw(st.integers(0, A.dim()))
    shape = tuple(A.shape)[A.dim() - k :]
    d = torch.arange(int(torch.tensor(shape).prod()) if shape else 1).reshape(shape).to(A.dtype)
    agree(lambda: f(A, d), lambda: f(A.to_dense(), d))
    agree(lambda: f(d, A), lambda: f(d, A.to_dense()))


@SETTINGS
@given(_pairs(), st.sampled_from(["add_", "mul_", "sub_", "div_", "clamp_"]))
def test_in_place(pair, name):
    """In place, the input written as dense's (or both raise: an int written with a float result)."""
    A, B = pair
    x, y = A.to_dense(), B.to_dense()
    if name == "clamp_":
        agree(lambda: A.clone().clamp_(-1, 1), lambda: x.clone().clamp_(-1, 1))
        return
    agree(lambda: getattr(A.clone(), name)(B), lambda: getattr(x.clone(), name)(y))
