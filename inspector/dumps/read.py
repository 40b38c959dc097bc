"""Reading a run's full dumps: which dump files each view sees, their headers and arrays, the
samples they kept. The bodies of :class:`inspector.Run`'s dump methods, as functions taking the
run (``run``: an ``inspector.Run``; its caches, ``_headers``, ``_indexes``, ``_alias_maps``, stay
on it). This module never imports :mod:`inspector.run`: ``run`` is typed ``Any``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from inspector.dumps import files as safetensors_io
from inspector.dumps.schema import check_samples
from inspector.errors import DamagedFileError, InspectorError, NoDumpError, nearest, suggest
from inspector.format import KINDS, parse_dump_name
from inspector.format.manifest import CALLER_DEFAULTS
from inspector.sessions.crosscheck import dump_problems

#: ``inspector.run.ALL``: every worker, or every session unmerged (not imported from there).
_ALL = "all"


@dataclass(frozen=True)
class DumpFile:
    worker: str
    session: int
    step: int
    batch: int
    path: Path | str  # for messages: the local path, or the URL of the object
    rel: str = ""     # its name inside the run directory (``dumps/...``)
    size: int | None = None  # from the listing (objects in a store are never rewritten)


def _aliases(path: Path | str, header: dict) -> dict[str, str]:
    """{alias key: stored key} from a dump header's metadata; DamagedFileError if they dangle."""
    try:
        return safetensors_io.aliases(header)  # checked by read_header already
    except ValueError as e:
        raise DamagedFileError(f"damaged dump file {path}: {e}") from None


def dump_files(run: Any) -> list[DumpFile]:
    """Every dump file of a known worker, sorted by name (the problems of the listing recorded)."""
    out = []
    listed = run.store.list("dumps")
    run.problems += [p for p in dump_problems(run.manifests, {e.name for e in listed},
                                              run.store.display)
                     if p not in run.problems]
    for e in sorted(listed, key=lambda e: e.name):
        ids = parse_dump_name(e.name)
        if ids and any(w == ids[0] for w, _ in run.manifests):
            rel = f"dumps/{e.name}"
            path = run.path / rel if run.store.is_local else run.store.display(rel)
            out.append(DumpFile(*ids, path, rel, e.size))
    return out


def dump_index(run: Any, *, mode: str | None = None, worker: str | None = None,
               session: int | str | None = None) -> dict[tuple[int, int], list[DumpFile]]:
    """:meth:`inspector.Run.dump_index` (documented there)."""
    key = (*run._where(mode, worker)[:2], session)
    if key not in run._indexes:
        run._indexes[key] = _build_index(run, *key)
    return run._indexes[key]


def _build_index(run: Any, mode: str, worker: str | None,
                 session: int | str | None) -> dict[tuple[int, int], list[DumpFile]]:
    chosen = run._selected(((f.worker, f.session, f) for f in run._dump_files), mode, worker,
                           session)
    latest: dict[tuple[str, str, int], int] = {}
    for w, s, f in chosen:
        key = (w, run._mode_of(w, s), f.step)
        latest[key] = max(latest.get(key, -1), s)
    out: dict[tuple[int, int], list[DumpFile]] = {}
    for w, s, f in chosen:
        if session is not None or latest[(w, run._mode_of(w, s), f.step)] == s:
            out.setdefault((f.step, f.batch), []).append(f)
    return out


def dump_steps(run: Any, *, mode: str | None = None, worker: str | None = None,
               session: int | str | None = None) -> list[int]:
    """:meth:`inspector.Run.dump_steps` (documented there)."""
    return sorted({step for step, _ in dump_index(run, mode=mode, worker=worker,
                                                  session=session)})


def dump_of(run: Any, step: int, worker: str | None, mode: str | None = None,
            batch: int | None = None, session: int | str | None = None) -> DumpFile:
    index = dump_index(run, mode=mode, worker=worker, session=session)
    mode, _, batch = run._where(mode, worker, batch)
    batch = batch or 0
    files = index.get((int(step), int(batch)))
    if not files:
        others = sorted({f.worker for f in dump_index(run, mode=mode, worker=_ALL).get(
            (int(step), int(batch)), [])})
        where = f" (workers {others} dumped it: pass worker=)" if others else ""
        where += _sessions_holding(run, step, None, worker, mode, batch) if session is None \
            else ""
        have = sorted({s for s, _ in index})
        raise NoDumpError(f"no {mode} dump at step {step}" +
                          (f" batch {batch}" if batch else "") +
                          f" in {run.path}{where}; nearest dumped steps: "
                          f"{nearest(int(step), have) or 'none (run.steps is empty)'}")
    if len(files) > 1:
        raise InspectorError(f"step {step} was dumped by {len(files)} writers ("
                             f"{', '.join(f'{f.worker} session {f.session}' for f in files)}): "
                             "pass worker= (and session=) to choose one")
    return files[0]


def _sessions_holding(run: Any, step: int, key: str | None, worker: str | None, mode: str | None,
                      batch: int | None) -> str:
    """Where the merged view has no dump of ``step`` holding ``key`` (None: any dump), the
    sessions whose own dump of it does (a later session dumped the step without the tensor,
    or a new training hides the session that dumped it), as a hint naming ``session=``."""
    mode, _, batch = run._where(mode, worker, batch)
    files = dump_index(run, mode=mode, worker=worker, session=_ALL).get(
        (int(step), int(batch or 0)), [])
    found = []
    for f in files:
        try:
            if key is None or key in dump_header(run, f)[0] or key in _dump_aliases(run, f):
                found.append(f)
        except DamagedFileError:
            continue
    if not found:
        return ""
    hidden = [" (hidden: an earlier training, before the new training of session "
              f"{run._hidden[k]})"
              if (k := (f.worker, f.session)) in run._hidden else "" for f in found]
    names = ", ".join(f"session {f.session}{h}" for f, h in zip(found, hidden))
    return f"; the dump of that step by {names} holds it: pass session={found[-1].session}"


def check_dumps(run: Any) -> int:
    """:meth:`inspector.Run.check_dumps` (documented there)."""
    damaged = 0
    for f in run._dump_files:
        try:
            dump_header(run, f)
        except DamagedFileError:
            damaged += 1
    return damaged


def _ranged(run: Any, f: DumpFile) -> Any:
    """The dump file open for range reads (a listed size is trusted: objects are never
    rewritten)."""
    if f.size is None and not run.store.is_local:  # (locally, opening it says what it is)
        raise DamagedFileError(f"{f.path}: not a file (a folder); refused")
    return run.store.ranged(f.rel, f.size)


def dump_header(run: Any, f: DumpFile) -> tuple[dict, int]:
    """(header, data start) of a dump file, read and checked once; aliases parsed with it."""
    path = f.rel
    if path not in run._headers:
        try:
            with _ranged(run, f) as r:  # locally a regular file inside the run (safe_files)
                header, start = safetensors_io.header_of(r)
            _check_dump_identity(f, header)
            run._alias_maps[path] = _aliases(f.path, header)
            run._headers[path] = header, start
        except DamagedFileError as e:
            if str(e) not in run.problems:
                run.problems.append(str(e))
            raise
    return run._headers[path]


def _dump_aliases(run: Any, f: DumpFile) -> dict[str, str]:
    """{alias key: stored key} of a dump file (format.ALIASES_KEY)."""
    dump_header(run, f)
    return run._alias_maps[f.rel]


def dump_keys(run: Any, step: int, worker: str | None = None, *, mode: str | None = None,
              batch: int | None = None, session: int | None = None) -> list[str]:
    """:meth:`inspector.Run.dump_keys` (documented there)."""
    f = dump_of(run, step, worker, mode, batch, session)
    return [k for k in dump_header(run, f)[0] if k != "__metadata__"] + list(_dump_aliases(run, f))


def dump_array(run: Any, step: int, key: str, worker: str | None = None, *, mode: str | None = None,
               batch: int | None = None, session: int | None = None) -> np.ndarray:
    """:meth:`inspector.Run.dump_array` (documented there)."""
    f = dump_of(run, step, worker, mode, batch, session)
    header, start = dump_header(run, f)
    key = _dump_aliases(run, f).get(key, key)
    if key not in header or key == "__metadata__":
        raise NoDumpError(f"the dump of step {step} holds no {key!r}.{suggest(key, header)}")
    try:
        if run.store.is_local:
            return safetensors_io.load(run.path / f.rel, key, header, start, root=run.path,
                                       verified=run._verified)
        with _ranged(run, f) as r:
            return safetensors_io.load_ranged(r, key, header, start, verified=run._verified)
    except DamagedFileError as e:
        if str(e) not in run.problems:
            run.problems.append(str(e))
        raise


def tensor(run: Any, name: str, step: int, kind: str = "forward", worker: str | None = None, *,
           mode: str | None = None, batch: int | None = None,
           session: int | None = None, sample: int | None = None) -> np.ndarray:
    """:meth:`inspector.Run.tensor` (documented there)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    run.check_tensor(name)
    if sample is not None:
        return _sample_row(run, name, step, kind, worker, mode, batch, session, sample)
    if kind == "gradient" and not bool(run.tensors.loc[name, "has_gradient"]):
        note = run.tensors.loc[name, "gradient_note"]
        why = note if isinstance(note, str) and note else "does not reach the loss"
        raise NoDumpError(f"{name!r} {why}, so it has no gradient (has_gradient=False)")
    key = f"{kind}/{name}"
    if key not in dump_keys(run, step, worker, mode=mode, batch=batch, session=session):
        f = dump_of(run, step, worker, mode, batch, session)
        later = _sessions_holding(run, step, key, worker, mode, batch) if session is None \
            else ""
        raise NoDumpError(f"the dump of step {step} (session {f.session}) holds no {kind} of "
                          f"{name!r}{later}; see run.dump_keys({step})")
    return dump_array(run, step, key, worker, mode=mode, batch=batch, session=session)


def whole_reason(run: Any, name: str) -> str | None:
    """Why ``name``'s dumps hold the whole tensor rather than one row per kept sample (catalog
    ``batched`` false), or None for a per-sample tensor."""
    cat = run.tensors
    if "batched" not in cat or bool(cat.loc[name, "batched"]):
        return None
    note = cat.loc[name, "batch_note"] if "batch_note" in cat else None
    return note if isinstance(note, str) and note else "catalog batched=False"


def _sample_row(run: Any, name: str, step: int, kind: str, worker: str | None, mode: str | None,
                batch: int | None, session: int | None, sample: int) -> np.ndarray:
    """Row of batch sample ``sample`` (an ``index`` of :func:`samples`) in ``name``'s dump."""
    if isinstance(sample, bool) or not isinstance(sample, (int, np.integer)):
        raise ValueError(f"sample must be a batch index (an int of run.samples({step})['index']), "
                         f"not {sample!r}")
    why = whole_reason(run, name)
    if why is not None:
        raise ValueError(f"{name} is stored whole, not one row per kept sample ({why}): its "
                         f"rows are not the samples of run.samples({step}), so sample={sample} "
                         "cannot pick one (read it without sample=)")
    kept = samples(run, step, worker, mode=mode, batch=batch, session=session, tensor=name)
    rows = np.flatnonzero(np.asarray(kept["index"]) == sample)
    if not len(rows):
        raise NoDumpError(f"sample {sample} was not kept in the dump of step {step}; kept: "
                          f"{kept['index'].tolist()}")
    arr = tensor(run, name, step, kind, worker, mode=mode, batch=batch, session=session)
    return arr[int(rows[0])]


def samples(run: Any, step: int, worker: str | None = None, *, mode: str | None = None,
            batch: int | None = None, session: int | None = None, tower: str | None = None,
            tensor: str | None = None) -> pd.DataFrame:
    """:meth:`inspector.Run.samples` (documented there)."""
    if tensor is not None:
        tensor = run.check_tensor(tensor)
        why = whole_reason(run, tensor)
        if why is not None:
            raise ValueError(f"{tensor} is not per-sample ({why}): its dumps hold the whole "
                             "tensor, whose rows are not the kept samples; "
                             f"run.samples({step}) lists those")
        own = run.tensors.loc[tensor, "tower"]
        own = own if isinstance(own, str) else None
        if tower is not None and tower != own:
            whose = f"tower {own!r}" if own else "the whole batch"
            raise ValueError(f"tower={tower!r} with tensor={tensor!r}, whose rows are samples "
                             f"of {whose}")
        tower = own
    f = dump_of(run, step, worker, mode, batch, session)
    keys = dump_keys(run, step, worker, mode=mode, batch=batch, session=session)
    prefix = "samples/" if tower is None else f"samples/{tower}/"
    if tower is not None and f"{prefix}index" not in keys:
        towers = sorted({k[len("samples/"):].rpartition("/")[0] for k in keys
                         if k.count("/") > 1 and k.startswith("samples/")})
        raise NoDumpError(f"the dump of step {step} holds no samples of tower {tower!r}; its "
                          f"towers: {', '.join(towers) or 'none'}")
    arrays = {col: np.asarray(dump_array(run, step, f"{prefix}{col}", worker, mode=mode,
                                         batch=batch, session=session))
              for col in ("index", "label", "group") if f"{prefix}{col}" in keys}
    m = run.manifests.get((f.worker, f.session))
    if m is None and "group" in arrays:   # its codes' names are in the manifest alone
        raise DamagedFileError(f"the manifest of {f.worker} session {f.session} is damaged "
                               f"(run.problems): the group names of its dump of step {step} "
                               "are unknown")
    codes = group_codes(m or {})
    check_samples(f.path, arrays.get("index"), arrays.get("group"), arrays.get("label"),
                  codes=codes)
    cols = {col: (list(arr) if arr.ndim > 1 else arr) for col, arr in arrays.items()}
    df = pd.DataFrame(cols)
    if "group" in df:
        df["group"] = [codes[int(c)] for c in df["group"]]
    df.insert(0, "session", f.session)
    df.insert(0, "worker", f.worker)
    return df


def dump_metadata(run: Any, step: int, worker: str | None = None, *, mode: str | None = None,
                  batch: int | None = None, session: int | None = None) -> dict:
    """:meth:`inspector.Run.dump_metadata` (documented there)."""
    return dict(dump_header(
        run, dump_of(run, step, worker, mode, batch, session))[0].get("__metadata__", {}))


def group_codes(m: dict) -> dict[int, str]:
    """A session's dump codes of ``samples/group`` -> group name (FORMAT.md, "Groups"): its
    manifest's ``groups`` (null: no groups); runs before it read with the default
    (``manifest_schema.CALLER_DEFAULTS``): 1 positive, 0 negative."""
    g = m.get("groups", CALLER_DEFAULTS["groups"])
    return dict(zip(g["codes"], g["names"])) if g else {}


def _check_dump_identity(f: DumpFile, header: dict) -> None:
    """DamagedFileError if the dump's own metadata names another step, batch, worker or session
    than its file name (a dump copied or renamed to another step's name would be read as that
    step). Fields its writer did not record (older runs) are not compared."""
    meta = header.get("__metadata__") or {}
    name = {"step": f.step, "worker": f.worker, "session": f.session or None, "batch": f.batch}
    for field, want in name.items():
        got = meta.get(field)
        if got is None or want is None:
            continue
        if str(got) != str(want):
            raise DamagedFileError(f"damaged dump file {f.path}: its header says {field} {got}, "
                                   f"its file name {field} {want} (copied or renamed from another "
                                   "dump?); refused")
