import PylonCore
import TestSupport
import Testing

@testable import PylonBackend

/// A rule's steps (docs/AUTOMATION.md "Steps"): waits, branches on a property or on an event
/// since the trigger, exits, sends; the validation of the step list (a wait without a
/// duration, a jump back, a step never reached); and a journey run on an injected clock.
struct AutomationStepsTests {
    static let send: JSON = ["type": "send", "push": ["appId": "shop", "title": "Come back", "body": "b"]]

    static func rule(_ steps: JSON, exit: JSON? = nil) -> JSON {
        var o: JSONObject = ["name": "cart", "appKey": "shop", "trigger": ["event": "add_to_cart"], "steps": steps]
        if let exit { o["exit"] = exit }
        return .object(o)
    }

    func parse(_ j: JSON) throws -> AutomationRule {
        do throws(AutomationError) { return try AutomationRule.parse(j) } catch { throw TestFailure(description: error.description) }
    }

    func refusal(_ j: JSON) -> AutomationError? {
        do throws(AutomationError) {
            _ = try AutomationRule.parse(j)
            return nil
        } catch { return error }
    }

    /// Abandoned cart: wait an hour; bought since? end; gold members get another push.
    static let abandonedCart = rule(
        [
            ["type": "wait", "seconds": 3600],
            ["type": "branch", "if": ["did": "purchase"], "then": "done"],
            ["type": "branch", "if": ["property": "profile.plan", "op": "equals", "value": "gold"], "then": "gold"],
            send,
            ["id": "gold", "type": "send", "push": ["appId": "shop", "title": "Gold: 10% off", "body": "b"]],
            ["id": "done", "type": "exit"],
        ], exit: ["event": "uninstall_intent"])

    func context(now: Int64 = 1_000_000, profile: JSON = [:], did: Set<String> = [], offset: Int = 0) -> AutomationJourney.Context {
        AutomationJourney.Context(
            now: now, offsetMinutes: offset, event: ["price": 20], profile: { profile }, did: { e, _ in did.contains(e) })
    }

    @Test func stepsParseAndTheirJSONParsesToTheSameRule() throws {
        let r = try parse(Self.abandonedCart)
        #expect(r.steps.count == 6 && r.leadingWaitSeconds == 3600)
        #expect(r.stepIds == [nil, nil, nil, nil, "gold", "done"])
        #expect(r.steps[1] == .branch(.init(condition: .did(event: "purchase", conditions: []), then: 5, otherwise: 2)))
        #expect(r.exitOn == AutomationRule.ExitOn(event: "uninstall_intent"))
        #expect(try parse(r.json) == r)
        #expect(r.json["steps"]?.arrayValue?[2]["if"]?["property"] == "profile.plan")
    }

    @Test func aJourneyTakesTheBranchItsConditionsSay() throws {
        let r = try parse(Self.abandonedCart)
        // Started after the leading wait (step 1).
        var run = AutomationJourney.run(r, from: 1, context())
        #expect(run.branches == ["steps[1].else", "steps[2].else"] && run.outcome == .send(step: 3))
        run = AutomationJourney.run(r, from: 1, context(profile: ["plan": "gold"]))
        #expect(run.branches == ["steps[1].else", "steps[2].then"] && run.outcome == .send(step: 4))
        run = AutomationJourney.run(r, from: 1, context(did: ["purchase"]))
        #expect(run.branches == ["steps[1].then"] && run.outcome == .exit("exit_step"))
        // The exit event ends the journey before any step.
        run = AutomationJourney.run(r, from: 1, context(did: ["uninstall_intent"]))
        #expect(run.branches.isEmpty && run.outcome == .exit("exit_event"))
        // From the start: the wait.
        #expect(AutomationJourney.run(r, from: 0, context()).outcome == .wait(untilMs: 1_000_000 + 3_600_000, step: 1, reason: "wait"))
    }

    @Test func aBranchOnATriggerPropertyAndADidWithConditions() throws {
        let r = try parse(
            Self.rule([
                ["type": "branch", "if": ["property": "event.price", "op": "range", "gte": 100], "else": "small"],
                ["type": "send", "push": ["appId": "shop", "title": "big", "body": "b"]],
                [
                    "id": "small", "type": "branch",
                    "if": ["did": "view", "conditions": [["property": "page", "op": "prefix", "value": "/sale"]]],
                ],
                Self.send,
            ]))
        #expect(AutomationJourney.run(r, from: 0, context()).outcome == .send(step: 3), "price 20 is small")
        guard case .branch(let b) = r.steps[2], case .did(let e, let cs) = b.condition else {
            Issue.record("steps[2] is a did branch")
            return
        }
        #expect(e == "view" && cs.count == 1 && b.then == 3 && b.otherwise == 3)
        var seen: [String] = []
        let c = AutomationJourney.Context(
            now: 0, offsetMinutes: 0, event: ["price": 150], profile: { [:] },
            did: { e, cs in
                seen.append(e)
                return cs.allSatisfy { $0.holds(["page": "/sale/tv"]) }
            })
        #expect(AutomationJourney.run(r, from: 0, c).outcome == .send(step: 1))
        #expect(seen.isEmpty, "no event read on the path not taken")
    }

    @Test func aWaitUntilATimeOfDayIsTheNextSuchTimeInTheUsersZone() throws {
        let r = try parse(Self.rule([["type": "wait", "until": "09:30"], Self.send]))
        #expect(r.steps[0] == .wait(.until(minuteOfDay: 570)) && r.leadingWaitSeconds == 0)
        let day: Int64 = 86_400_000
        // 08:00 UTC at UTC+2 is 10:00 local: 09:30 local tomorrow is 07:30 UTC tomorrow.
        let run = AutomationJourney.run(r, from: 0, context(now: 10 * day + 8 * 3_600_000, offset: 120))
        #expect(run.outcome == .wait(untilMs: 11 * day + 7 * 3_600_000 + 1_800_000, step: 1, reason: "wait_until"))
        // 05:00 UTC at UTC+2 is 07:00 local: today.
        #expect(
            AutomationJourney.nextTime(570, after: 10 * day + 5 * 3_600_000, offsetMinutes: 120) == 10 * day + 7 * 3_600_000 + 1_800_000)
        // Exactly 09:30: the next day.
        #expect(AutomationJourney.nextTime(570, after: 10 * day + 570 * 60_000, offsetMinutes: 0) == 11 * day + 570 * 60_000)
    }

    @Test func invalidStepsAreRefusedNamingTheField() {
        func field(_ steps: JSON) -> String? { refusal(Self.rule(steps))?.field }
        let noDuration = refusal(Self.rule([["type": "wait"], Self.send]))
        #expect(noDuration?.field == "steps[0].seconds" && noDuration?.message.contains("a wait needs a duration") == true)
        #expect(field([["type": "wait", "seconds": 5, "until": "09:00"], Self.send]) == "steps[0]")
        #expect(field([["type": "wait", "until": "9am"], Self.send]) == "steps[0].until")
        let loop = refusal(
            Self.rule([
                ["id": "top", "type": "wait", "seconds": 60],
                ["type": "branch", "if": ["did": "purchase"], "then": "top"], Self.send,
            ]))
        #expect(loop?.field == "steps[1].then" && loop?.message.contains("a loop") == true, "\(String(describing: loop))")
        #expect(field([["id": "me", "type": "branch", "if": ["did": "x"], "then": "me"], Self.send]) == "steps[0].then")
        #expect(field([["type": "branch", "if": ["did": "x"], "then": "nowhere"], Self.send]) == "steps[0].then")
        let unknownOp = refusal(Self.rule([["type": "branch", "if": ["property": "profile.age", "op": "between"]], Self.send]))
        #expect(unknownOp?.field == "steps[0].if.op" && unknownOp?.message.contains("unknown operator") == true)
        #expect(field([["type": "branch", "if": ["property": "age", "op": "exists"]], Self.send]) == "steps[0].if.property")
        #expect(field([Self.send, Self.send]) == "steps[1]", "a step after a send is never reached")
        #expect(field([["type": "exit"]]) == "steps")
        #expect(field([["type": "jump"], Self.send]) == "steps[0].type")
        #expect(field([["id": "a", "type": "wait", "seconds": 1], ["id": "a", "type": "exit"], Self.send]) == "steps[1].id")
        #expect(field(.array(Array(repeating: ["type": "wait", "seconds": 1], count: 20) + [Self.send])) == "steps")
        #expect(field([["type": "send", "template": 0]]) == "steps[0].template")
        #expect(refusal(Self.rule([Self.send], exit: ["conditions": []]))?.field == "exit.event")
    }
}

/// The user's time zone (`AutomationTimeZone`): fixed offsets, IANA names from the system's
/// zoneinfo with daylight saving, and the rule's offset when the profile names none.
struct AutomationTimeZoneTests {
    @Test func fixedOffsetsParseAndNonsenseDoesNot() {
        #expect(AutomationTimeZone.fixedOffset("UTC") == 0 && AutomationTimeZone.fixedOffset("Z") == 0)
        #expect(AutomationTimeZone.fixedOffset("+05:30") == 330)
        #expect(AutomationTimeZone.fixedOffset("-0800") == -480)
        #expect(AutomationTimeZone.fixedOffset("UTC+2") == 120 && AutomationTimeZone.fixedOffset("GMT-03:00") == -180)
        for bad in ["", "UTCX", "+25", "+05:3", "5", "+١٢", "Europe/Berlin", "+12345"] {
            #expect(AutomationTimeZone.fixedOffset(bad) == nil, "\(bad)")
        }
        for bad in ["../etc/passwd", "/etc/passwd", "Europe/../../x", "a b", "Europe//Berlin", ".hidden"] {
            #expect(!AutomationTimeZone.isZoneName(bad), "\(bad)")
        }
        #expect(AutomationTimeZone.isZoneName("America/Argentina/Buenos_Aires") && AutomationTimeZone.isZoneName("Etc/GMT+5"))
    }

    @Test func anIANAZoneFollowsDaylightSaving() throws {
        let berlin = try #require(AutomationTimeZone.load("Europe/Berlin"), "the system's zoneinfo has Europe/Berlin")
        // 2026-01-15 12:00 UTC: CET (+60); 2026-07-15 12:00 UTC: CEST (+120).
        #expect(berlin.offsetSeconds(at: 1_768_478_400) == 3600)
        #expect(berlin.offsetSeconds(at: 1_784_116_800) == 7200)
        let zone = { (n: String) in AutomationTimeZone.load(n) }
        #expect(AutomationTimeZone.offsetMinutes("America/New_York", now: 1_784_116_800_000, zone: zone) == -240)
        #expect(AutomationTimeZone.offsetMinutes("Asia/Kolkata", now: 1_784_116_800_000, zone: zone) == 330)
        #expect(AutomationTimeZone.offsetMinutes("Mars/Olympus_Mons", now: 0, zone: zone) == nil)
        #expect(AutomationTimeZone.offsetMinutes(42, now: 0, zone: zone) == nil)
        #expect(TZif(Array("TZif2 not a zone file".utf8)) == nil && TZif([]) == nil)
    }

    @Test func theGuardsUseTheUsersOffsetWhenKnown() throws {
        var r = try AutomationStepsTests().parse(
            AutomationStepsTests.rule([AutomationStepsTests.send]))
        r.guards.quietHours = AutomationRule.QuietHours(start: 22 * 60, end: 8 * 60, deferSend: false)
        let day: Int64 = 86_400_000
        let facts = AutomationGuard.Facts(
            now: 10 * day + 21 * 3_600_000, ruleStatus: "active", consentDenied: false, userId: "u", devices: 1, sentToday: 0,
            sent7Days: 0, ruleSentLastMinute: 0)
        #expect(AutomationGuard.decide(r, facts) == .send, "21:00 at the rule's UTC")
        var tokyo = facts
        tokyo.offsetMinutes = 540
        #expect(AutomationGuard.decide(r, tokyo) == .suppress("quiet_hours"), "06:00 in Tokyo")
    }
}
