"""Typed JSON-RPC errors: each carries the wire ``code``, ``message`` and ``data`` (docs/PROTOCOL.md)."""


class PylonError(Exception):
    """An error reply. ``code`` is the JSON-RPC code, ``data`` the error's data member (or None)."""

    code = 0

    def __init__(self, message="", code=None, data=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.data = data

    def __str__(self):
        return f"{self.code}: {self.message}" + (f" {self.data}" if self.data is not None else "")

    def to_json(self):
        e = {"code": self.code, "message": self.message}
        if self.data is not None:
            e["data"] = self.data
        return e


class ConnectionClosed(PylonError):
    """The host closed the connection (or was never reachable)."""
    code = -32001


class ParseError(PylonError): code = -32700
class InvalidRequest(PylonError): code = -32600
class MethodNotFound(PylonError): code = -32601
class InvalidParams(PylonError): code = -32602
class InternalError(PylonError): code = -32603
class PluginUnavailable(PylonError): code = -32001
class Timeout(PylonError): code = -32002
class ConsentDenied(PylonError): code = -32003
class Overloaded(PylonError): code = -32004
class NotPermitted(PylonError): code = -32005
class MessageTooLarge(PylonError): code = -32006
class ShuttingDown(PylonError): code = -32007


_BY_CODE = {c.code: c for c in (ParseError, InvalidRequest, MethodNotFound, InvalidParams, InternalError,
                                PluginUnavailable, Timeout, ConsentDenied, Overloaded, NotPermitted,
                                MessageTooLarge, ShuttingDown)}


def from_wire(err):
    """The typed exception for an ``error`` member."""
    code = err.get("code", 0)
    cls = _BY_CODE.get(code, PylonError)
    return cls(err.get("message", ""), code=code, data=err.get("data"))
