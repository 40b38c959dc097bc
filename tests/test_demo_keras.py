"""A very short run of the Keras demo: both runs readable, the ICNN roles in the catalog."""
from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")

import inspector  # noqa: E402
from inspector.format import ICNN_ROLES  # noqa: E402

from examples import train_keras  # noqa: E402


def test_keras_demo_writes_both_runs(tmp_path):
    results = train_keras.main(["--runs", str(tmp_path), "--epochs", "1", "--train-size", "64", "--test-size",
                                "32", "--batch", "16", "--stats-every", "2", "--dump-every", "4", "--top-k", "8"])
    assert set(results) == {"icnn", "plain"}
    icnn, plain = inspector.open_run(tmp_path / "icnn"), inspector.open_run(tmp_path / "plain")
    assert icnn.status == plain.status == "finished"
    assert icnn.dump_steps() == plain.dump_steps() == [4]
    roles = icnn.tensors[icnn.tensors["icnn_role"].notna()]
    assert sorted(roles["icnn_role"]) == sorted(ICNN_ROLES)
    assert plain.tensors["icnn_role"].isna().all()
    assert not icnn.tensors["name"].str.contains("/monitor/").any()
    # The mask layer's internals are left out (train_keras.ICNN_INTERNALS); its roles stay.
    inner = icnn.tensors[icnn.tensors["name"].str.contains("icnn_mask")]
    assert inner["icnn_role"].notna().all() and len(inner) == len(ICNN_ROLES)
