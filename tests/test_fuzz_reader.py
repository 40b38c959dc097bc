"""Fuzzing the reader (issue 11): seeded mutations of a real run, each read in full.

A run is written with the TF-free writer; then each mutation (byte flips, truncations,
insertions, overwrites; special files and links; edits of the dump header's JSON, the
manifest's fields and the statistics parts' schema) is applied to one file, the whole run is
read (manifest, catalog, statistics, a filtered query, every dump key, samples, graph), and
the file restored. Each read must give the original data, or an InspectorError that names
the mutated file (raised, or listed in ``run.problems``), within a time limit and bounded
memory. Every third mutation is also read with ``verify=False``: its data may then differ,
but no other exception, hang or crash may occur. Mutations run in child processes, in batches (a hang or a fatal signal shows as a
failed batch, not a stuck pytest).

What may differ without an error, by design (tallied, not failures): fields of a mutated
manifest (a JSON text without a checksum: only its types are checked), and a dump header
edited *and* stripped of its ``header_crc32`` (a valid file that says something else).

Run alone: ``python tests/test_fuzz_reader.py [mutations] [seed]`` prints the tallies.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

MUTATIONS = 300
BATCHES = 4
SEED = 11
TIME_LIMIT_S = 20          # per mutation, in the child (SIGALRM)
RSS_LIMIT_KIB = 1_500_000  # peak RSS of a child
GRAPH = b"\x0a\x05\x0a\x01a\x12\x00" * 40  # opaque bytes: the reader does not parse the graph
ALIAS = {"forward/b:0": "gradient/a:0"}


# ---- the run --------------------------------------------------------------------------------
def build_run(path: Path) -> Path:
    """Two statistics parts, three dumps (one alias each, samples with labels), a graph."""
    from inspector.format.loghist import sparse_of
    from inspector.writer import RunWriter, StatsLayout
    lay = StatsLayout(("a:0", "a:0", "b:0"), ("forward", "gradient", "forward"), ("all", "all", "all"))
    catalog = [{"name": n, "op": n[:-2], "op_type": "Relu", "dtype": "float32", "shape": [None, 3], "scope": "",
                "has_gradient": n == "a:0", "batched": True, "icnn_layer": None, "icnn_role": None}
               for n in ("a:0", "b:0")]
    w = RunWriter(path, manifest={"tensors": catalog, "loss": "loss:0", "skipped": ["x:0"]}, stats_layout=lay,
                  graph_def=GRAPH, stats_flush_secs=0.0)  # a part per step
    rng = np.random.default_rng(0)
    for s in range(1, 5):
        w.add_stats(s, rng.normal(size=(3, 9)), sparse_of([rng.normal(size=9) for _ in range(3)]))
    for s in (2, 4, 6):
        a = rng.normal(size=(4, 3)).astype(np.float32)
        w.add_dump(s, {"forward/a:0": a, "gradient/a:0": a * -2, "samples/index": np.array([0, 2, 5, 7], np.int32),
                       "samples/group": np.array([1, 0, 0, 1], np.int32),
                       "samples/label": np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [1.0, 0.0]], np.float32)},
                   {"aliases": json.dumps(ALIAS)})
    w.record_drop(8, "byte budget", 123)
    w.close()
    return path


def run_files(run_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file())


def kind_of(rel: str) -> str:
    return "manifest" if rel.startswith("manifest.") else "graph" if rel.startswith("graph.") else \
        "stats" if rel.startswith("stats/") else "summary" if rel.startswith("summary/") else "dump"


# ---- reading everything ---------------------------------------------------------------------
def _canon_df(df) -> str:
    return df.astype(str).to_csv()


def _canon_arr(a) -> str:
    a = np.asarray(a)
    return f"{a.dtype.str}{a.shape}{hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]}"


def read_all(run_dir: Path, steps: list[int], keys: dict[int, list[str]], verify: bool = True) -> dict:
    """{component: ("ok", value) | ("error", type, message)}; 'problems': run.problems. An
    exception other than InspectorError propagates."""
    import inspector
    out: dict = {}

    def part(name, fn):
        try:
            out[name] = ("ok", fn())
        except inspector.InspectorError as e:
            out[name] = ("error", type(e).__name__, str(e))

    try:
        run = inspector.open_run(run_dir, verify=verify)
    except inspector.InspectorError as e:
        return {"open": ("error", type(e).__name__, str(e))}
    out["open"] = ("ok", run.workers)
    part("catalog", lambda: _canon_df(run.tensors))
    part("status", lambda: run.status)
    part("dropped", lambda: _canon_df(run.dropped))
    part("config", lambda: json.dumps(run.config, sort_keys=True))
    part("skipped", lambda: json.dumps([m.get("skipped") for m in run.manifests.values()]))
    part("stats", lambda: _canon_df(run.stats))
    part("query", lambda: _canon_df(run.query_stats(["a:0"], steps=(2, 5), kinds=["gradient"], columns=["mean"])))
    part("histogram", lambda: [x.tolist() for x in run.histogram("b:0", 3)])
    part("graph", lambda: hashlib.sha256(run.graph_def_bytes()).hexdigest())
    part("steps", lambda: run.steps)
    for step in steps:
        part(f"keys/{step}", lambda: sorted(run.dump_keys(step)))
        for key in keys[step]:
            part(f"dump/{step}/{key}", lambda: _canon_arr(run.dump_array(step, key)))
        part(f"samples/{step}", lambda: _canon_df(run.samples(step)))
        part(f"tensor/{step}", lambda: _canon_arr(run.tensor("b:0", step)))
    out["problems"] = list(run.problems)
    return out


# ---- mutations ------------------------------------------------------------------------------
def _header_split(data: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def _header_join(header: dict, rest: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + rest


JUNK = [None, True, -1, 0, 1, 2 ** 31, 2 ** 64, 1.5, "", "x", [], [1], [-1, 2], {}, {"a": 1}, "F32", [0, 0],
        [2 ** 62, 2 ** 62], "[]", "{}", '{"a": "b"}', "[" * 50]


def _edit_header(header: dict, rng: random.Random) -> str:
    """Edit one thing of a dump header in place; returns what."""
    keys = [k for k in header if k != "__metadata__"]
    key = rng.choice(keys)
    meta = header.setdefault("__metadata__", {})
    edit = rng.choice(["dtype", "shape", "dim", "offsets", "offset", "drop", "add", "junk", "meta", "alias",
                       "crc", "swap"])
    if edit == "dtype":
        header[key]["dtype"] = rng.choice(["F16", "F32", "F64", "I32", "U32", "I64", "U8", "BOOL", "BF16", "X", 4])
    elif edit == "shape":
        header[key]["shape"] = rng.choice([list(reversed(header[key]["shape"])), [], [0], JUNK[rng.randrange(len(JUNK))]])
    elif edit == "dim" and header[key]["shape"]:
        i = rng.randrange(len(header[key]["shape"]))
        header[key]["shape"][i] = rng.choice([0, 1, -1, True, 2.0, 2 ** 63, header[key]["shape"][i] + 1])
    elif edit == "offsets":
        header[key]["data_offsets"] = rng.choice(JUNK)
    elif edit == "offset":
        i = rng.randrange(2)
        header[key]["data_offsets"][i] += rng.choice([-8, -4, -1, 1, 4, 8, 2 ** 40])
    elif edit == "drop":
        del header[key]
    elif edit == "add":
        header[rng.choice(["new", key + "x", "__metadata__x"])] = {"dtype": "F32", "shape": [1],
                                                                   "data_offsets": rng.choice([[0, 4], [4, 8]])}
    elif edit == "junk":
        header[key] = rng.choice(JUNK)
    elif edit == "meta":
        header["__metadata__"] = rng.choice(JUNK + [{"step": 3}])
    elif edit == "alias":
        meta["aliases"] = json.dumps(rng.choice([{"forward/b:0": "gone"}, {key: keys[0]}, {"x": "y", "y": "x"},
                                                 {"x": "x"}, {"x": 1}, [], {"forward/b:0": "__metadata__"}]))
    elif edit == "crc":
        crcs = json.loads(meta.get("crc32", "{}"))
        crcs[key] = rng.choice([0, -1, 2 ** 32, "1", None, (crcs.get(key, 0) + 1) % 2 ** 32])
        meta["crc32"] = json.dumps(crcs)
    elif edit == "swap" and len(keys) > 1:
        other = rng.choice([k for k in keys if k != key])
        header[key]["data_offsets"], header[other]["data_offsets"] = header[other]["data_offsets"], header[key]["data_offsets"]
    return f"header:{edit}:{key}"


MANIFEST_FIELDS = ["tensors", "dropped", "skipped", "pid", "first_nonfinite", "config", "status", "worker",
                   "heartbeat_secs", "updated", "host", "format_version", "format", "is_chief", "bytes_written"]


def _edit_manifest(m: dict, rng: random.Random) -> str:
    field = rng.choice(MANIFEST_FIELDS + ["tensors[0]", "tensors[0].name", "tensors[0].shape", "dropped[0]"])
    value = rng.choice(JUNK)
    if field == "tensors[0]":
        m["tensors"][0] = value
    elif field.startswith("tensors[0]."):
        m["tensors"][0][field.split(".")[1]] = value
    elif field == "dropped[0]":
        m["dropped"][0] = value
    elif rng.random() < 0.15:
        m.pop(field, None)
        return f"manifest:del:{field}"
    else:
        m[field] = value
    return f"manifest:{field}={str(value)[:20]}"


def _foreign_parquet(path: Path, rng: random.Random) -> str:
    t = pq.read_table(path)
    choice = rng.choice(["foreign", "cast", "drop", "rename"])
    if choice == "foreign":
        t = pa.table({"x": [1, 2, 3]})
    elif choice == "cast":
        name = rng.choice(["step", "mean", "count", "tensor", "hist_bucket"])
        i = t.schema.get_field_index(name)
        t = t.set_column(i, name, pa.array([str(v) for v in t.column(name).to_pylist()]))
    elif choice == "drop":
        t = t.drop_columns([rng.choice(["step", "tensor", "group"])])
    else:
        t = t.rename_columns([("kind" if c == "group" else "group" if c == "kind" else c) for c in t.column_names])
    pq.write_table(t, path)
    return f"parquet:{choice}"


def _bytes_edit(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    n = len(data)
    edit = rng.choice(["flip", "flip", "flip", "truncate", "insert", "overwrite", "append", "empty"])
    if edit == "flip":
        out = bytearray(data)
        for _ in range(rng.choice([1, 1, 2, 4])):
            out[rng.randrange(n)] ^= 1 << rng.randrange(8)
        return bytes(out), edit
    if edit == "truncate":
        return data[:rng.choice([rng.randrange(n), 7, 8, n - 1, n // 2])], edit
    if edit == "insert":
        at = rng.randrange(n + 1)
        return data[:at] + rng.randbytes(rng.randint(1, 16)) + data[at:], edit
    if edit == "overwrite":
        at = rng.randrange(n)
        k = min(rng.randint(1, 64), n - at)
        return data[:at] + rng.randbytes(k) + data[at + k:], edit
    if edit == "append":
        return data + rng.randbytes(rng.randint(1, 64)), edit
    return b"", edit


def mutate(run_dir: Path, outside: Path, rel: str, rng: random.Random) -> tuple[str, bool]:
    """Mutate file ``rel`` of ``run_dir``; returns (description, forged: a valid file saying something else)."""
    path, kind = run_dir / rel, kind_of(rel)
    data = path.read_bytes()
    special = rng.random() < 0.06 or kind == "graph"
    if special:
        what = rng.choice(["fifo", "link-out", "link-dev", "dir"])
        path.unlink()
        if what == "fifo":
            os.mkfifo(path)
        elif what == "link-out":
            (outside / path.name).write_bytes(data)
            path.symlink_to(outside / path.name)
        elif what == "link-dev":
            path.symlink_to("/dev/zero")
        else:
            path.mkdir()
        return f"special:{what}", False
    if rng.random() < 0.45:  # structure-aware
        if kind == "dump":
            header, rest = _header_split(data)
            what = _edit_header(header, rng)
            meta = header.get("__metadata__")
            forged = rng.random() < 0.5 and isinstance(meta, dict)
            if forged:
                meta.pop("header_crc32", None)
                what += ":crc-stripped"
            elif isinstance(meta, dict) and "header_crc32" not in meta:
                forged = True  # the edit replaced the metadata: checksums gone, like an older file
                what += ":crc-gone"
            path.write_bytes(_header_join(header, rest))
            return what, forged
        if kind == "manifest":
            m = json.loads(data)
            what = _edit_manifest(m, rng)
            path.write_text(json.dumps(m))
            return what, False
        if kind == "stats":
            return _foreign_parquet(path, rng), False
    out, what = _bytes_edit(data, rng)  # (summaries: bytes only; no read here may change)
    path.write_bytes(out)
    return f"bytes:{what}", False


def restore(path: Path, data: bytes) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.write_bytes(data)


# ---- judging ------------------------------------------------------------------------------
MANIFEST_PARTS = {"catalog", "status", "dropped", "config", "skipped"}
#: parts that show a manifest field too: run.samples names each sample's group from ``groups``
MANIFEST_PREFIXES = ("samples/",)


def judge(truth: dict, got: dict, rel: str, forged: bool) -> tuple[str, str]:
    """('ok' | 'named' | 'tolerated' | 'bad', detail)."""
    name = Path(rel).name
    problems = got.get("problems", [])
    listed = any(name in p for p in problems)
    verdict = "ok"
    for part, want in truth.items():
        if part == "problems" or part not in got:
            continue
        have = got[part]
        if have == want:
            continue
        if have[0] == "error" and name in have[2]:
            verdict = "named" if verdict == "ok" else verdict
        elif have[0] == "ok" and part in ("stats", "query", "histogram") and listed:
            verdict = "named" if verdict == "ok" else verdict  # the part was skipped, and listed
        elif have[0] == "error" and have[1] == "NoDumpError" and part.startswith("histogram") and listed:
            verdict = "named" if verdict == "ok" else verdict
        elif kind_of(rel) == "manifest" and (part in MANIFEST_PARTS or part.startswith(MANIFEST_PREFIXES)
                                             or have[0] == "error"):
            verdict = "tolerated"  # no checksum on the manifest: other values, or errors they cause
        elif forged:
            verdict = "tolerated"
        else:
            return "bad", f"{part}: want {str(want)[:120]} got {str(have)[:300]}"
    if verdict == "ok" and problems and not listed:
        return "bad", f"problems name other files: {problems}"
    return verdict, ""


# ---- the child ------------------------------------------------------------------------------
def peak_rss_kib() -> int:
    """This process's peak RSS since its exec: /proc's VmHWM (ru_maxrss also counts the forked
    parent's pages before the exec, gigabytes under a pytest-xdist worker)."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _alarm(signum, frame):
    raise TimeoutError(f"no result within {TIME_LIMIT_S} s")


def child(run_dir: Path, start: int, stop: int, seed: int) -> list[dict]:
    signal.signal(signal.SIGALRM, _alarm)
    import inspector
    pristine = inspector.open_run(run_dir)
    steps = pristine.steps
    keys = {s: sorted(pristine.dump_keys(s)) for s in steps}
    truth = read_all(run_dir, steps, keys)
    assert not truth["problems"] and all(v[0] == "ok" for k, v in truth.items() if k != "problems"), truth
    files = run_files(run_dir)
    outside = Path(tempfile.mkdtemp(prefix="fuzz_outside_"))
    results = []
    for i in range(start, stop):
        rng = random.Random(seed * 1_000_003 + i)
        kind = rng.choice(["manifest"] * 5 + ["dump"] * 8 + ["stats"] * 6 + ["graph"] + ["summary"] * 2)
        rel = rng.choice([f for f in files if kind_of(f) == kind])
        original = (run_dir / rel).read_bytes()
        what, forged = mutate(run_dir, outside, rel, rng)
        row = {"i": i, "file": rel, "kind": kind_of(rel), "what": what}
        print(f"mutation {i}: {rel} {what}", file=sys.stderr, flush=True)  # names the culprit of a crash
        signal.alarm(TIME_LIMIT_S)
        try:
            row["verdict"], row["detail"] = judge(truth, read_all(run_dir, steps, keys), rel, forged)
            if i % 3 == 0:  # without checksums data may differ, but nothing else may go wrong
                read_all(run_dir, steps, keys, verify=False)
        except TimeoutError as e:
            row["verdict"], row["detail"] = "bad", f"hang: {e}"
        except Exception as e:  # noqa: BLE001 - any other exception type is the failure we look for
            row["verdict"], row["detail"] = "bad", f"{type(e).__name__}: {e} | {traceback.format_exc(limit=-3)[-600:]}"
        finally:
            signal.alarm(0)
        restore(run_dir / rel, original)
        row["rss_kib"] = peak_rss_kib()
        results.append(row)
    shutil.rmtree(outside, ignore_errors=True)
    return results


def run_fuzz(tmp: Path, mutations: int = MUTATIONS, seed: int = SEED, batches: int = BATCHES) -> list[dict]:
    """Build a run, then mutate it in ``batches`` child processes (two at a time), each on its own copy."""
    base = build_run(tmp / "base")
    edges = np.linspace(0, mutations, batches + 1).astype(int)
    procs = []
    for b in range(batches):
        copy = tmp / f"run{b}"
        shutil.copytree(base, copy, symlinks=True)
        procs.append((copy, [sys.executable, __file__, "--child", str(copy), str(edges[b]), str(edges[b + 1]),
                             str(seed)]))
    results: list[dict] = []
    for j in range(0, len(procs), 2):
        running = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for _, cmd in procs[j:j + 2]]
        for p in running:
            out, err = p.communicate(timeout=300)
            if p.returncode != 0:
                raise AssertionError(f"fuzz child exited with {p.returncode} (negative: a signal)\n{err[-3000:]}")
            results += json.loads(out.strip().splitlines()[-1])
    return results


def tallies(results: list[dict]) -> str:
    by_verdict = Counter(r["verdict"] for r in results)
    by_kind = Counter((r["kind"], r["verdict"]) for r in results)
    lines = [f"{len(results)} mutations: " + ", ".join(f"{k} {v}" for k, v in sorted(by_verdict.items()))]
    for kind in sorted({r["kind"] for r in results}):
        lines.append(f"  {kind:9s} " + ", ".join(f"{v} {by_kind[(kind, v)]}" for v in ("ok", "named", "tolerated", "bad")
                                                 if by_kind[(kind, v)]))
    lines.append(f"  peak RSS of a child: {max(r['rss_kib'] for r in results) / 1024:.0f} MiB")
    return "\n".join(lines)


def test_fuzz_reader(tmp_path, capsys):
    t = time.perf_counter()
    results = run_fuzz(tmp_path)
    with capsys.disabled():
        print(f"\n{tallies(results)}\n  {time.perf_counter() - t:.1f} s")
    bad = [r for r in results if r["verdict"] == "bad"]
    assert not bad, "\n".join(f"#{r['i']} {r['file']} {r['what']}: {r['detail']}" for r in bad[:10])
    assert max(r["rss_kib"] for r in results) < RSS_LIMIT_KIB
    assert sum(r["verdict"] == "named" for r in results) > len(results) // 4  # the mutations do damage


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))))
    else:
        with tempfile.TemporaryDirectory() as d:
            res = run_fuzz(Path(d), *(int(a) for a in sys.argv[1:3]))
            print(tallies(res))
            for r in res:
                if r["verdict"] in ("bad", "tolerated"):
                    print(f"{r['verdict']} #{r['i']} {r['file']} {r['what']}: {r['detail']}")
