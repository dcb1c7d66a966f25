"""The asyncio client: concurrent calls on one connection, notifications, bus.provide handlers."""
from __future__ import annotations

import asyncio
import errno
import inspect
import itertools
import json
import socket
from types import TracebackType
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, Optional, Type, Union

from .client import JSON, Notification, default_socket_path, encode
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
    """

    def __init__(self, path: Optional[str] = None, timeout: float = 30.0) -> None:
        """``path``: the socket (default :func:`default_socket_path`); ``timeout``: the default
        seconds a ``call`` waits. Nothing connects until ``connect`` (or ``async with``)."""
        self.path = path or default_socket_path()
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._pending: Dict[Any, "asyncio.Future[JSON]"] = {}
        self._notes: "asyncio.Queue[Optional[Notification]]" = asyncio.Queue()
        self._handlers: Dict[str, AsyncHandler] = {}
        self._reader: Optional[asyncio.StreamReader] = None
        self._writer: Optional[asyncio.StreamWriter] = None
        self._task: Optional["asyncio.Task[None]"] = None
        self.closed = False

    #: How long ``connect`` keeps retrying a host whose listen backlog is full (seconds).
    connect_timeout = 5.0

    async def connect(self) -> "AsyncClient":
        """Connects (retrying a full listen backlog for ``connect_timeout`` seconds) and starts
        the reader task. Raises :class:`ConnectionClosed` if the socket cannot be reached."""
        try:
            sock = await _connect_unix(self.path, self.connect_timeout)
            self._reader, self._writer = await asyncio.open_unix_connection(sock=sock, limit=64 << 20)
        except OSError as e:
            raise ConnectionClosed(f"cannot connect to {self.path}: {e}") from e
        self._task = asyncio.get_running_loop().create_task(self._read_loop())
        return self

    async def close(self) -> None:
        """Closes the connection and stops the reader task (idempotent)."""
        if self._writer is not None and not self.closed:
            self.closed = True
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

    def _writer_or_raise(self) -> asyncio.StreamWriter:
        if self.closed or self._writer is None:
            raise ConnectionClosed("connection closed")
        return self._writer

    def _send(self, msg: Dict[str, Any]) -> None:
        self._writer_or_raise().write(encode(msg))

    async def notify(self, method: str, params: JSON = None) -> None:
        """Sends a notification (no reply)."""
        msg: Dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        self._send(msg)
        await self._writer_or_raise().drain()

    async def call(self, method: str, params: JSON = None, timeout: Optional[float] = None,
                   check: bool = False) -> JSON:
        """Calls ``method``; returns its result or raises a :class:`PylonError` subclass.
        ``check=True``: a service failure code in the result raises :class:`ServiceError`
        (see :meth:`pylon.Client.call`)."""
        rid = next(self._ids)
        fut: "asyncio.Future[JSON]" = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        msg: Dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        try:
            self._send(msg)
            await self._writer_or_raise().drain()
            result = await asyncio.wait_for(fut, self.timeout if timeout is None else timeout)
            return checked(method, result) if check else result
        except asyncio.TimeoutError:
            raise Timeout(f"no reply to {method}", data={"client": True}) from None
        finally:
            self._pending.pop(rid, None)

    async def subscribe(self, *patterns: str) -> AsyncIterator[Notification]:
        """Subscribes and returns an async iterator of :class:`Notification`s; it ends when the
        host closes the connection."""
        for p in patterns:
            await self.call("bus.subscribe", {"pattern": p})
        return self.notifications()

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
        return await self.call("bus.provide", {"methods": sorted(self._handlers)})

    async def _read_loop(self) -> None:
        assert self._reader is not None
        try:
            while True:
                line = await self._reader.readline()
                if not line:
                    break
                if line.strip():
                    await self._dispatch(json.loads(line))
        finally:
            self.closed = True
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionClosed("the host closed the connection"))
            self._notes.put_nowait(None)

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
        if not self.closed:
            self._send(reply)
            await self._writer_or_raise().drain()
