"""The element-wise fast path (``fast_path.unary_fast``, the per-call cost): same results as on the dense
tensors, whatever shortcut it takes (same pattern, the cached union of two patterns, three patterns), and the
per-op decisions it caches (``_call_of``) run exactly the op that was dispatched."""

import pytest
import torch

import sparsefill
from sparsefill import SparseTensor
from sparsefill.ops.pointwise import fast_path, union
from hypothesis import given, strategies as st
from tests.sparse_cases import (
    assert_identical,
    outcome,
    check_same_outcome,
    sparse_cases,
    dense_and_unspecified,
    check_masked,
    SETTINGS,
    NAN,
    INF,
)

aten = torch.ops.aten


def _coo(shape, nse, fill, dtype=torch.float64, seed=0, dense_dims=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 3).to(dtype)
    S = shape[: len(shape) - dense_dims]
    keep = torch.zeros(S, dtype=torch.bool).view(-1)
    keep[torch.randperm(keep.numel(), generator=g)[:nse]] = True
    keep = keep.view(S).reshape(S + (1,) * dense_dims)
    fillv = torch.as_tensor(fill, dtype=dtype)
    x = torch.where(keep, x, fillv.expand(x.shape) if fillv.dim() else fillv)
    return sparsefill.to_sparse(x, fill_value=fill, dense_dim=dense_dims)


def _check(out, ref):
    assert isinstance(out, SparseTensor) and out.is_coalesced()
    torch.testing.assert_close(out.to_dense(), ref, equal_nan=True)


CASES = [
    ((10,), 5, 1.0, 2.0, torch.float64, 0),
    ((4, 5), 6, 0.5, float("nan"), torch.float32, 0),
    ((3, 4, 2), 5, 1.0, -1.0, torch.float64, 0),
    ((6, 3), 2, [1.0, 2.0, 3.0], 0.0, torch.float64, 1),
    ((8,), 0, 2.0, 3.0, torch.float64, 0),
    ((), 1, 1.0, 2.0, torch.float64, 0),
    ((9,), 4, 3, -2, torch.int64, 0),
    ((7,), 3, True, False, torch.bool, 0),
    ((0, 3), 0, 1.0, 2.0, torch.float32, 0),
]


@pytest.mark.parametrize("shape,nse,fa,fb,dtype,dd", CASES)
@pytest.mark.parametrize(
    "op", [torch.add, torch.mul, torch.maximum, lambda a, b: torch.add(a, b, alpha=2)]
)
def test_two_patterns_equal_dense(shape, nse, fa, fb, dtype, dd, op):
    if dtype is torch.bool and op is not torch.maximum:
        op = torch.logical_xor
    A = _coo(shape, nse, fa, dtype, 0, dd)
    B = _coo(shape, max(nse - 1, 0), fb if dd == 0 else fb, dtype, 1, dd)
    for X, Y in ((A, B), (B, A), (A, A)):
        out = op(X, Y)
        _check(out, op(X.to_dense(), Y.to_dense()))
        if X is not Y:  # the union: every position either stores
            keys = torch.cat([X._keys(), Y._keys()]).unique()
            assert out._nse() == keys.numel()


def test_scalar_and_unary_keep_the_pattern():
    A = _coo((10,), 5, 1.0)
    for out, ref in (
        (torch.exp(A), A.to_dense().exp()),
        (A * 2, A.to_dense() * 2),
        (A + A, A.to_dense() * 2),
        (torch.pow(A, 2), A.to_dense() ** 2),
        (torch.clamp(A, min=0.5), A.to_dense().clamp(min=0.5)),
    ):
        _check(out, ref)
        assert out._indices() is A._indices()


def test_three_patterns():
    A, B, C = (_coo((12,), 4, f, seed=s) for s, f in enumerate((1.0, 2.0, 3.0)))
    out = torch.addcmul(A, B, C, value=0.5)
    _check(out, torch.addcmul(A.to_dense(), B.to_dense(), C.to_dense(), value=0.5))
    out = torch.addcmul(A, B, A)  # two patterns, A twice
    _check(out, torch.addcmul(A.to_dense(), B.to_dense(), A.to_dense()))


def test_union_cached_per_pattern_pair_and_never_stale():
    A = sparsefill.sparse_coo_tensor([[1, 3, 4, 5, 7]], torch.arange(5.0), (10,), fill_value=1.0)
    B = sparsefill.sparse_coo_tensor(
        [[1, 5, 6, 7, 8]], torch.arange(5.0) + 10, (10,), fill_value=2.0
    )
    C1, C2 = A + B, A * B
    assert C1._indices() is C2._indices()  # the pair's union, merged once
    assert C1._indices().tolist() == [[1, 3, 4, 5, 6, 7, 8]]
    C1._indices().add_(1)  # a result's indices changed in place: not served again
    _check(A - B, A.to_dense() - B.to_dense())
    assert (A - B)._indices().tolist() == [[1, 3, 4, 5, 6, 7, 8]]
    A._indices()[0, 4] = 9  # an operand's pattern changed in place (still coalesced): merged again
    _check(
        A + B,
        sparsefill.sparse_coo_tensor(
            [[1, 3, 4, 5, 9]], torch.arange(5.0), (10,), fill_value=1.0
        ).to_dense()
        + B.to_dense(),
    )


def test_result_fill_is_its_own():
    A, B = _coo((10,), 5, 1.0, seed=0), _coo((10,), 5, 2.0, seed=3)
    for C in (A + B, A * 2, torch.exp(A)):
        C.fill_value().fill_(7.0)
        assert float(A._fill_value()) == 1.0 and float(B._fill_value()) == 2.0


def test_other_operands_take_the_general_rule():
    A = _coo((4, 5), 6, 1.0)
    B32 = _coo((4, 5), 6, 2.0, torch.float32, seed=1)
    C = A.to_sparse_csr()
    D = _coo((4, 5), 3, 2.0, seed=2).to_sparse_csr()
    x = torch.randn(5, dtype=torch.float64)
    for X, Y in ((A, B32), (A, C), (C, D), (C, A), (A, torch.tensor(2.0))):
        _check(X + Y, X.to_dense() + (Y.to_dense() if isinstance(Y, SparseTensor) else Y))
    torch.testing.assert_close(A + x, A.to_dense() + x)  # dense by nature


def test_call_of_runs_exactly_the_dispatched_overload():
    f = torch.tensor(1.5, dtype=torch.float64)
    call = fast_path._call_of(aten.mul.Tensor, (f, 2), {}, ("test", aten.mul.Tensor))
    assert call is torch.mul  # the binding dispatches to mul.Tensor
    # torch.add(t, 2) dispatches to add.Tensor, not add.Scalar: the schema's own call
    assert (
        fast_path._call_of(aten.add.Scalar, (f, 2), {}, ("test", aten.add.Scalar))
        == aten.add.Scalar._op
    )
    # no binding of that name
    assert (
        fast_path._call_of(aten.sigmoid_backward.default, (f, f), {}, ("test", 3))
        == aten.sigmoid_backward.default._op
    )
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Passthrough():  # a dispatch mode is active: the schema's call, not cached
        assert (
            fast_path._call_of(aten.exp.default, (f,), {}, ("test", "mode")) == aten.exp.default._op
        )
    assert ("test", "mode") not in fast_path._CALLS
    for k in [k for k in fast_path._CALLS if isinstance(k, tuple) and k[0] == "test"]:
        del fast_path._CALLS[k]


def test_fast_results_under_autograd():
    va = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64, requires_grad=True)
    vb = torch.tensor([2.0, 3.0], dtype=torch.float64, requires_grad=True)
    fa = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
    fb = torch.tensor(-0.5, dtype=torch.float64, requires_grad=True)

    def fn(va, vb, fa, fb):
        A = sparsefill.sparse_coo_tensor([[0, 3, 6]], va, (8,), fill_value=fa)
        B = sparsefill.sparse_coo_tensor([[3, 4]], vb, (8,), fill_value=fb)
        return (A * B + torch.exp(A) * 2).to_dense()

    assert torch.autograd.gradcheck(fn, (va, vb, fa, fb))


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float64,
        torch.float32,
        torch.bfloat16,
        torch.float16,
        torch.int64,
        torch.int32,
        torch.complex64,
    ],
)
@pytest.mark.parametrize(
    "op",
    [
        torch.mul,
        torch.add,
        torch.sub,
        torch.div,
        torch.true_divide,
        torch.eq,
        lambda a, c: a / c,
        lambda a, c: c - a,
        lambda a, c: a**c,
    ],
)
def test_python_number_operand_is_bitwise_the_dense_op(dtype, op):
    """``A * c`` with a Python number: a float32/float64 ``A`` takes ``c`` as a cached 0-d tensor of its dtype
    (``fast_path._by_value``); the values and the fill are bit for bit what the op gives on them with ``c``."""
    A = _coo((7,), 4, 1.5 if dtype.is_floating_point or dtype.is_complex else 3, dtype, seed=4)
    for c in (
        2,
        3,
        -7,
        0.1,
        1 / 3,
        -0.0,
        0.0,
        float("nan"),
        float("inf"),
        2**60 + 1,
        1e300,
        3 + 0j,
        True,
    ):
        try:
            ref_v, ref_f = op(A._values(), c), op(A._fill_value(), c)
        except RuntimeError:  # (e.g. an int tensor to the power of a negative int)
            continue
        for _ in range(2):  # the first call decides and caches, the second takes the cache
            out = op(A, c)
            assert isinstance(out, SparseTensor) and out.dtype == ref_v.dtype
            for got, ref in ((out._values(), ref_v), (out._fill_value(), ref_f)):
                torch.testing.assert_close(got, ref, equal_nan=True, rtol=0, atol=0)
                if ref.is_floating_point():  # (-0.0 and 0.0 compare equal)
                    assert torch.equal(torch.signbit(got), torch.signbit(ref))
            torch.testing.assert_close(
                out.to_dense(), op(A.to_dense(), c), equal_nan=True, rtol=0, atol=0
            )


def test_python_number_cache_is_keyed_exactly():
    """-0.0 and 0.0 (equal keys) keep their signs; int and float keys of one value give the same tensor value;
    the cached 0-d tensors are never the results' storage."""
    A = _coo((6,), 3, 1.0, seed=5)
    assert torch.signbit(A * -0.0)._fill_value() and not torch.signbit(A * 0.0)._fill_value()
    assert torch.signbit((A * 0.0) * -0.0)._fill_value()
    for c in (2, 2.0, 2):
        out = A * c
        out._fill_value().fill_(9.0)
        out._values().fill_(9.0)
    torch.testing.assert_close((A * 2).to_dense(), A.to_dense() * 2, rtol=0, atol=0)
    f32 = A.to(torch.float32)
    torch.testing.assert_close((f32 * 0.1)._fill_value(), f32._fill_value() * 0.1, rtol=0, atol=0)
    torch.testing.assert_close((A * 0.1)._fill_value(), A._fill_value() * 0.1, rtol=0, atol=0)


@pytest.mark.parametrize(
    "shape,na,nb",
    [
        ((10,), 5, 5),
        ((4, 5), 6, 3),
        ((3, 4, 2), 0, 5),
        ((3, 4, 2), 7, 0),
        ((6,), 6, 6),
        ((2, 3), 1, 1),
        ((40, 40), 40, 40),
    ],
)
def test_small_union_is_the_torch_merge(shape, na, nb):
    """``union2``'s Python-tuple merge of small CPU patterns (``_union_small``) against the torch merge of the
    linear keys: the same sorted indices and positions, whatever the overlap."""
    for seed in range(4):
        A, B = _coo(shape, na, 1.0, seed=seed), _coo(shape, nb, 2.0, seed=seed + 10)
        if A._nse() + B._nse() == 0:
            continue
        idx, pa, pb = union._union_small(A._indices(), B._indices())
        keys = torch.cat([A._keys(), B._keys()]).unique()
        assert (
            idx.tolist() == torch.stack(torch.unravel_index(keys, shape[: A.sparse_dim()])).tolist()
        )
        assert torch.equal(idx[:, pa], A._indices()) and torch.equal(idx[:, pb], B._indices())
        assert (
            idx.is_contiguous() and idx.dtype == torch.int64 and idx.untyped_storage().resizable()
        )
        _check(A + B, A.to_dense() + B.to_dense())


def test_union_cache_new_operands_and_inference_mode():
    """A new pair of index tensors (same pattern) is merged anew; in inference mode (no version counters)
    nothing is cached and results stay exact."""
    A = _coo((10,), 5, 1.0, seed=0)
    Bs = [
        sparsefill.sparse_coo_tensor(
            _coo((10,), 5, 2.0, seed=2)._indices().clone(),
            torch.arange(5.0) + k,
            (10,),
            fill_value=2.0,
            is_coalesced=True,
        ).to(torch.float64)
        for k in range(3)
    ]
    for B in Bs * 2:
        _check(A + B, A.to_dense() + B.to_dense())
    with torch.inference_mode():
        Ai = _coo((10,), 5, 1.0, seed=0)
        Bi = _coo((10,), 4, 2.0, seed=3)
        for _ in range(2):
            _check(Ai * Bi, Ai.to_dense() * Bi.to_dense())


def test_in_place_fast_path_equals_dense():
    """``A.mul_(c)``, ``A.add_(B)`` (``fast_path.inplace_fast``): ``A`` keeps its identity and holds what the dense
    in-place op gives; its views see the change; a result of another dtype takes the general rule (torch's
    cast or error)."""
    for op, other in (
        (torch.Tensor.mul_, 2.5),
        (torch.Tensor.add_, -1),
        (torch.Tensor.div_, 3.0),
        (torch.Tensor.add_, "same"),
        (torch.Tensor.mul_, "other"),
        (torch.Tensor.sub_, "self"),
    ):
        A = _coo((4, 5), 6, 1.5, seed=1)
        B = {
            "same": lambda: A.detach().clone().mul(2).exp(),
            "other": lambda: _coo((4, 5), 5, 2.0, seed=7),
            "self": lambda: A,
        }.get(other, lambda: other)()
        x, y = A.to_dense(), B.to_dense() if isinstance(B, SparseTensor) else B
        V, W = A.detach(), A[1:]
        out = op(A, B)
        op(x, y)
        assert out is A
        _check(A, x)
        torch.testing.assert_close(V.to_dense(), x)
        torch.testing.assert_close(W.to_dense(), x[1:])
    from sparsefill.ops import registry

    assert registry.fast_path(aten.mul_.Tensor) is fast_path.inplace_fast
    assert registry.fast_path(aten.add_.Tensor) is fast_path.inplace_fast
    assert registry.fast_path(aten.normal_.default) is False  # (random: not pointwise)
    N = _coo((5,), 2, 3, torch.int64)
    with pytest.raises(RuntimeError, match="can't be cast"):
        N.mul_(2.5)
    _check(N, torch.tensor([3] * 5).where(N.to_dense() == 3, N.to_dense()))  # unchanged
    F = _coo((5,), 2, 1.0, torch.float32)
    G = _coo((5,), 3, 2.0, torch.float64, seed=3)
    x = F.to_dense()
    F.add_(G)
    _check(F, x.add_(G.to_dense()))
    assert F.dtype == torch.float32


def test_in_place_fast_path_under_autograd():
    v = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    f = torch.tensor(0.5, requires_grad=True)
    A = sparsefill.sparse_coo_tensor([[0, 2, 4]], v, (6,), fill_value=f)
    B = A * 1.0
    B.mul_(3.0)
    B.add_(B)
    B.to_dense().sum().backward()
    torch.testing.assert_close(v.grad, torch.full((3,), 6.0))
    torch.testing.assert_close(f.grad, torch.tensor(18.0))


def test_python_number_operand_cached_per_value():
    """A float32 ``A * 0.1`` serves its second call from ``fast_path._by_value``'s cache (keyed by the Python
    number, not its float32 rounding), the 0-d tensor holding the float32 rounding of 0.1."""
    A = _coo((6,), 3, 1.0, torch.float32, seed=5)
    fast_path._BY_VALUE.clear()
    A * 0.1
    (entry,) = [v for k, v in fast_path._BY_VALUE.items() if k[1] == 0.1]
    op, t = entry
    assert (
        t.dim() == 0
        and t.dtype == torch.float32
        and float(t) == float(torch.tensor(0.1, dtype=torch.float32))
    )
    A * 0.1
    assert len(fast_path._BY_VALUE) == 1
    torch.testing.assert_close((A * 0.1).to_dense(), A.to_dense() * 0.1, rtol=0, atol=0)


def test_torch_function_skips_route_only_for_what_route_declines():
    """``SparseTensor.__torch_function__`` passes a call through without calling ``autograd_routes.route`` when
    no keyword is given, every argument is a SparseTensor or a Python value and the function is not in
    ``ROUTED``: route itself declines exactly those (grad mode on and off); ``ROUTED`` holds every routed
    function and ``requires_grad_`` (method and property setter)."""
    from sparsefill.ops import autograd_routes as ar

    A = _coo((3, 4), 5, 1.0)
    assert set(ar.ROUTES) <= ar.ROUTED and ar.ALWAYS <= ar.ROUTED
    assert (
        torch.Tensor.requires_grad_ in ar.ROUTED
        and torch._C.TensorBase.requires_grad.__set__ in ar.ROUTED
    )
    calls = [
        (torch.exp, (A,)),
        (torch.Tensor.mul, (A, 2)),
        (torch.Tensor.__add__, (A, A)),
        (torch.add, (A, A, 2)),
        (torch.Tensor.mul_, (A, 1.0)),
        (torch.Tensor.detach, (A,)),
        (torch.Tensor.clone, (A,)),
        (torch.neg, (A,)),
        (torch.clamp, (A, None, 0.5)),
        (torch.Tensor.flip, (A, 0)),
        (torch.Tensor.to, (A, torch.float32)),
        (torch.Tensor.t, (A,)),
    ]
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            for func, args in calls:
                assert func not in ar.ROUTED
                assert ar.route(func, (SparseTensor,), args, {}) is NotImplemented, func
    # the routed ones still route: a SparseTensor leaf's gradient is a SparseTensor (a dense one reaches it here),
    # torch.sparse.sum is A.sum()
    w = torch.arange(12.0, dtype=torch.float64).view(3, 4)
    for make_leaf in (lambda L: L.requires_grad_(), lambda L: setattr(L, "requires_grad", True)):
        L = A.detach()
        make_leaf(L)
        (L * w).sum().backward()
        assert isinstance(L.grad, SparseTensor)
        torch.testing.assert_close(L.grad.to_dense(), w)
    with torch.no_grad():
        torch.testing.assert_close(torch.sparse.sum(A), A.to_dense().sum())
    L = A.detach().requires_grad_()
    (
        L @ L.t()
    ).sum().backward()  # the matrix-product route: the gradient on the pattern of L (dense semantics)
    torch.testing.assert_close(
        L.grad.to_dense(), (torch.ones(3, 3, dtype=torch.float64) @ A.to_dense()) * 2
    )


def test_per_op_caches_are_keyed_by_the_cpp_op():
    """The fast path's per-op caches are keyed by ``func._op`` (an OpOverload's own ``__hash__`` is Python code):
    one entry per op and overload, never shared between overloads, and a handler registered later is seen (the
    registry's ``register`` clears the decisions)."""
    from sparsefill._tensor.tensor import _FAST
    from sparsefill.ops import registry

    A = _coo((5,), 3, 1.0)
    torch.exp(A), A * 2, A + A
    assert _FAST.get(aten.exp.default._op) is fast_path.unary_fast
    assert aten.exp.default._op in fast_path._CALLS and aten.exp.default not in fast_path._CALLS
    assert aten.mul.Tensor._op != aten.mul.Scalar._op
    seen = []

    @registry.register(aten.exp.default)
    def _probe(func, args, kwargs):
        seen.append(func)
        return NotImplemented  # (the next stage: the pointwise rule)

    try:
        _check(torch.exp(A), A.to_dense().exp())
        assert seen == [aten.exp.default]
    finally:
        del registry.HANDLERS[aten.exp.default]
        registry._PLANS.clear()
        _FAST.clear()
    _check(torch.exp(A), A.to_dense().exp())
    assert seen == [aten.exp.default]


@pytest.mark.parametrize("shape", [(600,), (20, 30), (4, 10, 15)])
@pytest.mark.parametrize("op", [torch.mul, torch.add, torch.maximum])
def test_union_with_a_superset_pattern_keeps_it(shape, op):
    """Two patterns of which one holds every stored position of the other (at most 1/16 its size: a gradient
    beside the forward's pattern): the result takes the larger pattern's index tensor, no merge; one position
    outside it merges as before.  Both orders, against dense; NaN and nonzero fills."""
    n = torch.Size(shape).numel()
    g = torch.Generator().manual_seed(3)
    big = torch.randperm(n, generator=g)[:300].sort().values
    small = big[torch.randperm(300, generator=g)[:12]].sort().values
    outside = torch.tensor(
        [int(torch.ones(n, dtype=torch.bool).index_fill_(0, big, False).nonzero()[0])]
    )

    def make(keys, fill, seed):
        idx = torch.stack(torch.unravel_index(keys, shape)) if len(shape) > 1 else keys[None]
        vals = torch.randn(
            keys.numel(), generator=torch.Generator().manual_seed(seed), dtype=torch.float64
        )
        return sparsefill.sparse_coo_tensor(idx, vals, shape, fill_value=fill, is_coalesced=True)

    G = make(big, float("nan"), 1)
    E = make(small, 1.5, 2)
    for X, Y in ((G, E), (E, G)):
        out = op(X, Y)
        _check(out, op(X.to_dense(), Y.to_dense()))
        assert out._indices() is G._indices()
    F = make(torch.cat([small, outside]).sort().values, 2.0, 4)  # not a subset: merged
    for X, Y in ((G, F), (F, G)):
        out = op(X, Y)
        _check(out, op(X.to_dense(), Y.to_dense()))
        assert out._nse() == 301 and out._indices() is not G._indices()


def test_in_place_shape_change_refused_and_nothing_modified():
    """``_writes.assign_`` compares the sizes the SparseTensors were made with (not ``.shape``): an in-place op
    that changes the shape raises ValueError naming both shapes, and ``A`` keeps its storage; so do the
    in-place view ops (``_writes.reshape_``) of a SparseTensor that has a view (which would not follow)."""
    import warnings

    A = _coo((2, 3), 3, 0.5)
    dense, vals = A.to_dense(), A._vals
    V = A[0]
    for f in (
        lambda: A.unsqueeze_(0),
        lambda: A.t_(),
        lambda: A.resize_(3, 2),
        lambda: V.unsqueeze_(0),
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", sparsefill.DensifyWarning)
            with pytest.raises(
                ValueError, match=r"shape \((1, 2, 3|3, 2)\) .* shape \(2, 3\)|keeps its shape"
            ):
                f()
        assert A.shape == (2, 3) and A._vals is vals and V.shape == (3,)
        torch.testing.assert_close(A.to_dense(), dense)


# ---------------------------------------------------------------------- fast_path.unary_fast and its caches
OPS_SCALAR = {
    "add": lambda x, c: x + c,
    "sub": lambda x, c: x - c,
    "mul": lambda x, c: x * c,
    "div": lambda x, c: x / c,
    "floordiv": lambda x, c: x // c,
    "rsub": lambda x, c: c - x,
    "pow": lambda x, c: x**c,
    "lt": lambda x, c: x < c,
    "eq": lambda x, c: x == c,
    "rem": lambda x, c: torch.remainder(x, c),
    "and": lambda x, c: x & c,
}


C_VALUES = [0, 1, -2, 3, 2**60, 1.0, 3.0, -0.0, 0.0, 2.5, 0.1, NAN, INF, True, False, 1 + 1j]


INPLACE = {
    "add": "add_",
    "sub": "sub_",
    "mul": "mul_",
    "div": "div_",
    "floordiv": "floor_divide_",
    "pow": "pow_",
    "rem": "remainder_",
    "and": "bitwise_and_",
}


def test_int_then_float_scalar_promotes_as_dense():
    """``_BY_VALUE`` was keyed by ``(op, c, dtype)``, and ``1 == 1.0`` hash alike: after ``A * 1`` on an
    integer ``A``, ``A * 1.0`` reused the int operand (int64 result; dense: float32), and ``A.mul_(1.0)`` wrote
    silently where dense raises."""
    for dtype in (torch.int64, torch.int32, torch.bool):
        A = sparsefill.sparse_coo_tensor([[0, 2]], torch.tensor([1, 2]).to(dtype), (4,))
        x = A.to_dense()
        for c in (1, 1.0, 3, 3.0, 1, 2.0):
            assert_identical(A * c, x * c)
            assert_identical(A + c, x + c)
            check_same_outcome(lambda: A.clone().mul_(c), lambda: x.clone().mul_(c))


@SETTINGS
@given(
    sparse_cases(fills=("zero", "value", "array", "indefinite")),
    st.lists(
        st.tuples(st.sampled_from(sorted(OPS_SCALAR)), st.sampled_from(C_VALUES)),
        min_size=1,
        max_size=4,
    ),
)
def test_scalar_ops_match_dense(A, calls):
    """``A op c`` for a sequence of calls on one ``A`` (the caches warm in between), out of place and in place."""
    x, unspecified = dense_and_unspecified(A)
    for name, c in calls:
        f = OPS_SCALAR[name]
        if unspecified is None:
            check_same_outcome(lambda: f(A, c), lambda: f(x, c))
            if name in INPLACE:
                check_same_outcome(
                    lambda: getattr(A.clone(), INPLACE[name])(c),
                    lambda: getattr(x.clone(), INPLACE[name])(c),
                )
        else:
            kind, R = outcome(lambda: f(A, c))
            kd, expected = outcome(lambda: f(x, c))
            # (dense raises for an element that is masked out, e.g. 0 // 0 at a zero put there: nothing stored)
            assert kind == kd or kind == "ok" and bool(unspecified.all()), (
                kind,
                kd,
                R if kind == "raise" else "",
            )
            if kind == kd == "ok":
                check_masked(R, expected, unspecified)


def test_zero_dim_sparse_promotes_as_a_zero_dim_tensor():
    """A 0-d SparseTensor once promoted as a dimensioned tensor (its values are): ``a0 + e0`` with a 0-d float64
    dense ``e0`` was float32 (dense: float64), a 0-d float64 ``a0 + B`` with a float32 ``B`` float64 (dense:
    float32)."""
    a64 = sparsefill.sparse_coo_tensor(
        torch.zeros(0, 1, dtype=torch.int64), torch.tensor([2.0], dtype=torch.float64), ()
    )
    a32 = sparsefill.sparse_coo_tensor(
        torch.zeros(0, 0, dtype=torch.int64), torch.zeros(0), (), fill_value=3.0
    )
    B = sparsefill.sparse_coo_tensor([[0, 1], [1, 0]], [1.0, 2.0], (2, 2))
    e64 = torch.tensor(1.0, dtype=torch.float64)
    for f in (lambda a, b: a + b, lambda a, b: b * a, lambda a, b: torch.where(a > 0, b, a)):
        for a, b in ((a64, B), (B, a64), (a32, e64), (e64, a32), (a32, a64)):
            check_same_outcome(
                lambda: f(a, b),
                lambda: f(*(t.to_dense() if isinstance(t, SparseTensor) else t for t in (a, b))),
            )


def _no_element_cases(dtype):
    """SparseTensors with no element (and one with elements: errors stay), as ``(name, A)``."""

    def coo(idx, vals, shape, fill):
        return sparsefill.sparse_coo_tensor(
            torch.tensor(idx, dtype=torch.int64).reshape(len(idx), -1),
            torch.tensor(vals).to(dtype).reshape(len(idx[0]), *shape[len(idx) :]),
            shape,
            fill_value=torch.tensor(fill).to(dtype),
        )

    return [
        ("1-d", coo([[]], [], (0,), 0)),
        ("2-d", coo([[], []], [], (0, 3), 5)),
        ("csr", coo([[], []], [], (0, 3), 1).to_sparse_csr()),
        ("csr, no column", coo([[], []], [], (3, 0), 0).to_sparse_csr()),
        ("hybrid", coo([[]], [], (0, 2), 0)),
        ("hybrid, array fill", coo([[]], [], (0, 2), [0, 1])),
        ("hybrid, uncoalesced, no dense element", coo([[1, 1, 0]], [], (2, 0), 0)),
        ("with elements", coo([[0, 2]], [1, 2], (4,), 0)),
    ]


def test_empty_integer_division_by_zero():
    """A SparseTensor with no element (numel 0) raised where the fill's op raises (int ``// 0``, ``% 0``;
    an int32 ``// 2**60`` overflow), though no element reads the fill; dense returns the empty result.  Out of place
    (``unary_fast``, the general rule, a dense operand varying along the sparse dims: ``_constant_fill``), in place
    and ``out=``; a SparseTensor with elements still raises as dense."""
    ops = {
        "floordiv": lambda a: a // 0,
        "rem": lambda a: a % 0,
        "fmod": lambda a: torch.fmod(a, 0),
        "trunc": lambda a: torch.div(a, 0, rounding_mode="trunc"),
        "overflow": lambda a: a // 2**60,
        "rfloordiv": lambda a: 7 // a,
        "self": lambda a: a // a,
        "other": lambda a: a % (a + 1) // a.clone(),
        "0-d tensor": lambda a: a // torch.tensor(0, dtype=a.dtype),
        "dense over dense dims": lambda a: a // torch.zeros(a.shape[-1:], dtype=a.dtype),
        "dense varying": lambda a: (
            a // torch.zeros(a.shape[:1] + (1,) * (a.dim() - 1), dtype=a.dtype)
        ),
        "float divisor": lambda a: a // torch.zeros(a.shape, dtype=torch.float64) // 0,
    }
    inplace = {
        "floor_divide_": lambda a: a.floor_divide_(0),
        "remainder_": lambda a: a.remainder_(0),
        "div_": lambda a: a.div_(0, rounding_mode="floor"),
        "self": lambda a: a.floor_divide_(a),
        "dense": lambda a: a.remainder_(torch.zeros(a.shape[-1:], dtype=a.dtype)),
    }
    for dtype in (torch.int64, torch.int32, torch.int8, torch.uint8):
        for name, A in _no_element_cases(dtype):
            x = A.to_dense()
            for f in ops.values():
                check_same_outcome(lambda: f(A), lambda: f(x))
            for f in inplace.values():
                B = A.clone()
                kind, R = outcome(lambda: f(B))
                assert kind == outcome(lambda: f(x.clone()))[0], (name, f, R)
                if kind == "ok":
                    assert R is B and type(B) is SparseTensor
                    assert_identical(B, f(x.clone()))
                else:
                    assert_identical(B, x)  # (nothing modified)
            O = A.clone()
            kind, R = outcome(lambda: torch.floor_divide(A, 0, out=O))
            assert kind == outcome(lambda: torch.floor_divide(x, 0, out=x.clone()))[0]
            if kind == "ok":
                assert R is O
                assert_identical(O, x // 0)
            # the same elsewhere: median of no element (a NaN in an integer dtype), softmax (torch checks no dtype)
            for f in (
                torch.median,
                torch.nanmedian,
                lambda a: torch.softmax(a, 0),
                lambda a: torch.log_softmax(a, -1),
            ):
                check_same_outcome(lambda: f(A), lambda: f(x))
            check_same_outcome(lambda: torch.sparse.softmax(A, 0), lambda: torch.softmax(x, 0))


@SETTINGS
@given(
    sparse_cases(dtypes=[torch.float32, torch.float64], fills=("zero", "value")),
    st.sampled_from(["exp", "neg", "abs", "sigmoid", "isnan", "sign", "reciprocal"]),
)
def test_unary_under_every_grad_mode(A, name):
    x = A.to_dense()
    f = getattr(torch, name)
    assert_identical(f(A), f(x))
    with torch.no_grad():
        assert_identical(f(A), f(x))
    with torch.inference_mode():
        assert_identical(f(A), f(x))
        B = A.clone()  # an inference tensor
        assert_identical(f(B) * 2, f(x) * 2)


# ---------------------------------------------------------------------- __torch_function__'s pass-through
def test_pass_through_equals_route(monkeypatch):
    """A call ``route`` would decline passes straight through: the same results, types and gradients as when
    every call asks ``route`` (``routed`` replaced by a set holding everything)."""
    from sparsefill._tensor import tensor as _tensor

    def run():
        torch.manual_seed(0)
        A = sparsefill.sparse_coo_tensor(
            [[0, 1, 1], [1, 0, 2]], [1.0, 2.0, 3.0], (3, 3), fill_value=0.5
        )
        L = A.detach().requires_grad_()
        outs = [
            torch.exp(L),
            L + L,
            L * 2,
            L.sum(),
            L.sum(0),
            L @ L,
            torch.sparse.sum(L),
            L.t(),
            L[0],
            L.dim(),
            L.to_dense(),
        ]
        sum(o.sum() if isinstance(o, torch.Tensor) else 0 for o in outs).backward()
        with torch.no_grad():
            outs += [torch.exp(A), A @ A]
        return [(type(o), o.to_dense() if isinstance(o, SparseTensor) else o) for o in outs] + [
            (type(L.grad), L.grad.to_dense())
        ]

    fast = run()
    monkeypatch.setattr(_tensor.HOOKS, "routed", sparsefill.ops._Everything())
    slow = run()
    for (ta, a), (tb, b) in zip(fast, slow):
        assert ta is tb
        if isinstance(a, torch.Tensor):
            assert_identical(a, b)
        else:
            assert a == b
