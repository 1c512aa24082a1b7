"""The property suite's hypothesis profiles and its example count.

Profiles (``pytest tests/property --hypothesis-profile=NAME``; hypothesis's pytest plugin reads the option):

* ``ci`` (the default of this folder): derandomized (the same examples every run: CI is reproducible), no
  deadline (the first call of an op compiles or imports), 200 examples a test: about 4200 over the suite in
  35 s of one CPU (90 s wall on 2 loaded cores);
* ``long``: random examples, ten times as many per test (a search, not a CI job).

The profiles hold for the tests of this folder only (they pass ``sparse_strategies.SETTINGS``, read at
import), so the rest of the test suite keeps its own settings.  The count of examples run is printed at the
end of the run.
"""

from __future__ import annotations

import re
import warnings

import pytest
from hypothesis import HealthCheck, settings

_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile(
    "ci",
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=_QUIET,
    print_blob=True,
)
settings.register_profile(
    "long", max_examples=2000, deadline=None, suppress_health_check=_QUIET, print_blob=True
)

_EXAMPLES = {"tests": 0, "examples": 0}


@pytest.fixture(autouse=True)
def _quiet():
    """Densify and torch's own warnings (a variance's degrees of freedom) are not what these tests check."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def pytest_runtest_teardown(item):
    """Count the examples of each test from hypothesis's statistics (its plugin notes them on the item)."""
    stats = getattr(item, "hypothesis_statistics", None)
    if stats and "tests/property/" in item.nodeid.replace("\\", "/"):
        _EXAMPLES["tests"] += 1
        _EXAMPLES["examples"] += sum(int(n) for n in re.findall(r"(\d+) passing", stats))


def pytest_terminal_summary(terminalreporter):
    if _EXAMPLES["tests"]:
        terminalreporter.write_line(
            f"property suite: {_EXAMPLES['examples']} passing examples in "
            f"{_EXAMPLES['tests']} tests (hypothesis profile "
            f"{settings.get_current_profile_name()!r}; this folder runs 'ci' unless "
            f"'long' is chosen)"
        )
