"""The Keras integration: ``InspectCallback`` (``callback``: the fit lifecycle), the probe graph
(``trace``), the capture built into fit's own train step (``step``), which batch is recorded
(``source``), and the ICNN conv mask as a Keras layer (``icnn``).
"""
from hooks.keras.callback import InspectCallback

__all__ = ["InspectCallback"]
