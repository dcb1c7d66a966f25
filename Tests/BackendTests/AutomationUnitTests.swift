import PylonCore
import TestSupport
import Testing

@testable import PylonBackend

/// Automation's pure parts: rule parsing and validation, trigger conditions, re-entry,
/// templates, the guards on an injected clock, send budgets, the index read limit. No process,
/// no database (`make test-unit`).
struct AutomationUnitTests {
    static let bigPurchase: JSON = [
        "name": "Thanks for a big purchase", "appKey": "shop",
        "trigger": ["event": "purchase", "conditions": [["property": "price", "op": "range", "gt": 100]]],
        "reentry": ["mode": "perDays", "days": 7],
        "steps": [
            ["type": "wait", "seconds": 60],
            [
                "type": "send",
                "push": [
                    "appId": "shop", "title": "Thanks {{profile.name|there}}", "body": "You spent {{event.price}}",
                    "data": ["sku": "{{event.sku}}"],
                ],
            ],
        ],
        "guards": ["capPerDay": 1, "quietHours": ["start": "22:00", "end": "08:00", "mode": "defer"], "utcOffsetMinutes": 60],
    ]

    func parse(_ j: JSON) throws -> AutomationRule {
        do throws(AutomationError) { return try AutomationRule.parse(j) } catch { throw TestFailure(description: error.description) }
    }

    /// The refusal of `j`, or nil when it parses.
    func refusal(_ j: JSON) -> AutomationError? {
        do throws(AutomationError) {
            _ = try AutomationRule.parse(j)
            return nil
        } catch { return error }
    }

    func with(_ base: JSON, _ key: String, _ value: JSON?) -> JSON {
        var o = base.objectValue!
        o[key] = value
        return .object(o)
    }

    @Test func aRuleParsesAndItsJSONParsesToTheSameRule() throws {
        let r = try parse(Self.bigPurchase)
        #expect(r.appKey == "shop" && r.event == "purchase" && r.leadingWaitSeconds == 60 && r.reentry == .perDays(7))
        #expect(r.guards.capPerDay == 1 && r.guards.utcOffsetMinutes == 60)
        #expect(r.guards.quietHours == AutomationRule.QuietHours(start: 22 * 60, end: 8 * 60, deferSend: true))
        #expect(try parse(r.json) == r)
        #expect(r.json["guards"]?["quietHours"]?["start"] == "22:00")
    }

    @Test func refusalsNameTheFieldAndWhatItTakes() {
        let cond = { (c: JSON) -> JSON in
            self.with(Self.bigPurchase, "trigger", ["event": "purchase", "conditions": [c]])
        }
        let unknownOp = refusal(cond(["property": "price", "op": "between", "gt": 1]))
        #expect(unknownOp?.field == "trigger.conditions[0].op")
        #expect(unknownOp?.message.contains("unknown operator \"between\"") == true)
        #expect(refusal(cond(["property": "price", "op": "range"]))?.message.contains("at least one of gt") == true)
        #expect(refusal(cond(["property": "price", "op": "in", "values": []]))?.field == "trigger.conditions[0].values")
        #expect(refusal(cond(["op": "exists"]))?.field == "trigger.conditions[0].property")
        #expect(refusal(with(Self.bigPurchase, "trigger", ["conditions": []]))?.field == "trigger.event")
        #expect(refusal(with(Self.bigPurchase, "appKey", nil))?.field == "appKey")
        #expect(refusal(with(Self.bigPurchase, "appKey", "bad key!"))?.field == "appKey")
        let send: JSON = ["type": "send", "push": ["appId": "shop", "title": "t", "body": "b"]]
        let noDuration = refusal(with(Self.bigPurchase, "steps", [["type": "wait"], send]))
        #expect(noDuration?.field == "steps[0].seconds")
        #expect(noDuration?.message.contains("a wait needs a duration") == true)
        #expect(refusal(with(Self.bigPurchase, "steps", [["type": "wait", "seconds": 0], send]))?.field == "steps[0].seconds")
        #expect(refusal(with(Self.bigPurchase, "steps", [send, ["type": "wait", "seconds": 5]]))?.field == "steps[1]")
        #expect(refusal(with(Self.bigPurchase, "steps", [["type": "wait", "seconds": 5]]))?.field == "steps[0]")
        #expect(refusal(with(Self.bigPurchase, "steps", []))?.field == "steps")
        #expect(refusal(with(Self.bigPurchase, "stpes", []))?.field == "stpes", "a misspelt field is refused, not ignored")
        let badTemplate: JSON = ["type": "send", "push": ["appId": "shop", "title": "{{user.name}}", "body": "b"]]
        #expect(refusal(with(Self.bigPurchase, "steps", [badTemplate]))?.field == "steps[0].push.title")
        #expect(refusal(with(Self.bigPurchase, "reentry", ["mode": "perDays"]))?.field == "reentry.days")
        #expect(
            refusal(with(Self.bigPurchase, "guards", ["quietHours": ["start": "25:00", "end": "08:00"]]))?.field
                == "guards.quietHours.start")
        #expect(refusal(with(Self.bigPurchase, "guards", ["capPerDay": 0]))?.field == "guards.capPerDay")
    }

    @Test func conditionsMatchByOperator() throws {
        func rule(_ c: JSON) throws -> AutomationRule {
            try parse(with(Self.bigPurchase, "trigger", ["event": "purchase", "conditions": [c]]))
        }
        let gt = try rule(["property": "price", "op": "range", "gt": 100])
        #expect(gt.matches(event: "purchase", properties: ["price": 150]))
        #expect(gt.matches(event: "purchase", properties: ["price": 100.5]))
        #expect(!gt.matches(event: "purchase", properties: ["price": 100]))
        #expect(!gt.matches(event: "purchase", properties: ["price": "150"]), "a string is not a number")
        #expect(!gt.matches(event: "refund", properties: ["price": 150]))
        #expect(!gt.matches(event: "purchase", properties: [:]))
        let between = try rule(["property": "n", "op": "range", "gte": 1, "lte": 3])
        #expect(between.matches(event: "purchase", properties: ["n": 1]) && between.matches(event: "purchase", properties: ["n": 3]))
        #expect(!between.matches(event: "purchase", properties: ["n": 4]))
        let eq = try rule(["property": "plan", "op": "equals", "value": "gold"])
        #expect(eq.matches(event: "purchase", properties: ["plan": "gold"]) && !eq.matches(event: "purchase", properties: ["plan": "Gold"]))
        #expect(try rule(["property": "n", "op": "equals", "value": 2]).matches(event: "purchase", properties: ["n": 2.0]))
        let isIn = try rule(["property": "country", "op": "in", "values": ["DE", "FR"]])
        #expect(
            isIn.matches(event: "purchase", properties: ["country": "FR"])
                && !isIn.matches(event: "purchase", properties: ["country": "ES"]))
        let exists = try rule(["property": "coupon", "op": "exists"])
        #expect(exists.matches(event: "purchase", properties: ["coupon": ""]))
        #expect(!exists.matches(event: "purchase", properties: ["coupon": .null]) && !exists.matches(event: "purchase", properties: [:]))
        let prefix = try rule(["property": "sku", "op": "prefix", "value": "TV-"])
        #expect(
            prefix.matches(event: "purchase", properties: ["sku": "TV-55"])
                && !prefix.matches(event: "purchase", properties: ["sku": "tv-55"]))
    }

    @Test func reentryOnceEveryAndPerDays() throws {
        var r = try parse(Self.bigPurchase)
        let day: Int64 = 86_400_000
        #expect(r.mayEnter(lastEntryMs: nil, now: 0))
        #expect(!r.mayEnter(lastEntryMs: 0, now: 7 * day - 1))
        #expect(r.mayEnter(lastEntryMs: 0, now: 7 * day))
        #expect(r.entryKey(triggerKey: "3:e1") == "3:e1")
        r.reentry = .once
        #expect(!r.mayEnter(lastEntryMs: 0, now: 1000 * day))
        #expect(r.entryKey(triggerKey: "3:e1") == "once", "one journey per user, whichever event")
        r.reentry = .every
        #expect(r.mayEnter(lastEntryMs: 5, now: 5))
    }

    @Test func templatesRenderEventAndProfilePropertiesWithFallbacks() {
        let event: JSON = ["price": 150, "ratio": 0.5, "item": ["sku": "TV-55"], "gift": true]
        let profile: JSON = ["name": "Ada", "nick": .null]
        func r(_ s: String) -> String { AutomationTemplate.render(s, event: event, profile: profile) }
        #expect(r("Thanks {{profile.name|there}}, you spent {{event.price}}") == "Thanks Ada, you spent 150")
        #expect(r("Hi {{profile.nick|friend}} {{profile.missing}}!") == "Hi friend !")
        #expect(r("{{event.item.sku}} {{event.ratio}} {{event.gift}} {{ event.price }}") == "TV-55 0.5 true 150")
        #expect(r("no placeholders {single}") == "no placeholders {single}")
        #expect(AutomationTemplate.invalid("{{event.price") != nil)
        #expect(AutomationTemplate.invalid("{{price}}") != nil)
        #expect(AutomationTemplate.invalid("{{event.}}") != nil)
        #expect(AutomationTemplate.invalid("{{profile.name|a b}} and {{event.x}}") == nil)
        #expect(AutomationTemplate.cut("ééé", 5) == "éé")
    }

    static func facts(now: Int64, _ change: (inout AutomationGuard.Facts) -> Void = { _ in }) -> AutomationGuard.Facts {
        var f = AutomationGuard.Facts(
            now: now, ruleStatus: "active", consentDenied: false, userId: "u1", devices: 1, sentToday: 0, sent7Days: 0,
            ruleSentLastMinute: 0)
        change(&f)
        return f
    }

    @Test func guardsDecideInOrderOnAnInjectedClock() throws {
        var r = try parse(Self.bigPurchase)  // cap 1/day, quiet 22:00-08:00 defer, UTC+1
        let day: Int64 = 86_400_000
        let noonLocal = 10 * day + 11 * 3_600_000  // 12:00 at UTC+1
        #expect(AutomationGuard.decide(r, Self.facts(now: noonLocal)) == .send)
        #expect(AutomationGuard.decide(r, Self.facts(now: noonLocal) { $0.ruleStatus = "paused" }) == .suppress("paused"))
        #expect(
            AutomationGuard.decide(
                r,
                Self.facts(now: noonLocal) {
                    $0.consentDenied = true; $0.ruleStatus = "active"
                }) == .suppress("consent"))
        #expect(AutomationGuard.decide(r, Self.facts(now: noonLocal) { $0.userId = nil }) == .suppress("no_binding"))
        #expect(AutomationGuard.decide(r, Self.facts(now: noonLocal) { $0.devices = 0 }) == .suppress("no_binding"))
        #expect(AutomationGuard.decide(r, Self.facts(now: noonLocal) { $0.sentToday = 1 }) == .suppress("cap"))
        // 23:30 local: deferred to 08:00 local the next day (07:00 UTC).
        let lateLocal = 10 * day + 22 * 3_600_000 + 30 * 60_000
        #expect(AutomationGuard.decide(r, Self.facts(now: lateLocal)) == .later(untilMs: 11 * day + 7 * 3_600_000, reason: "quiet_hours"))
        // 01:00 local (00:00 UTC): deferred to 08:00 local the same day.
        #expect(AutomationGuard.decide(r, Self.facts(now: 11 * day)) == .later(untilMs: 11 * day + 7 * 3_600_000, reason: "quiet_hours"))
        #expect(AutomationGuard.decide(r, Self.facts(now: 11 * day + 7 * 3_600_000)) == .send, "the window's end is outside it")
        r.guards.quietHours?.deferSend = false
        #expect(AutomationGuard.decide(r, Self.facts(now: lateLocal)) == .suppress("quiet_hours"))
        // Transactional: exempt from quiet hours and caps, never from consent.
        r.guards.transactional = true
        #expect(AutomationGuard.decide(r, Self.facts(now: lateLocal) { $0.sentToday = 9 }) == .send)
        #expect(AutomationGuard.decide(r, Self.facts(now: lateLocal) { $0.consentDenied = true }) == .suppress("consent"))
        r.guards.transactional = false
        r.guards.quietHours = nil
        r.guards.capPerDay = nil
        r.guards.capPer7Days = 3
        #expect(
            AutomationGuard.decide(
                r,
                Self.facts(now: noonLocal) {
                    $0.sentToday = 2; $0.sent7Days = 2
                }) == .send)
        #expect(AutomationGuard.decide(r, Self.facts(now: noonLocal) { $0.sent7Days = 3 }) == .suppress("cap"))
        r.guards.sendsPerMinute = 10
        #expect(
            AutomationGuard.decide(r, Self.facts(now: noonLocal) { $0.ruleSentLastMinute = 10 })
                == .later(untilMs: noonLocal + 1000, reason: "rate_limit"))
    }

    @Test func calendarDaysFollowTheOffset() {
        let day: Int64 = 86_400_000
        #expect(AutomationGuard.dayStart(10 * day + 5, offsetMinutes: 0) == 10 * day)
        // 23:30 UTC is already the next day at UTC+1 (which began at 23:00 UTC).
        #expect(AutomationGuard.dayStart(10 * day + 23 * 3_600_000 + 1_800_000, offsetMinutes: 60) == 10 * day + 23 * 3_600_000)
        // 00:30 UTC is still the previous day at UTC-5 (which began at 05:00 UTC).
        #expect(AutomationGuard.dayStart(10 * day + 1_800_000, offsetMinutes: -300) == 9 * day + 5 * 3_600_000)
    }

    @Test func budgetsRefillEachSecond() {
        var b = AutomationBudget(perSecond: 3)
        #expect(b.available(now: 1000) == 3)
        b.spend(2, now: 1000)
        #expect(b.available(now: 1999) == 1)
        b.spend(1, now: 1500)
        #expect(b.available(now: 1999) == 0)
        #expect(b.available(now: 2000) == 3)
    }

    @Test func theIndexIsReadOnlyUpToIdsOldEnough() {
        var s = AutomationSettle(settleMs: 1000)
        s.note(newestId: 10, now: 0)
        #expect(s.limit(now: 500) == nil)
        s.note(newestId: 20, now: 600)
        #expect(s.limit(now: 1000) == 10)
        #expect(s.limit(now: 1700) == 20)
        for t in 0..<1000 { s.note(newestId: Int64(t), now: Int64(t) * 10) }
        #expect(s.samples.count <= AutomationSettle.maxSamples)
        var sqlite = AutomationSettle(settleMs: 0)
        sqlite.note(newestId: 7, now: 0)
        #expect(sqlite.limit(now: 0) == 7, "SQLite reads up to the newest id at once")
    }
}
