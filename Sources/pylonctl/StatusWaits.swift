import PylonClientKit

/// `pylonctl status`'s lines about MA AppKeys whose start (or identify) waits for the network
/// (`ma.status`, `waitingForNetwork`): since when, the attempts, the next try and the events
/// parked behind it. None when MA is not running or nothing waits.
@MainActor func maWaitLines(_ status: JSON, nowMs: Int64) -> [String] {
    let running = (status["plugins"]?.arrayValue ?? []).contains {
        $0["name"]?.stringValue == "ma" && $0["state"]?.stringValue == "running"
    }
    guard running, let client = try? SyncClient(path: socketPath), let ma = try? client.call("ma.status", nil, timeoutMs: 5_000)
    else { return [] }
    var lines: [String] = []
    for (appKey, a) in (ma["appKeys"]?.objectValue ?? JSONObject()).sorted(by: { $0.key < $1.key }) {
        guard let w = a["waitingForNetwork"], w != .null else { continue }
        let since = w["since"]?.intValue.map { "\(max(0, nowMs - $0) / 1000)s" } ?? "?"
        let next = w["nextTryMs"]?.intValue.map { "\(max(0, $0 - nowMs) / 1000)s" } ?? "?"
        lines.append(
            "ma: \(appKey) waiting for the network for \(since): \(fmt(w["attempts"])) attempts, next try in \(next), "
                + "\(fmt(a["parkedEvents"])) events parked (\(fmt(w["reason"])))")
    }
    return lines
}
