"""Where each captured op was created in the user's code: the catalog's ``source_*`` fields.

An op's creation traceback (``Operation.traceback``: TensorFlow's frames, outermost first) runs
through the user's script, the model code, Keras and TensorFlow. Kept: the frames after the last
frame of this ``hooks`` package (ops the hook's own code caused to be built, such as a Keras
layer called by the probe trace, count only from there on), that are not library code (the
standard library, ``site-packages``/``dist-packages``, ``inspector``, ``hooks``, ``<frozen ...>``).
The innermost kept frame is the op's source; the last ``MAX_STACK`` kept frames its stack.

Paths are stored relative to the training process's working directory when the file lies
under it (``examples/models.py``), else as Python gave them (absolute). Nothing reads them.

Example::

    op_source(g.get_operation_by_name("conv1/Relu"))
    # {"source_file": "examples/models.py", "source_line": 57, "source_function": "conv_block",
    #  "source_stack": [["examples/train.py", 12, "main"],
    #                   ["examples/models.py", 57, "conv_block"]]}
"""
from __future__ import annotations

import os
import sysconfig
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Sequence

import tensorflow as tf

#: user frames kept in ``source_stack`` (innermost last)
MAX_STACK = 4
_HOOKS = str(Path(__file__).resolve().parents[1]) + os.sep
_INSPECTOR = str(Path(__file__).resolve().parents[2] / "inspector") + os.sep
_NONE: dict = {"source_file": None, "source_line": None, "source_function": None,
               "source_stack": None}


@lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k)}
    out = {str(Path(d).resolve()) + os.sep for d in dirs}
    return tuple(sorted(out | {_HOOKS, _INSPECTOR}))


@lru_cache(maxsize=4096)
def is_library(filename: str) -> bool:
    """True for frames that are not the user's code (see the module docstring).

    >>> is_library("/usr/lib/python3/dist-packages/tensorflow/python/ops/nn_ops.py")
    True
    >>> is_library("train.py")
    False
    """
    if filename.startswith("<frozen") or filename.startswith("<__array_function__"):
        return True
    parts = set(Path(filename).parts)
    if "site-packages" in parts or "dist-packages" in parts:
        return True
    real = str(Path(filename).resolve()) if os.path.isabs(filename) else filename
    return real.startswith(_library_dirs())


@lru_cache(maxsize=4096)
def _in_hooks(filename: str) -> bool:
    return os.path.isabs(filename) and str(Path(filename).resolve()).startswith(_HOOKS)


def shown_path(filename: str, cwd: str) -> str:
    """``filename`` relative to ``cwd`` when it lies under it, else unchanged.

    >>> shown_path("/home/u/proj/models.py", "/home/u/proj")
    'models.py'
    >>> shown_path("/opt/x.py", "/home/u/proj")
    '/opt/x.py'
    """
    if not os.path.isabs(filename):
        return filename
    try:
        rel = os.path.relpath(filename, cwd)
    except ValueError:  # another drive (Windows)
        return filename
    return filename if rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel


def user_frames(frames: Sequence) -> list[tuple[str, int, str]]:
    """(file, line, function) of the user's frames in ``frames`` (outermost first): those after
    the last frame of ``hooks``, library frames left out."""
    start = 0
    for i, f in enumerate(frames):
        if _in_hooks(f.filename):
            start = i + 1
    return [(f.filename, int(f.lineno), str(f.name)) for f in frames[start:]
            if not is_library(f.filename)]


def op_source(op: tf.Operation, cwd: str | None = None) -> dict:
    """The catalog's ``source_file``, ``source_line``, ``source_function``, ``source_stack`` of
    ``op`` (all None when no user frame created it)."""
    try:
        frames = list(op.traceback)
    except Exception:  # an op without a traceback (imported from a GraphDef): unknown, not an error
        return dict(_NONE)
    mine = user_frames(frames)
    if not mine:
        return dict(_NONE)
    cwd = os.getcwd() if cwd is None else cwd
    stack = [[shown_path(f, cwd), line, name] for f, line, name in mine[-MAX_STACK:]]
    file, line, name = stack[-1]
    return {"source_file": file, "source_line": line, "source_function": name,
            "source_stack": stack}


def annotate(captured: Iterable, graph: tf.Graph) -> None:
    """Fill the ``source_*`` catalog fields of each Captured (a variable record: of the op that
    created its variable, its ``handle_op``)."""
    cwd = os.getcwd()
    for cap in captured:
        op = cap.tensor.op
        handle = getattr(cap, "handle_op", "")
        if handle:
            try:
                op = graph.get_operation_by_name(handle)
            except (KeyError, ValueError):
                pass
        cap.extra.update(op_source(op, cwd))
