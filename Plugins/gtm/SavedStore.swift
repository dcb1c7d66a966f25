import PylonCore
import PylonStore

/// Saved containers (the last network copy of each id, with its fetch time and ETag) in
/// `<stateDir>/gtm.db`, and data-layer values persisted through `gtm.lifetime` in
/// `<stateDir>/gtm.lifetime` (`LifetimeLog`), each under its owner (`Owner.key`): one owner's
/// copy or values are never another's.
final class SavedStore {
    let db: Database
    let lifetime: LifetimeLog

    struct Saved {
        let body: String
        let version: String
        let etag: String?
        let fetchedAtMs: Int64
    }

    /// Opens `gtm.db` at `path` and the lifetime log beside it (`lifetimePath`, default
    /// `gtm.lifetime` in the same directory), migrating `owned_lifetime` rows into the log.
    init(path: String, lifetimePath: String? = nil, nowMs: Int64 = System.wallClockMs()) throws(SQLiteError) {
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
        let dir = path.split(separator: "/", omittingEmptySubsequences: false).dropLast().joined(separator: "/")
        let lpath = lifetimePath ?? (dir.isEmpty ? "." : dir) + "/gtm.lifetime"
        do throws(IOError) {
            try Self.migrateLifetime(db, to: lpath)
            lifetime = try LifetimeLog(path: lpath, nowMs: nowMs)
        } catch {
            db.close()
            throw SQLiteError(code: 10, message: "\(lpath): \(error.description)")  // SQLITE_IOERR
        }
    }

    /// Rows of `owned_lifetime` (releases before the log), in write order, into a new log
    /// renamed over `path`; then the rows are deleted. A crash in between migrates again (the
    /// log is rebuilt from the rows; nothing was appended to it meanwhile).
    static func migrateLifetime(_ db: Database, to path: String) throws(IOError) {
        let rows = (try? db.query("SELECT owner, key, value, expires_at FROM owned_lifetime ORDER BY rowid")) ?? []
        guard !rows.isEmpty else { return }
        var file = LifetimeLog.magic
        for (i, r) in rows.enumerated() {
            guard let o = r[0].text, let k = r[1].text, let v = r[2].text, let e = r[3].int else { continue }
            AppendLog.frame(LifetimeLog.setFrame(o, k, .init(text: v, expiresAtMs: e, order: i)), into: &file)
        }
        try System.writeFileAtomically(atPath: path, contents: file)
        do throws(SQLiteError) { try db.exec("DELETE FROM owned_lifetime") } catch {
            throw IOError(errnoCode: 5, reason: "gtm.db: cannot clear the migrated lifetime values (\(error.description))")  // EIO
        }
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

    /// Unexpired persisted values, each with its owner key, in write order.
    func lifetimeValues(nowMs: Int64) throws(SQLiteError) -> [(String, String, JSON)] {
        lifetime.all.compactMap { o, k, v in (try? JSON.parse(v)).map { (o, k, $0) } }
    }

    /// Persists `owner`'s entries (one frame appended to `gtm.lifetime`); past `maxEntries` for
    /// that owner its soonest-expiring go first (another owner's values are never touched).
    func persist(_ owner: Owner, _ entries: [(String, JSON)], expiresAtMs: Int64, maxEntries: Int) throws(IOError) {
        try lifetime.persist(owner.key, entries.map { ($0.0, $0.1.serialized) }, expiresAtMs: expiresAtMs, maxEntries: maxEntries)
    }
}
