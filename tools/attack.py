#!/usr/bin/env python3
"""Re-runs the hostile-load probes of issue 11 (items 8-10) against a real pylond and reports
what matters to an operator: the host's peak RSS, the latency of a concurrent bus.ping (p50,
p99, max), whether any healthy plugin was restarted, descriptors and log lines.

Usage: tools/attack.py [--bin .build/release] [--seconds N]
Starts its own pylon-backend, pylond (uploader + ma) in a temporary directory on loopback,
runs each attack for a bounded time, stops everything, prints one table. Exit status 1 if a
plugin was restarted or a ping failed.
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

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=".build/release")
    ap.add_argument("--seconds", type=float, default=8)
    a = ap.parse_args()
    bin_dir = os.path.abspath(a.bin)
    work = tempfile.mkdtemp(prefix="pylon-attack-")
    sock = work + "/pylon.sock"
    port = 18900 + os.getpid() % 500
    backend = subprocess.Popen([bin_dir + "/pylon-backend", "--listen", f"127.0.0.1:{port}", "--db", work + "/b.db"],
                               stderr=subprocess.DEVNULL)
    cfg = {"socket": sock, "stateDir": work + "/state", "pluginDir": bin_dir, "logLevel": "info",
           "plugins": [{"name": "uploader", "exec": "pylon-uploader",
                        "config": {"endpoint": f"http://127.0.0.1:{port}/v1/batches/{{stream}}"}},
                       {"name": "ma", "exec": "pylon-ma", "config": {"backend": f"http://127.0.0.1:{port}"}}]}
    json.dump(cfg, open(work + "/pylon.json", "w"))
    log = open(work + "/pylond.log", "w")
    env = {k: v for k, v in os.environ.items() if k not in ("PYLON_SOCKET", "PYLON_STATE_DIR")}
    host = subprocess.Popen([bin_dir + "/pylond", "--config", work + "/pylon.json"], stderr=log, stdout=log, env=env)
    for _ in range(200):
        try:
            if call(sock, "bus.status")["result"]["state"] == "running":
                break
        except (OSError, KeyError, ValueError):
            time.sleep(0.05)
    base = rss_kib(host.pid)
    rows = []
    ok = True
    for name, attack in [("8: 8 clients x 256 x 1 MB enqueue, not reading", lambda: flood_enqueue(sock, a.seconds)),
                         ("9: 4 clients x 5,041 bus.status in one write, not reading", lambda: flood_status(sock, a.seconds)),
                         ("10: connect/close flood, 4 threads", lambda: flood_connect(sock, a.seconds))]:
        m = Monitor(sock, host.pid).start()
        extra = attack() or {}
        r = m.finish()
        r.update(extra)
        time.sleep(1.5)  # the host returns memory after a burst (malloc_trim) one second later
        r["rss_after_mb"] = round(rss_kib(host.pid) / 1024, 1)
        rows.append((name, r))
        ok = ok and r["ping_failures"] == 0
    st = call(sock, "bus.status")["result"]
    restarts = {p["name"]: p["restarts"] for p in st["plugins"]}
    log.flush()
    refusal_lines = sum(1 for l in open(work + "/pylond.log") if "connections refused" in l)
    host.terminate(); host.wait(15)
    backend.terminate(); backend.wait(15)
    print(f"host RSS at start: {base / 1024:.1f} MB; plugin restarts: {restarts}; "
          f"'connections refused' log lines: {refusal_lines}; refused: {st['counters'].get('connections_refused')}")
    for name, r in rows:
        print(f"- {name}: " + ", ".join(f"{k}={v}" for k, v in r.items()))
    shutil.rmtree(work, ignore_errors=True)
    ok = ok and all(v == 0 for v in restarts.values())
    sys.exit(0 if ok else 1)

if __name__ == "__main__":
    main()
