"""Sparse attention: ``F.scaled_dot_product_attention(q, k, v, attn_mask=A)`` with ``A`` a 2-D
SparseTensor ``(L, S)`` whose unspecified elements are masked out (an indefinite fill, a bool fill
``False`` or a float fill ``-inf``), broadcast over the leading dims of ``q``, ``k``, ``v``
``(..., L, E)``, ``(..., S, E)``, ``(..., S, Ev)`` (or ``(H, L, S)``: one pattern per entry of dim
-3, the heads)::

    out = softmax(scale * q @ k^T + bias) @ v     bias[i, j] = 0 (True) or the stored float value
                                                  at a stored (i, j), -inf elsewhere

what torch's SDPA computes on the dense mask ``A.to_dense(fill_value=-inf / False)`` (rows with no
allowed element give 0, as torch's CPU kernel and ``masked.softmax(S) @ v`` do), and what
``masked.softmax(torch.sparse.sampled_addmm(A, q, k^T, alpha=scale), -1) @ v`` computes, in one
pass per block of rows: the block's scores only at the columns its rows store (a dense tile
``rows x stored columns`` with the bias, one batched product), its row softmax and the product with
``v``'s rows at those columns.  The backward recomputes each tile (as flash attention does): time
O(sum of tile areas x E), memory O(largest tile) above the inputs' and outputs' -- never the dense
``L x S`` scores, never ``nse``-sized intermediates kept between forward and backward.

The tiles (columns and bias of each row block) are computed once per pattern and cached with it;
the rows per block are chosen per pattern and batch (:func:`block_rows`).  Their area is close to
``nse`` for band, block and global-token patterns (a window of ``w`` around the diagonal: ``rows x
(w + rows)``); for a scattered pattern each tile spans most columns and the work approaches the
dense attention's (the memory stays one tile).

The computation is one ``torch.library`` custom op on the mask's inner tensors,
``sparsefill::sparse_attention`` (its backward ``sparsefill::sparse_attention_backward``), called
eagerly and recorded by ``torch.compile`` alike (``fullgraph=True``; the output's sizes are
``q``'s and ``v``'s, so the fake implementation reads no data, and a new pattern of the same
shape reuses the graph); at run time the op reads the pattern and finds its tiles in the cache.  A
mask ``(H, L, S)`` with one pattern per head is a graph break (the call runs eagerly).  Other forms
(dropout, ``is_causal``, GQA, a mask with other batch dims, dense dims or a gradient, eagerly a mask
whose unspecified pairs take part) decline: dense semantics through the other handlers, under the
densify policy.

>>> import torch, sparsefill, torch.nn.functional as F
>>> i = torch.arange(6)
>>> keep = (i[:, None] - i[None]).abs() <= 1                       # a band of width 3
>>> idx = keep.nonzero().t()
>>> A = sparsefill.sparse_coo_tensor(idx, torch.ones(idx.shape[1], dtype=torch.bool), (6, 6))
>>> q, k, v = torch.randn(3, 2, 6, 4).unbind(0)
>>> torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=A),
...                            F.scaled_dot_product_attention(q, k, v, attn_mask=keep))
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from sparsefill._kernels.grouping import pattern_cached, storage_cached
from sparsefill._kernels.trace import traced
from sparsefill._tensor.parts import coalesced_parts
from sparsefill._tensor.policy import check_densify
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops.autograd_routes import register_route

ROWS = None  # rows per block; None: chosen per pattern and batch (block_rows)
CANDIDATES = (16, 32, 64, 128, 256)  # (each a multiple of the one before: _areas)
BLOCK_COST = 1_000_000  # a block's fixed cost (~12 torch calls) in multiply-adds of tile work


class _Tiles:
    """The row blocks of a 2-D pattern: for block ``b`` (rows ``starts[b]:starts[b+1]``) the sorted
    stored columns ``cols[b]``, the bias ``bias[b]`` (rows x columns: the stored value, -inf at the
    pairs not stored) and ``empty[b]`` (local rows with no allowed pair, or None)."""

    __slots__ = ("starts", "cols", "bias", "empty")

    def __init__(self, starts, cols, bias, empty):
        self.starts, self.cols, self.bias, self.empty = starts, cols, bias, empty


def _tiles(crow: torch.Tensor, col: torch.Tensor, bias: torch.Tensor, rows: int) -> _Tiles:
    """The tiles of the CSR pattern ``(crow, col)`` with ``bias`` the value of each stored element
    (``-inf``: masked out), ``rows`` rows per block."""
    L = crow.numel() - 1
    counts = crow.diff()
    starts = list(range(0, L, rows)) + [L]
    cols, biases, empties = [], [], []
    for r0, r1 in zip(starts[:-1], starts[1:]):
        s, e = int(crow[r0]), int(crow[r1])
        c = col[s:e]
        local = torch.repeat_interleave(
            torch.arange(r1 - r0, device=col.device), counts[r0:r1], output_size=e - s
        )
        uniq, inv = torch.unique(c, sorted=True, return_inverse=True)
        tile = bias.new_full((r1 - r0, uniq.numel()), -math.inf)
        tile[local, inv] = bias[s:e]
        allowed = ~torch.isneginf(tile).all(1)  # (a NaN bias is allowed: its row NaN, as dense)
        empty = None
        if not bool(allowed.all()):
            # no allowed pair: the row's output is 0 (torch's kernel); a finite bias keeps the
            # softmax free of NaN, and the row of P is zeroed after it
            empty = (~allowed).nonzero().flatten()
            tile[empty] = 0
        cols.append(uniq)
        biases.append(tile)
        empties.append(empty)
    return _Tiles(starts, cols, biases, empties)


def _masks_out(A: SparseTensor) -> bool:
    """``A``'s unspecified elements are masked out: a bool or float mask with an indefinite fill, a
    bool fill False or a float fill -inf."""
    if A.dtype != torch.bool and not A.dtype.is_floating_point:
        return False
    if A._indefinite:
        return True
    return not bool(A._fill) if A.dtype == torch.bool else bool(torch.isneginf(A._fill).all())


def _bias_values(A: SparseTensor, dtype: torch.dtype) -> torch.Tensor:
    """The bias of each stored element of the coalesced mask ``A`` (0 or -inf for a bool mask, the
    value for a float one)."""
    vals = A._vals
    if vals.dtype == torch.bool:
        return torch.zeros(vals.shape, dtype=dtype).masked_fill_(~vals, -math.inf)
    return vals.to(dtype)


def _csr(A: SparseTensor):
    """``(crow, col, vals, keys)`` of the coalesced 2-D ``A`` (``keys``: its index tensors, which
    the caches key on)."""
    if A._sf_layout is torch.sparse_csr:
        return A._crow, A._col, A._vals, (A._crow, A._col)
    idx, vals = coalesced_parts(A)
    crow = pattern_cached(
        ("attention_crow", A.shape[0]),
        (idx,),
        lambda: torch._convert_indices_from_coo_to_csr(idx[0].contiguous(), A.shape[0]),
    )
    return crow, idx[1], vals, (idx,)


def _areas(crow, col, ncols: int) -> dict:
    """``{rows per block: (sum of the tile areas, number of blocks)}`` for each candidate: the
    distinct (block, column) pairs of the smallest blocks by one sort of the stored elements, each
    larger candidate's from the previous one's (two blocks merged: a sort of far fewer keys)."""
    L = crow.numel() - 1
    r = torch.repeat_interleave(
        torch.arange(L, device=col.device), crow.diff(), output_size=col.numel()
    )
    keys = torch.unique(torch.div(r, CANDIDATES[0], rounding_mode="floor") * ncols + col)
    out, prev = {}, CANDIDATES[0]
    for b in CANDIDATES:
        if b != prev:
            blk, c = torch.div(keys, ncols, rounding_mode="floor"), keys % ncols
            keys = torch.unique(torch.div(blk, b // prev, rounding_mode="floor") * ncols + c)
            prev = b
        out[b] = (keys.numel() * b, -(-L // b))
    return out


def block_rows(A: SparseTensor, work: int) -> int:
    """Rows per block for the 2-D pattern ``A`` and ``work`` multiply-adds per tile element and
    pass (batch x head dim): the candidate of least ``area x work + BLOCK_COST x blocks`` (a band's
    tile spans its rows plus the window: small blocks waste less, large ones call less)."""
    crow, col, _, keys = _csr(A)
    areas = pattern_cached(
        ("attention_areas", tuple(A.shape)), keys, lambda: _areas(crow, col, A.shape[1])
    )
    if ROWS is not None:
        return ROWS
    return min(areas, key=lambda b: areas[b][0] * work + BLOCK_COST * areas[b][1])


def tiles_of(A: SparseTensor, dtype: torch.dtype, rows: int | None = None) -> _Tiles | None:
    """The cached tiles of the coalesced 2-D mask ``A`` (None: not a pattern of allowed pairs),
    ``rows`` rows per block (default ``ROWS``, or 64 where that is None)."""
    rows = rows or ROWS or 64
    if not _masks_out(A):
        return None
    crow, col, vals, keys = _csr(A)
    return pattern_cached(
        ("attention_tiles", tuple(A.shape), dtype, rows),
        (*keys, vals),
        lambda: _tiles(crow, col, _bias_values(A, dtype), rows),
    )


def _tile_forward(T: _Tiles, b: int, q, k, v, scale):
    """``(P, Kc, Vc)`` of block ``b``: the softmax of its scores over its tile, the tile's rows of
    ``k`` and ``v`` (``q, k, v``: ``(N, L, E)``, ``(N, S, E)``, ``(N, S, Ev)``)."""
    r0, r1, cols = T.starts[b], T.starts[b + 1], T.cols[b]
    Kc, Vc = k.index_select(1, cols), v.index_select(1, cols)
    S = torch.baddbmm(T.bias[b], q[:, r0:r1], Kc.transpose(1, 2), alpha=scale)
    P = torch.softmax(S, -1)
    if T.empty[b] is not None:
        P.index_fill_(1, T.empty[b], 0)
    return P, Kc, Vc


def _forward(T: _Tiles, q, k, v, scale):
    out = q.new_empty(q.shape[:-1] + v.shape[-1:])
    for b in range(len(T.cols)):
        P, _, Vc = _tile_forward(T, b, q, k, v, scale)
        torch.bmm(P, Vc, out=out[:, T.starts[b] : T.starts[b + 1]])
    return out


def _backward(T: _Tiles, q, k, v, out, dout, scale, needs):
    """``(dq, dk, dv)``: per block, with ``P`` recomputed, ``dS = P * (dout @ Vc^T - D)`` (``D``
    the row sums of ``dout * out``), ``dq = scale dS @ Kc``, ``dk[cols] += scale dS^T @ q``,
    ``dv[cols] += P^T @ dout``."""
    D = (dout * out).sum(-1, keepdim=True)
    dq = torch.empty_like(q) if needs[0] else None
    dk = torch.zeros_like(k) if needs[1] else None
    dv = torch.zeros_like(v) if needs[2] else None
    for b in range(len(T.cols)):
        r0, r1, cols = T.starts[b], T.starts[b + 1], T.cols[b]
        P, Kc, Vc = _tile_forward(T, b, q, k, v, scale)
        dO = dout[:, r0:r1]
        if dv is not None:
            dv.index_add_(1, cols, torch.bmm(P.transpose(1, 2), dO))
        if dq is None and dk is None:
            continue
        dS = torch.bmm(dO, Vc.transpose(1, 2)).sub_(D[:, r0:r1]).mul_(P)
        dS.mul_(scale)
        if dq is not None:
            torch.bmm(dS, Kc, out=dq[:, r0:r1])
        if dk is not None:
            dk.index_add_(1, cols, torch.bmm(dS.transpose(1, 2), q[:, r0:r1]))
    return dq, dk, dv


def _mask_of(idx, crow, col, vals, fill, shape, indefinite: bool, coalesced: bool):
    """The mask SparseTensor of the op's arguments (the inner tensors of the caller's mask)."""
    csr = crow is not None
    layout = torch.sparse_csr if csr else torch.sparse_coo
    A = SparseTensor._make(
        layout, shape, vals, fill, idx, crow, col, indefinite, coalesced or csr, False
    )
    if not csr and not coalesced:
        A = A.coalesce()
    return A


def _plan(A: SparseTensor, q, v) -> _Tiles:
    """The tiles of ``A`` for the flattened ``q, v`` (rows per block chosen for this batch and head
    dim).  Where the unspecified pairs of ``A`` take part (known only at run time under
    torch.compile, where the fill is not read) one tile of every pair: the dense semantics."""
    if not _masks_out(A):
        return _dense_tiles(A, q.dtype)
    work = q.shape[0] * (q.shape[-1] + v.shape[-1])
    parts = (A._crow, A._col) if A._sf_layout is torch.sparse_csr else (A._idx,)
    # (by the storages of the mask's tensors: a compiled graph passes them as new views each call)
    return storage_cached(
        ("attention_tiles", tuple(A.shape), q.dtype, work, ROWS),
        parts + (A._vals, A._fill),
        lambda: tiles_of(A, q.dtype, block_rows(A, work)),
    )


def _dense_tiles(A: SparseTensor, dtype) -> _Tiles:
    """One tile of all ``L x S`` pairs of the definite mask ``A``, its bias the dense mask's (the
    memory of torch's SDPA on ``A.to_dense()``)."""
    L, S = A.shape
    # (under torch.compile the fill is read only here, at run time: so the policy is asked here)
    check_densify(
        "scaled_dot_product_attention with a SparseTensor mask whose unspecified pairs take part",
        L * S * (torch.finfo(dtype).bits // 8 + 16),
        by_nature=True,
    )
    dense = A.to_dense()
    if dense.dtype == torch.bool:
        bias = torch.zeros(dense.shape, dtype=dtype).masked_fill_(~dense, -math.inf)
    else:
        bias = dense.to(dtype)
    crow = torch.arange(L + 1, device=A.device) * S
    col = torch.arange(S, device=A.device).repeat(L)
    return _tiles(crow, col, bias.flatten(), max(L, 1))


def _op_forward(q, k, v, idx, crow, col, vals, fill, indefinite, coalesced, scale):
    """``sparsefill::sparse_attention``: ``softmax(scale q k^T + bias) v`` (``q, k, v`` 3-D, the
    mask ``(L, S)`` given by its inner tensors)."""
    A = _mask_of(idx, crow, col, vals, fill, (q.shape[1], k.shape[1]), indefinite, coalesced)
    with torch.no_grad():
        return _forward(_plan(A, q, v), q, k, v, scale)


def _op_backward(
    dout, q, k, v, out, idx, crow, col, vals, fill, indefinite, coalesced, scale, needs
):
    """``sparsefill::sparse_attention_backward``: ``(dq, dk, dv)`` (an empty tensor for each not
    in ``needs``), the tiles' softmax recomputed."""
    A = _mask_of(idx, crow, col, vals, fill, (q.shape[1], k.shape[1]), indefinite, coalesced)
    with torch.no_grad():
        grads = _backward(_plan(A, q, v), q, k, v, out, dout.contiguous(), scale, needs)
    return tuple(g if g is not None else q.new_empty(0) for g in grads)


@functools.cache
def _ops():
    """``(sparsefill::sparse_attention, sparsefill::sparse_attention_backward)``, registered on
    first use (``torch.library``'s registration is not free: not at import)."""
    from torch.library import custom_op

    @custom_op("sparsefill::sparse_attention", mutates_args=())
    def fwd(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        idx: torch.Tensor | None,
        crow: torch.Tensor | None,
        col: torch.Tensor | None,
        vals: torch.Tensor,
        fill: torch.Tensor,
        indefinite: bool,
        coalesced: bool,
        scale: float,
    ) -> torch.Tensor:
        return _op_forward(q, k, v, idx, crow, col, vals, fill, indefinite, coalesced, scale)

    @fwd.register_fake
    def _(q, k, v, *_):
        return q.new_empty(q.shape[:-1] + v.shape[-1:])

    @custom_op("sparsefill::sparse_attention_backward", mutates_args=())
    def bwd(
        dout: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        idx: torch.Tensor | None,
        crow: torch.Tensor | None,
        col: torch.Tensor | None,
        vals: torch.Tensor,
        fill: torch.Tensor,
        indefinite: bool,
        coalesced: bool,
        scale: float,
        needs: list[bool],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return _op_backward(
            dout, q, k, v, out, idx, crow, col, vals, fill, indefinite, coalesced, scale, needs
        )

    @bwd.register_fake
    def _(dout, q, k, v, *args):
        needs = args[-1]
        return tuple(t.new_empty(t.shape if n else 0) for t, n in zip((q, k, v), needs))

    def setup_context(ctx, inputs, output):
        q, k, v, idx, crow, col, vals, fill, ctx.indefinite, ctx.coalesced, ctx.scale = inputs
        ctx.save_for_backward(q, k, v, output, idx, crow, col, vals, fill)

    def backward(ctx, dout):
        needs = list(ctx.needs_input_grad[:3])
        if not any(needs):
            return (None,) * 11
        q, k, v, out, idx, crow, col, vals, fill = ctx.saved_tensors
        grads = bwd(
            dout,
            q,
            k,
            v,
            out,
            idx,
            crow,
            col,
            vals,
            fill,
            ctx.indefinite,
            ctx.coalesced,
            ctx.scale,
            needs,
        )
        return (*(g if n else None for g, n in zip(grads, needs)), *(None,) * 8)

    fwd.register_autograd(backward, setup_context=setup_context)
    return fwd, bwd


_SDPA_KW = ("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def _sdpa_args(args, kwargs):
    """``(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)`` of a call, or None."""
    if set(kwargs) - {"query", "key", "value", *_SDPA_KW} or len(args) > 3 + len(_SDPA_KW):
        return None
    names = ("query", "key", "value") + _SDPA_KW
    defaults = (None, None, None, None, 0.0, False, None, False)
    got = dict(zip(names, args))
    if set(got) & set(kwargs):
        return None
    got.update(kwargs)
    return tuple(got.get(n, d) for n, d in zip(names, defaults))


def _fused_form(q, k, v, A) -> bool:
    """The call the tiles compute: dense float q, k, v of one shape but the last two dims, a
    SparseTensor mask ``(L, S)``, or ``(H, L, S)`` (``H`` 1 or q's dim -3), with no dense dims and
    no gradient."""
    plain = all(
        isinstance(t, torch.Tensor) and not isinstance(t, SparseTensor) and t.dim() >= 2
        for t in (q, k, v)
    )
    return (
        plain
        and isinstance(A, SparseTensor)
        and (A.dim() == 2 or A.dim() == 3 and q.dim() >= 3 and A.shape[0] in (1, q.shape[-3]))
        and not A.dense_dim()
        and not A.requires_grad
        and q.dtype.is_floating_point
        and q.dtype == k.dtype == v.dtype
        and q.shape[:-2] == k.shape[:-2] == v.shape[:-2]
        and q.shape[-1] == k.shape[-1]
        and k.shape[-2] == v.shape[-2]
        and tuple(A.shape[-2:]) == (q.shape[-2], k.shape[-2])
        and q.device == k.device == v.device == A.device
    )


@register_route(F.scaled_dot_product_attention, always=True)
def _sdpa(func, args, kwargs):
    """``F.scaled_dot_product_attention`` with a SparseTensor ``attn_mask``: the tiles; any other
    form declines (dense semantics through the other handlers)."""
    parsed = _sdpa_args(args, kwargs)
    if parsed is None:
        return NotImplemented
    q, k, v, A, dropout_p, is_causal, scale, enable_gqa = parsed
    if dropout_p or is_causal or enable_gqa or not _fused_form(q, k, v, A):
        return NotImplemented
    if A.dtype not in (torch.bool, torch.float32, q.dtype):  # (torch's check, its message)
        raise RuntimeError(
            "Expected attn_mask dtype to be bool or float or to match query dtype, but got "
            f"attn_mask.dtype: {A.dtype} and  query.dtype: {q.dtype} instead."
        )
    return _fused(q, k, v, A, scale)


def _fused(q, k, v, A, scale):
    """The tiles' attention, one ``sparsefill::sparse_attention`` call (eagerly and under
    torch.compile alike: the op reads the pattern at run time and caches its tiles with it).
    Eagerly a mask whose unspecified pairs take part declines (dense semantics through the other
    handlers); while traced the fill is not read, and the op computes that case densely at run
    time.  A mask ``(H, L, S)`` (one pattern per head, split by its data) is a graph break."""
    # (first: a view of a mask written since it was taken reads its base's data here, before its
    # fill is read and its slices are taken; this route runs outside views.around)
    A._sync()
    if traced():
        if A.dim() == 3:
            _graph_break()
            return NotImplemented
    else:
        if A.sparse_layout is torch.sparse_coo and not A.is_coalesced():
            A = A.coalesce()
        if not _masks_out(A):
            return NotImplemented
        if A.dim() == 3:
            return _per_slice(q, k, v, A, scale)
    lead = q.shape[:-2]
    n = math.prod(lead)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    q3, k3, v3 = (t.reshape(n, *t.shape[-2:]).contiguous() for t in (q, k, v))
    csr = A._sf_layout is torch.sparse_csr
    parts = (None, A._crow, A._col) if csr else (A._idx, None, None)
    out = _ops()[0](q3, k3, v3, *parts, A._vals, A._fill, A._indefinite, csr or A._coalesced, scale)
    return out.reshape(*lead, *out.shape[-2:])


def _graph_break():
    """In dynamo's trace: a graph break (the call runs eagerly); in a later fake-tensor trace
    (AOTAutograd, ``torch.export``, ``make_fx``) nothing (the caller declines: dense semantics)."""
    if torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FUNCTIONAL) is None:
        from torch._dynamo.exc import unimplemented

        unimplemented(
            gb_type="sparsefill: sparse attention with one pattern per head runs eagerly",
            context="F.scaled_dot_product_attention with a 3-D SparseTensor attn_mask",
            explanation="its per-head patterns are split by the mask's data: a graph break, the "
            "call runs eagerly (fused, cached tiles)",
            hints=["A 2-D mask (L, S), shared by the heads, compiles into the graph."],
        )


def _per_slice(q, k, v, A: SparseTensor, scale):
    """A mask ``(H, L, S)`` broadcast over ``q``'s ``(..., H, L, E)``: each slice's attention for
    its entries of dim -3 (the slices, and so their tiles, cached with the pattern)."""
    slices = _slices(A)
    if len(slices) == 1:
        return _fused(q, k, v, slices[0], scale)
    outs = [
        _fused(q.select(-3, h), k.select(-3, h), v.select(-3, h), M, scale)
        for h, M in enumerate(slices)
    ]
    return torch.stack(outs, -3)


def _slices(A: SparseTensor) -> list:
    """The 2-D slices ``A[h]`` of the coalesced 3-D mask ``A`` as CSR SparseTensors (its fill),
    cached with its pattern."""
    from sparsefill._creation.constructors import sparse_csr_tensor
    from sparsefill._tensor.fill import indefinite

    H, L, S = A.shape
    keys = (A._crow, A._col, A._vals) if A._sf_layout is torch.sparse_csr else (A._idx, A._vals)

    def compute():
        idx, vals = coalesced_parts(A)
        ends = torch.cumsum(torch.bincount(idx[0], minlength=H), 0).tolist()
        fill = indefinite if A._indefinite else A._fill
        out = []
        for s, e in zip([0, *ends[:-1]], ends):
            crow = torch._convert_indices_from_coo_to_csr(idx[1, s:e].contiguous(), L)
            out.append(
                sparse_csr_tensor(
                    crow, idx[2, s:e], vals[s:e], (L, S), fill_value=fill, check_invariants=False
                )
            )
        return out

    return pattern_cached(("attention_slices", tuple(A.shape)), keys, compute)
