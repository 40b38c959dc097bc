"""Statistics queried in place by DuckDB and Polars (the one-liners of docs/guide/reading.md):
the same rows as inspector's reader, on a run whose parts were compacted and one that was not."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import inspector
from inspector.testing import SyntheticRun
from s3server import s3_fixture  # noqa: F401  (registers the fixture ``s3``)

ROOT = Path(__file__).resolve().parents[1]
STORAGE_GUIDE = ROOT / "docs" / "guide" / "distributed-and-storage.md"


def guide_query(glob: str, tensor: str) -> str:
    """The storage guide's DuckDB query ("Querying the bucket with DuckDB") on ``glob`` and ``tensor``, without its
    httpfs lines: the documented text itself is what runs."""
    text = STORAGE_GUIDE.read_text()
    sql = text[text.index("```sql", text.index("The statistics are plain Parquet")) + 6:]
    sql = sql[:sql.index("```")]
    body = "\n".join(line for line in sql.splitlines() if line and not line.startswith(("INSTALL", "CREATE SECRET")))
    assert "s3://my-bucket/runs/exp1/stats/*.parquet" in body and "conv2/Relu:0" in body, body
    return body.replace("s3://my-bucket/runs/exp1/stats/*.parquet", glob).replace("conv2/Relu:0", tensor)


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
    """docs/guide/distributed-and-storage.md: DuckDB with the fsspec filesystem registered (no httpfs
    download) runs the guide's query on a run in an S3 bucket; it equals the reader's rows."""
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
    rows = con.sql(guide_query(f"{url}/stats/*.parquet", name)).fetchall()
    assert len(rows) == len(want) > 0
    np.testing.assert_array_equal([r[1] for r in rows], want["step"].to_numpy())
    np.testing.assert_array_equal([r[2] for r in rows], want["l2"].to_numpy())


def test_guide_duckdb_query_follows_the_later_session_rule(tmp_path):
    """A resume recording fewer tensors (another ``include=``) hides the first session's rows of
    the steps it ran, of every tensor: the reader shows none there, and neither does the guide's
    query (an ``arg_max(l2, session)`` would keep the first session's)."""
    duckdb = pytest.importorskip("duckdb")
    first = SyntheticRun(tmp_path, tensors=12, steps_hint=6, dump_every=None, stats_flush_secs=0, icnn=False)
    first.write_steps(0, 6)
    first.close()
    resumed = SyntheticRun(tmp_path, tensors=5, steps_hint=6, dump_every=None, stats_flush_secs=0, icnn=False)
    resumed.write_steps(3, 8)
    resumed.close()
    kept = {t.name for t in resumed.catalog}
    name = next(t.name for t in first.catalog if t.has_gradient and t.name not in kept)
    want = inspector.open_run(tmp_path).query_stats([name], kinds=["gradient"], groups=["all"]).sort_values("step")
    assert want["step"].tolist() == [0, 1, 2]   # the resume's steps 3..7 hide its 3..5
    rows = duckdb.sql(guide_query(f"{tmp_path}/stats/*.parquet", name)).fetchall()
    assert [r[1] for r in rows] == [0, 1, 2]
    np.testing.assert_array_equal([r[2] for r in rows], want["l2"].to_numpy())


def doc_sql(path: Path, marker: str) -> str:
    """The first ```sql block after ``marker`` in the document at ``path``: the documented text itself runs."""
    text = path.read_text()
    sql = text[text.index("```sql", text.index(marker)) + 6:]
    return sql[:sql.index("```")]


def test_format_md_decodes_every_bucket_to_its_edges(run_path):
    """FORMAT.md's SQL decoding of ``hist_bucket``: every bucket's edges, as inspector.format.loghist's."""
    duckdb = pytest.importorskip("duckdb")
    from inspector.format.loghist import bucket_edges
    sql = doc_sql(ROOT / "FORMAT.md", "Decoding in SQL").replace("runs/exp1/stats/*.parquet",
                                                                           f"{run_path}/stats/*.parquet")
    df = duckdb.sql(sql).df()
    decoded = df["lo_mag"].notna()
    assert len(df) > 1000 and decoded.mean() > 0.9
    lo, hi = bucket_edges(np.abs(df["bucket"].to_numpy()))
    np.testing.assert_array_equal(df["lo_mag"][decoded], lo[decoded])
    np.testing.assert_array_equal(df["hi_mag"][decoded], hi[decoded])


def test_the_docs_median_query_finds_the_median_bucket(run_path):
    """docs/histograms.md's DuckDB median: per step and group the bucket holding the value of
    rank floor((n - 1) / 2), the bucket inspector.format.loghist's quantiles stand in for."""
    duckdb = pytest.importorskip("duckdb")
    from inspector.format.loghist import LogHistogram, bucket_index
    run = inspector.open_run(run_path)
    name = run.tensors.index[run.tensors["has_gradient"].to_numpy().astype(bool)][3]
    sql = doc_sql(ROOT / "docs" / "histograms.md", "median gradient of one tensor")
    sql = sql.replace("runs/exp1/stats/*.parquet", f"{run_path}/stats/*.parquet").replace("conv3/Relu:0", name)
    got = {(int(s), g): int(b) for s, g, b in duckdb.sql(sql).fetchall()}
    df = run.query_stats([name], kinds=["gradient"])
    assert len(got) == len(df) > 0
    for row in df.itertuples():
        median = LogHistogram.from_lists(row.hist_bucket, row.hist_count).quantiles([0.5])
        assert got[(row.step, row.group)] == bucket_index(median)[0][0], (row.step, row.group)
