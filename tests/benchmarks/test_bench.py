"""The benchmark machinery on tiny cases with a stub timer: nothing is timed in tests.

Covers: the runner's records and table, skipped peers, failing cases, the time budget, memory
accounting, results.json's schema, the plots (matplotlib's Agg canvas), the command line
(``python -m sparsefill bench`` from any directory: the cases ship with the package), and every
case of every ``sparsefill/benchmarks/cases_*.py`` module, built at its tiny size with its
implementations checked against each other.  Runs on whichever install ``import sparsefill`` finds
(editable or wheel): nothing here reads the source tree.
"""

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import sparsefill
from sparsefill.benchmarks import measure, runner

IMPORT_ERRORS = runner.discover()


def _tiny_registry():
    reg = runner.Registry()

    @reg.case(
        "tiny to_dense",
        sizes={"n=8": 8, "n=16": 16, "n=32": 32},
        sweep="density (%)",
        bytes=lambda n: 4 * n,
        check=lambda n, out: torch.testing.assert_close(out["sparsefill"], out["dense peer"]),
    )
    def tiny(n):
        x = torch.arange(n, dtype=torch.float64) % 3
        A = sparsefill.to_sparse(x, fill_value=0.0)
        return [
            ("sparsefill", A.to_dense),
            ("dense peer", x.clone),
            runner.skipped("missing peer", "not installed (pip install nothing)"),
        ]

    @reg.case("tiny fails", sizes={"one": 1})
    def fails(n):
        return [("sparsefill", lambda: 1 / 0), ("peer", lambda: 0)]

    @reg.case(
        "tiny disagrees",
        sizes={"one": 1},
        check=lambda n, out: torch.testing.assert_close(out["sparsefill"], out["peer"]),
    )
    def disagrees(n):
        return runner.Bench(
            [("sparsefill", lambda: torch.zeros(2)), ("peer", lambda: torch.ones(2))], bytes=8
        )

    @reg.case("tiny single", sizes={"one": 1})
    def single(n):
        return [("sparsefill", lambda: torch.zeros(2)), ("peer", lambda: torch.zeros(2))]

    return reg


def _run(reg, **kw):
    return runner.run_cases(reg.cases, threads=[1], quick=True, timer=runner.stub_timer, **kw)


def test_machinery_on_tiny_cases():
    res = _run(_tiny_registry(), copy_bw={1: 4e9})
    ok = [r for r in res if r["case"] == "tiny to_dense"]
    assert [r["size"] for r in ok] == ["n=8", "n=16", "n=32"] and [r["x"] for r in ok] == [
        8.0,
        16.0,
        32.0,
    ]
    r = ok[0]
    assert [i["label"] for i in r["impls"]] == ["sparsefill", "dense peer", "missing peer"]
    subj, peer, missing = r["impls"]
    assert missing == {"label": "missing peer", "skipped": "not installed (pip install nothing)"}
    assert r["rounds"] == runner.QUICK.rounds and len(subj["rounds_s"]) == runner.QUICK.rounds
    assert subj["median_s"] == 1e-3 and r["ratios"] == [{"peer": "dense peer", "ratio": 1.0}]
    assert subj["gbps"] == pytest.approx(32 / 1e-3 / 1e9) and subj["pct_copy"] == pytest.approx(
        100 * 32e3 / 4e9
    )
    assert subj["result_bytes"] == 64 and peer["result_bytes"] == 64  # 8 float64
    assert subj["peak_torch_bytes"] >= 64 and subj["peak_bytes"] >= subj["peak_torch_bytes"]
    # a case that raises and one whose implementations disagree become error rows, the run goes on
    errors = {r["case"]: r["error"] for r in res if "error" in r}
    assert set(errors) == {"tiny fails", "tiny disagrees"}
    assert (
        "ZeroDivisionError" in errors["tiny fails"] and "AssertionError" in errors["tiny disagrees"]
    )
    table = runner.markdown_table(res)
    assert (
        "| tiny to_dense | n=8 | 1 | 1 ms ±0% | `dense peer` | 1 ms ±0% | 1.00 | 0 ns | 3.2e-05 (0%) |"
        in table
    )
    assert "`missing peer` | skipped: not installed (pip install nothing)" in table
    assert "| tiny fails | one | 1 | **error** | ZeroDivisionError: division by zero |" in table
    with pytest.raises(ZeroDivisionError):
        _run(_tiny_registry(), raise_errors=True)


def test_time_budget_skips_rows(monkeypatch):
    reg = _tiny_registry()
    kw = dict(threads=[1, 2], quick=True, timer=runner.stub_timer, memory=False)
    res = runner.run_cases(reg.cases, budget_s=0.0, **kw)  # spent before it starts: nothing runs
    assert len(res) == 2 * 6 and all(r["skipped"] == "time budget of 0 s spent" for r in res)
    clock = iter(range(0, 10**6, 10))  # a fake clock: +10 s per reading
    monkeypatch.setattr(
        runner, "time", type("T", (), {"monotonic": staticmethod(lambda: next(clock))})
    )
    res = runner.run_cases(reg.cases[:1], budget_s=25.0, **kw)  # one case: a share of 15 s
    ran = ["skipped" not in r for r in res]
    assert len(res) == 6 and ran[0] and not ran[-1] and ran == sorted(ran, reverse=True)
    assert res[0]["rounds"] == 1  # its warm-up took 10 s: 2 rounds would overrun the share
    assert all(r["skipped"].startswith("time budget (15.0 s") for r in res if "skipped" in r)
    assert "skipped: time budget" in runner.markdown_table(res)


def test_result_bytes_and_memory():
    A = sparsefill.sparse_coo_tensor([[1, 4]], [1.0, 2.0], (6,), fill_value=5.0)
    assert measure.result_bytes(A) == 2 * 8 + 2 * 4 + 4  # indices, values, fill
    x = torch.zeros(10)
    assert measure.result_bytes((x, x[2:], [x])) == 40  # one storage counted once
    t = torch.zeros(3, 4).to_sparse_csr()
    assert measure.result_bytes(t) == 4 * 8 + 0 + 0
    assert measure.result_bytes(np.zeros(5)) == 40
    m = measure.measure_memory(lambda: torch.ones(1000) + 1)  # two float32 temporaries of 4 kB
    assert m["result_bytes"] == 4000 and 8000 <= m["peak_torch_bytes"] < 8100
    m = measure.measure_memory(lambda: np.ones(100_000))  # numpy: through tracemalloc
    assert (
        m["peak_torch_bytes"] == 0
        and m["peak_python_bytes"] >= 800_000
        and m["peak_bytes"] >= 800_000
    )


def test_main_writes_json_markdown_and_plots(tmp_path, capsys):
    """results.json's schema, results.md, and (matplotlib installed) the PNG plots."""
    reg = _tiny_registry()
    rc = runner.main(
        ["--dry-run", "--out", str(tmp_path), "--no-progress", "--threads", "1,2"], cases=reg.cases
    )
    assert rc == 1  # the two failing tiny cases
    out = capsys.readouterr().out
    assert out.startswith("<!-- dry run") and "| tiny to_dense | n=32 | 2 |" in out
    report = json.loads((tmp_path / "results.json").read_text())
    assert {
        "started",
        "quick",
        "dry_run",
        "command",
        "threads",
        "settings",
        "environment",
        "copy_bandwidth",
        "results",
        "plots",
        "total_s",
    } <= set(report)
    assert report["dry_run"] is True and report["threads"] == [1, 2]
    assert set(report["copy_bandwidth"]) == {"1", "2"}
    assert {"torch", "python", "git_commit", "peers"} <= set(report["environment"])
    for r in report["results"]:
        assert {"case", "size", "threads"} <= set(r) and len(
            {"impls", "error", "skipped"} & set(r)
        ) == 1
        for i in r.get("impls", []):
            assert "skipped" in i or {
                "label",
                "median_s",
                "rounds_s",
                "spread",
                "gbps",
                "pct_copy",
                "result_bytes",
                "peak_bytes",
                "peak_torch_bytes",
                "peak_python_bytes",
            } <= set(i)
    md = (tmp_path / "results.md").read_text()
    assert "Copy bandwidth" in md and "## Errors" in md
    assert (
        "| tiny to_dense | n=8 | 2 | 1 ms | dense peer 1 ms (1.00) · missing peer: skipped | 3.2e-05"
        in md
    )
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert report["plots"] == [] and "no plots" in report["plots_note"] and "no plots" in md
        pytest.skip(
            "matplotlib not installed: the plots are not written (pip install -e '.[bench]'); JSON checked"
        )
    assert sorted(report["plots"]) == ["crossover.png", "summary.png", "tiny_to_dense.png"]
    for name in report["plots"]:
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert "![summary.png](summary.png)" in md


def test_plots_need_two_x_values(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib not installed (pip install '.[bench]')")
    from sparsefill.benchmarks import plots

    reg = _tiny_registry()
    reg.cases = reg.cases[:1]
    res = _run(reg, memory=False)
    assert plots.sweep_plot("tiny", res[:1], str(tmp_path / "one.png")) is False
    assert not (tmp_path / "one.png").exists()
    assert plots.sweep_plot("tiny", res, str(tmp_path / "all.png")) is True


def test_case_modules_import():
    assert not IMPORT_ERRORS, "\n".join(f"{m}:\n{tb}" for m, tb in IMPORT_ERRORS.items())
    names = {c.module for c in runner.REGISTRY.cases}
    assert {
        "sparsefill.benchmarks.cases_convert",
        "sparsefill.benchmarks.cases_overhead",
        "sparsefill.benchmarks.cases_sweep",
    } <= names


@pytest.mark.parametrize("case", runner.REGISTRY.cases, ids=lambda c: c.name)
def test_registered_case_builds_and_agrees_with_its_peers(case):
    """Every case of every sparsefill/benchmarks/cases_*.py, at its tiny size, builds its inputs, and its
    implementations agree (the runner checks the warm-up outputs against each other)."""
    tiny = dataclasses.replace(case, quick_sizes=dict(case.tiny_items()))
    res = runner.run_cases(
        [tiny], threads=[1], quick=True, timer=runner.stub_timer, raise_errors=True, memory=False
    )
    assert len(res) == len(tiny.quick_sizes) and all("impls" in r for r in res)


def test_cli_bench_list_and_dry_run(tmp_path):
    """Two processes in a directory outside the checkout: ``python -m sparsefill bench --list --quick``
    and ``--dry-run --tiny`` on one case (the cases come with the package, editable or wheel)."""
    p = subprocess.run(
        [sys.executable, "-m", "sparsefill", "bench", "--list", "--quick"],
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert (
        "overhead: torch.exp(A), 30% specified, fill 5: 10; 100; 1k; 10k; 100k  (plot against elements (numel of A))"
        in p.stdout
        and "to_sparse coo fill=0: 1-D 1M, 1%; 2-D 4000x4000, 0.1%" in p.stdout
    )
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "sparsefill",
            "bench",
            "--dry-run",
            "--tiny",
            "--filter",
            "overhead: A + B",
            "--out",
            "out",
            "--no-plots",
        ],
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert "| overhead: A + B, 10 elements, different patterns | 10 | 1 |" in p.stdout
    report = json.loads((tmp_path / "out" / "results.json").read_text())
    assert report["dry_run"] is True and report["command"].startswith(
        "python -m sparsefill bench --dry-run"
    )


def test_cli_errors(capsys):
    with pytest.raises(SystemExit) as e:
        runner.main(["--threads", "0"])
    assert (
        e.value.code == 2 and "--threads must be positive ints, got '0'" in capsys.readouterr().err
    )
    assert runner.main(["--filter", "no such case"]) == 2
    assert "no benchmark case matches --filter 'no such case'" in capsys.readouterr().err


def test_bench_main_in_process(capsys):
    from sparsefill import bench

    assert bench.main(["--list", "--filter", "overhead: A + B"]) == 0
    assert capsys.readouterr().out == "overhead: A + B, 10 elements, different patterns: 10\n"


def test_import_sparsefill_does_not_import_the_benchmarks():
    """``import sparsefill`` (a fresh process) loads neither ``sparsefill.bench`` nor ``sparsefill.benchmarks``."""
    code = (
        "import sys, sparsefill; print(sorted(m for m in sys.modules "
        "if m == 'sparsefill.bench' or m.startswith('sparsefill.benchmarks')))"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


def test_git_state(tmp_path):
    """The commit is recorded only when the package is a tracked folder of a checkout (editable install),
    not for a wheel installed into a venv that sits inside one."""

    def git(*args):
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    assert runner.git_state(str(tmp_path)) == {"git_commit": None}  # not a repository
    git("init", "-q")
    (tmp_path / ".gitignore").write_text(".venv/\n")
    (tmp_path / "__init__.py").write_text("")
    git("add", ".")
    git("commit", "-q", "-m", "x")
    assert runner.git_state(str(tmp_path)) == {
        "git_commit": git("rev-parse", "HEAD"),
        "src_dirty": False,
    }
    (tmp_path / "__init__.py").write_text("x = 1\n")
    assert runner.git_state(str(tmp_path))["src_dirty"] is True
    wheel = tmp_path / ".venv" / "sparsefill"  # ignored: an installed copy
    wheel.mkdir(parents=True)
    (wheel / "__init__.py").write_text("")
    assert runner.git_state(str(wheel)) == {"git_commit": None}
