"""``export --tensorboard`` (inspector.export.tensorboard, inspector.export.tfevents, inspector.export.crc32c): what
TensorBoard's own reader (its data provider, as ``tensorboard --load_fast=false`` serves it)
reads back equals the reader's statistics (scalars as float32, TensorBoard's scalar type) and
stored histogram buckets; evaluations become ``validation`` runs; ``--follow`` exports a live
run's new steps at its next poll, on local disk and S3, and stops when the run ends."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import inspector
from inspector.export import tensorboard as tb_export
from inspector.analysis.compare import update_ratios
from inspector.export.crc32c import Slots, crc32c, crc32c_rows, masked
from inspector.format.loghist import LogHistogram, bucket_edges
from inspector.testing import SyntheticRun, make_synthetic_run, sparse_rows
from inspector.writer import RunWriter, StatsLayout

from s3server import s3_fixture  # noqa: F401  (the fixture ``s3``)

pytest.importorskip("tensorboard", reason="the tensorboard extra: pip install 'tf-inspector[tensorboard]'")

ROOT = Path(__file__).resolve().parents[1]
OLD = ROOT / "tests" / "data" / "old_run" / "icnn"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def read_back(logdir: Path) -> tuple[dict, dict]:
    """({run: {tag: {step: value}}} of the scalars, {run: {tag: {step: [k, 3] buckets}}} of the
    histograms) as TensorBoard's data provider serves them, nothing downsampled."""
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    mux = plugin_event_multiplexer.EventMultiplexer(size_guidance={"tensors": 0, "scalars": 0})
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    dp = data_provider.MultiplexerDataProvider(mux, str(logdir))
    ctx = context.RequestContext()
    scalars = dp.read_scalars(ctx, experiment_id="", plugin_name="scalars", downsample=10 ** 9)
    hists = dp.read_tensors(ctx, experiment_id="", plugin_name="histograms", downsample=10 ** 9)
    return ({run: {tag: {d.step: d.value for d in data} for tag, data in tags.items()} for run, tags in scalars.items()},
            {run: {tag: {d.step: d.numpy for d in data} for tag, data in tags.items()} for run, tags in hists.items()})


def export(run_path, logdir: Path, **kw) -> tb_export.Exporter:
    ex = tb_export.Exporter(lambda: inspector.open_run(run_path), logdir, **kw)
    ex.poll()
    ex.close()
    return ex


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A synthetic run (groups all/positive/negative; NaN/Inf from step 20) exported per tensor."""
    tmp = tmp_path_factory.mktemp("tb")
    path = make_synthetic_run(tmp / "runs" / "exp", steps=24, tensors=20, dump_every=None, nonfinite_at=20)
    export(path, tmp / "logs", histogram_every=5)
    return inspector.open_run(path), read_back(tmp / "logs")


# ---- checksums and records ---------------------------------------------------------------
def test_crc32c_equals_tensorboards_own():
    """The vectorised CRC-32C against TensorBoard's pure-Python one, over lengths around the
    64/256-byte chunk edges; Slots (a template with variable bytes) against both."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c as slow, masked_crc32c
    rng = np.random.default_rng(0)
    records = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (0, 1, 3, 4, 63, 255, 256, 257, 1000, 4099)]
    assert crc32c(records).tolist() == [slow(r) for r in records]
    assert masked(crc32c(records)).tolist() == [masked_crc32c(r) for r in records]
    rows = rng.integers(0, 256, (5, 300), dtype=np.uint8)
    assert crc32c_rows(rows).tolist() == [slow(r.tobytes()) for r in rows]
    template = rng.integers(0, 256, 700, dtype=np.uint8)
    positions = np.sort(rng.choice(700, 40, replace=False))
    values = rng.integers(0, 256, (6, 40), dtype=np.uint8)
    filled = np.tile(template, (6, 1))
    filled[:, positions] = values
    assert Slots(template.tobytes(), positions).crc(values).tolist() == [slow(r.tobytes()) for r in filled]


def test_event_file_reads_back_with_tensorboards_accumulator(tmp_path):
    """Scalars whose tags come and go between steps (several layouts in one batch), a second
    batch, and histograms; read back by TensorBoard's EventAccumulator, which checks every CRC."""
    from tensorboard.backend.event_processing import event_accumulator
    from inspector.export.tfevents import EventFile
    f = EventFile(tmp_path / "run")
    steps = np.arange(0, 300, 3)
    values = np.random.default_rng(1).normal(size=(len(steps), 3))
    present = np.ones(values.shape, bool)
    present[::7, 1] = False                       # tag b missing every 7th step
    present[50:, 2] = False                       # tag c stops
    f.scalars(["a", "b", "c"], steps, values, present)
    f.scalars(["a"], np.array([400, 100_000]), np.array([[1.5], [2.5]]), np.ones((2, 1), bool))
    f.histograms([(3, [("h", np.array([[0.0, 0.0, 2.0], [1.0, 2.0, 3.0]]))]), (9, [("h", np.array([[-1.0, 1.0, 1.0]]))])])
    f.close()
    acc = event_accumulator.EventAccumulator(str(tmp_path / "run"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    a = acc.Scalars("a")
    assert [e.step for e in a] == [*steps, 400, 100_000]
    assert [e.value for e in a] == [*np.float32(values[:, 0]).tolist(), 1.5, 2.5]
    assert [e.step for e in acc.Scalars("b")] == steps[present[:, 1]].tolist()
    assert [e.value for e in acc.Scalars("c")] == np.float32(values[:50, 2]).tolist()
    from tensorboard.util import tensor_util
    h = acc.Tensors("h")
    assert [e.step for e in h] == [3, 9]
    assert tensor_util.make_ndarray(h[0].tensor_proto).tolist() == [[0.0, 0.0, 2.0], [1.0, 2.0, 3.0]]
    assert acc.SummaryMetadata("h").plugin_data.plugin_name == "histograms"


# ---- the export, read back ----------------------------------------------------------------
def test_scalars_equal_the_readers_in_one_run_per_group(exported):
    run, (scalars, _) = exported
    assert set(scalars) == {"exp/all/train", "exp/positive/train", "exp/negative/train"}
    df = run.query_stats()
    rows = 0
    for r in df[df["tensor"].isin(["conv1/Relu:0", "dense/MatMul:0", "conv2/BiasAdd:0"])].itertuples():
        tags = scalars[f"exp/{r.group}/train"]
        prefix = f"{r.kind}/{r.tensor}"
        expect = {"rms": r.l2 / np.sqrt(r.count), "mean": r.mean, "std": r.std, "zero_fraction": r.zero_fraction}
        for stat, value in expect.items():
            got = tags[f"{prefix}/{stat}"][r.step]
            assert got == np.float32(value) or (np.isnan(got) and np.isnan(value)), (prefix, stat, r.step)
        rows += 1
    assert rows == 24 * 3 * 2 * 3   # steps x tensors x kinds x groups: every row was exported
    # the regex TensorBoard users type finds a layer's tensors
    assert {t for t in scalars["exp/all/train"] if t.startswith("gradient/conv1/")} >= {
        "gradient/conv1/Relu:0/rms", "gradient/conv1/Conv2D:0/std"}


def test_nan_and_inf_counts_start_at_the_first_non_finite_step(exported):
    """NaN/Inf counts are written from a tensor's first non-finite step on (forward: the ReLU
    that overflows at step 20 and the tensors after it; the ones before it never)."""
    run, (scalars, _) = exported
    df = run.query_stats(groups=["all"], kinds=["forward"])
    tags = scalars["exp/all/train"]
    for stat in ("nan", "inf"):
        wide = df.pivot_table(index="step", columns="tensor", values=stat, observed=True)
        hit = [t for t in wide.columns if wide[t].max() > 0]
        assert hit and {t for t in wide.columns if f"forward/{t}/{stat}" in tags} == set(hit), stat
        for t in hit:
            first = int(wide.index[wide[t] > 0][0])
            assert tags[f"forward/{t}/{stat}"] == {s: float(v) for s, v in wide[t].items() if s >= first}
    assert "forward/conv1/Conv2D:0/nan" not in tags and "forward/conv1/Conv2D:0/mean" in tags


def test_histograms_are_the_stored_buckets(exported):
    """Each non-empty stored bucket is one TensorBoard bucket with its exact edges and count;
    the others are zero-count gaps between neighbours; bucket 0 is [0, 0]."""
    run, (_, hists) = exported
    tags = hists["exp/negative/train"]
    assert sorted(tags["forward/conv1/Conv2D:0"]) == [0, 5, 10, 15, 20]     # histogram_every=5
    checked = 0
    for tensor, kind in (("icnn/post_mask:0", "forward"), ("dense/MatMul:0", "gradient")):
        for step in (0, 15):
            got = tags[f"{kind}/{tensor}"][step]
            h = run.log_histogram(tensor, step, kind, "negative")
            lo, hi = bucket_edges(h.index)
            stored = got[got[:, 2] > 0]
            np.testing.assert_array_equal(stored, np.stack([lo, hi, h.count], 1))
            gaps = got[got[:, 2] == 0]
            assert len(got) == len(stored) + len(gaps) and np.all(got[1:, 0] == got[:-1, 1])   # contiguous
            checked += 1
            if 0 in h.index.tolist():
                assert [0.0, 0.0, float(h.count[h.index == 0][0])] in got.tolist()
    assert checked == 4


def test_per_layer_tags_are_the_layers_output_tensor(tmp_path):
    path = make_synthetic_run(tmp_path / "runs" / "exp", steps=6, tensors=20, dump_every=None)
    export(path, tmp_path / "logs", per_layer=True)
    scalars, hists = read_back(tmp_path / "logs")
    tags = scalars["exp/positive/train"]
    run = inspector.open_run(path)
    assert tb_export.layer_labels(run.tensors, list(run.tensors.index))["conv1/Relu:0"] == "conv1"
    row = run.query_stats(["conv1/Relu:0"], kinds=["gradient"], groups=["positive"])
    assert tags["gradient/conv1/rms"] == dict(zip(row["step"], np.float32(row["l2"] / np.sqrt(row["count"])).tolist()))
    assert "gradient/icnn/rms" in tags and "forward/icnn" in hists["exp/positive/train"]   # ICNN: its post_mask
    assert not [t for t in tags if ":0" in t]


def test_loss_update_ratios_and_equal_width_histograms_of_an_old_run(tmp_path):
    """A DumpHook run of format 2 (tests/data/old_run): ``loss`` is the loss tensor's mean,
    ``update_ratio/<variable>`` the reader's update ratio, histograms the linspace bins."""
    export(OLD, tmp_path)
    scalars, hists = read_back(tmp_path)
    run = inspector.open_run(OLD)
    tags = scalars["icnn/all/train"]
    loss = run.query_stats([run.manifest["loss"]], kinds=["forward"], groups=["all"])
    assert tags["loss"] == dict(zip(loss["step"], np.float32(loss["mean"]).tolist()))
    ratios = update_ratios(run.query_stats(columns=["l2"]), run.tensors)
    assert len(ratios.columns) == 11
    for v in ratios.columns:
        assert tags[f"update_ratio/{v}"] == dict(zip(ratios.index, np.float32(ratios[v]).tolist()))
    assert not [t for t in scalars["icnn/positive/train"] if t.startswith(("loss", "update_ratio"))]
    edges, counts = run.histogram("conv3/Relu:0", 4, "gradient", "positive")
    got = hists["icnn/positive/train"]["gradient/conv3/Relu:0"][4]
    np.testing.assert_array_equal(got, np.stack([edges[:-1], edges[1:], counts], 1))


LAYOUT = StatsLayout(("x:0",), ("forward",), ("all",))
CATALOG = [{"name": "x:0", "op": "x", "op_type": "Relu", "dtype": "float32", "shape": [None, 2], "scope": "",
            "has_gradient": False, "batched": True, "icnn_layer": None, "icnn_role": None}]


def _session(path: Path, mode: str, rows: list[tuple[int, int, float, float]], close: bool = True) -> RunWriter:
    """A session of one tensor whose every value in (step, batch) is ``value`` (count 4)."""
    w = RunWriter(path, manifest={"tensors": CATALOG, "is_chief": True}, stats_layout=LAYOUT, mode=mode,
                  stats_flush_secs=0)
    for step, batch, value, zero in rows:
        vals = np.array([[4, value, 0.0, value, value, 2 * abs(value), zero, 0, 0]], np.float64)
        h = LogHistogram.of(np.full(4, value))
        w.add_stats(step, vals, sparse_rows(h.index[None], h.count[None].astype(np.int32)), batch=batch)
    if close:
        w.close()
    return w


def test_an_evaluation_is_a_validation_run_its_batches_merged(tmp_path):
    """Two eval batches of values 1 and 3: the validation point is their union's statistics
    (mean 2, std 1, rms sqrt(5)) and histogram (4 + 4 values); an evaluation still running
    waits for its end (more batches may come)."""
    run_dir, logdir = tmp_path / "exp", tmp_path / "logs"
    _session(run_dir, "train", [(s, 0, float(s), 0.0) for s in range(1, 11)])
    ev = _session(run_dir, "eval", [(10, 0, 1.0, 0.0), (10, 1, 3.0, 0.5)], close=False)
    ex = tb_export.Exporter(lambda: inspector.open_run(run_dir), logdir)
    assert ex.poll() == 10
    assert "exp/all/validation" not in read_back(logdir)[0]
    ev.close()
    assert ex.poll() == 1
    ex.close()
    scalars, hists = read_back(logdir)
    val = scalars["exp/all/validation"]
    assert val["forward/x:0/mean"] == {10: 2.0} and val["forward/x:0/std"] == {10: 1.0}
    assert val["forward/x:0/rms"] == {10: np.float32(np.sqrt(5.0))} and val["forward/x:0/zero_fraction"] == {10: 0.25}
    assert scalars["exp/all/train"]["forward/x:0/mean"] == {s: float(s) for s in range(1, 11)}
    h = hists["exp/all/validation"]["forward/x:0"][10]
    assert h[h[:, 2] > 0].tolist() == [[1.0, 1.125, 4.0], [3.0, 3.25, 4.0]]


# ---- --follow ---------------------------------------------------------------------------
def _steps(logdir: Path, run: str, tag: str = "gradient/dense/MatMul:0/rms") -> list[int]:
    return sorted(read_back(logdir)[0].get(run, {}).get(tag, {}))


def test_follow_exports_new_steps_at_the_next_poll_and_stops_at_the_end(tmp_path):
    b = SyntheticRun(tmp_path / "live", tensors=8, steps_hint=40, dump_every=None, stats_flush_secs=0)
    b.write_steps(0, 10)
    b.sync()
    ex = tb_export.Exporter(lambda: inspector.open_run(tmp_path / "live"), tmp_path / "logs")
    assert ex.poll() == 10 and _steps(tmp_path / "logs", "live/all/train") == list(range(10))
    assert ex.poll() == 0
    b.write_steps(10, 25)
    b.sync()
    assert ex.poll() == 15 and _steps(tmp_path / "logs", "live/positive/train") == list(range(25))
    b.write_steps(25, 30)
    b.close()
    lines: list[str] = []
    tb_export.follow(ex, interval=3600, log=lines.append)     # the run ended: one last poll, no wait
    ex.close()
    assert _steps(tmp_path / "logs", "live/negative/train") == list(range(30))
    assert lines[-1] == "the run is finished: done" and "exported 5 new step(s)" in lines[0]


def test_follow_reads_a_run_in_s3(s3, tmp_path):
    url = s3.url("live")
    b = SyntheticRun(url, tensors=8, steps_hint=20, dump_every=None, stats_flush_secs=0, storage_options=s3.options)
    b.write_steps(0, 5)
    b.sync()
    ex = tb_export.Exporter(lambda: inspector.open_run(url, storage_options=s3.options), tmp_path)
    assert ex.poll() == 5
    b.write_steps(5, 12)
    b.sync()
    assert ex.poll() == 7
    b.close()
    ex.close()
    name = url.rsplit("/", 1)[-1]
    assert _steps(tmp_path, f"{name}/all/train") == list(range(12))


def test_the_cli_follows_a_run_being_written(tmp_path):
    """``export --tensorboard --follow`` in its own process: steps written while it runs reach
    the logdir, and it exits by itself when the run is closed."""
    b = SyntheticRun(tmp_path / "live", tensors=8, steps_hint=40, dump_every=None, stats_flush_secs=0)
    b.write_steps(0, 5)
    b.sync()
    proc = subprocess.Popen([sys.executable, "-m", "inspector", "export", "--tensorboard", str(tmp_path / "live"),
                             "--logdir", str(tmp_path / "logs"), "--follow", "--interval", "0.2"],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for written in (5, 15):
            if written > 5:
                b.write_steps(5, written)
                b.sync()
            deadline = time.monotonic() + 120     # a bound for a loaded machine, not the interval
            while _steps(tmp_path / "logs", "live/all/train") != list(range(written)):
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
                time.sleep(0.2)
        b.close()
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "the run is finished: done" in out and "wrote 15 steps (15 with histograms)" in out


def test_workers_without_a_chief_are_exported_one_at_a_time(tmp_path):
    for worker in ("worker-0", "worker-1"):
        b = SyntheticRun(tmp_path / "exp", tensors=8, dump_every=None, worker=worker)
        b.write_steps(0, 3)
        b.close()
    with pytest.raises(inspector.InspectorError, match="workers worker-0, worker-1 and no chief: pass --worker"):
        export(tmp_path / "exp", tmp_path / "logs")
    export(tmp_path / "exp", tmp_path / "logs", worker="worker-1", force=True)
    assert _steps(tmp_path / "logs", "exp/all/train") == [0, 1, 2]


# ---- the command line -------------------------------------------------------------------
def _cli(*args: str, code: str = "") -> subprocess.CompletedProcess:
    script = f"import sys\n{code}\nfrom inspector.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", script, *args], env=ENV, capture_output=True, text=True, timeout=300)


def test_the_cli_exports_without_tensorflow_and_refuses_to_overwrite(tmp_path):
    path = make_synthetic_run(tmp_path / "exp", steps=4, tensors=8, dump_every=None)
    no_tf = "sys.modules['tensorflow'] = None\nimport atexit\natexit.register(lambda: print('tf', 'tensorflow' in " \
            "[m.split('.')[0] for m in sys.modules if sys.modules[m] is not None]))"
    out = _cli("export", "--tensorboard", str(path), "--logdir", str(tmp_path / "logs"), "--per-layer", code=no_tf)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("wrote 4 steps (4 with histograms)") and "runs all/train, negative/train, positive/train" in out.stdout
    assert out.stdout.strip().endswith("tf False")
    files = sorted((tmp_path / "logs" / "exp").rglob("events.out.tfevents.*"))
    assert len(files) == 3
    again = _cli("export", "--tensorboard", str(path), "--logdir", str(tmp_path / "logs"))
    assert again.returncode == 2 and "holds an export already (3 event files); pass --force" in again.stderr
    forced = _cli("export", "--tensorboard", str(path), "--logdir", str(tmp_path / "logs"), "--force")
    assert forced.returncode == 0 and not any(f.exists() for f in files)
    assert len(list((tmp_path / "logs" / "exp").rglob("events.out.tfevents.*"))) == 3


@pytest.mark.parametrize("args, message", [
    (["--tensorboard"], "--tensorboard needs --logdir DIR"),
    (["--tensorboard", "--logdir", "{logs}", "--format", "csv"], "--format: not with --tensorboard"),
    (["--tensorboard", "--logdir", "{logs}", "--interval", "2"], "--interval only applies with --follow"),
    (["--logdir", "{logs}", "--follow"], "--logdir, --follow: only with --tensorboard"),
    (["--tensorboard", "--logdir", "{logs}", "--histogram-every", "-1"], "--histogram-every -1 must be >= 0"),
    (["--tensorboard", "--logdir", "{logs}", "--tensors", "nomatch"], "--tensors 'nomatch' matches none"),
    (["--tensorboard", "--logdir", "{logs}", "--follow", "--interval", "0"], "--interval 0 must be a number"),
    (["--tensorboard", "--logdir", "{logs}", "--worker", "all"], "--worker all: a TensorBoard run holds one value"),
    (["--tensorboard", "--logdir", "{logs}", "--worker", "w9"], "worker 'w9' wrote nothing in"),
])
def test_the_cli_names_what_is_wrong(tmp_path, args, message):
    path = make_synthetic_run(tmp_path / "exp", steps=2, tensors=6, dump_every=None)
    out = _cli("export", str(path), *[a.format(logs=tmp_path / "logs") for a in args])
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert not list(tmp_path.glob("logs/**/events.out.tfevents.*"))


def test_without_the_tensorboard_package_the_cli_says_what_to_install(tmp_path):
    path = make_synthetic_run(tmp_path / "exp", steps=2, tensors=6, dump_every=None)
    out = _cli("export", "--tensorboard", str(path), "--logdir", str(tmp_path / "logs"),
               code="sys.modules['tensorboard'] = None")
    assert out.returncode == 2
    assert "--tensorboard needs the tensorboard package: pip install 'tf-inspector[tensorboard]'" in out.stderr
    assert not (tmp_path / "logs").exists()


def test_histogram_stride_doubles_as_a_followed_run_grows():
    """Auto stride: about HISTOGRAMS histogram steps over the steps seen so far, a power of two,
    so a growing run's earlier histograms stay and its later ones thin out."""
    chosen, last_hist = [], None
    for a, b in ((0, 50), (50, 400), (400, 1000)):       # three polls of a followed run
        got = tb_export.histogram_steps(np.arange(a, b), 0, 0, b - 1, last_hist)
        chosen.append(got.tolist())
        last_hist = int(got[-1])
    assert chosen[0] == list(range(50))                                  # 50 steps seen: every step
    assert chosen[1] == list(range(52, 400, 4))                          # 400: every 4th (48..51 had 49)
    assert chosen[2] == list(range(400, 1000, 16))                       # 1000: every 16th
    assert tb_export.histogram_steps(np.arange(0, 10_000, 7), 0, 0, 9_999, None).size == 79   # one export: ~100
