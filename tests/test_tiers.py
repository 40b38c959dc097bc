"""The slow-tier list (tests/tiers.py): made from measured times, checked against the files."""
from __future__ import annotations

import pytest

import tiers


def test_the_list_holds_each_function_one_of_whose_cases_is_slow(tmp_path, monkeypatch):
    times = tmp_path / "times.tsv"
    times.write_text("tests/test_a.py::test_x[1]\tsetup\t4.0\tpassed\n"
                     "tests/test_a.py::test_x[1]\tcall\t3.0\tpassed\n"      # 7 s with its setup
                     "tests/test_a.py::test_x[2]\tcall\t1.0\tpassed\n"
                     "tests/test_b.py::test_y\tcall\t5.0\tpassed\n")
    monkeypatch.setattr(tiers, "LIST", tmp_path / "slow.txt")
    assert tiers.write_list(times, 6) == ["test_a.py::test_x"]
    entries = tiers.slow_entries()
    assert entries == {"test_a.py::test_x"}
    assert tiers.is_slow(entries, "test_a.py", "test_x") and not tiers.is_slow(entries, "test_b.py", "test_y")


def test_a_listed_test_that_does_not_exist_stops_the_run(tmp_path):
    (tmp_path / "test_a.py").write_text("def test_x():\n    pass\n")
    tiers.check_listed({"test_a.py::test_x", "test_a.py"}, tmp_path)
    with pytest.raises(pytest.UsageError, match="test_a.py::test_gone"):
        tiers.check_listed({"test_a.py::test_gone"}, tmp_path)
    with pytest.raises(pytest.UsageError, match="test_missing.py"):
        tiers.check_listed({"test_missing.py"}, tmp_path)
