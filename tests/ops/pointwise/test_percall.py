"""The element-wise fast path (``pointwise.unary_fast``, issue 18's per-call cost): same results as on the dense
tensors, whatever shortcut it takes (same pattern, the cached union of two patterns, three patterns), and the
per-op decisions it caches (``_call_of``) run exactly the op that was dispatched."""

import pytest
import torch

import sparsefill
from sparsefill import SparseTensor
from sparsefill.ops import pointwise

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
    call = pointwise._call_of(aten.mul.Tensor, (f, 2), {}, ("test", aten.mul.Tensor))
    assert call is torch.mul  # the binding dispatches to mul.Tensor
    # torch.add(t, 2) dispatches to add.Tensor, not add.Scalar: the schema's own call
    assert (
        pointwise._call_of(aten.add.Scalar, (f, 2), {}, ("test", aten.add.Scalar))
        == aten.add.Scalar._op
    )
    # no binding of that name
    assert (
        pointwise._call_of(aten.sigmoid_backward.default, (f, f), {}, ("test", 3))
        == aten.sigmoid_backward.default._op
    )
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Passthrough():  # a dispatch mode is active: the schema's call, not cached
        assert (
            pointwise._call_of(aten.exp.default, (f,), {}, ("test", "mode")) == aten.exp.default._op
        )
    assert ("test", "mode") not in pointwise._CALLS
    for k in [k for k in pointwise._CALLS if isinstance(k, tuple) and k[0] == "test"]:
        del pointwise._CALLS[k]


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
    (``pointwise._by_value``); the values and the fill are bit for bit what the op gives on them with ``c``."""
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
        idx, pa, pb = pointwise._union_small(A._indices(), B._indices())
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
    """``A.mul_(c)``, ``A.add_(B)`` (``pointwise.inplace_fast``): ``A`` keeps its identity and holds what the dense
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

    assert registry.fast_path(aten.mul_.Tensor) is pointwise.inplace_fast
    assert registry.fast_path(aten.add_.Tensor) is pointwise.inplace_fast
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
    """A float32 ``A * 0.1`` serves its second call from ``pointwise._by_value``'s cache (keyed by the Python
    number, not its float32 rounding), the 0-d tensor holding the float32 rounding of 0.1."""
    A = _coo((6,), 3, 1.0, torch.float32, seed=5)
    pointwise._BY_VALUE.clear()
    A * 0.1
    (entry,) = [v for k, v in pointwise._BY_VALUE.items() if k[1] == 0.1]
    op, t = entry
    assert (
        t.dim() == 0
        and t.dtype == torch.float32
        and float(t) == float(torch.tensor(0.1, dtype=torch.float32))
    )
    A * 0.1
    assert len(pointwise._BY_VALUE) == 1
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
    from sparsefill._tensor import _FAST
    from sparsefill.ops import registry

    A = _coo((5,), 3, 1.0)
    torch.exp(A), A * 2, A + A
    assert _FAST.get(aten.exp.default._op) is pointwise.unary_fast
    assert aten.exp.default._op in pointwise._CALLS and aten.exp.default not in pointwise._CALLS
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
