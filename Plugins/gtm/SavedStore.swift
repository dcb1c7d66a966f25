import PylonCore
import PylonStore

/// Saved containers (the last network copy of each id, with its fetch time and ETag) and
/// data-layer values persisted through `gtm.lifetime`, in `<stateDir>/gtm.db`, each row under
/// its owner (`Owner.key`): one owner's copy or values are never another's.
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
            DROP TABLE IF EXISTS containers;
            DROP TABLE IF EXISTS lifetime;
            CREATE TABLE IF NOT EXISTS owned_containers(owner TEXT NOT NULL, id TEXT NOT NULL, body TEXT NOT NULL,
                version TEXT NOT NULL, etag TEXT, fetched_at INTEGER NOT NULL, PRIMARY KEY(owner, id));
            CREATE TABLE IF NOT EXISTS owned_lifetime(owner TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
                expires_at INTEGER NOT NULL, PRIMARY KEY(owner, key));
            """)
    }

    func load(_ owner: Owner, _ id: String) throws(SQLiteError) -> Saved? {
        guard
            let r = try db.query(
                "SELECT body, version, etag, fetched_at FROM owned_containers WHERE owner = ? AND id = ?", [.text(owner.key), .text(id)]
            ).first
        else {
            return nil
        }
        return Saved(body: r[0].text ?? "", version: r[1].text ?? "", etag: r[2].text, fetchedAtMs: r[3].int ?? 0)
    }

    func save(_ owner: Owner, _ id: String, _ s: Saved) throws(SQLiteError) {
        try db.run(
            "INSERT OR REPLACE INTO owned_containers(owner, id, body, version, etag, fetched_at) VALUES (?, ?, ?, ?, ?, ?)",
            [.text(owner.key), .text(id), .text(s.body), .text(s.version), s.etag.map { .text($0) } ?? .null, .int(s.fetchedAtMs)])
    }

    func touch(_ owner: Owner, _ id: String, fetchedAtMs: Int64) throws(SQLiteError) {
        try db.run(
            "UPDATE owned_containers SET fetched_at = ? WHERE owner = ? AND id = ?", [.int(fetchedAtMs), .text(owner.key), .text(id)])
    }

    /// Unexpired persisted values, each with its owner key (expired rows are deleted).
    func lifetimeValues(nowMs: Int64) throws(SQLiteError) -> [(String, String, JSON)] {
        try db.run("DELETE FROM owned_lifetime WHERE expires_at <= ?", [.int(nowMs)])
        return try db.query("SELECT owner, key, value FROM owned_lifetime ORDER BY rowid").compactMap { r in
            guard let o = r[0].text, let k = r[1].text, let v = r[2].text, let j = try? JSON.parse(v) else { return nil }
            return (o, k, j)
        }
    }

    /// Persists `owner`'s entries; past `maxEntries` for that owner its soonest-expiring go
    /// first (another owner's rows are never touched).
    func persist(_ owner: Owner, _ entries: [(String, JSON)], expiresAtMs: Int64, maxEntries: Int) throws(SQLiteError) {
        try db.transaction { () throws(SQLiteError) in
            for (k, v) in entries {
                try db.run(
                    "INSERT OR REPLACE INTO owned_lifetime(owner, key, value, expires_at) VALUES (?, ?, ?, ?)",
                    [.text(owner.key), .text(k), .text(v.serialized), .int(expiresAtMs)])
            }
            try db.run(
                """
                DELETE FROM owned_lifetime WHERE owner = ?1 AND key IN (SELECT key FROM owned_lifetime WHERE owner = ?1
                    ORDER BY expires_at DESC LIMIT -1 OFFSET ?2)
                """, [.text(owner.key), .int(Int64(maxEntries))])
        }
    }
}
