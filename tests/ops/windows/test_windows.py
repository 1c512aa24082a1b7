"""Windowed ops of ops/windows/ against dense torch, forward and backward (values and fill gradients), on
the torch path and the compiled kernel (numba) alike.

``avg_pool1d`` and ``conv1d`` of a SparseTensor (1-d signals as ``x[None, None]``, batched (N, C, L),
unbatched (C, L) from a CSR) equal the op on ``A.to_dense()``; the gradients of the constructor's values
and fill equal those through ``A.to_dense()``.  The native runs are under ``densify_policy('raise')``:
nothing densifies (the pattern of the result and of the input's gradient is checked to be sparse too).
"""

import functools
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import sparsefill

DT = torch.float64


@pytest.fixture(autouse=True, params=["torch", "numba"])
def backend(request):
    """Every test on both paths of ``ops/windows/_core._windowed``: torch ops, and the compiled kernel of
    ``_kernels`` (the segment backend's policy: ``"numba"`` takes it for every call)."""
    if request.param == "numba":
        pytest.importorskip("numba", reason="the compiled window kernel needs numba")
    with sparsefill.segment.use_backend(request.param):
        yield request.param


def _signal(shape, positions, fill, layout=torch.sparse_coo, dtype=DT, seed=0):
    """Leaves ``(values, fill)`` and the SparseTensor (COO over all dims, or CSR when 2-d) built from them."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.tensor(positions, dtype=torch.int64).T.reshape(len(shape), -1)
    v = (torch.rand(idx.shape[1], generator=g, dtype=DT) * 4 - 1).to(dtype).requires_grad_()
    f = torch.tensor(fill, dtype=dtype, requires_grad=True)
    A = sparsefill.sparse_coo_tensor(idx, v, shape, fill_value=f)
    if layout is torch.sparse_csr:
        A = A.to_sparse_csr()
    return v, f, A


def _grads(loss, v, f):
    return torch.autograd.grad(loss, (v, f), allow_unused=True)


def _check(
    op,
    shape,
    positions,
    fill,
    loss=lambda y: (y * y).sum(),
    layout=torch.sparse_coo,
    dtype=DT,
    native_backward=True,
):
    v, f, A = _signal(shape, positions, fill, layout, dtype)
    with sparsefill.densify_policy("raise"):
        y = op(A)
        assert isinstance(y, sparsefill.SparseTensor), type(y)
        assert y._nse() < y.numel() or y.numel() <= 3 * len(positions) * 8, (
            "the result is not sparse"
        )
        gv, gf = _grads(loss(y), v, f) if native_backward else (None, None)
    ref = op(A.to_dense())
    torch.testing.assert_close(y.to_dense(), ref, equal_nan=True)
    rv, rf = _grads(loss(op(A.to_dense())), v, f)
    if (
        not native_backward
    ):  # (dense by nature where the gradient fill is nonzero: the fallback may run)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", sparsefill.DensifyWarning)
            gv, gf = _grads(loss(op(A)), v, f)
    torch.testing.assert_close(gv, rv, equal_nan=True)
    torch.testing.assert_close(gf, rf, equal_nan=True)
    return y


L = 40
EDGES = [[0], [3], [17], [19], [39]]  # both ends, a cluster, an isolated one


def pool(w, **kw):
    if "divisor_override" in kw:  # (avg_pool1d has none: the 2-d op with a kernel of height 1)
        s, p = kw.pop("stride", w), kw.pop("padding", 0)
        return lambda x: F.avg_pool2d(x[None, None, None], (1, w), (1, s), (0, p), **kw)[0, 0, 0]
    return lambda x: F.avg_pool1d(x[None, None], w, **kw)[0, 0]


def conv(kernel, **kw):
    return lambda x: F.conv1d(x[None, None], kernel, **kw)[0, 0]


@pytest.mark.parametrize("fill", [0.0, 5.0, math.nan, math.inf])
@pytest.mark.parametrize(
    "kw",
    [
        dict(stride=1),
        dict(stride=1, padding=2),
        dict(stride=2),
        dict(stride=3),
        dict(stride=2, padding=2, ceil_mode=True),
        dict(stride=1, padding=2, count_include_pad=False),
        dict(stride=2, padding=1, divisor_override=3),
    ],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()),
)
def test_avg_pool1d_1d_signal(fill, kw):
    w = 4 if kw.get("padding", 0) <= 2 else 6
    # a gradient fill that is nonzero needs a stride dividing the window (else the gradient is dense)
    native = w % kw["stride"] == 0
    _check(pool(w, **dict(kw)), (L,), EDGES, fill, native_backward=native)


def test_avg_pool1d_loss_with_zero_gradient_fill():
    """relu(window - threshold).mean(): the pipeline of examples/rare_events.py (stride 3: zero gradient fill)."""
    loss = lambda y: F.relu(y - 5.5).mean()  # noqa: E731
    _check(pool(6, stride=1), (L,), EDGES, 5.0, loss)
    _check(pool(6, stride=3, padding=3), (L,), EDGES, 5.0, loss)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_avg_pool1d_batched_and_dtypes(dtype):
    pos = [
        [0, 0, 0],
        [0, 0, 39],
        [0, 2, 7],
        [1, 1, 20],
        [1, 1, 21],
    ]  # (N, C, L) = (2, 3, 40): rows without elements
    y = _check(lambda x: F.avg_pool1d(x, 5, stride=1, padding=1), (2, 3, L), pos, 2.0, dtype=dtype)
    assert y.dtype == dtype and y.shape == (2, 3, L - 2)


@pytest.mark.parametrize("fill", [0.0, 5.0, math.nan])
def test_avg_pool1d_csr(fill):
    pos = [[0, 0], [0, 12], [2, 39], [2, 38]]
    v, f, A = _signal((3, L), pos, fill, torch.sparse_csr)
    assert A.sparse_layout is torch.sparse_csr
    _check(lambda x: F.avg_pool1d(x, 3, stride=1), (3, L), pos, fill, layout=torch.sparse_csr)


def test_avg_pool1d_uncoalesced_and_empty():
    v = torch.tensor([1.0, 2.0, 3.0], dtype=DT, requires_grad=True)
    A = sparsefill.sparse_coo_tensor([[5, 5, 30]], v, (L,), fill_value=1.0)
    assert not A.is_coalesced()
    torch.testing.assert_close(pool(3)(A).to_dense(), pool(3)(A.to_dense()))
    E = sparsefill.sparse_coo_tensor(
        torch.zeros(1, 0, dtype=torch.int64), torch.zeros(0, dtype=DT), (L,), fill_value=2.0
    )
    for op in (pool(3), pool(4, stride=2, padding=2), conv(torch.ones(1, 1, 3, dtype=DT))):
        torch.testing.assert_close(op(E).to_dense(), op(E.to_dense()))
    Z = sparsefill.sparse_coo_tensor(
        torch.zeros(1, 0, dtype=torch.int64), torch.zeros(0, dtype=DT), (0,)
    )
    for x in (Z, Z.to_dense()):  # a 0-size signal: torch's own error
        with pytest.raises(RuntimeError, match="Expected 3D or 4D"):
            pool(1)(x)


@pytest.mark.parametrize("fill", [0.0, 5.0, math.nan])
@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(padding=2),
        dict(stride=2),
        dict(stride=2, padding=3, dilation=2),
        dict(dilation=3),
    ],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "plain",
)
def test_conv1d_1d_signal(fill, kw):
    """A kernel of distinct taps: the (element, tap) pairs; a NaN fill goes to the densify fallback."""
    kernel = torch.tensor([[[0.5, -1.0, 2.0, 0.25]]], dtype=DT)
    if math.isnan(fill):
        _check_fallback(conv(kernel, **kw), (L,), EDGES, fill)
    else:  # a nonzero gradient fill with a stride: the gradient is periodic (dense by nature)
        _check(
            conv(kernel, **kw),
            (L,),
            EDGES,
            fill,
            native_backward=kw.get("stride", 1) == 1 or fill == 0.0,
        )


@pytest.mark.parametrize("fill", [0.0, 5.0])
@pytest.mark.parametrize(
    "kw",
    [dict(), dict(padding=3), dict(stride=2, padding=1), dict(stride=3)],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "plain",
)
def test_conv1d_moving_average(fill, kw):
    """``conv1d`` with a constant kernel (a moving average, one channel per group): the prefix-sum path,
    bias included; batched depthwise too."""
    k = torch.full((1, 1, 6), 1 / 6, dtype=DT)
    s = kw.get("stride", 1)
    _check(conv(k, **kw), (L,), EDGES, fill, native_backward=6 % s == 0 or fill == 0.0)
    kd, b = torch.tensor([[[0.5] * 4], [[0.5] * 4]], dtype=DT), torch.tensor([1.0, 1.0], dtype=DT)
    pos = [[0, 0, 3], [0, 1, 39], [1, 0, 20]]
    _check(
        lambda x: F.conv1d(x, kd, b, groups=2, **kw),
        (2, 2, L),
        pos,
        fill,
        native_backward=4 % s == 0,
    )


def _check_fallback(op, shape, positions, fill):
    """A NaN fill in conv1d: the densify fallback (exact, announced), no native path claimed."""
    v, f, A = _signal(shape, positions, fill)
    with pytest.warns(sparsefill.DensifyWarning, match="convolution"):
        y = op(A)
    torch.testing.assert_close(
        y.to_dense() if isinstance(y, sparsefill.SparseTensor) else y,
        op(A.to_dense()),
        equal_nan=True,
    )


@pytest.mark.parametrize("fill", [0.0, 2.0, math.nan, -math.inf])
@pytest.mark.parametrize("odd", [math.inf, -math.inf, math.nan])
def test_avg_pool1d_non_finite_values(fill, odd):
    """Stored inf/NaN values: counted apart from the prefix sums (a window holding +inf and -inf is NaN)."""
    v = torch.tensor(
        [1.0, odd, 3.0, -odd if not math.isnan(odd) else 2.0, 4.0], dtype=DT, requires_grad=True
    )
    f = torch.tensor(fill, dtype=DT, requires_grad=True)
    A = sparsefill.sparse_coo_tensor([[0, 5, 6, 8, 39]], v, (L,), fill_value=f)
    for kw in (dict(stride=1), dict(stride=2, padding=1)):
        op = pool(3, **kw)
        with sparsefill.densify_policy("raise"):
            y = op(A)
            gv, gf = _grads((y * 0.5).sum(), v, f)
        torch.testing.assert_close(y.to_dense(), op(A.to_dense()), equal_nan=True)
        rv, rf = _grads((op(A.to_dense()) * 0.5).sum(), v, f)
        torch.testing.assert_close(gv, rv, equal_nan=True)
        torch.testing.assert_close(gf, rf, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_conv1d_csr_unbatched(dtype):
    """A (C, L) CSR signal, unbatched conv1d (torch unsqueezes it to (1, C, L))."""
    pos = [[0, 0], [0, 20], [1, 39]]
    W = torch.full((1, 2, 5), 0.2, dtype=dtype)
    y = _check(
        lambda x: F.conv1d(x, W, padding=2), (2, L), pos, 1.5, layout=torch.sparse_csr, dtype=dtype
    )
    assert y.shape == (1, L)


@pytest.mark.parametrize(
    "groups, cout, uniform",
    [(1, 1, True), (2, 2, True), (1, 1, False), (1, 2, False), (2, 4, False)],
)
def test_conv1d_channels_weight_and_bias_gradients(groups, cout, uniform):
    """(N, C, L) = (2, 2, 40): the weight's and the bias's gradients too (dense leaves: dense gradients).

    With a weight whose sums agree over channels the result and the input's gradient are sparse (native,
    nothing densifies); with a random weight each output channel has its own interior value (the result
    is dense by nature) or each input channel its own gradient fill: the densify fallback, announced."""
    pos = [[0, 0, 0], [0, 1, 5], [0, 1, 6], [1, 0, 39], [1, 1, 20]]
    g = torch.Generator().manual_seed(1)
    W = (
        torch.full((cout, 2 // groups, 3), 0.25, dtype=DT)
        if uniform
        else torch.randn(cout, 2 // groups, 3, generator=g, dtype=DT)
    ).requires_grad_()
    b = (
        torch.full((cout,), 0.5, dtype=DT) if uniform else torch.randn(cout, generator=g, dtype=DT)
    ).requires_grad_()
    op = lambda x: F.conv1d(x, W, b, padding=1, groups=groups)  # noqa: E731
    v, f, A = _signal((2, 2, L), pos, 0.5)
    with sparsefill.densify_policy("raise" if uniform else "warn"):
        y = op(A)
        assert isinstance(y, sparsefill.SparseTensor) == (uniform or cout == 1)
        loss = (y * y).sum()
        if uniform:
            got = torch.autograd.grad(loss, (v, f, W, b))
        else:
            with pytest.warns(sparsefill.DensifyWarning, match="convolution_backward"):
                got = torch.autograd.grad(loss, (v, f, W, b))
    ref = op(A.to_dense())
    torch.testing.assert_close(y.to_dense() if isinstance(y, sparsefill.SparseTensor) else y, ref)
    want = torch.autograd.grad((ref * ref).sum(), (v, f, W, b))
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e)
    assert type(got[2]) is torch.Tensor and type(got[3]) is torch.Tensor


def test_conv1d_weight_gradient_native():
    """One channel, a weight that requires grad: nothing densifies, the weight's gradient is exact."""
    W = torch.tensor([[[0.5, -1.0, 2.0]]], dtype=DT, requires_grad=True)
    v, f, A = _signal((L,), EDGES, 3.0)
    with sparsefill.densify_policy("raise"):
        y = F.conv1d(A[None, None], W, padding=1, dilation=2)
        gv, gf, gw = torch.autograd.grad((y * y).sum(), (v, f, W))
    yd = F.conv1d(A.to_dense()[None, None], W, padding=1, dilation=2)
    for a, e in zip((gv, gf, gw), torch.autograd.grad((yd * yd).sum(), (v, f, W))):
        torch.testing.assert_close(a, e)


def test_gradient_is_sparse():
    """The input's gradient stores O(nse * w) elements (the pattern and the w - 1 inputs at either end that
    fewer windows cover), not the signal's length."""
    v, f, A = _signal((10_000,), [[100], [5000], [9000]], 5.0)
    x = A.detach()
    y = F.avg_pool1d(x[None, None], 10, stride=1)
    assert y._nse() <= 3 * 10
    G = y * y
    gi = torch.ops.aten.avg_pool2d_backward.default(
        G[None], x[None, None, None], [1, 10], [1, 1], [0, 0], False, True, None
    )
    assert isinstance(gi, sparsefill.SparseTensor) and gi._nse() <= 3 * 19 + 2 * 9


@pytest.mark.parametrize("w, s, p, native", [(4, 2, 1, True), (6, 3, 0, True), (3, 2, 1, False)])
def test_avg_pool_backward_gradient_fill(w, s, p, native):
    """avg_pool2d_backward with a gradient of nonzero fill (what a loss like ``y.sum()`` sends without the
    ``[0, 0]`` selection): native where the stride divides the window (uniform coverage w / s), else dense
    by nature (the gradient's unspecified elements differ by position mod s): every output of ``G`` stored,
    O(outputs), no densify fallback; under ``dense_by_nature='raise'`` it refuses."""
    x = sparsefill.sparse_coo_tensor(
        [[0, 9, 10, 30, 39]], [1.0, 2.0, 3.0, 4.0, 5.0], (L,), fill_value=2.0
    )[None, None, None]
    y = torch.ops.aten.avg_pool2d.default(x, [1, w], [1, s], [0, p], False, True, None)
    G = y * y + 1.0
    args = (G, x, [1, w], [1, s], [0, p], False, False, None)
    if native:
        with sparsefill.densify_policy("raise"):
            gi = torch.ops.aten.avg_pool2d_backward.default(*args)
        assert isinstance(gi, sparsefill.SparseTensor) and gi._nse() < L
    else:
        with sparsefill.densify_policy(
            "raise"
        ):  # no fallback; the gate's dense_by_nature refuses if asked
            gi = torch.ops.aten.avg_pool2d_backward.default(*args)
            with (
                pytest.raises(sparsefill.DensifyError, match="dense by nature"),
                sparsefill.densify_policy(dense_by_nature="raise"),
            ):
                torch.ops.aten.avg_pool2d_backward.default(*args)
    ref = torch.ops.aten.avg_pool2d_backward.default(G.to_dense(), x.to_dense(), *args[2:])
    torch.testing.assert_close(
        gi.to_dense() if isinstance(gi, sparsefill.SparseTensor) else gi, ref
    )


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
@pytest.mark.parametrize("w, s, p, ceil", [(3, 3, 0, False), (4, 2, 1, True), (5, 1, 2, False)])
def test_avg_pool1d_short_rows_backward_within_the_input_size(layout, w, s, p, ceil):
    """Many short rows (the edge inputs, weighed one window tap at a time, outnumber the interior ones): the
    gradients of the values and the fill equal dense's, with a byte limit of the input's dense size raising nothing
    (the allocations themselves are logged by tests/opinfo/test_policy_sweep.py)."""
    shape = (4, 3, 9)
    keep = torch.rand(shape, generator=torch.Generator().manual_seed(1)) < 0.25
    idx = keep.nonzero().T
    v = torch.linspace(-2.0, 3.0, idx.shape[1], dtype=torch.float64).requires_grad_()
    f = torch.tensor(0.75, dtype=torch.float64, requires_grad=True)
    make = lambda: sparsefill.sparse_coo_tensor(idx, v, shape, fill_value=f)  # noqa: E731
    A = make().to_sparse(layout=layout)
    kw = dict(kernel_size=w, stride=s, padding=p, ceil_mode=ceil)
    with sparsefill.densify_policy("raise", limit_bytes=4 * 3 * 9 * 8):
        F.avg_pool1d(A, **kw).sum().backward()
    got = v.grad.clone(), f.grad.clone()
    v.grad = f.grad = None
    F.avg_pool1d(make().to_dense(), **kw).sum().backward()
    torch.testing.assert_close(got, (v.grad, f.grad))


def test_indefinite_fill_raises():
    A = sparsefill.sparse_coo_tensor([[1, 5]], [1.0, 2.0], (10,), fill_value=sparsefill.indefinite)
    with pytest.raises(ValueError, match="indefinite"):
        F.avg_pool1d(A[None, None], 3)
    with pytest.raises(ValueError, match="indefinite"):
        F.conv1d(A[None, None], torch.ones(1, 1, 3))


def test_bad_arguments_raise_as_torch():
    v, f, A = _signal((L,), EDGES, 1.0)
    for kw in (dict(kernel_size=3, padding=2), dict(kernel_size=50), dict(kernel_size=0)):
        with pytest.raises(RuntimeError) as ours:
            F.avg_pool1d(A.detach()[None, None], **kw)
        with pytest.raises(RuntimeError) as dense:
            F.avg_pool1d(A.detach().to_dense()[None, None], **kw)
        assert str(ours.value).split("\n")[0] == str(dense.value).split("\n")[0]


def test_unsupported_goes_dense_exactly():
    """A true 2-d pooling window and a transposed convolution are not windows along one dim: the densify
    fallback computes them (exact, with its DensifyWarning)."""
    A = sparsefill.sparse_coo_tensor([[0, 1], [2, 3]], [1.0, 2.0], (3, 5), fill_value=1.0)
    with pytest.warns(sparsefill.DensifyWarning):
        y = F.avg_pool2d(A[None], 2)
    torch.testing.assert_close(
        y.to_dense() if isinstance(y, sparsefill.SparseTensor) else y,
        F.avg_pool2d(A.to_dense()[None], 2),
    )
    K = torch.ones(1, 1, 2)
    with pytest.warns(sparsefill.DensifyWarning):
        y = F.conv_transpose1d(A[None, :1], K)
    torch.testing.assert_close(
        y.to_dense() if isinstance(y, sparsefill.SparseTensor) else y,
        F.conv_transpose1d(A.to_dense()[None, :1], K),
    )


@pytest.mark.parametrize("fill", [[0.0] * 12, [float(i) for i in range(12)], [math.nan] * 12])
def test_avg_pool1d_hybrid(fill):
    """(N, C, L) with L a dense dim: the op on every stored slice and on the fill (an array over L)."""
    v = torch.rand(3, 12, dtype=DT, requires_grad=True)
    f = torch.tensor(fill, dtype=DT, requires_grad=True)
    A = sparsefill.sparse_coo_tensor([[0, 1, 1], [2, 0, 1]], v, (2, 3, 12), fill_value=f)
    assert A.dense_dim() == 1
    op = lambda x: F.avg_pool1d(x, 4, stride=2, padding=1)  # noqa: E731
    with sparsefill.densify_policy("raise"):
        y = op(A)
        gv, gf = _grads((y * y).sum(), v, f)
    assert isinstance(y, sparsefill.SparseTensor) and y.dense_dim() == 1 and y._nse() == 3
    torch.testing.assert_close(y.to_dense(), op(A.to_dense()), equal_nan=True)
    rv, rf = _grads((op(A.to_dense()) ** 2).sum(), v, f)
    torch.testing.assert_close(gv, rv, equal_nan=True)
    torch.testing.assert_close(gf, rf, equal_nan=True)


def test_avg_pool_dense_upstream_gradient():
    """A dense upstream gradient (``(y * R).sum()``, R dense): the input's gradient is dense by nature and
    computed without densifying the input (no DensifyWarning)."""
    v, f, A = _signal((L,), EDGES, 5.0)
    R = torch.rand(L - 3, dtype=DT)
    with sparsefill.densify_policy("raise"):
        gv, gf = _grads((pool(4, stride=1)(A) * R).sum(), v, f)
    rv, rf = _grads((pool(4, stride=1)(A.to_dense()) * R).sum(), v, f)
    torch.testing.assert_close(gv, rv)
    torch.testing.assert_close(gf, rf)


@pytest.mark.parametrize("w, s, p", [(5, 1, 0), (5, 1, 2), (4, 2, 1), (3, 3, 0), (2, 4, 1)])
@pytest.mark.parametrize("odd", [None, math.inf, math.nan])
def test_compiled_kernel_equals_torch_path(w, s, p, odd):
    """``_core._windowed`` on both paths, forward windows and their transpose, several rows (some empty), on
    random sorted sources: the same targets, edge positions and sums (non-finite values counted apart)."""
    pytest.importorskip("numba", reason="the compiled window kernel needs numba")
    from sparsefill.ops.windows import _core
    from sparsefill.ops.windows.pooling import _pool_windows

    g = torch.Generator().manual_seed(w * 10 + s)
    n_rows, L = 4, 60
    keys = torch.randperm(n_rows * L, generator=g)[:40].sort().values
    keys = keys[keys // L != 2]  # (a row with no source)
    rows, x = keys // L, keys % L
    cols = torch.randn(2, x.numel(), generator=g, dtype=DT)
    if odd is not None:
        cols[0, 3], cols[1, 7] = odd, -odd
    Lo = (L + 2 * p - w) // s + 1
    fwd, bwd = _pool_windows(w, s, p)
    oL, oR = -(-p // s), (L - 1 + p - (w - 1)) // s
    edges = 0
    for shape, tL, tR, win, reach, S in (
        ((2, 2, Lo), oL, oR, fwd, bwd, L),
        ((2, 2, L), oL * s - p + w - 1, oR * s - p, bwd, fwd, Lo),
    ):
        src = x if S == L else x.clamp(max=Lo - 1)
        keep = torch.ones_like(src, dtype=torch.bool)
        keep[1:] = (rows[1:] != rows[:-1]) | (src[1:] != src[:-1])  # (unique positions in a row)
        args = (rows[keep], src[keep], cols[:, keep], shape, tL, tR, win, reach, S, 2.5, 3.0)
        with sparsefill.segment.use_backend("torch"):
            ref = _core._windowed(*args)
        with sparsefill.segment.use_backend("numba"):
            got = _core._windowed_compiled(*args)
        assert torch.equal(got.idx, ref.idx) and torch.equal(
            got.edge, ref.edge.sort().values
        )  # (any order)
        torch.testing.assert_close(got.sums, ref.sums, equal_nan=True)
        edges += got.edge.numel()
    assert edges, "no edge target: the edges' bare sums are not exercised"


def test_avg_pool_backward_gradient_past_the_right_edge():
    """A gradient stored only at the last output (ceil_mode, padding, count_include_pad=False: the last two
    outputs' divisors differ), fill 1: the inputs between the interior and that output's window take the edge
    weights too (their union once ended at the first stored window past the edge's start)."""
    x = sparsefill.sparse_coo_tensor([[3]], [2.0], (L,), fill_value=1.0)[None, None, None]
    args = ([1, 6], [1, 2], [0, 3], True, False, None)
    y = torch.ops.aten.avg_pool2d.default(x, *args)
    Lo = y.shape[-1]
    G = sparsefill.sparse_coo_tensor([[0], [0], [0], [Lo - 1]], [5.0], y.shape, fill_value=1.0)
    with sparsefill.densify_policy("raise"):
        gi = torch.ops.aten.avg_pool2d_backward.default(G, x, *args)
    ref = torch.ops.aten.avg_pool2d_backward.default(G.to_dense(), x.to_dense(), *args)
    torch.testing.assert_close(gi.to_dense(), ref)


@pytest.mark.parametrize("fill", [0.0, 5.0, math.nan])
@pytest.mark.parametrize("coalesced", [True, False])
def test_selections_of_the_pipeline_share_the_index(fill, coalesced, backend):
    """``A[None]``, ``[0]``, ``squeeze``/``unsqueeze`` and their backward on the size-1 dims of the rare-events
    pipeline: equal to dense (values and fill gradients), the index rows of a squeeze or of a select on a
    size-1 dim a view of the input's (no copy), an inserted size-1 dim's row zero -- past ``_CALLOC_MIN``
    stored elements too (the zeroed index whose size-1 rows are not written)."""
    # (no window op: the numba run would repeat the torch run; kept rather than a skip, it reuses the
    # first run's outcome: the check runs once per (fill, coalesced) and again only after a failure)
    _check_selections_share_the_index(fill, coalesced)


@functools.cache
def _check_selections_share_the_index(fill, coalesced):
    from sparsefill.ops.shape import reshape as shape

    n = shape._CALLOC_MIN + 10
    g = torch.Generator().manual_seed(3)
    L = n + 1000
    pos = torch.randperm(L, generator=g)[:n].sort().values
    if not coalesced:
        pos = torch.cat([pos, pos[:5]])
    v = torch.rand(pos.numel(), generator=g, dtype=DT).requires_grad_()
    f = torch.tensor(fill, dtype=DT, requires_grad=True)
    A = sparsefill.sparse_coo_tensor(pos[None], v, (L,), fill_value=f)
    assert A.is_coalesced() == coalesced
    ops = [
        lambda x: x[None][0],
        lambda x: x[None, None].squeeze(1)[0],
        lambda x: x.unsqueeze(0).unsqueeze(0)[0, 0],
    ]
    for op in ops:
        y = op(A)
        yd = op(A.to_dense())
        torch.testing.assert_close(y.to_dense(), yd, equal_nan=True)
        w = torch.linspace(0, 1, L, dtype=DT)
        got = torch.autograd.grad((y * w).sum(), (v, f))
        want = torch.autograd.grad((yd * w).sum(), (v, f))
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, equal_nan=True)
    B = A.detach()[None, None]  # (1, 1, L): rows 0 and 1 all zero
    assert B._idx.shape == (3, B._nse()) and not bool(B._idx[:2].any())
    for S in (B.squeeze(1), B[0], B.squeeze(0)[0]):
        assert S._idx.untyped_storage().data_ptr() == B._idx.untyped_storage().data_ptr()  # a view
        torch.testing.assert_close(S.to_dense(), B.to_dense().reshape(S.shape), equal_nan=True)
    G = torch.ops.aten.select_backward.default(A.detach() * 2.0, [1, L], 0, 0)
    assert G._idx.shape[0] == 2 and not bool(G._idx[0].any())
    torch.testing.assert_close(G.to_dense(), (A.detach() * 2.0).to_dense()[None], equal_nan=True)
