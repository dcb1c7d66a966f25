#!/usr/bin/env python3
"""Runs a Pylon fleet on this machine (python3 stdlib only; loopback only; stops everything at the end).

Starts the server side, then `pylon-fleet` (K simulated devices) and a few real `pylond` instances
end to end, optionally injects faults, and prints the figures (docs/FLEET.md, "Running a fleet").

Server side, each part chosen by what the built `pylon-backend` supports (`--help`), so the same
script runs the embedded default today and the full fleet once every piece is in:

  database   PostgreSQL 15 (initdb + pg_ctl in the run directory, Unix socket, run as `nobody`)
             when pylon-backend takes `--db postgresql://...`; otherwise one SQLite file (and then
             one backend instance: SQLite is not shared between processes)
  stream     three nats-server nodes (JetStream, one cluster) when pylon-backend takes `--nats`
  broker     one mosquitto with the pylon_auth plugin (stateless signed device credentials:
             registering a device costs the broker nothing) when pylon-backend takes
             `--mqtt-auth-key-file` and the plugin is built (`make mosquitto-auth`); `--broker
             nats`: three more nats-server nodes with MQTT listeners and JWT auth
             (tools/pylon-nats-auth), a cluster of their own; `--broker dynsec` (or neither
             built): mosquitto with dynamic security
  backends   N pylon-backend instances on free ports, behind
  haproxy    one address: leastconn, health checks on /healthz, retries and redispatch on
             connection failure (requests not yet sent), so any request may land on any instance

Simulator: one `pylon-fleet` process per --devices-per-process devices (default 5,000: a device
holds three descriptors there, and RLIMIT_NOFILE is 20,000 here), each with its own range of
device indexes in one run; their JSON summaries are merged into one.

Faults (--faults): once every device is connected, at 20, 45 and 70 % of the remaining load: kill -9 of one broker node (restarted
5 s later), kill -9 of one backend instance (restarted 5 s later), a PostgreSQL restart
(`pg_ctl restart -m immediate`, a crash and recovery). pylon-fleet measures what they cost.

Exit status: pylon-fleet's (0 all good, 1 an acknowledged event lost or stored twice or a push
delivered twice, 3 incomplete), or 1 if a pylond instance lost an acknowledged event or push,
2 if the run itself failed.
"""
import argparse, json, os, pwd, resource, shutil, signal, socket, subprocess, sys, tempfile, threading, time
import http.client, urllib.error, urllib.request

from fleet_merge import fleet_opt as _fleet_opt, merge_summaries, shards  # tools/fleet/fleet_merge.py

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PG_BIN = "/usr/lib/postgresql/15/bin"

p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("--bin-dir", default=os.path.join(REPO, ".build", "debug"))
p.add_argument("--dir", help="run directory (default: a new temporary one, removed at the end unless --keep)")
p.add_argument("--keep", action="store_true")
p.add_argument("--backends", type=int, default=2, help="pylon-backend instances behind haproxy (default 2)")
p.add_argument("--pylonds", type=int, default=2, help="real pylond instances end to end (default 2)")
p.add_argument("--db", choices=["auto", "sqlite", "postgres"], default="auto")
p.add_argument("--stream", choices=["auto", "none", "nats"], default="auto")
p.add_argument("--broker", choices=["auto", "mosquitto", "dynsec", "nats"], default="auto",
               help="auto/mosquitto: mosquitto with pylon_auth when built, else dynamic security; dynsec; nats")
p.add_argument("--auth-plugin", default=os.path.join(REPO, ".build", "pylon_auth.so"),
               help="the pylon_auth mosquitto plugin (make mosquitto-auth)")
p.add_argument("--devices-per-process", type=int, default=5000,
               help="devices per pylon-fleet process (default 5000); more devices start more processes")
p.add_argument("--faults", action="store_true", help="kill -9 a broker node, a backend; restart PostgreSQL")
p.add_argument("--devices", type=int, default=1000)
p.add_argument("--rate", type=float, default=1.0, help="events per second per device")
p.add_argument("--duration", type=int, default=60, help="seconds of load")
p.add_argument("--summary-json", help="write pylon-fleet's JSON summary (with the faults) here")
p.add_argument("fleet_args", nargs="*", help="more pylon-fleet arguments (after --)")
args = p.parse_args()

BIN = os.path.abspath(args.bin_dir)
run = os.path.abspath(args.dir) if args.dir else tempfile.mkdtemp(prefix="pylon-fleet-")
os.makedirs(run, exist_ok=True)
os.chmod(run, 0o755)
procs = {}          # name -> Popen (servers this script started)
pids_file = os.path.join(run, "pids")
fleet_procs = []     # (name, Popen, status file) of the pylon-fleet processes
stopping = threading.Event()
lock = threading.Lock()


def log(*a):
    print(time.strftime("%H:%M:%S"), "fleet:", *a, file=sys.stderr, flush=True)


given_ports = set()


def free_port():
    """A free loopback port, never one this script handed out before: a port chosen early (the
    load balancer's) is not bound until later, and the kernel may offer it again meanwhile."""
    while True:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        if port not in given_ports:
            given_ports.add(port)
            return port


def secret(name):
    """A 0600 file of 64 hex digits, as `make run` writes them."""
    path = os.path.join(run, name)
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, os.urandom(32).hex().encode())
        os.close(fd)
    return path


def wait_port(port, what, timeout=30, proc=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode} (logs in {run})")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{what} did not listen on {port} within {timeout} s (logs in {run})")


def write_pids():
    with lock:
        lines = [f"{n} {pr.pid}" for n, pr in sorted(procs.items()) if pr.poll() is None and not n.startswith("__")]
        # The first pylon-fleet process reads this file and reports itself: the others are
        # listed so its process table has every one of them.
        lines += [f"{n} {pr.pid}" for n, pr, _ in fleet_procs[1:] if pr.poll() is None]
    if "pid" in pg:
        lines.append(f"postgres {pg['pid']}")
    tmp = pids_file + ".new"
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, pids_file)


def spawn(name, argv, cwd=None, stdout=None, env=None):
    out = open(os.path.join(run, name + ".log"), "ab")
    pr = subprocess.Popen(argv, cwd=cwd or run, stdout=stdout or out, stderr=out, env=env, start_new_session=True)
    with lock:
        procs[name] = pr
    write_pids()
    return pr


def kill(name):
    with lock:
        pr = procs.get(name)
    if pr and pr.poll() is None:
        pr.kill()
        pr.wait()
    write_pids()


# ---- Raise the descriptor limit for every child (a broker holds one per device) -------------
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if os.getuid() == 0:
    try:
        nr_open = int(open("/proc/sys/fs/nr_open").read())
        resource.setrlimit(resource.RLIMIT_NOFILE, (nr_open, nr_open))
        hard = nr_open
    except (OSError, ValueError):
        pass
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

backend_help = subprocess.run([os.path.join(BIN, "pylon-backend"), "--help"], capture_output=True, text=True).stdout
use_pg = args.db == "postgres" or (args.db == "auto" and "postgresql://" in backend_help)
use_nats_stream = args.stream == "nats" or (args.stream == "auto" and "--nats" in backend_help)
# The broker: mosquitto with the pylon_auth plugin (what holds 10,000 devices here, docs/FLEET.md)
# unless another is asked or it is not built.
use_nats_mqtt = args.broker == "nats"
use_pylon_auth = (args.broker in ("auto", "mosquitto") and "--mqtt-auth-key-file" in backend_help
                  and os.path.exists(args.auth_plugin))
if args.broker == "mosquitto" and not use_pylon_auth:
    log(f"no pylon_auth plugin at {args.auth_plugin} (make mosquitto-auth) or no --mqtt-auth-key-file in pylon-backend: "
        "mosquitto with dynamic security")
n_backends = args.backends if use_pg else 1
if not use_pg and args.backends > 1:
    log(f"pylon-backend has no PostgreSQL store here: one backend instance on SQLite (asked {args.backends})")
need_nats = use_nats_stream

OPERATOR_TOKEN_FILE, DEVICE_KEY, BROKER_PASSWORD = secret("operator.token"), secret("device.key"), secret("broker.password")


def auth_key():
    """The pylon_auth key, `<kid>:<hex key>` (0600): the broker checks with it, the backends sign with it."""
    path = os.path.join(run, "broker-auth.key")
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"fleet:" + os.urandom(32).hex().encode() + b"\n")
        os.close(fd)
    return path


AUTH_KEY = auth_key() if use_pylon_auth else None
OPERATOR_TOKEN = open(OPERATOR_TOKEN_FILE).read().strip()
LB_PORT = free_port()
LB = f"http://127.0.0.1:{LB_PORT}"

# ---- PostgreSQL ------------------------------------------------------------------------------
pg = {}


def as_nobody():
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"] if os.getuid() == 0 else []


def start_postgres():
    d = os.path.join(run, "pg")
    data, sock = os.path.join(d, "data"), os.path.join(d, "sock")
    if not os.path.exists(data):
        os.makedirs(sock, exist_ok=True)
        if os.getuid() == 0:
            nobody = pwd.getpwnam("nobody")
            for x in (d, sock):
                os.chown(x, nobody.pw_uid, nobody.pw_gid)
        # initdb -A trust: whoever reaches the socket is the superuser, so only its owner
        # (nobody) and root (the backends) may enter the socket's directory.
        os.chmod(sock, 0o700)
        r = subprocess.run(as_nobody() + [f"{PG_BIN}/initdb", "-D", data, "-A", "trust", "-U", "pylon", "--no-sync"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit("initdb failed: " + r.stderr)
        with open(os.path.join(data, "postgresql.conf"), "a") as f:
            f.write(f"listen_addresses = ''\nunix_socket_directories = '{sock}'\nport = {pg.setdefault('port', free_port())}\n"
                    "max_connections = 200\nfsync = on\nsynchronous_commit = on\nshared_buffers = 128MB\n")
    pg_ctl("start", "-w", "-l", os.path.join(d, "postgres.log"))
    pg["url"] = f"postgresql:///postgres?host={sock}&port={pg['port']}&user=pylon"
    log(f"postgresql: {pg['url']}")


def pg_ctl(*a):
    data = os.path.join(run, "pg", "data")
    r = subprocess.run(as_nobody() + [f"{PG_BIN}/pg_ctl", "-D", data, *a], capture_output=True, text=True)
    if r.returncode != 0 and a[0] != "stop":
        raise SystemExit(f"pg_ctl {a[0]} failed: {r.stdout}{r.stderr}")
    pidf = os.path.join(data, "postmaster.pid")
    if a[0] != "stop" and os.path.exists(pidf):
        pg["pid"] = int(open(pidf).readline())


# ---- NATS: three nodes, one cluster, JetStream (and MQTT when it is the broker) ---------------
nats = []


def start_nats():
    """Three nodes from tools/pylon-nats-cluster's configurations (the one generator of them),
    started and killed here so a fault can kill -9 one and start it again."""
    d = os.path.join(run, "nats")
    client, cluster, mqtt = [free_port() for _ in range(3)], [free_port() for _ in range(3)], [free_port() for _ in range(3)]
    cmd = [os.path.join(REPO, "tools", "pylon-nats-cluster"), "config", "--dir", d,
           "--client-ports", ",".join(map(str, client)), "--cluster-ports", ",".join(map(str, cluster))]
    subprocess.run(cmd, check=True, capture_output=True)
    for i in range(3):
        nats.append({"name": f"nats{i + 1}", "port": client[i], "cluster": cluster[i], "mqtt": mqtt[i],
                     "conf": os.path.join(d, f"n{i + 1}", "nats.conf")})
    for n in nats:
        start_nats_node(n)
    for n in nats:
        wait_port(n["port"], n["name"], proc=procs[n["name"]])
    log("nats: " + nats_urls())


def nats_urls():
    return ",".join(f"nats://127.0.0.1:{n['port']}" for n in nats)


def stream_subject(stream):
    """The JetStream subject of a Pylon stream (docs/FLEET.md, "Ingest stream": dots escaped)."""
    return "pylon.ingest." + stream.replace("%", "%25").replace(".", "%2E")


def stream_records(stream):
    """Every record of a Pylon stream: from JetStream with --nats, else the inspection API."""
    out = []
    if use_nats_stream:
        r = subprocess.run([sys.executable, os.path.join(REPO, "tools", "pylon-stream-consumer"), "--server", nats_urls(),
                            "--durable", "fleet-e2e-" + os.urandom(4).hex(), "--filter", stream_subject(stream), "--once"],
                           capture_output=True, text=True, timeout=120)
        for ln in r.stdout.splitlines():
            out += (json.loads(ln).get("batch") or {}).get("records") or []
        return out
    after = 0
    while True:
        page = http_json(f"/v1/inspect/streams/{stream}/records?limit=1000&after={after}", timeout=30)
        out += page["records"]
        if not page["records"] or page.get("next") is None:
            return out
        after = page["next"]


# ---- The push broker cluster: three more nats-server nodes, MQTT, JWT auth --------------------
# A cluster of its own: its accounts are JWT-only (tools/pylon-nats-auth), and the stream's
# tools (pylon-stream-consumer) log in with a user and password, not a JWT.
mq = []


def start_broker_cluster():
    d = os.path.join(run, "mqttc")
    os.makedirs(d, exist_ok=True)
    subprocess.run([sys.executable, os.path.join(REPO, "tools", "pylon-nats-auth"), "init", os.path.join(d, "auth")],
                   check=True, capture_output=True)
    for i in range(3):
        mq.append({"name": f"mqtt{i + 1}", "port": free_port(), "cluster": free_port(), "mqtt": free_port()})
    routes = ", ".join(f"nats-route://127.0.0.1:{m['cluster']}" for m in mq)
    for m in mq:
        m["conf"] = os.path.join(d, m["name"] + ".conf")
        with open(m["conf"], "w") as f:
            # The node configuration of Tests/IntegrationTests/TestBrokerCluster.swift.
            f.write(f"server_name: {m['name']}\nlisten: 127.0.0.1:{m['port']}\n"
                    f"jetstream {{ store_dir: \"{d}/js-{m['name']}\", max_memory_store: 256MB, max_file_store: 2GB }}\n"
                    f"cluster {{ name: pylon-mqtt, listen: 127.0.0.1:{m['cluster']}, routes: [{routes}] }}\n"
                    f"mqtt {{ listen: 127.0.0.1:{m['mqtt']}, ack_wait: \"5s\" }}\n"
                    "include auth/auth.conf\n")
    for m in mq:
        start_broker_node(m)
    for m in mq:
        wait_port(m["mqtt"], m["name"], proc=procs[m["name"]])
    # The account's MQTT streams are created when the first MQTT client of it connects; the
    # devices retry until they are (pylon-push does the same).
    log("mqtt brokers (nats-server, JWT auth): " + ",".join(broker_list()))


def start_broker_node(m):
    spawn(m["name"], ["nats-server", "-c", m["conf"]], cwd=os.path.join(run, "mqttc"))


def start_nats_node(n):
    spawn(n["name"], ["nats-server", "-c", n["conf"]])


# ---- mosquitto (the embedded default) ---------------------------------------------------------
mosq = {}


def mosquitto_conf_pylon_auth():
    """etc/mosquitto.conf with the pylon_auth plugin instead of dynamic security (docs/FLEET.md,
    "Stateless broker credentials"): no per-device state in the broker."""
    open(os.path.join(run, "revoked"), "a").close()
    out = []
    for ln in open(os.path.join(REPO, "etc", "mosquitto.conf")).read().split("\n"):
        if ln.startswith("listener "):
            ln = f"listener {mosq['port']} 127.0.0.1"
        elif ln.startswith("plugin_opt_config_file "):
            continue
        elif ln.startswith("plugin "):
            ln = (f"plugin {os.path.abspath(args.auth_plugin)}\nplugin_opt_key_file {AUTH_KEY}\n"
                  f"plugin_opt_revocation_file {run}/revoked\nplugin_opt_backend_user pylon-backend")
        elif ln.startswith("persistence_location"):
            ln = f"persistence_location {run}/"
        elif ln.startswith("autosave_interval"):
            ln = "autosave_interval 5"
        out.append(ln)
    return "\n".join(out)


def start_mosquitto():
    if not mosq and use_pylon_auth:
        mosq["port"] = free_port()
        conf = mosquitto_conf_pylon_auth()
        if os.getuid() != 0:
            conf = conf.replace("\nuser root\n", "\n")
        open(os.path.join(run, "mosquitto.conf"), "w").write(conf)
    if not mosq:
        mosq["port"] = free_port()
        subprocess.run([os.path.join(REPO, "tools", "pylon-dynsec-init"), os.path.join(run, "dynsec.json"),
                        "pylon-backend", BROKER_PASSWORD], check=True)
        plugin = next(os.path.join(d, "mosquitto_dynamic_security.so") for d in
                      sorted(os.path.join("/usr/lib", x) for x in os.listdir("/usr/lib"))
                      if os.path.exists(os.path.join(d, "mosquitto_dynamic_security.so")))
        conf = open(os.path.join(REPO, "etc", "mosquitto.conf")).read()
        conf = conf.replace("listener 1883 127.0.0.1", f"listener {mosq['port']} 127.0.0.1")
        conf = "\n".join(f"plugin_opt_config_file {run}/dynsec.json" if ln.startswith("plugin_opt_config_file ")
                         else f"plugin {plugin}" if ln.startswith("plugin /usr/lib/")
                         else "autosave_interval 5" if ln.startswith("autosave_interval") else ln
                         for ln in conf.split("\n"))
        if os.getuid() != 0:
            conf = conf.replace("\nuser root\n", "\n")
        open(os.path.join(run, "mosquitto.conf"), "w").write(conf)
    pr = spawn("mosquitto", ["mosquitto", "-c", os.path.join(run, "mosquitto.conf")])
    wait_port(mosq["port"], "mosquitto", proc=pr)


def broker_list():
    if use_nats_mqtt:
        return [f"127.0.0.1:{m['mqtt']}" for m in mq]
    return [f"127.0.0.1:{mosq['port']}"]


# ---- pylon-backend instances and haproxy ------------------------------------------------------
backends = []


def start_backend(i):
    b = backends[i]
    argv = [os.path.join(BIN, "pylon-backend"), "--listen", f"127.0.0.1:{b['port']}", "--log-level", "warn",
            "--operator-token-file", OPERATOR_TOKEN_FILE, "--enrol-secret-file", DEVICE_KEY,
            "--db", pg["url"] if use_pg else os.path.join(run, "backend.db"),
            "--max-connections", "4096",
            "--mqtt", ",".join(broker_list()), "--mqtt-username", "pylon-backend"]
    if use_nats_mqtt:
        auth = os.path.join(run, "mqttc", "auth")
        argv += ["--mqtt-password-file", os.path.join(auth, "backend.jwt"), "--mqtt-nats-auth", os.path.join(auth, "backend-auth.json")]
    elif use_pylon_auth:
        # The backend signs each device's broker password and its own login with this key.
        argv += ["--mqtt-auth-key-file", AUTH_KEY]
    else:
        argv += ["--mqtt-password-file", BROKER_PASSWORD, "--mqtt-dynsec"]
    if use_nats_stream:
        argv += ["--nats", nats_urls(), "--nats-replicas", "3"]
    if "--console-dir" in backend_help:
        argv += ["--console-dir", os.path.join(REPO, "clients", "console")]  # the operator console (docs/CONSOLE.md)
    pr = spawn(b["name"], argv, stdout=subprocess.PIPE)
    line = pr.stdout.readline()
    if b"listening" not in line:
        raise SystemExit(f"{b['name']} did not start: {line!r} (see {run}/{b['name']}.log)")
    threading.Thread(target=lambda: pr.stdout.read(), daemon=True).start()


def start_haproxy():
    servers = "\n".join(f"    server {b['name']} 127.0.0.1:{b['port']} check inter 1s fall 2 rise 1 maxconn 512"
                        for b in backends)
    conf = f"""# Generated by tools/fleet/fleet.py for {len(backends)} pylon-backend instances (docs/FLEET.md, "Load balancer").
global
    # Two descriptors per proxied connection, within this machine's RLIMIT_NOFILE ({hard}).
    maxconn {max(1000, min(50000, (hard - 200) // 2))}
    log stderr format short local0 warning

defaults
    mode http
    log global
    option httplog
    option http-keep-alive
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    timeout http-keep-alive 60s
    # A request that could not reach an instance (refused, reset before sending) goes to another:
    # nothing was sent, so even a POST is safe to send again.
    retries 3
    retry-on conn-failure
    option redispatch 1

frontend pylon
    bind 127.0.0.1:{LB_PORT}
    default_backend pylon_backends

backend pylon_backends
    balance leastconn
    option httpchk GET /healthz
    http-check expect status 200
    http-reuse safe
{servers}
"""
    path = os.path.join(run, "haproxy.cfg")
    open(path, "w").write(conf)
    r = subprocess.run(["haproxy", "-c", "-f", path], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("haproxy rejected its configuration: " + r.stdout + r.stderr)
    pr = spawn("haproxy", ["haproxy", "-db", "-f", path])
    wait_port(LB_PORT, "haproxy", proc=pr)
    # Every instance healthy before the load starts.
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(LB + "/healthz", timeout=2) as resp:
                if resp.status == 200:
                    break
        except (OSError, urllib.error.URLError, http.client.HTTPException):
            # Not haproxy (another process took its port) or not ready yet.
            if pr.poll() is not None:
                raise SystemExit(f"haproxy exited with {pr.returncode} (logs in {run})")
            time.sleep(0.1)
    log(f"haproxy: {LB} -> " + ", ".join(f"{b['name']} 127.0.0.1:{b['port']}" for b in backends))
    if "--console-dir" in backend_help:
        log(f"console: {LB}/ (the operator token is in {OPERATOR_TOKEN_FILE})")


def http_json(path, body=None, timeout=10):
    req = urllib.request.Request(LB + path, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + OPERATOR_TOKEN, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


# ---- Real pylond instances end to end ----------------------------------------------------------
class Pylond:
    """One pylond with the uploader, MA and push plugins pointed at haproxy and the broker(s).
    A driver records MA events (ids it chooses) and an app acknowledges pushes sent to this device."""

    def __init__(self, i):
        self.i, self.name = i, f"pylond{i + 1}"
        self.dir = os.path.join(run, self.name)
        os.makedirs(os.path.join(self.dir, "state"), exist_ok=True)
        self.sock = os.path.join(self.dir, "pylon.sock")
        self.app_key, self.app_id = f"e2e{i + 1}", f"fleet.e2e{i + 1}"
        self.acked, self.sent, self.got, self.stored = set(), {}, {}, set()
        self.token = None
        b = broker_list()[i % len(broker_list())].split(":")
        streams = {"maxCount": 100, "intervalMs": 1000}
        conf = {
            "socket": self.sock, "stateDir": os.path.join(self.dir, "state"), "pluginDir": BIN, "logLevel": "warn",
            "plugins": [
                {"name": "uploader", "exec": "pylon-uploader", "restart": "permanent", "config": {
                    "endpoint": LB + "/v1/batches/{stream}", "credentialFile": DEVICE_KEY,
                    "retryInitialMs": 200, "retryMaxMs": 2000, "streams": {"ma.*": streams}}},
                {"name": "ma", "exec": "pylon-ma", "restart": "permanent", "config": {
                    "backend": LB, "credentialFile": DEVICE_KEY, "retryInitialMs": 200, "retryMaxMs": 2000}},
                {"name": "push", "exec": "pylon-push", "restart": "permanent", "config": {
                    "backend": LB, "credentialFile": DEVICE_KEY,
                    "broker": {"host": b[0], "port": int(b[1]), "brokers": broker_list(), "keepaliveS": 10,
                               "backoffInitialMs": 100, "backoffMaxMs": 2000},
                    "registerRetryInitialMs": 200, "registerRetryMaxMs": 2000, "ackTimeoutMs": 5000}},
            ],
        }
        self.conf = os.path.join(self.dir, "pylon.json")
        json.dump(conf, open(self.conf, "w"))

    def start(self):
        spawn(self.name, [os.path.join(BIN, "pylond"), "--config", self.conf, "--socket", self.sock,
                          "--state-dir", os.path.join(self.dir, "state")])
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                if self.rpc("bus.ping", {}, timeout=2).get("result"):
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise SystemExit(f"{self.name} did not come up")

    def rpc(self, method, params, timeout=30):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(timeout)
        try:
            s.connect(self.sock)
            s.sendall(json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode() + b"\n")
            buf = b""
            while b"\n" not in buf:
                c = s.recv(65536)
                if not c:
                    raise OSError("closed")
                buf += c
            return json.loads(buf.split(b"\n", 1)[0])
        finally:
            s.close()

    def events(self, stop, rate=5.0):
        """ma.start, then ma.eventRecord at `rate`/s on one connection; a code 0 reply is acknowledged."""
        seq = 0
        while not stop.is_set():
            try:
                s = socket.socket(socket.AF_UNIX)
                s.settimeout(30)
                s.connect(self.sock)
                f = s.makefile("rb")
                s.sendall(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "ma.start",
                                      "params": {"appKey": self.app_key}}).encode() + b"\n")
                if json.loads(f.readline()).get("result", {}).get("code") != 0:
                    raise OSError("ma.start failed")
                while not stop.is_set():
                    eid = f"{self.name}-{seq}"
                    seq += 1
                    s.sendall(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ma.eventRecord", "params": {
                        "appKey": self.app_key, "eventName": "e2e", "property": {"fleet_id": eid}}}).encode() + b"\n")
                    r = json.loads(f.readline())
                    if r.get("result", {}).get("code") == 0:
                        with lock:
                            self.acked.add(eid)
                    time.sleep(1 / rate)
                s.close()
            except (OSError, ValueError):
                time.sleep(0.2)

    def app(self, stop):
        """The app: provides a callback, attaches, acknowledges every message (success reply)."""
        cb = f"e2eapp{self.i + 1}.onPush"
        while not stop.is_set():
            try:
                s = socket.socket(socket.AF_UNIX)
                s.settimeout(1)
                s.connect(self.sock)
                s.sendall(json.dumps({"jsonrpc": "2.0", "id": "p", "method": "bus.provide", "params": {"method": cb}}).encode() + b"\n")
                buf, last = b"", 0
                while not stop.is_set():
                    if time.time() - last > 1:
                        s.sendall(json.dumps({"jsonrpc": "2.0", "id": "a", "method": "push.attach",
                                              "params": {"appId": self.app_id, "callback": cb}}).encode() + b"\n")
                        last = time.time()
                    try:
                        c = s.recv(262144)
                    except socket.timeout:
                        continue
                    if not c:
                        break
                    buf += c
                    *lines, buf = buf.split(b"\n")
                    out = b""
                    for ln in lines:
                        if not ln:
                            continue
                        m = json.loads(ln)
                        if m.get("method") != cb or "id" not in m:
                            continue
                        msg = (m.get("params") or {}).get("message") or {}
                        seq = (msg.get("extras") or {}).get("seq")
                        with lock:
                            self.got.setdefault(seq, set()).add(msg.get("id"))
                            self.deliveries = getattr(self, "deliveries", 0) + 1
                        out += json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": {}}).encode() + b"\n"
                    if out:
                        s.sendall(out)
                s.close()
            except (OSError, ValueError):
                time.sleep(0.2)

    def push_sender(self, stop, every=2.0):
        deadline = time.time() + 60
        while self.token is None and time.time() < deadline and not stop.is_set():
            try:
                r = self.rpc("push.register", {"timeoutMs": 5000}, timeout=10).get("result") or {}
                if r.get("code") == 0 and r.get("token"):
                    self.token = r["token"]
            except OSError:
                time.sleep(0.5)
        seq = 0
        while not stop.is_set() and self.token:
            seq += 1
            body = {"targetType": "device", "target": self.token, "appId": self.app_id, "title": "e2e",
                    "msgKey": f"{self.name}-{seq}", "extendedParams": {"seq": str(seq)}}
            for _ in range(5):
                try:
                    r = http_json("/v1/admin/push/send", body)
                    if r.get("msgId"):
                        with lock:
                            self.sent[str(seq)] = r["msgId"]
                        break
                except (OSError, urllib.error.URLError, ValueError):
                    time.sleep(1)
            stop.wait(every)

    def flush_and_check(self, timeout=60):
        deadline = time.time() + timeout
        while True:
            try:
                self.rpc(f"uploader.flush", {"stream": f"ma.{self.app_key}", "wait": True}, timeout=30)
            except OSError:
                pass
            ids = set()
            try:
                for r in stream_records(f"ma.{self.app_key}"):
                    ids.add(((r.get("data") or {}).get("properties") or {}).get("fleet_id"))
            except (OSError, urllib.error.URLError, ValueError, KeyError, subprocess.SubprocessError):
                pass
            self.stored = ids
            with lock:
                missing_push = [s for s in self.sent if s not in self.got]
                missing = self.acked - ids
            if (not missing and not missing_push) or time.time() > deadline:
                return
            time.sleep(1)

    def report(self):
        with lock:
            lost = len(self.acked - self.stored)
            push_lost = len([s for s in self.sent if s not in self.got])
            push_twice = len([s for s in self.sent if len(self.got.get(s, ())) > 1])
        return {"name": self.name, "eventsAcked": len(self.acked), "eventsStored": len(self.stored & self.acked),
                "eventsLost": lost, "pushSent": len(self.sent), "pushLost": push_lost,
                "pushDeliveries": getattr(self, "deliveries", 0), "pushTwiceUnderTwoIds": push_twice}


# ---- Faults --------------------------------------------------------------------------------------
faults = []


def fault(at, name, action):
    def go():
        if stopping.wait(max(0.0, fleet_start + at - time.time())):
            return
        t = time.time()
        try:
            action()
            faults.append({"fault": name, "atS": round(t - fleet_start, 1)})
            log(f"fault: {name} at {t - fleet_start:.1f} s")
        except Exception as e:  # a fault that cannot be injected is reported, not fatal
            faults.append({"fault": name, "atS": round(t - fleet_start, 1), "error": str(e)})
            log(f"fault {name} failed: {e}")
    threading.Thread(target=go, daemon=True).start()


def fleet_status():
    """Every pylon-fleet process's status file, summed ({} until each has written one)."""
    total = {"devices": 0, "connected": 0}
    for _, _, path in fleet_procs:
        try:
            st = json.load(open(path))
        except (OSError, ValueError):
            return {}
        total["devices"] += st.get("devices", 0)
        total["connected"] += st.get("connected", 0)
    return total if fleet_procs else {}


def schedule_faults():
    """Faults start once every device is connected (or half the load has passed), then come at
    20 %, 45 % and 70 % of the load that remains, so each has time to heal before the next."""
    half = fleet_start + args.duration / 2
    while time.time() < half and not stopping.is_set():
        st = fleet_status()
        if st.get("devices") and st.get("connected") == st.get("devices"):
            break
        time.sleep(0.5)
    t0 = time.time() - fleet_start
    rest = max(0.0, args.duration - t0)
    log(f"faults: all devices connected at {t0:.1f} s" if time.time() < half else "faults: not every device connected; injecting anyway")
    fault(t0 + rest * 0.20, "kill -9 broker node", kill_broker_node)
    if need_nats:
        # The stream's nodes are not the broker's: one of them is killed as well.
        fault(t0 + rest * 0.30, "kill -9 NATS (stream) node", kill_nats_node)
    fault(t0 + rest * 0.45, "kill -9 backend instance", kill_backend)
    fault(t0 + rest * 0.70, "PostgreSQL restart", restart_postgres)


def kill_nats_node():
    n = nats[0]
    kill(n["name"])
    threading.Timer(5, lambda: stopping.is_set() or start_nats_node(n)).start()


def kill_broker_node():
    if use_nats_mqtt:
        m = mq[0]
        kill(m["name"])
        threading.Timer(5, lambda: stopping.is_set() or start_broker_node(m)).start()
    else:
        kill("mosquitto")
        threading.Timer(5, lambda: stopping.is_set() or start_mosquitto()).start()


def kill_backend():
    b = backends[0]
    kill(b["name"])
    threading.Timer(5, lambda: stopping.is_set() or start_backend(0)).start()


def restart_postgres():
    if not use_pg:
        raise RuntimeError("no PostgreSQL in this fleet (SQLite): nothing to restart")
    pg_ctl("restart", "-m", "immediate", "-w", "-l", os.path.join(run, "pg", "postgres.log"))
    write_pids()


# ---- Stop everything -----------------------------------------------------------------------------
def stop_all(*_):
    stopping.set()
    with lock:
        items = list(procs.items())
    for name, pr in items:
        if name.startswith("pylond") and pr.poll() is None:
            pr.terminate()
    for name, pr in items:
        if pr.poll() is None:
            if name.startswith("pylond"):
                try:
                    pr.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            if pr.poll() is None:
                pr.kill()
            pr.wait()
    if use_pg and "pid" in pg:
        pg_ctl("stop", "-m", "immediate")


def on_signal(sig, _frame):
    # pylon-fleet got the same Ctrl-C (it is in our process group) and is draining; SIGTERM and
    # SIGHUP are passed on to it.
    for _, fl, _ in fleet_procs:
        if fl.poll() is None and sig != signal.SIGINT:
            fl.send_signal(signal.SIGINT)


fleet_start = time.time()


def main():
    global fleet_start
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log(f"run directory {run}; database {'PostgreSQL' if use_pg else 'SQLite'}, stream "
        f"{'NATS JetStream' if use_nats_stream else 'none (the database)'}, broker "
        f"{'nats-server MQTT x3 (JWT auth)' if use_nats_mqtt else 'mosquitto + pylon_auth' if use_pylon_auth else 'mosquitto + dynamic security'}"
        f", {n_backends} backend(s)")
    if use_pg:
        start_postgres()
    if need_nats:
        start_nats()
    if use_nats_mqtt:
        start_broker_cluster()
    else:
        start_mosquitto()
    for i in range(n_backends):
        backends.append({"name": f"backend{i + 1}", "port": free_port()})
        start_backend(i)
    start_haproxy()
    write_pids()
    pylonds = [Pylond(i) for i in range(args.pylonds)]
    for d in pylonds:
        d.start()
    write_pids()
    stop_e2e = threading.Event()
    threads = []
    for d in pylonds:
        for target in (d.events, d.app, d.push_sender):
            t = threading.Thread(target=target, args=(stop_e2e,), daemon=True)
            t.start()
            threads.append(t)
    shares = shards(args.devices, args.devices_per_process, int(fleet_opt("--devices-per-user", 2)))
    n = len(shares)
    run_id = fleet_opt("--run-id", "r" + os.urandom(4).hex())
    status = [os.path.join(run, f"fleet-status-{i + 1}.json") for i in range(n)]
    argvs = []
    for i, (first, count) in enumerate(shares):
        argv = [os.path.join(BIN, "pylon-fleet"), "--backend", LB, "--broker", ",".join(broker_list()),
                "--devices", str(count), "--rate", str(args.rate), "--duration", str(args.duration),
                "--operator-token-file", OPERATOR_TOKEN_FILE, "--enrol-secret-file", DEVICE_KEY,
                "--status-file", status[i], "--run-id", run_id, "--json"]
        if i == 0:
            argv += ["--watch-file", pids_file]
        if use_nats_stream:
            # The batches are in JetStream, not the database: read them back with a durable pull
            # consumer of this run's subject (tools/pylon-stream-consumer), one per process.
            argv += ["--verify-exec", f"/usr/bin/python3 {REPO}/tools/pylon-stream-consumer --server {nats_urls()} "
                     f"--durable fleet-verify-{i + 1} --filter {stream_subject('ma.fleet')} --batch 256 --once"]
        argv += args.fleet_args
        if n > 1:
            # One run in n processes: its own devices each, the same totals as one process
            # (ramp and device/user sends shared out, broadcasts from the first process only,
            # each process expecting the others' broadcasts on its devices).
            argv += ["--first-device", str(first), "--name", f"pylon-fleet{i + 1}",
                     "--ramp", str(float(fleet_opt("--ramp", 200)) / n)]
            pe = float(fleet_opt("--push-every", 5))
            if pe > 0:
                argv += ["--push-every", str(min(3600.0, pe * n))]
            if i > 0:
                argv += ["--broadcast-every", "0"]
            for j in range(n):
                if j != i:
                    argv += ["--peer-status-file", status[j]]
        argvs.append(argv)
    log(f"starting {n} pylon-fleet process(es), run {run_id}: " + " ".join(argvs[0][1:]))
    fleet_start = time.time()
    outs = [b""] * n
    readers = []
    for i, argv in enumerate(argvs):
        fl = subprocess.Popen(argv, stdout=subprocess.PIPE)
        name = "pylon-fleet" if n == 1 else f"pylon-fleet{i + 1}"
        fleet_procs.append((name, fl, status[i]))
        procs[f"__fleet{i + 1}"] = fl

        def read(i=i, fl=fl):
            outs[i] = fl.stdout.read()
        t = threading.Thread(target=read, daemon=True)
        t.start()
        readers.append(t)
    write_pids()
    if args.faults:
        threading.Thread(target=schedule_faults, daemon=True).start()
    codes = []
    for i, (_, fl, _) in enumerate(fleet_procs):
        readers[i].join()
        codes.append(fl.wait())
        procs.pop(f"__fleet{i + 1}", None)
    stop_e2e.set()
    for t in threads:
        t.join(timeout=35)
    reports = []
    for d in pylonds:
        d.flush_and_check()
        reports.append(d.report())
    parts = []
    for i, out in enumerate(outs):
        try:
            parts.append(json.loads(out))
        except ValueError:
            log(f"{fleet_procs[i][0]} exited with {codes[i]} and no summary")
            return 2
    summary = merge_summaries(parts)
    code = summary["exitCode"]
    summary["faults"] = faults
    summary["pylonds"] = reports
    summary["servers"] = {"database": "postgresql" if use_pg else "sqlite", "stream": "nats" if use_nats_stream else "none",
                          "broker": "nats-mqtt" if use_nats_mqtt else "mosquitto+pylon_auth" if use_pylon_auth else "mosquitto+dynsec",
                          "backends": n_backends, "fleetProcesses": len(parts),
                          "loadBalancer": LB}
    print(json.dumps(summary, indent=2))
    if args.summary_json:
        json.dump(summary, open(args.summary_json, "w"), indent=2)
    print(human(summary), file=sys.stderr)
    e2e_bad = any(r["eventsLost"] or r["pushLost"] or r["pushTwiceUnderTwoIds"] for r in reports)
    return code if code != 0 else (1 if e2e_bad else 0)


def fleet_opt(name, default):
    """The last value of a pylon-fleet option among the arguments after --, else `default`."""
    return _fleet_opt(args.fleet_args, name, default)


def human(s):
    e, pu = s["events"], s["push"]
    ready = s.get("allConnectedAfterS")
    lines = [f"fleet: {s['devices']} devices x {s['ratePerDevice']} ev/s, {s['loadS']:.0f} s load, servers {s['servers']}",
             f"  devices: {s['connected']} connected at the end, "
             + (f"all connected {ready:.1f} s after the start" if ready is not None else "never all connected at once"),
             f"  events: acked {e['acked']} ({e['ackedPerS']:.0f}/s, peak {e['peakAckedPerS']:.0f}/s), read back "
             f"{e['storedRead']}, lost {e['lost']}, duplicates {e['duplicates']}, unacked {e['unacked']}",
             f"  push: {pu['delivered']}/{pu['expected']} delivered, lost {pu['lost']}, duplicates to apps {pu['appDuplicates']}"]
    for k, v in pu["latency"].items():
        lines.append(f"    {k}: {v['sends']} sends, {v['deliveries']} deliveries, p50 {v['p50Ms']} ms, p99 {v['p99Ms']} ms")
    for f in s["faults"]:
        lines.append(f"  fault at {f['atS']} s: {f['fault']}" + (f" (not injected: {f['error']})" if "error" in f else ""))
    for o in s["outages"]:
        lines.append(f"  devices down to {o['lowest']} at {o['atS']} s, all reconnected after {o['reconnectedAfterS']} s")
    for r in s["pylonds"]:
        lines.append(f"  {r['name']}: events acked {r['eventsAcked']}, lost {r['eventsLost']}; push sent {r['pushSent']}, "
                     f"lost {r['pushLost']}")
    for fp in s.get("fleetProcesses", []):
        lines.append(f"  {fp['name']}: devices {fp['firstDevice']}..{fp['firstDevice'] + fp['devices'] - 1}, events acked "
                     f"{fp['eventsAcked']}, lost {fp['eventsLost']}, push {fp['pushDelivered']}/{fp['pushExpected']}, "
                     f"exit {fp['exitCode']}")
    for pr in s["processes"]:
        lines.append(f"  {pr['name']}: peak cpu {pr['peakCpu'] * 100:.0f}%, peak rss {pr['peakRssKiB'] // 1024} MB")
    return "\n".join(lines)


if __name__ == "__main__":
    rc = 2
    try:
        rc = main()
    finally:
        stop_all()
        if not args.keep and not args.dir:
            shutil.rmtree(run, ignore_errors=True)
        elif args.keep:
            log(f"kept {run}")
    sys.exit(rc)
