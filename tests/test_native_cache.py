"""The statistics kernel's cache: loaded only from a folder and file this user owns and no one
else may write; otherwise the hook falls back to stock ops and logs why (nothing compiled here).
The ahead-of-time build (`python -m hooks.native build`) fills the cache the hook loads from."""
from __future__ import annotations

import logging
import os
import stat
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")  # first: the imports below (noqa: E402) need TensorFlow
from hooks import native  # noqa: E402
from hooks.native.__main__ import main as native_main  # noqa: E402


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private cache folder; compiling and loading are recorded, never done."""
    d = tmp_path / "cache"
    monkeypatch.setenv("TF_INSPECTOR_CACHE", str(d))
    monkeypatch.delenv("TF_INSPECTOR_NATIVE", raising=False)
    monkeypatch.setattr(native, "_compiler", lambda: "c++-test")
    calls: list[str] = []
    monkeypatch.setattr(native.subprocess, "run", lambda *a, **k: calls.append("compile"))
    monkeypatch.setattr(native.tf, "load_op_library", lambda p: calls.append(f"load {p}") or "lib")
    native.library.cache_clear()
    yield d, calls
    native.library.cache_clear()


def refused(caplog, calls, why: str) -> None:
    with caplog.at_level(logging.WARNING, logger="tf_inspector"):
        assert native.library() is None
    assert calls == []
    assert why in caplog.text and "stock TensorFlow ops" in caplog.text


def test_new_cache_folder_is_private(cache):
    d, _ = cache
    assert native.private_cache_dir() == d
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700


def test_cached_library_in_a_private_folder_is_loaded(cache):
    d, calls = cache
    so = native.shared_object_path("c++-test")
    native.private_cache_dir()
    so.write_bytes(b"")
    so.chmod(0o700)
    assert native.library() == "lib" and calls == [f"load {so}"]


def test_world_writable_folder_is_refused(cache, caplog):
    d, calls = cache
    d.mkdir(mode=0o700)
    d.chmod(0o777)
    refused(caplog, calls, "writable by group or others (mode 777)")


def test_group_writable_library_is_refused(cache, caplog):
    d, calls = cache
    so = native.shared_object_path("c++-test")
    native.private_cache_dir()
    so.write_bytes(b"")
    so.chmod(0o775)
    refused(caplog, calls, "writable by group or others (mode 775)")


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another user needs root")
@pytest.mark.parametrize("what", ["folder", "file"])
def test_cache_owned_by_another_user_is_refused(cache, caplog, what):
    d, calls = cache
    so = native.shared_object_path("c++-test")
    native.private_cache_dir()
    so.write_bytes(b"")
    so.chmod(0o700)
    os.chown(d if what == "folder" else so, 12345, -1)
    refused(caplog, calls, "owned by uid 12345")


def test_ahead_of_time_build_is_what_the_hook_loads(cache, monkeypatch, capsys, caplog):
    """`python -m hooks.native build` compiles into the cache, shows compiler warnings in
    the log, and the hook's library() then loads that file without compiling again."""
    d, calls = cache

    def fake_compiler(cmd, **kw):
        calls.append("compile")
        Path(cmd[cmd.index("-o") + 1]).write_bytes(b"so")
        return subprocess.CompletedProcess(cmd, 0, "", "stats_ops.cc:1: warning: unused variable 'x'")
    monkeypatch.setattr(native.subprocess, "run", fake_compiler)
    with caplog.at_level(logging.WARNING, logger="tf_inspector"):
        assert native_main(["build"]) == 0
    so = native.shared_object_path("c++-test")
    assert capsys.readouterr().out.strip() == str(so) and so.read_bytes() == b"so"
    assert "unused variable 'x'" in caplog.text
    assert stat.S_IMODE(os.stat(so).st_mode) == 0o700
    assert native.library() == "lib" and calls == ["compile", f"load {so}"]


def test_ahead_of_time_build_fails_loudly(cache, monkeypatch, capsys):
    d, calls = cache
    monkeypatch.setattr(native.subprocess, "run",
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "", "stats_ops.cc:9: error: boom"))
    assert native_main(["build"]) == 1
    err = capsys.readouterr().err
    assert "not built" in err and "error: boom" in err
    assert not native.shared_object_path("c++-test").exists() and list(d.iterdir()) == []  # no temp left
    monkeypatch.setattr(native, "_compiler", lambda: None)
    assert native_main(["build"]) == 1 and "no C++ compiler" in capsys.readouterr().err
