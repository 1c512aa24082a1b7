"""Autograd through ``A.to_dense()``: the gradients of values and fill equal those through the dense
construction::

    grad of values/fill through A.to_dense() == the gradient through the dense construction

The no-graph test ``torch._C._any_requires_grad(A[, fill_value])`` is checked on leaf and non-leaf
SparseTensors, views, detach, a fill_value tensor that requires grad, a Parameter,
no_grad/inference_mode/enable_grad, torch.func grad/vjp, checkpointing, saved-tensor hooks, double
backward, a list fill_value; forward-mode AD keeps a tangent or refuses it (never drops it silently).
"""

import warnings
import pytest
import torch
import sparsefill
from sparsefill import SparseTensor
from tests.tensor.test_to_dense_eager import reference, N


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sparsefill.DensifyWarning)
        yield


# ---------------------------------------------------------------------- 2. the no-graph test (autograd)
ROWS, COLS, SIZE = torch.tensor([0, 1, 2, 2]), torch.tensor([1, 0, 2, 3]), (3, 4)


W = torch.arange(12.0, dtype=torch.float64).reshape(SIZE) - 5


def leaf(fill=2.0, layout="coo"):
    """``(A, v)``: A built from the leaf values ``v`` (requires grad)."""
    v = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=torch.float64, requires_grad=True)
    if layout == "coo":
        return sparsefill.sparse_coo_tensor(torch.stack([ROWS, COLS]), v, SIZE, fill_value=fill), v
    return sparsefill.sparse_csr_tensor([0, 1, 2, 4], COLS, v, SIZE, fill_value=fill), v


def dense_ref(v, fill):
    """The dense construction of ``leaf``'s tensor, differentiable in ``v`` and a tensor ``fill``."""
    f = torch.as_tensor(fill, dtype=torch.float64)
    return f.expand(SIZE).clone().index_put((ROWS, COLS), v)


def grads(loss, *inputs):
    return torch.autograd.grad(loss, inputs, allow_unused=True)


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_graph_recorded_for_values_views_nonleaf(layout):
    """Values that require grad, reached through A, A[1], A.t(), A * 3 (non-leaf), A.detach() (no graph): the
    gradient of the values is the dense construction's."""
    v0 = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=torch.float64, requires_grad=True)
    for name, f in {
        "A": lambda A: A,
        "A[1]": lambda A: A[1],
        "A.t()": lambda A: A.t(),
        "A*3": lambda A: A * 3,
        "A[:, 1:]": lambda A: A[:, 1:],
    }.items():
        A, v = leaf(layout=layout)
        D = f(A).to_dense()
        assert D.requires_grad and D.grad_fn is not None, name
        R = f(dense_ref(v0, 2.0))
        torch.testing.assert_close(D, R, rtol=0, atol=0)
        Wn = torch.arange(R.numel(), dtype=torch.float64).reshape(R.shape) - 3
        (g,), (e,) = grads((D * Wn).sum(), v), grads((R * Wn).sum(), v0)
        torch.testing.assert_close(g, e, msg=name)
    A, v = leaf(layout=layout)
    D = A.detach().to_dense()
    assert not D.requires_grad and D.grad_fn is None


def test_sparse_leaf_and_parameter():
    """A SparseTensor leaf (requires_grad_()) and an nn.Parameter of one: the gradient is a SparseTensor whose
    dense form is the upstream gradient."""
    A, _ = leaf()
    A = A.detach().requires_grad_()
    (A.to_dense() * W).sum().backward()
    assert isinstance(A.grad, SparseTensor)
    torch.testing.assert_close(A.grad.to_dense(), W)
    P = torch.nn.Parameter(leaf()[0].detach())
    (P.to_dense() * W).sum().backward()
    torch.testing.assert_close(P.grad.to_dense(), W)


def test_fill_value_tensor_requiring_grad():
    """``to_dense(fill_value=f)`` of an indefinite tensor, ``f`` requiring grad, the values requiring grad or not:
    the graph is recorded and ``f`` gets the sum over the unspecified positions (the dense construction's)."""
    for values_grad in (True, False):
        A, v = leaf(fill=sparsefill.indefinite)
        if not values_grad:
            A, v = A.detach(), v.detach()
        f = torch.tensor(0.25, dtype=torch.float64, requires_grad=True)
        D = A.to_dense(fill_value=f)
        assert D.requires_grad
        f0, v0 = f.detach().requires_grad_(), v.detach().requires_grad_()
        R = dense_ref(v0, f0)
        torch.testing.assert_close(D, R, rtol=0, atol=0)
        g, e = grads((D * W).sum(), f, *([v] if values_grad else [])), grads((R * W).sum(), f0, v0)
        torch.testing.assert_close(g[0], e[0])
        if values_grad:
            torch.testing.assert_close(g[1], e[1])


def test_list_fill_value_of_tensors_requiring_grad_as_torch_tensor():
    """A list/tuple fill_value holding tensors that require grad (``_any_requires_grad`` looks into lists, not
    tuples): no graph and no gradient, as ``torch.tensor([f1, f2])`` (a tensor fill_value is the way to one)."""
    H = sparsefill.sparse_coo_tensor(
        [[0, 2]], torch.tensor([[1.0, 2.0], [3.0, 4.0]]), (3, 2), fill_value=sparsefill.indefinite
    )
    f1, f2 = torch.tensor(5.0, requires_grad=True), torch.tensor(6.0, requires_grad=True)
    for fv in ([f1, f2], (f1, f2)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            D = H.to_dense(fill_value=fv)
        assert not D.requires_grad
        torch.testing.assert_close(D, torch.tensor([[1.0, 2.0], [5.0, 6.0], [3.0, 4.0]]))
    D = H.to_dense(fill_value=torch.stack([f1, f2]))
    D.sum().backward()
    assert f1.grad == 1 and f2.grad == 1


def test_grad_modes():
    """no_grad and inference_mode: no graph (the kernel alone), same values; enable_grad inside no_grad: the
    graph; an inference tensor: its dense form."""
    A, v = leaf()
    R = dense_ref(v.detach(), 2.0)
    with torch.no_grad():
        D = A.to_dense()
    assert not D.requires_grad and torch.equal(D, R)
    with torch.inference_mode():
        D = A.to_dense()
    assert not D.requires_grad and D.is_inference() and torch.equal(D, R)
    with torch.no_grad(), torch.enable_grad():
        D = A.to_dense()
    (g,) = grads((D * W).sum(), v)
    torch.testing.assert_close(g, W[ROWS, COLS])
    with torch.inference_mode():
        I, _ = leaf()
    assert torch.equal(I.to_dense(), R)


def test_torch_func_grad_vjp_jacrev():
    """torch.func.grad/vjp/jacrev of the values through the constructor and to_dense, and of a tensor fill."""

    def dense_of_values(vals):
        return sparsefill.sparse_coo_tensor(
            torch.stack([ROWS, COLS]), vals, SIZE, fill_value=2.0
        ).to_dense()

    v = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=torch.float64)
    torch.testing.assert_close(
        torch.func.grad(lambda x: (dense_of_values(x) * W).sum())(v), W[ROWS, COLS]
    )
    out, vjp = torch.func.vjp(dense_of_values, v)
    torch.testing.assert_close(out, dense_ref(v, 2.0))
    torch.testing.assert_close(vjp(W)[0], W[ROWS, COLS])
    J = torch.func.jacrev(lambda x: dense_of_values(x)[1])(v)
    torch.testing.assert_close(J, torch.func.jacrev(lambda x: dense_ref(x, 2.0)[1])(v))

    def dense_of_fill(f):
        return sparsefill.sparse_coo_tensor(
            torch.stack([ROWS, COLS]), v, SIZE, fill_value=f
        ).to_dense()

    f = torch.tensor(0.5, dtype=torch.float64)
    torch.testing.assert_close(
        torch.func.grad(lambda f: (dense_of_fill(f) * W).sum())(f), W.sum() - W[ROWS, COLS].sum()
    )


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint(reentrant):
    from torch.utils.checkpoint import checkpoint

    A, v = leaf()
    out = checkpoint(lambda a: (a.to_dense() ** 2 * W).sum(), A, use_reentrant=reentrant)
    out.backward()  # (use_reentrant=True: .backward() only)
    torch.testing.assert_close(v.grad, 2 * v.detach() * W[ROWS, COLS])


def test_saved_tensor_hooks_and_double_backward():
    """Saved-tensor hooks see plain tensors (pack/unpack round trip); create_graph's second derivative."""
    A, v = leaf()
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: (packed.append(type(t)), t.clone())[1], lambda t: t
    ):
        out = (A.to_dense() ** 3 * W).sum()
    (g,) = torch.autograd.grad(out, v, create_graph=True)
    torch.testing.assert_close(g, 3 * v.detach() ** 2 * W[ROWS, COLS])
    (gg,) = torch.autograd.grad(g.sum(), v)
    torch.testing.assert_close(gg, 6 * v.detach() * W[ROWS, COLS])
    assert packed and set(packed) == {torch.Tensor}


def test_forward_ad_tangent_kept_or_refused():
    """Dual values entering the constructor: the tangent kept or a NotImplementedError (never dropped
    silently)."""
    import torch.autograd.forward_ad as fwAD

    v = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=torch.float64)
    with fwAD.dual_level():
        dv = fwAD.make_dual(v, torch.ones(4, dtype=torch.float64))
        try:
            D = sparsefill.sparse_coo_tensor(
                torch.stack([ROWS, COLS]), dv, SIZE, fill_value=2.0
            ).to_dense()
        except NotImplementedError:
            return  # (refused: acceptable)
        tangent = fwAD.unpack_dual(D).tangent
        assert tangent is not None
        torch.testing.assert_close(tangent, fwAD.unpack_dual(dense_ref(dv, 2.0)).tangent)


def test_forward_ad_of_a_dual_fill_value():
    """``to_dense(fill_value=<dual>)``, a third of the positions stored (torch's fill_ and put_, no by-address pass):
    the fill's tangent at the unspecified positions, as dense."""
    import torch.autograd.forward_ad as fwAD

    I, _ = leaf(fill=sparsefill.indefinite)
    I = I.detach()
    with fwAD.dual_level():
        f = fwAD.make_dual(
            torch.tensor(4.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)
        )
        try:
            D = I.to_dense(fill_value=f)
        except NotImplementedError:
            return
        expected = fwAD.unpack_dual(dense_ref(I._vals, f)).tangent
        torch.testing.assert_close(fwAD.unpack_dual(D).tangent, expected)


def test_forward_ad_of_a_dual_fill_value_through_the_fill_pass():
    import torch.autograd.forward_ad as fwAD

    I = sparsefill.sparse_coo_tensor(
        [[1, 5, N - 1]], [3.0, 4.0, 5.0], (N,), fill_value=sparsefill.indefinite
    )
    with fwAD.dual_level():
        f = fwAD.make_dual(torch.tensor(2.0), torch.tensor(1.0))
        try:
            D = I.to_dense(fill_value=f)
        except NotImplementedError:
            return
        tangent = fwAD.unpack_dual(D).tangent
        assert tangent is not None
        torch.testing.assert_close(tangent, reference([[1, 5, N - 1]], torch.zeros(3), (N,), 1.0))


def test_forward_ad_of_a_dual_sparse_tensor():
    import torch.autograd.forward_ad as fwAD

    A, _ = leaf()
    A = A.detach()
    T = sparsefill.sparse_coo_tensor(
        torch.stack([ROWS, COLS]), torch.ones(4, dtype=torch.float64), SIZE
    )
    with fwAD.dual_level():
        dA = fwAD.make_dual(A, T)
        try:
            D = dA.to_dense()
        except NotImplementedError:
            return
        tangent = fwAD.unpack_dual(D).tangent
        assert tangent is not None
        torch.testing.assert_close(tangent, T.to_dense())
