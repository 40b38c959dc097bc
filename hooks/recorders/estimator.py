"""Record what an Estimator's ``model_fn`` received and returned: its labels, loss and predictions.

``import hooks`` calls :func:`install`, which wraps ``Estimator._call_model_fn``
(tf.estimator, TensorFlow <= 2.15) to remember, per graph, the ``labels`` the model_fn was
called with and the ``loss`` (and ``predictions``, for ``groups=`` functions) of the
``EstimatorSpec`` it returned. ``DumpHook`` then needs no
tensor names for canned estimators, ``model_to_estimator`` or a custom model_fn. The wrapper
records names only and swallows its own errors: the Estimator behaves exactly as before.
Where ``tf.estimator`` does not exist (TensorFlow 2.16+) nothing is installed. The install
is logged once at DEBUG on ``tf_inspector``; ``TF_INSPECTOR_RECORD_MODEL_FN=0`` (before
``import hooks``) opts out and :func:`uninstall` puts the original method back: ``DumpHook``
then needs ``loss=``/``labels=`` or ``hooks.mark`` where the other rules find none.

Example::

    import hooks                                        # before estimator.train
    call = estimator_recorder.lookup(tf.compat.v1.get_default_graph())
    call.labels, call.loss                              # tensor names (or None)
"""
from __future__ import annotations

import importlib.util
import threading
import weakref
from dataclasses import dataclass

import tensorflow as tf

from hooks.recorders.patching import MethodPatch

#: ``TF_INSPECTOR_RECORD_MODEL_FN=0`` (or false, no, off): :func:`install` wraps nothing.
ENV_VAR = "TF_INSPECTOR_RECORD_MODEL_FN"


@dataclass(frozen=True)
class ModelFnCall:
    """Names of what one model_fn call received and returned (None: absent or not a tensor)."""
    mode: str | None = None
    labels: str | None = None
    loss: str | None = None
    labels_note: str | None = None  # why ``labels`` is None although labels were passed
    #: the EstimatorSpec's predictions: (key, tensor name) pairs; key '' for a single tensor
    predictions: tuple[tuple[str, str], ...] = ()


_lock = threading.Lock()
_calls: "weakref.WeakKeyDictionary[tf.Graph, ModelFnCall]" = weakref.WeakKeyDictionary()


def _estimator_class():
    """``tf.estimator.Estimator``, or None where tf.estimator is absent or broken.

    Private API: ``Estimator._call_model_fn`` is the one place every Estimator (canned,
    ``model_to_estimator``, custom) calls the model_fn with its labels and receives the
    EstimatorSpec; no public callback sees both. Tested with tensorflow-estimator 2.15, its
    last release (TensorFlow 2.21 is tested without an estimator)."""
    if importlib.util.find_spec("tensorflow_estimator") is None:
        return None
    try:
        from tensorflow_estimator.python.estimator import estimator as est
    except Exception:  # noqa: BLE001 - a broken estimator install means "no estimator"
        return None
    return est.Estimator


def install() -> bool:
    """Wrap ``Estimator._call_model_fn`` once (``import hooks`` calls this). False where opted
    out by ``TF_INSPECTOR_RECORD_MODEL_FN=0`` or where tf.estimator is absent."""
    return _patch.install()


def uninstall() -> bool:
    """Put the Estimator's own ``_call_model_fn`` back; True if it had been wrapped."""
    return _patch.uninstall()


def installed() -> bool:
    """Whether Estimator model_fn calls are recorded now."""
    return _patch.installed


def _wrap(call_model_fn):
    def wrapper(self, features, labels, mode, config, *args, **kwargs):
        spec = call_model_fn(self, features, labels, mode, config, *args, **kwargs)
        try:
            _record(labels, mode, spec)
        except Exception:  # noqa: BLE001 - recording must never break the Estimator
            pass
        return spec
    return wrapper


_patch = MethodPatch("model_fn recorder", _estimator_class, {"_call_model_fn": _wrap},
                     env_var=ENV_VAR,
                     detail="Estimator model_fn calls record their labels and loss "
                            f"({ENV_VAR}=0 or hooks.recorders.estimator.uninstall() to opt out)",
                     replaced="something replaced Estimator._call_model_fn after it; leaving it")


def _labels_name(labels) -> tuple[str | None, str | None]:
    """(labels tensor name, why there is no single dense tensor)."""
    if labels is None:
        return None, None
    if isinstance(labels, dict):
        if len(labels) != 1:
            keys = ", ".join(sorted(map(str, labels)))
            return None, f"the model_fn received a dict of {len(labels)} labels ({keys})"
        labels = next(iter(labels.values()))
    if isinstance(labels, tf.Tensor):
        return labels.name, None
    return None, f"the model_fn received labels of type {type(labels).__name__}, not a dense tensor"


def _record(labels, mode, spec) -> None:
    loss = getattr(spec, "loss", None)
    name, note = _labels_name(labels)
    graph = tf.compat.v1.get_default_graph()
    entry = ModelFnCall(mode=str(mode) if mode is not None else None, labels=name,
                        loss=loss.name if isinstance(loss, tf.Tensor) else None, labels_note=note,
                        predictions=_predictions(getattr(spec, "predictions", None)))
    with _lock:
        _calls[graph] = entry  # the graph's latest call: the one its session will run


def _predictions(predictions) -> tuple[tuple[str, str], ...]:
    """(key, tensor name) of the spec's dense prediction tensors; key '' for a single tensor."""
    if isinstance(predictions, tf.Tensor):
        return (("", predictions.name),)
    if isinstance(predictions, dict):
        return tuple((str(k), v.name) for k, v in predictions.items() if isinstance(v, tf.Tensor))
    return ()


def lookup(graph: tf.Graph) -> ModelFnCall | None:
    """The latest model_fn call recorded in ``graph``, or None (no Estimator)."""
    with _lock:
        return _calls.get(graph)
