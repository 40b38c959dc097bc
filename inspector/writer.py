"""Background writer of one writer session in a run directory: bounded queues, background
threads, atomic files.

The training loop only enqueues numpy arrays; background threads turn them into Parquet parts
and safetensors files. A dump that would overflow the queue or the byte budget is dropped and
recorded in the manifest instead of blocking training. A file that fails to write (a full
disk) is recorded as dropped with its reason; later files are still tried, after a back-off
that grows while errors persist (FORMAT.md, "Write errors").

Each writer is one session: it takes its worker's lock (``inspector.sessions.lease``), gets the next
session number, and writes only files named for that session, so a run directory accumulates
over reruns, evaluations and resumes and no writer touches another's files.

Its settings (budgets, queue, flushes, durability, storage, compaction) are ``WriterOptions``
(``inspector.options``), given as keywords or as ``options=``.

Example (TensorFlow-free; the hook does this for you)::

    w = RunWriter("runs/x", manifest={"tensors": [...]}, stats_layout=layout, fsync=True)
    w.add_stats(10, values, hist)   # hist: (splits, index, count), loghist's sparse rows
    w.add_dump(100, {"forward/conv1/Relu:0": array})
    w.close()
"""
from __future__ import annotations

import atexit
import errno as _errno
import functools
import logging
import os
import queue
import socket
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from inspector.dumps import files as safetensors_io
from inspector.format import (FORMAT_NAME, FORMAT_VERSION, HEARTBEAT_SECS, MODES, STAT_COLUMNS,
                              TOOL_VERSION, check_worker, dump_name, graph_name, manifest_name,
                              stats_name)
from inspector.format.loghist import MAX_INDEX, concat_rows, rows_of
from inspector.format.manifest import WRITER_KEYS, with_caller_defaults
from inspector.sessions.crosscheck import encode_dumps
from inspector.sessions.lease import Claim, LeaseLostError
from inspector.sessions.liveness import now_iso
from inspector.stats.merge import LevelMerger
from inspector.stats.parts import COMPACT_ROWS, Compactor, parquet_options
from inspector.storage.atomic import json_bytes
from inspector.storage.spill import SPILL_BYTES, Spill, spill_folder

from .errors import StorageError
from .options import WriterOptions, options_keywords
from .storage import Storage, normalize, open_storage

log = logging.getLogger("tf_inspector")

#: Statistics rows kept in memory (queued for the writer thread, and buffered while their part
#: cannot be written); beyond this the oldest are dropped (and recorded), so a long disk
#: outage cannot exhaust memory. On an object store parts that fail go to the spill on local
#: disk instead (``inspector.storage.spill``).
MAX_BUFFERED_ROWS = 1_000_000
#: seconds between two calls of a writer's ``owner_gone`` (a frame walk of one thread: microseconds)
OWNER_CHECK_SECS = 2.0
#: Back-off after a failed write: BACKOFF_SECS, doubling per consecutive failure of that kind
#: of file (dump, stats), at most MAX_BACKOFF_SECS; dumps queued meanwhile are dropped and
#: recorded, statistics are kept and retried.
BACKOFF_SECS = 0.5
MAX_BACKOFF_SECS = 60.0
#: Distinct (what, reason) records kept in ``dropped`` / ``errors``; more are counted under
#: one "other" record, so the manifest stays small however long the run.
MAX_RECORDS = 50
#: A local session's reserve beyond twice its first manifest (``RunWriter._make_reserve``):
#: room for the records (50 dropped, 50 errors) the final manifest adds on a full disk.
RESERVE_BYTES = 64 << 10


@dataclass(frozen=True)
class StatsLayout:
    """What each row of a statistics matrix holds: tensor, kind and group, row by row."""
    tensors: tuple[str, ...]
    kinds: tuple[str, ...]
    groups: tuple[str, ...]

    def __post_init__(self) -> None:
        if not len(self.tensors) == len(self.kinds) == len(self.groups):
            raise ValueError("tensors, kinds and groups must have one entry per row")


@dataclass
class _Stats:
    """One step's statistics as a part holds them: the rows it writes, checked and converted."""
    step: int
    batch: int
    rows: np.ndarray        # int [K]: the layout's rows written (``keep``)
    values: np.ndarray      # float64 [K, len(STAT_COLUMNS)]
    # int64 [K + 1]: row k's buckets are index/count[splits[k]:splits[k + 1]]
    splits: np.ndarray
    index: np.ndarray       # int16 [N]: log-magnitude bucket indices (inspector/format/loghist.py)
    count: np.ndarray       # int32 [N]


@dataclass
class _Fetched:
    """One step's statistics as the hook's graph returned them: ``parts``, each (values, splits,
    index, count), whose rows follow one another in the layout's order. Joined and checked on the
    writer thread (``_Stats``), so the training thread pays no numpy call per part."""
    step: int
    batch: int
    parts: tuple
    keep: np.ndarray | None
    rows: range             # as many as the rows written: what the inbox's bound counts
    layout_rows: np.ndarray | None   # the layout's rows the parts hold (None: all, in order)


@dataclass
class _Dump:
    step: int
    batch: int | None
    data: safetensors_io.Encoded

    @property
    def nbytes(self) -> int:
        return self.data.size


class Tally:
    """Aggregated records for the manifest: one per (what, reason), with a count, bytes and the
    first/last steps and times, so a long run of drops or errors does not grow the manifest."""

    def __init__(self, limit: int = MAX_RECORDS) -> None:
        self.limit = limit
        self._records: dict[tuple[str, str], dict] = {}

    def add(self, what: str, reason: str, step: int | None = None, nbytes: int = 0) -> bool:
        """Count one event; True if it is the first with this (what, reason)."""
        key = (what, reason)
        if key not in self._records and len(self._records) >= self.limit:
            key = (what, "other reasons (too many distinct ones to list)")
        r = self._records.get(key)
        first = r is None
        if r is None:
            r = self._records[key] = {"what": what, "reason": key[1], "count": 0, "bytes": 0,
                                      "first_step": step,
                                      "last_step": step, "steps": [], "first_time": now_iso()}
        r["count"] += 1
        r["bytes"] += int(nbytes)
        r["last_time"] = now_iso()
        if step is not None:
            r["first_step"] = step if r["first_step"] is None else min(r["first_step"], step)
            r["last_step"] = step if r["last_step"] is None else max(r["last_step"], step)
            if len(r["steps"]) < 10:
                r["steps"].append(int(step))
        return first

    def records(self) -> list[dict]:
        """The records as the manifest keeps them (copies)."""
        return [dict(r, steps=list(r["steps"])) for r in self._records.values()]

    def count(self) -> int:
        """The events counted, over every record."""
        return sum(r["count"] for r in self._records.values())


@dataclass
class WriterState:
    """What a session has written and lost so far: the manifest's totals and records."""
    bytes_before: int = 0   # the run's bytes when this session began: the byte budget counts them
    bytes_written: int = 0
    dumps: int = 0
    stats_rows: int = 0
    first_step: int | None = None
    last_step: int | None = None
    dropped: Tally = field(default_factory=Tally)
    errors: Tally = field(default_factory=Tally)
    # (step, batch) of each dump written
    written: list[tuple[int, int | None]] = field(default_factory=list)

    def saw(self, step: int) -> None:
        """Widen the session's step range to ``step``."""
        self.first_step = step if self.first_step is None else min(self.first_step, step)
        self.last_step = step if self.last_step is None else max(self.last_step, step)


def describe_error(e: BaseException) -> str:
    """A reason that is the same for the same error on different files (so drops aggregate)."""
    if isinstance(e, StorageError) and e.cause:
        return f"StorageError: {e.cause}"  # without the file's URL: one outage is one record
    if isinstance(e, OSError) and e.errno is not None:
        return (f"{type(e).__name__}: [Errno {e.errno}] "
                f"{e.strerror or _errno.errorcode.get(e.errno, '')}")
    return f"{type(e).__name__}: {e}"


class _Inbox(queue.Queue):
    """The writer thread's queue (statistics, manifest updates, close). ``put`` never blocks:
    the training thread must not wait while the writer thread waits on a slow or hanging store
    (a bounded queue that filled blocked a training step for a minute). The statistics it holds
    and those the writer buffers (``held()``) are bounded by MAX_BUFFERED_ROWS: beyond it the
    oldest queued step is dropped and passed to ``on_drop``."""

    def __init__(self, held: Callable[[], int], on_drop: Callable[[Any], None]) -> None:
        super().__init__()   # unbounded: the rows are the bound
        self.rows = 0
        self._held, self._on_drop = held, on_drop
        self._dropped: list[Any] = []

    def _put(self, item: Any) -> None:   # under self.mutex
        self.queue.append(item)
        rows = getattr(item, "rows", None)
        if rows is None:
            return
        self.rows += len(rows)
        while self.rows + self._held() > MAX_BUFFERED_ROWS:
            old = next((x for x in self.queue
                        if getattr(x, "rows", None) is not None and x is not item), None)
            if old is None:
                break
            self.queue.remove(old)
            self.rows -= len(old.rows)
            self._dropped.append(old)

    def _get(self) -> Any:
        item = self.queue.popleft()
        if getattr(item, "rows", None) is not None:
            self.rows -= len(item.rows)
        return item

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        super().put(item, block=False)
        with self.mutex:
            dropped, self._dropped = self._dropped, []
        for old in dropped:
            self._on_drop(old)


#: Writers of this process not yet closed: closed as 'failed' at interpreter exit.
_OPEN: "weakref.WeakSet[RunWriter]" = weakref.WeakSet()


@atexit.register
def _close_open_writers() -> None:
    for w in list(_OPEN):
        w.close("failed", error="the process exited before the session ended (DumpHook.end() or "
                                "the Keras callback's on_train_end was not called: an exception in "
                                "training or in another callback)", timeout=30)


@functools.lru_cache(maxsize=4)
def _static_columns(lay: StatsLayout) -> dict[str, pa.Array]:
    """The tensor, kind and group columns of every statistics part (dictionary-encoded; arrow
    arrays are immutable, so sessions with the same layout, e.g. each ``fit``, share them)."""
    return {name: pa.array(list(values)).dictionary_encode()
            for name, values in (("tensor", lay.tensors), ("kind", lay.kinds),
                                 ("group", lay.groups))}


def _check_session(mode: str, manifest: Mapping[str, Any]) -> None:
    """ValueError unless ``mode`` is one of MODES and ``manifest`` holds only the caller's keys."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} must be one of {MODES}")
    overridden = sorted(set(manifest) & set(WRITER_KEYS))
    if overridden:
        raise ValueError(f"manifest keys {overridden} are the writer's own "
                         f"(manifest_schema.WRITER_KEYS): pass only the caller's "
                         f"(manifest_schema.CALLER_DEFAULTS) and extra keys")


#: ``RunWriter.__init__`` takes its settings as keywords or as ``options=``, not both
_takes_options = options_keywords(WriterOptions, "an inspector.options.WriterOptions")


class RunWriter:
    """One writer session's files in a run directory, written from background threads: one for
    statistics and the manifest (in order), ``dump_threads`` for full dumps. Its settings come
    as keywords or as ``options=WriterOptions(...)`` (``inspector.options``), not both."""

    @_takes_options
    def __init__(self, run_dir: str | Path | Storage, *, worker: str = "chief",
                 manifest: Mapping[str, Any], stats_layout: StatsLayout | None = None,
                 graph_def: bytes | None = None, mode: str = "train",
                 owner_gone: Callable[[], str | None] | None = None,
                 options: WriterOptions | None = None,
                 # the settings as keywords (WriterOptions documents them): _takes_options
                 # gathers them into options=, which is what the body reads
                 max_bytes: int | float | None = None, queue_size: int = 8, dump_threads: int = 2,
                 stats_flush_secs: float = 10.0, heartbeat_secs: float = HEARTBEAT_SECS,
                 fsync: bool = False, strict: bool = False,
                 storage_options: Mapping[str, Any] | None = None, filesystem: Any = None,
                 timeout: float | None = None, spill_bytes: int = SPILL_BYTES,
                 compact_rows: int | None = COMPACT_ROWS,
                 format_version: int = FORMAT_VERSION) -> None:
        """Open a new session of ``worker`` in ``run_dir``: take the worker's lock (the next
        session number), write the graph and the first manifest, start the writer thread.

        Args:
            run_dir: a folder, or an fsspec URL (``s3://bucket/runs/exp1``; each file is then
                one object, written whole: ``inspector.storage``).
            worker: this writer's name in the run's file names.
            manifest: the caller's manifest keys (``inspector.format.manifest.CALLER_DEFAULTS``)
                and extra ones; the writer adds its own (``WRITER_KEYS``).
            stats_layout: what each row of ``add_stats``' matrices holds; None: dumps only.
            graph_def: a serialized GraphDef, written as the session's graph file.
            mode: ``train``, ``eval`` or ``predict``.
            owner_gone: called on the writer thread every ``OWNER_CHECK_SECS``: None while what
                writes this session still runs, else why not; the session then ends as failed
                with that error (Keras skips ``on_train_end`` after a fit that raised).
            options: the settings; or give them as keywords (``WriterOptions`` documents each).

        Raises:
            ValueError: a bad ``mode`` or setting, or a manifest key the writer writes itself.
            TypeError: a setting given both as a keyword and in ``options=``.
            inspector.sessions.lease.RunLockedError: a live writer holds ``worker`` in
                ``run_dir``.
        """
        self.options = opts = cast(WriterOptions, options)   # _takes_options resolved it
        _check_session(mode, manifest)
        self.run_dir = normalize(run_dir)
        self.store = open_storage(self.run_dir, opts.storage_options, opts.filesystem,
                                  timeout=opts.timeout)
        self.worker, self.mode, self.layout = check_worker(worker), mode, stats_layout
        self._owner_gone = owner_gone
        self._claim_session()
        try:
            self._make_queues()
            self._make_stats_path()
            self._manifest = self._first_manifest(manifest)
            self._write_first_files(graph_def)
            self._reserve = self._make_reserve()
        except BaseException:
            self.claim.release()
            raise
        self._start()

    def _queue_dropped(self, item: _Stats | _Fetched) -> None:
        """A step's statistics the full inbox dropped (``_Inbox``): recorded."""
        self.record_drop(item.step, "statistics queue full while the writer waited on storage",
                         what="stats")

    def _claim_session(self) -> None:
        """Take the worker's lock, and with it the session number and the run's bytes so far."""
        self.claim = Claim.take(self.store, self.worker, self.options.heartbeat_secs)
        self.session = self.claim.session
        self.state = WriterState(bytes_before=self.claim.bytes_before)
        self.claim.on_event = self._lock_event
        self._last_manifest = self._last_owner_check = time.monotonic()

    def _make_queues(self) -> None:
        """What the training thread hands work over with: queues that never block it."""
        self.error: BaseException | None = None  # the last write error (strict mode raises it)
        self.closed = False
        self._close_lock = threading.Lock()
        # statistics, manifest updates, close: put() never blocks the training thread
        self._queue: queue.Queue = _Inbox(lambda: self._buffered_rows, self._queue_dropped)
        # full dumps, for the dump threads
        self._dumps: queue.Queue = queue.Queue(maxsize=self.options.queue_size)
        self._pending_bytes = 0
        # (step, batch) of every dump queued: a second of the same step would have replaced the
        # first file while the manifest counted both (a step that did not advance)
        self._dumped: set[tuple[int, int | None]] = set()
        self._lock = threading.Lock()
        self._manifest_lock = threading.Lock()
        self._backoff: dict[str, tuple[int, float]] = {}  # what -> (consecutive failures, retry at)

    def _make_stats_path(self) -> None:
        """Where statistics wait and go: the buffer, the spill, the parts and their compaction."""
        opts = self.options
        # one step's arrays each, turned into Arrow columns at the flush, all steps at once: the
        # conversion's fixed cost per call is paid once per part, not once per step
        self._stats_buffer: list[_Stats] = []
        self._buffered_rows = 0
        self._spill = None if self.store.is_local else \
            Spill(spill_folder(self.store.display(), self.worker, self.session), opts.spill_bytes)
        self._last_flush = time.monotonic()
        self._seq = 0
        # on an object store too: the compacted part is one object written whole, then the small
        # parts are deleted (no rename needed; the reader skips parts a compacted one contains).
        # Levels and summaries (stats_merge) on local run directories only.
        local = Path(self.store.display()) if self.store.is_local else None
        levels = LevelMerger(local, self.worker, self.session, opts.fsync) if local else None
        self._compactor = Compactor(self.store, self.worker, self.session, opts.compact_rows,
                                    opts.fsync, guard=self.claim.ensure, after=levels,
                                    on_error=lambda e: self._failed("compaction", e, drop=False))
        # the tensor/kind/group columns, the same for every statistics step (none without a layout)
        lay = self.layout
        self._static = _static_columns(lay) if lay else {}
        self._group_rows = np.array([g != "all" for g in (lay.groups if lay else ())], bool)

    def _first_manifest(self, caller: Mapping[str, Any]) -> dict[str, Any]:
        """The manifest as the session begins: the writer's keys, then the caller's."""
        return {
            "format": FORMAT_NAME, "format_version": self.options.format_version,
            "tool_version": TOOL_VERSION, "worker": self.worker, "session": self.session,
            "mode": self.mode, "created": now_iso(), "updated": now_iso(), "status": "running",
            "host": socket.gethostname(), "pid": os.getpid(),
            "heartbeat_secs": self.options.heartbeat_secs, "graph_bytes": None,
            **with_caller_defaults(caller),
        }

    def _write_first_files(self, graph_def: bytes | None) -> None:
        """The folders, the graph (if any) and the first manifest."""
        self.store.makedirs("stats")
        self.store.makedirs("dumps")
        if graph_def is not None:
            name = graph_name(self.worker, self.session)
            self.state.bytes_written += self.store.write(name, [graph_def], fsync=True)
            self._manifest["graph_bytes"] = len(graph_def)   # the reader checks it is there
        self._write_manifest()

    def _start(self) -> None:
        """Start the writer thread. The dump threads start at the first dump: most sessions (a
        fit at the defaults) write none, and a thread's start waits for the busy training
        process to schedule it."""
        self._dump_thread_count = self.options.dump_threads
        self._dump_threads: list[threading.Thread] = []
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"tf-inspector-writer-{self.worker}-s{self.session}")
        self._thread.start()
        _OPEN.add(self)

    # ---- called from the training loop -------------------------------------------------
    def add_stats(self, step: int, values: np.ndarray,
                  hist: tuple[np.ndarray, np.ndarray, np.ndarray], batch: int = 0,
                  keep: np.ndarray | None = None) -> None:
        """Queue one step's statistics; never blocks (see ``_Inbox``).

        Args:
            step: the global step.
            values: [R, 9] in STAT_COLUMNS order, one row per row of the ``stats_layout``.
            hist: the R rows' log-magnitude histograms as (splits [R + 1], bucket index [N],
                count [N]) (``inspector.format.loghist``).
            batch: the batch index within an evaluation or prediction (0 in training).
            keep: bool [R], the layout's rows to write (None: all).

        Raises:
            ValueError: the writer has no ``stats_layout``, or the arrays do not fit it
                (naming what does not).
            RuntimeError: ``strict`` is set and an earlier write failed.
        """
        self._raise_if_strict()
        if self.layout is None:
            raise ValueError("this RunWriter has no stats_layout: pass stats_layout= to write "
                             "statistics")
        item = self._checked_stats(int(step), int(batch), values, hist, keep)
        if not self.closed:
            self.state.saw(int(step))
            self._queue.put(item)

    def add_fetched_stats(self, step: int, parts, batch: int = 0, keep: np.ndarray | None = None,
                          rows: np.ndarray | None = None) -> None:
        """Queue one step's statistics as a graph returned them, for the writer thread to join
        and check: ``parts`` is a sequence of (values, splits, index, count), each as ``add_stats``
        takes them, whose rows follow one another in the layout's order. Never blocks, and costs
        the training thread no numpy call: a step that does not fit the layout is recorded as a
        write error of that step (``manifest.errors``, ``dropped``) on the writer thread instead of
        raised here (``add_stats`` checks on the caller's thread). ``rows``: the layout's rows
        the parts hold, in order (None: every row); ``keep`` then masks those."""
        self._raise_if_strict()
        if self.layout is None:
            raise ValueError("this RunWriter has no stats_layout: pass stats_layout= to write "
                             "statistics")
        if not self.closed:
            self.state.saw(int(step))
            n = len(self.layout.tensors) if rows is None else len(rows)
            held = range(n) if keep is None else range(int(keep.sum()))
            self._queue.put(_Fetched(int(step), int(batch), tuple(parts), keep, held, rows))

    def _joined(self, item: _Fetched) -> _Stats | None:
        """The fetched parts as one checked step (None: recorded as a write error)."""
        try:
            parts = item.parts
            values, *hist = concat_rows(parts) if len(parts) > 1 else parts[0]
            return self._checked_stats(item.step, item.batch, values, hist, item.keep,
                                       item.layout_rows)
        except (ValueError, TypeError, IndexError) as e:
            # recorded as a failed file is, without the storage back-off: no write failed
            reason = describe_error(e)
            with self._lock:
                first = self.state.errors.add("stats", reason, item.step)
                self.state.dropped.add("stats", f"write error: {reason}", item.step)
            self.error = e   # strict=True raises it from the next call
            if first:
                log.error("tf_inspector: the statistics of step %d do not fit the run's layout "
                          "(%s); recorded in the manifest", item.step, reason)
            return None

    def _checked_stats(self, step: int, batch: int, values, hist, keep,
                       layout_rows: np.ndarray | None = None) -> _Stats:
        """The step as a part will hold it; ValueError naming what does not fit the layout's
        rows and the columns' types. Why here: the writer builds a part from many steps at
        once, and one malformed step must not lose the others."""
        assert self.layout is not None   # add_stats refused a writer without one
        n = len(self.layout.tensors) if layout_rows is None else len(layout_rows)

        def array(name: str, given: Any, dtype: Any, shape: tuple | None = None) -> np.ndarray:
            try:
                a = np.asarray(given, dtype)
            except (TypeError, ValueError) as e:
                raise ValueError(f"statistics of step {step}: {name} is not {np.dtype(dtype).name} "
                                 f"({e})") from None
            if (shape is not None and a.shape != shape) or (shape is None and a.ndim != 1):
                raise ValueError(f"statistics of step {step}: {name} has shape {a.shape}, the "
                                 f"layout needs {shape or '(N,)'}")
            return a

        try:
            splits, index, count = hist
        except (TypeError, ValueError):
            raise ValueError(f"statistics of step {step}: hist must be (splits, index, count), "
                             f"got {type(hist).__name__}") from None
        got = array("values", values, np.float64, (n, len(STAT_COLUMNS)))
        splits = array("hist splits", splits, np.int64, (n + 1,))
        index, count = array("hist index", index, np.int64), array("hist count", count, np.int64)
        if splits[0] != 0 or np.any(np.diff(splits) < 0) or splits[-1] != len(index) \
                or len(count) != len(index):
            raise ValueError(f"statistics of step {step}: hist splits must rise from 0 to the "
                             f"{len(index)} buckets (with as many counts, got {len(count)}), got "
                             f"{splits[:3].tolist()}...{splits[-1:]}")
        if len(index) and (np.abs(index).max() > MAX_INDEX or count.min() < 0
                           or count.max() > np.iinfo(np.int32).max):
            raise ValueError(f"statistics of step {step}: hist buckets must lie in "
                             f"-{MAX_INDEX}..{MAX_INDEX} with counts in 0..2**31-1 "
                             "(inspector/format/loghist.py)")
        rows = np.arange(n) if keep is None else np.flatnonzero(array("keep", keep, np.bool_, (n,)))
        if keep is not None:
            splits, index, count = rows_of(splits, index, count, rows=rows)
            got = got[rows]
        if layout_rows is not None:
            rows = np.asarray(layout_rows, np.int64)[rows]
        return _Stats(step, batch, rows, got, splits, index.astype(np.int16),
                      count.astype(np.int32))

    def add_dump(self, step: int, arrays: Mapping[str, np.ndarray],
                 metadata: Mapping[str, str] | None = None, batch: int | None = None) -> bool:
        """Queue a full dump, unless a full queue, the byte budget or a back-off drops it.

        Args:
            step: the global step.
            arrays: the dump's arrays by key (``forward/<tensor>``, ``gradient/<tensor>``,
                ``samples/...``: FORMAT.md).
            metadata: strings added to the file's metadata.
            batch: the batch index within an evaluation or prediction (None in training).

        Returns:
            False if it was dropped (the reason is recorded in the manifest's ``dropped``).

        Raises:
            RuntimeError: ``strict`` is set and an earlier write failed.
        """
        self._raise_if_strict()
        if (int(step), batch) in self._dumped:
            self.state.saw(int(step))
            self.record_drop(step, "a dump of this step is already in this session (the step did "
                                   "not advance between the two: gradient accumulation, a "
                                   "loss-scale optimizer's skipped step)")
            return False
        # Encoded here, once: the file's exact size, so the budget bounds what lands on disk.
        meta = {"step": str(step), "worker": self.worker, "session": str(self.session),
                "mode": self.mode, "format_version": str(self._manifest["format_version"]),
                **({"batch": str(batch)} if batch is not None else {}),
                **(metadata or {})}
        data = safetensors_io.Encoded(arrays, meta)
        nbytes = data.size
        self.state.saw(int(step))
        reason = self._drop_reason(nbytes)
        if reason:
            self.record_drop(step, reason, nbytes)
            return False
        with self._lock:
            self._pending_bytes += nbytes
            self._start_dump_threads()
        try:
            self._dumps.put_nowait(_Dump(int(step), batch, data))
        except queue.Full:
            with self._lock:
                self._pending_bytes -= nbytes
            self.record_drop(step, "writer queue full (disk slower than dumps)", nbytes)
            return False
        self._dumped.add((int(step), batch))
        return True

    def would_drop(self, nbytes: int) -> str | None:
        """Why a dump of ``nbytes`` would be dropped now, or None. Lets the hook skip the fetch."""
        if self._dumps.full():
            return "writer queue full (disk slower than dumps)"
        return self._drop_reason(nbytes)

    def record_drop(self, step: int | None, reason: str, nbytes: int = 0,
                    what: str = "dump") -> None:
        """Record that a ``what`` (dump or stats) of ``step`` was not written, and why."""
        with self._lock:
            self.state.dropped.add(what, reason, None if step is None else int(step), nbytes)

    def update_manifest(self, **fields: Any) -> None:
        """Merge ``fields`` into the manifest; written by the thread (in order with the data)."""
        if not self.closed:
            self._queue.put(("manifest", fields))

    def flush_stats(self, timeout: float | None = None) -> bool:
        """Write the statistics queued so far as a part now, on the writer thread, instead of at
        the next ``stats_flush_secs``: a benchmark's timed block then pays for its own part, not
        for one a timer writes during a later block. Whether it was done within ``timeout``
        (False on a closed writer, or one whose thread has ended: nothing would write it)."""
        if self.closed:
            return False
        done = threading.Event()
        self._queue.put(("flush", done))
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done.wait(0.05):
            if not self._thread.is_alive() or (deadline is not None
                                               and time.monotonic() >= deadline):
                return done.is_set()
        return True

    def close(self, status: str = "finished", timeout: float | None = None,
              error: str | None = None) -> None:
        """Flush everything, write the final manifest, stop the threads, release the lock. Safe
        to call twice and from two threads: the first call's status wins, and every call
        returns once the session has ended (or ``timeout``).

        Args:
            status: the session's final status, ``finished`` or ``failed``.
            timeout: seconds to wait for the writer thread (None: until it ends).
            error: why the session failed (the manifest's ``error``).

        Raises:
            RuntimeError: ``strict`` is set and a write failed.
        """
        with self._close_lock:
            first, self.closed = not self.closed, True
        if first:
            _OPEN.discard(self)
            self._queue.put(("close", status, error))
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        if first:
            self._raise_if_strict()

    # ---- the threads -----------------------------------------------------------------------
    def _drop_reason(self, nbytes: int) -> str | None:
        if self.closed:
            return "writer closed"
        retry = self._backing_off("dump")
        if retry:
            return retry
        with self._lock:
            total = (self.state.bytes_before + self.state.bytes_written + self._pending_bytes
                     + nbytes)
        if self.options.max_bytes is not None and total > self.options.max_bytes:
            return f"byte budget max_bytes={self.options.max_bytes} would be exceeded"
        return None

    def _backing_off(self, what: str) -> str | None:
        failures, retry_at = self._backoff.get(what, (0, 0.0))
        if failures and time.monotonic() < retry_at:
            return f"writer backing off after {failures} failed {what} write(s)"
        return None

    def _succeeded(self, what: str) -> None:
        self._backoff.pop(what, None)

    def _failed(self, what: str, e: BaseException, step: int | None = None, nbytes: int = 0,
                drop: bool = True) -> None:
        """One file failed: record it (dropped, errors), back off, training goes on."""
        reason = describe_error(e)
        failures = self._backoff.get(what, (0, 0.0))[0] + 1
        self._backoff[what] = failures, time.monotonic() + min(MAX_BACKOFF_SECS,
                                                               BACKOFF_SECS * 2 ** (failures - 1))
        with self._lock:
            first = self.state.errors.add(what, reason, step, nbytes)
            if drop:
                self.state.dropped.add(what, f"write error: {reason}", step, nbytes)
        self.error = e
        if isinstance(e, LeaseLostError) and threading.current_thread() is not self._thread:
            self._queue.put(("wake",))  # the writer thread ends the session (_ended_by_lease)
        if first:
            log.error("tf_inspector: writing a %s of %s failed (%s); recorded in the manifest, "
                      "later files are still tried. Training continues.", what, self.run_dir,
                      reason)

    def _loop(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=self._wait())
            except queue.Empty:
                item = None
            if isinstance(item, tuple) and item[0] == "close":
                self._finish(item[1], item[2])
                return
            try:
                self._handle(item)
            except BaseException as e:  # the writer must never take training down
                self._failed("manifest", e, drop=False)
            if self._ended_by_lease() or self._ended_by_owner():
                return

    def _lock_event(self, text: str) -> None:
        """What the claim did to the lock (recreated it, lost it): recorded in ``errors``."""
        with self._lock:
            self.state.errors.add("lock", text)

    def _ended_by_lease(self) -> bool:
        """End the session as failed once another writer holds its lock (``claim.lost``): it
        writes nothing more, its own manifest last (no other writer writes that file)."""
        if self.claim.lost is None:
            return False
        with self._close_lock:
            if self.closed:   # a close() is queued: it ends the session, as failed (_finish)
                return False
            self.closed = True
        log.error("tf_inspector: session %d of %s ended: %s", self.session, self.run_dir,
                  self.claim.lost)
        try:
            self._finish("failed", None)
        finally:
            _OPEN.discard(self)
        return True

    def _ended_by_owner(self) -> bool:
        """End the session as failed if ``owner_gone`` says its owner stopped without closing it."""
        if self._owner_gone is None or time.monotonic() - self._last_owner_check < OWNER_CHECK_SECS:
            return False
        self._last_owner_check = time.monotonic()
        try:
            why = self._owner_gone()
        except Exception as e:  # noqa: BLE001 - a failing check must not end a live session
            log.debug("tf_inspector: owner check of %s failed: %s", self.run_dir, e)
            return False
        if why is None:
            return False
        with self._close_lock:
            if self.closed:   # a close() is queued: it ends the session with its own status
                return False
            self.closed = True
        log.warning("tf_inspector: session %d of %s ended as failed: %s", self.session,
                    self.run_dir, why)
        try:
            self._drain()   # what the owner queued before it went: its rows are written too
            self._finish("failed", why)
        finally:
            # only now: an interpreter exit meanwhile must wait for this end (atexit's close joins
            # this thread), not kill the daemon thread halfway (the session read "running")
            _OPEN.discard(self)
        return True

    def _drain(self) -> None:
        """Handle every item already queued, so that a session ended by the owner check loses
        no statistics still in the queue."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if not (isinstance(item, tuple) and item[0] == "close"):
                try:
                    self._handle(item)
                except BaseException as e:  # the writer must never take training down
                    self._failed("manifest", e, drop=False)

    def _finish(self, status: str, error: str | None) -> None:
        """Close: every queued dump, the last statistics, the final manifest, the lock."""
        try:
            self._stop_dump_threads()
            self._flush_stats(final=True)
            self._compactor.finish()
            if self.claim.lost:   # whatever the caller said: this session stopped early
                status, error = "failed", "; ".join(x for x in (error, self.claim.lost) if x)
            self._manifest["status"] = status
            if error:
                self._manifest["error"] = error
            try:
                self._write_manifest()
            except OSError as e:
                if e.errno not in (_errno.ENOSPC, _errno.EDQUOT) or not self._free_reserve():
                    raise
                self._write_manifest()   # in the space the reserve held
        except BaseException as e:
            self._failed("manifest", e, drop=False)
            log.error("tf_inspector: could not write the final manifest of %s: %s", self.run_dir,
                      describe_error(e))
        finally:
            self._free_reserve()
            self.claim.release()
            self._owner_gone = None   # it may hold the owner's frame

    def _make_reserve(self) -> Path | None:
        """A local session's reserve: a temporary file of twice the manifest's size (and
        RESERVE_BYTES more: the records it gathers), deleted to make room for the final
        manifest on a full disk, so the run still says how the session ended and what it
        lost (without it, a full disk kept the first manifest: "running", then "crashed").
        Named as a temporary file: readers skip it, the worker's next session deletes it
        after a crash. None where it cannot be made (an object store, a disk already full)."""
        if not self.store.is_local:
            return None
        path = (Path(self.store.display())
                / f".{manifest_name(self.worker, self.session)}.reserve.tmp")
        size = 2 * self._manifest_bytes + RESERVE_BYTES
        try:
            with open(path, "wb") as f:
                try:   # blocks allocated, none written (a truncated, sparse file would hold none)
                    os.posix_fallocate(f.fileno(), 0, size)
                except (AttributeError, OSError) as e:   # no fallocate here: zeros written
                    if isinstance(e, OSError) and e.errno in (_errno.ENOSPC, _errno.EDQUOT):
                        raise
                    f.write(bytes(size))
            return path
        except OSError:
            path.unlink(missing_ok=True)
            return None

    def _free_reserve(self) -> bool:
        """Delete the reserve; whether there was one."""
        path, self._reserve = self._reserve, None
        if path is None:
            return False
        path.unlink(missing_ok=True)
        return True

    def _dump_loop(self) -> None:
        """One dump thread: write dumps until the None that close() sends."""
        while True:
            item = self._dumps.get()
            if item is None:
                self._dumps.task_done()
                return
            try:
                retry = self._backing_off("dump")
                if retry:
                    self.record_drop(item.step, retry, item.nbytes)
                else:
                    self._write_dump(item)
                    self._succeeded("dump")
            except BaseException as e:  # the writer must never take training down
                self._failed("dump", e, item.step, item.nbytes)
            finally:
                with self._lock:
                    self._pending_bytes -= item.nbytes
                self._dumps.task_done()  # drain() counts on it

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every dump queued so far is written (or dropped). For tests and tools
        that read a live run at a known point.

        >>> w.add_dump(5, {"forward/x:0": x}); w.drain(30)   # doctest: +SKIP
        True

        Returns:
            False if ``timeout`` seconds passed first.
        """
        done = self._dumps.all_tasks_done
        with done:
            return done.wait_for(lambda: self._dumps.unfinished_tasks == 0, timeout)

    def _start_dump_threads(self) -> None:
        """Start the dump threads unless they run (called under ``self._lock``)."""
        if self._dump_threads:
            return
        self._dump_threads = [threading.Thread(target=self._dump_loop, daemon=True,
                                               name=f"tf-inspector-dumps-{self.worker}-s"
                                                    f"{self.session}-{i}")
                              for i in range(self._dump_thread_count)]
        for t in self._dump_threads:
            t.start()

    def _stop_dump_threads(self) -> None:
        with self._lock:   # no dump thread starts after this (add_dump racing close())
            self._dump_threads, threads = [], self._dump_threads
            self._dump_thread_count = 0
        for _ in threads:
            self._dumps.put(None)  # after every queued dump: FIFO
        for t in threads:
            t.join()

    def _handle(self, item: Any) -> None:
        if isinstance(item, _Fetched):
            item = self._joined(item)
        if isinstance(item, _Stats):
            self._buffer_stats(item)
            self.state.stats_rows += len(item.rows)
        elif isinstance(item, tuple) and item[0] == "manifest":
            self._manifest.update(item[1])
            self._write_manifest()
        elif isinstance(item, tuple) and item[0] == "flush":
            try:
                self._flush_stats()
            finally:
                item[1].set()
        if (self._stats_buffer or (self._spill is not None and self._spill.parts)) \
                and time.monotonic() - self._last_flush >= self.options.stats_flush_secs:
            self._flush_stats()
        if time.monotonic() - self._last_manifest >= self.options.heartbeat_secs:
            self._write_manifest()  # the heartbeat: a live run's manifest is never older than this
            self.claim.refresh()

    def _buffer_stats(self, item: _Stats) -> None:
        self._stats_buffer.append(item)
        self._buffered_rows += len(item.rows)
        while self._buffered_rows > MAX_BUFFERED_ROWS and len(self._stats_buffer) > 1:
            old = self._stats_buffer.pop(0)  # parts keep failing: bound the memory, record the loss
            self._buffered_rows -= len(old.rows)
            self.record_drop(old.step, "statistics buffer full while their parts could not be "
                                       "written", what="stats")

    def _wait(self) -> float:
        """Seconds until the next statistics flush, heartbeat or owner check is due."""
        now = time.monotonic()
        due = self._last_manifest + self.options.heartbeat_secs
        if self._stats_buffer or (self._spill is not None and self._spill.parts):
            due = min(due, self._last_flush + self.options.stats_flush_secs)
        if self._owner_gone is not None:
            due = min(due, self._last_owner_check + OWNER_CHECK_SECS)
        return max(due - now, 0.001)

    def _raise_if_strict(self) -> None:
        if self.options.strict and self.error is not None:
            raise RuntimeError(f"tf_inspector writer failed: {self.error}") from self.error

    def _write_dump(self, d: _Dump) -> None:
        self.claim.ensure()
        size = self.store.write(dump_name(self.worker, self.session, d.step, d.batch),
                                d.data.chunks(), fsync=self.options.fsync, size=d.data.size)
        with self._lock:
            self.state.bytes_written += size
            self.state.dumps += 1
            self.state.written.append((d.step, d.batch))

    def _stats_table(self, items: list[_Stats]) -> pa.Table:
        """The buffered steps as one table (the columns of FORMAT.md's statistics parts)."""
        counts = [len(s.rows) for s in items]
        layout_rows = np.concatenate([s.rows for s in items])

        def stacked(name: str) -> np.ndarray:
            return np.concatenate([getattr(s, name) for s in items])

        def per_step(value) -> np.ndarray:
            return np.repeat(np.asarray([value(s) for s in items], np.int64), counts)

        values, index, count = stacked("values"), stacked("index"), stacked("count")
        sizes = np.concatenate([np.diff(s.splits) for s in items])
        splits = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        steps, batches = per_step(lambda s: s.step), per_step(lambda s: s.batch)
        # A group no sample of its step's batch is in has no row (count 0, mean NaN: the overview
        # took it for a NaN/Inf); `all` rows always have one. Here, on the writer thread, for
        # all steps at once: on the training thread it would cost numpy calls after every step.
        written = ~((values[:, STAT_COLUMNS.index("count")] == 0) & self._group_rows[layout_rows])
        if not written.all():
            keep = np.flatnonzero(written)
            layout_rows, values, steps, batches = (a[keep]
                                                   for a in (layout_rows, values, steps, batches))
            splits, index, count = rows_of(splits, index, count, rows=keep)
        rows = len(layout_rows)
        cols: dict[str, pa.Array] = {
            "worker": pa.DictionaryArray.from_arrays(np.zeros(rows, np.int32), [self.worker]),
            "session": pa.array(np.full(rows, self.session, np.int64)),
            "mode": pa.DictionaryArray.from_arrays(np.zeros(rows, np.int32), [self.mode]),
            "step": pa.array(steps),
            "batch": pa.array(batches),
        }
        # the layout's rows, by index into its dictionary
        for name, column in self._static.items():
            indices = np.asarray(column.indices)[layout_rows].astype(np.int32)
            cols[name] = pa.DictionaryArray.from_arrays(indices, column.dictionary)
        for i, name in enumerate(STAT_COLUMNS):
            v = values[:, i]
            cols[name] = pa.array(v.astype(np.int64) if name in ("count", "nan", "inf")
                                  else np.ascontiguousarray(v))
        offsets = pa.array(splits.astype(np.int32))
        cols["hist_bucket"] = pa.ListArray.from_arrays(offsets, pa.array(index, pa.int16()))
        cols["hist_count"] = pa.ListArray.from_arrays(offsets, pa.array(count, pa.int32()))
        return pa.Table.from_pydict(cols)

    def _flush_stats(self, final: bool = False) -> None:
        """Write the buffered statistics as one part. On failure, on local disk keep them for a
        retry (at the final flush, record them as dropped); on an object store move the part to
        the spill on local disk (``inspector.storage.spill``), where later parts queue behind it
        until the store takes them, oldest first."""
        self._last_flush = time.monotonic()
        spill = self._spill
        if self._stats_buffer and (final or spill is not None or not self._backing_off("stats")):
            try:
                table = self._stats_table(self._stats_buffer)
                sink = pa.BufferOutputStream()
                pq.write_table(table, sink, **parquet_options(table.schema))
                data = sink.getvalue().to_pybytes()
            except BaseException as e:
                self._failed("stats", e, drop=False)
                if final:
                    self._drop_buffered(f"write error: {describe_error(e)}")
                return
            queued = spill is not None and bool(spill.parts
                                                or (not final and self._backing_off("stats")))
            error = None if queued else self._upload_stats(data, table.num_rows)
            if queued or error is not None:
                if spill is None:   # local disk: the rows stay in memory for the next try
                    if final and error is not None:
                        self._drop_buffered(f"write error: {describe_error(error)}")
                    return
                self._to_spill(data, table.num_rows,
                               sorted({item.step for item in self._stats_buffer}))
            # empty groups' rows
            empty = sum(len(item.rows) for item in self._stats_buffer) - table.num_rows
            self._stats_buffer, self._buffered_rows = [], 0
            with self._lock:
                self.state.stats_rows -= empty
        if spill is not None and spill.parts:
            self._upload_spill(final)

    def _drop_buffered(self, reason: str) -> None:
        for step in sorted({item.step for item in self._stats_buffer}):
            self.record_drop(step, reason, what="stats")

    def _upload_stats(self, data: bytes, rows: int) -> BaseException | None:
        """Write one statistics part, the session's next sequence number; the error, or None."""
        try:
            self.claim.ensure()
            name = stats_name(self.worker, self.session, self._seq + 1)
            size = self.store.write(name, [data], fsync=self.options.fsync)
        except BaseException as e:
            self._failed("stats", e, drop=False)
            return e
        self._succeeded("stats")
        self._seq += 1
        self._compactor.added(self._seq, rows)
        with self._lock:
            self.state.bytes_written += size
        return None

    def _to_spill(self, data: bytes, rows: int, steps: list[int]) -> None:
        """Keep a part the store did not take on local disk; what the spill cannot keep is
        dropped."""
        assert self._spill is not None
        try:
            lost = [(part.steps, f"statistics spill full ({self._spill.max_bytes:,} bytes, "
                                 f"spill_bytes=) while the store did not answer")
                    for part in self._spill.add(data, rows, steps)]
        except OSError as e:
            lost = [(tuple(steps), "the store did not answer and the spill could not keep them: "
                                   f"{describe_error(e)}")]
        for part_steps, reason in lost:
            for step in part_steps:
                self.record_drop(step, reason, what="stats")

    def _upload_spill(self, final: bool) -> None:
        """Upload spilled parts, oldest first, until one fails (then back off). At the final
        flush the ones left stay on local disk, recorded as dropped and logged with their folder."""
        spill = self._spill
        assert spill is not None
        while spill.parts and (final or not self._backing_off("stats")):
            part = spill.parts[0]
            try:
                data = part.path.read_bytes()
            except OSError as e:
                spill.remove(part)
                for step in part.steps:
                    self.record_drop(step, "spilled statistics could not be read back: "
                                           f"{describe_error(e)}",
                                     what="stats")
                continue
            if self._upload_stats(data, part.rows) is not None:
                break
            spill.remove(part)
        if final and spill.parts:
            for part in spill.parts:
                for step in part.steps:
                    self.record_drop(step, "the store did not take them before the session ended; "
                                           f"kept in {spill.folder}", what="stats")
            log.error("tf_inspector: %d statistics part(s) of %s session %d could not be uploaded "
                      "before the session ended; they are kept in %s (copy them into %s/stats/ as "
                      "%s.s%04d.<seq>.parquet to read them)",
                      len(spill.parts), self.run_dir, self.session, spill.folder, self.run_dir,
                      self.worker, self.session)

    def _write_manifest(self) -> None:
        self._last_manifest = time.monotonic()
        with self._manifest_lock:  # the main thread and a failing dump thread may both write it
            with self._lock:
                st = self.state
                self._manifest.update(updated=now_iso(), bytes_written=st.bytes_written,
                                      dumps_written=st.dumps,
                                      steps=([st.first_step, st.last_step]
                                             if st.first_step is not None else None),
                                      dropped=st.dropped.records(), errors=st.errors.records(),
                                      # what the reader checks it finds
                                      # (inspector.sessions.crosscheck)
                                      stats_parts=self._seq, dump_runs=encode_dumps(st.written))
            data = json_bytes(self._manifest)
            self._manifest_bytes = len(data)
            if self.claim.lost is None:   # a session that lost its lock still ends its own manifest
                self.claim.ensure()
            # replaced whole
            self.store.write(manifest_name(self.worker, self.session), [data], fsync=True)
