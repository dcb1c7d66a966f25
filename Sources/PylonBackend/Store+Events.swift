import PylonCore
import PylonProtocol
import PylonStore

/// The event index: one `events` row per stored record of every stream, with the fields the
/// console searches by as columns (docs/FLEET.md, "Event index").
///
/// - Without `--nats` the record itself stays in `records`; the row refers to it by
///   `(stream, record_id)`, which is `records`' unique key, and `data` is NULL.
/// - With `--nats` `records` stays empty: the row is written when JetStream acknowledged the
///   batch and holds the record's `data` itself and the stream sequence of its batch message
///   (`js_seq`), which an erasure deletes from the stream.
///
/// Columns read from each record's `data` (an object): `event` (string), `euid` (string),
/// `time` (integer; the record's `ts` when absent). Strings are cut at
/// `EventIndex.maxFieldBytes` and at a NUL. `app_key` is `<appKey>` for stream `ma.<appKey>`,
/// else empty. Every search is an index range in `(…, time_ms, id)` order, newest first, and
/// every page is bounded (`EventIndex.maxPage`).
extension Store {
    /// The console's data tables (this file, `Store+Erasure.swift`, `Store+Privacy.swift`,
    /// `Store+PushHistory.swift`).
    static var dataSchema: String {
        [eventsSchema, erasureSchema, privacySchema, pushHistorySchema, rollupSchema, automationSchema].joined(separator: "\n")
    }

    /// What `reset` deletes of them (settings and retention rules stay).
    static let dataReset = """
        DELETE FROM events; DELETE FROM erasures; DELETE FROM erasure_stream_deletes; DELETE FROM optouts;
        DELETE FROM push_opens; DELETE FROM push_send_actors; DELETE FROM push_scheduled;
        DELETE FROM event_hours; DELETE FROM user_days;
        """ + automationReset

    static let eventsSchema = """
        CREATE TABLE IF NOT EXISTS events (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            stream INTEGER NOT NULL,
            record_id TEXT NOT NULL,
            app_key TEXT NOT NULL,
            event TEXT NOT NULL,
            euid TEXT NOT NULL,
            time_ms INTEGER NOT NULL,
            received_ms INTEGER NOT NULL,
            install_id TEXT NOT NULL,
            data TEXT,
            js_seq INTEGER,
            UNIQUE (stream, record_id)
        );
        CREATE INDEX IF NOT EXISTS events_time ON events(time_ms, id);
        CREATE INDEX IF NOT EXISTS events_app_time ON events(app_key, time_ms, id);
        CREATE INDEX IF NOT EXISTS events_app_event_time ON events(app_key, event, time_ms, id);
        CREATE INDEX IF NOT EXISTS events_app_euid_time ON events(app_key, euid, time_ms, id);
        CREATE INDEX IF NOT EXISTS events_stream_time ON events(stream, time_ms, id);
        CREATE INDEX IF NOT EXISTS ma_identities_value ON ma_identities(value);
        CREATE INDEX IF NOT EXISTS ma_users_euid ON ma_users(euid);
        """

    /// One indexed record, as the API answers it.
    struct EventRow: Equatable {
        var id: Int64
        var stream: String
        var appKey: String
        var event: String
        var euid: String
        var userId: String?
        var timeMs: Int64
        var receivedMs: Int64
        var installId: String
        /// The record's `data` (JSON text).
        var data: String
    }

    /// A search: every filter optional; `before` is the cursor (the last row's time and id).
    struct EventQuery: Equatable {
        var appKey: String?
        var stream: String?
        var event: String?
        var euid: String?
        var fromMs: Int64?
        var toMs: Int64?
        var before: EventCursor?
        var limit = 50
    }

    /// The indexed fields of one record.
    struct IndexedRecord {
        var recordId: String
        var event: String
        var euid: String
        var timeMs: Int64
        /// Only with `--nats` (the record is nowhere else the backend can read).
        var data: String?
        /// Consent records (`ConsentStream`): `switch`, `granted`, `appKey`.
        var consentSwitch: String?
        var granted: Bool?
        var consentAppKey: String?
        /// Open reports (`push.opens`): the message and the device's push token.
        var openMsgId: String?
        var openToken: String?
    }

    /// The index rows of a batch's records (`Batch.text` ranges read once, no tree built).
    static func indexed(_ batch: Batch, keepData: Bool) -> [IndexedRecord] {
        let consent = batch.stream == ConsentStream.name
        let opens = batch.stream == EventIndex.opensStream
        return batch.text.withUnsafeBytes { t in
            batch.records.map { r in
                var out = IndexedRecord(
                    recordId: String(decoding: UnsafeRawBufferPointer(rebasing: t[r.id]), as: UTF8.self), event: "", euid: "",
                    timeMs: r.ts, data: nil)
                if let d = r.data {
                    var members = RawJSON.MemberCursor(t, d)
                    while let m = members.nextKey() {
                        let v = members.skipValue()
                        if RawJSON.keyIs(t, m.key, escaped: m.keyEscaped, "event") {
                            out.event = EventIndex.field(RawJSON.stringValue(t, v))
                        } else if RawJSON.keyIs(t, m.key, escaped: m.keyEscaped, "euid") {
                            out.euid = EventIndex.field(RawJSON.stringValue(t, v))
                        } else if RawJSON.keyIs(t, m.key, escaped: m.keyEscaped, "time"), let n = RawJSON.integer(t, v) {
                            out.timeMs = n
                        } else if consent, RawJSON.keyIs(t, m.key, escaped: m.keyEscaped, "switch") {
                            out.consentSwitch = RawJSON.stringValue(t, v).map { EventIndex.field($0) }
                        } else if consent, RawJSON.keyIs(t, m.key, escaped: m.keyEscaped, "granted") {
                            let word = String(decoding: UnsafeRawBufferPointer(rebasing: t[v]), as: UTF8.self)
                            out.granted = word == "true" ? true : word == "false" ? false : nil
                        } else if consent, RawJSON.keyIs(t, m.key, escaped: m.keyEscaped, "appKey") {
                            out.consentAppKey = RawJSON.stringValue(t, v).flatMap { AppKey.isValid($0) ? $0 : nil }
                        } else if opens, RawJSON.keyIs(t, m.key, escaped: m.keyEscaped, "msgId") {
                            out.openMsgId = RawJSON.stringValue(t, v).map { EventIndex.field($0) }
                        } else if opens, RawJSON.keyIs(t, m.key, escaped: m.keyEscaped, "token") {
                            out.openToken = RawJSON.stringValue(t, v).map { EventIndex.field($0) }
                        } else if opens, RawJSON.keyIs(t, m.key, escaped: m.keyEscaped, "openedAt"), let n = RawJSON.integer(t, v) {
                            out.timeMs = n
                        }
                    }
                    if keepData { out.data = String(decoding: UnsafeRawBufferPointer(rebasing: t[d]), as: UTF8.self) }
                } else if keepData {
                    out.data = "null"
                }
                return out
            }
        }
    }

    /// Indexes `records` of `stream` (already stored, or acknowledged by JetStream as
    /// `jsSeq`); a record id indexed before is skipped, as `records` skips it.
    func indexEvents(
        _ records: [IndexedRecord], stream: String, receivedAt: Int64, installId: String, jsSeq: Int64?
    ) throws(StoreError) {
        guard !records.isEmpty else { return }
        try transaction(.readCommitted) { () throws(StoreError) in
            try indexEventsNow(records, stream: stream, receivedAt: receivedAt, installId: installId, jsSeq: jsSeq)
        }
    }

    private func indexEventsNow(
        _ records: [IndexedRecord], stream: String, receivedAt: Int64, installId: String, jsSeq: Int64?
    ) throws(StoreError) {
        let streamId = try streamID(stream)
        let appKey = EventIndex.appKey(ofStream: stream)
        var next = 0
        var binds: [SQLBind] = []
        var added: [IndexedRecord] = []
        var byId: [String: Int] = [:]
        if !appKey.isEmpty {
            for (i, r) in records.enumerated() { byId[r.recordId] = i }
        }
        while next < records.count {
            let rows = Store.insertRows.first { $0 <= min(EventIndex.insertRows, records.count - next) }!
            binds.removeAll(keepingCapacity: true)
            binds.append(contentsOf: [.int(streamId), .text(appKey), .int(receivedAt), .text(installId), jsSeq.map { .int($0) } ?? .null])
            for r in records[next..<(next + rows)] {
                binds.append(contentsOf: [
                    .text(r.recordId), .text(r.event), .text(r.euid), .int(r.timeMs), r.data.map { .text($0) } ?? .null,
                ])
            }
            if appKey.isEmpty {
                try db.run(EventIndex.insertSQLByRows[rows]!, binds)
            } else {
                // The rows taken (a record id indexed before is not), for the rollups.
                for row in try db.query(EventIndex.insertSQLByRows[rows]! + " RETURNING record_id", binds) {
                    if let id = row[0].text, let i = byId[id] { added.append(records[i]) }
                }
            }
            next += rows
        }
        try rollUp(added, appKey: appKey)
        if stream == EventIndex.opensStream {
            try recordOpens(records.compactMap { r in r.openMsgId.flatMap { m in r.openToken.map { (m, $0, r.timeMs) } } })
        }
        if stream == ConsentStream.name {
            for (appKey, euid) in try applyConsent(records, installId: installId) {
                _ = try createErasure(appKey: appKey, euid: euid, actor: "opt-out", now: receivedAt)
            }
        }
    }

    /// The columns every event query selects (`EventIndex.row` reads them).
    static let eventColumns = """
        e.id, s.name, e.app_key, e.event, e.euid, e.time_ms, e.received_ms, e.install_id, coalesce(e.data, r.data, 'null'),
        (SELECT i.value FROM ma_identities i WHERE i.app_key = e.app_key AND i.euid = e.euid AND i.kind = 'user_id'
            ORDER BY i.seq LIMIT 1)
        FROM events e JOIN streams s ON s.id = e.stream LEFT JOIN records r ON r.stream = e.stream AND r.id = e.record_id
        """

    /// A page of events, newest first (`time_ms`, then `id`), at most `q.limit` rows and
    /// stopping after the row that brings the page's data to `maxBytes`.
    func searchEvents(_ q: EventQuery, maxBytes: Int = .max) throws(StoreError) -> [EventRow] {
        var sql = "SELECT " + Store.eventColumns + " WHERE 1 = 1"
        var args: [SQLBind] = []
        if let a = q.appKey {
            sql += " AND e.app_key = ?"
            args.append(.text(a))
        }
        if let s = q.stream {
            guard let id = try db.query("SELECT id FROM streams WHERE name = ?", [.text(s)]).first?.first?.int else { return [] }
            sql += " AND e.stream = ?"
            args.append(.int(id))
        }
        if let ev = q.event {
            sql += " AND e.event = ?"
            args.append(.text(ev))
        }
        if let u = q.euid {
            sql += " AND e.euid = ?"
            args.append(.text(u))
        }
        if let f = q.fromMs {
            sql += " AND e.time_ms >= ?"
            args.append(.int(f))
        }
        if let t = q.toMs {
            sql += " AND e.time_ms < ?"
            args.append(.int(t))
        }
        if let b = q.before {
            sql += " AND (e.time_ms, e.id) < (?, ?)"
            args.append(contentsOf: [.int(b.timeMs), .int(b.id)])
        }
        sql += " ORDER BY e.time_ms DESC, e.id DESC LIMIT ?"
        args.append(.int(Int64(q.limit)))
        var out: [EventRow] = []
        var bytes = 0
        for row in try db.query(sql, args) {
            let r = EventIndex.row(row)
            out.append(r)
            bytes += r.data.utf8.count
            if bytes >= maxBytes { break }
        }
        return out
    }

    /// Events indexed after `id` (arrival order), at most `limit`: what a live tail sends next.
    func eventsAfter(_ id: Int64, limit: Int) throws(StoreError) -> [EventRow] {
        try db.query("SELECT " + Store.eventColumns + " WHERE e.id > ? ORDER BY e.id LIMIT ?", [.int(id), .int(Int64(limit))])
            .map(EventIndex.row)
    }

    /// The newest event id (0 when none).
    func lastEventID() throws(StoreError) -> Int64 {
        try db.query("SELECT max(id) FROM events").first?.first?.int ?? 0
    }
}

/// The index's fixed rules and SQL.
enum EventIndex {
    /// Indexed `event` and `euid` values are cut at this many UTF-8 bytes (MA allows 256).
    static let maxFieldBytes = 256
    /// Largest page of `GET /v1/admin/events` (and the default is 50).
    static let maxPage = 500
    static let defaultPage = 50
    /// A page ends after the event that brings its data to this many bytes (`nextCursor` goes on).
    static let maxPageBytes = 8 << 20
    /// Rows per index `INSERT` at most.
    static let insertRows = 32
    /// The push plugin's open reports (one record per message, id = the message id).
    static let opensStream = "push.opens"

    /// Whether a batch of `stream` is applied even when every record was a duplicate (an
    /// open report's id is the message's, so a second device's open of it is one).
    static func appliesDuplicates(_ stream: String) -> Bool { stream == opensStream }

    /// The AppKey of stream `ma.<appKey>`, else "".
    static func appKey(ofStream s: String) -> String {
        s.hasPrefix("ma.") ? String(s.dropFirst(3)) : ""
    }

    /// A string field as indexed: "" for a non-string, cut at a NUL (PostgreSQL text holds
    /// none) and at `maxFieldBytes` on a character boundary.
    static func field(_ s: String?) -> String {
        guard var s else { return "" }
        if let nul = s.firstIndex(of: "\u{0}") { s = String(s[..<nul]) }
        guard s.utf8.count > maxFieldBytes else { return s }
        var out = ""
        for c in s {
            if out.utf8.count + c.utf8.count > maxFieldBytes { break }
            out.append(c)
        }
        return out
    }

    /// `?1` stream id, `?2` app key, `?3` received, `?4` install, `?5` js seq; then record id,
    /// event, euid, time and data of each row.
    static func insertSQL(rows n: Int) -> String {
        let values = (0..<n).map { r in
            let b = 6 + 5 * r
            return "(?1, ?\(b), ?2, ?\(b + 1), ?\(b + 2), ?\(b + 3), ?3, ?4, ?\(b + 4), ?5)"
        }
        return "INSERT INTO events (stream, record_id, app_key, event, euid, time_ms, received_ms, install_id, data, js_seq) VALUES "
            + values.joined(separator: ", ") + " ON CONFLICT DO NOTHING"
    }
    static let insertSQLByRows: [Int: String] = Dictionary(
        uniqueKeysWithValues: Store.insertRows.filter { $0 <= insertRows }.map { ($0, insertSQL(rows: $0)) })

    static func row(_ r: [SQLValue]) -> Store.EventRow {
        Store.EventRow(
            id: r[0].int ?? 0, stream: r[1].text ?? "", appKey: r[2].text ?? "", event: r[3].text ?? "", euid: r[4].text ?? "",
            userId: r[9].text, timeMs: r[5].int ?? 0, receivedMs: r[6].int ?? 0, installId: r[7].text ?? "", data: r[8].text ?? "null")
    }

    /// An event as the API answers it: `properties` is the record's `properties` member when it
    /// has one (MA events), else its whole `data`.
    static func json(_ r: Store.EventRow) -> JSON {
        let data = (try? JSON.parse(r.data, maxDepth: Limits.maxJSONDepth + 1)) ?? .null
        let properties = data["properties"] ?? data
        return [
            "id": .int(r.id), "stream": .string(r.stream), "appKey": .string(r.appKey), "event": .string(r.event),
            "euid": r.euid.isEmpty ? .null : .string(r.euid), "userId": r.userId.map(JSON.string) ?? .null,
            "timeMs": .int(r.timeMs), "receivedMs": .int(r.receivedMs), "installId": .string(r.installId), "properties": properties,
        ]
    }
}

extension EventIndex {
    /// What a batch published to JetStream adds to the index once acknowledged.
    struct Published {
        var records: [Store.IndexedRecord]
        var installId: String
    }
}

extension Principal {
    /// The install a device credential belongs to ("" for any other caller).
    var installId: String {
        if case .device(_, let installId) = self { return installId }
        return ""
    }
}
