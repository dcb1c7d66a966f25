"""The Python package against the real host: blocking and asyncio clients, typed errors,
subscriptions, bus.provide, and a plugin written with pylon.Plugin."""
import asyncio
import json
import os
import subprocess
import sys
import time

import pytest

import pylon
from conftest import BUILD


def test_call_and_typed_errors(host):
    with host.client() as c:
        assert c.call("bus.ping")["pong"] is True
        assert c.call("echo.echo", {"a": [1, 2]}) == {"a": [1, 2]}
        with pytest.raises(pylon.MethodNotFound) as e:
            c.call("nosuch.method")
        assert e.value.code == -32601
        with pytest.raises(pylon.InvalidParams) as e:
            c.call("greeter.fail")
        assert e.value.code == -32602 and e.value.data == {"field": "who"}
        c.call("consent.set", {"key": "greeter:app1", "granted": False})
        with pytest.raises(pylon.ConsentDenied) as e:
            c.call("greeter.collect", {"appKey": "app1", "data": 1})
        assert e.value.data["switch"] == "greeter:app1"
        assert isinstance(e.value, pylon.PylonError)
        # NaN is not JSON: refused here, not sent for a parse error no call would receive.
        with pytest.raises(ValueError):
            c.call("echo.echo", {"a": float("nan")})
        assert c.call("bus.ping")["pong"] is True


def test_subscribe_iterates_consent_changes(host):
    with host.client() as watcher, host.client() as admin:
        it = watcher.subscribe("consent.*", timeout=5)
        admin.call("consent.set", {"key": "greeter:k", "granted": False})
        n = next(it)
        assert n.topic == "consent.changed"
        assert n.params["key"] == "greeter:k" and n.params["granted"] is False


def test_provide_serves_other_clients(host):
    import threading
    with host.client() as provider, host.client() as caller:
        provider.provide("app.greet", lambda p: {"hi": p["who"]})
        provider.provide("app.fail", lambda p: (_ for _ in ()).throw(pylon.NotPermitted("no")))
        t = threading.Thread(target=provider.serve, args=(2,))
        t.start()
        assert caller.call("app.greet", {"who": "B"}) == {"hi": "B"}
        with pytest.raises(pylon.NotPermitted):
            caller.call("app.fail")
        t.join()


def test_check_raises_service_failure_codes(host):
    """MA and push answer {"code": N, "message": ...}; check=True turns N != 0 into ServiceError."""
    import asyncio
    import threading
    with host.client() as provider, host.client() as caller:
        provider.provide("app.ok", lambda p: {"code": 0, "message": ""})
        provider.provide("app.bad", lambda p: {"code": 1001, "message": "invalid appKey"})
        provider.provide("app.plain", lambda p: {"value": 1})
        t = threading.Thread(target=provider.serve, args=(3,))
        t.start()
        assert caller.call("app.bad") == {"code": 1001, "message": "invalid appKey"}  # unchecked: returned
        assert caller.call("app.ok", check=True) == {"code": 0, "message": ""}
        assert caller.call("app.plain", check=True) == {"value": 1}
        with pytest.raises(pylon.ServiceError) as e:
            caller.call("app.bad", check=True)
        assert e.value.code == 1001 and e.value.message == "invalid appKey" and e.value.method == "app.bad"
        assert e.value.result == {"code": 1001, "message": "invalid appKey"}

        async def main():
            async with pylon.AsyncClient(host.socket) as a:
                with pytest.raises(pylon.ServiceError):
                    await a.call("app.bad", check=True)
                assert (await a.call("app.ok", check=True))["code"] == 0
        asyncio.run(main())
        t.join()


def test_the_package_is_typed_and_passes_mypy_strict():
    """py.typed ships (PEP 561) and the whole package type-checks under mypy --strict."""
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.join(here, "..", "src")
    assert os.path.exists(os.path.join(src, "pylon", "py.typed"))
    try:
        import mypy  # noqa: F401
    except ImportError:
        pytest.skip("mypy is not installed (make pydeps installs it)")
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                        os.path.join(src, "pylon")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_public_method_has_a_docstring():
    import inspect
    missing = []
    for cls in (pylon.Client, pylon.AsyncClient, pylon.Plugin, pylon.Call, pylon.PylonError, pylon.ServiceError):
        if not cls.__doc__:
            missing.append(cls.__name__)
        for name, fn in inspect.getmembers(cls, inspect.isfunction):
            if not name.startswith("_") and not fn.__doc__:
                missing.append(f"{cls.__name__}.{name}")
    assert not missing, missing


def test_check_config_runs_the_python_plugins_reader(tmp_path):
    """pylond --check-config asks the Python plugin (PLUGIN --check-config, config on stdin)."""
    here = os.path.dirname(os.path.abspath(__file__))
    build = os.environ.get("PYLON_BUILD_DIR") or os.path.join(here, "..", "..", "..", ".build", "debug")
    src = os.path.abspath(os.path.join(here, "..", "src"))

    def run(config):
        cfg = {"socket": str(tmp_path / "s.sock"), "stateDir": str(tmp_path), "plugins": [
            {"name": "greeter", "exec": sys.executable, "args": [os.path.join(here, "greeter_plugin.py")],
             "env": {"PYTHONPATH": src}, "config": config}]}
        path = tmp_path / "c.json"
        path.write_text(json.dumps(cfg))
        return subprocess.run([os.path.join(build, "pylond"), "--check-config", str(path)],
                              capture_output=True, text=True, timeout=60)

    bad = run({"greeting": 5})
    assert bad.returncode == 78, bad.stdout + bad.stderr
    assert "plugin greeter: config.greeting: must be a string" in bad.stderr
    good = run({"greeting": "hi", "colour": "red"})
    assert good.returncode == 0, good.stdout + good.stderr
    assert "configuration ok: 1 plugins" in good.stdout
    assert "warning: plugin greeter: config.colour: unknown setting (ignored)" in good.stderr


def test_asyncio_client(host):
    async def main():
        async with pylon.AsyncClient(host.socket) as a, pylon.AsyncClient(host.socket) as b:
            results = await asyncio.gather(*[a.call("echo.echo", {"i": i}) for i in range(50)])
            assert [r["i"] for r in results] == list(range(50))
            with pytest.raises(pylon.MethodNotFound):
                await a.call("nosuch.x")

            async def greet(p):
                await asyncio.sleep(0.01)
                return {"hi": p["who"]}
            await a.provide("app.agreet", greet)
            assert await b.call("app.agreet", {"who": "async"}) == {"hi": "async"}

            notes = await a.subscribe("consent.*")
            await b.call("consent.set", {"key": "greeter:z", "granted": False})
            n = await asyncio.wait_for(notes.__anext__(), 5)
            assert n.topic == "consent.changed" and n.params["key"] == "greeter:z"
    asyncio.run(main())


def test_python_plugin_handshake_config_consent_heartbeats_shutdown(host):
    with host.client() as c:
        assert c.call("greeter.hello", {"who": "me"}) == {"hi": "me", "config": {"greeting": "hello"}}
        assert c.call("greeter.ping_host")["host"]["pong"] is True
        c.call("consent.set", {"key": "greeter:x", "granted": False})
        st = c.call("greeter.consent")
        assert st["switches"]["greeter:x"] is False and ["greeter:x", False] in st["changes"]
        # Heartbeats every 200 ms with a 1 s timeout: still the same process after 2 s.
        pid = [p for p in c.call("bus.status")["plugins"] if p["name"] == "greeter"][0]["pid"]
        time.sleep(2)
        p = [p for p in c.call("bus.status")["plugins"] if p["name"] == "greeter"][0]
        assert p["pid"] == pid and p["restarts"] == 0 and p["state"] == "running"
        desc = c.call("bus.describe")["plugins"]["greeter"]
        assert desc["version"] == "1.2"
    host.stop()
    assert open(host.marker).read() == "bye"


def ctl(host, *args, timeout=10):
    return subprocess.run([os.path.join(BUILD, "pylonctl"), "--socket", host.socket, *args],
                          capture_output=True, text=True, timeout=timeout)


def test_pylonctl_conventions(host):
    r = ctl(host, "--version")
    assert r.returncode == 0 and r.stdout.startswith("pylonctl ")
    r = ctl(host, "frobnicate")
    assert r.returncode == 64 and "unknown command frobnicate" in r.stderr
    r = ctl(host, "--check", "call", "greeter.coded", '{"code": 3}')
    assert r.returncode == 65
    assert ctl(host, "--check", "call", "greeter.coded", '{"code": 0}').returncode == 0
    assert ctl(host, "call", "greeter.coded", '{"code": 3}').returncode == 0
    assert ctl(host, "call", "nosuch.x").returncode == 1
    for v, granted in [("deny", False), ("allow", True), ("revoke", False), ("grant", True)]:
        assert ctl(host, "consent", "set", "greeter:c", v).returncode == 0
        with host.client() as c:
            assert c.call("consent.get", {"key": "greeter:c"})["granted"] is granted
    assert ctl(host, "consent", "set", "greeter:c", "maybe").returncode == 64
    d = ctl(host, "describe")
    assert d.returncode == 0 and "greeter.collect" in d.stdout and "consent: greeter:{appKey}" in d.stdout
    assert "params: appKey" in d.stdout
    names = ctl(host, "describe", "--names").stdout.split()
    assert "echo.echo" in names and "bus.ping" in names
    m = ctl(host, "metrics")
    assert m.returncode == 0
    assert 'pylon_plugin_up{plugin="greeter"} 1' in m.stdout and "# TYPE pylon_routed_total counter" in m.stdout
    unreachable = subprocess.run([os.path.join(BUILD, "pylonctl"), "--socket", host.socket + ".none", "ping"],
                                 capture_output=True, text=True)
    assert unreachable.returncode == 69


def test_pylonctl_sub_exits_nonzero_when_the_host_goes_away(host):
    p = subprocess.Popen([os.path.join(BUILD, "pylonctl"), "--socket", host.socket, "sub", "consent.*", "--no-reconnect"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    host.stop()
    assert p.wait(10) == 69


def test_plugin_crash_is_one_warning(host):
    with host.client() as c:
        with pytest.raises(pylon.PluginUnavailable):
            c.call("echo.crash")
    deadline = time.time() + 10
    while time.time() < deadline and not ("crash=" in host.log_text()
                                          and "plugin running" in host.log_text().split("crash=")[-1]):
        time.sleep(0.1)
    log = host.log_text()
    warnings = [l for l in log.splitlines() if "level=warn" in l or "level=error" in l]
    assert len(warnings) == 1, warnings
    assert 'msg="plugin exited"' in warnings[0] and "crash=" in warnings[0] and "signal=6" in warnings[0]
    assert 'msg=""' not in log
    with host.client() as c:
        c.call("bus.restart", {"plugin": "echo"})
    time.sleep(0.5)
    assert len([l for l in host.log_text().splitlines() if "level=warn" in l or "level=error" in l]) == 1


def test_plugin_stderr_is_logged_at_its_sd_daemon_prefixs_level(host):
    """Python's logging through pylon.Plugin writes <4>/<3> lines; pylond logs them at warn and
    error without the prefix; other stderr lines (the greeter's startup has none) would be info."""
    from pylon.testing import wait_until
    with host.client() as c:
        c.call("greeter.log", {"what": "xyzzy"})
    lines = wait_until(lambda: [l for l in host.log_text().splitlines() if "xyzzy" in l and "plugin=greeter" in l]
                       if len([l for l in host.log_text().splitlines() if "xyzzy" in l]) >= 2 else None,
                       what="the greeter's log lines")
    warn = [l for l in lines if "careful" in l]
    err = [l for l in lines if "broken" in l]
    assert warn and "level=warn" in warn[0] and 'msg="greeter: careful: xyzzy"' in warn[0], lines
    assert err and "level=error" in err[0] and "<3>" not in err[0] and "<4>" not in warn[0], lines


def test_metrics_textfile_is_written_atomically(host):
    with host.client() as c:
        c.call("echo.echo", {})
    deadline = time.time() + 10
    text = ""
    while time.time() < deadline:
        if os.path.exists(host.prom):
            text = open(host.prom).read()
            if 'pylon_plugin_up{plugin="greeter"} 1' in text and "pylon_routed_total" in text:
                break
        time.sleep(0.2)
    assert 'pylon_plugin_up{plugin="echo"} 1' in text
    assert "# TYPE pylon_plugin_restarts_total counter" in text
    assert "pylon_plugin_requests_total" in text
    assert not os.path.exists(host.prom + ".tmp")
    # 0640: the metrics name every user's AppKeys and streams (docs/SECURITY.md).
    assert oct(os.stat(host.prom).st_mode & 0o777) == "0o640"


def test_log_format_prefixed(tmp_path):
    import json as _json
    cfg = tmp_path / "c.json"
    cfg.write_text(_json.dumps({"socket": str(tmp_path / "s.sock"), "stateDir": str(tmp_path / "st"), "plugins": []}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYLON_")}
    p = subprocess.Popen([os.path.join(BUILD, "pylond"), "--config", str(cfg), "--log-format", "prefixed"],
                         stderr=subprocess.PIPE, text=True, env=env)
    time.sleep(0.5)
    p.terminate()
    err = p.communicate(timeout=10)[1]
    lines = [l for l in err.splitlines() if l]
    assert lines and all(l.startswith("<6>ts=") or l.startswith("<4>ts=") or l.startswith("<3>ts=") for l in lines), lines


def test_the_package_pip_installs(tmp_path):
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.join(here, "..")
    # Build in a copy so the checkout gets no build/ or egg-info directories.
    import shutil
    work = tmp_path / "pkg"
    shutil.copytree(src, work, ignore=shutil.ignore_patterns("tests", "__pycache__", "build", "*.egg-info"))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(tmp_path / "site"), str(work)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-c", "import pylon; print(pylon.__version__, pylon.AsyncClient.__name__)"],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(tmp_path / "site")))
    assert r.stdout.strip() == "0.1.0 AsyncClient", r.stderr
    assert (tmp_path / "site" / "pylon" / "py.typed").exists(), "py.typed is not installed"


JOURNAL_SOCKET = "/run/systemd/journal/socket"


def parse_journal_datagram(d):
    """journald's native protocol: FIELD=value\\n, or FIELD\\n<u64 le length><value>\\n."""
    import struct
    fields, i = {}, 0
    while i < len(d):
        nl = d.index(b"\n", i)
        line = d[i:nl]
        if b"=" in line:
            k, v = line.split(b"=", 1)
            i = nl + 1
        else:
            k = line
            n = struct.unpack("<Q", d[nl + 1:nl + 9])[0]
            v = d[nl + 9:nl + 9 + n]
            i = nl + 9 + n + 1
        fields[k.decode()] = v.decode()
    return fields


@pytest.mark.skipif(os.path.exists(JOURNAL_SOCKET) or os.geteuid() != 0,
                    reason="a real journald is listening (or not root): checked by hand with journalctl")
def test_journal_entries_carry_priority_plugin_and_fields(tmp_path):
    """A stand-in journald socket: pylond with --log-format journal sends native entries."""
    import json as _json
    import socket as _socket
    made_dir = not os.path.isdir(os.path.dirname(JOURNAL_SOCKET))
    os.makedirs(os.path.dirname(JOURNAL_SOCKET), exist_ok=True)
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM)
    s.bind(JOURNAL_SOCKET)
    s.settimeout(0.2)
    try:
        cfg = tmp_path / "c.json"
        cfg.write_text(_json.dumps({"socket": str(tmp_path / "s.sock"), "stateDir": str(tmp_path / "st"),
                                    "plugins": [{"name": "echo", "exec": os.path.join(BUILD, "pylon-echo")}]}))
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYLON_")}
        p = subprocess.Popen([os.path.join(BUILD, "pylond"), "--config", str(cfg), "--log-format", "journal"],
                             stderr=subprocess.PIPE, env=env)
        entries = []
        deadline = time.time() + 10
        crashed = False
        while time.time() < deadline:
            try:
                entries.append(parse_journal_datagram(s.recv(1 << 16)))
            except _socket.timeout:
                pass
            if not crashed and any(e.get("PYLON_MSG") == "plugin running" for e in entries):
                with pylon.Client(str(tmp_path / "s.sock")) as c:
                    with pytest.raises(pylon.PluginUnavailable):
                        c.call("echo.crash")
                crashed = True
            if any(e.get("PYLON_MSG") == "plugin exited" for e in entries):
                break
        p.terminate()
        p.wait(10)
        exited = [e for e in entries if e.get("PYLON_MSG") == "plugin exited"]
        assert exited, entries
        e = exited[0]
        assert e["PRIORITY"] == "4" and e["PYLON_PLUGIN"] == "echo" and e["PYLON_SIGNAL"] == "6"
        assert e["PLUGIN"] == "echo"  # journalctl PLUGIN=echo shows the host's events about it too
        assert "crash" in " ".join(e.keys()).lower() and e["SYSLOG_IDENTIFIER"] == "pylond"
        assert e["MESSAGE"].startswith("plugin exited ")
        assert all(x["PRIORITY"] in ("3", "4", "6", "7") for x in entries)
    finally:
        s.close()
        os.unlink(JOURNAL_SOCKET)
        if made_dir:
            os.rmdir(os.path.dirname(JOURNAL_SOCKET))


FLOOD = r"""
import socket, sys, threading, time
path, seconds = sys.argv[1], float(sys.argv[2])
stop = time.time() + seconds
def one():
    while time.time() < stop:
        try:
            s = socket.socket(socket.AF_UNIX); s.connect(path); s.close()
        except OSError:
            pass
ts = [threading.Thread(target=one) for _ in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
"""


def test_async_client_connects_through_a_connect_flood(host):
    """Another local program floods the host with connect/close (the listen backlog is full most
    of the time, so a plain non-blocking connect gets EAGAIN): AsyncClient waits it out."""
    flood = subprocess.Popen([sys.executable, "-c", FLOOD, host.socket, "4"])
    try:
        time.sleep(0.3)

        async def main():
            ok = 0
            for _ in range(40):
                async with pylon.AsyncClient(host.socket, timeout=10) as bus:
                    if (await bus.call("bus.ping"))["pong"]:
                        ok += 1
            return ok

        assert asyncio.run(main()) == 40
    finally:
        flood.wait(30)
