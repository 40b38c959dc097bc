"""Replace private TensorFlow functions by recording wrappers, reversibly.

The recorders ``import hooks`` installs (``gradient_recorder``, ``estimator_recorder``,
``loss_scale``) each replace private functions of TensorFlow (module attributes or class
methods; each module's docstring names them, why no public API serves, and the tested
versions) by wrappers that call the original and record names. :class:`MethodPatch` is how
they all do it: wrap once (a function already carrying the mark is not wrapped again),
remember the originals, and put them back only while the wrappers are still the ones in
place, so that whatever wrapped them afterwards is not undone under it. This module itself
uses no TensorFlow API.

Example::

    _patch = MethodPatch("model_fn recorder", _estimator_class, {"_call_model_fn": _wrap})
    _patch.install()    # Estimator._call_model_fn is _wrap(the original), marked
    _patch.uninstall()  # the original again
"""
from __future__ import annotations

import functools
import logging
import os
import threading
from typing import Any, Callable, Mapping

log = logging.getLogger("tf_inspector")
#: the attribute set to True on every wrapper: how an install recognises one already made
MARK = "_tf_inspector"
#: values of an opt-out environment variable that turn a patch off
_OFF = ("0", "false", "no", "off")

Function = Callable[..., Any]


class MethodPatch:
    """``owner()``'s functions named in ``wrappers`` (``{name: make_wrapper}``), replaced by
    ``make_wrapper(original)`` from :meth:`install` until :meth:`uninstall`; the patch gives
    each wrapper the original's name, docstring and ``__wrapped__``, and the mark.

    ``owner`` is called at each install and uninstall (None where this TensorFlow lacks the
    module or class). Every message starts with ``label`` and is
    logged at DEBUG on ``tf_inspector``: opting out with ``env_var``, a missing function (where
    ``missing`` says why it matters), the install (``detail`` after it) and, with
    ``log_uninstall``, the uninstall. ``replaced`` is warned where something replaced a wrapper
    since the install; without it that uninstall fails silently."""

    def __init__(self, label: str, owner: Callable[[], Any],
                 wrappers: Mapping[str, Callable[[Function], Function]], *,
                 env_var: str | None = None, missing: str | None = None, detail: str | None = None,
                 replaced: str | None = None, log_uninstall: bool = True) -> None:
        self._label, self._owner, self._wrappers = label, owner, dict(wrappers)
        self._env_var, self._missing, self._detail = env_var, missing, detail
        self._replaced, self._log_uninstall = replaced, log_uninstall
        self._originals: dict[str, Function] | None = None  # as TensorFlow had them, while wrapped
        self._lock = threading.Lock()

    @property
    def installed(self) -> bool:
        """Whether this patch's wrappers are in place (installed and not uninstalled)."""
        return self._originals is not None

    def install(self) -> bool:
        """Wrap every function once; True where they are wrapped (now or before), False where
        opted out or where ``owner()`` lacks one of them (then nothing is wrapped)."""
        if self._opted_out():
            return False
        owner = self._owner()
        found = {name: f for name in self._wrappers
                 if (f := getattr(owner, name, None)) is not None}
        if len(found) < len(self._wrappers):
            if self._missing:
                log.debug("%s not installed: %s", self._label, self._missing)
            return False
        with self._lock:
            if getattr(next(iter(found.values())), MARK, False):
                return True  # wrapped before (a second install, or the module loaded twice)
            wrapped = {name: self._wrap(name, f) for name, f in found.items()}
            self._originals = found
            for name, wrapper in wrapped.items():
                setattr(owner, name, wrapper)
        log.debug("%s installed%s", self._label, f": {self._detail}" if self._detail else "")
        return True

    def uninstall(self) -> bool:
        """Put the originals back; True if they had been wrapped. Where something replaced a
        wrapper since, everything stays as it is (False): putting ours back would undo it."""
        owner = self._owner()
        with self._lock:
            if self._originals is None or owner is None:
                return False
            if not all(getattr(vars(owner).get(name), MARK, False) for name in self._originals):
                if self._replaced:
                    log.warning("%s: %s", self._label, self._replaced)
                return False
            for name, original in self._originals.items():
                setattr(owner, name, original)
            self._originals = None
        if self._log_uninstall:
            log.debug("%s uninstalled", self._label)
        return True

    def _opted_out(self) -> bool:
        """``env_var`` says off (0, false, no or off, read at each install); logged."""
        if self._env_var is None or os.environ.get(self._env_var, "1").strip().lower() not in _OFF:
            return False
        log.debug("%s not installed: %s=%s", self._label, self._env_var, os.environ[self._env_var])
        return True

    def _wrap(self, name: str, original: Function) -> Function:
        """``make_wrapper(original)``, marked and carrying ``original``'s metadata."""
        wrapper = functools.update_wrapper(self._wrappers[name](original), original)
        setattr(wrapper, MARK, True)
        return wrapper
