"""The DataLoader batches SparseTensors and KeyedJaggedBatches the same way with and without workers.

batch(num_workers=0) == batch(num_workers=2)             type, layout, fill, pattern, values
batch.to_dense() == torch.stack([item.to_dense() ...])    (SparseTensors: a new leading batch dim)
batch == KeyedJaggedBatch.concat(items)                   (KeyedJaggedBatches)
"""

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import sparsefill
from sparsefill import SparseTensor
from sparsefill.data import collate, collate_sparse
from sparsefill.segment import KeyedJaggedBatch

N = 6


def _item(i: int) -> dict:
    """Item ``i``: a pattern that changes with ``i`` (item 0 stores nothing), every layout and fill kind."""
    g = torch.Generator().manual_seed(i)
    x = torch.randn(4, 5, generator=g, dtype=torch.float64)
    x[torch.rand(4, 5, generator=g) < (1.0 if i == 0 else 0.6)] = 1.5
    h = torch.randn(4, 2, generator=g)
    h[torch.rand(4, generator=g) < 0.5] = torch.tensor([7.0, 8.0])
    m = torch.rand(4, 5, generator=g) < 0.4
    return {
        "coo": sparsefill.to_sparse(x, fill_value=1.5),
        "csr": sparsefill.to_sparse(x, fill_value=1.5, layout=torch.sparse_csr),
        "hybrid": sparsefill.to_sparse(h, fill_value=torch.tensor([7.0, 8.0]), dense_dim=1),
        "nan_fill": sparsefill.to_sparse(torch.where(m, x, torch.nan), fill_value=torch.nan),
        "indefinite": sparsefill.sparse_coo_tensor(
            m.nonzero().T, x[m], (4, 5), fill_value=sparsefill.indefinite
        ),
        "int": sparsefill.to_sparse((x * 3).to(torch.int64), fill_value=4),
        "bool": sparsefill.to_sparse(m, fill_value=False),
        "jagged": KeyedJaggedBatch.from_lists(
            [{1: list(range(i)), 3: [100 + i]}] + [{2: [i]}] * (i % 2)
        ),
        "label": i,
    }


class _Items(Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return _item(i)


def _dense(A):
    return A.to_dense(fill_value=0) if A.is_fill_indefinite() else A.to_dense()


def _same_sparse(a: SparseTensor, b: SparseTensor) -> None:
    assert type(a) is type(b) is SparseTensor
    assert (a.shape, a.dtype, a.sparse_layout, a.dense_dim(), a.is_fill_indefinite()) == (
        b.shape,
        b.dtype,
        b.sparse_layout,
        b.dense_dim(),
        b.is_fill_indefinite(),
    )
    torch.testing.assert_close(a.fill_value(), b.fill_value(), equal_nan=True, rtol=0, atol=0)
    names = a.__tensor_flatten__()[0]
    for n in names[:-1]:  # indices (or crow/col) and values: one pattern, one set of values
        torch.testing.assert_close(getattr(a, n), getattr(b, n), equal_nan=True, rtol=0, atol=0)


def _batches(num_workers: int, **kw) -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("error", sparsefill.DensifyWarning)
        return list(DataLoader(_Items(), batch_size=4, num_workers=num_workers, **kw))


def test_default_collate_is_the_same_with_and_without_workers():
    plain, workers = _batches(0), _batches(2)
    explicit = _batches(0, collate_fn=collate)
    assert len(plain) == len(workers) == len(explicit) == 2
    for k, (b0, b2, be) in enumerate(zip(plain, workers, explicit)):
        items = [_item(i) for i in range(4 * k, min(4 * k + 4, N))]
        torch.testing.assert_close(b0["label"], torch.arange(4 * k, 4 * k + len(items)))
        for name in ("coo", "csr", "hybrid", "nan_fill", "indefinite", "int", "bool"):
            _same_sparse(b0[name], b2[name])
            _same_sparse(b0[name], be[name])
            assert b0[name].shape == (len(items),) + items[0][name].shape
            torch.testing.assert_close(
                _dense(b0[name]),
                torch.stack([_dense(it[name]) for it in items]),
                equal_nan=True,
                rtol=0,
                atol=0,
            )
        assert b0["csr"].sparse_layout is torch.sparse_csr and b0["hybrid"].dense_dim() == 1
        want = KeyedJaggedBatch.concat([it["jagged"] for it in items])
        for b in (b0, b2, be):
            assert type(b["jagged"]) is KeyedJaggedBatch
            assert b["jagged"].to_dict() == want.to_dict()
            torch.testing.assert_close(b["jagged"].values, want.values)


class _Bad(Dataset):
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def _A(fill=5.0, shape=(4,)):
    return sparsefill.sparse_coo_tensor([[0, 2]], [1.0, 2.0], shape, fill_value=fill)


@pytest.mark.parametrize(
    "items,err,match",
    [
        (
            [_A(), _A(fill=6.0)],
            ValueError,
            r"element 1 of the batch \(shape \(4,\).*fill 6.0\) differs from element 0",
        ),
        ([_A(), _A(shape=(5,))], ValueError, r"element 1 .*shape \(5,\)"),
        ([_A(), _A(fill=sparsefill.indefinite)], ValueError, "fill indefinite"),
        (
            [
                sparsefill.to_sparse(torch.eye(2)),
                sparsefill.to_sparse(torch.eye(2), layout=torch.sparse_csr),
            ],
            ValueError,
            r"element 1 .*torch.sparse_csr",
        ),
        ([_A(), torch.ones(4)], TypeError, "element 1 of the batch is a Tensor"),
        ([_A(fill=torch.nan), _A(fill=torch.nan)], None, None),  # NaN fills are one fill
        (
            [
                sparsefill.to_sparse(torch.tensor(3.0), fill_value=3.0),
                sparsefill.to_sparse(torch.tensor(4.0), fill_value=3.0),
            ],
            None,
            None,
        ),  # 0-d: a 1-d batch
        ([sparsefill.zeros(0, 3), sparsefill.zeros(0, 3)], None, None),  # 0-size
    ],
)
def test_collate_refuses_a_batch_of_different_fills_or_shapes(items, err, match):
    if err is None:
        out = collate_sparse(items)
        assert isinstance(out, SparseTensor) and out.shape == (len(items),) + items[0].shape
        torch.testing.assert_close(
            out.to_dense(), torch.stack([a.to_dense() for a in items]), equal_nan=True
        )
        return
    with pytest.raises(err, match=match):
        next(iter(DataLoader(_Bad(items), batch_size=2)))


def test_collate_error_reaches_the_main_process_from_a_worker():
    with pytest.raises(ValueError, match="differs from element 0"):
        next(iter(DataLoader(_Bad([_A(), _A(fill=6.0)]), batch_size=2, num_workers=1)))


def test_collate_jagged_refuses_a_mixed_batch():
    kj = KeyedJaggedBatch.from_lists([{1: [2]}])
    with pytest.raises(TypeError, match="element 1 of the batch is a Tensor"):
        collate([kj, torch.ones(1)])
