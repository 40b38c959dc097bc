"""Training-loop integrations (import TensorFlow).

Example::

    from hooks import DumpHook, mark
    estimator.train(input_fn, hooks=[DumpHook("runs/exp1")], steps=1000)
"""
from .dump_hook import DumpHook, mark
from .schedule import Schedule

__all__ = ["DumpHook", "mark", "Schedule"]
