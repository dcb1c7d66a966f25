import PylonCore
import PylonProtocol

/// A marketing-automation rule (docs/AUTOMATION.md): a trigger (an event of an AppKey by name,
/// with conditions on its properties), a re-entry rule, steps (waits, branches, sends, exits;
/// `AutomationSteps.swift`), an exit event, and the guards a send passes (caps, quiet hours, a
/// rate limit). A value type: parsed and validated from the API's JSON (`parse`), written back
/// (`json`), and matched against an event (`matches`) without I/O.
struct AutomationRule: Equatable {
    /// A property operator of a trigger condition.
    enum Op: String, CaseIterable {
        case equals, isIn = "in", range, exists, prefix
    }

    /// One condition on a property of the trigger event (`properties.<property>`).
    struct Condition: Equatable {
        var property: String
        var op: Op
        /// `equals` (any scalar), `prefix` (a string).
        var value: JSON = .null
        /// `in`: the accepted scalars.
        var values: [JSON] = []
        /// `range`: at least one bound.
        var gt: Double?
        var gte: Double?
        var lt: Double?
        var lte: Double?

        func holds(_ properties: JSON) -> Bool {
            let v = properties[property]
            switch op {
            case .exists: return v != nil && v != .null
            case .equals: return v.map { AutomationRule.same($0, value) } ?? false
            case .isIn: return v.map { x in values.contains { AutomationRule.same(x, $0) } } ?? false
            case .prefix:
                guard let s = v?.stringValue, let p = value.stringValue else { return false }
                return s.hasPrefix(p)
            case .range:
                guard let d = v?.doubleValue else { return false }
                if let b = gt, !(d > b) { return false }
                if let b = gte, !(d >= b) { return false }
                if let b = lt, !(d < b) { return false }
                if let b = lte, !(d <= b) { return false }
                return true
            }
        }

        var json: JSON {
            var o: JSONObject = ["property": .string(property), "op": .string(op.rawValue)]
            switch op {
            case .equals, .prefix: o["value"] = value
            case .isIn: o["values"] = .array(values)
            case .range:
                for (k, b) in [("gt", gt), ("gte", gte), ("lt", lt), ("lte", lte)] { if let b { o[k] = AutomationRule.number(b) } }
            case .exists: break
            }
            return .object(o)
        }
    }

    /// When a user may enter the rule again.
    enum Reentry: Equatable {
        /// Once ever per user.
        case once
        /// Again only when the last entry is at least this many days old.
        case perDays(Int64)
        /// On every matching event.
        case every
    }

    /// The push a journey sends: `title`, `body` and every `data` value are templates
    /// (`AutomationTemplate`).
    struct Push: Equatable {
        var appId: String
        var title: String
        var body: String
        var data: JSONObject = [:]
    }

    /// Quiet hours, in minutes of the day at the rule's UTC offset: `start` inclusive, `end`
    /// exclusive; `start > end` spans midnight. `deferSend`: a send due inside is moved to the
    /// window's end; otherwise it is dropped.
    struct QuietHours: Equatable {
        var start: Int
        var end: Int
        var deferSend: Bool
    }

    struct Guards: Equatable {
        /// At most this many non-transactional automation pushes per user and calendar day
        /// (at `utcOffsetMinutes`), and per rolling 7 days; nil: no cap.
        var capPerDay: Int?
        var capPer7Days: Int?
        var quietHours: QuietHours?
        /// This rule's sends per minute at most (a send over it waits for the next minute).
        var sendsPerMinute = AutomationLimits.defaultSendsPerMinute
        /// Exempt from caps and quiet hours (an order confirmation), never from consent.
        var transactional = false
        /// The offset of the users' time zone from UTC, in minutes (calendar days, quiet hours,
        /// a wait until a time of day) for a user whose profile names no time zone.
        var utcOffsetMinutes = 0
        /// The profile property that holds the user's time zone (`AutomationTimeZone`).
        var timeZoneProperty = AutomationLimits.defaultTimeZoneProperty
    }

    var name: String
    var appKey: String
    var event: String
    var conditions: [Condition] = []
    var reentry: Reentry = .once
    /// The steps, run from the first (`AutomationSteps.swift`), and their ids (nil: none).
    var steps: [Step] = []
    var stepIds: [String?] = []
    /// An event that ends the user's journeys of this rule.
    var exitOn: ExitOn?
    /// The segment a user must be in when the trigger is evaluated (`"audience": {"segment": ID}`).
    var audience: Int64?
    var guards = Guards()

    /// Whether an event of this rule's AppKey named `event` with `properties` triggers it.
    func matches(event name: String, properties: JSON) -> Bool {
        name == event && conditions.allSatisfy { $0.holds(properties) }
    }

    /// The journey's uniqueness key for a trigger (`triggerKey`: the event's stream and record
    /// id): a once-ever rule has one journey per user, the others one per trigger event.
    func entryKey(triggerKey: String) -> String {
        reentry == .once ? "once" : triggerKey
    }

    /// Whether a user whose last entry was at `lastEntryMs` (nil: never) may enter at `now`.
    func mayEnter(lastEntryMs: Int64?, now: Int64) -> Bool {
        guard let last = lastEntryMs else { return true }
        switch reentry {
        case .once: return false
        case .every: return true
        case .perDays(let d): return now - last >= d * 86_400_000
        }
    }

    // MARK: JSON

    var json: JSON {
        var trigger: JSONObject = ["event": .string(event)]
        trigger["conditions"] = .array(conditions.map(\.json))
        let re: JSON
        switch reentry {
        case .once: re = ["mode": "once"]
        case .every: re = ["mode": "every"]
        case .perDays(let d): re = ["mode": "perDays", "days": .int(d)]
        }
        var g: JSONObject = [
            "sendsPerMinute": .int(Int64(guards.sendsPerMinute)), "transactional": .bool(guards.transactional),
            "utcOffsetMinutes": .int(Int64(guards.utcOffsetMinutes)),
        ]
        if guards.timeZoneProperty != AutomationLimits.defaultTimeZoneProperty {
            g["timeZoneProperty"] = .string(guards.timeZoneProperty)
        }
        if let c = guards.capPerDay { g["capPerDay"] = .int(Int64(c)) }
        if let c = guards.capPer7Days { g["capPer7Days"] = .int(Int64(c)) }
        if let q = guards.quietHours {
            g["quietHours"] = [
                "start": .string(AutomationRule.clock(q.start)), "end": .string(AutomationRule.clock(q.end)),
                "mode": .string(q.deferSend ? "defer" : "drop"),
            ]
        }
        var o: JSONObject = [
            "name": .string(name), "appKey": .string(appKey), "trigger": .object(trigger), "reentry": re, "steps": stepsJSON,
            "guards": .object(g),
        ]
        if let x = exitJSON { o["exit"] = x }
        if let a = audience { o["audience"] = ["segment": .int(a)] }
        return .object(o)
    }

    /// Parses and validates a rule definition; every refusal names the field and what it takes.
    static func parse(_ j: JSON) throws(AutomationError) -> AutomationRule {
        guard let o = j.objectValue else { throw AutomationError("", "a rule must be a JSON object") }
        try only(o, ["name", "appKey", "trigger", "reentry", "steps", "exit", "audience", "guards"], at: "")
        let name = try string(o["name"], "name", max: AutomationLimits.maxNameBytes)
        let appKey = try string(o["appKey"], "appKey", max: AppKey.maxBytes)
        guard AppKey.isValid(appKey) else { throw AutomationError("appKey", "must be \(AppKey.rule)") }
        guard let t = o["trigger"]?.objectValue else {
            throw AutomationError("trigger", "is required: {\"event\": NAME, \"conditions\": [...]}")
        }
        try only(t, ["event", "conditions"], at: "trigger")
        let event = try string(t["event"], "trigger.event", max: EventIndex.maxFieldBytes)
        let conditions = try conditions(t["conditions"], at: "trigger.conditions")
        var rule = AutomationRule(name: name, appKey: appKey, event: event, conditions: conditions)
        rule.reentry = try reentry(o["reentry"])
        try parseSteps(o["steps"], into: &rule)
        rule.exitOn = try parseExit(o["exit"])
        if let a = o["audience"], !a.isNull {
            guard let ao = a.objectValue else { throw AutomationError("audience", "must be {\"segment\": ID}") }
            try only(ao, ["segment"], at: "audience")
            guard let id = ao["segment"]?.intValue, id > 0 else { throw AutomationError("audience.segment", "must be a segment id") }
            rule.audience = id
        }
        rule.guards = try guards(o["guards"])
        return rule
    }

    static func condition(_ j: JSON, at path: String) throws(AutomationError) -> Condition {
        guard let o = j.objectValue else { throw AutomationError(path, "must be an object {\"property\", \"op\", ...}") }
        let property = try string(o["property"], path + ".property", max: AutomationLimits.maxPropertyBytes)
        guard let opName = o["op"]?.stringValue else {
            throw AutomationError(path + ".op", "is required: one of \(Op.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        guard let op = Op(rawValue: opName) else {
            throw AutomationError(
                path + ".op", "unknown operator \"\(opName)\" (one of \(Op.allCases.map(\.rawValue).joined(separator: ", ")))")
        }
        var c = Condition(property: property, op: op)
        switch op {
        case .exists: try only(o, ["property", "op"], at: path)
        case .equals:
            try only(o, ["property", "op", "value"], at: path)
            guard let v = o["value"], isScalar(v) else {
                throw AutomationError(path + ".value", "equals needs a string, number or boolean value")
            }
            c.value = v
        case .prefix:
            try only(o, ["property", "op", "value"], at: path)
            guard let v = o["value"], let s = v.stringValue, !s.isEmpty else {
                throw AutomationError(path + ".value", "prefix needs a non-empty string value")
            }
            c.value = .string(s)
        case .isIn:
            try only(o, ["property", "op", "values"], at: path)
            guard let vs = o["values"]?.arrayValue, !vs.isEmpty, vs.count <= AutomationLimits.maxInValues, vs.allSatisfy(isScalar) else {
                throw AutomationError(path + ".values", "in needs 1 to \(AutomationLimits.maxInValues) string, number or boolean values")
            }
            c.values = vs
        case .range:
            try only(o, ["property", "op", "gt", "gte", "lt", "lte"], at: path)
            func bound(_ k: String) throws(AutomationError) -> Double? {
                guard let v = o[k], !v.isNull else { return nil }
                guard let d = v.doubleValue, d.isFinite else { throw AutomationError(path + "." + k, "must be a number") }
                return d
            }
            c.gt = try bound("gt")
            c.gte = try bound("gte")
            c.lt = try bound("lt")
            c.lte = try bound("lte")
            guard c.gt != nil || c.gte != nil || c.lt != nil || c.lte != nil else {
                throw AutomationError(path, "range needs at least one of gt, gte, lt, lte")
            }
        }
        return c
    }

    private static func reentry(_ j: JSON?) throws(AutomationError) -> Reentry {
        guard let j, !j.isNull else { return .once }
        guard let o = j.objectValue, let mode = o["mode"]?.stringValue else {
            throw AutomationError("reentry", "must be {\"mode\": \"once\" | \"every\" | \"perDays\", \"days\": N}")
        }
        switch mode {
        case "once":
            try only(o, ["mode"], at: "reentry")
            return .once
        case "every":
            try only(o, ["mode"], at: "reentry")
            return .every
        case "perDays":
            try only(o, ["mode", "days"], at: "reentry")
            guard let d = o["days"]?.intValue, (1...AutomationLimits.maxReentryDays).contains(d) else {
                throw AutomationError("reentry.days", "perDays needs days, an integer in 1...\(AutomationLimits.maxReentryDays)")
            }
            return .perDays(d)
        default:
            throw AutomationError("reentry.mode", "unknown mode \"\(mode)\" (once, every, perDays)")
        }
    }

    static func push(_ j: JSON?, at path: String) throws(AutomationError) -> Push {
        guard let o = j?.objectValue else { throw AutomationError(path, "is required: {\"appId\", \"title\", \"body\", \"data\"?}") }
        try only(o, ["appId", "title", "body", "data"], at: path)
        let at = { (k: String) in path.isEmpty ? k : path + "." + k }
        let appId = try string(o["appId"], at("appId"), max: Backend.PushLimits.maxIdBytes)
        guard Router.invalidName(appId, what: "appId") == nil else { throw AutomationError(at("appId"), "contains control characters") }
        let title = try template(o["title"], at("title"), max: Backend.PushLimits.maxTitleBytes)
        let body = try template(o["body"], at("body"), max: Backend.PushLimits.maxContentBytes)
        var data: JSONObject = [:]
        if let d = o["data"], !d.isNull {
            guard let m = d.objectValue, m.count <= Backend.PushLimits.maxExtendedParams else {
                throw AutomationError(at("data"), "must be an object of at most \(Backend.PushLimits.maxExtendedParams) strings")
            }
            for (k, v) in m {
                data[k] = .string(try template(v, at("data." + k), max: AutomationLimits.maxDataValueBytes))
            }
        }
        return Push(appId: appId, title: title, body: body, data: data)
    }

    static func template(_ j: JSON?, _ path: String, max: Int) throws(AutomationError) -> String {
        guard let s = j?.stringValue else { throw AutomationError(path, "is required: a string (a template)") }
        guard s.utf8.count <= max else { throw AutomationError(path, "exceeds \(max) bytes") }
        if let why = AutomationTemplate.invalid(s) { throw AutomationError(path, why) }
        return s
    }

    private static func guards(_ j: JSON?) throws(AutomationError) -> Guards {
        var g = Guards()
        guard let j, !j.isNull else { return g }
        guard let o = j.objectValue else { throw AutomationError("guards", "must be an object") }
        try only(
            o, ["capPerDay", "capPer7Days", "quietHours", "sendsPerMinute", "transactional", "utcOffsetMinutes", "timeZoneProperty"],
            at: "guards")
        if let t = o["timeZoneProperty"], !t.isNull {
            g.timeZoneProperty = try string(t, "guards.timeZoneProperty", max: AutomationLimits.maxPropertyBytes)
        }
        func int(_ k: String, _ r: ClosedRange<Int64>) throws(AutomationError) -> Int? {
            guard let v = o[k], !v.isNull else { return nil }
            guard let n = v.intValue, r.contains(n) else {
                throw AutomationError("guards." + k, "must be an integer in \(r.lowerBound)...\(r.upperBound)")
            }
            return Int(n)
        }
        g.capPerDay = try int("capPerDay", 1...AutomationLimits.maxCap)
        g.capPer7Days = try int("capPer7Days", 1...AutomationLimits.maxCap)
        g.sendsPerMinute = try int("sendsPerMinute", 1...AutomationLimits.maxSendsPerMinute) ?? g.sendsPerMinute
        g.utcOffsetMinutes = try int("utcOffsetMinutes", -14 * 60...14 * 60) ?? 0
        if let t = o["transactional"], !t.isNull {
            guard let b = t.boolValue else { throw AutomationError("guards.transactional", "must be a boolean") }
            g.transactional = b
        }
        if let q = o["quietHours"], !q.isNull {
            guard let qo = q.objectValue else {
                throw AutomationError(
                    "guards.quietHours", "must be {\"start\": \"HH:MM\", \"end\": \"HH:MM\", \"mode\": \"drop\" | \"defer\"}")
            }
            try only(qo, ["start", "end", "mode"], at: "guards.quietHours")
            guard let s = qo["start"]?.stringValue.flatMap(minutes) else {
                throw AutomationError("guards.quietHours.start", "must be a time HH:MM")
            }
            guard let e = qo["end"]?.stringValue.flatMap(minutes) else {
                throw AutomationError("guards.quietHours.end", "must be a time HH:MM")
            }
            guard s != e else { throw AutomationError("guards.quietHours", "start and end must differ") }
            let mode = qo["mode"]?.stringValue ?? "defer"
            guard mode == "defer" || mode == "drop" else { throw AutomationError("guards.quietHours.mode", "must be drop or defer") }
            g.quietHours = QuietHours(start: s, end: e, deferSend: mode == "defer")
        }
        return g
    }

    // MARK: Helpers

    /// Refuses members of `o` not in `known` (a misspelt field is an error, not ignored).
    static func only(_ o: JSONObject, _ known: Set<String>, at path: String) throws(AutomationError) {
        for k in o.keys where !known.contains(k) {
            throw AutomationError(path.isEmpty ? k : path + "." + k, "unknown field (expected \(known.sorted().joined(separator: ", ")))")
        }
    }

    static func string(_ j: JSON?, _ path: String, max: Int) throws(AutomationError) -> String {
        guard let j, !j.isNull else { throw AutomationError(path, "is required") }
        guard let s = j.stringValue, !s.isEmpty, s.utf8.count <= max,
            !s.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F })
        else { throw AutomationError(path, "must be a string of 1 to \(max) bytes without control characters") }
        return s
    }

    private static func isScalar(_ j: JSON) -> Bool {
        switch j {
        case .string, .int, .double, .bool: true
        default: false
        }
    }

    /// Equality of scalars, numbers by value (`100` equals `100.0`).
    static func same(_ a: JSON, _ b: JSON) -> Bool {
        if let x = a.doubleValue, let y = b.doubleValue { return x == y }
        return a == b
    }

    static func number(_ d: Double) -> JSON {
        d == d.rounded() && abs(d) < 9.0e15 ? .int(Int64(d)) : .double(d)
    }

    /// "HH:MM" → minutes of the day.
    static func minutes(_ s: String) -> Int? {
        let parts = s.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 2, parts[0].count == 2, parts[1].count == 2, let h = Int(parts[0]), let m = Int(parts[1]),
            (0..<24).contains(h), (0..<60).contains(m)
        else { return nil }
        return h * 60 + m
    }

    static func clock(_ minutes: Int) -> String {
        let h = minutes / 60, m = minutes % 60
        return (h < 10 ? "0" : "") + String(h) + ":" + (m < 10 ? "0" : "") + String(m)
    }
}

/// A refused rule definition: the field (a JSON path such as `trigger.conditions[0].op`) and why.
struct AutomationError: Error, Equatable, CustomStringConvertible {
    var field: String
    var message: String

    init(_ field: String, _ message: String) {
        self.field = field
        self.message = message
    }

    var description: String { field.isEmpty ? message : field + ": " + message }
}

/// Automation limits (named; answered with a clear 400 when a definition exceeds one).
enum AutomationLimits {
    static let maxNameBytes = 200
    static let maxConditions = 20
    static let maxInValues = 100
    static let maxPropertyBytes = 256
    static let maxDataValueBytes = 1024
    static let maxReentryDays: Int64 = 3650
    static let maxWaitSeconds: Int64 = 90 * 86_400
    /// Steps of a rule at most, and the bytes of a step's id.
    static let maxSteps = 20
    static let maxStepIdBytes = 64
    /// The profile property holding a user's time zone unless a rule names another.
    static let defaultTimeZoneProperty = "timezone"
    /// Zone files kept parsed at most (there are about 600 IANA names).
    static let maxCachedZones = 1000
    /// Events read after a trigger at most, for a branch's or an exit's "did EVENT".
    static let eventsSinceRead = 200
    static let maxCap: Int64 = 1000
    static let defaultSendsPerMinute = 600
    static let maxSendsPerMinute: Int64 = 60_000
    /// Templates and segments at most.
    static let maxTemplates = 1000
    static let maxSegments = 500
    /// A segment's event-history condition: at most this many events, over at most this many days.
    static let maxSegmentCount: Int64 = 100_000
    static let maxSegmentDays: Int64 = 3650
    /// Users a segment's size reads at most (a size over it is answered as a lower bound,
    /// `complete: false`), in pages of `segmentScanPage`: each page is one statement, which
    /// evaluates an event-history condition's `GROUP BY` once, so pages are large (measured:
    /// 100,000 users, 1 M events, a profile and an event-history condition: 7.3 s in pages of
    /// 1,000, docs/AUTOMATION.md).
    static let segmentScanUsers = 200_000
    static let segmentScanPage = 20_000
    /// Members of a one-off send to a segment at most (a larger segment is refused: narrow it).
    static let maxSendMembers = 10_000
    /// Members of one-off sends sent per loop turn at most (after the journeys' sends).
    static let sendMembersPerTurn = 64
    /// A dry run replays the trigger events of this window, at most this many of them.
    static let dryRunWindowMs: Int64 = 86_400_000
    static let dryRunEvents = 5000
    /// Rules that are not archived, at most (every one is matched against every event).
    static let maxRules = 200
    /// Event index rows the evaluator reads per loop turn at most (bounded batches).
    static let eventsPerTurn = 500
    /// Ids of the event index the evaluator advances over per loop turn at most.
    static let scanIdsPerTurn: Int64 = 5000
    /// Journeys the evaluator starts per loop turn at most (each is a few statements).
    static let journeysPerTurn = 200
    /// Due journeys claimed per loop turn at most.
    static let duePerTurn = 64
    /// Sends per second on this instance at most, all rules together (the global budget)…
    static let globalSendsPerSecond = 200
    /// …and per rule.
    static let ruleSendsPerSecond = 50
    /// A journey claimed by an instance that did not finish it (killed) is claimed again after
    /// this long; the push's dedup key makes the second send answer the first one's message.
    static let reclaimAfterMs: Int64 = 30_000
    /// A send the broker refused (not connected) is tried again after this long.
    static let retryAfterMs: Int64 = 2000
    /// PostgreSQL: the evaluator reads only index rows whose id was the newest at least this long
    /// ago, so an ingest transaction that took an earlier id and commits a little later is not
    /// passed over (ids are taken at insert, not at commit).
    static let settleMs: Int64 = 1000
    /// Decisions per page at most.
    static let maxPage = 500
}
