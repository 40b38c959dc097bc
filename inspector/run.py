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

import copy
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from inspector.dumps import read
from inspector.dumps.read import DumpFile
from inspector.format import GROUPS, MODES, graph_name, is_temporary, parse_manifest_name
from inspector.format import manifest as manifest_schema
from inspector.format.accounting import Ledger, Why
from inspector.format.loghist import LogHistogram
from inspector.format.manifest import (GROUPS_REFUSED_KEY, RECORDED_NOTHING_KEY, load_manifest,
                                       with_caller_defaults)
from inspector.format.provenance import captured_on
from inspector.graph import graphdef
from inspector.sessions.crosscheck import folder_problems, graph_problems
from inspector.stats.schema import MEMORY_BUDGET
from inspector.sessions.liveness import writer_state
from inspector.sessions.trainings import hidden_sessions
from inspector.stats import query
from inspector.stats.digest import Digest
from inspector.storage.atomic import safe_join

from .errors import DamagedFileError, InspectorError, NotARunError, UnknownTensorError, suggest
from .storage import Storage, normalize, open_storage

CATALOG_COLUMNS = ("name", "op", "op_type", "dtype", "shape", "scope", "has_gradient", "batched",
                   "icnn_layer", "icnn_role", "kind", "variable", "feeds", "zero_gradient_expected",
                   "reads", "has_update", "gradient_note", "keras_layer", "keras_call", "tower",
                   "source_file", "source_line", "source_function", "source_stack",
                   "icnn_filter_class", "captured_on", "batch_note")
#: values of catalog fields that older runs lack (FORMAT.md: ``kind``, ``zero_gradient_expected``,
#: ...)
CATALOG_DEFAULTS = {"kind": "tensor", "has_update": False, "zero_gradient_expected": False}


def _is_run(store: Storage) -> bool:
    return any(parse_manifest_name(e.name) for e in store.list(""))


def is_run(path: str | Path | Storage, storage_options: dict | None = None) -> bool:
    """Whether ``path`` is a run directory: it holds at least one worker manifest.

    Args:
        path: a folder, or a URL (``s3://bucket/runs/exp1``).
        storage_options: for a URL, its fsspec filesystem's options (as in :func:`open_run`).
    """
    store = open_storage(path, storage_options)
    return store.exists() and _is_run(store)


def find_runs(path: str | Path, storage_options: dict | None = None) -> list:
    """The runs at ``path``: ``path`` itself if it is a run, else the runs directly inside it.

    Args:
        path: a folder, or a URL of a folder in an object store.
        storage_options: for a URL, its fsspec filesystem's options (as in :func:`open_run`).

    Returns:
        The runs, sorted: Paths for a local folder, URLs for a folder in an object store.

    Raises:
        NotARunError: ``path`` does not exist.
    """
    store = open_storage(path, storage_options)
    if not store.exists():
        raise NotARunError(f"{store.display()} does not exist; give a run directory or a "
                           "folder of runs")
    if store.is_local:
        p = Path(store.display())
        if _is_run(store):
            return [p]
        return sorted(c for c in p.iterdir() if c.is_dir() and is_run(c))
    if _is_run(store):
        return [store.display()]
    return sorted(store.child(e.name).display() for e in store.list("") if e.size is None
                  and _is_run(store.child(e.name)))


def open_run(path: str | Path | Storage, verify: bool = True, storage_options: dict | None = None,
             filesystem: Any = None, timeout: float | None = None,
             memory_budget: int | None = MEMORY_BUDGET) -> "Run":
    """Open the run at ``path``, reading its manifests only. Remote files are read by byte
    ranges: a statistics query reads Parquet footers and the columns it needs, a tensor its
    dump's header and its own bytes.

    Args:
        path: a folder, ``file://``, or an fsspec URL (``s3://bucket/runs/exp1``, ``gs://...``).
        verify: check the checksums of dumped arrays and statistics pages as they are read;
            False skips them (faster; see FORMAT.md).
        storage_options: for a URL, its fsspec filesystem's options, as fsspec documents them
            (default: ``$TF_INSPECTOR_STORAGE_OPTIONS``, else credentials from the environment).
        filesystem: an fsspec filesystem instance to use instead of ``storage_options``.
        timeout: seconds a request to an object store may take
            (``inspector.storage.storage_timeout``).
        memory_budget: bytes of statistics rows one query may hold (default 2 GiB; None: no
            budget); a larger answer raises MemoryBudgetError naming a narrower query. Parts
            are read in bounded batches whatever wrote them, so memory follows the answer.

    Raises:
        NotARunError: ``path`` does not exist, or holds no manifest.
        DamagedFileError: every manifest of the run is damaged.
        FormatVersionError: a manifest is of a newer format version than this reader's.
        StorageError: the object store did not answer (naming the URL and the cause).
    """
    return Run(path, verify=verify, storage_options=storage_options, filesystem=filesystem,
               timeout=timeout, memory_budget=memory_budget)


#: States of a session whose manifest may lag what it wrote (no final rewrite): its process died.
LAGGING = ("crashed", "stalled")


def _session_steps(m: dict, files: list[DumpFile], stats: Sequence[int] = ()) -> dict:
    """first_step, last_step and dumps of one session: its manifest's, widened by the dump files
    it left and ``stats`` (its statistics parts' first and last step): a process killed before
    its manifest's next heartbeat had still written them."""
    steps = [x for x in (m.get("steps") or []) if x is not None] + [f.step for f in files] \
        + list(stats)
    dumps = max(m.get("dumps_written") or 0, len({(f.step, f.batch) for f in files}))
    return {"first_step": min(steps) if steps else None, "last_step": max(steps) if steps else None,
            "dumps": dumps if files or m.get("dumps_written") is not None else None}


def _missing(store: Storage, path: Any) -> str:
    """What is wrong with a run path that cannot be opened: it does not exist (a local path, or
    a prefix in an object store holding no object), or it is a file."""
    if not store.is_local:
        return ("holds no object (the prefix does not exist in the bucket, or the credentials "
                "cannot list it)")
    return "is not a directory" if Path(path).exists() else "does not exist"


def worker_status(manifest: dict, now: float | None = None) -> str:
    """One writer session's state from its manifest: its ``status``, or for a 'running' one
    whose writer is gone, 'crashed' (same host, process not alive) or 'stalled' (heartbeat late)."""
    return writer_state(manifest, now)


#: Selects every worker (``worker="all"``) or every session, unmerged (``session="all"``).
ALL = "all"
#: The mode of a session whose manifest is damaged (see Run._mode_of).
UNKNOWN_MODE = "unknown"


class Run:
    """A run directory, read lazily. See the module docstring for an example.

    A run holds one or more writer sessions per worker (every ``train``/``evaluate`` call and
    every resume adds one). Queries pick, by default: mode ``train``; the chief worker (the
    only worker, or ``worker="all"`` when several run without a chief; for a mode the chief
    never ran, the only worker that ran it: a cluster's evaluator); and for a step that
    two sessions of one worker recorded, the later session (FORMAT.md, "Sessions"). Pass
    ``worker=``, ``mode=`` or ``session=`` to choose otherwise."""

    def __init__(self, path: str | Path | Storage, verify: bool = True,
                 storage_options: dict | None = None, filesystem: Any = None,
                 timeout: float | None = None,
                 memory_budget: int | None = MEMORY_BUDGET) -> None:
        if memory_budget is not None and (isinstance(memory_budget, bool)
                                          or not isinstance(memory_budget, int)
                                          or memory_budget < 1):
            raise ValueError(f"memory_budget={memory_budget!r}: expected a number of bytes >= 1 "
                             "or None (no budget)")
        #: bytes of statistics rows one query may hold (None: no budget): MemoryBudgetError beyond
        self.memory_budget = memory_budget
        self.store = open_storage(normalize(path), storage_options, filesystem, timeout=timeout)
        #: the run directory: a Path on local disk, the URL in an object store
        self.path: Any = Path(self.store.display()) if self.store.is_local else self.store.display()
        self.verify = verify  # check CRC32s of dumped arrays and Parquet page checksums
        self._verified: set | None = set() if verify else None
        if not self.store.exists() or (self.store.is_local and not Path(self.path).is_dir()):
            raise NotARunError(f"{self.path} {_missing(self.store, self.path)}; expected a run "
                               "directory written by DumpHook (it holds "
                               "manifest.<worker>.s<session>.json files)")
        self._footers: dict[tuple, Any] = {}  # remote statistics parts: footer metadata, read once
        # parts without a summary: what stats_steps and NaN scans need
        self._digests: dict[tuple, Digest] = {}
        self._origins: dict[tuple, Any] = {}  # nonfinite_origin per (mode, worker) of this snapshot
        self.problems: list[str] = []
        self.manifests = self._read_manifests()
        self._view: dict[str, Any] = {"mode": "train", "worker": None, "batch": None}
        self._headers: dict[str, tuple[dict, int]] = {}
        # dump_index per (mode, worker, session) as resolved: every tensor/dump_keys/dump_array
        # call needs it, and building it walks every dump file (shared with views: keys resolved)
        self._indexes: dict[tuple, dict[tuple[int, int], list[DumpFile]]] = {}
        self._alias_maps: dict[str, dict[str, str]] = {}
        self._ledgers: dict[tuple[str, int], Ledger] = {}   # per session: its accounting and graph
        self._graphs: dict[tuple[str, int], graphdef.OpGraph] = {}   # per session: op_graph()

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, status={self.status!r}, workers={self.workers})"

    @property
    def name(self) -> str:
        """The run directory's own name (``exp1`` of ``runs/exp1`` or ``s3://bucket/runs/exp1``)."""
        return str(self.path).rstrip("/").rsplit("/", 1)[-1]

    # ---- manifests and sessions --------------------------------------------------------------
    def _read_manifests(self) -> dict[tuple[str, int], dict]:
        entries = self.store.list("")
        found = sorted((ids, e.name) for e in entries if (ids := parse_manifest_name(e.name)))
        if not found:
            hint = ""
            inner = [e.name for e in entries
                     if e.size is None and _is_run(self.store.child(e.name))]
            if inner:
                hint = f" It holds runs: {', '.join(sorted(inner)[:5])}; open one of those."
            raise NotARunError(f"{self.path} is not a run directory: no "
                               f"manifest.<worker>.s<session>.json inside.{hint}")
        out: dict[tuple[str, int], dict] = {}
        for ids, name in found:
            try:  # DamagedFileError skips this session; FormatVersionError stops
                # the cap checked before reading
                data = self.store.read(name, manifest_schema.MAX_MANIFEST_BYTES)
                dropped: list[str] = []   # auxiliary fields that failed their checks
                m = load_manifest(self.store.display(name), data=data, dropped=dropped)
                self.problems += dropped
                _check_identity(m, *ids, self.store.display(name))
            except DamagedFileError as e:
                self.problems.append(str(e))
                continue
            out[ids] = _upgrade_manifest(m, *ids)
        if not out:
            raise DamagedFileError(f"every manifest of {self.path} is damaged: "
                                   f"{'; '.join(self.problems)}")
        # what the manifests say was written, against this listing (no request more)
        sizes = {e.name: e.size for e in entries if not e.link}
        self.problems += folder_problems(sizes, self.store.display) \
            + graph_problems(out, sizes, self.store.display)
        return out

    @property
    def workers(self) -> list[str]:
        """Worker names, the chief first."""
        names = sorted({w for w, _ in self.manifests})
        chief = self.default_worker
        return ([chief] if chief else []) + [w for w in names if w != chief]

    @property
    def default_worker(self) -> str | None:
        """The worker queries use by default: the chief, else the only worker; None (all
        workers) when several run without a chief."""
        names = {w for w, _ in self.manifests}
        chiefs = sorted({w for (w, _), m in self.manifests.items() if m.get("is_chief")})
        if "chief" in names:
            return "chief"
        if chiefs:
            return chiefs[0]
        return next(iter(names)) if len(names) == 1 else None

    def view(self, mode: str = "train", worker: str | None = None,
             batch: int | None = None) -> "Run":
        """This run with other defaults for every query. Shares the file caches; statistics
        are re-read.

        Example::

            ev = run.view(mode="eval", batch=0)
            ev.stats, ev.steps, ev.tensor("conv1/Relu:0", 200)

        Args:
            mode: train, eval, predict, or 'all'.
            worker: a worker name, 'all', or None (:attr:`default_worker`).
            batch: an eval/predict batch index; None: every batch.

        Raises:
            ValueError: an unknown mode.
            InspectorError: a worker that wrote nothing in this run.
        """
        self._check_mode(mode)
        if worker not in (None, ALL):
            self._workers_for(worker)  # raises for a worker that wrote nothing
        out = copy.copy(self)
        out.__dict__.pop("stats", None)
        out._view = {"mode": mode, "worker": worker, "batch": batch}
        out._origins = {}   # keyed by the explicit arguments: None means this view's defaults
        return out

    def _where(self, mode: str | None, worker: str | None,
               batch: int | None = None) -> tuple[str, str | None, int | None]:
        """The explicit arguments, else this view's defaults."""
        v = self._view
        return (mode or v["mode"], worker or v["worker"], v["batch"] if batch is None else batch)

    def _default_for(self, mode: str | None) -> str | None:
        """The default worker, or for a mode it never ran (a cluster's evaluator runs every
        evaluation, the chief none) the only worker that ran that mode."""
        chief = self.default_worker
        if mode in (None, ALL) \
                or any(w == chief and m["mode"] == mode for (w, _), m in self.manifests.items()):
            return chief
        ran = {w for (w, _), m in self.manifests.items() if m["mode"] == mode}
        return ran.pop() if len(ran) == 1 else chief

    def _latest(self, worker: str | None = None, mode: str | None = None) -> dict | None:
        keys = [k for k, m in self.manifests.items()
                if (worker is None or k[0] == worker) and (mode is None or m["mode"] == mode)]
        return self.manifests[max(keys, key=lambda k: (k[1], k[0]))] if keys else None

    @property
    def manifest(self) -> dict:
        """The manifest of the default worker's latest training session (else its latest, else
        any)."""
        w = self.default_worker
        m = self._latest(w, "train") or self._latest(w) or self._latest()
        if m is None:   # not reached: a Run is only made from a folder with a readable manifest
            raise NotARunError(f"{self.path} has no readable manifest")
        return m

    @property
    def sessions(self) -> pd.DataFrame:
        """One row per writer session: worker, session, mode, state, steps, times, error;
        ``start_step`` (the global step a training session began at, where the hook recorded
        it), ``hidden_by`` (the session whose new training hides this one from merged views:
        read it with ``session=``; :mod:`inspector.sessions.trainings`) and ``note`` (why a session
        recorded nothing, where the hook knew)."""
        files: dict[tuple[str, int], list[DumpFile]] = {}
        for f in self._dump_files:
            files.setdefault((f.worker, f.session), []).append(f)
        rows = [{"worker": w, "session": s, "mode": m["mode"], "state": (state := worker_status(m)),
                 **_session_steps(m, files.get((w, s), []),
                                  self._stats_span(w, s) if state in LAGGING else ()),
                 "bytes": m.get("bytes_written"),
                 "created": m.get("created"), "updated": m.get("updated"), "error": m.get("error"),
                 "start_step": m.get("start_step"), "hidden_by": self._hidden.get((w, s)),
                 "note": m.get(RECORDED_NOTHING_KEY)}
                for (w, s), m in self.manifests.items()]
        df = pd.DataFrame(rows,
                          columns=["worker", "session", "mode", "state", "first_step", "last_step",
                                   "dumps", "bytes", "created", "updated", "error", "start_step",
                                   "hidden_by", "note"])
        return df.astype({"start_step": "Int64", "hidden_by": "Int64"})

    def _stats_span(self, worker: str, session: int) -> tuple[int, ...]:
        """(first, last) step of a session's statistics parts on disk (their summaries' step
        ranges, else their step columns); () if it has none that read."""
        from inspector.stats.summary import part_steps
        steps: list[int] = []
        for w, s, p in self._stats_files:
            if (w, s) != (worker, session):
                continue
            known = part_steps(self, p)
            t = None if known \
                else self._read_part(w, s, p, ["step", "tensor", "kind", "group"], None)
            if t is not None and t.num_rows:
                known = (pc.min(t.column("step")).as_py(), pc.max(t.column("step")).as_py())
            steps += known or ()
        return (min(steps), max(steps)) if steps else ()

    @property
    def status(self) -> str:
        """The worst state of each worker's latest session: 'failed' (the hook or the session
        ended with an error), 'crashed' (its process is gone: same host, pid not alive),
        'stalled' (no heartbeat for STALE_HEARTBEATS heartbeats: crashed on another host, or
        hung), 'running'; else 'finished'. Earlier sessions' states are in :attr:`sessions`."""
        latest = (self._latest(w) for w in {w for w, _ in self.manifests})
        states = {worker_status(m) for m in latest if m is not None}
        for state in ("failed", "crashed", "stalled", "running"):
            if state in states:
                return state
        return "finished"

    @property
    def config(self) -> dict:
        """The hook's settings, as :attr:`manifest` records them (``config``: FORMAT.md)."""
        return self.manifest.get("config", {})

    @property
    def dropped(self) -> pd.DataFrame:
        """What the writers did not write (byte budget, full queue, write errors), aggregated by
        (what, reason): count, bytes, first and last step."""
        return self._records("dropped")

    @property
    def errors(self) -> pd.DataFrame:
        """Write errors of every session (aggregated like :attr:`dropped`), and hook errors."""
        return self._records("errors")

    @property
    def groups_refused(self) -> pd.DataFrame:
        """Sessions with statistics steps whose samples broke the group rule (two groups, a class
        id out of range, float labels that are not class ids): from ``first_step`` on, such
        steps have group ``all`` rows only. Columns worker, session, mode, first_step, last_step
        and steps (how many; None where the session did not close, e.g. a crash or an older
        writer), samples (at the first; None: not counted), why."""
        cols = ["worker", "session", "mode", "first_step", "last_step", "steps", "samples", "why"]
        rows = [{"worker": w, "session": s, "mode": m["mode"],
                 **{c: m[GROUPS_REFUSED_KEY].get(c) for c in cols[3:]}}
                for (w, s), m in self.manifests.items()
                if isinstance(m.get(GROUPS_REFUSED_KEY), dict)]
        return pd.DataFrame(rows, columns=cols)

    def _records(self, key: str) -> pd.DataFrame:
        cols = ["worker", "session", "mode", "what", "reason", "count", "bytes", "first_step",
                "last_step"]
        rows = [{"worker": w, "session": s, "mode": m["mode"], **{c: r.get(c) for c in cols[3:]}}
                for (w, s), m in self.manifests.items() for r in m.get(key, [])]
        return pd.DataFrame(rows, columns=cols)

    # ---- catalog -------------------------------------------------------------------------
    @cached_property
    def tensors(self) -> pd.DataFrame:
        """The catalog of captured tensors, one row per tensor (union over sessions and workers:
        a tensor's entry is the first session's that lists it, except ``has_gradient`` and
        ``has_update``, true where any session's is: a resume that records gradients where the
        first session did not has them read). ``captured_on``: "probe batch, after the update"
        where a Keras probe recorded the entry (its gradient is not the one the step's update
        came from), else None (the training step's own; ``inspector.format.provenance``)."""
        rows: dict[str, dict] = {}
        for m in self.manifests.values():
            # older Keras probe runs lack the entry's captured_on: their manifest says it
            # (batch_note)
            defaults = {**CATALOG_DEFAULTS, "captured_on": captured_on(m)}
            for t in m.get("tensors", []):
                row = rows.setdefault(t["name"],
                                      {c: t.get(c, defaults.get(c)) for c in CATALOG_COLUMNS})
                for flag in ("has_gradient", "has_update"):
                    row[flag] = row[flag] or t.get(flag, CATALOG_DEFAULTS.get(flag))
        df = pd.DataFrame(list(rows.values()), columns=list(CATALOG_COLUMNS))
        return df.set_index("name", drop=False).rename_axis(None)

    @property
    def variables(self) -> pd.DataFrame:
        """The catalog's variable records (``kind == 'variable'``), named by variable:
        ``conv1/w``."""
        return self.tensors[self.tensors["kind"] == "variable"]

    def check_tensor(self, name: str) -> str:
        """``name``, checked against the catalog.

        Raises:
            UnknownTensorError: the catalog does not hold ``name`` (naming close names and,
                where the run records it, why it was not captured: :meth:`why`).
        """
        if name not in self.tensors.index:
            why = self.why(name)
            said = f" Not captured: {why.reason}." if why.status in ("skipped", "excluded") else ""
            close = suggest(name, self.tensors.index)
            raise UnknownTensorError(f"unknown tensor {name!r} in run {self.path}.{said}{close} "
                                     f"({len(self.tensors)} tensors; see run.tensors)")
        return name

    def graph_def_bytes(self, worker: str | None = None, session: int | None = None,
                        limit: int | None = None) -> bytes:
        """The serialized GraphDef of a session; parse it with tf.compat.v1.GraphDef.FromString
        or ``inspector.graph.graphdef.parse_graph_def``.

        Args:
            worker: the session's worker (None: that of :attr:`manifest`).
            session: its number (None: the worker's latest; both None: :attr:`manifest`'s).
            limit: the largest file read, in bytes (default ``graphdef.MAX_GRAPH_BYTES``),
                checked before reading.

        Raises:
            DamagedFileError: the file is over ``limit`` bytes (naming it and its size).
            InspectorError: no such worker or session.
            OSError: the session wrote no graph file.
        """
        m = self._session_manifest(worker, session)
        w, s = m["worker"], m["session"]
        name = graph_name(w, s) if s else f"graph.{w}.pb"
        return self.store.read(name, graphdef.MAX_GRAPH_BYTES if limit is None else limit)

    def op_graph(self, worker: str | None = None, session: int | None = None) -> graphdef.OpGraph:
        """The graph of a session (``worker`` and ``session`` as in :meth:`graph_def_bytes`):
        each op's producers and consumers, parsed once per session (a graph file never changes).

        Raises:
            DamagedFileError: the graph file is over ``graphdef.MAX_GRAPH_BYTES`` or damaged.
            InspectorError: no such worker or session.
            OSError: the session wrote no graph file.
        """
        m = self._session_manifest(worker, session)
        key = (m["worker"], m["session"])
        if key not in self._graphs:
            self._graphs[key] = graphdef.OpGraph(graphdef.parse_graph_def(
                self.graph_def_bytes(*key), f"graph of {key[0]} session {key[1]}"))
        return self._graphs[key]

    def _session_manifest(self, worker: str | None, session: int | None) -> dict:
        """The manifest of ``worker``'s ``session`` (None: its latest; both None:
        :attr:`manifest`)."""
        m = self.manifest if worker is None and session is None else self._latest(worker)
        if m is None:
            raise InspectorError(f"no worker {worker!r} in {self.path}; workers: "
                                 f"{', '.join(self.workers)}")
        if session is not None:
            m = self.manifests.get((worker or m["worker"], session))
            if m is None:
                raise InspectorError(f"no session {session} of worker {worker!r} in {self.path}")
        return m

    # ---- accounting (inspector.format.accounting) ----------------------------------------
    def why(self, name: str, worker: str | None = None, session: int | None = None) -> Why:
        """Whether ``name`` was captured, skipped (and why) or excluded (by which rule).

        Example::

            run.why("loss/Const:0").status     # 'excluded'; .rule 'constant'

        Args:
            name: a tensor or op name of the session's graph.
            worker: the session's worker (None: that of :attr:`manifest`).
            session: its number (None: the worker's latest; both None: :attr:`manifest`'s).

        Returns:
            An ``inspector.format.accounting.Why`` with ``status``, ``reason`` and ``rule``.
        """
        return self._ledger(worker, session).why(name)

    def accounting(self, worker: str | None = None, session: int | None = None) -> pd.DataFrame:
        """Where a session's float op outputs went (``worker``, ``session``: as in :meth:`why`).

        Returns:
            One row for the captured outputs, one per skip reason and one per exclusion rule
                with outputs: columns status, rule, source, what, count, examples; empty for a run
                written before the accounting.
        """
        return pd.DataFrame(self._ledger(worker, session).table(),
                            columns=["status", "rule", "source", "what", "count", "examples"])

    def uncaptured(self, text: str = "", worker: str | None = None, session: int | None = None,
                   limit: int = 200) -> pd.DataFrame:
        """The graph's ops and skipped tensors that were not captured (``worker``, ``session``:
        as in :meth:`why`).

        Args:
            text: only those whose name or op type contains it (case-insensitive).
            limit: at most this many rows.

        Returns:
            Columns name, op_type, status, rule, reason.
        """
        rows = [(w.name, w.op_type, w.status, w.rule, w.reason)
                for w in self._ledger(worker, session).search(text, limit)]
        return pd.DataFrame(rows, columns=["name", "op_type", "status", "rule", "reason"])

    def _ledger(self, worker: str | None, session: int | None) -> Ledger:
        m = self._session_manifest(worker, session)
        key = (m["worker"], m["session"])
        if key not in self._ledgers:
            try:
                op_types: dict[str, str] | None = {
                    name: node.op for name, node in self.op_graph(*key).nodes.items()}
            # no graph file (synthetic runs may have none), or damaged
            except (OSError, InspectorError):
                op_types = None
            self._ledgers[key] = Ledger(m, op_types)
        return self._ledgers[key]

    # ---- selection -----------------------------------------------------------------------
    def _workers_for(self, worker: str | None, mode: str | None = None) -> set[str]:
        names = {w for w, _ in self.manifests}
        if worker == ALL or (worker is None and self.default_worker is None):
            return names
        worker = worker or self._default_for(mode)
        if worker not in names:
            raise InspectorError(f"worker {worker!r} wrote nothing in {self.path}; its workers: "
                                 f"{sorted(names)} (or worker='all')")
        return {worker}

    @cached_property
    def _hidden(self) -> dict[tuple[str, int], int]:
        """{(worker, session): the session whose new training hides it from merged views}
        (:mod:`inspector.sessions.trainings`)."""
        return hidden_sessions(self.manifests)

    def _mode_of(self, worker: str, session: int) -> str:
        """The session's mode; ``UNKNOWN_MODE`` for a session whose manifest is damaged: its files
        are in no mode's view (an evaluation's rows read as training's would be wrong numbers),
        only in ``mode="all"`` and ``session=<it>`` queries (``run.problems`` names the
        manifest)."""
        m = self.manifests.get((worker, session))
        return m["mode"] if m else UNKNOWN_MODE

    @staticmethod
    def _check_mode(mode: str | None) -> None:
        if mode is not None and mode != ALL and mode not in MODES:
            raise ValueError(f"mode={mode!r} must be one of {MODES} or 'all'")

    def _selected(self, items: Iterable[tuple[str, int, Any]], mode: str | None, worker: str | None,
                  session: int | str | None) -> list[tuple[str, int, Any]]:
        """The (worker, session, item) triples of the chosen workers, mode and session."""
        mode, worker, _ = self._where(mode, worker)
        self._check_mode(mode)
        workers = self._workers_for(worker, mode)
        # merged: from each worker's latest new training
        hidden = self._hidden if session is None else {}
        out = [(w, s, x) for w, s, x in items if w in workers
               and (mode == ALL or self._mode_of(w, s) == mode
                    or (isinstance(session, int) and self._mode_of(w, s) == UNKNOWN_MODE))
               and (session in (None, ALL) or s == session) and (w, s) not in hidden]
        if isinstance(session, int) and not out \
                and not any(s == session for _, s in self.manifests):
            sessions = sorted({s for _, s in self.manifests})
            raise InspectorError(f"no session {session} in {self.path}; sessions: {sessions}")
        return out

    # ---- statistics ----------------------------------------------------------------------
    @cached_property
    def _stats_files(self) -> list[tuple[str, int, tuple[str, int | None, str]]]:
        """(worker, session, (name in the run, size, stamp)) of every statistics part,
        listed once per snapshot."""
        return query.stats_files(self)

    def _read_part(self, worker: str, session: int, part: tuple[str, int | None, str],
                   columns: Sequence[str] | None, filters: Any,
                   identity: bool = True) -> pa.Table | None:
        """Rows of ``part``, or None (:func:`inspector.stats.query.read_stats_part`): every
        statistics read goes through this method."""
        return query.read_stats_part(self, worker, session, part, columns, filters, identity)

    @cached_property
    def stats(self) -> pd.DataFrame:
        """Training statistics of the default worker, a step recorded twice taken from the later
        session: one row per (step, tensor, kind, group). Columns: worker, session, mode, step,
        batch, tensor, kind, group, count, mean, std, min, max, l2, zero_fraction, nan, inf,
        and the histogram: ``hist_bucket``, ``hist_count`` (Arrow-backed lists: the non-empty
        log-magnitude buckets, :mod:`inspector.format.loghist`; see :meth:`log_histogram`), or in
        runs written before format version 4 ``hist_lo``, ``hist_hi``, ``histogram`` (equal-width
        bins: edges ``np.linspace(hist_lo, hist_hi, bins + 1)``). Use :meth:`query_stats` for
        other modes, workers, sessions. A row that counts a NaN or Inf shows its mean, std, min,
        max and l2 as NaN or Inf (:meth:`query_stats`)."""
        return query.stats(self)

    @property
    def groups(self) -> list[str]:
        """The sample groups of the run's statistics: ``all``, then each session's named groups
        in their order (manifest ``groups``; runs without it: positive and negative).
        Example: ``['all', 'class_0', 'class_1']``."""
        return query.groups(self)

    @property
    def groups_note(self) -> str | None:
        """Why the run has no groups but ``all`` where a session's labels gave none (its
        manifest's ``groups`` names no group: a Keras model with several outputs and no
        ``positive=``/``groups=``, a fit without targets), else None."""
        return query.groups_note(self)

    def check_group(self, group: str) -> str:
        """``group``, checked against :attr:`groups`.

        Raises:
            UnknownGroupError: the run has no such group (naming the groups it has).
        """
        return query.check_group(self, group)

    def query_stats(self, tensors: Iterable[str] | None = None,
                    steps: tuple[int, int] | None = None, kinds: Iterable[str] | None = None,
                    groups: Iterable[str] | None = None, columns: Sequence[str] | None = None, *,
                    mode: str | None = None, worker: str | None = None,
                    session: int | str | None = None, batch: int | None = None,
                    group: str | None = None, at_steps: Iterable[int] | None = None,
                    finite_part: bool = False) -> pd.DataFrame:
        """Statistics filtered at read time (only the matching files, rows and columns are read).

        Example::

            run.query_stats(["conv1/Relu:0"], steps=(100, 500), kinds=["gradient"], groups=["all"])
            run.query_stats(["logits:0"], group="class_3", columns=["mean", "std"])
            run.query_stats(mode="eval", columns=["mean"])      # one row per eval batch

        Args:
            tensors: only these tensors (None: every one).
            steps: only the steps from ``steps[0]`` to ``steps[1]``, both included.
            kinds: only these kinds (``forward``, ``gradient``, ``update``...).
            groups: only these sample groups (:attr:`groups` lists them).
            columns: the statistics columns to read (the identity columns and tensor, kind and
                group always come); None: every column.
            mode: 'train', 'eval', 'predict' or 'all'.
            worker: a worker name, 'all', or None: :attr:`default_worker`.
            session: None merges sessions (the later session wins a step recorded twice); an
                int reads that session only; 'all' keeps every session's rows.
            batch: only that eval/predict batch.
            group: one group more (the same as ``groups=[group]``).
            at_steps: only these steps (with ``steps`` too, those of them in its range): each
                part is read once for all of them.
            finite_part: the stored values of a row that counts a NaN or Inf. By default its
                mean, std, min, max and l2 show as NaN (l2 as Inf where it counts an Inf and no
                NaN), never the finite part's numbers, which can read as healthy
                (:mod:`inspector.stats.nonfinite`).

        The defaults of ``mode``, ``worker`` and ``batch`` come from :meth:`view` (train, the
        default worker, every batch).

        Raises:
            UnknownTensorError: a tensor the catalog does not hold.
            UnknownGroupError: a group the run does not have.
            ValueError: an unknown mode.
            InspectorError: a worker or session that wrote nothing in this run.
        """
        return query.query_stats(self, tensors, steps, kinds, groups, columns, mode=mode,
                                 worker=worker, session=session, batch=batch, group=group,
                                 at_steps=at_steps, finite_part=finite_part)

    def query_stats_table(self, tensors: Iterable[str] | None = None,
                          steps: tuple[int, int] | None = None, kinds: Iterable[str] | None = None,
                          groups: Iterable[str] | None = None, columns: Sequence[str] | None = None,
                          *, mode: str | None = None, worker: str | None = None,
                          session: int | str | None = None, batch: int | None = None,
                          at_steps: Iterable[int] | None = None,
                          finite_part: bool = False) -> pa.Table:
        """Like :meth:`query_stats`, as an Arrow table."""
        return query.query_stats_table(self, tensors, steps, kinds, groups, columns, mode=mode,
                                       worker=worker, session=session, batch=batch,
                                       at_steps=at_steps, finite_part=finite_part)

    def stats_steps(self, kind: str = "forward", group: str = "all") -> np.ndarray:
        """The steps with statistics rows of (``kind``, ``group``) in this view: the steps of
        ``query_stats(kinds=[kind], groups=[group])``, read from a summarised part's summary,
        from four columns of other parts (FORMAT.md "Summaries"). Where a worker has several
        sessions of a mode, a later session wins each step it recorded (its ``forward`` /
        ``all`` steps, which every recorded step has), also where it has no row of this group.

        >>> run.stats_steps()[-1]   # the last statistics step  # doctest: +SKIP

        Returns:
            The steps, sorted (int64).
        """
        return query.stats_steps(self, kind, group)

    def _part_digest(self, worker: str, session: int, part: tuple) -> Digest | None:
        """The digest of ``part`` (:mod:`inspector.stats.digest`), read once per version of it;
        None if it cannot be read (its problem left for the full reader to report)."""
        return query.part_digest(self, worker, session, part)

    @staticmethod
    def to_pandas(table: pa.Table) -> pd.DataFrame:
        """A statistics table (:meth:`query_stats_table`) as :attr:`stats` shows it: names as
        categories, histograms as Arrow lists."""
        return query.to_pandas(table)

    _to_pandas = to_pandas  # the name this module's callers used

    def histogram(self, tensor: str, step: int, kind: str = "forward", group: str = "all", *,
                  mode: str | None = None, worker: str | None = None, session: int | None = None,
                  batch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The in-graph histogram of ``tensor`` at ``step``, in ``np.histogram``'s form (for
        plotting): equal-width bins in runs before format version 4; else the log-magnitude
        buckets and the gaps between them (:func:`inspector.stats.histograms.edges_and_counts`;
        :meth:`log_histogram` gives the buckets themselves). ``mode``, ``worker``, ``session``,
        ``batch``: as in :meth:`query_stats`.

        Returns:
            ``(edges, counts)``: numpy arrays, ``len(edges) == len(counts) + 1``.

        Raises:
            NoDumpError: no statistics of ``tensor`` at ``step`` (naming the nearest steps).
            InspectorError: rows of several workers or sessions: pass ``worker=`` (or
                ``session=``).
        """
        return query.histogram(self, tensor, step, kind, group, mode=mode, worker=worker,
                               session=session, batch=batch)

    def log_histogram(self, tensor: str, step: int, kind: str = "forward", group: str = "all", *,
                      mode: str | None = None, worker: str | None = None,
                      session: int | None = None, batch: int | None = None) -> LogHistogram:
        """The log-magnitude histogram of ``tensor`` at ``step``: its non-empty buckets and their
        counts (``.quantiles(q)``, ``.edges()``). Arguments as in :meth:`histogram`.

        Returns:
            An ``inspector.format.loghist.LogHistogram``.

        Raises:
            InspectorError: the row was written before format version 4 (equal-width bins:
                :meth:`histogram`), or as :meth:`histogram` raises.
            NoDumpError: as :meth:`histogram` raises.
        """
        return query.log_histogram(self, tensor, step, kind, group, mode=mode, worker=worker,
                                   session=session, batch=batch)

    def quantiles(self, tensor: str, steps: tuple[int, int] | None = None, kind: str = "forward",
                  group: str = "all", q: Sequence[float] = (0.0, 0.07, 0.16, 0.5, 0.84, 0.93, 1.0),
                  *, mode: str | None = None, worker: str | None = None,
                  session: int | str | None = None
                  ) -> pd.DataFrame:
        """Quantiles of ``tensor`` per statistics step, from the log-magnitude histograms.
        Each is within ``RELATIVE_ERROR`` (1/17, 5.9%) of the exact quantile (rank
        ``floor(q * (n - 1))``) of the values the histogram counts: every finite element, or
        for a tensor over the histogram's sample size its subsample (FORMAT.md, "Histograms").

        Example::

            run.quantiles("conv3/Relu:0", kind="gradient", group="negative", q=[0.5, 0.99])

        Args:
            steps: only the steps from ``steps[0]`` to ``steps[1]``, both included.
            q: the quantiles, each in [0, 1]; the default: TensorBoard's distribution bands
                (0, 7, 16, 50, 84, 93, 100 %).

        ``kind``, ``group``, ``mode``, ``worker``, ``session``: as in :meth:`query_stats`.

        Returns:
            One row per step (and batch, worker or session where the view holds several),
                columns ``q0.5`` etc.; ``attrs["relative_error"]`` states the bound.
        """
        return query.quantiles(self, tensor, steps, kind, group, q, mode=mode, worker=worker,
                               session=session)

    # ---- full dumps ----------------------------------------------------------------------
    @cached_property
    def _dump_files(self) -> list[DumpFile]:
        """Every dump file of the run, listed once per snapshot."""
        return read.dump_files(self)

    def dump_index(self, *, mode: str | None = None, worker: str | None = None,
                   session: int | str | None = None) -> dict[tuple[int, int], list[DumpFile]]:
        """The dump files of the chosen mode, workers and sessions (as in :meth:`query_stats`).

        Returns:
            ``{(step, batch): [DumpFile, ...]}``; a step two sessions of one worker dumped
                keeps the later session's (unless ``session=``).
        """
        return read.dump_index(self, mode=mode, worker=worker, session=session)

    @property
    def steps(self) -> list[int]:
        """Training steps with a full dump (default worker, sessions merged), sorted."""
        return self.dump_steps()

    def dump_steps(self, *, mode: str | None = None, worker: str | None = None,
                   session: int | str | None = None) -> list[int]:
        """Steps with a full dump of the chosen mode, worker and session (as in
        :meth:`query_stats`), sorted."""
        return read.dump_steps(self, mode=mode, worker=worker, session=session)

    def _dump(self, step: int, worker: str | None, mode: str | None = None,
              batch: int | None = None, session: int | str | None = None) -> DumpFile:
        """The one dump file of ``step`` in this view (:func:`inspector.dumps.read.dump_of`)."""
        return read.dump_of(self, step, worker, mode, batch, session)

    def check_dumps(self) -> int:
        """Read and check the header of every dump file (every session, worker and mode).

        Returns:
            How many are damaged (each is named in ``problems``).
        """
        return read.check_dumps(self)

    def _header(self, f: DumpFile) -> tuple[dict, int]:
        """(header, data start) of a dump file, read and checked once; aliases parsed with it."""
        return read.dump_header(self, f)

    def dump_keys(self, step: int, worker: str | None = None, *, mode: str | None = None,
                  batch: int | None = None, session: int | None = None) -> list[str]:
        """Keys held by the dump of ``step`` ('forward/<tensor>', 'gradient/<tensor>',
        'samples/...')."""
        return read.dump_keys(self, step, worker, mode=mode, batch=batch, session=session)

    def dump_array(self, step: int, key: str, worker: str | None = None, *, mode: str | None = None,
                   batch: int | None = None, session: int | None = None) -> np.ndarray:
        """Any array of the dump of ``step`` by key (see :meth:`dump_keys`), memory-mapped.
        ``worker``, ``mode``, ``batch``, ``session``: as in :meth:`query_stats`.

        Raises:
            NoDumpError: no dump at ``step`` (naming the nearest dumped steps), or it holds no
                ``key``.
            InspectorError: several writers dumped ``step``: pass ``worker=`` (and
                ``session=``).
            DamagedFileError: the dump file is damaged (also named in ``problems``).
        """
        return read.dump_array(self, step, key, worker, mode=mode, batch=batch, session=session)

    def tensor(self, name: str, step: int, kind: str = "forward", worker: str | None = None, *,
               mode: str | None = None, batch: int | None = None,
               session: int | None = None, sample: int | None = None) -> np.ndarray:
        """The dumped value (``kind="forward"``) or gradient of ``name`` at ``step``
        (memory-mapped).

        For a batched tensor only the samples kept by the sample budget are there, row ``i``
        being sample ``run.samples(step)["index"][i]``; ``sample=`` picks the row of one batch
        index. A tensor computed from the batch whose axis 0 is not it (catalog ``batched``
        false, ``batch_note`` says why) is stored whole. ``mode="eval"`` with ``batch=`` reads an
        evaluation's dumps (taken at global step ``step``); ``worker``, ``session``: as in
        :meth:`query_stats`.

        Raises:
            ValueError: ``kind`` is not one of ``KINDS``; ``sample=`` on a tensor stored whole
                (naming why), or not an int.
            UnknownTensorError: the catalog does not hold ``name``.
            NoDumpError: no dump at ``step``, or it does not hold ``name`` (naming the
                sessions whose dump does), or ``name`` has no gradient, or ``sample`` was not kept.
            InspectorError: several writers dumped ``step``: pass ``worker=``.
            DamagedFileError: the dump file is damaged.
        """
        return read.tensor(self, name, step, kind, worker, mode=mode, batch=batch, session=session,
                           sample=sample)

    def samples(self, step: int, worker: str | None = None, *, mode: str | None = None,
                batch: int | None = None, session: int | None = None, tower: str | None = None,
                tensor: str | None = None) -> pd.DataFrame:
        """The samples kept in the dump of ``step``. ``worker``, ``mode``, ``batch``,
        ``session``: as in :meth:`query_stats`.

        >>> run.samples(40, tensor="tower_1/conv1/Relu:0")   # doctest: +SKIP

        Args:
            tower: a tower's kept samples instead (the catalog's ``tower`` column; ``index`` is
                then a row of the tower's part of the batch).
            tensor: the samples of that tensor's dumped rows (its tower's, if it has one).

        Returns:
            One row per kept sample: worker, session (of the dump), index (in the batch),
                label and group (where the dump has them).

        Raises:
            ValueError: ``tensor`` is not per-sample (catalog ``batched`` false: it is dumped
                whole, its rows are no samples), or is not of ``tower``.
            NoDumpError: no dump at ``step``, or it holds no samples of ``tower``.
            DamagedFileError: the dump or its session's manifest is damaged.
        """
        return read.samples(self, step, worker, mode=mode, batch=batch, session=session,
                            tower=tower, tensor=tensor)

    def dump_metadata(self, step: int, worker: str | None = None, *, mode: str | None = None,
                      batch: int | None = None, session: int | None = None) -> dict:
        """The metadata strings of the dump of ``step`` (step, worker, session, mode,
        format_version, batch and what the hook adds); arguments as in :meth:`dump_array`."""
        return read.dump_metadata(self, step, worker, mode=mode, batch=batch, session=session)

    # ---- sizes and anomalies -------------------------------------------------------------
    def size_bytes(self) -> int:
        """Bytes on disk of every file of the run (a writer's temporary files excluded)."""
        if self.store.is_local:
            return sum(p.stat().st_size for p in self.path.rglob("*")
                       if p.is_file() and not is_temporary(p.name))
        return sum(e.size or 0 for sub in ("", "stats", "dumps") for e in self.store.list(sub)
                   if not is_temporary(e.name))

    def nonfinite_evidence(self, mode: str | None = None, worker: str | None = None) -> list[dict]:
        """Every first sighting of a NaN or Inf, ordered by step. The statistics and the hook's
        own checks can disagree (the loss check sees step 5 in ``loss:0``, statistics every 2
        steps see step 6 in a gradient): both are listed.

        Returns:
            Dicts, each with its ``step``, ``worker``, ``session`` and ``source``: the first
                (step, tensor, kind) whose statistics count one (``source`` 'statistics', with
                ``nan`` and ``inf``), and each session's own record from the hook (its every-step
                loss check, or its statistics check: the manifest's ``first_nonfinite``). A
                session's record at a step that a later session of its worker and mode ran again
                (a resume from an earlier checkpoint) has ``rerun_by``: that session, whose rows
                and dump the reader shows at that step.
        """
        found = []
        df = self._nonfinite_rows(mode, worker)
        if df is None:
            df = self.query_stats(groups=["all"], columns=["nan", "inf"], mode=mode, worker=worker)
        mode, worker, _ = self._where(mode, worker)
        bad = df[(df["nan"] > 0) | (df["inf"] > 0)] if not df.empty else df
        if not bad.empty:
            row = bad.sort_values(["step"], kind="stable").iloc[0]
            found.append({"step": int(row["step"]), "tensor": str(row["tensor"]),
                          "kind": str(row["kind"]), "nan": int(row["nan"]), "inf": int(row["inf"]),
                          "worker": str(row["worker"]),
                          "session": int(row["session"]), "source": "statistics"})
        workers = self._workers_for(worker, mode)
        spans = self.sessions
        for (w, s), m in self.manifests.items():
            rec = m.get("first_nonfinite")
            if w in workers and mode in (ALL, m["mode"]) and isinstance(rec, dict) \
                    and (w, s) not in self._hidden and isinstance(rec.get("step"), int) \
                    and not isinstance(rec.get("step"), bool):
                rec = {**rec, "worker": w, "session": s,
                       "source": str(rec.get("source", "loss check"))}
                later = spans[(spans["worker"] == w) & (spans["mode"] == m["mode"])
                              & (spans["session"] > s) & (spans["first_step"] <= rec["step"])
                              & (spans["last_step"] >= rec["step"])]
                # its step was run again: the reader's rows there are the later run's
                if len(later):
                    rec["rerun_by"] = int(later["session"].max())
                found.append(rec)
        return sorted(found, key=lambda r: r["step"])

    def _nonfinite_rows(self, mode: str | None, worker: str | None) -> pd.DataFrame | None:
        """The rows (group ``all``, columns nan, inf) that :meth:`nonfinite_evidence` judges, read
        only where the parts' summaries count a NaN/Inf
        (:func:`~inspector.stats.summary.nonfinite_bins`); every row with a NaN/Inf is among them,
        in the reader's order. None where that cannot be exact (read every row instead): one eval
        batch viewed, two sessions of one worker and mode (a later session's clean row may replace a
        step), a part that does not read."""
        from inspector.stats.summary import nonfinite_bins
        files = self._selected(self._stats_files, mode, worker, None)
        sessions = {(w, s) for w, s, _ in files}
        if self._where(mode, worker)[2] is not None or \
                len({(w, self._mode_of(w, s)) for w, s in sessions}) < len(sessions):
            return None
        columns = [*query.IDENTITY, "tensor", "kind", "group", "nan", "inf"]
        parts: dict[tuple[str, int], list[pa.Table]] = {}
        for w, s, p in files:
            bins = nonfinite_bins(self, p)
            if bins is None:   # no summary: the part's digest spans its rows with a NaN/Inf
                d = self._part_digest(w, s, p)
                if d is None:
                    return None
                bins = d.nonfinite
            if bins == []:
                continue  # its summary counts no NaN/Inf
            filters: list = [("group", "in", ["all"])]
            if bins is not None:
                filters += [("step", ">=", bins[0][0]), ("step", "<=", max(b for _, b in bins))]
            before = list(self.problems)
            t = self._read_part(w, s, p, columns, filters)
            if t is None:  # unreadable, or compacted away since listed: the full reader decides
                self.problems[:] = before
                return None
            if t.num_rows:
                parts.setdefault((w, s), []).append(t)
        query.save_digests(self)
        tables = [t for ts in query.latest_session_wins(parts).values() for t in ts]
        if not tables:
            return self._to_pandas(pa.table({}))
        return self._to_pandas(
            pa.concat_tables(tables, promote_options="permissive").select(columns))

    def first_nonfinite(self, mode: str | None = None, worker: str | None = None) -> dict | None:
        """Where the first NaN or Inf was born: the origin the statistics show
        (:func:`~inspector.graph.origin.nonfinite_origin`: the first op, in the graph's order,
        whose output, or the gradient it passed back, turned non-finite from finite inputs) at
        the first statistics step that counts one. Keys: ``step``, ``tensor``, ``kind``
        ('forward', or 'gradient' where the backward pass made it), ``op``, ``op_type``,
        ``layer``, ``where`` ('forward', 'backward', 'input' or 'weights': already non-finite,
        born in an earlier update), ``source`` (what saw it: 'statistics'), ``created_at`` (the
        user's source line), ``nan``, ``inf``, ``text`` (one sentence), and
        ``loss_check_step`` where the hook's every-step loss check saw a NaN/Inf earlier. Without
        a graph to walk, or statistics that saw none, the earliest evidence of
        :meth:`nonfinite_evidence` (``source`` 'loss check' where only the hook saw one). None
        if nothing saw one."""
        found = self.nonfinite_evidence(mode, worker)
        if not found:
            return None
        origin = self.nonfinite_origin(mode, worker, found)
        stats = next((e for e in found if e.get("source") == "statistics"), None)
        if origin is None or stats is None:
            return found[0]
        return {**stats, "tensor": origin.tensor,
                "kind": "gradient" if origin.where == "backward" else "forward",
                "op": origin.op, "op_type": origin.op_type, "layer": origin.layer,
                "where": origin.where, "created_at": origin.source, "nan": origin.nan,
                "inf": origin.inf, "text": origin.text(), "loss_check_step": origin.loss_check_step}

    def nonfinite_origin(self, mode: str | None = None, worker: str | None = None,
                         evidence: list[dict] | None = None) -> Any:
        """:func:`~inspector.graph.origin.nonfinite_origin` of this view (an ``Origin``, or
        None), computed once per snapshot of the run; ``evidence``: :meth:`nonfinite_evidence`'s,
        where the caller has it."""
        from inspector.graph.origin import nonfinite_origin
        key = (mode, worker)
        if key not in self._origins:
            self._origins[key] = nonfinite_origin(self, mode, worker, evidence)
        return self._origins[key]

    def icnn_layers(self) -> pd.DataFrame:
        """ICNN mask layers of the run, one row per layer, one column per role (tensor names)."""
        from .icnn.templates import icnn_layers  # numpy-only module
        return icnn_layers(self.tensors)


def _check_identity(m: dict, worker: str, session: int, path: Path | str) -> None:
    """DamagedFileError if the manifest names another writer than its file name does (the file
    name is what the reader trusts: other files of the session are located through it)."""
    for field, want in (("worker", worker), ("session", session if session else None)):
        if field in m and want is not None and m[field] != want:
            raise DamagedFileError(f"damaged manifest {path}: its {field} {m[field]!r} is not the "
                                   f"{want!r} its file name says")


def _upgrade_manifest(m: dict, worker: str, session: int) -> dict:
    """A manifest in the current shape: every caller key (its default where missing, see
    ``manifest_schema.CALLER_DEFAULTS``); version 1 ones get their session (0), mode and the
    aggregated ``dropped``/``errors`` records."""
    m = with_caller_defaults(m)
    m["worker"], m["session"] = worker, session
    if m.get("mode") not in MODES:
        m["mode"] = "train"
    if m.get("format_version", 1) < 2:
        m["dropped"] = [{"what": "dump", "reason": d.get("reason"), "count": 1,
                         "bytes": d.get("bytes", 0), "first_step": d.get("step"),
                         "last_step": d.get("step")}
                        for d in m.get("dropped") or [] if isinstance(d, dict)]
        m["errors"] = ([{"what": "writer", "reason": m["writer_error"], "count": 1}]
                       if m.get("writer_error") else [])
    if m.get("hook_error"):
        m["errors"] = [*m.get("errors", []),
                       {"what": "hook", "reason": m["hook_error"], "count": 1}]
    return m


def parse_steps(spec: str | None) -> tuple[int, int] | None:
    """Alias of ``inspector.format.steps.parse_step_range`` (the one step grammar); None or '' ->
    None."""
    from inspector.format.steps import parse_step_range
    return parse_step_range(spec) if spec else None


__all__ = ["Run", "open_run", "find_runs", "is_run", "parse_steps", "GROUPS", "safe_join"]
