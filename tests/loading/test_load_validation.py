"""A SparseTensor whose parts come from outside is checked before any kernel indexes memory with them.

    load(tampered file) raises ValueError naming the part        (never a tensor, so never B @ x)
    load(valid file) == the tensor saved                           (files of earlier releases too)

for every path that rebuilds one from parts it did not compute: ``torch.load(weights_only=True)`` (the zip
and the legacy format, whose bytes are read after unpickling), ``pickle``, ``copy.deepcopy``, the
``torch.multiprocessing`` reduction (queues, DataLoader workers), ``sparsefill.from_torch`` and the
``sparsefill.distributed`` decode.  A tampered file is written from a tensor made by ``SparseTensor._make``
(the unchecked internal constructor: a file holds whatever parts an attacker chose).
"""

import copy
import io
import pathlib
import pickle
import sys
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
import torch.multiprocessing  # noqa: F401  (registers torch's shared-memory reductions)

import sparsefill
from sparsefill import SparseTensor
from sparsefill.distributed import _wire

COO, CSR = torch.sparse_coo, torch.sparse_csr
I64 = torch.int64
DATA = pathlib.Path(__file__).parents[1] / "data"


def _t(x, dtype=I64):
    return x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=dtype)


def _tampered(
    layout, size, vals, fill=0.0, idx=None, crow=None, col=None, indefinite=False, coalesced=False
):
    """A SparseTensor holding exactly these parts, unchecked (what a tampered file holds)."""
    vals = _t(vals, torch.float32) if not isinstance(vals, torch.Tensor) else vals
    fill = _t(fill, vals.dtype) if not isinstance(fill, torch.Tensor) else fill
    return SparseTensor._make(
        layout,
        tuple(size),
        vals,
        fill,
        None if idx is None else _t(idx),
        None if crow is None else _t(crow),
        None if col is None else _t(col),
        indefinite,
        coalesced or layout is CSR,
        False,
    )


# (parts, the error's words): each breaks one invariant a kernel relies on
TAMPERED = {
    "coo_index_out_of_range": (
        dict(layout=COO, size=(3, 4), vals=[1.0, 2.0], idx=[[0, 1], [1, 2**40]]),
        r"indices\[1\] has an entry 1099511627776 out of range for size 4",
    ),
    "coo_negative_index": (
        dict(layout=COO, size=(3, 4), vals=[1.0, 2.0], idx=[[0, -1], [1, 2]]),
        r"indices\[0\] has a negative entry -1",
    ),
    "coo_unsorted_claimed_coalesced": (
        dict(layout=COO, size=(3, 4), vals=[1.0, 2.0], idx=[[2, 0], [0, 0]], coalesced=True),
        "not sorted without duplicates",
    ),
    "coo_duplicates_claimed_coalesced": (
        dict(layout=COO, size=(3, 4), vals=[1.0, 2.0], idx=[[1, 1], [2, 2]], coalesced=True),
        "not sorted without duplicates",
    ),
    "coo_values_wrong_leading_size": (
        dict(layout=COO, size=(3, 4), vals=[1.0, 2.0, 3.0], idx=[[0, 1], [1, 2]]),
        "values has 3 rows",
    ),
    "coo_size_of_other_rank": (
        dict(layout=COO, size=(3, 4, 5), vals=[1.0], idx=[[0], [1]]),
        r"size \(3, 4, 5\) does not match indices",
    ),
    "coo_indices_int32": (
        dict(layout=COO, size=(3,), vals=[1.0], idx=_t([[1]], torch.int32)),
        "indices must have dtype torch.int64",
    ),
    "coo_nse_larger_than_size_claimed_coalesced": (
        dict(layout=COO, size=(2,), vals=[1.0, 2.0, 3.0], idx=[[0, 1, 1]], coalesced=True),
        "not sorted",
    ),
    "fill_of_another_shape": (
        dict(layout=COO, size=(4, 3), vals=torch.ones(1, 3), fill=[1.0, 2.0], idx=[[0]]),
        r"fill_value of shape \(2,\) does not broadcast",
    ),
    "fill_of_another_dtype": (
        dict(layout=COO, size=(3,), vals=[1.0], fill=_t(0.0, torch.float64), idx=[[0]]),
        "fill_value has dtype torch.float64 but values has dtype torch.float32",
    ),
    "indefinite_fill_not_empty": (
        dict(layout=COO, size=(3,), vals=[1.0], fill=1.0, idx=[[0]], indefinite=True),
        r"indefinite fill is stored as a tensor of shape \(0,\)",
    ),
    "csr_col_out_of_range": (
        dict(layout=CSR, size=(3, 4), vals=[1.0, 2.0, 3.0], crow=[0, 1, 1, 3], col=[2, 0, 2**40]),
        "col_indices has an entry 1099511627776 out of range for size 4 of columns",
    ),
    "csr_negative_col": (
        dict(layout=CSR, size=(3, 4), vals=[1.0, 2.0, 3.0], crow=[0, 1, 1, 3], col=[2, -5, 3]),
        "col_indices has a negative entry -5",
    ),
    "csr_unsorted_in_a_row": (
        dict(layout=CSR, size=(3, 4), vals=[1.0, 2.0, 3.0], crow=[0, 1, 1, 3], col=[2, 3, 0]),
        r"strictly increasing within each row: in row 2, stored element 2 \(column 0\)",
    ),
    "csr_duplicate_in_a_row": (
        dict(layout=CSR, size=(3, 4), vals=[1.0, 2.0, 3.0], crow=[0, 1, 1, 3], col=[2, 1, 1]),
        "strictly increasing within each row",
    ),
    "csr_crow_too_long": (
        dict(layout=CSR, size=(3, 4), vals=[1.0, 2.0, 3.0], crow=[0, 1, 1, 3, 3], col=[2, 0, 3]),
        r"size \(3, 4\) does not match crow_indices \(batch \(\), nrows 4\)",
    ),
    "csr_crow_too_short": (
        dict(layout=CSR, size=(3, 4), vals=[1.0, 2.0, 3.0], crow=[0, 3], col=[0, 1, 3]),
        "does not match crow_indices",
    ),
    "csr_crow_decreasing": (
        dict(layout=CSR, size=(3, 4), vals=[1.0, 2.0, 3.0], crow=[0, 2, 1, 3], col=[0, 1, 3]),
        r"crow_indices must be non-decreasing: at \(\) row 1 it goes from 2 to 1",
    ),
    "csr_crow_wrong_start": (
        dict(layout=CSR, size=(3, 4), vals=[1.0, 2.0, 3.0], crow=[1, 1, 1, 3], col=[0, 1, 3]),
        "crow_indices must start at 0 and end at nse=3",
    ),
    "csr_crow_wrong_end": (
        dict(layout=CSR, size=(3, 4), vals=[1.0, 2.0, 3.0], crow=[0, 1, 1, 9], col=[0, 1, 3]),
        "crow_indices must start at 0 and end at nse=3",
    ),
    "csr_nse_larger_than_size": (
        dict(layout=CSR, size=(1, 2), vals=[1.0, 2.0, 3.0], crow=[0, 3], col=[0, 1, 1]),
        "nse=3 exceeds the 2 positions of a 1 x 2 matrix",
    ),
    "csr_values_wrong_leading_size": (
        dict(layout=CSR, size=(2, 2), vals=[1.0], crow=[0, 1, 2], col=[0, 1]),
        r"values \(shape \(1,\)\) and col_indices",
    ),
    "csr_batched_crow_wrong_in_batch_1": (
        dict(
            layout=CSR,
            size=(2, 2, 3),
            vals=torch.ones(2, 2),
            crow=[[0, 1, 2], [0, 3, 2]],
            col=[[1, 0], [0, 2]],
        ),
        "crow_indices must be non-decreasing: at \\(1,\\) row 1",
    ),
    "csr_batched_col_out_of_range": (
        dict(
            layout=CSR,
            size=(2, 2, 3),
            vals=torch.ones(2, 2),
            crow=[[0, 1, 2], [0, 2, 2]],
            col=[[1, 0], [0, 3]],
        ),
        "col_indices has an entry 3 out of range for size 3",
    ),
    "csr_col_float": (
        dict(layout=CSR, size=(2, 2), vals=[1.0], crow=[0, 1, 1], col=_t([0.0], torch.float32)),
        "col_indices must have dtype torch.int64",
    ),
}


def _torch_load(A, zip_format=True):
    b = io.BytesIO()
    torch.save({"weights": [A]}, b, _use_new_zipfile_serialization=zip_format)
    b.seek(0)
    return torch.load(b, weights_only=True)["weights"][0]


def _via_queue(A):
    """What ``torch.multiprocessing`` queues and DataLoader workers do: torch's shared-memory reductions."""
    return pickle.loads(ForkingPickler.dumps(A))


LOADERS = {
    "torch_load": _torch_load,
    "torch_load_legacy": lambda A: _torch_load(A, zip_format=False),
    "pickle": lambda A: pickle.loads(pickle.dumps(A)),
    "deepcopy": copy.deepcopy,
    "queue": _via_queue,
}


@pytest.mark.parametrize("load", LOADERS.values(), ids=LOADERS.keys())
@pytest.mark.parametrize("case", TAMPERED.keys())
def test_a_tampered_tensor_is_refused_at_load(case, load):
    parts, words = TAMPERED[case]
    with pytest.raises(ValueError, match=words):
        load(_tampered(**parts))


def test_a_tampered_file_cannot_reach_a_kernel():
    """A column index of 2**40 in a (3, 4) CSR file; ``B @ x``, ``B.sum(1)``,
    ``B.amax(1)`` and ``to_sparse_coo`` never run, as no B is returned."""
    A = sparsefill.sparse_csr_tensor(
        [0, 1, 1, 3], [2, 0, 3], [1.0, 2.0, 3.0], (3, 4), fill_value=-1.0
    )
    A.col_indices()[2] = 2**40  # (an in-place write, as a tampered file's bytes)
    b = io.BytesIO()
    torch.save(A, b)
    b.seek(0)
    with pytest.raises(
        ValueError, match="col_indices has an entry 1099511627776 out of range for size 4"
    ):
        torch.load(b, weights_only=True)


def test_valid_tensors_load_unchanged_on_every_path():
    sys.path.insert(0, str(DATA))
    try:
        from saved_sparsetensors import tensors
    finally:
        sys.path.remove(str(DATA))
    for name, A in tensors().items():
        for how, load in LOADERS.items():
            _same(load(A), A, f"{name} via {how}")


@pytest.mark.parametrize(
    "file", ["saved_sparsetensors.pt", "saved_sparsetensors_legacy.pt", "saved_sparsetensors.pkl"]
)
def test_files_of_the_earlier_format_still_load(file):
    sys.path.insert(0, str(DATA))
    try:
        from saved_sparsetensors import tensors
    finally:
        sys.path.remove(str(DATA))
    path = DATA / file
    got = (
        pickle.loads(path.read_bytes())
        if file.endswith(".pkl")
        else torch.load(path, weights_only=True)
    )
    want = tensors()
    assert got.keys() == want.keys()
    for name in want:
        _same(got[name], want[name], f"{name} of {file}")
    assert got["parameter"]._is_param and got["parameter"].requires_grad


def test_the_indefinite_fill_pickled_before_the_layers_moved_loads_as_itself():
    """``indefinite_fill.pkl`` names ``sparsefill._creation.indefinite`` (the sentinel's module
    before the code moved into layers); it loads as the one sentinel, and pickles of it still do."""
    got = pickle.loads((DATA / "indefinite_fill.pkl").read_bytes())
    assert got["indefinite"] is sparsefill.indefinite
    assert got["fill_kinds"][0] is sparsefill.indefinite and got["fill_kinds"][1] == 0.5
    assert pickle.loads(pickle.dumps(sparsefill.indefinite)) is sparsefill.indefinite


def _same(B, A, what):
    assert type(B) is SparseTensor, what
    assert (
        B.shape,
        B.dtype,
        B.sparse_layout,
        B.dense_dim(),
        B.is_fill_indefinite(),
        B.is_coalesced(),
        B.requires_grad,
    ) == (
        A.shape,
        A.dtype,
        A.sparse_layout,
        A.dense_dim(),
        A.is_fill_indefinite(),
        A.is_coalesced(),
        A.requires_grad,
    ), what
    for n in A.__tensor_flatten__()[0]:
        torch.testing.assert_close(
            getattr(B, n), getattr(A, n), equal_nan=True, rtol=0, atol=0, msg=what
        )
    assert B.__dict__.get("_is_param") == A.__dict__.get("_is_param"), what


def test_a_huge_sparse_shape_loads_in_time_proportional_to_nse():
    """(2**31, 2**31) with 3 stored elements: the check reads the 3, allocating nothing of the shape's size
    (the dense tensor would be 2**62 elements).  (2**40, 2**40) has more than 2**63 elements: no torch tensor
    of that shape exists.)"""
    n = 2**31
    A = sparsefill.sparse_coo_tensor(
        [[0, 5, n - 1], [n - 1, 0, 7]], [1.0, 2.0, 3.0], (n, n), fill_value=1.0
    )
    C = sparsefill.sparse_csr_tensor([[0, 1, 3]], [[n - 1, 0, n - 1]], [[1.0, 2.0, 3.0]], (1, 2, n))
    for how, load in LOADERS.items():
        _same(load(A), A, how)
        _same(load(C), C, how)
    bad = _tampered(COO, (n, n), [1.0, 2.0], idx=[[0, n], [0, 0]])
    with pytest.raises(
        ValueError, match=f"indices\\[0\\] has an entry {n} out of range for size {n}"
    ):
        _torch_load(bad)


@pytest.mark.parametrize(
    "extra, words",
    [
        ({"_idx": torch.tensor([[9]])}, "_idx"),
        ({"_sf_layout": CSR}, "_sf_layout"),
        ({"data": torch.zeros(3)}, "data"),
        ({"__class__": torch.Tensor}, "__class__"),
    ],
)
def test_a_file_cannot_set_the_storage_through_extra_attributes(extra, words):
    from sparsefill._tensor.tensor import _rebuild

    A = sparsefill.sparse_coo_tensor([[0]], [1.0], (3,))
    fn, args = A.__reduce_ex__(2)
    with pytest.raises(ValueError, match=words):
        _rebuild(*args[:4], extra)


@pytest.mark.parametrize(
    "ctx, inner, words",
    [
        ((torch.strided, False, True), None, "layout torch.sparse_coo or torch.sparse_csr"),
        ((COO, 1, True), None, "metadata must be"),
        (None, {"_idx": torch.zeros(1, 1, dtype=I64), "_vals": torch.ones(1)}, "is stored as"),
        (
            None,
            {"_idx": torch.zeros(1, 1, dtype=I64), "_vals": torch.ones(1), "_fill": 0.0},
            "fill_value must be a",
        ),
        (
            None,
            {
                "_idx": torch.zeros(1, 1, dtype=I64),
                "_vals": torch.ones(1).to_sparse(),
                "_fill": torch.zeros(()),
            },
            "values must be a strided torch.Tensor",
        ),
        (
            None,
            {
                "_idx": torch.nn.Parameter(_t([[5]]), requires_grad=False),
                "_vals": torch.ones(1),
                "_fill": torch.zeros(()),
            },
            "indices must be a plain torch.Tensor, got Parameter",
        ),
    ],
)
def test_malformed_metadata_is_refused(ctx, inner, words):
    from sparsefill._tensor.tensor import _rebuild

    A = sparsefill.sparse_coo_tensor([[0]], [1.0], (3,))
    size, inner0, ctx0, rg = A.__reduce_ex__(2)[1]
    with pytest.raises(ValueError, match=words):
        _rebuild(size, inner0 if inner is None else inner, ctx0 if ctx is None else ctx, rg)


def test_the_class_is_not_a_safe_global():
    """``torch.load(weights_only=True)`` allows ``_rebuild`` alone: the class would let a file call the
    unchecked constructor (NEWOBJ/REDUCE) or set attributes (BUILD)."""
    allowed = torch.serialization.get_safe_globals()
    assert SparseTensor not in allowed
    assert sparsefill._tensor._rebuild in allowed


def test_a_dataloader_worker_sends_a_checked_tensor():
    A = sparsefill.sparse_csr_tensor(
        [0, 1, 1, 3], [2, 0, 3], [1.0, 2.0, 3.0], (3, 4), fill_value=-1.0
    )
    bad = _tampered(CSR, (3, 4), [1.0, 2.0, 3.0], crow=[0, 1, 1, 3], col=[2, 0, 2**40])
    loader = torch.utils.data.DataLoader([A, bad], batch_size=None, num_workers=1)
    it = iter(loader)
    _same(next(it), A, "the valid item")
    with pytest.raises(
        ValueError, match="col_indices has an entry 1099511627776 out of range for size 4"
    ):
        next(it)


def test_from_torch_checks_a_native_tensor_torch_did_not_check():
    """torch loads its own sparse tensors unchecked unless ``check_sparse_tensor_invariants`` is on."""
    t = torch.sparse_coo_tensor(
        _t([[0, 1], [1, 2**40]]), torch.ones(2), (3, 4), check_invariants=False
    )
    with pytest.raises(
        ValueError, match="indices\\[1\\] has an entry 1099511627776 out of range for size 4"
    ):
        sparsefill.from_torch(t)
    c = torch.sparse_csr_tensor(
        _t([0, 3, 2]), _t([0, 1]), torch.ones(2), (2, 2), check_invariants=False
    )
    with pytest.raises(ValueError, match="crow_indices must be non-decreasing"):
        sparsefill.from_torch(c)
    A = sparsefill.sparse_coo_tensor([[0]], [1.0], (3, 4)[:1])
    with pytest.raises(ValueError, match="out of range"):
        A + torch.sparse_coo_tensor(_t([[7]]), torch.ones(1), (3,), check_invariants=False)


# ---------------------------------------------------------------------- the distributed decode
def _packed(A):
    h, payload = _wire.pack(A)
    return h, payload


def _with_keys(payload, keys):
    out = payload.clone()
    out[: 8 * len(keys)] = _t(keys).view(torch.uint8)
    return out


@pytest.mark.parametrize("as_parts", [False, True], ids=["tensor", "parts"])
@pytest.mark.parametrize(
    "keys, words",
    [
        ([3, 4, 2**40], "an entry 1099511627776 out of range \\[0, 12\\)"),
        ([-1, 4, 9], "an entry -1 out of range"),
        ([4, 3, 9], "sorted without duplicates; key 1 \\(3\\) follows 4"),
        ([3, 3, 9], "sorted without duplicates"),
    ],
)
def test_the_distributed_decode_refuses_bad_keys(keys, words, as_parts):
    for layout in (COO, CSR):
        A = sparsefill.sparse_coo_tensor(
            [[0, 1, 2], [3, 0, 1]], [1.0, 2.0, 3.0], (3, 4), fill_value=2.0
        )
        A = A.to_sparse(layout)
        h, payload = _packed(A)
        torch.testing.assert_close(
            _wire.unpack(h, payload, A.shape, "cpu").to_dense(), A.to_dense()
        )
        with pytest.raises(ValueError, match="received an invalid tensor: keys.*" + words):
            _wire.unpack(h, _with_keys(payload, keys), A.shape, "cpu", keys=as_parts)


@pytest.mark.parametrize(
    "field, value, words",
    [
        (_wire.NSE, 100, "nse=100 needs more than the 40 bytes received"),
        (_wire.NSE, -1, "nse, fill ndim"),
        (_wire.FILL_NDIM, 3, "nse, fill ndim"),
        (_wire.DTYPE, 99, "dtype or kind code"),
        (_wire.LAYOUT, 1, "layout or dense_dim"),  # CSR of a 1-D tensor
        (_wire.DENSE_DIM, 5, "layout or dense_dim"),
        (_wire.NDIM, 3, "ndim for a tensor of shape"),
    ],
)
def test_the_distributed_decode_refuses_a_bad_header(field, value, words):
    A = sparsefill.sparse_coo_tensor([[0, 3, 5]], [1.0, 2.0, 3.0], (6,), fill_value=2.0)
    h, payload = _packed(A)
    h[field] = value
    with pytest.raises(ValueError, match="received an invalid header.*" + words):
        _wire.unpack(h, payload, A.shape, "cpu")


def test_a_keyed_jagged_batch_is_checked_when_unpickled():
    """Its lengths index the values in the segment kernels: a batch from a pickle, queue or deep copy is
    rebuilt by its constructor (checked), not field by field."""
    from sparsefill.segment import KeyedJaggedBatch

    kj = KeyedJaggedBatch.from_lists([{1: [10, 11], 3: [12]}, {2: [13]}])
    for how, load in LOADERS.items():
        if how.startswith("torch_load"):
            continue  # (not a safe global: weights_only refuses it)
        got = load(kj)
        assert got.to_dict() == kj.to_dict(), how
        bad = KeyedJaggedBatch(
            kj.values, torch.tensor([2, 1, 9]), kj.keys, kj.example_lengths, validate=False
        )
        with pytest.raises(ValueError, match="values_lengths"):
            load(bad)
