"""Training-loop integrations (import TensorFlow).

Example::

    from hooks import DumpHook, minimize
    estimator.train(input_fn, hooks=[DumpHook("runs/exp1")], steps=1000)
    # in the model_fn, one backward pass for the optimizer and the hook (optional):
    train_op = minimize(optimizer, loss, global_step=tf.compat.v1.train.get_global_step())
"""
from .dump_hook import DumpHook, mark
from .schedule import Schedule
from .shared_gradients import compute_gradients, minimize

__all__ = ["DumpHook", "mark", "Schedule", "minimize", "compute_gradients"]
