"""The pure parts of tools/fleet/fleet.py: how a run is shared out over pylon-fleet processes and
how their JSON summaries are merged into one (docs/FLEET.md, "Several processes"). No I/O;
tested by tools/fleet/test_fleet_merge.py (make fleet-test)."""


def fleet_opt(argv, name, default):
    """The last value of option `name` in `argv` (pylon-fleet arguments), else `default`."""
    v = default
    for a, b in zip(argv, argv[1:]):
        if a == name:
            v = b
    return v


def shards(total, per_process, unit):
    """[(first device, count)]: as few processes as `per_process` allows, equal shares, each a
    multiple of `unit` (the devices one user has, so a user's devices share a process)."""
    n = max(1, -(-total // max(1, per_process)))
    size = -(-total // n)
    size = -(-size // max(1, unit)) * max(1, unit)
    out, first = [], 0
    while first < total:
        out.append((first, min(size, total - first)))
        first += size
    return out


def histogram_percentile(hist, max_us, p):
    """pylon-fleet's LatencyHistogram.percentile over `[[bucket, count], ...]` (buckets 4 % wide),
    in ms rounded to 0.1; None when empty."""
    count = sum(c for _, c in hist)
    if count == 0:
        return None
    rank = max(1, -(-p * count // 100))
    seen = 0
    for i, c in sorted(hist):
        seen += c
        if seen >= rank:
            return round(min(1.0 if i == 0 else 1.04 ** i, max_us) / 1000, 1)
    return round(max_us / 1000, 1)


def merge_summaries(parts):
    """One summary of a run split over several pylon-fleet processes: counts added, latency
    histograms merged, the stream-wide figures (each process reads the whole stream) taken once,
    the first process's table of processes (it watches the others), outages that overlap joined."""
    if len(parts) == 1:
        return parts[0]
    m = dict(parts[0])

    def add(get):
        return sum(get(p) or 0 for p in parts)

    def known_sum(get):
        vals = [get(p) for p in parts]
        return None if any(v is None for v in vals) else sum(vals)

    m["devices"] = add(lambda p: p["devices"])
    m.pop("firstDevice", None)
    m["name"] = "pylon-fleet x" + str(len(parts))
    for k in ("durationS", "loadS"):
        m[k] = max(p[k] for p in parts)
    for k in ("connected", "registered", "setupFailures"):
        m[k] = add(lambda p: p[k])
    ready = [p["allConnectedAfterS"] for p in parts]
    m["allConnectedAfterS"] = None if None in ready else max(ready)
    m["fdLimit"] = "; ".join(p["fdLimit"] for p in parts if p.get("fdLimit")) or None
    ev = dict(parts[0]["events"])
    for k in ("generated", "acked", "unacked", "rejected", "throttled", "duplicates", "batchesPosted", "batchesFailed",
              "ackedPerS", "peakAckedPerS"):
        ev[k] = add(lambda p: p["events"][k])
    for k in ("storedRead", "lost"):
        ev[k] = known_sum(lambda p: p["events"][k])
    for k in ("foreign", "peakStoredPerS"):
        ev[k] = max(p["events"][k] for p in parts)
    ev.pop("peer", None)
    m["events"] = ev
    pu = dict(parts[0]["push"])
    for k in ("expected", "delivered", "lost", "appDuplicates", "redeliveredDropped", "malformed", "foreign"):
        pu[k] = add(lambda p: p["push"].get(k))
    pu.pop("peerBroadcasts", None)
    lat = {}
    for kind in parts[0]["push"]["latency"]:
        ls = [p["push"]["latency"][kind] for p in parts]
        buckets = {}
        for lv in ls:
            for i, c in lv.get("histogram", []):
                buckets[i] = buckets.get(i, 0) + c
        hist = sorted(buckets.items())
        max_us = max(lv.get("maxUs", 0) for lv in ls)
        # Every process counts each broadcast (its own or a peer's); device and user sends are each one's own.
        sends = max(lv["sends"] for lv in ls) if kind == "broadcast" else sum(lv["sends"] for lv in ls)
        lat[kind] = {"sends": sends, "deliveries": sum(lv["deliveries"] for lv in ls),
                     "p50Ms": histogram_percentile(hist, max_us, 50), "p99Ms": histogram_percentile(hist, max_us, 99),
                     "maxMs": histogram_percentile(hist, max_us, 100), "histogram": [list(x) for x in hist], "maxUs": max_us}
    pu["latency"] = lat
    m["push"] = pu
    m["mqtt"] = {k: add(lambda p: p["mqtt"][k]) for k in parts[0]["mqtt"]}
    errs = {}
    for p in parts:
        for k, v in p["httpErrors"].items():
            errs[k] = errs.get(k, 0) + v
    m["httpErrors"] = errs
    m["outages"] = merge_outages(parts)
    m["verifyError"] = "; ".join(p["verifyError"] for p in parts if p.get("verifyError")) or None
    codes = [p["exitCode"] for p in parts]
    m["exitCode"] = 1 if 1 in codes else (3 if 3 in codes else max(codes))
    m["fleetProcesses"] = [{"name": p.get("name"), "firstDevice": p.get("firstDevice"), "devices": p["devices"],
                            "allConnectedAfterS": p["allConnectedAfterS"], "eventsAcked": p["events"]["acked"],
                            "eventsLost": p["events"]["lost"], "pushDelivered": p["push"]["delivered"],
                            "pushExpected": p["push"]["expected"], "exitCode": p["exitCode"]} for p in parts]
    return m


def merge_outages(parts):
    """The processes' outages that overlap in time as one: from the first start to the last
    reconnection, the lowest count the sum of the members' lowest (a process with no outage in
    it counted as fully connected)."""
    items = []
    for n, p in enumerate(parts):
        for o in p["outages"]:
            end = None if o["reconnectedAfterS"] is None else o["atS"] + o["reconnectedAfterS"]
            items.append((o["atS"], end, o["lowest"], n))
    items.sort(key=lambda x: x[0])
    groups = []
    for it in items:
        g = groups[-1] if groups else None
        if g and (g["end"] is None or it[0] <= g["end"]):
            g["members"].append(it)
            g["end"] = None if g["end"] is None or it[1] is None else max(g["end"], it[1])
        else:
            groups.append({"start": it[0], "end": it[1], "members": [it]})
    out = []
    for g in groups:
        lowest = {}
        for _, _, low, n in g["members"]:
            lowest[n] = min(lowest.get(n, low), low)
        total = sum(lowest.get(n, p["devices"]) for n, p in enumerate(parts))
        out.append({"atS": g["start"], "lowest": total,
                    "reconnectedAfterS": None if g["end"] is None else round(g["end"] - g["start"], 1)})
    return out
