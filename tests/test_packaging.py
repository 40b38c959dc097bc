"""A library that behaves as one: the core (hook writer, reader, CLI) needs neither Streamlit nor
Matplotlib, the viewer is found inside the package, and the hook leaves logging to the
application."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Run in a fresh interpreter where importing streamlit or matplotlib fails, as on a training
#: node with the core install only.
WITHOUT_VIEWER_DEPS = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in ("streamlit", "matplotlib"):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
            return None

    sys.meta_path.insert(0, Block())
    from pathlib import Path
    import inspector
    from inspector import cli
    from inspector.testing import make_synthetic_run

    run_dir = Path(sys.argv[2]) / "exp1"
    make_synthetic_run(run_dir, steps=10, tensors=6, dump_every=5)
    run = inspector.open_run(run_dir)
    assert len(run.stats) and run.steps, run.steps
    run.tensor(run.tensors.index[0], step=run.steps[-1])
    assert cli.main(["info", str(run_dir)]) == 0
    assert cli.main(["export", str(run_dir), "--format", "csv", "--out", str(run_dir.parent / "s.csv")]) == 0
    print("app status", cli.main(["app", str(run_dir)]))
    try:
        import inspector.analysis.plots
    except ModuleNotFoundError as e:
        print("plots:", e)
    assert not {"streamlit", "matplotlib"} & set(sys.modules), "imported a blocked module"
    print("core ok")
""")


@pytest.fixture(scope="module")
def core_only(tmp_path_factory) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_VIEWER_DEPS, str(ROOT), str(tmp_path_factory.mktemp("core"))],
                          capture_output=True, text=True, timeout=300)


def test_reader_and_cli_need_no_viewer_dependencies(core_only):
    assert core_only.returncode == 0, core_only.stderr[-3000:]
    assert "core ok" in core_only.stdout and "run        " in core_only.stdout  # info's summary


def test_app_without_streamlit_says_how_to_install(core_only):
    assert "app status 2" in core_only.stdout
    line = [x for x in core_only.stderr.splitlines() if x.startswith("error:")]
    assert line == ["error: the viewer needs streamlit and matplotlib: pip install 'tf-inspector[viewer]'"]
    assert "Traceback" not in core_only.stderr
    assert "plots: inspector.analysis.plots needs matplotlib" in core_only.stdout


def test_the_cli_finds_the_viewer_inside_the_package(monkeypatch):
    """``app`` runs ``streamlit run`` on viewer/app.py, wherever the package is installed."""
    pytest.importorskip("streamlit")
    from inspector import cli
    calls = []
    monkeypatch.setattr(cli, "serve", lambda cmd: calls.append(cmd) or 0)
    assert cli.main(["app", "runs", "--port", "8600"]) == 0
    import viewer
    script = Path(calls[0][calls[0].index("run") + 1])
    assert script == Path(viewer.__file__).parent / "app.py" and script.is_file()
    assert calls[0][-2:] == ["--", "runs"] and "8600" in calls[0]
    i = calls[0].index("--browser.gatherUsageStats")   # no usage statistics sent: no network at run time
    assert calls[0][i + 1] == "false"


def test_importing_hooks_configures_no_logging():
    pytest.importorskip("tensorflow")
    import hooks  # noqa: F401
    log = logging.getLogger("tf_inspector")
    assert not log.handlers and log.propagate and log.level == logging.NOTSET


def test_hook_errors_reach_stderr_with_no_logging_set_up(tmp_path):
    """A user who configured no logging still sees a refused or failed hook: a DumpHook whose
    run directory cannot be created (a file is in the way) logs an error that Python's
    last-resort handler prints; training goes on."""
    pytest.importorskip("tensorflow")
    (tmp_path / "blocker").write_text("a file, not a directory")
    code = textwrap.dedent(f"""
        import tensorflow as tf
        from hooks import DumpHook
        from tfmodels import build_cnn
        with tf.Graph().as_default():
            m = build_cnn()
            hook = DumpHook({str(tmp_path / "blocker" / "run")!r}, labels=m.y, stats_every_n_steps=1,
                            native_stats=False)
            with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as s:
                s.run(m.train_op, feed_dict=m.feed(0))
        print("TRAINED")
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]), "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=300)
    assert "TRAINED" in out.stdout, out.stderr[-2000:]
    assert "DumpHook" in out.stderr and "disabled" in out.stderr, out.stderr[-2000:]


def test_the_hook_says_what_it_picked_through_logging(tmp_path, caplog, monkeypatch):
    """INFO records reach the application's handlers (here caplog's, on the root logger)."""
    tf = pytest.importorskip("tensorflow")
    monkeypatch.setenv("TF_INSPECTOR_NATIVE", "0")  # no kernel build: only the messages matter
    from hooks import DumpHook, native
    from tfmodels import build_cnn
    native.library.cache_clear()
    with tf.Graph().as_default():
        m = build_cnn()
        hook = DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=1)
        with caplog.at_level(logging.INFO, logger="tf_inspector"):
            with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as sess:
                sess.run(m.train_op, m.feed(1))
    native.library.cache_clear()
    picked = [r.getMessage() for r in caplog.records if r.name == "tf_inspector" and r.levelno == logging.INFO]
    assert any(p.startswith("labels: ") for p in picked) and any(p.startswith("capturing ") for p in picked)
