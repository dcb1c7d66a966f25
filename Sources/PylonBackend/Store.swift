import PylonStore

#if canImport(Glibc)
import Glibc
#endif

/// The backend's SQLite storage (WAL mode where the database is a file).
///
/// Tables: `streams` (an integer id per stream name), `batches` (one row per idempotency key
/// ever accepted), `records` (one row per distinct `(stream, id)`, in arrival order by `seq`,
/// referring to its stream and batch by integer id) and `counters` (duplicate counts per stream).
/// Every ingest is one transaction, so a batch is stored entirely or not at all. The format is
/// numbered in `PRAGMA user_version` (`Store.format`); older files are migrated at open
/// (`Store+Migration.swift`). The MA tables are in `Store+MA.swift`.
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

    /// The ingest tables. A record carries its stream and batch as integers, not their names:
    /// each of its three B-trees (rowid, `(stream, id)` for dedup, `(stream, seq)` for paging a
    /// stream) then holds and compares an integer where a name was.
    static let schema = """
        CREATE TABLE IF NOT EXISTS streams (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL UNIQUE
        );
        CREATE TABLE IF NOT EXISTS batches (
            id INTEGER PRIMARY KEY,
            key TEXT NOT NULL UNIQUE,
            stream INTEGER NOT NULL,
            received_at INTEGER NOT NULL,
            record_count INTEGER NOT NULL,
            accepted INTEGER NOT NULL
        );
        CREATE INDEX IF NOT EXISTS batches_stream ON batches(stream);
        CREATE TABLE IF NOT EXISTS records (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            stream INTEGER NOT NULL,
            id TEXT NOT NULL,
            ts INTEGER NOT NULL,
            data TEXT NOT NULL,
            batch INTEGER NOT NULL,
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
    /// tightened too. A file written by an earlier release is migrated (`migrate(from:)`); one
    /// of a newer format is refused.
    package init(path: String) throws(OpenError) {
        let inMemory = path == ":memory:" || path.isEmpty
        let saved = umask(0o077)  // single-threaded here: nothing else creates files meanwhile
        defer { umask(saved) }
        do throws(SQLiteError) {
            db = try Database(path: path)
        } catch {
            throw .sqlite(error)
        }
        if !inMemory {
            for f in [path, path + "-wal", path + "-shm"] { _ = chmod(f, Store.fileMode) }
        }
        var version = 0
        do throws(SQLiteError) {
            try db.exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;")
            version = try storedFormat()
            if version <= Store.format {
                try migrate(from: version)
                try db.exec(Store.schema)
                try db.exec("PRAGMA user_version = \(Store.format)")
                try db.exec(Store.maSchema)
                try db.exec(Store.pushSchema)
                try db.exec(Store.gtmSchema)
                try db.exec(Store.devicesSchema)
            }
        } catch {
            db.close()
            throw .sqlite(error)
        }
        if version > Store.format {
            db.close()
            throw .newerFormat(version)
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
            let stream = try streamID(batch.stream)
            try db.run(
                "INSERT INTO batches (key, stream, received_at, record_count, accepted) VALUES (?, ?, ?, ?, 0)",
                [.text(batch.key), .int(stream), .int(receivedAt), .int(Int64(batch.records.count))])
            let batchID = db.lastInsertRowID
            let accepted = try insertRecords(batch, stream: stream, batchID: batchID)
            let duplicates = batch.records.count - accepted
            try db.run("UPDATE batches SET accepted = ? WHERE id = ?", [.int(Int64(accepted)), .int(batchID)])
            if duplicates > 0 { try bump(batch.stream, "duplicateRecords", duplicates) }
            return IngestResult(accepted: accepted, duplicates: duplicates, duplicateBatch: false)
        }
    }

    /// Rows per `INSERT` statement, largest first: a batch is stored in as few statements as
    /// these sizes add up to. One statement per record cost twice the CPU per record of one per
    /// 64 (SQLite's per-statement work, `AUTOINCREMENT`'s `sqlite_sequence` read and write
    /// included, is paid once per statement).
    static let insertRows = [64, 32, 16, 8, 4, 2, 1]

    /// The `INSERT` of `n` records: `?1` the stream id, `?2` the batch id, then id, ts and data
    /// of each record.
    static func insertSQL(rows n: Int) -> String {
        let values = (0..<n).map { r in "(?1, ?\(3 + 3 * r), ?\(4 + 3 * r), ?\(5 + 3 * r), ?2)" }
        return "INSERT OR IGNORE INTO records (stream, id, ts, data, batch) VALUES " + values.joined(separator: ", ")
    }
    static let insertSQLByRows: [Int: String] = Dictionary(uniqueKeysWithValues: insertRows.map { ($0, insertSQL(rows: $0)) })

    /// Inserts the records (in order; a repeated `(stream, id)` is ignored), binding ids and
    /// data straight from the batch's bytes. Returns how many were stored.
    private func insertRecords(_ batch: Batch, stream: Int64, batchID: Int64) throws(SQLiteError) -> Int {
        let stored: Result<Int, SQLiteError> = batch.text.withUnsafeBytes { t in
            do throws(SQLiteError) {
                var stored = 0
                var next = 0
                while next < batch.records.count {
                    let rows = Store.insertRows.first { $0 <= batch.records.count - next }!
                    let ins = try db.prepare(Store.insertSQLByRows[rows]!)
                    try ins.bindInt(1, stream)
                    try ins.bindInt(2, batchID)
                    for (r, record) in batch.records[next..<(next + rows)].enumerated() {
                        let p = Int32(3 + 3 * r)
                        try ins.bindText(p, t, record.id)
                        try ins.bindInt(p + 1, record.ts)
                        if let d = record.data { try ins.bindText(p + 2, t, d) } else { try ins.bindText(p + 2, string: "null") }
                    }
                    while try ins.step() {}
                    stored += db.changes
                    next += rows
                }
                return .success(stored)
            } catch {
                return .failure(error)
            }
        }
        return try stored.get()
    }

    /// The id of stream `name`, created when new.
    private func streamID(_ name: String) throws(SQLiteError) -> Int64 {
        if let id = try db.query("SELECT id FROM streams WHERE name = ?", [.text(name)]).first?.first?.int { return id }
        try db.run("INSERT INTO streams (name) VALUES (?)", [.text(name)])
        return db.lastInsertRowID
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
            records: try scalar("SELECT count(*) FROM records WHERE stream = (SELECT id FROM streams WHERE name = ?)", [s]),
            batches: try scalar("SELECT count(*) FROM batches WHERE stream = (SELECT id FROM streams WHERE name = ?)", [s]),
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

    /// A page of a stream's records (read through `records_stream_seq`).
    static let pageSQL = """
        SELECT seq, id, ts, data FROM records WHERE stream = (SELECT id FROM streams WHERE name = ?) AND seq > ?
        ORDER BY seq LIMIT ?
        """

    /// Up to `limit` records of `stream` with `seq > after`, in arrival order.
    /// Up to `limit` records after `after`, stopping after the one that brings the page's ids
    /// and data to `maxBytes` (at least one record).
    func records(stream: String, after: Int64, limit: Int, maxBytes: Int = .max) throws(SQLiteError) -> [StoredRecord] {
        let s = try db.prepare(Store.pageSQL)
        try s.bind([.text(stream), .int(after), .int(Int64(limit))])
        defer { s.reset() }
        var out: [StoredRecord] = []
        var bytes = 0
        while try s.step() {
            let r = StoredRecord(seq: s.int(0), id: s.text(1), ts: s.int(2), data: s.value(3).text ?? "null")
            out.append(r)
            bytes += r.id.utf8.count + r.data.utf8.count
            if bytes >= maxBytes { break }
        }
        return out
    }

    /// Deletes everything.
    func reset() throws(SQLiteError) {
        try db.transaction { () throws(SQLiteError) in
            try db.exec("DELETE FROM records; DELETE FROM batches; DELETE FROM streams; DELETE FROM counters;")
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
