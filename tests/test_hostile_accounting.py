"""A hostile or odd ``accounting`` section cannot stall or hide a run: its size bounds are
checked on read (the section dropped and named, the run read), lookups are indexed, its
counters range-checked, and a rule without a source is a default one."""
from __future__ import annotations

import json
import time

import pytest

import inspector
from inspector import cli
from inspector.format.accounting import Ledger
from inspector.format.manifest import MAX_RULES
from inspector.testing import make_synthetic_run


def _edit(path, change) -> None:
    manifest = next(path.glob("manifest.*.json"))
    m = json.loads(manifest.read_text())
    change(m["accounting"])
    manifest.write_text(json.dumps(m, separators=(",", ":")))


@pytest.fixture
def run_path(tmp_path):
    return make_synthetic_run(tmp_path / "r", steps=2, tensors=12, dump_every=None, icnn=False)


def test_a_million_rules_are_refused_and_the_run_stays_quick(run_path):
    rule = {"rule": "r", "count": 1, "names": ["conv:0"]}   # ~33 MB in all, under the 64 MiB cap
    _edit(run_path, lambda acc: acc.update(excluded=[rule] * 1_000_000))
    t = time.perf_counter()
    run = inspector.open_run(run_path)
    assert any(f"holds 1,000,000 rules, more than the {MAX_RULES:,}" in p and "left out" in p
               for p in run.problems), run.problems
    run.uncaptured("conv")
    assert time.perf_counter() - t < 30   # 84 s before (the uncaptured search alone)
    assert len(run.stats)


@pytest.mark.parametrize("field, value, message", [
    ("total", -5, "accounting.total must be an integer from 0 to 2**53"),
    ("captured", 10 ** 30, "accounting.captured must be an integer from 0 to 2**53"),
    ("captured", 10 ** 6, "accounting.captured (1,000,000) must not exceed accounting.total"),
    ("excluded", "oops", "accounting.excluded must be a list"),
])
def test_bad_counters_and_types_drop_the_accounting_not_the_run(run_path, field, value, message):
    _edit(run_path, lambda acc: acc.update({field: value}))
    run = inspector.open_run(run_path)
    assert any(message in p for p in run.problems), run.problems
    assert run.accounting().empty and len(run.stats)
    assert "accounting not recorded" in cli.summary(run)


def test_a_rule_without_a_source_is_a_default_one(run_path):
    def strip(acc):
        for r in acc["excluded"]:
            r.pop("source", None)
    _edit(run_path, strip)
    run = inspector.open_run(run_path)
    assert not run.problems
    assert set(run.accounting().query("status == 'excluded'")["source"]) == {"default"}
    assert "nan" not in cli.summary(run)


def _big_ledger(rules: int, names_per_rule: int, skipped: int, ops: int) -> Ledger:
    excluded = [{"rule": f"r{i}", "source": "user", "what": "x", "count": names_per_rule,
                 "op_types": [f"Type{i}"], "patterns": [r"(^|/)gradients(_\d+)?/"],
                 "names": [f"block{i}/conv{j}/w/read:0" for j in range(names_per_rule)]}
                for i in range(rules)]
    acc = {"total": 0, "captured": 0, "aliases": {},
           "skipped": [{"reason": "not fetchable", "count": skipped,
                        "names": [f"loop/body/conv{k}:0" for k in range(skipped)]}],
           "excluded": excluded}
    op_types = {f"net/conv{k}/Conv2D": "Conv2D" for k in range(ops)}
    return Ledger({"tensors": [], "skipped": [], "accounting": acc}, op_types)


def test_lookups_on_a_manifest_at_its_bounds_are_indexed():
    ledger = _big_ledger(rules=MAX_RULES, names_per_rule=200, skipped=200_000, ops=100_000)
    last = f"block{MAX_RULES - 1}/conv199/w/read:0"
    ledger.search("conv")   # the first builds the search index
    t = time.perf_counter()
    for _ in range(20):
        assert ledger.why(last).rule == f"r{MAX_RULES - 1}"
        assert ledger.why("net/conv5/Conv2D:0").status == "not_float"
    per_why = (time.perf_counter() - t) / 40
    t = time.perf_counter()
    found = ledger.search("loop/body/conv1999")
    per_search = time.perf_counter() - t
    expected = {f"loop/body/conv{k}:0" for k in range(200_000) if str(k).startswith("1999")}
    assert {w.name for w in found} == expected and len(expected) == 111
    assert per_why < 0.05 and per_search < 0.05, (per_why, per_search)
