"""The backward of the matrix products, as sparse as their forward.

``matmul mm bmm mv addmm addmv baddbmm linear einsum torch.sparse.mm`` with one SparseTensor
operand ``A`` (2-d or 3-d, batched) and one dense operand ``X`` run through :class:`SparseMM`
when ``A`` needs a gradient.  For ``Y = A @ X``, upstream gradient ``G``, pattern ``P`` of ``A``::

    grad_A[b, i, j] = (G[b, i, :] * X[b, j, :]).sum()    at each (b, i, j) in P  (SDDMM: O(nse * n))
    sum of grad_A over the unspecified elements
        = sum_b G[b].sum(0) . X[b].sum(0) - sum of grad_A over P
    grad_X          = A^T @ G                                (a sparse product of ``linalg.py``)

and for ``Y = X @ A``: ``grad_A[b, i, j] = (X[b, :, i] * G[b, :, j]).sum()``, ``grad_X = G @ A^T``
(hybrid ``A``: the same per stored scalar element; the fill's gradient keeps the dense dims).
No N x N tensor is formed.  The gradient of ``A`` is a SparseTensor with ``A``'s pattern whose fill
is the mean of ``grad_A`` over the unspecified elements: exact for what ``A`` was built from (the
constructor reads ``grad_A`` at the pattern and its sum over the unspecified elements), so the route
is taken only where that is all that is read (:func:`pattern_grad_is_exact`).  An indefinite fill
has no gradient outside the pattern (the forward reads nothing there): the gradient's fill is 0.

``A`` may be computed by element-wise ops with the same derivative at every unspecified element
(``(2 * W) @ X``, ``W.exp() @ X``): the mean is carried through them unchanged in kind.  Not routed
(torch's formulas, as before): both operands SparseTensors, 4-d operands, a leaf ``A`` and ``A``
computed by other ops (its dense gradient ``G @ X^T`` may be read elsewhere than at the pattern).
The fill's closed form subtracts the pattern's part; where that is not finite (an ``inf`` in ``G``
or ``X``: ``inf - inf``) the elements in the non-finite rows are summed one by one
(:func:`_rest_nonfinite`), so the fill's gradient is the dense one (``inf``, not NaN); traced
(torch.compile, no data read) by the counts of non-finite terms, branch-free
(:func:`_rest_counted`).  ``grad_X`` is exact by ``linalg.py``'s products.

>>> import torch, sparsefill
>>> v, f = torch.tensor([1., 2.], requires_grad=True), torch.tensor(3., requires_grad=True)
>>> A = sparsefill.sparse_coo_tensor([[0, 1], [1, 0]], v, (2, 2), fill_value=f)
>>> X = torch.tensor([[1., 2.], [3., 4.]])
>>> (A @ X).sum().backward()
>>> v.grad.tolist(), f.grad.item()          # dense: (ones @ X^T) at (0, 1), (1, 0); the rest summed
([7.0, 3.0], 10.0)
"""

from __future__ import annotations

import math

import contextlib
import re
import warnings

import torch
from torch.autograd.function import once_differentiable

from sparsefill._kernels import index as _index
from sparsefill._kernels.trace import bincount, known_true, traced
from sparsefill._autograd.functions import (
    Construct,
    SameDense,
    _pattern,
    refuse_vmap,
    sparse_inside,
)
from sparsefill._kernels.grouping import values_not_kept
from sparsefill._tensor.parts import coalesced_parts, parts_to_sparse, rewrap, scalar_parts
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.ops.linalg import pattern_ops

_CONSTRUCT, _SAME_DENSE = Construct._backward_cls, SameDense._backward_cls


def _permuting_nodes():
    """The autograd nodes of ``t``, ``transpose``, ``permute``, ``mT``, ``T``: they map the
    unspecified elements one to one onto the unspecified elements of their SparseTensor input."""
    with torch.enable_grad():  # (this module may be imported first under no_grad)
        x = torch.zeros(2, 2, requires_grad=True)
        return frozenset(
            type(v.grad_fn) for v in (x.t(), x.transpose(0, 1), x.permute(1, 0), x.mT, x.T)
        )


_PERMUTING = _permuting_nodes()


def pattern_grad_is_exact(A: SparseTensor) -> bool:
    """True when ``A``'s gradient is read only at its pattern and summed over its unspecified
    elements, so that a gradient exact at the pattern with the *mean* over the unspecified elements
    as its fill is exact for every reader: ``A`` comes from a differentiable constructor through

    * coalesce / layout changes and transposes (``x @ W.t()``), row and column selections
      (``index_autograd``: their backward reads the gradient at the pattern and in sum), and
    * element-wise ops whose derivative is the same at every unspecified element of ``A`` (at each
      position of its dense dims) (``2 * W``, ``W.exp()``, ``W + B``, ``(2 * W).t()``, ``W * w``
      with ``w`` over the dense dims of a hybrid ``W``): every tensor their backward reads is a
      number, a dense tensor constant along ``A``'s sparse dims or a SparseTensor with a defined
      fill and no stored element outside the pattern (``A``'s, through the transposes), and their
      inputs have their output's shape (or are constant along the sparse dims: their gradient is a
      sum over them); the constructors reached store nothing outside it either;

    or its fill is indefinite.  A leaf's ``.grad`` (dense semantics: ``G @ X^T``) and ``A`` computed
    otherwise (``W * w`` with a dense ``w``: a derivative that varies) take torch's path."""
    if A._indefinite:
        return True
    if A.grad_fn is None:  # a leaf
        return False
    keys, seen, todo = (
        {},
        set(),
        [(A.grad_fn, _pattern(A))],
    )  # (node, its output's pattern: graph-free)
    while todo:
        node, R = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node) in _PERMUTING or type(node) is _SAME_DENSE and node.x_layout is None:
            todo.append((node.next_functions[0][0], _input_pattern(node, R)))
        # (a selection whose input was found exact: the rest)
        elif getattr(node, "input_grad_exact", False):
            continue
        elif type(node) is _CONSTRUCT and tuple(node.pattern.shape) == tuple(R.shape):
            if not _within_pattern(node.pattern, R, keys):
                return False
        elif not _uniform_elementwise(node, R, keys):
            return False
        # an input constant along R's sparse dims (0-d, a dense-dims vector): its gradient sums over
        # them
        else:
            todo.extend(
                (m, R)
                for m, _ in node.next_functions
                if m is not None
                and len(m._input_metadata)
                and not _along_dense_dims(tuple(m._input_metadata[0].shape), R)
            )
    return True


def _along_dense_dims(shape, A: SparseTensor) -> bool:
    """A tensor of ``shape`` broadcast to ``A``'s shape varies only along ``A``'s dense dims (0-d:
    nowhere)."""
    lead = A.dim() - len(shape)
    return lead >= 0 and all(n == 1 for i, n in enumerate(shape) if lead + i < A._sparse_ndim())


def _input_pattern(node, R: SparseTensor) -> SparseTensor:
    """The pattern of a permuting node's input (``R``: its output's), or ``R`` through a layout
    change."""
    if type(node) is _SAME_DENSE:
        return R
    name = type(node).__name__
    if name == "TransposeBackward0":
        d0, d1 = (
            d - (1 << 64) if d >= 1 << 63 else d for d in (node._saved_dim0, node._saved_dim1)
        )
        return R.transpose(d0, d1)
    if name == "PermuteBackward0":
        dims = [d % R.dim() for d in node._saved_dims]
        return R.permute([dims.index(i) for i in range(R.dim())])
    return R.t()


# autograd node type -> whether it is the backward of an element-wise aten op
_POINTWISE_NODES: dict = {}


def _is_pointwise_node(node) -> bool:
    t = type(node)
    ok = _POINTWISE_NODES.get(t)
    if ok is None:
        m = re.fullmatch(r"([A-Za-z0-9]+?)Backward\d+", t.__name__)
        name = m and re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", m.group(1)).lower()
        op = getattr(torch.ops.aten, name, None) if name else None
        ok = _POINTWISE_NODES[t] = isinstance(op, torch._ops.OpOverloadPacket) and any(
            torch.Tag.pointwise in getattr(op, o).tags for o in op.overloads()
        )
    return ok


def _uniform_elementwise(node, A: SparseTensor, keys: dict) -> bool:
    """``node`` is an element-wise op's backward on ``A``'s shape whose every saved tensor is a
    number, 0-d, or a SparseTensor with a defined fill storing nothing outside ``A``'s pattern."""
    if (
        not _is_pointwise_node(node)
        or len(node._input_metadata) != 1
        or tuple(node._input_metadata[0].shape) != tuple(A.shape)
    ):
        return False
    for name in dir(node):
        if not name.startswith("_saved_"):
            continue
        t = getattr(node, name)
        if isinstance(t, SparseTensor):
            if t._indefinite or t.shape != A.shape or not _within_pattern(t, A, keys):
                return False
        elif isinstance(t, torch.Tensor) and not _along_dense_dims(tuple(t.shape), A):
            return False
    return True


def _within_pattern(T: SparseTensor, A: SparseTensor, keys: dict) -> bool:
    """No stored element of ``T`` (same shape as ``A``) lies outside ``A``'s pattern (``keys``: A's
    sorted keys by ``id(A)``, computed once)."""
    if T._sf_layout is A._sf_layout and (
        T._idx is A._idx
        if A._sf_layout is torch.sparse_coo
        else T._crow is A._crow and T._col is A._col
    ):
        return True
    # a hybrid T in a permuted A's
    if T._sparse_ndim() < A._sparse_ndim() == A.dim() and T.shape == A.shape:
        return _within_scalar_pattern(T, A, keys)  # (dense dims made sparse) pattern
    if T._sparse_ndim() != A._sparse_ndim() or T.shape != A.shape:
        return False
    if id(A) not in keys:
        idx, _ = coalesced_parts(A)
        keys[id(A)] = (A, _index.linearize(idx, A._sparse_shape))  # (A kept: its id stays its own)
    tk = _index.linearize(T._coo_parts()[0], T._sparse_shape)
    # (traced: not known, the general path)
    return known_true(_index.lookup(keys[id(A)][1], tk)[1].all())


def _within_scalar_pattern(T: SparseTensor, A: SparseTensor, keys: dict) -> bool:
    """:func:`_within_pattern` for a hybrid ``T`` and an ``A`` of no dense dims (``P.permute(2, 0,
    1)`` of a hybrid ``P`` stores each of its dense slices' scalars): each stored slice of ``T``,
    scalar by scalar."""
    idx, vals = T._coo_parts()
    sidx, _ = scalar_parts(idx, vals, T._dense_shape)
    if id(A) not in keys:
        keys[id(A)] = (A, _index.linearize(coalesced_parts(A)[0], A.shape))
    return known_true(_index.lookup(keys[id(A)][1], _index.linearize(sidx, A.shape))[1].all())


def _sampled(A: SparseTensor, U: torch.Tensor, V: torch.Tensor):
    """``(indices, (U @ V^T) at A's coalesced pattern)`` for ``U`` ``(nb, m, n)``, ``V`` ``(nb, k,
    n)``.

    The stored scalar elements in block-diagonal coordinates ``(b*m + i, b*k + j)`` are in row-major
    order: torch's fused SDDMM kernel (``sparse.sampled_addmm``) reads them as a CSR pattern, with
    no ``(nse, n)`` temporaries; other dtypes gather the rows (``O(nse * n)``)."""
    idx, vals = coalesced_parts(A)
    sidx, _ = scalar_parts(idx, vals, A._dense_shape)
    nb, m, n = U.shape
    k = V.shape[1]
    r, c = (sidx[0], sidx[1]) if A.dim() == 2 else (sidx[0] * m + sidx[1], sidx[0] * k + sidx[2])
    U2, V2 = U.reshape(nb * m, n), V.reshape(nb * k, n)
    # (torch's kernel: no trace)
    if U.dtype in (torch.float32, torch.float64) and not traced() and r.numel():
        crow = torch.cat([r.new_zeros(1), bincount(r, nb * m).cumsum(0)])
        with warnings.catch_warnings():
            # "Sparse CSR tensor support is in beta state"
            warnings.simplefilter("ignore", UserWarning)
            P = torch.sparse_csr_tensor(crow, c, U.new_zeros(r.numel()), (nb * m, nb * k))
            out = torch.sparse.sampled_addmm(P, U2, V2.mT, beta=0).values()
    elif pattern_ops.usable(U2, V2, r.shape[0] * n):  # (traced: the compiled kernel)
        out = pattern_ops.pattern_sddmm(U2, V2, r, c)
    else:
        out = torch.bmm(U2.index_select(0, r).unsqueeze(1), V2.index_select(0, c).unsqueeze(2))
    return idx, out.reshape(vals.shape)


def _total(A: SparseTensor, U: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """``(U @ V^T)`` summed over ``A``'s sparse dims (of the ``(nb, m, k)`` view): the dense dims
    remain."""
    s = A._sparse_ndim() + (A.dim() == 2)
    if s == 3:
        return torch.linalg.vecdot(U.sum(1), V.sum(1)).sum()
    if s == 2:
        return torch.einsum("bn,bjn->j", U.sum(1), V)
    return torch.einsum("bin,bjn->ij", U, V)


def _rest_nonfinite(A: SparseTensor, idx, U: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """``U @ V^T`` summed over ``A``'s unspecified elements (per dense position) where ``U`` or
    ``V`` has a non-finite entry: the elements of their finite rows by the closed form (finite: no
    ``inf - inf``), the elements in a non-finite row of ``U`` or of ``V`` one by one (``O(rows *
    n)`` each), as the dense sum."""
    D = tuple(A._dense_shape)
    bu, bv = ~torch.isfinite(U).all(-1), ~torch.isfinite(V).all(-1)  # (nb, m), (nb, k)
    zero = U.new_zeros(())
    Uf, Vf = torch.where(bu[..., None], zero, U), torch.where(bv[..., None], zero, V)
    rest = _total(A, Uf, Vf).reshape(D) - _sampled(A, Uf, Vf)[1].sum(0)
    b, i = bu.nonzero(as_tuple=True)
    b2, j2 = bv.nonzero(as_tuple=True)
    m, k = U.shape[1], V.shape[1]
    from sparsefill._tensor.policy import check_densify

    check_densify(
        "the fill's gradient of a sparse product with a non-finite operand",
        (b.numel() * k + b2.numel() * m) * U.element_size(),
        by_nature=True,
    )
    rows = torch.einsum("tn,tjn->tj", U[b, i], V[b])  # elements (b, i, every j)
    cols = torch.einsum("tin,tn->ti", U[b2], V[b2, j2])  # elements (b2, every i, j2)
    cols = torch.where(bu[b2], zero, cols)  # (those in a non-finite U row: in rows)
    ar_k, ar_m = torch.arange(k, device=U.device), torch.arange(m, device=U.device)
    coords = torch.cat(
        [
            torch.stack(
                [b[:, None].expand(-1, k), i[:, None].expand(-1, k), ar_k.expand(b.numel(), k)]
            ).reshape(3, -1),
            torch.stack(
                [b2[:, None].expand(-1, m), ar_m.expand(b2.numel(), m), j2[:, None].expand(-1, m)]
            ).reshape(3, -1),
        ],
        1,
    )
    vals = torch.cat([rows.reshape(-1), cols.reshape(-1)])
    coords = coords if A.dim() == 3 else coords[1:]
    sd = A._sparse_ndim()
    free = ~torch.isin(
        _index.linearize(coords[:sd], A._sparse_shape), _index.linearize(idx, A._sparse_shape)
    )
    at = _index.linearize(coords[sd:], D) if D else torch.zeros_like(vals, dtype=torch.int64)
    return rest.reshape(-1).index_add(0, at[free], vals[free]).reshape(D)


def _rest_counted(A: SparseTensor, U: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """``U @ V^T`` summed over ``A``'s unspecified elements as dense sums it, branch-free
    (torch.compile: no data read): the finite terms ``U[i, n] * V[j, n]`` by the closed form, and
    the counts of ``+inf``, ``-inf`` and NaN terms (each ``colsum(a) . colsum(b)`` minus the
    pattern's part, for indicator pairs ``(a, b)`` concatenated along ``n``): NaN if a NaN term or
    terms of both signs, else +-inf, else finite. ``O(nse * n)`` (4 sampled products of up to ``4n``
    columns)."""
    D = tuple(A._dense_shape)

    def part(a, b):
        return _total(A, a, b).reshape(D) - _sampled(A, a, b)[1].sum(0)

    fu, fv = torch.isfinite(U), torch.isfinite(V)
    zero = U.new_zeros(())
    rest = part(torch.where(fu, U, zero), torch.where(fv, V, zero))
    inf = float("inf")
    c64 = lambda m: m.to(torch.float64)  # noqa: E731  (exact counts)
    upi, uni, ufp, ufn = c64(U == inf), c64(U == -inf), c64(fu & (U > 0)), c64(fu & (U < 0))
    vpi, vni, vpos, vneg = c64(V == inf), c64(V == -inf), c64(V > 0), c64(V < 0)
    us = torch.cat([upi, uni, ufp, ufn], -1)
    cp = part(us, torch.cat([vpos, vneg, vpi, vni], -1))
    cn = part(us, torch.cat([vneg, vpos, vni, vpi], -1))
    unan = c64(U.isnan())
    cnan = part(
        torch.cat([unan, 1 - unan, upi + uni, c64(U == 0)], -1),
        torch.cat([torch.ones_like(vpi), c64(V.isnan()), c64(V == 0), vpi + vni], -1),
    )
    nan_t = torch.full((), float("nan"), dtype=rest.dtype, device=rest.device)
    inf_t = torch.full((), inf, dtype=rest.dtype, device=rest.device)
    extra = torch.where(
        (cnan > 0) | ((cp > 0) & (cn > 0)),
        nan_t,
        torch.where(cp > 0, inf_t, torch.where(cn > 0, -inf_t, torch.zeros_like(inf_t))),
    )
    return rest + extra


def pattern_grad(A: SparseTensor, U: torch.Tensor, V: torch.Tensor) -> SparseTensor:
    """The gradient of ``A`` for the dense gradient ``U @ V^T`` (never formed), as a SparseTensor of
    ``A``'s pattern and layout: exact at the pattern, the mean of the rest as its fill."""
    idx, gv = _sampled(A, U, V)
    rest = None
    if not A._indefinite:
        if traced():  # no data read: the branch-free exact sum
            rest = _rest_counted(A, U, V)
        else:
            rest = _total(A, U, V).reshape(A._dense_shape) - gv.sum(0)
            if not bool(torch.isfinite(rest).all()):  # an inf or NaN in U or V: inf - inf
                rest = _rest_nonfinite(A, idx, U, V)
    return gradient_on_pattern(A, idx, gv, rest)


def gradient_on_pattern(A: SparseTensor, idx, gv: torch.Tensor, rest) -> SparseTensor:
    """``A``'s gradient as a SparseTensor of its pattern and layout: ``gv`` at the stored
    elements ``idx`` (coalesced order), the mean of ``rest`` (the gradient summed over the
    unspecified elements; None for an indefinite fill) as its fill."""
    if rest is None:
        fill, zero = gv.new_zeros(()), True
    else:
        n = _index.numel(A._sparse_shape) - idx.shape[1]
        fill, zero = (rest / n if n else torch.zeros_like(rest)), False
    # A's own index tensors: the constructor's backward reads the values as they are
    if A._coalesced:
        return rewrap(
            A, values=gv.reshape(A._vals.shape), fill=fill, indefinite=False, known_zero=zero
        )
    return parts_to_sparse(
        idx, gv, A.shape, fill, known_zero=zero, layout=A._sf_layout, coalesced=True
    )


class _PatternProduct(torch.autograd.Function):
    """What the products of a SparseTensor ``A`` that needs a gradient share: ``ctx`` keeps ``A``'s
    pattern (graph-free), the side ``left`` and the dense operand ``X``."""

    @staticmethod
    def setup_context(ctx, inputs, output):
        A, X, left = inputs
        ctx.pattern, ctx.left = _pattern(A), left
        ctx.save_for_backward(X)

    vmap = staticmethod(lambda info, in_dims, *args: refuse_vmap("a sparse matrix product"))


class SparseMM(_PatternProduct):
    """``A @ X`` (``left``) or ``X @ A``: ``A`` a 2-d or 3-d SparseTensor, ``X`` dense of ``A``'s
    batch."""

    @staticmethod
    def forward(A, X, left):
        P = _pattern(A)
        mm = torch.mm if A.dim() == 2 else torch.bmm
        with values_not_kept():  # (A needs a gradient: its values change)
            return mm(P, X) if left else mm(X, P)

    @staticmethod
    @once_differentiable
    def backward(ctx, G):
        (X,), G = ctx.saved_tensors, sparse_inside(G)
        P, left = ctx.pattern, ctx.left
        mm = torch.mm if P.dim() == 2 else torch.bmm
        gA = gX = None
        Xc, Pc = (
            X.to(G.dtype),
            P.to(G.dtype),
        )  # autocast: the operands as the forward's product read them
        if ctx.needs_input_grad[0]:
            U, V = (G, Xc) if left else (Xc.mT, G.mT)
            if G.dtype in (
                torch.bfloat16,
                torch.float16,
            ):  # sums in float32, as torch's dense mm accumulates
                U, V = U.float(), V.float()
            gA = pattern_grad(P, U[None] if P.dim() == 2 else U, V[None] if P.dim() == 2 else V).to(
                P.dtype
            )
        if ctx.needs_input_grad[1]:
            with values_not_kept():
                gX = (mm(G.mT, Pc).mT if left else mm(Pc, G.mT).mT).to(X.dtype)
        return gA, gX, None


def _heads(P: SparseTensor):
    """``(Pc, [P[..., h] for each h])``: ``Pc`` is ``P`` (hybrid, two sparse dims, one dense dim)
    coalesced, the heads 2-d SparseTensors of its pattern (its index tensors shared) holding
    ``Pc``'s values and fill at ``h``."""
    if not P._coalesced:
        idx, vals = coalesced_parts(P)
        P = rewrap(P, indices=idx, values=vals, coalesced=True)
    H = P.shape[2]
    fill = P._fill if P._indefinite else P._fill.expand(H)
    return P, [
        rewrap(
            P,
            size=P.shape[:2],
            values=P._vals[:, h].contiguous(),
            fill=fill if P._indefinite else fill[h],
        )
        for h in range(H)
    ]


class HybridMM(_PatternProduct):
    """``Y[h] = A[..., h] @ X[h]`` (``left``) or ``(X[h]^T @ A[..., h])^T`` for each position ``h``
    of the one dense dim of a hybrid ``A`` ``(m, k, H)`` (``(k, m, H)`` for ``left=False``) and a
    dense ``X`` ``(H, k, n)``: the heads of a multi-head attention, ``einsum("ijh,jhd->hid", A,
    X)``, head by head on the pattern.  The gradient of ``A``: :func:`pattern_grad` per head (its
    fill the per-head mean of the rest), assembled as a hybrid SparseTensor of ``A``'s pattern; no
    ``(m, k)`` tensor is formed, and no scalar-per-element copy of ``A``'s indices (``A.permute(2,
    0, 1)``: ``H`` times ``A``'s index memory)."""

    @staticmethod
    def forward(A, X, left):
        _, heads = _heads(_pattern(A))
        with values_not_kept():  # (A needs a gradient: its values change)
            return torch.stack(
                [
                    torch.mm(P, X[h]) if left else torch.mm(X[h].mT, P).mT
                    for h, P in enumerate(heads)
                ]
            )

    @staticmethod
    @once_differentiable
    def backward(ctx, G):
        (X,), G = ctx.saved_tensors, sparse_inside(G)
        Pc, heads = _heads(ctx.pattern)
        gA = gX = None
        if ctx.needs_input_grad[0]:
            vals, fills = [], []
            for h, P in enumerate(heads):
                U, V = (G[h], X[h]) if ctx.left else (X[h], G[h])
                if G.dtype in (torch.bfloat16, torch.float16):  # sums in float32, as SparseMM's
                    U, V = U.float(), V.float()
                g = pattern_grad(P, U[None], V[None])
                vals.append(g._vals.to(Pc.dtype))
                fills.append(g._fill.to(Pc.dtype))
            gA = rewrap(
                Pc,
                values=torch.stack(vals, -1),
                fill=torch.stack(fills),
                indefinite=False,
                known_zero=Pc._indefinite,
            )
        if ctx.needs_input_grad[1]:
            # Traced, P^T G as (G^T P)^T: a scatter over P's pattern, where P.mT is a sort of it
            # per head in every compiled step (eager keeps the transposed pattern cached).
            tr = ctx.left and traced(G)
            with values_not_kept():
                gX = torch.stack(
                    [
                        (
                            torch.mm(G[h].mT, P).mT
                            if tr
                            else torch.mm(P.mT, G[h])
                            if ctx.left
                            else torch.mm(P, G[h])
                        ).to(X.dtype)
                        for h, P in enumerate(heads)
                    ]
                )
        return gA, gX, None


# ---------------------------------------------------------------------- routes (imported here, not
# at the top: autograd_routes imports this module and reduction_autograd, which imports
# pattern_grad_is_exact from it; entered from this module first, the names above must already exist)
from sparsefill.ops.autograd_routes import register_route  # noqa: E402


def _eligible(A, X) -> bool:
    return (
        torch.is_grad_enabled()
        and isinstance(A, SparseTensor)
        and isinstance(X, torch.Tensor)
        and not isinstance(X, SparseTensor)
        and X.layout is torch.strided
        and A.requires_grad
        and A.dtype == X.dtype
        and A.dtype.is_floating_point
        and A.device == X.device
        and A.dim() in (2, 3)
        and 1 <= X.dim() <= 3
        and A.numel() > 0
        and X.numel() > 0
        and pattern_grad_is_exact(A)
    )


def _matmul(a, b):
    """``torch.matmul(a, b)`` through :class:`SparseMM`, or ``NotImplemented`` (torch's path: shape
    errors, both sparse, 4-d operands, a leaf ``A``...).  A vector times a stack of matrices, both
    sparse: torch squeezes the sparse product in place (``squeeze_``, which a SparseTensor refuses),
    so it is squeezed here, out of place."""
    if (
        isinstance(a, SparseTensor)
        and isinstance(b, SparseTensor)
        and a.dim() == 1
        and b.dim() >= 2
    ):
        return torch.matmul(a.unsqueeze(0), b).squeeze(-2)
    if _eligible(a, b):
        A, X, left = a, b, True
    elif _eligible(b, a):
        A, X, left = b, a, False
    else:
        return NotImplemented
    k = A.shape[-1] if left else A.shape[-2]  # the contracted size
    xk = X.shape[0 if X.dim() == 1 else (-2 if left else -1)]
    if xk != k:
        return NotImplemented
    vec = X.dim() == 1
    if vec:
        X = X[:, None] if left else X[None]
    # a batch of dense operands: one product with the batch folded
    if A.dim() == 2 and X.dim() == 3:
        nb = X.shape[0]
        if left:
            Y = SparseMM.apply(A, X.transpose(0, 1).reshape(k, -1), True)
            return Y.reshape(A.shape[0], nb, -1).transpose(0, 1)
        return SparseMM.apply(A, X.reshape(-1, k), False).reshape(nb, -1, A.shape[1])
    if A.dim() == 3:
        if X.dim() == 3 and X.shape[0] not in (1, A.shape[0]):
            return NotImplemented
        X = X.expand((A.shape[0],) + tuple(X.shape[-2:]))
    Y = SparseMM.apply(A, X, left)
    if vec:
        Y = Y.squeeze(-1) if left else Y.squeeze(-2)
    return Y


def _dims_are(a, b, da, db) -> bool:
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.dim() == da
        and b.dim() == db
    )


def _autocast_as_dense(name, a):
    """``mv``/``addmv`` are not on autocast's lists (computed in the operands' dtype): autocast off
    for the product :class:`SparseMM` computes by ``mm``; the others are cast, as dense casts
    them."""
    dev = a.device.type
    off = name in ("mv", "addmv") and torch.is_autocast_enabled(dev)
    return torch.autocast(dev, enabled=False) if off else contextlib.nullcontext()


def _autocast_added(t, p):
    """``t`` added to the product ``p`` (``addmm``'s input, ``linear``'s bias): cast to ``p``'s
    dtype where autocast computed ``p`` (it casts every floating operand of these ops but
    float64)."""
    if (
        isinstance(t, torch.Tensor)
        and t.dtype != p.dtype
        and t.is_floating_point()
        and t.dtype != torch.float64
        and torch.is_autocast_enabled(p.device.type)
    ):
        return t.to(p.dtype)
    # torch's addmm/linear: no promotion of the added tensor
    if isinstance(t, torch.Tensor) and t.dtype != p.dtype:
        raise RuntimeError(
            "self and mat2 must have the same dtype, but got "
            f"{_DTYPE_NAMES.get(t.dtype, t.dtype)} and {_DTYPE_NAMES.get(p.dtype, p.dtype)}"
        )
    return t


_DTYPE_NAMES = {
    torch.float64: "Double",
    torch.float32: "Float",
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
}


T = torch.Tensor


@register_route(torch.matmul, T.matmul, T.__matmul__, always=True)
def _route_matmul(func, args, kwargs):
    return NotImplemented if kwargs or len(args) != 2 else _matmul(*args)


@register_route(T.__rmatmul__, always=True)
def _route_rmatmul(func, args, kwargs):
    return NotImplemented if kwargs or len(args) != 2 else _matmul(args[1], args[0])


@register_route(torch.mm, T.mm, torch.bmm, T.bmm, torch.mv, T.mv, torch._C._sparse._sparse_mm)
def _route_mm(func, args, kwargs):
    """``mm``/``bmm`` need 2-d/3-d operands of equal batch, ``mv`` a matrix and a vector;
    ``torch.sparse.mm`` on a SparseTensor is ``mm`` (dense semantics)."""
    if kwargs or len(args) != 2:
        return NotImplemented
    a, b = args
    name = func.__name__
    need = (3, 3) if name == "bmm" else (2, 1) if name == "mv" else (2, 2)
    if not _dims_are(a, b, *need) or name == "bmm" and a.shape[0] != b.shape[0]:
        return NotImplemented
    with _autocast_as_dense(name, a):
        return _matmul(a, b)


@register_route(torch.addmm, T.addmm, torch.addmv, T.addmv, torch.baddbmm, T.baddbmm)
def _route_addmm(func, args, kwargs):
    """``beta * input + alpha * (m1 @ m2)`` (``input`` ignored when ``beta == 0``, as torch)."""
    if len(args) != 3 or set(kwargs) - {"beta", "alpha"}:
        return NotImplemented
    inp, m1, m2 = args
    name = func.__name__
    need = (3, 3) if name == "baddbmm" else (2, 1) if name == "addmv" else (2, 2)
    if not _dims_are(m1, m2, *need) or name == "baddbmm" and m1.shape[0] != m2.shape[0]:
        return NotImplemented
    with _autocast_as_dense(name, m1):
        p = _matmul(m1, m2)
    if p is NotImplemented:
        return p
    inp = _autocast_added(inp, p)
    beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
    # torch's error for an input that does not broadcast
    torch.empty(inp.shape, device="meta").expand(p.shape)
    if alpha != 1:
        p = p * alpha
    return p if beta == 0 else p + (inp if beta == 1 else inp * beta)


@register_route(torch.nn.functional.linear)
def _route_linear(func, args, kwargs):
    """``input @ weight^T + bias``: a sparse weight ``W`` as ``(W @ input^T)^T`` (no transposed
    copy)."""
    args = list(args) + [kwargs.get(k) for k in ("input", "weight", "bias")[len(args) :]]
    if len(args) != 3 or set(kwargs) - {"input", "weight", "bias"}:
        return NotImplemented
    x, W, bias = args
    if (
        not isinstance(x, torch.Tensor)
        or not isinstance(W, torch.Tensor)
        or W.dim() != 2
        or x.dim() < 1
    ):
        return NotImplemented
    if isinstance(W, SparseTensor) and not isinstance(x, SparseTensor):
        if x.shape[-1] != W.shape[1]:
            return NotImplemented
        x2 = x.reshape(math.prod(x.shape[:-1]), W.shape[1])  # (not -1: ambiguous for 0 elements)
        y = _matmul(W, x2.mT)
        if y is NotImplemented:
            return y
        y = y.mT.reshape(tuple(x.shape[:-1]) + (W.shape[0],))
    elif isinstance(x, SparseTensor) and not isinstance(W, SparseTensor) and x.dim() in (2, 3):
        y = _matmul(x, W.mT)
        if y is NotImplemented:
            return y
    else:
        return NotImplemented
    return y if bias is None else y + _autocast_added(bias, y)


@register_route(torch.einsum)
def _route_einsum(func, args, kwargs):
    """Two operands whose equation is a (batched) matrix product: transposes (permutes) of the
    operands and of the result around :func:`_matmul`.  The sparse operand ``S`` has letters ``r c``
    (2-d) or ``b r c`` in any order (3-d: ``b`` a batch letter, e.g. the heads of a hybrid ``(N, N,
    H)`` attention), the dense operand ``c s`` or ``b c s``; ``c`` is contracted.  A batch letter
    absent from the dense operand
    broadcasts it::

        einsum("ijh,jhd->ihd", P, X) == (P.permute(2, 0, 1) @ X.permute(1, 0, 2)).permute(1, 0, 2)
        einsum("ijh,jd->ihd", P, W)  == (P.permute(2, 0, 1) @ W).permute(1, 0, 2)

    (the batch letter a hybrid ``P``'s dense dim: :class:`HybridMM`, head by head; otherwise ``P``
    permuted so, a SparseTensor of no dense dims storing each stored slice's scalars, its gradient
    on that pattern read back at ``P``'s, see :func:`_within_scalar_pattern`)."""
    if kwargs or len(args) != 3 or not isinstance(args[0], str):
        return NotImplemented
    eq = args[0].replace(" ", "")
    if "..." in eq or eq.count("->") != 1 or eq.count(",") != 1:
        return NotImplemented
    ins, lo = eq.split("->")
    (la, ld), (S, D) = ins.split(","), args[1:]
    if isinstance(D, SparseTensor):
        (la, S), (ld, D) = (ld, D), (la, S)
    if (
        not isinstance(S, SparseTensor)
        or not isinstance(D, torch.Tensor)
        or isinstance(D, SparseTensor)
        or S.dim() != len(la)
        or D.dim() != len(ld)
    ):
        return NotImplemented
    roles = _einsum_roles(la, ld, lo, S)
    if roles is None:
        return NotImplemented
    b, r, c, s = roles
    X = D.permute([ld.index(x) for x in (b if b in ld else "") + c + s])
    # heads: a hybrid's dense dim
    if b and la.index(b) == 2 and S._sparse_ndim() == 2 and _eligible(S, X):
        Y = HybridMM.apply(S, X.expand((S.shape[2],) + tuple(X.shape[-2:])), la[:2] == r + c)
        return Y.permute([(b + r + s).index(x) for x in lo])
    A = S.permute([la.index(x) for x in b + r + c])
    Y = _matmul(A, X)  # (b, r, s)
    return Y if Y is NotImplemented else Y.permute([(b + r + s).index(x) for x in lo])


def _einsum_roles(la: str, ld: str, lo: str, S: SparseTensor):
    """``(b, r, c, s)``: the batch letter ('' for 2-d ``S``), ``S``'s row, the contracted and the
    dense operand's free letter of an einsum that is a (batched) matrix product, else None."""
    if (
        any(len(set(x)) != len(x) for x in (la, ld, lo))
        or len(la) not in (2, 3)
        or len(ld) not in (2, 3)
    ):
        return None
    shared = [x for x in la if x in ld]
    c = [x for x in shared if x not in lo]
    b = [x for x in shared if x in lo]
    s = [x for x in ld if x not in la]
    free = [x for x in la if x not in ld]
    if (
        len(c) != 1
        or len(s) != 1
        or len(b) + len(free) != len(la) - 1
        or len(b) > 1
        or sorted(lo) != sorted(set(la + ld) - set(c))
        or len(ld) != len(b) + 2
    ):
        return None
    # two free letters of S: the batch one is a dense dim of S where there is one
    if len(la) == 3 and not b:
        dense = [x for x in free if la.index(x) >= S._sparse_ndim()]
        b = dense[:1] or free[:1]
        free.remove(b[0])
    if len(free) != 1 or len(la) == 2 and b:
        return None
    return "".join(b), free[0], c[0], s[0]
