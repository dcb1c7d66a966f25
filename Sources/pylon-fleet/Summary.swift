import PylonCore

/// The end-of-run figures, as text and as one JSON object (`--json`).
struct FleetSummary {
    var json: JSON
    var text: String
    /// 0: every acknowledged event read back once, every push delivered once; 1: an
    /// acknowledged event lost or stored twice, or a push delivered to an app twice; 3: not
    /// lost but incomplete (events unacknowledged or pushes undelivered at the drain deadline,
    /// or the stream not read back).
    var exitCode: Int32
}

extension Fleet {
    func summary() -> FleetSummary {
        let elapsedS = Double(now - startMs) / 1000
        let loadS = Double(min(now, startMs + Int64(options.durationS) * 1000) - startMs) / 1000
        let acked = ackedEvents
        let generated = generatedEvents
        // Unknown (nil) when the stream was not read back.
        var lost: Int64?
        if let tally { lost = devices.reduce(0) { $0 + tally.lost(device: $1.index, acked: $1.acked) } }
        let unacked = devices.reduce(Int64(0)) { $0 + $1.pendingEvents }
        let rejected = devices.reduce(Int64(0)) { $0 + $1.rejected }
        let throttled = devices.reduce(Int64(0)) { $0 + $1.throttled }
        let pushLost = pushExpected - pushDelivered
        var lat: JSONObject = [:]
        var latText = ""
        for k in ["device", "user", "broadcast"] {
            let h = latency[k] ?? LatencyHistogram()
            let sent = sends.values.filter { $0.kind == k && !$0.failed }.count
            func v(_ p: Double) -> JSON { h.percentile(p).map { .double(($0 / 1000 * 10).rounded() / 10) } ?? .null }
            lat[k] = [
                "sends": .int(Int64(sent)), "deliveries": .int(Int64(h.count)), "p50Ms": v(50), "p99Ms": v(99), "maxMs": v(100),
                "histogram": h.sparse, "maxUs": .int(Int64(h.count > 0 ? h.maxMicrosSeen : 0)),
            ]
            func t(_ p: Double) -> String { h.percentile(p).map { Format.ms($0 / 1000) } ?? "-" }
            latText += "  push \(k): \(sent) sends, \(h.count) deliveries, p50 \(t(50)), p99 \(t(99)), max \(t(100))\n"
        }
        var procs: [JSON] = []
        var procText = ""
        for p in procLast {
            let peak = procPeak[p.name] ?? (0, 0)
            procs.append([
                "name": .string(p.name), "pid": .int(Int64(p.pid)), "cpu": .double((p.cpu * 1000).rounded() / 1000),
                "rssKiB": .int(Int64(p.rssKiB)), "peakCpu": .double((peak.cpu * 1000).rounded() / 1000),
                "peakRssKiB": .int(Int64(peak.rssKiB)),
            ])
            procText +=
                "  \(p.name) (pid \(p.pid)): cpu \(Format.fixed(p.cpu * 100, 0))% (peak \(Format.fixed(peak.cpu * 100, 0))%), rss \(p.rssKiB / 1024) MB (peak \(peak.rssKiB / 1024) MB)\n"
        }
        var outages: [JSON] = []
        var outText = ""
        for o in connectivity.outages {
            let startS = Double(o.startMs - startMs) / 1000
            outages.append([
                "atS": .double((startS * 10).rounded() / 10), "lowest": .int(Int64(o.lowest)),
                "reconnectedAfterS": o.durationMs.map { .double((Double($0) / 100).rounded() / 10) } ?? .null,
            ])
            outText +=
                "  outage at \(Format.fixed(startS, 1)) s: down to \(o.lowest) connected, all back after \(o.durationMs.map { Format.fixed(Double($0) / 1000, 1) + " s" } ?? "never (still short at the end)")\n"
        }
        let storedRead = tally?.read
        let dup = tally?.duplicates ?? 0
        var code: Int32 = 0
        if (lost ?? 0) > 0 || dup > 0 || pushAppDuplicates > 0 {
            code = 1
        } else if unacked > 0 || pushLost > 0 || tally == nil || verifyError != nil {
            code = 3
        }
        var errs = JSONObject()
        for (k, v) in httpErrors.sorted(by: { $0.key < $1.key }) { errs[k] = .int(Int64(v)) }
        let ackS = Double((drainedAtMs ?? now) - startMs) / 1000
        let ackRate = ackS > 0 ? Double(acked) / ackS : 0
        let j: JSON = [
            "runId": .string(options.runId), "name": .string(options.processName), "firstDevice": .int(Int64(options.firstDevice)),
            "devices": .int(Int64(devices.count)), "ratePerDevice": .double(options.ratePerDevice),
            "durationS": .double(elapsedS), "loadS": .double(loadS),
            "connected": .int(Int64(connectedCount)), "registered": .int(Int64(registered)),
            "allConnectedAfterS": readyAllAtMs.map { .double(Double($0 - startMs) / 1000) } ?? .null,
            "fdLimit": fdNote.map { .string($0) } ?? .null,
            "events": [
                "generated": .int(generated), "acked": .int(acked), "unacked": .int(unacked), "rejected": .int(rejected),
                "throttled": .int(throttled), "storedRead": storedRead.map { .int($0) } ?? .null, "lost": lost.map { .int($0) } ?? .null,
                "duplicates": .int(dup), "foreign": .int(tally?.foreign ?? 0), "peer": .int(tally?.peer ?? 0),
                "ackedPerS": .double(ackRate.rounded()), "peakAckedPerS": .double(peakAckedRate.rounded()),
                "peakStoredPerS": .double(peakStoredRate.rounded()),
                "batchesPosted": .int(Int64(batchesPosted)), "batchesFailed": .int(Int64(batchesFailed)),
            ],
            "push": [
                "expected": .int(Int64(pushExpected)), "delivered": .int(Int64(pushDelivered)), "lost": .int(Int64(pushLost)),
                "appDuplicates": .int(Int64(pushAppDuplicates)), "redeliveredDropped": .int(Int64(pushRedelivered)),
                "malformed": .int(Int64(pushMalformed)), "foreign": .int(Int64(pushForeign)), "latency": .object(lat),
                "peerBroadcasts": .int(Int64(sends.values.filter(\.peer).count)),
            ],
            "mqtt": [
                "connects": .int(Int64(mqttConnects)), "lostOrRefused": .int(Int64(mqttDisconnects)),
                "brokerMoves": .int(Int64(brokerMoves)),
            ],
            "outages": .array(outages),
            "httpErrors": .object(errs),
            "setupFailures": .int(Int64(setupFailures)),
            "processes": .array(procs),
            "verifyError": verifyError.map { .string($0) } ?? .null,
            "exitCode": .int(Int64(code)),
        ]
        var t = "\(options.processName) summary (run \(options.runId), \(Format.fixed(elapsedS, 1)) s)\n"
        t += "  devices: \(devices.count), connected at the end \(connectedCount), registered \(registered)"
        t += readyAllAtMs.map { ", all connected after \(Format.fixed(Double($0 - startMs) / 1000, 1)) s\n" } ?? ", never all connected\n"
        if let fdNote { t += "  fd limit: \(fdNote)\n" }
        t += "  events: generated \(generated), acknowledged \(acked) (\(Format.fixed(ackRate, 0))/s over the load and the drain"
        t += ", peak \(Format.fixed(peakAckedRate, 0))/s), stored peak \(Format.fixed(peakStoredRate, 0))/s\n"
        t +=
            "  read back: \(storedRead.map(String.init) ?? "not read") — lost \(lost.map(String.init) ?? "unknown"), duplicates \(dup), unacknowledged at the end \(unacked)"
        t += ", refused \(rejected), throttled \(throttled)\n"
        if let verifyError { t += "  verify: \(verifyError)\n" }
        t += "  push: \(pushDelivered)/\(pushExpected) delivered, lost \(pushLost), duplicate deliveries to apps \(pushAppDuplicates)"
        t += " (redelivered and dropped by id: \(pushRedelivered))\n"
        t += latText
        t += "  mqtt: \(mqttConnects) connects, \(mqttDisconnects) connections lost or refused, \(brokerMoves) broker moves\n"
        t += outText
        if !httpErrors.isEmpty {
            t += "  http errors: " + httpErrors.sorted { $0.key < $1.key }.map { "\($0.key) ×\($0.value)" }.joined(separator: ", ") + "\n"
        }
        t += procText
        t += "  result: " + (code == 0 ? "OK" : code == 1 ? "FAILED (loss or duplicates)" : "INCOMPLETE") + "\n"
        return FleetSummary(json: j, text: t, exitCode: code)
    }
}
