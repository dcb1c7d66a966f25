#!/usr/bin/env bash
# Device footprint: the idle memory of pylond and its four shipped plugins as the device package
# installs them. Prints, per run, the memory the five processes hold together with each physical
# page counted once (the union of their /proc/PID/pagemap; root only), their private memory and
# their PSS; then, for the last run, where each process's private memory goes (/proc/PID/smaps by
# mapping: each library's segments, the executable's, heap, thread stacks, malloc arenas) and
# which files the shared pages belong to.
#
#   tools/footprint.sh pylon_VERSION_ARCH.deb [SETTLE]   the package, extracted (make deb)
#   tools/footprint.sh BINDIR [SETTLE]                    a release build: BINDIR/pylon stripped
#                                                         as mkdeb.sh strips it, laid out as the
#                                                         package lays it out
#
# Environment: RUNS (default 3) start, measure and stop the five processes that many times;
# TOP (default 12) rows per process in the breakdown; COLD=1 drops the executable from the page
# cache before each start, as after a reboot (a file just written, by dpkg or by this script,
# sits in the page cache in large folios, which this kernel maps whole: see docs/BENCHMARKS.md). SETTLE (default 6) seconds idle before each
# measurement. The configuration is the shipped one (etc/pylon.prod.json; the package's
# /etc/pylon/pylon.json) with the socket, state, plugin and GTM paths moved into a temporary
# directory and no credential file: no backend or broker runs, so the plugins idle and retry.
# PSS divides a shared page among every process that maps it, so it moves with whatever else
# runs; the union does not. See docs/BENCHMARKS.md, "Footprint".
set -euo pipefail
src=$1 settle=${2:-6} runs=${RUNS:-3} top=${TOP:-12}
root=$(cd "$(dirname "$0")/.." && pwd)
t=$(mktemp -d /tmp/pylon-footprint.XXXXXX)
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$t"' EXIT
inst=$t/root
if [[ $src == *.deb ]]; then
    dpkg-deb -x "$src" "$inst"
    config=$inst/etc/pylon/pylon.json
    gtm=$inst/etc/pylon/gtm
else
    # What tools/mkdeb.sh and `make install-device-files PREFIX=/usr` make of a release build.
    install -d "$inst/usr/bin" "$inst/usr/lib/pylon/plugins"
    install -m 755 "$src/pylon" "$inst/usr/lib/pylon/pylon"
    strip --strip-unneeded --remove-section=.comment --remove-section=.note "$inst/usr/lib/pylon/pylon"
    ln -s ../lib/pylon/pylon "$inst/usr/bin/pylond"
    for p in uploader ma push gtm; do ln -s ../pylon "$inst/usr/lib/pylon/plugins/pylon-$p"; done
    sed -e 's|@BACKEND_URL@|http://127.0.0.1:8780|g' -e 's|@PLUGINDIR@|/usr/lib/pylon/plugins|g' \
        "$root/etc/pylon.prod.json" > "$t/shipped.json"
    config=$t/shipped.json
    gtm=$root/etc/gtm
fi
python3 - "$config" "$t" "$inst/usr/lib/pylon/plugins" "$gtm" <<'PY'
import json, sys
src, t, plugins, gtm = sys.argv[1:]
cfg = json.load(open(src))
cfg.update(socket=t + "/pylon.sock", stateDir=t + "/state", pluginDir=plugins)
cfg.pop("socketGroup", None)
for p in cfg["plugins"]:
    p["exec"] = plugins + "/pylon-" + p["name"]
    c = p.setdefault("config", {})
    c.pop("credentialFile", None)
    if "defaultsDir" in c:
        c["defaultsDir"] = gtm
json.dump(cfg, open(t + "/pylon.json", "w"))
PY
echo "executable: $(readlink -f "$inst/usr/bin/pylond") $(stat -L -c %s "$inst/usr/bin/pylond") bytes," \
    "$(ldd "$inst/usr/bin/pylond" | grep -c '=>') shared objects (ldd)"
for run in $(seq 1 "$runs"); do
    rm -rf "$t/state"
    if [ "${COLD:-0}" = 1 ]; then
        python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.fdatasync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' \
            "$(readlink -f "$inst/usr/bin/pylond")"
    fi
    "$inst/usr/bin/pylond" --config "$t/pylon.json" 2>"$t/log" & pid=$!
    sleep "$settle"
    pids="$pid $(pgrep -P "$pid" | tr '\n' ' ')"
    [ "$run" = "$runs" ] && detail=$top || detail=0
    # shellcheck disable=SC2086
    python3 - "$detail" $pids <<'PY' | tee -a "$t/summary"
import collections, os, struct, sys

detail, pids = int(sys.argv[1]), sys.argv[2:]
PAGE = os.sysconf("SC_PAGE_SIZE")

def mappings(pid):
    """(lo, hi, perms, name, fields) for each mapping of /proc/PID/smaps."""
    out, cur = [], None
    for line in open(f"/proc/{pid}/smaps"):
        head = line.split()
        if "-" in head[0] and not head[0].endswith(":"):
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            cur = (lo, hi, head[1], " ".join(head[5:]), {})
            out.append(cur)
        elif len(head) >= 2 and head[0].endswith(":") and head[1].isdigit():
            cur[4][head[0][:-1]] = int(head[1])
    return out

def label(maps, i, exe):
    """What a mapping is: file and segment, heap, stack, thread stack, arena or anonymous."""
    lo, hi, perms, name, _ = maps[i]
    prev = maps[i - 1] if i else None
    nxt = maps[i + 1] if i + 1 < len(maps) else None
    if name:
        base = "executable" if name == exe else os.path.basename(name)
        if name.startswith("["):
            return name
        return f"{base} {'text' if 'x' in perms else 'data' if 'w' in perms else 'rodata/relro'}"
    if prev and prev[3] and prev[1] == lo and "w" in perms:
        base = "executable" if prev[3] == exe else os.path.basename(prev[3])
        return f"{base} bss"
    if prev and not prev[3] and prev[1] == lo and prev[2] == "---p" and prev[1] - prev[0] == PAGE:
        return "[thread stack]"
    if nxt and not nxt[3] and nxt[0] == hi and nxt[2] == "---p":
        return "[malloc arena]"
    return "[anonymous]"

rows, pfn_owner, total_priv, total_pss = [], {}, 0, 0
for pid in pids:
    exe = os.readlink(f"/proc/{pid}/exe")
    maps = mappings(pid)
    comm = open(f"/proc/{pid}/comm").read().strip()
    by = collections.Counter()
    priv = pss = 0
    with open(f"/proc/{pid}/pagemap", "rb") as pm:
        for i, (lo, hi, perms, name, f) in enumerate(maps):
            what = label(maps, i, exe)
            p = f.get("Private_Clean", 0) + f.get("Private_Dirty", 0)
            by[what] += p
            priv += p
            pss += f.get("Pss", 0)
            if name == "[vsyscall]":
                continue
            pm.seek(lo // PAGE * 8)
            data = pm.read((hi - lo) // PAGE * 8)
            owner = what.rsplit(" ", 1)[0] if name and not name.startswith("[") else what
            for (e,) in struct.iter_unpack("<Q", data):
                if e >> 63 & 1:
                    pfn_owner.setdefault(e & ((1 << 55) - 1), owner)
    total_priv += priv
    total_pss += pss
    rows.append((comm, pid, priv, pss, by))

if 0 in pfn_owner and len(pfn_owner) == 1:
    union = "n/a (pagemap's frame numbers need root)"
else:
    union = f"{len(pfn_owner) * PAGE / 2**20:.1f} MB"
print(f"union {union}, private {total_priv / 1024:.1f} MB, PSS {total_pss / 1024:.1f} MB, "
      f"{len(pids)} processes ({', '.join(f'{c} {p / 1024:.1f}' for c, _, p, _, _ in rows)} MB private)")
if detail:
    print(f"\nprivate memory by mapping, kB (top {detail} per process; data/bss: relocated and "
          "written data, rodata/relro: read-only after relocation)")
    for comm, pid, priv, pss, by in rows:
        print(f"  {comm} (pid {pid}): private {priv} kB, PSS {pss} kB")
        for what, kb in by.most_common(detail):
            if kb:
                print(f"    {kb:6d}  {what}")
        rest = sum(kb for _, kb in by.most_common()[detail:])
        if rest:
            print(f"    {rest:6d}  (the rest)")
    together = collections.Counter()
    for *_, by in rows:
        together.update(by)
    print(f"\n  all {len(rows)} processes, by mapping:")
    for what, kb in together.most_common(detail * 2):
        if kb:
            print(f"    {kb:6d}  {what}")
    owners = collections.Counter(pfn_owner.values())
    print(f"\n  the union by what maps each page first, kB:")
    for what, n in owners.most_common(detail * 2):
        print(f"    {n * PAGE // 1024:6d}  {what}")
PY
    kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
done
if [ "$runs" -gt 1 ]; then
    echo
    python3 - "$t/summary" <<'PY'
import re, statistics, sys
u, p, s = [], [], []
for line in open(sys.argv[1]):
    m = re.match(r"union ([\d.]+) MB, private ([\d.]+) MB, PSS ([\d.]+) MB", line)
    if m:
        u.append(float(m[1])); p.append(float(m[2])); s.append(float(m[3]))
for name, xs in (("union", u), ("private", p), ("PSS", s)):
    if xs:
        print(f"{name}: median {statistics.median(xs):.1f} MB, {min(xs):.1f}-{max(xs):.1f} over {len(xs)} runs")
PY
fi
