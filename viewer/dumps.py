"""The dump-step picker every page shares: says why each step was dumped, marks damaged dumps,
and defaults to the newest readable one (headers only, via :func:`viewer.data.dump_infos`).

Example::

    step = dump_step_picker(ctx, "Dump step", key="fm_step")      # None (after a message) if none
"""
from __future__ import annotations

import streamlit as st

from . import data
from .ui import Ctx, need


def label(info: dict) -> str:
    """'34 (NaN/Inf in the loss)', '40 (damaged: unreadable)' (a select box shows it as text)."""
    why = "damaged: unreadable" if info["damaged"] else str(info["reason"])[:60]
    return f"{info['step']} ({why})"


def default_index(infos: list[dict], near: int | None = None) -> int:
    """Index of the newest readable dump, or of the readable one nearest ``near`` (the earlier
    on a tie); the newest if none is readable."""
    ok = [i for i, d in enumerate(infos) if not d["damaged"]] or [len(infos) - 1]
    if near is None:
        return ok[-1]
    return min(ok, key=lambda i: (abs(infos[i]["step"] - near), infos[i]["step"]))


def dump_step_picker(ctx: Ctx, title: str, key: str, near: int | None = None, container=st,
                     help: str | None = None) -> int | None:
    """A select box of the run's dump steps, each labelled with why it was dumped (damaged
    ones marked); defaults to the newest readable dump (or the readable one nearest ``near``).
    None, after a message, if the run has no dumps."""
    infos = data.dump_infos(ctx.path, ctx.sig)
    if not need(bool(infos), "No full dumps in this run (the hook dumps every "
                             "dump_every_n_steps)."):
        return None
    by_step = {d["step"]: d for d in infos}
    return container.selectbox(title, list(by_step), index=default_index(infos, near), key=key,
                               help=help, bind="query-params",
                               format_func=lambda s: label(by_step[s]))
