import PylonCore
import PylonStore

/// Push history: each send's funnel and per-device state, read from the push tables
/// (`Store+Push.swift`) plus
///
/// - `push_opens`: one row per message and device token that reported opening it (the
///   `push.opens` records the uploader delivers; `Store+Events.swift` applies them);
/// - `push_send_actors`: who sent a message (the operator, or `schedule:<id>`);
/// - `push_scheduled`: sends to run at `at_ms`, with their status (`pending`, `sending`,
///   `sent`, `failed`, `cancelled`) and the message id once sent. The periodic job claims a due
///   row with a conditional update, so of several instances one sends it.
extension Store {
    static let pushHistorySchema = """
        CREATE TABLE IF NOT EXISTS push_opens (
            msg_id TEXT NOT NULL,
            token TEXT NOT NULL,
            opened_at INTEGER NOT NULL,
            PRIMARY KEY (msg_id, token)
        );
        CREATE TABLE IF NOT EXISTS push_send_actors (
            msg_id TEXT PRIMARY KEY,
            actor TEXT NOT NULL
        );
        CREATE TABLE IF NOT EXISTS push_scheduled (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            body TEXT NOT NULL,
            at_ms INTEGER NOT NULL,
            status TEXT NOT NULL,
            actor TEXT NOT NULL,
            created_ms INTEGER NOT NULL,
            msg_id TEXT,
            error TEXT
        );
        CREATE INDEX IF NOT EXISTS push_scheduled_due ON push_scheduled(status, at_ms);
        """

    /// Records opens reported by devices (`push.opens` records: `msgId`, `token`, `openedAt`).
    func recordOpens(_ opens: [(msgId: String, token: String, at: Int64)]) throws(StoreError) {
        for o in opens {
            try db.run(
                "INSERT INTO push_opens (msg_id, token, opened_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                [.text(o.msgId), .text(o.token), .int(o.at)])
        }
    }

    func recordSendActor(msgId: String, actor: String) throws(StoreError) {
        try db.run("INSERT INTO push_send_actors (msg_id, actor) VALUES (?, ?) ON CONFLICT DO NOTHING", [.text(msgId), .text(actor)])
    }

    struct PushMessageRow {
        var seq: Int64
        var msgId: String
        var appId: String
        var targetType: String
        var target: String
        var payload: String
        var devices: Int64
        var createdMs: Int64
        var actor: String?
    }

    static let pushMessageColumns = """
        s.seq, s.msg_id, s.app_id, s.target_type, s.target, s.payload, s.devices, s.created_at, a.actor
        FROM push_sends s LEFT JOIN push_send_actors a ON a.msg_id = s.msg_id
        """

    static func pushMessageRow(_ r: [SQLValue]) -> PushMessageRow {
        PushMessageRow(
            seq: r[0].int ?? 0, msgId: r[1].text ?? "", appId: r[2].text ?? "", targetType: r[3].text ?? "", target: r[4].text ?? "",
            payload: r[5].text ?? "{}", devices: r[6].int ?? 0, createdMs: r[7].int ?? 0, actor: r[8].text)
    }

    /// Sends newest first, before `seq` `before`.
    func pushMessages(before: Int64, limit: Int) throws(StoreError) -> [PushMessageRow] {
        try db.query("SELECT \(Store.pushMessageColumns) WHERE s.seq < ? ORDER BY s.seq DESC LIMIT ?", [.int(before), .int(Int64(limit))])
            .map(Store.pushMessageRow)
    }

    func pushMessage(_ msgId: String) throws(StoreError) -> PushMessageRow? {
        try db.query("SELECT \(Store.pushMessageColumns) WHERE s.msg_id = ?", [.text(msgId)]).first.map(Store.pushMessageRow)
    }

    /// A message's funnel: devices it was sent to, acknowledged by the device, opened.
    func pushFunnel(_ msgId: String) throws(StoreError) -> (sent: Int64, delivered: Int64, opened: Int64) {
        let r = try db.query(
            "SELECT count(*), count(acked_at) FROM push_deliveries WHERE msg_id = ?", [.text(msgId)]
        ).first
        let opened = try db.query("SELECT count(*) FROM push_opens WHERE msg_id = ?", [.text(msgId)]).first?.first?.int ?? 0
        return (r?[0].int ?? 0, r?[1].int ?? 0, opened)
    }

    struct DeliveryRow {
        var token: String
        var installId: String?
        var active: Bool
        var publishedMs: Int64
        var pubackMs: Int64?
        var ackedMs: Int64?
        var openedMs: Int64?
        var consentDenied: Bool
    }

    /// Per-device rows of a message, by token, after `afterToken`.
    func pushDeliveries(_ msgId: String, token: String? = nil, afterToken: String = "", limit: Int) throws(StoreError) -> [DeliveryRow] {
        var sql = """
            SELECT d.token, p.install_id, p.active, d.published_at, d.puback_at, d.acked_at, o.opened_at,
                (SELECT count(*) FROM optouts x WHERE x.install_id = p.install_id AND (x.switch = 'device' OR x.switch LIKE 'push%'))
            FROM push_deliveries d LEFT JOIN push_devices p ON p.token = d.token
            LEFT JOIN push_opens o ON o.msg_id = d.msg_id AND o.token = d.token
            WHERE d.msg_id = ? AND d.token > ?
            """
        var args: [SQLBind] = [.text(msgId), .text(afterToken)]
        if let token {
            sql += " AND d.token = ?"
            args.append(.text(token))
        }
        sql += " ORDER BY d.token LIMIT ?"
        args.append(.int(Int64(limit)))
        return try db.query(sql, args).map { r in
            DeliveryRow(
                token: r[0].text ?? "", installId: r[1].text, active: r[2].int == 1, publishedMs: r[3].int ?? 0, pubackMs: r[4].int,
                ackedMs: r[5].int, openedMs: r[6].int, consentDenied: (r[7].int ?? 0) > 0)
        }
    }

    /// The active and past tokens of an install.
    func pushTokens(installId: String) throws(StoreError) -> [String] {
        try db.query("SELECT token FROM push_devices WHERE install_id = ? ORDER BY registered_at DESC LIMIT 16", [.text(installId)])
            .compactMap { $0[0].text }
    }

    // MARK: Scheduled sends

    struct ScheduledRow {
        var id: Int64
        var body: String
        var atMs: Int64
        var status: String
        var actor: String
        var createdMs: Int64
        var msgId: String?
        var error: String?

        var json: JSON {
            [
                "id": .string(String(id)), "atMs": .int(atMs), "status": .string(status), "actor": .string(actor),
                "createdMs": .int(createdMs), "msgId": msgId.map(JSON.string) ?? .null, "error": error.map(JSON.string) ?? .null,
                "send": (try? JSON.parse(body)) ?? .null,
            ]
        }
    }

    static let scheduledColumns = "id, body, at_ms, status, actor, created_ms, msg_id, error FROM push_scheduled"

    static func scheduledRow(_ r: [SQLValue]) -> ScheduledRow {
        ScheduledRow(
            id: r[0].int ?? 0, body: r[1].text ?? "{}", atMs: r[2].int ?? 0, status: r[3].text ?? "", actor: r[4].text ?? "",
            createdMs: r[5].int ?? 0, msgId: r[6].text, error: r[7].text)
    }

    func schedulePush(body: String, atMs: Int64, actor: String, now: Int64) throws(StoreError) -> Int64 {
        guard
            let id = try db.query(
                "INSERT INTO push_scheduled (body, at_ms, status, actor, created_ms) VALUES (?, ?, 'pending', ?, ?) RETURNING id",
                [.text(body), .int(atMs), .text(actor), .int(now)]
            ).first?.first?.int
        else { throw .postgres(sqlstate: "XX000", message: "scheduled send not created") }
        return id
    }

    /// Scheduled sends, newest first (by id), before `before`; `status` filters.
    func scheduledPushes(before: Int64, status: String?, limit: Int) throws(StoreError) -> [ScheduledRow] {
        try newestFirst("SELECT \(Store.scheduledColumns)", before: before, status: status, limit: limit).map(Store.scheduledRow)
    }

    func scheduledPush(_ id: Int64) throws(StoreError) -> ScheduledRow? {
        try db.query("SELECT \(Store.scheduledColumns) WHERE id = ?", [.int(id)]).first.map(Store.scheduledRow)
    }

    /// Cancels a pending send; false when it is not pending (sent, cancelled, or sending).
    func cancelScheduled(_ id: Int64) throws(StoreError) -> Bool {
        try db.run("UPDATE push_scheduled SET status = 'cancelled' WHERE id = ? AND status = 'pending'", [.int(id)]) == 1
    }

    /// Claims the due sends (at most `limit`): each is moved to `sending` by this caller only.
    func claimDueScheduled(now: Int64, limit: Int) throws(StoreError) -> [ScheduledRow] {
        let due = try db.query(
            "SELECT \(Store.scheduledColumns) WHERE status = 'pending' AND at_ms <= ? ORDER BY at_ms LIMIT ?",
            [.int(now), .int(Int64(limit))]
        ).map(Store.scheduledRow)
        var claimed: [ScheduledRow] = []
        for r in due where try db.run("UPDATE push_scheduled SET status = 'sending' WHERE id = ? AND status = 'pending'", [.int(r.id)]) == 1
        {
            claimed.append(r)
        }
        return claimed
    }

    func finishScheduled(_ id: Int64, msgId: String?, error: String?) throws(StoreError) {
        try db.run(
            "UPDATE push_scheduled SET status = ?, msg_id = ?, error = ? WHERE id = ?",
            [.text(error == nil ? "sent" : "failed"), msgId.map { .text($0) } ?? .null, error.map { .text($0) } ?? .null, .int(id)])
    }
}
