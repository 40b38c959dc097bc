"""Every float op output of a run's graph is accounted for (inspector/format/accounting.py): captured,
skipped with the reason, or excluded by a named rule; DumpHook and InspectCallback, checked
against the graph itself and against tfdbg v1's DumpingDebugHook."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")  # first: the imports below (noqa: E402) need TensorFlow
import inspector  # noqa: E402
from hooks import DumpHook, capture  # noqa: E402
from inspector import cli  # noqa: E402
from inspector.format.accounting import Ledger  # noqa: E402
from inspector.graph.graphdef import parse_graph_def  # noqa: E402
from tfmodels import BATCH, HW, batch_images, batch_labels  # noqa: E402

v1 = tf.compat.v1
ACCOUNTED = ("captured", "skipped", "excluded")


def cond_model() -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Operation]:
    """x -> * a constant -> a v1 cond (two branches) -> dense -> * ones_like + zeros_like + fill ->
    softmax cross entropy; Adam; summaries of the loss and the logits. Build it with control
    flow v2 disabled (the cond is then a v1 cond)."""
    gs = v1.train.get_or_create_global_step()
    x = v1.placeholder(tf.float32, [BATCH, HW, HW, 1], name="x")
    y = v1.placeholder(tf.int32, [BATCH], name="labels")
    flat = tf.reshape(x, [BATCH, HW * HW], name="flat")
    scaled = tf.multiply(flat, tf.constant(2.0, name="two"), name="scaled")
    gated = tf.cond(tf.reduce_mean(flat) > 0, lambda: scaled * 0.5, lambda: tf.tanh(scaled), name="gate")
    w = v1.get_variable("fc/w", [HW * HW, 2], initializer=v1.glorot_uniform_initializer(seed=1))
    logits = tf.matmul(gated, w, name="logits")
    shifted = tf.add(logits * tf.ones_like(logits, name="ones") + tf.zeros_like(logits, name="zeros"),
                     tf.fill([BATCH, 2], 0.0, name="fill"), name="shifted")
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=shifted), name="loss")
    with tf.name_scope("summaries"):
        v1.summary.scalar("loss", loss)
        v1.summary.scalar("mean_logit", tf.reduce_mean(shifted))
        v1.summary.histogram("logits", shifted)
    train = v1.train.AdamOptimizer(0.01).minimize(loss, global_step=gs)
    return x, y, loss, train


def float_outputs(g: tf.Graph, ops: set[str]) -> list[str]:
    return [t.name for op in g.get_operations() if op.name in ops for t in op.outputs
            if t.dtype.base_dtype in capture.FLOAT_DTYPES]


def saved_ops(run) -> set[str]:
    return {n.name for n in parse_graph_def(run.graph_def_bytes())}


@pytest.fixture(scope="module")
def cond_run(tmp_path_factory):
    """A DumpHook run of :func:`cond_model` (4 steps, a dump at step 2), its graph and the tfdbg
    v1 dumps of the same runs, with Grappler and the graph optimizer off (tfdbg then sees the
    ops as the graph has them)."""
    from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
    from tensorflow.python.debug.wrappers.hooks import DumpingDebugHook
    root = tmp_path_factory.mktemp("acc")
    off = config_pb2.ConfigProto(graph_options=config_pb2.GraphOptions(
        rewrite_options=rewriter_config_pb2.RewriterConfig(disable_meta_optimizer=True),
        optimizer_options=config_pb2.OptimizerOptions(opt_level=config_pb2.OptimizerOptions.L0,
                                                      do_constant_folding=False,
                                                      do_common_subexpression_elimination=False)))
    v1.disable_control_flow_v2()
    try:
        with tf.Graph().as_default() as g:
            x, y, loss, train = cond_model()
            hook = DumpHook(root / "run", loss=loss, labels=y, stats_every_n_steps=1, dump_every_n_steps=0,
                            dump_steps=[2], samples_per_group=BATCH, strict=True)
            with v1.train.MonitoredTrainingSession(hooks=[hook, DumpingDebugHook(str(root / "tfdbg"))], config=off,
                                                   save_checkpoint_steps=None, save_summaries_steps=None) as sess:
                for step in range(4):
                    sess.run(train, {x: batch_images(step), y: batch_labels(step)})
    finally:
        v1.enable_control_flow_v2()
    return inspector.open_run(root / "run"), g, root / "tfdbg"


def test_every_float_output_is_captured_skipped_or_excluded_with_the_reason(cond_run):
    """Constants, a v1 cond, an optimizer and summaries: every float output of the saved graph
    is exactly one of captured / skipped / excluded, with the reason or the rule, and the
    counts of the manifest are those of the graph."""
    run, g, _ = cond_run
    names = float_outputs(g, saved_ops(run))
    whys = {n: run.why(n) for n in names}
    assert {w.status for w in whys.values()} == set(ACCOUNTED)
    assert all(w.reason and (w.rule is not None) == (w.status == "excluded") for w in whys.values())
    acc = run.manifest["accounting"]
    by_status = {s: sum(w.status == s for w in whys.values()) for s in ACCOUNTED}
    assert acc["total"] == len(names) and acc["captured"] == by_status["captured"]
    assert sum(s["count"] for s in acc["skipped"]) == by_status["skipped"]
    counts = {r["rule"]: r["count"] for r in acc["excluded"]}
    assert counts.pop("unaccounted") == 0
    assert counts == {r: sum(w.rule == r for w in whys.values()) for r in counts}
    captured = set(run.tensors.index)
    assert all((w.status == "captured") == (n in captured) for n, w in whys.items())
    # the constants docs/guide/attach.md's "every forward op" did not mention, by rule
    for name in ("two:0", "ones:0", "zeros:0", "fill:0"):
        assert (whys[name].status, whys[name].rule) == ("excluded", "constant"), whys[name]
    assert whys["gate/Tanh:0"].status == "skipped" and whys["gate/Tanh:0"].reason == capture.IN_V1_BODY
    assert whys["gate/Merge:0"].status == "captured"
    assert whys["summaries/Mean:0"].rule == "summaries"
    rules = {w.rule for w in whys.values()}
    assert {"backward", "optimizer", "init", "constant", "summaries"} <= rules
    assert any(n.startswith("Adam/") and w.rule == "optimizer" for n, w in whys.items())
    # compact: the default rules say their names by pattern or op type, none is listed
    assert not any(r["names"] for r in acc["excluded"] if r["source"] == "default" and r["rule"] != "backward")


def test_tfdbg_sees_no_op_the_run_does_not_account_for(cond_run):
    """tfdbg v1 dumps every op output each run computes (Grappler off): each float one is
    captured, skipped or excluded in the run (the hook's own ops: the 'inspector' rule), and
    the values DumpHook dumped at step 2 are tfdbg's of the same run."""
    from tensorflow.python.debug.lib import debug_data
    run, _, tfdbg = cond_run
    dumps = sorted(p for p in tfdbg.iterdir() if p.is_dir())
    assert len(dumps) == 4
    seen: dict[str, str] = {}
    for d in dumps:
        for datum in debug_data.DebugDumpDir(str(d)).dumped_tensor_data:
            value = datum.get_tensor()
            if isinstance(value, np.ndarray) and value.dtype.kind == "f":
                name = _graph_name(datum.node_name, datum.output_slot)
                seen[name] = run.why(name).status
    assert len(seen) > 50 and "shifted:0" in seen and "two:0" in seen
    assert {n: s for n, s in seen.items() if s not in ACCOUNTED} == {}
    # step 2 is the second run (global step 1 -> 2): its dump holds the whole batch
    second = {_graph_name(d.node_name, d.output_slot): d.get_tensor()
              for d in debug_data.DebugDumpDir(str(dumps[1])).dumped_tensor_data}
    forward = [k.partition("/")[2] for k in run.dump_keys(2) if k.startswith("forward/")]
    tensors = [n for n in forward if n in run.tensors.index and run.tensors.loc[n, "kind"] == "tensor"]
    assert len(tensors) >= 8 and "x:0" in tensors
    for name in tensors:
        np.testing.assert_array_equal(run.tensor(name, 2), second[name], err_msg=name)


def _graph_name(node: str, slot: int) -> str:
    """The graph's tensor name of what tfdbg dumped: a fed tensor is the runtime's
    ``_arg_<op>_<output>_<index>`` node (the session's call frame), which is ``<op>:<output>``."""
    fed = re.fullmatch(r"_arg_(.+)_(\d+)_\d+", node)
    return f"{fed[1]}:{fed[2]}" if fed else f"{node}:{slot}"


def test_info_prints_the_counts_per_rule(cond_run):
    run, _, _ = cond_run
    text = cli.summary(run)
    line = next(x for x in text.splitlines() if x.startswith("excluded   "))
    assert "constant " in line and "backward " in line and "summaries " in line
    assert f"{run.manifest['accounting']['total']} float op outputs" in text
    # the tensors line splits its count the way the accounting line counts (op outputs only)
    kinds = run.tensors["kind"].value_counts()
    captured = run.manifest["accounting"]["captured"]
    assert kinds["tensor"] == captured
    assert f"{len(run.tensors)} captured ({captured} op outputs, {kinds['variable']} variable records)" in text


def test_the_lookup_error_says_why(cond_run):
    run, _, _ = cond_run
    with pytest.raises(inspector.UnknownTensorError, match="Not captured: excluded by the default rule 'constant'"):
        run.check_tensor("two:0")
    with pytest.raises(inspector.UnknownTensorError, match="inside a v1 while/cond body"):
        run.check_tensor("gate/Tanh:0")


def _ledger(g: tf.Graph, sel: capture.Selection, filters: dict) -> Ledger:
    """What a run's reader would answer for ``sel``: the accounting record and catalog of a
    manifest, the graph's op types."""
    acc = capture.accounting(g.get_operations(), sel, [t.name for t in sel.tensors], filters)
    manifest = json.loads(json.dumps({"tensors": [{"name": t.name, "op": t.op.name} for t in sel.tensors],
                                      "skipped": sel.skipped, "accounting": acc}))
    return Ledger(manifest, {op.name: op.type for op in g.get_operations()})


def _mlp() -> tf.Graph:
    with tf.Graph().as_default() as g:
        x = v1.placeholder(tf.float32, [4, 3], name="x")
        h = tf.nn.relu(tf.matmul(x, tf.ones([3, 3]), name="l1/MatMul"), name="l1/Relu")
        half = tf.cast(h, tf.float16, name="l2/Cast")
        tf.tanh(half, name="l2/Tanh")
        tf.cond(tf.reduce_sum(x) > 0, lambda: h * 2.0, lambda: h, name="c")   # TF2 cond: If + Identity
        tf.identity(tf.sigmoid(h, name="l3/Sigmoid"), name="out")
    return g


@pytest.mark.parametrize("filters, name, rule", [
    (dict(include=["l1/"]), "l2/Tanh:0", "include"),
    (dict(exclude=["Sigmoid"]), "l3/Sigmoid:0", "exclude"),
    (dict(op_types=["Relu", "MatMul"]), "out:0", "op_types"),
    (dict(exclude_op_types=["Tanh"]), "l2/Tanh:0", "exclude_op_types"),
    (dict(dtypes=(tf.float32,)), "l2/Tanh:0", "dtypes"),
])
def test_the_users_filters_are_named(filters, name, rule):
    """An output left out by include= / exclude= / op_types= / exclude_op_types= / dtypes= is
    excluded by that filter, named, with what it was; every float output is accounted for."""
    g = _mlp()
    sel = capture.select_tensors(g, **filters)
    ledger = _ledger(g, sel, filters)
    why = ledger.why(name)
    assert (why.status, why.rule, why.source) == ("excluded", rule, "user"), why
    assert "=" in why.reason
    outputs = float_outputs(g, {op.name for op in g.get_operations()})
    assert {ledger.why(n).status for n in outputs} <= set(ACCOUNTED)
    record = next(r for r in ledger.manifest["accounting"]["excluded"] if r["rule"] == rule)
    # the user's regexes and dtypes list their names (a reader runs no regex of a file); op types need none
    assert (name in record["names"]) == (rule not in ("op_types", "exclude_op_types"))


def test_a_tf2_cond_output_is_captured_as_its_identity():
    g = _mlp()
    sel = capture.select_tensors(g)
    why = _ledger(g, sel, {}).why("c:0")
    assert (why.status, why.captured_as) == ("captured", ("c/Identity:0",)), why


def test_what_only_data_flow_says_is_listed_by_name():
    """An op computed from the backward pass outside a gradients/ scope (gradient clipping) is
    the backward rule's by data flow: no pattern says it, so the record lists it."""
    with tf.Graph().as_default() as g:
        x = v1.placeholder(tf.float32, [4, 3], name="x")
        w = v1.get_variable("w", [3, 2])
        loss = tf.reduce_mean(tf.matmul(x, w, name="logits"), name="loss")
        (grad,) = tf.gradients(loss, [w])
        tf.multiply(grad, 0.5, name="clip")
        sel = capture.select_tensors(g, loss=loss)
    ledger = _ledger(g, sel, {})
    why = ledger.why("clip:0")
    assert (why.status, why.rule) == ("excluded", "backward"), why
    backward = next(r for r in ledger.manifest["accounting"]["excluded"] if r["rule"] == "backward")
    assert backward["names"] == ["clip:0"] and backward["count"] > 1


def test_an_op_name_speaks_for_its_outputs(cond_run):
    run, _, _ = cond_run
    assert run.why("logits").status == "captured" and run.why("logits").captured_as == ("logits:0",)
    assert run.why("two").rule == "constant"
    assert run.why("gate/Tanh").status == "skipped"
    assert run.why("no/such/op").status == "absent"
    assert run.why("tf_inspector/stats/anything:0").rule == "inspector"   # the hook's own ops, added after the graph
    assert run.why("labels:0").status == "not_float"


def test_the_browser_search_shows_excluded_and_skipped_ops(cond_run):
    run, _, _ = cond_run
    found = run.uncaptured("tanh").set_index("name")
    assert found.loc["gate/Tanh", "status"] == "skipped" and "gate/Tanh:0" not in found.index   # one row per op
    found = run.uncaptured("logits").set_index("name")
    assert set(found["status"]) == {"excluded"} and found.loc["gradients/logits_grad/MatMul", "rule"] == "backward"
    assert "logits" not in found.index   # captured
    assert run.uncaptured("fill").set_index("name").loc["fill", "rule"] == "constant"


@pytest.mark.parametrize("source", ["probe", "train_batch"])
def test_the_keras_capture_accounts_for_every_float_output(tmp_path, source):
    """InspectCallback: every float output of the saved function graph is captured, skipped
    or excluded; what lies outside the model's call and its loss by the 'outside' rule (listed:
    no pattern says it), the callback's own ops by 'inspector'."""
    from hooks.keras import InspectCallback
    keras = tf.keras
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 6)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="relu", name="hidden"),
                              keras.layers.Dense(2, name="logits")], name="seq")
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    probe = dict(probe=(x[:8], y[:8])) if source == "probe" else dict(source="train_batch")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0,
              callbacks=[InspectCallback(tmp_path / "run", stats_every_n_steps=1, strict=True, **probe)])
    run = inspector.open_run(tmp_path / "run")
    with tf.Graph().as_default() as g:
        tf.graph_util.import_graph_def(tf.compat.v1.GraphDef.FromString(run.graph_def_bytes()), name="")
    names = float_outputs(g, {op.name for op in g.get_operations()})
    whys = {n: run.why(n) for n in names}
    assert {w.status for w in whys.values()} <= set(ACCOUNTED)
    acc = run.manifest["accounting"]
    assert acc["total"] == len(names) and acc["captured"] == sum(w.status == "captured" for w in whys.values())
    counts = {r["rule"]: r["count"] for r in acc["excluded"] if r["count"]}
    assert {"inspector", "outside"} <= set(counts)
    assert counts == {r: sum(w.rule == r for w in whys.values()) for r in counts}
    outside = next(r for r in acc["excluded"] if r["rule"] == "outside")
    assert len(outside["names"]) == outside["count"] and outside["source"] == "keras"
    assert all(whys[n].status == "captured" for n in run.tensors.index if n in whys)
