"""TF Inspector viewer: ``streamlit run app.py -- runs/`` (a run, or a folder of runs), on
127.0.0.1 only (``.streamlit/config.toml`` beside this file; ``--server.address`` to change it).

A thin entry for a checkout: the viewer itself is ``viewer.app_main`` (shipped in the package,
which ``python -m inspector app runs/`` runs through ``viewer/app.py``); see its docstring.
``streamlit run`` imports this file once as a module, at the server's start: the ``st.App``
below, whose start imports what the pages need (``viewer.start``), so the first page view does
not; each page view runs it as a script.
"""
import sys
from pathlib import Path

# first (hence noqa: E402 below): the checkout's packages, from any directory
sys.path.insert(0, str(Path(__file__).resolve().parent))

if __name__ == "__main__":  # a page view (Streamlit and AppTest run the script as __main__)
    from viewer.app_main import main  # noqa: E402
    main()
else:  # `streamlit run` finds this App (by reading the file) and imports it to serve it
    from streamlit.starlette import App  # noqa: E402

    from viewer.start import lifespan  # noqa: E402
    app = App(__file__, lifespan=lifespan)
