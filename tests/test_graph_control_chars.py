"""Op names holding control characters (a NUL) are drawn escaped in both op graph views: a raw
NUL in the DOT text blanks the chart (viz.js fails with no message)."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("streamlit")

from inspector.graph.graphdef import Node, OpGraph  # noqa: E402
from inspector.graph.scopes import collapse  # noqa: E402
from viewer.charts import graph_dot  # noqa: E402
from viewer.charts.graph_colours import Scale  # noqa: E402

CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")


@pytest.mark.parametrize("name", ["conv\x00evil", "bell\x07/Relu", "tab\there", "del\x7f"])
def test_control_characters_in_op_names_are_drawn_escaped(name):
    g = OpGraph([Node(name, "Relu"), Node("b", "Relu", (name,))])
    text = graph_dot.dot(g.neighbourhood("b", 1), g, {}, Scale.robust([], "rms"))
    assert not CONTROL.search(text)
    shown = CONTROL.sub(lambda m: f"\\\\x{ord(m.group()):02x}", name)   # \xNN, its backslash escaped
    assert f'label="{shown}\\n' in text, text


def test_the_whole_model_view_escapes_them_too():
    g = OpGraph([Node("blk\x00/a", "Relu"), Node("blk\x00/b", "Relu", ("blk\x00/a",)),
                 Node("out", "Relu", ("blk\x00/b",))])
    text = graph_dot.model_dot(collapse(g, set()), g, {}, Scale.robust([], "rms"), "rms", set(), None)
    assert not CONTROL.search(text) and "blk\\\\x00" in text
