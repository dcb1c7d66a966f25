import PylonStore

/// The database format (`PRAGMA user_version`) and the migration of older files at open.
///
/// - 0: earlier releases. `batches` keyed by its `key` text; each `records` row carried its
///   stream name and batch key as text.
/// - 1: `streams` names each stream once; `batches` and `records` refer to streams, and
///   records to their batch, by integer id (`Store.schema`).
extension Store {
    /// The format this backend writes.
    static let format = 1

    /// Why `Store.init` failed.
    package enum OpenError: Error, CustomStringConvertible {
        case sqlite(SQLiteError)
        /// The file's format is newer than this backend's: it is left untouched.
        case newerFormat(Int)

        package var description: String {
            switch self {
            case .sqlite(let e): return e.description
            case .newerFormat(let v): return "database format \(v) is newer than this backend's (\(Store.format))"
            }
        }
    }

    /// The file's format (`PRAGMA user_version`; 0 for a new file).
    func storedFormat() throws(SQLiteError) -> Int {
        Int(try db.query("PRAGMA user_version").first?.first?.int ?? 0)
    }

    /// Brings a database written by an earlier release (`version` below `format`) to `format`,
    /// in one transaction, keeping every batch and record, each record's `seq`, and the point
    /// `seq` continues from (it keeps increasing after a reset). A new database has no tables
    /// yet and is left to `schema`.
    func migrate(from version: Int) throws(SQLiteError) {
        guard version == 0, !(try db.query("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'records'")).isEmpty else {
            return
        }
        try db.transaction { () throws(SQLiteError) in
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
}
