"""Test tiers: ``make test`` runs the fast tier (``-m "not slow"``), ``make test-all`` every
test; tests/slow.txt lists the slow tier (see tests/tiers.py)."""
import os
import sys
from pathlib import Path

import pytest

# Tests import the packages from the checkout, installed or not.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tiers import BOTH_TFS, check_listed, is_slow, slow_entries  # noqa: E402

SLOW = slow_entries()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: the slow tier (make test-all runs it, make test does not)")
    config.addinivalue_line("markers", "both_tfs: a slow test CI runs under the latest TensorFlow too")
    check_listed(SLOW)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if is_slow(SLOW, item.path.name, item.originalname):
            item.add_marker(pytest.mark.slow)
            if item.path.name in BOTH_TFS:
                item.add_marker(pytest.mark.both_tfs)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With $TF_INSPECTOR_TEST_TIMES set, each test's setup/call/teardown seconds are appended
    there as they finish (tab-separated), to choose the tiers from a run that was cut short."""
    path = os.environ.get("TF_INSPECTOR_TEST_TIMES")
    if path and not os.environ.get("PYTEST_XDIST_WORKER"):   # once, in the controller, under xdist
        with open(path, "a") as f:
            f.write(f"{report.nodeid}\t{report.when}\t{report.duration:.2f}\t{report.outcome}\n")


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The reader's local cache (digests of small parts) in a folder of this test session, not
    the user's ~/.cache; a test that needs its own sets TF_INSPECTOR_CACHE itself."""
    os.environ.setdefault("TF_INSPECTOR_CACHE", str(tmp_path_factory.mktemp("tf-inspector-cache")))
