"""The package's tests start a real pylond (from PYLON_BUILD_DIR, default ../../.build/debug)
through pylon.testing, the kit apps use: the Swift echo plugin and the Python greeter plugin."""
import os

import pytest

from pylon.testing import Pylond, Real, Script, pylond  # noqa: F401  (pylond: the kit's fixture)

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get("PYLON_BUILD_DIR") or os.path.join(HERE, "..", "..", "..", ".build", "debug")
os.environ.setdefault("PYLON_BUILD_DIR", BUILD)


class Host(Pylond):
    """pylond with echo and greeter; the greeter writes ``marker`` when it shuts down."""

    def __init__(self, tmp):
        self.tmp = str(tmp)
        self.marker = os.path.join(self.tmp, "greeter-shutdown")
        self.prom = os.path.join(self.tmp, "pylon.prom")
        greeter = Script("greeter", os.path.join(HERE, "greeter_plugin.py"), config={"greeting": "hello"},
                         env={"GREETER_SHUTDOWN_MARKER": self.marker},
                         heartbeatIntervalMs=200, heartbeatTimeoutMs=1000)
        super().__init__(Real("echo"), greeter, build_dir=BUILD,
                         config={"metricsTextfile": self.prom, "metricsIntervalMs": 1000})
        self.start()


@pytest.fixture
def host(tmp_path):
    h = Host(tmp_path)
    yield h
    h.close()
