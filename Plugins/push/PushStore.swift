import PylonPluginKit
import PylonStore

/// The plugin's SQLite state (`push.db` in its state directory, WAL):
///
/// - `kv`: install id, device token, bound user.
/// - `inbox`, `seen`: empty since the inbox and its dedup keys moved to `push.inbox`
///   (`PushInbox`, migrated from these tables at the first start).
/// - `opens`: message ids whose open was handed to the uploader (idempotent reports).
/// - `apps`: the uid that owns each appId, and the client currently attached with its callback.
/// - `activities`: Live Activity bindings that succeeded, with the declared schema.
final class PushStore {
    let db: Database
    let maxSeen: Int

    init(path: String, maxSeen: Int) throws(SQLiteError) {
        db = try Database(path: path)
        self.maxSeen = maxSeen
        try db.exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;")
        try db.exec(
            """
            CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
            CREATE TABLE IF NOT EXISTS inbox (
                id TEXT PRIMARY KEY, app_id TEXT NOT NULL, seq INTEGER NOT NULL, payload TEXT NOT NULL,
                bytes INTEGER NOT NULL, expires_at INTEGER NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
                cold INTEGER NOT NULL);
            CREATE TABLE IF NOT EXISTS seen (n INTEGER PRIMARY KEY AUTOINCREMENT, app_id TEXT NOT NULL, key TEXT NOT NULL,
                UNIQUE (app_id, key));
            CREATE TABLE IF NOT EXISTS opens (id TEXT PRIMARY KEY);
            CREATE TABLE IF NOT EXISTS apps (app_id TEXT PRIMARY KEY, uid INTEGER NOT NULL, client INTEGER, callback TEXT);
            CREATE TABLE IF NOT EXISTS activities (activity_id TEXT PRIMARY KEY, push_token TEXT NOT NULL,
                app_id TEXT NOT NULL, schema TEXT);
            """)
    }

    func get(_ key: String) -> String? {
        (try? db.query("SELECT value FROM kv WHERE key = ?", [.text(key)]))?.first?.first?.text
    }
    func set(_ key: String, _ value: String?) throws(SQLiteError) {
        if let value {
            try db.run("INSERT OR REPLACE INTO kv (key, value) VALUES (?, ?)", [.text(key), .text(value)])
        } else {
            try db.run("DELETE FROM kv WHERE key = ?", [.text(key)])
        }
    }

    func begin() { try? db.exec("BEGIN") }
    func commit() { try? db.exec("COMMIT") }

    func openReported(_ id: String) -> Bool { !((try? db.query("SELECT 1 FROM opens WHERE id = ?", [.text(id)])) ?? []).isEmpty }
    func markOpen(_ id: String) throws(SQLiteError) { try db.run("INSERT OR IGNORE INTO opens (id) VALUES (?)", [.text(id)]) }

    func appOwner(_ appId: String) -> Int64? {
        (try? db.query("SELECT uid FROM apps WHERE app_id = ?", [.text(appId)]))?.first?.first?.int
    }
    func setApp(_ appId: String, uid: Int64, client: Int64?, callback: String?) throws(SQLiteError) {
        try db.run(
            "INSERT OR REPLACE INTO apps (app_id, uid, client, callback) VALUES (?, ?, ?, ?)",
            [.text(appId), .int(uid), client.map { .int($0) } ?? .null, callback.map { .text($0) } ?? .null])
    }
    func attachments() -> [(appId: String, uid: Int64, client: Int64, callback: String)] {
        ((try? db.query("SELECT app_id, uid, client, callback FROM apps WHERE client IS NOT NULL")) ?? []).compactMap { r in
            guard let a = r[0].text, let u = r[1].int, let c = r[2].int, let cb = r[3].text else { return nil }
            return (a, u, c, cb)
        }
    }

    func saveActivity(_ id: String, pushToken: String, appId: String, schema: String?) throws(SQLiteError) {
        try db.run(
            "INSERT OR REPLACE INTO activities (activity_id, push_token, app_id, schema) VALUES (?, ?, ?, ?)",
            [.text(id), .text(pushToken), .text(appId), schema.map { .text($0) } ?? .null])
    }
    func activities() -> [(id: String, pushToken: String, appId: String, schema: String?)] {
        ((try? db.query("SELECT activity_id, push_token, app_id, schema FROM activities")) ?? []).map { r in
            (r[0].text ?? "", r[1].text ?? "", r[2].text ?? "", r[3].text)
        }
    }
}
