"""Every float64 reduction of PyTorch's OpInfo ``reduction_ops`` is computed natively on SparseTensors::

    r(A, dims).to_dense() == r(A.to_dense(), dims)

for COO, CSR, hybrid (array fill), uncoalesced and NaN-fill inputs, with no DensifyWarning except
where DECLARED below (run anyway, compared with dense, and printed in the summary).
"""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db, reduction_ops

import sparsefill
from tests.opinfo.test_opinfo import REJECTS, _call, _convert_sample, _densify, _reference

VARIANTS = ["coo", "csr", "hybrid", "uncoalesced", "nan"]
MAX_SAMPLES = 6
IN_OP_DB = {id(op) for op in op_db}
OPS = [op for op in reduction_ops if id(op) in IN_OP_DB and op.supports_dtype(torch.float64, "cpu")]
ALL = frozenset(VARIANTS)
DECLARED: dict = {}  # op name -> (variants, reason): reductions that may densify there (none now)


def test_declared_reductions_are_reported(summary_line):
    for name, (variants, reason) in sorted(DECLARED.items()):
        summary_line(f"declared (reductions) {name} [{', '.join(sorted(variants))}]: {reason}")


@pytest.mark.parametrize(
    "op", OPS, ids=lambda op: op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
)
def test_reduction_is_native(op):
    declared = DECLARED.get(op.name, ((), ""))[0]
    failures, ran = [], 0
    for seed, sample in enumerate(
        list(op.sample_inputs("cpu", torch.float64, requires_grad=False))[:MAX_SAMPLES]
    ):
        for variant in VARIANTS:
            conv = _convert_sample(sample, variant, seed)
            if conv is None:
                continue
            (s_in, s_args, s_kw), dense = conv
            ref = _reference(op, dense, (s_in, s_args, s_kw))
            if ref is REJECTS:
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter(
                        "ignore" if variant in declared else "error", sparsefill.DensifyWarning
                    )
                    out = _call(op, s_in, s_args, s_kw)
                torch.testing.assert_close(_densify(out), _densify(ref), equal_nan=True)
                ran += 1
            except Exception as e:  # noqa: BLE001 - collected and reported below
                failures.append(f"[{variant}, sample {seed}] {type(e).__name__}: {str(e)[:200]}")
    assert not failures, "\n".join(failures)
    assert ran, f"{op.name}: no sample ran"


SCANS = {
    "cumsum": lambda t, d: t.cumsum(d),
    "cumprod": lambda t, d: t.cumprod(d),
    "cummax": lambda t, d: t.cummax(d),
    "cummin": lambda t, d: t.cummin(d),
    "logcumsumexp": lambda t, d: t.logcumsumexp(d),
}


def _dense(o):
    if isinstance(o, tuple):
        return tuple(_dense(x) for x in o)
    return o.to_dense() if isinstance(o, sparsefill.SparseTensor) else o


@pytest.mark.parametrize("name", list(SCANS))
@pytest.mark.parametrize("dense_dim", [0, 1, 2])
def test_scans_native_along_dense_dims_dense_by_nature_along_sparse_ones(name, dense_dim):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, 3, generator=g, dtype=torch.float64)
    x[torch.rand(4, 5, 3, generator=g) < 0.6] = 0.5
    A = sparsefill.to_sparse(x, fill_value=0.5, dense_dim=dense_dim)
    for d in range(3):
        with warnings.catch_warnings():
            warnings.simplefilter("error", sparsefill.DensifyWarning)
            out = SCANS[name](A, d)
        first = out[0] if isinstance(out, tuple) else out
        assert isinstance(first, sparsefill.SparseTensor) == (d >= 3 - dense_dim)
        ref = SCANS[name](x, d)
        torch.testing.assert_close(_dense(out), tuple(ref) if isinstance(ref, tuple) else ref)


@pytest.mark.parametrize("fill", [0.5, -3.0, 9.0, float("nan")])
def test_median_and_nanmedian_in_closed_form(fill):
    g = torch.Generator().manual_seed(1)
    for n in (1, 2, 7, 20):
        x = torch.randn(n, generator=g, dtype=torch.float64)
        x[torch.rand(n, generator=g) < 0.5] = fill
        if n == 7:
            x[3] = float("nan")
        A = sparsefill.to_sparse(x, fill_value=fill)
        with warnings.catch_warnings():
            warnings.simplefilter("error", sparsefill.DensifyWarning)
            torch.testing.assert_close(A.median(), x.median(), equal_nan=True)
            torch.testing.assert_close(A.nanmedian(), x.nanmedian(), equal_nan=True)


@pytest.mark.parametrize("variant", ["coo", "csr", "hybrid", "nan"])
@pytest.mark.parametrize("fn", [torch.median, torch.nanmedian], ids=["median", "nanmedian"])
def test_median_along_a_dim(variant, fn):
    """Values equal torch's; indices point at an element equal to the median (torch leaves ties unspecified),
    the first NaN where the median is NaN.  Small integers make ties and fill medians common."""
    g = torch.Generator().manual_seed(2)
    for trial in range(40):
        shape = [int(s) for s in torch.randint(1, 5, (2 if variant == "csr" else 3,), generator=g)]
        x = torch.randint(-2, 3, shape, generator=g).double()
        fill = float("nan") if variant == "nan" else float(torch.randint(-2, 3, (), generator=g))
        if trial % 3 == 0:
            x[torch.rand(shape, generator=g) < 0.2] = float("nan")
        dense_dim = 1 if variant == "hybrid" else 0
        if dense_dim:
            x[torch.rand(shape[:-1], generator=g) < 0.5] = fill
        else:
            x[torch.rand(shape, generator=g) < 0.5] = fill
        A = sparsefill.to_sparse(
            x,
            fill_value=fill,
            dense_dim=dense_dim,
            layout=torch.sparse_csr if variant == "csr" else torch.sparse_coo,
        )
        for dim, keep in itertools.product(range(-x.dim(), x.dim()), (False, True)):
            rv, ri = fn(x, dim, keep)
            with warnings.catch_warnings():
                warnings.simplefilter("error", sparsefill.DensifyWarning)
                ov, oi = (_dense(o) for o in fn(A, dim, keep))
            torch.testing.assert_close(ov, rv, equal_nan=True)
            assert oi.shape == ri.shape and oi.dtype == ri.dtype
            at = x.gather(dim, oi if keep else oi.unsqueeze(dim))
            torch.testing.assert_close(at if keep else at.squeeze(dim), rv, equal_nan=True)
            if fn is torch.median:
                assert torch.equal(oi[rv.isnan()], ri[rv.isnan()])


@pytest.mark.parametrize("fill", [5.0, -0.0, float("inf"), float("nan")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_csr_row_sum_fast_path(fill, dtype):
    """A.sum(1) of a 2-D CSR matrix with mostly non-empty rows (one mv and one addcmul; a non-finite fill
    adds nothing to a full row), against the dense sum, with gradients of values and fill."""
    g = torch.Generator().manual_seed(3)
    m = torch.rand(6, 5, generator=g) < 0.6
    m[1] = True  # a full row: no fill copy
    d = torch.randn(6, 5, generator=g, dtype=torch.float64).to(dtype)
    x = torch.where(m, d, torch.tensor(fill, dtype=dtype))
    A = sparsefill.to_sparse(x, fill_value=fill, layout=torch.sparse_csr)
    torch.testing.assert_close(A.sum(1).to_dense(), x.sum(1), equal_nan=True)
    if dtype == torch.float64 and fill == 5.0:
        crow, col, vals = A.crow_indices(), A.col_indices(), A.values()
        torch.autograd.gradcheck(
            lambda v, f: (
                sparsefill.sparse_csr_tensor(crow, col, v, (6, 5), fill_value=f).sum(1).to_dense()
            ),
            (vals.clone().requires_grad_(), torch.tensor(fill, dtype=dtype, requires_grad=True)),
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_csr_row_sum_cached_pattern_follows_its_index_tensors(dtype):
    """The CSR row sum caches, per (crow, col), the fill counts and width in the values' dtype and the SpMV's
    int32 indices: an in-place change of ``col`` or ``crow``, and another matrix sharing ``crow`` but not
    ``col``, are recomputed (never a stale hit); each result against the dense sum, its fill fill * ncols."""
    crow, col = torch.tensor([0, 2, 3, 5]), torch.tensor([0, 2, 3, 0, 1])
    A = sparsefill.sparse_csr_tensor(
        crow, col, torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=dtype), (3, 4), fill_value=0.5
    )
    for _ in range(2):  # (the second call: a cache hit)
        torch.testing.assert_close(A.sum(1).to_dense(), A.to_dense().sum(1))
    assert A.sum(1).fill_value().item() == 0.5 * 4 and A.sum(1).dtype == dtype
    A.col_indices()[0] = 1  # row 0 now stores columns 1, 2
    torch.testing.assert_close(A.sum(1).to_dense(), A.to_dense().sum(1))
    assert A.to_dense()[0, 0] == 0.5
    B = sparsefill.sparse_csr_tensor(
        A.crow_indices(), torch.tensor([0, 3, 3, 1, 2]), A.values(), (3, 4), fill_value=-1.0
    )
    torch.testing.assert_close(B.sum(1).to_dense(), B.to_dense().sum(1))
    A.crow_indices()[1:3] = torch.tensor([1, 3])  # rows of 1, 2 and 2 stored elements
    A.col_indices().copy_(torch.tensor([0, 1, 3, 0, 1]))
    torch.testing.assert_close(A.sum(1).to_dense(), A.to_dense().sum(1))
    torch.testing.assert_close(
        A.to_dense().sum(1), torch.tensor([1.0 + 1.5, 5.0 + 1.0, 9.0 + 1.0], dtype=dtype)
    )


@pytest.mark.parametrize("fill", [5.0, float("nan"), None])
def test_csr_row_reductions_keep_empty_rows_right(fill):
    """The CSR row path (native mv for sums): empty rows fold the fill, or stay unspecified for an indefinite
    fill (masked semantics), with most rows non-empty and with most rows empty."""
    for rows, cols in (([0, 0, 1, 2], [0, 1, 1, 3]), ([0, 4], [2, 2])):
        A = sparsefill.sparse_coo_tensor(
            [rows, cols],
            [1.0, 2.0, 3.0, 4.0][: len(rows)],
            (5, 6),
            fill_value=[] if fill is None else fill,
        ).to_sparse_csr()
        for op in ("sum", "mean", "amax", "logsumexp", "var"):
            out = getattr(torch, op)(A, 1)
            if fill is None:
                assert out._indefinite and out.indices()[0].tolist() == sorted(set(rows))
                continue
            torch.testing.assert_close(
                out.to_dense(), getattr(torch, op)(A.to_dense(), 1), equal_nan=True
            )


def test_var_std_warn_only_as_dense():
    """The one-element probe that checks torch's errors must not warn where the dense call does not
    (a one-element std has zero degrees of freedom)."""
    import warnings

    A = sparsefill.sparse_coo_tensor([[0, 1], [1, 2]], [1.0, 2.0], (4, 5), fill_value=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for f in (torch.std, torch.var, torch.var_mean, torch.std_mean):
            torch.testing.assert_close(f(A, 1), f(A.to_dense(), 1))
            torch.testing.assert_close(f(A), f(A.to_dense()))


@pytest.mark.parametrize("fill", [float("inf"), -float("inf"), float("nan"), "array"], ids=str)
@pytest.mark.parametrize("fn", [torch.var_mean, torch.std_mean], ids=lambda f: f.__name__)
def test_var_mean_of_a_nonfinite_fill_is_nan_as_dense(fn, fill):
    """Dense ``var_mean`` computes its mean by Welford's pass (``inf - inf``: NaN in a slice with two or more
    non-finite elements), where ``mean`` gives +-inf: the mean half of ``var_mean`` is dense's, routed (a
    gradient wanted) or not, along dims and over all."""
    inf = float("inf")
    f = torch.tensor([inf, 1.0]) if fill == "array" else fill
    A = sparsefill.sparse_coo_tensor(
        [[0, 2], [1, 3]], torch.tensor([[1.0, 2.0], [inf, 3.0]]), (3, 5, 2), fill_value=f
    )
    for grad in (False, True):
        B = A.detach().requires_grad_(grad)
        for kw in ({}, {"dim": 1}, {"dim": (0, 1)}, {"dim": 2, "keepdim": True}):
            for got, want in zip(fn(B, **kw), fn(A.to_dense(), **kw)):
                got = got.to_dense() if isinstance(got, sparsefill.SparseTensor) else got
                torch.testing.assert_close(got.detach(), want, equal_nan=True)


# ---------------------------------------------------------------- edge cases
import math  # noqa: E402

import sparsefill as sf  # noqa: E402


def D(t):
    if isinstance(t, tuple):
        return tuple(D(x) for x in t)
    return t.to_dense() if isinstance(t, sf.SparseTensor) else t


@pytest.mark.filterwarnings("ignore::sparsefill.DensifyWarning")
@pytest.mark.parametrize(
    "op",
    [
        lambda t: t.cumsum(-1),
        lambda t: t.softmax(-1),
        lambda t: t.cummax(-1),
        lambda t: t.log_softmax(-1),
        lambda t: t.argmax(-1),
        lambda t: t.max(-1),
    ],
)
def test_batched_csr_hybrid_dense_dim_ops(op):
    x = torch.zeros(2, 2, 2, 2)
    x[0, 1, 0, 1], x[1, 0, 1, 0] = 1.0, 3.0
    A = sf.to_sparse(x, fill_value=0.0, layout=torch.sparse_csr, dense_dim=1)
    ref = op(x)
    torch.testing.assert_close(D(op(A)), tuple(ref) if isinstance(ref, tuple) else ref)


@pytest.mark.filterwarnings("ignore::sparsefill.DensifyWarning")
@pytest.mark.parametrize("dense_dim", [1, 2])
def test_arg_reductions_along_dense_dims_have_torch_shapes(dense_dim):
    x = torch.tensor([[[1.0, 5.0, 0.0], [0.0, 0.0, 0.0]], [[7.0, 2.0, 1.0], [0.0, 3.0, 0.0]]])
    A = sf.to_sparse(x, fill_value=0.0, dense_dim=dense_dim)
    for d in range(3):
        torch.testing.assert_close(D(torch.argmax(A, d)), torch.argmax(x, d))
        torch.testing.assert_close(
            D(torch.min(A, d, keepdim=True)), tuple(torch.min(x, d, keepdim=True))
        )


@pytest.mark.filterwarnings("ignore::sparsefill.DensifyWarning")
def test_complex_prod_with_a_nan_fill_only_where_the_fill_is():
    x = torch.tensor([[math.nan], [-3.0]], dtype=torch.complex64)
    torch.testing.assert_close(
        D(sf.to_sparse(x, fill_value=math.nan).prod(1)), x.prod(1), equal_nan=True
    )


@pytest.mark.filterwarnings("ignore::sparsefill.DensifyWarning")
def test_reductions_of_a_shape_over_2_63_bytes():
    A = sf.sparse_coo_tensor([[1], [3]], [1.0], (2**31 + 5, 2**31 + 3), fill_value=0.0)
    assert float(A.sum()) == 1.0 and int(A.argmax()) == 1 * (2**31 + 3) + 3
    assert float(A.mean()) == pytest.approx(1.0 / ((2**31 + 5) * (2**31 + 3)))


@pytest.mark.filterwarnings("ignore::sparsefill.DensifyWarning")
def test_logsumexp_promotes_bool_and_int():
    for x in [torch.tensor([True, False]), torch.tensor([3, 0, 1])]:
        torch.testing.assert_close(torch.logsumexp(sf.to_sparse(x), 0), torch.logsumexp(x, 0))


@pytest.mark.filterwarnings("ignore::sparsefill.DensifyWarning")
def test_median_dim_of_integer_tensors():
    x = torch.tensor([[1, 0, 2], [0, 0, 3]])
    for layout in (torch.sparse_coo, torch.sparse_csr):
        A = sf.to_sparse(x, fill_value=0, layout=layout)
        for fn in (torch.median, torch.nanmedian):
            v, i = fn(A, 1)
            torch.testing.assert_close(v, fn(x, 1).values)
            torch.testing.assert_close(x.gather(1, i[:, None])[:, 0], v)


@pytest.mark.filterwarnings("ignore::sparsefill.DensifyWarning")
def test_meta_cache_follows_the_default_dtype():
    B = sf.to_sparse(torch.tensor([[1, 0, 2], [0, 0, 3]]), fill_value=0)
    old = torch.get_default_dtype()
    try:
        assert torch.logsumexp(B, 1).dtype == torch.float32
        torch.set_default_dtype(torch.float64)
        assert torch.logsumexp(B, 1).dtype == torch.float64
    finally:
        torch.set_default_dtype(old)


@pytest.mark.parametrize("variant", ["coo", "csr", "hybrid", "indefinite"])
def test_legacy_norm_overloads_native(variant):
    """``aten.norm``'s overloads (``torch.norm``, ``_foreach_norm``) reduce as ``linalg_vector_norm``: no densify,
    the dense value and the dense gradient of the values (read at the pattern)."""
    aten = torch.ops.aten
    v = torch.tensor(
        [[1.0, -2.0], [3.0, 0.5], [-4.0, 2.0]] if variant == "hybrid" else [1.0, -2.0, 3.0],
        dtype=torch.float64,
    )
    fill = (
        sparsefill.indefinite
        if variant == "indefinite"
        else (torch.tensor([0.5, -1.0], dtype=torch.float64) if variant == "hybrid" else 0.5)
    )
    size = (4, 3, 2) if variant == "hybrid" else (4, 3)
    calls = [
        (aten.norm.Scalar, (1,), {}),
        (aten.norm.Scalar, (), {}),
        (aten.norm.ScalarOpt_dim, (None, [1]), {}),
        (aten.norm.ScalarOpt_dim, (3.0, [0], True), {}),
        (aten.norm.ScalarOpt_dim_dtype, (2, [1], False), {"dtype": torch.float64}),
        (aten.norm.ScalarOpt_dtype, (float("inf"),), {"dtype": torch.float64}),
    ]
    for f, a, k in calls:
        vals = v.clone().requires_grad_()
        A = sparsefill.sparse_coo_tensor([[0, 1, 3], [1, 2, 0]], vals, size, fill_value=fill)
        A = A.to_sparse_csr() if variant == "csr" else A
        ref = vals.detach().clone().requires_grad_()
        D = sparsefill.sparse_coo_tensor(
            [[0, 1, 3], [1, 2, 0]], ref, size, fill_value=fill
        ).to_dense(fill_value=0.0 if variant == "indefinite" else None)
        with warnings.catch_warnings():
            warnings.simplefilter("error", sparsefill.DensifyWarning)
            r = f(A, *a, **k)
        # (indefinite: the norm of the stored elements, that of the dense tensor with 0 elsewhere for these p)
        got = (
            (r.to_dense(fill_value=0.0) if variant == "indefinite" else r.to_dense())
            if isinstance(r, sparsefill.SparseTensor)
            else r
        )
        want = f(D, *a, **k)
        torch.testing.assert_close(got, want)
        got.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(vals.grad, ref.grad)


@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float32, torch.float16, torch.int64, torch.uint8, torch.bool]
)
@pytest.mark.parametrize("variant", ["coo", "csr", "hybrid", "uncoalesced", "indefinite"])
def test_hash_tensor_native_closed_form(variant, dtype):
    """``hash_tensor`` xors the stored elements' 64-bit patterns with the fill's where it occurs an odd number
    of times in a slice: bit for bit the dense result, over every dims argument, with no DensifyWarning.
    Indefinite: the xor of the specified elements (dense: the masked-out elements as 0, the xor identity)."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(5, 4, 3, generator=g) * 3).to(dtype)
    dd = 1 if variant == "hybrid" else 0
    fill = x[0, 0].clone() if dd else x[0, 0, 0].clone()
    mask = torch.rand((5, 4) if dd else (5, 4, 3), generator=g) < 0.5
    x[mask] = fill
    A = sparsefill.to_sparse(
        x,
        fill_value=fill,
        layout=torch.sparse_csr if variant == "csr" else torch.sparse_coo,
        dense_dim=dd,
    )
    if variant == "indefinite":  # the fill's elements masked out
        A = sparsefill.sparse_coo_tensor(
            A.indices(), A.values(), x.shape, fill_value=sparsefill.indefinite
        )
        x = x.masked_fill(x == fill, 0)
    if (
        variant == "uncoalesced"
    ):  # each stored element split in two that sum to it (integers: v and 0)
        i, v = A.indices(), A.values()
        half = v if dtype in (torch.bool, torch.uint8, torch.int64) else v / 2
        A = sparsefill.sparse_coo_tensor(
            torch.cat([i, i], 1),
            torch.cat([half, v - half if dtype is not torch.bool else torch.zeros_like(v)]),
            x.shape,
            fill_value=fill,
        )
    for args, kw in [
        ((), {}),
        (([],), {}),
        ((0,), {}),
        ((1,), {"keepdim": True}),
        (([0, 2],), {}),
        ((-1,), {}),
        (([1, 2],), {"keepdim": True}),
    ]:
        with warnings.catch_warnings():
            warnings.simplefilter("error", sparsefill.DensifyWarning)
            out = torch.hash_tensor(A, *args, **kw)
        got = (
            out.to_dense(fill_value=0)
            if isinstance(out, sparsefill.SparseTensor) and out.is_fill_indefinite()
            else out.to_dense()
            if isinstance(out, sparsefill.SparseTensor)
            else out
        )
        want = torch.hash_tensor(x, *args, **kw)
        assert got.dtype == torch.uint64 and got.shape == want.shape
        assert torch.equal(got.view(torch.int64), want.view(torch.int64)), (args, kw)
