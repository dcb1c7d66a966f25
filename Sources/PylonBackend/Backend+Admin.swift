import PylonCore

/// The console's operator routes: accounts, the audit log, the dashboard, devices, apps and
/// streams (containers: `Backend+Containers.swift`). Every list is paged by an opaque cursor
/// (`?cursor=`, from the previous page's `nextCursor`) over an indexed key, `?limit=` 1 to
/// `ConsoleLimits.maxPage` (default `defaultPage`).
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

    // MARK: Operators

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

    private func updateOperator(_ request: HTTPRequest, _ name: String, password: String, _ principal: Principal) throws(APIError)
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

    // MARK: Dashboard

    static func dayStart(_ ms: Int64) -> Int64 { ms - ms % 86_400_000 }

    /// `YYYY-MM-DD` of a day number since 1970-01-01 (civil from days, proleptic Gregorian).
    static func isoDay(_ days: Int64) -> String {
        let z = days + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let doe = z - era * 146_097
        let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let d = doy - (153 * mp + 2) / 5 + 1
        let m = mp < 10 ? mp + 3 : mp - 9
        let y = yoe + era * 400 + (m <= 2 ? 1 : 0)
        return "\(y)-\(String(m).leftPad(2))-\(String(d).leftPad(2))"
    }

    /// Push deliveries published, acknowledged by the app (delivered) and opened since `since`.
    func pushFunnel(since: Int64) throws(StoreError) -> (sent: Int64, delivered: Int64, opened: Int64) {
        (
            try store.consoleScalar("SELECT count(*) FROM push_deliveries WHERE published_at >= ?", [.int(since)]),
            try store.consoleScalar("SELECT count(*) FROM push_deliveries WHERE acked_at >= ?", [.int(since)]),
            try store.consoleScalar(
                """
                SELECT CAST(coalesce(sum(accepted), 0) AS BIGINT) FROM batches
                WHERE stream = (SELECT id FROM streams WHERE name = 'push.opens') AND received_at >= ?
                """, [.int(since)])
        )
    }

    /// `GET /v1/admin/dashboard`. Events are counted from the batches' `accepted` by the time
    /// the backend received them (so with `--nats` too); ingest errors and refusals are this
    /// instance's since midnight UTC.
    func dashboard() throws(APIError) -> HTTPResponse {
        let now = System.wallClockMs()
        let day = Backend.dayStart(now)
        let minute = now / 60_000
        let firstMinute = (minute - 59) * 60_000
        let firstDay = day / 86_400_000 - 29
        return try storage { () throws(StoreError) -> HTTPResponse in
            let registered = try store.consoleScalar("SELECT count(*) FROM devices")
            let sum = "SELECT CAST(coalesce(sum(accepted), 0) AS BIGINT) FROM batches WHERE received_at >= ?"
            let lastMinute = try store.consoleScalar(sum, [.int(now - 60_000)])
            let today = try store.consoleScalar(sum, [.int(day)])
            let push = try pushFunnel(since: day)
            var perMinute = [Int64](repeating: 0, count: 60)
            for r in try store.consoleQuery(
                "SELECT received_at / 60000, CAST(sum(accepted) AS BIGINT) FROM batches WHERE received_at >= ? GROUP BY 1",
                [.int(firstMinute)])
            {
                let i = Int((r[0].int ?? 0) - firstMinute / 60_000)
                if (0..<60).contains(i) { perMinute[i] += r[1].int ?? 0 }
            }
            var perDay = [Int64](repeating: 0, count: 30)
            var pushesPerDay = [Int64](repeating: 0, count: 30)
            for r in try store.consoleQuery(
                "SELECT received_at / 86400000, CAST(sum(accepted) AS BIGINT) FROM batches WHERE received_at >= ? GROUP BY 1",
                [.int(firstDay * 86_400_000)])
            {
                let i = Int((r[0].int ?? 0) - firstDay)
                if (0..<30).contains(i) { perDay[i] += r[1].int ?? 0 }
            }
            for r in try store.consoleQuery(
                "SELECT published_at / 86400000, count(*) FROM push_deliveries WHERE published_at >= ? GROUP BY 1",
                [.int(firstDay * 86_400_000)])
            {
                let i = Int((r[0].int ?? 0) - firstDay)
                if (0..<30).contains(i) { pushesPerDay[i] += r[1].int ?? 0 }
            }
            let instances = try store.instances(
                since: now - ConsoleLimits.forgetInstanceMs, forgetBefore: now - ConsoleLimits.forgetInstanceMs)
            let (refusedToday, errorsToday) = console.metrics.today(now: now)
            return HTTPResponse([
                // The broker does not tell the backend who is connected: null, not a guess.
                "devices": ["registered": .int(registered), "connected": .null],
                "events": ["perSecond": .double(Double(lastMinute) / 60), "today": .int(today)],
                "push": ["sentToday": .int(push.sent), "deliveredToday": .int(push.delivered), "openedToday": .int(push.opened)],
                "ingest": ["errorsToday": .int(Int64(errorsToday)), "refusedBatchesToday": .int(Int64(refusedToday))],
                "instances": .array(
                    instances.map {
                        [
                            "id": .string($0.id), "healthy": .bool(now - $0.lastSeenMs <= ConsoleLimits.instanceStaleMs),
                            "lastSeenMs": .int($0.lastSeenMs), "self": .bool($0.id == console.instanceId),
                        ]
                    }),
                "series": [
                    "lastHour": .array(
                        perMinute.enumerated().map { ["tMs": .int(firstMinute + Int64($0.offset) * 60_000), "events": .int($0.element)] }),
                    "last30Days": .array(
                        (0..<30).map {
                            [
                                "day": .string(Backend.isoDay(firstDay + Int64($0))), "events": .int(perDay[$0]),
                                "pushesSent": .int(pushesPerDay[$0]),
                            ]
                        }),
                ],
            ])
        }
    }

    // MARK: Devices

    /// `GET /v1/admin/devices?q=&appKey=`: by install id; `q` matches an install id prefix, a
    /// device id, or a bound user id exactly; `appKey` keeps devices with events of that AppKey.
    func deviceList(_ request: HTTPRequest) throws(APIError) -> HTTPResponse {
        let (limit, cursor) = try page(request)
        let q = request.query
        var sql = """
            SELECT d.install_id, d.device_id, s.last_seen_at FROM devices d LEFT JOIN device_seen s ON s.device_id = d.device_id
            WHERE d.install_id > ?
            """
        var binds: [SQLBind] = [.text(cursor ?? "")]
        if let term = q["q"], !term.isEmpty {
            sql += """
                 AND ((d.install_id >= ? AND d.install_id <= ?) OR d.device_id = ? OR d.install_id IN
                (SELECT pd.install_id FROM push_bindings b JOIN push_devices pd ON pd.token = b.token WHERE b.user_id = ?))
                """
            binds += [.text(term), .text(term + "\u{10FFFF}"), .text(term), .text(term)]
        }
        if let app = q["appKey"], !app.isEmpty {
            sql += " AND EXISTS (SELECT 1 FROM events e WHERE e.install_id = d.install_id AND e.app_key = ?)"
            binds.append(.text(app))
        }
        sql += " ORDER BY d.install_id LIMIT ?"
        binds.append(.int(Int64(limit)))
        let items = try storage { () throws(StoreError) -> [JSON] in
            try store.consoleQuery(sql, binds).map { r throws(StoreError) -> JSON in
                try deviceJSON(installId: r[0].text ?? "", deviceId: r[1].text ?? "", lastSeen: r[2].int)
            }
        }
        return Backend.list(items, limit: limit, lastKey: items.last?["installId"]?.stringValue)
    }

    private func deviceJSON(installId: String, deviceId: String, lastSeen: Int64?) throws(StoreError) -> JSON {
        let apps = try store.consoleQuery(
            "SELECT DISTINCT app_key FROM events WHERE install_id = ? AND app_key <> '' ORDER BY app_key", [.text(installId)])
        let users = try store.consoleQuery(
            """
            SELECT b.user_id FROM push_devices pd JOIN push_bindings b ON b.token = pd.token
            WHERE pd.install_id = ? AND pd.active = 1 ORDER BY b.user_id
            """, [.text(installId)])
        return [
            "installId": .string(installId), "deviceId": .string(deviceId), "appKeys": .array(apps.map { .string($0[0].text ?? "") }),
            "lastSeenMs": lastSeen.map { .int($0) } ?? .null, "connected": .null,
            "bindings": .array(users.map { ["userId": .string($0[0].text ?? "")] }),
        ]
    }

    /// `GET /v1/admin/devices/{installId}`: the list item, with the device's recent pushes and
    /// events and the consent switches it reported (stream `pylon.consent`, latest per switch).
    func deviceDetail(_ installId: String) throws(APIError) -> HTTPResponse {
        try storage { () throws(StoreError) -> HTTPResponse in
            guard
                let r = try store.consoleQuery(
                    """
                    SELECT d.install_id, d.device_id, s.last_seen_at FROM devices d LEFT JOIN device_seen s ON s.device_id = d.device_id
                    WHERE d.install_id = ?
                    """, [.text(installId)]
                ).first
            else { return HTTPResponse(APIError(status: 404, code: .notFound, message: "no device with install id \(installId)")) }
            guard case .object(var o) = try deviceJSON(installId: installId, deviceId: r[1].text ?? "", lastSeen: r[2].int) else {
                return HTTPResponse(.null)
            }
            let n = Int64(ConsoleLimits.deviceRecent)
            o["recentPushes"] = .array(
                try store.consoleQuery(
                    """
                    SELECT d.msg_id, s.app_id, d.published_at, d.puback_at, d.acked_at FROM push_devices pd
                    JOIN push_deliveries d ON d.token = pd.token LEFT JOIN push_sends s ON s.msg_id = d.msg_id
                    WHERE pd.install_id = ? ORDER BY d.published_at DESC LIMIT ?
                    """, [.text(installId), .int(n)]
                ).map {
                    [
                        "msgId": .string($0[0].text ?? ""), "appId": $0[1].text.map { .string($0) } ?? .null,
                        "publishedMs": .int($0[2].int ?? 0), "brokerAckMs": $0[3].int.map { .int($0) } ?? .null,
                        "deliveredMs": $0[4].int.map { .int($0) } ?? .null,
                    ]
                })
            // Newest events per AppKey of the device (each an index range), merged.
            var events: [(Int64, Int64, JSON)] = []
            for app in try store.consoleQuery("SELECT DISTINCT app_key FROM events WHERE install_id = ?", [.text(installId)]) {
                for e in try store.consoleQuery(
                    """
                    SELECT e.id, s.name, e.app_key, e.event, e.euid, e.time_ms FROM events e JOIN streams s ON s.id = e.stream
                    WHERE e.install_id = ? AND e.app_key = ? ORDER BY e.time_ms DESC LIMIT ?
                    """, [.text(installId), .text(app[0].text ?? ""), .int(n)])
                {
                    let j: JSON = [
                        "id": .int(e[0].int ?? 0), "stream": .string(e[1].text ?? ""), "appKey": .string(e[2].text ?? ""),
                        "event": .string(e[3].text ?? ""), "euid": .string(e[4].text ?? ""), "timeMs": .int(e[5].int ?? 0),
                    ]
                    events.append((e[5].int ?? 0, e[0].int ?? 0, j))
                }
            }
            events.sort { ($0.0, $0.1) > ($1.0, $1.1) }
            o["recentEvents"] = .array(events.prefix(ConsoleLimits.deviceRecent).map(\.2))
            var consent = JSONObject()
            for c in try store.consoleQuery(
                """
                SELECT coalesce(e.data, r.data), e.time_ms FROM events e JOIN streams s ON s.id = e.stream
                LEFT JOIN records r ON r.stream = e.stream AND r.id = e.record_id
                WHERE e.install_id = ? AND s.name = 'pylon.consent' ORDER BY e.time_ms
                """, [.text(installId)])
            {
                guard let d = try? JSON.parse(c[0].text ?? "null", maxDepth: Limits.maxJSONDepth + 1), let sw = d["switch"]?.stringValue
                else { continue }
                consent[sw] = ["granted": d["granted"] ?? .null, "timeMs": .int(c[1].int ?? 0)]
            }
            o["consent"] = .object(consent)
            return HTTPResponse(.object(o))
        }
    }

    // MARK: Apps and streams

    /// `GET /v1/admin/apps?q=`: every AppKey (starting with `q`) with settings, users or events. The distinct keys of
    /// `events` and `ma_users` are read by skipping from one key to the next in their indexes
    /// (one probe per AppKey, not a scan of every event). `events` counts the records accepted
    /// on stream `ma.<appKey>` (from the batches, as the dashboard does: received, whatever
    /// retention or erasure removed since); `lastEventMs` is the newest indexed event's time.
    func appList(_ request: HTTPRequest) throws(APIError) -> HTTPResponse {
        let (limit, cursor) = try page(request)
        let items = try storage { () throws(StoreError) -> [JSON] in
            let keys = try store.consoleQuery(
                """
                WITH RECURSIVE e(k) AS (
                    SELECT min(app_key) FROM events WHERE app_key > ?1
                    UNION ALL SELECT (SELECT min(app_key) FROM events WHERE app_key > e.k) FROM e WHERE e.k IS NOT NULL
                ), u(k) AS (
                    SELECT min(app_key) FROM ma_users WHERE app_key > ?1
                    UNION ALL SELECT (SELECT min(app_key) FROM ma_users WHERE app_key > u.k) FROM u WHERE u.k IS NOT NULL
                )
                SELECT k FROM (SELECT k FROM e UNION SELECT k FROM u UNION SELECT app_key FROM ma_apps WHERE app_key > ?1) a
                WHERE k IS NOT NULL AND k >= ?3 AND k <= ?4 ORDER BY k LIMIT ?2
                """, [.text(cursor ?? ""), .int(Int64(limit)), Backend.prefix(request).low, Backend.prefix(request).high])
            return try keys.map { r throws(StoreError) -> JSON in
                let k = r[0].text ?? ""
                let events = try store.consoleScalar(
                    "SELECT CAST(coalesce(sum(accepted), 0) AS BIGINT) FROM batches WHERE stream = (SELECT id FROM streams WHERE name = ?)",
                    [.text("ma." + k)])
                let last = try store.consoleQuery("SELECT max(time_ms) FROM events WHERE app_key = ?", [.text(k)]).first?.first?.int
                return [
                    "appKey": .string(k), "events": .int(events),
                    "users": .int(try store.consoleScalar("SELECT count(*) FROM ma_users WHERE app_key = ?", [.text(k)])),
                    "lastEventMs": last.map { .int($0) } ?? .null,
                ]
            }
        }
        return Backend.list(items, limit: limit, lastKey: items.last?["appKey"]?.stringValue)
    }

    /// `GET /v1/admin/streams?q=`: each stream (whose name starts with `q`): its accepted records (with `--nats` too) and last batch.
    func streamList(_ request: HTTPRequest) throws(APIError) -> HTTPResponse {
        let (limit, cursor) = try page(request)
        let items = try storage { () throws(StoreError) -> [JSON] in
            try store.consoleQuery(
                "SELECT id, name FROM streams WHERE name > ? AND name >= ? AND name <= ? ORDER BY name LIMIT ?",
                [.text(cursor ?? ""), Backend.prefix(request).low, Backend.prefix(request).high, .int(Int64(limit))]
            )
            .map { r throws(StoreError) -> JSON in
                let s = try store.consoleQuery(
                    "SELECT CAST(coalesce(sum(accepted), 0) AS BIGINT), max(received_at) FROM batches WHERE stream = ?",
                    [.int(r[0].int ?? 0)]
                ).first
                return ["stream": .string(r[1].text ?? ""), "records": .int(s?[0].int ?? 0), "lastMs": s?[1].int.map { .int($0) } ?? .null]
            }
        }
        return Backend.list(items, limit: limit, lastKey: items.last?["stream"]?.stringValue)
    }
}
