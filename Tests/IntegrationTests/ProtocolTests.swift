import Foundation
import PylonClientKit
import TestSupport
import Testing

/// The wire protocol against a real host: framing, malformed input, every limit.
@Suite(.serialized) struct ProtocolTests {
    @Test func pingAnswersOverARawSocket() throws {
        let h = try TestHost()
        let c = try h.client()
        let r = try c.roundTrip(#"{"jsonrpc":"2.0","id":1,"method":"bus.ping"}"#)
        #expect(r["id"] == .int(1))
        #expect(r["result"]?["pong"] == .bool(true))
    }

    @Test func requestSplitAcrossWritesIsReassembled() throws {
        let h = try TestHost()
        let c = try h.client()
        let probe = try h.client()
        let line = #"{"jsonrpc":"2.0","id":"split","method":"echo.echo","params":{"k":"v"}}"#
        let bytes = Array(line.utf8) + [0x0A]
        for chunk in stride(from: 0, to: bytes.count, by: 7) {
            try c.sendRaw(Array(bytes[chunk..<min(chunk + 7, bytes.count)]))
            // Another connection's round trip: the host's loop has read what was sent before it,
            // so each chunk is a read of its own.
            _ = try probe.call("bus.ping")
        }
        let r = try #require(try c.readMessage())
        #expect(r["id"] == .string("split"))
        #expect(r["result"] == ["k": "v"])
    }

    @Test func manyRequestsInOneWriteAllAnswered() throws {
        let h = try TestHost()
        let c = try h.client()
        var blob = ""
        for i in 0..<500 { blob += #"{"jsonrpc":"2.0","id":\#(i),"method":"echo.echo","params":{"i":\#(i)}}"# + "\n" }
        try c.sendRaw(Array(blob.utf8))
        var seen = Set<Int64>()
        for _ in 0..<500 {
            let m = try #require(try c.readMessage())
            let id = try #require(m["id"]?.intValue)
            #expect(m["result"]?["i"]?.intValue == id)
            seen.insert(id)
        }
        #expect(seen.count == 500)
    }

    @Test func malformedJSONGetsParseErrorAndConnectionSurvives() throws {
        let h = try TestHost()
        let c = try h.client()
        let r = try c.roundTrip(#"{"jsonrpc":"2.0","id":1,"method":"#)
        #expect(r.errorCode == -32700)
        #expect(r["id"] == .null)
        #expect(try c.roundTrip(#"{"jsonrpc":"2.0","id":2,"method":"bus.ping"}"#)["result"] != nil)
    }

    /// Not RFC 8259 (json-c's strict mode accepts `2.`); relayed, such lines would reach other
    /// peers as text no strict parser reads. The host refuses them.
    @Test(arguments: [
        #"{"jsonrpc":"2.0","id":1,"method":"echo.echo","params":{"a":2.}}"#,
        #"{'jsonrpc':'2.0','id':1,'method':'echo.echo'}"#,
        #"{"jsonrpc":"2.0","id":1,"method":"echo.echo","params":{"a":'x'}}"#,
    ])
    func lenientJSONIsAParseError(_ line: String) throws {
        let h = try TestHost()
        let c = try h.client()
        let r = try c.roundTrip(line)
        #expect(r.errorCode == -32700, "\(line)")
        #expect(try c.roundTrip(#"{"jsonrpc":"2.0","id":2,"method":"bus.ping"}"#)["result"] != nil)
    }

    @Test func invalidUTF8IsRefused() throws {
        let h = try TestHost()
        let c = try h.client()
        try c.sendRaw(Array(#"{"jsonrpc":"2.0","id":1,"method":"echo.echo","params":{"s":""#.utf8) + [0xFF, 0xFE] + Array("\"}}\n".utf8))
        let r = try #require(try c.readMessage())
        #expect(r.errorCode == -32700)
        #expect(r["error"]?["message"]?.stringValue?.contains("UTF-8") == true)
    }

    @Test func nestingBeyondTheLimitIsRefused() throws {
        let h = try TestHost(extra: ["limits": ["maxDepth": 16]])
        let c = try h.client()
        let deep = String(repeating: "[", count: 40) + String(repeating: "]", count: 40)
        let r = try c.roundTrip(#"{"jsonrpc":"2.0","id":1,"method":"echo.echo","params":"# + deep + "}")
        #expect(r.errorCode == -32700)
        #expect(r["error"]?["data"]?["limit"] == .string("maxDepth"))
        let ok = String(repeating: "[", count: 10) + String(repeating: "]", count: 10)
        #expect(try c.roundTrip(#"{"jsonrpc":"2.0","id":2,"method":"echo.echo","params":"# + ok + "}")["result"] != nil)
    }

    @Test func oversizedLineIsSkippedAnsweredWithItsIdAndConnectionStaysUsable() throws {
        let h = try TestHost(extra: ["limits": ["maxLineBytes": 4096]])
        let c = try h.client()
        let big = String(repeating: "x", count: 100_000)
        try c.sendLine(#"{"jsonrpc":"2.0","id":77,"method":"echo.echo","params":{"s":""# + big + #""}}"#)
        let r = try #require(try c.readMessage())
        #expect(r.errorCode == -32006)
        #expect(r["id"] == .int(77))
        #expect(r["error"]?["data"]?["value"] == .int(4096))
        #expect(try c.roundTrip(#"{"jsonrpc":"2.0","id":78,"method":"echo.echo","params":[1]}"#)["result"] == [1])
    }

    @Test(arguments: [
        (#"{"jsonrpc":"2.0","id":{"x":1},"method":"bus.ping"}"#, -32600),
        (#"{"jsonrpc":"2.0","id":1,"method":42}"#, -32600),
        (#"{"jsonrpc":"2.0","id":1,"method":"bus.ping","params":"str"}"#, -32600),
        (#"{"id":1,"method":"bus.ping"}"#, -32600),
        (#"{"jsonrpc":"1.0","id":1,"method":"bus.ping"}"#, -32600),
        (#"[]"#, -32600),
        (#""just a string""#, -32600),
        (#"{"jsonrpc":"2.0","id":1}"#, -32600),
        (#"{"jsonrpc":"2.0","id":1,"method":"nosuch.method"}"#, -32601),
        (#"{"jsonrpc":"2.0","id":1,"method":"bus.nosuch"}"#, -32601),
        (#"{"jsonrpc":"2.0","id":1,"method":"echo.nosuch"}"#, -32601),
        (#"{"jsonrpc":"2.0","id":1,"method":"bus.subscribe","params":{"pattern":5}}"#, -32602),
        (#"{"jsonrpc":"2.0","id":1,"method":"consent.set","params":{"key":"k"}}"#, -32602),
    ])
    func wrongShapesGetTheRightError(line: String, code: Int64) throws {
        let h = try TestHost()
        let c = try h.client()
        let r = try c.roundTrip(line)
        #expect(r.errorCode == code, "\(line) → \(r.serialized)")
    }

    /// A plugin's reply over `maxLineBytes` cannot be relayed: the caller gets `-32006` at once,
    /// not `-32002` at its timeout (30 s, past this read's deadline).
    @Test func aReplyOverTheLineLimitIsAnsweredAtOnce() throws {
        let h = try TestHost()
        let c = try h.client()
        let r = try c.roundTrip(
            #"{"jsonrpc":"2.0","id":"big","method":"echo.repeat","params":{"text":"0123456789","times":200000}}"#, timeoutMs: 10_000)
        #expect(r["id"] == "big")
        #expect(r.errorCode == -32006, "\(r.serialized)")
        #expect(r["error"]?["data"]?["limit"] == "maxLineBytes")
        #expect(try c.roundTrip(#"{"jsonrpc":"2.0","id":2,"method":"echo.echo","params":[1]}"#)["result"] == [1])
    }

    @Test func notificationsGetNoReply() throws {
        let h = try TestHost()
        let c = try h.client()
        try c.sendLine(#"{"jsonrpc":"2.0","method":"echo.echo","params":{"n":1}}"#)
        try c.sendLine(#"{"jsonrpc":"2.0","method":"nosuch.thing"}"#)
        try c.sendLine("")
        let r = try c.roundTrip(#"{"jsonrpc":"2.0","id":"after","method":"bus.ping"}"#)
        #expect(r["id"] == .string("after"), "the first line back must be the ping's reply")
    }

    @Test func stringAndNullIdsAreEchoed() throws {
        let h = try TestHost()
        let c = try h.client()
        #expect(try c.roundTrip(#"{"jsonrpc":"2.0","id":"abc","method":"echo.echo","params":[]}"#)["id"] == .string("abc"))
        #expect(try c.roundTrip(#"{"jsonrpc":"2.0","id":null,"method":"echo.echo","params":[]}"#)["id"] == .null)
        #expect(try c.roundTrip(#"{"jsonrpc":"2.0","id":-5,"method":"echo.echo","params":[]}"#)["id"] == .int(-5))
    }

    @Test func connectionLimitRefusesWithAnError() throws {
        let h = try TestHost(extra: ["limits": ["maxConnections": 2]])
        let a = try h.client()
        // The host has seen TestHost's readiness probe disconnect: a is the only client.
        try waitUntil(timeout: 10) { try a.call("bus.status")["clients_total"] == .int(1) }
        let b = try h.client()
        _ = try a.call("bus.ping")
        _ = try b.call("bus.ping")
        let c = try h.client()
        let r = try #require(try c.readMessage())
        #expect(r.errorCode == -32004)
        #expect(throws: ClientError.self) { _ = try c.readMessage(timeoutMs: 2000) }
        // Existing connections are unaffected.
        _ = try a.call("bus.ping")
    }

    @Test func inflightLimitPerConnection() throws {
        let h = try TestHost(extra: ["limits": ["maxInflightPerConnection": 2]])
        let c = try h.client()
        for i in 0..<3 {
            try c.sendLine(#"{"jsonrpc":"2.0","id":\#(i),"method":"echo.sleep","params":{"ms":500}}"#)
        }
        var codes: [Int64: Int64] = [:]
        for _ in 0..<3 {
            let m = try #require(try c.readMessage())
            codes[m["id"]!.intValue!] = m.errorCode ?? 0
        }
        #expect(codes[2] == -32004)
        #expect(codes[0] == 0 && codes[1] == 0)
    }

    @Test func slowReaderDoesNotStallOthers() throws {
        let h = try TestHost(extra: ["limits": ["maxQueuedBytes": 65536]])
        let slow = try h.client()
        _ = try slow.call("bus.subscribe", ["pattern": "flood.*"])
        // slow never reads again. Flood it through another connection.
        let pub = try h.client()
        let payload: JSON = ["blob": .string(String(repeating: "z", count: 8192))]
        for _ in 0..<400 { _ = try pub.call("bus.publish", ["topic": "flood.x", "data": payload]) }
        let other = try h.client()
        #expect(try other.call("echo.echo", ["still": "fast"]) == ["still": "fast"])
        let s = try h.status()
        let slowInfo = s["clients"]?.arrayValue?.first { ($0["dropped_notifications"]?.intValue ?? 0) > 0 }
        #expect(slowInfo != nil, "notifications to the slow reader are dropped and counted")
    }

    @Test func halfClosedClientStillGetsItsReplies() throws {
        let h = try TestHost()
        let c = try h.client()
        try c.sendLine(#"{"jsonrpc":"2.0","id":1,"method":"echo.sleep","params":{"ms":200}}"#)
        shutdown(c.fd, Int32(SHUT_WR))
        let r = try #require(try c.readMessage())
        #expect(r["result"]?["slept_ms"] == .int(200))
    }

    @Test func abruptDisconnectWithRequestsInFlightIsHarmless() throws {
        let h = try TestHost()
        do {
            let c = try h.client()
            for i in 0..<50 { try c.sendLine(#"{"jsonrpc":"2.0","id":\#(i),"method":"echo.sleep","params":{"ms":100}}"#) }
        }  // closed here
        // The host fails nothing and leaks nothing: its in-flight table empties.
        try waitUntil(timeout: 10) { try h.status()["counters"]?["inflight"] == .int(0) }
        #expect(try h.client().call("bus.ping")["pong"] == .bool(true))
    }
}
