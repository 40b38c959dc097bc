"""Device-resident statistics and dump samples, tested where a CPU machine can: the placement
decisions in a graph pinned to /device:GPU:0 (every op that reads a captured tensor is on
that tensor's device, the CPU-only fused kernel reads none of them) and, run with soft
placement on this CPU, the same numbers as the reference statistics (exact_stats.build_stats)."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")  # first: the imports below (noqa: E402) need TensorFlow
from hooks import capture  # noqa: E402
from hooks.stats import exact as exact_stats, fast as fast_stats  # noqa: E402
from hooks.capture import feeds  # noqa: E402

v1 = tf.compat.v1
GPU = "/device:GPU:0"


def _graph(pin: dict[int, str]):
    """Five captured tensors (small and big, batched and not); tensor i built under pin[i]."""
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=(6, 5, 4)), rng.normal(size=(6, 9000)), rng.normal(size=(7,)),
              np.maximum(rng.normal(size=(6, 2, 64)), 0), rng.normal(size=(40000,))]
    caps = []
    for i, a in enumerate(arrays):
        with tf.device(pin.get(i, "")):
            x = tf.identity(tf.constant(a.astype(np.float32)), name=f"t{i}")
        caps.append(capture.Captured(x, batched=a.ndim > 1, gradient=None))
    return caps


def _readers(caps) -> list[tuple[tf.Operation, tf.Tensor]]:
    """(op, captured tensor it reads) for every op of the statistics and dump scopes."""
    ids = {id(c.tensor): c.tensor for c in caps}
    g = v1.get_default_graph()
    return [(op, ids[id(t)]) for op in g.get_operations() if op.name.startswith("tf_inspector/")
            for t in op.inputs if id(t) in ids]


def _same(a: str, b: str) -> bool:
    return tf.DeviceSpec.from_string(a) == tf.DeviceSpec.from_string(b)


@pytest.mark.parametrize("pin", [{i: GPU for i in range(5)}, {0: GPU, 1: GPU, 3: "/device:CPU:0"}],
                         ids=["all on GPU", "mixed"])
def test_statistics_and_dump_gathers_run_beside_their_tensor(pin):
    with tf.Graph().as_default():
        caps = _graph(pin)
        gid = tf.constant([1, 0, 0, 1, 1, 0], tf.int32)
        fast_stats.build_stats(caps, gid, use_native=True)
        capture.build_dump(caps, tf.constant([0, 2], tf.int32))
        readers = _readers(caps)
        assert {t.name for _, t in readers} == {c.tensor.name for c in caps}  # every tensor is read
        for op, t in readers:
            if feeds.accelerator(t):
                assert _same(op.device, t.device), f"{op.name} ({op.type}) on {op.device!r}, reads {t.name} on {GPU}"
                assert op.type != "InspectorLogStats", f"the CPU-only fused kernel reads {t.name} on {GPU}"


def test_unpinned_tensors_skip_the_fused_kernel_where_a_gpu_is_visible(monkeypatch):
    """TensorFlow places unpinned ops on a visible GPU: the CPU-only kernel must not read them."""
    monkeypatch.setattr(fast_stats, "gpu_visible", lambda: True)
    with tf.Graph().as_default():
        caps = _graph({})
        fast_stats.build_stats(caps, tf.constant([1, 0, 0, 1, 1, 0], tf.int32), use_native=True)
        assert "InspectorLogStats" not in {op.type for op in v1.get_default_graph().get_operations()}


def test_gpu_pinned_statistics_match_the_reference_on_cpu():
    """Soft placement runs the GPU-pinned graph on this CPU: the numbers of the reference."""
    with tf.Graph().as_default():
        caps = _graph({i: GPU for i in range(5)})
        gid = tf.constant([1, 0, 0, 1, 1, 0], tf.int32)
        with tf.device(""):
            ref = exact_stats.build_stats(caps, gid)
        fast = fast_stats.build_stats(caps, gid, use_native=True)
        assert ref.rows == fast.rows
        dump, _ = capture.build_dump(caps, tf.constant([0, 2], tf.int32))
        config = v1.ConfigProto(allow_soft_placement=True)
        with v1.Session(config=config) as s:
            r, f, d, x = s.run([ref.tensors(), fast.tensors(), dump, [c.tensor for c in caps]])
    np.testing.assert_allclose(f[0], r[0], rtol=1e-5, atol=1e-6, equal_nan=True)
    for a, b in zip(f[1:], r[1:]):   # the histograms' splits, bucket indices and counts: exact
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(d["forward/t1:0"], x[1][[0, 2]])  # kept samples, gathered on the device
    np.testing.assert_array_equal(d["forward/t2:0"], x[2])          # not batched: the whole tensor
