import PylonCore

/// The console's fleet lists: devices (search, one device's page), AppKeys and streams.
extension Backend {
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
