import Foundation
import PylonClientKit
import TestSupport
import Testing

/// The console's lists and container pages (issue 33, backend A): cursor paging that visits
/// every item exactly once, the dashboard's counts, a device's page, container versions and
/// rollback, on SQLite and PostgreSQL.
@Suite(.serialized) struct ConsoleListTests {
    /// Every item of a list, page by page (`limit` each): fails on a repeated key or a page
    /// larger than `limit`.
    static func walk(_ b: BackendProcess, _ path: String, key: String, limit: Int) throws -> [String] {
        var keys: [String] = []
        var cursor: String?
        var pages = 0
        repeat {
            let sep = path.contains("?") ? "&" : "?"
            let page = try b.get(path + sep + "limit=\(limit)" + (cursor.map { "&cursor=" + $0 } ?? ""))
            let items = try #require(page["items"]?.arrayValue, "\(page)")
            #expect(items.count <= limit)
            keys += items.compactMap { $0[key]?.stringValue ?? $0[key]?.intValue.map { String($0) } }
            cursor = page["nextCursor"]?.stringValue
            pages += 1
            guard pages <= 100 else { throw TestFailure(description: "\(path): no end after 100 pages") }
        } while cursor != nil
        #expect(Set(keys).count == keys.count, "\(path): an item came twice: \(keys)")
        return keys
    }

    @Test(arguments: StoreKind.allCases) func cursorsWalkEveryItemOnce(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        let installs = (0..<7).map { "inst-\($0)" }
        var devices: [String: (id: String, token: String, push: String)] = [:]
        for i in installs { devices[i] = try ConsoleDataTests.device(b, i) }
        for s in ["s-a", "s-b", "s-c", "s-d", "s-e"] {
            #expect(try b.postBatch(s, key: "k-" + s, batchBody(key: "k-" + s, stream: s, ids: ["1", "2"])).status == 200)
        }
        for limit in [1, 3, 7, 50] {
            #expect(try ConsoleListTests.walk(b, "/v1/admin/devices", key: "installId", limit: limit) == installs)
            #expect(try ConsoleListTests.walk(b, "/v1/admin/streams", key: "stream", limit: limit) == ["s-a", "s-b", "s-c", "s-d", "s-e"])
        }
        // Audit entries, newest first: three pushes published give three entries.
        for n in 1...3 {
            let r = try b.request("POST", "/v1/admin/gtm/containers/c\(n)/versions", body: Array(#"{"container":{"resource":{}}}"#.utf8))
            #expect(r.status == 200)
        }
        let ids = try ConsoleListTests.walk(b, "/v1/admin/audit?action=gtm.publish", key: "id", limit: 2)
        #expect(ids.count == 3)
        #expect(ids.compactMap { Int($0) } == ids.compactMap { Int($0) }.sorted(by: >))
        #expect(try ConsoleListTests.walk(b, "/v1/admin/gtm/containers", key: "id", limit: 2) == ["c1", "c2", "c3"])
        // Names filtered by prefix (an index range), paged the same way.
        #expect(try ConsoleListTests.walk(b, "/v1/admin/streams?q=s-", key: "stream", limit: 2) == ["s-a", "s-b", "s-c", "s-d", "s-e"])
        #expect(try ConsoleListTests.walk(b, "/v1/admin/streams?q=s-c", key: "stream", limit: 2) == ["s-c"])
        #expect(try ConsoleListTests.walk(b, "/v1/admin/gtm/containers?q=c2", key: "id", limit: 2) == ["c2"])
        #expect(try ConsoleListTests.walk(b, "/v1/admin/gtm/containers?q=x", key: "id", limit: 2) == [])
        // Search: an install id prefix, a device id, a bound user id.
        let bind = try b.request(
            "POST", "/v1/push/bind", headers: [("Authorization", "Bearer " + devices["inst-3"]!.token)],
            body: Array(JSON.object(["token": .string(devices["inst-3"]!.push), "userId": "user-42"]).serialized.utf8))
        #expect(bind.status == 200, "\(bind.text)")
        #expect(try ConsoleListTests.walk(b, "/v1/admin/devices?q=inst-", key: "installId", limit: 2) == installs)
        #expect(try ConsoleListTests.walk(b, "/v1/admin/devices?q=user-42", key: "installId", limit: 2) == ["inst-3"])
        #expect(try ConsoleListTests.walk(b, "/v1/admin/devices?q=nobody", key: "installId", limit: 2) == [])
        let three = try b.get("/v1/admin/devices?q=inst-3")["items"]?.arrayValue?.first
        #expect(three?["bindings"] == [["userId": "user-42"]])
        #expect(
            try ConsoleListTests.walk(b, "/v1/admin/devices?q=\(three?["deviceId"]?.stringValue ?? "?")", key: "installId", limit: 5) == [
                "inst-3"
            ])
        // A cursor the backend did not give out, or a limit out of range, is 400.
        for q in ["cursor=zz", "cursor=abc", "limit=0", "limit=501"] {
            #expect(try b.request("GET", "/v1/admin/devices?" + q).status == 400, "\(q)")
        }
    }

    @Test(arguments: StoreKind.allCases) func theDashboardAndADevicesPage(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        let dev = try ConsoleDataTests.device(b, "inst-d")
        // The device's MA plugin starts AppKey shop (with the device's own token) before its events.
        let start = try b.request(
            "POST", "/v1/ma/shop/start", headers: [("Authorization", "Bearer " + dev.token)],
            body: Array(#"{"deviceId":"d-1","identity":{"user_id":"u-1"}}"#.utf8))
        #expect(start.status == 200)
        try ConsoleDataTests.post(
            b, stream: "ma.shop", key: "k1", token: dev.token,
            [ConsoleDataTests.event("e1", "open", euid: "eu1", time: 1000), ConsoleDataTests.event("e2", "buy", euid: "eu1", time: 2000)])
        try ConsoleDataTests.post(
            b, stream: "pylon.consent", key: "k2", token: dev.token,
            [["id": "c1", "ts": 3000, "data": ["switch": "ma:shop", "granted": false]]])
        #expect(try b.postBatch("s", key: "k3", batchBody(key: "k3", stream: "s", ids: ["a"])).status == 200)
        let d = try b.get("/v1/admin/dashboard")
        #expect(d["devices"]?["registered"] == 1)
        #expect(d["events"]?["today"] == 4)
        #expect(d["series"]?["lastHour"]?.arrayValue?.count == 60)
        #expect(d["series"]?["lastHour"]?.arrayValue?.last?["events"] == 4)
        let days = try #require(d["series"]?["last30Days"]?.arrayValue)
        #expect(days.count == 30)
        #expect(days.last?["events"] == 4)
        #expect(d["instances"]?.arrayValue?.count == 1)
        #expect(d["instances"]?.arrayValue?.first?["healthy"] == true)
        let page = try b.get("/v1/admin/devices/inst-d")
        #expect(page["deviceId"] == .string(dev.id))
        #expect(page["appKeys"] == ["shop"])
        #expect(page["lastSeenMs"]?.intValue != nil)
        // Newest first, every stream of the device (the consent report too).
        let recent = page["recentEvents"]?.arrayValue ?? []
        #expect(recent.compactMap { $0["event"]?.stringValue } == ["", "buy", "open"])
        #expect(recent.compactMap { $0["stream"]?.stringValue } == ["pylon.consent", "ma.shop", "ma.shop"])
        #expect(page["consent"]?["ma:shop"]?["granted"] == false)
        #expect(try b.request("GET", "/v1/admin/devices/nope").status == 404)
        let apps = try b.get("/v1/admin/apps")["items"]?.arrayValue
        #expect(apps?.first?["appKey"] == "shop")
        #expect(apps?.first?["events"] == 2)
        #expect(apps?.first?["lastEventMs"] == 2000)
        #expect(try b.get("/v1/admin/apps?q=sh")["items"]?.arrayValue?.count == 1)
        #expect(try b.get("/v1/admin/apps?q=x")["items"]?.arrayValue?.count == 0)
        #expect(try ConsoleListTests.walk(b, "/v1/admin/devices?appKey=shop", key: "installId", limit: 5) == ["inst-d"])
        #expect(try ConsoleListTests.walk(b, "/v1/admin/devices?appKey=other", key: "installId", limit: 5) == [])
    }

    @Test(arguments: StoreKind.allCases) func rollbackPublishesAnOldVersionAgain(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        func publish(_ value: String) throws {
            let c: JSON = ["container": ["resource": ["macros": [["function": "__c", "vtp_value": .string(value)]]]]]
            #expect(try b.request("POST", "/v1/admin/gtm/containers/GTM-R/versions", body: Array(c.serialized.utf8)).status == 200)
        }
        func served() throws -> JSON { try b.get("/v1/gtm/containers/GTM-R") }
        try publish("first")
        try publish("second")
        #expect(try served()["resource"]?["macros"]?.arrayValue?.first?["vtp_value"] == "second")
        let r = try b.request("POST", "/v1/admin/gtm/containers/GTM-R/rollback", body: Array(#"{"version":1}"#.utf8))
        #expect(r.status == 200)
        #expect(try r.json()["version"] == "3")
        // Devices now get version 1's content, stamped version 3.
        let now = try served()
        #expect(now["resource"]?["macros"]?.arrayValue?.first?["vtp_value"] == "first")
        #expect(now["resource"]?["version"] == "3")
        let versions = try #require(try b.get("/v1/admin/gtm/containers/GTM-R/versions")["items"]?.arrayValue)
        #expect(versions.compactMap { $0["version"]?.intValue } == [3, 2, 1])
        #expect(versions.first?["published"] == true)
        #expect(versions.allSatisfy { $0["actor"] == "operator" && ($0["bytes"]?.intValue ?? 0) > 0 })
        let v2 = try b.get("/v1/admin/gtm/containers/GTM-R/versions/2")
        #expect(v2["content"]?["resource"]?["macros"]?.arrayValue?.first?["vtp_value"] == "second")
        let list = try b.get("/v1/admin/gtm/containers")["items"]?.arrayValue?.first
        #expect(list?["publishedVersion"] == 3)
        #expect(list?["versions"] == 3)
        #expect(list?["fetches"] == 2)  // the two reads above
        let audit = try b.get("/v1/admin/audit?action=gtm.rollback")["items"]?.arrayValue?.first
        #expect(audit?["detail"] == ["from": 1, "version": 3])
        for (path, want) in [
            ("/v1/admin/gtm/containers/GTM-R/versions/9", 404), ("/v1/admin/gtm/containers/GTM-X/versions", 404),
        ] {
            #expect(try b.request("GET", path).status == want, "\(path)")
        }
        #expect(try b.request("POST", "/v1/admin/gtm/containers/GTM-R/rollback", body: Array(#"{"version":9}"#.utf8)).status == 404)
    }
}
