import Foundation
import PylonClientKit
import PylonProtocol
import TestSupport
import Testing

extension TestHost {
    /// The MA plugin and the uploader, both against `backend`.
    static func maPlugins(_ backend: TestBackend, ma extra: JSONObject = [:]) -> [JSON] {
        var config: JSONObject = [
            "backend": .string(backend.baseURL), "credentialFile": .string(backend.credentialFile), "retryInitialMs": 100,
            "retryMaxMs": 500,
        ]
        for (k, v) in extra { config[k] = v }
        return [
            uploader(backend, config: ["streams": ["ma.*": ["maxCount": 50, "intervalMs": 600000]]]),
            ["name": "ma", "exec": "pylon-ma", "backoffInitialMs": 50, "config": .object(config)],
        ]
    }
}

/// An MA reply's `code`.
func code(_ j: JSON) -> Int64? { j["code"]?.intValue }

extension TestBackend {
    /// The records of AppKey `appKey`'s event stream, after `client` flushed it to this backend.
    func maEvents(_ appKey: String, flushedBy client: SyncClient) throws -> [JSON] {
        _ = try client.call("uploader.flush", ["stream": .string("ma.\(appKey)"), "wait": true], timeoutMs: 30000)
        return try records("ma.\(appKey)")
    }
}

/// The MA plugin end to end: real host, MA plugin, uploader and reference backend.
@Suite(.serialized) struct MAPluginTests {
    func events(_ b: TestBackend, _ appKey: String, _ c: SyncClient) throws -> [JSON] {
        try b.maEvents(appKey, flushedBy: c)
    }

    @Test func callsBeforeStartFailWithMinus2() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        let c = try h.client()
        #expect(code(try c.call("ma.eventRecord", ["eventName": "open"])) == -2)
        #expect(code(try c.call("ma.identifyAccount", ["userID": "u1"])) == -2)
        #expect(code(try c.call("ma.setDataCollectionEnabled", ["enabled": false])) == -2)
        #expect(try c.call("ma.euid")["euid"] == .null)
        #expect(try c.call("ma.isDataCollectionEnabled")["enabled"] == .null)
    }

    @Test func startRequiresAnAppKey() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        #expect(code(try h.client().call("ma.start", ["appKey": "  "])) == -3)
    }

    @Test func startReturnsAnEuidAndEventsReachTheBackendStamped() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        let c = try h.client()
        let s = try c.call("ma.start", ["appKey": "app1"])
        #expect(code(s) == 0)
        let euid = try #require(s["euid"]?.stringValue)
        #expect(try c.call("ma.euid")["euid"] == .string(euid))
        _ = try c.call("ma.setUtmProperties", ["properties": ["utm_source": "kiosk"]])
        #expect(code(try c.call("ma.eventRecord", ["eventName": "purchase", "property": ["price": 10]])) == 0)
        let evs = try events(b, "app1", c)
        let purchase = try #require(evs.first { $0["data"]?["event"] == .string("purchase") })
        #expect(purchase["data"]?["euid"] == .string(euid))
        #expect(purchase["data"]?["properties"]?["price"] == .int(10))
        #expect(purchase["data"]?["utm"]?["utm_source"] == .string("kiosk"))
        #expect(purchase["data"]?["session"]?.stringValue != nil)
        #expect(evs.contains { $0["data"]?["event"] == .string("el_session_start") }, "the session start is recorded like other events")
        #expect(purchase["data"]?["device"]?["idfv"] == nil, "idfv is off by default")
    }

    @Test func invalidEventsAreRejectedWithMinus3() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        let c = try h.client()
        _ = try c.call("ma.start", ["appKey": "app2"])
        for p: JSON in [
            ["eventName": ""], ["eventName": "el_x"], ["property": ["a": 1]], ["eventName": "e", "property": ["Bad-Key": 1]],
            ["eventName": "e", "property": ["Price": 1]], ["eventName": "e", "property": ["priCe": 1]],
        ] {
            #expect(code(try c.call("ma.eventRecord", p)) == -3, "\(p.serialized)")
        }
    }

    /// Large valid events: one enqueue stays under the host's line limit (it skipped a 1.2 MB
    /// enqueue, and with it every event in it), and an event over `maxEventBytes` is refused
    /// alone (-3) instead of failing the uploader's whole enqueue with everyone's events.
    @Test func largeEventsAreBatchedUnderTheLineLimitAndAnOversizedOneIsRefusedAlone() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        let c = try h.client()
        _ = try c.call("ma.start", ["appKey": "big"])
        var props = JSONObject()
        for i in 0..<45 { props["p\(i)"] = .string(String(repeating: "v", count: 200)) }
        let params: JSON = ["eventName": "wide", "property": .object(props)]
        for i in 0..<300 {
            try c.sendLine(JSON.object(["jsonrpc": "2.0", "id": .int(Int64(i)), "method": "ma.eventRecord", "params": params]).serialized)
        }
        var codes: [Int64: Int] = [:]
        for _ in 0..<300 { codes[code(try #require(try c.readMessage(timeoutMs: 30000))["result"] ?? .null) ?? 99, default: 0] += 1 }
        #expect(codes == [0: 300], "\(codes)")
        let huge = JSON.array(Array(repeating: .string(String(repeating: "x", count: 250)), count: 1_100))
        #expect(code(try c.call("ma.eventRecord", ["eventName": "huge", "property": ["list": huge]])) == -3)
        #expect(code(try c.call("ma.eventRecord", ["eventName": "small"])) == 0)
        #expect(try b.maEvents("big", flushedBy: c).filter { $0["data"]?["event"] == "wide" }.count == 300)
    }

    /// An AppKey is its first uid's: another local user can neither read its EUID, identify it,
    /// set its profile or switch, nor record into it (admins and the owner can).
    @Test func anAppKeyBelongsToTheUidThatStartedIt() throws {
        let b = try TestBackend()
        let h = try TestHost.open(plugins: TestHost.maPlugins(b))
        let owner = try h.runAs(
            uid: 1000, gid: 1000, sequential: true,
            [#"{"jsonrpc":"2.0","id":1,"method":"ma.start","params":{"appKey":"mine"}}"#])
        #expect(owner.replies.first?["result"]?["code"] == .int(0), "\(owner.replies)")
        let r = try h.runAs(
            uid: 65534, gid: 65534, sequential: true,
            [
                #"{"jsonrpc":"2.0","id":1,"method":"ma.start","params":{"appKey":"mine"}}"#,
                #"{"jsonrpc":"2.0","id":2,"method":"ma.euid","params":{"appKey":"mine"}}"#,
                #"{"jsonrpc":"2.0","id":3,"method":"ma.identifyAccount","params":{"appKey":"mine","userID":{"email":"x@evil.example"}}}"#,
                #"{"jsonrpc":"2.0","id":4,"method":"ma.eventRecord","params":{"appKey":"mine","eventName":"spoof"}}"#,
                #"{"jsonrpc":"2.0","id":5,"method":"ma.setDataCollectionEnabled","params":{"appKey":"mine","enabled":false}}"#,
            ])
        #expect(r.replies.count == 5, "\(r.replies.map(\.serialized))")
        for reply in r.replies {
            #expect(reply["result"]?["code"] == .int(-1), "\(reply.serialized)")
            #expect(reply["result"]?["euid"] == nil)
        }
        let again = try h.runAs(
            uid: 1000, gid: 1000, [#"{"jsonrpc":"2.0","id":1,"method":"ma.eventRecord","params":{"appKey":"mine","eventName":"ok"}}"#])
        #expect(again.replies.first?["result"]?["code"] == .int(0))
        let c = try h.client()  // root: an admin
        #expect(try c.call("ma.euid", ["appKey": "mine"])["euid"]?.stringValue != nil)
        // An AppKey root started is root's: another user can neither claim it nor see it listed.
        _ = try c.call("ma.start", ["appKey": "rootapp"])
        let spy = try h.runAs(
            uid: 65534, gid: 65534, sequential: true,
            [
                #"{"jsonrpc":"2.0","id":1,"method":"ma.status"}"#,
                #"{"jsonrpc":"2.0","id":2,"method":"ma.start","params":{"appKey":"rootapp"}}"#,
            ])
        #expect(spy.replies.first?["result"]?["appKeys"] == [:], "\(spy.replies.map(\.serialized))")
        #expect(spy.replies.last?["result"]?["code"] == .int(-1))
        #expect(try b.maEvents("mine", flushedBy: c).allSatisfy { $0["data"]?["event"] != "spoof" })
    }

    /// A notification acts for its sender as a request does: another uid's notifications cannot
    /// switch an owner's collection back on, record into its AppKey or re-identify it; nor can a
    /// plugin acting on its own (it is no uid, so not the owner).
    @Test func notificationsAndPluginsOnTheirOwnAreNotTheOwner() throws {
        let b = try TestBackend()
        let h = try TestHost.open(plugins: TestHost.maPlugins(b) + [TestHost.echo()])
        let owner = try h.runAs(
            uid: 4242, gid: 4242, sequential: true,
            [
                #"{"jsonrpc":"2.0","id":1,"method":"ma.start","params":{"appKey":"victim"}}"#,
                #"{"jsonrpc":"2.0","id":2,"method":"ma.setDataCollectionEnabled","params":{"appKey":"victim","enabled":false}}"#,
            ])
        #expect(owner.replies.map { $0["result"]?["code"] } == [.int(0), .int(0)], "\(owner.replies.map(\.serialized))")
        let c = try h.client()
        let euid = try #require(try c.call("ma.euid", ["appKey": "victim"])["euid"]?.stringValue)
        var lines = [
            #"{"jsonrpc":"2.0","method":"ma.setDataCollectionEnabled","params":{"appKey":"victim","enabled":true}}"#,
            #"{"jsonrpc":"2.0","method":"ma.identifyAccount","params":{"appKey":"victim","userID":{"email":"x@evil.example"}}}"#,
        ]
        for n in 0..<5 {
            lines.append(#"{"jsonrpc":"2.0","method":"ma.eventRecord","params":{"appKey":"victim","eventName":"spoof\#(n)"}}"#)
        }
        // A request after the notifications: MA serves one connection's lines in order.
        lines.append(#"{"jsonrpc":"2.0","id":9,"method":"ma.status"}"#)
        let r = try h.runAs(uid: 65534, gid: 65534, lines)
        #expect(r.replies.count == 1, "\(r.replies.map(\.serialized))")
        #expect(try c.call("consent.get", ["key": "ma:victim"])["granted"] == .bool(false), "still off")
        #expect(try c.call("ma.isDataCollectionEnabled", ["appKey": "victim"])["enabled"] == .bool(false))
        #expect(try c.call("ma.euid", ["appKey": "victim"])["euid"]?.stringValue == euid, "not re-identified")
        // A plugin acting on its own is not the owner either.
        let own = try c.call(
            "echo.callAsPlugin", ["method": "ma.setDataCollectionEnabled", "params": ["appKey": "victim", "enabled": true]])
        #expect(own["result"]?["code"] == .int(-1), "\(own.serialized)")
        #expect(try c.call("consent.get", ["key": "ma:victim"])["granted"] == .bool(false))
        // The owner's own notification still works.
        _ = try h.runAs(
            uid: 4242, gid: 4242,
            [
                #"{"jsonrpc":"2.0","method":"ma.setDataCollectionEnabled","params":{"appKey":"victim","enabled":true}}"#,
                #"{"jsonrpc":"2.0","id":3,"method":"ma.status"}"#,
            ])
        #expect(try c.call("consent.get", ["key": "ma:victim"])["granted"] == .bool(true))
        _ = try c.call("ma.eventRecord", ["appKey": "victim", "eventName": "real"])
        let names = try b.maEvents("victim", flushedBy: c).compactMap { $0["data"]?["event"]?.stringValue }
        #expect(names.contains("real"))
        #expect(!names.contains { $0.hasPrefix("spoof") }, "\(names)")
    }

    @Test func identifyWithNoValidFieldSendsNothing() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        let c = try h.client()
        _ = try c.call("ma.start", ["appKey": "app3"])
        let before = try b.request("GET", "/v1/inspect/stats").json["requests"]?.intValue ?? 0
        let r = try c.call("ma.identifyAccount", ["userID": "null", "email": "not-an-email"])
        #expect(code(r) == -3)
        let after = try b.request("GET", "/v1/inspect/stats").json["requests"]?.intValue ?? 0
        #expect(after == before + 1, "only the stats request itself: nothing was sent for the identify")
    }

    @Test func disablingCollectionDropsEventsAndDrivesTheHostSwitch() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        let c = try h.client()
        _ = try c.call("ma.start", ["appKey": "app4"])
        _ = try c.call("ma.eventRecord", ["eventName": "before"])
        #expect(code(try c.call("ma.setDataCollectionEnabled", ["enabled": false])) == 0)
        #expect(try c.call("ma.isDataCollectionEnabled")["enabled"] == .bool(false))
        #expect(try c.call("consent.get", ["key": "ma:app4"])["granted"] == .bool(false))
        #expect(code(try c.call("ma.eventRecord", ["eventName": "during"])) == 0, "dropped silently")
        _ = try c.call("ma.setDataCollectionEnabled", ["enabled": true])
        let names = try events(b, "app4", c).compactMap { $0["data"]?["event"]?.stringValue }
        #expect(names.contains("before"), "collected before disabling: sent once as a final batch")
        #expect(!names.contains("during"))
    }

    @Test func startWithCollectionDisabledAppliesToThatAppKey() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        let c = try h.client()
        _ = try c.call("ma.start", ["appKey": "app5", "dataCollectionEnabled": false])
        #expect(try c.call("ma.isDataCollectionEnabled")["enabled"] == .bool(false))
        // A later start without the flag enables again: a stored choice is not applied.
        _ = try c.call("ma.start", ["appKey": "app5"])
        #expect(try c.call("ma.isDataCollectionEnabled")["enabled"] == .bool(true))
    }

    @Test func twoAppKeysAreIsolated() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        let c1 = try h.client()
        let c2 = try h.client()
        let e1 = try c1.call("ma.start", ["appKey": "iso1"])["euid"]
        let e2 = try c2.call("ma.start", ["appKey": "iso2"])["euid"]
        #expect(e1 != nil && e2 != nil)
        _ = try c2.call("ma.setDataCollectionEnabled", ["enabled": false])
        #expect(try c1.call("ma.isDataCollectionEnabled")["enabled"] == .bool(true))
        #expect(try c2.call("ma.isDataCollectionEnabled")["enabled"] == .bool(false))
        _ = try c1.call("ma.eventRecord", ["eventName": "only1"])
        #expect(try events(b, "iso1", c1).contains { $0["data"]?["event"] == .string("only1") })
        #expect(try events(b, "iso2", c2).isEmpty)
    }

    /// Offline (docs/MA.md "Offline"): the start is answered pending (-32008) once an attempt
    /// failed and goes on; the event behind it is answered once parked and sent with its EUID.
    @Test func offlineStartIsAnsweredPendingAndTheEventBehindItKeepsItsPlace() throws {
        let b = try TestBackend()
        try b.faults(["failNext": 4, "status": 503])
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        let c = try h.client()
        try c.sendLine(#"{"jsonrpc":"2.0","id":1,"method":"ma.start","params":{"appKey":"off1"}}"#)
        try c.sendLine(#"{"jsonrpc":"2.0","id":2,"method":"ma.eventRecord","params":{"appKey":"off1","eventName":"queued"}}"#)
        var got: [Int64: JSON] = [:]
        for _ in 0..<2 {
            let m = try #require(try c.readMessage(timeoutMs: 15000))
            got[m["id"]?.intValue ?? -1] = m
        }
        #expect(got[1]?["error"]?["code"] == .int(Int64(RPCError.Code.pending.rawValue)), "\(got[1]?.serialized ?? "")")
        #expect(got[2]?["result"]?["code"] == .int(0), "\(got[2]?.serialized ?? "")")
        var euid: JSON = .null
        try waitUntil(timeout: 15) {
            euid = try c.call("ma.euid", ["appKey": "off1"])["euid"] ?? .null
            return euid != .null
        }
        var queued: [JSON] = []
        try waitUntil(timeout: 15) {
            queued = try events(b, "off1", c).filter { $0["data"]?["event"] == .string("queued") }
            return !queued.isEmpty
        }
        #expect(queued.map { $0["data"]?["euid"] } == [euid])
    }

    /// Events parked behind a start that waits for the backend are bounded by `maxParkedEvents`:
    /// past it they are answered -1 at once (they grew without bound: 447 MB in a review). The
    /// first event's session start takes a place too.
    @Test func eventsParkedForAStartAreBounded() throws {
        let b = try TestBackend()
        try b.faults(["failNext": 1000, "status": 503])
        let h = try TestHost(plugins: TestHost.maPlugins(b, ma: ["maxParkedEvents": 5]))
        let c = try h.client()
        try c.sendLine(#"{"jsonrpc":"2.0","id":0,"method":"ma.start","params":{"appKey":"off2"}}"#)
        for i in 1...8 {
            try c.sendLine(#"{"jsonrpc":"2.0","id":\#(i),"method":"ma.eventRecord","params":{"appKey":"off2","eventName":"e"}}"#)
        }
        var got: [Int64: JSON] = [:]
        while got.count < 9 {
            let m = try #require(try c.readMessage(timeoutMs: 10000))
            got[m["id"]?.intValue ?? -1] = m
        }
        #expect(got[0]?["error"]?["code"] == .int(Int64(RPCError.Code.pending.rawValue)))
        #expect((1...4).map { got[$0]?["result"]?["code"] } == Array(repeating: .int(0), count: 4))
        #expect((5...8).map { got[$0]?["result"]?["code"] } == Array(repeating: .int(-1), count: 4))
        let st = try h.client().call("ma.status")
        #expect(st["eventsWaitingForStart"] == .int(5))
        try b.clearFaults()
        var stored: [JSON] = []
        try waitUntil(timeout: 15) {
            stored = try events(b, "off2", c).filter { $0["data"]?["event"] == .string("e") }
            return stored.count >= 4
        }
        #expect(stored.count == 4)
    }

    @Test func killDashNineOfMAUnderLoadLosesNoAcknowledgedEvent() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        let c = try h.client()
        _ = try c.call("ma.start", ["appKey": "load"])
        var acked = Set<String>()
        var killed = false
        var sent = 0
        loop: while sent < 2000 {
            for i in sent..<(sent + 50) {
                try? c.send(
                    envelope: Envelope.request(
                        id: .int(Int64(i)), method: "ma.eventRecord",
                        params: .value(["appKey": "load", "eventName": "e", "property": ["n": .int(Int64(i))]])))
            }
            sent += 50
            for _ in 0..<50 {
                guard let m = try? c.readMessage(timeoutMs: 5000) else { break loop }
                if m["result"]?["code"] == .int(0), let id = m["id"]?.intValue { acked.insert("\(id)") }
            }
            if !killed && acked.count >= 600 {
                killed = true
                let pid = try #require(try h.plugin("ma")["pid"]?.intValue)
                kill(Int32(pid), SIGKILL)
                break loop
            }
        }
        #expect(killed)
        try h.waitForPlugin("ma", restartsAtLeast: 1)
        let got = Set(
            try b.maEvents("load", flushedBy: h.client()).compactMap { r in
                r["data"]?["properties"]?["n"]?.intValue.map { "\($0)" }
            })
        let missing = acked.subtracting(got)
        #expect(missing.isEmpty, "\(missing.count) acknowledged events lost")
        // And the instance is usable again without a new start.
        #expect(try c.call("ma.eventRecord", ["eventName": "after"])["code"] == .int(0))
    }

    @Test func pluginCrashKeepsIdentityAndConsent() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        let c = try h.client()
        let euid = try c.call("ma.start", ["appKey": "crash1", "dataCollectionEnabled": false])["euid"]
        _ = try c.call("ma.setCollectControl", ["idfv": true])
        let pid = try #require(try h.plugin("ma")["pid"]?.intValue)
        kill(Int32(pid), SIGKILL)
        try h.waitForPlugin("ma", restartsAtLeast: 1)
        #expect(try c.call("ma.euid")["euid"] == euid, "the client's AppKey binding and EUID survive")
        #expect(try c.call("ma.isDataCollectionEnabled")["enabled"] == .bool(false))
    }

    @Test func pluginCrashContinuesTheSession() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        let c = try h.client()
        _ = try c.call("ma.start", ["appKey": "crash2"])
        _ = try c.call("ma.eventRecord", ["eventName": "before"])
        let pid = try #require(try h.plugin("ma")["pid"]?.intValue)
        kill(Int32(pid), SIGKILL)
        try h.waitForPlugin("ma", restartsAtLeast: 1)
        try waitUntil(timeout: 5) { try c.call("ma.eventRecord", ["eventName": "after"])["code"] == .int(0) }
        let evs = try events(b, "crash2", c).compactMap { $0["data"] }
        let sessions = Set(evs.compactMap { $0["session"]?.stringValue })
        #expect(sessions.count == 1, "one session across the restart: \(sessions)")
        #expect(evs.filter { $0["event"] == .string("el_session_start") }.count == 1)
    }
}

/// Contacts, channel values and user properties through the MA plugin to the backend.
@Suite(.serialized) struct MAProfileTests {
    func setup() throws -> (TestBackend, TestHost, SyncClient, String) {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        let c = try h.client()
        let euid = try #require(try c.call("ma.start", ["appKey": "prof"])["euid"]?.stringValue)
        return (b, h, c, euid)
    }

    func user(_ b: TestBackend, _ euid: String) throws -> JSON {
        try b.request("GET", "/v1/inspect/ma/prof/users/\(euid)").json
    }

    @Test func contactsAreStoredAndNeverChangeTheEuid() throws {
        let (b, h, c, euid) = try setup()
        defer { _ = h }
        #expect(code(try c.call("ma.setUserContact", ["contacts": ["email": "a@b.co", "mobile_phone": "+100000000"]])) == 0)
        #expect(code(try c.call("ma.setUserContact", ["contacts": ["email": "   "]])) == -3)
        #expect(code(try c.call("ma.setUserContact", ["contacts": ["fax": "1"]])) == -3)
        #expect(try c.call("ma.euid")["euid"] == .string(euid))
        #expect(try user(b, euid)["contacts"]?["email"] == .string("a@b.co"))
    }

    @Test func channelValuesInCallOrder() throws {
        let (b, h, c, euid) = try setup()
        defer { _ = h }
        try c.sendLine(#"{"jsonrpc":"2.0","id":1,"method":"ma.setChannelValue","params":{"channelId":7,"values":[" tokA "]}}"#)
        try c.sendLine(#"{"jsonrpc":"2.0","id":2,"method":"ma.setChannelValue","params":{"channelId":7,"values":["tokB"]}}"#)
        for _ in 0..<2 { #expect(try c.readMessage()?["result"]?["code"] == .int(0)) }
        let ch = try user(b, euid)["channels"]?.arrayValue ?? []
        #expect(ch.map { $0["values"] } == [["tokA"], ["tokB"]])
        #expect(code(try c.call("ma.setChannelValue", ["channelId": 0, "values": ["x"]])) == -3)
        #expect(code(try c.call("ma.setChannelValue", ["channelId": 1, "values": ["  "]])) == -3)
    }

    @Test func setPropertyValidatesAllOrNothing() throws {
        let (b, h, c, euid) = try setup()
        defer { _ = h }
        #expect(code(try c.call("ma.setProperty", ["properties": ["level": 3, "Bad": 1]])) == -3)
        #expect(code(try c.call("ma.setProperty", ["properties": ["el_x": 1]])) == -3)
        #expect(code(try c.call("ma.setProperty", ["properties": ["flag": true]])) == -3)
        #expect(code(try c.call("ma.setProperty", ["properties": ["gone": .null]])) == -3)
        #expect(code(try c.call("ma.setProperty", ["properties": ["o": ["a": ["nested": 1]]]])) == -3)
        #expect(try user(b, euid)["properties"]?["level"] == nil, "nothing sent when one property is invalid")
        var many = JSONObject()
        for i in 0..<101 { many["p\(i)"] = .int(Int64(i)) }
        #expect(code(try c.call("ma.setProperty", ["properties": .object(many)])) == -3)
        #expect(code(try c.call("ma.setProperty", ["key": "level", "value": 3])) == 0)
        #expect(try user(b, euid)["properties"]?["level"] == .int(3))
    }

    @Test func objectMergesAndNullDeletesASubfield() throws {
        let (b, h, c, euid) = try setup()
        defer { _ = h }
        _ = try c.call("ma.setProperty", ["properties": ["addr": ["city": "Rome", "zip": "00100"]]])
        _ = try c.call("ma.setProperty", ["properties": ["addr": ["zip": .null, "street": "Via Roma"]]])
        #expect(try user(b, euid)["properties"]?["addr"] == ["city": "Rome", "street": "Via Roma"])
    }

    @Test func increaseAddRemoveDelete() throws {
        let (b, h, c, euid) = try setup()
        defer { _ = h }
        _ = try c.call("ma.increaseProperty", ["key": "score", "by": 5])
        _ = try c.call("ma.increaseProperty", ["properties": ["score": 2]])
        _ = try c.call("ma.addProperty", ["key": "tags", "by": ["a", "b"]])
        _ = try c.call("ma.removeProperty", ["key": "tags", "by": ["a"]])
        var p = try user(b, euid)["properties"]
        #expect(p?["score"] == .int(7))
        #expect(p?["tags"] == ["b"])
        _ = try c.call("ma.deleteProperty", ["key": "score"])
        p = try user(b, euid)["properties"]
        #expect(p?["score"] == nil)
    }

    @Test func objectArrayOperationsFollowServerMetadata() throws {
        let (b, h, c, euid) = try setup()
        defer { _ = h }
        _ = try b.request(
            "POST", "/v1/admin/ma/prof/metadata",
            body: [
                "properties": [
                    "orders": [
                        "type": "object_array", "identifierKey": "oid", "identifierType": "string",
                        "subfields": ["oid": "string", "total": "number"],
                    ]
                ]
            ])
        #expect(code(try c.call("ma.addObjectArrayProperty", ["key": "orders", "object": ["oid": "o1", "total": 10]])) == 0)
        _ = try c.call("ma.addObjectArrayProperty", ["key": "orders", "object": ["oid": "o2", "total": 20]])
        #expect(
            code(
                try c.call(
                    "ma.updateObjectArrayProperty",
                    ["key": "orders", "identifierKey": "oid", "identifierValue": "o1", "values": ["total": 11]])) == 0)
        let miss = try c.call(
            "ma.updateObjectArrayProperty", ["key": "orders", "identifierKey": "oid", "identifierValue": "nope", "values": ["total": 1]])
        #expect(code(miss) != 0, "no matching element is a failure")
        #expect(
            code(
                try c.call(
                    "ma.updateObjectArrayProperty",
                    ["key": "orders", "identifierKey": "oid", "identifierValue": "o1", "values": ["oid": "x"]])) == -3)
        #expect(code(try c.call("ma.removeObjectArrayProperty", ["key": "orders", "identifierKey": "oid", "identifierValue": "o2"])) == 0)
        #expect(try user(b, euid)["properties"]?["orders"] == [["oid": "o1", "total": 11]])
        // Undefined in metadata: 0 and no change.
        #expect(code(try c.call("ma.addObjectArrayProperty", ["key": "other", "object": ["a": 1]])) == 0)
        #expect(try user(b, euid)["properties"]?["other"] == nil)
    }

    @Test func propertiesAreNotSentWhileCollectionIsDisabled() throws {
        let (b, h, c, euid) = try setup()
        defer { _ = h }
        _ = try c.call("ma.setDataCollectionEnabled", ["enabled": false])
        _ = try c.call("ma.setProperty", ["key": "level", "value": 9])
        #expect(try user(b, euid)["properties"]?["level"] == nil)
        // Contacts keep working with collection disabled.
        #expect(code(try c.call("ma.setUserContact", ["contacts": ["email": "x@y.io"]])) == 0)
    }

    @Test func identifyMergesServerPerFieldResults() throws {
        let (b, h, c, euid) = try setup()
        defer { _ = (b, h) }
        let r: JSON
        do { r = try c.call("ma.identifyAccount", ["userID": "user-1", "phone": "+12"], timeoutMs: 5000) } catch {
            Issue.record("\(error)\n\(h.logText.suffix(4000))")
            throw error
        }
        #expect(code(r) == 0)
        let msg = try JSON.parse(r["message"]?.stringValue ?? "")
        #expect(msg["phone"]?["code"] == .int(3013))
        #expect(msg["user_id"]?["code"] == .int(0))
        #expect(r["euid"]?.stringValue != nil)
        _ = euid
    }
}

/// Sessions and the upload cadence MA drives.
@Suite(.serialized) struct MASessionTests {
    func names(_ b: TestBackend, _ appKey: String) throws -> [JSON] { try b.records("ma.\(appKey)") }

    @Test func sessionEndsAfterTimeoutInBackgroundAndANewOneStarts() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        let c = try h.client()
        _ = try c.call("ma.start", ["appKey": "sess"])
        _ = try c.call("ma.setSessionTimeout", ["interval": 1])
        _ = try c.call("ma.eventRecord", ["eventName": "first"])
        _ = try c.call("ma.setAppState", ["state": "background"])
        // The one case on the real timer (the machine's rules: SessionTests, on a fake clock).
        try waitUntil(timeout: 10) { try c.call("ma.status")["appKeys"]?["sess"]?["session"] == .null }
        _ = try c.call("ma.setAppState", ["state": "foreground"])
        _ = try c.call("ma.eventRecord", ["eventName": "second"])
        _ = try c.call("uploader.flush", ["stream": "ma.sess", "wait": true])
        let recs = try names(b, "sess").compactMap { $0["data"] }
        let order = recs.compactMap { $0["event"]?.stringValue }
        #expect(order == ["el_session_start", "first", "el_session_end", "el_session_start", "second"])
        let first = recs.first { $0["event"] == .string("first") }?["session"]
        let second = recs.first { $0["event"] == .string("second") }?["session"]
        #expect(first != nil && first != second)
        #expect(code(try c.call("ma.setAppState", ["state": "sideways"])) == -3)
    }

    @Test func disconnectingCountsAsBackground() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        var c: SyncClient? = try h.client()
        _ = try c!.call("ma.start", ["appKey": "gone"])
        _ = try c!.call("ma.setSessionTimeout", ["interval": 1])
        _ = try c!.call("ma.eventRecord", ["eventName": "only"])
        c = nil
        let other = try h.client()
        // The disconnect sent the app to the background: its session ends (1 s later).
        try waitUntil(timeout: 10) {
            let a = try other.call("ma.status")["appKeys"]?["gone"]
            return a?["background"] == .bool(true) && a?["session"] == .null
        }
        _ = try other.call("uploader.flush", ["stream": "ma.gone", "wait": true])
        #expect(try names(b, "gone").last?["data"]?["event"] == .string("el_session_end"))
    }

    @Test func maxEventCacheCountTriggersAnUpload() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        let c = try h.client()
        _ = try c.call("ma.start", ["appKey": "cache"])
        #expect(try c.call("ma.setMaxEventCacheCount", ["count": 900])["count"] == .int(500), "never above 500")
        _ = try c.call("ma.setMaxEventCacheCount", ["count": 3])
        // el_session_start plus two events: 3 cached, not more than the limit.
        for i in 0..<2 { _ = try c.call("ma.eventRecord", ["eventName": .string("e\(i)")]) }
        // An event is answered once the uploader holds it, after the send decision it triggered.
        let st = try c.call("uploader.status")["streams"]?["ma.cache"]
        #expect(st?["queued"] == .int(3) && st?["inFlight"] == .int(0) && st?["pendingBatches"] == .int(0), "\(st?.serialized ?? "")")
        #expect(try b.stream("ma.cache")["records"]?.intValue ?? 0 == 0, "3 cached of 3: nothing uploaded yet")
        _ = try c.call("ma.eventRecord", ["eventName": "e2"])
        try waitUntil(timeout: 5) { (try b.stream("ma.cache")["records"]?.intValue ?? 0) >= 4 }
        #expect(code(try c.call("ma.setReportInterval", ["interval": 0])) == -3)
        #expect(code(try c.call("ma.setReportInterval", ["interval": 1])) == 0)
        _ = try c.call("ma.eventRecord", ["eventName": "late"])
        try waitUntil(timeout: 5) { try names(b, "cache").contains { $0["data"]?["event"] == .string("late") } }
    }

    @Test func channelValueQueuedAcrossAnIdentityChangeGetsMinus2() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        let c = try h.client()
        let e0 = try #require(try c.call("ma.start", ["appKey": "chan"])["euid"])
        // alice is attached to the current user: same EUID.
        #expect(try c.call("ma.identifyAccount", ["userID": "alice"])["euid"] == e0)
        try b.faults(["latencyMs": 300])
        try c.sendLine(#"{"jsonrpc":"2.0","id":1,"method":"ma.setChannelValue","params":{"channelId":3,"values":["a"]}}"#)
        try c.sendLine(#"{"jsonrpc":"2.0","id":2,"method":"ma.identifyAccount","params":{"userID":"bob"}}"#)
        try c.sendLine(#"{"jsonrpc":"2.0","id":3,"method":"ma.setChannelValue","params":{"channelId":3,"values":["b"]}}"#)
        var byId: [Int64: JSON] = [:]
        for _ in 0..<3 {
            let m = try #require(try c.readMessage(timeoutMs: 10000))
            byId[m["id"]!.intValue!] = m["result"]
        }
        #expect(byId[1]?["code"] == .int(0))
        #expect(byId[2]?["code"] == .int(0))
        #expect(byId[2]?["euid"] != e0, "bob is another user: a new EUID")
        #expect(byId[3]?["code"] == .int(-2), "queued before the identity changed: invalidated")
    }

}

/// More ma.md rules, one test each.
@Suite(.serialized) struct MARuleTests {
    @Test func withCollectionDisabledNothingIsCollectedButInitIdentifyContactsAndChannelsWork() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        let c = try h.client()
        let s = try c.call("ma.start", ["appKey": "off", "dataCollectionEnabled": false])
        #expect(code(s) == 0)
        let euid = try #require(s["euid"]?.stringValue)
        #expect(code(try c.call("ma.eventRecord", ["eventName": "x"])) == 0)
        #expect(code(try c.call("ma.setUtmProperties", ["properties": ["utm_source": "s"]])) == 0)
        #expect(code(try c.call("ma.setProperty", ["key": "level", "value": 1])) == 0)
        let id = try c.call("ma.identifyAccount", ["userID": "u-off"])
        #expect(code(id) == 0)
        #expect(code(try c.call("ma.setUserContact", ["contacts": ["email": "o@ff.io"]])) == 0)
        #expect(code(try c.call("ma.setChannelValue", ["channelId": 1, "values": ["t"]])) == 0)
        _ = try c.call("uploader.flush", ["wait": true])
        #expect(try b.stream("ma.off")["records"] == .int(0), "no event reaches the backend")
        let user = try b.request("GET", "/v1/inspect/ma/off/users/\(id["euid"]?.stringValue ?? euid)").json
        #expect(user["properties"] == JSON.object([:]) || user["properties"] == nil)
        #expect(user["contacts"]?["email"] == .string("o@ff.io"))
        #expect(user["channels"]?.arrayValue?.count == 1)
    }

    @Test func startReportsOnlyLocalRejectionsOfItsUserID() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        let c = try h.client()
        let ok = try c.call("ma.start", ["appKey": "sid", "userID": ["userID": "u1"]])
        #expect(code(ok) == 0)
        #expect(ok["message"] == .string(""))
        let bad = try c.call("ma.start", ["appKey": "sid", "userID": ["userID": "u1", "email": "nope"]])
        #expect(code(bad) == 0, "the start's own result says whether init succeeded")
        let msg = try JSON.parse(bad["message"]?.stringValue ?? "{}")
        #expect(msg["email"]?["code"] == .int(3013))
        #expect(msg["user_id"] == nil, "no server per-field results in start")
    }

    @Test func setDataCollectionEnabledIsIdempotent() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        let c = try h.client()
        _ = try c.call("ma.start", ["appKey": "idem"])
        _ = try c.call("ma.setDataCollectionEnabled", ["enabled": false])
        let epoch = try c.call("consent.list")["epoch"]
        #expect(code(try c.call("ma.setDataCollectionEnabled", ["enabled": false])) == 0)
        #expect(try c.call("consent.list")["epoch"] == epoch, "the same value again changes nothing")
        #expect(code(try c.call("ma.setDataCollectionEnabled", ["enabled": "no"])) == -3)
    }

    @Test func utmIsClearedForGoodAndCollectControlSurvivesADisableEnableCycle() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        let c = try h.client()
        _ = try c.call("ma.start", ["appKey": "cyc"])
        _ = try c.call("ma.setUtmProperties", ["properties": ["utm_campaign": "winter"]])
        _ = try c.call("ma.setCollectControl", ["idfv": true])
        _ = try c.call("ma.setDataCollectionEnabled", ["enabled": false])
        _ = try c.call("ma.setDataCollectionEnabled", ["enabled": true])
        _ = try c.call("ma.eventRecord", ["eventName": "back"])
        _ = try c.call("uploader.flush", ["stream": "ma.cyc", "wait": true])
        let recs = try b.records("ma.cyc")
        let back = try #require(recs.first { $0["data"]?["event"] == .string("back") })
        #expect(back["data"]?["utm"] == nil, "UTM is not restored on re-enable")
        #expect(back["data"]?["device"]?["idfv"]?.stringValue != nil, "collect control kept its setting")
        #expect(code(try c.call("ma.setUtmProperties", ["properties": ["utm_bogus": "x"]])) == -3)
    }

    /// The operator's denial of `ma:<appKey>` (or of `device`) clears the UTM like the app's own
    /// disable, and UTM set while it is denied is not kept.
    @Test func utmIsClearedByTheHostsSwitchToo() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        let c = try h.client()
        _ = try c.call("ma.start", ["appKey": "op"])
        _ = try c.call("ma.setUtmProperties", ["properties": ["utm_source": "before-deny"]])
        _ = try c.call("consent.set", ["key": "ma:op", "granted": false])
        _ = try c.call("ma.setUtmProperties", ["properties": ["utm_campaign": "set-while-denied"]])
        _ = try c.call("consent.set", ["key": "ma:op", "granted": true])
        #expect(code(try c.call("ma.eventRecord", ["eventName": "after"])) == 0)
        let recs = try b.maEvents("op", flushedBy: c)
        let after = try #require(recs.first { $0["data"]?["event"] == .string("after") })
        #expect(after["data"]?["utm"] == nil, "\(after.serialized)")
    }

    @Test func switchingAppKeyRoutesLaterCallsToTheNewOne() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        let c = try h.client()
        _ = try c.call("ma.start", ["appKey": "first"])
        _ = try c.call("ma.start", ["appKey": "second"])
        _ = try c.call("ma.eventRecord", ["eventName": "where"])
        _ = try c.call("uploader.flush", ["wait": true])
        #expect(try b.stream("ma.second")["records"]?.intValue ?? 0 >= 1)
        let firstEvents = try b.records("ma.first")
        #expect(!firstEvents.contains { $0["data"]?["event"] == .string("where") })
        // An explicit appKey still reaches the first instance.
        #expect(code(try c.call("ma.eventRecord", ["appKey": "first", "eventName": "explicit"])) == 0)
    }

    @Test func disabledProjectAnswersMinus4() throws {
        let b = try TestBackend()
        _ = try b.request("POST", "/v1/admin/ma/dis", body: ["disabled": true])
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        #expect(code(try h.client().call("ma.start", ["appKey": "dis"])) == -4)
    }
}
