"""``inspector.options.WriterOptions``: the writer's settings, checked once (before the lock is
taken), taken by ``RunWriter`` as ``options=`` or as keywords (never both), with the keywords'
defaults the options' own; and ``hooks.CaptureOptions`` hands its writing options over in one."""
from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest

import inspector
from hooks.options import OPTION_NAMES, CaptureOptions
from inspector.format import lock_name
from inspector.options import WriterOptions
from inspector.writer import RunWriter

#: RunWriter's own parameters: everything else in its signature is a setting (WriterOptions)
OWN = {"run_dir", "worker", "manifest", "stats_layout", "graph_def", "mode", "owner_gone",
       "options"}
MANIFEST = {"tensors": []}
#: settings worth comparing, none at its default
SOME = dict(max_bytes=10 ** 6, queue_size=3, dump_threads=1, stats_flush_secs=0.5,
            heartbeat_secs=30, fsync=True, strict=True, timeout=5, spill_bytes=1 << 20,
            compact_rows=1000, format_version=3)


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_bytes=-1), r"max_bytes=-1 must be a byte count >= 0 or None \(no budget\)"),
    (dict(max_bytes="1G"), r"max_bytes='1G' must be a byte count"),
    (dict(queue_size=0), r"queue_size=0 must be an int >= 1"),
    (dict(queue_size=2.5), r"queue_size=2.5 must be an int >= 1"),
    (dict(dump_threads=0), r"dump_threads=0 must be an int >= 1"),
    (dict(stats_flush_secs=float("nan")), r"stats_flush_secs=nan must be seconds >= 0"),
    (dict(heartbeat_secs=0), r"heartbeat_secs=0 must be seconds above 0 and at most 1,000,000"),
    (dict(heartbeat_secs=10 ** 7), r"heartbeat_secs=10000000 must be seconds above 0"),
    (dict(storage_options="anon"),
     r"storage_options='anon' must be a dict of fsspec options or None"),
    (dict(timeout=0), r"timeout=0 must be a positive number of seconds"),
    (dict(spill_bytes=-1), r"spill_bytes=-1 must be a byte count >= 0"),
    (dict(compact_rows=0), r"compact_rows=0 must be an int >= 1 or None \(never compact\)"),
    (dict(format_version=inspector.FORMAT_VERSION + 1),
     rf"format_version={inspector.FORMAT_VERSION + 1} must be an int from 1 to "
     rf"{inspector.FORMAT_VERSION}"),
    (dict(fsync=True, queue_size=True), r"queue_size=True must be an int >= 1"),
])
def test_a_bad_setting_is_refused_naming_it_and_what_is_right(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WriterOptions(**kwargs)


def test_a_bad_setting_is_refused_before_the_lock_is_taken(tmp_path):
    """Checked in the options, not halfway through the session's start: a refused setting used
    to leave its worker's lock behind (the next writer of this process found it held)."""
    with pytest.raises(ValueError, match="compact_rows=0"):
        RunWriter(tmp_path, manifest=MANIFEST, compact_rows=0)
    assert not (tmp_path / lock_name("chief")).exists()
    w = RunWriter(tmp_path, manifest=MANIFEST)
    assert w.session == 1
    w.close()


def test_a_failed_start_releases_the_lock(tmp_path, monkeypatch):
    """Whatever fails after the lock is taken (here the folders) gives it back."""
    def refuse(self, sub=""):
        raise PermissionError(13, "Permission denied", sub)
    monkeypatch.setattr(type(inspector.storage.open_storage(tmp_path)), "makedirs", refuse)
    with pytest.raises(PermissionError):
        RunWriter(tmp_path, manifest=MANIFEST)
    assert not (tmp_path / lock_name("chief")).exists()
    monkeypatch.undo()
    w = RunWriter(tmp_path, manifest=MANIFEST)
    w.close()


def test_keywords_and_options_give_the_same_writer(tmp_path):
    by_keywords = RunWriter(tmp_path / "a", manifest=MANIFEST, **SOME)
    opts = WriterOptions(**SOME)
    by_options = RunWriter(tmp_path / "b", manifest=MANIFEST, options=opts)
    assert by_options.options is opts and by_keywords.options == opts
    assert RunWriter(tmp_path / "c", manifest=MANIFEST).options == WriterOptions()
    for w in (by_keywords, by_options):
        assert w._dumps.maxsize == 3 and w._compactor.rows == 1000 and w._compactor.fsync
        assert w.add_dump(1, {"forward/a:0": np.zeros(4, np.float32)})
        assert not w.add_dump(2, {"forward/a:0": np.zeros(10 ** 6, np.float32)})   # over max_bytes
        w.close()
        m = inspector.open_run(w.run_dir).manifest
        assert (m["format_version"], m["heartbeat_secs"], m["dumps_written"]) == (3, 30, 1)
        assert "max_bytes=1000000" in m["dropped"][0]["reason"]


def test_a_setting_given_both_ways_is_refused(tmp_path):
    opts = WriterOptions(fsync=True)
    with pytest.raises(TypeError, match=r"RunWriter got queue_size, fsync and options=: give each "
                                        r"option one way.*dataclasses.replace\(options, "
                                        r"queue_size=..., fsync=...\)"):
        RunWriter(tmp_path, manifest=MANIFEST, queue_size=2, fsync=True, options=opts)
    with pytest.raises(TypeError, match=r"options=\{'fsync': True\}\): options= takes an "
                                        r"inspector.options.WriterOptions"):
        RunWriter(tmp_path, manifest=MANIFEST, options={"fsync": True})
    assert not (tmp_path / lock_name("chief")).exists()


def test_keyword_defaults_are_the_options_defaults():
    """Every setting is a keyword-only argument of RunWriter with WriterOptions' default, and
    nothing else in its signature is unaccounted for: a default changed in one place, or a
    setting added to one of the two only, fails here."""
    defaults = {f.name: f.default for f in dataclasses.fields(WriterOptions)}
    assert len(defaults) >= 13 and all(d is not dataclasses.MISSING for d in defaults.values())
    params = inspect.signature(RunWriter).parameters
    assert set(params) - OWN == set(defaults)
    for name, default in defaults.items():
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name
        assert params[name].default == default, name


def test_the_hooks_writing_options_are_the_writers():
    """Options that CaptureOptions and WriterOptions share mean the same, with the same default,
    except the byte budget (a hook's run is bounded by default; a bare writer is not)."""
    shared = set(OPTION_NAMES) & {f.name for f in dataclasses.fields(WriterOptions)}
    assert shared == {"max_bytes", "queue_size", "stats_flush_secs", "fsync", "strict",
                      "storage_options"}
    assert CaptureOptions().writer_options == WriterOptions(max_bytes=CaptureOptions().max_bytes)
    some = dict(max_bytes=5, queue_size=2, stats_flush_secs=0, fsync=True, strict=True,
                storage_options={"a": 1})
    assert CaptureOptions(**some).writer_options == WriterOptions(**some)
    with pytest.raises(ValueError, match="queue_size=-1 must be an int >= 1"):
        CaptureOptions(queue_size=-1)   # refused with the other options, not when a session opens
