"""One manifest schema (inspector/format/manifest.py): the hook, synthetic runs, a bare
RunWriter and the reader all have the same keys, and the hook's settings the same defaults."""
from __future__ import annotations

import inspect
import json

import pytest

import inspector
from inspector.format import manifest as ms
from inspector.testing import make_synthetic_run
from inspector.writer import RunWriter

#: Keys of a finished session that did not fail.
ALL_KEYS = {*ms.WRITER_KEYS, *ms.CALLER_DEFAULTS}
#: Keys only synthetic runs add (their seed and sync token).
SYNTHETIC_EXTRAS = {"synthetic_seed", "synthetic_sync"}


def _manifest(run_dir) -> dict:
    (path,) = run_dir.glob("manifest.*.json")
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def hook_manifest(tmp_path_factory) -> dict:
    """The manifest DumpHook writes with its default settings, on a small CNN."""
    tf = pytest.importorskip("tensorflow")
    from hooks import DumpHook
    from tfmodels import build_cnn
    run_dir = tmp_path_factory.mktemp("hook") / "run"
    with tf.Graph().as_default():
        m = build_cnn()
        with tf.compat.v1.train.MonitoredSession(hooks=[DumpHook(run_dir, labels=m.y)]) as sess:
            sess.run(m.train_op, m.feed(1))
    return _manifest(run_dir)


def test_synthetic_and_hook_manifests_have_one_key_set(hook_manifest, tmp_path):
    synthetic = _manifest(make_synthetic_run(tmp_path / "syn", steps=3, tensors=6, dump_every=2))
    # one training run at the default schedule samples no step, and the session says so
    assert set(hook_manifest) == ALL_KEYS | {ms.RECORDED_NOTHING_KEY}
    assert "none was a statistics or dump step" in hook_manifest[ms.RECORDED_NOTHING_KEY]
    assert set(synthetic) - SYNTHETIC_EXTRAS == ALL_KEYS
    assert list(hook_manifest["config"]) == list(synthetic["config"]) == list(ms.CONFIG_DEFAULTS)


def test_config_defaults_are_the_hooks_defaults(hook_manifest):
    """A hook built with no settings records CONFIG_DEFAULTS (native_stats: whether a C++
    compiler built the kernels here), and DumpHook's signature has the same defaults."""
    from hooks import DumpHook, native
    config = dict(hook_manifest["config"])
    assert config.pop("native_stats") == (native.library() is not None)
    assert config == {k: v for k, v in ms.CONFIG_DEFAULTS.items() if k != "native_stats"}
    params = inspect.signature(DumpHook).parameters
    as_json = {"dump_steps": list, "dtypes": lambda ds: [getattr(d, "name", d) for d in ds]}
    shared = [k for k in ms.CONFIG_DEFAULTS if k in params and k not in ("mode", "native_stats")]
    assert len(shared) >= 15
    for key in shared:
        default = params[key].default
        assert as_json.get(key, lambda v: v)(default) == ms.CONFIG_DEFAULTS[key], key


def test_hook_config_refuses_another_key_set():
    assert ms.hook_config(**ms.CONFIG_DEFAULTS) == ms.CONFIG_DEFAULTS
    settings = {**ms.CONFIG_DEFAULTS, "new_setting": 1}
    del settings["fsync"]
    with pytest.raises(ValueError, match=r"missing \['fsync'\], unknown \['new_setting'\]"):
        ms.hook_config(**settings)


def test_a_bare_writer_writes_every_key_and_keeps_its_own(tmp_path):
    RunWriter(tmp_path / "r", manifest={"loss": "l:0"}).close()
    m = _manifest(tmp_path / "r")
    assert set(m) == ALL_KEYS and m["loss"] == "l:0" and m["tensors"] == [] and m["config"] == {}
    with pytest.raises(ValueError, match=r"\['session', 'worker'\] are the writer's own"):
        RunWriter(tmp_path / "r2", manifest={"worker": "x", "session": 5})


def test_the_reader_fills_caller_defaults_for_an_older_manifest(tmp_path):
    make_synthetic_run(tmp_path / "r", steps=3, tensors=6, dump_every=2)
    (path,) = (tmp_path / "r").glob("manifest.*.json")
    m = json.loads(path.read_text())
    for key in ("config", "skipped", "first_nonfinite", "tensorflow_version", "is_chief"):
        del m[key]
    path.write_text(json.dumps(m))
    run = inspector.open_run(tmp_path / "r")
    assert {k: run.manifest[k] for k in ("config", "skipped", "first_nonfinite", "tensorflow_version", "is_chief")} \
        == {"config": {}, "skipped": [], "first_nonfinite": None, "tensorflow_version": None, "is_chief": False}
    assert run.config == {} and len(run.tensors) == len(m["tensors"]) > 0


def test_manifest_json_is_what_json_reads_back_one_key_and_one_tensor_a_line(tmp_path):
    """storage.atomic.json_bytes (json's C encoder per line; indent= is its slow Python one) writes
    what json.dumps would mean, keys turned into strings as json does, NaN refused."""
    from inspector.storage.atomic import json_bytes
    manifest = {"model": "m", 7: "seven", True: 1, "config": {"every": 20, "include": None},
                "tensors": [{"name": "a:0", "shape": [2, 3]}, {"name": "b:0", "shape": None}], "skipped": []}
    data = json_bytes(manifest)
    assert json.loads(data) == json.loads(json.dumps(manifest))
    lines = data.decode().splitlines()
    assert lines[0] == "{" and lines[-1] == "}" and '"7": "seven",' in lines
    assert sum('"name":' in line for line in lines) == 2                 # one catalog entry a line
    with pytest.raises(ValueError, match="not JSON compliant"):
        json_bytes({"mean": float("nan")})
    with pytest.raises(TypeError, match="keys must be"):
        json_bytes({(1, 2): "x"})
    w = RunWriter(tmp_path / "r", manifest={"model": "m", 7: "x"})     # a caller's odd key: still a run
    w.close()
    assert inspector.open_run(tmp_path / "r").manifest["7"] == "x"


def test_histogram_sample_is_recorded_and_older_runs_read_as_65536(hook_manifest):
    """The histogram subsample size is the session's own: recorded in its config (16,384 now),
    and a config without it (written before) means the 65,536 it was written with."""
    from inspector.format import layout as fmt
    assert fmt.histogram_sample(hook_manifest["config"]) == fmt.HIST_MAX_ELEMENTS == 1 << 14
    assert fmt.histogram_sample({k: v for k, v in hook_manifest["config"].items() if k != "histogram_sample"}) == 65536
    # the numpy reference takes the session's size: an older run's histogram is reproduced
    import numpy as np
    x = np.arange(8 * 8000, dtype=np.float32).reshape(8, 8000)   # 64,000 elements: between the sizes
    assert fmt.hist_sample(x, 8).size < fmt.hist_sample(x, 8, 65536).size == x.size
