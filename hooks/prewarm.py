"""Build a sampled step's executor before that step, on a thread of its own.

A TF1 session builds an executor (the graph pruned to the run, Grappler's passes, the kernels)
the first time it runs a new signature: the names of its feeds, fetches and targets
(``DirectSession::GetOrCreateExecutors``). A sampled step adds the hook's fetches to the training
run's, so its first occurrence pays that build inside the training step (0.2-0.3 s on the bench
ResNet on a quiet machine, seconds under load).

A run whose ``RunOptions.inter_op_thread_pool`` is out of range builds and caches the executor of
its signature, then fails before any op runs (``DirectSession::Run`` checks the pool after
``GetOrCreateExecutors``): nothing is computed, read from an input or written. ``supported``
checks that the session answers so, with a constant, before any training fetch is run that way.
``Session.make_callable`` would not help: a callable's executors are its own, not the cache that
``session.run`` looks up.
"""
from __future__ import annotations

import logging
import threading
from typing import Any

import tensorflow as tf

v1 = tf.compat.v1
log = logging.getLogger(__name__)

BAD_POOL = -2   # below -1, the one value out of range for every session's list of pools
ENABLED = True  # read at a session's second training run; bench/bench_first_step.py compares


class RunRecorder:
    """Records the arguments of the next MonitoredSession run of one session object (fetches
    ``{"caller": ..., hook: ...}``), then steps aside; other runs pass through (a hook's own).

    Installed as the object's own ``run`` attribute until then: MonitoredSession hands the raw
    session every hook's fetches merged with the caller's, which no hook sees otherwise."""

    def __init__(self, session: Any):
        self.session = session
        self.args: tuple[Any, Any, Any] | None = None   # (fetches, feed_dict, options)
        self._run = session.run
        session.run = self._record

    def _record(self, fetches, feed_dict=None, options=None, run_metadata=None):
        if isinstance(fetches, dict) and "caller" in fetches:
            self.remove()
            self.args = (fetches, feed_dict, options)
        return self._run(fetches, feed_dict=feed_dict, options=options, run_metadata=run_metadata)

    def remove(self) -> None:
        """Give the session its class's ``run`` back (idempotent)."""
        if self.session.__dict__.get("run") is self._record:
            del self.session.__dict__["run"]


def _options(options: Any) -> Any:
    out = v1.RunOptions()
    if options is not None:
        out.CopyFrom(options)
    out.inter_op_thread_pool = BAD_POOL
    return out


def _debugged(options: Any) -> bool:
    """Whether a run is watched by a debugger (tfdbg's hook adds watches to its options): its
    executor is built anew for each run's dump folder, and a pre-build would publish a
    partition graph into the folder of the run it copied."""
    return options is not None and len(options.debug_options.debug_tensor_watch_opts) > 0


def build_only(session: Any, fetches: Any, feed_dict: Any = None, options: Any = None) -> bool:
    """Build the executor of ``session.run(fetches, feed_dict)`` and run nothing; True when the
    session refused the run for the pool as expected."""
    try:
        session.run(fetches, feed_dict=feed_dict, options=_options(options))
    except tf.errors.InvalidArgumentError as e:
        if "inter_op_thread_pool" in str(e):
            return True
        log.debug("pre-building a sampled step's executor failed: %s", e)
        return False
    log.info("this session executes runs with inter_op_thread_pool=%d: no pre-build", BAD_POOL)
    return False


def supported(session: Any) -> bool:
    """Whether this session refuses a run with an out-of-range pool (tried with a constant of its
    graph, which has nothing to change were the run executed)."""
    if not isinstance(session, v1.Session):   # wrapped sessions may run however they like
        return False
    const = next((op for op in session.graph.get_operations() if op.type == "Const"), None)
    return const is not None and build_only(session, const.outputs[0])


def start(session: Any, runs: list[tuple[Any, Any, Any]], name: str) -> threading.Thread:
    """Build each run's executor (``build_only``) in turn on a daemon thread: a training step
    that comes first builds its own, as it would have, and either copy serves later steps."""
    def work() -> None:
        if not supported(session):
            return
        for fetches, feed_dict, options in runs:
            if _debugged(options):
                continue
            try:
                build_only(session, fetches, feed_dict, options)
            except Exception as e:  # noqa: BLE001 - an optimisation: the step builds it instead
                log.debug("pre-building a sampled step's executor failed: %s", e)
    thread = threading.Thread(target=work, daemon=True, name=name)
    thread.start()
    return thread
