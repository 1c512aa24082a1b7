"""The gradient of a constructor: for ``P`` built from ``values`` and ``fill`` and an upstream
gradient ``G`` (dense, or a SparseTensor of any pattern, fill and dense dims)::

    grad_values[n] = G[indices[:, n]]                     (each stored element, duplicates included)
    grad_fill      = sum(G[i] for i not in P), summed to fill's shape

each term summed as it is (an inf outside the pattern gives inf, never ``inf - inf``); a
SparseTensor ``G`` is read in O(nse), without its dense form.

>>> import torch, sparsefill
>>> P = sparsefill.sparse_coo_tensor([[1]], [0.], (3,), fill_value=0.)
>>> gv, gf = grad_parts(torch.tensor([1., 2., 4.]), P)
>>> gv.tolist(), gf.item()
([2.0], 5.0)
"""

from __future__ import annotations

import torch

from sparsefill._tensor import parts as _convert
from sparsefill._kernels import index as _index
from sparsefill._kernels.trace import dynamic_sizes, traced
from sparsefill._tensor.dense_dims import coarser
from sparsefill._tensor.tensor import SparseTensor


def grad_parts(G, P: SparseTensor):
    """``(grad_values, grad_fill)`` of the constructor of ``P`` for upstream gradient ``G``."""
    S, D = P._sparse_shape, tuple(P._dense_shape)
    # masked out: no output read them, their gradient is 0
    if isinstance(G, SparseTensor) and G._indefinite:
        G = _convert.rewrap(G, fill=G._vals.new_zeros(()), indefinite=False, known_zero=True)
    # e.g. select_backward on a dense dim
    if isinstance(G, SparseTensor) and G._sparse_ndim() > len(S):
        G = coarser(G, len(D))  # (its trailing sparse dims made dense, exactly: O(nse * slice))
    elif isinstance(G, SparseTensor) and G._sparse_ndim() < len(S):  # or on the last sparse dim
        return _grad_parts_of_hybrid(G, P)
    gv = _values_on_pattern(G, P) if isinstance(G, SparseTensor) else None
    if gv is not None:  # e.g. from ops/linalg/backward.py: no lookup
        gv = gv.reshape(P._vals.shape)
        if P._indefinite:
            return gv, None
        # (every batch of a batched CSR)
        stored = _index.numel(P._vals.shape[: P._vals.dim() - len(D)])
        return gv, _times_count(G._fill.expand(D), _index.numel(S) - stored).sum_to_size(
            P._fill.shape
        )
    idx, _ = P._coo_parts()
    keys = _index.linearize(idx, S)
    gv = _convert.values_at(G, keys, len(S)).reshape(P._vals.shape)
    if P._indefinite:
        return gv, None
    # (traced: an unbacked size, also in AOTAutograd's trace of this backward)
    with dynamic_sizes():
        ukeys = torch.unique(keys)
    if isinstance(G, SparseTensor):
        gidx, gvals = _convert.coalesced_parts(G)
        gkeys = _index.linearize(gidx, S)
        if traced():  # (the count as a tensor: no value read while torch.compile traces)
            outside = ~_index.lookup(ukeys, gkeys)[1]
            n = _index.numel(S) - ukeys.numel() - outside.sum()
            f = G._fill.expand(D)
            gf = torch.where(outside.view((-1,) + (1,) * len(D)), gvals, 0).sum(0) + torch.where(
                n > 0, f * n, 0
            ).to(f.dtype)
            return gv, gf.sum_to_size(P._fill.shape)
        # (P's distinct positions among G's: O(nse(P) log nse(G)))
        pos, found = _index.lookup(gkeys, ukeys)
        inside = torch.zeros_like(gkeys, dtype=torch.bool).index_fill_(0, pos[found], True)
        n_both_unspecified = _index.numel(S) - ukeys.numel() - (gkeys.numel() - int(found.sum()))
        gf = gvals.masked_fill(inside.view((-1,) + (1,) * len(D)), 0).sum(0) + _times_count(
            G._fill.expand(D), n_both_unspecified
        )
    else:
        at = torch.zeros((_index.numel(S),) + (1,) * len(D), dtype=torch.bool, device=G.device)
        at[ukeys] = (
            True  # (one masked pass: boolean indexing ran nonzero and a gather over the whole G)
        )
        gf = G.reshape((_index.numel(S),) + D).masked_fill(at, 0).sum(0)
    return gv, gf.sum_to_size(P._fill.shape)


def sum_outside(G, idx: torch.Tensor, shape, dense_shape) -> torch.Tensor:
    """``G`` (dense or a SparseTensor of ``shape``) summed over the positions of its leading
    ``idx.shape[0]`` dims that are not among ``idx``'s columns: shape ``dense_shape``.  Each term is
    summed as it is (an inf there gives inf, as the dense sum), never as the total less the part at
    ``idx`` (``inf - inf``: NaN).

    >>> sum_outside(
    ...     torch.tensor([1.0, float("inf"), 2.0, 4.0]), torch.tensor([[1, 2]]), (4,), ()
    ... ).item()
    5.0
    """
    D = tuple(dense_shape)
    z = torch.zeros((), dtype=G.dtype, device=G.device)
    P = _convert.parts_to_sparse(
        idx, z.expand((idx.shape[1],) + D), tuple(shape), z.expand(D).clone()
    )
    return grad_parts(G, P)[1]


def _grad_parts_of_hybrid(G: SparseTensor, P: SparseTensor):
    """:func:`grad_parts` for ``G`` (defined fill) with fewer sparse dims ``g`` than ``P``: ``P``'s
    dims ``g..`` are dense in ``G``.  Exact with no conversion: a stored position of ``P`` reads
    ``G``'s slice or fill; the unspecified elements sum ``G``'s stored slices less ``P``'s positions
    in them (a masked sum) and, per slot ``j`` of those dims, the fill times the count of ``G``'s
    unspecified slices without ``P`` at ``j``.  O(G's stored slices + P's stored elements)."""
    S, D = P._sparse_shape, tuple(P._dense_shape)
    g = G._sparse_ndim()
    idx, _ = P._coo_parts()
    outer, inner = _index.linearize(idx[:g], S[:g]), _index.linearize(idx[g:], S[g:])
    gidx, gvals = _convert.coalesced_parts(G)
    M = _index.numel(S[g:])
    gvals, fill = gvals.reshape((-1, M) + D), G._fill.expand(G._dense_shape).reshape((M,) + D)
    pos, found = _index.lookup(_index.linearize(gidx, S[:g]), outer)
    gv = torch.where(
        found.view((-1,) + (1,) * len(D)),
        gvals[pos.clamp(max=max(gvals.shape[0] - 1, 0)), inner] if gvals.shape[0] else fill[inner],
        fill[inner],
    ).reshape(P._vals.shape)
    if P._indefinite:
        return gv, None
    ukeys = torch.unique(outer * M + inner)  # (P's distinct positions)
    uo, ui = ukeys // M, ukeys % M
    upos, ufound = _index.lookup(_index.linearize(gidx, S[:g]), uo)
    at = torch.zeros(gvals.shape[:2], dtype=torch.bool, device=gvals.device)
    at[upos[ufound], ui[ufound]] = True
    gf = gvals.masked_fill(at.view(at.shape + (1,) * len(D)), 0).sum((0, 1))
    # G's unspecified slices, less those where P has j
    n_rows = _index.numel(S[:g]) - gvals.shape[0]
    count = n_rows - torch.bincount(ui[~ufound], minlength=M)
    gf = gf + torch.where(
        count.view((-1,) + (1,) * len(D)) > 0,
        count.view((-1,) + (1,) * len(D)) * fill,
        torch.zeros((), dtype=fill.dtype),
    ).sum(0)
    return gv, gf.sum_to_size(P._fill.shape)


def _times_count(f: torch.Tensor, n: int) -> torch.Tensor:
    """``f`` summed over ``n`` elements: ``f * n``, and 0 for ``n == 0`` whatever ``f`` (NaN * 0
    would be NaN where no element contributes: a fully stored input's fill has gradient 0)."""
    return f * n if n else torch.zeros_like(f)


def _values_on_pattern(G: SparseTensor, P: SparseTensor):
    """``G``'s values when ``G`` stores exactly ``P``'s (coalesced) elements, in ``P``'s order; else
    None."""
    if not (G._coalesced and P._coalesced) or G.shape != P.shape or G.dense_dim() != P.dense_dim():
        return None
    if G._sf_layout is P._sf_layout and (
        G._idx is P._idx
        if P._sf_layout is torch.sparse_coo
        else G._crow is P._crow and G._col is P._col
    ):
        return G._vals
    # (torch.compile: equal patterns are not known without reading them; the general path)
    if traced():
        return None
    (gi, gv), (pi, _) = G._coo_parts(), P._coo_parts()
    return gv if gi.shape == pi.shape and torch.equal(gi, pi) else None
