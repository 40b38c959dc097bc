"""The fused statistics kernel (``stats_ops.cc``): built once per machine and TF version, then
loaded.

``python -m hooks.native build`` compiles ``stats_ops.cc`` against the installed TensorFlow's
headers ahead of time (CI and Docker image builds run it); the shared object is
cached under ``$TF_INSPECTOR_CACHE``, else ``$XDG_CACHE_HOME/tf-inspector``, else
``~/.cache/tf-inspector``. ``library()`` loads that build, compiling it first if it is
missing (the lazy fallback, in the first hook's ``begin()``), and returns the loaded
op module, or ``None`` when there is no C++ compiler, the build fails, the cache is not
private, or ``TF_INSPECTOR_NATIVE=0``. The cache folder is created 0700; a cache folder or
shared object that another user owns, or that group or others may write, is never loaded
(anyone who can replace it runs code in the training process). ``None`` is never an error:
``hooks.stats.fast`` then builds the same statistics from stock TensorFlow ops, only slower,
and logs why once.

Example::

    from hooks import native
    lib = native.library()          # None -> stock-op statistics
    if lib is not None:
        # [4, 8], [5], [N], [N]: all, 2 groups, none
        stats, splits, index, count = lib.inspector_log_stats(
            [x], groups, batched=[True], base=[0], leaves=4, max_elements=16384, block=64)
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import tensorflow as tf

log = logging.getLogger("tf_inspector")
SOURCE = Path(__file__).with_name("stats_ops.cc")
#: -fopenmp-simd: vectorise the reductions' `omp simd` loops without the OpenMP runtime.
#: -Wall: the kernel's own warnings go to the log (TensorFlow's headers are -isystem: theirs
#: are not ours to fix and would bury them). -Wno-deprecated-declarations: TF 2.16+ deprecates
#: errors::InvalidArgument, which TF 2.15 (the default environment) still needs; its 60 lines
#: of notes hid any real warning. -ffp-contract=off: no fused multiply-add, so the finished
#: statistics (finish=True) round as hooks/stats/fast.py's _finish does, on every machine.
CXXFLAGS = ["-O3", "-fopenmp-simd", "-shared", "-fPIC", "-Wall", "-Wno-deprecated-declarations",
            "-ffp-contract=off"]
BUILD_TIMEOUT_S = 600


def cache_dir() -> Path:
    env = os.environ.get("TF_INSPECTOR_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tf-inspector"


class UnsafeCacheError(RuntimeError):
    """A cache folder or file that someone else could have written."""


def _why_unsafe(st: os.stat_result, kind: str) -> str | None:
    if not (stat.S_ISDIR(st.st_mode) if kind == "folder" else stat.S_ISREG(st.st_mode)):
        return "is not a directory" if kind == "folder" else "is not a regular file"
    if st.st_uid != os.getuid():
        return f"is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    if st.st_mode & 0o022:
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def check_private(path: Path, kind: str) -> None:
    """UnsafeCacheError unless ``path`` (links followed) is a ``kind`` ('folder' or 'file')
    owned by this user and not writable by group or others."""
    why = _why_unsafe(os.stat(path), kind)
    if why:
        raise UnsafeCacheError(f"the kernel cache {kind} {path} {why}; not loading from it (chmod "
                               f"go-w / chown it, or set TF_INSPECTOR_CACHE to a private folder)")


def private_cache_dir() -> Path:
    """:func:`cache_dir`, created with mode 0700 if missing, checked by :func:`check_private`."""
    d = cache_dir()
    d.parent.mkdir(parents=True, exist_ok=True)
    try:
        d.mkdir(mode=0o700)
    except FileExistsError:
        pass
    check_private(d, "folder")
    return d


def _compiler() -> str | None:
    found = (shutil.which(name)
             for name in (os.environ.get("CXX"), "g++", "c++", "clang++") if name)
    return next((path for path in found if path), None)


def _command(cxx: str, out: Path) -> list[str]:
    include = [f"-isystem{f[2:]}" if f.startswith("-I") else f
               for f in tf.sysconfig.get_compile_flags()]
    return [cxx, *CXXFLAGS, *include, str(SOURCE), "-o", str(out), *tf.sysconfig.get_link_flags()]


def shared_object_path(cxx: str) -> Path:
    """Where the build for this source, compiler, flags and TensorFlow lives."""
    key = hashlib.sha256()
    key.update(SOURCE.read_bytes())
    key.update(" ".join(_command(cxx, Path("x"))).encode())
    key.update(tf.__version__.encode())
    return cache_dir() / f"stats_ops-tf{tf.__version__}-{key.hexdigest()[:16]}.so"


def build(cxx: str) -> Path:
    """Compile into the private cache (atomically: concurrent builders each rename a whole
    file); a cached build is reused only if :func:`check_private` accepts it."""
    private_cache_dir()
    target = shared_object_path(cxx)
    if os.path.lexists(target):
        check_private(target, "file")
        return target
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    log.info("building the fused statistics kernels (once per machine and TF version, ~15 s; "
             "`python -m hooks.native build` does it ahead of time) into %s", target)
    try:
        proc = subprocess.run(_command(cxx, Path(tmp)), capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S)
        if proc.returncode != 0:
            raise RuntimeError(f"{cxx} exited with {proc.returncode}: "
                               f"{proc.stderr.strip()[-2000:]}")
        if proc.stderr.strip():  # built, with warnings: shown, not hidden
            log.warning("compiler output while building %s:\n%s", SOURCE.name,
                        proc.stderr.strip()[-4000:])
        os.chmod(tmp, 0o700)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def compiler() -> str:
    """The C++ compiler to build with ($CXX, g++, c++, clang++); RuntimeError when none is found."""
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (set CXX or install g++)")
    return cxx


def used(wanted: bool) -> bool:
    """Whether the fused kernel computes the statistics: ``wanted`` (``native_stats=``) and loaded
    (built first if it is not; not even looked for when it is not wanted)."""
    return bool(wanted and library() is not None)


@functools.lru_cache(maxsize=None)
def library() -> Any | None:
    """The loaded op module, or None (and one log line saying why) when it cannot be had."""
    if os.environ.get("TF_INSPECTOR_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    cxx = _compiler()
    if cxx is None:
        log.warning("no C++ compiler found (set CXX or install g++); statistics use stock "
                    "TensorFlow ops, several times slower")
        return None
    try:
        return tf.load_op_library(str(build(cxx)))
    except Exception as e:  # noqa: BLE001 - any failure means: use the stock-op statistics
        log.warning("the fused statistics kernels are unavailable (%s: %s); statistics use stock "
                    "TensorFlow ops, several times slower", type(e).__name__, e)
        return None
