"""What each session's manifest says it wrote, against the files a listing finds.

A writer records in its manifest the statistics parts (``stats_parts``: the highest sequence
number written; parts 1..N exist, or compacted parts covering them), the dumps
(``dump_runs``: every (step, batch) written, run-length encoded; ``dumps_written``: how many)
and the graph (``graph_bytes``). The reader compares them with what it lists, so a file lost
after it was written (deleted by hand, a wiped bucket, a part deleted while a query read it)
is named in ``run.problems``, never a silent gap in a plot (FORMAT.md, "Missing files").

Example::

    runs = encode_dumps([(100, None), (200, None), (300, None)])   # [[100, -1, 3, 100, 0]]
    list(decode_dumps(runs))                                       # [(100, None), (200, None),
                                                                   #  (300, None)]
    missing_seqs([(1, 10), (21, 30)], 40)                          # [(11, 20), (31, 40)]
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from inspector.format.manifest import MAX_DUMPS_LISTED
from inspector.format import dump_name, graph_name, manifest_name, stats_name, stats_range_name

Manifests = Mapping[tuple[str, int], Mapping[str, Any]]

#: ``dump_runs`` longer than this is not written (null: only the count is compared); the
#: dumps a manifest's runs may list in all: format.manifest.MAX_DUMPS_LISTED.
MAX_DUMP_RUNS = 1000
#: Missing files named one by one per session and kind; the rest are counted in one line.
MAX_NAMED = 20


def encode_dumps(keys: Iterable[tuple[int, int | None]]) -> list[list[int]] | None:
    """(step, batch) keys (batch None: a training dump) as runs ``[step, batch, n, dstep,
    dbatch]`` (batch -1 for None): run k holds (step + i*dstep, batch + i*dbatch), i < n. None
    when there would be more than MAX_DUMP_RUNS runs or MAX_DUMPS_LISTED keys."""
    items = sorted({(int(s), -1 if b is None else int(b)) for s, b in keys})
    if len(items) > MAX_DUMPS_LISTED:
        return None
    out: list[list[int]] = []
    i = 0
    while i < len(items):
        s0, b0 = items[i]
        n, ds, db = 1, 0, 0
        if i + 1 < len(items):
            ds, db = items[i + 1][0] - s0, items[i + 1][1] - b0
            n = 2
            while i + n < len(items) and items[i + n] == (s0 + n * ds, b0 + n * db):
                n += 1
        out.append([s0, b0, n, ds, db])
        if len(out) > MAX_DUMP_RUNS:
            return None
        i += n
    return out


def decode_dumps(runs: Sequence[Sequence[int]]) -> Iterator[tuple[int, int | None]]:
    """The (step, batch) keys of :func:`encode_dumps`'s runs (batch None for -1)."""
    for s0, b0, n, ds, db in runs:
        for i in range(n):
            b = b0 + i * db
            yield s0 + i * ds, None if b < 0 else b


def missing_seqs(ranges: Iterable[tuple[int, int]], last: int) -> list[tuple[int, int]]:
    """The sequence numbers in 1..``last`` that no [first, last] range covers, as ranges."""
    gaps, nxt = [], 1
    for a, b in sorted(ranges):
        if a > nxt:
            gaps.append((nxt, min(a - 1, last)))
        nxt = max(nxt, b + 1)
        if nxt > last:
            break
    if nxt <= last:
        gaps.append((nxt, last))
    return [(a, b) for a, b in gaps if a <= b]


def named(names: list[str], total: int, what: str) -> list[str]:
    """Up to MAX_NAMED of ``names``, then one line counting the rest of ``total``."""
    out = names[:MAX_NAMED]
    if total > len(out):
        out.append(f"... and {total - len(out):,} more {what}")
    return out


def folder_problems(sizes: Mapping[str, int | None], display: Callable[[str], str]) -> list[str]:
    """``stats`` or ``dumps`` that is a file, not a folder (``sizes``: the run's root listing,
    None for a folder; links are left out by the caller)."""
    return [f"{display(sub)} is a file, not a folder: none of the run's {what} can be read"
            for sub, what in (("stats", "statistics parts"), ("dumps", "dumps"))
            if sizes.get(sub) is not None]


def graph_problems(manifests: Manifests, sizes: Mapping[str, int | None],
                   display: Callable[[str], str]) -> list[str]:
    """Each session's graph its manifest says was written (``graph_bytes``) and the root
    listing (``sizes``: name -> size) lacks, or holds with another size."""
    out = []
    for (w, s), m in sorted(manifests.items()):
        want = m.get("graph_bytes")
        if not isinstance(want, int) or s < 1:
            continue
        name = graph_name(w, s)
        got = sizes.get(name, -1)
        if got == -1:
            out.append(f"{display(name)}: missing; {manifest_name(w, s)} says it was written "
                       f"({want:,} bytes)")
        elif got != want:
            have = "a folder" if got is None else f"{got:,} bytes"
            out.append(f"{display(name)}: {have}, not the {want:,} bytes {manifest_name(w, s)} "
                       "says were written")
    return out


def stats_problems(manifests: Manifests, ranges: Mapping[tuple[str, int], list[tuple[int, int]]],
                   display: Callable[[str], str]) -> list[str]:
    """Statistics parts 1..``stats_parts`` of each session that no listed part covers
    (``ranges``: the sequence ranges of each session's live parts)."""
    out = []
    for (w, s), m in sorted(manifests.items()):
        last = m.get("stats_parts")
        if not isinstance(last, int) or last < 1 or s < 1:
            continue
        gaps = missing_seqs(ranges.get((w, s), []), last)
        names = [display(stats_name(w, s, a) if a == b else stats_range_name(w, s, a, b))
                 for a, b in gaps]
        lines = [f"{n}: missing; {manifest_name(w, s)} says statistics parts 1-{last} were written "
                 f"(their rows are not read)" for n in names]
        out += named(lines, len(lines), f"missing statistics parts of {w} session {s}")
    return out


def dump_problems(manifests: Manifests, found: set[str],
                  display: Callable[[str], str]) -> list[str]:
    """Dumps each session's manifest says were written and ``found`` (the names listed in
    ``dumps/``) lacks: named from ``dump_runs``, else counted against ``dumps_written``."""
    out = []
    for (w, s), m in sorted(manifests.items()):
        if s < 1:
            continue
        runs, count = m.get("dump_runs"), m.get("dumps_written")
        if isinstance(runs, list):
            missing = [name for step, batch in decode_dumps(runs)
                       if (name := dump_name(w, s, step, batch)).rsplit("/", 1)[-1] not in found]
            lines = [f"{display(n)}: missing; {manifest_name(w, s)} says it was written"
                     for n in missing]
            out += named(lines, len(lines), f"missing dumps of {w} session {s}")
        elif isinstance(count, int) and m.get("format_version", 1) >= 2:
            have = sum(1 for n in found if n.startswith(f"{w}.s{s:04d}.step-"))
            if have < count:
                out.append(f"{display('dumps')}: {count - have:,} dump(s) of {w} session {s} "
                           f"missing; {manifest_name(w, s)} says {count:,} were written, {have:,} "
                           "are there")
    return out
