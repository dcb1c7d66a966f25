"""Write a Pylon plugin in Python: the host starts the script with its bus channel on
``PYLON_BUS_FD``; :class:`Plugin` does the handshake, heartbeats, consent changes and shutdown.

    import pylon
    plugin = pylon.Plugin("greeter", version="1.0")

    @plugin.method("hello", consent="greeter:{appKey}")
    def hello(params, call):
        return {"hi": params.get("who")}

    plugin.run()
"""
from __future__ import annotations

import fnmatch
import json
import logging
import os
import socket
import sys
from typing import Any, Callable, Dict, List, NoReturn, Optional, Sequence, Tuple, TypeVar, Union

from .client import JSON, encode
from .errors import PylonError, from_wire

#: ``on_result(result, error)`` for a call a plugin makes: exactly one of the two is not None.
ResultCallback = Callable[[JSON, Optional[PylonError]], None]
#: A method handler: ``handler(params, call)`` returns the result or :data:`Plugin.LATER`.
MethodHandler = Callable[[JSON, "Call"], JSON]
#: A subscription handler: ``handler(topic, params)``.
TopicHandler = Callable[[str, JSON], None]
F = TypeVar("F", bound=Callable[..., Any])
#: A param (or result member) description: ``{"name", "type", "required"?, "description"?}``.
ParamSpec = Dict[str, Any]
#: A result description: ``{"type", "description"?, "fields"?: [ParamSpec]}``.
ResultSpec = Dict[str, Any]

#: The JSON types a param or result can be declared as (JSON Schema's names; ``any``: several).
JSON_TYPES = ("string", "integer", "number", "boolean", "object", "array", "null", "any")


def param(name: str, type: str = "any", required: bool = False, description: str = "") -> ParamSpec:
    """One param (or result member) of a method description: its ``name``, JSON ``type`` (one of
    :data:`JSON_TYPES`), whether the caller must send it (a result member: always present)."""
    if type not in JSON_TYPES:
        raise ValueError(f"param {name}: type must be one of {', '.join(JSON_TYPES)}")
    return {"name": name, "type": type, "required": required, "description": description}


def result(type: str = "object", description: str = "", fields: Sequence[ParamSpec] = ()) -> ResultSpec:
    """A method's result description: its JSON ``type`` and, for an object, its members
    (:func:`param` entries; ``required=True``: always present)."""
    if type not in JSON_TYPES:
        raise ValueError(f"result: type must be one of {', '.join(JSON_TYPES)}")
    r: ResultSpec = {"type": type, "description": description}
    if fields:
        r["fields"] = [dict(f) for f in fields]
    return r


def method_doc(summary: Optional[str], params: Optional[Sequence[ParamSpec]],
               result_spec: Optional[ResultSpec]) -> Dict[str, Any]:
    """The manifest members that describe a method (``summary``, ``params``, ``result``), as the
    host reads them in ``bus.hello``: an undeclared result is ``any``."""
    return {"summary": summary or "", "params": [dict(p) for p in params or []],
            "result": dict(result_spec) if result_spec is not None else {"type": "any", "description": ""}}


class PrefixFormatter(logging.Formatter):
    """Writes each line of a record with its sd-daemon priority prefix (``<3>`` error, ``<4>``
    warning, ``<6>`` info, ``<7>`` debug): pylond logs a plugin's stderr line at that level
    (journald too), without the prefix."""

    @staticmethod
    def priority(levelno: int) -> int:
        """The syslog priority of a logging level."""
        if levelno >= logging.ERROR:
            return 3 if levelno < logging.CRITICAL else 2
        if levelno >= logging.WARNING:
            return 4
        return 6 if levelno >= logging.INFO else 7

    def format(self, record: logging.LogRecord) -> str:
        """The record, every line prefixed (a traceback stays at the record's level)."""
        p = f"<{self.priority(record.levelno)}>"
        return "\n".join(p + line for line in super().format(record).splitlines() or [""])


def log_handler() -> logging.Handler:
    """A handler writing to stderr with :class:`PrefixFormatter`: what :meth:`Plugin.run`
    installs on the root logger when the program has configured no logging itself."""
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(PrefixFormatter("%(name)s: %(message)s"))
    return h


#: The host's ``PYLON_LOG_LEVEL`` names as logging levels.
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "warning": logging.WARNING,
           "error": logging.ERROR}


class Call:
    """The request a handler serves: ``params``, the host's ``caller`` info (``_pylon``: uid,
    pid, admin, client id; with ``caller_info=True``), and ``call`` to call another method on the
    caller's behalf."""

    def __init__(self, plugin: "Plugin", msg: Dict[str, Any]) -> None:
        self.plugin = plugin
        self.id: Any = msg["id"]
        self.method: str = msg["method"]
        self.params: JSON = msg.get("params")
        self.caller: Optional[Dict[str, Any]] = msg.get("_pylon")

    def call(self, method: str, params: JSON = None, on_result: Optional[ResultCallback] = None) -> None:
        """Calls ``method`` for this request's caller (``_onBehalfOf``); ``on_result(result, error)``."""
        self.plugin.call(method, params, on_result, on_behalf_of=self.id)


class Plugin:
    """A plugin's side of the bus: register methods and subscriptions, then :meth:`run`."""

    #: Returned by a handler that answers later with :meth:`reply`.
    LATER: Any = object()

    def __init__(self, name: Optional[str] = None, version: str = "0", caller_info: bool = False) -> None:
        """``name``: the plugin's namespace (default ``$PYLON_PLUGIN_NAME``, set by the host);
        ``caller_info``: ask the host for each request's caller (``Call.caller``)."""
        self.name: str = name or os.environ.get("PYLON_PLUGIN_NAME") or ""
        self.version = version
        self.caller_info = caller_info
        #: The plugin's ``config`` from pylon.json (after the handshake).
        self.config: Dict[str, Any] = {}
        #: The plugin's private state directory (after the handshake).
        self.state_dir: Optional[str] = os.environ.get("PYLON_PLUGIN_STATE_DIR")
        self.consent: Dict[str, bool] = {}
        self.consent_master = True
        self._methods: Dict[str, Tuple[Dict[str, Any], MethodHandler]] = {}
        self._subs: List[Tuple[str, TopicHandler]] = []
        self._publishes: List[str] = []
        self._pending: Dict[int, ResultCallback] = {}
        self._next_id = 2
        self._sock: Optional[socket.socket] = None
        self.on_ready: Optional[Callable[[], None]] = None
        self.on_consent_changed: Optional[Callable[[Optional[str], bool], None]] = None
        self.on_shutdown: Optional[Callable[[], None]] = None
        #: ``check_config(config) -> warnings``: the plugin's strict reader of its ``config``,
        #: for ``pylond --check-config`` (which runs ``PLUGIN --check-config`` with the config on
        #: stdin). Raise ``ValueError`` (one problem per line) for a config the plugin refuses.
        self.check_config: Optional[Callable[[Dict[str, Any]], List[str]]] = None

    # -- registration
    def method(self, name: str, consent: Optional[str] = None, drop_when_denied: bool = False,
               denied_result: JSON = None, summary: Optional[str] = None,
               params: Optional[Sequence[ParamSpec]] = None,
               result: Optional[ResultSpec] = None) -> Callable[[F], F]:
        """Decorator: ``handler(params, call)`` returns the result (or raises PylonError). Return
        :data:`Plugin.LATER` and answer with ``plugin.reply(call, result)`` to reply later.
        ``consent``: the switch template the host checks first (e.g. ``"greeter:{appKey}"``);
        while it is denied the host answers ConsentDenied, or ``denied_result`` with
        ``drop_when_denied=True``.

        ``summary``, ``params`` (:func:`pylon.param` entries) and ``result`` (:func:`pylon.result`)
        describe the method: ``bus.describe`` and its OpenRPC form show them, and ``pylonctl
        conformance`` compares them with the real plugin's."""
        def register(fn: F) -> F:
            spec: Dict[str, Any] = {"name": name}
            if consent:
                spec["consent"] = consent
                spec["onDenied"] = "drop" if drop_when_denied else "error"
                if denied_result is not None:
                    spec["deniedResult"] = denied_result
            if summary is not None or params is not None or result is not None:
                spec.update(method_doc(summary, params, result))
            self._methods[self._full(name)] = (spec, fn)
            return fn
        return register

    def subscribe(self, pattern: str) -> Callable[[F], F]:
        """Decorator: ``handler(topic, params)`` for publications matching ``pattern``."""
        def register(fn: F) -> F:
            self._subs.append((pattern, fn))
            return fn
        return register

    def publish(self, topic: str, params: JSON = None) -> None:
        """Publishes ``topic`` (in the plugin's namespace) to its subscribers."""
        self._send({"jsonrpc": "2.0", "method": topic, "params": params if params is not None else {}})

    def is_granted(self, key: str) -> bool:
        """Whether the consent switch ``key`` (and the device master switch) is granted."""
        return self.consent_master and self.consent.get(key, True)

    def _full(self, name: str) -> str:
        return name if name.startswith(self.name + ".") else self.name + "." + name

    # -- calls to the host and other plugins
    def call(self, method: str, params: JSON = None, on_result: Optional[ResultCallback] = None,
             on_behalf_of: Any = None) -> None:
        """Calls ``method`` (a host method or another plugin's); ``on_result(result, error)``
        runs when the reply arrives. ``on_behalf_of``: the id of the request being served, so
        the host judges the call as its caller's (see :meth:`Call.call`)."""
        rid = self._next_id
        self._next_id += 1
        self._pending[rid] = on_result or (lambda r, e: None)
        msg: Dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        if on_behalf_of is not None:
            msg["_onBehalfOf"] = on_behalf_of
        self._send(msg)

    def reply(self, call: Call, result: JSON = None, error: Union[PylonError, Dict[str, Any], None] = None) -> None:
        """Answers ``call`` (after a handler returned :data:`Plugin.LATER`): its ``result``, or
        ``error`` (a :class:`PylonError` or a JSON-RPC error object)."""
        msg: Dict[str, Any] = {"jsonrpc": "2.0", "id": call.id}
        if error is not None:
            msg["error"] = error.to_json() if isinstance(error, PylonError) else error
        else:
            msg["result"] = result
        self._send(msg)

    # -- running
    def run(self) -> NoReturn:
        """Handshakes and serves until the host closes the channel or sends bus.shutdown."""
        args = sys.argv[1:]
        if "--help" in args or "--version" in args:
            if "--version" in args:
                print(f"{os.path.basename(sys.argv[0])} {self.version}")
            else:
                print(f"{os.path.basename(sys.argv[0])}: the Pylon \"{self.name}\" plugin. It is started and "
                      "supervised by pylond, which hands it its bus channel (PYLON_BUS_FD); configure it in "
                      "the \"plugins\" list of pylon.json.\nmethods: " + " ".join(sorted(self._methods)))
            sys.exit(0)
        if "--check-config" in args:
            self._check_config_and_exit()
        fd = os.environ.get("PYLON_BUS_FD")
        if fd is None or not self.name:
            sys.stderr.write("PYLON_BUS_FD is not set: plugins are started by pylond\n")
            sys.exit(78)
        root = logging.getLogger()
        if not root.handlers:  # logging.warning(...) reaches pylond's log at its level
            root.addHandler(log_handler())
            root.setLevel(_LEVELS.get(os.environ.get("PYLON_LOG_LEVEL", "info"), logging.INFO))
        self._sock = socket.socket(fileno=int(fd))
        self._send({"jsonrpc": "2.0", "id": 1, "method": "bus.hello", "params": {
            "name": self.name, "version": self.version, "protocol": 1,
            "manifest": {"methods": [s for s, _ in self._methods.values()],
                         "publishes": self._publishes, "subscribes": [p for p, _ in self._subs],
                         "callerInfo": self.caller_info}}})
        buf = b""
        while True:
            try:
                chunk = self._sock.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                self._exit()
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if line.strip():
                    self._handle(json.loads(line))

    def _check_config_and_exit(self) -> NoReturn:
        """``--check-config``: the same contract as the Swift plugin kit (exit 0 or 78)."""
        try:
            text = sys.stdin.read()
            config = json.loads(text) if text.strip() else {}
        except ValueError as e:
            sys.stderr.write(f"--check-config: the config on stdin is not JSON: {e}\n")
            sys.exit(78)
        if self.check_config is None:
            print(f"warning: {os.path.basename(sys.argv[0])} has no configuration checker; "
                  "its settings are not checked before start")
            sys.exit(0)
        try:
            warnings = self.check_config(config)
        except ValueError as e:
            sys.stderr.write(f"{e}\n")
            sys.exit(78)
        for w in warnings or []:
            print(f"warning: {w}")
        print("config ok")
        sys.exit(0)

    def _exit(self) -> NoReturn:
        if self.on_shutdown:
            self.on_shutdown()
        sys.exit(0)

    def _send(self, msg: Dict[str, Any]) -> None:
        if self._sock is None:
            raise PylonError("the plugin is not running (call run() first)")
        self._sock.sendall(encode(msg))

    def _apply_consent(self, snap: Dict[str, Any]) -> None:
        self.consent_master = snap.get("master", True)
        self.consent = dict(snap.get("switches", {}))

    def _handle(self, msg: Dict[str, Any]) -> None:
        method = msg.get("method")
        if method is None:
            if msg.get("id") == 1:  # the welcome
                if "error" in msg:
                    sys.stderr.write(f"handshake refused: {msg['error']}\n")
                    sys.exit(78)
                w = msg.get("result") or {}
                self.config = w.get("config") or {}
                self.state_dir = w.get("stateDir", self.state_dir)
                self._apply_consent(w.get("consent") or {})
                if self.on_ready:
                    self.on_ready()
                return
            rid = msg.get("id")
            cb = self._pending.pop(rid, None) if isinstance(rid, int) else None
            if cb:
                cb(msg.get("result"), from_wire(msg["error"]) if "error" in msg else None)
            return
        if "id" not in msg:
            if method == "bus.shutdown":
                self._exit()
            elif method == "consent.changed":
                p = msg.get("params") or {}
                self.consent_master = p.get("master", self.consent_master)
                if p.get("key") and p["key"] != "device":
                    self.consent[p["key"]] = bool(p.get("granted"))
                if self.on_consent_changed:
                    self.on_consent_changed(p.get("key"), bool(p.get("granted")))
            elif method in self._methods:
                self._methods[method][1](msg.get("params"), Call(self, dict(msg, id=None)))
            else:
                for pattern, fn in self._subs:
                    if fnmatch.fnmatchcase(method, pattern):
                        fn(method, msg.get("params"))
            return
        if method == "bus.heartbeat":
            self._send({"jsonrpc": "2.0", "id": msg["id"], "result": {}})
            return
        entry = self._methods.get(method)
        call = Call(self, msg)
        if entry is None:
            self.reply(call, error={"code": -32601, "message": f"method not found: {method}"})
            return
        try:
            result = entry[1](msg.get("params") or {}, call)
        except PylonError as e:
            self.reply(call, error=e)
            return
        except Exception as e:
            self.reply(call, error={"code": -32603, "message": f"{type(e).__name__}: {e}"})
            return
        if result is not Plugin.LATER:
            self.reply(call, result)
