"""A multi-class ICNN run (conv_mask with filter_class, trained a few steps under DumpHook)
in the Masks & templates page: the class chooser shows exactly that class's filter slice, and
its positives are the samples of that class, checked with numpy against the dumped tensors
and the recorded labels."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")  # first: the imports below (noqa: E402) need TensorFlow
import inspector  # noqa: E402
from hooks import DumpHook  # noqa: E402
from inspector.icnn import layer as icnn  # noqa: E402

from test_app import captions, ok, start  # noqa: E402

v1 = tf.compat.v1
N, HW, C, K = 16, 8, 6, 3                     # batch, map size, filters, ICNN classes (labels 1..3; 0 background)
FILTER_CLASS = [0, 1, 2, 0, 1, 2]             # filter 5 is no part filter (part_filters=5)
STEPS = 4


def _batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(step)
    y = np.tile(np.arange(4), N // 4)
    rng.shuffle(y)
    return rng.normal(size=(N, HW, HW, 1)).astype(np.float32), y.astype(np.int64)


def _train(run_dir, **hook_kw) -> inspector.Run:
    with tf.Graph().as_default():
        v1.set_random_seed(0)
        x = v1.placeholder(tf.float32, [N, HW, HW, 1], name="x")
        y = v1.placeholder(tf.int64, [N], name="y")
        init = v1.glorot_uniform_initializer(seed=1)
        w1 = v1.get_variable("conv/w", [3, 3, 1, C], initializer=init)
        top = tf.nn.relu(tf.nn.conv2d(x, w1, 1, "SAME"), name="conv/relu")
        labels_positive = tf.cast(tf.one_hot(y, 4)[:, 1:], tf.bool)          # class k: label k + 1
        post = icnn.conv_mask(top, labels_positive, step=v1.train.get_or_create_global_step(), steps_per_epoch=2,
                              name="icnn_mask", part_filters=5, filter_class=FILTER_CLASS,
                              class_density=[0.25] * K, monitor=False)
        w2 = v1.get_variable("fc/w", [HW * HW * C, 4], initializer=init)
        logits = tf.matmul(tf.reshape(post, [N, -1]), w2)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        train = v1.train.GradientDescentOptimizer(0.01).minimize(loss, global_step=v1.train.get_global_step())
        hook = DumpHook(run_dir, loss=loss, labels=y, stats_every_n_steps=2, dump_every_n_steps=2,
                        include=[r"^icnn_mask/"], strict=True, **hook_kw)
        with v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:
            for step in range(1, STEPS + 1):
                xb, yb = _batch(step)
                sess.run(train, {x: xb, y: yb})
    return inspector.open_run(run_dir)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("mc")
    _train(root / "per_class", groups="per_class", num_classes=4, samples_per_group=2)
    _train(root / "few", samples_per_group=1)     # positive/negative: one sample of some class, one background
    return root


def test_run_records_the_class_slices_and_the_labels_the_layer_used(runs):
    run = inspector.open_run(runs / "per_class")
    row = run.icnn_layers().set_index("layer").loc["icnn_mask"]
    assert row["class_positive"] == "icnn_mask/class_positive:0"
    cat = run.tensors.loc["icnn_mask/class_positive:0"]
    assert cat["icnn_filter_class"] == [0, 1, 2, 0, 1, -1] and cat["shape"] == [N, K]
    step = run.steps[-1]
    labels = np.asarray(run.samples(step)["label"]).astype(int)
    cp = np.asarray(run.tensor("icnn_mask/class_positive:0", step))
    np.testing.assert_array_equal(cp, labels[:, None] == np.arange(1, K + 1)[None, :])
    assert set(labels) == {0, 1, 2, 3}           # every class kept, so every class has positives


def _table(at):
    return next(df.value for df in at.dataframe if "dead" in df.value.columns)


@pytest.mark.parametrize("k", range(K))
def test_choosing_a_class_shows_its_filter_slice_and_its_positives(runs, k):
    run = inspector.open_run(runs / "per_class")
    step = run.steps[-1]
    at = ok(start(runs / "per_class", "Masks & templates", query={"mt_class": str(k), "mt_step": str(step)},
                  mt_pool=False, mt_table=True))                # the step's samples (pooling every dump step is the default)
    assert at.selectbox(key="mt_class").value == k
    fc = np.asarray(run.tensors.loc["icnn_mask/class_positive:0", "icnn_filter_class"])
    want = np.flatnonzero(fc == k).tolist()
    assert at.selectbox(key="mt_filter").options == [str(f) for f in want]
    table = _table(at)
    assert table["filter"].tolist() == want
    # Positive = samples of class k (label k + 1), negative = every other sample: the spread
    # of mu per filter, recomputed with numpy from the dump.
    mu = np.asarray(run.tensor("icnn_mask/mu:0", step))
    labels = np.asarray(run.samples(step)["label"]).astype(int)
    pre = np.asarray(run.tensor("icnn_mask/pre_mask:0", step))
    for group, rows in (("positive", labels == k + 1), ("negative", labels != k + 1)):
        m = mu[rows][:, want]
        spread = np.linalg.norm(m - m.mean(0), axis=2).mean(0)
        dead = ~(pre[..., want] != 0).any(axis=(0, 1, 2))
        np.testing.assert_allclose(table[f"{group} mu spread"], np.where(dead, np.nan, spread), rtol=1e-6)
    at.radio(key="mt_section").set_value("Templates T_mu").run()               # the templates' sample picker
    sample_names = ok(at).selectbox(key="mt_sample").options
    assert [s.endswith("positive") for s in sample_names] == (labels == k + 1).tolist()


def test_class_choice_is_in_the_url_and_changes_the_filters(runs):
    at = ok(start(runs / "per_class", "Masks & templates"))
    assert at.selectbox(key="mt_class").proto.query_param_key == "mt_class"   # the browser writes it (AppTest does not)
    assert at.selectbox(key="mt_filter").options == ["0", "3"]
    at.selectbox(key="mt_filter").set_value(3).run()
    at.selectbox(key="mt_class").set_value(2).run()
    ok(at)
    assert at.selectbox(key="mt_filter").options == ["2"] and at.selectbox(key="mt_filter").value == 2
    assert "(class 2)" in " ".join(s.value for s in at.subheader)


def test_a_class_without_dumped_positives_says_so(runs):
    run = inspector.open_run(runs / "few")
    step = run.steps[-1]
    labels = np.asarray(run.samples(step)["label"]).astype(int)
    missing = [k for k in range(K) if k + 1 not in labels]
    assert missing                               # 2 samples kept: at most one class among them
    at = ok(start(runs / "few", "Masks & templates", query={"mt_class": str(missing[0]), "mt_step": str(step)},
                  mt_pool=False, mt_table=True))
    assert any(f"No dumped sample is a positive of class {missing[0]}" in i.value for i in at.info)
    assert _table(at)["positive mu spread"].isna().all()


def test_single_class_runs_have_no_class_chooser(tmp_path):
    from inspector.testing import make_synthetic_run
    make_synthetic_run(tmp_path / "one", steps=20, tensors=20, dump_every=10)
    at = ok(start(tmp_path / "one", "Masks & templates"))
    assert not [s for s in at.selectbox if s.key == "mt_class"]
    assert at.selectbox(key="mt_filter").options[:3] == ["0", "1", "2"]
    assert "class_positive" not in captions(at)


def test_a_dump_without_the_class_labels_gives_no_split(runs, monkeypatch):
    import viewer.data
    real = viewer.data.dump_keys
    monkeypatch.setattr(viewer.data, "dump_keys",
                        lambda *a: [k for k in real(*a) if "class_positive" not in k])   # as if not dumped
    at = ok(start(runs / "per_class", "Masks & templates", query={"mt_class": "1"}, mt_table=True))
    assert any("No positive/negative split for class 1" in w.value and "lacks" in w.value for w in at.warning)
    table = _table(at)
    assert table["filter"].tolist() == [1, 4]                         # the slice is known from the catalog
    assert table[["positive mu spread", "negative mu spread"]].isna().all().all()   # no guessed groups
    assert not any("No dumped sample is a positive" in i.value for i in at.info)
