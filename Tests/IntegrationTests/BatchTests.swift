import Foundation
import PylonClientKit
import Testing

/// JSON-RPC 2.0 batches (§6): an array of messages on one line is answered with one array of
/// the requests' responses, each member judged as if it came alone.
@Suite(.serialized) struct BatchTests {
    /// Reads the next line and parses it (an array or an object).
    func next(_ c: SyncClient) throws -> JSON {
        let line = try #require(try c.readLine())
        return try JSON.parse(line)
    }

    @Test func aBatchIsAnsweredWithOneArrayOfItsRequestsResponses() throws {
        let h = try TestHost()
        let c = try h.client()
        try c.sendLine(
            "["
                + [
                    #"{"jsonrpc":"2.0","id":1,"method":"bus.ping"}"#,
                    #"{"jsonrpc":"2.0","id":"two","method":"echo.echo","params":{"k":2}}"#,
                    #"{"jsonrpc":"2.0","method":"echo.echo","params":{"note":true}}"#,
                    #"{"jsonrpc":"2.0","id":3,"method":"echo.sleep","params":{"ms":50}}"#,
                    #"{"jsonrpc":"2.0","id":4,"method":"nosuch.method"}"#,
                    "5",
                    #"{"jsonrpc":"2.0","id":6,"method":"echo.echo","_pylon":{"client":1}}"#,
                ].joined(separator: ",") + "]")
        let r = try next(c)
        let items = try #require(r.arrayValue, "\(r.serialized)")
        #expect(items.count == 6, "one response per request, none for the notification: \(r.serialized)")
        var byId: [String: JSON] = [:]
        for m in items { byId[m["id"]?.serialized ?? "?"] = m }
        #expect(byId["1"]?["result"]?["pong"] == .bool(true))
        #expect(byId[#""two""#]?["result"] == ["k": 2])
        #expect(byId["3"]?["result"] != nil, "a forwarded member's reply comes into the batch")
        #expect(byId["4"]?.errorCode == -32601)
        #expect(byId["6"]?.errorCode == -32600, "a forged caller is refused in a batch too")
        #expect(byId["null"]?.errorCode == -32600, "a member that is not an object")
        // The connection goes on as usual.
        #expect(try c.roundTrip(#"{"jsonrpc":"2.0","id":9,"method":"bus.ping"}"#)["result"] != nil)
    }

    @Test func aBatchOfNotificationsGetsNoReplyAndAnEmptyOneOneError() throws {
        let h = try TestHost(extra: ["limits": ["maxBatchMembers": 3]])
        let c = try h.client()
        try c.sendLine(#"[{"jsonrpc":"2.0","method":"echo.echo"},{"jsonrpc":"2.0","method":"bus.ping"}]"#)
        let empty = try c.roundTrip("[]")
        // The first line back is the empty batch's error: the notifications got nothing.
        #expect(empty.arrayValue == nil && empty.errorCode == -32600, "one error, not an array: \(empty.serialized)")
        #expect(empty["id"] == .null)
        let big = try c.roundTrip(
            "[" + Array(repeating: #"{"jsonrpc":"2.0","id":1,"method":"bus.ping"}"#, count: 4).joined(separator: ",") + "]")
        #expect(big.errorCode == -32600 && big["error"]?["data"]?["limit"] == "maxBatchMembers", "\(big.serialized)")
    }

    /// Consent and permissions judge each member as they would judge it alone.
    @Test func eachMemberIsJudgedAsIfSentAlone() throws {
        let h = try TestHost(extra: ["permissions": [["method": "echo.crash", "uids": [12345]]]])
        let c = try h.client()
        _ = try c.call("consent.set", ["key": "echo:V", "granted": false])
        try c.sendLine(
            #"[{"jsonrpc":"2.0","id":1,"method":"echo.collect","params":{"appKey":"V"}},"#
                + #"{"jsonrpc":"2.0","id":2,"method":"echo.collect","params":{"appKey":"W"}},"#
                + #"{"jsonrpc":"2.0","id":3,"method":"echo.crash"}]"#)
        let items = try #require(try next(c).arrayValue)
        var byId: [Int64: JSON] = [:]
        for m in items { byId[m["id"]?.intValue ?? -1] = m }
        #expect(byId[1]?.errorCode == -32003)
        #expect(byId[2]?["result"] != nil)
        #expect(byId[3]?.errorCode == -32005)
    }

    /// A client that closes while a batch member is still at a plugin: the member's reply comes
    /// later and is dropped (the host must not touch the closed client).
    @Test func aClientClosingWithABatchMemberInFlightIsHarmless() throws {
        let h = try TestHost()
        var gone: SyncClient? = try h.client()
        try gone!.sendLine(
            #"[{"jsonrpc":"2.0","id":1,"method":"echo.sleep","params":{"ms":200}},{"jsonrpc":"2.0","id":2,"method":"bus.ping"}]"#)
        // A connection's lines are handled in order: once the ping after it is answered, the
        // batch's sleep is at the plugin. Then the client goes away with it in flight.
        let ping = try gone!.roundTrip(#"{"jsonrpc":"2.0","id":3,"method":"bus.ping"}"#)
        #expect(ping["id"] == 3)
        gone = nil
        let other = try h.client()
        // echo answers the 200 ms sleep before this 400 ms one: the host outlives that reply.
        #expect(try other.call("echo.sleep", ["ms": 400], timeoutMs: 10_000) != .null)
        #expect(try other.call("bus.ping")["pong"] == .bool(true))
    }

    /// A notification to a host method does what the request would, and answers nothing.
    @Test func aNotificationToAHostMethodIsProcessed() throws {
        let h = try TestHost()
        let sub = try h.client()
        _ = try sub.call("bus.subscribe", ["pattern": "news.*"])
        let pub = try h.client()
        try pub.sendLine(#"{"jsonrpc":"2.0","method":"bus.publish","params":{"topic":"news.local","data":{"n":1}}}"#)
        let got = try #require(try sub.readMessage())
        #expect(got["method"] == "news.local")
        #expect(try pub.roundTrip(#"{"jsonrpc":"2.0","id":"after","method":"bus.ping"}"#)["id"] == "after")
    }
}
