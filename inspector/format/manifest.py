"""Reading and type-checking a worker manifest (``manifest.<worker>.json``, see FORMAT.md).

Every field the reader uses is checked for its JSON type, so a damaged or hand-edited
manifest gives a DamagedFileError naming the file, the field and the type expected, never a
TypeError deep inside the reader. Missing fields keep their defaults (older runs); unknown
fields are ignored (newer writers of the same version may add some).

The manifest's keys are defined here once (as TensorBoard's ``metadata.py`` does for its
plugins): ``WRITER_KEYS`` (what ``RunWriter`` writes itself), ``CALLER_DEFAULTS`` (what its
caller, ``hooks.DumpHook`` or ``inspector.testing``, gives) and ``CONFIG_DEFAULTS`` (the hook's
settings under ``config``). The writer fills and the reader assumes ``CALLER_DEFAULTS`` for a
caller key that is missing, and :func:`hook_config` refuses a config of any other key set, so
the hook's and synthetic runs' manifests cannot drift apart.

Example::

    m = load_manifest(Path("runs/exp1/manifest.chief.json"), root=Path("runs/exp1"))
    hook_config(**{**CONFIG_DEFAULTS, "stats_every_n_steps": 1})   # every key, or ValueError
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Callable, Mapping

from inspector.errors import DamagedFileError, FormatVersionError
from inspector.format import FORMAT_NAME, FORMAT_VERSION, HIST_MAX_ELEMENTS, MODES, check_group_name
from inspector.storage.safety import read_bytes

#: the dumps a manifest's ``dump_runs`` may list in all (more is refused: decoding stays bounded)
MAX_DUMPS_LISTED = 1 << 22
#: the longest ``heartbeat_secs`` a manifest may say (a longer one is refused as damaged)
MAX_HEARTBEAT_SECS = 10 ** 6

# ---- the keys ---------------------------------------------------------------------------------
#: Keys ``RunWriter`` writes itself: format, the session's identity, liveness and totals.
WRITER_KEYS = ("format", "format_version", "tool_version", "worker", "session", "mode", "created",
               "updated", "status", "host", "pid", "heartbeat_secs", "bytes_written",
               "dumps_written", "steps", "dropped", "errors", "graph_bytes",
               "stats_parts", "dump_runs")
#: Keys the writer's caller gives, each with the value a manifest without it (an older run, a
#: bare ``RunWriter``) is written and read with.
CALLER_DEFAULTS: dict[str, Any] = {"tensorflow_version": None, "is_chief": False, "loss": None,
                                   "labels": None, "config": {}, "tensors": [], "skipped": [],
                                   "first_nonfinite": None, "accounting": None, "start_step": None,
                                   "groups": {"rule": "positive/negative",
                                              "names": ["positive", "negative"], "codes": [1, 0]}}
#: Keys present only after a failure: ``error`` (status failed), ``hook_error`` (the hook
#: disabled itself).
FAILURE_KEYS = ("error", "hook_error")
#: Present only after statistics steps whose samples broke the group rule (``groups=``).
GROUPS_REFUSED_KEY = "groups_refused"
#: Present only in a session that closed without recording a step: why (FORMAT.md, manifest).
RECORDED_NOTHING_KEY = "recorded_nothing"
#: The hook's settings under ``config`` (FORMAT.md), with ``DumpHook``'s defaults in their JSON
#: form (tests check them against its signature); ``native_stats`` records whether the fused
#: kernels ran, ``mode`` the mode the hook wrote.
CONFIG_DEFAULTS: dict[str, Any] = {
    "stats_every_n_steps": 100, "layer_stats_every_n_steps": None, "dump_every_n_steps": 1000,
    "dump_steps": [],
    "samples_per_group": 2, "max_bytes": 2 * 1024 ** 3,
    "histogram_sample": HIST_MAX_ELEMENTS, "gradients": True, "dump_on_nonfinite": False,
    "strict": False, "fsync": False, "share_gradients": True, "native_stats": True, "mode": "train",
    "eval_stats_batches": None, "eval_dump_batches": 1, "include": None, "exclude": None,
    "op_types": None, "exclude_op_types": None,
    "dtypes": ["float16", "bfloat16", "float32", "float64"],
}


def with_caller_defaults(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """``manifest`` with every key of ``CALLER_DEFAULTS`` (copies of the defaults where missing).

    >>> with_caller_defaults({"loss": "l:0"})["tensors"], with_caller_defaults(
    ...     {"loss": "l:0"})["loss"]
    ([], 'l:0')
    """
    return {**{k: copy.deepcopy(v) for k, v in CALLER_DEFAULTS.items() if k not in manifest},
            **manifest}


def hook_config(**settings: Any) -> dict[str, Any]:
    """The ``config`` object: exactly the keys of ``CONFIG_DEFAULTS``, in its order, else ValueError
    naming the missing and unknown keys (a new setting goes into CONFIG_DEFAULTS first)."""
    missing, unknown = set(CONFIG_DEFAULTS) - set(settings), set(settings) - set(CONFIG_DEFAULTS)
    if missing or unknown:
        raise ValueError(f"hook config keys differ from manifest_schema.CONFIG_DEFAULTS: missing "
                         f"{sorted(missing) or 'none'}, unknown {sorted(unknown) or 'none'}")
    return {k: settings[k] for k in CONFIG_DEFAULTS}


#: A manifest larger than this is refused before it is read (a catalog of 10,000 tensors
#: is about 4 MB; every dropped dump adds about 100 bytes).
MAX_MANIFEST_BYTES = 64 * 1024 * 1024

#: The values of ``status`` (FORMAT.md).
STATUSES = ("running", "finished", "failed")
_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
          dict: "an object", list: "a list", type(None): "null"}


def _is(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):  # JSON true is not an integer here
        return bool in types
    if isinstance(value, int) and float in types:
        return True
    return isinstance(value, types)


def _want(value: Any, types: tuple[type, ...], where: str) -> None:
    if not _is(value, types):
        expected = " or ".join(_NAMES[t] for t in types)
        raise TypeError(f"field {where} must be {expected}, not {type(value).__name__} "
                        f"{_short(value)}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _list_of(check: Callable[[Any, str], None]) -> Callable[[Any, str], None]:
    def run(value: Any, where: str) -> None:
        _want(value, (list,), where)
        for i, item in enumerate(value):
            check(item, f"{where}[{i}]")
    return run


def _object(fields: dict[str, tuple[type, ...]],
            required: tuple[str, ...] = ()) -> Callable[[Any, str], None]:
    def run(value: Any, where: str) -> None:
        _want(value, (dict,), where)
        for key in required:
            if key not in value:
                raise TypeError(f"field {where}.{key} is missing")
        for key, types in fields.items():
            if key in value:
                _want(value[key], types, f"{where}.{key}")
    return run


def _scalar(*types: type) -> Callable[[Any, str], None]:
    return lambda value, where: _want(value, types, where)


def _pid(value: Any, where: str) -> None:
    """A process id (os.kill raises OverflowError, not OSError, on one beyond C int), or null."""
    _want(value, (int, type(None)), where)
    if value is not None and not 0 < value < 2 ** 31:
        raise TypeError(f"field {where} must be a process id (1 to 2**31 - 1), not {_short(value)}")


def _status(value: Any, where: str) -> None:
    _want(value, (str,), where)
    if value not in STATUSES:
        raise TypeError(f"field {where} must be one of {', '.join(STATUSES)}, not {_short(value)}")


#: The largest count, byte total or step a manifest may hold: integers JSON readers keep exact.
MAX_COUNT = 2 ** 53
#: The largest dimension of a catalog shape, and of all its known dimensions' product.
MAX_DIM, MAX_ELEMENTS = 2 ** 40, 2 ** 53


def _count(value: Any, where: str) -> None:
    """A count, a byte total or a step: an integer 0..MAX_COUNT."""
    _want(value, (int,), where)
    if not 0 <= value <= MAX_COUNT:
        raise TypeError(f"field {where} must be an integer from 0 to 2**53, not {_short(value)}")


def _opt_count(value: Any, where: str) -> None:
    if value is not None:
        _count(value, where)


def _shape(value: Any, where: str) -> None:
    _want(value, (list, type(None)), where)
    size = 1
    for i, dim in enumerate(value or []):
        _want(dim, (int, type(None)), f"{where}[{i}]")
        if dim is not None:
            if not 0 <= dim <= MAX_DIM:
                raise TypeError(f"field {where}[{i}] must be a dimension from 0 to 2**40 (or null: "
                                f"unknown), not {_short(dim)}")
            size *= dim
    if size > MAX_ELEMENTS:
        raise TypeError(f"field {where} must have at most 2**53 elements, not {_short(value)} "
                        f"({size:.3g})")


_STR, _OPT_STR = (str,), (str, type(None))
_TENSOR = _object({"name": _STR, "op": _OPT_STR, "op_type": _OPT_STR, "dtype": _OPT_STR,
                   "scope": _OPT_STR, "has_gradient": (bool, type(None)),
                   "batched": (bool, type(None)), "icnn_layer": _OPT_STR,
                   "icnn_role": _OPT_STR, "keras_layer": _OPT_STR, "keras_call": (int, type(None)),
                   "source_file": _OPT_STR, "source_line": (int, type(None)),
                   "source_function": _OPT_STR, "icnn_filter_class": (list, type(None)),
                   "captured_on": _OPT_STR},
                  required=("name",))


def _tensor(value: Any, where: str) -> None:
    _TENSOR(value, where)
    if "shape" in value:
        _shape(value["shape"], f"{where}.shape")
    if value.get("source_stack") is not None:
        _list_of(_frame)(value["source_stack"], f"{where}.source_stack")


def _frame(value: Any, where: str) -> None:
    """One ``source_stack`` frame: [file, line, function]."""
    _want(value, (list,), where)
    if len(value) != 3:
        raise TypeError(f"field {where} must be [file, line, function], not {_short(value)}")
    for i, types in enumerate(((str,), (int,), (str,))):
        _want(value[i], types, f"{where}[{i}]")


def _one_of(values: tuple[str, ...]) -> Callable[[Any, str], None]:
    def run(value: Any, where: str) -> None:
        _want(value, (str,), where)
        if value not in values:
            raise TypeError(f"field {where} must be one of {', '.join(values)}, not "
                            f"{_short(value)}")
    return run


def _steps(value: Any, where: str) -> None:
    _want(value, (list, type(None)), where)
    if value is not None:
        if len(value) != 2:
            raise TypeError(f"field {where} must be [first, last], not {_short(value)}")
        for i, step in enumerate(value):
            _opt_count(step, f"{where}[{i}]")


def _heartbeat(value: Any, where: str) -> None:
    _want(value, (float, type(None)), where)
    if value is not None and not 0 < value <= MAX_HEARTBEAT_SECS:
        raise TypeError(f"field {where} must be seconds above 0 and at most 10**6, not "
                        f"{_short(value)}")


def _dump_runs(value: Any, where: str) -> None:
    """``dump_runs`` (inspector.sessions.crosscheck): null, or [step, batch, n, dstep, dbatch] runs
    of at most MAX_DUMPS_LISTED dumps in all, whose steps are counts and batches -1 or counts."""
    if value is None:
        return
    _want(value, (list,), where)
    total = 0
    for i, run in enumerate(value):
        at = f"{where}[{i}]"
        _want(run, (list,), at)
        if len(run) != 5 or not all(_is(x, (int,)) for x in run):
            raise TypeError(f"field {at} must be [step, batch, count, step stride, batch stride], "
                            f"not {_short(run)}")
        s0, b0, n, ds, db = run
        total += n
        ends = (s0, s0 + (n - 1) * ds, b0, b0 + (n - 1) * db)
        if n < 1 or total > MAX_DUMPS_LISTED or not all(0 <= x <= MAX_COUNT for x in ends[:2]) \
                or not all(-1 <= x <= MAX_COUNT for x in ends[2:]):
            raise TypeError(f"field {at} must list 1 to {MAX_DUMPS_LISTED:,} dumps in all, at "
                            f"steps 0..2**53, not {_short(run)}")


_OPT_INT = (int, type(None))


def _groups(value: Any, where: str) -> None:
    """``groups``: null, or {"rule", "names": [group name], "codes": [int]} of equal lengths."""
    if value is None:
        return
    _object({"rule": _STR, "names": (list,), "codes": (list,)},
            required=("names", "codes"))(value, where)
    names, codes = value["names"], value["codes"]
    for i, n in enumerate(names):
        try:
            check_group_name(n)
        except ValueError as e:
            raise TypeError(f"field {where}.names[{i}]: {e}") from None
    if len(set(names)) != len(names) or len(codes) != len(names) \
            or len(set(map(repr, codes))) != len(codes) or not all(_is(c, (int,)) for c in codes):
        raise TypeError(f"field {where} must hold distinct names and one distinct int code per "
                        f"name, not {_short(value)}")
_STRINGS = _list_of(_scalar(str))
_SKIP_REASON = _object({"reason": _STR, "count": (int,)}, required=("reason", "count", "names"))
_EXCLUSION = _object({"rule": _STR, "source": _STR, "what": _STR, "negate": (bool,),
                      "count": (int,)},
                     required=("rule", "count"))


#: Bounds of the ``accounting`` section (FORMAT.md, "Accounting"), checked on read: a hook
#: records ~10 default rules, a few of the user's filters and one per Keras region; a skip
#: reason per kind (or per variable a racy read reads); names of outputs no rule's pattern
#: or op type says. Far above any real graph's, low enough that the reader's indexes over
#: them build in well under a second.
MAX_RULES = 1_024
MAX_SKIP_REASONS = 100_000
MAX_ACCOUNTING_NAMES = 1_000_000
MAX_NAME_CHARS = 4_096


def _accounting(value: Any, where: str) -> None:
    """``accounting`` (FORMAT.md, "Accounting"): null (runs before it), or its counts, skip
    reasons and rules, every list of names a list of strings, within the bounds above, every
    count 0..2**53 and ``captured`` at most ``total``."""
    if value is None:
        return
    _object({"total": (int,), "captured": (int,), "aliases": (dict,), "skipped": (list,),
             "excluded": (list,)})(value, where)
    for key in ("total", "captured"):
        _opt_count(value.get(key), f"{where}.{key}")
    if value.get("captured", 0) > value.get("total", MAX_COUNT):
        raise TypeError(f"field {where}.captured ({value['captured']:,}) must not exceed "
                        f"{where}.total ({value['total']:,})")
    aliases, skipped, excluded = (value.get(k, e) for k, e in
                                  (("aliases", {}), ("skipped", []), ("excluded", [])))
    _at_most(len(excluded), MAX_RULES, f"{where}.excluded", "rules")
    _at_most(len(skipped), MAX_SKIP_REASONS, f"{where}.skipped", "skip reasons")
    names = len(aliases)
    for k, v in aliases.items():
        _want(v, _STR, f"{where}.aliases[{_short(k)}]")
        _name(k, f"{where}.aliases key")
        _name(v, f"{where}.aliases[{_short(k)}]")
    for i, s in enumerate(skipped):
        _SKIP_REASON(s, f"{where}.skipped[{i}]")
        _count(s["count"], f"{where}.skipped[{i}].count")
        _names(s["names"], f"{where}.skipped[{i}].names")
        names += len(s["names"])
    for i, r in enumerate(excluded):
        _EXCLUSION(r, f"{where}.excluded[{i}]")
        _count(r["count"], f"{where}.excluded[{i}].count")
        for key in ("patterns", "op_types", "names", "examples"):
            if key in r:
                _names(r[key], f"{where}.excluded[{i}].{key}")
                names += len(r[key])
    _at_most(names, MAX_ACCOUNTING_NAMES, where, "names in all")


def _at_most(n: int, bound: int, where: str, what: str) -> None:
    if n > bound:
        raise TypeError(f"field {where} holds {n:,} {what}, more than the {bound:,} a manifest may "
                        "hold (FORMAT.md, \"Accounting\")")


def _name(value: str, where: str) -> None:
    if len(value) > MAX_NAME_CHARS:
        raise TypeError(f"field {where} holds a name of {len(value):,} characters, more than "
                        f"{MAX_NAME_CHARS:,}")


def _names(value: Any, where: str) -> None:
    _STRINGS(value, where)
    for v in value:
        _name(v, where)


#: Version 2's aggregated records of ``dropped`` and ``errors`` (FORMAT.md).
_RECORD_TYPES = _object({"what": _STR, "reason": _STR, "count": (int,), "bytes": (int,),
                         "first_step": _OPT_INT, "last_step": _OPT_INT, "steps": (list,)},
                        required=("what", "reason", "count"))


def _record(value: Any, where: str) -> None:
    _RECORD_TYPES(value, where)
    for key in ("count", "bytes", "first_step", "last_step"):
        _opt_count(value.get(key), f"{where}.{key}")
#: Version 1's ``dropped``: one entry per dropped dump.
_DROPPED_V1 = _list_of(_object({"step": (int,), "reason": _STR, "bytes": (int,)}))

#: The fields the reader uses, each with its check. Other fields are not checked.
FIELDS: dict[str, Callable[[Any, str], None]] = {
    "session": _scalar(int), "mode": _one_of(MODES), "steps": _steps,
    "error": _scalar(str, type(None)), "errors": _list_of(_record),
    "worker": _scalar(str), "is_chief": _scalar(bool), "status": _status,
    "host": _scalar(str, type(None)), "pid": _pid, "heartbeat_secs": _heartbeat,
    "created": _scalar(str), "updated": _scalar(str), "loss": _scalar(str, type(None)),
    "labels": _scalar(str, type(None)), "config": _scalar(dict), "tensors": _list_of(_tensor),
    "groups": _groups, "skipped": _list_of(_scalar(str)),
    "first_nonfinite": lambda v, w: None if v is None else _object(
        {"step": (int,), "tensor": _STR, "kind": _STR, "source": _STR})(v, w),
    "dropped": _list_of(_record),
    GROUPS_REFUSED_KEY: _object({"first_step": (int,), "samples": (int, type(None)), "why": _STR,
                                 "last_step": (int,), "steps": (int,)},
                                required=("first_step", "why")),
    "bytes_written": _count, "dumps_written": _count, "hook_error": _scalar(str),
    "graph_bytes": _opt_count, "stats_parts": _count, "dump_runs": _dump_runs,
    "writer_error": _scalar(str), "tool_version": _scalar(str, type(None)),
    "tensorflow_version": _scalar(str, type(None)), "accounting": _accounting,
    "start_step": _scalar(int, type(None)), RECORDED_NOTHING_KEY: _scalar(str),
}


#: Fields a session's statistics and dumps are read without: where one fails its check, a
#: reader that collects problems (``check_manifest(dropped=[...])``: :class:`inspector.Run`)
#: drops it and names it there, and reads the rest of the manifest.
AUXILIARY = ("accounting", "first_nonfinite", GROUPS_REFUSED_KEY)


def check_manifest(m: Any, path: Path | str, dropped: list[str] | None = None) -> dict:
    """``m`` if every field the reader uses has its type (see FIELDS), else DamagedFileError
    naming ``path``, the field and the type expected. ``dropped``: a list, to drop an
    AUXILIARY field that fails its check instead (the field removed from ``m``, a line naming
    it appended)."""
    try:
        _want(m, (dict,), "(the whole manifest)")
        for key, check in FIELDS.items():
            if key in m:
                v1 = key == "dropped" and m.get("format_version") == 1
                try:
                    (_DROPPED_V1 if v1 else check)(m[key], key)
                except TypeError as e:
                    if dropped is None or key not in AUXILIARY:
                        raise
                    del m[key]
                    dropped.append(f"manifest {path}: {e}; the field is left out (the session's "
                                   "statistics and dumps are read without it)")
        runs, count = m.get("dump_runs"), m.get("dumps_written")
        if runs is not None and count is not None and sum(r[2] for r in runs) != count:
            raise TypeError(f"field dump_runs lists {sum(r[2] for r in runs):,} dumps, not the "
                            f"dumps_written {count:,}")
    except TypeError as e:
        raise DamagedFileError(f"damaged manifest {path}: {e}") from None
    return m


def load_manifest(path: Path | str, root: Path | None = None, data: bytes | None = None,
                  dropped: list[str] | None = None) -> dict:
    """Read, parse and check the manifest at ``path``: DamagedFileError naming it if it is not
    a regular file inside ``root``, larger than MAX_MANIFEST_BYTES, not JSON, not a manifest or
    of wrong types; FormatVersionError if a newer format wrote it. ``data``: its bytes, already
    read (from an object store: ``Storage.read``); ``path`` then only names it. ``dropped``: as
    :func:`check_manifest`'s."""
    try:
        raw = read_bytes(path, root, MAX_MANIFEST_BYTES) if data is None else data
        m = json.loads(raw.decode("utf-8"))
        if not isinstance(m, dict) or m.get("format") != FORMAT_NAME:
            raise ValueError(f"not a {FORMAT_NAME} manifest")
    except (ValueError, RecursionError) as e:  # RecursionError: JSON nested too deeply
        raise DamagedFileError(f"damaged manifest {path}: {type(e).__name__}: {e}") from None
    version = m.get("format_version")
    if not isinstance(version, int) or not _is(version, (int,)):
        raise DamagedFileError(f"damaged manifest {path}: field format_version must be an integer, "
                               f"not {_short(version)}")
    if version > FORMAT_VERSION:
        raise FormatVersionError(
            f"{path} has format version {version!r}, newer than this reader "
            f"(which reads versions up to {FORMAT_VERSION}); upgrade tf-inspector to read it")
    return check_manifest(m, path, dropped)


def source_where(entry: Mapping[str, Any]) -> str | None:
    """A catalog entry's ``source_*`` fields as ``'file:line in function'`` (where the user's
    code created the tensor's op), or None without a file.

    >>> source_where({"source_file": "m.py", "source_line": 57, "source_function": "block"})
    'm.py:57 in block'
    """
    file, line = entry.get("source_file"), entry.get("source_line")
    fn = entry.get("source_function")
    if not isinstance(file, str):
        return None
    try:
        where = f"{file}:{int(line)}"   # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):  # no line (NaN)
        where = file
    return where + (f" in {fn}" if isinstance(fn, str) else "")
