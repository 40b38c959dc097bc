"""Object stores through fsspec (s3://, gs://, memory://): one object per file, large ones
streamed as a multipart upload completed at close; conditional-PUT lock; byte-range reads.
"""
from __future__ import annotations

import contextlib
import email.utils
import threading
import time
import zlib
from typing import Any, Callable, Iterable, Iterator, Mapping

from inspector.errors import DamagedFileError, InspectorError, StorageError
from inspector.storage._base import (_PACKAGES, REQUEST_ATTEMPTS, Entry, Ranged, Storage, Version,
                                     storage_timeout)

# ---- fsspec ----------------------------------------------------------------------------------
#: protocols whose fsspec write file buffers one block and uploads it as a part of an upload
#: that only close completes (s3fs multipart, gcsfs resumable, adlfs staged blocks)
_STREAMED = {"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az"}


#: bytes per part of a streamed upload (S3 allows 5 MiB to 5 GiB, at most 10,000 parts: up
#: to 160 GiB a file); about what a streamed write holds in memory beyond the arrays
PART_SIZE = 16 << 20


#: memory:// creates under this lock: its ``open('xb')`` checks, then writes (two steps).
_MEMORY_CREATE = threading.Lock()


def _fsspec_for(url: str, storage_options: Mapping[str, Any] | None,
                timeout: float) -> tuple[Any, str]:
    protocol = url.split("://", 1)[0]
    try:
        import fsspec
        s3 = protocol in ("s3", "s3a")
        own_retries = "retries" in dict((storage_options or {}).get("config_kwargs") or {})
        fs, root = fsspec.core.url_to_fs(url, **(_s3_options(storage_options, timeout) if s3 else
                                                 dict(storage_options or {})))
        if s3 and not own_retries:
            # botocore's REQUEST_ATTEMPTS are the attempts: no second loop of s3fs's own
            fs.retries = 1
        return fs, root
    except ImportError as e:
        package = _PACKAGES.get(protocol, f"the fsspec implementation of {protocol}://")
        raise ImportError(f"reading or writing {url} needs fsspec and {package}: pip install "
                          f"'tf-inspector[{'s3' if package == 's3fs' else 'remote'}]' (or pip "
                          f"install fsspec {package}); local paths need neither ({e})") from None


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

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None,
                 filesystem: Any = None, timeout: float | None = None) -> None:
        self.timeout = storage_timeout(timeout)
        if filesystem is None:
            self.fs, root = _fsspec_for(url, storage_options, self.timeout)
        else:
            self.fs, root = filesystem, filesystem._strip_protocol(url)
        self.url = url.rstrip("/")
        self.root = str(root).rstrip("/")
        self.storage_options = dict(storage_options or {})
        protocols = self.fs.protocol if isinstance(self.fs.protocol, (tuple, list)) \
            else (self.fs.protocol,)
        self.kind = "s3" if {"s3", "s3a"} & set(protocols) else "memory" if "memory" in protocols \
            else "other"
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
        except Exception as e:  # noqa: BLE001 - botocore, aiohttp, OSError of s3fs...:
            # one error type
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
            stamp = e.get("ETag") or e.get("etag") or e.get("LastModified") or e.get("mtime") \
                or e.get("created")
            out.append(Entry(name, int(e.get("size") or 0) if is_file else None, str(stamp)))
        return out

    def _size(self, rel: str) -> int:
        path = self._abs(rel)
        try:
            with self._errors(rel, "read"):
                info = self.fs.info(path)
        except FileNotFoundError:
            raise DamagedFileError(f"{self.display(rel)}: cannot be read "
                                   "(no such object)") from None
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
            raise DamagedFileError(f"{name}: more than the {limit:,} bytes a file of this kind may "
                                   "hold")
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
                            f"{self.display(rel)}: this S3 endpoint does not support conditional "
                            "writes (If-None-Match), which the writer's lock needs to tell two "
                            f"writers of one worker apart ({e}); use an endpoint that does (AWS "
                            f"S3, MinIO), or give each writer its own worker name") from None
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
            return Version(data, f"{created}:{len(data)}:{zlib.crc32(data)}",
                           max(0.0, time.time() - created))
        stamp = info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("updated") \
            or ""
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
            age = max(0.0, (email.utils.parsedate_to_datetime(date)
                            - resp["LastModified"]).total_seconds())
        return Version(data, str(resp.get("ETag")), age)

    def replace(self, rel: str, data: bytes, tag: str) -> bool:
        path = self._abs(rel)
        try:
            with self._errors(rel, "replace"):
                # PUT with If-Match: the store refuses it once the version changed
                if self.kind == "s3":
                    bucket, key, _ = self.fs.split_path(path)
                    try:
                        self.fs.call_s3("put_object", Bucket=bucket, Key=key,
                                        Body=data, IfMatch=tag)
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
                page = self.fs.call_s3("list_multipart_uploads", Bucket=bucket,
                                       Prefix=prefix, **marker)
                found += [u for u in page.get("Uploads", []) if owned(u["Key"][len(prefix):])]
                if not page.get("IsTruncated"):
                    break
                marker = {"KeyMarker": page["NextKeyMarker"],
                          "UploadIdMarker": page["NextUploadIdMarker"]}
            for u in found:
                self.fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=u["Key"],
                                UploadId=u["UploadId"])
        return len(found)


def _precondition_failed(e: BaseException) -> bool:
    """Whether the store refused a conditional request (HTTP 412; a missing object for If-Match)."""
    text = str(e)
    return "PreconditionFailed" in text or "412" in text \
        or "At least one of the pre-conditions" in text


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
