"""The lazy reader of a run directory.

Opening a run reads the manifests only; statistics load on first use; a dumped tensor is
read from its safetensors file when asked for (memory-mapped beyond 64 MiB), its CRC32
checked once. Damaged files are named in ``run.problems`` and skipped; the rest of the run
stays readable.

Example::

    import inspector
    run = inspector.open_run("runs/exp1")
    run.tensors                                     # catalog (DataFrame)
    run.stats                                       # statistics (DataFrame)
    run.steps                                       # steps with full dumps
    g = run.tensor("conv2/Relu:0", step=200, kind="gradient")   # numpy
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import re
import socket
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from . import safe_files, safetensors_io
from .dump_schema import check_samples
from .errors import (DamagedFileError, FormatVersionError, NoDumpError, NotARunError, UnknownTensorError,
                     nearest, suggest)
from .format import (ALIASES_KEY, DUMP_RE, FORMAT_NAME, FORMAT_VERSION, GROUPS, KINDS, MANIFEST_RE,
                     STALE_HEARTBEATS, STATS_RE, graph_name, safe_join)
from .manifest_schema import load_manifest
from .stats_schema import check_stats_file, read_part

CATALOG_COLUMNS = ("name", "op", "op_type", "dtype", "shape", "scope", "has_gradient", "batched",
                   "icnn_layer", "icnn_role")


def is_run(path: str | Path) -> bool:
    """True if ``path`` is a run directory (holds at least one worker manifest)."""
    p = Path(path)
    return p.is_dir() and any(MANIFEST_RE.match(c.name) for c in p.iterdir())


def find_runs(path: str | Path) -> list[Path]:
    """``path`` itself if it is a run, else the runs directly inside it (sorted)."""
    p = Path(path)
    if not p.exists():
        raise NotARunError(f"{p} does not exist; give a run directory or a folder of runs")
    if is_run(p):
        return [p]
    return sorted(c for c in p.iterdir() if c.is_dir() and is_run(c))


def open_run(path: str | Path, verify: bool = True) -> "Run":
    """Open the run at ``path`` (reads its manifests only). ``verify=False`` skips the
    checksums of dumped arrays and statistics pages (faster; see FORMAT.md)."""
    return Run(path, verify=verify)


def worker_status(manifest: dict, now: float | None = None) -> str:
    """One worker's state from its manifest: its ``status``, or for a 'running' worker whose
    writer is gone, 'crashed' (same host, process not alive) or 'stalled' (heartbeat late)."""
    status = manifest.get("status", "running")
    if status != "running":
        return status
    pid, host = manifest.get("pid"), manifest.get("host")
    if isinstance(pid, int) and host == socket.gethostname() and not _alive(pid):
        return "crashed"
    beat = manifest.get("heartbeat_secs")
    try:
        updated = _dt.datetime.fromisoformat(manifest["updated"]).timestamp()
    except (KeyError, TypeError, ValueError):
        return status
    if isinstance(beat, (int, float)) and beat > 0:
        # at least 10 s: `updated` has whole seconds, and clocks of two hosts differ a little
        if (now if now is not None else time.time()) - updated > max(STALE_HEARTBEATS * beat, 10.0):
            return "stalled"
    return status


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # another user's process, or cannot tell: do not call it crashed
    return True



def _aliases(path: Path, header: dict) -> dict[str, str]:
    """{alias key: stored key} from a dump header's metadata; DamagedFileError if they dangle."""
    try:
        return safetensors_io.aliases(header)  # checked by read_header already
    except ValueError as e:
        raise DamagedFileError(f"damaged dump file {path}: {e}") from None

@dataclass(frozen=True)
class DumpFile:
    worker: str
    step: int
    path: Path


class Run:
    """A run directory, read lazily. See the module docstring for an example."""

    def __init__(self, path: str | Path, verify: bool = True) -> None:
        self.path = Path(path)
        self.verify = verify  # check CRC32s of dumped arrays and Parquet page checksums
        self._verified: set | None = set() if verify else None
        if not self.path.is_dir():
            raise NotARunError(f"{self.path} is not a directory; expected a run directory written by DumpHook "
                               f"(it holds manifest.<worker>.json files)")
        self.problems: list[str] = []
        self.manifests = self._read_manifests()
        self._headers: dict[Path, tuple[dict, int]] = {}
        self._alias_maps: dict[Path, dict[str, str]] = {}

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, status={self.status!r}, workers={list(self.manifests)})"

    # ---- manifests -----------------------------------------------------------------------
    def _read_manifests(self) -> dict[str, dict]:
        names = sorted(c.name for c in self.path.iterdir() if MANIFEST_RE.match(c.name))
        if not names:
            hint = ""
            inner = [c.name for c in self.path.iterdir() if c.is_dir() and is_run(c)]
            if inner:
                hint = f" It holds runs: {', '.join(sorted(inner)[:5])}; open one of those."
            raise NotARunError(f"{self.path} is not a run directory: no manifest.<worker>.json inside.{hint}")
        out: dict[str, dict] = {}
        for name in names:
            worker = MANIFEST_RE.match(name).group(1)
            try:  # DamagedFileError skips this worker; FormatVersionError stops
                m = load_manifest(self.path / name, self.path)
            except DamagedFileError as e:
                self.problems.append(str(e))
                continue
            out[worker] = m
        if not out:
            raise DamagedFileError(f"every manifest of {self.path} is damaged: {'; '.join(self.problems)}")
        return out

    def refresh(self) -> "Run":
        """Re-read manifests and forget cached statistics and file lists (for a run still being written)."""
        self.__init__(self.path, self.verify)
        for attr in ("tensors", "stats", "_dump_files", "_stats_files"):
            self.__dict__.pop(attr, None)
        return self

    @property
    def manifest(self) -> dict:
        """The first (chief's, if any) worker's manifest."""
        return self.manifests.get("chief") or next(iter(self.manifests.values()))

    @property
    def workers(self) -> list[str]:
        return list(self.manifests)

    @property
    def status(self) -> str:
        """'finished' if every worker finished; else the worst worker state: 'failed' (the hook
        disabled itself), 'crashed' (its process is gone: same host, pid not alive), 'stalled'
        (no heartbeat for STALE_HEARTBEATS heartbeats: crashed on another host, or hung), 'running'."""
        states = {worker_status(m) for m in self.manifests.values()}
        for state in ("failed", "crashed", "stalled", "running"):
            if state in states:
                return state
        return "finished"

    @property
    def config(self) -> dict:
        return self.manifest.get("config", {})

    @property
    def dropped(self) -> pd.DataFrame:
        """Dumps the hook dropped (byte budget, full queue, errors), with the reason."""
        rows = [{"worker": w, **d} for w, m in self.manifests.items() for d in m.get("dropped", [])]
        return pd.DataFrame(rows, columns=["worker", "step", "reason", "bytes"])

    # ---- catalog -------------------------------------------------------------------------
    @cached_property
    def tensors(self) -> pd.DataFrame:
        """The catalog of captured tensors, one row per tensor (union over workers)."""
        rows: dict[str, dict] = {}
        for m in self.manifests.values():
            for t in m.get("tensors", []):
                rows.setdefault(t["name"], {c: t.get(c) for c in CATALOG_COLUMNS})
        df = pd.DataFrame(list(rows.values()), columns=list(CATALOG_COLUMNS))
        return df.set_index("name", drop=False).rename_axis(None)

    def check_tensor(self, name: str) -> str:
        """Return ``name`` if the catalog holds it, else raise UnknownTensorError with close names."""
        if name not in self.tensors.index:
            raise UnknownTensorError(f"unknown tensor {name!r} in run {self.path}.{suggest(name, self.tensors.index)}"
                                     f" ({len(self.tensors)} tensors; see run.tensors)")
        return name

    def graph_def_bytes(self, worker: str | None = None) -> bytes:
        """The serialized GraphDef (parse with tf.compat.v1.GraphDef.FromString)."""
        return safe_files.read_bytes(self.path / graph_name(worker or next(iter(self.manifests))), self.path)

    # ---- statistics ----------------------------------------------------------------------
    @cached_property
    def _stats_files(self) -> list[Path]:
        d = self.path / "stats"
        return sorted(p for p in d.iterdir() if STATS_RE.match(p.name)) if d.is_dir() else []

    def _read_stats(self, columns: Sequence[str] | None = None, filters: Any = None) -> pa.Table:
        tables = []
        for p in self._stats_files:
            try:
                check_stats_file(p, self.path)  # a regular file inside the run, with the writer's schema
                tables.append(read_part(p, columns, filters, self.verify))
            except (OSError, pa.ArrowException, DamagedFileError) as e:
                msg = str(e) if isinstance(e, DamagedFileError) else f"damaged statistics file {p}: {e}"
                if msg not in self.problems:
                    self.problems.append(msg)
        if not tables:
            return pa.table({})
        return pa.concat_tables(tables, promote_options="permissive")

    @cached_property
    def stats(self) -> pd.DataFrame:
        """All statistics: one row per (step, tensor, kind, group). Columns: step, tensor, kind,
        group, count, mean, std, min, max, l2, zero_fraction, nan, inf, hist_lo, hist_hi, histogram.

        ``histogram`` holds the bin counts (Arrow-backed lists); the bin edges are
        ``np.linspace(hist_lo, hist_hi, bins + 1)`` (see :meth:`histogram`)."""
        return self._to_pandas(self._read_stats())

    def query_stats(self, tensors: Iterable[str] | None = None, steps: tuple[int, int] | None = None,
                    kinds: Iterable[str] | None = None, groups: Iterable[str] | None = None,
                    columns: Sequence[str] | None = None) -> pd.DataFrame:
        """Statistics filtered at read time (only the matching rows and columns are read)."""
        return self._to_pandas(self.query_stats_table(tensors, steps, kinds, groups, columns))

    def query_stats_table(self, tensors: Iterable[str] | None = None, steps: tuple[int, int] | None = None,
                          kinds: Iterable[str] | None = None, groups: Iterable[str] | None = None,
                          columns: Sequence[str] | None = None) -> pa.Table:
        """Like :meth:`query_stats`, as an Arrow table."""
        filters = []
        if tensors is not None:
            tensors = [self.check_tensor(t) for t in tensors]
            filters.append(("tensor", "in", tensors))
        if steps is not None:
            filters += [("step", ">=", int(steps[0])), ("step", "<=", int(steps[1]))]
        if kinds is not None:
            filters.append(("kind", "in", list(kinds)))
        if groups is not None:
            filters.append(("group", "in", list(groups)))
        if columns is not None:
            columns = list(dict.fromkeys(["step", "tensor", "kind", "group", *columns]))
        return self._read_stats(columns, filters or None)

    @staticmethod
    def _to_pandas(table: pa.Table) -> pd.DataFrame:
        if table.num_columns == 0:
            return pd.DataFrame(columns=["step", "tensor", "kind", "group"])
        df = table.to_pandas(types_mapper=lambda t: pd.ArrowDtype(t) if pa.types.is_fixed_size_list(t) else None)
        for c in ("tensor", "kind", "group"):
            if c in df and not isinstance(df[c].dtype, pd.CategoricalDtype):
                df[c] = df[c].astype("category")
        return df

    def histogram(self, tensor: str, step: int, kind: str = "forward", group: str = "all") -> tuple[np.ndarray, np.ndarray]:
        """Bin edges and counts of the in-graph histogram of ``tensor`` at ``step``."""
        df = self.query_stats([tensor], steps=(step, step), kinds=[kind], groups=[group],
                              columns=["hist_lo", "hist_hi", "histogram"])
        if df.empty:
            have = self.query_stats([tensor], kinds=[kind], groups=[group], columns=[])["step"].unique()
            raise NoDumpError(f"no statistics for {tensor!r} kind={kind!r} group={group!r} at step {step}; "
                              f"nearest steps with statistics: {nearest(step, have)}")
        row = df.iloc[-1]
        counts = np.asarray(row["histogram"], dtype=np.int64)
        return np.linspace(row["hist_lo"], row["hist_hi"], len(counts) + 1), counts

    # ---- full dumps ----------------------------------------------------------------------
    @cached_property
    def _dump_files(self) -> dict[int, list[DumpFile]]:
        d = self.path / "dumps"
        out: dict[int, list[DumpFile]] = {}
        if d.is_dir():
            for p in sorted(d.iterdir()):
                m = DUMP_RE.match(p.name)
                if m and m.group(1) in self.manifests:
                    out.setdefault(int(m.group(2)), []).append(DumpFile(m.group(1), int(m.group(2)), p))
        return out

    @property
    def steps(self) -> list[int]:
        """Steps with a full dump (any worker), sorted."""
        return sorted(self._dump_files)

    def _dump(self, step: int, worker: str | None) -> DumpFile:
        files = self._dump_files.get(int(step))
        if not files:
            raise NoDumpError(f"no full dump at step {step} in {self.path}; nearest dumped steps: "
                              f"{nearest(int(step), self.steps) or 'none (run.steps is empty)'}")
        if worker is None:
            return files[0]
        for f in files:
            if f.worker == worker:
                return f
        raise NoDumpError(f"step {step} has no dump from worker {worker!r}; it has {[f.worker for f in files]}")

    def _header(self, path: Path) -> tuple[dict, int]:
        """(header, data start) of a dump file, read and checked once; aliases parsed with it."""
        if path not in self._headers:
            try:
                header, start = safetensors_io.read_header(path, self.path)
                self._alias_maps[path] = _aliases(path, header)
                self._headers[path] = header, start
            except DamagedFileError as e:
                if str(e) not in self.problems:
                    self.problems.append(str(e))
                raise
        return self._headers[path]

    def _aliases(self, path: Path) -> dict[str, str]:
        """{alias key: stored key} of a dump file (format.ALIASES_KEY)."""
        self._header(path)
        return self._alias_maps[path]

    def dump_keys(self, step: int, worker: str | None = None) -> list[str]:
        """Keys held by the dump of ``step`` ('forward/<tensor>', 'gradient/<tensor>', 'samples/...')."""
        f = self._dump(step, worker)
        return [k for k in self._header(f.path)[0] if k != "__metadata__"] + list(self._aliases(f.path))

    def dump_array(self, step: int, key: str, worker: str | None = None) -> np.ndarray:
        """Any array of the dump of ``step`` by key (see :meth:`dump_keys`), read into memory
        (memory-mapped beyond 64 MiB, see FORMAT.md)."""
        f = self._dump(step, worker)
        header, start = self._header(f.path)
        key = self._aliases(f.path).get(key, key)
        if key not in header or key == "__metadata__":
            raise NoDumpError(f"the dump of step {step} holds no {key!r}.{suggest(key, header)}")
        try:
            return safetensors_io.load(f.path, key, header, start, root=self.path, verified=self._verified)
        except DamagedFileError as e:
            if str(e) not in self.problems:
                self.problems.append(str(e))
            raise

    def tensor(self, name: str, step: int, kind: str = "forward", worker: str | None = None) -> np.ndarray:
        """The dumped value (``kind="forward"``) or gradient of ``name`` at ``step`` (numpy).

        For a batched tensor only the samples kept by the sample budget are there; see
        :meth:`samples` for which ones."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
        self.check_tensor(name)
        if kind == "gradient" and not bool(self.tensors.loc[name, "has_gradient"]):
            raise NoDumpError(f"{name!r} does not reach the loss, so it has no gradient (has_gradient=False)")
        key = f"{kind}/{name}"
        if key not in self.dump_keys(step, worker):
            raise NoDumpError(f"the dump of step {step} holds no {kind} of {name!r}; see run.dump_keys({step})")
        return self.dump_array(step, key, worker)

    def samples(self, step: int, worker: str | None = None) -> pd.DataFrame:
        """The samples kept in the dump of ``step``: batch index, label and group per row."""
        keys = self.dump_keys(step, worker)
        arrays = {col: np.asarray(self.dump_array(step, f"samples/{col}", worker))
                  for col in ("index", "label", "group") if f"samples/{col}" in keys}
        check_samples(self._dump(step, worker).path, *(arrays.get(c) for c in ("index", "group", "label")))
        cols = {}
        for col, arr in arrays.items():
            cols[col] = list(arr) if arr.ndim > 1 else arr
        df = pd.DataFrame(cols)
        if "group" in df:
            df["group"] = np.where(df["group"].astype(int) == 1, "positive", "negative")
        return df

    def dump_metadata(self, step: int, worker: str | None = None) -> dict:
        return dict(self._header(self._dump(step, worker).path)[0].get("__metadata__", {}))

    # ---- sizes and anomalies -------------------------------------------------------------
    def size_bytes(self) -> int:
        """Bytes on disk of every file of the run."""
        return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())

    def first_nonfinite(self) -> dict | None:
        """The first (step, tensor, kind) whose statistics count a NaN or Inf, or None."""
        df = self.query_stats(groups=["all"], columns=["nan", "inf"])
        if df.empty:
            return None
        bad = df[(df["nan"] > 0) | (df["inf"] > 0)]
        if bad.empty:
            return None
        row = bad.sort_values(["step"], kind="stable").iloc[0]
        return {"step": int(row["step"]), "tensor": str(row["tensor"]), "kind": str(row["kind"]),
                "nan": int(row["nan"]), "inf": int(row["inf"])}

    def icnn_layers(self) -> pd.DataFrame:
        """ICNN mask layers of the run, one row per layer, one column per role (tensor names)."""
        from .templates import icnn_layers  # numpy-only module
        return icnn_layers(self.tensors)


def parse_steps(spec: str | None) -> tuple[int, int] | None:
    """'A:B' -> (A, B) inclusive; 'A:' or ':B' leave a side open; None -> None."""
    if not spec:
        return None
    m = re.fullmatch(r"\s*(\d*)\s*:\s*(\d*)\s*", spec)
    if not m:
        raise ValueError(f"steps {spec!r} must look like A:B (e.g. 100:500, 100: or :500)")
    lo = int(m.group(1)) if m.group(1) else 0
    hi = int(m.group(2)) if m.group(2) else 2 ** 62
    return lo, hi


__all__ = ["Run", "open_run", "find_runs", "is_run", "parse_steps", "GROUPS", "safe_join"]
