"""The TF Inspector viewer: ``app_main`` (its entry), one module per page, plus
``data`` (cached reads) and ``ui`` (shared widgets). Imports no TensorFlow."""
