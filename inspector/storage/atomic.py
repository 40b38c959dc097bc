"""Atomic writes of a run's files (a temporary name, then a rename), their JSON encoding, and
the join that keeps a name read from a run inside it.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Iterator


def safe_join(root: Path, relative: str) -> Path:
    """Join ``relative`` (read from a run) under ``root``; refuse anything that escapes it."""
    root = Path(root).resolve()
    path = (root / relative).resolve()
    if path != root and root not in path.parents:
        raise ValueError(f"path {relative!r} escapes the run directory {root}")
    return path


def create_temporary(path: Path) -> tuple[int, str]:
    """(fd, name) of a new hidden file ``.<name>.<random>.tmp`` beside ``path``, opened for writing.

    Created with mode 0666 so the kernel applies the process umask, as a plain ``open()``
    would (``mkstemp`` makes 0600, and reading the umask means setting it, which races with
    other threads); ``O_EXCL`` makes the random name ours alone."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = os.path.join(path.parent, f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name beside", str(path))


def atomic_write(path: Path, chunks: Iterable[bytes | memoryview], fsync: bool = True,
                 size: int | None = None) -> int:
    """Write ``chunks`` to a temporary file beside ``path``, fsync,
    then rename. Returns bytes written.

    ``fsync=False`` skips the fsync: the rename is still atomic for every reader and survives
    a crash of the process (SIGKILL included: the page cache belongs to the kernel), but after
    a power loss or kernel crash the file may be empty or short under its final name (readers
    report it as damaged). The fsync costs a disk flush per file.

    ``size``: the total, when known: the file's blocks are allocated up front
    (``posix_fallocate``), which on ext4 shortens a large dump's write under sustained
    dumping, its slow tail most.

    Example::

        atomic_write(Path("runs/x/manifest.chief.json"), [b"{}"])
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with atomic_file(path, fsync) as f:
        if size and hasattr(os, "posix_fallocate"):
            try:
                os.posix_fallocate(f.fileno(), 0, size)
            except OSError as e:
                # a filesystem without it: write as usual; but no space is no space
                if e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
                    raise
        for chunk in chunks:
            f.write(chunk)
            written += len(chunk) if isinstance(chunk, bytes) else chunk.nbytes
    return written


@contextlib.contextmanager
def atomic_file(path: Path, fsync: bool = True) -> Iterator[BinaryIO]:
    """A binary file on a new temporary beside ``path`` (:func:`create_temporary`), renamed to
    ``path`` when the block ends (flushed; fsynced with ``fsync``) and deleted if it raises, so
    ``path`` never shows a partial file. :func:`atomic_write` and the compaction merge write
    through it.

    Example::

        with atomic_file(Path("runs/x/stats/part.parquet"), fsync=False) as f:
            pq.write_table(table, f)
    """
    fd, tmp = create_temporary(Path(path))
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def json_bytes(obj: Any) -> bytes:
    """``obj`` as JSON for a run file: one line per top-level key, and per element of a
    top-level list (the catalog: one tensor a line), each encoded by json's C encoder.

    Why not ``indent=``: with it json uses its pure-Python encoder, many times slower, paid at
    every writer session's start and close (each ``fit`` of the Keras callback) and every
    heartbeat; this still reads line by line.

    >>> print(json_bytes({"a": 1, "tensors": [{"n": "x"}, {"n": "y"}]}).decode())
    {
    "a": 1,
    "tensors": [
     {"n": "x"},
     {"n": "y"}
    ]
    }
    """
    def one(v: Any) -> str:
        return json.dumps(v, allow_nan=False)

    def key(k: Any) -> str:   # as json.dumps turns a key into a string (7 -> "7", True -> "true")
        if isinstance(k, str):
            return one(k)
        if k is None or isinstance(k, (int, float)):
            return one(one(k))
        raise TypeError(f"keys must be str, int, float, bool or None, not {type(k).__name__}")

    def value(v: Any) -> str:
        if isinstance(v, list) and v:
            return "[\n " + ",\n ".join(map(one, v)) + "\n]"
        return one(v)
    if not isinstance(obj, dict):
        return one(obj).encode()
    return ("{\n" + ",\n".join(f"{key(k)}: {value(v)}" for k, v in obj.items()) + "\n}").encode()


def write_json(path: Path, obj: Any) -> int:
    return atomic_write(path, [json_bytes(obj)])
