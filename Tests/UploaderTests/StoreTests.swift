import Glibc
import PylonPluginKit
import PylonStore
import Testing

@testable import pylon_uploader

/// The queue on disk (format 4: segment files, one records frame per stream and group commit,
/// the batch ledger as frames of the same log), and the migration of the queues written by
/// earlier releases (format 1: a row per record; format 3: a row per group commit).
struct StoreTests {
    /// A fresh database path in a new temporary directory.
    static func tempPath() -> String {
        // $TMPDIR when set (`make test-unit` points it at a tmpfs: these tests check the store's
        // logic, not the disk's speed), else /tmp.
        let tmp = getenv("TMPDIR").map { String(cString: $0) }.flatMap { $0.isEmpty ? nil : $0 } ?? "/tmp"
        var template = Array((tmp + "/pylon-store-test.XXXXXX").utf8CString)
        let dir = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)) }
        return dir + "/uploader.db"
    }

    /// Whether `marker` is anywhere in the database file at `path` (once the WAL is emptied into
    /// it) or in a segment file of its queue, or in the texts of any packed frame that inflates
    /// (what a reader of the files could recover).
    static func fileHolds(_ store: UploaderStore, _ path: String, _ marker: String) throws -> Bool {
        try store.db.exec("PRAGMA wal_checkpoint(TRUNCATE)")
        var files = [try System.readFile(atPath: path, maxBytes: 64 << 20)]
        for n in store.log.numbers { files.append(try store.log.read(n)) }
        files += try inflatedTexts(store)
        let m = Array(marker.utf8)
        return files.contains { file in
            file.count >= m.count
                && (0...(file.count - m.count)).contains { i in file[i] == m[0] && file[i..<(i + m.count)].elementsEqual(m) }
        }
    }

    /// Every valid frame in the store's segments, oldest first.
    static func frames(_ store: UploaderStore) throws -> [Frame] {
        try store.log.numbers.flatMap { n in
            try store.log.read(n).withUnsafeBytes { Frame.scan($0, from: Frame.segmentMagic.count).frames.compactMap(\.frame) }
        }
    }

    /// Records frames and packed frames.
    static func recordFrames(_ store: UploaderStore) throws -> Int {
        try frames(store).filter {
            switch $0 {
            case .records, .packed: return true
            default: return false
            }
        }.count
    }

    /// The texts of every packed frame in the store's segments that inflates: each lane's
    /// frames fed in order to one inflate stream per context, as far as they go (every context,
    /// each from its first frame, not only those the queue points at).
    static func inflatedTexts(_ store: UploaderStore) throws -> [[UInt8]] {
        var out: [[UInt8]] = []
        for n in store.log.numbers {
            let bytes = try store.log.read(n)
            let found = bytes.withUnsafeBytes { Frame.scan($0, from: Frame.segmentMagic.count).frames }
            var contexts = PackedContexts()
            for f in found {
                guard case .packed(let lane, _, _, _, let lengths, let seq, let dataStart)? = f.frame else { continue }
                // Whatever its crc says: a reader of the file need not check it.
                let text = try bytes.withUnsafeBytes {
                    try contexts.texts(
                        lane: lane, seq: seq, offset: f.offset, crcOK: true,
                        payload: UnsafeRawBufferPointer(rebasing: $0[dataStart..<(f.offset + f.length)]), lengths: lengths)
                }
                if let text { out.append(text) }
            }
        }
        return out
    }

    /// Enqueues `records` (id, data JSON text) to `stream` in one group commit.
    @discardableResult
    static func enqueue(
        _ store: UploaderStore, _ stream: String, consent: String? = nil, _ records: [(String, String)],
        ts: Int64 = 7
    ) throws -> (added: Int, bytes: Int) {
        // C copies, as the request's json-c tree would hold them.
        let ids = records.map { strdup($0.0)! }
        let bodies = records.map { strdup($0.1)! }
        defer { (ids + bodies).forEach { free($0) } }
        let pending = records.indices.map { i in
            PendingRecord(id: ids[i], idLength: Int32(strlen(ids[i])), ts: ts, body: bodies[i], bodyLength: Int32(strlen(bodies[i])))
        }
        let r = try store.commit([.init(stream: stream, consent: consent ?? stream, records: pending)], nowMs: 1_000)
        return r[0]
    }

    /// The records of a batch body, as (id, ts, data serialized).
    static func records(_ body: [UInt8]) throws -> (batch: String, stream: String, records: [(id: String, ts: Int64, data: String)]) {
        let j = try body.withUnsafeBytes { try JSONRef.parse($0, maxDepth: 64) }.json
        let recs = (j["records"]?.arrayValue ?? []).map { r in
            (r["id"]?.stringValue ?? "?", r["ts"]?.intValue ?? -1, r["data"]?.serialized ?? "?")
        }
        return (j["batch"]?.stringValue ?? "", j["stream"]?.stringValue ?? "", recs)
    }

    static func numbered(_ prefix: String, _ r: Range<Int>) -> [(String, String)] {
        r.map { ("\(prefix)\($0)", #"{"n":\#($0)}"#) }
    }

    /// What a record with a plain `id` and `data` text counts in the disk cap: its upload form
    /// `{"id":"…","ts":7,"data":…}` plus the fixed part of `Chunk.charge`.
    static func charge(_ id: String, _ data: String, ts: Int64 = 7) -> Int {
        Chunk.charge(
            textBytes: #"{"id":""#.utf8.count + id.utf8.count + #"","ts":"#.utf8.count + "\(ts)".utf8.count + #","data":"#.utf8.count
                + data.utf8.count + 1)
    }
    static func charge(_ records: [(String, String)], ts: Int64 = 7) -> Int { records.reduce(0) { $0 + charge($1.0, $1.1, ts: ts) } }

    @Test func oneCommitIsOneChunkAndBatchesAreCutFromItInOrder() throws {
        let store = try UploaderStore(path: Self.tempPath(), fsyncEveryCommit: false)
        defer { store.close() }
        #expect(try Self.enqueue(store, "s", Self.numbered("r", 0..<10)) == (10, Self.charge(Self.numbered("r", 0..<10))))
        #expect(try Self.recordFrames(store) == 1)
        var seen: [String] = []
        var next = 0
        for key in ["k1", "k2", "k3"] {
            let (n, bytes) = try store.cutBatch(stream: "s", key: key, maxCount: 4, maxBytes: 1 << 20, final: false, nowMs: 1)
            let body = try store.batchBody(key, stream: "s")
            let parsed = try Self.records(body.body)
            #expect(parsed.batch == key && parsed.stream == "s")
            #expect(parsed.records.count == n && body.count == n && body.recordBytes == bytes)
            #expect(bytes == Self.charge(Self.numbered("r", next..<(next + n))), "the cut's bytes are its records' charges")
            next += n
            seen += parsed.records.map(\.id)
            #expect(parsed.records.allSatisfy { $0.ts == 7 })
        }
        #expect(seen == (0..<10).map { "r\($0)" })
        #expect(try store.cutBatch(stream: "s", key: "k4", maxCount: 4, maxBytes: 1 << 20, final: false, nowMs: 1) == (0, 0))
        #expect(try store.summaries()["s"]?.pendingBatches == ["k1", "k2", "k3"])
    }

    @Test func aLargeCommitIsStoredAsSeveralChunksInOrder() throws {
        let store = try UploaderStore(path: Self.tempPath(), fsyncEveryCommit: false)
        defer { store.close() }
        let big = "\"" + String(repeating: "x", count: 100_000) + "\""
        try Self.enqueue(store, "s", (0..<6).map { ("b\($0)", big) })
        #expect(try Self.recordFrames(store) == 2, "256 KiB per frame: 3 records each")
        #expect(try store.cutBatch(stream: "s", key: "k", maxCount: 500, maxBytes: 1 << 30, final: false, nowMs: 1).count == 6)
        #expect(try Self.records(store.batchBody("k", stream: "s").body).records.map(\.id) == (0..<6).map { "b\($0)" })
    }

    @Test func theByteLimitSplitsAChunkButTakesAtLeastOneRecord() throws {
        let store = try UploaderStore(path: Self.tempPath(), fsyncEveryCommit: false)
        defer { store.close() }
        let a = Self.charge("a", "\"xxxxxxxxxx\""), b = Self.charge("b", "\"yyyyyyyyyy\""), c = Self.charge("c", "1")
        try Self.enqueue(store, "s", [("a", "\"xxxxxxxxxx\""), ("b", "\"yyyyyyyyyy\""), ("c", "1")])
        #expect(try store.cutBatch(stream: "s", key: "k1", maxCount: 500, maxBytes: 5, final: false, nowMs: 1) == (1, a))
        #expect(try store.cutBatch(stream: "s", key: "k2", maxCount: 500, maxBytes: b + c, final: false, nowMs: 1) == (2, b + c))
        #expect(try Self.records(store.batchBody("k2", stream: "s").body).records.map(\.id) == ["b", "c"])
    }

    /// Records purged without delivery (`zero: true`, a final batch after consent was denied)
    /// are overwritten in the database file; a delivered batch's pages are freed without the
    /// extra write (`secure_delete=FAST`), so its bytes stay until the pages are reused.
    @Test(arguments: [true, false]) func purgedRecordsAreZeroedDeliveredOnesAreOnlyFreed(zero: Bool) throws {
        let path = Self.tempPath()
        let store = try UploaderStore(path: path, fsyncEveryCommit: false)
        defer { store.close() }
        let marker = "purge-marker-\(zero)-"
        // Enough to spill into overflow pages (freed whole by the delete).
        let data = #"{"v":""# + String(repeating: marker, count: 600) + #""}"#
        try Self.enqueue(store, "s", [("r1", data)])
        _ = try store.cutBatch(stream: "s", key: "b", maxCount: 10, maxBytes: 1 << 20, final: zero, nowMs: 1)
        try store.deleteBatch("b", zero: zero)
        // Everything in the database file, the WAL emptied.
        #expect(try Self.fileHolds(store, path, marker) == !zero)
    }

    /// A cut that splits a chunk rewrites the rest of its body: the old body's pages are zeroed,
    /// or records purged later (consent denied) would stay readable in the free pages.
    @Test func aSplitChunkLeavesNoCopyOfItsRecordsForAPurge() throws {
        let path = Self.tempPath()
        let store = try UploaderStore(path: path, fsyncEveryCommit: false)
        defer { store.close() }
        let marker = "split-marker-"
        let data = #"{"v":""# + String(repeating: marker, count: 100) + #""}"#
        try Self.enqueue(store, "s", (0..<12).map { ("r\($0)", data) })
        // Three cuts of 4: two of them split the one chunk.
        for k in 0..<3 {
            #expect(try store.cutBatch(stream: "s", key: "b\(k)", maxCount: 4, maxBytes: 1 << 20, final: true, nowMs: 1).count == 4)
        }
        for k in 0..<3 { try store.deleteBatch("b\(k)", zero: true) }
        #expect(try !Self.fileHolds(store, path, marker))
    }

    @Test func duplicatesAreRefusedWhileQueuedAndAcceptedAfterDelivery() throws {
        let path = Self.tempPath()
        var store = try UploaderStore(path: path, fsyncEveryCommit: false)
        #expect(try Self.enqueue(store, "s", [("a", "1"), ("b", "2"), ("a", "3")]).added == 2, "a twice in one commit")
        #expect(try Self.enqueue(store, "s", [("a", "1"), ("c", "3")]).added == 1)
        #expect(try Self.enqueue(store, "other", [("a", "1")]).added == 1, "ids are per stream")
        // The duplicate check survives a restart (rebuilt from the chunks).
        store.close()
        store = try UploaderStore(path: path, fsyncEveryCommit: false)
        defer { store.close() }
        #expect(try Self.enqueue(store, "s", [("b", "9"), ("d", "4")]).added == 1)
        #expect(try store.cutBatch(stream: "s", key: "k", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1).count == 4)
        #expect(try Self.enqueue(store, "s", [("a", "1")]).added == 0, "in a batch, still on disk")
        try store.deleteBatch("k")
        #expect(try Self.enqueue(store, "s", [("a", "1")]).added == 1, "delivered: the id may come again")
    }

    @Test func aDeliveredBatchIsDeletedByTheNextCommitAndItsIdsStayDuplicates() throws {
        let store = try UploaderStore(path: Self.tempPath(), fsyncEveryCommit: false)
        defer { store.close() }
        try Self.enqueue(store, "s", Self.numbered("r", 0..<4))
        _ = try store.cutBatch(stream: "s", key: "k", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1)
        store.deleteDelivered("k")
        #expect(store.index.batchIDs.count == 1, "waits for a write")
        #expect(
            try Self.enqueue(store, "s", [("r1", "1"), ("r9", "9")]) == (1, Self.charge([("r9", "9")])),
            "r1 was deleted first, and is a delivered id: a duplicate (DeliveredIds)")
        #expect(store.deliveredQueue.isEmpty)
        #expect(store.index.batchIDs.isEmpty)
        #expect(try store.summaries()["s"]?.queued == 1)
        #expect(try Self.enqueue(store, "s", [("r1", "1")]).added == 0, "queued again: a duplicate")
    }

    @Test func deliveredBatchesWithoutACommitAreDeletedInTheirOwnTransaction() throws {
        let store = try UploaderStore(path: Self.tempPath(), fsyncEveryCommit: false)
        defer { store.close() }
        try Self.enqueue(store, "s", Self.numbered("r", 0..<6))
        _ = try store.cutBatch(stream: "s", key: "k1", maxCount: 3, maxBytes: 1 << 20, final: false, nowMs: 1)
        _ = try store.cutBatch(stream: "s", key: "k2", maxCount: 3, maxBytes: 1 << 20, final: false, nowMs: 1)
        store.deleteDelivered("k1")
        store.deleteDelivered("k2")
        try store.applyDeliveredDeletes()
        #expect(store.deliveredQueue.isEmpty && store.index.ids["s"] == nil)
        #expect(store.index.queues.isEmpty && store.index.batchIDs.isEmpty)
        #expect(try store.totalBytes() == 0)
    }

    @Test func aFailedCommitKeepsTheDeliveredBatchQueuedAndItsIdsDuplicates() throws {
        let store = try UploaderStore(path: Self.tempPath(), fsyncEveryCommit: false)
        defer { store.close() }
        try Self.enqueue(store, "s", Self.numbered("r", 0..<2))
        _ = try store.cutBatch(stream: "s", key: "k", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1)
        store.deleteDelivered("k")
        // The write fails after the delivered batch's ids were forgotten.
        store.log.failNextAppend = IOError(errnoCode: ENOSPC, reason: "injected")
        #expect(throws: IOError.self) { try Self.enqueue(store, "s", [("r0", "0"), ("new", "1")]) }
        #expect(store.deliveredQueue == ["k"])
        #expect(store.index.batchIDs.count == 1)
        #expect(store.index.ids["s"]?.count == 2, "r0 and r1 still on disk; new not added")
        #expect(try Self.enqueue(store, "s", [("r0", "0"), ("new", "1")]) == (1, Self.charge([("new", "1")])), "r0 delivered: a duplicate")
        #expect(store.deliveredQueue.isEmpty && store.index.ids["s"]?.count == 1)
    }

    /// A delivered id is a duplicate until `DeliveredIds.window` later deliveries of the stream
    /// pass it (a retried enqueue stores nothing twice); then it is a new record again.
    @Test func aDeliveredIdIsADuplicateUntilTheWindowPassesIt() throws {
        let store = try UploaderStore(path: Self.tempPath(), fsyncEveryCommit: false)
        defer { store.close() }
        try Self.enqueue(store, "s", [("first", "1")])
        _ = try store.cutBatch(stream: "s", key: "k0", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1)
        store.deleteDelivered("k0")
        try store.applyDeliveredDeletes()
        #expect(try Self.enqueue(store, "s", [("first", "1")]).added == 0, "delivered, in the window")
        #expect(try Self.enqueue(store, "other", [("first", "1")]).added == 1, "per stream")
        let window = DeliveredIds.window
        for part in 0..<((window + 499) / 500) {
            try Self.enqueue(store, "s", Self.numbered("f", (part * 500)..<min(window, (part + 1) * 500)))
            _ = try store.cutBatch(stream: "s", key: "k\(part + 1)", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1)
            store.deleteDelivered("k\(part + 1)")
            try store.applyDeliveredDeletes()
        }
        #expect(try Self.enqueue(store, "s", [("f0", "0")]).added == 0, "the latest deliveries are in the window")
        #expect(try Self.enqueue(store, "s", [("first", "1")]).added == 1, "passed by the window: new again")
    }

    @Test func anUnbatchedBatchGoesBackToItsPlace() throws {
        let store = try UploaderStore(path: Self.tempPath(), fsyncEveryCommit: false)
        defer { store.close() }
        try Self.enqueue(store, "s", Self.numbered("r", 0..<6))
        try Self.enqueue(store, "s", Self.numbered("r", 6..<9))
        _ = try store.cutBatch(stream: "s", key: "k1", maxCount: 4, maxBytes: 1 << 20, final: false, nowMs: 1)
        try store.unbatch(["k1"])
        #expect(try store.cutBatch(stream: "s", key: "k2", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1).count == 9)
        #expect(try Self.records(store.batchBody("k2", stream: "s").body).records.map(\.id) == (0..<9).map { "r\($0)" })
    }

    @Test func deadLettersKeepEachRecordsIdAndData() throws {
        let store = try UploaderStore(path: Self.tempPath(), fsyncEveryCommit: false)
        defer { store.close() }
        try Self.enqueue(store, "s", [("q\"uote\\d", #"{"a":[1,2]}"#), ("plain", "null")])
        _ = try store.cutBatch(stream: "s", key: "k", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1)
        let set = try store.deadLetter("k", status: 400, reason: "HTTP 400", nowMs: 5)
        #expect(set.count == 2)
        let rows = try store.deadLetters(streams: ["s"], limit: 10)
        #expect(rows.map { $0[1].text ?? "" } == ["q\"uote\\d", "plain"])
        #expect(rows.map { $0[2].text ?? "" } == [#"{"a":[1,2]}"#, "null"])
        #expect(try store.totalBytes() == 0)
        // What they count in the disk cap: their rows, as `deadLetterSummaries` finds them again.
        let expected =
            UploaderStore.deadLetterCharge(stream: "s", id: "q\"uote\\d", data: 11, batch: "k", reason: "HTTP 400")
            + UploaderStore.deadLetterCharge(stream: "s", id: "plain", data: 4, batch: "k", reason: "HTTP 400")
        #expect(set.bytes == expected)
        #expect(try store.deadLetterSummaries()["s"]! == (2, expected))
        #expect(try Self.enqueue(store, "s", [("plain", "1")]).added == 1)
    }

    /// Re-queued dead letters go back to the end of the queue with their id, ts and data (a
    /// batch cut from them is what was set aside); one whose id is queued already is a duplicate
    /// (removed); one whose id the enqueue refuses today stays; the room is respected; a discard
    /// deletes what is left and reports what it counted.
    @Test func deadLettersAreRequeuedAndDiscarded() throws {
        let store = try UploaderStore(path: Self.tempPath(), fsyncEveryCommit: false)
        defer { store.close() }
        try Self.enqueue(store, "s", [("a", #"{"n":1}"#), ("b", #"{"n":2}"#), ("c", "3")], ts: 42)
        _ = try store.cutBatch(stream: "s", key: "k", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1)
        let set = try store.deadLetter("k", status: 400, reason: "HTTP 400", nowMs: 5)
        // A dead letter of an earlier release, with a control character in its id.
        try store.db.run(
            "INSERT INTO dead_letters(stream,id,body,batch,status,reason,at_ms) VALUES('s',?,'0','old',400,'HTTP 400',9)", [.text("x\u{1}")]
        )
        try Self.enqueue(store, "s", [("b", "99")])  // b is queued again meanwhile
        let before = try store.totalBytes()
        // No room: nothing changes.
        let (refused, done) = try store.requeue(stream: "s", consent: "s", ids: ["a"], room: -1_000_000, nowMs: 7)
        #expect(!done && refused.requeued == 1)
        #expect(try store.totalBytes() == before && store.deadLetterSummaries()["s"]?.count == 4)
        let (r, ok) = try store.requeue(stream: "s", consent: "s", ids: nil, room: 1 << 20, nowMs: 7)
        #expect(ok && r.requeued == 2 && r.duplicates == 1 && r.invalid == 1)
        #expect(r.removedBytes == set.bytes)
        #expect(try store.totalBytes() == before + r.addedBytes)
        #expect(try Self.enqueue(store, "s", [("a", "0")]).added == 0, "a re-queued id is a duplicate while queued")
        _ = try store.cutBatch(stream: "s", key: "k2", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 8)
        let recs = try Self.records(store.batchBody("k2", stream: "s").body).records
        #expect(recs.map(\.id) == ["b", "a", "c"] && recs.map(\.ts) == [7, 42, 42])
        #expect(recs.map(\.data) == ["99", #"{"n":1}"#, "3"])
        let left = try store.deadLetterSummaries()["s"]!
        #expect(left.count == 1)
        #expect(try store.discard(stream: "s", ids: ["nope"]) == (0, 0))
        #expect(try store.discard(stream: "s", ids: nil) == (1, left.bytes))
        #expect(try store.deadLetterSummaries()["s"] == nil)
    }

    @Test func aFinalCutTakesOnlyTheDeniedSwitch() throws {
        let store = try UploaderStore(path: Self.tempPath(), fsyncEveryCommit: false)
        defer { store.close() }
        try Self.enqueue(store, "s", consent: "old", [("a", "1")])
        try Self.enqueue(store, "s", consent: "s", [("b", "2")])
        #expect(try store.consentKeys().sorted() == ["old", "s"])
        #expect(
            try store.cutBatch(stream: "s", key: "f", maxCount: 500, maxBytes: 1 << 20, final: true, consent: "s", nowMs: 1) == (
                1, Self.charge("b", "2")
            ))
        #expect(try store.isFinal("f"))
        #expect(try Self.records(store.batchBody("f", stream: "s").body).records.map(\.id) == ["b"])
        // A normal cut stops at a change of switch: one batch never mixes two.
        #expect(
            try store.cutBatch(stream: "s", key: "n", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1) == (
                1, Self.charge("a", "1")
            ))
    }

    // MARK: Migration

    /// The schema of the release before format 2, verbatim.
    static let formatOneSchema = """
        CREATE TABLE records(
          seq INTEGER PRIMARY KEY AUTOINCREMENT, stream TEXT NOT NULL, id TEXT NOT NULL,
          consent TEXT NOT NULL DEFAULT '', ts INTEGER NOT NULL, bytes INTEGER NOT NULL,
          body TEXT NOT NULL, batch TEXT, enqueued_ms INTEGER NOT NULL, UNIQUE(stream, id));
        CREATE INDEX records_by_batch ON records(stream, batch, seq);
        CREATE TABLE batches(
          key TEXT PRIMARY KEY, stream TEXT NOT NULL, created_ms INTEGER NOT NULL,
          attempts INTEGER NOT NULL DEFAULT 0, final INTEGER NOT NULL DEFAULT 0);
        CREATE TABLE dead_letters(
          seq INTEGER PRIMARY KEY AUTOINCREMENT, stream TEXT NOT NULL, id TEXT NOT NULL,
          body TEXT NOT NULL, batch TEXT NOT NULL, status INTEGER NOT NULL, reason TEXT NOT NULL,
          at_ms INTEGER NOT NULL);
        CREATE TABLE stream_settings(
          stream TEXT PRIMARY KEY, max_count INTEGER, interval_ms INTEGER, endpoint TEXT);
        CREATE TABLE stream_owners(
          stream TEXT PRIMARY KEY, owner TEXT NOT NULL, created_ms INTEGER NOT NULL);
        """

    @Test func aQueueOfTheEarlierFormatIsMigratedAndDelivered() throws {
        let path = Self.tempPath()
        do {
            let old = try Database(path: path)
            try old.exec("PRAGMA journal_mode=WAL")
            try old.exec(Self.formatOneSchema)
            func put(_ stream: String, _ id: String, _ body: String, batch: String?, consent: String? = nil, ts: Int64) throws {
                try old.run(
                    "INSERT INTO records(stream,id,consent,ts,bytes,body,batch,enqueued_ms) VALUES(?,?,?,?,?,?,?,?)",
                    [
                        .text(stream), .text(id), .text(consent ?? stream), .int(ts), .int(Int64(body.utf8.count)), .text(body),
                        batch.map { .text($0) } ?? .null, .int(500),
                    ])
            }
            // ma.app: a batch cut before the upgrade (its key must survive), then queued records,
            // interleaved with another stream's.
            try put("ma.app", "e1", #"{"event":"a"}"#, batch: "oldbatch", ts: 1)
            try put("other", "o1", "[1]", batch: nil, ts: 2)
            try put("ma.app", "e2", #"{"event":"b"}"#, batch: "oldbatch", ts: 3)
            try put("ma.app", "e\"3", #"{"event":"c"}"#, batch: nil, ts: 4)
            try put("other", "o2", "[2]", batch: nil, consent: "legacy", ts: 5)
            try put("ma.app", "e4", #""d""#, batch: nil, ts: 6)
            try old.run("INSERT INTO batches(key,stream,created_ms,final) VALUES('oldbatch','ma.app',400,0)")
            try old.run("INSERT INTO dead_letters(stream,id,body,batch,status,reason,at_ms) VALUES('ma.app','x','1','b0',400,'HTTP 400',1)")
            try old.run("INSERT INTO stream_owners(stream,owner,created_ms) VALUES('other','uid:1000',1)")
            old.close()
        }
        let store = try UploaderStore(path: path, fsyncEveryCommit: false)
        defer { store.close() }
        #expect(try store.db.query("SELECT name FROM sqlite_master WHERE name='records'").isEmpty, "the old table is gone")
        #expect(try store.db.query("PRAGMA user_version").first?[0].int == UploaderStore.format)
        let sums = try store.summaries()
        #expect(sums["ma.app"]?.pendingBatches == ["oldbatch"] && sums["ma.app"]?.queued == 2)
        #expect(sums["other"]?.queued == 2 && sums["other"]?.pendingBatches == [])
        // Each record as this release counts it (the escaped id as written in the body).
        let charges = [
            Self.charge("e1", #"{"event":"a"}"#, ts: 1), Self.charge("o1", "[1]", ts: 2), Self.charge("e2", #"{"event":"b"}"#, ts: 3),
            Self.charge(#"e\"3"#, #"{"event":"c"}"#, ts: 4), Self.charge("o2", "[2]", ts: 5), Self.charge("e4", #""d""#, ts: 6),
        ]
        #expect(try store.totalBytes() == charges.reduce(0, +))
        #expect(try store.recordedOwners()["other"] == "uid:1000" && store.deadLetterSummaries()["ma.app"]?.count == 1)
        #expect(try store.consentKeys().sorted() == ["legacy", "ma.app", "other"])

        // The pending batch is resent as the same batch: same key, same records.
        let resent = try Self.records(store.batchBody("oldbatch", stream: "ma.app").body)
        #expect(resent.batch == "oldbatch")
        #expect(resent.records.map(\.id) == ["e1", "e2"] && resent.records.map(\.ts) == [1, 3])
        #expect(resent.records.map(\.data) == [#"{"event":"a"}"#, #"{"event":"b"}"#])
        try store.deleteBatch("oldbatch")
        // The queued records are cut and delivered in their order, ids and data intact.
        #expect(try store.cutBatch(stream: "ma.app", key: "n1", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1).count == 2)
        let next = try Self.records(store.batchBody("n1", stream: "ma.app").body)
        #expect(next.records.map(\.id) == ["e\"3", "e4"] && next.records.map(\.data) == [#"{"event":"c"}"#, #""d""#])
        // Their ids still count as queued (no duplicate is accepted), the delivered ones are free.
        #expect(try Self.enqueue(store, "ma.app", [("e4", "0"), ("e1", "0")]).added == 1)
        // The other stream's records keep their switches: a cut does not mix them.
        #expect(try store.cutBatch(stream: "other", key: "o", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1) == (1, charges[1]))
        #expect(try Self.records(store.batchBody("o", stream: "other").body).records.map(\.id) == ["o1"])
        #expect(try store.cutBatch(stream: "other", key: "o2", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1) == (1, charges[4]))
        // New records go after the migrated ones.
        try Self.enqueue(store, "ma.app", [("e5", "5")])
        #expect(try store.cutBatch(stream: "ma.app", key: "n2", maxCount: 500, maxBytes: 1 << 20, final: false, nowMs: 1).count == 2)
        #expect(try Self.records(store.batchBody("n2", stream: "ma.app").body).records.map(\.id) == ["e1", "e5"])
    }

    /// Pending batches come back in the order they were cut, whatever the wall clock said.
    @Test func pendingBatchesKeepTheirCutOrderWhenTheClockStepsBack() throws {
        let store = try UploaderStore(path: Self.tempPath(), fsyncEveryCommit: false)
        defer { store.close() }
        try Self.enqueue(store, "s", Self.numbered("r", 0..<6))
        for (key, ms) in [("k1", Int64(5_000)), ("k2", 1_000), ("k3", 3_000)] {
            _ = try store.cutBatch(stream: "s", key: key, maxCount: 2, maxBytes: 1 << 20, final: false, nowMs: ms)
        }
        #expect(try store.summaries()["s"]?.pendingBatches == ["k1", "k2", "k3"])
        try store.deleteBatch("k1")
        _ = try Self.enqueue(store, "s", Self.numbered("q", 0..<2))
        _ = try store.cutBatch(stream: "s", key: "k4", maxCount: 2, maxBytes: 1 << 20, final: false, nowMs: 10)
        #expect(try store.summaries()["s"]?.pendingBatches == ["k2", "k3", "k4"])
    }

    /// The format-1 table's pages are zeroed when the migration drops it: records purged after
    /// the upgrade (consent denied) leave no copy from before it.
    @Test func aMigratedQueuePurgedLaterLeavesNoOldCopy() throws {
        let path = Self.tempPath()
        let marker = "format-one-marker-"
        do {
            let old = try Database(path: path)
            try old.exec("PRAGMA journal_mode=WAL")
            try old.exec(Self.formatOneSchema)
            for i in 0..<40 {
                let body = #"{"v":""# + String(repeating: marker, count: 20) + #""}"#
                try old.run(
                    "INSERT INTO records(stream,id,consent,ts,bytes,body,batch,enqueued_ms) VALUES('s',?,'s',1,?,?,NULL,1)",
                    [.text("r\(i)"), .int(Int64(body.utf8.count)), .text(body)])
            }
            old.close()
        }
        let store = try UploaderStore(path: path, fsyncEveryCommit: false)
        defer { store.close() }
        #expect(try store.cutBatch(stream: "s", key: "f", maxCount: 500, maxBytes: 1 << 20, final: true, nowMs: 1).count == 40)
        try store.deleteBatch("f", zero: true)
        #expect(try !Self.fileHolds(store, path, marker))
    }
}
