"""Masked reductions and normalizations (``sparsefill.masked``) against ``torch.masked`` and ``torch.sparse``.

Input (fixed seed): an ``n x n`` float32 matrix with ``round(n * n * density)`` distinct random
positions specified (values ``randn``), fill 0; the mask is its pattern
(``sparsefill.masked.pattern_mask``).  Peers: ``torch.masked.<op>`` on the dense equivalent with a
dense mask (what a user of torch.masked writes), ``torch.sparse.softmax`` on the torch native COO
tensor (its unspecified elements are masked out, the same semantics), and ``torch.masked.sum`` /
``amax`` on the native COO input with a native COO mask (torch 2.13's sparse support for them).
Full size 10000x10000 at 1% (1e6 elements); ``--quick`` 2000x2000 at 1%.

Measured here on 2026-11-21 (1 thread, 5 interleaved rounds, a shared 2-core machine: other CPU ~1.3;
peak memory from the runner; input: COO 20 MB, CSR 12 MB)::

    softmax COO   7.5 ms   torch.sparse.softmax 20.7 ms (0.36x)   torch.masked dense 704 ms (93x faster)   40 MB peak
    softmax CSR   7.8 ms   torch.sparse.softmax 28.0 ms (0.28x)   torch.masked dense 731 ms (93x faster)   25 MB peak
    sum COO       2.4 ms   torch.masked on native COO 1.36 s (560x)   torch.masked dense 86 ms (36x)       24 MB peak
    amax COO      3.0 ms   torch.masked on native COO 1.97 s (660x)   torch.masked dense 111 ms (37x)      24 MB peak
"""

from __future__ import annotations

import torch

import sparsefill
from sparsefill import masked

from .runner import case

SIZES = {"10000x10000, 1%": (10000, 0.01)}
QUICK = {"2000x2000, 1%": (2000, 0.01)}
TINY = {"200x200, 5%": (200, 0.05)}


def _inputs(param):
    n, density = param
    g = torch.Generator().manual_seed(0)
    nse = round(n * n * density)
    keys = torch.randperm(n * n, generator=g)[:nse].sort().values
    idx = torch.stack([keys // n, keys % n])
    vals = torch.randn(nse, generator=g)
    A = sparsefill.sparse_coo_tensor(idx, vals, (n, n), is_coalesced=True)
    T = torch.sparse_coo_tensor(idx, vals, (n, n), is_coalesced=True, check_invariants=False)
    return A, T


def _check(param, out):
    """Every implementation agrees with the first at the masked-in (specified) elements."""
    ref = out[next(iter(out))]
    ref_d = ref.to_dense() if isinstance(ref, sparsefill.SparseTensor) else ref
    pattern = None
    for label, o in out.items():
        d = o.to_dense() if (isinstance(o, sparsefill.SparseTensor) or o.layout is not torch.strided) else o
        if d.shape != ref_d.shape:
            raise AssertionError(f"{label}: shape {tuple(d.shape)} != {tuple(ref_d.shape)}")
        if ref_d.dim() == 2:  # normalizations: compare at the pattern only
            if pattern is None:
                pattern = masked.pattern_mask(ref).to_dense() if isinstance(ref, sparsefill.SparseTensor) else None
            sel = pattern if pattern is not None else torch.ones_like(ref_d, dtype=torch.bool)
            torch.testing.assert_close(d[sel], ref_d[sel], atol=1e-5, rtol=1e-4, msg=label)
        else:
            torch.testing.assert_close(d, ref_d, atol=1e-4, rtol=1e-4, equal_nan=True, msg=label)


def _softmax_case(layout):
    def fn(param):
        A, T = _inputs(param)
        S = A if layout is torch.sparse_coo else A.to_sparse_csr()
        Ms = masked.pattern_mask(S)
        D, Md = A.to_dense(), masked.pattern_mask(A).to_dense()
        return [(f"sparsefill {'COO' if layout is torch.sparse_coo else 'CSR'}", lambda: masked.softmax(S, 1, mask=Ms)),
                ("torch.sparse.softmax (COO)", lambda: torch.sparse.softmax(T, 1)),
                ("torch.masked.softmax (dense)", lambda: torch.masked.softmax(D, 1, mask=Md))]
    return fn


case("masked softmax dim 1, COO, pattern mask", sizes=SIZES, quick_sizes=QUICK, tiny_sizes=TINY, check=_check)(
    _softmax_case(torch.sparse_coo))
case("masked softmax dim 1, CSR, pattern mask", sizes=SIZES, quick_sizes=QUICK, tiny_sizes=TINY, check=_check)(
    _softmax_case(torch.sparse_csr))


def _reduce_case(name):
    def fn(param):
        A, T = _inputs(param)
        Ms, Mt = masked.pattern_mask(A), masked.pattern_mask(T)
        D, Md = A.to_dense(), Mt.to_dense()
        op, ref = getattr(masked, name), getattr(torch.masked, name)
        return [("sparsefill COO", lambda: op(A, 1, mask=Ms)),
                (f"torch.masked.{name} (native COO)", lambda: ref(T, 1, mask=Mt)),
                (f"torch.masked.{name} (dense)", lambda: ref(D, 1, mask=Md))]
    return fn


case("masked sum dim 1, COO, pattern mask", sizes=SIZES, quick_sizes=QUICK, tiny_sizes=TINY, check=_check)(_reduce_case("sum"))
case("masked amax dim 1, COO, pattern mask", sizes=SIZES, quick_sizes=QUICK, tiny_sizes=TINY, check=_check)(_reduce_case("amax"))
