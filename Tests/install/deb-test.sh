#!/usr/bin/env bash
# `make test-deb`: installs the .deb on this machine (root), checks the result, runs the installed
# service's binaries as the pylon user, removes and purges it, and checks nothing is left behind.
# Where systemd runs (PID 1), it also starts pylond.service and talks to it as a pylon-group member.
set -euo pipefail
deb=$1
tmp=$(mktemp -d /tmp/pylon-deb-test.XXXXXX)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"; }
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
snapshot > "$tmp/before"
cp /etc/passwd "$tmp/passwd"; cp /etc/group "$tmp/group"

dpkg -i "$deb" >/dev/null || fail "dpkg -i"
getent passwd pylon >/dev/null || fail "no pylon user"
getent group pylon >/dev/null || fail "no pylon group"
[ -x /usr/bin/pylond ] && [ -x /usr/lib/pylon/plugins/pylon-uploader ] || fail "binaries"
[ ! -e /usr/lib/pylon/plugins/pylon-echo ] || fail "test plugin shipped"
dpkg-query -W -f='${Conffiles}' pylon | grep -q /etc/pylon/pylon.json || fail "pylon.json is not a conffile"
[ "$(stat -c '%a %U:%G' /etc/pylon/device.key)" = "600 pylon:pylon" ] || fail "device.key is not 600 pylon:pylon"
[ "$(stat -c '%a %U:%G' /etc/pylon/pylon.json)" = "640 root:pylon" ] || fail "pylon.json is $(stat -c '%a %U:%G' /etc/pylon/pylon.json), not 640 root:pylon"
# Every shipped file under /etc/pylon is a conffile; device.key is not shipped but made once by
# the postinst (a per-machine secret, removed by purge).
for f in $(cd / && find etc/pylon -type f ! -name device.key); do
    dpkg-query -W -f='${Conffiles}' pylon | grep -q " /$f " || fail "/$f is not a conffile"
done
[ -L /etc/systemd/system/multi-user.target.wants/pylond.service ] || fail "pylond.service not enabled"
/usr/bin/pylond --check-config /etc/pylon/pylon.json || fail "pylond --check-config /etc/pylon/pylon.json"
for m in man1/pylonctl.1 man5/pylon.json.5 man8/pylond.8; do [ -e /usr/share/man/$m.gz ] || fail "man page $m"; done
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
    ok=""
    for i in $(seq 100); do
        if runuser -u pylon-test-member -- pylonctl --socket "$tmp/run/pylon.sock" ping 2>/dev/null | grep -q pong; then ok=1; break; fi
        sleep 0.1
    done
    [ -n "$ok" ] || { cat "$tmp/pylond.log"; userdel pylon-test-member; fail "a pylon-group member cannot reach pylond"; }
    if runuser -u nobody -- pylonctl --socket "$tmp/run/pylon.sock" ping >/dev/null 2>&1; then
        userdel pylon-test-member; fail "a non-member reached pylond"; fi
    userdel pylon-test-member
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
