"""``out=`` with dense outputs on SparseTensor inputs: torch's out semantics on the op's native
result::

    op(A, ..., out=o) is o      and      o == op(A.to_dense(), ...)
"""

from __future__ import annotations

import warnings

import pytest
import torch

import sparsefill


def _A(layout=torch.sparse_coo):
    x = torch.tensor([[0.0, 2.0, 0.0, -1.0], [3.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    return sparsefill.to_sparse(x, fill_value=0.0, layout=layout), x


CALLS = {
    "exp": (lambda t, **o: torch.exp(t, **o), 1),
    "sum": (lambda t, **o: torch.sum(t, 1, **o), 1),
    "amax": (lambda t, **o: torch.amax(t, 0, **o), 1),
    "cumsum": (lambda t, **o: torch.cumsum(t, 1, **o), 1),
    "mm": (lambda t, **o: torch.mm(t, torch.ones(4, 2), **o), 1),
    "max": (lambda t, **o: torch.max(t, 1, **o), 2),
    "sort": (lambda t, **o: torch.sort(t, 1, **o), 2),
    "sort-desc-dim0": (lambda t, **o: torch.sort(t, dim=0, descending=True, stable=True, **o), 2),
    "topk": (lambda t, **o: torch.topk(t, 2, 1, **o), 2),
    "kthvalue": (lambda t, **o: torch.kthvalue(t, 2, 1, **o), 2),
}
TIES = ("topk", "kthvalue")  # (dense torch's order of equal elements is its kernel's own)


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
@pytest.mark.parametrize("name", list(CALLS))
def test_out_matches_dense_and_is_returned(name, layout):
    call, n = CALLS[name]
    A, x = _A(layout)
    ref = call(x)
    refs = (ref,) if n == 1 else tuple(ref)
    outs = tuple(torch.full_like(r, 7) for r in refs)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        got = call(A, out=outs[0] if n == 1 else outs)
    for g, o, r in zip((got,) if n == 1 else tuple(got), outs, refs, strict=True):
        assert g is o
    if name in TIES:
        v, i = outs
        torch.testing.assert_close(v, refs[0])
        torch.testing.assert_close(x.gather(1, i if i.dim() == 2 else i[:, None]).view(v.shape), v)
    else:
        for o, r in zip(outs, refs, strict=True):
            torch.testing.assert_close(o, r)


def test_out_of_a_composite_op_is_written():
    A, x = _A()
    o = torch.full((), 7, dtype=torch.long)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sparsefill.DensifyWarning)  # (its SVD: dense by nature)
        assert torch.linalg.matrix_rank(A, out=o) is o
    assert o.item() == torch.linalg.matrix_rank(x).item() == 2


def test_out_resized_as_torch_resizes():
    A, x = _A()
    empty = torch.empty(0)
    assert torch.sum(A, 1, out=empty) is empty
    torch.testing.assert_close(empty, x.sum(1))
    wrong = torch.zeros(5)
    with pytest.warns(UserWarning, match=r"had shape \[5\].*required output shape \[3\]"):
        torch.sum(A, 1, out=wrong)
    torch.testing.assert_close(wrong, x.sum(1))


def test_out_dtype_error_is_torchs():
    A, x = _A()
    for t in (A, x):
        with pytest.raises(RuntimeError, match="can't be cast"):
            torch.exp(t, out=torch.empty(3, 4, dtype=torch.long))


def test_out_wider_dtype_is_cast():
    A, x = _A()
    o = torch.empty(3, dtype=torch.float64)
    torch.sum(A, 1, out=o)
    torch.testing.assert_close(o, x.sum(1, dtype=torch.float64))


def test_out_with_grad_is_torchs_error():
    A, _ = _A()
    A.requires_grad_()
    with pytest.raises(RuntimeError, match="don't support automatic differentiation"):
        torch.exp(A, out=torch.empty(3, 4))


def test_out_list_output():
    A, x = _A()
    outs = [torch.empty(0), torch.empty(0)]
    assert torch.split_with_sizes_copy(A, [1, 3], 1, out=outs) is None
    for o, r in zip(outs, torch.split_with_sizes(x, [1, 3], 1), strict=True):
        torch.testing.assert_close(o, r)


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
def test_sparse_out_takes_the_result(layout):
    A, x = _A()
    o = sparsefill.to_sparse(torch.zeros(3, 4), layout=layout)
    assert torch.exp(A, out=o) is o
    assert o.sparse_layout is layout
    torch.testing.assert_close(o.to_dense(), x.exp())
    s = sparsefill.to_sparse(torch.zeros(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        torch.sum(A, 1, out=s)
    torch.testing.assert_close(s.to_dense(), x.sum(1))
    k = sparsefill.to_sparse(torch.zeros(6, 8))
    torch.kron(A, torch.ones(2, 2), out=k)  # (a composite writing through a view of its output)
    torch.testing.assert_close(k.to_dense(), torch.kron(x, torch.ones(2, 2)))


def test_sparse_out_of_another_shape_is_refused():
    A, _ = _A()
    o = sparsefill.to_sparse(torch.zeros(5))
    with pytest.raises(ValueError, match=r"keeps its shape \(5,\).*shape \(3,\)"):
        torch.sum(A, 1, out=o)
    assert o.to_dense().eq(0).all()
