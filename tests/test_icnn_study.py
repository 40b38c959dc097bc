"""The ICNN study's machinery: its table's structure, its paired statistics against SciPy,
and one seed reproducing its numbers. The --quick numbers themselves mean nothing."""
from __future__ import annotations

import json
import logging
import re

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
scipy_stats = pytest.importorskip("scipy.stats")

from examples import icnn_study  # noqa: E402


@pytest.mark.parametrize("t,df", [(0.3, 1), (-2.0, 1), (2.776445, 4), (-0.59, 4), (5.1, 9), (12.0, 3), (0.0, 7)])
def test_t_p_value_matches_scipy(t, df):
    assert icnn_study.t_two_sided_p(t, df) == pytest.approx(2 * scipy_stats.t.sf(abs(t), df), rel=1e-9, abs=1e-14)


def test_paired_stats_match_scipy_and_numpy():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=7), rng.normal(size=7)
    b[3] = a[3]                                      # one tie
    s = icnn_study.paired_stats(a, b)
    ref = scipy_stats.ttest_rel(a, b)
    assert s["t"] == pytest.approx(ref.statistic, rel=1e-12) and s["p"] == pytest.approx(ref.pvalue, rel=1e-9)
    assert s["mean_diff"] == pytest.approx(np.mean(a - b)) and s["sd_diff"] == pytest.approx(np.std(a - b, ddof=1))
    assert (s["icnn_lower"], s["icnn_higher"], s["ties"]) == (int((a < b).sum()), int((a > b).sum()), 1)
    with pytest.raises(ValueError, match="at least 2"):
        icnn_study.paired_stats([1.0], [2.0])


def test_quick_study_table_statistics_and_reproducibility(tmp_path, capsys, caplog):
    out = tmp_path / "study.json"
    with caplog.at_level(logging.WARNING, logger="tf_inspector.icnn"):
        result = icnn_study.main(["--quick", "--no-progress", "--json", str(out)])
    # Adam at lr 1e-3 moves beta by ~1e-3 a step: the beta watch must not cry wolf.
    assert not [r for r in caplog.records if r.name == "tf_inspector.icnn"]
    printed = capsys.readouterr().out
    rows = result["rows"]
    assert [(r["seed"], r["model"]) for r in rows] == [(0, "icnn"), (0, "plain"), (1, "icnn"), (1, "plain")]
    for m in icnn_study.METRICS:
        icnn = np.array([r[m] for r in rows if r["model"] == "icnn"])
        plain = np.array([r[m] for r in rows if r["model"] == "plain"])
        s = result["summary"][m]
        assert s["icnn_mean"] == pytest.approx(icnn.mean()) and s["plain_sd"] == pytest.approx(plain.std(ddof=1))
        assert s["mean_diff"] == pytest.approx((icnn - plain).mean())
        if np.std(icnn - plain) > 0:
            ref = scipy_stats.ttest_rel(icnn, plain)
            assert s["t"] == pytest.approx(ref.statistic) and s["p"] == pytest.approx(ref.pvalue)
        assert s["icnn_lower"] + s["icnn_higher"] + s["ties"] == 2
        assert m in printed
    table_rows = re.findall(r"^\s+(\d+) (icnn|plain) ", printed, flags=re.M)
    assert table_rows == [("0", "icnn"), ("0", "plain"), ("1", "icnn"), ("1", "plain")]
    assert json.loads(out.read_text())["summary"]["accuracy"]["n"] == 2
    # One seed reproduces its numbers (same data, init, batches; 1 thread).
    again = icnn_study.run_study(**{**icnn_study.QUICK, "seeds": 2}, progress=False)
    for r1, r2 in zip(rows, again["rows"]):
        assert {k: v for k, v in r1.items() if k != "seconds"} == {k: v for k, v in r2.items() if k != "seconds"}
