#!/usr/bin/env python3
"""The attacker's and the victim's side of tools/attack.py, run as an unprivileged uid
(`setpriv --reuid=U --regid=U --clear-groups python3 tools/attack_probe.py SOCKET PROBE ARGS_JSON`).

Each probe prints one JSON object on stdout. python3 standard library only, plus the Python
client (`clients/python/src`, on PYTHONPATH) for the AsyncClient probe.
"""
import asyncio, json, os, socket, sys, threading, time


def conn(path, timeout=5.0):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    s.connect(path)
    return s


class Line:
    """One connection: send JSON lines, read replies by id (notifications are skipped)."""

    def __init__(self, path):
        self.s = conn(path)
        self.buf = b""
        self.n = 0

    def send(self, obj):
        self.s.sendall(json.dumps(obj).encode() + b"\n")

    def call(self, method, params=None):
        self.n += 1
        req = {"jsonrpc": "2.0", "id": self.n, "method": method}
        if params is not None:
            req["params"] = params
        self.send(req)
        while True:
            while b"\n" not in self.buf:
                c = self.s.recv(65536)
                if not c:
                    raise OSError("closed")
                self.buf += c
            ln, self.buf = self.buf.split(b"\n", 1)
            m = json.loads(ln)
            if m.get("id") == self.n:
                return m

    def notify(self, method, params):
        self.send({"jsonrpc": "2.0", "method": method, "params": params})


def hold():
    """The victim keeps its connection until the driver closes our stdin."""
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.read()


def victim_ma(path, a):
    c = Line(path)
    r = c.call("ma.start", {"appKey": a["appKey"], "dataCollectionEnabled": True})
    print(json.dumps({"start": r.get("result")}), flush=True)
    sys.stdin.read()


def attacker_ma_notify(path, a):
    """`ma.setDataCollectionEnabled` for the victim's AppKey as a notification, as a batch of
    notifications and as a request; a request after them is the barrier (routed in order)."""
    c = Line(path)
    p = {"appKey": a["appKey"], "enabled": False}
    c.notify("ma.setDataCollectionEnabled", p)
    c.send([{"jsonrpc": "2.0", "method": "ma.setDataCollectionEnabled", "params": p}])
    # The request is routed to MA after the notifications, on the same channel: its reply is the barrier.
    r = c.call("ma.setDataCollectionEnabled", p)
    print(json.dumps({"request": r.get("result", r.get("error"))}))


def victim_gtm(path, a):
    c = Line(path)
    c.call("gtm.openContainer", {"containerId": "GTM-DEMO", "openType": "default"})
    c.call("gtm.push", {"data": {"screenName": a["secret"]}})
    own = c.call("gtm.getValue", {"containerId": "GTM-DEMO", "key": "screenName", "type": "string"})
    print(json.dumps({"own": (own.get("result") or {}).get("value")}), flush=True)
    sys.stdin.read()


def attacker_gtm(path, a):
    c = Line(path)
    c.call("gtm.openContainer", {"containerId": "GTM-DEMO", "openType": "default"})
    mine = c.call("gtm.getValue", {"containerId": "GTM-DEMO", "key": "screenName", "type": "string"})
    as_uid = c.call("gtm.getValue", {"containerId": "GTM-DEMO", "key": "screenName", "type": "string",
                                     "uid": a["victimUid"]})
    logs = c.call("gtm.logLines", {"all": True})
    status = c.call("gtm.status", {})
    print(json.dumps({"value": (mine.get("result") or {}).get("value"),
                      "asVictim": as_uid.get("error", {}).get("code") if "error" in as_uid else as_uid.get("result"),
                      "logLinesAll": logs.get("error", {}).get("code") if "error" in logs else "answered",
                      "statusLeaks": a["secret"] in json.dumps(status)}))


def pixel_gtm(path, a):
    """Opens GTM-PIXEL (its `_img` tag's url is the data-layer value `pixelUrl`) and pushes one
    `px` event per URL; prints when the last push was sent (`pushedAt`, wall clock) and the answers."""
    c = Line(path)
    c.call("gtm.openContainer", {"containerId": "GTM-PIXEL", "timeoutMs": 5000})
    pushes = []
    t = None
    for u in a["urls"]:
        t = time.time()
        r = c.call("gtm.push", {"data": {"event": "px", "pixelUrl": u}})
        pushes.append(r.get("result", r.get("error")))
    print(json.dumps({"pushedAt": t, "pushes": pushes}))


def attacker_push_bind(path, a):
    c = Line(path)
    r = c.call("push.bind", {"userId": a["userId"]})
    u = c.call("push.unbind", {"userId": a["userId"]})
    t = c.call("push.setDeviceToken", {"token": "ab" * 16})
    st = c.call("push.status", {})
    res = st.get("result") or {}
    print(json.dumps({"bind": (r.get("result") or {}).get("code"), "unbind": (u.get("result") or {}).get("code"),
                      "setDeviceToken": (t.get("result") or {}).get("code"),
                      "statusShowsToken": "token" in res or "installId" in res}))


def attacker_queue_flood(path, a):
    """`conns` connections subscribed to everything and never reading, and one connection of the
    same uid publishing 64 KB publications for `seconds`."""
    subs = []
    for _ in range(a["conns"]):
        c = Line(path)
        c.call("bus.subscribe", {"pattern": "*"})
        subs.append(c)
    pub = Line(path)
    payload = {"pad": "x" * 65536}
    line = json.dumps({"jsonrpc": "2.0", "id": 0, "method": "bus.publish",
                       "params": {"topic": "attack.flood", "data": payload}}).encode() + b"\n"
    pub.s.settimeout(1)
    sent, stop = 0, time.time() + a["seconds"]
    # The publisher reads its own replies (so it is not the slow reader) and sends as fast as it can.
    reader_stop = threading.Event()

    def drain():
        while not reader_stop.is_set():
            try:
                if not pub.s.recv(1 << 20):
                    return
            except OSError:
                if reader_stop.is_set():
                    return
    t = threading.Thread(target=drain, daemon=True)
    t.start()
    while time.time() < stop:
        try:
            pub.s.sendall(line)
            sent += 1
        except OSError:
            break
    reader_stop.set()
    open_subs = 0
    for c in subs:
        try:
            c.s.setblocking(False)
            c.s.recv(1)
            open_subs += 1
        except BlockingIOError:
            open_subs += 1
        except OSError:
            pass
    print(json.dumps({"published": sent, "subscribers_open_at_end": open_subs}))


def attacker_batch_flood(path, a):
    """`conns` connections each write `lines` batches of `members` bus.describe openrpc and never
    read; closed after `seconds`."""
    member = '{"jsonrpc":"2.0","id":%d,"method":"bus.describe","params":{"format":"openrpc"}}'
    batch = ("[" + ",".join(member % i for i in range(a["members"])) + "]\n").encode()
    socks = []
    for _ in range(a["conns"]):
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            s.setblocking(False)
            socks.append(s)
        except OSError:
            pass
    for s in socks:
        for _ in range(a["lines"]):
            try:
                s.send(batch)
            except OSError:
                pass
    time.sleep(a["seconds"])
    for s in socks:
        s.close()
    print(json.dumps({"conns": len(socks)}))


def attacker_connect_flood(path, a):
    stop = time.time() + a["seconds"]
    counts = [0] * a["threads"]

    def one(k):
        while time.time() < stop:
            try:
                s = socket.socket(socket.AF_UNIX)
                s.connect(path)
                s.close()
                counts[k] += 1
            except OSError:
                pass
    ts = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(a["threads"])]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print(json.dumps({"connects": sum(counts)}))


def victim_connect_measure(path, a):
    """While another uid floods: `pylon.AsyncClient` connect + bus.ping every 50 ms, and plain
    non-blocking connects (EAGAIN is a failure), each for `seconds`."""
    from pylon import AsyncClient

    async def aio():
        ok = tries = 0
        stop = time.time() + a["seconds"]
        while time.time() < stop:
            tries += 1
            try:
                async with AsyncClient(path, timeout=5) as bus:
                    if (await bus.call("bus.ping")).get("pong"):
                        ok += 1
            except Exception:
                pass
            await asyncio.sleep(0.05)
        return ok, tries
    ok, tries = asyncio.run(aio())
    nb_ok = nb_tries = 0
    stop = time.time() + a["seconds"]
    while time.time() < stop:
        nb_tries += 1
        s = socket.socket(socket.AF_UNIX)
        s.setblocking(False)
        try:
            s.connect(path)
            nb_ok += 1
        except OSError:
            pass
        s.close()
        time.sleep(0.01)
    print(json.dumps({"async_ok": ok, "async_tries": tries, "nonblocking_ok": nb_ok, "nonblocking_tries": nb_tries}))


def attacker_dead_letters(path, a):
    """16 KB records into the attacker's own stream while the backend refuses every batch (400):
    they become dead letters. Enqueues until refused or `seconds` pass, flushing now and then."""
    c = Line(path)
    pad = "y" * 16384
    n = refused = 0
    err = None
    stop = time.time() + a["seconds"]
    while time.time() < stop:
        recs = [{"id": f"d{n + i}", "data": {"p": pad}} for i in range(16)]
        r = c.call("uploader.enqueue", {"stream": a["stream"], "records": recs})
        if "error" in r:
            refused += 1
            err = r["error"]
            c.call("uploader.flush", {"stream": a["stream"], "wait": True})
            time.sleep(0.05)
        else:
            n += 16
        if n % 512 == 0:
            c.call("uploader.flush", {"stream": a["stream"], "wait": True})
    f = c.call("uploader.flush", {"stream": a["stream"], "wait": True})
    print(json.dumps({"enqueued": n, "refused": refused, "error": err, "flush": f.get("result", f.get("error"))}))


if __name__ == "__main__":
    sock, probe, arg = sys.argv[1], sys.argv[2], json.loads(sys.argv[3] if len(sys.argv) > 3 else "{}")
    globals()[probe](sock, arg)
