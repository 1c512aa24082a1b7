"""Bad input raises a clear ValueError / TypeError / IndexError that names the argument and the numbers.

Every case also checks that nothing the caller passed was modified.
"""

import copy
import re

import pytest
import torch

import sparsefill
import warnings
import torch.nn.functional as F
from sparsefill import masked
from sparsefill.segment import KeyedJaggedBatch
from tests.models.test_graph_attention import _adj, _N, _KEEP, _Y


def mentions(*words):
    """A regex matching a message that contains every word; numbers must stand alone (``3`` not in ``30``)."""
    parts = []
    for w in words:
        if re.fullmatch(r"-?\d+(\.\d+)?", w):
            parts.append(rf"(?=.*(?<![\w.]){re.escape(w)}(?![\w]|\.\d))")
        else:
            parts.append(rf"(?=.*{re.escape(w)})")
    return "(?s)" + "".join(parts)


def snapshot(x):
    return x.clone() if isinstance(x, torch.Tensor) else copy.deepcopy(x)


def unchanged(before, after):
    if isinstance(after, torch.Tensor):
        return (
            after.dtype == before.dtype
            and after.shape == before.shape
            and torch.equal(after, before)
        )
    return after == before


def check(exc, match, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` raises ``exc`` matching ``match``; no argument (tensor, list) is modified."""
    before = [snapshot(a) for a in args] + [snapshot(v) for v in kwargs.values()]
    with pytest.raises(exc, match=match):
        fn(*args, **kwargs)
    for b, a in zip(before, list(args) + list(kwargs.values())):
        assert unchanged(b, a), f"an input was modified: {b!r} -> {a!r}"


coo = sparsefill.sparse_coo_tensor
csr = sparsefill.sparse_csr_tensor
V3 = torch.tensor([1.0, 2.0, 3.0])
I3 = torch.tensor([[0, 1, 2], [0, 1, 2]])


# ---------------------------------------------------------------------- sparse_coo_tensor
def test_indices_out_of_range():
    check(
        IndexError,
        mentions("indices", "5", "3"),
        coo,
        torch.tensor([[0, 1, 2], [0, 5, 1]]),
        V3.clone(),
        (3, 3),
    )


def test_indices_negative():
    check(
        IndexError,
        mentions("indices", "-1"),
        coo,
        torch.tensor([[0, -1, 2], [0, 1, 2]]),
        V3.clone(),
        (3, 3),
    )
    check(
        IndexError,
        mentions("indices", "-2"),
        coo,
        torch.tensor([[0, 1, 2], [0, 1, -2]]),
        V3.clone(),
    )


def test_indices_float():
    check(TypeError, mentions("indices", "float"), coo, I3.float(), V3.clone(), (3, 3))
    check(TypeError, mentions("indices", "float"), coo, [[0.0, 1.0, 2.0]], V3.clone(), (3,))


def test_indices_one_dimensional():
    check(ValueError, mentions("indices", "3"), coo, torch.tensor([0, 1, 2]), V3.clone(), (3,))


def test_values_indices_length_mismatch():
    check(
        ValueError, mentions("values", "2", "3"), coo, I3.clone(), torch.tensor([1.0, 2.0]), (3, 3)
    )
    check(ValueError, mentions("values", "4", "3"), coo, I3.clone(), torch.ones(4, 2), (3, 3, 2))


def test_size_smaller_than_indices():
    check(IndexError, mentions("indices", "2"), coo, I3.clone(), V3.clone(), (2, 3))
    check(IndexError, mentions("indices", "2", "1"), coo, I3.clone(), V3.clone(), (3, 1))


def test_size_wrong_number_of_dims():
    check(ValueError, r"size.*3, 3, 2", coo, I3.clone(), V3.clone(), (3, 3, 2))
    check(ValueError, r"size.*\b3\b", coo, I3.clone(), V3.clone(), (3,))


def test_size_dense_part_mismatch():
    check(ValueError, mentions("size", "4", "2"), coo, I3.clone(), torch.ones(3, 2), (3, 3, 4))


def test_size_negative():
    check(ValueError, mentions("size", "-3"), coo, I3.clone(), V3.clone(), (3, -3))


def test_is_coalesced_true_with_unsorted_or_duplicate_indices():
    check(
        ValueError,
        mentions("is_coalesced"),
        coo,
        torch.tensor([[2, 1, 0], [0, 1, 2]]),
        V3.clone(),
        (3, 3),
        is_coalesced=True,
    )
    check(
        ValueError,
        mentions("is_coalesced"),
        coo,
        torch.tensor([[0, 0], [1, 1]]),
        torch.tensor([1.0, 2.0]),
        (3, 3),
        is_coalesced=True,
    )


# ---------------------------------------------------------------------- sparse_csr_tensor
def test_crow_indices_not_starting_at_zero():
    check(
        ValueError,
        mentions("crow_indices", "1"),
        csr,
        torch.tensor([1, 2, 3]),
        torch.tensor([0, 1, 2]),
        V3.clone(),
        (2, 3),
    )


def test_crow_indices_not_ending_at_nse():
    check(
        ValueError,
        mentions("crow_indices", "2", "3"),
        csr,
        torch.tensor([0, 2, 2]),
        torch.tensor([0, 1, 2]),
        V3.clone(),
        (2, 3),
    )


def test_crow_indices_decreasing():
    # row 1 has length 1 - 2 = -1: the message names crow_indices and where (row 1 / the entries 2 > 1)
    check(
        ValueError,
        mentions("crow_indices", "1"),
        csr,
        torch.tensor([0, 2, 1, 3]),
        torch.tensor([0, 1, 2]),
        V3.clone(),
        (3, 3),
    )


def test_col_indices_unsorted_within_a_row():
    # row 2 holds columns 3, 1
    check(
        ValueError,
        mentions("col_indices", "2"),
        csr,
        torch.tensor([0, 1, 1, 3, 4]),
        torch.tensor([0, 3, 1, 2]),
        torch.ones(4),
        (4, 4),
    )


def test_col_indices_duplicate_within_a_row():
    # row 1 holds column 2 twice
    check(
        ValueError,
        mentions("col_indices", "1"),
        csr,
        torch.tensor([0, 1, 3]),
        torch.tensor([0, 2, 2]),
        V3.clone(),
        (2, 3),
    )


def test_col_indices_sorted_across_rows_is_fine():
    A = csr(torch.tensor([0, 2, 3]), torch.tensor([1, 2, 0]), V3.clone(), (2, 3))
    torch.testing.assert_close(A.to_dense(), torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]]))


def test_col_indices_out_of_range():
    check(
        IndexError,
        mentions("col_indices", "7", "3"),
        csr,
        torch.tensor([0, 2, 3]),
        torch.tensor([0, 1, 7]),
        V3.clone(),
        (2, 3),
    )
    check(
        IndexError,
        mentions("col_indices", "-1"),
        csr,
        torch.tensor([0, 2, 3]),
        torch.tensor([0, 1, -1]),
        V3.clone(),
        (2, 3),
    )


def test_col_indices_float():
    check(
        TypeError,
        mentions("col_indices", "float"),
        csr,
        torch.tensor([0, 2, 3]),
        torch.tensor([0.0, 1.0, 2.0]),
        V3.clone(),
        (2, 3),
    )


def test_csr_values_mismatch():
    check(
        ValueError,
        mentions("values", "3"),
        csr,
        torch.tensor([0, 2, 3]),
        torch.tensor([0, 1, 2]),
        torch.tensor([1.0, 2.0]),
        (2, 3),
    )


def test_csr_size_mismatch():
    check(
        ValueError,
        mentions("size", "4"),
        csr,
        torch.tensor([0, 2, 3]),
        torch.tensor([0, 1, 2]),
        V3.clone(),
        (4, 3),
    )


# ---------------------------------------------------------------------- fill values
def test_fill_wrong_shape():
    vals = torch.ones(2, 2)
    idx = torch.tensor([[0, 1]])
    check(
        ValueError,
        mentions("fill_value", "3", "2"),
        coo,
        idx,
        vals,
        (3, 2),
        fill_value=torch.zeros(3),
    )
    check(
        ValueError,
        mentions("fill_value", "3", "2"),
        coo,
        idx,
        vals,
        (3, 2),
        fill_value=[1.0, 2.0, 3.0],
    )
    check(
        ValueError,
        mentions("fill_value", "2"),
        coo,
        idx,
        vals,
        (3, 2),
        fill_value=torch.zeros(2, 2),
    )
    check(
        ValueError,
        mentions("fill_value", "2"),
        sparsefill.to_sparse,
        torch.ones(3, 2),
        fill_value=torch.zeros(2),
    )  # dense_dim=0: only a scalar fits
    check(
        ValueError,
        mentions("fill_value", "3"),
        sparsefill.to_sparse,
        torch.ones(3, 2),
        dense_dim=1,
        fill_value=torch.zeros(3),
    )


def test_fill_tensor_wrong_dtype():
    check(
        TypeError,
        mentions("fill_value", "float64", "float32"),
        coo,
        I3.clone(),
        V3.clone(),
        (3, 3),
        fill_value=torch.tensor(1.0, dtype=torch.float64),
    )
    check(
        TypeError,
        mentions("fill_value", "int64", "float32"),
        sparsefill.to_sparse,
        torch.ones(2, 2),
        fill_value=torch.tensor(1),
    )


def test_fill_float_for_int_tensor():
    check(
        TypeError,
        mentions("fill_value", "5.5", "int64"),
        coo,
        I3.clone(),
        torch.tensor([1, 2, 3]),
        (3, 3),
        fill_value=5.5,
    )
    check(
        TypeError,
        mentions("fill_value", "5.5", "int64"),
        sparsefill.to_sparse,
        torch.ones(2, 2, dtype=torch.int64),
        fill_value=5.5,
    )


def test_fill_complex_for_float_tensor():
    check(
        TypeError,
        mentions("fill_value", "float32"),
        coo,
        I3.clone(),
        V3.clone(),
        (3, 3),
        fill_value=1 + 2j,
    )


def test_fill_out_of_range_for_uint8():
    vals = torch.tensor([1, 2, 3], dtype=torch.uint8)
    check(
        ValueError,
        mentions("fill_value", "300", "uint8"),
        coo,
        I3.clone(),
        vals,
        (3, 3),
        fill_value=300,
    )
    check(
        ValueError,
        mentions("fill_value", "-1", "uint8"),
        coo,
        I3.clone(),
        vals,
        (3, 3),
        fill_value=-1,
    )


def test_fill_overflowing_a_float_dtype():
    """A finite fill that becomes inf in the dtype is refused as an integer out of range is (it was stored as inf)."""
    half = V3.clone().half()
    check(
        ValueError,
        mentions("fill_value", "1000000.0", "float16"),
        coo,
        I3.clone(),
        half,
        (3, 3),
        fill_value=1e6,
    )
    check(
        ValueError,
        mentions("fill_value", "float16"),
        coo,
        torch.tensor([[0]]),
        torch.ones(1, 2).half(),
        (3, 2),
        fill_value=[1.0, 1e6],
    )
    check(
        ValueError,
        mentions("fill_value", "1e+39", "bfloat16"),
        sparsefill.full,
        (2,),
        1e39,
        dtype=torch.bfloat16,
    )
    check(
        ValueError,
        mentions("fill_value", "float16"),
        sparsefill.to_sparse,
        torch.ones(2, dtype=torch.float16),
        fill_value=10**6,
    )
    for ok in (
        65504.0,
        float("inf"),
        -float("inf"),
        float("nan"),
    ):  # (the largest float16, and no finite number)
        A = coo(I3.clone(), half, (3, 3), fill_value=ok)
        torch.testing.assert_close(
            A._fill_value(), torch.tensor(ok, dtype=torch.float16), equal_nan=True
        )


@pytest.mark.parametrize("fill", [{}, {"a": 1}, Ellipsis, "1.0", {1.0}])
def test_fill_of_no_number_names_fill_value(fill):
    check(
        TypeError,
        mentions("fill_value", type(fill).__name__),
        coo,
        I3.clone(),
        V3.clone(),
        (3, 3),
        fill_value=fill,
    )
    check(TypeError, mentions("fill_value"), sparsefill.full, (2,), fill)
    check(TypeError, mentions("fill_value"), sparsefill.to_sparse, torch.ones(2), fill_value=fill)


def test_fill_not_a_bool():
    check(
        TypeError,
        mentions("fill_value", "2", "bool"),
        coo,
        I3.clone(),
        torch.tensor([True, False, True]),
        (3, 3),
        fill_value=2,
    )


def test_set_fill_value_wrong_shape_leaves_tensor_unchanged():
    A = coo(torch.tensor([[0, 1]]), torch.ones(2, 2), (3, 2), fill_value=5.0)
    dense = A.to_dense()
    check(ValueError, mentions("fill_value", "3", "2"), A.set_fill_value_, torch.zeros(3))
    check(
        TypeError,
        mentions("fill_value", "float64"),
        A.set_fill_value_,
        torch.zeros(2, dtype=torch.float64),
    )
    torch.testing.assert_close(A.to_dense(), dense, rtol=0, atol=0)


# ---------------------------------------------------------------------- layouts and dense_dim
def test_csr_needs_two_sparse_dims():
    check(
        ValueError,
        mentions("sparse_csr", "2", "1"),
        sparsefill.to_sparse,
        torch.ones(3),
        layout=torch.sparse_csr,
    )
    check(
        ValueError,
        mentions("sparse_csr", "2", "1"),
        sparsefill.to_sparse,
        torch.ones(3, 4),
        layout=torch.sparse_csr,
        dense_dim=1,
    )
    A = sparsefill.to_sparse(torch.tensor([1.0, 0.0, 2.0]))
    check(ValueError, mentions("sparse_csr", "2", "1"), A.to_sparse, layout=torch.sparse_csr)
    check(ValueError, mentions("sparse_csr", "2"), sparsefill.zeros, 3, layout=torch.sparse_csr)


def test_bad_dense_dim():
    x = torch.ones(2, 3)
    check(ValueError, mentions("dense_dim", "3", "2"), sparsefill.to_sparse, x, dense_dim=3)
    check(ValueError, mentions("dense_dim", "-1"), sparsefill.to_sparse, x, dense_dim=-1)
    A = sparsefill.to_sparse(x)
    check(ValueError, mentions("dense_dim", "5"), A.to_sparse, dense_dim=5)


def test_bad_layout():
    check(
        ValueError,
        mentions("layout", "sparse_csc"),
        sparsefill.to_sparse,
        torch.ones(2, 3),
        layout=torch.sparse_csc,
    )


# ---------------------------------------------------------------- edge cases
import sparsefill as sf  # noqa: E402


@pytest.mark.filterwarnings("ignore::sparsefill.DensifyWarning")
@pytest.mark.parametrize(
    "bad",
    [
        lambda: sf.to_sparse(torch.tensor([True, False])).argmax(),
        lambda: sf.to_sparse(torch.tensor([1, 0])).var(),
        lambda: sf.to_sparse(torch.tensor([True, False])).median(),
        lambda: sf.to_sparse(torch.tensor([1j, 0])).nansum(),
        lambda: torch._foreach_add([sf.to_sparse(torch.tensor([1.0, 0.0]))], [1.0, 2.0]),
        lambda: sf.to_sparse(torch.ones(1, 3)).add_(sf.to_sparse(torch.ones(2, 3))),
    ],
)
def test_invalid_input_raises_as_dense_torch(bad):
    with pytest.raises(
        RuntimeError
    ):  # (NotImplementedError, torch's "not implemented for 'Bool'", is one)
        bad()


# ============================================================================== errors a user meets
@pytest.mark.parametrize(
    "case", ["mul_column", "add_matrix", "dense_plus_A", "where", "fill0_large"]
)
def test_shape_mismatch_with_a_masked_operand_raises_torchs_error(case):
    """(These once raised 'no sparse handler ... give it a fill' or a DensifyError.)"""
    A = _adj()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sparsefill.DensifyWarning)
        with pytest.raises(RuntimeError, match="size of tensor"):
            if case == "fill0_large":
                sparsefill.sparse_coo_tensor(
                    [[0, 1], [1, 2]], torch.ones(2), (50000, 50000)
                ) * torch.randn(50001)[:, None]
            elif case == "mul_column":
                A * torch.randn(_N + 1)[:, None]
            elif case == "add_matrix":
                A + torch.randn(_N + 1, _N + 1)
            elif case == "dense_plus_A":
                torch.randn(_N, _N + 1) + A
            else:
                torch.where(torch.ones(_N + 1, _N + 1, dtype=torch.bool), A, 0.0)


def test_shape_mismatch_errors_that_are_clear():
    """What already names the shapes: products, dims out of range, bad jagged batches, ids out of range, a masked
    element read as a number or given to a loss."""
    with pytest.raises(RuntimeError, match="same reduction dim"):
        _adj() @ torch.randn(_N + 1, 2)
    with pytest.raises(IndexError, match="Dimension out of range"):
        masked.softmax(_adj(), 2)
    with pytest.raises(ValueError, match="values_lengths sum to 3"):
        KeyedJaggedBatch(
            torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([0]), torch.tensor([1])
        )
    with pytest.raises(IndexError, match="10 is out of range for 4 rows"):
        KeyedJaggedBatch.from_lists([{0: [10]}]).pooled({0: torch.randn(4, 2)})
    i, j = int((~_KEEP).nonzero()[0, 0]), int((~_KEEP).nonzero()[0, 1])
    with pytest.raises(ValueError, match="indefinite"):
        float(_adj()[i, j])
    with warnings.catch_warnings(), pytest.raises(ValueError, match="indefinite"):
        warnings.simplefilter("ignore", sparsefill.DensifyWarning)
        F.cross_entropy(_adj(), _Y)
