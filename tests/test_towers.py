"""Multi-tower training (seed 002's tf.split towers): each tower's tensors are grouped by its own
samples, checked against numpy over that tower's samples (an Oracle hook fetches the tensors in
the same training run); unresolved towers get no groups and a warning (TF 2.15 and latest)."""
from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pytest

tf = pytest.importorskip("tensorflow")  # first: the imports below (noqa: E402) need TensorFlow
import inspector  # noqa: E402
from inspector.format.loghist import LogHistogram  # noqa: E402
from hooks import DumpHook  # noqa: E402

v1 = tf.compat.v1
N, D, H = 16, 5, 6
RNG = np.random.default_rng(5)
X = RNG.normal(size=(N, D)).astype(np.float32)
Y = np.array([0, 1, 1, 0, 1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0], np.int64)


class Oracle(v1.train.SessionRunHook):
    def __init__(self, names) -> None:
        self.names, self.seen = names, {}

    def begin(self) -> None:
        g = v1.get_default_graph()
        self.fetch = {n: g.get_tensor_by_name(n) for n in self.names}

    def before_run(self, run_context):
        return None if self.seen else v1.train.SessionRunArgs(self.fetch)

    def after_run(self, run_context, run_values) -> None:
        self.seen = self.seen or run_values.results


def _tower(i: int, x: tf.Tensor, y: tf.Tensor, w1, w2) -> tf.Tensor:
    with tf.name_scope(f"tower_{i}"):
        hidden = tf.nn.relu(tf.matmul(x, w1), name="hidden")
        logits = tf.matmul(hidden, w2, name="logits")
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))


def _train(run_dir, cut: str, names: list[str], given=None, **kw) -> dict:
    """Two towers over one batch, cut by ``cut``: 'split' (tf.split in halves), 'splitv'
    (tf.split into 6 and 10), 'slice' (x[:8], x[8:]: not traced), 'feeds' (a placeholder per tower,
    labels given per tower). ``given(ys)``: more hook arguments, from the towers' labels."""
    with tf.Graph().as_default():
        w1 = v1.get_variable("w1", initializer=RNG.normal(size=(D, H)).astype(np.float32))
        w2 = v1.get_variable("w2", initializer=RNG.normal(size=(H, 2)).astype(np.float32))
        if cut == "feeds":
            xs = [v1.placeholder(tf.float32, [None, D], name=f"x{i}") for i in range(2)]
            ys = [v1.placeholder(tf.int64, [None], name=f"y{i}") for i in range(2)]
            feed = {xs[0]: X[:8], xs[1]: X[8:], ys[0]: Y[:8], ys[1]: Y[8:]}
            kw.setdefault("labels", {"tower_0": ys[0], "tower_1": ys[1]})
        else:
            x = v1.placeholder(tf.float32, [None, D], name="x")
            y = v1.placeholder(tf.int64, [None], name="y")
            feed = {x: X, y: Y}
            kw.setdefault("labels", y)
            if cut == "slice":
                xs, ys = [x[:8], x[8:]], [y[:8], y[8:]]
            else:
                sizes = 2 if cut == "split" else [6, 10]
                xs, ys = tf.split(x, sizes), tf.split(y, sizes)
        kw.update(given(ys) if given is not None else {})
        loss = tf.add_n([_tower(i, xs[i], ys[i], w1, w2) for i in range(2)]) / 2
        train = v1.train.GradientDescentOptimizer(0.01).minimize(loss, global_step=v1.train.get_or_create_global_step())
        oracle = Oracle(names)
        hook = DumpHook(run_dir, loss=loss, stats_every_n_steps=1, dump_every_n_steps=1, samples_per_group=N,
                        strict=True, **kw)
        with v1.train.MonitoredTrainingSession(hooks=[hook, oracle]) as sess:
            sess.run(train, feed_dict=feed)
    return oracle.seen


def _check(run, name: str, x: np.ndarray, positive: np.ndarray) -> None:
    df = run.query_stats([name], kinds=["forward"]).set_index("group")
    assert df.loc["all", "count"] == x.size
    for group, rows in (("positive", positive), ("negative", ~positive)):
        v = x[rows].astype(np.float64)   # as the statistics sum
        row = df.loc[group]
        assert row["count"] == v.size
        np.testing.assert_allclose([row["mean"], row["std"], row["min"], row["max"]],
                                   [v.mean(), v.std(), v.min(), v.max()], rtol=1e-5, atol=1e-6)
        want = LogHistogram.of(x[rows])
        assert list(row["hist_bucket"]) == want.index.tolist() and list(row["hist_count"]) == want.count.tolist()


@pytest.mark.parametrize("cut, first", [("split", 8), ("splitv", 6)])
def test_split_towers_grouped_by_their_own_samples(tmp_path, cut, first):
    names = ["tower_0/hidden:0", "tower_1/hidden:0", "tower_1/logits:0"]
    seen = _train(tmp_path / "run", cut, names)
    run = inspector.open_run(tmp_path / "run")
    _check(run, "tower_0/hidden:0", seen["tower_0/hidden:0"], Y[:first] != 0)
    for name in names[1:]:
        _check(run, name, seen[name], Y[first:] != 0)
    # the dump keeps each tower's samples by its own groups; indices are rows of the tower
    assert run.tensors.loc["tower_1/hidden:0", "tower"] == "split:1"
    index = np.asarray(run.dump_array(1, "samples/split:1/index"))
    np.testing.assert_array_equal(index, np.arange(N - first))
    codes = np.asarray(run.dump_array(1, "samples/split:1/group"))
    np.testing.assert_array_equal(codes, (Y[first:] != 0).astype(int))
    np.testing.assert_allclose(run.tensor("tower_1/hidden:0", 1), seen["tower_1/hidden:0"][index], rtol=1e-6)


@pytest.mark.parametrize("tower", [0, 1])
def test_one_towers_labels_group_every_tower_by_its_own(tmp_path, caplog, tower):
    """labels= one tower's labels (a tf.split of the batch's): grouping the other tower by them
    left it no sample in any group (its tensors dumped with 0 rows) or another tower's groups.
    The labels they were split from group every tower by its own samples."""
    names = ["x:0", "tower_0/hidden:0", "tower_1/hidden:0"]
    with caplog.at_level(logging.INFO, logger="tf_inspector"):
        seen = _train(tmp_path / "run", "split", names, given=lambda ys: {"labels": ys[tower]})
    assert "grouping by y:0, the labels they were split from" in caplog.text
    run = inspector.open_run(tmp_path / "run")
    _check(run, "x:0", seen["x:0"], Y != 0)
    _check(run, "tower_0/hidden:0", seen["tower_0/hidden:0"], Y[:8] != 0)
    _check(run, "tower_1/hidden:0", seen["tower_1/hidden:0"], Y[8:] != 0)
    np.testing.assert_allclose(run.tensor("tower_1/hidden:0", 1), seen["tower_1/hidden:0"], rtol=1e-6)


@pytest.mark.parametrize("how", ["positive tensor", "computed after the split"])
def test_one_towers_labels_that_cannot_group_the_others_are_warned(tmp_path, caplog, how):
    """One tower's labels whose groups are fixed for that tower (positive= a tensor of them), or
    labels computed from one tower's part: the other towers cannot be grouped by them. A warning
    names the cause and the fix; every tensor has statistics for 'all' only, and each dump keeps
    its first samples (tower 1's were dumped with 0 rows)."""
    given = ((lambda ys: {"labels": ys[0], "positive": tf.equal(ys[0], 1)}) if how == "positive tensor" else
             (lambda ys: {"labels": tf.identity(ys[0], name="labels_0")}))
    with caplog.at_level(logging.WARNING, logger="tf_inspector"):
        _train(tmp_path / "run", "split", [], given=given)
    want = ("their groups were given for that part only (positive= a tensor): the other towers' samples have none"
            if how == "positive tensor" else "labels_0:0 are computed from split:0, one tower's part of the batch")
    assert want in caplog.text and "labels={scope: labels} per tower" in caplog.text
    run = inspector.open_run(tmp_path / "run")
    assert set(run.stats["group"].astype(str)) == {"all"}
    assert run.tensor("tower_1/hidden:0", 1).shape[0] == N // 2   # the budget (2 x 16 ungrouped) keeps its 8


def test_explicit_tower_labels(tmp_path):
    names = ["tower_0/hidden:0", "tower_1/hidden:0"]
    seen = _train(tmp_path / "run", "feeds", names)
    run = inspector.open_run(tmp_path / "run")
    _check(run, "tower_0/hidden:0", seen["tower_0/hidden:0"], Y[:8] != 0)
    _check(run, "tower_1/hidden:0", seen["tower_1/hidden:0"], Y[8:] != 0)
    assert run.groups == ["all", "positive", "negative"]


def test_unresolved_towers_get_no_groups_and_a_warning(tmp_path, caplog):
    names = ["tower_1/hidden:0"]
    with caplog.at_level(logging.WARNING, logger="tf_inspector"):
        _train(tmp_path / "run", "slice", names)
    run = inspector.open_run(tmp_path / "run")
    groups = run.query_stats(["tower_1/hidden:0"], kinds=["forward"])["group"].astype(str)
    assert set(groups) == {"all"}
    # the warning names the op where the rows stopped being the batch's, not a generic guess
    assert "tower_1/hidden:0" in caplog.text and "(StridedSlice: takes some rows of x:0" in caplog.text
    assert not run.tensors.loc["tower_1/hidden:0", "batched"]
    # the whole batch's tensors keep their groups
    assert set(run.query_stats(["x:0"], kinds=["forward"])["group"].astype(str)) == {"all", "positive", "negative"}


@pytest.mark.parametrize("tower", [0, 1])
def test_labels_sliced_from_the_batch_group_nothing_and_are_warned(tmp_path, caplog, tower):
    """labels= y[:8] or y[8:] of a batch of 16 (towers cut by slicing, not tf.split): the trace
    cannot tell which rows of the whole batch they label. Grouping x:0 by them put half its
    samples in no group (positive + negative covered 8 of 16 rows); with y[8:] a dump's labels
    would be other samples'. So no groups and no sample labels, with a warning naming the cut."""
    with caplog.at_level(logging.WARNING, logger="tf_inspector"):
        _train(tmp_path / "run", "slice", [], given=lambda ys: {"labels": ys[tower]})
    cut = f"strided_slice_{2 + tower}"   # after x[:8] and x[8:]
    assert (f"labels {cut}:0 are computed from part of the batch ({cut}, a StridedSlice, selects some rows of y:0)"
            in caplog.text)
    run = inspector.open_run(tmp_path / "run")
    assert set(run.stats["group"].astype(str)) == {"all"}
    assert "samples/label" not in run.dump_keys(1) and "label" not in run.samples(1)


def test_reader_samples_of_a_tower(tmp_path):
    _train(tmp_path / "run", "split", [])
    run = inspector.open_run(tmp_path / "run")
    s = run.samples(1, tower="split:1")
    np.testing.assert_array_equal(s["index"], np.arange(8))
    assert list(s["group"]) == ["positive" if v else "negative" for v in Y[8:] != 0]
    with pytest.raises(inspector.NoDumpError, match="split:0, split:1"):
        run.samples(1, tower="tower_9")
    # a tensor's own samples (the viewer's pages label a tower's rows this way, not by the
    # whole batch's): its tower's, or the batch's for an untowered tensor
    pd.testing.assert_frame_equal(run.samples(1, tensor="tower_1/hidden:0"), s)
    pd.testing.assert_frame_equal(run.samples(1, tensor="x:0"), run.samples(1))
    with pytest.raises(ValueError, match="tower 'split:1'"):
        run.samples(1, tensor="tower_1/hidden:0", tower="split:0")


def test_a_refused_step_dumps_every_towers_first_samples(tmp_path):
    """Continuous targets (soft labels in (0, 1): the default rule refuses the step's groups)
    under traced tf.split towers: each tower keeps its slice's first samples, ungrouped, like
    the batch, instead of no row of any tower's tensors (a slice's groups must not drop the
    batch's count of samples breaking the rule)."""
    y = RNG.uniform(0.05, 0.95, size=(N,)).astype(np.float32)
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [None, D], name="x")
        labels = v1.placeholder(tf.float32, [None], name="y")
        w = v1.get_variable("w", initializer=RNG.normal(size=(D, 1)).astype(np.float32))
        losses = []
        for i, (xi, yi) in enumerate(zip(tf.split(x, 2), tf.split(labels, 2))):
            with tf.name_scope(f"tower_{i}"):
                h = tf.nn.relu(tf.matmul(xi, w), name="hidden")
                losses.append(tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=yi, logits=tf.reshape(h, [-1]))))
        loss = tf.add_n(losses, name="loss")
        train = v1.train.GradientDescentOptimizer(0.01).minimize(loss, global_step=v1.train.get_or_create_global_step())
        hook = DumpHook(tmp_path / "run", loss=loss, labels=labels, stats_every_n_steps=1, dump_every_n_steps=1,
                        samples_per_group=2, strict=True)
        with v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:
            sess.run(train, {x: X, labels: y})
    run = inspector.open_run(tmp_path / "run")
    assert run.dump_metadata(1)["groups"] == "refused" and run.manifest["groups_refused"]["first_step"] == 1
    for i in range(2):
        half = X[i * N // 2:(i + 1) * N // 2]
        want = np.maximum(half[:4].astype(np.float64) @ run.tensor("w", 1), 0)   # a dot product near 0 rounds apart
        np.testing.assert_allclose(run.tensor(f"tower_{i}/hidden:0", 1), want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
