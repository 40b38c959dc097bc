"""Small Streamlit helpers shared by the pages: figures with a PNG download, error guard,
Markdown escaping.

Every string that comes from a run's files (manifest fields, tensor names, reasons, error
messages, paths) goes through :func:`plain` before it reaches a Streamlit element that renders
Markdown (markdown, caption, info, warning, error, header, metric...): a run file must not be
able to make the browser load an image (``![x](http://...)``), format the page or show a link.

Example::

    show_figure(plots.time_series(df), "series.png", key="ov_series")
    st.caption(f"{plain(tensor)} at step {step}")
    with guard("Training overview"):
        overview.render(ctx)
"""
from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

import streamlit as st

from inspector.errors import InspectorError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

log = logging.getLogger("tf_inspector.viewer")


class _Plots:
    """:mod:`inspector.analysis.plots`, imported on its first use: Matplotlib is over half of the
    viewer's imports (1.3 of 2.9 s after a server start, at load 7), and the Summary, the page a
    first visit opens, draws no Matplotlib figure. Pages use ``ui.plots``, never import it."""

    def __getattr__(self, name: str) -> Any:
        from inspector.analysis import plots as module   # the import lock: thread-safe
        return getattr(module, name)


plots = _Plots()
#: The widest a shown Matplotlib figure's PNG is drawn (CSS px = PNG px at 100 dpi): the page's
#: main column at a 1500-px window is 1040 px (1000 inside ``st.columns``), and a wider PNG is
#: shrunk to it, its labels with it; figures are narrowed to this width instead
#: (:func:`inspector.analysis.plots.fit_width`), so every text keeps its size
FIGURE_WIDTH_PX = 1000
_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")  # every ASCII punctuation character
#: Where GFM's literal autolinks start (``http://``, ``https://``, ``www.``, ``a@b.c``, ``mailto:``,
#: ``xmpp:``): Streamlit's Markdown links those in the text left after escapes are read, so an
#: escape cannot stop it; an invisible word joiner there does
_AUTOLINK = re.compile(
    r"(?i)(?:(?<=https)|(?<=http)|(?<=mailto)|(?<=xmpp))(?=:)|(?<=www)(?=\.)|(?=@)")
WORD_JOINER = "\u2060"


def plain(text: object) -> str:
    r"""``text`` with every ASCII punctuation character backslash-escaped and a word joiner
    (U+2060, invisible) where a bare URL or e-mail address would start: Markdown shows it as it
    is (no link, image, HTML, emphasis, LaTeX or directive).

    >>> print(plain("![x](http://h/x.png)").replace(WORD_JOINER, "|"))
    \!\[x\]\(http|\:\/\/h\/x\.png\)
    """
    return _PUNCTUATION.sub(r"\\\1", _AUTOLINK.sub(WORD_JOINER, str(text)))


@dataclass(frozen=True)
class Ctx:
    """What every page needs: the chosen run's path and its current signature."""
    path: str
    sig: tuple
    runs: tuple[str, ...]


def default_tensor(names: list[str]) -> int:
    """Index of the tensor a tensor picker opens on: the first ReLU output (an activation most
    users look at first), else the first tensor. ``default_tensor(["x:0", "c/Relu:0"]) == 1``"""
    return next((i for i, n in enumerate(names) if "Relu" in n), 0)


def slug(text: str) -> str:
    """A file-name-safe version of ``text``: ``slug("conv1/Relu:0") == "conv1_Relu_0"``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "figure"


def show_figure(fig: Figure, name: str, key: str, caption: str | None = None) -> bytes:
    """Render ``fig`` as a PNG image with a download button beside it; returns the PNG bytes.

    The figure is drawn once to PNG and that same image is shown and downloaded, so what
    the user saves is exactly what they saw."""
    png = plots.to_png(fig, max_width_px=FIGURE_WIDTH_PX)
    show_png(png, name, key, caption)
    return png


def show_cached_figure(make: Callable[[], Figure], ident: tuple, name: str, key: str,
                       caption: str | None = None) -> bytes:
    """:func:`show_figure` of ``make()``, drawn once per ``ident`` and theme: a rerun that changes
    another widget shows the stored PNG instead of drawing it again (Matplotlib is most of a
    page's time). ``ident`` must name everything the figure shows: the figure's kind, the run's
    path and signature (``ctx.sig``: new files draw anew), and every choice (tensor, step, ...).

    Example: ``show_cached_figure(lambda: plots.channel_grid(x[i]), ("grid", ctx.path, ctx.sig,
    tensor, step, i), name, key="fm_grid")``"""
    png = _figure_png(ident, theme(), make)
    show_png(png, name, key, caption)
    return png


@st.cache_data(max_entries=256, show_spinner=False)
def _figure_png(ident: tuple, kind: str, _make: Callable[[], Figure]) -> bytes:
    """PNG bytes of ``_make()`` in the theme ``kind``, cached by (``ident``, ``kind``); ``_make``
    is not hashed (a closure over arrays ``ident`` names)."""
    with figure_theme(kind):
        return plots.to_png(_make(), max_width_px=FIGURE_WIDTH_PX)


def show_png(png: bytes, name: str, key: str, caption: str | None = None) -> None:
    """Show already-rendered PNG bytes (e.g. from a cached renderer) with a download button."""
    # natural size (capped by the column), not blown up
    st.image(png, caption=caption, width="content")
    st.download_button("Download PNG", png, file_name=f"{slug(name)}.png", mime="image/png",
                       key=f"png_{key}")


def show_chart(make: Callable[[], Any], ident: tuple, **kwargs: Any) -> None:
    """``st.altair_chart(make(), **kwargs)``, the chart's Vega-Lite spec built once per ``ident``
    (which must name everything the chart shows, as :func:`show_cached_figure`'s): Altair's
    construction and schema validation take 0.1-0.3 s a chart, most of a page's script time, and
    a page opened again, or rerun for another widget, sends the stored spec instead."""
    st.vega_lite_chart(_chart_spec(ident, make), **kwargs)


@st.cache_data(max_entries=128, show_spinner=False)
def _chart_spec(ident: tuple, _make: Callable[[], Any]) -> dict:
    """The spec ``st.altair_chart`` sends for ``_make()`` (its data as Arrow ``datasets``)."""
    from streamlit.elements.vega_charts import _convert_altair_to_vega_lite_spec
    return _convert_altair_to_vega_lite_spec(_make())


def download_figure(make: Callable[[], Figure], name: str, key: str,
                    label: str = "Download PNG") -> None:
    """A download button whose PNG is drawn only when clicked (for figures shown as native,
    interactive Streamlit charts, so the page does not render them twice), in the page's theme."""
    kind = theme()  # read now: the click's callable runs outside the script

    def png() -> bytes:
        with figure_theme(kind):
            return plots.to_png(make())
    st.download_button(label, png, file_name=f"{slug(name)}.png", mime="image/png",
                       key=f"png_{key}")


def theme() -> str:
    """The browser's theme, "light" or "dark" (``st.context.theme``; "light" if unknown, e.g. in
    AppTest or before the browser reported it)."""
    try:
        kind = st.context.theme.type
    except Exception:  # an older Streamlit or no browser session: the default theme
        return "light"
    return kind if kind in ("light", "dark") else "light"


@contextlib.contextmanager
def figure_theme(kind: str | None = None) -> Iterator[None]:
    """Matplotlib figures made inside follow the theme (``kind``, default :func:`theme`): a dark
    background and light text in the dark theme. Cached renderers take the theme as an argument
    so a PNG drawn for one theme is not served for the other."""
    import matplotlib.style    # here, not at import: see _Plots
    style = "dark_background" if (kind or theme()) == "dark" else "default"
    with matplotlib.style.context(style):
        yield


@contextlib.contextmanager
def guard(what: str) -> Iterator[None]:
    """Show any error of the block as a message in the page, never a traceback.

    Reader errors (bad path, damaged file, missing step) are expected and shown as they are;
    anything else is a bug in the viewer, logged with its traceback on the server, and shown
    by its type only (its message may name files the page must not reveal)."""
    try:
        yield
    except InspectorError as e:
        st.error(f"{plain(what)}: {plain(e)}")
    except Exception as e:  # the page must stay usable; details go to the server log
        log.exception("viewer: %s failed", what)
        st.error(f"{plain(what)} could not be drawn ({type(e).__name__}); the details are in the "
                 "server log.")


def need(condition: bool, message: str) -> bool:
    """Show ``message`` (Markdown: escape run strings in it with :func:`plain`) as an info box
    and return False when ``condition`` is false."""
    if not condition:
        st.info(message)
    return bool(condition)
