"""The blocking client: one Unix-socket connection to pylond, newline-delimited JSON-RPC 2.0."""
from __future__ import annotations

import itertools
import json
import os
import socket
import time
from collections import deque
from types import TracebackType
from typing import Any, Callable, Deque, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Type, Union

from .errors import ConnectionClosed, PylonError, Timeout, checked, from_wire

#: A JSON value as the json module reads and writes it.
JSON = Any
#: A ``provide`` handler: params in, result out (raise :class:`PylonError` to fail).
Handler = Callable[[JSON], JSON]


class Notification(NamedTuple):
    """A publication or notification the host forwarded: its ``topic`` and ``params``."""
    topic: str
    params: JSON


class Gap(NamedTuple):
    """A time a reconnecting client was cut off from the host: publications sent then were
    missed, and calls made then failed. ``errors``: what could not be set up again."""
    lost_at: float
    restored_at: float
    reason: str
    errors: Tuple[str, ...] = ()

    @property
    def seconds(self) -> float:
        """How long the client was cut off."""
        return self.restored_at - self.lost_at


#: The topic of the :class:`Notification` a reconnecting client with subscriptions queues after
#: a gap (params: ``{"lostAt", "restoredAt", "seconds", "reason", "errors"}``), so an iterator over
#: its notifications learns that some were missed. No host or plugin publishes it.
GAP_TOPIC = "pylon.client.gap"

#: Calls a reconnecting client makes again after a gap: method → (the call that undoes it, the
#: param that names what it set up). ``push.attach`` is re-attached until ``push.detach``.
REPLAYED = {"push.attach": ("push.detach", "appId")}

#: Reconnect backoff: the first wait (seconds), doubled after each failed attempt up to the most.
RECONNECT_FIRST_DELAY = 0.05
RECONNECT_MAX_DELAY = 2.0


def gap_notification(gap: Gap) -> "Notification":
    """The :data:`GAP_TOPIC` notification for ``gap``."""
    return Notification(GAP_TOPIC, {"lostAt": gap.lost_at, "restoredAt": gap.restored_at, "seconds": gap.seconds,
                                    "reason": gap.reason, "errors": list(gap.errors)})


class _NotSent(ConnectionClosed):
    """The connection was gone before any byte of a message went out."""


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

    With ``reconnect=True`` the client survives a restart of pylond (an upgrade does one): when
    the socket goes away it connects again with backoff (:data:`RECONNECT_FIRST_DELAY` doubling
    to ``reconnect_max_delay``), subscribes, provides and attaches (``push.attach``) again, and
    reports the gap: ``on_gap(gap)``, :attr:`gaps`, and a :data:`GAP_TOPIC` notification among
    its notifications when it has subscriptions. A call in flight when the socket goes away
    raises :class:`ConnectionClosed` (it may or may not have taken effect); the next call
    reconnects first.

    >>> with Client() as bus:
    ...     bus.call("bus.ping")
    """

    def __init__(self, path: Optional[str] = None, timeout: float = 30.0, reconnect: bool = False,
                 on_gap: Optional[Callable[[Gap], None]] = None,
                 reconnect_max_delay: float = RECONNECT_MAX_DELAY) -> None:
        """Connects to ``path`` (default :func:`default_socket_path`); ``timeout`` is the default
        seconds a ``call`` waits for its reply. Raises :class:`ConnectionClosed` if the socket
        cannot be reached (the message says why, e.g. permission denied); ``reconnect``: see
        the class."""
        self.path = path or default_socket_path()
        self.timeout = timeout
        self.reconnect = reconnect
        self.on_gap = on_gap
        self.reconnect_max_delay = reconnect_max_delay
        self._sock: Optional[socket.socket] = self._open()
        self._buf = b""
        self._ids = itertools.count(1)
        self._replies: Dict[Any, Any] = {}
        self._notes: Deque[Notification] = deque()
        self._handlers: Dict[str, Handler] = {}
        self._subs: List[str] = []
        self._replayed: Dict[Tuple[str, str], JSON] = {}
        self._lost: Optional[Tuple[float, str]] = None
        self._restoring = False
        #: The gaps so far (reconnecting clients).
        self.gaps: List[Gap] = []
        self.closed = False

    def _open(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
        except OSError as e:
            sock.close()
            raise ConnectionClosed(f"cannot connect to {self.path}: {e}") from e
        return sock

    # -- lifecycle
    def close(self) -> None:
        """Closes the connection (idempotent); a reconnecting client stops reconnecting."""
        if not self.closed:
            self.closed = True
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()

    @property
    def connected(self) -> bool:
        """Whether the client holds a connection now (a reconnecting one may be between two)."""
        return self._sock is not None

    def _lose(self, reason: str) -> ConnectionClosed:
        """The connection went away: the error to raise (a reconnecting client connects again
        at its next call or read)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._buf = b""
        self._replies.clear()
        if self.reconnect and not self.closed:
            if self._lost is None:
                self._lost = (time.time(), reason)
        else:
            self.closed = True
        return ConnectionClosed(reason)

    def _ensure(self, deadline: Optional[float]) -> socket.socket:
        """The connection, connecting again first (reconnecting clients) until ``deadline``
        (monotonic; None: until it works or the client is closed)."""
        if self._sock is not None:
            return self._sock
        if self.closed or not self.reconnect:
            raise ConnectionClosed("connection closed")
        delay = RECONNECT_FIRST_DELAY
        while True:
            try:
                self._sock = self._open()
                self._restoring = True
                try:
                    errors = self._restore()
                finally:
                    self._restoring = False
                lost_at, reason = self._lost or (time.time(), "")
                gap = Gap(lost_at, time.time(), reason, tuple(errors))
                self._lost = None
                self.gaps.append(gap)
                if self._subs:
                    self._notes.append(gap_notification(gap))
                if self.on_gap is not None:
                    self.on_gap(gap)
                assert self._sock is not None
                return self._sock
            except ConnectionClosed:
                if self._sock is not None:
                    self._sock.close()
                    self._sock = None
            if self.closed:
                raise ConnectionClosed("connection closed")
            if deadline is not None and time.monotonic() + delay > deadline:
                raise ConnectionClosed(f"cannot reconnect to {self.path} (lost: {self._lost[1] if self._lost else ''})")
            time.sleep(delay)
            delay = min(delay * 2, self.reconnect_max_delay)

    def _restore(self) -> List[str]:
        """Subscribes, provides and attaches again on a new connection; what failed (a lost
        connection raises :class:`ConnectionClosed`)."""
        errors: List[str] = []
        steps: List[Tuple[str, JSON]] = [("bus.subscribe", {"pattern": p}) for p in self._subs]
        if self._handlers:
            steps.append(("bus.provide", {"methods": sorted(self._handlers)}))
        steps += [(m, params) for (m, _), params in self._replayed.items()]
        for method, params in steps:
            try:
                self._call_raw(method, params, self.timeout, time.monotonic() + self.timeout)
            except ConnectionClosed:
                raise
            except PylonError as e:
                errors.append(f"{method}: {e}")
        return errors

    # -- sending
    def _send(self, msg: Any) -> None:
        sock = self._sock
        if sock is None:
            raise _NotSent("connection closed")
        data = encode(msg)
        try:
            sent = sock.send(data)
        except OSError as e:
            self._lose(f"connection lost: {e}")
            raise _NotSent(f"connection lost: {e}") from e
        try:
            if sent < len(data):
                sock.sendall(data[sent:])
        except OSError as e:
            raise self._lose(f"connection lost: {e}") from e

    def _sent(self, send: Callable[[], Any], deadline: float) -> None:
        """Runs ``send``; a reconnecting client whose connection turned out to be gone before a
        byte went out connects again and sends it once more (the host never saw it)."""
        try:
            send()
        except _NotSent:
            if not self.reconnect or self.closed or self._restoring:
                raise
            self._ensure(deadline)
            send()

    def notify(self, method: str, params: JSON = None) -> None:
        """Sends a notification (no reply)."""
        msg: Dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        deadline = time.monotonic() + self.timeout
        self._ensure(deadline)
        self._sent(lambda: self._send(msg), deadline)

    def call(self, method: str, params: JSON = None, timeout: Optional[float] = None,
             check: bool = False) -> JSON:
        """Calls ``method`` and returns its result; raises a :class:`PylonError` subclass for an
        error reply, :class:`Timeout` after ``timeout`` seconds (default: the client's).

        With ``check=True`` a result carrying a service failure code (MA and push answer
        ``{"code": N, "message": ...}``, 0 = success) raises :class:`ServiceError` instead of
        being returned."""
        wait = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        self._ensure(deadline)
        result = self._call_raw(method, params, wait, deadline)
        undo = {u: m for m, (u, _) in REPLAYED.items()}
        if method in REPLAYED and isinstance(params, dict):
            self._replayed[(method, str(params.get(REPLAYED[method][1])))] = params
        elif method in undo and isinstance(params, dict):
            self._replayed.pop((undo[method], str(params.get(REPLAYED[undo[method]][1]))), None)
        return checked(method, result) if check else result

    def _call_raw(self, method: str, params: JSON, wait: float, deadline: float) -> JSON:
        rid = next(self._ids)
        msg: Dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        self._sent(lambda: self._send(msg), deadline)
        while rid not in self._replies:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout(f"no reply to {method} within {wait} s", data={"client": True})
            self._read_once(left)
        reply = self._replies.pop(rid)
        if "error" in reply:
            raise from_wire(reply["error"])
        return reply.get("result")

    def batch(self, calls: Sequence[Tuple[str, JSON]], timeout: Optional[float] = None) -> List[Union[JSON, PylonError]]:
        """Sends ``[(method, params), ...]`` as one JSON-RPC batch (one line, one reply) and
        returns each call's result, or its :class:`PylonError` (not raised), in order."""
        if not calls:
            return []
        wait = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        self._ensure(deadline)
        ids = []
        msgs = []
        for method, params in calls:
            rid = next(self._ids)
            ids.append(rid)
            m: Dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
            if params is not None:
                m["params"] = params
            msgs.append(m)
        self._sent(lambda: self._send(msgs), deadline)
        while not all(r in self._replies for r in ids):
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout(f"no reply to a batch of {len(calls)} within {wait} s", data={"client": True})
            self._read_once(left)
        out: List[Union[JSON, PylonError]] = []
        for r in ids:
            reply = self._replies.pop(r)
            out.append(from_wire(reply["error"]) if "error" in reply else reply.get("result"))
        return out

    # -- pub/sub
    def subscribe(self, *patterns: str, timeout: Optional[float] = None) -> Iterator[Notification]:
        """Subscribes to topic patterns and yields :class:`Notification`s as they arrive.

        The iterator ends when the host closes the connection (a reconnecting client connects
        again instead); with ``timeout`` it also ends after that many seconds without a
        notification.
        """
        for p in patterns:
            self.call("bus.subscribe", {"pattern": p})
            if p not in self._subs:
                self._subs.append(p)
        return self.notifications(timeout=timeout)

    def unsubscribe(self, *patterns: str) -> None:
        """Ends subscriptions made with :meth:`subscribe`."""
        for p in patterns:
            self.call("bus.unsubscribe", {"pattern": p})
            if p in self._subs:
                self._subs.remove(p)

    def notifications(self, timeout: Optional[float] = None) -> Iterator[Notification]:
        """Yields queued and incoming notifications (see ``subscribe``)."""
        while True:
            if self._notes:
                yield self._notes.popleft()
                continue
            try:
                self._ensure(None if timeout is None else time.monotonic() + timeout)
            except ConnectionClosed:
                return  # closed, or not back within timeout
            if self._notes:
                continue  # the gap
            try:
                if not self._read_once(timeout):
                    return
            except ConnectionClosed:
                if not self.reconnect or self.closed:
                    return

    # -- bus.provide
    def provide(self, method: str, handler: Handler) -> JSON:
        """Serves ``method`` (``ns.name``) for other clients and plugins: ``handler(params)``
        returns the result or raises :class:`PylonError`. Requests are handled whenever this
        client reads (``serve``, ``call``, iterating notifications)."""
        self._handlers[method] = handler
        try:
            return self.call("bus.provide", {"methods": sorted(self._handlers)})
        except PylonError:
            del self._handlers[method]
            raise

    def unprovide(self, method: str) -> JSON:
        """Stops serving ``method``."""
        r = self.call("bus.unprovide", {"method": method})
        self._handlers.pop(method, None)
        return r

    def serve(self, duration: Optional[float] = None) -> None:
        """Reads and handles provided-method requests, for ``duration`` seconds or until closed
        (a reconnecting client serves on across a restart of the host)."""
        end = None if duration is None else time.monotonic() + duration
        while not self.closed:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return
            try:
                self._ensure(end)
            except ConnectionClosed:
                return  # closed, or not back within duration
            try:
                self._read_once(left)
            except ConnectionClosed:
                if not self.reconnect:
                    return

    # -- reading
    def _read_once(self, timeout: Optional[float]) -> bool:
        """Reads what is available (waiting up to ``timeout``); False on timeout."""
        sock = self._sock
        if sock is None:
            raise ConnectionClosed("connection closed")
        sock.settimeout(timeout)
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            return False
        except OSError as e:
            raise self._lose(f"connection lost: {e}") from e
        if not chunk:
            raise self._lose("the host closed the connection")
        self._buf += chunk
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            if line.strip():
                msg = json.loads(line)
                for m in msg if isinstance(msg, list) else [msg]:
                    if isinstance(m, dict):
                        self._dispatch(m)
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
