#!/usr/bin/env python3
"""Automation evaluator under load (docs/AUTOMATION.md, "Measured"): starts pylon-backend on a free
loopback port with a fresh SQLite file (or --db URL), creates RULES rules that match every event,
posts EVENTS events of distinct users in batches of 500, and reports how long until every journey
was decided (without a broker each ends `no_binding`, so this measures evaluation and the guards,
not delivery) and the latency of /healthz on the backend's loop meanwhile.

    tools/automation-bench.py [--events 5000] [--rules 1] [--db postgresql://...] [--bin .build/debug]
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request

OP = "bench-operator-token-0123456789abcdef"
DK = "bench-device-key-0123456789abcdef"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=5000)
    ap.add_argument("--rules", type=int, default=1)
    ap.add_argument("--db")
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(__file__), "..", ".build", "debug"))
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="automation-bench-")
    for name, v in (("op", OP), ("dk", DK)):
        with open(os.path.join(d, name), "w") as f:
            f.write(v)
        os.chmod(os.path.join(d, name), 0o600)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    p = subprocess.Popen([os.path.join(a.bin, "pylon-backend"), "--listen", f"127.0.0.1:{port}", "--db", a.db or os.path.join(d, "b.db"),
                          "--operator-token-file", os.path.join(d, "op"), "--enrol-secret-file", os.path.join(d, "dk")],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        p.stdout.readline()
        run(f"http://127.0.0.1:{port}", a.events, a.rules)
    finally:
        p.terminate()
        p.wait()


def run(base, n, rules):
    def req(method, path, body=None, token=OP, extra=None):
        r = urllib.request.Request(base + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                   headers={"Authorization": "Bearer " + token, **(extra or {})})
        with urllib.request.urlopen(r) as x:
            return json.loads(x.read() or b"null")

    ids = []
    for i in range(rules):
        ids.append(req("POST", "/v1/admin/automation/rules", {
            "name": f"bench {i}", "appKey": "bench", "reentry": {"mode": "every"},
            "trigger": {"event": "ev", "conditions": [{"property": "price", "op": "range", "gt": 100}]},
            "steps": [{"type": "send", "push": {"appId": "bench", "title": "t", "body": "{{event.price}}"}}]})["id"])
    lat, stop = [], [False]

    def probe():
        while not stop[0]:
            t = time.time()
            urllib.request.urlopen(base + "/healthz").read()
            lat.append((time.time() - t) * 1000)
            time.sleep(0.02)

    th = threading.Thread(target=probe)
    th.start()
    t0 = time.time()
    for b in range(0, n, 500):
        recs = [{"id": f"e{b + i}", "ts": 1, "data": {"event": "ev", "euid": f"u{b + i}", "properties": {"price": 150}}}
                for i in range(min(500, n - b))]
        req("POST", "/v1/batches/ma.bench", {"records": recs}, DK, {"Idempotency-Key": f"k{b}"})
    t1 = time.time()
    while sum(req("GET", f"/v1/admin/automation/rules/{r}/funnel")["suppressed"] for r in ids) < n * rules:
        time.sleep(0.2)
    t2 = time.time()
    stop[0] = True
    th.join()
    lat.sort()
    print(f"{n} events posted in {t1 - t0:.2f} s; {n * rules} journeys decided {t2 - t0:.2f} s after the first post "
          f"({n * rules / (t2 - t0):.0f}/s)")
    print(f"/healthz meanwhile: n={len(lat)} p50={statistics.median(lat):.1f} ms p99={lat[int(len(lat) * 0.99)]:.1f} ms "
          f"max={lat[-1]:.1f} ms")


if __name__ == "__main__":
    main()
