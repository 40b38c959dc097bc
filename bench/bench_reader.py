"""Reader speed and memory: open + first statistics query, one dumped tensor, peak RSS vs run size.

Run::

    .venv/bin/python bench/bench_reader.py            # 1,000 steps x 300 tensors; 2 GiB vs 32 GiB of dumps
    .venv/bin/python bench/bench_reader.py --quick    # smoke run
    .venv/bin/python bench/bench_reader.py --long 10000 --tensors 1000   # a long run (60M rows)
    .venv/bin/python bench/bench_reader.py --measure runs/a runs/b       # the long-run columns of existing runs

Long runs (``--long STEPS``): ``inspector.testing.make_long_run`` writes a run of STEPS
statistics steps x ``--tensors`` tensors in compacted parts (100 real steps repeated, as the
writer's compaction lays them out), and a run of STEPS / 10 steps beside it; for each, in a
fresh process: open, the first ``query_stats`` of one tensor, the viewer overview's matrix
(``inspector.stats.summary.overview``: gradient l2, at most 300 step bins, from the parts'
summaries), every tensor's gradient l2 row at every step (what the overview read before
summaries) and peak RSS after each. Targets: open + first query < 1 s, and peak RSS for the
first query and the matrix flat in the run size.

Method. Runs are written into a temporary directory: the statistics run with
``inspector.testing.make_synthetic_run`` (the project's writer, 1,000 steps x 300 tensors,
stats every step), the memory runs with the project's ``RunWriter`` (manifest) plus dump files
whose safetensors header is real and whose data is a sparse hole (``truncate``), so many GB
cost no disk and no time to write yet read back as zeros. Every measurement runs in a fresh
subprocess (nothing cached in the process; the OS page cache is warm, as for a user who just
wrote the run): open time, first ``query_stats`` of one tensor over all steps, the whole
statistics table, a dumped tensor read into memory, and peak RSS (``ru_maxrss``) while reading
one 16 MiB tensor from every dump file of a small and of a large run. If the reader holds on
to what it read, peak RSS grows with the run; it should not.

Checksums (FORMAT.md): the CRC32s the writer adds to a 60 MB dump (timed on their own, as the
dump thread computes them), and one 16 MiB tensor of that dump read into memory in a fresh
process with ``open_run(verify=True)`` (the default: the CRC32 is checked on first read) and
``verify=False``.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # first: imports below (noqa: E402) from this checkout

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from tqdm import tqdm  # noqa: E402

from bench.common import du_bytes, format_table, human_bytes  # noqa: E402

TENSOR_MB = 16      # the tensor read from each dump file
FILE_TENSORS = 8    # tensors per dump file: 8 x 64 MiB + the 16 MiB one


# ---- children (fresh processes) -------------------------------------------------------------
def _child_stats(path: str) -> dict:
    t0 = time.perf_counter()
    import inspector
    t_import = time.perf_counter()
    run = inspector.open_run(path)
    t_open = time.perf_counter()
    name = run.tensors.index[len(run.tensors) // 2]
    df = run.query_stats([name], kinds=["forward"], groups=["all"], columns=["mean", "std"])
    t_query = time.perf_counter()
    full = run.stats
    t_full = time.perf_counter()
    assert len(df) > 0 and len(full) > 0
    return {"import": t_import - t0, "open": t_open - t_import, "first_query": t_query - t_open,
            "all_stats": t_full - t_query, "rows": len(full)}


def _child_dump(path: str) -> dict:
    import inspector
    run = inspector.open_run(path)
    steps = run.steps
    names = [n for n in run.tensors.index if run.tensors.loc[n, "batched"]]
    times = []
    for i, step in enumerate(steps[:20]):
        t = time.perf_counter()
        a = np.array(run.tensor(names[i % len(names)], step, "gradient"))  # into memory
        times.append(time.perf_counter() - t)
    return {"read_ms": 1e3 * statistics.median(times), "first_ms": 1e3 * times[0], "shape": list(a.shape)}


def _child_verify(path: str, verify: bool) -> dict:
    import inspector
    run = inspector.open_run(path, verify=verify)
    run.dump_keys(run.steps[0])  # the header: not what is timed
    t = time.perf_counter()
    a = np.array(run.dump_array(run.steps[0], "forward/small:0"))
    return {"read_ms": 1e3 * (time.perf_counter() - t), "mib": a.nbytes / 2 ** 20}


def _child_mem(path: str) -> dict:
    import inspector
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run = inspector.open_run(path)
    total = 0.0
    for step in run.steps:
        total += float(run.dump_array(step, "forward/small:0").sum())  # touches every page
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"base_kib": base, "peak_kib": peak, "files": len(run.steps), "checksum": total}


def _child_make_long(path: str) -> dict:
    """Write the long run in its own process: the parent's peak RSS would be inherited by the
    measuring children (Linux keeps ru_maxrss across fork + exec)."""
    from inspector.testing import make_long_run
    steps, tensors = (int(v[1:]) for v in Path(path).name.split("_"))
    t = time.perf_counter()
    make_long_run(path, steps=steps, tensors=tensors)
    return {"seconds": time.perf_counter() - t}


def _child_long(path: str) -> dict:
    t0 = time.perf_counter()
    import inspector
    rss_import = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run = inspector.open_run(path)
    t_open = time.perf_counter()
    name = run.tensors.index[len(run.tensors) // 2]
    df = run.query_stats([name], kinds=["forward"], groups=["all"], columns=["mean", "std"])
    t_query = time.perf_counter()
    rss_query = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    from inspector.stats.summary import overview
    matrix = overview(run, "gradient", "all", "l2").matrix  # the viewer's heatmap: from the summaries
    t_matrix = time.perf_counter()
    rss_matrix = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    over = run.query_stats(kinds=["gradient"], groups=["all"], columns=["l2"])
    t_over = time.perf_counter()
    return {"open": t_open - t0, "first_query": t_query - t_open, "overview_query": t_over - t_matrix,
            "overview_matrix": t_matrix - t_query, "rss_matrix_kib": rss_matrix, "matrix_columns": matrix.shape[1],
            "rows_query": len(df), "rows_overview": len(over), "rss_query_kib": rss_query,
            "rss_overview_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "rss_import_kib": rss_import,
            "parts": len(list((Path(path) / "stats").glob("*.parquet")))}


def long_runs(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="bench_reader_long_"))
    try:
        rows = []
        for steps in (args.long // 10, args.long):
            path = root / f"s{steps}_t{args.tensors}"
            t_write = child("make_long", path)["seconds"]
            reps = [child("long", path) for _ in range(args.reps)]
            med = {k: statistics.median(r[k] for r in reps) for k in reps[0]}
            rows.append([f"{steps} x {args.tensors}", f"{human_bytes(du_bytes(path))}, {med['parts']:.0f} parts",
                         f"{t_write:.0f} s", f"{1e3 * med['open']:.0f} ms", f"{1e3 * med['first_query']:.0f} ms",
                         f"{1e3 * (med['open'] + med['first_query']):.0f} ms",
                         human_bytes(1024 * med["rss_import_kib"]), human_bytes(1024 * med["rss_query_kib"]),
                         f"{1e3 * med['overview_matrix']:.0f} ms ({med['matrix_columns']:.0f} columns)",
                         human_bytes(1024 * med["rss_matrix_kib"]),
                         f"{1e3 * med['overview_query']:.0f} ms ({med['rows_overview']:,.0f} rows)",
                         human_bytes(1024 * med["rss_overview_kib"])])
            shutil.rmtree(path, ignore_errors=True)
        print(format_table(rows, ["steps x tensors", "on disk", "generated in", "open", "first query (1 tensor)",
                                  "open + query (< 1 s)", "RSS after import", "peak RSS", "overview matrix",
                                  "peak RSS after it", "every gradient l2 row", "peak RSS after it"]))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def measure_runs(args: argparse.Namespace) -> None:
    """``--measure DIR ...``: the long-run columns for existing runs (side by side: one fresh
    process per run and repetition, interleaved), e.g. a run before and after its parts were
    merged by levels."""
    reps: dict[str, list[dict]] = {d: [] for d in args.measure}
    for _ in range(args.reps):
        for d in args.measure:
            reps[d].append(child("long", Path(d)))
    rows = []
    for d, rs in reps.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        rows.append([d, f"{human_bytes(du_bytes(Path(d)))}, {med['parts']:.0f} parts", f"{1e3 * med['open']:.0f} ms",
                     f"{1e3 * med['first_query']:.0f} ms", f"{1e3 * (med['open'] + med['first_query']):.0f} ms",
                     human_bytes(1024 * med["rss_query_kib"]),
                     f"{1e3 * med['overview_matrix']:.0f} ms ({med['matrix_columns']:.0f} columns)",
                     human_bytes(1024 * med["rss_matrix_kib"]),
                     f"{1e3 * med['overview_query']:.0f} ms ({med['rows_overview']:,.0f} rows)",
                     human_bytes(1024 * med["rss_overview_kib"])])
    print(format_table(rows, ["run", "on disk", "open", "first query (1 tensor)", "open + query (< 1 s)",
                              "peak RSS", "overview matrix", "peak RSS after it", "every gradient l2 row",
                              "peak RSS after it"]))


# ---- scale: many files, one large part ------------------------------------------------------
def many_parts_run(path: Path, parts: int, tensors: int = 50, dumps: int = 0) -> None:
    """A run whose session wrote ``parts`` small statistics parts (one step each: the project's
    writer's first part, its steps shifted) and ``dumps`` small dumps, as a live session that
    never compacted leaves them; the manifest says so (``stats_parts``, ``dump_runs``)."""
    import pyarrow.parquet as pq

    from inspector.dumps import files as safetensors_io
    from inspector.sessions.crosscheck import encode_dumps
    from inspector.format import dump_name, manifest_name, stats_name
    from inspector.storage.atomic import write_json
    from inspector.stats.parts import parquet_options
    from inspector.testing import make_synthetic_run
    make_synthetic_run(path, steps=1, tensors=tensors, dump_every=None, icnn=False)
    first = path / stats_name("chief", 1, 1)
    table = pq.read_table(first)
    step = table.schema.get_field_index("step")
    for k in range(2, parts + 1):
        t = table.set_column(step, "step", pa.array(np.full(table.num_rows, k - 1, np.int64)))
        pq.write_table(t, path / stats_name("chief", 1, k), **parquet_options(t.schema))
    arrays = {"forward/a:0": np.zeros((4, 4), np.float32)}
    for k in range(dumps):
        safetensors_io.Encoded(arrays, {"step": str(k), "worker": "chief", "session": "1"}).write(
            path / dump_name("chief", 1, k), fsync=False)
    m = json.loads((path / manifest_name("chief", 1)).read_text())
    m.update(stats_parts=parts, steps=[0, max(parts, dumps) - 1], dumps_written=dumps,
             dump_runs=encode_dumps((k, None) for k in range(dumps)))
    write_json(path / manifest_name("chief", 1), m)


def compact_as_writer(path: Path, parts: int) -> None:
    """Roll the small parts 1..``parts`` of ``path``'s session chief/1 up as its writer would
    have while writing them (by count, then levels and summaries), the last ones left small,
    as a killed session leaves them."""
    import pyarrow.parquet as pq

    from inspector.format import stats_name
    from inspector.stats.merge import LevelMerger
    from inspector.stats.parts import Compactor
    errors: list[BaseException] = []
    rows = pq.read_metadata(path / stats_name("chief", 1, 1)).num_rows
    c = Compactor(path, "chief", 1, after=LevelMerger(path, "chief", 1), on_error=errors.append)
    for seq in range(1, parts + 1):
        c.added(seq, rows)
    c.join()
    if errors:
        raise RuntimeError(f"compaction failed: {errors[0]!r}") from errors[0]


def live_run(path: Path, steps: int, tensors: int = 50) -> None:
    """A live session as the project's writer leaves it when its process is killed: one small
    part per statistics step (``stats_flush_secs=0``), rolled up as the writer does (by rows or
    by count, then by levels, with summaries), the last ones not yet compacted. Run it in a
    child process: it ends with ``os._exit``, as a killed training would."""
    from inspector.testing import SyntheticRun
    b = SyntheticRun(path, tensors=tensors, steps_hint=steps, dump_every=None, stats_flush_secs=0, icnn=False)
    b.write_steps(0, steps)
    while b.writer._seq < steps and b.writer.error is None:   # every part written (or the writer failed)
        time.sleep(0.05)
    b.writer._compactor.join()
    print(json.dumps({"small": sum(1 for f in (path / "stats").glob("*.parquet") if "-" not in f.name)}), flush=True)
    os._exit(0)


def many_sessions_run(path: Path, sessions: int) -> None:
    """A run of ``sessions`` finished sessions of one worker (a manifest each, 30 tensors)."""
    from inspector.format import manifest_name
    from inspector.storage.atomic import write_json
    from inspector.testing import make_synthetic_run
    make_synthetic_run(path, steps=1, tensors=30, dump_every=None, icnn=False)
    m = json.loads((path / manifest_name("chief", 1)).read_text())
    for s in range(2, sessions + 1):
        write_json(path / manifest_name("chief", s), {**m, "session": s, "stats_parts": 0, "graph_bytes": None})


def big_part_run(path: Path, rows: int, tensors: int = 1000) -> None:
    """A run with one compacted statistics part of ``rows`` rows (``make_long_run``'s parts,
    sorted by tensor with the per-tensor row-group index), summaries and merges left out."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from inspector.format import stats_range_name
    from inspector.stats.parts import write_sorted
    from inspector.testing import make_synthetic_run
    make_synthetic_run(path, steps=100, tensors=tensors, dump_every=None, icnn=False, dead_relu=False)
    files = sorted((path / "stats").glob("*.parquet"))
    block = pa.concat_tables([pq.read_table(f) for f in files])
    for f in files:
        f.unlink()
    copies = -(-rows // block.num_rows)
    step = block.schema.get_field_index("step")
    table = pa.concat_tables([block.set_column(step, "step", pc.add(block.column("step"), k * 100))
                              for k in range(copies)]).slice(0, rows)
    write_sorted(table, path / stats_range_name("chief", 1, 1, 1000))


def _unindexed(path: str, linear: bool) -> dict:
    """A run of one part without a row-group index (``inspector.testing.make_unindexed_run``)."""
    from inspector.testing import make_unindexed_run
    make_unindexed_run(path, int(Path(path).name.rsplit("_", 1)[1]), linear=linear)
    return {}


def _cpu_seconds() -> float:
    """CPU time of this process so far, every thread's (user + system): on a machine others load,
    the time that does not grow with their load."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _child_info(path: str) -> dict:
    t0 = time.perf_counter()
    from inspector import cli
    rss_import = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t1, cpu1 = time.perf_counter(), _cpu_seconds()
    run = cli._open_checked(path)
    text = cli.summary(run)
    t2 = time.perf_counter()
    return {"import": t1 - t0, "info": t2 - t1, "cpu": _cpu_seconds() - cpu1, "rss_import_kib": rss_import,
            "lines": text.count("\n") + 1,
            "rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "problems": len(run.problems)}


def _child_one_tensor(path: str) -> dict:
    import inspector
    rss_import = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    run = inspector.open_run(path)
    name = run.tensors.index[len(run.tensors) // 2]
    df = run.query_stats([name])
    return {"seconds": time.perf_counter() - t, "rows": len(df), "rss_import_kib": rss_import,
            "rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}


def scale_runs(args: argparse.Namespace) -> None:
    """``--scale``: ``info`` on runs of many files, one tensor of one large part; fresh
    processes. ``--scale-cases``: which (parts, dumps, sessions, big); each row is printed as
    soon as it is measured."""
    root = Path(tempfile.mkdtemp(prefix="bench_reader_scale_"))
    cache = root / "cache"   # the reader's local cache, fresh for each run's first info
    os.environ["TF_INSPECTOR_CACHE"] = str(cache)
    f = 0.1 if args.quick else 1.0
    headers = ["measure", "time", "peak RSS", "RSS after import", "problems", "target", "run"]
    print("  |  ".join(headers), flush=True)
    try:
        rows = []
        cases = [("live", f"a killed live session of {int(10_000 * f):,} statistics steps, a part each, as the "
                          f"writer leaves it", lambda p: child("make_live", p / str(int(10_000 * f))),
                  "< 10 s, < 500 MB"),
                 ("parts", f"{int(10_000 * f):,} statistics parts, none compacted",
                  lambda p: many_parts_run(p, int(10_000 * f)), "< 10 s, < 500 MB"),
                 ("dumps", f"{int(100_000 * f):,} dumps + {int(30_000 * f):,} statistics steps, a part each, "
                           f"as the writer leaves them",
                  lambda p: many_parts_run(p, int(30_000 * f), dumps=int(100_000 * f))
                  or compact_as_writer(p, int(30_000 * f)), "< 60 s"),
                 ("uncompacted", f"{int(100_000 * f):,} dumps + {int(30_000 * f):,} small statistics parts, "
                                 "none compacted",
                  lambda p: many_parts_run(p, int(30_000 * f), dumps=int(100_000 * f)), "< 60 s"),
                 ("sessions", f"{int(20_000 * f):,} sessions", lambda p: many_sessions_run(p, int(20_000 * f)), "")]
        cases = [c for c in cases if c[0] in args.scale_cases]
        for _, label, make, target in tqdm(cases, desc="info runs", file=sys.stderr):
            path = root / "run"
            t = time.perf_counter()
            make(path)
            made = time.perf_counter() - t
            shutil.rmtree(cache, ignore_errors=True)
            # first on an empty local cache, then again: the small parts' digests cached
            for when in ("", ", again"):
                got = child("info", path)
                rows.append([f"info{when}: {label}", f"{got['info']:.1f} s (CPU {got['cpu']:.1f} s)",
                             human_bytes(1024 * got["rss_kib"]), human_bytes(1024 * got["rss_import_kib"]),
                             f"{got['problems']}", target, f"{human_bytes(du_bytes(path))}, made in {made:.0f} s"])
                print("  |  ".join(rows[-1]), flush=True)
            shutil.rmtree(path)
        n = int(10_000_000 * f)
        bigs = [("big", "make_big", "one compacted part (row-group index)", "<= 1 s, <= 1 GB"),
                ("unindexed", "make_unindexed", "one part without an index, log histograms",
                 "<= 2 s, <= 1 GB"),
                ("unindexed", "make_unindexed_linear", "one part without an index, before version 4",
                 "<= 2 s, <= 1 GB")]
        for case, make, what, target in bigs:
            if case not in args.scale_cases:
                continue
            path = root / f"{make}_{n}"
            child(make, path)   # in its own process: a child inherits its parent's peak RSS
            # an unindexed part: the first query writes its sorted copy, the next reads it
            for when in ("", ", again") if case == "unindexed" else ("",):
                got = child("one_tensor", path)
                rows.append([f"query_stats(one tensor){when}: {what}, {n:,} rows "
                             f"({got['rows']:,} rows read)",
                             f"{got['seconds']:.2f} s", human_bytes(1024 * got["rss_kib"]),
                             human_bytes(1024 * got["rss_import_kib"]), "-", target,
                             human_bytes(du_bytes(path))])
                print("  |  ".join(rows[-1]), flush=True)
            shutil.rmtree(path)
            shutil.rmtree(cache / "sorted", ignore_errors=True)
        print(format_table(rows, headers))
    finally:
        shutil.rmtree(root, ignore_errors=True)


CHILDREN = {"stats": _child_stats, "long": _child_long, "make_long": _child_make_long, "dump": _child_dump,
            "mem": _child_mem, "info": _child_info, "one_tensor": _child_one_tensor,
            "make_big": lambda p: big_part_run(Path(p), int(Path(p).name.rsplit("_", 1)[1])) or {},
            "make_unindexed": lambda p: _unindexed(p, linear=False),
            "make_unindexed_linear": lambda p: _unindexed(p, linear=True),
            "make_live": lambda p: live_run(Path(p).parent, int(Path(p).name)),
            "verify": lambda p: _child_verify(p, True), "noverify": lambda p: _child_verify(p, False)}


def child(kind: str, path: Path) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", kind, str(path)], capture_output=True, text=True,
                         check=False)
    if out.returncode:
        raise RuntimeError(f"child {kind} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---- writing runs ---------------------------------------------------------------------------
def sparse_run(path: Path, files: int) -> int:
    """A run of ``files`` dump files (8 x 64 MiB + one 16 MiB float32 tensor each), data as holes."""
    from inspector.dumps import files as safetensors_io
    from inspector.format import dump_name
    from inspector.writer import RunWriter
    big = [(f"forward/big{i}:0", (16, 1024, 1024)) for i in range(FILE_TENSORS)]
    arrays = {k: np.broadcast_to(np.float32(0), s) for k, s in big}
    arrays["forward/small:0"] = np.broadcast_to(np.float32(0), (TENSOR_MB, 1024, 256))
    catalog = [{"name": k.split("/", 1)[1], "op": k.split("/", 1)[1][:-2], "op_type": "Relu", "dtype": "float32",
                "shape": list(a.shape), "scope": "", "has_gradient": False, "batched": True,
                "icnn_layer": None, "icnn_role": None} for k, a in arrays.items()]
    RunWriter(path, manifest={"tensors": catalog}).close()
    total = 0
    for step in range(1, files + 1):   # each header names its own step (the reader checks it)
        header = safetensors_io.header_for(arrays, {"step": str(step)})
        size = len(header) + sum(a.nbytes for a in arrays.values())
        with open(path / dump_name("chief", 1, step), "wb") as f:
            f.write(header)
            f.truncate(size)
        total += size
    return total


def crc_run(path: Path) -> float:
    """A run with one 60 MB dump (11 x 4 MiB + one 16 MiB float32 tensor, random values).
    Returns the seconds its CRC32s took (``Encoded.final_header``, on the dump thread)."""
    from inspector.dumps import files as safetensors_io
    from inspector.format import dump_name
    from inspector.writer import RunWriter
    rng = np.random.default_rng(0)
    arrays = {f"forward/big{i}:0": rng.random((1024, 1024), np.float32) for i in range(11)}
    arrays["forward/small:0"] = rng.random((TENSOR_MB, 1024, 256), np.float32)
    RunWriter(path, manifest={"tensors": []}).close()
    enc = safetensors_io.Encoded(arrays, {"step": "1"})
    times = []
    for _ in range(5):
        t = time.perf_counter()
        enc.final_header()
        times.append(time.perf_counter() - t)
    enc.write(path / dump_name("chief", 1, 1), fsync=False)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--tensors", type=int, default=300)
    p.add_argument("--small-files", type=int, default=4, help="dump files of the small memory run")
    p.add_argument("--big-files", type=int, default=64, help="dump files of the big memory run")
    p.add_argument("--reps", type=int, default=3, help="fresh processes per timing")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--long", type=int, metavar="STEPS", help="only the long-run table: STEPS and STEPS/10 steps")
    p.add_argument("--measure", nargs="+", metavar="DIR", help="only the long-run columns, for these existing runs")
    p.add_argument("--scale", action="store_true",
                   help="only info on runs of many files (10,000 parts; 100,000 dumps; 20,000 sessions) and one "
                        "tensor of a 10M-row part, compacted and without an index in both formats (--quick: a tenth)")
    cases = ["live", "parts", "dumps", "uncompacted", "sessions", "big", "unindexed"]
    p.add_argument("--scale-cases", nargs="+", default=cases, choices=cases,
                   help="which --scale measures to make")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(CHILDREN[args.child[0]](args.child[1])))
        return
    if args.measure:
        return measure_runs(args)
    if args.long:
        return long_runs(args)
    if args.scale:
        return scale_runs(args)
    if args.quick:
        args.steps, args.tensors, args.small_files, args.big_files, args.reps = 50, 30, 1, 2, 1
    from inspector.testing import make_synthetic_run
    root = Path(tempfile.mkdtemp(prefix="bench_reader_"))
    try:
        with tqdm(total=4, desc="writing runs", file=sys.stderr) as bar:
            t = time.perf_counter()
            stats_run = make_synthetic_run(root / "stats", steps=args.steps, tensors=args.tensors, dump_every=None)
            t_write = time.perf_counter() - t
            bar.update()
            dump_run = make_synthetic_run(root / "dumps", steps=200, tensors=args.tensors, dump_every=10)
            bar.update()
            small_bytes = sparse_run(root / "mem-small", args.small_files)
            bar.update()
            big_bytes = sparse_run(root / "mem-big", args.big_files)
            bar.update()
            crc_s = crc_run(root / "crc")
        reps = [child("stats", stats_run) for _ in tqdm(range(args.reps), desc="stats queries", file=sys.stderr)]
        dumps = [child("dump", dump_run) for _ in range(args.reps)]
        mem = {k: child("mem", root / k) for k in tqdm(("mem-small", "mem-big"), desc="memory", file=sys.stderr)}
        verify = {k: statistics.median(child(k, root / "crc")["read_ms"] for _ in range(max(args.reps, 3)))
                  for k in ("verify", "noverify")}
        med = {k: statistics.median(r[k] for r in reps) for k in ("import", "open", "first_query", "all_stats")}
        rows = [
            [f"open run ({args.steps} steps x {args.tensors} tensors, {reps[0]['rows']:,} stats rows)",
             f"{1e3 * med['open']:.0f} ms", ""],
            ["first query_stats (1 tensor, all steps)", f"{1e3 * med['first_query']:.0f} ms", ""],
            ["open + first query", f"{1e3 * (med['open'] + med['first_query']):.0f} ms", "< 1000 ms"],
            ["whole statistics table (run.stats)", f"{1e3 * med['all_stats']:.0f} ms", ""],
            ["import inspector (once per process)", f"{1e3 * med['import']:.0f} ms", ""],
            [f"one dumped tensor {dumps[0]['shape']} into memory (median)",
             f"{statistics.median(d['read_ms'] for d in dumps):.2f} ms", "< 20 ms"],
            ["  first read of a process (header parse)",
             f"{statistics.median(d['first_ms'] for d in dumps):.2f} ms", ""],
            [f"CRC32s of a {human_bytes(11 * 2 ** 22 + TENSOR_MB * 2 ** 20)} dump (writer's dump thread)",
             f"{1e3 * crc_s:.1f} ms", ""],
            [f"one {TENSOR_MB} MiB tensor of it into memory, verify=True (CRC32 checked)",
             f"{verify['verify']:.2f} ms", ""],
            ["  the same, verify=False", f"{verify['noverify']:.2f} ms", ""],
        ]
        mrows = [[k, mem[k]["files"], human_bytes(b), human_bytes(1024 * mem[k]["base_kib"]),
                  human_bytes(1024 * mem[k]["peak_kib"])]
                 for k, b in (("mem-small", small_bytes), ("mem-big", big_bytes))]
        growth = (mem["mem-big"]["peak_kib"] - mem["mem-small"]["peak_kib"]) * 1024
        print(f"statistics run: {human_bytes(du_bytes(stats_run))} on disk, written in {t_write:.1f} s\n")
        print(format_table(rows, ["measure", "time", "target"]))
        print()
        print(format_table(mrows, ["run", "dump files", "dump bytes", "RSS after import", "peak RSS"]))
        print(f"\npeak RSS growth from {human_bytes(small_bytes)} to {human_bytes(big_bytes)} of dumps: "
              f"{human_bytes(growth)} (reading one {TENSOR_MB} MiB tensor from every file)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
