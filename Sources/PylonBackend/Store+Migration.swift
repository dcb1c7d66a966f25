import PylonStore

/// The database format (SQLite: `PRAGMA user_version`; PostgreSQL: table `pylon_format`) and the
/// migration of older SQLite files at open.
///
/// - 0: earlier releases. `batches` keyed by its `key` text; each `records` row carried its
///   stream name and batch key as text.
/// - 1: `streams` names each stream once; `batches` and `records` refer to streams, and
///   records to their batch, by integer id (`Store.schema`).
/// - 2: `batches.device_id`, the device that sent the batch (NULL before, and for the
///   enrolment secret): added in place, no rows rewritten (`addBatchDevice`).
extension Store {
    /// The format this backend writes.
    static let format = 2

    /// Why `Store.init` failed.
    package enum OpenError: Error, CustomStringConvertible {
        case storage(StoreError)
        /// The database's format is newer than this backend's: it is left untouched.
        case newerFormat(Int)

        package var description: String {
            switch self {
            case .storage(let e): return e.description
            case .newerFormat(let v): return "database format \(v) is newer than this backend's (\(Store.format))"
            }
        }
    }

    /// The file's format (`PRAGMA user_version`; 0 for a new file).
    func storedFormat() throws(StoreError) -> Int {
        Int(try db.query("PRAGMA user_version").first?.first?.int ?? 0)
    }

    /// Brings a database written by an earlier release (`version` below `format`) to `format`,
    /// in one transaction, keeping every batch and record, each record's `seq`, and the point
    /// `seq` continues from (it keeps increasing after a reset). A new database has no tables
    /// yet and is left to `schema`.
    func migrate(from version: Int) throws(StoreError) {
        if version == 1 { try addBatchDevice() }
        guard version == 0, !(try db.query("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'records'")).isEmpty else {
            return
        }
        try transaction { () throws(StoreError) in
            // The old indexes go first: their names are the new tables' (and would follow the
            // renamed tables, so `schema`'s CREATE INDEX IF NOT EXISTS would skip them).
            try db.exec(
                """
                DROP INDEX IF EXISTS records_stream_seq;
                DROP INDEX IF EXISTS batches_stream;
                ALTER TABLE batches RENAME TO batches_v0;
                ALTER TABLE records RENAME TO records_v0;
                """)
            try db.exec(Store.schema)
            try db.exec(
                """
                INSERT INTO streams (name) SELECT stream FROM batches_v0 UNION SELECT stream FROM records_v0;
                INSERT INTO batches (key, stream, received_at, record_count, accepted)
                    SELECT b.key, s.id, b.received_at, b.record_count, b.accepted
                    FROM batches_v0 b JOIN streams s ON s.name = b.stream ORDER BY b.rowid;
                INSERT INTO records (seq, stream, id, ts, data, batch)
                    SELECT r.seq, s.id, r.id, r.ts, r.data, coalesce(b.id, 0)
                    FROM records_v0 r JOIN streams s ON s.name = r.stream LEFT JOIN batches b ON b.key = r.batch
                    ORDER BY r.seq;
                -- AUTOINCREMENT's high-water mark (ALTER TABLE renamed its row with the table).
                DELETE FROM sqlite_sequence WHERE name = 'records';
                UPDATE sqlite_sequence SET name = 'records' WHERE name = 'records_v0';
                DROP TABLE records_v0;
                DROP TABLE batches_v0;
                """)
            try db.exec("PRAGMA user_version = \(Store.format)")
        }
    }

    /// Format 1 → 2: `batches.device_id` (a nullable column: SQLite and PostgreSQL add it
    /// without rewriting the table). Skipped when the column is there.
    func addBatchDevice() throws(StoreError) {
        if db.dialect == .postgres {
            try db.exec(db.dialect.schema("ALTER TABLE batches ADD COLUMN IF NOT EXISTS device_id TEXT"))
            return
        }
        let columns = try db.query("PRAGMA table_info(batches)").compactMap { $0.count > 1 ? $0[1].text : nil }
        guard !columns.isEmpty, !columns.contains("device_id") else { return }
        try db.exec("ALTER TABLE batches ADD COLUMN device_id TEXT")
    }

    /// The advisory lock held while a backend creates or checks the PostgreSQL schema (two
    /// instances starting at once would otherwise race on `CREATE TABLE IF NOT EXISTS`).
    static let schemaLockKey = Store.lockKey("pylon-backend", "schema")

    /// Creates the PostgreSQL schema if absent (every table of `schemas`, in the PostgreSQL
    /// dialect) and records `format` in `pylon_format`; a database of a newer format is refused.
    func openPostgres() throws(OpenError) {
        var version = 0
        do throws(StoreError) {
            try db.lock([Store.schemaLockKey])
            defer { db.unlock([Store.schemaLockKey]) }
            try db.exec("CREATE TABLE IF NOT EXISTS pylon_format (version BIGINT NOT NULL)")
            version = Int(try db.query("SELECT max(version) FROM pylon_format").first?.first?.int ?? 0)
            if version <= Store.format {
                for s in Store.schemas { try db.exec(db.dialect.schema(s)) }
                if version == 1 { try addBatchDevice() }
                if version < Store.format {
                    try db.run("DELETE FROM pylon_format", [])
                    try db.run("INSERT INTO pylon_format (version) VALUES (?)", [.int(Int64(Store.format))])
                }
            }
        } catch {
            db.close()
            throw .storage(error)
        }
        if version > Store.format {
            db.close()
            throw .newerFormat(version)
        }
    }
}
