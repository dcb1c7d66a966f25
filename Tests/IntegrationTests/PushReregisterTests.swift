import Foundation
import PylonClientKit
import TestSupport
import Testing

/// A backend that forgets the device (issue 33, "Reset"): the push plugin notices by itself (its
/// periodic registration check, `registrationCheckMs`), registers again, binds its user again
/// and receives the next send — without a restart. Real host, plugins, backend and mosquitto.
@Suite(.serialized) struct PushReregisterTests {
    /// Fast checks for the test; the defaults are 15 min and 1 min.
    static let fast: JSONObject = ["registrationCheckMs": 200, "minReregisterIntervalMs": 100]

    static func brokerConfig(_ b: TestBroker) -> JSONObject {
        ["host": "127.0.0.1", "port": .int(Int64(b.port)), "keepaliveS": 5, "backoffInitialMs": 50, "backoffMaxMs": 500]
    }

    /// Binds `user`, proves a send to the user arrives, and answers the plugin's pid.
    static func bindAndReceive(_ h: TestHost, _ backend: TestBackend, user: String, app: PushApp) throws -> Int64 {
        _ = try h.pushToken()
        #expect(pcode(try h.client().call("push.bind", ["userId": .string(user)])) == 0)
        let sent = try PushWorld.send(
            backend, ["appId": "rr", "targetType": "user", "target": .string(user), "title": "before"], timeout: 10)
        #expect(sent["devices"] == 1)
        let p = try #require(try app.receive(timeoutMs: 10_000))
        #expect(p["message"]?["title"] == "before")
        return try #require(try h.plugin("push")["pid"]?.intValue)
    }

    /// After `POST /v1/admin/reset` (push tokens and bindings gone, devices kept) the check gets
    /// another push token, and the plugin binds its user to it again.
    @Test func aResetBackendHasTheDeviceBoundAgain() throws {
        let broker = try TestBroker()
        let backend = try TestBackend(broker: broker, args: ["--enable-reset"])
        let h = try TestHost(plugins: PushWorld.plugins(backend, broker: Self.brokerConfig(broker), Self.fast))
        let app = try PushApp(h, appId: "rr")
        let pid = try Self.bindAndReceive(h, backend, user: "reset-user", app: app)
        let before = try #require(try h.pushStatus()["token"]?.stringValue)

        #expect(try backend.request("POST", "/v1/admin/reset").status == 200)
        #expect(try backend.request("GET", "/v1/inspect/push/bindings").json["bindings"]?.arrayValue?.isEmpty == true)
        try waitUntil(timeout: 15) {
            let b = try backend.request("GET", "/v1/inspect/push/bindings").json["bindings"]?.arrayValue ?? []
            return b.first?["userId"] == "reset-user"
        }
        let s = try h.pushStatus()
        #expect(s["token"]?.stringValue != before, "a new push token")
        #expect(s["reregistration"]?["reason"] == "token_replaced")
        #expect((s["reregistration"]?["count"]?.intValue ?? 0) >= 1)
        #expect(s["boundUser"] == "reset-user")

        let sent = try PushWorld.send(
            backend, ["appId": "rr", "targetType": "user", "target": "reset-user", "title": "after"], timeout: 10)
        #expect(sent["devices"] == 1)
        let p = try #require(try app.receive(timeoutMs: 10_000))
        #expect(p["message"]?["title"] == "after")
        #expect(try h.plugin("push")["pid"]?.intValue == pid, "no restart")
    }

    /// Without the periodic check, the next push call finds out: a bind after the reset is
    /// answered 3001 by the backend (push token unknown), the plugin registers again, binds its
    /// user again, then makes the bind again — the caller sees it succeed.
    @Test func aBindAfterAResetRegistersAgainAndSucceeds() throws {
        let broker = try TestBroker()
        let backend = try TestBackend(broker: broker, args: ["--enable-reset"])
        let h = try TestHost(
            plugins: PushWorld.plugins(
                backend, broker: Self.brokerConfig(broker), ["registrationCheckMs": 0, "minReregisterIntervalMs": 100]))
        let app = try PushApp(h, appId: "rr")
        _ = try Self.bindAndReceive(h, backend, user: "first-user", app: app)
        #expect(try backend.request("POST", "/v1/admin/reset").status == 200)
        #expect(pcode(try h.client().call("push.bind", ["userId": "second-user"])) == 0)
        let b = try backend.request("GET", "/v1/inspect/push/bindings").json["bindings"]?.arrayValue ?? []
        #expect(b.compactMap { $0["userId"]?.stringValue } == ["second-user"], "the old binding again, then the new one replacing it")
        let s = try h.pushStatus()
        #expect(s["reregistration"]?["reason"] == "token_unknown")
        #expect(s["boundUser"] == "second-user")
        let sent = try PushWorld.send(
            backend, ["appId": "rr", "targetType": "user", "target": "second-user", "title": "after"], timeout: 10)
        #expect(sent["devices"] == 1)
        #expect(try app.receive(timeoutMs: 10_000)?["message"]?["title"] == "after")
    }

    /// A backend started again on a fresh database no longer knows the device token: the check
    /// gets 401, the plugin enrols again (a new device id and broker identity), reconnects,
    /// registers, binds its user again and receives.
    @Test func aBackendThatLostTheDeviceHasItRegisteredAgain() throws {
        let broker = try TestBroker()
        let first = try TestBackend(broker: broker)
        let h = try TestHost(plugins: PushWorld.plugins(first, broker: Self.brokerConfig(broker), Self.fast))
        let app = try PushApp(h, appId: "rr")
        let pid = try Self.bindAndReceive(h, first, user: "lost-user", app: app)
        let oldDevice = try #require(try h.pushStatus()["deviceId"]?.stringValue)

        // The same address, a new database: every device and binding is gone.
        first.process.terminate()
        first.process.waitUntilExit()
        let second = try TestBackend(broker: broker, args: ["--listen", "127.0.0.1:\(first.port)"])
        #expect(second.port == first.port)
        try waitUntil(timeout: 15) {
            let b = try second.request("GET", "/v1/inspect/push/bindings").json["bindings"]?.arrayValue ?? []
            return b.first?["userId"] == "lost-user"
        }
        try waitUntil(timeout: 10) { try h.pushStatus()["connection"] == "connected" }
        let s = try h.pushStatus()
        #expect(s["deviceId"]?.stringValue != oldDevice, "enrolled again")
        #expect(s["reregistration"]?["reason"] == "credential_rejected")
        #expect(s["deviceRegistered"] == true)

        let sent = try PushWorld.send(second, ["appId": "rr", "targetType": "user", "target": "lost-user", "title": "after"], timeout: 10)
        #expect(sent["devices"] == 1)
        let p = try #require(try app.receive(timeoutMs: 10_000))
        #expect(p["message"]?["title"] == "after")
        #expect(try h.plugin("push")["pid"]?.intValue == pid, "no restart")
    }
}
