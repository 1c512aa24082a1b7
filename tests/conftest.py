"""Shared test set-up: the OpInfo report at the end of the run, and running under pytest-xdist.

Under xdist (``python -m pytest -n 2``) each worker runs whole test files (the OpInfo sweeps' reports
are module-level counts, complete only on the worker that ran the module), with one torch thread (two
workers on two cores: a second intra-op thread would only contend), and sends the lines of its
end-of-run reports to the controller, which prints them.
"""

import collections
import importlib.util
import os
import pathlib
import sys

import pytest

# this process is an xdist worker (the controller and a plain run have no such variable)
WORKER = os.environ.get("PYTEST_XDIST_WORKER")


def _register_property_profiles():
    """tests/property's hypothesis profiles ("ci", "long"), registered before hypothesis's plugin reads
    ``--hypothesis-profile`` (in its pytest_configure): pytest loads tests/property/conftest.py only later when
    it starts from tests/ or the root."""
    path = pathlib.Path(__file__).parent / "property" / "conftest.py"
    spec = importlib.util.spec_from_file_location("sparsefill_property_profiles", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# (the controller of an xdist run adds its workers' example counts to this copy's)
_PROPERTY = _register_property_profiles()
_SUMMARY_LINES: list = []  # lines for the end of the run (the `summary_line` fixture)
_WORKER_LINES: list = []  # controller: (kind, text) of the workers' reports
_WORKER_KEY = "sparsefill_summary"


def pytest_configure(config):
    if WORKER:
        import torch

        torch.set_num_threads(1)


def pytest_collection_finish(session):
    """Two costs of PyTorch's test helpers that check nothing here, dropped once the tests are
    collected (most of the CPU time of an OpInfo sample, measured: see the functions below)."""
    if "torch.testing._internal.common_utils" in sys.modules:
        _no_test_fn_lookup()
    if "torch" in sys.modules:
        _no_queued_accelerator_seeds()


def _no_test_fn_lookup():
    """Every ``op.sample_inputs(...)`` looks for the unittest ``TestCase`` method that runs it by
    ``inspect.stack()`` (source lines of every frame of pytest's deep stack: ~20 ms a call), to seed
    the samples by its name and note the failing sample on it.  These tests are plain functions: the
    lookup always finds none (and the samples get torch's fixed SEED), so it returns none at once."""
    from torch.testing._internal import common_utils
    from torch.testing._internal.opinfo import core

    def extract_test_fn():
        return None

    common_utils.extract_test_fn = core.extract_test_fn = extract_test_fn


def _no_queued_accelerator_seeds():
    """``torch.manual_seed`` (run before every OpInfo sample) also queues the seed for each
    accelerator backend that has not started, with a formatted traceback of the call (~2 ms on
    pytest's stacks); where the backend is not available it can never start, nor run the queue."""
    import torch

    for name in ("cuda", "xpu", "mtia"):
        backend = getattr(torch, name, None)
        if backend is not None and not backend.is_available():
            backend.manual_seed_all = _no_seed


def _no_seed(seed):
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Whole test files to each worker (the default ``--dist load`` would split a sweep's module, and
    with it the counts of its report); an explicit other ``--dist`` is kept."""
    if config.getoption("dist") == "load":
        from xdist.scheduler import LoadFileScheduling

        return LoadFileScheduling(config, log)
    return None


@pytest.fixture(scope="session")
def summary_line():
    """``summary_line(text)``: print ``text`` at the end of the run (under xdist too, where a test's
    own output is not shown)."""
    return _SUMMARY_LINES.append


class _Recorder:
    """Stands in for the terminal reporter on an xdist worker: keeps the lines for the controller."""

    def __init__(self):
        self.lines = []

    def section(self, title, sep="=", **kw):
        self.lines.append(("section", title))

    def write_line(self, line, **kw):
        self.lines.append(("line", str(line)))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    """On an xdist worker: this run's reports (this file's and those of the plugins that test modules
    register as ``sparsefill-*``), recorded for the controller."""
    out = getattr(session.config, "workeroutput", None)
    if out is None:
        return
    rec = _Recorder()
    _local_summaries(rec)
    for name, plugin in session.config.pluginmanager.list_name_plugin():
        if str(name).startswith("sparsefill-") and hasattr(plugin, "pytest_terminal_summary"):
            plugin.pytest_terminal_summary(terminalreporter=rec)
    out[_WORKER_KEY] = rec.lines
    out[_WORKER_KEY + "_property"] = dict(_property_examples(session.config))


def _property_examples(config):
    """tests/property's example counts of this process (its conftest, once pytest loaded it)."""
    for plugin in config.pluginmanager.get_plugins():
        path = str(getattr(plugin, "__file__", "")).replace("\\", "/")
        if path.endswith("tests/property/conftest.py") and plugin is not _PROPERTY:
            return plugin._EXAMPLES
    return {}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """On the controller: a worker's recorded report lines and example counts."""
    out = getattr(node, "workeroutput", {})
    _WORKER_LINES.extend(tuple(x) for x in out.get(_WORKER_KEY, ()))
    for k, n in out.get(_WORKER_KEY + "_property", {}).items():
        _PROPERTY._EXAMPLES[k] += n


def pytest_terminal_summary(terminalreporter):
    _local_summaries(terminalreporter)
    sections = collections.defaultdict(list)  # (a section that two workers wrote is printed once)
    title = None
    for kind, text in _WORKER_LINES:
        if kind == "section":
            title = text
            sections[title]
        else:
            sections[title].append(text)
    for title, lines in sections.items():
        if title is not None:
            terminalreporter.section(title)
        for line in lines:
            terminalreporter.write_line(line)
    _PROPERTY.pytest_terminal_summary(terminalreporter)


def _local_summaries(terminalreporter):
    """The reports of the tests that ran in this process."""
    if _SUMMARY_LINES:
        terminalreporter.section("sparsefill declared exceptions")
        for line in _SUMMARY_LINES:
            terminalreporter.write_line(line)
    _backward_summary(terminalreporter)
    _policy_sweep_summary(terminalreporter)
    # not imported when the module did not run (importing op_db: 13 s)
    mod = sys.modules.get("tests.opinfo.test_opinfo")
    if mod is None or not mod.REPORT:
        return
    DECLARED, NO_FLOAT64, REPORT = mod.DECLARED, mod.NO_FLOAT64, mod.REPORT
    tr = terminalreporter
    tr.section("sparsefill OpInfo layout invariance")
    by_outcome, how = _classify(REPORT, ("FAIL", "densify", "native", "declared"))
    per_op = collections.Counter(how.values())
    tr.write_line(
        f"ops: {len(REPORT)} run ({dict(per_op)}); ops without float64 support: {len(NO_FLOAT64)}"
    )
    tr.write_line(f"(op, variant, sample) outcomes: {dict(by_outcome)}")
    tr.write_line("native: " + ", ".join(sorted(k for k, v in how.items() if v == "native")))
    tr.write_line(
        "densify (partly or wholly computed by the dense fallback): "
        + ", ".join(sorted(k for k, v in how.items() if v == "densify"))
    )
    for name, (reason, _) in sorted(DECLARED.items()):
        tr.write_line(f"declared {name}: {reason}")
    _unexercised_and_failing(tr, how)


def _policy_sweep_summary(tr):
    """The densify policy sweep (tests/opinfo/test_policy_sweep.py): ops per outcome under a tight byte
    limit."""
    mod = sys.modules.get("tests.opinfo.test_policy_sweep")
    if mod is None or not mod.OUTCOMES:
        return
    tr.section(
        "sparsefill densify policy sweep (forward and backward under a byte limit below the dense form)"
    )
    tr.write_line(f"ops: {len(mod.OUTCOMES)} ({dict(mod.COUNTS)})")
    for name, why in sorted(mod.DECLARED.items()):
        tr.write_line(f"declared {name}: {why}")


def _backward_summary(tr):
    """The OpInfo backward conformance (tests/opinfo/test_opinfo_backward.py): per op, how its backward
    ran."""
    mod = sys.modules.get("tests.opinfo.test_opinfo_backward")  # None: the module did not run
    if mod is None or not mod.REPORT:
        return
    DECLARED_BACKWARD, REPORT = mod.DECLARED_BACKWARD, mod.REPORT
    tr.section("sparsefill OpInfo backward conformance (gradients of values and fill)")
    by_outcome, how = _classify(
        REPORT, ("FAIL", "declared", "densify-backward", "densify", "native")
    )
    tr.write_line(f"ops: {len(REPORT)} run ({dict(collections.Counter(how.values()))})")
    tr.write_line(f"(op, variant, sample) outcomes: {dict(by_outcome)}")
    per_variant = collections.defaultdict(collections.Counter)
    for counts in REPORT.values():
        for (variant, outcome), n in counts.items():
            per_variant[variant][outcome] += n
    for variant, c in sorted(per_variant.items()):
        tr.write_line(f"  {variant}: {dict(c)}")
    tr.write_line(
        "native backward: " + ", ".join(sorted(k for k, v in how.items() if v == "native"))
    )
    undeclared = [
        f"{k} [{' '.join(sorted(vs))}]"
        for k in sorted(REPORT)
        if (vs := {var for (var, o) in REPORT[k] if o == "densify-backward"})
    ]
    tr.write_line(
        f"forward native, backward densifies, undeclared (each fails its test): {len(undeclared)}"
        + (": " + ", ".join(undeclared) if undeclared else "")
    )
    tr.write_line(
        "densify (the forward densified): "
        + ", ".join(sorted(k for k, v in how.items() if v == "densify"))
    )
    for name, (reason, variants) in sorted(DECLARED_BACKWARD.items()):
        tr.write_line(f"declared {name} [{' '.join(variants)}]: {reason}")
    _unexercised_and_failing(tr, how)


def _classify(report, order):
    """``(outcome counts over every (op, variant, sample), op -> its first outcome in ``order``)``."""
    by_outcome, how = collections.Counter(), {}
    for key, counts in report.items():
        for (_, outcome), n in counts.items():
            by_outcome[outcome] += n
        outcomes = {o for (_, o) in counts}
        how[key] = next((o for o in order if o in outcomes), "not exercised")
    return by_outcome, how


def _unexercised_and_failing(tr, how):
    ne = sorted(k for k, v in how.items() if v == "not exercised")
    if ne:
        tr.write_line(
            "not exercised (no applicable sample or the dense op rejects all): " + ", ".join(ne)
        )
    fails = sorted(k for k, v in how.items() if v == "FAIL")
    if fails:
        tr.write_line("FAILING: " + ", ".join(fails))
