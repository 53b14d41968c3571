"""Fluxon's exceptions: one hierarchy rooted at :class:`Error`, one class per stable status code.

The classes are made from the one list of codes in ``runtime/include/fluxon/runtime/status.hpp``
(``FLUXON_STATUS_CODES``, exported as ``fluxon._fluxon.ERROR_CODES``): a code added there is a
class here, with its documentation.
"""

from __future__ import annotations

from ._fluxon import ERROR_CODES


class Error(Exception):
    """Base of every Fluxon failure. ``code`` is the stable status code name."""

    code = "Error"

    def __init__(self, message: str = "", *, indices=None, reasons=None, stage=None):
        super().__init__(message)
        self.message = message
        self.indices = list(indices or [])
        self.reasons = list(reasons or [])
        self.stage = stage


_BY_CODE = {}
for _name, _doc in ERROR_CODES:
    _BY_CODE[_name] = globals()[_name] = type(_name, (Error,), {"__doc__": _doc, "code": _name,
                                                               "__module__": __name__})
del _name, _doc
__all__ = ["Error", "error_class", *_BY_CODE]

def error_class(code: str):
    return _BY_CODE.get(code, Error)
