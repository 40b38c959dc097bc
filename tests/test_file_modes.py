"""Files a run or an export creates get the process umask, like a plain open(), and no
import reads the umask (reading it means setting it: racy with other threads)."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from inspector.cli import write_file
from inspector.storage.atomic import atomic_write, create_temporary
from inspector.format import is_temporary

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def umask():
    """Set the umask for one test; the previous one comes back after it."""
    previous = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(previous)


@pytest.mark.parametrize("mask, mode", [(0o027, 0o640), (0o022, 0o644), (0o077, 0o600)])
def test_written_files_get_the_umask(tmp_path, umask, mask, mode):
    umask(mask)
    atomic_write(tmp_path / "run" / "manifest.chief.s0001.json", [b"{}"], fsync=False)
    write_file(tmp_path / "out.csv", lambda f: f.write(b"a\n"))
    for p in (tmp_path / "run" / "manifest.chief.s0001.json", tmp_path / "out.csv"):
        assert stat.S_IMODE(p.stat().st_mode) == mode, p
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["manifest.chief.s0001.json", "out.csv"]


def test_temporary_names_are_hidden_and_fresh(tmp_path):
    fds = [create_temporary(tmp_path / "x.json") for _ in range(3)]
    for fd, _ in fds:
        os.close(fd)
    names = {Path(name).name for _, name in fds}
    assert len(names) == 3 and all(is_temporary(n) and n.startswith(".x.json.") for n in names)


def test_no_import_touches_the_umask():
    code = ("import os\ncalls = []\nreal = os.umask\nos.umask = lambda m: calls.append(m) or real(m)\n"
            "import inspector, inspector.format, inspector.writer, inspector.run, inspector.cli\nprint(calls)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_human_bytes_uses_binary_units():
    from inspector.sizes import human_bytes
    assert [human_bytes(n) for n in (0, 1023, 1536, 3 * 2**20, 5 * 2**30, 2**41)] == [
        "0 B", "1023 B", "1.5 KiB", "3.0 MiB", "5.0 GiB", "2.0 TiB"]
