"""The Summary page's alerts and first NaN/Inf read only the rows they need (the last window of
finite steps; the parts whose summaries count a NaN/Inf). Each must equal the result computed from every
row the reader returns (a numpy/pandas reference), on compacted, merged and summarised runs."""
from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import inspector
from inspector import analysis
from inspector.analysis import Thresholds
from inspector.format import stats_name
from inspector.stats.merge import Levels
from inspector.stats.summary import FOLDER
from inspector.testing import SyntheticRun, sparse_rows

STEPS = 40
STRIDE = 10  # statistics every 10 steps: a window of steps reaches further back than its width
NAN_STEP = 38 * STRIDE


def write(path: Path, start: int = 0, stop: int = STEPS, nonfinite_at: int | None = NAN_STEP, seed: int = 0,
          steps: np.ndarray | None = None, compact: bool = True) -> Path:
    """Statistics steps ``start * STRIDE``.. (or ``steps``): one small part each, compacted every 4,
    merged by fours (summaries included); ``compact=False``: left small, as a live session's."""
    b = SyntheticRun(path, tensors=12, steps_hint=STEPS, dump_every=None, stats_flush_secs=0,
                     nonfinite_at=nonfinite_at, seed=seed)
    b.writer._compactor.rows = 4 * len(b.row_tensor) if compact else None
    b.writer._compactor.after.levels = Levels(4)
    steps = np.arange(start, stop) * STRIDE if steps is None else steps
    values, index, hist = b.stats_block(steps)
    for k, step in enumerate(steps):
        b.writer.add_stats(int(step), values[k], sparse_rows(index[k], hist[k]))
    b.close()
    return path


def first_bad_row(run) -> dict | None:
    """The reference: the earliest row (stable by the reader's order) counting a NaN/Inf."""
    df = run.query_stats(groups=["all"], columns=["nan", "inf"])
    bad = df[(df["nan"] > 0) | (df["inf"] > 0)].sort_values("step", kind="stable")
    if bad.empty:
        return None
    r = bad.iloc[0]
    return {"step": int(r["step"]), "tensor": str(r["tensor"]), "kind": str(r["kind"]), "nan": int(r["nan"]),
            "inf": int(r["inf"]), "worker": str(r["worker"]), "session": int(r["session"]), "source": "statistics"}


def reference_alerts(run, th: Thresholds) -> list[analysis.Alert]:
    """run_alerts' alerts of the kinds it judged before the diagnosis (JUDGED), from every row of
    group all: the gradient and ReLU alerts judge the last ``th.window`` statistics steps before
    the first NaN/Inf (the last finite window), the ICNN betas every step."""
    stats = run.query_stats(groups=["all"], columns=["l2", "zero_fraction", "min", "max"])
    first = statistics_evidence(run)
    finite = stats[stats["step"] < first["step"]] if first else stats
    last = np.sort(finite["step"].unique())[-th.window:]
    window = finite[finite["step"].isin(last)]
    out = analysis.nonfinite_alert(run.first_nonfinite(), run.tensors)
    out += analysis.gradient_alerts(window, th, run.tensors) + analysis.dead_relus(window, run.tensors, th)
    out += analysis.icnn_beta_alerts(stats, run.tensors)
    out += analysis.error_alerts(run.errors, run.sessions) + analysis.dropped_alerts(run.dropped)
    out += [analysis.Alert("warning", "damaged_file", p) for p in run.problems]
    return judged(out)


#: the kinds of alert the reference computes from every row
JUDGED = {"nonfinite", "exploding_gradient", "vanishing_gradient", "gradient_ratio", "dead_relu",
          "icnn_beta_diverged", "writer_error", "damaged_file", "dropped_statistics", "dropped_dumps",
          "dropped_data"}


def judged(alerts: list) -> list:
    """The alerts of the JUDGED kinds, in one order (run_alerts ranks the diagnosis' findings)."""
    return sorted((a for a in alerts if a.kind in JUDGED), key=lambda a: (a.severity, a.kind, str(a.tensor), a.message))


def statistics_evidence(run) -> dict | None:
    return next((e for e in run.nonfinite_evidence() if e["source"] == "statistics"), None)


def count_reads(monkeypatch) -> list[str]:
    read: list[str] = []
    real = inspector.Run._read_part

    def spy(self, worker, session, part, columns, filters, **kw):
        read.append(part[0])
        return real(self, worker, session, part, columns, filters, **kw)
    monkeypatch.setattr(inspector.Run, "_read_part", spy)
    return read


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    return write(tmp_path_factory.mktemp("a") / "run")


@pytest.fixture
def run_dir(made, tmp_path) -> Path:
    shutil.copytree(made, tmp_path / "run")
    return tmp_path / "run"


@pytest.mark.parametrize("window", [3, 10, 35])
def test_alerts_equal_those_from_every_row(run_dir, monkeypatch, window):
    # thresholds every tensor crosses: each message then states a window's median/minimum to get right
    th = Thresholds(window=window, dead_zero_fraction=0.0, vanishing_l2=1e30, layer_ratio=1.0)
    assert len(list((run_dir / FOLDER).iterdir())) >= 2  # summarised parts: the partial reads apply
    run = inspector.open_run(run_dir)
    read = count_reads(monkeypatch)
    got = analysis.run_alerts(run, th)
    read = list(read)
    parts = len(run._stats_files)
    fresh = inspector.open_run(run_dir)
    want = reference_alerts(fresh, th)
    assert [a.kind for a in judged(got)] == [a.kind for a in want]
    assert judged(got) == want
    assert {"nonfinite", "dead_relu", "vanishing_gradient", "gradient_ratio", "icnn_beta_diverged"} <= \
        {a.kind for a in want}
    if window == 3:  # the last steps' parts only, not every part for each query
        assert len(read) < 3 * parts


def test_first_nonfinite_equals_the_first_bad_row(run_dir, monkeypatch):
    run = inspector.open_run(run_dir)
    read = count_reads(monkeypatch)
    got = statistics_evidence(run)
    read = list(read)
    want = first_bad_row(inspector.open_run(run_dir))
    assert want is not None and want["step"] == NAN_STEP
    assert got == want
    assert len(read) < len(run._stats_files)  # parts whose summaries count no NaN/Inf were skipped


def test_clean_run_has_no_first_nonfinite_and_reads_no_summarised_part(tmp_path, monkeypatch):
    path = write(tmp_path / "clean", nonfinite_at=None)
    run = inspector.open_run(path)
    read = count_reads(monkeypatch)
    assert statistics_evidence(run) is None
    read = list(read)
    assert first_bad_row(inspector.open_run(path)) is None
    summarised = {f"stats/{p.name}" for p in (path / FOLDER).iterdir()}
    assert summarised and not summarised & set(read)


def test_overlapping_sessions_give_the_reference_results(run_dir):
    write(run_dir, start=30, stop=40, nonfinite_at=None, seed=1)  # session 2 replaces the last 10 steps, no NaN
    run = inspector.open_run(run_dir)
    want = first_bad_row(inspector.open_run(run_dir))
    assert want is None or want["step"] != NAN_STEP   # the later session's clean rows won that step
    assert statistics_evidence(run) == want
    th = Thresholds(window=5, dead_zero_fraction=0.0, vanishing_l2=1e30)
    assert judged(analysis.run_alerts(run, th)) == reference_alerts(inspector.open_run(run_dir), th)


def test_damaged_summary_is_reported_and_the_part_read(run_dir):
    s = sorted((run_dir / FOLDER).iterdir())[-1]
    s.write_bytes(s.read_bytes()[:100])
    run = inspector.open_run(run_dir)
    assert statistics_evidence(run) == first_bad_row(inspector.open_run(run_dir))
    assert any("damaged statistics summary" in p for p in run.problems)


@pytest.mark.parametrize("overlap", [False, True])
def test_stats_steps_equal_the_steps_of_every_row(run_dir, monkeypatch, overlap):
    if overlap:
        write(run_dir, start=30, stop=45, nonfinite_at=None, seed=1)  # session 2 goes past session 1's end
    run = inspector.open_run(run_dir)
    read = count_reads(monkeypatch)
    for kind, group in [("forward", "all"), ("gradient", "positive")]:
        want = np.unique(inspector.open_run(run_dir).query_stats(kinds=[kind], groups=[group], columns=[])["step"])
        del read[:]
        np.testing.assert_array_equal(run.stats_steps(kind, group), want)
        assert len(want) == STEPS + 5 * overlap
        summarised = {f"stats/{p.name}" for p in (run_dir / FOLDER).iterdir()}
        assert summarised and not summarised & set(read)  # their summaries list the steps


def _rewrite_summary_metadata(path: Path, edit) -> None:
    """Rewrite the summary at ``path`` with its footer metadata changed by ``edit(dict)``."""
    import pyarrow.parquet as pq
    pf = pq.ParquetFile(path)
    meta = {k.decode(): v.decode() for k, v in pf.metadata.metadata.items() if k.startswith(b"tf_inspector")}
    edit(meta)
    t = pf.read().replace_schema_metadata(None)  # else the old footer metadata is written back
    with pq.ParquetWriter(path, t.schema) as w:
        w.write_table(t)
        w.add_key_value_metadata(meta)


@pytest.mark.parametrize("case", ["irregular", "older", "tampered", "crc-only"])
def test_stats_steps_from_summaries_or_rows_equal_every_row(tmp_path, monkeypatch, case):
    # irregular gaps: several step runs per part; older summaries (no step lists) and step lists
    # that fail their checksum make the reader read the part's rows
    steps = np.cumsum(np.random.default_rng(3).choice([1, 2, 7, 10], size=STEPS))
    run_dir = write(tmp_path / "run", nonfinite_at=None, steps=steps)
    s = sorted((run_dir / FOLDER).iterdir())[0]
    if case == "older":
        _rewrite_summary_metadata(s, lambda m: [m.pop(k) for k in ("tf_inspector.steps", "tf_inspector.meta_crc32")])
    elif case == "tampered":  # the first step dropped from the step lists (a flipped digit, say)
        old = f'"forward/all":[[{steps[0]},'
        _rewrite_summary_metadata(s, lambda m: m.update({"tf_inspector.steps": m["tf_inspector.steps"].replace(
            old, f'"forward/all":[[{steps[0] + 1},', 1)}) if old in m["tf_inspector.steps"] else 1 / 0)
    elif case == "crc-only":  # the checksum also covers the step range used to skip parts
        _rewrite_summary_metadata(s, lambda m: m.update({"tf_inspector.meta_crc32": "1"}))
    want = np.unique(inspector.open_run(run_dir).query_stats(kinds=["forward"], groups=["all"], columns=[])["step"])
    run = inspector.open_run(run_dir)
    read = count_reads(monkeypatch)
    got = run.stats_steps("forward", "all")
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, np.unique(steps))
    assert (f"stats/{s.name}" in read) == (case != "irregular")
    assert any("damaged statistics summary" in p and s.name in p for p in run.problems) == (
        case in ("tampered", "crc-only"))


def test_small_parts_are_read_once_for_every_step_list_and_the_first_nonfinite(tmp_path, monkeypatch):
    """`info`'s questions (steps of two (kind, group)s, the first NaN/Inf) read each part without a
    summary once, and answer as every row does."""
    path = write(tmp_path / "run", compact=False)
    run = inspector.open_run(path)
    assert len(run._stats_files) == STEPS and not (path / FOLDER).exists()
    read = count_reads(monkeypatch)
    got = {kg: run.stats_steps(*kg) for kg in [("forward", "all"), ("gradient", "positive"), ("gradient", "none")]}
    evidence = statistics_evidence(run)
    parts = sorted(read)
    monkeypatch.undo()
    fresh = inspector.open_run(path)
    for (kind, group), steps in got.items():
        want = np.unique(fresh.query_stats(kinds=[kind], groups=[group], columns=[])["step"]) if group != "none" \
            else np.zeros(0, np.int64)
        np.testing.assert_array_equal(steps, want)
    assert len(got[("forward", "all")]) == STEPS
    assert evidence == first_bad_row(fresh) and evidence["step"] == NAN_STEP
    # each part once for its digest, and those with a NaN/Inf (the NaN stays from NAN_STEP on)
    # once more for their rows
    counts = Counter(parts)
    assert set(counts) == {p[0] for _, _, p in run._stats_files}
    bad = {stats_name('chief', 1, k + 1) for k in range(NAN_STEP // STRIDE, STEPS)}
    assert {p: n for p, n in counts.items() if n != 1} == dict.fromkeys(bad, 2)
