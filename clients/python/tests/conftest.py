"""Starts a real pylond (from PYLON_BUILD_DIR, default ../../.build/debug) with the Swift echo
plugin and the Python greeter plugin, in a temporary directory."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import pylon

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get("PYLON_BUILD_DIR") or os.path.join(HERE, "..", "..", "..", ".build", "debug")
SRC = os.path.join(HERE, "..", "src")


class Host:
    def __init__(self, tmp):
        self.tmp = str(tmp)
        self.socket = os.path.join(self.tmp, "pylon.sock")
        self.marker = os.path.join(self.tmp, "greeter-shutdown")
        self.prom = os.path.join(self.tmp, "pylon.prom")
        cfg = {
            "socket": self.socket, "stateDir": os.path.join(self.tmp, "state"), "logLevel": "debug",
            "metricsTextfile": os.path.join(self.tmp, "pylon.prom"), "metricsIntervalMs": 1000,
            "plugins": [
                {"name": "echo", "exec": os.path.join(BUILD, "pylon-echo")},
                {"name": "greeter", "exec": sys.executable, "args": [os.path.join(HERE, "greeter_plugin.py")],
                 "heartbeatIntervalMs": 200, "heartbeatTimeoutMs": 1000,
                 "env": {"PYTHONPATH": os.path.abspath(SRC), "GREETER_SHUTDOWN_MARKER": self.marker},
                 "config": {"greeting": "hello"}},
            ],
        }
        self.config = os.path.join(self.tmp, "pylon.json")
        with open(self.config, "w") as f:
            json.dump(cfg, f)
        self.log = open(os.path.join(self.tmp, "pylond.log"), "w")
        env = {k: v for k, v in os.environ.items() if k not in ("PYLON_SOCKET", "PYLON_STATE_DIR", "PYLON_CONFIG")}
        env["PYLON_LOG_FORMAT"] = "logfmt"
        self.proc = subprocess.Popen([os.path.join(BUILD, "pylond"), "--config", self.config],
                                     stderr=self.log, env=env)
        deadline = time.time() + 15
        while True:
            try:
                with pylon.Client(self.socket) as c:
                    st = c.call("bus.status")
                    if all(p["state"] == "running" for p in st["plugins"]):
                        break
            except pylon.PylonError:
                pass
            if time.time() > deadline:
                self.proc.kill()
                raise RuntimeError("pylond did not start: " + self.log_text())
            time.sleep(0.05)

    def log_text(self):
        self.log.flush()
        return open(os.path.join(self.tmp, "pylond.log")).read()

    def client(self):
        return pylon.Client(self.socket, timeout=10)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(15)


@pytest.fixture
def host(tmp_path):
    h = Host(tmp_path)
    yield h
    h.stop()
