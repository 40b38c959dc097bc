"""The ICNN conv-mask layer and its NumPy companions, side by side.

Only :mod:`inspector.icnn.layer` imports TensorFlow (it builds the layer in a ``model_fn``);
importing this package, :mod:`~inspector.icnn.templates` (the positive/negative templates,
the ICNN layers of a run, dead filters) or :mod:`~inspector.icnn.stability` (location
instability) never does, so the reader and the viewer use them without TensorFlow.

Example::

    from inspector.icnn import stability, templates      # NumPy only
    from inspector.icnn import layer as icnn             # TensorFlow: in the model_fn
"""
