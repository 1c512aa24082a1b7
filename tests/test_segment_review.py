"""Regressions from the adversarial review of sparsefill.segment (session 4): each test is one defect
the review found, with the behaviour torch / Caffe2 give."""

import inspect

import numpy as np
import pytest
import torch
from torch.testing import assert_close

import sparsefill
from sparsefill import segment


def test_logsumexp_double_backward_is_the_softmax_jacobian():
    """The Hessian of logsumexp is diag(p) - p p^T (it was diagonal: the saved result was used as a constant)."""
    x = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    for reducer, ref in [("logsumexp", lambda a: torch.logsumexp(a, 0)),
                         ("logmeanexp", lambda a: torch.logsumexp(a, 0) - torch.log(torch.tensor(3.0)))]:
        H = torch.autograd.functional.hessian(lambda a: segment.reduce(a, reducer, lengths=torch.tensor([3])).sum(), x)
        assert_close(H, torch.autograd.functional.hessian(ref, x))


@pytest.mark.parametrize("reducer", ["sum", "mean", "weighted_sum", "max", "prod", "logsumexp"])
def test_output_can_be_modified_in_place(reducer):
    """As embedding_bag's: the result is not a view of a saved tensor.  Where the backward needs the result
    (max/min, logsumexp), modifying it in place makes the backward raise, as torch's own ops do."""
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    w = torch.rand(5, dtype=torch.float64) if reducer == "weighted_sum" else None
    out = segment.reduce(x, reducer, lengths=torch.tensor([2, 3]), weights=w)
    out.relu_()
    if reducer in ("max", "logsumexp"):
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()
        return
    out.sum().backward()
    x2 = x.detach().clone().requires_grad_()
    ref = segment.reduce(x2, reducer, lengths=torch.tensor([2, 3]), weights=w).relu()
    ref.sum().backward()
    assert_close(x.grad, x2.grad)


def test_small_integer_index_dtypes_are_rejected():
    """int8/int16/uint8 lengths and ids wrapped (uint8 lengths [200, 100] gave offsets [0, 200, 44])."""
    for dt in (torch.uint8, torch.int8, torch.int16):
        with pytest.raises(TypeError, match=rf"lengths must be an int32 or int64 tensor, got dtype {dt}"):
            segment.lengths_to_offsets(torch.tensor([100, 20], dtype=dt))
        with pytest.raises(TypeError, match="segment_ids must be an int32 or int64 tensor"):
            segment.reduce(torch.ones(3), "sum", segment_ids=torch.tensor([0, 1, 1], dtype=dt))


def test_int32_offsets_past_the_int32_range_raise():
    big = torch.tensor([2 ** 30, 2 ** 30], dtype=torch.int32)
    with pytest.raises(ValueError, match="int32 lengths give an offset of 2147483648, past the int32 range"):
        segment.lengths_to_offsets(big)
    assert segment.lengths_to_offsets(big.long()).tolist() == [0, 2 ** 30, 2 ** 31]
    assert segment.lengths_to_offsets(torch.tensor([3, 4], dtype=torch.int32)).dtype == torch.int32


def test_scatter_weighted_sum_weights_are_scalars():
    """Caffe2 enforces one element per weight; a (2,) weight used to broadcast over rows or columns."""
    data = torch.ones(2, 2)
    before = data.clone()
    with pytest.raises(ValueError, match=r"weight0 must be a scalar \(one element\), got shape \(2,\)"):
        segment.scatter_weighted_sum(data, torch.tensor([2.0, 3.0]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"w_2 must be a scalar"):
        segment.scatter_weighted_sum(data, 1.0, torch.tensor([0, 1]), torch.ones(2, 2), 1.0, torch.ones(2, 2),
                                     torch.tensor([2.0, 3.0]))
    assert torch.equal(data, before)
    segment.scatter_weighted_sum(data, torch.tensor([2.0]), torch.tensor([0]), torch.ones(1, 2), torch.tensor(3.0))
    assert data.tolist() == [[5.0, 5.0], [1.0, 1.0]]


def test_keyed_jagged_batch_rejects_a_key_twice_in_an_example():
    """to_dict / to_padded hold one list per key: a repeated key lost ids silently."""
    with pytest.raises(ValueError, match="key 5 appears more than once in example 1"):
        segment.KeyedJaggedBatch(torch.tensor([1, 2, 3, 4]), torch.tensor([1, 1, 2]), torch.tensor([5, 5, 5]),
                                 torch.tensor([1, 2]))
    kj = segment.KeyedJaggedBatch(torch.tensor([1, 2, 3]), torch.tensor([1, 2]), torch.tensor([5, 5]),
                                  torch.tensor([1, 1]))  # the same key in two examples is fine
    assert kj.to_dict() == [{5: [1]}, {5: [2, 3]}]


def test_pooled_positional_weighted_sum():
    kj = segment.KeyedJaggedBatch.from_lists([{1: [0, 2], 3: [1]}, {1: [3, 1, 1]}])
    table = torch.arange(8.0).reshape(4, 2)
    pw = torch.tensor([1.0, 10.0, 100.0])
    out = kj.pooled({1: table}, "positional_weighted_sum", weights=pw)[1]
    assert out.tolist() == [[0 + 10 * 4, 1 + 10 * 5], [6 + 10 * 2 + 100 * 2, 7 + 10 * 3 + 100 * 3]]
    with pytest.raises(ValueError, match="weights= is for positional_weighted_sum only"):
        kj.pooled({1: table}, "sum", weights=pw)
    with pytest.raises(ValueError, match="reducer 'positional_weighted_sum' needs weights="):
        kj.pooled({1: table}, "positional_weighted_sum")


def test_arguments_checked_on_every_path():
    x = torch.ones(4, 2)
    L = torch.tensor([1, 3])
    with pytest.raises(ValueError, match="out_of_range must be 'error', 'drop' or 'clip', got 'bogus'"):
        segment.reduce(x, "sum", lengths=L, out_of_range="bogus")
    with pytest.raises(ValueError, match="num_segments must be a non-negative int, got -1"):
        segment.reduce(x, "sum", segment_ids=torch.tensor([0, 0, 1, 1]), sorted=False, num_segments=-1)
    with pytest.raises(ValueError, match="mode must be 'sequential' or 'coalesced', got 'bogus'"):
        segment.SparseFtrl([torch.nn.Parameter(torch.ones(2))], mode="bogus")
    ids = torch.tensor([0, 0, 1, 1])
    for n in (np.int64(3), torch.tensor(3)):  # numpy integers and 0-d integer tensors count as ints
        for sorted_ in (True, False):
            assert segment.reduce(x, "sum", segment_ids=ids, sorted=sorted_, num_segments=n).shape == (3, 2)
    xi = torch.tensor([[1], [2], [3], [4]])
    with pytest.raises(ValueError, match="empty=1000 cannot be stored in torch.int8 data"):
        segment.reduce(xi.to(torch.int8), "max", lengths=torch.tensor([4, 0]), empty=1000)
    for empty in (float("-inf"), float("nan"), 0.5):
        with pytest.raises(ValueError, match=rf"empty={empty} cannot be stored in torch.int64 data"):
            segment.reduce(xi, "max", lengths=torch.tensor([4, 0]), empty=empty)
    assert segment.reduce(xi, "max", lengths=torch.tensor([4, 0]), empty=-7).tolist() == [[4], [-7]]


def test_lengths_whose_sum_overflows_raise():
    """(They wrapped to a small total: the compiled kernels then looped ~2**62 times.)"""
    L = torch.tensor([2 ** 62, 2 ** 62, 2 ** 62, 2 ** 62 + 5])
    for backend in ("numba", "torch") if segment.compiled_available() else ("torch",):
        with segment.use_backend(backend):
            for D in (1, 4):
                with pytest.raises(ValueError, match=r"lengths overflow int64: .* at lengths\[1\]"):
                    segment.reduce(torch.randn(5, D), "max", lengths=L)


def test_int32_offsets_check_only_what_is_returned():
    L = torch.tensor([2 ** 31 - 1, 1], dtype=torch.int32)
    assert segment.lengths_to_offsets(L, include_last=False).tolist() == [0, 2 ** 31 - 1]
    assert segment.lengths_to_ranges(L).tolist() == [[0, 2 ** 31 - 1], [2 ** 31 - 1, 1]]
    with pytest.raises(ValueError, match="past the int32 range"):
        segment.lengths_to_offsets(L)


@pytest.mark.parametrize("reducer", ["sum", "mean", "max", "min"])
def test_csr_row_reduce_keeps_autograd(reducer):
    """Rows of a CSR SparseTensor reduced through segment.reduce: values and gradient as on the dense matrix
    (the compiled one-column path had dropped the gradient)."""
    v = torch.tensor([5.0, -1.0, 3.0, 2.5], dtype=torch.float64, requires_grad=True)
    A = sparsefill.sparse_csr_tensor([0, 2, 3, 3, 4], [0, 3, 1, 2], v, (4, 4), fill_value=2.0)
    out = segment.csr_row_reduce(A, reducer)
    v2 = v.detach().clone().requires_grad_()
    dense = torch.full((4, 4), 2.0, dtype=torch.float64).index_put((torch.tensor([0, 0, 1, 3]),
                                                                     torch.tensor([0, 3, 1, 2])), v2)
    ref = {"sum": dense.sum(1), "mean": dense.mean(1), "max": dense.amax(1), "min": dense.amin(1)}[reducer]
    assert_close(out, ref)
    w = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    (out * w).sum().backward()
    (ref * w).sum().backward()
    assert_close(v.grad, v2.grad)


def test_lengths_and_offsets_are_checked_even_without_validation():
    """validate=False skips the O(N) checks only: a negative length made embedding_bag read garbage."""
    x = torch.ones(2, 3)
    with pytest.raises(ValueError, match=r"lengths must be non-negative, got lengths\[1\] = -3"):
        segment.reduce(x, "sum", lengths=torch.tensor([5, -3]), validate=False)
    with pytest.raises(ValueError, match="offsets must not decrease"):
        segment.reduce(x, "sum", offsets=torch.tensor([0, 5, 2]), validate=False)


def test_ftrl_defaults_are_caffe2s():
    """Caffe2 FtrlParams: alpha 0.005, beta 1.0, lambda1 0.001, lambda2 0.001."""
    want = dict(alpha=0.005, beta=1.0, lambda1=0.001, lambda2=0.001)
    for fn in (segment.sparse_ftrl, segment.SparseFtrl.__init__):
        params = inspect.signature(fn).parameters
        assert {k: params[k].default for k in want} == want


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("reducer", ["sum", "mean", "weighted_sum", "max", "min", "logsumexp"])
def test_half_precision_data(dtype, reducer):
    """float16 / bfloat16 data (the torch path): the float32 result rounded, within half precision."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([3, 0, 2, 4])
    x = torch.randn(9, 3, generator=g).to(dtype)
    w = torch.rand(9, generator=g).to(dtype) if reducer == "weighted_sum" else None
    ids = torch.repeat_interleave(torch.arange(4), lengths)
    ref = segment.reduce(x.float(), reducer, lengths=lengths, weights=None if w is None else w.float())
    for kw in (dict(lengths=lengths), dict(segment_ids=ids.flip(0), sorted=False, num_segments=4)):
        xx = x if "lengths" in kw else x.flip(0)
        ww = w if (w is None or "lengths" in kw) else w.flip(0)
        out = segment.reduce(xx, reducer, weights=ww, **kw)
        assert out.dtype == dtype
        assert_close(out.float(), ref, atol=2e-2, rtol=2e-2, equal_nan=True)
