#!/usr/bin/env bash
# README's walkthrough, run literally: starts `make run` with the README's own RUN_DIR and ports
# (`/tmp/pylon-readme`, 8795, 1895), then runs every `$ ` command of the console blocks in its
# "After `make run`" section, in order, in one shell (so `export`, `BACKEND=` and `OP=` carry
# over). A command must exit 0, unless the README shows it failing (its next line starts with
# `pylonctl: error`). Commands put in the background (`… &`) are skipped. `~/pylon` is this
# checkout. Skipped (exit 0, with a message) when the README's ports are taken.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
fail() { echo "readme-test: FAIL: $*" >&2; exit 1; }
for p in 8795 1895; do
    if (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then echo "readme-test: port $p is in use; skipped"; exit 0; fi
done
run=/tmp/pylon-readme
[ ! -e "$run" ] || { [ -S "$run/pylon.sock" ] && fail "$run is in use"; rm -rf "$run"; }
tmp=$(mktemp -d /tmp/pylon-readme-test.XXXXXX)
pg=""
cleanup() { [ -n "$pg" ] && kill -KILL -- "-$pg" 2>/dev/null; rm -rf "$tmp" "$run"; }
trap cleanup EXIT
setsid make --no-print-directory run RUN_DIR=$run BACKEND_LISTEN=127.0.0.1:8795 MQTT_LISTEN=127.0.0.1:1895 \
    > "$tmp/run.log" 2>&1 < /dev/null & pg=$!
for _ in $(seq 1200); do
    grep -q 'msg=ready' "$tmp/run.log" 2>/dev/null && break
    kill -0 "$pg" 2>/dev/null || { cat "$tmp/run.log" >&2; fail "make run exited"; }
    sleep 0.1
done
grep -q 'msg=ready' "$tmp/run.log" || { cat "$tmp/run.log" >&2; fail "make run did not become ready"; }

# The commands, with the line after each (to tell an expected failure).
python3 - "$root/README.md" "$root" > "$tmp/commands.sh" <<'PY'
import re, shlex, sys
readme, root = sys.argv[1:]
text = open(readme).read()
start = text.index("## After `make run`")
end = text.find("\n## ", start + 10)
section = text[start:end if end > 0 else len(text)]
out = ["set +e", "n=0"]
for block in re.findall(r"```console\n(.*?)```", section, re.S):
    lines = block.split("\n")
    for i, line in enumerate(lines):
        if not line.startswith("$ "):
            continue
        cmd = line[2:]
        # A trailing comment is the README's explanation, not part of the command.
        cmd = re.sub(r"\s+#\s[^'\"]*$", "", cmd).rstrip()
        if cmd.endswith("&"):
            continue
        cmd = cmd.replace("~/pylon", root)
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        expect_fail = nxt.startswith("pylonctl: error")
        if cmd.startswith("socat - UNIX-CONNECT:"):
            # An interactive session: feed it the request lines the README types.
            reqs = [l for l in lines[i + 1:] if l.startswith("{\"jsonrpc\"") and "\"method\"" in l or l.startswith("[{")]
            reqs = [l for l in reqs if "\"method\"" in l]
            cmd = "printf '%s\\n' " + " ".join(shlex.quote(r) for r in reqs) + " | socat -t 5 - UNIX-CONNECT:$PYLON_SOCKET"
        out.append(f"n=$((n+1)); echo \"readme-test: [$n] \"{shlex.quote(cmd)} >&2")
        out.append(f"( {cmd} ) > /tmp/readme-out.$$ 2>&1; rc=$?")
        want = "-ne 0" if expect_fail else "-eq 0"
        out.append(f"if [ $rc {want} ]; then :; else cat /tmp/readme-out.$$ >&2; echo \"readme-test: FAIL: command $n exited $rc\" >&2; exit 1; fi")
out.append("rm -f /tmp/readme-out.$$; echo \"readme-test: ok ($n commands of README's walkthrough)\"")
print("\n".join(out))
PY
bash "$tmp/commands.sh"
