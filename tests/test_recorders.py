"""The recorders ``import hooks`` installs are explicit and reversible: logged at DEBUG,
opted out by environment variables, undone by ``uninstall()``."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")  # first: the imports below (noqa: E402) need TensorFlow
from hooks.recorders import estimator as estimator_recorder, gradients as gradient_recorder  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _gradients_util():
    from tensorflow.python.ops import gradients_util
    return gradients_util


def test_uninstall_restores_tensorflows_gradient_functions():
    gu = _gradients_util()
    assert gradient_recorder.installed() and gu._GradientsHelper._tf_inspector
    wrapped = gu._GradientsHelper, gu._AggregatedGrads
    try:
        assert gradient_recorder.uninstall()
        assert not gradient_recorder.installed() and not gradient_recorder.uninstall()  # idempotent
        for f in (gu._GradientsHelper, gu._AggregatedGrads):
            assert not getattr(f, "_tf_inspector", False) and f.__module__ == gu.__name__
        assert (gu._GradientsHelper, gu._AggregatedGrads) == tuple(w.__wrapped__ for w in wrapped)
        with tf.Graph().as_default() as g:
            x = tf.constant([1.0, 2.0])
            loss = tf.reduce_sum(tf.square(x, name="sq"), name="loss")
            tf.gradients(loss, x)
            assert gradient_recorder.lookup(g, loss) == {}  # not recorded
    finally:
        assert gradient_recorder.install()
    assert gradient_recorder.installed()


def test_uninstall_restores_the_estimators_method():
    if estimator_recorder._estimator_class() is None:
        pytest.skip("no tf.estimator in this TensorFlow")
    cls = estimator_recorder._estimator_class()
    wrapped = cls._call_model_fn
    assert wrapped._tf_inspector
    try:
        assert estimator_recorder.uninstall() and not estimator_recorder.installed()
        assert cls._call_model_fn is wrapped.__wrapped__ and not hasattr(cls._call_model_fn, "_tf_inspector")
    finally:
        assert estimator_recorder.install()
    assert cls._call_model_fn._tf_inspector


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3", **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ,
                          cwd=ROOT, timeout=300)


CHECK = """
import logging
logging.basicConfig(level=logging.DEBUG, format="LOG %(name)s %(message)s")
import hooks
from tensorflow.python.ops import gradients_util as gu
print("wrapped", getattr(gu._GradientsHelper, "_tf_inspector", False), hooks.recorders.gradients.installed(),
      hooks.recorders.estimator.installed())
"""


def test_env_opt_out_and_debug_log_in_a_fresh_process():
    """One subprocess per setting: the install happens at import, once per interpreter."""
    on = _python(CHECK, TF_INSPECTOR_RECORD_GRADIENTS="1")
    assert on.returncode == 0, on.stderr
    assert "wrapped True True" in on.stdout
    assert on.stderr.count("LOG tf_inspector gradient recorder installed") == 1
    off = _python(CHECK, TF_INSPECTOR_RECORD_GRADIENTS="0", TF_INSPECTOR_RECORD_MODEL_FN="0")
    assert off.returncode == 0, off.stderr
    assert "wrapped False False False" in off.stdout
    assert "gradient recorder not installed: TF_INSPECTOR_RECORD_GRADIENTS=0" in off.stderr
    assert "gradient recorder installed" not in off.stderr and "model_fn recorder installed" not in off.stderr
