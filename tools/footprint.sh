#!/usr/bin/env bash
# Device footprint: starts BINDIR/pylond with the four shipped plugins (etc/pylon.json, no
# backend or broker: they idle and retry), waits SETTLE seconds, prints each process's PSS and
# RSS (/proc/PID/smaps_rollup) and the total, and the size of the executables they run.
#
#   tools/footprint.sh BINDIR [SETTLE]
#
# BINDIR holds pylond and pylon-{uploader,ma,push,gtm}: separate executables, or links to the
# multi-call `pylon` (what `make install`/the .deb install). See docs/BENCHMARKS.md, "Footprint".
set -euo pipefail
bin=$(cd "$1" && pwd); settle=${2:-6}
root=$(cd "$(dirname "$0")/.." && pwd)
t=$(mktemp -d /tmp/pylon-footprint.XXXXXX)
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$t"' EXIT
python3 - "$bin" "$t" "$root/etc/pylon.json" <<'PY'
import json, sys
bin, t, src = sys.argv[1:]
cfg = json.load(open(src))
cfg.update(socket=t + "/pylon.sock", stateDir=t + "/state", pluginDir=bin)
for p in cfg["plugins"]:
    p["exec"] = bin + "/pylon-" + p["name"]
    p.get("config", {}).pop("credentialFile", None)
json.dump(cfg, open(t + "/pylon.json", "w"))
PY
"$bin/pylond" --config "$t/pylon.json" 2>"$t/log" & pid=$!
sleep "$settle"
total=0
for p in $pid $(pgrep -P "$pid"); do
    pss=$(awk '/^Pss:/ {print $2}' /proc/$p/smaps_rollup); rss=$(awk '/^Rss:/ {print $2}' /proc/$p/smaps_rollup)
    printf '  %-16s PSS %6d kB   RSS %6d kB\n' "$(cat /proc/$p/comm)" "$pss" "$rss"
    total=$((total + pss))
done
echo "PSS total: $total kB ($(( $(pgrep -P "$pid" | wc -l) + 1 )) processes)"
echo "executables: $(for f in pylond pylon-uploader pylon-ma pylon-push pylon-gtm; do readlink -f "$bin/$f"; done | sort -u | xargs du -cb | tail -1 | cut -f1) bytes"
