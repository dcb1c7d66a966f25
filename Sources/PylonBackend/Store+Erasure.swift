import PylonCore
import PylonStore

/// Erasure of one MA user (`appKey`, `euid`): the tables and the steps (docs/SECURITY.md,
/// "Erasure").
///
/// - `erasures`: one row per request, kept: who asked, when, the status and how many rows of
///   each kind were deleted. The user is named only by `subject` (SHA-256 of `appKey` and
///   `euid`) once the erasure is done; `euid` is kept only while it runs.
/// - `erasure_stream_deletes`: with `--nats`, the JetStream sequence numbers of the ingest
///   messages (batches) that held the user's records, deleted from the stream by the
///   periodic job (`Backend+Erasure.swift`); the erasure is `done` once none is left.
///
/// A step deletes at most `ErasureLimits.batchRows` events (and their `records` rows) in one
/// transaction: the AppKey's events of the EUID, then the events of streams without an AppKey
/// (`pylon.consent`) that name the EUID. The last step deletes the profile, identities, contacts
/// (`ma_users`), channel values, opt-outs and push bindings of the user's user ids, and names
/// the user's user-targeted sends in the push history by the erasure instead of the user id.
extension Store {
    static let erasureSchema = """
        CREATE TABLE IF NOT EXISTS erasures (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            app_key TEXT NOT NULL,
            subject TEXT NOT NULL,
            euid TEXT,
            actor TEXT NOT NULL,
            status TEXT NOT NULL,
            requested_ms INTEGER NOT NULL,
            finished_ms INTEGER,
            events INTEGER NOT NULL DEFAULT 0,
            deleted TEXT NOT NULL DEFAULT '{}'
        );
        CREATE INDEX IF NOT EXISTS erasures_status ON erasures(status, id);
        CREATE TABLE IF NOT EXISTS erasure_stream_deletes (
            erasure INTEGER NOT NULL,
            js_seq INTEGER NOT NULL,
            PRIMARY KEY (erasure, js_seq)
        );
        """

    struct ErasureRow: Equatable {
        var id: Int64
        var appKey: String
        var subject: String
        var euid: String?
        var actor: String
        var status: String
        var requestedMs: Int64
        var finishedMs: Int64?
        var events: Int64
        var deleted: String

        var json: JSON {
            var d = (try? JSON.parse(deleted))?.objectValue ?? [:]
            d["events"] = .int(events)
            return [
                "id": .string(String(id)), "appKey": .string(appKey), "subject": .string(subject), "actor": .string(actor),
                "status": .string(status), "requestedMs": .int(requestedMs), "finishedMs": finishedMs.map(JSON.int) ?? .null,
                "deleted": .object(d),
            ]
        }
    }

    static let erasureColumns = "id, app_key, subject, euid, actor, status, requested_ms, finished_ms, events, deleted"

    static func erasureRow(_ r: [SQLValue]) -> ErasureRow {
        ErasureRow(
            id: r[0].int ?? 0, appKey: r[1].text ?? "", subject: r[2].text ?? "", euid: r[3].text, actor: r[4].text ?? "",
            status: r[5].text ?? "", requestedMs: r[6].int ?? 0, finishedMs: r[7].int, events: r[8].int ?? 0, deleted: r[9].text ?? "{}")
    }

    /// The subject an erasure keeps: the hex SHA-256 of `appKey` NUL `euid`.
    static func erasureSubject(_ appKey: String, _ euid: String) -> String {
        let digits = Array("0123456789abcdef".utf8)
        let hash = NKey.sha256(Array(appKey.utf8) + [0] + Array(euid.utf8))
        return "sha256:" + String(decoding: hash.flatMap { [digits[Int($0 >> 4)], digits[Int($0 & 15)]] }, as: UTF8.self)
    }

    func createErasure(appKey: String, euid: String, actor: String, now: Int64) throws(StoreError) -> Int64 {
        guard
            let id = try db.query(
                """
                INSERT INTO erasures (app_key, subject, euid, actor, status, requested_ms) VALUES (?, ?, ?, ?, 'pending', ?)
                RETURNING id
                """, [.text(appKey), .text(Store.erasureSubject(appKey, euid)), .text(euid), .text(actor), .int(now)]
            ).first?.first?.int
        else { throw .postgres(sqlstate: "XX000", message: "erasure row not created") }
        return id
    }

    func erasure(_ id: Int64) throws(StoreError) -> ErasureRow? {
        try db.query("SELECT \(Store.erasureColumns) FROM erasures WHERE id = ?", [.int(id)]).first.map(Store.erasureRow)
    }

    /// Erasures newest first, before id `before`.
    func erasures(before: Int64, status: String?, limit: Int) throws(StoreError) -> [ErasureRow] {
        try newestFirst("SELECT \(Store.erasureColumns) FROM erasures", before: before, status: status, limit: limit)
            .map(Store.erasureRow)
    }

    /// One page of a table listed newest first by id: the rows of `select` (a `SELECT … FROM t`
    /// without WHERE) with id < `before`, of `status` when given.
    func newestFirst(_ select: String, before: Int64, status: String?, limit: Int) throws(StoreError) -> [[SQLValue]] {
        var sql = select + " WHERE id < ?"
        var args: [SQLBind] = [.int(before)]
        if let status {
            sql += " AND status = ?"
            args.append(.text(status))
        }
        sql += " ORDER BY id DESC LIMIT ?"
        args.append(.int(Int64(limit)))
        return try db.query(sql, args)
    }

    /// The oldest erasure whose database part is still running, if any.
    func pendingErasure() throws(StoreError) -> ErasureRow? {
        try db.query(
            "SELECT \(Store.erasureColumns) FROM erasures WHERE status = 'pending' AND euid IS NOT NULL ORDER BY id LIMIT 1"
        ).first.map(Store.erasureRow)
    }

    /// One step of erasure `id`: true when it finished (`done`), false when more steps are needed.
    func eraseStep(_ id: Int64, now: Int64) throws(StoreError) -> Bool {
        try transaction(locking: [Store.lockKey("erasure", String(id))]) { () throws(StoreError) -> Bool in
            guard let e = try erasure(id), e.status == "pending" else { return true }
            guard let euid = e.euid else {
                // The database part is done: waiting for the stream's deletes.
                return try finishIfStreamDone(e, now: now)
            }
            // The next batch of the user's events: its AppKey's, then those of streams without
            // an AppKey that name its EUID (its consent reports). Each batch is named by the
            // same subquery in every statement (one transaction: each sees the same rows).
            for scope in [e.appKey, ""] {
                let batch = "SELECT id FROM events WHERE app_key = ? AND euid = ? ORDER BY time_ms, id LIMIT ?"
                let user: [SQLBind] = [.text(scope), .text(euid), .int(Int64(ErasureLimits.batchRows))]
                try db.run(
                    "INSERT INTO erasure_stream_deletes (erasure, js_seq) SELECT DISTINCT CAST(? AS BIGINT), js_seq FROM events"
                        + " WHERE id IN (\(batch)) AND js_seq IS NOT NULL ON CONFLICT DO NOTHING", [.int(id)] + user)
                try db.run(
                    "DELETE FROM records WHERE seq IN (SELECT r.seq FROM events e JOIN records r ON r.stream = e.stream"
                        + " AND r.id = e.record_id WHERE e.id IN (\(batch)))", user)
                let n = try db.run("DELETE FROM events WHERE id IN (\(batch))", user)
                if n > 0 {
                    try db.run("UPDATE erasures SET events = events + ? WHERE id = ?", [.int(Int64(n)), .int(id)])
                    return false
                }
            }
            // The events are gone: the profile and what hangs off it.
            let key: [SQLBind] = [.text(e.appKey), .text(euid)]
            let userIds = try db.query(
                "SELECT value FROM ma_identities WHERE app_key = ? AND euid = ? AND kind = 'user_id'", key
            ).compactMap { $0[0].text }
            var deleted: JSONObject = [:]
            deleted["identities"] = .int(Int64(try db.run("DELETE FROM ma_identities WHERE app_key = ? AND euid = ?", key)))
            deleted["profile"] = .int(Int64(try db.run("DELETE FROM ma_users WHERE app_key = ? AND euid = ?", key)))
            deleted["channelValues"] = .int(Int64(try db.run("DELETE FROM ma_channel_values WHERE app_key = ? AND euid = ?", key)))
            deleted["optOuts"] = .int(Int64(try db.run("DELETE FROM optouts WHERE app_key = ? AND euid = ?", key)))
            deleted["automation"] = .int(Int64(try eraseAutomation(appKey: e.appKey, euid: euid)))
            try db.run("DELETE FROM user_days WHERE app_key = ? AND euid = ?", key)
            var bindings = 0
            var sends = 0
            for u in userIds {
                bindings += try db.run("DELETE FROM push_bindings WHERE user_id = ?", [.text(u)])
                sends += try db.run(
                    "UPDATE push_sends SET target = CAST(? AS TEXT) || CAST(seq AS TEXT) WHERE target_type = 'user' AND target = ?",
                    [.text("erased:\(id):"), .text(u)])
            }
            deleted["bindings"] = .int(Int64(bindings))
            deleted["pushTargets"] = .int(Int64(sends))
            try db.run(
                "UPDATE erasures SET euid = NULL, deleted = ? WHERE id = ?", [.text(JSON.object(deleted).serialized), .int(id)])
            guard let after = try erasure(id) else { return true }
            return try finishIfStreamDone(after, now: now)
        }
    }

    private func finishIfStreamDone(_ e: ErasureRow, now: Int64) throws(StoreError) -> Bool {
        guard try db.query("SELECT 1 FROM erasure_stream_deletes WHERE erasure = ? LIMIT 1", [.int(e.id)]).isEmpty else { return false }
        try db.run("UPDATE erasures SET status = 'done', finished_ms = ? WHERE id = ?", [.int(now), .int(e.id)])
        return true
    }

    /// Stream messages still to delete for erasures whose database part is done.
    func pendingStreamDeletes(limit: Int) throws(StoreError) -> [(erasure: Int64, seq: Int64)] {
        try db.query(
            "SELECT erasure, js_seq FROM erasure_stream_deletes ORDER BY erasure, js_seq LIMIT ?", [.int(Int64(limit))]
        ).compactMap { r in r[0].int.flatMap { e in r[1].int.map { (e, $0) } } }
    }

    /// The stream confirmed message `seq` is gone (deleted now or before).
    func streamDeleted(erasure: Int64, seq: Int64) throws(StoreError) {
        try transaction { () throws(StoreError) in
            try db.run("DELETE FROM erasure_stream_deletes WHERE erasure = ? AND js_seq = ?", [.int(erasure), .int(seq)])
            if let e = try self.erasure(erasure), e.status == "pending", e.euid == nil {
                _ = try finishIfStreamDone(e, now: System.wallClockMs())
            }
        }
    }
}

enum ErasureLimits {
    /// Events deleted per step (one short transaction).
    static let batchRows = 500
    /// Steps an erasure request runs before it answers (the rest runs in the periodic job):
    /// a user with up to `batchRows` × this many events is erased before the answer.
    static let stepsInRequest = 4
    /// Steps the periodic job runs per round (`DataLimits.jobIntervalMs`), so the loop is
    /// never held for more than a few short transactions.
    static let stepsPerJob = 2
    /// Steps `--erase-user` runs at most (a user of up to 500 million events).
    static let maxCommandLineSteps = 1_000_000
    /// Stream message deletes in flight at once (`--nats`).
    static let maxStreamDeletes = 64
}
