"""Where a run directory lives: local disk, or an object store through fsspec.

Writer, lock and reader go through one :class:`Storage`, addressed by names relative to the
run directory. The backends are private modules behind this interface: ``_local``
(:class:`LocalStorage`) and ``_fsspec`` (:class:`FsspecStorage`); ``_base`` holds the
interface, ``_open`` picks the backend. Beside them: ``atomic`` (atomic writes), ``safety``
(hostile-file checks), ``spill`` (statistics parts waiting on local disk for a store).

Example::

    store = open_storage("s3://bucket/runs/exp1", storage_options={"anon": False})
    store.write("manifest.chief.s0001.json", [b"{}"])
    store.read("manifest.chief.s0001.json", limit=1 << 20)
    open_storage("runs/exp1").is_local     # True
"""
from inspector.storage._base import (Entry, Version, is_url, local_path, normalize, OPTIONS_ENV,
                                     env_storage_options, TIMEOUT_ENV, DEFAULT_TIMEOUT,
                                     REQUEST_ATTEMPTS, storage_timeout, Storage, Ranged)
from inspector.storage._local import (LocalStorage)
from inspector.storage._fsspec import (PART_SIZE, check_relative, FsspecStorage)
from inspector.storage._open import (open_storage)

__all__ = ["Entry", "Version", "is_url", "local_path", "normalize", "OPTIONS_ENV",
           "env_storage_options", "TIMEOUT_ENV", "DEFAULT_TIMEOUT", "REQUEST_ATTEMPTS",
           "storage_timeout", "Storage", "Ranged", "LocalStorage", "PART_SIZE", "check_relative",
           "FsspecStorage", "open_storage"]
