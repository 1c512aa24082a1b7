"""``F.scaled_dot_product_attention(q, k, v, attn_mask=A)`` with a SparseTensor mask (the fused
tiles of ``ops/linalg/attention.py``): forward and gradients equal torch's on the dense mask and the
composite ``masked.softmax(sampled_addmm(A, q, k^T)) @ v``, for bool, float and indefinite masks,
COO and CSR, float32 and float64, rows with no allowed pair, rectangular and empty patterns."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import sparsefill
from sparsefill import masked
from sparsefill.ops.linalg import attention


def _band(L, S, window=3, globals_=2, empty_row=None):
    """Band of half-width ``window`` plus ``globals_`` global tokens (rows and columns)."""
    i, j = torch.arange(L)[:, None], torch.arange(S)[None]
    keep = ((i - j).abs() <= window) | (i < globals_) | (j < globals_)
    if empty_row is not None:
        keep[empty_row] = False
    return keep


def _mask(keep, kind, layout, dtype):
    """``keep`` as a SparseTensor: ``bool`` (stored True, fill False), ``indefinite`` (stored 0.),
    ``float`` (stored random biases, fill -inf)."""
    idx = keep.nonzero().t()
    n = idx.shape[1]
    if kind == "bool":
        A = sparsefill.sparse_coo_tensor(idx, torch.ones(n, dtype=torch.bool), keep.shape)
    elif kind == "indefinite":
        A = sparsefill.sparse_coo_tensor(
            idx, torch.zeros(n, dtype=dtype), keep.shape, fill_value=sparsefill.indefinite
        )
    else:
        g = torch.Generator().manual_seed(3)
        vals = torch.randn(n, generator=g, dtype=dtype)
        A = sparsefill.sparse_coo_tensor(idx, vals, keep.shape, fill_value=-math.inf)
    return A.to_sparse_csr() if layout == "csr" else A


def _dense_mask(A, kind):
    return A.to_dense(fill_value=False) if kind == "bool" else A.to_dense(fill_value=-math.inf)


def _qkv(lead, L, S, E, Ev, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = ((*lead, L, E), (*lead, S, E), (*lead, S, Ev))
    return [torch.randn(s, generator=g, dtype=dtype).requires_grad_() for s in shapes]


def _check(A, dense_mask, q, k, v, **kw):
    """Forward and the gradients of q, k, v against torch's SDPA on the dense mask."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=A, **kw)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask, **kw)
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(a, b)
    return out


@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["bool", "indefinite", "float"])
def test_sdpa_sparse_mask_matches_dense(layout, dtype, kind, monkeypatch):
    monkeypatch.setattr(attention, "ROWS", 16)  # several row blocks at a small size
    keep = _band(70, 90, empty_row=20)  # (row 20: no allowed pair, output and gradients 0)
    A = _mask(keep, kind, layout, dtype)
    q, k, v = _qkv((2, 3), 70, 90, 8, 5, dtype)
    out = _check(A, _dense_mask(A, kind), q, k, v)
    assert not out[:, :, 20].any() and torch.isfinite(out).all()


@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_sdpa_scattered_mask(layout, kind):
    """A scattered pattern (every tile spans most columns): the same values and gradients, rows with
    no allowed pair included."""
    g = torch.Generator().manual_seed(5)
    keep = torch.rand(60, 50, generator=g) < 0.05
    keep[4] = False
    A = _mask(keep, kind, layout, torch.float64)
    q, k, v = _qkv((2,), 60, 50, 4, 3, torch.float64)
    out = _check(A, _dense_mask(A, kind), q, k, v)
    assert not out[:, 4].any()


@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize("kind", ["bool", "indefinite"])
def test_sdpa_per_head_masks(layout, kind):
    """A mask ``(H, L, S)``, one pattern per head (shifted bands; row 5 empty in every head) or one
    for all (``H`` 1), broadcast over the batch: each head's tiles, cached with the pattern."""
    band = _band(40, 30, window=2, globals_=0)
    band[5] = False
    keep = torch.stack([torch.roll(band, 3 * h, 1) for h in range(3)])
    for mask in (keep, keep[:1]):
        A = _mask(mask, kind, layout, torch.float64)
        q, k, v = _qkv((2, 3), 40, 30, 4, 3, torch.float64)
        out = _check(A, _dense_mask(A, kind), q, k, v)
        assert not out[..., 5, :].any()
        assert attention._slices(A) is attention._slices(A)


def test_sdpa_mask_view_sees_writes_to_its_base():
    """A mask that is a view (``B[1:]``, ``(H, L, S)`` or ``(L, S)``) of a mask written in place
    after a first call: the attention reads the written values and fill (no stale slices)."""
    keep = torch.stack([torch.roll(_band(8, 6, window=1, globals_=0), h, 1) for h in range(3)])
    for mask, pick in ((keep, lambda B: B[1:]), (keep[0], lambda B: B[:, :])):
        q, k, v = _qkv((2, 2) if mask.dim() == 3 else (2,), 8, 6, 4, 3, torch.float64)
        for write in (lambda B: B.mul_(3.0), lambda B: B.clamp_(min=-1.0)):
            B = _mask(mask, "float", "coo", torch.float64)
            V = pick(B)
            F.scaled_dot_product_attention(q, k, v, attn_mask=V)
            write(B)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=V)  # (before V is read)
            ref = F.scaled_dot_product_attention(q, k, v, attn_mask=V.to_dense())
            torch.testing.assert_close(out, ref)


def test_sdpa_mask_made_in_inference_mode():
    """A mask of inference tensors (no version counters to key a cached plan on): computed, and a
    write to it in place is seen."""
    keep = _band(8, 6, window=1, globals_=0)
    q, k, v = (t.detach() for t in _qkv((2,), 8, 6, 4, 3, torch.float64))
    with torch.inference_mode():
        A = _mask(keep, "bool", "coo", torch.float64)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=A), ref)
        A._vals[:3] = False
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=A)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=A.to_dense())
        torch.testing.assert_close(out, ref)


def test_sdpa_sparse_mask_matches_composite():
    """The user's composite (scores at the pattern, masked softmax, product) gives the same."""
    keep = _band(40, 40, empty_row=5)
    A = _mask(keep, "indefinite", "csr", torch.float64)
    q, k, v = _qkv((), 40, 40, 6, 6, torch.float64)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=A, scale=0.3)
    P = masked.softmax(torch.sparse.sampled_addmm(A, q, k.t(), alpha=0.3), 1)
    comp = P @ v
    torch.testing.assert_close(out, comp)
    g = torch.randn_like(out)
    for a, b in zip(
        torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(comp, (q, k, v), g)
    ):
        torch.testing.assert_close(a, b)


def test_sdpa_sparse_mask_stored_false_and_duplicates():
    """Stored False elements are masked out; an uncoalesced bool mask's duplicates are one pair."""
    keep = _band(30, 30)
    idx = keep.nonzero().t()
    vals = torch.rand(idx.shape[1], generator=torch.Generator().manual_seed(1)) < 0.7
    idx2 = torch.cat([idx, idx[:, :50]], 1)
    vals2 = torch.cat([vals, vals[:50]])
    A = sparsefill.sparse_coo_tensor(idx2, vals2, keep.shape)
    assert not A.is_coalesced()
    q, k, v = _qkv((2,), 30, 30, 4, 4, torch.float64)
    _check(A, A.to_dense(), q, k, v)


def test_sdpa_sparse_mask_nan_and_inf_bias():
    """A NaN stored bias makes its row NaN, a row of -inf biases gives 0, as the dense mask does."""
    keep = _band(20, 20)
    A = _mask(keep, "float", "coo", torch.float64)
    vals = A._values().clone()
    rows = A._indices()[0]
    vals[rows == 3] = -math.inf
    vals[(rows == 7).nonzero()[0]] = math.nan
    A = sparsefill.sparse_coo_tensor(A._indices(), vals, (20, 20), fill_value=-math.inf)
    q, k, v = _qkv((2,), 20, 20, 4, 4, torch.float64)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=A)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=A.to_dense())
    torch.testing.assert_close(out, ref, equal_nan=True)
    assert out[:, 7].isnan().all() and not out[:, 3].any()


def test_sdpa_sparse_mask_empty_pattern_and_zero_size():
    q, k, v = _qkv((2,), 9, 7, 4, 3, torch.float64)
    A = sparsefill.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.long), [], (9, 7))
    A = A.bool()
    out = _check(A, A.to_dense(), q, k, v)
    assert not out.any()
    q, k, v = _qkv((2,), 0, 7, 4, 3, torch.float64)
    A = sparsefill.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.long), [], (0, 7)).bool()
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=A)
    assert out.shape == (2, 0, 3)


def test_sdpa_sparse_mask_scale_no_grad_and_tile_cache(monkeypatch):
    monkeypatch.setattr(attention, "ROWS", 8)
    keep = _band(33, 33, window=2, globals_=1)
    A = _mask(keep, "bool", "csr", torch.float32)
    q, k, v = _qkv((3,), 33, 33, 4, 4, torch.float32)
    _check(A, keep, q, k, v, scale=0.7)
    with torch.no_grad():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=A)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=keep))
    assert attention.tiles_of(A, torch.float32) is attention.tiles_of(A, torch.float32)
    T = attention.tiles_of(A, torch.float32)
    assert sum(b.numel() for b in T.bias) < keep.numel()  # tiles, not the dense scores


def test_sdpa_sparse_mask_declined_forms_keep_dense_semantics():
    """Forms the tiles do not compute (a mask whose unspecified elements take part, dropout of
    0 given) keep torch's result on the dense mask; torch's errors stay torch's."""
    keep = _band(12, 12)
    idx = keep.nonzero().t()
    q, k, v = _qkv((2,), 12, 12, 4, 4, torch.float64)
    A = sparsefill.sparse_coo_tensor(idx, torch.randn(idx.shape[1], dtype=torch.float64), (12, 12))
    _check(A, A.to_dense(), q, k, v)  # fill 0: every pair takes part (a dense bias)
    B = _mask(keep, "bool", "coo", torch.float64)
    _check(B, keep, q, k, v, dropout_p=0.0, is_causal=False)
    with pytest.raises(RuntimeError, match="attn_mask"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=B, is_causal=True)
    C = _mask(keep, "float", "csr", torch.float32)  # (a float32 mask for float64 q: torch casts)
    _check(C, _dense_mask(C, "float"), q, k, v)


def _compiled_sdpa(fullgraph=True):
    """SDPA with the mask an argument, compiled (aot_eager: the graph AOTAutograd traces, in
    seconds), and its compile counter."""
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    fn = torch.compile(
        lambda q, k, v, A: F.scaled_dot_product_attention(q, k, v, attn_mask=A),
        backend=counter,
        fullgraph=fullgraph,
    )
    return fn, counter


def _not_rebuilt(*args):
    raise AssertionError("the tiles of a cached pattern were built again")


@pytest.mark.parametrize(
    "layout, kind", [("csr", "bool"), ("coo", "float"), ("coo", "indefinite"), ("csr", "fill 0")]
)
def test_sdpa_sparse_mask_compiles_fullgraph(layout, kind, monkeypatch):
    """Under ``torch.compile(fullgraph=True)`` the call is the op ``sparsefill::sparse_attention``
    (its backward another): one graph, no recompile over two steps, the eager values and gradients
    (those of torch's SDPA on the dense mask).  A mask whose unspecified pairs take part (fill 0:
    its fill is not read while traced) is computed densely at run time, as eagerly."""
    import torch._dynamo.testing  # noqa: F401  (CompileCounterWithBackend)

    monkeypatch.setattr(attention, "ROWS", 8)  # several row blocks
    keep = _band(40, 40, window=2, globals_=1, empty_row=6)
    if kind == "fill 0":
        idx = keep.nonzero().t()
        vals = torch.randn(idx.shape[1], generator=torch.Generator().manual_seed(2))
        A = sparsefill.sparse_coo_tensor(idx, vals, keep.shape).to_sparse_csr()
        dense = A.to_dense()
    else:
        A = _mask(keep, kind, layout, torch.float32)
        dense = _dense_mask(A, kind)
    fn, counter = _compiled_sdpa()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sparsefill.DensifyWarning)  # (fill 0's dense reference)
        for step in range(2):
            if step == 1 and kind != "fill 0":  # the second step finds the first's tiles cached
                monkeypatch.setattr(attention, "_tiles", _not_rebuilt)
            with torch._dynamo.config.patch(error_on_recompile=step == 1):
                q, k, v = _qkv((2, 3), 40, 40, 4, 4, torch.float32, seed=step)
                out = fn(q, k, v, A)
            eager = F.scaled_dot_product_attention(q, k, v, attn_mask=A)
            ref = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
            torch.testing.assert_close(out, eager)
            torch.testing.assert_close(out, ref)
            g = torch.randn_like(out)
            grads = [torch.autograd.grad(o, (q, k, v), g) for o in (out, eager, ref)]
            torch.testing.assert_close(grads[0], grads[1])
            torch.testing.assert_close(grads[0], grads[2])
    assert counter.frame_count == 1


def test_sdpa_compiled_mask_of_fill_0_asks_the_densify_policy():
    """Under torch.compile the fill is read at run time inside the op: a mask whose unspecified
    pairs take part (the dense scores plus a bias: dense by nature) asks the densify policy there,
    as the eager call's dense handlers do."""
    import torch._dynamo.testing  # noqa: F401  (CompileCounterWithBackend)

    keep = _band(12, 12, window=1, globals_=1)
    idx = keep.nonzero().t()
    A = sparsefill.sparse_coo_tensor(idx, torch.ones(idx.shape[1]), keep.shape).to_sparse_csr()
    q, k, v = _qkv((2,), 12, 12, 4, 4, torch.float32)
    fn, _ = _compiled_sdpa()
    with sparsefill.densify_policy(dense_by_nature="raise"), pytest.raises(sparsefill.DensifyError):
        fn(q, k, v, A)
    with sparsefill.densify_policy(dense_by_nature="raise"), pytest.raises(sparsefill.DensifyError):
        F.scaled_dot_product_attention(q, k, v, attn_mask=A)


def test_sdpa_mask_dtype_checked_as_torch_checks_it():
    """A float mask must be float32 or the query's dtype (torch's rule and message); nothing is
    computed otherwise."""
    A = _mask(_band(8, 8), "float", "coo", torch.float64)
    q, k, v = _qkv((2,), 8, 8, 4, 4, torch.float32)
    with pytest.raises(RuntimeError, match="attn_mask dtype to be bool or float"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=A)
    with pytest.raises(RuntimeError, match="attn_mask dtype to be bool or float"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=A.to_dense())


def test_sdpa_per_head_mask_under_torch_compile():
    """A mask ``(H, L, S)`` (its per-head patterns split by its data) is a graph break: the call
    runs eagerly through the tiles, the eager values and gradients."""
    band = _band(24, 24, window=2, globals_=1)
    A = _mask(torch.stack([band, torch.roll(band, 2, 1)]), "indefinite", "csr", torch.float32)
    q, k, v = _qkv((2,), 24, 24, 4, 4, torch.float32)
    fn, _ = _compiled_sdpa(fullgraph=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        out = fn(q, k, v, A)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=_dense_mask(A, "indefinite"))
    torch.testing.assert_close(out, ref)
    for a, b in zip(
        torch.autograd.grad(out.sum(), (q, k, v)), torch.autograd.grad(ref.sum(), (q, k, v))
    ):
        torch.testing.assert_close(a, b)


def test_sparse_attention_opcheck():
    """``torch.library.opcheck`` of ``sparsefill::sparse_attention`` (schema, autograd
    registration, the fake implementation against the real one, AOT dispatch with dynamic sizes),
    on a CSR and an uncoalesced COO pattern."""
    attention._ops()
    keep = _band(12, 10, window=1, globals_=1)
    idx = keep.nonzero().t()
    n = idx.shape[1]
    q, k, v = _qkv((2,), 12, 10, 4, 3, torch.float64)
    crow = torch._convert_indices_from_coo_to_csr(idx[0], 12)
    bias = torch.randn(n, dtype=torch.float64)
    fill = torch.tensor(-math.inf, dtype=torch.float64)
    dup = torch.cat([idx, idx[:, :5]], 1)
    for parts, vals, coalesced in (
        ((None, crow, idx[1]), bias, True),
        ((dup, None, None), torch.ones(n + 5, dtype=torch.bool), False),
    ):
        args = (q, k, v, *parts, vals, fill if vals.is_floating_point() else torch.tensor(False))
        torch.library.opcheck(
            torch.ops.sparsefill.sparse_attention.default,
            (*args, False, coalesced, 0.5),
            test_utils=(
                "test_schema",
                "test_autograd_registration",
                "test_faketensor",
                "test_aot_dispatch_dynamic",
            ),
        )
