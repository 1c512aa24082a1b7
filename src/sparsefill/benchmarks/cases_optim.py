"""Sparse Adagrad on an embedding table.

A table of ``N x D`` float32 rows and a gradient on ``k`` random rows (duplicates allowed, as an
embedding lookup produces): ``sparsefill.segment.sparse_adagrad(..., mode="coalesced")`` against
``torch.optim.Adagrad`` stepping the same table with a torch sparse COO gradient (what
``nn.Embedding(sparse=True)`` gives), and against dense Adagrad on a dense gradient.  Both sparse
forms update only the touched rows; the check compares one step from the same state.  The second
size is one table of ``examples/dlrm.py`` (41k looked-up ids a step, a quarter of them repeated).
sparsefill runs one fused compiled kernel where numba is installed (coalescing, then the update of
each touched row), else torch ops (rows marked in a table of flags, ``index_add_``, in-place
update).
"""

from __future__ import annotations

import torch

from sparsefill import segment

from sparsefill.benchmarks.runner import case


def _setup(param):
    (n, d), k = param
    g = torch.Generator().manual_seed(0)
    table = torch.randn(n, d, generator=g)
    rows = torch.randint(0, n, (k,), generator=g)
    grad = torch.randn(k, d, generator=g)
    return table, rows, grad


def _check(param, out):
    ref = out["sparsefill"]
    for label, o in out.items():
        torch.testing.assert_close(o, ref, rtol=1e-5, atol=1e-6, msg=label)


@case(
    "sparse Adagrad step, embedding table",
    sizes={
        "1M x 64, 50k rows": ((1_000_000, 64), 50_000),
        "50k x 64, 41k rows (a DLRM table)": ((50_000, 64), 41_000),
    },
    quick_sizes={"100k x 64, 5k rows": ((100_000, 64), 5_000)},
    check=_check,
    tiny_sizes={"1k x 8, 50 rows": ((1_000, 8), 50)},
)
def sparse_adagrad(param):
    table, rows, grad = _setup(param)
    n, d = table.shape
    p_sf, m_sf = table.clone(), torch.zeros_like(table)

    def sf_step():
        segment.sparse_adagrad(p_sf, m_sf, rows, grad, lr=0.01, eps=1e-10, mode="coalesced")
        return p_sf

    p_t = torch.nn.Parameter(table.clone())
    opt = torch.optim.Adagrad([p_t], lr=0.01, eps=1e-10)
    sparse_grad = torch.sparse_coo_tensor(rows[None], grad, (n, d), check_invariants=False)

    def torch_step():
        p_t.grad = sparse_grad
        opt.step()
        return p_t.detach()

    p_d = torch.nn.Parameter(table.clone())
    opt_d = torch.optim.Adagrad([p_d], lr=0.01, eps=1e-10)
    dense_grad = sparse_grad.to_dense()

    def dense_step():
        p_d.grad = dense_grad
        opt_d.step()
        return p_d.detach()

    return [
        ("sparsefill", sf_step),
        ("torch.optim.Adagrad, sparse grad", torch_step),
        ("torch.optim.Adagrad, dense grad", dense_step),
    ]
