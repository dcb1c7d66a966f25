/// The console's own routes (static files, sessions, metrics, operators, audit, dashboard,
/// devices, apps, streams, containers): one `Endpoint.console` case, matched here so the main
/// table stays short.
enum ConsoleRoute: Equatable {
    /// `GET|HEAD /…` outside `/v1`, `/healthz` and `/metrics`: a file of `--console-dir`
    /// (`path` relative, "" for the index).
    case file(path: String)
    /// `POST /v1/session/login`, `GET /v1/session`, `POST /v1/session/logout`.
    case login, session, logout
    /// `GET /metrics` (Prometheus text).
    case metrics
    /// `GET|POST /v1/admin/operators`, `PATCH|DELETE /v1/admin/operators/{name}`.
    case operators, createOperator, updateOperator(name: String), deleteOperator(name: String)
    /// `GET /v1/admin/audit`.
    case audit
    /// `GET /v1/admin/dashboard`.
    case dashboard
    /// `GET /v1/admin/devices`, `GET /v1/admin/devices/{installId}`.
    case devices, device(installId: String)
    /// `GET /v1/admin/apps`, `GET /v1/admin/streams`.
    case apps, streams
    /// `GET /v1/admin/gtm/containers`, `GET /v1/admin/gtm/containers/{id}/versions[/{v}]`,
    /// `POST /v1/admin/gtm/containers/{id}/rollback`.
    case containers, containerVersions(id: String), containerVersion(id: String, version: Int64), rollback(id: String)

    var access: Access {
        switch self {
        case .file, .login, .session, .logout: .open
        case .metrics: .metrics
        default: .operator
        }
    }

    /// The audit action of a change.
    var auditAction: String? {
        switch self {
        case .createOperator: "operator.create"
        case .updateOperator: "operator.update"
        case .deleteOperator: "operator.delete"
        case .rollback: "gtm.rollback"
        default: nil
        }
    }
}

extension Router {
    /// The console route for `segs` (decoded path segments), or nil when the path is not one.
    static func matchConsole(method: String, _ segs: [String]) -> Match? {
        func pick(_ table: [(String, ConsoleRoute)]) -> Match {
            if let e = table.first(where: { $0.0 == method }) { return .endpoint(.console(e.1)) }
            return .methodNotAllowed(allowed: table.map(\.0))
        }
        guard let first = segs.first else { return nil }
        if first == "metrics" && segs.count == 1 { return pick([("GET", .metrics)]) }
        if first != "v1" && first != "healthz" && first != "metrics" {
            // Every method: the handler answers 404 without --console-dir, 405 for a change.
            return .endpoint(.console(.file(path: segs.joined(separator: "/"))))
        }
        guard segs.count >= 2, first == "v1" else { return nil }
        if segs[1] == "session" {
            switch segs.count {
            case 2: return pick([("GET", .session)])
            case 3 where segs[2] == "login": return pick([("POST", .login)])
            case 3 where segs[2] == "logout": return pick([("POST", .logout)])
            default: return .notFound
            }
        }
        guard segs.count >= 3, segs[1] == "admin" else { return nil }
        let rest = Array(segs.dropFirst(2))
        switch rest.count {
        case 1 where rest[0] == "operators": return pick([("GET", .operators), ("POST", .createOperator)])
        case 2 where rest[0] == "operators":
            guard SessionLimits.validName(rest[1]) else { return .badParameter("operator name must be \(Router.operatorNameRule)") }
            return pick([("PATCH", .updateOperator(name: rest[1])), ("DELETE", .deleteOperator(name: rest[1]))])
        case 1 where rest[0] == "audit": return pick([("GET", .audit)])
        case 1 where rest[0] == "dashboard": return pick([("GET", .dashboard)])
        case 1 where rest[0] == "devices": return pick([("GET", .devices)])
        case 2 where rest[0] == "devices":
            guard Backend.isValidInstallId(rest[1]) else { return .badParameter("installId must be 1 to 64 of [A-Za-z0-9._-]") }
            return pick([("GET", .device(installId: rest[1]))])
        case 1 where rest[0] == "apps": return pick([("GET", .apps)])
        case 1 where rest[0] == "streams": return pick([("GET", .streams)])
        case 2 where rest == ["gtm", "containers"]: return pick([("GET", .containers)])
        case 4 where rest[0] == "gtm" && rest[1] == "containers" && rest[3] == "rollback":
            if let why = invalidAppKey(rest[2]) { return .badParameter(why.replacingAll("appKey", with: "container id")) }
            return pick([("POST", .rollback(id: rest[2]))])
        case 5 where rest[0] == "gtm" && rest[1] == "containers" && rest[3] == "versions":
            if let why = invalidAppKey(rest[2]) { return .badParameter(why.replacingAll("appKey", with: "container id")) }
            guard let v = Int64(rest[4]), v > 0 else { return .badParameter("version must be a positive integer") }
            return pick([("GET", .containerVersion(id: rest[2], version: v))])
        default: return nil
        }
    }

    static let operatorNameRule = "1 to \(SessionLimits.maxNameBytes) of [A-Za-z0-9._@-]"
}
