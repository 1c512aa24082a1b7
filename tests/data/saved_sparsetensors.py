"""The SparseTensors stored in ``saved_sparsetensors*.pt`` / ``.pkl`` (files written by an earlier release:
they must keep loading, equal to these).  Run ``python tests/data/saved_sparsetensors.py`` to rewrite them
(only when the file format changes on purpose)."""

import pathlib
import pickle

import torch

import sparsefill


def tensors() -> dict:
    """One of each kind a file may hold: COO (coalesced, uncoalesced), CSR (batched too), hybrid, array,
    NaN and indefinite fills, int/bool dtypes, requires_grad, an ``nn.Parameter``."""
    ind = sparsefill.indefinite
    return {
        "coo": sparsefill.sparse_coo_tensor(
            [[0, 1, 2], [3, 0, 1]], [1.0, 2.0, 3.0], (3, 4), fill_value=2.0
        ),
        "coo_uncoalesced": sparsefill.sparse_coo_tensor(
            [[1, 0, 1], [2, 0, 2]], [1.0, 2.0, 3.0], (2, 3)
        ),
        "coo_empty": sparsefill.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.int64), [], (0, 5)),
        "csr": sparsefill.sparse_csr_tensor(
            [0, 1, 1, 3], [2, 0, 3], [1.0, 2.0, 3.0], (3, 4), fill_value=-1.0
        ),
        "csr_batched": sparsefill.sparse_csr_tensor(
            [[0, 1, 2], [0, 2, 2]],
            [[1, 0], [0, 2]],
            [[1.0, 2.0], [3.0, 4.0]],
            (2, 2, 3),
            fill_value=torch.nan,
        ),
        "hybrid_array_fill": sparsefill.sparse_coo_tensor(
            [[0, 2]],
            [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]],
            (4, 3),
            fill_value=torch.tensor([7.0, 8.0, 9.0]),
        ),
        "hybrid_csr_indefinite": sparsefill.sparse_csr_tensor(
            [0, 1, 2], [1, 0], [[1.0, 2.0], [3.0, 4.0]], (2, 2, 2), fill_value=ind
        ),
        "coo_indefinite": sparsefill.sparse_coo_tensor([[0, 3]], [5.0, 6.0], (4,), fill_value=ind),
        "int64": sparsefill.sparse_coo_tensor([[1]], [7], (3,), fill_value=4),
        "bool": sparsefill.sparse_csr_tensor([0, 1, 1], [0], [True], (2, 2), fill_value=False),
        "requires_grad": sparsefill.sparse_coo_tensor(
            [[0, 1]], [1.0, 2.0], (3,), fill_value=0.5, dtype=torch.float64, requires_grad=True
        ),
        "parameter": torch.nn.Parameter(
            sparsefill.sparse_csr_tensor([0, 2], [0, 1], [1.0, 2.0], (1, 3))
        ),
    }


def write(folder: pathlib.Path) -> None:
    ts = tensors()
    torch.save(ts, folder / "saved_sparsetensors.pt")
    torch.save(ts, folder / "saved_sparsetensors_legacy.pt", _use_new_zipfile_serialization=False)
    (folder / "saved_sparsetensors.pkl").write_bytes(pickle.dumps(ts))


if __name__ == "__main__":
    write(pathlib.Path(__file__).parent)
