"""The benchmark machinery runs on a tiny case with a stub timer: nothing is timed in tests."""

import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import cases_convert, cases_elementwise  # noqa: E402,F401  (registers the cases)
from benchmarks import runner  # noqa: E402


def test_machinery_on_a_tiny_case():
    reg = runner.Registry()

    @reg.case("tiny to_dense", sizes={"n=8": 8})
    def tiny(n):
        import sparsefill
        A = sparsefill.to_sparse(torch.arange(n, dtype=torch.float64) % 3, fill_value=0.)
        return [("sparsefill", A.to_dense), ("dense peer", lambda: torch.arange(n, dtype=torch.float64) % 3)]

    res = runner.run_cases(reg.cases, threads=[1], quick=True, timer=runner.stub_timer, raise_errors=True)
    assert len(res) == 1 and "error" not in res[0]
    assert [i["label"] for i in res[0]["impls"]] == ["sparsefill", "dense peer"]
    assert "tiny to_dense" in runner.markdown_table(res)


def test_registered_cases_build_and_agree_with_their_peers():
    """Every registered case, shrunk to a tiny size, builds its inputs and its implementations agree
    (the runner checks the warm-up outputs against each other)."""
    assert runner.REGISTRY.cases, "no benchmark case registered"
    tiny = [dataclasses.replace(c, quick_sizes={k: _shrink(v) for k, v in c.size_items(True)})
            for c in runner.REGISTRY.cases]
    res = runner.run_cases(tiny, threads=[1], quick=True, timer=runner.stub_timer, raise_errors=True)
    assert len(res) == sum(len(list(c.size_items(True))) for c in tiny)


def _shrink(param):
    shape, density = param
    return tuple(min(s, 50) for s in shape), max(density, 0.05)
