"""The slow tier: tests ``make test`` skips and ``make test-all`` (and CI) runs.

A test is slow here when it trains a model or drives a browser for a minute or more and another
fast test already covers the same feature, so the fast tier keeps one representative test per
feature and runs within minutes (timed in docs/contributing.md). Names are checked against the
files at start, so a renamed test cannot leave this list silently.
"""
from __future__ import annotations

from pathlib import Path

import pytest

#: whole files in the slow tier: file name -> why
SLOW_FILES: dict[str, str] = {
}

#: single tests in the slow tier: "file::test function" -> why
SLOW_TESTS: dict[str, str] = {
}


def check_listed(folder: Path) -> None:
    """Every listed file exists and every listed test is defined in its file."""
    missing = [f for f in SLOW_FILES if not (folder / f).is_file()]
    for key in SLOW_TESTS:
        file, test = key.split("::")
        path = folder / file
        if not path.is_file() or f"def {test}(" not in path.read_text():
            missing.append(key)
    if missing:
        raise pytest.UsageError(f"tests/tiers.py lists tests that do not exist: {', '.join(missing)}")
