"""Sparse attention: a sliding window (``|i - j| <= window``) plus global tokens (the first
``globals`` rows and columns), 4 heads, head dim 64, float32; ``q, k, v`` ``(1, 4, L, 64)`` random
(seed 0).  sparsefill is ``F.scaled_dot_product_attention(q, k, v, attn_mask=A)`` with ``A`` the
pattern as a bool CSR SparseTensor (``ops/linalg/attention.py``: one fused pass per row block over
the stored scores, a backward that recomputes them).  Peers:

- ``dense SDPA, bool mask``: the same call with the dense ``L x L`` bool mask (torch's fused CPU
  kernel, which reads every pair);
- ``sparsefill composite``: the three-step form, per head,
  ``masked.softmax(torch.sparse.sampled_addmm(A, q, k^T, alpha=scale), 1) @ v`` with ``A`` an
  indefinite-fill CSR SparseTensor;
- ``torch native sparse``: per head, ``torch.sparse.sampled_addmm`` on a native CSR mask,
  ``torch.sparse.softmax`` (on its COO form), ``torch.sparse.mm``;
- ``flex_attention compiled``: ``torch.compile(flex_attention)`` with the pattern as a
  ``create_block_mask`` block mask, peer of sparsefill under ``torch.compile(fullgraph=True)``
  (forward only: torch's flex attention raises for a backward on CPU; not at the test suite's sizes:
  its compilation takes tens of seconds).

``sparse attention forward + backward``: the output and the gradients of ``q, k, v`` for a fixed
upstream gradient; ``sparse attention forward``: the output, under ``torch.no_grad()``; the
``compiled`` cases: the same with sparsefill's call compiled (inductor, ``fullgraph=True``: the op
``sparsefill::sparse_attention`` and its backward in one graph; ``aot_eager`` at the test suite's
sizes), with the eager call as a peer.  Full sizes ``L`` = 4096, 8192 (window ``|i - j| <= 256``,
16 global tokens; the forward also 16384); ``--quick`` ``L`` = 1024.

Measured figures: docs/performance/notes.md ("Sparse attention") and README.md in this folder.
"""

from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F

import sparsefill
from sparsefill import masked

from sparsefill.benchmarks.runner import case, skipped

HEADS, DIM = 4, 64
SIZES = {
    "L 4096, window 256 + 16 global": (4096, 256, 16),
    "L 8192, window 256 + 16 global": (8192, 256, 16),
}
# the forward also where the dense mask and scores outgrow a cache many times over
FORWARD_SIZES = {**SIZES, "L 16384, window 256 + 16 global": (16384, 256, 16)}
QUICK = {"L 1024, window 256 + 16 global": (1024, 256, 16)}
TINY = {"L 96, window 8 + 2 global": (96, 8, 2)}


@functools.lru_cache(maxsize=1)
def _inputs(param):
    """``(keep, q, k, v, grad)``: the dense bool pattern and the float32 inputs."""
    L, window, globals_ = param
    i = torch.arange(L)
    keep = ((i[:, None] - i[None]).abs() <= window) | (i[:, None] < globals_) | (i[None] < globals_)
    g = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(1, HEADS, L, DIM, generator=g) for _ in range(4))
    return keep, q, k, v, grad


def _sparse_masks(keep):
    """``(bool CSR SparseTensor, indefinite CSR SparseTensor, native CSR)`` of ``keep``."""
    crow = torch._convert_indices_from_coo_to_csr(keep.nonzero()[:, 0], keep.shape[0])
    col = keep.nonzero()[:, 1]
    n = col.numel()
    A = sparsefill.sparse_csr_tensor(crow, col, torch.ones(n, dtype=torch.bool), keep.shape)
    S = sparsefill.sparse_csr_tensor(
        crow, col, torch.zeros(n), keep.shape, fill_value=sparsefill.indefinite
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Sparse CSR tensor support is in beta"
        N = torch.sparse_csr_tensor(crow, col, torch.zeros(n), keep.shape, check_invariants=False)
    return A, S, N


def _composite(S, q, k, v):
    """sparsefill's three steps, per head."""
    scale = q.shape[-1] ** -0.5
    outs = [
        masked.softmax(torch.sparse.sampled_addmm(S, qh, kh.t(), alpha=scale), 1) @ vh
        for qh, kh, vh in zip(q[0], k[0], v[0])
    ]
    return torch.stack(outs)[None]


def _native(N, q, k, v):
    """torch's native sparse steps, per head."""
    scale = q.shape[-1] ** -0.5
    outs = []
    for qh, kh, vh in zip(q[0], k[0], v[0]):
        P = torch.sparse.softmax(
            torch.sparse.sampled_addmm(N, qh, kh.t(), alpha=scale).to_sparse_coo(), 1
        )
        outs.append(torch.sparse.mm(P, vh))
    return torch.stack(outs)[None]


def _fwd_bwd(attend, q, k, v, grad):
    """``attend(q, k, v)`` and the gradients of q, k, v for ``grad``."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = attend(*leaves)
    return (out.detach(), *torch.autograd.grad(out, leaves, grad))


def _check(param, out):
    ref = out["sparsefill"]
    ref = ref if isinstance(ref, tuple) else (ref,)
    for label, o in out.items():
        for a, b in zip(o if isinstance(o, tuple) else (o,), ref):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m: f"{label}: {m}")


def _attends(param):
    """``{label: attend(q, k, v)}`` of sparsefill and the peers that have a backward."""
    keep, *_ = _inputs(param)
    A, S, N = _sparse_masks(keep)
    dense = keep[None, None]
    return {
        "sparsefill": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=A),
        "dense SDPA, bool mask": lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, attn_mask=dense
        ),
        "sparsefill composite (sampled_addmm, masked.softmax, @)": functools.partial(_composite, S),
        "torch native sparse (sampled_addmm, sparse.softmax, sparse.mm)": functools.partial(
            _native, N
        ),
    }


@case(
    "sparse attention forward + backward, 4 heads, d 64",
    sizes=SIZES,
    quick_sizes=QUICK,
    tiny_sizes=TINY,
    check=_check,
)
def attention_fwd_bwd(param):
    _, q, k, v, grad = _inputs(param)
    return [
        (label, functools.partial(_fwd_bwd, attend, q, k, v, grad))
        for label, attend in _attends(param).items()
    ]


def _flex_compiled(param):
    """``flex(q, k, v)``: compiled flex attention with the pattern as a block mask (compiled as its
    documentation says: ``torch.compile(flex_attention)``), or None where it is missing."""
    L, window, globals_ = param
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None

    def mask_mod(b, h, qi, ki):
        return ((qi - ki).abs() <= window) | (qi < globals_) | (ki < globals_)

    block_mask = create_block_mask(mask_mod, None, None, L, L, device="cpu")
    compiled = torch.compile(flex_attention)
    return lambda q, k, v: compiled(q, k, v, block_mask=block_mask)


def _sparsefill_compiled(param):
    """``attend(q, k, v)``: sparsefill's call under ``torch.compile(fullgraph=True)`` (inductor;
    at the test suite's sizes ``aot_eager``: seconds, not tens): one graph, the op
    ``sparsefill::sparse_attention`` and its backward in it."""
    keep, *_ = _inputs(param)
    A, _, _ = _sparse_masks(keep)
    return torch.compile(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=A),
        fullgraph=True,
        backend="inductor" if _full(param) else "aot_eager",
    )


def _full(param) -> bool:
    """Not a test suite's size (where the compiled peers would take tens of seconds)."""
    return param[0] >= 512


def _no_grad(attend, q, k, v):
    def forward():
        with torch.no_grad():
            return attend(q, k, v)

    return forward


@case(
    "sparse attention forward, 4 heads, d 64",
    sizes=FORWARD_SIZES,
    quick_sizes=QUICK,
    tiny_sizes=TINY,
    check=_check,
)
def attention_fwd(param):
    _, q, k, v, _ = _inputs(param)
    return [(label, _no_grad(attend, q, k, v)) for label, attend in _attends(param).items()]


@case(
    "sparse attention compiled forward, 4 heads, d 64",
    sizes=SIZES,
    quick_sizes=QUICK,
    tiny_sizes=TINY,
    check=_check,
)
def attention_compiled_fwd(param):
    _, q, k, v, _ = _inputs(param)
    flex = _flex_compiled(param) if _full(param) else None
    return [
        ("sparsefill", _no_grad(_sparsefill_compiled(param), q, k, v)),
        ("sparsefill eager", _no_grad(_attends(param)["sparsefill"], q, k, v)),
        skipped("flex_attention compiled", "not at the test sizes, or missing")
        if flex is None
        else ("flex_attention compiled", _no_grad(flex, q, k, v)),
    ]


@case(
    "sparse attention compiled forward + backward, 4 heads, d 64",
    sizes=SIZES,
    quick_sizes=QUICK,
    tiny_sizes=TINY,
    check=_check,
)
def attention_compiled_fwd_bwd(param):
    _, q, k, v, grad = _inputs(param)
    return [
        ("sparsefill", functools.partial(_fwd_bwd, _sparsefill_compiled(param), q, k, v, grad)),
        (
            "sparsefill eager",
            functools.partial(_fwd_bwd, _attends(param)["sparsefill"], q, k, v, grad),
        ),
        # (torch's flex_attention raises NotImplementedError for a backward on CPU)
        skipped("flex_attention compiled", "no backward on CPU in torch's flex_attention"),
    ]
