"""``WriterOptions``: how a ``RunWriter`` session writes (budgets, queue, flushes, durability,
storage, compaction), defined and checked once; and ``options_keywords``, the rule every options
object of the tool follows (``hooks.CaptureOptions`` too): keywords or ``options=``, not both.

Example::

    from inspector.writer import RunWriter, WriterOptions
    opts = WriterOptions(max_bytes=10 * 1024 ** 3, fsync=True)
    w = RunWriter("runs/x", manifest={"tensors": []}, options=opts)

Every option is also a keyword argument of ``RunWriter``, with the same default:
``RunWriter(path, manifest=m, fsync=True)`` is ``RunWriter(path, manifest=m,
options=WriterOptions(fsync=True))``. An option given both ways is refused
(``dataclasses.replace(opts, fsync=True)`` changes one option of an options object), and a bad
value is refused when the options are built, before the writer takes its worker's lock.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Mapping, TypeVar

from inspector.format import FORMAT_VERSION, HEARTBEAT_SECS
from inspector.format.manifest import MAX_HEARTBEAT_SECS
from inspector.stats.parts import COMPACT_ROWS
from inspector.storage import storage_timeout
from inspector.storage.spill import SPILL_BYTES


@dataclass(frozen=True)
class WriterOptions:
    """How a ``RunWriter`` session writes. Each attribute is also a keyword argument of
    ``RunWriter`` with the same default; ``RunWriter`` documents only its own arguments (the run
    directory, the session's identity and what it writes)."""

    # ---- how much ----------------------------------------------------------------------------
    max_bytes: int | float | None = None
    """Byte budget of the whole run directory as this writer sees it: the files already there
    (earlier sessions, other workers) count. A dump beyond it is dropped, and the drop recorded.
    None: no budget."""
    queue_size: int = 8
    """Full dumps waiting to be written; a dump beyond it is dropped (and recorded) rather than
    block training. Memory held is at most ``queue_size + dump_threads`` dumps."""
    dump_threads: int = 2
    """Threads writing dumps, each its own file. More than one because the kernel's page-cache
    and writeback work of one write overlaps another's: two threads drop far fewer dumps of a
    dump-heavy run than one (bench/README.md, "Two dump threads")."""

    # ---- when --------------------------------------------------------------------------------
    stats_flush_secs: float = 10.0
    """Statistics are written as a part file at least this often (seconds); 0: every step's."""
    heartbeat_secs: float = HEARTBEAT_SECS
    """How often (seconds) a live writer rewrites its manifest (``updated``) and its lock, so
    that readers can tell a crashed run (FORMAT.md, "The lock")."""

    # ---- durability and errors ---------------------------------------------------------------
    fsync: bool = False
    """fsync each dump and statistics part before its rename (the manifest and the graph always
    are). Without it, files survive a crash of the process but not a power loss
    (``inspector.storage.atomic.atomic_write``)."""
    strict: bool = False
    """Raise a write error (RuntimeError) from the next ``add_stats``, ``add_dump`` or
    ``close`` instead of only recording it in the manifest."""

    # ---- storage -----------------------------------------------------------------------------
    storage_options: Mapping[str, Any] | None = None
    """For a URL run directory (``s3://bucket/runs/exp1``): its fsspec filesystem's options, as
    in ``inspector.open_run`` (endpoint, credentials; default: the environment's)."""
    filesystem: Any = None
    """For a URL run directory: an fsspec filesystem instance to use instead of
    ``storage_options``, e.g. one that counts requests."""
    timeout: float | None = None
    """Seconds an object store's request may take (``inspector.storage.storage_timeout``; None:
    $TF_INSPECTOR_STORAGE_TIMEOUT, else its default)."""
    spill_bytes: int = SPILL_BYTES
    """On an object store, statistics parts it does not take (slow, down) wait on local disk, at
    most this many bytes (``inspector.storage.spill``): the training thread never waits for the
    store."""

    # ---- the files ---------------------------------------------------------------------------
    compact_rows: int | None = COMPACT_ROWS
    """Roll the session's small statistics parts into one part per this many rows
    (``inspector.stats.parts``); None: never."""
    format_version: int = FORMAT_VERSION
    """The format version the manifest and the dumps say (FORMAT.md, "Versioning")."""

    def __post_init__(self) -> None:
        for name, (ok, right) in self._rules().items():
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r} must be {right}")
        if self.timeout is not None:
            storage_timeout(self.timeout)   # ValueError naming it unless positive seconds

    def _rules(self) -> dict[str, tuple[bool, str]]:
        """Each checked option: (whether its value is right, what would be)."""
        secs = self.heartbeat_secs
        return {
            "max_bytes": (self.max_bytes is None or _real(self.max_bytes, 0),
                          "a byte count >= 0 or None (no budget)"),
            "queue_size": (_integer(self.queue_size, 1), "an int >= 1 (dumps waiting)"),
            "dump_threads": (_integer(self.dump_threads, 1), "an int >= 1"),
            "stats_flush_secs": (_real(self.stats_flush_secs, 0),
                                 "seconds >= 0 (0: a part every step)"),
            "heartbeat_secs": (_real(secs, 0) and 0 < secs <= MAX_HEARTBEAT_SECS,
                               f"seconds above 0 and at most {MAX_HEARTBEAT_SECS:,} "
                               f"(what readers accept)"),
            "storage_options": (self.storage_options is None
                                or isinstance(self.storage_options, Mapping),
                                "a dict of fsspec options or None"),
            "spill_bytes": (_integer(self.spill_bytes, 0), "a byte count >= 0 (an int)"),
            "compact_rows": (self.compact_rows is None or _integer(self.compact_rows, 1),
                             "an int >= 1 or None (never compact)"),
            "format_version": (_integer(self.format_version, 1)
                               and self.format_version <= FORMAT_VERSION,
                               f"an int from 1 to {FORMAT_VERSION} (FORMAT.md, Versioning)"),
        }


def _real(value: Any, low: float) -> bool:
    """A number (not a bool, not NaN) of at least ``low``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    return not math.isnan(float(value)) and float(value) >= low


def _integer(value: Any, low: int) -> bool:
    """An int (not a bool) of at least ``low``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= low


Options = TypeVar("Options")
Init = TypeVar("Init", bound=Callable[..., None])


def resolve_options(kind: type[Options], shown: str, owner: str, options: Options | None,
                    given: Mapping[str, Any]) -> Options:
    """The options of ``owner`` (a class name): ``options=`` or the keywords ``given``, not both.

    Args:
        kind: the options class (a frozen dataclass that checks its values).
        shown: how messages name it, with its article: ``"an inspector.options.WriterOptions"``.
        owner: the class taking the options, for messages.
        options: what the caller gave as ``options=``.
        given: the options the caller gave as keywords.

    Returns:
        ``options``, or ``kind(**given)``.

    Raises:
        TypeError: ``options=`` is not a ``kind``, or came with keywords of its own.
        ValueError: a keyword's value is refused (``kind`` says which and what would be right).
    """
    if options is None:
        return kind(**given)
    if not isinstance(options, kind):
        raise TypeError(f"{owner}(options={options!r}): options= takes {shown}(...)")
    if given:
        raise TypeError(f"{owner} got {', '.join(given)} and options=: give each option one way, "
                        f"as a keyword or in options=, not both (to change an options object: "
                        f"options=dataclasses.replace(options, {'=..., '.join(given)}=...))")
    return options


def options_keywords(kind: type, shown: str) -> Callable[[Init], Init]:
    """A decorator of ``__init__`` taking ``kind``'s options as keywords (each listed in
    ``__init__``'s signature with ``kind``'s default, for ``help()`` and editors) or as
    ``options=``: ``__init__`` receives them resolved (:func:`resolve_options`) in ``options``
    and reads them there, not in its keywords. ``shown``: how messages name ``kind`` (with its
    article)."""
    names = frozenset(f.name for f in dataclasses.fields(kind))

    def decorate(init: Init) -> Init:
        @functools.wraps(init)
        def wrapper(self: Any, *args: Any, options: Any = None, **kwargs: Any) -> None:
            given = {k: kwargs.pop(k) for k in list(kwargs) if k in names}   # in the caller's order
            resolved = resolve_options(kind, shown, type(self).__name__, options, given)
            init(self, *args, options=resolved, **kwargs)
        return wrapper  # type: ignore[return-value]
    return decorate
