"""The suite tests one copy of sparsefill, the one ``import sparsefill`` finds; under ``.ci/run``
(``SPARSEFILL_TEST_WHEEL=1``) that copy is the installed wheel, never the source tree.

The tests and the doctests (``--pyargs sparsefill`` in pyproject.toml) both import it, so a
configuration that put ``src/`` back on ``sys.path`` under a wheel install fails here.
"""

import importlib.metadata
import json
import os
import sys
from pathlib import Path

import pytest

import sparsefill

ROOT = Path(__file__).resolve().parents[1]
WHEEL = os.environ.get("SPARSEFILL_TEST_WHEEL") == "1"
PKG = Path(sparsefill.__file__).resolve().parent


def test_one_copy_of_sparsefill_is_imported():
    """Every loaded ``sparsefill.*`` module (tests' imports and the doctests' alike) comes from ``PKG``."""
    strays = {
        name: m.__file__
        for name, m in list(sys.modules.items())
        if (name == "sparsefill" or name.startswith("sparsefill."))
        and getattr(m, "__file__", None)
        and PKG not in Path(m.__file__).resolve().parents
    }
    assert not strays, f"sparsefill is {PKG}, but these modules come from elsewhere: {strays}"
    assert "sparsefill._tensor" in sys.modules


@pytest.mark.skipif(
    not WHEEL,
    reason="checks the wheel install of .ci/run (SPARSEFILL_TEST_WHEEL=1); "
    "this run is on another install",
)
def test_the_installed_wheel_is_under_test():
    assert ROOT / "src" not in PKG.parents, (
        f"SPARSEFILL_TEST_WHEEL=1 but sparsefill imports from {PKG}"
    )
    dist = importlib.metadata.distribution("sparsefill")
    assert (
        not json.loads(dist.read_text("direct_url.json") or "{}")
        .get("dir_info", {})
        .get("editable")
    ), "sparsefill is installed editable"
    assert Path(dist.locate_file("sparsefill/__init__.py")).resolve() == PKG / "__init__.py"
    files = {str(f) for f in dist.files if str(f).startswith("sparsefill/")}
    shipped = {Path(f).name for f in files if f.startswith("sparsefill/benchmarks/")}
    assert {
        "__init__.py",
        "runner.py",
        "measure.py",
        "plots.py",
        "report.py",
        "cases_convert.py",
        "cases_sweep.py",
    } <= shipped
    assert "sparsefill/py.typed" in files, "the PEP 561 marker is not in the wheel"
    assert not [f for f in files if f.endswith((".png", ".md"))], (
        "documentation shipped as package data"
    )
