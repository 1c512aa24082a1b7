"""Every backward on an indefinite fill, and softmax's backward on the pattern.

An indefinite fill masks out the unspecified elements: they do not exist, so the gradient of the
constructor's ``values`` is the dense masked computation's gradient read at the pattern::

    grad(values) of op(A, ...) == grad(x[P]) of op(x[P], other[P], ...)        (P: A's pattern)

* the OpInfo sweep: every element-wise op of PyTorch's OpInfo database (``unary_ufuncs``,
  ``binary_ufuncs``) with autograd and float64, every float64 sample (0-d and empty inputs included),
  its input an indefinite-fill SparseTensor (COO; CSR for 2-d inputs; and beside a second
  indefinite operand of the input's rank), the upstream gradient a random indefinite-fill SparseTensor
  on the result's pattern (and, ``coo-sum``, a masked sum ``(out * W).real.sum()``, whose reduction
  gives the upstream gradient); the dense operands' gradients too.  The reference gathers every operand at
  the result's pattern (it never reads a masked-out element).  Outcomes are printed at the end of the
  run (``native``: no DensifyWarning forward or backward; ``densify``: right, but densified;
  ``declared``: see ``DECLARED``; ``n/a``: with the reason);
* the GAT chain ``masked.softmax(F.leaky_relu(S, 0.2), 1) @ Wh`` (and ``relu``, ``exp``,
  ``torch.softmax``) on COO and CSR;
* ``torch.softmax``/``log_softmax`` backward (``aten._softmax_backward_data``) on definite fills
  (against dense) and indefinite fills (against the dense masked computation, ``-inf`` off the
  pattern), dense, SparseTensor and indefinite upstream gradients, under
  ``densify_policy("raise")`` where the gradient is sparse by nature; float32/float64;
* ``sparsefill.masked.softmax``/``log_softmax`` backward against ``torch.masked``;
* ``amax``/``amin`` on an indefinite fill, ``maximum``/``minimum``/``fmax``/``fmin`` with no DensifyWarning;
* the losses of a masked model (``A.exp().sum()``, ``A.amax(1).sum()``, ``torch.softmax(A, 1)``...).
"""

from __future__ import annotations

import collections
import functools
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.testing._internal.common_methods_invocations import binary_ufuncs, unary_ufuncs
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

import sparsefill
from sparsefill import SparseTensor

COO, CSR = torch.sparse_coo, torch.sparse_csr
I = sparsefill.indefinite
F64, F32 = torch.float64, torch.float32
REPORT: dict = collections.defaultdict(collections.Counter)  # op name -> Counter of outcomes
# op name -> (reason, what is checked instead)
DECLARED = {
    "nn.functional.prelu": (
        "the weight is per channel (dim 1), not broadcast element-wise: the reference is the "
        "dense op on the input with its masked-out elements kept, read at the pattern "
        "(the weight's gradient: the upstream gradient is 0 off the pattern)",
        "dense-ref",
    ),
    "nn.functional.rrelu": (
        "in training mode each element draws its own slope: the forward densifies, and on an "
        "indefinite fill it raises ValueError (the masked-out elements have no value to draw "
        "for); evaluation mode is leaky_relu, checked as every op",
        "forward-raises",
    ),
}
ELEMENTWISE = [
    op
    for op in unary_ufuncs + binary_ufuncs
    if op.supports_autograd and op.supports_dtype(F64, "cpu")
]


def _name(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


class _Summary:
    """Prints :data:`REPORT` in the terminal summary (registered as a plugin when this module runs)."""

    def pytest_terminal_summary(self, terminalreporter):
        if not REPORT:
            return
        tr, per_op, total = terminalreporter, collections.Counter(), collections.Counter()
        for name, c in REPORT.items():
            for k, v in c.items():
                total[k.split(":")[0]] += v
            kinds = {k.split(":")[0] for k in c}
            per_op[
                "densify"
                if "densify" in kinds
                else "native"
                if "native" in kinds
                else "declared"
                if "declared" in kinds
                else "n/a"
            ] += 1
        tr.section("sparsefill backward on indefinite fills (element-wise OpInfo sweep)")
        tr.write_line(f"ops: {dict(per_op)}; (op, variant, sample) outcomes: {dict(total)}")
        na = collections.Counter()
        for c in REPORT.values():
            na.update({k[5:]: v for k, v in c.items() if k.startswith("n/a: ")})
        tr.write_line(f"n/a samples by reason: {dict(na)}")
        dens = sorted(name for name, c in REPORT.items() if "densify" in c)
        tr.write_line(f"densify in forward or backward ({len(dens)}): {', '.join(dens) or 'none'}")
        for name, (reason, _) in DECLARED.items():
            tr.write_line(f"  declared {name}: {reason}")


@pytest.fixture(scope="module", autouse=True)
def _summary(request):
    pm = request.config.pluginmanager
    if not pm.has_plugin("sparsefill-backward-indefinite"):
        pm.register(_Summary(), "sparsefill-backward-indefinite")


# ---------------------------------------------------------------------- the OpInfo sweep
def _indefinite(x, g, layout):
    """``(A, values leaf, pattern mask)``: ~60% of ``x``'s elements stored, the rest masked out (a 0-d ``x``:
    its element stored)."""
    mask = torch.rand(x.shape, generator=g) < 0.6 if x.dim() else torch.tensor(True)
    v = x.detach()[mask].clone().requires_grad_()
    A = sparsefill.sparse_coo_tensor(mask.nonzero().T, v, x.shape, fill_value=I)
    return (A.to_sparse_csr() if layout is CSR else A), v, mask


def _pattern_mask(out: SparseTensor) -> torch.Tensor:
    idx, _ = out._coo_parts()
    m = torch.zeros(out.shape, dtype=torch.bool)
    m[tuple(idx)] = True
    return m


def _at(t, shape, omask, always=False):
    """A tensor operand of the reference: gathered at the result's pattern (0-d tensors stay scalars unless
    ``always``)."""
    return (
        t.broadcast_to(shape)[omask] if isinstance(t, torch.Tensor) and (t.dim() or always) else t
    )


def _close(a, b, what):
    assert (a is None) == (b is None), f"{what}: one gradient is None"
    if a is not None:
        assert type(a) is torch.Tensor, (
            f"{what}: a dense leaf's gradient must be dense, got {type(a)}"
        )
        torch.testing.assert_close(
            a, b, equal_nan=True, rtol=1e-6, atol=1e-8, msg=lambda m: f"{what}: {m}"
        )


def _reference(op, xd, ref, spec, out, omask, seed, k, whole):
    """Backward of the dense masked computation: every operand gathered at the result's pattern (or, for
    ``whole`` and where gathering changes the call, e.g. a ``memory_format``, the op on the whole dense
    operands with the upstream gradient 0 off the pattern: the same for an element-wise op's input).
    ``seed(y, gathered)`` runs the backward from ``y``."""

    def pick(o):
        return o[k] if isinstance(o, tuple) else o

    if not whole:
        try:
            r_args, r_kwargs = tree_map(
                lambda t: _at(t, out.shape, omask), tree_unflatten(ref, spec)
            )
            y = pick(op.op(_at(xd, out.shape, omask, True), *r_args, **r_kwargs))
        except RuntimeError:
            whole = True
        else:
            return seed(y, True)
    r_args, r_kwargs = tree_unflatten(ref, spec)
    seed(pick(op.op(xd, *r_args, **r_kwargs)), False)


def _seed(loss, W, omask, y, gathered):
    Wm = W[omask] if gathered else torch.where(omask, W, 0)
    if loss == "sum":
        (y * Wm).real.sum().backward()
    else:
        y.backward(Wm)


def _run_sample(op, s, si, layout, two, loss):
    """One sample: ``None`` (checked) or the reason it does not apply."""
    if not (isinstance(s.input, torch.Tensor) and s.input.dtype == F64):
        return "input is not a float64 tensor"
    if layout is CSR and s.input.dim() != 2:
        return "CSR needs a 2-d input"
    g = torch.Generator().manual_seed(si)
    A, v, mask = _indefinite(s.input, g, layout)
    flat, spec = tree_flatten((s.args, s.kwargs))
    dense = [
        t.detach().clone().requires_grad_() if isinstance(t, torch.Tensor) and t.dtype == F64 else t
        for t in flat
    ]
    ref = [
        t.detach().clone().requires_grad_()
        if isinstance(t, torch.Tensor) and t.requires_grad
        else t
        for t in dense
    ]
    second = {}
    if two:
        for i, t in enumerate(dense):
            if isinstance(t, torch.Tensor) and t.requires_grad and t.dim() == s.input.dim():
                B, vb, mb = _indefinite(t, g, layout)
                second[i], dense[i] = (vb, mb), B
        if not second:
            return "no float64 tensor argument of the input's rank"
    args, kwargs = tree_unflatten(dense, spec)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always", sparsefill.DensifyWarning)
        try:
            outs = op.op(A, *args, **kwargs)
        except ValueError as e:
            if DECLARED.get(op.name, ("", ""))[1] == "forward-raises" and "indefinite" in str(e):
                return "declared"
            raise
        k, out = next(
            (
                (k, o)
                for k, o in enumerate(outs if isinstance(outs, tuple) else (outs,))
                if isinstance(o, SparseTensor) and (o.dtype.is_floating_point or o.dtype.is_complex)
            ),
            (None, outs),
        )
        if k is None:
            return f"no differentiable SparseTensor result ({type(outs).__name__})"
        assert out.is_fill_indefinite()
        omask = _pattern_mask(out)
        W = torch.randn(out.shape, dtype=out.dtype, generator=g)
        if loss == "sum":  # a masked sum: the reduction's backward gives the upstream gradient
            (out * W).real.sum().backward()
        else:  # an indefinite upstream gradient on the result's pattern
            G = sparsefill.sparse_coo_tensor(omask.nonzero().T, W[omask], out.shape, fill_value=I)
            out.backward(G.to_sparse_csr() if out.sparse_layout is CSR else G)
        densified = any(issubclass(x.category, sparsefill.DensifyWarning) for x in w)
    xd = s.input.detach().clone().requires_grad_()
    whole = DECLARED.get(op.name, ("", ""))[1] == "dense-ref"
    try:
        _reference(
            op, xd, ref, spec, out, omask, functools.partial(_seed, loss, W, omask), k, whole
        )
    except RuntimeError as e:
        if "not implemented for" in str(e):
            return f"the dense reference has no backward: {str(e)[:60]}"
        raise
    _close(v.grad, xd.grad[mask], "grad of values")
    for i, (a, b) in enumerate(zip(dense, ref)):
        if i in second:
            _close(
                second[i][0].grad,
                b.grad[second[i][1]],
                f"grad of the second operand's values (arg {i})",
            )
        elif isinstance(a, torch.Tensor) and a.requires_grad:
            _close(a.grad, b.grad, f"grad of dense arg {i}")
    return "declared" if op.name in DECLARED else "densify" if densified else "native"


@pytest.mark.parametrize("variant", ["coo", "csr", "coo-two", "coo-sum"])
@pytest.mark.parametrize("op", ELEMENTWISE, ids=[_name(op) for op in ELEMENTWISE])
def test_elementwise_backward_on_an_indefinite_fill(op, variant):
    layout, two, loss = (
        (CSR if variant == "csr" else COO),
        variant.endswith("two"),
        variant.split("-")[-1],
    )
    checked = 0
    for si, s in enumerate(op.sample_inputs("cpu", F64, requires_grad=False)):
        try:
            with torch.no_grad():
                op.op(s.input, *s.args, **s.kwargs)  # the dense op accepts the sample
        except Exception:
            REPORT[_name(op)][f"n/a: dense op rejects the sample ({variant})"] += 1
            continue
        outcome = _run_sample(op, s, si, layout, two, loss)
        key = (
            outcome
            if outcome in ("native", "densify", "declared")
            else f"n/a: {outcome} ({variant})"
        )
        REPORT[_name(op)][key] += 1
        checked += key in ("native", "densify", "declared")
    assert checked or variant != "coo", f"{_name(op)}: no sample checked on COO"


# ---------------------------------------------------------------------- the GAT chain
def _edges(n, nse, g):
    keys = torch.randperm(n * n, generator=g)[:nse].sort().values
    return torch.stack([keys // n, keys % n])


ACTS = {"leaky_relu": lambda s: F.leaky_relu(s, 0.2), "relu": F.relu, "exp": torch.exp}


@pytest.mark.parametrize("dtype", [F64, F32], ids=str)
@pytest.mark.parametrize("norm", ["masked.softmax", "torch.softmax", "torch.log_softmax"])
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("layout", [COO, CSR], ids=["coo", "csr"])
def test_attention_chain(layout, act, norm, dtype):
    """``norm(act(S), 1) @ Wh`` on edge scores with an indefinite fill, no DensifyWarning, against the dense
    masked computation (``-inf`` off the edges)."""
    n, d, nse = 30, 4, 150
    g = torch.Generator().manual_seed(3)
    idx = _edges(n, nse, g)
    s0, Wh0 = (
        torch.randn(nse, dtype=dtype, generator=g),
        torch.randn(n, d, dtype=dtype, generator=g),
    )
    s, Wh = s0.clone().requires_grad_(), Wh0.clone().requires_grad_()
    fn = {
        "masked.softmax": sparsefill.masked.softmax,
        "torch.softmax": torch.softmax,
        "torch.log_softmax": torch.log_softmax,
    }[norm]
    with sparsefill.densify_policy("raise"):
        S = sparsefill.sparse_coo_tensor(idx, s, (n, n), fill_value=I)
        S = S.to_sparse_csr() if layout is CSR else S
        out = fn(ACTS[act](S), 1) @ Wh
        out.square().sum().backward()
    sd, Whd = s0.clone().requires_grad_(), Wh0.clone().requires_grad_()
    dense = torch.full((n, n), -torch.inf, dtype=dtype).index_put((idx[0], idx[1]), ACTS[act](sd))
    P = torch.zeros(n, n, dtype=torch.bool).index_put((idx[0], idx[1]), torch.tensor(True))
    y = torch.where(P, (torch.log_softmax if "log" in norm else torch.softmax)(dense, 1), 0)
    (y @ Whd).square().sum().backward()
    tol = (
        {} if dtype == F64 else dict(rtol=1e-3, atol=1e-4)
    )  # (exp of float32 scores: summation order)
    torch.testing.assert_close(s.grad, sd.grad, **tol)
    torch.testing.assert_close(Wh.grad, Whd.grad, **tol)


# ---------------------------------------------------------------------- softmax / log_softmax backward
class Leaf:
    """``values`` (and ``fill``) leaves of a SparseTensor of ``shape``; ``dense()`` the same as a dense leaf."""

    def __init__(self, shape, fill, *, dense_dim=0, layout=COO, dtype=F64, seed=0, density=0.5):
        g = torch.Generator().manual_seed(seed)
        S, D = shape[: len(shape) - dense_dim], shape[len(shape) - dense_dim :]
        self.mask = torch.rand(S, generator=g) < density
        self.idx = self.mask.nonzero().T
        self.v0 = torch.randn((self.idx.shape[1],) + tuple(D), dtype=dtype, generator=g)
        self.f0 = (
            None
            if fill is I
            else (
                torch.randn(D, dtype=dtype, generator=g)
                if fill == "array"
                else torch.tensor(fill, dtype=dtype)
            )
        )
        self.shape, self.layout, self.dtype, self.D = shape, layout, dtype, tuple(D)

    def sparse(self):
        self.v = self.v0.clone().requires_grad_()
        self.f = None if self.f0 is None else self.f0.clone().requires_grad_()
        A = sparsefill.sparse_coo_tensor(
            self.idx, self.v, self.shape, fill_value=I if self.f is None else self.f
        )
        return A.to_sparse_csr() if self.layout is CSR else A

    def dense(self, masked_as=-torch.inf):
        """The dense leaf: the fill (``masked_as`` for an indefinite one: masked) off the pattern."""
        base = (
            torch.full(self.shape, masked_as, dtype=self.dtype)
            if self.f0 is None
            else self.f0.expand(self.shape).clone()
        )
        base[tuple(self.idx)] = self.v0
        return base.requires_grad_()


def _upstream(kind, out_shape, pattern, dtype, g):
    """The upstream gradient: dense, or a SparseTensor on ``pattern`` (fill 0.25, or indefinite)."""
    if kind == "dense":
        return torch.randn(out_shape, dtype=dtype, generator=g)
    vals = torch.randn(
        (pattern.shape[1],) + tuple(out_shape[pattern.shape[0] :]), dtype=dtype, generator=g
    )
    return sparsefill.sparse_coo_tensor(
        pattern, vals, out_shape, fill_value=I if kind == "indefinite" else 0.25
    )


def _dense_upstream(G, masked):
    if not isinstance(G, SparseTensor):
        return G
    return G.to_dense(fill_value=0.0) if G.is_fill_indefinite() else G.to_dense()


SOFTMAX_CASES = {  # name: (shape, dense_dim, dim, fill)
    "2d dim1": ((6, 7), 0, 1, I),
    "2d dim0": ((6, 7), 0, 0, I),
    "2d dim-1": ((6, 7), 0, -1, I),
    "3d dim1": ((3, 5, 4), 0, 1, I),
    "hybrid sparse dim": ((6, 5, 3), 1, 1, I),
    "hybrid dense dim": ((6, 5, 3), 1, 2, I),
    "1d fill": ((9,), 0, 0, 0.5),
    "1d zero fill": ((9,), 0, 0, 0.0),
    "hybrid 1 sparse dim, array fill": ((7, 3), 1, 0, "array"),
    "hybrid dense dim, array fill": ((6, 5, 3), 1, 2, "array"),
    "2d fill (dense by nature)": ((6, 7), 0, 1, 1.5),
    "empty pattern 1d": ((5,), 0, 0, -0.5),
}


# CSR where the case has exactly 2 sparse dims (a batched CSR with an indefinite fill needs equal nse per batch)
SOFTMAX_LAYOUTS = [
    (c, lay)
    for c, (shape, dd, _, _) in SOFTMAX_CASES.items()
    for lay in ([COO, CSR] if len(shape) - dd == 2 else [COO])
]


@pytest.mark.parametrize("dtype", [F64, F32], ids=str)
@pytest.mark.parametrize("upstream", ["dense", "sparse", "indefinite"])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize(
    "case,layout",
    SOFTMAX_LAYOUTS,
    ids=[f"{c}-{'csr' if lay is CSR else 'coo'}" for c, lay in SOFTMAX_LAYOUTS],
)
def test_softmax_backward(case, layout, log, upstream, dtype):
    shape, dense_dim, dim, fill = SOFTMAX_CASES[case]
    density = 0.0 if case.startswith("empty") else 0.5
    L = Leaf(
        shape,
        fill,
        dense_dim=dense_dim,
        dtype=dtype,
        seed=len(case),
        density=density,
        layout=layout,
    )
    fn = torch.log_softmax if log else torch.softmax
    A = L.sparse()
    sparse_by_nature = (
        fill is I or len(shape) - dense_dim == 1 or dim % len(shape) >= len(shape) - dense_dim
    )
    policy = "raise" if sparse_by_nature and upstream != "dense" or fill is I else "allow"
    with sparsefill.densify_policy(policy):
        out = fn(A, dim)
        pattern = out._coo_parts()[0] if isinstance(out, SparseTensor) else L.idx
        G = _upstream(upstream, out.shape, pattern, dtype, torch.Generator().manual_seed(7))
        out.backward(G)
    xd = L.dense()
    yd = fn(xd, dim)
    Gd = _dense_upstream(G, fill is I)
    if fill is I:  # masked: only the pattern's elements exist
        Gd = torch.where(_pattern_mask(out) if isinstance(out, SparseTensor) else L.mask, Gd, 0)
        yd = torch.where(torch.isnan(yd), 0, yd)  # (an all-masked slice: no element of it is read)
    yd.backward(Gd)
    tol = {} if dtype == F64 else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(L.v.grad, xd.grad[tuple(L.idx)], equal_nan=True, **tol)
    if L.f is not None:
        off = ~L.mask
        want = xd.grad[off].sum(0) if off.any() else torch.zeros(L.D, dtype=dtype)
        torch.testing.assert_close(L.f.grad, want.sum_to_size(L.f.shape), equal_nan=True, **tol)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("layout", [COO, CSR], ids=["coo", "csr"])
def test_softmax_backward_gradient_is_sparse(layout, log):
    """The gradient of an indefinite input through softmax is an indefinite SparseTensor on its pattern
    (``_softmax_backward_data`` runs natively: no DensifyWarning, nothing O(numel))."""
    L = Leaf((40, 50), I, layout=layout, density=0.1)
    A = L.sparse().detach().requires_grad_()
    with sparsefill.densify_policy("raise"):
        out = (torch.log_softmax if log else torch.softmax)(A, 1)
        out.backward(
            _upstream(
                "indefinite", out.shape, out._coo_parts()[0], F64, torch.Generator().manual_seed(1)
            )
        )
    assert isinstance(A.grad, SparseTensor) and A.grad.is_fill_indefinite()
    assert A.grad._nse() == A._nse()


def test_softmax_backward_direct_call():
    """``aten._softmax_backward_data`` called on SparseTensors (as torch's formula does): the result's
    dtype is ``input_dtype``; a dense ``y`` with a SparseTensor gradient is dense by nature."""
    L = Leaf((4, 6), I)
    A = L.sparse().detach()
    y = torch.softmax(A, 1)
    g = sparsefill.sparse_coo_tensor(
        y._coo_parts()[0], torch.ones(y._nse(), dtype=F64), y.shape, fill_value=I
    )
    r = torch.ops.aten._softmax_backward_data(g, y, 1, F32)
    assert isinstance(r, SparseTensor) and r.dtype == F32 and r.is_fill_indefinite()
    torch.testing.assert_close(
        r.values(), torch.zeros(y._nse(), dtype=F32), atol=1e-6, rtol=0
    )  # g = 1: sum 1
    yd = torch.softmax(torch.randn(4, 6, dtype=F64), 1)
    gs = sparsefill.sparse_coo_tensor(
        [[0, 2], [1, 3]], [1.0, -2.0], (4, 6), fill_value=0.5, dtype=F64
    )
    torch.testing.assert_close(
        torch.ops.aten._softmax_backward_data(gs, yd, 1, F64),
        torch.ops.aten._softmax_backward_data(gs.to_dense(), yd, 1, F64),
    )


# ---------------------------------------------------------------------- amax/amin, maximum/minimum
@pytest.mark.parametrize("layout", [COO, CSR], ids=["coo", "csr"])
@pytest.mark.parametrize("fn", ["amax1", "amin0", "amax", "amax(0,1)"])
def test_amax_amin_on_an_indefinite_fill(fn, layout):
    """Masked: the maxima among the stored elements share the gradient (ties: evenly, as torch)."""
    L = Leaf((6, 5), I, layout=layout)
    L.v0 = L.v0.round()  # ties
    f = {
        "amax1": lambda a: a.amax(1),
        "amin0": lambda a: a.amin(0),
        "amax": lambda a: a.amax(),
        "amax(0,1)": lambda a: a.amax((0, 1)),
    }[fn]
    with sparsefill.densify_policy("raise"):
        out = f(L.sparse())
        G = torch.randn(out.shape, dtype=F64, generator=torch.Generator().manual_seed(2))
        if isinstance(out, SparseTensor):  # (a slice with no stored element is masked out)
            G = sparsefill.sparse_coo_tensor(
                out._coo_parts()[0], G[tuple(out._coo_parts()[0])], out.shape, fill_value=I
            )
        out.backward(G)
    xd = L.dense(torch.inf if fn.startswith("amin") else -torch.inf)
    yd = f(xd)
    Gd = _dense_upstream(G, True)
    f(xd).backward(torch.where(torch.isinf(yd), 0, Gd))
    torch.testing.assert_close(L.v.grad, xd.grad[tuple(L.idx)])


MINMAX_CASES = {  # name: (fill of A, other)
    "indefinite, dense other": (I, "dense"),
    "indefinite, scalar tensor": (I, "scalar"),
    "indefinite, indefinite other": (I, "indefinite"),
    "fill, sparse other": (0.25, "sparse"),
    "fill, scalar tensor": (0.25, "scalar"),
    "ties": (0.0, "ties"),
}


@pytest.mark.parametrize("layout", [COO, CSR], ids=["coo", "csr"])
@pytest.mark.parametrize(
    "fn", [torch.maximum, torch.minimum, torch.fmax, torch.fmin], ids=lambda f: f.__name__
)
@pytest.mark.parametrize("case", list(MINMAX_CASES))
def test_maximum_minimum_backward(case, fn, layout):
    """``maximum``/``minimum`` backward runs on the pattern (``where``-like: no DensifyWarning) and equals the
    dense gradient (masked for indefinite fills); ties split the gradient evenly, as torch."""
    fill, other = MINMAX_CASES[case]
    L = Leaf((5, 6), fill, layout=layout, seed=4)
    g = torch.Generator().manual_seed(5)
    A = L.sparse()
    if other == "dense":
        o0 = torch.randn(5, 6, dtype=F64, generator=g)
    elif other == "scalar":
        o0 = torch.tensor(0.1, dtype=F64)
    else:
        M = Leaf((5, 6), I if other == "indefinite" else -0.5, layout=layout, seed=6)
        if other == "ties":
            M.idx, M.v0, M.mask = L.idx, L.v0.clone(), L.mask
            M.f0 = L.f0.clone()
    o = o0.clone().requires_grad_() if other in ("dense", "scalar") else M.sparse()
    with sparsefill.densify_policy("raise"):
        out = fn(A, o)
        kind = "indefinite" if out.is_fill_indefinite() else "sparse"
        G = _upstream(kind, out.shape, out._coo_parts()[0], F64, g)
        out.backward(G)
    xd = L.dense()
    od = o0.clone().requires_grad_() if other in ("dense", "scalar") else M.dense()
    mask = _pattern_mask(out) if fill is I else torch.ones(5, 6, dtype=torch.bool)
    Gd = torch.where(mask, _dense_upstream(G, True), 0)
    yd = fn(torch.where(mask, xd, 0), torch.where(mask, od, 0) if od.dim() else od)
    yd.backward(Gd)
    torch.testing.assert_close(L.v.grad, xd.grad[tuple(L.idx)])
    if L.f is not None:
        torch.testing.assert_close(L.f.grad, xd.grad[~L.mask].sum())
    if other in ("dense", "scalar"):
        assert type(o.grad) is torch.Tensor
        torch.testing.assert_close(o.grad, od.grad)
    else:
        torch.testing.assert_close(M.v.grad, od.grad[tuple(M.idx)])


@pytest.mark.parametrize("layout", [COO, CSR], ids=["coo", "csr"])
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("fill", [I, 0.0, 1.5], ids=str)
@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_masked_softmax_backward(fn, fill, dim, layout):
    """``sparsefill.masked.softmax``/``log_softmax`` with the pattern as mask (an indefinite fill: its own
    mask) backward without a DensifyWarning, equal to ``torch.masked``'s on the dense tensors at the
    masked-in elements (the values; the fill is never read)."""
    L = Leaf((6, 7), fill, layout=layout, seed=9)
    A = L.sparse()
    M = sparsefill.sparse_coo_tensor(
        L.idx, torch.ones(L.idx.shape[1], dtype=torch.bool), (6, 7), fill_value=False
    )
    W = torch.randn(6, 7, dtype=F64, generator=torch.Generator().manual_seed(3))
    with sparsefill.densify_policy("raise"):
        out = getattr(sparsefill.masked, fn)(A, dim, mask=None if fill is I else M)
        G = sparsefill.sparse_coo_tensor(L.idx, W[L.mask], (6, 7), fill_value=I)
        out.backward(G if out.is_fill_indefinite() else G.to_dense(fill_value=0.0))
    xd = L.dense(0.0)
    getattr(torch.masked, fn)(xd, dim, mask=L.mask).backward(torch.where(L.mask, W, 0))
    torch.testing.assert_close(L.v.grad, xd.grad[L.mask])
    if L.f is not None:
        torch.testing.assert_close(L.f.grad, torch.zeros((), dtype=F64))


REPROS = {  # losses of a masked model: name -> (loss of the SparseTensor, the same on the dense masked tensor)
    "exp().sum()": (lambda A: A.exp().sum(), lambda x, m: torch.where(m, x.exp(), 0).sum()),
    "amax(1).sum()": (
        lambda A: A.amax(1).sum(),
        lambda x, m: torch.where(m.any(1), x.amax(1), 0).sum(),
    ),
    "softmax(A, 1) * W": (
        lambda A: (torch.softmax(A, 1) * _W(A)).sum(),
        lambda x, m: torch.where(m, torch.softmax(x, 1) * _W(x), 0).sum(),
    ),
    "log_softmax(A, 1) * W": (
        lambda A: (torch.log_softmax(A, 1) * _W(A)).sum(),
        lambda x, m: torch.where(m, torch.log_softmax(x, 1) * _W(x), 0).sum(),
    ),
    "relu(A).exp().mean()": (
        lambda A: F.relu(A).exp().mean(),
        lambda x, m: torch.where(m, F.relu(x).exp(), 0).sum() / m.sum(),
    ),
}


def _W(t):
    return torch.linspace(-1, 1, t.numel(), dtype=t.dtype).reshape(t.shape)


@pytest.mark.parametrize("layout", [COO, CSR], ids=["coo", "csr"])
@pytest.mark.parametrize("name", list(REPROS))
def test_masked_model_losses(name, layout):
    """Each once raised in backward on an indefinite fill; now each runs natively (no DensifyWarning) and equals
    the dense masked computation (``-inf`` off the pattern, results read where defined)."""
    L = Leaf((6, 7), I, layout=layout, seed=11)
    L.mask[2] = False  # an empty row: masked out entirely
    L.idx = L.mask.nonzero().T
    L.v0 = torch.randn(L.idx.shape[1], dtype=F64, generator=torch.Generator().manual_seed(1))
    sparse_loss, dense_loss = REPROS[name]
    with sparsefill.densify_policy("raise"):
        sparse_loss(L.sparse()).backward()
    xd = L.dense()
    dense_loss(xd, L.mask).backward()
    torch.testing.assert_close(L.v.grad, xd.grad[L.mask])


def test_masked_sum_of_0d():
    """A 0-d tensor with indefinite fill: its one element stored (the reductions see it) or masked out (the
    reductions of nothing: torch.masked's identities)."""
    v = torch.tensor([0.7], dtype=F64, requires_grad=True)
    A = sparsefill.sparse_coo_tensor(torch.zeros((0, 1), dtype=torch.long), v, (), fill_value=I)
    A.sum().backward()
    torch.testing.assert_close(v.grad, torch.ones(1, dtype=F64))
    x, m = torch.tensor(0.7, dtype=F64), torch.tensor(True)
    for nse in (1, 0):
        A = sparsefill.sparse_coo_tensor(
            torch.zeros((0, nse), dtype=torch.long), v.detach()[:nse], (), fill_value=I
        )
        for name in ("sum", "mean", "amax", "amin", "prod"):
            got = getattr(torch, name)(A)
            assert got.shape == () and type(got) is torch.Tensor
            if nse:
                torch.testing.assert_close(got, getattr(torch, name)(x))
        for dim in (0, -1):
            for keep in (False, True):
                got = A.sum(dim, keepdim=keep)
                torch.testing.assert_close(
                    got, torch.masked.sum(x, dim, keepdim=keep, mask=m & bool(nse))
                )
