"""DumpHook writing to object storage: the same training to local disk and to an S3 bucket
(moto server over HTTP) reads back identically; the graph too. Two TF_CONFIG-style workers
(hook ``worker=``) write one bucket run."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")  # first: the imports below (noqa: E402) need TensorFlow
import inspector  # noqa: E402
from hooks import DumpHook  # noqa: E402
from s3server import s3_fixture  # noqa: E402,F401  (registers the fixture ``s3``)
from test_storage import assert_same_reads  # noqa: E402
from tfmodels import build_cnn  # noqa: E402

v1 = tf.compat.v1


def _train(run_dir, steps=4, **hook_args):
    with tf.Graph().as_default():
        m = build_cnn()
        hook = DumpHook(run_dir, labels=m.y, stats_every_n_steps=1, dump_every_n_steps=4, samples_per_group=4,
                        strict=True, **hook_args)
        # one thread per op: reductions then sum in one order, so two trainings agree bit for bit
        config = v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
        with v1.train.MonitoredTrainingSession(hooks=[hook], checkpoint_dir=None, config=config) as sess:
            for step in range(1, steps + 1):
                sess.run(m.train_op, m.feed(step))


def test_same_training_reads_the_same_from_disk_and_bucket(tmp_path, s3):
    _train(tmp_path / "run", steps=8)
    url = s3.url("hook")
    _train(url, steps=8, storage_options=s3.options)
    local = inspector.open_run(tmp_path / "run")
    remote = inspector.open_run(url, storage_options=s3.options)
    assert remote.steps == [4, 8]
    assert_same_reads(local, remote)
    nodes = [[n.name for n in v1.GraphDef.FromString(r.graph_def_bytes()).node] for r in (local, remote)]
    assert nodes[0] == nodes[1] and "conv1/relu" in nodes[0]  # (attributes such as seeds differ per graph)
    x = remote.tensor("conv1/relu:0", 8, kind="gradient")
    assert np.abs(x).sum() > 0


def test_two_workers_one_bucket_run(s3):
    url = s3.url("hook2")
    _train(url, worker="worker-0", storage_options=s3.options)
    _train(url, worker="worker-1", storage_options=s3.options)
    _train(url, worker="worker-0", storage_options=s3.options)  # a rerun: its next session
    run = inspector.open_run(url, storage_options=s3.options)
    assert sorted(run.workers) == ["worker-0", "worker-1"] and run.problems == []
    s = run.sessions
    assert sorted(zip(s.worker, s.session)) == [("worker-0", 1), ("worker-0", 2), ("worker-1", 1)]
    assert run.dump_steps(worker="worker-1") == [4]
    with pytest.raises(inspector.InspectorError, match="worker="):
        run.histogram("conv1/relu:0", 4, worker="all")  # two workers recorded it: refused, not picked
    a, b = (run.tensor("conv1/relu:0", 4, worker=w) for w in ("worker-0", "worker-1"))
    np.testing.assert_array_equal(a, b)  # the same training twice, each worker's own files
