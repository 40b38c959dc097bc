"""Where a run directory lives: local disk, or an object store through fsspec.

Writer, lock and reader go through one :class:`Storage`, addressed by names relative to the
run directory (``manifest.chief.s0001.json``, ``dumps/...``). Two implementations:

- :class:`LocalStorage` (plain paths and ``file://``): the fast path as it always was:
  a temporary file, ``posix_fallocate``, optional fsync, atomic rename; exclusive create with
  ``O_EXCL``; reads check for regular files inside the run; large arrays are memory-mapped.
- :class:`FsspecStorage` (``s3://``, ``gs://``, ``memory://``, any fsspec URL): each file is
  one object written whole (a single PUT, or a multipart upload streamed part by part and
  completed only at the end, aborted on an error), so it never shows under its final name
  incomplete and a large dump is never held twice; the manifest is replaced the same way;
  reads are byte ranges (a dump's header, then one array; a Parquet footer, then columns).

fsspec (and s3fs, gcsfs...) are imported only for URLs; a missing one is an ImportError
naming the package to install. Example::

    store = open_storage("s3://bucket/runs/exp1", storage_options={"anon": False})
    store.write("manifest.chief.s0001.json", [b"{}"])
    store.read("manifest.chief.s0001.json", limit=1 << 20)
    open_storage("runs/exp1").is_local     # True
"""
from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

#: fsspec protocols and the package that provides each (the import error names it).
_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "abfs": "adlfs",
             "az": "adlfs", "hdfs": "pyarrow", "memory": "fsspec"}


@dataclass(frozen=True)
class Entry:
    """One name in a folder of the run: its size (None for a folder) and a stamp that changes
    whenever the file is replaced (mtime in ns locally, the ETag or modification time remotely)."""
    name: str
    size: int | None
    stamp: str
    link: bool = False   # a symbolic link (local disk): never counted or followed


@dataclass(frozen=True)
class Version:
    """One version of a small file (a lock): its bytes, a tag that changes whenever it is
    replaced (the ETag on S3; inode, mtime and size on disk), and its age in seconds by the
    store's own clock (S3: the response's ``Date`` minus the object's ``Last-Modified``; on
    disk and ``memory://``: this host's clock, which is that store's), None where the store
    does not say."""
    data: bytes
    tag: str
    age: float | None


def is_url(path: Any) -> bool:
    """True for ``scheme://...`` strings other than ``file://`` (which is local disk)."""
    return isinstance(path, str) and "://" in path and not path.startswith("file://")


def local_path(path: str | os.PathLike) -> Path:
    """``path`` as a local Path (``file://`` stripped); ValueError for another URL."""
    if is_url(path):
        raise ValueError(f"{path!r} is not a local path")
    text = os.fspath(path)
    return Path(text[len("file://"):] if isinstance(text, str) and text.startswith("file://")
                else text)


def normalize(path: "str | os.PathLike | Storage") -> "str | Path | Storage":
    """What a user passed as a run directory: a URL kept as text (``Path`` would fold its
    ``//``), a Storage as is, anything else as a local Path."""
    if isinstance(path, Storage):
        return path
    if isinstance(path, str) and is_url(path):
        return path
    return local_path(path)


#: Environment variable: a JSON object of fsspec storage options for every URL opened without
#: ``storage_options=`` (the viewer and ``python -m inspector app`` have no other way in).
OPTIONS_ENV = "TF_INSPECTOR_STORAGE_OPTIONS"


def env_storage_options() -> dict | None:
    """The storage options in $TF_INSPECTOR_STORAGE_OPTIONS, or None; ValueError naming the
    variable if it is not a JSON object."""
    text = os.environ.get(OPTIONS_ENV, "").strip()
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ValueError(f"${OPTIONS_ENV} must be a JSON object of fsspec storage options: "
                         f"{e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"${OPTIONS_ENV} must be a JSON object of fsspec storage options, not "
                         f"{text[:40]!r}")
    return value


#: Environment variable: seconds an object store's request may take to connect, and each of
#: its reads may wait (``open_storage(timeout=)`` wins); default DEFAULT_TIMEOUT.
TIMEOUT_ENV = "TF_INSPECTOR_STORAGE_TIMEOUT"


#: Seconds a request may take to connect and each read may wait, by default; a request is
#: tried REQUEST_ATTEMPTS times (a timeout, a dropped connection, HTTP 5xx, throttling) before
#: it fails with StorageError, so a store that hangs costs at most ~REQUEST_ATTEMPTS times this.
DEFAULT_TIMEOUT = 10.0


REQUEST_ATTEMPTS = 3


def storage_timeout(timeout: "float | str | None" = None) -> float:
    """``timeout``, else $TF_INSPECTOR_STORAGE_TIMEOUT, else DEFAULT_TIMEOUT; ValueError naming
    the bad value unless it is a positive number of seconds."""
    where, value = "timeout", timeout
    if value is None:
        where, value = f"${TIMEOUT_ENV}", os.environ.get(TIMEOUT_ENV, "").strip() or DEFAULT_TIMEOUT
    try:
        secs = float(value)
    except (TypeError, ValueError):
        secs = float("nan")
    if not 0 < secs < float("inf"):
        raise ValueError(f"{where}={value!r} must be a positive number of seconds (default "
                         f"{DEFAULT_TIMEOUT:g})")
    return secs


class Storage:
    """A run directory's files, by names relative to it. See the module docstring."""
    is_local = False
    #: how the lock's exclusive create is made: 'atomic' (the backend refuses a second
    #: create) or 'check-then-write' (a race between two writers is possible: FORMAT.md)
    exclusive = "atomic"

    def display(self, rel: str = "") -> str:
        """The file's full name, for messages."""
        raise NotImplementedError

    def child(self, name: str) -> "Storage":
        """The storage of the folder ``name`` inside this one (a run inside a runs folder)."""
        raise NotImplementedError

    def exists(self) -> bool:
        """Whether the run directory exists (a bucket prefix exists when objects are under it)."""
        raise NotImplementedError

    def list(self, sub: str = "") -> list[Entry]:
        """Every entry directly in folder ``sub`` ('' is the run directory); [] if there is none."""
        raise NotImplementedError

    def read(self, rel: str, limit: int | None = None) -> bytes:
        """The whole file; DamagedFileError if it is not a readable file, holds more than
        ``limit`` bytes (checked before reading), or changes size while read."""
        raise NotImplementedError

    def ranged(self, rel: str, size: int | None = None) -> "Ranged":
        """The file opened for byte-range reads (a context manager); DamagedFileError if it is
        not a readable file. ``size``: its size from a listing (saves asking a store for it;
        run files are never rewritten in place)."""
        raise NotImplementedError

    def write(self, rel: str, chunks: Iterable[bytes | memoryview], fsync: bool = False,
              size: int | None = None) -> int:
        """Write the file whole: it appears under ``rel`` only when complete (replacing an
        older one at once). Returns the bytes written."""
        raise NotImplementedError

    def create(self, rel: str, data: bytes) -> bool:
        """Create ``rel`` holding ``data`` unless it exists:
        True if created, False if it existed."""
        raise NotImplementedError

    def read_version(self, rel: str, limit: int = 1 << 20) -> Version | None:
        """The current :class:`Version` of the small file ``rel`` (at most ``limit`` bytes read),
        or None if it does not exist. StorageError if the store cannot say (a timeout, HTTP 5xx):
        never None for "could not read", so a lock that cannot be read is never taken for gone."""
        raise NotImplementedError

    def replace(self, rel: str, data: bytes, tag: str) -> bool:
        """Replace ``rel`` with ``data`` only if its current version is ``tag`` (a compare and
        swap: of two writers replacing one version, one wins). False if it changed or is gone."""
        raise NotImplementedError

    def delete(self, rel: str) -> None:
        """Remove ``rel``; nothing if it is gone already."""
        raise NotImplementedError

    def makedirs(self, sub: str = "") -> None:
        """Make folder ``sub`` (object stores have none: nothing to do)."""

    def abort_uploads(self, owned: "Callable[[str], bool]") -> int:
        """Abort the unfinished multipart uploads of run files whose name (relative to the run)
        ``owned`` accepts; how many. Only S3 keeps such parts (billed, invisible to listings)."""
        return 0


class Ranged:
    """An open file read by byte ranges: ``size``, :meth:`pread`, and :meth:`pyfile` for pyarrow."""
    size: int
    name: str

    def pread(self, offset: int, n: int) -> bytes:
        raise NotImplementedError

    def pyfile(self) -> io.RawIOBase:
        """A seekable binary file whose every ``read`` is one range request (no read-ahead)."""
        return _RangeFile(self)

    def close(self) -> None:
        pass

    def __enter__(self) -> "Ranged":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _RangeFile(io.RawIOBase):
    """File object over :class:`Ranged`: pyarrow reads a Parquet footer, then the column chunks
    it needs, each as one ``read`` here, so a remote part costs those byte ranges only."""

    def __init__(self, ranged: Ranged) -> None:
        self._r, self._pos = ranged, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self._pos, self._r.size)[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, n: int = -1) -> bytes:
        end = self._r.size if n is None or n < 0 else min(self._r.size, self._pos + n)
        if end <= self._pos:
            return b""
        data = self._r.pread(self._pos, end - self._pos)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def size(self) -> int:
        return self._r.size
