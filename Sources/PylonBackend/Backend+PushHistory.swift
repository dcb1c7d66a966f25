import PylonCore

/// Push history (`GET /v1/admin/push/messages[/{id}]`, `GET /v1/admin/push/why`) and
/// scheduled sends (`POST /v1/admin/push/schedule`, `GET /v1/admin/push/scheduled`,
/// `DELETE /v1/admin/push/scheduled/{id}`). Tables: `Store+PushHistory.swift`.
extension Backend {
    /// `POST /v1/admin/push/send` with its sender recorded (history and audit log).
    func pushSendRecorded(_ request: HTTPRequest, _ principal: Principal, actor: String? = nil) throws(APIError) -> HTTPResponse {
        let r = try pushSend(request)
        if let id = r.body["msgId"]?.stringValue, r.body["duplicate"]?.boolValue != true {
            let who = actor ?? actorName(principal)
            do throws(StoreError) { try store.recordSendActor(msgId: id, actor: who) } catch {
                log.warn("push: sender not recorded", ["msgId": id, "error": error.description])
            }
            if actor == nil { recordChange(principal, "push.send", target: id, detail: ["devices": r.body["devices"] ?? .null]) }
        }
        return r
    }

    /// `GET /v1/admin/push/messages?cursor=&limit=`: newest first, each with its funnel.
    func pushMessages(_ request: HTTPRequest) throws(APIError) -> HTTPResponse {
        let q = request.query
        let limit = try pageLimit(q, max: PushHistoryLimits.maxPage, default: PushHistoryLimits.defaultPage)
        let before = try cursorInt(q) ?? Int64.max
        let items = try storage { () throws(StoreError) -> [(Int64, JSON)] in
            try store.pushMessages(before: before, limit: limit).map { m throws(StoreError) in (m.seq, try messageJSON(m)) }
        }
        return list(items.map(\.1), next: items.count == limit ? items.last.map { String($0.0) } : nil)
    }

    private func messageJSON(_ m: Store.PushMessageRow) throws(StoreError) -> JSON {
        let f = try store.pushFunnel(m.msgId)
        let p = (try? JSON.parse(m.payload)) ?? .null
        func rate(_ n: Int64) -> JSON { f.sent > 0 ? .double(Double(n) / Double(f.sent)) : .null }
        return [
            "id": .string(m.msgId), "createdMs": .int(m.createdMs), "actor": m.actor.map(JSON.string) ?? .null,
            "appId": .string(m.appId), "target": ["type": .string(m.targetType), "value": .string(m.target)],
            "title": p["title"] ?? .null, "body": p["content"] ?? .null, "expiresMs": p["expiresAt"] ?? .null,
            "status": .string(f.sent == 0 ? "no_devices" : "sent"),
            "counts": ["sent": .int(f.sent), "delivered": .int(f.delivered), "opened": .int(f.opened)],
            "rates": ["delivered": rate(f.delivered), "opened": rate(f.opened)],
        ]
    }

    /// `GET /v1/admin/push/messages/{id}?cursor=&limit=`: the message and a page of its devices.
    func pushMessage(_ request: HTTPRequest, id: String) throws(APIError) -> HTTPResponse {
        let q = request.query
        let limit = try pageLimit(q, max: PushHistoryLimits.maxDevicesPage, default: PushHistoryLimits.maxDevicesPage)
        let after = nonEmpty(q["cursor"]) ?? ""
        let out = try storage { () throws(StoreError) -> JSON? in
            guard let m = try store.pushMessage(id) else { return nil }
            let expires = ((try? JSON.parse(m.payload))?["expiresAt"]?.intValue) ?? Int64.max
            let rows = try store.pushDeliveries(id, afterToken: after, limit: limit)
            var o = try messageJSON(m).objectValue ?? [:]
            o["devices"] = .array(rows.map { deviceJSON($0, expiresMs: expires) })
            o["nextCursor"] = rows.count == limit ? rows.last.map { .string($0.token) } ?? .null : .null
            return .object(o)
        }
        guard let out else { throw .notFound(request.path) }
        return HTTPResponse(out)
    }

    private func deviceJSON(_ d: Store.DeliveryRow, expiresMs: Int64) -> JSON {
        let (state, reason) = PushState.of(d, expiresMs: expiresMs, now: System.wallClockMs())
        return [
            "installId": d.installId.map(JSON.string) ?? .null, "token": .string(d.token), "state": .string(state),
            "reason": .string(reason), "publishedMs": .int(d.publishedMs), "deliveredMs": d.ackedMs.map(JSON.int) ?? .null,
            "openedMs": d.openedMs.map(JSON.int) ?? .null,
        ]
    }

    /// `GET /v1/admin/push/why?messageId=&installId=`: that device's state for that message.
    func pushWhy(_ request: HTTPRequest) throws(APIError) -> HTTPResponse {
        let q = request.query
        guard let msgId = nonEmpty(q["messageId"]), let install = nonEmpty(q["installId"]) else {
            throw .badRequest(.invalidRequest, "messageId and installId are required")
        }
        let out = try storage { () throws(StoreError) -> JSON? in
            guard let m = try store.pushMessage(msgId) else { return nil }
            let expires = ((try? JSON.parse(m.payload))?["expiresAt"]?.intValue) ?? Int64.max
            for t in try store.pushTokens(installId: install) {
                if let d = try store.pushDeliveries(msgId, token: t, limit: 1).first { return deviceJSON(d, expiresMs: expires) }
            }
            return [
                "installId": .string(install), "state": "unbound",
                "reason": .string(
                    "the message was not addressed to this install: when it was sent, no active push token of the install was bound to \(m.targetType) \(m.target)"
                ),
            ]
        }
        guard let out else { throw .notFound(request.path) }
        return HTTPResponse(out)
    }

    // MARK: Scheduled sends

    /// `POST /v1/admin/push/schedule {…the send body…, "atMs"}` → `{"id"}`.
    func schedulePush(_ request: HTTPRequest, _ principal: Principal) throws(APIError) -> HTTPResponse {
        let body = try jsonBody(request)
        guard var o = body.objectValue else { throw .badRequest(.invalidRequest, "the body must be a JSON object") }
        let now = System.wallClockMs()
        guard let at = o["atMs"]?.intValue, at >= now - PushHistoryLimits.pastToleranceMs, at <= now + PushHistoryLimits.maxAheadMs else {
            throw .badRequest(
                .invalidRequest,
                "atMs must be a time (ms since the epoch) from now to \(PushHistoryLimits.maxAheadMs / 86_400_000) days ahead")
        }
        o["atMs"] = nil
        let targetType = o["targetType"]?.stringValue ?? "device"
        guard ["device", "user", "broadcast"].contains(targetType) else {
            throw .badRequest(.invalidRequest, "a scheduled send's targetType must be device, user or broadcast")
        }
        guard o["appId"]?.stringValue?.isEmpty == false else { throw .badRequest(.invalidRequest, "appId is required") }
        let text = JSON.object(o).serialized
        guard text.utf8.count <= PushLimits.maxPayloadBytes else { throw .tooLarge("the send exceeds \(PushLimits.maxPayloadBytes) bytes") }
        let id = try storage { () throws(StoreError) in try store.schedulePush(body: text, atMs: at, actor: actorName(principal), now: now)
        }
        recordChange(principal, "push.schedule", target: String(id), detail: ["atMs": .int(at)])
        return HTTPResponse(["id": .string(String(id)), "atMs": .int(at), "status": "pending"])
    }

    /// `GET /v1/admin/push/scheduled?status=&cursor=&limit=`, newest first.
    func scheduledPushes(_ request: HTTPRequest) throws(APIError) -> HTTPResponse {
        let q = request.query
        let limit = try pageLimit(q)
        let before = try cursorInt(q) ?? Int64.max
        let rows = try storage { () throws(StoreError) in
            try store.scheduledPushes(before: before, status: nonEmpty(q["status"]), limit: limit)
        }
        return list(rows.map(\.json), next: rows.count == limit ? rows.last.map { String($0.id) } : nil)
    }

    /// `DELETE /v1/admin/push/scheduled/{id}`: 200 with the row once cancelled; 409 when it is
    /// no longer pending.
    func cancelScheduled(_ request: HTTPRequest, id: String, _ principal: Principal) throws(APIError) -> HTTPResponse {
        guard let n = Int64(id) else { throw .notFound(request.path) }
        let (cancelled, row) = try storage { () throws(StoreError) in (try store.cancelScheduled(n), try store.scheduledPush(n)) }
        guard let row else { throw .notFound(request.path) }
        guard cancelled else {
            throw APIError(status: 409, code: .invalidRequest, message: "the scheduled send is \(row.status), not pending")
        }
        recordChange(principal, "push.cancel", target: id)
        return HTTPResponse(row.json)
    }

    /// The periodic job: sends whose time has come (each claimed by one instance).
    func runScheduledPushes() {
        guard mqtt != nil else { return }
        let due: [Store.ScheduledRow]
        do throws(StoreError) {
            due = try store.claimDueScheduled(now: System.wallClockMs(), limit: PushHistoryLimits.duePerRound)
        } catch {
            log.warn("scheduled sends: claim failed", ["error": error.description])
            return
        }
        for r in due {
            let request = HTTPRequest(
                method: "POST", target: "/v1/admin/push/send", headers: [], body: Array(r.body.utf8), keepAlive: true)
            var msgId: String?
            var failure: String?
            do throws(APIError) {
                let answer = try pushSendRecorded(request, .operator, actor: r.actor + " (scheduled " + String(r.id) + ")")
                msgId = answer.body["msgId"]?.stringValue
            } catch {
                failure = error.message
            }
            do throws(StoreError) { try store.finishScheduled(r.id, msgId: msgId, error: failure) } catch {
                log.warn("scheduled sends: result not stored", ["id": r.id, "error": error.description])
            }
            log.info("scheduled send", ["id": r.id, "msgId": msgId ?? "-", "error": failure ?? "-"])
        }
    }
}

/// A device's state for one message, and why.
enum PushState {
    static func of(_ d: Store.DeliveryRow, expiresMs: Int64, now: Int64) -> (String, String) {
        if let o = d.openedMs { return ("opened", "the user opened it (reported at \(o))") }
        if let a = d.ackedMs { return ("delivered", "the device acknowledged it at \(a)") }
        if d.consentDenied { return ("refused_consent", "the device reported its push or master consent switch denied") }
        if !d.active { return ("unbound", "the install's push token was replaced or retired before the device received it") }
        if now > expiresMs { return ("expired", "not acknowledged by the device before it expired at \(expiresMs)") }
        if d.pubackMs == nil { return ("sent", "published; the broker has not confirmed it yet") }
        return ("offline", "the broker holds it; the device has not connected (or not acknowledged it) since it was sent")
    }
}

enum PushHistoryLimits {
    static let defaultPage = 50
    /// Messages per page at most (each reads its funnel: three indexed counts).
    static let maxPage = 100
    /// Device rows per page of a message.
    static let maxDevicesPage = 500
    /// A scheduled send may name a time at most this far ahead (366 days)…
    static let maxAheadMs: Int64 = 366 * 86_400_000
    /// …and at most this far in the past (a clock a little behind: it is sent at once).
    static let pastToleranceMs: Int64 = 60_000
    /// Due sends claimed per job round.
    static let duePerRound = 16
}
