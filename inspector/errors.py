"""Errors raised by the reader, each saying what was wrong and what would be right."""
from __future__ import annotations

import difflib
import re
from typing import Iterable


class InspectorError(Exception):
    """Base class of every error this package raises on bad input."""


class NotARunError(InspectorError):
    """A path that is not a run directory (no ``manifest.<worker>.json`` inside)."""


class FormatVersionError(InspectorError):
    """A run written by a newer format than this reader understands."""


class DamagedFileError(InspectorError):
    """A file of a run that cannot be parsed (truncated, corrupted, wrong type)."""


class MemoryBudgetError(InspectorError):
    """A read whose rows would take more memory than the reader's budget
    (``open_run(memory_budget=)``, ``Run.memory_budget``): the message names the budget, what
    was asked for and a narrower question that fits."""


class StorageError(InspectorError, OSError):
    """The run's storage could not be reached or refused a request (a timeout, a refused
    connection, an HTTP 5xx, a permission): the message names the URL and the cause. Not a
    damaged file: the same request may succeed later. ``url``: what was asked for; ``cause``:
    the client's own error, as one line without the URL (the same for every file, so a writer's
    records of one outage aggregate)."""

    def __init__(self, message: str, url: str | None = None,
                 cause: BaseException | str | None = None) -> None:
        super().__init__(message)
        self.url = url
        text = cause if isinstance(cause, str) or cause is None \
            else f"{type(cause).__name__}: {cause}"
        # an object's path in the client's message ('...endpoint URL: "http://host/bucket/key"'):
        # the endpoint only
        self.cause = None if text is None \
            else re.sub(r"(https?://[^/\s\"']+)/[^\s\"']*", r"\1/...", text)


class UnknownTensorError(InspectorError, KeyError):
    """A tensor name that the run's catalog does not hold."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class UnknownGroupError(InspectorError, KeyError):
    """A sample group the run does not have; the message names the ones it has."""

    def __str__(self) -> str:
        return str(self.args[0])


class NoDumpError(InspectorError, KeyError):
    """A step, tensor or kind for which no full dump exists."""

    def __str__(self) -> str:
        return str(self.args[0])


def suggest(name: str, candidates: Iterable[str], n: int = 5) -> str:
    """A ' Did you mean ...?' clause listing the closest names, or '' if none is close."""
    close = difflib.get_close_matches(name, list(candidates), n=n, cutoff=0.5)
    return f" Did you mean: {', '.join(close)}?" if close else ""


def nearest(value: int, candidates: Iterable[int], n: int = 3) -> list[int]:
    """The ``n`` candidates closest to ``value``, sorted."""
    return sorted(sorted(candidates, key=lambda c: (abs(c - value), c))[:n])
