"""Training a sparse weight of fixed pattern: one step of ``SparseLinear``.

A step is forward, backward and ``torch.optim.Adam.step()`` of ``y = x @ W^T + b``, loss
``y.square().mean()``, ``W`` ``n x n`` at ``density`` (uniform random pattern, seed 0), ``x``
``(batch, n)``, float32.  The same initial weights for all:

- **sparsefill**: ``sparsefill.nn.SparseLinear`` (COO; a second case: CSR), fill 0 frozen;
- **dense nn.Linear**: the same weights in a dense ``nn.Linear`` (every element trained);
- **torch.sparse.mm, native sparse**: what a user writes by hand: ``v = nn.Parameter(values)``,
  ``W = torch.sparse_coo_tensor(indices, v, (n, n), is_coalesced=True)`` and
  ``torch.sparse.mm(W, x.T).T + b`` each step (Adam refuses a sparse gradient, hence the values
  parameter);
- **nn.Parameter(A), dense semantics**: a SparseTensor parameter, whose gradient is the dense
  ``G^T x``: its first step specifies every element (the weight is rebuilt from the sparse one
  before each call, so every call is that first step).

The check: at their first calls the losses agree (same forward) and after the first step the
weights agree at the pattern (Adam's first step is ``-lr * sign(g)`` there for all of them); later
warm-ups (a row measured again) start from states that differ by then: their losses must be finite.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

import sparsefill

from sparsefill.benchmarks.runner import case

_SIZES = {"4000x4000, 0.5%, batch 64": (4000, 0.005, 64)}
_QUICK = {"1000x1000, 0.5%, batch 64": (1000, 0.005, 64)}
_TINY = {"40x40, 10%, batch 4": (40, 0.1, 4)}
_LR = 1e-3


def _setup(param, layout=torch.sparse_coo):
    n, density, batch = param
    torch.manual_seed(0)
    lin = sparsefill.nn.SparseLinear(n, n, density=density, layout=layout)
    x = torch.randn(batch, n)
    W = lin.weight.detach().to_sparse(torch.sparse_coo)
    return lin, x, W.indices(), W.values(), lin.bias.detach()


def _at_pattern(p, idx):
    if isinstance(p, sparsefill.SparseTensor):
        p = p.detach().to_dense()
    return p.detach()[idx[0], idx[1]] if p.dim() == 2 else p.detach()


def _check(param, out):
    _, _, idx, _, _ = _setup(param)
    ref_loss, ref_w = out["sparsefill"][0], _at_pattern(out["sparsefill"][1], idx)
    first = all(f() for _, _, f in out.values())
    for label, (loss, w, _) in out.items():
        assert loss.isfinite(), label
        if not first:
            continue
        torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-6, msg=label)
        torch.testing.assert_close(_at_pattern(w, idx), ref_w, rtol=1e-4, atol=1e-6, msg=label)


def _stepper(opt, loss_fn, weight_fn):
    """``step() -> (loss, weight, first)`` where ``first()`` is True until the next call."""
    calls = []

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        opt.step()
        calls.append(None)
        n = len(calls)
        return loss.detach(), weight_fn(), lambda: n == 1 and len(calls) == 1

    return step


def _peers(param):
    """dense nn.Linear, torch.sparse.mm by hand, nn.Parameter(A)."""
    lin, x, idx, vals, bias = _setup(param)
    n = lin.in_features
    dense = torch.nn.Linear(n, n)
    with torch.no_grad():
        dense.weight.copy_(lin.weight.detach().to_dense())
        dense.bias.copy_(bias)
    opt_d = torch.optim.Adam(dense.parameters(), lr=_LR)

    v, b = torch.nn.Parameter(vals.clone()), torch.nn.Parameter(bias.clone())
    opt_n = torch.optim.Adam([v, b], lr=_LR)

    def native_loss():
        W = torch.sparse_coo_tensor(idx, v, (n, n), is_coalesced=True)
        return (torch.sparse.mm(W, x.T).T + b).square().mean()

    A0 = lin.weight.detach()
    calls = []

    def dense_semantics():  # every call: the first step of a fresh nn.Parameter(A)
        A, b2 = torch.nn.Parameter(A0.clone()), torch.nn.Parameter(bias.clone())
        opt = torch.optim.Adam([A, b2], lr=_LR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", sparsefill.DensifyWarning)
            loss, w, _ = _stepper(opt, lambda: F.linear(x, A, b2).square().mean(), lambda: A)()
        calls.append(None)
        n_call = len(calls)
        return loss, w, lambda: n_call == 1 and len(calls) == 1

    return [
        (
            "dense nn.Linear",
            _stepper(opt_d, lambda: dense(x).square().mean(), lambda: dense.weight),
        ),
        ("torch.sparse.mm, native sparse", _stepper(opt_n, native_loss, lambda: v)),
        ("nn.Parameter(A), dense semantics", dense_semantics),
    ]


def _subject(param, layout):
    lin, x, _, _, _ = _setup(param, layout)
    opt = torch.optim.Adam(lin.parameters(), lr=_LR)
    return (
        "sparsefill",
        _stepper(opt, lambda: lin(x).square().mean(), lambda: lin.sparse_weight.values),
    )


@case(
    "training step: SparseLinear, Adam",
    sizes=_SIZES,
    quick_sizes=_QUICK,
    tiny_sizes=_TINY,
    check=_check,
)
def sparse_linear_step(param):
    return [_subject(param, torch.sparse_coo)] + _peers(param)


@case(
    "training step: SparseLinear CSR, Adam",
    sizes=_SIZES,
    quick_sizes=_QUICK,
    tiny_sizes=_TINY,
    check=_check,
)
def sparse_linear_csr_step(param):
    return [_subject(param, torch.sparse_csr)] + _peers(param)[:2]
