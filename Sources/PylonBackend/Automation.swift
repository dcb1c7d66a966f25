import PylonCore

/// Templates of an automation push: `{{event.price}}` (a property of the trigger event),
/// `{{profile.name}}` (a profile property of the user), a dotted path for nested objects
/// (`{{event.item.sku}}`), and a fallback after `|` for a missing or null value
/// (`{{profile.name|there}}`). A value renders as its text: a string as is, a number in JSON
/// form, a boolean as `true`/`false`, an object or array as JSON; missing without a fallback
/// renders as nothing.
enum AutomationTemplate {
    /// Why `s` is not a valid template, or nil.
    static func invalid(_ s: String) -> String? {
        var rest = s[...]
        while let open = rest.range(of: "{{") {
            guard let close = rest[open.upperBound...].range(of: "}}") else { return "a {{ is not closed by }}" }
            let inner = rest[open.upperBound..<close.lowerBound]
            let (path, _) = split(inner)
            let parts = path.split(separator: ".", omittingEmptySubsequences: false)
            guard parts.count >= 2, parts[0] == "event" || parts[0] == "profile", parts.dropFirst().allSatisfy({ !$0.isEmpty }) else {
                return "{{\(inner)}}: a placeholder is {{event.NAME}} or {{profile.NAME}}, with an optional |fallback"
            }
            rest = rest[close.upperBound...]
        }
        return nil
    }

    /// `s` with every placeholder replaced (`s` was validated by `invalid`).
    static func render(_ s: String, event: JSON, profile: JSON) -> String {
        var out = ""
        var rest = s[...]
        while let open = rest.range(of: "{{"), let close = rest[open.upperBound...].range(of: "}}") {
            out += rest[..<open.lowerBound]
            let (path, fallback) = split(rest[open.upperBound..<close.lowerBound])
            let parts = path.split(separator: ".").map(String.init)
            var v: JSON? = parts.first == "event" ? event : profile
            for p in parts.dropFirst() { v = v?[p] }
            if let v, !v.isNull {
                out += text(v)
            } else {
                out += fallback ?? ""
            }
            rest = rest[close.upperBound...]
        }
        out += rest
        return out
    }

    private static func split(_ inner: Substring) -> (Substring, String?) {
        guard let bar = inner.firstIndex(of: "|") else { return (trim(inner), nil) }
        return (trim(inner[..<bar]), String(inner[inner.index(after: bar)...]))
    }

    private static func trim(_ s: Substring) -> Substring {
        var s = s
        while s.first == " " { s = s.dropFirst() }
        while s.last == " " { s = s.dropLast() }
        return s
    }

    static func text(_ v: JSON) -> String {
        switch v {
        case .string(let s): return s
        case .bool(let b): return b ? "true" : "false"
        case .null: return ""
        default: return v.serialized
        }
    }

    /// `s` cut to at most `max` UTF-8 bytes on a character boundary.
    static func cut(_ s: String, _ max: Int) -> String {
        guard s.utf8.count > max else { return s }
        var out = ""
        for c in s {
            if out.utf8.count + c.utf8.count > max { break }
            out.append(c)
        }
        return out
    }
}

/// What the guards decide for a journey whose send is due, from the facts the store read
/// (`Facts`) and the rule. Pure: the clock is `facts.now`.
enum AutomationGuard {
    struct Facts: Equatable {
        var now: Int64
        /// The rule's current status (`active`, `paused`, `archived`).
        var ruleStatus: String
        /// The user reported an opt-out (MA switch of the AppKey, or the device's master or
        /// push switch) or was erased.
        var consentDenied: Bool
        /// The user id the push is addressed to (the user's `user_id` identity), and how many
        /// active devices it is bound to.
        var userId: String?
        var devices: Int
        /// Non-transactional automation pushes the user got since the start of the calendar day
        /// (at the rule's offset), and in the last 7 days.
        var sentToday: Int
        var sent7Days: Int
        /// This rule's sends in the last minute.
        var ruleSentLastMinute: Int
        /// The user's UTC offset in minutes now (`AutomationTimeZone`; nil: the rule's).
        var offsetMinutes: Int? = nil
    }

    enum Outcome: Equatable {
        case send
        /// Not now: moved to `untilMs` (quiet hours deferred, or the rule's rate limit).
        case later(untilMs: Int64, reason: String)
        /// Never: the journey ends with this reason.
        case suppress(String)
    }

    static func decide(_ rule: AutomationRule, _ f: Facts) -> Outcome {
        if f.ruleStatus != "active" { return .suppress("paused") }
        if f.consentDenied { return .suppress("consent") }
        guard let u = f.userId, !u.isEmpty, f.devices > 0 else { return .suppress("no_binding") }
        let g = rule.guards
        if !g.transactional {
            if let q = g.quietHours, let end = quietEnd(f.now, q, offsetMinutes: f.offsetMinutes ?? g.utcOffsetMinutes) {
                return q.deferSend ? .later(untilMs: end, reason: "quiet_hours") : .suppress("quiet_hours")
            }
            if let c = g.capPerDay, f.sentToday >= c { return .suppress("cap") }
            if let c = g.capPer7Days, f.sent7Days >= c { return .suppress("cap") }
        }
        if f.ruleSentLastMinute >= g.sendsPerMinute {
            return .later(untilMs: f.now + 1000, reason: "rate_limit")
        }
        return .send
    }

    /// The start of the calendar day containing `now` at `offsetMinutes`, in UTC milliseconds.
    static func dayStart(_ now: Int64, offsetMinutes: Int) -> Int64 {
        let off = Int64(offsetMinutes) * 60_000
        let local = now + off
        let day = local - ((local % 86_400_000) + 86_400_000) % 86_400_000
        return day - off
    }

    /// When `now` is inside the quiet hours, the end of that window (UTC ms); else nil.
    static func quietEnd(_ now: Int64, _ q: AutomationRule.QuietHours, offsetMinutes: Int) -> Int64? {
        let start = dayStart(now, offsetMinutes: offsetMinutes)
        let minute = Int((now - start) / 60_000)
        let endToday = start + Int64(q.end) * 60_000
        if q.start < q.end {
            return minute >= q.start && minute < q.end ? endToday : nil
        }
        // Spans midnight: [start, 24:00) ends tomorrow at `end`; [00:00, end) ends today.
        if minute >= q.start { return endToday + 86_400_000 }
        if minute < q.end { return endToday }
        return nil
    }
}

/// A send budget per second: `take` answers how many of `want` sends may go in the second of
/// `now` (the global budget and one per rule on this instance).
struct AutomationBudget: Equatable {
    var perSecond: Int
    private(set) var second: Int64 = -1
    private(set) var used = 0

    init(perSecond: Int) { self.perSecond = perSecond }

    func available(now: Int64) -> Int {
        now / 1000 == second ? max(0, perSecond - used) : perSecond
    }

    mutating func spend(_ n: Int, now: Int64) {
        if now / 1000 != second {
            second = now / 1000
            used = 0
        }
        used += n
    }
}

/// How far the evaluator may read the event index. On SQLite an index row is visible in id
/// order (one writer): the newest id. On PostgreSQL ids are taken at insert and rows become
/// visible at commit, so the evaluator reads only up to the newest id seen at least
/// `AutomationLimits.settleMs` ago (`limit`), from samples taken each turn (`note`).
struct AutomationSettle: Equatable {
    var settleMs: Int64
    /// (time, newest id), oldest first; at most `maxSamples`.
    private(set) var samples: [(Int64, Int64)] = []
    static let maxSamples = 64

    init(settleMs: Int64) { self.settleMs = settleMs }

    static func == (a: AutomationSettle, b: AutomationSettle) -> Bool {
        a.settleMs == b.settleMs && a.samples.elementsEqual(b.samples) { $0 == $1 }
    }

    mutating func note(newestId: Int64, now: Int64) {
        samples.append((now, newestId))
        // Keep the newest sample old enough and everything after it.
        if let i = samples.lastIndex(where: { now - $0.0 >= settleMs }), i > 0 { samples.removeFirst(i) }
        if samples.count > AutomationSettle.maxSamples { samples.removeFirst(samples.count - AutomationSettle.maxSamples) }
    }

    /// The highest id the evaluator may read at `now` (nil: none yet).
    func limit(now: Int64) -> Int64? {
        if settleMs <= 0 { return samples.last?.1 }
        return samples.last(where: { now - $0.0 >= settleMs })?.1
    }
}
