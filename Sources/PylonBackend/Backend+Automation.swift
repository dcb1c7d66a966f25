import PylonCore

/// Marketing automation (docs/AUTOMATION.md): the rules API under `/v1/admin/automation`, and
/// the evaluator the periodic job runs each turn (`runAutomation`): read the event index after
/// the persisted cursor in a bounded batch, start journeys for the rules it matches, then send
/// the due journeys through the push send path, each past its guards. Rules and journeys are
/// rows (`Store+Automation.swift`); this instance keeps only caches and its send budgets.
final class AutomationState {
    /// Parsed definitions by rule id and version.
    var definitions: [Int64: (version: Int64, rule: AutomationRule)] = [:]
    /// The active rules as last read: (id, version, created, rule).
    var active: [(id: Int64, version: Int64, createdMs: Int64, rule: AutomationRule)] = []
    var global = AutomationBudget(perSecond: AutomationLimits.globalSendsPerSecond)
    var perRule: [Int64: AutomationBudget] = [:]
    var settle: AutomationSettle
    /// Counters for `/metrics` (this instance).
    var evaluated = 0
    var journeys = 0
    var sent = 0
    var suppressed = 0
    var deferredByBudget = 0
    /// Event index rows not evaluated yet (newest id minus the cursor), as last seen.
    var backlog: Int64 = 0
    var metricsRegistered = false
    /// Parsed zone files by IANA name (nil: none such), at most `AutomationLimits.maxCachedZones`.
    var zones: [String: TZif?] = [:]
    /// `automation_journeys.step` is there (added in place to an older database once).
    var stepColumnChecked = false

    init(postgres: Bool) {
        settle = AutomationSettle(settleMs: postgres ? AutomationLimits.settleMs : 0)
    }
}

extension Backend {
    var automation: AutomationState? { consoleData?.automation }

    // MARK: API

    func automationRoute(_ request: HTTPRequest, _ r: AutomationRoute, _ principal: Principal) throws(APIError) -> HTTPResponse {
        let now = System.wallClockMs()
        switch r {
        case .templates, .createTemplate, .template, .updateTemplate, .segments, .createSegment, .segment, .updateSegment,
            .segmentSize, .segmentMembers, .segmentSend, .send, .dryRun:
            return try automationObjectRoute(request, r, principal, now: now)
        case .rules:
            let q = request.query
            let limit = try pageLimit(q, max: AutomationLimits.maxPage, default: 50)
            let status = nonEmpty(q["status"])
            if let s = status, !["active", "paused", "archived"].contains(s) {
                throw .badRequest(.invalidRequest, "status must be active, paused or archived")
            }
            let after = try cursorInt(q) ?? 0
            let rows = try storage { () throws(StoreError) in try store.automationRules(status: status, after: after, limit: limit) }
            return list(rows.map(Backend.ruleJSON), next: rows.count == limit ? rows.last.map { String($0.id) } : nil)
        case .createRule:
            var body = try jsonBody(request)
            let status = try takeStatus(&body)
            let rule = try parseRule(body)
            let id = try storage { () throws(StoreError) -> Int64 in
                guard try store.automationRuleCount() < AutomationLimits.maxRules else { return 0 }
                return try store.createAutomationRule(rule, status: status, actor: principal.actor, now: now)
            }
            guard id > 0 else {
                throw APIError(
                    status: 409, code: .invalidRequest,
                    message: "at most \(AutomationLimits.maxRules) rules that are not archived (archive one first)")
            }
            let row = try ruleRow(id)
            audit(
                principal, "automation.rule.create", target: "rule " + String(id),
                detail: ["name": .string(rule.name), "status": .string(status)])
            return HTTPResponse(status: 201, Backend.ruleJSON(row))
        case .rule(let id):
            let row = try ruleRow(id)
            var o = Backend.ruleJSON(row).objectValue ?? [:]
            let versions = try storage { () throws(StoreError) in try store.automationRuleVersions(id) }
            o["versions"] = .array(
                versions.map { ["version": .int($0.version), "createdMs": .int($0.createdMs), "actor": .string($0.actor)] })
            return HTTPResponse(.object(o))
        case .updateRule(let id):
            var body = try jsonBody(request)
            if body["status"] != nil {
                throw .badRequest(.invalidRequest, "status: change it with POST .../pause, .../resume or .../archive")
            }
            let rule = try parseRule(body)
            _ = try takeStatus(&body)
            guard
                let v = try storage({ () throws(StoreError) in try store.updateAutomationRule(id, rule, actor: principal.actor, now: now) })
            else { throw APIError(status: 404, code: .notFound, message: "no rule \(id) that is not archived") }
            audit(principal, "automation.rule.update", target: "rule " + String(id), detail: ["version": .int(v)])
            return HTTPResponse(Backend.ruleJSON(try ruleRow(id)))
        case .setStatus(let id, let action):
            let status = action == "pause" ? "paused" : action == "resume" ? "active" : "archived"
            guard try storage({ () throws(StoreError) in try store.setAutomationRuleStatus(id, status, now: now) }) else {
                throw APIError(status: 404, code: .notFound, message: "no rule \(id) that is not archived")
            }
            audit(principal, "automation.rule." + action, target: "rule " + String(id))
            return HTTPResponse(Backend.ruleJSON(try ruleRow(id)))
        case .funnel(let id):
            _ = try ruleRow(id)
            let f = try storage { () throws(StoreError) in try store.automationFunnel(id) }
            var counts: JSONObject = ["triggered": 0, "waiting": 0, "branch": 0, "sent": 0, "suppressed": 0, "exited": 0]
            var reasons: JSONObject = [:]
            for d in f.decisions {
                counts[d.kind] = .int((counts[d.kind]?.intValue ?? 0) + d.count)
                if let r = d.reason {
                    let key = d.kind == "suppressed" ? r : d.kind + ":" + r
                    reasons[key] = .int((reasons[key]?.intValue ?? 0) + d.count)
                }
            }
            var o = counts
            o["ruleId"] = .int(id)
            o["reasons"] = .object(reasons)
            o["push"] = ["sent": .int(f.sent), "delivered": .int(f.delivered), "opened": .int(f.opened)]
            return HTTPResponse(.object(o))
        case .decisions:
            let f = try journeyFilter(request)
            let rows = try storage { () throws(StoreError) in
                try store.automationDecisions(rule: f.rule, euid: f.user, appKey: f.appKey, before: f.before, limit: f.limit)
            }
            let limit = f.limit
            return list(rows.map(Backend.decisionJSON), next: rows.count == limit ? rows.last.map { String($0.id) } : nil)
        case .journeys:
            let f = try journeyFilter(request)
            let rows = try storage { () throws(StoreError) in
                try store.automationJourneys(rule: f.rule, euid: f.user, appKey: f.appKey, before: f.before, limit: f.limit)
            }
            let limit = f.limit
            return list(rows, next: rows.count == limit ? rows.last?["id"]?.intValue.map { String($0) } : nil)
        }
    }

    /// Parses a rule definition; a send step's template must exist.
    func parseRule(_ body: JSON) throws(APIError) -> AutomationRule {
        let rule = try refusing { () throws(AutomationError) in try AutomationRule.parse(body) }
        for (i, s) in rule.steps.enumerated() {
            guard case .send(.template(let id)) = s else { continue }
            guard try storage({ () throws(StoreError) in try store.automationObject(.template, id) }) != nil else {
                throw automationRefusal(AutomationError("steps[\(i)].template", "no template \(id)"))
            }
        }
        if let id = rule.audience {
            let seg: Segment
            do throws(APIError) { seg = try segment(id) } catch {
                throw automationRefusal(AutomationError("audience.segment", "no segment \(id)"))
            }
            guard seg.appKey == rule.appKey else {
                throw automationRefusal(AutomationError("audience.segment", "segment \(id) is of AppKey \(seg.appKey), not \(rule.appKey)"))
            }
        }
        return rule
    }

    /// Removes `status` from a create body: `active` (the default) or `paused`.
    private func takeStatus(_ body: inout JSON) throws(APIError) -> String {
        guard var o = body.objectValue, let s = o["status"] else { return "active" }
        guard let status = s.stringValue, status == "active" || status == "paused" else {
            throw .badRequest(.invalidRequest, "status must be active or paused")
        }
        o["status"] = nil
        body = .object(o)
        return status
    }

    func ruleRow(_ id: Int64) throws(APIError) -> Store.RuleRow {
        guard let row = try storage({ () throws(StoreError) in try store.automationRule(id) }) else {
            throw APIError(status: 404, code: .notFound, message: "no rule \(id)")
        }
        return row
    }

    static func ruleJSON(_ r: Store.RuleRow) -> JSON {
        [
            "id": .int(r.id), "name": .string(r.name), "appKey": .string(r.appKey), "status": .string(r.status),
            "version": .int(r.version), "createdMs": .int(r.createdMs), "updatedMs": .int(r.updatedMs),
            "definition": (try? JSON.parse(r.definition)) ?? .null,
        ]
    }

    static func decisionJSON(_ d: Store.DecisionRow) -> JSON {
        [
            "id": .int(d.id), "timeMs": .int(d.timeMs), "ruleId": .int(d.ruleId), "version": .int(d.version), "appKey": .string(d.appKey),
            "user": .string(d.euid), "journeyId": d.journeyId.map(JSON.int) ?? .null, "eventId": .int(d.eventId),
            "decision": .string(d.kind), "reason": d.reason.map(JSON.string) ?? .null, "msgId": d.msgId.map(JSON.string) ?? .null,
        ]
    }

    // MARK: Evaluator

    /// One turn of the evaluator (the periodic job, every `DataLimits.jobIntervalMs`): bounded
    /// work — at most `AutomationLimits.eventsPerTurn` index rows read and
    /// `AutomationLimits.duePerTurn` journeys sent.
    func runAutomation() {
        guard let a = automation else { return }
        let now = System.wallClockMs()
        if !a.metricsRegistered {
            a.metricsRegistered = true
            console.metricSources.append { [weak a] m in
                guard let a else { return }
                m.single(
                    "pylon_backend_automation_backlog", .gauge, "Event index rows the automation evaluator has not read yet.",
                    Double(a.backlog))
                m.single(
                    "pylon_backend_automation_journeys_total", .counter, "Automation journeys started by this instance.", Double(a.journeys)
                )
                m.single("pylon_backend_automation_sent_total", .counter, "Automation pushes sent by this instance.", Double(a.sent))
                m.single(
                    "pylon_backend_automation_suppressed_total", .counter, "Automation journeys this instance ended without a send.",
                    Double(a.suppressed))
                m.single(
                    "pylon_backend_automation_budget_deferred_total", .counter,
                    "Automation sends this instance put off to the next second by a send budget.", Double(a.deferredByBudget))
            }
        }
        do throws(StoreError) {
            if !a.stepColumnChecked {
                try store.ensureAutomationStepColumn()
                a.stepColumnChecked = true
            }
            try loadActiveRules(a)
            let newest = try store.lastEventID()
            a.settle.note(newestId: newest, now: now)
            if let upTo = a.settle.limit(now: now) {
                if let n = try evaluate(a, upTo: upTo, now: now) { a.evaluated += n }
                a.backlog = max(0, newest - (try store.automationCursor() ?? newest))
            }
            try fireDue(a, now: now)
            try runSegmentSends(a, now: now)
        } catch {
            log.warn("automation: turn failed", ["error": error.description])
        }
    }

    private func loadActiveRules(_ a: AutomationState) throws(StoreError) {
        let rows = try store.automationRules(status: "active", after: 0, limit: AutomationLimits.maxRules)
        var active: [(id: Int64, version: Int64, createdMs: Int64, rule: AutomationRule)] = []
        for r in rows {
            if let d = a.definitions[r.id], d.version == r.version {
                active.append((r.id, r.version, r.createdMs, d.rule))
                continue
            }
            guard let j = try? JSON.parse(r.definition), let rule = try? AutomationRule.parse(j) else {
                log.warn("automation: a stored rule does not parse", ["rule": r.id, "version": r.version])
                continue
            }
            a.definitions[r.id] = (r.version, rule)
            active.append((r.id, r.version, r.createdMs, rule))
        }
        a.active = active
        // Definitions of rules no longer active are read from the store when a journey needs one.
        let ids = Set(active.map(\.id))
        a.definitions = a.definitions.filter { ids.contains($0.key) }
    }

    /// The rule of a journey (its version), from the cache or the store.
    private func journeyRule(_ a: AutomationState, _ j: Store.JourneyRow) throws(StoreError) -> AutomationRule? {
        if let d = a.definitions[j.ruleId], d.version == j.version { return d.rule }
        guard let text = try store.automationRuleDefinition(j.ruleId, version: j.version), let json = try? JSON.parse(text) else {
            return nil
        }
        return try? AutomationRule.parse(json)
    }

    private func evaluate(_ a: AutomationState, upTo: Int64, now: Int64) throws(StoreError) -> Int? {
        let rules = a.active
        let apps = Array(Set(rules.map(\.rule.appKey))).sorted()
        return try store.evaluateAutomation(apps: apps, upTo: upTo, now: now) { rows, lastEntry throws(StoreError) in
            var turn = Store.AutomationTurn()
            // The audiences' definitions, read once per turn (nil: the segment is gone).
            var segments: [Int64: Segment?] = [:]
            // Entries decided in this turn (not stored yet), per rule and user.
            var entered: [String: Int64] = [:]
            for row in rows {
                if turn.journeys.count >= AutomationLimits.journeysPerTurn {
                    break
                }
                let data = (try? JSON.parse(row.data, maxDepth: Limits.maxJSONDepth + 1)) ?? .null
                let properties = data["properties"] ?? .object([:])
                for r in rules where r.rule.appKey == row.appKey && row.receivedMs >= r.createdMs {
                    guard !row.euid.isEmpty, r.rule.matches(event: row.event, properties: properties) else { continue }
                    if let id = r.rule.audience {
                        if segments[id] == nil {
                            let def = try store.automationObject(.segment, id).flatMap { try? JSON.parse($0.definition) }
                            segments[id] = def.flatMap { try? Segment.parse($0) }
                        }
                        guard let seg = segments[id] ?? nil, try store.segmentHas(seg, euid: row.euid, now: now) else {
                            turn.refusals.append((r.id, r.version, row, "audience"))
                            continue
                        }
                    }
                    let key = String(r.id) + "\u{1}" + row.euid
                    var last = entered[key]
                    if last == nil { last = try lastEntry(r.id, row.appKey, row.euid) }
                    guard r.rule.mayEnter(lastEntryMs: last, now: now) else {
                        turn.refusals.append((r.id, r.version, row, "reentry"))
                        continue
                    }
                    entered[key] = now
                    turn.journeys.append(
                        Store.NewJourney(
                            ruleId: r.id, version: r.version, appKey: row.appKey, euid: row.euid,
                            entryKey: r.rule.entryKey(triggerKey: String(row.streamId) + ":" + row.recordId), eventId: row.id,
                            installId: row.installId, properties: properties.serialized, dueMs: now + r.rule.leadingWaitSeconds * 1000,
                            transactional: r.rule.guards.transactional, waits: r.rule.leadingWaitSeconds > 0,
                            step: r.rule.leadingWaitSeconds > 0 ? 1 : 0))
                }
                if turn.journeys.count >= AutomationLimits.journeysPerTurn { turn.stoppedAfter = row.id }
            }
            a.journeys += turn.journeys.count
            return turn
        }
    }

    /// Sends the due journeys, within the global and per-rule budgets of this second.
    private func fireDue(_ a: AutomationState, now: Int64) throws(StoreError) {
        let budget = min(AutomationLimits.duePerTurn, a.global.available(now: now))
        guard budget > 0 else { return }
        let due = try store.claimDueJourneys(now: now, limit: budget)
        for j in due {
            guard let rule = try journeyRule(a, j) else {
                try store.suppressJourney(j, reason: "rule_missing", now: now)
                continue
            }
            var j = j
            if j.state != "sending" {
                // The steps up to the next wait, send or end.
                let (branches, next) = try runSteps(j, rule, now: now)
                for b in branches {
                    try store.recordDecision(
                        rule: j.ruleId, version: j.version, appKey: j.appKey, euid: j.euid, journey: j.id, event: j.eventId,
                        kind: "branch", reason: b, msgId: nil, now: now)
                }
                switch next {
                case .wait(let until, let step, let reason):
                    try store.postponeJourney(j, untilMs: until, step: step, reason: reason, log: true, now: now)
                    continue
                case .exit(let reason):
                    try store.suppressJourney(j, reason: reason, kind: "exited", now: now)
                    continue
                case .send(let step): j.step = step
                }
                var ruleBudget = a.perRule[j.ruleId] ?? AutomationBudget(perSecond: AutomationLimits.ruleSendsPerSecond)
                if ruleBudget.available(now: now) == 0 {
                    a.deferredByBudget += 1
                    try store.postponeJourney(j, untilMs: now - now % 1000 + 1000, reason: "budget", log: false, now: now)
                    continue
                }
                let lock = Store.lockKey("automation", j.appKey, j.euid)
                let outcome = try store.transaction(locking: [lock]) { () throws(StoreError) -> AutomationGuard.Outcome in
                    let offset = try userOffsetMinutes(a, rule, appKey: j.appKey, euid: j.euid, now: now)
                    let facts = try store.journeyFacts(j, rule: rule, offsetMinutes: offset, now: now)
                    let outcome = AutomationGuard.decide(rule, facts)
                    switch outcome {
                    case .send: try store.reserveJourney(j, step: j.step, now: now)
                    case .suppress(let reason): try store.suppressJourney(j, reason: reason, now: now)
                    case .later(let until, let reason):
                        try store.postponeJourney(j, untilMs: until, reason: reason, log: reason == "quiet_hours", now: now)
                    }
                    return outcome
                }
                guard outcome == .send else {
                    if case .suppress = outcome { a.suppressed += 1 }
                    continue
                }
                ruleBudget.spend(1, now: now)
                a.perRule[j.ruleId] = ruleBudget
            }
            a.global.spend(1, now: now)
            try send(a, j, rule, now: now)
        }
    }

    /// The filters of the decision and journey lists: `?rule=&user=&appKey=&limit=&cursor=`.
    private func journeyFilter(_ request: HTTPRequest) throws(APIError) -> (
        rule: Int64?, user: String?, appKey: String?, before: Int64, limit: Int
    ) {
        let q = request.query
        let limit = try pageLimit(q, max: AutomationLimits.maxPage, default: 50)
        var rule: Int64?
        if let s = nonEmpty(q["rule"]) {
            guard let n = Int64(s), n > 0 else { throw .badRequest(.invalidRequest, "rule must be a rule id") }
            rule = n
        }
        if let a = nonEmpty(q["appKey"]), let why = Router.invalidAppKey(a) { throw .badRequest(.invalidRequest, why) }
        return (rule, nonEmpty(q["user"]), nonEmpty(q["appKey"]), try cursorInt(q) ?? .max, limit)
    }
}
