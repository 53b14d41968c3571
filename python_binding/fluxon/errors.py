"""Fluxon's exceptions: one hierarchy rooted at :class:`Error`, one class per stable status code."""

from __future__ import annotations


class Error(Exception):
    """Base of every Fluxon failure. ``code`` is the stable status code name."""

    code = "Error"

    def __init__(self, message: str = "", *, indices=None, reasons=None, stage=None):
        super().__init__(message)
        self.message = message
        self.indices = list(indices or [])
        self.reasons = list(reasons or [])
        self.stage = stage


class InvalidArgument(Error):
    """An argument broke a rule; nothing was reserved or sent."""

    code = "InvalidArgument"


class KeyConflict(Error):
    """Keys exist or are being written. ``indices[i]`` conflicts because ``reasons[i]`` is
    ``"exists"`` or ``"inflight"``."""

    code = "KeyConflict"


class NoSpace(Error):
    code = "NoSpace"


class LocalReserveTimeout(Error):
    """No slot became free in time; ``stage`` is ``"claim_turn"`` or ``"refill"``."""

    code = "LocalReserveTimeout"


class KeyNotFound(Error):
    code = "KeyNotFound"


class GenerationMismatch(Error):
    """The owner restarted: plans, handles and mappings of the old generation are void."""

    code = "GenerationMismatch"


class Closed(Error):
    code = "Closed"


class Timeout(Error):
    code = "Timeout"


class MalformedMessage(Error):
    code = "MalformedMessage"


class Internal(Error):
    code = "Internal"


_BY_CODE = {c.code: c for c in (InvalidArgument, KeyConflict, NoSpace, LocalReserveTimeout, KeyNotFound,
                                GenerationMismatch, Closed, Timeout, MalformedMessage, Internal)}


def error_class(code: str):
    return _BY_CODE.get(code, Error)
