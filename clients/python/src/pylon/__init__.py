"""Python client and plugin helper for the Pylon host (pylond).

- :class:`Client`: a blocking client (call, batch, notify, subscribe as an iterator, bus.provide
  handlers; ``reconnect=True`` survives a restart of the host, reporting each :class:`Gap`).
- :class:`AsyncClient`: the same on asyncio.
- :class:`Plugin`: write a Pylon plugin in a few lines (handshake, heartbeats, consent, shutdown).
- :mod:`pylon.testing`: a private pylond with real, fake or scripted plugins, for an app's tests.
- Errors are :class:`PylonError` subclasses carrying the JSON-RPC ``code``, ``message`` and ``data``.
"""
from .errors import (
    PylonError, ConnectionClosed, ParseError, InvalidRequest, MethodNotFound, InvalidParams, InternalError,
    PluginUnavailable, Timeout, ConsentDenied, Overloaded, NotPermitted, MessageTooLarge, ShuttingDown, Pending, ServiceError,
)
from .client import GAP_TOPIC, Client, Gap, Notification, default_socket_path
from .aio import AsyncClient
from .plugin import Plugin, Call, PrefixFormatter, log_handler, param, result

__version__ = "0.1.0"
__all__ = [
    "Client", "AsyncClient", "Plugin", "Call", "PrefixFormatter", "log_handler", "param", "result", "Notification", "Gap", "GAP_TOPIC",
    "default_socket_path",
    "PylonError", "ConnectionClosed", "ParseError", "InvalidRequest", "MethodNotFound", "InvalidParams",
    "InternalError", "PluginUnavailable", "Timeout", "ConsentDenied", "Overloaded", "NotPermitted",
    "MessageTooLarge", "ShuttingDown", "Pending",
]
