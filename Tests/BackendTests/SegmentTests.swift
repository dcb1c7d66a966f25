import Foundation
import PylonCore
import TestSupport
import Testing

@testable import PylonBackend

/// Segments (docs/AUTOMATION.md "Segments"): definitions parsed and refused naming the field
/// (pure), and in the backend binary on SQLite and PostgreSQL: profile properties, identities,
/// push bindings and event history select the members; size and members are queryable; a
/// segment is a rule's audience and the target of a one-off send.
@Suite(.serialized) struct SegmentTests {
    func refusal(_ j: JSON) -> AutomationError? {
        do throws(AutomationError) {
            _ = try Segment.parse(j)
            return nil
        } catch { return error }
    }

    static func segment(_ conditions: JSON) -> JSON { ["name": "s", "appKey": "app", "conditions": conditions] }

    @Test func definitionsParseRoundTripAndAreRefusedNamingTheField() throws {
        let j = Self.segment([
            ["property": "profile.plan", "op": "equals", "value": "gold"], ["identity": "user_id"], ["pushBinding": true],
            ["did": "purchase", "atLeast": 2, "days": 30], ["didNot": "refund", "days": 7],
        ])
        let s = try Segment.parse(j)
        #expect(s.conditions.count == 5 && s.profileConditions.count == 1)
        #expect(s.conditions[4] == .did(event: "refund", atLeast: 1, days: 7, negate: true))
        #expect(try Segment.parse(s.json) == s)
        #expect(s.matchesProfile(["plan": "gold"]) && !s.matchesProfile(["plan": "basic"]))
        #expect(refusal(Self.segment([["did": "purchase"]]))?.field == "conditions[0].days")
        #expect(refusal(Self.segment([["did": "purchase", "days": 0]]))?.field == "conditions[0].days")
        #expect(refusal(Self.segment([["property": "plan", "op": "exists"]]))?.field == "conditions[0].property")
        let op = refusal(Self.segment([["property": "profile.plan", "op": "like"]]))
        #expect(op?.field == "conditions[0].op" && op?.message.contains("unknown operator") == true)
        #expect(refusal(Self.segment([["identity": "passport"]]))?.field == "conditions[0].identity")
        #expect(refusal(Self.segment([["favourite": "x"]]))?.field == "conditions[0]")
        #expect(refusal(["name": "s", "appKey": "app"])?.field == "conditions")
        #expect(refusal(["name": "s", "appKey": "bad key", "conditions": []])?.field == "appKey")
    }

    @Test(arguments: StoreKind.allCases) func membersSizeAudienceAndAOneOffSend(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        // ann: gold, user u-ann bound to a push device, 3 purchases; bob: basic, u-bob, 1
        // purchase, not bound; cid: gold, no user id, none.
        let ann = try #require(try b.ma("start", ["deviceId": "d1", "identity": ["user_id": "u-ann"]])["euid"]?.stringValue)
        let bob = try #require(try b.ma("start", ["deviceId": "d2", "identity": ["user_id": "u-bob"]])["euid"]?.stringValue)
        let cid = try b.startEUID("d3")
        for (e, plan) in [(ann, "gold"), (bob, "basic"), (cid, "gold")] {
            #expect(try b.prop(e, ["op": "set", "properties": ["plan": .string(plan)]])["code"] == 0)
        }
        let dev = try ConsoleDataTests.device(b, "install-1")
        let bind = try b.request(
            "POST", "/v1/push/bind", headers: [("Authorization", "Bearer " + dev.token)],
            body: Array(JSON.object(["token": .string(dev.push), "userId": "u-ann"]).serialized.utf8))
        #expect(try bind.json()["code"] == 0)
        try ConsoleDataTests.post(
            b, app: "app", key: "k1",
            (0..<3).map { ConsoleDataTests.event("a\($0)", "purchase", euid: ann, time: now - 1000) }
                + [ConsoleDataTests.event("b0", "purchase", euid: bob, time: now - 1000)]
                + [ConsoleDataTests.event("old", "purchase", euid: cid, time: now - 40 * 86_400_000)])
        func create(_ conditions: JSON) throws -> Int64 {
            let r = try b.request("POST", "/v1/admin/automation/segments", body: Array(Self.segment(conditions).serialized.utf8))
            guard r.status == 201, let id = try r.json()["id"]?.intValue else { throw TestFailure(description: "\(r.status) \(r.text)") }
            return id
        }
        func members(_ id: Int64) throws -> [String] {
            try b.get("/v1/admin/automation/segments/\(id)/members")["items"]?.arrayValue?.compactMap { $0["user"]?.stringValue } ?? []
        }
        func size(_ id: Int64) throws -> Int64? { try b.get("/v1/admin/automation/segments/\(id)/size")["size"]?.intValue }
        let goldWithId = try create([["property": "profile.plan", "op": "equals", "value": "gold"], ["identity": "user_id"]])
        let buyers = try create([["did": "purchase", "atLeast": 2, "days": 30]])
        let nonBuyers = try create([["didNot": "purchase", "days": 30]])
        let bound = try create([["pushBinding": true]])
        let gold = try create([["property": "profile.plan", "op": "equals", "value": "gold"]])
        #expect(try members(goldWithId) == [ann] && size(goldWithId) == 1)
        #expect(try members(buyers) == [ann] && size(buyers) == 1)
        #expect(try members(nonBuyers) == [cid] && size(nonBuyers) == 1, "cid's purchase is 40 days old")
        #expect(try members(bound) == [ann] && size(bound) == 1)
        #expect(try Set(members(gold)) == [ann, cid] && size(gold) == 2)
        let page = try b.get("/v1/admin/automation/segments/\(goldWithId)/members")["items"]?.arrayValue?.first
        #expect(page?["userId"] == "u-ann")
        let refused = try b.request("POST", "/v1/admin/automation/segments", body: Array(Self.segment([["did": "x"]]).serialized.utf8))
        let refusedField = try refused.json()["field"]
        #expect(refused.status == 400 && refusedField == "conditions[0].days")

        // The audience of a rule: only members start a journey; the others are logged.
        let rule: JSON = [
            "name": "bound viewers", "appKey": "app", "trigger": ["event": "view"], "audience": ["segment": .int(bound)],
            "steps": [["type": "wait", "seconds": 60], ["type": "send", "push": ["appId": "app", "title": "t", "body": "b"]]],
        ]
        var other = rule.objectValue!
        other["appKey"] = "shop"
        let wrongApp = try b.request("POST", "/v1/admin/automation/rules", body: Array(JSON.object(other).serialized.utf8))
        let wrongField = try wrongApp.json()["field"]
        #expect(wrongApp.status == 400 && wrongField == "audience.segment", "\(wrongApp.text)")
        let created = try b.request("POST", "/v1/admin/automation/rules", body: Array(rule.serialized.utf8))
        #expect(created.status == 201, "\(created.text)")
        try ConsoleDataTests.post(
            b, app: "app", key: "k2",
            [ConsoleDataTests.event("v1", "view", euid: ann, time: now), ConsoleDataTests.event("v2", "view", euid: bob, time: now)])
        var decisions: [JSON] = []
        try waitUntil(timeout: 15) {
            decisions = try b.get("/v1/admin/automation/decisions")["items"]?.arrayValue ?? []
            return decisions.count >= 2
        }
        #expect(decisions.contains { $0["user"] == .string(ann) && $0["decision"] == "triggered" }, "\(decisions)")
        #expect(decisions.contains { $0["user"] == .string(bob) && $0["decision"] == "suppressed" && $0["reason"] == "audience" })

        // A one-off send to a segment: members snapshotted, each sent or skipped with a reason
        // (cid has no user id: no_binding).
        let send = try b.request(
            "POST", "/v1/admin/automation/segments/\(nonBuyers)/send",
            body: Array(JSON.object(["push": ["appId": "app", "title": "We miss you", "body": "b"]]).serialized.utf8))
        #expect(send.status == 202, "\(send.text)")
        let sendId = try #require(try send.json()["id"]?.intValue)
        #expect(try send.json()["members"] == 1)
        var status: JSON = .null
        try waitUntil(timeout: 15) {
            status = try b.get("/v1/admin/automation/sends/\(sendId)")
            return status["pending"] == 0
        }
        #expect(status["suppressed"] == 1 && status["reasons"]?["no_binding"] == 1, "\(status.serialized)")
        // Erasing cid deletes the send's row of cid.
        let erasure = try b.request(
            "POST", "/v1/admin/erasures", body: Array(JSON.object(["appKey": "app", "euid": .string(cid)]).serialized.utf8))
        #expect(erasure.status == 200 || erasure.status == 202, "\(erasure.text)")
        try waitUntil(timeout: 15) { try b.get("/v1/admin/automation/sends/\(sendId)")["suppressed"] == 0 }
    }
}
