#!/usr/bin/env python3
"""Batch amplification against pylond (issue 32, item 2): what one uid's JSON-RPC batches cost
everyone else.

The attack: ATTACKER_UID (65534, no groups, through `setpriv`) opens --conns connections, writes
--lines lines on each, every line a batch of --members `bus.describe {"format":"openrpc"}`, and
never reads a byte. Meanwhile another uid (this script, as root) pings the host on a connection
of its own every --gap-ms and the host's RSS is sampled. Printed: one batch's bytes in and out,
the victim's ping p50/p99/max during the attack and after it, the host's RSS (start, peak, end)
and the counters that say which bound acted (`slow_readers_closed`, `batches`).

Usage (as root):
  tools/batch-attack-bench.py [--bin .build/debug] [--conns 64] [--lines 2] [--members 128]
                              [--seconds 10] [--limits '{"maxQueuedBytesPerUid": 33554432}']
  tools/batch-attack-bench.py --read --conns 4 --seconds 8   # clients that do read their replies
Starts pylond from --bin with the four plugins of `make run` (their backend and broker are
absent: they run and keep retrying, which is all bus.describe needs), socketMode 0666, in a
temporary directory; stops it at the end. A benchmark, not a test: it prints, it does not judge
(exit status 0 unless the host could not be started or died).
"""
import argparse, json, os, shutil, socket, subprocess, sys, tempfile, threading, time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ATTACKER_UID = 65534

# The never-reading attacker is the tests' own (Tests/fixtures/batch_flood.py); this one reads:
# each connection sends a batch, reads its reply, and again, until the time is up.
READER = r"""
import socket, sys, threading, time
path, conns, members, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
batch = ("[" + ",".join('{"jsonrpc":"2.0","id":%d,"method":"bus.describe","params":{"format":"openrpc"}}' % i
                        for i in range(members)) + "]\n").encode()
done = [0]
def one():
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    f = s.makefile("rb")
    stop = time.time() + seconds
    while time.time() < stop:
        s.sendall(batch)
        f.readline()
        done[0] += 1
    s.close()
ts = [threading.Thread(target=one) for _ in range(conns)]
for t in ts: t.start()
for t in ts: t.join()
print("read %d batch replies" % done[0], flush=True)
"""
FLOOD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "Tests", "fixtures", "batch_flood.py")


def rss_kib(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class Line:
    def __init__(self, path, timeout=60.0):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.settimeout(timeout)
        self.s.connect(path)
        self.buf = b""
        self.n = 0

    def send(self, raw):
        self.s.sendall(raw + b"\n")

    def read(self):
        while b"\n" not in self.buf:
            chunk = self.s.recv(1 << 20)
            if not chunk:
                raise OSError("closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def call(self, method, params=None):
        self.n += 1
        req = {"jsonrpc": "2.0", "id": self.n, "method": method}
        if params is not None:
            req["params"] = params
        self.send(json.dumps(req).encode())
        return json.loads(self.read())


def pct(xs, p):
    xs = sorted(xs) or [0.0]
    return xs[min(len(xs) - 1, int(len(xs) * p))]


class Pinger:
    """The victim: bus.ping on its own connection every `gap` seconds; latencies in ms."""

    def __init__(self, path, gap):
        self.c = Line(path)
        self.gap = gap
        self.lat, self.failures = [], 0
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                r = self.c.call("bus.ping")
                if (r.get("result") or {}).get("pong") is True:
                    self.lat.append((t0, (time.perf_counter() - t0) * 1000))
                else:
                    self.failures += 1
            except OSError:
                self.failures += 1
                return
            time.sleep(self.gap)

    def between(self, t0, t1):
        """Latencies of the pings sent in [t0, t1) (a ping stuck across a boundary counts where it was sent)."""
        return [ms for t, ms in self.lat if t0 <= t < t1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=".build/debug")
    ap.add_argument("--conns", type=int, default=64)
    ap.add_argument("--lines", type=int, default=2)
    ap.add_argument("--members", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--gap-ms", type=float, default=10)
    ap.add_argument("--limits", default="{}", help="JSON object merged into the config's limits")
    ap.add_argument("--read", action="store_true",
                    help="the attacker reads its replies: each connection sends a batch, reads the reply, again")
    a = ap.parse_args()
    bin_dir = os.path.abspath(a.bin)
    work = tempfile.mkdtemp(prefix="pylon-batch-bench-")
    os.chmod(work, 0o755)
    sock = work + "/pylon.sock"
    key = work + "/device.key"
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(32).hex().encode())
    os.close(fd)
    absent = "http://127.0.0.1:9"  # nothing listens: the plugins start and retry
    cfg = {"socket": sock, "socketMode": "0666", "stateDir": work + "/state", "pluginDir": bin_dir, "logLevel": "info",
           "limits": json.loads(a.limits),
           "plugins": [
               {"name": "uploader", "exec": "pylon-uploader",
                "config": {"endpoint": absent + "/v1/batches/{stream}", "credentialFile": key}},
               {"name": "ma", "exec": "pylon-ma", "config": {"backend": absent, "credentialFile": key}},
               {"name": "push", "exec": "pylon-push", "config": {"backend": absent, "credentialFile": key,
                                                                 "broker": {"host": "127.0.0.1", "port": 9}}},
               {"name": "gtm", "exec": "pylon-gtm", "config": {"backend": absent, "credentialFile": key,
                                                               "defaultsDir": os.path.join(REPO, "etc", "gtm")}},
           ]}
    json.dump(cfg, open(work + "/pylon.json", "w"))
    log = open(work + "/pylond.log", "w")
    env = {k: v for k, v in os.environ.items() if k not in ("PYLON_SOCKET", "PYLON_STATE_DIR")}
    host = subprocess.Popen([bin_dir + "/pylond", "--config", work + "/pylon.json"], stdout=log, stderr=log, env=env)
    ok = True
    try:
        for _ in range(400):
            try:
                if Line(sock, 2).call("bus.status")["result"]["state"] == "running":
                    break
            except (OSError, KeyError, ValueError):
                pass
            time.sleep(0.05)
        else:
            raise SystemExit("pylond did not start; log: " + work + "/pylond.log")
        # One batch, read by a client that reads: its amplification.
        probe = Line(sock)
        batch = ("[" + ",".join('{"jsonrpc":"2.0","id":%d,"method":"bus.describe","params":{"format":"openrpc"}}' % i
                                for i in range(a.members)) + "]").encode()
        probe.send(batch)
        reply = probe.read()
        items = json.loads(reply)
        results = sum(1 for m in items if "result" in m) if isinstance(items, list) else 0
        errors = {}
        for m in items if isinstance(items, list) else [items]:
            if "error" in m:
                errors[m["error"]["code"]] = errors.get(m["error"]["code"], 0) + 1
        probe.s.close()
        time.sleep(0.5)

        rss = {"start": rss_kib(host.pid), "peak": 0}
        sampling = threading.Event()

        def sample():
            while not sampling.is_set():
                rss["peak"] = max(rss["peak"], rss_kib(host.pid))
                time.sleep(0.01)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        victim = Pinger(sock, a.gap_ms / 1000)
        vt = threading.Thread(target=victim.run, daemon=True)
        vt.start()
        t_start = time.perf_counter()
        time.sleep(1)
        t_attack = time.perf_counter()
        as_attacker = ["setpriv", f"--reuid={ATTACKER_UID}", f"--regid={ATTACKER_UID}", "--clear-groups", "/usr/bin/python3", "-c"]
        env = {"PATH": "/usr/bin:/bin"}
        if a.read:
            attacker = subprocess.Popen(as_attacker + [READER, sock, str(a.conns), str(a.members), str(a.seconds)],
                                        stdout=subprocess.PIPE, text=True, env=env)
            attacker_out, _ = attacker.communicate(timeout=a.seconds + 120)
        else:
            # batch_flood.py holds its connections, never reading, until its stdin closes.
            attacker = subprocess.Popen(as_attacker + [open(FLOOD).read(), sock, str(a.conns), str(a.lines), str(a.members)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
            attacker_out = attacker.stdout.readline()
            time.sleep(a.seconds)
            attacker.stdin.close()
            attacker.wait(120)
        t_gone = time.perf_counter()
        time.sleep(3)
        t_end = time.perf_counter()
        victim.stop.set()
        vt.join(120)  # a ping still waiting is waited for: its latency counts
        quiet, during, after = (victim.between(t_start, t_attack), victim.between(t_attack, t_gone),
                                victim.between(t_gone, t_end))
        sampling.set()
        sampler.join()
        rss["end"] = rss_kib(host.pid)
        counters = Line(sock).call("bus.status")["result"]["counters"]
        if host.poll() is not None:
            ok = False
    finally:
        host.terminate()
        try:
            host.wait(20)
        except subprocess.TimeoutExpired:
            host.kill()
            host.wait()
        log.close()
        shutil.rmtree(work, ignore_errors=True)
    print(f"pylond {bin_dir}/pylond; limits {a.limits}")
    print(f"one batch of {a.members} bus.describe openrpc: {len(batch)} bytes in, {len(reply) + 1} bytes out "
          f"(x{(len(reply) + 1) / len(batch):.0f}); {results} results, errors by code {errors}")
    if a.read:
        print(f"attack: uid {ATTACKER_UID}, {a.conns} connections sending such batches and reading the replies, "
              f"{a.seconds:g} s ({attacker_out.strip()})")
    else:
        print(f"attack: uid {ATTACKER_UID}, {a.conns} connections x {a.lines} such lines, never reading, held "
              f"{a.seconds:g} s ({attacker_out.strip()})")
    for name, lat in (("before", quiet), ("during", during), ("after (3 s)", after)):
        print(f"victim (root) bus.ping {name}: n={len(lat)} p50={pct(lat, 0.5):.2f} ms p99={pct(lat, 0.99):.2f} ms "
              f"max={max(lat or [0]):.2f} ms")
    worst = sorted(((ms, t - t_attack) for t, ms in victim.lat if t_attack <= t < t_gone), reverse=True)[:3]
    print("victim's slowest pings during the attack: " + ", ".join(f"{ms:.1f} ms at +{at:.2f} s" for ms, at in worst))
    print(f"victim ping failures: {victim.failures}")
    print(f"host RSS: start {rss['start'] / 1024:.1f} MB, peak {rss['peak'] / 1024:.1f} MB, end {rss['end'] / 1024:.1f} MB")
    print("counters: " + ", ".join(f"{k}={counters.get(k)}" for k in
                                   ("batches", "slow_readers_closed", "dropped_for_uid_queue", "protocol_errors")))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
