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

import contextlib
import email.utils
import io
import json
import os
import secrets
import stat
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from .errors import DamagedFileError, InspectorError, StorageError
from .format import atomic_write

#: fsspec protocols and the package that provides each (the import error names it).
_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "abfs": "adlfs", "az": "adlfs",
             "hdfs": "pyarrow", "memory": "fsspec"}


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
    return Path(text[len("file://"):] if isinstance(text, str) and text.startswith("file://") else text)


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
        raise ValueError(f"${OPTIONS_ENV} must be a JSON object of fsspec storage options: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"${OPTIONS_ENV} must be a JSON object of fsspec storage options, not {text[:40]!r}")
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
        raise ValueError(f"{where}={value!r} must be a positive number of seconds (default {DEFAULT_TIMEOUT:g})")
    return secs


def open_storage(path: "str | os.PathLike | Storage", storage_options: Mapping[str, Any] | None = None,
                 filesystem: Any = None, timeout: float | None = None) -> "Storage":
    """The storage of the run directory ``path``: local for plain paths and ``file://``, fsspec
    for other URLs (``storage_options`` go to the fsspec filesystem, as fsspec documents them;
    default: $TF_INSPECTOR_STORAGE_OPTIONS, else none: credentials from the environment;
    ``filesystem``: an fsspec filesystem instance to use instead, e.g. one that counts requests;
    ``timeout``: see :func:`storage_timeout`, applied to ``s3://`` where the options do not set
    ``config_kwargs`` timeouts themselves)."""
    if isinstance(path, Storage):
        return path
    if filesystem is None and not is_url(path):
        if storage_options:
            raise ValueError(f"storage_options={dict(storage_options)!r} apply to URLs (s3://, gs://...), "
                             f"not to the local path {os.fspath(path)!r}")
        return LocalStorage(local_path(path))
    if storage_options is None and filesystem is None:
        storage_options = env_storage_options()
    return FsspecStorage(os.fspath(path), storage_options, filesystem, timeout=timeout)


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
        """Create ``rel`` holding ``data`` unless it exists: True if created, False if it existed."""
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


# ---- local disk ------------------------------------------------------------------------------
class LocalStorage(Storage):
    """A run directory on local disk: every operation is the one the project always used."""
    is_local = True

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"LocalStorage({str(self.root)!r})"

    def path(self, rel: str = "") -> Path:
        return self.root / rel if rel else self.root

    def display(self, rel: str = "") -> str:
        return str(self.path(rel))

    def child(self, name: str) -> "LocalStorage":
        return LocalStorage(self.root / name)

    def exists(self) -> bool:
        return self.root.is_dir()

    def list(self, sub: str = "") -> list[Entry]:
        out = []
        try:
            with os.scandir(self.path(sub)) as it:
                for e in it:
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    is_dir = e.is_dir(follow_symlinks=False)
                    out.append(Entry(e.name, None if is_dir else st.st_size, str(st.st_mtime_ns),
                                     stat.S_ISLNK(st.st_mode)))
        except OSError:
            return []
        return out

    def read(self, rel: str, limit: int | None = None) -> bytes:
        from .safe_files import read_bytes
        return read_bytes(self.path(rel), self.root, limit)

    def ranged(self, rel: str, size: int | None = None) -> "_LocalRanged":
        return _LocalRanged(self.path(rel), self.root)  # the size is the open file's own

    def write(self, rel: str, chunks: Iterable[bytes | memoryview], fsync: bool = False,
              size: int | None = None) -> int:
        return atomic_write(self.path(rel), chunks, fsync=fsync, size=size)

    def create(self, rel: str, data: bytes) -> bool:
        # written whole under a temporary name, then linked to ``rel`` (refused if it exists):
        # nobody ever reads an empty or half-written file under ``rel``
        path = self.path(rel)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            with open(tmp, "xb") as f:
                f.write(data)
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            return True
        finally:
            tmp.unlink(missing_ok=True)

    def read_version(self, rel: str, limit: int = 1 << 20) -> Version | None:
        path = self.path(rel)
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                data = f.read(limit + 1) if stat.S_ISREG(st.st_mode) else b""
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StorageError(f"{path}: cannot be read ({e.strerror or e})", str(path), e) from None
        return Version(data, _local_tag(st), max(0.0, time.time() - st.st_mtime))

    def replace(self, rel: str, data: bytes, tag: str) -> bool:
        # No compare-and-swap on a file system: move the version judged away (a rename: of two
        # writers, one moves it), check that it was the one judged, then create the new one
        # exclusively. A file found changed is put back where nothing replaced it meanwhile.
        path = self.path(rel)
        moved = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            os.rename(path, moved)
        except FileNotFoundError:
            return False
        try:
            if _local_tag(os.stat(moved)) != tag:
                with contextlib.suppress(FileExistsError):
                    os.link(moved, path)
                return False
            return self.create(rel, data)
        finally:
            moved.unlink(missing_ok=True)

    def delete(self, rel: str) -> None:
        try:
            os.unlink(self.path(rel))
        except FileNotFoundError:
            pass

    def makedirs(self, sub: str = "") -> None:
        self.path(sub).mkdir(parents=True, exist_ok=True)


def _local_tag(st: os.stat_result) -> str:
    return f"{st.st_ino}:{st.st_mtime_ns}:{st.st_size}"


class _LocalRanged(Ranged):
    """A local file opened once (a regular file inside the run: ``safe_files.open_regular``)."""

    def __init__(self, path: Path, root: Path | None) -> None:
        from .safe_files import open_regular
        self.name, self.path = str(path), path
        self.file = open_regular(path, root)
        self.size = os.fstat(self.file.fileno()).st_size

    def pread(self, offset: int, n: int) -> bytes:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = os.preadv(self.file.fileno(), [view[got:]], offset + got)
            if k == 0:
                break
            got += k
        return bytes(buf[:got])

    def close(self) -> None:
        self.file.close()


# ---- fsspec ----------------------------------------------------------------------------------
#: protocols whose fsspec write file buffers one block and uploads it as a part of an upload
#: that only close completes (s3fs multipart, gcsfs resumable, adlfs staged blocks)
_STREAMED = {"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az"}
#: bytes per part of a streamed upload (S3 allows 5 MiB to 5 GiB, at most 10,000 parts: up
#: to 160 GiB a file); about what a streamed write holds in memory beyond the arrays
PART_SIZE = 16 << 20

#: memory:// creates under this lock: its ``open('xb')`` checks, then writes (two steps).
_MEMORY_CREATE = threading.Lock()


def _fsspec_for(url: str, storage_options: Mapping[str, Any] | None, timeout: float) -> tuple[Any, str]:
    protocol = url.split("://", 1)[0]
    try:
        import fsspec
        s3 = protocol in ("s3", "s3a")
        own_retries = "retries" in dict((storage_options or {}).get("config_kwargs") or {})
        fs, root = fsspec.core.url_to_fs(url, **(_s3_options(storage_options, timeout) if s3 else
                                                 dict(storage_options or {})))
        if s3 and not own_retries:
            fs.retries = 1  # botocore's REQUEST_ATTEMPTS are the attempts: no second loop of s3fs's own
        return fs, root
    except ImportError as e:
        package = _PACKAGES.get(protocol, f"the fsspec implementation of {protocol}://")
        raise ImportError(f"reading or writing {url} needs fsspec and {package}: pip install "
                          f"'tf-inspector[{'s3' if package == 's3fs' else 'remote'}]' (or pip install fsspec "
                          f"{package}); local paths need neither ({e})") from None


def _s3_options(options: Mapping[str, Any] | None, timeout: float) -> dict:
    """``options`` with botocore's timeouts and retries set to ``timeout`` and REQUEST_ATTEMPTS
    (standard mode: timeouts, dropped connections, 5xx, throttling), where they do not set them:
    s3fs's defaults tried a hanging endpoint for two minutes before an error reached the caller."""
    opts = dict(options or {})
    config = dict(opts.get("config_kwargs") or {})
    config.setdefault("connect_timeout", timeout)
    config.setdefault("read_timeout", timeout)
    config.setdefault("retries", {"total_max_attempts": REQUEST_ATTEMPTS, "mode": "standard"})
    opts["config_kwargs"] = config
    return opts


def check_relative(rel: str) -> str:
    """``rel`` if it names a path inside the run (components not empty, '.' or '..'; no
    backslash, NUL or scheme), else ValueError: a name read from a run never leaves it."""
    parts = rel.split("/") if rel else []
    if any(p in ("", ".", "..") for p in parts) or any(c in rel for c in ("\\", "\x00", ":")):
        raise ValueError(f"path {rel!r} escapes the run directory or is not a plain relative name")
    return rel


class FsspecStorage(Storage):
    """A run directory under an fsspec URL. Files are objects written whole (see the module
    docstring); the lock's create is a conditional put (``If-None-Match: *``) on S3, atomic
    within the process for ``memory://``, and check-then-write elsewhere (FORMAT.md). Every
    error of the store's client but a missing object is a StorageError naming the URL."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None, filesystem: Any = None,
                 timeout: float | None = None) -> None:
        self.timeout = storage_timeout(timeout)
        if filesystem is None:
            self.fs, root = _fsspec_for(url, storage_options, self.timeout)
        else:
            self.fs, root = filesystem, filesystem._strip_protocol(url)
        self.url = url.rstrip("/")
        self.root = str(root).rstrip("/")
        self.storage_options = dict(storage_options or {})
        protocols = self.fs.protocol if isinstance(self.fs.protocol, (tuple, list)) else (self.fs.protocol,)
        self.kind = "s3" if {"s3", "s3a"} & set(protocols) else "memory" if "memory" in protocols else "other"
        self.exclusive = "atomic" if self.kind in ("s3", "memory") else "check-then-write"
        #: stream through fsspec's buffered write file (multipart upload committed at close):
        #: backends known to upload that way; memory:// and others get one PUT of the whole file
        self.streamed = bool(_STREAMED & set(protocols))
        self.part_size = PART_SIZE

    def __repr__(self) -> str:
        return f"FsspecStorage({self.url!r})"

    def _abs(self, rel: str) -> str:
        return f"{self.root}/{check_relative(rel)}" if rel else self.root

    def display(self, rel: str = "") -> str:
        return f"{self.url}/{rel}" if rel else self.url

    @contextlib.contextmanager
    def _errors(self, rel: str, action: str) -> Iterator[None]:
        """The client's errors as StorageError naming the URL (a missing object, an existing one
        refused by a create, and this package's own errors pass as they are)."""
        try:
            yield
        except (FileNotFoundError, NotADirectoryError, FileExistsError, InspectorError):
            raise
        except Exception as e:  # noqa: BLE001 - botocore, aiohttp, OSError of s3fs...: one error type
            url = self.display(rel)
            raise StorageError(f"{url}: cannot {action} ({type(e).__name__}: {e})", url, e) from e

    def child(self, name: str) -> "FsspecStorage":
        check_relative(name)
        out = FsspecStorage.__new__(FsspecStorage)
        out.__dict__.update(self.__dict__, url=f"{self.url}/{name}", root=f"{self.root}/{name}")
        return out

    def exists(self) -> bool:
        with self._errors("", "list"):
            try:
                return bool(self.fs.ls(self.root, detail=False, refresh=True))
            except (FileNotFoundError, NotADirectoryError):
                return False
            except TypeError:  # a filesystem whose ls takes no refresh=
                return bool(self.fs.ls(self.root, detail=False))

    def list(self, sub: str = "") -> list[Entry]:
        path = self._abs(sub)
        self.fs.invalidate_cache(path)  # listings are cached by fsspec: a live run grows
        try:
            with self._errors(sub, "list"):
                entries = self.fs.ls(path, detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        out = []
        for e in entries:
            name = str(e["name"]).rstrip("/").rsplit("/", 1)[-1]
            if not name or str(e["name"]).rstrip("/") == path:
                continue
            is_file = e.get("type") == "file"
            stamp = e.get("ETag") or e.get("etag") or e.get("LastModified") or e.get("mtime") or e.get("created")
            out.append(Entry(name, int(e.get("size") or 0) if is_file else None, str(stamp)))
        return out

    def _size(self, rel: str) -> int:
        path = self._abs(rel)
        try:
            with self._errors(rel, "read"):
                info = self.fs.info(path)
        except FileNotFoundError:
            raise DamagedFileError(f"{self.display(rel)}: cannot be read (no such object)") from None
        if info.get("type") != "file":
            raise DamagedFileError(f"{self.display(rel)}: not a file ({info.get('type')}); refused")
        return int(info["size"])

    def read(self, rel: str, limit: int | None = None) -> bytes:
        # One GET from byte 0 (no size asked first): the manifest and the lock are replaced
        # while readers read, and a size and a range taken from two versions would splice
        # them; one response is one version. At most limit + 1 bytes: tells a file too large.
        path, name = self._abs(rel), self.display(rel)
        try:
            with self._errors(rel, "read"):
                try:
                    data = self.fs.cat_file(path, start=0, end=None if limit is None else limit + 1)
                except FileNotFoundError:
                    raise
                except OSError:
                    if self._size(rel) != 0:
                        raise
                    data = b""  # a range on an empty object is refused by S3 (416)
        except FileNotFoundError:
            raise DamagedFileError(f"{name}: cannot be read (no such object)") from None
        if limit is not None and len(data) > limit:
            raise DamagedFileError(f"{name}: more than the {limit:,} bytes a file of this kind may hold")
        return bytes(data)

    def ranged(self, rel: str, size: int | None = None) -> "_FsspecRanged":
        return _FsspecRanged(self, rel, self._size(rel) if size is None else size)

    def write(self, rel: str, chunks: Iterable[bytes | memoryview], fsync: bool = False,
              size: int | None = None) -> int:
        # One object, complete or absent. fsync has no meaning here: a completed PUT is durable.
        path = self._abs(rel)
        try:
            if self.streamed:
                return self._stream(rel, chunks)
            data = b"".join(chunks)  # memory:// and unknown backends: one PUT of the whole file
            with self._errors(rel, "write"):
                self.fs.pipe_file(path, data)
            return len(data)
        finally:
            self.fs.invalidate_cache(path)

    def _stream(self, rel: str, chunks: Iterable[bytes | memoryview]) -> int:
        """Send ``chunks`` through the backend's buffered write file: a file smaller than one
        part is one PUT at the end; a larger one is a multipart upload whose parts leave as they
        fill (the buffer holds at most one part) and which is completed only after the last
        chunk. On any error before that the upload is aborted (``discard``), never completed: a
        ``with`` block would close, and so commit, a truncated object. An error of ``chunks``
        itself reaches the caller as it is; the store's are StorageError."""
        part = self.part_size
        with self._errors(rel, "write"):
            f = self.fs.open(self._abs(rel), "wb", block_size=part)
        n = 0
        try:
            for chunk in chunks:
                view = memoryview(chunk).cast("B")
                while view.nbytes:
                    # up to the next part boundary: the file uploads a full buffer at once, so
                    # a 1 GiB array never sits whole in it
                    k = min(view.nbytes, part - n % part)
                    with self._errors(rel, "write"):
                        f.write(view[:k])
                    n, view = n + k, view[k:]
            with self._errors(rel, "write"):
                f.close()  # the last part, then the upload completed: the object appears whole
        except BaseException:
            try:
                f.discard()  # abort the multipart upload: no object, no stored parts
            except Exception:  # noqa: BLE001 - the first error is the one to report
                pass
            f.closed = True  # so neither we nor __del__ ever close (commit) it
            raise
        return n

    def create(self, rel: str, data: bytes) -> bool:
        path = self._abs(rel)
        try:
            with self._errors(rel, "create"):
                try:
                    if self.kind == "memory":
                        with _MEMORY_CREATE:
                            self.fs.pipe_file(path, data, mode="create")
                    elif self.kind == "s3":
                        self.fs.pipe_file(path, data, mode="create")  # PUT with If-None-Match: *
                    else:
                        if self.fs.exists(path):
                            return False
                        self.fs.pipe_file(path, data)
                except OSError as e:
                    if _precondition_failed(e):
                        return False
                    if "NotImplemented" in str(e) or "501" in str(e):
                        raise InspectorError(
                            f"{self.display(rel)}: this S3 endpoint does not support conditional writes "
                            f"(If-None-Match), which the writer's lock needs to tell two writers of one worker apart "
                            f"({e}); use an endpoint that does (AWS S3, MinIO), or give each writer its own worker "
                            f"name") from None
                    raise
        except FileExistsError:
            return False
        finally:
            self.fs.invalidate_cache(path)
        return True

    def read_version(self, rel: str, limit: int = 1 << 20) -> Version | None:
        path = self._abs(rel)
        try:
            with self._errors(rel, "read"):
                if self.kind == "s3":
                    return self._s3_version(path, limit)
                data = bytes(self.fs.cat_file(path))[:limit + 1]
                info = self.fs.info(path)
        except FileNotFoundError:
            return None
        if self.kind == "memory":  # this process's clock is the store's
            created = info.get("created") or 0
            created = created.timestamp() if hasattr(created, "timestamp") else float(created)
            return Version(data, f"{created}:{len(data)}:{zlib.crc32(data)}", max(0.0, time.time() - created))
        stamp = info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("updated") or ""
        return Version(data, f"{stamp}:{len(data)}:{zlib.crc32(data)}", None)

    def _s3_version(self, path: str, limit: int) -> Version:
        """One GET: the bytes, the ETag, and the age by the store's clock (``Date`` minus
        ``Last-Modified``, both the server's: the writer's host clock plays no part)."""
        from fsspec.asyn import sync
        bucket, key, _ = self.fs.split_path(path)

        async def get() -> tuple[dict, bytes]:
            resp = await self.fs._call_s3("get_object", Bucket=bucket, Key=key)
            try:
                return resp, await resp["Body"].read(limit + 1)
            finally:
                resp["Body"].close()

        resp, data = sync(self.fs.loop, get)
        age = None
        date = resp.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        if date and resp.get("LastModified") is not None:
            age = max(0.0, (email.utils.parsedate_to_datetime(date) - resp["LastModified"]).total_seconds())
        return Version(data, str(resp.get("ETag")), age)

    def replace(self, rel: str, data: bytes, tag: str) -> bool:
        path = self._abs(rel)
        try:
            with self._errors(rel, "replace"):
                if self.kind == "s3":  # PUT with If-Match: the store refuses it once the version changed
                    bucket, key, _ = self.fs.split_path(path)
                    try:
                        self.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, IfMatch=tag)
                    except OSError as e:
                        if _precondition_failed(e):
                            return False
                        raise
                    return True
                lock = _MEMORY_CREATE if self.kind == "memory" else contextlib.nullcontext()
                with lock:  # elsewhere check-then-write, as the lock's create (FORMAT.md)
                    current = self.read_version(rel)
                    if current is None or current.tag != tag:
                        return False
                    self.fs.pipe_file(path, data)
                return True
        except FileNotFoundError:
            return False
        finally:
            self.fs.invalidate_cache(path)

    def delete(self, rel: str) -> None:
        try:
            with self._errors(rel, "delete"):
                self.fs.rm_file(self._abs(rel))
        except FileNotFoundError:
            pass
        self.fs.invalidate_cache(self._abs(rel))

    def makedirs(self, sub: str = "") -> None:
        if self.kind == "memory":  # memory:// lists only folders that were made
            self.fs.makedirs(self._abs(sub), exist_ok=True)

    def abort_uploads(self, owned: Callable[[str], bool]) -> int:
        # A writer killed mid-upload (SIGKILL, a daemon thread cut at interpreter exit) never
        # aborted its multipart upload: S3 keeps the parts sent, up to PART_SIZE each, until
        # aborted or a bucket lifecycle rule for incomplete uploads removes them.
        if self.kind != "s3":
            return 0
        bucket, key, _ = self.fs.split_path(self.root)
        prefix = f"{key}/" if key else ""
        found: list[dict] = []
        marker: dict[str, str] = {}
        with self._errors("", "list the unfinished uploads of"):
            while True:
                page = self.fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=prefix, **marker)
                found += [u for u in page.get("Uploads", []) if owned(u["Key"][len(prefix):])]
                if not page.get("IsTruncated"):
                    break
                marker = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}
            for u in found:
                self.fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"])
        return len(found)


def _precondition_failed(e: BaseException) -> bool:
    """Whether the store refused a conditional request (HTTP 412; a missing object for If-Match)."""
    text = str(e)
    return "PreconditionFailed" in text or "412" in text or "At least one of the pre-conditions" in text


class _FsspecRanged(Ranged):
    """An object read by ranges: one request per :meth:`pread` (``cat_file(start, end)``)."""

    def __init__(self, store: FsspecStorage, rel: str, size: int) -> None:
        self.store, self.rel, self.path, self.size = store, rel, store._abs(rel), size
        self.name = store.display(rel)

    def pread(self, offset: int, n: int) -> bytes:
        if n <= 0:
            return b""
        try:
            with self.store._errors(self.rel, "read"):
                return bytes(self.store.fs.cat_file(self.path, start=offset, end=offset + n))
        except FileNotFoundError:
            raise DamagedFileError(f"{self.name}: cannot be read (the object is gone)") from None
