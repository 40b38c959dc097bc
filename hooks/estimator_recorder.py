"""Record what an Estimator's ``model_fn`` received and returned: its labels and its loss.

``import hooks`` wraps ``Estimator._call_model_fn`` (tf.estimator, TensorFlow <= 2.15) to
remember, per graph, the ``labels`` the model_fn was called with and the ``loss`` of the
``EstimatorSpec`` it returned. ``DumpHook`` then needs no tensor names for canned
estimators, ``model_to_estimator`` or a custom model_fn. The wrapper records names only
and swallows its own errors: the Estimator behaves exactly as before. Where
``tf.estimator`` does not exist (TensorFlow 2.16+) nothing is installed.

Example::

    import hooks                                        # before estimator.train
    call = estimator_recorder.lookup(tf.compat.v1.get_default_graph())
    call.labels, call.loss                              # tensor names (or None)
"""
from __future__ import annotations

import functools
import importlib.util
import threading
import weakref
from dataclasses import dataclass

import tensorflow as tf


@dataclass(frozen=True)
class ModelFnCall:
    """Names of what one model_fn call received and returned (None: absent or not a tensor)."""
    mode: str | None = None
    labels: str | None = None
    loss: str | None = None
    labels_note: str | None = None  # why ``labels`` is None although labels were passed


_lock = threading.Lock()
_calls: "weakref.WeakKeyDictionary[tf.Graph, ModelFnCall]" = weakref.WeakKeyDictionary()


def install() -> bool:
    """Wrap ``Estimator._call_model_fn`` once; False where tf.estimator is absent."""
    if importlib.util.find_spec("tensorflow_estimator") is None:
        return False
    try:
        from tensorflow_estimator.python.estimator import estimator as est
    except Exception:  # noqa: BLE001 - a broken estimator install means "no estimator"
        return False
    call = getattr(est.Estimator, "_call_model_fn", None)
    if call is None:
        return False
    if not getattr(call, "_tf_inspector", False):
        est.Estimator._call_model_fn = _wrap(call)
    return True


def _wrap(call_model_fn):
    @functools.wraps(call_model_fn)
    def wrapper(self, features, labels, mode, config, *args, **kwargs):
        spec = call_model_fn(self, features, labels, mode, config, *args, **kwargs)
        try:
            _record(labels, mode, spec)
        except Exception:  # noqa: BLE001 - recording must never break the Estimator
            pass
        return spec
    wrapper._tf_inspector = True
    return wrapper


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
                        loss=loss.name if isinstance(loss, tf.Tensor) else None, labels_note=note)
    with _lock:
        _calls[graph] = entry  # the graph's latest call: the one its session will run


def lookup(graph: tf.Graph) -> ModelFnCall | None:
    """The latest model_fn call recorded in ``graph``, or None (no Estimator)."""
    with _lock:
        return _calls.get(graph)


install()
