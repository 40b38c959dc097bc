"""``python -m inspector info | export | app``: the run from a shell.

Examples::

    python -m inspector info runs/exp1
    python -m inspector export runs/exp1 --format npz --out exp1.npz --tensors conv --steps 100:500
    python -m inspector export runs/exp1 --format parquet --out stats.parquet
    python -m inspector export --tensorboard runs/exp1 --logdir tb/ --follow
    tensorboard --logdir tb/
    python -m inspector app runs/

Exit status: 0 when everything was read, 1 when ``info`` found damaged or missing files
(reported, the rest still read; with ``--strict`` also when a session recorded dropped data or
write errors), 2 when a run could not be read or the command was refused.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.resources
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Sequence

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
from tqdm import tqdm

from inspector.format.accounting import reason_kind
from inspector.sizes import human_bytes
from inspector.storage.atomic import create_temporary
from inspector.format import special_entries
from inspector.storage.safety import inside, real

from .analysis import diagnose, diagnosis_text, rerun_text
from .errors import InspectorError, NotARunError, StorageError
from .run import ALL, Run, find_runs, open_run, parse_steps
from .storage import OPTIONS_ENV, TIMEOUT_ENV, is_url, local_path, storage_timeout


def _batch_note_lines(t: pd.DataFrame) -> list[str]:
    """Where tensors computed from the batch are not per-sample: how many, and the catalog's
    reasons (``batch_note``), the most common first."""
    notes = t["batch_note"].dropna() if len(t) and "batch_note" in t else pd.Series([], dtype=str)
    if not len(notes):
        return []
    counts = notes.value_counts()
    head = (f"per-sample {len(notes)} tensors computed from the batch are not per-sample "
            "(group 'all' only, dumped whole; catalog batch_note):")
    return [head] + [f"           {n}: {why}" for why, n in counts.head(3).items()] \
        + ([f"           ... {len(counts) - 3} more reasons"] if len(counts) > 3 else [])


#: Problems of one kind ``info`` (and an incomplete export) prints before a count of the rest.
PROBLEMS_SHOWN = 5


def problem_lines(problems: Sequence[str], every: bool = False) -> list[str]:
    """``problems`` as lines: those of one kind (the same words, numbers and file names aside)
    past the first PROBLEMS_SHOWN summarized as a count and how to list them all (``every``:
    each one).

    >>> problem_lines([f"dumps/d{i}: refused" for i in range(7)])[-1]
    '... and 2 more like dumps/d0: refused (info --all-problems lists every one)'
    """
    kinds: dict[str, list[str]] = {}
    for p in problems:
        kinds.setdefault(_PROBLEM_KIND_RE.sub("#", p), []).append(p)
    out = []
    for same in kinds.values():
        shown = same if every else same[:PROBLEMS_SHOWN]
        out += shown
        if len(same) > len(shown):
            out.append(f"... and {len(same) - len(shown):,} more like {same[0]} "
                       "(info --all-problems lists every one)")
    return out


#: What varies between problems of one kind: numbers, file names, quoted names.
_PROBLEM_KIND_RE = re.compile(r"'[^']*'|\S*[/.]\S*|\d[\d,]*")


def summary(run: Run, all_problems: bool = False) -> str:
    """A readable summary: status, steps, tensors, bytes, anomalies, damaged files (repeated
    problems summarized unless ``all_problems``)."""
    damaged = run.check_dumps()
    m, t = run.manifest, run.tensors
    stats_steps = pd.Series(run.stats_steps())   # summaries' step lists where parts have them
    lines = [
        f"run        {run.path}",
        f"status     {run.status}   workers: {', '.join(run.workers)}   tensorflow "
        f"{m['tensorflow_version'] or '?'}",
        f"loss       {m.get('loss')}   labels: {m.get('labels')}",
        f"groups     {', '.join(run.groups)}"
        + (f"   ({m['groups']['rule']})" if m.get("groups") else ""),
        f"tensors    {len(t)} captured{_of_which(t)}, "
        f"{int(t['has_gradient'].sum()) if len(t) else 0} with gradients, "
        f"{int(t['batched'].sum()) if len(t) else 0} batched, {len(m.get('skipped', []))} skipped "
        "(see the accounting's reasons)",
        f"statistics {stats_steps.nunique()} steps"
        + (f" ({stats_steps.min()}..{stats_steps.max()})" if len(stats_steps) else ""),
        f"dumps      {len(run.steps)} steps" + (f": {_short(run.steps)}" if run.steps else "")
        + (f" ({damaged} damaged, see below)" if damaged else ""),
        f"size       {human_bytes(run.size_bytes())}",
    ]
    lines[5:5] = _accounting_lines(run)
    variables = run.variables
    if len(variables):
        reads = int(((t["kind"] != "variable") & t["variable"].isin(variables.index)).sum())
        lines.insert(4, f"variables  {len(variables)} trainable ({_updated(run, variables)}), "
                        f"read by {reads} captured tensors")
    notes = sorted(set(t["captured_on"].dropna())) if len(t) else []
    for note in notes:   # a Keras probe: its gradients are not the ones the updates came from
        lines.insert(5, f"captured   {note} (Keras source='probe'): gradients are the probe's on "
                        "the updated weights, not the ones each step's update was computed from")
    lines += _batch_note_lines(t)
    roles = t[t["icnn_role"].notna()] if len(t) else t
    if len(roles):
        lines.append(f"icnn       layers: {', '.join(sorted(set(roles['icnn_layer'])))}")
    evidence = run.nonfinite_evidence()
    first = run.first_nonfinite() if evidence else None
    if first is not None and first.get("text"):
        lines.append(f"anomalies  first NaN/Inf: {first['text']} ({first['worker']})"
                     + rerun_text(first))
        evidence = [e for e in evidence if e.get("source") != "statistics"]
    origin_shown = first is not None and bool(first.get("text"))
    lines += [f"anomalies  {'first' if i == 0 and not origin_shown else 'also'} NaN/Inf "
              f"at step {nf['step']} in {nf.get('tensor')} ({nf.get('kind', '?')}, seen by the "
              f"{nf['source']}, {nf['worker']})" + rerun_text(nf) for i, nf in enumerate(evidence)]
    if first is None:
        lines.append("anomalies  no NaN/Inf seen")
    text = diagnosis_text(diagnose(run))
    lines += [("diagnosis  " if i == 0 else "           ") + line
              for i, line in enumerate(text.split("\n")) if text]
    for r in run.groups_refused.itertuples():
        count = f"{int(r.steps)} " if r.steps == r.steps and r.steps is not None else ""
        lines.insert(4, f"refused    groups on {count}statistics steps of {r.worker} session "
                        f"{r.session} from step {r.first_step}: {r.why} (such steps write group "
                        "'all' only; their dumps keep samples ungrouped)")
    lines += _sessions_lines(run)
    for r in run.errors.itertuples():
        span = _span(r.first_step, r.last_step)
        lines.append(f"ERROR      {r.worker} session {r.session}: {r.what} {r.reason} ({r.count}x"
                     + (f", steps {span})" if span else ")"))
    for r in run.dropped.itertuples():
        lines.append(f"dropped    {r.count} {r.what}(s) of {r.worker} session {r.session}, steps "
                     f"{_span(r.first_step, r.last_step) or '?'}: {r.reason}")
    for p in problem_lines(run.problems, all_problems):
        lines.append(f"problem    {p}")
    return "\n".join(lines)


def _updated(run: Run, variables: pd.DataFrame) -> str:
    """'8 with updates' or '6 with updates, 2 never changed': a variable whose recorded updates
    are all exactly 0 never changed (left out of the optimizer's var_list, or frozen)."""
    recorded = variables.index[variables["has_update"].astype(bool)]
    if not len(recorded):
        return "0 with updates"
    upd = run.query_stats(list(recorded), kinds=["update"], groups=["all"], columns=["l2"])
    moved = upd.groupby("tensor", observed=True)["l2"].apply(
        lambda v: bool((v.fillna(1) != 0).any()))
    frozen = sorted(str(n) for n, m in moved.items() if not m)
    return f"{len(recorded) - len(frozen)} with updates" + (
        f", {len(frozen)} never changed: {', '.join(frozen[:4])}{' ...' if len(frozen) > 4 else ''}"
        if frozen else "")


def _of_which(t: pd.DataFrame) -> str:
    """' (114 op outputs, 11 variable records)': the catalog's kinds, so the count reads against
    the accounting line's, which counts op outputs only."""
    kinds = t["kind"].value_counts() if "kind" in t and len(t) else None
    if kinds is None or len(kinds) < 2:
        return ""
    names = {"tensor": "op outputs", "variable": "variable records"}
    return " (" + ", ".join(f"{n} {names.get(k, k)}" for k, n in kinds.items()) + ")"


def _accounting_lines(run: Run, reasons: int = 3, width: int = 100) -> list[str]:
    """Where the float op outputs of the default session's graph went: counts per exclusion
    rule and per skip reason (``run.accounting()``; ``run.why(name)`` for one name)."""
    table = run.accounting()
    if table.empty:
        return ["accounting not recorded: the run predates it (run.why(name) answers from the "
                "catalog and the skipped list only)"]
    count = table.groupby("status")["count"].sum()
    excluded = table[table["status"] == "excluded"]
    skipped = table[table["status"] == "skipped"]
    # one line per kind of reason (a racy read's names its variable: one reason per variable)
    skipped = skipped.assign(what=skipped["what"].map(reason_kind)).groupby(
        "what", sort=False, as_index=False)["count"].sum().sort_values("count", ascending=False,
                                                                       kind="stable")
    lines = [f"accounting {int(count.sum())} float op outputs of the graph: "
             f"{int(count.get('captured', 0))} captured, {int(count.get('skipped', 0))} skipped, "
             f"{int(count.get('excluded', 0))} excluded (run.why(name) says why for one)"]
    if len(excluded):
        lines.append("excluded   " + ", ".join(f"{r.rule} {r.count}"
                                              + ("" if r.source == "default" else f" ({r.source})")
                                              for r in excluded.itertuples()))
    for r in list(skipped.itertuples())[:reasons]:
        # the head and the tail: kinds of one reason differ at its end (where the value is)
        text = r.what if len(r.what) <= width \
            else f"{r.what[:width // 2 - 3]} ... {r.what[-(width // 2 - 2):]}"
        lines.append(f"skipped    {r.count}: {text}")
    if len(skipped) > reasons:
        lines.append(f"skipped    ... {len(skipped) - reasons} more reasons (run.accounting())")
    return lines


def _span(first, last) -> str | None:
    """'3..9' for a step range, None where there is none (None or NaN: a column with gaps is
    float)."""
    if first is None or first != first:   # NaN
        return None
    return f"{int(first)}..{int(last)}"


def _sessions_lines(run: Run) -> list[str]:
    """One line per writer session: worker, number, mode, state, steps; failures with their
    error."""
    out = []
    for r in run.sessions.itertuples():
        span = _span(r.first_step, r.last_step)
        steps = f"steps {span}" if span else "no steps"
        flag = "FAILED " if r.state in ("failed", "crashed") else ""
        notes = [r.error] if isinstance(r.error, str) and r.error else []
        notes += [f"recorded nothing: {r.note}"] if isinstance(r.note, str) and r.note else []
        if not pd.isna(r.hidden_by):
            notes.append(f"an earlier training, hidden by the new training of s{r.hidden_by} "
                         f"(--session {r.session} reads it)")
        out.append(f"session    {flag}{r.worker} s{r.session} {r.mode:<7} {r.state:<8} {steps}"
                   + (f": {'; '.join(notes)}" if notes else ""))
    return out


def _short(steps: Sequence[int], n: int = 8) -> str:
    s = ", ".join(map(str, steps[:n]))
    return s + (f", ... {steps[-1]}" if len(steps) > n else "")


def _select(run: Run, pattern: str | None) -> list[str]:
    names = list(run.tensors.index)
    if not pattern:
        return names
    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise InspectorError(f"--tensors {pattern!r} is not a valid regular expression: "
                             f"{e}") from None
    chosen = [n for n in names if rx.search(n)]
    if not chosen:
        raise InspectorError(f"--tensors {pattern!r} matches none of the {len(names)} tensors of "
                             f"{run.path}")
    return chosen


def output_path(run: Run, fmt: str, out: Path, force: bool = False) -> Path:
    """Where ``export`` writes: ``out``, or ``out/<run name>.<fmt>`` when ``out`` is a folder.

    InspectorError (nothing written) for a symlink (the output or its folder), a path inside
    the run being read, or an existing file without ``force``."""
    if os.path.islink(out):
        raise InspectorError(f"--out {out} is a symlink; refusing to write through it")
    name = real(run.path).name if run.store.is_local \
        else str(run.path).rstrip("/").rsplit("/", 1)[-1]
    target = out / f"{name}.{fmt}" if out.is_dir() else out
    target = Path(os.path.abspath(target))
    for p, what in ((target, "the output"), (target.parent, "the output's folder")):
        if os.path.islink(p):
            raise InspectorError(f"{what} {p} is a symlink; refusing to write through it")
    if run.store.is_local and inside(target, run.path):
        raise InspectorError(f"{target} is inside the run {run.path} being read; "
                             "write it elsewhere")
    if os.path.isdir(target):
        raise InspectorError(f"{target} is a directory")
    if os.path.lexists(target) and not force:
        raise InspectorError(f"{target} exists; pass --force to replace it")
    return target


def _publish(tmp: str, target: Path, force: bool) -> None:
    """Move the finished ``tmp`` to ``target``: replacing it only with ``force``."""
    if force:
        os.replace(tmp, target)
        return
    try:
        os.link(tmp, target)  # fails if target appeared meanwhile: never overwrites
    except FileExistsError:
        raise InspectorError(f"{target} exists; pass --force to replace it") from None
    except OSError:  # a file system without hard links
        if os.path.lexists(target):
            raise InspectorError(f"{target} exists; pass --force to replace it") from None
        os.replace(tmp, target)


def write_file(target: Path, write: Callable[[BinaryIO], None], force: bool = False) -> None:
    """Call ``write(file)`` on a new hidden file beside ``target``, then move it to ``target``
    (a crash leaves no half-written output under the final name)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = create_temporary(target)  # the umask applied, as a plain open() would
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        _publish(tmp, target, force)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def _session_arg(value: str | None) -> int | str | None:
    """--session: a number, 'all', or None (sessions merged, the later one wins a step)."""
    if value is None or value == ALL:
        return value
    if not value.isdigit():
        raise InspectorError(f"--session {value!r} must be a session number or 'all'")
    return int(value)


def _npz_arrays(run: Run, names: list[str], rng: tuple[int, int] | None,
                where: dict) -> dict[str, np.ndarray]:
    """The dumped arrays to export. Keys are ``step<N>/<key>``, with ``batch<B>/`` after the
    step in eval/predict, prefixed by ``<worker>/`` when several workers are exported and by
    ``s<session>/`` with ``session='all'``, so that no two writers' arrays share a key."""
    mode, worker, session = where["mode"], where["worker"], where["session"]
    index = run.dump_index(**where)
    files = sorted((f for (step, _), fs in index.items() if not rng or rng[0] <= step <= rng[1]
                    for f in fs),
                   key=lambda f: (f.worker, f.session, f.step, f.batch))
    by_worker = worker == ALL or (worker is None and run.default_worker is None)  # several workers
    arrays = {}
    for f in tqdm(files, desc="export", unit="dump", disable=len(files) < 20):
        at = dict(mode=mode, batch=f.batch, session=f.session)
        prefix = (f"{f.worker}/" if by_worker else "") \
            + (f"s{f.session}/" if session == ALL else "") \
            + f"step{f.step}/" + (f"batch{f.batch}/" if mode != "train" else "")
        for key in sorted(run.dump_keys(f.step, f.worker, **at)):
            kind, _, name = key.partition("/")
            if kind == "samples" or name in names:
                arrays[prefix + key] = np.asarray(run.dump_array(f.step, key, f.worker, **at))
    if not arrays:
        dumped = run.dump_steps(**where)
        raise InspectorError(f"no dumped tensors match (dumped {mode} steps: "
                             f"{_short(dumped) or 'none'})")
    return arrays


def export(run: Run, fmt: str, out: Path, tensors: str | None = None, steps: str | None = None,
           force: bool = False, *, worker: str | None = None, mode: str = "train",
           session: int | str | None = None, groups: Sequence[str] | None = None) -> str:
    """Write dumped tensors (npz) or statistics (csv, parquet) of ``run`` to ``out`` (see
    :func:`output_path`); returns a line naming what was written and where. ``worker``,
    ``mode``, ``session`` choose as the reader does (default: the chief's training, sessions
    merged). ``groups``: statistics of these groups only (``run.groups``; npz ignores it)."""
    if fmt not in ("npz", "csv", "parquet"):
        raise InspectorError(f"--format {fmt!r} must be npz, csv or parquet")
    names, rng = _select(run, tensors), parse_steps(steps)
    where: dict[str, Any] = dict(mode=mode, worker=worker, session=session)
    target = output_path(run, fmt, Path(out), force)
    if fmt == "npz":
        arrays = _npz_arrays(run, names, rng, where)
        write_file(target, lambda f: np.savez(f, **arrays), force)
        return f"wrote {len(arrays)} arrays to {target}"
    table = run.query_stats_table(tensors=names, steps=rng, groups=groups, **where)
    if fmt == "parquet":
        write_file(target, lambda f: pq.write_table(table, f), force)
    else:
        df = Run.to_pandas(table)
        # lists as space-separated numbers
        for column in ("histogram", "hist_bucket", "hist_count"):
            if column in df:
                df[column] = [" ".join(map(str, h)) if h is not None else "" for h in df[column]]
        write_file(target, lambda f: df.to_csv(f, index=False), force)
    return f"wrote {table.num_rows} statistics rows to {target}"


#: What ``export --tensorboard`` needs beyond the core install (the ``tensorboard`` extra).
TENSORBOARD_EXTRA = "pip install 'tf-inspector[tensorboard]'"


def tensorboard(path: str, logdir: Path, *, storage_options: dict | None = None,
                tensors: str | None = None, worker: str | None = None, per_layer: bool = False,
                histogram_every: int = 0, force: bool = False,
                follow_every: float | None = None) -> str:
    """Write the run's statistics as TensorBoard event files under ``logdir/<run name>``
    (``inspector.export.tensorboard``); with ``follow_every`` (seconds), keep exporting new steps
    until the run ends. Returns a line naming what was written and where; ExportIncomplete
    (its message that line and what was left out) where a damaged or missing part, an invalid
    histogram row or an unsafe group name left rows out."""
    if not _importable("tensorboard"):
        raise InspectorError(f"--tensorboard needs the tensorboard package: {TENSORBOARD_EXTRA}")
    if follow_every is not None and not follow_every > 0:
        raise InspectorError(f"--interval {follow_every:g} must be a number of seconds > 0")
    from inspector.export.tensorboard import Exporter, describe, follow

    run = _open_checked(path, storage_options)
    _select(run, tensors)   # a bad or unmatched pattern refused before anything is written
    ex = Exporter(lambda: _open_checked(path, storage_options), Path(logdir), first=run,
                  tensors=tensors, worker=worker, per_layer=per_layer,
                  histogram_every=histogram_every, force=force)
    try:
        if follow_every is None:
            ex.poll(run)
        else:
            print(f"following {run.path} into {ex.root} every {follow_every:g} s (Ctrl-C stops)",
                  flush=True)
            follow(ex, follow_every, log=lambda line: print(line, flush=True))
    finally:
        ex.close()
    if ex.problems:
        shown = "\n".join(f"  left out: {m}" for m in problem_lines(ex.problems))
        raise ExportIncomplete(f"{describe(ex)}; {len(ex.problems)} problem(s) left rows out:\n"
                               f"{shown}")
    return describe(ex)


class ExportIncomplete(InspectorError):
    """An export that wrote what it could and left some rows out (the message names them)."""


def _given(args: argparse.Namespace, options: dict[str, str]) -> list[str]:
    """Those of ``options`` (option: its dest) given on the command line."""
    return [o for o, dest in options.items() if getattr(args, dest) not in (None, False)]


def _tensorboard_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Which export options go together: --tensorboard with --logdir, the others with --format and
    --out."""
    if not args.tensorboard:
        extra = _given(args, {"--logdir": "logdir", "--follow": "follow", "--interval": "interval",
                              "--per-layer": "per_layer", "--histogram-every": "histogram_every"})
        if extra:
            ap.error(f"{', '.join(extra)}: only with --tensorboard")
        if args.format is None or args.out is None:
            ap.error("export needs --format and --out (or --tensorboard and --logdir)")
        return
    if not args.logdir:
        ap.error("--tensorboard needs --logdir DIR (the folder to write event files in)")
    bad = _given(args, {"--format": "format", "--out": "out", "--steps": "steps",
                        "--session": "session", "--group": "groups"}) \
        + (["--mode"] if args.mode != "train" else [])
    if bad:
        ap.error(f"{', '.join(bad)}: not with --tensorboard (it exports training and evaluation, "
                 "every step, every group)")
    if args.interval is not None and not args.follow:
        ap.error("--interval only applies with --follow")


def _one_line(e: BaseException) -> str:
    text = str(e) if isinstance(e, InspectorError) else f"{type(e).__name__}: {e}"
    return " ".join(text.split())


def _runs(path: str, storage_options: dict | None = None) -> list:
    if is_url(path):  # a folder in an object store: the runs under it, as URLs
        with _remote(path):
            runs = find_runs(path, storage_options)
            if not runs:
                # raises a NotARunError that says what is there
                open_run(path, storage_options=storage_options)
        return runs
    p = Path(path)
    if not p.exists():
        raise NotARunError(f"{p} does not exist; give a run directory or a folder of runs")
    if not p.is_dir():
        raise NotARunError(f"{p} is not a directory; give a run directory or a folder of runs")
    runs = find_runs(p)
    if not runs:
        open_run(p)  # raises a NotARunError that says what is there
    return runs


def _open_checked(path: str | Path, storage_options: dict | None = None) -> Run:
    """The run at ``path``, refused (never opened) if a file it would read is a FIFO or other
    special file: opening one would block forever. A URL (object storage) has no such files."""
    if is_url(path):
        with _remote(path):
            return open_run(path, storage_options=storage_options)
    path = local_path(path)
    bad = special_entries(path)
    if bad:
        raise InspectorError(f"{path}: refused to read it: {'; '.join(bad)}")
    return open_run(path)


def info(path: str, storage_options: dict | None = None, strict: bool = False,
         all_problems: bool = False) -> int:
    """Print the summary of the run at ``path`` (a folder or a URL), or of every run in it; 0 if
    all were read cleanly, 1 if some have damaged or missing files (``strict``: or recorded
    what they did not write: dropped data, write errors), 2 if some could not be read."""
    status = 0
    for i, r in enumerate(_runs(path, storage_options)):
        try:
            run = _open_checked(r, storage_options)
            text = summary(run, all_problems)
        except Exception as e:  # noqa: BLE001 - one bad run must not hide the others
            print(f"error: {r}: {_one_line(e)}", file=sys.stderr, flush=True)
            status = 2
            continue
        print(("\n" if i else "") + text, flush=True)
        if run.problems or (strict and (len(run.dropped) or len(run.errors))):
            status = max(status, 1)
    return status


#: What the viewer imports beyond the core install (the ``viewer`` extra).
VIEWER_MODULES = ("streamlit", "matplotlib")


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a half-imported module
        return False


def app(run: str, port: int, address: str, storage_options: dict | None = None) -> int:
    """Serve the viewer on ``run``: ``streamlit run`` (through :mod:`viewer.start`) on the
    script shipped in the ``viewer`` package (found with importlib.resources, so an installed
    wheel works, not only a checkout)."""
    missing = [m for m in VIEWER_MODULES if not _importable(m)]
    if missing:
        raise InspectorError(f"the viewer needs {' and '.join(missing)}: pip install "
                             "'tf-inspector[viewer]'")
    script = importlib.resources.files("viewer").joinpath("app.py")
    # the viewer process reads its storage options from the environment (storage.OPTIONS_ENV)
    env: dict[str, Any] = {"env": {**os.environ, OPTIONS_ENV: json.dumps(storage_options)}} \
        if storage_options else {}
    with importlib.resources.as_file(script) as path:  # a real file even from a zipped install
        # viewer.start: `streamlit run` with the pages' imports done while the server starts
        return serve([sys.executable, "-m", "viewer.start", "run", str(path), "--server.port",
                      str(port), "--server.address", address, "--client.toolbarMode", "viewer",
                      "--browser.gatherUsageStats", "false", "--", run],
                     **env)


def serve(cmd: list[str], **popen: Any) -> int:
    """Run ``cmd`` (the viewer's server) until it exits, and take it down with this process: a
    SIGTERM or SIGHUP is passed on to it, and any other exit (Ctrl-C) terminates it. With
    ``subprocess.call`` a SIGTERM to ``tf-inspector app`` (a process manager, ``docker stop``,
    a test's ``terminate()``) left the server running, orphaned, holding its port."""
    import signal
    proc: subprocess.Popen | None = None
    pending: list[int] = []   # signals before the server started: passed on once it has

    def forward(signum: int, _frame: Any) -> None:
        if proc is None:
            pending.append(signum)
        else:
            proc.send_signal(signum)
    names = [n for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n)]
    saved = {}
    try:
        # before the server starts: a signal in between would end this process the default way,
        # the server orphaned on its port
        for name in names:   # the main thread only (the CLI's); elsewhere nothing to forward
            with contextlib.suppress(ValueError):
                saved[name] = signal.signal(getattr(signal, name), forward)
        proc = subprocess.Popen(cmd, **popen)
        for signum in pending:
            proc.send_signal(signum)
        return proc.wait()
    finally:
        for name, handler in saved.items():
            signal.signal(getattr(signal, name), handler)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


RUN_HELP = ("a run directory or a folder of runs: a path, file://, or an fsspec URL "
            "(s3://bucket/runs/exp1)")
OPTIONS_HELP = ("for a URL: a JSON object of fsspec storage options, e.g. "
                "'{\"endpoint_url\": \"http://host:9000\"}' (default: credentials and settings "
                "from the environment, as s3fs documents)")
TIMEOUT_HELP = ("for an s3:// URL: seconds a request may take to connect and each read may wait, "
                f"tried 3 times (default ${TIMEOUT_ENV}, else 10)")


def _timeout(text: str) -> float:
    """``--timeout``: a positive number of seconds (argparse prints the ArgumentTypeError's
    text)."""
    try:
        return storage_timeout(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be a positive number of seconds, not "
                                         f"{text!r}") from None


def _options(text: str) -> dict:
    """``--storage-options``: a JSON object (argparse prints the ArgumentTypeError's text)."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--storage-options is not JSON ({e}); give a JSON "
                                         "object, e.g. "
                                         "'{\"endpoint_url\": \"http://minio:9000\"}'") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"--storage-options must be a JSON object, not {text!r}")
    return value


@contextlib.contextmanager
def _remote(path: str | Path) -> Iterator[None]:
    """Errors of an object store's client (an unreachable endpoint, an option its filesystem
    does not take) as one InspectorError line that says what to check, not a traceback."""
    hint = (f"(check the URL and the storage options: --storage-options or ${OPTIONS_ENV}, e.g. "
            "endpoint_url, key, secret)")
    try:
        yield
    except StorageError as e:   # the store's own error, without the URL it repeats
        raise InspectorError(f"cannot read {path}: {e.cause or e} {hint}") from e
    except InspectorError:
        raise
    except Exception as e:  # noqa: BLE001 - aiohttp, TypeError of a misspelt option...
        raise InspectorError(f"cannot read {path}: {type(e).__name__}: {e} {hint}") from e


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m inspector",
                                 description="Inspect TF Inspector runs.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("info", help="summary of a run (or of every run in a folder); checks every "
                                    "dump's header")
    p.add_argument("run", help=RUN_HELP)
    p.add_argument("--strict", action="store_true",
                   help="exit 1 also when a session recorded losses (dropped data, write errors), "
                        "not only for damaged or missing files")
    p.add_argument("--all-problems", action="store_true",
                   help=f"list every problem (default: {PROBLEMS_SHOWN} of each kind and a count)")
    p.add_argument("--storage-options", type=_options, help=OPTIONS_HELP)
    p.add_argument("--timeout", type=_timeout, help=TIMEOUT_HELP)
    p = sub.add_parser("export", help="write dumped tensors (npz), statistics (csv, parquet) or "
                                      "TensorBoard events")
    p.add_argument("run", help=RUN_HELP)
    p.add_argument("--storage-options", type=_options, help=OPTIONS_HELP)
    p.add_argument("--timeout", type=_timeout, help=TIMEOUT_HELP)
    p.add_argument("--format", choices=["npz", "csv", "parquet"])
    p.add_argument("--out", type=Path,
                   help="output file, or an existing folder to write "
                        "<folder>/<run name>.<format> in")
    p.add_argument("--force", action="store_true",
                   help="replace an existing output file (or TensorBoard export)")
    p.add_argument("--tensorboard", action="store_true",
                   help="write TensorBoard event files under "
                        "--logdir/<run name>/<group>/train|validation (docs/tensorboard.md; "
                        f"{TENSORBOARD_EXTRA})")
    p.add_argument("--logdir", type=Path,
                   help="with --tensorboard: the folder to give `tensorboard --logdir`")
    p.add_argument("--follow", action="store_true",
                   help="with --tensorboard: keep exporting new steps until the run ends")
    p.add_argument("--interval", type=float,
                   help="with --follow: seconds between polls (default 5)")
    p.add_argument("--per-layer", action="store_true",
                   help="with --tensorboard: one tag per layer (its output tensor), as the "
                        "Training overview folds")
    p.add_argument("--histogram-every", type=int,
                   help="with --tensorboard: histograms every N steps (default: about 100 per tag)")
    p.add_argument("--tensors", help="regex on tensor names")
    p.add_argument("--steps", help="inclusive steps: N, A:B, A: or :B")
    p.add_argument("--worker", help="a worker name, or 'all' (default: the chief)")
    p.add_argument("--mode", default="train", choices=["train", "eval", "predict"])
    p.add_argument("--session", help="a session number, or 'all' (default: sessions merged, the "
                                     "later wins a step)")
    p.add_argument("--group", action="append", dest="groups",
                   help="statistics of this group only (repeatable; 'info' lists the run's groups)")
    p = sub.add_parser("app", help="open the Streamlit viewer on a run or a folder of runs")
    p.add_argument("run", help=RUN_HELP)
    p.add_argument("--storage-options", type=_options, help=OPTIONS_HELP)
    p.add_argument("--timeout", type=_timeout, help=TIMEOUT_HELP)
    p.add_argument("--port", type=int, default=8501)
    p.add_argument("--address", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: "
                        "every interface)")
    return ap


def _main(argv: Sequence[str] | None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.cmd == "export":
        _tensorboard_args(ap, args)
    with _timeout_env(args.timeout):
        return _command(args)


@contextlib.contextmanager
def _timeout_env(timeout: float | None) -> Iterator[None]:
    """$TF_INSPECTOR_STORAGE_TIMEOUT set to ``--timeout`` while the command runs: every store
    it opens reads it (the viewer's process too), and the caller's environment is left as it was."""
    if timeout is None:
        yield
        return
    before = os.environ.get(TIMEOUT_ENV)
    os.environ[TIMEOUT_ENV] = str(timeout)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(TIMEOUT_ENV, None)
        else:
            os.environ[TIMEOUT_ENV] = before


def _command(args: argparse.Namespace) -> int:
    try:
        if args.cmd == "info":
            return info(args.run, args.storage_options, args.strict, args.all_problems)
        if args.cmd == "export" and args.tensorboard:
            every = (5.0 if args.interval is None else args.interval) if args.follow else None
            print(tensorboard(args.run, args.logdir, storage_options=args.storage_options,
                              tensors=args.tensors, worker=args.worker, per_layer=args.per_layer,
                              histogram_every=args.histogram_every or 0, force=args.force,
                              follow_every=every))
        elif args.cmd == "export":
            print(export(_open_checked(args.run, args.storage_options), args.format, args.out,
                         args.tensors, args.steps, args.force, worker=args.worker, mode=args.mode,
                         session=_session_arg(args.session), groups=args.groups))
        elif args.cmd == "app":
            return app(args.run, args.port, args.address, args.storage_options)
    except BrokenPipeError:
        raise
    except ExportIncomplete as e:   # what was written, then each left-out kind on its line
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (InspectorError, ValueError, OSError) as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; a closed output pipe (``info | head -1``) ends it quietly."""
    try:
        status = _main(argv)
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141  # as if killed by SIGPIPE, like other tools in a pipe
    except KeyboardInterrupt:
        return 130
