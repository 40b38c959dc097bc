"""The browser's Back and Forward show exactly the view their URL names.

Why this exists (Streamlit 1.60, read in its frontend and ``runtime/state``): after a history
move (``popstate``) the frontend reruns the script with the query string it set *last* (the
view shown before the move), not the address bar's; the server then writes what it got back
with ``pushState`` (bound widgets' kept values, parameters of the other page's widgets
filtered out), which adds a history entry, cuts off Forward, and leaves an address bar that
names another view than the one drawn: a link copied then opened another run or tensor. The
server cannot see the address bar's query (the URL in a rerun's context has it stripped), so
no server-side fix can know what the URL says. Upstream: streamlit/streamlit pull requests
16989 and 16998.

The fix is in the browser: :data:`SCRIPT`, installed once per page load, answers ``popstate``
by reloading the page at the history entry's URL (ignoring what Streamlit writes meanwhile). A fresh
load is the one path on which Streamlit takes every URL-bound widget from the URL (the run, the runs
folder's sub-folder, each page's tensor, step, sample, filter, group), and it writes nothing
back, so the history stays as the browser has it and Forward still works. Moves within a page
(``#anchor`` links of headings) are left to Streamlit. A click on a sidebar page link makes
Streamlit push, before the new page's URL, the page being left without its own widgets'
parameters (the server drops them from the query it was sent): that push is dropped, so Back
returns to the page as it was left; and the server's corrections of the new page's URL right
after it is pushed (the run written back: ``app_main.restore_sidebar``) replace that entry.

Example (the app's ``show()``, every run)::

    history.install()
"""
from __future__ import annotations

import streamlit as st

#: Runs in the app's page (not an iframe). Streamlit's own ``popstate`` listener runs first (a
#: listener on ``window`` cannot precede it) and asks the server for a rerun with the last
#: view's query: its answers would ``pushState``, so history writes are switched off for the
#: rest of this page's life, which the reload ends. Our constant code only: nothing from a run
#: reaches it.
SCRIPT = """<script>
(() => {
  const w = window;
  if (w.__tfInspectorHistory) return;
  w.__tfInspectorHistory = true;
  // A click on the sidebar's page links: until the new page's URL is pushed, a push to the
  // page being left (its query without its own widgets' parameters, which Streamlit writes
  // while switching) is no history entry: Back returns to the page as it was left.
  // Right after the new page's URL is pushed, the server's corrections of it (the run written
  // back) replace that entry instead of adding one that Back would stop at.
  let leaving = 0, arrived = 0;
  w.document.addEventListener("click", (event) => {
    const link = event.target instanceof Element
      && event.target.closest('[data-testid="stSidebarNav"] a');
    if (link) leaving = Date.now();
  }, true);
  const push = w.history.pushState.bind(w.history);
  const replace = w.history.replaceState.bind(w.history);
  w.history.pushState = (state, title, url) => {
    const same = new URL(url, w.location.href).pathname === w.location.pathname, now = Date.now();
    if (same && now - leaving < 5000) return;
    if (same && now - arrived < 5000) return replace(state, title, url);
    if (!same && leaving) { leaving = 0; arrived = now; }
    return push(state, title, url);
  };
  w.addEventListener("popstate", () => {
    if (w.location.hash) return;             // an anchor inside the page: Streamlit's move
    const keep = () => {};                   // the entry stays as the browser has it
    w.history.pushState = keep;
    w.history.replaceState = keep;
    w.location.reload();                     // a fresh load of the entry: the URL decides
  });
})();
</script>"""


def install() -> None:
    """Put :data:`SCRIPT` in the page (an empty element at the sidebar's end)."""
    st.sidebar.html(SCRIPT, unsafe_allow_javascript=True)
