"""TF Inspector viewer: ``streamlit run app.py -- runs/`` (a run, or a folder of runs), on
127.0.0.1 only (``.streamlit/config.toml`` beside this file; ``--server.address`` to change it).

A thin entry for a checkout: the viewer itself is ``viewer.app_main`` (shipped in the package,
which ``python -m inspector app runs/`` serves with its imports done at the server's start:
``viewer.start``); see its docstring.
"""
import sys
from pathlib import Path

# first (hence noqa: E402 below): the checkout's packages, from any directory
sys.path.insert(0, str(Path(__file__).resolve().parent))

from viewer.app_main import main  # noqa: E402

main()
