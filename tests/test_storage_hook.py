"""DumpHook writing to object storage: the same training to local disk and to an S3 bucket
(moto server over HTTP) reads back identically; the graph too. Two TF_CONFIG-style workers
(hook ``worker=``) write one bucket run."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")  # first: the imports below (noqa: E402) need TensorFlow
import inspector  # noqa: E402
from inspector.format import manifest_name  # noqa: E402
from hooks import DumpHook  # noqa: E402
from s3server import s3_fixture  # noqa: E402,F401  (registers the fixture ``s3``)
from test_storage import assert_same_reads  # noqa: E402
from tfmodels import build_cnn  # noqa: E402

v1 = tf.compat.v1


def _train(run_dirs, steps=4, **hook_args):
    """Train the test CNN with one DumpHook per run directory, all in the same session: each
    step's tensors are computed once and every hook records those same values (two separate
    trainings need not agree bit for bit: a variable's read and its update are unordered)."""
    with tf.Graph().as_default():
        m = build_cnn()
        hooks = [DumpHook(d, labels=m.y, stats_every_n_steps=1, dump_every_n_steps=4, samples_per_group=4,
                          strict=True, **({"storage_options": opts} if opts else {}), **hook_args)
                 for d, opts in run_dirs]
        with v1.train.MonitoredTrainingSession(hooks=hooks, checkpoint_dir=None) as sess:
            for step in range(1, steps + 1):
                sess.run(m.train_op, m.feed(step))


def test_same_training_reads_the_same_from_disk_and_bucket(tmp_path, s3):
    url = s3.url("hook")
    _train([(tmp_path / "run", None), (url, s3.options)], steps=8)
    local = inspector.open_run(tmp_path / "run")
    remote = inspector.open_run(url, storage_options=s3.options)
    assert remote.steps == [4, 8]
    assert_same_reads(local, remote, same_bytes=False)
    # the second hook's graph holds the first hook's ops too: that, and only that, differs (and the
    # manifest's accounting of them)
    graphs = [r.graph_def_bytes() for r in (local, remote)]
    nodes = [{n.name for n in v1.GraphDef.FromString(g).node} for g in graphs]
    assert "conv1/relu" in nodes[0] and nodes[0] < nodes[1]
    assert remote.sessions["bytes"][0] - local.sessions["bytes"][0] == len(graphs[1]) - len(graphs[0])
    manifests = [len(r.store.read(manifest_name("chief", 1))) for r in (local, remote)]
    assert remote.size_bytes() - local.size_bytes() == len(graphs[1]) - len(graphs[0]) + manifests[1] - manifests[0]
    x = remote.tensor("conv1/relu:0", 8, kind="gradient")
    assert np.abs(x).sum() > 0


def test_two_workers_one_bucket_run(s3):
    url = s3.url("hook2")
    _train([(url, s3.options)], worker="worker-0")
    _train([(url, s3.options)], worker="worker-1")
    _train([(url, s3.options)], worker="worker-0")  # a rerun: its next session
    run = inspector.open_run(url, storage_options=s3.options)
    assert sorted(run.workers) == ["worker-0", "worker-1"] and run.problems == []
    s = run.sessions
    assert sorted(zip(s.worker, s.session)) == [("worker-0", 1), ("worker-0", 2), ("worker-1", 1)]
    assert run.dump_steps(worker="worker-1") == [4]
    with pytest.raises(inspector.InspectorError, match="worker="):
        run.histogram("conv1/relu:0", 4, worker="all")  # two workers recorded it: refused, not picked
    a, b = (run.tensor("conv1/relu:0", 4, worker=w) for w in ("worker-0", "worker-1"))
    np.testing.assert_array_equal(a, b)  # the same training twice, each worker's own files
