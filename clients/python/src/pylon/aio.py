"""The asyncio client: concurrent calls on one connection, notifications, bus.provide handlers."""
from __future__ import annotations

import asyncio
import errno
import inspect
import itertools
import json
import socket
from types import TracebackType
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, List, Optional, Sequence, Tuple, Type, Union

from .client import (JSON, RECONNECT_FIRST_DELAY, RECONNECT_MAX_DELAY, REPLAYED, Gap, Notification,
                     default_socket_path, encode, gap_notification)
from .errors import ConnectionClosed, PylonError, Timeout, checked, from_wire

#: A ``provide`` handler: a plain or ``async`` function of the params.
AsyncHandler = Callable[[JSON], Union[JSON, Awaitable[JSON]]]


async def _connect_unix(path: str, timeout: float) -> socket.socket:
    """A non-blocking connect to ``path`` that waits out a full listen backlog.

    A Unix socket's non-blocking ``connect`` fails with ``EAGAIN`` while the listener's backlog
    is full (another local user flooding the host with connects, say) instead of waiting as a
    blocking one does; asyncio then mistakes the socket for connected. So it is retried, every
    1 ms at first and at most every 50 ms, until ``timeout`` seconds have passed.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    delay = 0.001
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(path)
            return sock
        except BlockingIOError:
            sock.close()
            if loop.time() + delay > deadline:
                raise OSError(errno.EAGAIN, "the host's listen backlog stayed full") from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)
        except BaseException:
            sock.close()
            raise


class AsyncClient:
    """``async with AsyncClient() as bus: await bus.call("bus.ping")``.

    A reader task routes replies to their waiting ``call``s, queues notifications for
    ``subscribe``, and runs ``provide`` handlers (plain or ``async`` functions).

    ``reconnect=True``: as :class:`pylon.Client`, the client survives a restart of the host:
    it connects again with backoff, subscribes, provides and attaches again, and reports each
    gap (``on_gap(gap)``, :attr:`gaps`, a :data:`pylon.client.GAP_TOPIC` notification when it has
    subscriptions); calls made meanwhile wait for the connection within their timeout.
    """

    def __init__(self, path: Optional[str] = None, timeout: float = 30.0, reconnect: bool = False,
                 on_gap: Optional[Callable[[Gap], Any]] = None,
                 reconnect_max_delay: float = RECONNECT_MAX_DELAY) -> None:
        """``path``: the socket (default :func:`default_socket_path`); ``timeout``: the default
        seconds a ``call`` waits; ``reconnect``: see the class. Nothing connects until
        ``connect`` (or ``async with``)."""
        self.path = path or default_socket_path()
        self.timeout = timeout
        self.reconnect = reconnect
        self.on_gap = on_gap
        self.reconnect_max_delay = reconnect_max_delay
        self._ids = itertools.count(1)
        self._pending: Dict[Any, "asyncio.Future[JSON]"] = {}
        self._notes: "asyncio.Queue[Optional[Notification]]" = asyncio.Queue()
        self._handlers: Dict[str, AsyncHandler] = {}
        self._subs: List[str] = []
        self._replayed: Dict[Tuple[str, str], JSON] = {}
        self._reader: Optional[asyncio.StreamReader] = None
        self._writer: Optional[asyncio.StreamWriter] = None
        self._task: Optional["asyncio.Task[None]"] = None
        self._up: Optional[asyncio.Event] = None
        #: The gaps so far (reconnecting clients).
        self.gaps: List[Gap] = []
        self.closed = False

    #: How long ``connect`` keeps retrying a host whose listen backlog is full (seconds).
    connect_timeout = 5.0

    async def _open(self) -> None:
        try:
            sock = await _connect_unix(self.path, self.connect_timeout)
            self._reader, self._writer = await asyncio.open_unix_connection(sock=sock, limit=64 << 20)
        except OSError as e:
            raise ConnectionClosed(f"cannot connect to {self.path}: {e}") from e

    async def connect(self) -> "AsyncClient":
        """Connects (retrying a full listen backlog for ``connect_timeout`` seconds) and starts
        the reader task. Raises :class:`ConnectionClosed` if the socket cannot be reached."""
        await self._open()
        self._up = asyncio.Event()
        self._up.set()
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def close(self) -> None:
        """Closes the connection and stops the reader task (idempotent)."""
        if not self.closed:
            self.closed = True
            if self._writer is not None:
                self._writer.close()
                try:
                    await self._writer.wait_closed()
                except OSError:
                    pass
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass

    async def __aenter__(self) -> "AsyncClient":
        return await self.connect()

    async def __aexit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                        tb: Optional[TracebackType]) -> None:
        await self.close()

    @property
    def connected(self) -> bool:
        """Whether the client holds a connection now."""
        return self._up is not None and self._up.is_set() and not self.closed

    def _writer_or_raise(self) -> asyncio.StreamWriter:
        if self.closed or self._writer is None or not self.connected:
            raise ConnectionClosed("connection closed")
        return self._writer

    def _send(self, msg: Any) -> None:
        self._writer_or_raise().write(encode(msg))

    async def _wait_up(self, timeout: float) -> None:
        """Waits for the connection (a reconnecting client between two), at most ``timeout``."""
        if self.closed:
            raise ConnectionClosed("connection closed")
        if self._up is None or self._up.is_set():
            return
        if not self.reconnect:
            raise ConnectionClosed("connection closed")
        try:
            await asyncio.wait_for(self._up.wait(), timeout)
        except asyncio.TimeoutError:
            raise ConnectionClosed(f"not reconnected to {self.path} within {timeout} s") from None

    async def notify(self, method: str, params: JSON = None) -> None:
        """Sends a notification (no reply)."""
        msg: Dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        await self._wait_up(self.timeout)
        self._send(msg)
        await self._writer_or_raise().drain()

    async def call(self, method: str, params: JSON = None, timeout: Optional[float] = None,
                   check: bool = False) -> JSON:
        """Calls ``method``; returns its result or raises a :class:`PylonError` subclass.
        ``check=True``: a service failure code in the result raises :class:`ServiceError`
        (see :meth:`pylon.Client.call`)."""
        wait = self.timeout if timeout is None else timeout
        start = time.monotonic()
        await self._wait_up(wait)
        result = await self._call_raw(method, params, max(0.001, wait - (time.monotonic() - start)))
        undo = {u: m for m, (u, _) in REPLAYED.items()}
        if method in REPLAYED and isinstance(params, dict):
            self._replayed[(method, str(params.get(REPLAYED[method][1])))] = params
        elif method in undo and isinstance(params, dict):
            self._replayed.pop((undo[method], str(params.get(REPLAYED[undo[method]][1]))), None)
        return checked(method, result) if check else result

    async def _call_raw(self, method: str, params: JSON, wait: float) -> JSON:
        rid = next(self._ids)
        fut: "asyncio.Future[JSON]" = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        msg: Dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        try:
            self._send(msg)
            await self._writer_or_raise().drain()
            return await asyncio.wait_for(fut, wait)
        except asyncio.TimeoutError:
            raise Timeout(f"no reply to {method}", data={"client": True}) from None
        finally:
            self._pending.pop(rid, None)

    async def batch(self, calls: Sequence[Tuple[str, JSON]],
                    timeout: Optional[float] = None) -> List[Union[JSON, PylonError]]:
        """Sends ``[(method, params), ...]`` as one JSON-RPC batch and returns each call's
        result, or its :class:`PylonError` (not raised), in order."""
        if not calls:
            return []
        wait = self.timeout if timeout is None else timeout
        await self._wait_up(wait)
        loop = asyncio.get_running_loop()
        futs: List["asyncio.Future[JSON]"] = []
        msgs = []
        ids = []
        for method, params in calls:
            rid = next(self._ids)
            ids.append(rid)
            fut: "asyncio.Future[JSON]" = loop.create_future()
            self._pending[rid] = fut
            futs.append(fut)
            m: Dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
            if params is not None:
                m["params"] = params
            msgs.append(m)
        try:
            self._send(msgs)
            await self._writer_or_raise().drain()
            done = await asyncio.wait_for(asyncio.gather(*futs, return_exceptions=True), wait)
        except asyncio.TimeoutError:
            raise Timeout(f"no reply to a batch of {len(calls)}", data={"client": True}) from None
        finally:
            for rid in ids:
                self._pending.pop(rid, None)
        out: List[Union[JSON, PylonError]] = []
        for d in done:
            if isinstance(d, ConnectionClosed):
                raise d
            out.append(d)
        return out

    async def subscribe(self, *patterns: str) -> AsyncIterator[Notification]:
        """Subscribes and returns an async iterator of :class:`Notification`s; it ends when the
        host closes the connection (a reconnecting client's goes on)."""
        for p in patterns:
            await self.call("bus.subscribe", {"pattern": p})
            if p not in self._subs:
                self._subs.append(p)
        return self.notifications()

    async def unsubscribe(self, *patterns: str) -> None:
        """Ends subscriptions made with :meth:`subscribe`."""
        for p in patterns:
            await self.call("bus.unsubscribe", {"pattern": p})
            if p in self._subs:
                self._subs.remove(p)

    async def notifications(self) -> AsyncIterator[Notification]:
        """Yields queued and incoming notifications until the host closes the connection."""
        while True:
            n = await self._notes.get()
            if n is None:
                return
            yield n

    async def provide(self, method: str, handler: AsyncHandler) -> JSON:
        """Serves ``method`` with ``handler(params)`` (sync or async); raise PylonError to fail."""
        self._handlers[method] = handler
        try:
            return await self.call("bus.provide", {"methods": sorted(self._handlers)})
        except PylonError:
            del self._handlers[method]
            raise

    async def unprovide(self, method: str) -> JSON:
        """Stops serving ``method``."""
        r = await self.call("bus.unprovide", {"method": method})
        self._handlers.pop(method, None)
        return r

    async def _run(self) -> None:
        """Reads the connection; a reconnecting client then connects again, and again."""
        try:
            while True:
                reason = await self._read_loop()
                for fut in self._pending.values():
                    if not fut.done():
                        fut.set_exception(ConnectionClosed(reason))
                if self.closed or not self.reconnect:
                    return
                assert self._up is not None and self._writer is not None
                self._up.clear()
                self._writer.close()
                lost_at = time.time()
                delay = RECONNECT_FIRST_DELAY
                while not self.closed:
                    try:
                        await self._open()
                        break
                    except ConnectionClosed:
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, self.reconnect_max_delay)
                if self.closed:
                    return
                self._up.set()
                asyncio.get_running_loop().create_task(self._restore(lost_at, reason))
        finally:
            self.closed = True
            self._notes.put_nowait(None)

    async def _restore(self, lost_at: float, reason: str) -> None:
        """Subscribes, provides and attaches again; then reports the gap."""
        errors: List[str] = []
        steps: List[Tuple[str, JSON]] = [("bus.subscribe", {"pattern": p}) for p in self._subs]
        if self._handlers:
            steps.append(("bus.provide", {"methods": sorted(self._handlers)}))
        steps += [(m, params) for (m, _), params in self._replayed.items()]
        for method, params in steps:
            try:
                await self._call_raw(method, params, self.timeout)
            except ConnectionClosed:
                return  # lost again: the next connection restores
            except PylonError as e:
                errors.append(f"{method}: {e}")
        gap = Gap(lost_at, time.time(), reason, tuple(errors))
        self.gaps.append(gap)
        if self._subs:
            self._notes.put_nowait(gap_notification(gap))
        if self.on_gap is not None:
            r = self.on_gap(gap)
            if inspect.isawaitable(r):
                await r

    async def _read_loop(self) -> str:
        """Reads until the connection ends; why it ended."""
        assert self._reader is not None
        try:
            while True:
                line = await self._reader.readline()
                if not line:
                    return "the host closed the connection"
                if line.strip():
                    msg = json.loads(line)
                    for m in msg if isinstance(msg, list) else [msg]:
                        if isinstance(m, dict):
                            await self._dispatch(m)
        except OSError as e:
            return f"connection lost: {e}"

    async def _dispatch(self, msg: Dict[str, Any]) -> None:
        if "method" not in msg:
            fut = self._pending.get(msg.get("id"))
            if fut is not None and not fut.done():
                if "error" in msg:
                    fut.set_exception(from_wire(msg["error"]))
                else:
                    fut.set_result(msg.get("result"))
            return
        if "id" not in msg:
            self._notes.put_nowait(Notification(msg["method"], msg.get("params")))
            return
        asyncio.get_running_loop().create_task(self._serve(msg))

    async def _serve(self, msg: Dict[str, Any]) -> None:
        reply: Dict[str, Any] = {"jsonrpc": "2.0", "id": msg["id"]}
        handler = self._handlers.get(msg["method"])
        try:
            if handler is None:
                raise PylonError(f"method not found: {msg['method']}", code=-32601)
            r = handler(msg.get("params"))
            reply["result"] = await r if inspect.isawaitable(r) else r
        except PylonError as e:
            reply["error"] = e.to_json()
        except Exception as e:
            reply["error"] = {"code": -32603, "message": f"{type(e).__name__}: {e}"}
        if self.connected:
            try:
                self._send(reply)
                await self._writer_or_raise().drain()
            except (ConnectionClosed, OSError):
                pass
