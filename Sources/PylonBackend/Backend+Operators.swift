import PylonCore

/// Operator accounts (`/v1/admin/operators`: passwords hashed off the loop, `hashOffLoop`) and
/// the audit log every change is written to (`GET /v1/admin/audit`).
extension Backend {
    func operatorList(_ request: HTTPRequest) throws(APIError) -> HTTPResponse {
        let (limit, cursor) = try page(request)
        let rows = try storage { () throws(StoreError) in try store.operators(after: cursor ?? "", limit: limit) }
        return Backend.list(rows.map(Backend.operatorJSON), limit: limit, lastKey: rows.last?.name)
    }

    static func operatorJSON(_ o: Store.OperatorRow) -> JSON {
        [
            "name": .string(o.name), "role": .string(o.role.rawValue), "createdMs": .int(o.createdMs),
            "lastLoginMs": o.lastLoginMs.map { .int($0) } ?? .null,
        ]
    }

    private func role(_ j: JSON?) throws(APIError) -> Role? {
        guard let j else { return nil }
        guard let s = j.stringValue, let r = Role(rawValue: s) else { throw .badRequest(.invalidRequest, "role must be viewer or admin") }
        return r
    }

    private static func checkPassword(_ pw: String) throws(APIError) {
        guard (SessionLimits.minPasswordBytes...SessionLimits.maxPasswordBytes).contains(pw.utf8.count) else {
            throw .badRequest(
                .invalidRequest, "password must be \(SessionLimits.minPasswordBytes) to \(SessionLimits.maxPasswordBytes) bytes")
        }
    }

    /// `POST /v1/admin/operators` `{"name","role","password"}`: 201, or 409 when the name is taken.
    func createOperator(_ request: HTTPRequest, _ principal: Principal) throws(APIError) -> Disposition {
        let body = try jsonBody(request)
        guard let name = body["name"]?.stringValue, SessionLimits.validName(name) else {
            throw .badRequest(.invalidRequest, "name must be \(Router.operatorNameRule)")
        }
        guard name != SessionLimits.tokenName else {
            throw .badRequest(.invalidRequest, "\(name) is the operator token's name and cannot be an account")
        }
        guard let role = try role(body["role"]) else { throw .badRequest(.invalidRequest, "role (viewer or admin) is required") }
        guard let pw = body["password"]?.stringValue else { throw .badRequest(.invalidRequest, "password is required") }
        try Backend.checkPassword(pw)
        let answer = DeferredAnswer()
        let bytes = Array(pw.utf8)
        try hashOffLoop({ PasswordHash.make(bytes) }) { [unowned self] hash in
            do throws(APIError) {
                guard let hash else { throw APIError(status: 500, code: .storage, message: "password hashing failed") }
                let now = System.wallClockMs()
                guard try storage({ () throws(StoreError) in try store.createOperator(name, role: role, hash: hash, now: now) }) else {
                    throw APIError(status: 409, code: .conflict, message: "operator \(name) exists")
                }
                audit(principal, "operator.create", target: name, detail: ["role": .string(role.rawValue)])
                let row = Store.OperatorRow(name: name, role: role, createdMs: now, lastLoginMs: nil)
                answer.answer(consoleAnswer(request, HTTPResponse(status: 201, Backend.operatorJSON(row))))
            } catch {
                answer.answer(consoleAnswer(request, HTTPResponse(error)))
            }
        }
        return .later(answer)
    }

    /// `PATCH /v1/admin/operators/{name}` `{"role"?}` (a password is `consoleLater`'s).
    func updateOperator(_ request: HTTPRequest, _ name: String, _ principal: Principal) throws(APIError) -> HTTPResponse {
        guard let role = try role(try jsonBody(request)["role"]) else {
            throw .badRequest(.invalidRequest, "role and/or password is required")
        }
        try applyUpdate(name, role: role, hash: nil, principal)
        return HTTPResponse(["name": .string(name), "role": .string(role.rawValue)])
    }

    func updateOperator(_ request: HTTPRequest, _ name: String, password: String, _ principal: Principal) throws(APIError)
        -> Disposition
    {
        let role = try role(try jsonBody(request)["role"])
        try Backend.checkPassword(password)
        let answer = DeferredAnswer()
        let bytes = Array(password.utf8)
        try hashOffLoop({ PasswordHash.make(bytes) }) { [unowned self] hash in
            do throws(APIError) {
                guard let hash else { throw APIError(status: 500, code: .storage, message: "password hashing failed") }
                try applyUpdate(name, role: role, hash: hash, principal)
                var o: JSONObject = ["name": .string(name), "passwordChanged": true]
                if let role { o["role"] = .string(role.rawValue) }
                answer.answer(consoleAnswer(request, HTTPResponse(.object(o))))
            } catch {
                answer.answer(consoleAnswer(request, HTTPResponse(error)))
            }
        }
        return .later(answer)
    }

    private func applyUpdate(_ name: String, role: Role?, hash: String?, _ principal: Principal) throws(APIError) {
        guard try storage({ () throws(StoreError) in try store.updateOperator(name, role: role, hash: hash) }) else {
            throw APIError(status: 404, code: .notFound, message: "no operator \(name)")
        }
        var d: JSONObject = ["passwordChanged": .bool(hash != nil)]
        if let role { d["role"] = .string(role.rawValue) }
        audit(principal, "operator.update", target: name, detail: .object(d))
    }

    /// `DELETE /v1/admin/operators/{name}`: 204 (its sessions end), or 404.
    func deleteOperator(_ name: String, _ principal: Principal) throws(APIError) -> HTTPResponse {
        guard try storage({ () throws(StoreError) in try store.deleteOperator(name) }) else {
            throw APIError(status: 404, code: .notFound, message: "no operator \(name)")
        }
        audit(principal, "operator.delete", target: name)
        return HTTPResponse(status: 204, contentType: "application/json", bytes: [])
    }

    // MARK: Audit log

    /// Writes an audit entry for `principal` (failures are logged: the change is made).
    func audit(_ principal: Principal, _ action: String, target: String, detail: JSON = .null) {
        console.audited = true
        var text = detail.serialized
        if text.utf8.count > ConsoleLimits.maxAuditDetailBytes { text = #"{"truncated":true}"# }
        do throws(StoreError) {
            try store.appendAudit(timeMs: System.wallClockMs(), actor: principal.actor, action: action, target: target, detail: text)
        } catch {
            log.error("cannot write the audit log", ["action": action, "target": target, "error": error.description])
        }
    }

    /// `GET /v1/admin/audit?actor=&action=`: newest first.
    func auditList(_ request: HTTPRequest) throws(APIError) -> HTTPResponse {
        let (limit, cursor) = try page(request)
        var before = Int64.max
        if let c = cursor {
            guard let n = Int64(c) else { throw .badRequest(.invalidRequest, "cursor is not one this backend gave out") }
            before = n
        }
        let q = request.query
        let rows = try storage { () throws(StoreError) in
            try store.audit(
                actor: q["actor"].flatMap { $0.isEmpty ? nil : $0 }, action: q["action"].flatMap { $0.isEmpty ? nil : $0 },
                before: before, limit: limit)
        }
        let items: [JSON] = rows.map {
            [
                "id": .int($0.id), "timeMs": .int($0.timeMs), "actor": .string($0.actor), "action": .string($0.action),
                "target": .string($0.target), "detail": (try? JSON.parse($0.detail, maxDepth: Limits.maxJSONDepth + 1)) ?? .null,
            ]
        }
        return Backend.list(items, limit: limit, lastKey: rows.last.map { String($0.id) })
    }

    /// The audit action of a change made through an endpoint that does not write its own.
    static func auditAction(_ request: HTTPRequest, _ e: Endpoint) -> String {
        switch e {
        case .pushSend: return "push.send"
        case .gtmPublish: return "gtm.publish"
        case .reset: return "reset"
        case .maSetApp: return "ma.app.set"
        case .maSetMetadata: return "ma.metadata.set"
        case .setFaults: return "faults.set"
        case .clearFaults: return "faults.clear"
        case .data(let r):
            let d = String(describing: r)
            return "data." + (d.split(separator: "(").first.map(String.init) ?? d)
        default: return request.method.lowercased() + " " + String(request.path)
        }
    }
}
