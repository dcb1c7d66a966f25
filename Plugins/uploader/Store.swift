import CSQLite
import PylonCore
import PylonStore

/// One record of an enqueue, pointing into the request's parsed json-c tree (valid while the
/// request's `Call` is alive and the `data` object is not serialised again): the hot path
/// copies each byte once, into its chunk.
struct PendingRecord {
    var id: UnsafePointer<CChar>
    var idLength: Int32
    var ts: Int64
    var body: UnsafePointer<CChar>
    var bodyLength: Int32
}

/// The uploader's durable queue in SQLite (WAL), format 2 (docs/UPLOADER.md "On disk").
///
/// What one group commit received for a stream is one row of `chunks` (the records already in
/// the batch body's form), not one row per record: a commit is one insert per stream, a batch is
/// cut by marking whole chunks (splitting at most one), its body is their concatenation, and a
/// delivered batch is deleted chunk by chunk. Record ids are checked for duplicates in memory
/// (`RecordKey`, rebuilt from the chunks at start).
///
/// fsync policy: `synchronous=NORMAL` by default — a commit is in the WAL before the reply, so
/// it survives a crash or `kill -9` of any process; the WAL is fsynced at checkpoints, so an
/// OS crash or power loss can lose the last commits. `"fsync": "full"` (`synchronous=FULL`)
/// fsyncs the WAL at every (group) commit and survives power loss too.
final class UploaderStore {
    let db: Database

    /// The on-disk format this code writes (`PRAGMA user_version`); 0 or 1 is the per-record
    /// `records` table of earlier releases, migrated at open; 2 counted only the records' `data`
    /// in `chunks.bytes` (recomputed at open as `Chunk.bytes`).
    static let format: Int64 = 3

    /// SQLite's page cache: the queue's recent pages stay in memory between commit, cut, read
    /// and delete.
    static let cacheKiB = 32 * 1024

    /// The chunks of batch `?1`. Naming the batch's stream lets SQLite use the
    /// (stream, batch, first) index.
    static let inBatch = "stream=(SELECT stream FROM batches WHERE key=?1) AND batch=?1"

    /// Ids of the records on disk, per stream: an enqueue of an id already queued is a duplicate.
    var ids: [String: Set<RecordKey>] = [:]
    /// Queue position of the next record (chunks are ordered by their first record's position).
    var nextPosition: Int64 = 0

    /// Whether pages freed by the next delete are overwritten with zeros (`PRAGMA
    /// secure_delete=ON`, Debian's default) or only the bytes on pages written anyway (`FAST`).
    /// A delivered batch is deleted with `FAST`: zeroing its overflow pages wrote every freed
    /// page a second time (a quarter of the bytes the uploader wrote in `pylon-bench uploader`)
    /// for data the backend now holds and the queue file held all along; the pages are reused
    /// by the next commits.
    /// Records purged without delivery (a final batch after consent was denied) are zeroed.
    private var zeroingFreedPages = true

    /// Checkpoints the WAL on libuv's thread pool (nil without a loop: SQLite's autocheckpoint,
    /// inside the commit that crosses it).
    private var checkpointer: WALCheckpointer?

    /// Opens (creating or migrating) the queue at `path`. With `loop`, checkpoints run mostly on
    /// its thread pool (`WALCheckpointer`).
    init(path: String, fsyncEveryCommit: Bool, loop: Loop? = nil) throws(SQLiteError) {
        db = try Database(path: path)
        try db.exec("PRAGMA journal_mode=WAL")
        let synchronous = fsyncEveryCommit ? "FULL" : "NORMAL"
        try db.exec("PRAGMA synchronous=\(synchronous)")
        try db.exec("PRAGMA cache_size=-\(UploaderStore.cacheKiB)")
        let version = try db.query("PRAGMA user_version").first?[0].int ?? 0
        try zeroFreedPages(false)
        try db.exec(
            """
            -- A chunk's records (`chunk_bodies`) are apart from what a cut changes (`chunks.batch`):
            -- SQLite rewrites a whole row, overflow pages included, on any update, so a cut
            -- rewrites only the small row.
            CREATE TABLE IF NOT EXISTS chunks(
              seq INTEGER PRIMARY KEY, stream TEXT NOT NULL, consent TEXT NOT NULL,
              first INTEGER NOT NULL, count INTEGER NOT NULL, bytes INTEGER NOT NULL,
              batch TEXT, enqueued_ms INTEGER NOT NULL);
            CREATE INDEX IF NOT EXISTS chunks_by_batch ON chunks(stream, batch, first);
            CREATE TABLE IF NOT EXISTS chunk_bodies(seq INTEGER PRIMARY KEY, body BLOB NOT NULL, idx BLOB NOT NULL);
            -- attempts: no longer written (retry backoff lives in memory); kept so existing
            -- queues open unchanged.
            CREATE TABLE IF NOT EXISTS batches(
              key TEXT PRIMARY KEY, stream TEXT NOT NULL, created_ms INTEGER NOT NULL,
              attempts INTEGER NOT NULL DEFAULT 0, final INTEGER NOT NULL DEFAULT 0);
            CREATE TABLE IF NOT EXISTS dead_letters(
              seq INTEGER PRIMARY KEY AUTOINCREMENT, stream TEXT NOT NULL, id TEXT NOT NULL,
              body TEXT NOT NULL, batch TEXT NOT NULL, status INTEGER NOT NULL, reason TEXT NOT NULL,
              at_ms INTEGER NOT NULL, ts INTEGER);
            -- endpoint: no longer written or read (endpoints are operator configuration only;
            -- one saved by a caller before is ignored); kept so existing queues open unchanged.
            CREATE TABLE IF NOT EXISTS stream_settings(
              stream TEXT PRIMARY KEY, max_count INTEGER, interval_ms INTEGER, endpoint TEXT);
            -- Who first wrote each stream ("uid:N" or "plugin:NAME"): the owner of a stream that
            -- neither its name nor the config gives to a plugin.
            CREATE TABLE IF NOT EXISTS stream_owners(
              stream TEXT PRIMARY KEY, owner TEXT NOT NULL, created_ms INTEGER NOT NULL);
            """)
        try migrateRecordsTable()
        try addDeadLetterTS()
        if version == 2 {
            // Format 2 counted only `data`: each chunk's bytes as this release counts them.
            try db.exec(
                """
                UPDATE chunks SET bytes = (SELECT length(body) FROM chunk_bodies b WHERE b.seq = chunks.seq)
                  - (count - 1) + count * \(Chunk.charge(textBytes: 0)) WHERE count > 0
                """)
        }
        // A chunk whose batch is gone (a batch row deleted by an earlier release opening this
        // database) is queued again rather than stranded.
        try db.exec("UPDATE chunks SET batch=NULL WHERE batch IS NOT NULL AND batch NOT IN (SELECT key FROM batches)")
        try db.exec("PRAGMA user_version=\(UploaderStore.format)")
        try loadIDs()
        if let loop { checkpointer = try WALCheckpointer(db: db, path: path, synchronous: synchronous, loop: loop) }
    }

    /// Closes the database (a checkpoint running on the pool finishes on its own connection).
    func close() {
        checkpointer?.close()
        db.close()
    }

    /// Reads every chunk's record ids into `ids` and finds the next queue position.
    private func loadIDs() throws(SQLiteError) {
        let s = try db.prepare("SELECT c.stream, b.body, b.idx, c.first + c.count FROM chunks c JOIN chunk_bodies b USING(seq)")
        while try s.step() {
            let stream = s.text(0)
            var set = ids.removeValue(forKey: stream) ?? []
            s.withBlob(1) { body in
                s.withBlob(2) { index in
                    for i in 0..<(index.count / Chunk.indexEntryBytes) { set.insert(RecordKey(Chunk.record(body, index, i).escapedID)) }
                }
            }
            ids[stream] = set
            nextPosition = max(nextPosition, s.int(3))
        }
    }

    // MARK: Group commit

    /// One enqueue call of a group commit.
    struct Enqueue {
        var stream: String
        var consent: String
        var records: [PendingRecord]
    }

    /// Stores the enqueues of one group commit in one transaction: per (stream, switch) one
    /// chunk (more past `Chunk.targetBytes`), and deletes the delivered batches waiting for a
    /// transaction (`deleteDelivered`) first, so their ids may come again in this commit.
    /// Returns, per enqueue, how many records were new and their bytes (a record whose id is
    /// already queued in its stream, or earlier in the same commit, is a duplicate: a retried
    /// enqueue is idempotent). Nothing is stored or deleted, and the duplicate check is
    /// unchanged, when it throws.
    func commit(_ enqueues: [Enqueue], nowMs: Int64) throws(SQLiteError) -> [(added: Int, bytes: Int)] {
        guard !enqueues.isEmpty || !deliveredQueue.isEmpty else { return [] }
        if !deliveredQueue.isEmpty { try zeroFreedPages(false) }
        let start = nextPosition
        var gone: [(stream: String, keys: [RecordKey])] = []
        var built: Built?
        do {
            try db.transaction { () throws(SQLiteError) in
                gone = try deleteDeliveredRows()
                for g in gone { forget(g.keys, of: g.stream) }
                built = build(enqueues)
                var position = start
                for c in built!.chunks {
                    try insertChunk(stream: c.stream, consent: c.consent, first: position, c.chunk, batch: nil, nowMs: nowMs)
                    position += Int64(c.chunk.count)
                }
            }
        } catch {
            // The new keys out first, then the deleted batches' back: an id of both is on disk.
            if let built {
                var k = 0
                for (e, r) in zip(enqueues, built.results) {
                    for key in built.added[k..<(k + r.added)] { ids[e.stream]?.remove(key) }
                    k += r.added
                }
            }
            for g in gone where !g.keys.isEmpty { ids[g.stream, default: []].formUnion(g.keys) }
            throw error
        }
        deliveredQueue.removeAll()
        nextPosition = start + Int64(built!.chunks.reduce(0) { $0 + $1.chunk.count })
        return built!.results
    }

    /// A group commit's records in chunks, after the duplicate check.
    private struct Built {
        var chunks: [(stream: String, consent: String, chunk: Chunk)] = []
        /// The keys added to `ids`, in enqueue order (`results` says how many per enqueue).
        var added: [RecordKey] = []
        var results: [(added: Int, bytes: Int)] = []
    }

    /// Checks the enqueues' ids against `ids` (adding the new ones) and puts the new records in
    /// chunks per (stream, switch).
    private func build(_ enqueues: [Enqueue]) -> Built {
        var b = Built()
        b.results.reserveCapacity(enqueues.count)
        var escaped: [UInt8] = []
        escaped.reserveCapacity(160)
        // What a chunk's body grows to (records in their upload form: ~40 bytes around each
        // record's id and data), so it is allocated once, not doubled from empty.
        var bodyEstimate = 0
        for e in enqueues { for r in e.records { bodyEstimate += Int(r.idLength + r.bodyLength) + Chunk.recordOverhead } }
        bodyEstimate = min(bodyEstimate, Chunk.targetBytes + Chunk.recordOverhead + 2 * EnqueueParams.maxIdBytes)
        // The id set of the stream at hand, out of `ids` while consecutive enqueues name it.
        var current: (stream: String, set: Set<RecordKey>)?
        for e in enqueues {
            if current?.stream != e.stream {
                if let c = current, !c.set.isEmpty { ids[c.stream] = c.set }
                current = (e.stream, ids.removeValue(forKey: e.stream) ?? [])
            }
            var slot = b.chunks.lastIndex { $0.stream == e.stream && $0.consent == e.consent }
            var n = 0
            var bytes = 0
            for r in e.records {
                escaped.removeAll(keepingCapacity: true)
                JSONText.appendString(UnsafeRawBufferPointer(start: r.id, count: Int(r.idLength)), to: &escaped)
                let charge = escaped.withUnsafeBytes { id -> Int? in
                    let key = RecordKey(id)
                    guard current!.set.insert(key).inserted else { return nil }
                    b.added.append(key)
                    if slot == nil || b.chunks[slot!].chunk.isFull {
                        b.chunks.append((e.stream, e.consent, Chunk(reservingBody: bodyEstimate)))
                        slot = b.chunks.count - 1
                    }
                    return b.chunks[slot!].chunk.append(
                        escapedID: id, ts: r.ts,
                        data: UnsafeRawBufferPointer(start: r.body, count: Int(r.bodyLength)))
                }
                if let charge {
                    n += 1
                    bytes += charge
                }
            }
            b.results.append((n, bytes))
        }
        if let c = current, !c.set.isEmpty { ids[c.stream] = c.set }
        return b
    }

    /// Inserts chunk `c` at queue position `first`; returns its `seq`. Inside a transaction.
    @discardableResult
    func insertChunk(stream: String, consent: String, first: Int64, _ c: Chunk, batch: String?, nowMs: Int64) throws(SQLiteError) -> Int64 {
        let s = try db.prepare("INSERT INTO chunks(stream,consent,first,count,bytes,batch,enqueued_ms) VALUES(?,?,?,?,?,?,?)")
        try s.bindText(1, string: stream)
        try s.bindText(2, string: consent)
        try s.bindInt(3, first)
        try s.bindInt(4, Int64(c.count))
        try s.bindInt(5, Int64(c.bytes))
        try s.bind(at: 6, [batch.map { .text($0) } ?? .null, .int(nowMs)])
        while try s.step() {}
        let seq = db.lastInsertRowID
        let b = try db.prepare("INSERT INTO chunk_bodies(seq,body,idx) VALUES(?,?,?)")
        try b.bindInt(1, seq)
        try b.bindBlob(2, bytes: c.body)
        try b.bindBlob(3, bytes: c.index)
        while try b.step() {}
        return seq
    }

    // MARK: Batches

    /// Assigns the oldest queued records of `stream` (same consent switch, at most `maxCount`
    /// and `maxBytes`, at least one) to a new batch `key`, persisted before anything is sent:
    /// whole chunks, and the head of the next one when only part of it fits. Returns the number
    /// of records in it and their bytes (0 when nothing was queued).
    func cutBatch(
        stream: String, key: String, maxCount: Int, maxBytes: Int, final: Bool, consent: String? = nil,
        nowMs: Int64
    ) throws(SQLiteError) -> (count: Int, bytes: Int) {
        try db.transaction { () throws(SQLiteError) -> (count: Int, bytes: Int) in
            let s = try db.prepare(
                consent == nil
                    ? "SELECT seq, consent, count, bytes FROM chunks WHERE stream=?1 AND batch IS NULL ORDER BY first LIMIT ?2"
                    : "SELECT seq, consent, count, bytes FROM chunks WHERE stream=?1 AND batch IS NULL AND consent=?3 ORDER BY first LIMIT ?2"
            )
            try s.bind([.text(stream), .int(Int64(maxCount))] + (consent.map { [.text($0)] } ?? []))
            var whole: [Int64] = []
            var partial: (seq: Int64, room: Int, roomBytes: Int)?
            var count = 0
            var bytes = 0
            var switchKey: String?
            while try s.step() {
                let c = s.text(1)
                if switchKey == nil { switchKey = c } else if c != switchKey { break }
                let n = Int(s.int(2)), b = Int(s.int(3))
                if count + n <= maxCount && (count == 0 ? b <= maxBytes : bytes + b <= maxBytes) {
                    whole.append(s.int(0))
                    count += n
                    bytes += b
                    if count == maxCount { break }
                    continue
                }
                partial = (s.int(0), maxCount - count, maxBytes - bytes)
                break
            }
            s.reset()
            if let p = partial, let head = try splitChunk(p.seq, maxCount: p.room, maxBytes: p.roomBytes, atLeastOne: count == 0) {
                whole.append(head.seq)
                count += head.count
                bytes += head.bytes
            }
            guard count > 0 else { return (0, 0) }
            let mark = try db.prepare("UPDATE chunks SET batch=?1 WHERE seq=?2")
            for seq in whole {
                mark.reset()
                try mark.bind([.text(key), .int(seq)])
                while try mark.step() {}
            }
            try db.run(
                "INSERT INTO batches(key,stream,created_ms,final) VALUES(?,?,?,?)",
                [.text(key), .text(stream), .int(nowMs), .int(final ? 1 : 0)])
            return (count, bytes)
        }
    }

    /// Splits chunk `seq` after as many records as fit `maxCount` and `maxBytes` (at least one
    /// when `atLeastOne`): the head becomes a new row at the same queue position, the rest stays
    /// queued after it. Returns the head's row, or nil when nothing fits. Inside a transaction.
    private func splitChunk(_ seq: Int64, maxCount: Int, maxBytes: Int, atLeastOne: Bool) throws(SQLiteError)
        -> (seq: Int64, count: Int, bytes: Int)?
    {
        let s = try db.prepare(
            "SELECT c.stream, c.consent, c.first, b.body, b.idx, c.enqueued_ms FROM chunks c JOIN chunk_bodies b USING(seq) WHERE seq=?")
        try s.bind([.int(seq)])
        guard try s.step() else { return nil }
        let stream = s.text(0), consent = s.text(1), first = s.int(2), enqueued = s.int(5)
        let chunk = Chunk(body: s.withBlob(3) { Array($0) }, index: s.withBlob(4) { Array($0) })
        s.reset()
        var k = 0
        var b = 0
        chunk.index.withUnsafeBytes { ix in
            while k < min(maxCount, chunk.count) {
                let n = Chunk.charge(ix, k)
                if b + n > maxBytes && !(atLeastOne && k == 0) { break }
                b += n
                k += 1
            }
        }
        guard k > 0 else { return nil }
        guard k < chunk.count else { return (seq, chunk.count, chunk.bytes) }
        let (head, tail) = chunk.split(at: k)
        let headSeq = try insertChunk(stream: stream, consent: consent, first: first, head, batch: nil, nowMs: enqueued)
        try db.run(
            "UPDATE chunks SET first=?, count=?, bytes=? WHERE seq=?",
            [.int(first + Int64(k)), .int(Int64(tail.count)), .int(Int64(tail.bytes)), .int(seq)])
        // The old body's pages are zeroed as they are freed: its records may be purged later
        // (consent denied), and a copy left in free pages would outlive the purge.
        try zeroFreedPages(true)
        let u = try db.prepare("UPDATE chunk_bodies SET body=?, idx=? WHERE seq=?")
        try u.bindBlob(1, bytes: tail.body)
        try u.bindBlob(2, bytes: tail.index)
        try u.bindInt(3, seq)
        while try u.step() {}
        try zeroFreedPages(false)
        return (headSeq, head.count, head.bytes)
    }

    /// The upload body of batch `key`: `{"batch","stream","records":[{"id","ts","data"}]}`, its
    /// chunks' bodies joined. Also returns the record count and the bytes of their `data` (what
    /// they occupy in the disk cap).
    func batchBody(_ key: String, stream: String) throws(SQLiteError) -> (body: [UInt8], count: Int, recordBytes: Int) {
        let s = try db.prepare(
            "SELECT b.body, c.count, c.bytes FROM chunks c JOIN chunk_bodies b USING(seq) WHERE \(UploaderStore.inBatch) ORDER BY c.first")
        try s.bind([.text(key)])
        var out: [UInt8] = []
        out.reserveCapacity(64 * 1024)
        out.append(contentsOf: #"{"batch":"#.utf8)
        JSONText.appendString(key, to: &out)
        out.append(contentsOf: #","stream":"#.utf8)
        JSONText.appendString(stream, to: &out)
        out.append(contentsOf: #","records":["#.utf8)
        var count = 0
        var bytes = 0
        while try s.step() {
            if count > 0 { out.append(UInt8(ascii: ",")) }
            s.withBlob(0) { out.append(contentsOf: $0) }
            count += Int(s.int(1))
            bytes += Int(s.int(2))
        }
        out.append(contentsOf: "]}".utf8)
        return (out, count, bytes)
    }

    func isFinal(_ key: String) throws(SQLiteError) -> Bool {
        try db.query("SELECT final FROM batches WHERE key=?", [.text(key)]).first?[0].int == 1
    }

    /// Sets `PRAGMA secure_delete` for the deletes that follow (`zeroingFreedPages`).
    func zeroFreedPages(_ on: Bool) throws(SQLiteError) {
        guard on != zeroingFreedPages else { return }
        try db.exec(on ? "PRAGMA secure_delete=ON" : "PRAGMA secure_delete=FAST")
        zeroingFreedPages = on
    }

    /// Delivered (or a final batch that is purged whatever happened): the records are gone, and
    /// their ids may be enqueued again. `zero`: overwrite the freed pages (records purged because
    /// consent was denied); otherwise they are left for reuse (`zeroingFreedPages`).
    func deleteBatch(_ key: String, zero: Bool = false) throws(SQLiteError) {
        try zeroFreedPages(zero)
        let gone = try db.transaction { () throws(SQLiteError) in try deleteRows(ofBatch: key) }
        forget(gone.keys, of: gone.stream)
    }

    /// Deletes batch `key` and returns its stream and its records' keys. Inside a transaction.
    private func deleteRows(ofBatch key: String) throws(SQLiteError) -> (stream: String, keys: [RecordKey]) {
        var gone: [RecordKey] = []
        let stream = try db.query("SELECT stream FROM batches WHERE key=?", [.text(key)]).first?[0].text ?? ""
        let s = try db.prepare(
            "DELETE FROM chunk_bodies WHERE seq IN (SELECT seq FROM chunks WHERE \(UploaderStore.inBatch)) RETURNING body, idx")
        try s.bind([.text(key)])
        while try s.step() {
            s.withBlob(0) { body in
                s.withBlob(1) { index in
                    for i in 0..<(index.count / Chunk.indexEntryBytes) {
                        gone.append(RecordKey(Chunk.record(body, index, i).escapedID))
                    }
                }
            }
        }
        try dropRows(ofBatch: key)
        return (stream, gone)
    }

    /// Delivered batches whose deletion waits for the next transaction (`deleteDelivered`).
    private(set) var deliveredQueue: [String] = []

    /// Batch `key` was delivered: its deletion joins the next group commit's transaction
    /// (`commit`), or `applyDeliveredDeletes` when none comes. A transaction and its WAL frames
    /// per delivered batch cost about as much as a group commit; shared, the pages both touch
    /// are written once. Until then the batch is on disk: its ids are still duplicates, and a
    /// crash before it makes the batch go again after the restart (the backend keeps it once,
    /// by its key).
    func deleteDelivered(_ key: String) { deliveredQueue.append(key) }

    /// Deletes the delivered batches waiting for a transaction, in one of their own.
    func applyDeliveredDeletes() throws(SQLiteError) {
        guard !deliveredQueue.isEmpty else { return }
        try zeroFreedPages(false)
        let gone = try db.transaction { () throws(SQLiteError) in try deleteDeliveredRows() }
        deliveredQueue.removeAll()
        for g in gone { forget(g.keys, of: g.stream) }
    }

    /// Deletes the rows of the queued delivered batches; the caller empties the queue once the
    /// transaction committed. Inside a transaction.
    private func deleteDeliveredRows() throws(SQLiteError) -> [(stream: String, keys: [RecordKey])] {
        try deliveredQueue.map { key throws(SQLiteError) in try deleteRows(ofBatch: key) }
    }

    /// Deletes batch `key`'s chunks and its `batches` row, once the caller has deleted the
    /// chunks' bodies. Inside a transaction; the chunks go before the row, as `inBatch` finds
    /// them through it.
    func dropRows(ofBatch key: String) throws(SQLiteError) {
        try db.run("DELETE FROM chunks WHERE \(UploaderStore.inBatch)", [.text(key)])
        try db.run("DELETE FROM batches WHERE key=?", [.text(key)])
    }

    /// Records of `stream` left the disk: their ids may be enqueued again. (A batch's records
    /// are all of one stream.)
    func forget(_ gone: [RecordKey], of stream: String) {
        guard var set = ids.removeValue(forKey: stream) else { return }
        for k in gone { set.remove(k) }
        if !set.isEmpty { ids[stream] = set }
    }

    /// Dissolves batches, in one transaction, so their records are cut again (after a 413):
    /// their chunks go back to their places in the queue.
    func unbatch(_ keys: [String]) throws(SQLiteError) {
        try db.transaction { () throws(SQLiteError) in
            for key in keys {
                try db.run("UPDATE chunks SET batch=NULL WHERE \(UploaderStore.inBatch)", [.text(key)])
                try db.run("DELETE FROM batches WHERE key=?", [.text(key)])
            }
        }
    }

    /// Marks every pending batch holding records under `consent` final (sent once, no retry).
    func markFinal(consent: String) throws(SQLiteError) {
        try db.run(
            "UPDATE batches SET final=1 WHERE key IN (SELECT DISTINCT batch FROM chunks WHERE consent=? AND batch IS NOT NULL)",
            [.text(consent)])
    }

    /// Marks every pending batch of `stream` final.
    func markFinal(stream: String) throws(SQLiteError) {
        try db.run("UPDATE batches SET final=1 WHERE stream=?", [.text(stream)])
    }

    /// The consent switches records are stored under.
    func consentKeys() throws(SQLiteError) -> [String] {
        try db.query("SELECT DISTINCT consent FROM chunks").compactMap { $0[0].text }
    }

    /// Streams with queued records under `consent`.
    func streams(withConsent consent: String) throws(SQLiteError) -> [String] {
        try db.query("SELECT DISTINCT stream FROM chunks WHERE consent=? AND batch IS NULL", [.text(consent)]).compactMap { $0[0].text }
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
        for r in try db.query("SELECT stream, SUM(count), SUM(bytes), MIN(enqueued_ms) FROM chunks WHERE batch IS NULL GROUP BY stream") {
            let s = r[0].text ?? ""
            out[s, default: StreamSummary()].queued = Int(r[1].int ?? 0)
            out[s, default: StreamSummary()].queuedBytes = Int(r[2].int ?? 0)
            out[s, default: StreamSummary()].oldestMs = r[3].int
        }
        // In the order they were cut (rowid: a new row's is above every row left), not by the
        // wall clock, which may have stepped back between two cuts.
        for r in try db.query("SELECT stream, key FROM batches ORDER BY rowid") {
            out[r[0].text ?? "", default: StreamSummary()].pendingBatches.append(r[1].text ?? "")
        }
        return out
    }

    /// Bytes of record bodies on disk per stream (queued or in a batch).
    func streamBytes() throws(SQLiteError) -> [String: Int] {
        var out: [String: Int] = [:]
        for r in try db.query("SELECT stream, SUM(bytes) FROM chunks GROUP BY stream") { out[r[0].text ?? ""] = Int(r[1].int ?? 0) }
        return out
    }

    func totalBytes() throws(SQLiteError) -> Int {
        Int(try db.query("SELECT COALESCE(SUM(bytes),0) FROM chunks").first?[0].int ?? 0)
    }

    /// Records `owner` as the owner of `stream` (the first writer wins; later calls change nothing).
    func recordOwner(stream: String, owner: String, nowMs: Int64) throws(SQLiteError) {
        try db.run(
            "INSERT OR IGNORE INTO stream_owners(stream,owner,created_ms) VALUES(?,?,?)", [.text(stream), .text(owner), .int(nowMs)])
    }

    func recordedOwners() throws(SQLiteError) -> [String: String] {
        var out: [String: String] = [:]
        for r in try db.query("SELECT stream, owner FROM stream_owners") { out[r[0].text ?? ""] = r[1].text ?? "" }
        return out
    }

    func saveSettings(stream: String, maxCount: Int, intervalMs: UInt64) throws(SQLiteError) {
        try db.run(
            "INSERT OR REPLACE INTO stream_settings(stream,max_count,interval_ms,endpoint) VALUES(?,?,?,NULL)",
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
