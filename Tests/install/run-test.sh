#!/usr/bin/env bash
# `make run` stops with its session: a hang-up (closing the terminal) stops pylond, the backend
# and the broker, and the next `make run` on the same RUN_DIR starts (it used to refuse: pylond
# took SIGHUP as "reload" and kept the socket). Runs `make run` in a session of its own on free
# loopback ports, so it never touches another instance.
set -euo pipefail
cd "$(dirname "$0")/../.."
fail() { echo "run-test: FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d /tmp/pylon-run-test.XXXXXX)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
bport=$(free_port); mport=$(free_port)
args=(RUN_DIR="$tmp/run" BACKEND_LISTEN=127.0.0.1:$bport MQTT_LISTEN=127.0.0.1:$mport)
pg=""
cleanup() { [ -n "$pg" ] && kill -KILL -- "-$pg" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

start() {
    # SIGHUP back to its default first: under nohup (or any parent that ignores it) the shell of
    # `make run` could not trap the hang-up this test sends.
    setsid python3 -c 'import os, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])' \
        make --no-print-directory run "${args[@]}" > "$tmp/run$1.log" 2>&1 < /dev/null & pg=$!
    for _ in $(seq 1200); do
        grep -q 'msg=ready' "$tmp/run$1.log" 2>/dev/null && return 0
        kill -0 "$pg" 2>/dev/null || { cat "$tmp/run$1.log" >&2; fail "make run (start $1) exited"; }
        sleep 0.1
    done
    cat "$tmp/run$1.log" >&2; fail "make run (start $1) did not become ready"
}
# Every process of the session (make, the shell, pylond and its plugins, backend, broker).
alive() { pgrep -s "$pg" > /dev/null; }

start 1
kill -HUP -- "-$pg"
for _ in $(seq 100); do alive || break; sleep 0.1; done
if alive; then ps -o pid,args -s "$pg" >&2; fail "processes of make run outlived the hang-up"; fi
[ ! -S "$tmp/run/pylon.sock" ] || fail "the socket was left behind"
start 2
kill -INT -- "-$pg"
for _ in $(seq 100); do alive || break; sleep 0.1; done
alive && fail "Ctrl-C did not stop make run"
pg=""

# CONFIG: your own file (here etc/pylon.json plus the echo plugin), rewritten to this run's ports;
# run/env gives another terminal the socket, PATH, backend and operator header.
python3 - "$tmp/my.json" <<'PY'
import json, sys
c = json.load(open("etc/pylon.json"))
c["plugins"].append({"name": "echo", "exec": "pylon-echo"})
json.dump(c, open(sys.argv[1], "w"), indent=2)
PY
args+=(CONFIG="$tmp/my.json")
start 3
(
    . "$tmp/run/env"
    [ "$PYLON_SOCKET" = "$tmp/run/pylon.sock" ] || fail "run/env: PYLON_SOCKET=$PYLON_SOCKET"
    [ "$BACKEND" = "http://127.0.0.1:$bport" ] || fail "run/env: BACKEND=$BACKEND"
    pylonctl wait-ready --timeout 60 || fail "not ready: $(pylonctl status 2>&1)"
    pylonctl call echo.echo '{"from":"CONFIG"}' | grep -q CONFIG || fail "the plugin added in CONFIG is not there"
    curl -sf -H "$OP" "$BACKEND/v1/inspect/stats" > /dev/null || fail "operator API through run/env"
) || exit 1
grep -q "\"port\": $mport" "$tmp/run/pylon.json" || fail "the broker port was not rewritten"
kill -INT -- "-$pg"
for _ in $(seq 100); do alive || break; sleep 0.1; done
pg=""

# A broker port in use is refused before anything starts, naming it. The port is held by a
# listener of this test on a port of its own (the last run's broker may still be closing
# mport), and `make run` is bounded: if it did start, the test fails instead of hanging.
# The holder prints its port once it listens (a line read from its pipe is the barrier) and
# holds it until it is killed (signal.pause, no timer).
coproc HOLDER { exec python3 -c 'import signal,socket; s=socket.socket(); s.bind(("127.0.0.1",0)); s.listen(); print(s.getsockname()[1], flush=True); signal.pause()'; }
holder=$HOLDER_PID
read -r -t 10 held <&"${HOLDER[0]}" || fail "could not hold a port"
busy=(RUN_DIR="$tmp/run" BACKEND_LISTEN=127.0.0.1:$bport MQTT_LISTEN=127.0.0.1:$held)
rc=0; timeout -s KILL 60 make --no-print-directory run "${busy[@]}" > "$tmp/busy.log" 2>&1 < /dev/null || rc=$?
kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null || true
[ "$rc" != 0 ] && grep -q "127.0.0.1:$held is in use" "$tmp/busy.log" || { cat "$tmp/busy.log" >&2; fail "a busy broker port was not refused (exit $rc)"; }
echo "run-test: ok (a hang-up stops pylond, backend and broker; make run starts again; Ctrl-C stops it; CONFIG and run/env; a busy port is refused)"
