"""Index kernels (sparsefill._kernels.index) against torch's own: unique_inverse == torch.unique(return_inverse=True)."""

import pytest
import torch

from sparsefill._kernels import index as _index


@pytest.mark.parametrize("n", [0, 1, 5, 4095, 4096, 50_000])
def test_unique_inverse_matches_torch_unique(n):
    g = torch.Generator().manual_seed(n)
    runs = [
        torch.randint(0, max(2 * n, 1), (n,), generator=g).unique() for _ in range(2)
    ]  # two sorted runs
    keys = torch.cat(
        runs + [torch.randint(0, max(2 * n, 1), (n // 3,), generator=g)]
    )  # and an unsorted tail
    u, inv = _index.unique_inverse(keys)
    u_ref, inv_ref = torch.unique(keys, return_inverse=True)
    assert torch.equal(u, u_ref) and torch.equal(inv, inv_ref)
