"""The process a :class:`pylon.testing.Fake` runs as: a real plugin under the private pylond
(handshake, heartbeats, consent, manifest with the fake's method descriptions) that forwards
every request to the test process over a control socket and answers what the test says.

Started by pylond as ``python3 -m pylon._fake_plugin`` with ``PYLON_FAKE_SPEC`` (a JSON file:
name, version, methods, publishes, control socket path). Not meant to be run by hand.
"""
from __future__ import annotations

import itertools
import json
import os
import socket
import sys
import threading
from typing import Any, Dict

from .plugin import Call, Plugin


def main() -> None:
    """Reads the spec, connects to the test's control socket and runs the plugin."""
    spec_path = os.environ.get("PYLON_FAKE_SPEC")
    if not spec_path:
        sys.stderr.write("pylon._fake_plugin: PYLON_FAKE_SPEC is not set (pylon.testing starts this)\n")
        sys.exit(64)
    with open(spec_path) as f:
        spec: Dict[str, Any] = json.load(f)
    if "--check-config" in sys.argv[1:]:
        print("config ok")
        sys.exit(0)
    ctl = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ctl.connect(spec["control"])
    send_lock = threading.Lock()
    ctl_lock = threading.Lock()
    plugin = Plugin(spec["name"], version=spec.get("version", "0-fake"), caller_info=True)
    plugin._publishes = list(spec.get("publishes", []))
    plain_send = plugin._send

    def locked_send(msg: Dict[str, Any]) -> None:
        with send_lock:
            plain_send(msg)
    plugin._send = locked_send  # type: ignore[method-assign]

    def to_test(msg: Dict[str, Any]) -> None:
        with ctl_lock:
            ctl.sendall((json.dumps(msg) + "\n").encode())

    waiting: Dict[int, Call] = {}
    ids = itertools.count(1)

    def forward(params: Any, call: Call) -> Any:
        n = next(ids)
        if call.id is not None:
            waiting[n] = call
        to_test({"call": n, "method": call.method, "params": params, "caller": call.caller,
                 "notification": call.id is None})
        return Plugin.LATER

    for m in spec.get("methods", []):
        plugin.method(m["name"], consent=m.get("consent"), summary=m.get("summary"),
                      params=m.get("params"), result=m.get("result"))(forward)

    def control_reader() -> None:
        buf = b""
        while True:
            chunk = ctl.recv(65536)
            if not chunk:
                os._exit(0)  # the test went away: so does its fake
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                msg = json.loads(line)
                if "reply" in msg:
                    call = waiting.pop(msg["reply"], None)
                    if call is not None:
                        if "error" in msg:
                            plugin.reply(call, error=msg["error"])
                        else:
                            plugin.reply(call, msg.get("result"))
                elif "publish" in msg:
                    plugin.publish(msg["publish"], msg.get("params"))
                    to_test({"published": msg.get("token")})
                elif "exit" in msg:
                    sys.stdout.flush()
                    os._exit(int(msg["exit"]))

    plugin.on_ready = lambda: to_test({"ready": os.getpid()})
    threading.Thread(target=control_reader, daemon=True).start()
    plugin.run()


if __name__ == "__main__":
    main()
