"""``info`` on a run with many problems of one kind prints a count and the first few, and says
how to list them all (``--all-problems``)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from inspector.cli import PROBLEMS_SHOWN, problem_lines
from inspector.format import dump_name
from inspector.testing import make_synthetic_run

ROOT = Path(__file__).resolve().parents[1]


def _info(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "inspector", "info", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_repeated_problems_are_counted_and_the_first_few_shown(tmp_path):
    path = make_synthetic_run(tmp_path / "r", steps=2, tensors=6, dump_every=None, icnn=False)
    for k in range(40):
        (path / dump_name("chief", 1, 1000 + k)).write_bytes(b"not a dump at all")
    out = _info(str(path))
    lines = [line for line in out.stdout.splitlines() if line.startswith("problem")]
    assert out.returncode == 1
    damaged = [line for line in lines if "dump" in line and "more like" not in line]
    assert len(damaged) == PROBLEMS_SHOWN, lines
    assert any("... and 35 more like" in line and "--all-problems" in line for line in lines), lines
    every = _info(str(path), "--all-problems")
    assert sum(line.startswith("problem") for line in every.stdout.splitlines()) >= 40
    assert "more like" not in every.stdout


def test_problems_of_different_kinds_are_each_shown():
    lines = problem_lines([*(f"stats/p{i}.parquet: damaged" for i in range(3)),
                           "the graph is missing", "manifest.chief.s0002.json: damaged"])
    # one kind's lines together, kinds in the order they first appear; none summarized
    assert lines == ["stats/p0.parquet: damaged", "stats/p1.parquet: damaged",
                     "stats/p2.parquet: damaged", "manifest.chief.s0002.json: damaged",
                     "the graph is missing"]
