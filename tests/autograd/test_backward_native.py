"""Backwards as sparse as their forwards where torch's derivative formula reaches ops that the sparse rules
take natively (the ops ``tests/opinfo/test_opinfo_backward.py`` found densifying in backward only)::

    grad(values, fill) of loss(op(A, ...)) == grad(values, fill) of loss(op(A.to_dense(), ...))

under ``densify_policy("raise")``, with the upstream gradient sparse (``.sum()``, ``* 2``) and dense
(``(out.to_dense() * W).sum()``):

* ``maximum minimum max min fmax fmin`` of two SparseTensors (union pattern, ties between stored values
  and between the fills: torch splits the gradient in two), or with a dense 0-d operand (whose ``.grad``
  is a dense tensor): torch's formula writes ``masked_fill_`` into a dense gradient with a SparseTensor
  mask -- a dense tensor updated in place from SparseTensors is dense by nature (``pointwise_dense._into_dense``);
* ``masked_select``: its backward is ``masked_scatter`` of the upstream gradient into ``zeros_like(A)``, a
  SparseTensor storing only the selected elements (``masked_index._masked_scatter``, tested here forward too);
* ``var_mean``/``std_mean``: routed as the routed ``(var or std, mean)``; torch's formula formed
  ``A - A.mean(dim, True)``, storing every element of each slice holding a stored one (checked by the
  largest aten result of forward and backward);
* ``logsumexp`` of a hybrid tensor over its dense dim: the result, unsqueezed, is read with its size-1
  sparse dim as a dense dim, and SparseTensors broadcast over size-1 dense dims.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import sparsefill
from sparsefill import SparseTensor

NAN = float("nan")
COO, CSR = torch.sparse_coo, torch.sparse_csr
F64 = torch.float64


def _leaves(vals, fill):
    return (
        torch.tensor(vals, dtype=F64, requires_grad=True),
        None if fill is None else torch.as_tensor(fill, dtype=F64).clone().requires_grad_(),
    )


def _build(idx, v, f, shape, dense: bool, layout=COO):
    A = sparsefill.sparse_coo_tensor(
        idx, v, shape, fill_value=sparsefill.indefinite if f is None else f
    )
    if layout is CSR:
        A = A.to_sparse_csr()
    return A.to_dense() if dense else A


def _dense(t):
    return t.to_dense() if isinstance(t, SparseTensor) else t


LOSSES = {
    "sum": lambda y: y.sum(),
    "times2": lambda y: (y * 2).sum(),
    "dense W": lambda y: (
        _dense(y) * torch.linspace(-1, 2, y.numel(), dtype=F64).reshape(y.shape)
    ).sum(),
}


class _Largest(TorchDispatchMode):
    """The largest aten result: values stored by a SparseTensor, elements of a strided tensor."""

    def __init__(self):
        super().__init__()
        self.stored = self.strided = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, SparseTensor):
                self.stored = max(self.stored, t._vals.numel())
            elif isinstance(t, torch.Tensor):
                self.strided = max(self.strided, t.numel())
        return out


# ---------------------------------------------------------------------- maximum and its family
IA, IB = [[0, 1, 2, 4]], [[1, 2, 3]]  # union (0..4), position 5 unspecified in both


@pytest.mark.parametrize("loss", list(LOSSES))
@pytest.mark.parametrize("fills", [(0.5, 0.5), (0.5, -1.0), (0.5, 2.0), (NAN, 0.0)], ids=str)
@pytest.mark.parametrize(
    "op",
    [torch.maximum, torch.minimum, torch.max, torch.min, torch.fmax, torch.fmin],
    ids=lambda f: f.__name__,
)
def test_binary_extrema_of_two_sparse_tensors(op, fills, loss):
    """Stored values tie at position 1 (3 and 3), the fills tie in the first case."""
    grads = []
    for dense in (False, True):
        (va, fa), (vb, fb) = (
            _leaves([1.0, 3.0, 0.5, -2.0], fills[0]),
            _leaves([3.0, 0.1, 0.5], fills[1]),
        )
        with sparsefill.densify_policy("raise"):
            LOSSES[loss](
                op(_build(IA, va, fa, (6,), dense), _build(IB, vb, fb, (6,), dense))
            ).backward()
        grads.append([va.grad, fa.grad, vb.grad, fb.grad])
    torch.testing.assert_close(grads[0], grads[1], equal_nan=True)


@pytest.mark.parametrize("loss", list(LOSSES))
@pytest.mark.parametrize("layout", [COO, CSR], ids=["coo", "csr"])
@pytest.mark.parametrize("op", [torch.maximum, torch.minimum], ids=lambda f: f.__name__)
def test_binary_extrema_with_a_dense_scalar(op, layout, loss):
    """The dense 0-d operand ties with the fill and with a stored value; its ``.grad`` is a dense tensor."""
    idx = [[0, 1, 2], [1, 0, 2]]
    grads = []
    for dense in (False, True):
        v, f = _leaves([0.25, -1.0, 3.0], 0.25)
        s = torch.tensor(0.25, dtype=F64, requires_grad=True)
        with sparsefill.densify_policy("raise"):
            LOSSES[loss](op(_build(idx, v, f, (3, 4), dense, layout), s)).backward()
        assert type(s.grad) is torch.Tensor
        grads.append([v.grad, f.grad, s.grad])
    torch.testing.assert_close(grads[0], grads[1])


def test_dense_tensor_updated_in_place_from_sparse_tensors():
    """``x.add_(A)``, ``x.masked_fill_(A > c, v)``: dense by nature, quiet, as on the dense tensors; an
    indefinite operand has no dense form (ValueError, as ``to_dense``)."""
    A = sparsefill.sparse_coo_tensor([[0, 2], [1, 0]], [1.0, 2.0], (3, 2), fill_value=0.5)
    x = torch.arange(6.0).reshape(3, 2)
    with sparsefill.densify_policy("raise"):
        got = x.clone().add_(A).masked_fill_(A > 1.5, -1.0)
    assert type(got) is torch.Tensor
    torch.testing.assert_close(
        got, x.clone().add_(A.to_dense()).masked_fill_(A.to_dense() > 1.5, -1.0)
    )
    indefinite = sparsefill.sparse_coo_tensor(
        [[0, 2], [1, 0]], [1.0, 2.0], (3, 2), fill_value=sparsefill.indefinite
    )
    with pytest.raises(ValueError, match="indefinite"):
        x.clone().add_(indefinite)


# ---------------------------------------------------------------------- masked_select / masked_scatter
class _Case:
    def __init__(self, layout=COO, dense_dim=0, fill=0.5, uncoalesced=False):
        g = torch.Generator().manual_seed(3)
        self.shape = (5, 6) + (3,) * dense_dim
        keys = torch.randperm(30, generator=g)[:12].sort().values
        self.idx = torch.stack(torch.unravel_index(keys, (5, 6)))
        if uncoalesced:
            self.idx = torch.cat([self.idx, self.idx[:, :3]], 1)
        self.vals = torch.randn((self.idx.shape[1],) + (3,) * dense_dim, dtype=F64, generator=g)
        self.fill = None if fill is None else torch.full((3,) * dense_dim, fill, dtype=F64)
        self.layout = layout
        self.mask = torch.rand(self.shape, generator=g) < 0.5

    def leaves(self):
        return (
            self.vals.clone().requires_grad_(),
            None if self.fill is None else self.fill.clone().requires_grad_(),
        )

    def build(self, v, f, dense):
        return _build(self.idx, v, f, self.shape, dense, self.layout)


CASES = {
    "coo": _Case(),
    "csr": _Case(CSR),
    "hybrid": _Case(dense_dim=1),
    "uncoalesced": _Case(uncoalesced=True),
    "nan fill": _Case(fill=NAN),
    "zero fill": _Case(fill=0.0),
}


@pytest.mark.parametrize("loss", ["sum", "dense W"])
@pytest.mark.parametrize("name", list(CASES))
def test_masked_select_backward_is_a_scatter(name, loss):
    """The gradient reaching ``A`` is a SparseTensor storing only the selected elements (fill 0)."""
    case, grads, seen = CASES[name], [], []
    for dense in (False, True):
        v, f = case.leaves()
        A = case.build(v, f, dense)
        A.register_hook(seen.append)
        with sparsefill.densify_policy("raise"):
            LOSSES[loss](A.masked_select(case.mask)).backward()
        grads.append([v.grad, f.grad])
    torch.testing.assert_close(grads[0], grads[1], equal_nan=True)
    G = seen[0]
    assert isinstance(G, SparseTensor) and G._fill_is_zero()
    assert G._nse() == int(
        case.mask.reshape(30, -1).any(1).sum()
    )  # the positions with a selected element


def _scatter_cases():
    src = torch.randn(400, dtype=F64)
    for name, case in CASES.items():
        yield name, case, case.mask, src
    case = CASES["coo"]
    yield (
        "broadcast mask",
        case,
        torch.rand(2, 5, 6) < 0.5,
        src,
    )  # (out of place only: self expands)
    yield "sparse mask", case, sparsefill.to_sparse(torch.rand(5, 6) < 0.4), src
    yield "sparse source", case, case.mask, sparsefill.to_sparse(src, fill_value=0.5)
    yield "indefinite", _Case(fill=None), case.mask, src


@pytest.mark.parametrize(
    "name,case,mask,src", list(_scatter_cases()), ids=lambda x: x if isinstance(x, str) else ""
)
def test_masked_scatter_matches_dense(name, case, mask, src):
    A = case.build(case.vals, case.fill, False)
    fill = (
        0.0 if case.fill is None else None
    )  # an indefinite A: its unspecified elements read 0 on both sides
    ref = A.to_dense() if fill is None else A.to_dense(fill_value=fill)
    dm, ds = _dense(mask), _dense(src)
    with sparsefill.densify_policy("raise"):
        out = A.masked_scatter(mask, src)
    expect = ref.masked_scatter(dm, ds)
    assert isinstance(out, SparseTensor) and out.is_fill_indefinite() == (case.fill is None)
    torch.testing.assert_close(
        out.to_dense() if fill is None else out.to_dense(fill_value=fill), expect, equal_nan=True
    )
    if name != "broadcast mask":
        B = A.clone()
        with sparsefill.densify_policy("raise"):
            assert B.masked_scatter_(mask, src) is B
        torch.testing.assert_close(
            B.to_dense() if fill is None else B.to_dense(fill_value=fill), expect, equal_nan=True
        )


@pytest.mark.parametrize("shape", [(), (0, 3), (4,)], ids=str)
def test_masked_scatter_small_shapes(shape):
    A = sparsefill.to_sparse(
        torch.arange(float(torch.Size(shape).numel())).reshape(shape), fill_value=0.0
    )
    mask, src = torch.ones(shape, dtype=torch.bool), torch.full((5,), 7.0)
    torch.testing.assert_close(
        A.masked_scatter(mask, src).to_dense(), A.to_dense().masked_scatter(mask, src)
    )


@pytest.mark.parametrize("method", ["masked_scatter", "masked_scatter_"])
@pytest.mark.parametrize("bad", ["short source", "source dtype", "mask dtype", "mask shape"])
def test_masked_scatter_errors_as_torch_and_nothing_changes(bad, method):
    A = CASES["coo"].build(CASES["coo"].vals, CASES["coo"].fill, False)
    mask, src = torch.ones(5, 6, dtype=torch.bool), torch.randn(30, dtype=F64)
    mask, src = {
        "short source": (mask, src[:29]),
        "source dtype": (mask, src.float()),
        "mask dtype": (mask.double(), src),
        "mask shape": (torch.ones(7, 6, dtype=torch.bool), src),
    }[bad]
    before = A.to_dense()
    with pytest.raises(RuntimeError) as dense_err:
        getattr(before.clone(), method)(mask, src)
    with pytest.raises(RuntimeError) as err:
        getattr(A, method)(mask, src)
    if bad != "mask shape":
        assert str(err.value) == str(dense_err.value)
    assert torch.equal(A.to_dense(), before)


# ---------------------------------------------------------------------- var_mean / std_mean
def _cube(n, nse, fill, seed=0):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randperm(n**3, generator=g)[:nse].sort().values
    idx = torch.stack(torch.unravel_index(keys, (n, n, n)))
    return idx, torch.randn(nse, dtype=F64, generator=g), fill


@pytest.mark.parametrize("loss", ["sum", "dense W"])
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"dim": 1},
        {"dim": (0, 2), "keepdim": True},
        {"dim": 1, "correction": 0},
        {"dim": None, "correction": 2},
    ],
    ids=str,
)
@pytest.mark.parametrize("fn", [torch.var_mean, torch.std_mean], ids=lambda f: f.__name__)
@pytest.mark.parametrize("fill", [0.3, 0.0, NAN], ids=str)
def test_var_mean_std_mean(fn, kw, loss, fill):
    idx, vals, fill = _cube(4, 20, fill)
    grads = []
    for dense in (False, True):
        v, f = vals.clone().requires_grad_(), torch.tensor(fill, dtype=F64, requires_grad=True)
        with sparsefill.densify_policy("raise"):
            s, m = fn(_build(idx, v, f, (4, 4, 4), dense), **kw)
            (LOSSES[loss](s) + 3 * LOSSES[loss](m)).backward()
        grads.append([v.grad, f.grad])
    torch.testing.assert_close(grads[0], grads[1], equal_nan=True)


@pytest.mark.parametrize("fn", [torch.var_mean, torch.std_mean], ids=lambda f: f.__name__)
def test_var_mean_backward_stores_no_slice(fn):
    """(60, 60, 60) with 100 stored, reduced over dim 1: no aten result of forward or backward holds the 6000
    elements of the slices through a stored element (torch's ``A - A.mean(1, True)``)."""
    idx, vals, fill = _cube(60, 100, 0.3)
    v, f = vals.clone().requires_grad_(), torch.tensor(fill, dtype=F64, requires_grad=True)
    with _Largest() as rec:
        s, m = fn(_build(idx, v, f, (60, 60, 60), False), dim=1)
        (s.sum() + m.sum()).backward()
    assert v.grad is not None and f.grad is not None
    assert rec.stored <= 2 * 100 and rec.strided <= 4 * 100, (rec.stored, rec.strided)


# ---------------------------------------------------------------------- logsumexp over a dense dim
@pytest.mark.parametrize("loss", list(LOSSES))
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("fill", ["array", NAN], ids=str)
def test_logsumexp_of_a_hybrid_over_its_dense_dim(keepdim, loss, fill):
    g = torch.Generator().manual_seed(1)
    idx = [[0, 1, 3, 4], [1, 0, 2, 4]]
    vals, fv = torch.randn(4, 3, dtype=F64, generator=g), torch.randn(3, dtype=F64, generator=g)
    if fill != "array":
        fv = torch.full((), fill, dtype=F64)
    grads = []
    for dense in (False, True):
        v, f = vals.clone().requires_grad_(), fv.clone().requires_grad_()
        with sparsefill.densify_policy("raise"):
            LOSSES[loss](
                torch.logsumexp(_build(idx, v, f, (5, 5, 3), dense), -1, keepdim=keepdim)
            ).backward()
        grads.append([v.grad, f.grad])
    torch.testing.assert_close(grads[0], grads[1], equal_nan=True)


def test_sparse_tensors_broadcast_over_size_one_dense_dims():
    """``H - R`` with ``R`` of dense shape (1,) beside ``H`` of dense shape (3,): the values and the array fill
    expand, no densifying."""
    H = sparsefill.sparse_coo_tensor(
        [[0, 2]], torch.arange(6.0).reshape(2, 3), (4, 3), fill_value=torch.ones(3)
    )
    R = sparsefill.sparse_coo_tensor(
        [[1, 2]], torch.tensor([[10.0], [20.0]]), (4, 1), fill_value=torch.full((1,), 5.0)
    )
    with sparsefill.densify_policy("raise"):
        out = H - R
    assert isinstance(out, SparseTensor) and out.dense_dim() == 1
    torch.testing.assert_close(out.to_dense(), H.to_dense() - R.to_dense())
