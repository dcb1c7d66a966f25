"""Clients that survive a restart of the host: pylond is killed under a client with live
subscriptions, provided methods and a push attachment, and started again on the same socket."""
import asyncio
import threading

import pytest

import pylon
from pylon.testing import Fake, Pylond, wait_until


def restart(bus):
    """Kills pylond at once (as a crash or an upgrade's stop would cut the socket) and starts it again."""
    bus.kill()
    bus.start()


def test_a_blocking_client_reconnects_and_restores_what_it_set_up():
    push = Fake("push", answers={"attach": {"code": 0, "pending": 0}}, publishes=["push.message"])
    with Pylond(push) as bus:
        gaps = []
        c = pylon.Client(bus.socket, timeout=10, reconnect=True, on_gap=gaps.append)
        notes = c.subscribe("push.*")
        c.provide("app.greet", lambda p: {"hi": p["who"]})
        assert c.call("push.attach", {"appId": "app", "callback": "app.greet"}) == {"code": 0, "pending": 0}
        restart(bus)
        # The iterator goes on past the gap: first the gap, then what the new host publishes.
        n = next(notes)
        assert n.topic == pylon.client.GAP_TOPIC and n.params["errors"] == [], n
        assert len(gaps) == 1 and gaps[0].seconds >= 0 and "closed" in gaps[0].reason
        # Re-attached (the new push got push.attach again) and re-provided.
        assert len(push.calls("attach")) == 2
        assert push.calls("attach")[1].params == {"appId": "app", "callback": "app.greet"}
        push.publish("push.message", {"m": 1})
        n = next(notes)
        assert n.topic == "push.message" and n.params == {"m": 1}
        t = threading.Thread(target=c.serve, args=(3,))
        t.start()
        with bus.client() as other:
            assert other.call("app.greet", {"who": "again"}) == {"hi": "again"}
        t.join()
        c.close()


def test_a_call_during_the_gap_waits_for_the_new_host_and_without_reconnect_fails():
    with Pylond("echo") as bus:
        c = pylon.Client(bus.socket, timeout=20, reconnect=True)
        plain = pylon.Client(bus.socket, timeout=5)
        assert c.call("echo.echo", {"a": 1}) == {"a": 1}
        bus.kill()
        with pytest.raises(pylon.ConnectionClosed):
            plain.call("bus.ping")
        bus.start(wait=False)
        assert c.call("bus.ping")["pong"] is True and len(c.gaps) == 1
        c.close()
        plain.close()


def test_unsubscribe_unprovide_and_batch():
    with Pylond("echo") as bus, bus.client() as c, bus.client() as other:
        c.subscribe("consent.*")
        c.unsubscribe("consent.*")
        other.call("consent.set", {"key": "x:y", "granted": False})
        c.call("bus.ping")  # a consent.changed sent to c would have come before this reply
        assert list(c.notifications(timeout=0.01)) == []
        c.provide("app.one", lambda p: 1)
        c.unprovide("app.one")
        with pytest.raises(pylon.MethodNotFound):
            other.call("app.one")
        r = c.batch([("echo.echo", {"i": 1}), ("nosuch.method", None), ("bus.ping", None)])
        assert r[0] == {"i": 1} and isinstance(r[1], pylon.MethodNotFound) and r[2]["pong"] is True


def test_the_async_client_reconnects_and_restores_what_it_set_up():
    push = Fake("push", answers={"attach": {"code": 0, "pending": 0}}, publishes=["push.message"])
    with Pylond(push) as bus:
        async def main():
            gaps = []
            async with pylon.AsyncClient(bus.socket, timeout=20, reconnect=True, on_gap=gaps.append) as c:
                notes = await c.subscribe("push.*")
                await c.provide("app.agreet", lambda p: {"hi": p["who"]})
                await c.call("push.attach", {"appId": "app", "callback": "app.agreet"})
                restart(bus)
                n = await asyncio.wait_for(notes.__anext__(), 20)
                assert n.topic == pylon.client.GAP_TOPIC and n.params["errors"] == []
                assert len(gaps) == 1 and len(push.calls("attach")) == 2
                push.publish("push.message", {"m": 2})
                n = await asyncio.wait_for(notes.__anext__(), 20)
                assert n.topic == "push.message" and n.params == {"m": 2}
                async with pylon.AsyncClient(bus.socket, timeout=10) as other:
                    assert await other.call("app.agreet", {"who": "a"}) == {"hi": "a"}
                r = await c.batch([("bus.ping", None), ("nosuch.x", {})])
                assert r[0]["pong"] is True and isinstance(r[1], pylon.MethodNotFound)
                await c.unsubscribe("push.*")
                await c.unprovide("app.agreet")
                async with pylon.AsyncClient(bus.socket, timeout=10) as other:
                    with pytest.raises(pylon.MethodNotFound):
                        await other.call("app.agreet", {"who": "a"})
        asyncio.run(main())


def test_pylonctl_sub_and_monitor_reconnect_across_a_restart():
    import os
    import subprocess
    with Pylond("echo") as bus:
        ctl = os.path.join(os.path.dirname(bus.pylond), "pylonctl")
        sub = subprocess.Popen([ctl, "--socket", bus.socket, "sub", "test.*"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        mon = subprocess.Popen([ctl, "--socket", bus.socket, "monitor", "echo.*", "--json"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        try:
            # Both are set up once the host lists them (sub's subscription, the monitor).
            def ready():
                st = bus.call("bus.status")
                subs = [c for c in st["clients"] if "test.*" in c["subscriptions"]]
                return subs and st["counters"]["monitors"] == 1
            wait_until(ready, what="sub and monitor set up")
            bus.kill()
            bus.start()
            wait_until(ready, timeout=20, what="sub and monitor set up again")
            bus.call("bus.publish", {"topic": "test.after", "data": {"n": 1}})
            bus.call("echo.echo", {"x": 1})
            line = sub.stdout.readline()
            assert '"test.after"' in line and '"n":1' in line
            assert '"echo.echo"' in mon.stdout.readline()
        finally:
            sub.terminate()
            mon.terminate()
            err = sub.communicate(timeout=10)[1]
            mon.communicate(timeout=10)
        assert "reconnected after" in err and "missed" in err
