"""The blocking client: one Unix-socket connection to pylond, newline-delimited JSON-RPC 2.0."""
from __future__ import annotations

import itertools
import json
import os
import socket
import time
from collections import deque
from types import TracebackType
from typing import Any, Callable, Deque, Dict, Iterator, NamedTuple, Optional, Type

from .errors import ConnectionClosed, PylonError, Timeout, checked, from_wire

#: A JSON value as the json module reads and writes it.
JSON = Any
#: A ``provide`` handler: params in, result out (raise :class:`PylonError` to fail).
Handler = Callable[[JSON], JSON]


class Notification(NamedTuple):
    """A publication or notification the host forwarded: its ``topic`` and ``params``."""
    topic: str
    params: JSON


def default_socket_path() -> str:
    """``$PYLON_SOCKET``, else ``/run/pylon/pylon.sock`` (the installed service's socket)."""
    return os.environ.get("PYLON_SOCKET") or "/run/pylon/pylon.sock"


def encode(msg: Dict[str, Any]) -> bytes:
    """One JSON-RPC line. NaN and the infinities are not JSON: ``ValueError`` here, rather than
    a line the host answers with an ``id: null`` parse error no call would ever receive."""
    return (json.dumps(msg, separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n").encode()


class Client:
    """A blocking connection to the host.

    ``call`` waits for its reply; notifications that arrive meanwhile are queued for
    ``subscribe``/``notifications``; requests for methods this connection ``provide``s are
    answered by their handlers whenever the client reads.

    >>> with Client() as bus:
    ...     bus.call("bus.ping")
    """

    def __init__(self, path: Optional[str] = None, timeout: float = 30.0) -> None:
        """Connects to ``path`` (default :func:`default_socket_path`); ``timeout`` is the default
        seconds a ``call`` waits for its reply. Raises :class:`ConnectionClosed` if the socket
        cannot be reached (the message says why, e.g. permission denied)."""
        self.path = path or default_socket_path()
        self.timeout = timeout
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(self.path)
        except OSError as e:
            self._sock.close()
            raise ConnectionClosed(f"cannot connect to {self.path}: {e}") from e
        self._buf = b""
        self._ids = itertools.count(1)
        self._replies: Dict[Any, Dict[str, Any]] = {}
        self._notes: Deque[Notification] = deque()
        self._handlers: Dict[str, Handler] = {}
        self.closed = False

    # -- lifecycle
    def close(self) -> None:
        """Closes the connection (idempotent)."""
        if not self.closed:
            self.closed = True
            self._sock.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()

    # -- sending
    def _send(self, msg: Dict[str, Any]) -> None:
        try:
            self._sock.sendall(encode(msg))
        except OSError as e:
            self.closed = True
            raise ConnectionClosed(f"connection lost: {e}") from e

    def notify(self, method: str, params: JSON = None) -> None:
        """Sends a notification (no reply)."""
        msg: Dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        self._send(msg)

    def call(self, method: str, params: JSON = None, timeout: Optional[float] = None,
             check: bool = False) -> JSON:
        """Calls ``method`` and returns its result; raises a :class:`PylonError` subclass for an
        error reply, :class:`Timeout` after ``timeout`` seconds (default: the client's).

        With ``check=True`` a result carrying a service failure code (MA and push answer
        ``{"code": N, "message": ...}``, 0 = success) raises :class:`ServiceError` instead of
        being returned."""
        rid = next(self._ids)
        msg: Dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        self._send(msg)
        wait = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        while rid not in self._replies:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout(f"no reply to {method} within {wait} s", data={"client": True})
            self._read_once(left)
        reply = self._replies.pop(rid)
        if "error" in reply:
            raise from_wire(reply["error"])
        result = reply.get("result")
        return checked(method, result) if check else result

    # -- pub/sub
    def subscribe(self, *patterns: str, timeout: Optional[float] = None) -> Iterator[Notification]:
        """Subscribes to topic patterns and yields :class:`Notification`s as they arrive.

        The iterator ends when the host closes the connection; with ``timeout`` it also ends
        after that many seconds without a notification.
        """
        for p in patterns:
            self.call("bus.subscribe", {"pattern": p})
        return self.notifications(timeout=timeout)

    def notifications(self, timeout: Optional[float] = None) -> Iterator[Notification]:
        """Yields queued and incoming notifications (see ``subscribe``)."""
        while True:
            if self._notes:
                yield self._notes.popleft()
                continue
            try:
                if not self._read_once(timeout):
                    return
            except ConnectionClosed:
                return

    # -- bus.provide
    def provide(self, method: str, handler: Handler) -> JSON:
        """Serves ``method`` (``ns.name``) for other clients and plugins: ``handler(params)``
        returns the result or raises :class:`PylonError`. Requests are handled whenever this
        client reads (``serve``, ``call``, iterating notifications)."""
        self._handlers[method] = handler
        return self.call("bus.provide", {"methods": sorted(self._handlers)})

    def serve(self, duration: Optional[float] = None) -> None:
        """Reads and handles provided-method requests, for ``duration`` seconds or until closed."""
        end = None if duration is None else time.monotonic() + duration
        while not self.closed:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return
            try:
                self._read_once(left)
            except ConnectionClosed:
                return

    # -- reading
    def _read_once(self, timeout: Optional[float]) -> bool:
        """Reads what is available (waiting up to ``timeout``); False on timeout."""
        self._sock.settimeout(timeout)
        try:
            chunk = self._sock.recv(65536)
        except socket.timeout:
            return False
        except OSError as e:
            self.closed = True
            raise ConnectionClosed(f"connection lost: {e}") from e
        if not chunk:
            self.closed = True
            raise ConnectionClosed("the host closed the connection")
        self._buf += chunk
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            if line.strip():
                self._dispatch(json.loads(line))
        return True

    def _dispatch(self, msg: Dict[str, Any]) -> None:
        if "method" not in msg:
            if msg.get("id") is not None:
                self._replies[msg["id"]] = msg
            return
        if "id" not in msg:
            self._notes.append(Notification(msg["method"], msg.get("params")))
            return
        handler = self._handlers.get(msg["method"])
        reply: Dict[str, Any] = {"jsonrpc": "2.0", "id": msg["id"]}
        try:
            if handler is None:
                raise PylonError(f"method not found: {msg['method']}", code=-32601)
            reply["result"] = handler(msg.get("params"))
        except PylonError as e:
            reply["error"] = e.to_json()
        except Exception as e:  # a handler bug is the caller's internal error, not ours
            reply["error"] = {"code": -32603, "message": f"{type(e).__name__}: {e}"}
        self._send(reply)
