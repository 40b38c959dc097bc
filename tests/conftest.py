"""Test tiers: ``make test`` runs the fast tier (``-m "not slow"``), ``make test-all`` every
test. The slow tier is listed here, in one place, by file or by test (see tests/tiers.py)."""
import os
import sys
from pathlib import Path

import pytest

# Tests import the packages from the checkout, installed or not.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tiers import SLOW_FILES, SLOW_TESTS, check_listed  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: the slow tier (make test-all runs it, make test does not)")
    check_listed(Path(__file__).parent)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        file = item.path.name
        if file in SLOW_FILES or f"{file}::{item.originalname}" in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With $TF_INSPECTOR_TEST_TIMES set, each test's setup/call/teardown seconds are appended
    there as they finish (tab-separated), to choose the tiers from a run that was cut short."""
    path = os.environ.get("TF_INSPECTOR_TEST_TIMES")
    if path:
        with open(path, "a") as f:
            f.write(f"{report.nodeid}\t{report.when}\t{report.duration:.2f}\t{report.outcome}\n")
