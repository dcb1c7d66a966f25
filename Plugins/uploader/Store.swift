import CSQLite
import PylonStore

/// One record of an enqueue, pointing into the request's parsed json-c tree (valid while the
/// request's `Call` is alive and the `data` object is not serialised again): the hot path
/// copies each byte once, into SQLite.
struct PendingRecord {
    var id: UnsafePointer<CChar>
    var idLength: Int32
    var ts: Int64
    var body: UnsafePointer<CChar>
    var bodyLength: Int32
}

/// The uploader's durable queue in SQLite (WAL).
///
/// fsync policy: `synchronous=NORMAL` by default — a commit is in the WAL before the reply, so
/// it survives a crash or `kill -9` of any process; the WAL is fsynced at checkpoints, so an
/// OS crash or power loss can lose the last commits. `"fsync": "full"` (`synchronous=FULL`)
/// fsyncs the WAL at every (group) commit and survives power loss too.
final class UploaderStore {
    let db: Database

    private var insertStatement: Statement!

    /// SQLite's page cache. With the default 2 MiB the queue's pages (records plus the
    /// (stream, id) and batch indexes) were read back from the file at every insert and batch.
    static let cacheKiB = 32 * 1024

    /// The records of batch `?1`. Naming the batch's stream lets SQLite use the
    /// (stream, batch, seq) index; `batch=?` alone scanned the whole queue.
    static let inBatch = "stream=(SELECT stream FROM batches WHERE key=?1) AND batch=?1"

    init(path: String, fsyncEveryCommit: Bool) throws(SQLiteError) {
        db = try Database(path: path)
        try db.exec("PRAGMA journal_mode=WAL")
        try db.exec(fsyncEveryCommit ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL")
        try db.exec("PRAGMA cache_size=-\(UploaderStore.cacheKiB)")
        try db.exec("""
            CREATE TABLE IF NOT EXISTS records(
              seq INTEGER PRIMARY KEY AUTOINCREMENT, stream TEXT NOT NULL, id TEXT NOT NULL,
              consent TEXT NOT NULL DEFAULT '', ts INTEGER NOT NULL, bytes INTEGER NOT NULL,
              body TEXT NOT NULL, batch TEXT, enqueued_ms INTEGER NOT NULL, UNIQUE(stream, id));
            CREATE INDEX IF NOT EXISTS records_by_batch ON records(stream, batch, seq);
            -- attempts: no longer written (retry backoff lives in memory); kept so existing
            -- queues open unchanged.
            CREATE TABLE IF NOT EXISTS batches(
              key TEXT PRIMARY KEY, stream TEXT NOT NULL, created_ms INTEGER NOT NULL,
              attempts INTEGER NOT NULL DEFAULT 0, final INTEGER NOT NULL DEFAULT 0);
            CREATE TABLE IF NOT EXISTS dead_letters(
              seq INTEGER PRIMARY KEY AUTOINCREMENT, stream TEXT NOT NULL, id TEXT NOT NULL,
              body TEXT NOT NULL, batch TEXT NOT NULL, status INTEGER NOT NULL, reason TEXT NOT NULL,
              at_ms INTEGER NOT NULL);
            -- endpoint: no longer written or read (endpoints are operator configuration only;
            -- one saved by a caller before is ignored); kept so existing queues open unchanged.
            CREATE TABLE IF NOT EXISTS stream_settings(
              stream TEXT PRIMARY KEY, max_count INTEGER, interval_ms INTEGER, endpoint TEXT);
            -- Who first wrote each stream ("uid:N" or "plugin:NAME"): the owner of a stream that
            -- neither its name nor the config gives to a plugin.
            CREATE TABLE IF NOT EXISTS stream_owners(
              stream TEXT PRIMARY KEY, owner TEXT NOT NULL, created_ms INTEGER NOT NULL);
            """)
        insertStatement = try db.prepare(
            "INSERT OR IGNORE INTO records(stream,id,consent,ts,bytes,body,enqueued_ms) VALUES(?,?,?,?,?,?,?)")
    }

    /// Inserts records (one enqueue call); returns how many were new (duplicates by (stream, id)
    /// are ignored: a retried enqueue is idempotent). Call inside a transaction.
    func insert(stream: String, consent: String, records: [PendingRecord], nowMs: Int64) throws(SQLiteError) -> (added: Int, bytes: Int) {
        var added = 0
        var bytes = 0
        let s = insertStatement!
        for r in records {
            s.reset()
            try s.bindText(1, string: stream)
            try s.bindText(2, r.id, r.idLength)
            try s.bindText(3, string: consent)
            try s.bindInt(4, r.ts)
            try s.bindInt(5, Int64(r.bodyLength))
            try s.bindText(6, r.body, r.bodyLength)
            try s.bindInt(7, nowMs)
            while try s.step() {}
            if db.changes > 0 {
                added += 1
                bytes += Int(r.bodyLength)
            }
        }
        return (added, bytes)
    }

    /// Assigns the oldest unbatched records of `stream` (same consent switch, at most `maxCount`
    /// and `maxBytes`, at least one) to a new batch `key`, persisted before anything is sent.
    /// Returns the number of records in it and their bytes (0 when nothing was queued).
    func cutBatch(stream: String, key: String, maxCount: Int, maxBytes: Int, final: Bool, consent: String? = nil,
                  nowMs: Int64) throws(SQLiteError) -> (count: Int, bytes: Int) {
        try db.transaction { () throws(SQLiteError) -> (count: Int, bytes: Int) in
            let rows: [[SQLValue]]
            if let c = consent {
                rows = try db.query("SELECT seq, bytes, consent FROM records WHERE stream=? AND batch IS NULL AND consent=? ORDER BY seq LIMIT ?",
                                    [.text(stream), .text(c), .int(Int64(maxCount))])
            } else {
                rows = try db.query("SELECT seq, bytes, consent FROM records WHERE stream=? AND batch IS NULL ORDER BY seq LIMIT ?",
                                    [.text(stream), .int(Int64(maxCount))])
            }
            guard let first = rows.first else { return (0, 0) }
            let consentKey = first[2].text ?? ""
            var total = 0
            var seqs: [Int64] = []
            for r in rows {
                guard r[2].text == consentKey else { break }
                let b = Int(r[1].int ?? 0)
                if !seqs.isEmpty && total + b > maxBytes { break }
                total += b
                seqs.append(r[0].int ?? 0)
            }
            try db.run("UPDATE records SET batch=? WHERE stream=? AND batch IS NULL AND seq BETWEEN ? AND ? AND consent=?",
                       [.text(key), .text(stream), .int(seqs.first!), .int(seqs.last!), .text(consentKey)])
            try db.run("INSERT INTO batches(key,stream,created_ms,final) VALUES(?,?,?,?)",
                       [.text(key), .text(stream), .int(nowMs), .int(final ? 1 : 0)])
            return (seqs.count, total)
        }
    }

    /// The upload body of batch `key`, written straight from SQLite's rows into bytes:
    /// `{"batch","stream","records":[{"id","ts","data"}]}`. Also returns the record count and the
    /// bytes of their bodies (what they occupy in the disk cap).
    func batchBody(_ key: String, stream: String) throws(SQLiteError) -> (body: [UInt8], count: Int, recordBytes: Int) {
        let s = try db.prepare("SELECT id, ts, body FROM records WHERE \(UploaderStore.inBatch) ORDER BY seq")
        try s.bind([.text(key)])
        var out: [UInt8] = []
        out.reserveCapacity(64 * 1024)
        out.append(contentsOf: #"{"batch":"#.utf8)
        appendJSONString(&out, key.utf8)
        out.append(contentsOf: #","stream":"#.utf8)
        appendJSONString(&out, stream.utf8)
        out.append(contentsOf: #","records":["#.utf8)
        var count = 0
        var bytes = 0
        while try s.step() {
            if count > 0 { out.append(UInt8(ascii: ",")) }
            out.append(contentsOf: #"{"id":"#.utf8)
            s.withText(0) { appendJSONString(&out, $0) }
            out.append(contentsOf: #","ts":"#.utf8)
            out.append(contentsOf: String(s.int(1)).utf8)
            out.append(contentsOf: #","data":"#.utf8)
            s.withText(2) { b in out.append(contentsOf: b); bytes += b.count }
            out.append(UInt8(ascii: "}"))
            count += 1
        }
        out.append(contentsOf: "]}".utf8)
        return (out, count, bytes)
    }

    func isFinal(_ key: String) throws(SQLiteError) -> Bool {
        try db.query("SELECT final FROM batches WHERE key=?", [.text(key)]).first?[0].int == 1
    }

    /// Delivered (or a final batch that is purged whatever happened): the records are gone.
    func deleteBatch(_ key: String) throws(SQLiteError) {
        try db.transaction { () throws(SQLiteError) in
            try db.run("DELETE FROM records WHERE \(UploaderStore.inBatch)", [.text(key)])
            try db.run("DELETE FROM batches WHERE key=?", [.text(key)])
        }
    }

    /// Sets a rejected batch aside: kept for inspection, never retried.
    func deadLetter(_ key: String, status: Int, reason: String, nowMs: Int64) throws(SQLiteError) -> Int {
        try db.transaction { () throws(SQLiteError) -> Int in
            try db.run("""
                INSERT INTO dead_letters(stream,id,body,batch,status,reason,at_ms)
                SELECT stream,id,body,batch,?1,?2,?3 FROM records WHERE stream=(SELECT stream FROM batches WHERE key=?4) AND batch=?4 ORDER BY seq
                """, [.int(Int64(status)), .text(reason), .int(nowMs), .text(key)])
            let n = db.changes
            try db.run("DELETE FROM records WHERE \(UploaderStore.inBatch)", [.text(key)])
            try db.run("DELETE FROM batches WHERE key=?", [.text(key)])
            return n
        }
    }

    /// Dissolves a batch so its records are cut again (after a 413).
    func unbatch(_ key: String) throws(SQLiteError) {
        try db.transaction { () throws(SQLiteError) in
            try db.run("UPDATE records SET batch=NULL WHERE \(UploaderStore.inBatch)", [.text(key)])
            try db.run("DELETE FROM batches WHERE key=?", [.text(key)])
        }
    }

    /// Marks every pending batch holding records under `consent` final (sent once, no retry).
    func markFinal(consent: String) throws(SQLiteError) {
        try db.run("UPDATE batches SET final=1 WHERE key IN (SELECT DISTINCT batch FROM records WHERE consent=? AND batch IS NOT NULL)",
                   [.text(consent)])
    }

    /// Marks every pending batch of `stream` final.
    func markFinal(stream: String) throws(SQLiteError) {
        try db.run("UPDATE batches SET final=1 WHERE stream=?", [.text(stream)])
    }

    /// The consent switches records are stored under.
    func consentKeys() throws(SQLiteError) -> [String] {
        try db.query("SELECT DISTINCT consent FROM records").compactMap { $0[0].text }
    }

    /// Streams with unbatched records under `consent`.
    func streams(withConsent consent: String) throws(SQLiteError) -> [String] {
        try db.query("SELECT DISTINCT stream FROM records WHERE consent=? AND batch IS NULL", [.text(consent)]).compactMap { $0[0].text }
    }

    struct StreamSummary {
        var queued = 0
        var queuedBytes = 0
        var oldestMs: Int64?
        var pendingBatches: [String] = []
    }

    /// What is on disk per stream (at start-up, and for status).
    func summaries() throws(SQLiteError) -> [String: StreamSummary] {
        var out: [String: StreamSummary] = [:]
        for r in try db.query("SELECT stream, COUNT(*), SUM(bytes), MIN(enqueued_ms) FROM records WHERE batch IS NULL GROUP BY stream") {
            let s = r[0].text ?? ""
            out[s, default: StreamSummary()].queued = Int(r[1].int ?? 0)
            out[s, default: StreamSummary()].queuedBytes = Int(r[2].int ?? 0)
            out[s, default: StreamSummary()].oldestMs = r[3].int
        }
        for r in try db.query("SELECT stream, key FROM batches ORDER BY created_ms, rowid") {
            out[r[0].text ?? "", default: StreamSummary()].pendingBatches.append(r[1].text ?? "")
        }
        return out
    }

    /// Bytes of record bodies on disk per stream (queued or in a batch).
    func streamBytes() throws(SQLiteError) -> [String: Int] {
        var out: [String: Int] = [:]
        for r in try db.query("SELECT stream, SUM(bytes) FROM records GROUP BY stream") { out[r[0].text ?? ""] = Int(r[1].int ?? 0) }
        return out
    }

    func totalBytes() throws(SQLiteError) -> Int {
        Int(try db.query("SELECT COALESCE(SUM(bytes),0) FROM records").first?[0].int ?? 0)
    }

    func deadLetterCount(stream: String) throws(SQLiteError) -> Int {
        Int(try db.query("SELECT COUNT(*) FROM dead_letters WHERE stream=?", [.text(stream)]).first?[0].int ?? 0)
    }

    /// Dead letters of `streams` (nil: every stream), oldest first.
    func deadLetters(streams: [String]?, limit: Int) throws(SQLiteError) -> [[SQLValue]] {
        let cols = "SELECT stream,id,body,batch,status,reason,at_ms FROM dead_letters"
        guard let streams else { return try db.query("\(cols) ORDER BY seq LIMIT ?", [.int(Int64(limit))]) }
        if streams.isEmpty { return [] }
        let marks = Array(repeating: "?", count: streams.count).joined(separator: ",")
        return try db.query("\(cols) WHERE stream IN (\(marks)) ORDER BY seq LIMIT ?", streams.map { .text($0) } + [.int(Int64(limit))])
    }

    /// Streams holding dead letters.
    func deadLetterStreams() throws(SQLiteError) -> [String] {
        try db.query("SELECT DISTINCT stream FROM dead_letters").compactMap { $0[0].text }
    }

    /// Records `owner` as the owner of `stream` (the first writer wins; later calls change nothing).
    func recordOwner(stream: String, owner: String, nowMs: Int64) throws(SQLiteError) {
        try db.run("INSERT OR IGNORE INTO stream_owners(stream,owner,created_ms) VALUES(?,?,?)", [.text(stream), .text(owner), .int(nowMs)])
    }

    func recordedOwners() throws(SQLiteError) -> [String: String] {
        var out: [String: String] = [:]
        for r in try db.query("SELECT stream, owner FROM stream_owners") { out[r[0].text ?? ""] = r[1].text ?? "" }
        return out
    }

    func saveSettings(stream: String, maxCount: Int, intervalMs: UInt64) throws(SQLiteError) {
        try db.run("INSERT OR REPLACE INTO stream_settings(stream,max_count,interval_ms,endpoint) VALUES(?,?,?,NULL)",
                   [.text(stream), .int(Int64(maxCount)), .int(Int64(intervalMs))])
    }

    func savedSettings() throws(SQLiteError) -> [String: (maxCount: Int, intervalMs: UInt64)] {
        var out: [String: (Int, UInt64)] = [:]
        for r in try db.query("SELECT stream,max_count,interval_ms FROM stream_settings") {
            out[r[0].text ?? ""] = (Int(r[1].int ?? 50), UInt64(r[2].int ?? 10_000))
        }
        return out
    }
}

private let hexDigits = Array("0123456789abcdef".utf8)

/// Appends `bytes` as a JSON string literal (quotes, backslashes and control characters escaped).
func appendJSONString<C: Collection>(_ out: inout [UInt8], _ bytes: C) where C.Element == UInt8 {
    out.append(UInt8(ascii: "\""))
    for b in bytes {
        switch b {
        case UInt8(ascii: "\""): out += [UInt8(ascii: "\\"), UInt8(ascii: "\"")]
        case UInt8(ascii: "\\"): out += [UInt8(ascii: "\\"), UInt8(ascii: "\\")]
        case 0..<0x20: out += [UInt8(ascii: "\\"), UInt8(ascii: "u"), 0x30, 0x30, hexDigits[Int(b >> 4)], hexDigits[Int(b & 15)]]
        default: out.append(b)
        }
    }
    out.append(UInt8(ascii: "\""))
}
