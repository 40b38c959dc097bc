"""The one step-range grammar of the project (pure Python, no TensorFlow, no numpy).

Used by ``DumpHook(dump_steps=...)``, ``python -m inspector export --steps`` and the reader's
``parse_steps``. Steps are global steps (non-negative integers); ranges are inclusive:

==========  ===================================
``N``       the step N alone
``A:B``     steps A to B, both included
``A:``      step A and every later step
``:B``      every step up to B, included
``A-B``     alias of ``A:B`` (older ``dump_steps`` spelling)
==========  ===================================

Example::

    parse_step_range("100:500")   # (100, 500)
    parse_step_range(":500")      # (0, 500)
    parse_step_range("100:")      # (100, MAX_STEP)
"""
from __future__ import annotations

import re

#: The open end of ``A:`` (2**62: larger than any real step, still an int64 for Parquet filters).
MAX_STEP = 2 ** 62
FORMS = "N, A:B, A: or :B (inclusive, e.g. 200, 100:500, 100: or :500)"
_RANGE = re.compile(r"\s*(\d*)\s*(?:([:-])\s*(\d*)\s*)?")


def _bad(spec: object, why: str = "") -> ValueError:
    return ValueError(f"step range {spec!r} {why or 'is not a step range'}; use {FORMS}")


def _int(text: str, spec: object) -> int:
    value = int(text)
    if value > MAX_STEP:
        raise _bad(spec, f"has a step larger than {MAX_STEP}")
    return value


def parse_step_range(spec: str) -> tuple[int, int]:
    """The inclusive range a step-range string names.

    Args:
        spec: ``'N'``, ``'A:B'``, ``'A:'`` or ``':B'`` (and the alias ``'A-B'``); spaces
            around the parts are allowed.

    Returns:
        ``(lo, hi)``, both included: ``'N'`` is ``(N, N)``, ``':B'`` starts at 0, ``'A:'``
            ends at ``MAX_STEP``.

    Raises:
        ValueError: anything else, empty ranges included (naming ``spec`` and the accepted
            forms).
    """
    if not isinstance(spec, str):
        raise _bad(spec, "is not a string")
    m = _RANGE.fullmatch(spec)
    if not m:
        raise _bad(spec)
    lo_text, sep, hi_text = m.group(1), m.group(2), m.group(3) or ""
    if not sep:
        if not lo_text:
            raise _bad(spec, "is empty")
        step = _int(lo_text, spec)
        return step, step
    if not lo_text and not hi_text:
        raise _bad(spec, "has neither end")
    if sep == "-" and not (lo_text and hi_text):
        raise _bad(spec, "needs both ends with '-' (or use ':')")
    lo = _int(lo_text, spec) if lo_text else 0
    hi = _int(hi_text, spec) if hi_text else MAX_STEP
    if lo > hi:
        raise _bad(spec, "is empty (its start is after its end)")
    return lo, hi


__all__ = ["parse_step_range", "MAX_STEP", "FORMS"]
