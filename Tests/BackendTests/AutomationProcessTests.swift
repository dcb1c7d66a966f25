import Foundation
import PylonCore
import TestSupport
import Testing

/// Automation in the real backend binary on SQLite and PostgreSQL: waits are rows that survive
/// a kill -9, a trigger starts one journey however often its record arrives, and two instances
/// on one PostgreSQL database start each journey once (docs/AUTOMATION.md). Without a broker
/// the due journeys end as `no_binding` (the send path itself is AutomationTests').
@Suite(.serialized) struct AutomationProcessTests {
    static let rule: JSON = [
        "name": "after a purchase", "appKey": "shop",
        "trigger": ["event": "purchase", "conditions": [["property": "price", "op": "range", "gt": 100]]],
        "reentry": ["mode": "every"],
        "steps": [["type": "wait", "seconds": 2], ["type": "send", "push": ["appId": "shop", "title": "t", "body": "b"]]],
    ]

    static func event(_ id: String, euid: String, price: Int64) -> JSON {
        ["id": .string(id), "ts": 1, "data": ["event": "purchase", "euid": .string(euid), "properties": ["price": .int(price)]]]
    }

    static func post(_ b: BackendProcess, key: String, _ records: [JSON], stream: String = "ma.shop") throws {
        let r = try b.postBatch(stream, key: key, ["records": .array(records)])
        guard r.status == 200 else { throw TestFailure(description: "batch \(key): \(r.status) \(r.text)") }
    }

    static func decisions(_ b: BackendProcess) throws -> [JSON] {
        try b.get("/v1/admin/automation/decisions?limit=500")["items"]?.arrayValue ?? []
    }

    static func createRule(_ b: BackendProcess) throws -> Int64 {
        let r = try b.request("POST", "/v1/admin/automation/rules", body: Array(rule.serialized.utf8))
        guard r.status == 201, let id = try r.json()["id"]?.intValue else { throw TestFailure(description: "rule: \(r.status) \(r.text)") }
        return id
    }

    @Test(arguments: StoreKind.allCases) func aWaitSurvivesAKill9AndARepeatedRecordStartsNoSecondJourney(_ store: StoreKind) throws {
        let dir = NSTemporaryDirectory() + "pylon-automation-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let database = try store.databaseArguments(sqliteFile: dir + "/backend.db")
        var b = try BackendProcess(database: database)
        _ = try Self.createRule(b)
        try Self.post(b, key: "k1", [Self.event("e1", euid: "ann", price: 150), Self.event("e2", euid: "bob", price: 50)])
        try waitUntil(timeout: 10) { try Self.decisions(b).contains { $0["decision"] == "waiting" } }
        // Killed before the wait is over: the journey is a row, the restarted backend fires it.
        kill(b.process.processIdentifier, SIGKILL)
        b.process.waitUntilExit()
        b = try BackendProcess(database: database)
        try waitUntil(timeout: 15) { try Self.decisions(b).contains { $0["decision"] == "suppressed" } }
        // The same record again (a retried upload under another key): no second journey.
        try Self.post(b, key: "k2", [Self.event("e1", euid: "ann", price: 150)])
        try Self.post(b, key: "k3", [Self.event("e3", euid: "bob", price: 120)])
        try waitUntil(timeout: 10) { try Self.decisions(b).contains { $0["user"] == "bob" && $0["decision"] == "triggered" } }
        let ann = try Self.decisions(b).filter { $0["user"] == "ann" }.reversed().map { $0["decision"]?.stringValue ?? "" }
        #expect(ann == ["triggered", "waiting", "suppressed"], "one journey for e1: \(ann)")
        #expect(try Self.decisions(b).first { $0["user"] == "ann" && $0["decision"] == "suppressed" }?["reason"] == "no_binding")
        // Erasing ann deletes her journeys and decisions.
        let erasure = try b.request(
            "POST", "/v1/admin/erasures", body: Array(#"{"appKey":"shop","euid":"ann"}"#.utf8))
        #expect(erasure.status == 200 || erasure.status == 202, "\(erasure.text)")
        try waitUntil(timeout: 15) {
            try b.get("/v1/admin/automation/decisions?user=ann")["items"]?.arrayValue?.isEmpty == true
        }
        // A later event of hers (an erased user's device still uploading) ends on consent.
        try Self.post(b, key: "k4", [Self.event("e4", euid: "ann", price: 500)])
        var annAfter: [JSON] = []
        try waitUntil(timeout: 15) {
            annAfter = try b.get("/v1/admin/automation/decisions?user=ann")["items"]?.arrayValue ?? []
            return annAfter.contains { $0["decision"] == "suppressed" }
        }
        #expect(annAfter.first { $0["decision"] == "suppressed" }?["reason"] == "consent", "\(annAfter)")
    }

    @Test func twoInstancesOnOnePostgresDatabaseStartEachJourneyOnce() throws {
        let database = try StoreKind.postgres.databaseArguments()
        let a = try BackendProcess(database: database)
        let b = try BackendProcess(database: database)
        let rule = try Self.createRule(a)
        // 40 users, each event posted to both instances (a retried upload landing elsewhere).
        for i in 0..<40 {
            let records = [Self.event("p\(i)", euid: "user\(i)", price: 200)]
            try Self.post(a, key: "a\(i)", records)
            try Self.post(b, key: "b\(i)", records)
        }
        try waitUntil(timeout: 30) {
            try Self.decisions(a).filter { $0["decision"] == "suppressed" }.count == 40
        }
        let all = try Self.decisions(b)
        let triggered = all.filter { $0["decision"] == "triggered" }.compactMap { $0["user"]?.stringValue }
        #expect(triggered.count == 40 && Set(triggered).count == 40, "each user's trigger started one journey: \(triggered.count)")
        #expect(all.filter { $0["decision"] == "suppressed" }.count == 40, "each journey ended once")
        let f = try a.get("/v1/admin/automation/rules/\(rule)/funnel")
        #expect(f["triggered"] == 40 && f["reasons"]?["no_binding"] == 40, "\(f.serialized)")
    }

    /// Branch and exit on both engines: a purchase since the trigger takes the `then` branch to
    /// an exit step; a user who did not buy reaches the send (no broker: `no_binding`); the
    /// exit event ends a waiting journey. A loop is refused with the field named.
    @Test(arguments: StoreKind.allCases) func aBranchOnAnEventSinceTheTriggerAndAnExitEvent(_ store: StoreKind) throws {
        let dir = NSTemporaryDirectory() + "pylon-automation-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let b = try BackendProcess(database: try store.databaseArguments(sqliteFile: dir + "/backend.db"))
        let send: JSON = ["type": "send", "push": ["appId": "shop", "title": "Come back", "body": "b"]]
        let loop: JSON = [
            "name": "loop", "appKey": "shop", "trigger": ["event": "cart"],
            "steps": [["id": "top", "type": "wait", "seconds": 1], ["type": "branch", "if": ["did": "purchase"], "then": "top"], send],
        ]
        let refused = try b.request("POST", "/v1/admin/automation/rules", body: Array(loop.serialized.utf8))
        let field = try refused.json()["field"]
        #expect(refused.status == 400 && field == "steps[1].then", "\(refused.text)")
        let rule: JSON = [
            "name": "abandoned cart", "appKey": "shop", "trigger": ["event": "cart"], "reentry": ["mode": "every"],
            "exit": ["event": "logout"],
            "steps": [
                ["type": "wait", "seconds": 2], ["type": "branch", "if": ["did": "purchase"], "then": "done"], send,
                ["id": "done", "type": "exit"],
            ],
        ]
        let created = try b.request("POST", "/v1/admin/automation/rules", body: Array(rule.serialized.utf8))
        #expect(created.status == 201, "\(created.text)")
        func event(_ id: String, _ euid: String, _ name: String) -> JSON {
            ["id": .string(id), "ts": 1, "data": ["event": .string(name), "euid": .string(euid), "properties": [:]]]
        }
        try Self.post(b, key: "c", [event("c1", "ann", "cart"), event("c2", "bob", "cart"), event("c3", "cid", "cart")])
        try waitUntil(timeout: 10) { try Self.decisions(b).filter { $0["decision"] == "waiting" }.count == 3 }
        try Self.post(b, key: "p", [event("p1", "ann", "purchase"), event("l1", "cid", "logout")])
        func trail(_ user: String) throws -> [String] {
            try Self.decisions(b).filter { $0["user"] == .string(user) }.reversed().map {
                ($0["decision"]?.stringValue ?? "") + "/" + ($0["reason"]?.stringValue ?? "")
            }
        }
        try waitUntil(timeout: 15) {
            try [trail("ann"), trail("bob"), trail("cid")].allSatisfy { $0.count >= 4 || $0.last?.hasPrefix("exited") == true }
        }
        #expect(try trail("ann") == ["triggered/", "waiting/wait", "branch/steps[1].then", "exited/exit_step"])
        #expect(try trail("bob") == ["triggered/", "waiting/wait", "branch/steps[1].else", "suppressed/no_binding"])
        #expect(try trail("cid") == ["triggered/", "waiting/wait", "exited/exit_event"])
        let f = try b.get("/v1/admin/automation/rules/\((try created.json())["id"]?.intValue ?? 0)/funnel")
        #expect(f["exited"] == 2 && f["branch"] == 2 && f["reasons"]?["exited:exit_event"] == 1, "\(f.serialized)")
    }

    /// A wait until 09:00 in each user's time zone: an IANA name in the profile (Asia/Tokyo:
    /// 00:00 UTC), a fixed offset (+05:30: 03:30 UTC), and none (the rule's -60: 10:00 UTC),
    /// seen in the journey view.
    @Test(arguments: StoreKind.allCases) func aWaitUntilATimeOfDayFollowsTheProfilesTimeZone(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        let rule: JSON = [
            "name": "morning", "appKey": "app", "trigger": ["event": "signup"], "guards": ["utcOffsetMinutes": -60],
            "steps": [["type": "wait", "until": "09:00"], ["type": "send", "push": ["appId": "app", "title": "t", "body": "b"]]],
        ]
        let created = try b.request("POST", "/v1/admin/automation/rules", body: Array(rule.serialized.utf8))
        #expect(created.status == 201, "\(created.text)")
        let zones: [(String, JSON?, Int64)] = [("tokyo", "Asia/Tokyo", 0), ("delhi", "+05:30", 12_600_000), ("nowhere", nil, 36_000_000)]
        var euids: [String: String] = [:]
        for (device, zone, _) in zones {
            let e = try b.startEUID(device)
            euids[device] = e
            if let zone { #expect(try b.prop(e, ["op": "set", "properties": ["timezone": zone]])["code"] == 0) }
        }
        let before = Int64(Date().timeIntervalSince1970 * 1000)
        try Self.post(
            b, key: "s",
            zones.map { ["id": .string($0.0), "ts": 1, "data": ["event": "signup", "euid": .string(euids[$0.0]!), "properties": [:]]] },
            stream: "ma.app")
        var journeys: [JSON] = []
        try waitUntil(timeout: 15) {
            journeys = try b.get("/v1/admin/automation/journeys")["items"]?.arrayValue ?? []
            return journeys.count == 3 && journeys.allSatisfy { $0["step"] == 1 }
        }
        let after = Int64(Date().timeIntervalSince1970 * 1000)
        for (device, _, utcOfDay) in zones {
            let j = try #require(journeys.first { $0["user"] == .string(euids[device]!) })
            let due = try #require(j["dueMs"]?.intValue)
            #expect(due % 86_400_000 == utcOfDay, "\(device): 09:00 local is \(utcOfDay / 60_000) min after 00:00 UTC: \(j.serialized)")
            #expect(due > before && due <= after + 86_400_000 && j["state"] == "pending", "\(device): the next such time: \(j.serialized)")
        }
        #expect(try Self.decisions(b).filter { $0["reason"] == "wait_until" }.count == 3)
    }
}
