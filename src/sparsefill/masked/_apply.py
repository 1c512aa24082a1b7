"""Driver shared by every masked op on a sparse input: canonical mask, autograd, result building.

A *compute* function maps a :class:`~._canon.Masked` ``X`` to a :class:`Result` whose tensors
are differentiable functions of ``X.u`` and ``X.fill`` only.  :func:`run` calls it directly
when no gradient is needed, and otherwise inside :class:`MaskedFn`, whose backward is::

    grad_input = SparseTensor(pattern of X, d out / d u, fill 0)       when X.mfill is False
    grad_input = SparseTensor(pattern of X, d out / d u, fill (d out / d fill) / m)
        where X.mfill and pattern_grad_is_exact(input)
    grad_input = d dense_ref(input.to_dense()) / d input                otherwise (dense by nature)

The first line is exact: positions outside the pattern are masked out, so nothing depends on them.
In the second the ``m`` unspecified elements are masked in (``mask=None``): ``d out / d fill`` is
their total (for a normalization along a sparse dim from the fill classes, ``Result.classes``: the
value of the unspecified outputs of each slice, weighted by ``G`` summed over them,
:func:`class_sums`), ``O(stored + G)``; the mean is exact where only the pattern and the total are
read (the constructor).
"""

from __future__ import annotations

import dataclasses
import warnings

import torch

from sparsefill._tensor import parts as _convert
from sparsefill._kernels import index as _index
from sparsefill._autograd.functions import dense_grad, grad_parts, sum_outside
from sparsefill._kernels.trace import traced
from sparsefill._tensor.tensor import SparseTensor
from sparsefill.masked._canon import as_sparse, combine, is_sparse, mask_to_dense

__all__ = ["Result", "run", "dense_mask", "dense_fallback"]


@dataclasses.dataclass
class Result:
    """A dense result (``dense``) or the parts of a sparse one (COO indices over its sparse
    dims)."""

    dense: torch.Tensor | None = None
    idx: torch.Tensor | None = None
    vals: torch.Tensor | None = None
    fill: torch.Tensor | None = None
    shape: tuple = ()
    layout: torch.layout = torch.sparse_coo
    indefinite: bool = False
    like: SparseTensor | None = (
        None  # a coalesced tensor whose pattern, shape and layout the result shares
    )
    classes: tuple | None = (
        None  # (Slices, g, n, g0, n0): the values of the unspecified outputs per fill
    )
    # class (masked-in fills along a sparse dim, read by the backward)

    def tensors(self):
        return [self.dense] if self.dense is not None else [self.vals, self.fill]

    def build(self):
        if self.dense is not None:
            return self.dense
        fill = self.fill if not self.indefinite else self.vals.new_empty(0)
        if self.like is not None:  # the input's own index tensors (no CSR rebuild)
            L = self.like
            return _convert.rewrap(
                L,
                values=self.vals.reshape(L._vals.shape),
                fill=fill,
                indefinite=self.indefinite,
                known_zero=False,
            )
        layout = self.layout if self.idx.shape[0] >= 2 else torch.sparse_coo
        return _convert.parts_to_sparse(
            self.idx,
            self.vals,
            self.shape,
            fill,
            indefinite=self.indefinite,
            layout=layout,
            coalesced=True,
        )


def dense_mask(mask, input):
    """A strided bool mask for a strided ``input`` (None stays None)."""
    if mask is None:
        return None
    return mask_to_dense(mask, input.shape).clone() if is_sparse(mask) else mask


class MaskedFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, A, X, compute, dense_ref):
        with torch.enable_grad():
            u = X.u.detach().requires_grad_()
            f = X.fill.detach().requires_grad_()
            res = compute(dataclasses.replace(X, u=u, fill=f))
        ctx.X, ctx.u, ctx.f, ctx.res, ctx.dense_ref = X, u, f, res, dense_ref
        built = Result(
            **{
                **res.__dict__,
                "dense": None if res.dense is None else res.dense.detach(),
                "vals": None if res.vals is None else res.vals.detach(),
                "fill": None if res.fill is None else res.fill.detach(),
            }
        ).build()
        ctx.out_pattern = None
        if isinstance(built, SparseTensor):  # the pattern of res.vals (a CSR build may pad batches)
            ctx.out_pattern = (
                built
                if res.like is not None
                else _convert.parts_to_sparse(
                    res.idx,
                    res.vals.detach(),
                    res.shape,
                    built._fill,
                    indefinite=res.indefinite,
                    layout=torch.sparse_coo,
                    coalesced=True,
                )
            )
        return built

    @staticmethod
    def backward(ctx, G):
        X, res = ctx.X, ctx.res
        # masked-in unspecified elements: gradients differ per slice
        if X.mfill and not _native_fill_grad(ctx):
            _convert.check_densify_quiet(
                X.A, "the backward of a masked op with masked-in unspecified elements"
            )
            with torch.enable_grad():
                x = _convert.dense_of(_convert.rewrap(X.A)).requires_grad_()
                out = ctx.dense_ref(x)
            g = G.to_dense() if isinstance(G, SparseTensor) else G
            (gx,) = torch.autograd.grad(out, x, g, allow_unused=True)  # a fresh graph each call
            return (torch.zeros_like(x) if gx is None else gx), None, None, None
        if res.dense is not None:
            outs, grads = [res.dense], [G.to_dense() if isinstance(G, SparseTensor) else G]
        else:
            gv, gf = grad_parts(G, ctx.out_pattern)
            outs, grads = [res.vals], [gv.reshape(res.vals.shape)]
            P = ctx.out_pattern
            stored = _index.numel(P._vals.shape[: P._vals.dim() - P.dense_dim()])
            traced_nse = traced(gv)  # (compiled: nse may be unbacked, the comparison a 0-d tensor)
            free = True if traced_nse else _index.numel(P._sparse_shape) > stored
            # (read by no output: not differentiated)
            if gf is not None and res.fill.requires_grad and free:
                gf = gf.expand(res.fill.shape) if gf.shape != res.fill.shape else gf
                if traced_nse:
                    some = (
                        torch.scalar_tensor(_index.numel(P._sparse_shape), device=gf.device)
                        > stored
                    )
                    gf = torch.where(some, gf, torch.zeros((), dtype=gf.dtype, device=gf.device))
                outs.append(res.fill)
                grads.append(gf)
            # the unspecified outputs, per fill class: G summed there
            if X.mfill and res.classes is not None:
                sl, g, n, g0, n0 = res.classes
                for o, gs, cnt in zip((g, g0), class_sums(G, X, sl), (n, n0)):
                    if o is not None and o.requires_grad and bool((cnt > 0).any()):
                        outs.append(o)
                        grads.append(
                            torch.where(cnt > 0, gs.to(o.dtype), torch.zeros((), dtype=o.dtype))
                        )
        pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad]
        leaves = [ctx.u, ctx.f] if X.mfill else [ctx.u]
        got = [None] * len(leaves)
        if pairs:
            got = list(
                torch.autograd.grad(
                    [o for o, _ in pairs],
                    leaves,
                    [g for _, g in pairs],
                    allow_unused=True,
                    retain_graph=True,
                )
            )
        gu = torch.zeros_like(ctx.u) if got[0] is None else got[0]
        fill = gu.new_zeros(())
        # the unspecified elements' total, as their mean (exact for the constructor:
        # _native_fill_grad)
        if X.mfill:
            n_free = _index.numel(X.S) - X.u.shape[0]
            if n_free and got[1] is not None:
                fill = got[1] / n_free
        zero = not X.mfill
        # the input's layout and index tensors (no merge downstream)
        if X.same_pattern and X.A._coalesced:
            gA = _convert.rewrap(
                X.A,
                values=gu.reshape(X.A._vals.shape),
                fill=fill,
                indefinite=False,
                known_zero=zero,
            )
        else:
            gA = _convert.parts_to_sparse(
                X.indices(),
                gu,
                X.A.shape,
                fill,
                known_zero=zero,
                layout=torch.sparse_coo,
                coalesced=True,
            )
        return gA, None, None, None


def _native_fill_grad(ctx) -> bool:
    """Masked-in unspecified elements (``mask=None`` on a defined fill): the gradient is computed on
    the pattern, exact there, with the *mean* over the unspecified elements as its fill (their total
    from the fill classes: ``O(stored + G)``); exact for every reader where
    ``linalg_autograd.pattern_grad_is_exact`` (the constructor reads the pattern and the total),
    otherwise the dense way (dense by nature: the gradient varies from slice to slice)."""
    res = ctx.res
    if res.dense is None and res.classes is None and not res.fill.requires_grad:
        # (the unspecified outputs' dependence on the fill is not recorded: a softmax-like fallback)
        return False
    from sparsefill.ops.linalg.backward import pattern_grad_is_exact

    return pattern_grad_is_exact(ctx.X.A)


def class_sums(G, X, sl):
    """``G`` (dense or SparseTensor, the input's shape) summed over the unspecified elements of
    ``X`` per output segment and fill class of ``sl`` (``(nseg, Pr)``), and over the slices holding
    no stored element (``(Pk, Pr)``): each term as it is (an inf stays inf), never a total less the
    stored part."""
    S, D = X.S, X.D
    idx = X.indices()
    keys = _index.linearize(idx, S)
    if isinstance(G, SparseTensor):
        if G._indefinite:  # (no output read its masked-out elements: 0)
            G = _convert.rewrap(G, fill=G._vals.new_zeros(()), indefinite=False, known_zero=True)
        if G._sparse_ndim() != len(S) or G.dense_dim() != len(D):
            G = dense_grad(G)
    # G off X's pattern: its stored elements there, X's positions at 0
    if isinstance(G, SparseTensor):
        gidx, gvals = _convert.coalesced_parts(G)
        off = ~_index.lookup(keys, _index.linearize(gidx, S))[1]
        z = gvals.new_zeros((idx.shape[1],) + D)
        Gm = _convert.parts_to_sparse(
            torch.cat([gidx[:, off], idx], 1),
            torch.cat([gvals[off], z]),
            G.shape,
            G._fill,
            known_zero=G._fill_is_zero(),
        )
    else:
        Gm = G.reshape((_index.numel(S),) + D).index_fill(0, keys, 0).reshape(G.shape)
    R = Gm.sum(sl.red_s)
    kept = [i for i in range(len(S)) if i not in sl.red_s]
    if kept:
        kshape = [S[i] for i in kept]
        touched = _convert.values_at(R, _index.linearize(sl.out_idx, kshape), len(kept))
        untouched = sum_outside(R, sl.out_idx, R.shape, D)
    else:  # one slice: touched (S_out 1) or not
        touched = (R.to_dense() if isinstance(R, SparseTensor) else R).reshape((1,) + D)[: sl.S_out]
        untouched = torch.zeros(D, dtype=touched.dtype, device=touched.device)
    return sl.scalars(touched).reshape(sl.nseg, sl.Pr), sl.scalars(untouched[None]).reshape(
        sl.Pk, sl.Pr
    )


def run(input, mask, compute, dense_ref, zero_absorbs=False, counts=False):
    """``compute(combine(input, mask))`` built into a result, with autograd when ``input`` needs it.
    ``counts``: see :func:`._canon.combine` (without autograd: counted fills would need gradients
    too)."""
    A = as_sparse(input)
    grad = torch.is_grad_enabled() and A.requires_grad
    # dropped zeros still have gradients
    X = combine(A, mask, zero_absorbs and not grad, counts and not grad)
    if grad:
        return MaskedFn.apply(A, X, compute, dense_ref)
    with torch.no_grad():
        return compute(X).build()


def dense_fallback(input, mask, dense_op):
    """A result that is dense by nature (e.g. softmax along a sparse dim with every element masked
    in): computed on the dense equivalent (no DensifyWarning; the densify policy's byte limit
    applies) and returned in the input's layout."""
    A = as_sparse(input)
    _convert.check_densify_quiet(A, "a masked normalization with masked-in unspecified elements")
    x = A.to_dense()
    m = None if mask is None else mask_to_dense(mask, A.shape)
    out = dense_op(x, m)
    from sparsefill._compile.dynamo import every_element
    from sparsefill._kernels.trace import traced

    # torch.compile: every element stored (to_sparse's nse would be read from the data)
    if traced(out):
        return every_element(out, A._sf_layout, A.dense_dim())
    from sparsefill._creation.constructors import to_sparse

    return to_sparse(out, layout=A._sf_layout, dense_dim=A.dense_dim())


def check_dtype_as_torch_masked(probe, input, mask) -> None:
    """``torch.masked``'s dtype errors for integer and bool inputs, which some of its ops refuse
    (softmax and normalize of int64, amax of bool with a mask; they run on the masked-in values):
    ``probe(x, m)`` (the op on a dense ``x`` and mask ``m``) on one element of ``input``'s dtype,
    masked in where ``input`` is masked (a mask given, or an indefinite fill).  The sparse path
    reads no dtype there and would return a result."""
    if input.dtype.is_floating_point or input.dtype.is_complex:
        return
    x = torch.zeros([min(n, 1) for n in input.shape], dtype=input.dtype, device=input.device)
    masked = mask is not None or (isinstance(input, SparseTensor) and input._indefinite)
    with warnings.catch_warnings():  # (one element: a variance's degrees of freedom warn)
        warnings.simplefilter("ignore")
        probe(x, torch.ones(x.shape, dtype=torch.bool, device=x.device) if masked else None)
