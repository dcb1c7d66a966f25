import Foundation
import PylonClientKit
import TestSupport
import Testing

/// `bus.monitor` against a real host: what an admin sees, who is refused, and that a monitor
/// that does not read is disconnected while routing goes on.
@Suite(.serialized) struct BusMonitorTests {
    func events(_ m: SyncClient, count: Int) throws -> [JSON] {
        var out: [JSON] = []
        while out.count < count {
            guard let n = try m.nextNotification(timeoutMs: 5000) else { throw TestFailure(description: "no monitor event; got \(out)") }
            if n["method"]?.stringValue == "bus.monitor.event", let p = n["params"] { out.append(p) }
        }
        return out
    }

    /// Reads until the host closes the connection (true), or 5 s pass without a line (false).
    func readsUntilClosed(_ c: SyncClient) -> Bool {
        while true {
            let r = Result { () throws(ClientError) -> String? in try c.readLine(timeoutMs: 5000) }
            switch r {
            case .success(let line): if line == nil { return false }
            case .failure(let e): return e.kind == .closed
            }
        }
    }

    @Test func anAdminSeesAnEchoCallWithItsCallerAndResult() throws {
        let h = try TestHost(plugins: [TestHost.echo()])
        let monitor = try h.client()
        let answer = try monitor.call("bus.monitor", ["pattern": "echo.*", "verbose": true])
        #expect(answer["pattern"] == "echo.*" && answer["verbose"] == true)
        #expect(try h.status()["counters"]?["monitors"] == 1)
        let caller = try h.client()
        #expect(try caller.call("bus.ping") != .null)  // not echo.*: not seen
        #expect(try caller.call("echo.echo", ["n": 42]) == ["n": 42])
        let err = try caller.request("echo.nope", nil)
        #expect(err.errorCode == -32601)
        let ev = try events(monitor, count: 4)
        let (req, rep) = (ev[0], ev[1])
        #expect(req["type"] == "request" && req["method"] == "echo.echo" && req["to"] == "plugin:echo", "\(req)")
        #expect(req["caller"]?["uid"] == .int(Int64(getuid())) && req["caller"]?["pid"] != nil && req["params"] == ["n": 42])
        #expect((req["bytes"]?.intValue ?? 0) > 0 && req["from"] == rep["to"])
        #expect(rep["type"] == "reply" && rep["method"] == "echo.echo" && rep["result"] == "ok" && rep["from"] == "plugin:echo")
        #expect(rep["latency_us"]?.intValue != nil && rep["payload"] == ["n": 42] && rep["id"] == req["id"], "\(rep)")
        // A refusal by the host: the request and its error.
        #expect(ev[2]["type"] == "request" && ev[2]["method"] == "echo.nope" && ev[2]["to"] == "host")
        #expect(ev[3]["type"] == "reply" && ev[3]["result"] == "error" && ev[3]["error"]?["code"] == -32601, "\(ev[3])")
        // The monitor's own connection closing ends it.
        _ = monitor
    }

    @Test func nonAdminsAreRefused() throws {
        let h = try TestHost.open(plugins: [TestHost.echo()])
        let r = try h.runAs(
            uid: 65534,
            [
                #"{"jsonrpc":"2.0","id":1,"method":"bus.monitor","params":{"pattern":"*"}}"#,
                #"{"jsonrpc":"2.0","id":2,"method":"bus.reload"}"#,
                #"{"jsonrpc":"2.0","id":3,"method":"bus.logLevel","params":{"level":"debug"}}"#,
            ])
        #expect(r.replies.count == 3)
        for reply in r.replies { #expect(reply.errorCode == -32005, "\(reply)") }
        #expect(r.replies.first?["error"]?["message"]?.stringValue?.contains("uid 65534") == true)
        #expect(try h.status()["counters"]?["monitors"] == 0)
    }

    /// A monitor that stops reading passes its bound (`maxMonitorQueuedBytes`): it is
    /// disconnected, counted, and every call is still answered.
    @Test func aMonitorThatNeverReadsIsDroppedWhileRoutingGoesOn() throws {
        let h = try TestHost(plugins: [TestHost.echo()], extra: ["limits": ["maxMonitorQueuedBytes": 4096]])
        let monitor = try h.client()
        _ = try monitor.call("bus.monitor", ["verbose": true])
        let caller = try h.client()
        let big = String(repeating: "x", count: 16_384)
        for i in 0..<300 {
            let r = try caller.call("echo.echo", ["i": .int(Int64(i)), "pad": .string(big)])
            #expect(r["i"] == .int(Int64(i)))
            if i % 50 == 49, try h.status()["counters"]?["monitors_dropped"] == 1 { break }
        }
        let counters = try h.status()["counters"]
        #expect(counters?["monitors_dropped"] == 1 && counters?["monitors"] == 0, "\(String(describing: counters))")
        #expect(h.logText.contains("monitor disconnected"))
        // What the kernel had taken is still readable; then the host's close.
        #expect(readsUntilClosed(monitor))
        #expect(try caller.call("echo.echo", ["after": true]) == ["after": true])
    }
}
