/// The console's data routes (events, live tail, analytics, users, erasure, privacy, retention,
/// push history): one `Endpoint.data` case, matched here so the main table stays short.
enum DataRoute: Equatable {
    /// `GET /v1/admin/events`.
    case events
    /// `GET /v1/admin/events/tail` (Server-Sent Events).
    case eventsTail
    /// `GET /v1/admin/analytics/{appKey}/{counts|top-events|uniques|funnel}`.
    case analytics(appKey: String, AnalyticsKind)
    /// `GET /v1/admin/users`, `GET /v1/admin/users/{appKey}/{euid}`.
    case users, user(appKey: String, euid: String)
    /// `POST|GET /v1/admin/erasures`, `GET /v1/admin/erasures/{id}`.
    case createErasure, erasures, erasure(id: String)
    /// `GET /v1/admin/optouts`.
    case optouts
    /// `GET|PUT /v1/admin/apps/{appKey}/settings`.
    case appSettings(appKey: String), setAppSettings(appKey: String)
    /// `GET|PUT /v1/admin/retention`.
    case retention, setRetention
    /// `GET /v1/admin/push/messages[/{id}]`, `GET /v1/admin/push/why`.
    case pushMessages, pushMessage(id: String), pushWhy
    /// `POST /v1/admin/push/schedule`, `GET /v1/admin/push/scheduled`,
    /// `DELETE /v1/admin/push/scheduled/{id}`.
    case schedulePush, scheduledPushes, cancelScheduled(id: String)
    /// `/v1/admin/automation/...` (`Router+Automation.swift`).
    case automation(AutomationRoute)

    enum AnalyticsKind: String, Equatable {
        case counts, topEvents = "top-events", uniques, funnel
    }

    /// A change (admin only); every other data route is a read (viewer).
    var isChange: Bool {
        switch self {
        case .createErasure, .setAppSettings, .setRetention, .schedulePush, .cancelScheduled: true
        default: false
        }
    }
}

extension Router {
    /// The data route for `segs` (decoded path segments), or nil when the path is not one.
    static func matchData(method: String, _ segs: [String]) -> Match? {
        guard segs.count >= 3, segs[0] == "v1", segs[1] == "admin" else { return nil }
        func pick(_ table: [(String, DataRoute)]) -> Match {
            if let e = table.first(where: { $0.0 == method }) { return .endpoint(.data(e.1)) }
            return .methodNotAllowed(allowed: table.map(\.0))
        }
        func name(_ s: String, _ what: String, _ table: [(String, DataRoute)]) -> Match {
            if let why = invalidName(s, what: what) { return .badParameter(why) }
            return pick(table)
        }
        func app(_ s: String, _ table: [(String, DataRoute)]) -> Match {
            if let why = invalidAppKey(s) { return .badParameter(why) }
            return pick(table)
        }
        let rest = Array(segs.dropFirst(2))
        if let m = matchAutomation(method: method, rest) { return m }
        switch rest.count {
        case 1 where rest[0] == "events": return pick([("GET", .events)])
        case 2 where rest == ["events", "tail"]: return pick([("GET", .eventsTail)])
        case 3 where rest[0] == "analytics":
            guard let kind = DataRoute.AnalyticsKind(rawValue: rest[2]) else { return .notFound }
            return app(rest[1], [("GET", .analytics(appKey: rest[1], kind))])
        case 1 where rest[0] == "users": return pick([("GET", .users)])
        case 3 where rest[0] == "users":
            if let why = invalidName(rest[2], what: "euid") { return .badParameter(why) }
            return app(rest[1], [("GET", .user(appKey: rest[1], euid: rest[2]))])
        case 1 where rest[0] == "erasures": return pick([("GET", .erasures), ("POST", .createErasure)])
        case 2 where rest[0] == "erasures": return name(rest[1], "erasure id", [("GET", .erasure(id: rest[1]))])
        case 1 where rest[0] == "optouts": return pick([("GET", .optouts)])
        case 3 where rest[0] == "apps" && rest[2] == "settings":
            return app(rest[1], [("GET", .appSettings(appKey: rest[1])), ("PUT", .setAppSettings(appKey: rest[1]))])
        case 1 where rest[0] == "retention": return pick([("GET", .retention), ("PUT", .setRetention)])
        case 2 where rest == ["push", "messages"]: return pick([("GET", .pushMessages)])
        case 3 where rest[0] == "push" && rest[1] == "messages":
            return name(rest[2], "message id", [("GET", .pushMessage(id: rest[2]))])
        case 2 where rest == ["push", "why"]: return pick([("GET", .pushWhy)])
        case 2 where rest == ["push", "schedule"]: return pick([("POST", .schedulePush)])
        case 2 where rest == ["push", "scheduled"]: return pick([("GET", .scheduledPushes)])
        case 3 where rest[0] == "push" && rest[1] == "scheduled":
            return name(rest[2], "scheduled send id", [("DELETE", .cancelScheduled(id: rest[2]))])
        default: return nil
        }
    }
}
