"""The first sampled step's executor built before that step (``hooks.prewarm``): the session runs
that sampled step's exact signature (every hook's fetches and feeds) with an out-of-range
``inter_op_thread_pool`` on a thread of its own, which builds the executor and executes nothing:
the training, its input and every recorded value stay as without it."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import inspector  # noqa: E402
from hooks import DumpHook, prewarm  # noqa: E402
from tfmodels import build_cnn  # noqa: E402

v1 = tf.compat.v1
STEPS, EVERY = 7, 3


def _names(fetches) -> frozenset[str]:
    """The names a session.run of ``fetches`` asks for (tensors ':k', ops bare): its signature."""
    if isinstance(fetches, dict):
        return frozenset().union(*map(_names, fetches.values())) if fetches else frozenset()
    if isinstance(fetches, (list, tuple)):
        return frozenset().union(*map(_names, fetches)) if fetches else frozenset()
    if isinstance(fetches, (tf.Tensor, tf.Operation)):
        return frozenset([fetches.name])
    return frozenset([fetches]) if isinstance(fetches, str) else frozenset()


class RecordingSession(v1.Session):
    """Each run's (fetched names, fed names, inter-op pool, fetches)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.runs: list[tuple[frozenset, frozenset, int, object]] = []

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        feeds = frozenset(getattr(k, "name", k) for k in (feed_dict or {}))
        pool = options.inter_op_thread_pool if options is not None else 0
        self.runs.append((_names(fetches), feeds, pool, fetches))
        return super().run(fetches, feed_dict=feed_dict, options=options, run_metadata=run_metadata)


class Creator(v1.train.SessionCreator):
    def __init__(self):
        self.session: RecordingSession | None = None

    def create_session(self):
        self.session = RecordingSession(graph=v1.get_default_graph())
        self.session.run([v1.global_variables_initializer(), v1.local_variables_initializer()])
        return self.session


def _train(path, warm: bool, monkeypatch, dump_every: int = 0) -> tuple[Creator, DumpHook, dict]:
    """STEPS steps with statistics every EVERY steps; the user's fetches take one element of a
    dataset per run (an input a prewarm that executed would consume)."""
    monkeypatch.setattr(prewarm, "ENABLED", warm)
    creator = Creator()
    with tf.Graph().as_default():
        m = build_cnn()
        next_id = v1.data.make_one_shot_iterator(tf.data.Dataset.range(100)).get_next()
        hook = DumpHook(path, loss=m.loss, labels=m.y, stats_every_n_steps=EVERY,
                        dump_every_n_steps=dump_every, strict=True)
        ids = []
        with v1.train.MonitoredSession(session_creator=creator, hooks=[hook]) as sess:
            for step in range(1, STEPS + 1):
                ids.append(int(sess.run([m.train_op, next_id], m.feed(step))[1]))
                if step == 2 and warm:
                    hook._prewarm.join()   # built before the sampled step, deterministically
            state = sess.run_step_fn(lambda step_context: step_context.session.run(
                {"vars": {v.op.name: v for v in v1.trainable_variables()}, "step": m.global_step}))
    return creator, hook, {**state, "ids": ids}


def test_the_prewarm_builds_the_first_sampled_steps_exact_signature(tmp_path, monkeypatch):
    creator, hook, _ = _train(tmp_path / "run", True, monkeypatch)
    runs = creator.session.runs
    training = [i for i, r in enumerate(runs) if r[2] == 0 and isinstance(r[3], dict) and "caller" in r[3]]
    sampled = [i for i in training if "stats" in runs[i][3].get(hook, {})]
    assert len(training) == STEPS and len(sampled) == STEPS // EVERY
    first = sampled[0]
    built = [i for i, r in enumerate(runs) if r[2] == prewarm.BAD_POOL]
    # the probe (one constant) and the sampled step's run, after the second training run
    assert len(built) == 2 and training[1] < built[0] < built[1] < first
    assert len(runs[built[0]][0]) == 1 and runs[built[0]][3].op.type == "Const"
    assert (runs[built[1]][0], runs[built[1]][1]) == (runs[first][0], runs[first][1])
    # ... which differs from the plain runs' (else it would build nothing new)
    assert runs[training[0]][0] != runs[first][0]


def test_the_next_dump_step_is_built_too(tmp_path, monkeypatch):
    creator, hook, _ = _train(tmp_path / "run", True, monkeypatch, dump_every=2 * EVERY)
    runs = creator.session.runs
    ours = [r[3][hook] for r in runs if r[2] == 0 and isinstance(r[3], dict) and hook in r[3]]
    signature = {kind: next(r[:2] for r in runs if r[2] == 0 and isinstance(r[3], dict)
                            and all(k in r[3].get(hook, {}) for k in kind))
                 for kind in (("stats",), ("stats", "dump"))}
    assert len(ours) == STEPS // EVERY   # steps 3 (statistics) and 6 (and a dump)
    built = {r[:2] for r in runs if r[2] == prewarm.BAD_POOL and isinstance(r[3], dict)}
    assert built == set(signature.values()) and len(built) == 2


def test_the_prewarm_changes_neither_the_training_nor_the_recorded_values(tmp_path, monkeypatch):
    _, _, warm = _train(tmp_path / "warm", True, monkeypatch)
    _, _, cold = _train(tmp_path / "cold", False, monkeypatch)
    assert warm["ids"] == cold["ids"] == list(range(STEPS))   # no input consumed by the prewarm
    assert warm["step"] == cold["step"] == STEPS
    assert warm["vars"].keys() == cold["vars"].keys()
    for name, value in warm["vars"].items():
        np.testing.assert_array_equal(value, cold["vars"][name])
    a, b = (inspector.open_run(tmp_path / d).query_stats() for d in ("warm", "cold"))
    assert sorted(a["step"].unique()) == [EVERY, 2 * EVERY]
    keys = ["tensor", "kind", "group", "step"]
    cols = keys + ["count", "mean", "std", "min", "max", "l2"]
    a, b = (f.sort_values(keys)[cols].reset_index(drop=True) for f in (a, b))
    assert a.equals(b)


def test_a_run_refused_for_its_pool_executes_nothing():
    with tf.Graph().as_default():
        v = v1.get_variable("v", initializer=1.0, use_resource=True)
        double = v.assign(v * 2.0)
        with v1.Session() as sess:
            sess.run(v.initializer)
            assert prewarm.supported(sess)
            assert prewarm.build_only(sess, double)
            assert sess.run(v) == 1.0
            assert sess.run(double) == 2.0   # the same signature runs normally afterwards
    assert not prewarm.supported(object())   # a wrapped session: not tried


@pytest.mark.skipif(not hasattr(getattr(tf, "estimator", None), "Estimator"),
                    reason="this TensorFlow has no tf.estimator (2.16+)")
def test_under_an_estimator_the_pre_built_signature_is_the_first_sampled_steps(tmp_path, monkeypatch):
    """Estimator's own hooks (step counter, logging, summaries) fetch more on their first run
    than on later ones: the signature comes from the second run, which the sampled steps repeat."""
    runs = []
    run = v1.Session.run

    def recording(self, fetches, feed_dict=None, options=None, run_metadata=None):
        runs.append((_names(fetches), options.inter_op_thread_pool if options is not None else 0, fetches))
        return run(self, fetches, feed_dict=feed_dict, options=options, run_metadata=run_metadata)

    monkeypatch.setattr(v1.Session, "run", recording)

    def model_fn(features, labels, mode):
        logits = v1.layers.dense(v1.layers.dense(features, 8, activation=tf.nn.relu), 2)
        loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
        train = v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)

    def input_fn():
        x = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
        return tf.data.Dataset.from_tensor_slices((x, (x[:, 0] > 0).astype(np.int32))).repeat().batch(8)

    config = tf.estimator.RunConfig(log_step_count_steps=EVERY, save_summary_steps=EVERY)
    est = tf.estimator.Estimator(model_fn, model_dir=str(tmp_path / "model"), config=config)
    hook = DumpHook(tmp_path / "run", stats_every_n_steps=EVERY, dump_every_n_steps=0)
    est.train(input_fn, steps=STEPS, hooks=[hook])
    sampled = [r[0] for r in runs if r[1] == 0 and isinstance(r[2], dict) and "stats" in r[2].get(hook, {})]
    # this hook's pre-builds only: Session.run is patched for the whole process, where a thread
    # of an earlier test's hook may still be building its own session's runs
    built = [r[0] for r in runs if r[1] == prewarm.BAD_POOL and isinstance(r[2], dict) and hook in r[2]]
    assert len(sampled) == STEPS // EVERY and built == [sampled[0]]
    # the first training run's signature holds a summary the sampled steps do not fetch
    first = next(r[0] for r in runs if r[1] == 0 and isinstance(r[2], dict) and "caller" in r[2])
    assert first - sampled[0]
