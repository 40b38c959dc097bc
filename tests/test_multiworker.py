"""Several workers and asynchronous steps (issue 9)."""
from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")
import inspector  # noqa: E402
from hooks import DumpHook  # noqa: E402
from tfmodels import build_cnn  # noqa: E402

v1 = tf.compat.v1
STATS_EVERY, DUMP_EVERY = 5, 10


class _Jump(v1.train.SessionRunHook):
    """After run ``at`` (1-based), move the global step by ``by`` more, before the hooks listed
    after this one look at it: what other workers do during one of this worker's runs."""

    def __init__(self, global_step, at: int, by: int) -> None:
        self.op, self.at, self.runs = v1.assign_add(global_step, by), at, 0

    def after_run(self, run_context, run_values) -> None:
        self.runs += 1
        if self.runs == self.at:
            run_context.session.run(self.op)


def test_a_row_stands_for_every_multiple_up_to_its_step(tmp_path):
    """Run 15 fires statistics; during it the global step moves past 20 (to 21): the row says 21
    and stands for 15 and 20, so the next row is at 25, not at 22 (two rows between 20 and 25).
    Dumps have their own schedule: 20 was crossed without a dump, so the next run dumps."""
    with tf.Graph().as_default():
        m = build_cnn()
        hook = DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=STATS_EVERY, dump_every_n_steps=DUMP_EVERY,
                        strict=True)
        with v1.train.MonitoredTrainingSession(hooks=[_Jump(m.global_step, 15, 6), hook], save_summaries_steps=None,
                                               log_step_count_steps=None) as sess:
            for step in range(1, 25):
                sess.run(m.train_op, m.feed(step))
    run = inspector.open_run(tmp_path / "run")
    assert sorted(run.stats["step"].unique()) == [5, 10, 21, 25, 30]
    assert run.steps == [10, 22, 30]

