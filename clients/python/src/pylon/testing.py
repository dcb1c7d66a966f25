"""Test an app (or a plugin) against a private Pylon host: its own pylond, socket and state
directory, free of the system's, with any set of plugins, each one of

- :class:`Real`: a real plugin from the build or the install (``Real("uploader", config={...})``,
  or just its name as a string);
- :class:`Fake`: a stand-in the test scripts: it records calls, answers canned results and
  errors, publishes, hangs or crashes on command, and describes its methods;
- :class:`Script`: a plugin written with :class:`pylon.Plugin` (a Python file);
- :class:`Exec`: any executable that speaks the plugin protocol.

Five lines from ``import`` to a test that swaps the real ``push`` for a fake (``pylond`` is this
module's pytest fixture; the package registers it, or ``from pylon.testing import pylond``)::

    from pylon.testing import Fake

    def test_login_binds_the_user(pylond):
        bus = pylond(Fake("push", answers={"bind": {"code": 0, "message": ""}}))
        my_app.login(bus.socket, "alice")
        assert bus["push"].calls("bind")[0].params == {"userId": "alice"}

Without pytest: ``with Pylond(Fake("push")) as bus: ...``. pylond is found in
``$PYLON_BUILD_DIR``, else on ``PATH``, else ``/usr/bin``; real plugins are found as pylond finds
them (next to it, then on ``PATH``). :func:`conformance` checks a plugin against the real one's
declared contract (``pylonctl conformance``).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from types import TracebackType
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Type, Union

from .client import JSON, Client
from .aio import AsyncClient
from .errors import PylonError
from .plugin import ParamSpec, ResultSpec, method_doc

#: A handler's answer that is never sent: the caller waits until its deadline (``-32002``).
HANG: Any = object()

_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def find_pylond(build_dir: Optional[str] = None) -> str:
    """The pylond to start: ``build_dir/pylond``, ``$PYLON_BUILD_DIR/pylond``, ``pylond`` on
    ``PATH``, or ``/usr/bin/pylond``. Raises ``FileNotFoundError`` naming where it looked."""
    tried = []
    for d in (build_dir, os.environ.get("PYLON_BUILD_DIR")):
        if d:
            p = os.path.join(d, "pylond")
            if os.access(p, os.X_OK):
                return p
            tried.append(p)
    for found in (shutil.which("pylond"), "/usr/bin/pylond", "/usr/sbin/pylond"):
        if found and os.access(found, os.X_OK):
            return found
    raise FileNotFoundError("pylond not found (looked in " + ", ".join(tried + ["PATH", "/usr/bin"]) +
                            "); set PYLON_BUILD_DIR to the directory that holds it")


class PluginSpec:
    """One plugin of a private host: its ``name`` and its entry in the host's ``plugins`` list."""

    def __init__(self, name: str, config: Optional[Dict[str, Any]] = None,
                 env: Optional[Dict[str, str]] = None, **settings: Any) -> None:
        """``config``: the plugin's ``config`` member; ``env``: extra environment; ``settings``:
        other members of its entry (``restart``, ``heartbeatIntervalMs``, ... as in pylon.json)."""
        self.name = name
        self.config = config
        self.env = dict(env or {})
        self.settings = settings
        #: The host this plugin runs under (set by :class:`Pylond`).
        self.host: Optional["Pylond"] = None

    def exec_args(self) -> Dict[str, Any]:
        """``exec`` and ``args`` of the entry."""
        raise NotImplementedError

    def entry(self, host: "Pylond") -> Dict[str, Any]:
        """The plugin's member of the host configuration's ``plugins`` list."""
        self.host = host
        e: Dict[str, Any] = {"name": self.name}
        e.update(self.exec_args())
        if self.config is not None:
            e["config"] = self.config
        if self.env:
            e["env"] = dict(self.env)
        e.update(self.settings)
        return e

    def started(self) -> None:
        """Called once the host runs (a fake then has its process connected)."""

    def stopped(self) -> None:
        """Called when the host has stopped."""


class Real(PluginSpec):
    """A real plugin: ``pylon-NAME`` as pylond finds it (next to pylond, then on ``PATH``), or
    ``exec``."""

    def __init__(self, name: str, config: Optional[Dict[str, Any]] = None, exec: Optional[str] = None,
                 **settings: Any) -> None:
        """See :class:`PluginSpec`; ``exec``: another executable than ``pylon-NAME``."""
        super().__init__(name, config, **settings)
        self.exec = exec or f"pylon-{name}"

    def exec_args(self) -> Dict[str, Any]:
        """``{"exec": "pylon-NAME"}``."""
        return {"exec": self.exec}


class Exec(PluginSpec):
    """Any executable that speaks the plugin protocol, with its ``args``."""

    def __init__(self, name: str, exec: str, args: Sequence[str] = (), config: Optional[Dict[str, Any]] = None,
                 **settings: Any) -> None:
        """See :class:`PluginSpec`."""
        super().__init__(name, config, **settings)
        self.exec = exec
        self.args = list(args)

    def exec_args(self) -> Dict[str, Any]:
        """``exec`` and ``args``."""
        return {"exec": self.exec, "args": self.args}


class Script(PluginSpec):
    """A plugin written with :class:`pylon.Plugin`: ``path`` run by this Python, which finds this
    ``pylon`` package (``PYTHONPATH``)."""

    def __init__(self, name: str, path: str, args: Sequence[str] = (), config: Optional[Dict[str, Any]] = None,
                 **settings: Any) -> None:
        """See :class:`PluginSpec`."""
        super().__init__(name, config, **settings)
        self.path = os.path.abspath(path)
        self.args = list(args)
        self.env.setdefault("PYTHONPATH", _PACKAGE_PARENT)

    def exec_args(self) -> Dict[str, Any]:
        """``sys.executable`` and the script."""
        return {"exec": sys.executable, "args": [self.path] + self.args}


class FakeCall(NamedTuple):
    """A request (or notification) a :class:`Fake` received."""
    #: The full method name (``push.bind``).
    method: str
    params: JSON
    #: Who called: ``{"client": N, "uid": U, "pid": P}`` or ``{"plugin": name}``.
    caller: Optional[Dict[str, Any]]


Answer = Union[JSON, Callable[[JSON], JSON]]


class Fake(PluginSpec):
    """A stand-in plugin the test scripts. It is a real plugin process under the private pylond
    (handshake, heartbeats, consent checks by the host), which hands every request to this
    object: it is recorded (:meth:`calls`, :meth:`wait_for_call`) and answered as set with
    :meth:`answer`, :meth:`fail`, :meth:`hang` or :meth:`on`.

    ``answers``: method (short or full name) → result, or a function of the params; every method
    named in ``answers``, ``methods``, ``docs`` or ``consent`` is served (a plugin's methods are
    fixed at its handshake); one without an answer answers ``{}``. ``consent``: method → switch
    template (``"push:opens"``); ``docs``: method → ``{"summary", "params", "result"}`` (see
    :func:`pylon.param`, :func:`pylon.result`) so the fake describes itself; ``publishes``:
    topics it may publish.
    """

    def __init__(self, name: str, answers: Optional[Dict[str, Answer]] = None, methods: Sequence[str] = (),
                 consent: Optional[Dict[str, str]] = None, docs: Optional[Dict[str, Dict[str, Any]]] = None,
                 publishes: Sequence[str] = (), version: str = "0-fake", **settings: Any) -> None:
        """See the class."""
        super().__init__(name, **settings)
        self.version = version
        self.publishes = list(publishes)
        self._consent = {self._full(k): v for k, v in (consent or {}).items()}
        self._docs = {self._full(k): dict(v) for k, v in (docs or {}).items()}
        self._behaviour: Dict[str, Callable[[JSON], JSON]] = {}
        self._methods: List[str] = []
        for m in list(methods) + list(answers or {}) + list(self._docs) + list(self._consent):
            if self._full(m) not in self._methods:
                self._methods.append(self._full(m))
        for m, a in (answers or {}).items():
            self.answer(m, a)
        self._calls: List[FakeCall] = []
        self._cond = threading.Condition()
        self._conn: Optional[socket.socket] = None
        self._conn_lock = threading.Lock()
        self._listener: Optional[socket.socket] = None
        self._control_path = ""
        self._pid: Optional[int] = None
        self._published: set[int] = set()
        self._token = 0

    def _full(self, method: str) -> str:
        return method if method.startswith(self.name + ".") else f"{self.name}.{method}"

    def _served(self, method: str) -> str:
        full = self._full(method)
        if self.host is not None and full not in self._methods:
            raise ValueError(f"{full} is not one of the fake's methods ({', '.join(self._methods)}): "
                             "name it in answers=, methods= or docs= when creating the Fake")
        if full not in self._methods:
            self._methods.append(full)
        return full

    # -- scripting
    def answer(self, method: str, result: Answer) -> "Fake":
        """``method`` answers ``result`` (a JSON value, or a function of the params that returns
        one, raises :class:`pylon.PylonError`, or returns :data:`HANG`)."""
        full = self._served(method)
        if callable(result):
            self._behaviour[full] = result
        else:
            canned: JSON = result
            self._behaviour[full] = lambda params: canned
        return self

    def on(self, method: str) -> Callable[[Callable[[JSON], JSON]], Callable[[JSON], JSON]]:
        """Decorator: ``handler(params)`` answers ``method`` (see :meth:`answer`)."""
        def register(fn: Callable[[JSON], JSON]) -> Callable[[JSON], JSON]:
            self.answer(method, fn)
            return fn
        return register

    def fail(self, method: str, error: Union[PylonError, int], message: str = "refused by the fake",
             data: JSON = None) -> "Fake":
        """``method`` answers a JSON-RPC error: a :class:`pylon.PylonError`, or a ``code``."""
        err = error if isinstance(error, PylonError) else PylonError(message, code=error, data=data)

        def raise_it(params: JSON) -> JSON:
            raise err
        return self.answer(method, raise_it)

    def hang(self, method: str) -> "Fake":
        """``method`` never answers: the caller gets the host's ``-32002`` at its deadline."""
        return self.answer(method, lambda p: HANG)

    def describe(self, method: str, summary: str = "", params: Optional[Sequence[ParamSpec]] = None,
                 result: Optional[ResultSpec] = None) -> "Fake":
        """Declares what ``method`` takes and answers (before the host starts): ``bus.describe``
        shows it and ``pylonctl conformance`` checks it."""
        full = self._served(method)
        self._docs[full] = method_doc(summary, params, result)
        return self

    def publish(self, topic: str, params: JSON = None, timeout: float = 10.0) -> None:
        """The fake plugin publishes ``topic`` (``NAME.…``; name it in ``publishes=``); returns
        once the plugin has sent it to the host."""
        with self._cond:
            self._token += 1
            token = self._token
        self._to_plugin({"publish": topic, "params": params if params is not None else {}, "token": token}, timeout)
        with self._cond:
            if not self._cond.wait_for(lambda: token in self._published, timeout):
                raise TimeoutError(f"fake {self.name} did not publish {topic} within {timeout} s")

    def crash(self, status: int = 1, timeout: float = 10.0) -> None:
        """The fake plugin's process exits with ``status`` (78: its configuration is wrong, the
        host marks it failed; another: the host restarts it after its backoff)."""
        self._to_plugin({"exit": status}, timeout)

    # -- what happened
    def calls(self, method: Optional[str] = None) -> List[FakeCall]:
        """The calls received so far (of ``method``, short or full name), oldest first."""
        with self._cond:
            return [c for c in self._calls if method is None or c.method == self._full(method)]

    def wait_for_call(self, method: str, timeout: float = 10.0, count: int = 1) -> FakeCall:
        """Waits until ``method`` was called ``count`` times; returns that call."""
        full = self._full(method)
        with self._cond:
            ok = self._cond.wait_for(lambda: len([c for c in self._calls if c.method == full]) >= count, timeout)
            got = [c for c in self._calls if c.method == full]
        if not ok:
            raise TimeoutError(f"{full} was called {len(got)} times within {timeout} s, not {count}")
        return got[count - 1]

    @property
    def pid(self) -> Optional[int]:
        """The fake plugin's process id (its latest start)."""
        return self._pid

    # -- the plugin side
    def exec_args(self) -> Dict[str, Any]:
        """Runs ``python3 -m pylon._fake_plugin`` with the fake's spec."""
        return {"exec": sys.executable, "args": ["-m", "pylon._fake_plugin"]}

    def entry(self, host: "Pylond") -> Dict[str, Any]:
        """Writes the spec, opens the control socket and returns the plugin entry."""
        self.host = host
        self._control_path = os.path.join(host.dir, f"fake-{self.name}.ctl")
        spec_path = os.path.join(host.dir, f"fake-{self.name}.json")
        methods = []
        for m in self._methods:
            e: Dict[str, Any] = {"name": m}
            if m in self._consent:
                e["consent"] = self._consent[m]
            e.update(self._docs.get(m, {}))
            methods.append(e)
        with open(spec_path, "w") as f:
            json.dump({"name": self.name, "version": self.version, "methods": methods,
                       "publishes": self.publishes, "control": self._control_path}, f)
        if self._listener is None:
            self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._listener.bind(self._control_path)
            self._listener.listen(4)
            threading.Thread(target=self._accept, daemon=True).start()
        self.env.setdefault("PYTHONPATH", _PACKAGE_PARENT)
        self.env["PYLON_FAKE_SPEC"] = spec_path
        return super().entry(host)

    def stopped(self) -> None:
        """Closes the control socket."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        with self._conn_lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _accept(self) -> None:
        listener = self._listener
        while listener is not None:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _to_plugin(self, msg: Dict[str, Any], timeout: float) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._conn is not None, timeout):
                raise TimeoutError(f"fake {self.name} is not running")
        with self._conn_lock:
            assert self._conn is not None
            self._conn.sendall((json.dumps(msg) + "\n").encode())

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        try:
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    self._handle(conn, json.loads(line))
        except OSError:
            pass
        finally:
            with self._cond:
                if self._conn is conn:
                    self._conn = None
            conn.close()

    def _handle(self, conn: socket.socket, msg: Dict[str, Any]) -> None:
        if "ready" in msg:
            with self._conn_lock:
                self._conn = conn
            with self._cond:
                self._pid = msg["ready"]
                self._cond.notify_all()
            return
        if "published" in msg:
            with self._cond:
                self._published.add(msg["published"])
                self._cond.notify_all()
            return
        call = FakeCall(msg["method"], msg.get("params"), msg.get("caller"))
        with self._cond:
            self._calls.append(call)
            self._cond.notify_all()
        if msg.get("notification"):
            return
        reply: Dict[str, Any] = {"reply": msg["call"]}
        behaviour = self._behaviour.get(call.method)
        try:
            r = behaviour(call.params) if behaviour is not None else {}
            if r is HANG:
                return
            reply["result"] = r
        except PylonError as e:
            reply["error"] = e.to_json()
        except Exception as e:  # a bug in the test's handler: the caller sees it
            reply["error"] = {"code": -32603, "message": f"fake {call.method}: {type(e).__name__}: {e}"}
        with self._conn_lock:
            conn.sendall((json.dumps(reply) + "\n").encode())


def _as_spec(p: Union[str, PluginSpec]) -> PluginSpec:
    return Real(p) if isinstance(p, str) else p


class Pylond:
    """A private pylond: its own directory (socket, state, config, log) under ``/tmp``, the
    given plugins, stopped by :meth:`stop` (or the ``with`` block's end) and its directory
    removed. ``bus["push"]`` is the plugin spec named push (a :class:`Fake`'s calls and script).

    ``config``: more members of the host configuration (``limits``, ``permissions``,
    ``metricsTextfile``, ...); ``log_format``: ``logfmt`` (default), ``text``, ``prefixed``;
    ``start_timeout``: seconds to wait for every plugin to run.
    """

    def __init__(self, *plugins: Union[str, PluginSpec], build_dir: Optional[str] = None,
                 config: Optional[Dict[str, Any]] = None, log_format: str = "logfmt",
                 log_level: str = "debug", start_timeout: float = 20.0, keep_dir: bool = False) -> None:
        """See the class; a plugin given as a string is :class:`Real`."""
        self.pylond = find_pylond(build_dir)
        self.plugins: Dict[str, PluginSpec] = {}
        for p in plugins:
            spec = _as_spec(p)
            if spec.name in self.plugins:
                raise ValueError(f"two plugins named {spec.name}")
            self.plugins[spec.name] = spec
        self.extra_config = dict(config or {})
        self.log_format = log_format
        self.log_level = log_level
        self.start_timeout = start_timeout
        self.keep_dir = keep_dir
        #: The host's directory: ``pylon.sock``, ``state/``, ``pylon.json``, ``pylond.log``.
        self.dir = tempfile.mkdtemp(prefix="pylon-test-")
        self.socket = os.path.join(self.dir, "pylon.sock")
        self.state_dir = os.path.join(self.dir, "state")
        self.config_path = os.path.join(self.dir, "pylon.json")
        self.log_path = os.path.join(self.dir, "pylond.log")
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self._log: Optional[Any] = None

    def __getitem__(self, name: str) -> Any:
        return self.plugins[name]

    def write_config(self) -> None:
        """Writes ``pylon.json`` (the plugins and ``config``)."""
        cfg: Dict[str, Any] = {"socket": self.socket, "stateDir": self.state_dir, "logLevel": self.log_level}
        cfg.update(self.extra_config)
        cfg["plugins"] = [p.entry(self) for p in self.plugins.values()]
        with open(self.config_path, "w") as f:
            json.dump(cfg, f, indent=1)

    def start(self, wait: bool = True) -> "Pylond":
        """Starts pylond and (``wait``) waits until every plugin is running; raises
        ``RuntimeError`` with pylond's log when it does not get there in ``start_timeout``."""
        self.write_config()
        self._log = open(self.log_path, "ab")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYLON_")}
        env["PYLON_LOG_FORMAT"] = self.log_format
        self.proc = subprocess.Popen([self.pylond, "--config", self.config_path], stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=self._log, env=env)
        if wait:
            self.wait_running()
        return self

    def wait_running(self, timeout: Optional[float] = None) -> None:
        """Waits until pylond answers and every plugin is ``running`` (each fake connected)."""
        limit = self.start_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"pylond exited with status {self.proc.returncode}: {self.log_text()}")
            try:
                with Client(self.socket, timeout=5) as c:
                    st = c.call("bus.status")
                fakes_ready = all(p.pid is not None for p in self.plugins.values() if isinstance(p, Fake))
                if fakes_ready and all(p["state"] == "running" for p in st["plugins"]):
                    break
            except PylonError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"pylond's plugins were not all running within {limit} s: {self.log_text()}")
            time.sleep(0.02)
        for p in self.plugins.values():
            p.started()

    def stop(self, timeout: float = 15.0) -> Optional[int]:
        """Stops pylond (SIGTERM: it stops its plugins) and returns its exit status; idempotent."""
        status = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            status = self.proc.returncode
        if self._log is not None:
            self._log.close()
            self._log = None
        return status

    def kill(self) -> None:
        """Kills pylond at once (SIGKILL), as a crash would: its plugins see their channel close."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        """Stops pylond, then removes the host's directory (unless ``keep_dir``)."""
        self.stop()
        for p in self.plugins.values():
            p.stopped()
        if not self.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "Pylond":
        if self.proc is None:
            try:
                self.start()
            except BaseException:
                self.close()
                raise
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()

    # -- using it
    def client(self, timeout: float = 10.0) -> Client:
        """A :class:`pylon.Client` on the private socket."""
        return Client(self.socket, timeout=timeout)

    def async_client(self, timeout: float = 10.0) -> AsyncClient:
        """A :class:`pylon.AsyncClient` on the private socket (``async with``)."""
        return AsyncClient(self.socket, timeout=timeout)

    def call(self, method: str, params: JSON = None, timeout: float = 10.0) -> JSON:
        """One call on a connection of its own."""
        with self.client(timeout) as c:
            return c.call(method, params)

    def plugin_state(self, name: str) -> str:
        """The plugin's state in ``bus.status`` (``running``, ``starting``, ``backoff``, ...)."""
        for p in self.call("bus.status")["plugins"]:
            if p["name"] == name:
                return str(p["state"])
        raise KeyError(name)

    def log_text(self) -> str:
        """pylond's log so far (its plugins' stderr included)."""
        if self._log is not None:
            self._log.flush()
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def ctl(self, *args: str, timeout: float = 30.0) -> "subprocess.CompletedProcess[str]":
        """Runs ``pylonctl --socket SOCKET ARGS`` (the pylonctl beside pylond)."""
        return subprocess.run([os.path.join(os.path.dirname(self.pylond), "pylonctl"), "--socket", self.socket,
                               *args], capture_output=True, text=True, timeout=timeout)


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02,
               what: str = "condition") -> Any:
    """Polls ``predicate`` until it returns a true value (returned) or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        v = predicate()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout} s")
        time.sleep(interval)


class ConformanceReport(NamedTuple):
    """What :func:`conformance` found: ``ok``, the ``problems`` (each names its method) and
    pylonctl's whole ``output``."""
    ok: bool
    problems: List[str]
    output: str


def conformance(exec: str, as_plugin: str, args: Sequence[str] = (), build_dir: Optional[str] = None,
                config: Optional[Dict[str, Any]] = None, timeout: float = 120.0) -> ConformanceReport:
    """Checks the plugin ``exec`` (with ``args``) against the real ``as_plugin``'s declared
    contract: ``pylonctl conformance --as NAME -- EXEC ARGS`` (see pylonctl(1)), with this
    ``pylon`` package on the plugin's ``PYTHONPATH``. ``conformance(sys.executable, "push",
    ["fake_push.py"]).ok``; each of ``problems`` names its method."""
    pylonctl = os.path.join(os.path.dirname(find_pylond(build_dir)), "pylonctl")
    cmd = [pylonctl, "conformance", "--as", as_plugin]
    if config is not None:
        cmd += ["--config", json.dumps(config)]
    cmd += ["--", exec, *args]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (_PACKAGE_PARENT, os.environ.get("PYTHONPATH")) if x)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    problems = [line[len("FAIL "):] for line in r.stdout.splitlines() if line.startswith("FAIL ")]
    return ConformanceReport(r.returncode == 0, problems, r.stdout + r.stderr)


try:
    import pytest
except ImportError:  # pragma: no cover - the fixture needs pytest; the rest does not
    pytest = None  # type: ignore[assignment]

if pytest is not None:
    @pytest.fixture
    def pylond() -> Iterator[Callable[..., Pylond]]:
        """A factory: ``pylond(*plugins, **options)`` starts a private :class:`Pylond` (stopped
        and removed after the test)."""
        started: List[Pylond] = []

        def start(*plugins: Union[str, PluginSpec], **options: Any) -> Pylond:
            host = Pylond(*plugins, **options)
            started.append(host)
            try:
                return host.start()
            except BaseException:
                host.close()
                raise
        yield start
        for h in started:
            h.close()
