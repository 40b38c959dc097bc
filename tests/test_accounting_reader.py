"""The accounting's reader side without TensorFlow (inspector/format/accounting.py): old runs, hostile
manifests, synthetic runs, and the one table of default rules in FORMAT.md."""
from __future__ import annotations

import json
import re
from pathlib import Path


import inspector
from inspector import cli
from inspector.format.accounting import DEFAULT_RULES, Ledger
from inspector.testing import make_synthetic_run

ROOT = Path(__file__).resolve().parents[1]
OLD_RUN = ROOT / "tests" / "data" / "old_run" / "icnn"


def test_a_run_before_the_accounting_still_answers_what_it_can():
    """tests/data/old_run/icnn has no accounting: a captured or skipped name still answers
    (skipped without its reason), others say the run predates it; info says so; the
    accounting table is empty."""
    run = inspector.open_run(OLD_RUN)
    assert "accounting" not in json.loads(next(OLD_RUN.glob("manifest.*.json")).read_text())
    assert run.why(run.tensors.index[0]).status == "captured"
    why = run.why("gradients/whatever:0")
    assert why.status == "unknown" and "predates" in why.reason
    assert run.accounting().empty
    skipped = run.uncaptured("conv")
    assert set(skipped["status"]) == {"skipped"} and skipped["reason"].str.contains("predates").all()
    assert set(skipped["name"]) == {n.rpartition(":")[0] for n in run.manifest["skipped"] if "conv" in n}
    assert "accounting not recorded" in cli.summary(run)


def _manifest(rule: dict) -> dict:
    return {"tensors": [], "skipped": [], "accounting": {"total": 0, "captured": 0, "aliases": {}, "skipped": [],
                                                         "excluded": [rule]}}


def test_a_manifest_pattern_is_never_run():
    """A hostile manifest's rule with a catastrophic regex (on a long name of a's and a "!", it
    backtracks for hours): the reader runs only the default patterns it ships, so the rule's
    patterns say nothing, not even the harmless one that would match."""
    rule = {"rule": "exclude", "source": "user", "what": "x", "patterns": ["^(a+)+$", "a"], "op_types": [],
            "negate": False, "count": 0, "names": [], "examples": []}
    why = Ledger(_manifest(rule), {"aaaa!": "Relu"}).why("aaaa!")
    assert why.status == "not_float", why


def test_a_damaged_accounting_is_left_out_naming_the_field(tmp_path):
    """The accounting is auxiliary: a wrongly typed field of it is dropped and named in
    run.problems; the session's statistics and dumps stay readable."""
    path = make_synthetic_run(tmp_path / "r", steps=2, tensors=6, dump_every=1)
    manifest = next(path.glob("manifest.*.json"))
    m = json.loads(manifest.read_text())
    m["accounting"]["excluded"][0]["names"] = [3]
    manifest.write_text(json.dumps(m))
    run = inspector.open_run(path)
    assert any(re.search(r"accounting\.excluded\[0\]\.names\[0\] must be a string.*left out", p)
               for p in run.problems), run.problems
    assert len(run.stats) and len(run.dump_steps()) == 2
    assert run.accounting().empty and run.why("conv1/w/read").status == "unknown"


def test_a_synthetic_run_accounts_for_its_graph(tmp_path):
    run = inspector.open_run(make_synthetic_run(tmp_path / "r", steps=2, tensors=20, dump_every=None))
    table = run.accounting().set_index("rule", drop=False)
    assert table.loc["synthetic", "count"] > 0 and table.loc["backward", "count"] > 0
    assert run.why("conv1/w/read").rule == "synthetic" and run.why("conv1/Relu:0").status == "captured"
    relu_grad = run.uncaptured("ReluGrad")
    assert len(relu_grad) and set(relu_grad["rule"]) == {"backward"}


def test_format_md_lists_the_default_rules_as_the_code_has_them():
    """One table of default exclusions (FORMAT.md, "Accounting"): its rules, patterns and op
    types are DEFAULT_RULES', in order."""
    text = (ROOT / "FORMAT.md").read_text()
    table = text[text.index("| rule | what it leaves out |"):]
    rows = [line for line in table.split("\n\n")[0].splitlines()[2:]]
    assert len(rows) == len(DEFAULT_RULES)
    for line, rule in zip(rows, DEFAULT_RULES):
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        code = lambda cell: [c.replace("\\|", "|") for c in re.findall(r"`([^`]+)`", cell)]  # noqa: E731
        assert code(cells[0]) == [rule.rule]
        assert code(cells[2]) == list(rule.patterns), rule.rule
        assert sorted(code(cells[3])) == sorted(rule.op_types), rule.rule
