import Foundation
import PylonClientKit
import TestSupport
import Testing

/// Opt-outs reach the server (issue 33): a denied collection switch is reported by the uploader
/// on stream `pylon.consent`, kept and retried like any record — also while the master switch
/// is denied — and the backend lists it among the opt-outs. Real host, uploader and backend.
@Suite(.serialized) struct OptOutReportTests {
    static func plugins(_ b: TestBackend) -> [JSON] {
        [TestHost.uploader(b, config: ["streams": ["pylon.consent": ["intervalMs": 100]]])]
    }

    /// The consent records the backend holds: (switch, granted).
    static func reports(_ b: TestBackend) throws -> [(String, Bool)] {
        try b.records("pylon.consent").compactMap { r in
            guard let s = r["data"]?["switch"]?.stringValue, let g = r["data"]?["granted"]?.boolValue else { return nil }
            return (s, g)
        }
    }

    @Test func anAppsDeniedSwitchReachesTheBackendAndIsListed() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: Self.plugins(b))
        let c = try h.client()
        _ = try c.call("consent.set", ["key": "ma:optapp", "granted": false])
        try waitUntil(timeout: 15) { try Self.reports(b).contains { $0 == ("ma:optapp", false) } }
        let rec = try #require(try b.records("pylon.consent").first)
        #expect(rec["data"]?["timeMs"]?.intValue != nil)
        #expect(rec["data"]?.objectValue?.count == 3, "the switch, its value and the time: nothing collected")
        let optOuts = try b.request("GET", "/v1/admin/optouts").json["items"]?.arrayValue ?? []
        #expect(optOuts.contains { $0["appKey"] == "optapp" && $0["switch"] == "ma:optapp" })
        // Granted again: reported too (the backend removes the opt-out); a repeat of the same
        // value is not reported again.
        _ = try c.call("consent.set", ["key": "ma:optapp", "granted": true])
        try waitUntil(timeout: 15) { try Self.reports(b).contains { $0 == ("ma:optapp", true) } }
        #expect(try Self.reports(b).count == 2)
        // Nobody but the uploader (or an admin) writes the stream: another plugin's or user's
        // enqueue is refused by its owner rule, so opt-outs cannot be forged from the bus.
        #expect(try c.call("uploader.status")["streams"]?["pylon.consent"]?["owner"] == "plugin:uploader")
    }

    /// The master switch denied: every other stream is purged, but the report of the denial is
    /// kept and retried until the backend takes it — also through a later consent change, which
    /// makes every queued record of a denied switch final (sent once, then purged).
    @Test func theMasterSwitchDeniedIsReportedAndRetriedWhileCollectionIsOff() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: Self.plugins(b))
        let c = try h.client()
        try b.faults(["failNext": 100_000, "status": 503])
        _ = try c.call("consent.set", ["key": "device", "granted": false])
        try waitUntil(timeout: 10) {
            let s = try c.call("uploader.status")["streams"]?["pylon.consent"]?["lastResult"]?.stringValue
            return s?.contains("503") == true
        }
        func stream() throws -> JSON { try c.call("uploader.status")["streams"]?["pylon.consent"] ?? .null }
        let attempts = try stream()["attempts"]?.intValue ?? 0
        _ = try c.call("consent.set", ["key": "ma:other", "granted": false])
        // One more refused attempt after the change (or the queue gone) before the backend is back.
        try waitUntil(timeout: 10) {
            let st = try stream()
            return (st["attempts"]?.intValue ?? 0) > attempts || (st["queued"] == 0 && st["pendingBatches"] == 0)
        }
        try b.clearFaults()
        try waitUntil(timeout: 20) {
            let r = try Self.reports(b)
            return r.contains { $0 == ("device", false) } && r.contains { $0 == ("ma:other", false) }
        }
        let optOuts = try b.request("GET", "/v1/admin/optouts").json["items"]?.arrayValue ?? []
        #expect(optOuts.contains { $0["switch"] == "device" })
    }

    /// A change made while the uploader was not running is reported at its next start.
    @Test func aChangeWhileTheUploaderWasNotRunningIsReportedAtStart() throws {
        let b = try TestBackend()
        let first = try TestHost(plugins: Self.plugins(b))
        _ = try first.client().call("uploader.status")
        #expect(first.stop() == 0)
        // The same state directory, without the uploader: the switch changes meanwhile.
        let without = try TestHost(plugins: [TestHost.echo()], stateDir: first.stateDir)
        _ = try without.client().call("consent.set", ["key": "ma:later", "granted": false])
        #expect(without.stop() == 0)
        #expect(try Self.reports(b).isEmpty)
        let again = try TestHost(plugins: Self.plugins(b), stateDir: first.stateDir)
        try waitUntil(timeout: 20) { try Self.reports(b).contains { $0 == ("ma:later", false) } }
        _ = again
    }
}
