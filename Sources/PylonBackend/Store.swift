import PylonStore

#if canImport(Glibc)
import Glibc
#endif

/// The backend's SQLite storage (WAL mode where the database is a file).
///
/// Tables: `batches` (one row per idempotency key ever accepted), `records` (one row per
/// distinct `(stream, id)`, in arrival order by rowid) and `counters` (duplicate counts per
/// stream). Every ingest is one transaction, so a batch is stored entirely or not at all.
/// The MA tables are in `Store+MA.swift`.
package final class Store {
    let db: Database

    struct IngestResult: Equatable {
        var accepted: Int
        var duplicates: Int
        var duplicateBatch: Bool
    }

    struct StreamSummary: Equatable {
        var records: Int64
        var batches: Int64
        var duplicateRecords: Int64
        var duplicateBatches: Int64
    }

    struct StoredRecord {
        var seq: Int64
        var id: String
        var ts: Int64
        var data: String
    }

    static let schema = """
        CREATE TABLE IF NOT EXISTS batches (
            key TEXT PRIMARY KEY,
            stream TEXT NOT NULL,
            received_at INTEGER NOT NULL,
            record_count INTEGER NOT NULL,
            accepted INTEGER NOT NULL
        );
        CREATE INDEX IF NOT EXISTS batches_stream ON batches(stream);
        CREATE TABLE IF NOT EXISTS records (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            stream TEXT NOT NULL,
            id TEXT NOT NULL,
            ts INTEGER NOT NULL,
            data TEXT NOT NULL,
            batch TEXT NOT NULL,
            UNIQUE (stream, id)
        );
        -- Paging a stream's records (seq order) without sorting the whole stream per page.
        CREATE INDEX IF NOT EXISTS records_stream_seq ON records(stream, seq);
        CREATE TABLE IF NOT EXISTS counters (
            stream TEXT NOT NULL,
            name TEXT NOT NULL,
            value INTEGER NOT NULL,
            PRIMARY KEY (stream, name)
        );
        """

    /// Permission bits of the database file and of its `-wal` and `-shm` files: the data is
    /// the clients', so only the backend's user may read it.
    static let fileMode: mode_t = 0o600

    /// Opens (creating) the database at `path` and its schema. The file is created owner-only
    /// (umask 077 around the open) and tightened to `fileMode` if it already existed; SQLite
    /// creates `-wal` and `-shm` with the database file's mode, and any left from before are
    /// tightened too.
    package init(path: String) throws(SQLiteError) {
        let inMemory = path == ":memory:" || path.isEmpty
        let saved = umask(0o077)  // single-threaded here: nothing else creates files meanwhile
        defer { umask(saved) }
        db = try Database(path: path)
        if !inMemory {
            for f in [path, path + "-wal", path + "-shm"] { _ = chmod(f, Store.fileMode) }
        }
        do throws(SQLiteError) {
            try db.exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;")
            try db.exec(Store.schema)
            try db.exec(Store.maSchema)
            try db.exec(Store.pushSchema)
            try db.exec(Store.gtmSchema)
        } catch {
            db.close()
            throw error
        }
    }

    package func close() { db.close() }

    /// Runs `body` as one transaction (see `Database.transaction`).
    func transaction<T>(_ body: () throws(SQLiteError) -> T) throws(SQLiteError) -> T {
        try db.transaction(body)
    }

    /// Stores a batch idempotently, in one transaction. A key seen before stores nothing and
    /// counts one duplicate batch; a record id already stored for the stream (or repeated in
    /// the batch) is dropped and counted as a duplicate record.
    func ingest(_ batch: Batch, receivedAt: Int64) throws(SQLiteError) -> IngestResult {
        try db.transaction { () throws(SQLiteError) -> IngestResult in
            if !(try db.query("SELECT 1 FROM batches WHERE key = ?", [.text(batch.key)])).isEmpty {
                try bump(batch.stream, "duplicateBatches", 1)
                return IngestResult(accepted: 0, duplicates: batch.records.count, duplicateBatch: true)
            }
            var accepted = 0
            // One cached statement for the whole batch (Database.prepare caches by SQL text).
            let ins = try db.prepare("INSERT OR IGNORE INTO records (stream, id, ts, data, batch) VALUES (?, ?, ?, ?, ?)")
            let inserted: Result<Int, SQLiteError> = batch.text.withUnsafeBytes { t in
                do throws(SQLiteError) {
                    var n = 0
                    for r in batch.records {
                        ins.reset()
                        try ins.bindText(1, string: batch.stream)
                        try ins.bindText(2, t, r.id)
                        try ins.bindInt(3, r.ts)
                        if let d = r.data { try ins.bindText(4, t, d) } else { try ins.bindText(4, string: "null") }
                        try ins.bindText(5, string: batch.key)
                        _ = try ins.step()
                        n += db.changes
                    }
                    return .success(n)
                } catch {
                    return .failure(error)
                }
            }
            accepted = try inserted.get()
            let duplicates = batch.records.count - accepted
            try db.run(
                "INSERT INTO batches (key, stream, received_at, record_count, accepted) VALUES (?, ?, ?, ?, ?)",
                [
                    .text(batch.key), .text(batch.stream), .int(receivedAt), .int(Int64(batch.records.count)),
                    .int(Int64(accepted)),
                ])
            if duplicates > 0 { try bump(batch.stream, "duplicateRecords", duplicates) }
            return IngestResult(accepted: accepted, duplicates: duplicates, duplicateBatch: false)
        }
    }

    private func bump(_ stream: String, _ name: String, _ by: Int) throws(SQLiteError) {
        try db.run(
            """
            INSERT INTO counters (stream, name, value) VALUES (?, ?, ?)
            ON CONFLICT (stream, name) DO UPDATE SET value = value + excluded.value
            """, [.text(stream), .text(name), .int(Int64(by))])
    }

    /// Counts for one stream (all zero for a stream never seen).
    func summary(stream: String) throws(SQLiteError) -> StreamSummary {
        let s = SQLValue.text(stream)
        return StreamSummary(
            records: try scalar("SELECT count(*) FROM records WHERE stream = ?", [s]),
            batches: try scalar("SELECT count(*) FROM batches WHERE stream = ?", [s]),
            duplicateRecords: try scalar(
                "SELECT coalesce(sum(value), 0) FROM counters WHERE stream = ? AND name = 'duplicateRecords'", [s]),
            duplicateBatches: try scalar(
                "SELECT coalesce(sum(value), 0) FROM counters WHERE stream = ? AND name = 'duplicateBatches'", [s]))
    }

    /// Counts over every stream.
    func totals() throws(SQLiteError) -> StreamSummary {
        StreamSummary(
            records: try scalar("SELECT count(*) FROM records"),
            batches: try scalar("SELECT count(*) FROM batches"),
            duplicateRecords: try scalar("SELECT coalesce(sum(value), 0) FROM counters WHERE name = 'duplicateRecords'"),
            duplicateBatches: try scalar("SELECT coalesce(sum(value), 0) FROM counters WHERE name = 'duplicateBatches'"))
    }

    /// Up to `limit` records of `stream` with `seq > after`, in arrival order.
    func records(stream: String, after: Int64, limit: Int) throws(SQLiteError) -> [StoredRecord] {
        try db.query(
            "SELECT seq, id, ts, data FROM records WHERE stream = ? AND seq > ? ORDER BY seq LIMIT ?",
            [.text(stream), .int(after), .int(Int64(limit))]
        ).map { row in
            StoredRecord(seq: row[0].int ?? 0, id: row[1].text ?? "", ts: row[2].int ?? 0, data: row[3].text ?? "null")
        }
    }

    /// Deletes everything.
    func reset() throws(SQLiteError) {
        try db.transaction { () throws(SQLiteError) in
            try db.exec("DELETE FROM records; DELETE FROM batches; DELETE FROM counters;")
            try db.exec(Store.maReset)
            try db.exec(Store.pushReset)
            try db.exec("DELETE FROM gtm_versions; DELETE FROM gtm_containers;")
        }
    }

    private func scalar(_ sql: String, _ args: [SQLValue] = []) throws(SQLiteError) -> Int64 {
        try db.query(sql, args).first?.first?.int ?? 0
    }
}

extension Statement {
    /// Binds bytes `r` of `t` as text at 1-based `index` (copied by SQLite).
    func bindText(_ index: Int32, _ t: UnsafeRawBufferPointer, _ r: Range<Int>) throws(SQLiteError) {
        try bindText(index, (t.baseAddress! + r.lowerBound).assumingMemoryBound(to: CChar.self), Int32(r.count))
    }
}
