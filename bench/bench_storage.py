"""Local disk beside an S3 server: dump write throughput and a reader's open / first query /
one tensor, printed side by side.

Run::

    .venv/bin/python bench/bench_storage.py            # 8, 64 MiB dumps; 256 MiB peak memory; 300 x 100 run
    .venv/bin/python bench/bench_storage.py --quick    # smoke run

Method. The S3 server is moto in server mode (``python -m moto.server``) in its own process on
a free local port, reached by s3fs over HTTP exactly as a bucket is; so the S3 column measures
the project's code plus a local HTTP round trip and moto's own speed (an in-memory store in
Python), not a real bucket's bandwidth or latency: read it as an upper bound on the cost of
going through fsspec, and the request counts as what a real bucket would serve.

- Write: one dump (random float32 arrays in 4 MiB tensors, checksummed as the writer does) is
  encoded, then written ``--repeats`` times by the storage the writer uses
  (``Storage.write``: on disk a temporary file, fallocate, rename, no fsync, the writer's
  default; on S3 one PUT below one part (16 MiB), else a multipart upload streamed part by
  part), median MB/s per dump.
- Read: the same synthetic run (``make_synthetic_run``, the project's writer) on disk and in
  the bucket; each measurement in a fresh process (nothing cached): ``open_run``, the first
  ``query_stats`` of one tensor (two columns), one dumped tensor (the header is read first).
- Memory: one ``--large`` MiB dump (256 by default) written once under ``tracemalloc``: the
  peak of memory allocated beyond the dump's own arrays (Python objects and numpy buffers;
  the moto server runs in its own process, so its copy is not counted). On S3 the file is
  streamed as a multipart upload in 16 MiB parts (``storage.PART_SIZE``); the row "before
  streaming" sends the same dump the way the writer did before (one joined buffer, then
  ``pipe_file``), for comparison.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # first: imports below (noqa: E402) from this checkout

import numpy as np  # noqa: E402

from bench.common import format_table, human_bytes  # noqa: E402

BUCKET = "bench"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server() -> tuple[subprocess.Popen, dict]:
    """moto's S3 in its own process; returns it and the storage options that reach it."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    else:
        proc.kill()
        raise RuntimeError("the moto server did not start")
    options = {"endpoint_url": f"http://127.0.0.1:{port}", "key": "bench", "secret": "bench",
               "client_kwargs": {"region_name": "eu-west-1"}}
    import s3fs
    s3fs.S3FileSystem(skip_instance_cache=True, **options).mkdir(BUCKET)
    return proc, options


# ---- children (fresh processes) -------------------------------------------------------------
def _child_read(path: str, options: dict | None) -> dict:
    t0 = time.perf_counter()
    import inspector
    if options is not None:
        import s3fs  # noqa: F401 - timed on its own: a one-off per process
    t_import = time.perf_counter()
    run = inspector.open_run(path, storage_options=options)
    t_open = time.perf_counter()
    name = run.tensors.index[len(run.tensors) // 2]
    df = run.query_stats([name], kinds=["forward"], groups=["all"], columns=["mean", "std"])
    t_query = time.perf_counter()
    step = run.steps[-1]
    names = [k.split("/", 1)[1] for k in run.dump_keys(step) if k.startswith("forward/")]
    t_keys = time.perf_counter()
    times, sizes = [], []
    for name in names[:6]:  # the first, then five more: one range request each
        t = time.perf_counter()
        x = np.asarray(run.tensor(name, step))
        times.append(time.perf_counter() - t)
        sizes.append(x.nbytes)
    assert len(df) > 0
    t = time.perf_counter()
    inspector.open_run(path, storage_options=options)
    t_again = time.perf_counter() - t
    return {"import": t_import - t0, "open": t_open - t_import, "again": t_again, "first_query": t_query - t_open,
            "header": t_keys - t_query, "tensor": times[0], "next": statistics.median(times[1:]),
            "tensor_bytes": int(statistics.median(sizes))}


def child_read(path: str, options: dict | None) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", path, json.dumps(options)], capture_output=True,
                         text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---- measurements ---------------------------------------------------------------------------
def write_rate(store, mib: int, repeats: int) -> float:
    """Median MB/s of writing one ``mib`` MiB dump through ``store`` (``Storage.write``)."""
    from inspector.dumps.files import Encoded
    rng = np.random.default_rng(0)
    arrays = {f"forward/t{i}:0": rng.random((1024, 1024), np.float32) for i in range(max(1, mib // 4))}
    enc = Encoded(arrays, {"step": "1"})
    enc.final_header()  # checksums are the dump thread's work either way: not timed here
    store.write("dumps/warm-up.safetensors", enc.chunks(), size=enc.size)  # a connection, a folder: not timed
    times = []
    for i in range(repeats):
        t = time.perf_counter()
        n = store.write(f"dumps/chief.s0001.step-{i:010d}.safetensors", enc.chunks(), size=enc.size)
        times.append(time.perf_counter() - t)
    return n / 1e6 / statistics.median(times)


def _dump(mib: int):
    from inspector.dumps.files import Encoded
    rng = np.random.default_rng(0)
    arrays = {f"forward/t{i}:0": rng.random((1024, 1024), np.float32) for i in range(max(1, mib // 4))}
    enc = Encoded(arrays, {"step": "1"})
    enc.final_header()
    return enc


def write_peak(store, mib: int, whole: bool = False) -> tuple[float, float]:
    """(peak bytes allocated beyond the dump's own arrays, seconds) while writing one ``mib``
    MiB dump through ``store`` (tracemalloc: Python objects and numpy buffers); ``whole``:
    the way before streaming, the file joined into one buffer, then sent (``pipe_file``)."""
    import tracemalloc
    enc = _dump(mib)
    store.write("dumps/warm-up.safetensors", [b"x"])  # a connection: not measured
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        t = time.perf_counter()
        if whole:
            store.fs.pipe_file(store._abs("dumps/whole.safetensors"), b"".join(enc.chunks()))
        else:
            store.write("dumps/streamed.safetensors", enc.chunks(), size=enc.size)
        elapsed = time.perf_counter() - t
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return peak, elapsed


def remote_query_bytes(options: dict, steps: int, tensors: int) -> list[tuple]:
    """Bytes one tensor's ``query_stats`` fetches from the bucket (one column; every column),
    against the run's bytes, with the compacted part's per-tensor row-group index and without
    it (the reader before it used the index remotely), side by side in this process. The run
    is written as training writes one: a part per flush, compacted into one at close."""
    import s3fs

    import inspector
    from inspector.stats import schema as stats_schema
    from inspector.testing import SyntheticRun

    class Counting(s3fs.S3FileSystem):
        got = 0

        async def _cat_file(self, path, version_id=None, start=None, end=None, **kwargs):
            data = await super()._cat_file(path, version_id=version_id, start=start, end=end, **kwargs)
            Counting.got += len(data)
            return data

    url = f"s3://{BUCKET}/index"
    b = SyntheticRun(url, tensors, steps_hint=steps, dump_every=steps // 2, stats_flush_secs=0, storage_options=options)
    for a in range(0, steps, max(1, steps // 10)):
        b.write_steps(a, min(steps, a + max(1, steps // 10)))
        b.sync(300)
    b.close()
    fs = Counting(skip_instance_cache=True, **options)
    total = sum(fs.du(url, total=False).values())
    indexed = stats_schema._indexed
    rows = []
    for cols, what in ((["mean"], "one column"), (None, "every column")):
        got = {}
        for label, use in (("index", indexed), ("whole row groups", lambda *a: None)):
            stats_schema._indexed = use
            try:
                run = inspector.open_run(url, filesystem=fs)
                Counting.got = 0
                run.query_stats([run.tensors.index[tensors // 2]], columns=cols)
                got[label] = Counting.got
            finally:
                stats_schema._indexed = indexed
        rows.append((f"one tensor's statistics, {what}: bytes fetched", "-",
                     f"{human_bytes(got['index'])} = {100 * got['index'] / total:.1f}% of the run "
                     f"(without the index {human_bytes(got['whole row groups'])} = "
                     f"{100 * got['whole row groups'] / total:.1f}%)", "-"))
    rows.append((f"  run: {steps} steps x {tensors} tensors, one compacted part", "-", human_bytes(total), "-"))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, one repeat each")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--large", type=int, default=256, help="MiB of the dump whose write's peak memory is measured")
    ap.add_argument("--query-bytes", nargs=2, type=int, metavar=("STEPS", "TENSORS"),
                    help="only the bytes one tensor's statistics fetch from S3, on a run of this size "
                         "(byte counts, not timings: meaningful on a busy machine too)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child_read(args.child[0], json.loads(args.child[1]))))
        return
    if args.query_bytes:
        proc, options = start_server()
        try:
            rows = remote_query_bytes(options, *args.query_bytes)
            print(format_table(rows, ["measure", "local disk", "S3 (moto)", "-"]))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        return
    from inspector.storage import FsspecStorage, LocalStorage
    from inspector.testing import make_synthetic_run
    sizes = [8] if args.quick else [8, 64]
    repeats = 1 if args.quick else args.repeats
    steps, tensors = (20, 30) if args.quick else (300, 100)
    proc, options = start_server()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-storage-") as tmp:
            rows = []
            for mib in sizes:
                local = write_rate(LocalStorage(Path(tmp) / f"w{mib}"), mib, repeats)
                remote = write_rate(FsspecStorage(f"s3://{BUCKET}/w{mib}", options), mib, repeats)
                rows.append((f"write one {mib} MiB dump (MB/s)", f"{local:.0f}", f"{remote:.0f}",
                             f"{local / remote:.1f}"))
            large = 32 if args.quick else args.large
            local_peak, local_t = write_peak(LocalStorage(Path(tmp) / "big"), large)
            remote_peak, remote_t = write_peak(FsspecStorage(f"s3://{BUCKET}/big", options), large)
            whole_peak, whole_t = write_peak(FsspecStorage(f"s3://{BUCKET}/big", options), large, whole=True)
            rows.append((f"write one {large} MiB dump: peak extra memory", human_bytes(local_peak),
                         human_bytes(remote_peak), f"{remote_peak / max(local_peak, 1):.0f}"))
            rows.append(("  the same, S3 before streaming (joined, then sent)", "-", human_bytes(whole_peak),
                         f"{whole_peak / max(local_peak, 1):.0f}"))
            rows.append((f"write one {large} MiB dump under tracemalloc (MB/s)", f"{large * 1.048576 / local_t:.0f}",
                         f"{large * 1.048576 / remote_t:.0f} (before: {large * 1.048576 / whole_t:.0f})",
                         f"{remote_t / local_t:.1f}"))
            kw = dict(steps=steps, tensors=tensors, dump_every=steps // 2)
            make_synthetic_run(Path(tmp) / "run", **kw)
            make_synthetic_run(f"s3://{BUCKET}/run", storage_options=options, **kw)
            size = sum(f.stat().st_size for f in (Path(tmp) / "run").rglob("*") if f.is_file())
            a = child_read(str(Path(tmp) / "run"), None)
            b = child_read(f"s3://{BUCKET}/run", options)
            rows.append(("import s3fs (once per process) (ms)", "-", f"{1e3 * b['import']:.0f}", "-"))
            rows += remote_query_bytes(options, steps, tensors)
            for key, label in (("open", "open_run, a new S3 client included (ms)"),
                               ("again", "open_run again, same process (ms)"),
                               ("first_query", "first query, one tensor (ms)"),
                               ("header", "a dump's header (ms)"),
                               ("tensor", f"first tensor, {human_bytes(a['tensor_bytes'])} (ms)"),
                               ("next", "next tensors, median (ms)")):
                rows.append((label, f"{1e3 * a[key]:.1f}", f"{1e3 * b[key]:.1f}", f"{b[key] / a[key]:.1f}"))
    finally:
        proc.terminate()
        proc.wait(10)
    print(f"run read: {steps} steps x {tensors} tensors, {human_bytes(size)}; S3 = moto server on this machine "
          f"over HTTP (s3fs); {os.cpu_count()} CPUs")
    print(format_table(rows, ["measure", "local disk", "S3 (moto)", "S3 time / local time"]))


if __name__ == "__main__":
    main()
