"""The Keras integration: ``InspectCallback`` (``callback``: the fit lifecycle), the probe graph
(``trace``), the capture built into fit's own train step (``step``), the same capture around a
custom loop's step function (``loop``: ``inspect_step``), which batch is recorded (``source``),
and the ICNN conv mask as a Keras layer (``icnn``).
"""
from hooks.keras.callback import InspectCallback
from hooks.keras.loop import inspect_step

__all__ = ["InspectCallback", "inspect_step"]
