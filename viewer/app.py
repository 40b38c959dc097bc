"""The viewer served by ``python -m inspector app`` (``streamlit run`` on this file, shipped in the
package): as a module (``streamlit run`` imports it once, at the server's start) it is the ASGI
app whose start imports what the pages need (:mod:`viewer.start`); as a script (each page view)
it draws the page (:func:`viewer.app_main.main`)."""
import sys
from pathlib import Path

if str(Path(__file__).resolve().parents[1]) not in sys.path:
    # a checkout that is not installed: import viewer/ and inspector/ from beside this file
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if __name__ == "__main__":  # a page view (Streamlit runs the script as __main__)
    from viewer.app_main import main
    main()
else:  # `streamlit run` finds this App (by reading the file) and imports it to serve it
    from streamlit.starlette import App

    from viewer.start import lifespan
    app = App(__file__, lifespan=lifespan)
