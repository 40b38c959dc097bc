"""Local disk: the atomic-rename fast path, exclusive create with O_EXCL, memory-mapped reads.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import stat
import time
from pathlib import Path
from typing import Iterable

from inspector.errors import StorageError
from inspector.storage._base import Entry, Ranged, Storage, Version
from inspector.storage.atomic import atomic_write


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
        from inspector.storage.safety import read_bytes
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
            raise StorageError(f"{path}: cannot be read ({e.strerror or e})",
                               str(path), e) from None
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
        from inspector.storage.safety import open_regular
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
