import Foundation
import PylonClientKit
import PylonProtocol
import TestSupport
import Testing

/// Routing through the real host, one end-to-end test per concern: ids, client-provided methods,
/// a caller that does not read, pub/sub with plugin-to-plugin calls and timeouts. The rules
/// themselves (permissions, namespaces, providers, consent, timeouts chosen) are unit-tested on
/// the pure cores: RoutingPolicyTests, PendingTableTests, SubscriptionIndexTests.
@Suite(.serialized) struct RoutingTests {
    /// Everyone uses the same ids, pipelined, interleaved: each gets its own replies, by the fast
    /// path (requests and answers routed from their bytes). A PylonPluginKit method that `reads:
    /// .text` answers the same on the full path (escaped keys), and host methods answer with the
    /// id exactly as written.
    @Test func concurrentClientsWithCollidingIdsEachGetTheirOwnReplies() throws {
        let h = try TestHost()
        let clients = try (0..<8).map { _ in try h.client() }
        let perClient = 200
        for i in 0..<perClient {
            for (ci, c) in clients.enumerated() {
                try c.sendLine(#"{"jsonrpc":"2.0","id":\#(i),"method":"echo.echo","params":{"c":\#(ci),"i":\#(i)}}"#)
            }
        }
        for (ci, c) in clients.enumerated() {
            var got = Set<Int64>()
            for _ in 0..<perClient {
                let m = try #require(try c.readMessage())
                let id = try #require(m["id"]?.intValue)
                #expect(m["result"]?["c"] == .int(Int64(ci)), "reply crossed connections")
                #expect(m["result"]?["i"] == .int(id), "reply matched to the wrong id")
                got.insert(id)
            }
            #expect(got.count == perClient)
        }
        // 1,600 ordinary requests and their 1,600 answers took the fast path (was ConsentTests').
        let counters = try h.status()["counters"]
        #expect((counters?["routed_fast"]?.intValue ?? 0) >= 3200, "\(counters?.serialized ?? "")")

        // echo.echo `reads: .text`: answered from the request's bytes, or through the ordinary
        // path when the line has escaped keys; both give the same answer.
        let c = try h.client()
        let plain = try c.roundTrip(#"{"jsonrpc":"2.0","id":1,"method":"echo.echo","params":{"k":[1,"\u00e9",{"x":null}]}}"#)
        #expect(plain["result"] == ["k": [1, "é", ["x": .null]]])
        let escaped = try c.roundTrip(#"{"jsonrpc":"2.0","\u0069d":2,"method":"echo.echo","params":{"k":1}}"#)
        #expect(escaped["id"] == .int(2))
        #expect(escaped["result"] == ["k": 1])
        let none = try c.roundTrip(#"{"jsonrpc":"2.0","id":"n","method":"echo.echo"}"#)
        #expect(none["id"] == .string("n"))
        #expect(none["result"] == .null)

        // Host methods answer with the id as written, like routed requests (was SecurityTests').
        for id in ["18446744073709551615", "-0", "1e3", "\"x\\u00e9\""] {
            try c.sendLine(#"{"jsonrpc":"2.0","id":"# + id + #","method":"bus.ping"}"#)
            var buf = [UInt8]()
            var byte: UInt8 = 0
            while read(c.fd, &byte, 1) == 1, byte != 0x0A { buf.append(byte) }
            let line = String(decoding: buf, as: UTF8.self)
            #expect(line.hasPrefix(#"{"jsonrpc":"2.0","id":"# + id + ","), "\(line)")
        }
    }

    /// A client provides a method: called back by clients and plugins, its answers relayed; a
    /// caller's request fails at once when the provider goes; every answer of `bus.provide` lists
    /// the connection's names, so their number is bounded.
    @Test func clientProvidedMethods() throws {
        let h = try TestHost(extra: ["limits": ["maxProvidesPerConnection": 3]])
        let provider = try h.client()
        _ = try provider.call("bus.provide", ["method": "app.greet"])
        let caller = try h.client()
        try caller.sendLine(#"{"jsonrpc":"2.0","id":"c1","method":"app.greet","params":{"who":"kiosk"}}"#)
        // The provider receives the request with a host-issued id and answers it.
        let req = try #require(try provider.readMessage())
        #expect(req["method"] == .string("app.greet"))
        #expect(req["params"]?["who"] == .string("kiosk"))
        let hostId = try #require(req["id"])
        try provider.send(envelope: Envelope.result(id: .value(hostId), .value(["hello": "kiosk"])))
        let reply = try #require(try caller.readMessage())
        #expect(reply["id"] == .string("c1"))
        #expect(reply["result"] == ["hello": "kiosk"])

        // A plugin can call it too (function-call tags later use this path).
        try caller.sendLine(#"{"jsonrpc":"2.0","id":"c2","method":"echo.call","params":{"method":"app.greet","params":{"who":"plugin"}}}"#)
        let req2 = try #require(try provider.readMessage())
        try provider.send(envelope: Envelope.result(id: .value(req2["id"]!), .value(["hello": "plugin"])))
        #expect(try #require(try caller.readMessage())["result"]?["result"] == ["hello": "plugin"])

        // Bounded per connection; names held already do not count twice.
        let c = try h.client()
        #expect(try c.call("bus.provide", ["methods": ["app.a", "app.b"]])["provides"] == ["app.a", "app.b"])
        let r = try c.request("bus.provide", ["methods": ["app.c", "app.d"]])
        #expect(r.errorCode == -32004 && r["error"]?["data"]?["limit"] == "maxProvidesPerConnection")
        let again = try c.call("bus.provide", ["methods": ["app.a", "app.c"]])
        #expect(again["provides"] == ["app.a", "app.b", "app.c"], "names held already do not count twice")

        // A provider that disconnects with a request in flight: -32001 now, then not found.
        var slow: SyncClient? = try h.client()
        _ = try slow!.call("bus.provide", ["method": "app.slow"])
        try caller.sendLine(#"{"jsonrpc":"2.0","id":9,"method":"app.slow"}"#)
        _ = try slow!.readMessage()
        slow = nil
        #expect(try #require(try caller.readMessage()).errorCode == -32001)
        #expect(try caller.roundTrip(#"{"jsonrpc":"2.0","id":10,"method":"app.slow"}"#).errorCode == -32601)
    }

    /// A provider's answers can be far larger than the questions: a caller that asks and never
    /// reads is disconnected once `closeAboveQueuedBytes` would be passed, instead of the host
    /// holding every answer (a review held 300 MB this way). The provider goes on serving.
    @Test func aCallerThatDoesNotReadIsDisconnectedNotHeldWithoutBound() throws {
        let h = try TestHost(extra: ["limits": ["maxQueuedBytes": 65536, "closeAboveQueuedBytes": 524288]])
        let provider = try h.client()
        _ = try provider.call("bus.provide", ["method": "app.big"])
        let caller = try h.client()
        for i in 0..<64 { try caller.sendLine(#"{"jsonrpc":"2.0","id":\#(i),"method":"app.big"}"#) }
        let big = JSON.string(String(repeating: "x", count: 64 * 1024))
        var answered = 0
        while answered < 64, let req = try provider.readMessage(timeoutMs: 2000), let id = req["id"] {
            try provider.send(envelope: Envelope.result(id: .value(id), .value(big)))
            answered += 1
        }
        // 64 answers of 64 KiB (4 MiB) cannot all be queued under 512 KiB plus the socket buffers.
        try waitUntil(timeout: 10) { try provider.call("bus.status")["counters"]?["slow_readers_closed"] == .int(1) }
        // The caller's connection is closed: reading drains what was written, then EOF.
        var sawEOF = false
        do { while try caller.readMessage(timeoutMs: 2000) != nil {} } catch { sawEOF = error.kind == .closed }
        #expect(sawEOF, "the caller's connection was closed")
        let other = try h.client()
        try other.sendLine(#"{"jsonrpc":"2.0","id":"o","method":"app.big"}"#)
        let req = try #require(try provider.readMessage())
        try provider.send(envelope: Envelope.result(id: .value(req["id"]!), .value("small")))
        #expect(try #require(try other.readMessage())["result"] == "small")
    }

    /// Publications reach matching subscribers only (a plugin's notification is one too); a
    /// plugin calls another plugin through the host; `bus.describe` lists the manifests; a
    /// request past the configured `requestTimeoutMs` is answered -32002. Whether a client got
    /// nothing is read behind a barrier: its own `bus.ping` answer comes first, since the host
    /// queued any publication before answering the publisher.
    @Test func publishReachesMatchingSubscribersOnly() throws {
        let h = try TestHost(
            plugins: [TestHost.echo(), ["name": "py", "exec": .string(fixturesDir + "/fake_echo.py")]],
            extra: ["limits": ["requestTimeoutMs": 1500]])
        let sub = try h.client()
        _ = try sub.call("bus.subscribe", ["pattern": "news.*"])
        let other = try h.client()
        _ = try other.call("bus.subscribe", ["pattern": "weather.*"])
        let pub = try h.client()
        #expect(try pub.call("bus.publish", ["topic": "news.local", "data": ["n": 1]])["delivered"] == .int(1))
        let n = try #require(try sub.nextNotification())
        #expect(n["method"] == .string("news.local"))
        #expect(n["params"] == ["n": 1])
        #expect(n["id"] == nil)
        #expect(try other.roundTrip(#"{"jsonrpc":"2.0","id":"barrier","method":"bus.ping"}"#)["id"] == "barrier", "nothing before it")
        // A plugin's notification is a publication too.
        _ = try pub.call("echo.publish", ["topic": "news.fromplugin", "data": ["x": 1]])
        #expect(try sub.nextNotification()?["method"] == .string("news.fromplugin"))
        _ = try sub.call("bus.unsubscribe", ["pattern": "news.*"])
        #expect(try pub.call("bus.publish", ["topic": "news.local", "data": ["n": 2]])["delivered"] == .int(0))
        #expect(try sub.roundTrip(#"{"jsonrpc":"2.0","id":"barrier","method":"bus.ping"}"#)["id"] == "barrier", "nothing before it")

        // Plugin to plugin through the host.
        let r = try pub.call("echo.call", ["method": "py.echo", "params": ["via": "host"]])
        #expect(r["result"] == ["via": "host"])

        let d = try pub.call("bus.describe")
        let methods = d["plugins"]?["echo"]?["methods"]?.arrayValue?.compactMap { $0["name"]?.stringValue } ?? []
        #expect(methods.contains("echo.echo"))
        #expect(
            d["plugins"]?["echo"]?["methods"]?.arrayValue?.first { $0["name"] == "echo.collect" }?["consent"] == .string("echo:{appKey}"))
        #expect(d["host"]?.arrayValue?.contains(.string("consent.set")) == true)

        // -32002 rather than the echo's answer at 60 s: the configured 1.5 s, not the 30 s
        // default, ran out (the read waits 5 s).
        let t = try pub.roundTrip(#"{"jsonrpc":"2.0","id":1,"method":"echo.sleep","params":{"ms":60000}}"#)
        #expect(t.errorCode == -32002)
        #expect(try h.status()["counters"]?["timeouts"] == .int(1))
    }
}
