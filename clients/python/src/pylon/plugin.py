"""Write a Pylon plugin in Python: the host starts the script with its bus channel on
``PYLON_BUS_FD``; :class:`Plugin` does the handshake, heartbeats, consent changes and shutdown.

    import pylon
    plugin = pylon.Plugin("greeter", version="1.0")

    @plugin.method("hello", consent="greeter:{appKey}")
    def hello(params, call):
        return {"hi": params.get("who")}

    plugin.run()
"""
import json
import os
import socket
import sys

from .client import Notification, encode
from .errors import PylonError, from_wire


class Call:
    """The request a handler serves: ``params``, the host's ``caller`` info (``_pylon``), and
    ``call`` to call another method on the caller's behalf."""

    def __init__(self, plugin, msg):
        self.plugin = plugin
        self.id = msg["id"]
        self.method = msg["method"]
        self.params = msg.get("params")
        self.caller = msg.get("_pylon")

    def call(self, method, params=None, on_result=None):
        """Calls ``method`` for this request's caller (``_onBehalfOf``); ``on_result(result, error)``."""
        self.plugin.call(method, params, on_result, on_behalf_of=self.id)


class Plugin:
    def __init__(self, name=None, version="0", caller_info=False):
        self.name = name or os.environ.get("PYLON_PLUGIN_NAME")
        self.version = version
        self.caller_info = caller_info
        self.config = {}
        self.state_dir = os.environ.get("PYLON_PLUGIN_STATE_DIR")
        self.consent = {}
        self.consent_master = True
        self._methods = {}
        self._subs = []
        self._publishes = []
        self._pending = {}
        self._next_id = 2
        self._sock = None
        self.on_ready = None
        self.on_consent_changed = None
        self.on_shutdown = None

    # -- registration
    def method(self, name, consent=None, drop_when_denied=False, denied_result=None):
        """Decorator: ``handler(params, call)`` returns the result (or raises PylonError). Return
        :data:`Plugin.LATER` and answer with ``plugin.reply(call, result)`` to reply later."""
        def register(fn):
            spec = {"name": name}
            if consent:
                spec["consent"] = consent
                spec["onDenied"] = "drop" if drop_when_denied else "error"
                if denied_result is not None:
                    spec["deniedResult"] = denied_result
            self._methods[self._full(name)] = (spec, fn)
            return fn
        return register

    LATER = object()

    def subscribe(self, pattern):
        """Decorator: ``handler(topic, params)`` for publications matching ``pattern``."""
        def register(fn):
            self._subs.append((pattern, fn))
            return fn
        return register

    def publish(self, topic, params=None):
        self._send({"jsonrpc": "2.0", "method": topic, "params": params if params is not None else {}})

    def is_granted(self, key):
        return self.consent_master and self.consent.get(key, True)

    def _full(self, name):
        return name if name.startswith(self.name + ".") else self.name + "." + name

    # -- calls to the host and other plugins
    def call(self, method, params=None, on_result=None, on_behalf_of=None):
        rid = self._next_id
        self._next_id += 1
        self._pending[rid] = on_result or (lambda r, e: None)
        msg = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        if on_behalf_of is not None:
            msg["_onBehalfOf"] = on_behalf_of
        self._send(msg)

    def reply(self, call, result=None, error=None):
        msg = {"jsonrpc": "2.0", "id": call.id}
        if error is not None:
            msg["error"] = error.to_json() if isinstance(error, PylonError) else error
        else:
            msg["result"] = result
        self._send(msg)

    # -- running
    def run(self):
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
        fd = os.environ.get("PYLON_BUS_FD")
        if fd is None or not self.name:
            sys.stderr.write("PYLON_BUS_FD is not set: plugins are started by pylond\n")
            sys.exit(78)
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

    def _exit(self):
        if self.on_shutdown:
            self.on_shutdown()
        sys.exit(0)

    def _send(self, msg):
        self._sock.sendall(encode(msg))

    def _apply_consent(self, snap):
        self.consent_master = snap.get("master", True)
        self.consent = dict(snap.get("switches", {}))

    def _handle(self, msg):
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
            cb = self._pending.pop(msg.get("id"), None)
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
                from .client import Notification  # noqa: F811
                import fnmatch
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
