"""The layer x step heatmap in the page: a :class:`viewer.charts.raster.Raster` drawn by a small
Streamlit component (``heatmap.js``, ``heatmap.css`` beside this file): the raster as one PNG
image, the row labels, a step axis whose ends are the first and last statistics steps, a
legend (the colour scale, NaN/Inf, <= 0, no statistics), and a tooltip that reads the
aggregated values sent with the image. The browser draws one image, not one mark per cell.

Run-file strings (tensor and layer names) reach the browser as JSON data and are set as text.

Example::

    r = raster.raster(m, present, ov.first_steps, ov.steps, ov.width, log=True)
    show(payload(r, labels, tips, "l2", "gradient l2 (group all)"), key="ov_hm_grad")
"""
from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import streamlit as st
from PIL import Image

from .raster import NAN_RGBA, ZERO_RGBA, Raster, bar_ticks, colour_stops

_HERE = Path(__file__).resolve().parent
HTML = '<div class="tfi-heatmap"></div>'
#: Pixels per row: labelled rows (22) while they fit in about 1,600 pixels, then fewer, at least 2
ROW_PX, MIN_ROW_PX, TALL_PX = 22, 2, 1600


def row_px(rows: int) -> float:
    """Pixels of each of ``rows`` rows.

    >>> row_px(6), row_px(400), row_px(1000)
    (22, 4.0, 2)
    """
    return max(MIN_ROW_PX, min(ROW_PX, TALL_PX / max(rows, 1)))


def png(rgba: np.ndarray) -> bytes:
    """PNG bytes of an RGBA [rows, columns, 4] uint8 image (fast zlib level: the image is sent
    once per view and is mostly a few hundred kilobytes)."""
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(rgba), "RGBA").save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")


def _css(rgba: tuple[int, int, int, int]) -> str:
    return "#{:02x}{:02x}{:02x}".format(*rgba[:3])


def swatches(log: bool) -> list[tuple[str | None, str]]:
    """The legend's entries besides the colour scale: (CSS colour, or None for a gap; text)."""
    out: list[tuple[str | None, str]] = [(_css(NAN_RGBA), "NaN/Inf")]
    if log:
        out.append((_css(ZERO_RGBA), "<= 0 (a log scale cannot place it; e.g. a dead ReLU's zero "
                                     "gradient)"))
    return out + [(None, "no statistics at these steps")]


def ticks(r: Raster) -> list[tuple[float, str]]:
    """The colour bar's (position 0..1, label) ticks: the shared scale's (none when every row
    has its own scale: the bar then spans each row's min to max)."""
    if r.own.all() or not len(r.own):
        return []
    lo, hi = r.domain[int(np.flatnonzero(~r.own)[0])]
    return [(x, fmt(v)) for x, v in bar_ticks(float(lo), float(hi), r.log)]


def fmt(v: float) -> str:
    """A tick's number, short: 4 significant digits, exponent notation off 1e-3..1e5.

    >>> fmt(0.001), fmt(2.5e-7), fmt(1200.0), fmt(0.25)
    ('0.001', '2.5e-07', '1200', '0.25')
    """
    a = abs(v)
    return f"{v:.4g}" if a == 0 or 1e-3 <= a < 1e5 else f"{v:.2g}"


def payload(r: Raster, labels: list[str], tips: list[str], stat: str, title: str,
            scale_note: str = "") -> dict:
    """What ``heatmap.js`` draws: the image, the values and states it hovers, the axis and
    legend (``scale_note``: what the colour bar's scale is, after the statistic's name)."""
    return {"png": "data:image/png;base64," + base64.b64encode(png(r.rgba)).decode("ascii"),
            "values": _b64(r.values.astype(np.float32)), "state": _b64(r.state.astype(np.uint8)),
            "first": r.first.tolist(), "last": r.last.tolist(), "x0": float(r.x0),
            "step_px": float(r.step_px), "labels": list(labels), "tips": list(tips),
            "own": r.own.tolist(), "domain": r.domain.tolist(),
            "log": bool(r.log), "stat": stat, "title": title, "row_px": row_px(len(labels)),
            "stops": colour_stops(r.cmap), "swatches": swatches(r.log), "ticks": ticks(r),
            "scale_note": scale_note}


def show(drawn: dict, key: str) -> None:
    """Draw a heatmap from its :func:`payload` (registering the component again is a no-op:
    same name, same code)."""
    # in the page's DOM, not a shadow root: its CSS is scoped by the .tfi-heatmap class, and the
    # browser tests read its image and labels like any element's
    component = st.components.v2.component("tf_inspector_heatmap", html=HTML,
                                           css=_read("heatmap.css"), js=_read("heatmap.js"),
                                           isolate_styles=False)
    component(data=drawn, key=key, height="content")


def _read(name: str) -> str:
    return (_HERE / name).read_text(encoding="utf-8")
