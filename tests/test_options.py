"""``hooks.CaptureOptions``: the options DumpHook and InspectCallback share, checked once, taken
as ``options=`` or as keywords (never both), with the keywords' defaults the options' own."""
from __future__ import annotations

import dataclasses
import inspect
import logging

import pytest

from hooks.options import MAX_CLASS_GROUPS, OPTION_NAMES, CaptureOptions, takes_options
from inspector.options import WriterOptions

#: each class's own parameters: everything else in its signature is a shared option
OWN = {"DumpHook": {"run_dir", "loss", "labels", "predictions", "share_gradients", "mode", "eval_stats_batches",
                    "eval_dump_batches", "options"},
       "InspectCallback": {"run_dir", "probe", "source", "training", "options"}}

#: options worth comparing, none at its default
SOME = dict(include=["dense", "relu"], exclude="/dropout/", op_types=["MatMul"], dtypes=["float32"],
            stats_every_n_steps=5, dump_every_n_steps=0, dump_steps=[3, "10:12"], dump_on_nonfinite=True,
            groups="per_class", num_classes=3, samples_per_group=4, max_bytes=10 ** 6, gradients=False,
            worker="w1", queue_size=2, stats_flush_secs=0.5, fsync=True, strict=True, batched="x", unbatched="y",
            storage_options={"anon": True}, native_stats=False)


@pytest.mark.parametrize("kwargs, message", [
    (dict(samples_per_group=-1), "samples_per_group=-1 must be >= 0"),
    (dict(samples_per_group=1.5), "samples_per_group=1.5 must be >= 0"),
    (dict(max_bytes=-5), r"max_bytes=-5 must be a byte count >= 0 or None"),
    (dict(include="conv(["), r"bad regular expression 'conv\(\[' in include/exclude"),
    (dict(unbatched=["ok", "("]), r"bad regular expression '\('"),
    (dict(stats_every_n_steps=-10), "stats_every_n_steps=-10 must be a non-negative int or None"),
    (dict(dump_steps=[(9, 3)]), "dump_steps range 9:3 is empty or negative"),
    (dict(dump_steps=["9:3"]), "dump_steps entry: step range '9:3' is empty"),
    (dict(dump_steps=[1.5]), "dump_steps entry 1.5 must be a step"),
    (dict(groups="per-class"), "groups='per-class' must be None .positive/negative., 'per_class' or a function"),
    (dict(groups="per_class", positive=lambda y: y > 0), "positive= chooses the positive/negative groups"),
    (dict(num_classes=0), "num_classes=0 must be a positive int"),
    (dict(groups="per_class", num_classes=MAX_CLASS_GROUPS + 1), f"at most {MAX_CLASS_GROUPS} groups"),
    (dict(dtypes="float32"), r"dtypes='float32' must be a sequence of dtypes, e.g. \('float32',\)"),
    (dict(queue_size=0), r"queue_size=0 must be an int >= 1"),   # the writer's settings, too
    (dict(stats_flush_secs=-1), r"stats_flush_secs=-1 must be seconds >= 0"),
])
def test_a_bad_value_is_refused_naming_it(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CaptureOptions(**kwargs)


def test_good_values_are_taken_and_the_derived_settings_follow():
    opts = CaptureOptions(**SOME)
    assert opts.schedule.to_json() == {"stats_every_n_steps": 5, "dump_every_n_steps": 0,
                                       "dump_steps": [[3, 3], [10, 12]]}
    assert opts.batch_overrides == {"batched": "x", "unbatched": "y"}
    assert opts.writer_options == WriterOptions(max_bytes=10 ** 6, queue_size=2,
                                                stats_flush_secs=0.5, strict=True, fsync=True,
                                                storage_options={"anon": True})
    config = opts.manifest_config(native_ran=False, dtypes=[type("D", (), {"name": "float32"})()])
    assert config["include"] == ["dense", "relu"] and config["exclude"] == "/dropout/"
    assert config["dtypes"] == ["float32"] and config["samples_per_group"] == 4 and config["native_stats"] is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.fsync = False   # type: ignore[misc]


def test_histogram_bins_is_accepted_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="tf_inspector"):
        CaptureOptions(histogram_bins=30)
    assert "histogram_bins=30 is ignored" in caplog.text


class _Owner:
    """A class taking the options as DumpHook and InspectCallback do, without TensorFlow."""

    @takes_options
    def __init__(self, run_dir, *, own=1, options=None, **_shared):
        self.run_dir, self.own, self.options = run_dir, own, options


def test_takes_options_resolves_keywords_and_refuses_both_ways():
    assert _Owner("d").options == CaptureOptions()
    assert _Owner("d", own=2, **SOME).options == _Owner("d", own=2, options=CaptureOptions(**SOME)).options
    opts = CaptureOptions(fsync=True)
    assert _Owner("d", options=opts, own=3).options is opts
    with pytest.raises(TypeError, match=r"_Owner got fsync, worker and options=: give each option one way.*"
                                        r"dataclasses.replace\(options, fsync=..., worker=...\)"):
        _Owner("d", options=opts, fsync=True, worker="w")
    with pytest.raises(TypeError, match=r"options=\{'fsync': True\}\): options= takes a hooks.CaptureOptions"):
        _Owner("d", options={"fsync": True})
    with pytest.raises(ValueError, match="samples_per_group=-2 must be >= 0"):
        _Owner("d", samples_per_group=-2)


def _classes():
    pytest.importorskip("tensorflow")
    from hooks import DumpHook
    from hooks.keras import InspectCallback
    return DumpHook, InspectCallback


def test_keyword_defaults_are_the_options_defaults():
    """Every shared option is a keyword-only argument of both classes with CaptureOptions'
    default, and nothing else in their signatures is unaccounted for: a default changed in one
    place, or an option added to one class only, fails here."""
    defaults = {f.name: f.default for f in dataclasses.fields(CaptureOptions)}
    assert len(defaults) >= 25 and all(d is not dataclasses.MISSING for d in defaults.values())
    for cls in _classes():
        params = inspect.signature(cls).parameters
        assert set(params) - OWN[cls.__name__] == set(OPTION_NAMES), cls.__name__
        for name in OPTION_NAMES:
            assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, (cls.__name__, name)
            assert params[name].default == defaults[name], (cls.__name__, name)


def test_both_ways_of_passing_give_the_same_settings(tmp_path):
    for cls in _classes():
        by_keywords = cls(str(tmp_path / "a"), **SOME)
        by_options = cls(str(tmp_path / "b"), options=CaptureOptions(**SOME))
        assert by_keywords.options == by_options.options == CaptureOptions(**SOME), cls.__name__
        assert by_keywords.filters == by_options.filters, cls.__name__
        assert [d.name for d in by_options.filters["dtypes"]] == ["float32"]
        assert by_options.schedule.to_json() == CaptureOptions(**SOME).schedule.to_json()
        assert (by_options.worker, by_options.strict) == ("w1", True)
        assert by_options.group_spec.kind == "per_class" and by_options.group_spec.num_classes == 3
        default = cls(str(tmp_path / "c"))
        assert default.options == CaptureOptions() and default.schedule.to_json()["stats_every_n_steps"] == 100


def test_the_classes_refuse_an_option_given_both_ways_and_bad_values(tmp_path):
    for cls in _classes():
        with pytest.raises(TypeError, match=f"{cls.__name__} got samples_per_group and options=: give each option "
                                            f"one way"):
            cls(str(tmp_path / "a"), samples_per_group=3, options=CaptureOptions())
        with pytest.raises(ValueError, match=r"bad regular expression '\[' in include/exclude"):
            cls(str(tmp_path / "a"), exclude="[")
        with pytest.raises(ValueError, match=r"dtypes entry 'flot32' is not a dtype.*dtypes=\['float32'\]"):
            cls(str(tmp_path / "a"), dtypes=["flot32"])
