import Foundation
import PylonClientKit
import PylonProtocol
import TestSupport
import Testing

/// `gtm.push` answers `queued: true` only once every hit its tags made is durable (stored by
/// the uploader, or kept in gtm.db): a SIGKILL of the gtm plugin or of the host right after
/// the answers loses none of them, and each arrives at the backend once.
@Suite(.serialized) struct GTMDurableHitsTests {
    static let container = "GTM-DUR"

    /// A container whose `_ua` tag fires on every `hit` event, carrying the pushed `n`.
    static func backend() throws -> TestBackend {
        let b = try TestBackend()
        let res = gtmResource(
            [:], macros: [["function": "_e", "instance_name": "event"], ["function": "_v", "instance_name": "n", "name": "n"]],
            predicates: [["function": "_eq", "arg0": ["macro", 0], "arg1": "hit"]],
            tags: [["function": "_ua", "trackingId": "UA-D", "eventLabel": ["macro", 1]]],
            rules: [[["if", 0], ["add", 0]]])
        try b.publishContainer(container, res)
        return b
    }

    /// The gtm plugins; with `uploaderDown` the uploader is not restarted once it exits.
    static func plugins(_ b: TestBackend, uploaderTemporary: Bool) throws -> [JSON] {
        var plugins = TestHost.gtmPlugins(b, defaults: try defaultsDir([:]))
        if uploaderTemporary {
            var upl = try #require(plugins[0].objectValue)
            upl["restart"] = "temporary"  // stays down until bus.restart
            plugins[0] = .object(upl)
        }
        return plugins
    }

    /// Sends `gtm.push {event: hit, n}` for each of `ns` at once and returns those answered
    /// `queued: true` (every one must be).
    func burst(_ c: SyncClient, _ ns: ClosedRange<Int>) throws -> Set<String> {
        for n in ns {
            try c.sendLine(#"{"jsonrpc":"2.0","id":\#(n),"method":"gtm.push","params":{"data":{"event":"hit","n":\#(n)}}}"#)
        }
        var acked = Set<String>()
        var answered = 0
        while answered < ns.count {
            let m = try #require(try c.readMessage(timeoutMs: 20_000), "answered so far: \(answered)")
            guard let id = m["id"]?.intValue else { continue }
            answered += 1
            #expect(m["result"]?["queued"] == .bool(true), "\(m.serialized)")
            #expect(m["result"]?["containers"] == .int(1), "\(m.serialized)")
            if m["result"]?["queued"] == .bool(true) { acked.insert(String(id)) }
        }
        return acked
    }

    /// The `n` of each hit the backend holds (a label seen twice is listed twice).
    func storedLabels(_ b: TestBackend, atLeast n: Int, _ c: () throws -> SyncClient) throws -> [String] {
        var labels: [String] = []
        try waitUntil(timeout: 30) {
            _ = try? c().call("uploader.flush", ["stream": "gtm.hits", "wait": true])
            labels = try b.records("gtm.hits").compactMap { r in
                r["data"]?["tag"]?["eventLabel"].map { $0.stringValue ?? $0.serialized }
            }
            return labels.count >= n
        }
        return labels
    }

    @Test func hitsAcknowledgedWhileTheUploaderIsDownSurviveAKill9OfGTM() throws {
        let b = try Self.backend()
        let h = try TestHost(plugins: try Self.plugins(b, uploaderTemporary: true), extra: MAOfflineTests.hostExtra)
        let c = try h.client()
        #expect(try c.open(Self.container)["source"] == "network")
        let upid = try #require(try h.plugin("uploader")["pid"]?.intValue)
        kill(Int32(upid), SIGKILL)
        try waitUntil(timeout: 10) { try h.plugin("uploader")["state"] != "running" }
        let acked = try burst(c, 1...40)
        let pid = try #require(try h.plugin("gtm")["pid"]?.intValue)
        kill(Int32(pid), SIGKILL)
        try h.waitForPlugin("gtm", restartsAtLeast: 1)
        _ = try h.client().call("bus.restart", ["plugin": "uploader"])
        try h.waitForPlugin("uploader")
        let labels = try storedLabels(b, atLeast: acked.count) { try h.client() }
        #expect(Set(labels) == acked)
        #expect(labels.count == acked.count, "each hit once")
        try waitUntil(timeout: 10) { try h.client().call("gtm.status")["hitsHeld"] == .int(0) }
    }

    @Test func hitsAcknowledgedRightBeforeAKill9OfTheHostArriveOnceAfterItsRestart() throws {
        let b = try Self.backend()
        let plugins = try Self.plugins(b, uploaderTemporary: true)
        let h = try TestHost(plugins: plugins, extra: MAOfflineTests.hostExtra)
        let c = try h.client()
        _ = try c.open(Self.container)
        // First a burst while the uploader runs (each answered once the uploader has its hit),
        // then one while it is down (each answered once its hit is in gtm.db); then the host dies.
        var acked = try burst(c, 1...40)
        let upid = try #require(try h.plugin("uploader")["pid"]?.intValue)
        kill(Int32(upid), SIGKILL)
        try waitUntil(timeout: 10) { try h.plugin("uploader")["state"] != "running" }
        acked.formUnion(try burst(c, 41...80))
        let gtmPid = try #require(try h.plugin("gtm")["pid"]?.intValue)
        h.kill9()
        kill(Int32(gtmPid), SIGKILL)  // in case it outlives its host
        try waitUntil(timeout: 10) { !isAlive(Int32(gtmPid)) }
        let h2 = try TestHost(plugins: plugins, extra: MAOfflineTests.hostExtra, stateDir: h.stateDir)
        try h2.waitForPlugin("gtm")
        try h2.waitForPlugin("uploader")
        let labels = try storedLabels(b, atLeast: acked.count) { try h2.client() }
        #expect(Set(labels) == acked)
        #expect(labels.count == acked.count, "each hit once")
    }
}
