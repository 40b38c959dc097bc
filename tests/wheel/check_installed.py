"""The package as a user gets it: run by ``.ci/run`` with a clean venv's Python, from a folder
outside the checkout, after ``pip install tf_inspector-*.whl[viewer]`` (no TensorFlow).

Not collected by the suite (``pytest tests`` runs the checkout's code): CI copies this file to
a temporary folder and runs ``python -m pytest -p no:cacheprovider check_installed.py`` there.
``TF_INSPECTOR_CHECKOUT`` names the checkout, which nothing here may import from.
"""
from __future__ import annotations

import importlib.metadata
import importlib.resources
import importlib.util
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import inspector
import viewer
from inspector.testing import make_synthetic_run

CHECKOUT = Path(os.environ["TF_INSPECTOR_CHECKOUT"]).resolve()
CORE = {"numpy", "pandas", "pyarrow", "safetensors", "tqdm"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    make_synthetic_run(root / "exp1", steps=20, tensors=10, dump_every=10, nonfinite_at=15)
    return root


def test_packages_come_from_the_installed_wheel():
    for mod in (inspector, viewer):
        where = Path(mod.__file__).resolve()
        assert CHECKOUT not in where.parents, f"{mod.__name__} imported from the checkout: {where}"
        assert "site-packages" in where.parts, where
    assert importlib.util.find_spec("tensorflow") is None, "the viewer and reader must not need TensorFlow"


def test_every_module_of_the_checkout_ships():
    """Packages are found, not listed (pyproject.toml): each module of the checkout's three packages
    is in the wheel, so a new subpackage cannot be left out."""
    for package in ("inspector", "hooks", "viewer"):
        installed = Path(importlib.util.find_spec(package).origin).parent
        ours = {p.relative_to(CHECKOUT / package) for p in (CHECKOUT / package).rglob("*.py")
                if "__pycache__" not in p.parts}
        shipped = {p.relative_to(installed) for p in installed.rglob("*.py")}
        assert ours and ours <= shipped, f"{package}: not in the wheel: {sorted(map(str, ours - shipped))}"


def test_the_wheel_declares_its_type_hints_and_version():
    """PEP 561 markers in each package, and one version: the wheel's metadata and the code's."""
    for package in ("inspector", "hooks", "viewer"):
        assert importlib.resources.files(package).joinpath("py.typed").is_file(), package
    assert importlib.metadata.version("tf-inspector") == inspector.__version__


def test_core_requirements_leave_out_the_viewer_and_tensorflow():
    """A training node installs the core: no Streamlit, Matplotlib or pinned tensorflow-cpu."""
    core = {re.split(r"[ ;<>=!~\[]", r, maxsplit=1)[0].lower()
            for r in importlib.metadata.requires("tf-inspector") if "extra ==" not in r}
    assert core == CORE


def test_cli_info_and_console_script(runs):
    for cmd in ([sys.executable, "-m", "inspector"], [str(Path(sys.executable).with_name("tf-inspector"))]):
        p = subprocess.run([*cmd, "info", str(runs / "exp1")], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert "run        " in p.stdout and "anomalies  first NaN/Inf: " in p.stdout
        assert "diagnosis  Most likely culprit (nonfinite" in p.stdout


def test_viewer_entry_ships_in_the_package_and_draws(runs, monkeypatch):
    script = importlib.resources.files("viewer").joinpath("app_main.py")
    assert script.is_file()
    monkeypatch.setenv("TF_INSPECTOR_RUNS", str(runs / "exp1"))
    at = AppTest.from_file(str(script), default_timeout=120).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.header[0].value == "Run exp1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_app_serves_the_viewer(runs):
    """``python -m inspector app`` finds the viewer's script in site-packages and serves it."""
    port = _free_port()
    env = {**os.environ, "STREAMLIT_SERVER_HEADLESS": "true", "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "inspector", "app", str(runs), "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"exited with {proc.returncode}: {proc.stdout.read()[-3000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                    if r.read().strip() == b"ok":
                        return
            except OSError:
                time.sleep(0.3)
        pytest.fail("the viewer did not answer within 90 s")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
