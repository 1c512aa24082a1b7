"""The tour (``python -m sparsefill``): every worked example agrees with its dense computation."""

import subprocess
import sys

import pytest

from sparsefill import tour


@pytest.mark.parametrize("title", [t for t, _, _ in tour.EXAMPLES])
def test_example_matches_dense(title):
    rec = next(r for r in tour.run(verbose=False) if r["title"] == title)
    assert rec["ok"], rec.get("error")


def test_main_module_runs():
    proc = subprocess.run([sys.executable, "-m", "sparsefill"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(tour.EXAMPLES)}/{len(tour.EXAMPLES)} examples agree" in proc.stdout
