"""Checks that keep hostile files out: regular files only (no FIFO, device or socket), paths that
stay inside a run or the runs folder, and which entries of a folder are run files.

Opening a run's files defensively: regular files inside the run only.

A FIFO named like a run file would block ``open()`` for reading forever, a device may have
side effects when opened, and a symlink may point anywhere on the machine. Every file the
reader opens goes through :func:`check_regular` first (``os.stat`` only: nothing is opened),
and :func:`open_regular` checks the opened descriptor again, so a file swapped for a FIFO in
between is refused too (it is opened non-blocking).

Example::

    st = check_regular(run_dir / "manifest.chief.json", root=run_dir)
    with open_regular(run_dir / "graph.chief.pb", root=run_dir) as f:
        data = f.read()

Path checks for hostile folders, shared by the CLI and the viewer (standard library only).

A run folder may come from someone else: a file named like a manifest may be a FIFO (opening
it blocks forever), a symlink may lead out of the folder the viewer serves. These helpers
look with ``lstat``/``stat`` and never open a file.

Example::

    inside("/srv/runs/exp1", "/srv/runs")                    # True (symlinks resolved)
    special_entries(Path("runs/exp1"))                       # [] or the names a reader must
                                                             # not open
"""
from __future__ import annotations

import io
import os
import stat
from pathlib import Path

from inspector.errors import DamagedFileError
from inspector.storage.atomic import safe_join

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISDIR, "a directory"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), f"mode {oct(stat.S_IFMT(mode))}")


#: realpath of directories by (path, st_dev, st_ino): a directory has one location, so while
#: the path leads to the same inode its realpath is the same (a folder swapped for a link
#: leads to another inode: looked up again). Saves resolving every component of the run's
#: path for each of 100,000 dumps.
_REAL_DIRS: dict[tuple[str, int, int], str] = {}


def _real_dir(path: str) -> str:
    st = os.stat(path)
    key = (path, st.st_dev, st.st_ino)
    real = _REAL_DIRS.get(key)
    if real is None:
        if len(_REAL_DIRS) > 1024:
            _REAL_DIRS.clear()
        real = _REAL_DIRS[key] = os.path.realpath(path)
    return real


def _inside_fast(path: Path, root: Path) -> bool:
    """True when ``path`` is provably inside ``root``: not a link itself, in a folder whose
    realpath is under root's. False means "resolve it in full" (a link, a missing file)."""
    parent, name = os.path.split(os.path.abspath(path))
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            return False
        real_root, real = _real_dir(os.path.abspath(root)), os.path.join(_real_dir(parent), name)
    except OSError:
        return False
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


def check_inside(path: Path, root: Path) -> None:
    """DamagedFileError if ``path`` (symlinks resolved) lies outside the directory ``root``."""
    if _inside_fast(path, root):
        return
    try:
        safe_join(Path(root), os.path.relpath(os.path.abspath(path), os.path.abspath(root)))
    except (ValueError, OSError, RuntimeError) as e:  # RuntimeError: a symlink loop (Python < 3.13)
        raise DamagedFileError(f"{path}: refused, a link that leads outside the run directory "
                               f"{root} ({e})") from None


def check_regular(path: str | Path, root: str | Path | None = None) -> os.stat_result:
    """The ``os.stat`` of ``path`` if it is a regular file (inside ``root`` when given), else
    DamagedFileError naming it. Never opens the file."""
    path = Path(path)
    if root is not None:
        check_inside(path, Path(root))
    try:
        st = os.stat(path)
    except OSError as e:
        raise DamagedFileError(f"{path}: cannot be read ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        raise DamagedFileError(f"{path}: not a regular file ({_kind(st.st_mode)}); refused without "
                               "opening it")
    return st


def open_regular(path: str | Path, root: str | Path | None = None) -> io.FileIO:
    """``path`` opened for reading (unbuffered binary) after :func:`check_regular`; the opened
    descriptor is checked again, so a file replaced by a FIFO meanwhile is refused too."""
    check_regular(path, root)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise DamagedFileError(f"{path}: cannot be read ({e.strerror or e})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise DamagedFileError(f"{path}: not a regular file ({_kind(mode)}); refused")
    return io.FileIO(fd, "rb", closefd=True)


def read_bytes(path: str | Path, root: str | Path | None = None, limit: int | None = None) -> bytes:
    """The whole content of the regular file ``path``; DamagedFileError if it holds more than
    ``limit`` bytes (checked before reading) or changes size while read."""
    with open_regular(path, root) as f:
        size = os.fstat(f.fileno()).st_size
        if limit is not None and size > limit:
            raise DamagedFileError(f"{path}: {size:,} bytes, more than the {limit:,} a file of "
                                   "this kind may hold")
        data = bytearray()
        while len(data) <= size:  # one byte more than expected: tells a file that grew meanwhile
            chunk = f.read(size + 1 - len(data))
            if not chunk:
                break
            data += chunk
    if len(data) != size:
        raise DamagedFileError(f"{path}: changed size while it was read ({size:,} then "
                               f"{len(data):,} bytes)")
    return bytes(data)


#: (sub-folder, name parser) of the files a reader opens (every format version's names).


def is_regular_file(path: str | Path, follow: bool = True) -> bool:
    """True if ``path`` is a regular file (after following symlinks unless ``follow`` is false);
    False for FIFOs, sockets, devices, folders and missing paths. Never opens ``path``."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(st.st_mode)


def real(path: str | Path) -> Path:
    """``path`` absolute with every symlink resolved (as far as it exists)."""
    return Path(os.path.realpath(path))


def inside(path: str | Path, root: str | Path) -> bool:
    """True if ``path``, symlinks resolved, is ``root`` (resolved) or lies below it."""
    p, r = real(path), real(root)
    return p == r or r in p.parents
