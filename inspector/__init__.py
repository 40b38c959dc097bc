"""TF Inspector: read runs written by ``hooks.DumpHook`` without TensorFlow.

Example::

    import inspector
    run = inspector.open_run("runs/exp1")
    run.tensors, run.stats, run.steps
    run.tensor("conv1/Relu:0", step=100, kind="gradient")
"""
from ._moved import INSPECTOR as _MOVED
from ._moved import install as _install_moved
from .errors import (DamagedFileError, FormatVersionError, InspectorError, MemoryBudgetError,
                     NoDumpError, NotARunError, StorageError, UnknownGroupError, UnknownTensorError)
from .format import FORMAT_VERSION
from .format import TOOL_VERSION as __version__
from .run import Run, find_runs, is_run, open_run

_install_moved(_MOVED)   # the modules the layout moved, importable under their old names

__all__ = ["open_run", "find_runs", "is_run", "Run", "InspectorError", "NotARunError",
           "FormatVersionError", "DamagedFileError", "StorageError", "UnknownTensorError",
           "UnknownGroupError", "NoDumpError", "MemoryBudgetError", "FORMAT_VERSION", "__version__"]
