"""The viewer's pages, one module each with ``render(ctx)``: ``viewer.app_main`` registers them
with ``st.navigation``, a page's URL path being its module's name (``/distributions``). Nothing
else imports a page; what several pages use lives beside ``data`` and ``ui`` in ``viewer/``.

Not named ``pages/``: Streamlit takes a ``pages/`` folder beside the script it runs
(``viewer/app_main.py``) for its older multipage app, and would run these modules as scripts."""
