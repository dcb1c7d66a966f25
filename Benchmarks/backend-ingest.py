#!/usr/bin/env python3
"""Ingest throughput of one running pylon-backend: CONNECTIONS keep-alive clients post batches of
RECORDS records (unique keys and ids) for SECONDS; prints requests/s and records/s.

usage: backend-ingest.py URL DEVICE_KEY_FILE [SECONDS] [CONNECTIONS] [RECORDS]
(DEVICE_KEY_FILE: the enrolment secret file, presented as the fleet-level device key)."""
import http.client, json, sys, threading, time, urllib.parse, uuid

url = urllib.parse.urlparse(sys.argv[1])
key = open(sys.argv[2]).read().strip()
seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 10
conns = int(sys.argv[4]) if len(sys.argv) > 4 else 4
records = int(sys.argv[5]) if len(sys.argv) > 5 else 10
counts = [0] * conns
errors = [0] * conns
deadline = time.monotonic() + seconds

def worker(i):
    c = http.client.HTTPConnection(url.hostname, url.port)
    run = uuid.uuid4().hex[:8]
    n = 0
    while time.monotonic() < deadline:
        k = f"{run}-{i}-{n}"
        body = json.dumps({"batch": k, "stream": "bench", "records": [
            {"id": f"{k}-{r}", "ts": 1700000000000, "data": {"name": "e", "n": r}} for r in range(records)]})
        c.request("POST", "/v1/batches/bench", body, {
            "Content-Type": "application/json", "Idempotency-Key": k, "Authorization": "Bearer " + key})
        r = c.getresponse()
        r.read()
        if r.status == 200: counts[i] += 1
        else: errors[i] += 1
        n += 1

ts = [threading.Thread(target=worker, args=(i,)) for i in range(conns)]
for t in ts: t.start()
for t in ts: t.join()
total = sum(counts)
print(f"{total / seconds:.0f} requests/s, {total * records / seconds:.0f} records/s, errors {sum(errors)} "
      f"({conns} connections, {records} records per batch, {seconds:.0f} s)")
