"""The tour (``python -m sparsefill``): every worked example agrees with its dense computation."""

import functools
import subprocess
import sys

import pytest

from sparsefill import tour


@functools.cache
def _records():
    return {r["title"]: r for r in tour.run(verbose=False)}


@pytest.mark.parametrize("title", [t for t, _, _ in tour.EXAMPLES])
def test_example_matches_dense(title):
    rec = _records()[title]
    assert rec["ok"], rec.get("error")


def test_main_module_runs():
    proc = subprocess.run(
        [sys.executable, "-m", "sparsefill"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(tour.EXAMPLES)}/{len(tour.EXAMPLES)} examples agree" in proc.stdout
