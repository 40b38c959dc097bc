"""A Keras probe's gradients and updates are labelled "probe batch, after the update" wherever
they are shown: the catalog (``captured_on``, filled from the manifest for runs written before
the field), ``python -m inspector info`` and the viewer (every page's sidebar, the Tensor
browser beside a gradient or an update). Runs of the training step itself carry no label."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import inspector
from inspector.format.provenance import PROBE_NOTE, captured_on
from inspector.cli import summary
from inspector.testing import make_synthetic_run

ROOT = Path(__file__).resolve().parents[1]


def _keras_run(path: Path, probe: dict | None, entry_note: bool = False) -> Path:
    """A synthetic run whose manifest is a Keras callback's with ``probe`` (None: DumpHook's);
    ``entry_note``: the catalog entries carry ``captured_on`` themselves (as written now)."""
    run = make_synthetic_run(path, steps=4, tensors=6, dump_every=2)
    name = next(p for p in os.listdir(run) if p.startswith("manifest."))
    m = json.loads((Path(run) / name).read_text())
    if probe is not None:
        m.update(source="keras", probe=probe)
    if entry_note:
        m["tensors"] = [{**t, "captured_on": PROBE_NOTE} for t in m["tensors"]]
    (Path(run) / name).write_text(json.dumps(m))
    return Path(run)


@pytest.mark.parametrize("probe, entry_note, want", [
    ({"source": "probe"}, True, PROBE_NOTE),          # written now: in every catalog entry
    ({"source": "probe"}, False, PROBE_NOTE),         # an older probe run: from its manifest
    ({"samples": 8}, False, PROBE_NOTE),              # a run from before source existed: a probe
    ({"source": "train_batch"}, False, None),         # the training step itself
    (None, False, None),                              # DumpHook
])
def test_the_catalog_and_info_say_where_a_probe_recorded(tmp_path, probe, entry_note, want):
    run = inspector.open_run(_keras_run(tmp_path / "r", probe, entry_note))
    notes = set(run.tensors["captured_on"])
    assert notes == {want}
    assert (f"captured   {PROBE_NOTE}" in summary(run)) == (want is not None)


def test_captured_on_reads_the_manifest():
    assert captured_on({"source": "keras", "probe": {"source": "probe", "fallback": "run_eagerly"}}) == PROBE_NOTE
    assert captured_on({"source": "keras", "probe": {"source": "train_batch"}}) is None
    assert captured_on({"probe": {"source": "probe"}}) is None   # not a Keras manifest


def test_the_viewer_says_it_beside_gradients_and_updates(tmp_path, monkeypatch):
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest
    root = tmp_path / "runs"
    _keras_run(root / "probe", {"source": "probe"}, entry_note=True)
    _keras_run(root / "step", {"source": "train_batch"})
    for name, labelled in (("probe", True), ("step", False)):
        monkeypatch.setenv("TF_INSPECTOR_RUNS", str(root))
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
        at.switch_page("viewer/app_pages/browser.py")
        at.query_params["run"] = name
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        side = " ".join(c.value.replace("\\", "") for c in at.sidebar.caption)
        assert (f"Gradients and updates: {PROBE_NOTE}" in side) == labelled, name
        at.selectbox(key="tb_tensor").select("icnn/pre_mask:0").run()
        at.radio(key="tb_kind").set_value("gradient").run()
        info = " ".join(i.value for i in at.info)
        assert ("Recorded on the probe batch, after the update" in info) == labelled, name
