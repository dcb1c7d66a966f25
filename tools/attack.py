#!/usr/bin/env python3
"""Re-runs the hostile-load probes of issue 11 (items 8-10) against a real pylond and reports
what matters to an operator: the host's peak RSS, the latency of a concurrent bus.ping (p50,
p99, max), whether any healthy plugin was restarted, descriptors and log lines. Then probes
every door of "Trust on every door" as unprivileged uids (the attacker 65534, a victim 4242,
through `setpriv`; the probes' client side is tools/attack_probe.py) and prints one verdict line
per probe (PASS/FAIL): notifications acting as another uid, the backend without a token, the
broker anonymously and with another device's credential, GTM's data layer across uids, a push
identity rebind by a non-owner, one uid's failing pixel destination (another uid's pixel must
arrive within 1 s), a per-uid queue flood, a connect flood measured by another uid with
pylon.AsyncClient and plain non-blocking connects, and dead-letter disk growth.

Usage: tools/attack.py [--bin .build/release] [--seconds N]   (as root: it switches uids)
Starts what `make run` starts in a temporary directory on loopback (mosquitto with dynamic
security, pylon-backend with an operator token, enrolment secret and the fault API, pylond with
uploader, ma, push and gtm, socketMode 0666), runs each probe for a bounded time, stops
everything. Exit status 1 if a plugin was restarted, a ping failed or a probe failed.

The batch amplification probe (issue 32 item 2): one batch of 128 `bus.describe` openrpc, its
bytes in and out; then 64 connections of the attacker uid write two such batches each and never
read while root pings (PASS: no ping failed, ping p99 < 50 ms, host RSS < 100 MB, and the per-uid
bound disconnected some of them: `slow_readers_closed`). tools/batch-attack-bench.py runs the
same attack alone against a bare pylond.
"""
import argparse, json, os, shutil, socket, subprocess, sys, tempfile, threading, time

def rss_kib(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0

def fds(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0

def call(path, method, params=None, timeout=5.0):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    s.connect(path)
    req = {"jsonrpc": "2.0", "id": 1, "method": method}
    if params is not None:
        req["params"] = params
    s.sendall((json.dumps(req) + "\n").encode())
    buf = b""
    while b"\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise OSError("closed")
        buf += chunk
    s.close()
    return json.loads(buf.split(b"\n")[0])

class Monitor:
    """Samples host RSS/fds and pings on a persistent connection while an attack runs."""
    def __init__(self, sock, pid):
        self.sock, self.pid = sock, pid
        self.stop = threading.Event()
        self.lat, self.fail, self.rss, self.fd = [], 0, 0, 0
    def run(self):
        c = socket.socket(socket.AF_UNIX)
        c.settimeout(5)
        c.connect(self.sock)
        f = c.makefile("rb")
        i = 0
        while not self.stop.is_set():
            self.rss = max(self.rss, rss_kib(self.pid))
            self.fd = max(self.fd, fds(self.pid))
            i += 1
            t0 = time.perf_counter()
            try:
                c.sendall(b'{"jsonrpc":"2.0","id":%d,"method":"bus.ping"}\n' % i)
                f.readline()
                self.lat.append((time.perf_counter() - t0) * 1000)
            except OSError:
                self.fail += 1
            time.sleep(0.02)
    def start(self):
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()
        return self
    def finish(self):
        self.stop.set()
        self.t.join()
        lat = sorted(self.lat) or [0]
        pct = lambda p: lat[min(len(lat) - 1, int(len(lat) * p))]
        return {"pings": len(self.lat), "ping_p50_ms": round(pct(0.5), 2), "ping_p99_ms": round(pct(0.99), 2),
                "ping_max_ms": round(lat[-1], 2), "ping_failures": self.fail, "rss_peak_mb": round(self.rss / 1024, 1),
                "fds_peak": self.fd}

def flood_enqueue(sock, seconds, clients=8, per=256, size=1_000_000):
    """Item 8: clients send many ~1 MB uploader.enqueue requests and never read."""
    pad = "x" * size
    def one(k):
        s = socket.socket(socket.AF_UNIX)
        s.connect(sock)
        s.settimeout(seconds)
        try:
            for i in range(per):
                line = json.dumps({"jsonrpc": "2.0", "id": i, "method": "uploader.enqueue",
                                   "params": {"stream": f"attack{k}", "records": [{"id": f"r{i}", "data": {"p": pad}}]}})
                s.sendall(line.encode() + b"\n")
        except OSError:
            pass
        time.sleep(0.5)
        s.close()
    ts = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(clients)]
    for t in ts: t.start()
    deadline = time.time() + seconds
    for t in ts: t.join(max(0, deadline - time.time()))

def flood_status(sock, seconds, clients=4, n=5041):
    """Item 9: each client writes ~5,000 bus.status requests in one buffer and never reads."""
    batch = b"".join(b'{"jsonrpc":"2.0","id":%d,"method":"bus.status"}\n' % i for i in range(n))
    conns = []
    for _ in range(clients):
        s = socket.socket(socket.AF_UNIX)
        s.connect(sock)
        s.setblocking(False)
        try:
            s.send(batch)
        except OSError:
            pass
        conns.append(s)
    time.sleep(seconds)
    for s in conns: s.close()

def flood_connect(sock, seconds, threads=4):
    """Item 10: connect/close as fast as possible; a real client tries every 50 ms."""
    stop = time.time() + seconds
    counts = [0] * threads
    def one(k):
        while time.time() < stop:
            try:
                s = socket.socket(socket.AF_UNIX)
                s.connect(sock)
                s.close()
                counts[k] += 1
            except OSError:
                pass
    ts = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(threads)]
    for t in ts: t.start()
    ok = tries = 0
    while time.time() < stop:
        tries += 1
        try:
            if call(sock, "bus.ping", timeout=2).get("result", {}).get("pong"):
                ok += 1
        except OSError:
            pass
        time.sleep(0.05)
    for t in ts: t.join()
    return {"connects": sum(counts), "connects_per_s": int(sum(counts) / seconds), "real_client_ok": f"{ok}/{tries}"}

# ---- the stack, started as `make run` starts it (credentials, dynsec broker) -------------------

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = os.path.join(REPO, "tools", "attack_probe.py")
ATTACKER, VICTIM = 65534, 4242


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def secret(work, name):
    path = os.path.join(work, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(32).hex().encode())
    os.close(fd)
    return path


def http(base, path, token=None, body=None, method=None, timeout=10):
    """(status, parsed body or None)."""
    import urllib.error, urllib.request
    h = {"Content-Type": "application/json"}
    if token:
        h["Authorization"] = "Bearer " + token
    req = urllib.request.Request(base + path, data=None if body is None else json.dumps(body).encode(),
                                 headers=h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read() or b"null")
        except ValueError:
            return e.code, None


class PixelServer:
    """A pixel destination on loopback: answers every GET with `status` and notes when each came."""

    def __init__(self, status):
        import http.server
        outer = self
        self.status, self.times, self.lock = status, [], threading.Lock()

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                with outer.lock:
                    outer.times.append(time.time())
                self.send_response(outer.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def count(self):
        with self.lock:
            return len(self.times)

    def stop(self):
        self.server.shutdown()


def as_uid(uid, sock, probe, args=None, wait=True, timeout=120):
    """Runs `attack_probe.py PROBE` as `uid` (no groups); returns its JSON line (or the process)."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.path.join(REPO, "clients", "python", "src"),
           "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", sys.executable, PROBE, sock, probe,
           json.dumps(args or {})]
    if not wait:
        return subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"probe_failed": r.returncode, "stderr": r.stderr[-400:]}


def mqtt_probe(port, *args):
    """Tests/fixtures/mqtt_probe.py as the attacker uid."""
    code = open(os.path.join(REPO, "Tests", "fixtures", "mqtt_probe.py")).read()
    r = subprocess.run(["setpriv", f"--reuid={ATTACKER}", f"--regid={ATTACKER}", "--clear-groups", sys.executable,
                        "-c", code, str(port)] + list(args), capture_output=True, text=True, timeout=30)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"probe_failed": r.returncode, "stderr": r.stderr[-300:]}


class Stack:
    def __init__(self, bin_dir):
        self.bin = bin_dir
        self.work = tempfile.mkdtemp(prefix="pylon-attack-")
        os.chmod(self.work, 0o755)  # the socket must be reachable by the unprivileged uids
        w = self.work
        self.sock = w + "/pylon.sock"
        self.port, self.mqtt_port = free_port(), free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.op_file, self.dev_key, self.broker_pw = secret(w, "operator.token"), secret(w, "device.key"), secret(w, "broker.password")
        self.op = open(self.op_file).read().strip()
        self.enrol = open(self.dev_key).read().strip()
        subprocess.run([os.path.join(REPO, "tools", "pylon-dynsec-init"), w + "/dynsec.json", "pylon-backend",
                        self.broker_pw], check=True)
        plugin = next(os.path.join("/usr/lib", d, "mosquitto_dynamic_security.so") for d in sorted(os.listdir("/usr/lib"))
                      if os.path.exists(os.path.join("/usr/lib", d, "mosquitto_dynamic_security.so")))
        conf = open(os.path.join(REPO, "etc", "mosquitto.conf")).read()
        conf = conf.replace("listener 1883 127.0.0.1", f"listener {self.mqtt_port} 127.0.0.1")
        conf = "\n".join(f"plugin_opt_config_file {w}/dynsec.json" if ln.startswith("plugin_opt_config_file ")
                         else f"plugin {plugin}" if ln.startswith("plugin /usr/lib/") else ln for ln in conf.split("\n"))
        open(w + "/mosquitto.conf", "w").write(conf)
        self.mosquitto = subprocess.Popen(["mosquitto", "-c", w + "/mosquitto.conf"], cwd=w,
                                          stdout=subprocess.DEVNULL, stderr=open(w + "/mosquitto.log", "w"))
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.mqtt_port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        self.backend = subprocess.Popen(
            [bin_dir + "/pylon-backend", "--listen", f"127.0.0.1:{self.port}", "--db", w + "/b.db",
             "--operator-token-file", self.op_file, "--enrol-secret-file", self.dev_key, "--enable-fault-injection",
             "--mqtt", f"127.0.0.1:{self.mqtt_port}", "--mqtt-username", "pylon-backend",
             "--mqtt-password-file", self.broker_pw, "--mqtt-dynsec"],
            stdout=subprocess.PIPE, stderr=open(w + "/backend.log", "w"))
        if b"listening" not in self.backend.stdout.readline():
            raise SystemExit("pylon-backend did not start")
        self.disk_cap = 16 << 20
        # Pixel destinations (the pixel probe): one down (503 on every GET), one healthy. The
        # shipped gtm.pixels allows "127.0.0.1" (port 80 only); these two ports are named.
        self.px_down, self.px_up = PixelServer(503), PixelServer(204)
        cfg = {"socket": self.sock, "socketMode": "0666", "stateDir": w + "/state", "pluginDir": bin_dir,
               "logLevel": "info",
               "plugins": [
                   {"name": "uploader", "exec": "pylon-uploader", "config": {
                       "endpoint": f"{self.base}/v1/batches/{{stream}}", "credentialFile": self.dev_key,
                       "maxDiskBytes": self.disk_cap, "retryInitialMs": 200, "retryMaxMs": 1000,
                       "streams": {"gtm.pixels": {
                           "delivery": "get", "consent": "gtm:hits", "intervalMs": 0,
                           "allowedHosts": ["127.0.0.1", f"127.0.0.1:{self.px_down.port}", f"127.0.0.1:{self.px_up.port}"]}}}},
                   {"name": "ma", "exec": "pylon-ma", "config": {"backend": self.base, "credentialFile": self.dev_key}},
                   {"name": "push", "exec": "pylon-push", "config": {
                       "backend": self.base, "credentialFile": self.dev_key,
                       "broker": {"host": "127.0.0.1", "port": self.mqtt_port}}},
                   {"name": "gtm", "exec": "pylon-gtm", "config": {
                       "backend": self.base, "credentialFile": self.dev_key, "defaultsDir": os.path.join(REPO, "etc", "gtm")}},
               ]}
        json.dump(cfg, open(w + "/pylon.json", "w"))
        self.log = open(w + "/pylond.log", "w")
        env = {k: v for k, v in os.environ.items() if k not in ("PYLON_SOCKET", "PYLON_STATE_DIR")}
        self.host = subprocess.Popen([bin_dir + "/pylond", "--config", w + "/pylon.json"], stderr=self.log,
                                     stdout=self.log, env=env)
        for _ in range(200):
            try:
                if call(self.sock, "bus.status")["result"]["state"] == "running":
                    break
            except (OSError, KeyError, ValueError):
                pass
            time.sleep(0.05)

    def stop(self):
        self.px_down.stop()
        self.px_up.stop()
        for p in (self.host, self.backend, self.mosquitto):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(self.work, ignore_errors=True)


# ---- the doors' probes: one verdict line each ----------------------------------------------------

def probe_notification(st):
    victim = as_uid(VICTIM, st.sock, "victim_ma", {"appKey": "victimapp"}, wait=False)
    started = json.loads(victim.stdout.readline())
    before = call(st.sock, "consent.get", {"key": "ma:victimapp"})["result"]
    r = as_uid(ATTACKER, st.sock, "attacker_ma_notify", {"appKey": "victimapp"})
    after = call(st.sock, "consent.get", {"key": "ma:victimapp"})["result"]
    victim.stdin.close()
    victim.wait(10)
    ok = started["start"].get("code") == 0 and before["granted"] and after["granted"] and after.get("app") is not False
    return ok, (f"victim uid {VICTIM} ma.start code {started['start'].get('code')}; uid {ATTACKER} sent "
                f"ma.setDataCollectionEnabled(false) for it as a notification, a batch of one and a request "
                f"(reply {r.get('request')}); ma:victimapp granted before {before['granted']}, after "
                f"{after['granted']} (app layer {after.get('app')})")


def probe_backend_token(st):
    """Every operator route without a token, with an unknown one and with the enrolment secret
    (a device credential). `GET /v1/inspect/streams` (no such route: a stream is named) is 404
    before any credential is looked at; it is printed, not judged."""
    routes = [("GET", "/v1/inspect/streams/attack0", None), ("GET", "/v1/inspect/streams/attack0/records", None),
              ("GET", "/v1/inspect/stats", None), ("GET", "/v1/inspect/push/sends", None),
              ("POST", "/v1/admin/push/send", {"appId": "x", "target": "y"}), ("POST", "/v1/admin/reset", {}),
              ("POST", "/v1/faults", {"failNext": 1})]
    seen = {}
    for method, path, body in routes:
        codes = tuple(http(st.base, path, token=t, body=body, method=method)[0] for t in (None, "0" * 64, st.enrol))
        seen[f"{method} {path}"] = codes
    listing = http(st.base, "/v1/inspect/streams")[0]
    # The security property: no credential but the operator token opens an operator route. (The
    # docs say a valid credential that may not call an endpoint gets 403; the backend answers 401
    # "invalid operator token" for the enrolment secret: printed, both refuse.)
    ok = all(c[0] == 401 and c[1] == 401 and c[2] in (401, 403) for c in seen.values())
    codes = sorted(set(seen.values()))
    return ok, (f"{len(routes)} operator routes (inspect streams/records/stats/push, admin push send and reset, "
                f"faults), (no token, unknown token, enrolment secret) -> {codes if len(codes) > 1 else codes[0]}; "
                f"GET /v1/inspect/streams (no such route; 404 before any credential is looked at) {listing}")


def probe_broker_anonymous(st):
    anon = mqtt_probe(st.mqtt_port, "--sub", "#", "--wait-ms", "300")
    dev = call(st.sock, "push.status", {})["result"]
    as_dev = mqtt_probe(st.mqtt_port, "--client-id", f"pylon-push-{dev.get('installId')}", "--sub", "#", "--wait-ms", "300")
    ok = anon.get("connack") not in (None, 0) and as_dev.get("connack") not in (None, 0)
    return ok, (f"uid {ATTACKER}, anonymous CONNECT + SUBSCRIBE #: CONNACK {anon.get('connack')}, SUBACK "
                f"{anon.get('suback')}; anonymous with the device's client id: CONNACK {as_dev.get('connack')}")


def probe_broker_other_device(st):
    dev = call(st.sock, "push.status", {})["result"]
    victim_dev, victim_install = dev.get("deviceId"), dev.get("installId")
    code, reg = http(st.base, "/v1/devices/register", token=st.enrol, body={"installId": "attacker-install-1"})
    if code != 200:
        return False, f"could not register the attacker's device: {code} {reg}"
    user, pw = reg["deviceId"], reg["token"]
    take = mqtt_probe(st.mqtt_port, "--user", user, "--password", pw, "--client-id", f"pylon-push-{victim_install}",
                      "--wait-ms", "300")
    sub = mqtt_probe(st.mqtt_port, "--user", user, "--password", pw, "--client-id", f"pylon-push-attacker-install-1",
                     "--sub", "#", "--sub", f"pylon/push/d/{victim_dev}", "--wait-ms", "300")
    pub = mqtt_probe(st.mqtt_port, "--user", user, "--password", pw, "--client-id", f"pylon-push-attacker-install-1",
                     "--pub", f"pylon/push/d/{victim_dev}", '{"id":"forged","appId":"x"}', "--wait-ms", "300")
    time.sleep(0.5)
    forged = call(st.sock, "push.status", {})["result"].get("received", 0)
    ok = (take.get("connack") not in (None, 0) and sub.get("connack") == 0 and all(c == 0x80 for c in sub.get("suback", [0]))
          and forged == dev.get("received", 0))
    return ok, (f"device {user}'s credential with the victim's client id: CONNACK {take.get('connack')}; with its own: "
                f"CONNACK {sub.get('connack')}, SUBACK #, victim topic {sub.get('suback')}; a publish to the victim's "
                f"topic: PUBACK {pub.get('puback')}, victim's received {dev.get('received', 0)} -> {forged}")


def probe_gtm(st):
    secret_value = "victim-secret-" + os.urandom(4).hex()
    victim = as_uid(VICTIM, st.sock, "victim_gtm", {"secret": secret_value}, wait=False)
    own = json.loads(victim.stdout.readline())
    r = as_uid(ATTACKER, st.sock, "attacker_gtm", {"secret": secret_value, "victimUid": VICTIM})
    victim.stdin.close()
    victim.wait(10)
    ok = (own.get("own") == secret_value and r.get("value") != secret_value and r.get("asVictim") == -32005
          and r.get("logLinesAll") == -32005 and r.get("statusLeaks") is False)
    return ok, (f"victim uid {VICTIM} pushed screenName and reads it back ({own.get('own') == secret_value}); uid "
                f"{ATTACKER} reads {r.get('value')!r}, with uid:{VICTIM} gets {r.get('asVictim')}, logLines all "
                f"{r.get('logLinesAll')}, its gtm.status names the value: {r.get('statusLeaks')}")


def probe_pixels(st):
    """Issue 32 item 4: the attacker's pixels go to a destination that is down (503 on every GET,
    retried) and to the backend's own port (refused at the enqueue: a bare allowed host is port
    80 only); then the victim's pixel to a healthy destination must arrive within 1 s of its
    gtm.push while the attacker's is still being retried. Both pixels come from a GTM container's
    `_img` tag whose url is a data-layer value, pushed by each uid through gtm.push."""
    res = {"macros": [{"function": "_e", "instance_name": "event"},
                      {"function": "_v", "instance_name": "pixelUrl", "name": "pixelUrl"}],
           "predicates": [{"function": "_eq", "arg0": ["macro", 0], "arg1": "px"}],
           "tags": [{"function": "_img", "url": ["macro", 1]}], "rules": [[["if", 0], ["add", 0]]]}
    status, _ = http(st.base, "/v1/admin/gtm/containers/GTM-PIXEL/versions", token=st.op,
                     body={"container": {"resource": res}, "draft": False})
    for key in ("gtm:hits", "gtm:GTM-PIXEL"):
        call(st.sock, "consent.set", {"key": key, "granted": True})
    inspect = f"http://127.0.0.1:{st.port}/v1/inspect/stats"
    down = f"http://127.0.0.1:{st.px_down.port}/px?uid={ATTACKER}"
    down0, up0 = st.px_down.count(), st.px_up.count()
    a = as_uid(ATTACKER, st.sock, "pixel_gtm", {"urls": [inspect, down]})
    deadline = time.time() + 20
    while st.px_down.count() < down0 + 2 and time.time() < deadline:  # in its retries
        time.sleep(0.05)
    retried_before = st.px_down.count()
    v = as_uid(VICTIM, st.sock, "pixel_gtm", {"urls": [f"http://127.0.0.1:{st.px_up.port}/px?uid={VICTIM}"]})
    deadline = time.time() + 20
    while st.px_up.count() <= up0 and time.time() < deadline:
        time.sleep(0.01)
    latency = (st.px_up.times[up0] - v["pushedAt"]) if st.px_up.count() > up0 and "pushedAt" in v else None
    deadline = time.time() + 20
    while st.px_down.count() <= retried_before and time.time() < deadline:  # and the attacker's still fails
        time.sleep(0.05)
    px = call(st.sock, "uploader.status", {})["result"]["streams"].get("gtm.pixels", {})
    lines = call(st.sock, "gtm.logLines", {"uid": ATTACKER, "limit": 100})["result"]["lines"]
    refused = sum(1 for ln in lines if "not allowed" in ln["message"] and str(st.port) in ln["message"])
    # Still failing: requested again after the victim's pixel went, and still queued (a pixel is
    # dead-lettered after pixels.maxAttempts tries, 8: a repeated probe sees earlier ones there).
    still_failing = st.px_down.count() > retried_before and px.get("pendingBatches", 0) >= 1
    ok = status == 200 and latency is not None and latency < 1.0 and still_failing and refused >= 1
    lat = f"{latency * 1000:.0f} ms" if latency is not None else "never (20 s)"
    return ok, (f"uid {ATTACKER}'s pixel to 127.0.0.1:{st.port} (backend) refused at the enqueue: {refused >= 1}; its pixel "
                f"to a destination answering 503: {st.px_down.count() - down0} GETs, still queued ({px.get('pendingBatches')} pending, "
                f"{px.get('deadLetters')} dead letters, lanes {px.get('pixels')}); uid {VICTIM}'s pixel to a healthy "
                f"destination arrived {lat} after its gtm.push (attacker probe {a.get('pushes')}, victim {v.get('pushes')})")


def probe_push_bind(st):
    before = call(st.sock, "push.status", {})["result"]
    r = as_uid(ATTACKER, st.sock, "attacker_push_bind", {"userId": "mallory"})
    after = call(st.sock, "push.status", {})["result"]
    ok = (r.get("bind") == 3003 and r.get("unbind") == 3003 and r.get("setDeviceToken") == 3003
          and not r.get("statusShowsToken") and after.get("boundUser") == before.get("boundUser")
          and after.get("token") == before.get("token"))
    return ok, (f"uid {ATTACKER}: push.bind {r.get('bind')}, push.unbind {r.get('unbind')}, push.setDeviceToken "
                f"{r.get('setDeviceToken')}, push.status shows token/installId: {r.get('statusShowsToken')}; bound user "
                f"{before.get('boundUser')!r} -> {after.get('boundUser')!r}, token unchanged: {after.get('token') == before.get('token')}")


def probe_queue_flood(st, seconds, conns=64):
    base = rss_kib(st.host.pid)
    m = Monitor(st.sock, st.host.pid).start()
    r = as_uid(ATTACKER, st.sock, "attacker_queue_flood", {"conns": conns, "seconds": seconds})
    mon = m.finish()
    counters = call(st.sock, "bus.status")["result"].get("counters", {})
    growth = mon["rss_peak_mb"] - base / 1024
    bound = 16 + 32  # maxQueuedBytesPerUid (16 MiB), plus allocator slack and the publisher's own buffers
    ok = growth <= bound and mon["ping_failures"] == 0
    interesting = {k: v for k, v in counters.items() if "drop" in k or "slow" in k or "refused" in k}
    return ok, (f"uid {ATTACKER}: {conns} connections subscribed to * never reading + one publishing 64 KB "
                f"({r.get('published')} publications in {seconds:g} s); host RSS {base / 1024:.1f} -> peak "
                f"{mon['rss_peak_mb']} MB (+{growth:.1f} MB, bound {bound} MB); ping p50/p99/max {mon['ping_p50_ms']}/"
                f"{mon['ping_p99_ms']}/{mon['ping_max_ms']} ms, failures {mon['ping_failures']}; subscribers still "
                f"connected {r.get('subscribers_open_at_end')}; counters {interesting}")


def probe_batch_flood(st, seconds, conns=64):
    member = '{"jsonrpc":"2.0","id":%d,"method":"bus.describe","params":{"format":"openrpc"}}'
    batch = ("[" + ",".join(member % i for i in range(128)) + "]\n").encode()
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(st.sock)
    s.sendall(batch)
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(1 << 20)
        if not chunk:
            break
        buf += chunk
    s.close()
    items = json.loads(buf)
    results = sum(1 for m in items if "result" in m)
    too_large = sum(1 for m in items if (m.get("error") or {}).get("code") == -32006)
    closed_before = call(st.sock, "bus.status")["result"]["counters"]["slow_readers_closed"]
    base = rss_kib(st.host.pid)
    m = Monitor(st.sock, st.host.pid).start()
    r = as_uid(ATTACKER, st.sock, "attacker_batch_flood", {"conns": conns, "lines": 2, "members": 128, "seconds": seconds})
    mon = m.finish()
    closed = call(st.sock, "bus.status")["result"]["counters"]["slow_readers_closed"] - closed_before
    ok = mon["ping_failures"] == 0 and mon["ping_p99_ms"] < 50 and mon["rss_peak_mb"] < 100 and closed > 0
    return ok, (f"one batch of 128 bus.describe openrpc: {len(batch)} B in, {len(buf)} B out "
                f"(x{len(buf) / len(batch):.0f}; {results} documents, {too_large} -32006 over maxLineBytes); uid "
                f"{ATTACKER}: {r.get('conns')} connections x 2 such batches, never reading, {seconds:g} s: host RSS "
                f"{base / 1024:.1f} -> peak {mon['rss_peak_mb']} MB; root's ping p50/p99/max {mon['ping_p50_ms']}/"
                f"{mon['ping_p99_ms']}/{mon['ping_max_ms']} ms, failures {mon['ping_failures']}; slow_readers_closed "
                f"+{closed}")


def probe_connect_flood_uid(st, seconds):
    flood = as_uid(ATTACKER, st.sock, "attacker_connect_flood", {"threads": 4, "seconds": seconds}, wait=False)
    time.sleep(0.3)
    v = as_uid(VICTIM, st.sock, "victim_connect_measure", {"seconds": seconds / 2})
    out, _ = flood.communicate(timeout=seconds + 30)
    f = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    ok = v.get("async_tries", 0) > 0 and v.get("async_ok") == v.get("async_tries")
    nb = v.get("nonblocking_ok", 0) / max(1, v.get("nonblocking_tries", 0))
    return ok, (f"uid {ATTACKER} connect/close flood, 4 threads, {f.get('connects')} connects in {seconds:g} s; uid "
                f"{VICTIM}: pylon.AsyncClient connect + bus.ping {v.get('async_ok')}/{v.get('async_tries')}, plain "
                f"non-blocking connect {v.get('nonblocking_ok')}/{v.get('nonblocking_tries')} ({nb:.0%}; EAGAIN counts as failure)")


def probe_dead_letters(st, seconds):
    code, _ = http(st.base, "/v1/faults", token=st.op, body={"failNext": 1000000, "status": 400}, method="POST")
    db = next((os.path.join(d, "uploader.db") for d, _, files in os.walk(os.path.join(st.work, "state"))
               if "uploader.db" in files), os.path.join(st.work, "state", "uploader.db"))
    queue = os.path.join(os.path.dirname(db), "uploader.queue")
    peak = {"db": 0, "wal": 0, "queue": 0}
    stop = threading.Event()

    def queue_bytes():
        try:
            return sum(e.stat().st_size for e in os.scandir(queue) if e.name.endswith(".seg"))
        except OSError:
            return 0

    def sample():
        while not stop.is_set():
            for k, pth in (("db", db), ("wal", db + "-wal")):
                try:
                    peak[k] = max(peak[k], os.path.getsize(pth))
                except OSError:
                    pass
            peak["queue"] = max(peak["queue"], queue_bytes())
            time.sleep(0.05)
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    r = as_uid(ATTACKER, st.sock, "attacker_dead_letters", {"stream": "attack.deadletters", "seconds": seconds})
    stop.set()
    t.join()
    http(st.base, "/v1/faults", token=st.op, method="DELETE")
    status = call(st.sock, "uploader.status", {})["result"]
    s = (status.get("streams") or {}).get("attack.deadletters") if isinstance(status.get("streams"), dict) else None
    if s is None and isinstance(status.get("streams"), list):
        s = next((x for x in status["streams"] if x.get("stream") == "attack.deadletters" or x.get("name") == "attack.deadletters"), None)
    s = s or {}
    cap = st.disk_cap
    ok = code == 200 and peak["db"] <= cap * 1.25 and s.get("deadLetters", 0) > 0
    return ok, (f"backend answering 400 to every batch; uid {ATTACKER} enqueued {r.get('enqueued')} x 16 KB records "
                f"(then refused {r.get('refused')}x: {(r.get('error') or {}).get('message')}); dead letters "
                f"{s.get('deadLetters')} ({s.get('deadLetterBytes')} B); uploader.db peak {peak['db'] / 1048576:.1f} MiB, "
                f"-wal peak {peak['wal'] / 1048576:.1f} MiB, queue segments peak {peak['queue'] / 1048576:.1f} MiB, "
                f"maxDiskBytes {cap / 1048576:.0f} MiB")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=".build/release")
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--only", help="run only the floods and probes whose name holds this text")
    a = ap.parse_args()
    bin_dir = os.path.abspath(a.bin)
    st = Stack(bin_dir)
    sock, host = st.sock, st.host
    try:
        # The push plugin registers at start: wait for its token (the doors' probes need the device).
        for _ in range(200):
            if call(sock, "push.status", {})["result"].get("token"):
                break
            time.sleep(0.05)
        base = rss_kib(host.pid)
        rows = []
        ok = True
        for name, attack in [("8: 8 clients x 256 x 1 MB enqueue, not reading", lambda: flood_enqueue(sock, a.seconds)),
                             ("9: 4 clients x 5,041 bus.status in one write, not reading", lambda: flood_status(sock, a.seconds)),
                             ("10: connect/close flood, 4 threads", lambda: flood_connect(sock, a.seconds))]:
            if a.only and a.only not in name:
                continue
            m = Monitor(sock, host.pid).start()
            extra = attack() or {}
            r = m.finish()
            r.update(extra)
            time.sleep(1.5)  # the host returns memory after a burst (malloc_trim) one second later
            r["rss_after_mb"] = round(rss_kib(host.pid) / 1024, 1)
            rows.append((name, r))
            ok = ok and r["ping_failures"] == 0
        verdicts = []
        for name, probe in [
            ("notification as another uid", lambda: probe_notification(st)),
            ("backend without a token", lambda: probe_backend_token(st)),
            ("broker anonymous", lambda: probe_broker_anonymous(st)),
            ("broker with another device's credential", lambda: probe_broker_other_device(st)),
            ("GTM cross-uid data layer", lambda: probe_gtm(st)),
            ("push identity rebind by a non-owner", lambda: probe_push_bind(st)),
            ("one uid's failing pixel destination", lambda: probe_pixels(st)),
            ("per-uid queue flood, 64 connections", lambda: probe_queue_flood(st, a.seconds, 64)),
            ("per-uid queue flood, 160 connections", lambda: probe_queue_flood(st, a.seconds, 160)),
            ("batch amplification, 64 connections", lambda: probe_batch_flood(st, a.seconds)),
            ("connect flood as another uid", lambda: probe_connect_flood_uid(st, a.seconds)),
            ("dead-letter disk growth", lambda: probe_dead_letters(st, a.seconds)),
        ]:
            if a.only and a.only not in name:
                continue
            try:
                good, detail = probe()
            except Exception as e:  # a probe that breaks is a failed probe, not a crashed report
                good, detail = False, f"probe error: {type(e).__name__}: {e}"
            verdicts.append((name, good, detail))
            ok = ok and good
            time.sleep(1.5)
        stat = call(sock, "bus.status")["result"]
        restarts = {p["name"]: p["restarts"] for p in stat["plugins"]}
        st.log.flush()
        refusal_lines = sum(1 for l in open(st.work + "/pylond.log") if "connections refused" in l)
    finally:
        st.stop()
    print(f"host RSS at start: {base / 1024:.1f} MB; plugin restarts: {restarts}; "
          f"'connections refused' log lines: {refusal_lines}; refused: {stat['counters'].get('connections_refused')}")
    for name, r in rows:
        print(f"- {name}: " + ", ".join(f"{k}={v}" for k, v in r.items()))
    for name, good, detail in verdicts:
        print(f"{'PASS' if good else 'FAIL'} {name}: {detail}")
    ok = ok and all(v == 0 for v in restarts.values())
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
