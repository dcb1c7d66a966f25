import Foundation
import PylonClientKit
import TestSupport
import Testing

/// A device with the MA plugin, the push plugin and the uploader against a backend and a
/// broker: its MA user is `userId` (identified and bound for push), and an app attached to
/// push app `appKey` receives what the backend's automation sends.
final class AutomationWorld {
    let world: PushWorld
    let host: TestHost
    let client: SyncClient
    let app: PushApp
    let euid: String
    let appKey = "shop"
    let userId = "u1"

    init() throws {
        world = try PushWorld()
        let b = world.backend
        let ma: JSON = [
            "name": "ma", "exec": "pylon-ma", "backoffInitialMs": 50,
            "config": [
                "backend": .string(b.baseURL), "credentialFile": .string(b.credentialFile), "retryInitialMs": 100, "retryMaxMs": 500,
            ],
        ]
        // One uploader for the MA events, the push plugin's streams and the consent reports.
        let streams: JSON = [
            "ma.*": ["maxCount": 50, "intervalMs": 600000], "push.*": ["maxCount": 50, "intervalMs": 600000],
            "pylon.consent": ["intervalMs": 100],
        ]
        let plugins = world.plugins().map { p -> JSON in
            p["name"] == "uploader" ? TestHost.uploader(b, config: ["streams": streams]) : p
        }
        host = try TestHost(plugins: plugins + [ma])
        _ = try host.pushToken()
        client = try host.client()
        let s = try client.call("ma.start", ["appKey": .string(appKey)])
        guard let e = s["euid"]?.stringValue else { throw TestFailure(description: "ma.start: \(s.serialized)") }
        euid = e
        guard code(try client.call("ma.identifyAccount", ["userID": .string(userId)])) == 0,
            pcode(try client.call("push.bind", ["userId": .string(userId)])) == 0
        else { throw TestFailure(description: "identify or bind failed") }
        app = try PushApp(host, appId: appKey)
    }

    var backend: TestBackend { world.backend }

    /// Records an event and flushes the AppKey's stream to the backend.
    func record(_ name: String, _ properties: JSON = [:]) throws {
        guard code(try client.call("ma.eventRecord", ["eventName": .string(name), "property": properties])) == 0 else {
            throw TestFailure(description: "eventRecord \(name) failed")
        }
        _ = try client.call("uploader.flush", ["stream": .string("ma.\(appKey)"), "wait": true], timeoutMs: 30000)
    }

    /// Creates a rule (201) and answers its id.
    func rule(_ definition: JSON) throws -> Int64 {
        let r = try backend.request("POST", "/v1/admin/automation/rules", body: definition)
        guard r.status == 201, let id = r.json["id"]?.intValue else {
            throw TestFailure(description: "create: \(r.status) \(r.json.serialized)")
        }
        return id
    }

    func decisions(rule: Int64) throws -> [JSON] {
        try backend.request("GET", "/v1/admin/automation/decisions?rule=\(rule)&user=\(euid)").json["items"]?.arrayValue ?? []
    }

    /// The rule's decisions (oldest first) once one of them is `kind` (with `reason`).
    @discardableResult
    func waitForDecision(rule: Int64, _ kind: String, reason: String? = nil, timeout: Double = 15) throws -> [JSON] {
        var seen: [JSON] = []
        do {
            try waitUntil(timeout: timeout) {
                seen = try decisions(rule: rule)
                return seen.contains { $0["decision"] == .string(kind) && (reason == nil || $0["reason"] == .string(reason!)) }
            }
        } catch {
            let all = try backend.request("GET", "/v1/admin/automation/decisions").json.serialized
            let events =
                try backend.request("GET", "/v1/admin/events?appKey=\(appKey)").json.serialized + " rules: "
                + backend.request("GET", "/v1/admin/automation/rules").json.serialized
            let log = ((try? String(contentsOfFile: backend.dir + "/backend.log", encoding: .utf8)) ?? "").split(separator: "\n")
                .filter { $0.contains("automation") }.suffix(5).joined(separator: "\n")
            throw TestFailure(
                description: "no \(kind) \(reason ?? "") decision for rule \(rule) (euid \(euid)): \(all); events: \(events); log: \(log)")
        }
        return seen.reversed()
    }

    func funnel(_ rule: Int64) throws -> JSON { try backend.request("GET", "/v1/admin/automation/rules/\(rule)/funnel").json }

    /// The barrier for "nothing (more) reaches the app": a push sent now through the admin path
    /// to the same user and app is the next message the app gets. Anything the automation had
    /// sent before it would have come first (one broker session, delivered in order), and the
    /// caller waited for the decision that ended the journey, so nothing is sent after it.
    func expectTheMarkerNext(_ label: String) throws {
        let marker = "marker " + label
        _ = try PushWorld.send(
            backend, ["appId": .string(appKey), "targetType": "user", "target": .string(userId), "title": .string(marker), "content": "m"],
            timeout: 15)
        let p = try app.receive(timeoutMs: 15000)
        #expect(p?["message"]?["title"] == .string(marker), "the next message is the marker: \(p?.serialized ?? "none")")
    }

    static func definition(
        _ name: String, event: String, conditions: JSON = [], reentry: JSON = ["mode": "every"], wait: Int64? = nil,
        title: String = "t", body: String = "b", data: JSON? = nil, guards: JSON = [:]
    ) -> JSON {
        var push: JSONObject = ["appId": "shop", "title": .string(title), "body": .string(body)]
        if let data { push["data"] = data }
        var steps: [JSON] = []
        if let wait { steps.append(["type": "wait", "seconds": .int(wait)]) }
        steps.append(["type": "send", "push": .object(push)])
        return [
            "name": .string(name), "appKey": "shop", "trigger": ["event": .string(event), "conditions": conditions], "reentry": reentry,
            "steps": .array(steps), "guards": guards,
        ]
    }
}

/// Marketing automation end to end (docs/AUTOMATION.md): real pylond with the MA, push and
/// uploader plugins, the reference backend and mosquitto.
@Suite(.serialized) struct AutomationTests {
    @Test func aBigPurchaseSendsTheTemplatedPushOnceAndARepeatInsideTheWindowIsLoggedAsReentry() throws {
        let w = try AutomationWorld()
        // Refused definitions name the field.
        let bad = try w.backend.request(
            "POST", "/v1/admin/automation/rules",
            body: AutomationWorld.definition("x", event: "purchase", conditions: [["property": "price", "op": "above", "value": 1]]))
        #expect(bad.status == 400)
        #expect(bad.json["field"] == "trigger.conditions[0].op", "\(bad.json.serialized)")
        let rule = try w.rule(
            AutomationWorld.definition(
                "big purchase", event: "purchase", conditions: [["property": "price", "op": "range", "gt": 100]],
                reentry: ["mode": "perDays", "days": 1], title: "Thanks {{profile.name|there}}", body: "You spent {{event.price}}",
                data: ["sku": "{{event.sku}}"]))
        try w.record("purchase", ["price": 50, "sku": "CABLE"])
        try w.record("purchase", ["price": 150, "sku": "TV-55"])
        let p = try #require(try w.app.receive(timeoutMs: 15000), "the templated push arrives")
        let m = try #require(p["message"])
        #expect(m["title"] == "Thanks there")
        #expect(m["content"] == "You spent 150")
        #expect(m["extras"]?["sku"] == "TV-55")
        let log = try w.waitForDecision(rule: rule, "sent")
        #expect(log.map { $0["decision"] } == ["triggered", "sent"], "\(log)")
        #expect(log.last?["msgId"] == m["id"], "the decision names the push's message id")
        // A second matching event inside the re-entry window: nothing sent, and logged why.
        try w.record("purchase", ["price": 300, "sku": "TV-65"])
        try w.waitForDecision(rule: rule, "suppressed", reason: "reentry")
        try w.expectTheMarkerNext("after the re-entry")
        // The funnel continues under the message id: the device acknowledged it.
        try waitUntil(timeout: 10) { try w.funnel(rule)["push"]?["delivered"] == 1 }
        let f = try w.funnel(rule)
        #expect(f["triggered"] == 1 && f["sent"] == 1 && f["push"]?["sent"] == 1, "\(f.serialized)")
        #expect(f["reasons"]?["reentry"] == 1)
        let history = try w.backend.request("GET", "/v1/admin/push/messages/\(m["id"]?.stringValue ?? "")").json
        #expect(history["counts"]?["delivered"] == 1, "\(history.serialized)")
    }

    @Test func aCapOfOnePerDaySuppressesASecondRulesPush() throws {
        let w = try AutomationWorld()
        let cap: JSON = ["capPerDay": 1]
        let first = try w.rule(AutomationWorld.definition("welcome", event: "signup", title: "Welcome", guards: cap))
        let second = try w.rule(AutomationWorld.definition("tips", event: "level_up", title: "Tips", guards: cap))
        try w.record("signup")
        #expect(try w.app.receive(timeoutMs: 15000)?["message"]?["title"] == "Welcome")
        try w.waitForDecision(rule: first, "sent")
        try w.record("level_up")
        try w.waitForDecision(rule: second, "suppressed", reason: "cap")
        try w.expectTheMarkerNext("after the cap")
        #expect(try w.funnel(second)["sent"] == 0)
    }

    /// Quiet hours around the current time (UTC, an hour either side): a `drop` rule ends the
    /// journey, a `defer` rule moves it to the window's end; the app receives nothing now.
    /// (The window's end itself is checked on an injected clock in AutomationUnitTests.)
    @Test func quietHoursDropOrDeferASend() throws {
        let w = try AutomationWorld()
        let minute = Int(Date().timeIntervalSince1970 / 60) % 1440
        func clock(_ m: Int) -> JSON {
            let v = (m + 1440) % 1440
            return .string(String(format: "%02d:%02d", v / 60, v % 60))
        }
        func quiet(_ mode: String) -> JSON {
            ["quietHours": ["start": clock(minute - 60), "end": clock(minute + 60), "mode": .string(mode)]]
        }
        let drop = try w.rule(AutomationWorld.definition("night drop", event: "late", title: "Dropped", guards: quiet("drop")))
        let deferred = try w.rule(AutomationWorld.definition("night defer", event: "late", title: "Deferred", guards: quiet("defer")))
        try w.record("late")
        try w.waitForDecision(rule: drop, "suppressed", reason: "quiet_hours")
        try w.waitForDecision(rule: deferred, "waiting", reason: "quiet_hours")
        try w.expectTheMarkerNext("in quiet hours")
        #expect(try w.funnel(deferred)["sent"] == 0)
    }

    @Test func anOptedOutUserIsNeverSentTo() throws {
        let w = try AutomationWorld()
        let rule = try w.rule(AutomationWorld.definition("any purchase", event: "purchase", title: "Hello"))
        // The user's opt-out of the device's push switch, as a device reports it on
        // pylon.consent (naming the user); the backend marks it (GET /v1/admin/optouts). The
        // device keeps collecting MA events: only its push switch is denied.
        let consent: JSON = [
            "records": [["id": "c1", "ts": 1, "data": ["switch": "push", "granted": false, "appKey": "shop", "euid": .string(w.euid)]]]
        ]
        let posted = try httpExchange(
            port: w.backend.port, "POST", "/v1/batches/pylon.consent", body: consent,
            headers: [("Authorization", "Bearer " + TestBackend.deviceKey), ("Idempotency-Key", "consent-1")])
        #expect(posted.status == 200, "\(posted.body)")
        try waitUntil(timeout: 15) {
            (try w.backend.request("GET", "/v1/admin/optouts").json["items"]?.arrayValue ?? []).contains { $0["switch"] == "push" }
        }
        try w.record("purchase", ["price": 10])
        try w.waitForDecision(rule: rule, "suppressed", reason: "consent")
        let sends = try w.backend.request("GET", "/v1/inspect/push/sends").json["sends"]?.arrayValue ?? []
        #expect(sends.isEmpty, "no push was recorded for the user: \(sends)")
        try w.expectTheMarkerNext("after the opt-out")
    }

    /// A stored template (profile and trigger-event properties, fallbacks) that a rule's send
    /// step names; an edit of the template applies to the next send.
    @Test func aStoredTemplateRendersProfileAndEventPropertiesWithFallbacks() throws {
        let w = try AutomationWorld()
        let bad = try w.backend.request(
            "POST", "/v1/admin/automation/templates", body: ["name": "x", "appId": "shop", "title": "{{user.name}}", "body": "b"])
        #expect(bad.status == 400 && bad.json["field"] == "title", "\(bad.json.serialized)")
        let created = try w.backend.request(
            "POST", "/v1/admin/automation/templates",
            body: [
                "name": "shipped", "appId": "shop", "title": "Thanks {{profile.name|there}}",
                "body": "{{event.sku|Your order}} is on its way", "data": ["tier": "{{profile.tier|basic}}"],
            ])
        let template = try #require(created.json["id"]?.intValue, "\(created.json.serialized)")
        #expect(created.status == 201 && created.json["version"] == 1)
        let missing = try w.backend.request(
            "POST", "/v1/admin/automation/rules",
            body: ["name": "r", "appKey": "shop", "trigger": ["event": "purchase"], "steps": [["type": "send", "template": 999]]])
        #expect(missing.status == 400 && missing.json["field"] == "steps[0].template", "\(missing.json.serialized)")
        let rule = try w.rule([
            "name": "shipped", "appKey": "shop", "trigger": ["event": "purchase"], "reentry": ["mode": "every"],
            "steps": [["type": "send", "template": .int(template)]],
        ])
        #expect(code(try w.client.call("ma.setProperty", ["properties": ["name": "Ann"]])) == 0)
        try w.record("purchase", ["price": 10])
        let first = try #require(try w.app.receive(timeoutMs: 15000)?["message"], "the templated push arrives")
        #expect(first["title"] == "Thanks Ann" && first["content"] == "Your order is on its way", "\(first.serialized)")
        #expect(first["extras"]?["tier"] == "basic")
        try w.waitForDecision(rule: rule, "sent")
        // An edit is the template's next version; the next journey sends the new text.
        let edited = try w.backend.request(
            "PUT", "/v1/admin/automation/templates/\(template)",
            body: ["name": "shipped", "appId": "shop", "title": "Danke {{profile.name}}", "body": "{{event.sku}} kommt"])
        #expect(edited.status == 200 && edited.json["version"] == 2, "\(edited.json.serialized)")
        try w.record("purchase", ["sku": "TV-55"])
        let second = try #require(try w.app.receive(timeoutMs: 15000)?["message"])
        #expect(second["title"] == "Danke Ann" && second["content"] == "TV-55 kommt", "\(second.serialized)")
        let listed = try w.backend.request("GET", "/v1/admin/automation/templates").json["items"]?.arrayValue ?? []
        #expect(listed.count == 1 && listed.first?["name"] == "shipped")
    }

    /// A one-off send to a segment goes through the admin push path: the member's app gets the
    /// templated push once, and the send's progress names its message.
    @Test func aOneOffSendToASegmentReachesItsMembers() throws {
        let w = try AutomationWorld()
        #expect(code(try w.client.call("ma.setProperty", ["properties": ["name": "Ann", "plan": "gold"]])) == 0)
        let seg = try w.backend.request(
            "POST", "/v1/admin/automation/segments",
            body: [
                "name": "gold and reachable", "appKey": "shop",
                "conditions": [["property": "profile.plan", "op": "equals", "value": "gold"], ["pushBinding": true]],
            ])
        let segment = try #require(seg.json["id"]?.intValue, "\(seg.json.serialized)")
        let members = try w.backend.request("GET", "/v1/admin/automation/segments/\(segment)/members").json["items"]?.arrayValue ?? []
        #expect(members.map { $0["user"] } == [.string(w.euid)] && members.first?["userId"] == .string(w.userId))
        #expect(try w.backend.request("GET", "/v1/admin/automation/segments/\(segment)/size").json["size"] == 1)
        let send = try w.backend.request(
            "POST", "/v1/admin/automation/segments/\(segment)/send",
            body: ["push": ["appId": "shop", "title": "Hi {{profile.name|there}}", "body": "Gold news"]])
        #expect(send.status == 202 && send.json["members"] == 1, "\(send.json.serialized)")
        let m = try #require(try w.app.receive(timeoutMs: 15000)?["message"])
        #expect(m["title"] == "Hi Ann" && m["content"] == "Gold news")
        var status: JSON = .null
        try waitUntil(timeout: 10) {
            status = try w.backend.request("GET", "/v1/admin/automation/sends/\(send.json["id"]?.intValue ?? 0)").json
            return status["sent"] == 1
        }
        #expect(status["pending"] == 0 && status["suppressed"] == 0, "\(status.serialized)")
        try w.expectTheMarkerNext("after the one-off send")
    }
}
