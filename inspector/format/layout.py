"""The run directory: layout, names, versions and the contracts shared by writer and reader.

A run is a directory any tool can read without TensorFlow (see FORMAT.md)::

    runs/exp1/
      manifest.<worker>.s<session>.json                 catalog, config, status (one per writer
                                                        session)
      graph.<worker>.s<session>.pb                      GraphDef of the captured graph
      stats/<worker>.s<session>.<seq>.parquet           statistics parts
      stats/<worker>.s<session>.<first>-<last>.parquet  a compacted part (replaces first..last)
      dumps/<worker>.s<session>.step-<step>[.b<batch>].safetensors   full tensors of one dump
      lock.<worker>.json                                held by the live writer of <worker>

Each ``DumpHook`` session (every ``train``/``evaluate`` call, every resume) appends a new
session; the reader merges them (the latest session wins a step recorded twice).

Every file is written to a temporary name and renamed, so a crash never leaves a
half-written file under a final name.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from inspector.storage.safety import inside, is_regular_file

FORMAT_NAME = "tf-inspector-run"


#: 2: files carry their writer session (``<worker>.s<session>``), statistics rows carry
#: worker/session/mode/batch, ``dropped`` and ``errors`` are aggregated records.
#: Version 1 runs (no session in file names) are read as session 0, mode ``train``.
#: 3: statistics and dumps may carry named sample groups (``groups=``: per class, a user
#: function); the manifest's ``groups`` names them.
#: 4: a statistics row's histogram is log-magnitude (``hist_bucket``, ``hist_count``:
#: inspector/format/loghist.py), not equal-width (``hist_lo``, ``hist_hi``, ``histogram``). Every
#: session this version writes says 4. FORMAT_VERSION: the newest version this reader reads
#: (and the one it writes).
FORMAT_VERSION = 4


TOOL_VERSION = "0.3.0"


_W = r"(?P<worker>[A-Za-z0-9_-]+)"


_S = r"\.s(?P<session>\d+)"


MANIFEST_RE = re.compile(rf"^manifest\.{_W}{_S}\.json$")


#: a small part (one flush, ``<seq>``) or a compacted one (``<first>-<last>``: it replaced those)
STATS_RE = re.compile(rf"^{_W}{_S}\.(?P<seq>\d+)(?:-(?P<last>\d+))?\.parquet$")


DUMP_RE = re.compile(rf"^{_W}{_S}\.step-(?P<step>\d+)(?:\.b(?P<batch>\d+))?\.safetensors$")


#: Version 1 names (no session): read as session 0.
MANIFEST_V1_RE = re.compile(rf"^manifest\.{_W}\.json$")


STATS_V1_RE = re.compile(rf"^{_W}\.(?P<seq>\d+)\.parquet$")


DUMP_V1_RE = re.compile(rf"^{_W}\.step-(?P<step>\d+)\.safetensors$")


WORKER_RE = re.compile(r"^[A-Za-z0-9_-]+$")


#: The lock a live writer holds on its worker name: ``lock.<worker>.json`` (FORMAT.md).
LOCK_RE = re.compile(rf"^lock\.{_W}\.json$")


MODES = ("train", "eval", "predict")


KINDS = ("forward", "gradient", "update")


#: Op types whose outputs are the model's inputs (a tensor of one of these in the catalog is
#: what was fed: ``IteratorGetNext:0`` of an input pipeline, a Keras probe's ``probe_x:0``).
INPUT_OP_TYPES = frozenset({"Placeholder", "PlaceholderWithDefault", "IteratorGetNext",
                            "IteratorGetNextSync", "IteratorGetNextAsOptional", "OptionalGetValue"})


GROUPS = ("all", "positive", "negative")


#: The groups of a run whose manifest names none (every version 1/2 run): positive/negative.
DEFAULT_GROUPS = ("positive", "negative")


#: A group name: letters, digits, ``_ . -`` (``class_3``, ``correct``), at most 64 characters.
GROUP_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def check_group_name(name: object) -> str:
    """``name`` if it can name a sample group (GROUP_NAME_RE, not ``all``, not ``.`` or ``..``:
    a group names a folder of the TensorBoard export), else ValueError. The reader still reads
    a ``.`` or ``..`` an older writer wrote (GROUP_NAME_RE); the export leaves it out."""
    if not isinstance(name, str) or not GROUP_NAME_RE.match(name) or name in ("all", ".", ".."):
        raise ValueError(f"group name {name!r} must match {GROUP_NAME_RE.pattern} and not be 'all' "
                         f"(the row of every sample), '.' or '..' (folder names of the export)")
    return name


#: Scalar statistics, in the order the hook's in-graph matrix holds them.
STAT_COLUMNS = ("count", "mean", "std", "min", "max", "l2", "zero_fraction", "nan", "inf")


#: Histograms of tensors with more elements than this (``count`` of the ``all`` row) count
#: every k-th block of HIST_BLOCK elements of each sample, k = ceil(count / HIST_MAX_ELEMENTS);
#: see FORMAT.md and :func:`hist_sample`. Why: the moments read every element once; binning
#: each value beside them re-reads a large tensor from memory. 16,384 values (~550 a bin of 30)
#: draw the same shape as 65,536 (LEGACY_HIST_MAX_ELEMENTS, older runs' sample) for a quarter
#: of the binning (bench/README.md, "Measurements behind design choices").
HIST_MAX_ELEMENTS = 1 << 14


#: what runs whose ``config`` has no ``histogram_sample`` (written before it existed) used
LEGACY_HIST_MAX_ELEMENTS = 1 << 16


HIST_BLOCK = 64


def histogram_sample(config: dict) -> int:
    """HIST_MAX_ELEMENTS of the session whose manifest ``config`` this is (older runs: 65,536).

    >>> histogram_sample({}), histogram_sample({"histogram_sample": 16384})
    (65536, 16384)
    """
    return int(config.get("histogram_sample", LEGACY_HIST_MAX_ELEMENTS))


def hist_stride(count: int, size: int | None = None) -> int:
    """k: the histogram of a tensor of ``count`` elements counts every k-th block of each
    sample; ``size``: the session's subsample size (:func:`histogram_sample`; None: this
    version's HIST_MAX_ELEMENTS)."""
    return max(1, -(-int(count) // (size or HIST_MAX_ELEMENTS)))


def hist_sample(values, samples: int = 1, size: int | None = None):
    """The values a histogram counts, from the whole tensor (numpy): every k-th block of
    HIST_BLOCK consecutive elements of each sample's flattened values, or every k-th element
    where a sample's size is not a multiple of HIST_BLOCK. ``samples``: the batch size of a
    batched tensor, 1 otherwise; ``size``: the subsample size of the session that wrote the
    histogram (``histogram_sample(config)``; None: this version's).

    Example::

        size = histogram_sample(run.manifests[(worker, session)]["config"])
        hist = LogHistogram.of(hist_sample(x, len(x), size))    # inspector.format.loghist
    """
    import numpy as np
    rows = np.asarray(values).reshape(samples, -1)
    k, e = hist_stride(rows.size, size), rows.shape[1]
    if e % HIST_BLOCK == 0:
        return rows.reshape(samples, -1, HIST_BLOCK)[:, ::k, :].reshape(samples, -1)
    return rows[:, ::k]


#: A live writer rewrites its manifest at least this often (``updated``). A reader calls a
#: 'running' worker 'crashed' when its process is gone (same host, ``pid`` not alive), and
#: 'stalled' when its manifest is older than STALE_HEARTBEATS heartbeats (at least 10 s).
HEARTBEAT_SECS = 60.0


STALE_HEARTBEATS = 5


#: ``__metadata__`` key of a dump file: JSON {key: key holding the same array}. A tensor that
#: appears under several keys (a gradient an op passes through unchanged) is stored once;
#: ``Run.dump_keys`` / ``Run.dump_array`` resolve aliases. Readers that ignore it
#: (``safetensors.numpy.load_file``) see each array once, under its first key.
ALIASES_KEY = "aliases"


#: ICNN roles a layer can give a tensor (see ICNN.md). The ICNN layer adds one JSON string
#: ``{"layer", "role", "tensor"}`` per role to the graph collection ``ICNN_COLLECTION``
#: (strings, so checkpoints can serialize the collection); the hook captures those
#: tensors and records role and layer in the catalog.
ICNN_COLLECTION = "tf_inspector/icnn"


ICNN_ROLES = ("pre_mask", "mask", "mu", "sqrtvar", "post_mask", "beta", "strength", "filter_loss")


#: Roles only a multi-class layer registers: ``class_positive`` [N, K], 1 where sample n is a
#: positive of class k (the layer's ``labels_positive``). Its entry also carries
#: ``filter_class`` (class of each filter, -1 for non-part filters), which the hook writes into
#: the catalog as ``icnn_filter_class``.
ICNN_CLASS_ROLES = ("class_positive",)


#: Graph collections written by ``hooks.mark`` inside a model_fn.
LOSS_COLLECTION = "tf_inspector/loss"


LABELS_COLLECTION = "tf_inspector/labels"


POSITIVE_COLLECTION = "tf_inspector/positive"


def icnn_entry(layer: str, role: str, tensor_name: str,
               filter_class: list[int] | None = None) -> str:
    """The collection entry registering ``tensor_name`` as ``role`` of ICNN layer ``layer``.

    ``filter_class`` (``class_positive`` only): the class of each filter, -1 for non-part ones.

    >>> icnn_catalog_fields(icnn_entry("m", "class_positive", "m/class_positive:0", [0, 1, -1]))
    {'icnn_filter_class': [0, 1, -1]}
    """
    if role not in ICNN_ROLES + ICNN_CLASS_ROLES:
        raise ValueError(f"ICNN role {role!r} must be one of {ICNN_ROLES + ICNN_CLASS_ROLES}")
    if (filter_class is not None) != (role == "class_positive"):
        raise ValueError("filter_class goes with role 'class_positive' (and it needs one), got "
                         f"role {role!r} and filter_class {filter_class!r}")
    d: dict = {"layer": layer, "role": role, "tensor": tensor_name}
    if filter_class is not None:
        d["filter_class"] = [int(v) for v in filter_class]
    return json.dumps(d)


def parse_icnn_entry(entry: str | bytes) -> tuple[str, str, str]:
    """(layer, role, tensor name) of a collection entry written by :func:`icnn_entry`."""
    d = json.loads(entry)
    return d["layer"], d["role"], d["tensor"]


def icnn_catalog_fields(entry: str | bytes) -> dict:
    """Catalog fields an entry adds beyond layer and role:
    ``{"icnn_filter_class": [...]}`` or ``{}``."""
    d = json.loads(entry)
    return {"icnn_filter_class": d["filter_class"]} if "filter_class" in d else {}


#: Gradients of captured tensors built by ``hooks.minimize`` / ``hooks.compute_gradients`` in
#: the optimizer's own backward pass: one JSON string ``{"loss", "tensor", "gradient"}`` per
#: tensor (``gradient`` null where the tensor does not reach the loss). ``DumpHook`` reuses
#: them instead of building a second backward pass.
SHARED_GRADIENTS_COLLECTION = "tf_inspector/shared_gradients"


def shared_gradient_entry(loss_name: str, tensor_name: str, gradient_name: str | None) -> str:
    """The collection entry recording ``gradient_name`` as d ``loss_name`` / d ``tensor_name``."""
    return json.dumps({"loss": loss_name, "tensor": tensor_name, "gradient": gradient_name})


def parse_shared_gradient_entry(entry: str | bytes) -> tuple[str, str, str | None]:
    """(loss name, tensor name, gradient name or None) of an entry from
    :func:`shared_gradient_entry`."""
    d = json.loads(entry)
    return d["loss"], d["tensor"], d["gradient"]


def _wid(worker: str, session: int) -> str:
    """``<worker>.s<session>``: the identity of one writer session in file names."""
    if not isinstance(session, int) or isinstance(session, bool) or session < 1:
        raise ValueError(f"session {session!r} must be an int >= 1")
    return f"{check_worker(worker)}.s{session:04d}"


def manifest_name(worker: str, session: int) -> str:
    return f"manifest.{_wid(worker, session)}.json"


def graph_name(worker: str, session: int) -> str:
    return f"graph.{_wid(worker, session)}.pb"


def stats_name(worker: str, session: int, seq: int) -> str:
    return f"stats/{_wid(worker, session)}.{seq:06d}.parquet"


def stats_range_name(worker: str, session: int, first: int, last: int) -> str:
    """A compacted part: the rows of small parts ``first`` to ``last`` (inspector.stats.parts)."""
    return f"stats/{_wid(worker, session)}.{first:06d}-{last:06d}.parquet"


def dump_name(worker: str, session: int, step: int, batch: int | None = None) -> str:
    """A dump's file: ``batch`` is the batch index within an
    evaluation/prediction (None in training)."""
    tail = "" if batch is None else f".b{batch:06d}"
    return f"dumps/{_wid(worker, session)}.step-{step:010d}{tail}.safetensors"


def lock_name(worker: str) -> str:
    return f"lock.{check_worker(worker)}.json"


def is_temporary(name: str) -> bool:
    """A writer's temporary file (``.<final name>.<random>.tmp``): never part of a run."""
    return name.startswith(".") and name.endswith(".tmp")


def _worker_session(name: str, current: re.Pattern, v1: re.Pattern) -> tuple[str, int] | None:
    """(worker, session) of ``name`` by the current pattern,
    else by the version 1 one (session 0)."""
    m = current.match(name)
    if m:
        return m["worker"], int(m["session"])
    m = v1.match(name)
    return (m["worker"], 0) if m else None


def parse_manifest_name(name: str) -> tuple[str, int] | None:
    """(worker, session) of a manifest file name (version 1 names: session 0), or None."""
    return _worker_session(name, MANIFEST_RE, MANIFEST_V1_RE)


def parse_stats_name(name: str) -> tuple[str, int] | None:
    """(worker, session) of a statistics part's file name, or None."""
    return _worker_session(name, STATS_RE, STATS_V1_RE)


def parse_dump_name(name: str) -> tuple[str, int, int, int] | None:
    """(worker, session, step, batch) of a dump's file name (training dumps: batch 0), or None."""
    m = DUMP_RE.match(name)
    if m:
        return m["worker"], int(m["session"]), int(m["step"]), int(m["batch"] or 0)
    m = DUMP_V1_RE.match(name)
    return (m["worker"], 0, int(m["step"]), 0) if m else None


def check_worker(worker: str) -> str:
    """Return ``worker`` if it is a safe file-name component, else raise ValueError."""
    if not WORKER_RE.match(worker or ""):
        raise ValueError(f"worker name {worker!r} must match {WORKER_RE.pattern} (letters, digits, "
                         "_ and -)")
    return worker


#: the folders of a run and the names a reader opens in each
RUN_FILES = (("", parse_manifest_name), ("stats", parse_stats_name), ("dumps", parse_dump_name))


def run_entries(run_dir: str | Path) -> list[Path]:
    """The entries of ``run_dir`` named like files a reader opens (manifests, statistics, dumps)."""
    out = []
    for sub, pattern in RUN_FILES:
        try:
            with os.scandir(os.path.join(run_dir, sub)) as it:
                out += [Path(e.path) for e in it if pattern(e.name)]
        except OSError:
            continue
    return sorted(out)


def special_entries(run_dir: str | Path, root: str | Path | None = None) -> list[str]:
    """Why each file of ``run_dir`` that a reader would open must not be opened: not a regular
    file (FIFO, socket, device, folder), or, with ``root``, a symlink leading outside ``root``."""
    bad = []
    for p in run_entries(run_dir):
        if root is not None and not inside(p, root):
            bad.append(f"{p.name} leads outside {root}")
        elif not is_regular_file(p):
            bad.append(f"{p.name} is not a regular file")
    return bad


def has_manifest(folder: str | Path) -> bool:
    """True if ``folder`` holds a manifest that is a regular file (checked without opening it)."""
    try:
        with os.scandir(folder) as it:
            return any(parse_manifest_name(e.name) and is_regular_file(e.path) for e in it)
    except OSError:
        return False
