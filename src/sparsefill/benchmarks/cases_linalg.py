"""Linear algebra: ``A @ x`` with ``A`` sparse of nonzero fill ``a`` and ``x`` dense ``(n, 64)``.

sparsefill computes ``A @ x = (A - a) @ x + a * x.sum(0)`` (ops/linalg/product.py) with ``A - a`` a
torch native CSR matrix.  Peers, in the same run:

* ``torch CSR (A - a) @ x + a * x.sum(0)``: the same decomposition written by hand on a
  prebuilt native CSR tensor (the floor sparsefill's overhead is measured against);
* ``torch CSR A0 @ x`` (zero-fill equivalent, no correction): the bare native kernel;
* ``dense torch.mm``: the dense ``A`` (1.6 GB at 20000x20000 float32) times ``x``.

Inputs (fixed seed, float32): ``round(n*n*density)`` distinct random positions holding
``randn() + 3``, fill 5, CSR.  Full sizes: 20000x20000 at 1% and 0.1%; ``--quick``: 4000x4000 at 1%.

Measured (``--filter "A @ x" --threads 1``, 2-core shared machine, other processes kept ~1.5
cores busy: spreads of +-100%, treat the ratios as rough):

=================  ==========  ===============  ==============  ===============
size               sparsefill  hand-written     bare A0 @ x     dense torch.mm
=================  ==========  ===============  ==============  ===============
20000^2, 1%        79 ms       96 ms (0.83x)    81 ms (0.98x)   2.74 s (35x)
20000^2, 0.1%      14 ms       21 ms (0.69x)    14 ms (1.01x)   1.78 s (124x)
4000^2, 1% quick   1.6 ms      2.1 ms (0.74x)   1.9 ms (0.83x)  43 ms (27x)
=================  ==========  ===============  ==============  ===============

(ratio in parentheses: sparsefill time / peer time for the middle columns, peer / sparsefill for
dense).  A quieter ad-hoc run (median of 7 calls, 1 thread, 20000^2 at 1%): sparsefill CSR 47-50 ms,
sparsefill COO 54 ms, zero-fill CSR 45 ms, native ``(A - a) @ x + a * x.sum(0)`` 46 ms;
dense-on-the-left ``x.T @ A``: sparsefill 262 ms (a transposed CSR built by a counting sort, then
CSR @ dense) against torch's native ``x.T @ csr`` at 443 ms.  The hand-written peer uses
``torch.addmm`` with a CSR ``mat1``, which is no faster than ``mm`` plus an add; sparsefill's
overhead over the bare kernel is the ``values - a`` temporary (O(nse)) and the ``x.sum(0)``
correction.
"""

from __future__ import annotations

import math
import warnings

import torch

import sparsefill

from sparsefill.benchmarks.runner import case

FILL = 5.0
COLS = 64
SEED = 0


def _pattern(shape, density):
    n, k = math.prod(shape), round(math.prod(shape) * density)
    g = torch.Generator().manual_seed(SEED)
    pos = torch.randint(n, (k + k // 4 + 16,), generator=g).unique()
    pos = pos[torch.randperm(pos.numel(), generator=g)[:k]].sort().values
    idx = torch.stack(torch.unravel_index(pos, shape))
    return idx, torch.randn(k, generator=g) + 3.0


def _check(param, out):
    ref = out["torch CSR (A - a) @ x + a * x.sum(0)"]
    scale = ref.abs().max().clamp_min(1.0)
    for label, y in out.items():
        if label.startswith("torch CSR A0"):
            continue
        if not torch.allclose(y / scale, ref / scale, rtol=1e-4, atol=1e-4):
            raise AssertionError(
                f"{label} differs from the hand-written decomposition by "
                f"{float((y - ref).abs().max())} (scale {float(scale)})"
            )


@case(
    "A @ x, A CSR fill 5, x dense (n, 64)",
    sizes={"20000x20000, 1%": ((20000, 20000), 0.01), "20000x20000, 0.1%": ((20000, 20000), 0.001)},
    quick_sizes={"4000x4000, 1%": ((4000, 4000), 0.01)},
    check=_check,
    bytes=lambda p: round(math.prod(p[0]) * p[1]) * 12 + (p[0][0] + p[0][1]) * COLS * 4,
)
def spmm_fill(param):
    shape, density = param
    idx, vals = _pattern(shape, density)
    A = sparsefill.sparse_coo_tensor(idx, vals, shape, fill_value=FILL).to_sparse_csr()
    x = torch.randn(shape[1], COLS, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        # torch: "Sparse CSR tensor support is in beta state"
        warnings.simplefilter("ignore", UserWarning)
        A0 = torch.sparse_csr_tensor(A.crow_indices(), A.col_indices(), A.values() - FILL, shape)
        Az = torch.sparse_csr_tensor(A.crow_indices(), A.col_indices(), A.values(), shape)
    dense = torch.full(shape, FILL)
    dense[idx[0], idx[1]] = vals
    return [
        ("sparsefill", lambda: A @ x),
        ("torch CSR (A - a) @ x + a * x.sum(0)", lambda: torch.addmm(x.sum(0).mul_(FILL), A0, x)),
        ("torch CSR A0 @ x (zero fill, no correction)", lambda: Az @ x),
        ("dense torch.mm", lambda: torch.mm(dense, x)),
    ]


# ---------------------------------------------------------------------- a constant data matrix
def _data_matrix(shape, density, seed=SEED):
    """``(X as a SparseTensor CSR, its rows, cols, values)``: ``density * rows * cols`` uniform
    values at random positions (duplicates summed), float32, fill 0: a TF-IDF-like feature
    matrix."""
    n, k = shape
    nse = round(n * k * density)
    g = torch.Generator().manual_seed(seed)
    keys = torch.randint(n * k, (nse,), generator=g).unique()
    rows, cols = keys // k, keys % k
    vals = torch.rand(keys.numel(), generator=g)
    X = sparsefill.sparse_coo_tensor(torch.stack([rows, cols]), vals, shape, is_coalesced=True)
    return X.to_sparse_csr(), rows, cols, vals


def _logistic_step(n, predict, w):
    """One Adam step of logistic regression ``bce(predict(w), y)``: returns the loss of the first
    step it took (what the check compares: the sides take different numbers of steps, each
    moving its own ``w``)."""
    y = (torch.arange(n) % 3 == 0).float()
    opt = torch.optim.Adam([w], lr=0.01)
    first = []

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(predict(w), y)
        loss.backward()
        opt.step()
        if not first:
            first.append(loss.detach())
        return first[0]

    return step


def _first_losses_agree(param, out):
    ref = out["hand-written index_add_ step"]
    for label, y in out.items():
        if not torch.allclose(y, ref, rtol=1e-4, atol=1e-5):
            raise AssertionError(f"{label}: loss {float(y)} against the hand-written {float(ref)}")


DATA_SIZES = {"200000x50000, 0.1%": ((200_000, 50_000), 0.001)}
DATA_QUICK = {"20000x5000, 0.1%": ((20_000, 5_000), 0.001)}


@case(
    "data matrix: logistic regression step, X @ w (TF-IDF-like CSR)",
    sizes=DATA_SIZES,
    quick_sizes=DATA_QUICK,
    check=_first_losses_agree,
)
def logistic_regression(param):
    """A training step (forward, backward, Adam) of ``bce(X @ w, y)`` with a constant sparse data
    matrix ``X`` (``sparsefill.from_scipy``-like CSR, fill 0) against the same model written by hand
    with a gather and ``index_add_`` (what a user writes without a sparse library) and torch's own
    sparse CSR and COO tensors."""
    (n, k), density = param
    X, rows, cols, vals = _data_matrix((n, k), density)
    with warnings.catch_warnings():
        # torch: "Sparse CSR tensor support is in beta state"
        warnings.simplefilter("ignore", UserWarning)
        Xcsr = torch.sparse_csr_tensor(X.crow_indices(), X.col_indices(), X.values(), (n, k))
    Xcoo = torch.sparse_coo_tensor(torch.stack([rows, cols]), vals, (n, k)).coalesce()

    def hand(w):
        return torch.zeros(n).index_add_(0, rows, vals * w[cols])

    w = [torch.zeros(k, requires_grad=True) for _ in range(4)]
    return [
        ("sparsefill", _logistic_step(n, lambda w: X @ w, w[0])),
        ("hand-written index_add_ step", _logistic_step(n, hand, w[1])),
        ("torch native CSR", _logistic_step(n, lambda w: Xcsr @ w, w[2])),
        (
            "torch native COO",
            _logistic_step(n, lambda w: torch.sparse.mm(Xcoo, w[:, None])[:, 0], w[3]),
        ),
    ]


def _grads_agree(param, out):
    ref = out["hand-written gather + index_add_"]
    scale = ref.abs().max().clamp_min(1.0)
    for label, g in out.items():
        if not torch.allclose(g / scale, ref / scale, rtol=1e-4, atol=1e-4):
            raise AssertionError(f"{label}: gradient differs by {float((g - ref).abs().max())}")


@case(
    "data matrix: X @ W forward + backward, W (cols, 64)",
    sizes=DATA_SIZES,
    quick_sizes=DATA_QUICK,
    check=_grads_agree,
)
def data_matrix_mm(param):
    """``Y = X @ W`` and ``dL/dW = X^T @ G`` for a constant sparse ``X`` and a dense ``W`` that
    needs a gradient (a linear layer over sparse features), against a gather + ``index_add_`` by
    hand."""
    (n, k), density = param
    X, rows, cols, vals = _data_matrix((n, k), density)
    W = torch.randn(k, COLS, generator=torch.Generator().manual_seed(1), requires_grad=True)
    G = torch.randn(n, COLS, generator=torch.Generator().manual_seed(2))

    def grad_of(product):
        def run():
            W.grad = None
            product().backward(G)
            return W.grad

        return run

    hand = grad_of(lambda: torch.zeros(n, COLS).index_add_(0, rows, vals[:, None] * W[cols]))
    return [("sparsefill", grad_of(lambda: X @ W)), ("hand-written gather + index_add_", hand)]


def _same_distances(param, out):
    ref = out["hand-written norms + torch.sparse.mm"]
    for label, d in out.items():
        torch.testing.assert_close(d, ref, rtol=1e-3, atol=1e-3, msg=lambda m: f"{label}: {m}")


@case(
    "data matrix: torch.cdist(X, C), 16 centroids (k-means assignment)",
    sizes=DATA_SIZES,
    quick_sizes=DATA_QUICK,
    check=_same_distances,
)
def data_matrix_cdist(param):
    """The distances of every row of a constant sparse ``X`` to 16 dense centroids (a k-means
    assignment step: ``torch.cdist(X, C)``, the matrix product form, ``ops/linalg/distance.py``)
    against the same written by hand on torch's native CSR (``|x|² + |c|² - 2 X C^T`` with
    ``torch.sparse.mm``).  Dense ``torch.cdist`` would need ``X``'s 40 GB dense form at the full
    size."""
    (n, k), density = param
    X, rows, cols, vals = _data_matrix((n, k), density)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (torch: CSR support is in beta)
        Xcsr = torch.sparse_csr_tensor(X.crow_indices(), X.col_indices(), X.values(), (n, k))
    C = torch.randn(16, k, generator=torch.Generator().manual_seed(3))
    sq = torch.zeros(n).index_add_(0, rows, vals * vals)[:, None]

    def hand():
        d2 = sq + (C * C).sum(1) - 2 * torch.sparse.mm(Xcsr, C.T)
        return d2.clamp_min_(1e-30).sqrt_()

    return [
        ("sparsefill", lambda: torch.cdist(X, C)),
        ("hand-written norms + torch.sparse.mm", hand),
    ]
