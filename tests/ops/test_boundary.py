"""The boundary rule (ops/registry.py).

* a torch native sparse operand, in every layout, is converted exactly (fill 0): element-wise ops and
  matrix products on either side equal the dense computation;
* an unknown tensor subclass, a native tensor the op writes to, a nested tensor: TypeError;
* an op whose schema does not mark what it writes (c10d collectives, in-place-named custom ops):
  NotImplementedError unless handled, nothing modified;
* the ``torch.sparse`` functions on SparseTensors: dense semantics for a definite fill, masked
  semantics (torch.sparse's own for unspecified elements) for an indefinite one;
* ``torch.matmul`` of every 1-D..4-D shape pair, sparse on either side;
* every indexing op on 0-d SparseTensors.
"""

from __future__ import annotations

import socket
import warnings

import pytest
import torch

import sparsefill
from sparsefill import SparseTensor
from sparsefill.ops import registry

NAN = float("nan")


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore"
        )  # DensifyWarning, "Sparse CSR tensor support is in beta state"
        yield


def dense(x, fill=None):
    """The dense tensor of any result: SparseTensor (``fill`` stands in for an indefinite one), native, strided."""
    if isinstance(x, SparseTensor):
        return x.to_dense(fill_value=fill) if x.is_fill_indefinite() else x.to_dense()
    return x.to_dense() if x.layout is not torch.strided else x


def close(got, ref, **kw):
    torch.testing.assert_close(dense(got, kw.pop("fill", None)), dense(ref), equal_nan=True, **kw)


def pattern_tensor(shape, *, density=0.4, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    vals = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    keep = torch.rand(shape, generator=g) < density
    return vals * keep, keep


def make(shape, fill, *, layout=torch.sparse_coo, seed=0, dtype=torch.float64):
    """A SparseTensor over a random pattern (its stored values are random, nonzero), and the pattern mask."""
    d, keep = pattern_tensor(shape, seed=seed, dtype=dtype)
    idx = keep.nonzero().T
    A = sparsefill.sparse_coo_tensor(idx, d[tuple(idx)], shape, fill_value=fill, dtype=dtype)
    return (A.to_sparse(layout=layout) if layout is not torch.sparse_coo else A), keep


def native(d, layout):
    """``d`` as a torch native sparse tensor of ``layout`` (uncoalesced COO: every element stored twice, halved)."""
    if layout == "coo_uncoalesced":
        c = d.to_sparse()
        return torch.sparse_coo_tensor(
            torch.cat([c._indices()] * 2, 1), torch.cat([c._values() / 2] * 2), d.shape
        )
    return {
        "coo": lambda: d.to_sparse(),
        "csr": lambda: d.to_sparse_csr(),
        "csc": lambda: d.to_sparse_csc(),
        "bsr": lambda: d.to_sparse_bsr((2, 2)),
        "bsc": lambda: d.to_sparse_bsc((2, 2)),
    }[layout]()


NATIVE = ["coo", "coo_uncoalesced", "csr", "csc", "bsr", "bsc"]
FILLS = [0.5, 0.0, NAN, []]  # [] = indefinite
LAYOUTS = [torch.sparse_coo, torch.sparse_csr]


# ---------------------------------------------------------------------- item 1: the reproduction
def test_native_operand_is_not_ignored():
    A = sparsefill.sparse_coo_tensor([[0, 1], [2, 0]], [1.0, 2.0], (2, 3), fill_value=0.5)
    nat = torch.sparse_coo_tensor([[0, 1], [1, 2]], [10.0, 20.0], (2, 3))
    close(A + nat, torch.tensor([[0.5, 10.5, 1], [2, 0.5, 20.5]]))
    close(A * nat, torch.tensor([[0.0, 5, 0], [0, 0, 10]]))
    close(nat + A, torch.tensor([[0.5, 10.5, 1], [2, 0.5, 20.5]]))
    assert isinstance(A + nat, SparseTensor) and isinstance(A * nat, SparseTensor)


# ---------------------------------------------------------------------- item 8: the reproductions
def test_native_operand_in_ops_on_both_sides():
    A = sparsefill.sparse_coo_tensor([[0, 1], [2, 0]], [1.0, 2.0], (2, 3), fill_value=0.5)
    nat = torch.sparse_coo_tensor([[0, 1], [1, 2]], [10.0, 20.0], (2, 3))
    Ad, nd = A.to_dense(), nat.to_dense()
    close(A + nat.to_sparse_csr(), Ad + nd)  # raised "Sparse CSR tensors do not have strides"
    close(nat @ A.t(), nd @ Ad.t())  # raised
    Ai = sparsefill.sparse_coo_tensor([[0, 1], [2, 0]], [1.0, 2.0], (2, 3), fill_value=[])
    nat_i = torch.sparse_coo_tensor(
        [[0, 1], [2, 0]], [1.0, 2.0], (2, 3)
    )  # the native tensor of Ai's pattern
    close(torch.sparse.sum(Ai, 1), torch.sparse.sum(nat_i, 1).to_dense(), fill=0.0)  # raised
    close(
        torch.sparse.softmax(Ai, 1), torch.sparse.softmax(nat_i, 1).to_dense(), fill=0.0
    )  # raised
    x = torch.randn(3, 2)
    close(torch.sparse.mm(Ai, x), torch.sparse.mm(nat_i, x))  # raised


# ---------------------------------------------------------------------- native operands: the layout grid
ELEMENTWISE = {
    "A+n": lambda a, n: a + n,
    "n+A": lambda a, n: n + a,
    "A*n": lambda a, n: a * n,
    "n*A": lambda a, n: n * a,
    "A-n": lambda a, n: a - n,
    "maximum": lambda a, n: torch.maximum(a, n),
    "add_alpha": lambda a, n: torch.add(a, n, alpha=2),
}


@pytest.mark.parametrize("nlayout", NATIVE)
@pytest.mark.parametrize("layout", LAYOUTS, ids=["coo", "csr"])
@pytest.mark.parametrize("fill", FILLS, ids=["f0.5", "f0", "fnan", "indefinite"])
@pytest.mark.parametrize("op", list(ELEMENTWISE))
def test_elementwise_native_operand(op, fill, layout, nlayout):
    f = ELEMENTWISE[op]
    A, keep = make((4, 6), fill, layout=layout)
    nd, _ = pattern_tensor((4, 6), seed=1)
    nat = native(nd, nlayout)
    out = f(A, nat)
    assert isinstance(out, SparseTensor)
    if (
        fill == []
    ):  # masked: specified exactly where A is, the op on A's values and n's elements there
        assert out.is_fill_indefinite()
        ref = torch.where(keep, f(A.to_dense(fill_value=0.0), nd), NAN)
        close(out, ref, fill=NAN)
    else:
        close(out, f(A.to_dense(), nd))
    assert torch.equal(dense(nat), nd)  # the native operand is unchanged


@pytest.mark.parametrize("nlayout", ["coo", "csr"])
def test_hybrid_native_operand(nlayout):
    d = torch.randn(4, 6, 3, dtype=torch.float64) * (torch.rand(4, 6, 1) < 0.5)
    nat = d.to_sparse(layout=getattr(torch, f"sparse_{nlayout}"), dense_dim=1)
    A = sparsefill.to_sparse(
        torch.randn(4, 6, 3, dtype=torch.float64) * (torch.rand(4, 6, 1) < 0.5),
        fill_value=torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64),
        dense_dim=1,
    )
    for f in (lambda a, n: a + n, lambda a, n: n * a):
        out = f(A, nat)
        assert isinstance(out, SparseTensor)
        close(out, f(A.to_dense(), d))


@pytest.mark.parametrize("nlayout", ["csr", "bsr"])
def test_batched_native_operand(nlayout):
    d = torch.zeros(3, 4, 6, dtype=torch.float64)
    d[:, ::2, 1::2] = torch.randn(
        3, 2, 3, dtype=torch.float64
    )  # the same nse per batch (torch's batched rule)
    nat = d.to_sparse_csr() if nlayout == "csr" else d.to_sparse_bsr((2, 2))
    A, _ = make((3, 4, 6), 0.25)
    close(A + nat, A.to_dense() + d)
    close(nat * A, d * A.to_dense())
    close(
        torch.bmm(A, nat.transpose(-1, -2).to_dense().to_sparse()),
        torch.bmm(A.to_dense(), d.transpose(-1, -2)),
    )


def test_native_operand_dtypes_and_0d():
    A, _ = make((4, 6), 3, dtype=torch.int64)
    d = torch.arange(24).view(4, 6) * (torch.arange(24).view(4, 6) % 5 == 0)
    for nlayout in ("coo", "csr"):
        close(A + native(d, nlayout), A.to_dense() + d)
        close(A * native(d, nlayout), A.to_dense() * d)
    F, _ = make((4, 6), 0.5)  # float64 beside a float32 native: torch's promotion
    n32 = d.float().to_sparse_csr()
    close(F * n32, F.to_dense() * d.float())
    i32 = torch.sparse_csr_tensor(
        n32.crow_indices().int(), n32.col_indices().int(), n32.values(), n32.shape
    )
    close(F + i32, F.to_dense() + d.float())  # int32 CSR indices
    B = sparsefill.sparse_coo_tensor(
        torch.zeros(0, 1, dtype=torch.int64), torch.tensor([2.0]), (), fill_value=0.0
    )
    n0 = torch.sparse_coo_tensor(torch.zeros(0, 1, dtype=torch.int64), torch.tensor([5.0]), ())
    close(B * n0, torch.tensor(10.0))
    E = sparsefill.full((0, 3), 1.0)
    close(E + torch.zeros(0, 3).to_sparse(), torch.ones(0, 3))


def test_native_operand_gradient_is_dense_semantics():
    A = sparsefill.sparse_coo_tensor(
        [[0, 1], [2, 0]], [1.0, 2.0], (2, 3), fill_value=0.5, dtype=torch.float64
    )
    nat = torch.sparse_coo_tensor(
        [[0, 1], [1, 2]], [10.0, 20.0], (2, 3), dtype=torch.float64
    ).requires_grad_()
    w = torch.randn(2, 3, dtype=torch.float64)
    (dense(A * nat) * w).sum().backward()
    close(nat.grad, w * A.to_dense())


MATMUL = {
    "A@n": lambda a, n: a @ n,
    "n@A": lambda a, n: n @ a,
    "mm(A,n)": lambda a, n: torch.mm(a, n),
    "mm(n,A)": lambda a, n: torch.mm(n, a),
    "sparse.mm(A,n)": lambda a, n: torch.sparse.mm(a, n),
    "sparse.mm(n,A)": lambda a, n: torch.sparse.mm(n, a),
    "matmul(A,n)": lambda a, n: torch.matmul(a, n),
    "addmm(A,n)": lambda a, n: torch.addmm(
        torch.ones(6, 6, dtype=torch.float64), a, n, beta=2.0, alpha=0.5
    ),
}


@pytest.mark.parametrize("nlayout", NATIVE)
@pytest.mark.parametrize("layout", LAYOUTS, ids=["coo", "csr"])
@pytest.mark.parametrize("fill", FILLS, ids=["f0.5", "f0", "fnan", "indefinite"])
@pytest.mark.parametrize("op", list(MATMUL))
def test_matmul_native_operand(op, fill, layout, nlayout):
    f = MATMUL[op]
    A, _ = make((6, 6), fill, layout=layout)
    nd, _ = pattern_tensor((6, 6), seed=2)
    out = f(A, native(nd, nlayout))
    Ad = (
        A.to_dense(fill_value=0.0) if fill == [] else A.to_dense()
    )  # masked: unspecified elements form no products
    close(out, f(Ad, nd), fill=0.0)


@pytest.mark.parametrize("fill", [0.5, 0.0])
def test_native_operand_keeps_its_meaning_in_torch_sparse_kernels(fill):
    """torch's kernels that take a native operand by design (registry.KEEPS_NATIVE) read it as torch does: the
    mask of sampled_addmm, the skipped elements of mm(..., reduce); SparseTensor operands are their dense tensors."""
    nd, _ = pattern_tensor((5, 6), seed=3)
    nat = nd.to_sparse_csr()
    X, _ = make((6, 3), fill, seed=4)
    for reduce in ("sum", "mean", "amax", "amin"):
        close(torch.sparse.mm(nat, X, reduce), torch.sparse.mm(nat, X.to_dense(), reduce))
    M1, _ = make((5, 4), fill, seed=5)
    M2, _ = make((4, 6), fill, seed=6)
    ref = torch.sparse.sampled_addmm(nat, M1.to_dense(), M2.to_dense(), beta=0.5)
    close(torch.sparse.sampled_addmm(nat, M1, M2, beta=0.5), ref)
    m1, _ = pattern_tensor((5, 4), seed=7)
    ref = torch.sspaddmm(nd.to_sparse(), m1.to_sparse(), M2.to_dense())
    close(torch.sspaddmm(nd.to_sparse(), m1.to_sparse(), M2), ref)


# ---------------------------------------------------------------------- refusals
class _Other(torch.Tensor):
    """A wrapper subclass sparsefill does not know (as torch.testing's TwoTensor: it unwraps and re-wraps)."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, dtype=inner.dtype, device=inner.device
        )

    def __init__(self, inner):
        self.inner = inner

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda t: t.inner if isinstance(t, _Other) else t  # noqa: E731
        return func(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in (kwargs or {}).items()})


def test_unknown_subclass_refused():
    A = sparsefill.sparse_coo_tensor([[0, 1], [2, 0]], [1.0, 2.0], (2, 3), fill_value=0.5)
    before = A.to_dense()
    o = _Other(torch.ones(2, 3))
    for call in (
        lambda: torch.mul(A, o),
        lambda: torch.ops.aten.add.Tensor(A, o),
        lambda: A.add_(o),
        lambda: torch.cat([A, o]),
    ):
        with pytest.raises(TypeError, match="_Other"):
            call()
    assert torch.equal(A.to_dense(), before)


def test_parameters_plain_subclasses_and_tracing_tensors_work():
    A = sparsefill.sparse_coo_tensor([[0, 1], [2, 0]], [1.0, 2.0], (2, 3), fill_value=0.5)
    x = torch.randn(2, 3)

    class Plain(torch.Tensor):
        pass

    close(A * torch.nn.Parameter(x), A.to_dense() * x, check_dtype=False)
    close(A * x.as_subclass(Plain), A.to_dense() * x)
    P = torch.nn.Parameter(A)
    close(P * x, A.to_dense() * x)
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch._subclasses.functional_tensor import FunctionalTensor

    assert registry._known_type(FakeTensor) and registry._known_type(FunctionalTensor)
    mode = FakeTensorMode()
    F = mode.from_tensor(A)
    with mode:
        out = F * torch.ones(2, 3)  # a FakeTensor operand: not refused
    assert out.shape == (2, 3)


def test_written_native_and_other_layouts_refused():
    A = sparsefill.sparse_coo_tensor([[0, 1], [2, 0]], [1.0, 2.0], (2, 3), fill_value=0.5)
    nat = torch.sparse_coo_tensor([[0, 1], [1, 2]], [10.0, 20.0], (2, 3))
    before = nat.to_dense()
    with pytest.raises(TypeError, match="writes to its argument 'self'"):
        nat.add_(A)
    with pytest.raises(TypeError, match="writes to its argument 'out'"):
        torch.add(A, A, out=nat)
    with pytest.raises(TypeError, match="'self'"):
        nat.to_sparse_csr().copy_(A)
    assert torch.equal(nat.to_dense(), before)
    nested = torch.nested.nested_tensor([torch.ones(3), torch.ones(3)])
    with pytest.raises(TypeError, match="nested tensor"):
        torch.add(sparsefill.to_sparse(torch.ones(2, 3)), nested)
    if torch.backends.mkldnn.is_available():
        with pytest.raises(TypeError, match="layout torch._mkldnn"):
            torch.add(sparsefill.to_sparse(torch.ones(2, 3)), torch.ones(2, 3).to_mkldnn())


def test_unannotated_mutation_criterion():
    if not pytest.importorskip("torch.distributed").is_available():
        pytest.skip("torch.distributed is not available in this build")
    c10d = torch.ops.c10d
    assert registry.unannotated_mutation(c10d.allreduce_.default) is not None
    assert registry.unannotated_mutation(c10d.broadcast_.default) is not None
    for op in (
        torch.ops.aten.add_.Tensor,
        torch.ops.aten.add.Tensor,
        torch.ops.aten._foreach_add_.Scalar,
        torch.ops._c10d_functional.all_reduce_.default,
        torch.ops._c10d_functional.all_reduce.default,
    ):
        assert registry.unannotated_mutation(op) is None, op


_LIB = torch.library.Library("sparsefill_boundary_test", "DEF")  # (defined once per test process)
_LIB.define("bump_(Tensor x) -> ()")  # writes x, but its schema does not say so
_LIB.define("bump_declared_(Tensor(a!) x) -> ()")
_LIB.define("twice(Tensor x) -> Tensor")


def _bump(x):
    x.add_(1)


_LIB.impl("bump_", _bump, "CPU")
_LIB.impl("bump_declared_", _bump, "CPU")
_LIB.impl("twice", lambda x: x * 2, "CPU")


def test_custom_ops_under_the_rule():
    ops = torch.ops.sparsefill_boundary_test
    A = sparsefill.sparse_coo_tensor([[0, 1], [2, 0]], [1.0, 2.0], (2, 3), fill_value=0.5)
    before = A.to_dense()
    with pytest.raises(NotImplementedError, match="bump_"):
        ops.bump_(A)
    assert torch.equal(A.to_dense(), before)
    ops.bump_declared_(A)  # a declared write: computed densely and written back
    close(A, before + 1)
    close(ops.twice(A), 2 * (before + 1))  # no write: the densify fallback
    x = torch.zeros(2)
    ops.bump_(x)  # dense tensors are not sparsefill's business
    assert torch.equal(x, torch.ones(2))


@pytest.fixture
def gloo_group():
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this build")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def test_collectives_handled_or_refused(gloo_group):
    """torch's collectives on a SparseTensor run sparsefill.distributed's handlers in place (world size 1:
    the tensor is unchanged, and a dense copy agrees); a c10d op without a handler is refused, never a no-op."""
    dist = gloo_group
    A = sparsefill.sparse_coo_tensor([[0, 1], [2, 0]], [1.0, 2.0], (2, 3), fill_value=0.5)
    before = A.to_dense()
    dist.all_reduce(A)
    dist.broadcast(A, 0)
    dist.reduce(A, 0)
    close(A, before)
    assert isinstance(A, sparsefill.SparseTensor)
    with pytest.raises(NotImplementedError, match="c10d.barrier"):
        torch.ops.c10d.barrier.default(A, dist.group.WORLD.boxed(), [], True, 10000)
    assert torch.equal(A.to_dense(), before)
    x = torch.ones(3)
    dist.all_reduce(x)  # dense collectives are untouched
    assert torch.equal(x, torch.ones(3))


# ---------------------------------------------------------------------- torch.sparse functions
def _pattern_native(A, keep, layout=torch.sparse_coo):
    """The torch native tensor of an indefinite A's pattern and values (torch's masked semantics)."""
    d = A.to_dense(fill_value=0.0)
    idx = keep.nonzero().T
    n = torch.sparse_coo_tensor(idx, d[tuple(idx)], d.shape).coalesce()
    return n.to_sparse_csr() if layout is torch.sparse_csr else n


@pytest.mark.parametrize("layout", LAYOUTS, ids=["coo", "csr"])
@pytest.mark.parametrize("fill", FILLS, ids=["f0.5", "f0", "fnan", "indefinite"])
@pytest.mark.parametrize("dims", [(0,), (1,), (-1,), (0, 1)])
def test_sparse_sum(dims, fill, layout):
    A, keep = make((4, 6), fill, layout=layout)
    out = torch.sparse.sum(A, dims)
    out64 = torch.sparse.sum(A, dims, dtype=torch.float32)
    if (
        fill == []
    ):  # masked: the sum over the specified elements (torch.sparse's rule), no element: unspecified
        nat = torch.sparse.sum(_pattern_native(A, keep), dims)
        close(out, dense(nat), fill=0.0)
        close(out, dense(sparsefill.masked.sum(A, dims), 0.0), fill=0.0)
        close(out64, dense(nat).float(), fill=0.0)
    else:
        close(out, A.to_dense().sum(dims))
        close(out64, A.to_dense().sum(dims).float())


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=["coo", "csr"])
@pytest.mark.parametrize("fill", FILLS, ids=["f0.5", "f0", "fnan", "indefinite"])
def test_sparse_sum_all_dims(fill, layout, grad):
    """torch.sparse.sum(A) (no dims: torch._sparse_sum, composite above __torch_dispatch__) == A.sum();
    an indefinite fill sums the stored elements, as torch.sparse on a native tensor of the same pattern."""
    A, keep = make((4, 6), fill, layout=layout)
    d = A.to_dense(fill_value=0.0) if fill == [] else A.to_dense()
    ref = (d * keep).sum() if fill == [] else d.sum()
    with torch.set_grad_enabled(grad):
        out, out32 = torch.sparse.sum(A), torch.sparse.sum(A, dtype=torch.float32)
    assert type(out) is torch.Tensor and out.dim() == 0
    close(out, ref)
    close(out32, ref.float())
    if fill == []:
        close(out, torch.sparse.sum(native(d * keep, "coo")))


@pytest.mark.parametrize("layout", LAYOUTS, ids=["coo", "csr"])
@pytest.mark.parametrize(
    "fill", FILLS + [-float("inf")], ids=["f0.5", "f0", "fnan", "indefinite", "f-inf"]
)
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_sparse_softmax(log, dim, fill, layout):
    sp, dn = (
        (torch.sparse.log_softmax, torch.log_softmax)
        if log
        else (torch.sparse.softmax, torch.softmax)
    )
    A, keep = make((4, 6), fill, layout=layout)
    out = sp(A, dim)
    if (
        fill == []
    ):  # masked: unspecified elements skipped and kept unspecified (torch.sparse's rule)
        nat = sp(_pattern_native(A, keep), dim).to_dense()
        close(out, torch.where(keep, nat, NAN), fill=NAN)
        msk = (sparsefill.masked.log_softmax if log else sparsefill.masked.softmax)(A, dim)
        close(out, dense(msk, NAN), fill=NAN)
    else:
        close(out, dn(A.to_dense(), dim))
    if fill == -float("inf"):  # torch's rule for a native tensor: unspecified elements are -inf
        nat = sp(_pattern_native(A.to_sparse(fill_value=[]), keep), dim).to_dense()
        torch.testing.assert_close(torch.where(keep, dense(out), 0.0), torch.where(keep, nat, 0.0))
    ref = dense(out, NAN).float()  # dtype=: the op on A converted first, as torch
    close(sp(A, dim, dtype=torch.float32), ref, fill=NAN, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("layout", LAYOUTS, ids=["coo", "csr"])
@pytest.mark.parametrize("fill", FILLS, ids=["f0.5", "f0", "fnan", "indefinite"])
def test_sparse_mm_addmm(fill, layout):
    A, keep = make((4, 6), fill, layout=layout)
    X = torch.randn(6, 3, dtype=torch.float64)
    M = torch.randn(4, 3, dtype=torch.float64)
    Ad = A.to_dense(fill_value=0.0) if fill == [] else A.to_dense()
    close(torch.sparse.mm(A, X), Ad @ X)
    close(torch.sparse.addmm(M, A, X, beta=0.5, alpha=2.0), 0.5 * M + 2 * (Ad @ X))
    B, _ = make((6, 3), fill, layout=layout, seed=5)
    Bd = B.to_dense(fill_value=0.0) if fill == [] else B.to_dense()
    close(torch.sparse.mm(A, B), Ad @ Bd, fill=0.0)
    if fill == []:
        close(torch.sparse.mm(A, X), torch.sparse.mm(_pattern_native(A, keep), X))


@pytest.mark.parametrize("layout", LAYOUTS, ids=["coo", "csr"])
@pytest.mark.parametrize("fill", [0.5, 0.0, []], ids=["f0.5", "f0", "indefinite"])
@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin"])
def test_sparse_mm_reduce(reduce, fill, layout):
    A, keep = make((5, 6), fill, layout=layout)
    X = torch.randn(6, 3, dtype=torch.float64)
    out = torch.sparse.mm(A, X, reduce)
    if (
        fill == []
    ):  # torch's kernel on the pattern: the reduction over the specified elements, an empty row 0
        ref = torch.sparse.mm(_pattern_native(A, keep, torch.sparse_csr), X, reduce)
    else:  # out[i, j] = reduce_k A[i, k] * X[k, j] over every k
        ref = getattr(torch, reduce)(A.to_dense()[:, :, None] * X[None], 1)
    close(out, ref)


@pytest.mark.parametrize("fill", [0.5, 1.5])
def test_sparse_functions_gradients(fill):
    """Gradients reach a SparseTensor leaf and the dense operand as in the dense computation."""
    X0 = torch.randn(6, 3, dtype=torch.float64)
    cases = [
        (lambda A, X: torch.sparse.mm(A, X), lambda D, X: D @ X),
        (
            lambda A, X: torch.sparse.addmm(torch.ones(4, 3, dtype=torch.float64), A, X),
            lambda D, X: 1 + D @ X,
        ),
        (
            lambda A, X: torch.sparse.mm(A, X, "mean"),
            lambda D, X: (D[:, :, None] * X[None]).mean(1),
        ),
        (
            lambda A, X: torch.sparse.mm(A, X, "amax"),
            lambda D, X: (D[:, :, None] * X[None]).amax(1),
        ),
        (
            lambda A, X: torch.sparse.sum(A, 1)[:, None] * X[:4],
            lambda D, X: D.sum(1)[:, None] * X[:4],
        ),
        (
            lambda A, X: torch.sparse.softmax(A, 1)[:, :3] * X[:4],
            lambda D, X: torch.softmax(D, 1)[:, :3] * X[:4],
        ),
        (
            lambda A, X: torch.sparse.log_softmax(A, 0)[:, :3] * X[:4],
            lambda D, X: torch.log_softmax(D, 0)[:, :3] * X[:4],
        ),
    ]
    for f, g in cases:
        A = make((4, 6), fill)[0].requires_grad_()
        X = X0.clone().requires_grad_()
        out = dense(f(A, X))
        w = torch.randn(out.shape, dtype=torch.float64)
        (out * w).sum().backward()
        D = make((4, 6), fill)[0].to_dense().requires_grad_()
        Xd = X0.clone().requires_grad_()
        ref = g(D, Xd)
        (ref * w).sum().backward()
        torch.testing.assert_close(out, ref)
        close(A.grad, D.grad)
        torch.testing.assert_close(X.grad, Xd.grad)


# ---------------------------------------------------------------------- item 2: torch.matmul, every shape pair
K = 6
LEFT = [(K,), (4, K), (3, 4, K), (2, 3, 4, K), (1, 3, 4, K)]
RIGHT = [(K,), (K, 5), (3, K, 5), (2, 3, K, 5), (2, 1, K, 5)]


def test_matmul_of_a_broadcast_batch():
    A, _ = make((4, 10), 1.5)
    v, _ = make((10,), 0.5)
    X = torch.randn(5, 5, 10, 5, dtype=torch.float64)
    close(torch.matmul(A, X), torch.matmul(A.to_dense(), X))  # max error was 15.6
    close(torch.matmul(v, X), torch.matmul(v.to_dense(), X))


def _operand(shape, fill, sparse, seed):
    if not sparse:
        x = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        return x, x
    S, _ = make(shape, fill, seed=seed)
    return S, (S.to_dense(fill_value=0.0) if fill == [] else S.to_dense())


@pytest.mark.parametrize("fill", [0.0, 1.5, []], ids=["f0", "f1.5", "indefinite"])
@pytest.mark.parametrize("side", ["left", "right", "both"])
@pytest.mark.parametrize("right", RIGHT, ids=str)
@pytest.mark.parametrize("left", LEFT, ids=str)
def test_matmul_every_shape(left, right, side, fill):
    a, ad = _operand(left, fill, side in ("left", "both"), 1)
    b, bd = _operand(right, fill, side in ("right", "both"), 2)
    try:
        ref = torch.matmul(ad, bd)
    except RuntimeError:  # shapes torch rejects: the sparse call rejects them too
        with pytest.raises(RuntimeError):
            torch.matmul(a, b)
        return
    out = torch.matmul(a, b)
    assert out.shape == ref.shape
    close(out, ref, fill=0.0)


def test_expand_keeps_sorted_indices():
    """The cause of a wrong batched matmul: expanding two size-1 dims repeated the stored elements out of order while the
    result was flagged coalesced.  (An expand may make the grown dims dense, a stride-0 view of
    the values: the keys are then those of the remaining sparse dims, still sorted where flagged coalesced.)"""
    A, _ = make((4, 10), 0.0)
    E = A.expand(5, 5, 4, 10)
    keys = sparsefill._kernels.index.linearize(E._idx, E._sparse_shape)
    assert E.is_coalesced() and bool((keys[1:] > keys[:-1]).all())
    close(E, A.to_dense().expand(5, 5, 4, 10))
    B, _ = make((1, 4, 1, 3), 0.5)
    F = B.expand(2, 3, 4, 5, 3)
    keys = sparsefill._kernels.index.linearize(F._idx, F._sparse_shape)
    assert not F.is_coalesced() or bool((keys[1:] > keys[:-1]).all())
    close(F, B.to_dense().expand(2, 3, 4, 5, 3))
    for T, size in (
        (A, (5, 5, 4, 10)),
        (B, (2, 3, 4, 5, 3)),
    ):  # the repeat path (the split kept) sorts too
        from sparsefill.ops.shape.reshape import expand

        R = expand(T, list(size), keep_split=True)
        keys = sparsefill._kernels.index.linearize(R._idx, R._sparse_shape)
        assert not R.is_coalesced() or bool((keys[1:] > keys[:-1]).all())
        close(R, T.to_dense().expand(*size))


# ---------------------------------------------------------------------- item 7: indexing ops on 0-d tensors
def _zero_d(kind, dtype):
    if kind == "stored":
        return sparsefill.sparse_coo_tensor(
            torch.zeros(0, 1, dtype=torch.int64), torch.tensor([3]), (), fill_value=0, dtype=dtype
        )
    return sparsefill.full((), 2, dtype=dtype)


def _src(idx, dtype, v=5):
    return torch.full(idx.shape, v, dtype=dtype)


INDEXING_0D = {
    "gather": lambda T, i: torch.gather(T, 0, i),
    "gather-1": lambda T, i: torch.gather(T, -1, i),
    "scatter": lambda T, i: torch.scatter(T, 0, i, _src(i, T.dtype)),
    "scatter_value": lambda T, i: torch.scatter(T, 0, i, 7),
    "scatter_reduce_arg": lambda T, i: torch.scatter(T, 0, i, _src(i, T.dtype), reduce="multiply"),
    "scatter_": lambda T, i: T.clone().scatter_(0, i, _src(i, T.dtype)),
    "scatter_add": lambda T, i: torch.scatter_add(T, 0, i, _src(i, T.dtype)),
    "scatter_add_": lambda T, i: T.clone().scatter_add_(0, i, _src(i, T.dtype)),
    **{
        f"scatter_reduce_{r}_{s}": (
            lambda r, s: (
                lambda T, i: torch.scatter_reduce(T, 0, i, _src(i, T.dtype), r, include_self=s)
            )
        )(r, s)
        for r in ("sum", "prod", "mean", "amax", "amin")
        for s in (True, False)
    },
    "index_select": lambda T, i: torch.index_select(T, 0, i),
    "index_add": lambda T, i: torch.index_add(T, 0, i, _src(i, T.dtype)),
    "index_add_alpha": lambda T, i: torch.index_add(T, 0, i, _src(i, T.dtype), alpha=2),
    "index_copy": lambda T, i: torch.index_copy(T, 0, i, _src(i, T.dtype)),
    "index_copy_": lambda T, i: T.clone().index_copy_(0, i, _src(i, T.dtype)),
    "index_fill": lambda T, i: torch.index_fill(T, 0, i, 4),
    "index_fill_": lambda T, i: T.clone().index_fill_(0, i, 4),
    "index_reduce_prod": lambda T, i: torch.index_reduce(T, 0, i, _src(i, T.dtype), "prod"),
    "index_reduce_amax": lambda T, i: torch.index_reduce(
        T, 0, i, _src(i, T.dtype, 1), "amax", include_self=False
    ),
    "take": lambda T, i: torch.take(T, i),
    "take_along_dim": lambda T, i: torch.take_along_dim(T, i),
    "put": lambda T, i: torch.put(T, i, _src(i, T.dtype)),
    "put_accumulate": lambda T, i: torch.put(T, i, _src(i, T.dtype), accumulate=True),
    "index_put": lambda T, i: torch.index_put(T, (i,), _src(i, T.dtype)),
    "index_put_bool": lambda T, i: torch.index_put(T, (i == 0,), torch.tensor(5, dtype=T.dtype)),
    "masked_fill": lambda T, i: T.masked_fill(i == 0, 1),
    "masked_select": lambda T, i: T.masked_select(i == 0),
    "masked_scatter": lambda T, i: T.masked_scatter(i == 0, torch.tensor([9], dtype=T.dtype)),
    "getitem_bool": lambda T, i: T[i == 0],
    "getitem_none": lambda T, i: T[None],
    "getitem_ellipsis": lambda T, i: T[...],
    "setitem_bool": lambda T, i: _set(T.clone(), i == 0, 4),
    "setitem_ellipsis": lambda T, i: _set(T.clone(), ..., 4),
    "flip": lambda T, i: torch.flip(T, [0]),
    "roll": lambda T, i: torch.roll(T, 1),
    "select": lambda T, i: T.select(0, 0),
}


def _set(T, key, v):
    T[key] = v
    return T


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64], ids=["f64", "i64"])
@pytest.mark.parametrize("index", [0, -1, 1, [0], [0, 0], []], ids=str)
@pytest.mark.parametrize("kind", ["stored", "unspecified"])
@pytest.mark.parametrize("op", list(INDEXING_0D))
def test_indexing_0d(op, kind, index, dtype):
    f = INDEXING_0D[op]
    T = _zero_d(kind, dtype)
    i = torch.tensor(index, dtype=torch.int64)
    try:
        ref = f(T.to_dense(), i)
    except (RuntimeError, IndexError) as e:
        with pytest.raises(type(e)):
            f(T, i)
        return
    out = f(T, i)
    close(out, ref)
