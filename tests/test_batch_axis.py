"""Per-sample (batched) tensors from data flow, not shape equality (tf.nn + tf.compat.v1: TF 2.15 and latest)."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")  # first: the imports below (noqa: E402) need TensorFlow
import inspector  # noqa: E402
from hooks import DumpHook  # noqa: E402
from hooks.capture.batch_axis import BatchAxis  # noqa: E402

v1 = tf.compat.v1
C = 8  # channels == batch


def _bn_net(batch: int | None):
    """x [batch, 4, 4, 1] -> conv (8 filters) + bias -> non-fused BN with moving averages ->
    relu -> fused BN -> pooled -> logits. Returns a dict of named tensors."""
    gs = v1.train.get_or_create_global_step()
    x = v1.placeholder(tf.float32, [batch, 4, 4, 1], name="x")
    y = v1.placeholder(tf.int32, [batch], name="y")
    init = v1.glorot_uniform_initializer(seed=1)
    w = v1.get_variable("conv/w", [3, 3, 1, C], initializer=init)
    b = v1.get_variable("conv/b", [C], initializer=v1.zeros_initializer())
    conv = tf.nn.bias_add(tf.nn.conv2d(x, w, 1, "SAME"), b, name="conv/out")
    mean, var = tf.nn.moments(conv, axes=[0, 1, 2], name="bn/moments")
    moving = v1.get_variable("bn/moving_mean", [C], initializer=v1.zeros_initializer(), trainable=False)
    update = v1.assign_sub(moving, 0.1 * (moving - mean), name="bn/update")
    normed = tf.nn.batch_normalization(conv, mean, var, None, None, 1e-3, name="bn/out")
    act = tf.nn.relu(normed, name="act")
    fused, fmean, fvar = v1.nn.fused_batch_norm(act, tf.ones([C]), tf.zeros([C]), is_training=True, name="fbn")
    pooled = tf.reduce_mean(fused, axis=[1, 2], name="pooled")          # [N, C]: per sample
    over_batch = tf.reduce_mean(pooled, axis=0, name="over_batch")      # [C]
    kept_dims = tf.reduce_sum(pooled, axis=0, keepdims=True, name="kept_dims")  # [1, C]
    wf = v1.get_variable("fc/w", [C, 2], initializer=init)
    logits = tf.matmul(pooled, wf, name="logits")
    gram = tf.matmul(pooled, pooled, transpose_a=True, name="gram")    # [C, C]: mixes samples
    flipped = tf.transpose(pooled, name="flipped")                      # [C, N]
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
    with tf.control_dependencies([update]):
        train = v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=gs)
    return dict(x=x, y=y, train=train, conv=conv, mean=mean, var=var, moving=moving, update=update, act=act,
                fused=fused, fmean=fmean, fvar=fvar, pooled=pooled, over_batch=over_batch, kept_dims=kept_dims,
                logits=logits, gram=gram, flipped=flipped, bias=b.value() if hasattr(b, "value") else b)


BATCHED = ["x", "conv", "act", "fused", "pooled", "logits"]
NOT_BATCHED = ["mean", "var", "update", "fmean", "fvar", "over_batch", "kept_dims", "gram", "flipped"]


@pytest.mark.parametrize("batch", [C, 1, None], ids=["channels==batch", "batch-of-1", "unknown-batch"])
def test_batched_follows_the_data_not_the_shape(batch):
    with tf.Graph().as_default() as g:
        t = _bn_net(batch)
        axis = BatchAxis(g, t["y"])
        for k in BATCHED:
            assert axis.is_batched(t[k]), k
        for k in NOT_BATCHED:
            assert not axis.is_batched(t[k]), k
        reads = [op.outputs[0] for op in g.get_operations() if op.type in ("ReadVariableOp", "Identity")
                 and op.inputs and op.inputs[0].op.type in ("VarHandleOp", "VariableV2")]
        assert reads and not any(axis.is_batched(r) for r in reads)  # weights, bias [8], moving mean [8]
        assert not axis.is_batched(g.get_tensor_by_name("bn/moments/mean:0"))


def test_hook_catalog_with_channels_equal_to_batch(tmp_path):
    rng = np.random.default_rng(0)
    with tf.Graph().as_default():
        t = _bn_net(C)
        hook = DumpHook(tmp_path / "run", labels=t["y"], stats_every_n_steps=1, dump_every_n_steps=1,
                        samples_per_group=1, strict=True)
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            sess.run(t["train"], {t["x"]: rng.normal(size=(C, 4, 4, 1)), t["y"]: np.arange(C) % 2})
        names = {k: t[k].name for k in BATCHED + NOT_BATCHED}
    run = inspector.open_run(tmp_path / "run")
    cat = run.tensors
    for k in BATCHED:
        assert cat.loc[names[k], "batched"], k
        assert run.tensor(names[k], 1).shape[0] == 2, k  # one positive, one negative kept
    for k in NOT_BATCHED:
        if names[k] in cat.index:
            assert not cat.loc[names[k], "batched"], k
            assert list(run.tensor(names[k], 1).shape) == cat.loc[names[k], "shape"], k  # whole
    groups = set(run.stats[run.stats.tensor == names["mean"]].group)
    assert groups == {"all"}
    reads = cat[(cat.op_type == "ReadVariableOp")]
    assert len(reads) and not reads.batched.any()


def test_embedding_rows_are_batched_the_table_is_not():
    with tf.Graph().as_default() as g:
        ids = v1.placeholder(tf.int32, [None], name="ids")
        table = v1.get_variable("table", [8, 8], initializer=v1.glorot_uniform_initializer(seed=0))
        rows = tf.nn.embedding_lookup(table, ids, name="rows")                  # [N, 8]
        gathered = tf.gather(tf.identity(table, name="table_copy"), ids, name="gathered")
        picked = tf.gather(rows, [0, 1], name="picked")                          # samples 0 and 1: not aligned
        columns = tf.gather(rows, [0, 1], axis=1, name="columns")                # [N, 2]
        axis = BatchAxis(g)
        assert axis.is_batched(rows) and axis.is_batched(gathered) and axis.is_batched(columns)
        assert not axis.is_batched(g.get_tensor_by_name("table_copy:0")) and not axis.is_batched(picked)
        reads = [op.outputs[0] for op in g.get_operations() if op.type == "ReadVariableOp"]
        assert not any(axis.is_batched(r) for r in reads)


def test_a_sparse_feature_columns_embedding_is_batched_after_its_reshape_to_the_batch():
    """A feature column's embedding of a categorical input: looked up per id of a SparseTensor
    (the batch lost at its tf.where), summed per sample, then reshaped to the SparseTensor's
    dense_shape[0], the batch size (``tf.cast(tf.shape(x))``): from that reshape on its rows
    are the samples (they had no groups and were dumped whole). The rows looked up per unique
    id are not."""
    with tf.Graph().as_default() as g:
        feats = {"c": v1.placeholder(tf.string, [None], name="c"), "x": v1.placeholder(tf.float32, [None], name="x")}
        cat = tf.feature_column.categorical_column_with_vocabulary_list("c", ["a", "b", "c", "d"])
        out = v1.feature_column.input_layer(feats, [tf.feature_column.embedding_column(cat, dimension=3)])
        axis = BatchAxis(g, feats["x"])
        reshapes = [op.outputs[0] for op in g.get_operations() if op.type == "Reshape" and "embedding" in op.name]
        assert axis.is_batched(out) and [t.name for t in reshapes if axis.is_batched(t)] == [
            "input_layer/c_embedding/c_embedding_weights/Reshape_2:0", "input_layer/c_embedding/Reshape:0"]
        lookups = [op.outputs[0] for op in g.get_operations() if op.type in ("ResourceGather", "GatherV2")
                   and "embedding_lookup" in op.name]
        assert lookups and not any(axis.is_batched(t) for t in lookups)


def test_reshape_slice_concat_and_reductions():
    with tf.Graph().as_default() as g:
        x = v1.placeholder(tf.float32, [None, 4, 4, 2], name="x")
        cases = {
            "flat": (tf.reshape(x, [-1, 32]), True),
            "dyn_flat": (tf.reshape(x, tf.stack([tf.shape(x)[0], -1])), True),
            "all_flat": (tf.reshape(x, [-1]), False),
            "regroup": (tf.reshape(x, [-1, 8]), False),           # 4 rows per sample
            "first_col": (x[:, 0], True),
            "first_sample": (x[0], False),
            "head": (x[:2], False),
            "ellipsis": (x[..., 1], True),
            "concat_c": (tf.concat([x, x], axis=3), True),
            "concat_n": (tf.concat([x, x], axis=0), False),
            "stack_1": (tf.stack([x, x], axis=1), True),
            "stack_0": (tf.stack([x, x], axis=0), False),
            "sum_hw": (tf.reduce_sum(x, [1, 2]), True),
            "sum_n": (tf.reduce_sum(x, 0), False),
            "sum_all": (tf.reduce_sum(x), False),
            "max_neg": (tf.reduce_max(x, -1), True),
            "argmax_n": (tf.argmax(x, 0), False),
            "cumsum_n": (tf.cumsum(x, 0), False),
            "perm": (tf.transpose(x, [0, 3, 1, 2]), True),
            "moved": (tf.transpose(x, [3, 0, 1, 2]), False),
            "expand_1": (tf.expand_dims(x, 1), True),
            "expand_0": (tf.expand_dims(x, 0), False),
            "tiled_c": (tf.tile(x, [1, 1, 1, 2]), True),
            "tiled_n": (tf.tile(x, [2, 1, 1, 1]), False),
            "padded": (tf.pad(x, [[0, 0], [1, 1], [1, 1], [0, 0]]), True),
            "shape": (tf.cast(tf.shape(x), tf.float32), False),
            "softmax": (tf.nn.softmax(tf.reshape(x, [-1, 32])), True),
            "concat_flat": (tf.reshape(x, tf.concat([tf.shape(x)[:1], [-1]], 0)), True),
            "ones_like_shape": (tf.ones(tf.shape(x)), True),
            "per_sample_ones": (tf.ones(tf.shape(x)[:1]), True),
            "tiled_row": (tf.tile(tf.zeros([1, 3]), tf.stack([tf.shape(x)[0], 1])), True),
            "broadcast": (tf.broadcast_to(tf.zeros([3]), tf.stack([tf.shape(x)[0], 3])), True),
            "cast_size": (tf.reshape(x, tf.stack([tf.cast(tf.shape(x, out_type=tf.int64)[0], tf.int32), -1])), True),
            "cast_shape": (tf.tile(tf.zeros([1, 3]), tf.stack([tf.cast(tf.shape(x), tf.int32)[0], 1])), True),
            "second_dim": (tf.reshape(x, tf.stack([tf.cast(tf.shape(x), tf.int32)[1], -1])), False),
            "constant_row": (tf.zeros([4, 3]), False),
            "partitioned": (tf.dynamic_partition(x, tf.zeros([tf.shape(x)[0]], tf.int32), 2)[0], False),
            "masked": (tf.boolean_mask(x, x[:, 0, 0, 0] > 0), False),
            "stack_mixed": (tf.stack([tf.reduce_sum(x, [1, 2, 3]), tf.ones(tf.shape(x)[:1])], axis=1), True),
        }
        axis = BatchAxis(g)
        wrong = {k: want for k, (t, want) in cases.items() if axis.is_batched(t) != want}
        assert not wrong, wrong


def test_overrides_apply_during_the_trace(tmp_path):
    with tf.Graph().as_default() as g:
        x = v1.placeholder(tf.float32, [None, 3], name="x")
        buffer = v1.get_variable("buffer", [5, 3], initializer=v1.zeros_initializer())
        h = tf.tanh(x, name="h")
        b = tf.sigmoid(tf.identity(buffer, name="buffer_read"), name="b")
        assert not BatchAxis(g).is_batched(b)
        forced = BatchAxis(g, batched=r"^buffer_read:0$")
        assert forced.is_batched(b) and forced.is_batched(h)
        cut = BatchAxis(g, unbatched=[r"^x:0$"])
        assert not cut.is_batched(h) and not cut.is_batched(x)
    with pytest.raises(ValueError, match="regular expression"):
        DumpHook(tmp_path / "run", batched="(")


def test_a_batch_merged_with_time_or_moved_to_axis_1_is_carried_back():
    """After a reshape merging the batch with time (TimeDistributed under
    tf.keras, a layer folding time into the batch) or a time-major transpose (Keras 3's
    TimeDistributed), every later tensor, the logits included, lost its groups. The trace
    carries the batch through: the tensors in between are not batched (their rows are not
    samples) and moved_at names the op that moved it; after the reshape or transpose back, and
    for each time step taken from a time-major tensor, the batch is axis 0 again."""
    with tf.Graph().as_default() as g:
        x = v1.placeholder(tf.float32, [None, 5, 3], name="x")
        y = v1.placeholder(tf.int32, [None], name="y")
        w = v1.get_variable("w", [3, 4])
        merged = tf.reshape(x, [-1, 3], name="merge")                          # [B*5, 3]
        hidden = tf.nn.relu(tf.matmul(merged, w), name="hidden")               # [B*5, 4]
        back = tf.reshape(hidden, [-1, 5, 4], name="back")                     # [B, 5, 4]: 20 = 5 rows x 4
        by_shape = tf.reshape(hidden, tf.stack([tf.shape(x)[0], 5, 4]), name="by_shape")
        over_rows = tf.reduce_sum(hidden, axis=0, name="over_rows")            # sums every sample's rows
        major = tf.transpose(x, [1, 0, 2], name="time_major")                 # [5, B, 3]
        third = major[2]                                                       # x[t]: [B, 3]
        step = tf.matmul(third, w, name="step")                                # one time step: [B, 4]
        scaled = tf.multiply(major, 2.0, name="scaled")                        # still time-major
        summed = tf.reduce_sum(scaled, axis=1, name="over_batch")              # over axis 1: the batch
        stacked = tf.stack([step, step], axis=0, name="stacked")               # [2, B, 4]
        restored = tf.transpose(scaled, [1, 0, 2], name="restored")            # [B, 5, 3]
        axis = BatchAxis(g, y)
        for t in (back, by_shape, step, restored, third):
            assert axis.is_batched(t), t.name
        for t in (merged, hidden, over_rows, major, scaled, summed, stacked):
            assert not axis.is_batched(t), t.name
        assert axis.moved_at([hidden, scaled, summed, over_rows]) == ["merge", "time_major"]
        assert axis.moved_at([stacked]) == ["stacked"]
