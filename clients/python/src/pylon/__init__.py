"""Python client and plugin helper for the Pylon host (pylond).

- :class:`Client`: a blocking client (call, notify, subscribe as an iterator, bus.provide handlers).
- :class:`AsyncClient`: the same on asyncio.
- :class:`Plugin`: write a Pylon plugin in a few lines (handshake, heartbeats, consent, shutdown).
- Errors are :class:`PylonError` subclasses carrying the JSON-RPC ``code``, ``message`` and ``data``.
"""
from .errors import (
    PylonError, ConnectionClosed, ParseError, InvalidRequest, MethodNotFound, InvalidParams, InternalError,
    PluginUnavailable, Timeout, ConsentDenied, Overloaded, NotPermitted, MessageTooLarge, ShuttingDown, Pending, ServiceError,
)
from .client import Client, Notification, default_socket_path
from .aio import AsyncClient
from .plugin import Plugin, Call, param, result

__version__ = "0.1.0"
__all__ = [
    "Client", "AsyncClient", "Plugin", "Call", "param", "result", "Notification", "default_socket_path",
    "PylonError", "ConnectionClosed", "ParseError", "InvalidRequest", "MethodNotFound", "InvalidParams",
    "InternalError", "PluginUnavailable", "Timeout", "ConsentDenied", "Overloaded", "NotPermitted",
    "MessageTooLarge", "ShuttingDown", "Pending",
]
