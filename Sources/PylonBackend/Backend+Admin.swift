import PylonCore

/// The console's routes, dispatched (`Router+Console.swift`; handlers in `Backend+Session`,
/// `+Operators`, `+Dashboard`, `+Fleet`, `+Containers`, `+Console`, `Metrics`), and the paging
/// every list shares: an opaque cursor (`?cursor=`, from the previous page's `nextCursor`) over
/// an indexed key, `?limit=` 1 to `ConsoleLimits.maxPage` (default `defaultPage`).
extension Backend {
    /// Runs a console route; nil for the routes answered later (`consoleLater`).
    func consoleRoute(_ request: HTTPRequest, _ r: ConsoleRoute, _ principal: Principal) throws(APIError) -> HTTPResponse {
        switch r {
        case .file(let path): return try staticFile(request, path)
        case .session: return try sessionInfo(request)
        case .logout: return try logout(request)
        case .metrics: return try metricsResponse()
        case .operators: return try operatorList(request)
        case .updateOperator(let name): return try updateOperator(request, name, principal)
        case .deleteOperator(let name): return try deleteOperator(name, principal)
        case .audit: return try auditList(request)
        case .dashboard: return try dashboard()
        case .devices: return try deviceList(request)
        case .device(let id): return try deviceDetail(id)
        case .apps: return try appList(request)
        case .streams: return try streamList(request)
        case .containers: return try containerList(request)
        case .containerVersions(let id): return try containerVersions(request, id)
        case .containerVersion(let id, let v): return try containerVersion(id, v)
        case .rollback(let id): return try rollback(request, id, principal)
        case .login, .createOperator: throw .notFound(request.path)  // answered by consoleLater
        }
    }

    /// The console routes answered after a password hash on the thread pool, or nil.
    func consoleLater(_ request: HTTPRequest, _ r: ConsoleRoute, _ principal: Principal) throws(APIError) -> Disposition? {
        switch r {
        case .login: return try login(request)
        case .createOperator: return try createOperator(request, principal)
        case .updateOperator(let name):
            guard case .string(let pw)? = try jsonBody(request)["password"] else { return nil }
            return try updateOperator(request, name, password: pw, principal)
        default: return nil
        }
    }

    // MARK: Paging

    /// `?limit=` and the decoded `?cursor=` (nil on the first page).
    func page(_ request: HTTPRequest) throws(APIError) -> (limit: Int, cursor: String?) {
        let q = request.query
        var limit = ConsoleLimits.defaultPage
        if let l = q["limit"] {
            guard let n = Int(l), (1...ConsoleLimits.maxPage).contains(n) else {
                throw .badRequest(.invalidRequest, "limit must be an integer in 1...\(ConsoleLimits.maxPage)")
            }
            limit = n
        }
        guard let c = q["cursor"], !c.isEmpty else { return (limit, nil) }
        guard c.utf8.count <= ConsoleLimits.maxCursorBytes * 2, let key = Backend.unhex(c) else {
            throw .badRequest(.invalidRequest, "cursor is not one this backend gave out")
        }
        return (limit, key)
    }

    /// The bounds of the names starting with `?q=` (every name without one): `name >= low AND
    /// name <= high` is an index range, since no UTF-8 text starting with `q` sorts after `q`
    /// followed by U+10FFFF.
    static func prefix(_ request: HTTPRequest) -> (low: SQLBind, high: SQLBind) {
        guard let q = request.query["q"], !q.isEmpty else { return (.text(""), .text("\u{10FFFF}")) }
        return (.text(q), .text(q + "\u{10FFFF}"))
    }

    /// A list answer: `items`, and `nextCursor` (the last item's key) when the page is full.
    static func list(_ items: [JSON], limit: Int, lastKey: String?) -> HTTPResponse {
        let next: JSON = items.count == limit ? lastKey.map { .string(hex($0)) } ?? .null : .null
        return HTTPResponse(["items": .array(items), "nextCursor": next])
    }

    static func hex(_ s: String) -> String { s.utf8.map { String($0, radix: 16).leftPad(2) }.joined() }

    static func unhex(_ s: String) -> String? {
        let u = Array(s.utf8)
        guard u.count % 2 == 0 else { return nil }
        var out: [UInt8] = []
        var i = 0
        while i < u.count {
            guard let b = UInt8(String(decoding: u[i..<(i + 2)], as: UTF8.self), radix: 16) else { return nil }
            out.append(b)
            i += 2
        }
        return String(validating: out, as: UTF8.self)
    }
}
