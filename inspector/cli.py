"""``python -m inspector info | export | app``: the run from a shell.

Examples::

    python -m inspector info runs/exp1
    python -m inspector export runs/exp1 --format npz --out exp1.npz --tensors 'conv' --steps 100:500
    python -m inspector export runs/exp1 --format parquet --out stats.parquet
    python -m inspector app runs/
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow.parquet as pq
from tqdm import tqdm

from .errors import InspectorError
from .run import ALL, Run, find_runs, open_run, parse_steps


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def summary(run: Run) -> str:
    """A readable summary: status, steps, tensors, bytes, anomalies."""
    m, t = run.manifest, run.tensors
    stats_steps = run.query_stats(groups=["all"], kinds=["forward"], columns=[])["step"]
    lines = [
        f"run        {run.path}",
        f"status     {run.status}   workers: {', '.join(run.workers)}   tensorflow {m.get('tensorflow_version', '?')}",
        f"loss       {m.get('loss')}   labels: {m.get('labels')}",
        f"tensors    {len(t)} captured, {int(t['has_gradient'].sum()) if len(t) else 0} with gradients, "
        f"{int(t['batched'].sum()) if len(t) else 0} batched, {len(m.get('skipped', []))} skipped (not fetchable)",
        f"statistics {stats_steps.nunique()} steps" + (f" ({stats_steps.min()}..{stats_steps.max()})" if len(stats_steps) else ""),
        f"dumps      {len(run.steps)} steps" + (f": {_short(run.steps)}" if run.steps else ""),
        f"size       {_human(run.size_bytes())}",
    ]
    roles = t[t["icnn_role"].notna()] if len(t) else t
    if len(roles):
        lines.append(f"icnn       layers: {', '.join(sorted(set(roles['icnn_layer'])))}")
    nf = run.first_nonfinite()
    lines.append("anomalies  " + (f"first NaN/Inf at step {nf['step']} in {nf['tensor']} ({nf.get('kind', '?')}, "
                                  f"seen by the {nf['source']})" if nf else "no NaN/Inf seen"))
    lines += _sessions_lines(run)
    for r in run.errors.itertuples():
        lines.append(f"ERROR      {r.worker} session {r.session}: {r.what} {r.reason} ({r.count}x"
                     + (f", steps {r.first_step}..{r.last_step})" if r.first_step == r.first_step
                        and r.first_step is not None else ")"))
    for r in run.dropped.itertuples():
        lines.append(f"dropped    {r.count} {r.what}(s) of {r.worker} session {r.session}, steps "
                     f"{r.first_step}..{r.last_step}: {r.reason}")
    for p in run.problems:
        lines.append(f"problem    {p}")
    return "\n".join(lines)


def _sessions_lines(run: Run) -> list[str]:
    """One line per writer session: worker, number, mode, state, steps; failures with their error."""
    out = []
    for r in run.sessions.itertuples():
        steps = f"steps {r.first_step}..{r.last_step}" if r.first_step is not None and r.first_step == r.first_step \
            else "no steps"
        flag = "FAILED " if r.state in ("failed", "crashed") else ""
        out.append(f"session    {flag}{r.worker} s{r.session} {r.mode:<7} {r.state:<8} {steps}"
                   + (f": {r.error}" if isinstance(r.error, str) and r.error else ""))
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
        raise InspectorError(f"--tensors {pattern!r} is not a valid regular expression: {e}") from None
    chosen = [n for n in names if rx.search(n)]
    if not chosen:
        raise InspectorError(f"--tensors {pattern!r} matches none of the {len(names)} tensors of {run.path}")
    return chosen


def _session_arg(value: str | None) -> int | str | None:
    """--session: a number, 'all', or None (sessions merged, the later one wins a step)."""
    if value is None or value == ALL:
        return value
    if not value.isdigit():
        raise InspectorError(f"--session {value!r} must be a session number or 'all'")
    return int(value)


def export(run: Run, fmt: str, out: Path, tensors: str | None = None, steps: str | None = None, *,
           worker: str | None = None, mode: str = "train", session: int | str | None = None) -> str:
    """Write dumped tensors (npz) or statistics (csv, parquet) of ``run`` to ``out``.

    ``worker``, ``mode``, ``session`` choose as the reader does (default: the chief's training,
    sessions merged). npz keys are ``step<N>/<key>``, with ``batch<B>/`` after the step in
    eval/predict, prefixed by ``<worker>/`` when several workers are exported and by
    ``s<session>/`` with ``session='all'``, so that no two writers' arrays share a key."""
    names, rng = _select(run, tensors), parse_steps(steps)
    if fmt == "npz":
        arrays = {}
        index = run.dump_index(mode=mode, worker=worker, session=session)
        files = sorted((f for (step, _), fs in index.items() if not rng or rng[0] <= step <= rng[1] for f in fs),
                       key=lambda f: (f.worker, f.session, f.step, f.batch))
        by_worker = worker == ALL or (worker is None and run.default_worker is None)  # several workers
        for f in tqdm(files, desc="export", unit="dump", disable=len(files) < 20):
            where = dict(mode=mode, batch=f.batch, session=f.session)
            prefix = (f"{f.worker}/" if by_worker else "") + (f"s{f.session}/" if session == ALL else "") \
                + f"step{f.step}/" + (f"batch{f.batch}/" if mode != "train" else "")
            for key in sorted(run.dump_keys(f.step, f.worker, **where)):
                kind, _, name = key.partition("/")
                if kind == "samples" or name in names:
                    arrays[prefix + key] = np.asarray(run.dump_array(f.step, key, f.worker, **where))
        if not arrays:
            dumped = run.dump_steps(mode=mode, worker=worker, session=session)
            raise InspectorError(f"no dumped tensors match (dumped {mode} steps: {_short(dumped) or 'none'})")
        out.parent.mkdir(parents=True, exist_ok=True)
        np.savez(out, **arrays)
        return f"wrote {len(arrays)} arrays to {out}"
    if fmt in ("csv", "parquet"):
        table = run.query_stats_table(tensors=names, steps=rng, mode=mode, worker=worker, session=session)
        out.parent.mkdir(parents=True, exist_ok=True)
        if fmt == "parquet":
            pq.write_table(table, out)
        else:
            df = run._to_pandas(table)
            if "histogram" in df:
                df["histogram"] = [" ".join(map(str, h)) for h in df["histogram"]]
            df.to_csv(out, index=False)
        return f"wrote {table.num_rows} statistics rows to {out}"
    raise InspectorError(f"--format {fmt!r} must be npz, csv or parquet")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m inspector", description="Inspect TF Inspector runs.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("info", help="summary of a run (or of every run in a folder)")
    p.add_argument("run")
    p = sub.add_parser("export", help="write dumped tensors (npz) or statistics (csv, parquet)")
    p.add_argument("run")
    p.add_argument("--format", required=True, choices=["npz", "csv", "parquet"])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--tensors", help="regex on tensor names")
    p.add_argument("--steps", help="inclusive step range A:B")
    p.add_argument("--worker", help="a worker name, or 'all' (default: the chief)")
    p.add_argument("--mode", default="train", choices=["train", "eval", "predict"])
    p.add_argument("--session", help="a session number, or 'all' (default: sessions merged, the later wins a step)")
    p = sub.add_parser("app", help="open the Streamlit viewer on a run or a folder of runs")
    p.add_argument("run")
    p.add_argument("--port", type=int, default=8501)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "info":
            runs = find_runs(args.run)
            if not runs:
                open_run(args.run)  # raises a NotARunError that says what is there
            print("\n\n".join(summary(open_run(r)) for r in runs))
        elif args.cmd == "export":
            print(export(open_run(args.run), args.format, args.out, args.tensors, args.steps, worker=args.worker,
                         mode=args.mode, session=_session_arg(args.session)))
        elif args.cmd == "app":
            app = Path(__file__).resolve().parent.parent / "app.py"
            return subprocess.call([sys.executable, "-m", "streamlit", "run", str(app), "--server.port",
                                    str(args.port), "--", args.run])
    except (InspectorError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
