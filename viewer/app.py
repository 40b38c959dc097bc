"""The viewer's page script, shipped in the package: ``python -m inspector app`` serves it
(through :mod:`viewer.start`); Streamlit runs it per page view (:func:`viewer.app_main.main`)."""
import sys
from pathlib import Path

if str(Path(__file__).resolve().parents[1]) not in sys.path:
    # a checkout that is not installed: import viewer/ and inspector/ from beside this file
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from viewer.app_main import main  # noqa: E402

main()
