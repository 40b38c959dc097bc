"""The viewer's one runs folder: what it may list and open (no Streamlit here).

The viewer is started on one folder (the *root*). A path typed in the sidebar, a run listed
in a folder and a file a run holds are accepted only if they lie inside the root with every
symlink resolved; the refusal reads the same whether the outside path exists or not.

Example::

    root = real("runs")
    folder = resolve_inside(root, "exp1")        # InspectorError if outside root
    runs, outside = list_runs(folder, root)
"""
from __future__ import annotations

import os
from pathlib import Path

from inspector.errors import InspectorError, NotARunError
from inspector.run import find_runs
from inspector.format import has_manifest, special_entries
from inspector.storage.safety import inside, real
from inspector.storage import check_relative, is_url


class OutsideRootError(InspectorError):
    """A path that leads outside the viewer's runs folder."""


def resolve_inside(root: Path | str, text: str) -> Path | str:
    """``text`` (empty: the root; relative: to the root; or absolute) resolved, if it lies in
    ``root``; else OutsideRootError, with the same message whether the path exists or not.
    A URL root (a bucket's folder of runs) takes relative names only, without '.' or '..'."""
    text = (text or "").strip()
    if isinstance(root, str) and is_url(root):
        return _url_inside(root, text)
    path = root / text if text else root
    if "\x00" in text or not inside(path, root):
        raise OutsideRootError(f"{text!r} is outside the runs folder {root}; the viewer only opens "
                               f"runs inside it. Give a path relative to that folder.")
    return real(path)


def _url_inside(root: str, text: str) -> str:
    """``root/text`` for a relative ``text`` whose every part is a plain name, else
    OutsideRootError."""
    rel = text.strip("/")
    if text.startswith(root.rstrip("/") + "/") or text == root:
        rel = text[len(root.rstrip("/")):].strip("/")
    try:
        return f"{root.rstrip('/')}/{check_relative(rel)}" if rel else root
    except ValueError:
        raise OutsideRootError(f"{text!r} is outside the runs folder {root}; the viewer only opens "
                               f"runs inside it. Give a path relative to that folder.") from None


def list_runs(folder: Path | str, root: Path | str) -> tuple[list, int]:
    """(runs, links skipped): ``folder`` itself if it is a run, else the runs directly inside
    it. Entries leading outside ``root`` are skipped (and counted), never looked into; a run
    needs a manifest that is a regular file (a FIFO is never opened). In an object store
    (a URL folder) there are no links or special files: the runs under it, as URLs."""
    if isinstance(folder, str) and is_url(folder):
        return find_runs(folder), 0
    folder, root = Path(folder), Path(root)
    if not folder.exists():
        raise NotARunError(f"{folder} does not exist; give a run or a folder of runs inside the "
                           "runs folder")
    if not folder.is_dir():
        raise NotARunError(f"{folder} is not a folder; give a run or a folder of runs")
    if has_manifest(folder):
        return [folder], 0
    runs, outside = [], 0
    try:
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as e:
        raise NotARunError(f"cannot list {folder}: {e.strerror}") from None
    for e in entries:
        if not inside(e.path, root):
            outside += 1
        elif e.is_dir() and has_manifest(e.path):
            runs.append(Path(e.path))
    return runs, outside


def check_run(path: str | Path, root: Path | None) -> None:
    """InspectorError unless every file the reader would open in the run at ``path`` is a
    regular file inside ``root`` (FIFOs block the reader forever; links may leave the root).
    A URL run must lie under a URL ``root`` (object stores hold no links or special files)."""
    if isinstance(path, str) and is_url(path):
        if root is not None and _url_inside(str(root), path) != path:
            raise OutsideRootError(f"run {path!r} is outside the runs folder {root}")
        return
    if root is not None and not inside(path, root):
        raise OutsideRootError(f"run {Path(path).name!r} is outside the runs folder {root}")
    bad = special_entries(path, root)
    if bad:
        raise InspectorError(f"refused to read run {Path(path).name!r}: {'; '.join(bad)}")
