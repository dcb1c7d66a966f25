"""Calls wait for a plugin that is starting or backing off (issue 36 item 3): they go through when
it runs, are answered -32002 at their deadline, and -32001 at once only for a failed plugin."""
import threading

import pytest

import pylon
from pylon.testing import Fake, wait_until


def test_a_call_during_backoff_waits_and_goes_through(pylond):
    ma = Fake("ma", answers={"status": {"code": 0}}, restart="permanent", backoffInitialMs=400, backoffMaxMs=400)
    bus = pylond(ma)
    first = ma.pid
    ma.crash(1)
    wait_until(lambda: bus.plugin_state("ma") == "backoff", what="ma backing off")
    result = {}

    def call():
        with bus.client() as c:
            result["r"] = c.call("ma.status")
    t = threading.Thread(target=call)
    t.start()
    # The host holds the call while ma is down (bus.status counts it), then routes it.
    wait_until(lambda: [p for p in bus.call("bus.status")["plugins"] if p["name"] == "ma"][0]["waiting"] == 1
               or "r" in result, what="the call waiting")
    t.join(20)
    assert result["r"] == {"code": 0} and ma.pid != first
    assert bus.call("bus.status")["counters"]["waited_for_start"] >= 1


def test_a_waiting_call_is_answered_at_its_deadline(pylond):
    ma = Fake("ma", methods=["status"], restart="permanent", backoffInitialMs=60000, backoffMaxMs=60000,
              requestTimeoutMs=300)
    bus = pylond(ma)
    ma.crash(1)
    wait_until(lambda: bus.plugin_state("ma") == "backoff", what="ma backing off")
    with bus.client() as c:
        with pytest.raises(pylon.Timeout) as e:
            c.call("ma.status")
    assert "did not start" in e.value.message and e.value.data["state"] == "backoff"


def test_a_failed_plugin_answers_at_once(pylond):
    ma = Fake("ma", methods=["status"], restart="permanent")
    bus = pylond(ma)
    ma.crash(78)  # EX_CONFIG: failed, not restarted
    wait_until(lambda: bus.plugin_state("ma") == "failed", what="ma failed")
    with bus.client() as c:
        with pytest.raises(pylon.PluginUnavailable) as e:
            c.call("ma.status", timeout=5)
    assert e.value.data["state"] == "failed"
