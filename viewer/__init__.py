"""Streamlit pages of the TF Inspector viewer (``app.py``); one module per page, plus
``data`` (cached reads) and ``ui`` (shared widgets). Imports no TensorFlow."""
