#!/usr/bin/env python3
"""Chaos soak for Pylon (python3 stdlib only; loopback only; stops by itself).

Starts what `make run` starts, with its credentials (operator token, enrolment secret as every
plugin's credentialFile, the backend's broker password, mosquitto with dynamic security and no
anonymous clients): mosquitto, the reference backend and pylond with the uploader, MA, push and
gtm plugins (from --bin-dir). It drives

  - pipelined `uploader.enqueue` (stream `soak`) and `ma.eventRecord` (AppKey `soak`, stream
    `ma.soak`) with record ids / event ids (`eventId`) the driver chooses; a request that is not
    acknowledged (an error, `-32008` pending, an MA code other than 0, no reply within
    `--client-timeout`, or in flight when its connection died) is sent again later with the same
    ids, as an app retries a timeout; the MA drivers call `ma.start` again every
    `--restart-every` seconds (an app launched again: while the backend is paused the start is
    pending and the events behind it are parked);
  - push: the operator sends through `POST /v1/admin/push/send` (operator token) to the device's
    token; an app client serves `soakapp.onPush` (`bus.provide`), attaches (`push.attach`) and
    acknowledges every message (a success reply); each send carries the driver's sequence number
    in `extendedParams.seq`;
  - the tag manager: `gtm.openContainer GTM-DEMO` (etc/gtm) and `gtm.push {event: openScreen,
    screenName: <driver id>}`, which fires the demo's `_ua` tag: a hit in stream `gtm.hits`;

and meanwhile kills the uploader, MA, push, gtm, the host, the backend and mosquitto with SIGKILL
at random moments, and pauses the backend (SIGSTOP, then SIGCONT: the device is offline; MA's
starts wait for the network, its events are parked) `--pauses` times for `--pause-seconds`. The
host's supervisor restarts the plugins; this script restarts the host, the backend and mosquitto. At the end it flushes and compares what was acknowledged with what arrived:

  acknowledged  records whose enqueue / eventRecord got a success reply; sends the backend answered
                200 with a msgId; gtm.push calls answered {queued: true}
  delivered     acknowledged records / hits the backend holds; acknowledged sends the app received
  lost          acknowledged but not delivered (must be 0)
  stored twice  driver ids held more than once (must be 0): a retried record or event stored
                under a second record id counts here; for push: one send (driver seq)
                delivered to the app under two message ids (must be 0). The same message id
                delivered again (at-least-once; the app deduplicates by id) is counted, not failed.

Exit status 1 if anything acknowledged is lost or stored twice, 2 if the run itself failed.
"""
import argparse, json, os, random, shutil, signal, socket, subprocess, sys, tempfile, threading, time
import urllib.error, urllib.request

p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("--bin-dir", default=".build/release")
p.add_argument("--seconds", type=float, default=120, help="load + chaos duration")
p.add_argument("--kill-every", type=float, nargs=2, default=[2.0, 6.0], metavar=("MIN", "MAX"),
               help="seconds between kills, drawn uniformly")
p.add_argument("--window", type=int, default=32, help="requests in flight per connection")
p.add_argument("--batch", type=int, default=5, help="records per uploader.enqueue")
p.add_argument("--rate", type=float, default=250, help="requests per second per connection (at most)")
p.add_argument("--push-rate", type=float, default=20, help="push sends per second (at most)")
p.add_argument("--gtm-rate", type=float, default=50, help="gtm.push calls per second (at most)")
p.add_argument("--client-timeout", type=float, default=5.0,
               help="seconds a driver waits for a reply before it sends the request again (same ids)")
p.add_argument("--restart-every", type=float, default=7.0,
               help="seconds between the MA drivers' ma.start calls (an app launched again)")
p.add_argument("--pauses", type=int, default=2, help="backend pauses (SIGSTOP/SIGCONT) spread over the run")
p.add_argument("--pause-seconds", type=float, nargs=2, default=[8.0, 15.0], metavar=("MIN", "MAX"),
               help="length of each backend pause, drawn uniformly")
p.add_argument("--seed", type=int, default=None)
p.add_argument("--keep", action="store_true", help="keep the run directory")
args = p.parse_args()

seed = args.seed if args.seed is not None else int(time.time())
rng = random.Random(seed)
BIN = os.path.abspath(args.bin_dir)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
run = tempfile.mkdtemp(prefix="pylon-soak-")
SOCK = os.path.join(run, "pylon.sock")
stop_load = threading.Event()
stop_push_app = threading.Event()
lock = threading.Lock()
acked_upl, acked_ma, acked_gtm = set(), set(), set()
gtm_ack_time = {}                   # driver id -> when gtm.push answered
push_sent = {}                      # msgId -> driver seq, for sends answered 200
push_got = {}                       # msgId -> deliveries to the app
push_seq_ids = {}                   # driver seq -> msgIds it arrived under
stats = {"requests": 0, "errors": 0, "pending": 0, "retries": 0, "timeouts": 0, "reconnects": 0, "push_send_errors": 0, "push_acks": 0}
VICTIMS = ["uploader", "ma", "push", "gtm", "host", "backend", "mosquitto"]
kills = {v: 0 for v in VICTIMS}
kill_log = []                       # (time, victim)
pauses = []                         # (start, seconds) of backend pauses


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


PORT, MQTT_PORT = free_port(), free_port()
BACKEND = f"http://127.0.0.1:{PORT}"


def secret(name):
    """A 0600 file of 64 hex digits, as `make run` writes them."""
    path = os.path.join(run, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(32).hex().encode())
    os.close(fd)
    return path


OPERATOR_TOKEN_FILE, DEVICE_KEY, BROKER_PASSWORD = secret("operator.token"), secret("device.key"), secret("broker.password")
OPERATOR_TOKEN = open(OPERATOR_TOKEN_FILE).read().strip()
subprocess.run([os.path.join(REPO, "tools", "pylon-dynsec-init"), os.path.join(run, "dynsec.json"), "pylon-backend",
                BROKER_PASSWORD], check=True)
DYNSEC_PLUGIN = next(os.path.join(d, "mosquitto_dynamic_security.so") for d in
                     sorted(os.path.join("/usr/lib", x) for x in os.listdir("/usr/lib"))
                     if os.path.exists(os.path.join(d, "mosquitto_dynamic_security.so")))
with open(os.path.join(REPO, "etc", "mosquitto.conf")) as f:
    conf = f.read()
conf = conf.replace("listener 1883 127.0.0.1", f"listener {MQTT_PORT} 127.0.0.1")
conf = "\n".join(f"plugin_opt_config_file {run}/dynsec.json" if ln.startswith("plugin_opt_config_file ")
                 else f"plugin {DYNSEC_PLUGIN}" if ln.startswith("plugin /usr/lib/") else ln
                 for ln in conf.split("\n"))
with open(os.path.join(run, "mosquitto.conf"), "w") as f:
    f.write(conf)

streams = {"maxCount": 200, "intervalMs": 500}
config = {
    "socket": SOCK, "stateDir": os.path.join(run, "state"), "pluginDir": BIN, "logLevel": "warn",
    "plugins": [
        {"name": "uploader", "exec": "pylon-uploader", "restart": "permanent", "config": {
            "endpoint": BACKEND + "/v1/batches/{stream}", "credentialFile": DEVICE_KEY,
            "retryInitialMs": 200, "retryMaxMs": 2000,
            "streams": {"soak": streams, "ma.*": streams, "gtm.hits": streams}}},
        {"name": "ma", "exec": "pylon-ma", "restart": "permanent", "config": {
            "backend": BACKEND, "credentialFile": DEVICE_KEY, "retryInitialMs": 200, "retryMaxMs": 2000}},
        {"name": "push", "exec": "pylon-push", "restart": "permanent", "config": {
            "backend": BACKEND, "credentialFile": DEVICE_KEY,
            "broker": {"host": "127.0.0.1", "port": MQTT_PORT, "keepaliveS": 10, "backoffInitialMs": 100,
                       "backoffMaxMs": 2000},
            "registerRetryInitialMs": 200, "registerRetryMaxMs": 2000, "ackTimeoutMs": 5000,
            "retryInitialMs": 200, "retryMaxMs": 2000}},
        {"name": "gtm", "exec": "pylon-gtm", "restart": "permanent", "config": {
            "backend": BACKEND, "credentialFile": DEVICE_KEY, "defaultsDir": os.path.join(REPO, "etc", "gtm")}},
    ],
}
with open(os.path.join(run, "pylon.json"), "w") as f:
    json.dump(config, f)

procs = {}


def start_mosquitto():
    out = open(os.path.join(run, "mosquitto.log"), "ab")
    # Started from the run directory, as `make run` does: persistence_location ./ puts mosquitto.db there.
    procs["mosquitto"] = subprocess.Popen(["mosquitto", "-c", os.path.join(run, "mosquitto.conf")], cwd=run,
                                          stdout=out, stderr=out)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", MQTT_PORT), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit("mosquitto did not start")


def start_backend():
    out = open(os.path.join(run, "backend.log"), "ab")
    b = subprocess.Popen([os.path.join(BIN, "pylon-backend"), "--listen", f"127.0.0.1:{PORT}",
                          "--db", os.path.join(run, "backend.db"), "--log-level", "warn",
                          "--operator-token-file", OPERATOR_TOKEN_FILE, "--enrol-secret-file", DEVICE_KEY,
                          "--mqtt", f"127.0.0.1:{MQTT_PORT}", "--mqtt-username", "pylon-backend",
                          "--mqtt-password-file", BROKER_PASSWORD, "--mqtt-dynsec"],
                         stdout=subprocess.PIPE, stderr=out)
    line = b.stdout.readline()
    if b"listening" not in line:
        raise SystemExit(f"backend did not start: {line!r}")
    procs["backend"] = b


def start_host():
    out = open(os.path.join(run, "pylond.log"), "ab")
    # --socket/--state-dir: `make` exports PYLON_SOCKET, which would override the config's socket.
    procs["host"] = subprocess.Popen([os.path.join(BIN, "pylond"), "--config", os.path.join(run, "pylon.json"),
                                      "--socket", SOCK, "--state-dir", os.path.join(run, "state")],
                                     stdout=out, stderr=out)
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            if rpc("bus.ping", {}, timeout=2).get("result"):
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit("pylond did not come up")


def rpc(method, params, timeout=30):
    """One request on a fresh connection; returns the reply object."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    try:
        s.connect(SOCK)
        s.sendall(json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode() + b"\n")
        buf = b""
        while b"\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                raise OSError("closed")
            buf += chunk
        return json.loads(buf.split(b"\n", 1)[0])
    finally:
        s.close()


def http_json(path, body=None, timeout=10):
    """The backend's API with the operator token."""
    req = urllib.request.Request(BACKEND + path, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + OPERATOR_TOKEN,
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def child_pid(name):
    """The pid of plugin executable `name` whose parent is the host, or None."""
    host = procs["host"].pid
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
        except OSError:
            continue
        comm = st[st.index("(") + 1:st.rindex(")")]
        ppid = int(st[st.rindex(")") + 2:].split()[1])
        if ppid == host and comm == name[:15]:
            return int(d)
    return None


class Pipeline:
    """One client connection with up to `window` requests in flight."""

    def __init__(self, kind, n):
        self.kind = kind
        self.prefix = f"{kind[0]}{n}-"  # ids unique across connections
        self.rate = args.gtm_rate if kind == "gtm" else args.rate
        self.next_id = 0
        self.seq = 0
        self.retry = []                 # ids not acknowledged: sent again with the same ids

    def connect(self):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(2)
        s.connect(SOCK)
        return s

    def request(self, rid):
        if self.kind == "upl":
            if self.retry:
                ids = self.retry.pop(0)
                with lock:
                    stats["retries"] += 1
            else:
                ids = [f"{self.prefix}{self.seq + i}" for i in range(args.batch)]
                self.seq += args.batch
            recs = [{"id": i, "data": {"n": i, "pad": "x" * 64}} for i in ids]
            msg = {"jsonrpc": "2.0", "id": rid, "method": "uploader.enqueue",
                   "params": {"stream": "soak", "consent": "soak", "records": recs}}
        elif self.kind == "ma":
            if self.retry:
                ids = self.retry.pop(0)
                with lock:
                    stats["retries"] += 1
            else:
                ids = [f"{self.prefix}{self.seq}"]
                self.seq += 1
            # The event id makes the retry safe: the device stores it once.
            msg = {"jsonrpc": "2.0", "id": rid, "method": "ma.eventRecord",
                   "params": {"appKey": "soak", "eventName": "soak", "eventId": ids[0], "property": {"soak_id": ids[0]}}}
        else:
            # The container is opened again before every push (an open id answers at once): a
            # restarted gtm plugin has forgotten its open containers, and a push with no container
            # open fires nothing. Its reply (negative id) is not counted.
            ids = [f"{self.prefix}{self.seq}"]
            self.seq += 1
            opener = {"jsonrpc": "2.0", "id": -rid, "method": "gtm.openContainer",
                      "params": {"containerId": "GTM-DEMO", "openType": "default"}}
            msg = {"jsonrpc": "2.0", "id": rid, "method": "gtm.push",
                   "params": {"data": {"event": "openScreen", "screenName": ids[0]}}}
            return json.dumps(opener).encode() + b"\n" + json.dumps(msg).encode() + b"\n", ids
        return json.dumps(msg).encode() + b"\n", ids

    def ok(self, reply):
        if "result" not in reply:
            return False
        if self.kind == "gtm":
            return reply["result"].get("queued") is True
        return self.kind == "upl" or reply["result"].get("code") == 0

    def run(self):
        while not stop_load.is_set():
            try:
                s = self.connect()
                if self.kind == "ma":
                    # While the backend is down or paused the start is answered pending (-32008)
                    # and goes on: the events behind it are parked and sent with its EUID.
                    s.settimeout(30)
                    s.sendall(b'{"jsonrpc":"2.0","id":0,"method":"ma.start","params":{"appKey":"soak"}}\n')
                    buf = b""
                    while b"\n" not in buf:
                        c = s.recv(65536)
                        if not c:
                            raise OSError("closed")
                        buf += c
                    r = json.loads(buf.split(b"\n", 1)[0])
                    if (r.get("error") or {}).get("code") == -32008:
                        with lock:
                            stats["pending"] += 1
                    elif (r.get("result") or {}).get("code") != 0:
                        raise OSError("ma.start failed")
                    s.settimeout(2)
                self.pump(s)
            except (OSError, ValueError):
                pass
            with lock:
                stats["reconnects"] += 1
            time.sleep(0.1)

    def pump(self, s):
        inflight = {}
        sent_at = {}
        buf = b""
        t0, sent = time.time(), 0
        last_start = time.time()
        try:
            while not stop_load.is_set() or inflight:
                out = b""
                now = time.time()
                # The app's own timeout: no reply in time, so the same ids go again (the late
                # reply, if any, is ignored).
                if self.kind != "gtm":
                    for rid in [r for r, t in sent_at.items() if now - t > args.client_timeout]:
                        del sent_at[rid]
                        self.retry.append(inflight.pop(rid))
                        with lock:
                            stats["timeouts"] += 1
                if self.kind == "ma" and not stop_load.is_set() and now - last_start > args.restart_every:
                    last_start = now
                    self.next_id += 1
                    out += json.dumps({"jsonrpc": "2.0", "id": -self.next_id, "method": "ma.start",
                                       "params": {"appKey": "soak"}}).encode() + b"\n"
                # Paced: a soak, not a benchmark (and the backend's records listing must stay
                # quick enough to read everything back at the end).
                allowed = int(self.rate * (time.time() - t0)) - sent
                if not inflight and allowed <= 0:
                    time.sleep(0.005)
                    continue
                while not stop_load.is_set() and len(inflight) < args.window and allowed > 0:
                    allowed -= 1
                    sent += 1
                    self.next_id += 1
                    line, ids = self.request(self.next_id)
                    inflight[self.next_id] = ids
                    sent_at[self.next_id] = time.time()
                    out += line
                if out:
                    s.sendall(out)
                try:
                    c = s.recv(262144)
                except socket.timeout:
                    if stop_load.is_set():
                        return
                    continue
                if not c:
                    return
                buf += c
                *lines, buf = buf.split(b"\n")
                for ln in lines:
                    if not ln:
                        continue
                    r = json.loads(ln)
                    ids = inflight.pop(r.get("id"), None)
                    sent_at.pop(r.get("id"), None)
                    if ids is None:
                        if isinstance(r.get("id"), int) and r["id"] < 0 and (r.get("error") or {}).get("code") == -32008:
                            with lock:
                                stats["pending"] += 1  # a start waiting for the network
                        continue
                    good = self.ok(r)
                    with lock:
                        stats["requests"] += 1
                        if good:
                            {"upl": acked_upl, "ma": acked_ma, "gtm": acked_gtm}[self.kind].update(ids)
                            if self.kind == "gtm":
                                gtm_ack_time[ids[0]] = time.time()
                        else:
                            stats["errors"] += 1
                            if (r.get("error") or {}).get("code") == -32008:
                                stats["pending"] += 1
                    if not good and self.kind != "gtm":
                        self.retry.append(ids)
        finally:
            s.close()
            # Unanswered when the connection went: their outcome is unknown, so they go again.
            if self.kind != "gtm":
                self.retry.extend(inflight.values())


class PushApp:
    """The app: serves `soakapp.onPush`, attaches, acknowledges every message with a success reply.
    Attaches again every second (a safeguard: a restarted push plugin keeps its attached apps)."""

    def run(self):
        while not stop_push_app.is_set():
            try:
                s = socket.socket(socket.AF_UNIX)
                s.settimeout(1)
                s.connect(SOCK)
                self.pump(s)
            except (OSError, ValueError):
                pass
            time.sleep(0.1)

    def pump(self, s):
        try:
            s.sendall(b'{"jsonrpc":"2.0","id":"p","method":"bus.provide","params":{"method":"soakapp.onPush"}}\n')
            buf, last_attach = b"", 0
            while not stop_push_app.is_set():
                if time.time() - last_attach > 1:
                    s.sendall(b'{"jsonrpc":"2.0","id":"a","method":"push.attach",'
                              b'"params":{"appId":"soakapp","callback":"soakapp.onPush"}}\n')
                    last_attach = time.time()
                try:
                    c = s.recv(262144)
                except socket.timeout:
                    continue
                if not c:
                    return
                buf += c
                *lines, buf = buf.split(b"\n")
                out = b""
                for ln in lines:
                    if not ln:
                        continue
                    m = json.loads(ln)
                    if m.get("method") != "soakapp.onPush" or "id" not in m:
                        continue
                    msg = (m.get("params") or {}).get("message") or {}
                    mid, seq = msg.get("id"), (msg.get("extras") or {}).get("seq")
                    with lock:
                        push_got[mid] = push_got.get(mid, 0) + 1
                        push_seq_ids.setdefault(seq, set()).add(mid)
                        stats["push_acks"] += 1
                    out += json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": {}}).encode() + b"\n"
                if out:
                    s.sendall(out)
        finally:
            s.close()


def push_token():
    """The device's push token (root is an admin client: push.status shows it)."""
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            r = rpc("push.register", {"timeoutMs": 5000}, timeout=10).get("result") or {}
            if r.get("code") == 0 and r.get("token"):
                return r["token"]
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("the push plugin got no device token")


def push_sender(token):
    """The operator: paced sends through the admin API; a 200 with a msgId is an acknowledged send."""
    seq, t0, sent = 0, time.time(), 0
    while not stop_load.is_set():
        if int(args.push_rate * (time.time() - t0)) - sent <= 0:
            time.sleep(0.01)
            continue
        sent += 1
        seq += 1
        body = {"appId": "soakapp", "target": token, "title": f"soak {seq}", "content": "x" * 64,
                "extendedParams": {"seq": str(seq)}, "expiredSeconds": 3600}
        try:
            r = http_json("/v1/admin/push/send", body, timeout=5)
            if r.get("msgId") and not r.get("duplicate"):
                with lock:
                    push_sent[r["msgId"]] = str(seq)
            else:
                with lock:
                    stats["push_send_errors"] += 1
        except (OSError, ValueError, urllib.error.URLError):
            with lock:
                stats["push_send_errors"] += 1
            time.sleep(0.05)


def pause_backend():
    """The device offline: the backend stopped (SIGSTOP) for a while, then resumed (SIGCONT)."""
    b = procs["backend"]
    if b.poll() is not None:
        return
    secs = rng.uniform(*args.pause_seconds)
    log(f"pause backend for {secs:.1f} s")
    os.kill(b.pid, signal.SIGSTOP)
    t = time.time()
    try:
        time.sleep(secs)
    finally:
        os.kill(b.pid, signal.SIGCONT)
    pauses.append((t, secs))


def chaos(deadline):
    start = time.time()
    due = [start + (deadline - start) * (i + 1) / (args.pauses + 1) for i in range(args.pauses)]
    while time.time() < deadline:
        time.sleep(rng.uniform(*args.kill_every))
        if time.time() >= deadline:
            break
        if due and time.time() >= due[0]:
            due.pop(0)
            pause_backend()
            continue
        victim = rng.choice(VICTIMS)
        if victim in ("uploader", "ma", "push", "gtm"):
            pid = child_pid("pylon-" + victim)
            if pid is None:
                continue  # being restarted by the supervisor
            os.kill(pid, signal.SIGKILL)
        else:
            procs[victim].kill()
            procs[victim].wait()
        kills[victim] += 1
        kill_log.append((time.time(), victim))
        log(f"kill -9 {victim}")
        if victim == "host":
            time.sleep(rng.uniform(0, 0.5))
            start_host()
        elif victim == "backend":
            time.sleep(rng.uniform(0, 1.0))
            start_backend()
        elif victim == "mosquitto":
            time.sleep(rng.uniform(0, 1.0))
            start_mosquitto()


class StoredIds:
    """Driver ids in the backend's copy of a stream, with multiplicity, read incrementally
    (records are listed in arrival order, so each call reads only what arrived since)."""

    def __init__(self, stream, key):
        self.stream, self.key, self.after, self.ids = stream, key, 0, []

    def update(self):
        while True:
            page = http_json(f"/v1/inspect/streams/{self.stream}/records?limit=1000&after={self.after}")
            self.ids.extend(self.key(r) for r in page["records"])
            if page["next"] is None or not page["records"]:
                return self.ids
            self.after = page["next"]


def main():
    log(f"soak: run dir {run}, backend {BACKEND}, broker 127.0.0.1:{MQTT_PORT}, seed {seed}, {args.seconds:.0f} s")
    start_mosquitto()
    start_backend()
    start_host()
    token = push_token()
    app = threading.Thread(target=PushApp().run, daemon=True)
    app.start()
    workers = [threading.Thread(target=Pipeline(k, n).run, daemon=True)
               for n, k in enumerate(("upl", "upl", "ma", "ma", "gtm"))]
    workers.append(threading.Thread(target=push_sender, args=(token,), daemon=True))
    for w in workers:
        w.start()
    t0 = time.time()
    chaos(t0 + args.seconds)
    stop_load.set()
    for w in workers:
        w.join(timeout=60)
    load_s = time.time() - t0
    log(f"load stopped after {load_s:.0f} s; flushing")
    # Everything up again (a kill may have just happened), then flush until the backend holds
    # every acknowledged record and the app has every acknowledged send, or 180 s pass.
    if procs["mosquitto"].poll() is not None:
        start_mosquitto()
    if procs["backend"].poll() is not None:
        start_backend()
    if procs["host"].poll() is not None:
        start_host()
    deadline = time.time() + 180
    last_progress, last_change, last_log = None, time.time(), time.time()
    upl_store = StoredIds("soak", lambda r: r["id"])
    ma_store = StoredIds("ma.soak", lambda r: ((r.get("data") or {}).get("properties") or {}).get("soak_id"))
    gtm_store = StoredIds("gtm.hits", lambda r: (((r.get("data") or {}).get("tag")) or {}).get("screenName"))
    while True:
        for stream in ("soak", "ma.soak", "gtm.hits"):
            try:
                rpc("uploader.flush", {"stream": stream, "wait": True}, timeout=30)
            except OSError:
                pass
        try:
            upl_ids, ma_ids, gtm_ids = upl_store.update(), ma_store.update(), gtm_store.update()
        except (OSError, ValueError, urllib.error.URLError):
            time.sleep(1)
            continue
        with lock:
            push_done = set(push_sent) <= set(push_got)
        if (acked_upl <= set(upl_ids) and acked_ma <= set(ma_ids) and acked_gtm <= set(gtm_ids)
                and push_done) or time.time() > deadline:
            break
        # Nothing more arriving for 30 s (every retry backoff is at most 2 s): what is missing is lost.
        progress = (len(upl_ids), len(ma_ids), len(gtm_ids), len(push_got))
        if progress != last_progress:
            last_progress, last_change = progress, time.time()
        elif time.time() - last_change > 30:
            break
        if time.time() - last_log > 10:
            last_log = time.time()
            log(f"waiting: missing uploader {len(acked_upl - set(upl_ids))}, ma {len(acked_ma - set(ma_ids))}, "
                f"gtm hits {len(acked_gtm - set(gtm_ids))}, push {len(set(push_sent) - set(push_got))}")
        time.sleep(1)
    stop_push_app.set()
    summary = {s: http_json(f"/v1/inspect/streams/{s}") for s in ("soak", "ma.soak", "gtm.hits")}

    def report(name, acked, ids, summ):
        held = set(ids)
        twice = len(ids) - len(held)
        lost = acked - held
        print(f"  {name:9} acknowledged {len(acked):8}  delivered {len(acked & held):8}  lost {len(lost):4}"
              f"  stored twice {twice:3}  unacknowledged but stored {len(held - acked):6}"
              f"  backend dropped duplicates: {summ['duplicateRecords']} records, {summ['duplicateBatches']} batches")
        if lost:
            print(f"    lost (first 10): {sorted(lost)[:10]}")
        return len(lost), twice

    print(f"soak: {load_s:.0f} s of load, seed {seed}, kills {kills}, replies {stats['requests']}"
          f" ({stats['errors']} errors, {stats['pending']} pending), client timeouts {stats['timeouts']},"
          f" retries {stats['retries']},"
          f" reconnects {stats['reconnects']}, backend paused {len(pauses)}x for {sum(p for _, p in pauses):.0f} s")
    l1, d1 = report("uploader", acked_upl, upl_ids, summary["soak"])
    l2, d2 = report("ma", acked_ma, ma_ids, summary["ma.soak"])
    l3, d3 = report("gtm hits", acked_gtm, gtm_ids, summary["gtm.hits"])
    lost_gtm = acked_gtm - set(gtm_ids)
    if lost_gtm:
        # The kill nearest to each lost hit's gtm.push reply (within 5 s before or after it).
        near = {}
        for i in lost_gtm:
            t = gtm_ack_time.get(i, 0)
            close = [(abs(k - t), v, "before" if k <= t else "after") for k, v in kill_log if abs(k - t) <= 5]
            key = " ".join(min(close)[1:]) if close else "no kill within 5 s"
            near[key] = near.get(key, 0) + 1
        print(f"    lost hits by the kill nearest to their gtm.push reply (kill of X before/after it): {near}")
    with lock:
        sent, got = set(push_sent), set(push_got)
        redelivered = sum(n - 1 for n in push_got.values())
        twice_seq = sum(1 for ids in push_seq_ids.values() if len(ids) > 1)
        unacked_got = len(got - sent)
    lost_push = sent - got
    print(f"  {'push':9} acknowledged {len(sent):8}  delivered {len(sent & got):8}  lost {len(lost_push):4}"
          f"  stored twice {twice_seq:3}  unacknowledged but delivered {unacked_got:6}"
          f"  same id delivered again: {redelivered}; sends not acknowledged: {stats['push_send_errors']}"
          f"; app acknowledgements: {stats['push_acks']}")
    if lost_push:
        print(f"    lost (first 10): {sorted((push_sent[m], m) for m in lost_push)[:10]}")
        try:
            deliveries = http_json("/v1/inspect/push/deliveries")
            rows = [d for d in deliveries.get("deliveries", []) if d.get("msgId") in lost_push][:5]
            print(f"    backend deliveries of lost sends (first 5): {rows}")
        except (OSError, ValueError, urllib.error.URLError):
            pass
    ok = (l1 + l2 + l3 + len(lost_push) == 0 and d1 + d2 + d3 + twice_seq == 0
          and acked_upl and acked_ma and acked_gtm and sent)
    print("soak: PASS" if ok else "soak: FAIL")
    return 0 if ok else 1


# SIGTERM/SIGINT (also when started in the background, where SIGINT is ignored): clean up.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
signal.signal(signal.SIGINT, lambda *_: sys.exit(3))
rc = 2
try:
    rc = main()
finally:
    stop_push_app.set()
    for name in ("host", "backend", "mosquitto"):
        pr = procs.get(name)
        if pr and pr.poll() is None:
            if name == "backend":
                os.kill(pr.pid, signal.SIGCONT)
            pr.terminate()
            try:
                pr.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pr.kill()
    if args.keep or rc != 0:
        print(f"run directory kept: {run}")
    else:
        shutil.rmtree(run, ignore_errors=True)
sys.exit(rc)
