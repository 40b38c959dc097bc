"""Statistics queried in place by DuckDB and Polars (the one-liners of README, "Read a run"):
the same rows as inspector's reader, on a run whose parts were compacted and one that was not."""
from __future__ import annotations

import numpy as np
import pytest

import inspector
from inspector.testing import SyntheticRun
from s3server import s3_fixture  # noqa: F401  (registers the fixture ``s3``)


@pytest.fixture(scope="module", params=["compacted", "small parts"])
def run_path(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("q") / "run"
    b = SyntheticRun(path, tensors=10, steps_hint=6, dump_every=None, stats_flush_secs=0)
    if request.param == "small parts":
        b.writer._compactor.rows = None
    b.write_steps(0, 6)
    b.close()
    return path


def expected(path):
    run = inspector.open_run(path)
    name = run.tensors.index[3]
    df = run.query_stats([name], kinds=["forward"], groups=["all"]).sort_values("step")
    return name, df["step"].to_numpy(), df["mean"].to_numpy()


def test_duckdb_reads_statistics_in_place(run_path):
    duckdb = pytest.importorskip("duckdb")
    name, steps, means = expected(run_path)
    rows = duckdb.sql(f"SELECT step, mean FROM '{run_path}/stats/*.parquet' WHERE tensor = '{name}' "
                      "AND kind = 'forward' AND \"group\" = 'all' ORDER BY step").fetchall()
    assert len(rows) == len(steps) > 0
    np.testing.assert_array_equal([r[0] for r in rows], steps)
    np.testing.assert_array_equal([r[1] for r in rows], means)


def test_polars_reads_statistics_in_place(run_path):
    pl = pytest.importorskip("polars")
    name, steps, means = expected(run_path)
    df = (pl.scan_parquet(f"{run_path}/stats/*.parquet")
          .filter((pl.col("tensor") == name) & (pl.col("kind") == "forward") & (pl.col("group") == "all"))
          .sort("step").collect())
    assert len(df) == len(steps) > 0
    np.testing.assert_array_equal(df["step"].to_numpy(), steps)
    np.testing.assert_array_equal(df["mean"].to_numpy(), means)


def test_duckdb_reads_a_bucket_in_place_offline(s3):
    """README, "Distributed training": DuckDB with the fsspec filesystem registered (no httpfs
    download) runs the README's query on a run in an S3 bucket; it equals the reader's rows."""
    duckdb = pytest.importorskip("duckdb")
    url = s3.url("duckdb")
    b = SyntheticRun(url, tensors=6, steps_hint=5, dump_every=None, stats_flush_secs=0, storage_options=s3.options)
    b.write_steps(0, 5)
    b.close()
    run = inspector.open_run(url, storage_options=s3.options)
    cat = run.tensors
    name = cat[cat["has_gradient"].fillna(False).astype(bool)].index[0]
    want = run.query_stats([name], kinds=["gradient"], groups=["all"]).sort_values("step")
    con = duckdb.connect()
    con.register_filesystem(s3.filesystem())
    rows = con.sql(f"""SELECT worker, step, arg_max(l2, session) AS grad_l2
                       FROM read_parquet('{url}/stats/*.parquet')
                       WHERE mode = 'train' AND kind = 'gradient' AND "group" = 'all' AND tensor = '{name}'
                       GROUP BY worker, step ORDER BY worker, step""").fetchall()
    assert len(rows) == len(want) > 0
    np.testing.assert_array_equal([r[1] for r in rows], want["step"].to_numpy())
    np.testing.assert_array_equal([r[2] for r in rows], want["l2"].to_numpy())
