import PylonCore
import PylonStore

#if canImport(Glibc)
import Glibc
#endif

/// The backend's storage, on one of two SQL engines behind one interface (`SQLEngine`): the
/// embedded SQLite file (the default, WAL mode where the database is a file) or a shared
/// PostgreSQL database several backend instances use at once (`--db postgresql://…`,
/// docs/FLEET.md). The SQL below is written once for both; `SQLDialect` names what differs.
///
/// Tables: `streams` (an integer id per stream name), `batches` (one row per idempotency key
/// ever accepted, with the device that sent it), `records` (one row per distinct `(stream, id)`, in arrival order by `seq`,
/// referring to its stream and batch by integer id) and `counters` (duplicate counts per stream).
/// Every ingest is one transaction, so a batch is stored entirely or not at all. The format is
/// numbered (`Store.format`: SQLite's `PRAGMA user_version`, PostgreSQL's `pylon_format`); older
/// SQLite files are migrated at open (`Store+Migration.swift`). The MA tables are in
/// `Store+MA.swift`.
package final class Store {
    let db: any SQLEngine
    /// Nesting depth of `transaction` (an inner call joins the outer transaction).
    private var depth = 0
    /// Request transactions run again after a conflict (PostgreSQL), since the start.
    private(set) var conflictRetries = 0

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
        /// The device that sent its batch (`batches.device_id`; nil: the enrolment secret).
        var deviceId: String? = nil
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
            accepted INTEGER NOT NULL,
            device_id TEXT
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

    /// Every table, in the order they are created (`schema` of each part).
    static var schemas: [String] {
        [schema, maSchema, pushSchema, gtmSchema, devicesSchema, dataSchema, consoleSchema, enrolmentSchema]
    }

    /// Permission bits of the database file and of its `-wal` and `-shm` files: the data is
    /// the clients', so only the backend's user may read it.
    static let fileMode: mode_t = 0o600

    /// Opens the store `location` names: a PostgreSQL connection string
    /// (`postgresql://…` or `postgres://…`), else a SQLite path (`:memory:` for none).
    package static func open(
        _ location: String, statementTimeoutMs: Int = StoreLimits.defaultStatementTimeoutMs
    ) throws(OpenError) -> Store {
        if isPostgres(location) { return try Store(postgres: location, statementTimeoutMs: statementTimeoutMs) }
        return try Store(path: location)
    }

    package static func isPostgres(_ location: String) -> Bool {
        location.hasPrefix("postgresql://") || location.hasPrefix("postgres://")
    }

    /// `location` as it may be logged (a connection string without its password).
    package static func redacted(_ location: String) -> String {
        isPostgres(location) ? PostgresEngine.redacted(location) : location
    }

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
            db = SQLiteEngine(try Database(path: path))
        } catch {
            throw .storage(.sqlite(error))
        }
        if !inMemory {
            for f in [path, path + "-wal", path + "-shm"] { _ = chmod(f, Store.fileMode) }
        }
        var version = 0
        do throws(StoreError) {
            try db.exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;")
            version = try storedFormat()
            if version <= Store.format {
                try migrate(from: version)
                try db.exec(Store.schema)
                try db.exec("PRAGMA user_version = \(Store.format)")
                for s in Store.schemas.dropFirst() { try db.exec(s) }
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

    /// Connects to PostgreSQL and creates the schema if absent (`openPostgres`).
    package init(postgres url: String, statementTimeoutMs: Int = StoreLimits.defaultStatementTimeoutMs) throws(OpenError) {
        do throws(StoreError) {
            db = try PostgresEngine(url: url, statementTimeoutMs: statementTimeoutMs)
        } catch {
            throw .storage(error)
        }
        try openPostgres()
    }

    package func close() { db.close() }

    /// PostgreSQL: from now on reconnect in the background on `loop` (`PostgresEngine`).
    package func reconnect(on loop: Loop) { (db as? PostgresEngine)?.reconnect(on: loop) }

    /// `database` in `/v1/inspect/stats` (PostgreSQL only): connected, reconnects made, tried.
    var engineStatsJSON: JSON? {
        guard let pg = db as? PostgresEngine else { return nil }
        return [
            "connected": .bool(pg.isConnected), "reconnects": .int(Int64(pg.reconnects)),
            "reconnectAttempts": .int(Int64(pg.reconnectAttempts)),
        ]
    }

    /// Runs `body` as one transaction, at `isolation` (PostgreSQL), holding the advisory locks
    /// `locking` (PostgreSQL; taken in ascending order before the transaction starts, so two
    /// requests on the same keys run one after the other and the second sees the first's
    /// commit). A conflict (`StoreError.isConflict`: 40001, 40P01, 23505) rolls back and runs
    /// `body` again, at most `StoreLimits.maxTransactionAttempts` times, then answers `.busy`:
    /// `body` must therefore have no effect outside the database. Called inside another
    /// transaction, `body` joins it.
    func transaction<T>(
        _ isolation: Isolation = .serializable, locking keys: [Int64] = [], _ body: () throws(StoreError) -> T
    ) throws(StoreError) -> T {
        if depth > 0 { return try body() }
        let keys = Array(Set(keys)).sorted()
        // Released even when taking them failed halfway (a statement_timeout): unlocking a key
        // not held is harmless.
        defer { if !keys.isEmpty { db.unlock(keys) } }
        if !keys.isEmpty { try db.lock(keys) }
        var attempt = 1
        while true {
            try db.begin(isolation)
            depth = 1
            do throws(StoreError) {
                let r = try body()
                depth = 0
                try db.commit()
                return r
            } catch {
                depth = 0
                db.rollback()
                guard error.isConflict else { throw error }
                guard attempt < StoreLimits.maxTransactionAttempts else {
                    throw .busy("still conflicting after \(attempt) attempts: \(error)")
                }
                attempt += 1
                conflictRetries += 1
            }
        }
    }

    /// An advisory lock key for `parts` (FNV-1a 64 of the parts joined by U+0001): stable
    /// across processes, unlike `Hasher`.
    static func lockKey(_ parts: String...) -> Int64 {
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for (i, p) in parts.enumerated() {
            if i > 0 { h = (h ^ 1) &* 0x100_0000_01b3 }
            for b in p.utf8 { h = (h ^ UInt64(b)) &* 0x100_0000_01b3 }
        }
        return Int64(bitPattern: h)
    }

    /// Stores a batch idempotently, in one transaction. A key seen before stores nothing and
    /// counts one duplicate batch; a record id already stored for the stream (or repeated in
    /// the batch) is dropped and counted as a duplicate record. Idempotency comes from the
    /// unique keys alone (`ON CONFLICT`), so the same batch posted to two instances at once is
    /// stored once: the second insert of the key waits for the first transaction and then
    /// stores nothing.
    func ingest(_ batch: Batch, receivedAt: Int64, installId: String = "", deviceId: String? = nil) throws(StoreError) -> IngestResult {
        try transaction(.readCommitted) { () throws(StoreError) -> IngestResult in
            let stream = try streamID(batch.stream)
            guard
                let batchID = try db.query(
                    """
                    INSERT INTO batches (key, stream, received_at, record_count, accepted, device_id) VALUES (?, ?, ?, ?, 0, ?)
                    ON CONFLICT (key) DO NOTHING RETURNING id
                    """,
                    [
                        .text(batch.key), .int(stream), .int(receivedAt), .int(Int64(batch.records.count)),
                        deviceId.map { .text($0) } ?? .null,
                    ]
                ).first?.first?.int
            else {
                try bump(batch.stream, "duplicateBatches", 1)
                return IngestResult(accepted: 0, duplicates: batch.records.count, duplicateBatch: true)
            }
            let accepted = try insertRecords(batch, stream: stream, batchID: batchID)
            if accepted > 0 || EventIndex.appliesDuplicates(batch.stream) {
                try indexEvents(
                    Store.indexed(batch, keepData: false), stream: batch.stream, receivedAt: receivedAt, installId: installId,
                    jsSeq: nil)
            }
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
        return "INSERT INTO records (stream, id, ts, data, batch) VALUES " + values.joined(separator: ", ") + " ON CONFLICT DO NOTHING"
    }
    static let insertSQLByRows: [Int: String] = Dictionary(uniqueKeysWithValues: insertRows.map { ($0, insertSQL(rows: $0)) })

    /// Inserts the records (in order; a repeated `(stream, id)` is ignored), binding ids and
    /// data straight from the batch's bytes. Returns how many were stored.
    private func insertRecords(_ batch: Batch, stream: Int64, batchID: Int64) throws(StoreError) -> Int {
        let stored: Result<Int, StoreError> = batch.text.withUnsafeBytes { t in
            do throws(StoreError) {
                var stored = 0
                var next = 0
                var binds: [SQLBind] = []
                while next < batch.records.count {
                    let rows = Store.insertRows.first { $0 <= batch.records.count - next }!
                    binds.removeAll(keepingCapacity: true)
                    binds.append(.int(stream))
                    binds.append(.int(batchID))
                    for record in batch.records[next..<(next + rows)] {
                        binds.append(.bytes(UnsafeRawBufferPointer(rebasing: t[record.id])))
                        binds.append(.int(record.ts))
                        if let d = record.data {
                            binds.append(.bytes(UnsafeRawBufferPointer(rebasing: t[d])))
                        } else {
                            binds.append(.text("null"))
                        }
                    }
                    stored += try db.run(Store.insertSQLByRows[rows]!, binds)
                    next += rows
                }
                return .success(stored)
            } catch {
                return .failure(error)
            }
        }
        return try stored.get()
    }

    /// The id of stream `name`, created when new (a concurrent creation is waited for).
    func streamID(_ name: String) throws(StoreError) -> Int64 {
        let select = "SELECT id FROM streams WHERE name = ?"
        if let id = try db.query(select, [.text(name)]).first?.first?.int { return id }
        try db.run("INSERT INTO streams (name) VALUES (?) ON CONFLICT (name) DO NOTHING", [.text(name)])
        guard let id = try db.query(select, [.text(name)]).first?.first?.int else {
            throw .postgres(sqlstate: "XX000", message: "stream \(name) not found after its insert")
        }
        return id
    }

    private func bump(_ stream: String, _ name: String, _ by: Int) throws(StoreError) {
        try db.run(
            """
            INSERT INTO counters (stream, name, value) VALUES (?, ?, ?)
            ON CONFLICT (stream, name) DO UPDATE SET value = counters.value + excluded.value
            """, [.text(stream), .text(name), .int(Int64(by))])
    }

    /// Counts for one stream (all zero for a stream never seen).
    func summary(stream: String) throws(StoreError) -> StreamSummary {
        let s = SQLBind.text(stream)
        return StreamSummary(
            records: try scalar("SELECT count(*) FROM records WHERE stream = (SELECT id FROM streams WHERE name = ?)", [s]),
            batches: try scalar("SELECT count(*) FROM batches WHERE stream = (SELECT id FROM streams WHERE name = ?)", [s]),
            duplicateRecords: try scalar(
                "SELECT coalesce(sum(value), 0) FROM counters WHERE stream = ? AND name = 'duplicateRecords'", [s]),
            duplicateBatches: try scalar(
                "SELECT coalesce(sum(value), 0) FROM counters WHERE stream = ? AND name = 'duplicateBatches'", [s]))
    }

    /// Counts over every stream.
    func totals() throws(StoreError) -> StreamSummary {
        StreamSummary(
            records: try scalar("SELECT count(*) FROM records"),
            batches: try scalar("SELECT count(*) FROM batches"),
            duplicateRecords: try scalar("SELECT coalesce(sum(value), 0) FROM counters WHERE name = 'duplicateRecords'"),
            duplicateBatches: try scalar("SELECT coalesce(sum(value), 0) FROM counters WHERE name = 'duplicateBatches'"))
    }

    /// A page of a stream's records (read through `records_stream_seq`).
    static let pageSQL = """
        SELECT r.seq, r.id, r.ts, r.data, b.device_id FROM records r LEFT JOIN batches b ON b.id = r.batch
        WHERE r.stream = (SELECT id FROM streams WHERE name = ?) AND r.seq > ?
        ORDER BY r.seq LIMIT ?
        """

    /// Up to `limit` records of `stream` with `seq > after`, in arrival order.
    /// Up to `limit` records after `after`, stopping after the one that brings the page's ids
    /// and data to `maxBytes` (at least one record).
    func records(stream: String, after: Int64, limit: Int, maxBytes: Int = .max) throws(StoreError) -> [StoredRecord] {
        var out: [StoredRecord] = []
        var bytes = 0
        var last = after
        // Read in chunks, so a page of large records stops near `maxBytes` without holding
        // `limit` of them at once.
        while out.count < limit {
            let want = min(Store.pageChunkRows, limit - out.count)
            let rows = try db.query(Store.pageSQL, [.text(stream), .int(last), .int(Int64(want))])
            for row in rows {
                let r = StoredRecord(
                    seq: row[0].int ?? 0, id: row[1].text ?? "", ts: row[2].int ?? 0, data: row[3].text ?? "null", deviceId: row[4].text)
                out.append(r)
                last = r.seq
                bytes += r.id.utf8.count + r.data.utf8.count
                if bytes >= maxBytes { return out }
            }
            if rows.count < want { break }
        }
        return out
    }

    /// Rows read per statement when paging (`records`).
    static let pageChunkRows = 32

    /// Deletes everything.
    func reset() throws(StoreError) {
        try transaction { () throws(StoreError) in
            try db.exec("DELETE FROM records; DELETE FROM batches; DELETE FROM streams; DELETE FROM counters;")
            try db.exec(Store.maReset)
            try db.exec(Store.pushReset)
            try db.exec("DELETE FROM gtm_versions; DELETE FROM gtm_containers;")
            try db.exec(Store.dataReset)
            try db.exec(Store.consoleReset)
        }
    }

    private func scalar(_ sql: String, _ args: [SQLBind] = []) throws(StoreError) -> Int64 {
        try db.query(sql, args).first?.first?.int ?? 0
    }
}
