#!/usr/bin/env bash
# `make test-deb`: Tests/install/deb-test.sh DEB_DIR VERSION ARCH. Checks the three packages
# tools/mkdeb.sh built (pylon, pylon-backend, python3-pylon): lintian on each, then installs them
# in throw-away copies of this machine, each an overlay of / (changes land in a temporary
# directory, never in the real /usr, /etc or users) in its own mount, PID and network namespace
# (loopback only, so the fixed ports 1883 and 8780 are free and nothing it starts outlives it):
#
# - device: mosquitto purged first; apt-get --simulate shows that installing pylon and
#   python3-pylon pulls in no broker, libpq or libnats; libpq and libnats are then removed too,
#   and the installed pylond runs as the pylon user, reached by a pylon-group member (from
#   pylonctl and the system Python) and refused to others; dpkg -r / -P leave nothing behind.
# - server: pylon-backend installed beside Debian's mosquitto (whose own files stay untouched),
#   its files, users and secrets checked; then the device package on the same machine and the
#   packaged push path end to end: mosquitto with the example conf.d snippet and the pylon_auth
#   plugin, pylon-backend@main as its unit would start it, a registered device receiving an
#   operator's send, and kicked when revoked; more instances from their own env files: two on
#   one PostgreSQL (a batch posted to one read through the other), a third with its ingest on
#   NATS JetStream (started with pylon-nats-cluster, read with pylon-stream-consumer); dpkg -P
#   leaves nothing behind.
#
# systemd does not run inside (nor on this machine): the units are checked with
# systemd-analyze verify, and their ExecStart run with their EnvironmentFile, LoadCredential,
# User and StateDirectory done by this script.
set -euo pipefail
fail() { echo "deb-test: FAIL: $*" >&2; exit 1; }

# ---- Inside a throw-away machine (this script, run again in the chroot) ------------------------
snapshot() {
    find /etc /usr /lib /var/lib /opt -xdev \( -path /var/lib/dpkg -o -path /var/lib/apt -o -path /var/cache \
        -o -path /var/lib/systemd/deb-systemd-user-helper-enabled \) -prune -o -print 2>/dev/null \
        | grep -v -e '^/etc/[a-z]*-$' | sort  # useradd's backups (passwd-, subuid-) are not the package's
}

# A freshly installed machine starts no service from a maintainer script (Debian's chroot rule).
no_services() { printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; }

# Polls until "$@" succeeds, at most N tenths of a second.
wait_for() {
    local n=$1; shift
    for _ in $(seq "$n"); do "$@" 2>/dev/null && return 0; sleep 0.1; done
    return 1
}

# push.status of the pylond on /tmp/run/pylon.sock: all of it; with KEY, that field (searched
# at any depth); with KEY and VALUE, succeeds when the field is VALUE (a number: at least VALUE).
push_status() {
    pylonctl --socket /tmp/run/pylon.sock call push.status 2>/dev/null | python3 -c '
import json, sys
doc, args = json.load(sys.stdin), sys.argv[1:]
def find(o, k):
    if isinstance(o, dict):
        if k in o: return o[k]
        o = list(o.values())
    for v in o if isinstance(o, list) else []:
        r = find(v, k)
        if r is not None: return r
if not args: print(json.dumps(doc, indent=1)); sys.exit(0)
v = find(doc, args[0])
if len(args) == 1: print("" if v is None else v); sys.exit(0)
ok = v >= int(args[1]) if isinstance(v, int) and not isinstance(v, bool) else v == args[1]
sys.exit(0 if ok else 1)' "$@"
}

inside_device() {
    cd /deb-test
    no_services
    # A machine without mosquitto (mosquitto-dev depends on it).
    dpkg --purge mosquitto-dev mosquitto >/dev/null 2>&1 || dpkg --purge mosquitto >/dev/null
    ! dpkg -s mosquitto >/dev/null 2>&1 || fail "mosquitto is still installed"
    sim=$(apt-get --simulate install ./pylon_*.deb ./python3-pylon_*.deb 2>&1) || { echo "$sim"; fail "apt-get --simulate install"; }
    if grep -E '^Inst (mosquitto|libpq|libnats)' <<<"$sim"; then fail "installing pylon pulls in a broker or a server library"; fi
    echo "deb-test: device: apt-get would install: $(grep '^Inst ' <<<"$sim" | cut -d' ' -f2 | tr '\n' ' ')"
    # Nor the server side's client libraries: the device's programs must load without them.
    for lib in libpq.so.5 libnats.so; do
        for p in $(dpkg -S "$lib" 2>/dev/null | cut -d: -f1 | sort -u); do dpkg -r --force-depends "$p" >/dev/null 2>&1; done
    done
    ! ls /usr/lib/*/libpq.so.* /usr/lib/*/libnats.so.* >/dev/null 2>&1 || fail "libpq or libnats still present"

    snapshot > /tmp/before
    cp /etc/passwd /tmp/passwd; cp /etc/group /tmp/group
    dpkg -i ./pylon_*.deb ./python3-pylon_*.deb >/dev/null || fail "dpkg -i pylon python3-pylon"
    ! dpkg -s mosquitto >/dev/null 2>&1 || fail "mosquitto was installed"
    ! ldd /usr/lib/pylon/pylon /usr/bin/pylonctl | grep 'not found' || fail "a library of the device's programs is missing"
    getent passwd pylon >/dev/null && getent group pylon >/dev/null || fail "no pylon user or group"
    ! getent passwd pylon-backend >/dev/null || fail "the device package made a pylon-backend user"
    [ -x /usr/bin/pylond ] && [ -x /usr/lib/pylon/plugins/pylon-uploader ] && [ -x /usr/bin/pylonctl ] || fail "binaries"
    [ ! -e /usr/lib/pylon/plugins/pylon-echo ] || fail "test plugin shipped"
    for f in /usr/bin/pylon-backend /usr/share/pylon/console /etc/mosquitto/conf.d/pylon-push.conf /etc/pylon/broker.password; do
        [ ! -e "$f" ] || fail "$f is on a device"
    done
    [ "$(stat -c '%a %U:%G' /etc/pylon/device.key)" = "600 pylon:pylon" ] || fail "device.key is not 600 pylon:pylon"
    [ "$(stat -c '%a %U:%G' /etc/pylon/pylon.json)" = "640 root:pylon" ] || fail "pylon.json is $(stat -c '%a %U:%G' /etc/pylon/pylon.json)"
    # Every shipped file under /etc/pylon is a conffile; device.key is made once by the postinst.
    for f in $(cd / && find etc/pylon -type f ! -name device.key); do
        dpkg-query -W -f='${Conffiles}' pylon | grep -q " /$f " || fail "/$f is not a conffile"
    done
    [ -L /etc/systemd/system/multi-user.target.wants/pylond.service ] || fail "pylond.service not enabled"
    pylond --check-config /etc/pylon/pylon.json >/dev/null || fail "pylond --check-config /etc/pylon/pylon.json"
    for d in copyright changelog.gz SECURITY.md CONFIG.md INSTALL.md PUSH.md; do
        [ -e /usr/share/doc/pylon/$d ] || fail "/usr/share/doc/pylon/$d missing"; done
    [ -e /usr/share/doc/python3-pylon/copyright ] || fail "python3-pylon has no copyright file"
    for m in man1/pylonctl.1 man5/pylon.json.5 man8/pylond.8; do [ -e /usr/share/man/$m.gz ] || fail "man page $m"; done
    [ ! -e /usr/share/man/man8/pylon-backend.8.gz ] || fail "pylon-backend(8) on a device"
    if command -v systemd-analyze >/dev/null; then
        systemd-analyze verify /lib/systemd/system/pylond.service || fail "systemd-analyze verify pylond.service"
    fi

    # The installed pylond as the pylon user with the installed config, its socket and state in
    # /tmp; a pylon-group member connects (pylonctl, the system Python), nobody else does.
    install -d -o pylon -g pylon -m 750 /tmp/run /tmp/state
    runuser -u pylon -- /usr/bin/pylond --config /etc/pylon/pylon.json --socket /tmp/run/pylon.sock \
        --state-dir /tmp/state 2>/tmp/pylond.log & pid=$!
    useradd -M -G pylon pylon-test-member
    wait_for 100 sh -c 'runuser -u pylon-test-member -- pylonctl --socket /tmp/run/pylon.sock ping | grep -q pong' \
        || { cat /tmp/pylond.log; fail "a pylon-group member cannot reach pylond"; }
    runuser -u pylon-test-member -- /usr/bin/python3 -c \
        "import pylon, sys; sys.exit(0 if pylon.Client('/tmp/run/pylon.sock').call('bus.ping') else 1)" \
        || fail "the system Python cannot use python3-pylon"
    ! runuser -u nobody -- pylonctl --socket /tmp/run/pylon.sock ping >/dev/null 2>&1 || fail "a non-member reached pylond"
    userdel pylon-test-member
    kill "$pid"; wait "$pid" || true
    rm -rf /tmp/run /tmp/state

    dpkg -r python3-pylon pylon >/dev/null || fail "dpkg -r"
    [ ! -e /usr/bin/pylond ] || fail "binaries left after dpkg -r"
    [ -e /etc/pylon/pylon.json ] || fail "conffile removed by dpkg -r (only purge removes it)"
    dpkg -P pylon >/dev/null || fail "dpkg -P"
    ! getent passwd pylon >/dev/null || fail "pylon user left after purge"
    ! getent group pylon >/dev/null || fail "pylon group left after purge"
    snapshot > /tmp/after
    diff /tmp/before /tmp/after >&2 || fail "device: files left behind or removed"
    diff <(cut -d: -f1 /tmp/passwd) <(cut -d: -f1 /etc/passwd) || fail "users differ"
    diff <(cut -d: -f1 /tmp/group) <(cut -d: -f1 /etc/group) || fail "groups differ"
    echo "deb-test: device ok (no mosquitto, libpq or libnats; installed, run, reached by the group only, removed, purged, nothing left)"
}

# Runs pylon-backend@NAME in the foreground as systemd would start it: its EnvironmentFile,
# LoadCredential (copies only the service user reads), StateDirectory and User, then ExecStart
# with the variables expanded (${X} one word, $X split). stdout and stderr go to
# /tmp/backend-NAME.out and .err.
start_instance() {
    local name=$1 unit=/lib/systemd/system/pylon-backend@.service c state line val
    # systemd's environment file: KEY=VALUE, the value the rest of the line (quotes optional).
    while IFS= read -r line; do
        case $line in '' | '#'* | ';'*) continue ;; esac
        val=${line#*=}
        case $val in \"*\" | \'*\') val=${val:1:-1} ;; esac
        export "${line%%=*}=$val"
    done < "$(sed -n 's/^EnvironmentFile=//p' "$unit" | sed "s/%i/$name/")"
    CREDENTIALS_DIRECTORY=/tmp/credentials-$name
    install -d -m 0700 -o pylon-backend -g pylon-backend "$CREDENTIALS_DIRECTORY"
    for c in $(sed -n 's/^LoadCredential=//p' "$unit"); do
        install -m 0400 -o pylon-backend -g pylon-backend "${c#*:}" "$CREDENTIALS_DIRECTORY/${c%%:*}"
    done
    state=/var/lib/$(sed -n 's/^StateDirectory=//p' "$unit" | sed "s/%i/$name/")
    install -d -m 0700 -o pylon-backend -g pylon-backend "$state"
    eval "cmd=($(sed -n 's/^ExecStart=//p' "$unit"))"
    exec runuser -u "$(sed -n 's/^User=//p' "$unit")" -- "${cmd[@]}" >"/tmp/backend-$name.out" 2>"/tmp/backend-$name.err"
}

inside_server() {
    cd /deb-test
    no_services
    dpkg -s mosquitto >/dev/null 2>&1 || fail "the server machine needs Debian's mosquitto (make deps)"
    mosq_verify=$(dpkg -V mosquitto || true)
    mosq_confd=$(ls /etc/mosquitto/conf.d)
    mosq_db=$([ -e /var/lib/mosquitto/mosquitto.db ] && echo 1 || true)
    snapshot > /tmp/before
    cp /etc/passwd /tmp/passwd; cp /etc/group /tmp/group

    dpkg -i ./pylon-backend_*.deb >/dev/null || fail "dpkg -i pylon-backend"
    getent passwd pylon-backend >/dev/null && getent group pylon-backend >/dev/null || fail "no pylon-backend user or group"
    ! getent passwd pylon >/dev/null || fail "the server package made a pylon user"
    # mosquitto's own files are left alone: none of the package's paths is under /etc/mosquitto,
    # mosquitto's files verify as before and its conf.d is unchanged.
    ! dpkg -L pylon-backend | grep '^/etc/mosquitto' || fail "pylon-backend ships a file in /etc/mosquitto"
    [ "$(dpkg -V mosquitto || true)" = "$mosq_verify" ] || fail "mosquitto's files changed"
    [ "$(ls /etc/mosquitto/conf.d)" = "$mosq_confd" ] || fail "/etc/mosquitto/conf.d changed"
    for f in /usr/bin/pylon-backend /usr/share/pylon/console/index.html /usr/share/pylon/console/js/app.js \
             /usr/lib/pylon-backend/pylon_auth.so /lib/systemd/system/pylon-backend@.service \
             /usr/share/doc/pylon-backend/examples/mosquitto-pylon-auth.conf /usr/share/doc/pylon-backend/FLEET.md \
             /usr/share/doc/pylon-backend/copyright /usr/share/doc/pylon-backend/backend-openapi.yaml \
             /usr/share/man/man8/pylon-backend.8.gz; do
        [ -e "$f" ] || fail "$f missing"
    done
    for t in pylon-nats-auth pylon-nats-cluster pylon-stream-consumer; do
        out=$("$t" --help 2>&1 || true)
        grep -q "^usage: $t" <<<"$out" || fail "$t --help: $out"
        [ -e /usr/share/man/man1/$t.1.gz ] || fail "man page $t(1)"
    done
    [ ! -e /usr/bin/pylond ] && [ ! -e /etc/pylon ] || fail "the server package ships the device's files"
    grep -qx 'LimitNOFILE=65536' /lib/systemd/system/mosquitto.service.d/pylon-backend-nofile.conf \
        || fail "no drop-in raising mosquitto's LimitNOFILE"
    for f in main.env revoked; do
        dpkg-query -W -f='${Conffiles}' pylon-backend | grep -q " /etc/pylon-backend/$f " || fail "/etc/pylon-backend/$f is not a conffile"
    done
    for f in enrol.secret operator.token broker.key; do
        [ "$(stat -c '%a %U:%G' /etc/pylon-backend/$f)" = "600 root:root" ] || fail "/etc/pylon-backend/$f is not 600 root:root"
    done
    [ "$(stat -c '%a %U:%G' /etc/pylon-backend/broker-keys)" = "640 root:mosquitto" ] || fail "broker-keys is not 640 root:mosquitto"
    grep -Eqx 'k1:[0-9a-f]{64}' /etc/pylon-backend/broker.key || fail "broker.key is not <kid>:<hex key>"
    if command -v systemd-analyze >/dev/null; then
        # The template as its packaged instance.
        systemd-analyze verify /lib/systemd/system/pylon-backend@main.service || fail "systemd-analyze verify pylon-backend@main"
    fi

    # The device package on the same machine takes the backend's enrolment secret.
    dpkg -i ./pylon_*.deb >/dev/null || fail "dpkg -i pylon beside pylon-backend"
    cmp -s /etc/pylon/device.key /etc/pylon-backend/enrol.secret || fail "device.key is not the local backend's enrolment secret"

    # The broker as the operator sets it up (the example snippet into conf.d), started as Debian's
    # unit starts it (as root; it drops to the mosquitto user).
    cp /usr/share/doc/pylon-backend/examples/mosquitto-pylon-auth.conf /etc/mosquitto/conf.d/pylon-auth.conf
    install -d -o mosquitto -g mosquitto /run/mosquitto /var/log/mosquitto
    rm -f /var/log/mosquitto/mosquitto.log
    mosquitto -c /etc/mosquitto/mosquitto.conf 2>/tmp/mosquitto.err & mpid=$!
    wait_for 100 bash -c 'exec 3<>/dev/tcp/127.0.0.1/1883' \
        || { cat /tmp/mosquitto.err /var/log/mosquitto/mosquitto.log; fail "mosquitto with the packaged plugin does not start"; }

    start_instance main & bpid=$!
    wait_for 100 grep -q "listening on" /tmp/backend-main.out || { cat /tmp/backend-main.err; fail "pylon-backend@main does not start"; }

    # pylond with the installed config: its push plugin registers, gets a signed broker password,
    # connects, and receives an operator's send through the broker.
    install -d -o pylon -g pylon -m 750 /tmp/run /tmp/state
    runuser -u pylon -- /usr/bin/pylond --config /etc/pylon/pylon.json --socket /tmp/run/pylon.sock \
        --state-dir /tmp/state 2>/tmp/pylond.log & pid=$!
    wait_for 300 push_status connection connected \
        || { push_status; tail -20 /tmp/pylond.log /tmp/backend-main.err /var/log/mosquitto/mosquitto.log
        fail "the installed push plugin does not connect to the packaged broker"; }
    token=$(push_status token) device=$(push_status deviceId)
    [ -n "$token" ] && [ -n "$device" ] || fail "push.status shows no device token or id: $(push_status)"
    code=$(curl -s -o /tmp/send.out -w '%{http_code}' -H "Authorization: Bearer $(cat /etc/pylon-backend/operator.token)" \
        -XPOST 127.0.0.1:8780/v1/admin/push/send -d "{\"appId\":\"deb-test\",\"target\":\"$token\",\"title\":\"hi\"}")
    [ "$code" = 200 ] || { cat /tmp/send.out; fail "admin push send answered $code"; }
    wait_for 100 push_status received 1 || fail "the push plugin did not receive the operator's send"
    curl -sf 127.0.0.1:8780/ | grep -q '<title>Pylon console</title>' || fail "the packaged backend does not serve the console"
    # Revocation with the packaged files, read by the broker as the mosquitto user at a reload.
    echo "$device" >> /etc/pylon-backend/revoked
    kill -HUP "$mpid"
    wait_for 100 push_status brokerDisconnects 1 \
        || { tail -5 /var/log/mosquitto/mosquitto.log; fail "the revoked device was not disconnected"; }
    # The reload read both files as the mosquitto user (the keys too: a rotation needs that).
    wait_for 50 grep -q 'pylon_auth: reloaded 1 keys, 1 revoked devices' /var/log/mosquitto/mosquitto.log \
        || { tail -5 /var/log/mosquitto/mosquitto.log; fail "the broker did not reload the packaged key and revocation files"; }
    kill "$pid" "$bpid" "$mpid"; wait "$pid" "$bpid" "$mpid" || true
    echo "deb-test: server: packaged push path ok (pylon_auth broker, pylon-backend@main, device registered, send received, revoked device kicked, console served)"

    # N instances on one PostgreSQL, as INSTALL.md sets them up: peer authentication on the
    # local socket as the pylon-backend user, one env file each (its LISTEN and DB); a batch
    # posted to one instance is read back through the other.
    pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
    install -d -o postgres -g postgres -m 2775 /run/postgresql
    runuser -u postgres -- "$pgbin/initdb" -D /tmp/pg -A peer --no-sync >/dev/null || fail "initdb"
    runuser -u postgres -- "$pgbin/pg_ctl" -D /tmp/pg -w -l /tmp/pg.log -o "-k /run/postgresql -h ''" start >/dev/null \
        || { cat /tmp/pg.log; fail "PostgreSQL does not start"; }
    runuser -u postgres -- "$pgbin/createuser" -h /run/postgresql pylon-backend
    runuser -u postgres -- "$pgbin/createdb" -h /run/postgresql -O pylon-backend pylon
    ipids=()
    for i in 1 2; do
        sed -e "s|^LISTEN=.*|LISTEN=127.0.0.1:878$i|" -e "s|^DB=.*|DB=postgresql:///pylon?host=/run/postgresql|" \
            /etc/pylon-backend/main.env > /etc/pylon-backend/b$i.env
        start_instance b$i & ipids+=($!)
        wait_for 150 grep -q "listening on" /tmp/backend-b$i.out || { cat /tmp/backend-b$i.err; fail "pylon-backend@b$i does not start"; }
    done
    code=$(curl -s -o /tmp/batch.out -w '%{http_code}' -H "Authorization: Bearer $(cat /etc/pylon-backend/enrol.secret)" \
        -H 'Idempotency-Key: deb-test-1' -H 'Content-Type: application/json' -XPOST 127.0.0.1:8781/v1/batches/deb-test \
        -d '{"records":[{"id":"r1","ts":1700000000000,"data":{"n":1}}]}')
    [ "$code" = 200 ] || { cat /tmp/batch.out; fail "a batch to pylon-backend@b1 answered $code"; }
    out=$(curl -sf -H "Authorization: Bearer $(cat /etc/pylon-backend/operator.token)" 127.0.0.1:8782/v1/inspect/streams/deb-test) \
        || fail "pylon-backend@b2 inspect"
    grep -q '"records":1' <<<"$out" || fail "pylon-backend@b2 does not see b1's batch on the shared database: $out"
    # A third with the ingest stream on NATS JetStream (OPTIONS=--nats ...), the server started
    # and the stream read with the packaged fleet tools.
    urls=$(pylon-nats-cluster start --dir /tmp/nats --nodes 1 --base-port 4222) || fail "pylon-nats-cluster start"
    sed -e "s|^LISTEN=.*|LISTEN=127.0.0.1:8783|" -e "s|^DB=.*|DB=postgresql:///pylon?host=/run/postgresql|" \
        -e "s|^OPTIONS=.*|OPTIONS=--nats $urls|" /etc/pylon-backend/main.env > /etc/pylon-backend/b3.env
    start_instance b3 & ipids+=($!)
    wait_for 150 grep -q "listening on" /tmp/backend-b3.out || { cat /tmp/backend-b3.err; fail "pylon-backend@b3 does not start"; }
    for _ in $(seq 100); do  # ingest answers 503 until the stream exists
        code=$(curl -s -o /tmp/batch.out -w '%{http_code}' -H "Authorization: Bearer $(cat /etc/pylon-backend/enrol.secret)" \
            -H 'Idempotency-Key: deb-test-2' -H 'Content-Type: application/json' -XPOST 127.0.0.1:8783/v1/batches/deb-test \
            -d '{"records":[{"id":"r2","ts":1700000000000,"data":{"n":2}}]}')
        [ "$code" = 503 ] || break
        sleep 0.1
    done
    [ "$code" = 200 ] || { cat /tmp/batch.out; fail "a batch to pylon-backend@b3 (--nats) answered $code"; }
    out=$(pylon-stream-consumer --server "$urls" --durable deb-test --once) || fail "pylon-stream-consumer"
    grep -q '"msgId": "deb-test-2"' <<<"$out" || fail "the batch is not in the stream: $out"
    kill "${ipids[@]}"; wait "${ipids[@]}" || true
    pylon-nats-cluster stop --dir /tmp/nats >/dev/null
    runuser -u postgres -- "$pgbin/pg_ctl" -D /tmp/pg -m immediate stop >/dev/null
    echo "deb-test: server: instances from env files ok (b1 and b2 on one PostgreSQL: a batch posted to b1 read through b2; b3 with --nats: its batch read from the stream with pylon-stream-consumer)"

    # What the operator and the broker made go with them; then the packages.
    rm -f /etc/mosquitto/conf.d/pylon-auth.conf /etc/pylon-backend/b[123].env
    [ -n "$mosq_db" ] || rm -f /var/lib/mosquitto/mosquitto.db
    rm -rf /tmp/run /tmp/state /tmp/credentials-*
    dpkg -r pylon-backend >/dev/null || fail "dpkg -r pylon-backend"
    [ ! -e /usr/bin/pylon-backend ] || fail "pylon-backend left after dpkg -r"
    [ -e /etc/pylon-backend/main.env ] && [ -e /etc/pylon-backend/broker.key ] || fail "dpkg -r removed configuration"
    dpkg -P pylon pylon-backend >/dev/null || fail "dpkg -P"
    ! getent passwd pylon-backend >/dev/null || fail "pylon-backend user left after purge"
    ! getent group pylon-backend >/dev/null || fail "pylon-backend group left after purge"
    snapshot > /tmp/after
    diff /tmp/before /tmp/after >&2 || fail "server: files left behind or removed"
    diff <(cut -d: -f1 /tmp/passwd) <(cut -d: -f1 /etc/passwd) || fail "users differ"
    diff <(cut -d: -f1 /tmp/group) <(cut -d: -f1 /etc/group) || fail "groups differ"
    echo "deb-test: server ok (files, secrets, mosquitto's files untouched, removed, purged, nothing left)"
}

if [ "${1:-}" = --inside ]; then
    export PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8
    unset PYLON_SOCKET PYLON_STATE_DIR PYLON_CONFIG
    "inside_$2"
    exit
fi

# ---- On this machine ---------------------------------------------------------------------------
dir=$1 version=$2 arch=$3
device=$dir/pylon_${version}_${arch}.deb
backend=$dir/pylon-backend_${version}_${arch}.deb
python=$dir/python3-pylon_${version}_all.deb
for d in "$device" "$backend" "$python"; do [ -f "$d" ] || fail "$d missing (make deb)"; done
[ "$(id -u)" = 0 ] || fail "needs root (mount and network namespaces)"
tmp=$(mktemp -d /tmp/pylon-deb-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# lintian: clean (no errors, no warnings; the one override is shipped with pylon and says why).
if command -v lintian >/dev/null; then
    for d in "$device" "$backend" "$python"; do
        lintian --fail-on error,warning --allow-root "$d" || fail "lintian: $(basename "$d")"
    done
else
    echo "deb-test: lintian not installed; packages not linted"
fi
# The split, as the control files say it.
# (libmosquitto1 is the push plugin's MQTT client library; mosquitto is the broker.)
deps=$(dpkg-deb --field "$device" Depends Recommends Suggests | sed 's/^[A-Za-z]*: //' | tr ',|' '\n\n' | awk '{ print $1 }')
! grep -E -x -q 'mosquitto|libpq[0-9]*|libnats[0-9.]*' <<<"$deps" || fail "pylon names a broker or a server library: $(tr '\n' ' ' <<<"$deps")"
! dpkg-deb -c "$device" | grep -E -q '\./etc/mosquitto|pylon-backend|/console/' || fail "pylon ships server files"
! dpkg-deb -c "$backend" | grep -q '\./etc/mosquitto' || fail "pylon-backend ships a file in /etc/mosquitto"
[ "$(dpkg-deb --field "$python" Architecture)" = all ] || fail "python3-pylon is not Architecture: all"

# Runs this script's inside_NAME in a throw-away machine: an overlay of / in a new mount, PID and
# network namespace, with its own /proc, /tmp, /run and loopback; everything it wrote is in
# $tmp/NAME/upper and goes with $tmp.
machine() {
    local name=$1 m=$tmp/$1
    mkdir -p "$m/upper/deb-test" "$m/work" "$m/root"
    cp "$device" "$backend" "$python" "$0" "$m/upper/deb-test/"
    unshare --mount --pid --net --fork --propagation private -- bash -ec '
        m=$1; shift
        mount -t overlay overlay -o "lowerdir=/,upperdir=$m/upper,workdir=$m/work" "$m/root"
        mount -t proc proc "$m/root/proc"
        mount --rbind /dev "$m/root/dev"
        mount -t tmpfs -o mode=1777 tmpfs "$m/root/tmp"
        mount -t tmpfs -o mode=755 tmpfs "$m/root/run"
        ip link set lo up
        chroot "$m/root" "$@"' _ "$m" /bin/bash /deb-test/"$(basename "$0")" --inside "$name"
}
machine device
machine server
echo "deb-test: ok (lintian clean x3; device without a broker, libpq or libnats; server with the packaged push path)"
