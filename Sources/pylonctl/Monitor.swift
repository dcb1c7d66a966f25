import PylonClientKit
import PylonProtocol

#if canImport(Glibc)
import Glibc
#endif

/// `pylonctl monitor`, `reload` and `wait-ready`.

/// One `bus.monitor.event` as a line of text.
func monitorLine(_ e: JSON, verbose: Bool) -> String {
    var l = clockTime(ms: e["time_ms"]?.intValue ?? 0) + " " + pad(fmt(e["type"]), 12) + " " + pad(fmt(e["method"]), 24)
    l += " " + fmt(e["from"]) + (e["to"].map { " -> " + fmt($0) } ?? "")
    if let c = e["caller"]?.objectValue, !c.isEmpty {
        var who: [String] = []
        if let p = c["plugin"]?.stringValue { who.append("plugin=" + p) }
        if let u = c["uid"]?.intValue { who.append("uid=\(u)") }
        if let p = c["pid"]?.intValue { who.append("pid=\(p)") }
        if c["admin"]?.boolValue == true { who.append("admin") }
        if !who.isEmpty { l += "  [" + who.joined(separator: " ") + "]" }
    }
    if let id = e["id"] { l += "  id=" + id.serialized }
    l += "  \(fmt(e["bytes"])) B"
    if let us = e["latency_us"]?.intValue { l += "  " + String(Double(us) / 1000) + " ms" }
    if let d = e["delivered"]?.intValue { l += "  delivered=\(d)" }
    if e["result"]?.stringValue == "ok" { l += "  ok" }
    if let err = e["error"] {
        l += "  error \(fmt(err["code"]))" + (err["message"]?.stringValue.map { " " + $0 } ?? "")
    }
    if verbose, let p = e["params"] ?? e["payload"] { l += "\n    " + p.serialized }
    return l
}

/// `HH:MM:SS.mmm`, local time.
func clockTime(ms: Int64) -> String {
    var t = time_t(ms / 1000)
    var tm = tm()
    localtime_r(&t, &tm)
    func two(_ v: Int32) -> String { v < 10 ? "0\(v)" : "\(v)" }
    let milli = Int(ms % 1000)
    return "\(two(tm.tm_hour)):\(two(tm.tm_min)):\(two(tm.tm_sec))." + (milli < 10 ? "00" : milli < 100 ? "0" : "") + "\(milli)"
}

@MainActor func monitorCommand(_ args: [String], verbose: Bool, json: Bool, reconnect: Bool) {
    guard args.count <= 1 else { fail("monitor takes at most one PATTERN\n" + Command.named("monitor")!.help, code: 64) }
    var p: JSONObject = ["verbose": .bool(verbose)]
    if let pattern = args.first { p["pattern"] = .string(pattern) }
    func show(_ n: JSON) {
        guard n["method"]?.stringValue == HostMethod.monitorEvent, let e = n["params"] else { return }
        print(json ? text(e) : monitorLine(e, verbose: verbose))
    }
    follow(
        reconnect: reconnect, lost: "the host closed the connection (a monitor that does not keep up is disconnected)",
        setup: { c in
            let answer = try c.call(HostMethod.monitor, .object(p), timeoutMs: timeoutMs)
            Log.writeRaw("pylonctl: monitoring \(fmt(answer["pattern"])) (Ctrl-C to stop)\n")
        }, show: show)
}

@MainActor func reloadCommand(json: Bool) {
    let r = call(HostMethod.reload, nil)
    if json {
        print(text(r))
        return
    }
    var l = "reloaded \(fmt(r["config"]))"
    for (k, label) in [("added", "added"), ("removed", "removed"), ("restarted", "restarted")] {
        let names = (r[k]?.arrayValue ?? []).compactMap { $0.stringValue }
        if !names.isEmpty { l += "; \(label): " + names.joined(separator: ", ") }
    }
    print(l)
    for n in r["notApplied"]?.arrayValue ?? [] {
        Log.writeRaw("pylonctl: not applied: \(fmt(n["setting"])): \(fmt(n["reason"]))\n")
    }
}

/// Polls `bus.status` until the host and every enabled plugin run, a plugin is failed, or the
/// time is up. A host that is not there yet (socket missing or refusing) is waited for too.
@MainActor func waitReadyCommand(timeoutMs: Int) {
    let deadline = Loop.hrtimeNs + UInt64(timeoutMs) * 1_000_000
    var missing = "the host did not answer"
    while true {
        let left = Loop.hrtimeNs < deadline ? Int((deadline - Loop.hrtimeNs) / 1_000_000) : 0
        if left > 0, let client = try? SyncClient(path: socketPath) {
            do {
                let s = try client.call(HostMethod.status, nil, timeoutMs: max(left, 1))
                let plugins = s["plugins"]?.arrayValue ?? []
                if let f = plugins.first(where: { $0["state"]?.stringValue == "failed" }) {
                    fail("plugin \(fmt(f["name"])) is failed: \(fmt(f["failed_reason"] ?? f["last_exit"]))", code: 3)
                }
                let waiting = plugins.filter { $0["state"]?.stringValue != "running" }
                if s["state"]?.stringValue == "running" && waiting.isEmpty { return }
                missing =
                    s["state"]?.stringValue != "running"
                    ? "the host is \(fmt(s["state"]))"
                    : "not running: " + waiting.map { "\(fmt($0["name"])) (\(fmt($0["state"])))" }.joined(separator: ", ")
            } catch let e as ClientError where e.kind == .timeout {
                missing = "no answer to bus.status"
            } catch {
                missing = "\(error)"
            }
        } else if left > 0 {
            missing = "cannot connect to \(socketPath)"
        }
        if Loop.hrtimeNs >= deadline {
            fail("not ready after \(Double(timeoutMs) / 1000) s: \(missing)", code: 75)
        }
        usleep(100_000)
    }
}
