"""Small models trained against the same model on dense tensors; the helpers their modules share."""

import warnings

import pytest
import torch

import sparsefill

_LAYOUTS = pytest.mark.parametrize(
    "layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"]
)


def _no_densify():
    """Inside ``warnings.catch_warnings()``: a DensifyWarning is an error."""
    warnings.simplefilter("error", sparsefill.DensifyWarning)
