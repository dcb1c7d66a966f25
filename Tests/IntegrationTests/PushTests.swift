import Foundation
import PylonClientKit
import TestSupport
import Testing

/// A broker and a backend publishing to it.
final class PushWorld {
    let broker: TestBroker
    let backend: TestBackend

    init(autosaveInterval: Int = 1) throws {
        broker = try TestBroker(autosaveInterval: autosaveInterval)
        backend = try TestBackend(broker: broker)
    }

    /// The uploader and the push plugin against this world, fast retries for tests.
    func plugins(_ extra: JSONObject = [:]) -> [JSON] {
        PushWorld.plugins(
            backend,
            broker: ["host": "127.0.0.1", "port": .int(Int64(broker.port)), "keepaliveS": 5, "backoffInitialMs": 50, "backoffMaxMs": 500],
            extra)
    }

    /// The uploader and the push plugin against `backend` and `broker` (the plugin's `broker`
    /// config), fast retries for tests; `extra` overrides the plugin's config.
    static func plugins(_ backend: TestBackend, broker: JSONObject, _ extra: JSONObject = [:]) -> [JSON] {
        var cfg: JSONObject = [
            "backend": .string(backend.baseURL), "credentialFile": .string(backend.credentialFile), "broker": .object(broker),
            "registerRetryInitialMs": 100, "registerRetryMaxMs": 1000, "retryInitialMs": 100, "retryMaxMs": 1000,
            "tokenWaitMs": 3000, "ackTimeoutMs": 3000,
        ]
        for (k, v) in extra { cfg[k] = v }
        return [
            TestHost.uploader(backend, config: ["streams": ["push.*": ["maxCount": 50, "intervalMs": 600000]]]),
            [
                "name": "push", "exec": "pylon-push", "backoffInitialMs": 50, "heartbeatIntervalMs": 500,
                "heartbeatTimeoutMs": 5000, "config": .object(cfg),
            ],
        ]
    }

    /// `POST /v1/admin/push/send`, retried while the backend's broker connection comes up.
    @discardableResult
    func send(_ body: JSONObject) throws -> JSON { try PushWorld.send(backend, body, timeout: 10) }

    /// `POST /v1/admin/push/send` to `backend`, retried on 503 for up to `timeout` seconds.
    static func send(_ backend: TestBackend, _ body: JSONObject, timeout: Double) throws -> JSON {
        var last: (status: Int, json: JSON) = (0, .null)
        try waitUntil(timeout: timeout) {
            last = try backend.request("POST", "/v1/admin/push/send", body: .object(body))
            return last.status != 503
        }
        guard last.status == 200 else { throw TestFailure(description: "send failed: \(last.status) \(last.json.serialized)") }
        return last.json
    }

    func bindings() throws -> JSON { try backend.request("GET", "/v1/inspect/push/bindings").json }
    func deliveries(_ msgId: String) throws -> [JSON] {
        try backend.request("GET", "/v1/inspect/push/deliveries?msgId=\(msgId)").json["deliveries"]?.arrayValue ?? []
    }
}

/// A backend that sends pushes and shows their deliveries (`PushWorld`, `ClusterWorld`).
protocol PushSender {
    @discardableResult func send(_ body: JSONObject) throws -> JSON
    func deliveries(_ msgId: String) throws -> [JSON]
}

extension PushWorld: PushSender {}

extension PushSender {
    /// The barrier for "nothing else reaches `app`", instead of waiting to see nothing arrive:
    /// what arrives later must be on its way already, and this makes it arrive first. Two
    /// markers go to `app` on the device with push token `token`, one after the other:
    /// - the broker delivers a device's queued messages in order, so anything sent before the
    ///   first marker reaches the plugin before it;
    /// - the device says hello (asking the backend to publish its unacknowledged sends again)
    ///   when it connects, before it reports the first marker's acknowledgement on the same
    ///   topic; once the backend has recorded that acknowledgement it has also handled the
    ///   hello (and its own subscription grant), so whatever it published again went out before
    ///   the second marker;
    /// - then until the plugin's inbox is empty (`push.status` `inbox.count`) whatever reaches
    ///   `app` is taken too: a message restored after a restart waits out a backoff before it is
    ///   delivered again, so it may come after the markers.
    /// Returns the callbacks `app` got before the markers, acknowledged: each one a message that
    /// should not have reached it.
    func drain(_ app: PushApp, host h: TestHost, token: String) throws -> [JSON] {
        var early: [JSON] = []
        for n in 1...2 {
            let marker = try send(["appId": .string(app.appId), "target": .string(token), "title": .string("marker \(n)")])
            let msgId = try #require(marker["msgId"]?.stringValue)
            while true {
                let p = try #require(try app.receive(timeoutMs: 15_000), "marker \(n) reaches the app")
                if p["message"]?["id"] == .string(msgId) { break }
                early.append(p)
            }
            try waitUntil(timeout: 10) { try deliveries(msgId).first?["ackedAt"]?.intValue != nil }
        }
        try waitUntil(timeout: 10) {
            if let p = try app.receive(timeoutMs: 20) { early.append(p) }
            return try h.pushStatus()["inbox"]?["count"] == 0
        }
        return early
    }
}

extension TestHost {
    func pushStatus() throws -> JSON { try client().call("push.status", nil, timeoutMs: 5000) }

    /// This device's token once registration completed.
    func pushToken(timeout: Double = 10) throws -> String {
        var token: String?
        try waitUntil(timeout: timeout) {
            let s = try pushStatus()
            token = s["token"]?.stringValue
            return token != nil && s["connection"]?.stringValue == "connected"
        }
        return token!
    }

    func pushCounter(_ name: String) throws -> Int64 { try pushStatus()["counters"]?[name]?.intValue ?? -1 }
}

/// A local app: a client that serves a callback and attaches an appId.
final class PushApp {
    let client: SyncClient
    let appId: String
    let callback: String
    private var buffered: [JSON] = []

    init(_ h: TestHost, appId: String, callback: String = "app\(Int.random(in: 1000...9999)).onPush", attach: Bool = true) throws {
        client = try h.client()
        self.appId = appId
        self.callback = callback
        _ = try client.call("bus.provide", ["method": .string(callback)])
        if attach {
            let r = try self.attach(appId)
            guard r["code"]?.intValue == 0 else { throw TestFailure(description: "attach failed: \(r.serialized)") }
        }
    }

    /// `push.attach`; callbacks that arrive meanwhile are kept for `next`.
    func attach(_ appId: String, callback cb: String? = nil) throws -> JSON {
        try client.sendLine(
            #"{"jsonrpc":"2.0","id":"attach","method":"push.attach","params":"#
                + JSON.object(["appId": .string(appId), "callback": .string(cb ?? callback)]).serialized + "}")
        while let m = try client.readMessage(timeoutMs: 5000) {
            if m["id"] == .string("attach") { return m["result"] ?? m }
            if m["method"] != nil { buffered.append(m) }
        }
        throw TestFailure(description: "no reply to push.attach")
    }

    /// The next callback request (its host id and params), nil when none within `timeoutMs`.
    func next(timeoutMs: Int = 5000) throws -> (id: JSON, params: JSON)? {
        if !buffered.isEmpty { let m = buffered.removeFirst(); return (m["id"]!, m["params"] ?? .null) }
        let deadline = Date().addingTimeInterval(Double(timeoutMs) / 1000)
        while Date() < deadline {
            let left = Int(deadline.timeIntervalSinceNow * 1000)
            guard left > 0, let m = try client.readMessage(timeoutMs: left) else { return nil }
            if m["method"]?.stringValue == callback, let id = m["id"] { return (id, m["params"] ?? .null) }
        }
        return nil
    }

    func ack(_ id: JSON) throws {
        try client.sendLine(JSON.object(["jsonrpc": "2.0", "id": id, "result": ["ok": true]]).serialized)
    }
    func refuse(_ id: JSON) throws {
        try client.sendLine(JSON.object(["jsonrpc": "2.0", "id": id, "error": ["code": -32000, "message": "busy"]]).serialized)
    }

    /// Receives and acknowledges one message: its params (`message`, `coldStart`).
    func receive(timeoutMs: Int = 5000) throws -> JSON? {
        guard let (id, p) = try next(timeoutMs: timeoutMs) else { return nil }
        try ack(id)
        return p
    }
}

func pcode(_ j: JSON) -> Int64? { j["code"]?.intValue }

/// The push plugin end to end: real host, push plugin, uploader, backend and mosquitto.
@Suite(.serialized) struct PushPluginTests {
    @Test func registersBindsDeliversAndReportsTheAck() throws {
        let w = try PushWorld()
        let h = try TestHost(plugins: w.plugins())
        let token = try h.pushToken()
        let c = try h.client()
        #expect(pcode(try c.call("push.register")) == 0)
        #expect(try c.call("push.register")["token"] == .string(token), "registration is stable")
        #expect(pcode(try c.call("push.bind", ["userId": "u1"])) == 0)
        #expect(try w.bindings()["bindings"]?.arrayValue?.first?["userId"] == "u1")
        let app = try PushApp(h, appId: "demo")
        let sent = try w.send([
            "appId": "demo", "targetType": "user", "target": "u1", "title": "Hi", "content": "Body",
            "extendedParams": ["k": "v"], "uri": "demo://open", "silent": true,
        ])
        let p = try #require(try app.receive())
        #expect(p["coldStart"] == false)
        let m = try #require(p["message"])
        #expect(m["id"] == sent["msgId"])
        #expect(m["title"] == "Hi")
        #expect(m["content"] == "Body")
        #expect(m["extras"]?["k"] == "v")
        #expect(m["action"]?["type"] == "uri")
        #expect(m["silent"] == true)
        let msgId = try #require(sent["msgId"]?.stringValue)
        try waitUntil(timeout: 5) { try w.deliveries(msgId).first?["ackedAt"]?.intValue != nil }
        try waitUntil(timeout: 5) { try h.pushCounter("acknowledged") == 1 }
        let s = try h.pushStatus()
        #expect(s["boundUser"] == "u1")
        #expect(s["attachedApps"] == ["demo"])
        #expect(s["counters"]?["received"] == 1)
        #expect(s["counters"]?["delivered"] == 1)
    }

    @Test func messagesForAnAppNotAttachedWaitAndArriveColdDedupedAndExpired() throws {
        let w = try PushWorld()
        let h = try TestHost(plugins: w.plugins())
        let token = try h.pushToken()
        let first = try w.send(["appId": "cold", "target": .string(token), "title": "one", "msgKey": "k1"])
        let again = try w.send(["appId": "cold", "target": .string(token), "title": "one again", "msgKey": "k1"])
        #expect(again["duplicate"] == true, "the backend keeps msgKey unique per target")
        #expect(again["msgId"] == first["msgId"])
        try w.send(["appId": "cold", "target": .string(token), "title": "short", "expiredSeconds": 1])
        try waitUntil(timeout: 5) { try h.pushCounter("received") == 2 }
        // The same msgKey reaching the device again under another id (a user send, say) is a duplicate.
        #expect(pcode(try h.client().call("push.bind", ["userId": "cold-user"])) == 0)
        try w.send(["appId": "cold", "targetType": "user", "target": "cold-user", "title": "dup", "msgKey": "k1"])
        try waitUntil(timeout: 5) { try h.pushCounter("duplicates") == 1 }
        try waitUntil(timeout: 5) { try h.pushCounter("expired") == 1 }
        let app = try PushApp(h, appId: "cold", attach: false)
        let r = try app.attach("cold")
        #expect(r["pending"] == 1)
        let p = try #require(try app.receive())
        #expect(p["coldStart"] == true)
        #expect(p["message"]?["title"] == "one")
        #expect(try w.drain(app, host: h, token: token) == [], "the expired and duplicate messages are never delivered")
        #expect(try h.pushCounter("delivered") == 3, "the message and the two markers")
    }

    @Test func anOfflineDeviceReceivesAfterReconnecting() throws {
        let w = try PushWorld()
        let h = try TestHost(plugins: w.plugins())
        let token = try h.pushToken()
        h.stop()
        for i in 0..<3 { try w.send(["appId": "off", "target": .string(token), "title": .string("m\(i)")]) }
        try h.start()
        let app = try PushApp(h, appId: "off")
        var titles: [String] = []
        while let p = try app.receive(timeoutMs: 5000) {
            titles.append(p["message"]?["title"]?.stringValue ?? "")
            if titles.count == 3 { break }
        }
        #expect(titles == ["m0", "m1", "m2"], "the broker kept the persistent session's messages")
    }

    /// Issue 21 item 14: mosquitto acknowledges a send and keeps it in memory until its next
    /// save; kill -9 before that loses it. The backend keeps every send until the device
    /// acknowledges it and publishes it again when the device reconnects (its hello).
    @Test func aSendTheBrokerLostInAKill9StillArrives() throws {
        let w = try PushWorld(autosaveInterval: 3600)
        let h = try TestHost(plugins: w.plugins())
        let token = try h.pushToken()
        h.stop()  // the device is offline: the broker queues the send in memory only
        let sent = try w.send(["appId": "lost", "target": .string(token), "title": "survives"])
        let msgId = try #require(sent["msgId"]?.stringValue)
        try waitUntil(timeout: 5) { try w.deliveries(msgId).first?["pubackAt"]?.intValue != nil }
        w.broker.stop()  // SIGKILL: nothing saved since the broker started
        try w.broker.start()
        try h.start()
        let app = try PushApp(h, appId: "lost")
        let p = try #require(try app.receive(timeoutMs: 10_000), "the send the broker acknowledged and lost arrives")
        #expect(p["message"]?["id"] == .string(msgId))
        try waitUntil(timeout: 5) { try w.deliveries(msgId).first?["ackedAt"]?.intValue != nil }
        #expect(try w.drain(app, host: h, token: token) == [], "delivered once")
        #expect(try h.pushCounter("delivered") == 3, "the message and the two markers")
    }

    @Test func killingThePluginBeforeTheAckRedeliversOnceAndNeverAfterTheAck() throws {
        let w = try PushWorld()
        let h = try TestHost(plugins: w.plugins())
        let token = try h.pushToken()
        let app = try PushApp(h, appId: "k9")
        try w.send(["appId": "k9", "target": .string(token), "title": "x"])
        let (_, p1) = try #require(try app.next())
        let msgId = p1["message"]?["id"]
        let pid = try #require(try h.plugin("push")["pid"]?.intValue)
        kill(Int32(pid), SIGKILL)
        try h.waitForPlugin("push", restartsAtLeast: 1)
        let (id2, p2) = try #require(try app.next(timeoutMs: 8000), "redelivered after the restart")
        #expect(p2["message"]?["id"] == msgId)
        try app.ack(id2)
        try waitUntil(timeout: 5) { try h.pushCounter("acknowledged") == 1 }
        let pid2 = try #require(try h.plugin("push")["pid"]?.intValue)
        kill(Int32(pid2), SIGKILL)
        try h.waitForPlugin("push", restartsAtLeast: 2)
        #expect(try w.drain(app, host: h, token: token) == [], "never delivered again once acknowledged")
        #expect(try h.pushCounter("delivered") == 2, "the two markers only")
    }

    @Test func killingTheHostBeforeTheAckRedeliversOnceAndNeverAfterTheAck() throws {
        let w = try PushWorld()
        let h = try TestHost(plugins: w.plugins())
        let token = try h.pushToken()
        var app = try PushApp(h, appId: "hk")
        try w.send(["appId": "hk", "target": .string(token), "title": "x"])
        let (_, p1) = try #require(try app.next())
        h.kill9()
        try h.start()
        app = try PushApp(h, appId: "hk")
        let (id2, p2) = try #require(try app.next(timeoutMs: 8000))
        #expect(p2["message"]?["id"] == p1["message"]?["id"])
        #expect(p2["coldStart"] == false, "stored while its app was attached: not a cold start after the restart either")
        try app.ack(id2)
        try waitUntil(timeout: 5) { try h.pushCounter("acknowledged") == 1 }
        h.kill9()
        try h.start()
        app = try PushApp(h, appId: "hk")
        #expect(try w.drain(app, host: h, token: token) == [], "never delivered again once acknowledged")
        #expect(try h.pushCounter("delivered") == 2, "the two markers only")
    }

    @Test func userTargetingReachesEveryBoundDeviceAndRebindingMovesTheDevice() throws {
        let w = try PushWorld()
        let a = try TestHost(plugins: w.plugins())
        let b = try TestHost(plugins: w.plugins())
        let ta = try a.pushToken(), tb = try b.pushToken()
        #expect(ta != tb, "two installs, two tokens")
        #expect(pcode(try a.client().call("push.bind", ["userId": "ann"])) == 0)
        #expect(pcode(try b.client().call("push.bind", ["userId": "ann"])) == 0)
        let appA = try PushApp(a, appId: "u"), appB = try PushApp(b, appId: "u")
        #expect(try w.send(["appId": "u", "targetType": "user", "target": "ann", "title": "both"])["devices"] == 2)
        #expect(try appA.receive()?["message"]?["title"] == "both")
        #expect(try appB.receive()?["message"]?["title"] == "both")
        // Device A binds another user: the server unbinds ann from it first.
        #expect(pcode(try a.client().call("push.bind", ["userId": "bob"])) == 0)
        let binds = try w.bindings()["bindings"]?.arrayValue ?? []
        #expect(binds.contains { $0["token"] == .string(ta) && $0["userId"] == "bob" })
        #expect(!binds.contains { $0["token"] == .string(ta) && $0["userId"] == "ann" })
        #expect(try w.send(["appId": "u", "targetType": "user", "target": "ann", "title": "only b"])["devices"] == 1)
        #expect(try appB.receive()?["message"]?["title"] == "only b")
        #expect(try w.drain(appA, host: a, token: ta) == [], "device A is no longer ann's")
        #expect(pcode(try b.client().call("push.unbind", ["userId": "ann"])) == 0)
        #expect(try w.send(["appId": "u", "targetType": "user", "target": "ann", "title": "none"])["devices"] == 0)
        #expect(try w.send(["appId": "u", "targetType": "broadcast", "title": "all"])["devices"] == 2)
        #expect(try appA.receive()?["message"]?["title"] == "all")
        #expect(try appB.receive()?["message"]?["title"] == "all")
    }

    @Test func bindNeedsAUserIdAndWaitsForRegistrationInOrder() throws {
        let w = try PushWorld()
        let h = try TestHost(plugins: w.plugins(["deferRegistration": true, "tokenWaitMs": 600]))
        let c = try h.client()
        #expect(pcode(try c.call("push.bind", ["userId": ""])) == 3012)
        #expect(pcode(try c.call("push.bind", [:])) == 3012)
        #expect(pcode(try c.call("push.bind", ["userId": "early"])) == 3001, "no token: waiting timed out")
        #expect(try h.pushStatus()["registration"] == "deferred")
        // Calls made before registration wait, then run in call order.
        let c2 = try h.client()
        try c2.sendLine(#"{"jsonrpc":"2.0","id":1,"method":"push.bind","params":{"userId":"first"}}"#)
        try c2.sendLine(#"{"jsonrpc":"2.0","id":2,"method":"push.bind","params":{"userId":"second"}}"#)
        try c2.sendLine(#"{"jsonrpc":"2.0","id":3,"method":"push.register"}"#)
        var replies: [JSON] = []
        while replies.count < 3, let m = try c2.readMessage(timeoutMs: 5000) { replies.append(m) }
        // The register's answer may come before or after the binds'; the binds answer in call order.
        let ids = replies.compactMap { $0["id"]?.intValue }
        #expect(ids.sorted() == [1, 2, 3], "\(replies.map(\.serialized))")
        #expect(ids.filter { $0 != 3 } == [1, 2], "the binds answered in call order: \(ids)")
        #expect(replies.allSatisfy { pcode($0["result"] ?? .null) == 0 }, "\(replies.map(\.serialized))")
        #expect(try h.pushStatus()["boundUser"] == "second", "binds ran in call order")
    }

    @Test func aTokenChangeRebindsTheUser() throws {
        let w = try PushWorld()
        let h = try TestHost(plugins: w.plugins())
        _ = try h.pushToken()
        let c = try h.client()
        #expect(pcode(try c.call("push.bind", ["userId": "carol"])) == 0)
        let newToken = String(repeating: "ab", count: 16)
        #expect(pcode(try c.call("push.setDeviceToken", ["token": .string(newToken)])) == 0)
        #expect(pcode(try c.call("push.setDeviceToken", ["token": "not hex"])) == 3002)
        try waitUntil(timeout: 5) {
            try w.bindings()["bindings"]?.arrayValue?.contains { $0["token"] == .string(newToken) && $0["userId"] == "carol" } == true
        }
        let app = try PushApp(h, appId: "t")
        try w.send(["appId": "t", "targetType": "user", "target": "carol", "title": "new token"])
        #expect(try app.receive()?["message"]?["title"] == "new token")
    }

    @Test func liveActivityFiltersSchemasAndResubmission() throws {
        let w = try PushWorld()
        let h = try TestHost(plugins: w.plugins())
        _ = try h.pushToken()
        let app = try PushApp(h, appId: "la")
        let c = try h.client()
        func bind(_ id: String, _ tok: String, _ filter: String, schema: JSON? = nil) throws -> JSON {
            var p: JSONObject = ["activityId": .string(id), "pushToken": .string(tok), "filter": .string(filter), "appId": "la"]
            if let schema { p["contentStateSchema"] = schema }
            return try c.call("push.liveActivityBind", .object(p))
        }
        #expect(pcode(try bind("act1", "pt1", "call", schema: ["score": "integer", "team": "string"])) == 0)
        let repeatCall = try bind("act1", "pt1", "call")
        #expect(pcode(repeatCall) == 3006)
        #expect(repeatCall["message"] == "callRepeat")
        let abandoned = try bind("act1", "pt1", "abandon")
        #expect(abandoned["code"] == 0 && abandoned["dropped"] == true)
        #expect(pcode(try bind("act1", "pt1", "refuse")) == 0, "refuse: no filtering")
        #expect(pcode(try bind("act1", "pt2", "call")) == 0, "a new token for the same activity is not a repeat")
        // A failed submission is forgotten: re-submitting the same pair is not a repeat.
        try w.backend.faults(["failNext": 1, "status": 500])
        #expect(pcode(try bind("act2", "ptx", "call")) == 3005)
        #expect(pcode(try bind("act2", "ptx", "call")) == 0)
        // Updates go to the app that bound the activity; the content state must match its schema.
        try w.send([
            "targetType": "activity", "target": "act1", "activityEvent": "update",
            "activityContentState": ["score": 2, "team": "red"],
        ])
        let p = try #require(try app.receive())
        #expect(p["message"]?["liveActivity"]?["activityId"] == "act1")
        #expect(p["message"]?["liveActivity"]?["contentState"]?["score"] == 2)
        try w.send([
            "targetType": "activity", "target": "act1", "activityEvent": "update", "activityContentState": ["score": "two", "team": "red"],
        ])
        try w.send([
            "targetType": "activity", "target": "act1", "activityEvent": "end", "activityContentState": ["score": 3, "team": "red"],
        ])
        #expect(try app.receive()?["message"]?["liveActivity"]?["event"] == "end")
        #expect(try h.pushCounter("schemaMismatch") == 1)
        // Another app cannot take the activity over: its updates would be delivered to it.
        var other: JSONObject = ["activityId": "act1", "pushToken": "ptz", "filter": "call", "appId": "la2"]
        #expect(pcode(try c.call("push.liveActivityBind", .object(other))) == 3003)
        other["activityId"] = "act9"
        #expect(pcode(try c.call("push.liveActivityBind", .object(other))) == 0, "a new activity binds to any app")
    }

    @Test func anotherUserCannotAttachOrReceiveAnAppsMessages() throws {
        let w = try PushWorld()
        let h = try TestHost.open(plugins: w.plugins())
        let token = try h.pushToken()
        let app = try PushApp(h, appId: "secret")
        // The attacker (uid 65534) provides its own callback and tries to attach the same appId.
        let r = try h.runAs(
            sequential: true,
            [
                #"{"jsonrpc":"2.0","id":0,"method":"bus.provide","params":{"method":"evil.cb"}}"#,
                #"{"jsonrpc":"2.0","id":1,"method":"push.attach","params":{"appId":"secret","callback":"evil.cb"}}"#,
                #"{"jsonrpc":"2.0","id":2,"method":"push.attach","params":{"appId":"other","callback":"\#(app.callback)"}}"#,
                #"{"jsonrpc":"2.0","id":3,"method":"push.detach","params":{"appId":"secret"}}"#,
            ])
        #expect(pcode(r.replies[1]["result"] ?? .null) == 3003, "appId owned by another uid")
        #expect(pcode(r.replies[2]["result"] ?? .null) == 3003, "callback served by another client")
        #expect(pcode(r.replies[3]["result"] ?? .null) == 3003)
        try w.send(["appId": "secret", "target": .string(token), "title": "for A only"])
        #expect(try app.receive()?["message"]?["title"] == "for A only")
        // A second client of the same user cannot take the attachment over while A is attached.
        let other = try PushApp(h, appId: "secret", attach: false)
        #expect(pcode(try other.attach("secret")) == 3003)
    }

    @Test func openReportsGoThroughTheUploaderOnceAndNotWithoutConsent() throws {
        let w = try PushWorld()
        let h = try TestHost(plugins: w.plugins())
        _ = try h.pushToken()
        let c = try h.client()
        let info: JSON = ["id": "mopen1", "appId": "o", "title": "t"]
        #expect(pcode(try c.call("push.openLogReport", ["userInfo": info])) == 0)
        let dup = try c.call("push.openLogReport", ["userInfo": info])
        #expect(pcode(dup) == 0 && dup["duplicate"] == true, "idempotent per message id")
        _ = try c.call("consent.set", ["key": "push:opens", "granted": false])
        let denied = try c.request("push.openLogReport", ["userInfo": ["id": "mopen2"]])
        #expect(denied.errorCode == -32003, "the host enforces push:opens")
        _ = try c.call("uploader.flush", ["stream": "push.opens", "wait": true], timeoutMs: 30000)
        let ids = try w.backend.recordIds("push.opens")
        #expect(ids == ["mopen1"])
        let opens = try w.backend.request("GET", "/v1/inspect/push/opens").json["opens"]?.arrayValue ?? []
        #expect(opens.count == 1)
    }

    @Test func hostileInputIsCountedAndNeverCrashes() throws {
        let w = try PushWorld()
        let h = try TestHost(plugins: w.plugins(["maxPayloadBytes": 1024, "ackTimeoutMs": 400]))
        let token = try h.pushToken()
        let pid = try h.plugin("push")["pid"]?.intValue
        let topic = "pylon/push/d/" + (try #require(try h.pushStatus()["deviceId"]?.stringValue))
        try w.broker.publishRaw(topic: topic, Array("not json".utf8))
        try w.broker.publishRaw(topic: topic, Array(#"{"id":"x"}"#.utf8))
        try w.broker.publishRaw(topic: topic, [UInt8](repeating: 0x7B, count: 4096))
        try w.broker.publishRaw(topic: topic, [0xFF, 0xFE, 0x00])
        try w.broker.publishRaw(topic: topic, Array(#"{"id":"u1","appId":"h","title":"ok","weird":{"deep":[1,2]}}"#.utf8))
        try waitUntil(timeout: 5) { try h.pushCounter("malformed") == 4 }
        #expect(try h.pushCounter("unknownFields") == 1)
        // A callback client that never answers: the delivery times out and is retried.
        let app = try PushApp(h, appId: "h")
        let (_, first) = try #require(try app.next())
        #expect(first["message"]?["weird"] == nil, "unknown fields are not passed on")
        let (id2, again) = try #require(try app.next(timeoutMs: 5000), "redelivered after the ack timeout")
        #expect(again["message"]?["id"] == "u1")
        // An error reply leaves it unacknowledged too; then the client disconnects mid-delivery.
        try app.refuse(id2)
        _ = try #require(try app.next(timeoutMs: 5000))
        shutdown(app.client.fd, Int32(SHUT_RDWR))
        try waitUntil(timeout: 5) { try h.pushStatus()["attachedApps"] == [] }
        let app2 = try PushApp(h, appId: "h")
        #expect(try app2.receive(timeoutMs: 5000)?["message"]?["id"] == "u1")
        try waitUntil(timeout: 5) { try h.pushCounter("acknowledged") == 1 }
        // The broker goes away and comes back; a backend 5xx on bind is a counted failure.
        w.broker.stop()
        try waitUntil(timeout: 5) { try h.pushStatus()["connection"] != "connected" }
        #expect(try h.pushStatus()["lastError"] != .null)
        try w.broker.start()
        try waitUntil(timeout: 10) { try h.pushStatus()["connection"] == "connected" }
        try w.backend.faults(["failNext": 1, "status": 503])
        #expect(pcode(try h.client().call("push.bind", ["userId": "z"])) == 3005)
        #expect(try h.pushCounter("backendErrors") >= 1)
        try w.send(["appId": "h", "target": .string(token), "title": "after"])
        #expect(try app2.receive(timeoutMs: 8000)?["message"]?["title"] == "after")
        #expect(try h.plugin("push")["pid"]?.intValue == pid, "the plugin never crashed")
    }

    @Test func theInboxIsBoundedAndDropsTheOldestFirst() throws {
        let w = try PushWorld()
        let h = try TestHost(plugins: w.plugins(["inboxMaxCount": 3]))
        let token = try h.pushToken()
        for i in 0..<5 { try w.send(["appId": "b", "target": .string(token), "title": .string("m\(i)")]) }
        try waitUntil(timeout: 5) { try h.pushCounter("received") == 5 }
        #expect(try h.pushCounter("dropped") == 2)
        let app = try PushApp(h, appId: "b")
        var titles: [String] = []
        for _ in 0..<3 { titles.append(try app.receive()?["message"]?["title"]?.stringValue ?? "") }
        #expect(titles == ["m2", "m3", "m4"])
        #expect(try w.drain(app, host: h, token: token) == [], "the dropped ones never arrive")
    }
}

/// The broker as Pylon configures it (issue 21 item 2): dynamic security, no anonymous clients,
/// one credential and client id per device, each device limited to its own topics. The hostile
/// clients run as uid 65534.
@Suite(.serialized) struct PushBrokerSecurityTests {
    @Test func anonymousAndForeignClientsGetNothingAndForgeNothing() throws {
        let w = try PushWorld()
        let h = try TestHost(plugins: w.plugins())
        let token = try h.pushToken()
        let status = try h.pushStatus()
        let victim = try #require(status["deviceId"]?.stringValue)
        let clientId = "pylon-push-" + (try #require(status["installId"]?.stringValue))
        let connects = try #require(status["counters"]?["brokerConnects"]?.intValue)

        // Anonymous: refused (CONNACK 5, not authorised), also with the device's client id.
        #expect(try w.broker.probe(["--sub", "#"])["connack"] == 5)
        #expect(try w.broker.probe(["--client-id", clientId, "--sub", "#"])["connack"] == 5)
        // The victim's username with a wrong password: refused.
        #expect(try w.broker.probe(["--user", victim, "--password", "guess-0123456789"])["connack"] == 5)

        // Another device, registered with the backend: its credential works only with its own
        // client id, and it may neither read the victim's topic (nor `#`) nor publish to it.
        let reg = try w.backend.request("POST", "/v1/devices/register", body: ["installId": "attacker"])
        #expect(reg.status == 200)
        let attackerId = try #require(reg.json["deviceId"]?.stringValue)
        let attackerToken = try #require(reg.json["token"]?.stringValue)
        let creds = ["--user", attackerId, "--password", attackerToken]
        #expect(try w.broker.probe(creds + ["--client-id", clientId])["connack"] == 5, "the victim's client id is not its")
        #expect(try w.broker.probe(creds)["connack"] == 5, "a device credential needs its own client id")
        let probe = try w.broker.probe(
            creds + [
                "--client-id", "pylon-push-attacker", "--sub", "#", "--sub", "pylon/push/d/" + victim, "--sub", "pylon/push/ack/+",
                "--sub", "pylon/push/d/" + attackerId,
                "--pub", "pylon/push/d/" + victim, #"{"id":"forged1","appId":"demo","title":"forged"}"#,
                "--pub", "pylon/push/ack/" + victim, #"{"ids":["forged-ack"]}"#, "--until-acked",
            ])
        #expect(probe["connack"] == 0)
        #expect(probe["suback"] == [128, 128, 128, 1], "only its own topic")

        // A genuine push reaches the victim's app; the forged one never did.
        let app = try PushApp(h, appId: "demo")
        let sent = try w.send(["appId": "demo", "target": .string(token), "title": "genuine"])
        let (cbId, got) = try #require(try app.next())
        #expect(got["message"]?["title"] == "genuine")
        let msgId = try #require(sent["msgId"]?.stringValue)
        // A forged acknowledgement of the real message, before the app acknowledges it.
        let forged = try w.broker.probe(
            creds + ["--client-id", "pylon-push-attacker", "--pub", "pylon/push/ack/" + victim, #"{"ids":["\#(msgId)"]}"#])
        #expect(forged["puback"] == 1)
        try waitUntil(timeout: 5) { try w.deliveries(msgId).first?["pubackAt"]?.intValue != nil }
        #expect(try w.deliveries(msgId).first?["ackedAt"] == .null, "the forged ack was not recorded")
        try app.ack(cbId)
        #expect(try w.drain(app, host: h, token: token) == [], "no forged message")
        #expect(try h.pushCounter("received") == 3, "the genuine message and the two markers")
        try waitUntil(timeout: 5) { try w.deliveries(msgId).first?["ackedAt"]?.intValue != nil }
        // An eavesdropper with its own credential saw nothing of it: mosquitto sends what its
        // session kept right after CONNACK, before it answers the SUBSCRIBE sent after that.
        let late = try w.broker.probe(creds + ["--client-id", "pylon-push-attacker", "--sub", "#", "--until-acked"])
        #expect(late["suback"] == [128])
        #expect(late["messages"] == [])
        // The device's session was never taken over.
        #expect(try h.pushCounter("brokerConnects") == connects)
        #expect(try h.pushStatus()["connection"] == "connected")
    }
}

/// Who may change the device's push identity and what `push.status` shows (issue 21 items 10,
/// 12, 17): admins (and `ownerUids`) only.
@Suite(.serialized) struct PushIdentityTests {
    @Test func onlyAdminsOrOwnersChangeThePushIdentityAndSeeIt() throws {
        let w = try PushWorld()
        let h = try TestHost.open(plugins: w.plugins(["ownerUids": [4242]]))
        let token = try h.pushToken()
        #expect(pcode(try h.client().call("push.bind", ["userId": "alice"])) == 0)
        let lines = [
            #"{"jsonrpc":"2.0","id":1,"method":"push.bind","params":{"userId":"mallory"}}"#,
            #"{"jsonrpc":"2.0","id":2,"method":"push.unbind","params":{"userId":"alice"}}"#,
            #"{"jsonrpc":"2.0","id":3,"method":"push.setDeviceToken","params":{"token":"00112233445566778899aabbccddeeff"}}"#,
            #"{"jsonrpc":"2.0","id":4,"method":"push.status"}"#,
            #"{"jsonrpc":"2.0","id":5,"method":"push.register"}"#,
        ]
        let (r, _) = try h.runAs(uid: 65534, sequential: true, lines)
        for i in 0..<3 { #expect(r[i]["result"]?["code"] == 3003, "\(r[i].serialized)") }
        let st = try #require(r[3]["result"])
        for k in ["token", "installId", "deviceId", "boundUser"] { #expect(st[k] == nil, "status shows \(k) to uid 65534") }
        #expect(r[4]["result"]?["code"] == 0)
        #expect(r[4]["result"]?["token"] == nil)
        // Nothing changed at the backend or on the device.
        #expect(try w.bindings()["bindings"] == [["token": .string(token), "userId": "alice"]])
        #expect(try h.pushStatus()["token"] == .string(token))
        // The configured owner uid may.
        let (o, _) = try h.runAs(
            uid: 4242, sequential: true, [#"{"jsonrpc":"2.0","id":0,"method":"push.unbind","params":{"userId":"alice"}}"#])
        #expect(o.first?["result"]?["code"] == 0)
        #expect(try w.bindings()["bindings"] == [])
    }
}
