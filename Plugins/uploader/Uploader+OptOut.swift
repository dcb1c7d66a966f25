import PylonPluginKit

/// Opt-outs reach the server (docs/UPLOADER.md, "Opt-out reports"). When the device's master
/// switch (`device`) or an app's collection switch (`ma:<appKey>`) changes, the uploader queues
/// one record on stream `pylon.consent` — `{"switch", "granted", "timeMs"}`, nothing collected —
/// and sends it like any other, so a device offline when the user opts out tells the backend
/// once it is back. The stream is the uploader's own (no caller may write it but an admin) and
/// its switch (`pylon:consent`) is never denied: the report of a denial must go out while
/// collection is denied. What was last reported per switch is kept in
/// `<stateDir>/consent-reported.json`, so a change made while the uploader was not running is
/// reported at its next start.
enum OptOutReports {
    static let stream = "pylon.consent"
    /// The switch the stream's records fall under; `Uploader.allows` never refuses it.
    static let consentKey = "pylon:consent"
    static let owner = StreamOwner.plugin("uploader")
    static let stateFile = "consent-reported.json"
    /// Longest state file read (one entry per AppKey switch denied, plus `device`).
    static let maxStateBytes = 1 << 20

    /// The switches reported: the master switch and the apps' collection switches.
    static func covers(_ key: String) -> Bool {
        key == "device" || (key.hasPrefix("ma:") && key.utf8.count > 3)
    }

    /// The record's `data`.
    static func data(_ key: String, granted: Bool, timeMs: Int64) -> JSON {
        ["switch": .string(key), "granted": .bool(granted), "timeMs": .int(timeMs)]
    }
}

extension Uploader {
    /// Whether records under switch `key` may be queued and sent: the host's view, except for
    /// the opt-out reports' own switch.
    func allows(_ key: String) -> Bool {
        key == OptOutReports.consentKey || plugin.isConsentGranted(key)
    }

    /// A consent change from the host: reported when it is one of `OptOutReports.covers` and
    /// differs from what was last reported.
    func reportConsent(key: String, granted: Bool) {
        guard OptOutReports.covers(key) else { return }
        var reported = loadReported()
        guard (reported[key] ?? true) != granted else { return }
        guard queueOptOut(key, granted: granted) else { return }
        reported[key] = granted ? nil : false
        saveReported(reported)
    }

    /// At start: every covered switch whose value (the host's snapshot) differs from what was
    /// last reported (a change made while the uploader was stopped).
    func reportConsentAtStart() {
        var current: [String: Bool] = [:]
        for (k, v) in plugin.consent where OptOutReports.covers(k) && k != "device" { current[k] = v }
        current["device"] = plugin.consentMaster
        var reported = loadReported()
        var changed = false
        for k in Set(current.keys).union(reported.keys).sorted() {
            let now = current[k] ?? true
            guard (reported[k] ?? true) != now, queueOptOut(k, granted: now) else { continue }
            reported[k] = now ? nil : false
            changed = true
        }
        if changed { saveReported(reported) }
    }

    /// Queues one report durably (a group commit of its own, after the enqueues waiting),
    /// within the disk cap and the uploader's share of it; false when it could not.
    private func queueOptOut(_ key: String, granted: Bool) -> Bool {
        commit()  // enqueues accepted before keep their place
        let stream = OptOutReports.stream
        let owner = OptOutReports.owner
        let wall = System.wallClockMs()
        let id = Array(("consent-" + System.randomHex(12)).utf8)
        let body = Array(OptOutReports.data(key, granted: granted, timeMs: wall).serialized.utf8)
        let bytes = Chunk.estimatedCharge(idBytes: id.count, dataBytes: body.count)
        let newStream = recordedOwners[stream] == nil
        if let e = ledger.admit(owner, bytes: bytes, newStream: newStream, totalBytes: diskBytes, limits: limits) {
            plugin.log.error("opt-out report not queued", ["switch": key, "error": e.message])
            return false
        }
        if newStream, !register(stream, owner: owner) { return false }
        let added: [(added: Int, bytes: Int)]
        do {
            added = try id.withUnsafeBufferPointer { i in
                try body.withUnsafeBufferPointer { b in
                    try i.withMemoryRebound(to: CChar.self) { ic in
                        try b.withMemoryRebound(to: CChar.self) { bc in
                            let r = PendingRecord(
                                id: ic.baseAddress!, idLength: Int32(ic.count), ts: wall, body: bc.baseAddress!,
                                bodyLength: Int32(bc.count))
                            return try store.commit(
                                [UploaderStore.Enqueue(stream: stream, consent: OptOutReports.consentKey, records: [r])], nowMs: wall)
                        }
                    }
                }
            }
        } catch {
            plugin.log.error("opt-out report not queued", ["switch": key, "error": "\(error)"])
            return false
        }
        let n = added.first?.added ?? 0
        let stored = added.first?.bytes ?? 0
        ledger.add(owner, stored)
        streams[stream, default: newState(stream)].committed(added: n, bytes: stored, now: now)
        diskBytes += stored
        plugin.log.info("consent change queued for the backend", ["switch": key, "granted": granted])
        pumpAll()
        return true
    }

    private var reportedPath: String { (plugin.stateDir.isEmpty ? "." : plugin.stateDir) + "/" + OptOutReports.stateFile }

    /// Switches last reported denied (absent: granted, or never reported).
    private func loadReported() -> [String: Bool] {
        guard let bytes = System.readFile(reportedPath, limit: OptOutReports.maxStateBytes),
            let o = (try? JSON.parse(String(decoding: bytes, as: UTF8.self)))?.objectValue
        else { return [:] }
        var out: [String: Bool] = [:]
        for (k, v) in o where OptOutReports.covers(k) { if let b = v.boolValue { out[k] = b } }
        return out
    }

    private func saveReported(_ r: [String: Bool]) {
        var obj = JSONObject()
        for (k, v) in r.sorted(by: { $0.key < $1.key }) { obj[k] = .bool(v) }
        let o = JSON.object(obj)
        if !System.writeFileAtomically(reportedPath, Array(o.serialized.utf8), mode: 0o600) {
            plugin.log.error("cannot record the consent reported", ["path": reportedPath])
        }
    }
}
