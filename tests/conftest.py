"""Shared test set-up: the OpInfo report at the end of the run."""

import collections


def pytest_terminal_summary(terminalreporter):
    try:
        from test_opinfo import DECLARED, NO_FLOAT64, REPORT
    except ImportError:
        return
    if not REPORT:
        return
    tr = terminalreporter
    tr.section("sparsefill OpInfo layout invariance")
    by_outcome = collections.Counter()
    how = {}
    for key, counts in REPORT.items():
        for (_, outcome), n in counts.items():
            by_outcome[outcome] += n
        outcomes = {o for (_, o) in counts}
        how[key] = ("FAIL" if "FAIL" in outcomes else "densify" if "densify" in outcomes
                    else "native" if "native" in outcomes else "declared" if "declared" in outcomes
                    else "not exercised")
    per_op = collections.Counter(how.values())
    tr.write_line(f"ops: {len(REPORT)} run ({dict(per_op)}); ops without float64 support: {len(NO_FLOAT64)}")
    tr.write_line(f"(op, variant, sample) outcomes: {dict(by_outcome)}")
    tr.write_line("native: " + ", ".join(sorted(k for k, v in how.items() if v == "native")))
    tr.write_line("densify (partly or wholly computed by the dense fallback): "
                  + ", ".join(sorted(k for k, v in how.items() if v == "densify")))
    for name, (reason, _) in sorted(DECLARED.items()):
        tr.write_line(f"declared {name}: {reason}")
    ne = sorted(k for k, v in how.items() if v == "not exercised")
    if ne:
        tr.write_line("not exercised (no applicable sample or the dense op rejects all): " + ", ".join(ne))
    fails = sorted(k for k, v in how.items() if v == "FAIL")
    if fails:
        tr.write_line("FAILING: " + ", ".join(fails))
