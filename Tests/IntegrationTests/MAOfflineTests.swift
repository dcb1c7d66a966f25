import Foundation
import PylonClientKit
import PylonProtocol
import TestSupport
import Testing

/// Offline MA (issue 32 item 1; docs/MA.md "Offline"): with the backend paused or failing, a
/// start is answered pending (-32008) and events are answered once parked on disk; when the
/// backend answers again every acknowledged event arrives once, in order, under the start's
/// EUID; a client event id makes a retry safe.
@Suite(.serialized) struct MAOfflineTests {
    /// The host's deadline far away: every answer below comes from the plugin, not from it.
    static let hostExtra: JSONObject = ["limits": ["requestTimeoutMs": 120_000]]

    func host(_ b: TestBackend, _ ma: JSONObject = [:]) throws -> TestHost {
        var config: JSONObject = ["pendingAfterMs": 300]
        for (k, v) in ma { config[k] = v }
        return try TestHost(plugins: TestHost.maPlugins(b, ma: config), extra: Self.hostExtra)
    }

    /// Reads `n` answers on `c`, by id.
    func answers(_ c: SyncClient, _ n: Int) throws -> [Int64: JSON] {
        var out: [Int64: JSON] = [:]
        while out.count < n {
            let m = try #require(try c.readMessage(timeoutMs: 20_000), "answers so far: \(out.keys.sorted())")
            if let id = m["id"]?.intValue { out[id] = m }
        }
        return out
    }

    /// The AppKey's events named `name`, once the backend holds `count` of them.
    func stored(_ b: TestBackend, _ appKey: String, _ name: String, count: Int, _ c: SyncClient) throws -> [JSON] {
        var recs: [JSON] = []
        try waitUntil(timeout: 30) {
            recs = try b.maEvents(appKey, flushedBy: c).filter { $0["data"]?["event"] == .string(name) }
            return recs.count >= count
        }
        return recs
    }

    func euid(_ h: TestHost, _ appKey: String) throws -> JSON {
        var e: JSON = .null
        try waitUntil(timeout: 30) {
            e = try h.client().call("ma.euid", ["appKey": .string(appKey)])["euid"] ?? .null
            return e != .null
        }
        return e
    }

    @Test func aPausedBackendDelaysNoAnswerAndEventsArriveOnceInOrderUnderTheEUID() throws {
        let b = try TestBackend()
        let h = try host(b)
        let c = try h.client()
        let pid = b.process.processIdentifier
        kill(pid, SIGSTOP)
        defer { kill(pid, SIGCONT) }
        try c.sendLine(#"{"jsonrpc":"2.0","id":1,"method":"ma.start","params":{"appKey":"off1"}}"#)
        for i in 1...20 {
            try c.sendLine(
                #"{"jsonrpc":"2.0","id":\#(i + 1),"method":"ma.eventRecord","params":{"appKey":"off1","eventName":"e","eventId":"ev-\#(i)","property":{"n":\#(i)}}}"#
            )
        }
        // All answered while the backend is still paused: the events are on disk, the start
        // says it goes on.
        let got = try answers(c, 21)
        for i in 2...21 { #expect(got[Int64(i)]?["result"]?["code"] == .int(0), "\(got[Int64(i)]?.serialized ?? "")") }
        let start = try #require(got[1]?["error"])
        #expect(start["code"] == .int(Int64(RPCError.Code.pending.rawValue)))
        #expect(start["data"]?["pending"] == .bool(true))
        #expect(try h.client().call("ma.status")["appKeys"]?["off1"]?["parkedEvents"]?.intValue ?? 0 >= 20)
        kill(pid, SIGCONT)
        let e = try euid(h, "off1")
        let recs = try stored(b, "off1", "e", count: 20, c)
        #expect(recs.map { $0["data"]?["properties"]?["n"]?.intValue } == (1...20).map { Int64($0) })
        #expect(recs.map { $0["id"] } == (1...20).map { .string("c:ev-\($0)") })
        #expect(recs.allSatisfy { $0["data"]?["euid"] == e })
        #expect(try b.stream("ma.off1")["duplicateRecords"] == .int(0))
    }

    @Test func aRetriedEventIdIsStoredOnce() throws {
        let b = try TestBackend()
        let h = try host(b)
        let c = try h.client()
        #expect(code(try c.call("ma.start", ["appKey": "dup1"])) == 0)
        let event: JSON = ["appKey": "dup1", "eventName": "buy", "eventId": "order-7", "property": ["price": 5]]
        for _ in 0..<3 { #expect(code(try c.call("ma.eventRecord", event)) == 0) }
        #expect(try stored(b, "dup1", "buy", count: 1, c).count == 1)
        // Delivered, then sent again: still once.
        #expect(code(try c.call("ma.eventRecord", event)) == 0)
        // Offline: a retry parked behind a pending start, and a new event sent twice.
        try b.faults(["failNext": 1000, "status": 503])
        try c.sendLine(#"{"jsonrpc":"2.0","id":"s","method":"ma.start","params":{"appKey":"dup1"}}"#)
        let fresh: JSON = ["appKey": "dup1", "eventName": "buy", "eventId": "order-8"]
        for _ in 0..<2 { #expect(code(try c.call("ma.eventRecord", fresh)) == 0) }
        #expect(code(try c.call("ma.eventRecord", event)) == 0)
        try b.clearFaults()
        let recs = try stored(b, "dup1", "buy", count: 2, c)
        #expect(recs.map { $0["id"] } == [.string("c:order-7"), .string("c:order-8")])
        #expect(try b.stream("ma.dup1")["duplicateRecords"] == .int(0), "the device sent nothing twice")
        #expect(try c.call("ma.status")["duplicateEvents"]?.intValue ?? 0 >= 4)
        #expect(code(try c.call("ma.eventRecord", ["appKey": "dup1", "eventName": "buy", "eventId": ""])) == -3)
    }

    @Test func anAppKeySwitchWhileOfflineKeepsEachEventsIdentity() throws {
        let b = try TestBackend()
        let h = try host(b)
        let c = try h.client()
        let euidA = try #require(try c.call("ma.start", ["appKey": "swA"])["euid"])
        #expect(code(try c.call("ma.eventRecord", ["eventName": "a1"])) == 0)
        try b.faults(["failNext": 1000, "status": 503])
        // The switch to swB takes effect when its start begins: later calls without appKey are swB's.
        try c.sendLine(#"{"jsonrpc":"2.0","id":"sB","method":"ma.start","params":{"appKey":"swB"}}"#)
        #expect(code(try c.call("ma.eventRecord", ["eventName": "b1"])) == 0)
        #expect(code(try c.call("ma.eventRecord", ["eventName": "b2"])) == 0)
        #expect(code(try c.call("ma.eventRecord", ["appKey": "swA", "eventName": "a2"])) == 0)
        // ma.status says what waits: the attempts made, and the events parked behind them.
        try waitUntil(timeout: 10) {
            let wait = try c.call("ma.status")["appKeys"]?["swB"]
            return wait?["waitingForNetwork"]?["attempts"]?.intValue ?? 0 >= 1 && wait?["parkedEvents"]?.intValue ?? 0 >= 2
        }
        try b.clearFaults()
        let euidB = try euid(h, "swB")
        #expect(euidB != euidA)
        for name in ["b1", "b2"] {
            let r = try stored(b, "swB", name, count: 1, c)
            #expect(r.map { $0["data"]?["euid"] } == [euidB], "\(name)")
        }
        for name in ["a1", "a2"] {
            let r = try stored(b, "swA", name, count: 1, c)
            #expect(r.map { $0["data"]?["euid"] } == [euidA], "\(name)")
        }
        #expect(try b.records("ma.swA").allSatisfy { $0["data"]?["euid"] == euidA })
    }

    @Test func parkedEventsSurviveAKillOfMAAndGoWithTheResumedStartsEUID() throws {
        let b = try TestBackend()
        let h = try host(b)
        let c = try h.client()
        try b.faults(["failNext": 1000, "status": 503])
        try c.sendLine(#"{"jsonrpc":"2.0","id":0,"method":"ma.start","params":{"appKey":"k9"}}"#)
        for i in 1...10 {
            try c.sendLine(
                #"{"jsonrpc":"2.0","id":\#(i),"method":"ma.eventRecord","params":{"appKey":"k9","eventName":"e","eventId":"k-\#(i)","property":{"n":\#(i)}}}"#
            )
        }
        let got = try answers(c, 11)
        for i in 1...10 { #expect(got[Int64(i)]?["result"]?["code"] == .int(0)) }
        #expect(got[0]?["error"]?["code"] == .int(Int64(RPCError.Code.pending.rawValue)))
        let pid = try #require(try h.plugin("ma")["pid"]?.intValue)
        kill(Int32(pid), SIGKILL)
        try h.waitForPlugin("ma", restartsAtLeast: 1)
        try b.clearFaults()
        let e = try euid(h, "k9")
        let recs = try stored(b, "k9", "e", count: 10, c)
        #expect(recs.map { $0["data"]?["properties"]?["n"]?.intValue } == (1...10).map { Int64($0) })
        #expect(recs.allSatisfy { $0["data"]?["euid"] == e })
    }

    @Test func pylonctlStatusShowsAStartWaitingForTheNetwork() throws {
        let b = try TestBackend()
        let h = try host(b)
        try b.faults(["failNext": 1000, "status": 503])
        let c = try h.client()
        try c.sendLine(#"{"jsonrpc":"2.0","id":0,"method":"ma.start","params":{"appKey":"wait1"}}"#)
        #expect(try #require(try c.readMessage(timeoutMs: 20_000))["error"]?["code"] == .int(Int64(RPCError.Code.pending.rawValue)))
        let p = Process()
        p.executableURL = URL(fileURLWithPath: binDir + "/pylonctl")
        p.arguments = ["--socket", h.socket, "status"]
        let out = Pipe()
        p.standardOutput = out
        try p.run()
        let text = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        p.waitUntilExit()
        #expect(text.contains("ma: wait1 waiting for the network"), "\(text)")
    }

    /// The host's own deadline, for a plugin that declared `afterDeadline: "continues"` (MA):
    /// -32008 pending, not -32002, and the call still takes effect.
    @Test func theHostsDeadlineAnswersAnMACallPendingAndTheCallStillTakesEffect() throws {
        let b = try TestBackend()
        var plugins = TestHost.maPlugins(b, ma: ["pendingAfterMs": 600_000])
        var entry = try #require(plugins[1].objectValue)
        entry["requestTimeoutMs"] = 500
        plugins[1] = .object(entry)
        let h = try TestHost(plugins: plugins)
        let pid = b.process.processIdentifier
        kill(pid, SIGSTOP)
        defer { kill(pid, SIGCONT) }
        let c = try h.client()
        #expect(throws: RPCError.self) { _ = try c.call("ma.start", ["appKey": "late1"]) }
        do {
            _ = try c.call("ma.start", ["appKey": "late1"])
        } catch let e as RPCError {
            #expect(e.code == RPCError.Code.pending.rawValue, "\(e)")
            #expect(e.data?["target"] == .string("plugin:ma"))
            #expect(e.data?["pending"] == .bool(true))
        }
        kill(pid, SIGCONT)
        #expect(try euid(h, "late1") != .null)
    }

    /// A start that turns collection off, queued behind a start waiting for the network with
    /// events parked: it completes (it does not wait for events that wait for it), and the events
    /// parked behind it are not sent (collection is off from that start on).
    @Test func aStartTurningCollectionOffBehindParkedEventsCompletes() throws {
        let b = try TestBackend()
        let h = try host(b)
        let c = try h.client()
        try b.faults(["failNext": 1000, "status": 503])
        try c.sendLine(#"{"jsonrpc":"2.0","id":"s1","method":"ma.start","params":{"appKey":"off3"}}"#)
        #expect(code(try c.call("ma.eventRecord", ["appKey": "off3", "eventName": "before"])) == 0)
        try c.sendLine(#"{"jsonrpc":"2.0","id":"s2","method":"ma.start","params":{"appKey":"off3","dataCollectionEnabled":false}}"#)
        #expect(code(try c.call("ma.eventRecord", ["appKey": "off3", "eventName": "after"])) == 0)
        try b.clearFaults()
        try waitUntil(timeout: 20) {
            let a = try h.client().call("ma.status")["appKeys"]?["off3"]
            return a?["pendingStarts"] == .int(0) && a?["parkedEvents"] == .int(0)
        }
        #expect(try c.call("ma.isDataCollectionEnabled", ["appKey": "off3"])["enabled"] == .bool(false))
    }

    /// More parked events than one read-back round (`releaseChunk`, 512): every round goes out
    /// in order, each event once.
    @Test func manyParkedEventsGoOutInRoundsInOrder() throws {
        let b = try TestBackend()
        let h = try host(b)
        let c = try h.client()
        try b.faults(["failNext": 100_000, "status": 503])
        try c.sendLine(#"{"jsonrpc":"2.0","id":0,"method":"ma.start","params":{"appKey":"many"}}"#)
        let n = 1_000  // two rounds; under the host's maxInflightPerConnection (1024)
        for i in 1...n {
            try c.sendLine(
                #"{"jsonrpc":"2.0","id":\#(i),"method":"ma.eventRecord","params":{"appKey":"many","eventName":"e","property":{"n":\#(i)}}}"#
            )
        }
        let got = try answers(c, n + 1)
        #expect((1...n).allSatisfy { got[Int64($0)]?["result"]?["code"] == .int(0) })
        try b.clearFaults()
        let e = try euid(h, "many")
        let recs = try stored(b, "many", "e", count: n, c)
        #expect(recs.map { $0["data"]?["properties"]?["n"]?.intValue } == (1...n).map { Int64($0) })
        #expect(recs.allSatisfy { $0["data"]?["euid"] == e })
        #expect(try c.call("ma.status")["eventsWaitingForStart"] == .int(0))
    }

    /// With the uploader down, events are kept in ma.db and answered at once (durable on the
    /// device), survive a kill of MA, and are stored once when the uploader is back.
    @Test func eventsHeldForADownUploaderAreAnsweredOnceOnDiskAndStoredOnce() throws {
        let b = try TestBackend()
        var plugins = TestHost.maPlugins(b, ma: ["pendingAfterMs": 300])
        var upl = try #require(plugins[0].objectValue)
        upl["restart"] = "temporary"  // stays down until bus.restart
        plugins[0] = .object(upl)
        let h = try TestHost(plugins: plugins, extra: Self.hostExtra)
        let c = try h.client()
        #expect(code(try c.call("ma.start", ["appKey": "upd"])) == 0)
        let upid = try #require(try h.plugin("uploader")["pid"]?.intValue)
        kill(Int32(upid), SIGKILL)
        try waitUntil(timeout: 10) { try h.plugin("uploader")["state"] != "running" }
        for i in 1...10 {
            try c.sendLine(
                #"{"jsonrpc":"2.0","id":\#(i),"method":"ma.eventRecord","params":{"appKey":"upd","eventName":"e","eventId":"u-\#(i)"}}"#
            )
        }
        let got = try answers(c, 10)
        #expect((1...10).allSatisfy { got[Int64($0)]?["result"]?["code"] == .int(0) }, "\(got.values.map(\.serialized))")
        // One at a time: past the enqueue slots (2) too, each is kept on disk and answered.
        for i in 11...15 {
            #expect(code(try c.call("ma.eventRecord", ["appKey": "upd", "eventName": "e", "eventId": .string("u-\(i)")])) == 0)
        }
        let pid = try #require(try h.plugin("ma")["pid"]?.intValue)
        kill(Int32(pid), SIGKILL)
        try h.waitForPlugin("ma", restartsAtLeast: 1)
        _ = try h.client().call("bus.restart", ["plugin": "uploader"])
        try h.waitForPlugin("uploader")
        let recs = try stored(b, "upd", "e", count: 15, c)
        #expect(Set(recs.compactMap { $0["id"]?.stringValue }) == Set((1...15).map { "c:u-\($0)" }))
        #expect(recs.count == 15)
    }
}
