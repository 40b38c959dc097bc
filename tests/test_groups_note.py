"""A run whose labels gave no groups (a Keras model with two outputs and no positive=/groups=)
says so wherever groups are listed: ``run.groups`` is ``["all"]``, ``run.groups_note`` and
``info`` give the manifest's reason, and the viewer's sidebar shows it on every page. A run with
groups shows no such note."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import inspector
from inspector.cli import summary
from inspector.testing import make_synthetic_run

ROOT = Path(__file__).resolve().parents[1]
WHY = ("none: the training step's batch's targets are nested (2 outputs): pass positive= or "
       "groups= (a callable on the targets) for groups")


def _run(path: Path, no_groups: bool) -> Path:
    run = Path(make_synthetic_run(path, steps=4, tensors=6, dump_every=None))
    if no_groups:
        name = next(p for p in os.listdir(run) if p.startswith("manifest."))
        m = json.loads((run / name).read_text())
        m["groups"] = {"rule": WHY, "names": [], "codes": []}
        (run / name).write_text(json.dumps(m))
    return run


def test_no_groups_are_listed_and_the_reason_is_given(tmp_path):
    run = inspector.open_run(_run(tmp_path / "none", True))
    assert run.groups == ["all"] and run.groups_note == WHY
    assert any(line.startswith("groups") and WHY in line for line in summary(run).split("\n"))
    plain = inspector.open_run(_run(tmp_path / "with", False))
    assert plain.groups == ["all", "positive", "negative"] and plain.groups_note is None


def test_the_viewer_says_why_there_are_no_groups(tmp_path, monkeypatch):
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest
    root = tmp_path / "runs"
    _run(root / "none", True)
    _run(root / "with", False)
    monkeypatch.setenv("TF_INSPECTOR_RUNS", str(root))
    for name, said in (("none", True), ("with", False)):
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
        at.query_params["run"] = name
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        side = " ".join(c.value.replace("\\", "") for c in at.sidebar.caption)
        assert ("Groups: all only" in side and "positive=" in side) == said, (name, side)
