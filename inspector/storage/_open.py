"""open_storage: the backend for a path or URL.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

from inspector.storage._base import Storage, env_storage_options, is_url, local_path
from inspector.storage._fsspec import FsspecStorage
from inspector.storage._local import LocalStorage


def open_storage(path: "str | os.PathLike | Storage",
                 storage_options: Mapping[str, Any] | None = None,
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
            raise ValueError(f"storage_options={dict(storage_options)!r} apply to URLs (s3://, "
                             f"gs://...), not to the local path {os.fspath(path)!r}")
        return LocalStorage(local_path(path))
    if storage_options is None and filesystem is None:
        storage_options = env_storage_options()
    return FsspecStorage(os.fspath(path), storage_options, filesystem, timeout=timeout)
