/// The automation routes under `/v1/admin/automation` (`Backend+Automation.swift`), one
/// `DataRoute.automation` case.
enum AutomationRoute: Equatable {
    /// `GET|POST /v1/admin/automation/rules`.
    case rules, createRule
    /// `GET|PUT /v1/admin/automation/rules/{id}`.
    case rule(Int64), updateRule(Int64)
    /// `POST /v1/admin/automation/rules/{id}/{pause|resume|archive}`.
    case setStatus(Int64, String)
    /// `GET /v1/admin/automation/rules/{id}/funnel`.
    case funnel(Int64)
    /// `GET /v1/admin/automation/decisions`.
    case decisions
    /// `GET|POST /v1/admin/automation/templates`, `GET|PUT /v1/admin/automation/templates/{id}`.
    case templates, createTemplate, template(Int64), updateTemplate(Int64)
    /// `GET|POST /v1/admin/automation/segments`, `GET|PUT .../segments/{id}`,
    /// `GET .../segments/{id}/size`, `GET .../segments/{id}/members`, `POST .../segments/{id}/send`.
    case segments, createSegment, segment(Int64), updateSegment(Int64), segmentSize(Int64), segmentMembers(Int64), segmentSend(Int64)
    /// `GET /v1/admin/automation/sends/{id}`: a one-off send's progress.
    case send(Int64)
    /// `POST /v1/admin/automation/dry-run`: a rule replayed over the last 24 h of events.
    case dryRun
    /// `GET /v1/admin/automation/journeys`: journeys newest first (a user's journey view).
    case journeys
}

extension Router {
    /// The automation route for `rest` (the segments after `/v1/admin`), or nil.
    static func matchAutomation(method: String, _ rest: [String]) -> Match? {
        guard rest.first == "automation" else { return nil }
        func pick(_ table: [(String, AutomationRoute)]) -> Match {
            if let e = table.first(where: { $0.0 == method }) { return .endpoint(.data(.automation(e.1))) }
            return .methodNotAllowed(allowed: table.map(\.0))
        }
        func id(_ s: String) -> Int64? {
            guard let n = Int64(s), n > 0, String(n) == s else { return nil }
            return n
        }
        switch rest.count {
        case 2 where rest[1] == "rules": return pick([("GET", .rules), ("POST", .createRule)])
        case 2 where rest[1] == "decisions": return pick([("GET", .decisions)])
        case 2 where rest[1] == "dry-run": return pick([("POST", .dryRun)])
        case 2 where rest[1] == "journeys": return pick([("GET", .journeys)])
        case 2 where rest[1] == "templates": return pick([("GET", .templates), ("POST", .createTemplate)])
        case 3 where rest[1] == "templates":
            guard let n = id(rest[2]) else { return .badParameter("a template id is a positive integer") }
            return pick([("GET", .template(n)), ("PUT", .updateTemplate(n))])
        case 2 where rest[1] == "segments": return pick([("GET", .segments), ("POST", .createSegment)])
        case 3 where rest[1] == "segments":
            guard let n = id(rest[2]) else { return .badParameter("a segment id is a positive integer") }
            return pick([("GET", .segment(n)), ("PUT", .updateSegment(n))])
        case 4 where rest[1] == "segments":
            guard let n = id(rest[2]) else { return .badParameter("a segment id is a positive integer") }
            switch rest[3] {
            case "size": return pick([("GET", .segmentSize(n))])
            case "members": return pick([("GET", .segmentMembers(n))])
            case "send": return pick([("POST", .segmentSend(n))])
            default: return .notFound
            }
        case 3 where rest[1] == "sends":
            guard let n = id(rest[2]) else { return .badParameter("a send id is a positive integer") }
            return pick([("GET", .send(n))])
        case 3 where rest[1] == "rules":
            guard let n = id(rest[2]) else { return .badParameter("a rule id is a positive integer") }
            return pick([("GET", .rule(n)), ("PUT", .updateRule(n))])
        case 4 where rest[1] == "rules":
            guard let n = id(rest[2]) else { return .badParameter("a rule id is a positive integer") }
            switch rest[3] {
            case "pause", "resume", "archive": return pick([("POST", .setStatus(n, rest[3]))])
            case "funnel": return pick([("GET", .funnel(n))])
            default: return .notFound
            }
        default: return .notFound
        }
    }
}
