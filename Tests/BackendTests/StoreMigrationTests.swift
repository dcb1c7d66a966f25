import Foundation
import PylonCore
import PylonStore
import Testing

@testable import PylonBackend

/// A database written by an earlier release (format 0: stream names and batch keys as text in
/// every record) is migrated at open and still serves everything it held; a newer format is
/// refused.
@Suite(.serialized) struct StoreMigrationTests {
    /// The ingest tables of format 0, as earlier releases created them.
    static let schemaV0 = """
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
        CREATE INDEX IF NOT EXISTS records_stream_seq ON records(stream, seq);
        CREATE TABLE IF NOT EXISTS counters (
            stream TEXT NOT NULL,
            name TEXT NOT NULL,
            value INTEGER NOT NULL,
            PRIMARY KEY (stream, name)
        );
        """

    static func tempDir() throws -> String {
        let dir = NSTemporaryDirectory() + "pylon-backend-migrate-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        return dir
    }

    /// A format-0 file: stream `s` with records a, b (batch b1), stream `t` with record a
    /// (batch b2), three duplicate records counted for `s`, and a record stored then deleted
    /// (`seq` 4: the next must be 5).
    static func writeOldDatabase(_ path: String) throws {
        let db = try Database(path: path)
        defer { db.close() }
        try db.exec("PRAGMA journal_mode=WAL;")
        try db.exec(schemaV0)
        try db.exec(
            """
            INSERT INTO batches VALUES ('b1', 's', 100, 2, 2), ('b2', 't', 200, 1, 1);
            INSERT INTO records (stream, id, ts, data, batch) VALUES
                ('s', 'a', 1, '{"n":1}', 'b1'), ('s', 'b', 2, '[true,"x"]', 'b1'), ('t', 'a', 3, 'null', 'b2'),
                ('t', 'gone', 4, '0', 'b2');
            DELETE FROM records WHERE id = 'gone';
            INSERT INTO counters VALUES ('s', 'duplicateRecords', 3);
            """)
    }

    static func rows(_ store: Store, _ stream: String) throws -> [String] {
        try store.records(stream: stream, after: 0, limit: 100).map { "\($0.seq) \($0.id) \($0.ts) \($0.data)" }
    }

    static func batch(_ key: String, _ stream: String, _ ids: [String]) throws -> Batch {
        let records = ids.map { #"{"id":"\#($0)","ts":9,"data":{"k":"\#($0)"}}"# }.joined(separator: ",")
        return try Batch.parse(Array(#"{"records":[\#(records)]}"#.utf8), key: key, stream: stream)
    }

    @Test func anOldDatabaseIsMigratedAtOpenAndKeepsEverything() throws {
        let dir = try Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let path = dir + "/backend.sqlite"
        try Self.writeOldDatabase(path)

        let store = try Store(path: path)
        #expect(try store.storedFormat() == Store.format)
        #expect(try Self.rows(store, "s") == [#"1 a 1 {"n":1}"#, #"2 b 2 [true,"x"]"#])
        #expect(try Self.rows(store, "t") == ["3 a 3 null"])
        #expect(try store.summary(stream: "s") == Store.StreamSummary(records: 2, batches: 1, duplicateRecords: 3, duplicateBatches: 0))
        #expect(try store.summary(stream: "t") == Store.StreamSummary(records: 1, batches: 1, duplicateRecords: 0, duplicateBatches: 0))
        #expect(try store.totals() == Store.StreamSummary(records: 3, batches: 2, duplicateRecords: 3, duplicateBatches: 0))

        // Idempotency and dedup still see the old batches and records; seq continues past 4
        // (the ignored duplicate takes 5, as it always has).
        #expect(try store.ingest(Self.batch("b1", "s", ["z"]), receivedAt: 5).duplicateBatch)
        #expect(
            try store.ingest(Self.batch("b3", "s", ["a", "c"]), receivedAt: 5) == .init(accepted: 1, duplicates: 1, duplicateBatch: false))
        let after = try Self.rows(store, "s")
        #expect(after.last == #"6 c 9 {"k":"c"}"#)
        store.close()

        // Opening a migrated file again changes nothing.
        let again = try Store(path: path)
        defer { again.close() }
        #expect(try Self.rows(again, "s").count == 3)
        #expect(try again.summary(stream: "s") == Store.StreamSummary(records: 3, batches: 2, duplicateRecords: 4, duplicateBatches: 1))
    }

    @Test func theBackendServesAnOldDatabase() throws {
        let dir = try Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let path = dir + "/backend.sqlite"
        try Self.writeOldDatabase(path)

        let b = try BackendProcess(["--db", path])
        #expect(
            try b.get("/v1/inspect/streams/s") == ["stream": "s", "records": 2, "batches": 1, "duplicateRecords": 3, "duplicateBatches": 0])
        let page = try b.get("/v1/inspect/streams/s/records?limit=1")
        #expect(page["records"]?.arrayValue?.map { $0["id"] } == ["a"])
        #expect(page["records"]?.arrayValue?.first?["data"] == ["n": 1])
        let rest = try b.get("/v1/inspect/streams/s/records?after=\(page["next"]?.intValue ?? -1)")
        #expect(rest["records"]?.arrayValue?.map { $0["seq"] } == [2])
        let r = try b.postBatch("t", key: "b4", batchBody(key: "b4", stream: "t", ids: ["a", "new"]))
        #expect(try r.json() == ["accepted": 1, "duplicates": 1, "duplicateBatch": false])
        let t = try b.get("/v1/inspect/streams/t/records")
        #expect(t["records"]?.arrayValue?.map { $0["seq"] } == [3, 6])
        #expect(try b.get("/v1/inspect/stats")["records"] == 4)
    }

    @Test func aNewerFormatIsRefusedAndLeftAlone() throws {
        let dir = try Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let path = dir + "/backend.sqlite"
        do {
            let db = try Database(path: path)
            try db.exec("CREATE TABLE future (x); PRAGMA user_version = \(Store.format + 1);")
            db.close()
        }
        #expect(throws: Store.OpenError.self) { _ = try Store(path: path) }
        let db = try Database(path: path)
        defer { db.close() }
        #expect(try db.query("PRAGMA user_version").first?.first?.int == Int64(Store.format + 1))
        #expect(try db.query("SELECT name FROM sqlite_master WHERE name = 'records'").isEmpty)
    }

    /// Paging a stream and counting it read the `(stream, seq)` index, not the whole table.
    @Test func streamQueriesUseTheirIndexes() throws {
        let store = try Store(path: ":memory:")
        defer { store.close() }
        func plan(_ sql: String) throws -> String {
            try store.db.query(
                "EXPLAIN QUERY PLAN " + sql, [.text("s"), .int(0), .int(10)].prefix(sql.filter { $0 == "?" }.count).map { $0 }
            )
            .compactMap { $0.last?.text }.joined(separator: "; ")
        }
        let page = try plan(Store.pageSQL)
        #expect(page.contains("USING INDEX records_stream_seq (stream=? AND seq>?)") && !page.contains("TEMP B-TREE"), "\(page)")
        let count = try plan("SELECT count(*) FROM records WHERE stream = (SELECT id FROM streams WHERE name = ?)")
        #expect(count.contains("COVERING INDEX"), "\(count)")
    }
}
