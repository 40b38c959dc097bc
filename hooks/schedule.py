"""Which global steps get statistics and which get full dumps (pure Python, no TensorFlow).

Example::

    s = Schedule(stats_every_n_steps=10, dump_every_n_steps=100,
                 dump_steps=[1, "500:510", (900, 905)])
    s.wants_stats(20), s.wants_dump(505)   # (True, True)

String entries use the project's one step grammar (``inspector.format.steps``): ``N``, ``A:B``,
``A:``, ``:B`` (inclusive), ``A-B`` as an alias of ``A:B``.
"""
from __future__ import annotations

from typing import Iterable, Union

from inspector.format.steps import FORMS, parse_step_range

StepSpec = Union[int, str, tuple, range]


def _parse_range(spec: StepSpec) -> tuple[int, int]:
    """An int, a step-range string (``inspector.format.steps``), (A, B) tuple or range -> inclusive
    (lo, hi)."""
    if isinstance(spec, bool):
        raise ValueError(f"dump_steps entry {spec!r} is not a step")
    if isinstance(spec, int):
        return spec, spec
    if isinstance(spec, range):
        if spec.step != 1:
            raise ValueError(f"dump_steps range {spec!r} must have step 1")
        return spec.start, spec.stop - 1
    if isinstance(spec, tuple) and len(spec) == 2 and all(isinstance(v, int) for v in spec):
        return spec
    if isinstance(spec, str):
        try:
            return parse_step_range(spec)
        except ValueError as e:
            raise ValueError(f"dump_steps entry: {e}; or a tuple (100, 110) or a "
                             "range(100, 111)") from None
    raise ValueError(f"dump_steps entry {spec!r} must be a step (200), a string {FORMS}, "
                     f"a tuple (100, 110) or a range(100, 111)")


class Schedule:
    """Sampling plan over global steps. ``0``/``None`` for an ``every`` disables it."""

    def __init__(self, stats_every_n_steps: int | None = 20, dump_every_n_steps: int | None = None,
                 dump_steps: Iterable[StepSpec] = ()) -> None:
        for name, v in (("stats_every_n_steps", stats_every_n_steps),
                        ("dump_every_n_steps", dump_every_n_steps)):
            if v is not None and (not isinstance(v, int) or v < 0):
                raise ValueError(f"{name}={v!r} must be a non-negative int or None")
        self.stats_every = stats_every_n_steps or 0
        self.dump_every = dump_every_n_steps or 0
        if isinstance(dump_steps, (int, str)):
            dump_steps = [dump_steps]
        self.ranges = [_parse_range(s) for s in dump_steps]
        for lo, hi in self.ranges:
            if lo > hi or lo < 0:
                raise ValueError(f"dump_steps range {lo}:{hi} is empty or negative")

    def wants_stats(self, step: int, since: int | None = None) -> bool:
        """Statistics due at ``step``: the global step crossed a multiple of N in (since, step]
        (``since`` defaults to step - 1: exactly the multiples). Under asynchronous training
        the global step jumps between one worker's runs; crossing fires once per multiple
        passed, at the first run after it."""
        return _crossed(self.stats_every, step - 1 if since is None else since, step)

    def wants_dump(self, step: int, since: int | None = None) -> bool:
        """A full dump due at ``step``: a multiple of ``dump_every_n_steps`` crossed, or a listed
        step or range reached, in (since, step]."""
        since = step - 1 if since is None else since
        if _crossed(self.dump_every, since, step):
            return True
        return any(lo <= step and hi > since for lo, hi in self.ranges)

    def next_step(self, after: int) -> int | None:
        """The first step after ``after`` that gets statistics or a dump (None: no later one)."""
        due = [(after // every + 1) * every
               for every in (self.stats_every, self.dump_every) if every]
        due += [max(lo, after + 1) for lo, hi in self.ranges if hi > after]
        return min(due) if due else None

    def to_json(self) -> dict:
        return {"stats_every_n_steps": self.stats_every, "dump_every_n_steps": self.dump_every,
                "dump_steps": [list(r) for r in self.ranges]}


def _crossed(every: int, since: int, step: int) -> bool:
    """Whether a multiple of ``every`` lies in (since, step]."""
    return bool(every) and step > since and step // every > since // every
