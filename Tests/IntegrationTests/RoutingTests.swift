import Foundation
import PylonClientKit
import PylonProtocol
import TestSupport
import Testing

/// Routing through the real host: id rewriting, plugin↔plugin, client-provided methods, pub/sub.
@Suite(.serialized) struct RoutingTests {
    @Test func concurrentClientsWithCollidingIdsEachGetTheirOwnReplies() throws {
        let h = try TestHost()
        let clients = try (0..<8).map { _ in try h.client() }
        let perClient = 200
        // Everyone uses the same ids 0..<200, pipelined, interleaved.
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
    }

    /// echo.echo is a PylonPluginKit method that `reads: .text`: answered from the request's
    /// bytes, or through the ordinary path when the line has escaped keys; both give the same answer.
    @Test func rawMethodAnswersOnBothPaths() throws {
        let h = try TestHost()
        let c = try h.client()
        let plain = try c.roundTrip(#"{"jsonrpc":"2.0","id":1,"method":"echo.echo","params":{"k":[1,"\u00e9",{"x":null}]}}"#)
        #expect(plain["result"] == ["k": [1, "é", ["x": .null]]])
        let escaped = try c.roundTrip(#"{"jsonrpc":"2.0","\u0069d":2,"method":"echo.echo","params":{"k":1}}"#)
        #expect(escaped["id"] == .int(2))
        #expect(escaped["result"] == ["k": 1])
        let none = try c.roundTrip(#"{"jsonrpc":"2.0","id":"n","method":"echo.echo"}"#)
        #expect(none["id"] == .string("n"))
        #expect(none["result"] == .null)
    }

    @Test func pluginCallsAnotherPluginThroughTheHost() throws {
        let h2 = try TestHost(plugins: [
            TestHost.echo(),
            ["name": "py", "exec": .string(fixturesDir + "/fake_echo.py")],
        ])
        let c = try h2.client()
        let r = try c.call("echo.call", ["method": "py.echo", "params": ["via": "host"]])
        #expect(r["result"] == ["via": "host"])
    }

    @Test func clientProvidedMethodIsCalledBack() throws {
        let h = try TestHost()
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

    /// Every answer of `bus.provide` lists the connection's names: their number is bounded.
    @Test func providedMethodsPerConnectionAreBounded() throws {
        let h = try TestHost(extra: ["limits": ["maxProvidesPerConnection": 3]])
        let c = try h.client()
        #expect(try c.call("bus.provide", ["methods": ["app.a", "app.b"]])["provides"] == ["app.a", "app.b"])
        let r = try c.request("bus.provide", ["methods": ["app.c", "app.d"]])
        #expect(r.errorCode == -32004 && r["error"]?["data"]?["limit"] == "maxProvidesPerConnection")
        let again = try c.call("bus.provide", ["methods": ["app.a", "app.c"]])
        #expect(again["provides"] == ["app.a", "app.b", "app.c"], "names held already do not count twice")
    }

    @Test func providedMethodFailsPromptlyWhenProviderDisconnects() throws {
        let h = try TestHost()
        var provider: SyncClient? = try h.client()
        _ = try provider!.call("bus.provide", ["method": "app.slow"])
        let caller = try h.client()
        try caller.sendLine(#"{"jsonrpc":"2.0","id":9,"method":"app.slow"}"#)
        _ = try provider!.readMessage()
        provider = nil
        let r = try #require(try caller.readMessage())
        #expect(r.errorCode == -32001)
        #expect(try caller.roundTrip(#"{"jsonrpc":"2.0","id":10,"method":"app.slow"}"#).errorCode == -32601)
    }

    @Test func cannotProvideReservedOrPluginNamespaces() throws {
        let h = try TestHost()
        let c = try h.client()
        for m in ["bus.x", "consent.x", "echo.echo", "nodot"] {
            #expect(throws: RPCError.self) { try c.call("bus.provide", ["method": .string(m)]) }
        }
    }

    @Test func publishReachesMatchingSubscribersOnly() throws {
        let h = try TestHost()
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
        #expect(try other.nextNotification(timeoutMs: 300) == nil)
        // A plugin's notification is a publication too.
        _ = try pub.call("echo.publish", ["topic": "news.fromplugin", "data": ["x": 1]])
        #expect(try sub.nextNotification()?["method"] == .string("news.fromplugin"))
        _ = try sub.call("bus.unsubscribe", ["pattern": "news.*"])
        _ = try pub.call("bus.publish", ["topic": "news.local", "data": ["n": 2]])
        #expect(try sub.nextNotification(timeoutMs: 300) == nil)
    }

    @Test func requestTimeoutAnswersWithTimeoutError() throws {
        let h = try TestHost(extra: ["limits": ["requestTimeoutMs": 300]])
        let c = try h.client()
        let r = try c.roundTrip(#"{"jsonrpc":"2.0","id":1,"method":"echo.sleep","params":{"ms":3000}}"#)
        // -32002 rather than the echo's answer at 3 s: the configured 300 ms, not the 30 s default, ran out.
        #expect(r.errorCode == -32002)
        #expect(try h.status()["counters"]?["timeouts"] == .int(1))
    }

    @Test func permissionRulesUsePeerCredentials() throws {
        let h = try TestHost(extra: [
            "permissions": [
                ["method": "echo.crash", "uids": [54321]],
                ["method": "echo.*", "uids": .array([.int(Int64(getuid()))])],
            ]
        ])
        let c = try h.client()
        let r = try c.roundTrip(#"{"jsonrpc":"2.0","id":1,"method":"echo.crash"}"#)
        #expect(r.errorCode == -32005)
        #expect(try c.call("echo.echo", ["ok": true]) == ["ok": true])
        let s = try h.status()
        #expect(s["clients"]?.arrayValue?.first?["uid"] == .int(Int64(getuid())))
    }

    @Test func callerInfoAndClientClosedReachPluginsThatAsk() throws {
        let h = try TestHost(plugins: [TestHost.echo(["env": ["PYLON_ECHO_CALLER": "1"]])])
        var a: SyncClient? = try h.client()
        let who = try a!.call("echo.caller")
        #expect(who["uid"] == .int(Int64(getuid())))
        #expect(who["pid"] == .int(Int64(getpid())))
        let clientId = try #require(who["client"]?.intValue)
        #expect(try a!.call("echo.echo", ["x": 1]) == ["x": 1], "the extra member does not disturb params")
        #expect(try a!.call("echo.call", ["method": "echo.caller"])["result"]?["plugin"] == .string("echo"))
        a = nil
        let b = try h.client()
        try waitUntil(timeout: 5) { try b.call("echo.closedClients").arrayValue?.contains(.int(clientId)) == true }
    }

    @Test func describeListsManifests() throws {
        let h = try TestHost()
        let d = try h.client().call("bus.describe")
        let methods = d["plugins"]?["echo"]?["methods"]?.arrayValue?.compactMap { $0["name"]?.stringValue } ?? []
        #expect(methods.contains("echo.echo"))
        #expect(
            d["plugins"]?["echo"]?["methods"]?.arrayValue?.first { $0["name"] == "echo.collect" }?["consent"] == .string("echo:{appKey}"))
        #expect(d["host"]?.arrayValue?.contains(.string("consent.set")) == true)
    }
}
