import Foundation
import PylonCore
import TestSupport
import Testing

@testable import PylonBackend

/// The dry run (docs/AUTOMATION.md "Dry run"): the replay itself on made-up users (pure), and
/// the API over the last 24 h of a backend's events on SQLite.
struct AutomationDryRunTests {
    static func rule(_ extra: JSONObject = [:]) throws -> AutomationRule {
        var o: JSONObject = [
            "name": "big", "appKey": "app",
            "trigger": ["event": "purchase", "conditions": [["property": "price", "op": "range", "gt": 100]]],
            "reentry": ["mode": "every"], "steps": [["type": "send", "push": ["appId": "app", "title": "t", "body": "b"]]],
            "guards": ["capPerDay": 1],
        ]
        for (k, v) in extra { o[k] = v }
        do throws(AutomationError) { return try AutomationRule.parse(.object(o)) } catch {
            throw TestFailure(description: error.description)
        }
    }

    static let hour: Int64 = 3_600_000
    static func e(_ euid: String, _ t: Int64, _ price: Int64) -> AutomationDryRun.Event {
        .init(euid: euid, receivedMs: 10 * 86_400_000 + t * hour, properties: ["price": .int(price)])
    }

    @Test func capsReentryAudienceAndConsentAreCounted() throws {
        let events = [
            Self.e("ann", 1, 150), Self.e("ann", 2, 300), Self.e("ann", 3, 50),  // the second is capped, the third no match
            Self.e("bob", 1, 200), Self.e("cid", 1, 200), Self.e("dan", 1, 200), Self.e("", 1, 500),
        ]
        let users: [String: AutomationDryRun.User] = [
            "cid": .init(consentDenied: true), "dan": .init(member: false),
            "bob": .init(sentMs: [10 * 86_400_000]),  // already had one today
        ]
        let r = AutomationDryRun.run(try Self.rule(), events: events) { users[$0] ?? .init() }
        #expect(r.events == 7 && r.matched == 5 && r.triggered == 4 && r.users == 3)
        #expect(r.wouldSend == 1, "ann's first")
        #expect(r.suppressed == ["cap": 2, "consent": 1, "audience": 1], "\(r.suppressed)")
        // Once ever: ann's second purchase is a re-entry; transactional: no caps.
        var once = try Self.rule(["reentry": ["mode": "once"], "guards": ["capPerDay": 1, "transactional": true]])
        let r2 = AutomationDryRun.run(once, events: events) { users[$0] ?? .init() }
        #expect(r2.suppressed["reentry"] == 1 && r2.suppressed["cap"] == nil && r2.wouldSend == 2, "\(r2)")
        // Quiet hours 00:00-06:00 dropping: every send of the window is inside.
        once.guards.transactional = false
        once.guards.capPerDay = nil
        once.guards.quietHours = .init(start: 0, end: 360, deferSend: false)
        #expect(AutomationDryRun.run(once, events: events) { users[$0] ?? .init() }.suppressed["quiet_hours"] == 2)
    }

    @Test func theAPIReplaysTheLast24Hours() throws {
        let b = try BackendProcess(store: .sqlite)
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        try ConsoleDataTests.post(
            b, app: "app", key: "k1",
            [
                ConsoleDataTests.event("p1", "purchase", euid: "ann", time: now - 3_600_000, props: ["price": 150]),
                ConsoleDataTests.event("p2", "purchase", euid: "ann", time: now - 1_800_000, props: ["price": 250]),
                ConsoleDataTests.event("p3", "purchase", euid: "bob", time: now - 600_000, props: ["price": 20]),
                ConsoleDataTests.event("old", "purchase", euid: "cid", time: now - 2 * 86_400_000, props: ["price": 900]),
            ])
        let definition = try Self.rule().json
        let r = try b.request("POST", "/v1/admin/automation/dry-run", body: Array(definition.serialized.utf8))
        let j = try r.json()
        #expect(r.status == 200, "\(r.text)")
        #expect(j["events"] == 3 && j["matched"] == 2 && j["triggered"] == 2 && j["users"] == 1, "\(j.serialized)")
        #expect(j["suppressed"]?["no_binding"] == 2 && j["wouldSend"] == 0 && j["truncated"] == false, "no push device: \(j.serialized)")
        var bad = definition.objectValue!
        bad["steps"] = [["type": "wait"], ["type": "send", "push": ["appId": "app", "title": "t", "body": "b"]]]
        let refused = try b.request("POST", "/v1/admin/automation/dry-run", body: Array(JSON.object(bad).serialized.utf8))
        let field = try refused.json()["field"]
        #expect(refused.status == 400 && field == "steps[0].seconds")
        #expect(try b.request("POST", "/v1/admin/automation/dry-run", body: Array(#"{"rule": 9}"#.utf8)).status == 404)
    }
}
