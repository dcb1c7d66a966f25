#!/usr/bin/env python3
"""Chaos soak for Pylon (python3 stdlib only; loopback only; stops by itself).

Starts the reference backend and pylond with the uploader and MA plugins (from --bin-dir), drives
pipelined `uploader.enqueue` (stream `soak`) and `ma.eventRecord` (AppKey `soak`, stream
`ma.soak`) load with record ids the driver chooses, and meanwhile kills the uploader, MA, the host
and the backend with SIGKILL at random moments. The host's supervisor restarts the plugins; this
script restarts the host and the backend. At the end it flushes both streams and compares what was
acknowledged with what the backend stored (its inspection API):

  acknowledged  records whose enqueue / eventRecord got a success reply
  delivered     acknowledged records the backend holds
  lost          acknowledged but not held by the backend (must be 0)
  stored twice  driver ids held more than once (must be 0)
  duplicates    records and batches the backend recognised as duplicates and dropped

Exit status 1 if anything acknowledged is lost or stored twice, 2 if the run itself failed.
"""
import argparse, json, os, random, shutil, signal, socket, subprocess, sys, tempfile, threading, time
import urllib.request

p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("--bin-dir", default=".build/release")
p.add_argument("--seconds", type=float, default=120, help="load + chaos duration")
p.add_argument("--kill-every", type=float, nargs=2, default=[2.0, 6.0], metavar=("MIN", "MAX"),
               help="seconds between kills, drawn uniformly")
p.add_argument("--window", type=int, default=32, help="requests in flight per connection")
p.add_argument("--batch", type=int, default=5, help="records per uploader.enqueue")
p.add_argument("--rate", type=float, default=250, help="requests per second per connection (at most)")
p.add_argument("--seed", type=int, default=None)
p.add_argument("--keep", action="store_true", help="keep the run directory")
args = p.parse_args()

seed = args.seed if args.seed is not None else int(time.time())
rng = random.Random(seed)
BIN = os.path.abspath(args.bin_dir)
run = tempfile.mkdtemp(prefix="pylon-soak-")
SOCK = os.path.join(run, "pylon.sock")
stop_load = threading.Event()
lock = threading.Lock()
acked_upl, acked_ma = set(), set()
stats = {"requests": 0, "errors": 0, "reconnects": 0}
kills = {"uploader": 0, "ma": 0, "host": 0, "backend": 0}


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


PORT = free_port()
BACKEND = f"http://127.0.0.1:{PORT}"
config = {
    "socket": SOCK, "stateDir": os.path.join(run, "state"), "pluginDir": BIN, "logLevel": "warn",
    "plugins": [
        {"name": "uploader", "exec": "pylon-uploader", "restart": "permanent", "config": {
            "endpoint": BACKEND + "/v1/batches/{stream}", "retryInitialMs": 200, "retryMaxMs": 2000,
            "streams": {"soak": {"maxCount": 200, "intervalMs": 500}, "ma.*": {"maxCount": 200, "intervalMs": 500}}}},
        {"name": "ma", "exec": "pylon-ma", "restart": "permanent", "config": {
            "backend": BACKEND, "retryInitialMs": 200, "retryMaxMs": 2000}},
    ],
}
with open(os.path.join(run, "pylon.json"), "w") as f:
    json.dump(config, f)

procs = {}


def start_backend():
    out = open(os.path.join(run, "backend.log"), "ab")
    b = subprocess.Popen([os.path.join(BIN, "pylon-backend"), "--listen", f"127.0.0.1:{PORT}",
                          "--db", os.path.join(run, "backend.db"), "--log-level", "warn"],
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


def http_json(path):
    with urllib.request.urlopen(BACKEND + path, timeout=10) as r:
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
        self.prefix = f"{'u' if kind == 'upl' else 'm'}{n}-"  # ids unique across connections
        self.next_id = 0
        self.seq = 0

    def connect(self):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(2)
        s.connect(SOCK)
        return s

    def request(self, rid):
        if self.kind == "upl":
            ids = [f"{self.prefix}{self.seq + i}" for i in range(args.batch)]
            self.seq += args.batch
            recs = [{"id": i, "data": {"n": i, "pad": "x" * 64}} for i in ids]
            msg = {"jsonrpc": "2.0", "id": rid, "method": "uploader.enqueue",
                   "params": {"stream": "soak", "consent": "soak", "records": recs}}
        else:
            ids = [f"{self.prefix}{self.seq}"]
            self.seq += 1
            msg = {"jsonrpc": "2.0", "id": rid, "method": "ma.eventRecord",
                   "params": {"appKey": "soak", "eventName": "soak", "property": {"soak_id": ids[0]}}}
        return json.dumps(msg).encode() + b"\n", ids

    def ok(self, reply):
        if "result" not in reply:
            return False
        return self.kind == "upl" or reply["result"].get("code") == 0

    def run(self):
        while not stop_load.is_set():
            try:
                s = self.connect()
                if self.kind == "ma":
                    # A start waits while the backend is down (MA retries it): give it time.
                    s.settimeout(30)
                    s.sendall(b'{"jsonrpc":"2.0","id":0,"method":"ma.start","params":{"appKey":"soak"}}\n')
                    buf = b""
                    while b"\n" not in buf:
                        c = s.recv(65536)
                        if not c:
                            raise OSError("closed")
                        buf += c
                    if json.loads(buf.split(b"\n", 1)[0]).get("result", {}).get("code") != 0:
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
        buf = b""
        t0, sent = time.time(), 0
        try:
            while not stop_load.is_set() or inflight:
                out = b""
                # Paced: a soak, not a benchmark (and the backend's records listing must stay
                # quick enough to read everything back at the end).
                allowed = int(args.rate * (time.time() - t0)) - sent
                if not inflight and allowed <= 0:
                    time.sleep(0.005)
                    continue
                while not stop_load.is_set() and len(inflight) < args.window and allowed > 0:
                    allowed -= 1
                    sent += 1
                    self.next_id += 1
                    line, ids = self.request(self.next_id)
                    inflight[self.next_id] = ids
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
                    if ids is None:
                        continue
                    good = self.ok(r)
                    with lock:
                        stats["requests"] += 1
                        if good:
                            (acked_upl if self.kind == "upl" else acked_ma).update(ids)
                        else:
                            stats["errors"] += 1
        finally:
            s.close()


def chaos(deadline):
    while time.time() < deadline:
        time.sleep(rng.uniform(*args.kill_every))
        if time.time() >= deadline:
            break
        victim = rng.choice(["uploader", "ma", "host", "backend"])
        if victim in ("uploader", "ma"):
            pid = child_pid("pylon-" + victim)
            if pid is None:
                continue  # being restarted by the supervisor
            os.kill(pid, signal.SIGKILL)
        else:
            procs[victim].kill()
            procs[victim].wait()
        kills[victim] += 1
        log(f"kill -9 {victim}")
        if victim == "host":
            time.sleep(rng.uniform(0, 0.5))
            start_host()
        elif victim == "backend":
            time.sleep(rng.uniform(0, 1.0))
            start_backend()


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
    log(f"soak: run dir {run}, backend {BACKEND}, seed {seed}, {args.seconds:.0f} s")
    start_backend()
    start_host()
    workers = [threading.Thread(target=Pipeline(k, n).run, daemon=True)
               for n, k in enumerate(("upl", "upl", "ma", "ma"))]
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
    # every acknowledged record or 120 s pass.
    if procs["backend"].poll() is not None:
        start_backend()
    if procs["host"].poll() is not None:
        start_host()
    deadline = time.time() + 120
    upl_store = StoredIds("soak", lambda r: r["id"])
    ma_store = StoredIds("ma.soak", lambda r: ((r.get("data") or {}).get("properties") or {}).get("soak_id"))
    while True:
        for stream in ("soak", "ma.soak"):
            try:
                rpc("uploader.flush", {"stream": stream, "wait": True}, timeout=30)
            except OSError:
                pass
        upl_ids = upl_store.update()
        ma_ids = ma_store.update()
        if (acked_upl <= set(upl_ids) and acked_ma <= set(ma_ids)) or time.time() > deadline:
            break
        time.sleep(1)
    summary = {s: http_json(f"/v1/inspect/streams/{s}") for s in ("soak", "ma.soak")}

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
          f" ({stats['errors']} errors), reconnects {stats['reconnects']}")
    l1, d1 = report("uploader", acked_upl, upl_ids, summary["soak"])
    l2, d2 = report("ma", acked_ma, ma_ids, summary["ma.soak"])
    ok = l1 + l2 == 0 and d1 + d2 == 0 and acked_upl and acked_ma
    print("soak: PASS" if ok else "soak: FAIL")
    return 0 if ok else 1


# SIGTERM/SIGINT (also when started in the background, where SIGINT is ignored): clean up.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
signal.signal(signal.SIGINT, lambda *_: sys.exit(3))
rc = 2
try:
    rc = main()
finally:
    for name in ("host", "backend"):
        pr = procs.get(name)
        if pr and pr.poll() is None:
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
