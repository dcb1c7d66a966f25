#!/usr/bin/env python3
"""Opens N persistent MQTT 3.1.1 sessions the way Pylon devices do and reports the connect rate.

usage: mqtt-sessions-bench.py HOST:PORT[,HOST:PORT...] N [--user U --password-file F] [--window W]
                              [--prefix P] [--topic-prefix T] [--hold-s S] [--pids PID,...]
                              [--kill PID] [--pylon-auth KEYFILE]

Each client connects with clean session off and a fixed client id (P + index), subscribes QoS 1
to its own topic (T + index), and stays connected; clients are spread over the addresses in
turn. At most W connects are outstanding at once. Prints one JSON line with the sessions
established, the connects per second (CONNACK + SUBACK), failures, and, with --pids, the RSS of
those processes (the broker nodes) read from /proc before and after, so
(rssAfter - rssBefore) / N is the memory per session. --hold-s keeps the sessions open that
long after (for measuring by hand). --kill PID then kills that broker node (SIGKILL) and every
client whose connection dropped reconnects to the next address with the same client id, until
all are up again: "failover" reports how long that took, how many CONNACKs said session present
and how many attempts failed. One thread, one selector; needs `ulimit -n` above N. --pylon-auth KEYFILE (`<kid>:<hex key>`,
the pylon_auth plugin's key, docs/FLEET.md): client i logs in as its own device, username i and a
token signed as pylon-backend --mqtt-auth-key-file signs it (give --topic-prefix pylon/push/d/).
"""
import hashlib, hmac, json, os, selectors, socket, sys, time

args = sys.argv[1:]
addrs = [(h, int(p)) for h, p in (a.rsplit(":", 1) for a in args.pop(0).split(","))]
n = int(args.pop(0))
user = password = None
window, prefix, tprefix, hold, pids, kill_pid, auth_key = 100, "bench-", "bench/d/", 0, [], None, None
while args:
    a = args.pop(0)
    if a == "--user": user = args.pop(0)
    elif a == "--password-file": password = open(args.pop(0)).read().strip()
    elif a == "--window": window = int(args.pop(0))
    elif a == "--prefix": prefix = args.pop(0)
    elif a == "--topic-prefix": tprefix = args.pop(0)
    elif a == "--hold-s": hold = float(args.pop(0))
    elif a == "--pids": pids = [int(x) for x in args.pop(0).split(",")]
    elif a == "--kill": kill_pid = int(args.pop(0))
    elif a == "--pylon-auth": auth_key = open(args.pop(0)).read().strip()
    else: sys.exit(__doc__.split("\n\n")[1])


def rss(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def s(x):
    b = x.encode()
    return bytes([len(b) >> 8, len(b) & 255]) + b


def rl(k):
    out = b""
    while True:
        d, k = k % 128, k // 128
        out += bytes([d | (0x80 if k else 0)])
        if not k:
            return out


def pkt(t, body):
    return bytes([t]) + rl(len(body)) + body


def pylon_token(username, client_id):
    kid, hexkey = auth_key.split(":", 1)
    head = "pm1.%s.%d" % (kid, int(time.time()) + 3600)
    mac = hmac.new(bytes.fromhex(hexkey), ("%s\n%s\n%s" % (head, username, client_id)).encode(), hashlib.sha256)
    return head + "." + mac.hexdigest()


def connect_packet(i):
    u, pw = user, password
    if auth_key: u, pw = str(i), pylon_token(str(i), prefix + str(i))
    flags = (0x80 if u else 0) | (0x40 if pw else 0)
    body = s("MQTT") + bytes([4, flags, 0, 120]) + s(prefix + str(i))
    if u: body += s(u)
    if pw: body += s(pw)
    return pkt(0x10, body)


before = {p: rss(p) for p in pids}
sel = selectors.DefaultSelector()
state = {}  # sock -> [index, phase, buffer, started]
done = failed = 0
next_i = 0
latencies = []
socks = []
t0 = time.time()


def start(i, shift=0):
    h, p = addrs[(i + shift) % len(addrs)]
    so = socket.create_connection((h, p))
    so.setblocking(False)
    so.sendall(connect_packet(i))
    state[so] = [i, "connack", b"", time.time(), shift]
    sel.register(so, selectors.EVENT_READ)
    socks.append(so)


idle_since = time.time()
while done + failed < n and time.time() - idle_since < 60:
    while next_i < n and sum(1 for v in state.values() if v[1] in ("connack", "suback")) < window:
        start(next_i)
        next_i += 1
    for key, _ in sel.select(timeout=10):
        idle_since = time.time()
        so = key.fileobj
        st = state[so]
        try:
            d = so.recv(4096)
        except BlockingIOError:
            continue
        if not d:
            sel.unregister(so)
            if st[1] != "up": failed += 1
            st[1] = "dead"
            continue
        st[2] += d
        while len(st[2]) >= 2 and len(st[2]) >= 2 + st[2][1]:
            t, body, st[2] = st[2][0], st[2][2:2 + st[2][1]], st[2][2 + st[2][1]:]
            if t >> 4 == 2:
                if body[1] != 0:
                    failed += 1
                    st[1] = "dead"
                    break
                so.send(pkt(0x82, bytes([0, 1]) + s(tprefix + str(st[0])) + bytes([1])))
                st[1] = "suback"
            elif t >> 4 == 9:
                if body[2] == 0x80:
                    failed += 1
                    st[1] = "refused"
                    continue
                else:
                    done += 1
                    latencies.append(time.time() - st[3])
                st[1] = "up"
elapsed = time.time() - t0
time.sleep(2)  # let the brokers settle (session writes) before reading RSS
after = {p: rss(p) for p in pids}
latencies.sort()
print(json.dumps({
    "sessions": done, "failed": failed, "stalled": n - done - failed, "seconds": round(elapsed, 2), "connectsPerSecond": round(done / elapsed, 1),
    "connectP50ms": round(1000 * latencies[len(latencies) // 2], 1) if latencies else None,
    "connectP99ms": round(1000 * latencies[int(len(latencies) * 0.99)], 1) if latencies else None,
    "rssBefore": before, "rssAfter": after,
    "bytesPerSession": round((sum(after.values()) - sum(before.values())) / max(1, done)) if pids else None,
}))
if hold: time.sleep(hold)
if kill_pid:
    import signal
    up = sum(1 for v in state.values() if v[1] == "up")
    os.kill(kill_pid, signal.SIGKILL)
    t1 = last_up = time.time()
    present = attempts = 0
    lost, dropped = set(), set()
    idle_since = time.time()
    # Until every dropped client is up again (and at least 3 s, for the drops to be noticed).
    while (lost or time.time() - t1 < 3) and time.time() - idle_since < 120:
        for key, _ in sel.select(timeout=1):
            idle_since = time.time()
            so = key.fileobj
            st = state[so]
            try:
                d = so.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                d = b""
            if not d:
                sel.unregister(so)
                so.close()
                del state[so]
                lost.add(st[0])
                dropped.add(st[0])
                attempts += 1
                try:
                    start(st[0], st[4] + 1)
                except OSError:
                    start(st[0], st[4] + 2)
                continue
            st[2] += d
            while len(st[2]) >= 2 and len(st[2]) >= 2 + st[2][1]:
                t, body, st[2] = st[2][0], st[2][2:2 + st[2][1]], st[2][2 + st[2][1]:]
                if t >> 4 == 2 and body[1] == 0 and st[0] in lost:
                    if body[0] & 1: present += 1
                    st[1] = "up"
                    lost.discard(st[0])
                    last_up = time.time()
    print(json.dumps({"failover": {"sessionsUp": up, "dropped": len(dropped), "reconnected": len(dropped) - len(lost),
                                   "secondsUntilAllUp": round(last_up - t1, 2), "stillDown": len(lost),
                                   "sessionPresent": present, "reconnectAttempts": attempts}}))
