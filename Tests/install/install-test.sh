#!/usr/bin/env bash
# `make test-install`: installs the build in $1 (default .build/debug) into a temporary DESTDIR
# with PREFIX=/usr and runs the installed tree end to end: the layout, the installed config
# (no test plugins, socketGroup pylon, the backend URL substituted), --help/--version of every
# binary, pylond --check-config, then the installed pylond + plugins + pylon-backend uploading a
# record, and `systemd-analyze verify` / `security` on the installed units where systemd-analyze exists.
set -euo pipefail
unset PYLON_SOCKET PYLON_STATE_DIR PYLON_CONFIG  # make exports PYLON_SOCKET for `make run`
cd "$(dirname "$0")/../.."
bin=${1:-$PWD/.build/debug}
tmp=$(mktemp -d /tmp/pylon-install-test.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "install-test: FAIL: $*" >&2; exit 1; }
root=$tmp/root
port=$((20000 + RANDOM % 20000))
make --no-print-directory install-files DESTDIR="$root" PREFIX=/usr BIN_SRC="$bin" BACKEND_URL="http://127.0.0.1:$port" >/dev/null

for f in usr/bin/pylond usr/bin/pylonctl usr/bin/pylon-backend usr/lib/pylon/plugins/pylon-uploader \
         usr/lib/pylon/plugins/pylon-ma usr/lib/pylon/plugins/pylon-push usr/lib/pylon/plugins/pylon-gtm \
         etc/pylon/gtm/GTM-DEMO etc/pylon/pylon.json lib/systemd/system/pylond.service \
         lib/systemd/system/pylon-backend@.service etc/pylon-backend/main.env etc/pylon-backend/revoked \
         lib/systemd/system/mosquitto.service.d/pylon-backend-nofile.conf usr/lib/pylon-backend/pylon_auth.so \
         usr/share/doc/pylon-backend/examples/mosquitto-pylon-auth.conf usr/lib/sysusers.d/pylon-backend.conf \
         usr/bin/pylon-nats-auth usr/bin/pylon-nats-cluster usr/bin/pylon-stream-consumer \
         usr/share/man/man1/pylon-nats-auth.1.gz usr/share/man/man8/pylon-backend.8.gz usr/lib/sysusers.d/pylon.conf \
         usr/share/man/man1/pylonctl.1.gz usr/share/man/man5/pylon.json.5.gz usr/share/man/man8/pylond.8.gz \
         usr/share/bash-completion/completions/pylonctl usr/share/zsh/vendor-completions/_pylonctl \
         usr/share/pylon/console/index.html usr/share/pylon/console/js/app.js usr/share/pylon/console/js/pages/push.js; do
    [ -e "$root/$f" ] || fail "$f not installed"
done
[ ! -e "$root/usr/lib/pylon/plugins/pylon-echo" ] || fail "test plugin installed"
# One multi-call executable: pylond and the plugins are relative links to /usr/lib/pylon/pylon.
[ -f "$root/usr/lib/pylon/pylon" ] && [ ! -L "$root/usr/lib/pylon/pylon" ] || fail "no multi-call /usr/lib/pylon/pylon"
for l in usr/bin/pylond usr/lib/pylon/plugins/pylon-uploader usr/lib/pylon/plugins/pylon-ma \
         usr/lib/pylon/plugins/pylon-push usr/lib/pylon/plugins/pylon-gtm; do
    [ -L "$root/$l" ] && [ "$(readlink -f "$root/$l")" = "$(readlink -f "$root/usr/lib/pylon/pylon")" ] || fail "$l is not a link to pylon"
    case "$(readlink "$root/$l")" in /*) fail "$l links by an absolute path";; esac
done
cfg=$root/etc/pylon/pylon.json
grep -q '"socketGroup": "pylon"' "$cfg" || fail "socketGroup not set"
grep -q "http://127.0.0.1:$port/v1/batches" "$cfg" || fail "BACKEND_URL not substituted"
! grep -q '@' "$cfg" || fail "unsubstituted placeholder in $cfg"
grep -q "ExecStart=/usr/bin/pylond " "$root/lib/systemd/system/pylond.service" || fail "unit ExecStart not under PREFIX"
grep -q -- "--console-dir /usr/share/pylon/console" "$root/lib/systemd/system/pylon-backend@.service" || fail "the backend unit does not serve the installed console"
grep -q "^ExecStart=/usr/bin/pylon-backend " "$root/lib/systemd/system/pylon-backend@.service" || fail "backend unit ExecStart not under PREFIX"
grep -q "^plugin /usr/lib/pylon-backend/pylon_auth.so" "$root/usr/share/doc/pylon-backend/examples/mosquitto-pylon-auth.conf" \
    || fail "the broker example does not name the installed plugin"
# The fleet tools run with the system Python and print their usage.
for t in pylon-nats-auth pylon-nats-cluster pylon-stream-consumer; do
    head -1 "$root/usr/bin/$t" | grep -qx '#!/usr/bin/python3' || fail "$t: shebang"
    out=$("$root/usr/bin/$t" --help 2>&1 || true)
    grep -q "^usage: $t" <<<"$out" || fail "$t --help: $out"
done
for b in usr/bin/pylond usr/bin/pylonctl usr/bin/pylon-backend usr/lib/pylon/plugins/pylon-uploader usr/lib/pylon/plugins/pylon-ma \
         usr/lib/pylon/plugins/pylon-push usr/lib/pylon/plugins/pylon-gtm; do
    "$root/$b" --version | grep -q "0\.1\.0" || fail "$b --version"
    "$root/$b" --help >/dev/null || fail "$b --help exits non-zero"
done
"$root/usr/lib/pylon/plugins/pylon-ma" --help | grep -q "started and supervised by pylond" || fail "plugin --help text"
for m in pylonctl.1 pylon.json.5 pylond.8 pylon-backend.8 pylon-nats-auth.1 pylon-nats-cluster.1 pylon-stream-consumer.1; do
    sec=${m##*.}
    zcat "$root/usr/share/man/man$sec/$m.gz" | grep -q '^\.TH ' || fail "man page $m has no .TH"
    if command -v man >/dev/null; then
        zcat "$root/usr/share/man/man$sec/$m.gz" | man -l - >/dev/null 2>&1 || fail "man page $m does not render"
    fi
done

# The installed config, moved into the temporary tree: pluginDir, socket, state; the pylon group
# may not exist on this machine, so the socket keeps root's group here.
python3 - "$cfg" "$tmp/pylon.json" "$root/usr/lib/pylon/plugins" "$tmp" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["pluginDir"] = sys.argv[3]
c["socket"] = sys.argv[4] + "/pylon.sock"
c["stateDir"] = sys.argv[4] + "/state"
c.pop("socketGroup")
for p in c["plugins"]:
    if p["name"] == "gtm":
        p["config"]["defaultsDir"] = sys.argv[4] + "/root/etc/pylon/gtm"
    if "credentialFile" in p["config"]:
        p["config"]["credentialFile"] = sys.argv[4] + "/device.key"
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
# PATH without the build directory: plugins come from pluginDir.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
"$root/usr/bin/pylond" --check-config "$tmp/pylon.json" | grep -q "configuration ok: 4 plugins" || fail "check-config"
# check-config names a missing plugin executable.
python3 -c "import json,sys; c=json.load(open('$tmp/pylon.json')); c['plugins'][0]['exec']='pylon-nope'; json.dump(c, open('$tmp/bad.json','w'))"
if "$root/usr/bin/pylond" --check-config "$tmp/bad.json" 2>"$tmp/err"; then fail "check-config accepted a missing executable"; fi
grep -q "pylon-nope not found" "$tmp/err" || fail "check-config did not name the missing executable"

# The backend's secrets (0600): the operator token and the enrolment secret the plugins present.
(umask 077; echo "install-test-operator-token-0123" > "$tmp/operator.token"; echo "install-test-device-key-0123456" > "$tmp/device.key")
"$root/usr/bin/pylon-backend" --listen "127.0.0.1:$port" --db "$tmp/backend.db" \
    --operator-token-file "$tmp/operator.token" --enrol-secret-file "$tmp/device.key" >"$tmp/backend.out" 2>"$tmp/backend.log" & pids+=($!)
"$root/usr/bin/pylond" --config "$tmp/pylon.json" 2>"$tmp/pylond.log" & pids+=($!)
export PYLON_SOCKET=$tmp/pylon.sock
ctl=$root/usr/bin/pylonctl
for i in $(seq 100); do "$ctl" ping >/dev/null 2>&1 && break; sleep 0.1; done
"$ctl" ping | grep -q pong || fail "installed pylond not reachable"
for i in $(seq 100); do "$ctl" status --json | grep -q '"state":"running".*"state":"running"' && break; sleep 0.1; done
"$ctl" call uploader.enqueue '{"stream":"install-test","records":[{"id":"r1","data":{"hello":1}}]}' >/dev/null || fail "enqueue"
"$ctl" call uploader.flush '{"stream":"install-test","wait":true}' >/dev/null || fail "flush"
out=$(curl -sf -H "Authorization: Bearer $(cat "$tmp/operator.token")" "http://127.0.0.1:$port/v1/inspect/streams/install-test") || fail "backend inspect"; echo "$out" | grep -q "\"records\":1" || fail "record not at the backend: $out"
"$ctl" metrics > "$tmp/metrics" || fail "pylonctl metrics"; grep -q "^pylon_plugin_up{plugin=\"uploader\"} 1" "$tmp/metrics" || { head -40 "$tmp/metrics"; fail "metrics"; }
# bash completion: method names from the running host (bus.describe).
comp=$(PATH="$root/usr/bin:$PATH" bash -c 'source "$1"; COMP_WORDS=(pylonctl call uploader.e); COMP_CWORD=2; _pylonctl; echo "${COMPREPLY[*]}"' _ \
       "$root/usr/share/bash-completion/completions/pylonctl")
[ "$comp" = "uploader.enqueue" ] || fail "bash completion of call: got '$comp'"
comp=$(PATH="$root/usr/bin:$PATH" bash -c 'source "$1"; COMP_WORDS=(pylonctl consent set k a); COMP_CWORD=4; _pylonctl; echo "${COMPREPLY[*]}"' _ \
       "$root/usr/share/bash-completion/completions/pylonctl")
[ "$comp" = "allow" ] || fail "bash completion of consent set: got '$comp'"

if command -v systemd-analyze >/dev/null; then
    # The installed units with ExecStart pointing into the DESTDIR (verify checks the binaries).
    mkdir -p "$tmp/units"
    for u in pylond pylon-backend@; do sed "s|=/usr/bin/|=$root/usr/bin/|" "$root/lib/systemd/system/$u.service" > "$tmp/units/$u.service"; done
    # The template as its packaged instance (main.env).
    systemd-analyze verify --man=no "$tmp/units/pylond.service" "$tmp/units/pylon-backend@main.service" \
        2>"$tmp/verify" || { cat "$tmp/verify" >&2; fail "systemd-analyze verify"; }
    for u in pylond pylon-backend@main; do
        sa=$(systemd-analyze security --offline=yes "$tmp/units/$u.service" 2>&1 | grep "Overall exposure")
        echo "install-test: $u: $sa"
        case "$sa" in *" OK "*|*SAFE*) ;; *) fail "$u exposure not OK: $sa" ;; esac
    done
else
    echo "install-test: systemd-analyze not present; units not verified"
fi
echo "install-test: ok (installed tree in a DESTDIR: layout, config, --help/--version, check-config, end to end upload, units)"
