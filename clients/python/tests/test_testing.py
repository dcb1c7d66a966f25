"""pylon.testing, tested by using it as an app's tests would: a fake push the app binds a user
with, a fake uploader that refuses, a fake ma that hangs, a fake that publishes, crashes and
describes itself, beside real plugins."""
import pytest

import pylon
from pylon.testing import HANG, Fake, Pylond, wait_until


def login(socket_path, user):
    """The "app" under test: binds its user for push messages, failing loudly."""
    with pylon.Client(socket_path, timeout=10) as bus:
        return bus.call("push.bind", {"userId": user}, check=True)


def test_a_fake_push_in_five_lines(pylond):
    bus = pylond(Fake("push", answers={"bind": {"code": 0, "message": ""}}))
    login(bus.socket, "alice")
    assert bus["push"].calls("bind")[0].params == {"userId": "alice"}
    # The fake's answer is what the app saw; a service failure reaches it too.
    bus["push"].answer("bind", lambda p: {"code": 3012, "message": "no token yet"})
    with pytest.raises(pylon.ServiceError) as e:
        login(bus.socket, "bob")
    assert e.value.code == 3012
    assert [c.params["userId"] for c in bus["push"].calls("push.bind")] == ["alice", "bob"]
    caller = bus["push"].calls()[0].caller
    assert caller is not None and isinstance(caller["client"], int)


def test_a_fake_uploader_that_refuses_beside_a_real_plugin(pylond):
    uploader = Fake("uploader", methods=["enqueue"]).fail("enqueue", pylon.Overloaded("queue full", data={"limit": "x"}))
    bus = pylond("echo", uploader)
    with bus.client() as c:
        assert c.call("echo.echo", {"a": 1}) == {"a": 1}
        with pytest.raises(pylon.Overloaded) as e:
            c.call("uploader.enqueue", {"stream": "s", "records": [{"id": "1", "data": {}}]})
        assert e.value.code == -32004 and e.value.message == "queue full" and e.value.data == {"limit": "x"}
        uploader.fail("enqueue", -32602, "records: expected an array")
        with pytest.raises(pylon.InvalidParams):
            c.call("uploader.enqueue", {"stream": "s"})
    assert len(uploader.calls("enqueue")) == 2


def test_a_fake_ma_that_hangs_times_out_at_the_hosts_deadline(pylond):
    ma = Fake("ma", answers={"start": {"code": 0}}).hang("eventRecord")
    bus = pylond(ma, config={"limits": {"requestTimeoutMs": 300}})
    with bus.client() as c:
        assert c.call("ma.start", {"appKey": "k"}) == {"code": 0}
        with pytest.raises(pylon.Timeout) as e:
            c.call("ma.eventRecord", {"appKey": "k", "eventName": "e"})
        assert e.value.code == -32002 and not (e.value.data or {}).get("client")
        # The handler form: HANG for some params only.
        ma.answer("eventRecord", lambda p: HANG if p["eventName"] == "slow" else {"code": 0})
        assert c.call("ma.eventRecord", {"appKey": "k", "eventName": "fast"}) == {"code": 0}
    assert [x.params["eventName"] for x in ma.calls("eventRecord")] == ["e", "fast"]


def test_a_fake_publishes_crashes_and_comes_back(pylond):
    push = Fake("push", methods=["status"], publishes=["push.message"], restart="permanent")
    bus = pylond(push)
    with bus.client() as c:
        notes = c.subscribe("push.message", timeout=10)
        push.publish("push.message", {"id": "m1"})
        n = next(notes)
        assert n.topic == "push.message" and n.params == {"id": "m1"}
    first = push.pid
    push.crash(1)
    wait_until(lambda: push.pid != first and bus.plugin_state("push") == "running", timeout=20,
               what="the fake restarted")
    assert bus.call("push.status") == {}


def test_a_fake_describes_itself_and_its_consent_switch(pylond):
    push = Fake("push", answers={"openLogReport": {"code": 0, "message": ""}},
                consent={"openLogReport": "push:opens"},
                docs={"openLogReport": {"summary": "Report an opened message",
                                        "params": [pylon.param("userInfo", "object", required=True)],
                                        "result": pylon.result("object", fields=[pylon.param("code", "integer", True)])}})
    bus = pylond(push)
    d = bus.call("bus.describe")["plugins"]["push"]["methods"][0]
    assert d["summary"] == "Report an opened message" and d["consent"] == "push:opens"
    assert d["params"][0]["name"] == "userInfo" and d["result"]["fields"][0]["name"] == "code"
    out = bus.ctl("describe").stdout
    assert "push.openLogReport" in out and "params: userInfo" in out and "not declared" not in out
    with bus.client() as c:
        c.call("consent.set", {"key": "push:opens", "granted": False})
        with pytest.raises(pylon.ConsentDenied):
            c.call("push.openLogReport", {"userInfo": {"id": "1"}})
    assert push.calls() == []  # the host refused it: the fake never saw it


def test_answers_name_declared_methods_only_once_running(pylond):
    bus = pylond(Fake("gtm", methods=["push"]))
    with pytest.raises(ValueError, match="gtm.evaluate is not one of the fake's methods"):
        bus["gtm"].answer("evaluate", {})


def test_the_context_manager_removes_its_directory():
    with Pylond(Fake("push")) as bus:
        d = bus.dir
        assert bus.plugin_state("push") == "running"
    import os
    assert not os.path.exists(d)


FAKE_PUSH = __import__("os").path.join(__import__("os").path.dirname(__file__), "fake_push.py")


def test_conformance_passes_a_fake_push_that_keeps_the_contract():
    import sys
    from pylon.testing import conformance
    r = conformance(sys.executable, "push", [FAKE_PUSH])
    assert r.ok and r.problems == [], r.output
    assert "conforms to push: 10 methods" in r.output


def test_conformance_fails_a_fake_with_a_missing_method(monkeypatch):
    import sys
    from pylon.testing import conformance
    monkeypatch.setenv("FAKE_PUSH_DROP", "detach")
    r = conformance(sys.executable, "push", [FAKE_PUSH])
    assert not r.ok
    assert "push.detach: missing: the real push serves it (Stop receiving an app's messages)" in r.problems, r.output
    assert all(p.startswith("push.detach") for p in r.problems), r.output


def test_conformance_fails_a_fake_with_a_wrong_result_type(monkeypatch):
    import sys
    from pylon.testing import conformance
    monkeypatch.setenv("FAKE_PUSH_WRONG", "status")
    r = conformance(sys.executable, "push", [FAKE_PUSH])
    assert not r.ok
    assert "push.status: params {}: the result is string, not object" in r.problems, r.output
    assert all(p.startswith("push.status") for p in r.problems), r.output


def test_one_fake_for_each_real_plugin(pylond):
    """docs/TESTING-APPS.md's example, as written there."""
    push = Fake("push", answers={"attach": {"code": 0, "pending": 0}, "bind": {"code": 0, "message": ""}},
                publishes=["push.message"])
    uploader = Fake("uploader", methods=["enqueue"]).fail("enqueue", pylon.Overloaded("queue full"))
    ma = Fake("ma", answers={"start": {"code": 0, "message": "", "euid": "e1"}}).hang("eventRecord")
    gtm = Fake("gtm", answers={"getValue": lambda p: {"value": {"greeting": "Hi"}.get(p["key"])},
                               "push": {"queued": True, "containers": 1}})
    bus = pylond(push, uploader, ma, gtm, config={"limits": {"requestTimeoutMs": 300}})
    with bus.client() as c:
        assert c.call("gtm.getValue", {"containerId": "GTM-1", "key": "greeting"}) == {"value": "Hi"}
        with pytest.raises(pylon.Timeout):
            c.call("ma.eventRecord", {"appKey": "k", "eventName": "open"})
        with pytest.raises(pylon.Overloaded):
            c.call("uploader.enqueue", {"stream": "s", "records": []})
        assert c.call("push.bind", {"userId": "u"}) == {"code": 0, "message": ""}
