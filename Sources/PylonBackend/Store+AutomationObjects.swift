import PylonCore
import PylonStore

/// What automation's steps read besides the journeys (docs/AUTOMATION.md): the events a user
/// recorded after a trigger (branches on "did event Y since the trigger", exit events), and the
/// journey's `step` column added in place to a database created before steps had one.
extension Store {
    static let automationObjectsSchema = ""

    static let automationObjectsReset = ""

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
}
