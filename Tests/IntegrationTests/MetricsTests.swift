import Foundation
import PylonClientKit
import TestSupport
import Testing

/// The Prometheus text of `pylonctl metrics` and `metricsTextfile`: accepted by `promtool check
/// metrics` (Debian's `prometheus` package; `make deps` installs it) and in Prometheus
/// conventions: base units, `_total` counters, singular labels, no configuration values,
/// `pylon_build_info`, push's counters.
@Suite(.serialized) struct MetricsTests {
    static let promtool = promtoolPath

    /// promtool's exit status and what it printed.
    func promtoolCheck(_ text: String) throws -> (Int32, String) {
        try TestSupport.promtoolCheck(text, promtool: MetricsTests.promtool!)
    }

    /// Status replies shaped as the plugins answer them (fields copied from their `status`).
    static let pluginStatuses: [(String, JSON)] = [
        (
            "uploader",
            [
                "diskBytes": 4096, "maxDiskBytes": 67_108_864, "fsync": "normal", "commits": 12,
                "streams": [
                    "demo": [
                        "owner": "uid:0", "queued": 3, "queuedBytes": 120, "diskBytes": 4096, "oldestAgeMs": 1500, "inFlight": 0,
                        "pendingBatches": 0, "lastResult": "ok", "retryDelayMs": 0, "retryInMs": 0, "attempts": 4, "delivered": 9,
                        "deadLetters": 1, "deadLetterBytes": 40, "setAside": 1, "refusedConsent": 0, "maxCount": 50, "intervalMs": 10000,
                        "maxBatchBytes": 524_288, "endpoint": "http://x/y", "delivery": "post",
                    ]
                ],
                "owners": [
                    "uid:0": ["owner": "uid:0", "diskBytes": 4096, "maxDiskBytesPerOwner": 1, "streams": 1, "maxStreamsPerOwner": 2]
                ],
            ]
        ),
        (
            "ma",
            [
                "backend": "http://x", "heldEvents": 2, "maxHeldEvents": 1000, "waitingEvents": 0, "eventsWaitingForStart": 0,
                "maxEnqueuesInFlight": 8, "enqueues": 5, "enqueuedEvents": 7,
                "appKeys": [
                    "kiosk": [
                        "started": true, "collectionEnabled": true, "pendingStarts": 0, "queuedChannelValues": 0, "session": "s",
                        "background": false, "sessionTimeoutS": 30, "reportIntervalS": 10, "clients": 1,
                    ]
                ],
            ]
        ),
        (
            "push",
            [
                "code": 0, "connection": "connected", "registration": "registered", "deviceRegistered": true,
                "inbox": ["count": 1, "bytes": 100, "maxCount": 10000, "maxBytes": 8_388_608],
                "counters": [
                    "received": 5, "delivered": 4, "acknowledged": 3, "duplicates": 1, "expired": 0, "malformed": 2, "dropped": 0,
                    "redelivered": 0, "failedDeliveries": 0, "schemaMismatch": 0, "unknownFields": 0, "backendErrors": 0,
                    "opensReported": 0, "brokerConnects": 1, "brokerDisconnects": 0,
                ],
            ]
        ),
        ("gtm", ["hitsHeld": 0, "queuedPushes": 0, "totals": ["pushes": 3, "tagsFired": 2, "hitsQueued": 1]]),
    ]

    @Test func pluginStatusesFollowPrometheusConventions() throws {
        let h = try TestHost(plugins: [TestHost.echo()])
        let text = MetricsText.render(bus: try h.status(), plugins: MetricsTests.pluginStatuses)
        for want in [
            #"pylon_build_info{version="#, "pylon_push_received_total 5", "pylon_push_delivered_total 4", "pylon_push_acknowledged_total 3",
            "pylon_push_duplicates_total 1", "pylon_push_expired_total 0", "pylon_push_malformed_total 2", "pylon_push_inbox_messages 1",
            #"pylon_uploader_stream_delivered_records_total{stream="demo"} 9"#,
            #"pylon_uploader_stream_oldest_age_seconds{stream="demo"} 1.5"#,
            #"pylon_ma_app_clients{app_key="kiosk"} 1"#, "# TYPE pylon_push_received_total counter", "pylon_gtm_pushes_total 3",
            #"pylon_plugin_up{plugin="echo"} 1"#, "pylon_resident_memory_bytes",
        ] {
            #expect(text.contains(want), "missing \(want)")
        }
        // Configuration values and plural labels are gone; so are millisecond and KiB units.
        for gone in ["max_count", "interval", "max_held", "max_disk", "streams=", "app_keys=", "_ms", "kib", "pylon_push_code"] {
            #expect(!text.contains(gone), "\(gone) is still exported")
        }
        guard MetricsTests.promtool != nil else {
            print("SKIPPED: promtool not installed (Debian package prometheus; make deps installs it)")
            return
        }
        let (status, said) = try promtoolCheck(text)
        #expect(status == 0 && said.isEmpty, "promtool: \(said)")
    }

    /// The host's own textfile (metricsTextfile), as node_exporter reads it.
    @Test func theTextfileIsValidForPromtool() throws {
        let dir = NSTemporaryDirectory() + "pylon-metrics-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let file = dir + "/pylon.prom"
        let h = try TestHost(plugins: [TestHost.echo()], extra: ["metricsTextfile": .string(file), "metricsIntervalMs": 1000])
        try waitUntil(timeout: 15) { FileManager.default.fileExists(atPath: file) }
        let text = try String(contentsOfFile: file, encoding: .utf8)
        #expect(text.contains("# TYPE pylon_routed_total counter") && text.contains("pylon_build_info"), "\(text)")
        _ = h
        guard MetricsTests.promtool != nil else {
            print("SKIPPED: promtool not installed (Debian package prometheus; make deps installs it)")
            return
        }
        let (status, said) = try promtoolCheck(text)
        #expect(status == 0 && said.isEmpty, "promtool: \(said)")
    }

    /// The tag manager's totals reach the textfile: the exporter asks as an admin (it used to ask
    /// as nobody, and the tag manager answered with an empty caller's state, without `totals`).
    @Test func theTagManagersTotalsReachTheTextfile() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.gtmPlugins(b, defaults: try defaultsDir([:])))
        let file = h.dir + "/gtm.prom"
        var cfg = try JSON.parse(try String(contentsOfFile: h.configPath, encoding: .utf8)).objectValue!
        cfg["metricsTextfile"] = .string(file)
        cfg["metricsIntervalMs"] = 1000
        try JSON.object(cfg).serialized.write(toFile: h.configPath, atomically: true, encoding: .utf8)
        let c = try h.client()
        #expect(try c.call("bus.reload", nil)["notApplied"] == [])
        _ = try c.call("gtm.push", ["data": ["event": "tap"]])
        _ = try c.call("gtm.push", ["data": ["event": "tap"]])
        do {
            try waitUntil(timeout: 15) {
                (try? String(contentsOfFile: file, encoding: .utf8))?.contains("pylon_gtm_pushes_total 2") == true
            }
        } catch {
            Issue.record("\(error): \((try? String(contentsOfFile: file, encoding: .utf8)) ?? "no file")")
        }
    }

    /// A reload applies `metricsTextfile` (it used to be ignored silently until a restart).
    @Test func aReloadStartsTheTextfile() throws {
        let h = try TestHost(plugins: [TestHost.echo()])
        let file = h.dir + "/reloaded.prom"
        var cfg = try JSON.parse(try String(contentsOfFile: h.configPath, encoding: .utf8)).objectValue!
        cfg["metricsTextfile"] = .string(file)
        cfg["metricsIntervalMs"] = 1000
        try JSON.object(cfg).serialized.write(toFile: h.configPath, atomically: true, encoding: .utf8)
        let r = try h.client().call("bus.reload", nil)
        #expect(r["notApplied"] == [], "\(r)")
        try waitUntil(timeout: 15) { FileManager.default.fileExists(atPath: file) }
        #expect(try String(contentsOfFile: file, encoding: .utf8).contains("pylon_up 1"))
    }
}
