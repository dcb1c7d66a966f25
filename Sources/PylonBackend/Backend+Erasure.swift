import PylonCore
import PylonProtocol
import PylonStore

/// Erasure requests (`POST /v1/admin/erasures`, `--erase-user`) and users
/// (`GET /v1/admin/users[/{appKey}/{euid}]`). The steps are `Store+Erasure.swift`'s.
extension Backend {
    /// `POST /v1/admin/erasures {"appKey", "euid"|"userId"}`: 200 when the user is erased
    /// before the answer, else 202 with `status` `pending` (the periodic job finishes it).
    func createErasure(_ request: HTTPRequest, _ principal: Principal) throws(APIError) -> HTTPResponse {
        let body = try jsonBody(request)
        guard let appKey = body["appKey"]?.stringValue, AppKey.isValid(appKey) else {
            throw .badRequest(.invalidRequest, "appKey must be \(AppKey.rule)")
        }
        let euidGiven = body["euid"]?.stringValue
        let userId = body["userId"]?.stringValue
        guard (euidGiven == nil) != (userId == nil) else { throw .badRequest(.invalidRequest, "give one of euid and userId") }
        for v in [euidGiven, userId].compactMap({ $0 }) {
            if let why = Router.invalidName(v, what: "euid or userId") { throw .badRequest(.invalidRequest, why) }
        }
        let now = System.wallClockMs()
        let id = try storage { () throws(StoreError) -> Int64 in
            var euid = euidGiven ?? ""
            if let userId {
                // An unknown user id still gets a request (kept, done at once): nothing to erase.
                euid = try store.maHolder(appKey, .userID, userId) ?? "unknown-user:" + userId
            }
            return try store.createErasure(appKey: appKey, euid: euid, actor: actorName(principal), now: now)
        }
        var done = false
        for _ in 0..<ErasureLimits.stepsInRequest where !done {
            done = try storage { () throws(StoreError) in try store.eraseStep(id, now: System.wallClockMs()) }
        }
        guard let row = try storage({ () throws(StoreError) in try store.erasure(id) }) else { throw .notFound(request.path) }
        recordChange(principal, "erase", target: "\(appKey)/\(row.subject)", detail: ["erasure": .string(String(id))])
        log.info("erasure", ["id": id, "appKey": appKey, "status": row.status])
        return HTTPResponse(status: row.status == "done" ? 200 : 202, row.json)
    }

    func erasureList(_ request: HTTPRequest) throws(APIError) -> HTTPResponse {
        let q = request.query
        let limit = try pageLimit(q)
        let before = try cursorInt(q) ?? Int64.max
        let status = nonEmpty(q["status"])
        let rows = try storage { () throws(StoreError) in try store.erasures(before: before, status: status, limit: limit) }
        return list(rows.map(\.json), next: rows.count == limit ? rows.last.map { String($0.id) } : nil)
    }

    func erasureDetail(_ request: HTTPRequest, id: String) throws(APIError) -> HTTPResponse {
        guard let n = Int64(id), let row = try storage({ () throws(StoreError) in try store.erasure(n) }) else {
            throw .notFound(request.path)
        }
        return HTTPResponse(row.json)
    }

    /// The periodic job: a few steps of the oldest pending erasure, then (`--nats`) the stream
    /// deletes of finished database parts.
    func runErasures() {
        do throws(StoreError) {
            for _ in 0..<ErasureLimits.stepsPerJob {
                guard let e = try store.pendingErasure() else { break }
                _ = try store.eraseStep(e.id, now: System.wallClockMs())
            }
            if let js = jetstream { try sendStreamDeletes(js) }
        } catch {
            log.warn("erasure job failed", ["error": error.description])
        }
    }

    private func sendStreamDeletes(_ js: JetStreamPublisher) throws(StoreError) {
        guard let d = consoleData, d.streamDeletesInFlight.isEmpty else { return }
        for (erasure, seq) in try store.pendingStreamDeletes(limit: ErasureLimits.maxStreamDeletes) {
            d.streamDeletesInFlight.insert(seq)
            let sent = js.deleteMessage(seq: seq) { [weak self] outcome in
                guard let self else { return }
                self.consoleData?.streamDeletesInFlight.remove(seq)
                guard outcome else { return }
                do throws(StoreError) {
                    try self.store.streamDeleted(erasure: erasure, seq: seq)
                } catch {
                    self.log.warn("erasure: recording a stream delete failed", ["error": error.description])
                }
            }
            if !sent { d.streamDeletesInFlight.remove(seq) }
        }
    }

    // MARK: Users

    /// `GET /v1/admin/users?appKey=&q=&cursor=&limit=`: with `q`, the users holding that user
    /// id, EUID, email, phone or anonymous id (an index lookup each); without, one AppKey's
    /// users by EUID.
    func userList(_ request: HTTPRequest) throws(APIError) -> HTTPResponse {
        let q = request.query
        let appKey = try appKeyParam(q)
        let limit = try pageLimit(q)
        let after = nonEmpty(q["cursor"]) ?? ""
        let term = nonEmpty(q["q"])
        if term == nil, appKey == nil { throw .badRequest(.invalidRequest, "give appKey, q or both") }
        let rows = try storage { () throws(StoreError) in try store.users(appKey: appKey, term: term, after: after, limit: limit) }
        let items = try storage { () throws(StoreError) -> [JSON] in
            try rows.map { (a, e) throws(StoreError) -> JSON in try userSummary(a, e) }
        }
        return list(items, next: rows.count == limit ? rows.last.map { $0.appKey + "/" + $0.euid } : nil)
    }

    private func userSummary(_ appKey: String, _ euid: String) throws(StoreError) -> JSON {
        let ids = try store.maIdentities(appKey, euid)
        let contacts = try store.maDocument(appKey, euid, .contacts) ?? [:]
        var allContacts = contacts
        if let emails = ids[.email] { allContacts["email"] = .array(emails.map(JSON.string)) }
        if let phones = ids[.phone] { allContacts["phone"] = .array(phones.map(JSON.string)) }
        return [
            "appKey": .string(appKey), "euid": .string(euid), "userId": ids[.userID]?.first.map(JSON.string) ?? .null,
            "contacts": .object(allContacts), "lastSeenMs": try store.lastEventTime(appKey: appKey, euid: euid).map(JSON.int) ?? .null,
            "optedOut": .bool(try store.optOut(appKey: appKey, euid: euid) != nil),
        ]
    }

    /// `GET /v1/admin/users/{appKey}/{euid}`.
    func userDetail(_ request: HTTPRequest, appKey: String, euid: String) throws(APIError) -> HTTPResponse {
        let out = try storage { () throws(StoreError) -> JSON? in
            guard let properties = try store.maDocument(appKey, euid, .properties) else { return nil }
            var identities: JSONObject = [:]
            for (k, v) in try store.maIdentities(appKey, euid) { identities[k.rawValue] = .array(v.map(JSON.string)) }
            let userIds = identities[IdentityKind.userID.rawValue]?.arrayValue?.compactMap(\.stringValue) ?? []
            var bindings: [JSON] = []
            for u in userIds {
                for r in try store.pushQuery(
                    """
                    SELECT b.token, b.bound_at, p.install_id FROM push_bindings b LEFT JOIN push_devices p ON p.token = b.token
                    WHERE b.user_id = ? ORDER BY b.bound_at DESC LIMIT ?
                    """, [.text(u), .int(Int64(DataLimits.maxPage))])
                {
                    bindings.append([
                        "userId": .string(u), "token": .string(r[0].text ?? ""), "boundMs": .int(r[1].int ?? 0),
                        "installId": r[2].text.map(JSON.string) ?? .null,
                    ])
                }
            }
            var q = Store.EventQuery()
            q.appKey = appKey
            q.euid = euid
            q.limit = UserLimits.recentEvents
            let recent = try store.searchEvents(q, maxBytes: EventIndex.maxPageBytes)
            var summary = try userSummary(appKey, euid).objectValue ?? [:]
            summary["identities"] = .object(identities)
            summary["properties"] = .object(properties)
            summary["bindings"] = .array(bindings)
            summary["recentEvents"] = .array(recent.map(EventIndex.json))
            summary["optOut"] = try store.optOut(appKey: appKey, euid: euid)?.json ?? .null
            return .object(summary)
        }
        guard let out else { throw .notFound(request.path) }
        return HTTPResponse(out)
    }

    // MARK: Helpers

    /// `{"items": [...], "nextCursor": ...}`.
    func list(_ items: [JSON], next: String?) -> HTTPResponse {
        HTTPResponse(["items": .array(items), "nextCursor": next.map(JSON.string) ?? .null])
    }

    func cursorInt(_ q: [String: String]) throws(APIError) -> Int64? {
        guard let c = nonEmpty(q["cursor"]) else { return nil }
        guard let n = Int64(c) else { throw .badRequest(.invalidRequest, "cursor is not one this API gave") }
        return n
    }
}

enum UserLimits {
    /// Events in a user's detail.
    static let recentEvents = 20
}

extension Store {
    /// Users matching `term` (any identifier value, or an EUID), or one AppKey's users by EUID
    /// after `after` (`appKey/euid`).
    func users(appKey: String?, term: String?, after: String, limit: Int) throws(StoreError) -> [(appKey: String, euid: String)] {
        func pairs(_ rows: [[SQLValue]]) -> [(appKey: String, euid: String)] {
            rows.compactMap { r in r[0].text.flatMap { a in r[1].text.map { (a, $0) } } }
        }
        if let term {
            var found: [(appKey: String, euid: String)] = []
            var seen = Set<String>()
            var sql = "SELECT app_key, euid FROM ma_identities WHERE value = ?"
            var args: [SQLBind] = [.text(term)]
            if let appKey {
                sql += " AND app_key = ?"
                args.append(.text(appKey))
            }
            sql += " ORDER BY app_key, euid LIMIT ?"
            args.append(.int(Int64(limit)))
            var sql2 = "SELECT app_key, euid FROM ma_users WHERE euid = ?"
            var args2: [SQLBind] = [.text(term)]
            if let appKey {
                sql2 += " AND app_key = ?"
                args2.append(.text(appKey))
            }
            sql2 += " ORDER BY app_key LIMIT ?"
            args2.append(.int(Int64(limit)))
            for p in pairs(try db.query(sql, args)) + pairs(try db.query(sql2, args2))
            where seen.insert(p.appKey + "/" + p.euid).inserted && (p.appKey + "/" + p.euid) > after {
                found.append(p)
            }
            return Array(found.sorted { ($0.appKey, $0.euid) < ($1.appKey, $1.euid) }.prefix(limit))
        }
        let afterEuid = after.split(separator: "/", maxSplits: 1).dropFirst().first.map(String.init) ?? ""
        return pairs(
            try db.query(
                "SELECT app_key, euid FROM ma_users WHERE app_key = ? AND euid > ? ORDER BY euid LIMIT ?",
                [.text(appKey ?? ""), .text(afterEuid), .int(Int64(limit))]))
    }

    /// The time of the user's newest event (an index seek).
    func lastEventTime(appKey: String, euid: String) throws(StoreError) -> Int64? {
        try db.query(
            "SELECT time_ms FROM events WHERE app_key = ? AND euid = ? ORDER BY time_ms DESC LIMIT 1", [.text(appKey), .text(euid)]
        ).first?.first?.int
    }
}

extension Backend {
    /// `--erase-user APPKEY:EUID`: runs every step of the database part now. Answers the exit
    /// status (0 done; 3 pending: stream deletes wait for a backend running with `--nats`; 2
    /// invalid; 1 failed) and the erasure's record as JSON.
    package func eraseFromCommandLine(_ target: String) -> (Int32, String) {
        guard let colon = target.firstIndex(of: ":") else { return (2, "--erase-user expects APPKEY:EUID") }
        let appKey = String(target[..<colon])
        let euid = String(target[target.index(after: colon)...])
        guard AppKey.isValid(appKey), Router.invalidName(euid, what: "euid") == nil else {
            return (2, "--erase-user expects APPKEY:EUID (appKey \(AppKey.rule), euid 1 to \(Limits.maxNameBytes) bytes)")
        }
        do throws(StoreError) {
            let id = try store.createErasure(appKey: appKey, euid: euid, actor: "cli", now: System.wallClockMs())
            var steps = 0
            while try !store.eraseStep(id, now: System.wallClockMs()) {
                steps += 1
                if try store.erasure(id)?.euid == nil { break }  // waiting for stream deletes
                if steps > ErasureLimits.maxCommandLineSteps { break }
            }
            guard let row = try store.erasure(id) else { return (1, "erasure \(id) vanished") }
            try? store.appendAudit(
                timeMs: System.wallClockMs(), actor: "cli", action: "erase", target: "\(appKey)/\(row.subject)",
                detail: JSON.object(["erasure": .string(String(id))]).serialized)
            return (row.status == "done" ? 0 : 3, row.json.serialized)
        } catch {
            return (1, "erasure failed: \(error.description)")
        }
    }
}
