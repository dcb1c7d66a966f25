"""Typed JSON-RPC errors: each carries the wire ``code``, ``message`` and ``data`` (docs/PROTOCOL.md).

Two families:

- :class:`PylonError` and its subclasses: a JSON-RPC ``error`` reply (the host or a plugin
  refused the call: unknown method, consent denied, overloaded, ...).
- :class:`ServiceError`: the call succeeded at the JSON-RPC level but the service answered with
  a failure code in its result (MA and push results are ``{"code": N, "message": ...}``, 0 =
  success). Raised only by ``call(..., check=True)``.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Type


class PylonError(Exception):
    """An error reply. ``code`` is the JSON-RPC code, ``data`` the error's data member (or None)."""

    code: int = 0

    def __init__(self, message: str = "", code: Optional[int] = None, data: Any = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.data = data

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" + (f" {self.data}" if self.data is not None else "")

    def to_json(self) -> Dict[str, Any]:
        """The error as a JSON-RPC ``error`` member."""
        e: Dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            e["data"] = self.data
        return e


class ConnectionClosed(PylonError):
    """The host closed the connection (or was never reachable)."""
    code = -32001


class ParseError(PylonError):
    """-32700: the host could not parse a line as JSON."""
    code = -32700


class InvalidRequest(PylonError):
    """-32600: not a JSON-RPC 2.0 request."""
    code = -32600


class MethodNotFound(PylonError):
    """-32601: no plugin or provider serves the method."""
    code = -32601


class InvalidParams(PylonError):
    """-32602: the params were refused (wrong type, missing member)."""
    code = -32602


class InternalError(PylonError):
    """-32603: the serving side failed."""
    code = -32603


class PluginUnavailable(PylonError):
    """-32001: the plugin is not running (starting, restarting, disabled)."""
    code = -32001


class Timeout(PylonError):
    """-32002: no reply in time (``data["client"]`` is True when this client gave up)."""
    code = -32002


class ConsentDenied(PylonError):
    """-32003: the data-collection switch of the call is denied."""
    code = -32003


class Overloaded(PylonError):
    """-32004: a queue or limit is full; retry later."""
    code = -32004


class NotPermitted(PylonError):
    """-32005: the caller's uid may not make this call."""
    code = -32005


class MessageTooLarge(PylonError):
    """-32006: the request line is longer than the host accepts."""
    code = -32006


class ShuttingDown(PylonError):
    """-32007: the host is stopping."""
    code = -32007


class Pending(PylonError):
    """-32008: not a failure. The request goes on and may still take effect (the host's deadline
    passed for a plugin that carries on, or the plugin said so: an MA start waiting for the
    network); no later answer comes. Retry only with an idempotency key (MA's ``eventId``, the
    uploader's record ids)."""
    code = -32008


class ServiceError(PylonError):
    """A service's failure code in a successful reply (``call(..., check=True)``).

    ``code`` is the service's code (e.g. MA's 1001 or push's 3003, never 0), ``message`` its
    message and ``result`` the whole result object.
    """

    def __init__(self, method: str, result: Mapping[str, Any]) -> None:
        code = result.get("code")
        super().__init__(str(result.get("message") or f"{method} failed"),
                         code=code if isinstance(code, int) else None, data=dict(result))
        self.method = method
        self.result: Dict[str, Any] = dict(result)


_BY_CODE: Dict[int, Type[PylonError]] = {
    c.code: c for c in (ParseError, InvalidRequest, MethodNotFound, InvalidParams, InternalError,
                        PluginUnavailable, Timeout, ConsentDenied, Overloaded, NotPermitted,
                        MessageTooLarge, ShuttingDown, Pending)}


def from_wire(err: Mapping[str, Any]) -> PylonError:
    """The typed exception for an ``error`` member."""
    code = err.get("code", 0)
    cls = _BY_CODE.get(code, PylonError) if isinstance(code, int) else PylonError
    return cls(str(err.get("message", "")), code=code if isinstance(code, int) else None, data=err.get("data"))


def checked(method: str, result: Any) -> Any:
    """``result``, unless it is a service failure (an object whose integer ``code`` is not 0):
    then :class:`ServiceError`. Results without a ``code`` member pass unchanged."""
    if isinstance(result, dict):
        code = result.get("code")
        if isinstance(code, int) and not isinstance(code, bool) and code != 0:
            raise ServiceError(method, result)
    return result
