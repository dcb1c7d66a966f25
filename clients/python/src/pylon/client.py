"""The blocking client: one Unix-socket connection to pylond, newline-delimited JSON-RPC 2.0."""
import itertools
import json
import os
import socket
import time
from collections import deque, namedtuple

from .errors import ConnectionClosed, PylonError, Timeout, from_wire

Notification = namedtuple("Notification", ["topic", "params"])


def default_socket_path():
    """``$PYLON_SOCKET``, else ``/run/pylon/pylon.sock`` (the installed service's socket)."""
    return os.environ.get("PYLON_SOCKET") or "/run/pylon/pylon.sock"


def encode(msg):
    """One JSON-RPC line. NaN and the infinities are not JSON: ``ValueError`` here, rather than
    a line the host answers with an ``id: null`` parse error no call would ever receive."""
    return (json.dumps(msg, separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n").encode()


class Client:
    """A blocking connection to the host.

    ``call`` waits for its reply; notifications that arrive meanwhile are queued for
    ``subscribe``/``notifications``; requests for methods this connection ``provide``s are
    answered by their handlers whenever the client reads.
    """

    def __init__(self, path=None, timeout=30.0):
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
        self._replies = {}
        self._notes = deque()
        self._handlers = {}
        self.closed = False

    # -- lifecycle
    def close(self):
        if not self.closed:
            self.closed = True
            self._sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- sending
    def _send(self, msg):
        try:
            self._sock.sendall(encode(msg))
        except OSError as e:
            self.closed = True
            raise ConnectionClosed(f"connection lost: {e}") from e

    def notify(self, method, params=None):
        """Sends a notification (no reply)."""
        msg = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        self._send(msg)

    def call(self, method, params=None, timeout=None):
        """Calls ``method`` and returns its result; raises a :class:`PylonError` subclass."""
        rid = next(self._ids)
        msg = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        self._send(msg)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while rid not in self._replies:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout(f"no reply to {method} within {timeout or self.timeout} s", data={"client": True})
            self._read_once(left)
        reply = self._replies.pop(rid)
        if "error" in reply:
            raise from_wire(reply["error"])
        return reply.get("result")

    # -- pub/sub
    def subscribe(self, *patterns, timeout=None):
        """Subscribes to topic patterns and yields :class:`Notification`s as they arrive.

        The iterator ends when the host closes the connection; with ``timeout`` it also ends
        after that many seconds without a notification.
        """
        for p in patterns:
            self.call("bus.subscribe", {"pattern": p})
        return self.notifications(timeout=timeout)

    def notifications(self, timeout=None):
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
    def provide(self, method, handler):
        """Serves ``method`` (``ns.name``) for other clients and plugins: ``handler(params)``
        returns the result or raises :class:`PylonError`. Requests are handled whenever this
        client reads (``serve``, ``call``, iterating notifications)."""
        self._handlers[method] = handler
        return self.call("bus.provide", {"methods": sorted(self._handlers)})

    def serve(self, duration=None):
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
    def _read_once(self, timeout):
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

    def _dispatch(self, msg):
        if "method" not in msg:
            if msg.get("id") is not None:
                self._replies[msg["id"]] = msg
            return
        if "id" not in msg:
            self._notes.append(Notification(msg["method"], msg.get("params")))
            return
        handler = self._handlers.get(msg["method"])
        reply = {"jsonrpc": "2.0", "id": msg["id"]}
        try:
            if handler is None:
                raise PylonError(f"method not found: {msg['method']}", code=-32601)
            reply["result"] = handler(msg.get("params"))
        except PylonError as e:
            reply["error"] = e.to_json()
        except Exception as e:  # a handler bug is the caller's internal error, not ours
            reply["error"] = {"code": -32603, "message": f"{type(e).__name__}: {e}"}
        self._send(reply)
