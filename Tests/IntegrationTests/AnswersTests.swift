import Foundation
import PylonClientKit
import PylonCore
import PylonProtocol
import TestSupport
import Testing

/// Answers on success (`_answers`, docs/PROTOCOL.md): a plugin names requests it serves in a call
/// it makes, and the host answers them when that call succeeds. The plugin here is Python
/// (Tests/fixtures/fake_relay.py): the protocol, not the Swift kit, is what is tested.
@Suite(.serialized) struct AnswersTests {
    static func host() throws -> TestHost {
        try TestHost(plugins: [
            TestHost.echo(),
            ["name": "relay", "exec": .string(fixturesDir + "/fake_relay.py")],
            ["name": "py", "exec": .string(fixturesDir + "/fake_echo.py")],
        ])
    }

    @Test func theHostAnswersWhenThePluginsCallSucceeds() throws {
        let h = try Self.host()
        let c = try h.client()
        let r = try c.call("relay.store", ["to": "echo.echo", "params": ["x": 1]])
        #expect(r == ["stored": true, "by": "host"])
        // The plugin still gets the answer to its own call.
        let seen = try c.call("relay.seen")["seen"]?.arrayValue ?? []
        #expect(seen.count == 1 && seen.first?["result"] == ["x": 1], "\(seen)")
        #expect(try c.call("bus.status")["counters"]?["answered_on_success"] == 1)
    }

    @Test func aFailedCallLeavesTheAnswerToThePlugin() throws {
        let h = try Self.host()
        let c = try h.client()
        let r = try c.call("relay.store", ["to": "echo.nosuch"])
        #expect(r == ["stored": false, "code": -32601, "by": "relay"])
        #expect(try c.call("bus.status")["counters"]?["answered_on_success"] == 0)
    }

    /// A plugin's late answer to a request the host answered for it is dropped: the client gets
    /// one answer per request.
    @Test func thePluginsOwnLaterAnswerIsIgnored() throws {
        let h = try Self.host()
        let c = try h.client()
        try c.send(
            envelope: Envelope.request(id: .int(7), method: "relay.store", params: .value(["to": "echo.echo", "mode": "reply-too"])))
        let first = try #require(try c.readMessage())
        #expect(first["id"] == 7 && first["result"] == ["stored": true, "by": "host"], "\(first.serialized)")
        // Once the relay has answered too (seen), the next line on this connection is ping's.
        try waitUntil(timeout: 5) { (try c.call("relay.seen")["seen"]?.arrayValue?.count ?? 0) == 1 }
        try c.send(envelope: Envelope.request(id: .int(8), method: "bus.ping"))
        let next = try #require(try c.readMessage())
        #expect(next["id"] == 8, "a second answer to 7 reached the client: \(next.serialized)")
    }

    /// The relay names the request issued just before its own (here another client's call to
    /// another plugin): the host refuses its call, and that request keeps its own answer.
    @Test func aPluginCannotAnswerARequestItDoesNotServe() throws {
        let h = try Self.host()
        let victim = try h.client()
        let attacker = try h.client()
        try victim.send(envelope: Envelope.request(id: .int(1), method: "py.slowecho", params: .value(["delay": 0.5])))
        let r = try attacker.call("relay.store", ["to": "echo.echo", "mode": "steal"])
        #expect(r == ["stored": false, "code": -32005, "by": "relay"], "\(r)")
        let m = try #require(try victim.readMessage())
        #expect(m["id"] == 1 && m["result"] == ["ok": true], "\(m.serialized)")
        #expect(try attacker.call("bus.status")["counters"]?["answered_on_success"] == 0)
    }

    /// A client's `_answers` is refused on either path: spelled plainly, or with escapes.
    @Test func aClientMayNotSendAnswers() throws {
        let h = try Self.host()
        let c = try h.client()
        try c.sendLine(#"{"jsonrpc":"2.0","id":3,"method":"echo.echo","params":{},"_answers":{"ids":[1],"result":{}}}"#)
        let m = try #require(try c.readMessage())
        #expect(m.errorCode == -32600, "\(m.serialized)")
        try c.sendLine(#"{"jsonrpc":"2.0","id":4,"method":"bus.ping","_answers":{"ids":[1],"result":{}}}"#)
        #expect(try #require(try c.readMessage()).errorCode == -32600)
        try c.sendLine(#"{"jsonrpc":"2.0","id":5,"method":"echo.echo","params":{},"_an\u0073wers":{"ids":[1],"result":{}}}"#)
        #expect(try #require(try c.readMessage()).errorCode == -32600)
    }
}
