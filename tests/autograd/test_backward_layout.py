"""Gradients keep their operand's layout and index tensors; recurring patterns are not re-sorted.

- the gradient reaching a SparseTensor operand of ``@`` (``linalg_autograd.SparseMM``), of
  ``sparsefill.masked.softmax`` and of element-wise ops is a SparseTensor in the operand's layout on
  the operand's own index tensors (CSR: ``crow``/``col``; COO: ``indices``), and exact (against dense);
- element-wise ops on a COO and a CSR operand of the same pattern align them without a merge
  (``_tensor.parts.union_parts`` is not called), patterns that differ still merge, results against dense;
- the GAT layer (``examples/gat.py``'s formula) on a CSR adjacency runs its backward with no merge, and
  its gradients equal the COO adjacency's;
- the pattern cache (``_kernels.grouping.pattern_cached``: the transpose of ``_Mat.t`` and ``group_slices``)
  serves a recurring pattern, and never a changed one: indices changed in place, then the results
  against dense again; an entry goes when its index tensor dies.
"""

from __future__ import annotations

import gc
import warnings

import pytest
import torch
import torch.nn.functional as F

import sparsefill
from sparsefill._tensor import parts as _convert
from sparsefill._kernels import grouping as _grouping
from sparsefill import masked
from sparsefill.ops.pointwise import fast_path, rule as pointwise

LAYOUTS = [torch.sparse_coo, torch.sparse_csr]


def _pattern(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    keys = torch.unique(torch.randint(0, n * n, (3 * n,), generator=g))
    keys = torch.unique(torch.cat([keys, torch.arange(n) * (n + 1)]))  # every row non-empty
    return torch.stack([keys // n, keys % n]), n


def _build(layout, fill, dtype=torch.float64, seed=0):
    """``(A, values leaf, fill leaf or None)``: A built by the differentiable constructor."""
    idx, n = _pattern(seed=seed)
    v = torch.randn(
        idx.shape[1],
        dtype=dtype,
        generator=torch.Generator().manual_seed(seed + 1),
        requires_grad=True,
    )
    f = (
        None
        if fill is sparsefill.indefinite
        else torch.tensor(fill, dtype=dtype, requires_grad=True)
    )
    A = sparsefill.sparse_coo_tensor(
        idx, v, (n, n), fill_value=sparsefill.indefinite if f is None else f
    )
    return (A.to_sparse_csr() if layout is torch.sparse_csr else A), v, f


def _same_indices(G, A):
    assert isinstance(G, sparsefill.SparseTensor)
    assert G.layout is torch.strided and G._sf_layout is A._sf_layout
    if A._sf_layout is torch.sparse_csr:
        assert G._crow is A._crow and G._col is A._col
    else:
        assert G._idx is A._idx


def _capture(T):
    seen = []
    T.register_hook(lambda g: seen.append(g))
    return seen


def _count_merges(monkeypatch):
    calls = []
    orig = _convert.union_parts

    def spy(tensors):
        calls.append([T._sf_layout for T in tensors])
        return orig(tensors)

    monkeypatch.setattr(_convert, "union_parts", spy)
    monkeypatch.setattr(pointwise, "union_parts", spy)
    monkeypatch.setattr(fast_path, "union_parts", spy)
    return calls


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fill", [0.0, 1.5, sparsefill.indefinite])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matmul_gradient_keeps_layout_and_indices(layout, fill, dtype):
    A, v, f = _build(layout, fill, dtype)
    X = torch.randn(A.shape[1], 3, dtype=dtype, requires_grad=True)
    seen = _capture(A)
    (A @ X).square().sum().backward()
    _same_indices(seen[0], A)
    # exact: against the dense computation (an indefinite fill: the masked-out elements read nothing)
    v2 = v.detach().clone().requires_grad_()
    f2 = None if f is None else f.detach().clone().requires_grad_()
    idx, n = _pattern()
    d = (torch.zeros((n, n), dtype=dtype) if f2 is None else f2.expand(n, n)).index_put(
        (idx[0], idx[1]), v2
    )
    X2 = X.detach().clone().requires_grad_()
    (d @ X2).square().sum().backward()
    tol = dict(rtol=1e-4, atol=1e-4) if dtype is torch.float32 else {}
    torch.testing.assert_close(v.grad, v2.grad, **tol)
    torch.testing.assert_close(X.grad, X2.grad, **tol)
    if f is not None:
        torch.testing.assert_close(f.grad, f2.grad, **tol)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_masked_softmax_and_pointwise_gradients_keep_layout(layout, monkeypatch):
    A, v, _ = _build(layout, sparsefill.indefinite)
    e = torch.randn(A.shape[0], dtype=torch.float64, requires_grad=True)
    X = torch.randn(A.shape[1], 2, dtype=torch.float64)
    S = A * e[:, None]
    L = F.leaky_relu(S, 0.2)
    P = masked.softmax(L, 1)
    grads = {name: _capture(T) for name, T in (("S", S), ("L", L), ("P", P))}
    calls = _count_merges(monkeypatch)
    (P @ X).sum().backward()
    assert calls == []
    for name, T in (("S", S), ("L", L), ("P", P)):
        _same_indices(grads[name][0], T)
        _same_indices(grads[name][0], A)  # every one on A's own index tensors
    # exact: the dense masked computation (-inf off the pattern) at the pattern
    idx, n = _pattern()
    v2, e2 = v.detach().clone().requires_grad_(), e.detach().clone().requires_grad_()
    s = torch.full((n, n), -torch.inf, dtype=torch.float64).index_put(
        (idx[0], idx[1]), v2 * e2[idx[0]]
    )
    s = torch.where(torch.isinf(s), s, F.leaky_relu(s, 0.2))
    (torch.softmax(s, 1) @ X).sum().backward()
    torch.testing.assert_close(v.grad, v2.grad)
    torch.testing.assert_close(e.grad, e2.grad)


@pytest.mark.parametrize("fill", [0.0, 2.0, sparsefill.indefinite])
def test_pointwise_coo_beside_csr_same_pattern_no_merge(fill, monkeypatch):
    idx, n = _pattern()
    vals = torch.randn(idx.shape[1], dtype=torch.float64)
    C = sparsefill.sparse_coo_tensor(idx, vals, (n, n), fill_value=fill).to_sparse_csr()
    O = sparsefill.sparse_coo_tensor(idx, 2 * vals + 1, (n, n), fill_value=fill).coalesce()
    calls = _count_merges(monkeypatch)
    for a, b in ((C, O), (O, C)):
        r = a * b + a
        assert r._sf_layout is a._sf_layout
        fv = 0.0 if fill is sparsefill.indefinite else None
        dense = lambda T: T.to_dense(fill_value=fv) if fv is not None else T.to_dense()  # noqa: E731
        torch.testing.assert_close(dense(r), dense(a) * dense(b) + dense(a))
        if fill is sparsefill.indefinite:
            assert r._nnz() == idx.shape[1]
    assert calls == []
    # a different pattern (one stored element moved) still merges, and is right
    idx2 = idx.clone()
    idx2[1, -1] = (
        (idx2[1, -1] + 1) % n
        if (idx2[1, -1] + 1) % n not in idx[1][idx[0] == idx[0, -1]]
        else idx2[1, -1]
    )
    assert not torch.equal(idx2, idx), (
        "the fixed pattern's last row has a free column (the seed gives one)"
    )
    O2 = sparsefill.sparse_coo_tensor(idx2, 2 * vals + 1, (n, n), fill_value=fill).coalesce()
    r = C * O2 if fill is not sparsefill.indefinite else C + O2
    assert calls
    if fill is not sparsefill.indefinite:
        torch.testing.assert_close(r.to_dense(), C.to_dense() * O2.to_dense())
    else:
        assert r._nnz() == idx.shape[1] - 1  # the positions both specify


def _gat_layer(A, x, W, a_src, a_dst):
    Wh = x @ W
    S = A * (Wh @ a_dst)[:, None] + A * (Wh @ a_src)[None, :]
    return masked.softmax(F.leaky_relu(S, 0.2), 1) @ Wh


def test_gat_layer_backward_on_csr_does_not_merge(monkeypatch):
    g = torch.Generator().manual_seed(3)
    n, d = 40, 5
    keys = torch.unique(
        torch.cat([torch.randint(0, n * n, (4 * n,), generator=g), torch.arange(n) * (n + 1)])
    )
    A = sparsefill.sparse_coo_tensor(
        torch.stack([keys // n, keys % n]),
        torch.ones(keys.numel()),
        (n, n),
        fill_value=sparsefill.indefinite,
    )
    x = torch.randn(n, d, generator=g)
    params = [
        torch.randn(d, d, generator=g),
        torch.randn(d, generator=g),
        torch.randn(d, generator=g),
    ]
    grads = {}
    for layout in LAYOUTS:
        ps = [p.clone().requires_grad_() for p in params]
        adj = A.to_sparse_csr() if layout is torch.sparse_csr else A
        out = _gat_layer(adj, x, *ps)
        calls = _count_merges(monkeypatch)
        out.square().sum().backward()
        assert calls == [], layout
        grads[layout] = [p.grad for p in ps]
    for a, b in zip(*grads.values()):
        torch.testing.assert_close(a, b)


# ---------------------------------------------------------------------- the pattern cache
def _tags():
    return {k[0] if isinstance(k[0], str) else k[0][0] for k in _grouping._PATTERN_CACHE}


def test_pattern_cached_hits_misses_and_drops():
    i = torch.tensor([3, 1, 2])
    calls = []

    def f():
        calls.append(1)
        return i.sort()[1]

    a = _grouping.pattern_cached("t", (i,), f)
    assert _grouping.pattern_cached("t", (i,), f) is a and len(calls) == 1
    assert _grouping.pattern_cached("other", (i,), f) is not a  # the tag is part of the key
    i.add_(0)  # an in-place change (even one that keeps the contents) is a miss
    assert _grouping.pattern_cached("t", (i,), f) is not a and len(calls) == 3
    j = i.clone()  # equal contents, another tensor: a miss
    _grouping.pattern_cached("t", (j,), f)
    assert len(calls) == 4
    v = i[:2]  # a view of a cached tensor's memory (same start): its own key
    assert _grouping.pattern_cached("t", (v,), lambda: v.sort()[1]).tolist() == [1, 0]
    kj = ("t", _grouping._tensor_key(j)[1])
    assert kj in _grouping._PATTERN_CACHE
    del j
    gc.collect()
    assert kj not in _grouping._PATTERN_CACHE  # the entry of a dead tensor goes


def _move_last_element(A, idx, n):
    """Move A's last stored element, in place in its index tensors, to a column its row does not store
    (after the row's other elements: the pattern stays coalesced); returns False if there is none."""
    r = int(idx[0, -1])
    start = int(idx[1, -2]) + 1 if int(idx[0, -2]) == r else 0
    free = [c for c in range(start, n) if c != int(idx[1, -1])]
    if not free:
        return False
    cols = A._col if A._sf_layout is torch.sparse_csr else A._idx[1]
    cols[-1] = free[-1]
    return True


@pytest.mark.parametrize("layout", LAYOUTS)
def test_transpose_cache_not_stale_after_in_place_change(layout):
    """``P @ X`` backward: the gradient of ``X`` is ``G @ P`` (a dense-sparse product: ``_Mat.t``)."""
    idx, n = _pattern()
    own = idx.clone()
    v = torch.randn(idx.shape[1], dtype=torch.float64, requires_grad=True)
    A = sparsefill.sparse_coo_tensor(
        own, v, (n, n)
    )  # A's indices are ``own``: the same tensor every build
    if layout is torch.sparse_csr:
        A = A.to_sparse_csr()
    crow_col = (A._crow, A._col) if layout is torch.sparse_csr else None

    def check():
        B = (
            sparsefill.sparse_coo_tensor(own, v, (n, n))
            if crow_col is None
            else sparsefill.sparse_csr_tensor(*crow_col, v, (n, n))
        )
        for _ in range(2):  # the second served from the cache
            X = torch.randn(n, 3, dtype=torch.float64, requires_grad=True)
            G = torch.randn(n, 3, dtype=torch.float64)
            (B @ X).backward(G)
            torch.testing.assert_close(X.grad, B.detach().to_dense().mT @ G)

    check()
    assert "mat_t" in _tags()
    before = A.detach().to_dense()
    assert _move_last_element(A, idx, n), (
        "the fixed pattern's last row has a free column (the seed gives one)"
    )
    assert not torch.equal(A.detach().to_dense(), before)
    check()


def test_group_slices_cache_not_stale_after_in_place_change():
    idx, n = _pattern()
    vals = torch.randn(idx.shape[1], dtype=torch.float64)
    A = sparsefill.sparse_coo_tensor(idx.clone(), vals, (n, n), fill_value=0.5).coalesce()
    for _ in range(2):
        torch.testing.assert_close(A.sum(0), A.to_dense().sum(0))
    assert "group_slices" in _tags()
    before = A.to_dense()
    assert _move_last_element(A, idx, n), (
        "the fixed pattern's last row has a free column (the seed gives one)"
    )
    assert not torch.equal(A.to_dense(), before)
    torch.testing.assert_close(A.sum(0), A.to_dense().sum(0))


def test_gradient_of_e_sum_over_rows_repeated_steps():
    """``A * e[None, :]``: the gradient of ``e`` sums over dim 0 (group_slices, cached), right on every step."""
    idx, n = _pattern()
    vals = torch.randn(idx.shape[1], dtype=torch.float64)
    for layout in LAYOUTS:
        A = sparsefill.sparse_coo_tensor(idx, vals, (n, n), fill_value=sparsefill.indefinite)
        A = A.to_sparse_csr() if layout is torch.sparse_csr else A
        for _ in range(3):
            e = torch.randn(n, dtype=torch.float64, requires_grad=True)
            masked.sum(A * e[None, :], 1).square().sum().backward()
            e2 = e.detach().clone().requires_grad_()
            s = torch.zeros(n, n, dtype=torch.float64).index_put(
                (idx[0], idx[1]), vals * e2[idx[1]]
            )
            s.sum(1).square().sum().backward()
            torch.testing.assert_close(e.grad, e2.grad)


# ---------------------------------------------------------------------- gradient types follow torch's contract
def _leaf(layout, fill=1.5, dense=(), uncoalesced=False, dtype=torch.float64, seed=3):
    """``(A, dense copy)``: a SparseTensor leaf that requires grad (6 x 5, hybrid with ``dense`` dims)."""
    g = torch.Generator().manual_seed(seed)
    keys = torch.unique(torch.randint(0, 30, (9,), generator=g))
    idx = torch.stack([keys // 5, keys % 5])
    if uncoalesced:
        idx = torch.cat([idx, idx[:, :2]], 1)
    v = torch.randn((idx.shape[1],) + dense, generator=g, dtype=dtype)
    A = sparsefill.sparse_coo_tensor(idx, v, (6, 5) + dense, fill_value=fill)
    if layout is torch.sparse_csr:
        A = A.to_sparse_csr(dense_dim=len(dense))
    A = A.detach().requires_grad_()
    d = A.detach().to_dense(fill_value=0.0 if fill is sparsefill.indefinite else None)
    return A, d.clone().requires_grad_()


def _is_leaf_grad_of(grad, A):
    assert type(grad) is sparsefill.SparseTensor, type(grad)
    assert grad.layout is torch.strided and grad.sparse_layout is A.sparse_layout
    assert grad.shape == A.shape and grad.dense_dim() == A.dense_dim() and grad.dtype == A.dtype


LOSSES = {  # loss(T, w, X): the leaf's upstream gradient is dense (torch's formulas) or a SparseTensor
    "times_dense": lambda T, w, X: (T * w).sum(),
    "matmul": lambda T, w, X: (T @ X).square().sum(),
    "exp_sum": lambda T, w, X: T.exp().sum(),
    "sum_rows": lambda T, w, X: (T.sum(0) * w[0]).sum(),
    "mixed": lambda T, w, X: (T * w).sum() + T.sin().sum() + (T @ X).sum(),
}


def _leaf_cases():
    for layout in LAYOUTS:
        for loss in LOSSES:
            for kind in ("plain", "hybrid", "uncoalesced", "indefinite", "nan_fill", "float32"):
                if kind == "uncoalesced" and layout is torch.sparse_csr:  # a CSR is coalesced
                    continue
                if (
                    kind == "hybrid"
                    and loss in ("matmul", "mixed")
                    or kind == "nan_fill"
                    and loss in ("matmul", "mixed")
                ):
                    continue  # a 3-d matmul operand; NaN in every element of the gradient
                yield pytest.param(layout, loss, kind, id=f"{str(layout)[6:]}-{loss}-{kind}")


@pytest.mark.parametrize("layout,loss,kind", list(_leaf_cases()))
def test_sparse_leaf_gradient_is_a_sparse_tensor_of_its_layout(layout, loss, kind):
    """A SparseTensor leaf's ``.grad`` is a SparseTensor of its layout, shape and dense dims, equal to the
    dense computation's gradient (an indefinite leaf: at its pattern; the gradient's fill is 0)."""
    dense = (2,) if kind == "hybrid" else ()
    fill = (
        sparsefill.indefinite
        if kind == "indefinite"
        else float("nan")
        if kind == "nan_fill"
        else 1.5
    )
    dtype = torch.float32 if kind == "float32" else torch.float64
    A, d = _leaf(layout, fill, dense, kind == "uncoalesced", dtype)
    g = torch.Generator().manual_seed(4)
    w, X = (
        torch.randn((6, 5) + dense, generator=g, dtype=dtype),
        torch.randn(5, 3, generator=g, dtype=dtype),
    )
    LOSSES[loss](A, w, X).backward()
    _is_leaf_grad_of(A.grad, A)
    LOSSES[loss](d, w, X).backward()
    tol = dict(rtol=1e-4, atol=1e-4) if dtype is torch.float32 else {}
    if kind == "indefinite":  # no output reads a masked-out element: the gradient there is 0
        stored = A.detach().to_dense(fill_value=float("nan")).isnan().logical_not()
        want = torch.where(stored, d.grad, 0)
        torch.testing.assert_close(
            A.grad.to_dense(fill_value=0.0), want, **tol
        )  # (its fill: 0 or indefinite)
    else:
        torch.testing.assert_close(A.grad.to_dense(), d.grad, equal_nan=True, **tol)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_dense_leaf_gradient_is_dense(layout):
    """torch's contract for the dense operands beside a SparseTensor: their ``.grad`` is a dense tensor."""
    A, d = _leaf(layout)
    w = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    X = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    ((A * w).sum() + (A @ X).square().sum()).backward()
    w2, X2 = w.detach().clone().requires_grad_(), X.detach().clone().requires_grad_()
    ((d * w2).sum() + (d @ X2).square().sum()).backward()
    for t, t2 in ((w, w2), (X, X2)):
        assert type(t.grad) is torch.Tensor and t.grad.layout is torch.strided
        torch.testing.assert_close(t.grad, t2.grad)
    _is_leaf_grad_of(A.grad, A)


def test_uniform_dense_gradient_keeps_the_leaf_pattern():
    """A dense gradient uniform over the unspecified elements becomes the leaf's pattern with that fill, on
    the leaf's own index tensors; a varying one stores the pattern and the nonzero elements, fill 0."""
    A, d = _leaf(torch.sparse_csr)
    (A * torch.full((6, 5), 2.0, dtype=torch.float64)).sum().backward()
    _same_indices(A.grad, A)
    assert A.grad.fill_value().item() == 2.0
    B, _ = _leaf(torch.sparse_coo)
    w = torch.zeros(6, 5, dtype=torch.float64)
    w[0, 0], w[5, 4] = 3.0, -1.0
    (B * w).sum().backward()
    assert B.grad.fill_value().item() == 0.0
    keys = set(B.grad._keys().tolist())
    assert keys == set(B.detach()._keys().tolist()) | {0, 29}
    torch.testing.assert_close(B.grad.to_dense(), w)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sparse_leaf_gradient_accumulates(layout):
    """Several backward calls add up (``grad + grad``), whatever each gradient's kind: dense, a SparseTensor
    of the leaf's pattern, one of a larger pattern."""
    A, d = _leaf(layout)
    g = torch.Generator().manual_seed(5)
    w, X = (
        torch.randn(6, 5, generator=g, dtype=torch.float64),
        torch.randn(5, 3, generator=g, dtype=torch.float64),
    )
    for fn in (
        lambda T: (T * w).sum(),
        lambda T: T.exp().sum(),
        lambda T: (T @ X).sum(),
        lambda T: (T * 2).sum(),
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("error", sparsefill.DensifyWarning)  # no SparseTensor += dense
            fn(A).backward()
        fn(d).backward()
        _is_leaf_grad_of(A.grad, A)
        torch.testing.assert_close(A.grad.to_dense(), d.grad)


def test_sparse_leaf_gradient_with_a_native_sparse_operand():
    """``A * nat`` (a torch native sparse operand): the SparseTensor leaf's gradient is a SparseTensor."""
    for layout in LAYOUTS:
        A, d = _leaf(layout)
        nat = torch.sparse_coo_tensor(
            [[0, 2, 5], [1, 1, 4]], [5.0, 6.0, -1.0], (6, 5), dtype=torch.float64
        )
        (A * nat).sum().backward()
        (d * nat.to_dense()).sum().backward()
        _is_leaf_grad_of(A.grad, A)
        torch.testing.assert_close(A.grad.to_dense(), d.grad)


def test_sparse_leaf_gradient_create_graph():
    """``autograd.grad`` gives the leaf's gradient as a SparseTensor too, differentiable under ``create_graph``."""
    A, d = _leaf(torch.sparse_coo)
    w = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad((A.exp() * w).sum(), A, create_graph=True)
    _is_leaf_grad_of(g, A)
    (g.to_dense() * 2).sum().backward()
    w2 = w.detach().clone().requires_grad_()
    (g2,) = torch.autograd.grad((d.exp() * w2).sum(), d, create_graph=True)
    (g2 * 2).sum().backward()
    torch.testing.assert_close(g.to_dense(), g2)
    torch.testing.assert_close(w.grad, w2.grad)


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("opt_cls", [torch.optim.SGD, torch.optim.Adam, torch.optim.Adagrad])
def test_optimizers_step_a_sparse_parameter_with_varying_gradients(opt_cls, layout, foreach):
    """``nn.Parameter(A)`` whose gradients vary over the unspecified elements (converted from dense):
    the steps equal the dense parameter's (dense semantics), the gradient and the parameter SparseTensors."""
    A, d = _leaf(layout)
    P, D = torch.nn.Parameter(A.detach()), torch.nn.Parameter(d.detach().clone())
    kw = dict(lr=0.1, momentum=0.9) if opt_cls is torch.optim.SGD else dict(lr=0.05)
    oP, oD = opt_cls([P], foreach=foreach, **kw), opt_cls([D], foreach=foreach, **kw)
    g = torch.Generator().manual_seed(6)
    for _ in range(3):
        w, X = (
            torch.randn(6, 5, generator=g, dtype=torch.float64),
            torch.randn(5, 3, generator=g, dtype=torch.float64),
        )
        for o, T in ((oP, P), (oD, D)):
            o.zero_grad()
            ((T * w).sum() + (T @ X).square().sum()).backward()
            o.step()
        _is_leaf_grad_of(P.grad, P)
        assert type(P) is sparsefill.SparseTensor
        torch.testing.assert_close(P.detach().to_dense(), D.detach())


def test_sparse_leaf_gradient_edge_cases():
    """Batched CSR, 0-d (stored or not), 0-size and nothing-stored leaves: a SparseTensor ``.grad`` of the
    leaf's layout, equal to the dense gradient."""
    g = torch.Generator().manual_seed(7)
    idx = [[0, 0, 1, 1], [0, 1, 0, 2], [1, 0, 2, 2]]
    B = sparsefill.sparse_coo_tensor(
        idx, torch.randn(4, generator=g, dtype=torch.float64), (2, 3, 3), fill_value=1.5
    ).to_sparse_csr()
    cases = [
        (B, lambda T: (T * torch.linspace(0, 1, 18, dtype=torch.float64).view(2, 3, 3)).sum()),
        (B, lambda T: (T @ torch.ones(2, 3, 2, dtype=torch.float64)).square().sum()),
        (
            sparsefill.sparse_coo_tensor(
                torch.zeros(0, 1, dtype=torch.long), [2.0], (), fill_value=1.0
            ),
            lambda T: T * 3,
        ),
        (
            sparsefill.sparse_coo_tensor(
                torch.zeros(0, 0, dtype=torch.long), torch.zeros(0), (), fill_value=1.0
            ),
            lambda T: T * torch.tensor(3.0),
        ),
        (
            sparsefill.sparse_coo_tensor(
                torch.zeros(2, 0, dtype=torch.long), torch.zeros(0), (0, 3), fill_value=1.0
            ),
            lambda T: (T * torch.ones(0, 3)).sum(),
        ),
        (
            sparsefill.sparse_coo_tensor(
                torch.zeros(2, 0, dtype=torch.long), torch.zeros(0), (2, 3), fill_value=1.0
            ),
            lambda T: (T * torch.arange(6.0).view(2, 3)).sum(),
        ),
    ]
    for A0, fn in cases:
        A = A0.detach().requires_grad_()
        fn(A).backward()
        d = A0.detach().to_dense().requires_grad_()
        fn(d).backward()
        _is_leaf_grad_of(A.grad, A)
        torch.testing.assert_close(A.grad.to_dense(), d.grad)
