"""One split for operands that split their dims differently into sparse and dense dims.

An element-wise op between a hybrid SparseTensor (sparse dims ``S``, dense dims ``K + D``) and one
with more sparse dims merges their patterns at one split, after converting each operand to it
exactly.  Right-aligned (as torch broadcasts), the result's last ``nd`` dims are dense.  The two
conversions, for a SparseTensor ``T``
with stored slices at ``P``, values ``v`` and fill ``f``::

    finer(T, nd):   the dense dims K become sparse                   (fill c = f[0, ..., 0], over D)
        stored = {(s, k): s in P, k in K}, values v[s][k]
               + {(s, k): s not in P, f[k] != c}, values f[k]             (NaN equal to NaN)
    coarser(T, nd): the last sparse dims K become dense               (fill f, broadcast over K + D)
        stored = {s: (s, k) in P for some k}, values v'[s][k] = T[s, k]
            (f where (s, k) is unspecified)

so that ``finer(T, nd).to_dense() == T.to_dense() == coarser(T, nd).to_dense()``.  ``finer`` stores
``|P| * |K|`` elements when ``f`` is uniform along ``K`` (a scalar, an array constant along K, or an
indefinite fill: none of the second set); else it must store the fill's other values at every
unspecified slice (O(numel), through the gate of :func:`._policy.check_specify`).  ``coarser``
stores one slice per stored prefix (O(nse * |K|)); an indefinite ``T`` only when each such slice is
wholly stored (a slice of a hybrid is all specified or all masked out), else None.

:func:`merge_dense_dim` picks the result's ``nd`` among the operands' numbers of dense dims (an
in-place op keeps its target's, :func:`one_split`)::

    nd = max(dense dims)   when every operand with fewer has size 1 in the dims that become dense
                           (free: A - A.logsumexp(-1, keepdim=True) of a hybrid A stays hybrid)
       = min{n : every operand with more than n dense dims has a fill uniform along the extra ones,
                 and every one with fewer is definite}
       = min(dense dims)   when no n qualifies (an indefinite operand beside a varying array fill)

The second line is the finest split at which no unspecified element is stored: the finer split,
unless a hybrid operand's fill varies along dense dims that would become sparse (e.g. a per-feature
default ``fill_value=torch.tensor([1., 2., 3.])``); there the all-sparse operand's stored elements
are gathered into slices instead (O(nse * |K|) elements, the fill stays an array) where the finer
split would store the fill at every unspecified slice (O(numel)).

Used by the pointwise rule, ``equal``/``copy_``/``allclose``/``dist`` (``ops/core.py``),
``cat``/``stack`` (``ops/shape/concat.py``), a gradient of another split than its input
(``_autograd.grad_parts``/``leaf_grad``) and ``A.to_sparse(dense_dim=...)`` with the fill kept
(:func:`resplit`).

>>> import torch, sparsefill
>>> H = sparsefill.sparse_coo_tensor(
...     [[1]], [[5.0, 6.0]], (3, 2), fill_value=0.0
... )  # hybrid, 1 dense dim
>>> F = finer(H, 0)
>>> F.indices().tolist(), F.values().tolist(), F.fill_value().item()
([[1, 1], [0, 1]], [5.0, 6.0], 0.0)
>>> C = sparsefill.sparse_coo_tensor(
...     [[0, 2], [1, 0]], [7.0, 8.0], (3, 2), fill_value=1.0
... )  # every dim sparse
>>> G = coarser(C, 1)
>>> G.indices().tolist(), G.values().tolist(), G.fill_value().tolist()
([[0, 2]], [[1.0, 7.0], [8.0, 1.0]], [1.0, 1.0])
>>> H1 = sparsefill.to_sparse(H.to_dense(), fill_value=torch.tensor([0.0, 1.0]), dense_dim=1)
>>> merge_dense_dim([H, C]), merge_dense_dim([H1, C])
(0, 1)
"""

from __future__ import annotations

import torch

from sparsefill._kernels import index as _index, merge as _merge
from sparsefill._tensor.parts import check_dense_dim, coalesced_parts, differs, to_layout
from sparsefill._tensor.tensor import SparseTensor


def finer(T: SparseTensor, nd: int) -> SparseTensor:
    """``T`` with its first ``T.dense_dim() - nd`` dense dims made sparse, exactly (a COO tensor;
    the module's equation); ``T`` itself when it has no more than ``nd`` dense dims."""
    sd, k = T._sparse_ndim(), T.dense_dim() - nd
    if k <= 0:
        return T
    S, K, D = tuple(T.shape[:sd]), tuple(T.shape[sd : sd + k]), tuple(T.shape[sd + k :])
    idx, vals = coalesced_parts(T)
    nK, nse = _index.numel(K), idx.shape[1]
    ks = _index.unravel(torch.arange(nK, device=idx.device), K)
    new_idx = torch.cat([idx.repeat_interleave(nK, dim=1), ks.repeat(1, nse)])
    new_vals = vals.reshape((nse * nK,) + D)
    if T._indefinite:
        return SparseTensor(
            torch.sparse_coo,
            T.shape,
            new_vals,
            T._fill,
            indices=new_idx,
            indefinite=True,
            coalesced=True,
        )
    c = T._fill  # (a fill that broadcasts over K as it is: kept, a scalar stays a scalar)
    if T._fill.dim() > len(D):
        fk = _fill_over(T._fill, K, D)
        c = fk[0].clone() if nK else T._fill.new_zeros(()).expand(D).clone()
        vary = _varying(fk, c, D)
        if vary is not None:  # the fill's other values, at every unspecified slice
            new_idx, new_vals = _with_unspecified(idx, S, K, new_idx, new_vals, fk, vary, T)
    return SparseTensor(
        torch.sparse_coo,
        T.shape,
        new_vals,
        c,
        indices=new_idx,
        coalesced=True,
        known_zero=T._fill_is_zero() if c is T._fill else not bool(c.any()),
    )


def coarser(T: SparseTensor, nd: int) -> SparseTensor | None:
    """``T`` with its last ``nd - T.dense_dim()`` sparse dims made dense, exactly (a COO tensor;
    leading dims of size 1 are added when ``T`` has fewer than ``nd`` dims); ``T`` itself when it
    has ``nd`` dense dims or more; None for an indefinite ``T`` with a partly stored slice (not
    representable)."""
    d = T.dense_dim()
    if nd <= d:
        return T
    pad = max(0, nd - T.dim())
    shape = (1,) * pad + tuple(T.shape)
    idx, vals = coalesced_parts(T)
    idx = torch.cat([idx.new_zeros((pad, idx.shape[1])), idx])
    sn = len(shape) - nd  # sparse dims left
    S, K, D = shape[:sn], shape[sn : len(shape) - d], shape[len(shape) - d :]
    nK, nse = _index.numel(K), idx.shape[1]
    prefix = _index.linearize(idx[:sn], S)
    # coalesced: a prefix's elements are adjacent
    first = torch.ones(nse, dtype=torch.bool, device=idx.device)
    torch.ne(prefix[1:], prefix[:-1], out=first[1:])
    group = torch.cumsum(first, 0).sub_(1)
    G = int(group[-1]) + 1 if nse else 0
    if T._indefinite:
        if G * nK != nse:
            return None
        return SparseTensor(
            torch.sparse_coo,
            shape,
            vals.reshape((G,) + K + D),
            T._fill,
            indices=idx[:sn, first],
            indefinite=True,
            coalesced=True,
        )
    out = T._fill.expand(D).expand((G, nK) + D).clone()
    out[group, _index.linearize(idx[sn:], K)] = vals
    return SparseTensor(
        torch.sparse_coo,
        shape,
        out.reshape((G,) + K + D),
        T._fill,
        indices=idx[:sn, first],
        coalesced=True,
        known_zero=T._fill_is_zero(),
    )


def to_dense_dim(T: SparseTensor, nd: int) -> SparseTensor | None:
    """``T`` with ``nd`` dense dims, exactly: :func:`finer` or :func:`coarser` (None where
    ``coarser`` is)."""
    return finer(T, nd) if T.dense_dim() > nd else coarser(T, nd)


def resplit(T: SparseTensor, dense_dim: int, layout=None) -> SparseTensor:
    """``T.to_sparse(layout, dense_dim=dense_dim)`` with ``T``'s fill kept: :func:`to_dense_dim`
    then the layout, exactly and with no dense temporary (``resplit(T, n).to_dense() ==
    T.to_dense()``); ValueError for a bad ``dense_dim`` or an indefinite ``T`` with a slice of the
    new dense dims partly specified.

    >>> import sparsefill
    >>> H = sparsefill.sparse_coo_tensor(
    ...     [[1]], [[5.0, 6.0]], (3, 2), fill_value=torch.tensor([0.0, 1.0])
    ... )
    >>> R = resplit(H, 0, torch.sparse_csr)
    >>> R.sparse_layout, R.to_dense().tolist() == H.to_dense().tolist(), R._nse()
    (torch.sparse_csr, True, 4)
    """
    layout = T._sf_layout if layout is None else layout
    nd = check_dense_dim(T.dim(), dense_dim, layout)
    C = to_dense_dim(T, nd)
    if C is None:
        raise ValueError(
            f"dense_dim={nd}: with an indefinite fill every dense slice must be wholly specified "
            f"or wholly unspecified, and here some of the last {nd} dims' slices are partly "
            "specified"
        )
    return to_layout(C, layout)


def merge_dense_dim(operands) -> int:
    """The number of trailing dense dims at which ``operands`` (SparseTensors, broadcastable) merge:
    the module's rule, the finest split that stores no unspecified element (or the free
    coarsening)."""
    dims = [T.dense_dim() for T in operands]
    lo, hi = min(dims), max(dims)
    if all(d == hi or all(n == 1 for n in _becoming_dense(T, hi)) for T, d in zip(operands, dims)):
        return hi
    for nd in range(lo, hi + 1):
        if all(
            uniform_along(T, d - nd) if d > nd else d == nd or not T._indefinite
            for T, d in zip(operands, dims)
        ):
            return nd
    return lo


def one_split(operands, layout, keep: SparseTensor | None = None):
    """``(operands at one split, result layout)``: ``keep``'s split (an in-place op's target) or
    :func:`merge_dense_dim`'s; the layout stays ``layout`` when the first operand keeps its split
    (else COO: a CSR's rows and columns would become other dims).  ValueError where an operand
    cannot take ``keep``'s split (an indefinite one with a partly specified slice there), before
    anything is written."""
    nd = keep.dense_dim() if keep is not None else merge_dense_dim(operands)
    conv = [to_dense_dim(T, nd) for T in operands]
    for T, C in zip(operands, conv):
        if C is None:
            raise ValueError(
                f"an in-place op on a SparseTensor with {nd} dense dims: an operand with an "
                f"indefinite fill and {T.dense_dim()} dense dims has slices of the last {nd} "
                "dims partly specified, which the target's dense dims cannot hold (a slice is "
                "all specified or all masked out); compute it out of place"
            )
    return conv, layout if conv[0] is operands[0] else torch.sparse_coo


def uniform_along(T: SparseTensor, k: int) -> bool:
    """Whether ``T``'s fill is the same along its first ``k`` dense dims (a scalar, an indefinite
    fill, an array of size 1 there or constant along them; NaN equal to NaN): then :func:`finer`
    stores no unspecified element."""
    f = T._fill
    if T._indefinite or f.dim() <= T.dense_dim() - k:
        return True
    sd = T._sparse_ndim()
    K, D = tuple(T.shape[sd : sd + k]), tuple(T.shape[sd + k :])
    fk = _fill_over(f, K, D)
    return not fk.shape[0] or _varying(fk, fk[0], D) is None


def _becoming_dense(T: SparseTensor, nd: int):
    """Sizes of ``T``'s dims that become dense at ``nd`` dense dims (missing leading dims count as
    size 1)."""
    return tuple(T.shape[max(0, T.dim() - nd) : T._sparse_ndim()])


def _fill_over(f: torch.Tensor, K, D) -> torch.Tensor:
    """The fill as ``(|K|, *D)``: one slice per position along the dims ``K``."""
    return f.expand(K + D).reshape((_index.numel(K),) + D)


def _varying(fk: torch.Tensor, c: torch.Tensor, D):
    """Positions along ``K`` where the fill differs from ``c`` (a 1-d index), or None where it is
    uniform."""
    if not fk.shape[0]:
        return None
    d = differs(fk, c)
    d = d.flatten(1).any(1) if D else d
    return d.nonzero().squeeze(1) if bool(d.any()) else None


def _with_unspecified(idx, S, K, new_idx, new_vals, fk, vary, T):
    """The stored elements ``(new_idx, new_vals)`` and, merged in row-major order, ``fk[k]`` at
    ``(s, k)`` for every unspecified slice ``s`` and ``k`` in ``vary`` (a fill varying along ``K``:
    those elements differ from ``c``)."""
    from sparsefill._tensor.policy import check_specify

    nK = _index.numel(K)
    taken = torch.zeros(_index.numel(S), dtype=torch.bool, device=idx.device)
    taken[_index.linearize(idx, S)] = True
    free = (~taken).nonzero().squeeze(1)
    n = free.numel() * vary.numel()
    check_specify(
        f"a hybrid SparseTensor's fill varying along dims of sizes {list(K)} that become sparse "
        f"({n} unspecified elements stored)",
        n,
        T.element_size() * max(1, fk[0].numel()),
    )
    SK = S + K
    stored = _index.linearize(new_idx, SK)
    extra = (free[:, None] * nK + vary[None, :]).reshape(-1)
    keys, ps, pe = _merge.merge_union(stored, extra)
    vals = new_vals.new_empty((keys.numel(),) + tuple(new_vals.shape[1:]))
    vals[ps] = new_vals
    vals[pe] = fk[vary].repeat((free.numel(),) + (1,) * (fk.dim() - 1))
    return _index.unravel(keys, SK), vals
