import PylonCore
import PylonStore

/// Automation's objects besides rules and journeys (docs/AUTOMATION.md):
///
/// - `automation_templates`: push templates a send step names by id; `definition` is the
///   template's JSON (`PushTemplate`), replaced by an edit (`version` counts edits).
/// - `automation_segments`: saved audiences (`Segment`), the same way.
///
/// And what steps read: the events a user recorded after a trigger (branches on "did event Y
/// since the trigger", exit events); the journey's `step` column, added in place to a database
/// created before steps had one.
extension Store {
    static let automationObjectsSchema = """
        CREATE TABLE IF NOT EXISTS automation_templates (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            name TEXT NOT NULL,
            definition TEXT NOT NULL,
            version INTEGER NOT NULL,
            actor TEXT NOT NULL,
            created_ms INTEGER NOT NULL,
            updated_ms INTEGER NOT NULL
        );
        CREATE TABLE IF NOT EXISTS automation_segments (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            name TEXT NOT NULL,
            app_key TEXT NOT NULL,
            definition TEXT NOT NULL,
            version INTEGER NOT NULL,
            actor TEXT NOT NULL,
            created_ms INTEGER NOT NULL,
            updated_ms INTEGER NOT NULL
        );
        """ + segmentSendSchema

    static let automationObjectsReset = """
        DELETE FROM automation_templates; DELETE FROM automation_segments;
        """ + segmentSendReset

    /// A stored template or segment: its definition as stored (JSON text).
    struct ObjectRow: Equatable {
        var id: Int64
        var name: String
        var definition: String
        var version: Int64
        var actor: String
        var createdMs: Int64
        var updatedMs: Int64
    }

    /// The two object tables.
    enum AutomationObject: String {
        case template = "automation_templates"
        case segment = "automation_segments"
    }

    func automationObjectCount(_ kind: AutomationObject) throws(StoreError) -> Int64 {
        try db.query("SELECT count(*) FROM \(kind.rawValue)").first?.first?.int ?? 0
    }

    /// Inserts an object (`appKey`: a segment's) and answers its id.
    func createAutomationObject(
        _ kind: AutomationObject, name: String, appKey: String?, definition: String, actor: String, now: Int64
    ) throws(StoreError) -> Int64 {
        let extra = kind == .segment ? ", app_key" : ""
        var args: [SQLBind] = [.text(name), .text(definition), .text(actor), .int(now), .int(now)]
        if kind == .segment { args.append(.text(appKey ?? "")) }
        guard
            let id = try db.query(
                """
                INSERT INTO \(kind.rawValue) (name, definition, version, actor, created_ms, updated_ms\(extra))
                VALUES (?, ?, 1, ?, ?, ?\(kind == .segment ? ", ?" : "")) RETURNING id
                """, args
            ).first?.first?.int
        else { throw .postgres(sqlstate: "XX000", message: "no id for the new \(kind)") }
        return id
    }

    /// Replaces an object's definition; false when there is no such object.
    func updateAutomationObject(
        _ kind: AutomationObject, _ id: Int64, name: String, appKey: String?, definition: String, actor: String, now: Int64
    ) throws(StoreError) -> Bool {
        var sql = "UPDATE \(kind.rawValue) SET name = ?, definition = ?, version = version + 1, actor = ?, updated_ms = ?"
        var args: [SQLBind] = [.text(name), .text(definition), .text(actor), .int(now)]
        if kind == .segment {
            sql += ", app_key = ?"
            args.append(.text(appKey ?? ""))
        }
        args.append(.int(id))
        return try db.run(sql + " WHERE id = ?", args) == 1
    }

    func automationObject(_ kind: AutomationObject, _ id: Int64) throws(StoreError) -> ObjectRow? {
        try db.query(
            "SELECT id, name, definition, version, actor, created_ms, updated_ms FROM \(kind.rawValue) WHERE id = ?", [.int(id)]
        ).first.map(Store.objectRow)
    }

    /// Objects by id after the cursor `after`.
    func automationObjects(_ kind: AutomationObject, after: Int64, limit: Int) throws(StoreError) -> [ObjectRow] {
        try db.query(
            """
            SELECT id, name, definition, version, actor, created_ms, updated_ms FROM \(kind.rawValue) WHERE id > ?
            ORDER BY id LIMIT ?
            """, [.int(after), .int(Int64(limit))]
        ).map(Store.objectRow)
    }

    static func objectRow(_ r: [SQLValue]) -> ObjectRow {
        ObjectRow(
            id: r[0].int ?? 0, name: r[1].text ?? "", definition: r[2].text ?? "{}", version: r[3].int ?? 0, actor: r[4].text ?? "",
            createdMs: r[5].int ?? 0, updatedMs: r[6].int ?? 0)
    }

    /// Adds `automation_journeys.step` to a database made before it existed (a nullable-free
    /// column with a default: SQLite and PostgreSQL add it without rewriting rows).
    func ensureAutomationStepColumn() throws(StoreError) {
        if db.dialect == .postgres {
            try db.exec("ALTER TABLE automation_journeys ADD COLUMN IF NOT EXISTS step BIGINT NOT NULL DEFAULT 0")
            return
        }
        let columns = try db.query("PRAGMA table_info(automation_journeys)").compactMap { $0.count > 1 ? $0[1].text : nil }
        guard !columns.isEmpty, !columns.contains("step") else { return }
        try db.exec("ALTER TABLE automation_journeys ADD COLUMN step INTEGER NOT NULL DEFAULT 0")
    }

    /// The properties of the events named `event` the user recorded after the index row
    /// `afterId` (the trigger), oldest first, at most `AutomationLimits.eventsSinceRead`.
    func automationEventsSince(appKey: String, euid: String, event: String, afterId: Int64) throws(StoreError) -> [JSON] {
        try db.query(
            """
            SELECT coalesce(e.data, r.data, 'null') FROM events e LEFT JOIN records r ON r.stream = e.stream AND r.id = e.record_id
            WHERE e.app_key = ? AND e.euid = ? AND e.event = ? AND e.id > ? ORDER BY e.id LIMIT ?
            """, [.text(appKey), .text(euid), .text(event), .int(afterId), .int(Int64(AutomationLimits.eventsSinceRead))]
        ).map { row in
            let data = (try? JSON.parse(row[0].text ?? "null", maxDepth: Limits.maxJSONDepth + 1)) ?? .null
            return data["properties"] ?? .object([:])
        }
    }

    /// Journeys newest first, before the cursor `before`, filtered by rule, user and AppKey, as
    /// the API answers them (`GET /v1/admin/automation/journeys`).
    func automationJourneys(rule: Int64?, euid: String?, appKey: String?, before: Int64, limit: Int) throws(StoreError) -> [JSON] {
        var sql = """
            SELECT id, rule_id, version, app_key, euid, state, step, due_ms, entered_ms, sent_ms, msg_id, reason, event_id
            FROM automation_journeys WHERE id < ?
            """
        var args: [SQLBind] = [.int(before)]
        for (column, value) in [
            ("rule_id", rule.map { SQLBind.int($0) }), ("euid", euid.map { .text($0) }), ("app_key", appKey.map { .text($0) }),
        ] {
            guard let value else { continue }
            sql += " AND \(column) = ?"
            args.append(value)
        }
        sql += " ORDER BY id DESC LIMIT ?"
        args.append(.int(Int64(limit)))
        return try db.query(sql, args).map { r in
            [
                "id": .int(r[0].int ?? 0), "ruleId": .int(r[1].int ?? 0), "version": .int(r[2].int ?? 0),
                "appKey": .string(r[3].text ?? ""),
                "user": .string(r[4].text ?? ""), "state": .string(r[5].text ?? ""), "step": .int(r[6].int ?? 0),
                "dueMs": .int(r[7].int ?? 0), "enteredMs": .int(r[8].int ?? 0), "sentMs": r[9].int.map(JSON.int) ?? .null,
                "msgId": r[10].text.map(JSON.string) ?? .null, "reason": r[11].text.map(JSON.string) ?? .null,
                "eventId": .int(r[12].int ?? 0),
            ]
        }
    }
}
