"""Reading a run's statistics: which parts each view reads, a step recorded twice taken from the
later session, the steps, histograms and quantiles of the rows. The bodies of
:class:`inspector.Run`'s statistics methods, as functions taking the run (``run``: an
``inspector.Run``; its caches, ``_footers``, ``_digests``, ``_origins``, stay on it). Every part is
read through ``run._read_part`` (tests patch it there to see each read). This module never imports
:mod:`inspector.run`: ``run`` is typed ``Any``.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from inspector.dumps.read import group_codes
from inspector.errors import (DamagedFileError, InspectorError, MemoryBudgetError, NoDumpError,
                              StorageError, UnknownGroupError, nearest, suggest)
from inspector.format import parse_stats_name
from inspector.format.loghist import LogHistogram
from inspector.sessions.crosscheck import stats_problems
from inspector.stats import histograms, nonfinite
from inspector.stats.digest import COLUMNS as DIGEST_COLUMNS
from inspector.stats.digest import Digest, digest
from inspector.stats.digest_cache import DigestCache
from inspector.stats.parts import live_parts, seq_range
from inspector.stats.schema import read_part, read_ranged_part, within_budget


def stats_files(run: Any) -> list[tuple[str, int, tuple[str, int | None, str]]]:
    """(worker, session, (name in the run, size, stamp)) of every statistics part."""
    found = sorted((*ids, (f"stats/{e.name}", e.size, e.stamp))
                   for e in run.store.list("stats")
                   if (ids := parse_stats_name(e.name)))
    live, problems = live_parts(found)  # a compacted part hides the small parts it replaced
    ranges: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for w, s, p in found:
        if (r := seq_range(p[0].rsplit("/", 1)[-1])) is not None:
            ranges.setdefault((w, s), []).append(r)
    problems += stats_problems(run.manifests, ranges, run.store.display)
    orphans: dict[tuple[str, int], int] = {}
    for w, s, _ in live:
        if (w, s) not in run.manifests:
            orphans[(w, s)] = orphans.get((w, s), 0) + 1
    problems += [f"{n} statistics part(s) of {w} session {s}, which has no readable manifest: "
                 "its mode is unknown, so its rows are in no mode's view (read them with "
                 f"mode='all' or session={s})"
                 for (w, s), n in sorted(orphans.items())]
    run.problems += [m for m in problems if m not in run.problems]
    kept = {p for _, _, p in live}   # digests of parts compacted away since: never asked again
    run._digests = {p: d for p, d in run._digests.items() if p in kept}
    run._origins.clear()   # the listing changed: so may the first NaN/Inf
    return live


def read_stats_part(run: Any, worker: str, session: int, part: tuple[str, int | None, str],
                    columns: Sequence[str] | None, filters: Any,
                    identity: bool = True) -> pa.Table | None:
    """Rows of ``part`` (None, its problem recorded, if it cannot be read); ``identity``:
    with the identity columns a version 1 part lacks."""
    rel, size, stamp = part
    path = run.path / rel if run.store.is_local else run.store.display(rel)
    try:
        if run.store.is_local:
            # read_part refuses all but a regular file inside the run with the writer's schema
            # (session 0's parts have version 1's, without the identity columns: _with_identity
            # adds them)
            t = read_part(Path(path), run.path, columns, filters, run.verify,
                          version1=session == 0, budget=run.memory_budget)
        else:
            if size is None:
                raise DamagedFileError(f"{path}: not a file (a folder); refused")
            with run.store.ranged(rel, size) as r:
                t, run._footers[(rel, size, stamp)] = read_ranged_part(
                    r, columns, filters, run.verify, session == 0,
                    run._footers.get((rel, size, stamp)), run.memory_budget)
    except (StorageError, MemoryBudgetError):
        # the store did not answer: not a damaged file, and the rows are not known to be gone;
        # or the answer is larger than the budget: the caller asks a narrower question
        raise
    # pyarrow's "realloc failed" (ArrowMemoryError) too: the file is fine
    except MemoryError as e:
        raise MemoryError(f"reading {path} needs more memory than this process may use ({e}); "
                          "the file is not damaged: ask for fewer rows and columns "
                          "(run.query_stats([tensor], steps=(first, last), columns=[...])), "
                          "or read it where more memory is free") from None
    except (OSError, pa.ArrowException, DamagedFileError) as e:
        msg = str(e) if isinstance(e, DamagedFileError) \
            else f"damaged statistics file {path}: {e}"
        if msg not in run.problems:
            run.problems.append(msg)
        return None
    return _with_identity(t, worker, session, run._mode_of(worker, session)) if identity else t


def _read_stats(run: Any, columns: Sequence[str] | None = None, filters: Any = None,
                mode: str | None = None, worker: str | None = None,
                session: int | str | None = None, batch: int | None = None) -> pa.Table:
    for _ in range(3):
        before = len(run.problems)
        table, failed = _read_stats_once(run, columns, filters, mode, worker, session, batch)
        gone = _vanished(run, failed)
        if not gone:
            return table
        # a writer compacted parts after we listed them (the compacted part holds their rows,
        # the small ones were deleted): read again from a new listing, not a stale snapshot
        run.__dict__.pop("_stats_files", None)
        run.problems[before:] = [m for m in run.problems[before:]
                                 if not any(rel in m for rel in gone)]
    return table


def _vanished(run: Any, rels: list[str]) -> list[str]:
    """Those of the parts ``rels`` (that failed to read) no longer listed in ``stats/``."""
    if not rels:
        return []
    names = {f"stats/{e.name}" for e in run.store.list("stats")}
    return [rel for rel in rels if rel not in names]


def _read_stats_once(run: Any, columns: Sequence[str] | None, filters: Any, mode: str | None,
                     worker: str | None, session: int | str | None,
                     batch: int | None) -> tuple[pa.Table, list[str]]:
    """The statistics from the current listing, and the parts that could not be read."""
    files = run._selected(run._stats_files, mode, worker, session)
    batch = run._where(mode, worker, batch)[2]
    parts: dict[tuple[str, int], list[pa.Table]] = {}
    failed = []
    size = 0   # bytes kept so far: the budget holds for the whole answer, not each part
    lo, hi = _step_bounds(filters)
    if lo is not None or hi is not None:  # skip parts whose summary puts every step outside
        files = [(w, s, p) for w, s, p in files if (r := _known_steps(run, p)) is None
                 or not ((lo is not None and r[1] < lo) or (hi is not None and r[0] > hi))]
    for w, s, p in files:
        t = run._read_part(w, s, p, columns, filters)
        if t is None:
            failed.append(p[0])
        if t is not None and t.num_rows:
            parts.setdefault((w, s), []).append(t)
            size += t.nbytes
            within_budget(size, f"the statistics of {run.path}", run.memory_budget)
    if session is None:   # a filtered query's rows do not show every step a session recorded
        parts = latest_session_wins(parts, _claimed_steps(run, files) if filters else None)
    tables = [t for ts in parts.values() for t in ts]
    if batch is not None:  # after the rule: a later evaluation at a step wins all its batches
        tables = [t.filter(pc.equal(t.column("batch"), batch)) for t in tables]
    if not tables:
        return pa.table({}), failed
    table = pa.concat_tables(tables, promote_options="permissive")
    return (table.select([c for c in columns if c in table.column_names]) if columns is not None
            else table), failed


def _known_steps(run: Any, part: tuple) -> tuple[int, int] | None:
    """(first, last) step of ``part``'s rows from its summary, else from a digest already made
    (in memory or the local cache: no part is read for it), else None (read the part)."""
    from inspector.stats.summary import part_steps
    if (r := part_steps(run, part)) is not None:
        return r
    d = run._digests.get(part) or digest_cache(run).get(part)
    if d is None:
        return None
    # a part without a row at any step holds no row a step filter keeps
    return (int(d.every[0]), int(d.every[-1])) if len(d.every) else (1, 0)


def _claimed_steps(run: Any, files: list) -> dict[tuple[str, int], tuple[str, set]]:
    """{(worker, session): (mode, every step it recorded)} for the sessions of ``files`` that
    share a worker and mode with another: read from each part's whole ``step`` column, not
    from the rows a query's filters let through, so the later session wins a step whichever
    tensors, kinds, groups or batch are asked for (one session per worker and mode: none)."""
    by_mode: dict[tuple[str, str], set[int]] = {}
    for w, s, _ in files:
        by_mode.setdefault((w, run._mode_of(w, s)), set()).add(s)
    out: dict[tuple[str, int], tuple[str, set]] = {}
    for w, s, p in files:
        mode = run._mode_of(w, s)
        if len(by_mode[(w, mode)]) > 1:
            t = run._read_part(w, s, p, ["tensor", "kind", "group", "step"], None)
            steps = out.setdefault((w, s), (mode, set()))[1]
            steps.update(() if t is None else pc.unique(t.column("step")).to_pylist())
    return out


def stats(run: Any) -> pd.DataFrame:
    """:attr:`inspector.Run.stats` (documented there)."""
    return to_pandas(nonfinite.mark(_valid(run, _read_stats(run))))


def groups(run: Any) -> list[str]:
    """:attr:`inspector.Run.groups` (documented there)."""
    names: dict[str, None] = {"all": None}
    for m in run.manifests.values():
        names.update(dict.fromkeys(group_codes(m).values()))
    return list(names)


def groups_note(run: Any) -> str | None:
    """:attr:`inspector.Run.groups_note` (documented there)."""
    for m in run.manifests.values():
        g = m.get("groups")   # absent: the default groups (positive, negative)
        if isinstance(g, dict) and not g.get("names") and g.get("rule"):
            return str(g["rule"])
    return None


def check_group(run: Any, group: str) -> str:
    """:meth:`inspector.Run.check_group` (documented there)."""
    if group not in run.groups:
        raise UnknownGroupError(f"no group {group!r} in {run.path}; its groups are: "
                                f"{', '.join(run.groups)}{suggest(str(group), run.groups)}")
    return group


def query_stats(run: Any, tensors: Iterable[str] | None = None,
                steps: tuple[int, int] | None = None, kinds: Iterable[str] | None = None,
                groups: Iterable[str] | None = None, columns: Sequence[str] | None = None, *,
                mode: str | None = None, worker: str | None = None,
                session: int | str | None = None, batch: int | None = None,
                group: str | None = None, at_steps: Iterable[int] | None = None,
                finite_part: bool = False) -> pd.DataFrame:
    """:meth:`inspector.Run.query_stats` (documented there)."""
    if group is not None:
        groups = [*(groups or []), group]
    return to_pandas(query_stats_table(run, tensors, steps, kinds, groups, columns,
                                       mode=mode, worker=worker, session=session,
                                       batch=batch, at_steps=at_steps,
                                       finite_part=finite_part))


def query_stats_table(run: Any, tensors: Iterable[str] | None = None,
                      steps: tuple[int, int] | None = None, kinds: Iterable[str] | None = None,
                      groups: Iterable[str] | None = None, columns: Sequence[str] | None = None,
                      *, mode: str | None = None, worker: str | None = None,
                      session: int | str | None = None, batch: int | None = None,
                      at_steps: Iterable[int] | None = None,
                      finite_part: bool = False) -> pa.Table:
    """:meth:`inspector.Run.query_stats_table` (documented there)."""
    filters: list[tuple[str, str, Any]] = []   # pyarrow's (column, op, value) triples
    if tensors is not None:
        tensors = [run.check_tensor(t) for t in tensors]
        filters.append(("tensor", "in", tensors))
    if steps is not None:
        filters += [("step", ">=", int(steps[0])), ("step", "<=", int(steps[1]))]
    if at_steps is not None:
        wanted = sorted({int(s) for s in at_steps})
        # the bounds too: parts whose summary puts every step outside them are not opened
        filters += [("step", "in", wanted), ("step", ">=", wanted[0] if wanted else 0),
                    ("step", "<=", wanted[-1] if wanted else -1)]
    if kinds is not None:
        filters.append(("kind", "in", list(kinds)))
    if groups is not None:
        groups = [groups] if isinstance(groups, str) else list(groups)
        filters.append(("group", "in", [check_group(run, g) for g in groups]))
    if columns is not None:
        columns = list(dict.fromkeys([*IDENTITY, "tensor", "kind", "group", *columns]))
    if finite_part:
        return _valid(run, _read_stats(run, columns, filters or None, mode, worker, session,
                                       batch))
    read, extra = nonfinite.columns_to_read(columns)
    return nonfinite.mark(_valid(run, _read_stats(run, read, filters or None, mode, worker,
                                                  session, batch)), extra)


def _valid(run: Any, table: pa.Table) -> pa.Table:
    """``table`` with histograms no writer writes cleared, each such read named in
    ``run.problems`` (the viewer, the export and notebooks all read through here)."""
    table, problems = histograms.clear_invalid(table)
    run.problems += [m for m in problems if m not in run.problems]
    return table


def stats_steps(run: Any, kind: str = "forward", group: str = "all") -> np.ndarray:
    """:meth:`inspector.Run.stats_steps` (documented there)."""
    batch = run._where(None, None)[2]
    files = run._selected(run._stats_files, None, None, None)
    sessions: dict[tuple[str, str], set[int]] = {}
    for w, s, _ in files:
        sessions.setdefault((w, run._mode_of(w, s)), set()).add(s)
    own: dict[tuple[str, str, int], list[np.ndarray]] = {}
    claims: dict[tuple[str, str, int], list[np.ndarray]] = {}
    if batch is None:   # the loop below reads digests (one eval batch: its rows instead)
        prefetch_digests(run, files)
    for w, s, p in files:
        mode = run._mode_of(w, s)
        got = _part_step_list(run, w, s, p, kind, group, batch)
        claim = (_part_step_list(run, w, s, p, "forward", "all", None, every_row=True)
                 if len(sessions[(w, mode)]) > 1 else np.zeros(0, np.int64))
        # unreadable, or compacted away since listed: the full reader
        if got is None or claim is None:
            df = query_stats(run, kinds=[kind], groups=[group], columns=[])
            return np.sort(df["step"].unique()).astype(np.int64)
        own.setdefault((w, mode, s), []).append(got)
        claims.setdefault((w, mode, s), []).append(claim)
    found = [np.array([], np.int64)]
    for (w, mode), numbers in sessions.items():
        later = np.zeros(0, np.int64)   # steps a later session of this worker and mode recorded
        for s in sorted(numbers, reverse=True):
            steps = np.unique(np.concatenate(own.get((w, mode, s), [np.zeros(0, np.int64)])))
            found.append(np.setdiff1d(steps, later))
            later = np.union1d(later, np.concatenate(claims.get((w, mode, s),
                                                                [np.zeros(0, np.int64)])))
    save_digests(run)
    return np.unique(np.concatenate(found))


def _part_step_list(run: Any, worker: str, session: int, part: tuple, kind: str, group: str,
                    batch: int | None, every_row: bool = False) -> np.ndarray | None:
    """The steps of ``part``'s (kind, group) rows (``every_row``: of any row; with ``batch``
    None only), from its summary where it has one, else from its digest (one read of the
    part for every (kind, group)); of one eval ``batch``, from its rows. None if it cannot
    be read."""
    from inspector.stats.summary import part_step_set
    if batch is None:
        if run.store.is_local and (got := part_step_set(run, part, kind, group)) is not None \
                and (len(got) or not every_row):
            return got  # the part's summary lists its steps: no row read
        d = part_digest(run, worker, session, part)
        return None if d is None else d.every if every_row \
            else d.steps.get((kind, group), np.zeros(0, np.int64))
    before = list(run.problems)
    # tensor: checked
    t = run._read_part(worker, session, part, ["step", "tensor", "kind", "group", "batch"],
                       [("kind", "in", [kind]), ("group", "in", [group])])
    if t is None:
        run.problems[:] = before
        return None
    return pc.unique(t.filter(
        pc.equal(t.column("batch"), batch)).column("step")).to_numpy().astype(np.int64)


def part_digest(run: Any, worker: str, session: int, part: tuple) -> Digest | None:
    """The digest of ``part`` (:mod:`inspector.stats.digest`), read once per version of it;
    None if it cannot be read (its problem left for the full reader to report)."""
    if (d := run._digests.get(part)) is not None:
        return d
    cache = digest_cache(run)
    if (d := cache.get(part)) is not None:
        run._digests[part] = d
        return d
    before = list(run.problems)
    t = run._read_part(worker, session, part, DIGEST_COLUMNS, None, identity=False)
    if t is None:
        run.problems[:] = before
        return None
    run._digests[part] = d = digest(t)
    cache.put(part, d)
    return d


#: threads reading small parts' digests at once (pyarrow reads and decodes without the GIL, so
#: the reads overlap; the checks and the digest hold it, so more threads only wait for it),
#: from how many such parts, the parts a thread reads per task (a task per part woke the
#: calling thread for each: ~0.1 ms of CPU a part), and the largest part read so (bytes):
#: memory stays a few small parts'
DIGEST_THREADS = 2
PREFETCH_FROM = 32
DIGEST_BATCH = 64
PREFETCH_BYTES = 4 << 20


def prefetch_digests(run: Any, files: Sequence[tuple[str, int, tuple]]) -> None:
    """Make, DIGEST_THREADS at a time, the digests of ``files``' small local parts that have no
    summary and no digest yet (:func:`part_digest` then finds them), each read through
    ``run._read_part``. A part that fails here is read again by :func:`part_digest`."""
    from inspector.stats.summary import summary_rel
    if not run.store.is_local:
        return
    root, cache = Path(run.path), digest_cache(run)
    todo = [(w, s, p) for w, s, p in files if p[1] is not None and p[1] <= PREFETCH_BYTES
            and not _digest_known(run, cache, p) and not (root / summary_rel(p[0])).exists()]
    if len(todo) < PREFETCH_FROM:
        return

    def some(items: Sequence[tuple[str, int, tuple]]) -> list[tuple[tuple, Digest | None]]:
        out = []
        for w, s, part in items:
            t = run._read_part(w, s, part, DIGEST_COLUMNS, None, identity=False)
            out.append((part, None if t is None else digest(t)))
        return out
    before = list(run.problems)
    try:
        with ThreadPoolExecutor(DIGEST_THREADS) as pool:
            n = min(DIGEST_BATCH, -(-len(todo) // DIGEST_THREADS))   # every thread has some
            for done in pool.map(some, [todo[i:i + n] for i in range(0, len(todo), n)]):
                for part, d in done:
                    if d is not None:
                        run._digests[part] = d
                        cache.put(part, d)
    except Exception:   # noqa: BLE001 - part_digest's own read meets it again, and decides
        pass
    # a part that failed is read again by part_digest, which leaves its problem to the full
    # reader: none is reported from here
    run.problems[:] = before


def _digest_known(run: Any, cache: DigestCache, part: tuple) -> bool:
    """Whether ``part``'s digest is in memory or in the local cache (kept in memory then: a
    cached entry is decoded once, not again by :func:`part_digest`)."""
    if part in run._digests:
        return True
    if (d := cache.get(part)) is None:
        return False
    run._digests[part] = d
    return True


def digest_cache(run: Any) -> DigestCache:
    """The run's digests on local disk (:mod:`inspector.stats.digest_cache`), opened once."""
    cache = run.__dict__.get("_digest_cache")
    if cache is None:
        cache = run.__dict__["_digest_cache"] = DigestCache.for_run(str(run.path))
    return cache


def save_digests(run: Any) -> None:
    """Write the digests read since the last save, for the parts listed now."""
    if "_digest_cache" in run.__dict__:
        run._digest_cache.save(p for _, _, p in run._stats_files)


def to_pandas(table: pa.Table) -> pd.DataFrame:
    """:meth:`inspector.Run.to_pandas` (documented there)."""
    if table.num_columns == 0:
        return pd.DataFrame(columns=[*IDENTITY, "tensor", "kind", "group"])
    df = table.to_pandas(types_mapper=lambda t: pd.ArrowDtype(t)
                         if pa.types.is_fixed_size_list(t) or pa.types.is_list(t) else None)
    for c in ("tensor", "kind", "group", "worker", "mode"):
        if c in df and not isinstance(df[c].dtype, pd.CategoricalDtype):
            df[c] = df[c].astype("category")
    return df


def _histogram_row(run: Any, tensor: str, step: int, kind: str, group: str, mode: str | None,
                   worker: str | None, session: int | None, batch: int | None) -> pd.Series:
    df = query_stats(run, [tensor], steps=(step, step), kinds=[kind], groups=[group],
                     columns=list(histograms.COLUMNS), mode=mode, worker=worker,
                     session=session)
    df = df[df["batch"] == (run._where(mode, worker, batch)[2] or 0)]
    if df.empty:
        have = query_stats(run, [tensor], kinds=[kind], groups=[group], columns=[], mode=mode,
                           worker=worker, session=session)["step"].unique()
        raise NoDumpError(f"no statistics for {tensor!r} kind={kind!r} group={group!r} at step "
                          f"{step}; nearest steps with statistics: {nearest(step, have)}")
    _one_source(df, f"statistics of {tensor!r} at step {step}")
    return df.iloc[0]


def histogram(run: Any, tensor: str, step: int, kind: str = "forward", group: str = "all", *,
              mode: str | None = None, worker: str | None = None, session: int | None = None,
              batch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`inspector.Run.histogram` (documented there)."""
    h = histograms.of_row(_histogram_row(run, tensor, step, kind, group, mode, worker, session,
                                         batch))
    return histograms.edges_and_counts(h) if h is not None \
        else (np.array([0.0, 1.0]), np.zeros(1, np.int64))


def log_histogram(run: Any, tensor: str, step: int, kind: str = "forward", group: str = "all", *,
                  mode: str | None = None, worker: str | None = None,
                  session: int | None = None, batch: int | None = None) -> LogHistogram:
    """:meth:`inspector.Run.log_histogram` (documented there)."""
    h = histograms.of_row(_histogram_row(run, tensor, step, kind, group, mode, worker, session,
                                         batch))
    if not isinstance(h, LogHistogram):
        raise InspectorError(f"the statistics of {tensor!r} at step {step} were written before "
                             "format version 4: their histogram has equal-width bins, not "
                             "log-magnitude buckets; read run.histogram() instead")
    return h


def quantiles(run: Any, tensor: str, steps: tuple[int, int] | None = None, kind: str = "forward",
              group: str = "all", q: Sequence[float] = (0.0, 0.07, 0.16, 0.5, 0.84, 0.93, 1.0),
              *, mode: str | None = None, worker: str | None = None,
              session: int | str | None = None
              ) -> pd.DataFrame:
    """:meth:`inspector.Run.quantiles` (documented there)."""
    df = query_stats(run, [tensor], steps=steps, kinds=[kind], groups=[group],
                     columns=list(histograms.COLUMNS), mode=mode, worker=worker,
                     session=session)
    return histograms.quantile_frame(df.sort_values("step", kind="stable"), q)


#: Columns naming where a statistics row comes from (added to version 1 parts on read).
IDENTITY = ("worker", "session", "mode", "step", "batch")


def _with_identity(t: pa.Table, worker: str, session: int, mode: str) -> pa.Table:
    """Add the identity columns a version 1 part lacks (its file name and manifest give them)."""
    n = t.num_rows
    const = {"worker": lambda: pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)),
                                                              [worker]),
             "session": lambda: pa.array(np.full(n, session, np.int64)),
             "mode": lambda: pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)),
                                                            [mode]),
             "batch": lambda: pa.array(np.zeros(n, np.int64))}
    for i, name in enumerate(("worker", "session", "mode")):
        if name not in t.column_names:
            t = t.add_column(i, name, const[name]())
    if "batch" not in t.column_names and "step" in t.column_names:
        t = t.add_column(t.column_names.index("step") + 1, "batch", const["batch"]())
    return t


def _step_bounds(filters: Any) -> tuple[int | None, int | None]:
    """The (lowest, highest) step that ``filters`` (:meth:`Run.query_stats_table`'s triples) let
    through; None where unbounded.

    >>> _step_bounds([("step", ">=", 5), ("kind", "in", ["forward"])])
    (5, None)
    """
    lo = hi = None
    for f in filters or ():
        if not (isinstance(f, tuple) and len(f) == 3):
            continue  # a conjunction of triples is all this reads; other forms prune nothing
        c, op, v = f
        if c == "step" and op == ">=":
            lo = int(v) if lo is None else max(lo, int(v))
        elif c == "step" and op == "<=":
            hi = int(v) if hi is None else min(hi, int(v))
    return lo, hi


def latest_session_wins(parts: dict[tuple[str, int], list[pa.Table]],
                        recorded: dict[tuple[str, int], tuple[str, set]] | None = None,
                        ) -> dict[tuple[str, int], list[pa.Table]]:
    """Drop the rows of a step that a later session of the same worker and mode also recorded.
    ``recorded``: {(worker, session): (mode, every step it recorded)}, for a query whose
    ``parts`` hold only some of a session's rows, or none; else a session's steps are those of
    its rows in ``parts``."""
    sessions: dict[tuple[str, int], tuple[str, set]] = {
        k: (ts[0].column("mode")[0].as_py(), set()) for k, ts in parts.items()}
    sessions.update(recorded or {})
    out: dict[tuple[str, int], list[pa.Table]] = {}
    claimed: dict[tuple[str, str], set[int]] = {}
    for (w, s) in sorted(sessions, key=lambda k: (k[0], -k[1])):
        mode, steps = sessions[(w, s)]
        taken = claimed.setdefault((w, mode), set())
        steps = set(steps)
        kept = []
        for t in parts.get((w, s), ()):
            steps.update(pc.unique(t.column("step")).to_pylist())
            if taken:
                t = t.filter(pc.invert(pc.is_in(t.column("step"),
                                                value_set=pa.array(sorted(taken), pa.int64()))))
            if t.num_rows:
                kept.append(t)
        taken |= steps
        if kept:
            out[(w, s)] = kept
    return out


def _one_source(df: pd.DataFrame, what: str) -> None:
    """Refuse to pick one of several workers' or sessions' rows arbitrarily."""
    sources = df[["worker", "session"]].drop_duplicates()
    if len(sources) > 1:
        names = ", ".join(f"{w} session {s}" for w, s in sources.itertuples(index=False))
        raise InspectorError(f"{what} was recorded by several writers ({names}): pass worker= (and "
                             "session=)")
