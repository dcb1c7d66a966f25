import PylonCore
import PylonStore

/// Saved containers (the last network copy of each id, with its fetch time and ETag) and
/// data-layer values persisted through `gtm.lifetime`, in `<stateDir>/gtm.db`.
final class SavedStore {
    let db: Database

    struct Saved {
        let body: String
        let version: String
        let etag: String?
        let fetchedAtMs: Int64
    }

    init(path: String) throws(SQLiteError) {
        db = try Database(path: path)
        try db.exec(
            """
            PRAGMA journal_mode=WAL;
            CREATE TABLE IF NOT EXISTS containers(id TEXT PRIMARY KEY, body TEXT NOT NULL, version TEXT NOT NULL,
                etag TEXT, fetched_at INTEGER NOT NULL);
            CREATE TABLE IF NOT EXISTS lifetime(key TEXT PRIMARY KEY, value TEXT NOT NULL, expires_at INTEGER NOT NULL);
            """)
    }

    func load(_ id: String) throws(SQLiteError) -> Saved? {
        guard let r = try db.query("SELECT body, version, etag, fetched_at FROM containers WHERE id = ?", [.text(id)]).first else {
            return nil
        }
        return Saved(body: r[0].text ?? "", version: r[1].text ?? "", etag: r[2].text, fetchedAtMs: r[3].int ?? 0)
    }

    func save(_ id: String, _ s: Saved) throws(SQLiteError) {
        try db.run(
            "INSERT OR REPLACE INTO containers(id, body, version, etag, fetched_at) VALUES (?, ?, ?, ?, ?)",
            [.text(id), .text(s.body), .text(s.version), s.etag.map { .text($0) } ?? .null, .int(s.fetchedAtMs)])
    }

    func touch(_ id: String, fetchedAtMs: Int64) throws(SQLiteError) {
        try db.run("UPDATE containers SET fetched_at = ? WHERE id = ?", [.int(fetchedAtMs), .text(id)])
    }

    /// Unexpired persisted values (expired rows are deleted).
    func lifetimeValues(nowMs: Int64) throws(SQLiteError) -> [(String, JSON)] {
        try db.run("DELETE FROM lifetime WHERE expires_at <= ?", [.int(nowMs)])
        return try db.query("SELECT key, value FROM lifetime ORDER BY rowid").compactMap { r in
            guard let k = r[0].text, let v = r[1].text, let j = try? JSON.parse(v) else { return nil }
            return (k, j)
        }
    }

    func persist(_ entries: [(String, JSON)], expiresAtMs: Int64, maxEntries: Int) throws(SQLiteError) {
        try db.transaction { () throws(SQLiteError) in
            for (k, v) in entries {
                try db.run(
                    "INSERT OR REPLACE INTO lifetime(key, value, expires_at) VALUES (?, ?, ?)",
                    [.text(k), .text(v.serialized), .int(expiresAtMs)])
            }
            // Oldest-expiring entries go first when over the limit.
            try db.run(
                """
                DELETE FROM lifetime WHERE key IN (SELECT key FROM lifetime ORDER BY expires_at DESC LIMIT -1 OFFSET ?)
                """, [.int(Int64(maxEntries))])
        }
    }
}
