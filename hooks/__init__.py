"""Training-loop integrations (import TensorFlow; ``hooks.schedule`` alone does not).

Importing this package installs three recorders, each wrapping private TensorFlow functions
to record names and changing nothing else (docs/ARCHITECTURE.md lists them): the gradients
of every ``tf.gradients`` built afterwards (``hooks.recorders.gradients``), so ``DumpHook``
reuses the optimizer's backward pass and knows which loss it minimizes; the loss and scale
behind a TF1 loss-scale optimizer's scaled loss (``hooks.recorders.loss_scale``), so that pass is
unscaled; and, with ``tf.estimator``, the labels and loss of every ``model_fn`` call
(``hooks.recorders.estimator``), so ``DumpHook`` needs no tensor names. Each logs its install
at DEBUG; ``TF_INSPECTOR_RECORD_GRADIENTS=0`` / ``TF_INSPECTOR_RECORD_MODEL_FN=0`` opt out,
``hooks.recorders.gradients.uninstall()`` / ``hooks.recorders.estimator.uninstall()`` undo them.

Example::

    from hooks import DumpHook, minimize              # before the model is built
    estimator.train(input_fn, hooks=[DumpHook("runs/exp1")], steps=1000)
    # a model built before the import: share the backward pass explicitly in the model_fn
    train_op = minimize(optimizer, loss, global_step=tf.compat.v1.train.get_global_step())
"""
# pure Python: `import hooks.schedule` / `hooks.options` work without TensorFlow
from inspector._moved import install as _install_moved

from .options import CaptureOptions
from .schedule import Schedule

__all__ = ["DumpHook", "mark", "CaptureOptions", "Schedule", "minimize", "compute_gradients"]

try:
    import tensorflow  # noqa: F401
except ModuleNotFoundError as e:
    if e.name != "tensorflow":   # TensorFlow present but broken: say so, as it is
        raise
    _NO_TF = e
else:
    from hooks.recorders import estimator as estimator_recorder
    from hooks.recorders import gradients as gradient_recorder
    from hooks.recorders import loss_scale
    from hooks.recorders.shared_gradients import compute_gradients, minimize

    from .dump_hook import DumpHook, mark

    gradient_recorder.install()
    loss_scale.install()
    estimator_recorder.install()


def __getattr__(name: str):
    """Without TensorFlow only ``Schedule`` and ``CaptureOptions`` exist: the rest says why."""
    if name in __all__ and "_NO_TF" in globals():
        raise ImportError(f"hooks.{name} needs TensorFlow, which is not installed: pip install "
                          "'tf-inspector[tf]' (hooks.schedule and hooks.options work without "
                          "it)") from _NO_TF
    raise AttributeError(f"module 'hooks' has no attribute {name!r}")


#: old module -> where it lives now: the old names stay importable (inspector/_moved.py)
MOVED = {
    "hooks.groups":             "hooks.capture.groups",
    "hooks.keras_trace":        "hooks.keras.trace",
    "hooks.keras_step":         "hooks.keras.step",
    "hooks.keras_source":       "hooks.keras.source",
    "hooks.keras_icnn":         "hooks.keras.icnn",
    "hooks.gradient_recorder":  "hooks.recorders.gradients",
    "hooks.estimator_recorder": "hooks.recorders.estimator",
    "hooks.loss_scale":         "hooks.recorders.loss_scale",
    "hooks.method_patch":       "hooks.recorders.patching",
    "hooks.shared_gradients":   "hooks.recorders.shared_gradients",
    "hooks.structure":          "hooks.capture.feeds",
    "hooks.sources":            "hooks.capture.source_lines",
    "hooks.batch_axis":         "hooks.capture.batch_axis",
    "hooks.towers":             "hooks.capture.towers",
    "hooks.resolve":            "hooks.recorders.loss_and_labels",
    "hooks.fast_stats":         "hooks.stats.fast",
    "hooks.exact_stats":        "hooks.stats.exact",
}
_install_moved(MOVED)
