import Foundation
import Testing
import PylonClientKit

extension TestHost {
    /// The MA plugin and the uploader, both against `backend`.
    static func maPlugins(_ backend: TestBackend) -> [JSON] {
        [
            uploader(backend, config: ["streams": ["ma.*": ["maxCount": 50, "intervalMs": 600000]]]),
            ["name": "ma", "exec": "pylon-ma", "backoffInitialMs": 50,
             "config": ["backend": .string(backend.baseURL), "retryInitialMs": 100, "retryMaxMs": 500]],
        ]
    }
}

/// The MA plugin end to end: real host, MA plugin, uploader and reference backend.
@Suite(.serialized) struct MAPluginTests {
    func code(_ j: JSON) -> Int64? { j["code"]?.intValue }

    func events(_ b: TestBackend, _ appKey: String, _ c: SyncClient) throws -> [JSON] {
        _ = try c.call("uploader.flush", ["stream": .string("ma.\(appKey)"), "wait": true], timeoutMs: 20000)
        let page = try b.request("GET", "/v1/inspect/streams/ma.\(appKey)/records?limit=1000").json
        return page["records"]?.arrayValue ?? []
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
        for p: JSON in [["eventName": ""], ["eventName": "el_x"], ["property": ["a": 1]], ["eventName": "e", "property": ["Bad-Key": 1]]] {
            #expect(code(try c.call("ma.eventRecord", p)) == -3, "\(p.serialized)")
        }
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

    @Test func offlineStartWaitsForTheBackendAndLaterCallsWaitInOrder() throws {
        let b = try TestBackend()
        try b.faults(["failNext": 4, "status": 503])
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        let c = try h.client()
        try c.sendLine(#"{"jsonrpc":"2.0","id":1,"method":"ma.start","params":{"appKey":"off1"}}"#)
        try c.sendLine(#"{"jsonrpc":"2.0","id":2,"method":"ma.eventRecord","params":{"appKey":"off1","eventName":"queued"}}"#)
        var order: [Int64] = []
        for _ in 0..<2 {
            let m = try #require(try c.readMessage(timeoutMs: 15000))
            #expect(m["result"]?["code"] == .int(0), "\(m.serialized)")
            order.append(m["id"]?.intValue ?? -1)
        }
        #expect(order == [1, 2])
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
}
