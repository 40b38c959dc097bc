"""The run's graph.pb without TensorFlow: the GraphDef reader/writer (``graphdef``) and the
whole-model view of name scopes (``scopes``).
"""
