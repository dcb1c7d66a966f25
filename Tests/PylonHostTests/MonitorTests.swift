import PylonCore
import PylonProtocol
import Testing

@testable import PylonHost

/// The value-type parts of `bus.monitor`: the filter, the event line, the per-monitor bound.
struct MonitorTests {
    @Test func filterMatchesMethodPatternsAndReadsParams() throws {
        let f = try MonitorFilter.parse(["pattern": "echo.*", "verbose": true])
        #expect(f.wants("echo.echo") && f.wants("echo.") && !f.wants("ma.echo") && !f.wants("echo"))
        #expect(f.verbose)
        let all = try MonitorFilter.parse(nil)
        #expect(all.wants("anything.at.all") && !all.verbose)
        #expect(throws: RPCError.self) { try MonitorFilter.parse(["pattern": "has space"]) }
        #expect(throws: RPCError.self) { try MonitorFilter.parse(["pattern": 3]) }
        #expect(throws: RPCError.self) { try MonitorFilter.parse(["verbose": "yes"]) }
    }

    @Test func eventLineIsAValidNotificationAndTheParamsOnlyWhenVerbose() throws {
        let e = MonitorEvent(
            .request, method: "echo.echo", from: "client#7", to: "plugin:echo", caller: #"{"client":7,"uid":0,"gid":0,"pid":9}"#,
            id: #""a\"b""#, bytes: 57, payload: #"{"x":[1,2]}"#)
        let plain = try JSON.parse(String(decoding: e.line(seq: 3, timeMs: 1000, verbose: false), as: UTF8.self))
        #expect(plain["method"]?.stringValue == HostMethod.monitorEvent)
        #expect(plain["id"] == nil, "a notification")
        let p = try #require(plain["params"])
        #expect(p["seq"] == 3 && p["time_ms"] == 1000 && p["type"] == "request" && p["method"] == "echo.echo")
        #expect(p["from"] == "client#7" && p["to"] == "plugin:echo" && p["bytes"] == 57 && p["id"] == "a\"b")
        #expect(p["caller"]?["uid"] == 0 && p["params"] == nil && p["result"] == nil)
        let verbose = try JSON.parse(String(decoding: e.line(seq: 1, timeMs: 1, verbose: true), as: UTF8.self))
        #expect(verbose["params"]?["params"] == ["x": [1, 2]])
    }

    @Test func replyLinesSayOkOrTheErrorWithLatency() throws {
        var e = MonitorEvent(
            .reply, method: "m.x", from: "plugin:m", to: "client#1", caller: "{}", id: "1", bytes: 10, latencyUs: 250,
            payload: #"{"r":1}"#)
        let ok = try JSON.parse(String(decoding: e.line(seq: 1, timeMs: 0, verbose: true), as: UTF8.self))["params"]
        #expect(ok?["result"] == "ok" && ok?["latency_us"] == 250 && ok?["payload"] == ["r": 1] && ok?["error"] == nil)
        e.errorCode = -32601
        e.errorMessage = "method \"not\" found"
        let err = try JSON.parse(String(decoding: e.line(seq: 2, timeMs: 0, verbose: false), as: UTF8.self))["params"]
        #expect(err?["result"] == "error" && err?["error"]?["code"] == -32601 && err?["error"]?["message"] == "method \"not\" found")
        let pub = MonitorEvent(.publication, method: "t.x", from: "host", to: nil, caller: "{}", bytes: 5, delivered: 2)
        let pp = try JSON.parse(String(decoding: pub.line(seq: 1, timeMs: 0, verbose: false), as: UTF8.self))["params"]
        #expect(pp?["delivered"] == 2 && pp?["to"] == nil && pp?["result"] == nil)
    }

    /// A monitor within its bound gets every event; the first event that would pass it drops the
    /// monitor, and it stays dropped (the bus disconnects it once).
    @Test func sinkDropsOnceOverItsBound() {
        var s = MonitorSink(filter: MonitorFilter(), maxQueuedBytes: 100)
        #expect(s.offer(bytes: 40, queuedBytes: 0) == .send)
        #expect(s.offer(bytes: 40, queuedBytes: 60) == .send)
        #expect(s.sent == 2 && s.sentBytes == 80)
        #expect(s.offer(bytes: 40, queuedBytes: 61) == .drop)
        #expect(s.dropped)
        #expect(s.offer(bytes: 1, queuedBytes: 0) == .ignore, "a dropped monitor stays dropped")
        #expect(s.sent == 2)
    }

    @Test func reloadReportsSettingsFixedAtStart() {
        let a = HostConfig()
        var b = a
        #expect(HostConfig.fixedAtStart(running: a, new: b).isEmpty)
        b.socketPath = "/tmp/other.sock"
        b.stateDir = "/tmp/state"
        b.metricsTextfile = "/tmp/m.prom"  // applied by a reload: not listed
        b.logLevel = "debug"
        #expect(HostConfig.fixedAtStart(running: a, new: b) == ["socket", "stateDir"])
        var r = ReloadReport()
        r.notApplied = [("socket", "fixed at start")]
        r.added = ["x"]
        #expect(r.json["notApplied"]?.arrayValue?.first?["setting"] == "socket" && r.json["added"] == ["x"])
    }

    /// A refused reload names file:line:col of the byte json-c stopped at (it was one column
    /// short: json-c's parse end is that byte's offset, not one past it).
    @Test func jsonErrorLocationNamesTheOffendingByte() {
        let cases: [(String, Int, Int)] = [
            ("{\n  \"a\": 1,\n  oops\n}\n", 3, 3), ("{\n  \"a\": [1 2]\n}", 2, 11), ("{\n  \"a\": 1,,\n}", 2, 10),
        ]
        for (text, line, column) in cases {
            let at = Array(text.utf8).withUnsafeBytes { HostConfig.jsonErrorLocation($0) }
            #expect(at.line == line && at.column == column, "\(text.debugDescription): \(at)")
        }
    }
}
