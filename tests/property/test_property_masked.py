"""``sparsefill.masked`` on generated SparseTensors equals ``torch.masked`` on the dense tensors::

    densify(masked.op(A, ..., mask=M))[p] == torch.masked.op(A.to_dense(), ..., mask=M')[p]

at every output position ``p`` that reads a masked-in element (``M'``: ``M`` and, for an indefinite fill, the
pattern of ``A``); both raising is agreement."""

from __future__ import annotations

import torch
from hypothesis import given, strategies as st

import sparsefill
from tests.property.sparse_strategies import (
    DTYPES,
    FILLS,
    SETTINGS,
    assert_same,
    outcome,
    sparse_tensors,
)

OPS = {
    "sum": (0,),
    "prod": (0,),
    "amax": (0,),
    "amin": (0,),
    "argmax": (0,),
    "argmin": (0,),
    "mean": (0,),
    "norm": (2.0, 0),
    "var": (0,),
    "std": (0,),
    "logsumexp": (0,),
    "softmax": (0,),
    "log_softmax": (0,),
    "softmin": (0,),
    "normalize": (2.0, 0),
    "cumsum": (0,),
    "cumprod": (0,),
    "median": (0,),
}
NORMALIZATIONS = ("softmax", "log_softmax", "softmin", "normalize", "cumsum", "cumprod")


def _pattern(A):
    """True at A's specified elements (the mask an indefinite fill means)."""
    one = torch.ones((), dtype=A.dtype) if A.dtype != torch.bool else torch.tensor(True)
    zero = torch.zeros((), dtype=A.dtype)
    a, b = A.to_dense(fill_value=zero), A.to_dense(fill_value=one)
    return (a == b) & ~(a != a) | (a != a) & (b != b) if A.is_floating_point() else a == b


@SETTINGS
@given(
    sparse_tensors(dtypes=DTYPES, fills=FILLS, min_dim=1, max_dim=3, max_ddim=1),
    st.sampled_from(sorted(OPS)),
    st.sampled_from(["none", "dense", "sparse"]),
    st.data(),
)
def test_masked_op_matches_torch_masked(A, name, mask_kind, data):
    n = A.dim()
    d = data.draw(st.integers(-n, n - 1))
    args = OPS[name][:-1] + (d,)
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 99)))
    mask = None if mask_kind == "none" else torch.rand(tuple(A.shape), generator=g) < 0.6
    indefinite = A.is_fill_indefinite()
    x = A.to_dense(fill_value=torch.zeros((), dtype=A.dtype)) if indefinite else A.to_dense()
    m = mask
    if indefinite:
        p = _pattern(A)
        m = p if mask is None else (p & mask)
    given_mask = mask if mask_kind != "sparse" or mask is None else mask.to_sparse()
    ks, got = outcome(lambda: getattr(sparsefill.masked, name)(A, *args, mask=given_mask))
    kd, want = outcome(lambda: getattr(torch.masked, name)(x, *args, mask=m))
    assert ks == kd, f"sparsefill.masked: {ks} {got!r:.300}\ntorch.masked: {kd} {want!r:.300}"
    if ks != "ok":
        return
    if isinstance(got, sparsefill.SparseTensor):
        got = (
            got.to_dense(fill_value=torch.zeros((), dtype=got.dtype))
            if got.is_fill_indefinite()
            else got.to_dense()
        )
    elif got.layout != torch.strided:
        got = got.to_dense()
    read = _read_positions(name, m, d, tuple(want.shape), x)
    if read is not None:
        got, want = got[read], want[read]
    assert_same(got, want)


def _read_positions(name, m, d, shape, x):
    """The output positions whose value torch.masked defines: for normalizations the masked-in elements, for
    reductions the slices holding one (torch.masked documents the others as undefined; ours are exact too, but
    torch.masked's own values there vary by op)."""
    if m is None:
        return None
    if name in NORMALIZATIONS:
        return m.expand(shape) if m.shape != shape else m
    has = m.any(d)
    return has if has.shape == shape else None
