"""The TF Inspector viewer: ``app_main`` (its entry), one module per page in ``app_pages/``, the
drawing in ``charts/``, and beside them what pages share: ``data`` (cached reads), ``ui`` (shared
widgets) and the helpers several pages use. Imports no TensorFlow."""
