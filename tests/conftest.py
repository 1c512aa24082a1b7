"""Shared test set-up: the OpInfo report at the end of the run."""

import collections
import importlib.util
import pathlib
import sys


def _register_property_profiles():
    """tests/property's hypothesis profiles ("ci", "long"), registered before hypothesis's plugin reads
    ``--hypothesis-profile`` (in its pytest_configure): pytest loads tests/property/conftest.py only later when
    it starts from tests/ or the root."""
    path = pathlib.Path(__file__).parent / "property" / "conftest.py"
    spec = importlib.util.spec_from_file_location("sparsefill_property_profiles", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


_register_property_profiles()


def pytest_terminal_summary(terminalreporter):
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
