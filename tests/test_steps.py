"""The one step-range grammar: inspector.format.steps, the reader's parse_steps alias, DumpHook's
schedule (pure Python: no TensorFlow here)."""
from __future__ import annotations

import pytest

from hooks.schedule import Schedule
from inspector.run import parse_steps
from inspector.format.steps import MAX_STEP, parse_step_range


@pytest.mark.parametrize("spec, expected", [
    ("200", (200, 200)), ("100:500", (100, 500)), ("100:", (100, MAX_STEP)), (":500", (0, 500)),
    (" 7 : 8 ", (7, 8)), ("5:5", (5, 5)), ("500-510", (500, 510)),
])
def test_accepted_forms(spec, expected):
    assert parse_step_range(spec) == expected
    assert parse_steps(spec) == expected


@pytest.mark.parametrize("spec", ["", ":", "a", "1:2:3", "-5", "5-", "10:5", "1.5", "-1:3", "1 2",
                                  str(MAX_STEP + 1), "0x10"])
def test_rejected_forms_name_the_spec_and_the_grammar(spec):
    with pytest.raises(ValueError) as e:
        parse_step_range(spec)
    assert repr(spec) in str(e.value) and "A:B" in str(e.value) and ":B" in str(e.value)


def test_parse_steps_none_means_every_step():
    assert parse_steps(None) is None and parse_steps("") is None


def test_schedule_uses_the_same_grammar():
    s = Schedule(0, 0, dump_steps=[3, "10:12", "20:", ":1", (30, 31), range(40, 42), "50-51"])
    assert [t for t in range(60) if s.wants_dump(t)] == [0, 1, 3, 10, 11, 12] + list(range(20, 60))
    assert Schedule(0, 0, dump_steps="7").ranges == [(7, 7)]


@pytest.mark.parametrize("bad", ["10:5", "x", ":", "1:2:3"])
def test_schedule_errors_name_the_entry_and_the_grammar(bad):
    with pytest.raises(ValueError) as e:
        Schedule(0, 0, dump_steps=[bad])
    assert repr(bad) in str(e.value) and "A:B" in str(e.value) and "dump_steps" in str(e.value)
