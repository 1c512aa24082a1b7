"""The torch internals that ``sparsefill._torch_compat`` patches exist in the installed torch, the
installed torch is the one the tests cover, and once ``torch._dynamo`` loads each patch is in place."""

import pathlib
import re
import subprocess
import sys

import torch

import sparsefill
from sparsefill import _torch_compat


def test_the_installed_torch_is_in_the_declared_range():
    """The torch under test is the one the patches were checked on, and the project declares no
    wider range (``pyproject.toml`` of this checkout)."""
    assert torch.__version__.startswith(_torch_compat.TESTED_TORCH + ".")
    pyproject = (pathlib.Path(__file__).parents[1] / "pyproject.toml").read_text()
    torch_req = re.search(r'"torch([^"]*)"', pyproject).group(1)
    major, minor = map(int, _torch_compat.TESTED_TORCH.split("."))
    assert torch_req == f">={major}.{minor},<{major}.{minor + 1}", torch_req


def test_every_patched_target_exists():
    import torch._dynamo.output_graph
    import torch._dynamo.trace_rules as rules

    assert callable(torch._utils._validate_loaded_sparse_tensors)
    assert hasattr(torch.serialization, "_legacy_load")
    assert callable(getattr(torch._dynamo.output_graph.SubgraphTracer, "lookup_unbound_symbols"))
    assert isinstance(rules.BUILTIN_INLINE_WHEN_CALLED, set) and callable(rules.add)


def test_patches_are_in_place_once_dynamo_loads():
    """In a fresh process: ``import sparsefill`` imports no dynamo; importing it applies each patch."""
    code = (
        "import sys, sparsefill\n"
        "assert 'torch._dynamo' not in sys.modules\n"
        "import torch, torch._dynamo, torch._dynamo.output_graph as og, os\n"
        "from sparsefill._compile import dynamo\n"
        "assert hasattr(torch.Tensor, '__coerce_same_metadata_as_tangent__')\n"
        "assert og.SubgraphTracer.lookup_unbound_symbols._sparsefill\n"
        "rules = torch._dynamo.trace_rules.BUILTIN_INLINE_WHEN_CALLED\n"
        "assert any(p.rstrip(os.sep).endswith('sparsefill') for p in rules), rules\n"
        "assert dynamo._REGISTERED\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_legacy_validation_checks_first_and_is_installed_once():
    calls = []
    installed = torch._utils._validate_loaded_sparse_tensors  # (an earlier legacy load's, maybe)
    original = getattr(installed, "_sparsefill_original", installed)
    torch._utils._validate_loaded_sparse_tensors = original
    try:
        first = _torch_compat.check_before_legacy_validation(lambda: calls.append("check"))
        again = _torch_compat.check_before_legacy_validation(lambda: calls.append("other"))
        assert first is again
        torch._utils._validate_loaded_sparse_tensors()
        assert calls == ["check"]
    finally:
        torch._utils._validate_loaded_sparse_tensors = installed
    assert sparsefill.SparseTensor  # (the package stays importable)
