#!/usr/bin/env bash
# `make test-deb`: installs the .deb on this machine (root), checks the result, runs the installed
# service's binaries as the pylon user, removes and purges it, and checks nothing is left behind.
# Where systemd runs (PID 1), it also starts pylond.service and talks to it as a pylon-group member.
set -euo pipefail
deb=$1
tmp=$(mktemp -d /tmp/pylon-deb-test.XXXXXX)
pid=""
bpid="" mpid=""
cleanup() {
    for p in $pid $bpid $mpid; do kill -9 "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "deb-test: FAIL: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "needs root"
# One .deb test at a time on a machine.
exec 9>/tmp/pylon-deb-test.lock
flock 9
# dpkg -i does not fetch dependencies: install the package's Depends first (a no-op when present).
missing=""
for p in $(dpkg-deb --field "$deb" Depends | tr ',' '\n' | sed 's/(.*)//; s/ //g'); do
    dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "deb-test: installing dependencies:$missing"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
dpkg -s pylon >/dev/null 2>&1 && fail "pylon is already installed; dpkg -P pylon first"
getent passwd pylon >/dev/null && fail "a pylon user already exists"

snapshot() {
    find /etc /usr /lib /var/lib /run -xdev \( -path /var/lib/dpkg -o -path /var/lib/apt -o -path /var/cache \
        -o -path /run/user -o -path /var/lib/systemd/deb-systemd-user-helper-enabled \) -prune -o -print 2>/dev/null \
        | grep -v -e '^/etc/[a-z]*-$' | sort  # useradd's backups (passwd-, subuid-) are not the package's
}
# lintian: no errors (its warnings are printed; the one override is shipped with the package).
if command -v lintian >/dev/null; then
    lintian --fail-on error --allow-root "$deb" || fail "lintian reports errors"
fi
snapshot > "$tmp/before"
cp /etc/passwd "$tmp/passwd"; cp /etc/group "$tmp/group"

dpkg -i "$deb" >/dev/null || fail "dpkg -i"
getent passwd pylon >/dev/null || fail "no pylon user"
getent group pylon >/dev/null || fail "no pylon group"
[ -x /usr/bin/pylond ] && [ -x /usr/lib/pylon/plugins/pylon-uploader ] || fail "binaries"
[ -f /usr/share/pylon/console/index.html ] && [ -f /usr/share/pylon/console/js/app.js ] || fail "the operator console is not installed"
[ ! -e /usr/lib/pylon/plugins/pylon-echo ] || fail "test plugin shipped"
dpkg-query -W -f='${Conffiles}' pylon | grep -q /etc/pylon/pylon.json || fail "pylon.json is not a conffile"
[ "$(stat -c '%a %U:%G' /etc/pylon/device.key)" = "600 pylon:pylon" ] || fail "device.key is not 600 pylon:pylon"
[ "$(stat -c '%a %U:%G' /etc/pylon/pylon.json)" = "640 root:pylon" ] || fail "pylon.json is $(stat -c '%a %U:%G' /etc/pylon/pylon.json), not 640 root:pylon"
# Every shipped file under /etc/pylon is a conffile; device.key and broker.password are not shipped but made once by
# the postinst (a per-machine secret, removed by purge).
for f in $(cd / && find etc/pylon -type f ! -name device.key ! -name broker.password); do
    dpkg-query -W -f='${Conffiles}' pylon | grep -q " /$f " || fail "/$f is not a conffile"
done
[ -L /etc/systemd/system/multi-user.target.wants/pylond.service ] || fail "pylond.service not enabled"
/usr/bin/pylond --check-config /etc/pylon/pylon.json || fail "pylond --check-config /etc/pylon/pylon.json"
# Push works out of the box: mosquitto is a dependency, the package configures it (conf.d file,
# dynamic-security file with the backend as its admin) and the backend's unit publishes through it.
dpkg-deb --field "$deb" Depends | grep -q 'mosquitto' || fail "mosquitto is not a dependency"
[ -f /etc/mosquitto/conf.d/pylon-push.conf ] || fail "no /etc/mosquitto/conf.d/pylon-push.conf"
[ "$(stat -c '%a %U' /etc/pylon/broker.password)" = "600 root" ] || fail "broker.password is not 600 root"
[ "$(stat -c '%a %U' /var/lib/mosquitto/dynsec.json)" = "600 mosquitto" ] || fail "dynsec.json is not 600 mosquitto"
grep -q -- '--mqtt 127.0.0.1:1883 .*--mqtt-dynsec' /lib/systemd/system/pylon-backend.service || fail "pylon-backend.service has no --mqtt"
for d in copyright changelog.gz SECURITY.md CONFIG.md INSTALL.md PUSH.md; do
    [ -e /usr/share/doc/pylon/$d ] || fail "/usr/share/doc/pylon/$d missing"; done
for m in man1/pylonctl.1 man5/pylon.json.5 man8/pylond.8 man8/pylon-backend.8; do [ -e /usr/share/man/$m.gz ] || fail "man page $m"; done
if command -v systemd-analyze >/dev/null; then
    systemd-analyze verify /lib/systemd/system/pylond.service /lib/systemd/system/pylon-backend.service || fail "systemd-analyze verify"
    systemd-analyze security --offline=yes /lib/systemd/system/pylond.service | grep "Overall exposure"
fi

if [ -d /run/systemd/system ]; then
    # A real systemd: the hardened service, reached by a member of the pylon group.
    systemctl start pylon-backend.service pylond.service || { journalctl -u pylond -n 50 --no-pager; fail "start"; }
    useradd -M -G pylon pylon-test-member
    runuser -u pylon-test-member -- pylonctl ping | grep -q pong || fail "group member cannot reach the service"
    systemctl stop pylond.service pylon-backend.service
    userdel pylon-test-member
else
    # No systemd here: run the installed binaries as the pylon user with the installed config,
    # its socket and state moved to a temporary directory, and connect as a pylon-group member.
    echo "deb-test: systemd is not running here; running the installed pylond as the pylon user instead"
    install -d -o pylon -g pylon -m 750 "$tmp/run" "$tmp/state"
    chmod 755 "$tmp"
    runuser -u pylon -- /usr/bin/pylond --config /etc/pylon/pylon.json --socket "$tmp/run/pylon.sock" \
        --state-dir "$tmp/state" 2>"$tmp/pylond.log" & pid=$!
    useradd -M -G pylon pylon-test-member
    # The packaged push path, as the units would start it: Debian's mosquitto configuration (with
    # the package's conf.d file) and pylon-backend with its unit's ExecStart, credentials and state
    # in temporary directories. Skipped when something else already listens on the ports.
    e2e=""
    if ! (exec 3<>/dev/tcp/127.0.0.1/1883) 2>/dev/null && ! (exec 3<>/dev/tcp/127.0.0.1/8780) 2>/dev/null; then
        e2e=1
        mosq_db_before=$([ -e /var/lib/mosquitto/mosquitto.db ] && echo 1 || true)
        install -d -o mosquitto -g mosquitto /run/mosquitto
        mosquitto -c /etc/mosquitto/mosquitto.conf 2>"$tmp/mosquitto.err" & mpid=$!
        install -d -m 700 "$tmp/creds" "$tmp/bstate"
        cp /etc/pylon/device.key "$tmp/creds/enrol.secret"; cp /etc/pylon/broker.password "$tmp/creds/broker.password"
        (umask 077; od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$tmp/bstate/operator.token")
        exec_start=$(sed -n 's/^ExecStart=//p' /lib/systemd/system/pylon-backend.service \
            | sed -e "s|\${CREDENTIALS_DIRECTORY}|$tmp/creds|g" -e "s|/var/lib/pylon-backend|$tmp/bstate|g")
        $exec_start >"$tmp/backend.out" 2>"$tmp/backend.err" & bpid=$!
    fi
    ok=""
    for i in $(seq 100); do
        if runuser -u pylon-test-member -- pylonctl --socket "$tmp/run/pylon.sock" ping 2>/dev/null | grep -q pong; then ok=1; break; fi
        sleep 0.1
    done
    [ -n "$ok" ] || { cat "$tmp/pylond.log"; userdel pylon-test-member; fail "a pylon-group member cannot reach pylond"; }
    # The Python package is installed for the system Python: a group member scripts the host.
    runuser -u pylon-test-member -- /usr/bin/python3 -c \
        "import pylon, sys; sys.exit(0 if pylon.Client('$tmp/run/pylon.sock').call('bus.ping') else 1)" \
        || fail "the system Python cannot use the installed pylon package"
    if runuser -u nobody -- pylonctl --socket "$tmp/run/pylon.sock" ping >/dev/null 2>&1; then
        userdel pylon-test-member; fail "a non-member reached pylond"; fi
    userdel pylon-test-member
    if [ -n "$e2e" ]; then
        # The push plugin registers with the backend, which gives it a broker login; it connects,
        # and an operator's send reaches it through the broker.
        st=""
        for i in $(seq 150); do
            st=$(pylonctl --socket "$tmp/run/pylon.sock" call push.status 2>/dev/null || true)
            echo "$st" | grep -q '"connection": *"connected"' && break
            sleep 0.1
        done
        echo "$st" | grep -q '"connection": *"connected"' || {
            echo "$st"; tail -20 "$tmp/pylond.log" "$tmp/backend.err" "$tmp/mosquitto.err" /var/log/mosquitto/mosquitto.log 2>/dev/null
            fail "the installed push plugin does not connect to the packaged broker"; }
        token=$(echo "$st" | sed -n 's/.*"token": *"\([^"]*\)".*/\1/p')
        [ -n "$token" ] || fail "push.status shows no device token"
        code=$(curl -s -o "$tmp/send.out" -w '%{http_code}' -H "Authorization: Bearer $(cat "$tmp/bstate/operator.token")" \
            -XPOST 127.0.0.1:8780/v1/admin/push/send -d "{\"appId\":\"deb-test\",\"target\":\"$token\",\"title\":\"hi\"}")
        [ "$code" = 200 ] || { cat "$tmp/send.out"; fail "admin push send answered $code"; }
        got=""
        for i in $(seq 100); do
            pylonctl --socket "$tmp/run/pylon.sock" call push.status 2>/dev/null | grep -q '"received": *[1-9]' && { got=1; break; }
            sleep 0.1
        done
        [ -n "$got" ] || fail "the push plugin did not receive the operator's send"
        # The operator console, served by the packaged backend from /usr/share/pylon/console.
        curl -sf 127.0.0.1:8780/ | grep -q '<title>Pylon console</title>' || fail "the packaged backend does not serve the console"
        kill "$bpid"; wait "$bpid" 2>/dev/null || true; bpid=""
        kill "$mpid"; wait "$mpid" 2>/dev/null || true; mpid=""
        [ -n "$mosq_db_before" ] || rm -f /var/lib/mosquitto/mosquitto.db
        rmdir /run/mosquitto 2>/dev/null || true
        echo "deb-test: packaged push path ok (broker login from the postinst, device registered, send received, console served)"
    else
        echo "deb-test: ports 1883/8780 in use here; packaged push path not exercised"
    fi
    kill "$pid"; wait "$pid" || true; pid=""
    rm -rf "$tmp/run" "$tmp/state"
fi

dpkg -r pylon >/dev/null || fail "dpkg -r"
[ ! -e /usr/bin/pylond ] || fail "binaries left after dpkg -r"
[ -e /etc/pylon/pylon.json ] || fail "conffile removed by dpkg -r (only purge removes it)"
dpkg -P pylon >/dev/null || fail "dpkg -P"
getent passwd pylon >/dev/null && fail "pylon user left after purge"
getent group pylon >/dev/null && fail "pylon group left after purge"
snapshot > "$tmp/after"
if ! diff "$tmp/before" "$tmp/after" > "$tmp/diff"; then cat "$tmp/diff" >&2; fail "files left behind or removed"; fi
diff <(cut -d: -f1 "$tmp/passwd") <(cut -d: -f1 /etc/passwd) || fail "users differ"
diff <(cut -d: -f1 "$tmp/group") <(cut -d: -f1 /etc/group) || fail "groups differ"
echo "deb-test: ok (dpkg -i, user and group, conffile, unit enabled, check-config, group member connects, dpkg -r, dpkg -P, nothing left)"
