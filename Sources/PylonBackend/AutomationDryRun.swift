import PylonCore

/// A dry run of a rule over past trigger events (docs/AUTOMATION.md "Dry run"): which events
/// would start a journey, for how many users, and how many sends the guards would stop, without
/// storing or sending anything. Pure: the events and each user's facts come in; the store reads
/// them (`Backend.automationDryRun`).
enum AutomationDryRun {
    struct Event: Equatable {
        var euid: String
        var receivedMs: Int64
        var properties: JSON
    }

    /// What the guards read about a user (as of now).
    struct User: Equatable {
        var member = true
        var consentDenied = false
        var reachable = true
        /// The user's UTC offset in minutes.
        var offsetMinutes = 0
        /// The rule's last entry for the user before the window (nil: none).
        var lastEntryMs: Int64?
        /// Times of automation pushes already sent to the user (caps count them).
        var sentMs: [Int64] = []
    }

    struct Result: Equatable {
        var events = 0
        var matched = 0
        var triggered = 0
        var users = 0
        var wouldSend = 0
        var deferred = 0
        var suppressed: [String: Int] = [:]

        var json: JSON {
            var s: JSONObject = [:]
            for (k, v) in suppressed.sorted(by: { $0.key < $1.key }) { s[k] = .int(Int64(v)) }
            return [
                "events": .int(Int64(events)), "matched": .int(Int64(matched)), "triggered": .int(Int64(triggered)),
                "users": .int(Int64(users)), "wouldSend": .int(Int64(wouldSend)), "deferred": .int(Int64(deferred)),
                "suppressed": .object(s),
            ]
        }
    }

    /// Replays `events` (oldest first) through the rule's trigger, audience, re-entry and guards,
    /// as if each journey reached its send after the leading wait (branches and later waits are
    /// not replayed). Caps count the pushes already sent plus the replay's own.
    static func run(_ rule: AutomationRule, events: [Event], user: (String) -> User) -> Result {
        var r = Result()
        var users: [String: User] = [:]
        var entered: Set<String> = []
        r.events = events.count
        for e in events {
            guard !e.euid.isEmpty, rule.matches(event: rule.event, properties: e.properties) else { continue }
            r.matched += 1
            var u = users[e.euid] ?? user(e.euid)
            defer { users[e.euid] = u }
            guard u.member else {
                r.suppressed["audience", default: 0] += 1
                continue
            }
            guard rule.mayEnter(lastEntryMs: u.lastEntryMs, now: e.receivedMs) else {
                r.suppressed["reentry", default: 0] += 1
                continue
            }
            u.lastEntryMs = e.receivedMs
            r.triggered += 1
            entered.insert(e.euid)
            let t = e.receivedMs + rule.leadingWaitSeconds * 1000
            if u.consentDenied {
                r.suppressed["consent", default: 0] += 1
                continue
            }
            guard u.reachable else {
                r.suppressed["no_binding", default: 0] += 1
                continue
            }
            let g = rule.guards
            var at = t
            if !g.transactional {
                if let q = g.quietHours, let end = AutomationGuard.quietEnd(t, q, offsetMinutes: u.offsetMinutes) {
                    guard q.deferSend else {
                        r.suppressed["quiet_hours", default: 0] += 1
                        continue
                    }
                    r.deferred += 1
                    at = end
                }
                let dayStart = AutomationGuard.dayStart(at, offsetMinutes: u.offsetMinutes)
                if let c = g.capPerDay, u.sentMs.filter({ $0 >= dayStart && $0 <= at }).count >= c {
                    r.suppressed["cap", default: 0] += 1
                    continue
                }
                if let c = g.capPer7Days, u.sentMs.filter({ $0 > at - 7 * 86_400_000 && $0 <= at }).count >= c {
                    r.suppressed["cap", default: 0] += 1
                    continue
                }
                u.sentMs.append(at)
            }
            r.wouldSend += 1
        }
        r.users = entered.count
        return r
    }
}
