"""``python -m inspector`` on damaged and hostile input: info reports what it cannot read and
goes on, export never overwrites, never writes through a symlink or into the run it reads."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inspector import cli
from inspector.testing import make_synthetic_run
from s3server import _free_port

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    make_synthetic_run(root / "a_good", steps=6, tensors=4, dump_every=3)
    make_synthetic_run(root / "c_good", steps=6, tensors=4, dump_every=3, seed=1)
    bad = root / "b_bad"
    bad.mkdir()
    (bad / "manifest.chief.json").write_text("{not json")
    return root


def cli_run(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "inspector", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, **kw)


def truncated_copy(src: Path, dst: Path) -> Path:
    import shutil
    shutil.copytree(src, dst)
    dump = sorted((dst / "dumps").iterdir())[-1]
    dump.write_bytes(dump.read_bytes()[:-100])               # data cut short, header intact
    return dump


# ---- info --------------------------------------------------------------------------------

def test_info_reports_a_truncated_dump(runs, tmp_path, capsys):
    dump = truncated_copy(runs / "a_good", tmp_path / "r")
    assert cli.main(["info", str(tmp_path / "r")]) == 1
    out = capsys.readouterr().out
    assert "(1 damaged, see below)" in out
    assert f"problem    damaged dump file {dump}" in out and "truncated" in out


def test_info_folder_reports_every_run_past_a_bad_one(runs):
    p = cli_run("info", str(runs))
    assert p.returncode == 2
    assert "Traceback" not in p.stderr
    assert p.stdout.count("run        ") == 2                      # a_good and c_good
    assert "a_good" in p.stdout and "c_good" in p.stdout
    errors = p.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith(f"error: {runs / 'b_bad'}: ")


@pytest.mark.parametrize("what", ["missing", "file"])
def test_info_on_a_file_or_missing_path_is_one_line(tmp_path, what):
    path = tmp_path / "x"
    if what == "file":
        path.write_text("hello")
    p = cli_run("info", str(path))
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("error: ")
    assert ("does not exist" if what == "missing" else "is not a directory") in p.stderr


def test_info_refuses_a_fifo_manifest_without_opening_it(runs, tmp_path):
    run = tmp_path / "fifo"
    run.mkdir()
    os.mkfifo(run / "manifest.chief.json")
    p = cli_run("info", str(run))                      # would block forever if opened
    assert p.returncode == 2 and "not a regular file" in p.stderr and "Traceback" not in p.stderr


def test_info_into_a_closed_pipe_is_quiet(runs):
    proc = subprocess.Popen([sys.executable, "-m", "inspector", "info", str(runs)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()                                            # like `| head -1` having exited
    err = proc.stderr.read()
    proc.wait(120)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert proc.returncode == 141


# ---- export ------------------------------------------------------------------------------

def export(run: Path, out: Path, *extra: str, fmt: str = "npz") -> int:
    return cli.main(["export", str(run), "--format", fmt, "--out", str(out), *extra])


def test_export_never_overwrites_without_force(runs, tmp_path, capsys):
    out = tmp_path / "x.npz"
    out.write_bytes(b"precious")
    assert export(runs / "a_good", out) == 2
    assert "exists; pass --force" in capsys.readouterr().err and out.read_bytes() == b"precious"
    assert export(runs / "a_good", out, "--force") == 0
    assert f"to {out}" in capsys.readouterr().out
    assert "step3/samples/index" in np.load(out).files
    assert [p.name for p in tmp_path.iterdir()] == ["x.npz"]       # no temporary file left


def test_export_refuses_symlinks(runs, tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (tmp_path / "link.npz").symlink_to(victim)
    assert export(runs / "a_good", tmp_path / "link.npz", "--force") == 2
    assert "symlink" in capsys.readouterr().err and victim.read_text() == "keep"
    (tmp_path / "real").mkdir()
    (tmp_path / "linkdir").symlink_to(tmp_path / "real")
    assert export(runs / "a_good", tmp_path / "linkdir" / "x.csv", fmt="csv") == 2
    assert "symlink" in capsys.readouterr().err and not list((tmp_path / "real").iterdir())


def test_export_refuses_to_write_into_the_run(runs, tmp_path, capsys):
    import shutil
    run = tmp_path / "r"
    shutil.copytree(runs / "a_good", run)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    for out in (run / "x.parquet", run / "stats", run / ".." / "r" / "dumps" / "y.parquet"):
        assert export(run, out, fmt="parquet") == 2
        assert "inside the run" in capsys.readouterr().err
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


def test_export_into_a_folder_names_the_file_after_the_run(runs, tmp_path, capsys):
    assert export(runs / "a_good", tmp_path, fmt="csv") == 0
    assert capsys.readouterr().out.strip().endswith(f"to {tmp_path / 'a_good.csv'}")
    assert (tmp_path / "a_good.csv").read_text().startswith("worker,session,mode,step,")
    assert export(runs / "a_good", tmp_path, "--steps", "3", fmt="npz") == 0
    assert capsys.readouterr().out.strip() .endswith(f"to {tmp_path / 'a_good.npz'}")
    assert all(k.startswith("step3/") for k in np.load(tmp_path / "a_good.npz").files)


def test_export_writes_exactly_the_name_it_prints(runs, tmp_path, capsys):
    assert export(runs / "a_good", tmp_path / "plain") == 0             # np.savez would add .npz
    assert capsys.readouterr().out.strip().endswith(f"to {tmp_path / 'plain'}")
    assert [p.name for p in tmp_path.iterdir()] == ["plain"]


def test_export_bad_steps_names_the_grammar(runs, tmp_path, capsys):
    assert export(runs / "a_good", tmp_path / "x.npz", "--steps", "9:2") == 2
    err = capsys.readouterr().err
    assert "'9:2'" in err and "A:B" in err and ":B" in err


def test_app_listens_on_localhost_by_default(monkeypatch):
    calls = []
    monkeypatch.setattr(cli, "serve", lambda cmd: calls.append(cmd) or 0)
    assert cli.main(["app", "runs"]) == 0
    assert cli.main(["app", "runs", "--address", "0.0.0.0"]) == 0
    first, second = calls
    assert first[first.index("--server.address") + 1] == "127.0.0.1"
    assert second[second.index("--server.address") + 1] == "0.0.0.0"


@pytest.mark.parametrize("options, says", [
    # nothing listens there: the client's connection error, one line
    ('{"endpoint_url": "http://127.0.0.1:%d", "key": "k", "secret": "s", '
     '"config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1}}', "EndpointConnectionError"),
    ('{"endpoint": "http://127.0.0.1:%d"}', "unexpected keyword argument 'endpoint'"),   # misspelt option
])
def test_info_on_an_unreachable_store_is_one_line(options, says, capsys):
    pytest.importorskip("s3fs")
    status = cli.main(["info", "s3://no-bucket/runs", "--storage-options", options % _free_port()])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and err.startswith("error: cannot read s3://no-bucket/runs")
    assert says in err and "endpoint_url" in err


def test_bad_storage_options_json_says_what_to_give(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["info", "s3://b/runs", "--storage-options", "{endpoint"])
    assert e.value.code == 2 and "is not JSON" in capsys.readouterr().err


def test_info_writes_session_steps_as_integers_beside_a_session_without_steps(tmp_path, capsys):
    """A session that recorded no step makes the sessions' step columns float (NaN): info still
    says 'steps 0..5', never '0.0..5.0'."""
    import shutil
    from inspector.writer import RunWriter
    shutil.copytree(make_synthetic_run(tmp_path / "r", steps=6, tensors=2), tmp_path / "r2")
    RunWriter(tmp_path / "r2", manifest={"model": "m"}).close()        # a second session, no steps
    assert cli.main(["info", str(tmp_path / "r2")]) == 0
    out = capsys.readouterr().out
    sessions = [line for line in out.splitlines() if line.startswith("session")]
    assert len(sessions) == 2 and "no steps" in sessions[1]
    assert " steps 0..5" in sessions[0] and ".0" not in sessions[0]


def test_app_takes_its_server_down_on_sigterm(tmp_path):
    """``tf-inspector app`` ran the viewer's server with ``subprocess.call``: a SIGTERM to it (a
    process manager, ``docker stop``, the wheel test's ``terminate()``) left the server running,
    orphaned, holding its port (seen: servers of earlier test runs still up). ``serve`` passes
    the signal on."""
    import signal
    import time
    child = "import os, time; print(os.getpid(), flush=True); time.sleep(120)"
    wrapper = subprocess.Popen([sys.executable, "-c", f"import sys; from inspector.cli import serve; "
                                f"sys.exit(serve([sys.executable, '-c', {child!r}]))"],
                               stdout=subprocess.PIPE, text=True)
    try:
        pid = int(wrapper.stdout.readline())   # the server stand-in is up
        wrapper.send_signal(signal.SIGTERM)
        wrapper.wait(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
            pytest.fail(f"the server stand-in {pid} outlived its SIGTERMed parent")
    finally:
        if wrapper.poll() is None:
            wrapper.kill()


def test_info_says_each_kind_of_skip_reason_once():
    """A racy read's reason names its variable and a TF2 cond output's its Identity: one reason
    per tensor in the manifest, which info printed as lines that looked the same (cut at 100
    characters). info sums them per kind of reason."""
    import pandas as pd

    racy = "it reads {}, which the training step writes, off the loss's path: in no order with the update"
    cond = "a TF2 cond's output that TensorFlow marks not fetchable; its value is {}, which the filters leave out"
    rows = [("captured", "in the catalog", 9)] + [("skipped", racy.format(f"dense_{i}/kernel"), 1) for i in range(4)] \
        + [("skipped", cond.format(f"cond/Identity_{i}:0"), 2) for i in range(2)]
    table = pd.DataFrame([{"status": s, "rule": None, "source": None, "what": w, "count": n, "examples": []}
                          for s, w, n in rows])

    class Run:
        def accounting(self):
            return table
    lines = [x for x in cli._accounting_lines(Run()) if x.startswith("skipped")]
    cut = [w[:47] + " ... " + w[-48:] for w in (racy.format("a variable"), cond.format("an Identity"))]
    assert lines == [f"skipped    4: {cut[0]}", f"skipped    4: {cut[1]}"], lines
    assert "accounting 17 float op outputs of the graph: 9 captured, 8 skipped" in cli._accounting_lines(Run())[0]
