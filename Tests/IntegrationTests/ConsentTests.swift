import Foundation
import PylonClientKit
import Testing

/// The host's consent gate across plugins, end to end. The decisions (a denied switch, the
/// master switch, a plugin's call for a client, the app layer) are unit-tested in
/// RoutingPolicyTests and ConsentStoreTests.
@Suite(.serialized) struct ConsentTests {
    /// A denied switch refuses the methods it scopes (counted), however the field is spelled;
    /// the master switch denies every scoped method.
    @Test func deniedSwitchRefusesScopedMethodsAndCountsThem() throws {
        let h = try TestHost()
        let c = try h.client()
        #expect(try c.call("echo.collect", ["appKey": "A", "data": 1])["stored"] == .int(1))
        _ = try c.call("consent.set", ["key": "echo:A", "granted": false])
        let r = try c.roundTrip(#"{"jsonrpc":"2.0","id":5,"method":"echo.collect","params":{"appKey":"A","data":2}}"#)
        #expect(r.errorCode == -32003)
        #expect(r["error"]?["data"]?["switch"] == .string("echo:A"))
        // Another AppKey and unscoped methods are unaffected.
        #expect(try c.call("echo.collect", ["appKey": "B", "data": 3])["stored"] == .int(3))
        #expect(try c.call("echo.echo", [1]) == [1])
        #expect(try h.status()["consent"]?["refused"]?["echo:A"] == .int(1))

        // "app\u004bey" is "appKey": json-c decodes it, so the host's checks must too.
        let e = try c.roundTrip(#"{"jsonrpc":"2.0","id":1,"method":"echo.collect","params":{"app\u004bey":"A","data":2}}"#)
        #expect(e.errorCode == -32003)
        let v = try c.roundTrip(#"{"jsonrpc":"2.0","id":2,"method":"echo.collect","params":{"appKey":"\u0041","data":2}}"#)
        #expect(v.errorCode == -32003, "an escaped value too")

        // The master switch.
        _ = try c.call("consent.set", ["key": "device", "granted": false])
        #expect(try c.roundTrip(#"{"jsonrpc":"2.0","id":1,"method":"echo.collect","params":{"appKey":"Z"}}"#).errorCode == -32003)
        #expect(try c.call("consent.get", ["key": "echo:Z"])["granted"] == .bool(false))
        _ = try c.call("consent.set", ["key": "device", "granted": true])
        #expect(try c.call("echo.collect", ["appKey": "Z", "data": 0])["stored"] == .int(0))
    }

    @Test func changesAreBroadcastToPluginsBeforeTheNextMessage() throws {
        let h = try TestHost()
        let c = try h.client()
        let watcher = try h.client()
        _ = try watcher.call("bus.subscribe", ["pattern": "consent.*"])
        _ = try c.call("consent.set", ["key": "echo:K", "granted": false])
        // The very next message routed to the plugin sees the change already applied.
        let log = try c.call("echo.consentLog")
        #expect(log == [["key": "echo:K", "granted": false]])
        let n = try #require(try watcher.nextNotification())
        #expect(n["method"] == .string("consent.changed"))
        #expect(n["params"]?["key"] == .string("echo:K"))
    }

    /// `consent.clear` returns a switch to "never set": the default (granted) again, persisted,
    /// announced to the plugins; only for whoever may call `consent.set`. Switches persist across
    /// a host restart; invalid keys and values are refused.
    @Test func clearReturnsASwitchToNeverSet() throws {
        let first = try TestHost.open(extra: ["permissions": [["method": "consent.set", "uids": [0]]]])
        let c = try first.client()
        let watcher = try first.client()
        _ = try watcher.call("bus.subscribe", ["pattern": "consent.changed"])
        _ = try c.call("consent.set", ["key": "device", "granted": false])
        _ = try c.call("consent.set", ["key": "echo:C", "granted": false])
        #expect(try c.roundTrip(#"{"jsonrpc":"2.0","id":1,"method":"echo.collect","params":{"appKey":"C"}}"#).errorCode == -32003)
        // Another uid may neither set nor clear.
        let r = try first.runAs(
            uid: 65534,
            [
                #"{"jsonrpc":"2.0","id":1,"method":"consent.clear","params":{"key":"device"}}"#,
                #"{"jsonrpc":"2.0","id":2,"method":"consent.clear","params":{"key":"echo:C"}}"#,
            ])
        #expect(r.replies.count == 2)
        for reply in r.replies { #expect(reply.errorCode == -32005, "\(reply)") }
        #expect(try c.call("consent.get", ["key": "device"])["granted"] == .bool(false))
        // Root clears both: granted again, no explicit value left.
        let cleared = try c.call("consent.clear", ["key": "device"])
        #expect(cleared["granted"] == .bool(true) && cleared["changed"] == .bool(true) && cleared["cleared"] == .bool(true), "\(cleared)")
        _ = try c.call("consent.clear", ["key": "echo:C"])
        let g = try c.call("consent.get", ["key": "echo:C"])
        #expect(g["granted"] == .bool(true) && g["explicit"] == .null, "\(g)")
        #expect(try c.call("echo.collect", ["appKey": "C", "data": 1])["stored"] == .int(1))
        // Clearing what is not set changes nothing; a bad layer is refused.
        #expect(try c.call("consent.clear", ["key": "echo:never"])["changed"] == .bool(false))
        #expect(
            try c.roundTrip(#"{"jsonrpc":"2.0","id":9,"method":"consent.clear","params":{"key":"echo:C","layer":"x"}}"#).errorCode == -32602
        )
        // Announced like a set.
        var keys: [String] = []
        while keys.count < 4, let n = try watcher.nextNotification() { keys.append(n["params"]?["key"]?.stringValue ?? "") }
        #expect(keys == ["device", "echo:C", "device", "echo:C"], "\(keys)")
        // Invalid keys and values are refused.
        #expect(
            try c.roundTrip(#"{"jsonrpc":"2.0","id":10,"method":"consent.set","params":{"key":"a b","granted":true}}"#).errorCode == -32602)
        #expect(
            try c.roundTrip(#"{"jsonrpc":"2.0","id":11,"method":"consent.set","params":{"key":"k","granted":"yes"}}"#).errorCode == -32602)
        _ = try c.call("consent.set", ["key": "echo:P", "granted": false])
        // Persisted: a restart finds no explicit switch where one was cleared, and the denied one
        // denied (the plugin receives the snapshot in its handshake).
        first.stop()
        let second = try TestHost(stateDir: first.stateDir)
        let after = try second.client()
        let list = try after.call("consent.list")
        #expect(list["switches"]?["echo:C"] == nil && list["master"] == .bool(true), "\(list)")
        #expect(list["switches"]?["echo:P"] == .bool(false))
        #expect(try after.call("consent.get", ["key": "echo:P"])["granted"] == .bool(false))
        #expect(try after.roundTrip(#"{"jsonrpc":"2.0","id":1,"method":"echo.collect","params":{"appKey":"P"}}"#).errorCode == -32003)
    }
}
